/* SPDX-License-Identifier: MIT */
/*
 * Redis store on hiredis 0.14.1's async API and its libev adapter: a single
 * Redis, or a Redis Cluster found from any one of its nodes.
 *
 * DESIGN
 * Nodes. Every Redis we talk to is a node with its own connection, state,
 * connect deadline, reconnect backoff, circuit breaker and stall detection.
 * The configured address is the seed node; it is never dropped.
 *
 * Node states: DISCONNECTED -> CONNECTING -> LOADING -> READY, back to
 * DISCONNECTED on any failure, and a reconnect timer with a capped backoff.
 *  - CONNECTING: our connect timer bounds it (hiredis 0.14.1 has no async
 *    connect timeout); on expiry the context is freed and we retry later.
 *  - LOADING: AUTH (if configured) and SCRIPT LOAD are pipelined; the node is
 *    ready when SCRIPT LOAD returns the digest. New queries for it are refused
 *    (DOWN) until then, so they are answered by the fail policy at once rather
 *    than waiting behind a connection that may never come up.
 *  - READY: queries become EVALSHA commands. A NOSCRIPT error (Redis restarted
 *    empty, SCRIPT FLUSH, eviction) re-sends the same query once as EVAL with
 *    the script body, which also caches it again.
 *
 * Mode. Until the seed answered CLUSTER SLOTS the mode is unknown and queries
 * are refused (DOWN). An error ("cluster support disabled", or any other, e.g.
 * no permission) means a single Redis: every slot belongs to the seed. An array
 * is the cluster's slot map: masters only, each one a node (numeric addresses
 * only: hiredis resolves names with a blocking getaddrinfo(); an empty or NULL
 * address means the node we asked). A single Redis is asked again on every
 * reconnect, so it may turn into a cluster.
 *
 * Routing. A query goes to the owner of the slot of its first key (CRC16 of
 * the hash tag, crc16.h); all keys of one query share the tag, so one slot.
 *  - MOVED <slot> <ip:port>: the slot changed owner. The map is updated (the
 *    node created if new), the command re-sent there with its own deadline,
 *    and a full refresh scheduled.
 *  - ASK <slot> <ip:port>: the slot is being migrated and this key already
 *    left; ASKING and the command are pipelined on the target, the map is kept.
 *  - A redirected command whose target is still connecting waits there
 *    (parked) until it is ready, its deadline still running. At most
 *    MAX_REDIRECTS redirections per command; beyond, it fails (ERROR).
 *  - TRYAGAIN, CLUSTERDOWN and other errors fail the query at once (ERROR);
 *    CLUSTERDOWN also schedules a refresh.
 *
 * Topology refresh: CLUSTER SLOTS on one ready node (masters first, rotating),
 * on MOVED, CLUSTERDOWN, the loss of a connection to a master, every
 * REFRESH_EVERY_S (every second while some slots have no owner), never more
 * often than REFRESH_MIN_S, one at a time with its own deadline. A failed-over
 * master disappears from the map and its promoted replica appears in it. A node
 * that left the map is retired: nothing new is sent to it, the replies it owes
 * still come (a MOVED among them is followed), and it is closed once idle (or
 * stalled).
 *
 * Deadlines: every command joins one FIFO with its deadline; one timer tracks
 * the oldest. Every command gets the same timeout, so the FIFO head is always
 * the oldest deadline whichever node the command went to, even after
 * redirections. When it expires the caller is answered STORE_TIMEOUT at once
 * and the command is marked abandoned: hiredis still owns its callback, which
 * later frees it without calling anyone ("late" replies); a parked command is
 * freed at once.
 *
 * Housekeeping tick (TICK_S): stalls (commands out on a node and nothing back
 * for stall_s: the connection is dropped, its waiters answered DOWN, a
 * reconnect starts), retired nodes closed once idle, refresh schedule.
 * Connections are only ever closed from timers, never from inside a hiredis
 * callback.
 *
 * Circuit breaker, per node: <breaker_failures> consecutive failures of
 * queries sent to one node stop queries to that node (BREAKER) for a
 * cool-down; then one query goes through as a probe; its success closes the
 * breaker. A node that answers with a redirection is healthy.
 *
 * Bounded: at most max_pending commands in flight over all nodes (abandoned and
 * parked ones included, so a stalled Redis cannot make us buffer without end),
 * beyond that queries fail at once with STORE_BUSY; at most MAX_NODES nodes;
 * at most MAX_REDIRECTS redirections per command.
 *
 * Exactly-once: a query accepted by store_decide() gets one callback, from the
 * reply, the deadline, the disconnection or the shutdown, whichever comes
 * first.
 */
#include "store.h"

#include <arpa/inet.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <ev.h>
#include <hiredis/adapters/libev.h>
#include <hiredis/async.h>
#include <hiredis/hiredis.h>

#include "crc16.h"
#include "list.h"
#include "log.h"
#include "scripts.h"
#include "util.h"

#define BACKOFF_MIN_MS    50
#define BACKOFF_MAX_MS    500
#define MAX_NODES         1024  /* connections we keep, retired ones included */
#define MAX_REDIRECTS     5     /* MOVED/ASK followed per command */
#define TICK_S            0.1   /* housekeeping period */
#define REFRESH_EVERY_S   5.0   /* periodic topology refresh of a cluster */
#define REFRESH_HOLE_S    1.0   /* ... while some slots have no owner */
#define REFRESH_MIN_S     0.1   /* never more often than this */
#define REFRESH_TIMEOUT_S 1.0   /* a CLUSTER SLOTS unanswered this long is lost */

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
	char host[INET6_ADDRSTRLEN];    /* "" for unix */
	int port;
	const char *unix_path;          /* ref: owned by a node, or NULL */
};

/* One Redis: a connection and everything about its health. */
struct store_node {
	struct list link;               /* in store.nodes */
	struct store *s;                /* ref: owner */
	char *host;                     /* owned: canonical ip, or NULL for unix */
	int port;
	char *unix_path;                /* owned or NULL */
	char *name;                     /* owned: "ip:port", "[ip6]:port" or "unix:/path" */
	enum node_state state;
	redisAsyncContext *ac;          /* owned by hiredis; NULL when disconnected */
	ev_timer conn_timer;            /* connect deadline / reconnect backoff */
	unsigned backoff_ms;
	struct list parked;             /* store_cmd.park: redirected here, waiting for READY */
	unsigned out;                   /* commands sent on ac, callbacks still owed */
	double last_progress;           /* mono() of the last reply or first send */
	unsigned nslots;                /* slots routed here */
	bool seed;                      /* the configured address: never retired */
	bool retired;                   /* left the topology: closed once idle */
	bool mark;                      /* scratch for topology_apply() */
	unsigned failures;              /* consecutive timeouts and errors */
	double breaker_until;           /* open until (mono); then one probe */
	bool breaker_open;              /* open, or half-open while probing */
	bool probing;                   /* half-open: the probe is in flight */
	uint64_t log_suppressed;        /* trouble not logged */
	ev_tstamp log_last;
};

