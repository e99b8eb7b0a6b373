/* SPDX-License-Identifier: MIT */
/*
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
#include "spoa.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <ev.h>

#include "list.h"
#include "pool.h"

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

static void conn_process(struct spoa_conn *c);
static void conn_update_io(struct spoa_conn *c);

static void slog(struct spoa_server *srv, int level, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

static void slog(struct spoa_server *srv, int level, const char *fmt, ...)
{
	char buf[512];
	va_list ap;

	if (!srv->h.log)
		return;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	srv->h.log(level, buf, srv->h.arg);
}

#define CLOG(c, level, fmt, ...)                                                           \
	slog((c)->srv, (level), "[c#%llu %s] " fmt, (unsigned long long)(c)->id, (c)->peer,    \
	     ##__VA_ARGS__)

static void *xalloc(size_t n)
{
	void *p = calloc(1, n);

	if (!p)
		abort();
	return p;
}

/* The realtime clock in nanoseconds: what kernel receive timestamps use. */
static uint64_t realtime_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static bool state_open(enum conn_state st)
{
	return st == CONN_ST_HELLO || st == CONN_ST_READY;
}

/* Moves <c> to <st>, keeping the count of open (HELLO/READY) connections. */
static void conn_set_state(struct spoa_conn *c, enum conn_state st)
{
	if (state_open(c->state) && !state_open(st))
		c->srv->nopen--;
	else if (!state_open(c->state) && state_open(st))
		c->srv->nopen++;
	c->state = st;
}

/* A buffer of SPOA_RX_MIN bytes, from the cache if it has one. */
static void *buf_get(struct spoa_server *srv)
{
	void *p = srv->nspare ? srv->spare[--srv->nspare] : malloc(SPOA_RX_MIN);

	if (!p)
		abort();
	pool_unpoison(p, SPOA_RX_MIN);
	return p;
}

/* Releases the buffer <p> of <cap> bytes (NULL: none), into the cache if it fits. */
static void buf_put(struct spoa_server *srv, void *p, size_t cap)
{
	if (p && cap == SPOA_RX_MIN && srv->nspare < SPOA_SPARE_MAX) {
		srv->spare[srv->nspare++] = p;
		pool_poison(p, SPOA_RX_MIN, NULL);
	} else {
		free(p);
	}
}

/* Drops the receive buffer of <c> (nothing pending in it). */
static void conn_rx_release(struct spoa_conn *c)
{
	buf_put(c->srv, c->rx, c->rx_cap);
	c->rx = NULL;
	c->rx_len = c->rx_cap = 0;
}

/*
 * The send queue bounds of <c>: reading pauses at <pause> unsent bytes; the
 * requests in flight then still add at most one ACK each, plus the frame being
 * processed and a DISCONNECT, which <hard> covers, so it is never reached by a
 * peer that merely stops reading.
 */
static size_t tx_pause(const struct spoa_conn *c)
{
	return (size_t)c->srv->opts.max_inflight * c->srv->ack_bound / 2;
}

static size_t tx_hard(const struct spoa_conn *c)
{
	return tx_pause(c) + ((size_t)c->srv->opts.max_inflight + 1) * c->srv->ack_bound +
	       c->frame_size + SPOP_LEN_SIZE + 512;
}

/* ---------------------------------------------------------------- output */

/* Frees the connection: the timer callback armed by conn_kill(). */
static void conn_free(struct spoa_conn *c)
{
	struct spoa_server *srv = c->srv;
	struct list *n, *tmp;

	ev_io_stop(srv->loop, &c->rio);
	ev_io_stop(srv->loop, &c->wio);
	ev_timer_stop(srv->loop, &c->timer);
	ev_timer_stop(srv->loop, &c->idle);
	if (c->flush_pending)
		list_del(&c->flush_node);
	list_for_each_safe(n, tmp, &c->reqs)
	{
		struct spoa_req *r = LIST_ELEM(n, struct spoa_req, node);

		r->conn = NULL;
		list_del(&r->node);
	}
	if (c->fd >= 0)
		close(c->fd);
	list_del(&c->node);
	conn_set_state(c, CONN_ST_DEAD);
	srv->stats.conns_active--;
	buf_put(srv, c->rx, c->rx_cap);
	buf_put(srv, c->tx, c->tx_cap);
	free(c);
}

static void conn_timer_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct spoa_conn *c = container_of(t, struct spoa_conn, timer);

	(void)loop;
	(void)revents;
	switch (c->state) {
	case CONN_ST_READY:
		/* a kick: frames wait in rx for a free slot (see conn_kick) */
		conn_process(c);
		return;
	case CONN_ST_HELLO:
		CLOG(c, SPOA_LOG_INFO, "no HAPROXY-HELLO in time, closing");
		break;
	case CONN_ST_CLOSING:
		CLOG(c, SPOA_LOG_DEBUG, "linger expired with %zu bytes unsent", c->tx_len - c->tx_off);
		break;
	default:
		break;
	}
	conn_free(c);
}

/*
 * Marks <c> dead: no more I/O, pending requests orphaned, freed from a zero
 * timer. Safe to call from anywhere, including while <c> is being used up the
 * stack.
 */
static void conn_kill(struct spoa_conn *c)
{
	struct spoa_server *srv = c->srv;
	struct list *n, *tmp;

	if (c->state == CONN_ST_DEAD)
		return;
	conn_set_state(c, CONN_ST_DEAD);
	ev_io_stop(srv->loop, &c->rio);
	ev_io_stop(srv->loop, &c->wio);
	ev_timer_stop(srv->loop, &c->idle);
	c->reading = false;
	list_for_each_safe(n, tmp, &c->reqs)
	{
		struct spoa_req *r = LIST_ELEM(n, struct spoa_req, node);

		r->conn = NULL;
		list_del(&r->node);
	}
	ev_timer_stop(srv->loop, &c->timer);
	ev_timer_set(&c->timer, 0., 0.);
	ev_timer_start(srv->loop, &c->timer);
}

