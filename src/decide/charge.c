/* SPDX-License-Identifier: MIT */
/*
 * Charges after the answer: refunds (a request one part of its decision
 * denied, charged by another part) and post-charges (what a response cost
 * beyond its request's cost, charged once it is known).
 *
 * DESIGN
 * Refunds. The principal's limits and an endpoint's global limits live in
 * different Redis slots, so no single script sees both: a request the second
 * part denies was charged by the first. That charge is taken back, so a
 * denied request leaves no limit charged; the candidate policy's charges
 * likewise, when the candidate denied in another part. A refund is a query
 * of negative costs; one Redis did not take is counted, the charge stays.
 *
 * Post-charges. The cost of some requests is known only once they are served
 * (rows scanned, bytes sent, time taken). HAProxy sends a second message on
 * the response (post_charge.message, "rl-res"), with the request's
 * arguments, the endpoint its ACK named, and the response's cost: `charge` (a
 * header the application sets), `bytes` or `time`, the one post_charge.from
 * names (per endpoint, or the top level's). It is answered at once with an
 * empty ACK: the client has its response, nothing waits for the charge
 * (notify.c reads it).
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
 *
 * What is adjusted is what the request was charged: a shadow limit that
 * would have denied it (named back in `shadow`) was not charged and is left
 * alone; a refund of a key with pre-checked usage not reported yet goes after
 * that report (else it would be cut at a full bucket, then the report charge
 * the request in full). A limit a reload removed since keeps its charge: see
 * doc/configuration.md, "Post-charges".
 *
 * Concurrency slots. A request admitted with a concurrency limit holds a slot
 * (its ACK's `slot`) until the same response message gives it back: one call
 * per part of minus the slot for its concurrency limits, to Redis (or the
 * memory store), and to the local fallback count, which may hold it if Redis
 * was down when it was taken. A release Redis did not take is counted; the
 * slot's lease (max_duration) ends it. A post-charge never charges a
 * concurrency limit: its cost is a slot, not tokens.
 *
 * An agent that stops cleanly gives back the slots its requests still hold:
 * each admitted request's slot is kept (its concurrency limits' keys and
 * parameters) until its response gives it back or its lease ends, at most
 * HELD_MAX of them (beyond, counted, their leases end them); the drain waits
 * for those calls. A response that reaches another process of the agent gives
 * the slot back there; the copy kept here ends with its lease.
 */
#include "charge.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent_int.h"
#include "decision.h"
#include "memstore.h"
#include "quota.h"
#include "rules.h"
#include "store.h"
#include "util.h"

/* A store call of <a>'s came back: no longer owed, and counted in <lost> if it failed. */
static void call_back_counted(struct agent *a, enum store_status st, uint64_t *lost)
{
	decision_call_back(a);
	if (st != STORE_OK)
		(*lost)++;
}

static void refund_done_cb(enum store_status st, const struct store_result *res, void *arg)
{
	struct agent *a = arg;

	(void)res;
	call_back_counted(a, st, &a->st.charge.refunds_lost);
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
void refund(struct decision *d)
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
			a->st.charge.refunds++;
			continue;
		}
		if (!refund_query(pt, 0, pt->q.n - pt->q.ncand, &rq))
			continue;
		a->st.charge.refunds++;
		if (a->mem)
			memstore_decide(a->mem, &rq, now_us_real(), &rr);
		else if (a->store) {
			/* counted in pending: a drain waits for it */
			decision_call_sent(a);
			if (store_decide(a->store, &rq, refund_done_cb, a) < 0) {
				decision_call_back(a);
				a->st.charge.refunds_lost++;
			}
		}
	}
}

static void cand_refund_cb(enum store_status st, const struct store_result *res, void *arg)
{
	struct agent *a = arg;

	(void)st;
	(void)res;
	decision_call_back(a);
}

/*
 * The candidate admitted the request in part <pt> and charged it there, but
 * denied it in the other: take the charge back, as refund() does for the
 * enforced policy.
 */
void cand_refund(struct decision *d, const struct part *pt)
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
		decision_call_sent(a);
		if (store_decide(a->store, &rq, cand_refund_cb, a) < 0)
			decision_call_back(a);
	}
}

#define HELD_BUCKETS 16384     /* chains of the held slots' table (a power of two) */
#define HELD_MAX     65536     /* slots kept at most: ~130 bytes each with one limit */

