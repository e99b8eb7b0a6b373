/* SPDX-License-Identifier: MIT */
/*
 * The Redis store's insides, shared by its files (see store.c for the design):
 *   store.c          commands, deadlines, admission, breaker, the API
 *   store_node.c     one connection: connect, AUTH + SCRIPT LOAD, reconnect, addresses
 *   store_cluster.c  mode, slot map, CLUSTER SLOTS, MOVED/ASK
 *   store_batch.c    several decisions in one script call
 *   store_reply.c    reply objects from a free list instead of calloc()
 * Nothing here is part of the store's API (store.h).
 */
#ifndef AGENT_STORE_INT_H
#define AGENT_STORE_INT_H

#include <arpa/inet.h>
#include <stdbool.h>

#include <ev.h>
#include <hiredis/hiredis.h>

#include "list.h"
#include "pool.h"
#include "rconn.h"
#include "resolve.h"
#include "store.h"

#define BACKOFF_MIN_MS    50
#define BACKOFF_MAX_MS    500
#define MAX_NODES         1024  /* connections we keep, retired ones included */
#define MAX_REDIRECTS     5     /* MOVED/ASK followed per command */
#define TICK_S            0.1   /* housekeeping period */
#define REFRESH_EVERY_S   5.0   /* periodic topology refresh of a cluster */
#define REFRESH_HOLE_S    1.0   /* ... while some slots have no owner */
#define REFRESH_MIN_S     0.1   /* never more often than this */
#define REFRESH_TIMEOUT_S 1.0   /* a CLUSTER SLOTS unanswered this long is lost */
#define LIMIT_MIN         2     /* a node's concurrency limit never goes below */
#define LIMIT_INITIAL     32    /* ... starts at (slow start from there) */
#define LIMIT_DECREASE    0.8   /* multiplicative decrease on congestion */
#define RTT_WINDOW_S      10.0  /* the minimum latency is re-learnt this often */
#define TROUBLE_S         10.0  /* an error reply makes a node unhealthy this long */
#define STORE_BATCH_MAX   64    /* decisions in one script call, at most */

enum store_mode {
	MODE_UNKNOWN = 0,       /* CLUSTER SLOTS not answered yet */
	MODE_SINGLE  = 1,       /* one Redis: every slot is the seed's */
	MODE_CLUSTER = 2,       /* slot map from CLUSTER SLOTS */
	MODE_COUNT              /* sentinel */
};

enum node_state {
	ND_DISCONNECTED = 0,
	ND_CONNECTING   = 1,
	ND_LOADING      = 2,
	ND_READY        = 3,
	ND_COUNT                /* sentinel */
};

enum cmd_kind {
	CMD_DECIDE = 0,         /* the rate-limit script */
	CMD_HGET   = 1,         /* a lookup */
	CMD_HEARTBEAT = 2,      /* the gateway heartbeat script */
	CMD_COUNT               /* sentinel */
};

/* A node address: numeric and canonical (inet_ntop), or a unix socket. */
struct endpoint {
	char host[256];                 /* canonical ip or a host name; "" for unix */
	int port;
	const char *unix_path;          /* ref: owned by a node, or NULL */
	bool sentinel;                  /* host is a master's name under Sentinel */
};

