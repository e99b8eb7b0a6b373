/* SPDX-License-Identifier: MIT */
/*
 * Local quotas: leases, pre-checks and coalescing (see quota.h).
 *
 * DESIGN
 * Units. A key is one store query: the limits of a principal with the cost of
 * one request for each. A unit is one such request; the script grants and
 * charges whole units (lua/decide.lua, batches).
 *
 * The budget. Each limit may tolerate an error of b x C tokens (b its
 * accuracy_budget, C its rate per period). The agent passes, per key, the
 * smallest b_i x C_i / cost_i over the enforcing limits: "cap", in units, the
 * error every gateway together may cause. With G live gateways (heartbeats in
 * Redis, lua/heartbeat.lua) each gateway has an allowance of s = cap / G units
 * it may hold unused (never more than half of what the limits hold, so a whole
 * batch always fits again). The key stays exact while
 *   n = min(floor(cap / G), ceil(rate x lease_ms), capacity / 2)
 * is below 2 (a lease would save nothing); until the first heartbeat answers,
 * G is unknown and every key is exact. Windows lease n units.
 *
 * A bucket (every enforcing limit a GCRA) also has a rate R, units per second,
 * and a time the budget lasts at that rate, cap / R = b x period. A gateway
 * leases its allowance plus what its own traffic spends within the horizon
 * h = horizon x cap / R (local_quota.horizon, 2 by default: 100 ms for 5% of
 * a second), from a moving average of the units it admits, a:
 *   lease = min(s + ceil(horizon x cap x a / R), ceil(rate x lease_ms), capacity / 2)
 * The busy gateways hold most, the idle ones little. The traffic parts add up
 * to horizon x cap x (admitted rate) / R, horizon x cap at the limit; each is
 * spent by the traffic it was sized on within h. When the traffic of a key
 * stops (no request for flush_ms), what the gateway holds beyond s goes back
 * to Redis (a refund); a graceful stop gives everything back.
 *
 * Leases never over-admit in total: their units are charged in Redis when
 * granted, and Redis grants only what the limits admit. They shift admissions
 * in time: in any window a limit admits at most what it would exactly plus
 * the units held in leases at the window's start, the allowances (<= cap) and,
 * for buckets, the traffic parts (about horizon x cap at the limit, each spent
 * within h; horizon = 0 keeps the bound at cap). Units not spent expire with
 * their lease (lease_expired) or go back (lease_returned): the under-admission
 * is what gateways hold when their traffic stops, at most cap once the rest
 * is back.
 *
 * A lease is topped up (to its size in all) when an eighth is left; the
 * top-up keeps its own expiry. A key denied a lease within a lease lifetime
 * is not topped up ahead (it would be denied: the gateways take turns for
 * whole leases); its next lease is asked for when this one runs out. A unit
 * taken from a lease by a request that another part of its decision denied
 * goes back to the lease.
 *
 * Pre-check. A key whose last answer from Redis left more than G x n units
 * (plus horizon x cap for a bucket: the other gateways' traffic parts) is
 * admitted locally; the usage is reported in batches of n/2 units (or after
 * flush_ms) and charged in full. A gateway stops pre-checking while n units
 * are unknown to Redis (unreported or in flight), so the over-admission is at
 * most G x n <= cap, only for clients near their limit at that moment, and
 * counted in precheck_over (the units a report could not fit). Once the known
 * room falls to G x n the key goes synchronous (leases or exact), reporting
 * first. A pre-checked request denied by another part is forgotten before it
 * is reported.
 *
 * Coalescing. At most one grant call per key is in flight; requests arriving
 * meanwhile wait for it, and the next call asks for all of them at once. The
 * waiting requests get what fits, the same as k exact decisions in a row, so
 * for an exact key coalescing changes no answer. A leased key over its limit
 * is served in whole leases: while fewer units than a lease fit and a lease is
 * back soon, the call is denied (the units wait in the bucket; see the
 * script's minimum and spread_denial()), and so is every request of the key
 * at this gateway until the denial's retry, a denied top-up's included.
 *
 * Outages. A lease already granted keeps serving until it expires, even with
 * Redis unreachable; pre-checks stop as soon as the key's Redis node is not
 * ready; unreported usage stays counted and is reported when Redis is back.
 * A report that timed out or lost its connection may have run: it is not
 * sent twice, its units are counted in report_lost.
 */
#include "quota.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ev.h>

#include "log.h"
#include "util.h"

#define RATE_WINDOW   1.0       /* seconds of the rate estimate's windows */
#define LEASE_MAX     1000000   /* units in one lease, whatever the budget */
#define IDLE_MIN      2.0       /* seconds an idle key is kept at least */
#define RATE_TAU      0.25      /* seconds: time constant of the admitted rate's average */