/* A concurrency slot a request this process admitted holds (caches.held). */
struct held_slot {
	struct held_slot *next;         /* owned: the next in its chain */
	int64_t slot;
	double until;                   /* mono(): when its lease ends */
	size_t n;                       /* its concurrency limits */
	struct {
		struct limit_params lp, local_lp;
		int part;               /* the decision's part (its keys' hash tag) */
		char *key;              /* owned */
	} l[];
};

static void held_free(struct held_slot *h)
{
	for (size_t i = 0; i < h->n; i++)
		free(h->l[i].key);
	free(h);
}

/* Takes slot <slot> out of <a>'s table: returned (the caller frees it), or NULL. */
static struct held_slot *held_take(struct agent *a, int64_t slot)
{
	struct held_slot **p;

	if (!a->caches.held)
		return NULL;
	for (p = &a->caches.held[(uint64_t)slot & (HELD_BUCKETS - 1)]; *p; p = &(*p)->next) {
		if ((*p)->slot == slot) {
			struct held_slot *h = *p;

			*p = h->next;
			a->caches.nheld--;
			return h;
		}
	}
	return NULL;
}

static void give_back(struct agent *a, const struct held_slot *h);

/* Drops the slots of chain <p> of <a>'s table whose lease ended by <now>. */
static void held_prune(struct agent *a, struct held_slot **p, double now)
{
	while (*p) {
		if ((*p)->until <= now) {
			struct held_slot *h = *p;

			*p = h->next;
			a->caches.nheld--;
			held_free(h);
		} else {
			p = &(*p)->next;
		}
	}
}

/* True when candidate limit <i> of <d> is a concurrency limit that took d->slot. */
static bool held_cand(const struct decision *d, size_t i)
{
	const struct part *pt = &d->parts[d->cap[i].part];

	return d->cap[i].l->lp.alg == ALG_CONCURRENCY && d->cap[i].slot < pt->q.ncand &&
	       pt->used && pt->st == STORE_OK && pt->res.cand_ok && pt->res.cand_allowed &&
	       pt->q.cost[pt->q.n - pt->q.ncand + d->cap[i].slot] == d->slot;
}

/*
 * <d> was admitted holding slot d->slot: kept until its response gives it
 * back (post_send()) or its lease ends, so that a clean stop gives it back.
 * The ended leases of its chain go meanwhile.
 */
void slots_note_held(struct decision *d)
{
	struct agent *a = d->a;
	struct held_slot *h;
	double now = mono(), until = 0;
	size_t i, n = 0;

	for (i = 0; i < d->n; i++)
		if (d->ap[i].l->lp.alg == ALG_CONCURRENCY &&
		    d->parts[d->ap[i].part].q.cost[d->ap[i].slot] == d->slot) {
			double u = now + (double)d->ap[i].l->lp.a / 1e6;

			until = u > until ? u : until;
			n++;
		}
	for (i = 0; i < d->cn; i++)
		if (held_cand(d, i)) {
			double u = now + (double)d->cap[i].l->lp.a / 1e6;

			until = u > until ? u : until;
			n++;
		}
	if (!n)
		return;
	if (!a->caches.held_closed) {
		if (!a->caches.held)
			a->caches.held = xcalloc(HELD_BUCKETS, sizeof(*a->caches.held));
		held_prune(a, &a->caches.held[(uint64_t)d->slot & (HELD_BUCKETS - 1)], now);
		if (a->caches.nheld >= HELD_MAX) {
			a->st.charge.untracked++;
			return;
		}
	}
	h = xmalloc(sizeof(*h) + n * sizeof(h->l[0]));
	h->slot = d->slot;
	h->until = until;
	h->n = 0;
	for (i = 0; i < d->n; i++) {
		const struct part *pt = &d->parts[d->ap[i].part];

		if (d->ap[i].l->lp.alg != ALG_CONCURRENCY || pt->q.cost[d->ap[i].slot] != d->slot)
			continue;
		h->l[h->n].lp = pt->q.params[d->ap[i].slot];
		h->l[h->n].local_lp = d->ap[i].local_lp;
		h->l[h->n].part = d->ap[i].part;
		h->l[h->n++].key = xstrdup(pt->q.keys[d->ap[i].slot]);
	}
	for (i = 0; i < d->cn; i++) {
		const struct part *pt = &d->parts[d->cap[i].part];

		if (!held_cand(d, i))
			continue;
		h->l[h->n].lp = pt->q.params[pt->q.n - pt->q.ncand + d->cap[i].slot];
		h->l[h->n].local_lp = h->l[h->n].lp;
		h->l[h->n].part = d->cap[i].part;
		h->l[h->n++].key = xstrdup(pt->q.keys[pt->q.n - pt->q.ncand + d->cap[i].slot]);
	}
	if (a->caches.held_closed) {
		/* admitted while the agent stops: given back at once, as the others */
		give_back(a, h);
		held_free(h);
		return;
	}
	h->next = a->caches.held[(uint64_t)d->slot & (HELD_BUCKETS - 1)];
	a->caches.held[(uint64_t)d->slot & (HELD_BUCKETS - 1)] = h;
	a->caches.nheld++;
}

