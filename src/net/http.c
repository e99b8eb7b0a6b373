/* SPDX-License-Identifier: MIT */
/*
 * Minimal HTTP/1.x server for metrics and health checks.
 *
 * DESIGN
 * A connection goes READ -> WRITE -> (READ again, kept alive) -> ... -> (freed),
 * through LINGER when bytes may still come that it will not read.
 *  - READ: bytes accumulate in a buffer allocated when the first bytes come
 *    (HTTP_IN_MIN, doubling up to HTTP_HEAD_MAX) until an empty line ends the
 *    head. A full HTTP_HEAD_MAX buffer without one is answered 431. The
 *    request line is parsed strictly (method SP target SP HTTP/1.x); headers
 *    are not interpreted and a body is never read.
 *  - WRITE: the status line and headers (built in a small fixed buffer) and
 *    the reply body leave with sendmsg(); EAGAIN waits for EV_WRITE.
 *  - kept alive (HTTP/1.1 without "Connection: close", fewer than max_requests
 *    answered, a reply the server did not make to refuse): back to READ, with
 *    what follows the request in the buffer (a pipelined request). A request
 *    already buffered is not answered at once: the connection waits in the
 *    server's ready list, served by an idle watcher a few at a time, when the
 *    loop has nothing else to do (a client that pipelines a hundred requests
 *    cannot make one loop turn last).
 *  - closed at once when nothing is left unread (the client said close), or
 *  - LINGER: once everything is sent we shut down our side and read and drop
 *    what the client still sends until it closes (bounded in bytes and time):
 *    closing with unread input would make the kernel send a RST, which can
 *    destroy the reply before the client reads it (e.g. a 431 to a client
 *    still sending its head).
 * One ev_timer per connection enforces the deadline (HTTP_TIMEOUT_S unless
 * set) of each request, from accept or its first byte on a kept connection to
 * the end of the reply; between two requests, the wait for the next one
 * (HTTP_KEEPALIVE_S unless set); lingering is further capped at HTTP_LINGER_S.
 *
 * Every watcher of the server runs at EV_MINPRI: in a loop turn where SPOP
 * frames and HTTP requests are both ready, the frames go first.
 *
 * A connection is freed by the callback that decided so, which returns at
 * once: no call path touches it afterwards, so no deferred free is needed.
 * At the connection bound (HTTP_CONNS_MAX unless set) the oldest connection
 * still reading its head, or lingering, is closed to admit the new one: idle
 * sockets can never lock a scraper out. Only when every connection is sending
 * a reply is a new one accepted and closed at once (so the backlog never hides
 * it); EMFILE is handled with a spare fd.
 */
#include "http.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <ev.h>

#include "list.h"
#include "log.h"
#include "util.h"

#define HTTP_LINGER_S       1.0             /* longest wait for the client's close */
#define HTTP_LINGER_BYTES   (64U << 10)     /* most input dropped while lingering */
#define HTTP_ACCEPT_BURST   8               /* accepts per loop iteration */
#define HTTP_READY_BURST    4               /* pipelined requests per idle call */
#define HTTP_WARN_EVERY_S   10.0            /* log refusals at most this often */
#define HTTP_OUT_HEAD_MAX   (768 + HTTP_HEADERS_MAX) /* status line and headers */
#define HTTP_IN_MIN         1024            /* first request head buffer */

enum http_conn_state {
	HTTP_CS_READ   = 0,
	HTTP_CS_WRITE  = 1,
	HTTP_CS_LINGER = 2,
	HTTP_CS_COUNT      /* sentinel */
};

struct http_conn {
	struct list node;                  /* in http_server.conns */
	struct http_server *srv;           /* ref: owner */
	int fd;                            /* owned */
	enum http_conn_state state;
	ev_io io;                          /* EV_READ in READ/LINGER, EV_WRITE in WRITE */
	ev_timer timer;                    /* deadline */
	char *in;                          /* owned: request head, NULL until bytes come */
	size_t in_cap;                     /* allocated size of in */
	size_t in_len;                     /* bytes in in */
	struct http_scan hs;               /* the search for the end of the head */
	struct http_reply reply;           /* the reply being sent */
	size_t req_end;                    /* bytes of in the request answered took */
	unsigned nreq;                     /* requests answered on this connection */
	bool keep;                         /* read the next request after this reply */
	bool linger;                       /* the client may still be sending: linger */
	bool queued;                       /* in http_server.ready */
	struct list rnode;                 /* in http_server.ready: a request buffered */
	size_t out_len;                    /* bytes of out_head + body to send */
	size_t out_off;                    /* bytes of them sent */
	size_t out_head_len;               /* bytes in out_head */
	size_t drained;                    /* bytes dropped while lingering */
	struct ip_net peer;                /* who connected (a v4-mapped address as v4) */
	struct ip_net local;               /* the address it reached (family 0: not read yet) */
	char out_head[HTTP_OUT_HEAD_MAX];  /* status line and headers */
};

struct http_server {
	struct ev_loop *loop;              /* ref: caller's loop */
	http_handler_fn fn;                /* the application's handler */
	void *arg;                         /* ref: handler argument */
	int fd;                            /* owned: listening socket */
	int spare_fd;                      /* owned: released on EMFILE, -1 if none */
	ev_io io;                          /* accept watcher */
	struct list conns;                 /* http_conn.node */
	struct list ready;                 /* http_conn.rnode: a request buffered */
	ev_idle idle;                      /* serves ready, when the loop is idle */
	unsigned max_requests;             /* per connection */
	struct ip_net local;               /* bound address; family 0 for a wildcard */
	long date_at;                      /* second of date */
	char date[40];                     /* IMF-fixdate of date_at */
	size_t nconns;                     /* length of conns */
	size_t max_conns;                  /* bound of nconns */
	double timeout;                    /* deadline of one request, seconds */
	double keepalive;                  /* wait for the next request, seconds */
	int port;                          /* bound port */
	struct http_stats stats;
	uint64_t refused_unlogged;         /* refusals since the last warning */
	double last_warn;                  /* ev_now() of the last warning, 0 = never */
	/* who may ask (http_server_set_access()) */
	struct ip_net *allow;              /* owned, nallow; none: anyone */
	size_t nallow;
	char **hosts;                      /* owned, nhosts names for Host */
	size_t nhosts;
	bool host_check;                   /* access set: the Host header is checked ... */
	bool any_host;                     /* ... unless "*" */
	char *token;                       /* owned or NULL */
	char **open_paths;                 /* owned, NULL-terminated, or NULL */
	uint64_t forbidden_unlogged;       /* refused requests since the last warning */
	double forbidden_warn;             /* ev_now() of that warning, 0 = never */
};

