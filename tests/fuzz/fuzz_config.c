/* SPDX-License-Identifier: MIT */
/*
 * libFuzzer target for the configuration loader: any bytes as a config file
 * must give either a valid configuration (which then compiles into a
 * ruleset) or a list of errors, never a crash or an out-of-bounds access.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "config.h"
#include "rules.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static char path[64];
	struct cfg_errors errs = {0};
	struct agent_config *cfg;
	FILE *f;

	if (size > 1 << 16)
		return 0;
	if (!path[0])
		snprintf(path, sizeof(path), "/dev/shm/fuzz-config-%d.conf", (int)getpid());
	f = fopen(path, "wb");
	if (!f)
		return 0;
	fwrite(data, 1, size, f);
	fclose(f);
	if (config_load(path, &cfg, &errs) == 0)
		ruleset_unref(ruleset_build(cfg, 1));
	cfg_errors_release(&errs);
	return 0;
}
