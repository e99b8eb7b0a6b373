/* SPDX-License-Identifier: MIT */
/*
 * Redis store, the topology (see the LAYERS and the DESIGN in store.c): the
 * mode and the slot map, CLUSTER SLOTS and its refresh schedule, MOVED and ASK
 * redirections. Calls the command layer (store_cmd.c: a redirected command
 * dispatched, answered, freed) and the node layer (store_node.c: nodes found
 * or made, their health told); store.c wires it into the layers' callbacks.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crc16.h"
#include "log.h"
#include "reply_parse.h"
#include "store_cluster.h"
#include "store_cmd.h"
#include "store_node.h"
#include "util.h"

/* Routes <slot> to <n> (NULL: nobody), keeping the slot counts right. */
void slot_set(struct store *s, unsigned slot, struct store_node *n)
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
 * replies it owes are in, and what is queued there (sent as they come in;
 * a MOVED is followed). What is parked there, waiting for it to connect,
 * goes where the new map says (an ASK's target that owns no slot yet leaves
 * the map of a refresh answered meanwhile: its command goes back to the
 * owner, which asks again). Invokes user callbacks (on failure).
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
	node_route_parked(n);
}

/* ---- replies ------------------------------------------------------------- */

/*
 * Follows the MOVED or ASK error <err> that node <from> sent for the live
 * command <c>. Returns false when <err> is no redirection. Otherwise <c> has
 * been re-sent or parked elsewhere, or answered (ERROR, DOWN) and freed, and
 * true is returned. Invokes user callbacks when it answers.
 */
bool cmd_redirect(struct store_node *from, struct store_cmd *c, const char *err)
{
	struct store *s = from->s;
	struct store_node *to;
	struct endpoint ep;
	struct reply_redirect rd;
	int parsed;
	bool ask;

	parsed = reply_redirect_parse(err, &rd);
	if (parsed > 0)
		return false;
	LOG(LOG_DEBUG, "redis %s: %s", from->name, err);
	/* the node answered: it is healthy, whatever its slots */
	breaker_record(from, STORE_OK);
	if (parsed < 0)
		goto bad;
	ask = rd.ask;
	if (endpoint_make(&ep, from, rd.host, rd.hostlen, rd.port) < 0)
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
		slot_set(s, rd.slot, to);
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

/* ---- topology ------------------------------------------------------------ */

/*
 * Makes the CLUSTER SLOTS array <rep> from node <src> the slot map: masters
 * only, new ones connected, those no longer in it retired. A malformed reply
 * changes nothing and returns false. Invokes user callbacks (commands parked
 * at retired nodes).
 */
static bool topology_apply(struct store *s, struct store_node *src, const redisReply *rep)
{
	unsigned masters = 0, changed = 0, i;
	struct reply_slots_entry se;
	struct list *l, *tmp;
	size_t k;

	for (k = 0; k < rep->elements; k++) {
		if (reply_slots_entry(rep->element[k], &se) < 0) {
			store_log_trouble(src, "CLUSTER SLOTS", "unexpected reply shape");
			node_error(src, STORE_EC_OTHER);
			return false;
		}
	}
	for (l = s->nodes.next; l != &s->nodes; l = l->next)
		LIST_ELEM(l, struct store_node, link)->mark = false;
	memset(s->scratch, 0, CRC16_SLOTS * sizeof(*s->scratch));
	for (k = 0; k < rep->elements; k++) {
		struct store_node *n;
		struct endpoint ep;
		unsigned slot;

		(void)reply_slots_entry(rep->element[k], &se); /* checked above */
		/* "": the node we asked (unknown or own endpoint) */
		if (endpoint_make(&ep, src, se.host, se.hostlen, (long)se.port) < 0) {
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
		for (slot = se.start; slot <= se.end; slot++)
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
	return true;
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

static void slots_reply_cb(struct rconn *rc, void *reply, void *privdata)
{
	struct store_node *n = rconn_data(rc);
	struct store *s = n->s;
	redisReply *rep = reply;
	bool unknown = s->mode == MODE_UNKNOWN;

	(void)privdata;
	if (s->refresh_node != n || s->freeing)
		return; /* expired (another one may be out) or shutting down */
	s->refresh_node = NULL;
	if (!rep) {
		s->refresh_wanted = true;
	} else if (rep->type == REDIS_REPLY_ARRAY) {
		/* nonsense before the mode is known: ask again (the tick does), or
		 * the store would never be ready */
		if (!topology_apply(s, n, rep) && s->mode == MODE_UNKNOWN)
			s->refresh_wanted = true;
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
		node_error(n, STORE_EC_OTHER);
		if (s->mode == MODE_UNKNOWN)
			s->refresh_wanted = true;
	}
	/* the first decisions of the process waited at the seed for this */
	if (unknown && s->mode != MODE_UNKNOWN && s->seed)
		node_route_parked(s->seed);
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

		if (n->state != ND_READY || !n->rc)
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
void refresh_kick(struct store *s)
{
	const char *argv[2] = {"CLUSTER", "SLOTS"};
	double now = mono();
	struct store_node *n;

	if (!s->refresh_wanted || s->refresh_node || s->freeing ||
	    now - s->refresh_last < REFRESH_MIN_S)
		return; /* the tick or the next ready node comes back to it */
	n = refresh_pick(s);
	if (!n || rconn_command(n->rc, slots_reply_cb, NULL, 2, argv, NULL) != 0)
		return;
	s->refresh_wanted = false;
	s->refresh_node = n;
	s->refresh_last = now;
	s->stats.refreshes++;
}

void refresh_request(struct store *s)
{
	s->refresh_wanted = true;
	refresh_kick(s);
}
