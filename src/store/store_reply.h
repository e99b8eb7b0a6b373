/* SPDX-License-Identifier: MIT */
/*
 * Reply readers for every connection to Redis (store_reply.c): hiredis' reply
 * reader building redisReply trees from a free list, within limits, since a
 * reply is the server's word and the server may be broken, an impostor or a
 * clear-text link someone writes into. Calls nothing of the store.
 */
#ifndef AGENT_STORE_REPLY_H
#define AGENT_STORE_REPLY_H

#include <stdbool.h>
#include <stddef.h>

#include <hiredis/read.h>

/* One reply's bounds (redis.max_reply_*; doc/configuration.md). */
struct reply_limits {
	size_t max_bytes;       /* its strings, and what is pending of it in the buffer */
	size_t max_elements;    /* elements its arrays announce, all together */
	unsigned max_depth;     /* arrays nested: 1 = a flat array */
};

#define REPLY_MAX_BYTES_DEFAULT    (16u << 20)  /* 16 MiB */
#define REPLY_MAX_ELEMENTS_DEFAULT (1u << 18)   /* 262,144 */
#define REPLY_MAX_DEPTH_DEFAULT    8
#define REPLY_LIMITS_DEFAULT \
	{REPLY_MAX_BYTES_DEFAULT, REPLY_MAX_ELEMENTS_DEFAULT, REPLY_MAX_DEPTH_DEFAULT}
/* a line (status, error, integer, an array's or a string's header) longer than
 * this is refused: hiredis scans a line from its start at every feed */
#define REPLY_LINE_MAX             65536

/* A reader within <lim> (NULL: the defaults); NULL when out of memory. */
redisReader *reply_reader_new(const struct reply_limits *lim);
void reply_reader_free(redisReader *rd);
/*
 * Like redisReaderGetReply(), and a reply that breaks a limit, or whose pending
 * part already does, is an error of the reader: REDIS_ERR, with the reason in
 * words (reply_reader_error()). A reply taken is freed with reply_free().
 */
int reply_reader_get(redisReader *rd, void **reply);
const char *reply_reader_error(const redisReader *rd);
/* The reader's error is one of the limits (not a malformed reply). */
bool reply_reader_refused(const redisReader *rd);
/* Bytes the reader holds that are not yet a reply. */
size_t reply_reader_pending(const redisReader *rd);
/* Frees a reply tree, without recursion. NULL is fine. */
void reply_free(void *reply);

/* The reply functions alone (a reader made elsewhere: the fuzz target). */
redisReplyObjectFunctions *reply_functions(void);
/* Frees the objects kept for reuse (at exit). */
void reply_cache_free(void);

#endif /* AGENT_STORE_REPLY_H */
