/* SPDX-License-Identifier: MIT */
/*
 * SPOP 2.0 wire codec: constants, varints, typed data, frame headers, KV lists,
 * NOTIFY message iteration, ACK action writing, HELLO/DISCONNECT handling.
 *
 * Pure functions over byte ranges: no allocation, no I/O, no logging, libc only,
 * so the same code builds into the agent, the unit tests and the fuzzer.
 * Everything that is read is distrusted: every length is checked against the
 * bytes that remain before it is used, varints stop after 10 bytes.
 *
 * Error convention: functions returning int give >= 0 on success and the
 * negated SPOP status code on failure (-SPOP_ST_INVALID, -SPOP_ST_TOO_BIG...),
 * so an error maps directly onto the AGENT-DISCONNECT status to send.
 *
 * Decoded strings (struct spop_str) are views into the input buffer: they are
 * valid only as long as that buffer is.
 */
#ifndef SPOA_SPOP_H
#define SPOA_SPOP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SPOP_VERSION           "2.0"
#define SPOP_LEN_SIZE          4       /* the big-endian length before each frame */
#define SPOP_FRAME_MIN         7       /* type + flags + two one-byte varints */
#define SPOP_FRAME_SIZE_MIN    256     /* smallest max-frame-size HAProxy accepts */
#define SPOP_FRAME_SIZE_DFLT   16380   /* HAProxy's default: tune.bufsize - 4 */
#define SPOP_VARINT_MAX        10      /* longest legal varint encoding */
#define SPOP_NAME_MAX          255     /* longest message/arg/var name we accept */

/* Frame types (SPOE.txt 3.2.4). */
enum spop_frame_type {
	SPOP_FRM_UNSET           = 0,
	SPOP_FRM_HAPROXY_HELLO   = 1,
	SPOP_FRM_HAPROXY_DISCON  = 2,
	SPOP_FRM_NOTIFY          = 3,
	SPOP_FRM_AGENT_HELLO     = 101,
	SPOP_FRM_AGENT_DISCON    = 102,
	SPOP_FRM_ACK             = 103
};

/* Frame flags (SPOE.txt 3.2.3). */
#define SPOP_FL_FIN            0x00000001U /* last fragment: always set by us */
#define SPOP_FL_ABORT          0x00000002U /* abort a fragmented payload */

/* Typed data: the type id is the LOW nibble of the type byte, flags the high one. */
enum spop_data_type {
	SPOP_T_NULL   = 0,
	SPOP_T_BOOL   = 1,
	SPOP_T_INT32  = 2,
	SPOP_T_UINT32 = 3,
	SPOP_T_INT64  = 4,
	SPOP_T_UINT64 = 5,
	SPOP_T_IPV4   = 6,
	SPOP_T_IPV6   = 7,
	SPOP_T_STR    = 8,
	SPOP_T_BIN    = 9,
	SPOP_T_COUNT        /* sentinel: ids >= this cannot be skipped */
};
#define SPOP_DATA_TYPE_MASK    0x0FU
#define SPOP_DATA_FLAG_TRUE    0x10U   /* BOOL value bit */

/* Status codes of DISCONNECT frames (SPOE.txt 3.2.7); also our error codes. */
enum spop_status {
	SPOP_ST_NORMAL          = 0,
	SPOP_ST_IO              = 1,
	SPOP_ST_TIMEOUT         = 2,
	SPOP_ST_TOO_BIG         = 3,
	SPOP_ST_INVALID         = 4,
	SPOP_ST_NO_VSN          = 5,
	SPOP_ST_NO_FRAME_SIZE   = 6,
	SPOP_ST_NO_CAP          = 7,
	SPOP_ST_BAD_VSN         = 8,
	SPOP_ST_BAD_FRAME_SIZE  = 9,
	SPOP_ST_FRAG_NOT_SUPP   = 10,
	SPOP_ST_INTERLACED      = 11,
	SPOP_ST_FRAMEID_NOTFND  = 12,
	SPOP_ST_RES             = 13,
	SPOP_ST_UNKNOWN         = 99
};

/* Variable scopes of set-var/unset-var actions (a raw byte on the wire). */
enum spop_scope {
	SPOP_SCOPE_PROC = 0,
	SPOP_SCOPE_SESS = 1,
	SPOP_SCOPE_TXN  = 2,
	SPOP_SCOPE_REQ  = 3,
	SPOP_SCOPE_RES  = 4
};

/* Action types in ACK frames. */
enum spop_action {
	SPOP_ACT_SET_VAR   = 1,
	SPOP_ACT_UNSET_VAR = 2
};

/* A view into a buffer owned by someone else. */
struct spop_str {
	const char *p;          /* ref: into the decoded frame */
	size_t len;             /* bytes, no terminating NUL */
};

/* One decoded typed value. */
struct spop_data {
	uint8_t type;           /* enum spop_data_type */
	union {
		bool b;                 /* SPOP_T_BOOL */
		int64_t i;              /* INT32, INT64 (two's complement) */
		uint64_t u;             /* UINT32, UINT64 */
		uint8_t ipv4[4];        /* network order */
		uint8_t ipv6[16];       /* network order */
		struct spop_str s;      /* STR, BIN */
	} v;
};

/* A read cursor over [p, end). */
struct spop_rd {
	const uint8_t *p;       /* ref: next byte to read */
	const uint8_t *end;     /* ref: one past the last readable byte */
};

/* A decoded frame header; the payload is a view into the input. */
struct spop_frame {
	uint8_t type;           /* enum spop_frame_type (unknown values kept) */
	uint32_t flags;         /* SPOP_FL_* */
	uint64_t sid;           /* stream-id, echoed byte-exactly in the ACK */
	uint64_t fid;           /* frame-id */
	const uint8_t *payload; /* ref: first payload byte */
	size_t len;             /* payload bytes */
};