/* One query, from store_decide()/store_hget() to its answer and its reply. */
struct store_cmd {
	struct list node;               /* in store.waiting until answered or expired */
	struct list park;               /* in store_node.parked while parked */
	struct store *s;                /* ref: owner */
	struct store_node *at;          /* ref: node sent to or parked at; valid while live */
	store_done_fn cb;               /* decisions: NULL once the caller was answered */
	store_str_fn str_cb;            /* lookups: NULL once the caller was answered */
	void *arg;                      /* ref: caller's */
	double deadline;                /* mono() based */
	enum cmd_kind kind;
	unsigned redirects;             /* MOVED/ASK followed */
	bool retried;                   /* NOSCRIPT retry done */
	bool asking;                    /* ASK: send ASKING before it */
	bool parked;                    /* on at->parked, owned by us, not by hiredis */
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
	enum store_mode mode;
	struct list nodes;              /* store_node.link, owned */
	struct store_node **slots;      /* owned array of CRC16_SLOTS refs: owner or NULL */
	struct store_node **scratch;    /* owned array of CRC16_SLOTS: next map */
	ev_timer cmd_timer;             /* deadline of the oldest waiting command */
	ev_timer tick;                  /* housekeeping */
	char sha[41];                   /* digest of the script, from SCRIPT LOAD */
	struct list waiting;            /* store_cmd.node, oldest first */
	struct store_stats stats;
	bool freeing;
	double stall_s;                 /* no reply for this long with commands out: reconnect */
	unsigned breaker_failures;      /* threshold */
	double breaker_cooldown_s;
	unsigned breakers_open;         /* nodes with an open breaker */
	bool refresh_wanted;            /* a CLUSTER SLOTS is due */
	struct store_node *refresh_node; /* ref: where the one in flight went, or NULL */
	double refresh_last;            /* mono() it was sent */
	unsigned refresh_rr;            /* rotates the choice of node */
};

static void node_connect(struct store_node *n);
static void node_lost(struct store_node *n);
static void refresh_request(struct store *s);
static int cmd_send(struct store_node *n, struct store_cmd *c, bool eval);
static void cmd_reply_cb(redisAsyncContext *ac, void *reply, void *privdata);
static void conn_timer_cb(struct ev_loop *loop, ev_timer *t, int revents);

/* Seconds on the monotonic clock: deadlines must not move with the wall clock. */

const char *store_status_str(int st)
{
	static const char *const names[STORE_COUNT] = {"ok",   "error",    "timeout", "down",
						       "busy", "shutdown", "breaker"};

	if (st < 0 || st >= STORE_COUNT)
		return "?";
	return names[st];
}

/* Logs trouble with node <n> at most once a second, counting what was dropped. */
static void store_log_trouble(struct store_node *n, const char *what, const char *detail)
{
	ev_tstamp now = ev_now(n->s->loop);

	if (now - n->log_last < 1.0) {
		n->log_suppressed++;
		return;
	}
	if (n->log_suppressed)
		LOG(LOG_WARN, "redis %s %s: %s (%llu similar messages suppressed)", n->name, what,
		    detail, (unsigned long long)n->log_suppressed);
	else
		LOG(LOG_WARN, "redis %s %s: %s", n->name, what, detail);
	n->log_suppressed = 0;
	n->log_last = now;
}

/* ---- circuit breaker (per node) ---------------------------------------- */

static void breaker_set(struct store_node *n, bool open)
{
	struct store *s = n->s;

	if (n->breaker_open == open)
		return;
	n->breaker_open = open;
	if (open)
		s->breakers_open++;
	else
		s->breakers_open--;
	s->stats.breaker_open = s->breakers_open > 0;
}

/*
 * <breaker_failures> consecutive timeouts or errors of <n> open its breaker;
 * while open, queries for it fail at once (STORE_BREAKER) instead of queueing
 * behind a sick Redis. After the cool-down one query goes through as a probe:
 * its success closes the breaker, its failure opens it again.
 */
static void breaker_record(struct store_node *n, enum store_status st)
{
	struct store *s = n->s;

	if (st == STORE_OK) {
		if (n->breaker_open)
			LOG(LOG_NOTICE, "redis %s breaker closed", n->name);
		n->failures = 0;
		n->probing = false;
		breaker_set(n, false);
		return;
	}
	if (st != STORE_TIMEOUT && st != STORE_ERROR && st != STORE_DOWN)
		return;
	n->failures++;
	if (n->probing || (!n->breaker_open && n->failures >= s->breaker_failures)) {
		if (!n->breaker_open) {
			s->stats.breaker_opened++;
			LOG(LOG_WARN, "redis %s breaker open after %u consecutive failures", n->name,
			    n->failures);
		}
		breaker_set(n, true);
		n->probing = false;
		n->breaker_until = mono() + s->breaker_cooldown_s;
	}
}

/* May a query be sent to <n> now? Lets one probe through once the cool-down ended. */
static bool breaker_allows(struct store_node *n)
{
	if (!n->breaker_open)
		return true;
	if (n->probing || mono() < n->breaker_until)
		return false;
	n->probing = true;
	return true;
}

/* ---- commands ------------------------------------------------------------ */

/*
 * A new command of <kind>; <qsize> bytes of room for its query (a decision:
 * STORE_QUERY_SIZE, up to its last key), 0 for the others.
 */
static struct store_cmd *cmd_new(struct store *s, enum cmd_kind kind, size_t qsize)
{
	struct store_cmd *c = xcalloc(1, offsetof(struct store_cmd, q) + qsize);

	c->s = s;
	c->kind = kind;
	c->deadline = mono() + s->command_timeout_ms / 1000.;
	list_init(&c->node);
	list_init(&c->park);
	s->stats.pending++;
	return c;
}

/* Frees <c>, which is on no list any more and owed by no hiredis callback. */
static void cmd_free(struct store_cmd *c)
{
	BUG_ON(c->parked);
	c->s->stats.pending--;
	free(c->hkey);
	free(c->hfield);
	free(c);
}

/* True while <c>'s caller has not been answered. */
static bool cmd_live(const struct store_cmd *c)
{
	return c->cb || c->str_cb;
}

/*
 * Arms the command timer for the oldest waiting command's deadline. Stalls are
 * the tick's business.
 */
static void cmd_timer_arm(struct store *s)
{
	double now = mono(), at;

	ev_timer_stop(s->loop, &s->cmd_timer);
	if (s->freeing || list_empty(&s->waiting))
		return;
	at = LIST_ELEM(s->waiting.next, struct store_cmd, node)->deadline;
	ev_timer_set(&s->cmd_timer, at > now ? at - now : 0., 0.);
	ev_timer_start(s->loop, &s->cmd_timer);
}

/*
 * Answers <c>'s caller once (a decision with <r>, a lookup with <val>/<len>);
 * the command itself stays with whoever owns it (hiredis, or the caller of
 * this function for a parked or never-sent one). Invokes user callbacks.
 */
static void cmd_answer_full(struct store_cmd *c, enum store_status st,
			    const struct store_result *r, const char *val, size_t len)
{
	struct store *s = c->s;
	store_done_fn cb = c->cb;
	store_str_fn str_cb = c->str_cb;

	/* the command timer may now be early for the new oldest command: it
	 * finds nothing expired then and re-arms (cheaper than re-arming here on
	 * every reply) */
	list_del(&c->node);
	if (!cmd_live(c))
		return;
	c->cb = NULL;
	c->str_cb = NULL;
	if (st != STORE_OK)
		s->stats.failed[st]++;
	if (c->at)
		breaker_record(c->at, st);
	if (cb)
		cb(st, r, c->arg);
	else
		str_cb(st, val, len, c->arg);
}

