/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target for the SPOP codec (spoa/spop.c).
 *
 * The input is read as a TCP stream of length-prefixed SPOP frames. Each frame
 * is copied into an exactly sized heap buffer (so ASan sees any read past it),
 * its header decoded, and its payload run through the parser that fits its
 * type: HELLO -> spop_hello_parse + spop_frame_size_negotiate (+ AGENT-HELLO
 * built and decoded back), DISCONNECT -> spop_disconnect_parse (+ AGENT-
 * DISCONNECT built and decoded back), NOTIFY -> spop_msg_next/spop_arg_next
 * over all messages, ACK -> an action reader. Every decoded typed value is
 * written again with spop_put_data into a bounded buffer and decoded again;
 * any disagreement calls abort().
 *
 * Build: clang-14 -g -fsanitize=fuzzer,address,undefined -Ispoa \
 *            tests/fuzz/fuzz_spop_frame.c spoa/spop.c -o /tmp/fuzz_spop_frame
 * Replay without libFuzzer: see tests/fuzz/replay.c and tests/fuzz/README.md.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "spop.h"

#define FUZZ_MAX_INPUT (1U << 20)
#define WBUF_SIZE      1024    /* bounded re-encoding buffer */

/* ---- helpers ---- */

static bool view_in(const struct spop_str *s, const uint8_t *lo, const uint8_t *hi)
{
	const char *l = (const char *)lo, *h = (const char *)hi;

	if (s->len == 0)
		return true;
	return s->p >= l && s->p <= h && s->len <= (size_t)(h - s->p);
}

static bool view_eq(const struct spop_str *a, const void *p, size_t len)
{
	return a->len == len && (len == 0 || memcmp(a->p, p, len) == 0);
}

static uint8_t *dup_exact(const void *p, size_t n)
{
	uint8_t *d = calloc(1, n ? n : 1);

	CHECK(d != NULL);
	if (n)
		memcpy(d, p, n);
	return d;
}

static bool data_same(const struct spop_data *a, const struct spop_data *b)
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
		return view_eq(&a->v.s, b->v.s.p, b->v.s.len);
	default:
		return false;
	}
}

/* Bytes spop_put_data() needs for <d>. */
static size_t data_size(const struct spop_data *d)
{
	switch (d->type) {
	case SPOP_T_INT32:
	case SPOP_T_INT64:
		return 1 + (size_t)spop_varint_size((uint64_t)d->v.i);
	case SPOP_T_UINT32:
	case SPOP_T_UINT64:
		return 1 + (size_t)spop_varint_size(d->v.u);
	case SPOP_T_IPV4:
		return 5;
	case SPOP_T_IPV6:
		return 17;
	case SPOP_T_STR:
	case SPOP_T_BIN:
		return 1 + (size_t)spop_varint_size(d->v.s.len) + d->v.s.len;
	default:
		return 1;
	}
}

static void roundtrip_varint(uint64_t v)
{
	uint8_t buf[SPOP_VARINT_MAX];
	int n = spop_varint_size(v);
	int w;
	uint8_t *copy;
	struct spop_rd rd;
	uint64_t back = 0;

	CHECK(n >= 1 && n <= SPOP_VARINT_MAX);
	CHECK(spop_varint_encode(buf, (size_t)n - 1, v) == -SPOP_ST_TOO_BIG);
	w = spop_varint_encode(buf, (size_t)n, v);
	CHECK(w == n);
	copy = dup_exact(buf, (size_t)n);
	rd.p = copy;
	rd.end = copy + n;
	CHECK(spop_varint_decode(&rd, &back) == n);
	CHECK(back == v && rd.p == copy + n);
	free(copy);
}

