/* SPDX-License-Identifier: MIT */
/*
 * Request path normalisation for endpoint matching: the path HAProxy sends is
 * reduced to one canonical spelling so that variants an application routes to
 * the same handler (`//v1/search`, `/v1/%73earch`, `/v1/./search`) match the
 * same endpoint. No allocation: the caller gives a fixed output buffer.
 */
#ifndef AGENT_NORMALIZE_H
#define AGENT_NORMALIZE_H

#include <stdbool.h>
#include <stddef.h>

/* Bytes of a normalised path that endpoint matching looks at (a path_prefix is at most this). */
#define NORM_PATH_MAX 1024

size_t norm_path(const char *in, size_t len, char *out, size_t cap, bool *truncated);
bool norm_prefix_eq(const char *s, size_t len, const char *prefix, size_t plen);

#endif /* AGENT_NORMALIZE_H */
