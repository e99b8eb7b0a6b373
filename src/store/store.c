/* SPDX-License-Identifier: MIT */
/*
 * Redis store on the agent's own transport (rconn.c: a socket, TLS, hiredis'
 * reply reader): a single Redis, a master under Sentinel, or a Redis Cluster
 * found from any one of its nodes.
 *
 * LAYERS
 * The store is a stack; each file calls only the layers below it, and what
 * must come back up goes through a callback the lower layer declares:
 *
 *   store.c          the API (store.h): admission and routing by slot, the
 *                    housekeeping tick, the flusher, store_new()/store_free();
 *                    registers the callbacks below. Calls every layer.
 *   store_batch.c    several decisions in one script call (a single Redis);
 *   store_cluster.c  the mode, slot map, CLUSTER SLOTS, MOVED/ASK. These two
 *                    are beside each other; both call the command and node
 *                    layers.
 *   store_cmd.c      commands: pool, deadlines, loop turns, queue under the
 *                    node's limit, parked commands, RESP written, replies
 *                    parsed, NOSCRIPT; a decision for a single Redis put in
 *                    its node's batch. Calls the node layer. Only replies go
 *                    up, through struct cmd_ops: redirect (an error reply:
 *                    cmd_redirect()), refresh (CLUSTERDOWN: refresh_request()).
 *   store_node.c     one Redis: connect, AUTH, ROLE, SCRIPT LOAD, reconnect,
 *                    names, Sentinels; breaker, error classes, adaptive limit.
 *                    Calls the transport, resolve.c, sentinel.c. Goes up
 *                    through struct node_ops: ready (parked commands sent, the
 *                    topology asked), closing (the batch answered), lost
 *                    (parked and queued commands answered, the topology asked).
 *   store_int.h      the data the layers share: nodes, commands, the store;
 *   store_types.h    the API's types (store.h includes them); no functions.
 *   store_reply.c    the reply objects the transport's reader builds.
 *   store_parse.c    the script's replies read into a result (store_cmd.c);
 *   reply_parse.c    MOVED/ASK, CLUSTER SLOTS entries, ROLE, a Sentinel's
 *                    answer read. Both only read: they act on nothing.
 *
 * A lower layer may read fields an upper one keeps (the mode and a node's
 * slots for the floor of its limit and its reconnect backoff), never call it.
 *
 * DESIGN
 * Nodes. Every Redis we talk to is a node with its own connection, state,
 * connect deadline, reconnect backoff, circuit breaker and stall detection.
 * The configured address is the seed node; it is never dropped.
 *
 * Node states: DISCONNECTED -> CONNECTING -> LOADING -> READY, back to
 * DISCONNECTED on any failure, and a reconnect timer with a capped backoff.
 *  - CONNECTING: our connect timer bounds it (the lookup of a name or the
 *    Sentinels' answer included); on expiry the connection is freed and we
 *    retry later.
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
 * Admission: each node has an adaptive concurrency limit (see limit_sample(), store_node.c)
 * on the commands out on its connection. A new command is sent at once when
 * its node has room and nothing queued; otherwise it joins the node's FIFO
 * queue and the store's FIFO of queue deadlines (queue_s after it arrived).
 * Every reply frees room and sends the oldest queued commands. A command
 * still queued at its queue deadline is shed: answered STORE_OVERLOAD and
 * freed. The probe of an open breaker skips the queue.
 *
 * Deadlines: one budget, HAProxy's. A decision whose caller must be answered
 * by a time (its query's answer_by: spoe_timeout is known, HAProxy gives up
 * on the NOTIFY soon after) has that time as its deadline, however long ago
 * it was sent: a reply late for command_timeout_ms but in HAProxy's budget is
 * still an exact answer. Any other command (no answer_by: a lookup, a
 * heartbeat, a lease refreshed with nobody waiting) has command_timeout_ms
 * from when it is sent. The queue deadline is queue_s after a command
 * arrived, or its answer_by if that comes first, and a decision submitted
 * past its answer_by is shed at once. Every sent command joins one of two
 * FIFOs with its deadline: <waiting_by> (answer_by deadlines, which follow the
 * NOTIFYs' arrival) or <waiting> (all the same timeout from their send); one
 * timer tracks the earliest of the heads of both and of the queue. So each
 * FIFO's head is (nearly) always its oldest deadline whichever node the
 * command went to, even after redirections (which keep the deadline); one out
 * of order is answered at most one timeout late. When it
 * expires the caller is answered STORE_TIMEOUT at once, the node's limit is
 * cut (when the time went to waiting for Redis, not to this agent's turns),
 * and the command is marked abandoned: its connection still owes its callback, which
 * later frees it without calling anyone ("late" replies); a parked command is
 * freed at once.
 *
 * Housekeeping tick (TICK_S): stalls (commands out on a node and nothing back
 * for stall_s, seen by two ticks in a row: the breaker opens, the connection is dropped, its waiters
 * answered DOWN, a reconnect starts), retired nodes closed once idle, refresh
 * schedule.
 * A connection is freed (node_close()) only from timers and from the answers
 * of the resolver and the Sentinels, never from inside one of its own
 * callbacks; there it is asked to close (rconn_disconnect()), which the
 * transport carries out when the callback returns.
 *
 * Circuit breaker, per node: <breaker_failures> consecutive Redis failures of
 * one node (error replies to queries sent to it; connections refused, failed
 * or lost, one failure each whatever the commands they carried: node_down();
 * a missed deadline is congestion, handled by the limit, not a failure) stop
 * queries to that
 * node (BREAKER) for a cool-down; a stall opens it at once; then one query
 * goes through as a probe; its success closes the breaker. A node that
 * answers with a redirection is healthy. Error replies are counted by class
 * (OOM, BUSY, LOADING, READONLY/MASTERDOWN, other) and the last one is kept
 * for store_health().
 *
 * Health: a node is down from a connection that failed or was lost
 * (node_down(): the time and the reason in words) until one is ready again.
 * store_health() and store_node_stats() tell it, with error replies and an
 * open breaker, in the same words to /ready, the status page and the metrics.
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
#include <sys/timerfd.h>
#include <unistd.h>

#include "crc16.h"
#include "log.h"
#include "sentinel.h"
#include "store_batch.h"
#include "store_cluster.h"
#include "store_cmd.h"
#include "store_int.h"
#include "store_node.h"
#include "store_reply.h"
#include "tls.h"
#include "util.h"

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
							  "other", "protocol"};

	if (ec < 0 || ec >= STORE_EC_COUNT)
		return "?";
	return names[ec];
}

/* ---- the layers wired ---------------------------------------------------- */

