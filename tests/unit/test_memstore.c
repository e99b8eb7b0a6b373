/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the in-process store: same verdicts as limit_decide() on plain
 * states, key expiry as the scripts' TTLs, the bound on entries, evictions,
 * and ownership of sliding logs (run under ASan/LSan).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "limiter.h"
#include "memstore.h"
#include "store.h"
#include "util.h"

#define MS  1000LL
#define SEC 1000000LL
#define T0  (1700000000LL * SEC) /* a realtime-like origin */

/* xorshift64*: deterministic pseudo-random numbers for the randomised tests */
static uint64_t rnd_next(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545f4914f6cdd1dULL;
}

static uint64_t rnd_below(uint64_t *s, uint64_t n)
{
	return n ? rnd_next(s) % n : 0;
}

static void query_reset(struct store_query *q)
{
	memset(q, 0, sizeof(*q));
}

static void query_add(struct store_query *q, const char *key, const struct limit_params *p,
		      int64_t cost)
{
	assert_true(q->n < STORE_MAX_LIMITS);
	snprintf(q->keys[q->n], sizeof(q->keys[q->n]), "%s", key);
	q->params[q->n] = *p;
	q->cost[q->n] = cost;
	q->n++;
}

/* One decision of a single limit; returns the verdict. */
static bool decide1(struct memstore *m, const char *key, const struct limit_params *p,
		    int64_t cost, int64_t now, struct limit_verdict *v)
{
	struct store_query q;
	struct store_result res;

	query_reset(&q);
	query_add(&q, key, p, cost);
	memstore_decide(m, &q, now, &res);
	assert_int_equal(res.n, 1);
	assert_int_equal(res.now_us, now);
	if (v)
		*v = res.v[0];
	return res.allowed;
}

static void assert_verdicts_equal(const struct limit_verdict *a, const struct limit_verdict *b,
				  size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		assert_int_equal(a[i].allowed, b[i].allowed);
		assert_int_equal(a[i].remaining, b[i].remaining);
		assert_int_equal(a[i].retry_ms, b[i].retry_ms);
		assert_int_equal(a[i].reset_ms, b[i].reset_ms);
	}
}

/*
 * The reference the store is compared with: one plain struct limit_state per
 * key that is never forgotten, decided with limit_decide() directly, plus the
 * expected existence and expiry of each key under the scripts' TTL rule.
 */
struct model_key {
	char name[STORE_KEY_MAX];
	struct limit_params p;
	struct limit_state st;
	bool exists;
	int64_t expire_us;
};

/* Expected entries at <now>: keys that exist and have not expired. */
static size_t model_live(const struct model_key *k, size_t nkeys, int64_t now)
{
	size_t i, live = 0;

	for (i = 0; i < nkeys; i++)
		live += k[i].exists && k[i].expire_us > now;
	return live;
}

static int64_t expected_expiry(int64_t now, int64_t reset_ms)
{
	return now + (reset_ms < 1 ? 1 : reset_ms) * MS;
}

static int64_t random_cost(uint64_t *s)
{
	static const int64_t costs[] = {1, 1, 1, 1, 1, 1, 1, 2, 3, 0, -1, -2, 50};

	return costs[rnd_below(s, ARRAY_SIZE(costs))];
}

/* Advances by mostly small steps, sometimes a period, sometimes several. */
static int64_t random_step(uint64_t *s, int64_t period_us)
{
	uint64_t r = rnd_below(s, 100);

	if (r < 70)
		return (int64_t)rnd_below(s, (uint64_t)period_us / 20 + 1);
	if (r < 95)
		return (int64_t)rnd_below(s, (uint64_t)period_us + 1);
	return period_us + (int64_t)rnd_below(s, 3 * (uint64_t)period_us);
}

/*
 * Runs <steps> random queries of 1..<maxn> distinct keys out of <nkeys>, key k
 * using <params>[k % <np>], against a store of exactly <nkeys> entries and
 * against the plain model; every verdict must be equal, and after a full
 * sweep the store must hold exactly the keys the scripts' TTLs keep.
 */
