/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the status page (src/observe/status.c) and of the request parser and
 * reply headers it relies on (src/net/http.c): hostile names and clients escaped
 * in HTML and JSON; the page's Content-Security-Policy allowing exactly
 * its own script and style; request lines read as the server answers them.
 */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "digest.h"
#include "http.h"
#include "metrics.h"
#include "status.h"
#include "util.h"

#define HOSTILE_RULE   "<script>alert(1)</script>\"'&"
#define HOSTILE_CLIENT "k:<img src=x onerror=alert(2)>"

/* A view with one row, one candidate row, one rule's offenders and one node, all hostile. */
static struct met_view *hostile_view(void)
{
	struct met_view *v = xcalloc(1, sizeof(*v));

	v->live = 1;
	v->started = 1000;
	v->rows = xcalloc(1, sizeof(*v->rows));
	v->nrows = 1;
	snprintf(v->rows[0].tier, MET_NAME, "%s", "t</td><b>");
	snprintf(v->rows[0].rule, MET_NAME, "%s", HOSTILE_RULE);
	v->rows[0].allowed = 7;
	v->rows[0].denied = 3;
	v->cand = xcalloc(1, sizeof(*v->cand));
	v->ncand = 1;
	snprintf(v->cand[0].tier, MET_NAME, "%s", "x");
	snprintf(v->cand[0].rule, MET_NAME, "%s", "c\"<&>");
	v->cand[0].would_deny = 2;
	v->tops = xcalloc(1, sizeof(*v->tops));
	v->ntop = 1;
	snprintf(v->tops[0].rule, MET_NAME, "%s", HOSTILE_RULE);
	v->tops[0].denied = 3;
	v->tops[0].n = 1;
	v->tops[0].e = xcalloc(1, sizeof(*v->tops[0].e));
	snprintf(v->tops[0].e[0].item, sizeof(v->tops[0].e[0].item), "%s", HOSTILE_CLIENT);
	v->tops[0].e[0].count = 3;
	v->nodes = xcalloc(1, sizeof(*v->nodes));
	v->nnodes = 1;
	snprintf(v->nodes[0].name, sizeof(v->nodes[0].name), "%s", "h\x01<i>:6379");
	snprintf(v->nodes[0].state, sizeof(v->nodes[0].state), "ready");
	v->nodes[0].lat[3] = 10;
	v->hist[0].t = 995;
	v->hist[1].t = 1000;
	v->hist[1].v[MR_ALLOWED] = 50;
	v->hist[1].v[MR_DENIED] = 25;
	v->nhist = 2;
	prom_hist_init_latency(&v->decision_lat);
	prom_hist_init_latency(&v->redis_lat);
	return v;
}

static const struct status_info info = {.version = "1.0<b>",
					.now = 1010,
					.store = "redis",
					.ready = true,
					.health = "down: \"<x>\"",
					.fallback = "fail-open limits allow"};

static void test_json_and_html_escaping(void **state)
{
	struct http_reply r;

	(void)state;
	http_reply_init(&r);
	status_json_str(&r, "a\"b\\c<d>e&f\n\x01\x7f");
	assert_string_equal(r.body, "\"a\\\"b\\\\c\\u003cd\\u003ee\\u0026f\\u000a\\u0001\\u007f\"");
	http_reply_release(&r);
	status_html_str(&r, "<a href=\"x\">'&'</a>\x02");
	assert_string_equal(r.body, "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;\xef\xbf\xbd");
	http_reply_release(&r);
}

