/* SPDX-License-Identifier: MIT */
/*
 * The agent: the root context (loop, SPOP server, store, current ruleset)
 * created and freed, its rules swapped on a reload, its statistics published
 * into the metrics region, and its HTTP endpoints (/metrics, /top, /overrides,
 * /healthz, /ready, /status, /status.json) answered.
 *
 * DESIGN
 * What a decision does is in the files below this one (agent_int.h lists
 * them in the order of the decision's path): the SPOP server calls notify.c's
 * notify_receive() for every NOTIFY. What needs the whole agent stays here.
 * Of struct agent (agent_int.h), this file writes the top's own fields only:
 * the decision path's caches, pool of decisions and statistics belong to the
 * files of decide/, reached through their functions (the statistics are read
 * here, to be published).
 *
 * A reload swaps the ruleset while each decision keeps the one it started
 * with; settings that need a restart (listeners, store) keep their old
 * values. A drain stops accepting connections while decisions in flight
 * complete. Freeing the agent first lets the store answer what is left (the
 * failure ladder completes those decisions and their ACKs are sent), then
 * says goodbye to HAProxy.
 */
#include "agent.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <ev.h>

#include "agent_int.h"
#include "answer.h"
#include "blocked.h"
#include "charge.h"
#include "config.h"
#include "decision.h"
#include "heartbeat.h"
#include "http.h"
#include "list.h"
#include "log.h"
#include "memstore.h"
#include "metrics.h"
#include "notify.h"
#include "overrides.h"
#include "prepare.h"
#include "principal.h"
#include "prom.h"
#include "quota.h"
#include "rules.h"
#include "spoa.h"
#include "status.h"
#include "store.h"
#include "store_reply.h"
#include "topk.h"
#include "util.h"

static void lib_log(int level, const char *msg, void *arg)
{
	(void)arg;
	LOG(level, "%s", msg);
}

/*
 * The heap's usage is sampled less often than the rest is published: glibc
 * counts it by walking the allocator's free lists, 0.1 ms for a few thousand
 * free chunks and 1.7-2.5 ms for 30,000 (measured), a pause of the loop.
 */
#define HEAP_CHECK       5.0    /* seconds */