/* ---------------------------------------------------------------- replies */

/* True for the characters of an RFC 9110 token (methods, header names). */
static bool is_tchar(unsigned char ch)
{
	if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9'))
		return true;
	return ch != 0 && strchr("!#$%&'*+-.^_`|~", ch) != NULL;
}


/* Prepares <r> as an empty 200 text/plain reply. Nothing is allocated yet. */
void http_reply_init(struct http_reply *r)
{
	memset(r, 0, sizeof(*r));
	r->status = 200;
	snprintf(r->ctype, sizeof(r->ctype), "%s", HTTP_CTYPE_TEXT);
}

/* Frees the body of <r> (or hands a lent one back), leaving <r> without one. */
static void reply_drop_body(struct http_reply *r)
{
	if (r->unref)
		r->unref(r->owner);
	else
		free(r->body);
	r->body = NULL;
	r->unref = NULL;
	r->owner = NULL;
	r->len = r->cap = 0;
}

/* Frees the body of <r> and leaves it initialised (reusable). */
void http_reply_release(struct http_reply *r)
{
	reply_drop_body(r);
	http_reply_init(r);
}

/*
 * Makes the <len> bytes at <body> the body of <r> without copying them: they
 * must stay as they are until <unref>(<owner>) is called, once, when <r> is
 * done with them (sent, or released). Replaces the body <r> had. Appending to
 * <r> afterwards copies them first.
 */
void http_reply_lend(struct http_reply *r, char *body, size_t len, void (*unref)(void *owner),
		     void *owner)
{
	reply_drop_body(r);
	r->body = body;
	r->len = r->cap = len;
	r->unref = unref;
	r->owner = owner;
}

/* Drops the body of <r> for good: the client will get a 500. */
static void reply_break(struct http_reply *r)
{
	reply_drop_body(r);
	r->broken = true;
}

/*
 * Sets the status of <r> to <status> and, unless <content_type> is NULL, its
 * Content-Type (copied). A status outside 200-599, 204 or 304 (which may not
 * carry a body), or a content type that is too long or holds control
 * characters (header injection) breaks the reply into a 500.
 */
void http_reply_status(struct http_reply *r, int status, const char *content_type)
{
	size_t i, n;

	if (status < 200 || status > 599 || status == 204 || status == 304) {
		reply_break(r);
		return;
	}
	r->status = status;
	if (!content_type)
		return;
	n = strlen(content_type);
	if (n == 0 || n >= sizeof(r->ctype)) {
		reply_break(r);
		return;
	}
	for (i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)content_type[i];

		if (ch < 0x20 || ch >= 0x7f) {
			reply_break(r);
			return;
		}
	}
	memcpy(r->ctype, content_type, n + 1);
}

/*
 * Makes room for <more> body bytes plus a NUL in <r>. Returns false (and
 * breaks the reply) if the body would pass HTTP_REPLY_MAX.
 */
static bool reply_reserve(struct http_reply *r, size_t more)
{
	size_t need, cap;

	if (r->broken)
		return false;
	if (r->unref) { /* a lent body is never written to: copy it */
		char *own = xmalloc(r->len + 1);

		memcpy(own, r->body, r->len);
		own[r->len] = 0;
		r->unref(r->owner);
		r->unref = NULL;
		r->owner = NULL;
		r->body = own;
		r->cap = r->len + 1;
	}
	if (more > HTTP_REPLY_MAX - r->len) {
		LOG(LOG_WARN, "http: reply body over %u bytes, sending a 500", HTTP_REPLY_MAX);
		reply_break(r);
		return false;
	}
	need = r->len + more + 1;
	if (need <= r->cap)
		return true;
	cap = r->cap ? r->cap : 4096;
	while (cap < need)
		cap *= 2;
	if (cap > HTTP_REPLY_MAX + 1)
		cap = HTTP_REPLY_MAX + 1;
	r->body = xrealloc(r->body, cap);
	r->cap = cap;
	return true;
}

/* Appends the <len> bytes at <data> to the body of <r> (copied). */
void http_reply_append(struct http_reply *r, const char *data, size_t len)
{
	if (!reply_reserve(r, len))
		return;
	memcpy(r->body + r->len, data, len);
	r->len += len;
	r->body[r->len] = 0;
}

/* Appends printf(<fmt>, ...) to the body of <r>. */
void http_reply_printf(struct http_reply *r, const char *fmt, ...)
{
	va_list ap;
	size_t room;
	int n;

	if (!reply_reserve(r, 0))
		return;
	room = r->cap - r->len;
	va_start(ap, fmt);
	n = vsnprintf(r->body + r->len, room, fmt, ap);
	va_end(ap);
	if (n < 0) {
		reply_break(r);
		return;
	}
	if ((size_t)n >= room) {
		if (!reply_reserve(r, (size_t)n))
			return;
		va_start(ap, fmt);
		n = vsnprintf(r->body + r->len, r->cap - r->len, fmt, ap);
		va_end(ap);
		BUG_ON(n < 0 || (size_t)n >= r->cap - r->len);
	}
	r->len += (size_t)n;
}

/*
 * Adds the header "<name>: <value>" to <r>. A name that is not a token, a
 * value with control characters (header injection), or headers beyond
 * HTTP_HEADERS_MAX bytes break the reply into a 500.
 */
void http_reply_header(struct http_reply *r, const char *name, const char *value)
{
	size_t nl = strlen(name), vl = strlen(value), i;
	int n;

	if (r->broken)
		return;
	for (i = 0; i < nl; i++)
		if (!is_tchar((unsigned char)name[i]))
			break;
	for (n = 0; (size_t)n < vl; n++)
		if ((unsigned char)value[n] < 0x20 || (unsigned char)value[n] == 0x7f)
			break;
	if (nl == 0 || i < nl || (size_t)n < vl || nl + vl + 4 >= sizeof(r->headers) - r->hlen) {
		reply_break(r);
		return;
	}
	n = snprintf(r->headers + r->hlen, sizeof(r->headers) - r->hlen, "%s: %s\r\n", name, value);
	r->hlen += (size_t)n;
}

static const char *status_reason(int status)
{
	switch (status) {
	case 200: return "OK";
	case 400: return "Bad Request";
	case 401: return "Unauthorized";
	case 403: return "Forbidden";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 429: return "Too Many Requests";
	case 431: return "Request Header Fields Too Large";
	case 500: return "Internal Server Error";
	case 501: return "Not Implemented";
	case 503: return "Service Unavailable";
	case 505: return "HTTP Version Not Supported";
	default: break;
	}
	if (status >= 500)
		return "Server Error";
	if (status >= 400)
		return "Client Error";
	return status >= 300 ? "Redirection" : "Success";
}

