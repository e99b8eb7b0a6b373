/* SPDX-License-Identifier: MIT */
/*
 * `spoa-ratelimit ctl`: the operator's side of live overrides. Reads the
 * agent's configuration file for the Redis address, credentials, key prefix
 * and limits, then talks to Redis directly with blocking hiredis (a command
 * line tool may block). Writes go through small Lua scripts so that a change,
 * the pruning of expired entries, the cap and the version bump are one atomic
 * step; every agent polling the version then applies it (see overrides.c).
 *
 * Entries are validated with the agents' own parser before they are written.
 *
 * `ctl status` needs no Redis: it reads the agent's /status.json on its
 * metrics listener (metrics.listen) and prints it as tables, once or every
 * few seconds (--watch).
 */
#include "ctl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <ev.h>
#include <hiredis/hiredis.h>

#include "config.h"
#include "digest.h"
#include "json.h"
#include "overrides.h"
#include "rconn.h"
#include "secret.h"
#include "store.h"
#include "store_reply.h"
#include "tls.h"
#include "util.h"

#define CTL_TIMEOUT_S   5       /* connect and command timeout */
#define CTL_REDIRECTS   3       /* MOVED redirections followed */
#define CTL_STATUS_MAX  (8U << 20) /* longest /status.json reply read */

/*
 * KEYS[1] the hash; ARGV: field, value, max entries, now (Unix s). Drops the
 * entries whose until has passed, refuses a new entry beyond the cap, sets
 * the field and bumps the version. Returns the new version.
 */
static const char script_add[] =
	"local now = tonumber(ARGV[4])\n"
	"local all = redis.call('HGETALL', KEYS[1])\n"
	"local n = 0\n"
	"for i = 1, #all, 2 do\n"
	"  local f = all[i]\n"
	"  if f ~= 'version' and f ~= ARGV[1] then\n"
	"    local u = tonumber(string.match(all[i + 1], '^until=(%d+)') or\n"
	"                       string.match(all[i + 1], ' until=(%d+)'))\n"
	"    if u and u <= now then\n"
	"      redis.call('HDEL', KEYS[1], f)\n"
	"    else\n"
	"      n = n + 1\n"
	"    end\n"
	"  end\n"
	"end\n"
	"if n >= tonumber(ARGV[3]) then\n"
	"  return redis.error_reply('ERR ' .. n .. ' overrides in force: overrides.max_entries "
	"reached')\n"
	"end\n"
	"redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])\n"
	"return redis.call('HINCRBY', KEYS[1], 'version', 1)\n";

/* KEYS[1] the hash; ARGV the fields to delete. Bumps the version if any was there. */
static const char script_remove[] =
	"local n = redis.call('HDEL', KEYS[1], unpack(ARGV))\n"
	"if n > 0 then redis.call('HINCRBY', KEYS[1], 'version', 1) end\n"
	"return n\n";

struct ctl {
	struct agent_config *cfg;       /* owned */
	struct ctl_conn *rc;            /* owned */
	char key[STORE_KEY_MAX];        /* the overrides hash */
};

static void ctl_usage(FILE *f)
{
	fprintf(f,
		"usage: spoa-ratelimit ctl [-f FILE] COMMAND ...\n"
		"  list                                  overrides in Redis, invalid ones flagged\n"
		"  block TARGET DURATION [OPTIONS]       deny every request of TARGET\n"
		"  limit TARGET DURATION LIMITS [OPTIONS] other limits for TARGET\n"
		"  unblock TARGET | unlimit TARGET       lift one override\n"
		"  remove TARGET                         lift every override of TARGET\n"
		"  remove --field FIELD                  delete one field as listed (bad entries)\n"
		"  (`add block|limit ...` is `block|limit ...`)\n"
		"  status [--watch [SECONDS]] [-n COUNT] [--address IP:PORT]\n"
		"                                        the agent's status page (/status.json)\n"
		"                                        as tables, once or every SECONDS (2)\n"
		"TARGET   key:RAWKEY (hashed here; key:- reads it from stdin), fp:HEX (a key's\n"
		"         fingerprint, 16 hex digits, as /top shows), k:HEX (8 to 32 hex digits of\n"
		"         the key's digest: earlier versions' fingerprints), ip:ADDR[/BITS] or ADDR[/BITS]\n"
		"DURATION --for 10m | --until UNIXSECONDS\n"
		"LIMITS   --factor X (every limit of TARGET times X) and/or --rate LIMIT=N ...\n"
		"OPTIONS  --reason TEXT, --by NAME (default $SUDO_USER or $USER), --status 403\n"
		"  -f FILE  the agent's configuration (default "
		"/etc/spoa-ratelimit/spoa-ratelimit.conf)\n");
}

/*
 * A blocking connection for one command at a time: the agent's own transport
 * (rconn: TLS when the configuration has it) on a loop of its own, run until
 * the reply or CTL_TIMEOUT_S.
 */
/* What one reply may be: the configuration's (redis.max_reply_*), set once it is read. */
static struct reply_limits ctl_limits = REPLY_LIMITS_DEFAULT;

struct ctl_conn {
	struct ev_loop *loop;           /* owned */
	struct rconn *rc;               /* owned, NULL once gone */
	int state;                      /* 0 connecting, 1 up, -1 failed */
	bool done;                      /* the reply (or the loss) came */
	redisReply *rep;                /* owned copy of the reply */
	ev_timer timer;
	char err[256];
	char addr[300];                 /* what the messages name */
	bool tls;                       /* over TLS */
	bool has_cert;                  /* ... with a client certificate */
	bool told;                      /* an error was printed: the next ones are not */
	bool answered;                  /* a reply came on this connection */
};

/*
 * Prints "redis ADDR: <what>" once per connection: a lost connection fails
 * every command after it, and one message says it. A TLS alert that a client
 * certificate is required (TLS 1.3: after the handshake, at the first read)
 * says what to set.
 */
static void conn_tell(struct ctl_conn *cc, const char *what)
{
	bool nocert = cc->tls && !cc->has_cert;
	bool cert = nocert && (strstr(what, "certificate required") ||
			       strstr(what, "handshake failure"));
	/* TLS 1.3: the server's alert may be lost to the reset that follows it */
	bool hung_up = nocert && !cc->answered && (strstr(what, "reset by peer") ||
						   strstr(what, "closed the connection"));

	if (cc->told)
		return;
	cc->told = true;
	fprintf(stderr, "redis %s: %s%s\n", cc->addr, what,
		cert ? ": the server requires a client certificate: set redis.tls.cert_file and "
		       "redis.tls.key_file"
		: hung_up ? ": the server hung up after the TLS handshake: if it requires a client "
			    "certificate, set redis.tls.cert_file and redis.tls.key_file"
			  : "");
}

