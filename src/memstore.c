/* SPDX-License-Identifier: MIT */
/*
 * DESIGN
 *
 * Table. Open addressing with linear probing over a power-of-two array of
 * slots, each holding the key's hash and a pointer to its heap entry (key
 * bytes, struct limit_state, expiry). There are no tombstones: a deletion
 * shifts the rest of its cluster back (Knuth's algorithm R), so probe
 * sequences never lengthen with churn. The slot array is sized once for a
 * load factor of at most 3/4 at max_keys entries and never grows; since
 * count <= max_keys < slots there is always an empty slot, which bounds every
 * probe loop. Keys are hashed with SipHash-2-4 under a random per-table key:
 * the keys embed client data, and a guessable hash would let a client build
 * one long cluster and make every lookup scan the table.
 *
 * Expiry. When a decision charges a limit (cost > 0, 0 or a refund) its entry
 * expires at now + reset_ms (at least 1 ms), the verdict's "fully available
 * again" time: the TTL rule of lua/ (each script sets the key's PX to its
 * reset time, rounded up). From that instant the state is equivalent to a
 * zero state for every algorithm (GCRA: tat <= now; windows: the stored
 * window index is too old; sliding log: every timestamp has left the
 * window), so an expired entry is treated as absent and freed when a lookup
 * meets it, when the victim search meets it, or by the sweep: each decision
 * examines MEMSTORE_SWEEP_SLOTS slots from a rotating cursor, so without any
 * timer a table of S slots is swept every S / MEMSTORE_SWEEP_SLOTS decisions.
 * A limit that is evaluated but not charged keeps its expiry.
 *
 * Creation. As with Redis, a key that does not exist is created only when
 * its limit is charged; we also skip creation when the cost is <= 0, because
 * the state a report or a refund writes on a fresh key equals the zero state
 * (Redis creates a key that expires within 1 ms or holds a zero count).
 *
 * Bound. Inserting into a full table first looks for an expired entry among
 * a sample of MEMSTORE_SAMPLE occupied slots taken from a second rotating
 * cursor; if there is none it evicts the sampled entry closest to expiry
 * (the one whose state carries the least information) and counts an
 * eviction. Entries used by the decision in progress are pinned (their pin
 * equals the table's decision sequence number) and evicted only if nothing
 * else exists, e.g. with max_keys below the number of keys of one query; all
 * existing entries are written back before any insertion, so even then no
 * pointer dangles. A decision never fails.
 *
 * Ownership. The table owns its entries; an entry owns its key bytes and its
 * state's sliding-log array. During a decision each entry's state is moved
 * into a local array (the entry keeps a zero state), limit_decide() runs on
 * that array, and every local state is then either moved back into an
 * entry, moved into a new entry, or released: each log array has exactly one
 * owner at every step.
 *
 * Duplicate keys in one query. Redis runs all checks before any commit, so
 * every occurrence of a key is checked against the same stored state; each
 * occurrence after the first gets a deep copy of it. The state kept is that
 * of the last occurrence that was charged (a later SET replaces an earlier
 * one), with its expiry. This is exact for GCRA and the two window counters;
 * for a sliding log Redis would add the entries of every charged occurrence,
 * we keep those of the last one only.
 */
#include "memstore.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "compiler.h"
#include "limiter.h"
#include "store.h"
#include "util.h"

#define MEMSTORE_MIN_SLOTS   8  /* smallest slot array */
#define MEMSTORE_SWEEP_SLOTS 16 /* slots examined by the sweep of each decision */
#define MEMSTORE_SAMPLE      8  /* occupied slots compared when choosing a victim */
#define MEMSTORE_SCAN        64 /* slots scanned to find that sample, unless none */

/* One key and the state of its limit. */
struct memstore_entry {
	uint64_t hash;                  /* SipHash of the key */
	int64_t expire_us;              /* absent from this instant on */
	uint64_t pin;                   /* sequence number of the last decision using it */
	struct limit_state st;          /* owned: st.log */
	size_t keylen;                  /* bytes in key, <= STORE_KEY_MAX */
	char key[];                     /* keylen bytes and a NUL */
};

/* One position of the open-addressing array. */
struct memstore_slot {
	uint64_t hash;                  /* copy of e->hash, compared before the key */
	struct memstore_entry *e;       /* owned; NULL: empty */
};

