/* SPDX-License-Identifier: MIT */
/*
 * Unit tests of the SPOP codec (spoa/spop.c) against the byte-level reference
 * doc/SPOP.md (the SPOP reference of this project, verified on the wire against
 * HAProxy 2.6 and 3.3): the varint table of section 2, typed data of
 * section 3, frames of sections 4-5 and every captured vector of section 9.
 *
 * Every input is copied into an exactly sized malloc'd buffer before it is
 * decoded, so a build with -fsanitize=address reports any read past its end.
 *
 * Build: gcc -std=gnu11 -D_GNU_SOURCE -Wall -Wextra -Ispoa -o test_spop \
 *            tests/unit/test_spop.c spoa/spop.c -lcmocka
 *        (add -fsanitize=address,undefined -g to prove the absence of overreads)
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "spop.h"

#define INV    (-SPOP_ST_INVALID)
#define TOOBIG (-SPOP_ST_TOO_BIG)
#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* ------------------------------------------------------------------------ */
/* Captured vectors (SPOP.md section 9), hex as printed there.               */
/* ------------------------------------------------------------------------ */

/* 9.1 HAPROXY-HELLO, 2.6.12 */
#define HEX_HELLO_26                                                                              \
	"000000810100000001000012737570706f727465642d76657273696f6e730803322e300e6d61782d6672616d65" \
	"2d73697a6503fcf0060c6361706162696c69746965730810706970656c696e696e672c6173796e6309656e6769" \
	"6e652d6964082462373232313432362d333861362d343333392d613665312d363636323939373535383435"

/* 9.1 HAPROXY-HELLO, 3.3.0 */
#define HEX_HELLO_33                                                                              \
	"0000007b0100000001000012737570706f727465642d76657273696f6e730803322e300e6d61782d6672616d65" \
	"2d73697a6503fcf0060c6361706162696c6974696573080a706970656c696e696e6709656e67696e652d696408" \
	"2463333434306530362d393039322d346631372d616262372d663037653965376665646632"

/* 9.1 health-check HELLO (2.6.12 and 3.3.0) */
#define HEX_HELLO_HC                                                                              \
	"0000004e0100000001000012737570706f727465642d76657273696f6e730803322e300e6d61782d6672616d65" \
	"2d73697a6503fcf0060c6361706162696c697469657308000b6865616c7468636865636b11"

/* 9.1 AGENT-HELLO accepted by both versions */
#define HEX_AGENT_HELLO                                                                           \
	"00000040650000000100000776657273696f6e0803322e300e6d61782d6672616d652d73697a6503fcf0060c63" \
	"6170616269" "6c6974696573080a706970656c696e696e67"

/* 9.2 NOTIFY, 2.6.12 (sid 0, fid 1) */
#define HEX_NOTIFY_BODY                                                                           \
	"077265712d6d73670d027561080d6375726c2d746573742f312e30026970067f0000010470617468080a2f736f" \
	"6d652f70617468036e756d0429046d657468080347455404666c616711076d697373696e67000276360720010d" \
	"b80000000000000000000000020362696e090300ff10036e656704fef0fefefefefefefe0e0362696704f0af91" \
	"0005656d707479080000067f000001"
#define HEX_NOTIFY_26 "0000009d" "03" "00000001" "00" "01" HEX_NOTIFY_BODY
/* 9.2 the same NOTIFY from 3.3.0: sid 1, fid 1 */
#define HEX_NOTIFY_33 "0000009d" "03" "00000001" "01" "01" HEX_NOTIFY_BODY

/* 9.2 ACK of that NOTIFY (sid 0, fid 1) */
#define HEX_ACK_BODY                                                                              \
	"010302027561080d6375726c2d746573742f312e30010302026970067f000001010302036e756d042a01030203" \
	"6e656704fbf0fefefefefefefe0e0103020362696703f0af910001030204666c61671101030205666c61676601" \
	"0103020276360720010db80000000000000000000000010103020362696e09030001fe01030107736573737661" \
	"720804732d6f6b010303067265717661720804722d6f6b0103020b6e6f746465636c6172656408017801030206" \
	"6e756c6c656400020202046e6f7065"
#define HEX_ACK_26 "000000ca" "67" "00000001" "00" "01" HEX_ACK_BODY
/* the 3.3 run of the same ACK carries "01 01" as ids (SPOP.md 9.2) */
#define HEX_ACK_33 "000000ca" "67" "00000001" "01" "01" HEX_ACK_BODY

/* 9.3 response group NOTIFY and its ACK */
#define HEX_RES_NOTIFY_26 "0000001903000000010002077265732d6d7367010673746174757304c8"
#define HEX_RES_NOTIFY_33 "0000001903000000010301077265732d6d7367010673746174757304c8"
#define HEX_RES_ACK                                                                               \
	"0000002b67000000010002010302067265737661720807726573702d6f6b0103020b7374617475735f736565" \
	"6e02c8"

/* 9.4 disconnects */
#define HEX_DISC_NORMAL                                                                           \
	"00000025020000000100000b7374617475732d636f64650300076d65737361676508066e6f726d616c"
/* 9.4 "same layout with 03 02 and 08 12 'a timeout occurred'" (rebuilt from that description) */
#define HEX_DISC_TIMEOUT                                                                          \
	"00000031020000000100000b7374617475732d636f64650302076d6573736167650812612074696d656f7574" \
	"206f63637572726564"
#define HEX_DISC_FRAG                                                                             \
	"0000003a020000000100000b7374617475732d636f6465030a076d657373616765081b667261676d656e7461" \
	"74696f6e206e6f7420737570706f72746564"
#define HEX_AGENT_DISC_99                                                                         \
	"0000002d660000000100000b7374617475732d636f64650363076d657373616765080e6167656e7420736179" \
	"7320627965"
#define HEX_AGENT_DISC_0                                                                          \
	"0000001f660000000100000b7374617475732d636f64650300076d6573736167650800"

/* 9.4 constructed vectors */
#define HEX_EMPTY_ACK "0000000767000000010301"
#define HEX_SCORE_ACK "00000012670000000101010103020573636f72650257"

struct vector {
	const char *name;
	const char *hex;
};

static const struct vector captured[] = {
	{"hello-2.6", HEX_HELLO_26},
	{"hello-3.3", HEX_HELLO_33},
	{"hello-healthcheck", HEX_HELLO_HC},
	{"agent-hello", HEX_AGENT_HELLO},
	{"notify-2.6", HEX_NOTIFY_26},
	{"notify-3.3", HEX_NOTIFY_33},
	{"ack-2.6", HEX_ACK_26},
	{"ack-3.3", HEX_ACK_33},
	{"res-notify-2.6", HEX_RES_NOTIFY_26},
	{"res-notify-3.3", HEX_RES_NOTIFY_33},
	{"res-ack", HEX_RES_ACK},
	{"disconnect-normal", HEX_DISC_NORMAL},
	{"disconnect-timeout", HEX_DISC_TIMEOUT},
	{"disconnect-frag", HEX_DISC_FRAG},
	{"agent-disconnect-99", HEX_AGENT_DISC_99},
	{"agent-disconnect-0", HEX_AGENT_DISC_0},
	{"empty-ack", HEX_EMPTY_ACK},
	{"score-ack", HEX_SCORE_ACK},
};

/* ------------------------------------------------------------------------ */
/* Helpers                                                                   */
/* ------------------------------------------------------------------------ */

struct blob {
	uint8_t *p;
	size_t len;
};

/* An exactly sized heap copy: ASan flags any read past its end. */
static uint8_t *dup_exact(const void *p, size_t n)
{
	uint8_t *d = malloc(n);

	if (n) {
		assert_non_null(d);
		memcpy(d, p, n);
	}
	return d;
}

static int hexdigit(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* Decodes <h> (spaces allowed between bytes) into an exactly sized buffer. */
static struct blob hex(const char *h)
{
	size_t n = 0, i;
	uint8_t *tmp = malloc(strlen(h) / 2 + 1);
	struct blob b;

	assert_non_null(tmp);
	for (i = 0; h[i];) {
		int hi, lo;

		if (h[i] == ' ') {
			i++;
			continue;
		}
		hi = hexdigit(h[i]);
		lo = hexdigit(h[i + 1]);
		assert_true(hi >= 0 && lo >= 0);
		tmp[n++] = (uint8_t)(hi << 4 | lo);
		i += 2;
	}
	b.p = dup_exact(tmp, n);
	b.len = n;
	free(tmp);
	return b;
}

static void blob_free(struct blob *b)
{
	free(b->p);
	b->p = NULL;
	b->len = 0;
}

static struct spop_rd rd_of(const uint8_t *p, size_t len)
{
	struct spop_rd rd = {p, p + len};

	return rd;
}

static bool view_in(const struct spop_str *s, const void *lo, const void *hi)
{
	const char *l = lo, *h = hi;

	if (s->len == 0)
		return true;
	return s->p >= l && s->p <= h && s->len <= (size_t)(h - s->p);
}

static void assert_view_eq(const struct spop_str *s, const void *p, size_t len)
{
	assert_int_equal(s->len, len);
	if (len)
		assert_memory_equal(s->p, p, len);
}

static void assert_view_str(const struct spop_str *s, const char *cstr)
{
	assert_view_eq(s, cstr, strlen(cstr));
	assert_true(spop_str_eq(s, cstr));
}

/* ---- expected typed values ---- */

static struct spop_data D_null(void)
{
	struct spop_data d = {.type = SPOP_T_NULL};

	return d;
}

static struct spop_data D_i32(int64_t i)
{
	struct spop_data d = {.type = SPOP_T_INT32};

	d.v.i = i;
	return d;
}

static struct spop_data D_u64(uint64_t u)
{
	struct spop_data d = {.type = SPOP_T_UINT64};

	d.v.u = u;
	return d;
}

static struct spop_data D_str(const char *s)
{
	return spop_string(s, strlen(s));
}

static struct spop_data D_bin(const void *p, size_t len)
{
	struct spop_data d = {.type = SPOP_T_BIN};

	d.v.s.p = p;
	d.v.s.len = len;
	return d;
}

static struct spop_data D_ipv4(uint8_t a, uint8_t b, uint8_t c, uint8_t e)
{
	struct spop_data d = {.type = SPOP_T_IPV4};

	d.v.ipv4[0] = a;
	d.v.ipv4[1] = b;
	d.v.ipv4[2] = c;
	d.v.ipv4[3] = e;
	return d;
}

static struct spop_data D_ipv6(const uint8_t *a)
{
	struct spop_data d = {.type = SPOP_T_IPV6};

	memcpy(d.v.ipv6, a, 16);
	return d;
}

static const uint8_t V6_2[16] = {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2};
static const uint8_t V6_1[16] = {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};

static bool data_eq(const struct spop_data *a, const struct spop_data *b)
{
	if (a->type != b->type)
		return false;
	switch (a->type) {
	case SPOP_T_NULL:
		return true;
	case SPOP_T_BOOL:
		return a->v.b == b->v.b;
	case SPOP_T_INT32:
	case SPOP_T_INT64:
		return a->v.i == b->v.i;
	case SPOP_T_UINT32:
	case SPOP_T_UINT64:
		return a->v.u == b->v.u;
	case SPOP_T_IPV4:
		return memcmp(a->v.ipv4, b->v.ipv4, 4) == 0;
	case SPOP_T_IPV6:
		return memcmp(a->v.ipv6, b->v.ipv6, 16) == 0;
	case SPOP_T_STR:
	case SPOP_T_BIN:
		return a->v.s.len == b->v.s.len &&
		       (a->v.s.len == 0 || memcmp(a->v.s.p, b->v.s.p, a->v.s.len) == 0);
	default:
		return false;
	}
}

static void assert_data_eq(const struct spop_data *got, const struct spop_data *exp)
{
	if (!data_eq(got, exp))
		fail_msg("typed value mismatch: got type %u, expected type %u", got->type, exp->type);
}

/* ---- an ACK action reader written for the tests (the codec only writes ACKs) ---- */

struct action {
	uint8_t type;
	uint8_t nb_args;
	uint8_t scope;
	struct spop_str name;
	struct spop_data val;
};

static int ack_next(struct spop_rd *rd, struct action *a)
{
	struct spop_rd r = *rd;
	int n;

	if (r.p == r.end)
		return 0;
	if (r.end - r.p < 3)
		return INV;
	a->type = *r.p++;
	a->nb_args = *r.p++;
	a->scope = *r.p++;
	if (!(a->type == SPOP_ACT_SET_VAR && a->nb_args == 3) &&
	    !(a->type == SPOP_ACT_UNSET_VAR && a->nb_args == 2))
		return INV;
	n = spop_str_decode(&r, &a->name);
	if (n < 0)
		return n;
	if (a->type == SPOP_ACT_SET_VAR) {
		n = spop_data_decode(&r, &a->val);
		if (n < 0)
			return n;
	} else {
		a->val = D_null();
	}
	*rd = r;
	return 1;
}

/* ---- frame helpers ---- */

/* Splits the single wire frame <w> (length + frame) and decodes its header. */
static void decode_wire(const struct blob *w, struct spop_frame *f)
{
	uint32_t len = 0;

	assert_int_equal(spop_frame_len_peek(w->p, w->len, &len), SPOP_LEN_SIZE);
	assert_int_equal((size_t)len + SPOP_LEN_SIZE, w->len);
	assert_int_equal(spop_frame_decode(w->p + SPOP_LEN_SIZE, len, f), 0);
	assert_true(f->payload >= w->p + SPOP_LEN_SIZE);
	assert_ptr_equal(f->payload + f->len, w->p + w->len);
}

static bool is_kv_type(uint8_t t)
{
	return t == SPOP_FRM_HAPROXY_HELLO || t == SPOP_FRM_HAPROXY_DISCON ||
	       t == SPOP_FRM_AGENT_HELLO || t == SPOP_FRM_AGENT_DISCON;
}

/* A NUL-terminated copy of a view (keys for spop_put_kv()). */
static void cstr_of(char *dst, size_t room, const struct spop_str *s)
{
	assert_true(s->len < room);
	if (s->len)
		memcpy(dst, s->p, s->len);
	dst[s->len] = '\0';
}

/*
 * Decodes the wire frame <w> and writes it again from its decoded meaning with
 * the put_* API; the result must be byte-identical.
 */
static void reencode_identical(const char *hexstr)
{
	struct blob w = hex(hexstr);
	struct spop_frame f;
	struct spop_rd rd;
	uint8_t out[512];
	struct spop_wbuf wb;
	size_t start;
	int ret;

	decode_wire(&w, &f);
	spop_wbuf_init(&wb, out, sizeof(out));
	start = spop_frame_begin(&wb, f.type, f.flags, f.sid, f.fid);
	assert_int_equal(start, 0);
	rd = rd_of(f.payload, f.len);
	if (is_kv_type(f.type)) {
		struct spop_str key;
		struct spop_data val;
		char k[256];

		while ((ret = spop_kv_next(&rd, &key, &val)) == 1) {
			cstr_of(k, sizeof(k), &key);
			spop_put_kv(&wb, k, &val);
		}
		assert_int_equal(ret, 0);
	} else if (f.type == SPOP_FRM_NOTIFY) {
		struct spop_msg m;
		struct spop_str name;
		struct spop_data val;

		while ((ret = spop_msg_next(&rd, &m)) == 1) {
			spop_put_str(&wb, m.name.p, m.name.len);
			spop_put_u8(&wb, (uint8_t)m.nb_args);
			while ((ret = spop_arg_next(&m, &name, &val)) == 1) {
				spop_put_str(&wb, name.p, name.len);
				spop_put_data(&wb, &val);
			}
			assert_int_equal(ret, 0);
		}
		assert_int_equal(ret, 0);
	} else if (f.type == SPOP_FRM_ACK) {
		struct action a;

		while ((ret = ack_next(&rd, &a)) == 1) {
			if (a.type == SPOP_ACT_SET_VAR)
				spop_put_set_var(&wb, a.scope, a.name.p, a.name.len, &a.val);
			else
				spop_put_unset_var(&wb, a.scope, a.name.p, a.name.len);
		}
		assert_int_equal(ret, 0);
	} else {
		fail_msg("unexpected frame type %u", f.type);
	}
	assert_false(wb.overflow);
	assert_int_equal(spop_frame_end(&wb, start), (int)w.len);
	assert_int_equal(wb.len, w.len);
	assert_memory_equal(out, w.p, w.len);
	blob_free(&w);
}

/* ------------------------------------------------------------------------ */
/* Varints (SPOP.md section 2)                                               */
/* ------------------------------------------------------------------------ */

struct varint_vec {
	uint64_t v;
	const char *hex;
};

static const struct varint_vec varint_table[] = {
	{0, "00"},
	{1, "01"},
	{41, "29"},
	{200, "c8"},
	{239, "ef"},
	{240, "f0 00"},
	{241, "f1 00"},
	{255, "ff 00"},
	{256, "f0 01"},
	{2287, "ff 7f"},
	{2288, "f0 80 00"},
	{2289, "f1 80 00"},
	{16380, "fc f0 06"},
	{65535, "ff f0 1e"},
	{264431, "ff ff 7f"},
	{264432, "f0 80 80 00"},
	{300000, "f0 af 91 00"},
	{33818864, "f0 80 80 80 00"},
	{4294967295ULL, "ff f0 fe fe 7e"},
	{4328786160ULL, "f0 80 80 80 80 00"},
	{INT64_MAX, "ff f0 fe fe fe fe fe fe fe 06"},
	{UINT64_MAX - 1, "fe f0 fe fe fe fe fe fe fe 0e"}, /* -2 */
	{UINT64_MAX - 4, "fb f0 fe fe fe fe fe fe fe 0e"}, /* -5 */
	{UINT64_MAX, "ff f0 fe fe fe fe fe fe fe 0e"},
};

static void test_spop_varint_table_encode(void **state)
{
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(varint_table); i++) {
		struct blob e = hex(varint_table[i].hex);
		uint8_t *buf = malloc(e.len);
		int n;

		assert_int_equal(spop_varint_size(varint_table[i].v), (int)e.len);
		n = spop_varint_encode(buf, e.len, varint_table[i].v);
		assert_int_equal(n, (int)e.len);
		assert_memory_equal(buf, e.p, e.len);
		/* one byte short: refused, and nothing written past the room (ASan) */
		free(buf);
		buf = malloc(e.len - 1 ? e.len - 1 : 1);
		assert_int_equal(spop_varint_encode(buf, e.len - 1, varint_table[i].v), TOOBIG);
		assert_int_equal(spop_varint_encode(buf, 0, varint_table[i].v), TOOBIG);
		free(buf);
		blob_free(&e);
	}
}

