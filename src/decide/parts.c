/* SPDX-License-Identifier: MIT */
/*
 * A decision's parts (its store queries) decided one after the other: each is
 * answered from the blocked-key cache, the memory store or a local quota, or
 * sent to Redis; a part the store could not decide gets the failure ladder's
 * verdicts. Once every part is in, the decision is refunded if need be,
 * answered, its candidate counted, and freed.
 *
 * DESIGN
 * The principal's limits are decided first; an endpoint's global limits (their
 * own hash tag) only once those allowed, so a denial is one script call.
 *
 * On any store failure the agent answers at once through the failure ladder
 * (by default a coarse local limit, never no limit at all) with degraded=1,
 * except that a denial Redis computed keeps answering from the blocked-key
 * cache until its Retry-After.
 */
#include "parts.h"

#include <string.h>

#include "agent_int.h"
#include "answer.h"
#include "blocked.h"
#include "candidate.h"
#include "charge.h"
#include "decision.h"
#include "memstore.h"
#include "metrics.h"
#include "prom.h"
#include "quota.h"
#include "rules.h"
#include "spoa.h"
#include "store.h"
#include "util.h"

static void part_settle(struct decision *d, struct part *pt);

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
	uint64_t g = fallback_gateways(a, d->rs->cfg);

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
			const struct cfg_limit *cl = &d->rs->cfg->limits[l - d->rs->limits];

			memcpy(lq.keys[lq.n], pt->q.keys[slot], sizeof(lq.keys[0]));
			lq.params[lq.n] = d->ap[i].local_lp;
			/* "auto": this gateway's share of the fleet the heartbeats counted */
			if (!d->rs->cfg->gateways && !cl->local_rate && g > 1)
				rule_local_params(cl, d->ap[i].rate, d->ap[i].capacity, g,
						  &lq.params[lq.n]);
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
	a->st.parts.local_decisions++;
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
	if (d->allowed && d->slot)
		slots_note_held(d);
	else if (d->slot)
		slots_denied(d);
	if (d->rs->cand)
		cand_finish(d);
	if (d->a->ms)
		prom_hist_observe(&d->a->ms->decision_lat, mono() - d->t0);
	decision_end(d);
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
	decision_call_back(d->a);
	d->waiting--;
	part_settle(d, pt);
	decision_next(d);
}

static void part_waiter_done(struct quota_waiter *w, enum store_status st,
			     const struct store_result *res)
{
	part_done_cb(st, res, container_of(w, struct part, w));
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
		memstore_decide(a->mem, &pt->q, now_us_real(), &pt->res);
		pt->st = STORE_OK;
		blocked_put(a, pt);
		return false;
	}
	d->waiting++;
	decision_call_sent(a);
	pt->t_sent = mono();
	pt->q.answer_by = d->answer_by;
	if (a->quota && !pt->q.ncand && !pt->conc) {
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
			decision_call_back(a);
			d->waiting--;
			return false;
		}
	}
	ret = store_decide(a->store, &pt->q, part_done_cb, pt);
	if (ret < 0) {
		pt->st = (enum store_status)-ret;
		decision_call_back(a);
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
void decision_next(struct decision *d)
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
