/* SPDX-License-Identifier: MIT */
/*
 * DESIGN
 *
 * Index. Open addressing with linear probing over a power-of-two array of
 * slots, each holding a key's hash and a pointer to its heap-allocated entry
 * (key bytes, struct limit_state, position in the expiry heap). There are no
 * tombstones: a deletion shifts the rest of its cluster back (Knuth's
 * algorithm R), so probe sequences never lengthen with churn. The array is
 * sized once for a load factor of at most 3/4 at max_keys entries and never
 * grows; count <= max_keys < slots leaves an empty slot, which ends every
 * probe loop. Keys are hashed with SipHash-2-4 under a random per-table key:
 * they embed client data, and a guessable hash would let a client build one
 * long cluster and make every lookup scan the table.
 *
 * Expiry. When a decision charges a limit (cost > 0, 0 or a refund) its entry
 * expires at now + reset_ms (at least 1 ms), the verdict's "fully available
 * again" time (a concurrency limit's: the end of its last lease): the TTL rule of lua/ (each script sets the key's PX to its
 * reset time, rounded up). From that instant the state is equivalent to a
 * zero state for every algorithm (GCRA: tat <= now; windows: the stored
 * window index is too old; sliding log: every timestamp has left the window),
 * so an expired entry is treated as absent. A limit that is evaluated but not
 * charged keeps its expiry. Expiry times live in a binary min-heap (array of
 * max_keys nodes, each entry knows its node): an expired entry is freed when
 * a lookup meets it, and each decision first pops at most
 * MEMSTORE_SWEEP_MAX expired entries off the heap top, so memory comes back
 * without a timer and no call pays for more than a few frees.
 *
 * Creation. As with Redis, a missing key is created only when its limit is
 * charged; we also skip creation when the cost is <= 0, because the state a
 * report or a refund writes on a fresh key equals the zero state (Redis
 * creates a key that expires within 1 ms or holds a zero count).
 *
 * Bound. Inserting into a full table frees the heap top: if it has expired
 * that is a reclaim, otherwise an eviction (counted) of the entry closest to
 * expiry, the one whose state carries the least information. Entries used by
 * the decision in progress are pinned (pin == the table's decision sequence
 * number); the victim is the unpinned entry closest to expiry, found by a
 * best-first walk from the heap top that meets at most STORE_MAX_LIMITS
 * pinned nodes. Only when every entry is pinned (max_keys below the keys of
 * one query) is a pinned one evicted; all existing entries are written back
 * before any insertion, so even then nothing dangles. A decision never fails.
 *
 * Ownership. The table owns its entries; an entry owns its key bytes and its
 * state's sliding-log array. During a decision each entry's state is moved
 * into a local array (the entry keeps a zero state), limit_decide() runs on
 * that array, and every local state is then moved back into its entry, moved
 * into a new entry, or released: each log array has one owner at every step.
 *
 * Duplicate keys in one query. Redis runs all checks before any commit, so
 * every occurrence of a key is checked against the same stored state; each
 * occurrence after the first gets a deep copy of it. The state kept is that
 * of the last occurrence that was charged (a later SET replaces an earlier
 * one), with its expiry. This is exact for GCRA and the two window counters;
 * for a sliding log Redis would add the entries of every charged occurrence,
 * we keep those of the last one only.
 *
 * Cost. A decision hashes its keys, probes, and does O(log max_keys) heap
 * work per charged key and per freed entry. Memory is allocated up front for
 * the slots and the heap (16 bytes each), then one entry per key.
 */
#include "memstore.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "compiler.h"
#include "hll.h"
#include "limiter.h"
#include "store.h"
#include "util.h"

#define MEMSTORE_MIN_SLOTS 8 /* smallest slot array */
#define MEMSTORE_SWEEP_MAX 8 /* expired entries each decision frees at most */

/* One key and the state of its limit. */
struct memstore_entry {
	uint64_t hash;                  /* SipHash of the key */
	uint64_t pin;                   /* sequence number of the last decision using it */
	int64_t used_us;                /* when a decision last used it (memstore_forget_idle()) */
	size_t node;                    /* its index in memstore.heap */
	struct limit_state st;          /* owned: st.log */
	size_t keylen;                  /* bytes in key, <= STORE_KEY_MAX */
	char key[];                     /* keylen bytes and a NUL */
};

/* One position of the open-addressing array. */
struct memstore_slot {
	uint64_t hash;                  /* copy of e->hash, compared before the key */
	struct memstore_entry *e;       /* owned; NULL: empty */
};