static void test_spop_varint_table_decode(void **state)
{
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(varint_table); i++) {
		struct blob e = hex(varint_table[i].hex);
		struct spop_rd rd = rd_of(e.p, e.len);
		uint64_t v = 12345;
		uint8_t *more;

		assert_int_equal(spop_varint_decode(&rd, &v), (int)e.len);
		assert_true(v == varint_table[i].v);
		assert_ptr_equal(rd.p, e.p + e.len);

		/* a following byte is left alone */
		more = malloc(e.len + 1);
		memcpy(more, e.p, e.len);
		more[e.len] = 0x42;
		rd = rd_of(more, e.len + 1);
		assert_int_equal(spop_varint_decode(&rd, &v), (int)e.len);
		assert_true(v == varint_table[i].v);
		assert_ptr_equal(rd.p, more + e.len);
		assert_int_equal(spop_varint_decode(&rd, &v), 1);
		assert_int_equal(v, 0x42);
		free(more);
		blob_free(&e);
	}
}

/* The size ranges of SPOP.md section 2, both ends of every range. */
static void test_spop_varint_size_ranges(void **state)
{
	static const uint64_t lo[10] = {
		0ULL,
		240ULL,
		2288ULL,
		264432ULL,
		33818864ULL,
		4328786160ULL,
		554084600048ULL,
		70922828777712ULL,
		9078122083518704ULL,
		1161999626690365680ULL,
	};
	int n;

	(void)state;
	for (n = 1; n <= 10; n++) {
		uint64_t vals[2] = {lo[n - 1], n < 10 ? lo[n] - 1 : UINT64_MAX};
		int k;

		for (k = 0; k < 2; k++) {
			uint8_t buf[SPOP_VARINT_MAX];
			uint8_t *exact;
			struct spop_rd rd;
			uint64_t v;

			assert_int_equal(spop_varint_size(vals[k]), n);
			assert_int_equal(spop_varint_encode(buf, sizeof(buf), vals[k]), n);
			/* only the last byte has its high bit clear */
			if (n > 1) {
				int j;

				assert_true(buf[0] >= 0xF0);
				for (j = 1; j < n - 1; j++)
					assert_true(buf[j] >= 0x80);
				assert_true(buf[n - 1] < 0x80);
			}
			exact = dup_exact(buf, (size_t)n);
			rd = rd_of(exact, (size_t)n);
			assert_int_equal(spop_varint_decode(&rd, &v), n);
			assert_true(v == vals[k]);
			free(exact);
		}
	}
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;

static uint64_t rnd(void)
{
	/* xorshift64* */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545F4914F6CDD1DULL;
}

static void test_spop_varint_roundtrip_random(void **state)
{
	int i;

	(void)state;
	for (i = 0; i < 20000; i++) {
		unsigned bits = (unsigned)(rnd() % 65);
		uint64_t v = bits == 64 ? rnd() : (rnd() & ((1ULL << bits) - 1));
		uint8_t buf[SPOP_VARINT_MAX];
		int n = spop_varint_encode(buf, sizeof(buf), v);
		struct spop_rd rd = rd_of(buf, (size_t)n);
		uint64_t back;

		assert_true(n >= 1 && n <= 10);
		assert_int_equal(n, spop_varint_size(v));
		assert_int_equal(spop_varint_decode(&rd, &back), n);
		assert_true(back == v);
	}
}

/* Every strict prefix of every varint of the table is a truncation. */
static void test_spop_varint_truncations_invalid(void **state)
{
	size_t i, k;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(varint_table); i++) {
		struct blob e = hex(varint_table[i].hex);

		for (k = 0; k < e.len; k++) {
			uint8_t *p = dup_exact(e.p, k);
			struct spop_rd rd = rd_of(p, k);
			uint64_t v;

			assert_int_equal(spop_varint_decode(&rd, &v), INV);
			assert_ptr_equal(rd.p, p);
			assert_ptr_equal(rd.end, p + k);
			free(p);
		}
		blob_free(&e);
	}
}

static void test_spop_varint_eleven_bytes_invalid(void **state)
{
	static const char *const bad[] = {
		/* 11 bytes: 10 continuation bytes then a terminator */
		"f0 80 80 80 80 80 80 80 80 80 00",
		"ff ff ff ff ff ff ff ff ff ff 7f",
		/* longer still */
		"f0 80 80 80 80 80 80 80 80 80 80 80 80 80 80 80 80 80 80 80 00",
		/* 10 bytes all with continuation bits and nothing after */
		"f0 80 80 80 80 80 80 80 80 80",
		"ff ff ff ff ff ff ff ff ff ff",
	};
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(bad); i++) {
		struct blob e = hex(bad[i]);
		struct spop_rd rd = rd_of(e.p, e.len);
		uint64_t v;

		assert_int_equal(spop_varint_decode(&rd, &v), INV);
		assert_ptr_equal(rd.p, e.p);
		blob_free(&e);
	}

	/* the same 11-byte varint as a frame's stream-id, a string length, a value */
	{
		struct blob fr = hex("03 00000001 f0 80 80 80 80 80 80 80 80 80 00 01");
		struct spop_frame f;
		struct blob s = hex("f0 80 80 80 80 80 80 80 80 80 00 41");
		struct spop_str str;
		struct blob d = hex("04 f0 80 80 80 80 80 80 80 80 80 00");
		struct spop_data data;
		struct spop_rd rd;

		assert_int_equal(spop_frame_decode(fr.p, fr.len, &f), INV);
		rd = rd_of(s.p, s.len);
		assert_int_equal(spop_str_decode(&rd, &str), INV);
		assert_ptr_equal(rd.p, s.p);
		rd = rd_of(d.p, d.len);
		assert_int_equal(spop_data_decode(&rd, &data), INV);
		assert_ptr_equal(rd.p, d.p);
		rd = rd_of(d.p, d.len);
		assert_int_equal(spop_data_skip(&rd), INV);
		assert_ptr_equal(rd.p, d.p);
		blob_free(&fr);
		blob_free(&s);
		blob_free(&d);
	}
}

/* ------------------------------------------------------------------------ */
/* Strings and typed data (SPOP.md section 3)                                */
/* ------------------------------------------------------------------------ */

static void test_spop_str_decode(void **state)
{
	struct blob b = hex("03 61 62 63 00 f0 00");
	struct spop_rd rd = rd_of(b.p, b.len);
	struct spop_str s;
	size_t k;

	(void)state;
	assert_int_equal(spop_str_decode(&rd, &s), 4);
	assert_view_str(&s, "abc");
	assert_ptr_equal(s.p, b.p + 1);
	assert_int_equal(spop_str_decode(&rd, &s), 1);
	assert_int_equal(s.len, 0);
	/* length 240 with nothing behind it */
	assert_int_equal(spop_str_decode(&rd, &s), INV);
	assert_ptr_equal(rd.p, b.p + 5);
	blob_free(&b);

	/* each strict prefix of "03 abc" is truncated */
	b = hex("03 61 62 63");
	for (k = 0; k < b.len; k++) {
		uint8_t *p = dup_exact(b.p, k);

		rd = rd_of(p, k);
		assert_int_equal(spop_str_decode(&rd, &s), INV);
		assert_ptr_equal(rd.p, p);
		free(p);
	}
	blob_free(&b);

	/* long string with a multi-byte length: 300 bytes */
	{
		uint8_t *p = malloc(2 + 300);
		int n = spop_varint_encode(p, 2, 300);

		assert_int_equal(n, 2);
		memset(p + 2, 'x', 300);
		rd = rd_of(p, 302);
		assert_int_equal(spop_str_decode(&rd, &s), 302);
		assert_int_equal(s.len, 300);
		rd = rd_of(p, 301);
		assert_int_equal(spop_str_decode(&rd, &s), INV);
		free(p);
	}
}

/* Lengths that would wrap a pointer or be truncated to 32 bits. */
static const uint64_t huge_lengths[] = {
	UINT64_MAX,
	UINT64_MAX - 1,
	UINT64_MAX - 2,
	UINT64_MAX - 100,
	1ULL << 63,
	(1ULL << 63) + 2,
	(1ULL << 32) + 2,       /* would be 2 after a 32-bit truncation */
	(1ULL << 32) + 1,
	(1ULL << 32),
	UINT32_MAX,
	SIZE_MAX / 2,
	1ULL << 20,
};

/* Builds <prefix> <varint len> "ab" into an exactly sized buffer. */
static struct blob with_len(const char *prefix_hex, uint64_t len, const char *suffix_hex)
{
	struct blob pre = hex(prefix_hex), suf = hex(suffix_hex), out;
	uint8_t tmp[512];
	size_t n = 0;
	int k;

	memcpy(tmp, pre.p, pre.len);
	n = pre.len;
	k = spop_varint_encode(tmp + n, sizeof(tmp) - n, len);
	assert_true(k > 0);
	n += (size_t)k;
	memcpy(tmp + n, "ab", 2);
	n += 2;
	memcpy(tmp + n, suf.p, suf.len);
	n += suf.len;
	out.p = dup_exact(tmp, n);
	out.len = n;
	blob_free(&pre);
	blob_free(&suf);
	return out;
}

