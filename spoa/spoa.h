/* SPDX-License-Identifier: MIT */
/*
 * libspoa: the runtime side of an SPOP agent on a libev loop. It accepts
 * HAProxy's connections, runs the handshake, answers health-check hellos,
 * decodes frames and hands every NOTIFY to the application as a request
 * handle that the application completes later (or at once) with actions.
 *
 * It knows nothing about what the messages mean, and does not print: it calls
 * the handler's log hook.
 *
 * Requests complete in any order on the connection they came from (pipelining).
 * Every buffer and queue is bounded: the receive buffer grows with the bytes
 * actually received up to the frame size and is released when empty, the
 * NOTIFYs in flight per connection and the send queue (reading pauses at their
 * bounds: back-pressure, never a disconnect), the number of connections (the
 * connection idle longest makes room for a new one), the idle time of a
 * connection after its HELLO.
 */
#ifndef SPOA_SPOA_H
#define SPOA_SPOA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "spop.h"

struct ev_loop;
struct spoa_server;
struct spoa_req;

/* Log levels handed to the log hook. */
enum spoa_log_level {
	SPOA_LOG_ERR    = 0,
	SPOA_LOG_WARN   = 1,
	SPOA_LOG_NOTICE = 2,
	SPOA_LOG_INFO   = 3,
	SPOA_LOG_DEBUG  = 4
};

/*
 * Called for each NOTIFY. <msgs> is a cursor over the LIST-OF-MESSAGES payload
 * (use spop_msg_next()); it and every view decoded from it are valid only until
 * the callback returns. The callback owns <req> and must complete it exactly
 * once with spoa_req_done(), now or later.
 */
typedef void (*spoa_notify_fn)(struct spoa_req *req, struct spop_rd *msgs, void *arg);
typedef void (*spoa_log_fn)(int level, const char *msg, void *arg);

struct spoa_handler {
	spoa_notify_fn on_notify;       /* required */
	spoa_log_fn log;                /* optional */
	void *arg;                      /* ref: passed to both hooks */
};

/* Tunables; zero fields take the defaults given in the comments. */
struct spoa_opts {
	uint32_t max_frame_size;        /* largest frame we accept/announce (65532) */
	unsigned max_inflight;          /* NOTIFYs in flight per connection (256) */
	unsigned max_conns;             /* open connections (4096); at the bound the one
					 * idle longest is closed to admit a new one */
	unsigned hello_timeout_ms;      /* wait for HAPROXY-HELLO (5000) */
	unsigned idle_timeout_ms;       /* close a connection with no request for this
					 * long after its HELLO (300000) */
	unsigned stale_ms;              /* NOTIFYs older than this get an empty ACK and
					 * never reach the handler (0: never) */
	size_t ack_max;                 /* largest ACK frame, length included (1024) */
	bool reuseport;                 /* set SO_REUSEPORT on TCP listeners */
};

/* Counters, cumulative since the server was created. */
struct spoa_stats {
	uint64_t conns_accepted;        /* connections accepted */
	uint64_t conns_refused;         /* closed at once: too many busy connections */
	uint64_t conns_evicted;         /* idle ones closed to admit a new connection */
	uint64_t idle_timeouts;         /* closed after idle_timeout_ms without a request */
	uint64_t stale;                 /* NOTIFYs older than stale_ms, answered empty */
	uint64_t conns_active;          /* open now */
	uint64_t hellos;                /* handshakes completed */
	uint64_t healthchecks;          /* health-check hellos answered */
	uint64_t notify;                /* NOTIFY frames received */
	uint64_t acks;                  /* ACK frames sent */
	uint64_t orphans;               /* requests completed after their connection closed */
	uint64_t inflight;              /* requests not completed yet */
	uint64_t haproxy_disconnects;   /* HAPROXY-DISCONNECT frames received */
	uint64_t errors[SPOP_ST_RES + 1]; /* AGENT-DISCONNECTs sent, by status */
};

/* ---- server lifecycle ---- */
struct spoa_server *spoa_server_new(struct ev_loop *loop, const struct spoa_opts *opts,
				    const struct spoa_handler *handler);
int spoa_server_listen(struct spoa_server *srv, const char *addr, char *err, size_t errlen);
void spoa_server_stop_accepting(struct spoa_server *srv);
void spoa_server_disconnect_all(struct spoa_server *srv, uint32_t status, const char *message);
size_t spoa_server_conns(const struct spoa_server *srv);
const struct spoa_stats *spoa_server_stats(const struct spoa_server *srv);
void spoa_server_free(struct spoa_server *srv);
void spoa_server_set_stale_ms(struct spoa_server *srv, unsigned ms);
void spoa_server_set_ack_max(struct spoa_server *srv, size_t ack_max);

/* ---- requests ---- */
int spoa_req_set_int(struct spoa_req *req, uint8_t scope, const char *name, int64_t v);
int spoa_req_set_str(struct spoa_req *req, uint8_t scope, const char *name, const char *s,
		     size_t len);
int spoa_req_set_data(struct spoa_req *req, uint8_t scope, const char *name,
		      const struct spop_data *v);
bool spoa_req_orphaned(const struct spoa_req *req);
void spoa_req_set_udata(struct spoa_req *req, void *udata);
void *spoa_req_udata(const struct spoa_req *req);
uint64_t spoa_req_arrival_ns(const struct spoa_req *req);
int64_t spoa_req_age_us(const struct spoa_req *req);
void spoa_req_done(struct spoa_req *req);

#endif /* SPOA_SPOA_H */
