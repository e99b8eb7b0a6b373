/* SPDX-License-Identifier: MIT */
/*
 * The rate-limit script's replies read into a store_result (store_parse.c):
 * the flat integer array of one decision (a batch's grant and lease after
 * it), or the multi form's pair { own decision, candidate's }. Pure: no
 * logging, no store state, so that the fuzz target
 * (tests/fuzz/fuzz_reply_parse.c) reaches it with any reply.
 */
#ifndef AGENT_STORE_PARSE_H
#define AGENT_STORE_PARSE_H

#include <hiredis/hiredis.h>

#include "store_types.h"

/* Bounds of the integers a script reply may carry: beyond, the reply is nonsense. */
#define REPLY_US_MAX     ((long long)1 << 52)  /* a Redis time: ~142 years in us */
#define REPLY_MS_MAX     ((long long)1 << 40)  /* a duration: ~34 years in ms */
#define REPLY_TOKENS_MAX ((long long)1 << 32)  /* tokens left: x a rate (< 2^30) fits */

/*
 * Parses the answer to <q> (its n, ncand and want) into <r>: the script's flat
 * array, or for a query with a candidate the multi form's pair { own decision,
 * candidate's }. The candidate's element may be an error of its own
 * (r->cand_ok stays false, r->v[] past the own limits is not written); an
 * error in the first is the caller's (cmd_reply()). Every integer is checked
 * against its range (flags 0 or 1, times and durations non-negative and
 * within the bounds above, tokens within +-REPLY_TOKENS_MAX, a grant within
 * what was asked), so nothing computed from it can overflow. Returns 0 or -1
 * (<r> then partly written).
 */
int store_parse_result(const redisReply *rep, const struct store_query *q,
		       struct store_result *r);

#endif /* AGENT_STORE_PARSE_H */