/*
 * Schedules conn_process() from the loop, for frames left in rx when a bound
 * was hit. Never processes synchronously: the caller may be inside
 * conn_process() already (a request completed from its notify callback).
 */
static void conn_kick(struct spoa_conn *c)
{
	if (c->state != CONN_ST_READY || c->rx_len < SPOP_LEN_SIZE)
		return;
	ev_timer_stop(c->srv->loop, &c->timer);
	ev_timer_set(&c->timer, 0., 0.);
	ev_timer_start(c->srv->loop, &c->timer);
}

/* Writes as much of tx as the socket takes. Returns 0, or -1 if <c> was killed. */
static int conn_flush(struct spoa_conn *c)
{
	while (c->tx_off < c->tx_len) {
		ssize_t n = send(c->fd, c->tx + c->tx_off, c->tx_len - c->tx_off, MSG_NOSIGNAL);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			CLOG(c, SPOA_LOG_DEBUG, "send: %s", strerror(errno));
			conn_kill(c);
			return -1;
		}
		c->tx_off += (size_t)n;
		c->last_active = ev_now(c->srv->loop);
	}
	if (c->tx_off == c->tx_len) {
		c->tx_off = c->tx_len = 0;
		/* nothing more to come for now: an idle connection holds no buffer */
		if (!c->inflight) {
			buf_put(c->srv, c->tx, c->tx_cap);
			c->tx = NULL;
			c->tx_cap = 0;
		}
		if (c->state == CONN_ST_CLOSING) {
			conn_kill(c);
			return -1;
		}
	}
	conn_update_io(c);
	return 0;
}

/*
 * Queues the frame <data> of <len> bytes and tries to send it at once. Reading
 * pauses long before the send queue reaches tx_hard() (see conn_update_io()),
 * so a peer that stops reading is slowed down, not cut off; passing the hard
 * bound would be a bug, and closes the connection rather than grow without
 * bound.
 */
static int conn_send(struct spoa_conn *c, const uint8_t *data, size_t len)
{
	size_t unsent, limit;

	if (c->state == CONN_ST_DEAD)
		return -1;
	limit = tx_hard(c);
	/* the bound counts only unsent bytes */
	unsent = c->tx_len - c->tx_off + len;
	if (unsent > limit) {
		CLOG(c, SPOA_LOG_ERR, "send queue over its bound, %zu bytes queued: closing",
		     c->tx_len - c->tx_off);
		conn_kill(c);
		return -1;
	}
	/* drop what was sent already only when the frame does not fit behind it */
	if (c->tx_off > 0 && c->tx_len + len > c->tx_cap) {
		memmove(c->tx, c->tx + c->tx_off, c->tx_len - c->tx_off);
		c->tx_len -= c->tx_off;
		c->tx_off = 0;
	}
	if (c->tx_len + len > c->tx_cap) { /* here tx_len + len == unsent <= limit */
		size_t cap = c->tx_cap ? c->tx_cap : 4096;
		uint8_t *p;

		while (cap < unsent)
			cap *= 2;
		if (cap > limit)
			cap = limit;
		p = !c->tx && cap == SPOA_RX_MIN ? buf_get(c->srv) : realloc(c->tx, cap);
		if (!p)
			abort();
		c->tx = p;
		c->tx_cap = cap;
	}
	memcpy(c->tx + c->tx_len, data, len);
	c->tx_len += len;
	if (!c->flush_pending) {
		c->flush_pending = true;
		list_append(&c->srv->flushq, &c->flush_node);
		if (!ev_is_active(&c->srv->flusher))
			ev_prepare_start(c->srv->loop, &c->srv->flusher);
	}
	conn_update_io(c);
	return 0;
}

/* Before the loop polls: sends what every connection queued in this iteration. */
static void flusher_cb(struct ev_loop *loop, ev_prepare *w, int revents)
{
	struct spoa_server *srv = w->data;

	while (!list_empty(&srv->flushq)) {
		struct spoa_conn *c = LIST_ELEM(srv->flushq.next, struct spoa_conn, flush_node);

		list_del(&c->flush_node);
		c->flush_pending = false;
		(void)conn_flush(c);
	}
	ev_prepare_stop(loop, w);
}

/* Sends AGENT-DISCONNECT(<status>) and closes once it is written. */
static void conn_disconnect(struct spoa_conn *c, uint32_t status, const char *msg)
{
	uint8_t buf[512];
	struct spop_wbuf w;
	int n;

	if (c->state == CONN_ST_DEAD || c->state == CONN_ST_CLOSING)
		return;
	if (status <= SPOP_ST_RES)
		c->srv->stats.errors[status]++;
	CLOG(c, status == SPOP_ST_NORMAL ? SPOA_LOG_DEBUG : SPOA_LOG_INFO,
	     "AGENT-DISCONNECT status=%u (%s)", status, msg);
	spop_wbuf_init(&w, buf, sizeof(buf));
	n = spop_agent_disconnect_build(&w, status, msg);
	conn_set_state(c, CONN_ST_CLOSING);
	ev_io_stop(c->srv->loop, &c->rio);
	ev_timer_stop(c->srv->loop, &c->idle);
	c->reading = false;
	ev_timer_stop(c->srv->loop, &c->timer);
	ev_timer_set(&c->timer, SPOA_LINGER_MS / 1000., 0.);
	ev_timer_start(c->srv->loop, &c->timer);
	if (n > 0)
		(void)conn_send(c, buf, (size_t)n);
	else
		conn_kill(c);
}

