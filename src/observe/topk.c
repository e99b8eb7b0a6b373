/* SPDX-License-Identifier: MIT */
/*
 * Space-Saving heavy hitters.
 *
 * DESIGN
 * K slots hold (item, count, error). Adding an item that has a slot adds the
 * weight to its count. Adding a new item while a slot is free takes it with
 * error 0. Otherwise the slot with the smallest count (min) is taken over:
 * the new item gets count = min + weight and error = min, because it may
 * have been seen up to min times while it was not tracked.
 *
 * Invariant: the counts sum to the total weight (every add raises exactly
 * one count by its weight), so min <= N / K; an item with more than N / K is
 * never the minimum long enough to be evicted for good.
 *
 * Two structures make an add O(log K):
 *  - index: open addressing with linear probing, at least 2K cells holding
 *    slot number + 1 (0 = empty), hashed with SipHash-1-3 under a random
 *    per-instance key so clients cannot aim collisions at it; removal shifts
 *    the following cells back, so there are no tombstones;
 *  - heap: a binary min-heap of slot numbers ordered by count; each slot
 *    knows its heap position. Counts only grow, so an add only sifts down.
 * Nothing is allocated after topk_new().
 */
#include "topk.h"

#include <stdbool.h>
#include <string.h>
#include <time.h>
#include <sys/random.h>

#include "hll.h"
#include "util.h"

struct topk_slot {
	uint64_t count;                 /* weight credited, error included */
	uint64_t error;                 /* count of the evicted minimum at takeover */
	uint64_t hash;                  /* index hash of item */
	uint32_t heap_pos;              /* position in topk.heap */
	uint8_t len;                    /* bytes used in item */
	char item[TOPK_ITEM_MAX];       /* not NUL-terminated */
};

struct topk {
	size_t k;                       /* number of slots */
	size_t n;                       /* slots in use, always the first n */
	uint64_t total;                 /* sum of all weights (saturating) */
	uint64_t key0, key1;            /* SipHash key of the index */
	size_t mask;                    /* index cells - 1 (a power of two - 1) */
	struct topk_slot *slots;        /* owned: k */
	uint32_t *heap;                 /* owned: k slot numbers, min-heap by count */
	uint32_t *index;                /* owned: mask + 1 cells, slot number + 1 or 0 */
};

static uint64_t sat_add(uint64_t a, uint64_t b)
{
	return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

/* ---------------------------------------------------------------- heap */

static void heap_swap(struct topk *t, size_t a, size_t b)
{
	uint32_t sa = t->heap[a], sb = t->heap[b];

	t->heap[a] = sb;
	t->heap[b] = sa;
	t->slots[sb].heap_pos = (uint32_t)a;
	t->slots[sa].heap_pos = (uint32_t)b;
}

static uint64_t heap_count(const struct topk *t, size_t pos)
{
	return t->slots[t->heap[pos]].count;
}

static void heap_sift_up(struct topk *t, size_t pos)
{
	while (pos > 0) {
		size_t parent = (pos - 1) / 2;

		if (heap_count(t, parent) <= heap_count(t, pos))
			break;
		heap_swap(t, parent, pos);
		pos = parent;
	}
}

static void heap_sift_down(struct topk *t, size_t pos)
{
	for (;;) {
		size_t l = 2 * pos + 1, r = l + 1, min = pos;

		if (l < t->n && heap_count(t, l) < heap_count(t, min))
			min = l;
		if (r < t->n && heap_count(t, r) < heap_count(t, min))
			min = r;
		if (min == pos)
			return;
		heap_swap(t, pos, min);
		pos = min;
	}
}

/* ---------------------------------------------------------------- index */

/*
 * Looks up <item>/<len> of hash <h>. Returns the cell holding it and sets
 * <found>, or returns the empty cell where it would go.
 */
static size_t index_find(const struct topk *t, uint64_t h, const char *item, size_t len,
			 bool *found)
{
	size_t i = (size_t)h & t->mask;

	for (;; i = (i + 1) & t->mask) {
		const struct topk_slot *s;

		if (t->index[i] == 0) {
			*found = false;
			return i;
		}
		s = &t->slots[t->index[i] - 1];
		if (s->hash == h && s->len == len && memcmp(s->item, item, len) == 0) {
			*found = true;
			return i;
		}
	}
}

/* Empties cell <i> and shifts back the cells of the probe run after it. */
static void index_remove_at(struct topk *t, size_t i)
{
	size_t j = i;

	for (;;) {
		size_t home;

		j = (j + 1) & t->mask;
		if (t->index[j] == 0)
			break;
		home = (size_t)t->slots[t->index[j] - 1].hash & t->mask;
		/* the entry at j may fill the hole at i unless its home lies in (i, j] */
		if (((j - home) & t->mask) >= ((j - i) & t->mask)) {
			t->index[i] = t->index[j];
			i = j;
		}
	}
	t->index[i] = 0;
}

/* ---------------------------------------------------------------- API */

/*
 * Returns a summary with <k> counters (1 .. TOPK_K_MAX), or NULL if <k> is out
 * of range. All memory is allocated here, about 128 bytes per counter; the
 * caller owns the result and releases it with topk_free().
 */
struct topk *topk_new(size_t k)
{
	struct topk *t;
	uint64_t key[2];
	size_t cells = 4;

	if (k == 0 || k > TOPK_K_MAX)
		return NULL;
	while (cells < 2 * k)
		cells *= 2;
	t = xcalloc(1, sizeof(*t));
	t->k = k;
	t->mask = cells - 1;
	t->slots = xcalloc(k, sizeof(*t->slots));
	t->heap = xcalloc(k, sizeof(*t->heap));
	t->index = xcalloc(cells, sizeof(*t->index));
	/* a secret key keeps client-chosen items from colliding on purpose; the
	 * fallback is weak but the worst case stays bounded by the table size */
	if (getrandom(key, sizeof(key), GRND_NONBLOCK) != (ssize_t)sizeof(key)) {
		struct timespec ts;

		clock_gettime(CLOCK_MONOTONIC, &ts);
		key[0] = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30);
		key[1] = (uint64_t)(uintptr_t)t;
	}
	t->key0 = key[0];
	t->key1 = key[1];
	return t;
}

