/* SPDX-License-Identifier: MIT */
/*
 * The configuration file (libconfig syntax) as plain owned data. Loading
 * validates everything and reports every error as "file:line: message", so
 * startup, -c and reload share one pipeline. Nothing here points into the
 * libconfig tree, which is gone when config_load() returns.
 */
#ifndef AGENT_CONFIG_H
#define AGENT_CONFIG_H

#include <stdbool.h>
#include <stdio.h>
#include <stddef.h>
#include <stdint.h>

#include "compiler.h"
#include "digest.h"

enum store_kind {
	STORE_KIND_REDIS = 0,   /* decide against Redis */
	STORE_KIND_ALLOW = 1,   /* allow everything, touch nothing (benchmark baseline) */
	STORE_KIND_MEMORY = 2,  /* in-process state: one gateway, or development */
	STORE_KIND_COUNT        /* sentinel */
};

struct cfg_limit {
	char *name;             /* owned: also the policy name in headers */
	int line;               /* where it was defined */
	uint64_t rate;          /* tokens per period */
	uint64_t period_ms;
	uint64_t burst;         /* bucket capacity in tokens (gcra) */
	int alg;                /* enum limit_alg */
	bool shadow;            /* evaluated and counted, never denies */
	int on_failure;         /* enum fail_policy: when Redis cannot decide */
	uint64_t local_rate;    /* FAIL_LOCAL: rate per period on this gateway (0: derived) */
	double budget;          /* accuracy budget: error tolerated for local quotas, 0 = exact */
};

struct cfg_tier {
	char *name;             /* owned */
	int line;
	char **limits;          /* owned: limit names */
	size_t nlimits;
};

/* Where a response's cost comes from (the response message's arguments). */
enum post_source {
	POST_FROM_CHARGE = 0,   /* `charge`: what the application said (X-RateLimit-Cost) */
	POST_FROM_BYTES  = 1,   /* `bytes`: the response's size (Content-Length) */
	POST_FROM_TIME   = 2,   /* `time`: milliseconds the response took */
	POST_FROM_COUNT         /* sentinel */
};

/*
 * Post-charges: the cost of a request known once its response is there. The
 * tokens are ceil(value / per), at most max; they replace the request's cost
 * (what it was charged at request time is adjusted by the difference).
 */
struct cfg_post {
	bool set;               /* given in this group (an endpoint's: else the top level's) */
	int from;               /* enum post_source */
	uint64_t per;           /* units of the source per token (1..10^9) */
	int64_t max;            /* most tokens one response costs (0..1000000) */
};

/* A heavy operation: matched by route id, or by method and path prefix. */
struct cfg_endpoint {
	char *name;             /* owned: also the key suffix of its limits */
	int line;
	char *route;            /* owned or NULL: matches the `route` argument */
	char *path_prefix;      /* owned or NULL */
	char **methods;         /* owned: empty = any method */
	size_t nmethods;
	int64_t cost;           /* tokens per request for every limit (default 1) */
	char **cost_limits;     /* owned: limits with their own cost ... */
	int64_t *cost_values;   /* owned: ... and that cost */
	size_t ncosts;
	struct cfg_tier limits; /* extra limits per (principal, endpoint) */
	struct cfg_tier global; /* limits shared by every client of the endpoint */
	struct cfg_post post;   /* its post-charges (post.set), else the top level's */
};

/* What a limit does when Redis cannot decide (the failure ladder). */
enum fail_policy {
	FAIL_OPEN   = 0,        /* allow, degraded */
	FAIL_CLOSED = 1,        /* deny with fallback.deny_status */
	FAIL_LOCAL  = 2,        /* a coarse limit kept in this process */
	FAIL_COUNT              /* sentinel */
};

enum unknown_key_policy {
	UNKNOWN_DEFAULT_TIER = 0,       /* keys with no known tier get default_tier */
	UNKNOWN_ANONYMOUS    = 1,       /* ... are limited like anonymous clients, per IP */
	UNKNOWN_COUNT                   /* sentinel */
};

/* Anonymous requests HAProxy sent without a source address. */
enum no_address_policy {
	NO_ADDRESS_DENY   = 0,          /* denied with fallback.deny_status, counted */
	NO_ADDRESS_SHARED = 1,          /* one bucket "ip:none" for all of them */
	NO_ADDRESS_COUNT                /* sentinel */
};

/*
 * The RateLimit fields a decision returns (response.headers): the structured
 * fields of draft-ietf-httpapi-ratelimit-headers-11 ("p";r=..;t=.. and
 * "p";q=..;w=..), draft 7's combined dictionary (limit=.., remaining=..,
 * reset=..; q;w=..), the legacy trio of draft 6 (RateLimit-Limit, -Remaining,
 * -Reset), or the structured fields with the trio.
 */
