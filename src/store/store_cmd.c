/* SPDX-License-Identifier: MIT */
/*
 * Redis store, the command layer (see the LAYERS and the DESIGN in store.c):
 * a query's command from its submission to its answer.
 *  - Its life: allocated from a pool, answered exactly once (cmd_answer()),
 *    freed by whoever owns it then (the connection's callback, a queue, a
 *    node's parked list).
 *  - Deadlines: two FIFOs of sent commands and one of queued ones, one timer
 *    for the earliest head; waits measured against the loop's own turns.
 *  - Admission under the node's limit (cmd_submit()): sent now, or queued.
 *  - Sending: RESP written into the node's connection buffer, or a decision
 *    for a single Redis put in the node's batch; the flusher sends both.
 *  - Replies: parsed and range-checked (store_parse.c), NOSCRIPT re-sent
 *    once as EVAL, a redirection handed up (cmd_ops.redirect), the node's
 *    health told.
 * Calls the node layer (store_node.c) and the transport; the layers above
 * through struct cmd_ops (store_cmd.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crc16.h"
#include "log.h"
#include "pool.h"
#include "reply_parse.h"
#include "scripts.h"
#include "store_cmd.h"
#include "store_node.h"
#include "store_parse.h"
#include "util.h"

static int cmd_send(struct store_node *n, struct store_cmd *c, bool eval);
static void cmd_reply_cb(struct rconn *rc, void *reply, void *privdata);

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

void turn_begin_cb(struct ev_loop *loop, ev_check *w, int revents)
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

void turn_end_cb(struct ev_loop *loop, ev_prepare *w, int revents)
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
#ifndef CMD_POOL_WARM
#define CMD_POOL_WARM 256       /* made and written at the start (cmd_pool_warm()) */
#endif

/*
 * A new command of <kind>; <qsize> bytes of room for its query (a decision:
 * STORE_QUERY_SIZE, up to its last key), 0 for the others.
 */
struct store_cmd *cmd_new(struct store *s, enum cmd_kind kind, size_t qsize)
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

/* Frees <c>, which is on no list any more and owed by no connection's callback. */
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

/*
 * Fills the pool with CMD_POOL_WARM commands, written: a fresh process would
 * otherwise fault their pages in during its first burst (see decisions_init()).
 */
void cmd_pool_warm(struct store *s)
{
	while (s->ncmd_pool < CMD_POOL_WARM) {
		struct store_cmd *c = xmalloc(CMD_POOL_SIZE);

		memset(c, 0, CMD_POOL_SIZE);
		c->next_free = s->cmd_pool;
		s->cmd_pool = c;
		s->ncmd_pool++;
		pool_poison(c, CMD_POOL_SIZE, &c->next_free);
	}
}

/* Gives the commands kept for reuse back to the allocator (the store is freed). */
void cmd_pool_free(struct store *s)
{
	while (s->cmd_pool) {
		struct store_cmd *c = s->cmd_pool;

		s->cmd_pool = c->next_free;
		pool_unpoison(c, CMD_POOL_SIZE);
		free(c);
	}
}

/* True while <c>'s caller has not been answered. */
bool cmd_live(const struct store_cmd *c)
{
	return c->cb || c->str_cb;
}

/* The deadline at the head of FIFO <l>, or <at> if empty or later. */
static double head_deadline(const struct list *l, double at)
{
	double d;

	if (list_empty(l))
		return at;
	d = LIST_ELEM(l->next, struct store_cmd, node)->deadline;
	return at > 0 && at < d ? at : d;
}

/*
 * Arms the command timer for the earliest deadline: the oldest waiting
 * command's of either FIFO or the oldest queued one's. Stalls are the tick's
 * business.
 */
