/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target for the Redis reply reader: hiredis' redisReader building
 * its replies with the agent's own reply objects and limits (src/store/store_reply.c:
 * a free list, a reply's bytes, elements and depth bounded, half-built arrays
 * freed touching only what was built, without recursion), exactly as every
 * connection to Redis, a Sentinel or `ctl`'s reads what the server sends. The
 * limits are small here (FUZZ_LIMITS) so that inputs reach them.
 *
 * The input is the byte stream a server sends (RESP). It is fed to a fresh
 * reader four ways: whole; one byte per feed, so that the reader stops at
 * every byte boundary (inputs up to BYTEWISE_MAX); in two pieces cut where
 * the input's hash says; in chunks of sizes drawn from that hash (a few bytes,
 * or past the reader's buffer thresholds). After each feed
 * every complete reply is taken, checked to be a well-formed tree (a known
 * type, array elements present, strings NUL-terminated at their length),
 * recorded and freed with reply_free(). An error of the reader ends the feed.
 * Every way must give the same replies and the same error, if any, but for
 * one: a limit seen on what is pending (a bulk header announcing too much, a
 * line without end) may stop a way that fed less at a time before the replies
 * another way completed; then the replies before the refusal must agree.
 * Whatever is left half built goes with reply_reader_free(). Any disagreement
 * calls abort(). Inputs over 64 KiB are ignored.
 *
 * Build and replay: see tests/fuzz/README.md (make fuzz, make replay).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "fuzz.h"
#include "store_reply.h"

#define FUZZ_MAX_INPUT (1U << 16)
#define BYTEWISE_MAX   4096     /* a long line is scanned again each feed: quadratic */
/* small limits, so that inputs reach them: every reply taken must be within them */
static const struct reply_limits FUZZ_LIMITS = {.max_bytes = 4096, .max_elements = 256,
						.max_depth = 4};

/* What one way of feeding gave: the replies, flattened, and how it ended. */
struct outcome {
	uint8_t *buf;
	size_t len, cap;
	size_t nreplies;
	bool err;
	bool refused;                   /* the error is one of the limits */
	char errstr[128];
};

/* What one reply spent: checked against FUZZ_LIMITS. */
struct spent {
	size_t bytes, elements;
};

static void put(struct outcome *o, const void *p, size_t n)
{
	if (o->len + n > o->cap) {
		size_t ncap = o->cap ? o->cap : 256;

		while (ncap < o->len + n)
			ncap *= 2;
		o->buf = realloc(o->buf, ncap);
		CHECK(o->buf != NULL);
		o->cap = ncap;
	}
	memcpy(o->buf + o->len, p, n);
	o->len += n;
}

/* Checks that <r> is a well-formed tree within the limits and appends it to <o>. */
static void take(struct outcome *o, const redisReply *r, unsigned depth, struct spent *sp)
{
	size_t i;

	/* hiredis 1.x returns the type as a pointer when a create function is missing */
	CHECK((uintptr_t)r >= 4096);
	put(o, &r->type, sizeof(r->type));
	switch (r->type) {
	case REDIS_REPLY_STRING:
	case REDIS_REPLY_STATUS:
	case REDIS_REPLY_ERROR:
#ifdef REDIS_REPLY_VERB
	case REDIS_REPLY_BIGNUM:
	case REDIS_REPLY_VERB:
	case REDIS_REPLY_DOUBLE:
#endif
		CHECK(r->str != NULL && r->str[r->len] == '\0');
		CHECK(r->elements == 0 && r->element == NULL);
		sp->bytes += r->len;
		CHECK(sp->bytes <= FUZZ_LIMITS.max_bytes);
		put(o, &r->len, sizeof(r->len));
		put(o, r->str, r->len);         /* every byte read: ASan checks len */
		break;
	case REDIS_REPLY_INTEGER:
	case REDIS_REPLY_NIL:
#ifdef REDIS_REPLY_BOOL
	case REDIS_REPLY_BOOL:
#endif
		CHECK(r->str == NULL && r->elements == 0 && r->element == NULL);
		put(o, &r->integer, sizeof(r->integer));
		break;
	case REDIS_REPLY_ARRAY:
#ifdef REDIS_REPLY_MAP
	case REDIS_REPLY_MAP:
	case REDIS_REPLY_SET:
	case REDIS_REPLY_ATTR:
	case REDIS_REPLY_PUSH:
#endif
		CHECK(r->str == NULL && depth + 1 <= FUZZ_LIMITS.max_depth);
		CHECK((r->elements == 0) == (r->element == NULL));
		sp->elements += r->elements;
		CHECK(sp->elements <= FUZZ_LIMITS.max_elements);
		put(o, &r->elements, sizeof(r->elements));
		for (i = 0; i < r->elements; i++) {
			CHECK(r->element[i] != NULL);
			take(o, r->element[i], depth + 1, sp);
		}
		break;
	default:
		abort();
	}
}