/* One node of the expiry heap. */
struct memstore_node {
	int64_t expire_us;              /* the entry is absent from this instant on */
	struct memstore_entry *e;       /* ref: owned by the slot array */
};

/* The table. */
struct memstore {
	struct memstore_slot *slots;    /* owned: mask + 1 slots */
	struct memstore_node *heap;     /* owned: max_keys nodes, count used, min-heap */
	size_t mask;                    /* slots - 1, slots a power of two */
	size_t count;                   /* entries held, <= max_keys */
	size_t max_keys;                /* bound on count, < mask + 1 */
	uint64_t seq;                   /* decisions so far; entries with pin == seq are in use */
	uint64_t evictions;             /* live entries dropped for room */
	uint64_t expired;               /* expired entries freed */
	uint64_t k0, k1;                /* SipHash key */
};

/* Keys are hashed with SipHash-1-3 (hll.c) under a random per-table key. */


/*
 * A random SipHash key. Should the kernel refuse (pre-3.17 or seccomp), the
 * clocks and an address still differ between runs; only flood resistance
 * suffers, never correctness.
 */
static void seed_hash(struct memstore *m)
{
	uint64_t k[2];
	struct timespec ts[2];

	if (getrandom(k, sizeof(k), GRND_NONBLOCK) == (ssize_t)sizeof(k)) {
		m->k0 = k[0];
		m->k1 = k[1];
		return;
	}
	clock_gettime(CLOCK_REALTIME, &ts[0]);
	clock_gettime(CLOCK_MONOTONIC, &ts[1]);
	m->k0 = hll_siphash13((uint64_t)(uintptr_t)m, 0x9e3779b97f4a7c15ULL, ts, sizeof(ts));
	m->k1 = hll_siphash13(m->k0, (uint64_t)(uintptr_t)&k, ts, sizeof(ts));
}

/* ---- expiry heap ----------------------------------------------------------------------- */

static void node_set(struct memstore *m, size_t i, struct memstore_node nd)
{
	m->heap[i] = nd;
	nd.e->node = i;
}

static void heap_up(struct memstore *m, size_t i)
{
	struct memstore_node nd = m->heap[i];

	while (i > 0 && m->heap[(i - 1) / 2].expire_us > nd.expire_us) {
		node_set(m, i, m->heap[(i - 1) / 2]);
		i = (i - 1) / 2;
	}
	node_set(m, i, nd);
}

/* The heap holds <len> nodes. */
static void heap_down(struct memstore *m, size_t i, size_t len)
{
	struct memstore_node nd = m->heap[i];

	for (;;) {
		size_t c = 2 * i + 1;

		if (c >= len)
			break;
		if (c + 1 < len && m->heap[c + 1].expire_us < m->heap[c].expire_us)
			c++;
		if (m->heap[c].expire_us >= nd.expire_us)
			break;
		node_set(m, i, m->heap[c]);
		i = c;
	}
	node_set(m, i, nd);
}

/* Moves <e>'s expiry to <expire_us> and restores the heap order. */
static void heap_update(struct memstore *m, struct memstore_entry *e, int64_t expire_us)
{
	size_t i = e->node;

	m->heap[i].expire_us = expire_us;
	heap_up(m, i);
	heap_down(m, e->node, m->count);
}

/* Takes node <i> out of a heap of <len> nodes (len - 1 remain). */
static void heap_remove(struct memstore *m, size_t i, size_t len)
{
	struct memstore_entry *moved = m->heap[len - 1].e;

	if (i == len - 1)
		return;
	node_set(m, i, m->heap[len - 1]);
	heap_up(m, i);
	heap_down(m, moved->node, len - 1);
}

/* ---- index ----------------------------------------------------------------------------- */

static int64_t entry_expiry(const struct memstore *m, const struct memstore_entry *e)
{
	return m->heap[e->node].expire_us;
}

/* The slot of key <key>/<len> with hash <h>, or SIZE_MAX. */
static size_t slot_find(const struct memstore *m, uint64_t h, const char *key, size_t len)
{
	size_t i = h & m->mask;

	for (; m->slots[i].e; i = (i + 1) & m->mask) {
		const struct memstore_entry *e = m->slots[i].e;

		if (m->slots[i].hash == h && e->keylen == len && memcmp(e->key, key, len) == 0)
			return i;
	}
	return SIZE_MAX;
}

