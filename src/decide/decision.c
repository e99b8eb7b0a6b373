/* SPDX-License-Identifier: MIT */
/*
 * The decision object and its life: taken from the agent's pool of unused
 * decisions, its store calls counted while they are owed, parked while the
 * overrides are not known yet, its request answered and given back to the
 * pool; what a request costs a limit; the hash that names a store query.
 *
 * No other file counts the store calls owed (the drain waits for them) or
 * ends a SPOP request: a decision ends with decision_end() (the ACK goes, the
 * decision is freed), one whose request was answered before (a post-charge)
 * with decision_free(), and a request answered with no decision made with
 * decision_answer_request(). The pool (struct decision_pool: the unused
 * decisions, the store calls owed, the parked list) is this file's alone.
 *
 * DESIGN
 * Each decision holds a reference to the ruleset it started with, so a reload
 * never changes a decision midway. A decision is ~19 KB, mostly the key
 * buffers of its store queries: a new one is cleared up to them only, and
 * unused ones are kept for the next decisions.
 */
#include "decision.h"

#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "agent_int.h"
#include "hll.h"
#include "limiter.h"
#include "spoa.h"
#include "rules.h"
#include "util.h"

/*
 * Unused decisions are kept for the next ones (up to DFREE_MAX): a decision
 * is ~19 KB, mostly its store queries' key buffers, which need no clearing.
 * DFREE_WARM of them are made and written at the start (decisions_init()): a
 * fresh process would otherwise fault in four or five pages for each of its
 * first decisions, thousands in its first burst, in loop turns long enough to
 * miss the deadlines of what waits (see doc/benchmarks.md, row S).
 */
#define DFREE_MAX 256
#ifndef DFREE_WARM
#define DFREE_WARM DFREE_MAX
#endif

/* The random high bits of a process's concurrency slots (decisions_init()). */
#define CONC_SLOT_BITS_RANDOM 22

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
struct decision *decision_new(struct agent *a)
{
	struct decision *d = a->decisions.free;
	size_t i;

	if (d) {
		a->decisions.free = d->next_free;
		a->decisions.nfree--;
	} else {
		d = xmalloc(sizeof(*d));
	}
	memset(d, 0, offsetof(struct decision, ap));
	for (i = 0; i < ARRAY_SIZE(d->parts); i++)
		part_clear(&d->parts[i]);
	return d;
}

/* A store call of <a>'s decisions sent: its callback is owed (a drain waits for it). */
void decision_call_sent(struct agent *a)
{
	a->decisions.pending++;
}

/* A store call's callback came, or the call was answered at once and none will. */
void decision_call_back(struct agent *a)
{
	a->decisions.pending--;
}

/* The store calls of <a>'s decisions whose callback is owed. */
size_t decision_calls_pending(const struct agent *a)
{
	return a->decisions.pending;
}

/*
 * <a>'s pool ready: nothing unused, nothing owed, nothing parked; its
 * concurrency slots drawn from a random base (CONC_SLOT_BITS_RANDOM high
 * bits) and a sequence that starts at a random place, so that the fleet's
 * processes hold distinct slots: two processes share a base once in 2^22
 * pairs, and even then their sequences must meet while both slots are held.
 * The pool starts with DFREE_WARM decisions, written.
 */
void decisions_init(struct agent *a)
{
	uint64_t r = 0;

	list_init(&a->decisions.parked);
	if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != sizeof(r))
		r = ((uint64_t)getpid() << 32) ^ (uint64_t)now_us_real() * 0x9e3779b97f4a7c15ULL;
	a->decisions.slot_base = (r & ((UINT64_C(1) << CONC_SLOT_BITS_RANDOM) - 1))
				 << (50 - CONC_SLOT_BITS_RANDOM);
	a->decisions.slot_seq = (r >> 32) & ((UINT64_C(1) << (50 - CONC_SLOT_BITS_RANDOM)) - 1);
	while (a->decisions.nfree < DFREE_WARM) {
		struct decision *d = xmalloc(sizeof(*d));

		memset(d, 0, sizeof(*d));  /* its pages resident now, not in the first burst */
		d->next_free = a->decisions.free;
		a->decisions.free = d;
		a->decisions.nfree++;
	}
}