static void test_spop_str_length_near_2_64(void **state)
{
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(huge_lengths); i++) {
		uint64_t L = huge_lengths[i];
		struct blob b;
		struct spop_rd rd;
		struct spop_str s;
		struct spop_data d;
		struct spop_msg m;
		struct spop_hello h;
		struct spop_disconnect dc;
		struct spop_frame f;
		int r;

		/* bare string */
		b = with_len("", L, "");
		rd = rd_of(b.p, b.len);
		assert_int_equal(spop_str_decode(&rd, &s), INV);
		assert_ptr_equal(rd.p, b.p);
		blob_free(&b);

		/* STRING and BINARY values */
		b = with_len("08", L, "");
		rd = rd_of(b.p, b.len);
		assert_int_equal(spop_data_decode(&rd, &d), INV);
		rd = rd_of(b.p, b.len);
		assert_int_equal(spop_data_skip(&rd), INV);
		blob_free(&b);
		b = with_len("09", L, "");
		rd = rd_of(b.p, b.len);
		assert_int_equal(spop_data_decode(&rd, &d), INV);
		rd = rd_of(b.p, b.len);
		assert_int_equal(spop_data_skip(&rd), INV);
		blob_free(&b);

		/* KV key, KV value; hello and disconnect */
		b = with_len("", L, "08 03 32 2e 30");
		rd = rd_of(b.p, b.len);
		r = spop_kv_next(&rd, &s, &d);
		assert_true(r < 0);
		assert_int_equal(spop_hello_parse(b.p, b.len, &h), INV);
		assert_true(spop_disconnect_parse(b.p, b.len, &dc) < 0);
		blob_free(&b);
		b = with_len("12 737570706f727465642d76657273696f6e73 08", L, "");
		assert_int_equal(spop_hello_parse(b.p, b.len, &h), INV);
		blob_free(&b);
		b = with_len("07 6d657373616765 08", L, "");
		assert_true(spop_disconnect_parse(b.p, b.len, &dc) < 0);
		blob_free(&b);

		/* NOTIFY: message name, arg name, arg value */
		b = with_len("", L, "01 00 00");
		rd = rd_of(b.p, b.len);
		assert_true(spop_msg_next(&rd, &m) < 0);
		blob_free(&b);
		b = with_len("01 6d 01", L, "00");
		rd = rd_of(b.p, b.len);
		assert_true(spop_msg_next(&rd, &m) < 0);
		blob_free(&b);
		b = with_len("01 6d 01 01 61 09", L, "");
		rd = rd_of(b.p, b.len);
		assert_true(spop_msg_next(&rd, &m) < 0);
		blob_free(&b);

		/* the same inside a whole frame */
		b = with_len("03 00000001 01 01 01 6d 01 00 08", L, "");
		assert_int_equal(spop_frame_decode(b.p, b.len, &f), 0);
		rd = rd_of(f.payload, f.len);
		assert_true(spop_msg_next(&rd, &m) < 0);
		blob_free(&b);
	}
}

struct data_vec {
	const char *hex;
	struct spop_data exp;
	int64_t ival;   /* spop_data_int() value, if integer */
	bool is_int;
};

static void test_spop_data_decode_each_type(void **state)
{
	static const uint8_t bin[3] = {0x00, 0xff, 0x10};
	struct data_vec vecs[] = {
		{"00", D_null(), 0, false},
		{"01", spop_bool(false), 0, false},
		{"11", spop_bool(true), 0, false},
		{"02 29", D_i32(41), 41, true},
		{"02 fe f0 fe fe fe fe fe fe fe 0e", D_i32(-2), -2, true},
		{"03 fc f0 06", spop_uint32(16380), 16380, true},
		{"03 ff f0 fe fe 7e", spop_uint32(UINT32_MAX), UINT32_MAX, true},
		{"04 29", spop_int64(41), 41, true},
		{"04 f0 af 91 00", spop_int64(300000), 300000, true},
		{"04 fe f0 fe fe fe fe fe fe fe 0e", spop_int64(-2), -2, true},
		{"04 fb f0 fe fe fe fe fe fe fe 0e", spop_int64(-5), -5, true},
		{"04 ff f0 fe fe fe fe fe fe fe 06", spop_int64(INT64_MAX), INT64_MAX, true},
		{"05 00", D_u64(0), 0, true},
		{"05 ff f0 fe fe fe fe fe fe fe 06", D_u64(INT64_MAX), INT64_MAX, true},
		{"05 ff f0 fe fe fe fe fe fe fe 0e", D_u64(UINT64_MAX), 0, false /* > INT64_MAX */},
		{"06 7f 00 00 01", D_ipv4(127, 0, 0, 1), 0, false},
		{"07 20 01 0d b8 00 00 00 00 00 00 00 00 00 00 00 02", D_ipv6(V6_2), 0, false},
		{"08 00", D_str(""), 0, false},
		{"08 03 47 45 54", D_str("GET"), 0, false},
		{"08 0d 63 75 72 6c 2d 74 65 73 74 2f 31 2e 30", D_str("curl-test/1.0"), 0, false},
		{"09 00", D_bin("", 0), 0, false},
		{"09 03 00 ff 10", D_bin(bin, 3), 0, false},
	};
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(vecs); i++) {
		struct blob b = hex(vecs[i].hex);
		struct spop_rd rd = rd_of(b.p, b.len);
		struct spop_data d;
		int64_t iv = 0x5a5a;

		assert_int_equal(spop_data_decode(&rd, &d), (int)b.len);
		assert_ptr_equal(rd.p, b.p + b.len);
		assert_data_eq(&d, &vecs[i].exp);
		if (d.type == SPOP_T_STR || d.type == SPOP_T_BIN)
			assert_true(view_in(&d.v.s, b.p, b.p + b.len));
		if (vecs[i].is_int) {
			assert_true(spop_data_int(&d, &iv));
			assert_true(iv == vecs[i].ival);
		} else if (d.type < SPOP_T_INT32 || d.type > SPOP_T_UINT64) {
			assert_false(spop_data_int(&d, &iv));
		} else {
			assert_true(spop_data_int(&d, &iv)); /* UINT64 above INT64_MAX: still an int */
		}
		rd = rd_of(b.p, b.len);
		assert_int_equal(spop_data_skip(&rd), (int)b.len);
		assert_ptr_equal(rd.p, b.p + b.len);
		blob_free(&b);
	}
}

/* The type is the LOW nibble; BOOL is true iff flag 0x10 is set. */
static void test_spop_data_flag_nibble(void **state)
{
	unsigned hi;

	(void)state;
	for (hi = 0; hi < 16; hi++) {
		uint8_t bytes[5] = {(uint8_t)(hi << 4 | SPOP_T_BOOL), 0, 0, 0, 0};
		uint8_t *p = dup_exact(bytes, 1);
		struct spop_rd rd = rd_of(p, 1);
		struct spop_data d;

		assert_int_equal(spop_data_decode(&rd, &d), 1);
		assert_int_equal(d.type, SPOP_T_BOOL);
		assert_int_equal(d.v.b, (hi & 1) != 0);
		free(p);

		/* STR with a flag nibble is still a STR (type = low nibble) */
		bytes[0] = (uint8_t)(hi << 4 | SPOP_T_STR);
		bytes[1] = 1;
		bytes[2] = 'z';
		p = dup_exact(bytes, 3);
		rd = rd_of(p, 3);
		assert_int_equal(spop_data_decode(&rd, &d), 3);
		assert_int_equal(d.type, SPOP_T_STR);
		assert_view_str(&d.v.s, "z");
		free(p);

		/* NULL with a flag nibble */
		bytes[0] = (uint8_t)(hi << 4 | SPOP_T_NULL);
		p = dup_exact(bytes, 1);
		rd = rd_of(p, 1);
		assert_int_equal(spop_data_decode(&rd, &d), 1);
		assert_int_equal(d.type, SPOP_T_NULL);
		free(p);

		/* INT64 with a flag nibble */
		bytes[0] = (uint8_t)(hi << 4 | SPOP_T_INT64);
		bytes[1] = 0x29;
		p = dup_exact(bytes, 2);
		rd = rd_of(p, 2);
		assert_int_equal(spop_data_decode(&rd, &d), 2);
		assert_int_equal(d.type, SPOP_T_INT64);
		assert_int_equal(d.v.i, 41);
		free(p);
	}
}

static void test_spop_data_bad_type_nibble(void **state)
{
	unsigned tb;

	(void)state;
	for (tb = 0; tb < 256; tb++) {
		uint8_t bytes[24];
		uint8_t *p;
		struct spop_rd rd;
		struct spop_data d;
		int r;

		memset(bytes, 0, sizeof(bytes));
		bytes[0] = (uint8_t)tb;
		p = dup_exact(bytes, sizeof(bytes));
		rd = rd_of(p, sizeof(bytes));
		r = spop_data_decode(&rd, &d);
		if ((tb & 0x0F) >= SPOP_T_COUNT) {
			assert_int_equal(r, INV);
			assert_ptr_equal(rd.p, p);
			rd = rd_of(p, sizeof(bytes));
			assert_int_equal(spop_data_skip(&rd), INV);
			assert_ptr_equal(rd.p, p);
		} else {
			assert_true(r >= 1 && r <= 17);
			assert_int_equal(d.type, tb & 0x0F);
			rd = rd_of(p, sizeof(bytes));
			assert_int_equal(spop_data_skip(&rd), r);
		}
		free(p);
	}
}

/* Truncated typed data of every type: each strict prefix is -INVALID. */
static void test_spop_data_truncated(void **state)
{
	static const char *const full[] = {
		"02 29",
		"02 fe f0 fe fe fe fe fe fe fe 0e",
		"03 fc f0 06",
		"04 f0 af 91 00",
		"04 fb f0 fe fe fe fe fe fe fe 0e",
		"05 ff f0 fe fe fe fe fe fe fe 0e",
		"06 7f 00 00 01",
		"07 20 01 0d b8 00 00 00 00 00 00 00 00 00 00 00 02",
		"08 03 47 45 54",
		"08 f0 01 " /* 256-byte string, header only: the body is appended below */,
		"09 03 00 ff 10",
		"09 00",
		"08 00",
		"00",
		"11",
	};
	size_t i, k;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(full); i++) {
		struct blob b = hex(full[i]);

		if (i == 9) { /* make the 256-byte string complete */
			uint8_t *p = malloc(b.len + 256);

			memcpy(p, b.p, b.len);
			memset(p + b.len, 's', 256);
			free(b.p);
			b.p = p;
			b.len += 256;
		}
		for (k = 0; k <= b.len; k++) {
			uint8_t *p = dup_exact(b.p, k);
			struct spop_rd rd = rd_of(p, k);
			struct spop_data d;
			int r = spop_data_decode(&rd, &d);

			if (k < b.len) {
				assert_int_equal(r, INV);
				assert_ptr_equal(rd.p, p);
				rd = rd_of(p, k);
				assert_int_equal(spop_data_skip(&rd), INV);
				assert_ptr_equal(rd.p, p);
			} else {
				assert_int_equal(r, (int)k);
			}
			free(p);
		}
		blob_free(&b);
	}
}

static void test_spop_data_int(void **state)
{
	struct spop_data d;
	int64_t v = 0;

	(void)state;
	d = D_i32(-7);
	assert_true(spop_data_int(&d, &v));
	assert_int_equal(v, -7);
	d = spop_uint32(7);
	assert_true(spop_data_int(&d, &v));
	assert_int_equal(v, 7);
	d = spop_int64(INT64_MIN);
	assert_true(spop_data_int(&d, &v));
	assert_true(v == INT64_MIN);
	d = D_u64(123456789012ULL);
	assert_true(spop_data_int(&d, &v));
	assert_int_equal(v, 123456789012LL);
	/* UINT64 >= 2^63 saturates, never wraps negative (a huge cost stays huge) */
	d = D_u64((uint64_t)INT64_MAX);
	assert_true(spop_data_int(&d, &v));
	assert_true(v == INT64_MAX);
	d = D_u64((uint64_t)INT64_MAX + 1);
	assert_true(spop_data_int(&d, &v));
	assert_true(v == INT64_MAX);
	d = D_u64(UINT64_MAX);
	assert_true(spop_data_int(&d, &v));
	assert_true(v == INT64_MAX);

	d = D_null();
	assert_false(spop_data_int(&d, &v));
	d = spop_bool(true);
	assert_false(spop_data_int(&d, &v));
	d = D_ipv4(1, 2, 3, 4);
	assert_false(spop_data_int(&d, &v));
	d = D_ipv6(V6_1);
	assert_false(spop_data_int(&d, &v));
	d = D_str("5");
	assert_false(spop_data_int(&d, &v));
	d = D_bin("5", 1);
	assert_false(spop_data_int(&d, &v));
}

/* UINT64 values decoded from the wire, then read as integers: no wrap. */
static void test_spop_uint64_wire_no_wrap(void **state)
{
	/* 05 = UINT64; 2^64-1 and 2^63 as varints */
	static const uint8_t max[] = {0x05, 0xff, 0xf0, 0xfe, 0xfe, 0xfe, 0xfe, 0xfe, 0xfe, 0xfe, 0x0e};
	uint8_t buf[16];
	struct spop_rd rd = {max, max + sizeof(max)};
	struct spop_data d;
	int64_t v = 0;
	int n;

	(void)state;
	assert_true(spop_data_decode(&rd, &d) > 0);
	assert_int_equal(d.type, SPOP_T_UINT64);
	assert_true(d.v.u == UINT64_MAX);
	assert_true(spop_data_int(&d, &v));
	assert_true(v == INT64_MAX);
	buf[0] = 0x05;
	n = spop_varint_encode(buf + 1, sizeof(buf) - 1, (uint64_t)1 << 63);
	assert_true(n > 0);
	rd.p = buf;
	rd.end = buf + 1 + n;
	assert_true(spop_data_decode(&rd, &d) > 0);
	assert_true(spop_data_int(&d, &v));
	assert_true(v == INT64_MAX);
	/* INT64 keeps its sign: -1 is -1 */
	buf[0] = 0x04;
	n = spop_varint_encode(buf + 1, sizeof(buf) - 1, UINT64_MAX);
	rd.p = buf;
	rd.end = buf + 1 + n;
	assert_true(spop_data_decode(&rd, &d) > 0);
	assert_true(spop_data_int(&d, &v));
	assert_true(v == -1);
}

static void test_spop_escape(void **state)
{
	char out[64];
	char tiny[8];

	(void)state;
	assert_string_equal(spop_escape(out, sizeof(out), "plain-id 1.0", 12), "plain-id 1.0");
	assert_string_equal(spop_escape(out, sizeof(out), "a\nb\rc", 5), "a\\x0ab\\x0dc");
	assert_string_equal(spop_escape(out, sizeof(out), "\x1b[31m\x7f", 6),
			    "\\x1b[31m\\x7f");
	assert_string_equal(spop_escape(out, sizeof(out), "back\\slash", 10), "back\\\\slash");
	assert_string_equal(spop_escape(out, sizeof(out), "\xc3\xa9", 2), "\\xc3\\xa9");
	/* NUL bytes inside the view are escaped, not an end */
	assert_string_equal(spop_escape(out, sizeof(out), "a\0b", 3), "a\\x00b");
	assert_string_equal(spop_escape(out, sizeof(out), NULL, 0), "");
	/* cut with a marker, never inside an escape, always terminated */
	assert_string_equal(spop_escape(tiny, sizeof(tiny), "abcdefghij", 10), "abcd...");
	assert_string_equal(spop_escape(tiny, sizeof(tiny), "ab\ncdefgh", 9), "ab...");
	assert_string_equal(spop_escape(tiny, sizeof(tiny), "abcdefg", 7), "abcdefg");
	assert_string_equal(spop_escape(tiny, 1, "abc", 3), "");
}

