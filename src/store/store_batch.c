/* SPDX-License-Identifier: MIT */
/*
 * Several decisions in one script call.
 *
 * A decision sent to a single Redis does not leave at once: the command layer
 * puts it in its node's batch (cmd_send()), and just before the loop polls (the store's flusher) each
 * node's batch goes out as script calls of up to STORE_BATCH_MAX decisions
 * (the script's multi form, see lua/decide.lua): one call overhead, one TIME
 * and one reply for all of them, on Redis' side the largest part of a cheap
 * decision. A batch of one is sent in the single form, as before.
 *
 * Every decision keeps its own deadline, concurrency slot, latency sample and
 * answer: the call's reply is an array with one element per decision, each
 * exactly the reply of a single call (or an error for that decision only),
 * handed to cmd_reply() as if it had come alone. A reply for the whole call
 * (an error such as NOSCRIPT, OOM or BUSY, the connection lost) is handed to
 * each of its decisions the same way, which then take their usual course
 * (re-sent alone with EVAL, answered ERROR or DOWN).
 *
 * In a cluster the decisions of one master share a call too, whatever their
 * slots: decisions of one slot rarely meet in one loop turn, those of one
 * master do. Redis refuses a call whose declared keys span slots, so the call
 * takes the script's cross-slot form (see lua/decide.lua): the first
 * decision's keys declared (a MOVED or ASK for their slot is theirs), the
 * others' as arguments, which the script may reach when this node serves
 * them. A decision whose slot is elsewhere (it moved, or is moving) fails at
 * its first read, before it writes anything; that decision, and those of a
 * call redirected for another decision's slot, are sent again alone by the
 * slot map (solo: never batched again), where MOVED and ASK work as for any
 * command.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crc16.h"
#include "store_batch.h"
#include "store_cmd.h"
#include "store_node.h"
#include "util.h"

/*
 * The distinct limits (algorithm, parameters, shadow) of one call, at most
 * this many: the compact forms send each once, and a decision's limit as its
 * index and cost (2 arguments instead of 5). A call with more goes in the
 * long forms.
 */
#define CALL_SPECS_MAX 32

/* One script call carrying several decisions; owned by its connection until its reply. */
struct batch_call {
	unsigned count;
	bool cross;                     /* the cross-slot form (a cluster) */
	struct store_cmd *cmds[STORE_BATCH_MAX];
};

/* The call's distinct limits, and each decision's limits' index among them. */
struct call_specs {
	unsigned n;
	struct limit_params p[CALL_SPECS_MAX];
	const char *flags[CALL_SPECS_MAX];      /* in layout 2, their flags and field
						 * (key_flags()), else NULL */
	uint8_t idx[STORE_BATCH_MAX][STORE_MAX_LIMITS]; /* 1-based */
};

/*
 * The index (1-based) of limit <k> of <q> in <cs>, added if new; 0 when <cs> is
 * full. In layout 2 a limit's field is part of what it is.
 */
static unsigned spec_index(struct call_specs *cs, const struct store_query *q, size_t k)
{
	const struct limit_params *lp = &q->params[k];
	const char *f = key_flags(q->keys[k]);
	unsigned i;

	for (i = 0; i < cs->n; i++)
		if (cs->p[i].alg == lp->alg && cs->p[i].a == lp->a && cs->p[i].b == lp->b &&
		    cs->p[i].shadow == lp->shadow &&
		    (f ? cs->flags[i] && strcmp(cs->flags[i], f) == 0 : !cs->flags[i]))
			return i + 1;
	if (cs->n == CALL_SPECS_MAX)
		return 0;
	cs->p[cs->n] = *lp;
	cs->flags[cs->n] = f;
	return ++cs->n;
}

/* Appends limits <from> to <to> (excluded) of <q> as "<index> <cost>" each. */
static void push_compact_limits(struct argv_buf *av, const uint8_t *idx,
				const struct store_query *q, size_t from, size_t to)
{
	size_t i;

	for (i = from; i < to; i++) {
		argv_num(av, idx[i]);
		argv_num(av, q->cost[i]);
	}
}