/* Copies this process's gauges and counters into its metrics slot. */
static void publish(struct agent *a)
{
	struct met_slot *ms = a->ms;
	const struct spoa_stats *ss;
	uint64_t heap_used, heap_free;
	double oldest;
	size_t i, nn;

	if (!ms)
		return;
	ss = spoa_server_stats(a->srv);
	ms->c[MC_CONNS] = ss->conns_active;
	ms->c[MC_ACCEPTED] = ss->conns_accepted;
	ms->c[MC_HELLOS] = ss->hellos;
	ms->c[MC_HEALTHCHECKS] = ss->healthchecks;
	ms->c[MC_NOTIFY] = ss->notify;
	ms->c[MC_ACKS] = ss->acks;
	ms->c[MC_HAPROXY_DISCONNECTS] = ss->haproxy_disconnects;
	ms->c[MC_ORPHANS] = ss->orphans;
	ms->c[MC_SPOP_STALE] = ss->stale;
	ms->c[MC_SPOP_EVICTED] = ss->conns_evicted;
	ms->c[MC_SPOP_IDLE_TIMEOUTS] = ss->idle_timeouts;
	ms->c[MC_SPOP_REFUSED] = ss->conns_refused;
	if (a->http)
		ms->c[MC_HTTP_EVICTED] = http_server_stats(a->http)->evicted;
	for (i = 0; i <= SPOP_ST_RES; i++)
		ms->spop_errors[i] = ss->errors[i];
	ms->c[MC_REFUNDS] = a->st.charge.refunds;
	ms->c[MC_REFUNDS_LOST] = a->st.charge.refunds_lost;
	ms->c[MC_CONC_RELEASED] = a->st.charge.released;
	ms->c[MC_CONC_RELEASE_LOST] = a->st.charge.release_lost;
	ms->c[MC_CONC_HELD] = slots_held(a);
	ms->c[MC_BLOCKED_HITS] = a->st.blocked.hits;
	ms->c[MC_OVR_BLOCKED] = a->st.answer.ovr_blocked;
	ms->c[MC_OVR_LIMITED] = a->st.prepare.ovr_limited;
	if (a->ovr) {
		const struct ovr_stats *os = ovr_stats(a->ovr);

		ms->c[MC_OVR_ENTRIES] = os->entries;
		ms->c[MC_OVR_LOADS] = os->loads;
		ms->c[MC_OVR_SKIPPED] = os->skipped;
		ms->c[MC_OVR_POLL_ERRORS] = os->poll_errors;
	}
	ms->c[MC_LOCAL_DECISIONS] = a->st.parts.local_decisions;
	ms->c[MC_INVALID_COSTS] = a->st.notify.invalid_costs;
	for (i = 0; i < POST_OUT_COUNT; i++)
		ms->c[MC_POST_CHARGED + i] = a->st.charge.post[i];
	ms->c[MC_POST_CLAMPED] = a->st.notify.post_clamped;
	ms->c[MC_NO_ADDRESS] = a->st.prepare.no_address;
	ms->c[MC_TIER_HITS] = a->st.prepare.tier_hits;
	ms->c[MC_TIER_MISSES] = a->st.prepare.tier_misses;
	if (a->store) {
		const struct store_stats *st = store_stats(a->store);

		ms->c[MC_REDIS_SENT] = st->sent;
		ms->c[MC_REDIS_LATE] = st->late;
		ms->c[MC_REDIS_PENDING] = st->pending;
		ms->c[MC_BREAKER_OPEN] = st->breaker_open ? 1 : 0;
		ms->c[MC_REDIS_DOWN] = store_down(a->store) ? 1 : 0;
		ms->c[MC_BREAKER_OPENED] = st->breaker_opened;
		ms->c[MC_REDIS_CONCURRENCY] = st->concurrency_limit;
		ms->c[MC_REDIS_QUEUED] = st->queued;
		ms->c[MC_REDIS_SHED] = st->shed;
		ms->c[MC_REDIS_BATCH_CALLS] = st->batch_calls;
		ms->c[MC_REDIS_BATCHED] = st->batched;
		ms->c[MC_REDIS_CROSS_SLOT] = st->cross_slot_calls;
		ms->c[MC_REDIS_CROSS_SOLO] = st->cross_slot_solo;
		for (i = 0; i < STORE_EC_COUNT; i++)
			ms->c[MC_REDIS_ERR_OOM + i] = st->errors[i];
		nn = store_node_stats(a->store, ms->nodes, MET_NODES);
		oldest = 0;
		for (i = 0; i < nn; i++)
			if (ms->nodes[i].oldest_s > oldest)
				oldest = ms->nodes[i].oldest_s;
		ms->c[MC_REDIS_OLDEST_MS] = (uint64_t)(oldest * 1000.);
		__atomic_store_n(&ms->nnodes, nn, __ATOMIC_RELEASE);
	}
	if (a->quota) {
		const struct quota_stats *q = quota_stats(a->quota);

		ms->c[MC_LEASE_GRANTS] = q->lease_grants;
		ms->c[MC_LEASE_UNITS] = q->lease_units;
		ms->c[MC_LEASE_SPENT] = q->lease_spent;
		ms->c[MC_LEASE_EXPIRED] = q->lease_expired;
		ms->c[MC_LEASE_RETURNED] = q->lease_returned;
		ms->c[MC_PRECHECK_LOCAL] = q->precheck_local;
		ms->c[MC_PRECHECK_REPORTS] = q->precheck_reports;
		ms->c[MC_PRECHECK_OVER] = q->precheck_over;
		ms->c[MC_REPORT_FAILED] = q->report_failed;
		ms->c[MC_REPORT_LOST] = q->report_lost;
		ms->c[MC_COALESCED] = q->coalesced;
		ms->c[MC_UNDONE] = q->undone;
		ms->c[MC_QUOTA_KEYS] = q->keys;
		ms->c[MC_LEASE_OUTSTANDING] = q->outstanding;
		ms->c[MC_UNREPORTED] = q->unreported;
		ms->c[MC_QUOTA_FULL] = q->full;
	}
	ms->c[MC_GATEWAYS] = a->gateways;
	ms->c[MC_FALLBACK_GATEWAYS] = fallback_gateways(a, a->rs->cfg);
	ms->c[MC_FALLBACK_GATEWAYS_AUTO] = a->rs->cfg->gateways ? 0 : 1;
	ms->c[MC_MEMORY_KEYS] = a->mem ? memstore_size(a->mem) : 0;
	ms->c[MC_LOCAL_KEYS] = a->local ? memstore_size(a->local) : 0;
	if (mono() >= a->heap_check) {
		a->heap_check = mono() + HEAP_CHECK;
		if (heap_usage(&heap_used, &heap_free) == 0) {
			ms->c[MC_HEAP_IN_USE] = heap_used;
			ms->c[MC_HEAP_FREE] = heap_free;
		}
	}
	for (i = 0; i < a->st.answer.ntopk; i++) {
		struct met_top *mt = metrics_top(ms, a->st.answer.topk[i].rule);

		if (mt)
			mt->n = topk_list(a->st.answer.topk[i].t, mt->top, MET_TOP_SNAP);
	}
	metrics_sample(a->metrics, ms, (int64_t)time(NULL));
}

