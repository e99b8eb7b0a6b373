/* SPDX-License-Identifier: MIT */
/*
 * SPOP 2.0 wire codec. Written from HAProxy's doc/SPOE.txt; section numbers in
 * comments refer to that document. See spop.h for the conventions.
 *
 * Bound checks are always written as "need > remaining" with remaining computed
 * as end - p, never as p + need > end, so a hostile 64-bit length cannot wrap a
 * pointer.
 */
#include "spop.h"

#include <string.h>

static size_t rd_left(const struct spop_rd *rd)
{
	return (size_t)(rd->end - rd->p);
}

const char *spop_status_str(int status)
{
	switch (status) {
	case SPOP_ST_NORMAL:         return "normal";
	case SPOP_ST_IO:             return "I/O error";
	case SPOP_ST_TIMEOUT:        return "a timeout occurred";
	case SPOP_ST_TOO_BIG:        return "frame is too big";
	case SPOP_ST_INVALID:        return "invalid frame received";
	case SPOP_ST_NO_VSN:         return "version value not found";
	case SPOP_ST_NO_FRAME_SIZE:  return "max-frame-size value not found";
	case SPOP_ST_NO_CAP:         return "capabilities value not found";
	case SPOP_ST_BAD_VSN:        return "unsupported version";
	case SPOP_ST_BAD_FRAME_SIZE: return "max-frame-size too big or too small";
	case SPOP_ST_FRAG_NOT_SUPP:  return "fragmentation not supported";
	case SPOP_ST_INTERLACED:     return "invalid interlaced frames";
	case SPOP_ST_FRAMEID_NOTFND: return "frame-id not found";
	case SPOP_ST_RES:            return "resource allocation error";
	default:                     return "an unknown error occurred";
	}
}

const char *spop_frame_type_str(int type)
{
	switch (type) {
	case SPOP_FRM_UNSET:          return "UNSET";
	case SPOP_FRM_HAPROXY_HELLO:  return "HAPROXY-HELLO";
	case SPOP_FRM_HAPROXY_DISCON: return "HAPROXY-DISCONNECT";
	case SPOP_FRM_NOTIFY:         return "NOTIFY";
	case SPOP_FRM_AGENT_HELLO:    return "AGENT-HELLO";
	case SPOP_FRM_AGENT_DISCON:   return "AGENT-DISCONNECT";
	case SPOP_FRM_ACK:            return "ACK";
	default:                      return "UNKNOWN";
	}
}

const char *spop_data_type_str(int type)
{
	static const char *const names[SPOP_T_COUNT] = {
		"null", "bool", "int32", "uint32", "int64", "uint64", "ipv4", "ipv6", "string",
		"binary",
	};

	if (type < 0 || type >= SPOP_T_COUNT)
		return "unknown";
	return names[type];
}

/* Number of bytes the varint encoding of <v> takes (1..10). */
int spop_varint_size(uint64_t v)
{
	int n = 1;

	if (v < 240)
		return 1;
	v = (v - 240) >> 4;
	while (v >= 128) {
		v = (v - 128) >> 7;
		n++;
	}
	return n + 1;
}

/*
 * Decodes one varint (SPOE.txt 3.1) at <rd> into <v>. Returns the bytes consumed
 * and advances the cursor, or -SPOP_ST_INVALID if the input ends first or the
 * encoding runs past SPOP_VARINT_MAX bytes; the cursor is unchanged on error.
 */
int spop_varint_decode(struct spop_rd *rd, uint64_t *v)
{
	const uint8_t *p = rd->p;
	size_t left = rd_left(rd);
	uint64_t val;
	unsigned shift = 4;
	size_t i = 1;

	if (left < 1)
		return -SPOP_ST_INVALID;
	val = p[0];
	if (p[0] >= 240) {
		for (;;) {
			uint8_t b;

			if (i >= left || i >= SPOP_VARINT_MAX)
				return -SPOP_ST_INVALID;
			b = p[i++];
			/* the 10th byte may only carry the top bits: shift stays < 64 */
			val += (uint64_t)b << shift;
			if (b < 128)
				break;
			shift += 7;
		}
	}
	*v = val;
	rd->p += i;
	return (int)i;
}

