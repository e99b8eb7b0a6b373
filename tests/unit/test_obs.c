/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the observability modules: Space-Saving heavy hitters (true
 * heavy hitters of a Zipf stream found, error bounds kept, memory fixed),
 * HyperLogLog accuracy and SipHash-1-3 vectors, Prometheus text (escaping and
 * histograms, exact text), and the metrics HTTP server driven by its own
 * libev loop with non-blocking loopback clients in the same process.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <ev.h>

#include "hll.h"
#include "http.h"
#include "log.h"
#include "prom.h"
#include "topk.h"
#include "util.h"

/* xorshift64*: deterministic pseudo-random numbers */
static uint64_t rnd_next(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545f4914f6cdd1dULL;
}

/* A uniform double in [0, 1). */
static double rnd_unit(uint64_t *s)
{
	return (double)(rnd_next(s) >> 11) / 9007199254740992.0;
}

/* ---------------------------------------------------------------- topk */

/* Cumulative distribution of Zipf(<s>) over ranks 1..<n>, in <cdf>[0..n-1]. */
static void zipf_cdf(double *cdf, size_t n, double s)
{
	double sum = 0;
	size_t i;

	for (i = 0; i < n; i++) {
		sum += 1.0 / pow((double)(i + 1), s);
		cdf[i] = sum;
	}
	for (i = 0; i < n; i++)
		cdf[i] /= sum;
}

/* Draws a 0-based rank from <cdf>. */
static size_t zipf_draw(const double *cdf, size_t n, uint64_t *rs)
{
	double u = rnd_unit(rs);
	size_t lo = 0, hi = n - 1;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (cdf[mid] < u)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static void test_topk_zipf_heavy_hitters_found(void **state)
{
	enum { U = 100000, N = 200000, K = 64 };
	struct topk_entry list[K];
	double *cdf = xmalloc(U * sizeof(*cdf));
	uint32_t *truth = xcalloc(U, sizeof(*truth));
	struct topk *t = topk_new(K);
	uint64_t rs = 0x1234567;
	size_t mem, n, i, heavy = 0;
	char item[32];

	(void)state;
	assert_non_null(t);
	mem = topk_memory(t);
	zipf_cdf(cdf, U, 1.1);
	for (i = 0; i < N; i++) {
		size_t r = zipf_draw(cdf, U, &rs);
		int len = snprintf(item, sizeof(item), "client-%zu", r);

		truth[r]++;
		topk_add(t, item, (size_t)len, 1);
	}
	assert_int_equal(topk_total(t), N);
	assert_int_equal(topk_size(t), K);
	assert_int_equal(topk_memory(t), mem); /* fixed, whatever the distinct count */
	n = topk_list(t, list, K);
	assert_int_equal(n, K);
	for (i = 0; i < n; i++) {
		size_t r;

		assert_int_equal(sscanf(list[i].item, "client-%zu", &r), 1);
		assert_true(r < U);
		/* count - error <= true <= count, and error <= N / K */
		assert_true(list[i].count >= truth[r]);
		assert_true(list[i].count - list[i].error <= truth[r]);
		assert_true(list[i].error <= N / K);
		if (i > 0)
			assert_true(list[i - 1].count >= list[i].count);
	}
	/* every item above N / K is listed */
	for (i = 0; i < U; i++) {
		size_t j;
		bool found = false;

		if (truth[i] <= N / K)
			continue;
		heavy++;
		snprintf(item, sizeof(item), "client-%zu", i);
		for (j = 0; j < n; j++)
			found = found || strcmp(list[j].item, item) == 0;
		assert_true(found);
	}
	assert_true(heavy >= 5); /* the stream is skewed enough to mean something */
	/* and the very top comes out in order */
	assert_string_equal(list[0].item, "client-0");
	assert_string_equal(list[1].item, "client-1");
	assert_string_equal(list[2].item, "client-2");
	topk_free(t);
	free(cdf);
	free(truth);
}

static void test_topk_memory_fixed_under_distinct_flood(void **state)
{
	struct topk *t = topk_new(16);
	struct topk_entry list[16];
	size_t mem, n, i;
	char item[32];

	(void)state;
	mem = topk_memory(t);
	/* an attacker rotating identities, with one steady client in between */
	for (i = 0; i < 300000; i++) {
		int len = snprintf(item, sizeof(item), "rotating-%zu", i);

		topk_add(t, item, (size_t)len, 1);
		if (i % 4 == 0)
			topk_add(t, "steady", 6, 1);
	}
	assert_int_equal(topk_memory(t), mem);
	assert_int_equal(topk_size(t), 16);
	assert_int_equal(topk_total(t), 300000 + 75000);
	n = topk_list(t, list, 16);
	assert_int_equal(n, 16);
	/* 75000 > 375000 / 16: the steady client must lead */
	assert_string_equal(list[0].item, "steady");
	assert_true(list[0].count >= 75000);
	assert_true(list[0].count - list[0].error <= 75000);
	topk_free(t);
}

static void test_topk_exact_below_k(void **state)
{
	struct topk *t = topk_new(8);
	struct topk_entry list[8];
	size_t n;

	(void)state;
	topk_add(t, "b", 1, 5);
	topk_add(t, "a", 1, 7);
	topk_add(t, "c", 1, 1);
	topk_add(t, "b", 1, 5);
	topk_add(t, "zero", 4, 0); /* ignored */
	n = topk_list(t, list, 8);
	assert_int_equal(n, 3);
	assert_string_equal(list[0].item, "b");
	assert_int_equal(list[0].count, 10);
	assert_int_equal(list[0].error, 0);
	assert_string_equal(list[1].item, "a");
	assert_int_equal(list[1].count, 7);
	assert_string_equal(list[2].item, "c");
	assert_int_equal(list[2].len, 1);
	assert_int_equal(topk_total(t), 18);
	/* max smaller than the summary */
	n = topk_list(t, list, 1);
	assert_int_equal(n, 1);
	assert_string_equal(list[0].item, "b");
	topk_clear(t);
	assert_int_equal(topk_size(t), 0);
	assert_int_equal(topk_total(t), 0);
	assert_int_equal(topk_list(t, list, 8), 0);
	topk_add(t, "a", 1, 1);
	assert_int_equal(topk_list(t, list, 8), 1);
	assert_int_equal(list[0].count, 1);
	topk_free(t);
}

static void test_topk_items_cut_at_64_bytes(void **state)
{
	struct topk *t = topk_new(4);
	struct topk_entry list[4];
	char a[100], b[100];

	(void)state;
	memset(a, 'x', sizeof(a));
	memcpy(b, a, sizeof(b));
	b[80] = 'y'; /* differs only after byte 64 */
	topk_add(t, a, sizeof(a), 1);
	topk_add(t, b, sizeof(b), 2);
	topk_add(t, "bin\0ary", 7, 1);
	assert_int_equal(topk_list(t, list, 4), 2);
	assert_int_equal(list[0].len, TOPK_ITEM_MAX);
	assert_int_equal(strlen(list[0].item), TOPK_ITEM_MAX);
	assert_int_equal(list[0].count, 3);
	assert_int_equal(list[1].len, 7);
	assert_memory_equal(list[1].item, "bin\0ary", 8);
	topk_free(t);
}

static void test_topk_saturates_and_rejects_bad_k(void **state)
{
	struct topk *t = topk_new(1);
	struct topk_entry e;

	(void)state;
	assert_null(topk_new(0));
	assert_null(topk_new((size_t)TOPK_K_MAX + 1));
	topk_add(t, "a", 1, UINT64_MAX - 1);
	topk_add(t, "a", 1, 5);
	assert_int_equal(topk_list(t, &e, 1), 1);
	assert_true(e.count == UINT64_MAX);
	assert_true(topk_total(t) == UINT64_MAX);
	/* K = 1: every newcomer takes over the only slot */
	topk_add(t, "b", 1, 1);
	assert_int_equal(topk_list(t, &e, 1), 1);
	assert_string_equal(e.item, "b");
	assert_true(e.error == UINT64_MAX);
	topk_free(t);
	topk_free(NULL);
}

/* ---------------------------------------------------------------- hll */

static void test_hll_siphash13_vectors(void **state)
{
	/* SipHash-1-3, key 0, messages 00 01 02 ... (reference implementation) */
	static const uint64_t want[] = {0xd1fba762150c532cULL, 0x68a914128e01e473ULL,
					0x010bac45c41e3669ULL, 0x4d4c9a4a8ef6e0adULL,
					0x7cc43f98813e4dbdULL};
	uint8_t msg[8] = {0, 1, 2, 3, 4, 5, 6, 7};
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(want); i++)
		assert_true(hll_siphash13(0, 0, msg, i) == want[i]);
	assert_true(hll_siphash13(0, 0, "siphash", 7) == 0x8264ceeccb16bcbeULL);
	/* the fixed key must never change (sketch merges across versions) */
	assert_true(hll_hash("spoa", 4) == hll_hash("spoa", 4));
	assert_true(hll_hash("spoa", 4) != hll_hash("spob", 4));
}

