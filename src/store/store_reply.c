/* SPDX-License-Identifier: MIT */
/*
 * Reply readers for every connection to Redis: the store's, the Sentinels',
 * `ctl`'s.
 *
 * hiredis builds every reply element with calloc(): seven or more objects a
 * decision (the reply array, its integers) and as many free() calls after the
 * callback. glibc serves calloc() past its per-thread cache, from the slow
 * path, and that was the largest share of the agent's own instructions per
 * exact decision (callgrind). These functions build the very same redisReply
 * trees, so nothing that reads a reply changes, but take the objects from a
 * free list and the element vectors and strings from malloc().
 *
 * Single-threaded: a process (each worker is one) has one list. It keeps at
 * most REPLY_FREE_MAX objects; the rest go back to the allocator.
 *
 * A reply is the server's word, not ours, and a server may be broken, an
 * impostor, or a clear-text link someone writes into. Left alone, hiredis'
 * reader keeps a bulk string's bytes until the whole string is there (a header
 * announcing a terabyte is read for as long as it is sent), builds arrays as
 * deep as they are nested (hiredis 1.x; 0.14 stops at 7), and scans a line
 * from its start at every feed (a line without its end costs time squared).
 * So each reader made here carries its limits (struct reply_limits) and a
 * budget for the reply being read, through the reader's privdata, which the
 * reader hands to every task:
 * - the create functions refuse an array past the depth, the elements all the
 *   reply's arrays announce past the limit, strings whose bytes add up past it;
 * - reply_reader_get() looks at what is pending of the item being read: a
 *   bulk string whose announced length does not fit is refused when its
 *   header arrives, not once a terabyte has; a line longer than REPLY_LINE_MAX
 *   is refused; and so is a reply whose strings and pending bytes pass
 *   max_bytes.
 * A refusal is an error of the reader, with the reason in words; the
 * connection closes on it (rconn.c). Memory held for one reply is then
 * bounded by about max_bytes plus max_elements objects (64 bytes each with the
 * allocator's share), and nothing is freed recursively (reply_free()).
 *
 * One source serves hiredis 0.14 (Debian 12) and 1.x (Debian 13):
 * createArray's count type differs, the task stack is an array or a vector,
 * and 1.x reads RESP3's doubles and booleans, which a server may send unasked:
 * without functions of ours for them, hiredis would hand their type over as
 * the reply's pointer (and leave its slot in an array empty).
 */
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hiredis/hiredis.h>

#include "compiler.h"
#include "pool.h"
#include "store_reply.h"
#include "util.h"

#define REPLY_FREE_MAX 4096     /* objects kept: 48 bytes each */
#define REPLY_VEC_SMALL 64      /* element vectors up to this many: malloc() and clear */
/* the most elements an array may claim with no budget (a reader not made here):
 * a header alone must not reserve gigabytes of address space */
#define REPLY_ARRAY_MAX (1 << 22)
/* a bulk string's length line: "-1" to 20 digits and its CRLF */
#define BULK_HEADER_MAX 24

/* the same words whether the header or the whole string shows it */
#define BULK_TOO_BIG "a bulk string of %llu bytes would pass redis.max_reply_bytes (%zu)"

/* What the reply being read has spent of its reader's limits (the reader's privdata). */
struct reply_budget {
	struct reply_limits lim;
	size_t bytes;                   /* its strings' bytes */
	size_t elements;                /* elements its arrays announced */
	char why[128];                  /* why a create function refused, "" none */
	bool refused;                   /* the reader's error is one of the limits */
};

static redisReply *reply_free_list; /* linked through ->element */
static unsigned reply_nfree;

/* Bulk strings: their bytes follow a header of their length (RESP3's verbatim too). */
static bool is_bulk(int type)
{
#ifdef REDIS_REPLY_VERB
	if (type == REDIS_REPLY_VERB)
		return true;
#endif
	return type == REDIS_REPLY_STRING;
}

