/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the override entry parser (everything an agent reads from
 * Redis goes through it): targets and their canonical form, values accepted
 * and refused with the reason, and the rates a limit override gives.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "digest.h"
#include "overrides.h"

/* <in> parsed as a target and printed back. */
static const char *canon(const char *in)
{
	static char out[OVR_FIELD_MAX];
	struct ovr_target t;
	char err[160];

	if (ovr_target_parse(in, strlen(in), &t, err, sizeof(err)) < 0)
		return err[0] ? "ERR" : "ERR(no message)";
	ovr_target_format(&t, out, sizeof(out));
	return out;
}

static void test_target_forms(void **state)
{
	(void)state;
	assert_string_equal(canon("k:1A2b3C4d"), "k:1a2b3c4d");
	assert_string_equal(canon("k:0123456789abcdef0123456789abcdef"),
			    "k:0123456789abcdef0123456789abcdef");
	assert_string_equal(canon("k:123456789"), "k:123456789");
	assert_string_equal(canon("fp:0123456789ABCDEF"), "fp:0123456789abcdef");
	assert_string_equal(canon("ip:10.1.2.3"), "ip:10.1.2.3/32");
	assert_string_equal(canon("ip:10.1.2.3/8"), "ip:10.0.0.0/8");
	assert_string_equal(canon("ip:0.0.0.0/0"), "ip:0.0.0.0/0");
	assert_string_equal(canon("ip:2001:DB8::1/32"), "ip:2001:db8::/32");
	assert_string_equal(canon("ip:2001:db8:aaff::/40"), "ip:2001:db8:aa00::/40");
	assert_string_equal(canon("ip:::1"), "ip:::1/128");
	/* IPv4-mapped: the IPv4 prefix */
	assert_string_equal(canon("ip:::ffff:192.0.2.7"), "ip:192.0.2.7/32");
	assert_string_equal(canon("ip:::ffff:192.0.2.0/120"), "ip:192.0.2.0/24");
	assert_string_equal(canon("ip:::ffff:0:0/95"), "ip:::fffe:0:0/95"); /* stays IPv6 */
}

/*
 * Fingerprints: HMAC-SHA256 as Python's hmac module computes it (RFC 2104: a
 * short secret, and one longer than a block, hashed first), what is shown of a
 * whole digest, and a fingerprint naming the block on the digest it is of.
 */
static void test_fingerprints(void **state)
{
	uint8_t digest[16], fp[FP_LEN];
	char s[FP_STR_LEN + 1], shown[OVR_FIELD_MAX], err[160], longer[100];
	struct fp_key k, other;
	struct ovr_target whole, byfp, prefix;
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(digest); i++)
		digest[i] = (uint8_t)i;
	fp_key_init(&k, "unit-test-secret-0123", 21);
	fp_compute(&k, digest, fp);
	fp_format(fp, s);
	assert_string_equal(s, "fp:0eabd1748e851f07");
	memset(longer, 'x', sizeof(longer));
	fp_key_init(&other, longer, sizeof(longer));
	fp_compute(&other, digest, fp);
	fp_format(fp, s);
	assert_string_equal(s, "fp:3c95ae94aeb7e2ea");
	assert_true(k.id != other.id);
	/* a block by raw key: its whole digest, shown as its fingerprint, never itself */
	memset(&whole, 0, sizeof(whole));
	whole.type = OVR_T_KEY;
	whole.bits = 128;
	memcpy(whole.b, digest, 16);
	ovr_target_show(&whole, &k, shown, sizeof(shown));
	assert_string_equal(shown, "fp:0eabd1748e851f07");
	ovr_target_show(&whole, NULL, shown, sizeof(shown));
	assert_string_equal(shown, "key:*");
	assert_int_equal(ovr_target_parse("fp:0eabd1748e851f07", 19, &byfp, err, sizeof(err)), 0);
	assert_true(ovr_target_same_key(&whole, &byfp, &k));
	assert_true(ovr_target_same_key(&byfp, &whole, &k));
	assert_false(ovr_target_same_key(&whole, &byfp, &other));
	assert_false(ovr_target_same_key(&whole, &byfp, NULL));
	/* a shorter prefix (an earlier /top's) is shown as stored, and names no fingerprint */
	assert_int_equal(ovr_target_parse("k:00010203", 10, &prefix, err, sizeof(err)), 0);
	ovr_target_show(&prefix, &k, shown, sizeof(shown));
	assert_string_equal(shown, "k:00010203");
	assert_false(ovr_target_same_key(&prefix, &byfp, &k));
}

