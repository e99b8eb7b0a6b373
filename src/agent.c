/* SPDX-License-Identifier: MIT */
/*
 * The decision path.
 *
 * DESIGN
 * A NOTIFY carries our message (default "rl-req") with named arguments: key,
 * tier, ip, method, path, cost. The principal is the API key when one is sent
 * (tier from the `tier` argument, else the default tier) and otherwise the
 * source address, grouped by prefix (IPv4 /32 and IPv6 /64 by default).
 *
 * Redis keys are "<prefix>:{<principal>}:<limit>": the principal part is a
 * fixed-length digest (never the raw API key) or the hex of the masked
 * address, inside a hash tag so all limits of one principal live in one
 * Redis Cluster slot and are decided by one script call. Nothing a client
 * sends can reach outside its own principal part.
 *
 * An API key with no known tier is, by default, an anonymous client of its
 * address: inventing keys buys nothing and costs Redis nothing.
 *
 * The principal's limits are decided first; an endpoint's global limits (their
 * own hash tag) only once those allowed, so a denial is one script call.
 *
 * The answer is a set of txn variables; on any store failure the agent answers
 * at once through the failure ladder (by default a coarse local limit, never
 * no limit at all) with degraded=1, except that a denial Redis computed keeps
 * answering from the blocked-key cache until its Retry-After. Each decision
 * holds a reference to the ruleset it started with, so a reload never changes
 * a decision midway.
 */
#include "agent.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <ev.h>

#include "config.h"
#include "digest.h"
#include "hll.h"
#include "http.h"
#include "list.h"
#include "log.h"
#include "memstore.h"
#include "metrics.h"
#include "overrides.h"
#include "quota.h"
#include "rules.h"
#include "spoa.h"
#include "store.h"
#include "util.h"

#define COST_MAX 1000000
#define MAX_APPLIED (2 * STORE_MAX_LIMITS)
/*
 * Store queries of a decision: 0 the principal's limits, 1 an endpoint's
 * global limits, 2 the candidate endpoint's global limits when their hash tag
 * is not part 1's (see cand_add()).
 */
#define NPARTS 3

/*
 * With spoe_timeout set, a decision sent to Redis is answered by the time
 * ANSWER_SHARE of HAProxy's processing budget has passed since its NOTIFY
 * arrived, by the failure ladder if Redis has not answered (or has not been
 * asked: a backlog's excess). The rest of the budget is for the ACK's way
 * back and HAProxy's own queueing; past the budget HAProxy lets the request
 * through with no limit at all, the ladder at least applies the local one.
 */
#define ANSWER_SHARE 0.8

#define BLOCKED_SLOTS 4096

/* What became of a response's cost (the post-charge message), counted. */
enum post_outcome {
	POST_CHARGED   = 0,     /* a charge (the difference) sent, debt allowed */
	POST_REFUNDED  = 1,     /* a refund (the response cost less than the pre-charge) sent */
	POST_UNCHANGED = 2,     /* the response cost what the request was charged */
	POST_ABSENT    = 3,     /* no cost in the message: the pre-charge stands */
	POST_INVALID   = 4,     /* not a non-negative integer: ignored, the pre-charge stands */
	POST_FAILED    = 5,     /* a charge or refund Redis did not take (timeout, down...) */
	POST_OUT_COUNT          /* sentinel */
};

/* The blocked-key cache: a query Redis denied, denied locally until it could pass. */
struct blocked_slot {
	uint64_t h;                     /* hash of the query (keys, limits, costs) */
	double at;                      /* mono() of the denial */
	double until;                   /* mono() until which the same query is denied */
	struct store_result res;        /* the verdicts to repeat (times adjusted) */
};

/*
 * Slots of the digest cache: an API key (up to DCACHE_KEY bytes) -> the hex of
 * the first 16 bytes of its SHA-256, the Redis key part of its principal.
 * Direct-mapped by a fast hash of the key, compared byte for byte: a key sent
 * again (the common case) costs a memcmp, not a SHA-256.
 */
#define DCACHE_SLOTS 4096
#define DCACHE_KEY   64
struct digest_slot {
	uint8_t len;                    /* 0: empty */
	char key[DCACHE_KEY];
	uint8_t digest[16];
	char hex[33];
};

/*
 * Unused decisions are kept for the next ones (up to DFREE_MAX): a decision
 * is ~10 KB, mostly its store queries' key buffers, which need no clearing.
 */
#define DFREE_MAX 256

/* Slots of the tier cache: API key digest -> tier name, with an expiry. */
struct tier_slot {
	uint8_t digest[16];             /* first 16 bytes of SHA-256(key) */
	char tier[65];                  /* tier name, "" = no entry in Redis */
	double expires;                 /* ev_now() based; 0 = empty slot */
};

struct agent {
	struct ev_loop *loop;           /* ref */
	struct ruleset *rs;             /* one reference */
	struct spoa_server *srv;        /* owned */
	struct store *store;            /* owned, NULL unless store "redis" */
	struct memstore *mem;           /* owned, NULL unless store "memory" */
	struct memstore *local;         /* owned: fallback state of on_failure "local" limits */
	struct quota *quota;            /* owned, NULL unless store "redis": local quotas */
	struct tier_slot *tcache;       /* owned: tier cache, tcache_size slots */
	struct digest_slot *dcache;     /* owned: DCACHE_SLOTS, API key -> its digest */
	struct decision *dfree;         /* owned: unused decisions, at most DFREE_MAX */
	size_t ndfree;
	size_t tcache_size;
	size_t pending;                 /* decisions waiting for the store */
	uint64_t outcomes[OUT_COUNT];
	uint64_t degraded_by[STORE_COUNT];
	uint64_t refunds;               /* charges taken back after a split denial */
	uint64_t refunds_lost;          /* ... whose Redis call failed: the charge stays */
	uint64_t tier_hits, tier_misses;
	uint64_t local_decisions;       /* failed parts decided by local fallback limits */
	uint64_t invalid_costs;         /* costs from HAProxy out of range: charged COST_MAX */
	uint64_t no_address;            /* anonymous requests without a source address */
	uint64_t post[POST_OUT_COUNT];  /* post-charges by outcome */
	uint64_t post_clamped;          /* response costs above post_charge.max: the max */
	struct metrics *metrics;        /* ref: shared region (owned by main) */
	struct met_slot *ms;            /* ref: this process's slot */
	struct http_server *http;       /* owned or NULL */
	struct blocked_slot *blocked;   /* owned: BLOCKED_SLOTS, or NULL when disabled */
	uint64_t blocked_hits;
	struct overrides *ovr;          /* owned, NULL unless store "redis" and overrides.enabled */
	uint64_t ovr_blocked;           /* requests denied by a block override */
	uint64_t ovr_limited;           /* decisions with limits changed by an override */
	struct list parked;             /* decisions waiting for the first overrides load */
	bool no_park;                   /* stopping: nothing waits any more */
	ev_timer publish;               /* copies gauges and top-K snapshots into ms */
	size_t ntopk;
	struct {
		char rule[MET_NAME];
		struct topk *t;         /* owned */
	} topk[MET_TOP_RULES];
};

/* One limit applied to a request. */
struct applied {
	const struct rule_limit *l;     /* ref: into the decision's ruleset */
	int part;                       /* which store query: 0 principal, 1 global */
	size_t slot;                    /* index inside that query */
	uint64_t rate;                  /* l->rate, or a limit override's */
	uint64_t capacity;              /* l->capacity, or a limit override's */
	struct limit_params local_lp;   /* l->local_lp, or a limit override's */
};

/* One limit of the candidate policy applied to a request. */
struct cand_applied {
	const struct rule_limit *l;     /* ref: into the decision's rs->cand */
	int part;                       /* which store query: 0 principal, 1 or 2 global */
	size_t slot;                    /* index inside that query's candidate limits */
};

/* One store query of a decision and its outcome. */
struct part {
	struct decision *d;             /* ref: back pointer for the callback */
	struct store_query q;
	enum store_status st;
	struct store_result res;
	bool used;
	bool fallback;                  /* res holds the failure ladder's verdicts */
	uint64_t h;                     /* hash of q, for the blocked-key cache */
	double t_sent;                  /* mono() when the query left */
	bool has[STORE_MAX_LIMITS];     /* a verdict exists for this slot */
	double cap;                     /* local quota budget in units (all gateways), 0 = exact */
	struct quota_waiter w;          /* while it waits on its key's Redis call */
};

/* A decision in progress. */
struct decision {
	struct agent *a;                /* ref */
	struct spoa_req *req;           /* owned until completed */
	struct ruleset *rs;             /* one reference */
	const struct rule_endpoint *ep; /* ref: into rs, or NULL */
	unsigned waiting;               /* store queries not answered yet */
	int next;                       /* next part to decide (parts go in order) */
	size_t n;                       /* applied limits, in ap[] */
	/* kept while the tier is looked up */
	char principal[80];
	uint8_t digest[16];
	struct spop_data ip;
	int64_t cost;                   /* from HAProxy, or -1 (COST_MAX when invalid) */
	bool closed;                    /* a fail-closed limit denied */
	bool charges;                   /* some applied limit costs this request tokens */
	bool overridden;                /* some limit has a limit override's parameters */
	bool keyed;                     /* an API key was sent */
	bool post;                      /* a post-charge, not a decision: no answer, no req */
	int64_t post_cost;              /* post: the request's cost, known from its response */
	const struct rule_tier *sent_tier; /* ref: rs, the tier HAProxy sent, if known */
	struct list park;               /* on a->parked while it waits for the overrides */
	const struct rule_tier *tier;   /* ref: rs, the tier applied */
	const char *tier_name;          /* ref: rs, for metrics */
	char client[64];                /* fingerprint for top offenders */
	double t0;                      /* when the NOTIFY arrived (mono) */
	double answer_by;               /* mono(): Redis answers by then or the ladder
					 * does (ANSWER_SHARE of HAProxy's budget), 0 = none */
	struct decision *next_free;     /* in agent.dfree while unused */
	bool allowed;                   /* the answer respond() gave ... */
	const struct rule_limit *rule;  /* ... and the limit it reported, or NULL */
	/* the candidate policy, rs->cand: see "Candidate policy" below */
	const struct rule_endpoint *cep; /* ref: into rs->cand, or NULL */
	const struct rule_tier *ctier;  /* ref: rs->cand, its tier by name, or NULL */
	size_t cn;                      /* its limits applied, in cap[] */
	/* from here on, not cleared by decision_new(): entries below n and cn are
	 * written whole before they are read */
	struct applied ap[MAX_APPLIED];
	struct cand_applied cap[MAX_APPLIED];
	struct part parts[NPARTS];      /* last: see decision_new() */
};

static void part_settle(struct decision *d, struct part *pt);
static void decision_next(struct decision *d);
static void cand_add(struct decision *d, const struct rule_tier *tier, const char *principal,
		     const struct ovr_entry *ov);
static void cand_trim(struct decision *d, struct part *pt, bool drop_own);
static void cand_finish(struct decision *d);
static void mem_decide(struct agent *a, const struct store_query *q, struct store_result *res);

/* True when <pt> holds limits of the enforced policy (not only the candidate's). */
static inline bool part_enforced(const struct part *pt)
{
	return pt->q.n > pt->q.ncand;
}
static void post_send(struct decision *d);

/* What we read from the message. */
struct req_args {
	struct spop_str key;            /* API key (empty: anonymous) */
	struct spop_str tier;           /* tier name or empty */
	struct spop_str method, path, route;
	struct spop_data ip;            /* NULL type when absent */
	int64_t cost;                   /* -1 when not sent */
	bool cost_invalid;              /* sent, but not an integer in 0..COST_MAX */
	/* the post-charge message's */
	bool has_endpoint;              /* `endpoint` sent (NULL: the request matched none) */
	struct spop_str endpoint;       /* the endpoint the request's ACK named */
	int64_t charged;                /* the cost its ACK named (`charged`), -1 when not sent */
	struct spop_data charge, bytes, time; /* NULL type when absent */
};