/*
 * The concurrency slot of <d>'s request, drawn at the first call (1 to
 * CONC_SLOT_MAX: the random base and the process's sequence, which wraps
 * after 2^28 slots, hours at the highest rates, long after any lease).
 */
int64_t decision_slot(struct decision *d)
{
	struct decision_pool *p = &d->a->decisions;

	if (!d->slot) {
		p->slot_seq = (p->slot_seq + 1) & ((UINT64_C(1) << (50 - CONC_SLOT_BITS_RANDOM)) - 1);
		if (!p->slot_seq)
			p->slot_seq = 1;
		d->slot = (int64_t)(p->slot_base | p->slot_seq);
	}
	return d->slot;
}

/* The agent goes: from now on no decision waits for the overrides. */
void decisions_stop(struct agent *a)
{
	a->decisions.stopping = true;
}

/* May a decision of <a> wait for the first overrides load (decision_park())? */
bool decision_may_park(const struct agent *a)
{
	return !a->decisions.stopping;
}

/*
 * <d> waits on the parked list for the first overrides load (or Redis gone):
 * owed like a store call, until decision_unparked() gives it back.
 */
void decision_park(struct decision *d)
{
	list_append(&d->a->decisions.parked, &d->park);
	decision_call_sent(d->a);
}

/*
 * The parked decisions of <a> taken off, into <l> (empty when none): a
 * decision that must wait again goes back on the parked list, not on <l>.
 */
void decisions_unpark(struct agent *a, struct list *l)
{
	struct list *p = &a->decisions.parked;

	if (list_empty(p)) {
		list_init(l);
		return;
	}
	*l = *p;
	l->next->prev = l;
	l->prev->next = l;
	list_init(p);
}

/* The next decision of <l> (filled by decisions_unpark()), no longer owed, or NULL. */
struct decision *decision_unparked(struct agent *a, struct list *l)
{
	struct decision *d;

	if (list_empty(l))
		return NULL;
	d = LIST_ELEM(l->next, struct decision, park);
	list_del(&d->park);
	decision_call_back(a);
	return d;
}

/* <d> answered: its ACK is queued (sent before the loop polls again), <d> freed. */
void decision_end(struct decision *d)
{
	spoa_req_done(d->req);
	decision_free(d);
}

/*
 * A request answered with no decision made: nothing to decide, the store
 * "allow", or a post-charge's message (answered before its charge is made).
 */
void decision_answer_request(struct spoa_req *req)
{
	spoa_req_done(req);
}

/* <d> freed, its request answered before (or none): back to the pool. */
void decision_free(struct decision *d)
{
	struct agent *a = d->a;

	ruleset_unref(d->rs);
	if (a->decisions.nfree < DFREE_MAX) {
		d->next_free = a->decisions.free;
		a->decisions.free = d;
		a->decisions.nfree++;
	} else {
		free(d);
	}
}

void decisions_free_unused(struct agent *a)
{
	while (a->decisions.free) {
		struct decision *d = a->decisions.free;

		a->decisions.free = d->next_free;
		free(d);
	}
	a->decisions.nfree = 0;
}

/* What this request costs limit <li> (an index in its ruleset's limits) of endpoint <ep>. */
int64_t request_cost(const struct decision *d, const struct rule_endpoint *ep, size_t li)
{
	if (ep && ep->limit_cost[li] >= 0)
		return ep->limit_cost[li];
	return d->cost >= 0 ? d->cost : (ep ? ep->cost : 1);
}

uint64_t query_hash(const struct store_query *q)
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