/* The slot of entry <e>, which is in the table. */
static size_t slot_of(const struct memstore *m, const struct memstore_entry *e)
{
	size_t i = e->hash & m->mask;

	while (m->slots[i].e != e) {
		BUG_ON(!m->slots[i].e);
		i = (i + 1) & m->mask;
	}
	return i;
}

/* Frees the entry in slot <i>: out of the heap, hole closed by backward shift. */
static void entry_delete(struct memstore *m, size_t i)
{
	struct memstore_entry *e = m->slots[i].e;
	size_t hole = i, j = i;

	BUG_ON(!e);
	heap_remove(m, e->node, m->count);
	for (;;) {
		size_t home;

		j = (j + 1) & m->mask;
		if (!m->slots[j].e)
			break;
		/* the entry at j may fill the hole unless its home lies in (hole, j] */
		home = m->slots[j].hash & m->mask;
		if (((j - home) & m->mask) >= ((j - hole) & m->mask)) {
			m->slots[hole] = m->slots[j];
			hole = j;
		}
	}
	m->slots[hole].e = NULL;
	m->slots[hole].hash = 0;
	m->count--;
	limit_state_release(&e->st);
	free(e);
}

/*
 * The heap node of the unpinned entry closest to expiry, or the heap top if
 * every entry is pinned. Best-first walk: a node's children expire no sooner
 * than it, so after k pinned nodes the next candidate is the least of at most
 * k + 1 frontier nodes; at most STORE_MAX_LIMITS entries are pinned.
 */
static size_t victim_node(const struct memstore *m)
{
	size_t frontier[STORE_MAX_LIMITS + 2], nf = 1, pops, k, best, i;

	frontier[0] = 0;
	for (pops = 0; pops <= STORE_MAX_LIMITS && nf > 0; pops++) {
		best = 0;
		for (k = 1; k < nf; k++)
			if (m->heap[frontier[k]].expire_us < m->heap[frontier[best]].expire_us)
				best = k;
		i = frontier[best];
		if (m->heap[i].e->pin != m->seq)
			return i;
		frontier[best] = frontier[--nf];
		for (k = 2 * i + 1; k <= 2 * i + 2 && k < m->count; k++) {
			BUG_ON(nf >= ARRAY_SIZE(frontier));
			frontier[nf++] = k;
		}
	}
	return 0;
}

/* Frees one entry of a full table: the expired heap top, else a victim. */
static void make_room(struct memstore *m, int64_t now_us)
{
	size_t i;

	BUG_ON(m->count == 0);
	if (m->heap[0].expire_us <= now_us) {
		m->expired++;
		i = 0;
	} else {
		m->evictions++;
		i = victim_node(m);
	}
	entry_delete(m, slot_of(m, m->heap[i].e));
}

/* Adds an entry for a key known to be absent; it takes ownership of <st>'s log. */
static void entry_insert(struct memstore *m, uint64_t h, const char *key, size_t len,
			 struct limit_state *st, int64_t expire_us, int64_t now_us)
{
	struct memstore_entry *e;
	size_t i;

	if (m->count >= m->max_keys)
		make_room(m, now_us);
	e = xmalloc(sizeof(*e) + len + 1);
	e->hash = h;
	e->pin = m->seq;
	e->used_us = now_us;
	e->st = *st;
	memset(st, 0, sizeof(*st));
	e->keylen = len;
	memcpy(e->key, key, len);
	e->key[len] = 0;
	for (i = h & m->mask; m->slots[i].e; i = (i + 1) & m->mask)
		;
	m->slots[i].hash = h;
	m->slots[i].e = e;
	m->heap[m->count].expire_us = expire_us;
	m->heap[m->count].e = e;
	e->node = m->count;
	m->count++;
	heap_up(m, e->node);
}

/* ---- decisions ------------------------------------------------------------------------- */

/* A deep copy of <src> into <dst>, which owns nothing. */
static void state_copy(struct limit_state *dst, const struct limit_state *src)
{
	*dst = *src;
	dst->log = NULL;
	dst->caplog = 0;
	if (src->nlog) {
		dst->log = xmalloc(src->nlog * sizeof(*dst->log));
		memcpy(dst->log, src->log, src->nlog * sizeof(*dst->log));
		dst->caplog = src->nlog;
	}
}

