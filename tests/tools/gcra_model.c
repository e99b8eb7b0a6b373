/* SPDX-License-Identifier: MIT */
/*
 * Drives the C GCRA model from text, so tests can feed it the same requests
 * (at the same Redis times) as lua/gcra.lua and compare every field.
 *
 * stdin:  "n T1 tau1 ... Tn taun" on the first line, then "now_us cost" lines.
 * stdout: per request "allowed a1 rem1 retry1 reset1 ... an remn retryn resetn".
 */
#include <stdio.h>
#include <stdlib.h>

#include "limiter.h"

#define MAXN 16

int main(void)
{
	struct gcra_params p[MAXN];
	struct limit_verdict v[MAXN];
	int64_t tat[MAXN] = {0};
	long long now, cost;
	size_t n, i;

	if (scanf("%zu", &n) != 1 || n < 1 || n > MAXN)
		return 2;
	for (i = 0; i < n; i++) {
		long long t, tau;

		if (scanf("%lld %lld", &t, &tau) != 2)
			return 2;
		p[i].t_us = t;
		p[i].tau_us = tau;
	}
	while (scanf("%lld %lld", &now, &cost) == 2) {
		bool ok = gcra_decide(p, tat, n, cost, now, v);

		printf("%d", ok ? 1 : 0);
		for (i = 0; i < n; i++)
			printf(" %d %lld %lld %lld", v[i].allowed ? 1 : 0, (long long)v[i].remaining,
			       (long long)v[i].retry_ms, (long long)v[i].reset_ms);
		printf("\n");
	}
	return 0;
}