/* ---------------------------------------------------------------- connections */

static void conn_close(struct http_conn *c)
{
	struct http_server *srv = c->srv;

	if (c->queued)
		list_del(&c->rnode);
	ev_io_stop(srv->loop, &c->io);
	ev_timer_stop(srv->loop, &c->timer);
	close(c->fd);
	list_del(&c->node);
	srv->nconns--;
	http_reply_release(&c->reply);
	free(c->in);
	free(c);
}

/* Switches the io watcher of <c> to <events> (no system call if it watches them already). */
static void conn_watch(struct http_conn *c, int events)
{
	struct ev_loop *loop = c->srv->loop;

	if (ev_is_active(&c->io) && (c->io.events & (EV_READ | EV_WRITE)) == events)
		return;
	ev_io_stop(loop, &c->io);
	ev_io_set(&c->io, c->fd, events);
	ev_io_start(loop, &c->io);
}

/* The loop's time as an IMF-fixdate, formatted once a second for <srv>. */
static const char *http_date(struct http_server *srv)
{
	static const char days[7][4] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
	static const char months[12][4] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
					   "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
	time_t now = (time_t)ev_now(srv->loop);
	struct tm tm;

	if ((long)now == srv->date_at)
		return srv->date;
	gmtime_r(&now, &tm);
	snprintf(srv->date, sizeof(srv->date), "%s, %02d %s %04d %02d:%02d:%02d GMT",
		 days[tm.tm_wday % 7], tm.tm_mday, months[tm.tm_mon % 12], tm.tm_year + 1900,
		 tm.tm_hour, tm.tm_min, tm.tm_sec);
	srv->date_at = (long)now;
	return srv->date;
}

/* Enters LINGER: our side is done, drop input until the client closes. */
static void conn_linger(struct http_conn *c)
{
	struct ev_loop *loop = c->srv->loop;

	c->state = HTTP_CS_LINGER;
	http_reply_release(&c->reply);
	FREE_AND_NULL(c->in);
	c->in_cap = c->in_len = 0;
	(void)shutdown(c->fd, SHUT_WR);
	if (ev_timer_remaining(loop, &c->timer) > HTTP_LINGER_S) {
		ev_timer_stop(loop, &c->timer);
		ev_timer_set(&c->timer, HTTP_LINGER_S, 0.);
		ev_timer_start(loop, &c->timer);
	}
	conn_watch(c, EV_READ);
}

static void conn_parse(struct http_conn *c);

/* Restarts the deadline of <c>: <seconds> from now. */
static void conn_deadline(struct http_conn *c, double seconds)
{
	struct ev_loop *loop = c->srv->loop;

	ev_timer_stop(loop, &c->timer);
	ev_timer_set(&c->timer, seconds, 0.);
	ev_timer_start(loop, &c->timer);
}

/*
 * The reply of <c> is sent and the connection kept: back to READ with what
 * followed the request. A request already buffered waits in the ready list
 * (served by ready_cb() when the loop is idle), else the next bytes are awaited.
 */
static void conn_next(struct http_conn *c)
{
	struct http_server *srv = c->srv;

	http_reply_release(&c->reply);
	c->in_len -= c->req_end;
	if (c->in_len)
		memmove(c->in, c->in + c->req_end, c->in_len);
	c->req_end = 0;
	memset(&c->hs, 0, sizeof(c->hs));
	c->state = HTTP_CS_READ;
	conn_deadline(c, c->in_len ? srv->timeout : srv->keepalive);
	if (!c->in_len) {
		conn_watch(c, EV_READ);
		return;
	}
	ev_io_stop(srv->loop, &c->io);
	list_append(&srv->ready, &c->rnode);
	c->queued = true;
	ev_idle_start(srv->loop, &srv->idle);
}

/*
 * The reply of <c> is sent: read the next request, or close at once when the
 * client sent nothing we did not read (no RST can destroy the reply), or
 * linger. Returns 0, or -1 if <c> was closed.
 */
static int conn_done(struct http_conn *c)
{
	if (c->keep) {
		conn_next(c);
		return 0;
	}
	if (c->linger || c->in_len > c->req_end) {
		conn_linger(c);
		return 0;
	}
	conn_close(c);
	return -1;
}

/* Sends what the socket takes. Returns 0, or -1 if <c> was closed. */
static int conn_flush(struct http_conn *c)
{
	while (c->out_off < c->out_len) {
		struct iovec iov[2];
		struct msghdr msg;
		size_t body_len = c->out_len - c->out_head_len;
		ssize_t n;
		int niov = 0;

		if (c->out_off < c->out_head_len) {
			iov[niov].iov_base = c->out_head + c->out_off;
			iov[niov].iov_len = c->out_head_len - c->out_off;
			niov++;
			if (body_len) {
				iov[niov].iov_base = c->reply.body;
				iov[niov].iov_len = body_len;
				niov++;
			}
		} else {
			iov[niov].iov_base = c->reply.body + (c->out_off - c->out_head_len);
			iov[niov].iov_len = c->out_len - c->out_off;
			niov++;
		}
		memset(&msg, 0, sizeof(msg));
		msg.msg_iov = iov;
		msg.msg_iovlen = (size_t)niov;
		n = sendmsg(c->fd, &msg, MSG_NOSIGNAL);
		if (n == -1) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				conn_watch(c, EV_WRITE);
				return 0;
			}
			LOG(LOG_DEBUG, "http: send: %s", strerror(errno));
			conn_close(c);
			return -1;
		}
		c->out_off += (size_t)n;
	}
	return conn_done(c);
}

/* Whether the handler set header <name> (case-insensitive) on <r>. */
static bool has_header(const struct http_reply *r, const char *name)
{
	size_t nl = strlen(name), i = 0;

	while (i + nl < r->hlen) {
		const char *eol = memchr(r->headers + i, '\n', r->hlen - i);

		if (strncasecmp(r->headers + i, name, nl) == 0 && r->headers[i + nl] == ':')
			return true;
		if (!eol)
			break;
		i = (size_t)(eol - r->headers) + 1;
	}
	return false;
}

/*
 * Sends the reply of <c>: <head_only> for HEAD, <allow> adds the Allow header
 * of a 405. A broken reply is replaced by a 500 here.
 */
