/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target for what the agent reads out of Redis' replies, once the
 * reader (fuzz_resp.c) has built them: the rate-limit script's replies into a
 * store_result (src/store/store_parse.c), and MOVED/ASK errors, CLUSTER SLOTS
 * entries, a Sentinel's master address and +switch-master messages, and ROLE
 * (src/store/reply_parse.c).
 *
 * The input's first two bytes choose the query the script answers: byte 0
 * the number of limits (1..16, low nibble) and of them the candidate's (bits
 * 4-5: 0..3), byte 1 the batch size asked (0, or one of a few sizes; never
 * with a candidate, as the store never asks so). The rest is a RESP stream
 * read with reply_reader_new() (small limits, FUZZ_LIMITS) and
 * reply_reader_get(); every reply taken, and every element of it, goes to
 * every reader: the script's for the chosen query and for the queries its
 * shape suggests (n from its length, with and without a batch's two
 * integers), the multi form's pair made of two neighbouring elements (as
 * store_batch.c hands a candidate's decision on), CLUSTER SLOTS entries,
 * the redirection and +switch-master readers on every string, the Sentinel's
 * address and ROLE's readers.
 *
 * The script's reader is also checked against a model of its contract
 * written here again (it must accept exactly what the model accepts, and
 * fill what the reply says). Whenever a reader accepts, what it filled must
 * hold what its header promises: flags 0 or 1, times and durations non-negative and within their
 * bounds, a grant within what was asked, slots within 0..16383 and start <=
 * end, ports within 1..65535, hosts inside the reply and NUL-terminated at
 * their length with no NUL before it, a +switch-master message read exactly as
 * it is written. Anything else calls abort(). Inputs
 * over 64 KiB are ignored.
 *
 * Build and replay: see tests/fuzz/README.md (make fuzz, make replay).
 */
#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "crc16.h"
#include "fuzz.h"
#include "reply_parse.h"
#include "store_parse.h"
#include "store_reply.h"

#define FUZZ_MAX_INPUT (1U << 16)
/* small limits, so that inputs reach them (and stay fast) */
static const struct reply_limits FUZZ_LIMITS = {.max_bytes = 4096, .max_elements = 256,
						.max_depth = 4};
/* batch sizes byte 1 chooses from (0: a single decision) */
static const int64_t WANTS[] = {0, 1, 2, 7, 100, 1 << 20, INT32_MAX, INT64_MAX};

/* A string of <len> bytes NUL-terminated there, with no NUL before; every byte read. */
static bool str_exact(const char *s, size_t len)
{
	return s != NULL && strlen(s) == len;
}

/* True when [p, p + len) lies in the string <s> of <slen> bytes. */
static bool inside(const char *p, size_t len, const char *s, size_t slen)
{
	return p >= s && p <= s + slen && len <= (size_t)(s + slen - p);
}

/* One verdict as store_parse.h promises it. */
static void check_verdict(const struct limit_verdict *v)
{
	CHECK(v->remaining >= -REPLY_TOKENS_MAX && v->remaining <= REPLY_TOKENS_MAX);
	CHECK(v->retry_ms >= 0 && v->retry_ms <= REPLY_MS_MAX);
	CHECK(v->reset_ms >= 0 && v->reset_ms <= REPLY_MS_MAX);
}

/*
 * Whether the script's flat array <rep> answers a query of <n> limits and
 * <want>, written here again element by element from store_parse.h's
 * contract, so that the reader is checked both ways: what it accepts and
 * what it refuses.
 */
