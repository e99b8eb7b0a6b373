/* SPDX-License-Identifier: MIT */
/*
 * Objects kept on a free list for reuse are poisoned in ASan builds while they
 * wait, so that a use after release is still reported as one. The list's link,
 * the pointer at <link> inside the object (NULL: none), stays readable:
 * LeakSanitizer ignores pointers found in poisoned memory, and would report
 * the rest of the list. Outside ASan builds these compile to nothing.
 *
 * Header-only, like list.h: the SPOP library and the agent both keep pools.
 */
#ifndef SPOA_POOL_H
#define SPOA_POOL_H

#include <stddef.h>

#include <sanitizer/asan_interface.h>

/* Poisons the <size> bytes at <p>, put on a free list, but for its link pointer. */
static inline void pool_poison(void *p, size_t size, const void *link)
{
	size_t off = link ? (size_t)((const char *)link - (const char *)p) : size;

	ASAN_POISON_MEMORY_REGION(p, off);
	if (link)
		ASAN_POISON_MEMORY_REGION((char *)p + off + sizeof(void *),
					  size - off - sizeof(void *));
}

/* Makes the <size> bytes at <p>, taken off a free list, usable again. */
static inline void pool_unpoison(void *p, size_t size)
{
	ASAN_UNPOISON_MEMORY_REGION(p, size);
}

#endif /* SPOA_POOL_H */