/*
 * Starts or stops the watchers: read while there is room for more work (in
 * flight below the bound, send queue below half of it), write while output is
 * pending. Reading pauses are how back-pressure reaches HAProxy.
 */
static void conn_update_io(struct spoa_conn *c)
{
	struct spoa_server *srv = c->srv;
	bool want_read, want_write;

	if (c->state == CONN_ST_DEAD)
		return;
	want_read = state_open(c->state) && c->inflight < srv->opts.max_inflight &&
		    c->tx_len - c->tx_off < tx_pause(c);
	/* queued output waits for the flusher, which tries the socket first */
	want_write = c->tx_off < c->tx_len && !c->flush_pending;
	if (want_read && !c->reading) {
		ev_io_start(srv->loop, &c->rio);
		c->reading = true;
	} else if (!want_read && c->reading) {
		ev_io_stop(srv->loop, &c->rio);
		c->reading = false;
	}
	if (want_write && !ev_is_active(&c->wio))
		ev_io_start(srv->loop, &c->wio);
	else if (!want_write && ev_is_active(&c->wio))
		ev_io_stop(srv->loop, &c->wio);
}

static void conn_write_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct spoa_conn *c = container_of(w, struct spoa_conn, wio);
	bool was_full;

	(void)loop;
	(void)revents;
	was_full = !c->reading;
	if (conn_flush(c) < 0)
		return;
	/* frames left in rx while we were blocked can be processed now */
	if (was_full && c->reading)
		conn_kick(c);
}

/* ---------------------------------------------------------------- requests */

/*
 * Requests are allocated per NOTIFY with room for a whole ACK (kilobytes), and
 * freed at its answer: freed ones of the usual size are kept for reuse, up to
 * REQ_POOL_MAX, instead of going through the allocator (and calloc()'s
 * clearing of the buffer) every time.
 */
#define REQ_POOL_MAX 256

static void req_pool_drain(struct spoa_server *srv)
{
	while (srv->req_pool) {
		struct spoa_req *r = srv->req_pool;

		srv->req_pool = r->udata;
		pool_unpoison(r, sizeof(*r) + srv->req_pool_cap);
		free(r);
	}
	srv->nreq_pool = 0;
}

static struct spoa_req *req_alloc(struct spoa_server *srv, size_t cap)
{
	struct spoa_req *r = srv->req_pool;

	if (r && srv->req_pool_cap == cap) {
		srv->req_pool = r->udata;
		srv->nreq_pool--;
		pool_unpoison(r, sizeof(*r) + cap);
	} else {
		r = malloc(sizeof(*r) + cap);
		if (!r)
			abort();
	}
	memset(r, 0, sizeof(*r)); /* not the buffer: the ACK is written before it is sent */
	r->cap = cap;
	return r;
}

static void req_release(struct spoa_server *srv, struct spoa_req *r)
{
	if (srv->zombie || srv->nreq_pool >= REQ_POOL_MAX) {
		free(r);
		return;
	}
	if (r->cap != srv->req_pool_cap) {
		/* the ACK size changed (a reload): the pool follows */
		req_pool_drain(srv);
		srv->req_pool_cap = r->cap;
	}
	r->udata = srv->req_pool;
	srv->req_pool = r;
	srv->nreq_pool++;
	pool_poison(r, sizeof(*r) + r->cap, &r->udata);
}

static struct spoa_req *req_new(struct spoa_conn *c, const struct spop_frame *f)
{
	size_t size = c->srv->opts.ack_max;
	struct spoa_req *r;

	/* an ACK may not exceed the negotiated frame size */
	if (size > (size_t)c->frame_size + SPOP_LEN_SIZE)
		size = (size_t)c->frame_size + SPOP_LEN_SIZE;
	r = req_alloc(c->srv, size);
	r->conn = c;
	r->srv = c->srv;
	r->arrival = c->rx_stamp;
	spop_wbuf_init(&r->w, r->buf, size);
	r->frame_start = spop_frame_begin(&r->w, SPOP_FRM_ACK, SPOP_FL_FIN, f->sid, f->fid);
	r->actions_start = r->w.len;
	list_append(&c->reqs, &r->node);
	c->inflight++;
	c->srv->stats.inflight++;
	return r;
}

/*
 * Adds a set-var action for <name> in <scope> with value <v> to the ACK of
 * <req>. Returns 0, or -1 if it does not fit (the ACK keeps what fitted).
 */
int spoa_req_set_data(struct spoa_req *req, uint8_t scope, const char *name,
		      const struct spop_data *v)
{
	size_t before = req->w.len;

	spop_put_set_var(&req->w, scope, name, strlen(name), v);
	if (req->w.overflow) {
		req->w.len = before;
		req->w.overflow = false;
		return -1;
	}
	return 0;
}

int spoa_req_set_int(struct spoa_req *req, uint8_t scope, const char *name, int64_t v)
{
	struct spop_data d = spop_int64(v);

	return spoa_req_set_data(req, scope, name, &d);
}

int spoa_req_set_str(struct spoa_req *req, uint8_t scope, const char *name, const char *s,
		     size_t len)
{
	struct spop_data d = spop_string(s, len);

	return spoa_req_set_data(req, scope, name, &d);
}

bool spoa_req_orphaned(const struct spoa_req *req)
{
	return req->conn == NULL;
}

void spoa_req_set_udata(struct spoa_req *req, void *udata)
{
	req->udata = udata;
}

void *spoa_req_udata(const struct spoa_req *req)
{
	return req->udata;
}

/*
 * When the bytes of the NOTIFY of <req> arrived, in nanoseconds of the
 * realtime clock: the kernel's receive timestamp of the latest segment read
 * with them (earlier bytes are older still), or the time of that read where
 * the kernel gives none.
 */