struct qkey {
	struct qkey *next;              /* hash chain */
	struct quota *qt;               /* ref */
	uint64_t h;                     /* hash of the query */
	double cap;                     /* budget in units, all gateways (last request) */
	double last;                    /* mono() of the last request */
	double win_t;                   /* start of the current rate window */
	uint32_t cur, prev;             /* requests in the current and previous window */
	double arate;                   /* units admitted here per second (moving average) */
	double arate_t;                 /* mono() of arate */
	int64_t tokens;                 /* leased units left in the current lease */
	double expires;                 /* mono(): the current lease ends */
	int64_t tokens2;                /* the next lease, granted while the current one lasts */
	double expires2;
	double life;                    /* lifetime of the last lease (s) */
	double topup_after;             /* mono(): no top-up before (a top-up was denied) */
	double denied_at;               /* mono() of the last denied lease, 0 = none */
	bool denied;                    /* res is that denial: until topup_after, so is every
					 * request no lease serves */
	int64_t lease_size;             /* n when the last lease was asked for */
	int64_t known;                  /* units left in Redis at the last answer */
	double known_at;                /* mono() of that answer, 0 = none */
	int64_t unreported;             /* pre-checked units not reported yet */
	double unreported_since;
	int64_t reporting;              /* units of the reports in flight */
	bool busy;                      /* a grant call in flight */
	double t_sent;                  /* when it left */
	struct list waiters;            /* quota_waiter.node */
	unsigned nwait;
	double answer_by;               /* earliest answer_by of the waiters since the
					 * last call (store_query), 0 = none */
	struct store_result res;        /* last verdicts from Redis */
	double res_at;                  /* mono() of res */
	/* the query, for calls of our own (compact: keys in one allocation) */
	size_t n;
	int64_t cost[STORE_MAX_LIMITS];
	struct limit_params params[STORE_MAX_LIMITS];
	char *keys;                     /* owned: n NUL-terminated keys back to back */
};

struct quota {
	struct ev_loop *loop;           /* ref */
	struct store *store;            /* ref */
	struct quota_opts o;
	bool leasing;                   /* some limit has a budget */
	struct qkey **buckets;          /* owned */
	size_t nbuckets;                /* power of two */
	ev_timer sweep;
	size_t reports;                 /* report and return calls in flight */
	bool draining;                  /* stopping: no more pre-checks */
	struct quota_stats st;
};

static void grant_send(struct quota *qt, struct qkey *e);


/* Requests per second for <e>: a sliding window counter over RATE_WINDOW. */
static void rate_note(struct qkey *e, double now)
{
	double el = now - e->win_t;

	if (el >= 2 * RATE_WINDOW) {
		e->prev = 0;
		e->cur = 0;
		e->win_t = now;
	} else if (el >= RATE_WINDOW) {
		e->prev = e->cur;
		e->cur = 0;
		e->win_t += RATE_WINDOW;
	}
	e->cur++;
}

static double rate_of(const struct qkey *e, double now)
{
	double frac = (now - e->win_t) / RATE_WINDOW;

	if (frac >= 2)
		return 0;
	if (frac >= 1)
		return e->cur * (2 - frac) / RATE_WINDOW;
	return (e->prev * (1 - frac) + e->cur) / RATE_WINDOW;
}

/*
 * Units admitted here per second for <e>: every unit this gateway admitted
 * (spent from a lease, pre-checked, granted to a waiting request), in an
 * exponentially weighted moving average with a time constant of RATE_TAU, a
 * few leases of a hot key: it follows the traffic as fast as leases turn over.
 */
static double admitted_rate(const struct qkey *e, double now)
{
	return now > e->arate_t ? e->arate * exp(-(now - e->arate_t) / RATE_TAU) : e->arate;
}

static void admitted_note(struct qkey *e, double now)
{
	e->arate = admitted_rate(e, now) + 1. / RATE_TAU;
	if (now > e->arate_t)
		e->arate_t = now;
}

/*
 * The refill rate of <e>'s buckets in units per second (the slowest), or 0
 * when some enforcing limit is a window (or none enforces): a window's limit
 * may go at any pace within it, its rate says nothing of the next second.
 */
static double bucket_rate(const struct qkey *e)
{
	double r = 0;
	size_t i;

	for (i = 0; i < e->n; i++) {
		const struct limit_params *p = &e->params[i];
		double t;

		if (p->shadow || e->cost[i] <= 0)
			continue;
		if (p->alg != ALG_GCRA || p->a <= 0)
			return 0;
		/* a = the emission interval in ticks of 2^-k us, k = b mod a */
		t = 1e6 * ldexp(1., (int)(p->b % p->a)) / (double)p->a / (double)e->cost[i];
		if (r == 0 || t < r)
			r = t;
	}
	return r;
}

