/* SPDX-License-Identifier: MIT */
/*
 * One connection to Redis on libev: socket, optional TLS, hiredis' reader,
 * the callbacks owed in order (see rconn.h for the promises).
 *
 * The work happens in the two I/O watchers' callbacks. What a user callback
 * asks for about its own connection (close, free) and what fails underneath
 * (a read, a write) is recorded in flags and carried out when the watcher's
 * callback is about to return, so no function here ever uses a connection
 * that a callback freed. The write watcher runs only while bytes wait that the
 * socket refused (or TLS wants to write to go on reading); a read watcher runs
 * from the moment the connection is up.
 */
#include "rconn.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "compiler.h"
#include "store_reply.h"
#include "tls.h"
#include "util.h"

#define RCONN_READ_CHUNK 16384          /* bytes read per call */
#define RCONN_OUT_KEEP   65536          /* an idle output buffer larger than this shrinks */

enum rconn_state {
	RC_CONNECTING = 0,              /* TCP/unix connect in progress */
	RC_HANDSHAKE  = 1,              /* TLS handshake in progress */
	RC_UP         = 2,
	RC_DEAD       = 3,              /* being destroyed: callbacks getting NULL */
};

struct rconn_cb {
	rconn_reply_fn *fn;
	void *priv;
	double at;                      /* mono() it was queued (sent the same turn) */
};

struct rconn {
	struct ev_loop *loop;
	void *data;
	rconn_event_fn *on_connect;
	rconn_event_fn *on_disconnect;
	enum rconn_state state;
	int fd;
	ev_io rio, wio;
	ev_timer more;                  /* TLS: read on next turn what OpenSSL may hold */
	SSL *ssl;                       /* NULL: clear text */
	redisReader *rd;
	char *out;                      /* bytes to send: out[off, len) */
	size_t off, len, cap;
	struct rconn_cb *cbs;           /* ring of the callbacks owed */
	size_t head, count, ncbs;
	rconn_reply_fn *sub_fn;         /* subscribed: replies past the ring go here */
	void *sub_priv;
	unsigned in_cb;                 /* depth of user callbacks running */
	bool read_wants_write;          /* TLS: SSL_read needs the socket writable */
	bool write_wants_read;          /* TLS: SSL_write needs the socket readable */
	bool want_close;                /* rconn_disconnect(): status 0 */
	bool want_free;                 /* rconn_free() inside a callback: no event */
	bool failed;                    /* an I/O or protocol error: errstr says which */
	bool proto_err;                 /* ... what the server sent */
	char errstr[256];
};

static void io_cb(struct ev_loop *loop, ev_io *w, int revents);

void *rconn_data(const struct rconn *c)
{
	return c->data;
}

const char *rconn_errstr(const struct rconn *c)
{
	return c->errstr;
}

bool rconn_tls(const struct rconn *c)
{
	return c->ssl != NULL;
}

double rconn_oldest(const struct rconn *c)
{
	return c->count ? c->cbs[c->head].at : 0.;
}

bool rconn_protocol_error(const struct rconn *c)
{
	return c->proto_err;
}

bool rconn_handshaking(const struct rconn *c)
{
	return c->state == RC_HANDSHAKE;
}

/* Records the first error of <c>; the watcher's callback acts on it. */
static void PRINTF(2, 3) set_failed(struct rconn *c, const char *fmt, ...)
{
	va_list ap;

	if (c->failed)
		return;
	c->failed = true;
	va_start(ap, fmt);
	vsnprintf(c->errstr, sizeof(c->errstr), fmt, ap);
	va_end(ap);
}

static void want_write(struct rconn *c, bool on)
{
	if (on && !ev_is_active(&c->wio))
		ev_io_start(c->loop, &c->wio);
	else if (!on && ev_is_active(&c->wio))
		ev_io_stop(c->loop, &c->wio);
}

/* ---- destruction --------------------------------------------------------- */