uint64_t spoa_req_arrival_ns(const struct spoa_req *req)
{
	return req->arrival;
}

/* Microseconds since the NOTIFY of <req> arrived (0 if the clock went back). */
int64_t spoa_req_age_us(const struct spoa_req *req)
{
	uint64_t now = realtime_ns();

	return now > req->arrival ? (int64_t)((now - req->arrival) / 1000) : 0;
}

/*
 * Completes <req>: sends its ACK on its connection (if that still lives) and
 * frees it. An ACK always carries at least one action: early HAProxy 3.1
 * stalls on empty ACKs, so a request completed with none gets a NULL set-var
 * named "done" added (which HAProxy treats as an unset). May be called from
 * inside the notify callback. <req> is invalid afterwards.
 */
void spoa_req_done(struct spoa_req *req)
{
	struct spoa_conn *c = req->conn;
	struct spoa_server *srv = req->srv;
	bool was_full;
	int n;

	srv->stats.inflight--;
	if (!c) {
		srv->stats.orphans++;
		req_release(srv, req);
		if (srv->zombie && srv->stats.inflight == 0)
			free(srv);
		return;
	}
	list_del(&req->node);
	was_full = c->inflight >= srv->opts.max_inflight;
	c->inflight--;
	if (req->w.len == req->actions_start) {
		struct spop_data d = {.type = SPOP_T_NULL};

		(void)spoa_req_set_data(req, SPOP_SCOPE_TXN, "done", &d);
	}
	n = spop_frame_end(&req->w, req->frame_start);
	if (n > 0 && c->state == CONN_ST_READY) {
		srv->stats.acks++;
		if (conn_send(c, req->buf + req->frame_start, (size_t)n) == 0 && was_full)
			conn_kick(c); /* frames may wait in rx for this free slot */
	}
	req_release(srv, req);
}

/* ---------------------------------------------------------------- input */

static void conn_on_hello(struct spoa_conn *c, const struct spop_frame *f)
{
	struct spop_hello h;
	struct spop_wbuf w;
	uint8_t buf[128];
	uint32_t size;
	int ret, n;

	if (f->type != SPOP_FRM_HAPROXY_HELLO) {
		conn_disconnect(c, SPOP_ST_INVALID, "expected HAPROXY-HELLO");
		return;
	}
	if (!(f->flags & SPOP_FL_FIN)) {
		conn_disconnect(c, SPOP_ST_FRAG_NOT_SUPP, "fragmentation not supported");
		return;
	}
	ret = spop_hello_parse(f->payload, f->len, &h);
	if (ret == 0)
		ret = spop_frame_size_negotiate(&h, c->srv->opts.max_frame_size, &size);
	if (ret < 0) {
		conn_disconnect(c, (uint32_t)-ret, spop_status_str(-ret));
		return;
	}
	spop_wbuf_init(&w, buf, sizeof(buf));
	n = spop_agent_hello_build(&w, size, "pipelining");
	if (n < 0) {
		conn_disconnect(c, SPOP_ST_RES, "cannot build hello");
		return;
	}
	ev_timer_stop(c->srv->loop, &c->timer);
	if (h.healthcheck) {
		c->srv->stats.healthchecks++;
		CLOG(c, SPOA_LOG_DEBUG, "health check");
		conn_set_state(c, CONN_ST_CLOSING);
		ev_timer_set(&c->timer, SPOA_LINGER_MS / 1000., 0.);
		ev_timer_start(c->srv->loop, &c->timer);
		(void)conn_send(c, buf, (size_t)n);
		return;
	}
	c->srv->stats.hellos++;
	c->frame_size = size;
	conn_set_state(c, CONN_ST_READY);
	ev_timer_set(&c->idle, c->srv->opts.idle_timeout_ms / 1000., 0.);
	ev_timer_start(c->srv->loop, &c->idle);
	if (c->srv->h.log) {
		char eid[SPOA_LOG_STR];

		CLOG(c, SPOA_LOG_DEBUG, "hello: frame size %u, engine %s", size,
		     spop_escape(eid, sizeof(eid), h.engine_id.p, h.engine_id.len));
	}
	if ((size_t)size + SPOP_LEN_SIZE < c->srv->opts.ack_max && !c->srv->warned_frame_size) {
		c->srv->warned_frame_size = true;
		CLOG(c, SPOA_LOG_WARN,
		     "HAProxy's max-frame-size %u is below the largest reply (%zu bytes): raise "
		     "max-frame-size in the SPOE agent section, or replies may lose headers",
		     size, c->srv->opts.ack_max - SPOP_LEN_SIZE);
	}
	(void)conn_send(c, buf, (size_t)n);
}