/* One message of a NOTIFY frame; its arguments are read with spop_arg_next(). */
struct spop_msg {
	struct spop_str name;   /* message name (may be empty) */
	unsigned nb_args;       /* declared argument count */
	unsigned args_read;     /* arguments consumed so far by spop_arg_next() */
	struct spop_rd args;    /* cursor over the (already validated) arguments */
};

/* What HAPROXY-HELLO told us (SPOE.txt 3.2.5). */
struct spop_hello {
	bool version_ok;        /* supported-versions lists a 2.x version */
	bool has_versions;      /* supported-versions key present */
	bool has_frame_size;    /* max-frame-size key present */
	bool healthcheck;       /* healthcheck = true */
	bool cap_pipelining;    /* capabilities include "pipelining" */
	uint32_t max_frame_size;/* HAProxy's max-frame-size (if present) */
	struct spop_str versions;   /* ref: raw supported-versions value */
	struct spop_str caps;       /* ref: raw capabilities value */
	struct spop_str engine_id;  /* ref: engine-id (may be empty) */
};

/* What a DISCONNECT frame said. */
struct spop_disconnect {
	uint32_t status;        /* status-code (SPOP_ST_UNKNOWN if absent) */
	struct spop_str message;/* ref: message (may be empty) */
};

/*
 * A bounded output buffer with a sticky overflow flag: writers never write past
 * <size>; once something does not fit, <overflow> is set and every later write
 * is ignored, so a sequence of puts is checked once at the end.
 */
struct spop_wbuf {
	uint8_t *buf;           /* ref: caller's storage */
	size_t size;            /* capacity of buf */
	size_t len;             /* bytes written */
	bool overflow;          /* a write did not fit */
};

/* ---- names ---- */
const char *spop_status_str(int status);
const char *spop_frame_type_str(int type);
const char *spop_data_type_str(int type);

/* ---- varints (SPOE.txt 3.1) ---- */
int spop_varint_size(uint64_t v);
int spop_varint_decode(struct spop_rd *rd, uint64_t *v);
int spop_varint_encode(uint8_t *buf, size_t room, uint64_t v);

/* ---- typed data and strings ---- */
int spop_str_decode(struct spop_rd *rd, struct spop_str *s);
int spop_data_decode(struct spop_rd *rd, struct spop_data *d);
int spop_data_skip(struct spop_rd *rd);
bool spop_str_eq(const struct spop_str *s, const char *cstr);
bool spop_data_int(const struct spop_data *d, int64_t *out);
char *spop_escape(char *dst, size_t size, const void *src, size_t len);

/* ---- frames ---- */
int spop_frame_len_peek(const uint8_t *buf, size_t avail, uint32_t *len);
int spop_frame_decode(const uint8_t *frame, size_t len, struct spop_frame *f);

/* ---- KV lists (HELLO, DISCONNECT) ---- */
int spop_kv_next(struct spop_rd *rd, struct spop_str *key, struct spop_data *val);
int spop_hello_parse(const uint8_t *payload, size_t len, struct spop_hello *h);
int spop_disconnect_parse(const uint8_t *payload, size_t len, struct spop_disconnect *d);
int spop_frame_size_negotiate(const struct spop_hello *h, uint32_t ours, uint32_t *out);

/* ---- NOTIFY ---- */
int spop_msg_next(struct spop_rd *rd, struct spop_msg *m);
int spop_arg_next(struct spop_msg *m, struct spop_str *name, struct spop_data *val);

/* ---- writing ---- */
void spop_wbuf_init(struct spop_wbuf *w, uint8_t *buf, size_t size);
void spop_put_u8(struct spop_wbuf *w, uint8_t v);
void spop_put_varint(struct spop_wbuf *w, uint64_t v);
void spop_put_bytes(struct spop_wbuf *w, const void *p, size_t len);
void spop_put_str(struct spop_wbuf *w, const char *p, size_t len);
void spop_put_data(struct spop_wbuf *w, const struct spop_data *d);
size_t spop_frame_begin(struct spop_wbuf *w, uint8_t type, uint32_t flags, uint64_t sid,
			uint64_t fid);
int spop_frame_end(struct spop_wbuf *w, size_t start);
void spop_put_kv(struct spop_wbuf *w, const char *key, const struct spop_data *val);
void spop_put_set_var(struct spop_wbuf *w, uint8_t scope, const char *name, size_t name_len,
		      const struct spop_data *val);
void spop_put_unset_var(struct spop_wbuf *w, uint8_t scope, const char *name, size_t name_len);
int spop_agent_hello_build(struct spop_wbuf *w, uint32_t max_frame_size, const char *caps);
int spop_agent_disconnect_build(struct spop_wbuf *w, uint32_t status, const char *message);

/* ---- data constructors (for writers) ---- */
static inline struct spop_data spop_int64(int64_t i)
{
	struct spop_data d = {.type = SPOP_T_INT64};
	d.v.i = i;
	return d;
}

static inline struct spop_data spop_uint32(uint32_t u)
{
	struct spop_data d = {.type = SPOP_T_UINT32};
	d.v.u = u;
	return d;
}

static inline struct spop_data spop_bool(bool b)
{
	struct spop_data d = {.type = SPOP_T_BOOL};
	d.v.b = b;
	return d;
}

static inline struct spop_data spop_string(const char *p, size_t len)
{
	struct spop_data d = {.type = SPOP_T_STR};
	d.v.s.p = p;
	d.v.s.len = len;
	return d;
}

#endif /* SPOA_SPOP_H */
