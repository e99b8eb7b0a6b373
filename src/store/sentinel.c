/* SPDX-License-Identifier: MIT */
/*
 * Redis Sentinel client: where the master of a name is, and when it moves.
 *
 * DESIGN
 * A master under Redis Sentinel has no fixed address: the Sentinels know it
 * and elect a replica in its place when it fails. The store's node for such a
 * master (store_node.c) asks here before every connect, as a named node asks
 * DNS; this file knows nothing of nodes, it answers through callbacks.
 *
 * Locate. `SENTINEL get-master-addr-by-name <master>` is asked of one Sentinel
 * at a time, on a short-lived connection (AUTH first when configured), the one
 * that answered last time first; a Sentinel that refuses, does not know the
 * name or does not answer within timeout_ms is passed over for the next. The
 * answer is delivered from the loop, never from within sentinel_locate(). One
 * locate at a time (the store has one master here); a new one replaces it.
 *
 * Watch. One long-lived connection to a Sentinel is SUBSCRIBEd to
 * +switch-master; a message for our name is handed to the store at once, which
 * then connects to the new master (asking again: the Sentinels' word, not the
 * message's, decides). A watch connection that fails moves on to the next
 * Sentinel after a second. A Sentinel may also stop answering without closing
 * (frozen, or a link that drops packets): the watch PINGs it every
 * WATCH_PING_S, and one that has sent nothing (no confirmation, no pong, no
 * message) for WATCH_PING_S + timeout_ms is dropped for the next. What a
 * Sentinel sends is read within the replies' limits (store_reply.h), as
 * everything from Redis is. Missing a message is never fatal: the store also
 * locates again whenever its connection is lost, ROLE says the server is no
 * master, or a reply says READONLY.
 *
 * A Sentinel's address may be a host name: it is resolved on the loop
 * (resolve.c) when the client starts and again when its TTL runs out, and a
 * Sentinel whose name has no address yet is passed over like one that is
 * down. The Sentinels' own answers are numeric unless they run with
 * `resolve-hostnames yes`; a name there is resolved before it is handed on.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "list.h"
#include "log.h"
#include "rconn.h"
#include "reply_parse.h"
#include "resolve.h"
#include "sentinel.h"
#include "store_reply.h"
#include "tls.h"
#include "util.h"

#define WATCH_RETRY_S 1.0
#define WATCH_PING_S  2.0

/* The argument of one Sentinel's name lookup. */
struct sentinel_lookup {
	struct sentinel *sn;
	size_t i;
};

struct sentinel {
	struct ev_loop *loop;           /* ref */
	char *hosts[SENTINEL_MAX];      /* owned: numeric, or a name */
	int ports[SENTINEL_MAX];
	char ips[SENTINEL_MAX][INET6_ADDRSTRLEN]; /* a name's address dialled last, "" none yet */
	char addrs[SENTINEL_MAX][RESOLVE_MAX_ADDRS][INET6_ADDRSTRLEN]; /* ... all of them */
	unsigned naddrs[SENTINEL_MAX];  /* ... how many */
	unsigned next[SENTINEL_MAX];    /* ... the one dialled next (in turn) */
	double ip_until[SENTINEL_MAX];  /* mono(): that answer's TTL runs out */
	struct resolve_req *rqs[SENTINEL_MAX]; /* lookups in flight */
	struct sentinel_lookup lk[SENTINEL_MAX]; /* ... their arguments */
	size_t n;
	struct resolver *resolver;      /* owned, made at the first name, or NULL */
	struct resolver_opts resolver_opts; /* nameservers: a reference (the store's) */
	bool names;                     /* some Sentinel is given by name */
	ev_timer rtimer;                /* the names' TTLs */
	struct resolve_req *mrq;        /* a master's name being resolved (locate) */
	int mport;
	char mname[64];                 /* ... that name, for the certificate to carry */
	char *master;                   /* owned */
	char *user, *password;          /* owned or NULL */
	struct tls_ctx *tls;            /* a reference, or NULL: clear text */
	struct reply_limits limits;     /* what one reply may be */
	double timeout_s;
	sentinel_switch_fn *on_switch;
	void *arg;

