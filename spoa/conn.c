/* SPDX-License-Identifier: MIT */
/*
 * libspoa: connections: state, buffers, frame input and ACK output.
 */

#include "spoa_int.h"

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

static void conn_process(struct spoa_conn *c);

void slog(struct spoa_server *srv, int level, const char *fmt, ...)
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

void *xalloc(size_t n)
{
	void *p = calloc(1, n);

	if (!p)
		abort();
	return p;
}

/* The realtime clock in nanoseconds: what kernel receive timestamps use. */
uint64_t realtime_ns(void)
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
void conn_free(struct spoa_conn *c)
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

void conn_timer_cb(struct ev_loop *loop, ev_timer *t, int revents)
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
void conn_kill(struct spoa_conn *c)
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
void conn_kick(struct spoa_conn *c)
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
int conn_send(struct spoa_conn *c, const uint8_t *data, size_t len)
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
void flusher_cb(struct ev_loop *loop, ev_prepare *w, int revents)
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
void conn_disconnect(struct spoa_conn *c, uint32_t status, const char *msg)
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
void conn_update_io(struct spoa_conn *c)
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

void conn_write_cb(struct ev_loop *loop, ev_io *w, int revents)
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

void conn_read_cb(struct ev_loop *loop, ev_io *w, int revents)
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
void conn_idle_cb(struct ev_loop *loop, ev_timer *t, int revents)
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