static void test_spop_str_eq(void **state)
{
	struct spop_str s = {"abcdef", 3};
	struct spop_str e = {"", 0};

	(void)state;
	assert_true(spop_str_eq(&s, "abc"));
	assert_false(spop_str_eq(&s, "ab"));
	assert_false(spop_str_eq(&s, "abcd"));
	assert_false(spop_str_eq(&s, "abd"));
	assert_true(spop_str_eq(&e, ""));
	assert_false(spop_str_eq(&e, "a"));
}

/* ------------------------------------------------------------------------ */
/* Frame headers (SPOP.md section 1)                                         */
/* ------------------------------------------------------------------------ */

static void test_spop_frame_len_peek(void **state)
{
	static const uint8_t b[6] = {0x12, 0x34, 0x56, 0x78, 0xff, 0xff};
	static const uint8_t m[4] = {0xff, 0xff, 0xff, 0xff};
	uint32_t len = 77;
	size_t k;

	(void)state;
	for (k = 0; k < 4; k++) {
		uint8_t *p = dup_exact(b, k);

		assert_int_equal(spop_frame_len_peek(p, k, &len), 0);
		free(p);
	}
	assert_int_equal(spop_frame_len_peek(b, 4, &len), 4);
	assert_int_equal(len, 0x12345678);
	assert_int_equal(spop_frame_len_peek(b, 6, &len), 4);
	assert_int_equal(len, 0x12345678);
	assert_int_equal(spop_frame_len_peek(m, 4, &len), 4);
	assert_int_equal(len, 0xffffffffU);
}

static void test_spop_frame_decode_header(void **state)
{
	struct spop_frame f;
	struct blob b;
	size_t k;

	(void)state;
	/* smallest legal frame: 7 bytes, empty payload */
	b = hex("03 00000001 00 01");
	assert_int_equal(spop_frame_decode(b.p, b.len, &f), 0);
	assert_int_equal(f.type, SPOP_FRM_NOTIFY);
	assert_int_equal(f.flags, SPOP_FL_FIN);
	assert_int_equal(f.sid, 0);
	assert_int_equal(f.fid, 1);
	assert_int_equal(f.len, 0);
	assert_ptr_equal(f.payload, b.p + 7);
	/* shorter than 7 bytes */
	for (k = 0; k < 7; k++) {
		uint8_t *p = dup_exact(b.p, k);

		assert_int_equal(spop_frame_decode(p, k, &f), INV);
		free(p);
	}
	blob_free(&b);

	/* multi-byte ids, flags reported as-is, type not judged, no FIN accepted */
	b = hex("42 deadbeef fc f0 06 f0 af 91 00 aa bb");
	assert_int_equal(spop_frame_decode(b.p, b.len, &f), 0);
	assert_int_equal(f.type, 0x42);
	assert_int_equal(f.flags, 0xdeadbeefU);
	assert_int_equal(f.sid, 16380);
	assert_int_equal(f.fid, 300000);
	assert_int_equal(f.len, 2);
	assert_ptr_equal(f.payload, b.p + 12);
	blob_free(&b);
	b = hex("03 00000000 01 01 00");
	assert_int_equal(spop_frame_decode(b.p, b.len, &f), 0);
	assert_int_equal(f.flags, 0);
	assert_int_equal(f.len, 1);
	blob_free(&b);
	b = hex("00 00000003 05 07");
	assert_int_equal(spop_frame_decode(b.p, b.len, &f), 0);
	assert_int_equal(f.type, SPOP_FRM_UNSET);
	assert_int_equal(f.flags, SPOP_FL_FIN | SPOP_FL_ABORT);
	blob_free(&b);

	/* sid / fid varints truncated by the end of the frame */
	{
		static const char *const trunc[] = {
			"03 00000001 f0 80",          /* sid needs more, len 7 */
			"03 00000001 f0 80 80",       /* sid needs more, len 8 */
			"03 00000001 00 f0",          /* fid needs more, len 7 */
			"03 00000001 01 ff ff",       /* fid needs more, len 8 */
			"03 00000001 fc f0 06",       /* sid ok, no fid */
			"03 00000001 ff f0 fe fe fe fe fe fe fe 0e", /* 2^64-1 sid, no fid */
			"03 00000001 ff f0 fe fe fe fe fe fe fe fe 0e 01", /* 11-byte sid */
			"03 00000001 01 ff f0 fe fe fe fe fe fe fe fe 0e", /* 11-byte fid */
		};
		size_t i;

		for (i = 0; i < ARRAY_SIZE(trunc); i++) {
			b = hex(trunc[i]);
			assert_int_equal(spop_frame_decode(b.p, b.len, &f), INV);
			blob_free(&b);
		}
	}
	/* 10-byte ids are fine */
	b = hex("67 00000001 ff f0 fe fe fe fe fe fe fe 0e fe f0 fe fe fe fe fe fe fe 0e");
	assert_int_equal(spop_frame_decode(b.p, b.len, &f), 0);
	assert_true(f.sid == UINT64_MAX);
	assert_true(f.fid == UINT64_MAX - 1);
	assert_int_equal(f.len, 0);
	blob_free(&b);
}

/* ------------------------------------------------------------------------ */
/* HELLO (SPOP.md 4.1, 4.2, 9.1)                                              */
/* ------------------------------------------------------------------------ */

static void check_haproxy_hello(const char *hexstr, const char *caps, bool pipelining,
				const char *engine_id, bool healthcheck)
{
	struct blob w = hex(hexstr);
	struct spop_frame f;
	struct spop_hello h;
	uint32_t out = 0;

	decode_wire(&w, &f);
	assert_int_equal(f.type, SPOP_FRM_HAPROXY_HELLO);
	assert_int_equal(f.flags, SPOP_FL_FIN);
	assert_int_equal(f.sid, 0);
	assert_int_equal(f.fid, 0);
	assert_int_equal(spop_hello_parse(f.payload, f.len, &h), 0);
	assert_true(h.has_versions);
	assert_true(h.version_ok);
	assert_view_str(&h.versions, "2.0");
	assert_true(h.has_frame_size);
	assert_int_equal(h.max_frame_size, 16380);
	assert_view_str(&h.caps, caps);
	assert_int_equal(h.cap_pipelining, pipelining);
	assert_view_str(&h.engine_id, engine_id);
	assert_int_equal(h.healthcheck, healthcheck);
	assert_true(view_in(&h.versions, f.payload, f.payload + f.len));
	assert_true(view_in(&h.caps, f.payload, f.payload + f.len));
	assert_true(view_in(&h.engine_id, f.payload, f.payload + f.len));

	assert_int_equal(spop_frame_size_negotiate(&h, 16380, &out), 0);
	assert_int_equal(out, 16380);
	assert_int_equal(spop_frame_size_negotiate(&h, 65532, &out), 0);
	assert_int_equal(out, 16380);
	assert_int_equal(spop_frame_size_negotiate(&h, 4096, &out), 0);
	assert_int_equal(out, 4096);
	blob_free(&w);
}

static void test_spop_hello_26(void **state)
{
	(void)state;
	check_haproxy_hello(HEX_HELLO_26, "pipelining,async", true,
			    "b7221426-38a6-4339-a6e1-666299755845", false);
	reencode_identical(HEX_HELLO_26);
}

static void test_spop_hello_33(void **state)
{
	(void)state;
	check_haproxy_hello(HEX_HELLO_33, "pipelining", true,
			    "c3440e06-9092-4f17-abb7-f07e9e7fedf2", false);
	reencode_identical(HEX_HELLO_33);
}

static void test_spop_hello_healthcheck(void **state)
{
	(void)state;
	check_haproxy_hello(HEX_HELLO_HC, "", false, "", true);
	reencode_identical(HEX_HELLO_HC);
}

/* Builds a HELLO payload from (key, value) pairs into an exactly sized buffer. */
struct kv {
	const char *key;
	struct spop_data val;
};

static struct blob kv_payload(const struct kv *kvs, size_t n)
{
	uint8_t tmp[1024];
	struct spop_wbuf w;
	struct blob b;
	size_t i;

	spop_wbuf_init(&w, tmp, sizeof(tmp));
	for (i = 0; i < n; i++)
		spop_put_kv(&w, kvs[i].key, &kvs[i].val);
	assert_false(w.overflow);
	b.p = dup_exact(tmp, w.len);
	b.len = w.len;
	return b;
}

/* The payload stays alive (views in <h> point into it) until the next call. */
static struct blob hello_payload;

static int hello_of(const struct kv *kvs, size_t n, struct spop_hello *h)
{
	blob_free(&hello_payload);
	hello_payload = kv_payload(kvs, n);
	return spop_hello_parse(hello_payload.p, hello_payload.len, h);
}

static void test_spop_hello_versions(void **state)
{
	static const struct {
		const char *versions;
		int ret;
	} cases[] = {
		{"2.0", 0},
		{"2.1", 0},
		{"2", 0},
		{"1.0,2.0", 0},
		{"1.0, 2.0", 0},
		{" 1.0 , 2.0 ", 0},
		{"2.0,3.0", 0},
		{"3.0, 2.5", 0},
		{"  2.0", 0},
		{"1.0", -SPOP_ST_BAD_VSN},
		{"3.0", -SPOP_ST_BAD_VSN},
		{"1.0,3.0", -SPOP_ST_BAD_VSN},
		{"", -SPOP_ST_BAD_VSN},
		{" ", -SPOP_ST_BAD_VSN},
		{",", -SPOP_ST_BAD_VSN},
		{"12.0", -SPOP_ST_BAD_VSN},
		{"22.0", -SPOP_ST_BAD_VSN},
		{"0.2", -SPOP_ST_BAD_VSN},
		{"1.2,", -SPOP_ST_BAD_VSN},
		{"2_0", -SPOP_ST_BAD_VSN},
		{"2-1, 1.0", -SPOP_ST_BAD_VSN},
	};
	struct spop_hello h;
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		struct kv kvs[] = {
			{"supported-versions", D_str(cases[i].versions)},
			{"max-frame-size", spop_uint32(16380)},
			{"capabilities", D_str("pipelining")},
		};
		int r = hello_of(kvs, ARRAY_SIZE(kvs), &h);

		if (r != cases[i].ret)
			fail_msg("supported-versions \"%s\": got %d, expected %d", cases[i].versions,
				 r, cases[i].ret);
		assert_true(h.has_versions);
		assert_int_equal(h.version_ok, cases[i].ret == 0);
	}

	/* absent supported-versions */
	{
		struct kv kvs[] = {
			{"max-frame-size", spop_uint32(16380)},
			{"capabilities", D_str("pipelining")},
			{"engine-id", D_str("x")},
		};

		assert_int_equal(hello_of(kvs, ARRAY_SIZE(kvs), &h), -SPOP_ST_NO_VSN);
		assert_false(h.has_versions);
		assert_int_equal(hello_of(kvs, 0, &h), -SPOP_ST_NO_VSN);
	}
	blob_free(&hello_payload);
}

static void test_spop_hello_fields(void **state)
{
	struct spop_hello h;
	uint32_t out = 0;

	(void)state;
	/* max-frame-size of any integer type; unknown keys of every type skipped */
	{
		const struct spop_data sizes[] = {D_i32(4096), spop_uint32(4096), spop_int64(4096),
						  D_u64(4096)};
		size_t i;

		for (i = 0; i < ARRAY_SIZE(sizes); i++) {
			struct kv kvs[] = {
				{"x-unknown-null", D_null()},
				{"x-unknown-bool", spop_bool(true)},
				{"x-unknown-ipv6", D_ipv6(V6_1)},
				{"x-unknown-bin", D_bin("\0\1\2", 3)},
				{"supported-versions", D_str("2.0")},
				{"x-unknown-ipv4", D_ipv4(1, 2, 3, 4)},
				{"max-frame-size", sizes[i]},
				{"capabilities", D_str("async, pipelining")},
				{"x-unknown-int", spop_int64(-1)},
				{"engine-id", D_str("eng")},
			};

			assert_int_equal(hello_of(kvs, ARRAY_SIZE(kvs), &h), 0);
			assert_true(h.has_frame_size);
			assert_int_equal(h.max_frame_size, 4096);
			assert_true(h.cap_pipelining);
			assert_false(h.healthcheck);
			assert_view_str(&h.engine_id, "eng");
			assert_int_equal(spop_frame_size_negotiate(&h, 16380, &out), 0);
			assert_int_equal(out, 4096);
		}
	}
	/* capabilities without pipelining */
	{
		static const char *const no[] = {"", "async", "pipelining2", "xpipelining",
						  "async,fragmentation", "pipe,lining"};
		size_t i;

		for (i = 0; i < ARRAY_SIZE(no); i++) {
			struct kv kvs[] = {
				{"supported-versions", D_str("2.0")},
				{"capabilities", D_str(no[i])},
			};

			assert_int_equal(hello_of(kvs, ARRAY_SIZE(kvs), &h), 0);
			assert_false(h.cap_pipelining);
			assert_view_str(&h.caps, no[i]);
		}
	}
	/* healthcheck false, no frame size: negotiation uses 16380 */
	{
		struct kv kvs[] = {
			{"healthcheck", spop_bool(false)},
			{"supported-versions", D_str("2.0")},
		};

		assert_int_equal(hello_of(kvs, ARRAY_SIZE(kvs), &h), 0);
		assert_false(h.healthcheck);
		assert_false(h.has_frame_size);
		assert_false(h.cap_pipelining);
		assert_int_equal(h.engine_id.len, 0);
		assert_int_equal(spop_frame_size_negotiate(&h, 65532, &out), 0);
		assert_int_equal(out, SPOP_FRAME_SIZE_DFLT);
		assert_int_equal(spop_frame_size_negotiate(&h, 1024, &out), 0);
		assert_int_equal(out, 1024);
	}
	blob_free(&hello_payload);
}

