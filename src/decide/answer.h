/* SPDX-License-Identifier: MIT */
/* The answer: a decision's ACK variables and RateLimit fields, its outcome counted. */
#ifndef AGENT_ANSWER_H
#define AGENT_ANSWER_H

#include <stdbool.h>

struct agent;
struct decision;
struct rule_tier;
struct spoa_req;

void note_denied(struct agent *a, const char *rule, const char *client);
void respond(struct decision *d);
void deny_no_address(struct decision *d);
bool deny_blocked(struct decision *d, bool keyed, const struct rule_tier *tier);
void allow_all(struct agent *a, struct spoa_req *req);
void ignore_request(struct agent *a, struct spoa_req *req);
void top_offenders_free(struct agent *a);

#endif /* AGENT_ANSWER_H */