/* node_ops.ready: <n> loaded the script. */
static void on_node_ready(struct store_node *n)
{
	struct store *s = n->s;

	/* the seed of a single (or unknown) Redis: is it a cluster now? */
	if (n->seed && s->mode != MODE_CLUSTER)
		refresh_request(s);
	else
		refresh_kick(s); /* one may have waited for a ready node */
	/* what waited at the seed before the mode was known goes once it is
	 * (store_admit(), node_route_parked()) */
	if (!(n == s->seed && s->mode == MODE_UNKNOWN))
		node_send_parked(n);
}

/* node_ops.lost: <n>'s connection is gone, a reconnect scheduled. */
static void on_node_lost(struct store_node *n)
{
	struct store *s = n->s;

	if (n->nslots && s->mode == MODE_CLUSTER)
		refresh_request(s);
	node_fail_parked(n, STORE_DOWN);
	node_fail_queue(n, STORE_DOWN);
}

static const struct node_ops node_ops = {
	.ready = on_node_ready,
	.closing = batch_fail,
	.lost = on_node_lost,
};

static const struct cmd_ops cmd_ops = {
	.redirect = cmd_redirect,
	.refresh = refresh_request,
};

/* ---- partial batches waiting for more (redis.batch_wait_us) ---------------- */

/*
 * How long a partial batch may wait: redis.batch_wait_us, at most half of what
 * a decision is given for its reply (reply_budget(), which a reload of the
 * timeouts may shorten): the wait counts in its deadline.
 */
