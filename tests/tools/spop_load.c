/* SPDX-License-Identifier: MIT */
/*
 * spop-load: a SPOP load generator. It speaks to an agent as HAProxy would
 * (HELLO, then pipelined NOTIFYs carrying the rl-req message) over several
 * connections, keeps a fixed number of NOTIFYs in flight on each, and reports
 * decisions per second, latency percentiles and the verdicts.
 *
 *   spop-load -a 127.0.0.1:12345 [-c conns] [-p pipeline] [-d seconds]
 *             [-k keys] [-K key-prefix] [-n max-requests] [-r rate] [-s] [-R]
 *             [-i addresses] [-t tier] [-T ms] [-S seed] [-L]
 *
 * Keys are <key-prefix><n> with n drawn at random from 0..keys-1 (with -s in
 * turn); with -R every request carries a key never sent before (<key-prefix>
 * and 16 random hex digits), as a random-key flood would. Requests come from
 * 127.0.0.1, or with -i from <addresses> addresses 10.0.0.0, 10.0.0.1, ... in
 * turn.
 *
 * Without -r it keeps -p NOTIFYs in flight on every connection (closed loop)
 * and stops dead at -d. With -r it paces, open loop: a clock ticks every 1 ms
 * (or every 1/rate s, up to 10 ms) and each tick sends what is due by then,
 * rate x elapsed, one NOTIFY per connection in turn (20 a tick at 20,000/s over
 * 4 connections: 5 per connection and tick). Never more than -p are in flight
 * on one connection; a backlog so held back is sent as ACKs free room, so the
 * offered count stays rate x elapsed. At -d it stops sending and waits up to 2 s
 * for the answers still due, so every request sent is counted (the line then
 * ends with sent= and unanswered=).
 *
 * Keys are drawn at random among -k (<prefix>0 .. <prefix>k-1); with -s they are
 * taken in turn, so the first k requests carry k distinct keys. The client
 * address sent is 127.0.0.1; with -i N the requests rotate over N addresses
 * (10.0.0.0 + 0 .. N-1), as if N clients were behind the gateway. -t sends a
 * tier with every request, as HAProxy does for a key found in its tier map.
 * -T ms gives up on a NOTIFY not answered within ms milliseconds, as HAProxy
 * does at `timeout processing`: it is counted as expired (and unanswered), its
 * slot is freed, and an ACK arriving for it later is counted as late and
 * otherwise ignored. -S seeds the draws (the keys drawn at random, the keys of
 * -R): runs with the same seed (or none) send the same keys in the same
 * order, runs with different seeds other draws over the same key space.
 *
 * -L gives concurrency slots back as HAProxy does: an ACK that names a `slot`
 * is followed at once by a NOTIFY of the response message (rl-res) with the
 * request's key, tier, address and that slot; those NOTIFYs are not decisions
 * (their ACKs are counted apart, in released=).
 *
 * Loopback tool: bounded by -d and -n, it stops by itself.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <ev.h>

#include "spop.h"

#define MAX_INFLIGHT 256
#define LAT_SLOTS    100000     /* latency samples kept (reservoir) */

struct lconn {
	int fd;
	ev_io rio, wio;
	uint8_t rx[65536];
	size_t rx_len;
	uint8_t tx[1 << 16];
	size_t tx_len;
	bool ready;                     /* hello answered */
	uint64_t next_sid;
	double sent_at[MAX_INFLIGHT];   /* by sid % MAX_INFLIGHT */
	uint64_t slot_sid[MAX_INFLIGHT];        /* -T: the NOTIFY a slot waits for */
	char key[MAX_INFLIGHT][64];             /* -L: the key each NOTIFY sent */
	uint8_t ip[MAX_INFLIGHT][4];            /* -L: ... and its address */
	uint64_t next_rel_sid;                  /* -L: the response messages' stream ids */
	bool live[MAX_INFLIGHT];                /* -T: the slot waits for an ACK */
	unsigned inflight;
};