static void check_against_model(const struct limit_params *params, size_t np, size_t nkeys,
				 size_t maxn, size_t steps, int64_t period_us, uint64_t seed)
{
	struct model_key *keys = xcalloc(nkeys, sizeof(*keys));
	struct memstore *m = memstore_new(nkeys);
	int64_t now = T0 + (int64_t)rnd_below(&seed, 10 * SEC);
	size_t step, i, j;

	for (i = 0; i < nkeys; i++) {
		snprintf(keys[i].name, sizeof(keys[i].name), "rl:{k:%zu}:limit%zu", i, i % np);
		keys[i].p = params[i % np];
	}
	for (step = 0; step < steps; step++) {
		struct store_query q;
		struct store_result res;
		struct limit_state st[STORE_MAX_LIMITS];
		struct limit_verdict v[STORE_MAX_LIMITS];
		size_t idx[STORE_MAX_LIMITS], n = 1 + rnd_below(&seed, maxn), forced;
		bool allowed;

		now += random_step(&seed, period_us);
		forced = SIZE_MAX;
		if (rnd_below(&seed, 10) == 0) {
			/* land on a key's expiry instant, or just before it, and use that key */
			size_t f = rnd_below(&seed, nkeys);
			int64_t t = keys[f].expire_us - (int64_t)rnd_below(&seed, 2);

			if (keys[f].exists && t > now) {
				now = t;
				forced = f;
			}
		}
		query_reset(&q);
		for (i = 0; i < n; i++) {
			bool dup;

			do { /* distinct keys */
				idx[i] = rnd_below(&seed, nkeys);
				if (i == 0 && forced != SIZE_MAX)
					idx[i] = forced;
				dup = false;
				for (j = 0; j < i; j++)
					dup |= idx[j] == idx[i];
			} while (dup);
			query_add(&q, keys[idx[i]].name, &keys[idx[i]].p, random_cost(&seed));
			if (rnd_below(&seed, 8) == 0)
				q.params[i].shadow = true;
		}
		memstore_decide(m, &q, now, &res);

		for (i = 0; i < n; i++) {
			struct model_key *k = &keys[idx[i]];

			if (k->exists && k->expire_us <= now)
				k->exists = false;
			st[i] = k->st; /* moved, given back below */
		}
		allowed = limit_decide(q.params, st, n, q.cost, now, v);
		for (i = 0; i < n; i++) {
			struct model_key *k = &keys[idx[i]];

			k->st = st[i];
			if (!allowed || !v[i].allowed)
				continue;
			if (k->exists || q.cost[i] > 0) {
				k->exists = true;
				k->expire_us = expected_expiry(now, v[i].reset_ms);
			}
		}
		assert_int_equal(res.allowed, allowed);
		assert_int_equal(res.n, n);
		assert_int_equal(res.now_us, now);
		assert_verdicts_equal(res.v, v, n);
		assert_true(memstore_size(m) <= nkeys);
		assert_true(memstore_check(m));

		if (step % 997 == 0 || step == steps - 1) {
			memstore_sweep(m, now, SIZE_MAX);
			assert_int_equal(memstore_size(m), model_live(keys, nkeys, now));
		}
	}
	assert_int_equal(memstore_evictions(m), 0);
	for (i = 0; i < nkeys; i++)
		limit_state_release(&keys[i].st);
	free(keys);
	memstore_free(m);
}

static void test_memstore_gcra_matches_model(void **state)
{
	struct limit_params p[3];

	(void)state;
	limit_params_init(&p[0], ALG_GCRA, 5, 1000, 0);       /* 5/s */
	limit_params_init(&p[1], ALG_GCRA, 3, 1000, 10);      /* 3/s, burst 10 */
	limit_params_init(&p[2], ALG_GCRA, 100, 60000, 0);    /* 100/min */
	check_against_model(p, 1, 40, 1, 20000, 1000 * MS, 1);
	check_against_model(p, 3, 300, 3, 20000, 1000 * MS, 2);
}

static void test_memstore_fixed_window_matches_model(void **state)
{
	struct limit_params p[2];

	(void)state;
	limit_params_init(&p[0], ALG_FIXED_WINDOW, 5, 1000, 0);
	limit_params_init(&p[1], ALG_FIXED_WINDOW, 20, 7000, 0); /* not a divisor of the epoch */
	check_against_model(p, 1, 40, 1, 20000, 1000 * MS, 3);
	check_against_model(p, 2, 300, 3, 20000, 1000 * MS, 4);
}

static void test_memstore_sliding_log_matches_model(void **state)
{
	struct limit_params p[2];

	(void)state;
	limit_params_init(&p[0], ALG_SLIDING_LOG, 5, 1000, 0);
	limit_params_init(&p[1], ALG_SLIDING_LOG, 40, 3000, 0);
	check_against_model(p, 1, 40, 1, 20000, 1000 * MS, 5);
	check_against_model(p, 2, 300, 3, 20000, 1000 * MS, 6);
}

static void test_memstore_sliding_window_matches_model(void **state)
{
	struct limit_params p[2];

	(void)state;
	limit_params_init(&p[0], ALG_SLIDING_WINDOW, 5, 1000, 0);
	limit_params_init(&p[1], ALG_SLIDING_WINDOW, 30, 2500, 0);
	check_against_model(p, 1, 40, 1, 20000, 1000 * MS, 7);
	check_against_model(p, 2, 300, 3, 20000, 1000 * MS, 8);
}

