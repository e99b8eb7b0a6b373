/* SPDX-License-Identifier: MIT */
#include "rules.h"

#include <stdio.h>
#include <string.h>

#include "normalize.h"
#include "overrides.h"
#include "spop.h"
#include "util.h"

#define ACK_SLACK 256   /* room for answer variables added without updating ack_size() */

_Static_assert(OVR_RATE_MAX < UINT64_C(10000000000000), "override rates fit 13 digits");

static void tier_compile(struct ruleset *rs, const struct cfg_tier *ct, struct rule_tier *t)
{
	size_t i, j, used = 0, size = 0;

	t->name = ct->name;
	t->n = ct->nlimits;
	for (i = 0; i < ct->nlimits; i++) {
		for (j = 0; j < rs->cfg->nlimits; j++)
			if (strcmp(ct->limits[i], rs->cfg->limits[j].name) == 0)
				break;
		BUG_ON(j == rs->cfg->nlimits); /* config_load() checked the references */
		t->idx[i] = j;
		size += strlen(rs->limits[j].name) + 96;
	}
	/* RateLimit-Policy: one item per limit (rule_policy_item()), none in the
	 * legacy dialect */
	t->policy = xmalloc(size + 1);
	t->policy[0] = 0;
	for (i = 0; i < t->n && rs->cfg->headers != HDR_LEGACY; i++) {
		const struct rule_limit *l = &rs->limits[t->idx[i]];

		if (l->shadow) /* clients never see shadow limits */
			continue;
		used += (size_t)rule_policy_item(rs->cfg->headers, t->policy + used, size + 1 - used,
						 !used, l->name, l->rate, l->period_s, l->capacity);
	}
}

/*
 * One item of RateLimit-Policy in dialect <h>, for limit <name> of <q> tokens
 * per <w> seconds in a bucket of <burst>, written to <buf> of <len> bytes
 * after a ", " unless <first>. Returns what snprintf() returns.
 *   structured (draft 11): "<name>";q=<q>;w=<w>
 *   draft 7:               <q>;w=<w>
 * A bucket that holds more (or less) than q says so in a vendor parameter,
 * rl-burst (the drafts define no burst parameter and ask for a prefix on
 * others), so that a remaining count above q is explained by the policy.
 * A concurrency limit (<w> = 0: no window) is q requests in flight, the
 * quota unit the drafts name for it:
 *   structured: "<name>";q=<q>;qu="concurrent-requests"
 *   draft 7:    <q>;qu="concurrent-requests"
 */
int rule_policy_item(enum header_dialect h, char *buf, size_t len, bool first, const char *name,
		     uint64_t q, uint64_t w, uint64_t burst)
{
	int n;

	if (!w)
		return h == HDR_DRAFT7
			       ? snprintf(buf, len, "%s%llu;qu=\"concurrent-requests\"",
					  first ? "" : ", ", (unsigned long long)q)
			       : snprintf(buf, len, "%s\"%s\";q=%llu;qu=\"concurrent-requests\"",
					  first ? "" : ", ", name, (unsigned long long)q);
	if (h == HDR_DRAFT7)
		n = snprintf(buf, len, "%s%llu;w=%llu", first ? "" : ", ", (unsigned long long)q,
			     (unsigned long long)w);
	else
		n = snprintf(buf, len, "%s\"%s\";q=%llu;w=%llu", first ? "" : ", ", name,
			     (unsigned long long)q, (unsigned long long)w);
	if (n >= 0 && (size_t)n < len && burst != q)
		n += snprintf(buf + n, len - (size_t)n, ";rl-burst=%llu", (unsigned long long)burst);
	return n;
}

/* Bytes of a set-var action named <name> with a string value of <len> bytes. */
static size_t setvar_str_size(const char *name, size_t len)
{
	size_t n = strlen(name);

	return 3 + (size_t)spop_varint_size(n) + n + 1 + (size_t)spop_varint_size(len) + len;
}

/* Bytes of a set-var action named <name> with any integer value. */
static size_t setvar_int_size(const char *name)
{
	size_t n = strlen(name);

	return 3 + (size_t)spop_varint_size(n) + n + 1 + SPOP_VARINT_MAX;
}

