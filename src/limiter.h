/* SPDX-License-Identifier: MIT */
/*
 * The rate-limit algorithms as pure integer functions. They are the reference
 * model that lua/ scripts are tested against, operation for operation, and the
 * engine of in-process stores.
 */
#ifndef AGENT_LIMITER_H
#define AGENT_LIMITER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One GCRA limit: rate/period with a burst, as Redis script arguments. */
struct gcra_params {
	int64_t t_us;           /* emission interval: microseconds per token (>= 1) */
	int64_t tau_us;         /* burst tolerance: t_us * burst */
};

/* What one limit said about one request (same fields as lua/gcra.lua). */
struct limit_verdict {
	bool allowed;           /* this limit admits the request */
	int64_t remaining;      /* tokens left (after the charge if the request passed) */
	int64_t retry_ms;       /* until this limit admits the cost; 0 if it does */
	int64_t reset_ms;       /* until the bucket is full again */
};

void gcra_params_from_rate(struct gcra_params *p, uint64_t rate, uint64_t period_ms,
			   uint64_t burst);
bool gcra_decide(const struct gcra_params *p, int64_t *tat, size_t n, int64_t cost,
		 int64_t now_us, struct limit_verdict *out);

#endif /* AGENT_LIMITER_H */