static void test_target_refused(void **state)
{
	static const char *const bad[] = {
		"", "k:", "k:1234567", "k:0123456789abcdef0123456789abcdef0", "k:1234567g",
		"k:12345678 ", "ip:", "ip:10.0.0.0/33", "ip:::/129", "ip:10.0.0.0/", "ip:10.0.0.0/-1",
		"ip:10.0.0.0/+8", "ip:10.0.0.0/ 8", "ip:10.0.0.0/8x", "ip:10.0.0", "ip:host.example",
		"ip:10.0.0.1 ", "x:12345678", "key:abc", "K:12345678",
		"fp:", "fp:0123456789abcde", "fp:0123456789abcdef0", "fp:0123456789abcdeg",
		"FP:0123456789abcdef",
	};
	struct ovr_target t;
	char err[160];
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = 0;
		if (ovr_target_parse(bad[i], strlen(bad[i]), &t, err, sizeof(err)) == 0)
			fail_msg("accepted '%s'", bad[i]);
		assert_true(err[0] != 0);
	}
	/* a NUL byte inside, and more than OVR_FIELD_MAX bytes */
	assert_int_equal(ovr_target_parse("k:12345678\0ab", 13, &t, err, sizeof(err)), -1);
	{
		char big[OVR_FIELD_MAX + 2];

		memset(big, '1', sizeof(big));
		memcpy(big, "k:", 2);
		assert_int_equal(ovr_target_parse(big, sizeof(big), &t, err, sizeof(err)), -1);
	}
}

/* Parses field <f> and value <v> into <e>; returns the parser's status. */
static int parse(const char *f, const char *v, struct ovr_entry *e, char *err, size_t errlen)
{
	memset(e, 0, sizeof(*e));
	err[0] = 0;
	if (ovr_field_parse(f, strlen(f), e, err, errlen) < 0)
		return -1;
	return ovr_value_parse(v, strlen(v), e, err, errlen);
}

static void test_values(void **state)
{
	struct ovr_entry e;
	char err[160], buf[256];

	(void)state;
	assert_int_equal(parse("block:k:1a2b3c4d", "until=1900000000 created=1800000000 by=alice "
			       "status=403 reason=stuffing from  many hosts  ", &e, err, sizeof(err)), 0);
	assert_int_equal(e.kind, OVR_BLOCK);
	assert_int_equal(e.until, 1900000000);
	assert_int_equal(e.created, 1800000000);
	assert_int_equal(e.status, 403);
	assert_string_equal(e.by, "alice");
	assert_string_equal(e.reason, "stuffing from  many hosts");
	ovr_field_format(&e, buf, sizeof(buf));
	assert_string_equal(buf, "block:k:1a2b3c4d");
	/* order is free, reason= takes the rest, even "until=" */
	assert_int_equal(parse("limit:ip:10.0.0.0/8", "  factor=2.5 rate.free_rpm=7 until=5 "
			       "reason=until=9", &e, err, sizeof(err)), 0);
	assert_true(e.factor == 2.5);
	assert_int_equal(e.nrates, 1);
	assert_string_equal(e.rates[0].name, "free_rpm");
	assert_int_equal(e.rates[0].rate, 7);
	assert_int_equal(e.until, 5);
	assert_string_equal(e.reason, "until=9");
	ovr_describe(&e, buf, sizeof(buf));
	assert_string_equal(buf, "limit x2.5 free_rpm=7");
}

