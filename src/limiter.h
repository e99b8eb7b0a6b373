/* SPDX-License-Identifier: MIT */
/*
 * The rate-limit algorithms as pure functions: GCRA (token bucket), fixed
 * window, sliding log and sliding window counter. They are the reference
 * models that lua/ is tested against operation for operation (same integer
 * and double arithmetic in the same order), and the engine of in-process
 * stores.
 */
#ifndef AGENT_LIMITER_H
#define AGENT_LIMITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Algorithm ids, as passed to the Redis script. */
enum limit_alg {
	ALG_NONE           = 0,
	ALG_GCRA           = 1,    /* a = emission interval (us), b = tau (us) */
	ALG_FIXED_WINDOW   = 2,    /* a = window (us), b = limit */
	ALG_SLIDING_LOG    = 3,    /* a = window (us), b = limit */
	ALG_SLIDING_WINDOW = 4,    /* a = window (us), b = limit */
	ALG_COUNT                  /* sentinel */
};

/* One limit as the script sees it. */
struct limit_params {
	uint8_t alg;            /* enum limit_alg */
	bool shadow;            /* evaluated and reported, never denies */
	int64_t a;              /* first parameter (see enum limit_alg) */
	int64_t b;              /* second parameter */
};

/* What one limit said about one request (same fields as the script returns). */
struct limit_verdict {
	bool allowed;           /* this limit admits the request */
	int64_t remaining;      /* tokens left (after the charge if the request passed) */
	int64_t retry_ms;       /* until this limit admits the cost; 0 if it does */
	int64_t reset_ms;       /* until the limit is fully available again */
};

/* The state of one limit in the C model (what Redis keeps in its key). */
struct limit_state {
	int64_t x, y, z;        /* gcra: tat; windows: index, count, previous */
	int64_t *log;           /* owned: sliding log timestamps, oldest first */
	size_t nlog, caplog;
};

int limit_alg_parse(const char *name);
void limit_params_init(struct limit_params *p, int alg, uint64_t rate, uint64_t period_ms,
		       uint64_t burst);
bool limit_decide(const struct limit_params *p, struct limit_state *st, size_t n,
		  const int64_t *cost, int64_t now_us, struct limit_verdict *out);
void limit_state_release(struct limit_state *st);

#endif /* AGENT_LIMITER_H */
