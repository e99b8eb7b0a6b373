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
						 "sliding_window"};

/* The algorithm called <name> ("token_bucket" is GCRA), or -1. */
int limit_alg_parse(const char *name)
{
	int i;

	if (strcmp(name, "token_bucket") == 0)
		return ALG_GCRA;
	for (i = 1; i < ALG_COUNT; i++)
		if (strcmp(name, alg_names[i]) == 0)
			return i;
	return -1;
}

/*
 * Fills <p> for <rate> tokens per <period_ms>. For GCRA, <burst> is the bucket
 * size (0: same as rate) and the emission interval is rounded to whole
 * microseconds (error at most 0.5 us per interval: 0.005% at 100/s). For the
 * window algorithms the limit is <rate> per window of <period_ms>.
 */
void limit_params_init(struct limit_params *p, int alg, uint64_t rate, uint64_t period_ms,
		       uint64_t burst)
{
	uint64_t period_us = period_ms * 1000;

	memset(p, 0, sizeof(*p));
	p->alg = (uint8_t)alg;
	if (alg == ALG_GCRA) {
		uint64_t t = rate ? (period_us + rate / 2) / rate : period_us;

		if (t < 1)
			t = 1;
		if (!burst)
			burst = rate;
		p->a = (int64_t)t;
		p->b = (int64_t)(t * burst);
	} else {
		p->a = (int64_t)period_us;
		p->b = (int64_t)rate;
	}
}

static void check_gcra(const struct limit_params *p, const struct limit_state *st, int64_t now,
		       int64_t cost, struct check *c)
{
	int64_t T = p->a, tau = p->b;
	int64_t tat = st->x < now ? now : st->x;
	int64_t newtat = tat + T * cost;

	if (newtat < now) /* a refund never goes past full */
		newtat = now;
	c->ok = newtat - tau <= now;
	c->rem_c = clamp0(tau - (newtat - now)) / T;
	c->rem_u = clamp0(tau - (tat - now)) / T;
	c->retry = c->ok ? 0 : newtat - tau - now;
	c->reset_c = newtat - now;
	c->reset_u = tat - now;
	c->n1 = newtat;
}

static void check_fixed(const struct limit_params *p, const struct limit_state *st, int64_t now,
			int64_t cost, struct check *c)
{
	int64_t win = p->a, limit = p->b;
	int64_t idx = (int64_t)floor((double)now / (double)win);
	int64_t count = st->x == idx ? st->y : 0;
	int64_t left = (idx + 1) * win - now;

	c->ok = count + cost <= limit;
	c->rem_c = clamp0(limit - clamp0(count + cost));
	c->rem_u = clamp0(limit - count);
	c->retry = c->ok ? 0 : left;
	c->reset_c = left;
	c->reset_u = count > 0 ? left : 0;
	c->n1 = idx;
	c->n2 = count + cost;
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
	c->ok = count + cost <= limit;
	c->rem_c = clamp0(limit - clamp0(count + cost));
	c->rem_u = clamp0(limit - count);
	if (c->ok)
		c->retry = 0;
	else if (cost > limit)
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

static void apply(const struct limit_params *p, struct limit_state *st, int64_t now,
		  int64_t cost, const struct check *c)
{
	int64_t i;

	switch (p->alg) {
	case ALG_GCRA:
		st->x = c->n1;
		break;
	case ALG_FIXED_WINDOW:
		st->x = c->n1;
		st->y = clamp0(c->n2);
		break;
	case ALG_SLIDING_LOG:
		if (cost < 0) { /* a refund takes back the newest entries */
			st->nlog -= (size_t)(-cost) < st->nlog ? (size_t)(-cost) : st->nlog;
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
		st->y = clamp0(c->n2);
		st->z = c->n3;
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
 * denies. Fills <out>[0..n) and returns the overall verdict. Unknown
 * algorithms admit.
 */
bool limit_decide(const struct limit_params *p, struct limit_state *st, size_t n,
		  const int64_t *cost, int64_t now_us, struct limit_verdict *out)
{
	struct check c[16];
	bool allowed = true;
	size_t i;

	if (n > 16)
		n = 16;
	for (i = 0; i < n; i++) {
		memset(&c[i], 0, sizeof(c[i]));
		switch (p[i].alg) {
		case ALG_GCRA:
			check_gcra(&p[i], &st[i], now_us, cost[i], &c[i]);
			break;
		case ALG_FIXED_WINDOW:
			check_fixed(&p[i], &st[i], now_us, cost[i], &c[i]);
			break;
		case ALG_SLIDING_LOG:
			check_log(&p[i], &st[i], now_us, cost[i], &c[i]);
			break;
		case ALG_SLIDING_WINDOW:
			check_sliding(&p[i], &st[i], now_us, cost[i], &c[i]);
			break;
		default:
			c[i].ok = true;
			break;
		}
		if (cost[i] < 0) {
			c[i].ok = true;
			c[i].retry = 0;
		}
		if (!c[i].ok && !p[i].shadow)
			allowed = false;
	}
	for (i = 0; i < n; i++) {
		bool charged = allowed && c[i].ok;

		if (charged)
			apply(&p[i], &st[i], now_us, cost[i], &c[i]);
		out[i].allowed = c[i].ok;
		out[i].remaining = charged ? c[i].rem_c : c[i].rem_u;
		out[i].retry_ms = ceil_ms(c[i].retry);
		out[i].reset_ms = ceil_ms(charged ? c[i].reset_c : c[i].reset_u);
	}
	return allowed;
}

void limit_state_release(struct limit_state *st)
{
	free(st->log);
	memset(st, 0, sizeof(*st));
}
