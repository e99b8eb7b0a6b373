/* SPDX-License-Identifier: MIT */
/* Compiler helpers shared by the agent's modules. */
#ifndef AGENT_COMPILER_H
#define AGENT_COMPILER_H

#include <stdio.h>
#include <stdlib.h>

#define MUSTCHECK      __attribute__((warn_unused_result))
#define PRINTF(a, b)   __attribute__((format(printf, a, b)))
#define UNUSED         __attribute__((unused))
#define likely(x)      __builtin_expect(!!(x), 1)
#define unlikely(x)    __builtin_expect(!!(x), 0)
#define ARRAY_SIZE(a)  (sizeof(a) / sizeof((a)[0]))

/* An invariant that holds in every build; a violation is a bug: crash loudly. */
#define BUG_ON(cond)                                                                        \
	do {                                                                                \
		if (unlikely(cond)) {                                                       \
			fprintf(stderr, "BUG at %s:%d: %s\n", __FILE__, __LINE__, #cond);   \
			abort();                                                            \
		}                                                                           \
	} while (0)

#endif /* AGENT_COMPILER_H */
