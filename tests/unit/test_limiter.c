/* SPDX-License-Identifier: MIT */
/* Unit tests of the limiter models, the SHA-256 digest and duration parsing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "digest.h"
#include "limiter.h"
#include "util.h"

#define SEC 1000000LL
#define C(x) ((const int64_t[]){(x)})
#define C2(x) ((const int64_t[]){(x), (x)})

static void test_limiter_params_from_rate(void **state)
{
	struct limit_params p;

	(void)state;
	/* a = T in ticks of 2^-k us, b = burst x a + k (limiter.h) */
	assert_int_equal(limit_params_init(&p, ALG_GCRA, 100, 1000, 0), 0);
	assert_int_equal(p.b % p.a, 30); /* 100 x 10000 us x 2^30 <= 2^50 < 2 x that */
	assert_int_equal(p.a, 10000LL << 30);
	assert_int_equal(p.b / p.a, 100); /* the burst, as quota.c reads it */
	limit_params_init(&p, ALG_GCRA, 3, 1000, 10);
	assert_int_equal(p.b / p.a, 10);
	assert_true(p.a > (1LL << 49) / 10 - 1 && p.a * 10 <= (1LL << 50));
	/* faster than one token per microsecond: a fraction, never zero */
	limit_params_init(&p, ALG_GCRA, 5000000, 1000, 0);
	assert_int_equal(p.b / p.a, 5000000);
	assert_int_equal(p.a, ((1LL << (p.b % p.a)) + 2) / 5); /* round(0.2 us x 2^k) */
	/* the slowest rate with the largest burst a config takes: k = 1, half us */
	assert_int_equal(limit_params_check(ALG_GCRA, 1, 366ULL * 86400000, 17), 0);
	assert_int_equal(limit_params_check(ALG_GCRA, 1, 366ULL * 86400000, 18), -1);
	assert_int_equal(limit_params_check(ALG_GCRA, 1, 366ULL * 86400000, 1000000000), -1);
	assert_int_equal(limit_params_check(ALG_FIXED_WINDOW, 1, 366ULL * 86400000, 0), 0);
	assert_int_equal(limit_params_init(&p, ALG_GCRA, 1, 366ULL * 86400000, 17), 0);
	assert_int_equal(p.b % p.a, 1);
	assert_int_equal(p.a, 2 * 366LL * 86400000000LL);
	assert_int_equal(p.b, 17 * 2 * 366LL * 86400000000LL + 1);
	/* what cannot be represented is reduced to fit, and said so */
	assert_int_equal(limit_params_init(&p, ALG_GCRA, 1, 366ULL * 86400000, 1000000000), -1);
	assert_true(p.b - p.b % p.a <= (1LL << 50) && p.b / p.a == (1LL << 50) / p.a);
}

/*
 * Simulates a client that takes every token as soon as it is there, over
 * <span_us> from a full bucket, and returns the tokens admitted (which must
 * be burst + rate x span within 0.01%). Each step asks what is left (cost 0),
 * takes exactly that, and checks that one more is denied.
 */
static int64_t drain_over(uint64_t rate, uint64_t period_ms, uint64_t burst, int64_t span_us,
			  int64_t t0)
{
	struct limit_params p;
	struct limit_verdict v;
	struct limit_state st = {0};
	int64_t tau_us = (int64_t)((burst ? burst : rate) * period_ms * 1000 / rate);
	int64_t steps = span_us / (tau_us / 4 + 1) + 1000, i, got = 0;

	assert_int_equal(limit_params_init(&p, ALG_GCRA, rate, period_ms, burst), 0);
	for (i = 0; i <= steps; i++) {
		int64_t now = t0 + (int64_t)((__int128)span_us * i / steps);

		assert_true(limit_decide(&p, &st, 1, C(0), now, &v));
		if (v.remaining > 0) {
			int64_t r = v.remaining;

			assert_true(limit_decide(&p, &st, 1, C(r), now, &v));
			got += r;
		}
		assert_false(limit_decide(&p, &st, 1, C(1), now, &v));
	}
	return got;
}

