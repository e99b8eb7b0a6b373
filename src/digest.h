/* SPDX-License-Identifier: MIT */
/*
 * SHA-256 (FIPS 180-4), used to turn client identities (API keys) into
 * fixed-length, non-reversible Redis key parts. Not for anything secret.
 */
#ifndef AGENT_DIGEST_H
#define AGENT_DIGEST_H

#include <stddef.h>
#include <stdint.h>

#define SHA256_LEN 32

struct sha256 {
	uint32_t h[8];          /* chaining state */
	uint64_t total;         /* bytes hashed */
	uint8_t block[64];      /* partial block */
	size_t fill;            /* bytes in block */
};

void sha256_init(struct sha256 *s);
void sha256_update(struct sha256 *s, const void *data, size_t len);
void sha256_final(struct sha256 *s, uint8_t out[SHA256_LEN]);
void sha256(const void *data, size_t len, uint8_t out[SHA256_LEN]);

#endif /* AGENT_DIGEST_H */
