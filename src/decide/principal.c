/* SPDX-License-Identifier: MIT */
/*
 * Who is asking: the principal of a request (an API key's digest, or its
 * source address masked to a prefix), and the Redis keys of its limits.
 *
 * DESIGN
 * The principal is the API key when one is sent (tier from the `tier`
 * argument, else the default tier) and otherwise the source address, grouped
 * by prefix (IPv4 /32 and IPv6 /64 by default).
 *
 * Redis keys are "<prefix>:v2:{<principal>}" (layout 2: one a principal,
 * holding its limits' states) or "<prefix>:{<principal>}:<limit>" (layout 1,
 * and the sorted sets in both; see limit_key()): the principal part is a
 * fixed-length digest (never the raw API key) or the hex of the masked
 * address, inside a hash tag so all limits of one principal live in one
 * Redis Cluster slot and are decided by one script call. Nothing a client
 * sends can reach outside its own principal part.
 */
#include "principal.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>

#include "agent_int.h"
#include "config.h"
#include "digest.h"
#include "hll.h"
#include "rules.h"
#include "util.h"

/*
 * Slots of the digest cache: an API key (up to DCACHE_KEY bytes) -> the hex of
 * the first 16 bytes of its SHA-256, the Redis key part of its principal, and
 * the fingerprint people see of it (digest.h) under the key <fp_id> names.
 * Direct-mapped by a fast hash of the key, compared byte for byte: a key sent
 * again (the common case) costs a memcmp, not a SHA-256 nor an HMAC; after a
 * secret's rotation, one HMAC per key on its next request.
 */
#define DCACHE_SLOTS 4096
#define DCACHE_KEY   64
struct digest_slot {
	uint8_t len;                    /* 0: empty */
	char key[DCACHE_KEY];
	uint8_t digest[16];
	char hex[33];
	uint8_t fp[FP_LEN];             /* fp_compute(<digest>) under ... */
	uint64_t fp_id;                 /* ... the key of this id */
};

/* <a>'s digest cache created, empty (DCACHE_SLOTS slots). */
void principal_cache_new(struct agent *a)
{
	a->caches.digest = xcalloc(DCACHE_SLOTS, sizeof(struct digest_slot));
}

/* <a>'s digest cache freed (the agent goes). */
void principal_cache_free(struct agent *a)
{
	FREE_AND_NULL(a->caches.digest);
}

/*
 * Writes the key of limit <name><sfx> of <principal> (a candidate policy's limit
 * when <cand>) with parameters <lp> into <k>, truncated like snprintf, in the
 * key layout of <cfg> (lua/state.lua):
 *   layout 1, and the sorted sets (sliding_log, concurrency) in both:
 *     "<prefix>:{<principal>}:[c:]<name><sfx>"
 *   layout 2: "<prefix>:v2:{<principal>}|<flags>#[c:]<name><sfx>"
 * In layout 2 the part before '|' is the principal's key and the rest is the
 * script's flags argument for this limit (shadow 1, read layout 1 where layout
 * 2 holds nothing 2), the field of its state: store_cmd.c sends them apart.
 * The whole string names the limit's state for the local stores (memstore.c).
 */
void limit_key(char *k, size_t cap, const struct agent_config *cfg, const struct limit_params *lp,
	       const char *principal, bool cand, const char *name, const char *sfx)
{
	size_t len = 0;

	k[0] = '\0';
	len = str_cat(k, cap, len, cfg->redis.key_prefix);
	if (cfg->redis.key_layout == 2 && lp->alg != ALG_SLIDING_LOG &&
	    lp->alg != ALG_CONCURRENCY) {
		char flags[4] = {(char)('0' + (lp->shadow ? 1 : 0) +
					(cfg->redis.key_layout_fallback ? 2 : 0)), '#', '\0'};

		len = str_cat(k, cap, len, ":v2:{");
		len = str_cat(k, cap, len, principal);
		len = str_cat(k, cap, len, "}|");
		len = str_cat(k, cap, len, flags);
	} else {
		len = str_cat(k, cap, len, ":{");
		len = str_cat(k, cap, len, principal);
		len = str_cat(k, cap, len, "}:");
	}
	if (cand)
		len = str_cat(k, cap, len, "c:");
	len = str_cat(k, cap, len, name);
	(void)str_cat(k, cap, len, sfx);
}

/*
 * The key part for an anonymous client: its address masked to the prefix.
 * Without an address: "ip:none", and false.
 */
