/* SPDX-License-Identifier: MIT */
/*
 * The gateway heartbeat: every agent process that uses Redis writes itself
 * into a registry in Redis every period and reads how many are alive
 * (lua/heartbeat.lua). The count sizes the local quotas' leases and divides
 * the local fallback limits (fallback.gateways = "auto"); the last count seen
 * is kept while Redis cannot answer, so an outage is limited by the fleet it
 * began with.
 */
#ifndef AGENT_HEARTBEAT_H
#define AGENT_HEARTBEAT_H

#include <stdint.h>

struct ev_loop;
struct store;
struct heartbeat;

/* Called when the count of live agents changes (never with 0). */
typedef void (*heartbeat_fn)(uint64_t gateways, void *arg);

struct heartbeat *heartbeat_new(struct ev_loop *loop, struct store *store, heartbeat_fn cb,
				void *arg);
void heartbeat_configure(struct heartbeat *hb, const char *key_prefix, unsigned period_ms);
uint64_t heartbeat_gateways(const struct heartbeat *hb);
void heartbeat_free(struct heartbeat *hb);

#endif /* AGENT_HEARTBEAT_H */