/* now + reset_ms (at least 1 ms) in microseconds, saturated. */
static int64_t expiry_after(int64_t now_us, int64_t reset_ms)
{
	int64_t d;

	if (reset_ms < 1)
		reset_ms = 1;
	if (reset_ms > INT64_MAX / 1000)
		return INT64_MAX;
	d = reset_ms * 1000;
	return now_us > INT64_MAX - d ? INT64_MAX : now_us + d;
}

/*
 * When a charged entry's state becomes the zero state: now + reset_ms, but
 * for a concurrency limit the end of its last lease (its reset says when a
 * slot frees, not when every slot has), as the script's PEXPIRE.
 */
static int64_t charged_expiry(const struct limit_params *p, const struct limit_state *st,
			      int64_t now_us, int64_t reset_ms)
{
	int64_t end = now_us + 1000;
	size_t k;

	if (p->alg != ALG_CONCURRENCY)
		return expiry_after(now_us, reset_ms);
	for (k = 1; k < st->nlog; k += 2)
		if (st->log[k] > end)
			end = st->log[k];
	return end;
}

/*
 * Creates an empty table holding at most <max_keys> entries (clamped to
 * 1..MEMSTORE_MAX_KEYS). The slot array (16 bytes times 4/3 max_keys rounded
 * up to a power of two) and the heap (16 bytes times max_keys) are allocated
 * at once; each key then costs about 80 bytes plus its length, and a sliding
 * log 8 bytes per token in its window. Aborts on OOM, never returns NULL. The
 * caller owns the result and frees it with memstore_free().
 */
struct memstore *memstore_new(size_t max_keys)
{
	struct memstore *m = xcalloc(1, sizeof(*m));
	size_t nslots = MEMSTORE_MIN_SLOTS;

	if (max_keys < 1)
		max_keys = 1;
	if (max_keys > MEMSTORE_MAX_KEYS)
		max_keys = MEMSTORE_MAX_KEYS;
	while (nslots / 4 * 3 < max_keys)
		nslots *= 2;
	m->slots = xcalloc(nslots, sizeof(*m->slots));
	m->heap = xcalloc(max_keys, sizeof(*m->heap));
	m->mask = nslots - 1;
	m->max_keys = max_keys;
	seed_hash(m);
	return m;
}

/* Frees <m>, every entry and every sliding log it holds. NULL is a no-op. */
void memstore_free(struct memstore *m)
{
	size_t i;

	if (!m)
		return;
	for (i = 0; i < m->count; i++) {
		limit_state_release(&m->heap[i].e->st);
		free(m->heap[i].e);
	}
	free(m->heap);
	free(m->slots);
	free(m);
}

/*
 * Frees at most <max> entries that have expired at <now_us>, earliest first,
 * and returns how many. memstore_decide() calls it with a small budget; a
 * caller that wants the memory back at once (or runs a timer) may pass
 * SIZE_MAX. Never changes a verdict: an expired entry already behaves as
 * absent.
 */
size_t memstore_sweep(struct memstore *m, int64_t now_us, size_t max)
{
	size_t freed = 0;

	while (freed < max && m->count > 0 && m->heap[0].expire_us <= now_us) {
		entry_delete(m, slot_of(m, m->heap[0].e));
		m->expired++;
		freed++;
	}
	return freed;
}

/*
 * Frees every entry no decision used since <before_us> (live or not) and
 * returns how many. Unlike expiry this forgets state that still counts: the
 * caller decides when that is right (the local fallback limits, once Redis
 * answers again). Walks the whole slot array: call it seldom.
 */
size_t memstore_forget_idle(struct memstore *m, int64_t before_us)
{
	size_t i, freed = 0;

	for (i = 0; i <= m->mask && m->count > 0; i++) {
		/* a deletion shifts a later entry of the cluster into i: look again */
		while (m->slots[i].e && m->slots[i].e->used_us < before_us) {
			entry_delete(m, i);
			freed++;
		}
	}
	return freed;
}

/* <c> x <units> (units >= 1), clamped to +-LIMIT_COUNT_MAX as the script does */
static int64_t mul_clamp(int64_t c, int64_t units)
{
	int64_t m = c < 0 ? -c : c;

	m = m > LIMIT_COUNT_MAX / units ? LIMIT_COUNT_MAX : m * units;
	return c < 0 ? -m : m;
}