/* Adds <n> distinct items (each twice) numbered from <first> to <h>. */
static void hll_fill(struct hll *h, uint32_t first, uint32_t n)
{
	char item[32];
	uint32_t i;

	for (i = first; i < first + n; i++) {
		int len = snprintf(item, sizeof(item), "user-%u", i);

		hll_add(h, item, (size_t)len);
		hll_add(h, item, (size_t)len);
	}
}

static void test_hll_within_5_percent(void **state)
{
	static const uint32_t sizes[] = {1000, 10000, 100000};
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(sizes); i++) {
		struct hll *h = hll_new();
		double err;

		hll_fill(h, 0, sizes[i]);
		err = fabs((double)hll_count(h) - sizes[i]) / sizes[i];
		print_message("hll: %u distinct, estimate %llu (%.2f%%)\n", sizes[i],
			      (unsigned long long)hll_count(h), 100 * err);
		assert_true(err < 0.05);
		hll_free(h);
	}
}

static void test_hll_small_counts_and_clear(void **state)
{
	struct hll *h = hll_new();
	uint32_t n;

	(void)state;
	assert_int_equal(hll_count(h), 0);
	for (n = 1; n <= 200; n++) {
		hll_clear(h);
		hll_fill(h, 1000000, n);
		/* the small-range correction keeps tiny counts (almost) exact */
		assert_true(llabs((long long)hll_count(h) - (long long)n) <= 1 + (long long)n / 50);
	}
	hll_clear(h);
	assert_int_equal(hll_count(h), 0);
	hll_free(h);
	hll_free(NULL);
}

static void test_hll_merge_is_union(void **state)
{
	struct hll *a = hll_new(), *b = hll_new();

	(void)state;
	hll_fill(a, 0, 50000);
	hll_fill(b, 25000, 50000);
	hll_merge(a, b);
	assert_true(fabs((double)hll_count(a) - 75000) / 75000 < 0.05);
	hll_free(a);
	hll_free(b);
}

/* ---------------------------------------------------------------- prom */

static void test_prom_label_and_help_escaping(void **state)
{
	struct http_reply r;
	const struct prom_label labels[] = {
		{"rule", "a\\b\"c\nd"},
		{"client", "caf\xc3\xa9 \xff\xc3(\xed\xa0\x80"},
	};

	(void)state;
	http_reply_init(&r);
	prom_family(&r, "spoa_denied_total", PROM_COUNTER, "Denied \"requests\"\nby rule \\ client");
	prom_sample_u64(&r, "spoa_denied_total", labels, 2, 42);
	assert_string_equal(r.body,
			    "# HELP spoa_denied_total Denied \"requests\"\\nby rule \\\\ client\n"
			    "# TYPE spoa_denied_total counter\n"
			    "spoa_denied_total{rule=\"a\\\\b\\\"c\\nd\","
			    "client=\"caf\xc3\xa9 \xef\xbf\xbd\xef\xbf\xbd(\xef\xbf\xbd\xef\xbf\xbd"
			    "\xef\xbf\xbd\"} 42\n");
	http_reply_release(&r);
	prom_append_label_value(&r, "\"x\"", 3);
	assert_string_equal(r.body, "\\\"x\\\"");
	http_reply_release(&r);
}