/*
 * The local fallback limits' state is only charged while Redis cannot decide;
 * once Redis answers again, a key whose state no degraded decision used for
 * LOCAL_IDLE seconds is forgotten. Kept, the state of every key that ever met
 * a failure (one command timing out under load) would stay until its limit
 * reset, a daily window's until the end of the day: the table filled towards
 * its bound (100,000 entries, about 20 MB a process) by the failures of a day.
 */
#define LOCAL_IDLE       60.0   /* seconds */
#define LOCAL_CHECK      10.0   /* seconds between two looks */

static void local_forget(struct agent *a)
{
	double now = mono();

	if (now < a->local_check)
		return;
	a->local_check = now + LOCAL_CHECK;
	if (a->local && a->store && store_ready(a->store) && memstore_size(a->local))
		memstore_forget_idle(a->local, now_us_real() - (int64_t)(LOCAL_IDLE * 1e6));
}

static void publish_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct agent *a = container_of(t, struct agent, publish);

	(void)loop;
	(void)revents;
	local_forget(a);
	publish(a);
}

/* What answers while Redis cannot: the failure policies of the limits, for /ready. */
static const char *agent_fallback_str(const struct agent *a)
{
	static const char *const what[8] = {
		"no limits",
		"fail-open limits allow",
		"fail-closed limits deny",
		"fail-open limits allow, fail-closed limits deny",
		"local fallback limits apply",
		"local fallback limits apply, fail-open limits allow",
		"local fallback limits apply, fail-closed limits deny",
		"local fallback limits apply, fail-open limits allow, fail-closed limits deny"};
	const struct agent_config *c = a->rs->cfg;
	unsigned seen = 0;
	size_t i;

	for (i = 0; i < c->nlimits; i++)
		seen |= c->limits[i].on_failure == FAIL_OPEN     ? 1
			: c->limits[i].on_failure == FAIL_CLOSED ? 2
								 : 4;
	return what[seen];
}

/* True when some limit falls back to a local limit without a local_rate of its own. */
static bool agent_has_local(const struct agent *a)
{
	const struct agent_config *c = a->rs->cfg;
	size_t i;

	for (i = 0; i < c->nlimits; i++)
		if (c->limits[i].on_failure == FAIL_LOCAL && !c->limits[i].local_rate)
			return true;
	return false;
}

/* Ready to decide: rules loaded, and Redis reachable or a fallback configured. */
static bool agent_ready(const struct agent *a)
{
	const struct ruleset *rs = a->rs;
	size_t i;

	if (!a->store || store_ready(a->store))
		return true;
	for (i = 0; i < rs->cfg->nlimits; i++)
		if (rs->cfg->limits[i].on_failure != FAIL_OPEN)
			return true;
	return false;
}

/* Whether local quotas are configured: a limit with an accuracy budget, on Redis. */
static bool agent_quotas(const struct agent *a)
{
	size_t i;

	for (i = 0; a->quota && i < a->rs->cfg->nlimits; i++)
		if (a->rs->cfg->limits[i].budget > 0)
			return true;
	return false;
}

/* How long a rendered status page (or JSON) is served again before a new one is made. */
#define STATUS_CACHE_S 0.25

/* The status page (<json>: /status.json), from the metrics and the agent's state. */
static void status_reply(struct agent *a, struct http_reply *r, bool json)
{
	static const char *const store_kinds[STORE_KIND_COUNT] = {"redis", "allow", "memory"};
	struct status_info si = {.version = VERSION,
				 .now = (int64_t)time(NULL),
				 .store = store_kinds[a->rs->cfg->store % STORE_KIND_COUNT],
				 .ready = agent_ready(a),
				 .fallback = agent_fallback_str(a),
				 .candidate = a->rs->cand != NULL,
				 .quotas = agent_quotas(a),
				 .ovr = a->ovr};
	struct met_view *v;
	char why[256];

	if (a->store && !store_health(a->store, why, sizeof(why)))
		si.health = why;
	publish(a);
	v = metrics_view(a->metrics);
	if (json) {
		http_reply_status(r, 200, "application/json");
		status_render_json(v, &si, r);
	} else {
		status_render_html(v, &si, r);
	}
	metrics_view_free(v);
}