/*
 * Frees <c>: the callbacks owed get NULL, then on_disconnect (when <event>
 * and the connection was up) or on_connect (failure before it was up).
 */
static void destroy(struct rconn *c, bool event, int status)
{
	enum rconn_state was = c->state;

	c->state = RC_DEAD;
	ev_io_stop(c->loop, &c->rio); /* also clears a fed event */
	ev_io_stop(c->loop, &c->wio);
	ev_timer_stop(c->loop, &c->more);
	if (c->ssl) {
		SSL_free(c->ssl);
		c->ssl = NULL;
	}
	if (c->fd >= 0)
		close(c->fd);
	c->fd = -1;
	c->in_cb++;
	/* the commands owed first, then the event: as rconn.h promises */
	while (c->count) {
		struct rconn_cb cb = c->cbs[c->head];

		c->head = (c->head + 1) % c->ncbs;
		c->count--;
		if (cb.fn)
			cb.fn(c, NULL, cb.priv);
	}
	if (c->sub_fn)
		c->sub_fn(c, NULL, c->sub_priv);
	if (event && was != RC_UP && c->on_connect)
		c->on_connect(c, -1);
	if (event && was == RC_UP && c->on_disconnect)
		c->on_disconnect(c, status);
	ERR_clear_error();
	reply_reader_free(c->rd);
	free(c->out);
	free(c->cbs);
	free(c);
}

/* Carries out what the flags ask for; 0 when <c> lives on, -1 when it is gone. */
static int settle(struct rconn *c)
{
	if (c->want_free) {
		destroy(c, false, 0);
		return -1;
	}
	if (c->failed) {
		destroy(c, true, -1);
		return -1;
	}
	if (c->want_close) {
		destroy(c, c->state == RC_UP, 0);
		return -1;
	}
	return 0;
}

static bool stopping(const struct rconn *c)
{
	return c->failed || c->want_close || c->want_free;
}

void rconn_free(struct rconn *c)
{
	if (!c || c->state == RC_DEAD)
		return;
	if (c->in_cb) {
		c->want_free = true;
		return;
	}
	destroy(c, false, 0);
}

void rconn_disconnect(struct rconn *c)
{
	if (!c || c->state == RC_DEAD || c->want_close)
		return;
	c->want_close = true;
	if (!c->in_cb) /* outside its callbacks: closed from the loop, soon */
		ev_feed_event(c->loop, &c->rio, EV_CUSTOM);
}

/* ---- output -------------------------------------------------------------- */

static int out_reserve(struct rconn *c, size_t need)
{
	size_t cap;
	char *p;

	if (c->off && c->off == c->len)
		c->off = c->len = 0;
	if (c->cap - c->len >= need)
		return 0;
	if (c->off) { /* slide what is left to the front first */
		memmove(c->out, c->out + c->off, c->len - c->off);
		c->len -= c->off;
		c->off = 0;
		if (c->cap - c->len >= need)
			return 0;
	}
	cap = c->cap ? c->cap : 4096;
	while (cap - c->len < need)
		cap *= 2;
	p = realloc(c->out, cap);
	if (!p)
		return -1;
	c->out = p;
	c->cap = cap;
	return 0;
}

static int cb_push(struct rconn *c, rconn_reply_fn *fn, void *priv)
{
	if (c->count == c->ncbs) {
		size_t n = c->ncbs ? c->ncbs * 2 : 16, i;
		struct rconn_cb *r = malloc(n * sizeof(*r));

		if (!r)
			return -1;
		for (i = 0; i < c->count; i++)
			r[i] = c->cbs[(c->head + i) % c->ncbs];
		free(c->cbs);
		c->cbs = r;
		c->ncbs = n;
		c->head = 0;
	}
	c->cbs[(c->head + c->count) % c->ncbs] = (struct rconn_cb){fn, priv, mono()};
	c->count++;
	return 0;
}

