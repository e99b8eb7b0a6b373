/* SPDX-License-Identifier: MIT */
/*
 * Host names resolved on the event loop, never blocking it.
 *
 * DESIGN
 * hiredis (and getaddrinfo()) resolve a name by blocking the thread that asks:
 * on the agent's loop that would stall every decision for as long as DNS takes
 * (seconds, when a server does not answer). c-ares, Debian's asynchronous
 * resolver (1.18 in Debian 12, 1.34 in Debian 13; only calls both have and
 * neither deprecates), runs the queries on sockets this file watches with
 * libev: ARES_OPT_SOCK_STATE_CB says which sockets to watch for what, one
 * ev_io each, and one ev_timer follows ares_timeout() for retries.
 *
 * A lookup's answer is every address of the name (A and AAAA, at most
 * RESOLVE_MAX_ADDRS, in c-ares' order), numeric, with the lowest TTL among
 * them bounded to [RESOLVE_TTL_MIN_S, RESOLVE_TTL_MAX_S]: the caller decides
 * when to ask again. Answers are always delivered from the loop (a zero
 * timer), never from within resolver_lookup(), even when c-ares answers at
 * once (the hosts file, a bad name): callers need no re-entrancy care. A
 * cancelled lookup is never called back; c-ares cannot cancel one query, so
 * its answer is dropped when it comes.
 *
 * The resolver is made when a name is first looked up (store.c): an agent
 * whose addresses are all numeric runs no resolver at all.
 */
#include <arpa/inet.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <ares.h>

#include "list.h"
#include "resolve.h"
#include "util.h"

struct rsock {
	ev_io io;
	struct resolver *r;             /* ref: owner */
	struct rsock *next;
};

struct resolve_req {
	struct resolver *r;             /* ref: owner */
	resolve_fn *cb;
	void *arg;
	bool cancelled;                 /* never call back; freed when c-ares answers */
	bool done;                      /* answered, on r->done, waiting for delivery */
	struct resolve_req *next;       /* in r->done */
	struct resolve_result res;
	char error[96];
};

struct resolver {
	struct ev_loop *loop;           /* ref */
	ares_channel channel;
	struct rsock *socks;            /* watched sockets */
	ev_timer timer;                 /* c-ares' next timeout */
	ev_timer deliver;               /* zero timer: answers to deliver */
	struct resolve_req *done;       /* answered, oldest first */
	struct resolve_req *done_tail;
	bool destroying;
};

static int lib_inits;

static void arm_timer(struct resolver *r)
{
	struct timeval tv, *tvp;

	ev_timer_stop(r->loop, &r->timer);
	tvp = ares_timeout(r->channel, NULL, &tv);
	if (!tvp)
		return;
	ev_timer_set(&r->timer, (double)tvp->tv_sec + tvp->tv_usec / 1e6, 0.);
	ev_timer_start(r->loop, &r->timer);
}

static void sock_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct rsock *s = container_of(w, struct rsock, io);
	struct resolver *r = s->r;
	int fd = w->fd;

	(void)loop;
	/* <s> may be freed inside: nothing of it is read afterwards */
	ares_process_fd(r->channel, (revents & EV_READ) ? fd : ARES_SOCKET_BAD,
			(revents & EV_WRITE) ? fd : ARES_SOCKET_BAD);
	arm_timer(r);
}

static void timer_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct resolver *r = container_of(t, struct resolver, timer);

	(void)loop;
	(void)revents;
	ares_process_fd(r->channel, ARES_SOCKET_BAD, ARES_SOCKET_BAD);
	arm_timer(r);
}

/* c-ares: watch <fd> for reading and/or writing, or no more. */
static void sock_state_cb(void *data, ares_socket_t fd, int readable, int writable)
{
	struct resolver *r = data;
	struct rsock **pp, *s;
	int events = (readable ? EV_READ : 0) | (writable ? EV_WRITE : 0);

	for (pp = &r->socks; *pp && (*pp)->io.fd != fd; pp = &(*pp)->next)
		;
	s = *pp;
	if (!events) {
		if (s) {
			ev_io_stop(r->loop, &s->io);
			*pp = s->next;
			free(s);
		}
		return;
	}
	if (!s) {
		s = xcalloc(1, sizeof(*s));
		s->r = r;
		s->next = r->socks;
		r->socks = s;
		ev_io_init(&s->io, sock_cb, fd, events);
	} else {
		ev_io_stop(r->loop, &s->io);
		ev_io_set(&s->io, fd, events);
	}
	ev_io_start(r->loop, &s->io);
}

static void deliver_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct resolver *r = container_of(t, struct resolver, deliver);

	(void)loop;
	(void)revents;
	while (r->done) {
		struct resolve_req *q = r->done;

		r->done = q->next;
		if (!r->done)
			r->done_tail = NULL;
		q->res.error = q->error;
		q->cb(q->arg, &q->res);
		free(q);
	}
}

static void add_addr(struct resolve_req *q, const struct sockaddr *sa)
{
	struct resolve_result *res = &q->res;
	char buf[INET6_ADDRSTRLEN];
	const void *a;
	unsigned i;

	if (sa->sa_family == AF_INET)
		a = &((const struct sockaddr_in *)(const void *)sa)->sin_addr;
	else if (sa->sa_family == AF_INET6)
		a = &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr;
	else
		return;
	if (!inet_ntop(sa->sa_family, a, buf, sizeof(buf)))
		return;
	for (i = 0; i < res->naddrs; i++)
		if (strcmp(res->addrs[i], buf) == 0)
			return;
	if (res->naddrs < RESOLVE_MAX_ADDRS)
		memcpy(res->addrs[res->naddrs++], buf, sizeof(buf));
}