static void cmd_answer(struct store_cmd *c, enum store_status st, const struct store_result *r)
{
	cmd_answer_full(c, st, r, NULL, 0);
}

/* Takes <c> off its node's parked list: it is ours to free again. */
static void cmd_unpark(struct store_cmd *c)
{
	if (!c->parked)
		return;
	list_del(&c->park);
	c->parked = false;
}

/* Answers every command parked at <n> with <st> and frees them. Invokes user callbacks. */
static void node_fail_parked(struct store_node *n, enum store_status st)
{
	while (!list_empty(&n->parked)) {
		struct store_cmd *c = LIST_ELEM(n->parked.next, struct store_cmd, park);

		cmd_unpark(c);
		cmd_answer(c, st, NULL);
		cmd_free(c);
	}
}

/* Sends what was parked at <n>, now ready. Invokes user callbacks only on failure. */
static void node_send_parked(struct store_node *n)
{
	while (!list_empty(&n->parked)) {
		struct store_cmd *c = LIST_ELEM(n->parked.next, struct store_cmd, park);

		cmd_unpark(c);
		if (cmd_send(n, c, c->retried) < 0) {
			cmd_answer(c, STORE_DOWN, NULL);
			cmd_free(c);
		}
	}
}

/*
 * Sends <c> to <n> now if it is ready, or parks it there while it connects.
 * Returns 0, or -1 when <n> can take nothing (<c> untouched). Never invokes
 * user callbacks.
 */
static int cmd_dispatch_nocb(struct store_node *n, struct store_cmd *c)
{
	if (n->state == ND_READY)
		return cmd_send(n, c, c->retried);
	if (n->state != ND_CONNECTING && n->state != ND_LOADING)
		return -1;
	c->at = n;
	c->parked = true;
	list_append(&n->parked, &c->park);
	return 0;
}

static void cmd_timer_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct store *s = container_of(t, struct store, cmd_timer);
	double now = mono();

	(void)loop;
	(void)revents;
	while (!list_empty(&s->waiting)) {
		struct store_cmd *c = LIST_ELEM(s->waiting.next, struct store_cmd, node);
		bool parked = c->parked;

		if (c->deadline > now)
			break;
		cmd_unpark(c);
		cmd_answer(c, STORE_TIMEOUT, NULL);
		if (parked)
			cmd_free(c);
	}
	cmd_timer_arm(s);
}

/* Parses the script's flat integer array into <r>. Returns 0 or -1. */
static int parse_result(const redisReply *rep, size_t n, bool batch, struct store_result *r)
{
	size_t i;

	if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 3 + 4 * n + (batch ? 2 : 0))
		return -1;
	for (i = 0; i < rep->elements; i++)
		if (rep->element[i]->type != REDIS_REPLY_INTEGER)
			return -1;
	if ((size_t)rep->element[1]->integer != n)
		return -1;
	r->allowed = rep->element[0]->integer == 1;
	r->n = n;
	r->now_us = rep->element[2]->integer;
	for (i = 0; i < n; i++) {
		redisReply **e = rep->element + 3 + 4 * i;

		r->v[i].allowed = e[0]->integer == 1;
		r->v[i].remaining = e[1]->integer;
		r->v[i].retry_ms = e[2]->integer;
		r->v[i].reset_ms = e[3]->integer;
	}
	r->granted = batch ? rep->element[3 + 4 * n]->integer : (r->allowed ? 1 : 0);
	r->lease_ms = batch ? rep->element[4 + 4 * n]->integer : 0;
	if (r->granted < 0 || r->lease_ms < 0)
		return -1;
	return 0;
}

/* ---- nodes -------------------------------------------------------------- */

/*
 * Fills <ep> from <host> (<hostlen> bytes, not NUL-terminated; brackets
 * allowed) and <port>. An empty host means the node <from>, which we are
 * talking to. Returns 0, or -1 when the host is no numeric address ("?", a
 * name) or the port is out of range.
 */
static int endpoint_make(struct endpoint *ep, const struct store_node *from, const char *host,
			 size_t hostlen, long port)
{
	char buf[INET6_ADDRSTRLEN + 2];
	unsigned char a[sizeof(struct in6_addr)];

	memset(ep, 0, sizeof(*ep));
	if (port < 1 || port > 65535)
		return -1;
	ep->port = (int)port;
	if (!hostlen) {
		if (!from)
			return -1;
		if (from->unix_path) {
			/* a unix seed in a cluster: the node we asked, whatever its port */
			ep->unix_path = from->unix_path;
			return 0;
		}
		snprintf(ep->host, sizeof(ep->host), "%s", from->host);
		return 0;
	}
	if (hostlen > 2 && host[0] == '[' && host[hostlen - 1] == ']') {
		host++;
		hostlen -= 2;
	}
	if (hostlen >= sizeof(buf))
		return -1;
	memcpy(buf, host, hostlen);
	buf[hostlen] = 0;
	if (inet_pton(AF_INET, buf, a) == 1)
		return inet_ntop(AF_INET, a, ep->host, sizeof(ep->host)) ? 0 : -1;
	if (inet_pton(AF_INET6, buf, a) == 1)
		return inet_ntop(AF_INET6, a, ep->host, sizeof(ep->host)) ? 0 : -1;
	return -1;
}

static struct store_node *node_find(struct store *s, const struct endpoint *ep)
{
	struct list *l;

	for (l = s->nodes.next; l != &s->nodes; l = l->next) {
		struct store_node *n = LIST_ELEM(l, struct store_node, link);

		if (ep->unix_path ? n->unix_path && strcmp(n->unix_path, ep->unix_path) == 0
				  : n->host && n->port == ep->port && strcmp(n->host, ep->host) == 0)
			return n;
	}
	return NULL;
}

/* Creates the node for <ep> and starts connecting. Never invokes user callbacks. */
static struct store_node *node_new(struct store *s, const struct endpoint *ep, bool seed)
{
	struct store_node *n = xcalloc(1, sizeof(*n));

	n->s = s;
	n->seed = seed;
	if (ep->unix_path) {
		n->unix_path = xstrdup(ep->unix_path);
		n->name = xasprintf("unix:%s", n->unix_path);
	} else {
		n->host = xstrdup(ep->host);
		n->port = ep->port;
		n->name = xasprintf(strchr(n->host, ':') ? "[%s]:%d" : "%s:%d", n->host, n->port);
	}
	n->backoff_ms = BACKOFF_MIN_MS;
	list_init(&n->parked);
	ev_timer_init(&n->conn_timer, conn_timer_cb, 0., 0.);
	list_append(&s->nodes, &n->link);
	s->stats.nodes++;
	return n;
}

/*
 * The node for <ep>, created (and connecting) if new; NULL when MAX_NODES are
 * known already. A retired node found again is taken back.
 */
static struct store_node *node_get(struct store *s, const struct endpoint *ep)
{
	struct store_node *n = node_find(s, ep);