static void test_limiter_gcra_rate_precision(void **state)
{
	static const struct {
		uint64_t rate, period_ms, burst;
		int64_t span_us;
	} c[] = {
		{1, 1000, 1000, 2000000 * SEC},
		{7, 1000, 1000, 300000 * SEC},
		{700000, 1000, 0, 3 * SEC},
		{1000000, 1000, 0, 2 * SEC},
		{9999999, 1000, 0, SEC / 5},
		{10000000, 1000, 0, SEC / 5},
		{10000, 1, 0, SEC / 5},                 /* 10,000,000/s as 10,000/ms */
		{7, 60000, 1000, 17000000 * SEC},       /* 7/min */
		{1000000, 86400000, 0, 172800 * SEC},   /* 1,000,000/day */
		{333, 3600000, 0, 20000000 * SEC},      /* 333/h: T = 10810.81 ms */
		{1, 366ULL * 86400000, 17, 60 * 366LL * 86400 * SEC}, /* 1/366d, max burst */
	};
	int64_t t0 = 1764700000LL * SEC; /* a Redis time of 2025 */
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		uint64_t burst = c[i].burst ? c[i].burst : c[i].rate;
		long double want = (long double)burst + (long double)c[i].rate * c[i].span_us /
								  ((long double)c[i].period_ms * 1000);
		int64_t got = drain_over(c[i].rate, c[i].period_ms, c[i].burst, c[i].span_us, t0);
		long double err = (got - want) < 0 ? want - got : got - want;

		print_message("%llu per %llu ms: %lld admitted, expected %.1Lf\n",
			      (unsigned long long)c[i].rate, (unsigned long long)c[i].period_ms,
			      (long long)got, want);
		assert_true(err <= 1 + want * 1e-4L);
	}
}

/* Costs, states and parameters at their extremes: no overflow (UBSan), sane answers. */
static void test_limiter_extremes(void **state)
{
	static const int64_t costs[] = {INT64_MAX, INT64_MIN, INT64_MAX / 3, (1LL << 53) + 1,
					-(1LL << 53), 1000000000000LL, -1, 0, 1};
	struct limit_params p[4];
	struct limit_verdict v[4];
	struct limit_state st[4] = {{0}};
	int64_t now = 1764700000LL * SEC, cost[4];
	size_t i, j;

	(void)state;
	/* 1 per 366 days with the largest burst; the window algorithms at their limits */
	assert_int_equal(limit_params_init(&p[0], ALG_GCRA, 1, 366ULL * 86400000, 17), 0);
	limit_params_init(&p[1], ALG_FIXED_WINDOW, 1000000000, 366ULL * 86400000, 0);
	limit_params_init(&p[2], ALG_SLIDING_WINDOW, 1000000000, 366ULL * 86400000, 0);
	limit_params_init(&p[3], ALG_GCRA, 1000000000, 1, 1000000000); /* 10^12/s */
	for (i = 0; i < sizeof(costs) / sizeof(costs[0]); i++) {
		for (j = 0; j < 4; j++)
			cost[j] = costs[i];
		limit_decide(p, st, 4, cost, now, v);
		for (j = 0; j < 4; j++) {
			assert_true(v[j].remaining >= 0 && v[j].retry_ms >= 0 && v[j].reset_ms >= 0);
			/* a refund or a report is always allowed; a charge beyond the bucket never */
			assert_true(costs[i] > 1000000000LL || v[j].allowed ||
				    (j == 0 && costs[i] > 0));
		}
		assert_true(costs[i] <= 17 || !v[0].allowed);
		now += 1000;
	}
	/* a state from elsewhere (another rate, a corrupt key): clamped, not overflowed */
	st[0].x = INT64_MAX;
	st[0].y = INT64_MAX;
	assert_false(limit_decide(&p[0], &st[0], 1, C(1), now, &v[0]));
	assert_int_equal(v[0].remaining, 0);
	assert_true(limit_decide(&p[0], &st[0], 1, C(INT64_MIN), now, &v[0])); /* refunded: full */
	assert_int_equal(v[0].remaining, 17);
	/* a debt is capped at 2^51 ticks (of 2^-1 us here): two buckets, at least */
	st[0].x = now + (1LL << 60);
	assert_false(limit_decide(&p[0], &st[0], 1, C(0), now, &v[0]));
	assert_int_equal(v[0].reset_ms, ((1LL << 50) + 999) / 1000);
	for (j = 0; j < 4; j++)
		limit_state_release(&st[j]);
}

