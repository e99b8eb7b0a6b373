/* SPDX-License-Identifier: MIT */
/*
 * The rate-limit algorithms as pure functions: GCRA (token bucket), fixed
 * window, sliding log and sliding window counter, and the concurrency limit
 * (slots of requests in flight, each a lease). They are the reference
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
	ALG_GCRA           = 1,    /* a = interval T, b = tau + k (see below) */
	ALG_FIXED_WINDOW   = 2,    /* a = window (us), b = limit */
	ALG_SLIDING_LOG    = 3,    /* a = window (us), b = limit */
	ALG_SLIDING_WINDOW = 4,    /* a = window (us), b = limit */
	ALG_FIXED_MONTH    = 5,    /* fixed_window on calendar months (UTC): a = 1, b = limit */
	ALG_CONCURRENCY    = 6,    /* requests in flight: a = a slot's lease (us), b = slots */
	ALG_COUNT                  /* sentinel */
};

/*
 * GCRA parameters. The emission interval T = period / rate is a binary fixed
 * point number: a = T in ticks of 2^-k us (rounded), b = tau + k where the
 * burst tolerance tau = burst x a is a multiple of a and k = b mod a (a > k
 * always; b / a is the burst). k is the largest of 0..GCRA_K_MAX such that
 * tau <= GCRA_TAU_MAX: then a > GCRA_TAU_MAX / 2 / burst - 1 >= 2^19 for
 * every burst up to 10^9 (and a >= 2^40 x 10^-6 us at k = GCRA_K_MAX), so the
 * admitted rate is off by at most 0.5 / a < 10^-6 relative, whatever the
 * rate. With k = 0, a and b are the emission interval and tau in whole
 * microseconds: the parameters of earlier versions read the same.
 *
 * The state is the TAT as whole microseconds of Redis time plus a fraction in
 * ticks; computations are relative to now, in ticks, and every intermediate
 * stays below 2^53 (exact in the script's doubles; int64 in C):
 *   d (what the bucket owes) <= GCRA_DEBT_MAX = 2^51, a cost is clamped to
 *   +-(floor(GCRA_DEBT_MAX / a) + 1) tokens, so |cost x a| < 2^52 (a refund
 *   that large empties any debt), |d + cost x a| < 2^53, and the stored TAT
 *   now + d / 2^k < 2^53 while now < 2^52 us (until the year 2112).
 */
#define GCRA_K_MAX      40                      /* ticks of at least 2^-40 us */
#define GCRA_TAU_MAX    (INT64_C(1) << 50)      /* ticks of burst tolerance */
#define GCRA_DEBT_MAX   (INT64_C(1) << 51)      /* ticks a bucket may owe */

/*
 * Configurations: burst x period / rate at most 2^49 us (~17.8 years), so a
 * limit and its local variant (rules.c: the same tolerance plus at most one
 * interval of at most 366 days) both fit GCRA_TAU_MAX at k = 0.
 */
#define LIMIT_TAU_MAX_US (INT64_C(1) << 49)

/*
 * A calendar month, the period "1mo" (fixed_window only). Where one number
 * must stand for it (the policy header's window, rates per second), it is the
 * mean Gregorian month: 30.436875 days.
 */
#define LIMIT_MONTH     "1mo"
#define LIMIT_MONTH_MS  UINT64_C(2629746000)

/* Window algorithms: counts (and costs) are clamped to this, exact in doubles. */
#define LIMIT_COUNT_MAX (INT64_C(1) << 50)

/*
 * Sliding log: a script call's work grows with the entries it trims and adds
 * while Redis serves nobody else. A limit holds at most LOG_RATE_MAX entries
 * per window (config), a call adds or refunds at most LOG_ADD_MAX of them (a
 * cost above is never admitted) and a log never holds more than its limit +
 * LOG_ADD_MAX entries (reports): see doc/configuration.md, "Precision and
 * bounds", for the worst call measured.
 */
#define LOG_RATE_MAX    1000
#define LOG_ADD_MAX     100

/*
 * Concurrency: a request holds a slot, a number the agent draws (1 to
 * CONC_SLOT_MAX, unique among the fleet's slots held), from its admission to
 * its response, and at most max_duration: every slot is a lease that ends by
 * itself (a gateway that died, a client gone before its response). The cost
 * of a concurrency limit is the slot: > 0 takes it, < 0 gives it back, 0
 * reports. A denied request's Retry-After is when the oldest lease ends, at
 * most CONC_RETRY_MAX_US (a slot is usually given back long before).
 */
#define CONC_SLOT_MAX           ((INT64_C(1) << 50) - 1)
#define CONC_RETRY_MAX_US       INT64_C(1000000)
#define CONC_LEASE_MIN_MS       100
#define CONC_LEASE_MAX_MS       (86400 * 1000)

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
	int64_t x, y, z;        /* gcra: tat (us), fraction (ticks); windows: index, count, previous */
	int64_t *log;           /* owned: sliding log timestamps, oldest first; concurrency:
				 * pairs of slot and lease end (us), in the order taken */
	size_t nlog, caplog;
};

int limit_alg_parse(const char *name);
int64_t limit_month_index(int64_t now_us);
int64_t limit_month_start_us(int64_t idx);
int limit_params_init(struct limit_params *p, int alg, uint64_t rate, uint64_t period_ms,
		      uint64_t burst);
int limit_params_check(int alg, uint64_t rate, uint64_t period_ms, uint64_t burst);
bool limit_decide(const struct limit_params *p, struct limit_state *st, size_t n,
		  const int64_t *cost, int64_t now_us, struct limit_verdict *out);
void limit_report(const struct limit_params *p, struct limit_state *st, size_t n,
		  const int64_t *cost, int64_t now_us, struct limit_verdict *out);
void limit_state_release(struct limit_state *st);

#endif /* AGENT_LIMITER_H */
