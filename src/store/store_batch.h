/* SPDX-License-Identifier: MIT */
/*
 * The store's batches (store_batch.c): several decisions for a single Redis
 * in one script call. Calls the command and node layers below it (the
 * command layer fills a node's batch); store.c registers batch_fail() as
 * node_ops.closing, and its flusher calls batch_flush().
 */
#ifndef AGENT_STORE_BATCH_H
#define AGENT_STORE_BATCH_H

#include <stdbool.h>

#include "store_int.h"

void batch_fail(struct store_node *n);
void batch_flush(struct store_node *n);

#endif /* AGENT_STORE_BATCH_H */
