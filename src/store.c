/* SPDX-License-Identifier: MIT */
/*
 * Redis store on hiredis 0.14.1's async API and its libev adapter.
 *
 * DESIGN
 * States: DISCONNECTED -> CONNECTING -> LOADING -> READY, back to DISCONNECTED
 * on any failure, and a reconnect timer with a capped exponential backoff.
 *  - CONNECTING: our connect timer bounds it (hiredis 0.14.1 has no async
 *    connect timeout); on expiry the context is freed and we retry later.
 *  - LOADING: AUTH (if configured) and SCRIPT LOAD are pipelined; the store is
 *    ready when SCRIPT LOAD returns the digest. Queries are refused (DOWN)
 *    until then, so they are answered by the fail policy at once rather than
 *    waiting behind a connection that may never come up.
 *  - READY: queries become EVALSHA commands. A NOSCRIPT error (Redis restarted
 *    empty, SCRIPT FLUSH, eviction) re-sends the same query once as EVAL with
 *    the script body, which also caches it again.
 *
 * Deadlines: every command joins a FIFO with its deadline; one timer tracks
 * the oldest. When it expires the caller is answered STORE_TIMEOUT at once
 * and the command is marked abandoned: hiredis still owns its callback, which
 * later frees it without calling anyone ("late" replies). Since commands on one
 * connection are answered in order, the FIFO head is always the oldest one.
 *
 * Bounded: at most max_pending commands in flight (abandoned ones included, so
 * a stalled Redis cannot make us buffer without end); beyond that queries fail
 * at once with STORE_BUSY.
 *
 * Exactly-once: a query accepted by store_decide() gets one callback, from the
 * reply, the deadline, or the disconnection, whichever comes first.
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

#include "list.h"
#include "log.h"
#include "scripts.h"
#include "util.h"

#define BACKOFF_MIN_MS 50
#define BACKOFF_MAX_MS 500

enum store_state {
	ST_DISCONNECTED = 0,
	ST_CONNECTING   = 1,
	ST_LOADING      = 2,
	ST_READY        = 3,
	ST_COUNT            /* sentinel */
};

struct store_cmd {
	struct list node;               /* in store.waiting until answered or expired */
	struct store *s;                /* ref: owner */
	store_done_fn cb;               /* decisions: NULL once the caller was answered */
	store_str_fn str_cb;            /* lookups: NULL once the caller was answered */
	void *arg;                      /* ref: caller's */
	double deadline;                /* mono_now() based */
	bool retried;                   /* NOSCRIPT retry done */
	struct store_query q;           /* kept for a NOSCRIPT retry */
};

struct store {
	struct ev_loop *loop;           /* ref */
	char *host;                     /* owned: ip, or NULL for unix */
	int port;
	char *unix_path;                /* owned or NULL */
	char *user;                     /* owned or NULL */
	char *password;                 /* owned or NULL */
	unsigned connect_timeout_ms;
	unsigned command_timeout_ms;
	unsigned max_pending;
	enum store_state state;
	redisAsyncContext *ac;          /* owned by hiredis; NULL when disconnected */
	ev_timer conn_timer;            /* connect deadline / reconnect backoff */
	ev_timer cmd_timer;             /* deadline of the oldest waiting command */
	unsigned backoff_ms;
	char sha[41];                   /* digest of the script, from SCRIPT LOAD */
	struct list waiting;            /* store_cmd.node, oldest first */
	struct store_stats stats;
	bool freeing;
	double last_progress;           /* mono_now() of the last reply or first send */
	double stall_s;                 /* no reply for this long with commands out: reconnect */
	unsigned breaker_failures;      /* threshold */
	double breaker_cooldown_s;
	unsigned failures;              /* consecutive timeouts and errors */
	double breaker_until;           /* open until (mono_now); then one probe */
	bool probing;                   /* half-open: the probe is in flight */
	uint64_t log_suppressed;        /* connection errors not logged */
	ev_tstamp log_last;
};