static void test_hostile_names_never_reach_markup(void **state)
{
	struct met_view *v = hostile_view();
	struct http_reply r;

	(void)state;
	http_reply_init(&r);
	status_render_html(v, &info, &r);
	assert_false(r.broken);
	assert_string_equal(r.ctype, "text/html; charset=utf-8");
	assert_null(strstr(r.body, "<script>alert"));
	assert_null(strstr(r.body, "<img"));
	assert_null(strstr(r.body, "<i>"));
	assert_null(strstr(r.body, "</td><b>"));
	assert_null(strstr(r.body, "1.0<b>"));
	assert_non_null(strstr(r.body, "&lt;script&gt;alert(1)&lt;/script&gt;&quot;&#39;&amp;"));
	assert_non_null(strstr(r.body, "k:&lt;img src=x onerror=alert(2)&gt;"));
	assert_non_null(strstr(r.body, "down: &quot;&lt;x&gt;&quot;"));
	/* one script element: the page's own */
	assert_non_null(strstr(r.body, "<script>"));
	assert_null(strstr(strstr(r.body, "<script>") + 1, "<script"));
	/* the denial rate of the last step: 25 of 75 in 5 s */
	assert_non_null(strstr(r.body, "data-k=\"decisions.denied\">5<"));
	http_reply_release(&r);

	status_render_json(v, &info, &r);
	assert_false(r.broken);
	assert_null(strchr(r.body, '<'));
	assert_null(strchr(r.body, '>'));
	assert_non_null(strstr(r.body, "\"rule\":\"\\u003cscript\\u003ealert(1)\\u003c/script\\u003e"
				       "\\\"'\\u0026\""));
	assert_non_null(strstr(r.body, "\"client\":\"k:\\u003cimg src=x onerror=alert(2)\\u003e\""));
	assert_non_null(strstr(r.body, "\"schema\":1,"));
	http_reply_release(&r);

	metrics_view_free(v);
}

/*
 * A view of <nhist> history points 5 s apart, 100 decisions a step, of which
 * <base> denied per step, then <recent> denied per step over the last minute
 * (12 steps); its one row holds the totals (the step under way is empty).
 */
static struct met_view *denial_view(size_t nhist, unsigned base, unsigned recent)
{
	struct met_view *v = xcalloc(1, sizeof(*v));
	uint64_t allowed = 0, denied = 0;
	size_t i;

	v->live = 1;
	v->started = 1000;
	v->sum[MC_CONNS] = 1;
	for (i = 0; i < nhist; i++) {
		unsigned d = i + 12 >= nhist ? recent : base;

		if (i) {
			denied += d;
			allowed += 100 - d;
		}
		v->hist[i].t = 1000 + 5 * (int64_t)i;
		v->hist[i].v[MR_ALLOWED] = allowed;
		v->hist[i].v[MR_DENIED] = denied;
	}
	v->nhist = nhist;
	v->rows = xcalloc(1, sizeof(*v->rows));
	v->nrows = 1;
	snprintf(v->rows[0].tier, MET_NAME, "%s", "free");
	snprintf(v->rows[0].rule, MET_NAME, "%s", "r");
	v->rows[0].allowed = allowed;
	v->rows[0].denied = denied;
	prom_hist_init_latency(&v->decision_lat);
	prom_hist_init_latency(&v->redis_lat);
	return v;
}

/* Whether /status.json of <v> has the denials panel red, and a cause naming it. */
static bool denials_red(const struct met_view *v)
{
	static const struct status_info ok = {.version = "1", .now = 1600, .store = "redis",
					      .ready = true, .fallback = "open"};
	struct http_reply r;
	bool red, cause;

	http_reply_init(&r);
	status_render_json(v, &ok, &r);
	assert_false(r.broken);
	red = strstr(r.body, "\"denials\":true") != NULL;
	cause = strstr(r.body, "{\"panel\":\"denials\",\"what\":\"Denials: ") != NULL;
	assert_true(red == cause);
	http_reply_release(&r);
	return red;
}

/* Denials are judged against their own level: the share of the last minute against the
 * minutes before, red from base + max(base, 10 points), with 20 denials at least. */
static void test_denials_judged_against_their_own_level(void **state)
{
	static const struct {
		size_t nhist;
		unsigned base, recent;
		bool red;
	} cases[] = {
		{120, 30, 30, false},   /* a public API's ordinary day: 30% all along */
		{120, 30, 55, false},   /* ... under 60%: not red */
		{120, 30, 60, true},    /* ... twice its usual share */
		{120, 0, 9, false},     /* from nothing: under 10 points */
		{120, 0, 10, true},     /* ... 10 points */
		{120, 0, 1, false},     /* 12 denials in the minute: too few to judge */
		{20, 0, 90, false},     /* less than a minute before the last: not judged */
		{25, 0, 90, true},      /* a minute of it: judged */
	};
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct met_view *v = denial_view(cases[i].nhist, cases[i].base, cases[i].recent);

		if (denials_red(v) != cases[i].red)
			fail_msg("case %zu: base %u%%, recent %u%%: want red %d", i, cases[i].base,
				 cases[i].recent, cases[i].red);
		metrics_view_free(v);
	}
}

