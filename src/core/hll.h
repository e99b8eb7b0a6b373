/* SPDX-License-Identifier: MIT */
/*
 * Distinct counting with bounded memory: a HyperLogLog sketch of 2^12 one-byte
 * registers (4 KiB, standard error about 1.6 %), estimated with Ertl's
 * "improved raw estimator" (O. Ertl, "New cardinality estimation algorithms
 * for HyperLogLog sketches", 2017), whose sigma/tau terms correct the small
 * and the large range without empirical bias tables.
 *
 * Also home of the project's 64-bit hash, SipHash-1-3 (Aumasson & Bernstein),
 * used with a fixed key for sketches (so they can be merged across processes)
 * and with a random key for hash tables fed by clients (see topk.c).
 *
 * Not for: exact counts, deletions, or anything where 2-3 % error matters.
 */
#ifndef AGENT_HLL_H
#define AGENT_HLL_H

#include <stddef.h>
#include <stdint.h>

#include "compiler.h"

#define HLL_PRECISION  12                      /* index bits */
#define HLL_REGISTERS  (1U << HLL_PRECISION)   /* 4096 */

/* Public so that it can be embedded (e.g. in memory shared by worker processes). */
struct hll {
	uint8_t reg[HLL_REGISTERS];     /* largest rank per index, 0 = never hit */
};

struct hll;

struct hll *hll_new(void);
void hll_free(struct hll *h);
void hll_clear(struct hll *h);

void hll_add(struct hll *h, const void *data, size_t len);
void hll_add_hash(struct hll *h, uint64_t hash);
void hll_merge(struct hll *dst, const struct hll *src);
uint64_t hll_count(const struct hll *h);

uint64_t hll_siphash13(uint64_t k0, uint64_t k1, const void *data, size_t len);
uint64_t hll_hash(const void *data, size_t len);

#endif /* AGENT_HLL_H */