/* The connection takes commands: not closing, not gone, not subscribed. */
static bool takes_commands(const struct rconn *c)
{
	return c->state != RC_DEAD && !stopping(c) && !c->sub_fn;
}

/* After new bytes: let the write watcher send them unless the owner flushes first. */
static void queued(struct rconn *c)
{
	if (c->state == RC_UP && !c->write_wants_read)
		want_write(c, true);
}

int rconn_formatted(struct rconn *c, rconn_reply_fn *fn, void *priv, const char *buf,
		    size_t len)
{
	if (!takes_commands(c) || out_reserve(c, len) == -1)
		return -1;
	if (cb_push(c, fn, priv) == -1)
		return -1;
	memcpy(c->out + c->len, buf, len);
	c->len += len;
	queued(c);
	return 0;
}

static int command_append(struct rconn *c, int argc, const char **argv, const size_t *lens)
{
	size_t need = 16, i;
	char *p;

	if (argc < 0)
		return -1;
	for (i = 0; i < (size_t)argc; i++)
		need += 24 + (lens ? lens[i] : strlen(argv[i]));
	if (out_reserve(c, need) == -1)
		return -1;
	p = c->out + c->len;
	*p++ = '*';
	p += fmt_i64(p, argc);
	*p++ = '\r';
	*p++ = '\n';
	for (i = 0; i < (size_t)argc; i++) {
		size_t l = lens ? lens[i] : strlen(argv[i]);

		*p++ = '$';
		p += fmt_i64(p, (int64_t)l);
		*p++ = '\r';
		*p++ = '\n';
		memcpy(p, argv[i], l);
		p += l;
		*p++ = '\r';
		*p++ = '\n';
	}
	c->len = (size_t)(p - c->out);
	return 0;
}

int rconn_command(struct rconn *c, rconn_reply_fn *fn, void *priv, int argc,
		  const char **argv, const size_t *lens)
{
	if (!takes_commands(c) || cb_push(c, fn, priv) == -1)
		return -1;
	if (command_append(c, argc, argv, lens) == -1) {
		c->count--; /* the entry just pushed; no byte was written */
		return -1;
	}
	queued(c);
	return 0;
}

int rconn_subscribe(struct rconn *c, rconn_reply_fn *fn, void *priv, int argc,
		    const char **argv)
{
	if (!takes_commands(c) || command_append(c, argc, argv, NULL) == -1)
		return -1;
	c->sub_fn = fn;
	c->sub_priv = priv;
	queued(c);
	return 0;
}

int rconn_sub_command(struct rconn *c, int argc, const char **argv)
{
	if (c->state == RC_DEAD || stopping(c) || !c->sub_fn ||
	    command_append(c, argc, argv, NULL) == -1)
		return -1;
	queued(c);
	return 0;
}

/* Writes what the socket takes; an error sets <c>'s failed flag. */
static void do_write(struct rconn *c)
{
	c->write_wants_read = false;
	while (c->off < c->len) {
		size_t n = c->len - c->off;
		ssize_t w;

		if (c->ssl) {
			int r = SSL_write(c->ssl, c->out + c->off, n > INT32_MAX ? INT32_MAX : (int)n);

			if (r > 0) {
				c->off += (size_t)r;
				continue;
			}
			switch (SSL_get_error(c->ssl, r)) {
			case SSL_ERROR_WANT_WRITE:
				want_write(c, true);
				return;
			case SSL_ERROR_WANT_READ:
				c->write_wants_read = true;
				want_write(c, c->read_wants_write);
				return;
			default: {
				char why[200];

				set_failed(c, "TLS write: %s", errno && !ERR_peek_error()
					   ? strerror(errno) : tls_error(why, sizeof(why)));
				return;
			}
			}
		}
		w = send(c->fd, c->out + c->off, n, MSG_NOSIGNAL);
		if (w >= 0) {
			c->off += (size_t)w;
			continue;
		}
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK) {
			want_write(c, true);
			return;
		}
		set_failed(c, "write: %s", strerror(errno));
		return;
	}
	c->off = c->len = 0;
	if (c->cap > RCONN_OUT_KEEP) {
		free(c->out);
		c->out = NULL;
		c->cap = 0;
	}
	want_write(c, c->read_wants_write);
}

