/* SPDX-License-Identifier: MIT */
/*
 * A decision prepared: a block override may answer it at once; else its tier
 * (the one HAProxy sent, the tier cache's, or looked up in Redis), its limit
 * override, and the limits that apply, built into the store queries that
 * parts.c decides.
 *
 * DESIGN
 * An API key with no known tier is, by default, an anonymous client of its
 * address: inventing keys buys nothing and costs Redis nothing. A blocked
 * client costs Redis nothing either: block overrides are looked at before any
 * Redis call, the tier lookup included. A post-charge is prepared like the
 * request it follows (the same principal, tier and limits), then charge.c
 * sends it.
 */
#include "prepare.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <ev.h>

#include "agent_int.h"
#include "answer.h"
#include "candidate.h"
#include "charge.h"
#include "decision.h"
#include "digest.h"
#include "overrides.h"
#include "parts.h"
#include "principal.h"
#include "rules.h"
#include "store.h"
#include "util.h"

/* Slots of the tier cache: API key digest -> tier name, with an expiry. */
struct tier_slot {
	uint8_t digest[16];             /* first 16 bytes of SHA-256(key) */
	char tier[65];                  /* tier name, "" = no entry in Redis */
	double expires;                 /* ev_now() based; 0 = empty slot */
};

/*
 * Adds the limits of <t> to part <p> of <d>, keyed by limit_key() (<principal>, <limit><sfx>),
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

		if (l->lp.alg == ALG_CONCURRENCY) {
			/* its cost is the request's slot (a post-charge gives it back:
			 * charge.c); a request that costs it nothing takes none, nor one
			 * HAProxy says costs nothing (cost 0: the quota route), whatever
			 * the endpoint's limit_costs */
			cost = cost > 0 && d->cost != 0 && !d->post ? decision_slot(d) : 0;
			pt->conc = true;
		}

		limit_key(pt->q.keys[pt->q.n], sizeof(pt->q.keys[0]), d->rs->cfg, &l->lp, principal,
			  false, l->name, sfx);
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
		if (!l->shadow && cost > 0 && !pt->conc) {
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
		return ovr_match_key(ov, OVR_LIMIT, d->digest, d->fp, now_us_real() / 1000000);
	len = ip_bytes(&d->ip, &b);
	return len ? ovr_match_addr(ov, OVR_LIMIT, b, len, now_us_real() / 1000000) : NULL;
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
		/* the keyed fingerprint (digest.h), never the key nor its digest */
		fp_format(d->fp, d->client);
	} else {
		tier = &rs->anon;
		if (!principal_ip(rs, &d->ip, principal, sizeof(principal))) {
			d->a->st.prepare.no_address++;
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
		/* the candidate's keys too, for the slot its concurrency limits hold */
		if (rs->cand && d->slot)
			cand_add(d, tier, principal, ov);
		post_send(d);
		return;
	}
	if (rs->cand)
		cand_add(d, tier, principal, ov);
	if (d->overridden)
		d->a->st.prepare.ovr_limited++;
	decision_next(d);
}

static struct tier_slot *tier_slot(struct agent *a, const uint8_t *digest)
{
	uint64_t h;

	memcpy(&h, digest, sizeof(h));
	return &a->caches.tier[h % a->caches.tier_size];
}

static void tier_lookup_cb(enum store_status st, const char *val, size_t len, void *arg)
{
	struct decision *d = arg;
	struct agent *a = d->a;
	const struct rule_tier *tier = NULL;

	decision_call_back(a);
	if (st == STORE_OK) {
		/* a reload may have dropped (or resized) the cache meanwhile */
		if (a->caches.tier) {
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
 * Decides <d>, whose arguments were read: a block override answers at once;
 * else the tier (looked up in Redis if needed), then decision_run(). Right
 * after start, while the overrides in force are not known yet and Redis is
 * ready, it waits for them, parked (one or two round trips).
 */
void decision_begin(struct decision *d)
{
	struct agent *a = d->a;
	const struct ruleset *rs = d->rs;
	const struct rule_tier *tier = d->sent_tier;

	if (a->ovr && !ovr_settled(a->ovr) && decision_may_park(a) && store_ready(a->store)) {
		decision_park(d);
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
	if (!tier && rs->cfg->tier_hash && a->store && a->caches.tier) {
		struct tier_slot *slot = tier_slot(a, d->digest);

		if (slot->expires > ev_now(a->loop) &&
		    memcmp(slot->digest, d->digest, sizeof(d->digest)) == 0) {
			a->st.prepare.tier_hits++;
			tier = ruleset_tier_find(rs, slot->tier, strlen(slot->tier));
			if (rs->cand)
				d->ctier = ruleset_tier_find(rs->cand, slot->tier,
							     strlen(slot->tier));
		} else {
			a->st.prepare.tier_misses++;
			decision_call_sent(a);
			/* the field is the digest's hex: the principal after "k:" */
			if (store_hget(a->store, rs->cfg->tier_hash, d->principal + 2, d->answer_by,
				       tier_lookup_cb, d) == 0)
				return;
			decision_call_back(a);
		}
	}
	if (!tier && rs->cfg->unknown_keys == UNKNOWN_DEFAULT_TIER)
		tier = &rs->tiers[rs->default_tier];
	decision_run(d, tier);
}

void tier_cache_setup(struct agent *a, const struct ruleset *rs)
{
	if (!rs->cfg->tier_hash) {
		FREE_AND_NULL(a->caches.tier);
		a->caches.tier_size = 0;
		return;
	}
	if (a->caches.tier && a->caches.tier_size == rs->cfg->tier_cache_size) {
		/* a reload may change tiers: cached answers are re-checked by name, but
		 * drop them anyway so new hash contents are seen at once */
		memset(a->caches.tier, 0, a->caches.tier_size * sizeof(*a->caches.tier));
		return;
	}
	free(a->caches.tier);
	a->caches.tier_size = rs->cfg->tier_cache_size;
	a->caches.tier = xcalloc(a->caches.tier_size, sizeof(*a->caches.tier));
}

/* The tier cache freed (the agent goes). */
void tier_cache_free(struct agent *a)
{
	FREE_AND_NULL(a->caches.tier);
	a->caches.tier_size = 0;
}
