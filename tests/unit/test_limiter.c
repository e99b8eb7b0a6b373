/* SPDX-License-Identifier: MIT */
/* Unit tests of the GCRA model, the SHA-256 digest and duration parsing. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

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
	limit_params_init(&p, ALG_GCRA, 100, 1000, 0);
	assert_int_equal(p.a, 10000);
	assert_int_equal(p.b, 100 * 10000);
	limit_params_init(&p, ALG_GCRA, 1000000, 86400000, 0);
	assert_int_equal(p.a, 86400);
	limit_params_init(&p, ALG_GCRA, 3, 1000, 10);
	assert_int_equal(p.a, 333333);
	assert_int_equal(p.b, 3333330);
	/* faster than one token per microsecond: clamped, never zero */
	limit_params_init(&p, ALG_GCRA, 5000000, 1000, 0);
	assert_int_equal(p.a, 1);
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
		cmocka_unit_test(test_limiter_burst_then_deny),
		cmocka_unit_test(test_limiter_denial_charges_nothing),
		cmocka_unit_test(test_limiter_cost),
		cmocka_unit_test(test_limiter_idle_bucket_refills_fully),
		cmocka_unit_test(test_digest_sha256_vectors),
		cmocka_unit_test(test_util_parse_duration),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
