/* SPDX-License-Identifier: MIT */
/*
 * Metrics shared by the worker processes: each worker writes only its own slot
 * of a shared memory region (created before the workers are forked), and
 * whichever worker answers a scrape renders the sum of all slots. With one
 * process the region is simply private memory.
 *
 * Everything is fixed-size: label sets are bounded by the configuration (tiers
 * x rules), top offenders by K per rule, distinct denied clients by a
 * HyperLogLog per rule. A row that does not fit is counted in "_overflow".
 */
#ifndef AGENT_METRICS_H
#define AGENT_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "hll.h"
#include "http.h"
#include "prom.h"
#include "spop.h"
#include "store.h"
#include "topk.h"

#define MET_WORKERS_MAX 64
#define MET_ROWS        256     /* (tier, rule) rows per worker */
#define MET_TOP_RULES   64      /* rules with top offenders tracked */
#define MET_TOP_K       10      /* offenders exported per rule */
#define MET_TOP_SNAP    32      /* offenders each worker publishes per rule (merging
				 * per-worker lists undercounts clients missing from some) */
#define MET_NAME        72

/* Counters a worker publishes (cumulative since it started). */
enum met_counter {
	MC_CONNS = 0,           /* gauge: SPOP connections open */
	MC_ACCEPTED,            /* SPOP connections accepted */
	MC_HELLOS,
	MC_HEALTHCHECKS,
	MC_NOTIFY,
	MC_ACKS,
	MC_HAPROXY_DISCONNECTS,
	MC_ORPHANS,
	MC_REFUNDS,
	MC_REFUNDS_LOST,        /* refunds whose Redis call failed (shed, timeout, down) */
	MC_CONC_RELEASED,       /* concurrency slots given back by responses */
	MC_CONC_RELEASE_LOST,   /* ... whose Redis call failed: the lease ends them */
	MC_CONC_HELD,           /* gauge: slots this process's requests hold (kept for a stop) */
	MC_LOCAL_DECISIONS,
	MC_TIER_HITS,
	MC_TIER_MISSES,
	MC_REDIS_SENT,
	MC_REDIS_LATE,
	MC_REDIS_PENDING,       /* gauge */
	MC_BREAKER_OPEN,        /* gauge 0/1 */
	MC_REDIS_DOWN,          /* gauge 0/1: a Redis node down (store_down()) */
	MC_BREAKER_OPENED,
	MC_REDIS_CONCURRENCY,   /* gauge: sum of the nodes' concurrency limits */
	MC_REDIS_QUEUED,        /* gauge: commands waiting for room to be sent */
	MC_REDIS_SHED,          /* commands shed (queue budget exceeded) */
	MC_REDIS_BATCH_CALLS,   /* script calls carrying several decisions */
	MC_REDIS_BATCHED,       /* decisions sent in them */
	MC_REDIS_CROSS_SLOT,    /* ... of them in a cluster, over several slots */
	MC_REDIS_CROSS_SOLO,    /* decisions such a call found elsewhere, sent alone */
	MC_REDIS_ERR_OOM,       /* error replies by class (enum store_errclass order) */
	MC_REDIS_ERR_BUSY,
	MC_REDIS_ERR_LOADING,
	MC_REDIS_ERR_READONLY,
	MC_REDIS_ERR_OTHER,
	MC_REDIS_ERR_PROTOCOL,
	MC_MEMORY_KEYS,         /* gauge: memory store entries */
	MC_LOCAL_KEYS,          /* gauge: local fallback entries */
	MC_GENERATION,          /* gauge: configuration generation */
	MC_RELOADS_OK,
	MC_RELOADS_FAILED,
	MC_ROWS_OVERFLOW,
	MC_BLOCKED_HITS,        /* decisions answered by the blocked-key cache */
	MC_LEASE_GRANTS,        /* local quotas: see struct quota_stats */
	MC_LEASE_UNITS,
	MC_LEASE_SPENT,
	MC_LEASE_EXPIRED,
	MC_LEASE_RETURNED,
	MC_PRECHECK_LOCAL,
	MC_PRECHECK_REPORTS,
	MC_PRECHECK_OVER,
	MC_REPORT_FAILED,
	MC_REPORT_LOST,
	MC_COALESCED,
	MC_UNDONE,
	MC_QUOTA_KEYS,          /* gauge */
	MC_LEASE_OUTSTANDING,   /* gauge */
	MC_UNREPORTED,          /* gauge */
	MC_GATEWAYS,            /* gauge: live gateways seen by this worker */
	MC_FALLBACK_GATEWAYS,   /* gauge: what local fallback limits divide rates by */
	MC_FALLBACK_GATEWAYS_AUTO, /* gauge: 1 when that is the live count (auto) */
	MC_QUOTA_FULL,
	MC_FB_OPEN,             /* degraded decisions: allowed with no verdict (fail-open) */
	MC_FB_LOCAL_ALLOWED,    /* ... allowed by local fallback limits */
	MC_FB_LOCAL_DENIED,     /* ... denied by local fallback limits */
	MC_FB_CLOSED,           /* ... denied by a fail-closed limit */
	MC_INVALID_COSTS,       /* costs from HAProxy out of range, charged the maximum */
	MC_NO_ADDRESS,          /* anonymous requests without a source address */
	MC_POST_CHARGED,        /* post-charges by outcome (agent_int.h, enum post_outcome order) */
	MC_POST_REFUNDED,
	MC_POST_UNCHANGED,
	MC_POST_ABSENT,
	MC_POST_INVALID,
	MC_POST_FAILED,
	MC_POST_CLAMPED,        /* response costs above post_charge.max, charged the max */
	MC_SPOP_STALE,          /* NOTIFYs older than spoe_timeout, answered empty */
	MC_SPOP_EVICTED,        /* idle SPOP connections closed to admit a new one */
	MC_SPOP_IDLE_TIMEOUTS,  /* SPOP connections closed by idle_timeout */
	MC_SPOP_REFUSED,        /* SPOP connections refused: every one busy, or no fd */
	MC_HTTP_EVICTED,        /* idle metrics connections closed to admit a new one */
	MC_OVR_BLOCKED,         /* requests denied by a block override */
	MC_OVR_LIMITED,         /* decisions with limits changed by a limit override */
	MC_OVR_ENTRIES,         /* gauge: overrides loaded */
	MC_OVR_LOADS,           /* override tables loaded */
	MC_OVR_SKIPPED,         /* override entries skipped (bad, or over the cap) */
	MC_OVR_POLL_ERRORS,     /* override polls or loads that failed */
	MC_CAND_UNEVALUATED,    /* decisions made without their candidate's verdict */
	MC_RELOAD_AT,           /* gauge: Unix seconds of the last reload, 0 = none */
	MC_RELOAD_OK,           /* gauge: 1 if that reload was applied */
	MC_HEAP_IN_USE,         /* gauge: heap bytes allocated (the C library's count) */
	MC_HEAP_FREE,           /* gauge: heap bytes freed, still held by the allocator */
	MC_REDIS_OLDEST_MS,     /* gauge: age of the oldest command a node has not answered */
	MC_COUNT                /* sentinel */
};

