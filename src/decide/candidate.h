/* SPDX-License-Identifier: MIT */
/* The candidate policy: its limits added to a decision, trimmed, its verdict counted. */
#ifndef AGENT_CANDIDATE_H
#define AGENT_CANDIDATE_H

#include <stdbool.h>

struct decision;
struct ovr_entry;
struct part;
struct rule_tier;

void cand_add(struct decision *d, const struct rule_tier *tier, const char *principal,
	      const struct ovr_entry *ov);
void cand_trim(struct decision *d, struct part *pt, bool drop_own);
void cand_finish(struct decision *d);

#endif /* AGENT_CANDIDATE_H */