	if (n) {
		if (n->retired) {
			n->retired = false;
			if (n->state == ND_DISCONNECTED && !ev_is_active(&n->conn_timer))
				node_connect(n);
		}
		return n;
	}
	if (s->stats.nodes >= MAX_NODES) {
		store_log_trouble(s->seed, "topology", "too many nodes, ignoring new ones");
		return NULL;
	}
	n = node_new(s, ep, false);
	node_connect(n);
	return n;
}

/* Routes <slot> to <n> (NULL: nobody), keeping the slot counts right. */
static void slot_set(struct store *s, unsigned slot, struct store_node *n)
{
	struct store_node *old = s->slots[slot];

	if (old == n)
		return;
	if (old)
		old->nslots--;
	else
		s->stats.slots_covered++;
	if (n)
		n->nslots++;
	else
		s->stats.slots_covered--;
	s->slots[slot] = n;
}

/*
 * <n> left the topology: nothing new goes to it; the tick closes it once the
 * replies it owes are in. Parked commands are answered DOWN (user callbacks).
 */
static void node_retire(struct store_node *n)
{
	if (n->seed || n->retired)
		return;
	BUG_ON(n->nslots);
	n->retired = true;
	LOG(LOG_NOTICE, "redis %s left the topology", n->name);
	if (n->state == ND_DISCONNECTED)
		ev_timer_stop(n->s->loop, &n->conn_timer);
	node_fail_parked(n, STORE_DOWN);
}

/*
 * Closes <n>'s connection now: every command out on it is called back with
 * NULL (answered DOWN, or SHUTDOWN when freeing). Must not run inside one of
 * <n>'s own hiredis callbacks (only timers and store_free() call it).
 */
static void node_close(struct store_node *n)
{
	redisAsyncContext *ac = n->ac;

	n->ac = NULL; /* our callbacks ignore this context from now on */
	n->state = ND_DISCONNECTED;
	if (ac)
		redisAsyncFree(ac);
}

/* Frees <n>: idle, off the map, connection closed here. */
static void node_free(struct store_node *n)
{
	struct store *s = n->s;

	BUG_ON(n->nslots || !list_empty(&n->parked));
	ev_timer_stop(s->loop, &n->conn_timer);
	node_close(n);
	if (s->refresh_node == n)
		s->refresh_node = NULL;
	breaker_set(n, false);
	list_del(&n->link);
	s->stats.nodes--;
	free(n->host);
	free(n->unix_path);
	free(n->name);
	free(n);
}

static void node_schedule_reconnect(struct store_node *n)
{
	struct store *s = n->s;
	unsigned cap = BACKOFF_MAX_MS;

	n->state = ND_DISCONNECTED;
	n->ac = NULL;
	ev_timer_stop(s->loop, &n->conn_timer);
	if (s->freeing || n->retired)
		return;
	/* a seed that is no master of the cluster is only a way back in: no hurry */
	if (n->seed && !n->nslots && s->mode == MODE_CLUSTER)
		cap = (unsigned)(REFRESH_EVERY_S * 1000);
	ev_timer_set(&n->conn_timer, n->backoff_ms / 1000., 0.);
	ev_timer_start(s->loop, &n->conn_timer);
	n->backoff_ms *= 2;
	if (n->backoff_ms > cap)
		n->backoff_ms = cap;
}

/*
 * <n>'s connection is gone (or never came): reconnect later, answer what was
 * parked there (user callbacks), and look at the topology again if it owned
 * slots of a cluster.
 */
static void node_lost(struct store_node *n)
{
	struct store *s = n->s;

	node_schedule_reconnect(n);
	if (s->freeing)
		return;
	if (n->nslots && s->mode == MODE_CLUSTER)
		refresh_request(s);
	node_fail_parked(n, STORE_DOWN);
}

/* ---- sending ------------------------------------------------------------- */

/*
 * Sends <c> on <n>'s connection: EVALSHA (or EVAL with the body when <eval>),
 * or HGET; preceded by ASKING after an ASK. Keys and numbers go as separate
 * argv entries: untrusted bytes never meet a format string. Returns 0 or -1.
 * Never invokes user callbacks.
 */
static int cmd_send(struct store_node *n, struct store_cmd *c, bool eval)
{
	struct store *s = n->s;
	const char *argv[3 + STORE_MAX_LIMITS * 6 + 4];
	size_t lens[ARRAY_SIZE(argv)];
	char nums[5 * STORE_MAX_LIMITS + 4][24];
	char nkeys[16];
	size_t i;
	int argc = 0, k = 0, ret;

	if (!n->ac || n->state != ND_READY)
		return -1;
	if (c->asking) {
		const char *asking[1] = {"ASKING"};

		if (redisAsyncCommandArgv(n->ac, NULL, NULL, 1, asking, NULL) != REDIS_OK)
			return -1;
	}
	if (c->kind == CMD_HGET) {
		const char *hget[3] = {"HGET", c->hkey, c->hfield};

		ret = redisAsyncCommandArgv(n->ac, cmd_reply_cb, c, 3, hget, NULL);
		goto sent;
	}
	if (c->kind == CMD_HEARTBEAT) {
		const char *hb[6] = {"EVAL", script_heartbeat, "1", c->hkey, c->hfield, nkeys};
		size_t hbl[6] = {4, script_heartbeat_len, 1, strlen(c->hkey), strlen(c->hfield), 0};

		snprintf(nkeys, sizeof(nkeys), "%u", c->window_ms);
		hbl[5] = strlen(nkeys);
		ret = redisAsyncCommandArgv(n->ac, cmd_reply_cb, c, 6, hb, hbl);
		goto sent;
	}

#define PUSH_NUM(v)                                                                         \
	do {                                                                                \
		snprintf(nums[k], sizeof(nums[k]), "%lld", (long long)(v));                 \
		argv[argc] = nums[k];                                                       \
		lens[argc++] = strlen(nums[k++]);                                           \
	} while (0)

	argv[argc] = eval ? "EVAL" : "EVALSHA";
	lens[argc] = strlen(argv[argc]);
	argc++;
	argv[argc] = eval ? script_ratelimit : s->sha;
	lens[argc] = eval ? script_ratelimit_len : strlen(s->sha);
	argc++;
	snprintf(nkeys, sizeof(nkeys), "%zu", c->q.n);
	argv[argc] = nkeys;
	lens[argc++] = strlen(nkeys);
	for (i = 0; i < c->q.n; i++) {
		argv[argc] = c->q.keys[i];
		lens[argc++] = strlen(c->q.keys[i]);
	}
	for (i = 0; i < c->q.n; i++) {
		PUSH_NUM(c->q.params[i].alg);
		PUSH_NUM(c->q.params[i].a);
		PUSH_NUM(c->q.params[i].b);
		PUSH_NUM(c->q.params[i].shadow ? 1 : 0);
		PUSH_NUM(c->q.cost[i]);
	}
	if (c->q.want > 0) {
		PUSH_NUM(c->q.want);
		PUSH_NUM(c->q.batch);
		PUSH_NUM(c->q.lease_us);
		PUSH_NUM(c->q.min_units > 1 ? c->q.min_units : 1);
	}
#undef PUSH_NUM
	ret = redisAsyncCommandArgv(n->ac, cmd_reply_cb, c, argc, argv, lens);
sent:
	if (ret != REDIS_OK)
		return -1;
	if (!n->out++)
		n->last_progress = mono();
	c->at = n;
	s->stats.sent++;
	return 0;
}

