/* SPDX-License-Identifier: MIT */
/*
 * The agent's own types, shared by the files of the decision path and not part
 * of its API (agent.h): the agent, a decision and its parts.
 *
 * DESIGN
 * A decision goes down a path of files, each calling only files further down
 * (doc/development.md has the map; `make check-layers` checks the includes):
 *
 *   agent.c      the agent: setup, rule swap, drain, HTTP endpoints, statistics
 *   notify.c     a NOTIFY's messages read: a decision or a post-charge begins
 *   prepare.c    block overrides, the tier, limit overrides: the store queries
 *   parts.c      each query decided, one after the other, then the decision ends
 *   candidate.c  the candidate policy, decided next to the enforced one
 *   charge.c     charges after the answer: refunds, post-charges
 *   answer.c     the ACK's variables and RateLimit fields; outcomes counted
 *   principal.c  who asks: API key digests, masked addresses, Redis key names
 *   blocked.c    denials Redis computed, repeated until they could pass
 *   decision.c   the decision object: its pool, costs, a query's hash
 *
 * A file never calls one above it. What comes back from below (a NOTIFY from
 * the SPOP server, the store's answers, a tier looked up, the overrides
 * loaded) comes through a callback registered by the file that waits for it.
 *
 * The agent is in parts, each with one writer (`make check-layers` holds the
 * files to it): the top's own fields, written by agent.c; the decisions' pool
 * (struct decision_pool), decision.c's; the caches (struct decide_caches),
 * each its file's; the statistics (struct decide_stats), st.<file> written by
 * decide/<file>.c and read by agent.c, which publishes them.
 */
#ifndef AGENT_AGENT_INT_H
#define AGENT_AGENT_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <ev.h>

#include "config.h"
#include "digest.h"
#include "http.h"
#include "list.h"
#include "metrics.h"
#include "quota.h"
#include "spop.h"
#include "store.h"

struct blocked_slot;
struct held_slot;
struct digest_slot;
struct tier_slot;
struct status_body;
struct spoa_req;

/* Decision outcomes, counted: allowed or denied, and of these the degraded ones. */
enum agent_outcome {
	OUT_ALLOWED   = 0,      /* exact or by the failure ladder */
	OUT_DENIED    = 1,      /* ... */
	OUT_DEGRADED  = 2,      /* of the above, those Redis could not decide (some part
				 * failed): the failure ladder answered, allowing or
				 * denying; by reason in st.answer.degraded_by */
	OUT_IGNORED   = 3,      /* no message of ours in the NOTIFY */
	OUT_COUNT               /* sentinel */
};

#define MAX_APPLIED (2 * STORE_MAX_LIMITS)
/*
 * Store queries of a decision: 0 the principal's limits, 1 an endpoint's
 * global limits, 2 the candidate endpoint's global limits when their hash tag
 * is not part 1's (see cand_add()).
 */
#define NPARTS 3

/* What became of a response's cost (the post-charge message), counted. */
enum post_outcome {
	POST_CHARGED   = 0,     /* a charge (the difference) sent, debt allowed */
	POST_REFUNDED  = 1,     /* a refund (the response cost less than the pre-charge) sent */
	POST_UNCHANGED = 2,     /* the response cost what the request was charged */
	POST_ABSENT    = 3,     /* no cost in the message: the pre-charge stands */
	POST_INVALID   = 4,     /* not a non-negative integer: ignored, the pre-charge stands */
	POST_FAILED    = 5,     /* a charge or refund Redis did not take (timeout, down...) */
	POST_OUT_COUNT          /* sentinel */
};

/*
 * What the decision path counts, in one part per file of decide/: each part is
 * written by the file it is named after (st.answer by answer.c, st.charge by
 * charge.c, ...) and only read elsewhere; agent.c publishes them into the
 * metrics and the shutdown line. An event another file sees goes through a
 * function of the owner (ignore_request(), post_counted()). `make
 * check-layers` holds every file to it.
 */