static void test_spop_hello_malformed(void **state)
{
	struct spop_hello h;
	struct blob b;
	static const char *const bad[] = {
		/* key truncated */
		"12 737570706f72",
		/* value missing */
		"12 737570706f727465642d76657273696f6e73",
		/* value string truncated */
		"12 737570706f727465642d76657273696f6e73 08 03 32 2e",
		/* reserved type nibble in an unknown key's value */
		"03 666f6f 0a 00 12 737570706f727465642d76657273696f6e73 08 03 32 2e 30",
		/* reserved type nibble in the versions value */
		"12 737570706f727465642d76657273696f6e73 0f",
		/* max-frame-size varint truncated */
		"12 737570706f727465642d76657273696f6e73 08 03 32 2e 30 0e 6d61782d6672616d652d73697a65 03 fc f0",
		/* trailing garbage byte (a key of length 1 with no byte behind) */
		"12 737570706f727465642d76657273696f6e73 08 03 32 2e 30 01",
	};
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(bad); i++) {
		b = hex(bad[i]);
		if (spop_hello_parse(b.p, b.len, &h) != INV)
			fail_msg("malformed hello #%zu not rejected as INVALID", i);
		blob_free(&b);
	}
}

static void test_spop_frame_size_negotiate(void **state)
{
	static const struct {
		bool has;
		uint32_t theirs, ours;
		int ret;
		uint32_t out;
	} cases[] = {
		{true, 16380, 16380, 0, 16380},
		{true, 16380, 65532, 0, 16380},
		{true, 65532, 16380, 0, 16380},
		{true, 65532, 65532, 0, 65532},
		{true, 256, 16380, 0, 256},
		{true, 257, 300, 0, 257},
		{true, 1000, 256, 0, 256},
		{true, UINT32_MAX, 16380, 0, 16380},
		{true, 255, 16380, -SPOP_ST_BAD_FRAME_SIZE, 0},
		{true, 0, 16380, -SPOP_ST_BAD_FRAME_SIZE, 0},
		{true, 1, 1, -SPOP_ST_BAD_FRAME_SIZE, 0},
		{false, 0, 16380, 0, 16380},
		{false, 0, 65532, 0, 16380},
		{false, 0, 8192, 0, 8192},
	};
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		struct spop_hello h;
		uint32_t out = 12345;
		int r;

		memset(&h, 0, sizeof(h));
		h.has_versions = h.version_ok = true;
		h.has_frame_size = cases[i].has;
		h.max_frame_size = cases[i].theirs;
		r = spop_frame_size_negotiate(&h, cases[i].ours, &out);
		if (r != cases[i].ret)
			fail_msg("negotiate #%zu: got %d expected %d", i, r, cases[i].ret);
		if (r == 0)
			assert_int_equal(out, cases[i].out);
	}
}

static void test_spop_agent_hello_vector(void **state)
{
	struct blob w = hex(HEX_AGENT_HELLO);
	struct spop_frame f;
	struct spop_rd rd;
	struct spop_str key;
	struct spop_data val;
	uint8_t buf[256];
	struct spop_wbuf wb;
	char caps[64];
	size_t sz;

	(void)state;
	/* decode: version "2.0", max-frame-size UINT32 16380, capabilities "pipelining" */
	decode_wire(&w, &f);
	assert_int_equal(f.type, SPOP_FRM_AGENT_HELLO);
	assert_int_equal(f.flags, SPOP_FL_FIN);
	assert_int_equal(f.sid, 0);
	assert_int_equal(f.fid, 0);
	rd = rd_of(f.payload, f.len);
	assert_int_equal(spop_kv_next(&rd, &key, &val), 1);
	assert_view_str(&key, "version");
	assert_int_equal(val.type, SPOP_T_STR);
	assert_view_str(&val.v.s, "2.0");
	assert_int_equal(spop_kv_next(&rd, &key, &val), 1);
	assert_view_str(&key, "max-frame-size");
	assert_int_equal(val.type, SPOP_T_UINT32);
	assert_int_equal(val.v.u, 16380);
	assert_int_equal(spop_kv_next(&rd, &key, &val), 1);
	assert_view_str(&key, "capabilities");
	assert_int_equal(val.type, SPOP_T_STR);
	cstr_of(caps, sizeof(caps), &val.v.s);
	assert_string_equal(caps, "pipelining");
	assert_int_equal(spop_kv_next(&rd, &key, &val), 0);
	assert_int_equal(spop_kv_next(&rd, &key, &val), 0);

	/* build it from that meaning: byte-identical */
	spop_wbuf_init(&wb, buf, sizeof(buf));
	assert_int_equal(spop_agent_hello_build(&wb, 16380, caps), 68);
	assert_int_equal(wb.len, 68);
	assert_memory_equal(buf, w.p, 68);
	/* and by hand with the lower-level API */
	reencode_identical(HEX_AGENT_HELLO);

	/* appended after other bytes: still the same frame at the offset */
	spop_wbuf_init(&wb, buf, sizeof(buf));
	spop_put_bytes(&wb, "xyz", 3);
	assert_int_equal(spop_agent_hello_build(&wb, 16380, "pipelining"), 68);
	assert_int_equal(wb.len, 71);
	assert_memory_equal(buf + 3, w.p, 68);

	/* every buffer too small: -TOO_BIG, no write past the buffer (ASan) */
	for (sz = 0; sz < 68; sz++) {
		uint8_t *p = malloc(sz ? sz : 1);

		spop_wbuf_init(&wb, p, sz);
		assert_int_equal(spop_agent_hello_build(&wb, 16380, "pipelining"), TOOBIG);
		assert_true(wb.overflow);
		assert_true(wb.len <= sz);
		free(p);
	}
	/* exactly sized buffer fits */
	{
		uint8_t *p = malloc(68);

		spop_wbuf_init(&wb, p, 68);
		assert_int_equal(spop_agent_hello_build(&wb, 16380, "pipelining"), 68);
		assert_false(wb.overflow);
		assert_memory_equal(p, w.p, 68);
		free(p);
	}
	/* other values: the max-frame-size varint size changes the frame length */
	spop_wbuf_init(&wb, buf, sizeof(buf));
	assert_int_equal(spop_agent_hello_build(&wb, 65532, ""), 68 - 10);
	{
		struct blob x;

		x.p = dup_exact(buf, wb.len);
		x.len = wb.len;
		decode_wire(&x, &f);
		rd = rd_of(f.payload, f.len);
		assert_int_equal(spop_kv_next(&rd, &key, &val), 1);
		assert_int_equal(spop_kv_next(&rd, &key, &val), 1);
		assert_view_str(&key, "max-frame-size");
		assert_int_equal(val.v.u, 65532);
		assert_int_equal(spop_kv_next(&rd, &key, &val), 1);
		assert_view_str(&key, "capabilities");
		assert_int_equal(val.v.s.len, 0);
		assert_int_equal(spop_kv_next(&rd, &key, &val), 0);
		blob_free(&x);
	}
	blob_free(&w);
}

/* ------------------------------------------------------------------------ */
/* NOTIFY (SPOP.md 5.1, 9.2, 9.3)                                             */
/* ------------------------------------------------------------------------ */

struct exp_arg {
	const char *name;
	struct spop_data val;
};

static void check_notify_req(const char *hexstr, uint64_t sid, uint64_t fid)
{
	static const uint8_t bin[3] = {0x00, 0xff, 0x10};
	const struct exp_arg exp[13] = {
		{"ua", D_str("curl-test/1.0")},
		{"ip", D_ipv4(127, 0, 0, 1)},
		{"path", D_str("/some/path")},
		{"num", spop_int64(41)},
		{"meth", D_str("GET")},
		{"flag", spop_bool(true)},
		{"missing", D_null()},
		{"v6", D_ipv6(V6_2)},
		{"bin", D_bin(bin, 3)},
		{"neg", spop_int64(-2)},
		{"big", spop_int64(300000)},
		{"empty", D_str("")},
		{"", D_ipv4(127, 0, 0, 1)},
	};
	struct blob w = hex(hexstr);
	struct spop_frame f;
	struct spop_rd rd;
	struct spop_msg m;
	struct spop_str name;
	struct spop_data val;
	unsigned i;

	decode_wire(&w, &f);
	assert_int_equal(w.len, 161);
	assert_int_equal(f.type, SPOP_FRM_NOTIFY);
	assert_int_equal(f.flags, SPOP_FL_FIN);
	assert_true(f.sid == sid);
	assert_true(f.fid == fid);
	assert_int_equal(f.len, 157 - 7);
	rd = rd_of(f.payload, f.len);
	assert_int_equal(spop_msg_next(&rd, &m), 1);
	assert_view_str(&m.name, "req-msg");
	assert_int_equal(m.nb_args, 13);
	assert_true(view_in(&m.name, f.payload, f.payload + f.len));
	for (i = 0; i < 13; i++) {
		int64_t iv;

		assert_int_equal(spop_arg_next(&m, &name, &val), 1);
		if (!spop_str_eq(&name, exp[i].name))
			fail_msg("arg %u: name mismatch (expected \"%s\")", i, exp[i].name);
		assert_true(view_in(&name, f.payload, f.payload + f.len));
		if (!data_eq(&val, &exp[i].val))
			fail_msg("arg %u (%s): value mismatch, got type %u", i, exp[i].name, val.type);
		if (val.type == SPOP_T_STR || val.type == SPOP_T_BIN)
			assert_true(view_in(&val.v.s, f.payload, f.payload + f.len));
		if (val.type == SPOP_T_INT64) {
			assert_true(spop_data_int(&val, &iv));
			assert_true(iv == exp[i].val.v.i);
		}
	}
	assert_int_equal(m.args_read, 13);
	assert_int_equal(spop_arg_next(&m, &name, &val), 0);
	assert_int_equal(spop_arg_next(&m, &name, &val), 0);
	assert_int_equal(spop_msg_next(&rd, &m), 0);
	assert_int_equal(spop_msg_next(&rd, &m), 0);
	assert_ptr_equal(rd.p, f.payload + f.len);
	blob_free(&w);
	reencode_identical(hexstr);
}

static void test_spop_notify_26(void **state)
{
	(void)state;
	check_notify_req(HEX_NOTIFY_26, 0, 1);
}

static void test_spop_notify_33(void **state)
{
	(void)state;
	check_notify_req(HEX_NOTIFY_33, 1, 1);
}

static void check_res_notify(const char *hexstr, uint64_t sid, uint64_t fid)
{
	struct blob w = hex(hexstr);
	struct spop_frame f;
	struct spop_rd rd;
	struct spop_msg m;
	struct spop_str name;
	struct spop_data val;

	decode_wire(&w, &f);
	assert_int_equal(f.type, SPOP_FRM_NOTIFY);
	assert_int_equal(f.flags, SPOP_FL_FIN);
	assert_true(f.sid == sid);
	assert_true(f.fid == fid);
	rd = rd_of(f.payload, f.len);
	assert_int_equal(spop_msg_next(&rd, &m), 1);
	assert_view_str(&m.name, "res-msg");
	assert_int_equal(m.nb_args, 1);
	assert_int_equal(spop_arg_next(&m, &name, &val), 1);
	assert_view_str(&name, "status");
	assert_data_eq(&val, &(struct spop_data){.type = SPOP_T_INT64, .v.i = 200});
	assert_int_equal(spop_arg_next(&m, &name, &val), 0);
	assert_int_equal(spop_msg_next(&rd, &m), 0);
	blob_free(&w);
	reencode_identical(hexstr);
}

static void test_spop_response_group_notify(void **state)
{
	(void)state;
	check_res_notify(HEX_RES_NOTIFY_26, 0, 2);
	check_res_notify(HEX_RES_NOTIFY_33, 3, 1);
}

static void test_spop_notify_empty_payload(void **state)
{
	struct blob w = hex("00000007 03 00000001 01 01");
	struct spop_frame f;
	struct spop_rd rd;
	struct spop_msg m;
	volatile size_t zero = 0;       /* a 0-byte block: ASan reports any read of it */
	uint8_t *none = malloc(zero);   /* (a literal 0 is -Walloc-size on GCC 14) */

	(void)state;
	decode_wire(&w, &f);
	assert_int_equal(f.len, 0);
	rd = rd_of(f.payload, f.len);
	assert_int_equal(spop_msg_next(&rd, &m), 0);
	rd = rd_of(none, 0);
	assert_int_equal(spop_msg_next(&rd, &m), 0);
	free(none);
	blob_free(&w);
}

static int msgs_of(const char *payload_hex, unsigned *nmsgs, unsigned *nargs)
{
	struct blob b = hex(payload_hex);
	struct spop_rd rd = rd_of(b.p, b.len);
	struct spop_msg m;
	struct spop_str name;
	struct spop_data val;
	int r, a;

	*nmsgs = *nargs = 0;
	while ((r = spop_msg_next(&rd, &m)) == 1) {
		(*nmsgs)++;
		while ((a = spop_arg_next(&m, &name, &val)) == 1)
			(*nargs)++;
		assert_int_equal(a, 0); /* args were validated by spop_msg_next() */
	}
	blob_free(&b);
	return r;
}

static void test_spop_notify_nb_args_mismatch(void **state)
{
	unsigned nm, na;

	(void)state;
	/* nb-args 255 with a single arg present */
	assert_int_equal(msgs_of("01 6d ff 01 61 00", &nm, &na), INV);
	assert_int_equal(nm, 0);
	/* nb-args 2 with one present */
	assert_int_equal(msgs_of("01 6d 02 01 61 04 29", &nm, &na), INV);
	/* nb-args 1 with nothing */
	assert_int_equal(msgs_of("01 6d 01", &nm, &na), INV);
	/* nb-args byte missing */
	assert_int_equal(msgs_of("01 6d", &nm, &na), INV);
	/* arg name present but its value missing */
	assert_int_equal(msgs_of("01 6d 01 01 61", &nm, &na), INV);
	/* second message broken: the first is still returned, then an error */
	assert_int_equal(msgs_of("01 6d 01 01 61 00  01 6e 03 00 00 00 00", &nm, &na), INV);
	assert_int_equal(nm, 1);
	assert_int_equal(na, 1);
	/* bad type nibble in an arg */
	assert_int_equal(msgs_of("01 6d 01 01 61 0a", &nm, &na), INV);
	assert_int_equal(msgs_of("01 6d 02 01 61 00 01 62 fc 00 00 00", &nm, &na), INV);

	/* nb-args 0, empty names, and 255 args really present */
	assert_int_equal(msgs_of("01 6d 00", &nm, &na), 0);
	assert_int_equal(nm, 1);
	assert_int_equal(na, 0);
	assert_int_equal(msgs_of("00 01 00 00", &nm, &na), 0);
	assert_int_equal(nm, 1);
	assert_int_equal(na, 1);
	{
		uint8_t tmp[3 + 255 * 2];
		size_t n = 0, i;
		struct spop_rd rd;
		struct spop_msg m;
		struct spop_str name;
		struct spop_data val;
		uint8_t *p;

		tmp[n++] = 1;
		tmp[n++] = 'm';
		tmp[n++] = 255;
		for (i = 0; i < 255; i++) {
			tmp[n++] = 0; /* unnamed */
			tmp[n++] = 0x11;
		}
		p = dup_exact(tmp, n);
		rd = rd_of(p, n);
		assert_int_equal(spop_msg_next(&rd, &m), 1);
		assert_int_equal(m.nb_args, 255);
		for (i = 0; i < 255; i++) {
			assert_int_equal(spop_arg_next(&m, &name, &val), 1);
			assert_int_equal(name.len, 0);
			assert_int_equal(val.type, SPOP_T_BOOL);
			assert_true(val.v.b);
		}
		assert_int_equal(spop_arg_next(&m, &name, &val), 0);
		assert_int_equal(spop_msg_next(&rd, &m), 0);
		/* one byte less: the last arg is missing */
		free(p);
		p = dup_exact(tmp, n - 1);
		rd = rd_of(p, n - 1);
		assert_int_equal(spop_msg_next(&rd, &m), INV);
		free(p);
	}
}