/* Encodes <v> into <buf> of <room> bytes. Returns bytes written or -SPOP_ST_TOO_BIG. */
int spop_varint_encode(uint8_t *buf, size_t room, uint64_t v)
{
	size_t n = (size_t)spop_varint_size(v);
	size_t i = 0;

	if (n > room)
		return -SPOP_ST_TOO_BIG;
	if (v < 240) {
		buf[0] = (uint8_t)v;
		return 1;
	}
	buf[i++] = (uint8_t)(0xF0 | (v & 0x0F));
	v = (v - 240) >> 4;
	while (v >= 128) {
		buf[i++] = (uint8_t)(0x80 | (v & 0x7F));
		v = (v - 128) >> 7;
	}
	buf[i++] = (uint8_t)v;
	return (int)i;
}

/* Decodes a length-prefixed string at <rd> into the view <s>. */
int spop_str_decode(struct spop_rd *rd, struct spop_str *s)
{
	struct spop_rd r = *rd;
	uint64_t len;
	int n;

	n = spop_varint_decode(&r, &len);
	if (n < 0)
		return n;
	if (len > rd_left(&r))
		return -SPOP_ST_INVALID;
	s->p = (const char *)r.p;
	s->len = (size_t)len;
	r.p += len;
	n = (int)(r.p - rd->p);
	*rd = r;
	return n;
}

/*
 * Decodes one typed value (SPOE.txt 3.1.1) at <rd> into <d>, whose strings are
 * views into the input. Returns the bytes consumed, or -SPOP_ST_INVALID for a
 * truncated value or a reserved type id (which cannot be skipped).
 */
int spop_data_decode(struct spop_rd *rd, struct spop_data *d)
{
	struct spop_rd r = *rd;
	uint8_t tb;
	uint64_t u;
	int n;

	if (rd_left(&r) < 1)
		return -SPOP_ST_INVALID;
	tb = *r.p++;
	memset(d, 0, sizeof(*d));
	d->type = tb & SPOP_DATA_TYPE_MASK;
	switch (d->type) {
	case SPOP_T_NULL:
		break;
	case SPOP_T_BOOL:
		d->v.b = (tb & SPOP_DATA_FLAG_TRUE) != 0;
		break;
	case SPOP_T_INT32:
	case SPOP_T_INT64:
		n = spop_varint_decode(&r, &u);
		if (n < 0)
			return n;
		d->v.i = (int64_t)u;
		break;
	case SPOP_T_UINT32:
	case SPOP_T_UINT64:
		n = spop_varint_decode(&r, &u);
		if (n < 0)
			return n;
		d->v.u = u;
		break;
	case SPOP_T_IPV4:
		if (rd_left(&r) < 4)
			return -SPOP_ST_INVALID;
		memcpy(d->v.ipv4, r.p, 4);
		r.p += 4;
		break;
	case SPOP_T_IPV6:
		if (rd_left(&r) < 16)
			return -SPOP_ST_INVALID;
		memcpy(d->v.ipv6, r.p, 16);
		r.p += 16;
		break;
	case SPOP_T_STR:
	case SPOP_T_BIN:
		n = spop_str_decode(&r, &d->v.s);
		if (n < 0)
			return n;
		break;
	default:
		return -SPOP_ST_INVALID;
	}
	n = (int)(r.p - rd->p);
	*rd = r;
	return n;
}

/* Skips one typed value; same validation and return as spop_data_decode(). */
int spop_data_skip(struct spop_rd *rd)
{
	struct spop_data d;

	return spop_data_decode(rd, &d);
}

/* True if the view <s> equals the NUL-terminated <cstr>. */
bool spop_str_eq(const struct spop_str *s, const char *cstr)
{
	size_t l = strlen(cstr);

	return s->len == l && (l == 0 || memcmp(s->p, cstr, l) == 0);
}

/*
 * Reads any integer-typed value <d> into <out>; false for other types. An
 * unsigned value above INT64_MAX saturates to INT64_MAX: it never wraps into
 * a negative number, so the caller sees it as out of range, not as small.
 */
bool spop_data_int(const struct spop_data *d, int64_t *out)
{
	switch (d->type) {
	case SPOP_T_INT32:
	case SPOP_T_INT64:
		*out = d->v.i;
		return true;
	case SPOP_T_UINT32:
	case SPOP_T_UINT64:
		*out = d->v.u > (uint64_t)INT64_MAX ? INT64_MAX : (int64_t)d->v.u;
		return true;
	default:
		return false;
	}
}