static double batch_wait(const struct store *s)
{
	double half = reply_budget(s) / 2;

	return s->batch_wait_s < half ? s->batch_wait_s : half;
}

/* <n>'s batch may wait for more: it is partial, young, and its connection up. */
static bool batch_may_wait(const struct store_node *n, double now)
{
	const struct store *s = n->s;

	return s->batch_wait_s > 0 && n->nbatch && n->nbatch < s->batch_max &&
	       now - n->batch_since < batch_wait(s) && n->rc && n->state == ND_READY;
}

/*
 * <n>'s waiting batch leaves now: each decision's wait is counted from now
 * (cmd_sent_now()), so the adaptive limit samples Redis, not the wait.
 */
static void batch_restamp(struct store_node *n, double now)
{
	struct list *l;

	for (l = n->batch.next; l != &n->batch; l = l->next)
		cmd_sent_now(LIST_ELEM(l, struct store_cmd, park), now);
}

static void linger_stop(struct store_node *n)
{
	if (!n->lingering)
		return;
	list_del(&n->linger_node);
	n->lingering = false;
}

/*
 * Arms the timer for the first waiting batch to leave, or disarms it. A
 * timerfd, to the microsecond: the loop's own timers (epoll) would wake up to
 * a millisecond late, several times the wait.
 */
static void linger_arm(struct store *s, double now)
{
	struct itimerspec its = {{0, 0}, {0, 0}};
	double first = 0, in;
	struct list *l;

	for (l = s->lingerq.next; l != &s->lingerq; l = l->next) {
		struct store_node *n = LIST_ELEM(l, struct store_node, linger_node);
		double due = n->batch_since + batch_wait(s);

		if (!first || due < first)
			first = due;
	}
	if (first) {
		in = first > now ? first - now : 0.;
		its.it_value.tv_sec = (time_t)in;
		its.it_value.tv_nsec = (long)((in - (double)its.it_value.tv_sec) * 1e9);
		if (!its.it_value.tv_sec && its.it_value.tv_nsec < 1000)
			its.it_value.tv_nsec = 1000; /* 0 would disarm it */
	}
	if (timerfd_settime(s->linger_fd, 0, &its, NULL) < 0)
		BUG_ON(1); /* a valid timerfd and value cannot fail */
}

/*
 * The flusher found <n> with a batch: true when it waits for more decisions
 * (in lingerq, the timer armed), false when it is to leave now. A batch
 * leaves when it is full, batch_wait_us after its first decision joined it,
 * or when its connection goes; a decision's deadline (cmds_written()) counts
 * its wait.
 */
static bool batch_linger(struct store_node *n, double now)
{
	struct store *s = n->s;

	if (!batch_may_wait(n, now)) {
		if (n->lingering) {
			/* full, or its wait over before the timer said so */
			batch_restamp(n, now);
			linger_stop(n);
		}
		return false;
	}
	if (!n->lingering) {
		n->lingering = true;
		list_append(&s->lingerq, &n->linger_node);
		linger_arm(s, now);
	}
	return true;
}

/*
 * Sends the waiting batches whose wait is over (or that cannot wait any
 * more), each decision's wait counted from now. Invokes user callbacks (a
 * connection gone: DOWN).
 */