static void test_prom_sample_values(void **state)
{
	struct http_reply r;
	const struct prom_label l = {"k", "v"};

	(void)state;
	http_reply_init(&r);
	prom_family(&r, "g", PROM_GAUGE, NULL);
	prom_sample_u64(&r, "c", NULL, 0, UINT64_MAX);
	prom_sample_f64(&r, "g", &l, 1, 0.1);
	prom_sample_f64(&r, "g", &l, 1, 1.0 / 3);
	prom_sample_f64(&r, "g", &l, 1, 1234567);
	prom_sample_f64(&r, "g", &l, 1, 1e-5);
	prom_sample_f64(&r, "g", &l, 1, NAN);
	prom_sample_f64(&r, "g", &l, 1, INFINITY);
	prom_sample_f64(&r, "g", &l, 1, -INFINITY);
	assert_string_equal(r.body, "# TYPE g gauge\n"
				    "c 18446744073709551615\n"
				    "g{k=\"v\"} 0.1\n"
				    "g{k=\"v\"} 0.3333333333333333\n"
				    "g{k=\"v\"} 1234567\n"
				    "g{k=\"v\"} 1e-05\n"
				    "g{k=\"v\"} NaN\n"
				    "g{k=\"v\"} +Inf\n"
				    "g{k=\"v\"} -Inf\n");
	http_reply_release(&r);
	assert_true(prom_name_valid("spoa_requests_total"));
	assert_true(prom_name_valid("ns:sub_x1"));
	assert_false(prom_name_valid("1abc"));
	assert_false(prom_name_valid("a-b"));
	assert_false(prom_name_valid(""));
	assert_string_equal(prom_type_str(PROM_HISTOGRAM), "histogram");
}

static void test_prom_histogram_exact_text(void **state)
{
	struct prom_hist h, h2;
	struct http_reply r;
	const struct prom_label l = {"rule", "login"};

	(void)state;
	prom_hist_init_latency(&h);
	/* powers of two, so that the sum is exact */
	prom_hist_observe(&h, 0.00006103515625);
	prom_hist_observe(&h, 0.000244140625);
	prom_hist_observe(&h, 0.00390625);
	prom_hist_observe(&h, 0.125);
	prom_hist_observe(&h, 2);
	prom_hist_observe(&h, NAN); /* ignored */
	http_reply_init(&r);
	prom_family(&r, "spoa_redis_seconds", PROM_HISTOGRAM, "Redis round trip.");
	prom_hist_render(&r, "spoa_redis_seconds", &l, 1, &h);
	assert_string_equal(r.body, "# HELP spoa_redis_seconds Redis round trip.\n"
				    "# TYPE spoa_redis_seconds histogram\n"
				    "spoa_redis_seconds_bucket{rule=\"login\",le=\"0.0001\"} 1\n"
				    "spoa_redis_seconds_bucket{rule=\"login\",le=\"0.00025\"} 2\n"
				    "spoa_redis_seconds_bucket{rule=\"login\",le=\"0.0005\"} 2\n"
				    "spoa_redis_seconds_bucket{rule=\"login\",le=\"0.001\"} 2\n"
				    "spoa_redis_seconds_bucket{rule=\"login\",le=\"0.0025\"} 2\n"
				    "spoa_redis_seconds_bucket{rule=\"login\",le=\"0.005\"} 3\n"
				    "spoa_redis_seconds_bucket{rule=\"login\",le=\"0.01\"} 3\n"
				    "spoa_redis_seconds_bucket{rule=\"login\",le=\"0.025\"} 3\n"
				    "spoa_redis_seconds_bucket{rule=\"login\",le=\"0.05\"} 3\n"
				    "spoa_redis_seconds_bucket{rule=\"login\",le=\"0.1\"} 3\n"
				    "spoa_redis_seconds_bucket{rule=\"login\",le=\"0.25\"} 4\n"
				    "spoa_redis_seconds_bucket{rule=\"login\",le=\"0.5\"} 4\n"
				    "spoa_redis_seconds_bucket{rule=\"login\",le=\"1\"} 4\n"
				    "spoa_redis_seconds_bucket{rule=\"login\",le=\"+Inf\"} 5\n"
				    "spoa_redis_seconds_sum{rule=\"login\"} 2.12921142578125\n"
				    "spoa_redis_seconds_count{rule=\"login\"} 5\n");
	http_reply_release(&r);

	/* custom bounds (le is inclusive), no labels, merge */
	assert_int_equal(prom_hist_init(&h, (const double[]){1, 2.5}, 2), 0);
	assert_int_equal(prom_hist_init(&h2, (const double[]){1, 2.5}, 2), 0);
	prom_hist_observe(&h, 1);
	prom_hist_observe(&h2, 3);
	prom_hist_merge(&h, &h2);
	prom_hist_render(&r, "x", NULL, 0, &h);
	assert_string_equal(r.body, "x_bucket{le=\"1\"} 1\n"
				    "x_bucket{le=\"2.5\"} 1\n"
				    "x_bucket{le=\"+Inf\"} 2\n"
				    "x_sum 4\n"
				    "x_count 2\n");
	http_reply_release(&r);

	assert_int_equal(prom_hist_init(&h, (const double[]){2, 1}, 2), -1);
	assert_int_equal(prom_hist_init(&h, (const double[]){1, 1}, 2), -1);
	assert_int_equal(prom_hist_init(&h, (const double[]){1, NAN}, 2), -1);
	assert_int_equal(prom_hist_init(&h, (const double[]){1, INFINITY}, 2), -1);
	assert_int_equal(prom_hist_init(&h, (const double[]){1}, 0), -1);
	assert_int_equal(prom_hist_init(&h, (const double[PROM_HIST_MAX + 1]){0}, PROM_HIST_MAX + 1),
			 -1);
}

/* ---------------------------------------------------------------- http */

static void test_http_reply_builder_bounds(void **state)
{
	struct http_reply r;
	char *chunk = xmalloc(1 << 20);
	size_t i;

	(void)state;
	http_reply_init(&r);
	assert_int_equal(r.status, 200);
	assert_string_equal(r.ctype, HTTP_CTYPE_TEXT);
	/* printf past the first allocation */
	memset(chunk, 'a', 9999);
	chunk[9999] = 0;
	http_reply_printf(&r, "<%s>", chunk);
	assert_int_equal(r.len, 10001);
	assert_int_equal(r.body[10000], '>');
	assert_int_equal(r.body[10001], 0);
	http_reply_status(&r, 404, "application/json");
	assert_int_equal(r.status, 404);
	assert_string_equal(r.ctype, "application/json");
	assert_false(r.broken);
	/* growth stops at HTTP_REPLY_MAX: the reply breaks and drops its body */
	memset(chunk, 'b', 1 << 20);
	for (i = 0; i < 9; i++)
		http_reply_append(&r, chunk, 1 << 20);
	assert_true(r.broken);
	assert_null(r.body);
	assert_int_equal(r.len, 0);
	http_reply_printf(&r, "more");
	assert_int_equal(r.len, 0);
	http_reply_release(&r);
	assert_false(r.broken);
	/* header injection and impossible statuses break the reply */
	http_reply_status(&r, 200, "text/plain\r\nX-Evil: 1");
	assert_true(r.broken);
	http_reply_release(&r);
	http_reply_status(&r, 99, NULL);
	assert_true(r.broken);
	http_reply_release(&r);
	http_reply_status(&r, 204, NULL);
	assert_true(r.broken);
	http_reply_release(&r);
	free(chunk);
}

