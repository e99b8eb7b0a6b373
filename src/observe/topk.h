/* SPDX-License-Identifier: MIT */
/*
 * Heavy hitters with bounded memory: the Space-Saving algorithm (Metwally,
 * Agrawal, El Abbadi, 2005) over a fixed number K of counters.
 *
 * Guarantees, for a stream of total weight N:
 *  - every item whose true weight exceeds N / K is in the summary;
 *  - for a listed item, count - error <= true weight <= count, and
 *    error <= N / K.
 * Memory is fixed at topk_new() time (about 128 bytes per counter) and never
 * grows with the number of distinct items, which is what makes per-client
 * metrics safe against an attacker who rotates identities.
 *
 * Items are byte strings cut at TOPK_ITEM_MAX bytes: two items that share
 * their first 64 bytes are the same item. Not thread-safe.
 */
#ifndef AGENT_TOPK_H
#define AGENT_TOPK_H

#include <stddef.h>
#include <stdint.h>

#include "compiler.h"

#define TOPK_ITEM_MAX  64              /* longer items are cut */
#define TOPK_K_MAX     (1U << 20)      /* largest K topk_new() accepts */

/* One counter as reported by topk_list(). */
struct topk_entry {
	char item[TOPK_ITEM_MAX + 1];   /* the (cut) item, NUL-terminated */
	size_t len;                     /* its length; may contain NULs if binary */
	uint64_t count;                 /* upper bound of the true weight */
	uint64_t error;                 /* overestimation bound: count - error <= true */
};

struct topk;

struct topk *topk_new(size_t k) MUSTCHECK;
void topk_free(struct topk *t);
void topk_clear(struct topk *t);

void topk_add(struct topk *t, const char *item, size_t len, uint64_t weight);
size_t topk_list(const struct topk *t, struct topk_entry *out, size_t max);

uint64_t topk_total(const struct topk *t);
size_t topk_size(const struct topk *t);
size_t topk_memory(const struct topk *t);

#endif /* AGENT_TOPK_H */