static redisReply *reply_copy(const redisReply *r)
{
	redisReply *c = xcalloc(1, sizeof(*c));
	size_t i;

	c->type = r->type;
	c->integer = r->integer;
	if (r->str) {
		c->str = xmalloc(r->len + 1);
		memcpy(c->str, r->str, r->len);
		c->str[r->len] = 0;
		c->len = r->len;
	}
	if (r->type == REDIS_REPLY_ARRAY && r->elements) {
		c->element = xcalloc(r->elements, sizeof(*c->element));
		c->elements = r->elements;
		for (i = 0; i < r->elements; i++)
			c->element[i] = r->element[i] ? reply_copy(r->element[i]) : NULL;
	}
	return c;
}

static void conn_up(struct rconn *rc, int status)
{
	struct ctl_conn *cc = rconn_data(rc);

	cc->state = status == 0 ? 1 : -1;
	if (status) {
		snprintf(cc->err, sizeof(cc->err), "%s", rconn_errstr(rc));
		cc->rc = NULL; /* freed on return */
	}
}

static void conn_lost(struct rconn *rc, int status)
{
	struct ctl_conn *cc = rconn_data(rc);

	(void)status;
	snprintf(cc->err, sizeof(cc->err), "%s", rconn_errstr(rc)[0] ? rconn_errstr(rc)
									: "connection lost");
	cc->rc = NULL;
	cc->done = true;
}

static void conn_reply(struct rconn *rc, void *reply, void *priv)
{
	struct ctl_conn *cc = priv;

	(void)rc;
	if (reply) {
		cc->rep = reply_copy(reply);
		cc->answered = true;
	}
	cc->done = true;
}

static void conn_timeout(struct ev_loop *loop, ev_timer *t, int revents)
{
	struct ctl_conn *cc = t->data;

	(void)loop;
	(void)revents;
	snprintf(cc->err, sizeof(cc->err), "timed out");
	cc->state = cc->state ? cc->state : -1;
	cc->done = true;
}

static void conn_free(struct ctl_conn *cc)
{
	if (!cc)
		return;
	rconn_free(cc->rc);
	ev_timer_stop(cc->loop, &cc->timer);
	ev_loop_destroy(cc->loop);
	free(cc);
}

/*
 * Runs the loop until <cc>'s flag <*flag> is set or the deadline passes. What
 * is pending already runs first, without waiting: a write that failed in
 * rconn_flush() is acted on from the loop, and ev_run(EVRUN_ONCE) would run
 * it and then block in the poll until the deadline.
 */
static void conn_wait(struct ctl_conn *cc, const bool *flag, const int *state)
{
	ev_timer_set(&cc->timer, CTL_TIMEOUT_S, 0.);
	ev_timer_start(cc->loop, &cc->timer);
	ev_run(cc->loop, EVRUN_NOWAIT);
	while (flag ? !*flag : *state == 0)
		ev_run(cc->loop, EVRUN_ONCE);
	ev_timer_stop(cc->loop, &cc->timer);
}

/* One command on <cc>: its reply (owned, freeReplyObject()), or NULL with cc->err. */
static redisReply *conn_command(struct ctl_conn *cc, int argc, const char **argv)
{
	redisReply *rep;

	cc->done = false;
	cc->rep = NULL;
	if (!cc->rc) {
		if (!cc->err[0])
			snprintf(cc->err, sizeof(cc->err), "connection lost");
		return NULL;
	}
	if (rconn_command(cc->rc, conn_reply, cc, argc, argv, NULL) != 0) {
		snprintf(cc->err, sizeof(cc->err), "cannot send");
		return NULL;
	}
	rconn_flush(cc->rc);
	conn_wait(cc, &cc->done, NULL);
	rep = cc->rep;
	cc->rep = NULL;
	if (!rep && cc->rc) { /* timed out: the connection cannot be trusted any more */
		rconn_free(cc->rc);
		cc->rc = NULL;
	}
	return rep;
}

/* "host:port" (a name resolved here: blocking is fine for a command line), "ip:port",
 * "[ip6]:port" or "unix:/path" into <ip> (numeric) and <port>, or <path>. */
static int ctl_addr(const char *addr, char *ip, size_t iplen, int *port, const char **path)
{
	struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *res = NULL;
	char host[256];
	int e;

	*path = NULL;
	if (strncmp(addr, "unix:", 5) == 0) {
		*path = addr + 5;
		return 0;
	}
	if (hostport_split(addr, host, sizeof(host), port) < 0) {
		fprintf(stderr, "redis address '%s': host:port expected\n", addr);
		return -1;
	}
	e = getaddrinfo(host, NULL, &hints, &res);
	if (e || !res) {
		fprintf(stderr, "redis %s: %s\n", addr, e ? gai_strerror(e) : "no address");
		return -1;
	}
	/* copied out: the address is a struct sockaddr, not aligned for the larger ones */
	if (res->ai_family == AF_INET6) {
		struct sockaddr_in6 s6;

		memcpy(&s6, res->ai_addr, sizeof(s6));
		inet_ntop(AF_INET6, &s6.sin6_addr, ip, (socklen_t)iplen);
	} else {
		struct sockaddr_in s4;

		memcpy(&s4, res->ai_addr, sizeof(s4));
		inet_ntop(AF_INET, &s4.sin_addr, ip, (socklen_t)iplen);
	}
	freeaddrinfo(res);
	return 0;
}

/* Connects to <addr> (with <tls> or in clear) and AUTHs; NULL (printed) on failure. */
static struct ctl_conn *ctl_connect(const char *addr, const char *user, const char *password,
				    struct tls_ctx *tls)
{
	struct ctl_conn *cc;
	char ip[INET6_ADDRSTRLEN], host[256], err[256];
	const char *path;
	int port = 0;
	redisReply *rep;