/*
 * Slots kept in <a>'s table, those whose lease ended dropped first (one pass
 * over HELD_BUCKETS chains: called once a publish). A slot a response gave
 * back through another process of the agent stays until its lease ends.
 */
size_t slots_held(struct agent *a)
{
	double now = mono();

	for (size_t b = 0; a->caches.held && a->caches.nheld && b < HELD_BUCKETS; b++)
		held_prune(a, &a->caches.held[b], now);
	return a->caches.nheld;
}

static void give_back_cb(enum store_status st, const struct store_result *res, void *arg)
{
	struct agent *a = arg;

	(void)res;
	call_back_counted(a, st, &a->st.charge.release_lost);
}

/*
 * Slot h->slot given back now: one call per part of the decision (a part's
 * keys share a hash tag), to Redis or the memory store, counted in the calls
 * a drain waits for; and to the local fallback count (a slot it never held
 * changes nothing there).
 */
static void give_back(struct agent *a, const struct held_slot *h)
{
	struct store_result rr;
	struct store_query q, lq;
	size_t i;
	int p;

	a->st.charge.released++;
	for (p = 0; p < NPARTS; p++) {
		store_query_init(&q);
		store_query_init(&lq);
		for (i = 0; i < h->n && q.n < STORE_MAX_LIMITS; i++) {
			if (h->l[i].part != p)
				continue;
			snprintf(q.keys[q.n], sizeof(q.keys[0]), "%s", h->l[i].key);
			q.params[q.n] = h->l[i].lp;
			q.cost[q.n++] = -h->slot;
			memcpy(lq.keys[lq.n], q.keys[q.n - 1], sizeof(lq.keys[0]));
			lq.params[lq.n] = h->l[i].local_lp;
			lq.cost[lq.n++] = -h->slot;
		}
		if (!q.n)
			continue;
		if (a->local)
			memstore_decide(a->local, &lq, now_us_real(), &rr);
		if (a->mem) {
			memstore_decide(a->mem, &q, now_us_real(), &rr);
		} else if (a->store) {
			decision_call_sent(a);
			if (store_decide(a->store, &q, give_back_cb, a) < 0) {
				decision_call_back(a);
				a->st.charge.release_lost++;
			}
		}
	}
}

/*
 * The response of the request holding <slot> arrived here, with nothing to
 * charge: the slot is given back from what was kept of it (its keys exactly,
 * no decision rebuilt). False when this process keeps nothing of it (another
 * process admitted the request, or its lease ended): rebuild then.
 */
bool slots_release(struct agent *a, int64_t slot)
{
	struct held_slot *h = held_take(a, slot);

	if (!h)
		return false;
	give_back(a, h);
	held_free(h);
	return true;
}

/*
 * The agent stops cleanly: every slot its requests still hold (lease not
 * ended) is given back, one call a part, counted in the calls the drain
 * waits for; the table is emptied. Returns the number given back.
 */
size_t slots_give_back(struct agent *a)
{
	double now = mono();
	size_t b, given = 0;

	a->caches.held_closed = true; /* from now on a slot goes back as it is noted */
	for (b = 0; a->caches.held && b < HELD_BUCKETS; b++) {
		while (a->caches.held[b]) {
			struct held_slot *h = a->caches.held[b];

			a->caches.held[b] = h->next;
			a->caches.nheld--;
			if (h->until > now) {
				give_back(a, h);
				given++;
			}
			held_free(h);
		}
	}
	return given;
}