static void store_connect(struct store *s);
static void schedule_reconnect(struct store *s);
static double mono_now(void);

/* Seconds on the monotonic clock: deadlines must not move with the wall clock. */
static double mono_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

const char *store_status_str(int st)
{
	static const char *const names[STORE_COUNT] = {"ok",   "error",    "timeout", "down",
						       "busy", "shutdown", "breaker"};

	if (st < 0 || st >= STORE_COUNT)
		return "?";
	return names[st];
}

/* Logs connection trouble at most once a second, counting what was dropped. */
static void store_log_trouble(struct store *s, const char *what, const char *detail)
{
	ev_tstamp now = ev_now(s->loop);

	if (now - s->log_last < 1.0) {
		s->log_suppressed++;
		return;
	}
	if (s->log_suppressed)
		LOG(LOG_WARN, "redis %s: %s (%llu similar messages suppressed)", what, detail,
		    (unsigned long long)s->log_suppressed);
	else
		LOG(LOG_WARN, "redis %s: %s", what, detail);
	s->log_suppressed = 0;
	s->log_last = now;
}

/*
 * Circuit breaker: <breaker_failures> consecutive timeouts or errors open it;
 * while open, queries fail at once (STORE_BREAKER) instead of queueing behind
 * a sick Redis. After the cool-down one query goes through as a probe: its
 * success closes the breaker, its failure opens it again.
 */
static void breaker_record(struct store *s, enum store_status st)
{
	if (st == STORE_OK) {
		if (s->stats.breaker_open)
			LOG(LOG_NOTICE, "redis breaker closed");
		s->failures = 0;
		s->probing = false;
		s->stats.breaker_open = false;
		return;
	}
	if (st != STORE_TIMEOUT && st != STORE_ERROR && st != STORE_DOWN)
		return;
	s->failures++;
	if (s->probing || (!s->stats.breaker_open && s->failures >= s->breaker_failures)) {
		if (!s->stats.breaker_open) {
			s->stats.breaker_opened++;
			LOG(LOG_WARN, "redis breaker open after %u consecutive failures",
			    s->failures);
		}
		s->stats.breaker_open = true;
		s->probing = false;
		s->breaker_until = mono_now() + s->breaker_cooldown_s;
	}
}

/* May a query be sent now? Lets one probe through once the cool-down ended. */
static bool breaker_allows(struct store *s)
{
	if (!s->stats.breaker_open)
		return true;
	if (s->probing || mono_now() < s->breaker_until)
		return false;
	s->probing = true;
	return true;
}

/* True while <c>'s caller has not been answered. */
static bool cmd_live(const struct store_cmd *c)
{
	return c->cb || c->str_cb;
}

/*
 * Answers <c>'s caller once (a decision with <r>, a lookup with <val>/<len>);
 * the command itself stays with hiredis until its reply callback.
 */
static void cmd_answer_full(struct store_cmd *c, enum store_status st,
			    const struct store_result *r, const char *val, size_t len)
{
	store_done_fn cb = c->cb;
	store_str_fn str_cb = c->str_cb;

	list_del(&c->node);
	if (!cmd_live(c))
		return;
	c->cb = NULL;
	c->str_cb = NULL;
	if (st != STORE_OK)
		c->s->stats.failed[st]++;
	breaker_record(c->s, st);
	if (cb)
		cb(st, r, c->arg);
	else
		str_cb(st, val, len, c->arg);
}

static void cmd_answer(struct store_cmd *c, enum store_status st, const struct store_result *r)
{
	cmd_answer_full(c, st, r, NULL, 0);
}

/*
 * Arms the command timer for the oldest waiting command's deadline, or, when
 * every waiting command has been answered but some are still out (abandoned),
 * for the stall check.
 */
