/* SPDX-License-Identifier: MIT */
/*
 * The store's command layer (store_cmd.c): a query's command from its
 * submission to its answer: the pool, deadlines and the loop turns they are
 * measured against, the queue under a node's limit, commands parked at a node
 * that connects, the RESP written, the replies read (NOSCRIPT re-sent as EVAL).
 * It calls the node layer below it, and fills a node's batch (store_batch.c
 * writes it): sending flows one way, down. What a reply needs from the layers
 * above (a redirection followed, a topology refresh) goes through struct
 * cmd_ops, which store.c registers in store.cmd_ops.
 */
#ifndef AGENT_STORE_CMD_H
#define AGENT_STORE_CMD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ev.h>
#include <hiredis/hiredis.h>

#include "store_int.h"

/* What the command layer asks of the layers above it. */
struct cmd_ops {
	/* Follows the redirection <err> (MOVED, ASK) that <n> answered the live
	 * command <c> with: true when it was one, <c> then re-sent, parked or
	 * answered and freed; false when <err> is no redirection. May invoke user
	 * callbacks. */
	bool (*redirect)(struct store_node *n, struct store_cmd *c, const char *err);
	/* The slot map may be stale (CLUSTERDOWN): ask for it again. Never
	 * invokes user callbacks. */
	void (*refresh)(struct store *s);
};

/* An argv under construction: strings by reference, numbers formatted into nums. */
struct argv_buf {
	const char **argv;
	size_t *lens;
	char (*nums)[24];
	int argc, nk;
};
/* Arguments query_push_args() appends for <q>. */
#define QUERY_ARGS(q) (5 * (q)->n + ((q)->want > 0 ? 4 : 0))
/* Decisions of the multi form <q> makes: its own, and its candidate policy's. */
#define QUERY_DECISIONS(q) ((q)->ncand ? 2 : 1)
void argv_str(struct argv_buf *av, const char *str, size_t len);
void argv_num(struct argv_buf *av, int64_t v);
const char *key_flags(const char *key);
void query_push_keys(struct argv_buf *av, const struct store_query *q);
void query_push_args(struct argv_buf *av, const struct store_query *q);
void query_push_decisions(struct argv_buf *av, const struct store_query *q);

/* a command's life */
struct store_cmd *cmd_new(struct store *s, enum cmd_kind kind, size_t qsize);
void cmd_free(struct store_cmd *c);
void cmd_pool_warm(struct store *s);
void cmds_written(struct store *s, double now);
void cmd_sent_now(struct store_cmd *c, double now);
void cmd_pool_free(struct store *s);
bool cmd_live(const struct store_cmd *c);
void cmd_answer(struct store_cmd *c, enum store_status st, const struct store_result *r);
int cmd_submit(struct store_node *n, struct store_cmd *c);
int cmd_dispatch_nocb(struct store_node *n, struct store_cmd *c);
int cmd_write(struct store_node *n, struct store_cmd *c, bool eval);
void cmd_reply(struct store_node *n, struct store_cmd *c, const redisReply *rep);
double cmd_wait(const struct store_cmd *c, double now);

/* the commands waiting at a node */
void node_fail_parked(struct store_node *n, enum store_status st);
void node_send_parked(struct store_node *n);
void node_route_parked(struct store_node *n);
void node_fail_queue(struct store_node *n, enum store_status st);
void node_send_queue(struct store_node *n);

/* the watchers store_new() starts: deadlines, and the loop turns' edges */
void cmd_timer_cb(struct ev_loop *loop, ev_timer *t, int revents);
void turn_begin_cb(struct ev_loop *loop, ev_check *w, int revents);
void turn_end_cb(struct ev_loop *loop, ev_prepare *w, int revents);

#endif /* AGENT_STORE_CMD_H */