/* The budget of <task>'s reader, or NULL (a reader not made by reply_reader_new()). */
static struct reply_budget *budget_of(const redisReadTask *task)
{
	struct reply_budget *b = task->privdata;

	if (b && !task->parent) { /* the root: a new reply begins */
		b->bytes = 0;
		b->elements = 0;
	}
	return b;
}

static void PRINTF(2, 3) refuse(struct reply_budget *b, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(b->why, sizeof(b->why), fmt, ap);
	va_end(ap);
}

/* A new object of <type> for <task>, linked into its parent array; NULL if out of memory. */
static redisReply *reply_new(const redisReadTask *task, int type)
{
	redisReply *r = reply_free_list;

	if (r) {
		reply_free_list = (redisReply *)(void *)r->element;
		reply_nfree--;
		pool_unpoison(r, sizeof(*r));
	} else {
		r = malloc(sizeof(*r));
		if (!r)
			return NULL;
	}
	r->type = type;
	r->integer = 0;
	r->len = 0;
	r->str = NULL;
	r->elements = 0;
	r->element = NULL;
	if (task->parent) {
		redisReply *parent = task->parent->obj;

		BUG_ON(task->idx < 0 || (size_t)task->idx >= parent->elements);
		parent->element[task->idx] = r;
	}
	return r;
}

static void *create_string(const redisReadTask *task, char *str, size_t len)
{
	struct reply_budget *b = budget_of(task);
	char *copy;
	redisReply *r;

	if (b) {
		if (len > b->lim.max_bytes - b->bytes) {
			if (is_bulk(task->type))
				refuse(b, BULK_TOO_BIG, (unsigned long long)len, b->lim.max_bytes);
			else
				refuse(b, "a reply of more than %zu bytes (redis.max_reply_bytes)",
				       b->lim.max_bytes);
			return NULL;
		}
		b->bytes += len;
	}
	copy = len < SIZE_MAX ? malloc(len + 1) : NULL;
	if (!copy)
		return NULL;
	r = reply_new(task, task->type);
	if (!r) {
		free(copy);
		return NULL;
	}
	memcpy(copy, str, len);
	copy[len] = '\0';
	r->str = copy;
	r->len = len;
	return r;
}

/* hiredis 1.x counts an array's elements in a size_t, 0.14 in an int */
#if defined(HIREDIS_MAJOR) && HIREDIS_MAJOR >= 1
typedef size_t reply_count_t;
#else
typedef int reply_count_t;
#endif

/* Whether an array of <elements> for <task> fits <b> (counted when it does). */
static bool array_fits(struct reply_budget *b, const redisReadTask *task, size_t elements)
{
	const redisReadTask *t = task;
	unsigned depth = 1;

	while (t->parent && depth <= b->lim.max_depth) {
		depth++;
		t = t->parent;
	}
	if (depth > b->lim.max_depth) {
		refuse(b, "arrays nested more than %u deep (redis.max_reply_depth)",
		       b->lim.max_depth);
		return false;
	}
	if (elements > b->lim.max_elements - b->elements) {
		refuse(b, "a reply of more than %zu elements (redis.max_reply_elements)",
		       b->lim.max_elements);
		return false;
	}
	b->elements += elements;
	return true;
}

static void *create_array(const redisReadTask *task, reply_count_t elements)
{
	struct reply_budget *b = budget_of(task);
	redisReply **vec = NULL;
	redisReply *r;

	if (elements > (reply_count_t)REPLY_ARRAY_MAX && !b)
		return NULL;
	if (b && !array_fits(b, task, (size_t)elements))
		return NULL;
	if (elements > 0) {
		/* zeroed: an array cut short by a protocol error is freed half built */
		if (elements <= REPLY_VEC_SMALL) {
			vec = malloc((size_t)elements * sizeof(*vec));
			if (vec)
				memset(vec, 0, (size_t)elements * sizeof(*vec));
		} else {
			vec = calloc((size_t)elements, sizeof(*vec));
		}
		if (!vec)
			return NULL;
	}
	r = reply_new(task, task->type);        /* an array, or RESP3's map, set or push */
	if (!r) {
		free(vec);
		return NULL;
	}
	if (vec) {
		r->element = vec;
		r->elements = (size_t)elements;
	}
	return r;
}