/* The fewest units the enforcing limits of <e> hold when full (a bucket's burst, a window's limit). */
static int64_t capacity_units(const struct qkey *e)
{
	int64_t c = INT64_MAX;
	size_t i;

	for (i = 0; i < e->n; i++) {
		const struct limit_params *p = &e->params[i];
		int64_t tokens;

		if (p->shadow || e->cost[i] <= 0)
			continue;
		tokens = p->alg == ALG_GCRA ? (p->a > 0 ? p->b / p->a : 0) : p->b;
		if (tokens / e->cost[i] < c)
			c = tokens / e->cost[i];
	}
	return c;
}

/*
 * Units one gateway may take at once for <e> now: 0 = stay exact. Never more
 * than half of what the limits hold, so a whole batch always fits again.
 */
static int64_t unit_target(const struct quota *qt, const struct qkey *e, double now)
{
	double per_gw, use;
	int64_t n, half = capacity_units(e) / 2;

	if (e->cap <= 0 || !qt->st.gateways)
		return 0; /* exact until the heartbeats have counted the gateways */
	per_gw = floor(e->cap / (double)qt->st.gateways);
	use = ceil(rate_of(e, now) * qt->o.lease_ms / 1000.);
	n = (int64_t)(per_gw < use ? per_gw : use);
	if (n > half)
		n = half;
	if (n > LEASE_MAX)
		n = LEASE_MAX;
	return n >= 2 ? n : 0;
}

/*
 * What one gateway may hold unused for <e>: its share of the budget,
 * floor(cap / G), never more than half the capacity.
 */
static int64_t allowance(const struct quota *qt, const struct qkey *e)
{
	double s;
	int64_t half = capacity_units(e) / 2;

	if (e->cap <= 0 || !qt->st.gateways)
		return 0;
	s = floor(e->cap / (double)qt->st.gateways);
	return s < (double)half ? (int64_t)s : half;
}

/*
 * The lease <e> asks for now (units held in all, a top-up included): 0 = none,
 * the key is exact (unit_target() says when). The allowance, plus for a
 * bucket what this gateway's traffic spends within the horizon (see DESIGN).
 */
static int64_t lease_target(const struct quota *qt, const struct qkey *e, double now)
{
	int64_t n0 = unit_target(qt, e, now), half = capacity_units(e) / 2;
	double r = bucket_rate(e), n, use;

	if (!n0)
		return 0;
	n = (double)allowance(qt, e);
	if (r > 0)
		n += ceil(qt->o.horizon * e->cap * admitted_rate(e, now) / r);
	use = ceil(rate_of(e, now) * qt->o.lease_ms / 1000.);
	if (n > use)
		n = use;
	if (n > (double)half)
		n = (double)half;
	if (n > LEASE_MAX)
		n = LEASE_MAX;
	return (int64_t)n > n0 ? (int64_t)n : n0;
}

/* Units left in Redis by <r>: the tightest enforcing limit. */
static int64_t units_left(const struct qkey *e, const struct store_result *r)
{
	int64_t u = INT64_MAX;
	size_t i;

	for (i = 0; i < e->n && i < r->n; i++) {
		if (e->params[i].shadow || e->cost[i] <= 0)
			continue;
		if (r->v[i].remaining / e->cost[i] < u)
			u = r->v[i].remaining / e->cost[i];
	}
	return u == INT64_MAX ? 0 : u;
}

/* Rebuilds <e>'s query into <q> (a single decision: want = 0). */
static void query_of(const struct qkey *e, struct store_query *q)
{
	const char *k = e->keys;
	size_t i;

	store_query_init(q);
	q->n = e->n;
	for (i = 0; i < e->n; i++) {
		size_t l = strlen(k);

		memcpy(q->keys[i], k, l + 1);
		k += l + 1;
		q->cost[i] = e->cost[i];
		q->params[i] = e->params[i];
	}
}

/* A local admission of <e>: the last verdicts, times and counts brought up to date. */
static void local_answer(const struct qkey *e, double now, struct store_result *out)
{
	int64_t el = (int64_t)((now - e->res_at) * 1000), left = e->tokens + e->tokens2 - e->unreported - e->reporting;
	size_t i;

	*out = e->res;
	out->allowed = true;
	out->granted = 1;
	for (i = 0; i < out->n; i++) {
		struct limit_verdict *v = &out->v[i];

		if (!e->params[i].shadow) {
			v->allowed = true;
			v->retry_ms = 0;
		}
		v->remaining += left * e->cost[i];
		if (v->remaining < 0)
			v->remaining = 0;
		v->reset_ms = v->reset_ms > el ? v->reset_ms - el : 0;
	}
}

/* A local denial of <e>: its lease's last denial, times brought up to date. */
static void local_denial(const struct qkey *e, double now, struct store_result *out)
{
	int64_t el = (int64_t)((now - e->res_at) * 1000);
	size_t i;

	*out = e->res;
	out->granted = 0;
	for (i = 0; i < out->n; i++) {
		struct limit_verdict *v = &out->v[i];

		v->retry_ms = v->retry_ms > el ? v->retry_ms - el : (v->retry_ms ? 1 : 0);
		v->reset_ms = v->reset_ms > el ? v->reset_ms - el : 0;
	}
}