	if (ctl_addr(addr, ip, sizeof(ip), &port, &path) < 0)
		return NULL;
	cc = xcalloc(1, sizeof(*cc));
	snprintf(cc->addr, sizeof(cc->addr), "%s", addr);
	cc->tls = tls != NULL;
	cc->has_cert = tls && tls_ctx_has_cert(tls);
	cc->loop = ev_loop_new(EVFLAG_AUTO);
	ev_timer_init(&cc->timer, conn_timeout, 0., 0.);
	cc->timer.data = cc;
	{
		struct rconn_opts o = {.loop = cc->loop, .data = cc, .limits = &ctl_limits,
				       .on_connect = conn_up,
				       .on_disconnect = conn_lost, .tls = tls};

		if (!path && hostport_split(addr, host, sizeof(host), &port) == 0 &&
		    !host_is_numeric(host))
			o.server_name = host;
		cc->rc = rconn_connect(&o, path ? NULL : ip, port, path, err, sizeof(err));
		if (!cc->rc) {
			conn_tell(cc, err);
			conn_free(cc);
			return NULL;
		}
	}
	conn_wait(cc, NULL, &cc->state);
	if (cc->state != 1) {
		conn_tell(cc, cc->err);
		conn_free(cc);
		return NULL;
	}
	/* AUTH, or a PING: a server that refuses us after the handshake (TLS 1.3
	 * checks the client's certificate then) says so here, once */
	if (password) {
		const char *argv[3] = {"AUTH", user ? user : password, password};

		rep = conn_command(cc, user ? 3 : 2, argv);
	} else {
		const char *argv[1] = {"PING"};

		rep = conn_command(cc, 1, argv);
	}
	if (!rep || rep->type == REDIS_REPLY_ERROR) {
		char what[300];

		snprintf(what, sizeof(what), "%s%s", password ? "AUTH: " : "",
			 rep ? rep->str : cc->err);
		conn_tell(cc, what);
		freeReplyObject(rep);
		conn_free(cc);
		return NULL;
	}
	freeReplyObject(rep);
	return cc;
}

/*
 * Where the overrides live: redis.address, or under Sentinel the master the
 * first Sentinel that knows it names ("ip:port" into <out>). -1 (printed) when
 * none does.
 */
static int ctl_master(const struct agent_config *cfg, char *out, size_t outlen)
{
	size_t i;

	if (!cfg->redis.nsentinels) {
		snprintf(out, outlen, "%s", cfg->redis.address);
		return 0;
	}
	for (i = 0; i < cfg->redis.nsentinels; i++) {
		struct ctl_conn *rc = ctl_connect(cfg->redis.sentinels[i], cfg->redis.sentinel_user,
						  cfg->redis.sentinel_password,
						  cfg->redis.sentinel_tls);
		const char *argv[3] = {"SENTINEL", "get-master-addr-by-name",
				       cfg->redis.sentinel_master};
		redisReply *rep = rc ? conn_command(rc, 3, argv) : NULL;
		bool ok = rep && rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
			  rep->element[0]->type == REDIS_REPLY_STRING &&
			  rep->element[1]->type == REDIS_REPLY_STRING;

		if (ok)
			snprintf(out, outlen, strchr(rep->element[0]->str, ':') ? "[%s]:%s" : "%s:%s",
				 rep->element[0]->str, rep->element[1]->str);
		else if (rc)
			fprintf(stderr, "sentinel %s: %s\n", cfg->redis.sentinels[i],
				rep && rep->type == REDIS_REPLY_ERROR ? rep->str
				: rep ? "does not know the master" : rc->err);
		freeReplyObject(rep);
		conn_free(rc);
		if (ok)
			return 0;
	}
	fprintf(stderr, "no Sentinel named the master '%s'\n", cfg->redis.sentinel_master);
	return -1;
}

/*
 * Runs one command (argv form: bytes never meet a format string), following
 * a MOVED of Redis Cluster to the key's owner. NULL (printed) on a connection
 * error; an error reply is returned for the caller to print.
 */
static redisReply *ctl_run(struct ctl *c, int argc, const char **argv)
{
	int i;

	for (i = 0; i <= CTL_REDIRECTS; i++) {
		redisReply *rep = conn_command(c->rc, argc, argv);
		char addr[300];
		const char *to;

		if (!rep) {
			conn_tell(c->rc, c->rc->err);
			return NULL;
		}
		if (rep->type != REDIS_REPLY_ERROR || strncmp(rep->str, "MOVED ", 6) != 0)
			return rep;
		to = strchr(rep->str + 6, ' ');
		snprintf(addr, sizeof(addr), "%s", to ? to + 1 : "");
		freeReplyObject(rep);
		conn_free(c->rc);
		c->rc = ctl_connect(addr, c->cfg->redis.user, c->cfg->redis.password,
				    c->cfg->redis.tls);
		if (!c->rc)
			return NULL;
	}
	fprintf(stderr, "redis: too many redirections\n");
	return NULL;
}

/* Redis's clock (TIME), so that every entry is timed by one clock; -1 on error. */
static int64_t ctl_time(struct ctl *c)
{
	const char *argv[] = {"TIME"};
	redisReply *rep = ctl_run(c, 1, argv);
	int64_t now = -1;

	if (rep && rep->type == REDIS_REPLY_ARRAY && rep->elements == 2 &&
	    rep->element[0]->type == REDIS_REPLY_STRING)
		now = strtoll(rep->element[0]->str, NULL, 10);
	else if (rep)
		fprintf(stderr, "redis: TIME: unexpected reply\n");
	freeReplyObject(rep);
	return now;
}

/*
 * The fingerprints' key for what ctl shows: the fleet's (the configuration's
 * metrics.fingerprint_secret_file), NULL without one (ctl's own random key
 * would show fingerprints no agent shows).
 */
static const struct fp_key *ctl_fp(const struct ctl *c)
{
	return c->cfg->fp_random ? NULL : &c->cfg->fp;
}

/*
 * Parses the TARGET argument into <t>: key:RAW (digest computed here), fp:HEX,
 * k:HEX, ip:ADDR[/BITS], or a bare address. Returns 0, or -1 (printed).
 */
static int ctl_target(const char *arg, struct ovr_target *t)
{
	char err[160], buf[OVR_FIELD_MAX + 4];

	if (strncmp(arg, "key:", 4) == 0) {
		uint8_t md[SHA256_LEN];
		char line[4096];
		const char *raw = arg + 4;
		size_t len = strlen(raw);

		if (strcmp(raw, "-") == 0) {
			if (!fgets(line, sizeof(line), stdin)) {
				fprintf(stderr, "key:-: no key on standard input\n");
				return -1;
			}
			len = strcspn(line, "\r\n");
			line[len] = 0;
			raw = line;
		}
		if (!len) {
			fprintf(stderr, "key: an empty key is an anonymous client, not a key\n");
			return -1;
		}
		sha256(raw, len, md);
		memset(t, 0, sizeof(*t));
		t->type = OVR_T_KEY;
		t->bits = 128;
		memcpy(t->b, md, 16);
		return 0;
	}
	if (strncmp(arg, "k:", 2) == 0 || strncmp(arg, "ip:", 3) == 0 ||
	    strncmp(arg, "fp:", 3) == 0)
		snprintf(buf, sizeof(buf), "%s", arg);
	else
		snprintf(buf, sizeof(buf), "ip:%s", arg);
	if (ovr_target_parse(buf, strlen(buf), t, err, sizeof(err)) < 0) {
		fprintf(stderr, "target '%s': %s\n", arg, err);
		return -1;
	}
	return 0;
}