/* A rendered status page's body, lent to the replies that send it; freed by the last. */
struct status_body {
	unsigned refs;          /* the cache's, and one per reply sending it */
	size_t len;
	char data[];
};

/* Hands back a reference to <arg>, a struct status_body (NULL: nothing). */
static void status_body_unref(void *arg)
{
	struct status_body *b = arg;

	if (b && --b->refs == 0)
		free(b);
}

/*
 * The status page (<json>: /status.json) rendered at most every STATUS_CACHE_S:
 * a rendering costs 0.1 to 0.35 ms of the loop's time; meanwhile the body of
 * the last one is lent to each reply (never copied), so a flood of /status
 * requests costs the decisions little, and the page is at most a quarter of a
 * second old.
 */
static void status_cached(struct agent *a, struct http_reply *r, bool json)
{
	struct http_reply *c = &a->status_cache[json].r;
	struct status_body **b = &a->status_cache[json].body;
	double now = ev_now(a->loop);

	if (a->status_cache[json].at == 0 || now - a->status_cache[json].at >= STATUS_CACHE_S ||
	    now < a->status_cache[json].at) {
		http_reply_release(c);
		status_reply(a, c, json);
		status_body_unref(*b);
		*b = NULL;
		if (c->len) {
			*b = xmalloc(sizeof(**b) + c->len);
			(*b)->refs = 1;
			(*b)->len = c->len;
			memcpy((*b)->data, c->body, c->len);
		}
		FREE_AND_NULL(c->body);
		c->len = c->cap = 0;
		a->status_cache[json].at = now;
	}
	http_reply_status(r, c->status, c->ctype);
	memcpy(r->headers, c->headers, c->hlen);
	r->hlen = c->hlen;
	if (*b) { /* lent, not copied: the reply hands it back once sent */
		(*b)->refs++;
		http_reply_lend(r, (*b)->data, (*b)->len, status_body_unref, *b);
	}
	r->broken = c->broken;
}

/*
 * Who may ask the metrics listener <h>: the configuration's allow-list, Host
 * names and token; the probes (/healthz, /ready) need no token, so a load
 * balancer's health check works without one. 0, or -1 (logged).
 */
static int metrics_access(struct http_server *h, const struct agent_config *cfg)
{
	static const char *const open_paths[] = {"/healthz", "/ready", NULL};
	const struct http_access acc = {
		.allow = (const char *const *)cfg->metrics_allow, .nallow = cfg->metrics_nallow,
		.hosts = (const char *const *)cfg->metrics_hosts, .nhosts = cfg->metrics_nhosts,
		.token = cfg->metrics_token, .open_paths = open_paths,
	};
	char err[256];

	if (http_server_set_access(h, &acc, err, sizeof(err)) < 0) {
		LOG(LOG_ERR, "metrics listener: %s", err);
		return -1;
	}
	if (config_metrics_advice(cfg, err, sizeof(err)))
		LOG(LOG_WARN, "%s", err);
	return 0;
}

static void http_cb(const char *path, struct http_reply *r, void *arg)
{
	struct agent *a = arg;

	if (strcmp(path, "/metrics") == 0) {
		publish(a);
		http_reply_status(r, 200, PROM_CONTENT_TYPE);
		metrics_render(a->metrics, r);
	} else if (strcmp(path, "/top") == 0) {
		publish(a);
		http_reply_status(r, 200, "application/json");
		metrics_render_top(a->metrics, r);
	} else if (strcmp(path, "/overrides") == 0 && a->ovr) {
		http_reply_status(r, 200, "application/json");
		ovr_render(a->ovr, r);
	} else if (strcmp(path, "/status") == 0 || strcmp(path, "/status.json") == 0) {
		status_cached(a, r, path[7] == '.');
	} else if (strcmp(path, "/healthz") == 0) {
		http_reply_status(r, 200, "text/plain");
		http_reply_printf(r, "ok\n");
	} else if (strcmp(path, "/ready") == 0) {
		bool ok = agent_ready(a);
		char why[256];

		http_reply_status(r, ok ? 200 : 503, "text/plain");
		http_reply_printf(r, "%s\n", ok ? "ready" : "not ready: redis unreachable and no "
							  "fallback configured");
		if (a->store && !store_health(a->store, why, sizeof(why)))
			http_reply_printf(r, "degraded: %s; %s\n", why, agent_fallback_str(a));
		if (a->store && agent_has_local(a))
			http_reply_printf(r, "fallback gateways: %llu (%s)\n",
					  (unsigned long long)fallback_gateways(a, a->rs->cfg),
					  a->rs->cfg->gateways ? "configured"
					  : a->gateways	       ? "auto: live gateways counted last"
								 : "auto: none counted yet");
	} else {
		http_reply_status(r, 404, "text/plain");
		http_reply_printf(r, "not found\n");
	}
}

