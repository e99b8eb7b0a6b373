/* SPDX-License-Identifier: MIT */
/*
 * The store's topology (store_cluster.c): the mode (a single Redis or a
 * Redis Cluster), the slot map, CLUSTER SLOTS and its refresh, MOVED and ASK.
 * Calls the command and node layers below it; store.c registers
 * cmd_redirect() as cmd_ops.redirect and refresh_request() as cmd_ops.refresh.
 */
#ifndef AGENT_STORE_CLUSTER_H
#define AGENT_STORE_CLUSTER_H

#include <stdbool.h>

#include "store_int.h"

void slot_set(struct store *s, unsigned slot, struct store_node *n);
bool cmd_redirect(struct store_node *from, struct store_cmd *c, const char *err);
void refresh_request(struct store *s);
void refresh_kick(struct store *s);

#endif /* AGENT_STORE_CLUSTER_H */
