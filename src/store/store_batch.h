/* SPDX-License-Identifier: MIT */
/*
 * The store's batches (store_batch.c): several decisions for a single Redis
 * in one script call. Calls the command and node layers below it; store.c
 * registers batch_take() as cmd_ops.batch and batch_fail() as
 * node_ops.closing, and its flusher calls batch_flush().
 */
#ifndef AGENT_STORE_BATCH_H
#define AGENT_STORE_BATCH_H

#include <stdbool.h>

#include "store_int.h"

bool batch_take(struct store_node *n, struct store_cmd *c, bool eval);
void batch_fail(struct store_node *n);
void batch_flush(struct store_node *n);

#endif /* AGENT_STORE_BATCH_H */
