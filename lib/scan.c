// SPDX-License-Identifier: MIT
/* The bitmap scanner's public face: dispatch to the kernels, set and clear. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "export.h"
#include "scan.h"

static const struct kd_scan_ops *current;

static const struct kd_scan_ops *pick(void)
{
	const char *env = getenv("KVMDIRTY_SCAN");

	if (env && !strcmp(env, "portable"))
		return &kd_scan_generic;
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("popcnt") && __builtin_cpu_supports("bmi"))
		return &kd_scan_avx2;
	return &kd_scan_generic;
}

const struct kd_scan_ops *kd_scan_ops(void)
{
	const struct kd_scan_ops *ops = __atomic_load_n(&current, __ATOMIC_ACQUIRE);

	/* threads racing here all pick the same table */
	if (!ops) {
		ops = pick();
		__atomic_store_n(&current, ops, __ATOMIC_RELEASE);
	}
	return ops;
}

int kd_scan_select(const char *name)
{
	const struct kd_scan_ops *ops;

	if (!name)
		ops = pick();
	else if (!strcmp(name, "portable"))
		ops = &kd_scan_generic;
	else if (!strcmp(name, "avx2") && pick() == &kd_scan_avx2)
		ops = &kd_scan_avx2;
	else
		return -EOPNOTSUPP;
	__atomic_store_n(&current, ops, __ATOMIC_RELEASE);
	return 0;
}

KD_EXPORT const char *kvmdirty_bitmap_impl(void)
{
	return kd_scan_ops()->name;
}

KD_EXPORT uint64_t kvmdirty_bitmap_next_set(const uint64_t *map, uint64_t from, uint64_t end)
{
	return kd_scan_ops()->next_set(map, from, end);
}

KD_EXPORT uint64_t kvmdirty_bitmap_count(const uint64_t *map, uint64_t start, uint64_t end)
{
	return kd_scan_ops()->count(map, start, end);
}

KD_EXPORT bool kvmdirty_bitmap_is_clear(const uint64_t *map, uint64_t start, uint64_t end)
{
	return kd_scan_ops()->next_set(map, start, end) >= end;
}

KD_EXPORT size_t kvmdirty_bitmap_runs(const uint64_t *map, uint64_t *pos, uint64_t end,
				      struct kvmdirty_run *runs, size_t max_runs)
{
	return kd_scan_ops()->runs(map, pos, end, runs, max_runs);
}

KD_EXPORT int kvmdirty_bitmap_for_each_run(const uint64_t *map, uint64_t start, uint64_t end,
					   int (*fn)(uint64_t first, uint64_t count, void *opaque),
					   void *opaque)
{
	const struct kd_scan_ops *ops = kd_scan_ops();
	struct kvmdirty_run batch[64];
	size_t i, n;
	int ret;

	while ((n = ops->runs(map, &start, end, batch, 64)) > 0) {
		for (i = 0; i < n; i++) {
			ret = fn(batch[i].first, batch[i].count, opaque);
			if (ret)
				return ret;
		}
	}
	return 0;
}

KD_EXPORT uint64_t kvmdirty_bitmap_next_dirty_chunk(const uint64_t *map, uint64_t from, uint64_t end,
						    uint64_t chunk_bits)
{
	uint64_t bit;

	if (!chunk_bits)
		return end;
	bit = kd_scan_ops()->next_set(map, from, end);
	return bit >= end ? end : bit - bit % chunk_bits;
}

/* Apply fn(word, mask) to each word of [start, end) with the range's mask. */
#define FOR_EACH_MASKED_WORD(map, start, end, body)                                            \
	do {                                                                                   \
		size_t __wi, __wf, __wl;                                                       \
		if ((start) >= (end))                                                          \
			break;                                                                 \
		__wf = (start) / 64;                                                           \
		__wl = ((end) - 1) / 64;                                                       \
		for (__wi = __wf; __wi <= __wl; __wi++) {                                      \
			uint64_t *word = &(map)[__wi], mask = ~0ull;                           \
			if (__wi == __wf)                                                      \
				mask &= ~0ull << ((start) % 64);                               \
			if (__wi == __wl)                                                      \
				mask &= ~0ull >> (63 - ((end) - 1) % 64);                      \
			body;                                                                  \
		}                                                                              \
	} while (0)

KD_EXPORT void kvmdirty_bitmap_set(uint64_t *map, uint64_t start, uint64_t end)
{
	FOR_EACH_MASKED_WORD(map, start, end, *word |= mask);
}

KD_EXPORT void kvmdirty_bitmap_clear(uint64_t *map, uint64_t start, uint64_t end)
{
	FOR_EACH_MASKED_WORD(map, start, end, *word &= ~mask);
}

/* Release: a consumer that takes the bit with acquire sees what was written before it was set. */
KD_EXPORT void kvmdirty_bitmap_set_atomic(uint64_t *map, uint64_t start, uint64_t end)
{
	FOR_EACH_MASKED_WORD(map, start, end, __atomic_fetch_or(word, mask, __ATOMIC_RELEASE));
}

KD_EXPORT void kvmdirty_bitmap_clear_atomic(uint64_t *map, uint64_t start, uint64_t end)
{
	FOR_EACH_MASKED_WORD(map, start, end, __atomic_fetch_and(word, ~mask, __ATOMIC_RELEASE));
}

KD_EXPORT uint64_t kvmdirty_bitmap_take(uint64_t *dst, uint64_t *src, uint64_t start, uint64_t end)
{
	return kd_scan_ops()->take(dst, src, start, end);
}