/*
 * Writes the <len> bytes at <src> (peer data: any byte) into <dst> of <size>
 * bytes (> 0) as printable ASCII for a log line: bytes 0x20-0x7e except the
 * backslash are copied, the backslash becomes two, every other byte (control
 * characters, newlines, DEL, non-ASCII) becomes \xHH. Output that does not
 * fit is cut and ends with "..." (never in the middle of an escape). Always
 * NUL-terminates. Returns <dst>, so it can be used as a printf argument.
 */
char *spop_escape(char *dst, size_t size, const void *src, size_t len)
{
	static const char hex[] = "0123456789abcdef";
	const uint8_t *p = src;
	size_t o = 0, i, total = 0;
	bool cut;

	for (i = 0; i < len; i++)
		total += p[i] >= 0x20 && p[i] < 0x7f ? (p[i] == '\\' ? 2 : 1) : 4;
	cut = total >= size;
	for (i = 0; i < len; i++) {
		uint8_t ch = p[i];
		char e[4];
		size_t n;

		if (ch >= 0x20 && ch < 0x7f && ch != '\\') {
			e[0] = (char)ch;
			n = 1;
		} else if (ch == '\\') {
			e[0] = e[1] = '\\';
			n = 2;
		} else {
			e[0] = '\\';
			e[1] = 'x';
			e[2] = hex[ch >> 4];
			e[3] = hex[ch & 15];
			n = 4;
		}
		/* keep room for the NUL, and for "..." when it will not all fit */
		if (o + n + 1 + (cut ? 3 : 0) > size) {
			if (o + 4 <= size) {
				memcpy(dst + o, "...", 3);
				o += 3;
			}
			break;
		}
		memcpy(dst + o, e, n);
		o += n;
	}
	dst[o < size ? o : size - 1] = 0;
	return dst;
}

/*
 * Reads the 4-byte big-endian frame length at <buf> holding <avail> bytes.
 * Returns 0 when fewer than 4 bytes are available, else 4 with <*len> set.
 * The caller must bound <*len> before reading the payload.
 */
int spop_frame_len_peek(const uint8_t *buf, size_t avail, uint32_t *len)
{
	if (avail < SPOP_LEN_SIZE)
		return 0;
	*len = ((uint32_t)buf[0] << 24) | ((uint32_t)buf[1] << 16) | ((uint32_t)buf[2] << 8) |
	       (uint32_t)buf[3];
	return SPOP_LEN_SIZE;
}

/*
 * Decodes the header of the frame of <len> bytes at <frame> (just after the
 * length) into <f>. Returns 0, or -SPOP_ST_INVALID for a short or truncated
 * header. Type and flags are reported, not judged.
 */
int spop_frame_decode(const uint8_t *frame, size_t len, struct spop_frame *f)
{
	struct spop_rd rd = {frame, frame + len};
	int n;

	if (len < SPOP_FRAME_MIN)
		return -SPOP_ST_INVALID;
	f->type = frame[0];
	f->flags = ((uint32_t)frame[1] << 24) | ((uint32_t)frame[2] << 16) |
		   ((uint32_t)frame[3] << 8) | (uint32_t)frame[4];
	rd.p += 5;
	n = spop_varint_decode(&rd, &f->sid);
	if (n < 0)
		return n;
	n = spop_varint_decode(&rd, &f->fid);
	if (n < 0)
		return n;
	f->payload = rd.p;
	f->len = rd_left(&rd);
	return 0;
}

/* Reads the next key/value pair of a KV-list. Returns 1, 0 at the end, or < 0. */
int spop_kv_next(struct spop_rd *rd, struct spop_str *key, struct spop_data *val)
{
	struct spop_rd r = *rd;
	int n;

	if (rd_left(&r) == 0)
		return 0;
	n = spop_str_decode(&r, key);
	if (n < 0)
		return n;
	n = spop_data_decode(&r, val);
	if (n < 0)
		return n;
	*rd = r;
	return 1;
}

/* Trims spaces and tabs around the view <s>. */
static struct spop_str str_trim(struct spop_str s)
{
	while (s.len && (s.p[0] == ' ' || s.p[0] == '\t')) {
		s.p++;
		s.len--;
	}
	while (s.len && (s.p[s.len - 1] == ' ' || s.p[s.len - 1] == '\t'))
		s.len--;
	return s;
}

