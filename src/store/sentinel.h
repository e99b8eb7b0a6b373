/* SPDX-License-Identifier: MIT */
/*
 * Redis Sentinel client: where the master of a name is, and when it moves.
 */
#ifndef SPOA_RATELIMIT_SENTINEL_H
#define SPOA_RATELIMIT_SENTINEL_H

#include <stddef.h>

#include <ev.h>

#define SENTINEL_MAX 16                 /* Sentinels one agent asks */

struct sentinel_opts {
	const char *const *addrs;       /* "host:port" / "ip:port" / "[ip6]:port", <naddrs> */
	size_t naddrs;
	const char *master;             /* the name the Sentinels monitor */
	const char *user;               /* the Sentinels' AUTH, or NULL */
	const char *password;
	unsigned timeout_ms;            /* one Sentinel's connect + answer */
	struct tls_ctx *tls;            /* TLS to the Sentinels, or NULL (a reference is taken) */
	const struct resolver_opts *resolver; /* for names (nameservers kept by reference), or NULL */
	const struct reply_limits *limits; /* what one reply may be (copied), NULL: defaults */
};

/* The master's address, or <err> (then ip is NULL); <name>: the host name the Sentinel
 * answered (resolve-hostnames yes), which a TLS certificate must carry, or NULL. */
typedef void sentinel_addr_fn(void *arg, const char *ip, int port, const char *name,
			      const char *err);
/* A Sentinel announced +switch-master for our name: the new master's address. */
typedef void sentinel_switch_fn(void *arg, const char *ip, int port);

struct sentinel;
struct tls_ctx;
struct resolver_opts;

struct sentinel *sentinel_new(struct ev_loop *loop, const struct sentinel_opts *o,
			      sentinel_switch_fn *on_switch, void *arg);
void sentinel_free(struct sentinel *sn);
void sentinel_locate(struct sentinel *sn, sentinel_addr_fn *cb, void *arg);
void sentinel_cancel(struct sentinel *sn);
void sentinel_set_tls(struct sentinel *sn, struct tls_ctx *tls);

#endif
