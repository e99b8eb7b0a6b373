/* SPDX-License-Identifier: MIT */
/*
 * Prometheus text format 0.0.4 writer. Every function appends to an
 * http_reply and inherits its bound: past HTTP_REPLY_MAX the scrape becomes
 * a 500, never a truncated exposition.
 */
#include "prom.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http.h"

static const char *const prom_type_names[PROM_TYPE_COUNT] = {
	"counter", "gauge", "histogram", "untyped",
};

/* Returns the exposition keyword of <type>. */
const char *prom_type_str(enum prom_type type)
{
	if ((unsigned)type >= PROM_TYPE_COUNT)
		return "untyped";
	return prom_type_names[type];
}

/*
 * True if <name> is a valid metric name, [a-zA-Z_:][a-zA-Z0-9_:]*. (Label
 * names follow the same rule without ':'.)
 */
bool prom_name_valid(const char *name)
{
	size_t i;

	if (!name || !name[0])
		return false;
	for (i = 0; name[i]; i++) {
		char ch = name[i];

		if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_' || ch == ':')
			continue;
		if (i > 0 && ch >= '0' && ch <= '9')
			continue;
		return false;
	}
	return true;
}

/*
 * Returns the length of the valid UTF-8 sequence at <p> (<n> bytes left), or
 * 0 if it is not one: overlong forms, surrogates and code points above
 * U+10FFFF are invalid (RFC 3629).
 */
static size_t utf8_seq(const unsigned char *p, size_t n)
{
	unsigned char c = p[0], lo = 0x80, hi = 0xbf;
	size_t need, i;

	if (c < 0x80)
		return 1;
	if (c < 0xc2 || c > 0xf4)
		return 0;
	if (c < 0xe0) {
		need = 2;
	} else if (c < 0xf0) {
		need = 3;
		if (c == 0xe0)
			lo = 0xa0;
		else if (c == 0xed)
			hi = 0x9f;
	} else {
		need = 4;
		if (c == 0xf0)
			lo = 0x90;
		else if (c == 0xf4)
			hi = 0x8f;
	}
	if (n < need || p[1] < lo || p[1] > hi)
		return 0;
	for (i = 2; i < need; i++)
		if (p[i] < 0x80 || p[i] > 0xbf)
			return 0;
	return need;
}

/*
 * Appends the <len> bytes at <s> escaped: backslash and line feed always,
 * double quote when <quote> (label values); invalid UTF-8 bytes become
 * U+FFFD. Safe runs are appended in one piece.
 */
static void append_escaped(struct http_reply *r, const char *s, size_t len, bool quote)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t i = 0, run = 0;

	while (i < len) {
		const char *esc = NULL;
		size_t n = utf8_seq(p + i, len - i);

		if (n == 0)
			esc = "\xef\xbf\xbd";
		else if (p[i] == '\\')
			esc = "\\\\";
		else if (p[i] == '\n')
			esc = "\\n";
		else if (p[i] == '"' && quote)
			esc = "\\\"";
		if (!esc) {
			i += n;
			continue;
		}
		http_reply_append(r, s + run, i - run);
		http_reply_append(r, esc, strlen(esc));
		i += n ? n : 1;
		run = i;
	}
	http_reply_append(r, s + run, len - run);
}

/*
 * Appends the label value <value> of <len> bytes, escaped, without the
 * surrounding quotes. For callers that write label sets by hand.
 */
void prom_append_label_value(struct http_reply *r, const char *value, size_t len)
{
	append_escaped(r, value, len, true);
}

/*
 * Formats <v> as the format expects: +Inf, -Inf, NaN, or the shortest of
 * %.15g/%.16g/%.17g that reads back as <v>. <buf> holds at least 32 bytes.
 */
static void fmt_double(char *buf, size_t len, double v)
{
	int prec;

	if (isnan(v)) {
		snprintf(buf, len, "NaN");
		return;
	}
	if (isinf(v)) {
		snprintf(buf, len, "%s", v > 0 ? "+Inf" : "-Inf");
		return;
	}
	for (prec = 15; prec < 17; prec++) {
		snprintf(buf, len, "%.*g", prec, v);
		if (strtod(buf, NULL) == v)
			return;
	}
	snprintf(buf, len, "%.17g", v);
}

/*
 * Writes "{a="x",b="y"}" for <labels>, plus a last label <extra>="<extra_value>"
 * (not escaped: made by us) if <extra> is not NULL. Nothing without labels.
 */
static void write_labels(struct http_reply *r, const struct prom_label *labels, size_t nlabels,
			 const char *extra, const char *extra_value)
{
	size_t i;

	if (nlabels == 0 && !extra)
		return;
	http_reply_append(r, "{", 1);
	for (i = 0; i < nlabels; i++) {
		if (i)
			http_reply_append(r, ",", 1);
		http_reply_printf(r, "%s=\"", labels[i].name);
		append_escaped(r, labels[i].value, strlen(labels[i].value), true);
		http_reply_append(r, "\"", 1);
	}
	if (extra)
		http_reply_printf(r, "%s%s=\"%s\"", nlabels ? "," : "", extra, extra_value);
	http_reply_append(r, "}", 1);
}

