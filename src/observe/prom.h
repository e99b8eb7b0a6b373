/* SPDX-License-Identifier: MIT */
/*
 * Prometheus text exposition (format 0.0.4) written into an http_reply:
 * HELP/TYPE lines, samples with label sets, and a fixed-bucket histogram.
 *
 * Metric and label names are trusted (they come from code; check names that
 * come from configuration with prom_name_valid()). Label values and help
 * texts are escaped as the format requires (backslash, double quote in label
 * values, line feed), and bytes that are not valid UTF-8 become U+FFFD so a
 * client-supplied value can never break a scrape.
 *
 * Not for: metric storage or registration (see metrics.c), timestamps,
 * OpenMetrics-only features (exemplars, _created, # EOF).
 */
#ifndef AGENT_PROM_H
#define AGENT_PROM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compiler.h"

struct http_reply;

#define PROM_CONTENT_TYPE  "text/plain; version=0.0.4; charset=utf-8"
#define PROM_HIST_MAX      32      /* finite buckets per histogram */

enum prom_type {
	PROM_COUNTER   = 0,
	PROM_GAUGE     = 1,
	PROM_HISTOGRAM = 2,
	PROM_UNTYPED   = 3,
	PROM_TYPE_COUNT    /* sentinel */
};

/* One label of a sample. */
struct prom_label {
	const char *name;               /* ref: trusted label name */
	const char *value;              /* ref: any bytes, escaped on output */
};

/*
 * A histogram with fixed upper bounds (seconds for latencies), embeddable and
 * allocation-free. Bucket counts are stored per bucket and made cumulative
 * when rendered.
 */
struct prom_hist {
	size_t nbounds;                         /* finite bounds in use */
	double bounds[PROM_HIST_MAX];           /* ascending upper bounds (le) */
	uint64_t buckets[PROM_HIST_MAX + 1];    /* per bucket, last one is +Inf */
	uint64_t count;                         /* observations */
	double sum;                             /* sum of observations */
};

const char *prom_type_str(enum prom_type type);
bool prom_name_valid(const char *name);

void prom_family(struct http_reply *r, const char *name, enum prom_type type, const char *help);
void prom_sample_u64(struct http_reply *r, const char *name, const struct prom_label *labels,
		     size_t nlabels, uint64_t value);
void prom_sample_f64(struct http_reply *r, const char *name, const struct prom_label *labels,
		     size_t nlabels, double value);
void prom_append_label_value(struct http_reply *r, const char *value, size_t len);

int prom_hist_init(struct prom_hist *h, const double *bounds, size_t n) MUSTCHECK;
void prom_hist_init_latency(struct prom_hist *h);
void prom_hist_observe(struct prom_hist *h, double value);
void prom_hist_merge(struct prom_hist *dst, const struct prom_hist *src);
void prom_hist_render(struct http_reply *r, const char *name, const struct prom_label *labels,
		      size_t nlabels, const struct prom_hist *h);

#endif /* AGENT_PROM_H */