	/* locate */
	sentinel_addr_fn *lcb;          /* NULL: no locate going on */
	void *larg;
	struct rconn *lac;              /* the Sentinel asked now, or NULL */
	size_t lidx;                    /* ... its index */
	size_t ltried;                  /* Sentinels asked in this locate */
	size_t preferred;               /* the one that answered last */
	ev_timer ltimer;                /* 0: start; then the attempt's deadline */
	char lerr[256];                 /* why the last one did not answer */

	/* watch */
	struct rconn *wac;              /* SUBSCRIBEd connection, or NULL */
	size_t widx;
	ev_timer wtimer;                /* reconnect */
	ev_timer wlive;                 /* every WATCH_PING_S: PING, or drop a silent one */
	char wlast[SENTINEL_MAX][160];  /* each Sentinel's last watch trouble logged: said once */
	double wseen;                   /* mono(): the watch connection last sent something */
	bool wsubscribed;               /* ... and its subscription was confirmed */
};

static void locate_next(struct sentinel *sn);
static void watch_start(struct sentinel *sn);

/* ---- names --------------------------------------------------------------- */

/* The resolver, made when first needed; NULL (logged) when it cannot be. */
static struct resolver *sentinel_resolver(struct sentinel *sn)
{
	char err[256];

	if (!sn->resolver) {
		sn->resolver = resolver_new(sn->loop, &sn->resolver_opts, err, sizeof(err));
		if (!sn->resolver)
			LOG(LOG_ERR, "sentinel: resolver: %s", err);
	}
	return sn->resolver;
}

static void name_resolved(void *arg, const struct resolve_result *res)
{
	struct sentinel_lookup *l = arg;
	struct sentinel *sn = l->sn;
	size_t i = l->i;

	sn->rqs[i] = NULL;
	if (res->ok) {
		memcpy(sn->addrs[i], res->addrs, sizeof(sn->addrs[i]));
		sn->naddrs[i] = res->naddrs;
		snprintf(sn->ips[i], sizeof(sn->ips[i]), "%s", res->addrs[0]);
		sn->ip_until[i] = mono() + res->ttl_s;
	} else {
		LOG(LOG_WARN, "sentinel %s:%d: resolve: %s", sn->hosts[i], sn->ports[i], res->error);
		sn->ip_until[i] = mono() + RESOLVE_TTL_MIN_S;
	}
}

/* Looks up every name whose answer is missing or expired (no more than one at a time each). */
static void names_refresh(struct sentinel *sn)
{
	double now = mono();
	size_t i;

	for (i = 0; i < sn->n && sn->resolver; i++) {
		if (host_is_numeric(sn->hosts[i]) || sn->rqs[i] ||
		    (sn->ips[i][0] && now < sn->ip_until[i]))
			continue;
		sn->lk[i].sn = sn;
		sn->lk[i].i = i;
		sn->rqs[i] = resolver_lookup(sn->resolver, sn->hosts[i], name_resolved, &sn->lk[i]);
	}
}

static void rtimer_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	(void)loop;
	(void)revents;
	names_refresh(container_of(t, struct sentinel, rtimer));
}

/*
 * Sentinel <i>'s address to dial now: numeric, or one of its name's last answer
 * (NULL: none yet), each in turn: a name with several addresses, one of them
 * down, is not stuck on the first.
 */
static const char *sentinel_ip(struct sentinel *sn, size_t i)
{
	if (host_is_numeric(sn->hosts[i]))
		return sn->hosts[i];
	if (!sn->ips[i][0]) {
		names_refresh(sn);
		return NULL;
	}
	if (sn->naddrs[i] > 1) { /* copied, not printed: both live in <sn> (-Wrestrict) */
		const char *a = sn->addrs[i][sn->next[i]++ % sn->naddrs[i]];
		size_t l = strnlen(a, sizeof(sn->ips[i]) - 1);

		memcpy(sn->ips[i], a, l);
		sn->ips[i][l] = 0;
	}
	return sn->ips[i];
}