/* The operator's name for by=: $SUDO_USER, $USER or $LOGNAME, if it is one word. */
static const char *default_by(void)
{
	static const char *const vars[] = {"SUDO_USER", "USER", "LOGNAME"};
	size_t i;

	for (i = 0; i < ARRAY_SIZE(vars); i++) {
		const char *v = getenv(vars[i]);
		const char *p;

		if (!v || !*v || strlen(v) > OVR_BY_MAX)
			continue;
		for (p = v; *p > 0x20 && *p < 0x7f; p++)
			;
		if (!*p)
			return v;
	}
	return NULL;
}

static bool known_limit(const struct agent_config *cfg, const char *name)
{
	size_t i;

	for (i = 0; i < cfg->nlimits; i++)
		if (strcmp(cfg->limits[i].name, name) == 0)
			return true;
	return false;
}

/* block|limit TARGET options...: writes one entry. */
/* What `ctl block` and `ctl limit` were told besides the target (ctl_add()). */
struct add_opts {
	const char *reason, *by;
	int64_t until, dur_ms, status;
};

/* One option --<opt> <val> of `ctl block`/`limit` into <o> and <e>: 0, or an exit status. */
static int ctl_add_option(struct ctl *c, int kind, const char *opt, const char *val,
			  struct add_opts *o, struct ovr_entry *e)
{
	uint64_t ms;
	char *end;

	if (strcmp(opt, "--for") == 0) {
		if (parse_duration_ms(val, &ms) < 0 || ms < 1000 || ms > 366ULL * 86400000) {
			fprintf(stderr, "--for %s: a duration from 1s to 366d (\"90s\", \"10m\", "
					"\"2h\", \"1d\")\n", val);
			return 2;
		}
		o->dur_ms = (int64_t)ms;
	} else if (strcmp(opt, "--until") == 0) {
		errno = 0;
		o->until = strtoll(val, &end, 10);
		if (*end || errno || o->until <= 0) {
			fprintf(stderr, "--until %s: Unix seconds expected\n", val);
			return 2;
		}
	} else if (strcmp(opt, "--reason") == 0) {
		o->reason = val;
	} else if (strcmp(opt, "--by") == 0) {
		o->by = val;
	} else if (strcmp(opt, "--status") == 0 && kind == OVR_BLOCK) {
		o->status = strtoll(val, &end, 10);
		if (*end || o->status < 400 || o->status > 599) {
			fprintf(stderr, "--status %s: an HTTP status from 400 to 599\n", val);
			return 2;
		}
	} else if (strcmp(opt, "--factor") == 0 && kind == OVR_LIMIT) {
		e->factor = strtod(val, &end);
		if (*end || !(e->factor >= 1 / OVR_FACTOR_MAX && e->factor <= OVR_FACTOR_MAX)) {
			fprintf(stderr, "--factor %s: a number from 0.001 to 1000\n", val);
			return 2;
		}
	} else if (strcmp(opt, "--rate") == 0 && kind == OVR_LIMIT) {
		const char *eq = strchr(val, '=');

		if (!eq || eq == val || (size_t)(eq - val) > OVR_NAME_MAX ||
		    e->nrates == OVR_RATES_MAX) {
			fprintf(stderr, "--rate %s: LIMIT=N, at most %d of them\n", val,
				OVR_RATES_MAX);
			return 2;
		}
		snprintf(e->rates[e->nrates].name, sizeof(e->rates[0].name), "%.*s",
			 (int)(eq - val), val);
		if (!known_limit(c->cfg, e->rates[e->nrates].name)) {
			fprintf(stderr, "--rate %s: no limit '%s' in %s\n", val,
				e->rates[e->nrates].name, c->cfg->file);
			return 1;
		}
		e->rates[e->nrates++].rate = strtoull(eq + 1, &end, 10);
		if (*end || eq[1] < '0' || eq[1] > '9') {
			fprintf(stderr, "--rate %s: N is a number of requests per period\n", val);
			return 2;
		}
	} else {
		fprintf(stderr, "unknown option '%s' for %s\n", opt,
			kind == OVR_BLOCK ? "block" : "limit");
		return 2;
	}
	return 0;
}

/* The hash value of entry <e> created at <now> with options <o>, into <value>. */
static void ctl_add_value(const struct ovr_entry *e, const struct add_opts *o, int64_t now,
			  char *value, size_t len)
{
	size_t used;
	size_t i;

	used = (size_t)snprintf(value, len, "until=%lld created=%lld", (long long)o->until,
				(long long)now);
	if (o->by)
		used += (size_t)snprintf(value + used, len - used, " by=%s", o->by);
	if (o->status)
		used += (size_t)snprintf(value + used, len - used, " status=%lld",
					 (long long)o->status);
	if (e->factor)
		used += (size_t)snprintf(value + used, len - used, " factor=%.6g", e->factor);
	for (i = 0; i < e->nrates; i++)
		used += (size_t)snprintf(value + used, len - used, " rate.%s=%llu",
					 e->rates[i].name, (unsigned long long)e->rates[i].rate);
	if (o->reason && used < len)
		snprintf(value + used, len - used, " reason=%s", o->reason);
}