static void cmd_timer_arm(struct store *s)
{
	double now = mono_now(), at;

	ev_timer_stop(s->loop, &s->cmd_timer);
	if (!list_empty(&s->waiting))
		at = LIST_ELEM(s->waiting.next, struct store_cmd, node)->deadline;
	else if (s->stats.pending && s->ac)
		at = s->last_progress + s->stall_s;
	else
		return;
	ev_timer_set(&s->cmd_timer, at > now ? at - now : 0., 0.);
	ev_timer_start(s->loop, &s->cmd_timer);
}

static void cmd_timer_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct store *s = container_of(t, struct store, cmd_timer);
	double now = mono_now();

	(void)loop;
	(void)revents;
	while (!list_empty(&s->waiting)) {
		struct store_cmd *c = LIST_ELEM(s->waiting.next, struct store_cmd, node);

		if (c->deadline > now)
			break;
		cmd_answer(c, STORE_TIMEOUT, NULL);
	}
	/* commands out and nothing back for a long time: the connection is
	 * alive for TCP but Redis is not answering (frozen, partitioned). Drop
	 * it: waiters are answered DOWN at once, reconnection starts. Safe here:
	 * we are not inside a hiredis callback. */
	if (s->stats.pending && s->ac && s->state == ST_READY &&
	    now - s->last_progress >= s->stall_s) {
		redisAsyncContext *ac = s->ac;

		store_log_trouble(s, "stalled", "no reply in time, reconnecting");
		s->ac = NULL;
		redisAsyncFree(ac);
		schedule_reconnect(s);
	}
	cmd_timer_arm(s);
}

/* Parses the script's flat integer array into <r>. Returns 0 or -1. */
static int parse_result(const redisReply *rep, size_t n, struct store_result *r)
{
	size_t i;

	if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 3 + 4 * n)
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
	return 0;
}

static int cmd_send(struct store *s, struct store_cmd *c, bool eval);

static void cmd_reply_cb(redisAsyncContext *ac, void *reply, void *privdata)
{
	struct store_cmd *c = privdata;
	struct store *s = c->s;
	redisReply *rep = reply;
	struct store_result res;

	(void)ac;
	s->stats.pending--;
	if (rep)
		s->last_progress = mono_now();
	if (!cmd_live(c)) {
		/* the caller was answered already (deadline or shutdown) */
		if (rep)
			s->stats.late++;
		free(c);
		return;
	}
	if (!rep) {
		/* connection lost or context freed */
		cmd_answer(c, s->freeing ? STORE_SHUTDOWN : STORE_DOWN, NULL);
		free(c);
		return;
	}
	if (c->str_cb) {
		if (rep->type == REDIS_REPLY_STRING) {
			s->stats.replies++;
			cmd_answer_full(c, STORE_OK, NULL, rep->str, rep->len);
		} else if (rep->type == REDIS_REPLY_NIL) {
			s->stats.replies++;
			cmd_answer_full(c, STORE_OK, NULL, NULL, 0);
		} else {
			store_log_trouble(s, "lookup", rep->type == REDIS_REPLY_ERROR ? rep->str
										   : "bad reply");
			cmd_answer(c, STORE_ERROR, NULL);
		}
		cmd_timer_arm(s);
		free(c);
		return;
	}
	if (rep->type == REDIS_REPLY_ERROR && strncmp(rep->str, "NOSCRIPT", 8) == 0 &&
	    !c->retried && s->state == ST_READY) {
		s->stats.noscript++;
		c->retried = true;
		if (cmd_send(s, c, true) == 0)
			return; /* same deadline, still waiting */
	}
	if (rep->type == REDIS_REPLY_ERROR) {
		store_log_trouble(s, "script error", rep->str);
		cmd_answer(c, STORE_ERROR, NULL);
	} else if (parse_result(rep, c->q.n, &res) < 0) {
		store_log_trouble(s, "reply", "unexpected reply shape");
		cmd_answer(c, STORE_ERROR, NULL);
	} else {
		s->stats.replies++;
		cmd_answer(c, STORE_OK, &res);
	}
	cmd_timer_arm(s);
	free(c);
}

