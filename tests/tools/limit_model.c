/* SPDX-License-Identifier: MIT */
/*
 * Drives the C models of src/core/limiter.c from text, so tests can feed them the
 * same requests (at the same Redis times) as the Redis script and compare
 * every field.
 *
 * stdin:  "n alg1 a1 b1 shadow1 ... algn an bn shadown" on the first line,
 *         then "now_us cost" or "now_us cost1 ... costn" lines; a line ending
 *         in "R" is a report (charged whatever is left, as the script's).
 * stdout: per request "allowed ok1 rem1 retry1 reset1 ... okn remn retryn resetn".
 *
 * With "--params ALG RATE PERIOD_MS BURST" it prints instead "A B RET": the
 * parameters limit_params_init() computes (as the agent sends them) and its
 * return value.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "limiter.h"

#define MAXN 16

int main(int argc, char **argv)
{
	struct limit_params p[MAXN];
	struct limit_state st[MAXN] = {{0}};
	struct limit_verdict v[MAXN];
	long long now;
	int64_t cost[MAXN];
	size_t n, i;

	if (argc == 6 && strcmp(argv[1], "--params") == 0) {
		int ret = limit_params_init(&p[0], atoi(argv[2]), strtoull(argv[3], NULL, 10),
					   strtoull(argv[4], NULL, 10), strtoull(argv[5], NULL, 10));

		printf("%lld %lld %d\n", (long long)p[0].a, (long long)p[0].b, ret);
		return 0;
	}
	if (scanf("%zu", &n) != 1 || n < 1 || n > MAXN)
		return 2;
	for (i = 0; i < n; i++) {
		long long a, b;
		int alg, shadow;

		if (scanf("%d %lld %lld %d", &alg, &a, &b, &shadow) != 4)
			return 2;
		p[i].alg = (uint8_t)alg;
		p[i].a = a;
		p[i].b = b;
		p[i].shadow = shadow != 0;
	}
	/* a request line: "now_us cost" (same cost for every limit) or
	 * "now_us c1 ... cn" (one cost per limit) */
	while (scanf("%lld", &now) == 1) {
		char line[1024], *s, *end;
		size_t k = 0;
		bool ok;

		if (!fgets(line, sizeof(line), stdin))
			return 2;
		for (s = line; k < n; s = end) {
			long long c = strtoll(s, &end, 10);

			if (end == s)
				break;
			cost[k++] = c;
		}
		if (k == 1)
			for (i = 1; i < n; i++)
				cost[i] = cost[0];
		else if (k != n)
			return 2;
		if (strchr(s, 'R')) {
			/* "... R": a report of one unit, charged whatever is left */
			limit_report(p, st, n, cost, now, v);
			ok = true;
		} else {
			ok = limit_decide(p, st, n, cost, now, v);
		}

		printf("%d", ok ? 1 : 0);
		for (i = 0; i < n; i++)
			printf(" %d %lld %lld %lld", v[i].allowed ? 1 : 0, (long long)v[i].remaining,
			       (long long)v[i].retry_ms, (long long)v[i].reset_ms);
		printf("\n");
	}
	for (i = 0; i < n; i++)
		limit_state_release(&st[i]);
	return 0;
}
