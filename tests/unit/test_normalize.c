/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of path normalisation and endpoint matching: the variant table
 * (every spelling of /v1/search an application routes to the same handler
 * matches the endpoint, lookalikes do not), the bounded output (for every
 * output size the kept bytes are exactly the start of the full result,
 * including with `..` reaching back from beyond the bound), and
 * ruleset_endpoint() on a loaded configuration (methods and paths, case).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include <stdlib.h>
#include <unistd.h>

#include "config.h"
#include "normalize.h"
#include "rules.h"

/* The normalised form of <in> with room to spare; *<trunc> from norm_path(). */
static size_t full(const char *in, size_t len, char *out, size_t cap, bool *trunc)
{
	size_t n = norm_path(in, len, out, cap, trunc);

	assert_true(n <= cap);
	return n;
}

static const struct {
	const char *in, *out;
} cases[] = {
	/* the variants of the issue: all are /v1/search */
	{"/v1/search", "/v1/search"},
	{"/v1//search", "/v1/search"},
	{"//v1/search", "/v1/search"},
	{"/v1/%73earch", "/v1/search"},
	{"/v1/./search", "/v1/search"},
	{"/v1/x/../search", "/v1/search"},
	{"/../v1/search", "/v1/search"},
	{"/v1/%2e/search", "/v1/search"},
	{"/v1/%2E%2e/v1/search", "/v1/search"},
	{"/v1/.%2E/v1/search", "/v1/search"},
	{"/%76%31/%73%65%61%72%63%68", "/v1/search"},
	{"///v1///./search", "/v1/search"},
	{"/v1/search?q=/../x", "/v1/search"},
	{"/v1/search#/../x", "/v1/search"},
	{"v1/search", "/v1/search"},
	/* trailing slashes and dots */
	{"/v1/search/", "/v1/search/"},
	{"/v1/search//", "/v1/search/"},
	{"/v1/search/.", "/v1/search/"},
	{"/v1/search/x/..", "/v1/search/"},
	{"/v1/search/..", "/v1/"},
	{"/a/b/../../..", "/"},
	{"", "/"},
	{"/", "/"},
	{"//", "/"},
	{"/.", "/"},
	{"/..", "/"},
	{"?x", "/"},
	/* what is not a dot segment or not unreserved stays */
	{"/v1/.search", "/v1/.search"},
	{"/v1/search..", "/v1/search.."},
	{"/v1/.../x", "/v1/.../x"},
	{"/.well-known/x", "/.well-known/x"},
	{"/v1%2Fsearch", "/v1%2Fsearch"},
	{"/v1%2fsearch", "/v1%2fsearch"},
	{"/a%20b", "/a%20b"},
	{"/%2573", "/%2573"},
	{"/%%36%36", "/%66"},
	{"/%zz/%4", "/%zz/%4"},
	{"/%", "/%"},
	{"/%7e%5F%2d", "/~_-"},
	{"/%C3%A9", "/%C3%A9"},
	{"/V1/Search", "/V1/Search"},   /* case is kept; matching ignores it */
	{"/a\\b", "/a\\b"},
};

static void test_variant_table(void **state)
{
	char out[NORM_PATH_MAX + 1];
	size_t i, n;
	bool trunc;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		n = full(cases[i].in, strlen(cases[i].in), out, NORM_PATH_MAX, &trunc);
		out[n] = 0;
		if (strcmp(out, cases[i].out) != 0 || trunc)
			fail_msg("norm(\"%s\") = \"%s\" (trunc %d), want \"%s\"", cases[i].in, out,
				 trunc, cases[i].out);
	}
}

/* Never reads past the given length: the bytes after it would change the result. */
static void test_reads_only_len(void **state)
{
	char out[64];
	size_t n;
	bool trunc;

	(void)state;
	n = norm_path("/v1/%73earch", 6, out, sizeof(out), &trunc); /* "/v1/%7" */
	assert_int_equal(n, 6);
	assert_memory_equal(out, "/v1/%7", 6);
	n = norm_path("/v1/..", 5, out, sizeof(out), &trunc);       /* "/v1/." */
	assert_int_equal(n, 4);
	assert_memory_equal(out, "/v1/", 4);
	n = norm_path(NULL, 0, out, sizeof(out), &trunc);
	assert_int_equal(n, 1);
	assert_false(trunc);
}