struct decide_stats {
	struct {
		uint64_t outcomes[OUT_COUNT];
		uint64_t degraded_by[STORE_COUNT];
		uint64_t ovr_blocked;   /* requests denied by a block override */
		size_t ntopk;
		struct {
			char rule[MET_NAME];
			struct topk *t; /* owned: freed by top_offenders_free() */
		} topk[MET_TOP_RULES];  /* top offenders, by denying rule */
	} answer;
	struct {
		uint64_t refunds;       /* charges taken back after a split denial */
		uint64_t refunds_lost;  /* ... whose Redis call failed: the charge stays */
		uint64_t post[POST_OUT_COUNT]; /* post-charges by outcome */
		uint64_t released;      /* concurrency slots given back (responses, a clean stop) */
		uint64_t release_lost;  /* ... whose Redis call failed: the lease ends it */
		uint64_t untracked;     /* slots held past HELD_MAX: not given back at a stop */
	} charge;
	struct {
		uint64_t invalid_costs; /* costs from HAProxy out of range: charged COST_MAX */
		uint64_t post_clamped;  /* response costs above post_charge.max: the max */
	} notify;
	struct {
		uint64_t tier_hits, tier_misses;
		uint64_t no_address;    /* anonymous requests without a source address */
		uint64_t ovr_limited;   /* decisions with limits changed by an override */
	} prepare;
	struct {
		uint64_t local_decisions; /* failed parts decided by local fallback limits */
	} parts;
	struct {
		uint64_t hits;          /* queries answered by the blocked-key cache */
	} blocked;
};

/*
 * The decisions' pool and what they wait for: read and written by decision.c
 * alone (`make check-layers` says so), the others call its decision_*().
 */
struct decision_pool {
	struct decision *free;          /* owned: unused decisions, at most DFREE_MAX */
	size_t nfree;
	size_t pending;                 /* store calls owed a callback: what a drain waits for */
	struct list parked;             /* decisions waiting for the first overrides load */
	bool stopping;                  /* the agent goes: nothing waits any more */
	uint64_t slot_base;             /* this process's concurrency slots: a random high part */
	uint64_t slot_seq;              /* ... and a sequence (decision_slot()) */
};

/*
 * The decision path's caches, each created, emptied, written and freed by the
 * file of decide/ that uses it (`make check-layers` says so): agent.c calls
 * their functions at setup, on a reload and when it goes.
 */
struct decide_caches {
	struct tier_slot *tier;         /* prepare.c: the tier cache, tier_size slots */
	size_t tier_size;               /* prepare.c */
	struct digest_slot *digest;     /* principal.c: DCACHE_SLOTS, API key -> its digest */
	struct blocked_slot *blocked;   /* blocked.c: BLOCKED_SLOTS, or NULL when disabled */
	struct held_slot **held;        /* charge.c: HELD_BUCKETS chains of the concurrency
					 * slots this process's requests hold, or NULL */
	size_t nheld;                   /* charge.c: their number, at most HELD_MAX */
	bool held_closed;               /* charge.c: the agent stops, slots go back at once */
};

/*
 * The agent, in parts that each have one writer. The top's own fields, first,
 * are written by agent.c alone (setup, reload, the heartbeat's count, what it
 * publishes and serves) and only read by decide/: the objects of the wings
 * below, which the decisions call. Then the decision path's three parts:
 * its caches, its pool of decisions, its statistics (see above).
 */
struct agent {
	/* the top's: agent.c writes them */
	struct ev_loop *loop;           /* ref */
	struct ruleset *rs;             /* one reference */
	struct spoa_server *srv;        /* owned */
	struct store *store;            /* owned, NULL unless store "redis" */
	struct memstore *mem;           /* owned, NULL unless store "memory" */
	struct memstore *local;         /* owned: fallback state of on_failure "local" limits */
	struct quota *quota;            /* owned, NULL unless store "redis": local quotas */
	struct heartbeat *hb;           /* owned, NULL unless store "redis": live gateways */
	uint64_t gateways;              /* live agents in the last heartbeat, 0 = none yet */
	struct overrides *ovr;          /* owned, NULL unless store "redis" and overrides.enabled */
	struct metrics *metrics;        /* ref: shared region (owned by main) */
	struct met_slot *ms;            /* ref: this process's slot (its counters are
					 * written through it by whoever counts) */
	struct http_server *http;       /* owned or NULL */
	/* the status page and /status.json as last rendered: served again for
	 * STATUS_CACHE_S, so that scrapes cannot take the loop from decisions */
	struct {
		struct http_reply r;    /* status and headers; its body is ... */
		struct status_body *body; /* ... this, lent to the replies (NULL: empty) */
		double at;              /* ev_now(): rendered then, 0: never */
	} status_cache[2];
	ev_timer publish;               /* copies gauges and top-K snapshots into ms */
	double local_check;             /* mono(): next look for idle local fallback state */
	double heap_check;              /* mono(): next sample of the heap's usage */
	/* the decision path's */
	struct decide_caches caches;    /* each used by the decide/ file it names */
	struct decision_pool decisions; /* decision.c's alone */
	struct decide_stats st;         /* st.<file> written by decide/<file>.c; agent.c reads */
};

/* One limit applied to a request. */
struct applied {
	const struct rule_limit *l;     /* ref: into the decision's ruleset */
	int part;                       /* which store query: 0 principal, 1 global */
	size_t slot;                    /* index inside that query */
	uint64_t rate;                  /* l->rate, or a limit override's */
	uint64_t capacity;              /* l->capacity, or a limit override's */
	struct limit_params local_lp;   /* l->local_lp, or a limit override's */
};