static int ctl_add(struct ctl *c, int kind, int argc, char **argv)
{
	struct ovr_entry e;
	struct add_opts o = {.by = default_by(), .dur_ms = -1};
	char field[OVR_FIELD_MAX + 8], value[OVR_VALUE_MAX + 64], err[160], num[24], what[256];
	int64_t now;
	int i, ret;

	memset(&e, 0, sizeof(e));
	e.kind = (uint8_t)kind;
	if (argc < 1 || ctl_target(argv[0], &e.t) < 0)
		return argc < 1 ? 2 : 1;
	for (i = 1; i < argc; i += 2) {
		if (i + 1 >= argc) {
			fprintf(stderr, "%s: a value is missing\n", argv[i]);
			return 2;
		}
		ret = ctl_add_option(c, kind, argv[i], argv[i + 1], &o, &e);
		if (ret)
			return ret;
	}
	if ((o.dur_ms < 0) == !o.until) {
		fprintf(stderr, "give one of --for DURATION or --until UNIXSECONDS\n");
		return 2;
	}
	if (kind == OVR_LIMIT && !e.factor && !e.nrates) {
		fprintf(stderr, "limit: give --factor X and/or --rate LIMIT=N\n");
		return 2;
	}
	now = ctl_time(c);
	if (now < 0)
		return 1;
	if (o.dur_ms >= 0)
		o.until = now + (o.dur_ms + 999) / 1000;
	if (o.until <= now) {
		fprintf(stderr, "--until %lld: that is in the past (Redis time %lld)\n",
			(long long)o.until, (long long)now);
		return 2;
	}
	ctl_add_value(&e, &o, now, value, sizeof(value));
	/* what the agents will read: checked with their parser */
	ovr_field_format(&e, field, sizeof(field));
	if (ovr_value_parse(value, strlen(value), &e, err, sizeof(err)) < 0) {
		fprintf(stderr, "not written: %s\n", err);
		return 2;
	}
	{
		const char *av[] = {"EVAL", script_add, "1", c->key, field, value, num, NULL};
		char nows[24];
		redisReply *rep;

		snprintf(num, sizeof(num), "%u", c->cfg->overrides.max_entries);
		snprintf(nows, sizeof(nows), "%lld", (long long)now);
		av[7] = nows;
		rep = ctl_run(c, 8, av);
		if (!rep)
			return 1;
		if (rep->type != REDIS_REPLY_INTEGER) {
			fprintf(stderr, "redis: %s\n",
				rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
			freeReplyObject(rep);
			return 1;
		}
		ovr_describe(&e, what, sizeof(what));
		ovr_target_show(&e.t, ctl_fp(c), field, sizeof(field));
		printf("%s:%s: %s until %lld (%lld s), version %lld\n",
		       e.kind == OVR_BLOCK ? "block" : "limit", field, what, (long long)o.until,
		       (long long)(o.until - now), (long long)rep->integer);
		freeReplyObject(rep);
	}
	return 0;
}

/* Reads the whole hash; NULL (printed) on error. */
static redisReply *ctl_all(struct ctl *c)
{
	const char *av[] = {"HGETALL", c->key};
	redisReply *rep = ctl_run(c, 2, av);

	if (rep && rep->type != REDIS_REPLY_ARRAY) {
		fprintf(stderr, "redis: HGETALL %s: %s\n", c->key,
			rep->type == REDIS_REPLY_ERROR ? rep->str : "not a hash");
		freeReplyObject(rep);
		return NULL;
	}
	return rep;
}

static int ctl_list(struct ctl *c)
{
	redisReply *rep = ctl_all(c);
	int64_t now = rep ? ctl_time(c) : -1;
	size_t i;

	if (!rep || now < 0) {
		freeReplyObject(rep);
		return 1;
	}
	printf("%-6s %-44s %-20s %8s  %-12s %-24s %s\n", "KIND", "TARGET", "UNTIL (UTC)", "LEFT",
	       "BY", "WHAT", "REASON");
	for (i = 0; i + 1 < rep->elements; i += 2) {
		const redisReply *f = rep->element[i], *v = rep->element[i + 1];
		struct ovr_entry e;
		char err[160], t[OVR_FIELD_MAX], what[256], when[32];
		struct tm tm;
		time_t u;

		if (f->type != REDIS_REPLY_STRING || v->type != REDIS_REPLY_STRING)
			continue;
		if (f->len == 7 && memcmp(f->str, "version", 7) == 0) {
			printf("# version %.*s\n", (int)v->len, v->str);
			continue;
		}
		memset(&e, 0, sizeof(e));
		if (ovr_field_parse(f->str, f->len, &e, err, sizeof(err)) < 0 ||
		    ovr_value_parse(v->str, v->len, &e, err, sizeof(err)) < 0) {
			printf("INVALID field '%.*s': %s (agents skip it; remove --field to delete)\n",
			       (int)(f->len > 200 ? 200 : f->len), f->str, err);
			continue;
		}
		u = (time_t)e.until;
		if (!gmtime_r(&u, &tm) || !strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm))
			snprintf(when, sizeof(when), "%lld", (long long)e.until);
		ovr_target_show(&e.t, ctl_fp(c), t, sizeof(t));
		ovr_describe(&e, what, sizeof(what));
		printf("%-6s %-44s %-20s %8s  %-12s %-24s %s\n", e.kind == OVR_BLOCK ? "block" : "limit",
		       t, when,
		       e.until > now ? (snprintf(err, sizeof(err), "%llds", (long long)(e.until - now)),
					err)
				     : "expired",
		       e.by[0] ? e.by : "-", what, e.reason);
	}
	freeReplyObject(rep);
	return 0;
}

/*
 * remove [--field FIELD | TARGET] with <kind> (-1: every kind): deletes the
 * fields naming that target, whatever their spelling.
 */
static int ctl_remove(struct ctl *c, int kind, int argc, char **argv)
{
	const char **av;
	redisReply *rep, *all;
	struct ovr_target t;
	size_t i, n = 3;
	int ret = 0;

	if (argc == 2 && strcmp(argv[0], "--field") == 0 && kind < 0) {
		const char *one[] = {"EVAL", script_remove, "1", c->key, argv[1]};

		rep = ctl_run(c, 5, one);
		goto done;
	}
	if (argc != 1) {
		ctl_usage(stderr);
		return 2;
	}
	if (ctl_target(argv[0], &t) < 0)
		return 1;
	all = ctl_all(c);
	if (!all)
		return 1;
	av = xcalloc(4 + all->elements / 2 + 2, sizeof(*av));
	av[0] = "EVAL";
	av[1] = script_remove;
	av[2] = "1";
	av[3] = c->key;
	n = 4;
	for (i = 0; i + 1 < all->elements; i += 2) {
		const redisReply *f = all->element[i];
		struct ovr_entry e;
		char err[160];

		memset(&e, 0, sizeof(e));
		if (f->type != REDIS_REPLY_STRING || ovr_field_parse(f->str, f->len, &e, err, sizeof(err)) < 0)
			continue;
		/* fp:HEX also names the blocks by raw key it is the fingerprint of */
		if ((kind < 0 || e.kind == kind) && ovr_target_same_key(&e.t, &t, ctl_fp(c)))
			av[n++] = f->str;
	}
	if (n == 4) {
		char ts[OVR_FIELD_MAX];

		ovr_target_show(&t, ctl_fp(c), ts, sizeof(ts));
		printf("nothing to remove for %s\n", ts);
		freeReplyObject(all);
		free(av);
		return 0;
	}
	rep = ctl_run(c, (int)n, av);
	freeReplyObject(all);
	free(av);
done:
	if (!rep)
		return 1;
	if (rep->type == REDIS_REPLY_INTEGER) {
		printf("removed %lld entr%s\n", (long long)rep->integer,
		       rep->integer == 1 ? "y" : "ies");
	} else {
		fprintf(stderr, "redis: %s\n", rep->type == REDIS_REPLY_ERROR ? rep->str : "unexpected reply");
		ret = 1;
	}
	freeReplyObject(rep);
	return ret;
}

