/* SPDX-License-Identifier: MIT */
/*
 * Live overrides (see overrides.h).
 *
 * DESIGN
 * Propagation is a poll: every overrides.poll (250 ms) one HGET of the
 * hash's "version" field, and an HGETALL only when it changed. A change
 * reaches every agent within one period plus two round trips. Pub/sub would
 * need a connection of its own per agent and per node, and it loses what is
 * published while that connection is down, so a poll would still be needed
 * after every reconnection; the poll alone bounds staleness whatever happens
 * and costs Redis one small command per agent per period.
 *
 * The table is rebuilt from scratch on every load and swapped in; nothing
 * outside this file keeps a pointer into it across a callback. Entries are
 * found by exact match of (kind, type, prefix length, masked bytes) in an open
 * addressing index; a lookup tries each prefix length present in the table,
 * longest first, so a request pays one probe per distinct length in use (none
 * when the table is empty).
 *
 * Every change an agent applies is logged as an audit line: what, until
 * when, by whom and why; so is every entry it skips, and every expiry.
 *
 * Fingerprints. A request's key is matched by its digest (k: targets) and by
 * its fingerprint under the fleet's secret (fp: targets), both computed once
 * per key and cached with it (principal.c): two more probes at most. For the
 * status page, which knows a top offender by its fingerprint only, the
 * entries on a whole digest (`ctl block key:<raw>`) are also indexed by their
 * fingerprint under the current key (tab->kfp), rebuilt when the key changes.
 */
#include "overrides.h"

#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <ev.h>

#include "digest.h"
#include "hll.h"
#include "http.h"
#include "list.h"
#include "log.h"
#include "spop.h"
#include "store.h"
#include "util.h"

#define OVR_ERR_LOG_S   10.0    /* poll errors: one log line per period at most */
#define OVR_START_S     0.02    /* poll period until the first load settled */
#define OVR_BACKOFF_MAX 30.0    /* longest pause after error replies (seconds) */

/* The entries in force and their index. */
struct ovr_table {
	struct ovr_entry *e;            /* owned: n entries */
	size_t n;
	uint32_t *idx;                  /* owned: mask + 1 slots, entry index + 1, 0 = free */
	size_t mask;
	uint64_t lens[OVR_KIND_COUNT][OVR_T_COUNT][3]; /* prefix lengths present (bit = length) */
	uint32_t *sorted[OVR_T_COUNT];  /* owned: entry indexes of a type by first 64 bits */
	uint64_t *keys[OVR_T_COUNT];    /* owned: ... and those first 64 bits, in that order */
	size_t nsorted[OVR_T_COUNT];
	uint64_t *kfp;                  /* owned: fingerprints of the whole-digest key entries, */
	uint32_t *kfp_idx;              /* owned: ... sorted, and their entry indexes */
	size_t nkfp;
};

struct overrides {
	struct ev_loop *loop;           /* ref */
	struct store *st;               /* ref: owned by the agent, freed before us */
	char key[STORE_KEY_MAX];        /* the hash */
	unsigned poll_ms;
	unsigned max_entries;
	unsigned block_status;
	struct ovr_table tab;
	struct fp_key fp;               /* the fingerprints' key */
	bool have_version;              /* a load succeeded: <version> is valid */
	bool version_set;               /* ... and the hash had a version field */
	uint64_t version;               /* hash of that field's value */
	bool busy;                      /* a command in flight (its callback owes us) */
	bool settled;                   /* the first load was tried (or Redis was) */
	void (*wake)(void *arg);        /* decisions waiting for that, to go on */
	void *wake_arg;
	ev_timer poll;
	struct ovr_stats stats;
	double backoff;                 /* pause after an error reply, doubling (0: none) */
	double next_at;                 /* mono() before which no poll is sent */
	double err_at;                  /* mono() of the last error logged */
	uint64_t err_quiet;             /* errors not logged since */
};

/* ---- parsing ----------------------------------------------------------- */

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Zeroes the bits of <b> (<len> bytes) beyond the first <bits>. */
static void mask_bits(uint8_t *b, size_t len, unsigned bits)
{
	size_t i;

	for (i = 0; i < len; i++) {
		unsigned keep = bits >= 8 * (i + 1) ? 8 : (bits > 8 * i ? bits - 8 * i : 0);

		b[i] &= (uint8_t)(0xff00 >> keep);
	}
}

/*
 * Parses target <s> (<len> bytes, not NUL-terminated): "k:" and 8 to 32 hex
 * digits, or "ip:" and an IPv4/IPv6 address with an optional "/<bits>" (host
 * bits are cleared; an IPv4-mapped IPv6 prefix of at least 96 bits is IPv4).
 * Returns 0, or -1 with a message in <err>.
 */
