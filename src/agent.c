/* SPDX-License-Identifier: MIT */
/*
 * The decision path.
 *
 * DESIGN
 * A NOTIFY carries our message (default "rl-req") with named arguments: key,
 * tier, ip, method, path, cost. The principal is the API key when one is sent
 * (tier from the `tier` argument, else the default tier) and otherwise the
 * source address, grouped by prefix (IPv4 /32 and IPv6 /64 by default).
 *
 * Redis keys are "<prefix>:{<principal>}:<limit>": the principal part is a
 * fixed-length digest (never the raw API key) or the hex of the masked
 * address, inside a hash tag so all limits of one principal live in one
 * Redis Cluster slot and are decided by one script call. Nothing a client
 * sends can reach outside its own principal part.
 *
 * The answer is a set of txn variables; on any store failure the agent answers
 * at once allow=1 degraded=1 (fail-open). Each decision holds a reference to
 * the ruleset it started with, so a reload never changes a decision midway.
 */
#include "agent.h"

#include <stdio.h>
#include <string.h>

#include <ev.h>

#include "config.h"
#include "digest.h"
#include "log.h"
#include "rules.h"
#include "spoa.h"
#include "store.h"
#include "util.h"

#define COST_MAX 1000000

struct agent {
	struct ev_loop *loop;           /* ref */
	struct ruleset *rs;             /* one reference */
	struct spoa_server *srv;        /* owned */
	struct store *store;            /* owned, NULL for store "allow" */
	size_t pending;                 /* decisions waiting for the store */
	uint64_t outcomes[OUT_COUNT];
	uint64_t degraded_by[STORE_COUNT];
	uint64_t shadow_denied;         /* decisions a shadow limit would have denied */
};

/* A decision waiting for the store. */
struct decision {
	struct agent *a;                /* ref */
	struct spoa_req *req;           /* owned until completed */
	struct ruleset *rs;             /* one reference */
	const struct rule_tier *tier;   /* ref: into rs */
};

/* What we read from the message. */
struct req_args {
	struct spop_str key;            /* API key (empty: anonymous) */
	struct spop_str tier;           /* tier name or empty */
	struct spop_data ip;            /* NULL type when absent */
	int64_t cost;
};

static void lib_log(int level, const char *msg, void *arg)
{
	(void)arg;
	LOG(level, "%s", msg);
}

static void set_str(struct spoa_req *req, const char *name, const char *s)
{
	(void)spoa_req_set_str(req, SPOP_SCOPE_TXN, name, s, strlen(s));
}

static void set_int(struct spoa_req *req, const char *name, int64_t v)
{
	(void)spoa_req_set_int(req, SPOP_SCOPE_TXN, name, v);
}

/* Seconds for headers: whole, rounded up, at least <min>. */
static int64_t ms_to_s(int64_t ms, int64_t min)
{
	int64_t s = (ms + 999) / 1000;

	return s < min ? min : s;
}

/*
 * Fills the ACK of <req> from the store's verdict <res> for <tier>. The limit
 * reported is the one that decided: on a denial the one that makes the client
 * wait longest, otherwise the one with the fewest tokens left.
 */