static bool model_flat(const redisReply *rep, size_t n, int64_t want)
{
	static const long long lo[4] = {0, -REPLY_TOKENS_MAX, 0, 0};
	static const long long hi[4] = {1, REPLY_TOKENS_MAX, REPLY_MS_MAX, REPLY_MS_MAX};
	size_t k, limits_end = 3 + 4 * n;

	if (rep->type != REDIS_REPLY_ARRAY || rep->elements != limits_end + (want > 0 ? 2 : 0))
		return false;
	for (k = 0; k < rep->elements; k++) {
		const redisReply *e = rep->element[k];
		long long l, h;

		if (k == 0) {
			l = 0, h = 1;
		} else if (k == 1) {
			l = h = (long long)n;
		} else if (k == 2) {
			l = 0, h = REPLY_US_MAX;
		} else if (k < limits_end) {
			l = lo[(k - 3) % 4], h = hi[(k - 3) % 4];
		} else if (k == limits_end) {
			l = 0, h = want;
		} else {
			l = 0, h = REPLY_MS_MAX;
		}
		if (e->type != REDIS_REPLY_INTEGER || e->integer < l || e->integer > h)
			return false;
	}
	return true;
}

/* The same for the answer to a query of <n> limits, <ncand> a candidate's, <want>. */
static bool model_result(const redisReply *rep, size_t n, size_t ncand, int64_t want)
{
	if (!ncand)
		return model_flat(rep, n, want);
	return rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
	       model_flat(rep->element[0], n - ncand, 0) &&
	       (rep->element[1]->type == REDIS_REPLY_ERROR ||
		model_flat(rep->element[1], ncand, 0));
}

/* The script's reader on <rep> for the query of <n> limits, <ncand> a candidate's, <want>. */
static void try_result(const redisReply *rep, size_t n, size_t ncand, int64_t want)
{
	struct store_query q;
	struct store_result r;
	size_t i, own = n - ncand;

	if (n < 1 || n > STORE_MAX_LIMITS || ncand > n || (ncand && want))
		return;
	q.n = n;
	q.ncand = ncand;
	q.want = want;
	memset(&r, 0xa5, sizeof(r));
	if (store_parse_result(rep, &q, &r) < 0) {
		CHECK(!model_result(rep, n, ncand, want));
		return;
	}
	CHECK(model_result(rep, n, ncand, want));
	CHECK(r.n == n);
	CHECK(r.allowed == 0 || r.allowed == 1);
	CHECK(r.now_us >= 0 && r.now_us <= REPLY_US_MAX);
	if (want > 0) {
		CHECK(r.granted >= 0 && r.granted <= want);
		CHECK(r.lease_ms >= 0 && r.lease_ms <= REPLY_MS_MAX);
	} else {
		CHECK(r.granted == (r.allowed ? 1 : 0) && r.lease_ms == 0);
	}
	CHECK(r.cand_ok == 0 || r.cand_ok == 1);
	CHECK(r.cand_allowed == 0 || r.cand_allowed == 1);
	CHECK(!r.cand_ok || ncand > 0);
	CHECK(r.cand_ok || !r.cand_allowed);
	for (i = 0; i < (r.cand_ok ? n : own); i++) {
		CHECK(r.v[i].allowed == 0 || r.v[i].allowed == 1);
		check_verdict(&r.v[i]);
	}
	/* what was filled is what the reply says: the decision of the flat array or the
	 * pair's first, the verdicts of both */
	{
		const redisReply *flat = ncand ? rep->element[0] : rep;

		CHECK(r.allowed == (flat->element[0]->integer == 1));
		CHECK(r.now_us == flat->element[2]->integer);
		for (i = 0; i < (r.cand_ok ? n : own); i++) {
			const redisReply *f = i < own ? flat : rep->element[1];
			redisReply **e = f->element + 3 + 4 * (i < own ? i : i - own);

			CHECK(r.v[i].allowed == (e[0]->integer == 1));
			CHECK(r.v[i].remaining == e[1]->integer);
			CHECK(r.v[i].retry_ms == e[2]->integer && r.v[i].reset_ms == e[3]->integer);
		}
		if (want > 0) {
			CHECK(r.granted == flat->element[3 + 4 * n]->integer);
			CHECK(r.lease_ms == flat->element[4 + 4 * n]->integer);
		}
		CHECK(r.cand_ok == (ncand > 0 && rep->element[1]->type != REDIS_REPLY_ERROR));
		CHECK(!r.cand_ok || r.cand_allowed == (rep->element[1]->element[0]->integer == 1));
	}
}