/*
 * Sends <c> as EVALSHA (or EVAL with the body when <eval>). Keys and numbers go
 * as separate argv entries: untrusted bytes never meet a format string.
 */
static int cmd_send(struct store *s, struct store_cmd *c, bool eval)
{
	const char *argv[3 + STORE_MAX_LIMITS * 6];
	size_t lens[ARRAY_SIZE(argv)];
	char nums[5 * STORE_MAX_LIMITS][24];
	char nkeys[8];
	size_t i;
	int argc = 0, k = 0;

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
#undef PUSH_NUM
	if (redisAsyncCommandArgv(s->ac, cmd_reply_cb, c, argc, argv, lens) != REDIS_OK)
		return -1;
	s->stats.pending++;
	s->stats.sent++;
	return 0;
}

/*
 * Submits the decision <q>. Returns 0 when <cb> will be called exactly once
 * later, or the negated store_status when the query fails at once (the store is
 * down or saturated) and <cb> will never be called. <q> is copied.
 */
int store_decide(struct store *s, const struct store_query *q, store_done_fn cb, void *arg)
{
	struct store_cmd *c;

	if (s->state != ST_READY) {
		s->stats.failed[STORE_DOWN]++;
		return -STORE_DOWN;
	}
	if (s->stats.pending >= s->max_pending) {
		s->stats.failed[STORE_BUSY]++;
		return -STORE_BUSY;
	}
	if (!breaker_allows(s)) {
		s->stats.failed[STORE_BREAKER]++;
		return -STORE_BREAKER;
	}
	BUG_ON(q->n < 1 || q->n > STORE_MAX_LIMITS);
	c = xcalloc(1, sizeof(*c));
	c->s = s;
	c->cb = cb;
	c->arg = arg;
	c->q = *q;
	c->deadline = mono_now() + s->command_timeout_ms / 1000.;
	if (!s->stats.pending)
		s->last_progress = mono_now();
	list_init(&c->node);
	if (cmd_send(s, c, false) < 0) {
		free(c);
		s->stats.failed[STORE_DOWN]++;
		s->probing = false;
		return -STORE_DOWN;
	}
	/* the timer follows the oldest waiting command: arm it when this one is
	 * the only one (it may be armed for the stall check meanwhile) */
	list_append(&s->waiting, &c->node);
	if (s->waiting.next == &c->node)
		cmd_timer_arm(s);
	return 0;
}

/*
 * Looks up <field> of the hash <key> (HGET). Same contract as store_decide():
 * 0 and exactly one later call of <cb>, or a negative store_status at once.
 */
int store_hget(struct store *s, const char *key, const char *field, store_str_fn cb, void *arg)
{
	const char *argv[3] = {"HGET", key, field};
	struct store_cmd *c;

	if (s->state != ST_READY) {
		s->stats.failed[STORE_DOWN]++;
		return -STORE_DOWN;
	}
	if (s->stats.pending >= s->max_pending) {
		s->stats.failed[STORE_BUSY]++;
		return -STORE_BUSY;
	}
	if (!breaker_allows(s)) {
		s->stats.failed[STORE_BREAKER]++;
		return -STORE_BREAKER;
	}
	c = xcalloc(1, sizeof(*c));
	c->s = s;
	c->str_cb = cb;
	c->arg = arg;
	c->deadline = mono_now() + s->command_timeout_ms / 1000.;
	list_init(&c->node);
	if (redisAsyncCommandArgv(s->ac, cmd_reply_cb, c, 3, argv, NULL) != REDIS_OK) {
		free(c);
		s->stats.failed[STORE_DOWN]++;
		return -STORE_DOWN;
	}
	if (!s->stats.pending)
		s->last_progress = mono_now();
	s->stats.pending++;
	s->stats.sent++;
	list_append(&s->waiting, &c->node);
	if (s->waiting.next == &c->node)
		cmd_timer_arm(s);
	return 0;
}