static void respond(struct agent *a, struct spoa_req *req, const struct ruleset *rs,
		    const struct rule_tier *tier, const struct store_result *res)
{
	const struct rule_limit *l = NULL, *shadow = NULL;
	char hdr[256];
	size_t i, pick = 0;
	int64_t t;

	for (i = 0; i < res->n; i++) {
		const struct rule_limit *li = &rs->limits[tier->idx[i]];

		if (li->shadow) {
			if (!res->v[i].allowed && !shadow)
				shadow = li;
			continue;
		}
		if (!l) {
			pick = i;
			l = li;
		} else if (!res->allowed) {
			if (res->v[i].retry_ms > res->v[pick].retry_ms) {
				pick = i;
				l = li;
			}
		} else if (res->v[i].remaining * (int64_t)l->rate <
			   res->v[pick].remaining * (int64_t)li->rate) {
			/* fewest tokens left relative to the quota */
			pick = i;
			l = li;
		}
	}
	if (shadow) {
		a->shadow_denied++;
		set_str(req, "shadow", shadow->name);
	}
	set_int(req, "allow", res->allowed ? 1 : 0);
	if (res->allowed)
		a->outcomes[OUT_ALLOWED]++;
	else
		a->outcomes[OUT_DENIED]++;
	set_str(req, "policy", tier->policy);
	if (!l)
		return; /* only shadow limits */
	if (res->allowed) {
		t = ms_to_s(res->v[pick].reset_ms, 0);
	} else {
		t = ms_to_s(res->v[pick].retry_ms, 1);
		set_int(req, "retry_after", t);
	}
	set_str(req, "rule", l->name);
	snprintf(hdr, sizeof(hdr), "\"%s\";r=%lld;t=%lld", l->name,
		 (long long)res->v[pick].remaining, (long long)t);
	set_str(req, "ratelimit", hdr);
	if (rs->cfg->legacy_headers) {
		set_int(req, "limit", (int64_t)l->rate);
		set_int(req, "remaining", res->v[pick].remaining);
		set_int(req, "reset", t);
	}
}

/* Fail-open answer: the store could not decide. */
static void respond_degraded(struct agent *a, struct spoa_req *req, const struct rule_tier *tier,
			     enum store_status why)
{
	a->outcomes[OUT_DEGRADED]++;
	if (why < STORE_COUNT)
		a->degraded_by[why]++;
	set_int(req, "allow", 1);
	set_int(req, "degraded", 1);
	set_str(req, "policy", tier->policy);
}

static void decision_done_cb(enum store_status st, const struct store_result *res, void *arg)
{
	struct decision *d = arg;
	struct agent *a = d->a;

	a->pending--;
	if (st == STORE_OK && res->n == d->tier->n)
		respond(a, d->req, d->rs, d->tier, res);
	else
		respond_degraded(a, d->req, d->tier, st == STORE_OK ? STORE_ERROR : st);
	spoa_req_done(d->req);
	ruleset_unref(d->rs);
	free(d);
}

/*
 * Writes the Redis key part for API key <key> into <out>: "k:" and the first
 * 16 bytes of its SHA-256 in hex (fixed length, whatever the key holds).
 * Returns the length written.
 */
size_t agent_principal_key(const char *key, size_t key_len, char *out, size_t outlen)
{
	uint8_t md[SHA256_LEN];
	char hex[2 * 16 + 1];

	sha256(key, key_len, md);
	hex_encode(md, 16, hex);
	return (size_t)snprintf(out, outlen, "k:%s", hex);
}

/* The key part for an anonymous client: its address masked to the prefix. */
static void principal_ip(const struct ruleset *rs, const struct spop_data *ip, char *out,
			 size_t outlen)
{
	uint8_t addr[16];
	char hex[33];
	unsigned bits, i, len;

	if (ip->type == SPOP_T_IPV4) {
		len = 4;
		bits = rs->cfg->ipv4_prefix;
		memcpy(addr, ip->v.ipv4, 4);
	} else if (ip->type == SPOP_T_IPV6) {
		len = 16;
		bits = rs->cfg->ipv6_prefix;
		memcpy(addr, ip->v.ipv6, 16);
		/* IPv4-mapped addresses are IPv4 clients */
		if (memcmp(addr, "\0\0\0\0\0\0\0\0\0\0\xff\xff", 12) == 0) {
			len = 4;
			bits = rs->cfg->ipv4_prefix;
			memmove(addr, addr + 12, 4);
		}
	} else {
		snprintf(out, outlen, "ip:none");
		return;
	}
	for (i = 0; i < len; i++) {
		unsigned keep = bits >= 8 * (i + 1) ? 8 : (bits > 8 * i ? bits - 8 * i : 0);

		addr[i] &= (uint8_t)(0xff00 >> keep);
	}
	hex_encode(addr, len, hex);
	snprintf(out, outlen, "ip%u:%s/%u", len == 4 ? 4 : 6, hex, bits);
}