/* Parameters of earlier versions (a = T, b = tau in whole us) still mean the same. */
static void test_limiter_gcra_old_params(void **state)
{
	struct limit_params p = {.alg = ALG_GCRA, .a = 12000000, .b = 5 * 12000000LL};
	struct limit_verdict v;
	struct limit_state st = {0};
	int64_t now = 1000 * SEC;
	int i;

	(void)state;
	for (i = 0; i < 5; i++)
		assert_true(limit_decide(&p, &st, 1, C(1), now, &v));
	assert_false(limit_decide(&p, &st, 1, C(1), now, &v));
	assert_int_equal(v.retry_ms, 12000);
	assert_int_equal(st.x, now + 60 * SEC); /* the TAT alone, no fraction */
	assert_int_equal(st.y, 0);
}

static void test_limiter_burst_then_deny(void **state)
{
	struct limit_params p;
	struct limit_verdict v;
	struct limit_state tat = {0}; int64_t now = 1000 * SEC;
	int i;

	(void)state;
	limit_params_init(&p, ALG_GCRA, 5, 60000, 0); /* 5 per minute */
	for (i = 0; i < 5; i++) {
		assert_true(limit_decide(&p, &tat, 1, C(1), now, &v));
		assert_int_equal(v.remaining, 4 - i);
		assert_int_equal(v.retry_ms, 0);
	}
	assert_false(limit_decide(&p, &tat, 1, C(1), now, &v));
	assert_int_equal(v.remaining, 0);
	assert_int_equal(v.retry_ms, 12000); /* one token every 12 s */
	assert_int_equal(v.reset_ms, 60000);
	/* 12 s later exactly one more passes */
	now += 12 * SEC;
	assert_true(limit_decide(&p, &tat, 1, C(1), now, &v));
	assert_false(limit_decide(&p, &tat, 1, C(1), now, &v));
}

static void test_limiter_denial_charges_nothing(void **state)
{
	struct limit_params p[2];
	struct limit_verdict v[2];
	struct limit_state tat[2] = {{0}}, saved[2]; int64_t now = 5 * SEC;
	int i;

	(void)state;
	limit_params_init(&p[0], ALG_GCRA, 2, 1000, 0);     /* 2/s */
	limit_params_init(&p[1], ALG_GCRA, 100, 86400000, 0); /* 100/day */
	assert_true(limit_decide(p, tat, 2, C2(1), now, v));
	assert_true(limit_decide(p, tat, 2, C2(1), now, v));
	memcpy(saved, tat, sizeof(tat));
	for (i = 0; i < 10; i++) {
		assert_false(limit_decide(p, tat, 2, C2(1), now, v));
		assert_false(v[0].allowed);
		assert_true(v[1].allowed);
		assert_int_equal(v[1].remaining, 98); /* the daily limit was not charged */
	}
	assert_memory_equal(tat, saved, sizeof(tat));
}

static void test_limiter_cost(void **state)
{
	struct limit_params p;
	struct limit_verdict v;
	struct limit_state tat = {0}; int64_t now = SEC;

	(void)state;
	limit_params_init(&p, ALG_GCRA, 100, 1000, 0);
	assert_true(limit_decide(&p, &tat, 1, C(10), now, &v));
	assert_int_equal(v.remaining, 90);
	assert_true(limit_decide(&p, &tat, 1, C(90), now, &v));
	assert_int_equal(v.remaining, 0);
	assert_false(limit_decide(&p, &tat, 1, C(10), now, &v));
	assert_int_equal(v.retry_ms, 100);
	/* cost 0 reports without charging */
	assert_false(limit_decide(&p, &tat, 1, C(1), now, &v));
	assert_true(limit_decide(&p, &tat, 1, C(0), now, &v));
	assert_int_equal(v.remaining, 0);
}

/* Calendar months against the C library's calendar, every day of 1600 to 2400. */
static void test_limiter_months(void **state)
{
	int64_t d;

	(void)state;
	for (d = -135140; d < 157000; d++) {
		time_t t = (time_t)d * 86400 + 43210;
		struct tm tm, first = {0};
		int64_t idx;

		gmtime_r(&t, &tm);
		idx = limit_month_index((int64_t)t * 1000000 + 123);
		assert_int_equal(idx, (int64_t)(tm.tm_year + 1900) * 12 + tm.tm_mon);
		first.tm_year = tm.tm_year;
		first.tm_mon = tm.tm_mon;
		first.tm_mday = 1;
		assert_int_equal(limit_month_start_us(idx), (int64_t)timegm(&first) * 1000000);
	}
}

