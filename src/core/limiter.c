/* SPDX-License-Identifier: MIT */
/*
 * C models of lua/ (see lua/00_prelude.lua for the shared contract). Each
 * check function mirrors its script: it computes the verdict without changing
 * the state, and apply() performs the script's commit.
 */
#include "limiter.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* What a check found, before the driver decides to charge (cf. the scripts). */
struct check {
	bool ok;
	int64_t rem_c, rem_u, retry, reset_c, reset_u;
	int64_t n1, n2, n3;     /* values the commit writes */
};

static int64_t clamp0(int64_t x)
{
	return x < 0 ? 0 : x;
}

/* ceil(us / 1000) for us >= 0, as math.ceil does on the exact quotient */
static int64_t ceil_ms(int64_t us)
{
	return us <= 0 ? 0 : (us + 999) / 1000;
}

static const char *const alg_names[ALG_COUNT] = {"none", "gcra", "fixed_window", "sliding_log",
						 "sliding_window", "fixed_window", "concurrency"};

/* The algorithm called <name> ("token_bucket" is GCRA), or -1. */
int limit_alg_parse(const char *name)
{
	int i;

	if (strcmp(name, "token_bucket") == 0)
		return ALG_GCRA;
	for (i = 1; i < ALG_COUNT; i++)
		if (i != ALG_FIXED_MONTH && i != ALG_CONCURRENCY && strcmp(name, alg_names[i]) == 0)
			return i;
	return -1;
}

/* <a> / <b> rounded down, for b > 0 and any sign of a */
static int64_t floordiv(int64_t a, int64_t b)
{
	return a / b - (a % b != 0 && a < 0);
}

/*
 * Calendar months in UTC, as lua/fixed_window.lua computes them (the civil
 * calendar's days from 1970-01-01 and back, in eras of 400 years: exact for
 * any date, no table, no time zone). A month's index is year x 12 + month - 1.
 */
int64_t limit_month_index(int64_t now_us)
{
	int64_t z = floordiv(now_us, INT64_C(86400000000)) + 719468;
	int64_t era = floordiv(z, 146097);
	int64_t doe = z - era * 146097;
	int64_t yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
	int64_t doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
	int64_t mp = (5 * doy + 2) / 153;
	int64_t m = mp < 10 ? mp + 3 : mp - 9;
	int64_t y = yoe + era * 400 + (m <= 2);

	return y * 12 + m - 1;
}

/* The first microsecond of month <idx> (limit_month_index()). */
int64_t limit_month_start_us(int64_t idx)
{
	int64_t m = idx - floordiv(idx, 12) * 12 + 1, y = floordiv(idx, 12) - (m <= 2);
	int64_t era = floordiv(y, 400);
	int64_t yoe = y - era * 400;
	int64_t doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5;
	int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;

	return (era * 146097 + doe - 719468) * INT64_C(86400000000);
}

/* <x> clamped to [-<m>, <m>] */
static int64_t clampm(int64_t x, int64_t m)
{
	return x > m ? m : (x < -m ? -m : x);
}

/* round(period_us x 2^k / rate) without overflow (period_us < 2^45, k <= 40) */
static int64_t gcra_ticks(uint64_t period_us, uint64_t rate, int k)
{
	unsigned __int128 n = ((unsigned __int128)period_us << k) + rate / 2;

	n /= rate;
	return n > (unsigned __int128)INT64_MAX ? INT64_MAX : (int64_t)n;
}

/*
 * Checks that <rate> tokens per <period_ms> with a bucket of <burst> tokens (0:
 * rate) can be represented exactly enough (see LIMIT_TAU_MAX_US). Returns 0,
 * or -1 when the burst tolerance burst x period / rate is too long. Only GCRA
 * has such a bound; the window algorithms take any rate and period.
 */
int limit_params_check(int alg, uint64_t rate, uint64_t period_ms, uint64_t burst)
{
	unsigned __int128 tau;

	if (alg != ALG_GCRA)
		return 0;
	if (!rate || !period_ms || period_ms > 366ULL * 86400000)
		return -1;
	if (!burst)
		burst = rate;
	tau = (unsigned __int128)burst * period_ms * 1000;
	return tau > (unsigned __int128)LIMIT_TAU_MAX_US * rate ? -1 : 0;
}