static void conn_on_frame(struct spoa_conn *c, const struct spop_frame *f)
{
	struct spoa_server *srv = c->srv;
	struct spop_disconnect d;
	struct spop_rd rd;
	struct spoa_req *r;

	if (c->state == CONN_ST_HELLO) {
		conn_on_hello(c, f);
		return;
	}
	switch (f->type) {
	case SPOP_FRM_NOTIFY:
		if (!(f->flags & SPOP_FL_FIN)) {
			conn_disconnect(c, SPOP_ST_FRAG_NOT_SUPP, "fragmentation not supported");
			return;
		}
		if (f->flags & SPOP_FL_ABORT) {
			conn_disconnect(c, SPOP_ST_INVALID, "unexpected abort flag");
			return;
		}
		/* the whole message list is validated before the application sees it */
		rd.p = f->payload;
		rd.end = f->payload + f->len;
		{
			struct spop_msg m;
			int ret;

			while ((ret = spop_msg_next(&rd, &m)) > 0)
				;
			if (ret < 0) {
				conn_disconnect(c, SPOP_ST_INVALID, "malformed NOTIFY payload");
				return;
			}
		}
		srv->stats.notify++;
		r = req_new(c, f);
		/* HAProxy gave up on it already: answer at once, decide nothing */
		if (srv->opts.stale_ms && c->now_ns > r->arrival &&
		    c->now_ns - r->arrival > (uint64_t)srv->opts.stale_ms * 1000000u) {
			srv->stats.stale++;
			spoa_req_done(r);
			return;
		}
		rd.p = f->payload;
		rd.end = f->payload + f->len;
		srv->h.on_notify(r, &rd, srv->h.arg);
		return;
	case SPOP_FRM_HAPROXY_DISCON:
		srv->stats.haproxy_disconnects++;
		if (srv->h.log && spop_disconnect_parse(f->payload, f->len, &d) == 0) {
			char msg[SPOA_LOG_STR];

			CLOG(c, SPOA_LOG_DEBUG, "HAPROXY-DISCONNECT status=%u %s", d.status,
			     spop_escape(msg, sizeof(msg), d.message.p, d.message.len));
		}
		conn_disconnect(c, SPOP_ST_NORMAL, "");
		return;
	case SPOP_FRM_HAPROXY_HELLO:
		conn_disconnect(c, SPOP_ST_INVALID, "unexpected HAPROXY-HELLO");
		return;
	case SPOP_FRM_UNSET:
		conn_disconnect(c, SPOP_ST_FRAG_NOT_SUPP, "fragmentation not supported");
		return;
	default:
		/* unknown frame types are skipped (SPOE.txt 3.2.4) */
		CLOG(c, SPOA_LOG_DEBUG, "skipping frame type %u", f->type);
		return;
	}
}

/*
 * Extracts and dispatches every complete frame in rx, stopping when a bound is
 * reached (in-flight requests, send queue) or the connection leaves the
 * HELLO/READY states.
 */
static void conn_process(struct spoa_conn *c)
{
	size_t off = 0;

	if (!c->rx) {
		conn_update_io(c);
		return;
	}
	c->now_ns = realtime_ns();
	while (state_open(c->state)) {
		struct spop_frame f;
		uint32_t len;

		if (c->state == CONN_ST_READY && c->inflight >= c->srv->opts.max_inflight)
			break;
		/* answers pile up faster than the peer reads: wait for the write side,
		 * whose callback kicks processing again */
		if (c->tx_len - c->tx_off >= tx_pause(c))
			break;
		if (spop_frame_len_peek(c->rx + off, c->rx_len - off, &len) == 0)
			break;
		if (len > c->frame_size) {
			conn_disconnect(c, SPOP_ST_TOO_BIG, "frame is too big");
			return;
		}
		if (len < SPOP_FRAME_MIN) {
			conn_disconnect(c, SPOP_ST_INVALID, "frame too short");
			return;
		}
		if (c->rx_len - off - SPOP_LEN_SIZE < len)
			break;
		if (spop_frame_decode(c->rx + off + SPOP_LEN_SIZE, len, &f) < 0) {
			conn_disconnect(c, SPOP_ST_INVALID, "invalid frame header");
			return;
		}
		off += SPOP_LEN_SIZE + len;
		conn_on_frame(c, &f);
		if (c->state == CONN_ST_DEAD)
			return;
	}
	if (c->state == CONN_ST_DEAD)
		return;
	if (off) {
		memmove(c->rx, c->rx + off, c->rx_len - off);
		c->rx_len -= off;
	}
	/* nothing pending: no buffer; little pending in a big one: shrink it */
	if (c->rx_len == 0) {
		conn_rx_release(c);
	} else if (c->rx_cap > SPOA_RX_MIN && c->rx_len <= SPOA_RX_MIN / 2) {
		uint8_t *p = realloc(c->rx, SPOA_RX_MIN);

		if (p) {
			c->rx = p;
			c->rx_cap = SPOA_RX_MIN;
		}
	}
	conn_update_io(c);
}

/*
 * Makes room in the receive buffer of <c>: allocates it, or doubles it while
 * it is full, never past the largest frame (and its length). Returns the room,
 * 0 when the buffer is at its bound (it then holds a complete frame).
 */
static size_t conn_rx_room(struct spoa_conn *c)
{
	size_t max = (size_t)c->frame_size + SPOP_LEN_SIZE, cap;
	uint8_t *p;

	if (c->rx_len < c->rx_cap)
		return c->rx_cap - c->rx_len;
	if (max < SPOA_RX_MIN)
		max = SPOA_RX_MIN;
	if (c->rx_cap >= max)
		return 0;
	cap = c->rx_cap ? c->rx_cap * 2 : SPOA_RX_MIN;
	if (cap > max)
		cap = max;
	p = !c->rx && cap == SPOA_RX_MIN ? buf_get(c->srv) : realloc(c->rx, cap);
	if (!p)
		abort();
	c->rx = p;
	c->rx_cap = cap;
	return cap - c->rx_len;
}