/* Creates or reconfigures the local quotas for <rs> (Redis store only). */
static void quota_setup(struct agent *a, const struct ruleset *rs)
{
	const struct agent_config *c = rs->cfg;
	struct quota_opts o = {.lease_ms = c->quota.lease_ms,
			       .flush_ms = c->quota.flush_ms,
			       .horizon = c->quota.horizon,
			       .max_keys = c->quota.max_keys,
			       .precheck = c->quota.precheck,
			       .leases = c->quota.leases,
			       .coalesce = c->quota.coalesce};
	bool leasing = false;
	size_t i;

	if (!a->store)
		return;
	for (i = 0; i < c->nlimits; i++)
		if (c->limits[i].budget > 0)
			leasing = true;
	if (!a->quota) {
		a->quota = quota_new(a->loop, a->store, &o);
		quota_set_gateways(a->quota, a->gateways);
	}
	quota_configure(a->quota, &o, leasing);
}

/* The heartbeats counted the live gateways anew. */
static void gateways_cb(uint64_t n, void *arg)
{
	struct agent *a = arg;

	a->gateways = n;
	if (a->quota)
		quota_set_gateways(a->quota, n);
}

/* Creates or reconfigures the gateway heartbeat (Redis store only). */
static void heartbeat_setup(struct agent *a, const struct ruleset *rs)
{
	if (!a->store)
		return;
	if (!a->hb)
		a->hb = heartbeat_new(a->loop, a->store, gateways_cb, a);
	heartbeat_configure(a->hb, rs->cfg->redis.key_prefix, rs->cfg->quota.heartbeat_ms);
	/* another registry forgets the count: so do we */
	a->gateways = heartbeat_gateways(a->hb);
	if (a->quota)
		quota_set_gateways(a->quota, a->gateways);
}

/* The first overrides load was tried, or Redis went: the parked decisions go on. */
static void ovr_wake(void *arg)
{
	struct agent *a = arg;
	struct decision *d;
	struct list l;

	/* taken off first: a decision that must wait again is parked again */
	decisions_unpark(a, &l);
	while ((d = decision_unparked(a, &l)))
		decision_begin(d);
}

/* Counts a reload for the metrics. */
void agent_note_reload(struct agent *a, bool ok, uint64_t generation)
{
	if (!a->ms)
		return;
	a->ms->c[ok ? MC_RELOADS_OK : MC_RELOADS_FAILED]++;
	a->ms->c[MC_RELOAD_OK] = ok;
	a->ms->c[MC_RELOAD_AT] = (uint64_t)time(NULL);
	if (ok)
		a->ms->c[MC_GENERATION] = generation;
}

/*
 * Creates the agent for ruleset <rs> (takes the caller's reference): listeners
 * open (with SO_REUSEPORT when <reuseport>, so worker processes share the
 * port), Redis connecting. Returns 0 or -1 (logged).
 */
int agent_new(struct ev_loop *loop, struct ruleset *rs, const struct agent_opts *opts,
	      struct agent **out)
{
	struct agent *a = xcalloc(1, sizeof(*a));
	struct spoa_handler h = {.on_notify = notify_receive, .log = lib_log, .arg = a};
	struct spoa_opts o = {.max_frame_size = rs->cfg->max_frame_size,
			      .max_inflight = rs->cfg->max_inflight,
			      .max_conns = rs->cfg->max_conns,
			      .idle_timeout_ms = rs->cfg->idle_timeout_ms,
			      .stale_ms = rs->cfg->spoe_timeout_ms,
			      .ack_max = rs->ack_max,
			      .reuseport = opts->reuseport};
	struct ovr_opts ovr_opts = {.key_prefix = rs->cfg->redis.key_prefix,
				    .poll_ms = rs->cfg->overrides.poll_ms,
				    .max_entries = rs->cfg->overrides.max_entries,
				    .block_status = rs->cfg->overrides.block_status,
				    .fp = &rs->cfg->fp};
	char err[256];
	size_t i;