/*
 * The largest ACK frame (its 4-byte length included) a decision of <rs> can
 * build: every variable respond() may set, each string at its longest (the
 * policy of the longest tier joined with the longest endpoint policies, the
 * longest limit and endpoint names), plus ACK_SLACK. Sets rs->policy_max.
 */
static size_t ack_size(struct ruleset *rs)
{
	size_t i, name = 0, ep = 0, cep = 0, tier = strlen(rs->anon.policy), eppol = 0, policy;
	size_t n = SPOP_LEN_SIZE + 1 + 4 + 2 * SPOP_VARINT_MAX;

	for (i = 0; i < rs->cfg->nlimits; i++)
		if (strlen(rs->limits[i].name) > name)
			name = strlen(rs->limits[i].name);
	for (i = 0; i < rs->ntiers; i++)
		if (strlen(rs->tiers[i].policy) > tier)
			tier = strlen(rs->tiers[i].policy);
	for (i = 0; i < rs->nendpoints; i++) {
		const struct rule_endpoint *e = &rs->endpoints[i];
		size_t l = strlen(e->extra.policy) + strlen(e->global.policy) + 4;

		if (strlen(e->name) > ep)
			ep = strlen(e->name);
		if (l > eppol)
			eppol = l;
	}
	/* a limit override may raise each rate to 13 digits (below OVR_RATE_MAX) */
	policy = tier + eppol + 2 + 12 * STORE_MAX_LIMITS;
	rs->policy_max = policy;
	for (i = 0; rs->cand && i < rs->cand->nendpoints; i++)
		if (strlen(rs->cand->endpoints[i].name) > cep)
			cep = strlen(rs->cand->endpoints[i].name);
	if (rs->cand)
		n += setvar_str_size("cendpoint", cep);
	n += setvar_str_size("shadow", name) + setvar_str_size("endpoint", ep) +
	     setvar_str_size("policy", policy) + setvar_str_size("rule", name) +
	     /* "<name>";r=<int64>;t=<int64>, or limit=<int64>, remaining=<int64>,
	      * reset=<int64> (draft 7) */
	     setvar_str_size("ratelimit", name + 48 > 86 ? name + 48 : 86);
	n += setvar_int_size("allow") + setvar_int_size("degraded") + setvar_int_size("status") +
	     setvar_int_size("retry_after") + setvar_int_size("limit") +
	     setvar_int_size("remaining") + setvar_int_size("reset") + setvar_int_size("post") +
	     setvar_int_size("charged") + setvar_int_size("slot");
	return n + ACK_SLACK;
}

/*
 * The script parameters <lp> of limit <cl> of <cfg> at <rate> tokens per
 * period with bucket <burst> (its own, or a limit override's), and <local>,
 * those of its local fallback variant: a configured local_rate (scaled like
 * the rate), else this gateway's share of the rate.
 */
void rule_limit_params(const struct agent_config *cfg, const struct cfg_limit *cl, uint64_t rate,
		       uint64_t burst, struct limit_params *lp, struct limit_params *local)
{
	if (cl->alg == ALG_SLIDING_LOG && rate > LOG_RATE_MAX)
		rate = LOG_RATE_MAX;
	if (!rate)
		rate = 1;
	limit_params_init(lp, cl->alg, rate, cl->period_ms, burst);
	lp->shadow = cl->shadow;
	rule_local_params(cl, rate, burst, cfg->gateways ? cfg->gateways : 1, local);
}

/*
 * The local fallback parameters <local> of limit <cl> at <rate> per period
 * with bucket <burst> (its own, or a limit override's): a configured
 * local_rate (scaled like the rate), else the rate divided by <gateways>,
 * rounded up (the sliding log's rate as rule_limit_params() caps it).
 */
