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
 * is the cluster's slot map: masters only, each one a node (an empty or NULL
 * address means the node we asked). A single Redis is asked again on every
 * reconnect, so it may turn into a cluster.
 *
 * Names. A node whose address is a host name (the seed, or a node announced
 * by name) is resolved on the loop (resolve.c, c-ares; never by hiredis, whose
 * getaddrinfo() blocks) before every connect, its addresses tried in turn, and
 * again while connected once the answer's TTL ran out: an address no longer
 * listed closes the connection so that the next one follows the move
 * (store_node.c).
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
 * Admission: each node has an adaptive concurrency limit (see limit_sample())
 * on the commands out on its connection. A new command is sent at once when
 * its node has room and nothing queued; otherwise it joins the node's FIFO
 * queue and the store's FIFO of queue deadlines (queue_s after it arrived).
 * Every reply frees room and sends the oldest queued commands. A command
 * still queued at its queue deadline is shed: answered STORE_OVERLOAD and
 * freed. The probe of an open breaker skips the queue.
 *
 * Deadlines: a command's deadline is command_timeout_ms from when it is sent,
 * or its query's answer_by (when its caller must be answered: HAProxy gives up
 * on the NOTIFY soon after) if that comes first; the queue deadline likewise,
 * and a decision submitted past its answer_by is shed at once. Every sent
 * command joins one FIFO with its deadline; one timer tracks the earliest of
 * its head and the queue's head. Every command gets the same timeout, and
 * answer_by follows the NOTIFYs' arrival, so the FIFO head is (nearly) always
 * the oldest deadline whichever node the command went to, even after
 * redirections (which keep the deadline); one out of order is answered at most
 * one timeout late. When it
 * expires the caller is answered STORE_TIMEOUT at once, the node's limit is
 * cut (when the time went to waiting for Redis, not to this agent's turns),
 * and the command is marked abandoned: hiredis still owns its callback, which
 * later frees it without calling anyone ("late" replies); a parked command is
 * freed at once.
 *
 * Housekeeping tick (TICK_S): stalls (commands out on a node and nothing back
 * for stall_s, seen by two ticks in a row: the breaker opens, the connection is dropped, its waiters
 * answered DOWN, a reconnect starts), retired nodes closed once idle, refresh
 * schedule.
 * Connections are only ever closed from timers, never from inside a hiredis
 * callback.
 *
 * Circuit breaker, per node: <breaker_failures> consecutive Redis failures of
 * queries sent to one node (error replies, lost connections; a missed deadline
 * is congestion, handled by the limit, not a failure) stop queries to that
 * node (BREAKER) for a cool-down; a stall opens it at once; then one query
 * goes through as a probe; its success closes the breaker. A node that
 * answers with a redirection is healthy. Error replies are counted by class
 * (OOM, BUSY, LOADING, READONLY/MASTERDOWN, other) and the last one is kept
 * for store_health().
 *
 * Bounded: at most max_pending commands in flight or queued over all nodes
 * (abandoned and parked ones included, so a stalled Redis cannot make us
 * buffer without end), beyond that queries fail at once with STORE_BUSY; at
 * most MAX_NODES nodes; at most MAX_REDIRECTS redirections per command; every
 * integer of a reply range-checked before use.
 *
 * Exactly-once: a query accepted by store_decide() gets one callback, from the
 * reply, the deadline, the disconnection or the shutdown, whichever comes
 * first.
 */
#include "store.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "crc16.h"
#include "log.h"
#include "scripts.h"
#include "sentinel.h"
#include "store_int.h"
#include "tls.h"
#include "util.h"

static int cmd_send(struct store_node *n, struct store_cmd *c, bool eval);
static void cmd_reply_cb(struct rconn *rc, void *reply, void *privdata);

const char *store_status_str(int st)
{
	static const char *const names[STORE_COUNT] = {"ok",       "error",   "timeout",
						       "down",     "busy",    "shutdown",
						       "breaker",  "overload"};

	if (st < 0 || st >= STORE_COUNT)
		return "?";
	return names[st];
}

const char *store_errclass_str(int ec)
{
	static const char *const names[STORE_EC_COUNT] = {"oom", "busy", "loading", "readonly",
							  "other"};

	if (ec < 0 || ec >= STORE_EC_COUNT)
		return "?";
	return names[ec];
}

/* ---- circuit breaker (per node) ---------------------------------------- */

void breaker_set(struct store_node *n, bool open)
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
	if (st != STORE_ERROR && st != STORE_DOWN)
		return;
	n->failures++;
	if (!n->breaker_open && n->failures >= s->breaker_failures) {
		snprintf(why, sizeof(why), "%u consecutive failures", n->failures);
		breaker_open_now(n, why);
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
static bool breaker_allows(struct store_node *n)
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
 * in its own loop turns meanwhile: see "Loop turns" below), AIMD style:
 *  - a reply within max(2 x the lowest latency seen, command timeout / 8),
 *    while at least half the limit is in use, raises the limit: by one per
 *    reply during slow start (doubling per round trip), by 1/limit once
 *    congestion was seen (one per round trip);
 *  - a wait longer than half the command timeout, or a command whose
 *    deadline passed after such a wait, cuts it by LIMIT_DECREASE, at most once per command
 *    timeout (one congestion event, one cut);
 *  - in between it holds.
 * It stays within [limit_floor(), max_concurrency]. The lowest latency is
 * re-learnt every RTT_WINDOW_S (Redis may have moved).
 */

/* Sets <n>'s limit to <v>, keeping the published sum right (0 when <n> goes away). */
void limit_set(struct store_node *n, double v)
{
	struct store *s = n->s;

	s->stats.concurrency_limit -= (uint64_t)n->limit;
	n->limit = v;
	s->stats.concurrency_limit += (uint64_t)n->limit;
}

/* Starts <n>'s limit afresh: the initial value, slow start, no latency known. */
void limit_reset(struct store_node *n)
{
	limit_set(n, LIMIT_INITIAL < n->s->max_concurrency ? LIMIT_INITIAL : n->s->max_concurrency);
	n->slow_start = true;
	n->rtt_min = n->rtt_min_next = 0;
	n->rtt_window_end = mono() + RTT_WINDOW_S;
}

/*
 * The lowest a limit goes: LIMIT_MIN, or one full script call when decisions
 * are batched (a single Redis). Below that each round trip carries fewer
 * decisions and Redis pays its per-call cost for fewer of them, lowering its
 * capacity exactly when it is short; latency that does not come from our own
 * commands (a Redis starved of CPU by its neighbours) would otherwise cut the
 * limit to almost nothing and the agent's goodput with it.
 */
static double limit_floor(const struct store *s)
{
	unsigned f = s->mode == MODE_SINGLE && s->batch_max > LIMIT_MIN ? s->batch_max : LIMIT_MIN;

	return f < s->max_concurrency ? f : s->max_concurrency;
}

/* Congestion at <n> (a missed deadline, a slow reply): cut the limit once per timeout. */
static void limit_decrease(struct store_node *n, double now)
{
	struct store *s = n->s;
	double floor = limit_floor(s);

	n->slow_start = false;
	if (now - n->last_decrease < s->command_timeout_ms / 1000.)
		return;
	n->last_decrease = now;
	limit_set(n, n->limit * LIMIT_DECREASE < floor ? floor : n->limit * LIMIT_DECREASE);
}

/* A reply from <n> took <rtt> seconds. */
void limit_sample(struct store_node *n, double rtt, double now)
{
	struct store *s = n->s;
	double timeout = s->command_timeout_ms / 1000., good, v;

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

/* True when <n> has room under its limit for one more command. */
static bool limit_room(const struct store_node *n)
{
	return n->out < (unsigned)n->limit;
}

/*
 * Loop turns. A reply read late because this agent was busy (a turn spent
 * decoding a thousand NOTIFYs, a process stopped and resumed) says nothing of
 * Redis. The store counts the time the loop spends in its turns (from the
 * check after a poll to the prepare before the next one): a command's wait is
 * the time since it was sent less the turns' time meanwhile, i.e. the time
 * the loop spent polling for it. The limit follows waits, not wall-clock
 * latencies, so a busy agent does not shrink its own concurrency and shed
 * what Redis could have decided (congestion collapse under a burst); a slow
 * Redis still shows: the loop is then idle, polling. Deadlines stay
 * wall-clock: they are promises to HAProxy.
 *
 * The store's timers (deadlines, housekeeping) have the lowest priority, so
 * the replies read in the same turn are seen first: a deadline or a stall
 * check that expired while the process was busy or stopped never fires for a
 * reply that is already there.
 */
static double store_busy(const struct store *s, double now)
{
	return s->busy + (s->turn_start > 0 ? now - s->turn_start : 0.);
}

/* Seconds <c> (sent) has waited for its reply with the loop polling, at <now>. */
double cmd_wait(const struct store_cmd *c, double now)
{
	double w = (now - c->sent_at) - (store_busy(c->s, now) - c->busy_at);

	return w > 0 ? w : 0.;
}

static void turn_begin_cb(struct ev_loop *loop, ev_check *w, int revents)
{
	struct store *s = w->data;

	(void)loop;
	(void)revents;
	s->turn_start = mono();
	/* the tick is always armed, so no poll lasts much longer than TICK_S: a
	 * longer gap is a process that was stopped or not scheduled, not one
	 * waiting for Redis */
	if (s->turn_end_at > 0 && s->turn_start - s->turn_end_at > 2 * TICK_S)
		s->busy += s->turn_start - s->turn_end_at;
}

static void turn_end_cb(struct ev_loop *loop, ev_prepare *w, int revents)
{
	struct store *s = w->data;

	(void)loop;
	(void)revents;
	s->turn_end_at = mono();
	if (s->turn_start > 0)
		s->busy += s->turn_end_at - s->turn_start;
	s->turn_start = 0;
}

/* ---- commands ------------------------------------------------------------ */

/*
 * A command is allocated per decision and freed at its answer. Those of up to
 * CMD_POOL_KEYS keys (nearly all) share one size and are kept for reuse: the
 * allocator served them from its slow path (over a kilobyte each, calloc()
 * bypasses glibc's per-thread cache), a visible share of the agent's time.
 */
#define CMD_POOL_KEYS 4
#define CMD_POOL_SIZE (offsetof(struct store_cmd, q) + offsetof(struct store_query, keys) + \
		       CMD_POOL_KEYS * STORE_KEY_MAX)
#define CMD_POOL_MAX  1024      /* kept at most: about 2 MB */

/*
 * A new command of <kind>; <qsize> bytes of room for its query (a decision:
 * STORE_QUERY_SIZE, up to its last key), 0 for the others.
 */
static struct store_cmd *cmd_new(struct store *s, enum cmd_kind kind, size_t qsize)
{
	size_t size = offsetof(struct store_cmd, q) + qsize;
	struct store_cmd *c;

	if (size <= CMD_POOL_SIZE && s->cmd_pool) {
		c = s->cmd_pool;
		s->cmd_pool = c->next_free;
		s->ncmd_pool--;
		pool_unpoison(c, CMD_POOL_SIZE);
	} else {
		c = xmalloc(size <= CMD_POOL_SIZE ? CMD_POOL_SIZE : size);
	}
	/* the query is the caller's to fill */
	memset(c, 0, offsetof(struct store_cmd, q));
	c->pooled = size <= CMD_POOL_SIZE;
	c->s = s;
	c->kind = kind;
	list_init(&c->node);
	list_init(&c->park);
	s->stats.pending++;
	return c;
}

/* Frees <c>, which is on no list any more and owed by no hiredis callback. */
void cmd_free(struct store_cmd *c)
{
	BUG_ON(c->parked || c->queued || c->batched);
	c->s->stats.pending--;
	free(c->hkey);
	free(c->hfield);
	if (c->pooled && !c->s->freeing && c->s->ncmd_pool < CMD_POOL_MAX) {
		struct store *s = c->s;

		c->next_free = s->cmd_pool;
		s->cmd_pool = c;
		s->ncmd_pool++;
		pool_poison(c, CMD_POOL_SIZE, &c->next_free);
		return;
	}
	free(c);
}

/* True while <c>'s caller has not been answered. */
bool cmd_live(const struct store_cmd *c)
{
	return c->cb || c->str_cb;
}

/*
 * Arms the command timer for the earliest deadline: the oldest waiting
 * command's or the oldest queued one's. Stalls are the tick's business.
 */
static void cmd_timer_arm(struct store *s)
{
	double now = mono(), at = 0;

	ev_timer_stop(s->loop, &s->cmd_timer);
	if (s->freeing || (list_empty(&s->waiting) && list_empty(&s->queued)))
		return;
	if (!list_empty(&s->waiting))
		at = LIST_ELEM(s->waiting.next, struct store_cmd, node)->deadline;
	if (!list_empty(&s->queued)) {
		double q = LIST_ELEM(s->queued.next, struct store_cmd, node)->deadline;

		if (list_empty(&s->waiting) || q < at)
			at = q;
	}
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
	if (st == STORE_OVERLOAD)
		s->stats.shed++;
	/* only what was sent says something about a node's health */
	if (c->at && c->sent_at > 0)
		breaker_record(c->at, st);
	if (cb)
		cb(st, r, c->arg);
	else
		str_cb(st, val, len, c->arg);
}

void cmd_answer(struct store_cmd *c, enum store_status st, const struct store_result *r)
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
void node_fail_parked(struct store_node *n, enum store_status st)
{
	while (!list_empty(&n->parked)) {
		struct store_cmd *c = LIST_ELEM(n->parked.next, struct store_cmd, park);

		cmd_unpark(c);
		cmd_answer(c, st, NULL);
		cmd_free(c);
	}
}

/* Sends what was parked at <n>, now ready. Invokes user callbacks only on failure. */
void node_send_parked(struct store_node *n)
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

/* Takes <c> off its node's queue: it is ours to send or free. */
static void cmd_unqueue(struct store_cmd *c)
{
	if (!c->queued)
		return;
	list_del(&c->park);
	c->queued = false;
	c->at->nqueued--;
	c->s->stats.queued--;
}

/* Answers every command queued at <n> with <st> and frees them. Invokes user callbacks. */
void node_fail_queue(struct store_node *n, enum store_status st)
{
	while (!list_empty(&n->queue)) {
		struct store_cmd *c = LIST_ELEM(n->queue.next, struct store_cmd, park);

		cmd_unqueue(c);
		cmd_answer(c, st, NULL);
		cmd_free(c);
	}
}

/*
 * <at>, or the time its caller must be answered by when that comes first (a
 * decision whose NOTIFY HAProxy gives up on sooner: answered by the failure
 * ladder while HAProxy still listens, rather than not at all).
 */
static double cmd_bound(const struct store_cmd *c, double at)
{
	if (c->kind == CMD_DECIDE && c->q.answer_by > 0 && c->q.answer_by < at)
		return c->q.answer_by;
	return at;
}

/*
 * Sends the new command <c> on <n> now and starts its deadline, from now.
 * Returns 0 or -1 (<c> untouched). Never invokes user callbacks.
 */
static int cmd_start(struct store_node *n, struct store_cmd *c)
{
	struct store *s = n->s;

	if (cmd_send(n, c, false) < 0)
		return -1;
	c->deadline = cmd_bound(c, c->sent_at + s->command_timeout_ms / 1000.);
	/* the timer follows the earliest deadline: arm it when this one is the
	 * only waiting command (a queued one may have armed it earlier: fine) */
	list_append(&s->waiting, &c->node);
	if (s->waiting.next == &c->node)
		cmd_timer_arm(s);
	return 0;
}

/*
 * Sends what was queued at <n> while it has room under its limit, oldest
 * first. Invokes user callbacks (a send that fails is answered DOWN).
 */
void node_send_queue(struct store_node *n)
{
	while (!list_empty(&n->queue) && n->state == ND_READY && limit_room(n)) {
		struct store_cmd *c = LIST_ELEM(n->queue.next, struct store_cmd, park);

		cmd_unqueue(c);
		list_del(&c->node);
		if (cmd_start(n, c) < 0) {
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
int cmd_dispatch_nocb(struct store_node *n, struct store_cmd *c)
{
	if (n->state == ND_READY)
		return cmd_send(n, c, c->retried);
	if (n->state != ND_CONNECTING && n->state != ND_LOADING)
		return -1;
	c->at = n;
	c->parked = true;
	/* not on a connection: its answer says nothing of <n>'s health (a failed
	 * connect must not count once per command parked here) */
	c->sent_at = 0;
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
		/* sent and unanswered in time: congestion at that node, unless
		 * the time went to this agent's own turns */
		if (!parked && c->at && cmd_wait(c, now) >= s->command_timeout_ms / 2000.)
			limit_decrease(c->at, now);
		cmd_answer(c, STORE_TIMEOUT, NULL);
		if (parked)
			cmd_free(c);
	}
	/* queued too long: shed, the excess only */
	while (!list_empty(&s->queued)) {
		struct store_cmd *c = LIST_ELEM(s->queued.next, struct store_cmd, node);

		if (c->deadline > now)
			break;
		cmd_unqueue(c);
		cmd_answer(c, STORE_OVERLOAD, NULL);
		cmd_free(c);
	}
	cmd_timer_arm(s);
}

/* Bounds of the integers a script reply may carry: beyond, the reply is nonsense. */
#define REPLY_US_MAX     ((long long)1 << 52)  /* a Redis time: ~142 years in us */
#define REPLY_MS_MAX     ((long long)1 << 40)  /* a duration: ~34 years in ms */
#define REPLY_TOKENS_MAX ((long long)1 << 32)  /* tokens left: x a rate (< 2^30) fits */

/* True when <e> is an integer within [lo, hi]. */
static bool int_in(const redisReply *e, long long lo, long long hi)
{
	return e->type == REDIS_REPLY_INTEGER && e->integer >= lo && e->integer <= hi;
}

/*
 * Parses the script's flat integer array, the answer to <q>, into <r>. Every
 * integer is checked against its range (flags 0 or 1, times and durations
 * non-negative and bounded, a grant within what was asked), so nothing the
 * agent computes from it can overflow. Returns 0 or -1.
 */
static int parse_flat(const redisReply *rep, size_t n, int64_t want, struct store_result *r)
{
	bool batch = want > 0;
	size_t i;

	if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 3 + 4 * n + (batch ? 2 : 0))
		return -1;
	if (!int_in(rep->element[0], 0, 1) || !int_in(rep->element[1], (long long)n, (long long)n) ||
	    !int_in(rep->element[2], 0, REPLY_US_MAX))
		return -1;
	r->allowed = rep->element[0]->integer == 1;
	r->n = n;
	r->now_us = rep->element[2]->integer;
	for (i = 0; i < n; i++) {
		redisReply **e = rep->element + 3 + 4 * i;

		if (!int_in(e[0], 0, 1) || !int_in(e[1], -REPLY_TOKENS_MAX, REPLY_TOKENS_MAX) ||
		    !int_in(e[2], 0, REPLY_MS_MAX) || !int_in(e[3], 0, REPLY_MS_MAX))
			return -1;
		r->v[i].allowed = e[0]->integer == 1;
		r->v[i].remaining = e[1]->integer;
		r->v[i].retry_ms = e[2]->integer;
		r->v[i].reset_ms = e[3]->integer;
	}
	r->granted = r->allowed ? 1 : 0;
	r->lease_ms = 0;
	if (batch) {
		if (!int_in(rep->element[3 + 4 * n], 0, want) ||
		    !int_in(rep->element[4 + 4 * n], 0, REPLY_MS_MAX))
			return -1;
		r->granted = rep->element[3 + 4 * n]->integer;
		r->lease_ms = rep->element[4 + 4 * n]->integer;
	}
	r->cand_ok = r->cand_allowed = false;
	return 0;
}

/*
 * Parses the answer to <q> into <r>: the script's flat array, or for a query
 * with a candidate the multi form's pair { own decision, candidate's }. The
 * candidate's element may be an error of its own (r->cand_ok stays false);
 * an error in the first is the caller's (cmd_reply()). Returns 0 or -1.
 */
static int parse_result(const redisReply *rep, const struct store_query *q,
			struct store_result *r)
{
	struct store_result cr;
	size_t i, ne = q->n - q->ncand;

	if (!q->ncand)
		return parse_flat(rep, q->n, q->want, r);
	if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
	    parse_flat(rep->element[0], ne, 0, r) < 0)
		return -1;
	r->n = q->n;
	if (rep->element[1]->type == REDIS_REPLY_ERROR)
		return 0;
	if (parse_flat(rep->element[1], q->ncand, 0, &cr) < 0)
		return -1;
	for (i = 0; i < q->ncand; i++)
		r->v[ne + i] = cr.v[i];
	r->cand_ok = true;
	r->cand_allowed = cr.allowed;
	return 0;
}

/* ---- sending ------------------------------------------------------------- */

/* Appends the string <str> of <len> bytes to <av>. */
void argv_str(struct argv_buf *av, const char *str, size_t len)
{
	av->argv[av->argc] = str;
	av->lens[av->argc++] = len;
}

/* Appends the number <v>, formatted into <av>'s next number slot. */
void argv_num(struct argv_buf *av, int64_t v)
{
	av->argv[av->argc] = av->nums[av->nk];
	av->lens[av->argc++] = fmt_i64(av->nums[av->nk++], v);
}

/* Appends the keys of <q>. */
void query_push_keys(struct argv_buf *av, const struct store_query *q)
{
	size_t i;

	for (i = 0; i < q->n; i++)
		argv_str(av, q->keys[i], strlen(q->keys[i]));
}

/* Appends the 5 arguments of each of limits <from> to <to> (excluded) of <q>. */
static void push_limits(struct argv_buf *av, const struct store_query *q, size_t from, size_t to)
{
	size_t i;

	for (i = from; i < to; i++) {
		argv_num(av, q->params[i].alg);
		argv_num(av, q->params[i].a);
		argv_num(av, q->params[i].b);
		argv_num(av, q->params[i].shadow ? 1 : 0);
		argv_num(av, q->cost[i]);
	}
}

/*
 * Appends the script arguments of <q> after its keys: 5 per limit (alg, a, b,
 * shadow, cost), then, for a batch, want, mode, lease lifetime and fewest units
 * (lua/decide.lua). QUERY_ARGS(q) of them.
 */
void query_push_args(struct argv_buf *av, const struct store_query *q)
{
	push_limits(av, q, 0, q->n);
	if (q->want > 0) {
		argv_num(av, q->want);
		argv_num(av, q->batch);
		argv_num(av, q->lease_us);
		argv_num(av, q->min_units > 1 ? q->min_units : 1);
	}
}


/*
 * Appends <q> as QUERY_DECISIONS(q) decisions of the multi form, each as
 * "<limits> <extra> <arguments>": its own, then its candidate policy's (the
 * last ncand limits; a query with a candidate is never a batch).
 */
void query_push_decisions(struct argv_buf *av, const struct store_query *q)
{
	size_t ne = q->n - q->ncand;

	argv_num(av, (int64_t)ne);
	argv_num(av, q->want > 0 ? 4 : 0);
	if (!q->ncand) {
		query_push_args(av, q);
		return;
	}
	push_limits(av, q, 0, ne);
	argv_num(av, (int64_t)q->ncand);
	argv_num(av, 0);
	push_limits(av, q, ne, q->n);
}

/*
 * Writes <c> into <n>'s connection buffer: EVALSHA (or EVAL with the body when
 * <eval>), or HGET; preceded by ASKING after an ASK. Keys and numbers go as
 * separate argv entries: untrusted bytes never meet a format string. Returns
 * REDIS_OK or REDIS_ERR. Never invokes user callbacks.
 */
int cmd_write(struct store_node *n, struct store_cmd *c, bool eval)
{
	struct store *s = n->s;
	const char *argv[3 + STORE_MAX_LIMITS * 6 + 4 + 6];
	size_t lens[ARRAY_SIZE(argv)];
	char nums[ARRAY_SIZE(argv)][24];
	char nkeys[16];
	struct argv_buf av;
	int argc;

	if (c->asking) {
		const char *asking[1] = {"ASKING"};

		if (rconn_command(n->rc, NULL, NULL, 1, asking, NULL) != 0)
			return REDIS_ERR;
	}
	if (c->kind == CMD_HGET) {
		const char *hget[3] = {c->hfield ? "HGET" : "HGETALL", c->hkey, c->hfield};

		return rconn_command(n->rc, cmd_reply_cb, c, c->hfield ? 3 : 2, hget, NULL);
	}
	if (c->kind == CMD_HEARTBEAT) {
		const char *hb[6] = {"EVAL", script_heartbeat, "1", c->hkey, c->hfield, nkeys};
		size_t hbl[6] = {4, script_heartbeat_len, 1, strlen(c->hkey), strlen(c->hfield), 0};

		snprintf(nkeys, sizeof(nkeys), "%u", c->window_ms);
		hbl[5] = strlen(nkeys);
		return rconn_command(n->rc, cmd_reply_cb, c, 6, hb, hbl);
	}

	av.argv = argv;
	av.lens = lens;
	av.nums = nums;
	av.argc = av.nk = 0;
	argv_str(&av, eval ? "EVAL" : "EVALSHA", eval ? 4 : 7);
	argv_str(&av, eval ? script_ratelimit : s->sha, eval ? script_ratelimit_len : strlen(s->sha));
	argv_num(&av, (int64_t)c->q.n);
	query_push_keys(&av, &c->q);
	if (c->q.ncand) {
		/* with its candidate: two decisions, the multi form */
		argv_str(&av, "M", 1);
		argv_num(&av, 2);
		query_push_decisions(&av, &c->q);
	} else {
		query_push_args(&av, &c->q);
	}
	argc = av.argc;
	return rconn_command(n->rc, cmd_reply_cb, c, argc, argv, lens);
}

/*
 * Sends <c> on <n>'s connection: written into its buffer now, or, for a
 * decision to a single Redis, added to the node's batch (store_batch.c); the
 * flusher sends both before the loop polls. Returns 0 or -1. Never invokes
 * user callbacks.
 */
static int cmd_send(struct store_node *n, struct store_cmd *c, bool eval)
{
	struct store *s = n->s;

	if (!n->rc || n->state != ND_READY)
		return -1;
	if (batch_wants(n, c, eval))
		batch_add(n, c);
	else if (cmd_write(n, c, eval) != REDIS_OK)
		return -1;
	if (!n->flush_pending) {
		n->flush_pending = true;
		list_append(&s->flushq, &n->flush_node);
		if (!ev_is_active(&s->flusher))
			ev_prepare_start(s->loop, &s->flusher);
	}
	c->sent_at = mono();
	c->busy_at = store_busy(s, c->sent_at);
	if (!n->out++)
		n->last_progress = c->sent_at;
	c->at = n;
	s->stats.sent++;
	return 0;
}

/*
 * Before the loop polls: writes what every node's connection was given in
 * this iteration, one write() per node for all its commands. hiredis' libev
 * adapter would start the write watcher for each (an epoll_ctl), wait for the
 * next poll to say writable, write, and stop the watcher again (another
 * epoll_ctl); written here, start and stop cancel out before libev applies
 * them, and the commands leave one loop iteration earlier. What the socket
 * does not take is left to the write watcher, as before.
 */
static void flusher_cb(struct ev_loop *loop, ev_prepare *w, int revents)
{
	struct store *s = w->data;

	while (!list_empty(&s->flushq)) {
		struct store_node *n = LIST_ELEM(s->flushq.next, struct store_node, flush_node);

		list_del(&n->flush_node);
		n->flush_pending = false;
		batch_flush(n);
		if (n->rc && n->state == ND_READY)
			rconn_flush(n->rc);
	}
	ev_prepare_stop(loop, w);
}

/*
 * An array of strings <rep> (HGETALL) as one allocated buffer of <*len> bytes:
 * each element as its length (uint32_t, host order) then its bytes. NULL for
 * any other reply.
 */
static char *flatten_strings(const redisReply *rep, size_t *len)
{
	size_t i, n = 0;
	char *buf, *p;

	for (i = 0; rep->type == REDIS_REPLY_ARRAY && i < rep->elements; i++) {
		if (rep->element[i]->type != REDIS_REPLY_STRING || rep->element[i]->len > UINT32_MAX)
			return NULL;
		n += 4 + rep->element[i]->len;
	}
	if (rep->type != REDIS_REPLY_ARRAY)
		return NULL;
	p = buf = xmalloc(n + 1);
	for (i = 0; i < rep->elements; i++, p += 4) {
		uint32_t l = (uint32_t)rep->element[i]->len;

		memcpy(p, &l, 4);
		memcpy(p + 4, rep->element[i]->str, l);
		p += l;
	}
	*len = n;
	return buf;
}

/*
 * The reply <rep> (NULL: connection gone) of node <n> to the command <c>:
 * answers its caller unless the deadline did, frees it unless re-sent.
 * Invokes user callbacks.
 */
void cmd_reply(struct store_node *n, struct store_cmd *c, const redisReply *rep)
{
	struct store *s = n->s;
	struct store_result res;

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
	/* with a candidate, an error of the query's own decision is the query's */
	if (c->kind == CMD_DECIDE && c->q.ncand && rep->type == REDIS_REPLY_ARRAY &&
	    rep->elements == 2 && rep->element[0]->type == REDIS_REPLY_ERROR)
		rep = rep->element[0];
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
		node_error(n, error_class(rep->str));
		cmd_answer(c, STORE_ERROR, NULL);
	} else if (c->kind == CMD_HEARTBEAT) {
		char num[24];

		if (int_in(rep, 0, INT32_MAX)) {
			s->stats.replies++;
			snprintf(num, sizeof(num), "%lld", (long long)rep->integer);
			cmd_answer_full(c, STORE_OK, NULL, num, strlen(num));
		} else {
			store_log_trouble(n, "heartbeat", "bad reply");
			node_error(n, STORE_EC_OTHER);
			cmd_answer(c, STORE_ERROR, NULL);
		}
	} else if (c->kind == CMD_HGET && !c->hfield) {
		size_t len;
		char *all = flatten_strings(rep, &len);

		if (all) {
			s->stats.replies++;
			cmd_answer_full(c, STORE_OK, NULL, all, len);
		} else {
			store_log_trouble(n, "lookup", "bad reply");
			node_error(n, STORE_EC_OTHER);
			cmd_answer(c, STORE_ERROR, NULL);
		}
		free(all);
	} else if (c->kind == CMD_HGET) {
		if (rep->type == REDIS_REPLY_STRING) {
			s->stats.replies++;
			cmd_answer_full(c, STORE_OK, NULL, rep->str, rep->len);
		} else if (rep->type == REDIS_REPLY_NIL) {
			s->stats.replies++;
			cmd_answer_full(c, STORE_OK, NULL, NULL, 0);
		} else {
			store_log_trouble(n, "lookup", "bad reply");
			node_error(n, STORE_EC_OTHER);
			cmd_answer(c, STORE_ERROR, NULL);
		}
	} else if (parse_result(rep, &c->q, &res) < 0) {
		store_log_trouble(n, "reply", "unexpected reply shape");
		node_error(n, STORE_EC_OTHER);
		cmd_answer(c, STORE_ERROR, NULL);
	} else {
		s->stats.replies++;
		cmd_answer(c, STORE_OK, &res);
	}
	cmd_free(c);
}

