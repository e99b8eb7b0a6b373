/* SPDX-License-Identifier: MIT */
/* The blocked-key cache: denials Redis computed, repeated until they could pass. */
#ifndef AGENT_BLOCKED_H
#define AGENT_BLOCKED_H

#include <stdbool.h>

struct agent;
struct part;
struct ruleset;

void blocked_setup(struct agent *a, const struct ruleset *rs);
void blocked_free(struct agent *a);
void blocked_put(struct agent *a, const struct part *pt);
bool blocked_get(struct agent *a, struct part *pt);

#endif /* AGENT_BLOCKED_H */
