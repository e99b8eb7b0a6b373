/* SPDX-License-Identifier: MIT */
/*
 * Runs LLVMFuzzerTestOneInput() once on every file named on the command line;
 * directories are walked recursively (entries starting with '.' are skipped).
 * Lets a plain gcc + ASan/UBSan build replay a corpus or a crash file without
 * libFuzzer:
 *
 *   gcc -std=gnu11 -D_GNU_SOURCE -g -fsanitize=address,undefined -Ispoa \
 *       tests/fuzz/replay.c tests/fuzz/fuzz_spop_frame.c spoa/spop.c -o /tmp/replay_spop
 *   /tmp/replay_spop tests/fuzz/corpus/spop_frame
 *
 * Each input is copied into an exactly sized heap buffer, as libFuzzer does.
 * Exit status: 0 if every input ran, 1 if a path could not be read (a failing
 * check inside the target aborts the process).
 */
#include <dirent.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static unsigned long nb_inputs;

static int run_file(const char *path)
{
	FILE *fp = fopen(path, "rb");
	uint8_t *buf = NULL;
	size_t cap = 0, len = 0;
	int ret = 0;

	if (!fp) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return 1;
	}
	for (;;) {
		size_t n;

		if (len == cap) {
			size_t ncap = cap ? cap * 2 : 4096;
			uint8_t *nbuf = realloc(buf, ncap);

			if (!nbuf) {
				fprintf(stderr, "replay: %s: out of memory\n", path);
				ret = 1;
				goto out;
			}
			buf = nbuf;
			cap = ncap;
		}
		n = fread(buf + len, 1, cap - len, fp);
		len += n;
		if (n == 0) {
			if (ferror(fp)) {
				fprintf(stderr, "replay: %s: read error\n", path);
				ret = 1;
				goto out;
			}
			break;
		}
	}
	{
		/* exactly sized copy so that overreads of the input are caught */
		uint8_t *exact = malloc(len ? len : 1);

		if (!exact) {
			ret = 1;
			goto out;
		}
		if (len)
			memcpy(exact, buf, len);
		LLVMFuzzerTestOneInput(exact, len);
		free(exact);
		nb_inputs++;
	}
out:
	free(buf);
	fclose(fp);
	return ret;
}

static int run_path(const char *path)
{
	struct stat st;
	DIR *dir;
	struct dirent *de;
	int ret = 0;

	if (stat(path, &st) != 0) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return 1;
	}
	if (!S_ISDIR(st.st_mode))
		return run_file(path);
	dir = opendir(path);
	if (!dir) {
		fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
		return 1;
	}
	while ((de = readdir(dir)) != NULL) {
		char *sub;

		if (de->d_name[0] == '.')
			continue;
		if (asprintf(&sub, "%s/%s", path, de->d_name) < 0) {
			ret = 1;
			break;
		}
		ret |= run_path(sub);
		free(sub);
	}
	closedir(dir);
	return ret;
}

int main(int argc, char **argv)
{
	int i, ret = 0;

	if (argc < 2) {
		fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
		return 2;
	}
	for (i = 1; i < argc; i++)
		ret |= run_path(argv[i]);
	printf("replay: %lu input(s) run%s\n", nb_inputs, ret ? ", some paths unreadable" : "");
	return ret;
}