/* Counts a denial of <client> by <rule> for the top offenders. */
static void note_denied(struct agent *a, const char *rule, const char *client)
{
	struct met_top *mt;
	size_t i;

	if (!a->ms || !rule || !*client)
		return;
	mt = metrics_top(a->ms, rule);
	if (!mt)
		return;
	mt->denied++;
	hll_add(&mt->hll, client, strlen(client));
	for (i = 0; i < a->ntopk; i++)
		if (strcmp(a->topk[i].rule, rule) == 0)
			break;
	if (i == a->ntopk) {
		if (a->ntopk == MET_TOP_RULES)
			return;
		snprintf(a->topk[i].rule, MET_NAME, "%s", rule);
		a->topk[i].t = topk_new(64); /* K tracked; MET_TOP_K exported */
		a->ntopk++;
	}
	topk_add(a->topk[i].t, client, strlen(client), 1);
}

static void lib_log(int level, const char *msg, void *arg)
{
	(void)arg;
	LOG(level, "%s", msg);
}

static void set_str(struct spoa_req *req, const char *name, const char *s)
{
	(void)spoa_req_set_str(req, SPOP_SCOPE_TXN, name, s, strlen(s));
}

static void set_int(struct spoa_req *req, const char *name, int64_t v)
{
	(void)spoa_req_set_int(req, SPOP_SCOPE_TXN, name, v);
}

/* Seconds for headers: whole, rounded up, at least <min>. */
static int64_t ms_to_s(int64_t ms, int64_t min)
{
	int64_t s = (ms + 999) / 1000;

	return s < min ? min : s;
}

/*
 * RateLimit-Policy: every enforcing limit applied to the request, joined from
 * the values the ruleset prepared for the tier and the endpoint's limits.
 */
static void render_policy(const struct decision *d, char *buf, size_t len)
{
	const char *parts[3] = {d->tier ? d->tier->policy : "",
				d->ep ? d->ep->extra.policy : "", d->ep ? d->ep->global.policy : ""};
	size_t i, used = 0;

	buf[0] = 0;
	if (d->overridden) {
		/* the rates in force (ack_size() made room for them), within policy_max */
		size_t cap = len < d->rs->policy_max + 1 ? len : d->rs->policy_max + 1;

		for (i = 0; i < d->n && used < cap; i++) {
			if (d->ap[i].l->shadow)
				continue;
			used += (size_t)snprintf(buf + used, cap - used, "%s\"%s\";q=%llu;w=%llu",
						 used ? ", " : "", d->ap[i].l->name,
						 (unsigned long long)d->ap[i].rate,
						 (unsigned long long)d->ap[i].l->period_s);
			if (used < cap && d->ap[i].capacity != d->ap[i].rate)
				used += (size_t)snprintf(buf + used, cap - used, ";rl-burst=%llu",
							 (unsigned long long)d->ap[i].capacity);
		}
		if (used < cap)
			return;
		buf[0] = 0;
		used = 0;
	}
	for (i = 0; i < 3; i++) {
		if (!parts[i][0])
			continue;
		if (used)
			used = str_cat(buf, len, used, ", ");
		used = str_cat(buf, len, used, parts[i]);
	}
}

/* The verdict of applied limit <i>, or NULL if there is none (failed open). */
static const struct limit_verdict *verdict_of(const struct decision *d, size_t i)
{
	const struct part *p = &d->parts[d->ap[i].part];

	if (!p->used || !part_enforced(p) ||
	    (p->st != STORE_OK && !(p->fallback && p->has[d->ap[i].slot])))
		return NULL;
	return &p->res.v[d->ap[i].slot];
}

/*
 * The failure ladder for a part Redis could not decide: each limit applies its
 * on_failure policy. "open" gives no verdict (allowed), "closed" denies, "local"
 * decides against this process's coarse copy of the limit. Fills pt->res.
 */
static void fallback(struct decision *d, struct part *pt)
{
	struct agent *a = d->a;
	struct store_query lq;
	struct store_result lr;
	size_t i, map[STORE_MAX_LIMITS];

	memset(&pt->res, 0, sizeof(pt->res));
	pt->res.allowed = true;
	pt->res.n = pt->q.n;
	pt->fallback = true;
	if (!part_enforced(pt))
		return; /* the candidate's alone: it has no failure ladder */
	store_query_init(&lq);
	for (i = 0; i < d->n; i++) {
		const struct rule_limit *l = d->ap[i].l;
		size_t slot = d->ap[i].slot;

		if (&d->parts[d->ap[i].part] != pt)
			continue;
		if (l->on_failure == FAIL_CLOSED && !l->shadow) {
			pt->has[slot] = true;
			pt->res.v[slot].allowed = false;
			pt->res.v[slot].retry_ms = 1000;
			pt->res.allowed = false;
			d->closed = true;
		} else if (l->on_failure == FAIL_LOCAL) {
			memcpy(lq.keys[lq.n], pt->q.keys[slot], sizeof(lq.keys[0]));
			lq.params[lq.n] = d->ap[i].local_lp;
			lq.cost[lq.n] = pt->q.cost[slot];
			map[lq.n++] = slot;
		}
	}
	if (!lq.n)
		return;
	memstore_decide(a->local, &lq, now_us_real(), &lr);
	for (i = 0; i < lq.n; i++) {
		pt->has[map[i]] = true;
		pt->res.v[map[i]] = lr.v[i];
	}
	if (!lr.allowed)
		pt->res.allowed = false;
	a->local_decisions++;
}

/*
 * Requests of this decision's kind that limit <i>'s verdict <v> still admits:
 * its tokens left divided by what such a request costs it. A limit this
 * request does not charge never runs out, unless the request charges no limit
 * at all (it only asks, e.g. the quota route): then requests of one token,
 * what the client asks about.
 */
static int64_t requests_left(const struct decision *d, size_t i, const struct limit_verdict *v)
{
	int64_t cost = d->parts[d->ap[i].part].q.cost[d->ap[i].slot];

	if (cost > 0)
		return v->remaining / cost;
	return d->charges ? INT64_MAX : v->remaining;
}

/*
 * True if limit <i> (verdict <v>) describes an allowed request better than the
 * one chosen so far (<bi>, verdict <bv>): the RateLimit field reports the limit
 * closest to being exhausted (draft-ietf-httpapi-ratelimit-headers, "Multiple
 * policies in response"), i.e. the one that admits the fewest more requests
 * like this one; on a tie the one that takes longest to be fully available.
 * Tokens relative to the quota would pick a 10,000/day limit with 9,999 left
 * over a 10/s bucket with 19 left, which denies first.
 */
static bool closer_to_exhaustion(const struct decision *d, size_t i, const struct limit_verdict *v,
				 size_t bi, const struct limit_verdict *bv)
{
	int64_t n = requests_left(d, i, v), bn = requests_left(d, bi, bv);

	return n < bn || (n == bn && v->reset_ms > bv->reset_ms);
}

/*
 * Fills the ACK from the parts' verdicts. The limit reported is the one that
 * decided: on a denial the one that makes the client wait longest, otherwise
 * the one closest to being exhausted (closer_to_exhaustion()). A part whose
 * store failed counts as allowing (fail-open) and marks the answer degraded.
 */
static void respond(struct decision *d)
{
	struct agent *a = d->a;
	struct spoa_req *req = d->req;
	const struct limit_verdict *pv = NULL;
	const struct rule_limit *l = NULL, *shadow = NULL;
	size_t li_best = 0;
	bool allowed = true, degraded = false, any = false, local = false, local_denied = false;
	char buf[1024];
	size_t i;
	int p;
	int64_t t;

	for (p = 0; p < NPARTS; p++) {
		if (!d->parts[p].used || !part_enforced(&d->parts[p]))
			continue;
		if (d->parts[p].st != STORE_OK) {
			degraded = true;
			a->degraded_by[d->parts[p].st < STORE_COUNT ? d->parts[p].st : STORE_ERROR]++;
		}
		if (d->parts[p].st == STORE_OK || d->parts[p].fallback) {
			any = true;
			if (!d->parts[p].res.allowed)
				allowed = false;
		}
	}
	for (i = 0; i < d->n; i++) {
		const struct limit_verdict *v = verdict_of(d, i);
		const struct rule_limit *li = d->ap[i].l;

		if (!v)
			continue;
		if (d->parts[d->ap[i].part].st != STORE_OK && li->on_failure == FAIL_LOCAL) {
			local = true;
			if (!v->allowed && !li->shadow)
				local_denied = true;
		}
		if (li->shadow) {
			if (!v->allowed && !shadow)
				shadow = li;
			continue;
		}
		if (!l || (!allowed && v->retry_ms > pv->retry_ms) ||
		    (allowed && closer_to_exhaustion(d, i, v, li_best, pv))) {
			l = li;
			pv = v;
			li_best = i;
		}
	}
	if (shadow)
		set_str(req, "shadow", shadow->name);
	set_int(req, "allow", allowed ? 1 : 0);
	d->allowed = allowed;
	d->rule = l;
	a->outcomes[!allowed ? OUT_DENIED : (degraded ? OUT_DEGRADED : OUT_ALLOWED)]++;
	if (a->ms) {
		const char *rule = l ? l->name : "-";

		if (shadow)
			metrics_decision(a->ms, d->tier_name, shadow->name, MR_SHADOW_DENIED);
		if (!allowed) {
			metrics_decision(a->ms, d->tier_name, rule, MR_DENIED);
			note_denied(a, rule, d->client);
		} else {
			metrics_decision(a->ms, d->tier_name, rule,
					 !degraded ? MR_ALLOWED : (local ? MR_LOCAL : MR_DEGRADED));
		}
		/* what the failure ladder answered: fail-open apart from local limits */
		if (degraded && allowed)
			a->ms->c[local ? MC_FB_LOCAL_ALLOWED : MC_FB_OPEN]++;
		else if (degraded && d->closed)
			a->ms->c[MC_FB_CLOSED]++;
		else if (degraded && local_denied)
			a->ms->c[MC_FB_LOCAL_DENIED]++;
		for (p = 0; p < NPARTS; p++)
			if (d->parts[p].used && part_enforced(&d->parts[p]) &&
			    d->parts[p].st != STORE_OK)
				a->ms->degraded[d->parts[p].st < STORE_COUNT ? d->parts[p].st
									 : STORE_ERROR]++;
	}
	if (degraded)
		set_int(req, "degraded", 1);
	if (!allowed && d->closed)
		set_int(req, "status", d->rs->cfg->deny_status);
	if (d->ep) {
		set_str(req, "endpoint", d->ep->name);
		/* the endpoint's cost, sent back with a post-charge (rl-res `charged`): the
		 * difference is taken from what was charged even if a reload changed it */
		if (allowed && d->cost < 0)
			set_int(req, "charged", d->ep->cost);
	}
	if (allowed && (d->ep ? d->ep->post : &d->rs->cfg->post)->from != POST_FROM_CHARGE)
		set_int(req, "post", 1); /* HAProxy sends this response's size or time */
	/* the ruleset knows its longest policy: it is sent whole, never cut */
	if (d->rs->policy_max < sizeof(buf)) {
		render_policy(d, buf, sizeof(buf));
		if (buf[0])
			set_str(req, "policy", buf);
	} else {
		char *pol = xmalloc(d->rs->policy_max + 1);

		render_policy(d, pol, d->rs->policy_max + 1);
		if (pol[0])
			set_str(req, "policy", pol);
		free(pol);
	}
	if (!any || !l)
		return;
	if (allowed) {
		t = ms_to_s(pv->reset_ms, 0);
	} else {
		t = ms_to_s(pv->retry_ms, 1);
		set_int(req, "retry_after", t);
	}
	set_str(req, "rule", l->name);
	{
		/* "<name>";r=<remaining>;t=<seconds>, cut as snprintf() would */
		char num[24];
		size_t used = str_cat(buf, sizeof(buf), 0, "\"");

		used = str_cat(buf, sizeof(buf), used, l->name);
		used = str_cat(buf, sizeof(buf), used, "\";r=");
		fmt_i64(num, pv->remaining);
		used = str_cat(buf, sizeof(buf), used, num);
		used = str_cat(buf, sizeof(buf), used, ";t=");
		fmt_i64(num, t);
		str_cat(buf, sizeof(buf), used, num);
	}
	set_str(req, "ratelimit", buf);
	if (d->rs->cfg->legacy_headers) {
		/* the legacy trio describes the bucket: what it holds, what is left, when full */
		set_int(req, "limit", (int64_t)d->ap[li_best].capacity);
		set_int(req, "remaining", pv->remaining);
		set_int(req, "reset", t);
	}
}