/* c-ares' answer to one lookup (possibly from within ares_getaddrinfo()). */
static void addrinfo_cb(void *arg, int status, int timeouts, struct ares_addrinfo *ai)
{
	struct resolve_req *q = arg;
	struct resolver *r = q->r;
	struct ares_addrinfo_node *node;
	long ttl = RESOLVE_TTL_MAX_S;

	(void)timeouts;
	if (q->cancelled || r->destroying) {
		if (ai)
			ares_freeaddrinfo(ai);
		free(q);
		return;
	}
	if (status == ARES_SUCCESS && ai) {
		for (node = ai->nodes; node; node = node->ai_next) {
			add_addr(q, node->ai_addr);
			if (node->ai_ttl < ttl)
				ttl = node->ai_ttl;
		}
	}
	if (ai)
		ares_freeaddrinfo(ai);
	if (ttl < RESOLVE_TTL_MIN_S)
		ttl = RESOLVE_TTL_MIN_S;
	q->res.ttl_s = (unsigned)ttl;
	q->res.ok = q->res.naddrs > 0;
	if (!q->res.ok)
		snprintf(q->error, sizeof(q->error), "%s",
			 status == ARES_SUCCESS ? "no address" : ares_strerror(status));
	q->done = true;
	if (r->done_tail)
		r->done_tail->next = q;
	else
		r->done = q;
	r->done_tail = q;
	ev_timer_start(r->loop, &r->deliver);
}

/*
 * A resolver on <loop> with the options <o>; NULL with a message in <err> when
 * c-ares cannot start (or the nameservers are not understood).
 */
struct resolver *resolver_new(struct ev_loop *loop, const struct resolver_opts *o, char *err,
			      size_t errlen)
{
	struct resolver *r = xcalloc(1, sizeof(*r));
	struct ares_options ao;
	int mask = ARES_OPT_SOCK_STATE_CB, st;

	if (!lib_inits++ && (st = ares_library_init(ARES_LIB_INIT_ALL)) != ARES_SUCCESS) {
		snprintf(err, errlen, "c-ares: %s", ares_strerror(st));
		lib_inits--;
		free(r);
		return NULL;
	}
	memset(&ao, 0, sizeof(ao));
	ao.sock_state_cb = sock_state_cb;
	ao.sock_state_cb_data = r;
	if (o && o->timeout_ms) {
		ao.timeout = (int)o->timeout_ms;
		mask |= ARES_OPT_TIMEOUTMS;
	}
	if (o && o->tries) {
		ao.tries = (int)o->tries;
		mask |= ARES_OPT_TRIES;
	}
	st = ares_init_options(&r->channel, &ao, mask);
	if (st != ARES_SUCCESS) {
		snprintf(err, errlen, "c-ares: %s", ares_strerror(st));
		goto fail;
	}
	if (o && o->nameservers && *o->nameservers &&
	    (st = ares_set_servers_ports_csv(r->channel, o->nameservers)) != ARES_SUCCESS) {
		snprintf(err, errlen, "nameservers '%s': %s", o->nameservers, ares_strerror(st));
		ares_destroy(r->channel);
		goto fail;
	}
	r->loop = loop;
	ev_timer_init(&r->timer, timer_cb, 0., 0.);
	ev_timer_init(&r->deliver, deliver_cb, 0., 0.);
	return r;
fail:
	free(r);
	if (!--lib_inits)
		ares_library_cleanup();
	return NULL;
}

/* Frees <r>: lookups not delivered yet are dropped (their callers are going away). */
void resolver_free(struct resolver *r)
{
	if (!r)
		return;
	r->destroying = true;
	ares_destroy(r->channel); /* calls back every query in flight: freed there */
	while (r->socks) {
		struct rsock *s = r->socks;

		r->socks = s->next;
		ev_io_stop(r->loop, &s->io);
		free(s);
	}
	while (r->done) {
		struct resolve_req *q = r->done;

		r->done = q->next;
		free(q);
	}
	ev_timer_stop(r->loop, &r->timer);
	ev_timer_stop(r->loop, &r->deliver);
	free(r);
	if (!--lib_inits)
		ares_library_cleanup();
}

/*
 * Looks up <name>'s addresses; <cb>(<arg>, result) is called once from the
 * loop, unless resolve_cancel() is called first. Never fails at once.
 */
struct resolve_req *resolver_lookup(struct resolver *r, const char *name, resolve_fn *cb,
				    void *arg)
{
	struct resolve_req *q = xcalloc(1, sizeof(*q));
	struct ares_addrinfo_hints hints;

	q->r = r;
	q->cb = cb;
	q->arg = arg;
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	ares_getaddrinfo(r->channel, name, NULL, &hints, addrinfo_cb, q);
	arm_timer(r);
	return q;
}

/* <q> will not be called back (it may be answered already, not delivered yet). */
void resolve_cancel(struct resolve_req *q)
{
	struct resolver *r = q->r;
	struct resolve_req **pp;

	if (!q->done) {
		q->cancelled = true; /* freed by addrinfo_cb() */
		return;
	}
	for (pp = &r->done; *pp != q; pp = &(*pp)->next)
		;
	*pp = q->next;
	if (r->done_tail == q) {
		struct resolve_req *t = r->done;

		while (t && t->next)
			t = t->next;
		r->done_tail = t;
	}
	free(q);
}
