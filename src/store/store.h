/* SPDX-License-Identifier: MIT */
/*
 * The Redis store: non-blocking connections (rconn.h) on the agent's libev loop,
 * the rate-limit script loaded with SCRIPT LOAD and run with EVALSHA, our own
 * connect and per-command deadlines, reconnection with capped backoff.
 *
 * One configured address, a single Redis or any node of a Redis Cluster: the
 * store finds out which with CLUSTER SLOTS and, for a cluster, keeps one
 * connection per master, routes each query by the hash slot of its first key,
 * follows MOVED/ASK and refreshes the topology by itself.
 *
 * Overload control: each node has an adaptive limit on the commands in flight
 * on its connection, driven by the measured reply latency; queries beyond it
 * wait in a bounded FIFO and are answered STORE_OVERLOAD when they cannot be
 * sent within their queue budget. Only Redis failures (connection errors,
 * error replies, a node that stopped answering) open a node's breaker, never
 * a deadline missed while the node keeps answering.
 *
 * Every query either fails at once (store_decide() returns a negative status
 * and no callback ever comes) or gets exactly one completion callback later.
 * A reply that arrives after its deadline is discarded.
 */
#ifndef AGENT_STORE_H
#define AGENT_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compiler.h"
#include "store_types.h"

/*
 * The deadline of a command no decision waits on when nothing else says one
 * (redis.command_timeout_ms unset and no spoe_timeout): the default of the
 * configuration (config_command_timeout_ms()) and of store_set_timeouts().
 */
#define STORE_COMMAND_TIMEOUT_MS 5

struct ev_loop;
struct reply_limits;
struct store;

struct tls_ctx;

struct store_opts {
	const char *address;            /* "host:port", "[ip6]:port" or "unix:/path"; a single
					 * Redis or any node of a cluster; a host name is
					 * resolved on the loop (resolve.c) */
	const char *nameservers;        /* for names: "ip[:port],..." or NULL (resolv.conf) */
	unsigned resolve_timeout_ms;    /* per DNS try (0: c-ares' default) */
	const char *const *sentinels;   /* Redis Sentinel: "ip:port"s (then address unused) */
	size_t nsentinels;
	const char *sentinel_master;    /* the name they monitor */
	const char *sentinel_user;      /* their AUTH, or NULL */
	const char *sentinel_password;
	struct tls_ctx *sentinel_tls;   /* the Sentinels' TLS, or NULL: clear text */
	struct tls_ctx *tls;            /* TLS to every Redis node, or NULL: clear text */
	const char *user;               /* ACL user or NULL */
	const char *password;           /* AUTH password or NULL */
	unsigned connect_timeout_ms;
	unsigned command_timeout_ms;    /* deadline of a command no NOTIFY waits on (5) */
	unsigned answer_budget_ms;      /* spoe_timeout known: the share of it a decision's
					 * reply gets (its deadline is its answer_by); 0: none */
	unsigned max_pending;           /* commands in flight, all nodes together */
	unsigned breaker_failures;      /* consecutive failures that open a node's breaker (5) */
	unsigned breaker_cooldown_ms;   /* how long it stays open before a probe (500) */
	unsigned queue_timeout_ms;      /* longest wait for room to send (command_timeout_ms) */
	unsigned max_concurrency;       /* ceiling of a node's adaptive concurrency limit (256) */
	unsigned batch_max;             /* decisions per script call (32; 1: one each) */
	unsigned batch_wait_us;         /* a partial batch waits this long for more (0: none) */
	const struct reply_limits *reply_limits; /* one reply's bounds, every connection's
					 * (copied); NULL: the defaults */
};

/* Starts a single decision (no batch) of no limits in <q>; keys are not touched. */
static inline void store_query_init(struct store_query *q)
{
	q->n = 0;
	q->ncand = 0;
	q->want = 0;
	q->batch = BATCH_GRANT;
	q->lease_us = 0;
	q->min_units = 0;
	q->answer_by = 0;
}

int store_new(struct ev_loop *loop, const struct store_opts *opts, struct store **out,
	      char *err, size_t errlen) MUSTCHECK;
void store_free(struct store *s);
void store_set_auth(struct store *s, const char *user, const char *password);
void store_set_tls(struct store *s, struct tls_ctx *tls, struct tls_ctx *sentinel_tls);
void store_set_timeouts(struct store *s, unsigned command_timeout_ms, unsigned queue_timeout_ms,
			unsigned answer_budget_ms);
int store_decide(struct store *s, const struct store_query *q, store_done_fn cb, void *arg);
int store_hget(struct store *s, const char *key, const char *field, double answer_by,
	       store_str_fn cb, void *arg);
int store_hgetall(struct store *s, const char *key, store_str_fn cb, void *arg);
int store_heartbeat(struct store *s, const char *key, const char *id, unsigned window_ms,
		    store_str_fn cb, void *arg);
bool store_ready(const struct store *s);
bool store_key_ready(const struct store *s, const char *key);
bool store_health(const struct store *s, char *buf, size_t len);
bool store_down(const struct store *s);
const struct store_stats *store_stats(const struct store *s);
size_t store_node_stats(const struct store *s, struct store_node_stats *out, size_t max);
double store_lat_bound(unsigned i);
const char *store_status_str(int st);
const char *store_errclass_str(int ec);

#endif /* AGENT_STORE_H */