static void test_memstore_mixed_algorithms_match_model(void **state)
{
	struct limit_params p[5];

	(void)state;
	limit_params_init(&p[0], ALG_GCRA, 4, 1000, 0);
	limit_params_init(&p[1], ALG_FIXED_WINDOW, 6, 1000, 0);
	limit_params_init(&p[2], ALG_SLIDING_LOG, 8, 2000, 0);
	limit_params_init(&p[3], ALG_SLIDING_WINDOW, 7, 1500, 0);
	limit_params_init(&p[4], ALG_GCRA, 1, 50, 2); /* entries that expire within ms */
	check_against_model(p, 5, 500, 6, 30000, 1000 * MS, 9);
	/* a table of a few slots: long clusters, wrap-around, shifts on every delete */
	check_against_model(p, 5, 5, 4, 20000, 1000 * MS, 10);
}

static void test_memstore_denial_charges_nothing(void **state)
{
	struct memstore *m = memstore_new(16);
	struct limit_params fast, daily;
	struct store_query q;
	struct store_result res;
	int64_t now = T0;
	int i;

	(void)state;
	limit_params_init(&fast, ALG_GCRA, 2, 1000, 0);       /* 2/s */
	limit_params_init(&daily, ALG_FIXED_WINDOW, 100, 86400000, 0);
	query_reset(&q);
	query_add(&q, "rl:{a}:fast", &fast, 1);
	query_add(&q, "rl:{a}:daily", &daily, 1);
	memstore_decide(m, &q, now, &res);
	assert_true(res.allowed);
	memstore_decide(m, &q, now, &res);
	assert_true(res.allowed);
	assert_int_equal(res.v[1].remaining, 98);
	for (i = 0; i < 10; i++) {
		memstore_decide(m, &q, now, &res);
		assert_false(res.allowed);
		assert_false(res.v[0].allowed);
		assert_true(res.v[1].allowed);
		assert_int_equal(res.v[1].remaining, 98); /* the daily limit was not charged */
	}
	/* a third limit seen for the first time in a denied query is not created */
	query_add(&q, "rl:{a}:hourly", &daily, 1);
	memstore_decide(m, &q, now, &res);
	assert_false(res.allowed);
	assert_int_equal(memstore_size(m), 2);
	/* a denying shadow limit neither denies nor is charged */
	q.params[0].shadow = true;
	memstore_decide(m, &q, now, &res);
	assert_true(res.allowed);
	assert_false(res.v[0].allowed);
	assert_int_equal(res.v[1].remaining, 97);
	assert_int_equal(memstore_size(m), 3);
	memstore_free(m);
}

/*
 * Key layout 2 (limit_key()): "<principal key>|<flags>#<field>". The flags (a shadow,
 * Redis's layout 1 read or not) are not part of the state's name: a reload that turns a
 * shadow limit into an enforcing one, or the fallback off, keeps the local counts; two
 * fields of one principal are two states.
 */
static void test_memstore_layout2_flags_are_not_the_name(void **state)
{
	struct memstore *m = memstore_new(16);
	struct limit_params p;
	struct limit_verdict v;

	(void)state;
	limit_params_init(&p, ALG_FIXED_WINDOW, 5, 86400000, 0);
	assert_true(decide1(m, "rl:v2:{k:1}|3#day", &p, 2, T0, &v));       /* shadow, fallback */
	assert_true(decide1(m, "rl:v2:{k:1}|0#day", &p, 2, T0, &v));       /* enforcing, none */
	assert_int_equal(v.remaining, 1);
	assert_true(decide1(m, "rl:v2:{k:1}|2#day", &p, 1, T0, &v));
	assert_int_equal(v.remaining, 0);
	assert_false(decide1(m, "rl:v2:{k:1}|0#day", &p, 1, T0, NULL));
	assert_int_equal(memstore_size(m), 1);
	/* another field, another principal: their own states */
	assert_true(decide1(m, "rl:v2:{k:1}|0#hour", &p, 5, T0, &v));
	assert_true(decide1(m, "rl:v2:{k:2}|0#day", &p, 5, T0, &v));
	/* layout 1 keys are names as they are */
	assert_true(decide1(m, "rl:{k:1}:day", &p, 5, T0, &v));
	assert_int_equal(memstore_size(m), 4);
	assert_true(memstore_check(m));
	memstore_free(m);
}

/*
 * memstore_forget_idle() frees the entries no decision used since a time,
 * live or not, and keeps the others with their state: a decision that only
 * reads an entry (a denial) counts as a use. Many keys, so that deletions
 * shift clusters (every entry is checked, none twice freed: memstore_check()).
 */