/* The table. */
struct memstore {
	struct memstore_slot *slots;    /* owned: mask + 1 slots */
	size_t mask;                    /* slots - 1, slots a power of two */
	size_t count;                   /* entries held, <= max_keys */
	size_t max_keys;                /* bound on count, < mask + 1 */
	size_t sweep_pos;               /* next slot examined by the sweep */
	size_t evict_pos;               /* next slot examined by the victim search */
	uint64_t seq;                   /* decisions so far; entries with pin == seq are in use */
	uint64_t evictions;             /* live entries dropped for room */
	uint64_t expired;               /* expired entries reclaimed */
	uint64_t k0, k1;                /* SipHash key */
};

/* ---- SipHash-2-4 (Aumasson and Bernstein, 2012) ---------------------------------------- */

#define ROTL64(x, b) (((x) << (b)) | ((x) >> (64 - (b))))

#define SIPROUND(v0, v1, v2, v3)                                                            \
	do {                                                                                \
		(v0) += (v1);                                                               \
		(v1) = ROTL64((v1), 13);                                                    \
		(v1) ^= (v0);                                                               \
		(v0) = ROTL64((v0), 32);                                                    \
		(v2) += (v3);                                                               \
		(v3) = ROTL64((v3), 16);                                                    \
		(v3) ^= (v2);                                                               \
		(v0) += (v3);                                                               \
		(v3) = ROTL64((v3), 21);                                                    \
		(v3) ^= (v0);                                                               \
		(v2) += (v1);                                                               \
		(v1) = ROTL64((v1), 17);                                                    \
		(v1) ^= (v2);                                                               \
		(v2) = ROTL64((v2), 32);                                                    \
	} while (0)

static uint64_t load_le64(const unsigned char *p)
{
	uint64_t v = 0;
	int i;

	for (i = 7; i >= 0; i--)
		v = (v << 8) | p[i];
	return v;
}

static uint64_t siphash24(uint64_t k0, uint64_t k1, const void *data, size_t len)
{
	const unsigned char *in = data;
	uint64_t v0 = 0x736f6d6570736575ULL ^ k0;
	uint64_t v1 = 0x646f72616e646f6dULL ^ k1;
	uint64_t v2 = 0x6c7967656e657261ULL ^ k0;
	uint64_t v3 = 0x7465646279746573ULL ^ k1;
	uint64_t b = (uint64_t)len << 56, w;
	size_t i, j;

	for (i = 0; i + 8 <= len; i += 8) {
		w = load_le64(in + i);
		v3 ^= w;
		SIPROUND(v0, v1, v2, v3);
		SIPROUND(v0, v1, v2, v3);
		v0 ^= w;
	}
	for (j = 0; i + j < len; j++)
		b |= (uint64_t)in[i + j] << (8 * j);
	v3 ^= b;
	SIPROUND(v0, v1, v2, v3);
	SIPROUND(v0, v1, v2, v3);
	v0 ^= b;
	v2 ^= 0xff;
	SIPROUND(v0, v1, v2, v3);
	SIPROUND(v0, v1, v2, v3);
	SIPROUND(v0, v1, v2, v3);
	SIPROUND(v0, v1, v2, v3);
	return v0 ^ v1 ^ v2 ^ v3;
}

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
	m->k0 = siphash24((uint64_t)(uintptr_t)m, 0x9e3779b97f4a7c15ULL, ts, sizeof(ts));
	m->k1 = siphash24(m->k0, (uint64_t)(uintptr_t)&k, ts, sizeof(ts));
}

/* ---- table primitives ------------------------------------------------------------------ */

static void entry_free(struct memstore_entry *e)
{
	limit_state_release(&e->st);
	free(e);
}

static bool entry_expired(const struct memstore_entry *e, int64_t now_us)
{
	return e->expire_us <= now_us;
}

/* Frees the entry in slot <i> and closes the hole (backward-shift deletion). */
static void slot_delete(struct memstore *m, size_t i)
{
	size_t hole = i, j = i;

	BUG_ON(!m->slots[i].e);
	entry_free(m->slots[i].e);
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
}

/* The slot holding key <key>/<len> with hash <h>, or SIZE_MAX. */
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