/* ---- replies ------------------------------------------------------------- */

/*
 * Follows the MOVED or ASK error <err> that node <from> sent for the live
 * command <c>. Returns false when <err> is no redirection. Otherwise <c> has
 * been re-sent or parked elsewhere, or answered (ERROR, DOWN) and freed, and
 * true is returned. Invokes user callbacks when it answers.
 */
static bool cmd_redirect(struct store_node *from, struct store_cmd *c, const char *err)
{
	struct store *s = from->s;
	struct store_node *to;
	struct endpoint ep;
	const char *p, *colon;
	char *end;
	unsigned long slot;
	long port;
	bool ask;

	if (strncmp(err, "MOVED ", 6) == 0) {
		ask = false;
		p = err + 6;
	} else if (strncmp(err, "ASK ", 4) == 0) {
		ask = true;
		p = err + 4;
	} else {
		return false;
	}
	LOG(LOG_DEBUG, "redis %s: %s", from->name, err);
	/* the node answered: it is healthy, whatever its slots */
	breaker_record(from, STORE_OK);
	errno = 0;
	slot = strtoul(p, &end, 10);
	if (errno || end == p || *end != ' ' || slot >= CRC16_SLOTS)
		goto bad;
	p = end + 1;
	colon = strrchr(p, ':');
	if (!colon)
		goto bad;
	errno = 0;
	port = strtol(colon + 1, &end, 10);
	if (errno || end == colon + 1 || *end)
		goto bad;
	if (endpoint_make(&ep, from, p, (size_t)(colon - p), port) < 0)
		goto bad;
	if (c->redirects >= MAX_REDIRECTS) {
		store_log_trouble(from, "redirect", "too many redirections");
		goto fail;
	}
	to = node_get(s, &ep);
	if (!to)
		goto fail;
	c->redirects++;
	c->asking = ask;
	if (ask) {
		s->stats.ask++;
	} else {
		s->stats.moved++;
		if (s->mode != MODE_CLUSTER) {
			LOG(LOG_NOTICE, "redis %s sent MOVED: cluster mode", from->name);
			s->mode = MODE_CLUSTER;
			s->stats.cluster = true;
		}
		slot_set(s, (unsigned)slot, to);
		refresh_request(s);
	}
	if (cmd_dispatch_nocb(to, c) == 0)
		return true;
	c->at = to; /* its breaker, not the one of the node that redirected */
	cmd_answer(c, STORE_DOWN, NULL);
	cmd_free(c);
	return true;
bad:
	store_log_trouble(from, "redirect", err);
fail:
	cmd_answer(c, STORE_ERROR, NULL);
	cmd_free(c);
	return true;
}

static void cmd_reply_cb(redisAsyncContext *ac, void *reply, void *privdata)
{
	struct store_cmd *c = privdata;
	struct store_node *n = ac->data;
	struct store *s = n->s;
	redisReply *rep = reply;
	struct store_result res;

	n->out--;
	if (rep)
		n->last_progress = mono();
	if (!cmd_live(c)) {
		/* the caller was answered already (deadline or shutdown) */
		if (rep)
			s->stats.late++;
		cmd_free(c);
		return;
	}
	if (!rep) {
		/* connection lost or context freed */
		cmd_answer(c, s->freeing ? STORE_SHUTDOWN : STORE_DOWN, NULL);
		cmd_free(c);
		return;
	}
	if (rep->type == REDIS_REPLY_ERROR) {
		if (cmd_redirect(n, c, rep->str))
			return;
		if (c->kind == CMD_DECIDE && strncmp(rep->str, "NOSCRIPT", 8) == 0 && !c->retried) {
			s->stats.noscript++;
			c->retried = true;
			if (cmd_send(n, c, true) == 0)
				return; /* same deadline, still waiting */
		}
		if (strncmp(rep->str, "CLUSTERDOWN", 11) == 0 && s->mode == MODE_CLUSTER)
			refresh_request(s);
		store_log_trouble(n, c->kind == CMD_DECIDE ? "script error" : "lookup", rep->str);
		cmd_answer(c, STORE_ERROR, NULL);
	} else if (c->kind == CMD_HEARTBEAT) {
		char num[24];

		if (rep->type == REDIS_REPLY_INTEGER) {
			s->stats.replies++;
			snprintf(num, sizeof(num), "%lld", (long long)rep->integer);
			cmd_answer_full(c, STORE_OK, NULL, num, strlen(num));
		} else {
			store_log_trouble(n, "heartbeat", "bad reply");
			cmd_answer(c, STORE_ERROR, NULL);
		}
	} else if (c->kind == CMD_HGET) {
		if (rep->type == REDIS_REPLY_STRING) {
			s->stats.replies++;
			cmd_answer_full(c, STORE_OK, NULL, rep->str, rep->len);
		} else if (rep->type == REDIS_REPLY_NIL) {
			s->stats.replies++;
			cmd_answer_full(c, STORE_OK, NULL, NULL, 0);
		} else {
			store_log_trouble(n, "lookup", "bad reply");
			cmd_answer(c, STORE_ERROR, NULL);
		}
	} else if (parse_result(rep, c->q.n, c->q.want > 0, &res) < 0) {
		store_log_trouble(n, "reply", "unexpected reply shape");
		cmd_answer(c, STORE_ERROR, NULL);
	} else {
		s->stats.replies++;
		cmd_answer(c, STORE_OK, &res);
	}
	cmd_free(c);
}

/* ---- topology ------------------------------------------------------------ */

/* One CLUSTER SLOTS entry: { start, end, { host, port, ... }, replicas... }. */
static bool slots_entry_ok(const redisReply *e)
{
	const redisReply *m;

	if (e->type != REDIS_REPLY_ARRAY || e->elements < 3 ||
	    e->element[0]->type != REDIS_REPLY_INTEGER ||
	    e->element[1]->type != REDIS_REPLY_INTEGER)
		return false;
	if (e->element[0]->integer < 0 || e->element[1]->integer >= CRC16_SLOTS ||
	    e->element[0]->integer > e->element[1]->integer)
		return false;
	m = e->element[2];
	if (m->type != REDIS_REPLY_ARRAY || m->elements < 2)
		return false;
	if (m->element[0]->type != REDIS_REPLY_STRING && m->element[0]->type != REDIS_REPLY_NIL)
		return false;
	return m->element[1]->type == REDIS_REPLY_INTEGER;
}

/*
 * Makes the CLUSTER SLOTS array <rep> from node <src> the slot map: masters
 * only, new ones connected, those no longer in it retired. A malformed reply
 * changes nothing. Invokes user callbacks (commands parked at retired nodes).
 */