static struct {
	const char *addr;
	int conns, pipeline, keys;
	double duration;
	uint64_t max_requests;
	const char *key_prefix;
	double rate;                    /* -r: NOTIFYs per second, 0 = closed loop */
	bool random_keys;               /* -R: a fresh key for every request */
	uint64_t rng;                   /* xorshift64 state for -R */
	bool seq_keys;                  /* -s: keys in turn instead of at random */
	uint32_t addrs;                 /* -i: client addresses to rotate over, 0 = one */
	const char *tier;               /* -t: tier sent with every request, NULL = none */
	bool release;                   /* -L: give the slots back (rl-res) */
	uint64_t released, rel_acks;    /* -L: response messages sent, and answered */
	double expire;                  /* -T: seconds before giving up on a NOTIFY, 0 = never */
	uint64_t expired, late;
	double drain_until;             /* -r: end of the grace period for answers */
	uint64_t sent, acks, allowed, denied, degraded, errors;
	uint64_t due;                   /* -r: NOTIFYs due by the last pacing tick */
	double lat[LAT_SLOTS];
	uint64_t nlat;
	double start;
	bool stopping;
} g = {.addr = "127.0.0.1:12345", .conns = 4, .pipeline = 16, .keys = 1000, .duration = 5,
       .key_prefix = "load-", .rng = 0x9e3779b97f4a7c15ULL};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void queue(struct lconn *c, const uint8_t *p, size_t n)
{
	if (c->tx_len + n > sizeof(c->tx)) {
		fprintf(stderr, "tx overflow\n");
		exit(2);
	}
	memcpy(c->tx + c->tx_len, p, n);
	c->tx_len += n;
}

/* The principal's arguments of both messages: key, tier (-t), ip (<ip>, IPv4). */
static void put_principal(struct spop_wbuf *w, const char *key, const uint8_t *ip)
{
	struct spop_data d;

	spop_put_str(w, "key", 3);
	d = spop_string(key, strlen(key));
	spop_put_data(w, &d);
	if (g.tier) {
		spop_put_str(w, "tier", 4);
		d = spop_string(g.tier, strlen(g.tier));
		spop_put_data(w, &d);
	}
	spop_put_str(w, "ip", 2);
	d.type = SPOP_T_IPV4;
	memcpy(d.v.ipv4, ip, 4);
	spop_put_data(w, &d);
}

static void send_notify(struct ev_loop *loop, struct lconn *c)
{
	uint8_t buf[512];
	char key[64];
	struct spop_wbuf w;
	struct spop_data d;
	uint8_t ip[4] = {127, 0, 0, 1};
	size_t start;
	uint64_t sid = c->next_sid;
	int n;

	c->next_sid += 2;
	if (g.random_keys) {
		g.rng ^= g.rng << 13;
		g.rng ^= g.rng >> 7;
		g.rng ^= g.rng << 17;
		snprintf(key, sizeof(key), "%.40s%016llx", g.key_prefix, (unsigned long long)g.rng);
	} else {
		snprintf(key, sizeof(key), "%.40s%d", g.key_prefix,
			 g.seq_keys ? (int)(g.sent % (uint64_t)g.keys) : rand() % g.keys);
	}
	if (g.addrs) {
		uint32_t a = (uint32_t)(g.sent % g.addrs);

		ip[0] = 10;
		ip[1] = (uint8_t)(a >> 16);
		ip[2] = (uint8_t)(a >> 8);
		ip[3] = (uint8_t)a;
	}
	spop_wbuf_init(&w, buf, sizeof(buf));
	start = spop_frame_begin(&w, SPOP_FRM_NOTIFY, SPOP_FL_FIN, sid, 1);
	spop_put_str(&w, "rl-req", 6);
	spop_put_u8(&w, g.tier ? 5 : 4);
	put_principal(&w, key, ip);
	spop_put_str(&w, "method", 6);
	d = spop_string("GET", 3);
	spop_put_data(&w, &d);
	spop_put_str(&w, "path", 4);
	d = spop_string("/", 1);
	spop_put_data(&w, &d);
	n = spop_frame_end(&w, start);
	if (n < 0)
		exit(2);
	queue(c, buf, (size_t)n);
	if (g.expire) {
		unsigned slot = (unsigned)(sid / 2 % MAX_INFLIGHT);

		if (c->live[slot]) {    /* still waiting MAX_INFLIGHT NOTIFYs later */
			c->inflight--;
			g.expired++;
		}
		c->live[slot] = true;
		c->slot_sid[slot] = sid;
	}
	c->sent_at[sid / 2 % MAX_INFLIGHT] = now_s();
	if (g.release) {
		snprintf(c->key[sid / 2 % MAX_INFLIGHT], sizeof(c->key[0]), "%s", key);
		memcpy(c->ip[sid / 2 % MAX_INFLIGHT], ip, 4);
	}
	c->inflight++;
	g.sent++;
	ev_io_start(loop, &c->wio);
}

/* -r: true while NOTIFYs due at the last pacing tick are still unsent */
static bool paced_ok(void)
{
	return !g.rate || g.sent < g.due;
}