int ovr_target_parse(const char *s, size_t len, struct ovr_target *t, char *err, size_t errlen)
{
	char buf[OVR_FIELD_MAX + 1];
	size_t i;

	memset(t, 0, sizeof(*t));
	if (len > OVR_FIELD_MAX) {
		snprintf(err, errlen, "target longer than %d bytes", OVR_FIELD_MAX);
		return -1;
	}
	memcpy(buf, s, len);
	buf[len] = 0;
	if (strlen(buf) != len) {
		snprintf(err, errlen, "target holds a NUL byte");
		return -1;
	}
	if (strncmp(buf, "fp:", 3) == 0) {
		if (len - 3 != 2 * FP_LEN) {
			snprintf(err, errlen, "a fingerprint target is fp: and %d hex digits",
				 2 * FP_LEN);
			return -1;
		}
		for (i = 0; i < 2 * FP_LEN; i++) {
			int v = hexval(buf[3 + i]);

			if (v < 0) {
				snprintf(err, errlen, "'%c' is not a hex digit", buf[3 + i]);
				return -1;
			}
			t->b[i / 2] |= (uint8_t)(i % 2 ? v : v << 4);
		}
		t->type = OVR_T_FP;
		t->bits = 8 * FP_LEN;
		return 0;
	}
	if (strncmp(buf, "k:", 2) == 0) {
		size_t n = len - 2;

		if (n < 8 || n > 32) {
			snprintf(err, errlen, "a key target is k: and 8 to 32 hex digits of its digest");
			return -1;
		}
		for (i = 0; i < n; i++) {
			int v = hexval(buf[2 + i]);

			if (v < 0) {
				snprintf(err, errlen, "'%c' is not a hex digit", buf[2 + i]);
				return -1;
			}
			t->b[i / 2] |= (uint8_t)(i % 2 ? v : v << 4);
		}
		t->type = OVR_T_KEY;
		t->bits = (uint8_t)(4 * n);
		return 0;
	}
	if (strncmp(buf, "ip:", 3) == 0) {
		char *addr = buf + 3, *slash = strchr(addr, '/');
		long bits = -1;

		if (slash) {
			char *end;

			*slash = 0;
			errno = 0;
			bits = strtol(slash + 1, &end, 10);
			if (!slash[1] || *end || errno || bits < 0 || bits > 128 || slash[1] == '+' ||
			    slash[1] == '-' || slash[1] == ' ') {
				snprintf(err, errlen, "bad prefix length '%s'", slash + 1);
				return -1;
			}
		}
		if (inet_pton(AF_INET, addr, t->b) == 1) {
			if (bits > 32) {
				snprintf(err, errlen, "an IPv4 prefix has at most 32 bits");
				return -1;
			}
			t->type = OVR_T_IP4;
			t->bits = (uint8_t)(bits < 0 ? 32 : bits);
		} else if (inet_pton(AF_INET6, addr, t->b) == 1) {
			t->type = OVR_T_IP6;
			t->bits = (uint8_t)(bits < 0 ? 128 : bits);
			if (memcmp(t->b, "\0\0\0\0\0\0\0\0\0\0\xff\xff", 12) == 0 && t->bits >= 96) {
				memmove(t->b, t->b + 12, 4);
				memset(t->b + 4, 0, 12);
				t->type = OVR_T_IP4;
				t->bits = (uint8_t)(t->bits - 96);
			}
		} else {
			snprintf(err, errlen, "'%s' is not an IPv4 or IPv6 address", addr);
			return -1;
		}
		mask_bits(t->b, 16, t->bits);
		return 0;
	}
	snprintf(err, errlen, "a target is fp:<fingerprint>, k:<hex digest> or "
			      "ip:<address>[/<bits>]");
	return -1;
}

/*
 * Writes the canonical form of <t> ("fp:<hex>", "k:<hex>", "ip:<addr>/<bits>")
 * to <buf>: the stored form, not for people (see ovr_target_show()).
 */
void ovr_target_format(const struct ovr_target *t, char *buf, size_t len)
{
	char host[INET6_ADDRSTRLEN];

	if (t->type == OVR_T_FP) {
		char fs[FP_STR_LEN + 1];

		fp_format(t->b, fs);
		snprintf(buf, len, "%s", fs);
		return;
	}

	if (t->type == OVR_T_KEY) {
		char hex[33];
		unsigned i;

		for (i = 0; i < t->bits / 4u && i < 32; i++)
			hex[i] = "0123456789abcdef"[i % 2 ? t->b[i / 2] & 15 : t->b[i / 2] >> 4];
		hex[i] = 0;
		snprintf(buf, len, "k:%s", hex);
		return;
	}
	inet_ntop(t->type == OVR_T_IP4 ? AF_INET : AF_INET6, t->b, host, sizeof(host));
	snprintf(buf, len, "ip:%s/%u", host, t->bits);
}

/*
 * Writes <t> as people may see it (/overrides, logs, ctl): a whole digest (a
 * block by raw key) as its fingerprint under <k>, "key:*" without a key (ctl
 * without the fleet's secret); anything else as ovr_target_format(). A
 * shorter digest prefix is shown as stored: it came from an earlier /top.
 */
void ovr_target_show(const struct ovr_target *t, const struct fp_key *k, char *buf, size_t len)
{
	uint8_t fp[FP_LEN];
	char fs[FP_STR_LEN + 1];

	if (t->type != OVR_T_KEY || t->bits != 128) {
		ovr_target_format(t, buf, len);
		return;
	}
	if (!k) {
		snprintf(buf, len, "key:*");
		return;
	}
	fp_compute(k, t->b, fp);
	fp_format(fp, fs);
	snprintf(buf, len, "%s", fs);
}

/*
 * Whether <a> and <b> name the same target, or (<k> not NULL) one is a
 * fingerprint and the other a whole digest whose fingerprint under <k> it is.
 */
bool ovr_target_same_key(const struct ovr_target *a, const struct ovr_target *b,
			 const struct fp_key *k)
{
	uint8_t fp[FP_LEN];

	if (a->type == b->type)
		return a->bits == b->bits && memcmp(a->b, b->b, 16) == 0;
	if (!k)
		return false;
	if (a->type == OVR_T_FP && b->type == OVR_T_KEY) {
		const struct ovr_target *x = a;

		a = b;
		b = x;
	}
	if (a->type != OVR_T_KEY || a->bits != 128 || b->type != OVR_T_FP)
		return false;
	fp_compute(k, a->b, fp);
	return memcmp(fp, b->b, FP_LEN) == 0;
}

static const char *const kind_names[OVR_KIND_COUNT] = {"block", "limit"};

/* Parses field <s>: "block:<target>" or "limit:<target>" into <e>'s kind and target. */
int ovr_field_parse(const char *s, size_t len, struct ovr_entry *e, char *err, size_t errlen)
{
	int k;

	for (k = 0; k < OVR_KIND_COUNT; k++) {
		size_t kl = strlen(kind_names[k]);

		if (len > kl && memcmp(s, kind_names[k], kl) == 0 && s[kl] == ':') {
			e->kind = (uint8_t)k;
			return ovr_target_parse(s + kl + 1, len - kl - 1, &e->t, err, errlen);
		}
	}
	snprintf(err, errlen, "a field is block:<target> or limit:<target>");
	return -1;
}