static void batch_release(struct store *s, double now)
{
	struct list due, *l, *tmp;

	list_init(&due);
	list_for_each_safe(l, tmp, &s->lingerq) {
		struct store_node *n = LIST_ELEM(l, struct store_node, linger_node);

		if (batch_may_wait(n, now))
			continue;
		list_del(&n->linger_node);
		list_append(&due, &n->linger_node);
	}
	while (!list_empty(&due)) {
		struct store_node *n = LIST_ELEM(due.next, struct store_node, linger_node);

		list_del(&n->linger_node);
		n->lingering = false;
		batch_restamp(n, now);
		batch_flush(n);
		if (n->rc && n->state == ND_READY)
			rconn_flush(n->rc);
	}
	linger_arm(s, mono());
}

/*
 * Before the loop polls: writes what every node's connection was given in
 * this iteration, one write() per node for all its commands (rconn_flush()),
 * each node's batch first (batch_flush()): the commands leave in the turn
 * that made them, without a poll to say the socket is writable. What the
 * socket does not take is left to the connection's write watcher. With
 * redis.batch_wait_us, a partial batch younger than that waits for more
 * (batch_linger()): it leaves when it is full or at linger_cb().
 */
static void flusher_cb(struct ev_loop *loop, ev_prepare *w, int revents)
{
	struct store *s = w->data;
	double now = mono();

	cmds_written(s, now);
	while (!list_empty(&s->flushq)) {
		struct store_node *n = LIST_ELEM(s->flushq.next, struct store_node, flush_node);

		list_del(&n->flush_node);
		n->flush_pending = false;
		if (!batch_linger(n, now))
			batch_flush(n);
		if (n->rc && n->state == ND_READY)
			rconn_flush(n->rc);
	}
	ev_prepare_stop(loop, w);
}

/* The wait of the first partial batch is over: those due leave (batch_release()). */
static void linger_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct store *s = w->data;
	uint64_t expirations;

	(void)loop;
	(void)revents;
	if (read(s->linger_fd, &expirations, sizeof(expirations)) < 0 && errno != EAGAIN)
		LOG(LOG_ERR, "redis batch timer: %s", strerror(errno));
	batch_release(s, mono());
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
			breaker_trip(n, "stalled, no reply in time");
			node_down(n, "stalled: commands out, no reply for %.1f s; reconnecting",
				  now - n->last_progress);
			node_silent(n);
			node_close(n);
			node_lost(n);
		}
		/* a retired node goes once idle; one still connecting is let
		 * finish (its connect timeout bounds it): an ASK's target
		 * retired by a refresh is asked for again soon after */
		if (n->retired && !n->out && list_empty(&n->parked) && list_empty(&n->queue) &&
		    s->refresh_node != n && n->state != ND_CONNECTING && n->state != ND_HANDSHAKE)
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
 * no ready owner (DOWN), saturated (BUSY), breaker open (BREAKER). Before Redis
 * first answered (the mode unknown: a process just started), the seed while it
 * connects: the query waits there (cmd_submit()) rather than failing at once,
 * so the first decisions of a fresh process (a worker restarted under traffic)
 * are decided when Redis is a few milliseconds away; a seed that cannot
 * connect fails them (node_ops.lost), their deadline bounds the wait.
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
	if (!n && s->mode == MODE_UNKNOWN)
		n = s->seed;
	if (!n || (n->state != ND_READY &&
		   !(s->mode == MODE_UNKNOWN && n == s->seed &&
		     (n->state == ND_CONNECTING || n->state == ND_HANDSHAKE)))) {
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

/* True, and counted as shed, when a command's caller was to answer by <answer_by>
 * (mono(), 0 = no such time) and that time has passed: the excess of a backlog. */
static bool too_late(struct store *s, double answer_by)
{
	if (answer_by <= 0 || answer_by > mono())
		return false;
	s->stats.failed[STORE_OVERLOAD]++;
	s->stats.shed++;
	return true;
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
	if (too_late(s, q->answer_by))
		return -(int)STORE_OVERLOAD;
	c = cmd_new(s, CMD_DECIDE, STORE_QUERY_SIZE(q));
	c->cb = cb;
	c->arg = arg;
	memcpy(&c->q, q, STORE_QUERY_SIZE(q));
	c->answer_by = q->answer_by;
	return cmd_submit(n, c);
}

/* Submits a command of <kind> on <key> and <field> answered with a string (see store_hget()). */
static int submit_str(struct store *s, enum cmd_kind kind, const char *key, const char *field,
		      unsigned window_ms, double answer_by, store_str_fn cb, void *arg)
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
	c->answer_by = answer_by;
	return cmd_submit(n, c);
}