/* Reads into rx with the kernel's receive timestamp; returns what recv() would. */
static ssize_t conn_recv(struct spoa_conn *c, size_t room)
{
	union {
		char buf[CMSG_SPACE(sizeof(struct timespec))];
		struct cmsghdr align;
	} cbuf;
	struct iovec iov = {.iov_base = c->rx + c->rx_len, .iov_len = room};
	struct msghdr mh = {.msg_iov = &iov,
			    .msg_iovlen = 1,
			    .msg_control = cbuf.buf,
			    .msg_controllen = sizeof(cbuf.buf)};
	struct cmsghdr *cm;
	ssize_t n;

	n = recvmsg(c->fd, &mh, MSG_CMSG_CLOEXEC);
	if (n <= 0)
		return n;
	c->rx_stamp = realtime_ns();
	for (cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm)) {
		struct timespec ts;
		uint64_t t;

		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_TIMESTAMPNS ||
		    cm->cmsg_len < CMSG_LEN(sizeof(ts)))
			continue;
		memcpy(&ts, CMSG_DATA(cm), sizeof(ts));
		t = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
		/* a stamp from the future (clock stepped back) is not trusted */
		if (t && t < c->rx_stamp)
			c->rx_stamp = t;
	}
	return n;
}

static void conn_read_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct spoa_conn *c = container_of(w, struct spoa_conn, rio);
	struct spoa_server *srv = c->srv;
	size_t room = conn_rx_room(c);
	ssize_t n;

	(void)revents;
	if (room == 0) {
		/* a full buffer that holds no complete frame cannot happen: frames
		 * are bounded by frame_size */
		conn_process(c);
		return;
	}
	n = conn_recv(c, room);
	if (n < 0) {
		if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) {
			if (c->rx_len == 0)
				conn_rx_release(c);
			return;
		}
		CLOG(c, SPOA_LOG_DEBUG, "recv: %s", strerror(errno));
		conn_kill(c);
		return;
	}
	if (n == 0) {
		if (c->rx_len)
			CLOG(c, SPOA_LOG_DEBUG, "peer closed with %zu bytes of a partial frame",
			     c->rx_len);
		conn_kill(c);
		return;
	}
	c->rx_len += (size_t)n;
	/* most recent input last: the eviction and idle order */
	c->last_input = c->last_active = ev_now(loop);
	list_del(&c->node);
	list_append(&srv->conns, &c->node);
	conn_process(c);
}

/*
 * The idle timer of a READY connection, armed for idle_timeout_ms after its
 * last activity and re-armed lazily: I/O does not touch the timer, this checks
 * when it fires whether the connection really was idle that long. Idle means
 * no request in flight and no byte moving either way: a peer that leaves a
 * partial frame, or stops reading its ACKs, for that long is closed too.
 */
static void conn_idle_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct spoa_conn *c = container_of(t, struct spoa_conn, idle);
	double timeout = c->srv->opts.idle_timeout_ms / 1000.;
	double left = c->last_active + timeout - ev_now(loop);

	(void)revents;
	if (c->state != CONN_ST_READY)
		return;
	if (left > 0.001 || c->inflight) {
		ev_timer_set(t, left > 0.001 ? left : timeout, 0.);
		ev_timer_start(loop, t);
		return;
	}
	c->srv->stats.idle_timeouts++;
	CLOG(c, SPOA_LOG_DEBUG, "idle for %u ms, closing", c->srv->opts.idle_timeout_ms);
	conn_disconnect(c, SPOP_ST_TIMEOUT, "idle timeout");
}

/* ---------------------------------------------------------------- server */

static void peer_name(const struct sockaddr_storage *ss, char *buf, size_t len)
{
	char host[INET6_ADDRSTRLEN];

	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *s4 = (const struct sockaddr_in *)ss;

		inet_ntop(AF_INET, &s4->sin_addr, host, sizeof(host));
		snprintf(buf, len, "%s:%u", host, ntohs(s4->sin_port));
	} else if (ss->ss_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)ss;

		inet_ntop(AF_INET6, &s6->sin6_addr, host, sizeof(host));
		snprintf(buf, len, "[%s]:%u", host, ntohs(s6->sin6_port));
	} else {
		snprintf(buf, len, "unix");
	}
}

static void conn_new(struct spoa_server *srv, int fd, const struct sockaddr_storage *ss)
{
	struct spoa_conn *c = xalloc(sizeof(*c));

	c->srv = srv;
	c->fd = fd;
	c->id = ++srv->next_id;
	c->state = CONN_ST_HELLO;
	srv->nopen++;
	c->frame_size = srv->opts.max_frame_size;
	c->last_input = c->last_active = ev_now(srv->loop);
	list_init(&c->reqs);
	peer_name(ss, c->peer, sizeof(c->peer));
	ev_io_init(&c->rio, conn_read_cb, fd, EV_READ);
	ev_io_init(&c->wio, conn_write_cb, fd, EV_WRITE);
	ev_timer_init(&c->timer, conn_timer_cb, srv->opts.hello_timeout_ms / 1000., 0.);
	ev_timer_init(&c->idle, conn_idle_cb, 0., 0.);
	ev_timer_start(srv->loop, &c->timer);
	list_append(&srv->conns, &c->node);
	srv->stats.conns_accepted++;
	srv->stats.conns_active++;
	conn_update_io(c);
	CLOG(c, SPOA_LOG_DEBUG, "accepted");
}

/*
 * Makes room for one more connection of <srv>: closes the connection with the
 * oldest input among those with no request in flight (a connection still
 * waiting for its HELLO, holding a partial frame or not reading its ACKs
 * included: none of them may pin a slot). Returns false if every connection
 * is busy.
 */
static bool conn_evict_one(struct spoa_server *srv)
{
	struct list *n, *tmp;

	list_for_each_safe(n, tmp, &srv->conns)
	{
		struct spoa_conn *c = LIST_ELEM(n, struct spoa_conn, node);

		if (c->state == CONN_ST_HELLO) {
			CLOG(c, SPOA_LOG_DEBUG, "no HELLO yet, closed for a new connection");
			conn_kill(c);
		} else if (c->state == CONN_ST_READY && !c->inflight) {
			CLOG(c, SPOA_LOG_DEBUG, "idle, closed for a new connection");
			conn_disconnect(c, SPOP_ST_NORMAL, "connection limit reached, idle "
							   "connection closed");
		} else {
			continue;
		}
		srv->stats.conns_evicted++;
		return true;
	}
	return false;
}