/*
 * Fills <p> for <rate> tokens per <period_ms>. For GCRA, <burst> is the bucket
 * size (0: same as rate) and the interval a fixed point number (see
 * limiter.h); a burst beyond what GCRA_TAU_MAX holds is reduced to fit and
 * -1 returned (configurations are checked before: limit_params_check()). For
 * the window algorithms the limit is <rate> per window of <period_ms>.
 * Returns 0 otherwise.
 */
int limit_params_init(struct limit_params *p, int alg, uint64_t rate, uint64_t period_ms,
		      uint64_t burst)
{
	uint64_t period_us;
	int64_t t;
	int k, ret = 0;

	memset(p, 0, sizeof(*p));
	p->alg = (uint8_t)alg;
	if (period_ms > 366ULL * 86400000) {
		period_ms = 366ULL * 86400000;
		ret = -1;
	}
	period_us = period_ms * 1000;
	if (alg == ALG_CONCURRENCY) { /* <rate> slots, leases of <period_ms> */
		p->a = period_us ? (int64_t)period_us : 1;
		p->b = rate > (uint64_t)LIMIT_COUNT_MAX ? LIMIT_COUNT_MAX : (int64_t)rate;
		return ret;
	}
	if (alg != ALG_GCRA) {
		p->a = period_us && alg != ALG_FIXED_MONTH ? (int64_t)period_us : 1;
		p->b = rate > (uint64_t)LIMIT_COUNT_MAX ? LIMIT_COUNT_MAX : (int64_t)rate;
		return ret;
	}
	if (!rate)
		rate = 1;
	if (!burst)
		burst = rate;
	/* the finest tick at which burst x a still fits */
	for (k = 0; k < GCRA_K_MAX; k++) {
		t = gcra_ticks(period_us, rate, k + 1);
		if ((unsigned __int128)t * burst > GCRA_TAU_MAX)
			break;
	}
	t = gcra_ticks(period_us, rate, k);
	if (t < GCRA_K_MAX + 1) /* a > k: only for intervals below 2^-34 us */
		t = GCRA_K_MAX + 1;
	if (t > GCRA_TAU_MAX)
		t = GCRA_TAU_MAX;
	if ((unsigned __int128)t * burst > GCRA_TAU_MAX) {
		burst = (uint64_t)(GCRA_TAU_MAX / t);
		ret = -1;
	}
	p->a = t;
	p->b = t * (int64_t)burst + k;
	return ret;
}

/*
 * GCRA, computed in ticks relative to <now> (see limiter.h for the bounds):
 * d is what the bucket owes (TAT - now), a charge adds cost x T, a refund
 * never goes past a full bucket, and the debt is capped at GCRA_DEBT_MAX (a
 * report of more than fits owes at most that much: at least two whole
 * buckets). A fraction left over from another k (the rate changed) is
 * clamped into the current tick, an error below 1 us.
 */
static void check_gcra(const struct limit_params *p, const struct limit_state *st, int64_t now,
		       int64_t cost, struct check *c)
{
	int64_t T = p->a, k, tau, one, d, nd;

	if (T < 1 || T > GCRA_TAU_MAX || p->b < 0 || p->b > GCRA_TAU_MAX + GCRA_K_MAX ||
	    p->b % T > GCRA_K_MAX) { /* not from limit_params_init(): the script refuses it */
		c->ok = true;
		return;
	}
	k = p->b % T;
	tau = p->b - k;
	one = INT64_C(1) << k;
	if (st->x < now)
		d = 0;
	else if (st->x - now > GCRA_DEBT_MAX >> k)
		d = GCRA_DEBT_MAX;
	else
		d = ((st->x - now) << k) + (st->y < 0 ? 0 : (st->y < one ? st->y : one - 1));
	if (d > GCRA_DEBT_MAX)
		d = GCRA_DEBT_MAX;
	nd = d + clampm(cost, GCRA_DEBT_MAX / T + 1) * T;
	if (nd < 0) /* a refund never goes past full */
		nd = 0;
	if (nd > GCRA_DEBT_MAX)
		nd = GCRA_DEBT_MAX;
	c->ok = nd <= tau;
	c->rem_c = clamp0(tau - nd) / T;
	c->rem_u = clamp0(tau - d) / T;
	c->retry = c->ok ? 0 : (nd - tau + one - 1) >> k;
	c->reset_c = (nd + one - 1) >> k;
	c->reset_u = (d + one - 1) >> k;
	c->n1 = now + (nd >> k);
	c->n2 = nd & (one - 1);
}