/* A new connection to Sentinel <i>, AUTHed when configured; NULL if it fails at once. */
static struct rconn *sentinel_dial(struct sentinel *sn, size_t i, rconn_event_fn *ccb,
				   rconn_event_fn *dcb)
{
	struct rconn_opts o = {.loop = sn->loop, .data = sn, .on_connect = ccb,
			       .on_disconnect = dcb, .tls = sn->tls, .keepalive = true,
			       .limits = &sn->limits};
	const char *ip = sentinel_ip(sn, i);
	char err[256];
	struct rconn *ac;

	if (!ip) {
		snprintf(sn->lerr, sizeof(sn->lerr), "%.60s:%d: its name has no address yet",
			 sn->hosts[i], sn->ports[i]);
		return NULL;
	}
	if (ip != sn->hosts[i])
		o.server_name = sn->hosts[i];
	ac = rconn_connect(&o, ip, sn->ports[i], NULL, err, sizeof(err));
	if (!ac) {
		snprintf(sn->lerr, sizeof(sn->lerr), "%.60s:%d: %.160s", sn->hosts[i], sn->ports[i], err);
		return NULL;
	}
	if (sn->password) {
		const char *argv[3] = {"AUTH", sn->user ? sn->user : sn->password, sn->password};

		(void)rconn_command(ac, NULL, NULL, sn->user ? 3 : 2, argv, NULL);
	}
	return ac;
}

/* ---- locate ------------------------------------------------------------- */

static void locate_done(struct sentinel *sn, const char *ip, int port, const char *name,
			const char *err)
{
	sentinel_addr_fn *cb = sn->lcb;
	struct rconn *ac = sn->lac;

	sn->lcb = NULL;
	sn->lac = NULL;
	ev_timer_stop(sn->loop, &sn->ltimer);
	if (ac)
		rconn_disconnect(ac); /* safe from its own callbacks */
	if (cb)
		cb(sn->larg, ip, port, name, err);
}

/* The attempt on the current Sentinel failed (<why>): the next one. */
static void locate_fail(struct sentinel *sn, const char *why)
{
	struct rconn *ac = sn->lac;

	snprintf(sn->lerr, sizeof(sn->lerr), "%.60s:%d: %.160s", sn->hosts[sn->lidx], sn->ports[sn->lidx],
		 why);
	if (sn->mrq) {
		resolve_cancel(sn->mrq);
		sn->mrq = NULL;
	}
	sn->lac = NULL;
	if (ac)
		rconn_disconnect(ac);
	sn->lidx = (sn->lidx + 1) % sn->n;
	/* from the loop, not from within this Sentinel's callbacks */
	ev_timer_stop(sn->loop, &sn->ltimer);
	ev_timer_set(&sn->ltimer, 0., 0.);
	ev_timer_start(sn->loop, &sn->ltimer);
}

/* The master's name, answered by a Sentinel, resolved: the locate is done. */
static void master_resolved(void *arg, const struct resolve_result *res)
{
	struct sentinel *sn = arg;
	char why[200];

	sn->mrq = NULL;
	if (!sn->lcb)
		return;
	if (res->ok) {
		locate_done(sn, res->addrs[0], sn->mport, sn->mname, NULL);
		return;
	}
	snprintf(why, sizeof(why), "the master's name: %s", res->error);
	locate_fail(sn, why);
}