bool store_ready(const struct store *s)
{
	return s->state == ST_READY;
}

const struct store_stats *store_stats(const struct store *s)
{
	return &s->stats;
}

static void schedule_reconnect(struct store *s)
{
	s->state = ST_DISCONNECTED;
	s->ac = NULL;
	ev_timer_stop(s->loop, &s->conn_timer);
	if (s->freeing)
		return;
	ev_timer_set(&s->conn_timer, s->backoff_ms / 1000., 0.);
	ev_timer_start(s->loop, &s->conn_timer);
	s->backoff_ms *= 2;
	if (s->backoff_ms > BACKOFF_MAX_MS)
		s->backoff_ms = BACKOFF_MAX_MS;
}

static void load_reply_cb(redisAsyncContext *ac, void *reply, void *privdata)
{
	struct store *s = ac->data;
	redisReply *rep = reply;

	(void)privdata;
	if (!rep || s->ac != ac)
		return;
	if (rep->type != REDIS_REPLY_STRING || rep->len != 40) {
		store_log_trouble(s, "SCRIPT LOAD", rep->type == REDIS_REPLY_ERROR ? rep->str
										 : "bad reply");
		redisAsyncDisconnect(ac);
		return;
	}
	memcpy(s->sha, rep->str, 40);
	s->sha[40] = 0;
	ev_timer_stop(s->loop, &s->conn_timer);
	s->state = ST_READY;
	s->last_progress = mono_now();
	/* a new connection earns a probe at once rather than after the cool-down */
	s->breaker_until = 0;
	s->backoff_ms = BACKOFF_MIN_MS;
	s->stats.connects++;
	LOG(LOG_NOTICE, "redis connected, script %s", s->sha);
}

static void auth_reply_cb(redisAsyncContext *ac, void *reply, void *privdata)
{
	struct store *s = ac->data;
	redisReply *rep = reply;

	(void)privdata;
	if (rep && rep->type == REDIS_REPLY_ERROR && s->ac == ac) {
		store_log_trouble(s, "AUTH", rep->str);
		redisAsyncDisconnect(ac);
	}
}

static void connect_cb(const redisAsyncContext *cac, int status)
{
	redisAsyncContext *ac = (redisAsyncContext *)cac;
	struct store *s = ac->data;

	if (s->ac != ac)
		return;
	if (status != REDIS_OK) {
		ev_timer_stop(s->loop, &s->conn_timer);
		/* hiredis frees the context after this callback */
		store_log_trouble(s, "connect", ac->errstr);
		schedule_reconnect(s);
		return;
	}
	/* the connect deadline keeps running: it covers AUTH and SCRIPT LOAD too */
	s->state = ST_LOADING;
	if (s->host)
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
	struct store *s = cac->data;

	if (s->ac != cac)
		return;
	if (status != REDIS_OK)
		store_log_trouble(s, "connection lost", cac->errstr);
	/* hiredis frees the context after this callback; pending commands were
	 * already called back with a NULL reply */
	schedule_reconnect(s);
}

static void conn_timer_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct store *s = container_of(t, struct store, conn_timer);

	(void)loop;
	(void)revents;
	if (s->state == ST_CONNECTING || s->state == ST_LOADING) {
		redisAsyncContext *ac = s->ac;

		store_log_trouble(s, "connect", "timed out");
		s->ac = NULL; /* our callbacks ignore this context from now on */
		redisAsyncFree(ac);
		schedule_reconnect(s);
		return;
	}
	if (s->state == ST_DISCONNECTED)
		store_connect(s);
}