/*
 * Looks up <field> of the hash <key> (HGET) on the owner of <key>'s slot. Same
 * contract as store_decide(): 0 and exactly one later call of <cb>, or a
 * negative store_status at once. <key> and <field> are copied. <answer_by>
 * (mono(), 0 = none) is when the caller answers HAProxy: the reply's deadline,
 * as a decision's, instead of command_timeout_ms from the send.
 */
int store_hget(struct store *s, const char *key, const char *field, double answer_by,
	       store_str_fn cb, void *arg)
{
	if (too_late(s, answer_by))
		return -(int)STORE_OVERLOAD;
	return submit_str(s, CMD_HGET, key, field, 0, answer_by, cb, arg);
}

/*
 * Reads the whole hash <key> (HGETALL): <cb> gets every field and value in
 * turn, each as a uint32_t length (host order) and its bytes; an empty hash is
 * a zero length. Same contract as store_hget().
 */
int store_hgetall(struct store *s, const char *key, store_str_fn cb, void *arg)
{
	return submit_str(s, CMD_HGET, key, NULL, 0, 0, cb, arg);
}

/*
 * Runs the gateway heartbeat (lua/heartbeat.lua) for agent <id> on the owner of
 * <key>: <cb> gets the number of live agents as a decimal string. Same
 * contract as store_hget().
 */
