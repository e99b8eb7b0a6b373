/* SPDX-License-Identifier: MIT */
/* What the libFuzzer targets share: the entry point, and a check that aborts. */
#ifndef FUZZ_H
#define FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define CHECK(c)                                                                                  \
	do {                                                                                      \
		if (!(c))                                                                         \
			abort();                                                                  \
	} while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif /* FUZZ_H */