/*
 * Whether <e> was denied a lease within the last lease lifetime: the key is
 * over its limit and the gateways take turns for whole leases. A top-up asked
 * ahead would only be denied: the next lease is asked for when this one runs
 * out.
 */
static bool contended(const struct quota *qt, const struct qkey *e, double now)
{
	return e->denied_at && now - e->denied_at < qt->o.lease_ms / 1000.;
}

static struct qkey **bucket_of(struct quota *qt, uint64_t h)
{
	return &qt->buckets[(h ^ (h >> 29)) & (qt->nbuckets - 1)];
}

static struct qkey *key_find(struct quota *qt, uint64_t h, const struct store_query *q)
{
	struct qkey *e;

	for (e = *bucket_of(qt, h); e; e = e->next)
		if (e->h == h && e->n == q->n && strncmp(e->keys, q->keys[0], STORE_KEY_MAX) == 0)
			return e;
	return NULL;
}

static struct qkey *key_new(struct quota *qt, uint64_t h, const struct store_query *q, double now)
{
	struct qkey **b = bucket_of(qt, h), *e;
	size_t i, len = 0, l;
	char *k;

	if (qt->st.keys >= qt->o.max_keys)
		return NULL;
	e = xcalloc(1, sizeof(*e));
	e->qt = qt;
	e->h = h;
	e->win_t = now;
	list_init(&e->waiters);
	e->n = q->n < STORE_MAX_LIMITS ? q->n : STORE_MAX_LIMITS;
	for (i = 0; i < e->n; i++)
		len += strnlen(q->keys[i], STORE_KEY_MAX - 1) + 1;
	e->keys = k = xmalloc(len);
	for (i = 0; i < e->n; i++) {
		l = strnlen(q->keys[i], STORE_KEY_MAX - 1);
		memcpy(k, q->keys[i], l);
		k[l] = 0;
		k += l + 1;
		e->cost[i] = q->cost[i];
		e->params[i] = q->params[i];
	}
	e->next = *b;
	*b = e;
	qt->st.keys++;
	return e;
}

/* Drops expired leases (counted: leased units that expired unused), moves the next one up. */
static void lease_age(struct quota *qt, struct qkey *e, double now)
{
	if (e->tokens2 > 0 && now >= e->expires2) {
		qt->st.lease_expired += (uint64_t)e->tokens2;
		e->tokens2 = 0;
	}
	if (e->tokens > 0 && now >= e->expires) {
		qt->st.lease_expired += (uint64_t)e->tokens;
		e->tokens = 0;
	}
	if (!e->tokens && e->tokens2) {
		e->tokens = e->tokens2;
		e->expires = e->expires2;
		e->tokens2 = 0;
	}
}

static bool key_idle(const struct qkey *e, double now)
{
	return !e->busy && !e->reporting && !e->unreported && !e->tokens && !e->tokens2 &&
	       list_empty(&e->waiters) && now - e->last > IDLE_MIN + 2 * e->qt->o.lease_ms / 1000.;
}

static void key_free(struct qkey *e)
{
	free(e->keys);
	free(e);
}

/*
 * A hot key over its limit was denied a lease: its retry is when one batch of
 * n units is back. G gateways compete for those, so each waits its turn, up to
 * G times as long — but never so long that the refill could overflow: at most
 * half of the smallest limit's capacity comes back meanwhile. Nothing is lost,
 * the tokens wait in the bucket; far fewer calls are made for denials.
 */
static void spread_denial(const struct quota *qt, const struct qkey *e, struct store_result *r)
{
	double k = (double)qt->st.gateways, kk;
	int64_t n = e->lease_size;
	size_t i;

	if (n < 2 || k < 2)
		return;
	/* a window's retry is its reset: waiting longer would deny a fresh window */
	for (i = 0; i < e->n; i++)
		if (!e->params[i].shadow && e->params[i].alg != ALG_GCRA)
			return;
	kk = (double)capacity_units(e) / (2. * (double)n);
	if (kk < k)
		k = kk;
	if (k <= 1)
		return;
	for (i = 0; i < r->n; i++) {
		int64_t t = r->v[i].retry_ms, longer = (int64_t)((double)t * k);

		if (r->v[i].allowed || !t)
			continue;
		if (longer > (int64_t)qt->o.lease_ms)
			longer = qt->o.lease_ms;
		if (longer > t)
			r->v[i].retry_ms = longer;
	}
}

/* Answers every waiter of <e> with <st> (and <res> when OK). */
static void waiters_answer(struct qkey *e, enum store_status st, const struct store_result *res)
{
	while (!list_empty(&e->waiters)) {
		struct quota_waiter *w = LIST_ELEM(e->waiters.next, struct quota_waiter, node);

		list_del(&w->node);
		e->nwait--;
		w->done(w, st, res);
	}
}