/* ---- status ---------------------------------------------------------------- */

/* The metrics listener's bearer token (metrics.token_file), once the configuration is read. */
static const char *ctl_metrics_token;

/*
 * GETs <path> from the HTTP listener at <addr> ("ip:port" or "[ip6]:port"; a
 * wildcard address means this host), with the listener's token when the
 * configuration has one. Returns the body (to be freed), or NULL with a
 * message printed.
 */
static char *http_get(const char *addr, const char *path, size_t *len)
{
	struct timeval tv = {.tv_sec = CTL_TIMEOUT_S};
	struct sockaddr_storage ss;
	char host[INET6_ADDRSTRLEN + 1], req[256 + SECRET_MAX], *buf = NULL, *body;
	size_t cap = 0, n = 0;
	socklen_t sl;
	int port, fd;

	memset(&ss, 0, sizeof(ss));
	if (hostport_split(addr, host, sizeof(host), &port) < 0) {
		fprintf(stderr, "%s: expected ip:port or [ipv6]:port\n", addr);
		return NULL;
	}
	if (inet_pton(AF_INET, host, &((struct sockaddr_in *)&ss)->sin_addr) == 1) {
		struct sockaddr_in *sin = (struct sockaddr_in *)&ss;

		if (sin->sin_addr.s_addr == htonl(INADDR_ANY))
			sin->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		sin->sin_family = AF_INET;
		sin->sin_port = htons((uint16_t)port);
		sl = sizeof(*sin);
	} else if (inet_pton(AF_INET6, host, &((struct sockaddr_in6 *)&ss)->sin6_addr) == 1) {
		struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;

		if (IN6_IS_ADDR_UNSPECIFIED(&sin6->sin6_addr))
			sin6->sin6_addr = in6addr_loopback;
		sin6->sin6_family = AF_INET6;
		sin6->sin6_port = htons((uint16_t)port);
		sl = sizeof(*sin6);
	} else {
		fprintf(stderr, "%s: not a numeric address\n", addr);
		return NULL;
	}
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
	    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0 ||
	    connect(fd, (struct sockaddr *)&ss, sl) < 0) {
		fprintf(stderr, "%s: %s\n", addr, strerror(errno));
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	/* Host: localhost, a name the listener always accepts (its address may be a wildcard) */
	snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: localhost\r\n%s%s%s"
		 "Connection: close\r\n\r\n", path,
		 ctl_metrics_token ? "Authorization: Bearer " : "",
		 ctl_metrics_token ? ctl_metrics_token : "", ctl_metrics_token ? "\r\n" : "");
	if (send(fd, req, strlen(req), MSG_NOSIGNAL) != (ssize_t)strlen(req)) {
		fprintf(stderr, "%s: send: %s\n", addr, strerror(errno));
		close(fd);
		return NULL;
	}
	for (;;) {
		ssize_t r;

		if (n + 1 >= cap) {
			if (cap >= CTL_STATUS_MAX) {
				fprintf(stderr, "%s: reply over %u bytes\n", addr, CTL_STATUS_MAX);
				goto fail;
			}
			cap = cap ? cap * 2 : 65536;
			buf = xrealloc(buf, cap);
		}
		r = recv(fd, buf + n, cap - n - 1, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			fprintf(stderr, "%s: %s\n", addr, strerror(errno));
			goto fail;
		}
		if (r == 0)
			break;
		n += (size_t)r;
	}
	close(fd);
	buf[n] = 0;
	body = strstr(buf, "\r\n\r\n");
	if (strncmp(buf, "HTTP/1.1 200 ", 13) != 0 || !body) {
		fprintf(stderr, "%s%s: %.*s\n", addr, path, (int)strcspn(buf, "\r\n"), buf);
		free(buf);
		return NULL;
	}
	body += 4;
	*len = n - (size_t)(body - buf);
	memmove(buf, body, *len + 1);
	return buf;
fail:
	close(fd);
	free(buf);
	return NULL;
}