static void addr_reply_cb(struct rconn *ac, void *reply, void *privdata)
{
	struct sentinel *sn = rconn_data(ac);
	redisReply *r = reply;
	struct reply_master_addr ma;
	const char *host = ma.host;

	(void)privdata;
	if (ac != sn->lac || !sn->lcb)
		return;
	if (!r) {
		locate_fail(sn, rconn_errstr(ac)[0] ? rconn_errstr(ac) : "connection lost");
		return;
	}
	if (r->type == REDIS_REPLY_ERROR) {
		locate_fail(sn, r->str); /* e.g. NOAUTH, WRONGPASS, no such command */
		return;
	}
	if (r->type != REDIS_REPLY_ARRAY || r->elements != 2 ||
	    r->element[0]->type != REDIS_REPLY_STRING || r->element[1]->type != REDIS_REPLY_STRING) {
		locate_fail(sn, r->type == REDIS_REPLY_NIL ? "does not know the master" : "bad reply");
		return;
	}
	if (reply_master_addr(r, &ma) < 0) {
		locate_fail(sn, "bad address in its reply");
		return;
	}
	sn->preferred = sn->lidx;
	if (!host_is_numeric(host)) { /* resolve-hostnames yes: the master's name */
		if (!host_name_ok(host) || !sentinel_resolver(sn)) {
			locate_fail(sn, "answered a name that is no host name");
			return;
		}
		ev_timer_stop(sn->loop, &sn->ltimer); /* the lookup has its own deadline */
		sn->mport = ma.port;
		snprintf(sn->mname, sizeof(sn->mname), "%s", host);
		sn->mrq = resolver_lookup(sn->resolver, host, master_resolved, sn);
		if (!sn->mrq)
			locate_fail(sn, "cannot resolve the master's name");
		return;
	}
	locate_done(sn, host, ma.port, NULL, NULL);
}

static void locate_connect_cb(struct rconn *cac, int status)
{
	struct sentinel *sn = rconn_data(cac);

	if (cac != sn->lac || status == 0)
		return;
	sn->lac = NULL; /* freed after this callback */
	locate_fail(sn, rconn_errstr(cac));
}

static void locate_disconnect_cb(struct rconn *cac, int status)
{
	struct sentinel *sn = rconn_data(cac);

	(void)status;
	if (cac != sn->lac)
		return;
	sn->lac = NULL;
	locate_fail(sn, "connection lost");
}

static void locate_next(struct sentinel *sn)
{
	const char *argv[3] = {"SENTINEL", "get-master-addr-by-name", sn->master};

	if (sn->ltried >= sn->n) {
		char err[320];

		snprintf(err, sizeof(err), "no Sentinel answered (last: %s)", sn->lerr);
		locate_done(sn, NULL, 0, NULL, err);
		return;
	}
	sn->ltried++;
	sn->lac = sentinel_dial(sn, sn->lidx, locate_connect_cb, locate_disconnect_cb);
	if (!sn->lac) {
		locate_fail(sn, sn->lerr[0] ? sn->lerr : "out of memory");
		return;
	}
	(void)rconn_command(sn->lac, addr_reply_cb, NULL, 3, argv, NULL);
	ev_timer_stop(sn->loop, &sn->ltimer);
	ev_timer_set(&sn->ltimer, sn->timeout_s, 0.);
	ev_timer_start(sn->loop, &sn->ltimer);
}

static void ltimer_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct sentinel *sn = container_of(t, struct sentinel, ltimer);
	struct rconn *ac = sn->lac;

	(void)loop;
	(void)revents;
	if (!sn->lcb)
		return;
	if (!ac) {
		locate_next(sn);
		return;
	}
	sn->lac = NULL; /* its callbacks, called from rconn_free(), are ignored */
	rconn_free(ac);
	locate_fail(sn, "timed out");
}

/*
 * Asks the Sentinels where the master is; <cb>(<arg>, ip, port, NULL) or
 * <cb>(<arg>, NULL, 0, why) once, from the loop. Replaces a locate going on.
 */
void sentinel_locate(struct sentinel *sn, sentinel_addr_fn *cb, void *arg)
{
	sentinel_cancel(sn);
	sn->lcb = cb;
	sn->larg = arg;
	sn->ltried = 0;
	sn->lidx = sn->preferred;
	sn->lerr[0] = 0;
	ev_timer_set(&sn->ltimer, 0., 0.);
	ev_timer_start(sn->loop, &sn->ltimer);
}

/* The locate going on, if any, will not call back. */
void sentinel_cancel(struct sentinel *sn)
{
	struct rconn *ac = sn->lac;

	sn->lcb = NULL;
	sn->lac = NULL;
	ev_timer_stop(sn->loop, &sn->ltimer);
	if (sn->mrq) {
		resolve_cancel(sn->mrq);
		sn->mrq = NULL;
	}
	rconn_free(ac); /* deferred when called from its own callbacks */
}

/* ---- watch -------------------------------------------------------------- */