static void topology_apply(struct store *s, struct store_node *src, const redisReply *rep)
{
	unsigned masters = 0, changed = 0, i;
	struct list *l, *tmp;
	size_t k;

	for (k = 0; k < rep->elements; k++) {
		if (!slots_entry_ok(rep->element[k])) {
			store_log_trouble(src, "CLUSTER SLOTS", "unexpected reply shape");
			return;
		}
	}
	for (l = s->nodes.next; l != &s->nodes; l = l->next)
		LIST_ELEM(l, struct store_node, link)->mark = false;
	memset(s->scratch, 0, CRC16_SLOTS * sizeof(*s->scratch));
	for (k = 0; k < rep->elements; k++) {
		const redisReply *e = rep->element[k], *m = e->element[2];
		bool str = m->element[0]->type == REDIS_REPLY_STRING;
		struct store_node *n;
		struct endpoint ep;
		long long slot;

		/* NULL or "": the node we asked (unknown or own endpoint) */
		if (endpoint_make(&ep, src, str ? m->element[0]->str : "", str ? m->element[0]->len : 0,
				  (long)m->element[1]->integer) < 0) {
			store_log_trouble(src, "CLUSTER SLOTS",
					  "a master has no numeric address: its slots are left out");
			continue;
		}
		n = node_get(s, &ep);
		if (!n)
			continue;
		if (!n->mark)
			masters++;
		n->mark = true;
		for (slot = e->element[0]->integer; slot <= e->element[1]->integer; slot++)
			s->scratch[slot] = n;
	}
	for (i = 0; i < CRC16_SLOTS; i++) {
		if (s->slots[i] != s->scratch[i]) {
			changed++;
			slot_set(s, i, s->scratch[i]);
		}
	}
	if (s->mode != MODE_CLUSTER)
		LOG(LOG_NOTICE, "redis %s: cluster mode", src->name);
	s->mode = MODE_CLUSTER;
	s->stats.cluster = true;
	if (changed) {
		s->stats.topology_changes++;
		LOG(LOG_NOTICE, "redis cluster: %u masters, %u/%u slots covered, %u slots changed owner",
		    masters, s->stats.slots_covered, CRC16_SLOTS, changed);
	}
	list_for_each_safe(l, tmp, &s->nodes) {
		struct store_node *n = LIST_ELEM(l, struct store_node, link);

		if (!n->mark && !n->nslots)
			node_retire(n);
	}
}

/*
 * <src> answered CLUSTER SLOTS with an error: from the seed, that is a single
 * Redis: every slot goes to it, every other node is retired.
 */
static void topology_single(struct store *s, struct store_node *src, const char *why)
{
	struct list *l, *tmp;
	unsigned i;

	if (src != s->seed) {
		store_log_trouble(src, "CLUSTER SLOTS", why);
		return;
	}
	for (i = 0; i < CRC16_SLOTS; i++)
		slot_set(s, i, s->seed);
	if (s->mode != MODE_SINGLE)
		LOG(LOG_NOTICE, "redis %s: single Redis (%s)", src->name, why);
	s->mode = MODE_SINGLE;
	s->stats.cluster = false;
	list_for_each_safe(l, tmp, &s->nodes) {
		struct store_node *n = LIST_ELEM(l, struct store_node, link);

		if (!n->nslots)
			node_retire(n);
	}
}

static void slots_reply_cb(redisAsyncContext *ac, void *reply, void *privdata)
{
	struct store_node *n = ac->data;
	struct store *s = n->s;
	redisReply *rep = reply;

	(void)privdata;
	if (s->refresh_node != n || s->freeing)
		return; /* expired (another one may be out) or shutting down */
	s->refresh_node = NULL;
	if (!rep) {
		s->refresh_wanted = true;
	} else if (rep->type == REDIS_REPLY_ARRAY) {
		topology_apply(s, n, rep);
	} else if (rep->type == REDIS_REPLY_ERROR) {
		/* "ERR This instance has cluster support disabled"; any other error
		 * (no permission, renamed command) before we know: a single Redis
		 * too, and a MOVED would still switch us to cluster mode */
		if (strstr(rep->str, "cluster support disabled") || s->mode == MODE_UNKNOWN)
			topology_single(s, n, rep->str);
		else
			store_log_trouble(n, "CLUSTER SLOTS", rep->str);
	} else {
		store_log_trouble(n, "CLUSTER SLOTS", "unexpected reply");
		s->refresh_wanted = s->mode == MODE_UNKNOWN;
	}
}

/* Where to send CLUSTER SLOTS: a ready node, healthy masters first, rotating. */
static struct store_node *refresh_pick(struct store *s)
{
	struct store_node *best = NULL;
	unsigned i = 0, start = s->refresh_rr++ % (s->stats.nodes ? s->stats.nodes : 1);
	int best_rank = -1;
	struct list *l;

	for (l = s->nodes.next; l != &s->nodes; l = l->next, i++) {
		struct store_node *n = LIST_ELEM(l, struct store_node, link);
		int rank;

		if (n->state != ND_READY || !n->ac)
			continue;
		rank = (n->breaker_open ? 0 : 4) + (n->nslots ? 2 : 0) + (i >= start ? 1 : 0);
		if (rank > best_rank) {
			best = n;
			best_rank = rank;
		}
	}
	return best;
}

/* Sends the CLUSTER SLOTS that is due, if one may go now. Never invokes user callbacks. */
static void refresh_kick(struct store *s)
{
	const char *argv[2] = {"CLUSTER", "SLOTS"};
	double now = mono();
	struct store_node *n;

	if (!s->refresh_wanted || s->refresh_node || s->freeing ||
	    now - s->refresh_last < REFRESH_MIN_S)
		return; /* the tick or the next ready node comes back to it */
	n = refresh_pick(s);
	if (!n || redisAsyncCommandArgv(n->ac, slots_reply_cb, NULL, 2, argv, NULL) != REDIS_OK)
		return;
	s->refresh_wanted = false;
	s->refresh_node = n;
	s->refresh_last = now;
	s->stats.refreshes++;
}

static void refresh_request(struct store *s)
{
	s->refresh_wanted = true;
	refresh_kick(s);
}

/* ---- connections --------------------------------------------------------- */

static void load_reply_cb(redisAsyncContext *ac, void *reply, void *privdata)
{
	struct store_node *n = ac->data;
	struct store *s = n->s;
	redisReply *rep = reply;

	(void)privdata;
	if (!rep || n->ac != ac)
		return;
	if (rep->type != REDIS_REPLY_STRING || rep->len != 40) {
		store_log_trouble(n, "SCRIPT LOAD", rep->type == REDIS_REPLY_ERROR ? rep->str
										: "bad reply");
		redisAsyncDisconnect(ac);
		return;
	}
	memcpy(s->sha, rep->str, 40);
	s->sha[40] = 0;
	ev_timer_stop(s->loop, &n->conn_timer);
	n->state = ND_READY;
	n->last_progress = mono();
	/* a new connection earns a probe at once rather than after the cool-down */
	n->breaker_until = 0;
	n->backoff_ms = BACKOFF_MIN_MS;
	s->stats.connects++;
	LOG(LOG_NOTICE, "redis %s connected, script %s", n->name, s->sha);
	/* the seed of a single (or unknown) Redis: is it a cluster now? */
	if (n->seed && s->mode != MODE_CLUSTER)
		refresh_request(s);
	else
		refresh_kick(s); /* one may have waited for a ready node */
	node_send_parked(n);
}

static void auth_reply_cb(redisAsyncContext *ac, void *reply, void *privdata)
{
	struct store_node *n = ac->data;
	redisReply *rep = reply;

	(void)privdata;
	if (rep && rep->type == REDIS_REPLY_ERROR && n->ac == ac) {
		store_log_trouble(n, "AUTH", rep->str);
		redisAsyncDisconnect(ac);
	}
}