/* <v> as a table cell: numbers as the agent wrote them, no control byte from a name. */
static void cell_text(const struct json *v, char *out, size_t len)
{
	char *p;

	if (!v || v->type == JSON_NULL)
		snprintf(out, len, "-");
	else if (v->type == JSON_BOOL)
		snprintf(out, len, "%s", v->b ? "yes" : "no");
	else if (v->type == JSON_NUM)
		snprintf(out, len, "%.15g", v->num);
	else if (v->type == JSON_STR)
		snprintf(out, len, "%s", v->str);
	else
		snprintf(out, len, "(%zu)", v->n);
	for (p = out; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = '?';
}

#define CELL_MAX 160

/* An array of objects as a table, its columns the first row's members. */
static void print_table(FILE *f, const struct json *t)
{
	const struct json *first;
	size_t w[32], i, c, ncols;
	char cell[CELL_MAX];

	fprintf(f, "  %s:", t->key);
	if (!t->n || t->kids[0].type != JSON_OBJ) {
		fprintf(f, " none\n");
		return;
	}
	first = &t->kids[0];
	ncols = first->n < ARRAY_SIZE(w) ? first->n : ARRAY_SIZE(w);
	for (c = 0; c < ncols; c++)
		w[c] = strlen(first->kids[c].key);
	for (i = 0; i < t->n; i++)
		for (c = 0; c < ncols; c++) {
			cell_text(json_get(&t->kids[i], first->kids[c].key), cell, sizeof(cell));
			if (strlen(cell) > w[c])
				w[c] = strlen(cell);
		}
	fprintf(f, "\n   ");
	for (c = 0; c < ncols; c++)
		fprintf(f, " %-*s", (int)w[c], first->kids[c].key);
	fprintf(f, "\n");
	for (i = 0; i < t->n; i++) {
		fprintf(f, "   ");
		for (c = 0; c < ncols; c++) {
			const struct json *v = json_get(&t->kids[i], first->kids[c].key);

			cell_text(v, cell, sizeof(cell));
			fprintf(f, v && v->type == JSON_NUM ? " %*s" : " %-*s", (int)w[c], cell);
		}
		fprintf(f, "\n");
	}
}

/* The history of <key> in <series> as one line of characters, low to high. */
static void print_spark(FILE *f, const struct json *series, const char *key)
{
	static const char levels[] = " .:-=+*#%@";
	double max = 0;
	size_t i;

	for (i = 0; i < series->n; i++) {
		const struct json *v = json_get(&series->kids[i], key);

		if (v && v->type == JSON_NUM && v->num > max)
			max = v->num;
	}
	fprintf(f, "  %-14s|", key);
	for (i = 0; i < series->n; i++) {
		const struct json *v = json_get(&series->kids[i], key);
		double x = v && v->type == JSON_NUM && max > 0 ? v->num / max : 0;

		fputc(levels[(int)(x * (sizeof(levels) - 2) + 0.5)], f);
	}
	fprintf(f, "| max %.15g/s\n", max);
}

/* One panel: "NAME [RED]", its values packed on lines, then its tables. */
static void print_panel(FILE *f, const struct json *p, const struct json *alerts)
{
	const struct json *alert = json_get(alerts, p->key);
	char cell[CELL_MAX], item[CELL_MAX + 80];
	size_t i, col = 0;

	fprintf(f, "\n== %s%s\n", p->key, alert && alert->type == JSON_BOOL && alert->b ? " [RED]"
										      : "");
	for (i = 0; i < p->n; i++) {
		const struct json *v = &p->kids[i];

		if (v->type == JSON_ARR || v->type == JSON_OBJ)
			continue;
		cell_text(v, cell, sizeof(cell));
		snprintf(item, sizeof(item), "%s: %s", v->key, cell);
		if (col && col + strlen(item) + 3 > 100) {
			fprintf(f, "\n");
			col = 0;
		}
		col += (size_t)fprintf(f, "%s%s", col ? "   " : "  ", item);
	}
	if (col)
		fprintf(f, "\n");
	for (i = 0; i < p->n; i++) {
		const struct json *v = &p->kids[i];

		if (v->type != JSON_ARR)
			continue;
		if (strcmp(v->key, "series") == 0) {
			print_spark(f, v, "allowed");
			print_spark(f, v, "denied");
			print_spark(f, v, "degraded");
			continue;
		}
		print_table(f, v);
	}
}

/* What is wrong, as the page's list at the top says it: "  ! WHAT (#PANEL, since HH:MM:SS UTC)". */
static void print_causes(FILE *f, const struct json *cs)
{
	size_t i;

	if (!cs || cs->type != JSON_ARR)
		return;
	for (i = 0; i < cs->n; i++) {
		const struct json *what = json_get(&cs->kids[i], "what");
		const struct json *panel = json_get(&cs->kids[i], "panel");
		const struct json *since = json_get(&cs->kids[i], "since");
		char hms[16] = "";

		if (!what || what->type != JSON_STR)
			continue;
		if (since && since->type == JSON_NUM && since->num > 0) {
			time_t t = (time_t)since->num;
			struct tm tm;

			strftime(hms, sizeof(hms), "%H:%M:%S", gmtime_r(&t, &tm));
		}
		fprintf(f, "  ! %s (#%s%s%s%s)\n", what->str,
			panel && panel->type == JSON_STR ? panel->str : "?", hms[0] ? ", since " : "",
			hms, hms[0] ? " UTC" : "");
	}
}

/* `ctl status`'s exit statuses (doc/operations.md): */
#define CTL_STATUS_FINE      0  /* the agent answered: state "ok" */
#define CTL_STATUS_TROUBLE   1  /* the agent answered: something is wrong (degraded, not ready) */
#define CTL_STATUS_USAGE     2  /* the command line */
#define CTL_STATUS_NO_ANSWER 3  /* no answer, or none that could be read (printed) */

/* Fetches and prints the status once: one of CTL_STATUS_*. */
static int status_once(const char *addr, bool clear)
{
	const struct json *schema, *state, *alerts, *agent, *ver;
	char err[128];
	struct json *j;
	size_t len, i;
	bool ok;
	char *body = http_get(addr, "/status.json", &len);

	if (!body)
		return CTL_STATUS_NO_ANSWER;
	j = json_parse(body, len, err, sizeof(err));
	free(body);
	if (!j) {
		fprintf(stderr, "%s/status.json: %s\n", addr, err);
		return CTL_STATUS_NO_ANSWER;
	}
	schema = json_get(j, "schema");
	if (!schema || schema->type != JSON_NUM || schema->num != 1) {
		fprintf(stderr, "%s/status.json: not schema 1 (a newer agent?)\n", addr);
		json_free(j);
		return CTL_STATUS_NO_ANSWER;
	}
	state = json_get(j, "state");
	alerts = json_get(j, "alerts");
	agent = json_get(j, "agent");
	ver = json_get(agent, "version");
	if (clear)
		fputs("\033[H\033[2J", stdout);
	printf("spoa-ratelimit %s at %s: %s\n", ver && ver->type == JSON_STR ? ver->str : "?", addr,
	       state && state->type == JSON_STR ? state->str : "?");
	print_causes(stdout, json_get(j, "causes"));
	for (i = 0; i < j->n; i++)
		if (j->kids[i].type == JSON_OBJ && strcmp(j->kids[i].key, "alerts") != 0)
			print_panel(stdout, &j->kids[i], alerts);
	fflush(stdout);
	ok = state && state->type == JSON_STR && strcmp(state->str, "ok") == 0;
	json_free(j);
	return ok ? CTL_STATUS_FINE : CTL_STATUS_TROUBLE;
}

/*
 * `ctl status [--watch [SECONDS]] [-n COUNT] [--address IP:PORT]`: the
 * status of the agent whose metrics listener is <cfg>'s (or --address).
 */
static int ctl_status(const struct agent_config *cfg, int argc, char **argv)
{
	const char *addr = cfg ? cfg->metrics_listen : NULL;
	double every = 0;
	long count = -1, done;
	int i, ret = 0;
	time_t down_since = 0, last_ok = 0;

	for (i = 0; i < argc; i++) {
		char *end;

		if (strcmp(argv[i], "--watch") == 0) {
			every = 2;
			if (i + 1 < argc && argv[i + 1][0] != '-') {
				every = strtod(argv[++i], &end);
				if (*end || !(every >= 0.2 && every <= 3600)) {
					fprintf(stderr, "--watch: seconds from 0.2 to 3600\n");
					return CTL_STATUS_USAGE;
				}
			}
		} else if (strcmp(argv[i], "-n") == 0 && i + 1 < argc) {
			count = strtol(argv[++i], &end, 10);
			if (*end || count < 1) {
				fprintf(stderr, "-n: a count of at least 1\n");
				return CTL_STATUS_USAGE;
			}
		} else if (strcmp(argv[i], "--address") == 0 && i + 1 < argc) {
			addr = argv[++i];
		} else {
			return CTL_STATUS_USAGE;
		}
	}
	if (!addr) {
		fprintf(stderr, "metrics.listen is not set in the configuration (or give "
				"--address IP:PORT)\n");
		return CTL_STATUS_USAGE;
	}
	if (every == 0)
		return status_once(addr, false);
	for (done = 0; count < 0 || done < count; done++) {
		struct timespec ts = {.tv_sec = (time_t)every,
				      .tv_nsec = (long)((every - (double)(time_t)every) * 1e9)};

		if (done)
			nanosleep(&ts, NULL);
		/* an agent that does not answer is said so, since when, and asked again */
		ret = status_once(addr, isatty(STDOUT_FILENO));
		if (ret != CTL_STATUS_NO_ANSWER) {
			last_ok = time(NULL);
			down_since = 0;
		} else {
			char since[16], last[16];
			struct tm tm;

			if (!down_since)
				down_since = time(NULL);
			/* the words and the clock of the status page's own line (#gone) */
			strftime(since, sizeof(since), "%H:%M:%S", gmtime_r(&down_since, &tm));
			if (last_ok)
				strftime(last, sizeof(last), "%H:%M:%S", gmtime_r(&last_ok, &tm));
			printf("agent at %s not answering since %s UTC%s%s%s\n", addr, since,
			       last_ok ? "; its last answer came at " : "", last_ok ? last : "",
			       last_ok ? " UTC" : "");
			fflush(stdout);
		}
	}
	return ret;
}

int ctl_main(int argc, char **argv)
{
	const char *file = "/etc/spoa-ratelimit/spoa-ratelimit.conf", *cmd;
	struct cfg_errors errs = {0};
	struct ctl c = {0};
	char master[300];
	int i = 1, ret, kind = -1, a;
	bool file_given = false;

	while (i < argc && argv[i][0] == '-') {
		if (strcmp(argv[i], "-f") == 0 && i + 1 < argc) {
			file = argv[i + 1];
			file_given = true;
			i += 2;
		} else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
			ctl_usage(stdout);
			return 0;
		} else {
			ctl_usage(stderr);
			return 2;
		}
	}
	if (i >= argc) {
		ctl_usage(stderr);
		return 2;
	}
	cmd = argv[i++];
	if (strcmp(cmd, "add") == 0 || strcmp(cmd, "remove") == 0) {
		if (i < argc && strcmp(argv[i], "block") == 0)
			kind = OVR_BLOCK;
		else if (i < argc && strcmp(argv[i], "limit") == 0)
			kind = OVR_LIMIT;
		if (kind >= 0)
			i++;
		else if (strcmp(cmd, "add") == 0) {
			ctl_usage(stderr);
			return 2;
		}
	} else if (strcmp(cmd, "block") == 0 || strcmp(cmd, "unblock") == 0) {
		kind = OVR_BLOCK;
	} else if (strcmp(cmd, "limit") == 0 || strcmp(cmd, "unlimit") == 0) {
		kind = OVR_LIMIT;
	} else if (strcmp(cmd, "list") != 0 && strcmp(cmd, "status") != 0) {
		fprintf(stderr, "unknown command '%s'\n", cmd);
		ctl_usage(stderr);
		return 2;
	}
	/* `status --address` needs no configuration file (one may not read it): none is
	 * read unless -f names one, for its metrics.token_file */
	for (a = i; strcmp(cmd, "status") == 0 && !file_given && a < argc; a++) {
		if (strcmp(argv[a], "--address") == 0) {
			ret = ctl_status(NULL, argc - i, argv + i);
			if (ret == CTL_STATUS_USAGE)
				ctl_usage(stderr);
			return ret;
		}
	}
	if (config_load(file, &c.cfg, &errs) < 0) {
		size_t k;

		for (k = 0; k < errs.n; k++)
			fprintf(stderr, "%s\n", errs.msgs[k]);
		cfg_errors_release(&errs);
		/* status: 1 would say the agent is in trouble; the configuration is */
		return strcmp(cmd, "status") == 0 ? CTL_STATUS_USAGE : 1;
	}
	config_reply_limits(c.cfg, &ctl_limits);
	ctl_metrics_token = c.cfg->metrics_token;
	if (strcmp(cmd, "status") == 0) {
		ret = ctl_status(c.cfg, argc - i, argv + i);
		if (ret == 2)
			ctl_usage(stderr);
		config_free(c.cfg);
		return ret;
	}
	if (c.cfg->store != STORE_KIND_REDIS) {
		fprintf(stderr, "%s: overrides need store \"redis\"\n", file);
		config_free(c.cfg);
		return 1;
	}
	ovr_hash_key(c.cfg->redis.key_prefix, c.key, sizeof(c.key));
	c.rc = ctl_master(c.cfg, master, sizeof(master)) < 0
		       ? NULL : ctl_connect(master, c.cfg->redis.user, c.cfg->redis.password,
					    c.cfg->redis.tls);
	if (!c.rc) {
		config_free(c.cfg);
		return 1;
	}
	if (strcmp(cmd, "list") == 0)
		ret = i == argc ? ctl_list(&c) : 2;
	else if (strcmp(cmd, "add") == 0 || strcmp(cmd, "block") == 0 || strcmp(cmd, "limit") == 0)
		ret = ctl_add(&c, kind, argc - i, argv + i);
	else
		ret = ctl_remove(&c, kind, argc - i, argv + i);
	if (ret == 2)
		ctl_usage(stderr);
	conn_free(c.rc);
	config_free(c.cfg);
	return ret;
}
