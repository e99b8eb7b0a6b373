/* SPDX-License-Identifier: MIT */
/* Compiler helpers shared by the agent's modules. */
#ifndef AGENT_COMPILER_H
#define AGENT_COMPILER_H

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include <sanitizer/asan_interface.h>   /* no-op macros outside ASan builds */

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

/*
 * Objects kept on a free list for reuse are poisoned in ASan builds while they
 * wait, so that a use after release is still reported as one. The list's link,
 * the pointer at <link> inside <p>, stays readable: LeakSanitizer ignores
 * pointers found in poisoned memory, and would report the rest of the list.
 */
static inline void pool_poison(void *p, size_t size, const void *link)
{
	size_t off = (size_t)((const char *)link - (const char *)p);

	ASAN_POISON_MEMORY_REGION(p, off);
	ASAN_POISON_MEMORY_REGION((char *)p + off + sizeof(void *), size - off - sizeof(void *));
}

/* Makes the <size> bytes at <p>, taken off a free list, usable again. */
static inline void pool_unpoison(void *p, size_t size)
{
	ASAN_UNPOISON_MEMORY_REGION(p, size);
}

#endif /* AGENT_COMPILER_H */