static void refund_done_cb(enum store_status st, const struct store_result *res, void *arg)
{
	struct agent *a = arg;

	(void)res;
	a->pending--;
	if (st != STORE_OK)
		a->refunds_lost++;
}

/*
 * Fills <rq> with the refund of what limits <from> to <to> (exclusive) of
 * <pt>'s query charged: those that admitted it, at minus their cost.
 * Returns the number of limits to refund.
 */
static size_t refund_query(const struct part *pt, size_t from, size_t to, struct store_query *rq)
{
	size_t i;

	store_query_init(rq);
	for (i = from; i < to; i++) {
		if (!pt->res.v[i].allowed || pt->q.cost[i] <= 0)
			continue;
		memcpy(rq->keys[rq->n], pt->q.keys[i], sizeof(rq->keys[0]));
		rq->params[rq->n] = pt->q.params[i];
		rq->cost[rq->n] = -pt->q.cost[i];
		rq->n++;
	}
	return rq->n;
}

/*
 * A request denied by one part was charged by the other (the two live in
 * different Redis slots, so no single script can see both): take that charge
 * back, so a denied request leaves no limit charged.
 */
static void refund(struct decision *d)
{
	struct agent *a = d->a;
	int p;

	for (p = 0; p < NPARTS; p++) {
		struct part *pt = &d->parts[p];
		struct store_query rq;
		struct store_result rr;

		if (!pt->used || !part_enforced(pt) || pt->st != STORE_OK || !pt->res.allowed)
			continue;
		/* answered locally: taken back locally, not charged in Redis yet
		 * (a pre-check) or charged as part of a lease that gets it back */
		if (a->quota && pt->w.local && quota_undo(a->quota, pt->h, &pt->q, pt->w.local,
							       pt->w.lease_end)) {
			a->refunds++;
			continue;
		}
		if (!refund_query(pt, 0, pt->q.n - pt->q.ncand, &rq))
			continue;
		a->refunds++;
		if (a->mem)
			mem_decide(a, &rq, &rr);
		else if (a->store) {
			/* counted in pending: a drain waits for it */
			a->pending++;
			if (store_decide(a->store, &rq, refund_done_cb, a) < 0) {
				a->pending--;
				a->refunds_lost++;
			}
		}
	}
}

/* A cleared part: its scalars; its arrays are written up to their counts before use. */
static void part_clear(struct part *pt)
{
	/* the query's and the result's per-limit arrays are written up to their
	 * counts before anything reads them: only the scalars are cleared */
	_Static_assert(offsetof(struct part, st) < offsetof(struct part, res) &&
		       offsetof(struct part, res) < offsetof(struct part, used),
		       "part_clear() relies on this order");
	pt->d = NULL;
	store_query_init(&pt->q);
	memset(&pt->st, 0, offsetof(struct part, res) + offsetof(struct store_result, v) -
			   offsetof(struct part, st));
	memset(&pt->used, 0, sizeof(*pt) - offsetof(struct part, used));
}

/* A new decision, all zero but for the key buffers of its parts and ap[], cap[]. */
static struct decision *decision_new(struct agent *a)
{
	struct decision *d = a->dfree;
	size_t i;

	if (d) {
		a->dfree = d->next_free;
		a->ndfree--;
	} else {
		d = xmalloc(sizeof(*d));
	}
	memset(d, 0, offsetof(struct decision, ap));
	for (i = 0; i < ARRAY_SIZE(d->parts); i++)
		part_clear(&d->parts[i]);
	return d;
}

static void decision_free(struct decision *d)
{
	struct agent *a = d->a;

	ruleset_unref(d->rs);
	if (a->ndfree < DFREE_MAX) {
		d->next_free = a->dfree;
		a->dfree = d;
		a->ndfree++;
	} else {
		free(d);
	}
}

static void decisions_free_unused(struct agent *a)
{
	while (a->dfree) {
		struct decision *d = a->dfree;

		a->dfree = d->next_free;
		free(d);
	}
	a->ndfree = 0;
}

/* Every part answered: refund if needed, answer HAProxy, free. */
static void decision_finish(struct decision *d)
{
	bool denied = false, charged = false;
	int p;

	for (p = 0; p < NPARTS; p++)
		if (d->parts[p].used)
			part_settle(d, &d->parts[p]);
	for (p = 0; p < NPARTS; p++) {
		if (!d->parts[p].used || !part_enforced(&d->parts[p]))
			continue;
		if (d->parts[p].st != STORE_OK) {
			if (!d->parts[p].res.allowed)
				denied = true;
			continue;
		}
		if (d->parts[p].res.allowed)
			charged = true;
		else
			denied = true;
	}
	if (denied && charged)
		refund(d);
	respond(d);
	spoa_req_done(d->req);
	if (d->rs->cand)
		cand_finish(d);
	if (d->a->ms)
		prom_hist_observe(&d->a->ms->decision_lat, mono() - d->t0);
	decision_free(d);
}

static uint64_t query_hash(const struct store_query *q)
{
	uint64_t h = 0x9e3779b97f4a7c15ULL;
	size_t i;

	for (i = 0; i < q->n; i++) {
		uint64_t v[6] = {h, (uint64_t)q->params[i].alg, (uint64_t)q->params[i].a,
				 (uint64_t)q->params[i].b, (uint64_t)q->cost[i], q->params[i].shadow};

		h = hll_hash(v, sizeof(v)) ^ hll_hash(q->keys[i], strlen(q->keys[i]));
	}
	return h;
}

/*
 * Remembers a denial: until the slowest denying limit would admit the same
 * query again, the answer cannot change (charges only make it worse; a
 * refund or a reload could make it pass a little earlier).
 */
static void blocked_put(struct agent *a, const struct part *pt)
{
	struct blocked_slot *b;
	int64_t wait = 0;
	size_t i;

	if (!a->blocked || pt->res.allowed || pt->q.ncand)
		return;
	for (i = 0; i < pt->res.n; i++)
		if (!pt->res.v[i].allowed && !pt->q.params[i].shadow && pt->res.v[i].retry_ms > wait)
			wait = pt->res.v[i].retry_ms;
	if (wait < 1)
		return;
	b = &a->blocked[pt->h % BLOCKED_SLOTS];
	b->h = pt->h;
	b->at = mono();
	b->until = b->at + wait / 1000.;
	b->res = pt->res;
}

/* A cached denial for <pt>'s query, with its times brought up to date. */
static bool blocked_get(struct agent *a, struct part *pt)
{
	struct blocked_slot *b;
	int64_t elapsed;
	double now;
	size_t i;

	/* whether Redis answers now or not: the denial is a fact Redis computed,
	 * and nothing but a refund or a reload could end it before its time */
	if (!a->blocked || pt->q.ncand) /* the candidate decides every request in Redis */
		return false;
	b = &a->blocked[pt->h % BLOCKED_SLOTS];
	now = mono();
	if (b->h != pt->h || b->until <= now || b->res.n != pt->q.n)
		return false;
	pt->res = b->res;
	elapsed = (int64_t)((now - b->at) * 1000);
	for (i = 0; i < pt->res.n; i++) {
		struct limit_verdict *v = &pt->res.v[i];

		v->retry_ms = v->retry_ms > elapsed ? v->retry_ms - elapsed : (v->retry_ms ? 1 : 0);
		v->reset_ms = v->reset_ms > elapsed ? v->reset_ms - elapsed : 0;
	}
	a->blocked_hits++;
	return true;
}

static void part_done_cb(enum store_status st, const struct store_result *res, void *arg)
{
	struct part *pt = arg;
	struct decision *d = pt->d;

	pt->st = st;
	if (st == STORE_OK && d->a->ms)
		prom_hist_observe(&d->a->ms->redis_lat, mono() - pt->t_sent);
	if (st == STORE_OK && res->n == pt->q.n) {
		pt->res = *res;
		blocked_put(d->a, pt);
	} else if (st == STORE_OK) {
		pt->st = STORE_ERROR;
	}
	d->a->pending--;
	d->waiting--;
	part_settle(d, pt);
	decision_next(d);
}

static void part_waiter_done(struct quota_waiter *w, enum store_status st,
			     const struct store_result *res)
{
	part_done_cb(st, res, container_of(w, struct part, w));
}

