/* SPDX-License-Identifier: MIT */
/*
 * TLS client contexts (see tls.h). The private key comes in memory: the
 * configuration reads it as a secret file (secret.c: refused when others can
 * read it), so its checks apply to the bytes OpenSSL parses.
 */
#include "tls.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "util.h"

struct tls_ctx {
	SSL_CTX *ssl;
	char *server_name;              /* owned, or NULL */
	bool verify;
	unsigned refs;                  /* its holders: the configuration, the store */
};

const char *tls_error(char *buf, size_t len)
{
	unsigned long e = ERR_peek_last_error();

	if (!e)
		snprintf(buf, len, "unknown TLS error");
	else
		ERR_error_string_n(e, buf, len);
	ERR_clear_error();
	return buf;
}

/* Loads the private key <pem> (<len> bytes) of <path> into <ctx>. 0 or -1 with <err>. */
static int load_key(SSL_CTX *ctx, const char *path, const char *pem, size_t len, char *err,
		    size_t errlen)
{
	EVP_PKEY *key = NULL;
	char why[256];
	BIO *bio;
	int ret = -1;

	bio = BIO_new_mem_buf(pem, (int)len);
	if (bio)
		key = PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL);
	if (!key)
		snprintf(err, errlen, "key_file %s: no PEM private key (%s)", path,
			 tls_error(why, sizeof(why)));
	else if (SSL_CTX_get0_certificate(ctx) &&
		 X509_check_private_key(SSL_CTX_get0_certificate(ctx), key) != 1)
		snprintf(err, errlen, "key_file %s does not match cert_file (%s)", path,
			 tls_error(why, sizeof(why)));
	else if (SSL_CTX_use_PrivateKey(ctx, key) != 1)
		snprintf(err, errlen, "key_file %s: %s", path, tls_error(why, sizeof(why)));
	else
		ret = 0;
	EVP_PKEY_free(key);
	BIO_free(bio);
	return ret;
}

/*
 * Whether <path> (<what>: "CA file", "cert_file", ...; a directory when <dir>)
 * can be read: 0, or -1 with "<what> <path>: No such file or directory" in
 * <err>, where OpenSSL would only say "system lib".
 */
static int readable(const char *what, const char *path, bool dir, char *err, size_t errlen)
{
	struct stat st;

	if (stat(path, &st) == -1 || access(path, R_OK | (dir ? X_OK : 0)) == -1) {
		snprintf(err, errlen, "%s %s: %s", what, path, strerror(errno));
		return -1;
	}
	if (dir != !!S_ISDIR(st.st_mode)) {
		snprintf(err, errlen, "%s %s: %s", what, path,
			 dir ? "not a directory" : "a directory, not a file");
		return -1;
	}
	return 0;
}

struct tls_ctx *tls_ctx_new(const struct tls_opts *o, char *err, size_t errlen)
{
	struct tls_ctx *t = xcalloc(1, sizeof(*t));
	int floor = TLS1_2_VERSION;
	char why[256];

	if (o->min_version && strcmp(o->min_version, "1.2") != 0) {
		if (strcmp(o->min_version, "1.3") != 0) {
			snprintf(err, errlen, "min_version \"%s\": \"1.2\" or \"1.3\"", o->min_version);
			goto fail;
		}
		floor = TLS1_3_VERSION;
	}
	if ((o->cert_file == NULL) != (o->key_file == NULL)) {
		snprintf(err, errlen, "cert_file and key_file go together (mutual TLS)");
		goto fail;
	}
	t->ssl = SSL_CTX_new(TLS_client_method());
	if (!t->ssl) {
		snprintf(err, errlen, "%s", tls_error(why, sizeof(why)));
		goto fail;
	}
	SSL_CTX_set_min_proto_version(t->ssl, floor);
	/* a write may take part of a buffer, and be retried from a moved one. The
	 * record buffers are kept (no SSL_MODE_RELEASE_BUFFERS): a connection to
	 * Redis goes idle between every two calls, and releasing them would cost
	 * an allocation and a free of ~17 KB each time, for the few connections
	 * an agent holds. Reading ahead takes what the socket has in one read()
	 * (rather than a record's header, then its body) */
	SSL_CTX_set_mode(t->ssl, SSL_MODE_ENABLE_PARTIAL_WRITE |
				 SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
	SSL_CTX_set_read_ahead(t->ssl, 1);
	t->verify = o->verify;
	SSL_CTX_set_verify(t->ssl, o->verify ? SSL_VERIFY_PEER : SSL_VERIFY_NONE, NULL);
	if (o->ca_file || o->ca_dir) {
		if ((o->ca_file && readable("CA file", o->ca_file, false, err, errlen) == -1) ||
		    (o->ca_dir && readable("CA directory", o->ca_dir, true, err, errlen) == -1))
			goto fail;
		if (SSL_CTX_load_verify_locations(t->ssl, o->ca_file, o->ca_dir) != 1) {
			snprintf(err, errlen, "%s %s: no certificate read (PEM expected): %s",
				 o->ca_file ? "CA file" : "CA directory",
				 o->ca_file ? o->ca_file : o->ca_dir, tls_error(why, sizeof(why)));
			goto fail;
		}
	} else if (SSL_CTX_set_default_verify_paths(t->ssl) != 1) {
		snprintf(err, errlen, "the system's CAs: %s", tls_error(why, sizeof(why)));
		goto fail;
	}
	if (o->cert_file) {
		if (readable("cert_file", o->cert_file, false, err, errlen) == -1)
			goto fail;
		if (SSL_CTX_use_certificate_chain_file(t->ssl, o->cert_file) != 1) {
			snprintf(err, errlen, "cert_file %s: %s", o->cert_file,
				 tls_error(why, sizeof(why)));
			goto fail;
		}
		if (load_key(t->ssl, o->key_file, o->key_pem, o->key_len, err, errlen) == -1)
			goto fail;
	}
	if (o->server_name)
		t->server_name = xstrdup(o->server_name);
	t->refs = 1;
	return t;
fail:
	ERR_clear_error();
	tls_ctx_free(t);
	return NULL;
}

struct tls_ctx *tls_ctx_ref(struct tls_ctx *t)
{
	if (t)
		t->refs++;
	return t;
}

void tls_ctx_free(struct tls_ctx *t)
{
	if (!t || (t->refs && --t->refs))
		return;
	SSL_CTX_free(t->ssl); /* the connections made with it keep their reference */
	free(t->server_name);
	free(t);
}

struct ssl_ctx_st *tls_ctx_ssl(const struct tls_ctx *t)
{
	return t->ssl;
}

const char *tls_ctx_server_name(const struct tls_ctx *t)
{
	return t->server_name;
}

bool tls_ctx_verify(const struct tls_ctx *t)
{
	return t->verify;
}

bool tls_ctx_has_cert(const struct tls_ctx *t)
{
	return SSL_CTX_get0_certificate(t->ssl) != NULL;
}