/* Reads our arguments from message <m>; unknown arguments are ignored. */
static void read_args(struct spop_msg *m, struct req_args *ra)
{
	struct spop_str name;
	struct spop_data v;
	int64_t i;

	memset(ra, 0, sizeof(*ra));
	ra->cost = 1;
	while (spop_arg_next(m, &name, &v) > 0) {
		if (spop_str_eq(&name, "key")) {
			if (v.type == SPOP_T_STR || v.type == SPOP_T_BIN)
				ra->key = v.v.s;
		} else if (spop_str_eq(&name, "tier")) {
			if (v.type == SPOP_T_STR)
				ra->tier = v.v.s;
		} else if (spop_str_eq(&name, "ip")) {
			if (v.type == SPOP_T_IPV4 || v.type == SPOP_T_IPV6)
				ra->ip = v;
		} else if (spop_str_eq(&name, "cost")) {
			if (spop_data_int(&v, &i))
				ra->cost = i < 0 ? 0 : (i > COST_MAX ? COST_MAX : i);
		}
	}
}

static void on_notify(struct spoa_req *req, struct spop_rd *msgs, void *arg)
{
	struct agent *a = arg;
	struct ruleset *rs = a->rs;
	const struct rule_tier *tier;
	struct store_query q;
	struct decision *d;
	struct req_args ra;
	struct spop_msg m;
	char principal[80];
	bool found = false;
	size_t i;
	int ret;

	while ((ret = spop_msg_next(msgs, &m)) > 0) {
		if (spop_str_eq(&m.name, rs->cfg->message)) {
			found = true;
			break;
		}
	}
	if (!found) {
		/* nothing to decide (or a malformed list: the library validated the
		 * frame header only); answer without a verdict, HAProxy lets it pass */
		a->outcomes[OUT_IGNORED]++;
		spoa_req_done(req);
		return;
	}
	read_args(&m, &ra);
	if (ra.key.len) {
		tier = ruleset_tier(rs, ra.tier.p, ra.tier.len);
		agent_principal_key(ra.key.p, ra.key.len, principal, sizeof(principal));
	} else {
		tier = &rs->anon;
		principal_ip(rs, &ra.ip, principal, sizeof(principal));
	}
	if (rs->cfg->store == STORE_KIND_ALLOW || !a->store) {
		a->outcomes[OUT_ALLOWED]++;
		set_int(req, "allow", 1);
		spoa_req_done(req);
		return;
	}
	q.n = tier->n;
	for (i = 0; i < tier->n; i++) {
		q.cost[i] = ra.cost;
		const struct rule_limit *l = &rs->limits[tier->idx[i]];

		snprintf(q.keys[i], sizeof(q.keys[i]), "%s:{%s}:%s", rs->cfg->redis.key_prefix,
			 principal, l->name);
		q.params[i] = l->lp;
	}
	d = xmalloc(sizeof(*d));
	d->a = a;
	d->req = req;
	d->rs = ruleset_ref(rs);
	d->tier = tier;
	ret = store_decide(a->store, &q, decision_done_cb, d);
	if (ret < 0) {
		respond_degraded(a, req, tier, (enum store_status)-ret);
		spoa_req_done(req);
		ruleset_unref(d->rs);
		free(d);
		return;
	}
	a->pending++;
}

/*
 * Creates the agent for ruleset <rs> (takes the caller's reference): listeners
 * open, Redis connecting. Returns 0 or -1 (logged).
 */
