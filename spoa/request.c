/* SPDX-License-Identifier: MIT */
/*
 * libspoa: requests: one per NOTIFY, the ACK built in it, ended by spoa_req_done().
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

/* ---------------------------------------------------------------- requests */

/*
 * Requests are allocated per NOTIFY with room for a whole ACK (kilobytes), and
 * freed at its answer: freed ones of the usual size are kept for reuse, up to
 * REQ_POOL_MAX, instead of going through the allocator (and calloc()'s
 * clearing of the buffer) every time.
 */
#define REQ_POOL_MAX 256

void req_pool_drain(struct spoa_server *srv)
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

struct spoa_req *req_new(struct spoa_conn *c, const struct spop_frame *f)
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