static void conn_respond(struct http_conn *c, bool head_only, bool allow)
{
	struct http_reply *r = &c->reply;
	int n;

	if (r->broken) {
		http_reply_release(r);
		http_reply_status(r, 500, NULL);
		http_reply_printf(r, "500 %s\n", status_reason(500));
	}
	c->nreq++;
	if (c->nreq >= c->srv->max_requests) {
		/* the last one: it may have sent more already */
		c->keep = false;
		c->linger = true;
	}
	n = snprintf(c->out_head, sizeof(c->out_head),
		     "HTTP/1.1 %d %s\r\n"
		     "Content-Type: %s\r\n"
		     "Content-Length: %zu\r\n"
		     "Date: %s\r\n"
		     "Cache-Control: no-store\r\n"
		     "X-Content-Type-Options: nosniff\r\n"
		     "Referrer-Policy: no-referrer\r\n"
		     "%s%s%.*s"
		     "%s"
		     "\r\n",
		     r->status, status_reason(r->status), r->ctype, r->len, http_date(c->srv),
		     allow ? "Allow: GET, HEAD\r\n" : "",
		     has_header(r, "Content-Security-Policy") ? ""
		     : "Content-Security-Policy: default-src 'none'; frame-ancestors 'none'\r\n",
		     (int)r->hlen, r->headers, c->keep ? "" : "Connection: close\r\n");
	/* bounded: ctype < HTTP_CTYPE_MAX, headers < HTTP_HEADERS_MAX, the rest short and fixed */
	BUG_ON(n < 0 || (size_t)n >= sizeof(c->out_head));
	c->out_head_len = (size_t)n;
	c->out_len = c->out_head_len + (head_only ? 0 : r->len);
	c->out_off = 0;
	c->state = HTTP_CS_WRITE;
	c->srv->stats.requests++;
	(void)conn_flush(c);
}

/* Answers <status> with a short text body made by the server itself. */
static void conn_error(struct http_conn *c, int status, bool head_only)
{
	http_reply_release(&c->reply);
	http_reply_status(&c->reply, status, NULL);
	http_reply_printf(&c->reply, "%d %s\n", status, status_reason(status));
	c->srv->stats.bad_requests++;
	c->keep = false; /* where the next request starts is not known */
	c->linger = true;
	conn_respond(c, head_only, status == 405);
}

/*
 * Parses the request line of <len> bytes at <line> (no CR/LF), which is
 * modified in place, into <req>: req->status is 0 and req->path the path to
 * serve (in <line>: without query string or fragment, the path of an
 * absolute-form target, "/" when empty), or req->status is the error to
 * answer (400, 405, 505). req->head tells a HEAD request, once the method is
 * known to be valid and the version is read. Never reads outside <line>.
 */
void http_request_parse(char *line, size_t len, struct http_request *req)
{
	char *method = line, *target, *version, *end = line + len;
	size_t mlen, tlen, vlen, i;

	req->status = 400;
	req->head = false;
	req->http10 = false;
	req->path = NULL;
	target = memchr(line, ' ', len);
	if (!target || target == line)
		return;
	mlen = (size_t)(target - method);
	target++;
	version = memchr(target, ' ', (size_t)(end - target));
	if (!version || version == target)
		return;
	tlen = (size_t)(version - target);
	version++;
	vlen = (size_t)(end - version);
	for (i = 0; i < mlen; i++)
		if (!is_tchar((unsigned char)method[i]))
			return;
	for (i = 0; i < tlen; i++) {
		unsigned char ch = (unsigned char)target[i];

		if (ch <= 0x20 || ch >= 0x7f)
			return;
	}
	req->head = mlen == 4 && memcmp(method, "HEAD", 4) == 0;
	/* HTTP/<digit>.<digit>; any 1.x is served as 1.1 (RFC 9110 2.5) */
	if (vlen != 8 || memcmp(version, "HTTP/", 5) != 0 || !isdigit((unsigned char)version[5]) ||
	    version[6] != '.' || !isdigit((unsigned char)version[7]))
		return;
	if (version[5] != '1') {
		req->status = 505;
		return;
	}
	req->http10 = version[7] == '0';
	if (!req->head && !(mlen == 3 && memcmp(method, "GET", 3) == 0)) {
		req->status = 405;
		req->head = false;
		return;
	}
	target[tlen] = 0;
	if (target[0] != '/') {
		/* absolute-form (RFC 9112 3.2.2): keep the path of the URI */
		if (strncasecmp(target, "http://", 7) == 0)
			target += 7;
		else if (strncasecmp(target, "https://", 8) == 0)
			target += 8;
		else
			return;
		target += strcspn(target, "/?#");
	}
	target[strcspn(target, "?#")] = 0;
	req->path = target[0] == '/' ? target : "/";
	req->status = 0;
}

/* ---------------------------------------------------------------- access */

/* <sa> as a host address (bits: all); an IPv4-mapped IPv6 address as IPv4. */
static void net_of(const struct sockaddr_storage *sa, struct ip_net *out)
{
	static const unsigned char mapped[12] = {[10] = 0xff, [11] = 0xff};

	memset(out, 0, sizeof(*out));
	if (sa->ss_family == AF_INET) {
		out->family = AF_INET;
		out->bits = 32;
		memcpy(out->addr, &((const struct sockaddr_in *)sa)->sin_addr, 4);
	} else if (sa->ss_family == AF_INET6) {
		const unsigned char *a = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;

		if (memcmp(a, mapped, 12) == 0) {
			out->family = AF_INET;
			out->bits = 32;
			memcpy(out->addr, a + 12, 4);
		} else {
			out->family = AF_INET6;
			out->bits = 128;
			memcpy(out->addr, a, 16);
		}
	}
}

/*
 * The value of header <name> among the header lines [p, end) (each ended by
 * LF, CR LF too), spaces around it trimmed: its start and *<vlen>, NULL when
 * absent; *<count> how many times it appears.
 */
static const char *head_header(const char *p, const char *end, const char *name, size_t *vlen,
			       unsigned *count)
{
	size_t nl = strlen(name);
	const char *val = NULL;

	*count = 0;
	*vlen = 0;
	while (p < end) {
		const char *eol = memchr(p, '\n', (size_t)(end - p)), *v, *ve;

		if (!eol)
			eol = end;
		if ((size_t)(eol - p) > nl && strncasecmp(p, name, nl) == 0 && p[nl] == ':') {
			v = p + nl + 1;
			ve = eol;
			while (v < ve && (*v == ' ' || *v == '\t'))
				v++;
			while (ve > v && (ve[-1] == '\r' || ve[-1] == ' ' || ve[-1] == '\t'))
				ve--;
			if (!(*count)++) {
				val = v;
				*vlen = (size_t)(ve - v);
			}
		}
		p = eol + 1;
	}
	return val;
}