void rule_local_params(const struct cfg_limit *cl, uint64_t rate, uint64_t burst,
		       uint64_t gateways, struct limit_params *local)
{
	uint64_t lr, lb;

	if (cl->alg == ALG_SLIDING_LOG && rate > LOG_RATE_MAX)
		rate = LOG_RATE_MAX;
	if (!rate)
		rate = 1;
	if (!gateways)
		gateways = 1;
	lr = cl->local_rate ? (uint64_t)((unsigned __int128)cl->local_rate * rate / cl->rate)
			    : (rate + gateways - 1) / gateways;
	if (!lr)
		lr = 1;
	lb = cl->alg == ALG_GCRA ? (uint64_t)(((unsigned __int128)burst * lr + rate - 1) / rate) : 0;
	limit_params_init(local, cl->alg, lr, cl->period_ms, lb ? lb : lr);
	local->shadow = cl->shadow;
}

/*
 * Compiles the validated <cfg> (ownership passes to the ruleset) into a
 * ruleset of generation <gen> holding one reference.
 */
struct ruleset *ruleset_build(struct agent_config *cfg, uint64_t gen)
{
	struct ruleset *rs = xcalloc(1, sizeof(*rs));
	size_t i;

	rs->refs = 1;
	rs->gen = gen;
	rs->cfg = cfg;
	rs->limits = xcalloc(cfg->nlimits, sizeof(*rs->limits));
	for (i = 0; i < cfg->nlimits; i++) {
		const struct cfg_limit *cl = &cfg->limits[i];
		struct rule_limit *l = &rs->limits[i];

		l->name = cl->name;
		l->rate = cl->rate;
		l->capacity = cl->alg == ALG_GCRA ? cl->burst : cl->rate;
		/* 0 for a concurrency limit: no window (its period is a slot's lease) */
		l->period_s = cl->alg == ALG_CONCURRENCY ? 0 : (cl->period_ms + 999) / 1000;
		rule_limit_params(cfg, cl, cl->rate, cl->burst, &l->lp, &l->local_lp);
		l->shadow = cl->shadow;
		l->on_failure = cl->on_failure;
		l->budget = cl->budget;
	}
	rs->ntiers = cfg->ntiers;
	rs->tiers = xcalloc(cfg->ntiers, sizeof(*rs->tiers));
	for (i = 0; i < cfg->ntiers; i++) {
		tier_compile(rs, &cfg->tiers[i], &rs->tiers[i]);
		if (strcmp(cfg->tiers[i].name, cfg->default_tier) == 0)
			rs->default_tier = i;
	}
	tier_compile(rs, &cfg->anon, &rs->anon);
	rs->nendpoints = cfg->nendpoints;
	rs->endpoints = xcalloc(cfg->nendpoints, sizeof(*rs->endpoints));
	for (i = 0; i < cfg->nendpoints; i++) {
		const struct cfg_endpoint *ce = &cfg->endpoints[i];
		struct rule_endpoint *e = &rs->endpoints[i];
		size_t j, k;

		e->name = ce->name;
		e->route = ce->route;
		e->path_prefix = ce->path_prefix;
		if (ce->path_prefix) {
			char buf[NORM_PATH_MAX];
			bool trunc;

			/* the prefix gets the request's treatment: "/v1//x" matches as "/v1/x" */
			e->prefix_len = norm_path(ce->path_prefix, strlen(ce->path_prefix), buf,
						  sizeof(buf), &trunc);
			BUG_ON(trunc); /* config_load() bounds path_prefix to NORM_PATH_MAX */
			e->prefix = xmalloc(e->prefix_len + 1);
			memcpy(e->prefix, buf, e->prefix_len);
			e->prefix[e->prefix_len] = 0;
		}
		e->methods = ce->methods;
		e->nmethods = ce->nmethods;
		e->cost = ce->cost;
		e->limit_cost = xcalloc(cfg->nlimits, sizeof(int64_t));
		for (j = 0; j < cfg->nlimits; j++) {
			e->limit_cost[j] = -1;
			for (k = 0; k < ce->ncosts; k++)
				if (strcmp(ce->cost_limits[k], cfg->limits[j].name) == 0)
					e->limit_cost[j] = ce->cost_values[k];
		}
		tier_compile(rs, &ce->limits, &e->extra);
		tier_compile(rs, &ce->global, &e->global);
		e->post = ce->post.set ? &ce->post : &cfg->post;
	}
	if (cfg->candidate) {
		/* the candidate's own ruleset owns its config from now on */
		rs->cand = ruleset_build(cfg->candidate, gen);
		cfg->candidate = NULL;
	}
	rs->ack_max = ack_size(rs);
	return rs;
}