enum header_dialect {
	HDR_STRUCTURED_LEGACY = 0,
	HDR_STRUCTURED,
	HDR_DRAFT7,
	HDR_LEGACY,
	HDR_COUNT       /* sentinel */
};

struct agent_config {
	char *file;                     /* owned: path it was read from */
	char **listen;                  /* owned: listener addresses */
	size_t nlisten;
	int log_level;                  /* enum log_level */
	enum store_kind store;
	char *message;                  /* owned: SPOE message name we act on */
	char *post_message;             /* owned: SPOE message of a response's cost */
	struct cfg_post post;           /* post-charges of requests without their own */
	unsigned max_frame_size;        /* SPOP frame size we accept */
	unsigned max_inflight;          /* NOTIFYs in flight per connection */
	unsigned max_conns;             /* SPOP connections; the idlest makes room (restart-only) */
	unsigned idle_timeout_ms;       /* SPOP connection idle after HELLO (restart-only) */
	unsigned spoe_timeout_ms;       /* HAProxy's processing budget: older NOTIFYs are
					 * answered empty (0: off) */
	struct {
		char *address;          /* owned */
		char *user;             /* owned or NULL */
		char *password;         /* owned or NULL: written here, or read from ... */
		char *password_file;    /* owned or NULL: ... this file (resolved path) */
		int password_line;      /* line of a 'password' written in the file, 0: none */
		char *key_prefix;       /* owned */
		unsigned key_layout;    /* 1: a key per limit; 2: a key per principal */
		bool key_layout_fallback; /* layout 2 reads layout 1 where it holds nothing */
		char *nameservers;      /* owned or NULL: "ip[:port],...", for host names */
		unsigned resolve_timeout_ms; /* per DNS try, 0: the resolver's default */
		char **sentinels;       /* owned, nsentinels "ip:port"s, or NULL: no Sentinel */
		size_t nsentinels;
		char *sentinel_master;  /* owned: the name they monitor */
		char *sentinel_user;    /* owned or NULL: the Sentinels' AUTH */
		char *sentinel_password;  /* owned or NULL: written here, or read from ... */
		char *sentinel_password_file; /* owned or NULL: ... this file */
		struct tls_ctx *tls;    /* a reference, or NULL: clear text (redis.tls) */
		struct tls_ctx *sentinel_tls; /* the Sentinels' (redis.sentinel.tls, else tls) */
		int noverify_line;      /* line of a tls.verify = false, 0: none */
		const char *noverify_where; /* static: its group, "redis" or "redis.sentinel" */
		unsigned connect_timeout_ms;
		unsigned command_timeout_ms; /* 0: derived (config_command_timeout_ms()) */
		unsigned max_pending;
		unsigned queue_timeout_ms; /* longest wait for room to send (0: command timeout) */
		unsigned max_concurrency;  /* ceiling of a node's adaptive concurrency limit */
		unsigned batch_max;        /* decisions per script call, 1 = one each */
		unsigned batch_wait_us;    /* a partial batch waits this long for more, 0: none */
		unsigned max_reply_bytes;  /* one reply's bounds (store_reply.h) */
		unsigned max_reply_elements;
		unsigned max_reply_depth;
	} redis;
	struct cfg_limit *limits;       /* owned array */
	size_t nlimits;
	struct cfg_tier *tiers;         /* owned array */
	size_t ntiers;
	char *default_tier;             /* owned */
	struct cfg_tier anon;           /* limits of anonymous clients (name "anonymous") */
	unsigned ipv4_prefix;           /* anonymous IPv4 grouping, bits (32) */
	unsigned ipv6_prefix;           /* anonymous IPv6 grouping, bits (64) */
	enum no_address_policy no_address; /* anonymous requests without an address */
	enum header_dialect headers;    /* response.headers: which RateLimit fields */
	bool legacy_headers;            /* also return limit/remaining/reset (HDR_*LEGACY) */
	struct cfg_endpoint *endpoints; /* owned array, in match order */
	size_t nendpoints;
	enum unknown_key_policy unknown_keys;
	char *tier_hash;                /* owned or NULL: Redis hash digest -> tier */
	unsigned tier_cache_ttl_ms;     /* how long a looked-up tier is trusted */
	unsigned tier_cache_size;       /* slots of the tier cache */
	bool watch;                     /* reload when the file changes */
	unsigned gateways;              /* local limits = rate / gateways; 0 = "auto": the live
					 * count of the heartbeats */
	unsigned deny_status;           /* HTTP status of a fail-closed denial (503) */
	unsigned breaker_failures;      /* consecutive Redis failures that open the breaker */
	unsigned breaker_cooldown_ms;
	unsigned workers;               /* worker processes (restart-only) */
	char *metrics_listen;           /* owned or NULL: /metrics, /top, /healthz, /ready */
	char **metrics_allow;           /* owned, metrics_nallow networks that may ask; none: anyone */
	size_t metrics_nallow;
	bool metrics_allow_set;         /* ... given (else the default: loopback, on loopback) */
	char **metrics_hosts;           /* owned, names a Host header may carry */
	size_t metrics_nhosts;
	char *metrics_token;            /* owned or NULL: the bearer token, read from ... */
	char *metrics_token_file;       /* owned or NULL: ... this file */
	char *fp_secret_file;           /* owned or NULL: metrics.fingerprint_secret_file */
	bool fp_random;                 /* no such file: the process's random secret */
	struct fp_key fp;               /* the key of the fingerprints shown to people */
	unsigned metrics_max_conns;     /* metrics connections; the idlest makes room */
	unsigned metrics_idle_timeout_ms; /* deadline of one metrics request */
	unsigned metrics_max_requests;  /* requests per kept-alive metrics connection */
	unsigned metrics_keepalive_ms;  /* a kept-alive metrics connection's wait for the next */
	bool blocked_cache;             /* deny locally until a denial's Retry-After */
	struct {
		bool enabled;           /* poll Redis for live overrides (restart-only) */
		unsigned poll_ms;       /* version check period */
		unsigned max_entries;   /* entries kept in memory */
		unsigned block_status;  /* HTTP status of a block without its own */
	} overrides;
	struct {
		unsigned lease_ms;      /* lease lifetime asked for (Redis time) */
		unsigned heartbeat_ms;  /* gateway heartbeat period (alive for 3 periods) */
		unsigned flush_ms;      /* pre-checked usage reported at least this often */
		unsigned horizon;       /* a bucket's lease covers the traffic of this many
					 * budget x period (0 = cap / G only) */
		unsigned max_keys;      /* keys tracked for leases, pre-checks, coalescing */
		bool precheck;          /* answer clients far below their limit locally */
		bool leases;            /* lease tokens for hot keys */
		bool coalesce;          /* one Redis call for decisions of one key in flight */
	} quota;
	/*
	 * In the candidate's own configuration: its mode. Exact, every decision
	 * carries it (to Redis: no local quota, no blocked-key cache); sampled,
	 * only the decisions of a share of the clients (chosen by a hash of the
	 * principal, the same on every gateway), the others decided as without
	 * a candidate.
	 */
	struct {
		bool sampled;           /* mode = "sampled" */
		double share;           /* clients evaluated, (0, 1]: 1 when exact */
	} cand_mode;
	/*
	 * The candidate policy (section "candidate"), or NULL: its own limits,
	 * tiers, default tier, anonymous limits and endpoints, evaluated next to
	 * these and never enforced. Only those fields are set; everything else
	 * (principals, keys, Redis) is this configuration's. Owned.
	 */
	struct agent_config *candidate;
};