/* One limit of the candidate policy applied to a request. */
struct cand_applied {
	const struct rule_limit *l;     /* ref: into the decision's rs->cand */
	int part;                       /* which store query: 0 principal, 1 or 2 global */
	size_t slot;                    /* index inside that query's candidate limits */
};

/* One store query of a decision and its outcome. */
struct part {
	struct decision *d;             /* ref: back pointer for the callback */
	struct store_query q;
	enum store_status st;
	struct store_result res;
	bool used;
	bool fallback;                  /* res holds the failure ladder's verdicts */
	uint64_t h;                     /* hash of q, for the blocked-key cache */
	double t_sent;                  /* mono() when the query left */
	bool has[STORE_MAX_LIMITS];     /* a verdict exists for this slot */
	double cap;                     /* local quota budget in units (all gateways), 0 = exact */
	bool conc;                      /* holds a concurrency limit: exact (no local quota), its
					 * denials not cached (a slot given back ends them) */
	struct quota_waiter w;          /* while it waits on its key's Redis call */
};

/* A decision in progress. */
struct decision {
	struct agent *a;                /* ref */
	struct spoa_req *req;           /* owned until completed */
	struct ruleset *rs;             /* one reference */
	const struct rule_endpoint *ep; /* ref: into rs, or NULL */
	unsigned waiting;               /* store queries not answered yet */
	int next;                       /* next part to decide (parts go in order) */
	size_t n;                       /* applied limits, in ap[] */
	/* kept while the tier is looked up */
	char principal[80];
	uint8_t digest[16];
	uint8_t fp[FP_LEN];             /* the key's fingerprint (digest.h), when keyed */
	struct spop_data ip;
	int64_t cost;                   /* from HAProxy, or -1 (COST_MAX when invalid) */
	bool closed;                    /* a fail-closed limit denied */
	bool charges;                   /* some applied limit costs this request tokens */
	bool overridden;                /* some limit has a limit override's parameters */
	bool keyed;                     /* an API key was sent */
	bool post;                      /* a post-charge, not a decision: no answer, no req */
	int64_t post_cost;              /* post: the request's cost, known from its response,
					 * or -1: none (a slot given back, nothing charged) */
	int64_t slot;                   /* the concurrency slot the request takes (its
					 * concurrency limits' cost; decision_slot()), or the
					 * one a post-charge gives back; 0 = none */
	const struct rule_limit *post_shadow; /* post: the shadow limit that would have
					 * denied the request (its ACK's `shadow`): not charged
					 * for it, so neither charged nor refunded now */
	const struct rule_tier *sent_tier; /* ref: rs, the tier HAProxy sent, if known */
	struct list park;               /* on the pool's parked while it waits for the overrides */
	const struct rule_tier *tier;   /* ref: rs, the tier applied */
	const char *tier_name;          /* ref: rs, for metrics */
	char client[64];                /* fp:<hex> or address prefix, for top offenders */
	double t0;                      /* when the NOTIFY arrived (mono) */
	double answer_by;               /* mono(): Redis answers by then or the ladder
					 * does (ANSWER_SHARE of HAProxy's budget), 0 = none */
	struct decision *next_free;     /* in the pool's free while unused */
	bool allowed;                   /* the answer respond() gave ... */
	const struct rule_limit *rule;  /* ... and the limit it reported, or NULL */
	/* the candidate policy, rs->cand: see "Candidate policy" below */
	const struct rule_endpoint *cep; /* ref: into rs->cand, or NULL */
	const struct rule_tier *ctier;  /* ref: rs->cand, its tier by name, or NULL */
	size_t cn;                      /* its limits applied, in cap[] */
	/* from here on, not cleared by decision_new(): entries below n and cn are
	 * written whole before they are read */
	struct applied ap[MAX_APPLIED];
	struct cand_applied cap[MAX_APPLIED];
	struct part parts[NPARTS];      /* last: see decision_new() */
};

/*
 * The gateways a local fallback limit divides its rate by: fallback.gateways
 * when set, else ("auto") the live agents the heartbeats counted last, kept
 * through an outage; 1 before any count.
 */
static inline uint64_t fallback_gateways(const struct agent *a, const struct agent_config *c)
{
	return c->gateways ? c->gateways : a->gateways ? a->gateways : 1;
}

/* True when <pt> holds limits of the enforced policy (not only the candidate's). */
static inline bool part_enforced(const struct part *pt)
{
	return pt->q.n > pt->q.ncand;
}

#endif /* AGENT_AGENT_INT_H */