static void *create_integer(const redisReadTask *task, long long value)
{
	redisReply *r;

	(void)budget_of(task);
	r = reply_new(task, REDIS_REPLY_INTEGER);
	if (r)
		r->integer = value;
	return r;
}

static void *create_nil(const redisReadTask *task)
{
	(void)budget_of(task);
	return reply_new(task, REDIS_REPLY_NIL);
}

#if defined(HIREDIS_MAJOR) && HIREDIS_MAJOR >= 1
static void *create_double(const redisReadTask *task, double value, char *str, size_t len)
{
	redisReply *r = create_string(task, str, len);  /* the text as sent, as hiredis keeps it */

	if (r)
		r->dval = value;
	return r;
}

static void *create_bool(const redisReadTask *task, int value)
{
	redisReply *r;

	(void)budget_of(task);
	r = reply_new(task, REDIS_REPLY_BOOL);
	if (r)
		r->integer = value != 0;
	return r;
}
#endif

/* <r>, whose elements are gone, back to the free list (its string freed). */
static void release(redisReply *r)
{
	free(r->str);
	if (reply_nfree < REPLY_FREE_MAX) {
		r->element = (redisReply **)(void *)reply_free_list;
		reply_free_list = r;
		reply_nfree++;
		pool_poison(r, sizeof(*r), &r->element);
	} else {
		free(r);
	}
}

/*
 * Frees the tree <obj> with a stack of the arrays still to empty, linked
 * through their ->str (an array has none): no recursion, whatever the depth.
 * The reader builds elements in order and none is NULL: the built ones are a
 * prefix. An array cut short is freed without reading the slots past it, so a
 * header alone never touches (or, on some kernels, makes resident) the vector
 * calloc() reserved for it.
 */
void reply_free(void *obj)
{
	redisReply *stack = NULL, *r = obj;
	size_t i;

	if (!r)
		return;
	if (!r->element) {
		release(r);
		return;
	}
	r->str = NULL;
	stack = r;
	while (stack) {
		r = stack;
		stack = (redisReply *)(void *)r->str;
		r->str = NULL;
		for (i = 0; i < r->elements && r->element[i]; i++) {
			redisReply *c = r->element[i];

			if (c->element) {
				c->str = (char *)(void *)stack;
				stack = c;
			} else {
				release(c);
			}
		}
		free(r->element);
		r->element = NULL;
		release(r);
	}
}

static redisReplyObjectFunctions reply_fns = {
	.createString  = create_string,
	.createArray   = create_array,
	.createInteger = create_integer,
	.createNil     = create_nil,
#if defined(HIREDIS_MAJOR) && HIREDIS_MAJOR >= 1
	.createDouble  = create_double,
	.createBool    = create_bool,
#endif
	.freeObject    = reply_free,
};

redisReplyObjectFunctions *reply_functions(void)
{
	return &reply_fns;
}

redisReader *reply_reader_new(const struct reply_limits *lim)
{
	static const struct reply_limits defaults = REPLY_LIMITS_DEFAULT;
	struct reply_budget *b = calloc(1, sizeof(*b));
	redisReader *rd;

	if (!b)
		return NULL;
	b->lim = lim ? *lim : defaults;
	rd = redisReaderCreateWithFunctions(&reply_fns);
	if (!rd) {
		free(b);
		return NULL;
	}
	rd->privdata = b;
	return rd;
}

void reply_reader_free(redisReader *rd)
{
	if (!rd)
		return;
	free(rd->privdata);
	rd->privdata = NULL;
	redisReaderFree(rd);
}