static void connect_cb(const redisAsyncContext *cac, int status)
{
	redisAsyncContext *ac = (redisAsyncContext *)cac;
	struct store_node *n = ac->data;
	struct store *s = n->s;

	if (n->ac != ac)
		return;
	if (status != REDIS_OK) {
		/* hiredis frees the context after this callback */
		store_log_trouble(n, "connect", ac->errstr);
		node_lost(n);
		return;
	}
	/* the connect deadline keeps running: it covers AUTH and SCRIPT LOAD too */
	n->state = ND_LOADING;
	if (n->host)
		(void)redisEnableKeepAlive(&ac->c); /* TCP only: unix sockets refuse it */
	if (s->password) {
		const char *argv[3] = {"AUTH", s->user ? s->user : s->password, s->password};
		int argc = s->user ? 3 : 2;

		redisAsyncCommandArgv(ac, auth_reply_cb, NULL, argc, argv, NULL);
	}
	{
		const char *argv[3] = {"SCRIPT", "LOAD", script_ratelimit};
		size_t lens[3] = {6, 4, script_ratelimit_len};

		redisAsyncCommandArgv(ac, load_reply_cb, NULL, 3, argv, lens);
	}
}

static void disconnect_cb(const redisAsyncContext *cac, int status)
{
	struct store_node *n = cac->data;

	if (n->ac != cac)
		return;
	if (status != REDIS_OK)
		store_log_trouble(n, "connection lost", cac->errstr);
	/* hiredis frees the context after this callback; pending commands were
	 * already called back with a NULL reply */
	node_lost(n);
}

static void conn_timer_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct store_node *n = container_of(t, struct store_node, conn_timer);

	(void)loop;
	(void)revents;
	if (n->state == ND_CONNECTING || n->state == ND_LOADING) {
		store_log_trouble(n, "connect", "timed out");
		node_close(n);
		node_lost(n);
		return;
	}
	if (n->state == ND_DISCONNECTED && !n->retired)
		node_connect(n);
}

/* Starts connecting <n>; failures end in node_lost() (which may call users back). */
static void node_connect(struct store_node *n)
{
	struct store *s = n->s;
	redisAsyncContext *ac;

	ac = n->unix_path ? redisAsyncConnectUnix(n->unix_path) : redisAsyncConnect(n->host, n->port);
	if (!ac) {
		node_lost(n);
		return;
	}
	if (ac->err) {
		store_log_trouble(n, "connect", ac->errstr);
		redisAsyncFree(ac);
		node_lost(n);
		return;
	}
	ac->data = n;
	n->ac = ac;
	n->state = ND_CONNECTING;
	redisLibevAttach(s->loop, ac);
	redisAsyncSetConnectCallback(ac, connect_cb);
	redisAsyncSetDisconnectCallback(ac, disconnect_cb);
	/* the deadline covers connect + AUTH + SCRIPT LOAD */
	ev_timer_stop(s->loop, &n->conn_timer);
	ev_timer_set(&n->conn_timer, s->connect_timeout_ms / 1000., 0.);
	ev_timer_start(s->loop, &n->conn_timer);
}

/*
 * Housekeeping: a node with commands out and no reply for stall_s is alive
 * for TCP but not answering (frozen, partitioned): drop its connection, its
 * waiters are answered DOWN at once, reconnection starts. Retired nodes are
 * closed once idle. Refreshes that are due or lost are (re)sent.
 */
static void tick_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct store *s = container_of(t, struct store, tick);
	double now = mono(), every;
	struct list *l, *tmp;

	(void)loop;
	(void)revents;
	list_for_each_safe(l, tmp, &s->nodes) {
		struct store_node *n = LIST_ELEM(l, struct store_node, link);

		if (n->ac && n->state == ND_READY && n->out && now - n->last_progress >= s->stall_s) {
			store_log_trouble(n, "stalled", "no reply in time, reconnecting");
			node_close(n);
			node_lost(n);
		}
		if (n->retired && !n->out && list_empty(&n->parked) && s->refresh_node != n)
			node_free(n);
	}
	if (s->refresh_node && now - s->refresh_last >= REFRESH_TIMEOUT_S) {
		s->refresh_node = NULL; /* its late answer is ignored */
		s->refresh_wanted = true;
	}
	every = s->stats.slots_covered < CRC16_SLOTS ? REFRESH_HOLE_S : REFRESH_EVERY_S;
	if (s->mode == MODE_CLUSTER && now - s->refresh_last >= every)
		s->refresh_wanted = true;
	refresh_kick(s);
}

/* ---- API ----------------------------------------------------------------- */

/*
 * The node a new query for <slot> goes to, or NULL with the reason in <st>:
 * no ready owner (DOWN), saturated (BUSY), breaker open (BREAKER).
 */
static struct store_node *store_admit(struct store *s, unsigned slot, enum store_status *st)
{
	struct store_node *n = s->slots[slot];

	if (s->freeing) {
		*st = STORE_SHUTDOWN;
		return NULL;
	}
	if (!n || n->state != ND_READY) {
		*st = STORE_DOWN;
		return NULL;
	}
	if (s->stats.pending >= s->max_pending) {
		*st = STORE_BUSY;
		return NULL;
	}
	if (!breaker_allows(n)) {
		*st = STORE_BREAKER;
		return NULL;
	}
	return n;
}

/* Sends the new command <c> to <n> and starts its deadline. Returns 0 or -STORE_DOWN. */
static int store_submit(struct store_node *n, struct store_cmd *c)
{
	struct store *s = n->s;

	if (cmd_send(n, c, false) < 0) {
		n->probing = false;
		cmd_free(c);
		s->stats.failed[STORE_DOWN]++;
		return -STORE_DOWN;
	}
	/* the timer follows the oldest waiting command: arm it when this one is
	 * the only one */
	list_append(&s->waiting, &c->node);
	if (s->waiting.next == &c->node)
		cmd_timer_arm(s);
	return 0;
}

/*
 * Submits the decision <q> to the owner of the slot of its first key (all its
 * keys must share one hash tag). Returns 0 when <cb> will be called exactly
 * once later, or the negated store_status when the query fails at once (the
 * store or that node is down, saturated, or its breaker is open) and <cb> will
 * never be called. <q> is copied. Never calls <cb> synchronously.
 */
int store_decide(struct store *s, const struct store_query *q, store_done_fn cb, void *arg)
{
	enum store_status st;
	struct store_node *n;
	struct store_cmd *c;

	n = store_admit(s, crc16_key_slot(q->keys[0], strnlen(q->keys[0], STORE_KEY_MAX)), &st);
	if (!n) {
		s->stats.failed[st]++;
		return -(int)st;
	}
	BUG_ON(q->n < 1 || q->n > STORE_MAX_LIMITS);
	c = cmd_new(s, CMD_DECIDE, STORE_QUERY_SIZE(q));
	c->cb = cb;
	c->arg = arg;
	memcpy(&c->q, q, STORE_QUERY_SIZE(q));
	return store_submit(n, c);
}

