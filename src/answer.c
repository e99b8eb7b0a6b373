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
void respond(struct decision *d)
{
	struct agent *a = d->a;
	struct spoa_req *req = d->req;
	const struct limit_verdict *pv = NULL;
	const struct rule_limit *l = NULL, *shadow = NULL;
	size_t li_best = 0;
	bool allowed = true, degraded = false, any = false, local = false, local_denied = false;
	int why = STORE_OK;             /* the first failed part's status: the decision's reason */
	char buf[1024];
	size_t i;
	int p;
	int64_t t;

	for (p = 0; p < NPARTS; p++) {
		if (!d->parts[p].used || !part_enforced(&d->parts[p]))
			continue;
		if (d->parts[p].st != STORE_OK && !degraded) {
			degraded = true;
			why = d->parts[p].st < STORE_COUNT ? (int)d->parts[p].st : STORE_ERROR;
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
	/* one decision counts once, whatever the number of its parts Redis could not
	 * decide: the shutdown line's degraded total is the sum of its reasons */
	a->outcomes[allowed ? OUT_ALLOWED : OUT_DENIED]++;
	if (degraded) {
		a->outcomes[OUT_DEGRADED]++;
		a->degraded_by[why]++;
	}
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
		if (degraded)
			a->ms->degraded[why]++;
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
	d->a->outcomes[OUT_DENIED]++;
	if (d->a->ms) {
		metrics_decision(d->a->ms, d->rs->anon.name, "-", MR_DENIED);
		prom_hist_observe(&d->a->ms->decision_lat, mono() - d->t0);
	}
	spoa_req_done(req);
	decision_free(d);
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
	a->outcomes[OUT_DENIED]++;
	a->ovr_blocked++;
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
	spoa_req_done(d->req);
	decision_free(d);
	return true;
}

/* The store "allow": <req> is allowed with no limit consulted. */
void allow_all(struct agent *a, struct spoa_req *req)
{
	a->outcomes[OUT_ALLOWED]++;
	set_int(req, "allow", 1);
	spoa_req_done(req);
}