static void test_memstore_forget_idle(void **state)
{
	struct memstore *m = memstore_new(4096);
	struct limit_params daily;
	struct store_query q;
	struct store_result res;
	char key[64];
	int i;

	(void)state;
	limit_params_init(&daily, ALG_FIXED_WINDOW, 1, 86400000, 0);
	for (i = 0; i < 3000; i++) {
		snprintf(key, sizeof(key), "rl:{k%d}:daily", i);
		query_reset(&q);
		query_add(&q, key, &daily, 1);
		memstore_decide(m, &q, T0 + (i % 2) * 1000000, &res);
		assert_true(res.allowed);
	}
	assert_int_equal(memstore_size(m), 3000);
	/* key 0 (used at T0) denied at T0 + 2 s: used then, kept with its count */
	query_reset(&q);
	query_add(&q, "rl:{k0}:daily", &daily, 1);
	memstore_decide(m, &q, T0 + 2000000, &res);
	assert_false(res.allowed);
	/* nothing unused since before T0 */
	assert_int_equal(memstore_forget_idle(m, T0), 0);
	/* the 1,500 even keys, used at T0, but key 0 */
	assert_int_equal(memstore_forget_idle(m, T0 + 1000000), 1499);
	assert_true(memstore_check(m));
	assert_int_equal(memstore_size(m), 1501);
	memstore_decide(m, &q, T0 + 3000000, &res);
	assert_false(res.allowed); /* still counted: its day is not over */
	query_reset(&q);
	query_add(&q, "rl:{k2}:daily", &daily, 1);
	memstore_decide(m, &q, T0 + 3000000, &res);
	assert_true(res.allowed); /* forgotten: a full limit again */
	query_reset(&q);
	query_add(&q, "rl:{k1}:daily", &daily, 1);
	memstore_decide(m, &q, T0 + 3000000, &res);
	assert_false(res.allowed); /* odd keys, used at T0 + 1 s, kept */
	assert_int_equal(memstore_forget_idle(m, T0 + 10000000), memstore_size(m));
	assert_int_equal(memstore_size(m), 0);
	assert_true(memstore_check(m));
	memstore_free(m);
}

static void test_memstore_uncharged_keys_not_created(void **state)
{
	struct memstore *m = memstore_new(16);
	struct limit_params p[ALG_COUNT];
	struct limit_verdict v;
	int64_t now = T0;
	int alg;

	(void)state;
	memset(p, 0, sizeof(p));
	for (alg = ALG_GCRA; alg < ALG_COUNT; alg++) {
		char key[32];

		limit_params_init(&p[alg], alg, 3, 1000, 0);
		snprintf(key, sizeof(key), "k%d", alg);
		/* more than the limit: denied (a concurrency limit's cost is a slot: a
		 * fresh key has them all) */
		if (alg != ALG_CONCURRENCY)
			assert_false(decide1(m, key, &p[alg], 4, now, &v));
		/* reports and refunds on a fresh key leave a zero state: nothing kept */
		assert_true(decide1(m, key, &p[alg], 0, now, &v));
		assert_int_equal(v.remaining, 3);
		assert_true(decide1(m, key, &p[alg], -2, now, &v));
		assert_int_equal(memstore_size(m), 0);
	}
	/* an unknown algorithm admits and is charged: kept until its 1 ms expiry */
	p[0].alg = ALG_NONE;
	assert_true(decide1(m, "none", &p[0], 1, now, &v));
	assert_int_equal(memstore_size(m), 1);
	assert_int_equal(memstore_sweep(m, now + MS, SIZE_MAX), 1);
	assert_int_equal(memstore_size(m), 0);
	memstore_free(m);
}

/*
 * A concurrency limit in the memory store: slots taken, refused past the
 * limit, given back, taken again; the entry lives until its last lease ends
 * (not until its reset, 0 while a slot is free), then goes.
 */