#define RBUF_CAP  (8U << 20)           /* largest response a test reads */
#define LARGE_LEN (6U << 20)           /* more than a loopback socket buffer */

struct fixture {
	struct ev_loop *loop;
	struct http_server *srv;
	char *rbuf;                     /* RBUF_CAP bytes for responses */
	int calls;                      /* handler invocations */
	int lent;                       /* references to lent_body held by replies */
	char last_path[256];            /* path of the last one */
};

/* Hands back one reference to the lent body of fixture <arg>. */
static void lent_unref(void *arg)
{
	struct fixture *f = arg;

	f->lent--;
}

static void handler(const char *path, struct http_reply *r, void *arg)
{
	struct fixture *f = arg;

	f->calls++;
	snprintf(f->last_path, sizeof(f->last_path), "%s", path);
	if (strcmp(path, "/health") == 0) {
		http_reply_printf(r, "ok\n");
	} else if (strcmp(path, "/metrics") == 0) {
		http_reply_status(r, 200, PROM_CONTENT_TYPE);
		prom_family(r, "up", PROM_GAUGE, "Always 1.");
		prom_sample_u64(r, "up", NULL, 0, 1);
	} else if (strcmp(path, "/big") == 0) {
		static char mib[1 << 20];
		int i;

		for (i = 0; i < 9; i++)
			http_reply_append(r, mib, sizeof(mib));
	} else if (strcmp(path, "/large") == 0) {
		/* line i is "%07x\n" of i, formatted by hand: fast under valgrind */
		static const char hex[] = "0123456789abcdef";
		char line[8];
		uint32_t i;
		int d;

		line[7] = '\n';
		for (i = 0; i < LARGE_LEN / 8; i++) {
			for (d = 0; d < 7; d++)
				line[6 - d] = hex[(i >> (4 * d)) & 15];
			http_reply_append(r, line, sizeof(line));
		}
	} else if (strcmp(path, "/lent") == 0) {
		static char lent_body[] = "lent, not copied\n";

		f->lent++;
		http_reply_lend(r, lent_body, sizeof(lent_body) - 1, lent_unref, f);
	} else if (strcmp(path, "/badtype") == 0) {
		http_reply_status(r, 200, "text/plain\nX-Evil: 1");
	} else {
		http_reply_status(r, 404, NULL);
		http_reply_printf(r, "no such page: %s\n", path);
	}
}

/* One log call is one line: control bytes in the message cannot forge another. */
static void test_log_one_line(void **state)
{
	char buf[2048];
	int fds[2], saved;
	ssize_t n;

	(void)state;
	assert_int_equal(pipe(fds), 0);
	saved = dup(STDERR_FILENO);
	assert_true(saved >= 0);
	assert_true(dup2(fds[1], STDERR_FILENO) >= 0);
	log_write(LOG_ERR, "peer said %s", "hi\n2026-01-01T00:00:00.000Z [1] err: forged\x1b[2J\x7f");
	assert_true(dup2(saved, STDERR_FILENO) >= 0);
	close(saved);
	close(fds[1]);
	n = read(fds[0], buf, sizeof(buf) - 1);
	close(fds[0]);
	assert_true(n > 0);
	buf[n] = 0;
	assert_non_null(strstr(buf, "peer said hi?2026-01-01T00:00:00.000Z [1] err: forged?[2J?\n"));
	assert_ptr_equal(strchr(buf, '\n'), buf + n - 1);
}

static int http_setup(void **state)
{
	struct fixture *f = xcalloc(1, sizeof(*f));
	char err[256];

	f->loop = ev_loop_new(EVFLAG_AUTO);
	assert_non_null(f->loop);
	f->rbuf = xmalloc(RBUF_CAP);
	f->srv = http_server_new(f->loop, "127.0.0.1:0", false, handler, f, err, sizeof(err));
	if (!f->srv)
		fail_msg("http_server_new: %s", err);
	assert_true(http_server_port(f->srv) > 0);
	*state = f;
	return 0;
}

