/* SPDX-License-Identifier: MIT */
/*
 * Redis store, the node layer (see the LAYERS and the DESIGN in store.c): one
 * Redis.
 *  - Its connection: connect with our own deadline, AUTH, ROLE and SCRIPT LOAD
 *    pipelined, reconnection with a capped backoff, node addresses, names
 *    resolved on the loop, a master located by the Sentinels.
 *  - Its health: the circuit breaker, error replies by class, the adaptive
 *    concurrency limit.
 * Calls the transport (rconn.c), resolve.c and sentinel.c; the layers above
 * hear of a node through struct node_ops (store_node.h).
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "reply_parse.h"
#include "resolve.h"
#include "scripts.h"
#include "sentinel.h"
#include "store_node.h"
#include "store_reply.h"
#include "tls.h"
#include "util.h"

static void conn_timer_cb(struct ev_loop *loop, ev_timer *t, int revents);
static void breaker_conn_failed(struct store_node *n, const char *why);

/* Logs trouble with node <n> at most once a second, counting what was dropped. */
void store_log_trouble(struct store_node *n, const char *what, const char *detail)
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

/*
 * Where <n> is, for a message: "10.0.0.5:6379", "redis.example:6379 (10.0.0.5)",
 * "master mymaster at 10.0.0.5:6379", "unix:/path".
 */
static const char *node_where(const struct store_node *n, char *buf, size_t len)
{
	if (n->sentineled && n->addr[0])
		snprintf(buf, len, strchr(n->addr, ':') ? "%s at [%s]:%d" : "%s at %s:%d", n->name,
			 n->addr, n->dial_port);
	else if (n->named && n->addr[0])
		snprintf(buf, len, "%s (%s)", n->name, n->addr);
	else
		snprintf(buf, len, "%s", n->name);
	return buf;
}

/*
 * <n> is down: a connect failed (refused, timed out, TLS, AUTH, no script) or
 * its connection was lost. <fmt> says why in words, for the operator: it is
 * logged (at most once a second), kept for the status (store_health(),
 * store_node_stats()) until a connection is ready again, and counted once
 * for the breaker. The time it went down is the first failure's.
 */
void node_down(struct store_node *n, const char *fmt, ...)
{
	va_list ap;

	if (n->down_told)
		return;
	n->down_told = true;
	va_start(ap, fmt);
	vsnprintf(n->down_why, sizeof(n->down_why), fmt, ap);
	va_end(ap);
	if (!n->down_at) {
		n->down_at = ev_time();
		n->log_last = 0; /* the first failure is always logged */
	}
	store_log_trouble(n, "down", n->down_why);
	breaker_conn_failed(n, n->down_why);
}

