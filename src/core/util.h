/* SPDX-License-Identifier: MIT */
/* Allocation wrappers that abort on OOM, small parsing helpers, the clocks. */
#ifndef AGENT_UTIL_H
#define AGENT_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "compiler.h"

void *xmalloc(size_t n);
void *xcalloc(size_t nmemb, size_t n);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xasprintf(const char *fmt, ...) PRINTF(1, 2);

int parse_duration_ms(const char *s, uint64_t *ms) MUSTCHECK;
void hex_encode(const uint8_t *in, size_t len, char *out);
double mono(void);
int64_t now_us_real(void);
size_t fmt_i64(char *out, int64_t v);
size_t str_cat(char *dst, size_t cap, size_t len, const char *src);
int host_is_numeric(const char *host);
int host_name_ok(const char *name);
int hostport_split(const char *addr, char *host, size_t hostlen, int *port);
int heap_usage(uint64_t *in_use, uint64_t *free_bytes);

/* A network, "ip" or "ip/bits" (v4 or v6; an address alone has every bit). */
struct ip_net {
	int family;                     /* AF_INET or AF_INET6 */
	unsigned char addr[16];
	unsigned bits;
};
/* 0, or -1 with why in <err> (NULL: not said). The host bits are cleared. */
int ip_net_parse(const char *s, struct ip_net *out, char *err, size_t errlen);
int ip_net_is_loopback(const struct ip_net *n);
/* Whether the address <a> (every bit) lies in the network <n>. */
int ip_net_has(const struct ip_net *n, const struct ip_net *a);

#define FREE_AND_NULL(p)                                                                    \
	do {                                                                                \
		free(p);                                                                    \
		(p) = NULL;                                                                 \
	} while (0)

#endif /* AGENT_UTIL_H */