/* The degraded panel follows the state now: red with degraded answers in the step under
 * way (none in the history yet), and with a node not answering; not red otherwise. */
static void test_degraded_panel_follows_the_state_now(void **state)
{
	static const struct status_info ok = {.version = "1", .now = 1600, .store = "redis",
					      .ready = true, .fallback = "open"};
	struct met_view *v = denial_view(30, 0, 0);
	struct http_reply r;

	(void)state;
	http_reply_init(&r);
	status_render_json(v, &ok, &r);
	assert_non_null(strstr(r.body, "\"degraded\":false"));
	assert_non_null(strstr(r.body, "\"state\":\"ok\",\"causes\":[]"));
	http_reply_release(&r);
	v->rows[0].degraded = 3;        /* after the last point: the step under way */
	status_render_json(v, &ok, &r);
	assert_non_null(strstr(r.body, "\"degraded\":true"));
	assert_non_null(strstr(r.body, "\"state\":\"ok\""));  /* Redis is fine */
	assert_non_null(strstr(r.body, "Degraded answers: 3 in the step under way"));
	assert_non_null(strstr(r.body, "meanwhile the failure ladder answers: open"));
	http_reply_release(&r);
	v->rows[0].degraded = 0;
	v->nodes = xcalloc(1, sizeof(*v->nodes));
	v->nnodes = 1;
	snprintf(v->nodes[0].name, sizeof(v->nodes[0].name), "%s", "127.0.0.1:6379");
	snprintf(v->nodes[0].state, sizeof(v->nodes[0].state), "%s", "not answering");
	v->nodes[0].oldest_s = 4.5;
	status_render_json(v, &ok, &r);
	assert_non_null(strstr(r.body, "\"redis\":true,\"degraded\":true"));
	assert_non_null(strstr(r.body, "{\"panel\":\"redis\",\"what\":\"Redis 127.0.0.1:6379 not "
				       "answering, its oldest command unanswered for 4.5 s\","
				       "\"since\":1595}"));
	assert_non_null(strstr(r.body, "\"oldest_ms\":4500"));
	http_reply_release(&r);
	metrics_view_free(v);
}

/* The base64 of <n> bytes at <in>. */
static void b64(const uint8_t *in, size_t n, char *out)
{
	static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t i, o = 0;
	uint32_t x;

	for (i = 0; i < n; i += 3) {
		x = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0) |
		    (i + 2 < n ? in[i + 2] : 0);
		out[o++] = a[x >> 18];
		out[o++] = a[(x >> 12) & 63];
		out[o++] = i + 1 < n ? a[(x >> 6) & 63] : '=';
		out[o++] = i + 2 < n ? a[x & 63] : '=';
	}
	out[o] = 0;
}

/* The hash source of the element <tag> of <body>, as CSP computes it. */
static void element_hash(const char *body, const char *tag, char *out)
{
	char open[16], close[16];
	const char *s, *e;
	uint8_t h[SHA256_LEN];

	snprintf(open, sizeof(open), "<%s>", tag);
	snprintf(close, sizeof(close), "</%s>", tag);
	s = strstr(body, open);
	assert_non_null(s);
	s += strlen(open);
	e = strstr(s, close);
	assert_non_null(e);
	sha256(s, (size_t)(e - s), h);
	strcpy(out, "'sha256-");
	b64(h, sizeof(h), out + strlen(out));
	strcat(out, "'");
}

static void test_csp_allows_exactly_the_page_own_script_and_style(void **state)
{
	struct met_view *v = hostile_view();
	char js[64], css[64], want[400];
	struct http_reply r;

	(void)state;
	http_reply_init(&r);
	status_render_html(v, &info, &r);
	element_hash(r.body, "script", js);
	element_hash(r.body, "style", css);
	snprintf(want, sizeof(want),
		 "Content-Security-Policy: default-src 'none'; script-src %s; style-src %s; "
		 "img-src data:; connect-src 'self'; base-uri 'none'; form-action 'none'; "
		 "frame-ancestors 'none'\r\n",
		 js, css);
	assert_non_null(strstr(r.headers, want));
	/* nosniff: the HTTP server's own, on every route (test_metrics_door.py) */
	/* nothing loaded from anywhere: no element with a source, no stylesheet link or url() */
	assert_null(strstr(r.body, "src=\""));
	assert_null(strstr(r.body, "<link"));
	assert_null(strstr(r.body, "url("));
	assert_null(strstr(r.body, "@import"));
	assert_null(strstr(r.body, "href=\"http"));
	http_reply_release(&r);
	metrics_view_free(v);
}