struct ruleset *ruleset_ref(struct ruleset *rs)
{
	rs->refs++;
	return rs;
}

void ruleset_unref(struct ruleset *rs)
{
	size_t i;

	if (!rs || --rs->refs)
		return;
	for (i = 0; i < rs->ntiers; i++)
		free(rs->tiers[i].policy);
	free(rs->tiers);
	free(rs->anon.policy);
	for (i = 0; i < rs->nendpoints; i++) {
		free(rs->endpoints[i].limit_cost);
		free(rs->endpoints[i].prefix);
		free(rs->endpoints[i].extra.policy);
		free(rs->endpoints[i].global.policy);
	}
	free(rs->endpoints);
	free(rs->limits);
	ruleset_unref(rs->cand);
	config_free(rs->cfg);
	free(rs);
}

/* The tier called <name> (<len> bytes, untrusted), or NULL. */
const struct rule_tier *ruleset_tier_find(const struct ruleset *rs, const char *name, size_t len)
{
	size_t i;

	if (name && len) {
		for (i = 0; i < rs->ntiers; i++)
			if (strlen(rs->tiers[i].name) == len && memcmp(rs->tiers[i].name, name, len) == 0)
				return &rs->tiers[i];
	}
	return NULL;
}

/* The endpoint called <name> (<len> bytes, untrusted), or NULL. */
const struct rule_endpoint *ruleset_endpoint_named(const struct ruleset *rs, const char *name,
						   size_t len)
{
	size_t i;

	if (name && len) {
		for (i = 0; i < rs->nendpoints; i++)
			if (strlen(rs->endpoints[i].name) == len &&
			    memcmp(rs->endpoints[i].name, name, len) == 0)
				return &rs->endpoints[i];
	}
	return NULL;
}

/* True if the method <m> (<len> bytes, untrusted) is <name>, ASCII case ignored. */
static bool method_eq(const char *name, const char *m, size_t len)
{
	return strlen(name) == len && norm_prefix_eq(m, len, name, len);
}

/*
 * The first endpoint (in configuration order) that the request matches: by
 * its route id when both the request and the endpoint have one, otherwise by
 * method and path prefix. All inputs are untrusted views. NULL if none.
 *
 * Paths are compared normalised (see normalize.c: unreserved escapes decoded,
 * `//` merged, dot segments removed) and ASCII case-insensitively, on the
 * first NORM_PATH_MAX bytes of the normalised path; methods are compared
 * case-insensitively. An absent path matches no prefix. The path is
 * normalised at most once, into a stack buffer.
 */
const struct rule_endpoint *ruleset_endpoint(const struct ruleset *rs, const char *route,
					     size_t route_len, const char *method,
					     size_t method_len, const char *path, size_t path_len)
{
	char norm[NORM_PATH_MAX];
	size_t i, j, nlen = 0;
	bool normed = false, trunc;

	for (i = 0; i < rs->nendpoints; i++) {
		const struct rule_endpoint *e = &rs->endpoints[i];

		if (e->route && route_len) {
			if (strlen(e->route) == route_len && memcmp(e->route, route, route_len) == 0)
				return e;
			continue; /* both have a route id: it alone decides */
		}
		if (!e->prefix || !path_len)
			continue;
		if (!normed) {
			nlen = norm_path(path, path_len, norm, sizeof(norm), &trunc);
			normed = true;
		}
		if (!norm_prefix_eq(norm, nlen, e->prefix, e->prefix_len))
			continue;
		if (!e->nmethods)
			return e;
		for (j = 0; j < e->nmethods; j++)
			if (method_eq(e->methods[j], method, method_len))
				return e;
	}
	return NULL;
}