/* Takes every complete reply <rd> holds; false once it is in error. */
static bool drain(redisReader *rd, struct outcome *o)
{
	void *rep;

	for (;;) {
		struct spent sp = {0, 0};

		if (reply_reader_get(rd, &rep) != REDIS_OK) {
			o->err = true;
			o->refused = reply_reader_refused(rd);
			memcpy(o->errstr, reply_reader_error(rd), sizeof(o->errstr));
			return false;
		}
		if (!rep)
			return true;
		take(o, rep, 0, &sp);
		o->nreplies++;
		reply_free(rep);
	}
}

/* Chunk sizes: 0 = the whole input, else a fixed size, else xorshift64 (*rng). */
static size_t next_chunk(size_t fixed, uint64_t *rng)
{
	uint64_t x = *rng;

	if (fixed || !x)
		return fixed;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	*rng = x;
	/* mostly a few bytes, sometimes past the reader's 1 KiB discard and its 16 KiB maxbuf */
	switch (x & 3) {
	case 0:
	case 1:
		return 1 + (x >> 8) % 8;
	case 2:
		return 1 + (x >> 8) % 1500;
	default:
		return 1 + (x >> 8) % 20000;
	}
}

/* Feeds <data> to a new reader: <first> bytes, then chunks of next_chunk() bytes. */
static void feed(const uint8_t *data, size_t size, size_t first, size_t fixed, uint64_t rng,
		 struct outcome *o)
{
	redisReader *rd = reply_reader_new(&FUZZ_LIMITS);
	size_t off = 0, n = first;

	CHECK(rd != NULL);
	memset(o, 0, sizeof(*o));
	while (off < size) {
		if (!n)
			n = next_chunk(fixed, &rng);
		if (!n || n > size - off)
			n = size - off;
		if (redisReaderFeed(rd, (const char *)data + off, n) != REDIS_OK) {
			o->err = true;
			memcpy(o->errstr, rd->errstr, sizeof(o->errstr));
			break;
		}
		off += n;
		n = 0;
		if (!drain(rd, o))
			break;
	}
	reply_reader_free(rd);  /* a reply half built goes with the reader's freeObject */
}

static void same(const struct outcome *a, struct outcome *b)
{
	size_t n = a->len < b->len ? a->len : b->len;

	if ((a->refused || b->refused) &&
	    (a->err != b->err || strcmp(a->errstr, b->errstr) != 0 || a->len != b->len)) {
		/* a limit met on what was pending, in the way that fed less at a time:
		 * what came before it agrees, and that way gave no more */
		CHECK(a->len == b->len || (a->len < b->len ? a : b)->refused);
		CHECK(n == 0 || memcmp(a->buf, b->buf, n) == 0);
		free(b->buf);
		return;
	}
	CHECK(a->nreplies == b->nreplies && a->len == b->len);
	CHECK(a->len == 0 || memcmp(a->buf, b->buf, a->len) == 0);
	CHECK(a->err == b->err);
	CHECK(!a->err || strcmp(a->errstr, b->errstr) == 0);
	free(b->buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct outcome whole, other;
	uint64_t seed = 0xcbf29ce484222325ULL;
	size_t i;

	if (size > FUZZ_MAX_INPUT)
		return 0;
	for (i = 0; i < size; i++)
		seed = (seed ^ data[i]) * 0x100000001b3ULL;

	feed(data, size, 0, 0, 0, &whole);
	if (size <= BYTEWISE_MAX) {
		feed(data, size, 0, 1, 0, &other);
		same(&whole, &other);
	}
	if (size > 1) {
		feed(data, size, 1 + seed % (size - 1), 0, 0, &other);
		same(&whole, &other);
	}
	feed(data, size, 0, 0, seed | 1, &other);
	same(&whole, &other);
	free(whole.buf);
	reply_cache_free();
	return 0;
}
