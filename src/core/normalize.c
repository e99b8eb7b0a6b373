/* SPDX-License-Identifier: MIT */
/*
 * Path normalisation (RFC 3986 section 6.2.2, plus merged slashes), in one
 * pass over the input and a caller-given output buffer:
 *
 *   - the path ends at the first '?' or '#' (query and fragment are not part
 *     of it);
 *   - a percent-encoded unreserved character (ALPHA DIGIT - . _ ~) is decoded,
 *     once (`%2573` stays `%2573`); every other escape, `%2F` included, is
 *     kept as it is: a reserved character is data, not a separator;
 *   - empty segments are dropped (`//` is `/`);
 *   - `.` segments are dropped and `..` removes the segment before it, never
 *     going above the root (`/../a` is `/a`); `%2e` counts as a dot;
 *   - the result always starts with '/', and ends with '/' when the input
 *     did or when its last segment was `.` or `..`.
 *
 * The output is bounded: only its first <cap> bytes are kept. Segments that
 * do not fit are still counted, so a later `..` removes them and not the kept
 * ones: what is kept is exactly the start of the full normalised path, however
 * long the input.
 */
#include "normalize.h"

#include <string.h>

static int hexval(unsigned char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	c |= 0x20;
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

/* RFC 3986 unreserved characters. */
static bool unreserved(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '-' || c == '.' || c == '_' || c == '~';
}

/*
 * The character at <p>[*<i>] of a segment that ends at <end>, an escaped
 * unreserved character decoded; *<i> moves past what was read (1 or 3 bytes).
 */
static unsigned char seg_next(const char *p, size_t end, size_t *i)
{
	unsigned char c = (unsigned char)p[*i];
	int hi, lo;

	if (c == '%' && end - *i >= 3) {
		hi = hexval((unsigned char)p[*i + 1]);
		lo = hexval((unsigned char)p[*i + 2]);
		if (hi >= 0 && lo >= 0 && unreserved((unsigned char)(hi << 4 | lo))) {
			*i += 3;
			return (unsigned char)(hi << 4 | lo);
		}
	}
	(*i)++;
	return c;
}

/* 1 if the non-empty segment <p>[0..<n>) is ".", 2 if "..", once decoded; else 0. */
static int seg_dots(const char *p, size_t n)
{
	size_t i = 0;
	int dots = 0;

	while (i < n)
		if (seg_next(p, n, &i) != '.' || ++dots > 2)
			return 0;
	return dots;
}

/* The length of <out>[0..<n>) up to and including its last '/' (<out>[0] is one). */
static size_t upto_last_slash(const char *out, size_t n)
{
	while (n > 1 && out[n - 1] != '/')
		n--;
	return n;
}

/*
 * Normalises the path <in> (<len> bytes, untrusted, need not start with '/')
 * into <out>, keeping at most its first <cap> bytes (<cap> >= 1). Returns the
 * number of bytes written; *<truncated> tells whether the normalised path was
 * longer than that. Never reads past <in>+<len>, never writes past
 * <out>+<cap>, never allocates; linear in <len>.
 */
size_t norm_path(const char *in, size_t len, char *out, size_t cap, bool *truncated)
{
	size_t end, i = 0, olen = 1;
	size_t over = 0;                /* segments (partly) beyond <cap>, innermost partial */
	bool only_slash = false;        /* over == 1 and only that segment's '/' is missing */
	bool dir = true;                /* the path ends with '/' */

	if (!cap) {
		*truncated = true;
		return 0;
	}
	end = len;
	if (len) {
		const char *q = memchr(in, '?', len), *h = memchr(in, '#', len);

		if (q)
			end = (size_t)(q - in);
		if (h && (size_t)(h - in) < end)
			end = (size_t)(h - in);
	}
	out[0] = '/';
	while (i < end) {
		size_t s, j;
		int dots;

		if (in[i] == '/') {
			dir = true;
			i++;
			continue;
		}
		s = i;
		{
			const char *sl = memchr(in + i, '/', end - i);

			i = sl ? (size_t)(sl - in) : end;
		}
		dots = seg_dots(in + s, i - s);
		if (dots) {
			dir = true;
			if (dots == 1)
				continue;
			/* "..": drop the last segment, a counted one first */
			only_slash = false;
			if (over > 1)
				over--;
			else if (over == 1) {
				olen = upto_last_slash(out, olen);
				over = 0;
			} else if (olen > 1)
				olen = upto_last_slash(out, olen - 1);
			continue;
		}
		dir = false;
		if (over) {
			over++;
			only_slash = false;
			continue;
		}
		/* kept as "<segment>/"; the final '/' goes if the path does not end with one */
		for (j = s; j < i && olen < cap;)
			out[olen++] = (char)seg_next(in, i, &j);
		if (j < i || olen == cap) {
			over = 1;
			only_slash = j == i;
		} else
			out[olen++] = '/';
	}
	if (over == 1 && only_slash && !dir)
		over = 0;               /* the last segment fitted exactly: nothing is missing */
	else if (!over && !dir && olen > 1)
		olen--;
	*truncated = over > 0;
	return olen;
}

static unsigned char ascii_lower(unsigned char c)
{
	return c >= 'A' && c <= 'Z' ? (unsigned char)(c | 0x20) : c;
}

/* True if <s> (<len> bytes) starts with <prefix> (<plen> bytes), ASCII case ignored. */
bool norm_prefix_eq(const char *s, size_t len, const char *prefix, size_t plen)
{
	size_t i;

	if (len < plen)
		return false;
	for (i = 0; i < plen; i++)
		if (ascii_lower((unsigned char)s[i]) != ascii_lower((unsigned char)prefix[i]))
			return false;
	return true;
}
