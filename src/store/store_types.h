/* SPDX-License-Identifier: MIT */
/*
 * The Redis store's vocabulary: what a query is, what it is answered with,
 * the outcomes and the statistics. Data only: every layer of the store (see
 * store.c) and its callers share these types; the functions are in store.h.
 */
#ifndef AGENT_STORE_TYPES_H
#define AGENT_STORE_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "limiter.h"

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
	STORE_EC_PROTOCOL = 5,  /* a connection closed on what it sent: malformed RESP,
				 * or a reply past redis.max_reply_* */
	STORE_EC_COUNT          /* sentinel */
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

#define STORE_LAT_BUCKETS  16    /* reply latencies: <= 50 us doubling, the last beyond */
#define STORE_LAT_WINDOW_S 10.0  /* latencies kept: this window and the one before */
#define STORE_NODE_NAME    80    /* a node's name as reported (cut) */
#define STORE_TROUBLE      400   /* what is wrong with a node, in words (cut) */

/* One Redis node as the status page shows it. */
struct store_node_stats {
	char name[STORE_NODE_NAME];     /* "host:port", "[ip6]:port" or "unix:/path" */
	char state[16];                 /* "ready", "connecting", "handshake", "disconnected",
					 * or "not answering" (oldest_s past SILENT_S) */
	bool breaker_open;              /* open, or half-open while probing */
	unsigned limit;                 /* adaptive concurrency limit now */
	unsigned out;                   /* commands in flight */
	unsigned queued;                /* commands waiting for room under the limit */
	unsigned slots;                 /* cluster slots routed here (16384 when single) */
	uint64_t errors[STORE_EC_COUNT]; /* error replies by class, since the start */
	uint64_t lat[STORE_LAT_BUCKETS]; /* replies of the last 10 to 20 s, by latency */
	double oldest_s;                /* age of the oldest command it has not answered
					 * (node_unanswered_at()), 0: it owes nothing */
	double down_since;              /* Unix seconds it went down (refused, lost, timed
					 * out, TLS or AUTH failed), 0: up */
	char trouble[STORE_TROUBLE];    /* what is wrong with it, in words; "" nothing
					 * (store_health() says the same) */
};

struct store_stats {
	uint64_t sent;                  /* EVALSHA/EVAL/HGET commands sent (re-sends too) */
	uint64_t replies;               /* replies received in time */
	uint64_t late;                  /* replies after their deadline */
	uint64_t noscript;              /* NOSCRIPT retries */
	uint64_t batch_calls;           /* script calls carrying several decisions */
	uint64_t batched;               /* decisions sent in them */
	uint64_t cross_slot_calls;      /* ... of them in a cluster, over several slots */
	uint64_t cross_slot_solo;       /* decisions such a call found elsewhere, sent alone */
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

#endif /* AGENT_STORE_TYPES_H */
