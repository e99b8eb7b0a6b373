/* SPDX-License-Identifier: MIT */
/*
 * Secrets kept out of the main configuration file: a file of its own holds one
 * secret (the Redis password, `redis.password_file`; the TLS private key,
 * `redis.tls.key_file`). The file is read when the configuration is
 * loaded (start, `-c`, every reload, `ctl`), never from the event loop's hot
 * path, and refused unless it is a regular file that others can neither read
 * nor write.
 */
#ifndef AGENT_SECRET_H
#define AGENT_SECRET_H

#include <stddef.h>

#include "compiler.h"

#define SECRET_MAX 4096         /* bytes a secret file may hold, line ending included */

char *secret_path(const char *path, const char *conf_file);
int secret_read(const char *path, char **out, char *err, size_t errlen) MUSTCHECK;
int secret_read_file(const char *path, size_t max, char **out, size_t *outlen, char *err,
		     size_t errlen) MUSTCHECK;

#endif /* AGENT_SECRET_H */