/* The type of the item being read (its type byte consumed), or -1. */
static int item_type(const redisReader *rd)
{
	if (rd->ridx < 0)
		return -1;
#if defined(HIREDIS_MAJOR) && HIREDIS_MAJOR >= 1
	return rd->task[rd->ridx]->type;
#else
	return rd->rstack[rd->ridx].type;
#endif
}

static int PRINTF(2, 3) reader_fail(redisReader *rd, const char *fmt, ...)
{
	struct reply_budget *b = rd->privdata;
	va_list ap;

	b->refused = true;
	rd->err = REDIS_ERR_PROTOCOL;
	va_start(ap, fmt);
	vsnprintf(rd->errstr, sizeof(rd->errstr), fmt, ap);
	va_end(ap);
	return REDIS_ERR;
}

/*
 * What is pending of the item being read, against <b>: a bulk string whose
 * header announces more than the reply may still hold (refused when the header
 * arrives: its bytes are never waited for), a bulk header or a line that goes
 * on past any valid one. A line's bytes count when it is complete (the create
 * functions); until then REPLY_LINE_MAX bounds it.
 */
static int check_pending(redisReader *rd, const struct reply_budget *b)
{
	size_t pend = rd->len - rd->pos, left = b->lim.max_bytes - b->bytes;
	const char *p = rd->buf + rd->pos;

	if (!pend)
		return REDIS_OK;
	if (is_bulk(item_type(rd))) {
		size_t i, end = pend < BULK_HEADER_MAX ? pend : BULK_HEADER_MAX;
		unsigned long long n = 0;

		for (i = 0; i + 1 < end && !(p[i] == '\r' && p[i + 1] == '\n'); i++)
			;
		if (i + 1 >= end) /* no valid length is this long: hiredis would scan on */
			return pend < BULK_HEADER_MAX ? REDIS_OK
			       : reader_fail(rd, "Bad bulk string length");
		end = i;
		for (i = 0; i < end && p[i] >= '0' && p[i] <= '9' && n < (1ULL << 60); i++)
			n = n * 10 + (unsigned)(p[i] - '0');
		if (i == end && n > left) /* digits alone; anything else is hiredis' to refuse */
			return reader_fail(rd, BULK_TOO_BIG, n, b->lim.max_bytes);
	} else if (pend > REPLY_LINE_MAX) {
		return reader_fail(rd, "a line of more than %d bytes", REPLY_LINE_MAX);
	}
	return REDIS_OK;
}

int reply_reader_get(redisReader *rd, void **reply)
{
	struct reply_budget *b = rd->privdata;

	if (redisReaderGetReply(rd, reply) != REDIS_OK) {
		if (b && b->why[0] && rd->err == REDIS_ERR_OOM) {
			b->refused = true;
			rd->err = REDIS_ERR_PROTOCOL;
			snprintf(rd->errstr, sizeof(rd->errstr), "%s", b->why);
		}
		return REDIS_ERR;
	}
	if (!b)
		return REDIS_OK;
	if (*reply) { /* the next reply starts afresh */
		b->bytes = 0;
		b->elements = 0;
		return REDIS_OK;
	}
	return check_pending(rd, b);
}

const char *reply_reader_error(const redisReader *rd)
{
	return rd->errstr;
}

bool reply_reader_refused(const redisReader *rd)
{
	const struct reply_budget *b = rd->privdata;

	return b && b->refused;
}

size_t reply_reader_pending(const redisReader *rd)
{
	return rd->len - rd->pos;
}

/* Gives the free list back to the allocator (at exit, for leak checkers). */
void reply_cache_free(void)
{
	while (reply_free_list) {
		redisReply *r = reply_free_list;

		reply_free_list = (redisReply *)(void *)r->element;
		pool_unpoison(r, sizeof(*r));
		free(r);
	}
	reply_nfree = 0;
}
