/* SPDX-License-Identifier: MIT */
/* The decision object: its pool, what a request costs a limit, a query's hash. */
#ifndef AGENT_DECISION_H
#define AGENT_DECISION_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct agent;
struct decision;
struct list;
struct rule_endpoint;
struct spoa_req;
struct store_query;

/* a decision's life: every path that answers, waits or ends goes through these */
struct decision *decision_new(struct agent *a);
void decision_call_sent(struct agent *a);
void decision_call_back(struct agent *a);
size_t decision_calls_pending(const struct agent *a);
void decisions_init(struct agent *a);
void decisions_stop(struct agent *a);
bool decision_may_park(const struct agent *a);
void decision_park(struct decision *d);
void decisions_unpark(struct agent *a, struct list *l);
struct decision *decision_unparked(struct agent *a, struct list *l);
void decision_end(struct decision *d);
void decision_free(struct decision *d);
void decision_answer_request(struct spoa_req *req);
void decisions_free_unused(struct agent *a);
int64_t request_cost(const struct decision *d, const struct rule_endpoint *ep, size_t li);
int64_t decision_slot(struct decision *d);
uint64_t query_hash(const struct store_query *q);

#endif /* AGENT_DECISION_H */