static void test_memstore_concurrency_slots(void **state)
{
	struct memstore *m = memstore_new(16);
	struct limit_params p;
	struct limit_verdict v;
	int64_t now = T0;

	(void)state;
	limit_params_init(&p, ALG_CONCURRENCY, 3, 2000, 0); /* 3 slots, leases of 2 s */
	assert_true(decide1(m, "c", &p, 101, now, &v));
	assert_int_equal(v.remaining, 2);
	assert_int_equal(v.reset_ms, 0);
	assert_true(decide1(m, "c", &p, 102, now + MS, &v));
	assert_true(decide1(m, "c", &p, 103, now + 2 * MS, &v));
	assert_int_equal(v.remaining, 0);
	assert_false(decide1(m, "c", &p, 104, now + 3 * MS, &v));
	assert_int_equal(v.retry_ms, 1000); /* the oldest lease ends in 2 s: said 1 s at most */
	/* the same slot again (the agent never does): a new one, refused; given back,
	 * its reply says nothing */
	assert_false(decide1(m, "c", &p, 102, now + 4 * MS, &v));
	/* given back, taken by another */
	assert_true(decide1(m, "c", &p, -101, now + 5 * MS, &v));
	assert_int_equal(v.remaining, 0);
	assert_true(decide1(m, "c", &p, 0, now + 5 * MS, &v));
	assert_int_equal(v.remaining, 1);
	assert_true(decide1(m, "c", &p, 104, now + 6 * MS, &v));
	assert_false(decide1(m, "c", &p, 105, now + 7 * MS, &v));
	/* kept a second later although its reset was 0 when a slot was free */
	assert_int_equal(memstore_sweep(m, now + 1000 * MS, SIZE_MAX), 0);
	assert_int_equal(memstore_size(m), 1);
	/* the leases end 2 s after they were taken: every slot free again */
	assert_true(decide1(m, "c", &p, 106, now + 2005 * MS, &v));
	assert_int_equal(v.remaining, 1); /* 104 (taken at +6 ms) still held */
	assert_true(decide1(m, "c", &p, 107, now + 2005 * MS, &v));
	assert_int_equal(v.remaining, 0); /* 104, 106, 107 */
	assert_true(decide1(m, "c", &p, 0, now + 2006 * MS, &v));
	assert_int_equal(v.remaining, 1); /* 104's lease ended at +2006 ms */
	/* the entry goes once its last lease has ended (+4005 ms) */
	assert_int_equal(memstore_sweep(m, now + 4004 * MS, SIZE_MAX), 0);
	assert_int_equal(memstore_sweep(m, now + 4005 * MS, SIZE_MAX), 1);
	assert_int_equal(memstore_size(m), 0);
	assert_true(memstore_check(m));
	memstore_free(m);
}

static void test_memstore_entries_expire(void **state)
{
	struct memstore *m = memstore_new(1000);
	struct limit_params p;
	struct limit_verdict v;
	int64_t now = T0;
	char key[32];
	int i;

	(void)state;
	limit_params_init(&p, ALG_GCRA, 10, 1000, 0); /* 10/s: one token refills in 100 ms */
	for (i = 0; i < 500; i++) {
		snprintf(key, sizeof(key), "ip:%d", i);
		assert_true(decide1(m, key, &p, 1, now, &v));
		assert_int_equal(v.reset_ms, 100);
	}
	assert_int_equal(memstore_size(m), 500);
	/* not yet: the sweep keeps every entry */
	assert_int_equal(memstore_sweep(m, now + 99 * MS, SIZE_MAX), 0);
	assert_int_equal(memstore_size(m), 500);

	/* the lookup of an expired key reclaims it (then a report does not recreate it) */
	now += 100 * MS;
	assert_true(decide1(m, "ip:0", &p, 0, now, &v));
	assert_int_equal(v.remaining, 10);
	assert_int_equal(memstore_size(m) < 500, true);

	/* the per-decision sweep alone empties the table, a few entries each time */
	for (i = 0; i < 4096 && memstore_size(m) > 0; i++) {
		size_t before = memstore_size(m);

		assert_true(decide1(m, "other", &p, 0, now, &v));
		assert_true(before - memstore_size(m) <= 8);
	}
	assert_int_equal(memstore_size(m), 0);
	assert_int_equal(memstore_expired(m), 500);
	assert_int_equal(memstore_evictions(m), 0);

	/* each algorithm's entry lives exactly as long as its reset time */
	limit_params_init(&p, ALG_FIXED_WINDOW, 5, 1000, 0);
	now = 2000 * SEC + 250 * MS;
	assert_true(decide1(m, "fw", &p, 1, now, &v));
	assert_int_equal(v.reset_ms, 750);
	limit_params_init(&p, ALG_SLIDING_WINDOW, 5, 1000, 0);
	assert_true(decide1(m, "sw", &p, 1, now, &v));
	assert_int_equal(v.reset_ms, 1750);
	limit_params_init(&p, ALG_SLIDING_LOG, 5, 1000, 0);
	assert_true(decide1(m, "sl", &p, 1, now, &v));
	assert_int_equal(v.reset_ms, 1000);
	assert_int_equal(memstore_sweep(m, now + 750 * MS - 1, SIZE_MAX), 0);
	assert_int_equal(memstore_sweep(m, now + 750 * MS, SIZE_MAX), 1);
	assert_int_equal(memstore_sweep(m, now + 1000 * MS - 1, SIZE_MAX), 0);
	assert_int_equal(memstore_sweep(m, now + 1000 * MS, SIZE_MAX), 1);
	assert_int_equal(memstore_sweep(m, now + 1750 * MS - 1, SIZE_MAX), 0);
	assert_int_equal(memstore_sweep(m, now + 1750 * MS, SIZE_MAX), 1);
	assert_int_equal(memstore_size(m), 0);

	/* an uncharged evaluation keeps the expiry; a charge moves it */
	limit_params_init(&p, ALG_GCRA, 10, 1000, 0);
	now = 3000 * SEC;
	assert_true(decide1(m, "g", &p, 10, now, &v)); /* empty: full in 1 s */
	assert_false(decide1(m, "g", &p, 1, now + 50 * MS, &v));
	assert_int_equal(memstore_sweep(m, now + 400 * MS, SIZE_MAX), 0);
	assert_true(decide1(m, "g", &p, -10, now + 500 * MS, &v)); /* refund: full now */
	assert_int_equal(memstore_sweep(m, now + 501 * MS, SIZE_MAX), 1);
	memstore_free(m);
}

