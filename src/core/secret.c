/* SPDX-License-Identifier: MIT */
/*
 * Secret files: where a relative name points, and reading one secret with the
 * checks an operator would want (see secret.h).
 */
#include "secret.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

/*
 * Returns the file a secret named <path> in <conf_file> is read from (owned).
 * An absolute <path> is taken as is. A relative one names a credential of
 * systemd's LoadCredential= when $CREDENTIALS_DIRECTORY is set, and otherwise
 * a file next to the configuration file <conf_file>. Naming the credential
 * after the file it is loaded from makes both resolve to the same secret: the
 * service reads systemd's copy, `spoa-ratelimit -c` run from a shell the file.
 */
char *secret_path(const char *path, const char *conf_file)
{
	const char *dir = getenv("CREDENTIALS_DIRECTORY");
	const char *slash;

	if (path[0] == '/')
		return xstrdup(path);
	if (dir && *dir)
		return xasprintf("%s/%s", dir, path);
	slash = strrchr(conf_file, '/');
	if (!slash)
		return xstrdup(path);
	return xasprintf("%.*s/%s", (int)(slash - conf_file), conf_file, path);
}

/* Reads at most <cap> bytes of <fd> into <buf>; returns the count or -1 (errno). */
static ssize_t read_all(int fd, char *buf, size_t cap)
{
	size_t got = 0;

	while (got < cap) {
		ssize_t r = read(fd, buf + got, cap - got);

		if (r == -1 && errno == EINTR)
			continue;
		if (r == -1)
			return -1;
		if (r == 0)
			break;
		got += (size_t)r;
	}
	return (ssize_t)got;
}

/*
 * Reads the whole file <path> into <*out> (owned, NUL-terminated, <*outlen>
 * bytes without the NUL) with the checks of every secret file, made on the
 * descriptor that is read, so a file swapped for another (or a symbolic link
 * re-pointed) after the checks is not read: a regular file, neither readable
 * nor writable by others (group access is fine: a service reads it through its
 * group), at most <max> bytes and not empty. Returns 0, or -1 with the reason
 * in <err> (never the content).
 */
int secret_read_file(const char *path, size_t max, char **out, size_t *outlen, char *err,
		     size_t errlen)
{
	char *buf = NULL;
	struct stat st;
	ssize_t n;
	int fd;

	/* O_NONBLOCK: a FIFO in its place must not block the open */
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd == -1) {
		snprintf(err, errlen, "cannot open: %s", strerror(errno));
		return -1;
	}
	if (fstat(fd, &st) == -1) {
		snprintf(err, errlen, "cannot stat: %s", strerror(errno));
		goto fail;
	}
	if (!S_ISREG(st.st_mode)) {
		snprintf(err, errlen, "is not a regular file");
		goto fail;
	}
	if (st.st_mode & (S_IROTH | S_IWOTH)) {
		snprintf(err, errlen,
			 "is %s by others (mode %04o): set mode 0600, or 0640 with the agent's group "
			 "(chmod o-rwx)",
			 (st.st_mode & S_IROTH) ? "readable" : "writable",
			 (unsigned)(st.st_mode & 07777));
		goto fail;
	}
	if ((uint64_t)st.st_size > max) {
		snprintf(err, errlen, "is larger than %zu bytes", max);
		goto fail;
	}
	buf = xmalloc(max + 2);
	/* one byte more than allowed: a file that grew since fstat() is seen */
	n = read_all(fd, buf, max + 1);
	if (n == -1) {
		snprintf(err, errlen, "cannot read: %s", strerror(errno));
		goto fail;
	}
	if ((size_t)n > max) {
		snprintf(err, errlen, "is larger than %zu bytes", max);
		goto fail;
	}
	if (n == 0) {
		snprintf(err, errlen, "is empty");
		goto fail;
	}
	buf[n] = 0;
	close(fd);
	*out = buf;
	*outlen = (size_t)n;
	return 0;
fail:
	if (buf)
		explicit_bzero(buf, max + 2);
	free(buf);
	close(fd);
	return -1;
}

/*
 * Reads the secret held in the file <path>: its whole content less one final
 * line ending ("\n" or "\r\n"), with the checks of secret_read_file(), at most
 * SECRET_MAX bytes, and one line without NUL bytes. Returns 0 with the secret
 * in <*out> (owned, NUL-terminated), or -1 with the reason in <err> (never the
 * content).
 */
int secret_read(const char *path, char **out, char *err, size_t errlen)
{
	char *buf;
	size_t len;

	if (secret_read_file(path, SECRET_MAX, &buf, &len, err, errlen) == -1)
		return -1;
	if (len && buf[len - 1] == '\n') {
		len--;
		if (len && buf[len - 1] == '\r')
			len--;
	}
	buf[len] = 0;
	if (len == 0) {
		snprintf(err, errlen, "is empty");
		goto fail;
	}
	if (memchr(buf, 0, len) || memchr(buf, '\n', len) || memchr(buf, '\r', len)) {
		snprintf(err, errlen,
			 "holds a NUL byte or a line break inside: the secret alone, on one line");
		goto fail;
	}
	*out = buf;
	return 0;
fail:
	explicit_bzero(buf, SECRET_MAX + 2);
	free(buf);
	return -1;
}