/*
 * Fills c->local, the address the connection reached, once: the listener's
 * when it is bound to one, else getsockname() (left family 0 if that fails).
 */
static void conn_local(struct http_conn *c)
{
	struct sockaddr_storage local;
	socklen_t llen = sizeof(local);

	if (c->local.family)
		return;
	if (c->srv->local.family)
		c->local = c->srv->local;
	else if (getsockname(c->fd, (struct sockaddr *)&local, &llen) == 0)
		net_of(&local, &c->local);
}

/* Whether the comma-separated header value <v> (<len> bytes) lists <token>. */
static bool value_has_token(const char *v, size_t len, const char *token)
{
	size_t tl = strlen(token);

	while (len) {
		size_t n = 0;

		while (len && (*v == ' ' || *v == '\t' || *v == ',')) {
			v++;
			len--;
		}
		while (n < len && v[n] != ',' && v[n] != ' ' && v[n] != '\t')
			n++;
		if (n == tl && strncasecmp(v, token, tl) == 0)
			return true;
		v += n;
		len -= n;
	}
	return false;
}

/*
 * Whether a Host header <v> (<len> bytes) names this listener: "localhost",
 * a configured name, or the very address the connection reached. A name of
 * anyone else's (a page that rebound its own name to this address) is not.
 */
static bool host_ok(const struct http_server *srv, struct http_conn *c, const char *v,
		    size_t len)
{
	char host[256];
	const char *h = v, *colon;
	size_t hl = len, i;
	struct ip_net a;

	if (!srv->host_check || srv->any_host)
		return true;
	if (len && v[0] == '[') {
		const char *rb = memchr(v, ']', len);

		if (!rb)
			return false;
		h = v + 1;
		hl = (size_t)(rb - h);
	} else if ((colon = memchr(v, ':', len)) && !memchr(colon + 1, ':', len - (size_t)(colon - v) - 1)) {
		hl = (size_t)(colon - v);
	}
	if (hl == 0 || hl >= sizeof(host))
		return false;
	memcpy(host, h, hl);
	host[hl] = 0;
	if (hl > 1 && host[hl - 1] == '.') /* "localhost." is "localhost" */
		host[--hl] = 0;
	if (strcasecmp(host, "localhost") == 0)
		return true;
	for (i = 0; i < srv->nhosts; i++)
		if (strcasecmp(host, srv->hosts[i]) == 0)
			return true;
	if (ip_net_parse(host, &a, NULL, 0) == 0 && a.bits == (a.family == AF_INET ? 32u : 128u)) {
		conn_local(c);
		return c->local.family && ip_net_has(&c->local, &a) && c->local.family == a.family;
	}
	return false;
}

/* Compares <len> bytes at <a> with the string <b> in time that does not tell where they differ. */
static bool token_equal(const char *a, size_t len, const char *b)
{
	size_t bl = strlen(b), i;
	unsigned char d = len != bl;

	for (i = 0; i < len; i++)
		d |= (unsigned char)(a[i] ^ b[i % (bl ? bl : 1)]);
	return d == 0;
}

/* Counts a request refused by the access rules and warns at most every HTTP_WARN_EVERY_S. */
static void srv_forbidden(struct http_server *srv, const struct http_conn *c, const char *why)
{
	double now = ev_now(srv->loop);
	char ip[INET6_ADDRSTRLEN];

	srv->stats.forbidden++;
	srv->forbidden_unlogged++;
	if (srv->forbidden_warn != 0. && now - srv->forbidden_warn < HTTP_WARN_EVERY_S)
		return;
	if (!c->peer.family || !inet_ntop(c->peer.family, c->peer.addr, ip, sizeof(ip)))
		snprintf(ip, sizeof(ip), "?");
	LOG(LOG_WARN, "http: refused %llu request(s) on port %d, the last from %s: %s",
	    (unsigned long long)srv->forbidden_unlogged, srv->port, ip, why);
	srv->forbidden_unlogged = 0;
	srv->forbidden_warn = now;
}

/* Answers <status> and a line saying what to do, for a request the access rules refuse. */
static void conn_forbid(struct http_conn *c, int status, const char *text, bool head_only)
{
	http_reply_release(&c->reply);
	http_reply_status(&c->reply, status, NULL);
	http_reply_printf(&c->reply, "%d %s: %s\n", status, status_reason(status), text);
	if (status == 401)
		http_reply_header(&c->reply, "WWW-Authenticate", "Bearer realm=\"spoa-ratelimit\"");
	srv_forbidden(c->srv, c, text);
	c->keep = false; /* nothing more for this client */
	c->linger = true;
	conn_respond(c, head_only, false);
}

/*
 * The access rules for the request of <c> for <path>, whose header lines are
 * [hdr, end): 0 when it may be served, else the refusal was answered.
 */
static int conn_access(struct http_conn *c, const char *path, const char *hdr, const char *end,
		       bool head_only)
{
	struct http_server *srv = c->srv;
	const char *v;
	unsigned n;
	size_t len, i;

	if (srv->nallow) {
		for (i = 0; i < srv->nallow && !(c->peer.family && ip_net_has(&srv->allow[i], &c->peer));
		     i++)
			;
		if (i == srv->nallow) {
			conn_forbid(c, 403, "this address is not in the listener's allow-list "
					    "(metrics.allow)", head_only);
			return -1;
		}
	}
	v = head_header(hdr, end, "Host", &len, &n);
	if (n > 1) {
		conn_error(c, 400, head_only);
		return -1;
	}
	if (v && !host_ok(srv, c, v, len)) {
		conn_forbid(c, 421, "the Host header names neither this listener's address nor one "
				    "of its names: ask by address, or add the name to "
				    "metrics.host_names", head_only);
		return -1;
	}
	if (!srv->token)
		return 0;
	for (i = 0; srv->open_paths && srv->open_paths[i]; i++)
		if (strcmp(path, srv->open_paths[i]) == 0)
			return 0;
	v = head_header(hdr, end, "Authorization", &len, &n);
	if (n != 1 || len < 7 || strncasecmp(v, "Bearer ", 7) != 0 ||
	    !token_equal(v + 7, len - 7, srv->token)) {
		conn_forbid(c, 401, "send the token of metrics.token_file as "
				    "'Authorization: Bearer <token>'", head_only);
		return -1;
	}
	return 0;
}