static void test_memstore_bounded_with_evictions(void **state)
{
	struct memstore *m = memstore_new(100);
	struct limit_params p;
	int64_t now = T0;
	char key[32];
	int i;

	(void)state;
	assert_int_equal(memstore_capacity(m), 100);
	limit_params_init(&p, ALG_GCRA, 1, 3600000, 0); /* 1/h: nothing expires here */
	for (i = 0; i < 1000; i++) {
		snprintf(key, sizeof(key), "ip:%d", i);
		assert_true(decide1(m, key, &p, 1, now + i, NULL));
		assert_true(memstore_size(m) <= 100);
	}
	assert_int_equal(memstore_size(m), 100);
	assert_int_equal(memstore_evictions(m), 900);
	assert_int_equal(memstore_expired(m), 0);
	/* the entries closest to expiry went: the last 100 keys are still charged */
	for (i = 900; i < 1000; i++) {
		snprintf(key, sizeof(key), "ip:%d", i);
		assert_false(decide1(m, key, &p, 1, now + 1000, NULL));
	}
	assert_true(decide1(m, "ip:899", &p, 1, now + 1000, NULL));
	assert_int_equal(memstore_evictions(m), 901);
	memstore_free(m);

	/* expired entries make room before anything live is evicted */
	m = memstore_new(100);
	for (i = 0; i < 100; i++) {
		snprintf(key, sizeof(key), "old:%d", i);
		limit_params_init(&p, ALG_GCRA, 10, 1000, 0);
		assert_true(decide1(m, key, &p, 1, now, NULL)); /* expires after 100 ms */
	}
	now += SEC;
	for (i = 0; i < 100; i++) {
		snprintf(key, sizeof(key), "new:%d", i);
		assert_true(decide1(m, key, &p, 1, now, NULL));
	}
	assert_int_equal(memstore_size(m), 100);
	assert_int_equal(memstore_evictions(m), 0);
	assert_int_equal(memstore_expired(m), 100);

	/* max_keys 0 is clamped to 1 */
	memstore_free(m);
	m = memstore_new(0);
	assert_int_equal(memstore_capacity(m), 1);
	memstore_free(m);
}

