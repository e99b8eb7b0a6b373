/* SPDX-License-Identifier: MIT */
/*
 * The Redis store: non-blocking hiredis connections on the agent's libev loop,
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
#include "limiter.h"

struct ev_loop;
struct store;

#define STORE_MAX_LIMITS 16     /* limits decided in one script call */
#define STORE_KEY_MAX    256    /* longest Redis key we build */

enum store_status {
	STORE_OK       = 0,
	STORE_ERROR    = 1,     /* Redis answered with an error or nonsense */
	STORE_TIMEOUT  = 2,     /* no answer within the command timeout */
	STORE_DOWN     = 3,     /* not connected */
	STORE_BUSY     = 4,     /* too many commands in flight */
	STORE_SHUTDOWN = 5,     /* the store is being freed */
	STORE_BREAKER  = 6,     /* circuit breaker open: not even tried */
	STORE_OVERLOAD = 7,     /* shed: could not be sent within its queue budget */
	STORE_COUNT             /* sentinel */
};

/* Classes of Redis error replies (counted; a Redis failure for the breaker). */
enum store_errclass {
	STORE_EC_OOM      = 0,  /* -OOM: maxmemory reached with noeviction */
	STORE_EC_BUSY     = 1,  /* -BUSY: a script or module runs too long */
	STORE_EC_LOADING  = 2,  /* -LOADING: loading its dataset */
	STORE_EC_READONLY = 3,  /* -READONLY, -MASTERDOWN: a replica, or its master lost */
	STORE_EC_OTHER    = 4,  /* any other error, or a reply of the wrong shape */
	STORE_EC_COUNT          /* sentinel */
};

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
	unsigned command_timeout_ms;
	unsigned max_pending;           /* commands in flight, all nodes together */
	unsigned breaker_failures;      /* consecutive failures that open a node's breaker (5) */
	unsigned breaker_cooldown_ms;   /* how long it stays open before a probe (500) */
	unsigned queue_timeout_ms;      /* longest wait for room to send (command_timeout_ms) */
	unsigned max_concurrency;       /* ceiling of a node's adaptive concurrency limit (256) */
	unsigned batch_max;             /* decisions per script call (32; 1: one each) */
};

/* Batch modes (struct store_query.want > 0). */
enum store_batch {
	BATCH_GRANT  = 0,       /* up to <want> units, as many as fit now (lease, coalescing) */
	BATCH_REPORT = 1,       /* <want> units admitted locally: charge them all */
};

/*
 * One decision: n limits of one principal. A "unit" is one request of this
 * query (cost[i] tokens of limit i). With want == 0 it decides one unit; with
 * want > 0 it is a batch (see enum store_batch) and the result says how many
 * units were granted and how long a lease of them lives.
 *
 * The last <ncand> of the n limits may be a candidate policy's: a second
 * decision of its own, made in the same script call at the same Redis time
 * (the script's multi form), which never changes the first one's verdict
 * (store_result.cand_*). A query with a candidate is never a batch.
 */
struct store_query {
	size_t n;                                       /* limits, 1..STORE_MAX_LIMITS */
	size_t ncand;                                   /* of which the last are a
							 * candidate policy's (0: none) */
	int64_t want;                                   /* 0, or batch size in units */
	int batch;                                      /* enum store_batch when want > 0 */
	int64_t lease_us;                               /* lease lifetime wanted (batch) */
	int64_t min_units;                              /* grant: fewest units worth it (0, 1 = any) */
	double answer_by;                               /* mono(): answer (by the failure ladder
							 * if need be) by then; 0 = no bound */
	int64_t cost[STORE_MAX_LIMITS];                 /* tokens per limit; < 0 refunds */
	struct limit_params params[STORE_MAX_LIMITS];
	char keys[STORE_MAX_LIMITS][STORE_KEY_MAX];     /* NUL-terminated keys; last, so a
							 * copy can stop after keys[n - 1] */
};

/* Bytes of <q> that matter: everything up to its last key. */
#define STORE_QUERY_SIZE(q) (offsetof(struct store_query, keys) + (q)->n * STORE_KEY_MAX)

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

struct store_result {
	bool allowed;
	size_t n;
	int64_t now_us;                 /* Redis time of the decision */
	int64_t granted;                /* batch: units granted (grant) or that fitted (report) */
	int64_t lease_ms;               /* batch: lease lifetime granted (Redis time) */
	bool cand_ok;                   /* the candidate decision was made (ncand > 0) */
	bool cand_allowed;              /* ... and every limit of it admits the request */
	struct limit_verdict v[STORE_MAX_LIMITS]; /* the query's n limits, candidate last */
};

/* Called once per accepted query; <res> is valid only during the call. */
typedef void (*store_done_fn)(enum store_status st, const struct store_result *res, void *arg);
/* Called once per accepted lookup; <val> (NULL when absent) only during the call.
 * For a heartbeat <val> is the decimal count of live agents. */
typedef void (*store_str_fn)(enum store_status st, const char *val, size_t len, void *arg);

struct store_stats {
	uint64_t sent;                  /* EVALSHA/EVAL/HGET commands sent (re-sends too) */
	uint64_t replies;               /* replies received in time */
	uint64_t late;                  /* replies after their deadline */
	uint64_t noscript;              /* NOSCRIPT retries */
	uint64_t batch_calls;           /* script calls carrying several decisions */
	uint64_t batched;               /* decisions sent in them */
	uint64_t failed[STORE_COUNT];   /* outcomes other than OK, by status */
	uint64_t errors[STORE_EC_COUNT]; /* error replies by class */
	uint64_t shed;                  /* queries answered OVERLOAD (queue budget exceeded) */
	uint64_t queued;                /* queries waiting for room to be sent now */
	uint64_t concurrency_limit;     /* sum of the nodes' concurrency limits now */
	uint64_t connects;              /* successful connections */
	uint64_t pending;               /* commands in flight now */
	uint64_t breaker_opened;        /* times a node's breaker opened */
	bool breaker_open;              /* some node's breaker open (or probing) now */
	uint64_t moved;                 /* MOVED redirections followed */
	uint64_t ask;                   /* ASK redirections followed */
	uint64_t refreshes;             /* CLUSTER SLOTS sent */
	uint64_t topology_changes;      /* refreshes that changed the slot map */
	unsigned nodes;                 /* Redis nodes we keep a connection to */
	unsigned slots_covered;         /* slots with a known owner (16384 when single) */
	bool cluster;                   /* Redis Cluster detected */
};

int store_new(struct ev_loop *loop, const struct store_opts *opts, struct store **out,
	      char *err, size_t errlen) MUSTCHECK;
void store_free(struct store *s);
void store_set_auth(struct store *s, const char *user, const char *password);
void store_set_tls(struct store *s, struct tls_ctx *tls, struct tls_ctx *sentinel_tls);
int store_decide(struct store *s, const struct store_query *q, store_done_fn cb, void *arg);
int store_hget(struct store *s, const char *key, const char *field, store_str_fn cb, void *arg);
int store_hgetall(struct store *s, const char *key, store_str_fn cb, void *arg);
int store_heartbeat(struct store *s, const char *key, const char *id, unsigned window_ms,
		    store_str_fn cb, void *arg);
bool store_ready(const struct store *s);
bool store_key_ready(const struct store *s, const char *key);
bool store_health(const struct store *s, char *buf, size_t len);
const struct store_stats *store_stats(const struct store *s);
const char *store_status_str(int st);
const char *store_errclass_str(int ec);

#endif /* AGENT_STORE_H */