static void watch_retry(struct sentinel *sn)
{
	sn->wac = NULL;
	sn->widx = (sn->widx + 1) % sn->n;
	ev_timer_stop(sn->loop, &sn->wtimer);
	ev_timer_set(&sn->wtimer, WATCH_RETRY_S, 0.);
	ev_timer_start(sn->loop, &sn->wtimer);
}

/* "+switch-master" messages: "<name> <old ip> <old port> <new ip> <new port>". */
static void switch_msg_cb(struct rconn *ac, void *reply, void *privdata)
{
	struct sentinel *sn = rconn_data(ac);
	redisReply *r = reply;
	struct reply_switch sw;

	(void)privdata;
	if (!r || ac != sn->wac)
		return;
	sn->wseen = mono();
	if (r->type == REDIS_REPLY_ERROR) {
		LOG(LOG_WARN, "sentinel %s:%d: SUBSCRIBE: %s", sn->hosts[sn->widx], sn->ports[sn->widx],
		    r->str);
		rconn_disconnect(ac);
		return;
	}
	if (r->type != REDIS_REPLY_ARRAY || r->elements != 3 ||
	    r->element[0]->type != REDIS_REPLY_STRING || strcmp(r->element[0]->str, "message") ||
	    r->element[2]->type != REDIS_REPLY_STRING) {
		if (sn->wsubscribed)    /* a pong: it works, its next trouble is news */
			sn->wlast[sn->widx][0] = 0;
		sn->wsubscribed = true; /* the subscription's confirmation, or a pong */
		return;
	}
	if (reply_switch_master(r->element[2], &sw) < 0 || strcmp(sw.name, sn->master) != 0)
		return;
	LOG(LOG_NOTICE, "sentinel %s:%d: +switch-master %s: %s:%d -> %s:%d", sn->hosts[sn->widx],
	    sn->ports[sn->widx], sw.name, sw.old_host, sw.old_port, sw.new_host, sw.new_port);
	sn->on_switch(sn->arg, sw.new_host, sw.new_port);
}

/* Logs the watch's trouble <what> with the Sentinel watched, unless it is what was
 * logged last for that Sentinel (a pong forgets it). */
static void watch_trouble(struct sentinel *sn, const char *what)
{
	char *last = sn->wlast[sn->widx];

	if (strncmp(last, what, sizeof(sn->wlast[0]) - 1) == 0)
		return;
	snprintf(last, sizeof(sn->wlast[0]), "%s", what);
	LOG(LOG_WARN, "sentinel %s:%d: %s; watching the next Sentinel", sn->hosts[sn->widx],
	    sn->ports[sn->widx], what);
}

static void watch_connect_cb(struct rconn *cac, int status)
{
	struct sentinel *sn = rconn_data(cac);

	if (cac != sn->wac || status == 0)
		return;
	watch_trouble(sn, rconn_errstr(cac));
	watch_retry(sn); /* freed after this callback */
}

static void watch_disconnect_cb(struct rconn *cac, int status)
{
	struct sentinel *sn = rconn_data(cac);

	if (cac != sn->wac)
		return;
	if (status != 0)
		watch_trouble(sn, rconn_errstr(cac));
	watch_retry(sn);
}

static void watch_start(struct sentinel *sn)
{
	const char *argv[2] = {"SUBSCRIBE", "+switch-master"};

	sn->wac = sentinel_dial(sn, sn->widx, watch_connect_cb, watch_disconnect_cb);
	if (!sn->wac) {
		watch_retry(sn);
		return;
	}
	sn->wseen = mono();
	sn->wsubscribed = false;
	(void)rconn_subscribe(sn->wac, switch_msg_cb, NULL, 2, argv);
}

