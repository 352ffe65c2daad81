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

#endif