/* Decisions for one (tier, rule) pair. */
struct met_row {
	char tier[MET_NAME];
	char rule[MET_NAME];
	uint64_t allowed, denied, shadow_denied, degraded, local;
};

/*
 * The candidate policy's verdicts for one (tier, rule) pair. <enforced> rows
 * name an enforced rule (lifted denials), the others a candidate rule.
 */
struct met_cand_row {
	char tier[MET_NAME];
	char rule[MET_NAME];
	bool enforced;
	uint64_t would_allow, would_deny, new_denials, lifted;
};

#define MET_CAND_ROWS   128     /* candidate (tier, rule) rows per worker */
/* Top-offender records of candidate rules: this prefix and the rule's name (no
 * rule name holds a ':'; short, so that a 64-character name fits MET_NAME) */
#define MET_CAND_TOP    "c:"
_Static_assert(sizeof(MET_CAND_TOP) + 64 <= MET_NAME, "a candidate rule's record name fits");

/* Denied clients of one rule: a snapshot of the worker's top-K and its HLL. */
struct met_top {
	char rule[MET_NAME];
	uint64_t denied;
	size_t n;
	struct topk_entry top[MET_TOP_SNAP];
	struct hll hll;
};

#define MET_NODES       16      /* Redis nodes each worker reports */
#define MET_HIST        120     /* points of the decision history */
#define MET_HIST_STEP_S 5       /* ... one every this many seconds: 10 minutes */
#define MET_RESULTS     5       /* enum met_result */

