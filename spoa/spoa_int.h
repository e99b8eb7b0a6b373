/* SPDX-License-Identifier: MIT */
/*
 * libspoa's private header: what its files share and nobody else sees (the
 * connection, request, listener and server objects, and the calls between
 * conn.c, request.c and listener.c). The API is spoa.h.
 *
 * libspoa runtime: listeners, connections, requests.
 *
 * DESIGN
 * A connection goes HELLO -> READY -> CLOSING -> (freed).
 *  - HELLO: the first frame must be a HAPROXY-HELLO with FIN; anything else is
 *    answered with AGENT-DISCONNECT(4). A health-check hello is answered with a
 *    full AGENT-HELLO and the connection closes once it is written.
 *  - READY: NOTIFYs become requests; HAPROXY-DISCONNECT is answered with
 *    AGENT-DISCONNECT(0); unknown frame types are skipped; a frame without FIN
 *    gets AGENT-DISCONNECT(10) because we never announce fragmentation.
 *  - CLOSING: input is ignored, queued output is flushed (bounded by a linger
 *    timer), then the connection is freed.
 * The 4-byte length of each frame is checked against the negotiated frame size
 * before its payload is read. The receive buffer does not exist while nothing
 * is pending: it is allocated at SPOA_RX_MIN when bytes arrive, doubles while a
 * frame does not fit (so its size follows the bytes the peer really sent, up
 * to the frame size) and is released once every byte in it was processed.
 * Released buffers of SPOA_RX_MIN bytes (receive, and send buffers of that
 * size) wait in a small server-wide cache, SPOA_SPARE_MAX at most, for the
 * next connection that needs one: a busy connection empties its buffers after
 * every burst, and going through the allocator each time cost more than the
 * frames' decoding. Completed requests are kept the same way, REQ_POOL_MAX of
 * one ACK size at most (a few MB after a burst, held until the server is freed).
 *
 * Nobody can hold the server hostage: srv->conns is kept in order of last
 * input (oldest first), a connection in READY with nothing in flight is closed
 * with AGENT-DISCONNECT(2) after idle_timeout_ms, and when max_conns are open
 * the oldest connection with nothing in flight (or still waiting for its
 * HELLO) is closed to admit the new one: a flood of idle connections can
 * never lock HAProxy out. Only connections that are all busy refuse a new one.
 *
 * Back-pressure, never a disconnect: reading stops while the requests in
 * flight or the unsent output are at their bounds, and the send queue bound
 * covers what the requests in flight can still add once reading stopped.
 *
 * Every read takes the kernel's receive timestamp (SO_TIMESTAMPNS, the
 * arrival of the latest segment read; the time of the read where there is
 * none): a NOTIFY older than stale_ms on arrival plus queueing was given up
 * by HAProxy already and is answered with an empty ACK at once.
 *
 * Requests point at their connection and sit on its list. When a connection
 * dies first it clears req->conn; the application's later spoa_req_done() then
 * just frees the request (an "orphan"). A connection is never freed inside a
 * call that may still use it: conn_kill() only marks it and arms a zero timer.
 *
 * Each ACK is built whole in the request's buffer and queued on its
 * connection; the connections with queued output are flushed once per loop
 * iteration, just before the loop polls again (an ev_prepare watcher): every
 * ACK completed in one iteration (a Redis reply read often completes dozens)
 * leaves in one send() per connection, not one each. On loopback a send() is
 * the most expensive call the agent makes (it runs the peer's receive path
 * and wakes it), so this is most of the null path's cost.
 */

#ifndef SPOA_INT_H
#define SPOA_INT_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <ev.h>

#include "list.h"
#include "pool.h"
#include "spoa.h"


#define SPOA_ACK_DFLT       1024    /* largest ACK a request can build, by default */
#define SPOA_LINGER_MS      1000    /* how long a closing connection may flush */
#define SPOA_RX_MIN         4096    /* first receive buffer; doubles up to the frame */
#define SPOA_SPARE_MAX      32      /* released SPOA_RX_MIN buffers kept for reuse */
#define SPOA_LOG_STR        128     /* peer strings in logs: escaped and cut */

enum conn_state {
	CONN_ST_HELLO   = 0,
	CONN_ST_READY   = 1,
	CONN_ST_CLOSING = 2,
	CONN_ST_DEAD    = 3,
	CONN_ST_COUNT       /* sentinel */
};

struct spoa_listener {
	struct list node;               /* in spoa_server.listeners */
	struct spoa_server *srv;        /* ref: owner */
	ev_io io;                       /* accept watcher */
	int fd;                         /* owned */
	char *unix_path;                /* owned: unlinked on close, or NULL */
	dev_t unix_dev;                 /* the socket file we made: only that one */
	ino_t unix_ino;                 /* is unlinked on close */
};