/*
 * hiredis calls this once per command sent: with its reply, or NULL when the
 * connection is gone. A reply in time is a latency sample for the node's
 * limit, and the room it frees lets queued commands go.
 */
static void cmd_reply_cb(struct rconn *rc, void *reply, void *privdata)
{
	struct store_cmd *c = privdata;
	struct store_node *n = rconn_data(rc);
	redisReply *rep = reply;
	double now;

	n->out--;
	if (rep) {
		now = mono();
		n->last_progress = now;
		if (cmd_live(c) && c->sent_at > 0)
			limit_sample(n, cmd_wait(c, now), now);
	}
	cmd_reply(n, c, rep);
	if (rep && n->rc == rc && !n->s->freeing)
		node_send_queue(n);
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

		if (!(n->rc && n->state == ND_READY && n->out && now - n->last_progress >= s->stall_s)) {
			n->stall_seen = false;
		} else if (!n->stall_seen) {
			/* confirmed by the next tick, after a poll: an agent resumed
			 * from SIGSTOP runs its overdue timers in a loop turn whose
			 * poll was interrupted (EINTR), before it read the replies
			 * waiting in its sockets */
			n->stall_seen = true;
		} else {
			n->stall_seen = false;
			store_log_trouble(n, "stalled", "no reply in time, reconnecting");
			breaker_trip(n, "stalled, no reply in time");
			node_close(n);
			node_lost(n);
		}
		if (n->retired && !n->out && list_empty(&n->parked) && list_empty(&n->queue) &&
		    s->refresh_node != n)
			node_free(n);
		else if (n->named)
			node_ttl_check(n, now);
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
static struct store_node *store_admit(struct store *s, const char *key, size_t len,
				      enum store_status *st)
{
	/* a single Redis owns every slot: no key is hashed */
	struct store_node *n = s->slots[s->mode == MODE_SINGLE ? 0 : crc16_key_slot(key, len)];

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

/*
 * Sends the new command <c> to <n> now if <n> has room under its limit and
 * nothing queued (or <c> is the probe of its breaker), its deadline starting
 * now; otherwise queues it for at most the queue budget. Returns 0 or
 * -STORE_DOWN (<c> freed). Never invokes user callbacks.
 */
static int store_submit(struct store_node *n, struct store_cmd *c)
{
	struct store *s = n->s;

	if (n->probing || (list_empty(&n->queue) && limit_room(n))) {
		if (cmd_start(n, c) == 0)
			return 0;
		n->probing = false;
		cmd_free(c);
		s->stats.failed[STORE_DOWN]++;
		return -STORE_DOWN;
	}
	c->at = n;
	c->queued = true;
	c->deadline = cmd_bound(c, mono() + s->queue_s);
	list_append(&n->queue, &c->park);
	list_append(&s->queued, &c->node);
	n->nqueued++;
	s->stats.queued++;
	if (s->queued.next == &c->node)
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

	n = store_admit(s, q->keys[0], strnlen(q->keys[0], STORE_KEY_MAX), &st);
	if (!n) {
		s->stats.failed[st]++;
		return -(int)st;
	}
	BUG_ON(q->n < 1 || q->n > STORE_MAX_LIMITS);
	if (q->answer_by > 0 && q->answer_by <= mono()) {
		/* too late already: the excess of a backlog, shed at once */
		s->stats.failed[STORE_OVERLOAD]++;
		s->stats.shed++;
		return -(int)STORE_OVERLOAD;
	}
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

	n = store_admit(s, key, strlen(key), &st);
	if (!n) {
		s->stats.failed[st]++;
		return -(int)st;
	}
	c = cmd_new(s, kind, 0);
	c->str_cb = cb;
	c->arg = arg;
	c->hkey = xstrdup(key);
	c->hfield = field ? xstrdup(field) : NULL;
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
 * Reads the whole hash <key> (HGETALL): <cb> gets every field and value in
 * turn, each as a uint32_t length (host order) and its bytes; an empty hash is
 * a zero length. Same contract as store_hget().
 */
int store_hgetall(struct store *s, const char *key, store_str_fn cb, void *arg)
{
	return submit_str(s, CMD_HGET, key, NULL, 0, cb, arg);
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

/*
 * Describes in <buf> what is wrong with the nodes that own slots: an open
 * breaker, error replies within the last TROUBLE_S. Returns true (and an
 * empty <buf>) when nothing is.
 */
bool store_health(const struct store *s, char *buf, size_t len)
{
	const struct list *l;
	double now = mono();
	size_t off = 0;
	int w;

	if (len)
		buf[0] = 0;
	for (l = s->nodes.next; l != &s->nodes; l = l->next) {
		const struct store_node *n = LIST_ELEM(l, struct store_node, link);
		bool err = n->err_class >= 0 && now - n->err_at < TROUBLE_S;
		char cls[16];
		size_t i;

		if ((!n->nslots && !n->seed) || (!err && !n->breaker_open))
			continue;
		snprintf(cls, sizeof(cls), "%s", store_errclass_str(n->err_class));
		for (i = 0; cls[i]; i++)
			cls[i] = (char)(cls[i] - 'a' + 'A');
		w = snprintf(buf + off, len > off ? len - off : 0, "%sredis %s%s%s%s%s",
			     off ? ", " : "", n->name, err ? " " : "",
			     err ? (n->err_class == STORE_EC_OTHER ? "errors" : cls) : "",
			     err && n->breaker_open ? "," : "", n->breaker_open ? " breaker open" : "");
		if (w > 0)
			off += (size_t)w;
		if (off >= len)
			break;
	}
	return off == 0;
}

/*
 * Replaces the credentials (ACL <user> or NULL, <password> or NULL) that every
 * connection opened from now on authenticates with; connections already
 * authenticated stay as they are (Redis keeps them when a password changes).
 */
void store_set_auth(struct store *s, const char *user, const char *password)
{
	free(s->user);
	free(s->password);
	s->user = user && *user ? xstrdup(user) : NULL;
	s->password = password && *password ? xstrdup(password) : NULL;
}

/*
 * Replaces the TLS settings (a reference to each is taken) that connections
 * opened from now on use, to Redis and to the Sentinels; connections already
 * up keep theirs. A reload passes the contexts it built: certificates and keys
 * renewed on disk are used from the next connection.
 */
void store_set_tls(struct store *s, struct tls_ctx *tls, struct tls_ctx *sentinel_tls)
{
	tls_ctx_free(s->tls);
	s->tls = tls_ctx_ref(tls);
	if (s->sentinel)
		sentinel_set_tls(s->sentinel, sentinel_tls);
}

const struct store_stats *store_stats(const struct store *s)
{
	return &s->stats;
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

	if (opts->nsentinels) {
		memset(&ep, 0, sizeof(ep));
		snprintf(ep.host, sizeof(ep.host), "%s", opts->sentinel_master);
		ep.sentinel = true;
	} else if (seed_endpoint(opts->address, &ep, err, errlen) < 0) {
		return -1;
	}
	s = xcalloc(1, sizeof(*s));
	s->loop = loop;
	s->user = opts->user && *opts->user ? xstrdup(opts->user) : NULL;
	s->password = opts->password && *opts->password ? xstrdup(opts->password) : NULL;
	s->connect_timeout_ms = opts->connect_timeout_ms ? opts->connect_timeout_ms : 200;
	s->command_timeout_ms = opts->command_timeout_ms ? opts->command_timeout_ms : 5;
	s->max_pending = opts->max_pending ? opts->max_pending : 10000;
	s->resolver_opts.nameservers = opts->nameservers && *opts->nameservers
					       ? xstrdup(opts->nameservers) : NULL;
	s->resolver_opts.timeout_ms = opts->resolve_timeout_ms;
	s->breaker_failures = opts->breaker_failures ? opts->breaker_failures : 5;
	s->breaker_cooldown_s = (opts->breaker_cooldown_ms ? opts->breaker_cooldown_ms : 500) / 1000.;
	s->queue_s = (opts->queue_timeout_ms ? opts->queue_timeout_ms : s->command_timeout_ms) / 1000.;
	s->max_concurrency = opts->max_concurrency ? opts->max_concurrency : 256;
	if (s->max_concurrency < LIMIT_MIN)
		s->max_concurrency = LIMIT_MIN;
	s->batch_max = opts->batch_max ? opts->batch_max : 32;
	if (s->batch_max > STORE_BATCH_MAX)
		s->batch_max = STORE_BATCH_MAX;
	/* a stall is 20 command timeouts, at least 1 s and at most 5 s */
	s->stall_s = s->command_timeout_ms * 20 / 1000.;
	if (s->stall_s < 1.)
		s->stall_s = 1.;
	if (s->stall_s > 5.)
		s->stall_s = 5.;
	list_init(&s->nodes);
	list_init(&s->waiting);
	list_init(&s->queued);
	list_init(&s->flushq);
	ev_prepare_init(&s->flusher, flusher_cb);
	s->flusher.data = s;
	s->slots = xcalloc(CRC16_SLOTS, sizeof(*s->slots));
	s->scratch = xcalloc(CRC16_SLOTS, sizeof(*s->scratch));
	ev_timer_init(&s->cmd_timer, cmd_timer_cb, 0., 0.);
	ev_set_priority(&s->cmd_timer, EV_MINPRI);
	ev_timer_init(&s->tick, tick_cb, TICK_S, TICK_S);
	ev_set_priority(&s->tick, EV_MINPRI);
	ev_timer_start(loop, &s->tick);
	ev_check_init(&s->turn_begin, turn_begin_cb);
	s->turn_begin.data = s;
	ev_set_priority(&s->turn_begin, EV_MAXPRI);
	ev_check_start(loop, &s->turn_begin);
	ev_unref(loop);                 /* bookkeeping: keeps no loop alive */
	ev_prepare_init(&s->turn_end, turn_end_cb);
	s->turn_end.data = s;
	ev_set_priority(&s->turn_end, EV_MINPRI);
	ev_prepare_start(loop, &s->turn_end);
	ev_unref(loop);
	if (opts->nsentinels) {
		struct sentinel_opts so = {
			.addrs = opts->sentinels, .naddrs = opts->nsentinels,
			.master = opts->sentinel_master, .user = opts->sentinel_user,
			.password = opts->sentinel_password, .timeout_ms = s->connect_timeout_ms,
			.tls = opts->sentinel_tls, .resolver = &s->resolver_opts,
		};

		s->sentinel = sentinel_new(loop, &so, node_master_switched, s);
	}
	s->tls = tls_ctx_ref(opts->tls);
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
	ev_prepare_stop(s->loop, &s->flusher);
	ev_ref(s->loop);
	ev_check_stop(s->loop, &s->turn_begin);
	ev_ref(s->loop);
	ev_prepare_stop(s->loop, &s->turn_end);
	/* calls every pending reply callback with NULL, answering waiters */
	for (l = s->nodes.next; l != &s->nodes; l = l->next) {
		struct store_node *n = LIST_ELEM(l, struct store_node, link);

		ev_timer_stop(s->loop, &n->conn_timer);
		node_close(n);
	}
	for (l = s->nodes.next; l != &s->nodes; l = l->next) {
		node_fail_parked(LIST_ELEM(l, struct store_node, link), STORE_SHUTDOWN);
		node_fail_queue(LIST_ELEM(l, struct store_node, link), STORE_SHUTDOWN);
	}
	while (!list_empty(&s->waiting))
		cmd_answer(LIST_ELEM(s->waiting.next, struct store_cmd, node), STORE_SHUTDOWN, NULL);
	for (i = 0; i < CRC16_SLOTS; i++)
		slot_set(s, i, NULL);
	list_for_each_safe(l, tmp, &s->nodes)
		node_free(LIST_ELEM(l, struct store_node, link));
	reply_cache_free();
	while (s->cmd_pool) {
		struct store_cmd *c = s->cmd_pool;

		s->cmd_pool = c->next_free;
		pool_unpoison(c, CMD_POOL_SIZE);
		free(c);
	}
	sentinel_free(s->sentinel);
	tls_ctx_free(s->tls);
	resolver_free(s->resolver);
	free((char *)s->resolver_opts.nameservers);
	free(s->slots);
	free(s->scratch);
	free(s->user);
	free(s->password);
	free(s);
}
