/* SPDX-License-Identifier: MIT */
/*
 * Reply objects for the store's connections.
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
 * A reply is the server's word, not ours: an array header claiming more than
 * REPLY_ARRAY_MAX elements, or an allocation that fails, returns NULL, which
 * the reader turns into an error of the connection, as hiredis' own functions
 * do for the latter; the agent does not abort. Large element vectors come from
 * calloc(), whose fresh pages are neither written nor, when the array is
 * freed half built, read: a header alone (its elements never sent) costs
 * address space, not resident memory. One source serves hiredis 0.14 (Debian
 * 12) and 1.x (Debian 13): createArray's count type differs, and 1.x reads
 * RESP3's doubles and booleans, which a server may send unasked: without
 * functions of ours for them, hiredis would hand their type over as the
 * reply's pointer (and leave its slot in an array empty).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "store_int.h"
#include "util.h"

#define REPLY_FREE_MAX 4096     /* objects kept: 48 bytes each */
#define REPLY_VEC_SMALL 64      /* element vectors up to this many: malloc() and clear */
/* the most elements an array may claim: twice overrides.max_entries' ceiling and then
 * some (an HGETALL of the overrides hash is the largest reply we ask for); more is a
 * protocol error of the connection, not 16 GB of address space for a header */
#define REPLY_ARRAY_MAX (1 << 22)

static redisReply *reply_free;  /* linked through ->element */
static unsigned reply_nfree;

/* A new object of <type> for <task>, linked into its parent array; NULL if out of memory. */
static redisReply *reply_new(const redisReadTask *task, int type)
{
	redisReply *r = reply_free;

	if (r) {
		reply_free = (redisReply *)(void *)r->element;
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
	char *copy = len < SIZE_MAX ? malloc(len + 1) : NULL;
	redisReply *r;

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

static void *create_array(const redisReadTask *task, reply_count_t elements)
{
	redisReply **vec = NULL;
	redisReply *r;

	if (elements > (reply_count_t)REPLY_ARRAY_MAX)
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
	redisReply *r = reply_new(task, REDIS_REPLY_INTEGER);

	if (r)
		r->integer = value;
	return r;
}

static void *create_nil(const redisReadTask *task)
{
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
	redisReply *r = reply_new(task, REDIS_REPLY_BOOL);

	if (r)
		r->integer = value != 0;
	return r;
}
#endif

static void free_object(void *obj)
{
	redisReply *r = obj;
	size_t i;

	if (!r)
		return;
	if (r->element) {
		/* the reader builds elements in order and none is NULL: the built ones are
		 * a prefix. An array cut short is freed without reading the slots past it,
		 * so a header alone never touches (or, on some kernels, makes resident)
		 * the vector calloc() reserved for it. */
		for (i = 0; i < r->elements && r->element[i]; i++)
			free_object(r->element[i]);
		free(r->element);
	}
	free(r->str);
	if (reply_nfree < REPLY_FREE_MAX) {
		r->element = (redisReply **)(void *)reply_free;
		reply_free = r;
		reply_nfree++;
		pool_poison(r, sizeof(*r), &r->element);
	} else {
		free(r);
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
	.freeObject    = free_object,
};

/* The functions above, for a reader's ->fn: the connections' and the fuzz target's. */
redisReplyObjectFunctions *reply_functions(void)
{
	return &reply_fns;
}

/* Gives the free list back to the allocator (at exit, for leak checkers). */
void reply_cache_free(void)
{
	while (reply_free) {
		redisReply *r = reply_free;

		reply_free = (redisReply *)(void *)r->element;
		pool_unpoison(r, sizeof(*r));
		free(r);
	}
	reply_nfree = 0;
}