/* Writes <d> again into a bounded buffer and decodes it back: same value. */
static void roundtrip_data(const struct spop_data *d)
{
	uint8_t buf[WBUF_SIZE];
	struct spop_wbuf w;
	size_t need = data_size(d);
	struct spop_data back;
	struct spop_rd rd;
	uint8_t *copy;

	CHECK(d->type < SPOP_T_COUNT);
	CHECK(spop_data_type_str(d->type) != NULL);
	if (d->type >= SPOP_T_INT32 && d->type <= SPOP_T_UINT64) {
		int64_t i;

		CHECK(spop_data_int(d, &i));
		roundtrip_varint(d->type == SPOP_T_INT32 || d->type == SPOP_T_INT64 ?
					 (uint64_t)d->v.i : d->v.u);
	} else {
		int64_t i;

		CHECK(!spop_data_int(d, &i));
	}

	/* one byte short: must overflow without writing past the end */
	spop_wbuf_init(&w, buf, need - 1 < sizeof(buf) ? need - 1 : sizeof(buf));
	spop_put_data(&w, d);
	CHECK(w.overflow && w.len <= w.size);
	/* and once more: sticky */
	spop_put_u8(&w, 0);
	CHECK(w.overflow && w.len <= w.size);

	spop_wbuf_init(&w, buf, sizeof(buf));
	spop_put_data(&w, d);
	if (need > sizeof(buf)) {
		CHECK(w.overflow && w.len <= sizeof(buf));
		return;
	}
	CHECK(!w.overflow && w.len == need);
	/* flag nibble zero except BOOL true */
	if (d->type == SPOP_T_BOOL && d->v.b)
		CHECK(buf[0] == (SPOP_T_BOOL | SPOP_DATA_FLAG_TRUE));
	else
		CHECK(buf[0] == d->type);

	copy = dup_exact(buf, w.len);
	rd.p = copy;
	rd.end = copy + w.len;
	CHECK(spop_data_decode(&rd, &back) == (int)w.len);
	CHECK(rd.p == copy + w.len);
	CHECK(data_same(&back, d));
	rd.p = copy;
	CHECK(spop_data_skip(&rd) == (int)w.len);
	free(copy);
}

/* Checks decode/skip agreement for one typed value at <rd>; advances on success. */
static int data_step(struct spop_rd *rd, const uint8_t *lo, const uint8_t *hi)
{
	struct spop_rd a = *rd, b = *rd;
	struct spop_data d;
	int n = spop_data_decode(&a, &d);
	int m = spop_data_skip(&b);

	CHECK(n == m);
	if (n < 0) {
		CHECK(n == -SPOP_ST_INVALID);
		CHECK(a.p == rd->p && b.p == rd->p);
		return n;
	}
	CHECK(n >= 1 && a.p == rd->p + n && b.p == a.p && a.p <= rd->end);
	if (d.type == SPOP_T_STR || d.type == SPOP_T_BIN)
		CHECK(view_in(&d.v.s, lo, hi));
	roundtrip_data(&d);
	*rd = a;
	return n;
}

/* Reads the payload as a plain sequence of typed values. */
static void scan_typed(const uint8_t *p, size_t len)
{
	struct spop_rd rd = {p, p + len};

	while (rd.p < rd.end && data_step(&rd, p, p + len) > 0)
		;
}

/* ---- KV lists ---- */

static int walk_kv(const uint8_t *p, size_t len)
{
	struct spop_rd rd = {p, p + len};
	struct spop_str k;
	struct spop_data v;
	int r;

	while ((r = spop_kv_next(&rd, &k, &v)) == 1) {
		CHECK(view_in(&k, p, p + len));
		if (v.type == SPOP_T_STR || v.type == SPOP_T_BIN)
			CHECK(view_in(&v.v.s, p, p + len));
		roundtrip_data(&v);
	}
	CHECK(r == 0 || r == -SPOP_ST_INVALID);
	CHECK(rd.p <= rd.end);
	return r;
}

/* A NUL-terminated copy of <s>, cut at the first NUL and at <room> - 1 bytes. */
static void cstr_of(char *dst, size_t room, const struct spop_str *s)
{
	size_t n = s->len < room - 1 ? s->len : room - 1;

	if (n)
		memcpy(dst, s->p, n);
	dst[n] = '\0';
}

/* Splits a frame we built ourselves and decodes its header. */
static void decode_own(const uint8_t *buf, size_t len, uint8_t type, struct spop_frame *f,
		       uint8_t **copy)
{
	uint32_t flen = 0;

	*copy = dup_exact(buf, len);
	CHECK(spop_frame_len_peek(*copy, len, &flen) == SPOP_LEN_SIZE);
	CHECK((size_t)flen + SPOP_LEN_SIZE == len);
	CHECK(spop_frame_decode(*copy + SPOP_LEN_SIZE, flen, f) == 0);
	CHECK(f->type == type && f->flags == SPOP_FL_FIN && f->sid == 0 && f->fid == 0);
}

