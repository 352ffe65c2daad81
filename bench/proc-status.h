/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_BENCH_PROC_STATUS_H
#define KVMDIRTY_BENCH_PROC_STATUS_H

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

/* A "Key:   N kB" field of /proc/self/status (VmRSS, VmHWM), in KiB; 0 where it cannot be read. */
static inline uint64_t proc_status_kib(const char *key)
{
	FILE *f = fopen("/proc/self/status", "re");
	size_t n = strlen(key);
	char line[256];
	uint64_t kib = 0;

	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, key, n) && line[n] == ':' && sscanf(line + n + 1, "%" SCNu64, &kib) == 1)
			break;
	if (f)
		fclose(f);
	return kib;
}

#endif
