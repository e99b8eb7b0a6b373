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
 * Only a single Redis batches: in a cluster the keys of one call must share a
 * slot, and decisions of one slot rarely meet in one loop iteration.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store_batch.h"
#include "store_cmd.h"
#include "store_node.h"
#include "util.h"

/* One script call carrying several decisions; owned by its connection until its reply. */
struct batch_call {
	unsigned count;
	struct store_cmd *cmds[STORE_BATCH_MAX];
};

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
 * then the candidate's: query_push_decisions()), answered as a pair.
 * Returns REDIS_OK when the connection took it.
 */
static int batch_send_call(struct store_node *n, struct batch_call *b)
{
	struct store *s = n->s;
	struct argv_buf av = {0};
	size_t nargs = 5, nkeys = 0, nd = 0;
	unsigned i;
	int ret;

	for (i = 0; i < b->count; i++) {
		const struct store_query *q = &b->cmds[i]->q;

		nkeys += q->n;
		nd += QUERY_DECISIONS(q);
		nargs += q->n + 2 * QUERY_DECISIONS(q) + QUERY_ARGS(q);
	}
	av.argv = xmalloc(nargs * sizeof(*av.argv));
	av.lens = xmalloc(nargs * sizeof(*av.lens));
	av.nums = xmalloc(nargs * sizeof(*av.nums));
	argv_str(&av, "EVALSHA", 7);
	argv_str(&av, s->sha, strlen(s->sha));
	argv_num(&av, (int64_t)nkeys);
	for (i = 0; i < b->count; i++)
		query_push_keys(&av, &b->cmds[i]->q);
	argv_str(&av, "M", 1);
	argv_num(&av, (int64_t)nd);
	for (i = 0; i < b->count; i++)
		query_push_decisions(&av, &b->cmds[i]->q);
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
		while (n->nbatch && b->count < s->batch_max)
			b->cmds[b->count++] = batch_pop(n);
		s->stats.batch_calls++;
		s->stats.batched += b->count;
		if (batch_send_call(n, b) != REDIS_OK) {
			unsigned i;

			n->out -= b->count;
			for (i = 0; i < b->count; i++)
				cmd_reply(n, b->cmds[i], NULL);
			free(b);
		}
	}
}
