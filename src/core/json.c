/* SPDX-License-Identifier: MIT */
/*
 * A small recursive-descent JSON reader (see json.h). Strings are decoded to
 * UTF-8 (\u escapes and surrogate pairs; a lone surrogate becomes U+FFFD),
 * numbers with strtod() on a copy of their validated text.
 */
#include "json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

/* Where the reader is in the text, and where its first error goes. */
struct reader {
	const char *p, *end, *start;    /* ref: the text, <p> the next byte */
	char *err;                      /* ref: the caller's message buffer */
	size_t errlen;
	bool failed;                    /* <err> holds the first error */
};

static void fail(struct reader *rd, const char *what)
{
	if (!rd->failed)
		snprintf(rd->err, rd->errlen, "%s at offset %zu", what, (size_t)(rd->p - rd->start));
	rd->failed = true;
}

static void skip_ws(struct reader *rd)
{
	while (rd->p < rd->end &&
	       (*rd->p == ' ' || *rd->p == '\t' || *rd->p == '\n' || *rd->p == '\r'))
		rd->p++;
}

static bool literal(struct reader *rd, const char *word)
{
	size_t n = strlen(word);

	if ((size_t)(rd->end - rd->p) < n || memcmp(rd->p, word, n) != 0)
		return false;
	rd->p += n;
	return true;
}

static int hex4(const char *p)
{
	int v = 0, i;

	for (i = 0; i < 4; i++) {
		char c = p[i];

		v <<= 4;
		if (c >= '0' && c <= '9')
			v |= c - '0';
		else if (c >= 'a' && c <= 'f')
			v |= c - 'a' + 10;
		else if (c >= 'A' && c <= 'F')
			v |= c - 'A' + 10;
		else
			return -1;
	}
	return v;
}