/* Writes <e>'s field ("block:k:...") to <buf>. */
void ovr_field_format(const struct ovr_entry *e, char *buf, size_t len)
{
	char t[OVR_FIELD_MAX];

	ovr_target_format(&e->t, t, sizeof(t));
	snprintf(buf, len, "%s:%s", kind_names[e->kind < OVR_KIND_COUNT ? e->kind : 0], t);
}

/* Reads a decimal integer in [lo, hi] from the whole of <s>. */
static bool parse_i64(const char *s, int64_t lo, int64_t hi, int64_t *out)
{
	long long v;
	char *end;

	if (*s < '0' || *s > '9')
		return false;
	errno = 0;
	v = strtoll(s, &end, 10);
	if (*end || errno || v < lo || v > hi)
		return false;
	*out = v;
	return true;
}

static bool is_name_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '_' || c == '.' || c == '-';
}

/*
 * Setting <name>=<tok> of an entry's value into <e> (ovr_value_parse()).
 * Returns 0, or -1 with a message in <err>.
 */
static int value_setting(struct ovr_entry *e, const char *name, const char *tok, char *err,
			 size_t errlen)
{
	int64_t v;
	size_t i;

	if (strcmp(name, "until") == 0) {
		if (!parse_i64(tok, 1, INT64_C(1) << 40, &e->until))
			goto bad;
	} else if (strcmp(name, "created") == 0) {
		if (!parse_i64(tok, 0, INT64_C(1) << 40, &e->created))
			goto bad;
	} else if (strcmp(name, "by") == 0) {
		if (strlen(tok) > OVR_BY_MAX || !*tok)
			goto bad;
		snprintf(e->by, sizeof(e->by), "%s", tok);
	} else if (strcmp(name, "status") == 0 && e->kind == OVR_BLOCK) {
		if (!parse_i64(tok, 400, 599, &v))
			goto bad;
		e->status = (unsigned)v;
	} else if (strcmp(name, "factor") == 0 && e->kind == OVR_LIMIT) {
		char *end;
		double f;

		errno = 0;
		f = strtod(tok, &end);
		if (*tok < '0' || *tok > '9' || *end || errno || !isfinite(f) ||
		    f < 1 / OVR_FACTOR_MAX || f > OVR_FACTOR_MAX)
			goto bad;
		e->factor = f;
	} else if (strncmp(name, "rate.", 5) == 0 && e->kind == OVR_LIMIT) {
		const char *ln = name + 5;

		if (!*ln || strlen(ln) > OVR_NAME_MAX)
			goto bad;
		for (i = 0; ln[i]; i++)
			if (!is_name_char(ln[i]))
				goto bad;
		for (i = 0; i < e->nrates; i++)
			if (strcmp(e->rates[i].name, ln) == 0)
				goto bad;
		if (e->nrates == OVR_RATES_MAX) {
			snprintf(err, errlen, "more than %d rate settings", OVR_RATES_MAX);
			return -1;
		}
		if (!parse_i64(tok, 1, (int64_t)OVR_RATE_MAX, &v))
			goto bad;
		snprintf(e->rates[e->nrates].name, sizeof(e->rates[0].name), "%s", ln);
		e->rates[e->nrates++].rate = (uint64_t)v;
	} else {
		snprintf(err, errlen, "unknown setting '%.40s' for a %s", name,
			 kind_names[e->kind < OVR_KIND_COUNT ? e->kind : 0]);
		return -1;
	}
	return 0;
bad:
	snprintf(err, errlen, "bad value for '%.40s': '%.40s'", name, tok);
	return -1;
}

/*
 * Parses value <s> of an entry whose kind and target are set: space-separated
 * "name=value" settings, "reason=" last and taking the rest of the value.
 *   until=<unix s> (required)  created=<unix s>  by=<who>  reason=<text>
 *   block: status=<400..599>
 *   limit: factor=<decimal>  rate.<limit>=<integer> (at least one of them)
 * Printable ASCII only; unknown settings are errors (a newer writer's meaning
 * is never half applied). Returns 0, or -1 with a message in <err>.
 */
int ovr_value_parse(const char *s, size_t len, struct ovr_entry *e, char *err, size_t errlen)
{
	char buf[OVR_VALUE_MAX + 1], *p, *tok;
	size_t i;

	e->until = e->created = 0;
	e->status = 0;
	e->factor = 0;
	e->nrates = 0;
	e->by[0] = e->reason[0] = 0;
	e->expired = false;
	if (len > OVR_VALUE_MAX) {
		snprintf(err, errlen, "value longer than %d bytes", OVR_VALUE_MAX);
		return -1;
	}
	for (i = 0; i < len; i++) {
		if ((unsigned char)s[i] < 0x20 || (unsigned char)s[i] > 0x7e) {
			snprintf(err, errlen, "value holds a byte that is not printable ASCII");
			return -1;
		}
	}
	memcpy(buf, s, len);
	buf[len] = 0;
	e->vhash = hll_hash(s, len);
	for (p = buf; *p;) {
		char *eq, *name;

		while (*p == ' ')
			p++;
		if (!*p)
			break;
		if (strncmp(p, "reason=", 7) == 0) {
			size_t rl = strlen(p + 7);

			while (rl && p[7 + rl - 1] == ' ')
				rl--;
			if (rl > OVR_REASON_MAX) {
				snprintf(err, errlen, "reason longer than %d bytes", OVR_REASON_MAX);
				return -1;
			}
			memcpy(e->reason, p + 7, rl);
			e->reason[rl] = 0;
			break;
		}
		tok = p;
		while (*p && *p != ' ')
			p++;
		if (*p)
			*p++ = 0;
		eq = strchr(tok, '=');
		if (!eq || eq == tok) {
			snprintf(err, errlen, "'%.40s' is not name=value", tok);
			return -1;
		}
		*eq = 0;
		name = tok;
		tok = eq + 1;
		if (value_setting(e, name, tok, err, errlen) < 0)
			return -1;
	}
	if (!e->until) {
		snprintf(err, errlen, "no until=<unix seconds>");
		return -1;
	}
	if (e->kind == OVR_LIMIT && !e->factor && !e->nrates) {
		snprintf(err, errlen, "a limit needs factor=<x> or rate.<limit>=<n>");
		return -1;
	}
	return 0;
}