static void test_spop_notify_several_messages(void **state)
{
	uint8_t tmp[256];
	struct spop_wbuf w;
	struct spop_data v;
	struct spop_rd rd;
	struct spop_msg m;
	struct spop_str name;
	struct spop_data val;
	uint8_t *p;
	size_t start;
	struct spop_frame f;

	(void)state;
	spop_wbuf_init(&w, tmp, sizeof(tmp));
	start = spop_frame_begin(&w, SPOP_FRM_NOTIFY, SPOP_FL_FIN, 5, 1);
	spop_put_str(&w, "one", 3);
	spop_put_u8(&w, 2);
	spop_put_str(&w, "a", 1);
	v = spop_int64(-1);
	spop_put_data(&w, &v);
	spop_put_str(&w, "b", 1);
	v = D_str("bee");
	spop_put_data(&w, &v);
	spop_put_str(&w, "", 0);
	spop_put_u8(&w, 0);
	spop_put_str(&w, "three", 5);
	spop_put_u8(&w, 1);
	spop_put_str(&w, "c", 1);
	v = D_ipv4(10, 0, 0, 1);
	spop_put_data(&w, &v);
	assert_int_equal(spop_frame_end(&w, start), (int)w.len);
	p = dup_exact(tmp, w.len);
	assert_int_equal(spop_frame_decode(p + 4, w.len - 4, &f), 0);
	assert_int_equal(f.sid, 5);
	rd = rd_of(f.payload, f.len);

	/* first message: read only one of its two args, then move on */
	assert_int_equal(spop_msg_next(&rd, &m), 1);
	assert_view_str(&m.name, "one");
	assert_int_equal(m.nb_args, 2);
	assert_int_equal(spop_arg_next(&m, &name, &val), 1);
	assert_view_str(&name, "a");
	assert_int_equal(val.type, SPOP_T_INT64);
	assert_int_equal(val.v.i, -1);
	/* second message: empty name, no args */
	assert_int_equal(spop_msg_next(&rd, &m), 1);
	assert_int_equal(m.name.len, 0);
	assert_int_equal(m.nb_args, 0);
	assert_int_equal(spop_arg_next(&m, &name, &val), 0);
	/* third */
	assert_int_equal(spop_msg_next(&rd, &m), 1);
	assert_view_str(&m.name, "three");
	assert_int_equal(spop_arg_next(&m, &name, &val), 1);
	assert_view_str(&name, "c");
	assert_data_eq(&val, &(struct spop_data){.type = SPOP_T_IPV4, .v.ipv4 = {10, 0, 0, 1}});
	assert_int_equal(spop_arg_next(&m, &name, &val), 0);
	assert_int_equal(spop_msg_next(&rd, &m), 0);
	free(p);
}

/* ------------------------------------------------------------------------ */
/* ACK (SPOP.md 5.2, 9.2-9.4)                                                */
/* ------------------------------------------------------------------------ */

struct exp_action {
	uint8_t type;
	uint8_t scope;
	const char *name;
	struct spop_data val;
};

/* Checks the decoded actions of <hexstr> and rebuilds the frame from <exp>. */
static void check_ack(const char *hexstr, uint64_t sid, uint64_t fid,
		      const struct exp_action *exp, size_t n)
{
	struct blob w = hex(hexstr);
	struct spop_frame f;
	struct spop_rd rd;
	struct action a;
	uint8_t out[512];
	struct spop_wbuf wb;
	size_t i, start;

	decode_wire(&w, &f);
	assert_int_equal(f.type, SPOP_FRM_ACK);
	assert_int_equal(f.flags, SPOP_FL_FIN);
	assert_true(f.sid == sid);
	assert_true(f.fid == fid);
	rd = rd_of(f.payload, f.len);
	for (i = 0; i < n; i++) {
		assert_int_equal(ack_next(&rd, &a), 1);
		assert_int_equal(a.type, exp[i].type);
		assert_int_equal(a.scope, exp[i].scope);
		if (!spop_str_eq(&a.name, exp[i].name))
			fail_msg("action %zu: name mismatch (expected %s)", i, exp[i].name);
		if (a.type == SPOP_ACT_SET_VAR && !data_eq(&a.val, &exp[i].val))
			fail_msg("action %zu (%s): value mismatch", i, exp[i].name);
	}
	assert_int_equal(ack_next(&rd, &a), 0);

	/* re-encode from the documented meaning */
	spop_wbuf_init(&wb, out, sizeof(out));
	start = spop_frame_begin(&wb, SPOP_FRM_ACK, SPOP_FL_FIN, sid, fid);
	for (i = 0; i < n; i++) {
		if (exp[i].type == SPOP_ACT_SET_VAR)
			spop_put_set_var(&wb, exp[i].scope, exp[i].name, strlen(exp[i].name),
					 &exp[i].val);
		else
			spop_put_unset_var(&wb, exp[i].scope, exp[i].name, strlen(exp[i].name));
	}
	assert_int_equal(spop_frame_end(&wb, start), (int)w.len);
	assert_memory_equal(out, w.p, w.len);
	blob_free(&w);

	/* and from the decoded values */
	reencode_identical(hexstr);
}

static void test_spop_ack_vector(void **state)
{
	static const uint8_t bin[3] = {0x00, 0x01, 0xfe};
	const struct exp_action exp[] = {
		{SPOP_ACT_SET_VAR, SPOP_SCOPE_TXN, "ua", D_str("curl-test/1.0")},
		{SPOP_ACT_SET_VAR, SPOP_SCOPE_TXN, "ip", D_ipv4(127, 0, 0, 1)},
		{SPOP_ACT_SET_VAR, SPOP_SCOPE_TXN, "num", spop_int64(42)},
		{SPOP_ACT_SET_VAR, SPOP_SCOPE_TXN, "neg", spop_int64(-5)},
		{SPOP_ACT_SET_VAR, SPOP_SCOPE_TXN, "big", spop_uint32(300000)},
		{SPOP_ACT_SET_VAR, SPOP_SCOPE_TXN, "flag", spop_bool(true)},
		{SPOP_ACT_SET_VAR, SPOP_SCOPE_TXN, "flagf", spop_bool(false)},
		{SPOP_ACT_SET_VAR, SPOP_SCOPE_TXN, "v6", D_ipv6(V6_1)},
		{SPOP_ACT_SET_VAR, SPOP_SCOPE_TXN, "bin", D_bin(bin, 3)},
		{SPOP_ACT_SET_VAR, SPOP_SCOPE_SESS, "sessvar", D_str("s-ok")},
		{SPOP_ACT_SET_VAR, SPOP_SCOPE_REQ, "reqvar", D_str("r-ok")},
		{SPOP_ACT_SET_VAR, SPOP_SCOPE_TXN, "notdeclared", D_str("x")},
		{SPOP_ACT_SET_VAR, SPOP_SCOPE_TXN, "nulled", D_null()},
		{SPOP_ACT_UNSET_VAR, SPOP_SCOPE_TXN, "nope", D_null()},
	};

	(void)state;
	check_ack(HEX_ACK_26, 0, 1, exp, ARRAY_SIZE(exp));
	check_ack(HEX_ACK_33, 1, 1, exp, ARRAY_SIZE(exp));
}

static void test_spop_response_group_ack(void **state)
{
	const struct exp_action exp[] = {
		{SPOP_ACT_SET_VAR, SPOP_SCOPE_TXN, "resvar", D_str("resp-ok")},
		{SPOP_ACT_SET_VAR, SPOP_SCOPE_TXN, "status_seen", D_i32(200)},
	};

	(void)state;
	check_ack(HEX_RES_ACK, 0, 2, exp, ARRAY_SIZE(exp));
}

static void test_spop_constructed_acks(void **state)
{
	const struct exp_action score[] = {
		{SPOP_ACT_SET_VAR, SPOP_SCOPE_TXN, "score", D_i32(87)},
	};

	(void)state;
	check_ack(HEX_EMPTY_ACK, 3, 1, NULL, 0);
	check_ack(HEX_SCORE_ACK, 1, 1, score, ARRAY_SIZE(score));
}

/* ------------------------------------------------------------------------ */
/* DISCONNECT (SPOP.md 4.3, 9.4)                                              */
/* ------------------------------------------------------------------------ */

static void check_disconnect(const char *hexstr, uint8_t type, uint32_t status, const char *msg)
{
	struct blob w = hex(hexstr);
	struct spop_frame f;
	struct spop_disconnect d;

	decode_wire(&w, &f);
	assert_int_equal(f.type, type);
	assert_int_equal(f.flags, SPOP_FL_FIN);
	assert_int_equal(f.sid, 0);
	assert_int_equal(f.fid, 0);
	assert_int_equal(spop_disconnect_parse(f.payload, f.len, &d), 0);
	assert_int_equal(d.status, status);
	assert_view_str(&d.message, msg);
	assert_true(view_in(&d.message, f.payload, f.payload + f.len));
	blob_free(&w);
	reencode_identical(hexstr);
}

static void test_spop_disconnect_vectors(void **state)
{
	(void)state;
	check_disconnect(HEX_DISC_NORMAL, SPOP_FRM_HAPROXY_DISCON, 0, "normal");
	check_disconnect(HEX_DISC_TIMEOUT, SPOP_FRM_HAPROXY_DISCON, 2, "a timeout occurred");
	check_disconnect(HEX_DISC_FRAG, SPOP_FRM_HAPROXY_DISCON, 10, "fragmentation not supported");
	check_disconnect(HEX_AGENT_DISC_99, SPOP_FRM_AGENT_DISCON, 99, "agent says bye");
	check_disconnect(HEX_AGENT_DISC_0, SPOP_FRM_AGENT_DISCON, 0, "");
}

static void check_agent_disconnect_build(const char *hexstr, uint32_t status, const char *msg)
{
	struct blob w = hex(hexstr);
	uint8_t buf[512];
	struct spop_wbuf wb;
	size_t sz;

	spop_wbuf_init(&wb, buf, sizeof(buf));
	assert_int_equal(spop_agent_disconnect_build(&wb, status, msg), (int)w.len);
	assert_int_equal(wb.len, w.len);
	assert_memory_equal(buf, w.p, w.len);
	for (sz = 0; sz < w.len; sz++) {
		uint8_t *p = malloc(sz ? sz : 1);

		spop_wbuf_init(&wb, p, sz);
		assert_int_equal(spop_agent_disconnect_build(&wb, status, msg), TOOBIG);
		free(p);
	}
	blob_free(&w);
}

static void test_spop_agent_disconnect_build(void **state)
{
	char longmsg[400];
	uint8_t buf[600];
	struct spop_wbuf wb;
	struct blob x;
	struct spop_frame f;
	struct spop_disconnect d;
	int n;

	(void)state;
	check_agent_disconnect_build(HEX_AGENT_DISC_99, 99, "agent says bye");
	check_agent_disconnect_build(HEX_AGENT_DISC_0, 0, "");

	/* HAProxy 2.6 rejects a message over 255 bytes (SPOP.md 4.3): the frame stays valid */
	memset(longmsg, 'm', sizeof(longmsg) - 1);
	longmsg[sizeof(longmsg) - 1] = '\0';
	spop_wbuf_init(&wb, buf, sizeof(buf));
	n = spop_agent_disconnect_build(&wb, SPOP_ST_TOO_BIG, longmsg);
	assert_true(n > 0);
	x.p = dup_exact(buf, wb.len);
	x.len = wb.len;
	decode_wire(&x, &f);
	assert_int_equal(f.type, SPOP_FRM_AGENT_DISCON);
	assert_int_equal(spop_disconnect_parse(f.payload, f.len, &d), 0);
	assert_int_equal(d.status, SPOP_ST_TOO_BIG);
	assert_true(d.message.len <= 255);
	assert_memory_equal(d.message.p, longmsg, d.message.len);
	blob_free(&x);
}

static void test_spop_disconnect_parse_variants(void **state)
{
	struct spop_disconnect d;
	struct blob b;

	(void)state;
	/* nothing at all: 99, empty message */
	b = kv_payload(NULL, 0);
	assert_int_equal(spop_disconnect_parse(b.p, b.len, &d), 0);
	assert_int_equal(d.status, SPOP_ST_UNKNOWN);
	assert_int_equal(d.message.len, 0);
	blob_free(&b);
	/* only a message */
	{
		struct kv kvs[] = {{"message", D_str("bye")}};

		b = kv_payload(kvs, ARRAY_SIZE(kvs));
		assert_int_equal(spop_disconnect_parse(b.p, b.len, &d), 0);
		assert_int_equal(d.status, SPOP_ST_UNKNOWN);
		assert_view_str(&d.message, "bye");
		blob_free(&b);
	}
	/* status-code of each integer type, unknown keys around */
	{
		const struct spop_data st[] = {D_i32(3), spop_uint32(3), spop_int64(3), D_u64(3)};
		size_t i;

		for (i = 0; i < ARRAY_SIZE(st); i++) {
			struct kv kvs[] = {
				{"x-foo", D_ipv6(V6_1)},
				{"status-code", st[i]},
				{"x-bar", D_bin("\0", 1)},
				{"message", D_str("frame is too big")},
				{"x-baz", D_null()},
			};

			b = kv_payload(kvs, ARRAY_SIZE(kvs));
			assert_int_equal(spop_disconnect_parse(b.p, b.len, &d), 0);
			assert_int_equal(d.status, 3);
			assert_view_str(&d.message, "frame is too big");
			blob_free(&b);
		}
	}
	/* malformed */
	{
		static const char *const bad[] = {
			"0b 7374617475732d636f6465",            /* key, no value */
			"0b 7374617475732d636f6465 03",         /* value varint missing */
			"0b 7374617475732d636f6465 03 f0",      /* value varint truncated */
			"0b 7374617475732d636f6465 0b",         /* reserved type */
			"07 6d657373616765 08 05 61 62",        /* message truncated */
			"0b 7374617475",                        /* key truncated */
		};
		size_t i;

		for (i = 0; i < ARRAY_SIZE(bad); i++) {
			b = hex(bad[i]);
			assert_int_equal(spop_disconnect_parse(b.p, b.len, &d), INV);
			blob_free(&b);
		}
	}
}

