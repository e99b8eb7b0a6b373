/* SPDX-License-Identifier: MIT */
/*
 * The in-process "memory" store: the C models of src/core/limiter.c kept in a
 * bounded hash table, for a single gateway or for development without Redis.
 * It decides a struct store_query synchronously, exactly as lua/decide.lua
 * would against a Redis holding the same keys, including key expiry.
 *
 * It is not shared between processes or hosts (every gateway would have its
 * own budget), not persistent, and not thread-safe (one event loop owns it).
 * When more keys are live than it may hold, it forgets some (counted as
 * evictions): a forgotten principal starts again with a full budget.
 */
#ifndef AGENT_MEMSTORE_H
#define AGENT_MEMSTORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compiler.h"

struct memstore;
struct store_query;
struct store_result;

#define MEMSTORE_MAX_KEYS ((size_t)1 << 28) /* largest accepted max_keys */

struct memstore *memstore_new(size_t max_keys) MUSTCHECK;
void memstore_free(struct memstore *m);

void memstore_decide(struct memstore *m, const struct store_query *q, int64_t now_us,
		     struct store_result *res);
size_t memstore_sweep(struct memstore *m, int64_t now_us, size_t max);
size_t memstore_forget_idle(struct memstore *m, int64_t before_us);

size_t memstore_size(const struct memstore *m);
size_t memstore_capacity(const struct memstore *m);
uint64_t memstore_evictions(const struct memstore *m);
uint64_t memstore_expired(const struct memstore *m);
bool memstore_check(const struct memstore *m);

#endif /* AGENT_MEMSTORE_H */
