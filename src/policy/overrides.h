/* SPDX-License-Identifier: MIT */
/*
 * Live overrides: blocks and limit changes an operator sets during an
 * incident, on every gateway at once, without a reload.
 *
 * They live in one Redis hash, "<prefix>:{ovr}:overrides": one field per
 * entry, "block:<target>" or "limit:<target>", whose value says until when,
 * why, by whom and (limits) how; the field "version" is bumped by every
 * change. Each agent polls the version (one HGET every overrides.poll) and
 * reads the whole hash (HGETALL) only when it changed, into a table in
 * memory: a request pays a few hash probes, never a Redis call.
 *
 * Everything read from Redis is distrusted: an entry that does not parse is
 * logged and skipped, strings are bounded and printable, and the table holds
 * at most overrides.max_entries entries.
 *
 * Targets: "fp:<16 hex>" is an API key by its keyed fingerprint (digest.h,
 * what /top shows: the agents match it against the fingerprint of each
 * request's key under the fleet's secret); "k:<hex>" an API key by the first 8
 * to 32 hex digits of its digest (`ctl block key:<raw>` writes all 32: such a
 * block does not depend on the secret; shorter ones are the fingerprints of
 * earlier versions, still matched); "ip:<addr>[/<bits>]" an IPv4 or IPv6
 * address or prefix. What is shown of a key target to people is never its
 * digest: a whole one is shown as its fingerprint (ovr_target_show()).
 */
#ifndef AGENT_OVERRIDES_H
#define AGENT_OVERRIDES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "compiler.h"

struct ev_loop;
struct fp_key;
struct http_reply;
struct store;
struct overrides;

enum ovr_kind {
	OVR_BLOCK = 0,          /* deny every request, before any script call */
	OVR_LIMIT = 1,          /* decide with other limit parameters */
	OVR_KIND_COUNT          /* sentinel */
};

enum ovr_type {
	OVR_T_KEY = 0,          /* an API key, by a prefix of its digest */
	OVR_T_IP4 = 1,          /* an IPv4 prefix */
	OVR_T_IP6 = 2,          /* an IPv6 prefix */
	OVR_T_FP  = 3,          /* an API key, by its keyed fingerprint (FP_LEN bytes) */
	OVR_T_COUNT             /* sentinel */
};

#define OVR_FIELD_MAX   128     /* longest field accepted */
#define OVR_VALUE_MAX   1024    /* longest value accepted */
#define OVR_BY_MAX      64      /* "by=" bytes kept */
#define OVR_REASON_MAX  200     /* "reason=" bytes kept */
#define OVR_RATES_MAX   4       /* "rate.<limit>=" settings per entry */
#define OVR_NAME_MAX    64      /* a limit name (as in the configuration) */
#define OVR_FACTOR_MAX  1000.0  /* factors within [1/OVR_FACTOR_MAX, OVR_FACTOR_MAX] */
#define OVR_RATE_MAX    (UINT64_C(1) << 40) /* largest explicit or scaled rate */

/* What an entry applies to. */
struct ovr_target {
	uint8_t type;           /* enum ovr_type */
	uint8_t bits;           /* prefix length: digest bits (32..128, by 4), address
				 * bits, or 8 * FP_LEN (a fingerprint, whole) */
	uint8_t b[16];          /* digest or address; bits beyond <bits> are zero */
};

/* One override, as parsed from a field and its value. */
struct ovr_entry {
	uint8_t kind;           /* enum ovr_kind */
	struct ovr_target t;
	int64_t until;          /* Unix seconds: in force while now < until */
	int64_t created;        /* Unix seconds, 0 when not given */
	unsigned status;        /* block: HTTP status, 0 = overrides.block_status */
	double factor;          /* limit: every rate and burst times this, 0 = none */
	size_t nrates;          /* limit: explicit rates below */
	struct {
		char name[OVR_NAME_MAX + 1];
		uint64_t rate;
	} rates[OVR_RATES_MAX];
	char by[OVR_BY_MAX + 1];
	char reason[OVR_REASON_MAX + 1];
	uint64_t vhash;         /* of the stored value, to tell changes apart */
	bool expired;           /* its expiry was logged */
};

/* Settings (overrides.* in the configuration). */
struct ovr_opts {
	const char *key_prefix; /* redis.key_prefix (copied) */
	unsigned poll_ms;       /* version check period */
	unsigned max_entries;   /* entries kept; beyond, skipped and logged */
	unsigned block_status;  /* status of a block without its own */
	const struct fp_key *fp; /* the fingerprints' key (copied) */
};

/* Counters, for the metrics. */
struct ovr_stats {
	uint64_t polls;         /* version checks sent */
	uint64_t poll_errors;   /* ... and loads that failed */
	uint64_t loads;         /* whole-table loads applied */
	uint64_t skipped;       /* entries skipped (bad, or over the cap), all loads */
	uint64_t entries;       /* entries in force now (gauge) */
};

/* ---- parsing and formatting (shared with the ctl command) ---- */
int ovr_target_parse(const char *s, size_t len, struct ovr_target *t, char *err,
		     size_t errlen) MUSTCHECK;
void ovr_target_format(const struct ovr_target *t, char *buf, size_t len);
void ovr_target_show(const struct ovr_target *t, const struct fp_key *k, char *buf, size_t len);
bool ovr_target_same_key(const struct ovr_target *a, const struct ovr_target *b,
			 const struct fp_key *k);
int ovr_field_parse(const char *s, size_t len, struct ovr_entry *e, char *err,
		    size_t errlen) MUSTCHECK;
void ovr_field_format(const struct ovr_entry *e, char *buf, size_t len);
int ovr_value_parse(const char *s, size_t len, struct ovr_entry *e, char *err,
		    size_t errlen) MUSTCHECK;
void ovr_describe(const struct ovr_entry *e, char *buf, size_t len);
void ovr_hash_key(const char *prefix, char *buf, size_t len);
bool ovr_adjust(const struct ovr_entry *e, const char *limit, uint64_t rate, uint64_t burst,
		uint64_t *nrate, uint64_t *nburst);

/* ---- the table each agent keeps ---- */
struct overrides *ovr_new(struct ev_loop *loop, struct store *st, const struct ovr_opts *o,
			  void (*wake)(void *arg), void *arg);
void ovr_configure(struct overrides *ov, const struct ovr_opts *o);
void ovr_free(struct overrides *ov);
bool ovr_settled(const struct overrides *ov);
void ovr_kick(struct overrides *ov);
size_t ovr_count(const struct overrides *ov);
const struct ovr_entry *ovr_match_prefix(const struct overrides *ov, const struct ovr_target *t,
					 int64_t now);
const struct ovr_entry *ovr_match_key(const struct overrides *ov, int kind,
				      const uint8_t digest[16], const uint8_t *fp, int64_t now);
const struct ovr_entry *ovr_match_addr(const struct overrides *ov, int kind, const uint8_t *addr,
				       size_t len, int64_t now);
unsigned ovr_block_status(const struct overrides *ov, const struct ovr_entry *e);
const struct ovr_stats *ovr_stats(const struct overrides *ov);
void ovr_render(const struct overrides *ov, struct http_reply *r);

#endif /* AGENT_OVERRIDES_H */
