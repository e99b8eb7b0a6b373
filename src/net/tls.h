/* SPDX-License-Identifier: MIT */
/*
 * TLS client settings for the connections to Redis and the Sentinels: one
 * OpenSSL context built from the configuration (CA, client certificate and
 * key, protocol floor, verification), shared by every connection made while
 * it is current. A reload builds a new one; connections made before keep the
 * one they were made with (OpenSSL counts its references).
 */
#ifndef SPOA_RATELIMIT_TLS_H
#define SPOA_RATELIMIT_TLS_H

#define TLS_KEY_MAX (64 * 1024)         /* bytes a private key file may hold */

#include <stdbool.h>
#include <stddef.h>

#include "compiler.h"

struct tls_opts {
	const char *ca_file;            /* PEM bundle, or NULL */
	const char *ca_dir;             /* hashed directory (c_rehash), or NULL */
	const char *cert_file;          /* client certificate chain (mutual TLS), or NULL */
	const char *key_file;           /* its private key's file (named in errors), or NULL */
	const char *key_pem;            /* ... its content, read as a secret file */
	size_t key_len;
	const char *server_name;        /* SNI and the name verified; NULL: the address dialled */
	const char *min_version;        /* "1.2" or "1.3"; NULL: "1.2" */
	bool verify;                    /* verify the server's certificate and name */
};

struct tls_ctx;
struct ssl_ctx_st;

/* A context for <o>, or NULL with the reason in <err>: a file that cannot be
 * read or parsed, a key that does not match its certificate, a bad version. */
struct tls_ctx *tls_ctx_new(const struct tls_opts *o, char *err, size_t errlen) MUSTCHECK;
/* One more holder of <t> (NULL is fine); each holder calls tls_ctx_free(). */
struct tls_ctx *tls_ctx_ref(struct tls_ctx *t);
void tls_ctx_free(struct tls_ctx *t);
struct ssl_ctx_st *tls_ctx_ssl(const struct tls_ctx *t);
const char *tls_ctx_server_name(const struct tls_ctx *t);
bool tls_ctx_verify(const struct tls_ctx *t);
/* a client certificate is configured (mutual TLS) */
bool tls_ctx_has_cert(const struct tls_ctx *t);
/* The last OpenSSL error of this thread as text (and the queue cleared). */
const char *tls_error(char *buf, size_t len);

#endif