/* Submits a command of <kind> on <key> and <field> answered with a string (see store_hget()). */
static int submit_str(struct store *s, enum cmd_kind kind, const char *key, const char *field,
		      unsigned window_ms, store_str_fn cb, void *arg)
{
	enum store_status st;
	struct store_node *n;
	struct store_cmd *c;

	n = store_admit(s, crc16_key_slot(key, strlen(key)), &st);
	if (!n) {
		s->stats.failed[st]++;
		return -(int)st;
	}
	c = cmd_new(s, kind, 0);
	c->str_cb = cb;
	c->arg = arg;
	c->hkey = xstrdup(key);
	c->hfield = xstrdup(field);
	c->window_ms = window_ms;
	return store_submit(n, c);
}

/*
 * Looks up <field> of the hash <key> (HGET) on the owner of <key>'s slot. Same
 * contract as store_decide(): 0 and exactly one later call of <cb>, or a
 * negative store_status at once. <key> and <field> are copied.
 */
int store_hget(struct store *s, const char *key, const char *field, store_str_fn cb, void *arg)
{
	return submit_str(s, CMD_HGET, key, field, 0, cb, arg);
}

/*
 * Runs the gateway heartbeat (lua/heartbeat.lua) for agent <id> on the owner of
 * <key>: <cb> gets the number of live agents as a decimal string. Same
 * contract as store_hget().
 */
int store_heartbeat(struct store *s, const char *key, const char *id, unsigned window_ms,
		    store_str_fn cb, void *arg)
{
	return submit_str(s, CMD_HEARTBEAT, key, id, window_ms, cb, arg);
}

/* True when the mode is known and some node owning slots is ready. */
bool store_ready(const struct store *s)
{
	const struct list *l;

	if (s->mode == MODE_UNKNOWN)
		return false;
	for (l = s->nodes.next; l != &s->nodes; l = l->next) {
		const struct store_node *n = LIST_ELEM(l, struct store_node, link);

		if (n->state == ND_READY && n->nslots)
			return true;
	}
	return false;
}

/*
 * True when a query for <key> would be sent now as far as its node goes: the
 * owner of its slot is ready and its breaker closed (in a cluster, one master
 * down or tripped says nothing about the others). Invokes nothing.
 */
bool store_key_ready(const struct store *s, const char *key)
{
	const struct store_node *n = s->slots[crc16_key_slot(key, strnlen(key, STORE_KEY_MAX))];

	return n && n->state == ND_READY && !n->breaker_open && !s->freeing;
}

const struct store_stats *store_stats(const struct store *s)
{
	return &s->stats;
}

/* Reads the seed address "ip:port", "[ip6]:port" or "unix:/path" into <ep>. */
static int seed_endpoint(const char *addr, struct endpoint *ep, char *err, size_t errlen)
{
	const char *colon;
	char *end;
	long port;

	memset(ep, 0, sizeof(*ep));
	if (strncmp(addr, "unix:", 5) == 0) {
		if (!addr[5]) {
			snprintf(err, errlen, "redis address '%s': empty path", addr);
			return -1;
		}
		ep->unix_path = addr + 5;
		return 0;
	}
	colon = strrchr(addr, ':');
	if (!colon || colon == addr) {
		snprintf(err, errlen, "redis address '%s': expected ip:port or unix:/path", addr);
		return -1;
	}
	errno = 0;
	port = strtol(colon + 1, &end, 10);
	if (errno || *end || port < 1 || port > 65535) {
		snprintf(err, errlen, "redis address '%s': bad port", addr);
		return -1;
	}
	/* hiredis 0.14.1 resolves names with a blocking getaddrinfo() on every
	 * connect: only numeric addresses keep the loop from ever blocking */
	if (endpoint_make(ep, NULL, addr, (size_t)(colon - addr), port) < 0) {
		snprintf(err, errlen,
			 "redis address '%s': use a numeric IP address or unix:/path "
			 "(names would block the event loop)",
			 addr);
		return -1;
	}
	return 0;
}

/*
 * Creates a store for <opts> on <loop> and starts connecting to the seed
 * (asynchronously). Returns 0 with <*out> set, or -1 with a message in <err>.
 */
int store_new(struct ev_loop *loop, const struct store_opts *opts, struct store **out,
	      char *err, size_t errlen)
{
	struct endpoint ep;
	struct store *s;

	if (seed_endpoint(opts->address, &ep, err, errlen) < 0)
		return -1;
	s = xcalloc(1, sizeof(*s));
	s->loop = loop;
	s->user = opts->user && *opts->user ? xstrdup(opts->user) : NULL;
	s->password = opts->password && *opts->password ? xstrdup(opts->password) : NULL;
	s->connect_timeout_ms = opts->connect_timeout_ms ? opts->connect_timeout_ms : 200;
	s->command_timeout_ms = opts->command_timeout_ms ? opts->command_timeout_ms : 5;
	s->max_pending = opts->max_pending ? opts->max_pending : 10000;
	s->breaker_failures = opts->breaker_failures ? opts->breaker_failures : 5;
	s->breaker_cooldown_s = (opts->breaker_cooldown_ms ? opts->breaker_cooldown_ms : 500) / 1000.;
	/* a stall is 20 command timeouts, at least 1 s and at most 5 s */
	s->stall_s = s->command_timeout_ms * 20 / 1000.;
	if (s->stall_s < 1.)
		s->stall_s = 1.;
	if (s->stall_s > 5.)
		s->stall_s = 5.;
	list_init(&s->nodes);
	list_init(&s->waiting);
	s->slots = xcalloc(CRC16_SLOTS, sizeof(*s->slots));
	s->scratch = xcalloc(CRC16_SLOTS, sizeof(*s->scratch));
	ev_timer_init(&s->cmd_timer, cmd_timer_cb, 0., 0.);
	ev_timer_init(&s->tick, tick_cb, TICK_S, TICK_S);
	ev_timer_start(loop, &s->tick);
	s->seed = node_new(s, &ep, true);
	node_connect(s->seed);
	*out = s;
	return 0;
}

/*
 * Frees <s>. Every accepted query still waiting is answered STORE_SHUTDOWN
 * before this returns (user callbacks run from here).
 */
void store_free(struct store *s)
{
	struct list *l, *tmp;
	unsigned i;

	if (!s)
		return;
	s->freeing = true;
	ev_timer_stop(s->loop, &s->cmd_timer);
	ev_timer_stop(s->loop, &s->tick);
	/* calls every pending reply callback with NULL, answering waiters */
	for (l = s->nodes.next; l != &s->nodes; l = l->next) {
		struct store_node *n = LIST_ELEM(l, struct store_node, link);

		ev_timer_stop(s->loop, &n->conn_timer);
		node_close(n);
	}
	for (l = s->nodes.next; l != &s->nodes; l = l->next)
		node_fail_parked(LIST_ELEM(l, struct store_node, link), STORE_SHUTDOWN);
	while (!list_empty(&s->waiting))
		cmd_answer(LIST_ELEM(s->waiting.next, struct store_cmd, node), STORE_SHUTDOWN, NULL);
	for (i = 0; i < CRC16_SLOTS; i++)
		slot_set(s, i, NULL);
	list_for_each_safe(l, tmp, &s->nodes)
		node_free(LIST_ELEM(l, struct store_node, link));
	free(s->slots);
	free(s->scratch);
	free(s->user);
	free(s->password);
	free(s);
}