static void cmd_timer_arm(struct store *s)
{
	double now = mono(), at;

	ev_timer_stop(s->loop, &s->cmd_timer);
	if (s->freeing || (list_empty(&s->waiting) && list_empty(&s->waiting_by) &&
			   list_empty(&s->queued)))
		return;
	at = head_deadline(&s->queued, head_deadline(&s->waiting_by,
						     head_deadline(&s->waiting, 0)));
	ev_timer_set(&s->cmd_timer, at > now ? at - now : 0., 0.);
	ev_timer_start(s->loop, &s->cmd_timer);
}

/*
 * Answers <c>'s caller once (a decision with <r>, a lookup with <val>/<len>);
 * the command itself stays with whoever owns it (its connection, or the caller of
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

/*
 * Sends what is parked at <n> to where its key lives now, by the slot map: the
 * seed of a single Redis, a cluster's slot owner (sent, or parked there while
 * it connects), without ASKING (an owner still migrating the slot answers ASK
 * again). For what waited at the seed for the mode to be known
 * (store_admit()), and what waited for a node that left the topology before
 * it connected (the target of an ASK, a master replaced). What cannot go is
 * answered DOWN. Invokes user callbacks only on failure.
 */
void node_route_parked(struct store_node *n)
{
	struct store *s = n->s;
	struct list moving;

	list_init(&moving);
	while (!list_empty(&n->parked)) {
		struct store_cmd *c = LIST_ELEM(n->parked.next, struct store_cmd, park);

		cmd_unpark(c);
		list_append(&moving, &c->park);
	}
	while (!list_empty(&moving)) {
		struct store_cmd *c = LIST_ELEM(moving.next, struct store_cmd, park);
		const char *key = c->kind == CMD_DECIDE ? c->q.keys[0] : c->hkey;
		struct store_node *to = s->slots[s->mode == MODE_SINGLE ? 0 :
						 crc16_key_slot(key, strnlen(key, STORE_KEY_MAX))];

		list_del(&c->park);
		list_init(&c->park);
		c->asking = false;
		if (!to || cmd_dispatch_nocb(to, c) < 0) {
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
 * The queue deadline <at>, or the time <c>'s caller must be answered by when
 * that comes first (a decision whose NOTIFY HAProxy gives up on sooner:
 * answered by the failure ladder while HAProxy still listens, rather than not
 * at all).
 */
static double cmd_bound(const struct store_cmd *c, double at)
{
	if (c->answer_by > 0 && c->answer_by < at)
		return c->answer_by;
	return at;
}

/*
 * Sends the new command <c> on <n> now and starts its deadline: its caller's
 * answer_by when it has one (HAProxy's budget, whatever the command timeout),
 * else command_timeout_ms from now. Returns 0 or -1 (<c> untouched). Never
 * invokes user callbacks.
 */
/*
 * Gives <c>, sent (or parked) at <now>, its deadline: its caller's answer time,
 * else command_timeout_ms from <now> (from when it is written, if it is:
 * cmds_written()); in the FIFO of its kind.
 */
static void cmd_wait_for(struct store *s, struct store_cmd *c, double now)
{
	struct list *fifo = &s->waiting;

	if (c->answer_by > 0) {
		c->deadline = c->answer_by;
		fifo = &s->waiting_by;
	} else {
		c->deadline = now + s->command_timeout_ms / 1000.;
		c->unwritten = !c->parked;
	}
	/* the timer follows the earliest deadline: arm it when this one is the
	 * only command of its FIFO (another may have armed it earlier: fine) */
	list_append(fifo, &c->node);
	if (fifo->next == &c->node)
		cmd_timer_arm(s);
}

static int cmd_start(struct store_node *n, struct store_cmd *c)
{
	if (cmd_send(n, c, false) < 0)
		return -1;
	cmd_wait_for(n->s, c, c->sent_at);
	return 0;
}

/*
 * The commands started in this turn leave now (the flusher, before the loop
 * polls, at <now>): a deadline of command_timeout_ms runs from here, not from
 * when the command joined its batch or buffer, and its wait from here too. A
 * long turn (a burst of NOTIFYs, a fresh process faulting its pages in) thus
 * does not spend Redis' time before Redis has the command. They are the tail
 * of the FIFO, all given the same deadline: it stays in deadline order.
 */
void cmds_written(struct store *s, double now)
{
	struct list *l;

	for (l = s->waiting.prev; l != &s->waiting; l = l->prev) {
		struct store_cmd *c = LIST_ELEM(l, struct store_cmd, node);

		if (!c->unwritten)
			break;
		c->unwritten = false;
		c->deadline = now + s->command_timeout_ms / 1000.;
		c->sent_at = now;
		c->busy_at = store_busy(s, now);
	}
}

/*
 * <c> (in a batch that waited for more, redis.batch_wait_us) leaves now: its
 * wait is counted from here, its deadline still from cmds_written().
 */
void cmd_sent_now(struct store_cmd *c, double now)
{
	c->sent_at = now;
	c->busy_at = store_busy(c->s, now);
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

/* Parks <c> at <n> (sent by node_send_parked() or node_route_parked()). */
static void cmd_park(struct store_node *n, struct store_cmd *c)
{
	c->at = n;
	c->parked = true;
	/* not on a connection: its answer says nothing of <n>'s health (a failed
	 * connect must not count once per command parked here) */
	c->sent_at = 0;
	list_append(&n->parked, &c->park);
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
	if (n->state != ND_CONNECTING && n->state != ND_HANDSHAKE)
		return -1;
	cmd_park(n, c);
	return 0;
}

/* Answers TIMEOUT the sent commands of FIFO <l> whose deadline passed at <now>. */
/*
 * <c>, answered while it waited in its node's batch (its deadline passed: a
 * long turn, a batch waiting for more), leaves the batch and is freed: like a
 * shed query it is not sent, as its caller has its answer and Redis would
 * count what nobody was told it admitted.
 */
static void cmd_batch_drop(struct store_cmd *c)
{
	struct store_node *n = c->at;

	list_del(&c->park);
	list_init(&c->park);
	c->batched = false;
	n->nbatch--;
	n->out--;
	cmd_free(c);
}

static void cmd_expire(struct store *s, struct list *l, double now)
{
	while (!list_empty(l)) {
		struct store_cmd *c = LIST_ELEM(l->next, struct store_cmd, node);
		bool parked = c->parked;

		if (c->deadline > now)
			break;
		cmd_unpark(c);
		/* sent and unanswered in time: congestion at that node if it
		 * kept us waiting late (half the budget), unless the time went
		 * to this agent's own turns; a decision still in a batch was
		 * not sent */
		if (!parked && !c->batched && c->at && cmd_wait(c, now) >= reply_budget(s) / 2)
			limit_decrease(c->at, now);
		cmd_answer(c, STORE_TIMEOUT, NULL);
		if (parked)
			cmd_free(c);
		else if (c->batched)
			cmd_batch_drop(c);
	}
}

void cmd_timer_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct store *s = container_of(t, struct store, cmd_timer);
	double now = mono();

	(void)loop;
	(void)revents;
	cmd_expire(s, &s->waiting_by, now);
	cmd_expire(s, &s->waiting, now);
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

/*
 * A query's key in layout 2 (limit_key()) is "<the principal's key>|<flags>#<field>":
 * the Redis key is the part before '|', the script's flags argument the rest.
 * The flags of <key>, or NULL in layout 1 (the key is the Redis key).
 */
const char *key_flags(const char *key)
{
	return strchr(key, '|') ? strchr(key, '|') + 1 : NULL;
}

/* Appends the Redis keys of <q>. */
void query_push_keys(struct argv_buf *av, const struct store_query *q)
{
	size_t i;

	for (i = 0; i < q->n; i++) {
		const char *f = key_flags(q->keys[i]);

		argv_str(av, q->keys[i], f ? (size_t)(f - 1 - q->keys[i]) : strlen(q->keys[i]));
	}
}

/* Appends the flags argument of limit <i> of <q>: the shadow flag, or its key's. */
static void push_flags(struct argv_buf *av, const struct store_query *q, size_t i)
{
	const char *f = key_flags(q->keys[i]);

	if (f)
		argv_str(av, f, strlen(f));
	else
		argv_num(av, q->params[i].shadow ? 1 : 0);
}

/* Appends the 5 arguments of each of limits <from> to <to> (excluded) of <q>. */
static void push_limits(struct argv_buf *av, const struct store_query *q, size_t from, size_t to)
{
	size_t i;

	for (i = from; i < to; i++) {
		argv_num(av, q->params[i].alg);
		argv_num(av, q->params[i].a);
		argv_num(av, q->params[i].b);
		push_flags(av, q, i);
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
 * A decision (EVALSHA, no ASKING, not sent alone after a cross-slot call)
 * joins <n>'s batch, which the store's flusher sends as one script call
 * (store_batch.c): true; false when <c> is to be written alone.
 */
static bool cmd_batch_take(struct store_node *n, struct store_cmd *c, bool eval)
{
	if (n->s->batch_max <= 1 || n->s->mode == MODE_UNKNOWN || c->kind != CMD_DECIDE || eval ||
	    c->asking || c->solo)
		return false;
	c->batched = true;
	list_append(&n->batch, &c->park);
	if (!n->nbatch++ && n->s->batch_wait_s > 0)
		n->batch_since = mono();
	return true;
}

/*
 * Sends <c> on <n>'s connection: written into its buffer now, or, for a
 * decision that may wait, put in its batch (cmd_batch_take()); the flusher
 * sends both before the loop polls. Returns 0 or -1. Never invokes user
 * callbacks.
 */
static int cmd_send(struct store_node *n, struct store_cmd *c, bool eval)
{
	struct store *s = n->s;

	if (!n->rc || n->state != ND_READY)
		return -1;
	if (!cmd_batch_take(n, c, eval) && cmd_write(n, c, eval) != REDIS_OK)
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
		if (s->cmd_ops->redirect(n, c, rep->str))
			return;
		if (c->kind == CMD_DECIDE && strncmp(rep->str, "NOSCRIPT", 8) == 0 && !c->retried) {
			s->stats.noscript++;
			c->retried = true;
			if (cmd_send(n, c, true) == 0)
				return; /* same deadline, still waiting */
		}
		if (strncmp(rep->str, "CLUSTERDOWN", 11) == 0 && s->mode == MODE_CLUSTER)
			s->cmd_ops->refresh(s);
		store_log_trouble(n, c->kind == CMD_DECIDE ? "script error" : "lookup", rep->str);
		node_error(n, error_class(rep->str));
		cmd_answer(c, STORE_ERROR, NULL);
	} else if (c->kind == CMD_HEARTBEAT) {
		char num[24];

		if (reply_int_in(rep, 0, INT32_MAX)) {
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
	} else if (store_parse_result(rep, &c->q, &res) < 0) {
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
 * The connection calls this once per command sent: with its reply, or NULL when the
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
 * Sends the new command <c> to <n> now if <n> has room under its limit and
 * nothing queued (or <c> is the probe of its breaker), its deadline starting
 * now; otherwise queues it for at most the queue budget. Returns 0 or
 * -STORE_DOWN (<c> freed). Never invokes user callbacks.
 */
int cmd_submit(struct store_node *n, struct store_cmd *c)
{
	struct store *s = n->s;

	if (s->mode == MODE_UNKNOWN) {
		/* the seed before Redis's mode is known (store_admit()): parked
		 * there, its deadline running, sent where its key lives once the
		 * mode is known (node_route_parked()) */
		cmd_park(n, c);
		cmd_wait_for(s, c, mono());
		return 0;
	}
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