/* The script's reader on <rep> for the chosen query and those its length suggests. */
static void try_results(const redisReply *rep, size_t n, size_t ncand, int64_t want)
{
	size_t k;

	try_result(rep, n, ncand, want);
	try_result(rep, 1, 0, 0);
	if (rep->type != REDIS_REPLY_ARRAY)
		return;
	if (rep->elements >= 3) {
		try_result(rep, (rep->elements - 3) / 4, 0, 0);
		try_result(rep, (rep->elements - 3) / 4, 0, want ? want : 1);
	}
	if (rep->elements >= 5)
		try_result(rep, (rep->elements - 5) / 4, 0, want ? want : 1);
	/* the multi form: { own, candidate's }, each from its own length */
	if (rep->elements == 2 && rep->element[0]->type == REDIS_REPLY_ARRAY &&
	    rep->element[0]->elements >= 3) {
		size_t own = (rep->element[0]->elements - 3) / 4;
		size_t cand = rep->element[1]->type == REDIS_REPLY_ARRAY &&
				      rep->element[1]->elements >= 3
			      ? (rep->element[1]->elements - 3) / 4
			      : ncand;

		try_result(rep, own + cand, cand, 0);
	}
	/* a batch's reply holds one element per decision; a candidate's takes two
	 * neighbours, read as the pair store_batch.c makes of them */
	for (k = 0; k + 1 < rep->elements; k++) {
		redisReply pair = {.type = REDIS_REPLY_ARRAY, .elements = 2,
				   .element = rep->element + k};

		try_result(&pair, n, ncand ? ncand : 1, 0);
	}
}

/* The redirection reader on the string <err> of <len> bytes. */
static void try_redirect(const char *err, size_t len)
{
	struct reply_redirect rd;
	int ret = reply_redirect_parse(err, &rd);
	size_t slen = strlen(err);      /* the reader sees the string up to its first NUL */

	(void)len;
	if (ret > 0) {
		CHECK(strncmp(err, "MOVED ", 6) != 0 && strncmp(err, "ASK ", 4) != 0);
		return;
	}
	if (ret < 0)
		return;
	CHECK(ret == 0);
	CHECK(strncmp(err, rd.ask ? "ASK " : "MOVED ", rd.ask ? 4 : 6) == 0);
	CHECK(rd.slot < CRC16_SLOTS);
	CHECK(rd.port >= 1 && rd.port <= 65535);
	CHECK(inside(rd.host, rd.hostlen, err, slen));
	CHECK(rd.host[rd.hostlen] == ':');
	CHECK(memchr(rd.host, '\0', rd.hostlen) == NULL);
}

/* The CLUSTER SLOTS entry reader on <e>. */
static void try_slots_entry(const redisReply *e)
{
	struct reply_slots_entry se;
	const redisReply *h;

	if (reply_slots_entry(e, &se) < 0)
		return;
	CHECK(se.start <= se.end && se.end < CRC16_SLOTS);
	CHECK(se.start == (unsigned long long)e->element[0]->integer);
	CHECK(se.end == (unsigned long long)e->element[1]->integer);
	CHECK(str_exact(se.host, se.hostlen));
	h = e->element[2]->element[0];
	CHECK(h->type == REDIS_REPLY_NIL ? se.hostlen == 0
					 : inside(se.host, se.hostlen, h->str, h->len));
	CHECK(se.port == e->element[2]->element[1]->integer);
}