int store_heartbeat(struct store *s, const char *key, const char *id, unsigned window_ms,
		    store_str_fn cb, void *arg)
{
	return submit_str(s, CMD_HEARTBEAT, key, id, window_ms, 0, cb, arg);
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
 * Writes in <buf> what is wrong with <n> at <now> (mono()), as the status and
 * /ready say it after the node's name: down and why, error replies within the
 * last TROUBLE_S, the breaker open. Returns false (an empty <buf>) when nothing is.
 */
static bool node_trouble(const struct store_node *n, double now, char *buf, size_t len)
{
	bool err = n->err_class >= 0 && now - n->err_at < TROUBLE_S;
	char cls[16];
	size_t i;

	if (len)
		buf[0] = 0;
	if (n->down_at) {
		snprintf(buf, len, "down%s: %.360s", n->breaker_open ? " (breaker open)" : "",
			 n->down_why);
		return true;
	}
	if (!err && !n->breaker_open)
		return false;
	snprintf(cls, sizeof(cls), "%s", store_errclass_str(n->err_class));
	for (i = 0; cls[i]; i++)
		cls[i] = (char)(cls[i] - 'a' + 'A');
	snprintf(buf, len, "%s%s%s", err ? (n->err_class == STORE_EC_OTHER ? "errors" : cls) : "",
		 err && n->breaker_open ? ", " : "", n->breaker_open ? "breaker open" : "");
	return true;
}

/*
 * Describes in <buf> what is wrong with the nodes that own slots (and the
 * seed): down and why, an open breaker, error replies within the last
 * TROUBLE_S ("redis 10.0.0.5:6379 OOM, breaker open", "redis 10.0.0.5:6379
 * down: cannot connect to 10.0.0.5:6379: Connection refused"). Returns true
 * (and an empty <buf>) when nothing is.
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
		char what[STORE_TROUBLE];

		if ((!n->nslots && !n->seed) || n->retired || !node_trouble(n, now, what, sizeof(what)))
			continue;
		w = snprintf(buf + off, len > off ? len - off : 0, "%sredis %s %s", off ? "; " : "",
			     n->name, what);
		if (w > 0)
			off += (size_t)w;
		if (off >= len)
			break;
	}
	return off == 0;
}

/* True when some node that owns slots (or the seed) is down now. */
bool store_down(const struct store *s)
{
	const struct list *l;

	for (l = s->nodes.next; l != &s->nodes; l = l->next) {
		const struct store_node *n = LIST_ELEM(l, struct store_node, link);

		if ((n->nslots || n->seed) && !n->retired && n->down_at)
			return true;
	}
	return false;
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

/*
 * Sets the deadlines of commands sent from now on: <command_timeout_ms> for a
 * command no NOTIFY waits on (0: STORE_COMMAND_TIMEOUT_MS), <queue_timeout_ms> in the queue (0: the
 * command timeout), and <answer_budget_ms>, the share of HAProxy's budget a
 * decision's reply gets (0: spoe_timeout unknown, the command timeout then),
 * which is also what the adaptive limits call late (reply_budget()). Commands
 * already out keep theirs.
 */
void store_set_timeouts(struct store *s, unsigned command_timeout_ms, unsigned queue_timeout_ms,
			unsigned answer_budget_ms)
{
	double longest;

	s->command_timeout_ms = command_timeout_ms ? command_timeout_ms : STORE_COMMAND_TIMEOUT_MS;
	s->queue_s = (queue_timeout_ms ? queue_timeout_ms : s->command_timeout_ms) / 1000.;
	s->answer_budget_s = answer_budget_ms / 1000.;
	/* a stall is 20 times the longest a reply is waited for, at least 1 s and at most 5 s */
	longest = s->answer_budget_s > s->command_timeout_ms / 1000. ? s->answer_budget_s
								      : s->command_timeout_ms / 1000.;
	s->stall_s = longest * 20;
	if (s->stall_s < 1.)
		s->stall_s = 1.;
	if (s->stall_s > 5.)
		s->stall_s = 5.;
}

const struct store_stats *store_stats(const struct store *s)
{
	return &s->stats;
}

/* The upper bound of latency bucket <i> of store_node_stats(), in seconds (the last: infinity). */
double store_lat_bound(unsigned i)
{
	return node_lat_bound(i);
}

static const char *node_state_str(enum node_state st)
{
	static const char *const names[ND_COUNT] = {"disconnected", "connecting", "handshake",
						    "ready"};

	return st < ND_COUNT && names[st] ? names[st] : "?";
}

/*
 * Fills <out> with the state of at most <max> of the nodes of <s>, the retired
 * ones left out; returns how many. Their latencies are those of the last one
 * or two STORE_LAT_WINDOW_S windows.
 */
size_t store_node_stats(const struct store *s, struct store_node_stats *out, size_t max)
{
	double now = mono(), at, silent = s->command_timeout_ms / 1000.;
	struct list *l;
	size_t n = 0, i;

	if (silent < SILENT_S)
		silent = SILENT_S;
	for (l = s->nodes.next; l != &s->nodes && n < max; l = l->next) {
		struct store_node *nd = LIST_ELEM(l, struct store_node, link);
		struct store_node_stats *o = &out[n];

		if (nd->retired)
			continue;
		node_lat_turn(nd, now);
		memset(o, 0, sizeof(*o));
		snprintf(o->name, sizeof(o->name), "%s", nd->name ? nd->name : "?");
		at = node_unanswered_at(nd);
		o->oldest_s = at > 0 && now > at ? now - at : 0.;
		snprintf(o->state, sizeof(o->state), "%s",
			 o->oldest_s >= silent ? "not answering" : node_state_str(nd->state));
		o->breaker_open = nd->breaker_open;
		o->limit = (unsigned)nd->limit;
		o->out = nd->out;
		o->queued = nd->nqueued;
		o->slots = s->mode == MODE_CLUSTER ? nd->nslots : 16384;
		memcpy(o->errors, nd->errors, sizeof(o->errors));
		/* what store_health() says of it: nothing for a node that owns no slot */
		if (nd->nslots || nd->seed) {
			o->down_since = nd->down_at;
			(void)node_trouble(nd, now, o->trouble, sizeof(o->trouble));
		}
		for (i = 0; i < STORE_LAT_BUCKETS; i++)
			o->lat[i] = nd->lat[0][i] + nd->lat[1][i];
		n++;
	}
	return n;
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
	int linger_fd = -1;

	if (opts->nsentinels) {
		memset(&ep, 0, sizeof(ep));
		snprintf(ep.host, sizeof(ep.host), "%s", opts->sentinel_master);
		ep.sentinel = true;
	} else if (seed_endpoint(opts->address, &ep, err, errlen) < 0) {
		return -1;
	}
	if (opts->batch_wait_us) {
		linger_fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
		if (linger_fd < 0) {
			snprintf(err, errlen, "redis.batch_wait_us: cannot make a timer: %s",
				 strerror(errno));
			return -1;
		}
	}
	s = xcalloc(1, sizeof(*s));
	s->loop = loop;
	s->node_ops = &node_ops;
	s->cmd_ops = &cmd_ops;
	s->user = opts->user && *opts->user ? xstrdup(opts->user) : NULL;
	s->password = opts->password && *opts->password ? xstrdup(opts->password) : NULL;
	s->connect_timeout_ms = opts->connect_timeout_ms ? opts->connect_timeout_ms : 200;
	s->max_pending = opts->max_pending ? opts->max_pending : 10000;
	s->resolver_opts.nameservers = opts->nameservers && *opts->nameservers
					       ? xstrdup(opts->nameservers) : NULL;
	s->resolver_opts.timeout_ms = opts->resolve_timeout_ms;
	s->breaker_failures = opts->breaker_failures ? opts->breaker_failures : 5;
	s->breaker_cooldown_s = (opts->breaker_cooldown_ms ? opts->breaker_cooldown_ms : 500) / 1000.;
	s->max_concurrency = opts->max_concurrency ? opts->max_concurrency : 256;
	if (s->max_concurrency < LIMIT_MIN)
		s->max_concurrency = LIMIT_MIN;
	s->batch_max = opts->batch_max ? opts->batch_max : 32;
	s->batch_wait_s = opts->batch_wait_us / 1e6;
	if (opts->reply_limits)
		s->reply_limits = *opts->reply_limits;
	else
		s->reply_limits = (struct reply_limits)REPLY_LIMITS_DEFAULT;
	if (s->batch_max > STORE_BATCH_MAX)
		s->batch_max = STORE_BATCH_MAX;
	store_set_timeouts(s, opts->command_timeout_ms, opts->queue_timeout_ms,
			   opts->answer_budget_ms);
	list_init(&s->nodes);
	list_init(&s->waiting);
	list_init(&s->waiting_by);
	list_init(&s->queued);
	list_init(&s->flushq);
	list_init(&s->lingerq);
	cmd_pool_warm(s);
	ev_prepare_init(&s->flusher, flusher_cb);
	s->flusher.data = s;
	s->linger_fd = linger_fd;
	ev_io_init(&s->linger_io, linger_cb, linger_fd, EV_READ);
	s->linger_io.data = s;
	if (linger_fd >= 0)
		ev_io_start(s->loop, &s->linger_io);
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
			.limits = &s->reply_limits,
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
	if (s->linger_fd >= 0) {
		ev_io_stop(s->loop, &s->linger_io);
		close(s->linger_fd);
	}
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
	while (!list_empty(&s->waiting_by))
		cmd_answer(LIST_ELEM(s->waiting_by.next, struct store_cmd, node), STORE_SHUTDOWN,
			   NULL);
	for (i = 0; i < CRC16_SLOTS; i++)
		slot_set(s, i, NULL);
	list_for_each_safe(l, tmp, &s->nodes)
		node_free(LIST_ELEM(l, struct store_node, link));
	reply_cache_free();
	cmd_pool_free(s);
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