	principal_cache_new(a);
	a->loop = loop;
	a->rs = rs;
	decisions_init(a);
	a->srv = spoa_server_new(loop, &o, &h);
	a->metrics = opts->metrics;
	if (a->metrics) {
		a->ms = metrics_attach(a->metrics, opts->worker);
		a->ms->c[MC_GENERATION] = rs->gen;
	}
	ev_timer_init(&a->publish, publish_cb, 0.25, 0.25);
	ev_timer_start(loop, &a->publish);
	if (rs->cfg->metrics_listen && a->metrics) {
		a->http = http_server_new(loop, rs->cfg->metrics_listen, opts->reuseport, http_cb, a,
					  err, sizeof(err));
		if (!a->http) {
			LOG(LOG_ERR, "metrics listener: %s", err);
			goto fail;
		}
		http_server_set_max_conns(a->http, rs->cfg->metrics_max_conns);
		http_server_set_timeout(a->http, rs->cfg->metrics_idle_timeout_ms / 1000.);
		http_server_set_max_requests(a->http, rs->cfg->metrics_max_requests);
		http_server_set_keepalive(a->http, rs->cfg->metrics_keepalive_ms / 1000.);
		if (metrics_access(a->http, rs->cfg) < 0)
			goto fail;
		LOG(LOG_NOTICE, "metrics on http://%s/metrics", rs->cfg->metrics_listen);
	}
	for (i = 0; i < rs->cfg->nlisten; i++) {
		if (spoa_server_listen(a->srv, rs->cfg->listen[i], err, sizeof(err)) < 0) {
			LOG(LOG_ERR, "listen: %s", err);
			goto fail;
		}
	}
	if (rs->cfg->store == STORE_KIND_MEMORY)
		a->mem = memstore_new(1000000);
	a->local = memstore_new(100000);
	blocked_setup(a, rs);
	tier_cache_setup(a, rs);
	if (rs->cfg->store == STORE_KIND_REDIS) {
		struct reply_limits limits;
		struct store_opts so = {
			.address = rs->cfg->redis.address,
			.user = rs->cfg->redis.user,
			.password = rs->cfg->redis.password,
			.nameservers = rs->cfg->redis.nameservers,
			.resolve_timeout_ms = rs->cfg->redis.resolve_timeout_ms,
			.sentinels = (const char *const *)rs->cfg->redis.sentinels,
			.nsentinels = rs->cfg->redis.nsentinels,
			.sentinel_master = rs->cfg->redis.sentinel_master,
			.sentinel_user = rs->cfg->redis.sentinel_user,
			.sentinel_password = rs->cfg->redis.sentinel_password,
			.sentinel_tls = rs->cfg->redis.sentinel_tls,
			.tls = rs->cfg->redis.tls,
			.connect_timeout_ms = rs->cfg->redis.connect_timeout_ms,
			.command_timeout_ms = config_command_timeout_ms(rs->cfg),
			.answer_budget_ms = config_answer_budget_ms(rs->cfg),
			.max_pending = rs->cfg->redis.max_pending,
			.breaker_failures = rs->cfg->breaker_failures,
			.breaker_cooldown_ms = rs->cfg->breaker_cooldown_ms,
			.queue_timeout_ms = rs->cfg->redis.queue_timeout_ms,
			.max_concurrency = rs->cfg->redis.max_concurrency,
			.batch_max = rs->cfg->redis.batch_max,
			.batch_wait_us = rs->cfg->redis.batch_wait_us,
			.reply_limits = &limits,
		};

		config_reply_limits(rs->cfg, &limits);
		if (store_new(loop, &so, &a->store, err, sizeof(err)) < 0) {
			LOG(LOG_ERR, "%s", err);
			goto fail;
		}
		heartbeat_setup(a, rs);
		quota_setup(a, rs);
		if (rs->cfg->overrides.enabled)
			a->ovr = ovr_new(loop, a->store, &ovr_opts, ovr_wake, a);
	}
	*out = a;
	return 0;
fail:
	ev_timer_stop(loop, &a->publish);
	http_server_free(a->http);
	spoa_server_free(a->srv);
	memstore_free(a->mem);
	memstore_free(a->local);
	tier_cache_free(a);
	principal_cache_free(a);
	blocked_free(a);
	decisions_free_unused(a);       /* the pool decisions_init() filled */
	free(a);
	return -1;
}

