/* SPDX-License-Identifier: MIT */
/*
 * The answer: the txn variables of a decision's ACK (allow, status, rule, the
 * RateLimit and RateLimit-Policy fields, Retry-After, the legacy trio) and its
 * outcome counted (outcomes, metrics, top offenders).
 *
 * DESIGN
 * The answer is a set of txn variables HAProxy turns into a status and
 * headers. Most answers come from the store's verdicts (respond(), once
 * every part of the decision is in); a few are given with no store call at
 * all: a block override's denial (deny_blocked()), an anonymous request
 * without a source address under without_address = "deny"
 * (deny_no_address()), and the store "allow" (allow_all()). On a store
 * failure respond() reports what the failure ladder decided, with
 * degraded=1.
 */
#include "answer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent_int.h"
#include "decision.h"
#include "digest.h"
#include "hll.h"
#include "metrics.h"
#include "overrides.h"
#include "principal.h"
#include "prom.h"
#include "rules.h"
#include "spoa.h"
#include "topk.h"
#include "util.h"

/* Counts a denial of <client> by <rule> for the top offenders. */
void note_denied(struct agent *a, const char *rule, const char *client)
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
	for (i = 0; i < a->st.answer.ntopk; i++)
		if (strcmp(a->st.answer.topk[i].rule, rule) == 0)
			break;
	if (i == a->st.answer.ntopk) {
		if (a->st.answer.ntopk == MET_TOP_RULES)
			return;
		snprintf(a->st.answer.topk[i].rule, MET_NAME, "%s", rule);
		a->st.answer.topk[i].t = topk_new(64); /* K tracked; MET_TOP_K exported */
		a->st.answer.ntopk++;
	}
	topk_add(a->st.answer.topk[i].t, client, strlen(client), 1);
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
	if (d->rs->cfg->headers == HDR_LEGACY)
		return;
	if (d->overridden) {
		/* the rates in force (ack_size() made room for them), within policy_max */
		size_t cap = len < d->rs->policy_max + 1 ? len : d->rs->policy_max + 1;

		for (i = 0; i < d->n && used < cap; i++) {
			if (d->ap[i].l->shadow)
				continue;
			used += (size_t)rule_policy_item(d->rs->cfg->headers, buf + used, cap - used,
							 !used, d->ap[i].l->name, d->ap[i].rate,
							 d->ap[i].l->period_s, d->ap[i].capacity);
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

/*
 * RateLimit for the deciding limit <name> (a bucket of <cap>, <remaining>
 * left, <t> seconds) in dialect <h>, cut as snprintf() would:
 *   structured (draft 11): "<name>";r=<remaining>;t=<t>
 *   draft 7:               limit=<cap>, remaining=<remaining>, reset=<t>
 */
static void render_ratelimit(enum header_dialect h, const char *name, int64_t cap,
			     int64_t remaining, int64_t t, char *buf, size_t len)
{
	char num[24];
	size_t used;

	if (h == HDR_DRAFT7) {
		fmt_i64(num, cap);
		used = str_cat(buf, len, 0, "limit=");
		used = str_cat(buf, len, used, num);
		used = str_cat(buf, len, used, ", remaining=");
		fmt_i64(num, remaining);
		used = str_cat(buf, len, used, num);
		used = str_cat(buf, len, used, ", reset=");
	} else {
		used = str_cat(buf, len, 0, "\"");
		used = str_cat(buf, len, used, name);
		used = str_cat(buf, len, used, "\";r=");
		fmt_i64(num, remaining);
		used = str_cat(buf, len, used, num);
		used = str_cat(buf, len, used, ";t=");
	}
	fmt_i64(num, t);
	str_cat(buf, len, used, num);
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
 * Requests of this decision's kind that limit <i>'s verdict <v> still admits:
 * its tokens left divided by what such a request costs it. A limit this
 * request does not charge never runs out, unless the request charges no limit
 * at all (it only asks, e.g. the quota route): then requests of one token,
 * what the client asks about.
 */
static int64_t requests_left(const struct decision *d, size_t i, const struct limit_verdict *v)
{
	int64_t cost = d->parts[d->ap[i].part].q.cost[d->ap[i].slot];

	if (cost > 0 && d->ap[i].l->lp.alg == ALG_CONCURRENCY)
		return v->remaining; /* its cost is a slot: one a request */
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

/* What the verdicts of a decision's parts and limits come to (respond()). */
struct outcome {
	const struct limit_verdict *pv; /* the deciding limit's verdict, or NULL */
	const struct rule_limit *l;     /* the deciding limit: what RateLimit reports */
	const struct rule_limit *shadow; /* the first shadow limit that would deny */
	size_t li_best;                 /* the deciding limit's index in d->ap */
	bool allowed, degraded, any, local, local_denied;
	int why;                        /* the first failed part's status */
};

/*
 * The outcome <o> of decision <d>: allowed unless an enforcing part denies;
 * degraded (for the first failed part's reason) when a part was not decided
 * by Redis; the deciding limit, the one that makes a denied client wait
 * longest or, when allowed, the one closest to exhaustion.
 */
static void outcome_of(const struct decision *d, struct outcome *o)
{
	size_t i;
	int p;

	memset(o, 0, sizeof(*o));
	o->allowed = true;
	o->why = STORE_OK;
	for (p = 0; p < NPARTS; p++) {
		if (!d->parts[p].used || !part_enforced(&d->parts[p]))
			continue;
		if (d->parts[p].st != STORE_OK && !o->degraded) {
			o->degraded = true;
			o->why = d->parts[p].st < STORE_COUNT ? (int)d->parts[p].st : STORE_ERROR;
		}
		if (d->parts[p].st == STORE_OK || d->parts[p].fallback) {
			o->any = true;
			if (!d->parts[p].res.allowed)
				o->allowed = false;
		}
	}
	for (i = 0; i < d->n; i++) {
		const struct limit_verdict *v = verdict_of(d, i);
		const struct rule_limit *li = d->ap[i].l;

		if (!v)
			continue;
		if (d->parts[d->ap[i].part].st != STORE_OK && li->on_failure == FAIL_LOCAL) {
			o->local = true;
			if (!v->allowed && !li->shadow)
				o->local_denied = true;
		}
		if (li->shadow) {
			if (!v->allowed && !o->shadow)
				o->shadow = li;
			continue;
		}
		if (!o->l || (!o->allowed && v->retry_ms > o->pv->retry_ms) ||
		    (o->allowed && closer_to_exhaustion(d, i, v, o->li_best, o->pv))) {
			o->l = li;
			o->pv = v;
			o->li_best = i;
		}
	}
}

/*
 * Counts outcome <o> of <d>: once per decision whatever the number of its
 * parts Redis could not decide (the shutdown line's degraded total is the
 * sum of its reasons), and in the metrics with what the failure ladder did.
 */
static void count_outcome(struct decision *d, const struct outcome *o)
{
	struct agent *a = d->a;
	const char *rule = o->l ? o->l->name : "-";

	a->st.answer.outcomes[o->allowed ? OUT_ALLOWED : OUT_DENIED]++;
	if (o->degraded) {
		a->st.answer.outcomes[OUT_DEGRADED]++;
		a->st.answer.degraded_by[o->why]++;
	}
	if (!a->ms)
		return;
	if (o->shadow)
		metrics_decision(a->ms, d->tier_name, o->shadow->name, MR_SHADOW_DENIED);
	if (!o->allowed) {
		metrics_decision(a->ms, d->tier_name, rule, MR_DENIED);
		note_denied(a, rule, d->client);
	} else {
		metrics_decision(a->ms, d->tier_name, rule,
				 !o->degraded ? MR_ALLOWED : (o->local ? MR_LOCAL : MR_DEGRADED));
	}
	/* what the failure ladder answered: fail-open apart from local limits */
	if (o->degraded && o->allowed)
		a->ms->c[o->local ? MC_FB_LOCAL_ALLOWED : MC_FB_OPEN]++;
	else if (o->degraded && d->closed)
		a->ms->c[MC_FB_CLOSED]++;
	else if (o->degraded && o->local_denied)
		a->ms->c[MC_FB_LOCAL_DENIED]++;
	if (o->degraded)
		a->ms->degraded[o->why]++;
}

/* The policy variable: the ruleset knows its longest policy, sent whole, never cut. */
static void set_policy(struct decision *d)
{
	char buf[1024], *pol = buf;

	if (d->rs->policy_max >= sizeof(buf))
		pol = xmalloc(d->rs->policy_max + 1);
	render_policy(d, pol, pol == buf ? sizeof(buf) : d->rs->policy_max + 1);
	if (pol[0])
		set_str(d->req, "policy", pol);
	if (pol != buf)
		free(pol);
}

/*
 * Fills the ACK from the parts' verdicts. The limit reported is the one that
 * decided: on a denial the one that makes the client wait longest, otherwise
 * the one closest to being exhausted (closer_to_exhaustion()). A part whose
 * store failed counts as allowing (fail-open) and marks the answer degraded.
 */
void respond(struct decision *d)
{
	struct spoa_req *req = d->req;
	struct outcome o;
	char buf[1024];
	int64_t t;

	outcome_of(d, &o);
	if (o.shadow)
		set_str(req, "shadow", o.shadow->name);
	set_int(req, "allow", o.allowed ? 1 : 0);
	d->allowed = o.allowed;
	d->rule = o.l;
	count_outcome(d, &o);
	if (o.degraded)
		set_int(req, "degraded", 1);
	if (!o.allowed && d->closed)
		set_int(req, "status", d->rs->cfg->deny_status);
	if (d->ep) {
		set_str(req, "endpoint", d->ep->name);
		/* the endpoint's cost, sent back with a post-charge (rl-res `charged`): the
		 * difference is taken from what was charged even if a reload changed it */
		if (o.allowed && d->cost < 0)
			set_int(req, "charged", d->ep->cost);
	}
	if (o.allowed && (d->ep ? d->ep->post : &d->rs->cfg->post)->from != POST_FROM_CHARGE)
		set_int(req, "post", 1); /* HAProxy sends this response's size or time */
	if (o.allowed && d->slot) {
		set_int(req, "slot", d->slot); /* given back with the response (rl-res) */
		/* the candidate's endpoint, whose keys its slot may be in too */
		if (d->cep)
			set_str(req, "cendpoint", d->cep->name);
	}
	set_policy(d);
	if (!o.any || !o.l)
		return;
	if (o.allowed) {
		t = ms_to_s(o.pv->reset_ms, 0);
	} else {
		t = ms_to_s(o.pv->retry_ms, 1);
		set_int(req, "retry_after", t);
	}
	set_str(req, "rule", o.l->name);
	if (d->rs->cfg->headers != HDR_LEGACY) {
		render_ratelimit(d->rs->cfg->headers, o.l->name, (int64_t)d->ap[o.li_best].capacity,
				 o.pv->remaining, t, buf, sizeof(buf));
		set_str(req, "ratelimit", buf);
	}
	if (d->rs->cfg->legacy_headers) {
		/* the legacy trio describes the bucket: what it holds, what is left, when full */
		set_int(req, "limit", (int64_t)d->ap[o.li_best].capacity);
		set_int(req, "remaining", o.pv->remaining);
		set_int(req, "reset", t);
	}
}

/*
 * Answers an anonymous request that came without a source address under
 * anonymous.without_address = "deny": refused with fallback.deny_status, no
 * Redis call (every such client would otherwise share one bucket).
 */
void deny_no_address(struct decision *d)
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
	d->a->st.answer.outcomes[OUT_DENIED]++;
	if (d->a->ms) {
		metrics_decision(d->a->ms, d->rs->anon.name, "-", MR_DENIED);
		prom_hist_observe(&d->a->ms->decision_lat, mono() - d->t0);
	}
	decision_end(d);
}

/*
 * Answers <d> at once when a block override covers its API key (<keyed>) or
 * its source address: denied with the block's status and a Retry-After of
 * the time it has left, counted under the rule "blocked" and tier <tier>
 * (NULL: not known without a lookup); no Redis call at all. Returns false
 * (nothing done) when it is not blocked.
 */
bool deny_blocked(struct decision *d, bool keyed, const struct rule_tier *tier)
{
	struct agent *a = d->a;
	const struct ovr_entry *e = NULL;
	const uint8_t *b;
	int64_t now_ms, left;
	bool by_key = false;
	size_t len;

	/* a post-charge follows a request that was answered: blocked since, or not */
	if (d->post || !a->ovr || !ovr_count(a->ovr))
		return false;
	now_ms = now_us_real() / 1000;
	if (keyed)
		e = ovr_match_key(a->ovr, OVR_BLOCK, d->digest, d->fp, now_ms / 1000);
	by_key = e != NULL;
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
	a->st.answer.outcomes[OUT_DENIED]++;
	a->st.answer.ovr_blocked++;
	if (a->ms) {
		/* counted against what was blocked: a key, or the address (whatever keys it
		 * sends: random keys from one blocked address are one client) */
		if (by_key)
			fp_format(d->fp, d->client);
		else
			client_ip(d->rs, &d->ip, d->client, sizeof(d->client));
		metrics_decision(a->ms, tier ? tier->name : "-", "blocked", MR_DENIED);
		note_denied(a, "blocked", d->client);
		prom_hist_observe(&a->ms->decision_lat, mono() - d->t0);
	}
	decision_end(d);
	return true;
}

/* <req> carries no message of ours: answered without a verdict, HAProxy lets it pass. */
void ignore_request(struct agent *a, struct spoa_req *req)
{
	a->st.answer.outcomes[OUT_IGNORED]++;
	decision_answer_request(req);
}

/* The top offenders' sketches freed (the agent goes). */
void top_offenders_free(struct agent *a)
{
	for (size_t i = 0; i < a->st.answer.ntopk; i++)
		topk_free(a->st.answer.topk[i].t);
	a->st.answer.ntopk = 0;
}

/* The store "allow": <req> is allowed with no limit consulted. */
void allow_all(struct agent *a, struct spoa_req *req)
{
	a->st.answer.outcomes[OUT_ALLOWED]++;
	set_int(req, "allow", 1);
	decision_answer_request(req);
}