/* A month's window ends at 00:00 UTC on the 1st: the last microsecond of February 2028. */
static void test_limiter_month_window(void **state)
{
	struct limit_params p;
	struct limit_verdict v;
	struct limit_state st = {0};
	int64_t mar1 = INT64_C(1835481600) * 1000000; /* 2028-03-01T00:00:00Z */

	(void)state;
	limit_params_init(&p, ALG_FIXED_MONTH, 2, 31ULL * 86400000, 0);
	assert_true(limit_decide(&p, &st, 1, C(2), mar1 - 1000001, &v));
	assert_false(limit_decide(&p, &st, 1, C(1), mar1 - 1000001, &v));
	assert_int_equal(v.retry_ms, 1001);
	assert_false(limit_decide(&p, &st, 1, C(1), mar1 - 1, &v));
	assert_true(limit_decide(&p, &st, 1, C(1), mar1, &v));
	assert_int_equal(v.remaining, 1);
	assert_int_equal(v.reset_ms, 31ULL * 86400000); /* March has 31 days */
}

static void test_limiter_idle_bucket_refills_fully(void **state)
{
	struct limit_params p;
	struct limit_verdict v;
	struct limit_state tat = {0}; int64_t now = SEC;
	int i;

	(void)state;
	limit_params_init(&p, ALG_GCRA, 10, 1000, 0);
	for (i = 0; i < 10; i++)
		assert_true(limit_decide(&p, &tat, 1, C(1), now, &v));
	now += 3600 * SEC; /* an hour later: a full bucket, not 36000 tokens */
	assert_true(limit_decide(&p, &tat, 1, C(1), now, &v));
	assert_int_equal(v.remaining, 9);
}

static void hex_of(const uint8_t *md, char *out)
{
	hex_encode(md, SHA256_LEN, out);
}

static void test_digest_sha256_vectors(void **state)
{
	uint8_t md[SHA256_LEN];
	char hex[2 * SHA256_LEN + 1];
	struct sha256 s;
	char chunk[1000];
	int i;

	(void)state;
	sha256("", 0, md);
	hex_of(md, hex);
	assert_string_equal(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
	sha256("abc", 3, md);
	hex_of(md, hex);
	assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	sha256("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 56, md);
	hex_of(md, hex);
	assert_string_equal(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
	memset(chunk, 'a', sizeof(chunk));
	sha256_init(&s);
	for (i = 0; i < 1000; i++)
		sha256_update(&s, chunk, sizeof(chunk));
	sha256_final(&s, md);
	hex_of(md, hex);
	assert_string_equal(hex, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

static void test_util_parse_duration(void **state)
{
	uint64_t ms;

	(void)state;
	assert_int_equal(parse_duration_ms("250ms", &ms), 0);
	assert_int_equal(ms, 250);
	assert_int_equal(parse_duration_ms("1s", &ms), 0);
	assert_int_equal(ms, 1000);
	assert_int_equal(parse_duration_ms("2m", &ms), 0);
	assert_int_equal(ms, 120000);
	assert_int_equal(parse_duration_ms("1h", &ms), 0);
	assert_int_equal(ms, 3600000);
	assert_int_equal(parse_duration_ms("1d", &ms), 0);
	assert_int_equal(ms, 86400000);
	assert_int_equal(parse_duration_ms("7", &ms), 0);
	assert_int_equal(ms, 7000);
	assert_int_equal(parse_duration_ms("1x", &ms), -1);
	assert_int_equal(parse_duration_ms("", &ms), -1);
	assert_int_equal(parse_duration_ms("-1s", &ms), -1);
	assert_int_equal(parse_duration_ms("s", &ms), -1);
	assert_int_equal(parse_duration_ms("99999999999999999999d", &ms), -1);
	assert_int_equal(parse_duration_ms("999999999999999999d", &ms), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_limiter_params_from_rate),
		cmocka_unit_test(test_limiter_gcra_rate_precision),
		cmocka_unit_test(test_limiter_extremes),
		cmocka_unit_test(test_limiter_gcra_old_params),
		cmocka_unit_test(test_limiter_burst_then_deny),
		cmocka_unit_test(test_limiter_denial_charges_nothing),
		cmocka_unit_test(test_limiter_cost),
		cmocka_unit_test(test_limiter_months),
		cmocka_unit_test(test_limiter_month_window),
		cmocka_unit_test(test_limiter_idle_bucket_refills_fully),
		cmocka_unit_test(test_digest_sha256_vectors),
		cmocka_unit_test(test_util_parse_duration),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
