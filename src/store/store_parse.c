/* SPDX-License-Identifier: MIT */
/*
 * The rate-limit script's replies read into a store_result (see
 * store_parse.h). The script (lua/decide.lua) answers a flat integer
 * array: allowed, n, its Redis time in us, then per limit allowed, remaining,
 * retry_ms, reset_ms, and for a batch the units granted and the lease in ms.
 */
#include "reply_parse.h"
#include "store_parse.h"

/*
 * Parses the script's flat integer array, the answer to <q>, into <r>. Every
 * integer is checked against its range (flags 0 or 1, times and durations
 * non-negative and bounded, a grant within what was asked), so nothing the
 * agent computes from it can overflow. Returns 0 or -1.
 */
static int parse_flat(const redisReply *rep, size_t n, int64_t want, struct store_result *r)
{
	bool batch = want > 0;
	size_t i;

	if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 3 + 4 * n + (batch ? 2 : 0))
		return -1;
	if (!reply_int_in(rep->element[0], 0, 1) ||
	    !reply_int_in(rep->element[1], (long long)n, (long long)n) ||
	    !reply_int_in(rep->element[2], 0, REPLY_US_MAX))
		return -1;
	r->allowed = rep->element[0]->integer == 1;
	r->n = n;
	r->now_us = rep->element[2]->integer;
	for (i = 0; i < n; i++) {
		redisReply **e = rep->element + 3 + 4 * i;

		if (!reply_int_in(e[0], 0, 1) ||
		    !reply_int_in(e[1], -REPLY_TOKENS_MAX, REPLY_TOKENS_MAX) ||
		    !reply_int_in(e[2], 0, REPLY_MS_MAX) || !reply_int_in(e[3], 0, REPLY_MS_MAX))
			return -1;
		r->v[i].allowed = e[0]->integer == 1;
		r->v[i].remaining = e[1]->integer;
		r->v[i].retry_ms = e[2]->integer;
		r->v[i].reset_ms = e[3]->integer;
	}
	r->granted = r->allowed ? 1 : 0;
	r->lease_ms = 0;
	if (batch) {
		if (!reply_int_in(rep->element[3 + 4 * n], 0, want) ||
		    !reply_int_in(rep->element[4 + 4 * n], 0, REPLY_MS_MAX))
			return -1;
		r->granted = rep->element[3 + 4 * n]->integer;
		r->lease_ms = rep->element[4 + 4 * n]->integer;
	}
	r->cand_ok = r->cand_allowed = false;
	return 0;
}

/*
 * Parses the answer to <q> into <r>: the script's flat array, or for a query
 * with a candidate the multi form's pair { own decision, candidate's }. The
 * candidate's element may be an error of its own (r->cand_ok stays false);
 * an error in the first is the caller's (cmd_reply()). Returns 0 or -1.
 */
int store_parse_result(const redisReply *rep, const struct store_query *q,
		       struct store_result *r)
{
	struct store_result cr;
	size_t i, ne = q->n - q->ncand;

	if (!q->ncand)
		return parse_flat(rep, q->n, q->want, r);
	if (rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
	    parse_flat(rep->element[0], ne, 0, r) < 0)
		return -1;
	r->n = q->n;
	if (rep->element[1]->type == REDIS_REPLY_ERROR)
		return 0;
	if (parse_flat(rep->element[1], q->ncand, 0, &cr) < 0)
		return -1;
	for (i = 0; i < q->ncand; i++)
		r->v[ne + i] = cr.v[i];
	r->cand_ok = true;
	r->cand_allowed = cr.allowed;
	return 0;
}