/* Answers the request line of <len> bytes at <line>, in c->in, whose head ends at <end>. */
static void conn_on_request(struct http_conn *c, char *line, size_t len, const char *end)
{
	struct http_request req;
	const char *hdr = memchr(line, '\n', (size_t)(end - line)), *v;
	size_t vlen;
	unsigned n;

	c->req_end = (size_t)(end - c->in);
	c->linger = false;
	http_request_parse(line, len, &req);
	if (req.status) {
		conn_error(c, req.status, req.head);
		return;
	}
	if (conn_access(c, req.path, hdr ? hdr + 1 : end, end, req.head) < 0)
		return;
	/* HTTP/1.1 keeps the connection unless the client says close; 1.0 never;
	 * nor a request with a body, which is never read: where the next request
	 * would start is not known */
	v = head_header(hdr ? hdr + 1 : end, end, "Connection", &vlen, &n);
	c->keep = !req.http10 && !(n && value_has_token(v, vlen, "close"));
	if (c->keep) {
		v = head_header(hdr ? hdr + 1 : end, end, "Content-Length", &vlen, &n);
		if ((n && !(vlen == 1 && v[0] == '0')) ||
		    head_header(hdr ? hdr + 1 : end, end, "Transfer-Encoding", &vlen, &n))
			c->keep = false;
	}
	http_reply_release(&c->reply);
	c->srv->fn(req.path, &c->reply, c->srv->arg);
	conn_respond(c, req.head, false);
}

/*
 * Looks for the end of a request head (an empty line, CRLF or bare LF) in the
 * <len> bytes at <in>, resuming the search of <st> (zeroed before the first
 * call; <in> may only have grown since). Returns the length of the request
 * line, which starts at st->start, and sets *<end> just past the empty line;
 * or returns -1 if the head is incomplete. Leading empty lines are skipped
 * (RFC 9112 2.2). A head sent byte by byte costs linear time.
 */
ssize_t http_head_scan(struct http_scan *st, const char *in, size_t len, size_t *end)
{
	size_t i, line_end = 0;
	bool have_line = false;

	while (st->start < len && (in[st->start] == '\r' || in[st->start] == '\n'))
		st->start++;
	i = st->scan > st->start ? st->scan : st->start;
	for (; i < len; i++) {
		if (in[i] != '\n')
			continue;
		if (i + 1 < len && in[i + 1] == '\n') {
			*end = i + 2;
			break;
		}
		if (i + 2 < len && in[i + 1] == '\r' && in[i + 2] == '\n') {
			*end = i + 3;
			break;
		}
	}
	if (i >= len) {
		/* resume where a terminator could still begin */
		st->scan = len > 2 ? len - 2 : 0;
		return -1;
	}
	/* complete: the request line ends at the first LF after start */
	for (i = st->start; i < len; i++) {
		if (in[i] == '\n') {
			line_end = i;
			have_line = true;
			break;
		}
	}
	BUG_ON(!have_line);
	if (line_end > st->start && in[line_end - 1] == '\r')
		line_end--;
	return (ssize_t)(line_end - st->start);
}

/*
 * Answers the request buffered in <c> if its head is complete, else reads on:
 * 431 when the head fills HTTP_HEAD_MAX. Returns true when <c> is done with
 * (answered, or closed).
 */
static bool conn_scan(struct http_conn *c)
{
	size_t end;
	ssize_t n = http_head_scan(&c->hs, c->in, c->in_len, &end);

	if (n >= 0) {
		conn_on_request(c, c->in + c->hs.start, (size_t)n, c->in + end);
		return true;
	}
	if (c->in_len == HTTP_HEAD_MAX) {
		conn_error(c, 431, false);
		return true;
	}
	return false;
}

/* <c>, taken from the ready list: its next request, or wait for the rest of it. */
static void conn_parse(struct http_conn *c)
{
	if (!conn_scan(c))
		conn_watch(c, EV_READ);
}

static void conn_read_head(struct http_conn *c)
{
	for (;;) {
		ssize_t n;

		if (c->in_len == c->in_cap) {
			/* grows with what the client sent, up to the head bound */
			size_t cap = c->in_cap ? c->in_cap * 2 : HTTP_IN_MIN;

			if (cap > HTTP_HEAD_MAX)
				cap = HTTP_HEAD_MAX;
			c->in = xrealloc(c->in, cap);
			c->in_cap = cap;
		}
		n = recv(c->fd, c->in + c->in_len, c->in_cap - c->in_len, 0);

		if (n == -1) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK) {
				if (c->in_len == 0) { /* spurious wakeup: hold no buffer */
					FREE_AND_NULL(c->in);
					c->in_cap = 0;
				}
				return;
			}
			LOG(LOG_DEBUG, "http: recv: %s", strerror(errno));
			conn_close(c);
			return;
		}
		if (n == 0) {
			conn_close(c);
			return;
		}
		if (c->in_len == 0 && c->nreq) /* a kept connection's next request begins */
			conn_deadline(c, c->srv->timeout);
		c->in_len += (size_t)n;
		if (conn_scan(c))
			return;
	}
}

static void conn_drain(struct http_conn *c)
{
	char buf[4096];

	for (;;) {
		ssize_t n = recv(c->fd, buf, sizeof(buf), 0);

		if (n == -1) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return;
			conn_close(c);
			return;
		}
		c->drained += (size_t)n;
		if (n == 0 || c->drained > HTTP_LINGER_BYTES) {
			conn_close(c);
			return;
		}
	}
}

static void conn_io_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct http_conn *c = container_of(w, struct http_conn, io);

	(void)loop;
	(void)revents;
	switch (c->state) {
	case HTTP_CS_READ:
		conn_read_head(c);
		break;
	case HTTP_CS_WRITE:
		(void)conn_flush(c);
		break;
	case HTTP_CS_LINGER:
		conn_drain(c);
		break;
	default:
		BUG_ON(1);
	}
}

static void conn_timer_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct http_conn *c = container_of(t, struct http_conn, timer);

	(void)loop;
	(void)revents;
	/* a kept-alive connection with no new request is idle, not slow */
	if (c->state != HTTP_CS_LINGER && !(c->state == HTTP_CS_READ && c->nreq && !c->in_len)) {
		c->srv->stats.timeouts++;
		LOG(LOG_DEBUG, "http: connection deadline passed in state %d", (int)c->state);
	}
	conn_close(c);
}

/* ---------------------------------------------------------------- server */

/* Forgets who may ask <s>: anyone may, from now on. */
static void access_release(struct http_server *s)
{
	size_t i;

	FREE_AND_NULL(s->allow);
	s->nallow = 0;
	for (i = 0; i < s->nhosts; i++)
		free(s->hosts[i]);
	FREE_AND_NULL(s->hosts);
	s->nhosts = 0;
	s->any_host = false;
	if (s->token) /* a secret: not left in freed memory */
		memset(s->token, 0, strlen(s->token));
	FREE_AND_NULL(s->token);
	for (i = 0; s->open_paths && s->open_paths[i]; i++)
		free(s->open_paths[i]);
	FREE_AND_NULL(s->open_paths);
}