/*
 * Decides the limits of <q> as one policy at <now_us> and fills <res> (allowed,
 * n, now_us, v[0..n)),
 * as lua/decide.lua would against a Redis holding this table's keys: each
 * q->keys[i] (read up to its NUL, at most STORE_KEY_MAX bytes) is looked up,
 * an expired or missing one counts as a zero state, limit_decide() decides
 * with the costs q->cost[i], and every charged limit's entry is written with
 * its new expiry. A missing key that is not charged with a positive cost is
 * not created. A report (q->want > 0, BATCH_REPORT) charges want units of
 * every limit whatever it admits, as the script's report does (other batches
 * are decided as one unit). q->n above STORE_MAX_LIMITS counts as STORE_MAX_LIMITS.
 * <now_us> is any clock the caller uses consistently with this table. May
 * free expired entries and evict live ones (see memstore_evictions()); never
 * fails, invokes no callback, keeps no reference to <q> or <res>.
 */
/*
 * The name of the state of a query's key <key> in <buf> (STORE_KEY_MAX), its length in
 * <*len>: the key itself, but in key layout 2 ("<principal key>|<flags>#<field>",
 * limit_key()) without its flags: a limit's state is the same whether it is a shadow,
 * or Redis's layout 1 is read for it.
 */
static const char *state_name(const char *key, char *buf, size_t *len)
{
	const char *bar = strchr(key, '|'), *hash = bar ? strchr(bar, '#') : NULL;
	size_t a;

	*len = strnlen(key, STORE_KEY_MAX);
	if (!hash)
		return key;
	a = (size_t)(bar + 1 - key);
	memcpy(buf, key, a);
	memcpy(buf + a, hash + 1, *len - (size_t)(hash + 1 - key));
	*len -= (size_t)(hash - bar);
	buf[*len] = '\0';
	return buf;
}

static void decide_policy(struct memstore *m, const struct store_query *q, int64_t now_us,
			  struct store_result *res)
{
	struct limit_state st[STORE_MAX_LIMITS];
	struct memstore_entry *ent[STORE_MAX_LIMITS]; /* by first occurrence; ref */
	char names[STORE_MAX_LIMITS][STORE_KEY_MAX];
	const char *name[STORE_MAX_LIMITS];     /* state_name() of each key */
	uint64_t h[STORE_MAX_LIMITS];
	size_t len[STORE_MAX_LIMITS], first[STORE_MAX_LIMITS], win[STORE_MAX_LIMITS];
	size_t n = q->n < STORE_MAX_LIMITS ? q->n : STORE_MAX_LIMITS;
	bool report = q->want > 0 && q->batch == BATCH_REPORT;
	size_t i, j;
	int pass;

	m->seq++;
	memstore_sweep(m, now_us, MEMSTORE_SWEEP_MAX);

	for (i = 0; i < n; i++) {
		name[i] = state_name(q->keys[i], names[i], &len[i]);
		h[i] = hll_siphash13(m->k0, m->k1, name[i], len[i]);
		first[i] = i;
		for (j = 0; j < i; j++) {
			if (first[j] == j && h[j] == h[i] && len[j] == len[i] &&
			    memcmp(name[j], name[i], len[i]) == 0) {
				first[i] = j;
				break;
			}
		}
		ent[i] = NULL;
		if (first[i] != i) {
			state_copy(&st[i], &st[first[i]]);
			continue;
		}
		memset(&st[i], 0, sizeof(st[i]));
		j = slot_find(m, h[i], name[i], len[i]);
		if (j == SIZE_MAX)
			continue;
		if (entry_expiry(m, m->slots[j].e) <= now_us) {
			entry_delete(m, j);
			m->expired++;
			continue;
		}
		ent[i] = m->slots[j].e;
		ent[i]->pin = m->seq;
		ent[i]->used_us = now_us;
		st[i] = ent[i]->st; /* moved out: the entry holds a zero state meanwhile */
		memset(&ent[i]->st, 0, sizeof(ent[i]->st));
	}

	if (report) {
		/* a report charges want units whatever fits, as the script's */
		int64_t cost[STORE_MAX_LIMITS];

		for (i = 0; i < n; i++)
			cost[i] = q->want > 1 && q->cost[i] ? mul_clamp(q->cost[i], q->want)
							     : q->cost[i];
		limit_report(q->params, st, n, cost, now_us, res->v);
		res->allowed = true;
	} else {
		res->allowed = limit_decide(q->params, st, n, q->cost, now_us, res->v);
	}
	res->n = n;
	res->now_us = now_us;
	res->granted = res->allowed ? 1 : 0; /* other batches are the Redis store's */
	res->lease_ms = 0;