void rconn_flush(struct rconn *c)
{
	if (c->state != RC_UP || stopping(c) || c->off == c->len || c->write_wants_read)
		return;
	do_write(c);
	if (c->failed) /* acted on from the loop: flushing never calls back */
		ev_feed_event(c->loop, &c->rio, EV_CUSTOM);
}

/* ---- input --------------------------------------------------------------- */

/* The server sent what cannot be read, or past the reader's limits. */
static void protocol_failed(struct rconn *c)
{
	if (c->failed)
		return;
	c->proto_err = true;
	set_failed(c, "protocol error: %s", reply_reader_error(c->rd));
}

/* Hands every complete reply to its callback, while <c> is not stopping. */
static void dispatch(struct rconn *c)
{
	while (!stopping(c)) {
		void *reply = NULL;
		struct rconn_cb cb;

		if (reply_reader_get(c->rd, &reply) != REDIS_OK) {
			protocol_failed(c);
			return;
		}
		if (!reply)
			return;
		if (c->count) {
			cb = c->cbs[c->head];
			c->head = (c->head + 1) % c->ncbs;
			c->count--;
		} else if (c->sub_fn) {
			cb = (struct rconn_cb){c->sub_fn, c->sub_priv, 0};
		} else {
			reply_free(reply);
			c->proto_err = true;
			set_failed(c, "%s", "protocol error: a reply nobody asked for");
			return;
		}
		if (cb.fn) {
			c->in_cb++;
			cb.fn(c, reply, cb.priv);
			c->in_cb--;
		}
		reply_free(reply);
	}
}

/*
 * Reads and dispatches what the socket holds, up to RCONN_TURN_READ bytes: a
 * server that sends without pause must not hold the loop, where the SPOP
 * connections, the metrics listener and the other Redis connections wait
 * their turn. Clear text: the socket stays readable and the watcher comes
 * back next turn. TLS: OpenSSL may hold decrypted bytes the socket no longer
 * signals, so a timer of no delay brings the read back after the next poll.
 */
static void do_read(struct rconn *c)
{
	char buf[RCONN_READ_CHUNK];
	size_t turn = 0;

	c->read_wants_write = false;
	while (!stopping(c)) {
		ssize_t n;

		if (turn >= RCONN_TURN_READ) {
			if (c->ssl && !ev_is_active(&c->more))
				ev_timer_start(c->loop, &c->more);
			break;
		}

		if (c->ssl) {
			int r = SSL_read(c->ssl, buf, sizeof(buf));

			if (r <= 0) {
				int e = SSL_get_error(c->ssl, r);
				char why[200];

				if (e == SSL_ERROR_WANT_READ)
					break;
				if (e == SSL_ERROR_WANT_WRITE) {
					c->read_wants_write = true;
					want_write(c, true);
					break;
				}
				if (e == SSL_ERROR_ZERO_RETURN ||
				    (e == SSL_ERROR_SYSCALL && !ERR_peek_error() && errno == 0))
					set_failed(c, "%s", "server closed the connection");
				else
					set_failed(c, "TLS read: %s", e == SSL_ERROR_SYSCALL &&
						   !ERR_peek_error() ? strerror(errno)
						   : tls_error(why, sizeof(why)));
				break;
			}
			n = r;
		} else {
			n = recv(c->fd, buf, sizeof(buf), 0);
			if (n == 0) {
				set_failed(c, "%s", "server closed the connection");
				break;
			}
			if (n < 0) {
				if (errno == EINTR)
					continue;
				if (errno != EAGAIN && errno != EWOULDBLOCK)
					set_failed(c, "read: %s", strerror(errno));
				break;
			}
		}
		turn += (size_t)n;
		if (redisReaderFeed(c->rd, buf, (size_t)n) != REDIS_OK) {
			protocol_failed(c);
			break;
		}
		dispatch(c);
		/* a short read emptied the socket (TLS: and nothing is left in OpenSSL's
		 * buffer, which reads ahead); what came since, the loop sees again */
		if ((size_t)n < sizeof(buf) && (!c->ssl || !SSL_has_pending(c->ssl)))
			break;
	}
}