/* The decisions counted by the whole agent at one time (cumulative, by result). */
struct met_point {
	int64_t t;                      /* Unix seconds, a multiple of MET_HIST_STEP_S */
	uint64_t v[MET_RESULTS];
};

struct met_slot {
	pid_t pid;                      /* 0: unused */
	uint64_t c[MC_COUNT];
	uint64_t degraded[STORE_COUNT]; /* degraded answers by reason */
	uint64_t spop_errors[SPOP_ST_RES + 1];
	size_t nrows;
	struct met_row rows[MET_ROWS];
	struct prom_hist decision_lat;  /* NOTIFY received -> ACK queued, seconds */
	struct prom_hist redis_lat;     /* script call round trip, seconds */
	size_t ntop;
	struct met_top top[MET_TOP_RULES];
	size_t ncand;
	struct met_cand_row cand[MET_CAND_ROWS];
	size_t nnodes;
	struct store_node_stats nodes[MET_NODES]; /* the Redis nodes, as last published */
};

/* The top offenders of one rule, merged over the workers (MET_TOP_K kept). */
struct met_merged_top {
	char rule[MET_NAME];
	uint64_t denied;
	struct hll hll;
	size_t n;
	struct topk_entry *e;           /* owned: the workers' entries merged, sorted (n) */
};

/* Every live worker's slot merged, for the status page (metrics_view()). */
struct met_view {
	unsigned live;                  /* workers reporting */
	int64_t started;                /* Unix seconds the agent started */
	uint64_t sum[MC_COUNT];         /* each counter summed over the workers */
	uint64_t max[MC_COUNT];         /* ... its highest value among them */
	bool reload_ok;                 /* the last reload (max[MC_RELOAD_AT]) was applied */
	struct met_row *rows;           /* owned: decisions by (tier, rule) */
	size_t nrows;
	struct met_cand_row *cand;      /* owned: the candidate's verdicts */
	size_t ncand;
	struct met_merged_top *tops;    /* owned: top offenders by rule */
	size_t ntop;
	uint64_t degraded[STORE_COUNT]; /* degraded answers by reason */
	struct prom_hist decision_lat, redis_lat;
	struct store_node_stats *nodes; /* owned: merged by name */
	size_t nnodes;
	struct met_point hist[MET_HIST]; /* the decision history, oldest first */
	size_t nhist;
};

struct metrics;

struct metrics *metrics_new(unsigned workers);
void metrics_free(struct metrics *m);
struct met_slot *metrics_attach(struct metrics *m, unsigned worker);
void metrics_decision(struct met_slot *s, const char *tier, const char *rule, int result);
void metrics_candidate(struct met_slot *s, const char *tier, const char *rule, int result);
struct met_top *metrics_top(struct met_slot *s, const char *rule);
void metrics_render(const struct metrics *m, struct http_reply *r);
void metrics_render_top(const struct metrics *m, struct http_reply *r);
void metrics_sample(struct metrics *m, const struct met_slot *s, int64_t now);
struct met_view *metrics_view(const struct metrics *m);
void metrics_view_free(struct met_view *v);

/* Results for metrics_decision(). */
enum met_result {
	MR_ALLOWED = 0,
	MR_DENIED,
	MR_SHADOW_DENIED,
	MR_DEGRADED,            /* allowed without any verdict: fail-open */
	MR_LOCAL,               /* allowed by local fallback limits, Redis not consulted */
	MR_COUNT                /* sentinel */
};

/* Results for metrics_candidate(). */
enum met_cand_result {
	MCR_WOULD_ALLOW = 0,    /* the candidate admits the request (rule: "-") */
	MCR_WOULD_DENY,         /* the candidate's <rule> denies it */
	MCR_NEW_DENIAL,         /* ... and the enforced policy allowed it */
	MCR_LIFTED,             /* the enforced <rule> denied it, the candidate admits it */
	MCR_COUNT               /* sentinel */
};

#endif /* AGENT_METRICS_H */
