/* SPDX-License-Identifier: MIT */
/*
 * A minimal HTTP/1.x server on a libev loop, for /metrics and /health.
 *
 * GET and HEAD only (405 otherwise), request head at most HTTP_HEAD_MAX bytes
 * (431 beyond, buffered only as it arrives), at most HTTP_CONNS_MAX open
 * connections unless set (beyond, the oldest one not sending a reply is
 * closed, idle kept-alive ones included), a HTTP_TIMEOUT_S deadline per request
 * unless set (from accept, or the first byte of a request on a kept connection,
 * to the end of its reply), and replies sent with Content-Length. HTTP/1.1
 * connections are kept alive unless the client says "Connection: close", for
 * at most HTTP_REQUESTS_MAX requests and HTTP_KEEPALIVE_S between two unless
 * set; pipelined requests are answered in order, a few per loop turn.
 * Nothing ever blocks: the application's handler is called synchronously from
 * the loop and must build its reply from memory.
 *
 * Who may ask (http_server_set_access()): an allow-list of networks, checked
 * on the peer's address; the Host header, checked against the listener's own
 * address and the names given (a page that rebinds a name of its own to this
 * address, DNS rebinding, sends its own name); a bearer token. Every reply
 * carries X-Content-Type-Options: nosniff, Cache-Control: no-store, and a
 * Content-Security-Policy that allows nothing unless the handler sets one.
 *
 * Not for: request bodies, chunked encoding, TLS, name resolution.
 */
#ifndef AGENT_HTTP_H
#define AGENT_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "compiler.h"

struct ev_loop;

#define HTTP_HEAD_MAX      8192            /* request head bound, 431 beyond */
#define HTTP_CONNS_MAX     64              /* open connections per server */
#define HTTP_TIMEOUT_S     5.0             /* deadline of one request (seconds) */
#define HTTP_REQUESTS_MAX  100             /* requests per kept-alive connection */
#define HTTP_KEEPALIVE_S   20.0            /* a kept connection's wait for the next request */
#define HTTP_REPLY_MAX     (8U << 20)      /* reply body bound, 500 beyond */
#define HTTP_CTYPE_MAX     128             /* longest Content-Type accepted */
#define HTTP_HEADERS_MAX   768             /* extra header bytes of a reply */

#define HTTP_CTYPE_TEXT    "text/plain; charset=utf-8"

/*
 * A reply under construction, handed to the handler. The body grows on
 * demand up to HTTP_REPLY_MAX; past that, or with an invalid status or
 * content type, the reply is marked broken and the client gets a 500.
 */
struct http_reply {
	int status;                        /* 200 unless set */
	char ctype[HTTP_CTYPE_MAX];        /* Content-Type, HTTP_CTYPE_TEXT unless set */
	char *body;                        /* owned: NUL-terminated when not NULL */
	size_t len;                        /* body bytes */
	size_t cap;                        /* allocated bytes of body */
	bool broken;                       /* sent as a 500, body dropped */
	void (*unref)(void *owner);        /* set: body is borrowed from owner, handed back so */
	void *owner;                       /* ref: what lent body */
	size_t hlen;                       /* bytes in headers */
	char headers[HTTP_HEADERS_MAX];    /* extra "Name: value\r\n" lines */
};

/*
 * Called once per valid GET/HEAD request with the request <path> (without
 * query string or fragment, not percent-decoded, NUL-terminated, valid only
 * during the call) and a reply <r> preset to 200 text/plain with an empty
 * body. For HEAD, the body built here is measured but not sent. The handler
 * must not block, run the loop, or free the server.
 */
typedef void (*http_handler_fn)(const char *path, struct http_reply *r, void *arg);

/*
 * The request parser, on its own for its tests and fuzz target: the search
 * for the end of a request head, resumed as bytes arrive, and the request
 * line read into what the server answers.
 */
struct http_scan {
	size_t start;                      /* first byte after leading empty lines */
	size_t scan;                       /* where the search for the head end resumes */
};

struct http_request {
	int status;                        /* 0: served, else 400, 405 or 505 */
	bool head;                         /* HEAD: the reply's body is not sent */
	bool http10;                       /* HTTP/1.0: the connection is not kept */
	const char *path;                  /* when served: the path, in the line */
};

ssize_t http_head_scan(struct http_scan *st, const char *in, size_t len, size_t *end);
void http_request_parse(char *line, size_t len, struct http_request *req);

/* Counters of one server, for its own metrics. */
struct http_stats {
	uint64_t accepted;                 /* connections taken in charge */
	uint64_t refused;                  /* closed at once: limit or no fd left */
	uint64_t requests;                 /* replies sent (any status) */
	uint64_t bad_requests;             /* replies >= 400 made by the server itself */
	uint64_t timeouts;                 /* connections closed by the deadline */
	uint64_t evicted;                  /* idle ones closed to admit a new connection */
	uint64_t forbidden;                /* refused: address not allowed, foreign Host, no token */
};

struct http_server;

/* Who may ask; every part optional. Copied by http_server_set_access(); a
 * server it was never called for answers anyone, whatever Host they name. */
struct http_access {
	const char *const *allow;          /* networks, "ip" or "ip/bits"; none: anyone */
	size_t nallow;
	const char *const *hosts;          /* names a Host header may carry beside "localhost"
					    * and the listener's address; "*": any */
	size_t nhosts;
	const char *token;                 /* "Authorization: Bearer <token>" required, or NULL */
	const char *const *open_paths;     /* served without the token (probes), NULL-terminated */
};

void http_reply_init(struct http_reply *r);
void http_reply_release(struct http_reply *r);
void http_reply_status(struct http_reply *r, int status, const char *content_type);
void http_reply_append(struct http_reply *r, const char *data, size_t len);
void http_reply_printf(struct http_reply *r, const char *fmt, ...) PRINTF(2, 3);
void http_reply_header(struct http_reply *r, const char *name, const char *value);
void http_reply_lend(struct http_reply *r, char *body, size_t len, void (*unref)(void *owner),
		     void *owner);

struct http_server *http_server_new(struct ev_loop *loop, const char *addr, bool reuseport,
				    http_handler_fn fn, void *arg, char *err,
				    size_t errlen) MUSTCHECK;
void http_server_free(struct http_server *s);
void http_server_set_timeout(struct http_server *s, double seconds);
void http_server_set_max_conns(struct http_server *s, size_t n);
void http_server_set_max_requests(struct http_server *s, unsigned n);
void http_server_set_keepalive(struct http_server *s, double seconds);
int http_server_set_access(struct http_server *s, const struct http_access *a, char *err,
			   size_t errlen) MUSTCHECK;

int http_server_port(const struct http_server *s);
size_t http_server_conns(const struct http_server *s);
const struct http_stats *http_server_stats(const struct http_server *s);

#endif /* AGENT_HTTP_H */