static void grant_cb(enum store_status st, const struct store_result *res, void *arg)
{
	struct qkey *e = arg;
	struct quota *qt = e->qt;
	double now = mono();
	int64_t g;

	e->busy = false;
	if (st != STORE_OK) {
		waiters_answer(e, st, NULL);
		return;
	}
	e->res = *res;
	e->res_at = now;
	e->known = units_left(e, res);
	e->known_at = now;
	if (!res->allowed) {
		struct store_result r = *res;
		int64_t wait = 0;
		size_t i;

		spread_denial(qt, e, &r);
		for (i = 0; i < r.n; i++)
			if (!r.v[i].allowed && r.v[i].retry_ms > wait)
				wait = r.v[i].retry_ms;
		e->topup_after = now + wait / 1000.;
		e->res = r;
		if (e->lease_size >= 2) {
			e->denied = true;
			e->denied_at = now;
		}
		waiters_answer(e, st, &r);
		return;
	}
	e->denied = false;
	g = res->granted;
	if (e->nwait > 1)
		qt->st.coalesced += (uint64_t)(g < e->nwait ? g : e->nwait) - 1;
	while (g > 0 && !list_empty(&e->waiters)) {
		struct quota_waiter *w = LIST_ELEM(e->waiters.next, struct quota_waiter, node);
		struct store_result r = *res;
		size_t i;

		g--;
		admitted_note(e, now);
		for (i = 0; i < r.n; i++)
			r.v[i].remaining += g * e->cost[i];
		r.granted = 1;
		list_del(&w->node);
		e->nwait--;
		w->done(w, STORE_OK, &r);
	}
	if (g > 0) {
		/* the rest is a lease, timed from when the call left: never longer
		 * in our clock than in Redis's. The current lease keeps its own end. */
		e->life = res->lease_ms / 1000.;
		lease_age(qt, e, now);
		if (e->tokens) {
			e->tokens2 += g;
			e->expires2 = e->t_sent + e->life;
		} else {
			e->tokens = g;
			e->expires = e->t_sent + e->life;
		}
		qt->st.lease_grants++;
		qt->st.lease_units += (uint64_t)g;
	}
	/* requests that arrived meanwhile, or that did not fit: ask again */
	if (!list_empty(&e->waiters))
		grant_send(qt, e);
}

/*
 * One grant call for <e>: every waiter plus a lease when the key is hot.
 * Returns 0 (busy until grant_cb) or a negative store status.
 */
static int grant_call(struct quota *qt, struct qkey *e)
{
	struct store_query q;
	double now = mono();
	int64_t share = qt->o.leases ? lease_target(qt, e, now) : 0, lease, want;
	int ret;

	/* one gateway holds at most n units: top up what is left */
	lease = share - e->tokens - e->tokens2;
	if (lease < 2)
		lease = 0;
	want = e->nwait + lease;

	if (want <= 0)
		return 0;
	query_of(e, &q);
	/* answered by the time its first waiter must be */
	q.answer_by = e->nwait ? e->answer_by : 0;
	e->answer_by = 0;
	if (want > 1) {
		q.want = want;
		q.batch = BATCH_GRANT;
		q.lease_us = (int64_t)qt->o.lease_ms * 1000;
		/* a hot key over its limit: wait for a whole lease rather than
		 * call Redis for every token that trickles back */
		q.min_units = lease;
	}
	e->lease_size = share;
	e->t_sent = now;
	ret = store_decide(qt->store, &q, grant_cb, e);
	if (ret == 0)
		e->busy = true;
	return ret;
}

/* grant_call(); on a refusal the waiters are answered with it. */
static void grant_send(struct quota *qt, struct qkey *e)
{
	int ret = grant_call(qt, e);

	if (ret < 0)
		waiters_answer(e, (enum store_status)-ret, NULL);
}

/* One report in flight. */
struct report {
	struct qkey *e;                 /* ref: kept alive while e->reporting > 0 */
	int64_t units;
};

static void report_cb(enum store_status st, const struct store_result *res, void *arg)
{
	struct report *rp = arg;
	struct qkey *e = rp->e;
	struct quota *qt = e->qt;
	double now = mono();
	int64_t units = rp->units;

	free(rp);
	qt->reports--;
	e->reporting -= units;
	if (st != STORE_OK) {
		qt->st.report_failed++;
		/* admitted is admitted: report it again when the script cannot have
		 * run (an error reply, or shed before it was sent). After a timeout
		 * or a lost connection it may have: sending it again could charge it
		 * twice, so it is dropped (at most n units, counted in report_lost). */
		if (st == STORE_ERROR || st == STORE_OVERLOAD) {
			if (!e->unreported)
				e->unreported_since = now;
			e->unreported += units;
		} else {
			qt->st.report_lost += (uint64_t)units;
		}
		return;
	}
	qt->st.precheck_reports++;
	if (res->granted < units)
		qt->st.precheck_over += (uint64_t)(units - res->granted);
	e->denied = false;
	e->res = *res;
	e->res_at = now;
	e->known = units_left(e, res);
	e->known_at = now;
}

