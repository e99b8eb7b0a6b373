/* SPDX-License-Identifier: MIT */
/*
 * CRC16 as Redis Cluster uses it to place keys in its 16384 hash slots
 * (CRC-16/XMODEM: polynomial 0x1021, initial value 0, no reflection, no final
 * xor; check value: "123456789" -> 0x31C3), and the slot of a key with the
 * hash-tag rule. Header-only: it has a single user, the store, and the
 * integration tests compile it into a small checker.
 *
 * Not for anything else: this is no checksum for data integrity.
 */
#ifndef AGENT_CRC16_H
#define AGENT_CRC16_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define CRC16_SLOTS 16384       /* Redis Cluster hash slots */

/*
 * CRC-16/XMODEM of <len> bytes at <buf>, four bits at a time: entry i of the
 * table is what the polynomial makes of the nibble i shifted in at the top
 * (four rounds of the bitwise algorithm), so two lookups stand for eight
 * rounds. Every cluster decision hashes its key.
 */
static inline uint16_t crc16_xmodem(const void *buf, size_t len)
{
	static const uint16_t nib[16] = {
		0x0000, 0x1021, 0x2042, 0x3063, 0x4084, 0x50a5, 0x60c6, 0x70e7,
		0x8108, 0x9129, 0xa14a, 0xb16b, 0xc18c, 0xd1ad, 0xe1ce, 0xf1ef,
	};
	const uint8_t *p = buf;
	uint16_t crc = 0;

	while (len--) {
		crc ^= (uint16_t)(*p++ << 8);
		crc = (uint16_t)((crc << 4) ^ nib[crc >> 12]);
		crc = (uint16_t)((crc << 4) ^ nib[crc >> 12]);
	}
	return crc;
}

/*
 * The Redis Cluster slot of the key <key> of <len> bytes. When the key holds a
 * '{' followed later by a '}' with at least one byte between them, only those
 * bytes (the hash tag: from the first '{' to the first '}' after it) are
 * hashed; otherwise the whole key is.
 */
static inline unsigned crc16_key_slot(const char *key, size_t len)
{
	const char *open = memchr(key, '{', len);

	if (open) {
		size_t rest = len - (size_t)(open + 1 - key);
		const char *close = memchr(open + 1, '}', rest);

		if (close && close > open + 1) {
			key = open + 1;
			len = (size_t)(close - key);
		}
	}
	return crc16_xmodem(key, len) & (CRC16_SLOTS - 1);
}

#endif /* AGENT_CRC16_H */