/* What <e> does, in words: "block (status 403)", "limit x10 free_rpm=100". */
void ovr_describe(const struct ovr_entry *e, char *buf, size_t len)
{
	size_t used, i;

	if (e->kind == OVR_BLOCK) {
		if (e->status)
			snprintf(buf, len, "block (status %u)", e->status);
		else
			snprintf(buf, len, "block");
		return;
	}
	used = (size_t)snprintf(buf, len, "limit");
	if (e->factor && used < len)
		used += (size_t)snprintf(buf + used, len - used, " x%g", e->factor);
	for (i = 0; i < e->nrates && used < len; i++)
		used += (size_t)snprintf(buf + used, len - used, " %s=%llu", e->rates[i].name,
					 (unsigned long long)e->rates[i].rate);
}

/* The name of the overrides hash for key prefix <prefix>. */
void ovr_hash_key(const char *prefix, char *buf, size_t len)
{
	snprintf(buf, len, "%s:{ovr}:overrides", prefix);
}

static uint64_t clamp_rate(double v)
{
	if (!(v >= 1))
		return 1;
	if (v >= (double)OVR_RATE_MAX)
		return OVR_RATE_MAX;
	return (uint64_t)llround(v);
}

/*
 * The rate and burst limit <limit> (configured <rate>, <burst>) has under
 * limit override <e>: an explicit rate.<limit> (the burst keeps its ratio to
 * the rate), else the factor applied to both. Returns false (and the values
 * unchanged) when <e> does not change that limit.
 */
bool ovr_adjust(const struct ovr_entry *e, const char *limit, uint64_t rate, uint64_t burst,
		uint64_t *nrate, uint64_t *nburst)
{
	double f = e->factor;
	size_t i;

	*nrate = rate;
	*nburst = burst;
	if (e->kind != OVR_LIMIT || !rate)
		return false;
	for (i = 0; i < e->nrates; i++) {
		if (strcmp(e->rates[i].name, limit) == 0) {
			f = (double)e->rates[i].rate / (double)rate;
			*nrate = e->rates[i].rate;
			*nburst = clamp_rate((double)burst * f);
			return true;
		}
	}
	if (!f)
		return false;
	*nrate = clamp_rate((double)rate * f);
	*nburst = clamp_rate((double)burst * f);
	return true;
}

/* ---- the table ----------------------------------------------------------- */

static uint64_t slot_hash(uint8_t kind, const struct ovr_target *t)
{
	uint8_t k[3 + 16];

	k[0] = kind;
	k[1] = t->type;
	k[2] = t->bits;
	memcpy(k + 3, t->b, 16);
	return hll_hash(k, sizeof(k));
}

static bool same_target(const struct ovr_entry *e, uint8_t kind, const struct ovr_target *t)
{
	return e->kind == kind && e->t.type == t->type && e->t.bits == t->bits &&
	       memcmp(e->t.b, t->b, 16) == 0;
}

/* The entry of <tab> for exactly (<kind>, <t>), or NULL. */
static struct ovr_entry *table_find(const struct ovr_table *tab, uint8_t kind,
				    const struct ovr_target *t)
{
	size_t i;

	if (!tab->n)
		return NULL;
	for (i = slot_hash(kind, t) & tab->mask; tab->idx[i]; i = (i + 1) & tab->mask) {
		struct ovr_entry *e = &tab->e[tab->idx[i] - 1];

		if (same_target(e, kind, t))
			return e;
	}
	return NULL;
}

/* Allocates <tab> for up to <cap> entries. */
static void table_init(struct ovr_table *tab, size_t cap)
{
	size_t slots = 16;

	memset(tab, 0, sizeof(*tab));
	while (slots < 2 * cap)
		slots *= 2;
	tab->e = xcalloc(cap ? cap : 1, sizeof(*tab->e));
	tab->idx = xcalloc(slots, sizeof(*tab->idx));
	tab->mask = slots - 1;
}

/* Adds a copy of <e> (its target not in <tab> yet; room left). */
static void table_add(struct ovr_table *tab, const struct ovr_entry *e)
{
	size_t i;

	for (i = slot_hash(e->kind, &e->t) & tab->mask; tab->idx[i]; i = (i + 1) & tab->mask)
		;
	tab->e[tab->n] = *e;
	tab->idx[i] = (uint32_t)++tab->n;
	tab->lens[e->kind][e->t.type][e->t.bits / 64] |= UINT64_C(1) << (e->t.bits % 64);
}

static void table_release(struct ovr_table *tab)
{
	size_t t;

	for (t = 0; t < OVR_T_COUNT; t++) {
		free(tab->sorted[t]);
		free(tab->keys[t]);
	}
	free(tab->kfp);
	free(tab->kfp_idx);
	free(tab->e);
	free(tab->idx);
	memset(tab, 0, sizeof(*tab));
}

/* The first 64 bits of <b>, big-endian: entries sort by them. */
static uint64_t first64(const uint8_t *b)
{
	uint64_t v = 0;
	int i;

	for (i = 0; i < 8; i++)
		v = v << 8 | b[i];
	return v;
}

static int by_prefix(const void *x, const void *y, void *arg)
{
	const struct ovr_table *tab = arg;
	uint64_t pa = first64(tab->e[*(const uint32_t *)x].t.b);
	uint64_t pb = first64(tab->e[*(const uint32_t *)y].t.b);

	return pa < pb ? -1 : pa > pb;
}

/*
 * Sorts the entries of <tab> of each type by their first 64 bits, kept beside
 * them in a compact array, for ovr_match_prefix(): its binary searches read
 * the keys, not the (large) entries.
 */