/* One Redis: a connection and everything about its health. */
struct store_node {
	struct list link;               /* in store.nodes */
	struct store *s;                /* ref: owner */
	char *host;                     /* owned: canonical ip or a name, or NULL for unix */
	int port;
	char *unix_path;                /* owned or NULL */
	char *name;                     /* owned: "host:port", "[ip6]:port" or "unix:/path" */
	bool named;                     /* host is a name: resolved before each connect */
	struct resolve_req *rq;         /* the lookup in flight, or NULL */
	bool rq_refresh;                /* ... a TTL refresh while connected */
	char addrs[RESOLVE_MAX_ADDRS][INET6_ADDRSTRLEN]; /* the name's addresses, last lookup */
	unsigned naddrs;
	unsigned addr_next;             /* the address the next connect tries (mod naddrs) */
	double addrs_until;             /* mono(): the lookup's TTL runs out */
	char addr[INET6_ADDRSTRLEN];    /* the address of the connection, "" none */
	bool was_ready;                 /* the connection to addr got READY */
	bool sentineled;                /* host is a master's name: the Sentinels say where */
	bool locating;                  /* ... asking them now */
	int dial_port;                  /* the port dialled (the Sentinels'), 0: port */
	enum node_state state;
	struct rconn *rc;               /* owned; NULL when disconnected */
	ev_timer conn_timer;            /* connect deadline / reconnect backoff */
	unsigned backoff_ms;
	struct list parked;             /* store_cmd.park: redirected here, waiting for READY */
	unsigned out;                   /* commands sent on ac, callbacks still owed */
	double last_progress;           /* mono() of the last reply or first send */
	bool stall_seen;                /* the last tick saw no progress for stall_s */
	unsigned nslots;                /* slots routed here */
	bool seed;                      /* the configured address: never retired */
	bool retired;                   /* left the topology: closed once idle */
	bool mark;                      /* scratch for topology_apply() */
	unsigned failures;              /* consecutive timeouts and errors */
	double breaker_until;           /* open until (mono); then one probe */
	bool breaker_open;              /* open, or half-open while probing */
	bool probing;                   /* half-open: the probe is in flight */
	double limit;                   /* adaptive concurrency limit: commands out on ac */
	bool slow_start;                /* no congestion seen yet: the limit doubles per round */
	double rtt_min;                 /* lowest reply latency seen (s), 0 = none yet */
	double rtt_min_next;            /* ... in the current window, 0 = none yet */
	double rtt_window_end;          /* mono() when rtt_min becomes rtt_min_next */
	double last_decrease;           /* mono() of the last multiplicative decrease */
	struct list queue;              /* store_cmd.park: waiting for room under the limit */
	struct list flush_node;         /* in store.flushq while flush_pending */
	struct list batch;              /* store_cmd.park: decisions for the next call */
	unsigned nbatch;
	bool flush_pending;             /* commands written to ac's buffer, not yet sent */
	unsigned nqueued;
	int err_class;                  /* enum store_errclass of the last error reply, -1 none */
	double err_at;                  /* mono() of that reply */
	uint64_t log_suppressed;        /* trouble not logged */
	ev_tstamp log_last;
};

/* One query, from store_decide()/store_hget() to its answer and its reply. */
struct store_cmd {
	struct list node;               /* in store.waiting until answered or expired */
	struct list park;               /* in store_node.parked while parked, or in
					 * store_node.queue while queued */
	struct store *s;                /* ref: owner */
	struct store_node *at;          /* ref: node sent to or parked at; valid while live */
	store_done_fn cb;               /* decisions: NULL once the caller was answered */
	store_str_fn str_cb;            /* lookups: NULL once the caller was answered */
	void *arg;                      /* ref: caller's */
	double deadline;                /* mono() based: reply deadline once sent, queue
					 * deadline while queued */
	double sent_at;                 /* mono() of the last send; 0 before it and while parked */
	double busy_at;                 /* store_busy() at that send */
	enum cmd_kind kind;
	unsigned redirects;             /* MOVED/ASK followed */
	bool retried;                   /* NOSCRIPT retry done */
	bool asking;                    /* ASK: send ASKING before it */
	bool parked;                    /* on at->parked, owned by us, not by hiredis */
	bool queued;                    /* on at->queue and store.queued, owned by us */
	bool batched;                   /* on at->batch, owned by us until the flusher */
	bool pooled;                    /* CMD_POOL_SIZE bytes: goes back to store.cmd_pool */
	struct store_cmd *next_free;    /* in store.cmd_pool */
	char *hkey, *hfield;            /* owned: HGET key and field; heartbeat key and id */
	unsigned window_ms;             /* heartbeat liveness window */
	struct store_query q;           /* decisions: kept for re-sends; last, and only
					 * allocated up to its last key (cmd_new) */
};

struct store {
	struct ev_loop *loop;           /* ref */
	struct store_node *seed;        /* ref: in nodes, the configured address */
	char *user;                     /* owned or NULL */
	char *password;                 /* owned or NULL */
	unsigned connect_timeout_ms;
	unsigned command_timeout_ms;
	unsigned max_pending;
	struct resolver_opts resolver_opts; /* nameservers owned */
	struct resolver *resolver;      /* owned; made at the first name looked up */
	struct sentinel *sentinel;      /* owned or NULL: the seed is a master under Sentinel */
	struct tls_ctx *tls;            /* owned or NULL: clear text; new connections use it */
	enum store_mode mode;
	struct list nodes;              /* store_node.link, owned */
	struct store_node **slots;      /* owned array of CRC16_SLOTS refs: owner or NULL */
	struct store_node **scratch;    /* owned array of CRC16_SLOTS: next map */
	ev_timer cmd_timer;             /* deadline of the oldest waiting command */
	ev_timer tick;                  /* housekeeping */
	struct list flushq;             /* store_node.flush_node: output to send */
	ev_prepare flusher;             /* sends flushq's output before each poll */
	ev_check turn_begin;            /* after each poll: a loop turn starts ... */
	ev_prepare turn_end;            /* ... and ends before the next poll */
	double turn_start;              /* mono() the current turn started, 0 between turns */
	double busy;                    /* seconds the loop spent in turns (not polling) */
	double turn_end_at;             /* mono() the last turn ended (its poll began) */
	char sha[41];                   /* digest of the script, from SCRIPT LOAD */
	struct list waiting;            /* store_cmd.node, oldest first */
	struct list queued;             /* store_cmd.node of queued commands, oldest first */
	double queue_s;                 /* queue budget of a command */
	unsigned max_concurrency;       /* ceiling of the nodes' limits */
	unsigned batch_max;             /* decisions per script call (1: no batching) */
	struct store_stats stats;
	bool freeing;
	struct store_cmd *cmd_pool;     /* owned: freed commands of CMD_POOL_SIZE bytes, for reuse */
	unsigned ncmd_pool;
	double stall_s;                 /* no reply for this long with commands out: reconnect */
	unsigned breaker_failures;      /* threshold */
	double breaker_cooldown_s;
	unsigned breakers_open;         /* nodes with an open breaker */
	bool refresh_wanted;            /* a CLUSTER SLOTS is due */
	struct store_node *refresh_node; /* ref: where the one in flight went, or NULL */
	double refresh_last;            /* mono() it was sent */
	unsigned refresh_rr;            /* rotates the choice of node */
};