static void accept_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct spoa_listener *l = container_of(w, struct spoa_listener, io);
	struct spoa_server *srv = l->srv;
	int i;

	(void)loop;
	(void)revents;
	for (i = 0; i < 64; i++) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		int fd, one = 1;

		fd = accept4(l->fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			if ((errno == EMFILE || errno == ENFILE) && srv->spare_fd >= 0) {
				/* free the spare, accept and drop the connection, take it back:
				 * HAProxy sees a close instead of a hanging backlog */
				close(srv->spare_fd);
				fd = accept(l->fd, NULL, NULL);
				if (fd >= 0)
					close(fd);
				srv->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
				srv->stats.conns_refused++;
				slog(srv, SPOA_LOG_WARN, "out of file descriptors, refused a connection");
				continue;
			}
			if (errno != EAGAIN && errno != EWOULDBLOCK)
				slog(srv, SPOA_LOG_WARN, "accept: %s", strerror(errno));
			return;
		}
		if (srv->nopen >= srv->opts.max_conns && !conn_evict_one(srv)) {
			close(fd);
			srv->stats.conns_refused++;
			continue;
		}
		if (ss.ss_family == AF_INET || ss.ss_family == AF_INET6)
			(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		/* receive timestamps: the age of a NOTIFY (the time of the read without) */
		(void)setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof(one));
		conn_new(srv, fd, &ss);
	}
}

/*
 * Creates a server on <loop> with <opts> (NULL: defaults) and the hooks of
 * <handler> (copied). Nothing listens until spoa_server_listen().
 */
struct spoa_server *spoa_server_new(struct ev_loop *loop, const struct spoa_opts *opts,
				    const struct spoa_handler *handler)
{
	struct spoa_server *srv = xalloc(sizeof(*srv));

	srv->loop = loop;
	if (opts)
		srv->opts = *opts;
	if (!srv->opts.max_frame_size)
		srv->opts.max_frame_size = 65532;
	if (srv->opts.max_frame_size < SPOP_FRAME_SIZE_DFLT)
		srv->opts.max_frame_size = SPOP_FRAME_SIZE_DFLT;
	if (!srv->opts.max_inflight)
		srv->opts.max_inflight = 256;
	if (!srv->opts.max_conns)
		srv->opts.max_conns = 4096;
	if (!srv->opts.hello_timeout_ms)
		srv->opts.hello_timeout_ms = 5000;
	if (!srv->opts.idle_timeout_ms)
		srv->opts.idle_timeout_ms = 300000;
	if (!srv->opts.ack_max)
		srv->opts.ack_max = SPOA_ACK_DFLT;
	srv->ack_bound = srv->opts.ack_max;
	srv->h = *handler;
	list_init(&srv->listeners);
	list_init(&srv->conns);
	list_init(&srv->flushq);
	ev_prepare_init(&srv->flusher, flusher_cb);
	srv->flusher.data = srv;
	srv->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	return srv;
}

/*
 * Parses <addr> ("ip:port", "[ipv6]:port" or "unix:/path") into <ss>.
 * Returns 0 or -1 with a message in <err>.
 */
static int parse_addr(const char *addr, struct sockaddr_storage *ss, socklen_t *sl, char *err,
		      size_t errlen)
{
	char host[INET6_ADDRSTRLEN + 2];
	const char *colon;
	char *end;
	unsigned long port;
	size_t hl;

	memset(ss, 0, sizeof(*ss));
	if (strncmp(addr, "unix:", 5) == 0) {
		struct sockaddr_un *su = (struct sockaddr_un *)ss;

		if (strlen(addr + 5) == 0 || strlen(addr + 5) >= sizeof(su->sun_path)) {
			snprintf(err, errlen, "bad unix socket path in '%s'", addr);
			return -1;
		}
		su->sun_family = AF_UNIX;
		strcpy(su->sun_path, addr + 5);
		*sl = sizeof(*su);
		return 0;
	}
	colon = strrchr(addr, ':');
	if (!colon || colon == addr) {
		snprintf(err, errlen, "'%s': expected ip:port, [ipv6]:port or unix:/path", addr);
		return -1;
	}
	errno = 0;
	port = strtoul(colon + 1, &end, 10);
	if (errno || *end || end == colon + 1 || port > 65535) {
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
	} else {
		if (hl >= sizeof(host)) {
			snprintf(err, errlen, "'%s': bad address", addr);
			return -1;
		}
		memcpy(host, addr, hl);
		host[hl] = 0;
	}
	if (inet_pton(AF_INET, host, &((struct sockaddr_in *)ss)->sin_addr) == 1) {
		struct sockaddr_in *s4 = (struct sockaddr_in *)ss;

		s4->sin_family = AF_INET;
		s4->sin_port = htons((uint16_t)port);
		*sl = sizeof(*s4);
		return 0;
	}
	if (inet_pton(AF_INET6, host, &((struct sockaddr_in6 *)ss)->sin6_addr) == 1) {
		struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;

		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons((uint16_t)port);
		*sl = sizeof(*s6);
		return 0;
	}
	snprintf(err, errlen, "'%s': not a numeric IP address (names are not resolved)", addr);
	return -1;
}

/*
 * Opens a listener on <addr> and starts accepting. Returns 0, or -1 with a
 * message in <err>.
 */
