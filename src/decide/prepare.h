/* SPDX-License-Identifier: MIT */
/* A decision prepared: block overrides, the tier, limit overrides, the store queries. */
#ifndef AGENT_PREPARE_H
#define AGENT_PREPARE_H

struct agent;
struct decision;
struct ruleset;

void decision_begin(struct decision *d);
void tier_cache_setup(struct agent *a, const struct ruleset *rs);
void tier_cache_free(struct agent *a);

#endif /* AGENT_PREPARE_H */
