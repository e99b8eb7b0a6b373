/* SPDX-License-Identifier: MIT */
#include "rules.h"

#include <stdio.h>
#include <string.h>

#include "util.h"

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
		size += strlen(rs->limits[j].name) + 64;
	}
	/* RateLimit-Policy (draft-ietf-httpapi-ratelimit-headers): one item per limit */
	t->policy = xmalloc(size + 1);
	t->policy[0] = 0;
	for (i = 0; i < t->n; i++) {
		const struct rule_limit *l = &rs->limits[t->idx[i]];

		if (l->shadow) /* clients never see shadow limits */
			continue;
		used += (size_t)snprintf(t->policy + used, size + 1 - used, "%s\"%s\";q=%llu;w=%llu",
					 used ? ", " : "", l->name, (unsigned long long)l->rate,
					 (unsigned long long)l->period_s);
	}
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
		l->period_s = (cl->period_ms + 999) / 1000;
		limit_params_init(&l->lp, cl->alg, cl->rate, cl->period_ms, cl->burst);
		l->lp.shadow = cl->shadow;
		l->shadow = cl->shadow;
	}
	rs->ntiers = cfg->ntiers;
	rs->tiers = xcalloc(cfg->ntiers, sizeof(*rs->tiers));
	for (i = 0; i < cfg->ntiers; i++) {
		tier_compile(rs, &cfg->tiers[i], &rs->tiers[i]);
		if (strcmp(cfg->tiers[i].name, cfg->default_tier) == 0)
			rs->default_tier = i;
	}
	tier_compile(rs, &cfg->anon, &rs->anon);
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
	free(rs->limits);
	config_free(rs->cfg);
	free(rs);
}

/* The tier called <name> (<len> bytes, untrusted), or the default tier. */
const struct rule_tier *ruleset_tier(const struct ruleset *rs, const char *name, size_t len)
{
	size_t i;

	if (name && len) {
		for (i = 0; i < rs->ntiers; i++)
			if (strlen(rs->tiers[i].name) == len && memcmp(rs->tiers[i].name, name, len) == 0)
				return &rs->tiers[i];
	}
	return &rs->tiers[rs->default_tier];
}