int spoa_server_listen(struct spoa_server *srv, const char *addr, char *err, size_t errlen)
{
	struct sockaddr_storage ss;
	struct spoa_listener *l;
	socklen_t sl;
	int fd, one = 1;

	if (parse_addr(addr, &ss, &sl, err, errlen) < 0)
		return -1;
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(err, errlen, "%s: socket: %s", addr, strerror(errno));
		return -1;
	}
	if (ss.ss_family == AF_UNIX) {
		struct stat st;
		const char *path = ((struct sockaddr_un *)&ss)->sun_path;

		/* replace a stale socket, never another kind of file, and never the
		 * socket of a live process (another instance, or the one we replace) */
		if (stat(path, &st) == 0 && S_ISSOCK(st.st_mode)) {
			int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
			int ret = probe >= 0 ? connect(probe, (struct sockaddr *)&ss, sl) : -1;
			int e = errno;

			if (probe >= 0)
				close(probe);
			if (ret == 0 || (e != ECONNREFUSED && e != ENOENT)) {
				snprintf(err, errlen,
					 "%s: a process is listening on this socket (%s): not "
					 "replacing it; stop that process or choose another path",
					 addr, ret == 0 ? "it accepted a connection" : strerror(e));
				close(fd);
				return -1;
			}
			unlink(path);
		}
	} else {
		(void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (srv->opts.reuseport &&
		    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) < 0) {
			snprintf(err, errlen, "%s: SO_REUSEPORT: %s", addr, strerror(errno));
			close(fd);
			return -1;
		}
		if (ss.ss_family == AF_INET6)
			(void)setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
	}
	if (bind(fd, (struct sockaddr *)&ss, sl) < 0 || listen(fd, 1024) < 0) {
		snprintf(err, errlen, "%s: %s", addr, strerror(errno));
		close(fd);
		return -1;
	}
	l = xalloc(sizeof(*l));
	l->srv = srv;
	l->fd = fd;
	if (ss.ss_family == AF_UNIX) {
		struct stat st;

		l->unix_path = strdup(((struct sockaddr_un *)&ss)->sun_path);
		if (l->unix_path && stat(l->unix_path, &st) == 0) {
			l->unix_dev = st.st_dev;
			l->unix_ino = st.st_ino;
		}
	}
	ev_io_init(&l->io, accept_cb, fd, EV_READ);
	ev_io_start(srv->loop, &l->io);
	list_append(&srv->listeners, &l->node);
	slog(srv, SPOA_LOG_NOTICE, "listening on %s", addr);
	return 0;
}

/* Closes every listener; open connections are left alone. */
void spoa_server_stop_accepting(struct spoa_server *srv)
{
	struct list *n, *tmp;

	list_for_each_safe(n, tmp, &srv->listeners)
	{
		struct spoa_listener *l = LIST_ELEM(n, struct spoa_listener, node);

		ev_io_stop(srv->loop, &l->io);
		close(l->fd);
		/* only the file we made: another instance may own the path by now */
		if (l->unix_path) {
			struct stat st;

			if (stat(l->unix_path, &st) == 0 && st.st_dev == l->unix_dev &&
			    st.st_ino == l->unix_ino)
				unlink(l->unix_path);
		}
		free(l->unix_path);
		list_del(&l->node);
		free(l);
	}
}

/*
 * Sends AGENT-DISCONNECT(<status>, <message>) on every connection and closes
 * them once written; requests still in flight become orphans.
 */
void spoa_server_disconnect_all(struct spoa_server *srv, uint32_t status, const char *message)
{
	struct list *n, *tmp;

	list_for_each_safe(n, tmp, &srv->conns)
	{
		struct spoa_conn *c = LIST_ELEM(n, struct spoa_conn, node);

		if (c->state == CONN_ST_HELLO)
			conn_kill(c);
		else
			conn_disconnect(c, status, message);
	}
}

/*
 * Sets the age beyond which a NOTIFY is answered with an empty ACK without
 * reaching the handler (0: never), from the next NOTIFY on.
 */
void spoa_server_set_stale_ms(struct spoa_server *srv, unsigned ms)
{
	srv->opts.stale_ms = ms;
}

/*
 * Sets the largest ACK frame (length included) requests received from now on
 * can build; 0 restores the default. The send queue bounds keep the largest
 * size ever set, for the requests still in flight.
 */
void spoa_server_set_ack_max(struct spoa_server *srv, size_t ack_max)
{
	srv->opts.ack_max = ack_max ? ack_max : SPOA_ACK_DFLT;
	if (srv->opts.ack_max > srv->ack_bound)
		srv->ack_bound = srv->opts.ack_max;
}

size_t spoa_server_conns(const struct spoa_server *srv)
{
	return (size_t)srv->stats.conns_active;
}

const struct spoa_stats *spoa_server_stats(const struct spoa_server *srv)
{
	return &srv->stats;
}

/*
 * Closes everything at once and frees <srv>. Pending requests become orphans;
 * if any remain, the memory is released when the last one completes.
 */
void spoa_server_free(struct spoa_server *srv)
{
	struct list *n, *tmp;

	if (!srv)
		return;
	spoa_server_stop_accepting(srv);
	/* ACKs answered in this iteration (a store freed before us answers its
	 * waiters) get their one try at the socket */
	flusher_cb(srv->loop, &srv->flusher, 0);
	list_for_each_safe(n, tmp, &srv->conns)
		conn_free(LIST_ELEM(n, struct spoa_conn, node));
	if (srv->spare_fd >= 0)
		close(srv->spare_fd);
	srv->spare_fd = -1;
	req_pool_drain(srv);
	while (srv->nspare) {
		void *p = srv->spare[--srv->nspare];

		pool_unpoison(p, SPOA_RX_MIN);
		free(p);
	}
	/* orphaned requests still point at us: the last one to complete frees us */
	if (srv->stats.inflight) {
		srv->zombie = true;
		return;
	}
	free(srv);
}