/* store_reply.c */
redisReplyObjectFunctions *reply_functions(void);
void reply_cache_free(void);

/* store.c */
void breaker_set(struct store_node *n, bool open);
void breaker_record(struct store_node *n, enum store_status st);
void cmd_answer(struct store_cmd *c, enum store_status st, const struct store_result *r);
void cmd_free(struct store_cmd *c);
int cmd_dispatch_nocb(struct store_node *n, struct store_cmd *c);
void node_fail_parked(struct store_node *n, enum store_status st);
void node_send_parked(struct store_node *n);
void node_fail_queue(struct store_node *n, enum store_status st);
void limit_set(struct store_node *n, double v);
void limit_reset(struct store_node *n);
void breaker_trip(struct store_node *n, const char *why);
enum store_errclass error_class(const char *err);
void node_error(struct store_node *n, enum store_errclass ec);
bool cmd_live(const struct store_cmd *c);
void cmd_reply(struct store_node *n, struct store_cmd *c, const redisReply *rep);
int cmd_write(struct store_node *n, struct store_cmd *c, bool eval);
void limit_sample(struct store_node *n, double rtt, double now);
double cmd_wait(const struct store_cmd *c, double now);
void node_send_queue(struct store_node *n);

/* An argv under construction: strings by reference, numbers formatted into nums. */
struct argv_buf {
	const char **argv;
	size_t *lens;
	char (*nums)[24];
	int argc, nk;
};
/* Arguments query_push_args() appends for <q>. */
#define QUERY_ARGS(q) (5 * (q)->n + ((q)->want > 0 ? 4 : 0))
void argv_str(struct argv_buf *av, const char *str, size_t len);
void argv_num(struct argv_buf *av, int64_t v);
void query_push_keys(struct argv_buf *av, const struct store_query *q);
void query_push_args(struct argv_buf *av, const struct store_query *q);
/* Decisions of the multi form <q> makes: its own, and its candidate policy's. */
#define QUERY_DECISIONS(q) ((q)->ncand ? 2 : 1)
void query_push_decisions(struct argv_buf *av, const struct store_query *q);

/* store_batch.c */
bool batch_wants(const struct store_node *n, const struct store_cmd *c, bool eval);
void batch_add(struct store_node *n, struct store_cmd *c);
void batch_fail(struct store_node *n);
void batch_flush(struct store_node *n);

/* store_node.c */
void store_log_trouble(struct store_node *n, const char *what, const char *detail);
int endpoint_make(struct endpoint *ep, const struct store_node *from, const char *host,
		  size_t hostlen, long port);
struct store_node *node_get(struct store *s, const struct endpoint *ep);
struct store_node *node_new(struct store *s, const struct endpoint *ep, bool seed);
void node_close(struct store_node *n);
void node_free(struct store_node *n);
void node_lost(struct store_node *n);
void node_connect(struct store_node *n);
void node_ttl_check(struct store_node *n, double now);
void node_master_switched(void *arg, const char *ip, int port);
int seed_endpoint(const char *addr, struct endpoint *ep, char *err, size_t errlen);

/* store_cluster.c */
void slot_set(struct store *s, unsigned slot, struct store_node *n);
void node_retire(struct store_node *n);
bool cmd_redirect(struct store_node *from, struct store_cmd *c, const char *err);
void refresh_request(struct store *s);
void refresh_kick(struct store *s);

#endif /* AGENT_STORE_INT_H */
