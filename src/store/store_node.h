/* SPDX-License-Identifier: MIT */
/*
 * The store's node layer (store_node.c): one Redis, its connection and its
 * health. It calls the transport (rconn), the resolver and the Sentinel client
 * below it, never the store's upper layers: what they must hear of a node (it
 * became ready, its connection is closing, it was lost) goes up through struct
 * node_ops, which store.c registers in store.node_ops.
 */
#ifndef AGENT_STORE_NODE_H
#define AGENT_STORE_NODE_H

#include <stdbool.h>
#include <stddef.h>

#include "compiler.h"
#include "store_int.h"

/* What a node tells the layers above it. Each is called with <n> alive. */
struct node_ops {
	/* <n> is READY (the script loaded): what was parked there may go, the
	 * topology may be asked. May invoke user callbacks. */
	void (*ready)(struct store_node *n);
	/* <n>'s connection is being closed by us (node_close()), its state
	 * DISCONNECTED already: what waits to be written on it is answered before
	 * the connection is freed. Invokes user callbacks. */
	void (*closing)(struct store_node *n);
	/* <n>'s connection is gone (or never came) and a reconnect is scheduled;
	 * not called while the store is freed: what waited for <n> is answered,
	 * the topology may be asked again. Invokes user callbacks. */
	void (*lost)(struct store_node *n);
};

/* connections: store_node.c */
void store_log_trouble(struct store_node *n, const char *what, const char *detail);
int endpoint_make(struct endpoint *ep, const struct store_node *from, const char *host,
		  size_t hostlen, long port);
int seed_endpoint(const char *addr, struct endpoint *ep, char *err, size_t errlen);
struct store_node *node_get(struct store *s, const struct endpoint *ep);
struct store_node *node_new(struct store *s, const struct endpoint *ep, bool seed);
void node_close(struct store_node *n);
double node_unanswered_at(const struct store_node *n);
void node_silent(struct store_node *n);
void node_free(struct store_node *n);
void node_lost(struct store_node *n);
void node_down(struct store_node *n, const char *fmt, ...) PRINTF(2, 3);
void node_connect(struct store_node *n);
void node_ttl_check(struct store_node *n, double now);
void node_master_switched(void *arg, const char *ip, int port);

/* health: the breaker, error replies, the adaptive concurrency limit */
void breaker_record(struct store_node *n, enum store_status st);
void breaker_trip(struct store_node *n, const char *why);
bool breaker_allows(struct store_node *n);
enum store_errclass error_class(const char *err);
void node_error(struct store_node *n, enum store_errclass ec);
double reply_budget(const struct store *s);
void limit_decrease(struct store_node *n, double now);
void limit_sample(struct store_node *n, double rtt, double now);
void node_lat_turn(struct store_node *n, double now);
double node_lat_bound(unsigned i);

/* True when <n> has room under its limit for one more command. */
static inline bool limit_room(const struct store_node *n)
{
	return n->out < (unsigned)n->limit;
}

#endif /* AGENT_STORE_NODE_H */