/*
 * Appends <q> as the compact forms' QUERY_DECISIONS(q) decisions: as
 * query_push_decisions() does, a limit as its index <idx> (call_specs_fit())
 * and its cost.
 */
static void push_compact_decisions(struct argv_buf *av, const uint8_t *idx,
				   const struct store_query *q)
{
	size_t ne = q->n - q->ncand;

	argv_num(av, (int64_t)ne);
	argv_num(av, q->want > 0 ? 4 : 0);
	push_compact_limits(av, idx, q, 0, ne);
	if (q->want > 0) {
		argv_num(av, q->want);
		argv_num(av, q->batch);
		argv_num(av, q->lease_us);
		argv_num(av, q->min_units > 1 ? q->min_units : 1);
	}
	if (q->ncand) {
		argv_num(av, (int64_t)q->ncand);
		argv_num(av, 0);
		push_compact_limits(av, idx, q, ne, q->n);
	}
}

/*
 * True when the distinct limits of <b>'s decisions fit the compact forms; fills
 * <cs>: the table, and each limit's index in it.
 */
static bool call_specs_fit(const struct batch_call *b, struct call_specs *cs)
{
	unsigned i;
	size_t k;

	cs->n = 0;
	for (i = 0; i < b->count; i++)
		for (k = 0; k < b->cmds[i]->q.n; k++)
			if (!(cs->idx[i][k] = (uint8_t)spec_index(cs, &b->cmds[i]->q, k)))
				return false;
	return true;
}

static struct store_cmd *batch_pop(struct store_node *n)
{
	struct store_cmd *c = LIST_ELEM(n->batch.next, struct store_cmd, park);

	list_del(&c->park);
	list_init(&c->park);
	c->batched = false;
	n->nbatch--;
	return c;
}

/*
 * Answers what waits in <n>'s batch as if its connection had been lost (DOWN,
 * SHUTDOWN while the store is freed): node_ops.closing, and the flusher for a
 * connection that went. Invokes user callbacks.
 */
void batch_fail(struct store_node *n)
{
	while (n->nbatch) {
		struct store_cmd *c = batch_pop(n);

		n->out--;
		cmd_reply(n, c, NULL);
	}
}

/*
 * True when <err>, the reply a cross-slot call gave a decision, says that
 * decision's slot is not (or not only) this node's: a redirection of the whole
 * call (for its first decision's slot, not necessarily this one's), a
 * migration in progress, or the script finding the key elsewhere.
 */
static bool cross_slot_elsewhere(const redisReply *err)
{
	return err->type == REDIS_REPLY_ERROR &&
	       (strncmp(err->str, "MOVED ", 6) == 0 || strncmp(err->str, "ASK ", 4) == 0 ||
		strncmp(err->str, "TRYAGAIN", 8) == 0 || strstr(err->str, "non local key"));
}

/*
 * True when decision <i> of <b> is to be sent again alone after the reply
 * <rep> (the whole call's, or with <split> its element at <at>): a TRYAGAIN
 * (in a cluster, a slot half migrated: some of the call's keys moved, some
 * not; alone, each decision gets its own ASK or answer), or, in a cross-slot
 * call, its slot found elsewhere or a redirection meant for the first
 * decision's slot.
 */
static bool resend_alone(const struct batch_call *b, unsigned i, const redisReply *rep,
			 bool split, size_t at)
{
	if (split)
		return b->cross && cross_slot_elsewhere(rep->element[at]);
	if (rep->type == REDIS_REPLY_ERROR && strncmp(rep->str, "TRYAGAIN", 8) == 0)
		return true;
	return b->cross && i > 0 && cross_slot_elsewhere(rep);
}

