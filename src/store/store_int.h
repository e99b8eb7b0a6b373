/* SPDX-License-Identifier: MIT */
/*
 * The Redis store's insides: the data its layers share, and no functions.
 * Each layer has a file and a header of its own and calls only those below
 * it (see the LAYERS in store.c):
 *   store_node.c     one Redis: its connection (connect, AUTH, ROLE, SCRIPT
 *                    LOAD, reconnect, names, Sentinels) and its health (breaker,
 *                    adaptive concurrency limit, error classes)
 *   store_cmd.c      commands: their life, deadlines, queues, sending, replies
 *   store_batch.c    several decisions in one script call
 *   store_cluster.c  the mode, the slot map, CLUSTER SLOTS, MOVED/ASK
 *   store.c          the API: admission, routing, housekeeping, the layers wired
 * A lower layer reads fields an upper one keeps (the mode, a node's slots),
 * never calls it: what must go up goes through the callbacks it declares
 * (struct node_ops in store_node.h, struct cmd_ops in store_cmd.h), which
 * store.c registers. Nothing here is part of the store's API (store.h).
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
#include "store_reply.h"
#include "store_types.h"

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
#ifndef LIMIT_INITIAL
#define LIMIT_INITIAL     256   /* ... starts at (capped by max_concurrency) */
#endif
#define LIMIT_DECREASE    0.8   /* multiplicative decrease on congestion */
#define RTT_WINDOW_S      10.0  /* the minimum latency is re-learnt this often */
#define TROUBLE_S         10.0  /* an error reply makes a node unhealthy this long */
#define SILENT_S          1.0   /* a node owing a reply this long (or the command
				 * timeout when longer) reads "not answering" */
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
	ND_HANDSHAKE    = 2,
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
	char sentinel_name[64];         /* ... by this host name (resolve-hostnames), "" by IP */
	bool locating;                  /* ... asking them now */
	int dial_port;                  /* the port dialled (the Sentinels'), 0: port */
	enum node_state state;
	struct rconn *rc;               /* owned; NULL when disconnected */
	ev_timer conn_timer;            /* connect deadline / reconnect backoff */
	unsigned backoff_ms;
	struct list parked;             /* store_cmd.park: redirected here, waiting for READY */
	unsigned out;                   /* commands sent on ac, callbacks still owed */
	double last_progress;           /* mono() of the last reply or first send */
	double silent_at;               /* mono() the oldest command a connection closed
					 * for silence (a stall, a handshake timed out) was
					 * sent; kept until the node answers a handshake
					 * (SCRIPT LOAD, even with an error), 0 none */
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
	double batch_since;             /* mono() its first decision joined the batch */
	bool lingering;                 /* in store.lingerq: a partial batch waits for more */
	struct list linger_node;
	bool flush_pending;             /* commands written to ac's buffer, not yet sent */
	unsigned nqueued;
	uint64_t errors[STORE_EC_COUNT]; /* error replies by class */
	uint64_t lat[2][STORE_LAT_BUCKETS]; /* reply latencies: this window, the one before */
	double lat_window_end;          /* mono() when this window becomes the one before */
	int err_class;                  /* enum store_errclass of the last error reply, -1 none */
	double err_at;                  /* mono() of that reply */
	uint64_t log_suppressed;        /* trouble not logged */
	ev_tstamp log_last;
	double down_at;                 /* ev_time() (Unix s) it went down: a connect that
					 * failed or a connection lost; 0: up, or never
					 * tried yet */
	char down_why[STORE_TROUBLE];   /* ... why, in words (node_down()) */
	bool down_told;                 /* this connection's failure was told already */
};

/* One query, from store_decide()/store_hget() to its answer and its reply. */
struct store_cmd {
	struct list node;               /* in store.waiting(_by) until answered or expired,
					 * in store.queued while queued */
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
	bool solo;                      /* never batched again: a cross-slot call found its
					 * slot elsewhere (store_batch.c) */
	bool parked;                    /* on at->parked, owned by us, not by a connection */
	bool queued;                    /* on at->queue and store.queued, owned by us */
	bool batched;                   /* on at->batch, owned by us until the flusher */
	bool pooled;                    /* CMD_POOL_SIZE bytes: goes back to store.cmd_pool */
	bool unwritten;                 /* started in this turn, its deadline command_timeout_ms
					 * from its send: restarted when written (cmds_written()) */
	struct store_cmd *next_free;    /* in store.cmd_pool */
	char *hkey, *hfield;            /* owned: HGET key and field; heartbeat key and id */
	unsigned window_ms;             /* heartbeat liveness window */
	double answer_by;               /* mono(): its caller answers HAProxy by then (the
					 * reply's deadline), 0 = none (command_timeout_ms) */
	struct store_query q;           /* decisions: kept for re-sends; last, and only
					 * allocated up to its last key (cmd_new) */
};

struct node_ops;
struct cmd_ops;

struct store {
	struct ev_loop *loop;           /* ref */
	const struct node_ops *node_ops; /* ref: the upcalls of the node layer */
	const struct cmd_ops *cmd_ops;  /* ref: ... of the command layer */
	struct store_node *seed;        /* ref: in nodes, the configured address */
	struct reply_limits reply_limits; /* every connection's, Sentinels' too */
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
	ev_timer cmd_timer;             /* earliest deadline of the FIFOs' heads */
	ev_timer tick;                  /* housekeeping */
	struct list flushq;             /* store_node.flush_node: output to send */
	ev_prepare flusher;             /* sends flushq's output before each poll */
	ev_check turn_begin;            /* after each poll: a loop turn starts ... */
	ev_prepare turn_end;            /* ... and ends before the next poll */
	double turn_start;              /* mono() the current turn started, 0 between turns */
	double busy;                    /* seconds the loop spent in turns (not polling) */
	double turn_end_at;             /* mono() the last turn ended (its poll began) */
	char sha[41];                   /* digest of the script, from SCRIPT LOAD */
	struct list waiting;            /* store_cmd.node, sent, deadline command_timeout_ms
					 * from the send: oldest first */
	struct list waiting_by;         /* store_cmd.node, sent, deadline the query's answer_by:
					 * in the order of the NOTIFYs (nearly) */
	struct list queued;             /* store_cmd.node of queued commands, oldest first */
	double queue_s;                 /* queue budget of a command */
	double answer_budget_s;         /* HAProxy's share a decision's reply gets, 0: unknown */
	unsigned max_concurrency;       /* ceiling of the nodes' limits */
	unsigned batch_max;             /* decisions per script call (1: no batching) */
	double batch_wait_s;            /* a partial batch waits this long for more, 0: none */
	struct list lingerq;            /* store_node.linger_node: partial batches waiting */
	int linger_fd;                  /* a timerfd for the first of them to leave, or -1
					 * (the loop's timers wake up to a millisecond late) */
	ev_io linger_io;
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

#endif /* AGENT_STORE_INT_H */