/*
 * Reports <e>'s unreported usage (charged in full, whatever fits). Several
 * reports may be in flight; one key's calls go in order on one connection.
 */
static void report_send(struct quota *qt, struct qkey *e)
{
	struct store_query q;
	struct report *rp;

	if (e->unreported <= 0)
		return;
	query_of(e, &q);
	q.want = e->unreported;
	q.batch = BATCH_REPORT;
	q.lease_us = 0;
	rp = xmalloc(sizeof(*rp));
	rp->e = e;
	rp->units = e->unreported;
	if (store_decide(qt->store, &q, report_cb, rp) < 0) {
		free(rp);
		qt->st.report_failed++;
		return;
	}
	qt->reports++;
	e->reporting += e->unreported;
	e->unreported = 0;
}

/* One return of leased units in flight. */
struct lease_ret {
	struct quota *qt;               /* ref */
	int64_t units;
};

static void return_cb(enum store_status st, const struct store_result *res, void *arg)
{
	struct lease_ret *lr = arg;
	struct quota *qt = lr->qt;

	(void)res;
	qt->reports--;
	/* not given back: charged and never spent, as if the lease had expired */
	if (st != STORE_OK)
		qt->st.lease_expired += (uint64_t)lr->units;
	else
		qt->st.lease_returned += (uint64_t)lr->units;
	free(lr);
}

/*
 * Whether the units of a lease ending at <expires> may go back to Redis now.
 * A bucket takes a refund at any time (never past full); a window only while
 * the one that was charged runs (a refund in the next one would admit more
 * there): the lease ends with it, so half its lifetime and at least 50 ms
 * left leave the call ample time to get there first.
 */
static bool returnable(const struct qkey *e, double expires, double now)
{
	size_t i;

	if (now >= expires)
		return false;
	for (i = 0; i < e->n; i++)
		if (!e->params[i].shadow && e->cost[i] > 0 && e->params[i].alg != ALG_GCRA)
			return expires - now >= (e->life / 2 > 0.05 ? e->life / 2 : 0.05);
	return true;
}

/*
 * Gives the leased units of <e> beyond <keep> back to Redis (the newest lease
 * first): they were charged when granted and will not be spent here. The
 * enforcing limits get them back (a shadow limit keeps its charge: it only
 * reports). Failures are counted as expired units.
 */
static void lease_return(struct quota *qt, struct qkey *e, int64_t keep, double now)
{
	int64_t back2 = 0, back1 = 0, over = e->tokens + e->tokens2 - keep;
	struct store_query q;
	struct lease_ret *lr;
	size_t i, j;

	if (over <= 0)
		return;
	if (e->tokens2 > 0 && returnable(e, e->expires2, now))
		back2 = e->tokens2 < over ? e->tokens2 : over;
	if (over > back2 && e->tokens > 0 && returnable(e, e->expires, now))
		back1 = e->tokens < over - back2 ? e->tokens : over - back2;
	if (!back1 && !back2)
		return;
	query_of(e, &q);
	for (i = j = 0; i < q.n; i++) {
		if (e->params[i].shadow || e->cost[i] <= 0)
			continue;
		if (j != i) {
			memcpy(q.keys[j], q.keys[i], sizeof(q.keys[0]));
			q.params[j] = q.params[i];
		}
		q.cost[j++] = -(back1 + back2) * e->cost[i];
	}
	q.n = j;
	if (!j)
		return;
	lr = xmalloc(sizeof(*lr));
	lr->qt = qt;
	lr->units = back1 + back2;
	if (store_decide(qt->store, &q, return_cb, lr) < 0) {
		free(lr);
		return; /* kept: spent or expired as usual */
	}
	qt->reports++;
	e->tokens2 -= back2;
	e->tokens -= back1;
	lease_age(qt, e, now);
}

/*
 * Decides one request of key <h> (query <q>, budget <cap> units for all
 * gateways, 0 = exact) with the local state when it can: see enum quota_path.
 * <w> is queued only when QUOTA_WAIT is returned.
 */
enum quota_path quota_decide(struct quota *qt, uint64_t h, const struct store_query *q,
			     double cap, struct quota_waiter *w, struct store_result *out,
			     enum store_status *st)
{
	double now = mono();
	struct qkey *e = key_find(qt, h, q);
	double demand;
	int64_t n;
	bool far;
	int ret;

	if (!e && !(e = key_new(qt, h, q, now))) {
		qt->st.full++;
		return QUOTA_BYPASS;
	}
	e->last = now;
	e->cap = cap;
	rate_note(e, now);