static void check_hello(const uint8_t *p, size_t len, int kv)
{
	struct spop_hello h;
	int r = spop_hello_parse(p, len, &h);
	static const uint32_t ours[] = {SPOP_FRAME_SIZE_MIN, 1024, SPOP_FRAME_SIZE_DFLT, 65532,
					UINT32_MAX};
	uint32_t out = 0;
	size_t i;

	CHECK(r == 0 || r == -SPOP_ST_INVALID || r == -SPOP_ST_NO_VSN || r == -SPOP_ST_BAD_VSN);
	if (kv < 0)
		CHECK(r == -SPOP_ST_INVALID);
	if (r != 0)
		return;
	CHECK(h.has_versions && h.version_ok);
	CHECK(view_in(&h.versions, p, p + len));
	CHECK(view_in(&h.caps, p, p + len));
	CHECK(view_in(&h.engine_id, p, p + len));

	for (i = 0; i < sizeof(ours) / sizeof(ours[0]); i++) {
		uint32_t theirs = h.has_frame_size ? h.max_frame_size : SPOP_FRAME_SIZE_DFLT;
		int nr = spop_frame_size_negotiate(&h, ours[i], &out);

		if (theirs < SPOP_FRAME_SIZE_MIN) {
			CHECK(nr == -SPOP_ST_BAD_FRAME_SIZE);
			return;
		}
		CHECK(nr == 0);
		CHECK(out == (theirs < ours[i] ? theirs : ours[i]));
	}

	/* answer it: build an AGENT-HELLO and decode it back */
	{
		uint8_t buf[WBUF_SIZE];
		char caps[300];
		struct spop_wbuf w;
		struct spop_frame f;
		struct spop_rd rd;
		struct spop_str k;
		struct spop_data v;
		uint8_t *copy;
		int n;

		cstr_of(caps, sizeof(caps), &h.caps);
		spop_wbuf_init(&w, buf, sizeof(buf));
		n = spop_agent_hello_build(&w, out, caps);
		CHECK(n > 0 && (size_t)n == w.len);
		decode_own(buf, w.len, SPOP_FRM_AGENT_HELLO, &f, &copy);
		rd.p = f.payload;
		rd.end = f.payload + f.len;
		CHECK(spop_kv_next(&rd, &k, &v) == 1);
		CHECK(spop_str_eq(&k, "version") && v.type == SPOP_T_STR &&
		      spop_str_eq(&v.v.s, SPOP_VERSION));
		CHECK(spop_kv_next(&rd, &k, &v) == 1);
		CHECK(spop_str_eq(&k, "max-frame-size") && v.type == SPOP_T_UINT32 && v.v.u == out);
		CHECK(spop_kv_next(&rd, &k, &v) == 1);
		CHECK(spop_str_eq(&k, "capabilities") && v.type == SPOP_T_STR &&
		      spop_str_eq(&v.v.s, caps));
		CHECK(spop_kv_next(&rd, &k, &v) == 0);
		free(copy);

		/* too small a buffer: refused */
		spop_wbuf_init(&w, buf, (size_t)n - 1);
		CHECK(spop_agent_hello_build(&w, out, caps) == -SPOP_ST_TOO_BIG);
	}
}

static void check_disconnect(const uint8_t *p, size_t len, int kv)
{
	struct spop_disconnect d;
	int r = spop_disconnect_parse(p, len, &d);
	uint8_t buf[WBUF_SIZE];
	char msg[300];
	struct spop_wbuf w;
	struct spop_frame f;
	struct spop_disconnect back;
	uint8_t *copy;
	int n;

	CHECK(r == 0 || r == -SPOP_ST_INVALID);
	if (kv < 0)
		CHECK(r == -SPOP_ST_INVALID);
	if (r != 0)
		return;
	CHECK(view_in(&d.message, p, p + len));
	CHECK(spop_status_str((int)d.status) != NULL);

	/* answer it: build an AGENT-DISCONNECT and decode it back */
	cstr_of(msg, sizeof(msg), &d.message);
	spop_wbuf_init(&w, buf, sizeof(buf));
	n = spop_agent_disconnect_build(&w, d.status, msg);
	CHECK(n > 0 && (size_t)n == w.len);
	decode_own(buf, w.len, SPOP_FRM_AGENT_DISCON, &f, &copy);
	CHECK(spop_disconnect_parse(f.payload, f.len, &back) == 0);
	CHECK(back.status == d.status);
	/* the builder may shorten an over-long message, never change it */
	CHECK(back.message.len <= strlen(msg));
	CHECK(back.message.len == 0 || memcmp(back.message.p, msg, back.message.len) == 0);
	free(copy);
}

/* ---- NOTIFY ---- */