/* Counts a refused connection and warns at most every HTTP_WARN_EVERY_S. */
static void srv_refused(struct http_server *srv, const char *why)
{
	double now = ev_now(srv->loop);

	srv->stats.refused++;
	srv->refused_unlogged++;
	if (srv->last_warn != 0. && now - srv->last_warn < HTTP_WARN_EVERY_S)
		return;
	LOG(LOG_WARN, "http: refused %llu connection(s) on port %d: %s",
	    (unsigned long long)srv->refused_unlogged, srv->port, why);
	srv->refused_unlogged = 0;
	srv->last_warn = now;
}

/*
 * Closes the oldest connection of <srv> that is still reading its head or
 * lingering after its reply, to admit a new one. Returns false if every
 * connection is sending a reply.
 */
static bool srv_evict_one(struct http_server *srv)
{
	struct list *n;

	for (n = srv->conns.next; n != &srv->conns; n = n->next) {
		struct http_conn *c = LIST_ELEM(n, struct http_conn, node);

		if (c->state == HTTP_CS_WRITE)
			continue;
		if (c->state == HTTP_CS_READ)
			srv->stats.evicted++;
		conn_close(c);
		return true;
	}
	return false;
}

/* Serves a few connections of the ready list: the loop has nothing else to do. */
static void ready_cb(struct ev_loop *loop, ev_idle *w, int revents)
{
	struct http_server *srv = container_of(w, struct http_server, idle);
	int i;

	(void)revents;
	for (i = 0; i < HTTP_READY_BURST && !list_empty(&srv->ready); i++) {
		struct http_conn *c = LIST_ELEM(srv->ready.next, struct http_conn, rnode);

		list_del(&c->rnode);
		c->queued = false;
		conn_parse(c);
	}
	if (list_empty(&srv->ready))
		ev_idle_stop(loop, w);
}

static void accept_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct http_server *srv = container_of(w, struct http_server, io);
	int i;

	(void)revents;
	for (i = 0; i < HTTP_ACCEPT_BURST; i++) {
		struct sockaddr_storage peer;
		socklen_t plen = sizeof(peer);
		struct http_conn *c;
		int fd;

		fd = accept4(srv->fd, (struct sockaddr *)&peer, &plen, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd == -1) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if ((errno == EMFILE || errno == ENFILE) && srv->spare_fd >= 0) {
				/* free the spare, take the connection and drop it, get the
				 * spare back: the client sees a close, we don't spin */
				close(srv->spare_fd);
				fd = accept(srv->fd, NULL, NULL);
				if (fd >= 0)
					close(fd);
				srv->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
				srv_refused(srv, "out of file descriptors");
				continue;
			}
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				LOG(LOG_WARN, "http: accept: %s", strerror(errno));
			return;
		}
		if (srv->nconns >= srv->max_conns && !srv_evict_one(srv)) {
			close(fd);
			srv_refused(srv, "connection limit reached, every connection busy");
			continue;
		}
		c = xcalloc(1, sizeof(*c));
		c->srv = srv;
		c->fd = fd;
		net_of(&peer, &c->peer);
		c->state = HTTP_CS_READ;
		http_reply_init(&c->reply);
		ev_io_init(&c->io, conn_io_cb, fd, EV_READ);
		ev_set_priority(&c->io, EV_MINPRI);
		ev_timer_init(&c->timer, conn_timer_cb, srv->timeout, 0.);
		ev_set_priority(&c->timer, EV_MINPRI);
		ev_timer_start(loop, &c->timer);
		list_append(&srv->conns, &c->node);
		srv->nconns++;
		srv->stats.accepted++;
		/* the request is often there already: read it now rather than after one
		 * more turn of the loop (EAGAIN costs one recv) */
		ev_io_start(loop, &c->io);
		conn_read_head(c);
	}
}

/*
 * Parses <addr>, "ip:port" or "[ipv6]:port" with a numeric address (never
 * resolved) and a port 0-65535, into <ss>/<sl>. Returns 0, or -1 with a
 * message in <err>.
 */
static int parse_addr(const char *addr, struct sockaddr_storage *ss, socklen_t *sl, char *err,
		      size_t errlen)
{
	char host[INET6_ADDRSTRLEN + 1];
	const char *colon;
	char *end;
	unsigned long port;
	size_t hl;

	memset(ss, 0, sizeof(*ss));
	colon = strrchr(addr, ':');
	if (!colon || colon == addr) {
		snprintf(err, errlen, "'%s': expected ip:port or [ipv6]:port", addr);
		return -1;
	}
	errno = 0;
	port = strtoul(colon + 1, &end, 10);
	if (errno || *end || end == colon + 1 || colon[1] == '-' || colon[1] == '+' ||
	    port > 65535) {
		snprintf(err, errlen, "'%s': bad port", addr);
		return -1;
	}
	hl = (size_t)(colon - addr);
	if (addr[0] == '[') {
		if (hl < 3 || addr[hl - 1] != ']' || hl - 2 >= sizeof(host)) {
			snprintf(err, errlen, "'%s': bad IPv6 address", addr);
			return -1;
		}
		memcpy(host, addr + 1, hl - 2);
		host[hl - 2] = 0;
		if (inet_pton(AF_INET6, host, &((struct sockaddr_in6 *)ss)->sin6_addr) != 1) {
			snprintf(err, errlen, "'%s': bad IPv6 address", addr);
			return -1;
		}
		((struct sockaddr_in6 *)ss)->sin6_family = AF_INET6;
		((struct sockaddr_in6 *)ss)->sin6_port = htons((uint16_t)port);
		*sl = sizeof(struct sockaddr_in6);
		return 0;
	}
	if (hl >= sizeof(host)) {
		snprintf(err, errlen, "'%s': bad address", addr);
		return -1;
	}
	memcpy(host, addr, hl);
	host[hl] = 0;
	if (inet_pton(AF_INET, host, &((struct sockaddr_in *)ss)->sin_addr) != 1) {
		snprintf(err, errlen, "'%s': not a numeric IPv4 address (names are not resolved)",
			 addr);
		return -1;
	}
	((struct sockaddr_in *)ss)->sin_family = AF_INET;
	((struct sockaddr_in *)ss)->sin_port = htons((uint16_t)port);
	*sl = sizeof(struct sockaddr_in);
	return 0;
}