	w->local = QUOTA_VIA_REDIS;
	lease_age(qt, e, now);
	n = unit_target(qt, e, now);
	/* what the other gateways may lease on top of n each: their traffic parts */
	demand = qt->o.leases && bucket_rate(e) > 0 ? qt->o.horizon * cap : 0;
	/* unknown to Redis: at most n units per gateway (G x n <= cap in all),
	 * reported in halves so the next batch fills while one is in flight */
	far = qt->o.precheck && !qt->draining && n && e->known_at &&
	      now - e->known_at < qt->o.lease_ms / 1000. && e->unreported + e->reporting < n &&
	      (double)(e->known - e->unreported - e->reporting) >
		      (double)qt->st.gateways * (double)n + demand &&
	      store_key_ready(qt->store, e->keys);
	if (e->tokens > 0) {
		e->tokens--;
		qt->st.lease_spent++;
		admitted_note(e, now);
		w->local = QUOTA_VIA_LEASE;
		w->lease_end = e->expires;
		local_answer(e, now, out);
		/* the next lease before this one runs dry; none when the key is far
		 * from its limit: pre-checks take over, wasting nothing */
		if (!e->busy && !far && !e->tokens2 && now >= e->topup_after && !contended(qt, e, now) &&
		    e->tokens <= (e->lease_size / 8 ? e->lease_size / 8 : 1) &&
		    store_key_ready(qt->store, e->keys))
			grant_send(qt, e);
		return QUOTA_LOCAL;
	}
	if (e->denied && now < e->topup_after && !e->res.allowed && e->res.n == q->n) {
		/* a hot key over its limit is served in whole leases: its last
		 * lease was denied (a top-up, answered to no request) and the same
		 * call would be denied until its retry */
		local_denial(e, now, out);
		return QUOTA_LOCAL;
	}
	if (far) {
		if (!e->unreported)
			e->unreported_since = now;
		e->unreported++;
		qt->st.precheck_local++;
		admitted_note(e, now);
		w->local = QUOTA_VIA_PRECHECK;
		local_answer(e, now, out);
		if (e->unreported >= (n + 1) / 2)
			report_send(qt, e);
		return QUOTA_LOCAL;
	}
	/* synchronous from here: what was admitted locally reaches Redis first
	 * (same key, same connection, in order), so Redis decides on all of it */
	report_send(qt, e);
	list_append(&e->waiters, &w->node);
	e->nwait++;
	if (q->answer_by > 0 && (e->answer_by <= 0 || q->answer_by < e->answer_by))
		e->answer_by = q->answer_by;
	if (e->busy && qt->o.coalesce)
		return QUOTA_WAIT;
	if (e->busy) {
		/* no coalescing: a call of its own, outside the key's entry */
		list_del(&w->node);
		e->nwait--;
		return QUOTA_BYPASS;
	}
	ret = grant_call(qt, e);
	if (ret < 0) {
		list_del(&w->node);
		e->nwait--;
		*st = (enum store_status)-ret;
		return QUOTA_FAILED;
	}
	return QUOTA_WAIT;
}

/* Housekeeping: expired leases, due reports, idle keys. */
static void sweep_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct quota *qt = container_of(t, struct quota, sweep);
	double now = mono(), flush = qt->o.flush_ms / 1000.;
	size_t i;

	(void)loop;
	(void)revents;
	for (i = 0; i < qt->nbuckets; i++) {
		struct qkey **pe = &qt->buckets[i];

		while (*pe) {
			struct qkey *e = *pe;

			lease_age(qt, e, now);
			/* traffic stopped: what is held beyond the allowance goes back */
			if (e->tokens + e->tokens2 > 0 && now - e->last >= flush &&
			    store_key_ready(qt->store, e->keys))
				lease_return(qt, e, allowance(qt, e), now);
			if (e->unreported > 0 && now - e->unreported_since >= flush &&
			    store_key_ready(qt->store, e->keys))
				report_send(qt, e);
			if (key_idle(e, now)) {
				*pe = e->next;
				key_free(e);
				qt->st.keys--;
				continue;
			}
			pe = &e->next;
		}
	}
}

/* The live gateways counted by the heartbeats (heartbeat.c); 0 = not yet. */
void quota_set_gateways(struct quota *qt, uint64_t n)
{
	qt->st.gateways = n;
}

/* (Re)applies options that a reload may change; <leasing>: some limit has a budget. */
void quota_configure(struct quota *qt, const struct quota_opts *o, bool leasing)
{
	double sw;

	qt->o = *o;
	qt->leasing = leasing;
	sw = o->flush_ms / 2000.;
	sw = sw < 0.005 ? 0.005 : (sw > 0.25 ? 0.25 : sw);
	ev_timer_stop(qt->loop, &qt->sweep);
	ev_timer_set(&qt->sweep, sw, sw);
	ev_timer_start(qt->loop, &qt->sweep);
}

struct quota *quota_new(struct ev_loop *loop, struct store *store, const struct quota_opts *o)
{
	struct quota *qt = xcalloc(1, sizeof(*qt));