static void table_sort(struct ovr_table *tab)
{
	size_t t, i;

	for (t = 0; t < OVR_T_COUNT; t++) {
		size_t n = 0;

		tab->sorted[t] = xmalloc((tab->n ? tab->n : 1) * sizeof(*tab->sorted[t]));
		for (i = 0; i < tab->n; i++)
			if (tab->e[i].t.type == t)
				tab->sorted[t][n++] = (uint32_t)i;
		qsort_r(tab->sorted[t], n, sizeof(*tab->sorted[t]), by_prefix, tab);
		tab->keys[t] = xmalloc((n ? n : 1) * sizeof(*tab->keys[t]));
		for (i = 0; i < n; i++)
			tab->keys[t][i] = first64(tab->e[tab->sorted[t][i]].t.b);
		tab->nsorted[t] = n;
	}
}

static int by_u64(const void *x, const void *y, void *arg)
{
	const uint64_t *v = arg;
	uint64_t a = v[*(const uint32_t *)x], b = v[*(const uint32_t *)y];

	return a < b ? -1 : a > b;
}

/*
 * Indexes the entries of <tab> on a whole digest by their fingerprint under
 * <k> (for ovr_match_prefix()): tab->kfp sorted, tab->kfp_idx their entries.
 */
static void table_index_fp(struct ovr_table *tab, const struct fp_key *k)
{
	uint64_t *all = xmalloc((tab->n ? tab->n : 1) * sizeof(*all));
	size_t i, n = 0;

	free(tab->kfp);
	free(tab->kfp_idx);
	tab->kfp_idx = xmalloc((tab->n ? tab->n : 1) * sizeof(*tab->kfp_idx));
	for (i = 0; i < tab->n; i++) {
		uint8_t fp[FP_LEN];

		if (tab->e[i].t.type != OVR_T_KEY || tab->e[i].t.bits != 128)
			continue;
		fp_compute(k, tab->e[i].t.b, fp);
		all[i] = first64(fp);
		tab->kfp_idx[n++] = (uint32_t)i;
	}
	qsort_r(tab->kfp_idx, n, sizeof(*tab->kfp_idx), by_u64, all);
	tab->kfp = xmalloc((n ? n : 1) * sizeof(*tab->kfp));
	for (i = 0; i < n; i++)
		tab->kfp[i] = all[tab->kfp_idx[i]];
	tab->nkfp = n;
	free(all);
}

/*
 * The entry of <kind> in force at <now> whose target of <type> holds the
 * <len> bytes <b>, the longest prefix first, or NULL.
 */
static const struct ovr_entry *table_match(const struct ovr_table *tab, int kind, uint8_t type,
					   const uint8_t *b, size_t len, int64_t now)
{
	const uint64_t *lens = tab->lens[kind][type];
	struct ovr_target t;
	int bits;

	if (!tab->n || !(lens[0] | lens[1] | lens[2]))
		return NULL;
	for (bits = (int)(8 * len); bits >= 0; bits--) {
		const struct ovr_entry *e;

		if (!(lens[bits / 64] >> (bits % 64) & 1))
			continue;
		memset(&t, 0, sizeof(t));
		t.type = type;
		t.bits = (uint8_t)bits;
		memcpy(t.b, b, len);
		mask_bits(t.b, 16, (unsigned)bits);
		e = table_find(tab, (uint8_t)kind, &t);
		if (e && e->until > now)
			return e;
	}
	return NULL;
}

/* Whether the first <bits> bits of <a> and <b> (16 bytes each) are equal. */
static bool prefix_equal(const uint8_t *a, const uint8_t *b, unsigned bits)
{
	unsigned whole = bits / 8, rest = bits % 8;

	if (memcmp(a, b, whole) != 0)
		return false;
	return !rest || ((a[whole] ^ b[whole]) & (uint8_t)(0xff00 >> rest)) == 0;
}

/* Whether <e> should be preferred to <cur>: a block first, then the longest prefix. */
static bool better(const struct ovr_entry *e, const struct ovr_entry *cur)
{
	if (!cur)
		return true;
	if (e->kind != cur->kind)
		return e->kind == OVR_BLOCK;
	return e->t.bits > cur->t.bits;
}

#define OVR_INSIDE_MAX 256      /* entries inside one prefix looked at */

/*
 * The entries of type <type> whose first 64 bits are <key> masked to <keep>
 * bits (a range of tab->sorted[type]): [*lo, *hi).
 */
static void sorted_range(const struct ovr_table *tab, uint8_t type, uint64_t key, unsigned keep,
			 size_t *lo, size_t *hi)
{
	uint64_t mask = keep >= 64 ? ~UINT64_C(0) : keep ? ~(~UINT64_C(0) >> keep) : 0;
	const uint64_t *keys = tab->keys[type];
	size_t a = 0, b = tab->nsorted[type];

	key &= mask;
	while (a < b) {
		size_t mid = a + (b - a) / 2;

		if (keys[mid] < key)
			a = mid + 1;
		else
			b = mid;
	}
	*lo = a;
	for (b = a; b < tab->nsorted[type] && (keys[b] & mask) == key; b++)
		;
	*hi = b;
}

/*
 * The override in force at <now> that applies to a client known by the
 * prefix <t> only (what /top shows: 32 bits of a key's digest, an address
 * prefix): an entry whose prefix covers <t>, or one inside it (a block made
 * on a key's whole digest); a block before a limit, then the longest. NULL if
 * none. A binary search per prefix length present shorter than <t>, and one
 * for the entries inside <t> (at most OVR_INSIDE_MAX of them looked at).
 */