/*
 * Sends <c>, which its call found elsewhere (or in a slot being migrated),
 * again alone to the owner of its slot by the map (asked again meanwhile):
 * false when it cannot go (no owner, too many redirections), to be answered
 * with its reply as is.
 */
static bool send_alone(struct store *s, struct store_cmd *c)
{
	struct store_node *to;

	if (c->redirects >= MAX_REDIRECTS || !c->q.n)
		return false;
	to = s->slots[crc16_key_slot(c->q.keys[0], strlen(c->q.keys[0]))];
	if (!to)
		return false;
	c->solo = true;
	c->redirects++;
	if (cmd_dispatch_nocb(to, c) < 0)
		return false;
	s->stats.cross_slot_solo++;
	s->cmd_ops->refresh(s);
	return true;
}

/* The connection calls this once per batch call: with its reply, or NULL when it is gone. */
static void batch_reply_cb(struct rconn *rc, void *reply, void *privdata)
{
	struct batch_call *b = privdata;
	struct store_node *n = rconn_data(rc);
	redisReply *rep = reply;
	size_t j = 0, nd = 0;
	bool split;
	double now = mono();
	unsigned i;

	for (i = 0; i < b->count; i++)
		nd += QUERY_DECISIONS(&b->cmds[i]->q);
	split = rep && rep->type == REDIS_REPLY_ARRAY && rep->elements == nd;

	n->out -= b->count;
	if (rep)
		n->last_progress = now;
	for (i = 0; i < b->count; i++) {
		struct store_cmd *c = b->cmds[i];
		size_t at = j;

		if (rep && cmd_live(c) && c->sent_at > 0)
			limit_sample(n, cmd_wait(c, now), now);
		j += QUERY_DECISIONS(&c->q); /* cmd_reply() frees <c> */
		if (rep && cmd_live(c) && resend_alone(b, i, rep, split, at) &&
		    send_alone(n->s, c))
			continue;
		if (split && c->q.ncand) {
			/* its two decisions, as the multi form answers a query alone */
			redisReply pair = {.type = REDIS_REPLY_ARRAY, .elements = 2,
					   .element = rep->element + at};

			cmd_reply(n, c, &pair);
		} else {
			cmd_reply(n, c, split ? rep->element[at] : rep);
		}
	}
	free(b);
	if (rep && n->rc == rc && !n->s->freeing)
		node_send_queue(n);
}

/*
 * The argv of one call of <b>'s decisions in the multi form:
 *   EVALSHA sha <keys> <every decision's keys> M <count>
 *           { <limits n> <extra e> <5n + e arguments> } x count
 * where a query with a candidate policy counts as two decisions (its own,
 * then the candidate's: query_push_decisions()), answered as a pair; in its
 * compact form (C) when the call's distinct limits fit CALL_SPECS_MAX:
 *   EVALSHA sha <keys> <every decision's keys> C <count> <U> <U x alg a b shadow>
 *           { <limits n> <extra e> <2n + e arguments> } x count
 * a limit being its index among the U and its cost; in a cluster, over
 * several slots, the cross-slot forms X and Q (see lua/decide.lua): only the
 * first decision's keys declared, "<K> <the others' keys>" after the count.
 * Returns REDIS_OK when the connection took it.
 */
