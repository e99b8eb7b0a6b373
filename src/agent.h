/* SPDX-License-Identifier: MIT */
/*
 * The agent: the root context (loop, SPOP server, store, current ruleset) and
 * the decision path NOTIFY -> principal -> store -> ACK variables.
 */
#ifndef AGENT_AGENT_H
#define AGENT_AGENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compiler.h"

struct ev_loop;
struct ruleset;
struct agent;
struct metrics;

/* How the agent runs. */
struct agent_opts {
	bool reuseport;                 /* share listening ports with other workers */
	struct metrics *metrics;        /* ref: shared metrics region, or NULL */
	unsigned worker;                /* this process's slot in it */
};

int agent_new(struct ev_loop *loop, struct ruleset *rs, const struct agent_opts *opts,
	      struct agent **out) MUSTCHECK;
void agent_note_reload(struct agent *a, bool ok, uint64_t generation);
void agent_free(struct agent *a);
void agent_swap_rules(struct agent *a, struct ruleset *rs);
const struct ruleset *agent_rules(const struct agent *a);
void agent_drain(struct agent *a);
size_t agent_pending(const struct agent *a);
void agent_log_stats(const struct agent *a);

#endif /* AGENT_AGENT_H */