static void test_memstore_eviction_spares_keys_in_use(void **state)
{
	struct memstore *m = memstore_new(2);
	struct limit_params slow, fast;
	struct limit_verdict v;
	struct store_query q;
	struct store_result res;
	int64_t now = T0;
	int i;

	(void)state;
	limit_params_init(&slow, ALG_GCRA, 2, 3600000, 0); /* 2/h */
	limit_params_init(&fast, ALG_GCRA, 1000, 1000, 0); /* a token back every ms */
	assert_true(decide1(m, "a", &fast, 100, now, NULL)); /* expires in 100 ms */
	assert_true(decide1(m, "c", &slow, 1, now, NULL));   /* expires in 30 min */
	/* "a" is the nearest to expiry, but it is in use: "c" goes */
	query_reset(&q);
	query_add(&q, "a", &fast, 0);
	query_add(&q, "b", &slow, 1);
	memstore_decide(m, &q, now + 1, &res);
	assert_true(res.allowed);
	assert_int_equal(res.v[0].remaining, 900);
	assert_int_equal(memstore_size(m), 2);
	assert_int_equal(memstore_evictions(m), 1);
	assert_true(decide1(m, "a", &fast, 0, now + 2, &v));
	assert_int_equal(v.remaining, 900); /* "a" kept its charge */
	assert_false(decide1(m, "b", &slow, 2, now + 3, NULL)); /* "b" was kept */
	assert_true(decide1(m, "c", &slow, 2, now + 3, NULL));  /* "c" was forgotten */
	memstore_free(m);

	/* a query whose every other key is nearer to expiry: the walk passes them all */
	m = memstore_new(STORE_MAX_LIMITS);
	assert_true(decide1(m, "far", &slow, 1, now, NULL));
	query_reset(&q);
	for (i = 0; i < STORE_MAX_LIMITS - 1; i++) {
		char key[16];

		snprintf(key, sizeof(key), "near:%d", i);
		assert_true(decide1(m, key, &fast, 10, now, NULL)); /* expires in 10 ms */
		query_add(&q, key, &fast, 0);
	}
	query_add(&q, "new", &slow, 1);
	memstore_decide(m, &q, now + 1, &res);
	assert_true(res.allowed);
	assert_int_equal(memstore_evictions(m), 1);
	for (i = 0; i < STORE_MAX_LIMITS - 1; i++) {
		assert_true(decide1(m, q.keys[i], &fast, 0, now + 2, &v));
		assert_int_equal(v.remaining, 990);
	}
	assert_true(decide1(m, "far", &slow, 2, now + 3, NULL)); /* forgotten */
	memstore_free(m);

	/* more new keys in one query than the table holds: still decided */
	m = memstore_new(1);
	query_reset(&q);
	query_add(&q, "x", &slow, 1);
	query_add(&q, "y", &slow, 1);
	query_add(&q, "z", &slow, 1);
	memstore_decide(m, &q, now, &res);
	assert_true(res.allowed);
	assert_int_equal(res.n, 3);
	assert_int_equal(memstore_size(m), 1);
	assert_int_equal(memstore_evictions(m), 2);
	assert_false(decide1(m, "z", &slow, 2, now, NULL)); /* the last one inserted stayed */
	memstore_free(m);
}

static void test_memstore_sliding_log_entries_freed(void **state)
{
	struct memstore *m = memstore_new(64);
	struct limit_params p;
	struct limit_verdict v;
	struct store_query q;
	struct store_result res;
	int64_t now = T0;
	char key[32];
	int i, j;

	(void)state;
	limit_params_init(&p, ALG_SLIDING_LOG, 1000, 1000, 0);
	/* logs that grow, are trimmed, refunded, expire, are evicted or outlive the table */
	for (i = 0; i < 200; i++) {
		snprintf(key, sizeof(key), "log:%d", i % 80);
		for (j = 0; j < 20; j++)
			assert_true(decide1(m, key, &p, 7, now + j, &v));
		assert_true(decide1(m, key, &p, -3, now + 20, &v));
		now += 10 * MS;
		if (i % 100 == 99) /* everything expires */
			now += 2 * SEC;
	}
	assert_true(memstore_evictions(m) > 0);
	assert_true(memstore_expired(m) > 0);

	/* the same log twice in one query: two copies, one kept, none leaked */
	query_reset(&q);
	query_add(&q, "dup", &p, 5);
	query_add(&q, "dup", &p, 5);
	query_add(&q, "log:1", &p, 1);
	query_add(&q, "dup", &p, 0);
	for (i = 0; i < 30; i++)
		memstore_decide(m, &q, now + i, &res);
	/* denied: no copy is kept */
	q.cost[2] = 5000;
	memstore_decide(m, &q, now + 30, &res);
	assert_false(res.allowed);
	memstore_free(m);
}

static void test_memstore_duplicate_keys(void **state)
{
	struct memstore *m = memstore_new(8);
	struct limit_params p;
	struct limit_state st = {0}, cp;
	struct limit_verdict v[2];
	struct store_query q;
	struct store_result res;
	int64_t now = T0;

	(void)state;
	limit_params_init(&p, ALG_GCRA, 10, 1000, 0);
	/* both occurrences are checked against the stored state, the last charge is kept */
	query_reset(&q);
	query_add(&q, "same", &p, 3);
	query_add(&q, "same", &p, 2);
	memstore_decide(m, &q, now, &res);
	assert_true(res.allowed);
	assert_int_equal(res.v[0].remaining, 7);
	assert_int_equal(res.v[1].remaining, 8);
	assert_int_equal(memstore_size(m), 1);
	/* what the plain model says for "same" charged 2 */
	limit_decide(&p, &st, 1, &q.cost[1], now, v);
	cp = st;
	limit_decide(&p, &cp, 1, (const int64_t[]){0}, now, v);
	assert_true(decide1(m, "same", &p, 0, now, &res.v[0]));
	assert_verdicts_equal(&res.v[0], v, 1);
	assert_int_equal(res.v[0].remaining, 8);
	/* an uncharged later occurrence does not undo an earlier charge */
	query_reset(&q);
	query_add(&q, "same", &p, 1);
	query_add(&q, "same", &p, 9);
	q.params[1].shadow = true; /* would deny, does not */
	memstore_decide(m, &q, now, &res);
	assert_true(res.allowed);
	assert_false(res.v[1].allowed);
	assert_true(decide1(m, "same", &p, 0, now, &v[0]));
	assert_int_equal(v[0].remaining, 7);
	memstore_free(m);
}

