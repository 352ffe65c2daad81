/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_BENCH_BITMAP_FILL_H
#define KVMDIRTY_BENCH_BITMAP_FILL_H

/* Dirty bitmaps as the scan benchmarks (bench-scan, bench-scale) fill them. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "rng.h"

/* Independent bits at density p, or runs of run_len set bits starting at density p / run_len. */
static inline void bitmap_fill(uint64_t *map, uint64_t nbits, double p, unsigned int run_len, uint64_t *rng)
{
	uint64_t words = nbits / 64, i, b;

	if (p >= 1) {
		memset(map, 0xff, words * 8);
		return;
	}
	memset(map, 0, words * 8);
	if (p == 0.5) {
		for (i = 0; i < words; i++)
			map[i] = xorshift64(rng);
		return;
	}
	if (p <= 0)
		return;
	/* geometric gaps between set bits (or runs) */
	for (b = 0;; b += run_len) {
		double u = (double)(xorshift64(rng) >> 11) / (double)(1ull << 53);

		b += (uint64_t)(log(u > 0 ? u : 1e-300) / log1p(-p / run_len));
		if (b + run_len > nbits)
			break;
		for (i = b; i < b + run_len; i++)
			map[i / 64] |= 1ull << (i % 64);
	}
}

#endif
