/* SPDX-License-Identifier: MIT */
/*
 * libspoa: the server: listeners, accepting, limits on connections, stats, teardown.
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