static void test_memstore_keys_compared_by_bytes(void **state)
{
	struct memstore *m = memstore_new(8);
	struct limit_params p;
	struct store_query q;
	struct store_result res;
	int64_t now = T0;

	(void)state;
	limit_params_init(&p, ALG_FIXED_WINDOW, 1, 60000, 0);
	/* a key that fills STORE_KEY_MAX without a NUL, and its prefix */
	query_reset(&q);
	q.n = 1;
	memset(q.keys[0], 'k', STORE_KEY_MAX);
	q.params[0] = p;
	q.cost[0] = 1;
	memstore_decide(m, &q, now, &res);
	assert_true(res.allowed);
	memstore_decide(m, &q, now, &res);
	assert_false(res.allowed);
	q.keys[0][STORE_KEY_MAX - 1] = 0;
	memstore_decide(m, &q, now, &res);
	assert_true(res.allowed);
	/* the empty key is a key, and one byte apart is another */
	assert_true(decide1(m, "", &p, 1, now, NULL));
	assert_false(decide1(m, "", &p, 1, now, NULL));
	assert_true(decide1(m, "\x01", &p, 1, now, NULL));
	assert_true(decide1(m, "\xff", &p, 1, now, NULL));
	assert_int_equal(memstore_size(m), 5);
	memstore_free(m);
	memstore_free(NULL);
}

static void test_memstore_random_keys_100k(void **state)
{
	struct memstore *m = memstore_new(4096);
	struct limit_params p[ALG_COUNT - 1];           /* every algorithm, by id - 1 */
	uint64_t seed = 42;
	int64_t now = T0;
	int i, alg;

	(void)state;
	for (alg = ALG_GCRA; alg < ALG_COUNT; alg++)
		limit_params_init(&p[alg - 1], alg, 1 + (uint64_t)alg, 1000 * (uint64_t)alg, 0);
	for (i = 0; i < 100000; i++) {
		struct store_query q;
		struct store_result res;
		size_t n = 1 + rnd_below(&seed, 4), k, len, c;

		query_reset(&q);
		q.n = n;
		for (k = 0; k < n; k++) {
			len = rnd_below(&seed, STORE_KEY_MAX); /* 0..191 bytes, then the NUL */
			for (c = 0; c < len; c++)
				q.keys[k][c] = (char)(1 + rnd_below(&seed, 255));
			q.params[k] = p[rnd_below(&seed, ALG_COUNT - 1)];
			q.cost[k] = random_cost(&seed);
		}
		now += (int64_t)rnd_below(&seed, 200);
		memstore_decide(m, &q, now, &res);
		assert_int_equal(res.n, n);
		assert_true(memstore_size(m) <= 4096);
		if (i % 1000 == 0)
			assert_true(memstore_check(m));
	}
	assert_true(memstore_check(m));
	assert_int_equal(memstore_size(m), 4096);
	assert_true(memstore_evictions(m) > 0);
	memstore_free(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_memstore_gcra_matches_model),
		cmocka_unit_test(test_memstore_fixed_window_matches_model),
		cmocka_unit_test(test_memstore_sliding_log_matches_model),
		cmocka_unit_test(test_memstore_sliding_window_matches_model),
		cmocka_unit_test(test_memstore_mixed_algorithms_match_model),
		cmocka_unit_test(test_memstore_denial_charges_nothing),
		cmocka_unit_test(test_memstore_uncharged_keys_not_created),
		cmocka_unit_test(test_memstore_concurrency_slots),
		cmocka_unit_test(test_memstore_entries_expire),
		cmocka_unit_test(test_memstore_bounded_with_evictions),
		cmocka_unit_test(test_memstore_eviction_spares_keys_in_use),
		cmocka_unit_test(test_memstore_sliding_log_entries_freed),
		cmocka_unit_test(test_memstore_duplicate_keys),
		cmocka_unit_test(test_memstore_keys_compared_by_bytes),
		cmocka_unit_test(test_memstore_random_keys_100k),
		cmocka_unit_test(test_memstore_forget_idle),
		cmocka_unit_test(test_memstore_layout2_flags_are_not_the_name),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