/*
 * Writes the "# HELP <name> <help>" (help escaped) and "# TYPE <name> <type>"
 * lines that open a metric family. <help> may be NULL: no HELP line.
 */
void prom_family(struct http_reply *r, const char *name, enum prom_type type, const char *help)
{
	if (help) {
		http_reply_printf(r, "# HELP %s ", name);
		append_escaped(r, help, strlen(help), false);
		http_reply_append(r, "\n", 1);
	}
	http_reply_printf(r, "# TYPE %s %s\n", name, prom_type_str(type));
}

/* Writes the sample "<name>{<labels>} <value>" (counters, integer gauges). */
void prom_sample_u64(struct http_reply *r, const char *name, const struct prom_label *labels,
		     size_t nlabels, uint64_t value)
{
	http_reply_printf(r, "%s", name);
	write_labels(r, labels, nlabels, NULL, NULL);
	http_reply_printf(r, " %llu\n", (unsigned long long)value);
}

/* Writes the sample "<name>{<labels>} <value>" with a float value. */
void prom_sample_f64(struct http_reply *r, const char *name, const struct prom_label *labels,
		     size_t nlabels, double value)
{
	char num[40];

	fmt_double(num, sizeof(num), value);
	http_reply_printf(r, "%s", name);
	write_labels(r, labels, nlabels, NULL, NULL);
	http_reply_printf(r, " %s\n", num);
}

/* ---------------------------------------------------------------- histograms */

/*
 * Prepares <h> with the <n> finite upper <bounds> (copied), which must be
 * strictly ascending and finite; +Inf is implicit. Returns 0, or -1 if <n> is
 * 0 or above PROM_HIST_MAX or the bounds are not as required (<h> is then
 * left empty with no finite bound).
 */
int prom_hist_init(struct prom_hist *h, const double *bounds, size_t n)
{
	size_t i;

	memset(h, 0, sizeof(*h));
	if (n == 0 || n > PROM_HIST_MAX)
		return -1;
	for (i = 0; i < n; i++) {
		if (!isfinite(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1])))
			return -1;
	}
	memcpy(h->bounds, bounds, n * sizeof(*bounds));
	h->nbounds = n;
	return 0;
}

/* Prepares <h> with latency buckets from 100 us to 1 s (in seconds). */
void prom_hist_init_latency(struct prom_hist *h)
{
	static const double latency[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
					 0.025,  0.05,    0.1,    0.25,  0.5,    1};

	BUG_ON(prom_hist_init(h, latency, ARRAY_SIZE(latency)) != 0);
}

/*
 * Counts <value> in the first bucket whose bound is >= <value> (+Inf if
 * none) and adds it to the sum. NaN is ignored. O(log buckets).
 */
void prom_hist_observe(struct prom_hist *h, double value)
{
	size_t lo = 0, hi = h->nbounds;

	if (isnan(value))
		return;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (value <= h->bounds[mid])
			hi = mid;
		else
			lo = mid + 1;
	}
	h->buckets[lo]++;
	h->count++;
	h->sum += value;
}

/* Adds the observations of <src> to <dst>; both must have the same bounds. */
void prom_hist_merge(struct prom_hist *dst, const struct prom_hist *src)
{
	size_t i;

	BUG_ON(dst->nbounds != src->nbounds ||
	       memcmp(dst->bounds, src->bounds, src->nbounds * sizeof(double)) != 0);
	for (i = 0; i <= src->nbounds; i++)
		dst->buckets[i] += src->buckets[i];
	dst->count += src->count;
	dst->sum += src->sum;
}

/*
 * Writes the samples of <h> as the histogram <name>: one cumulative
 * <name>_bucket per bound with an "le" label appended to <labels>, the +Inf
 * bucket, then <name>_sum and <name>_count. The HELP/TYPE lines are the
 * caller's (prom_family() with PROM_HISTOGRAM), once per family.
 */
void prom_hist_render(struct http_reply *r, const char *name, const struct prom_label *labels,
		      size_t nlabels, const struct prom_hist *h)
{
	uint64_t cum = 0;
	char num[40];
	size_t i;

	for (i = 0; i <= h->nbounds; i++) {
		cum += h->buckets[i];
		if (i < h->nbounds)
			fmt_double(num, sizeof(num), h->bounds[i]);
		else
			snprintf(num, sizeof(num), "+Inf");
		http_reply_printf(r, "%s_bucket", name);
		write_labels(r, labels, nlabels, "le", num);
		http_reply_printf(r, " %llu\n", (unsigned long long)cum);
	}
	fmt_double(num, sizeof(num), h->sum);
	http_reply_printf(r, "%s_sum", name);
	write_labels(r, labels, nlabels, NULL, NULL);
	http_reply_printf(r, " %s\n", num);
	http_reply_printf(r, "%s_count", name);
	write_labels(r, labels, nlabels, NULL, NULL);
	http_reply_printf(r, " %llu\n", (unsigned long long)h->count);
}
