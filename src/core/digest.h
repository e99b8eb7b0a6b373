/* SPDX-License-Identifier: MIT */
/*
 * SHA-256 (FIPS 180-4), used to turn client identities (API keys) into
 * fixed-length, non-reversible Redis key parts, and HMAC-SHA256 (RFC 2104)
 * for the fingerprints of those digests shown to people (fp_*()).
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

/*
 * A key's fingerprint, what people see of an API key (/top, the status page,
 * /overrides, logs, ctl): the first FP_LEN bytes of HMAC-SHA256(secret, the
 * key's 16-byte digest), written "fp:" and 2 * FP_LEN hex digits. Without the
 * fleet's secret a guessed key cannot be confirmed from it. The key holds the
 * HMAC's inner and outer states with the secret already absorbed: a
 * fingerprint costs two SHA-256 compressions.
 */
#define FP_LEN     8                    /* bytes of a fingerprint: 64 bits */
#define FP_STR_LEN (3 + 2 * FP_LEN)     /* "fp:" and its hex digits */

struct fp_key {
	struct sha256 inner;    /* after the secret XOR ipad */
	struct sha256 outer;    /* after the secret XOR opad */
	uint64_t id;            /* tells keys apart (not secret): cached fingerprints of
				 * another key are stale */
};

void fp_key_init(struct fp_key *key, const void *secret, size_t len);
void fp_compute(const struct fp_key *key, const uint8_t digest[16], uint8_t out[FP_LEN]);
void fp_format(const uint8_t fp[FP_LEN], char out[FP_STR_LEN + 1]);

#endif /* AGENT_DIGEST_H */