static void test_values_refused(void **state)
{
	static const struct {
		const char *field, *value, *why;
	} bad[] = {
		{"block:k:1a2b3c4d", "", "no until"},
		{"block:k:1a2b3c4d", "by=x", "no until"},
		{"block:k:1a2b3c4d", "until=0", "bad value for 'until'"},
		{"block:k:1a2b3c4d", "until=-5", "bad value for 'until'"},
		{"block:k:1a2b3c4d", "until=12x", "bad value for 'until'"},
		{"block:k:1a2b3c4d", "until=99999999999999999999", "bad value for 'until'"},
		{"block:k:1a2b3c4d", "until=5 status=200", "bad value for 'status'"},
		{"block:k:1a2b3c4d", "until=5 factor=2", "unknown setting 'factor' for a block"},
		{"limit:k:1a2b3c4d", "until=5 status=403", "unknown setting 'status' for a limit"},
		{"limit:k:1a2b3c4d", "until=5", "needs factor"},
		{"limit:k:1a2b3c4d", "until=5 factor=0", "bad value for 'factor'"},
		{"limit:k:1a2b3c4d", "until=5 factor=1001", "bad value for 'factor'"},
		{"limit:k:1a2b3c4d", "until=5 factor=nan", "bad value for 'factor'"},
		{"limit:k:1a2b3c4d", "until=5 factor=-1", "bad value for 'factor'"},
		{"limit:k:1a2b3c4d", "until=5 rate.a=0", "bad value for 'rate.a'"},
		{"limit:k:1a2b3c4d", "until=5 rate.=3", "bad value for 'rate.'"},
		{"limit:k:1a2b3c4d", "until=5 rate.a/b=3", "bad value for 'rate.a/b'"},
		{"limit:k:1a2b3c4d", "until=5 rate.a=3 rate.a=4", "bad value for 'rate.a'"},
		{"limit:k:1a2b3c4d", "until=5 rate.a=1 rate.b=1 rate.c=1 rate.d=1 rate.e=1",
		 "more than 4 rate settings"},
		{"block:k:1a2b3c4d", "until=5 colour=red", "unknown setting 'colour'"},
		{"block:k:1a2b3c4d", "until=5 =x", "is not name=value"},
		{"block:k:1a2b3c4d", "until=5 junk", "is not name=value"},
		{"block:k:1a2b3c4d", "until=5 by=", "bad value for 'by'"},
		{"block:k:1a2b3c4d", "until=5 reason=tab\there", "not printable ASCII"},
		{"block:k:1a2b3c4d", "until=5 reason=caf\xc3\xa9", "not printable ASCII"},
		{"frob:k:1a2b3c4d", "until=5", "block:<target> or limit:<target>"},
		{"block", "until=5", "block:<target> or limit:<target>"},
		{"block:", "until=5", "a target is"},
	};
	struct ovr_entry e;
	char err[160], big[OVR_VALUE_MAX + 2];
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		if (parse(bad[i].field, bad[i].value, &e, err, sizeof(err)) == 0)
			fail_msg("accepted '%s' = '%s'", bad[i].field, bad[i].value);
		if (!strstr(err, bad[i].why))
			fail_msg("'%s' = '%s': got '%s', expected '%s'", bad[i].field, bad[i].value,
				 err, bad[i].why);
	}
	/* a reason over OVR_REASON_MAX, a value over OVR_VALUE_MAX */
	memset(big, 'x', sizeof(big));
	memcpy(big, "until=5 reason=", 15);
	big[15 + OVR_REASON_MAX + 1] = 0;
	assert_int_equal(parse("block:k:1a2b3c4d", big, &e, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "reason longer"));
	big[15 + OVR_REASON_MAX] = 0;
	assert_int_equal(parse("block:k:1a2b3c4d", big, &e, err, sizeof(err)), 0);
	memset(big, 'x', sizeof(big));
	big[sizeof(big) - 1] = 0;
	assert_int_equal(parse("block:k:1a2b3c4d", big, &e, err, sizeof(err)), -1);
	assert_non_null(strstr(err, "value longer"));
}

static void test_adjust(void **state)
{
	struct ovr_entry e;
	uint64_t r, b;
	char err[160];

	(void)state;
	assert_int_equal(parse("limit:k:1a2b3c4d", "until=5 factor=10 rate.day=500", &e, err,
			       sizeof(err)), 0);
	assert_true(ovr_adjust(&e, "rpm", 5, 8, &r, &b));
	assert_int_equal(r, 50);
	assert_int_equal(b, 80);
	/* an explicit rate wins over the factor; the burst keeps its ratio */
	assert_true(ovr_adjust(&e, "day", 1000, 2000, &r, &b));
	assert_int_equal(r, 500);
	assert_int_equal(b, 1000);
	/* lowered: never below 1 */
	assert_int_equal(parse("limit:k:1a2b3c4d", "until=5 factor=0.001", &e, err, sizeof(err)), 0);
	assert_true(ovr_adjust(&e, "rpm", 5, 5, &r, &b));
	assert_int_equal(r, 1);
	assert_int_equal(b, 1);
	/* raised: never above OVR_RATE_MAX */
	assert_int_equal(parse("limit:k:1a2b3c4d", "until=5 factor=1000", &e, err, sizeof(err)), 0);
	assert_true(ovr_adjust(&e, "big", OVR_RATE_MAX, OVR_RATE_MAX, &r, &b));
	assert_int_equal(r, OVR_RATE_MAX);
	assert_int_equal(b, OVR_RATE_MAX);
	/* only explicit rates: other limits unchanged */
	assert_int_equal(parse("limit:k:1a2b3c4d", "until=5 rate.rpm=7", &e, err, sizeof(err)), 0);
	assert_false(ovr_adjust(&e, "day", 1000, 1000, &r, &b));
	assert_int_equal(r, 1000);
	/* a block changes no limit */
	assert_int_equal(parse("block:k:1a2b3c4d", "until=5", &e, err, sizeof(err)), 0);
	assert_false(ovr_adjust(&e, "rpm", 5, 5, &r, &b));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_target_forms),
		cmocka_unit_test(test_target_refused),
		cmocka_unit_test(test_fingerprints),
		cmocka_unit_test(test_values),
		cmocka_unit_test(test_values_refused),
		cmocka_unit_test(test_adjust),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