/*
 * Calls <fn> on each trimmed item of the comma list <list>; stops and returns
 * true as soon as <fn> does.
 */
static bool list_any(struct spop_str list, bool (*fn)(struct spop_str item))
{
	size_t i, start = 0;

	for (i = 0; i <= list.len; i++) {
		if (i == list.len || list.p[i] == ',') {
			struct spop_str item = {list.p + start, i - start};

			if (fn(str_trim(item)))
				return true;
			start = i + 1;
		}
	}
	return false;
}

/* A supported version we speak: "2" or "2.<digits>". */
static bool version_is_2(struct spop_str v)
{
	size_t i;

	if (v.len < 1 || v.p[0] != '2')
		return false;
	if (v.len == 1)
		return true;
	if (v.p[1] != '.' || v.len == 2)
		return false;
	for (i = 2; i < v.len; i++)
		if (v.p[i] < '0' || v.p[i] > '9')
			return false;
	return true;
}

static bool is_pipelining(struct spop_str v)
{
	return spop_str_eq(&v, "pipelining");
}

/*
 * Parses the KV-list of a HAPROXY-HELLO (SPOE.txt 3.2.5) into <h>. Returns 0,
 * -SPOP_ST_NO_VSN, -SPOP_ST_BAD_VSN, or -SPOP_ST_INVALID. Views in <h> point
 * into <payload>.
 */
int spop_hello_parse(const uint8_t *payload, size_t len, struct spop_hello *h)
{
	struct spop_rd rd = {payload, payload + len};
	struct spop_str key;
	struct spop_data val;
	int64_t i;
	int ret;

	memset(h, 0, sizeof(*h));
	while ((ret = spop_kv_next(&rd, &key, &val)) > 0) {
		if (spop_str_eq(&key, "supported-versions")) {
			if (val.type != SPOP_T_STR)
				return -SPOP_ST_INVALID;
			h->has_versions = true;
			h->versions = val.v.s;
			h->version_ok = list_any(val.v.s, version_is_2);
		} else if (spop_str_eq(&key, "max-frame-size")) {
			if (!spop_data_int(&val, &i) || i < 0)
				return -SPOP_ST_INVALID;
			h->has_frame_size = true;
			h->max_frame_size = i > UINT32_MAX ? UINT32_MAX : (uint32_t)i;
		} else if (spop_str_eq(&key, "capabilities")) {
			if (val.type != SPOP_T_STR)
				return -SPOP_ST_INVALID;
			h->caps = val.v.s;
			h->cap_pipelining = list_any(val.v.s, is_pipelining);
		} else if (spop_str_eq(&key, "healthcheck")) {
			h->healthcheck = val.type == SPOP_T_BOOL && val.v.b;
		} else if (spop_str_eq(&key, "engine-id")) {
			if (val.type == SPOP_T_STR)
				h->engine_id = val.v.s;
		}
		/* unknown keys are skipped */
	}
	if (ret < 0)
		return ret;
	if (!h->has_versions)
		return -SPOP_ST_NO_VSN;
	if (!h->version_ok)
		return -SPOP_ST_BAD_VSN;
	return 0;
}

/*
 * Picks the frame size both sides use: HAProxy's announced value (16380 when
 * absent) bounded by <ours>. Returns 0 with <*out> set, or
 * -SPOP_ST_BAD_FRAME_SIZE when HAProxy's value is below the protocol minimum.
 */
int spop_frame_size_negotiate(const struct spop_hello *h, uint32_t ours, uint32_t *out)
{
	uint32_t theirs = h->has_frame_size ? h->max_frame_size : SPOP_FRAME_SIZE_DFLT;

	if (theirs < SPOP_FRAME_SIZE_MIN)
		return -SPOP_ST_BAD_FRAME_SIZE;
	if (ours < SPOP_FRAME_SIZE_MIN)
		ours = SPOP_FRAME_SIZE_MIN;
	*out = theirs < ours ? theirs : ours;
	return 0;
}