/*
 * Frees one entry of a full table: the first expired one met while sampling,
 * else the unpinned sampled entry closest to expiry (an eviction), else the
 * pinned one closest to expiry. The scan goes past MEMSTORE_SCAN slots only
 * while it has found no unpinned entry, and never past one full turn.
 */
static void make_room(struct memstore *m, int64_t now_us)
{
	size_t best = SIZE_MAX, best_pinned = SIZE_MAX, seen = 0, scanned = 0;
	size_t nslots = m->mask + 1, i;

	while (scanned < nslots &&
	       ((seen < MEMSTORE_SAMPLE && scanned < MEMSTORE_SCAN) || best == SIZE_MAX)) {
		const struct memstore_entry *e;

		i = m->evict_pos;
		m->evict_pos = (i + 1) & m->mask;
		scanned++;
		e = m->slots[i].e;
		if (!e)
			continue;
		seen++;
		if (entry_expired(e, now_us)) {
			slot_delete(m, i);
			m->expired++;
			return;
		}
		if (e->pin == m->seq) {
			if (best_pinned == SIZE_MAX || e->expire_us < m->slots[best_pinned].e->expire_us)
				best_pinned = i;
		} else if (best == SIZE_MAX || e->expire_us < m->slots[best].e->expire_us) {
			best = i;
		}
	}
	if (best == SIZE_MAX)
		best = best_pinned;
	BUG_ON(best == SIZE_MAX); /* the table is full, so not empty */
	slot_delete(m, best);
	m->evictions++;
}

/* Adds a new entry for a key known to be absent; it takes ownership of <st>'s log. */
static void entry_insert(struct memstore *m, uint64_t h, const char *key, size_t len,
			 struct limit_state *st, int64_t expire_us, int64_t now_us)
{
	struct memstore_entry *e;
	size_t i;

	if (m->count >= m->max_keys)
		make_room(m, now_us);
	e = xmalloc(sizeof(*e) + len + 1);
	e->hash = h;
	e->expire_us = expire_us;
	e->pin = m->seq;
	e->st = *st;
	memset(st, 0, sizeof(*st));
	e->keylen = len;
	memcpy(e->key, key, len);
	e->key[len] = 0;
	for (i = h & m->mask; m->slots[i].e; i = (i + 1) & m->mask)
		;
	m->slots[i].hash = h;
	m->slots[i].e = e;
	m->count++;
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
 * Creates an empty table holding at most <max_keys> entries (clamped to
 * 1..MEMSTORE_MAX_KEYS). Its slot array is allocated at once: about 16 bytes
 * times 4/3 max_keys rounded up to a power of two, plus per entry ~80 bytes,
 * the key, and for a sliding log 8 bytes per logged token. Aborts on OOM;
 * never returns NULL. The caller owns the result and frees it with
 * memstore_free().
 */
struct memstore *memstore_new(size_t max_keys)
{
	struct memstore *m = xcalloc(1, sizeof(*m));
	size_t nslots = MEMSTORE_MIN_SLOTS;

