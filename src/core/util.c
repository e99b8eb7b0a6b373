/* SPDX-License-Identifier: MIT */
#include "util.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static void oom(void)
{
	static const char msg[] = "out of memory\n";

	fputs(msg, stderr);
	abort();
}

void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);

	if (!p)
		oom();
	return p;
}

void *xcalloc(size_t nmemb, size_t n)
{
	void *p = calloc(nmemb ? nmemb : 1, n ? n : 1);

	if (!p)
		oom();
	return p;
}

void *xrealloc(void *p, size_t n)
{
	p = realloc(p, n ? n : 1);
	if (!p)
		oom();
	return p;
}

char *xstrdup(const char *s)
{
	char *p = strdup(s);

	if (!p)
		oom();
	return p;
}

char *xasprintf(const char *fmt, ...)
{
	va_list ap;
	char *p;
	int n;

	va_start(ap, fmt);
	n = vasprintf(&p, fmt, ap);
	va_end(ap);
	if (n < 0)
		oom();
	return p;
}

/*
 * Parses a duration "<integer><unit>" with unit ms, s, m, h or d (a bare
 * integer means seconds) into milliseconds. Returns 0, or -1 for anything
 * else, including zero-free overflow.
 */
int parse_duration_ms(const char *s, uint64_t *ms)
{
	static const struct {
		const char *unit;
		uint64_t mult;
	} units[] = {{"ms", 1}, {"s", 1000}, {"", 1000}, {"m", 60000}, {"h", 3600000},
		     {"d", 86400000}};
	unsigned long long v;
	char *end;
	size_t i;

	if (!s || !isdigit((unsigned char)*s))
		return -1;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno)
		return -1;
	for (i = 0; i < ARRAY_SIZE(units); i++) {
		if (strcmp(end, units[i].unit) == 0) {
			if (v > UINT64_MAX / units[i].mult)
				return -1;
			*ms = v * units[i].mult;
			return 0;
		}
	}
	return -1;
}

/* Writes the lower-case hex of <in> to <out>, which holds 2 * len + 1 bytes. */
void hex_encode(const uint8_t *in, size_t len, char *out)
{
	static const char digits[] = "0123456789abcdef";
	size_t i;

	for (i = 0; i < len; i++) {
		out[2 * i] = digits[in[i] >> 4];
		out[2 * i + 1] = digits[in[i] & 15];
	}
	out[2 * len] = 0;
}

/* Seconds of CLOCK_MONOTONIC: for deadlines and durations, never the wall clock. */
double mono(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Microseconds of real time: calendar-aligned windows need the wall clock. */
int64_t now_us_real(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/*
 * Writes <v> in decimal into <out> (room for 21 bytes: sign, 19 digits, NUL)
 * and returns its length. The hot path formats a dozen numbers per decision:
 * snprintf() was a visible share of the agent's time.
 */
size_t fmt_i64(char *out, int64_t v)
{
	/* "00" to "99": two digits per division */
	static const char pairs[201] =
		"0001020304050607080910111213141516171819"
		"2021222324252627282930313233343536373839"
		"4041424344454647484950515253545556575859"
		"6061626364656667686970717273747576777879"
		"8081828384858687888990919293949596979899";
	char tmp[20];
	uint64_t u = v < 0 ? 0 - (uint64_t)v : (uint64_t)v;
	size_t n = 20, len = 0;

	if (v >= 0 && v < 10) {
		/* most numbers sent are lengths, flags and counts */
		out[0] = (char)('0' + v);
		out[1] = '\0';
		return 1;
	}
	while (u >= 100) {
		unsigned d = (unsigned)(u % 100) * 2;

		u /= 100;
		tmp[--n] = pairs[d + 1];
		tmp[--n] = pairs[d];
	}
	if (u >= 10) {
		tmp[--n] = pairs[u * 2 + 1];
		tmp[--n] = pairs[u * 2];
	} else {
		tmp[--n] = (char)('0' + u);
	}
	if (v < 0)
		out[len++] = '-';
	memcpy(out + len, tmp + n, 20 - n);
	len += 20 - n;
	out[len] = '\0';
	return len;
}

/*
 * Appends <src> to the string of <len> bytes in <dst> (<cap> bytes of room),
 * truncating as snprintf() would, and returns the new length (< cap).
 */
size_t str_cat(char *dst, size_t cap, size_t len, const char *src)
{
	size_t n = strlen(src);

	if (len >= cap)
		return len;
	if (n > cap - 1 - len)
		n = cap - 1 - len;
	memcpy(dst + len, src, n);
	len += n;
	dst[len] = '\0';
	return len;
}

/* 1 when <host> is a numeric IPv4 or IPv6 address (no brackets). */
int host_is_numeric(const char *host)
{
	unsigned char a[sizeof(struct in6_addr)];

	return inet_pton(AF_INET, host, a) == 1 || inet_pton(AF_INET6, host, a) == 1;
}

/*
 * 1 when <name> may be a DNS host name: labels of 1 to 63 letters, digits,
 * '-' or '_' (not at a label's ends for '-'), 253 characters at most.
 */
int host_name_ok(const char *name)
{
	size_t len = strlen(name), label = 0, i;

	if (!len || len > 253)
		return 0;
	for (i = 0; i < len; i++) {
		char c = name[i];

		if (c == '.') {
			if (!label || name[i - 1] == '-')
				return 0;
			label = 0;
			continue;
		}
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      c == '-' || c == '_'))
			return 0;
		if (c == '-' && !label)
			return 0;
		if (++label > 63)
			return 0;
	}
	return name[len - 1] != '-';
}

