/* SPDX-License-Identifier: MIT */
/*
 * One connection to a Redis server (or a Sentinel) on the event loop: a
 * non-blocking socket, TCP or unix, in clear or under TLS (OpenSSL), whose
 * replies are read by hiredis' reply reader and handed to the callback given
 * with each command, in order.
 *
 * The store and the Sentinel client use it instead of hiredis' asynchronous
 * context, whose TLS is missing from hiredis 0.14 (Debian 12) and whose libev
 * adapter starts and stops the write watcher for every command. Here the
 * commands given in one loop turn are appended to one buffer, and leave in
 * one write when the owner calls rconn_flush() (or when the socket is
 * writable again); the write watcher runs only while the socket refuses bytes.
 *
 * Lifetime, and the promises the callbacks can rely on:
 * - on_connect is called once: status 0 when the connection is up (TLS
 *   handshake and verification included), -1 when it failed, with
 *   rconn_errstr() saying why; after a failure the connection is freed on
 *   return (commands already given are called back with NULL first).
 * - every command's callback is called exactly once: with its reply (a
 *   redisReply, freed on return: copy what must stay), or with NULL when the
 *   connection is gone.
 * - what the server sends is read within bounds: a reply past its limits
 *   (store_reply.h) is a protocol error that closes the connection
 *   (rconn_protocol_error() then says so), and one connection reads at most
 *   RCONN_TURN_READ bytes a loop turn, so a server that sends without end
 *   cannot hold the loop.
 * - on_disconnect is called once when a connection that was up goes: status
 *   0 when rconn_disconnect() asked for it, -1 on an error (errstr); every
 *   command still owed was called back with NULL just before. The connection
 *   is freed on return.
 * - rconn_free() frees at once; the callbacks owed are called with NULL,
 *   on_disconnect is not called. rconn_disconnect() and rconn_free() may be
 *   called from within the connection's own callbacks: the close then happens
 *   when the callback returns.
 */
#ifndef SPOA_RATELIMIT_RCONN_H
#define SPOA_RATELIMIT_RCONN_H

#include <stdbool.h>
#include <stddef.h>

#include <ev.h>

/* The most one connection reads in one loop turn; the rest waits for the next. */
#define RCONN_TURN_READ (256u << 10)

struct rconn;
struct reply_limits;
struct tls_ctx;

typedef void rconn_reply_fn(struct rconn *c, void *reply, void *priv);
typedef void rconn_event_fn(struct rconn *c, int status);

struct rconn_opts {
	struct ev_loop *loop;
	void *data;                     /* the owner's, from rconn_data() */
	rconn_event_fn *on_connect;
	rconn_event_fn *on_disconnect;  /* may be NULL */
	const struct reply_limits *limits; /* one reply's bounds (copied); NULL: the defaults */
	const struct tls_ctx *tls;      /* NULL: clear text */
	const char *server_name;        /* TLS: the name dialled, for SNI and verification
					 * unless the context names one; NULL: the address */
	bool keepalive;                 /* TCP keepalive (TCP only) */
};

/* Starts connecting to <ip> (numeric, v4 or v6) and <port>, or to the unix
 * socket <path> when <ip> is NULL. NULL with <err> filled when it cannot even
 * start; on_connect says how it went otherwise (never from within this call). */
struct rconn *rconn_connect(const struct rconn_opts *o, const char *ip, int port,
			    const char *path, char *err, size_t errlen);
void rconn_free(struct rconn *c);
void rconn_disconnect(struct rconn *c);

/* Queue a command: <argc> arguments of <lens> bytes (strlen() when <lens> is
 * NULL), or bytes already in RESP. <fn> NULL drops the reply. 0, or -1 when the
 * connection is closing or out of memory (nothing queued, <fn> not called). */
int rconn_command(struct rconn *c, rconn_reply_fn *fn, void *priv, int argc,
		  const char **argv, const size_t *lens);
int rconn_formatted(struct rconn *c, rconn_reply_fn *fn, void *priv, const char *buf,
		    size_t len);
/* Like rconn_command(), and every reply from now on (subscribe confirmations and
 * published messages) goes to <fn>, until the connection is gone (then NULL once). */
int rconn_subscribe(struct rconn *c, rconn_reply_fn *fn, void *priv, int argc,
		    const char **argv);
/* On a subscribed connection: a command whose reply goes to the subscription's
 * callback like a message (PING, to tell the server is still there). 0 or -1. */
int rconn_sub_command(struct rconn *c, int argc, const char **argv);
/* Writes what is queued now, as far as the socket takes it (the write watcher
 * does the rest). Never calls back. */
void rconn_flush(struct rconn *c);

void *rconn_data(const struct rconn *c);
const char *rconn_errstr(const struct rconn *c);
/* The connection failed because of what the server sent (a malformed reply, or
 * one past its limits), not because of the network. */
bool rconn_protocol_error(const struct rconn *c);
bool rconn_tls(const struct rconn *c);
/* mono() when the oldest command still owed a reply was queued (commands
 * leave in the turn they are queued), 0 when none is owed: replies come in
 * order, so this is the age of what the server has not answered yet. */
double rconn_oldest(const struct rconn *c);
/* TCP connected, the TLS handshake not finished yet */
bool rconn_handshaking(const struct rconn *c);

#endif