/* The held slots' table freed (the agent goes), its slots not given back. */
void slots_free(struct agent *a)
{
	for (size_t b = 0; a->caches.held && b < HELD_BUCKETS; b++)
		while (a->caches.held[b]) {
			struct held_slot *h = a->caches.held[b];

			a->caches.held[b] = h->next;
			held_free(h);
		}
	FREE_AND_NULL(a->caches.held);
	a->caches.nheld = 0;
}

static void release_done_cb(enum store_status st, const struct store_result *res, void *arg)
{
	struct decision *d = arg;
	struct agent *a = d->a;

	(void)res;
	call_back_counted(a, st, &a->st.charge.release_lost);
	if (!--d->waiting)
		decision_free(d);
}

/*
 * Adds the give-back of slot d->slot by <d>'s own concurrency limits in part
 * <p> to <q> (Redis, the memory store) and <lq> (the local fallback count):
 * every one the request costs, or with <taken> only those whose cost was the
 * slot (a decision's; a post-charge's costs are rebuilt without it).
 */
static void own_slots(const struct decision *d, int p, bool taken, struct store_query *q,
		      struct store_query *lq)
{
	const struct part *pt = &d->parts[p];

	for (size_t i = 0; i < d->n; i++) {
		const struct applied *ap = &d->ap[i];

		if (ap->part != p || ap->l->lp.alg != ALG_CONCURRENCY ||
		    (taken ? pt->q.cost[ap->slot] != d->slot
			   : request_cost(d, d->ep, (size_t)(ap->l - d->rs->limits)) <= 0))
			continue;
		memcpy(q->keys[q->n], pt->q.keys[ap->slot], sizeof(q->keys[0]));
		q->params[q->n] = pt->q.params[ap->slot];
		q->cost[q->n++] = -d->slot;
		memcpy(lq->keys[lq->n], pt->q.keys[ap->slot], sizeof(lq->keys[0]));
		lq->params[lq->n] = ap->local_lp;
		lq->cost[lq->n++] = -d->slot;
	}
}

/* Adds the give-back of slot d->slot by the candidate's concurrency limits in part <p> to <q>. */
static void cand_slots(const struct decision *d, int p, struct store_query *q)
{
	const struct part *pt = &d->parts[p];

	for (size_t i = 0; i < d->cn && q->n < STORE_MAX_LIMITS; i++) {
		size_t k = pt->q.n - pt->q.ncand + d->cap[i].slot;

		if (d->cap[i].part != p || d->cap[i].slot >= pt->q.ncand ||
		    d->cap[i].l->lp.alg != ALG_CONCURRENCY || pt->q.cost[k] != d->slot)
			continue;
		memcpy(q->keys[q->n], pt->q.keys[k], sizeof(q->keys[0]));
		q->params[q->n] = pt->q.params[k];
		q->cost[q->n++] = -d->slot;
	}
}

/*
 * Gives back slot d->slot of post-charge <d>'s concurrency limits, part by
 * part: to Redis (counted in d->waiting) or the memory store, and to the local
 * fallback count.
 */
static void release_send(struct decision *d)
{
	struct agent *a = d->a;
	struct store_query q, lq;
	struct store_result rr;
	bool any = false;
	int p;

	for (p = 0; p < NPARTS; p++) {
		store_query_init(&q);
		store_query_init(&lq);
		own_slots(d, p, false, &q, &lq);
		cand_slots(d, p, &q); /* the candidate's: no local count */
		if (!q.n)
			continue;
		if (!any)
			a->st.charge.released++; /* one slot, whatever its parts */
		any = true;
		if (a->local)
			memstore_decide(a->local, &lq, now_us_real(), &rr);
		if (a->mem) {
			memstore_decide(a->mem, &q, now_us_real(), &rr);
			continue;
		}
		if (!a->store)
			continue;
		decision_call_sent(a);
		d->waiting++;
		if (store_decide(a->store, &q, release_done_cb, d) < 0) {
			decision_call_back(a);
			d->waiting--;
			a->st.charge.release_lost++;
		}
	}
}