/* Errors collected while loading, each "file:line: message". */
struct cfg_errors {
	char **msgs;            /* owned */
	size_t n;
};

/*
 * With spoe_timeout set, a decision is answered by the time this share of
 * HAProxy's processing budget has passed since its NOTIFY arrived (by the
 * failure ladder if Redis has not answered): the rest is for the ACK's way
 * back and HAProxy's own queueing.
 */
#define CFG_ANSWER_SHARE 0.8

int config_load(const char *file, struct agent_config **out, struct cfg_errors *errs) MUSTCHECK;
int config_defaults(FILE *out);
unsigned config_answer_budget_ms(const struct agent_config *cfg);
unsigned config_command_timeout_ms(const struct agent_config *cfg);
struct reply_limits;
void config_reply_limits(const struct agent_config *cfg, struct reply_limits *out);
void config_free(struct agent_config *cfg);
void cfg_errors_release(struct cfg_errors *errs);
bool config_password_advice(const struct agent_config *cfg, char *buf, size_t len);
bool config_fingerprint_advice(const struct agent_config *cfg, char *buf, size_t len);
bool config_metrics_advice(const struct agent_config *cfg, char *buf, size_t len);
bool config_tls_advice(const struct agent_config *cfg, char *buf, size_t len);
void config_redis_transport(const struct agent_config *cfg, char *buf, size_t len);

#endif /* AGENT_CONFIG_H */