struct spoa_conn {
	struct list node;               /* in spoa_server.conns */
	struct spoa_server *srv;        /* ref: owner */
	uint64_t id;                    /* for logs */
	int fd;                         /* owned */
	enum conn_state state;
	ev_io rio;                      /* readable */
	ev_io wio;                      /* writable, only while tx has data */
	struct list flush_node;         /* in spoa_server.flushq while flush_pending */
	bool flush_pending;             /* output queued, flushed before the next poll */
	ev_timer timer;                 /* hello timeout, linger, deferred free */
	ev_timer idle;                  /* idle timeout in READY (checked lazily) */
	ev_tstamp last_input;           /* ev_now() of the last bytes read: LRU order */
	ev_tstamp last_active;          /* ev_now() of the last bytes read or sent */
	uint32_t frame_size;            /* negotiated max frame (our max before hello) */
	uint8_t *rx;                    /* owned: pending input, NULL when empty */
	size_t rx_len;                  /* bytes in rx */
	size_t rx_cap;                  /* allocated size of rx */
	uint64_t rx_stamp;              /* arrival of the latest bytes read (ns, realtime) */
	uint64_t now_ns;                /* realtime when processing started (ns) */
	uint8_t *tx;                    /* owned: pending output */
	size_t tx_off;                  /* first unsent byte */
	size_t tx_len;                  /* bytes in tx */
	size_t tx_cap;                  /* allocated size of tx */
	unsigned inflight;              /* requests not completed */
	struct list reqs;               /* spoa_req.node */
	bool reading;                   /* rio started */
	char peer[64];                  /* printable peer address */
};

struct spoa_req {
	struct list node;               /* in spoa_conn.reqs while the conn lives */
	struct spoa_conn *conn;         /* ref: NULL once the connection is gone */
	struct spoa_server *srv;        /* ref: for stats */
	void *udata;                    /* ref: application data */
	uint64_t arrival;               /* when the NOTIFY's bytes arrived (ns, realtime) */
	size_t frame_start;             /* offset of the ACK in buf */
	size_t actions_start;           /* offset of the first action: no action yet if w.len */
	struct spop_wbuf w;             /* ACK under construction */
	size_t cap;                     /* bytes of buf */
	uint8_t buf[];                  /* the ACK frame: w.size bytes */
};

struct spoa_server {
	struct ev_loop *loop;           /* ref: caller's loop */
	struct spoa_opts opts;          /* with defaults applied */
	struct spoa_handler h;          /* copy of the caller's hooks */
	struct list listeners;          /* spoa_listener.node */
	struct list conns;              /* spoa_conn.node, least recent input first */
	struct list flushq;             /* spoa_conn.flush_node: output to send */
	ev_prepare flusher;             /* sends flushq's output before each poll */
	size_t nopen;                   /* connections in HELLO or READY */
	size_t ack_bound;               /* largest ack_max ever set: the send bounds */
	struct spoa_stats stats;
	uint64_t next_id;
	int spare_fd;                   /* kept open to survive EMFILE, -1 if none */
	bool zombie;                    /* freed by the caller, waiting for its requests */
	void *spare[SPOA_SPARE_MAX];    /* owned: released buffers of SPOA_RX_MIN bytes */
	size_t nspare;
	struct spoa_req *req_pool;      /* freed requests of req_pool_cap bytes, linked by
					 * udata, for reuse */
	size_t nreq_pool, req_pool_cap;
	bool warned_frame_size;         /* logged once: HAProxy's frame below our ACKs */
};

/* ---------------------------------------------------------------- calls between the files */

/* conn.c */
void slog(struct spoa_server *srv, int level, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
#define CLOG(c, level, fmt, ...)                                                           \
	slog((c)->srv, (level), "[c#%llu %s] " fmt, (unsigned long long)(c)->id, (c)->peer,    \
	     ##__VA_ARGS__)
void *xalloc(size_t n);
uint64_t realtime_ns(void);
int conn_send(struct spoa_conn *c, const uint8_t *data, size_t len);
void conn_kick(struct spoa_conn *c);
void conn_read_cb(struct ev_loop *loop, ev_io *w, int revents);
void conn_write_cb(struct ev_loop *loop, ev_io *w, int revents);
void conn_timer_cb(struct ev_loop *loop, ev_timer *t, int revents);
void conn_idle_cb(struct ev_loop *loop, ev_timer *t, int revents);
void conn_update_io(struct spoa_conn *c);
void conn_kill(struct spoa_conn *c);
void conn_disconnect(struct spoa_conn *c, uint32_t status, const char *msg);
void flusher_cb(struct ev_loop *loop, ev_prepare *w, int revents);
void conn_free(struct spoa_conn *c);

/* request.c */
struct spoa_req *req_new(struct spoa_conn *c, const struct spop_frame *f);
void req_pool_drain(struct spoa_server *srv);

#endif /* SPOA_INT_H */