int agent_new(struct ev_loop *loop, struct ruleset *rs, struct agent **out)
{
	struct agent *a = xcalloc(1, sizeof(*a));
	struct spoa_handler h = {.on_notify = on_notify, .log = lib_log, .arg = a};
	struct spoa_opts o = {.max_frame_size = rs->cfg->max_frame_size,
			      .max_inflight = rs->cfg->max_inflight};
	char err[256];
	size_t i;

	a->loop = loop;
	a->rs = rs;
	a->srv = spoa_server_new(loop, &o, &h);
	for (i = 0; i < rs->cfg->nlisten; i++) {
		if (spoa_server_listen(a->srv, rs->cfg->listen[i], err, sizeof(err)) < 0) {
			LOG(LOG_ERR, "listen: %s", err);
			goto fail;
		}
	}
	if (rs->cfg->store == STORE_KIND_REDIS) {
		struct store_opts so = {
			.address = rs->cfg->redis.address,
			.user = rs->cfg->redis.user,
			.password = rs->cfg->redis.password,
			.connect_timeout_ms = rs->cfg->redis.connect_timeout_ms,
			.command_timeout_ms = rs->cfg->redis.command_timeout_ms,
			.max_pending = rs->cfg->redis.max_pending,
		};

		if (store_new(loop, &so, &a->store, err, sizeof(err)) < 0) {
			LOG(LOG_ERR, "%s", err);
			goto fail;
		}
	}
	*out = a;
	return 0;
fail:
	spoa_server_free(a->srv);
	free(a);
	return -1;
}

/*
 * Replaces the ruleset with <rs> (takes the caller's reference). Settings that
 * need a restart (listeners, store) keep their old values.
 */
void agent_swap_rules(struct agent *a, struct ruleset *rs)
{
	const struct agent_config *o = a->rs->cfg, *n = rs->cfg;
	bool same_listen = o->nlisten == n->nlisten;
	size_t i;

	for (i = 0; same_listen && i < o->nlisten; i++)
		same_listen = strcmp(o->listen[i], n->listen[i]) == 0;
	if (!same_listen)
		LOG(LOG_WARN, "reload: 'listen' changed, ignored until restart");
	if (o->store != n->store || strcmp(o->redis.address, n->redis.address) != 0 ||
	    o->redis.command_timeout_ms != n->redis.command_timeout_ms ||
	    o->redis.connect_timeout_ms != n->redis.connect_timeout_ms)
		LOG(LOG_WARN, "reload: store settings changed, ignored until restart");
	if (o->store != n->store)
		rs->cfg->store = o->store;
	ruleset_unref(a->rs);
	a->rs = rs;
}

const struct ruleset *agent_rules(const struct agent *a)
{
	return a->rs;
}

/* Stops accepting connections; decisions in flight still complete. */
void agent_drain(struct agent *a)
{
	spoa_server_stop_accepting(a->srv);
}

size_t agent_pending(const struct agent *a)
{
	return a->pending;
}

void agent_log_stats(const struct agent *a)
{
	const struct spoa_stats *ss = spoa_server_stats(a->srv);

	LOG(LOG_NOTICE,
	    "stats: conns=%llu notify=%llu acks=%llu allowed=%llu denied=%llu degraded=%llu "
	    "(down=%llu timeout=%llu busy=%llu error=%llu) orphans=%llu",
	    (unsigned long long)ss->conns_active, (unsigned long long)ss->notify,
	    (unsigned long long)ss->acks, (unsigned long long)a->outcomes[OUT_ALLOWED],
	    (unsigned long long)a->outcomes[OUT_DENIED],
	    (unsigned long long)a->outcomes[OUT_DEGRADED],
	    (unsigned long long)a->degraded_by[STORE_DOWN],
	    (unsigned long long)a->degraded_by[STORE_TIMEOUT],
	    (unsigned long long)a->degraded_by[STORE_BUSY],
	    (unsigned long long)a->degraded_by[STORE_ERROR], (unsigned long long)ss->orphans);
}

/*
 * Frees the agent: connections get AGENT-DISCONNECT(0) queued and are closed,
 * the store answers what is left with STORE_SHUTDOWN (which completes the
 * orphaned requests), then everything is released.
 */
void agent_free(struct agent *a)
{
	if (!a)
		return;
	spoa_server_disconnect_all(a->srv, SPOP_ST_NORMAL, "agent shutting down");
	store_free(a->store);
	spoa_server_free(a->srv);
	ruleset_unref(a->rs);
	free(a);
}
