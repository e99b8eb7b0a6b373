/* SPDX-License-Identifier: MIT */
/*
 * Logging to stderr with a timestamp and a level (journald friendly). The
 * level check happens before the arguments are evaluated.
 */
#ifndef AGENT_LOG_H
#define AGENT_LOG_H

#include <stdbool.h>

#include "compiler.h"

enum log_level {
	LOG_ERR    = 0,
	LOG_WARN   = 1,
	LOG_NOTICE = 2,
	LOG_INFO   = 3,
	LOG_DEBUG  = 4,
	LOG_COUNT      /* sentinel */
};

extern int log_level_current;

#define LOG(level, ...)                                                                     \
	do {                                                                                \
		if ((level) <= log_level_current)                                           \
			log_write((level), __VA_ARGS__);                                    \
	} while (0)

void log_write(int level, const char *fmt, ...) PRINTF(2, 3);
void log_set_level(int level);
int log_level_parse(const char *name);
const char *log_level_str(int level);

#endif /* AGENT_LOG_H */