static void test_spop_kv_next(void **state)
{
	struct blob b = hex("01 61 00 02 62 63 11");
	struct spop_rd rd = rd_of(b.p, b.len);
	struct spop_str k;
	struct spop_data v;
	size_t n;

	(void)state;
	assert_int_equal(spop_kv_next(&rd, &k, &v), 1);
	assert_view_str(&k, "a");
	assert_int_equal(v.type, SPOP_T_NULL);
	assert_int_equal(spop_kv_next(&rd, &k, &v), 1);
	assert_view_str(&k, "bc");
	assert_int_equal(v.type, SPOP_T_BOOL);
	assert_true(v.v.b);
	assert_int_equal(spop_kv_next(&rd, &k, &v), 0);
	assert_int_equal(spop_kv_next(&rd, &k, &v), 0);
	/* every cut inside the second pair is an error, at the boundaries it is an end */
	for (n = 0; n <= b.len; n++) {
		uint8_t *p = dup_exact(b.p, n);
		int r, last = 1;

		rd = rd_of(p, n);
		while ((r = spop_kv_next(&rd, &k, &v)) == 1)
			;
		last = r;
		if (n == 0 || n == 3 || n == b.len)
			assert_int_equal(last, 0);
		else
			assert_true(last < 0);
		free(p);
	}
	blob_free(&b);
}

/* ------------------------------------------------------------------------ */
/* Writing (SPOP.md 3, 5.2)                                                  */
/* ------------------------------------------------------------------------ */

static void check_put(const struct spop_data *d, const char *exp_hex)
{
	struct blob e = hex(exp_hex);
	uint8_t buf[64];
	struct spop_wbuf w;
	struct spop_rd rd;
	struct spop_data back;
	uint8_t *p;

	spop_wbuf_init(&w, buf, sizeof(buf));
	spop_put_data(&w, d);
	assert_false(w.overflow);
	assert_int_equal(w.len, e.len);
	assert_memory_equal(buf, e.p, e.len);
	p = dup_exact(buf, w.len);
	rd = rd_of(p, w.len);
	assert_int_equal(spop_data_decode(&rd, &back), (int)w.len);
	assert_data_eq(&back, d);
	free(p);
	blob_free(&e);
}

static void test_spop_put_data_each_type(void **state)
{
	static const uint8_t bin[3] = {0x00, 0x01, 0xfe};

	(void)state;
	check_put(&(struct spop_data){.type = SPOP_T_NULL}, "00");
	check_put(&(struct spop_data){.type = SPOP_T_BOOL, .v.b = false}, "01");
	check_put(&(struct spop_data){.type = SPOP_T_BOOL, .v.b = true}, "11");
	check_put(&(struct spop_data){.type = SPOP_T_INT32, .v.i = 87}, "02 57");
	check_put(&(struct spop_data){.type = SPOP_T_INT32, .v.i = 200}, "02 c8");
	check_put(&(struct spop_data){.type = SPOP_T_INT32, .v.i = -2},
		  "02 fe f0 fe fe fe fe fe fe fe 0e");
	check_put(&(struct spop_data){.type = SPOP_T_UINT32, .v.u = 16380}, "03 fc f0 06");
	check_put(&(struct spop_data){.type = SPOP_T_UINT32, .v.u = 300000}, "03 f0 af 91 00");
	check_put(&(struct spop_data){.type = SPOP_T_INT64, .v.i = 42}, "04 2a");
	check_put(&(struct spop_data){.type = SPOP_T_INT64, .v.i = -5},
		  "04 fb f0 fe fe fe fe fe fe fe 0e");
	check_put(&(struct spop_data){.type = SPOP_T_INT64, .v.i = INT64_MAX},
		  "04 ff f0 fe fe fe fe fe fe fe 06");
	check_put(&(struct spop_data){.type = SPOP_T_UINT64, .v.u = UINT64_MAX},
		  "05 ff f0 fe fe fe fe fe fe fe 0e");
	check_put(&(struct spop_data){.type = SPOP_T_IPV4, .v.ipv4 = {127, 0, 0, 1}}, "06 7f000001");
	{
		struct spop_data d = D_ipv6(V6_1);

		check_put(&d, "07 20010db8000000000000000000000001");
	}
	{
		struct spop_data d = D_str("");

		check_put(&d, "08 00");
		d = D_str("r-ok");
		check_put(&d, "08 04 722d6f6b");
		d = D_bin(bin, 3);
		check_put(&d, "09 03 0001fe");
		d = D_bin(NULL, 0);
		check_put(&d, "09 00");
	}
}

static void test_spop_put_data_roundtrip_random(void **state)
{
	static char text[300];
	int i;

	(void)state;
	for (i = 0; i < (int)sizeof(text); i++)
		text[i] = (char)(rnd() & 0xff);
	for (i = 0; i < 5000; i++) {
		struct spop_data d;
		uint8_t buf[400];
		struct spop_wbuf w;
		struct spop_rd rd;
		struct spop_data back;
		uint8_t *p;
		int j;

		memset(&d, 0, sizeof(d));
		d.type = (uint8_t)(rnd() % SPOP_T_COUNT);
		switch (d.type) {
		case SPOP_T_BOOL:
			d.v.b = rnd() & 1;
			break;
		case SPOP_T_INT32:
		case SPOP_T_INT64:
			d.v.i = (int64_t)(rnd() >> (rnd() % 64));
			if (rnd() & 1)
				d.v.i = -d.v.i;
			break;
		case SPOP_T_UINT32:
		case SPOP_T_UINT64:
			d.v.u = rnd() >> (rnd() % 64);
			break;
		case SPOP_T_IPV4:
		case SPOP_T_IPV6:
			for (j = 0; j < 16; j++)
				d.v.ipv6[j] = (uint8_t)rnd();
			break;
		case SPOP_T_STR:
		case SPOP_T_BIN:
			d.v.s.p = text;
			d.v.s.len = (size_t)(rnd() % sizeof(text));
			break;
		default:
			break;
		}
		spop_wbuf_init(&w, buf, sizeof(buf));
		spop_put_data(&w, &d);
		assert_false(w.overflow);
		/* flag nibble zero except BOOL true */
		if (d.type == SPOP_T_BOOL && d.v.b)
			assert_int_equal(buf[0], 0x11);
		else
			assert_int_equal(buf[0], d.type);
		p = dup_exact(buf, w.len);
		rd = rd_of(p, w.len);
		assert_int_equal(spop_data_decode(&rd, &back), (int)w.len);
		assert_data_eq(&back, &d);
		rd = rd_of(p, w.len);
		assert_int_equal(spop_data_skip(&rd), (int)w.len);
		free(p);
	}
}

static void test_spop_put_set_unset_var(void **state)
{
	uint8_t buf[64];
	struct spop_wbuf w;
	struct blob e;
	struct spop_data v;

	(void)state;
	spop_wbuf_init(&w, buf, sizeof(buf));
	v = D_i32(87);
	spop_put_set_var(&w, SPOP_SCOPE_TXN, "score", 5, &v);
	e = hex("01 03 02 05 73636f7265 02 57");
	assert_int_equal(w.len, e.len);
	assert_memory_equal(buf, e.p, e.len);
	blob_free(&e);

	spop_wbuf_init(&w, buf, sizeof(buf));
	spop_put_unset_var(&w, SPOP_SCOPE_TXN, "nope", 4);
	e = hex("02 02 02 04 6e6f7065");
	assert_int_equal(w.len, e.len);
	assert_memory_equal(buf, e.p, e.len);
	blob_free(&e);

	/* every scope byte is written raw; name_len is honoured (no strlen) */
	spop_wbuf_init(&w, buf, sizeof(buf));
	v = spop_bool(false);
	spop_put_set_var(&w, SPOP_SCOPE_PROC, "abcdef", 2, &v);
	spop_put_set_var(&w, SPOP_SCOPE_RES, "x", 1, &(struct spop_data){.type = SPOP_T_NULL});
	spop_put_unset_var(&w, SPOP_SCOPE_SESS, "yz", 2);
	e = hex("01 03 00 02 6162 01  01 03 04 01 78 00  02 02 01 02 797a");
	assert_int_equal(w.len, e.len);
	assert_memory_equal(buf, e.p, e.len);
	blob_free(&e);
}

static void test_spop_put_str_varint(void **state)
{
	uint8_t buf[400];
	struct spop_wbuf w;
	char s[300];

	(void)state;
	memset(s, 'q', sizeof(s));
	spop_wbuf_init(&w, buf, sizeof(buf));
	spop_put_varint(&w, 16380);
	spop_put_varint(&w, UINT64_MAX);
	assert_int_equal(w.len, 13);
	assert_memory_equal(buf, "\xfc\xf0\x06\xff\xf0\xfe\xfe\xfe\xfe\xfe\xfe\xfe\x0e", 13);
	spop_wbuf_init(&w, buf, sizeof(buf));
	spop_put_str(&w, s, 300);
	assert_int_equal(w.len, 302);
	assert_int_equal(buf[0], 0xfc); /* 300 = f0|(300&15)=fc, (300-240)>>4 = 3 */
	assert_int_equal(buf[1], 0x03);
	spop_wbuf_init(&w, buf, sizeof(buf));
	spop_put_str(&w, NULL, 0);
	assert_int_equal(w.len, 1);
	assert_int_equal(buf[0], 0);
}

static void test_spop_wbuf_sticky_overflow(void **state)
{
	uint8_t *p = malloc(8);
	struct spop_wbuf w;
	size_t start;

	(void)state;
	spop_wbuf_init(&w, p, 8);
	assert_int_equal(w.len, 0);
	assert_false(w.overflow);
	spop_put_bytes(&w, "abcdef", 6);
	assert_int_equal(w.len, 6);
	spop_put_bytes(&w, "ghi", 3); /* does not fit */
	assert_true(w.overflow);
	assert_int_equal(w.len, 6);
	spop_put_u8(&w, 'z'); /* would fit, but the overflow is sticky */
	assert_true(w.overflow);
	assert_int_equal(w.len, 6);
	spop_put_varint(&w, 1);
	spop_put_str(&w, "", 0);
	assert_int_equal(w.len, 6);
	assert_memory_equal(p, "abcdef", 6);

	/* a frame started in a buffer that overflows later */
	spop_wbuf_init(&w, p, 8);
	start = spop_frame_begin(&w, SPOP_FRM_ACK, SPOP_FL_FIN, 1, 1); /* needs 11 */
	assert_true(w.overflow);
	assert_int_equal(spop_frame_end(&w, start), TOOBIG);
	free(p);

	/* fits exactly, then one more byte */
	p = malloc(11);
	spop_wbuf_init(&w, p, 11);
	start = spop_frame_begin(&w, SPOP_FRM_ACK, SPOP_FL_FIN, 3, 1);
	assert_false(w.overflow);
	assert_int_equal(spop_frame_end(&w, start), 11);
	assert_memory_equal(p, "\x00\x00\x00\x07\x67\x00\x00\x00\x01\x03\x01", 11);
	spop_put_u8(&w, 0);
	assert_true(w.overflow);
	free(p);

	/* zero-sized buffer */
	spop_wbuf_init(&w, NULL, 0);
	spop_put_u8(&w, 1);
	assert_true(w.overflow);
	assert_int_equal(w.len, 0);
}

static void test_spop_frame_begin_end(void **state)
{
	uint8_t buf[128];
	struct spop_wbuf w;
	size_t s1, s2;
	struct spop_data v;
	struct blob e;
	int n;

	(void)state;
	spop_wbuf_init(&w, buf, sizeof(buf));
	s1 = spop_frame_begin(&w, SPOP_FRM_ACK, 0x01020304, 16380, 300000);
	assert_int_equal(s1, 0);
	assert_int_equal(w.len, 4 + 1 + 4 + 3 + 4);
	e = hex("00000000 67 01020304 fcf006 f0af9100");
	assert_memory_equal(buf, e.p, e.len); /* length placeholder, type, BE flags, ids */
	blob_free(&e);
	v = D_i32(87);
	spop_put_set_var(&w, SPOP_SCOPE_TXN, "score", 5, &v);
	n = spop_frame_end(&w, s1);
	assert_int_equal(n, (int)w.len);
	assert_int_equal(n, 16 + 11);
	assert_int_equal(buf[0], 0);
	assert_int_equal(buf[3], n - 4);

	/* a second frame in the same buffer: its offset is returned */
	s2 = spop_frame_begin(&w, SPOP_FRM_ACK, SPOP_FL_FIN, 3, 1);
	assert_int_equal(s2, (size_t)n);
	assert_int_equal(spop_frame_end(&w, s2), 11);
	e = hex(HEX_EMPTY_ACK);
	assert_memory_equal(buf + s2, e.p, e.len);
	blob_free(&e);
	/* the first frame was not disturbed */
	assert_int_equal(buf[3], n - 4);

	/* score ACK from §9.4 */
	spop_wbuf_init(&w, buf, sizeof(buf));
	s1 = spop_frame_begin(&w, SPOP_FRM_ACK, SPOP_FL_FIN, 1, 1);
	spop_put_set_var(&w, SPOP_SCOPE_TXN, "score", 5, &v);
	e = hex(HEX_SCORE_ACK);
	assert_int_equal(spop_frame_end(&w, s1), (int)e.len);
	assert_memory_equal(buf, e.p, e.len);
	blob_free(&e);

	/* a 2-byte length: frame length is big-endian over all 4 bytes */
	{
		static uint8_t big[1200];
		static char body[1000];

		memset(body, 'b', sizeof(body));
		spop_wbuf_init(&w, big, sizeof(big));
		s1 = spop_frame_begin(&w, SPOP_FRM_ACK, SPOP_FL_FIN, 1, 1);
		v = D_str("");
		v.v.s.p = body;
		v.v.s.len = sizeof(body);
		spop_put_set_var(&w, SPOP_SCOPE_TXN, "b", 1, &v);
		n = spop_frame_end(&w, s1);
		assert_int_equal(n, (int)w.len);
		assert_int_equal(((size_t)big[2] << 8 | big[3]) + 4, w.len);
		assert_int_equal(big[0], 0);
		assert_int_equal(big[1], 0);
	}
}