/* xorshift64*: deterministic pseudo-random numbers */
static uint64_t rnd_next(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545f4914f6cdd1dULL;
}

/*
 * For every output size, the bytes kept are the start of the unbounded
 * result and the truncation flag says whether anything was left out.
 */
static void check_bounded(const char *in, size_t len)
{
	static char ref[1 << 16], out[1 << 16];
	size_t rn, n, cap;
	bool rtrunc, trunc;

	rn = norm_path(in, len, ref, sizeof(ref), &rtrunc);
	assert_false(rtrunc);
	for (cap = 1; cap <= rn + 2; cap++) {
		memset(out, 'Z', cap + 1);
		n = norm_path(in, len, out, cap, &trunc);
		if (n != (rn < cap ? rn : cap) || memcmp(out, ref, n) != 0 || trunc != (rn > cap) ||
		    out[cap] != 'Z')
			fail_msg("cap %zu: %zu bytes (trunc %d), full %zu: \"%.*s\" vs \"%.*s\"", cap,
				 n, trunc, rn, (int)n, out, (int)rn, ref);
	}
}

static void test_bounded_output(void **state)
{
	static const char *const parts[] = {"/", "/", "/", "a", "bc", "..", ".", "%2e",
					    "%41", "defgh", "%2F", "?"};
	char in[256];
	uint64_t seed = 0x9e3779b97f4a7c15ULL;
	size_t i, len;
	int round;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(cases); i++)
		check_bounded(cases[i].in, strlen(cases[i].in));
	for (round = 0; round < 3000; round++) {
		size_t k = 1 + rnd_next(&seed) % 24;

		len = 0;
		for (i = 0; i < k; i++) {
			const char *p = parts[rnd_next(&seed) % ARRAY_SIZE(parts)];

			memcpy(in + len, p, strlen(p));
			len += strlen(p);
		}
		check_bounded(in, len);
	}
}

/*
 * A path far longer than NORM_PATH_MAX whose `..` segments come back from
 * beyond the bound: what is matched is where the path really ends up, not
 * its first bytes.
 */
static void test_long_path_cannot_hide(void **state)
{
	static char in[40000];
	char out[NORM_PATH_MAX];
	size_t len = 0, n, i;
	bool trunc;

	(void)state;
	/* /x/ + 2,000 segments + 2,001 ".." + v1/search = /v1/search */
	len += (size_t)sprintf(in + len, "/x/");
	for (i = 0; i < 2000; i++)
		len += (size_t)sprintf(in + len, "seg%zu/", i);
	for (i = 0; i < 2001; i++)
		len += (size_t)sprintf(in + len, "../");
	len += (size_t)sprintf(in + len, "v1/search");
	n = norm_path(in, len, out, sizeof(out), &trunc);
	assert_false(trunc);
	assert_int_equal(n, 10);
	assert_memory_equal(out, "/v1/search", 10);

	/* /v1/search/ + a long tail: still starts with the endpoint, truncated */
	len = (size_t)sprintf(in, "/v1/search/");
	for (i = 0; i < 3000; i++)
		len += (size_t)sprintf(in + len, "ab/");
	n = norm_path(in, len, out, sizeof(out), &trunc);
	assert_true(trunc);
	assert_int_equal(n, NORM_PATH_MAX);
	assert_true(norm_prefix_eq(out, n, "/V1/SEARCH", 10));

	/* and back out of it again from beyond the bound */
	for (i = 0; i < 3001; i++)
		len += (size_t)sprintf(in + len, "../");
	len += (size_t)sprintf(in + len, "other");
	n = norm_path(in, len, out, sizeof(out), &trunc);
	assert_false(trunc);
	assert_int_equal(n, 9);
	assert_memory_equal(out, "/v1/other", 9);
}

static void test_prefix_eq(void **state)
{
	(void)state;
	assert_true(norm_prefix_eq("/v1/search", 10, "/v1/search", 10));
	assert_true(norm_prefix_eq("/V1/Search/x", 12, "/v1/search", 10));
	assert_true(norm_prefix_eq("/a%2f", 5, "/A%2F", 5));
	assert_false(norm_prefix_eq("/v1/sea", 7, "/v1/search", 10));
	assert_false(norm_prefix_eq("/v2/search", 10, "/v1/search", 10));
	assert_false(norm_prefix_eq("/v1/search", 10, "/v1/search", 11));
}