/* ---- connecting ---------------------------------------------------------- */

static void up(struct rconn *c)
{
	c->state = RC_UP;
	ev_io_start(c->loop, &c->rio);
	want_write(c, false);
	c->in_cb++;
	c->on_connect(c, 0);
	c->in_cb--;
	if (!stopping(c) && c->off < c->len) /* what was given before and in on_connect */
		do_write(c);
}

/* The names <x> is for (its DNS and IP subject alternative names, else its CN), in <buf>. */
static void cert_names(X509 *x, char *buf, size_t len)
{
	GENERAL_NAMES *gens = X509_get_ext_d2i(x, NID_subject_alt_name, NULL, NULL);
	size_t off = 0;
	int i;

	buf[0] = 0;
	for (i = 0; gens && i < sk_GENERAL_NAME_num(gens) && off < len; i++) {
		const GENERAL_NAME *g = sk_GENERAL_NAME_value(gens, i);
		char ip[INET6_ADDRSTRLEN] = "";
		const char *name = NULL;
		int w;

		if (g->type == GEN_DNS) {
			name = (const char *)ASN1_STRING_get0_data(g->d.dNSName);
		} else if (g->type == GEN_IPADD && (g->d.iPAddress->length == 4 ||
						     g->d.iPAddress->length == 16)) {
			inet_ntop(g->d.iPAddress->length == 4 ? AF_INET : AF_INET6,
				  ASN1_STRING_get0_data(g->d.iPAddress), ip, sizeof(ip));
			name = ip;
		}
		if (!name)
			continue;
		w = snprintf(buf + off, len - off, "%s%s", off ? ", " : "", name);
		if (w > 0)
			off += (size_t)w;
	}
	GENERAL_NAMES_free(gens);
	if (!off && X509_NAME_get_text_by_NID(X509_get_subject_name(x), NID_commonName, buf,
					      (int)len) < 0)
		snprintf(buf, len, "no name");
}

/*
 * Why the handshake failed, the certificate's verdict first (for a name that
 * does not match, the name expected and those the certificate holds). Bytes
 * that are no TLS record (OpenSSL: a wrong version number, a record too long)
 * are a clear-text server's answer: the port is no TLS port.
 */
static void handshake_failed(struct rconn *c, int e)
{
	long v = SSL_get_verify_result(c->ssl);
	unsigned long err = ERR_peek_error();
	char why[200];

	if (v == X509_V_ERR_HOSTNAME_MISMATCH || v == X509_V_ERR_IP_ADDRESS_MISMATCH) {
		STACK_OF(X509) *chain = SSL_get_peer_cert_chain(c->ssl);
		X509_VERIFY_PARAM *p = SSL_get0_param(c->ssl);
		const char *host = X509_VERIFY_PARAM_get0_host(p, 0);
		char *ip = host ? NULL : X509_VERIFY_PARAM_get1_ip_asc(p);
		char names[160] = "no certificate";

		if (chain && sk_X509_num(chain) > 0)
			cert_names(sk_X509_value(chain, 0), names, sizeof(names));
		set_failed(c, "TLS: certificate verify failed: %s: expected %s, the certificate is "
			   "for %s", X509_verify_cert_error_string(v), host ? host : ip ? ip : "?",
			   names);
		OPENSSL_free(ip);
	} else if (v != X509_V_OK) {
		set_failed(c, "TLS: certificate verify failed: %s",
			   X509_verify_cert_error_string(v));
	} else if (ERR_GET_LIB(err) == ERR_LIB_SSL &&
		   (ERR_GET_REASON(err) == SSL_R_WRONG_VERSION_NUMBER ||
		    ERR_GET_REASON(err) == SSL_R_PACKET_LENGTH_TOO_LONG ||
		    ERR_GET_REASON(err) == SSL_R_UNKNOWN_PROTOCOL)) {
		ERR_clear_error();
		set_failed(c, "the server answered in clear text: is this the TLS port? "
			   "(redis.tls is set)");
	} else if (e == SSL_ERROR_SYSCALL && !ERR_peek_error())
		set_failed(c, "TLS handshake: %s",
			   errno ? strerror(errno) : "the server closed the connection");
	else
		set_failed(c, "TLS handshake: %s", tls_error(why, sizeof(why)));
}