static void test_reply_headers_refuse_injection(void **state)
{
	struct http_reply r;
	char big[HTTP_HEADERS_MAX];

	(void)state;
	http_reply_init(&r);
	http_reply_header(&r, "X-A", "1");
	assert_false(r.broken);
	assert_string_equal(r.headers, "X-A: 1\r\n");
	http_reply_header(&r, "X-B", "a\r\nSet-Cookie: x=1");
	assert_true(r.broken);
	http_reply_release(&r);
	assert_int_equal(r.hlen, 0);
	http_reply_header(&r, "X B", "1");
	assert_true(r.broken);
	http_reply_release(&r);
	http_reply_header(&r, "", "1");
	assert_true(r.broken);
	http_reply_release(&r);
	memset(big, 'v', sizeof(big) - 1);
	big[sizeof(big) - 1] = 0;
	http_reply_header(&r, "X-Big", big);
	assert_true(r.broken);
	http_reply_release(&r);
}

/* <line> parsed: "status head path". */
static const char *parse(const char *line)
{
	static char out[300];
	char buf[256];
	struct http_request req;

	snprintf(buf, sizeof(buf), "%s", line);
	http_request_parse(buf, strlen(buf), &req);
	snprintf(out, sizeof(out), "%d %d %s", req.status, req.head, req.path ? req.path : "-");
	return out;
}

static void test_request_line(void **state)
{
	(void)state;
	assert_string_equal(parse("GET /status HTTP/1.1"), "0 0 /status");
	assert_string_equal(parse("HEAD /status.json?x#y HTTP/1.0"), "0 1 /status.json");
	assert_string_equal(parse("GET http://h:1/top?q HTTP/1.1"), "0 0 /top");
	assert_string_equal(parse("GET https://h HTTP/1.1"), "0 0 /");
	assert_string_equal(parse("GET ftp://h/ HTTP/1.1"), "400 0 -");
	assert_string_equal(parse("POST / HTTP/1.1"), "405 0 -");
	assert_string_equal(parse("GET / HTTP/2.0"), "505 0 -");
	assert_string_equal(parse("HEAD / HTTP/2.0"), "505 1 -");
	assert_string_equal(parse("GET / HTTP/1.1 "), "400 0 -");
	assert_string_equal(parse("GET  / HTTP/1.1"), "400 0 -");
	assert_string_equal(parse("G(T / HTTP/1.1"), "400 0 -");
	assert_string_equal(parse("GET /\x7f HTTP/1.1"), "400 0 -");
	assert_string_equal(parse(""), "400 0 -");
	assert_string_equal(parse("GET"), "400 0 -");
}

static void test_head_scan_resumes_and_pipelines(void **state)
{
	const char *in = "\r\nGET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\n\n";
	struct http_scan st = {0};
	size_t len = strlen(in), i, end = 0;
	ssize_t n = -1;

	(void)state;
	for (i = 1; i <= len; i++) {
		n = http_head_scan(&st, in, i, &end);
		if (n >= 0)
			break;
	}
	assert_int_equal(n, strlen("GET /a HTTP/1.1"));
	assert_int_equal(st.start, 2);
	assert_int_equal(end, strlen("\r\nGET /a HTTP/1.1\r\nHost: x\r\n\r\n"));
	assert_int_equal(i, end);
	memset(&st, 0, sizeof(st));
	n = http_head_scan(&st, in + end, len - end, &i);
	assert_int_equal(n, strlen("GET /b HTTP/1.1"));
	assert_int_equal(i, len - end);
	memset(&st, 0, sizeof(st));
	assert_int_equal(http_head_scan(&st, "GET / HTTP/1.1\r\n\r", 17, &end), -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_json_and_html_escaping),
		cmocka_unit_test(test_hostile_names_never_reach_markup),
		cmocka_unit_test(test_denials_judged_against_their_own_level),
		cmocka_unit_test(test_degraded_panel_follows_the_state_now),
		cmocka_unit_test(test_csp_allows_exactly_the_page_own_script_and_style),
		cmocka_unit_test(test_reply_headers_refuse_injection),
		cmocka_unit_test(test_request_line),
		cmocka_unit_test(test_head_scan_resumes_and_pipelines),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