	qt->loop = loop;
	qt->store = store;
	qt->nbuckets = 64;
	while (qt->nbuckets < o->max_keys)
		qt->nbuckets <<= 1;
	qt->buckets = xcalloc(qt->nbuckets, sizeof(*qt->buckets));
	ev_timer_init(&qt->sweep, sweep_cb, 0.05, 0.05);
	quota_configure(qt, o, false);
	return qt;
}

/*
 * Frees everything. The store must be freed first: it answers the calls in
 * flight, and nothing of ours may be called afterwards.
 */
void quota_free(struct quota *qt)
{
	size_t i;

	if (!qt)
		return;
	ev_timer_stop(qt->loop, &qt->sweep);
	for (i = 0; i < qt->nbuckets; i++) {
		while (qt->buckets[i]) {
			struct qkey *e = qt->buckets[i];

			qt->buckets[i] = e->next;
			waiters_answer(e, STORE_SHUTDOWN, NULL);
			key_free(e);
		}
	}
	free(qt->buckets);
	free(qt);
}

/*
 * A graceful stop: no more pre-checks, every unreported usage reported now,
 * the leases given back.
 */
void quota_flush(struct quota *qt)
{
	size_t i;
	struct qkey *e;

	qt->draining = true;
	for (i = 0; i < qt->nbuckets; i++)
		for (e = qt->buckets[i]; e; e = e->next) {
			report_send(qt, e);
			lease_return(qt, e, 0, mono());
		}
}

/*
 * Key <h> (query <q>) was charged <units> more units (fewer when negative)
 * by a call of its own (a post-charge, sent to Redis as a report): what this
 * gateway knows is left in Redis moves by as much, so pre-checks stop as
 * early as if its requests had cost that. Leases are left alone: their units
 * were charged when granted; a key in debt is denied its next lease.
 */
void quota_note_charge(struct quota *qt, uint64_t h, const struct store_query *q, int64_t units)
{
	struct qkey *e = qt ? key_find(qt, h, q) : NULL;

	if (!e || !e->known_at)
		return;
	e->known = units > e->known ? 0 : e->known - units;
}

/*
 * Reports the pre-checked usage of key <h> (query <q>) not reported yet, now:
 * a refund sent after it (a post-charge, on the same node) then finds that
 * usage charged. Sent after the refund, the usage would be charged in full
 * while the refund had been cut at a full bucket (or an empty window): a net
 * overcharge of what the refund lost.
 */
void quota_report_now(struct quota *qt, uint64_t h, const struct store_query *q)
{
	struct qkey *e = qt ? key_find(qt, h, q) : NULL;

	if (e && e->unreported > 0)
		report_send(qt, e);
}

/* Reports in flight and keys with usage still to report (a drain waits for them). */
size_t quota_pending(const struct quota *qt)
{
	size_t i, n;
	const struct qkey *e;

	if (!qt)
		return 0;
	n = qt->reports;
	for (i = 0; qt->draining && i < qt->nbuckets; i++)
		for (e = qt->buckets[i]; e; e = e->next)
			n += e->unreported > 0;
	return n;
}

/*
 * Takes back one request answered locally (<how>: QUOTA_VIA_LEASE or
 * QUOTA_VIA_PRECHECK) that ended up denied by another part of its decision: the
 * lease gets its unit back (<lease_end>: the end of the lease it came from,
 * still running), or the pre-check forgets it before it is reported. Returns
 * false when it cannot (lease over or replaced, already reported, key gone):
 * refund in Redis.
 */
bool quota_undo(struct quota *qt, uint64_t h, const struct store_query *q, int how,
		double lease_end)
{
	struct qkey *e = key_find(qt, h, q);

	if (!e)
		return false;
	if (how == QUOTA_VIA_LEASE && lease_end && e->tokens > 0 && e->expires == lease_end &&
	    mono() < lease_end) {
		/* back into the lease it came from, never into another one */
		e->tokens++;
		qt->st.undone++;
		return true;
	}
	if (how == QUOTA_VIA_PRECHECK && e->unreported > 0) {
		e->unreported--;
		qt->st.undone++;
		return true;
	}
	return false;
}

/* Recomputes the gauges (held and unreported units). */
static void gauges(struct quota *qt)
{
	uint64_t held = 0, unrep = 0;
	double now = mono();
	size_t i;
	struct qkey *e;

	for (i = 0; i < qt->nbuckets; i++)
		for (e = qt->buckets[i]; e; e = e->next) {
			if (e->tokens > 0 && now < e->expires)
				held += (uint64_t)e->tokens;
			if (e->tokens2 > 0 && now < e->expires2)
				held += (uint64_t)e->tokens2;
			unrep += (uint64_t)(e->unreported + e->reporting);
		}
	qt->st.outstanding = held;
	qt->st.unreported = unrep;
}

const struct quota_stats *quota_stats(struct quota *qt)
{
	gauges(qt);
	return &qt->st;
}