/* Microseconds of real time: calendar-aligned windows need the wall clock. */
int64_t now_us_real(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* What this request costs limit <li> (an index in its ruleset's limits) of endpoint <ep>. */
static int64_t request_cost(const struct decision *d, const struct rule_endpoint *ep, size_t li)
{
	if (ep && ep->limit_cost[li] >= 0)
		return ep->limit_cost[li];
	return d->cost >= 0 ? d->cost : (ep ? ep->cost : 1);
}

/* Writes "<prefix>:{<principal><sep><limit><sfx>" into <k>, truncated like snprintf. */
static void limit_key(char *k, size_t cap, const char *prefix, const char *principal,
		      const char *sep, const char *name, const char *sfx)
{
	size_t len = 0;

	k[0] = '\0';
	len = str_cat(k, cap, len, prefix);
	len = str_cat(k, cap, len, ":{");
	len = str_cat(k, cap, len, principal);
	len = str_cat(k, cap, len, sep);
	len = str_cat(k, cap, len, name);
	(void)str_cat(k, cap, len, sfx);
}

/*
 * Adds the limits of <t> to part <p> of <d>, keyed "<prefix>:{<principal>}:<limit><sfx>",
 * with the parameters of limit override <ov> (NULL: none).
 */
static void add_limits(struct decision *d, int p, const struct rule_tier *t, const char *principal,
		       const char *sfx, const struct ovr_entry *ov)
{
	struct part *pt = &d->parts[p];
	size_t i;

	if (!pt->used)
		pt->cap = -1;
	for (i = 0; i < t->n && pt->q.n < STORE_MAX_LIMITS && d->n < MAX_APPLIED; i++) {
		const struct rule_limit *l = &d->rs->limits[t->idx[i]];
		int64_t cost = request_cost(d, d->ep, t->idx[i]);

		limit_key(pt->q.keys[pt->q.n], sizeof(pt->q.keys[0]), d->rs->cfg->redis.key_prefix,
			  principal, "}:", l->name, sfx);
		pt->q.params[pt->q.n] = l->lp;
		pt->q.cost[pt->q.n] = cost;
		if (cost > 0)
			d->charges = true;
		d->ap[d->n].rate = l->rate;
		d->ap[d->n].capacity = l->capacity;
		d->ap[d->n].local_lp = l->local_lp;
		if (ov) {
			const struct cfg_limit *cl = &d->rs->cfg->limits[t->idx[i]];
			uint64_t rate, burst;

			/* the parameters travel with this call: every bucket of the key at once */
			if (ovr_adjust(ov, l->name, cl->rate, cl->burst, &rate, &burst)) {
				rule_limit_params(d->rs->cfg, cl, rate, burst, &pt->q.params[pt->q.n],
						  &d->ap[d->n].local_lp);
				d->ap[d->n].rate = rate;
				d->ap[d->n].capacity = cl->alg == ALG_GCRA ? burst : rate;
				d->overridden = true;
			}
		}
		if (!l->shadow && cost > 0) {
			double c = l->budget * (double)d->ap[d->n].rate / (double)cost;

			pt->cap = pt->cap < 0 || c < pt->cap ? c : pt->cap;
		}
		d->ap[d->n].l = l;
		d->ap[d->n].part = p;
		d->ap[d->n].slot = pt->q.n;
		d->n++;
		pt->q.n++;
		pt->used = true;
	}
}

/*
 * The key part for an anonymous client: its address masked to the prefix.
 * Without an address: "ip:none", and false.
 */
static bool principal_ip(const struct ruleset *rs, const struct spop_data *ip, char *out,
			 size_t outlen)
{
	uint8_t addr[16];
	char hex[33];
	unsigned bits, i, len;

	if (ip->type == SPOP_T_IPV4) {
		len = 4;
		bits = rs->cfg->ipv4_prefix;
		memcpy(addr, ip->v.ipv4, 4);
	} else if (ip->type == SPOP_T_IPV6) {
		len = 16;
		bits = rs->cfg->ipv6_prefix;
		memcpy(addr, ip->v.ipv6, 16);
		/* IPv4-mapped addresses are IPv4 clients */
		if (memcmp(addr, "\0\0\0\0\0\0\0\0\0\0\xff\xff", 12) == 0) {
			len = 4;
			bits = rs->cfg->ipv4_prefix;
			memmove(addr, addr + 12, 4);
		}
	} else {
		snprintf(out, outlen, "ip:none");
		return false;
	}
	for (i = 0; i < len; i++) {
		unsigned keep = bits >= 8 * (i + 1) ? 8 : (bits > 8 * i ? bits - 8 * i : 0);

		addr[i] &= (uint8_t)(0xff00 >> keep);
	}
	hex_encode(addr, len, hex);
	snprintf(out, outlen, "ip%u:%s/%u", len == 4 ? 4 : 6, hex, bits);
	return true;
}

/* The printable address prefix of an anonymous client, for top offenders. */
static void client_ip(const struct ruleset *rs, const struct spop_data *ip, char *out,
		      size_t outlen)
{
	char host[INET6_ADDRSTRLEN];
	uint8_t addr[16] = {0};
	unsigned bits, i, len;
	int af;

	if (ip->type == SPOP_T_IPV4) {
		af = AF_INET;
		len = 4;
		bits = rs->cfg->ipv4_prefix;
		memcpy(addr, ip->v.ipv4, 4);
	} else if (ip->type == SPOP_T_IPV6) {
		af = AF_INET6;
		len = 16;
		bits = rs->cfg->ipv6_prefix;
		memcpy(addr, ip->v.ipv6, 16);
	} else {
		snprintf(out, outlen, "none");
		return;
	}
	for (i = 0; i < len; i++) {
		unsigned keep = bits >= 8 * (i + 1) ? 8 : (bits > 8 * i ? bits - 8 * i : 0);

		addr[i] &= (uint8_t)(0xff00 >> keep);
	}
	inet_ntop(af, addr, host, sizeof(host));
	snprintf(out, outlen, "%s/%u", host, bits);
}

/*
 * Starts part <pt> of <d>: answered at once from the blocked-key cache, the
 * memory store or a local quota, or sent to the store. Returns true when it
 * waits for the store (part_done_cb() follows).
 */
static bool part_start(struct decision *d, struct part *pt)
{
	struct agent *a = d->a;
	int ret;

	pt->d = d;
	pt->h = query_hash(&pt->q);
	if (blocked_get(a, pt)) {
		pt->st = STORE_OK;
		return false;
	}
	if (a->mem) {
		mem_decide(a, &pt->q, &pt->res);
		pt->st = STORE_OK;
		blocked_put(a, pt);
		return false;
	}
	d->waiting++;
	a->pending++;
	pt->t_sent = mono();
	pt->q.answer_by = d->answer_by;
	if (a->quota && !pt->q.ncand) {
		enum store_status st = STORE_ERROR;
		enum quota_path qp;

		if (pt->cap < 0)
			pt->cap = 0;
		pt->w.done = part_waiter_done;
		qp = quota_decide(a->quota, pt->h, &pt->q, pt->cap, &pt->w, &pt->res, &st);
		if (qp == QUOTA_WAIT)
			return true;
		if (qp != QUOTA_BYPASS) {
			pt->st = qp == QUOTA_LOCAL ? STORE_OK : st;
			a->pending--;
			d->waiting--;
			return false;
		}
	}
	ret = store_decide(a->store, &pt->q, part_done_cb, pt);
	if (ret < 0) {
		pt->st = (enum store_status)-ret;
		a->pending--;
		d->waiting--;
		return false;
	}
	return true;
}

/* A part the store could not decide gets the failure ladder's verdicts (once). */
static void part_settle(struct decision *d, struct part *pt)
{
	if (pt->st != STORE_OK && !pt->fallback)
		fallback(d, pt);
}

/*
 * Decides the parts of <d> one after the other, then finishes. The principal's
 * part goes first; the endpoint's global part is sent only if it allowed, so a
 * denied client costs one Redis call and never charges the global budget (a
 * global denial after a principal's charge is still refunded).
 */
static void decision_next(struct decision *d)
{
	while (d->next < NPARTS) {
		struct part *pt = &d->parts[d->next++];
		bool denied = false;
		int p;

		if (!pt->used)
			continue;
		for (p = 0; &d->parts[p] != pt; p++)
			if (d->parts[p].used && part_enforced(&d->parts[p]) && !d->parts[p].res.allowed)
				denied = true;
		if (pt->q.ncand && pt != &d->parts[0])
			cand_trim(d, pt, denied);
		else if (denied)
			pt->q.n = 0;
		if (!pt->q.n) {
			/* not sent, no verdict: the earlier part decided */
			pt->used = false;
			continue;
		}
		if (part_start(d, pt))
			return;
		part_settle(d, pt);
	}
	decision_finish(d);
}

/*
 * Answers an anonymous request that came without a source address under
 * anonymous.without_address = "deny": refused with fallback.deny_status, no
 * Redis call (every such client would otherwise share one bucket).
 */
static void deny_no_address(struct decision *d)
{
	struct spoa_req *req = d->req;

	if (d->post) {
		/* its request was denied the same way: nothing to charge */
		decision_free(d);
		return;
	}

	set_int(req, "allow", 0);
	set_int(req, "status", d->rs->cfg->deny_status);
	set_int(req, "retry_after", 1);
	d->a->outcomes[OUT_DENIED]++;
	if (d->a->ms) {
		metrics_decision(d->a->ms, d->rs->anon.name, "-", MR_DENIED);
		prom_hist_observe(&d->a->ms->decision_lat, mono() - d->t0);
	}
	spoa_req_done(req);
	decision_free(d);
}

/* The source address of <d> as bytes: 4 or 16 of them, or 0 without one. */
static size_t ip_bytes(const struct spop_data *ip, const uint8_t **b)
{
	*b = ip->type == SPOP_T_IPV4 ? ip->v.ipv4 : ip->v.ipv6;
	return ip->type == SPOP_T_IPV4 ? 4 : ip->type == SPOP_T_IPV6 ? 16 : 0;
}

/*
 * The limit override of <d>'s principal, or NULL: its API key's when <keyed>,
 * else its address's (anonymous clients). Valid until the loop runs again.
 */
static const struct ovr_entry *ovr_limit(const struct decision *d, bool keyed)
{
	const struct overrides *ov = d->a->ovr;
	const uint8_t *b;
	size_t len;

	if (!ov || !ovr_count(ov))
		return NULL;
	if (keyed)
		return ovr_match_key(ov, OVR_LIMIT, d->digest, now_us_real() / 1000000);
	len = ip_bytes(&d->ip, &b);
	return len ? ovr_match_addr(ov, OVR_LIMIT, b, len, now_us_real() / 1000000) : NULL;
}

/*
 * Answers <d> at once when a block override covers its API key (<keyed>) or
 * its source address: denied with the block's status and a Retry-After of
 * the time it has left, counted under the rule "blocked" and tier <tier>
 * (NULL: not known without a lookup); no Redis call at all. Returns false
 * (nothing done) when it is not blocked.
 */
static bool deny_blocked(struct decision *d, bool keyed, const struct rule_tier *tier)
{
	struct agent *a = d->a;
	const struct ovr_entry *e = NULL;
	const uint8_t *b;
	int64_t now_ms, left;
	size_t len;

	/* a post-charge follows a request that was answered: blocked since, or not */
	if (d->post || !a->ovr || !ovr_count(a->ovr))
		return false;
	now_ms = now_us_real() / 1000;
	if (keyed)
		e = ovr_match_key(a->ovr, OVR_BLOCK, d->digest, now_ms / 1000);
	len = ip_bytes(&d->ip, &b);
	if (!e && len)
		e = ovr_match_addr(a->ovr, OVR_BLOCK, b, len, now_ms / 1000);
	if (!e)
		return false;
	left = e->until * 1000 - now_ms;
	set_int(d->req, "allow", 0);
	set_int(d->req, "status", ovr_block_status(a->ovr, e));
	set_int(d->req, "retry_after", ms_to_s(left, 1));
	set_str(d->req, "rule", "blocked");
	a->outcomes[OUT_DENIED]++;
	a->ovr_blocked++;
	if (a->ms) {
		if (keyed)
			snprintf(d->client, sizeof(d->client), "%.10s", d->principal);
		else
			client_ip(d->rs, &d->ip, d->client, sizeof(d->client));
		metrics_decision(a->ms, tier ? tier->name : "-", "blocked", MR_DENIED);
		note_denied(a, "blocked", d->client);
		prom_hist_observe(&a->ms->decision_lat, mono() - d->t0);
	}
	spoa_req_done(d->req);
	decision_free(d);
	return true;
}

/*
 * Builds the store queries of <d> for tier <tier> (NULL: anonymous) and
 * decides them (see decision_next()).
 */
static void decision_run(struct decision *d, const struct rule_tier *tier)
{
	const struct ruleset *rs = d->rs;
	const struct ovr_entry *ov;
	char principal[80];
	char sfx[72];

	if (tier) {
		principal[0] = '\0';
		(void)str_cat(principal, sizeof(principal), 0, d->principal);
		/* a short fingerprint: 32 bits of the digest, never the key */
		memcpy(d->client, d->principal, 10);
		d->client[10] = '\0';
	} else {
		tier = &rs->anon;
		if (!principal_ip(rs, &d->ip, principal, sizeof(principal))) {
			d->a->no_address++;
			if (rs->cfg->no_address == NO_ADDRESS_DENY) {
				deny_no_address(d);
				return;
			}
		}
		client_ip(rs, &d->ip, d->client, sizeof(d->client));
	}
	d->tier = tier;
	d->tier_name = tier->name;
	ov = ovr_limit(d, tier != &rs->anon);
	add_limits(d, 0, tier, principal, "", ov);
	if (d->ep) {
		char global[80];

		snprintf(sfx, sizeof(sfx), "@%s", d->ep->name);
		add_limits(d, 0, &d->ep->extra, principal, sfx, ov);
		snprintf(global, sizeof(global), "g:%s", d->ep->name);
		add_limits(d, 1, &d->ep->global, global, "", NULL);
	}
	if (d->post) {
		post_send(d);
		return;
	}
	if (rs->cand)
		cand_add(d, tier, principal, ov);
	if (d->overridden)
		d->a->ovr_limited++;
	decision_next(d);
}

static struct tier_slot *tier_slot(struct agent *a, const uint8_t *digest)
{
	uint64_t h;

	memcpy(&h, digest, sizeof(h));
	return &a->tcache[h % a->tcache_size];
}

static void tier_lookup_cb(enum store_status st, const char *val, size_t len, void *arg)
{
	struct decision *d = arg;
	struct agent *a = d->a;
	const struct rule_tier *tier = NULL;

	a->pending--;
	if (st == STORE_OK) {
		/* a reload may have dropped (or resized) the cache meanwhile */
		if (a->tcache) {
			struct tier_slot *slot = tier_slot(a, d->digest);

			memcpy(slot->digest, d->digest, sizeof(slot->digest));
			snprintf(slot->tier, sizeof(slot->tier), "%.*s",
				 (int)(len < 64 ? len : 64), val ? val : "");
			slot->expires = ev_now(a->loop) + d->rs->cfg->tier_cache_ttl_ms / 1000.;
		}
		tier = ruleset_tier_find(d->rs, val, val ? len : 0);
		if (d->rs->cand)
			d->ctier = ruleset_tier_find(d->rs->cand, val, val ? len : 0);
	}
	/* a failed lookup is not cached: the next request asks again */
	if (!tier && d->rs->cfg->unknown_keys == UNKNOWN_DEFAULT_TIER)
		tier = &d->rs->tiers[d->rs->default_tier];
	decision_run(d, tier);
}

/*
 * The Redis key part of API key <key>: "k:" and the hex of the first 16 bytes
 * of its SHA-256 (fixed length, whatever the key holds) into d->principal, the
 * digest into d->digest.
 */
static void principal_key(struct decision *d, const char *key, size_t key_len)
{
	struct digest_slot one, *ds = &one;
	uint8_t md[SHA256_LEN];

	if (key_len && key_len <= DCACHE_KEY)
		ds = &d->a->dcache[hll_hash(key, key_len) % DCACHE_SLOTS];
	if (ds == &one || ds->len != key_len || memcmp(ds->key, key, key_len) != 0) {
		sha256(key, key_len, md);
		memcpy(ds->digest, md, sizeof(ds->digest));
		hex_encode(md, 16, ds->hex);
		if (ds != &one) {
			ds->len = (uint8_t)key_len;
			memcpy(ds->key, key, key_len);
		}
	}
	memcpy(d->digest, ds->digest, sizeof(d->digest));
	memcpy(d->principal, "k:", 2);
	memcpy(d->principal + 2, ds->hex, sizeof(ds->hex));
}

/* Reads our arguments from message <m>; unknown arguments are ignored. */
static void read_args(struct spop_msg *m, struct req_args *ra)
{
	struct spop_str name;
	struct spop_data v;
	int64_t i = 0;

	memset(ra, 0, sizeof(*ra));
	ra->cost = -1;
	ra->charged = -1;
	while (spop_arg_next(m, &name, &v) > 0) {
		bool str = v.type == SPOP_T_STR || v.type == SPOP_T_BIN;

		if (spop_str_eq(&name, "key")) {
			if (str)
				ra->key = v.v.s;
		} else if (spop_str_eq(&name, "tier")) {
			if (str)
				ra->tier = v.v.s;
		} else if (spop_str_eq(&name, "ip")) {
			if (v.type == SPOP_T_IPV4 || v.type == SPOP_T_IPV6)
				ra->ip = v;
		} else if (spop_str_eq(&name, "method")) {
			if (str)
				ra->method = v.v.s;
		} else if (spop_str_eq(&name, "path")) {
			if (str)
				ra->path = v.v.s;
		} else if (spop_str_eq(&name, "route")) {
			if (str)
				ra->route = v.v.s;
		} else if (spop_str_eq(&name, "endpoint")) {
			ra->has_endpoint = true;
			if (str)
				ra->endpoint = v.v.s;
		} else if (spop_str_eq(&name, "charge")) {
			ra->charge = v;
		} else if (spop_str_eq(&name, "charged")) {
			/* what we said in the request's ACK; anything else: as if not sent */
			if (spop_data_int(&v, &i) && i >= 0 && i <= COST_MAX)
				ra->charged = i;
		} else if (spop_str_eq(&name, "bytes")) {
			ra->bytes = v;
		} else if (spop_str_eq(&name, "time")) {
			ra->time = v;
		} else if (spop_str_eq(&name, "cost")) {
			/* NULL: HAProxy had no value, as if not sent. Anything but an
			 * integer in 0..COST_MAX is an error, never free: the maximum */
			if (v.type == SPOP_T_NULL)
				continue;
			if ((v.type == SPOP_T_UINT32 || v.type == SPOP_T_UINT64)
				    ? v.v.u <= COST_MAX
				    : spop_data_int(&v, &i) && i >= 0 && i <= COST_MAX) {
				ra->cost = v.type == SPOP_T_UINT32 || v.type == SPOP_T_UINT64
						   ? (int64_t)v.v.u
						   : i;
				ra->cost_invalid = false;
			} else {
				ra->cost = COST_MAX;
				ra->cost_invalid = true;
			}
		}
	}
}

static void decision_begin(struct decision *d);
static void post_begin(struct agent *a, struct spoa_req *req, struct spop_msg *m);

/*
 * A new decision for the request of <ra> (its message read) with endpoint
 * <ep>, answering <req> (NULL: a post-charge, nothing to answer).
 */
static struct decision *decision_start(struct agent *a, struct spoa_req *req,
				       const struct req_args *ra, const struct rule_endpoint *ep)
{
	struct ruleset *rs = a->rs;
	struct decision *d = decision_new(a);

	d->t0 = mono();
	d->answer_by = 0;
	d->a = a;
	d->req = req;
	list_init(&d->park);
	d->rs = ruleset_ref(rs);
	d->ip = ra->ip;
	d->cost = ra->cost;
	d->ep = ep;
	if (rs->cand)
		d->cep = ruleset_endpoint(rs->cand, ra->route.p, ra->route.len, ra->method.p,
					  ra->method.len, ra->path.p, ra->path.len);
	d->keyed = ra->key.len > 0;
	if (d->keyed) {
		principal_key(d, ra->key.p, ra->key.len);
		d->sent_tier = ruleset_tier_find(rs, ra->tier.p, ra->tier.len);
		if (rs->cand)
			d->ctier = ruleset_tier_find(rs->cand, ra->tier.p, ra->tier.len);
	}
	return d;
}

static void on_notify(struct spoa_req *req, struct spop_rd *msgs, void *arg)
{
	struct agent *a = arg;
	struct ruleset *rs = a->rs;
	struct decision *d;
	struct req_args ra;
	struct spop_msg m;
	bool found = false;
	int ret;

	while ((ret = spop_msg_next(msgs, &m)) > 0) {
		if (spop_str_eq(&m.name, rs->cfg->message)) {
			found = true;
			break;
		}
		if (spop_str_eq(&m.name, rs->cfg->post_message)) {
			post_begin(a, req, &m);
			return;
		}
	}
	if (!found) {
		/* nothing to decide: answer without a verdict, HAProxy lets it pass */
		a->outcomes[OUT_IGNORED]++;
		spoa_req_done(req);
		return;
	}
	read_args(&m, &ra);
	if (rs->cfg->store == STORE_KIND_ALLOW) {
		a->outcomes[OUT_ALLOWED]++;
		set_int(req, "allow", 1);
		spoa_req_done(req);
		return;
	}
	if (ra.cost_invalid)
		a->invalid_costs++;
	d = decision_start(a, req, &ra,
			   ruleset_endpoint(rs, ra.route.p, ra.route.len, ra.method.p,
					    ra.method.len, ra.path.p, ra.path.len));
	if (rs->cfg->spoe_timeout_ms)
		d->answer_by = d->t0 + rs->cfg->spoe_timeout_ms * (ANSWER_SHARE / 1000.) -
			       spoa_req_age_us(req) / 1e6;
	decision_begin(d);
}

/*
 * Decides <d>, whose arguments were read: a block override answers at once;
 * else the tier (looked up in Redis if needed), then decision_run(). Right
 * after start, while the overrides in force are not known yet and Redis is
 * ready, it waits for them on a->parked (one or two round trips).
 */
static void decision_begin(struct decision *d)
{
	struct agent *a = d->a;
	const struct ruleset *rs = d->rs;
	const struct rule_tier *tier = d->sent_tier;

	if (a->ovr && !ovr_settled(a->ovr) && !a->no_park && store_ready(a->store)) {
		list_append(&a->parked, &d->park);
		a->pending++;
		ovr_kick(a->ovr); /* may wake us at once */
		return;
	}
	if (!d->keyed) {
		if (!deny_blocked(d, false, &rs->anon))
			decision_run(d, NULL);
		return;
	}
	/* before any Redis call, the tier lookup included: a blocked client costs Redis nothing */
	if (a->ovr && ovr_count(a->ovr) &&
	    deny_blocked(d, true,
			 tier ? tier
			 : rs->cfg->tier_hash ? NULL /* not looked up */
			 : rs->cfg->unknown_keys == UNKNOWN_DEFAULT_TIER ? &rs->tiers[rs->default_tier]
									 : &rs->anon))
		return;
	if (!tier && rs->cfg->tier_hash && a->store && a->tcache) {
		struct tier_slot *slot = tier_slot(a, d->digest);

		if (slot->expires > ev_now(a->loop) &&
		    memcmp(slot->digest, d->digest, sizeof(d->digest)) == 0) {
			a->tier_hits++;
			tier = ruleset_tier_find(rs, slot->tier, strlen(slot->tier));
			if (rs->cand)
				d->ctier = ruleset_tier_find(rs->cand, slot->tier,
							     strlen(slot->tier));
		} else {
			a->tier_misses++;
			a->pending++;
			/* the field is the digest's hex: the principal after "k:" */
			if (store_hget(a->store, rs->cfg->tier_hash, d->principal + 2, tier_lookup_cb,
				       d) == 0)
				return;
			a->pending--;
		}
	}
	if (!tier && rs->cfg->unknown_keys == UNKNOWN_DEFAULT_TIER)
		tier = &rs->tiers[rs->default_tier];
	decision_run(d, tier);
}

/*
 * Candidate policy
 *
 * A ruleset may carry a candidate (rs->cand): a second policy evaluated on
 * every request next to the enforced one and never enforced. Its limits go
 * last in the same store queries as the enforced ones, keyed
 * "<prefix>:{<principal>}:c:<limit><sfx>" (same principal, same hash tag, a
 * name no enforced limit has), and the store sends them as a second decision
 * of the same script call (the global limits of a candidate endpoint named
 * unlike the enforced one with global limits: another hash tag, so a call of
 * their own, part 2). The candidate decides as a whole policy of its
 * own: a request passes it only if all of its limits admit it, and only then
 * are its buckets charged, whatever the enforced policy decided; so on the
 * same traffic its would-be denials are exactly what enforcing it would deny.
 * Its verdicts change no answer: they are counted (metrics_candidate(), and
 * top offenders under MET_CAND_TOP).
 *
 * To see every request, a query with a candidate goes to Redis: the local
 * quotas and the blocked-key cache do not answer it. Decisions made without
 * a script call (a block override, a request without address denied, Redis
 * failing) have no candidate verdict; only the last are counted, as
 * unevaluated (the first two apply alike whatever the policy).
 */

/*
 * Adds the limits of candidate tier <t> to part <p> of <d> after every
 * enforced one, as add_limits() does, keyed "...:c:<limit><sfx>".
 */
static void cand_limits(struct decision *d, int p, const struct rule_tier *t,
			const char *principal, const char *sfx, const struct ovr_entry *ov)
{
	const struct ruleset *c = d->rs->cand;
	struct part *pt = &d->parts[p];
	size_t i;

	for (i = 0; i < t->n && pt->q.n < STORE_MAX_LIMITS && d->cn < MAX_APPLIED; i++) {
		const struct rule_limit *l = &c->limits[t->idx[i]];
		int64_t cost = request_cost(d, d->cep, t->idx[i]);

		limit_key(pt->q.keys[pt->q.n], sizeof(pt->q.keys[0]), d->rs->cfg->redis.key_prefix,
			  principal, "}:c:", l->name, sfx);
		pt->q.params[pt->q.n] = l->lp;
		pt->q.cost[pt->q.n] = cost;
		if (ov) {
			const struct cfg_limit *cl = &c->cfg->limits[t->idx[i]];
			struct limit_params local;
			uint64_t rate, burst;

			/* a limit override of this name applies as it would once promoted */
			if (ovr_adjust(ov, l->name, cl->rate, cl->burst, &rate, &burst))
				rule_limit_params(c->cfg, cl, rate, burst, &pt->q.params[pt->q.n],
						  &local);
		}
		d->cap[d->cn].l = l;
		d->cap[d->cn].part = p;
		d->cap[d->cn].slot = pt->q.ncand;
		d->cn++;
		pt->q.n++;
		pt->q.ncand++;
		pt->used = true;
	}
}

/*
 * Adds the candidate's limits to <d>, whose enforced tier is <tier> and
 * principal <principal>: the candidate tier of the same name (the one HAProxy
 * or the tier lookup named, if the candidate has it), else its default tier;
 * a request the enforced policy treats as anonymous is anonymous for the
 * candidate too (one principal, one hash tag for both).
 */
static void cand_add(struct decision *d, const struct rule_tier *tier, const char *principal,
		     const struct ovr_entry *ov)
{
	const struct ruleset *c = d->rs->cand;
	char sfx[72], global[80];

	if (tier == &d->rs->anon)
		d->ctier = &c->anon;
	else if (!d->ctier)
		d->ctier = ruleset_tier_find(c, tier->name, strlen(tier->name));
	if (!d->ctier)
		d->ctier = &c->tiers[c->default_tier];
	cand_limits(d, 0, d->ctier, principal, "", ov);
	if (d->cep) {
		snprintf(sfx, sizeof(sfx), "@%s", d->cep->name);
		cand_limits(d, 0, &d->cep->extra, principal, sfx, ov);
		snprintf(global, sizeof(global), "g:%s", d->cep->name);
		/* the keys of one call share a hash tag (one Redis Cluster slot):
		 * with the enforced endpoint's global limits under another name,
		 * the candidate's go in a call of their own */
		cand_limits(d, d->parts[1].used && strcmp(d->ep->name, d->cep->name) != 0 ? 2 : 1,
			    &d->cep->global, global, "", NULL);
	}
}

/* True when part <pt>'s candidate decision was made and admits the request. */
static bool cand_part_allows(const struct part *pt)
{
	return pt->used && pt->q.ncand && pt->st == STORE_OK && pt->res.cand_ok &&
	       pt->res.cand_allowed;
}

/*
 * Before part <pt> (the endpoint's global limits) is sent: the candidate's
 * limits go only if its principal part admitted the request (as they would
 * once enforced), the enforced ones only if the enforced policy did (not
 * <drop_own>): then the candidate's are moved first. Leaves q.n = 0 when
 * nothing is left to send.
 */
static void cand_trim(struct decision *d, struct part *pt, bool drop_own)
{
	size_t ne = pt->q.n - pt->q.ncand, i;

	if (!cand_part_allows(&d->parts[0])) {
		pt->q.n = ne;
		pt->q.ncand = 0;
	}
	if (!drop_own || !ne)
		return;
	for (i = 0; i < pt->q.ncand; i++) {
		memcpy(pt->q.keys[i], pt->q.keys[ne + i], sizeof(pt->q.keys[0]));
		pt->q.params[i] = pt->q.params[ne + i];
		pt->q.cost[i] = pt->q.cost[ne + i];
	}
	pt->q.n = pt->q.ncand;
}

static void cand_refund_cb(enum store_status st, const struct store_result *res, void *arg)
{
	struct agent *a = arg;

	(void)st;
	(void)res;
	a->pending--;
}

/*
 * The candidate admitted the request in part <pt> and charged it there, but
 * denied it in the other: take the charge back, as refund() does for the
 * enforced policy.
 */
static void cand_refund(struct decision *d, const struct part *pt)
{
	struct agent *a = d->a;
	size_t base = pt->q.n - pt->q.ncand;
	struct store_query rq;
	struct store_result rr;

	if (!refund_query(pt, base, pt->q.n, &rq))
		return;
	if (a->mem) {
		memstore_decide(a->mem, &rq, now_us_real(), &rr);
	} else if (a->store) {
		a->pending++;
		if (store_decide(a->store, &rq, cand_refund_cb, a) < 0)
			a->pending--;
	}
}

/*
 * After <d> was answered: what the candidate decided, in order of its parts
 * (a part it denied ends it), counted against what the enforced policy
 * answered (d->allowed, d->rule).
 */
static void cand_finish(struct decision *d)
{
	struct agent *a = d->a;
	const struct rule_limit *cl = NULL;
	int64_t wait = -1;
	int verdict = 1, p;
	size_t i;

	if (!d->cn)
		return;
	for (p = 0; p < NPARTS && verdict == 1; p++) {
		const struct part *pt = &d->parts[p];
		size_t base = pt->q.n - pt->q.ncand;
		bool needed = false;

		for (i = 0; i < d->cn; i++)
			needed = needed || d->cap[i].part == p;
		if (!needed)
			continue;
		if (!pt->used || !pt->q.ncand || pt->st != STORE_OK || !pt->res.cand_ok) {
			verdict = -1;
			break;
		}
		if (pt->res.cand_allowed)
			continue;
		verdict = 0;
		/* the rule reported is the one that makes the client wait longest */
		for (i = 0; i < d->cn; i++) {
			const struct limit_verdict *v = &pt->res.v[base + d->cap[i].slot];

			if (d->cap[i].part == p && !v->allowed && !d->cap[i].l->shadow &&
			    v->retry_ms > wait) {
				wait = v->retry_ms;
				cl = d->cap[i].l;
			}
		}
		if (p >= 1)
			cand_refund(d, &d->parts[0]);
	}
	if (!a->ms)
		return;
	if (verdict < 0) {
		a->ms->c[MC_CAND_UNEVALUATED]++;
	} else if (verdict) {
		metrics_candidate(a->ms, d->ctier->name, "-", MCR_WOULD_ALLOW);
		if (!d->allowed)
			metrics_candidate(a->ms, d->tier_name, d->rule ? d->rule->name : "-",
					  MCR_LIFTED);
	} else {
		char rule[MET_NAME];

		metrics_candidate(a->ms, d->ctier->name, cl ? cl->name : "-", MCR_WOULD_DENY);
		if (d->allowed)
			metrics_candidate(a->ms, d->ctier->name, cl ? cl->name : "-",
					  MCR_NEW_DENIAL);
		/* the same fingerprints and sketches as real denials, under their own name */
		snprintf(rule, sizeof(rule), "%s%s", MET_CAND_TOP, cl ? cl->name : "-");
		note_denied(a, rule, d->client);
	}
}

/*
 * The memory store's answer to <q>: its own limits decided, then its
 * candidate's (the last q->ncand) as a decision of their own.
 */
static void mem_decide(struct agent *a, const struct store_query *q, struct store_result *res)
{
	size_t ne = q->n - q->ncand, i;
	int64_t now = now_us_real();
	struct store_query cq;
	struct store_result cr;

	if (!q->ncand) {
		memstore_decide(a->mem, q, now, res);
		return;
	}
	store_query_init(&cq);
	for (i = 0; i < ne; i++) {
		memcpy(cq.keys[i], q->keys[i], sizeof(cq.keys[0]));
		cq.params[i] = q->params[i];
		cq.cost[i] = q->cost[i];
	}
	cq.n = ne;
	memset(res, 0, sizeof(*res));
	res->allowed = true;
	res->now_us = now;
	if (ne)
		memstore_decide(a->mem, &cq, now, res);
	for (i = 0; i < q->ncand; i++) {
		memcpy(cq.keys[i], q->keys[ne + i], sizeof(cq.keys[0]));
		cq.params[i] = q->params[ne + i];
		cq.cost[i] = q->cost[ne + i];
	}
	cq.n = q->ncand;
	memstore_decide(a->mem, &cq, now, &cr);
	for (i = 0; i < q->ncand; i++)
		res->v[ne + i] = cr.v[i];
	res->n = q->n;
	res->cand_ok = true;
	res->cand_allowed = cr.allowed;
}

/*
 * POST-CHARGES
 *
 * The cost of some requests is known only once they are served (rows scanned,
 * bytes sent, time taken). HAProxy sends a second message on the response
 * (post_charge.message, "rl-res"), with the request's arguments, the endpoint
 * its ACK named, and the response's cost: `charge` (a header the application
 * sets), `bytes` or `time`, the one post_charge.from names (per endpoint, or
 * the top level's). It is answered at once with an empty ACK: the client has
 * its response, nothing waits for the charge.
 *
 * The cost in tokens, ceil(value / per) clamped to post_charge.max, replaces
 * the request's own cost (what it was charged at request time: the endpoint's
 * cost or HAProxy's `cost`); limits with a cost of their own (limit_costs)
 * keep it. The same principal and limits as the request's get the difference
 * in one report per part (lua/decide.lua's report: charged whatever is left,
 * so a bucket goes into debt and a window past its limit; a refund when the
 * response cost less). Later requests wait until the debt is repaid, and
 * their Retry-After and RateLimit fields say so. A failure is counted and
 * otherwise ignored: no failure ladder, no retry (the charge may have run).
 */

/* How a response's cost reads (post_tokens()). */
enum post_value {
	PV_OK      = 0,
	PV_CLAMPED = 1,         /* above post_charge.max: the max */
	PV_ABSENT  = 2,         /* not sent, or NULL (no such header) */
	PV_INVALID = 3,         /* not a non-negative decimal integer */
};

/*
 * The tokens of value <v> under <pc>: a non-negative integer, or a string of
 * decimal digits (a header; surrounding blanks ignored), ceil(value / per),
 * at most max. Anything else is PV_INVALID; nothing wraps (any number of
 * digits saturates, then clamps to the max).
 */
static enum post_value post_tokens(const struct spop_data *v, const struct cfg_post *pc,
				   int64_t *tokens)
{
	uint64_t x = 0, t;
	int64_t i;

	if (v->type == SPOP_T_NULL)
		return PV_ABSENT;
	if (v->type == SPOP_T_STR || v->type == SPOP_T_BIN) {
		const char *p = v->v.s.p, *end = p + v->v.s.len;

		while (p < end && (*p == ' ' || *p == '\t'))
			p++;
		while (end > p && (end[-1] == ' ' || end[-1] == '\t'))
			end--;
		if (p == end)
			return PV_INVALID;
		for (; p < end; p++) {
			if (*p < '0' || *p > '9')
				return PV_INVALID;
			x = x > (UINT64_MAX - 9) / 10 ? UINT64_MAX : x * 10 + (uint64_t)(*p - '0');
		}
	} else if (v->type == SPOP_T_UINT32 || v->type == SPOP_T_UINT64) {
		x = v->v.u;
	} else if (spop_data_int(v, &i) && i >= 0) {
		x = (uint64_t)i;
	} else {
		return PV_INVALID;
	}
	t = x / pc->per + (x % pc->per != 0);
	if (t > (uint64_t)pc->max) {
		*tokens = pc->max;
		return PV_CLAMPED;
	}
	*tokens = (int64_t)t;
	return PV_OK;
}

static void post_done_cb(enum store_status st, const struct store_result *res, void *arg)
{
	struct decision *d = arg;
	struct agent *a = d->a;

	(void)res;
	a->pending--;
	if (st != STORE_OK)
		a->post[POST_FAILED]++;
	if (!--d->waiting)
		decision_free(d);
}

/*
 * Charges (or refunds) post-charge <d>, its limits built as the request's:
 * for each part, one report of what the response cost beyond the request's
 * cost, per limit; frees <d> once every call answered.
 */
static void post_send(struct decision *d)
{
	struct agent *a = d->a;
	struct store_query q;
	struct store_result rr;
	bool sent = false;
	size_t i;
	int p;

	for (p = 0; p < NPARTS; p++) {
		struct part *pt = &d->parts[p];
		int64_t units = 0;

		if (!pt->used)
			continue;
		store_query_init(&q);
		q.want = 1;
		q.batch = BATCH_REPORT;
		for (i = 0; i < d->n; i++) {
			const struct applied *ap = &d->ap[i];
			size_t idx = (size_t)(ap->l - d->rs->limits);
			int64_t pre = pt->q.cost[ap->slot];

			if (ap->part != p || (d->ep && d->ep->limit_cost[idx] >= 0) ||
			    d->post_cost == pre)
				continue;
			memcpy(q.keys[q.n], pt->q.keys[ap->slot], sizeof(q.keys[0]));
			q.params[q.n] = pt->q.params[ap->slot];
			q.cost[q.n++] = d->post_cost - pre;
			/* in requests of this kind, for the local quota of the key */
			units = pre > 0 ? (d->post_cost - pre + (d->post_cost > pre ? pre - 1 : 0)) / pre
					: d->post_cost;
		}
		if (!q.n)
			continue;
		sent = true;
		a->post[q.cost[0] > 0 ? POST_CHARGED : POST_REFUNDED]++;
		if (a->mem) {
			memstore_decide(a->mem, &q, now_us_real(), &rr);
			continue;
		}
		if (!a->store)
			continue;
		/* a local quota of the key knows less is left (or more) */
		if (a->quota)
			quota_note_charge(a->quota, query_hash(&pt->q), &pt->q, units);
		a->pending++;
		d->waiting++;
		if (store_decide(a->store, &q, post_done_cb, d) < 0) {
			a->pending--;
			d->waiting--;
			a->post[POST_FAILED]++;
		}
	}
	if (!sent)
		a->post[POST_UNCHANGED]++;
	if (!d->waiting)
		decision_free(d);
}

/*
 * The post-charge message <m> of <req>: answered at once, then the cost read
 * and, if there is one, charged through a decision of its own (the request's
 * principal, tier and limits) that answers nobody.
 */
static void post_begin(struct agent *a, struct spoa_req *req, struct spop_msg *m)
{
	const struct ruleset *rs = a->rs;
	const struct rule_endpoint *ep = NULL;
	const struct cfg_post *pc;
	const struct spop_data *v;
	struct decision *d;
	struct req_args ra;
	int64_t tokens = 0;

	read_args(m, &ra);
	spoa_req_done(req);
	if (rs->cfg->store == STORE_KIND_ALLOW)
		return;
	if (ra.has_endpoint)
		ep = ruleset_endpoint_named(rs, ra.endpoint.p, ra.endpoint.len);
	else
		ep = ruleset_endpoint(rs, ra.route.p, ra.route.len, ra.method.p, ra.method.len,
				      ra.path.p, ra.path.len);
	pc = ep ? ep->post : &rs->cfg->post;
	v = pc->from == POST_FROM_BYTES ? &ra.bytes : pc->from == POST_FROM_TIME ? &ra.time
										  : &ra.charge;
	switch (post_tokens(v, pc, &tokens)) {
	case PV_ABSENT:
		a->post[POST_ABSENT]++;
		return;
	case PV_INVALID:
		a->post[POST_INVALID]++;
		return;
	case PV_CLAMPED:
		a->post_clamped++;
		break;
	case PV_OK:
		break;
	}
	if (ra.cost_invalid) {
		/* the request was charged the maximum for its bad cost: that stands */
		a->post[POST_INVALID]++;
		return;
	}
	d = decision_start(a, NULL, &ra, ep);
	d->post = true;
	d->post_cost = tokens;
	/* the endpoint's cost when the request was charged, not after a reload since */
	if (d->cost < 0 && ra.charged >= 0)
		d->cost = ra.charged;
	decision_begin(d);
}

static void tier_cache_setup(struct agent *a, const struct ruleset *rs)
{
	if (!rs->cfg->tier_hash) {
		FREE_AND_NULL(a->tcache);
		a->tcache_size = 0;
		return;
	}
	if (a->tcache && a->tcache_size == rs->cfg->tier_cache_size) {
		/* a reload may change tiers: cached answers are re-checked by name, but
		 * drop them anyway so new hash contents are seen at once */
		memset(a->tcache, 0, a->tcache_size * sizeof(*a->tcache));
		return;
	}
	free(a->tcache);
	a->tcache_size = rs->cfg->tier_cache_size;
	a->tcache = xcalloc(a->tcache_size, sizeof(*a->tcache));
}

/* Copies this process's gauges and counters into its metrics slot. */
static void publish(struct agent *a)
{
	struct met_slot *ms = a->ms;
	const struct spoa_stats *ss;
	size_t i;

	if (!ms)
		return;
	ss = spoa_server_stats(a->srv);
	ms->c[MC_CONNS] = ss->conns_active;
	ms->c[MC_ACCEPTED] = ss->conns_accepted;
	ms->c[MC_HELLOS] = ss->hellos;
	ms->c[MC_HEALTHCHECKS] = ss->healthchecks;
	ms->c[MC_NOTIFY] = ss->notify;
	ms->c[MC_ACKS] = ss->acks;
	ms->c[MC_HAPROXY_DISCONNECTS] = ss->haproxy_disconnects;
	ms->c[MC_ORPHANS] = ss->orphans;
	ms->c[MC_SPOP_STALE] = ss->stale;
	ms->c[MC_SPOP_EVICTED] = ss->conns_evicted;
	ms->c[MC_SPOP_IDLE_TIMEOUTS] = ss->idle_timeouts;
	ms->c[MC_SPOP_REFUSED] = ss->conns_refused;
	if (a->http)
		ms->c[MC_HTTP_EVICTED] = http_server_stats(a->http)->evicted;
	for (i = 0; i <= SPOP_ST_RES; i++)
		ms->spop_errors[i] = ss->errors[i];
	ms->c[MC_REFUNDS] = a->refunds;
	ms->c[MC_REFUNDS_LOST] = a->refunds_lost;
	ms->c[MC_BLOCKED_HITS] = a->blocked_hits;
	ms->c[MC_OVR_BLOCKED] = a->ovr_blocked;
	ms->c[MC_OVR_LIMITED] = a->ovr_limited;
	if (a->ovr) {
		const struct ovr_stats *os = ovr_stats(a->ovr);

		ms->c[MC_OVR_ENTRIES] = os->entries;
		ms->c[MC_OVR_LOADS] = os->loads;
		ms->c[MC_OVR_SKIPPED] = os->skipped;
		ms->c[MC_OVR_POLL_ERRORS] = os->poll_errors;
	}
	ms->c[MC_LOCAL_DECISIONS] = a->local_decisions;
	ms->c[MC_INVALID_COSTS] = a->invalid_costs;
	for (i = 0; i < POST_OUT_COUNT; i++)
		ms->c[MC_POST_CHARGED + i] = a->post[i];
	ms->c[MC_POST_CLAMPED] = a->post_clamped;
	ms->c[MC_NO_ADDRESS] = a->no_address;
	ms->c[MC_TIER_HITS] = a->tier_hits;
	ms->c[MC_TIER_MISSES] = a->tier_misses;
	if (a->store) {
		const struct store_stats *st = store_stats(a->store);

		ms->c[MC_REDIS_SENT] = st->sent;
		ms->c[MC_REDIS_LATE] = st->late;
		ms->c[MC_REDIS_PENDING] = st->pending;
		ms->c[MC_BREAKER_OPEN] = st->breaker_open ? 1 : 0;
		ms->c[MC_BREAKER_OPENED] = st->breaker_opened;
		ms->c[MC_REDIS_CONCURRENCY] = st->concurrency_limit;
		ms->c[MC_REDIS_QUEUED] = st->queued;
		ms->c[MC_REDIS_SHED] = st->shed;
		ms->c[MC_REDIS_BATCH_CALLS] = st->batch_calls;
		ms->c[MC_REDIS_BATCHED] = st->batched;
		for (i = 0; i < STORE_EC_COUNT; i++)
			ms->c[MC_REDIS_ERR_OOM + i] = st->errors[i];
	}
	if (a->quota) {
		const struct quota_stats *q = quota_stats(a->quota);

		ms->c[MC_LEASE_GRANTS] = q->lease_grants;
		ms->c[MC_LEASE_UNITS] = q->lease_units;
		ms->c[MC_LEASE_SPENT] = q->lease_spent;
		ms->c[MC_LEASE_EXPIRED] = q->lease_expired;
		ms->c[MC_LEASE_RETURNED] = q->lease_returned;
		ms->c[MC_PRECHECK_LOCAL] = q->precheck_local;
		ms->c[MC_PRECHECK_REPORTS] = q->precheck_reports;
		ms->c[MC_PRECHECK_OVER] = q->precheck_over;
		ms->c[MC_REPORT_FAILED] = q->report_failed;
		ms->c[MC_REPORT_LOST] = q->report_lost;
		ms->c[MC_COALESCED] = q->coalesced;
		ms->c[MC_UNDONE] = q->undone;
		ms->c[MC_QUOTA_KEYS] = q->keys;
		ms->c[MC_LEASE_OUTSTANDING] = q->outstanding;
		ms->c[MC_UNREPORTED] = q->unreported;
		ms->c[MC_GATEWAYS] = q->gateways;
		ms->c[MC_QUOTA_FULL] = q->full;
	}
	ms->c[MC_MEMORY_KEYS] = a->mem ? memstore_size(a->mem) : 0;
	ms->c[MC_LOCAL_KEYS] = a->local ? memstore_size(a->local) : 0;
	for (i = 0; i < a->ntopk; i++) {
		struct met_top *mt = metrics_top(ms, a->topk[i].rule);

		if (mt)
			mt->n = topk_list(a->topk[i].t, mt->top, MET_TOP_SNAP);
	}
}

static void publish_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	(void)loop;
	(void)revents;
	publish(container_of(t, struct agent, publish));
}

/* What answers while Redis cannot: the failure policies of the limits, for /ready. */
static const char *agent_fallback_str(const struct agent *a)
{
	static const char *const what[8] = {
		"no limits",
		"fail-open limits allow",
		"fail-closed limits deny",
		"fail-open limits allow, fail-closed limits deny",
		"local fallback limits apply",
		"local fallback limits apply, fail-open limits allow",
		"local fallback limits apply, fail-closed limits deny",
		"local fallback limits apply, fail-open limits allow, fail-closed limits deny"};
	const struct agent_config *c = a->rs->cfg;
	unsigned seen = 0;
	size_t i;

	for (i = 0; i < c->nlimits; i++)
		seen |= c->limits[i].on_failure == FAIL_OPEN     ? 1
			: c->limits[i].on_failure == FAIL_CLOSED ? 2
								 : 4;
	return what[seen];
}

/* Ready to decide: rules loaded, and Redis reachable or a fallback configured. */
static bool agent_ready(const struct agent *a)
{
	const struct ruleset *rs = a->rs;
	size_t i;

	if (!a->store || store_ready(a->store))
		return true;
	for (i = 0; i < rs->cfg->nlimits; i++)
		if (rs->cfg->limits[i].on_failure != FAIL_OPEN)
			return true;
	return false;
}

static void http_cb(const char *path, struct http_reply *r, void *arg)
{
	struct agent *a = arg;

	if (strcmp(path, "/metrics") == 0) {
		publish(a);
		http_reply_status(r, 200, PROM_CONTENT_TYPE);
		metrics_render(a->metrics, r);
	} else if (strcmp(path, "/top") == 0) {
		publish(a);
		http_reply_status(r, 200, "application/json");
		metrics_render_top(a->metrics, r);
	} else if (strcmp(path, "/overrides") == 0 && a->ovr) {
		http_reply_status(r, 200, "application/json");
		ovr_render(a->ovr, r);
	} else if (strcmp(path, "/healthz") == 0) {
		http_reply_status(r, 200, "text/plain");
		http_reply_printf(r, "ok\n");
	} else if (strcmp(path, "/ready") == 0) {
		bool ok = agent_ready(a);
		char why[256];

		http_reply_status(r, ok ? 200 : 503, "text/plain");
		http_reply_printf(r, "%s\n", ok ? "ready" : "not ready: redis unreachable and no "
							  "fallback configured");
		if (a->store && !store_health(a->store, why, sizeof(why)))
			http_reply_printf(r, "degraded: %s; %s\n", why, agent_fallback_str(a));
	} else {
		http_reply_status(r, 404, "text/plain");
		http_reply_printf(r, "not found\n");
	}
}

/* Creates or reconfigures the local quotas for <rs> (Redis store only). */
static void quota_setup(struct agent *a, const struct ruleset *rs)
{
	const struct agent_config *c = rs->cfg;
	struct quota_opts o = {.lease_ms = c->quota.lease_ms,
			       .heartbeat_ms = c->quota.heartbeat_ms,
			       .flush_ms = c->quota.flush_ms,
			       .horizon = c->quota.horizon,
			       .max_keys = c->quota.max_keys,
			       .precheck = c->quota.precheck,
			       .leases = c->quota.leases,
			       .coalesce = c->quota.coalesce,
			       .key_prefix = c->redis.key_prefix};
	bool leasing = false;
	size_t i;

	if (!a->store)
		return;
	for (i = 0; i < c->nlimits; i++)
		if (c->limits[i].budget > 0)
			leasing = true;
	if (!a->quota)
		a->quota = quota_new(a->loop, a->store, &o);
	quota_configure(a->quota, &o, leasing);
}

/* The first overrides load was tried, or Redis went: the parked decisions go on. */
static void ovr_wake(void *arg)
{
	struct agent *a = arg;
	struct list l;

	if (list_empty(&a->parked))
		return;
	/* taken off first: a decision that must wait again goes back on a->parked */
	l = a->parked;
	l.next->prev = &l;
	l.prev->next = &l;
	list_init(&a->parked);
	while (!list_empty(&l)) {
		struct decision *d = LIST_ELEM(l.next, struct decision, park);

		list_del(&d->park);
		a->pending--;
		decision_begin(d);
	}
}

/* Counts a reload for the metrics. */
void agent_note_reload(struct agent *a, bool ok, uint64_t generation)
{
	if (!a->ms)
		return;
	a->ms->c[ok ? MC_RELOADS_OK : MC_RELOADS_FAILED]++;
	if (ok)
		a->ms->c[MC_GENERATION] = generation;
}

/*
 * Creates the agent for ruleset <rs> (takes the caller's reference): listeners
 * open (with SO_REUSEPORT when <reuseport>, so worker processes share the
 * port), Redis connecting. Returns 0 or -1 (logged).
 */
int agent_new(struct ev_loop *loop, struct ruleset *rs, const struct agent_opts *opts,
	      struct agent **out)
{
	struct agent *a = xcalloc(1, sizeof(*a));
	struct spoa_handler h = {.on_notify = on_notify, .log = lib_log, .arg = a};
	struct spoa_opts o = {.max_frame_size = rs->cfg->max_frame_size,
			      .max_inflight = rs->cfg->max_inflight,
			      .max_conns = rs->cfg->max_conns,
			      .idle_timeout_ms = rs->cfg->idle_timeout_ms,
			      .stale_ms = rs->cfg->spoe_timeout_ms,
			      .ack_max = rs->ack_max,
			      .reuseport = opts->reuseport};
	struct ovr_opts ovr_opts = {.key_prefix = rs->cfg->redis.key_prefix,
				    .poll_ms = rs->cfg->overrides.poll_ms,
				    .max_entries = rs->cfg->overrides.max_entries,
				    .block_status = rs->cfg->overrides.block_status};
	char err[256];
	size_t i;

	a->dcache = xcalloc(DCACHE_SLOTS, sizeof(*a->dcache));
	a->loop = loop;
	a->rs = rs;
	list_init(&a->parked);
	a->srv = spoa_server_new(loop, &o, &h);
	a->metrics = opts->metrics;
	if (a->metrics) {
		a->ms = metrics_attach(a->metrics, opts->worker);
		a->ms->c[MC_GENERATION] = rs->gen;
	}
	ev_timer_init(&a->publish, publish_cb, 0.25, 0.25);
	ev_timer_start(loop, &a->publish);
	if (rs->cfg->metrics_listen && a->metrics) {
		a->http = http_server_new(loop, rs->cfg->metrics_listen, opts->reuseport, http_cb, a,
					  err, sizeof(err));
		if (!a->http) {
			LOG(LOG_ERR, "metrics listener: %s", err);
			goto fail;
		}
		http_server_set_max_conns(a->http, rs->cfg->metrics_max_conns);
		http_server_set_timeout(a->http, rs->cfg->metrics_idle_timeout_ms / 1000.);
		LOG(LOG_NOTICE, "metrics on http://%s/metrics", rs->cfg->metrics_listen);
	}
	for (i = 0; i < rs->cfg->nlisten; i++) {
		if (spoa_server_listen(a->srv, rs->cfg->listen[i], err, sizeof(err)) < 0) {
			LOG(LOG_ERR, "listen: %s", err);
			goto fail;
		}
	}
	if (rs->cfg->store == STORE_KIND_MEMORY)
		a->mem = memstore_new(1000000);
	a->local = memstore_new(100000);
	if (rs->cfg->blocked_cache)
		a->blocked = xcalloc(BLOCKED_SLOTS, sizeof(*a->blocked));
	tier_cache_setup(a, rs);
	if (rs->cfg->store == STORE_KIND_REDIS) {
		struct store_opts so = {
			.address = rs->cfg->redis.address,
			.user = rs->cfg->redis.user,
			.password = rs->cfg->redis.password,
			.nameservers = rs->cfg->redis.nameservers,
			.resolve_timeout_ms = rs->cfg->redis.resolve_timeout_ms,
			.sentinels = (const char *const *)rs->cfg->redis.sentinels,
			.nsentinels = rs->cfg->redis.nsentinels,
			.sentinel_master = rs->cfg->redis.sentinel_master,
			.sentinel_user = rs->cfg->redis.sentinel_user,
			.sentinel_password = rs->cfg->redis.sentinel_password,
			.connect_timeout_ms = rs->cfg->redis.connect_timeout_ms,
			.command_timeout_ms = rs->cfg->redis.command_timeout_ms,
			.max_pending = rs->cfg->redis.max_pending,
			.breaker_failures = rs->cfg->breaker_failures,
			.breaker_cooldown_ms = rs->cfg->breaker_cooldown_ms,
			.queue_timeout_ms = rs->cfg->redis.queue_timeout_ms,
			.max_concurrency = rs->cfg->redis.max_concurrency,
			.batch_max = rs->cfg->redis.batch_max,
		};

		if (store_new(loop, &so, &a->store, err, sizeof(err)) < 0) {
			LOG(LOG_ERR, "%s", err);
			goto fail;
		}
		quota_setup(a, rs);
		if (rs->cfg->overrides.enabled)
			a->ovr = ovr_new(loop, a->store, &ovr_opts, ovr_wake, a);
	}
	*out = a;
	return 0;
fail:
	ev_timer_stop(loop, &a->publish);
	http_server_free(a->http);
	spoa_server_free(a->srv);
	memstore_free(a->mem);
	memstore_free(a->local);
	free(a->tcache);
	free(a->dcache);
	free(a->blocked);
	free(a);
	return -1;
}

/* Two optional strings are equal (both NULL, or the same text). */
static bool streq_null(const char *x, const char *y)
{
	return x == y || (x && y && strcmp(x, y) == 0);
}

/*
 * Replaces the ruleset with <rs> (takes the caller's reference). Settings that
 * need a restart (listeners, store) keep their old values.
 */
void agent_swap_rules(struct agent *a, struct ruleset *rs)
{
	const struct agent_config *o = a->rs->cfg, *n = rs->cfg;
	bool same_listen = o->nlisten == n->nlisten;
	size_t i;

	for (i = 0; same_listen && i < o->nlisten; i++)
		same_listen = strcmp(o->listen[i], n->listen[i]) == 0;
	if (!same_listen)
		LOG(LOG_WARN, "reload: 'listen' changed, ignored until restart");
	if (o->max_frame_size != n->max_frame_size || o->max_inflight != n->max_inflight ||
	    o->max_conns != n->max_conns || o->idle_timeout_ms != n->idle_timeout_ms)
		LOG(LOG_WARN, "reload: max_frame_size, max_inflight, max_connections or idle_timeout "
			      "changed, ignored until restart");
	if ((o->metrics_listen ? strcmp(o->metrics_listen, n->metrics_listen ? n->metrics_listen
									     : "")
			       : n->metrics_listen != NULL) ||
	    o->metrics_max_conns != n->metrics_max_conns ||
	    o->metrics_idle_timeout_ms != n->metrics_idle_timeout_ms)
		LOG(LOG_WARN, "reload: metrics settings changed, ignored until restart");
	/* answers are sized from the new rules from now on; the age bound applies at once */
	spoa_server_set_ack_max(a->srv, rs->ack_max);
	spoa_server_set_stale_ms(a->srv, n->spoe_timeout_ms);
	if (o->store != n->store || strcmp(o->redis.address, n->redis.address) != 0 ||
	    o->redis.command_timeout_ms != n->redis.command_timeout_ms ||
	    o->redis.connect_timeout_ms != n->redis.connect_timeout_ms)
		LOG(LOG_WARN, "reload: store settings changed, ignored until restart");
	/* credentials (a password file's content too): open connections stay authenticated */
	if (!streq_null(o->redis.user, n->redis.user) ||
	    !streq_null(o->redis.password, n->redis.password)) {
		if (a->store)
			store_set_auth(a->store, n->redis.user, n->redis.password);
		LOG(LOG_NOTICE, "reload: Redis credentials changed, used from the next connection");
	}
	if (o->redis.max_pending != n->redis.max_pending)
		LOG(LOG_WARN, "reload: 'redis.max_pending' changed, ignored until restart");
	if (o->redis.queue_timeout_ms != n->redis.queue_timeout_ms)
		LOG(LOG_WARN, "reload: 'redis.queue_timeout_ms' changed, ignored until restart");
	if (o->redis.max_concurrency != n->redis.max_concurrency)
		LOG(LOG_WARN, "reload: 'redis.max_concurrency' changed, ignored until restart");
	if (o->redis.batch_max != n->redis.batch_max)
		LOG(LOG_WARN, "reload: 'redis.batch_max' changed, ignored until restart");
	if (o->breaker_failures != n->breaker_failures)
		LOG(LOG_WARN, "reload: 'redis.breaker_failures' changed, ignored until restart");
	if (o->breaker_cooldown_ms != n->breaker_cooldown_ms)
		LOG(LOG_WARN, "reload: 'redis.breaker_cooldown_ms' changed, ignored until restart");
	if (o->store != n->store)
		rs->cfg->store = o->store;
	if (rs->cfg->tier_hash && rs->cfg->store != STORE_KIND_REDIS)
		FREE_AND_NULL(rs->cfg->tier_hash);
	tier_cache_setup(a, rs);
	quota_setup(a, rs);
	if (o->overrides.enabled != n->overrides.enabled)
		LOG(LOG_WARN, "reload: 'overrides.enabled' changed, ignored until restart");
	if (a->ovr) {
		struct ovr_opts oo = {.key_prefix = n->redis.key_prefix,
				      .poll_ms = n->overrides.poll_ms,
				      .max_entries = n->overrides.max_entries,
				      .block_status = n->overrides.block_status};

		ovr_configure(a->ovr, &oo);
	}
	/* cached denials were decided by the old limits */
	if (!rs->cfg->blocked_cache)
		FREE_AND_NULL(a->blocked);
	else if (!a->blocked)
		a->blocked = xcalloc(BLOCKED_SLOTS, sizeof(*a->blocked));
	else
		memset(a->blocked, 0, BLOCKED_SLOTS * sizeof(*a->blocked));
	ruleset_unref(a->rs);
	a->rs = rs;
}

const struct ruleset *agent_rules(const struct agent *a)
{
	return a->rs;
}

/* Stops accepting connections; decisions in flight still complete. */
void agent_drain(struct agent *a)
{
	spoa_server_stop_accepting(a->srv);
	/* what pre-checks admitted is reported before we go */
	if (a->quota)
		quota_flush(a->quota);
}

size_t agent_pending(const struct agent *a)
{
	return a->pending + quota_pending(a->quota);
}

void agent_log_stats(const struct agent *a)
{
	const struct spoa_stats *ss = spoa_server_stats(a->srv);

	LOG(LOG_NOTICE,
	    "stats: conns=%llu notify=%llu acks=%llu allowed=%llu denied=%llu degraded=%llu "
	    "(down=%llu timeout=%llu busy=%llu error=%llu overload=%llu breaker=%llu) orphans=%llu",
	    (unsigned long long)ss->conns_active, (unsigned long long)ss->notify,
	    (unsigned long long)ss->acks, (unsigned long long)a->outcomes[OUT_ALLOWED],
	    (unsigned long long)a->outcomes[OUT_DENIED],
	    (unsigned long long)a->outcomes[OUT_DEGRADED],
	    (unsigned long long)a->degraded_by[STORE_DOWN],
	    (unsigned long long)a->degraded_by[STORE_TIMEOUT],
	    (unsigned long long)a->degraded_by[STORE_BUSY],
	    (unsigned long long)a->degraded_by[STORE_ERROR],
	    (unsigned long long)a->degraded_by[STORE_OVERLOAD],
	    (unsigned long long)a->degraded_by[STORE_BREAKER], (unsigned long long)ss->orphans);
}

/*
 * Frees the agent: the store answers what is left with STORE_SHUTDOWN (the
 * failure ladder completes those decisions and their ACKs are sent), then
 * connections get AGENT-DISCONNECT(0) and everything is released.
 */
void agent_free(struct agent *a)
{
	if (!a)
		return;
	ev_timer_stop(a->loop, &a->publish);
	http_server_free(a->http);
	/* decisions still waiting for the overrides go to the store, which answers them */
	a->no_park = true;
	ovr_wake(a);
	/* first answer what is still in flight (the failure ladder decides, ACKs go
	 * out on the open connections), then say goodbye */
	store_free(a->store);
	a->store = NULL;
	quota_free(a->quota);
	a->quota = NULL;
	ovr_free(a->ovr);
	a->ovr = NULL;
	spoa_server_disconnect_all(a->srv, SPOP_ST_NORMAL, "agent shutting down");
	for (size_t i = 0; i < a->ntopk; i++)
		topk_free(a->topk[i].t);
	spoa_server_free(a->srv);
	memstore_free(a->mem);
	memstore_free(a->local);
	free(a->tcache);
	free(a->dcache);
	decisions_free_unused(a);
	free(a->blocked);
	ruleset_unref(a->rs);
	free(a);
}
