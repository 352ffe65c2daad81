/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_SCAN_H
#define KVMDIRTY_SCAN_H

/*
 * The bitmap scanner's kernels.  scan-impl.h is compiled twice, once
 * portable (scan-generic.c) and once with AVX2, POPCNT and BMI
 * (scan-avx2.c); scan.c picks one at first use: AVX2 where the CPU has it,
 * unless KVMDIRTY_SCAN=portable is set in the environment.  Both give the
 * same answers (tests/test-scan.c runs every case on each).
 *
 * Bitmaps are arrays of little-endian 64-bit words: bit i is bit i % 64 of
 * word i / 64, the layout of KVM's dirty bitmaps.  Pure code: no KVM.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kvmdirty.h"

struct kd_scan_ops {
	const char *name;
	uint64_t (*next_set)(const uint64_t *map, uint64_t from, uint64_t end);
	uint64_t (*count)(const uint64_t *map, uint64_t start, uint64_t end);
	size_t (*runs)(const uint64_t *map, uint64_t *pos, uint64_t end, struct kvmdirty_run *runs,
		       size_t max_runs);
	uint64_t (*take)(uint64_t *dst, uint64_t *src, uint64_t start, uint64_t end);
	/* roofline helper for the benchmark: OR of every word, wide loads */
	uint64_t (*or_reduce)(const uint64_t *map, size_t words);
};

extern const struct kd_scan_ops kd_scan_generic;
extern const struct kd_scan_ops kd_scan_avx2;

/* The ops in use; "portable", "avx2" or NULL (automatic) switch them. */
const struct kd_scan_ops *kd_scan_ops(void);
int kd_scan_select(const char *name);

#endif