const struct ovr_entry *ovr_match_prefix(const struct overrides *ov, const struct ovr_target *t,
					 int64_t now)
{
	const struct ovr_table *tab = &ov->tab;
	const struct ovr_entry *best = NULL;
	size_t lo, hi, i;
	unsigned bits, k;

	if (t->type >= OVR_T_COUNT ||
	    (!tab->nsorted[t->type] && !(t->type == OVR_T_FP && tab->nkfp)))
		return NULL;
	/* entries inside <t> (or equal to it): the same first min(bits, 64) bits */
	sorted_range(tab, t->type, first64(t->b), t->bits, &lo, &hi);
	for (i = lo; i < hi && i < lo + OVR_INSIDE_MAX; i++) {
		const struct ovr_entry *e = &tab->e[tab->sorted[t->type][i]];

		if (e->until > now && prefix_equal(e->t.b, t->b, e->t.bits < t->bits ? e->t.bits
										      : t->bits) &&
		    better(e, best))
			best = e;
	}
	/* entries covering <t>: for each shorter length present, <t> cut to it */
	for (bits = 0; bits < t->bits; bits++) {
		uint8_t cut[16];

		for (k = 0; k < OVR_KIND_COUNT; k++)
			if (tab->lens[k][t->type][bits / 64] >> (bits % 64) & 1)
				break;
		if (k == OVR_KIND_COUNT)
			continue;
		memcpy(cut, t->b, sizeof(cut));
		mask_bits(cut, sizeof(cut), bits);
		sorted_range(tab, t->type, first64(cut), 64, &lo, &hi);
		for (i = lo; i < hi; i++) {
			const struct ovr_entry *e = &tab->e[tab->sorted[t->type][i]];

			if (e->t.bits == bits && e->until > now &&
			    memcmp(e->t.b, cut, sizeof(cut)) == 0 && better(e, best))
				best = e;
		}
	}
	/* a fingerprint: the entries on the whole digest it is the fingerprint of */
	if (t->type == OVR_T_FP && tab->nkfp) {
		uint64_t v = first64(t->b);
		size_t a = 0, b = tab->nkfp;

		while (a < b) {
			size_t mid = a + (b - a) / 2;

			if (tab->kfp[mid] < v)
				a = mid + 1;
			else
				b = mid;
		}
		for (; a < tab->nkfp && tab->kfp[a] == v; a++) {
			const struct ovr_entry *e = &tab->e[tab->kfp_idx[a]];

			if (e->until > now &&
			    (!best || (e->kind == OVR_BLOCK && best->kind != OVR_BLOCK)))
				best = e;
		}
	}
	return best;
}

/*
 * The entry of <kind> in force at <now> for the API key of digest <digest>
 * and fingerprint <fp> (FP_LEN bytes under the table's key): by its digest
 * (the longest prefix first), else by its fingerprint. NULL if none.
 */
const struct ovr_entry *ovr_match_key(const struct overrides *ov, int kind,
				      const uint8_t digest[16], const uint8_t *fp, int64_t now)
{
	const struct ovr_entry *e = table_match(&ov->tab, kind, OVR_T_KEY, digest, 16, now);

	return e ? e : table_match(&ov->tab, kind, OVR_T_FP, fp, FP_LEN, now);
}

/*
 * The entry of <kind> in force at <now> for address <addr> (<len> 4 or 16
 * bytes; an IPv4-mapped IPv6 address is its IPv4 address), or NULL.
 */
const struct ovr_entry *ovr_match_addr(const struct overrides *ov, int kind, const uint8_t *addr,
				       size_t len, int64_t now)
{
	if (len == 16 && memcmp(addr, "\0\0\0\0\0\0\0\0\0\0\xff\xff", 12) == 0)
		return table_match(&ov->tab, kind, OVR_T_IP4, addr + 12, 4, now);
	return table_match(&ov->tab, kind, len == 4 ? OVR_T_IP4 : OVR_T_IP6, addr, len, now);
}

/* ---- audit ---------------------------------------------------------------- */

static int64_t now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec;
}

/* Logs "override <verb>: <what> on <target> until <time> (<left>) by <who>, reason "..."". */
static void audit(const struct overrides *ov, const char *verb, const struct ovr_entry *e,
		  int64_t now)
{
	char target[OVR_FIELD_MAX], what[256], when[32];
	time_t u = (time_t)e->until;
	struct tm tm;

	ovr_target_show(&e->t, &ov->fp, target, sizeof(target));
	ovr_describe(e, what, sizeof(what));
	if (!gmtime_r(&u, &tm) || !strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm))
		snprintf(when, sizeof(when), "%lld", (long long)e->until);
	LOG(LOG_NOTICE, "override %s: %s on %s until %s (%lld s left) by %s, reason \"%s\"", verb,
	    what, target, when, (long long)(e->until > now ? e->until - now : 0),
	    e->by[0] ? e->by : "(not given)", e->reason);
}

/*
 * Counts and logs (at most once per OVR_ERR_LOG_S) a failed poll or load of
 * status <st>. An error reply (a hash of the wrong type, an ACL refusing the
 * command) pauses polling, 1 s doubling up to OVR_BACKOFF_MAX: the store
 * counts error replies against the node's breaker, and our data must not
 * open it for the decisions.
 */
static void poll_error(struct overrides *ov, const char *what, enum store_status st)
{
	const char *why = store_status_str((int)st);
	double now = mono();

	if (st == STORE_ERROR) {
		ov->backoff = ov->backoff ? ov->backoff * 2 : 1;
		if (ov->backoff > OVR_BACKOFF_MAX)
			ov->backoff = OVR_BACKOFF_MAX;
		ov->next_at = now + ov->backoff;
	}
	ov->stats.poll_errors++;
	if (ov->err_at && now - ov->err_at < OVR_ERR_LOG_S) {
		ov->err_quiet++;
		return;
	}
	LOG(LOG_WARN, "overrides: %s failed: %s; keeping the %zu entries loaded (%llu more "
		      "failures not logged)",
	    what, why, ov->tab.n, (unsigned long long)ov->err_quiet);
	ov->err_at = now;
	ov->err_quiet = 0;
}

/* Logs the expiry of entries whose time is up, once each. */
static void sweep(struct overrides *ov, int64_t now)
{
	size_t i;

	for (i = 0; i < ov->tab.n; i++) {
		struct ovr_entry *e = &ov->tab.e[i];

		if (!e->expired && e->until <= now) {
			e->expired = true;
			audit(ov, "expired", e, now);
		}
	}
}