static size_t put_utf8(char *o, unsigned cp)
{
	if (cp < 0x80) {
		o[0] = (char)cp;
		return 1;
	}
	if (cp < 0x800) {
		o[0] = (char)(0xc0 | cp >> 6);
		o[1] = (char)(0x80 | (cp & 0x3f));
		return 2;
	}
	if (cp < 0x10000) {
		o[0] = (char)(0xe0 | cp >> 12);
		o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
		o[2] = (char)(0x80 | (cp & 0x3f));
		return 3;
	}
	o[0] = (char)(0xf0 | cp >> 18);
	o[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
	o[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
	o[3] = (char)(0x80 | (cp & 0x3f));
	return 4;
}

/* Reads a string (rd->p at its opening quote); NULL on error. */
static char *read_string(struct reader *rd)
{
	const char *q = rd->p + 1;
	char *out, *o;

	/* decoded, it is never longer than its text */
	out = xmalloc((size_t)(rd->end - q) + 1);
	o = out;
	while (q < rd->end && *q != '"') {
		unsigned char c = (unsigned char)*q;

		if (c < 0x20) {
			rd->p = q;
			fail(rd, "control character in a string");
			free(out);
			return NULL;
		}
		if (c != '\\') {
			*o++ = (char)c;
			q++;
			continue;
		}
		if (q + 1 >= rd->end)
			break;
		switch (q[1]) {
		case '"': *o++ = '"'; break;
		case '\\': *o++ = '\\'; break;
		case '/': *o++ = '/'; break;
		case 'b': *o++ = '\b'; break;
		case 'f': *o++ = '\f'; break;
		case 'n': *o++ = '\n'; break;
		case 'r': *o++ = '\r'; break;
		case 't': *o++ = '\t'; break;
		case 'u': {
			int cp = rd->end - q >= 6 ? hex4(q + 2) : -1;

			if (cp < 0) {
				rd->p = q;
				fail(rd, "bad \\u escape");
				free(out);
				return NULL;
			}
			q += 4;
			if (cp >= 0xd800 && cp <= 0xdbff && rd->end - q >= 8 && q[2] == '\\' &&
			    q[3] == 'u') {
				int lo = hex4(q + 4);

				if (lo >= 0xdc00 && lo <= 0xdfff) {
					cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
					q += 6;
				}
			}
			if (cp >= 0xd800 && cp <= 0xdfff)
				cp = 0xfffd;
			/* 6 or 12 bytes of text give at most 3 or 4 bytes */
			o += put_utf8(o, (unsigned)cp);
			break;
		}
		default:
			rd->p = q;
			fail(rd, "bad escape");
			free(out);
			return NULL;
		}
		q += 2;
	}
	if (q >= rd->end) {
		rd->p = q;
		fail(rd, "unterminated string");
		free(out);
		return NULL;
	}
	*o = 0;
	rd->p = q + 1;
	return out;
}

static bool read_number(struct reader *rd, double *out)
{
	const char *q = rd->p;
	char buf[64];
	size_t n;

	if (q < rd->end && *q == '-')
		q++;
	if (q < rd->end && *q == '0')
		q++;
	else if (q < rd->end && *q >= '1' && *q <= '9')
		while (q < rd->end && *q >= '0' && *q <= '9')
			q++;
	else
		return false;
	if (q < rd->end && *q == '.') {
		q++;
		if (q >= rd->end || *q < '0' || *q > '9')
			return false;
		while (q < rd->end && *q >= '0' && *q <= '9')
			q++;
	}
	if (q < rd->end && (*q == 'e' || *q == 'E')) {
		q++;
		if (q < rd->end && (*q == '+' || *q == '-'))
			q++;
		if (q >= rd->end || *q < '0' || *q > '9')
			return false;
		while (q < rd->end && *q >= '0' && *q <= '9')
			q++;
	}
	n = (size_t)(q - rd->p);
	if (n >= sizeof(buf))
		return false;
	memcpy(buf, rd->p, n);
	buf[n] = 0;
	*out = strtod(buf, NULL);
	rd->p = q;
	return true;
}

static void json_release(struct json *j)
{
	size_t i;

	for (i = 0; i < j->n; i++)
		json_release(&j->kids[i]);
	free(j->kids);
	free(j->str);
	free(j->key);
}

static bool read_value(struct reader *rd, struct json *v, int depth);

/* An array or object's members (rd->p past its opening bracket) into <v>. */
static bool read_members(struct reader *rd, struct json *v, int depth, char close)
{
	size_t cap = 0;

	skip_ws(rd);
	if (rd->p < rd->end && *rd->p == close) {
		rd->p++;
		return true;
	}
	for (;;) {
		struct json *kid;
		char *key = NULL;

		skip_ws(rd);
		if (close == '}') {
			if (rd->p >= rd->end || *rd->p != '"') {
				fail(rd, "expected a member name");
				return false;
			}
			key = read_string(rd);
			if (!key)
				return false;
			skip_ws(rd);
			if (rd->p >= rd->end || *rd->p != ':') {
				free(key);
				fail(rd, "expected ':'");
				return false;
			}
			rd->p++;
		}
		if (v->n == cap) {
			cap = cap ? cap * 2 : 8;
			v->kids = xrealloc(v->kids, cap * sizeof(*v->kids));
		}
		kid = &v->kids[v->n++];
		memset(kid, 0, sizeof(*kid));
		kid->key = key;
		if (!read_value(rd, kid, depth + 1))
			return false;
		skip_ws(rd);
		if (rd->p < rd->end && *rd->p == ',') {
			rd->p++;
			continue;
		}
		if (rd->p < rd->end && *rd->p == close) {
			rd->p++;
			return true;
		}
		fail(rd, close == '}' ? "expected ',' or '}'" : "expected ',' or ']'");
		return false;
	}
}

static bool read_value(struct reader *rd, struct json *v, int depth)
{
	if (depth > JSON_DEPTH_MAX) {
		fail(rd, "nested too deep");
		return false;
	}
	skip_ws(rd);
	if (rd->p >= rd->end) {
		fail(rd, "unexpected end");
		return false;
	}
	switch (*rd->p) {
	case '{':
	case '[':
		v->type = *rd->p == '{' ? JSON_OBJ : JSON_ARR;
		rd->p++;
		return read_members(rd, v, depth, v->type == JSON_OBJ ? '}' : ']');
	case '"':
		v->type = JSON_STR;
		v->str = read_string(rd);
		return v->str != NULL;
	case 't':
	case 'f':
		v->type = JSON_BOOL;
		v->b = *rd->p == 't';
		if (literal(rd, v->b ? "true" : "false"))
			return true;
		break;
	case 'n':
		v->type = JSON_NULL;
		if (literal(rd, "null"))
			return true;
		break;
	default:
		v->type = JSON_NUM;
		if (read_number(rd, &v->num))
			return true;
		break;
	}
	fail(rd, "unexpected character");
	return false;
}

/*
 * Parses the <len> bytes at <text> as one JSON value. Returns the tree (to be
 * freed with json_free()), or NULL with a message in <err>.
 */
struct json *json_parse(const char *text, size_t len, char *err, size_t errlen)
{
	struct reader rd = {text, text + len, text, err, errlen, false};
	struct json *j = xcalloc(1, sizeof(*j));

	if (read_value(&rd, j, 0)) {
		skip_ws(&rd);
		if (rd.p == rd.end)
			return j;
		fail(&rd, "trailing characters");
	}
	json_free(j);
	return NULL;
}

/* Frees the tree <j> (NULL is a no-op). */
void json_free(struct json *j)
{
	if (!j)
		return;
	json_release(j);
	free(j);
}

/* The member <key> of object <obj>, or NULL (also when <obj> is not an object). */
const struct json *json_get(const struct json *obj, const char *key)
{
	size_t i;

	if (!obj || obj->type != JSON_OBJ)
		return NULL;
	for (i = 0; i < obj->n; i++)
		if (strcmp(obj->kids[i].key, key) == 0)
			return &obj->kids[i];
	return NULL;
}