/* True when <c> may send one more NOTIFY now. */
static bool may_send(const struct lconn *c)
{
	return !g.stopping && c->fd >= 0 && c->ready && c->inflight < (unsigned)g.pipeline &&
	       (!g.max_requests || g.sent < g.max_requests) && paced_ok();
}

static void fill(struct ev_loop *loop, struct lconn *c)
{
	while (may_send(c))
		send_notify(loop, c);
}

/* The stream ids of the response messages: above every decision's. */
#define REL_SID_BASE (UINT64_C(1) << 40)

/* -L: the response message giving back <slot> of request <i> (its key and address). */
static void send_release(struct lconn *c, unsigned i, int64_t slot)
{
	uint8_t buf[512];
	struct spop_wbuf w;
	struct spop_data d;
	size_t start;
	int n;

	spop_wbuf_init(&w, buf, sizeof(buf));
	start = spop_frame_begin(&w, SPOP_FRM_NOTIFY, SPOP_FL_FIN,
				 REL_SID_BASE + c->next_rel_sid, 1);
	c->next_rel_sid += 2;
	spop_put_str(&w, "rl-res", 6);
	spop_put_u8(&w, g.tier ? 4 : 3);
	put_principal(&w, c->key[i], c->ip[i]);
	spop_put_str(&w, "slot", 4);
	d.type = SPOP_T_INT64;
	d.v.i = slot;
	spop_put_data(&w, &d);
	n = spop_frame_end(&w, start);
	if (n < 0)
		exit(2);
	queue(c, buf, (size_t)n);
	g.released++;
}

static void on_ack(struct ev_loop *loop, struct lconn *c, const struct spop_frame *f)
{
	struct spop_rd rd = {f->payload, f->payload + f->len};
	double lat = now_s() - c->sent_at[f->sid / 2 % MAX_INFLIGHT];
	bool allow = false, degraded = false;
	int64_t cslot = 0;

	if (f->sid >= REL_SID_BASE) {
		g.rel_acks++;
		return;
	}
	if (g.expire) {
		unsigned slot = (unsigned)(f->sid / 2 % MAX_INFLIGHT);

		if (!c->live[slot] || c->slot_sid[slot] != f->sid) {
			g.late++;
			return;
		}
		c->live[slot] = false;
	}
	while (rd.p < rd.end) {
		struct spop_str name;
		struct spop_data v;
		uint8_t type, nargs;

		if (rd.end - rd.p < 3)
			break;
		type = rd.p[0];
		nargs = rd.p[1];
		rd.p += 3;
		if (spop_str_decode(&rd, &name) < 0)
			break;
		if (type != SPOP_ACT_SET_VAR || nargs != 3)
			continue;
		if (spop_data_decode(&rd, &v) < 0)
			break;
		if (spop_str_eq(&name, "allow"))
			allow = v.v.i == 1;
		else if (spop_str_eq(&name, "degraded"))
			degraded = true;
		else if (spop_str_eq(&name, "slot"))
			cslot = v.v.i;
	}
	if (g.release && cslot > 0) {
		send_release(c, (unsigned)(f->sid / 2 % MAX_INFLIGHT), cslot);
		ev_io_start(loop, &c->wio);
	}
	g.acks++;
	if (degraded)
		g.degraded++;
	else if (allow)
		g.allowed++;
	else
		g.denied++;
	if (g.nlat < LAT_SLOTS)
		g.lat[g.nlat++] = lat;
	else if ((uint64_t)rand() % g.acks < LAT_SLOTS)
		g.lat[(uint64_t)rand() % LAT_SLOTS] = lat;
	c->inflight--;
}

static void read_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct lconn *c = w->data;
	size_t off = 0;
	ssize_t n;

	(void)revents;
	n = recv(c->fd, c->rx + c->rx_len, sizeof(c->rx) - c->rx_len, 0);
	if (n <= 0) {
		if (n < 0 && (errno == EAGAIN || errno == EINTR))
			return;
		fprintf(stderr, "connection closed by the agent\n");
		g.errors++;
		c->ready = false;
		ev_io_stop(loop, &c->rio);
		ev_io_stop(loop, &c->wio);
		return;
	}
	c->rx_len += (size_t)n;
	for (;;) {
		struct spop_frame f;
		uint32_t len;

		if (spop_frame_len_peek(c->rx + off, c->rx_len - off, &len) == 0 ||
		    c->rx_len - off - 4 < len)
			break;
		if (spop_frame_decode(c->rx + off + 4, len, &f) < 0) {
			g.errors++;
			break;
		}
		if (f.type == SPOP_FRM_AGENT_HELLO)
			c->ready = true;
		else if (f.type == SPOP_FRM_ACK)
			on_ack(loop, c, &f);
		else if (f.type == SPOP_FRM_AGENT_DISCON)
			g.errors++;
		off += 4 + len;
	}
	memmove(c->rx, c->rx + off, c->rx_len - off);
	c->rx_len -= off;
	fill(loop, c);
}