/* Parses a DISCONNECT KV-list (SPOE.txt 3.2.7) into <d>. Returns 0 or < 0. */
int spop_disconnect_parse(const uint8_t *payload, size_t len, struct spop_disconnect *d)
{
	struct spop_rd rd = {payload, payload + len};
	struct spop_str key;
	struct spop_data val;
	int64_t i;
	int ret;

	d->status = SPOP_ST_UNKNOWN;
	d->message.p = "";
	d->message.len = 0;
	while ((ret = spop_kv_next(&rd, &key, &val)) > 0) {
		if (spop_str_eq(&key, "status-code") && spop_data_int(&val, &i))
			d->status = (i < 0 || i > UINT32_MAX) ? SPOP_ST_UNKNOWN : (uint32_t)i;
		else if (spop_str_eq(&key, "message") && val.type == SPOP_T_STR)
			d->message = val.v.s;
	}
	return ret < 0 ? ret : 0;
}

/*
 * Reads the next message of a NOTIFY payload (SPOE.txt 3.2.6). All of its
 * arguments are validated before it is returned, so spop_arg_next() on it
 * cannot fail. Returns 1, 0 at the end, or -SPOP_ST_INVALID.
 */
int spop_msg_next(struct spop_rd *rd, struct spop_msg *m)
{
	struct spop_rd r = *rd;
	struct spop_str name;
	unsigned i;
	int n;

	if (rd_left(&r) == 0)
		return 0;
	n = spop_str_decode(&r, &m->name);
	if (n < 0)
		return n;
	if (rd_left(&r) < 1)
		return -SPOP_ST_INVALID;
	m->nb_args = *r.p++;
	m->args_read = 0;
	m->args.p = r.p;
	for (i = 0; i < m->nb_args; i++) {
		n = spop_str_decode(&r, &name);
		if (n < 0)
			return n;
		n = spop_data_skip(&r);
		if (n < 0)
			return n;
	}
	m->args.end = r.p;
	*rd = r;
	return 1;
}

/* Reads the next argument of <m>. Returns 1, 0 after the last one, or < 0. */
int spop_arg_next(struct spop_msg *m, struct spop_str *name, struct spop_data *val)
{
	struct spop_rd r = m->args;
	int n;

	if (m->args_read >= m->nb_args)
		return 0;
	n = spop_str_decode(&r, name);
	if (n < 0)
		return n;
	n = spop_data_decode(&r, val);
	if (n < 0)
		return n;
	m->args = r;
	m->args_read++;
	return 1;
}

void spop_wbuf_init(struct spop_wbuf *w, uint8_t *buf, size_t size)
{
	w->buf = buf;
	w->size = size;
	w->len = 0;
	w->overflow = false;
}

void spop_put_bytes(struct spop_wbuf *w, const void *p, size_t len)
{
	if (w->overflow || len > w->size - w->len) {
		w->overflow = true;
		return;
	}
	if (len)
		memcpy(w->buf + w->len, p, len);
	w->len += len;
}

void spop_put_u8(struct spop_wbuf *w, uint8_t v)
{
	spop_put_bytes(w, &v, 1);
}

void spop_put_varint(struct spop_wbuf *w, uint64_t v)
{
	uint8_t tmp[SPOP_VARINT_MAX];
	int n = spop_varint_encode(tmp, sizeof(tmp), v);

	spop_put_bytes(w, tmp, (size_t)n);
}

void spop_put_str(struct spop_wbuf *w, const char *p, size_t len)
{
	spop_put_varint(w, len);
	spop_put_bytes(w, p, len);
}

/* Writes the typed value <d>; the flag nibble is zero except for BOOL true. */
void spop_put_data(struct spop_wbuf *w, const struct spop_data *d)
{
	switch (d->type) {
	case SPOP_T_BOOL:
		spop_put_u8(w, (uint8_t)(SPOP_T_BOOL | (d->v.b ? SPOP_DATA_FLAG_TRUE : 0)));
		break;
	case SPOP_T_INT32:
	case SPOP_T_INT64:
		spop_put_u8(w, d->type);
		spop_put_varint(w, (uint64_t)d->v.i);
		break;
	case SPOP_T_UINT32:
	case SPOP_T_UINT64:
		spop_put_u8(w, d->type);
		spop_put_varint(w, d->v.u);
		break;
	case SPOP_T_IPV4:
		spop_put_u8(w, d->type);
		spop_put_bytes(w, d->v.ipv4, 4);
		break;
	case SPOP_T_IPV6:
		spop_put_u8(w, d->type);
		spop_put_bytes(w, d->v.ipv6, 16);
		break;
	case SPOP_T_STR:
	case SPOP_T_BIN:
		spop_put_u8(w, d->type);
		spop_put_str(w, d->v.s.p, d->v.s.len);
		break;
	default:
		spop_put_u8(w, SPOP_T_NULL);
		break;
	}
}