/* Reads the next length-prefixed string of a flattened HGETALL reply. */
static bool next_str(const char **p, const char *end, const char **s, size_t *len)
{
	uint32_t l;

	if (end - *p < 4)
		return false;
	memcpy(&l, *p, 4);
	if ((size_t)(end - *p - 4) < l)
		return false;
	*s = *p + 4;
	*len = l;
	*p += 4 + (size_t)l;
	return true;
}

/*
 * Builds a new table from the flattened HGETALL reply <buf> (<len> bytes),
 * logs what changed against the old one and swaps it in.
 */
static void load(struct overrides *ov, const char *buf, size_t len)
{
	const char *p = buf, *end = buf + len, *f, *v;
	size_t fl, vl, pairs = 0, over = 0, cap;
	int64_t now = now_s();
	struct ovr_table nt;
	bool version_set = false;
	uint64_t version = 0;
	size_t i;

	while (next_str(&p, end, &f, &fl) && next_str(&p, end, &v, &vl))
		pairs++;
	cap = pairs < ov->max_entries ? pairs : ov->max_entries;
	table_init(&nt, cap);
	p = buf;
	while (next_str(&p, end, &f, &fl) && next_str(&p, end, &v, &vl)) {
		struct ovr_entry e;
		char err[160];

		if (fl == 7 && memcmp(f, "version", 7) == 0) {
			version_set = true;
			version = hll_hash(v, vl);
			continue;
		}
		memset(&e, 0, sizeof(e));
		if (ovr_field_parse(f, fl, &e, err, sizeof(err)) < 0 ||
		    ovr_value_parse(v, vl, &e, err, sizeof(err)) < 0) {
			char fs[OVR_FIELD_MAX + 1];

			ov->stats.skipped++;
			LOG(LOG_WARN, "overrides: entry '%s' skipped: %s",
			    spop_escape(fs, sizeof(fs), f, fl), err);
			continue;
		}
		if (table_find(&nt, e.kind, &e.t)) {
			char fs[OVR_FIELD_MAX + 8], raw[OVR_FIELD_MAX + 1];

			ov->stats.skipped++;
			ovr_target_show(&e.t, &ov->fp, fs, sizeof(fs));
			LOG(LOG_WARN, "overrides: entry '%s' skipped: a second spelling of %s on %s",
			    spop_escape(raw, sizeof(raw), f, fl), kind_names[e.kind], fs);
			continue;
		}
		if (nt.n == cap) {
			over++;
			continue;
		}
		table_add(&nt, &e);
	}
	if (over) {
		ov->stats.skipped += over;
		LOG(LOG_WARN, "overrides: %zu entries skipped beyond overrides.max_entries = %u",
		    over, ov->max_entries);
	}
	/* the audit trail: what this agent starts or stops applying */
	for (i = 0; i < nt.n; i++) {
		struct ovr_entry *e = &nt.e[i];
		const struct ovr_entry *old = table_find(&ov->tab, e->kind, &e->t);

		if (old && old->vhash == e->vhash) {
			e->expired = old->expired;
		} else if (e->until <= now) {
			e->expired = true; /* over already: nothing applied, nothing to say */
		} else {
			audit(ov, old ? "changed" : "applied", e, now);
		}
	}
	for (i = 0; i < ov->tab.n; i++) {
		const struct ovr_entry *e = &ov->tab.e[i];

		if (!e->expired && !table_find(&nt, e->kind, &e->t))
			audit(ov, "lifted", e, now);
	}
	table_sort(&nt);
	table_index_fp(&nt, &ov->fp);
	table_release(&ov->tab);
	ov->tab = nt;
	ov->have_version = true;
	ov->version_set = version_set;
	ov->version = version;
	ov->stats.loads++;
	ov->stats.entries = nt.n;
	LOG(LOG_INFO, "overrides: loaded %zu entries (%zu fields read)", nt.n, pairs);
}

/*
 * The first load was tried (whatever came of it), or Redis went away: the
 * decisions waiting for it (ovr_new()'s <wake>) may go on.
 */
static void settle(struct overrides *ov)
{
	if (ov->settled)
		return;
	ov->settled = true;
	if (ov->wake)
		ov->wake(ov->wake_arg);
}

static void all_cb(enum store_status st, const char *val, size_t len, void *arg)
{
	struct overrides *ov = arg;

	ov->busy = false;
	if (st == STORE_OK && val) {
		ov->backoff = 0;
		load(ov, val, len);
	} else if (st != STORE_SHUTDOWN) {
		poll_error(ov, "HGETALL", st);
	}
	settle(ov);
}

static void version_cb(enum store_status st, const char *val, size_t len, void *arg)
{
	struct overrides *ov = arg;
	bool set = val != NULL;
	int ret;

	ov->busy = false;
	if (st != STORE_OK) {
		if (st != STORE_SHUTDOWN)
			poll_error(ov, "version check", st);
		settle(ov);
		return;
	}
	ov->backoff = 0;
	if (ov->have_version && set == ov->version_set && (!set || hll_hash(val, len) == ov->version)) {
		settle(ov);
		return;
	}
	ret = store_hgetall(ov->st, ov->key, all_cb, ov);
	if (ret < 0) {
		poll_error(ov, "HGETALL", (enum store_status)-ret);
		settle(ov);
		return;
	}
	ov->busy = true;
}

/* Sends a version check now, unless one is in flight or Redis cannot take it. */
static void poll_send(struct overrides *ov)
{
	int ret;

	if (ov->busy || mono() < ov->next_at)
		return;
	if (!store_ready(ov->st)) {
		/* decisions waiting for the first load go to the failure ladder meanwhile */
		if (!ov->settled && ov->wake)
			ov->wake(ov->wake_arg);
		return;
	}
	if (store_stats(ov->st)->breaker_open) {
		/* its probe must be a decision, never our poll (which decisions would wait for) */
		settle(ov);
		return;
	}
	ov->stats.polls++;
	ret = store_hget(ov->st, ov->key, "version", 0, version_cb, ov);
	if (ret < 0) {
		poll_error(ov, "version check", (enum store_status)-ret);
		settle(ov);
		return;
	}
	ov->busy = true;
}

