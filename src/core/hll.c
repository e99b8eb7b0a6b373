/* SPDX-License-Identifier: MIT */
/*
 * HyperLogLog and SipHash-1-3.
 *
 * DESIGN
 * A 64-bit hash is split into an index (top HLL_PRECISION bits) and a rank
 * (1 + leading zeros of the remaining Q = 64 - HLL_PRECISION bits, Q + 1 when
 * they are all zero). Each register keeps the largest rank seen at its index.
 * The estimate uses the histogram C[0..Q+1] of register values:
 *
 *   z = m tau(1 - C[Q+1]/m);  for k = Q..1: z = (z + C[k]) / 2;
 *   z += m sigma(C[0]/m);     E = m^2 / (2 ln 2 z)
 *
 * sigma(x) = x + sum_{k>=1} x^(2^k) 2^(k-1) takes over from linear counting
 * for small cardinalities and tau(x) = (1 - x - sum_{k>=1} (1 - x^(2^-k))^2
 * 2^-k) / 3 corrects saturation at the top, so one formula covers the whole
 * range (Ertl 2017, section 4). Both series converge in a few dozen steps.
 */
#include "hll.h"

#include <endian.h>
#include <math.h>
#include <string.h>

#include "util.h"

#define HLL_Q        (64 - HLL_PRECISION)   /* bits left for the rank */
#define HLL_RANK_MAX (HLL_Q + 1)

/* The fixed key of hll_hash(): arbitrary, but it must never change, or
 * sketches built by different versions could no longer be merged. */
#define HLL_K0 0x9ae16a3b2f90404fULL
#define HLL_K1 0xc3a5c85c97cb3127ULL


/* ---------------------------------------------------------------- SipHash */

#define ROTL64(x, b) (((x) << (b)) | ((x) >> (64 - (b))))

#define SIPROUND(v0, v1, v2, v3)                                                            \
	do {                                                                                \
		(v0) += (v1);                                                               \
		(v1) = ROTL64((v1), 13);                                                    \
		(v1) ^= (v0);                                                               \
		(v0) = ROTL64((v0), 32);                                                    \
		(v2) += (v3);                                                               \
		(v3) = ROTL64((v3), 16);                                                    \
		(v3) ^= (v2);                                                               \
		(v0) += (v3);                                                               \
		(v3) = ROTL64((v3), 21);                                                    \
		(v3) ^= (v0);                                                               \
		(v2) += (v1);                                                               \
		(v1) = ROTL64((v1), 17);                                                    \
		(v1) ^= (v2);                                                               \
		(v2) = ROTL64((v2), 32);                                                    \
	} while (0)

/* SipHash-c-d of <len> bytes at <data> under the key (<k0>, <k1>). */
static uint64_t siphash(unsigned crounds, unsigned drounds, uint64_t k0, uint64_t k1,
			const void *data, size_t len)
{
	const uint8_t *p = data;
	uint64_t v0 = k0 ^ 0x736f6d6570736575ULL;
	uint64_t v1 = k1 ^ 0x646f72616e646f6dULL;
	uint64_t v2 = k0 ^ 0x6c7967656e657261ULL;
	uint64_t v3 = k1 ^ 0x7465646279746573ULL;
	uint64_t m, b = (uint64_t)len << 56;
	size_t left = len;
	unsigned i;

	for (; left >= 8; left -= 8, p += 8) {
		memcpy(&m, p, 8);
		m = le64toh(m);
		v3 ^= m;
		for (i = 0; i < crounds; i++)
			SIPROUND(v0, v1, v2, v3);
		v0 ^= m;
	}
	for (i = 0; i < left; i++)
		b |= (uint64_t)p[i] << (8 * i);
	v3 ^= b;
	for (i = 0; i < crounds; i++)
		SIPROUND(v0, v1, v2, v3);
	v0 ^= b;
	v2 ^= 0xff;
	for (i = 0; i < drounds; i++)
		SIPROUND(v0, v1, v2, v3);
	return v0 ^ v1 ^ v2 ^ v3;
}

/*
 * Returns SipHash-1-3 of the <len> bytes at <data> under the 128-bit key made
 * of <k0> (key bytes 0-7, little endian) and <k1> (bytes 8-15). Fast and well
 * mixed; with a secret key it also resists hash flooding. Pure function.
 */