/* The Sentinel's answer reader on <r>. */
static void try_master_addr(const redisReply *r)
{
	struct reply_master_addr ma;

	memset(&ma, 0xa5, sizeof(ma));
	if (reply_master_addr(r, &ma) < 0)
		return;
	CHECK(memchr(ma.host, '\0', sizeof(ma.host)) != NULL);
	CHECK(str_exact(ma.host, r->element[0]->len));
	CHECK(memcmp(ma.host, r->element[0]->str, r->element[0]->len) == 0);
	CHECK(ma.port >= 1 && ma.port <= 65535);
	/* the port is what the whole string says, not a prefix of it */
	CHECK(str_exact(r->element[1]->str, r->element[1]->len));
}

/* The +switch-master reader on <msg>: what it read, written again, is the message. */
static void try_switch(const redisReply *msg)
{
	struct reply_switch sw;
	char again[sizeof(sw) + 32];
	int len;

	if (reply_switch_master(msg, &sw) < 0)
		return;
	CHECK(memchr(sw.name, '\0', sizeof(sw.name)) != NULL);
	CHECK(memchr(sw.old_host, '\0', sizeof(sw.old_host)) != NULL);
	CHECK(memchr(sw.new_host, '\0', sizeof(sw.new_host)) != NULL);
	CHECK(sw.name[0] && sw.old_host[0] && sw.new_host[0]);
	CHECK(sw.old_port >= 1 && sw.old_port <= 65535 && sw.new_port >= 1 && sw.new_port <= 65535);
	len = snprintf(again, sizeof(again), "%s %s %d %s %d", sw.name, sw.old_host, sw.old_port,
		       sw.new_host, sw.new_port);
	CHECK(len > 0 && (size_t)len == msg->len && memcmp(again, msg->str, msg->len) == 0);
}

/* ROLE's reader on <r>. */
static void try_role(const redisReply *r)
{
	const char *role = reply_role(r);

	if (!role)
		return;
	CHECK(r->type == REDIS_REPLY_ARRAY && r->elements >= 1);
	CHECK(role == r->element[0]->str);
	CHECK(str_exact(role, r->element[0]->len));
}

/* Every reader on <rep>, then on its elements (<depth> levels more). */
static void try_all(const redisReply *rep, size_t n, size_t ncand, int64_t want, unsigned depth)
{
	size_t k;

	switch (rep->type) {
	case REDIS_REPLY_ERROR:
	case REDIS_REPLY_STATUS:
	case REDIS_REPLY_STRING:
		try_redirect(rep->str, rep->len);
		try_switch(rep);
		break;
	case REDIS_REPLY_INTEGER:
		CHECK(reply_int_in(rep, rep->integer, rep->integer));
		CHECK(!reply_int_in(rep, 1, 0));
		break;
	default:
		CHECK(!reply_int_in(rep, LLONG_MIN, LLONG_MAX));
		break;
	}
	try_results(rep, n, ncand, want);
	try_slots_entry(rep);
	try_master_addr(rep);
	try_role(rep);
	if (rep->type != REDIS_REPLY_ARRAY || !depth)
		return;
	for (k = 0; k < rep->elements; k++)
		try_all(rep->element[k], n, ncand, want, depth - 1);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	redisReader *rd;
	size_t n, ncand;
	int64_t want;
	void *rep;

	if (size < 2 || size > FUZZ_MAX_INPUT)
		return 0;
	n = 1 + (data[0] & 15);
	ncand = (data[0] >> 4) & 3;
	if (ncand > n)
		ncand = n;
	want = ncand ? 0 : WANTS[data[1] % (sizeof(WANTS) / sizeof(WANTS[0]))];
	rd = reply_reader_new(&FUZZ_LIMITS);
	CHECK(rd != NULL);
	if (redisReaderFeed(rd, (const char *)data + 2, size - 2) == REDIS_OK) {
		while (reply_reader_get(rd, &rep) == REDIS_OK && rep) {
			try_all(rep, n, ncand, want, 2);
			reply_free(rep);
		}
	}
	reply_reader_free(rd);
	reply_cache_free();
	return 0;
}