/* ---------------------------------------------------------------- endpoints */

static const char ep_conf[] =
	"listen = \"127.0.0.1:1\";\n"
	"store = \"memory\";\n"
	"limits = { k = { rate = 100; period = \"1m\"; }; s = { rate = 2; period = \"1m\"; }; };\n"
	"tiers = { t = { limits = [\"k\"]; }; };\n"
	"default_tier = \"t\";\n"
	"anonymous = { limits = [\"k\"]; };\n"
	"endpoints = (\n"
	"  { name = \"search\"; path_prefix = \"/v1/search\"; methods = [\"GET\", \"POST\"]; },\n"
	"  { name = \"export\"; route = \"export\"; },\n"
	"  { name = \"files\"; path_prefix = \"/v1//Files/./\"; },\n"
	"  { name = \"static\"; path_prefix = \"/static\"; }\n"
	");\n";

static struct ruleset *load_rules(void)
{
	char path[] = "/tmp/test_normalize-XXXXXX";
	struct cfg_errors errs = {0};
	struct agent_config *cfg = NULL;
	int fd = mkstemp(path);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, ep_conf, sizeof(ep_conf) - 1), (ssize_t)sizeof(ep_conf) - 1);
	close(fd);
	if (config_load(path, &cfg, &errs) != 0)
		fail_msg("config rejected");
	unlink(path);
	cfg_errors_release(&errs);
	return ruleset_build(cfg, 1);
}

static const char *ep(const struct ruleset *rs, const char *route, const char *method,
		      const char *path)
{
	const struct rule_endpoint *e;

	e = ruleset_endpoint(rs, route, route ? strlen(route) : 0, method, strlen(method), path,
			     path ? strlen(path) : 0);
	return e ? e->name : "-";
}

static void test_endpoint_match(void **state)
{
	static const struct {
		const char *method, *path, *want;
	} t[] = {
		{"GET", "/v1/search", "search"},
		{"GET", "/v1//search", "search"},
		{"GET", "//v1/search", "search"},
		{"GET", "/v1/%73earch", "search"},
		{"GET", "/v1/./search", "search"},
		{"GET", "/V1/search", "search"},
		{"GET", "/V1/SEARCH?q=1", "search"},
		{"GET", "/x/../v1/search", "search"},
		{"get", "/v1/search", "search"},
		{"pOsT", "/v1/search/deep", "search"},
		{"PUT", "/v1/search", "-"},        /* not one of its methods */
		{"GETX", "/v1/search", "-"},
		{"GE", "/v1/search", "-"},
		{"GET", "/v1/searc", "-"},
		{"GET", "/v1%2Fsearch", "-"},      /* an encoded '/' is data, not a separator */
		{"GET", "/v1/search/../other", "-"},
		{"GET", "/v2/search", "-"},
		{"DELETE", "/v1/files/a", "files"}, /* the prefix is normalised too: /v1/Files/ */
		{"GET", "/V1/FILES/", "files"},
		{"GET", "/v1/files", "-"},
		{"GET", "/static/x.css", "static"},
		{"GET", "/%73tatic", "static"},
	};
	struct ruleset *rs = load_rules();
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(t); i++)
		if (strcmp(ep(rs, NULL, t[i].method, t[i].path), t[i].want) != 0)
			fail_msg("%s %s: %s, want %s", t[i].method, t[i].path,
				 ep(rs, NULL, t[i].method, t[i].path), t[i].want);
	/* the route alone decides when both have one; no path, no prefix match */
	assert_string_equal(ep(rs, "export", "GET", "/v1/search"), "search");
	assert_string_equal(ep(rs, "export", "GET", "/other"), "export");
	assert_string_equal(ep(rs, NULL, "GET", NULL), "-");
	ruleset_unref(rs);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_variant_table),
		cmocka_unit_test(test_reads_only_len),
		cmocka_unit_test(test_bounded_output),
		cmocka_unit_test(test_long_path_cannot_hide),
		cmocka_unit_test(test_prefix_eq),
		cmocka_unit_test(test_endpoint_match),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