/* A fixed window: window <idx>, <left> us until its end, <limit> per window. */
static void check_window(int64_t idx, int64_t left, int64_t limit, const struct limit_state *st,
			 int64_t cost, struct check *c)
{
	int64_t count = st->x == idx ? st->y : 0;

	c->ok = count + cost <= limit;
	c->rem_c = clamp0(limit - clamp0(count + cost));
	c->rem_u = clamp0(limit - count);
	c->retry = c->ok ? 0 : left;
	c->reset_c = left;
	c->reset_u = count > 0 ? left : 0;
	c->n1 = idx;
	c->n2 = count + cost;
}

static void check_fixed(const struct limit_params *p, const struct limit_state *st, int64_t now,
			int64_t cost, struct check *c)
{
	int64_t win = p->a;
	int64_t idx = (int64_t)floor((double)now / (double)win);

	check_window(idx, (idx + 1) * win - now, p->b, st, cost, c);
}

static void check_month(const struct limit_params *p, const struct limit_state *st, int64_t now,
			int64_t cost, struct check *c)
{
	int64_t idx = limit_month_index(now);

	check_window(idx, limit_month_start_us(idx + 1) - now, p->b, st, cost, c);
}

static void log_expire(struct limit_state *st, int64_t now, int64_t win)
{
	size_t i = 0;

	while (i < st->nlog && st->log[i] <= now - win)
		i++;
	if (i) {
		memmove(st->log, st->log + i, (st->nlog - i) * sizeof(*st->log));
		st->nlog -= i;
	}
}

static void check_log(const struct limit_params *p, struct limit_state *st, int64_t now,
		      int64_t cost, struct check *c)
{
	int64_t win = p->a, limit = p->b, count;

	log_expire(st, now, win); /* the script trims on every call too */
	count = (int64_t)st->nlog;
	c->ok = count + cost <= limit && cost <= LOG_ADD_MAX;
	c->rem_c = clamp0(limit - clamp0(count + cost));
	c->rem_u = clamp0(limit - count);
	if (c->ok)
		c->retry = 0;
	else if (cost > limit || cost > LOG_ADD_MAX)
		c->retry = win;
	else
		c->retry = st->log[count + cost - limit - 1] + win - now;
	c->reset_u = st->nlog ? st->log[st->nlog - 1] + win - now : 0;
	c->reset_c = cost > 0 ? win : c->reset_u;
}

static void check_sliding(const struct limit_params *p, const struct limit_state *st,
			  int64_t now, int64_t cost, struct check *c)
{
	int64_t win = p->a, limit = p->b;
	int64_t idx = (int64_t)floor((double)now / (double)win);
	int64_t cur = 0, prev = 0, elapsed, left, est;

	if (st->x == idx) {
		cur = st->y;
		prev = st->z;
	} else if (st->x == idx - 1) {
		prev = st->y;
	}
	elapsed = now - idx * win;
	left = win - elapsed;
	est = (int64_t)floor((double)prev * (double)left / (double)win) + cur;
	c->ok = est + cost <= limit;
	c->rem_c = clamp0(limit - clamp0(est + cost));
	c->rem_u = clamp0(limit - est);
	/* retry: the first instant the estimate admits <cost> (see the script) */
	if (c->ok) {
		c->retry = 0;
	} else if (cost > limit) {
		c->retry = left + win;
	} else if (cur + cost <= limit) {
		int64_t e = (int64_t)floor((double)win - (double)(limit - cur - cost + 1) *
								 (double)win / (double)prev) +
			    1;

		c->retry = clamp0(e - elapsed);
		if (c->retry < 1)
			c->retry = 1;
	} else if (cur <= limit - cost) {
		c->retry = left;
	} else {
		int64_t e = (int64_t)floor((double)win - (double)(limit - cost + 1) * (double)win /
								 (double)cur) +
			    1;

		c->retry = left + clamp0(e);
	}
	c->reset_c = left + win;
	c->reset_u = cur > 0 ? left + win : (prev > 0 ? left : 0);
	c->n1 = idx;
	c->n2 = cur + cost;
	c->n3 = prev;
}