/* ------------------------------------------------------------------------ */
/* Robustness: prefixes, mutations, concatenation                            */
/* ------------------------------------------------------------------------ */

/*
 * Parses the payload <p, len> of a frame of type <type> with the API that fits.
 * Returns 0 for a clean end, < 0 for an error. Checks result codes and views.
 */
static int parse_payload(uint8_t type, const uint8_t *p, size_t len)
{
	struct spop_rd rd = rd_of(p, len);
	const uint8_t *end = p + len;
	int r;

	if (is_kv_type(type)) {
		struct spop_str k;
		struct spop_data v;
		struct spop_hello h;
		struct spop_disconnect d;
		int hr, dr;

		while ((r = spop_kv_next(&rd, &k, &v)) == 1) {
			assert_true(view_in(&k, p, end));
			if (v.type == SPOP_T_STR || v.type == SPOP_T_BIN)
				assert_true(view_in(&v.v.s, p, end));
		}
		assert_true(r == 0 || r == INV);
		hr = spop_hello_parse(p, len, &h);
		assert_true(hr == 0 || hr == INV || hr == -SPOP_ST_NO_VSN || hr == -SPOP_ST_BAD_VSN);
		if (r < 0)
			assert_int_equal(hr, INV);
		if (hr == 0) {
			uint32_t out;
			int nr = spop_frame_size_negotiate(&h, 16380, &out);

			assert_true(nr == 0 || nr == -SPOP_ST_BAD_FRAME_SIZE);
			assert_true(view_in(&h.versions, p, end));
			assert_true(view_in(&h.caps, p, end));
			assert_true(view_in(&h.engine_id, p, end));
		}
		dr = spop_disconnect_parse(p, len, &d);
		assert_true(dr == 0 || dr == INV);
		if (r < 0)
			assert_int_equal(dr, INV);
		if (dr == 0)
			assert_true(view_in(&d.message, p, end));
		return r;
	}
	if (type == SPOP_FRM_NOTIFY || type == SPOP_FRM_UNSET) {
		struct spop_msg m;
		struct spop_str name;
		struct spop_data v;
		int a;

		while ((r = spop_msg_next(&rd, &m)) == 1) {
			assert_true(view_in(&m.name, p, end));
			while ((a = spop_arg_next(&m, &name, &v)) == 1)
				assert_true(view_in(&name, p, end));
			assert_int_equal(a, 0);
			assert_int_equal(m.args_read, m.nb_args);
		}
		assert_true(r == 0 || r == INV);
		return r;
	}
	if (type == SPOP_FRM_ACK) {
		struct action a;

		while ((r = ack_next(&rd, &a)) == 1)
			;
		return r;
	}
	return 0;
}

/* Offsets where a payload may end cleanly (0 and the end of every element). */
static size_t boundaries(uint8_t type, const uint8_t *p, size_t len, size_t *out, size_t max)
{
	struct spop_rd rd = rd_of(p, len);
	size_t n = 0;

	out[n++] = 0;
	for (;;) {
		int r;

		if (is_kv_type(type)) {
			struct spop_str k;
			struct spop_data v;

			r = spop_kv_next(&rd, &k, &v);
		} else if (type == SPOP_FRM_NOTIFY) {
			struct spop_msg m;

			r = spop_msg_next(&rd, &m);
		} else {
			struct action a;

			r = ack_next(&rd, &a);
		}
		assert_true(r >= 0);
		if (r == 0)
			break;
		assert_true(n < max);
		out[n++] = (size_t)(rd.p - p);
	}
	assert_int_equal(out[n - 1], len);
	return n;
}

/*
 * Each prefix of each captured frame, as a truncated stream and as a frame whose
 * length claims only what is there: an error or a clean end, never a crash, and
 * exactly at element boundaries a clean end.
 */
static void test_spop_captured_prefixes(void **state)
{
	size_t i;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(captured); i++) {
		struct blob w = hex(captured[i].hex);
		struct spop_frame full;
		size_t bnd[64], nb, k, hdr;

		decode_wire(&w, &full);
		hdr = (size_t)(full.payload - w.p);
		nb = boundaries(full.type, full.payload, full.len, bnd, ARRAY_SIZE(bnd));
		for (k = 0; k <= w.len; k++) {
			uint8_t *p = dup_exact(w.p, k);
			uint32_t len = 0;
			struct spop_frame f;
			int r, pr;
			size_t j;
			bool at_bnd = false;

			r = spop_frame_len_peek(p, k, &len);
			if (k < 4) {
				assert_int_equal(r, 0);
				free(p);
				continue;
			}
			assert_int_equal(r, 4);
			assert_int_equal(len, w.len - 4);
			/* the stream reader would wait for more unless k == w.len */
			r = spop_frame_decode(p + 4, k - 4, &f);
			if (k < hdr) {
				assert_int_equal(r, INV);
				free(p);
				continue;
			}
			assert_int_equal(r, 0);
			assert_int_equal(f.len, k - hdr);
			assert_ptr_equal(f.payload, p + hdr);
			pr = parse_payload(f.type, f.payload, f.len);
			for (j = 0; j < nb; j++)
				if (bnd[j] == f.len)
					at_bnd = true;
			if (at_bnd && pr != 0)
				fail_msg("%s: prefix %zu at a boundary gave %d", captured[i].name, k, pr);
			if (!at_bnd && pr != INV)
				fail_msg("%s: prefix %zu inside an element gave %d", captured[i].name, k,
					 pr);
			free(p);
		}
		blob_free(&w);
	}
}

/* Every byte of every captured frame replaced by a few nasty values. */
static void test_spop_mutated_frames_no_crash(void **state)
{
	static const uint8_t repl[] = {0x00, 0x01, 0x0a, 0x0f, 0x7f, 0x80, 0xf0, 0xff};
	size_t i, pos, r;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(captured); i++) {
		struct blob w = hex(captured[i].hex);

		for (pos = 4; pos < w.len; pos++) {
			for (r = 0; r < ARRAY_SIZE(repl); r++) {
				uint8_t *p = dup_exact(w.p, w.len);
				struct spop_frame f;
				int fr;

				p[pos] = repl[r];
				fr = spop_frame_decode(p + 4, w.len - 4, &f);
				assert_true(fr == 0 || fr == INV);
				if (fr == 0) {
					assert_ptr_equal(f.payload + f.len, p + w.len);
					/* parse with every interpretation of the payload */
					(void)parse_payload(SPOP_FRM_HAPROXY_HELLO, f.payload, f.len);
					(void)parse_payload(SPOP_FRM_NOTIFY, f.payload, f.len);
					(void)parse_payload(SPOP_FRM_ACK, f.payload, f.len);
				}
				free(p);
			}
		}
		blob_free(&w);
	}
}

/* All captured frames back to back, read as one TCP stream. */
static void test_spop_concatenated_stream(void **state)
{
	uint8_t *all;
	size_t total = 0, off = 0, i, nframes = 0;

	(void)state;
	for (i = 0; i < ARRAY_SIZE(captured); i++)
		total += strlen(captured[i].hex) / 2;
	all = malloc(total);
	for (i = 0; i < ARRAY_SIZE(captured); i++) {
		struct blob w = hex(captured[i].hex);

		memcpy(all + off, w.p, w.len);
		off += w.len;
		blob_free(&w);
	}
	assert_int_equal(off, total);

	off = 0;
	while (off < total) {
		uint32_t len = 0;
		struct spop_frame f;
		struct blob w = hex(captured[nframes].hex);

		assert_int_equal(spop_frame_len_peek(all + off, total - off, &len), 4);
		assert_true((size_t)len <= total - off - 4);
		assert_int_equal(spop_frame_decode(all + off + 4, len, &f), 0);
		assert_int_equal(len + 4, w.len);
		assert_int_equal(f.type, w.p[4]);
		assert_int_equal(parse_payload(f.type, f.payload, f.len), 0);
		off += 4 + len;
		nframes++;
		blob_free(&w);
	}
	assert_int_equal(nframes, ARRAY_SIZE(captured));
	assert_int_equal(spop_frame_len_peek(all + off, 0, &(uint32_t){0}), 0);
	free(all);
}

static void test_spop_status_names(void **state)
{
	(void)state;
	assert_string_equal(spop_status_str(SPOP_ST_NORMAL), "normal");
	assert_string_equal(spop_status_str(SPOP_ST_IO), "I/O error");
	assert_string_equal(spop_status_str(SPOP_ST_TIMEOUT), "a timeout occurred");
	assert_string_equal(spop_status_str(SPOP_ST_TOO_BIG), "frame is too big");
	assert_string_equal(spop_status_str(SPOP_ST_INVALID), "invalid frame received");
	assert_string_equal(spop_status_str(SPOP_ST_NO_VSN), "version value not found");
	assert_string_equal(spop_status_str(SPOP_ST_NO_FRAME_SIZE), "max-frame-size value not found");
	assert_string_equal(spop_status_str(SPOP_ST_NO_CAP), "capabilities value not found");
	assert_string_equal(spop_status_str(SPOP_ST_BAD_VSN), "unsupported version");
	assert_string_equal(spop_status_str(SPOP_ST_BAD_FRAME_SIZE),
			    "max-frame-size too big or too small");
	assert_string_equal(spop_status_str(SPOP_ST_FRAG_NOT_SUPP), "fragmentation not supported");
	assert_string_equal(spop_status_str(SPOP_ST_INTERLACED), "invalid interlaced frames");
	assert_string_equal(spop_status_str(SPOP_ST_FRAMEID_NOTFND), "frame-id not found");
	assert_string_equal(spop_status_str(SPOP_ST_RES), "resource allocation error");
	assert_string_equal(spop_status_str(SPOP_ST_UNKNOWN), "an unknown error occurred");
	assert_non_null(spop_status_str(12345));
	/* frame type names of SPOP.md 1.2 */
	assert_string_equal(spop_frame_type_str(SPOP_FRM_UNSET), "UNSET");
	assert_string_equal(spop_frame_type_str(SPOP_FRM_HAPROXY_HELLO), "HAPROXY-HELLO");
	assert_string_equal(spop_frame_type_str(SPOP_FRM_HAPROXY_DISCON), "HAPROXY-DISCONNECT");
	assert_string_equal(spop_frame_type_str(SPOP_FRM_NOTIFY), "NOTIFY");
	assert_string_equal(spop_frame_type_str(SPOP_FRM_AGENT_HELLO), "AGENT-HELLO");
	assert_string_equal(spop_frame_type_str(SPOP_FRM_AGENT_DISCON), "AGENT-DISCONNECT");
	assert_string_equal(spop_frame_type_str(SPOP_FRM_ACK), "ACK");
	assert_non_null(spop_frame_type_str(200));
	{
		int t, u;

		for (t = 0; t < SPOP_T_COUNT; t++) {
			assert_non_null(spop_data_type_str(t));
			for (u = 0; u < t; u++)
				assert_string_not_equal(spop_data_type_str(t), spop_data_type_str(u));
		}
	}
	assert_non_null(spop_data_type_str(15));
	assert_non_null(spop_data_type_str(-1));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_spop_varint_table_encode),
		cmocka_unit_test(test_spop_varint_table_decode),
		cmocka_unit_test(test_spop_varint_size_ranges),
		cmocka_unit_test(test_spop_varint_roundtrip_random),
		cmocka_unit_test(test_spop_varint_truncations_invalid),
		cmocka_unit_test(test_spop_varint_eleven_bytes_invalid),
		cmocka_unit_test(test_spop_str_decode),
		cmocka_unit_test(test_spop_str_length_near_2_64),
		cmocka_unit_test(test_spop_str_eq),
		cmocka_unit_test(test_spop_data_decode_each_type),
		cmocka_unit_test(test_spop_data_flag_nibble),
		cmocka_unit_test(test_spop_data_bad_type_nibble),
		cmocka_unit_test(test_spop_data_truncated),
		cmocka_unit_test(test_spop_data_int),
		cmocka_unit_test(test_spop_uint64_wire_no_wrap),
		cmocka_unit_test(test_spop_escape),
		cmocka_unit_test(test_spop_frame_len_peek),
		cmocka_unit_test(test_spop_frame_decode_header),
		cmocka_unit_test(test_spop_hello_26),
		cmocka_unit_test(test_spop_hello_33),
		cmocka_unit_test(test_spop_hello_healthcheck),
		cmocka_unit_test(test_spop_hello_versions),
		cmocka_unit_test(test_spop_hello_fields),
		cmocka_unit_test(test_spop_hello_malformed),
		cmocka_unit_test(test_spop_frame_size_negotiate),
		cmocka_unit_test(test_spop_agent_hello_vector),
		cmocka_unit_test(test_spop_notify_26),
		cmocka_unit_test(test_spop_notify_33),
		cmocka_unit_test(test_spop_response_group_notify),
		cmocka_unit_test(test_spop_notify_empty_payload),
		cmocka_unit_test(test_spop_notify_nb_args_mismatch),
		cmocka_unit_test(test_spop_notify_several_messages),
		cmocka_unit_test(test_spop_ack_vector),
		cmocka_unit_test(test_spop_response_group_ack),
		cmocka_unit_test(test_spop_constructed_acks),
		cmocka_unit_test(test_spop_disconnect_vectors),
		cmocka_unit_test(test_spop_agent_disconnect_build),
		cmocka_unit_test(test_spop_disconnect_parse_variants),
		cmocka_unit_test(test_spop_kv_next),
		cmocka_unit_test(test_spop_put_data_each_type),
		cmocka_unit_test(test_spop_put_data_roundtrip_random),
		cmocka_unit_test(test_spop_put_set_unset_var),
		cmocka_unit_test(test_spop_put_str_varint),
		cmocka_unit_test(test_spop_wbuf_sticky_overflow),
		cmocka_unit_test(test_spop_frame_begin_end),
		cmocka_unit_test(test_spop_captured_prefixes),
		cmocka_unit_test(test_spop_mutated_frames_no_crash),
		cmocka_unit_test(test_spop_concatenated_stream),
		cmocka_unit_test(test_spop_status_names),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