/*
 * Walks all messages and arguments; writes them again into <w> (a bounded
 * buffer) and returns the msg_next result (0 or < 0). Counts into <nmsg> and <narg>.
 */
static int walk_notify(const uint8_t *p, size_t len, struct spop_wbuf *w, unsigned *nmsg,
		       unsigned *narg, bool check_values)
{
	struct spop_rd rd = {p, p + len};
	struct spop_msg m;
	int r;

	*nmsg = *narg = 0;
	while ((r = spop_msg_next(&rd, &m)) == 1) {
		struct spop_str name;
		struct spop_data v;
		unsigned i;

		CHECK(m.nb_args <= 255 && m.args_read == 0);
		CHECK(view_in(&m.name, p, p + len));
		CHECK(rd.p <= rd.end);
		spop_put_str(w, m.name.p, m.name.len);
		spop_put_u8(w, (uint8_t)m.nb_args);
		(*nmsg)++;
		for (i = 0; i < m.nb_args; i++) {
			/* arguments were validated by spop_msg_next(): no error now */
			CHECK(spop_arg_next(&m, &name, &v) == 1);
			CHECK(view_in(&name, p, p + len));
			if (v.type == SPOP_T_STR || v.type == SPOP_T_BIN)
				CHECK(view_in(&v.v.s, p, p + len));
			if (check_values)
				roundtrip_data(&v);
			spop_put_str(w, name.p, name.len);
			spop_put_data(w, &v);
			(*narg)++;
		}
		CHECK(m.args_read == m.nb_args);
		CHECK(spop_arg_next(&m, &name, &v) == 0);
	}
	CHECK(r == 0 || r == -SPOP_ST_INVALID);
	return r;
}

static void check_notify(const struct spop_frame *f)
{
	static uint8_t out1[WBUF_SIZE * 4], out2[WBUF_SIZE * 4];
	struct spop_wbuf w1, w2;
	unsigned nm1, na1, nm2, na2;
	uint8_t *copy;
	int r;

	spop_wbuf_init(&w1, out1, sizeof(out1));
	r = walk_notify(f->payload, f->len, &w1, &nm1, &na1, true);
	if (f->len == 0)
		CHECK(r == 0 && nm1 == 0);
	if (r != 0 || w1.overflow)
		return;

	/* what we wrote decodes to the same thing and writes identically again */
	copy = dup_exact(out1, w1.len);
	spop_wbuf_init(&w2, out2, sizeof(out2));
	CHECK(walk_notify(copy, w1.len, &w2, &nm2, &na2, false) == 0);
	CHECK(nm1 == nm2 && na1 == na2);
	CHECK(!w2.overflow && w2.len == w1.len && memcmp(out1, out2, w1.len) == 0);
	free(copy);
}

/* ---- ACK (agent frames; the codec only writes them, so read them here) ---- */

struct action {
	uint8_t type, nb_args, scope;
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
		return -SPOP_ST_INVALID;
	a->type = *r.p++;
	a->nb_args = *r.p++;
	a->scope = *r.p++;
	if (!(a->type == SPOP_ACT_SET_VAR && a->nb_args == 3) &&
	    !(a->type == SPOP_ACT_UNSET_VAR && a->nb_args == 2))
		return -SPOP_ST_INVALID;
	n = spop_str_decode(&r, &a->name);
	if (n < 0)
		return n;
	if (a->type == SPOP_ACT_SET_VAR) {
		n = spop_data_decode(&r, &a->val);
		if (n < 0)
			return n;
	}
	*rd = r;
	return 1;
}