/*
 * Concurrency (lua/concurrency.lua): the slots held are those whose lease
 * ends after <now>; a take counts as a new slot (the agent never takes one
 * twice), a give-back reads nothing and reports nothing. A take's commit drops
 * the ended leases, then adds (or renews) the slot; a give-back's removes the
 * slot alone.
 */
static void check_conc(const struct limit_params *p, const struct limit_state *st, int64_t now,
		       int64_t cost, struct check *c)
{
	int64_t life = p->a, limit = p->b, held = 0, earliest = INT64_MAX, w;
	size_t i;

	if (cost < 0) {
		c->ok = true; /* the rest 0: a give-back's reply is never shown */
		return;
	}
	for (i = 0; i + 1 < st->nlog; i += 2) {
		if (st->log[i + 1] <= now)
			continue;
		held++;
		if (st->log[i + 1] < earliest)
			earliest = st->log[i + 1];
	}
	c->ok = cost > 0 ? held + 1 <= limit : held <= limit;
	c->rem_c = clamp0(limit - held - (cost > 0));
	c->rem_u = clamp0(limit - held);
	w = held ? earliest - now : life;
	w = w < CONC_RETRY_MAX_US ? w : CONC_RETRY_MAX_US;
	c->retry = c->ok ? 0 : w;
	c->reset_u = c->rem_u ? 0 : w;
	c->reset_c = c->rem_c ? 0 : w;
}

static void apply_conc(const struct limit_params *p, struct limit_state *st, int64_t now,
		       int64_t cost)
{
	int64_t slot = cost < 0 ? -cost : cost;
	size_t i, j = 0;

	/* a take: the ended leases and the slot go; a give-back: the slot alone */
	for (i = 0; i + 1 < st->nlog; i += 2) {
		if ((cost >= 0 && st->log[i + 1] <= now) || (cost && st->log[i] == slot))
			continue;
		st->log[j++] = st->log[i];
		st->log[j++] = st->log[i + 1];
	}
	st->nlog = j;
	if (cost <= 0)
		return;
	if (st->nlog + 2 > st->caplog) {
		st->caplog = st->caplog ? 2 * st->caplog : 16;
		st->log = realloc(st->log, st->caplog * sizeof(*st->log));
		if (!st->log)
			abort();
	}
	st->log[st->nlog++] = cost;
	st->log[st->nlog++] = now + p->a;
}

static void apply(const struct limit_params *p, struct limit_state *st, int64_t now,
		  int64_t cost, const struct check *c)
{
	int64_t i;

	switch (p->alg) {
	case ALG_GCRA:
		st->x = c->n1;
		st->y = c->n2;
		break;
	case ALG_FIXED_WINDOW:
	case ALG_FIXED_MONTH:
		st->x = c->n1;
		st->y = clampm(clamp0(c->n2), LIMIT_COUNT_MAX);
		break;
	case ALG_SLIDING_LOG:
		if (cost < 0) { /* a refund takes back the newest entries */
			cost = -cost < LOG_ADD_MAX ? -cost : LOG_ADD_MAX;
			st->nlog -= (size_t)cost < st->nlog ? (size_t)cost : st->nlog;
			break;
		}
		for (i = 0; i < cost; i++) {
			if (st->nlog == st->caplog) {
				st->caplog = st->caplog ? 2 * st->caplog : 16;
				st->log = realloc(st->log, st->caplog * sizeof(*st->log));
				if (!st->log)
					abort();
			}
			st->log[st->nlog++] = now;
		}
		break;
	case ALG_SLIDING_WINDOW:
		st->x = c->n1;
		st->y = clampm(clamp0(c->n2), LIMIT_COUNT_MAX);
		st->z = c->n3;
		break;
	case ALG_CONCURRENCY:
		apply_conc(p, st, now, cost);
		break;
	default:
		break;
	}
}