/* Two optional strings are equal (both NULL, or the same text). */
static bool streq_null(const char *x, const char *y)
{
	return x == y || (x && y && strcmp(x, y) == 0);
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
	if (o->max_frame_size != n->max_frame_size || o->max_inflight != n->max_inflight ||
	    o->max_conns != n->max_conns || o->idle_timeout_ms != n->idle_timeout_ms)
		LOG(LOG_WARN, "reload: max_frame_size, max_inflight, max_connections or idle_timeout "
			      "changed, ignored until restart");
	if ((o->metrics_listen ? strcmp(o->metrics_listen, n->metrics_listen ? n->metrics_listen
									     : "")
			       : n->metrics_listen != NULL) ||
	    o->metrics_max_conns != n->metrics_max_conns ||
	    o->metrics_idle_timeout_ms != n->metrics_idle_timeout_ms ||
	    o->metrics_max_requests != n->metrics_max_requests ||
	    o->metrics_keepalive_ms != n->metrics_keepalive_ms)
		LOG(LOG_WARN, "reload: metrics settings changed, ignored until restart");
	/* who may ask: the allow-list, the names, the token (a rotated token file) at once */
	if (a->http && metrics_access(a->http, n) == 0 && n->metrics_token &&
	    !streq_null(o->metrics_token, n->metrics_token))
		LOG(LOG_NOTICE, "reload: metrics.token_file read again: the new token applies");
	/* answers are sized from the new rules from now on; the age bound applies at once */
	spoa_server_set_ack_max(a->srv, rs->ack_max);
	spoa_server_set_stale_ms(a->srv, n->spoe_timeout_ms);
	if (o->store != n->store || strcmp(o->redis.address, n->redis.address) != 0 ||
	    o->redis.connect_timeout_ms != n->redis.connect_timeout_ms)
		LOG(LOG_WARN, "reload: store settings changed, ignored until restart");
	/* deadlines follow spoe_timeout, command_timeout_ms and queue_timeout_ms at once */
	if (a->store)
		store_set_timeouts(a->store, config_command_timeout_ms(n),
				   n->redis.queue_timeout_ms, config_answer_budget_ms(n));
	/* credentials (a password file's content too): open connections stay authenticated */
	if (!streq_null(o->redis.user, n->redis.user) ||
	    !streq_null(o->redis.password, n->redis.password)) {
		if (a->store)
			store_set_auth(a->store, n->redis.user, n->redis.password);
		LOG(LOG_NOTICE, "reload: Redis credentials changed, used from the next connection");
	}
	/* TLS: the contexts built from the files as they are now (renewed certificates) */
	if ((o->redis.tls != NULL) != (n->redis.tls != NULL))
		LOG(LOG_WARN, "reload: 'redis.tls' turned %s, ignored until restart",
		    n->redis.tls ? "on" : "off");
	else if (a->store && n->redis.tls)
		store_set_tls(a->store, n->redis.tls, n->redis.sentinel_tls);
	if (o->redis.max_pending != n->redis.max_pending)
		LOG(LOG_WARN, "reload: 'redis.max_pending' changed, ignored until restart");
	if (o->redis.max_concurrency != n->redis.max_concurrency)
		LOG(LOG_WARN, "reload: 'redis.max_concurrency' changed, ignored until restart");
	if (o->redis.batch_max != n->redis.batch_max)
		LOG(LOG_WARN, "reload: 'redis.batch_max' changed, ignored until restart");
	if (o->redis.batch_wait_us != n->redis.batch_wait_us)
		LOG(LOG_WARN, "reload: 'redis.batch_wait_us' changed, ignored until restart");
	if (o->redis.max_reply_bytes != n->redis.max_reply_bytes ||
	    o->redis.max_reply_elements != n->redis.max_reply_elements ||
	    o->redis.max_reply_depth != n->redis.max_reply_depth)
		LOG(LOG_WARN, "reload: 'redis.max_reply_*' changed, ignored until restart");
	if (o->redis.key_layout != n->redis.key_layout ||
	    o->redis.key_layout_fallback != n->redis.key_layout_fallback)
		LOG(LOG_NOTICE, "reload: Redis key layout now %u%s (was %u%s)",
		    n->redis.key_layout, n->redis.key_layout_fallback ?
		    ", reading layout 1 where it holds nothing" : ", no fallback",
		    o->redis.key_layout, o->redis.key_layout_fallback ?
		    ", reading layout 1 where it holds nothing" : ", no fallback");
	if (o->breaker_failures != n->breaker_failures)
		LOG(LOG_WARN, "reload: 'redis.breaker_failures' changed, ignored until restart");
	if (o->breaker_cooldown_ms != n->breaker_cooldown_ms)
		LOG(LOG_WARN, "reload: 'redis.breaker_cooldown_ms' changed, ignored until restart");
	if (o->store != n->store)
		rs->cfg->store = o->store;
	if (rs->cfg->tier_hash && rs->cfg->store != STORE_KIND_REDIS)
		FREE_AND_NULL(rs->cfg->tier_hash);
	tier_cache_setup(a, rs);
	heartbeat_setup(a, rs);
	quota_setup(a, rs);
	if (o->overrides.enabled != n->overrides.enabled)
		LOG(LOG_WARN, "reload: 'overrides.enabled' changed, ignored until restart");
	if (a->ovr) {
		struct ovr_opts oo = {.key_prefix = n->redis.key_prefix,
				      .poll_ms = n->overrides.poll_ms,
				      .max_entries = n->overrides.max_entries,
				      .block_status = n->overrides.block_status,
				      .fp = &n->fp};

		ovr_configure(a->ovr, &oo);
	}
	if (o->fp.id != n->fp.id)
		LOG(LOG_NOTICE, "reload: the fingerprint secret changed: key fingerprints (fp:) "
				"shown from now on are the new secret's; blocks and limits by fp: "
				"taken under the old one no longer match (those by key: do)");
	/* cached denials were decided by the old limits */
	blocked_setup(a, rs);
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
	size_t given;

	spoa_server_stop_accepting(a->srv);
	/* the concurrency slots our requests still hold go back before we go */
	given = slots_give_back(a);
	if (given)
		LOG(LOG_NOTICE, "drain: gave back %zu concurrency slots still held", given);
	/* what pre-checks admitted is reported before we go */
	if (a->quota)
		quota_flush(a->quota);
}