static int batch_send_call(struct store_node *n, struct batch_call *b)
{
	struct store *s = n->s;
	struct argv_buf av = {0};
	struct call_specs cs;
	bool compact = call_specs_fit(b, &cs);
	size_t nargs = 6, nkeys = 0, nd = 0;
	unsigned i;
	int ret;

	for (i = 0; i < b->count; i++) {
		const struct store_query *q = &b->cmds[i]->q;

		nkeys += q->n;
		nd += QUERY_DECISIONS(q);
		nargs += q->n + 2 * QUERY_DECISIONS(q) +
			 (compact ? 2 * q->n + (q->want > 0 ? 4 : 0) : QUERY_ARGS(q));
	}
	if (compact)
		nargs += 1 + 4 * cs.n;
	av.argv = xmalloc(nargs * sizeof(*av.argv));
	av.lens = xmalloc(nargs * sizeof(*av.lens));
	av.nums = xmalloc(nargs * sizeof(*av.nums));
	argv_str(&av, "EVALSHA", 7);
	argv_str(&av, s->sha, strlen(s->sha));
	if (b->cross) {
		/* EVALSHA sha <n_1> <keys of decision 1> X|Q <D> <K> <the other keys> */
		const struct store_query *q0 = &b->cmds[0]->q;

		argv_num(&av, (int64_t)q0->n);
		query_push_keys(&av, q0);
		argv_str(&av, compact ? "Q" : "X", 1);
		argv_num(&av, (int64_t)nd);
		argv_num(&av, (int64_t)(nkeys - q0->n));
		for (i = 1; i < b->count; i++)
			query_push_keys(&av, &b->cmds[i]->q);
	} else {
		argv_num(&av, (int64_t)nkeys);
		for (i = 0; i < b->count; i++)
			query_push_keys(&av, &b->cmds[i]->q);
		argv_str(&av, compact ? "C" : "M", 1);
		argv_num(&av, (int64_t)nd);
	}
	if (compact) {
		argv_num(&av, cs.n);
		for (i = 0; i < cs.n; i++) {
			argv_num(&av, cs.p[i].alg);
			argv_num(&av, cs.p[i].a);
			argv_num(&av, cs.p[i].b);
			if (cs.flags[i])
				argv_str(&av, cs.flags[i], strlen(cs.flags[i]));
			else
				argv_num(&av, cs.p[i].shadow ? 1 : 0);
		}
		for (i = 0; i < b->count; i++)
			push_compact_decisions(&av, cs.idx[i], &b->cmds[i]->q);
	} else {
		for (i = 0; i < b->count; i++)
			query_push_decisions(&av, &b->cmds[i]->q);
	}
	BUG_ON((size_t)av.argc > nargs);
	ret = rconn_command(n->rc, batch_reply_cb, b, av.argc, av.argv, av.lens);
	free(av.argv);
	free(av.lens);
	free(av.nums);
	return ret;
}

/*
 * Sends <n>'s batch (the flusher, before the loop polls): calls of up to
 * batch_max decisions, a lone decision in the single form. What cannot be
 * sent (the connection is gone) is answered DOWN. Invokes user callbacks.
 */
void batch_flush(struct store_node *n)
{
	struct store *s = n->s;

	while (n->nbatch) {
		struct batch_call *b;

		if (!n->rc || n->state != ND_READY) {
			batch_fail(n);
			return;
		}
		if (n->nbatch == 1) {
			struct store_cmd *c = batch_pop(n);

			if (cmd_write(n, c, false) != REDIS_OK) {
				n->out--;
				cmd_reply(n, c, NULL);
			}
			continue;
		}
		b = xmalloc(sizeof(*b));
		b->count = 0;
		b->cross = false;
		while (n->nbatch && b->count < s->batch_max)
			b->cmds[b->count++] = batch_pop(n);
		s->stats.batch_calls++;
		s->stats.batched += b->count;
		if (s->mode == MODE_CLUSTER) {
			unsigned slot = crc16_key_slot(b->cmds[0]->q.keys[0],
						       strlen(b->cmds[0]->q.keys[0])), k;

			for (k = 1; k < b->count && !b->cross; k++)
				b->cross = crc16_key_slot(b->cmds[k]->q.keys[0],
							  strlen(b->cmds[k]->q.keys[0])) != slot;
			s->stats.cross_slot_calls += b->cross;
		}
		if (batch_send_call(n, b) != REDIS_OK) {
			unsigned i;

			n->out -= b->count;
			for (i = 0; i < b->count; i++)
				cmd_reply(n, b->cmds[i], NULL);
			free(b);
		}
	}
}