/*
 * Decides a request costing <cost>[i] tokens for limit i against the <n>
 * limits <p> with states <st> at <now_us>, as the script does: it passes only
 * if every enforcing (non-shadow) limit admits it; then every limit that
 * admits it is charged. A negative cost is a refund: always applied, never
 * denies. With <report> every limit is charged whatever it admits (the
 * script's report of one unit): a bucket may go into debt, a window past its
 * limit, a sliding log takes at most LOG_ADD_MAX entries and never holds more
 * than its limit + LOG_ADD_MAX. Fills <out>[0..n) and returns the overall
 * verdict (true for a report). Unknown algorithms admit.
 */
static bool decide(const struct limit_params *p, struct limit_state *st, size_t n,
		   const int64_t *cost, int64_t now_us, bool report, struct limit_verdict *out)
{
	struct check c[16];
	bool allowed = true;
	size_t i;

	if (n > 16)
		n = 16;
	for (i = 0; i < n; i++) {
		int64_t ci = clampm(cost[i], LIMIT_COUNT_MAX); /* as the script's driver */

		memset(&c[i], 0, sizeof(c[i]));
		switch (p[i].alg != ALG_GCRA && p[i].a < 1 ? ALG_NONE : p[i].alg) {
		case ALG_GCRA:
			check_gcra(&p[i], &st[i], now_us, ci, &c[i]);
			break;
		case ALG_FIXED_WINDOW:
			check_fixed(&p[i], &st[i], now_us, ci, &c[i]);
			break;
		case ALG_FIXED_MONTH:
			check_month(&p[i], &st[i], now_us, ci, &c[i]);
			break;
		case ALG_SLIDING_LOG:
			check_log(&p[i], &st[i], now_us, ci, &c[i]);
			break;
		case ALG_SLIDING_WINDOW:
			check_sliding(&p[i], &st[i], now_us, ci, &c[i]);
			break;
		case ALG_CONCURRENCY:
			check_conc(&p[i], &st[i], now_us, ci, &c[i]);
			break;
		default:
			c[i].ok = true;
			break;
		}
		if (ci < 0) {
			c[i].ok = true;
			c[i].retry = 0;
		}
		if (!c[i].ok && !p[i].shadow)
			allowed = false;
	}
	if (report)
		allowed = true;
	for (i = 0; i < n; i++) {
		bool charged = allowed && (c[i].ok || report);
		int64_t ci = clampm(cost[i], LIMIT_COUNT_MAX);

		if (charged && report && p[i].alg == ALG_SLIDING_LOG && ci > 0) {
			/* as sliding_log_commit: bounded entries per call and in all */
			int64_t room = p[i].b + LOG_ADD_MAX - (int64_t)st[i].nlog;

			ci = ci < LOG_ADD_MAX ? ci : LOG_ADD_MAX;
			ci = ci < room ? ci : clamp0(room);
		}
		if (charged)
			apply(&p[i], &st[i], now_us, ci, &c[i]);
		out[i].allowed = c[i].ok;
		out[i].remaining = charged ? c[i].rem_c : c[i].rem_u;
		out[i].retry_ms = ceil_ms(c[i].retry);
		out[i].reset_ms = ceil_ms(charged ? c[i].reset_c : c[i].reset_u);
	}
	return allowed;
}

bool limit_decide(const struct limit_params *p, struct limit_state *st, size_t n,
		  const int64_t *cost, int64_t now_us, struct limit_verdict *out)
{
	return decide(p, st, n, cost, now_us, false, out);
}

/* Charges <cost>[i] to every limit whatever it admits (see decide()). */
void limit_report(const struct limit_params *p, struct limit_state *st, size_t n,
		  const int64_t *cost, int64_t now_us, struct limit_verdict *out)
{
	(void)decide(p, st, n, cost, now_us, true, out);
}

void limit_state_release(struct limit_state *st)
{
	free(st->log);
	memset(st, 0, sizeof(*st));
}