/*
 * Starts a frame: writes a length placeholder, the type, the flags and the ids.
 * Returns the offset to hand to spop_frame_end().
 */
size_t spop_frame_begin(struct spop_wbuf *w, uint8_t type, uint32_t flags, uint64_t sid,
			uint64_t fid)
{
	size_t start = w->len;
	uint8_t hdr[9] = {0, 0, 0, 0, type, (uint8_t)(flags >> 24), (uint8_t)(flags >> 16),
			  (uint8_t)(flags >> 8), (uint8_t)flags};

	spop_put_bytes(w, hdr, sizeof(hdr));
	spop_put_varint(w, sid);
	spop_put_varint(w, fid);
	return start;
}

/*
 * Finishes the frame begun at <start> by patching its length. Returns the whole
 * frame's size including the length, or -SPOP_ST_TOO_BIG if anything of it did
 * not fit (the buffer content past <start> is then garbage).
 */
int spop_frame_end(struct spop_wbuf *w, size_t start)
{
	size_t len;

	if (w->overflow || w->len - start < SPOP_LEN_SIZE + SPOP_FRAME_MIN)
		return -SPOP_ST_TOO_BIG;
	len = w->len - start - SPOP_LEN_SIZE;
	if (len > UINT32_MAX)
		return -SPOP_ST_TOO_BIG;
	w->buf[start + 0] = (uint8_t)(len >> 24);
	w->buf[start + 1] = (uint8_t)(len >> 16);
	w->buf[start + 2] = (uint8_t)(len >> 8);
	w->buf[start + 3] = (uint8_t)len;
	return (int)(w->len - start);
}

void spop_put_kv(struct spop_wbuf *w, const char *key, const struct spop_data *val)
{
	spop_put_str(w, key, strlen(key));
	spop_put_data(w, val);
}

/* Writes a set-var action (SPOE.txt 3.2.8): type, 3 args, scope, name, value. */
void spop_put_set_var(struct spop_wbuf *w, uint8_t scope, const char *name, size_t name_len,
		      const struct spop_data *val)
{
	spop_put_u8(w, SPOP_ACT_SET_VAR);
	spop_put_u8(w, 3);
	spop_put_u8(w, scope);
	spop_put_str(w, name, name_len);
	spop_put_data(w, val);
}

void spop_put_unset_var(struct spop_wbuf *w, uint8_t scope, const char *name, size_t name_len)
{
	spop_put_u8(w, SPOP_ACT_UNSET_VAR);
	spop_put_u8(w, 2);
	spop_put_u8(w, scope);
	spop_put_str(w, name, name_len);
}

/*
 * Appends a complete AGENT-HELLO frame (version 2.0, <max_frame_size>,
 * capabilities <caps>) to <w>. Returns its size or -SPOP_ST_TOO_BIG.
 */
int spop_agent_hello_build(struct spop_wbuf *w, uint32_t max_frame_size, const char *caps)
{
	size_t start = spop_frame_begin(w, SPOP_FRM_AGENT_HELLO, SPOP_FL_FIN, 0, 0);
	struct spop_data v;

	v = spop_string(SPOP_VERSION, strlen(SPOP_VERSION));
	spop_put_kv(w, "version", &v);
	v = spop_uint32(max_frame_size);
	spop_put_kv(w, "max-frame-size", &v);
	v = spop_string(caps, strlen(caps));
	spop_put_kv(w, "capabilities", &v);
	return spop_frame_end(w, start);
}

/*
 * Appends a complete AGENT-DISCONNECT frame to <w>. <message> is cut to 255
 * bytes (HAProxy 2.6 rejects longer ones). Returns its size or -SPOP_ST_TOO_BIG.
 */
int spop_agent_disconnect_build(struct spop_wbuf *w, uint32_t status, const char *message)
{
	size_t start = spop_frame_begin(w, SPOP_FRM_AGENT_DISCON, SPOP_FL_FIN, 0, 0);
	size_t mlen = strlen(message);
	struct spop_data v;

	if (mlen > 255)
		mlen = 255;
	v = spop_uint32(status);
	spop_put_kv(w, "status-code", &v);
	v = spop_string(message, mlen);
	spop_put_kv(w, "message", &v);
	return spop_frame_end(w, start);
}
