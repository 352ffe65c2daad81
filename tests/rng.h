/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_TEST_RNG_H
#define KVMDIRTY_TEST_RNG_H

#include <stdint.h>

/* xorshift64: reproducible test and benchmark data; *state must not be 0. */
static inline uint64_t xorshift64(uint64_t *state)
{
	uint64_t x = *state;

	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	return *state = x;
}

/* Fisher-Yates shuffle of a[0..n) with xorshift64. */
static inline void shuffle_u64(uint64_t *a, uint64_t n, uint64_t *state)
{
	uint64_t i, j, t;

	for (i = n; i > 1; i--) {
		j = xorshift64(state) % i;
		t = a[i - 1];
		a[i - 1] = a[j];
		a[j] = t;
	}
}

#endif
