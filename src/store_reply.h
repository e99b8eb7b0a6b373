/* SPDX-License-Identifier: MIT */
/*
 * Reply objects for the store's connections (store_reply.c): the reader's
 * redisReply trees built from a free list. Calls nothing of the store.
 */
#ifndef AGENT_STORE_REPLY_H
#define AGENT_STORE_REPLY_H

#include <hiredis/read.h>

/* The functions a connection's reader builds replies with (rconn_opts.fn). */
redisReplyObjectFunctions *reply_functions(void);
/* Frees the objects kept for reuse (at the store's end). */
void reply_cache_free(void);

#endif /* AGENT_STORE_REPLY_H */