/* The watch's liveness: a PING to a subscribed Sentinel, the next one for a silent one. */
static void wlive_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct sentinel *sn = container_of(t, struct sentinel, wlive);
	const char *ping[1] = {"PING"};
	struct rconn *ac = sn->wac;

	(void)loop;
	(void)revents;
	if (!ac)
		return;
	if (mono() - sn->wseen > WATCH_PING_S + sn->timeout_s) {
		char why[96];

		snprintf(why, sizeof(why), "watch: %s for %.0f ms",
			 sn->wsubscribed ? "no answer to PING" : "no answer to SUBSCRIBE",
			 (WATCH_PING_S + sn->timeout_s) * 1000);
		watch_trouble(sn, why);
		sn->wac = NULL; /* its callbacks, called from rconn_free(), are ignored */
		rconn_free(ac);
		watch_retry(sn);
		return;
	}
	if (sn->wsubscribed) {
		(void)rconn_sub_command(ac, 1, ping);
		rconn_flush(ac);
	}
}

static void wtimer_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	(void)loop;
	(void)revents;
	watch_start(container_of(t, struct sentinel, wtimer));
}

/* ---- life ---------------------------------------------------------------- */

/*
 * A client of the Sentinels <o> on <loop>; it starts watching for
 * +switch-master at once (<on_switch>(<arg>, ...)). The addresses are
 * "host:port", "ip:port" or "[ip6]:port" (checked by the configuration).
 */
struct sentinel *sentinel_new(struct ev_loop *loop, const struct sentinel_opts *o,
			      sentinel_switch_fn *on_switch, void *arg)
{
	struct sentinel *sn = xcalloc(1, sizeof(*sn));
	size_t i;

	sn->loop = loop;
	if (o->resolver)
		sn->resolver_opts = *o->resolver;
	for (i = 0; i < o->naddrs && sn->n < SENTINEL_MAX; i++) {
		char host[256];
		int port;

		if (hostport_split(o->addrs[i], host, sizeof(host), &port) < 0 ||
		    !(host_is_numeric(host) || host_name_ok(host)))
			continue;
		sn->hosts[sn->n] = xstrdup(host);
		sn->ports[sn->n++] = port;
		if (!host_is_numeric(host))
			sn->names = true;
	}
	BUG_ON(!sn->n);
	sn->master = xstrdup(o->master);
	sn->user = o->user && *o->user ? xstrdup(o->user) : NULL;
	sn->password = o->password && *o->password ? xstrdup(o->password) : NULL;
	sn->tls = tls_ctx_ref(o->tls);
	sn->limits = o->limits ? *o->limits : (struct reply_limits)REPLY_LIMITS_DEFAULT;
	sn->timeout_s = (o->timeout_ms ? o->timeout_ms : 200) / 1000.;
	sn->on_switch = on_switch;
	sn->arg = arg;
	ev_timer_init(&sn->ltimer, ltimer_cb, 0., 0.);
	ev_timer_init(&sn->wtimer, wtimer_cb, 0., 0.);
	ev_timer_init(&sn->wlive, wlive_cb, WATCH_PING_S, WATCH_PING_S);
	ev_timer_start(loop, &sn->wlive);
	ev_timer_init(&sn->rtimer, rtimer_cb, RESOLVE_TTL_MIN_S, RESOLVE_TTL_MIN_S);
	if (sn->names && sentinel_resolver(sn)) {
		names_refresh(sn);
		ev_timer_start(loop, &sn->rtimer);
	}
	watch_start(sn);
	return sn;
}

void sentinel_free(struct sentinel *sn)
{
	struct rconn *ac;
	size_t i;

	if (!sn)
		return;
	sentinel_cancel(sn);
	ev_timer_stop(sn->loop, &sn->wtimer);
	ev_timer_stop(sn->loop, &sn->wlive);
	ev_timer_stop(sn->loop, &sn->rtimer);
	for (i = 0; i < sn->n; i++)
		if (sn->rqs[i])
			resolve_cancel(sn->rqs[i]);
	resolver_free(sn->resolver);
	ac = sn->wac;
	sn->wac = NULL;
	rconn_free(ac);
	tls_ctx_free(sn->tls);
	for (i = 0; i < sn->n; i++)
		free(sn->hosts[i]);
	free(sn->master);
	free(sn->user);
	free(sn->password);
	free(sn);
}

/* The TLS (a reference is taken, NULL: clear text) of the connections made from now on. */
void sentinel_set_tls(struct sentinel *sn, struct tls_ctx *tls)
{
	tls_ctx_free(sn->tls);
	sn->tls = tls_ctx_ref(tls);
}