/*
 * Splits "host:port" or "[host]:port" into <host> (<hostlen> bytes of room)
 * and <port> (1..65535). Returns 0, or -1 if <addr> is no such form; the host
 * itself is the caller's to check (host_is_numeric(), host_name_ok()).
 */
int hostport_split(const char *addr, char *host, size_t hostlen, int *port)
{
	const char *colon = strrchr(addr, ':');
	const char *h = addr;
	size_t hl;
	char *end;
	long p;

	if (!colon || colon == addr)
		return -1;
	p = strtol(colon + 1, &end, 10);
	if (*end || end == colon + 1 || p < 1 || p > 65535)
		return -1;
	hl = (size_t)(colon - addr);
	if (addr[0] == '[') {
		if (hl < 3 || addr[hl - 1] != ']')
			return -1;
		h++;
		hl -= 2;
	}
	if (!hl || hl >= hostlen)
		return -1;
	memcpy(host, h, hl);
	host[hl] = 0;
	*port = (int)p;
	return 0;
}

/*
 * The allocator's view of this process's heap: bytes handed out and not freed
 * (<in_use>, mmapped blocks included) and bytes freed but still held by the
 * allocator (<free_bytes>). Beside the RSS it tells a leak (in use grows) from
 * fragmentation (free grows). Returns -1 where the C library cannot say
 * (glibc before 2.33, other libraries, an AddressSanitizer build).
 */
int heap_usage(uint64_t *in_use, uint64_t *free_bytes)
{
#if defined(__SANITIZE_ADDRESS__)
	/* the sanitizer's allocator serves malloc(): glibc's count says nothing */
	*in_use = *free_bytes = 0;
	return -1;
#elif defined(__GLIBC__) && (__GLIBC__ > 2 || (__GLIBC__ == 2 && __GLIBC_MINOR__ >= 33))
	struct mallinfo2 mi = mallinfo2();

	*in_use = (uint64_t)mi.uordblks + (uint64_t)mi.hblkhd;
	*free_bytes = (uint64_t)mi.fordblks;
	return 0;
#else
	*in_use = *free_bytes = 0;
	return -1;
#endif
}

/* ---- networks ---------------------------------------------------------- */

int ip_net_parse(const char *s, struct ip_net *out, char *err, size_t errlen)
{
	char ip[INET6_ADDRSTRLEN + 1];
	const char *slash = strchr(s, '/');
	size_t iplen = slash ? (size_t)(slash - s) : strlen(s);
	unsigned max, i;
	char *end;

	memset(out, 0, sizeof(*out));
	if (iplen == 0 || iplen >= sizeof(ip))
		goto bad;
	memcpy(ip, s, iplen);
	ip[iplen] = 0;
	if (inet_pton(AF_INET, ip, out->addr) == 1) {
		out->family = AF_INET;
		max = 32;
	} else if (inet_pton(AF_INET6, ip, out->addr) == 1) {
		out->family = AF_INET6;
		max = 128;
	} else {
		goto bad;
	}
	out->bits = max;
	if (slash) {
		unsigned long b;

		if (!isdigit((unsigned char)slash[1]))
			goto bad;
		b = strtoul(slash + 1, &end, 10);
		if (*end || b > max)
			goto bad;
		out->bits = (unsigned)b;
	}
	/* the host bits cleared: 10.1.2.3/8 is 10.0.0.0/8 */
	for (i = out->bits; i < max; i++)
		out->addr[i / 8] &= (unsigned char)~(0x80u >> (i % 8));
	return 0;
bad:
	snprintf(err, errlen, "'%.64s': a network is \"ip\" or \"ip/bits\" (v4 or v6)", s);
	return -1;
}

int ip_net_is_loopback(const struct ip_net *n)
{
	static const unsigned char v6_loop[16] = {[15] = 1};

	if (n->family == AF_INET)
		return n->addr[0] == 127 && n->bits >= 8;
	return n->bits == 128 && memcmp(n->addr, v6_loop, 16) == 0;
}

/* Whether host address <a> lies in network <n>. */
int ip_net_has(const struct ip_net *n, const struct ip_net *a)
{
	unsigned full = n->bits / 8, rest = n->bits % 8;

	if (n->family != a->family || memcmp(n->addr, a->addr, full) != 0)
		return 0;
	return !rest || ((n->addr[full] ^ a->addr[full]) & (0xffu << (8 - rest)) & 0xffu) == 0;
}