static void write_cb(struct ev_loop *loop, ev_io *w, int revents)
{
	struct lconn *c = w->data;
	ssize_t n;

	(void)revents;
	n = send(c->fd, c->tx, c->tx_len, MSG_NOSIGNAL);
	if (n < 0) {
		if (errno != EAGAIN && errno != EINTR) {
			g.errors++;
			ev_io_stop(loop, w);
		}
		return;
	}
	memmove(c->tx, c->tx + n, c->tx_len - (size_t)n);
	c->tx_len -= (size_t)n;
	if (!c->tx_len)
		ev_io_stop(loop, w);
}

static unsigned total_inflight(const struct lconn *conns)
{
	unsigned n = 0;
	int i;

	for (i = 0; i < g.conns; i++)
		n += conns[i].inflight;
	return n;
}

static void tick_cb(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct lconn *conns = t->data;
	double now = now_s();
	int i;

	(void)revents;
	if (g.expire) {
		for (i = 0; i < g.conns; i++) {
			struct lconn *c = &conns[i];
			unsigned s;

			for (s = 0; s < MAX_INFLIGHT; s++) {
				if (c->live[s] && now - c->sent_at[s] > g.expire) {
					c->live[s] = false;
					c->inflight--;
					g.expired++;
				}
			}
			if (!g.rate && c->fd >= 0)
				fill(loop, c);
		}
	}
	if (g.max_requests && g.acks + g.expired >= g.max_requests) {
		ev_break(loop, EVBREAK_ALL);
		return;
	}
	if (!g.rate) {
		if (now - g.start >= g.duration)
			ev_break(loop, EVBREAK_ALL);
		return;
	}
	/* paced: stop sending at -d, then wait (bounded) for the answers still due */
	if (!g.stopping && now - g.start >= g.duration) {
		g.stopping = true;
		g.drain_until = now + 2.0;
	}
	if (g.stopping) {
		if (!total_inflight(conns) || now >= g.drain_until || g.errors)
			ev_break(loop, EVBREAK_ALL);
		return;
	}
	/* what is due now leaves now, one NOTIFY per connection in turn (a backlog a full
	 * pipeline holds back leaves as its ACKs come in, see read_cb) */
	g.due = (uint64_t)(g.rate * (now - g.start)) + 1;
	for (bool sent = true; sent;) {
		sent = false;
		for (i = 0; i < g.conns; i++) {
			if (may_send(&conns[i])) {
				send_notify(loop, &conns[i]);
				sent = true;
			}
		}
	}
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	struct ev_loop *loop = ev_default_loop(0);
	struct sockaddr_in sin = {.sin_family = AF_INET};
	struct lconn *conns;
	ev_timer tick;
	char host[64];
	const char *colon;
	double elapsed;
	unsigned long seed = 0;
	int opt, i;

	while ((opt = getopt(argc, argv, "a:c:p:d:k:K:n:r:Rsi:t:T:S:L")) != -1) {
		switch (opt) {
		case 'a': g.addr = optarg; break;
		case 'c': g.conns = atoi(optarg); break;
		case 'p': g.pipeline = atoi(optarg); break;
		case 'd': g.duration = atof(optarg); break;
		case 'k': g.keys = atoi(optarg); break;
		case 'K': g.key_prefix = optarg; break;
		case 'n': g.max_requests = strtoull(optarg, NULL, 10); break;
		case 'r': g.rate = atof(optarg); break;
		case 'R': g.random_keys = true; break;
		case 's': g.seq_keys = true; break;
		case 'i': g.addrs = (uint32_t)strtoul(optarg, NULL, 10); break;
		case 't': g.tier = optarg; break;
		case 'T': g.expire = atof(optarg) / 1e3; break;
		case 'S': seed = strtoul(optarg, NULL, 10); break;
		case 'L': g.release = true; break;
		default:
			fprintf(stderr, "usage: spop-load -a ip:port [-c conns] [-p pipeline] "
					"[-d seconds] [-k keys] [-K prefix] [-n requests] "
					"[-r rate] [-s] [-R] [-i addresses] [-t tier] [-T ms] "
					"[-S seed] [-L]\n");
			return 2;
		}
	}
	if (g.conns < 1 || g.conns > 1024 || g.pipeline < 1 || g.pipeline > MAX_INFLIGHT ||
	    g.keys < 1 || g.duration <= 0 || g.duration > 600 || g.rate < 0 || g.rate > 1e7 ||
	    g.addrs > (1u << 24) || (g.tier && strlen(g.tier) > 64) ||
	    g.expire < 0)
		return 2;
	colon = strrchr(g.addr, ':');
	if (!colon || (size_t)(colon - g.addr) >= sizeof(host))
		return 2;
	memcpy(host, g.addr, (size_t)(colon - g.addr));
	host[colon - g.addr] = 0;
	if (inet_pton(AF_INET, host, &sin.sin_addr) != 1)
		return 2;
	sin.sin_port = htons((uint16_t)atoi(colon + 1));
	conns = calloc((size_t)g.conns, sizeof(*conns));
	if (!conns)
		return 2;
	srand(seed ? (unsigned)seed : 42);
	if (seed) {
		g.rng ^= (uint64_t)seed * 0xbf58476d1ce4e5b9ULL;
		if (!g.rng)
			g.rng = 1;
	}
	for (i = 0; i < g.conns; i++) {
		struct lconn *c = &conns[i];
		uint8_t buf[256];
		struct spop_wbuf w;
		struct spop_data d;
		size_t start;
		int one = 1, n;

		c->fd = socket(AF_INET, SOCK_STREAM, 0);
		if (c->fd < 0 || connect(c->fd, (struct sockaddr *)&sin, sizeof(sin)) < 0) {
			perror("connect");
			return 1;
		}
		setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		c->next_sid = 1;
		spop_wbuf_init(&w, buf, sizeof(buf));
		start = spop_frame_begin(&w, SPOP_FRM_HAPROXY_HELLO, SPOP_FL_FIN, 0, 0);
		d = spop_string("2.0", 3);
		spop_put_kv(&w, "supported-versions", &d);
		d = spop_uint32(16380);
		spop_put_kv(&w, "max-frame-size", &d);
		d = spop_string("pipelining", 10);
		spop_put_kv(&w, "capabilities", &d);
		n = spop_frame_end(&w, start);
		queue(c, buf, (size_t)n);
		ev_io_init(&c->rio, read_cb, c->fd, EV_READ);
		ev_io_init(&c->wio, write_cb, c->fd, EV_WRITE);
		c->rio.data = c->wio.data = c;
		ev_io_start(loop, &c->rio);
		ev_io_start(loop, &c->wio);
	}
	g.start = now_s();
	if (g.rate) {
		/* pacing clock: a tick per request, between 1 ms and 10 ms */
		double iv = 1.0 / g.rate;

		iv = iv < 0.001 ? 0.001 : iv > 0.01 ? 0.01 : iv;
		ev_timer_init(&tick, tick_cb, iv, iv);
	} else {
		ev_timer_init(&tick, tick_cb, 0.01, 0.01);
	}
	tick.data = conns;
	ev_timer_start(loop, &tick);
	ev_run(loop, 0);
	elapsed = now_s() - g.start;
	qsort(g.lat, g.nlat, sizeof(double), cmp_double);
	printf("decisions=%llu seconds=%.2f rate=%.0f allowed=%llu denied=%llu degraded=%llu "
	       "errors=%llu p50_ms=%.3f p90_ms=%.3f p99_ms=%.3f",
	       (unsigned long long)g.acks, elapsed, g.acks / elapsed,
	       (unsigned long long)g.allowed, (unsigned long long)g.denied,
	       (unsigned long long)g.degraded, (unsigned long long)g.errors,
	       g.nlat ? g.lat[g.nlat / 2] * 1e3 : 0, g.nlat ? g.lat[g.nlat * 9 / 10] * 1e3 : 0,
	       g.nlat ? g.lat[g.nlat * 99 / 100] * 1e3 : 0);
	if (g.rate)
		printf(" sent=%llu unanswered=%llu", (unsigned long long)g.sent,
		       (unsigned long long)(g.sent - g.acks));
	if (g.expire)
		printf(" expired=%llu late=%llu", (unsigned long long)g.expired,
		       (unsigned long long)g.late);
	if (g.release)
		printf(" released=%llu release_acks=%llu", (unsigned long long)g.released,
		       (unsigned long long)g.rel_acks);
	printf("\n");
	return g.errors ? 1 : 0;
}
