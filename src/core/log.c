/* SPDX-License-Identifier: MIT */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

int log_level_current = LOG_NOTICE;

static const char *const level_names[LOG_COUNT] = {"err", "warn", "notice", "info", "debug"};

const char *log_level_str(int level)
{
	if (level < 0 || level >= LOG_COUNT)
		return "?";
	return level_names[level];
}

/* Returns the level called <name>, or -1. */
int log_level_parse(const char *name)
{
	int i;

	for (i = 0; i < LOG_COUNT; i++)
		if (strcmp(name, level_names[i]) == 0)
			return i;
	return -1;
}

void log_set_level(int level)
{
	if (level >= 0 && level < LOG_COUNT)
		log_level_current = level;
}

/*
 * Writes one line "<time> [pid] level: message" to stderr in one write. A
 * control byte in the message (a newline, an escape sequence: text from a
 * peer or from Redis that was not escaped where it was logged) becomes '?',
 * so one call is always exactly one line that cannot forge another.
 */
void log_write(int level, const char *fmt, ...)
{
	char line[1024];
	struct timeval tv;
	struct tm tm;
	va_list ap;
	int n, m, i;

	gettimeofday(&tv, NULL);
	gmtime_r(&tv.tv_sec, &tm);
	n = snprintf(line, sizeof(line), "%04d-%02d-%02dT%02d:%02d:%02d.%03dZ [%d] %s: ",
		     tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
		     (int)(tv.tv_usec / 1000), (int)getpid(), log_level_str(level));
	va_start(ap, fmt);
	m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (m < 0)
		m = 0;
	m += n;
	if (m > (int)sizeof(line) - 2)
		m = (int)sizeof(line) - 2;
	for (i = n; i < m; i++)
		if ((unsigned char)line[i] < 0x20 || line[i] == 0x7f)
			line[i] = '?';
	n = m;
	line[n++] = '\n';
	(void)!write(STDERR_FILENO, line, (size_t)n);
}
