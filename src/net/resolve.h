/* SPDX-License-Identifier: MIT */
/*
 * Host names resolved on the event loop, never blocking it (c-ares).
 */
#ifndef SPOA_RATELIMIT_RESOLVE_H
#define SPOA_RATELIMIT_RESOLVE_H

#include <netinet/in.h>
#include <stddef.h>

#include <ev.h>

#define RESOLVE_MAX_ADDRS 8             /* addresses kept per name */
#define RESOLVE_TTL_MIN_S 1             /* a record's TTL is taken as at least ... */
#define RESOLVE_TTL_MAX_S 300           /* ... and at most this (0 would mean every connect) */

struct resolver_opts {
	const char *nameservers;        /* "ip[:port],..." or NULL: /etc/resolv.conf */
	unsigned timeout_ms;            /* per try and server; 0: c-ares' default */
	unsigned tries;                 /* 0: c-ares' default */
};

struct resolve_result {
	int ok;                         /* 1: at least one address */
	const char *error;              /* why not, when !ok */
	unsigned naddrs;
	char addrs[RESOLVE_MAX_ADDRS][INET6_ADDRSTRLEN]; /* numeric, in the order given */
	unsigned ttl_s;                 /* the lowest TTL, within the bounds above */
};

/* Called once per lookup, never from within resolver_lookup(). */
typedef void resolve_fn(void *arg, const struct resolve_result *res);

struct resolver;
struct resolve_req;

struct resolver *resolver_new(struct ev_loop *loop, const struct resolver_opts *o,
			      char *err, size_t errlen);
void resolver_free(struct resolver *r);
struct resolve_req *resolver_lookup(struct resolver *r, const char *name, resolve_fn *cb,
				    void *arg);
void resolve_cancel(struct resolve_req *q);

#endif
