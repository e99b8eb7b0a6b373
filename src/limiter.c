/* SPDX-License-Identifier: MIT */
#include "limiter.h"

/* ceil(a / 1000) for a >= 0 */
static int64_t ceil_ms(int64_t us)
{
	return us <= 0 ? 0 : (us + 999) / 1000;
}

/*
 * Fills <p> for <rate> tokens per <period_ms> with a bucket of <burst> tokens
 * (0: same as rate). The emission interval is rounded to whole microseconds,
 * which bounds the rate error by 0.5 us / interval (0.05% at 1,000 tokens/s).
 */
void gcra_params_from_rate(struct gcra_params *p, uint64_t rate, uint64_t period_ms,
			   uint64_t burst)
{
	uint64_t period_us = period_ms * 1000;
	uint64_t t = rate ? (period_us + rate / 2) / rate : period_us;

	if (t < 1)
		t = 1;
	if (!burst)
		burst = rate;
	p->t_us = (int64_t)t;
	p->tau_us = (int64_t)(t * burst);
}

/*
 * Decides a request of <cost> tokens against the <n> limits <p> whose stored
 * theoretical arrival times are <tat> (0 when absent), at <now_us>. It passes
 * only if every limit admits it; then every <tat> is advanced, otherwise none
 * is touched. Fills <out>[0..n) and returns the overall verdict. This mirrors
 * lua/gcra.lua step for step.
 */
bool gcra_decide(const struct gcra_params *p, int64_t *tat, size_t n, int64_t cost,
		 int64_t now_us, struct limit_verdict *out)
{
	bool allowed = true;
	size_t i;

	for (i = 0; i < n; i++) {
		int64_t t = tat[i] < now_us ? now_us : tat[i];
		int64_t newtat = t + p[i].t_us * cost;

		out[i].allowed = newtat - p[i].tau_us <= now_us;
		out[i].retry_ms = out[i].allowed ? 0 : ceil_ms(newtat - p[i].tau_us - now_us);
		if (!out[i].allowed)
			allowed = false;
	}
	for (i = 0; i < n; i++) {
		int64_t t = tat[i] < now_us ? now_us : tat[i];
		int64_t rem;

		if (allowed) {
			t += p[i].t_us * cost;
			tat[i] = t;
		}
		rem = p[i].tau_us - (t - now_us);
		out[i].remaining = rem < 0 ? 0 : rem / p[i].t_us;
		out[i].reset_ms = ceil_ms(t - now_us);
	}
	return allowed;
}