/*
 * Listens on <addr> ("ip:port" or "[ipv6]:port", numeric; port 0 picks a free
 * one, see http_server_port()) and serves requests on <loop>, calling <fn>
 * with <arg> for each GET/HEAD. <reuseport> sets SO_REUSEPORT so several
 * processes can share the port. Returns the server, owned by the caller
 * (http_server_free()), or NULL with a message in <err> (<errlen> bytes).
 * Never calls <fn> synchronously.
 */
struct http_server *http_server_new(struct ev_loop *loop, const char *addr, bool reuseport,
				    http_handler_fn fn, void *arg, char *err, size_t errlen)
{
	struct sockaddr_storage ss;
	struct http_server *srv;
	socklen_t sl;
	int fd, one = 1;

	if (parse_addr(addr, &ss, &sl, err, errlen) < 0)
		return NULL;
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd == -1) {
		snprintf(err, errlen, "%s: socket: %s", addr, strerror(errno));
		return NULL;
	}
	(void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (reuseport && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) == -1) {
		snprintf(err, errlen, "%s: SO_REUSEPORT: %s", addr, strerror(errno));
		close(fd);
		return NULL;
	}
	if (ss.ss_family == AF_INET6)
		(void)setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
	/* inherited by the accepted sockets: a reply is one write, never held back */
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&ss, sl) == -1 || listen(fd, 128) == -1) {
		snprintf(err, errlen, "%s: %s", addr, strerror(errno));
		close(fd);
		return NULL;
	}
	sl = sizeof(ss);
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) == -1) {
		snprintf(err, errlen, "%s: getsockname: %s", addr, strerror(errno));
		close(fd);
		return NULL;
	}
	srv = xcalloc(1, sizeof(*srv));
	srv->loop = loop;
	srv->fn = fn;
	srv->arg = arg;
	srv->fd = fd;
	srv->timeout = HTTP_TIMEOUT_S;
	srv->max_conns = HTTP_CONNS_MAX;
	srv->max_requests = HTTP_REQUESTS_MAX;
	srv->keepalive = HTTP_KEEPALIVE_S;
	srv->date_at = -1;
	net_of(&ss, &srv->local);
	if (!memcmp(srv->local.addr, (const unsigned char[16]){0}, sizeof(srv->local.addr)))
		memset(&srv->local, 0, sizeof(srv->local)); /* a wildcard: ask each socket */
	srv->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
						   : ((struct sockaddr_in *)&ss)->sin_port);
	srv->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	list_init(&srv->conns);
	list_init(&srv->ready);
	ev_idle_init(&srv->idle, ready_cb);
	ev_set_priority(&srv->idle, EV_MINPRI);
	ev_io_init(&srv->io, accept_cb, fd, EV_READ);
	ev_set_priority(&srv->io, EV_MINPRI);
	ev_io_start(loop, &srv->io);
	LOG(LOG_NOTICE, "http: listening on %s (port %d)", addr, srv->port);
	return srv;
}

/*
 * Stops listening, closes every connection at once (replies in progress are
 * cut) and frees <s>. NULL is a no-op. Must not be called from the handler,
 * and must be called before the loop is destroyed (it stops watchers on it).
 */
void http_server_free(struct http_server *s)
{
	struct list *n, *tmp;

	if (!s)
		return;
	ev_io_stop(s->loop, &s->io);
	ev_idle_stop(s->loop, &s->idle);
	close(s->fd);
	list_for_each_safe(n, tmp, &s->conns)
		conn_close(LIST_ELEM(n, struct http_conn, node));
	if (s->spare_fd >= 0)
		close(s->spare_fd);
	access_release(s);
	free(s);
}

/*
 * Sets who may ask <s> (see struct http_access), replacing what was set:
 * requests from now on. 0, or -1 with <err> (a network that does not parse;
 * nothing changed then).
 */
int http_server_set_access(struct http_server *s, const struct http_access *a, char *err,
			   size_t errlen)
{
	struct ip_net *nets = a->nallow ? xcalloc(a->nallow, sizeof(*nets)) : NULL;
	size_t i, n = 0;

	for (i = 0; i < a->nallow; i++) {
		if (ip_net_parse(a->allow[i], &nets[i], err, errlen) < 0) {
			free(nets);
			return -1;
		}
	}
	access_release(s);
	s->allow = nets;
	s->nallow = a->nallow;
	s->host_check = true;
	s->hosts = a->nhosts ? xcalloc(a->nhosts, sizeof(*s->hosts)) : NULL;
	for (i = 0; i < a->nhosts; i++) {
		if (strcmp(a->hosts[i], "*") == 0)
			s->any_host = true;
		else
			s->hosts[s->nhosts++] = xstrdup(a->hosts[i]);
	}
	s->token = a->token && *a->token ? xstrdup(a->token) : NULL;
	for (; a->open_paths && a->open_paths[n]; n++)
		;
	if (n) {
		s->open_paths = xcalloc(n + 1, sizeof(*s->open_paths));
		for (i = 0; i < n; i++)
			s->open_paths[i] = xstrdup(a->open_paths[i]);
	}
	return 0;
}

/*
 * Sets the deadline of one request of <s> to <seconds> (> 0), from accept or
 * its first byte on a kept connection to the end of its reply, for requests
 * from now on; the default is HTTP_TIMEOUT_S.
 */
void http_server_set_timeout(struct http_server *s, double seconds)
{
	if (seconds > 0.)
		s->timeout = seconds;
}

/*
 * Sets the connection bound of <s> to <n> (> 0; the default is
 * HTTP_CONNS_MAX). Lowering it closes nothing: it applies to new connections.
 */
void http_server_set_max_conns(struct http_server *s, size_t n)
{
	if (n > 0)
		s->max_conns = n;
}

/*
 * Sets how many requests one connection of <s> may send (> 0; the default is
 * HTTP_REQUESTS_MAX): the last reply says "Connection: close".
 */
void http_server_set_max_requests(struct http_server *s, unsigned n)
{
	if (n > 0)
		s->max_requests = n;
}

/*
 * Sets how long a kept-alive connection of <s> waits for its next request
 * (> 0; the default is HTTP_KEEPALIVE_S), from the end of the previous reply.
 */
void http_server_set_keepalive(struct http_server *s, double seconds)
{
	if (seconds > 0.)
		s->keepalive = seconds;
}

/* Returns the port <s> listens on (the chosen one when asked for port 0). */
int http_server_port(const struct http_server *s)
{
	return s->port;
}

/* Returns the number of open connections of <s>. */
size_t http_server_conns(const struct http_server *s)
{
	return s->nconns;
}

/* Returns the counters of <s>, valid as long as <s>. */
const struct http_stats *http_server_stats(const struct http_server *s)
{
	return &s->stats;
}