	if (max_keys < 1)
		max_keys = 1;
	if (max_keys > MEMSTORE_MAX_KEYS)
		max_keys = MEMSTORE_MAX_KEYS;
	while (nslots / 4 * 3 < max_keys || nslots <= max_keys)
		nslots *= 2;
	m->slots = xcalloc(nslots, sizeof(*m->slots));
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
	for (i = 0; i <= m->mask; i++)
		if (m->slots[i].e)
			entry_free(m->slots[i].e);
	free(m->slots);
	free(m);
}

/*
 * Reclaims the expired entries among the next <max_slots> slots of the sweep
 * cursor at <now_us>, and returns how many it freed. memstore_decide() calls
 * it with a small budget; a caller that wants memory back at once (or runs a
 * timer) may pass a larger one; 2 * the slot count always covers the table.
 * Never changes a verdict: an expired entry already behaves as absent.
 */
size_t memstore_sweep(struct memstore *m, int64_t now_us, size_t max_slots)
{
	size_t freed = 0, nslots = m->mask + 1;

	if (max_slots > 2 * nslots)
		max_slots = 2 * nslots;
	while (max_slots-- > 0 && m->count > 0) {
		struct memstore_entry *e = m->slots[m->sweep_pos].e;

		if (e && entry_expired(e, now_us)) {
			/* the shift may bring another entry here: look again */
			slot_delete(m, m->sweep_pos);
			m->expired++;
			freed++;
			continue;
		}
		m->sweep_pos = (m->sweep_pos + 1) & m->mask;
	}
	return freed;
}

/*
 * Decides query <q> at <now_us> and fills <res> (allowed, n, now_us, v[0..n)),
 * as lua/decide.lua would against a Redis holding this table's keys: each
 * q->keys[i] (read up to its NUL or STORE_KEY_MAX bytes) is looked up, an
 * expired or missing one counts as a zero state, limit_decide() decides, and
 * every charged limit's entry is written with its new expiry. A key that is
 * missing and not charged with a positive cost is not created. q->n above
 * STORE_MAX_LIMITS is treated as STORE_MAX_LIMITS. <now_us> is any clock the
 * caller uses consistently for this table. May evict entries (see
 * memstore_evictions()); never fails, invokes no callback, and keeps no
 * reference to <q> or <res>, both owned by the caller.
 */
void memstore_decide(struct memstore *m, const struct store_query *q, int64_t now_us,
		     struct store_result *res)
{
	struct limit_state st[STORE_MAX_LIMITS];
	struct memstore_entry *ent[STORE_MAX_LIMITS]; /* per first occurrence; ref */
	uint64_t h[STORE_MAX_LIMITS];
	size_t len[STORE_MAX_LIMITS], first[STORE_MAX_LIMITS], win[STORE_MAX_LIMITS];
	size_t n = q->n < STORE_MAX_LIMITS ? q->n : STORE_MAX_LIMITS;
	size_t i, j;
	int pass;

	m->seq++;
	memstore_sweep(m, now_us, MEMSTORE_SWEEP_SLOTS);

	for (i = 0; i < n; i++) {
		len[i] = strnlen(q->keys[i], STORE_KEY_MAX);
		h[i] = siphash24(m->k0, m->k1, q->keys[i], len[i]);
		first[i] = i;
		for (j = 0; j < i; j++) {
			if (first[j] == j && h[j] == h[i] && len[j] == len[i] &&
			    memcmp(q->keys[j], q->keys[i], len[i]) == 0) {
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
		j = slot_find(m, h[i], q->keys[i], len[i]);
		if (j == SIZE_MAX)
			continue;
		if (entry_expired(m->slots[j].e, now_us)) {
			slot_delete(m, j);
			m->expired++;
			continue;
		}
		ent[i] = m->slots[j].e;
		ent[i]->pin = m->seq;
		st[i] = ent[i]->st; /* moved out: the entry holds a zero state meanwhile */
		memset(&ent[i]->st, 0, sizeof(ent[i]->st));
	}

	res->allowed = limit_decide(q->params, st, n, q->cost, now_us, res->v);
	res->n = n;
	res->now_us = now_us;

	/* for each key, the occurrence whose state is kept: the last charged one */
	for (i = 0; i < n; i++) {
		if (first[i] == i)
			win[i] = i;
		if (res->allowed && res->v[i].allowed)
			win[first[i]] = i;
	}
	/* pass 0 writes existing entries back, pass 1 inserts: an insertion may evict */
	for (pass = 0; pass < 2; pass++) {
		for (i = 0; i < n; i++) {
			size_t w = win[i];
			bool charged;

			if (first[i] != i || (pass == 0) != (ent[i] != NULL))
				continue;
			charged = res->allowed && res->v[w].allowed;
			for (j = i; j < n; j++)
				if (first[j] == i && j != w)
					limit_state_release(&st[j]);
			if (ent[i]) {
				ent[i]->st = st[w];
				if (charged)
					ent[i]->expire_us = expiry_after(now_us, res->v[w].reset_ms);
			} else if (charged && q->cost[w] > 0) {
				entry_insert(m, h[i], q->keys[i], len[i], &st[w],
					     expiry_after(now_us, res->v[w].reset_ms), now_us);
			} else {
				limit_state_release(&st[w]);
			}
		}
	}
}

/* Entries held, expired ones not yet reclaimed included; never above the bound. */
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

/* Expired entries reclaimed (by lookups, the sweep or the victim search). */
uint64_t memstore_expired(const struct memstore *m)
{
	return m->expired;
}
