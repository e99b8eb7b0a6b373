/* SPDX-License-Identifier: MIT */
/*
 * The ruleset: a validated configuration compiled into what decisions need
 * (GCRA parameters, tiers as limit indexes, ready-made RateLimit-Policy
 * values). Immutable once built and reference counted: a reload builds a new
 * one and swaps it in, decisions in flight finish on the one they started with.
 */
#ifndef AGENT_RULES_H
#define AGENT_RULES_H

#include <stddef.h>
#include <stdint.h>

#include "config.h"
#include "limiter.h"
#include "store.h"

struct rule_limit {
	const char *name;               /* ref: cfg */
	uint64_t rate;                  /* tokens per period */
	uint64_t capacity;              /* most tokens it holds: burst (gcra), else rate */
	uint64_t period_s;              /* period in whole seconds, at least 1 (for headers);
					 * 0 for a concurrency limit */
	struct limit_params lp;         /* as sent to the script */
	bool shadow;                    /* never denies */
	int on_failure;                 /* enum fail_policy */
	struct limit_params local_lp;   /* FAIL_LOCAL: the coarse per-gateway limit */
	double budget;                  /* accuracy budget for local quotas, 0 = exact */
};

struct rule_tier {
	const char *name;               /* ref: cfg */
	size_t n;                       /* limits applied together */
	size_t idx[STORE_MAX_LIMITS];   /* into ruleset.limits */
	char *policy;                   /* owned: RateLimit-Policy value (enforcing limits) */
};

/* An endpoint: how to match it and what it adds to a decision. */
struct rule_endpoint {
	const char *name;               /* ref: cfg */
	const char *route;              /* ref: cfg, or NULL */
	const char *path_prefix;        /* ref: cfg, or NULL */
	char *prefix;                   /* owned: path_prefix normalised (norm_path), or NULL */
	size_t prefix_len;              /* of <prefix>, at most NORM_PATH_MAX */
	char *const *methods;           /* ref: cfg */
	size_t nmethods;
	int64_t cost;                   /* default cost for every limit */
	int64_t *limit_cost;            /* owned: per limit index, -1 = use cost */
	struct rule_tier extra;         /* limits per (principal, endpoint) */
	struct rule_tier global;        /* limits shared by all clients */
	const struct cfg_post *post;    /* ref: cfg, its own post-charges or the top level's */
};

struct ruleset {
	unsigned refs;
	uint64_t gen;                   /* generation, 1 for the first */
	struct agent_config *cfg;       /* owned */
	struct rule_limit *limits;      /* owned, cfg->nlimits entries */
	struct rule_tier *tiers;        /* owned, cfg->ntiers entries */
	size_t ntiers;
	size_t default_tier;            /* index into tiers */
	struct rule_tier anon;          /* anonymous clients */
	struct rule_endpoint *endpoints;/* owned, cfg->nendpoints entries */
	size_t nendpoints;
	struct ruleset *cand;           /* owned or NULL: the candidate policy (cfg->candidate,
					 * compiled), evaluated next to this one, never enforced */
	size_t ack_max;                 /* largest ACK frame a decision builds, length included */
	size_t policy_max;              /* longest RateLimit-Policy value, NUL excluded */
};

void rule_limit_params(const struct agent_config *cfg, const struct cfg_limit *cl, uint64_t rate,
		       uint64_t burst, struct limit_params *lp, struct limit_params *local);
void rule_local_params(const struct cfg_limit *cl, uint64_t rate, uint64_t burst,
		       uint64_t gateways, struct limit_params *local);
struct ruleset *ruleset_build(struct agent_config *cfg, uint64_t gen);
int rule_policy_item(enum header_dialect h, char *buf, size_t len, bool first, const char *name,
		     uint64_t q, uint64_t w, uint64_t burst);
struct ruleset *ruleset_ref(struct ruleset *rs);
void ruleset_unref(struct ruleset *rs);
const struct rule_tier *ruleset_tier_find(const struct ruleset *rs, const char *name, size_t len);
const struct rule_endpoint *ruleset_endpoint_named(const struct ruleset *rs, const char *name,
						   size_t len);
const struct rule_endpoint *ruleset_endpoint(const struct ruleset *rs, const char *route,
					     size_t route_len, const char *method,
					     size_t method_len, const char *path, size_t path_len);

#endif /* AGENT_RULES_H */