static int http_teardown(void **state)
{
	struct fixture *f = *state;

	http_server_free(f->srv);
	ev_loop_destroy(f->loop);
	free(f->rbuf);
	free(f);
	return 0;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Connects to the server of <f> (loopback: completes in the kernel backlog). */
static int client_connect(struct fixture *f)
{
	struct sockaddr_in sin;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	assert_true(fd >= 0);
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_port = htons((uint16_t)http_server_port(f->srv));
	sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(connect(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	assert_int_equal(fcntl(fd, F_SETFL, O_NONBLOCK), 0);
	return fd;
}

/* Runs the loop of <f> until the server has <n> connections (at most 10 s). */
static void pump_until_conns(struct fixture *f, size_t n)
{
	double deadline = now_s() + 10;

	while (http_server_conns(f->srv) != n) {
		assert_true(now_s() < deadline);
		ev_run(f->loop, EVRUN_NOWAIT);
		usleep(1000);
	}
}

struct resp {
	char *buf;                      /* ref: fixture.rbuf, raw response + NUL */
	size_t len;
	bool reset;                     /* ECONNRESET seen */
};

/*
 * Sends <req> (<len> bytes, at most <chunk> per loop iteration) on a new
 * connection, then shuts down its side (a kept-alive connection ends there),
 * and reads until the server closes, driving the server's loop in between.
 * Bounded by 10 s (a hang guard; runs take milliseconds).
 */
static void exchange_chunked(struct fixture *f, const char *req, size_t len, size_t chunk,
			     struct resp *out)
{
	double deadline = now_s() + 10;
	size_t before = http_server_conns(f->srv), sent = 0;
	int fd = client_connect(f);
	bool eof = false, shut = false;

	memset(out, 0, sizeof(*out));
	out->buf = f->rbuf;
	while (!eof) {
		struct pollfd pfd = {.fd = fd, .events = POLLIN};
		ssize_t n;

		assert_true(now_s() < deadline);
		ev_run(f->loop, EVRUN_NOWAIT);
		if (sent < len) {
			n = send(fd, req + sent, len - sent < chunk ? len - sent : chunk,
				 MSG_NOSIGNAL);
			if (n > 0)
				sent += (size_t)n;
			else if (n == -1 && errno != EAGAIN)
				sent = len; /* the server gave up on us */
		}
		if (sent == len && !shut) {
			(void)shutdown(fd, SHUT_WR);
			shut = true;
		}
		n = recv(fd, out->buf + out->len, RBUF_CAP - 1 - out->len, 0);
		if (n > 0) {
			out->len += (size_t)n;
			assert_true(out->len < RBUF_CAP - 1);
		} else if (n == 0) {
			eof = true;
		} else if (errno == ECONNRESET) {
			out->reset = true;
			eof = true;
		} else {
			assert_true(errno == EAGAIN);
		}
		(void)poll(&pfd, 1, 1);
	}
	out->buf[out->len] = 0;
	close(fd);
	/* let the server see the close and free the connection (at the connection
	 * bound it closed an idle one to admit this one: fewer then) */
	while (http_server_conns(f->srv) > before) {
		assert_true(now_s() < deadline);
		ev_run(f->loop, EVRUN_NOWAIT);
		usleep(1000);
	}
}

static void exchange(struct fixture *f, const char *req, size_t len, struct resp *out)
{
	exchange_chunked(f, req, len, len, out);
}

static void exchange_str(struct fixture *f, const char *req, struct resp *out)
{
	exchange(f, req, strlen(req), out);
}

static int resp_status(const struct resp *r)
{
	int status = 0;

	if (sscanf(r->buf, "HTTP/1.1 %d ", &status) != 1)
		return -1;
	return status;
}

/* Returns the body (after the empty line), or NULL if there is none. */
static const char *resp_body(const struct resp *r)
{
	const char *p = strstr(r->buf, "\r\n\r\n");

	return p ? p + 4 : NULL;
}

/* True if the head of <r> holds the header line <line> ("Name: value"). */
static bool resp_has(const struct resp *r, const char *line)
{
	const char *end = strstr(r->buf, "\r\n\r\n");
	char needle[256];
	const char *p;

	snprintf(needle, sizeof(needle), "\r\n%s\r\n", line);
	p = strstr(r->buf, needle);
	return p && end && p < end;
}

static void test_http_get_200_with_body(void **state)
{
	struct fixture *f = *state;
	struct resp r;

	exchange_str(f, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n", &r);
	assert_int_equal(resp_status(&r), 200);
	assert_true(resp_has(&r, "Content-Length: 3"));
	assert_false(resp_has(&r, "Connection: close")); /* kept alive */
	assert_true(resp_has(&r, "Content-Type: " HTTP_CTYPE_TEXT));
	assert_string_equal(resp_body(&r), "ok\n");
	assert_false(r.reset);

	/* query string stripped, handler's content type, HTTP/1.0 with bare LFs */
	exchange_str(f, "GET /metrics?name[]=up&x HTTP/1.0\n\n", &r);
	assert_int_equal(resp_status(&r), 200);
	assert_string_equal(f->last_path, "/metrics");
	assert_true(resp_has(&r, "Content-Type: " PROM_CONTENT_TYPE));
	assert_string_equal(resp_body(&r), "# HELP up Always 1.\n# TYPE up gauge\nup 1\n");
	assert_true(resp_has(&r, "Connection: close")); /* 1.0: never kept */

	/* absolute-form target, leading empty line */
	exchange_str(f, "\r\nGET http://localhost:9/health#frag HTTP/1.1\r\n\r\n", &r);
	assert_int_equal(resp_status(&r), 200);
	assert_string_equal(f->last_path, "/health");
	assert_int_equal(f->calls, 3);
	assert_int_equal(http_server_stats(f->srv)->requests, 3);
}

static void test_http_head_has_no_body(void **state)
{
	struct fixture *f = *state;
	struct resp r;

	exchange_str(f, "HEAD /health HTTP/1.1\r\n\r\n", &r);
	assert_int_equal(resp_status(&r), 200);
	assert_true(resp_has(&r, "Content-Length: 3"));
	assert_string_equal(resp_body(&r), "");
}

static void test_http_head_sent_byte_by_byte(void **state)
{
	static const char req[] = "\r\n\r\nGET /health?a=b HTTP/1.1\r\nHost: x\r\nA: b\r\n\r\n";
	struct fixture *f = *state;
	struct resp r;

	exchange_chunked(f, req, sizeof(req) - 1, 1, &r);
	assert_int_equal(resp_status(&r), 200);
	assert_string_equal(resp_body(&r), "ok\n");
	assert_string_equal(f->last_path, "/health");
}

static void test_http_404_from_handler(void **state)
{
	struct fixture *f = *state;
	struct resp r;

	exchange_str(f, "GET /nope?secret=1 HTTP/1.1\r\n\r\n", &r);
	assert_int_equal(resp_status(&r), 404);
	assert_string_equal(resp_body(&r), "no such page: /nope\n");
	assert_true(resp_has(&r, "Content-Length: 20"));
}

static void test_http_405_for_post(void **state)
{
	struct fixture *f = *state;
	struct resp r;

	exchange_str(f, "POST /health HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello", &r);
	assert_int_equal(resp_status(&r), 405);
	assert_true(resp_has(&r, "Allow: GET, HEAD"));
	exchange_str(f, "DELETE / HTTP/1.0\r\n\r\n", &r);
	assert_int_equal(resp_status(&r), 405);
	assert_int_equal(f->calls, 0);
	assert_int_equal(http_server_stats(f->srv)->bad_requests, 2);
}

static void test_http_431_for_huge_head(void **state)
{
	struct fixture *f = *state;
	size_t len = 3 * HTTP_HEAD_MAX;
	char *req = xmalloc(len);
	struct resp r;

	memset(req, 'a', len);
	memcpy(req, "GET / HTTP/1.1\r\nX-Big: ", 23);
	exchange(f, req, len, &r);
	/* lingering close: the client reads the reply instead of a reset */
	assert_int_equal(resp_status(&r), 431);
	assert_false(r.reset);
	assert_int_equal(f->calls, 0);
	/* a head of exactly the bound still fits */
	memset(req, 'a', HTTP_HEAD_MAX);
	memcpy(req, "GET /health HTTP/1.1\r\nX-Big: ", 29);
	memcpy(req + HTTP_HEAD_MAX - 4, "\r\n\r\n", 4);
	exchange(f, req, HTTP_HEAD_MAX, &r);
	assert_int_equal(resp_status(&r), 200);
	free(req);
}

static void test_http_garbage_is_rejected(void **state)
{
	static const struct {
		const char *req;
		int status;
	} cases[] = {
		{"GET\r\n\r\n", 400},
		{"GET /\r\n\r\n", 400},
		{"GET / HTTP/1.1 extra\r\n\r\n", 400},
		{"GET  / HTTP/1.1\r\n\r\n", 400},
		{"GET noslash HTTP/1.1\r\n\r\n", 400},
		{"G@T / HTTP/1.1\r\n\r\n", 400},
		{"GET / FOO/1.1\r\n\r\n", 400},
		{"GET /\x01 HTTP/1.1\r\n\r\n", 400},
		{"GET / HTTP/2.0\r\n\r\n", 505},
		{"GET / HTTP/1.x\r\n\r\n", 400},
		{"GET / http/1.1\r\n\r\n", 400},
		{"\x16\x03\x01\x02\x01\x01\xfc\x03\x03\r\n\r\n", 400},
	};
	struct fixture *f = *state;
	uint64_t rs = 42;
	struct resp r;
	size_t i;

	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		exchange_str(f, cases[i].req, &r);
		if (resp_status(&r) != cases[i].status)
			fail_msg("case %zu: got %d, want %d", i, resp_status(&r), cases[i].status);
	}
	exchange(f, "GET /\0 HTTP/1.1\r\n\r\n", 19, &r);
	assert_int_equal(resp_status(&r), 400);
	exchange_str(f, "HEAD / HTTP/3.0\r\n\r\n", &r);
	assert_int_equal(resp_status(&r), 505);
	assert_string_equal(resp_body(&r), ""); /* HEAD: no body, even for errors */
	/* random bytes ending like a head: always some reply, never a crash */
	for (i = 0; i < 100; i++) {
		char req[256];
		size_t len = 4 + rnd_next(&rs) % (sizeof(req) - 4), j;
		int st;

		for (j = 0; j < len - 4; j++)
			req[j] = (char)rnd_next(&rs);
		if (i % 2)
			memcpy(req, "GET /", 5); /* half of them look like a request */
		memcpy(req + len - 4, "\r\n\r\n", 4);
		exchange(f, req, len, &r);
		st = resp_status(&r);
		assert_true(st == 400 || st == 404 || st == 405 || st == 505 || st == 200);
	}
	assert_int_equal(f->calls, 0);
}

static void test_http_connection_limit(void **state)
{
	struct fixture *f = *state;
	int idle[HTTP_CONNS_MAX];
	struct resp r;
	char buf[16];
	ssize_t n;
	size_t i;

	for (i = 0; i < HTTP_CONNS_MAX; i++)
		idle[i] = client_connect(f);
	pump_until_conns(f, HTTP_CONNS_MAX);
	/* one more is served: the oldest idle connection makes room */
	exchange_str(f, "GET /health HTTP/1.1\r\n\r\n", &r);
	assert_int_equal(resp_status(&r), 200);
	assert_int_equal(http_server_stats(f->srv)->evicted, 1);
	assert_int_equal(http_server_stats(f->srv)->refused, 0);
	/* the evicted one is the oldest: closed without a reply */
	n = recv(idle[0], buf, sizeof(buf), 0);
	assert_true(n == 0 || (n == -1 && errno == ECONNRESET));
	assert_true(http_server_conns(f->srv) <= HTTP_CONNS_MAX);
	for (i = 0; i < HTTP_CONNS_MAX; i++)
		close(idle[i]);
	pump_until_conns(f, 0);
	/* a smaller bound applies to new connections */
	http_server_set_max_conns(f->srv, 2);
	idle[0] = client_connect(f);
	idle[1] = client_connect(f);
	pump_until_conns(f, 2);
	exchange_str(f, "GET /health HTTP/1.1\r\n\r\n", &r);
	assert_int_equal(resp_status(&r), 200);
	assert_int_equal(http_server_stats(f->srv)->evicted, 2);
	close(idle[0]);
	close(idle[1]);
}

static void test_http_deadline_closes_slow_clients(void **state)
{
	struct fixture *f = *state;
	char buf[64];
	ssize_t n;
	int fd;

	http_server_set_timeout(f->srv, 0.2);
	fd = client_connect(f);
	assert_int_equal(send(fd, "GET / HT", 8, MSG_NOSIGNAL), 8); /* and nothing more */
	pump_until_conns(f, 1);
	pump_until_conns(f, 0);
	assert_int_equal(http_server_stats(f->srv)->timeouts, 1);
	/* closed with our bytes unread: EOF or a reset, never data */
	n = recv(fd, buf, sizeof(buf), 0);
	assert_true(n == 0 || (n == -1 && errno == ECONNRESET));
	close(fd);
	assert_int_equal(f->calls, 0);
}

static void test_http_reply_over_bound_is_500(void **state)
{
	struct fixture *f = *state;
	struct resp r;

	exchange_str(f, "GET /big HTTP/1.1\r\n\r\n", &r);
	assert_int_equal(resp_status(&r), 500);
	assert_string_equal(resp_body(&r), "500 Internal Server Error\n");
	exchange_str(f, "GET /badtype HTTP/1.1\r\n\r\n", &r);
	assert_int_equal(resp_status(&r), 500);
	assert_false(strstr(r.buf, "X-Evil") != NULL);
}

static void test_http_large_reply_written_in_pieces(void **state)
{
	struct fixture *f = *state;
	char line[16], want[64];
	const char *body;
	uint32_t i;
	struct resp r;

	exchange_str(f, "GET /large HTTP/1.1\r\n\r\n", &r);
	assert_int_equal(resp_status(&r), 200);
	snprintf(want, sizeof(want), "Content-Length: %u", LARGE_LEN);
	assert_true(resp_has(&r, want));
	body = resp_body(&r);
	assert_non_null(body);
	assert_int_equal(r.len - (size_t)(body - r.buf), LARGE_LEN);
	for (i = 0; i < LARGE_LEN / 8; i += 4099) {
		snprintf(line, sizeof(line), "%07x\n", i);
		assert_memory_equal(body + 8 * (size_t)i, line, 8);
	}
	assert_memory_equal(body + LARGE_LEN - 8, "00bffff\n", 8);
}

/*
 * A lent body is sent as it is and handed back once, whatever becomes of the
 * reply: sent (GET), measured only (HEAD), or written to (copied first),
 * released, or broken.
 */
static void test_http_lent_body_handed_back_once(void **state)
{
	struct fixture *f = *state;
	char buf[] = "hello";
	struct http_reply r;
	struct resp out;

	exchange_str(f, "GET /lent HTTP/1.1\r\n\r\n", &out);
	assert_string_equal(resp_body(&out), "lent, not copied\n");
	assert_int_equal(f->lent, 0);
	exchange_str(f, "HEAD /lent HTTP/1.1\r\n\r\n", &out);
	assert_true(resp_has(&out, "Content-Length: 17"));
	assert_int_equal(f->lent, 0);

	http_reply_init(&r);
	f->lent = 1;
	http_reply_lend(&r, buf, 5, lent_unref, f);
	assert_ptr_equal(r.body, buf);
	http_reply_append(&r, " world", 6);
	assert_int_equal(f->lent, 0);
	assert_ptr_not_equal(r.body, buf);
	assert_string_equal(r.body, "hello world");
	assert_string_equal(buf, "hello");
	http_reply_release(&r);
	f->lent = 1;
	http_reply_lend(&r, buf, 5, lent_unref, f);
	http_reply_release(&r);
	assert_int_equal(f->lent, 0);
	f->lent = 1;
	http_reply_lend(&r, buf, 5, lent_unref, f);
	http_reply_status(&r, 99, NULL); /* broken: the body goes back */
	assert_int_equal(f->lent, 0);
	assert_true(r.broken);
	http_reply_release(&r);
}

/*
 * Reads from <fd> what the server of <f> sends, driving its loop, until
 * <n> replies to /health (body "ok\n") came, or the server closed (*<eof>).
 * Returns the replies counted; the text is in f->rbuf.
 */
static int read_health_replies(struct fixture *f, int fd, int n, bool *eof)
{
	double deadline = now_s() + 10;
	size_t len = 0;
	int got = 0;

	*eof = false;
	f->rbuf[0] = 0;
	while (got < n && !*eof) {
		struct pollfd pfd = {.fd = fd, .events = POLLIN};
		const char *p;
		ssize_t k;

		assert_true(now_s() < deadline);
		ev_run(f->loop, EVRUN_NOWAIT);
		k = recv(fd, f->rbuf + len, RBUF_CAP - 1 - len, 0);
		if (k > 0)
			len += (size_t)k;
		else if (k == 0 || (k == -1 && errno == ECONNRESET))
			*eof = true;
		else
			assert_true(errno == EAGAIN);
		f->rbuf[len] = 0;
		for (got = 0, p = f->rbuf; (p = strstr(p, "\r\n\r\nok\n")); p++)
			got++;
		(void)poll(&pfd, 1, 1);
	}
	return got;
}

/* Counts the occurrences of <needle> in <hay>. */
static int count_of(const char *hay, const char *needle)
{
	int n = 0;

	for (; (hay = strstr(hay, needle)); hay++)
		n++;
	return n;
}

/*
 * HTTP/1.1 keeps the connection for the next request, up to max_requests:
 * the last reply says "Connection: close" and the server closes. A client that
 * says close is answered and closed at once.
 */
static void test_http_keep_alive_bounded(void **state)
{
	struct fixture *f = *state;
	static const char req[] = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
	bool eof;
	int fd, i;

	http_server_set_max_requests(f->srv, 3);
	fd = client_connect(f);
	for (i = 1; i <= 3; i++) {
		assert_int_equal(send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL), sizeof(req) - 1);
		assert_int_equal(read_health_replies(f, fd, 1, &eof), 1);
		assert_int_equal(count_of(f->rbuf, "Connection: close"), i == 3);
		assert_int_equal(f->calls, i);
		assert_int_equal(http_server_conns(f->srv), i < 3 ? 1 : http_server_conns(f->srv));
	}
	assert_int_equal(read_health_replies(f, fd, 1, &eof), 0);
	assert_true(eof); /* the server closed after the third */
	close(fd);
	pump_until_conns(f, 0);
	assert_int_equal(http_server_stats(f->srv)->accepted, 1);

	fd = client_connect(f);
	static const char bye[] = "GET /health HTTP/1.1\r\nConnection: Keep-Alive, Close\r\n\r\n";
	assert_int_equal(send(fd, bye, sizeof(bye) - 1, MSG_NOSIGNAL), sizeof(bye) - 1);
	assert_int_equal(read_health_replies(f, fd, 2, &eof), 1);
	assert_true(eof);
	assert_int_equal(count_of(f->rbuf, "Connection: close"), 1);
	close(fd);
	pump_until_conns(f, 0);
	assert_int_equal(http_server_stats(f->srv)->timeouts, 0);

	/* a body is never read: the connection is not kept after a request with one */
	fd = client_connect(f);
	static const char body[] = "GET /health HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello";
	assert_int_equal(send(fd, body, sizeof(body) - 1, MSG_NOSIGNAL), sizeof(body) - 1);
	assert_int_equal(read_health_replies(f, fd, 2, &eof), 1);
	assert_true(eof);
	assert_int_equal(count_of(f->rbuf, "Connection: close"), 1);
	close(fd);
	pump_until_conns(f, 0);
}

/*
 * Requests pipelined in one write are answered in order, at most
 * max_requests of them: the rest is never read as requests.
 */
static void test_http_pipelined_requests_in_order_and_bounded(void **state)
{
	struct fixture *f = *state;
	char req[1024] = "";
	const char *p;
	bool eof;
	int fd, i;

	http_server_set_max_requests(f->srv, 5);
	for (i = 0; i < 8; i++)
		strcat(req, i % 2 ? "GET /metrics HTTP/1.1\r\n\r\n" : "GET /health HTTP/1.1\r\n\r\n");
	fd = client_connect(f);
	assert_int_equal(send(fd, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
	assert_int_equal(read_health_replies(f, fd, 4, &eof), 3);
	assert_true(eof);
	assert_int_equal(f->calls, 5);
	assert_int_equal(count_of(f->rbuf, "HTTP/1.1 200 OK\r\n"), 5);
	assert_int_equal(count_of(f->rbuf, "Connection: close"), 1);
	/* in order: health, metrics, health, metrics, health */
	p = f->rbuf;
	for (i = 0; i < 5; i++) {
		const char *want = i % 2 ? "up 1\n" : "\r\n\r\nok\n";
		const char *at = strstr(p, want);

		assert_non_null(at);
		assert_true(strstr(p, i % 2 ? "\r\n\r\nok\n" : "up 1\n") == NULL ||
			    strstr(p, i % 2 ? "\r\n\r\nok\n" : "up 1\n") > at);
		p = at + strlen(want);
	}
	assert_non_null(strstr(strstr(f->rbuf, "up 1\nHTTP/1.1 200 OK\r\n") + 1,
				"Connection: close"));
	close(fd);
	pump_until_conns(f, 0);
}

/* fmt_i64() writes what "%lld" would, on every digit count and both ends of the range. */
static void test_fmt_i64_like_printf(void **state)
{
	int64_t vals[200];
	size_t nv = 0, i;
	int64_t p = 1;
	uint64_t x = 0x9e3779b97f4a7c15ULL;
	char got[24], want[24];

	(void)state;
	vals[nv++] = 0;
	vals[nv++] = INT64_MAX;
	vals[nv++] = INT64_MIN;
	vals[nv++] = INT64_MIN + 1;
	for (i = 0; i < 19; i++) {
		/* p = 10^i: every digit count, and its neighbours */
		vals[nv++] = p - 1;
		vals[nv++] = p;
		vals[nv++] = -p;
		vals[nv++] = -p + 1;
		if (i < 18)
			p *= 10;
	}
	while (nv < ARRAY_SIZE(vals)) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		vals[nv++] = (int64_t)(x >> (x % 60));
	}
	for (i = 0; i < nv; i++) {
		size_t len = fmt_i64(got, vals[i]);

		snprintf(want, sizeof(want), "%lld", (long long)vals[i]);
		assert_string_equal(got, want);
		assert_int_equal(len, strlen(want));
	}
	for (i = 0; i < 1000; i++) {
		fmt_i64(got, (int64_t)i);
		snprintf(want, sizeof(want), "%zu", i);
		assert_string_equal(got, want);
	}
}

static void test_http_server_addresses(void **state)
{
	static const char *const bad[] = {
		"", "127.0.0.1", "localhost:80", "127.0.0.1:99999", "127.0.0.1:-1",
		"127.0.0.1:", ":80", "[::1]", "[::1:80", "[]:80", "[zz]:80", "1.2.3.4.5:80",
	};
	struct ev_loop *loop = ev_loop_new(EVFLAG_AUTO);
	struct http_server *a, *b;
	char err[256], addr[64];
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(bad); i++) {
		err[0] = 0;
		a = http_server_new(loop, bad[i], false, handler, NULL, err, sizeof(err));
		if (a)
			fail_msg("'%s' accepted", bad[i]);
		assert_true(err[0] != 0);
	}
	/* a busy port fails without SO_REUSEPORT and is shared with it */
	a = http_server_new(loop, "127.0.0.1:0", true, handler, NULL, err, sizeof(err));
	assert_non_null(a);
	snprintf(addr, sizeof(addr), "127.0.0.1:%d", http_server_port(a));
	b = http_server_new(loop, addr, false, handler, NULL, err, sizeof(err));
	assert_null(b);
	b = http_server_new(loop, addr, true, handler, NULL, err, sizeof(err));
	assert_non_null(b);
	assert_int_equal(http_server_port(b), http_server_port(a));
	http_server_free(b);
	http_server_free(a);
	/* IPv6 loopback, when the host has it */
	a = http_server_new(loop, "[::1]:0", false, handler, NULL, err, sizeof(err));
	if (a)
		assert_true(http_server_port(a) > 0);
	else
		print_message("no IPv6 loopback here: %s\n", err);
	http_server_free(a);
	http_server_free(NULL);
	ev_loop_destroy(loop);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_topk_zipf_heavy_hitters_found),
		cmocka_unit_test(test_topk_memory_fixed_under_distinct_flood),
		cmocka_unit_test(test_topk_exact_below_k),
		cmocka_unit_test(test_topk_items_cut_at_64_bytes),
		cmocka_unit_test(test_topk_saturates_and_rejects_bad_k),
		cmocka_unit_test(test_hll_siphash13_vectors),
		cmocka_unit_test(test_hll_within_5_percent),
		cmocka_unit_test(test_hll_small_counts_and_clear),
		cmocka_unit_test(test_hll_merge_is_union),
		cmocka_unit_test(test_prom_label_and_help_escaping),
		cmocka_unit_test(test_prom_sample_values),
		cmocka_unit_test(test_prom_histogram_exact_text),
		cmocka_unit_test(test_http_reply_builder_bounds),
		cmocka_unit_test_setup_teardown(test_http_get_200_with_body, http_setup,
						http_teardown),
		cmocka_unit_test_setup_teardown(test_http_head_has_no_body, http_setup,
						http_teardown),
		cmocka_unit_test_setup_teardown(test_http_head_sent_byte_by_byte, http_setup,
						http_teardown),
		cmocka_unit_test_setup_teardown(test_http_404_from_handler, http_setup,
						http_teardown),
		cmocka_unit_test_setup_teardown(test_http_405_for_post, http_setup, http_teardown),
		cmocka_unit_test_setup_teardown(test_http_431_for_huge_head, http_setup,
						http_teardown),
		cmocka_unit_test_setup_teardown(test_http_garbage_is_rejected, http_setup,
						http_teardown),
		cmocka_unit_test(test_log_one_line),
		cmocka_unit_test_setup_teardown(test_http_connection_limit, http_setup,
						http_teardown),
		cmocka_unit_test_setup_teardown(test_http_deadline_closes_slow_clients, http_setup,
						http_teardown),
		cmocka_unit_test_setup_teardown(test_http_reply_over_bound_is_500, http_setup,
						http_teardown),
		cmocka_unit_test_setup_teardown(test_http_lent_body_handed_back_once, http_setup,
						http_teardown),
		cmocka_unit_test_setup_teardown(test_http_keep_alive_bounded, http_setup,
						http_teardown),
		cmocka_unit_test_setup_teardown(test_http_pipelined_requests_in_order_and_bounded,
						http_setup, http_teardown),
		cmocka_unit_test_setup_teardown(test_http_large_reply_written_in_pieces, http_setup,
						http_teardown),
		cmocka_unit_test(test_http_server_addresses),
		cmocka_unit_test(test_fmt_i64_like_printf),
	};

	log_set_level(LOG_ERR);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