uint64_t hll_siphash13(uint64_t k0, uint64_t k1, const void *data, size_t len)
{
	return siphash(1, 3, k0, k1, data, len);
}

/*
 * Returns the SipHash-1-3 of <data> under the project's fixed key: stable
 * across runs and processes (sketches, sharding), not secret.
 */
uint64_t hll_hash(const void *data, size_t len)
{
	return siphash(1, 3, HLL_K0, HLL_K1, data, len);
}

/* ---------------------------------------------------------------- sketch */

/* Returns a new empty sketch (4 KiB), owned by the caller: hll_free() it. */
struct hll *hll_new(void)
{
	return xcalloc(1, sizeof(struct hll));
}

/* Frees <h>; NULL is a no-op. */
void hll_free(struct hll *h)
{
	free(h);
}

/* Forgets everything <h> has seen. */
void hll_clear(struct hll *h)
{
	memset(h->reg, 0, sizeof(h->reg));
}

/*
 * Adds an element given by its 64-bit <hash> (for callers that hash once and
 * feed several structures). The hash must be well mixed in all 64 bits, and
 * the same function must be used for every element of a sketch.
 */
void hll_add_hash(struct hll *h, uint64_t hash)
{
	uint32_t idx = (uint32_t)(hash >> HLL_Q);
	uint64_t rest = hash << HLL_PRECISION;
	uint8_t rank = rest ? (uint8_t)(__builtin_clzll(rest) + 1) : HLL_RANK_MAX;

	if (rank > h->reg[idx])
		h->reg[idx] = rank;
}

/* Adds the element made of the <len> bytes at <data> (copied nowhere). */
void hll_add(struct hll *h, const void *data, size_t len)
{
	hll_add_hash(h, hll_hash(data, len));
}

/*
 * Folds <src> into <dst>: <dst> then estimates the size of the union. Both
 * must have been fed with the same hash function.
 */
void hll_merge(struct hll *dst, const struct hll *src)
{
	size_t i;

	for (i = 0; i < HLL_REGISTERS; i++)
		if (src->reg[i] > dst->reg[i])
			dst->reg[i] = src->reg[i];
}

/* sigma(x) of the DESIGN note, for 0 <= x < 1. */
static double hll_sigma(double x)
{
	double y = 1.0, z = x, prev;

	do {
		x *= x;
		prev = z;
		z += x * y;
		y += y;
	} while (z != prev);
	return z;
}

/* tau(x) of the DESIGN note, for 0 <= x <= 1. */
static double hll_tau(double x)
{
	double y = 1.0, z, prev;

	if (x == 0.0 || x == 1.0)
		return 0.0;
	z = 1.0 - x;
	do {
		x = sqrt(x);
		prev = z;
		y *= 0.5;
		z -= (1.0 - x) * (1.0 - x) * y;
	} while (z != prev);
	return z / 3.0;
}

/*
 * Returns the estimated number of distinct elements added to <h> (0 when
 * empty). Costs one pass over the 4096 registers; meant for scrape time, not
 * for every request.
 */
uint64_t hll_count(const struct hll *h)
{
	const double m = HLL_REGISTERS;
	uint32_t hist[HLL_RANK_MAX + 1] = {0};
	double z;
	size_t i;
	int k;

	for (i = 0; i < HLL_REGISTERS; i += 8) {
		uint64_t w;
		int j;

		/* a sketch of few clients is mostly empty registers: 8 at a time */
		memcpy(&w, &h->reg[i], sizeof(w));
		if (!w) {
			hist[0] += 8;
			continue;
		}
		for (j = 0; j < 8; j++)
			hist[h->reg[i + j]]++;
	}
	if (hist[0] == HLL_REGISTERS)
		return 0;
	z = m * hll_tau(1.0 - hist[HLL_RANK_MAX] / m);
	for (k = HLL_Q; k >= 1; k--)
		z = 0.5 * (z + hist[k]);
	z += m * hll_sigma(hist[0] / m);
	return (uint64_t)llround(m * m / (2.0 * M_LN2 * z));
}