static void handshake(struct rconn *c)
{
	int r = SSL_connect(c->ssl), e;

	if (r == 1) {
		up(c);
		return;
	}
	e = SSL_get_error(c->ssl, r);
	if (e == SSL_ERROR_WANT_READ) {
		want_write(c, false);
		ev_io_start(c->loop, &c->rio);
	} else if (e == SSL_ERROR_WANT_WRITE) {
		want_write(c, true);
	} else {
		handshake_failed(c, e);
	}
}

static void connected(struct rconn *c)
{
	int err = 0;
	socklen_t len = sizeof(err);

	if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &err, &len) == -1)
		err = errno;
	if (err) {
		set_failed(c, "%s", strerror(err));
		return;
	}
	if (!c->ssl) {
		up(c);
		return;
	}
	c->state = RC_HANDSHAKE;
	SSL_set_fd(c->ssl, c->fd);
	handshake(c);
}

static void io_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct rconn *c = w->data;

	(void)loop;
	if (stopping(c)) { /* a fed event, or one already pending */
		(void)settle(c);
		return;
	}
	switch (c->state) {
	case RC_CONNECTING:
		if (revents & EV_WRITE)
			connected(c);
		break;
	case RC_HANDSHAKE:
		handshake(c);
		break;
	case RC_UP:
		if ((revents & EV_READ) || c->read_wants_write)
			do_read(c);
		if (!stopping(c) && ((revents & EV_WRITE) || c->write_wants_read))
			if (c->off < c->len)
				do_write(c);
		if (!stopping(c) && (revents & EV_WRITE) && c->off == c->len &&
		    !c->read_wants_write)
			want_write(c, false);
		break;
	case RC_DEAD:
		break;
	}
	(void)settle(c);
}

static void more_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct rconn *c = t->data;

	(void)revents;
	io_cb(loop, &c->rio, EV_READ);
}

static int set_keepalive(int fd)
{
	int on = 1, idle = 15, intvl = 5, cnt = 3;

	if (setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on)) == -1 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle)) == -1 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl)) == -1 ||
	    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt)) == -1)
		return -1;
	return 0;
}

/* The socket, connecting. Returns the descriptor or -1 with <err>. */
static int dial(const char *ip, int port, const char *path, bool keepalive, char *err,
		size_t errlen)
{
	struct sockaddr_storage ss;
	socklen_t sl;
	int fd, on = 1;

	memset(&ss, 0, sizeof(ss));
	if (!ip) {
		struct sockaddr_un *un = (struct sockaddr_un *)&ss;

		if (strlen(path) >= sizeof(un->sun_path)) {
			snprintf(err, errlen, "unix socket path too long");
			return -1;
		}
		un->sun_family = AF_UNIX;
		memcpy(un->sun_path, path, strlen(path) + 1);
		sl = sizeof(*un);
	} else if (inet_pton(AF_INET, ip, &((struct sockaddr_in *)&ss)->sin_addr) == 1) {
		((struct sockaddr_in *)&ss)->sin_family = AF_INET;
		((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)port);
		sl = sizeof(struct sockaddr_in);
	} else if (inet_pton(AF_INET6, ip, &((struct sockaddr_in6 *)&ss)->sin6_addr) == 1) {
		((struct sockaddr_in6 *)&ss)->sin6_family = AF_INET6;
		((struct sockaddr_in6 *)&ss)->sin6_port = htons((uint16_t)port);
		sl = sizeof(struct sockaddr_in6);
	} else {
		snprintf(err, errlen, "not a numeric address: %s", ip);
		return -1;
	}
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd == -1) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return -1;
	}
	if (ip && (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on)) == -1 ||
		   (keepalive && set_keepalive(fd) == -1))) {
		snprintf(err, errlen, "setsockopt: %s", strerror(errno));
		close(fd);
		return -1;
	}
	if (connect(fd, (struct sockaddr *)&ss, sl) == -1 && errno != EINPROGRESS) {
		snprintf(err, errlen, "%s", strerror(errno));
		close(fd);
		return -1;
	}
	return fd;
}