/* Frees <t> and everything it holds; NULL is a no-op. */
void topk_free(struct topk *t)
{
	if (!t)
		return;
	free(t->slots);
	free(t->heap);
	free(t->index);
	free(t);
}

/* Forgets every item and the total, keeping K and the memory. */
void topk_clear(struct topk *t)
{
	t->n = 0;
	t->total = 0;
	memset(t->index, 0, (t->mask + 1) * sizeof(*t->index));
}

/*
 * Credits <weight> to the item made of the first min(<len>, TOPK_ITEM_MAX)
 * bytes at <item> (copied). A zero weight is ignored. Counts and the total
 * saturate at UINT64_MAX. O(log K), no allocation.
 */
void topk_add(struct topk *t, const char *item, size_t len, uint64_t weight)
{
	struct topk_slot *s;
	uint64_t h;
	size_t cell;
	uint32_t sn;
	bool found, fresh;

	if (weight == 0)
		return;
	if (len > TOPK_ITEM_MAX)
		len = TOPK_ITEM_MAX;
	t->total = sat_add(t->total, weight);
	h = hll_siphash13(t->key0, t->key1, item, len);
	cell = index_find(t, h, item, len, &found);
	if (found) {
		s = &t->slots[t->index[cell] - 1];
		s->count = sat_add(s->count, weight);
		heap_sift_down(t, s->heap_pos);
		return;
	}
	if (t->n < t->k) {
		sn = (uint32_t)t->n;
		s = &t->slots[sn];
		s->count = weight;
		s->error = 0;
		s->heap_pos = sn;
		t->heap[sn] = sn;
		t->n++;
		fresh = true;
	} else {
		/* take over the minimum: its count becomes the newcomer's error */
		sn = t->heap[0];
		s = &t->slots[sn];
		index_remove_at(t, index_find(t, s->hash, s->item, s->len, &found));
		BUG_ON(!found);
		s->error = s->count;
		s->count = sat_add(s->count, weight);
		/* the removal may have shifted cells: probe again */
		cell = index_find(t, h, item, len, &found);
		fresh = false;
	}
	s->hash = h;
	s->len = (uint8_t)len;
	memcpy(s->item, item, len);
	t->index[cell] = sn + 1;
	if (fresh)
		heap_sift_up(t, s->heap_pos);
	else
		heap_sift_down(t, s->heap_pos);
}

static int slot_cmp(const void *a, const void *b)
{
	const struct topk_slot *x = *(const struct topk_slot *const *)a;
	const struct topk_slot *y = *(const struct topk_slot *const *)b;
	size_t n = x->len < y->len ? x->len : y->len;
	int c;

	if (x->count != y->count)
		return x->count > y->count ? -1 : 1;
	if (x->error != y->error)
		return x->error < y->error ? -1 : 1;
	c = memcmp(x->item, y->item, n);
	if (c)
		return c;
	return (int)x->len - (int)y->len;
}

/*
 * Copies at most <max> counters of <t> into <out>, by decreasing count (ties:
 * smaller error first, then by item bytes, so the order is deterministic).
 * Returns the number written. Allocates a temporary array of K pointers;
 * meant for scrape time.
 */
size_t topk_list(const struct topk *t, struct topk_entry *out, size_t max)
{
	const struct topk_slot **order;
	size_t i, n;

	if (t->n == 0 || max == 0)
		return 0;
	order = xmalloc(t->n * sizeof(*order));
	for (i = 0; i < t->n; i++)
		order[i] = &t->slots[i];
	qsort(order, t->n, sizeof(*order), slot_cmp);
	n = t->n < max ? t->n : max;
	for (i = 0; i < n; i++) {
		memcpy(out[i].item, order[i]->item, order[i]->len);
		out[i].item[order[i]->len] = 0;
		out[i].len = order[i]->len;
		out[i].count = order[i]->count;
		out[i].error = order[i]->error;
	}
	free(order);
	return n;
}

/* Returns the total weight added since creation or the last clear. */
uint64_t topk_total(const struct topk *t)
{
	return t->total;
}

/* Returns the number of counters in use (at most K). */
size_t topk_size(const struct topk *t)
{
	return t->n;
}

/* Returns the bytes held by <t>, fixed from topk_new() on. */
size_t topk_memory(const struct topk *t)
{
	return sizeof(*t) + t->k * (sizeof(*t->slots) + sizeof(*t->heap)) +
	       (t->mask + 1) * sizeof(*t->index);
}