static void check_ack(const struct spop_frame *f)
{
	static uint8_t out[WBUF_SIZE * 4];
	struct spop_rd rd = {f->payload, f->payload + f->len};
	struct spop_wbuf w;
	struct action a;
	size_t start;
	int r, n;

	spop_wbuf_init(&w, out, sizeof(out));
	start = spop_frame_begin(&w, SPOP_FRM_ACK, SPOP_FL_FIN, f->sid, f->fid);
	while ((r = ack_next(&rd, &a)) == 1) {
		CHECK(view_in(&a.name, f->payload, f->payload + f->len));
		if (a.type == SPOP_ACT_SET_VAR) {
			roundtrip_data(&a.val);
			spop_put_set_var(&w, a.scope, a.name.p, a.name.len, &a.val);
		} else {
			spop_put_unset_var(&w, a.scope, a.name.p, a.name.len);
		}
	}
	n = spop_frame_end(&w, start);
	if (w.overflow) {
		CHECK(n == -SPOP_ST_TOO_BIG);
		return;
	}
	CHECK(n > 0 && (size_t)n == w.len);
	/* our frame: header decodes to the same ids, and its actions read back */
	{
		uint8_t *copy = dup_exact(out, w.len);
		struct spop_frame g;
		uint32_t len = 0;
		struct action b;
		int cnt = 0;

		CHECK(spop_frame_len_peek(copy, w.len, &len) == SPOP_LEN_SIZE);
		CHECK((size_t)len + SPOP_LEN_SIZE == w.len);
		CHECK(spop_frame_decode(copy + SPOP_LEN_SIZE, len, &g) == 0);
		CHECK(g.type == SPOP_FRM_ACK && g.flags == SPOP_FL_FIN);
		CHECK(g.sid == f->sid && g.fid == f->fid);
		rd.p = g.payload;
		rd.end = g.payload + g.len;
		while (ack_next(&rd, &b) == 1)
			cnt++;
		CHECK(rd.p == rd.end);
		(void)cnt;
		free(copy);
	}
}

/* ---- one frame ---- */

static void check_frame(const uint8_t *frame, size_t len)
{
	struct spop_frame f;
	int r = spop_frame_decode(frame, len, &f);
	int kv;

	if (len < SPOP_FRAME_MIN)
		CHECK(r == -SPOP_ST_INVALID);
	CHECK(r == 0 || r == -SPOP_ST_INVALID);
	if (r != 0)
		return;
	CHECK(f.payload >= frame + SPOP_FRAME_MIN && f.payload <= frame + len);
	CHECK(f.payload + f.len == frame + len);
	CHECK(f.type == frame[0]);
	CHECK(spop_frame_type_str(f.type) != NULL);

	/* the header written back decodes to the same fields */
	{
		uint8_t buf[64];
		struct spop_wbuf w;
		size_t start;
		struct spop_frame g;
		uint8_t *copy;
		int n;

		spop_wbuf_init(&w, buf, sizeof(buf));
		start = spop_frame_begin(&w, f.type, f.flags, f.sid, f.fid);
		n = spop_frame_end(&w, start);
		CHECK(n > 0 && (size_t)n == w.len);
		copy = dup_exact(buf, w.len);
		CHECK(spop_frame_decode(copy + SPOP_LEN_SIZE, w.len - SPOP_LEN_SIZE, &g) == 0);
		CHECK(g.type == f.type && g.flags == f.flags && g.sid == f.sid && g.fid == f.fid);
		CHECK(g.len == 0);
		free(copy);
	}

	switch (f.type) {
	case SPOP_FRM_HAPROXY_HELLO:
	case SPOP_FRM_AGENT_HELLO:
		kv = walk_kv(f.payload, f.len);
		check_hello(f.payload, f.len, kv);
		break;
	case SPOP_FRM_HAPROXY_DISCON:
	case SPOP_FRM_AGENT_DISCON:
		kv = walk_kv(f.payload, f.len);
		check_disconnect(f.payload, f.len, kv);
		break;
	case SPOP_FRM_NOTIFY:
	case SPOP_FRM_UNSET:
		check_notify(&f);
		break;
	case SPOP_FRM_ACK:
		check_ack(&f);
		break;
	default:
		/* unknown type: the connection layer skips it; exercise everything */
		kv = walk_kv(f.payload, f.len);
		check_hello(f.payload, f.len, kv);
		check_disconnect(f.payload, f.len, kv);
		check_notify(&f);
		scan_typed(f.payload, f.len);
		break;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t off = 0;

	if (size > FUZZ_MAX_INPUT)
		return 0;
	while (off < size) {
		uint32_t len = 0;
		size_t avail, flen;
		uint8_t *frame;
		int r = spop_frame_len_peek(data + off, size - off, &len);

		if (size - off < SPOP_LEN_SIZE) {
			CHECK(r == 0);
			break;
		}
		CHECK(r == SPOP_LEN_SIZE);
		off += SPOP_LEN_SIZE;
		avail = size - off;
		/*
		 * A real reader waits for the rest (and refuses lengths above the
		 * negotiated size); here a short last frame is decoded as if its
		 * length said what is there, to exercise truncated payloads.
		 */
		flen = len <= avail ? len : avail;
		frame = dup_exact(data + off, flen);
		check_frame(frame, flen);
		free(frame);
		off += flen;
	}
	return 0;
}