/*
 * <d> was denied holding slot d->slot: no response will give it back. The
 * parts Redis decided and that admitted it are refunded (refund()); those it
 * did not decide may hold it all the same: in the local fallback count (the
 * failure ladder took it there), or in Redis (a call that timed out, or whose
 * connection went, may have run). A give-back of a slot not held changes
 * nothing, so it goes to both.
 */
void slots_denied(struct decision *d)
{
	struct agent *a = d->a;
	struct store_query q, lq;
	struct store_result rr;
	int p;

	for (p = 0; p < NPARTS; p++) {
		const struct part *pt = &d->parts[p];
		bool redis = pt->st == STORE_TIMEOUT || pt->st == STORE_DOWN || pt->st == STORE_ERROR;

		if (!pt->used || !part_enforced(pt) || pt->st == STORE_OK)
			continue;
		store_query_init(&q);
		store_query_init(&lq);
		own_slots(d, p, true, &q, &lq);
		if (!q.n)
			continue;
		if (pt->fallback && a->local)
			memstore_decide(a->local, &lq, now_us_real(), &rr);
		if (redis && a->store) {
			decision_call_sent(a);
			if (store_decide(a->store, &q, give_back_cb, a) < 0)
				decision_call_back(a);
		}
	}
	if (d->cn)
		cand_release(d);
}

/*
 * The candidate's concurrency limits gave <d>'s request a slot the enforced
 * policy denied: no response comes through the agent to give it back, so it
 * goes back now (a call per part).
 */
void cand_release(struct decision *d)
{
	struct agent *a = d->a;
	struct store_query rq;
	struct store_result rr;
	int p;

	for (p = 0; p < NPARTS; p++) {
		store_query_init(&rq);
		cand_slots(d, p, &rq);
		if (!rq.n)
			continue;
		if (a->mem) {
			memstore_decide(a->mem, &rq, now_us_real(), &rr);
		} else if (a->store) {
			decision_call_sent(a);
			if (store_decide(a->store, &rq, cand_refund_cb, a) < 0)
				decision_call_back(a);
		}
	}
}

static void post_done_cb(enum store_status st, const struct store_result *res, void *arg)
{
	struct decision *d = arg;
	struct agent *a = d->a;

	(void)res;
	decision_call_back(a);
	if (st != STORE_OK)
		a->st.charge.post[POST_FAILED]++;
	if (!--d->waiting)
		decision_free(d);
}

/*
 * Charges (or refunds) post-charge <d>, its limits built as the request's:
 * for each part, one report of what the response cost beyond the request's
 * cost, per limit; frees <d> once every call answered.
 */
void post_send(struct decision *d)
{
	struct agent *a = d->a;
	struct store_query q;
	struct store_result rr;
	bool sent = false, refund;
	size_t i;
	int p;

	d->waiting = 1; /* until every call below is sent */
	if (d->slot && !slots_release(a, d->slot))
		release_send(d);
	for (p = 0; p < NPARTS && d->post_cost >= 0; p++) {
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
			    d->post_cost == pre || ap->l == d->post_shadow ||
			    ap->l->lp.alg == ALG_CONCURRENCY)
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
		refund = q.cost[0] < 0;
		a->st.charge.post[refund ? POST_REFUNDED : POST_CHARGED]++;
		if (a->mem) {
			memstore_decide(a->mem, &q, now_us_real(), &rr);
			continue;
		}
		if (!a->store)
			continue;
		/* a local quota of the key knows less is left (or more); a refund
		 * goes after what its pre-checks admitted and did not report yet */
		if (a->quota) {
			if (refund)
				quota_report_now(a->quota, query_hash(&pt->q), &pt->q);
			quota_note_charge(a->quota, query_hash(&pt->q), &pt->q, units);
		}
		decision_call_sent(a);
		d->waiting++;
		if (store_decide(a->store, &q, post_done_cb, d) < 0) {
			decision_call_back(a);
			d->waiting--;
			a->st.charge.post[POST_FAILED]++;
		}
	}
	if (!sent && d->post_cost >= 0)
		a->st.charge.post[POST_UNCHANGED]++;
	if (!--d->waiting)
		decision_free(d);
}

/* Counts a post-charge's outcome <o> seen before any charge (notify.c: no cost, a bad one). */
void post_counted(struct agent *a, enum post_outcome o)
{
	a->st.charge.post[o]++;
}
