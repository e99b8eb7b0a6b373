/* SPDX-License-Identifier: MIT */
/*
 * The decision object: taken from the agent's pool of unused decisions and
 * given back to it, its parts cleared; what a request costs a limit; the hash
 * that names a store query.
 *
 * DESIGN
 * Each decision holds a reference to the ruleset it started with, so a reload
 * never changes a decision midway. A decision is ~10 KB, mostly the key
 * buffers of its store queries: a new one is cleared up to them only, and
 * unused ones are kept for the next decisions.
 */
#include "decision.h"

#include <stdlib.h>
#include <string.h>

#include "agent_int.h"
#include "hll.h"
#include "rules.h"
#include "util.h"

/*
 * Unused decisions are kept for the next ones (up to DFREE_MAX): a decision
 * is ~10 KB, mostly its store queries' key buffers, which need no clearing.
 */
#define DFREE_MAX 256

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

void decision_free(struct decision *d)
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

void decisions_free_unused(struct agent *a)
{
	while (a->dfree) {
		struct decision *d = a->dfree;

		a->dfree = d->next_free;
		free(d);
	}
	a->ndfree = 0;
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
