/* SPDX-License-Identifier: MIT */
/*
 * A small JSON reader (RFC 8259) into a tree, for `spoa-ratelimit ctl status`,
 * which reads the agent's /status.json. Objects keep their members in order.
 * Bounded: nesting at most JSON_DEPTH_MAX, the tree as large as the text
 * allows; anything else is an error with its offset, never a crash.
 */
#ifndef AGENT_JSON_H
#define AGENT_JSON_H

#include <stdbool.h>
#include <stddef.h>

#include "compiler.h"

#define JSON_DEPTH_MAX 32

enum json_type {
	JSON_NULL = 0,
	JSON_BOOL,
	JSON_NUM,
	JSON_STR,
	JSON_ARR,
	JSON_OBJ,
	JSON_COUNT              /* sentinel */
};

/* A value, and the tree under it. */
struct json {
	enum json_type type;
	bool b;                 /* JSON_BOOL */
	double num;             /* JSON_NUM */
	char *str;              /* owned: JSON_STR, NUL-terminated (a \u0000 is cut there) */
	char *key;              /* owned: the member's name inside an object, else NULL */
	struct json *kids;      /* owned: JSON_ARR / JSON_OBJ, n of them */
	size_t n;
};

struct json *json_parse(const char *text, size_t len, char *err, size_t errlen) MUSTCHECK;
void json_free(struct json *j);
const struct json *json_get(const struct json *obj, const char *key);

#endif /* AGENT_JSON_H */
