/* SPDX-License-Identifier: MIT */
/*
 * The blocked-key cache: a query Redis denied is denied again locally, with
 * no Redis call, until it could pass.
 *
 * DESIGN
 * Until the slowest denying limit would admit the same query again, Redis's
 * answer cannot change: charges only make it worse, and only a refund or a
 * reload could make it pass a little earlier. So the denial is repeated
 * (its times brought up to date) whether Redis answers now or not, even
 * while the failure ladder answers the rest. Queries with a candidate policy
 * are neither remembered nor answered here: the candidate decides every
 * request in Redis.
 */
#include "blocked.h"

#include <stdlib.h>
#include <string.h>

#include "agent_int.h"
#include "rules.h"
#include "util.h"

#define BLOCKED_SLOTS 4096

/* The blocked-key cache: a query Redis denied, denied locally until it could pass. */
struct blocked_slot {
	uint64_t h;                     /* hash of the query (keys, limits, costs) */
	double at;                      /* mono() of the denial */
	double until;                   /* mono() until which the same query is denied */
	struct store_result res;        /* the verdicts to repeat (times adjusted) */
};

/*
 * The cache for ruleset <rs>: created, or dropped when rs->cfg->blocked_cache
 * is off, or emptied (on a reload: cached denials were decided by the old limits).
 */
void blocked_setup(struct agent *a, const struct ruleset *rs)
{
	if (!rs->cfg->blocked_cache)
		FREE_AND_NULL(a->caches.blocked);
	else if (!a->caches.blocked)
		a->caches.blocked = xcalloc(BLOCKED_SLOTS, sizeof(*a->caches.blocked));
	else
		memset(a->caches.blocked, 0, BLOCKED_SLOTS * sizeof(*a->caches.blocked));
}

/* The cache freed (the agent goes). */
void blocked_free(struct agent *a)
{
	FREE_AND_NULL(a->caches.blocked);
}

/*
 * Remembers a denial: until the slowest denying limit would admit the same
 * query again, the answer cannot change (charges only make it worse; a
 * refund or a reload could make it pass a little earlier).
 */
void blocked_put(struct agent *a, const struct part *pt)
{
	struct blocked_slot *b;
	int64_t wait = 0;
	size_t i;

	/* a concurrency limit's denial ends when a slot is given back, before its
	 * Retry-After: not repeated */
	if (!a->caches.blocked || pt->res.allowed || pt->q.ncand || pt->conc)
		return;
	for (i = 0; i < pt->res.n; i++)
		if (!pt->res.v[i].allowed && !pt->q.params[i].shadow && pt->res.v[i].retry_ms > wait)
			wait = pt->res.v[i].retry_ms;
	if (wait < 1)
		return;
	b = &a->caches.blocked[pt->h % BLOCKED_SLOTS];
	b->h = pt->h;
	b->at = mono();
	b->until = b->at + wait / 1000.;
	b->res = pt->res;
}

/* A cached denial for <pt>'s query, with its times brought up to date. */
bool blocked_get(struct agent *a, struct part *pt)
{
	struct blocked_slot *b;
	int64_t elapsed;
	double now;
	size_t i;

	/* whether Redis answers now or not: the denial is a fact Redis computed,
	 * and nothing but a refund or a reload could end it before its time */
	/* the candidate decides every request in Redis; a concurrency limit too */
	if (!a->caches.blocked || pt->q.ncand || pt->conc)
		return false;
	b = &a->caches.blocked[pt->h % BLOCKED_SLOTS];
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
	a->st.blocked.hits++;
	return true;
}