	/* for each key, the occurrence whose state is kept: the last charged one */
	for (i = 0; i < n; i++) {
		if (first[i] == i)
			win[i] = i;
		if (res->allowed && (res->v[i].allowed || report))
			win[first[i]] = i;
	}
	/* pass 0 writes existing entries back, pass 1 inserts: an insertion may evict */
	for (pass = 0; pass < 2; pass++) {
		for (i = 0; i < n; i++) {
			size_t w = win[i];
			bool charged;

			if (first[i] != i || (pass == 0) != (ent[i] != NULL))
				continue;
			charged = res->allowed && (res->v[w].allowed || report);
			for (j = i; j < n; j++)
				if (first[j] == i && j != w)
					limit_state_release(&st[j]);
			if (ent[i]) {
				ent[i]->st = st[w];
				if (charged)
					heap_update(m, ent[i],
						    charged_expiry(&q->params[w], &st[w], now_us,
								   res->v[w].reset_ms));
			} else if (charged && q->cost[w] > 0) {
				entry_insert(m, h[i], name[i], len[i], &st[w],
					     charged_expiry(&q->params[w], &st[w], now_us,
							    res->v[w].reset_ms),
					     now_us);
			} else {
				limit_state_release(&st[w]);
			}
		}
	}
}

/* Copies limits <from> to <from> + <n> (exclusive) of <q> into <cq>, as its own. */
static void query_slice(struct store_query *cq, const struct store_query *q, size_t from, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		memcpy(cq->keys[i], q->keys[from + i], sizeof(cq->keys[0]));
		cq->params[i] = q->params[from + i];
		cq->cost[i] = q->cost[from + i];
	}
	cq->n = n;
}

/*
 * Decides query <q> at <now_us> and fills <res>, as the script's call would:
 * its own limits decided as one policy (decide_policy()), then its
 * candidate's (the last q->ncand, see struct store_query) as a decision of
 * their own, which changes nothing of the first (res->cand_ok, cand_allowed).
 */
void memstore_decide(struct memstore *m, const struct store_query *q, int64_t now_us,
		     struct store_result *res)
{
	size_t ne = q->n - q->ncand, i;
	struct store_query cq;
	struct store_result cr;

	if (!q->ncand) {
		decide_policy(m, q, now_us, res);
		return;
	}
	store_query_init(&cq);
	query_slice(&cq, q, 0, ne);
	memset(res, 0, sizeof(*res));
	res->allowed = true;
	res->now_us = now_us;
	if (ne)
		decide_policy(m, &cq, now_us, res);
	query_slice(&cq, q, ne, q->ncand);
	decide_policy(m, &cq, now_us, &cr);
	for (i = 0; i < q->ncand; i++)
		res->v[ne + i] = cr.v[i];
	res->n = q->n;
	res->cand_ok = true;
	res->cand_allowed = cr.allowed;
}

/*
 * Whether every invariant of <m> holds: each entry is reachable from its
 * home slot, knows its heap node, the heap is ordered, and the counts agree.
 * O(slots); meant for tests and DEBUG builds, not for the request path.
 */
bool memstore_check(const struct memstore *m)
{
	size_t i, n = 0;

	if (m->count > m->max_keys || m->max_keys > m->mask)
		return false;
	for (i = 0; i <= m->mask; i++) {
		const struct memstore_entry *e = m->slots[i].e;

		if (!e)
			continue;
		n++;
		if (m->slots[i].hash != e->hash || e->keylen > STORE_KEY_MAX || e->key[e->keylen] ||
		    slot_find(m, e->hash, e->key, e->keylen) != i || e->node >= m->count ||
		    m->heap[e->node].e != e)
			return false;
	}
	for (i = 1; i < m->count; i++)
		if (m->heap[(i - 1) / 2].expire_us > m->heap[i].expire_us)
			return false;
	return n == m->count;
}

/* Entries held, expired ones not yet freed included; never above memstore_capacity(). */
size_t memstore_size(const struct memstore *m)
{
	return m->count;
}

/* The bound on memstore_size(): max_keys after clamping. */
size_t memstore_capacity(const struct memstore *m)
{
	return m->max_keys;
}

/* Live entries dropped to make room for new ones since memstore_new(). */
uint64_t memstore_evictions(const struct memstore *m)
{
	return m->evictions;
}

/* Expired entries freed (by lookups, sweeps or insertions into a full table). */
uint64_t memstore_expired(const struct memstore *m)
{
	return m->expired;
}