size_t agent_pending(const struct agent *a)
{
	return decision_calls_pending(a) + quota_pending(a->quota);
}

void agent_log_stats(const struct agent *a)
{
	const struct spoa_stats *ss = spoa_server_stats(a->srv);

	LOG(LOG_NOTICE,
	    "stats: conns=%llu notify=%llu acks=%llu allowed=%llu denied=%llu degraded=%llu "
	    "(down=%llu timeout=%llu busy=%llu error=%llu overload=%llu breaker=%llu) orphans=%llu",
	    (unsigned long long)ss->conns_active, (unsigned long long)ss->notify,
	    (unsigned long long)ss->acks, (unsigned long long)a->st.answer.outcomes[OUT_ALLOWED],
	    (unsigned long long)a->st.answer.outcomes[OUT_DENIED],
	    (unsigned long long)a->st.answer.outcomes[OUT_DEGRADED],
	    (unsigned long long)a->st.answer.degraded_by[STORE_DOWN],
	    (unsigned long long)a->st.answer.degraded_by[STORE_TIMEOUT],
	    (unsigned long long)a->st.answer.degraded_by[STORE_BUSY],
	    (unsigned long long)a->st.answer.degraded_by[STORE_ERROR],
	    (unsigned long long)a->st.answer.degraded_by[STORE_OVERLOAD],
	    (unsigned long long)a->st.answer.degraded_by[STORE_BREAKER], (unsigned long long)ss->orphans);
}

/*
 * Frees the agent: the store answers what is left with STORE_SHUTDOWN (the
 * failure ladder completes those decisions and their ACKs are sent), then
 * connections get AGENT-DISCONNECT(0) and everything is released.
 */
void agent_free(struct agent *a)
{
	if (!a)
		return;
	ev_timer_stop(a->loop, &a->publish);
	http_server_free(a->http);
	http_reply_release(&a->status_cache[0].r);
	http_reply_release(&a->status_cache[1].r);
	status_body_unref(a->status_cache[0].body);
	status_body_unref(a->status_cache[1].body);
	/* decisions still waiting for the overrides go to the store, which answers them */
	decisions_stop(a);
	ovr_wake(a);
	/* first answer what is still in flight (the failure ladder decides, ACKs go
	 * out on the open connections), then say goodbye */
	store_free(a->store);
	a->store = NULL;
	quota_free(a->quota);
	a->quota = NULL;
	heartbeat_free(a->hb);
	a->hb = NULL;
	ovr_free(a->ovr);
	a->ovr = NULL;
	spoa_server_disconnect_all(a->srv, SPOP_ST_NORMAL, "agent shutting down");
	top_offenders_free(a);
	spoa_server_free(a->srv);
	memstore_free(a->mem);
	memstore_free(a->local);
	tier_cache_free(a);
	principal_cache_free(a);
	decisions_free_unused(a);
	blocked_free(a);
	slots_free(a);
	ruleset_unref(a->rs);
	free(a);
}