static void store_connect(struct store *s)
{
	redisAsyncContext *ac;

	ac = s->unix_path ? redisAsyncConnectUnix(s->unix_path)
			  : redisAsyncConnect(s->host, s->port);
	if (!ac) {
		schedule_reconnect(s);
		return;
	}
	if (ac->err) {
		store_log_trouble(s, "connect", ac->errstr);
		redisAsyncFree(ac);
		schedule_reconnect(s);
		return;
	}
	ac->data = s;
	s->ac = ac;
	s->state = ST_CONNECTING;
	redisLibevAttach(s->loop, ac);
	redisAsyncSetConnectCallback(ac, connect_cb);
	redisAsyncSetDisconnectCallback(ac, disconnect_cb);
	/* the deadline covers connect + AUTH + SCRIPT LOAD */
	ev_timer_stop(s->loop, &s->conn_timer);
	ev_timer_set(&s->conn_timer, s->connect_timeout_ms / 1000., 0.);
	ev_timer_start(s->loop, &s->conn_timer);
}

/* Splits "ip:port", "[ip6]:port" or "unix:/path" into <s>'s fields. */
static int parse_endpoint(struct store *s, const char *addr, char *err, size_t errlen)
{
	const char *colon;
	char *end;
	long port;

	if (strncmp(addr, "unix:", 5) == 0) {
		if (!addr[5]) {
			snprintf(err, errlen, "redis address '%s': empty path", addr);
			return -1;
		}
		s->unix_path = xstrdup(addr + 5);
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
	if (addr[0] == '[' && colon[-1] == ']')
		s->host = xasprintf("%.*s", (int)(colon - addr - 2), addr + 1);
	else
		s->host = xasprintf("%.*s", (int)(colon - addr), addr);
	s->port = (int)port;
	/* hiredis 0.14.1 resolves names with a blocking getaddrinfo() on every
	 * connect: only numeric addresses keep the loop from ever blocking */
	{
		struct in6_addr a6;

		if (inet_pton(AF_INET, s->host, &a6) != 1 && inet_pton(AF_INET6, s->host, &a6) != 1) {
			snprintf(err, errlen,
				 "redis address '%s': use a numeric IP address or unix:/path "
				 "(names would block the event loop)",
				 addr);
			FREE_AND_NULL(s->host);
			return -1;
		}
	}
	return 0;
}

/*
 * Creates a store for <opts> on <loop> and starts connecting (asynchronously).
 * Returns 0 with <*out> set, or -1 with a message in <err>.
 */
int store_new(struct ev_loop *loop, const struct store_opts *opts, struct store **out,
	      char *err, size_t errlen)
{
	struct store *s = xcalloc(1, sizeof(*s));

	s->loop = loop;
	if (parse_endpoint(s, opts->address, err, errlen) < 0) {
		free(s);
		return -1;
	}
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
	s->backoff_ms = BACKOFF_MIN_MS;
	list_init(&s->waiting);
	ev_timer_init(&s->conn_timer, conn_timer_cb, 0., 0.);
	ev_timer_init(&s->cmd_timer, cmd_timer_cb, 0., 0.);
	store_connect(s);
	*out = s;
	return 0;
}

/*
 * Frees <s>. Every accepted query still waiting is answered STORE_SHUTDOWN
 * before this returns.
 */
void store_free(struct store *s)
{
	if (!s)
		return;
	s->freeing = true;
	ev_timer_stop(s->loop, &s->conn_timer);
	ev_timer_stop(s->loop, &s->cmd_timer);
	if (s->ac) {
		redisAsyncContext *ac = s->ac;

		/* calls every pending reply callback with NULL, answering waiters */
		redisAsyncFree(ac);
		s->ac = NULL;
	}
	while (!list_empty(&s->waiting))
		cmd_answer(LIST_ELEM(s->waiting.next, struct store_cmd, node), STORE_SHUTDOWN, NULL);
	free(s->host);
	free(s->unix_path);
	free(s->user);
	free(s->password);
	free(s);
}
