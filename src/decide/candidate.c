/* SPDX-License-Identifier: MIT */
/*
 * The candidate policy: a second policy decided next to the enforced one on
 * every request, never enforced, its verdicts counted.
 *
 * DESIGN
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
 *
 * A candidate's concurrency limit takes the request's slot in its own keys;
 * the response message gives it back with the enforced policy's (charge.c),
 * and a request the enforced policy denied (no response comes through the
 * agent) gives it back at once.
 *
 * Sampled mode (candidate.mode = "sampled"): only the clients whose principal
 * hashes below candidate.sample of the hash space (SipHash under the fixed
 * key: the same clients on every gateway, whatever the gateway) get the
 * candidate's limits; the others are decided as without a candidate (local
 * quotas, the blocked-key cache). A sampled client's candidate buckets see
 * all of its requests, so its would-be denials are exact; the totals are a
 * sample of the clients. The candidate's global limits (an endpoint's, shared
 * by every client) see the sampled clients' requests only: their rate and
 * burst are scaled by the sample.
 */

#include "candidate.h"

#include <stdio.h>
#include <string.h>

#include "agent_int.h"
#include "answer.h"
#include "charge.h"
#include "decision.h"
#include "hll.h"
#include "metrics.h"
#include "overrides.h"
#include "principal.h"
#include "rules.h"

/*
 * Adds the limits of candidate tier <t> to part <p> of <d> after every
 * enforced one, as add_limits() does, keyed as its field "c:<limit><sfx>". A sampled
 * candidate's global limits (part 1 or 2) are scaled by its sample.
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

		if (l->lp.alg == ALG_CONCURRENCY) {
			/* the request's slot, as the enforced policy's (prepare.c) */
			cost = cost > 0 && d->cost != 0 ? decision_slot(d) : 0;
			pt->conc = true;
		}
		limit_key(pt->q.keys[pt->q.n], sizeof(pt->q.keys[0]), d->rs->cfg, &l->lp, principal,
			  true, l->name, sfx);
		pt->q.params[pt->q.n] = l->lp;
		pt->q.cost[pt->q.n] = cost;
		if (p > 0 && c->cfg->cand_mode.sampled) {
			const struct cfg_limit *cl = &c->cfg->limits[t->idx[i]];
			double f = c->cfg->cand_mode.share;
			uint64_t rate = (uint64_t)((double)cl->rate * f + 0.5);
			uint64_t burst = (uint64_t)((double)cl->burst * f + 0.5);
			struct limit_params local;

			rule_limit_params(c->cfg, cl, rate ? rate : 1, burst ? burst : 1,
					  &pt->q.params[pt->q.n], &local);
		}
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

/* True when a sampled candidate evaluates the client <principal> (see DESIGN). */
static bool cand_sampled(const struct agent_config *cc, const char *principal)
{
	double f = cc->cand_mode.share;

	if (f >= 1)
		return true;
	return (double)hll_hash(principal, strlen(principal)) < f * 18446744073709551616.0;
}

/*
 * Adds the candidate's limits to <d>, whose enforced tier is <tier> and
 * principal <principal>: the candidate tier of the same name (the one HAProxy
 * or the tier lookup named, if the candidate has it), else its default tier;
 * a request the enforced policy treats as anonymous is anonymous for the
 * candidate too (one principal, one hash tag for both).
 */
void cand_add(struct decision *d, const struct rule_tier *tier, const char *principal,
	      const struct ovr_entry *ov)
{
	const struct ruleset *c = d->rs->cand;
	char sfx[72], global[80];

	if (c->cfg->cand_mode.sampled && !cand_sampled(c->cfg, principal))
		return;
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
void cand_trim(struct decision *d, struct part *pt, bool drop_own)
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

/*
 * After <d> was answered: what the candidate decided, in order of its parts
 * (a part it denied ends it), counted against what the enforced policy
 * answered (d->allowed, d->rule).
 */
void cand_finish(struct decision *d)
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
	/* a request denied today gives back what the candidate's slots hold:
	 * slots_denied(), before this (no response will) */
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