/* TLS on <c>: SNI and the name (or address) its certificate must carry. */
static int tls_setup(struct rconn *c, const struct rconn_opts *o, const char *ip, char *err,
		     size_t errlen)
{
	const char *name = tls_ctx_server_name(o->tls) ? tls_ctx_server_name(o->tls)
						 : o->server_name;
	struct in6_addr a;
	char why[200];
	bool numeric = name && (inet_pton(AF_INET, name, &a) == 1 ||
				inet_pton(AF_INET6, name, &a) == 1);

	c->ssl = SSL_new(tls_ctx_ssl(o->tls));
	if (!c->ssl) {
		snprintf(err, errlen, "TLS: %s", tls_error(why, sizeof(why)));
		return -1;
	}
	if (name && !numeric && SSL_set_tlsext_host_name(c->ssl, name) != 1) {
		snprintf(err, errlen, "TLS server name %s: %s", name, tls_error(why, sizeof(why)));
		return -1;
	}
	if (!tls_ctx_verify(o->tls))
		return 0;
	if (name && !numeric) {
		if (SSL_set1_host(c->ssl, name) != 1) {
			snprintf(err, errlen, "TLS server name %s: %s", name,
				 tls_error(why, sizeof(why)));
			return -1;
		}
		/* exact names and wildcards of one label, as browsers do */
		SSL_set_hostflags(c->ssl, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
	} else if (X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(c->ssl), name ? name : ip) != 1) {
		snprintf(err, errlen, "TLS: cannot verify address %s", name ? name : ip);
		return -1;
	}
	return 0;
}

struct rconn *rconn_connect(const struct rconn_opts *o, const char *ip, int port,
			    const char *path, char *err, size_t errlen)
{
	struct rconn *c;

	if (o->tls && !ip) {
		snprintf(err, errlen, "TLS over a unix socket is not supported");
		return NULL;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		snprintf(err, errlen, "out of memory");
		return NULL;
	}
	c->loop = o->loop;
	c->data = o->data;
	c->on_connect = o->on_connect;
	c->on_disconnect = o->on_disconnect;
	c->fd = -1;
	c->rd = reply_reader_new(o->limits);
	if (!c->rd) {
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	if (o->tls && tls_setup(c, o, ip, err, errlen) == -1)
		goto fail;
	c->fd = dial(ip, port, path, o->keepalive, err, errlen);
	if (c->fd == -1)
		goto fail;
	ev_io_init(&c->rio, io_cb, c->fd, EV_READ);
	ev_io_init(&c->wio, io_cb, c->fd, EV_WRITE);
	c->rio.data = c->wio.data = c;
	ev_timer_init(&c->more, more_cb, 0., 0.);
	c->more.data = c;
	c->state = RC_CONNECTING;
	/* writable once connected (or refused): never from within this call */
	ev_io_start(c->loop, &c->wio);
	return c;
fail:
	ERR_clear_error();
	if (c->ssl)
		SSL_free(c->ssl);
	reply_reader_free(c->rd);
	free(c);
	return NULL;
}