/* <n> is up again (its connection ready): no longer down. */
static void node_up(struct store_node *n)
{
	if (n->down_at) {
		LOG(LOG_NOTICE, "redis %s up again after %.1f s down", n->name,
		    ev_time() - n->down_at);
		n->down_at = 0;
		n->down_why[0] = 0;
	}
	/* a connection made is a success of the node, unless a probe must say so */
	if (!n->breaker_open)
		n->failures = 0;
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

/* Opens <n>'s breaker now (or again) for a cool-down, logging <why>. */
static void breaker_open_now(struct store_node *n, const char *why)
{
	struct store *s = n->s;

	if (!n->breaker_open) {
		s->stats.breaker_opened++;
		LOG(LOG_WARN, "redis %s breaker open: %s", n->name, why);
	}
	breaker_set(n, true);
	n->probing = false;
	n->breaker_until = mono() + s->breaker_cooldown_s;
}

/*
 * Records the outcome <st> of a query sent to <n>. Only Redis failures count:
 * <breaker_failures> consecutive error replies or connection losses open the
 * breaker; while open, queries for it fail at once (STORE_BREAKER) instead of
 * going to a sick Redis. A missed deadline (TIMEOUT) or a shed query
 * (OVERLOAD) says the node is slow or we are busy, not that it is broken: it
 * neither counts nor resets, except for the probe of an open breaker, which
 * must be answered in time. After the cool-down one query goes through as a
 * probe: its success closes the breaker, its failure opens it again.
 */
void breaker_record(struct store_node *n, enum store_status st)
{
	struct store *s = n->s;
	char why[64];

	if (st == STORE_OK) {
		if (n->breaker_open)
			LOG(LOG_NOTICE, "redis %s breaker closed", n->name);
		n->failures = 0;
		n->probing = false;
		breaker_set(n, false);
		return;
	}
	if (n->probing && (st == STORE_TIMEOUT || st == STORE_ERROR || st == STORE_DOWN)) {
		breaker_open_now(n, "probe failed");
		return;
	}
	if (n->probing) {
		/* the probe was not tried (shed): another one may go */
		n->probing = false;
		return;
	}
	/* a connection lost is one failure of the node, counted once by
	 * node_down(), not once per command that was out on it */
	if (st != STORE_ERROR)
		return;
	n->failures++;
	if (!n->breaker_open && n->failures >= s->breaker_failures) {
		snprintf(why, sizeof(why), "%u consecutive failures", n->failures);
		breaker_open_now(n, why);
	}
}

/*
 * A connection to <n> failed or was lost (node_down()): one Redis failure,
 * whatever the number of commands that were out on it, counted like an error
 * reply. A Redis that refuses or drops connections is broken: after
 * <breaker_failures> of them in a row (about a second of reconnects with the
 * backoff) the breaker opens, so the breaker and its alert say "Redis is
 * failing" whatever the way; and once a connection is made again, one probe
 * decision must succeed before the others follow it.
 */
static void breaker_conn_failed(struct store_node *n, const char *why)
{
	struct store *s = n->s;
	char buf[STORE_TROUBLE + 40];

	if (n->probing) {
		breaker_open_now(n, "probe failed");
		return;
	}
	n->failures++;
	if (!n->breaker_open && n->failures >= s->breaker_failures) {
		snprintf(buf, sizeof(buf), "%u consecutive failures, the last: %s", n->failures,
			 why);
		breaker_open_now(n, buf);
	}
}

/*
 * <n> stopped answering (a stall): open its breaker at once, whatever the
 * count of failures; its connection is being dropped.
 */
void breaker_trip(struct store_node *n, const char *why)
{
	n->failures++;
	breaker_open_now(n, why);
}

/* May a query be sent to <n> now? Lets one probe through once the cool-down ended. */
bool breaker_allows(struct store_node *n)
{
	if (!n->breaker_open)
		return true;
	if (n->probing || mono() < n->breaker_until)
		return false;
	n->probing = true;
	return true;
}

/* True when <err> starts with the error code <word> (then a space or its end). */
static bool error_is(const char *err, const char *word)
{
	size_t l = strlen(word);

	return strncmp(err, word, l) == 0 && (err[l] == ' ' || !err[l]);
}

/*
 * The class of the Redis error reply <err>: its code, or for an "ERR" the
 * code of the error a script ran into (older Redis: "ERR Error running
 * script ...: -OOM command not allowed ...").
 */
enum store_errclass error_class(const char *err)
{
	static const struct {
		const char *word;
		enum store_errclass ec;
	} words[] = {
		{"OOM", STORE_EC_OOM},           {"BUSY", STORE_EC_BUSY},
		{"LOADING", STORE_EC_LOADING},   {"READONLY", STORE_EC_READONLY},
		{"MASTERDOWN", STORE_EC_READONLY},
	};
	const char *inner = error_is(err, "ERR") ? strstr(err, " -") : NULL;
	size_t i;

	for (i = 0; i < ARRAY_SIZE(words); i++)
		if (error_is(err, words[i].word) || (inner && error_is(inner + 2, words[i].word)))
			return words[i].ec;
	return STORE_EC_OTHER;
}

/* Counts an error reply (or a reply of the wrong shape) of class <ec> from <n>. */
void node_error(struct store_node *n, enum store_errclass ec)
{
	n->s->stats.errors[ec]++;
	n->errors[ec]++;
	n->err_class = (int)ec;
	n->err_at = mono();
	/* a READONLY outside a cluster: this is a replica now (a master demoted by a
	 * failover, a moved name); a new connection finds the master again */
	if (ec == STORE_EC_READONLY && n->s->mode != MODE_CLUSTER && n->rc &&
	    (n->sentineled || n->named)) {
		store_log_trouble(n, "READONLY", "no longer the master, reconnecting");
		rconn_disconnect(n->rc); /* safe inside its callbacks */
	}
}

/* ---- overload: adaptive concurrency limit (per node) -------------------- */

/*
 * Each node has a limit on the commands out on its connection (sent, reply
 * still owed, late ones included: they still keep Redis busy). It follows the
 * wait of replies (from the send to the reply, less the time this agent spent
 * in its own loop turns meanwhile: see "Loop turns" in store_cmd.c), AIMD style:
 *  - a reply within max(2 x the lowest latency seen, budget / 8), while at
 *    least half the limit is in use, raises the limit: by one per reply
 *    during slow start (doubling per round trip), by 1/limit once congestion
 *    was seen (one per round trip);
 *  - a wait longer than half the budget (a "late" reply), or a command whose
 *    deadline passed after such a wait, cuts it by LIMIT_DECREASE, at most
 *    once per budget (one congestion event, one cut);
 *  - in between it holds.
 * The budget is what decisions get for their reply (reply_budget()): HAProxy's
 * share when spoe_timeout is known, else the command timeout; "late" thus
 * means the same thing as the deadlines decisions are answered by.
 * It stays within [limit_floor(), max_concurrency] and starts at LIMIT_INITIAL
 * (256: all of the default max_concurrency), not at its floor: a fresh agent
 * taking a full load at once (a restart in a busy fleet) must not shed what
 * Redis could decide before it has seen Redis late once. The lowest latency is
 * re-learnt every RTT_WINDOW_S (Redis may have moved).
 */

/* Sets <n>'s limit to <v>, keeping the published sum right (0 when <n> goes away). */
static void limit_set(struct store_node *n, double v)
{
	struct store *s = n->s;

	s->stats.concurrency_limit -= (uint64_t)n->limit;
	n->limit = v;
	s->stats.concurrency_limit += (uint64_t)n->limit;
}

/* Starts <n>'s limit afresh: the initial value, slow start, no latency known. */
static void limit_reset(struct store_node *n)
{
	limit_set(n, LIMIT_INITIAL < n->s->max_concurrency ? LIMIT_INITIAL : n->s->max_concurrency);
	n->slow_start = true;
	n->rtt_min = n->rtt_min_next = 0;
	n->rtt_window_end = mono() + RTT_WINDOW_S;
}

/*
 * The lowest a limit goes: LIMIT_MIN, or one full script call when decisions
 * are batched (a single Redis, or a cluster's master). Below that each round trip carries fewer
 * decisions and Redis pays its per-call cost for fewer of them, lowering its
 * capacity exactly when it is short; latency that does not come from our own
 * commands (a Redis starved of CPU by its neighbours) would otherwise cut the
 * limit to almost nothing and the agent's goodput with it.
 */
static double limit_floor(const struct store *s)
{
	unsigned f = s->mode != MODE_UNKNOWN && s->batch_max > LIMIT_MIN ? s->batch_max : LIMIT_MIN;

	return f < s->max_concurrency ? f : s->max_concurrency;
}

/*
 * Seconds a decision's reply is given: HAProxy's share of its budget when the
 * agent knows it (decisions are answered by then), else the command timeout.
 */
double reply_budget(const struct store *s)
{
	return s->answer_budget_s > 0 ? s->answer_budget_s : s->command_timeout_ms / 1000.;
}

/* Congestion at <n> (a missed deadline, a slow reply): cut the limit once per budget. */
void limit_decrease(struct store_node *n, double now)
{
	struct store *s = n->s;
	double floor = limit_floor(s);

	n->slow_start = false;
	if (now - n->last_decrease < reply_budget(s))
		return;
	n->last_decrease = now;
	limit_set(n, n->limit * LIMIT_DECREASE < floor ? floor : n->limit * LIMIT_DECREASE);
}

/* Turns the latency windows of <n> at <now>: what is older than two windows goes. */
void node_lat_turn(struct store_node *n, double now)
{
	if (now < n->lat_window_end)
		return;
	if (now < n->lat_window_end + STORE_LAT_WINDOW_S)
		memcpy(n->lat[1], n->lat[0], sizeof(n->lat[1]));
	else
		memset(n->lat[1], 0, sizeof(n->lat[1]));
	memset(n->lat[0], 0, sizeof(n->lat[0]));
	n->lat_window_end = now + STORE_LAT_WINDOW_S;
}

/* The upper bound of latency bucket <i>, in seconds (the last: infinity). */
double node_lat_bound(unsigned i)
{
	return i + 1 >= STORE_LAT_BUCKETS ? HUGE_VAL : 50e-6 * (double)(1U << i);
}

/* Counts a reply of <n> that took <rtt> seconds in its latency window. */
static void lat_observe(struct store_node *n, double rtt, double now)
{
	unsigned i = 0;

	node_lat_turn(n, now);
	while (i + 1 < STORE_LAT_BUCKETS && rtt > node_lat_bound(i))
		i++;
	n->lat[0][i]++;
}

/* A reply from <n> took <rtt> seconds. */
void limit_sample(struct store_node *n, double rtt, double now)
{
	struct store *s = n->s;
	double timeout = reply_budget(s), good, v;

	lat_observe(n, rtt, now);
	if (now >= n->rtt_window_end) {
		if (n->rtt_min_next > 0)
			n->rtt_min = n->rtt_min_next;
		n->rtt_min_next = 0;
		n->rtt_window_end = now + RTT_WINDOW_S;
	}
	if (n->rtt_min_next <= 0 || rtt < n->rtt_min_next)
		n->rtt_min_next = rtt;
	if (n->rtt_min <= 0 || rtt < n->rtt_min)
		n->rtt_min = rtt;
	if (rtt > timeout / 2) {
		limit_decrease(n, now);
		return;
	}
	good = 2 * n->rtt_min > timeout / 8 ? 2 * n->rtt_min : timeout / 8;
	if (rtt > good || n->limit >= s->max_concurrency || (n->out + 1) * 2 < n->limit)
		return;
	v = n->limit + (n->slow_start ? 1. : 1. / n->limit);
	limit_set(n, v > s->max_concurrency ? s->max_concurrency : v);
}

/* ---- nodes -------------------------------------------------------------- */

/*
 * Fills <ep> from <host> (<hostlen> bytes, not NUL-terminated; brackets
 * allowed) and <port>. An empty host means the node <from>, which we are
 * talking to. A numeric address is made canonical; a host name is kept as it
 * is, to be resolved before each connect. Returns 0, or -1 when the host is
 * neither ("?", garbage) or the port is out of range.
 */
int endpoint_make(struct endpoint *ep, const struct store_node *from, const char *host,
		  size_t hostlen, long port)
{
	char buf[sizeof(ep->host)];
	unsigned char a[sizeof(struct in6_addr)];
	bool bracketed = false;

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
		snprintf(ep->host, sizeof(ep->host), "%s",
			 (from->named || from->sentineled) && from->addr[0] ? from->addr : from->host);
		return 0;
	}
	if (hostlen > 2 && host[0] == '[' && host[hostlen - 1] == ']') {
		host++;
		hostlen -= 2;
		bracketed = true;
	}
	if (hostlen >= sizeof(buf))
		return -1;
	memcpy(buf, host, hostlen);
	buf[hostlen] = 0;
	if (inet_pton(AF_INET, buf, a) == 1)
		return inet_ntop(AF_INET, a, ep->host, sizeof(ep->host)) ? 0 : -1;
	if (inet_pton(AF_INET6, buf, a) == 1)
		return inet_ntop(AF_INET6, a, ep->host, sizeof(ep->host)) ? 0 : -1;
	if (bracketed || !host_name_ok(buf))
		return -1;
	memcpy(ep->host, buf, hostlen + 1);
	return 0;
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
struct store_node *node_new(struct store *s, const struct endpoint *ep, bool seed)
{
	struct store_node *n = xcalloc(1, sizeof(*n));

	n->s = s;
	n->seed = seed;
	if (ep->unix_path) {
		n->unix_path = xstrdup(ep->unix_path);
		n->name = xasprintf("unix:%s", n->unix_path);
	} else if (ep->sentinel) {
		n->host = xstrdup(ep->host);
		n->name = xasprintf("master %s", n->host);
		n->sentineled = true;
	} else {
		n->host = xstrdup(ep->host);
		n->port = ep->port;
		n->name = xasprintf(strchr(n->host, ':') ? "[%s]:%d" : "%s:%d", n->host, n->port);
		n->named = !host_is_numeric(n->host);
	}
	n->backoff_ms = BACKOFF_MIN_MS;
	list_init(&n->parked);
	list_init(&n->queue);
	list_init(&n->batch);
	n->err_class = -1;
	limit_reset(n);
	ev_timer_init(&n->conn_timer, conn_timer_cb, 0., 0.);
	list_append(&s->nodes, &n->link);
	s->stats.nodes++;
	return n;
}

/*
 * The node for <ep>, created (and connecting) if new; NULL when MAX_NODES are
 * known already. A retired node found again is taken back.
 */
struct store_node *node_get(struct store *s, const struct endpoint *ep)
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

/*
 * Closes <n>'s connection now: every command out on it is called back with
 * NULL (answered DOWN, or SHUTDOWN when freeing). Must not run inside one of
 * the callbacks of <n>'s connection (timers, the resolver's and the Sentinels'
 * answers and store_free() call it).
 */
void node_close(struct store_node *n)
{
	struct rconn *rc = n->rc;

	if (n->rq) {
		resolve_cancel(n->rq);
		n->rq = NULL;
	}
	if (n->locating) {
		sentinel_cancel(n->s->sentinel);
		n->locating = false;
	}
	n->rc = NULL; /* our callbacks ignore this connection from now on */
	n->state = ND_DISCONNECTED;
	n->s->node_ops->closing(n); /* what waits in its batch */
	rconn_free(rc);
}

/*
 * mono() when <n> was sent the oldest command it has not answered: on its
 * connection now, or on one closed because it fell silent (node_silent()) and
 * nothing answered since; 0 when it owes nothing. A frozen Redis keeps its
 * age growing across the reconnections whose handshakes it leaves unanswered.
 */
double node_unanswered_at(const struct store_node *n)
{
	double at = n->rc ? rconn_oldest(n->rc) : 0.;

	if (n->silent_at > 0 && (at <= 0 || n->silent_at < at))
		at = n->silent_at;
	return at;
}

/* <n>'s connection is about to be closed because it does not answer: what it
 * owes is remembered until the node answers again (node_unanswered_at()). */
void node_silent(struct store_node *n)
{
	n->silent_at = node_unanswered_at(n);
}

/* Frees <n>: idle, off the map, connection closed here. */
void node_free(struct store_node *n)
{
	struct store *s = n->s;

	BUG_ON(n->nslots || !list_empty(&n->parked) || !list_empty(&n->queue));
	ev_timer_stop(s->loop, &n->conn_timer);
	node_close(n);
	if (n->flush_pending)
		list_del(&n->flush_node);
	if (n->lingering)
		list_del(&n->linger_node);
	if (s->refresh_node == n)
		s->refresh_node = NULL;
	breaker_set(n, false);
	list_del(&n->link);
	s->stats.nodes--;
	limit_set(n, 0);
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
	n->rc = NULL;
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
 * <n>'s connection is gone (or never came): reconnect later, and tell the
 * layers above (node_ops.lost: what was parked or queued there is answered,
 * user callbacks; the topology looked at again if it owned slots of a cluster).
 */
void node_lost(struct store_node *n)
{
	struct store *s = n->s;

	/* a name's next attempt tries its next address when this one never got ready */
	if (n->named && n->addr[0] && !n->was_ready)
		n->addr_next++;
	n->addr[0] = 0;
	node_schedule_reconnect(n);
	if (s->freeing)
		return;
	s->node_ops->lost(n);
}

/* ---- connections --------------------------------------------------------- */

/* What to do about the TLS error <e> of <n>'s connection, or "". */
static const char *tls_hint(const struct store_node *n, const char *e)
{
	if (!n->s->tls || tls_ctx_has_cert(n->s->tls))
		return "";
	if (strstr(e, "certificate required") || strstr(e, "alert handshake failure"))
		return ": the server requires a client certificate: set redis.tls.cert_file and "
		       "redis.tls.key_file";
	/* TLS 1.3: the server's alert may be lost to the reset that follows it */
	if (n->state != ND_READY && (strstr(e, "reset by peer") || strstr(e, "closed the connection")))
		return ": the server hung up after the TLS handshake: if it requires a client "
		       "certificate, set redis.tls.cert_file and redis.tls.key_file";
	return "";
}

/* True when the error reply <err> says the connection must authenticate first. */
static bool auth_needed(const char *err)
{
	return strncmp(err, "NOAUTH", 6) == 0 || strstr(err, "unauthenticated") != NULL;
}

/*
 * Why <rc>, <n>'s connection, was lost, in words: a connection that was ready
 * (Redis gone), or one that was up but never got ready, where a clear-text
 * connection to a TLS port shows as a TLS record (an alert, 0x15, or a
 * handshake, 0x16) where a reply should be, or as the server hanging up.
 */
static void lost_why(struct store_node *n, struct rconn *rc)
{
	const char *e = rconn_errstr(rc);
	char where[STORE_NODE_NAME + 64];
	/* the connection's TLS is gone by now (rconn_tls() is false): the store's says */
	bool tls = n->s->tls != NULL;

	node_where(n, where, sizeof(where));
	if (n->state == ND_READY)
		node_down(n, "connection to %s lost: %s", where, e);
	else if (!tls && (strstr(e, "\"\\x15\"") || strstr(e, "\"\\x16\"")))
		node_down(n, "cannot connect to %s: the server speaks TLS: set redis.tls", where);
	else if (!tls && (strcmp(e, "server closed the connection") == 0 ||
				    strstr(e, "Connection reset by peer")))
		node_down(n, "cannot connect to %s: the server hung up on our first command "
			  "without a word (%s): if it speaks TLS, set redis.tls", where, e);
	else
		node_down(n, "cannot connect to %s: %s%s", where, e, tls_hint(n, e));
}

static void load_reply_cb(struct rconn *rc, void *reply, void *privdata)
{
	struct store_node *n = rconn_data(rc);
	struct store *s = n->s;
	redisReply *rep = reply;

	(void)privdata;
	if (!rep || n->rc != rc)
		return;
	n->silent_at = 0; /* it answers, if only with an error */
	if (rep->type != REDIS_REPLY_STRING || rep->len != 40) {
		char where[STORE_NODE_NAME + 64];

		node_where(n, where, sizeof(where));
		if (rep->type != REDIS_REPLY_ERROR)
			node_down(n, "%s: SCRIPT LOAD: a reply that is no script digest", where);
		else if (auth_needed(rep->str))
			node_down(n, "%s: Redis requires authentication: set redis.password_file "
				  "(and redis.user for an ACL user)", where);
		else if (strncmp(rep->str, "NOPERM", 6) == 0)
			node_down(n, "%s: SCRIPT LOAD refused to redis.user (%s): the ACL the agent "
				  "needs is in doc/configuration.md, The Redis user the agent needs",
				  where, rep->str);
		else
			node_down(n, "%s: SCRIPT LOAD: %s", where, rep->str);
		/* e.g. LOADING while Redis reads its dataset: counted like any error */
		node_error(n, rep->type == REDIS_REPLY_ERROR ? error_class(rep->str)
							     : STORE_EC_OTHER);
		rconn_disconnect(rc);
		return;
	}
	memcpy(s->sha, rep->str, 40);
	s->sha[40] = 0;
	ev_timer_stop(s->loop, &n->conn_timer);
	n->state = ND_READY;
	n->was_ready = true;
	n->last_progress = mono();
	/* a new connection earns a probe at once rather than after the cool-down */
	n->breaker_until = 0;
	n->backoff_ms = BACKOFF_MIN_MS;
	s->stats.connects++;
	node_up(n);
	if (n->addr[0]) /* a name or a master under Sentinel: which address it was */
		LOG(LOG_NOTICE, "redis %s connected (%s%s%.0d)%s, script %s", n->name, n->addr,
		    n->dial_port ? ":" : "", n->dial_port, rconn_tls(rc) ? " over TLS" : "",
		    s->sha);
	else
		LOG(LOG_NOTICE, "redis %s connected%s, script %s", n->name,
		    rconn_tls(rc) ? " over TLS" : "", s->sha);
	s->node_ops->ready(n);
}

static void auth_reply_cb(struct rconn *rc, void *reply, void *privdata)
{
	struct store_node *n = rconn_data(rc);
	redisReply *rep = reply;

	(void)privdata;
	if (rep && rep->type == REDIS_REPLY_ERROR && n->rc == rc) {
		char where[STORE_NODE_NAME + 64];

		node_where(n, where, sizeof(where));
		if (strncmp(rep->str, "WRONGPASS", 9) == 0 || strstr(rep->str, "invalid password"))
			node_down(n, "%s: Redis refused the password (%s): check redis.password_file "
				  "and redis.user", where, rep->str);
		else if (strstr(rep->str, "without any password configured"))
			node_down(n, "%s: Redis has no password but the agent sends one (%s): drop "
				  "redis.password_file, or set one in Redis", where, rep->str);
		else
			node_down(n, "%s: AUTH: %s", where, rep->str);
		node_error(n, error_class(rep->str));
		rconn_disconnect(rc);
	}
}

/*
 * A master under Sentinel confirms it is one (ROLE) before any decision: the
 * Sentinels' answer may be stale in the middle of a failover. Anything else
 * drops the connection; the next attempt asks the Sentinels again.
 */
static void role_reply_cb(struct rconn *rc, void *reply, void *privdata)
{
	struct store_node *n = rconn_data(rc);
	redisReply *rep = reply;
	char where[STORE_NODE_NAME + 64];
	const char *role;

	(void)privdata;
	if (!rep || n->rc != rc)
		return;
	role = reply_role(rep);
	if (!role)
		role = "no role";
	if (strcmp(role, "master") == 0)
		return;
	node_down(n, "%s is a %s, not the master (a failover in progress?)",
		  node_where(n, where, sizeof(where)), role);
	node_error(n, STORE_EC_READONLY);
	rconn_disconnect(rc);
}

static void connect_cb(struct rconn *rc, int status)
{
	struct store_node *n = rconn_data(rc);
	struct store *s = n->s;

	if (n->rc != rc)
		return;
	if (status != 0) {
		char where[STORE_NODE_NAME + 64];

		/* the connection is freed after this callback */
		node_down(n, "cannot connect to %s: %s%s", node_where(n, where, sizeof(where)),
			  rconn_errstr(rc), tls_hint(n, rconn_errstr(rc)));
		node_lost(n);
		return;
	}
	/* the connect deadline keeps running: it covers AUTH and SCRIPT LOAD too */
	n->state = ND_HANDSHAKE;
	if (s->password) {
		const char *argv[3] = {"AUTH", s->user ? s->user : s->password, s->password};
		int argc = s->user ? 3 : 2;

		rconn_command(rc, auth_reply_cb, NULL, argc, argv, NULL);
	}
	if (n->sentineled) {
		const char *argv[1] = {"ROLE"};

		rconn_command(rc, role_reply_cb, NULL, 1, argv, NULL);
	}
	{
		const char *argv[3] = {"SCRIPT", "LOAD", script_ratelimit};
		size_t lens[3] = {6, 4, script_ratelimit_len};

		rconn_command(rc, load_reply_cb, NULL, 3, argv, lens);
	}
}

static void disconnect_cb(struct rconn *rc, int status)
{
	struct store_node *n = rconn_data(rc);

	if (n->rc != rc)
		return;
	if (status != 0)
		lost_why(n, rc);
	if (rconn_protocol_error(rc))
		node_error(n, STORE_EC_PROTOCOL);
	/* the connection is freed after this callback; pending commands were
	 * already called back with a NULL reply */
	node_lost(n);
}

static void conn_timer_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct store_node *n = container_of(t, struct store_node, conn_timer);

	(void)loop;
	(void)revents;
	if (n->state == ND_CONNECTING || n->state == ND_HANDSHAKE) {
		char where[STORE_NODE_NAME + 64];
		unsigned ms = n->s->connect_timeout_ms;

		node_where(n, where, sizeof(where));
		if (n->state == ND_HANDSHAKE)
			node_down(n, "cannot connect to %s: connected, but no answer to %s within "
				  "redis.connect_timeout_ms (%u ms)", where,
				  n->s->password ? "AUTH" : "SCRIPT LOAD", ms);
		else if (n->rc && rconn_handshaking(n->rc))
			node_down(n, "cannot connect to %s: no TLS handshake within "
				  "redis.connect_timeout_ms (%u ms): is this the TLS port? "
				  "(redis.tls is set)", where, ms);
		else if (n->locating)
			node_down(n, "cannot locate %s: the Sentinels did not answer within "
				  "redis.connect_timeout_ms (%u ms)", n->name, ms);
		else if (n->rq)
			node_down(n, "cannot connect to %s: its name was not resolved within "
				  "redis.connect_timeout_ms (%u ms)", n->name, ms);
		else
			node_down(n, "cannot connect to %s: timed out after "
				  "redis.connect_timeout_ms (%u ms)", where, ms);
		node_silent(n);
		node_close(n);
		node_lost(n);
		return;
	}
	if (n->state == ND_DISCONNECTED && !n->retired)
		node_connect(n);
}

/* Connects <n> to <host> (numeric, or a unix socket when NULL). */
static void node_dial(struct store_node *n, const char *host)
{
	struct store *s = n->s;
	struct rconn_opts o = {
		.loop = s->loop,
		.data = n,
		.on_connect = connect_cb,
		.on_disconnect = disconnect_cb,
		.limits = &s->reply_limits,
		.tls = s->tls,
		/* a name is the name its certificate carries, unless the configuration
		 * names one (tls.server_name); an address alone is verified as one */
		.server_name = n->named ? n->host : n->sentinel_name[0] ? n->sentinel_name : NULL,
		.keepalive = true,
	};
	char err[256], where[STORE_NODE_NAME + 64];
	struct rconn *rc;

	rc = rconn_connect(&o, host, n->dial_port ? n->dial_port : n->port, n->unix_path, err,
			   sizeof(err));
	if (!rc) {
		if (n->named || n->sentineled)
			snprintf(n->addr, sizeof(n->addr), "%s", host);
		node_down(n, "cannot connect to %s: %s", node_where(n, where, sizeof(where)), err);
		node_lost(n);
		return;
	}
	if (n->named || n->sentineled)
		snprintf(n->addr, sizeof(n->addr), "%s", host);
	n->was_ready = false;
	n->rc = rc;
	n->state = ND_CONNECTING;
}

/* 1 when <addr> is among <n>'s addresses of the last lookup. */
static bool node_has_addr(const struct store_node *n, const char *addr)
{
	unsigned i;

	for (i = 0; i < n->naddrs; i++)
		if (strcmp(n->addrs[i], addr) == 0)
			return true;
	return false;
}

/*
 * The answer to <n>'s lookup: before a connect, dial the next address (the last
 * ones known if the lookup failed, or give up until the next attempt when
 * there are none); while connected (a TTL refresh), drop the connection if its
 * address is no longer among the name's, so that the next one follows the move.
 */
static void resolved_cb(void *arg, const struct resolve_result *res)
{
	struct store_node *n = arg;
	bool refresh = n->rq_refresh;

	n->rq = NULL;
	if (res->ok) {
		memcpy(n->addrs, res->addrs, sizeof(n->addrs));
		n->naddrs = res->naddrs;
		n->addrs_until = mono() + res->ttl_s;
	} else {
		if (refresh)
			store_log_trouble(n, "resolve", res->error);
		/* the addresses known keep serving meanwhile: look again soon */
		n->addrs_until = mono() + RESOLVE_TTL_MIN_S;
	}
	if (refresh) {
		if (n->addr[0] && n->naddrs && !node_has_addr(n, n->addr) && n->state == ND_READY) {
			LOG(LOG_NOTICE, "redis %s: %s is no longer among its addresses, reconnecting",
			    n->name, n->addr);
			node_close(n);
			node_lost(n);
		}
		return;
	}
	if (n->state != ND_CONNECTING)
		return;
	if (!res->ok && n->naddrs) /* the last addresses known are tried */
		store_log_trouble(n, "resolve", res->error);
	else if (!res->ok)
		node_down(n, "cannot resolve %s: %s", n->name, res->error);
	if (!n->naddrs) {
		node_close(n);
		node_lost(n);
		return;
	}
	node_dial(n, n->addrs[n->addr_next % n->naddrs]);
}

/* Starts a lookup of <n>'s name; its answer goes on in resolved_cb(). */
static void node_resolve(struct store_node *n, bool refresh)
{
	struct store *s = n->s;

	if (!s->resolver) {
		char err[160];

		s->resolver = resolver_new(s->loop, &s->resolver_opts, err, sizeof(err));
		if (!s->resolver) {
			if (refresh)
				store_log_trouble(n, "resolve", err);
			else
				node_down(n, "cannot resolve %s: %s", n->name, err);
			if (!refresh) {
				node_close(n);
				node_lost(n);
			}
			return;
		}
	}
	n->rq_refresh = refresh;
	n->rq = resolver_lookup(s->resolver, n->host, resolved_cb, n);
}

/* The Sentinels' answer for <n>, the master's node: dial it, or try again later. */
static void located_cb(void *arg, const char *ip, int port, const char *name, const char *err)
{
	struct store_node *n = arg;

	n->locating = false;
	/* a master the Sentinels name by host name is verified by that name (TLS) */
	snprintf(n->sentinel_name, sizeof(n->sentinel_name), "%s", name ? name : "");
	if (!ip) {
		node_down(n, "cannot locate %s: %s", n->name, err);
		node_close(n);
		node_lost(n);
		return;
	}
	n->dial_port = port;
	node_dial(n, ip);
}

/*
 * A Sentinel announced a new master (+switch-master): if it is not the one the
 * seed is connected or connecting to, drop that connection now; the next one
 * asks the Sentinels (whose word decides) and confirms with ROLE.
 */
void node_master_switched(void *arg, const char *ip, int port)
{
	struct store *s = arg;
	struct store_node *n = s->seed;

	if (!n || !n->sentineled || n->state == ND_DISCONNECTED || n->locating)
		return;
	if (strcmp(n->addr, ip) == 0 && n->dial_port == port)
		return;
	LOG(LOG_NOTICE, "redis %s: the Sentinels moved it to %s:%d, reconnecting", n->name, ip,
	    port);
	node_close(n);
	n->backoff_ms = BACKOFF_MIN_MS;
	node_lost(n);
}

/*
 * The housekeeping tick, for a node with a name: once the TTL of its last
 * lookup ran out, look again while connected (resolved_cb() follows a move).
 */
void node_ttl_check(struct store_node *n, double now)
{
	if (n->state == ND_READY && !n->rq && now >= n->addrs_until)
		node_resolve(n, true);
}

/*
 * Starts connecting <n>; failures end in node_lost() (which may call users
 * back). A name is looked up again first, on every attempt: its next address
 * (in turn) is dialled once the answer comes, all within the connect deadline.
 */
void node_connect(struct store_node *n)
{
	struct store *s = n->s;

	n->down_told = false; /* a new attempt: its failure is told */
	/* the deadline covers the lookup, connect + AUTH + SCRIPT LOAD */
	ev_timer_stop(s->loop, &n->conn_timer);
	ev_timer_set(&n->conn_timer, s->connect_timeout_ms / 1000., 0.);
	ev_timer_start(s->loop, &n->conn_timer);
	if (n->sentineled) {
		n->state = ND_CONNECTING;
		n->locating = true;
		sentinel_locate(s->sentinel, located_cb, n);
		return;
	}
	if (!n->named) {
		node_dial(n, n->unix_path ? NULL : n->host);
		return;
	}
	n->state = ND_CONNECTING;
	if (n->rq) {            /* a TTL refresh in flight: its answer serves */
		n->rq_refresh = false;
		return;
	}
	node_resolve(n, false);
}

/* Reads the seed address "ip:port", "[ip6]:port" or "unix:/path" into <ep>. */
int seed_endpoint(const char *addr, struct endpoint *ep, char *err, size_t errlen)
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
	/* a name is resolved on the loop (resolve.c), never by hiredis, whose
	 * getaddrinfo() would block it */
	if (endpoint_make(ep, NULL, addr, (size_t)(colon - addr), port) < 0) {
		snprintf(err, errlen,
			 "redis address '%s': expected ip:port, [ip6]:port, host:port or unix:/path",
			 addr);
		return -1;
	}
	return 0;
}