static void poll_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct overrides *ov = container_of(t, struct overrides, poll);

	(void)loop;
	(void)revents;
	sweep(ov, now_s());
	if (ov->settled && t->repeat < ov->poll_ms / 1000.) {
		t->repeat = ov->poll_ms / 1000.;
		ev_timer_again(ov->loop, t);
	}
	poll_send(ov);
}

/* ---- API ------------------------------------------------------------------ */

/*
 * Starts polling the overrides of <o>->key_prefix on <st> (which must outlive
 * the table: free the store first, its callbacks still reach us). <wake>
 * (<arg>) is called when decisions held until the first load (ovr_settled()
 * false while Redis is ready) should look again: it was tried, or Redis went.
 */
struct overrides *ovr_new(struct ev_loop *loop, struct store *st, const struct ovr_opts *o,
			  void (*wake)(void *arg), void *arg)
{
	struct overrides *ov = xcalloc(1, sizeof(*ov));

	ov->loop = loop;
	ov->st = st;
	ov->wake = wake;
	ov->wake_arg = arg;
	table_init(&ov->tab, 0);
	ovr_configure(ov, o);
	ev_timer_init(&ov->poll, poll_cb, 0., OVR_START_S);
	ev_timer_start(loop, &ov->poll);
	return ov;
}

/* Applies settings <o> (a reload); the table stays, a smaller cap applies at the next load. */
void ovr_configure(struct overrides *ov, const struct ovr_opts *o)
{
	char key[STORE_KEY_MAX];

	ovr_hash_key(o->key_prefix, key, sizeof(key));
	if (strcmp(key, ov->key) != 0) {
		/* another hash: load it whole at the next poll */
		snprintf(ov->key, sizeof(ov->key), "%s", key);
		ov->have_version = false;
	}
	ov->poll_ms = o->poll_ms ? o->poll_ms : 250;
	ov->max_entries = o->max_entries;
	ov->block_status = o->block_status;
	if (o->fp && o->fp->id != ov->fp.id) {
		/* the secret rotated: the fingerprints shown and matched are the new key's */
		ov->fp = *o->fp;
		table_index_fp(&ov->tab, &ov->fp);
	}
	if (ov->settled && ov->poll.repeat != ov->poll_ms / 1000.) {
		ov->poll.repeat = ov->poll_ms / 1000.;
		ev_timer_again(ov->loop, &ov->poll);
	}
}

void ovr_free(struct overrides *ov)
{
	if (!ov)
		return;
	explicit_bzero(&ov->fp, sizeof(ov->fp));
	BUG_ON(ov->busy); /* the store was freed first: every callback came */
	ev_timer_stop(ov->loop, &ov->poll);
	table_release(&ov->tab);
	free(ov);
}

/* True once the first load was tried: until then decisions wait for it. */
bool ovr_settled(const struct overrides *ov)
{
	return ov->settled;
}

/* A decision waits for the first load: ask now rather than at the next tick. */
void ovr_kick(struct overrides *ov)
{
	poll_send(ov);
}

size_t ovr_count(const struct overrides *ov)
{
	return ov->tab.n;
}

/* The HTTP status of block <e>. */
unsigned ovr_block_status(const struct overrides *ov, const struct ovr_entry *e)
{
	return e->status ? e->status : ov->block_status;
}

const struct ovr_stats *ovr_stats(const struct overrides *ov)
{
	return &ov->stats;
}

/* Appends <s> to <r> as a JSON string (printable ASCII: see ovr_value_parse()). */
static void json_str(struct http_reply *r, const char *s)
{
	http_reply_append(r, "\"", 1);
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			http_reply_append(r, "\\", 1);
		http_reply_append(r, s, 1);
	}
	http_reply_append(r, "\"", 1);
}

/* The table as JSON: {"entries":[...], ...} (GET /overrides on the metrics listener). */
void ovr_render(const struct overrides *ov, struct http_reply *r)
{
	int64_t now = now_s();
	size_t i, j;

	http_reply_printf(r, "{\"loaded\":%s,\"loads\":%llu,\"skipped\":%llu,\"entries\":[",
			  ov->have_version ? "true" : "false", (unsigned long long)ov->stats.loads,
			  (unsigned long long)ov->stats.skipped);
	for (i = 0; i < ov->tab.n; i++) {
		const struct ovr_entry *e = &ov->tab.e[i];
		char t[OVR_FIELD_MAX];

		ovr_target_show(&e->t, &ov->fp, t, sizeof(t));
		http_reply_printf(r, "%s{\"kind\":\"%s\",\"target\":\"%s\",\"until\":%lld,"
				     "\"active\":%s,\"left_s\":%lld",
				  i ? "," : "", kind_names[e->kind], t, (long long)e->until,
				  e->until > now ? "true" : "false",
				  (long long)(e->until > now ? e->until - now : 0));
		if (e->kind == OVR_BLOCK)
			http_reply_printf(r, ",\"status\":%u", ovr_block_status(ov, e));
		if (e->factor)
			http_reply_printf(r, ",\"factor\":%g", e->factor);
		if (e->nrates) {
			http_reply_printf(r, ",\"rates\":{");
			for (j = 0; j < e->nrates; j++)
				http_reply_printf(r, "%s\"%s\":%llu", j ? "," : "", e->rates[j].name,
						  (unsigned long long)e->rates[j].rate);
			http_reply_printf(r, "}");
		}
		http_reply_printf(r, ",\"by\":");
		json_str(r, e->by);
		http_reply_printf(r, ",\"reason\":");
		json_str(r, e->reason);
		http_reply_printf(r, "}");
	}
	http_reply_printf(r, "]}\n");
}