bool principal_ip(const struct ruleset *rs, const struct spop_data *ip, char *out,
		  size_t outlen)
{
	uint8_t addr[16];
	char hex[33];
	unsigned bits, i, len;

	if (ip->type == SPOP_T_IPV4) {
		len = 4;
		bits = rs->cfg->ipv4_prefix;
		memcpy(addr, ip->v.ipv4, 4);
	} else if (ip->type == SPOP_T_IPV6) {
		len = 16;
		bits = rs->cfg->ipv6_prefix;
		memcpy(addr, ip->v.ipv6, 16);
		/* IPv4-mapped addresses are IPv4 clients */
		if (memcmp(addr, "\0\0\0\0\0\0\0\0\0\0\xff\xff", 12) == 0) {
			len = 4;
			bits = rs->cfg->ipv4_prefix;
			memmove(addr, addr + 12, 4);
		}
	} else {
		snprintf(out, outlen, "ip:none");
		return false;
	}
	for (i = 0; i < len; i++) {
		unsigned keep = bits >= 8 * (i + 1) ? 8 : (bits > 8 * i ? bits - 8 * i : 0);

		addr[i] &= (uint8_t)(0xff00 >> keep);
	}
	hex_encode(addr, len, hex);
	snprintf(out, outlen, "ip%u:%s/%u", len == 4 ? 4 : 6, hex, bits);
	return true;
}

/* The printable address prefix of an anonymous client, for top offenders. */
void client_ip(const struct ruleset *rs, const struct spop_data *ip, char *out,
	       size_t outlen)
{
	char host[INET6_ADDRSTRLEN];
	uint8_t addr[16] = {0};
	unsigned bits, i, len;
	int af;

	if (ip->type == SPOP_T_IPV4) {
		af = AF_INET;
		len = 4;
		bits = rs->cfg->ipv4_prefix;
		memcpy(addr, ip->v.ipv4, 4);
	} else if (ip->type == SPOP_T_IPV6) {
		af = AF_INET6;
		len = 16;
		bits = rs->cfg->ipv6_prefix;
		memcpy(addr, ip->v.ipv6, 16);
	} else {
		snprintf(out, outlen, "none");
		return;
	}
	for (i = 0; i < len; i++) {
		unsigned keep = bits >= 8 * (i + 1) ? 8 : (bits > 8 * i ? bits - 8 * i : 0);

		addr[i] &= (uint8_t)(0xff00 >> keep);
	}
	inet_ntop(af, addr, host, sizeof(host));
	snprintf(out, outlen, "%s/%u", host, bits);
}

/* The source address of <d> as bytes: 4 or 16 of them, or 0 without one. */
size_t ip_bytes(const struct spop_data *ip, const uint8_t **b)
{
	*b = ip->type == SPOP_T_IPV4 ? ip->v.ipv4 : ip->v.ipv6;
	return ip->type == SPOP_T_IPV4 ? 4 : ip->type == SPOP_T_IPV6 ? 16 : 0;
}

/*
 * The Redis key part of API key <key>: "k:" and the hex of the first 16 bytes
 * of its SHA-256 (fixed length, whatever the key holds) into d->principal, the
 * digest into d->digest, its fingerprint under the ruleset's key into d->fp.
 * The Redis key part is the same on every gateway whatever the secret.
 */
void principal_key(struct decision *d, const char *key, size_t key_len)
{
	const struct fp_key *fk = &d->rs->cfg->fp;
	struct digest_slot one, *ds = &one;
	uint8_t md[SHA256_LEN];

	if (key_len && key_len <= DCACHE_KEY)
		ds = &d->a->caches.digest[hll_hash(key, key_len) % DCACHE_SLOTS];
	if (ds == &one || ds->len != key_len || memcmp(ds->key, key, key_len) != 0) {
		sha256(key, key_len, md);
		memcpy(ds->digest, md, sizeof(ds->digest));
		hex_encode(md, 16, ds->hex);
		fp_compute(fk, ds->digest, ds->fp);
		ds->fp_id = fk->id;
		if (ds != &one) {
			ds->len = (uint8_t)key_len;
			memcpy(ds->key, key, key_len);
		}
	}
	if (ds->fp_id != fk->id) {
		fp_compute(fk, ds->digest, ds->fp);
		ds->fp_id = fk->id;
	}
	memcpy(d->digest, ds->digest, sizeof(d->digest));
	memcpy(d->fp, ds->fp, sizeof(d->fp));
	memcpy(d->principal, "k:", 2);
	memcpy(d->principal + 2, ds->hex, sizeof(ds->hex));
}
