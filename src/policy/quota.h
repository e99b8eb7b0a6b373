/* SPDX-License-Identifier: MIT */
/*
 * Local quotas: what one agent may decide without a Redis round trip, within
 * the accuracy budget of each limit.
 *
 * Per key (one store query: the limits of a principal with their costs) the
 * agent keeps a small entry, and a request is answered in the first way that
 * applies:
 *   lease      tokens granted by Redis ahead of time (charged there at once)
 *              and not expired: spend one locally; ask for the next lease
 *              before this one runs dry or out of time;
 *   pre-check  the key is far below its limit (the last answer from Redis
 *              left more than every live gateway could admit unreported):
 *              admit locally, report the usage to Redis in batches;
 *   Redis      otherwise one script call, shared by every request of the key
 *              that arrives while it is in flight (coalescing), and asking
 *              for a lease on top when the key is hot.
 * Sizes come from the budget: what the live gateways hold unused (leases
 * beyond their own traffic, unreported batches) stays within budget x limit;
 * a bucket's lease also covers its gateway's own traffic for a short horizon,
 * so busy gateways call Redis less (see quota.c).
 */
#ifndef AGENT_QUOTA_H
#define AGENT_QUOTA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "list.h"
#include "store.h"

struct ev_loop;
struct quota;

/* How a request was answered (struct quota_waiter.local). */
enum quota_via {
	QUOTA_VIA_REDIS    = 0,
	QUOTA_VIA_LEASE    = 1,
	QUOTA_VIA_PRECHECK = 2,
};

/* A request waiting for its key's Redis call; embedded in the caller's state. */
struct quota_waiter {
	struct list node;               /* in the key's waiters */
	int local;                      /* set by quota_decide(): enum quota_via */
	double lease_end;               /* QUOTA_VIA_LEASE: the end of that lease */
	/* called once: the request's own answer (res valid during the call) */
	void (*done)(struct quota_waiter *w, enum store_status st, const struct store_result *res);
};

/* How quota_decide() handled a request. */
enum quota_path {
	QUOTA_LOCAL  = 0,       /* answered now from a lease or a pre-check: <out> filled */
	QUOTA_WAIT   = 1,       /* the waiter's done() will be called later */
	QUOTA_FAILED = 2,       /* the store refused the call at once: *st says why */
	QUOTA_BYPASS = 3,       /* not handled (table full): decide as without quotas */
};

/* Counters for the metrics (cumulative) and gauges. */
struct quota_stats {
	uint64_t lease_grants;          /* calls that granted a lease */
	uint64_t lease_units;           /* units granted as leases */
	uint64_t lease_spent;           /* requests answered from a lease */
	uint64_t lease_expired;         /* leased units that expired unused (under-admission) */
	uint64_t lease_returned;        /* leased units given back unused (traffic stopped) */
	uint64_t precheck_local;        /* requests admitted by pre-check */
	uint64_t precheck_reports;      /* batches reported */
	uint64_t precheck_over;         /* reported units that no longer fitted (over-admission) */
	uint64_t report_failed;         /* reports that failed */
	uint64_t report_lost;           /* units of reports that may not have run (timeout) */
	uint64_t coalesced;             /* requests that shared another's Redis call */
	uint64_t undone;                /* local answers taken back (denied by another part) */
	uint64_t keys;                  /* gauge: keys tracked */
	uint64_t outstanding;           /* gauge: leased units held now */
	uint64_t unreported;            /* gauge: pre-checked units not reported yet */
	uint64_t gateways;              /* gauge: live gateways (heartbeat.c), 0 = unknown */
	uint64_t full;                  /* requests not tracked because the table was full */
};

struct quota_opts {
	unsigned lease_ms;
	unsigned flush_ms;
	unsigned horizon;               /* a bucket's lease: traffic of horizon x budget x period */
	unsigned max_keys;
	bool precheck;
	bool leases;
	bool coalesce;
};

struct quota *quota_new(struct ev_loop *loop, struct store *store, const struct quota_opts *o);
void quota_free(struct quota *qt);
void quota_configure(struct quota *qt, const struct quota_opts *o, bool leasing);
void quota_set_gateways(struct quota *qt, uint64_t n);
enum quota_path quota_decide(struct quota *qt, uint64_t h, const struct store_query *q,
			     double cap, struct quota_waiter *w, struct store_result *out,
			     enum store_status *st);
void quota_flush(struct quota *qt);
bool quota_undo(struct quota *qt, uint64_t h, const struct store_query *q, int how,
		double lease_end);
void quota_note_charge(struct quota *qt, uint64_t h, const struct store_query *q, int64_t units);
void quota_report_now(struct quota *qt, uint64_t h, const struct store_query *q);
size_t quota_pending(const struct quota *qt);
const struct quota_stats *quota_stats(struct quota *qt);

#endif /* AGENT_QUOTA_H */
