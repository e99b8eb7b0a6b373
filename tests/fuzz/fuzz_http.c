/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target for the request parser of the metrics listener
 * (src/net/http.c): http_head_scan(), which finds the end of a request head as
 * bytes arrive, and http_request_parse(), which reads the request line into
 * what the server answers. Whoever can connect to the listener reaches both.
 *
 * The input is what a client sends on one connection. It is read as the
 * server reads it, a head at most HTTP_HEAD_MAX bytes (431 beyond), and, to
 * exercise pipelining, every head that follows is read too, from where the
 * previous one ended. Three ways: whole; one byte more per call, so that the
 * search stops at every byte boundary; in chunks whose sizes are drawn from
 * the input's hash. Every complete head's request line is copied into an
 * exactly sized heap buffer and parsed. Every way must find the same heads,
 * the same request lines and the same answers; each answer is checked on its
 * own (a status the server sends, a path that starts with '/' and holds no
 * query, fragment, space or control byte, inside the line). Any disagreement
 * calls abort(). Inputs over 64 KiB are ignored.
 *
 * Build and replay: see tests/fuzz/README.md (make fuzz, make replay).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "http.h"

#define FUZZ_MAX_INPUT (1U << 16)
#define HEADS_MAX      64       /* pipelined heads followed per input */

/* One head as found, and what the server answers to it. */
struct head {
	size_t start, len, end;   /* request line (offsets in the input), head end */
	int status;               /* 0 (served), 400, 405, 505 */
	bool head;
	size_t path_off, path_len; /* in the line; path_len 0: the static "/" */
};

struct outcome {
	struct head h[HEADS_MAX];
	size_t n;
	bool too_large;           /* the last head passed HTTP_HEAD_MAX: 431 */
};

/* A 64-bit FNV-1a of the input, for the chunk sizes. */
static uint64_t hash(const uint8_t *p, size_t n)
{
	uint64_t h = 1469598103934665603ULL;

	while (n--)
		h = (h ^ *p++) * 1099511628211ULL;
	return h;
}

static bool is_token_char(unsigned char ch)
{
	return ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'z') || (ch >= '0' && ch <= '9') ||
	       (ch && strchr("!#$%&'*+-.^_`|~", ch));
}

/* Parses the request line of <h> (in <in>), checks the answer, records it. */
static void parse_line(const uint8_t *in, struct head *h)
{
	char *line = malloc(h->len ? h->len : 1);
	struct http_request req;
	size_t i;

	CHECK(line != NULL);
	memcpy(line, in + h->start, h->len);
	for (i = 0; i < h->len; i++)
		CHECK(line[i] != '\n');
	/* the line ends at the first LF, one CR before it taken off */
	CHECK(in[h->start + h->len] == '\n' ||
	      (in[h->start + h->len] == '\r' && in[h->start + h->len + 1] == '\n'));
	http_request_parse(line, h->len, &req);
	CHECK(req.status == 0 || req.status == 400 || req.status == 405 || req.status == 505);
	h->status = req.status;
	h->head = req.head;
	h->path_off = h->path_len = 0;
	if (req.status == 405)
		CHECK(!req.head);
	if (req.head)
		CHECK(h->len >= 5 && memcmp(in + h->start, "HEAD ", 5) == 0);
	if (req.status != 0) {
		CHECK(req.path == NULL);
	} else {
		size_t pl = strlen(req.path);

		CHECK(req.head || (h->len >= 4 && memcmp(in + h->start, "GET ", 4) == 0));
		CHECK(h->len >= 9 && memcmp(in + h->start + h->len - 9, " HTTP/1.", 8) == 0);
		CHECK(req.path[0] == '/');
		for (i = 0; i < pl; i++) {
			unsigned char ch = (unsigned char)req.path[i];

			CHECK(ch > 0x20 && ch < 0x7f && ch != '?' && ch != '#');
		}
		if (req.path >= line && req.path < line + h->len) {
			CHECK(req.path + pl <= line + h->len);
			h->path_off = (size_t)(req.path - line);
			h->path_len = pl;
		} else {
			CHECK(strcmp(req.path, "/") == 0);
		}
		/* every byte of the method is a token character */
		for (i = 0; in[h->start + i] != ' '; i++)
			CHECK(is_token_char(in[h->start + i]));
	}
	free(line);
}

/*
 * Reads the heads of the <size> bytes at <in>, handing the scanner <step>
 * more bytes per call (0: all at once; SIZE_MAX: sizes drawn from <seed>).
 */
static void read_heads(const uint8_t *in, size_t size, size_t step, uint64_t seed,
		       struct outcome *o)
{
	size_t off = 0;

	memset(o, 0, sizeof(*o));
	while (off < size && o->n < HEADS_MAX) {
		size_t avail = size - off, cap = avail < HTTP_HEAD_MAX ? avail : HTTP_HEAD_MAX;
		struct http_scan st = {0};
		size_t seen = 0, end = 0;
		ssize_t n = -1;

		while (seen < cap) {
			size_t more = step;

			if (step == SIZE_MAX) {
				seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
				more = (seed >> 33) % 4 == 0 ? 1 + (seed >> 40) % 2048
							     : 1 + (seed >> 40) % 16;
			}
			seen = step == 0 || more >= cap - seen ? cap : seen + more;
			n = http_head_scan(&st, (const char *)in + off, seen, &end);
			CHECK(st.start <= seen);
			if (n >= 0)
				break;
		}
		if (n < 0) {
			o->too_large = cap == HTTP_HEAD_MAX;
			return;
		}
		CHECK(st.start + (size_t)n < end && end <= seen);
		o->h[o->n].start = off + st.start;
		o->h[o->n].len = (size_t)n;
		o->h[o->n].end = off + end;
		parse_line(in, &o->h[o->n]);
		o->n++;
		off += end;
	}
}

static bool same(const struct outcome *a, const struct outcome *b)
{
	size_t i;

	if (a->n != b->n || a->too_large != b->too_large)
		return false;
	for (i = 0; i < a->n; i++) {
		const struct head *x = &a->h[i], *y = &b->h[i];

		if (x->start != y->start || x->len != y->len || x->end != y->end ||
		    x->status != y->status || x->head != y->head || x->path_off != y->path_off ||
		    x->path_len != y->path_len)
			return false;
	}
	return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct outcome whole, bytewise, chunked;
	uint64_t h;

	if (size > FUZZ_MAX_INPUT)
		return 0;
	h = hash(data, size);
	read_heads(data, size, 0, 0, &whole);
	read_heads(data, size, 1, 0, &bytewise);
	read_heads(data, size, SIZE_MAX, h, &chunked);
	CHECK(same(&whole, &bytewise));
	CHECK(same(&whole, &chunked));
	return 0;
}
