/* SPDX-License-Identifier: MIT */
/*
 * Scanner kernels, included by scan-generic.c and scan-avx2.c with
 * SCAN_OPS set to the ops table to define and SCAN_AVX2 defined or not.
 * Everything but the zero skip and the roofline reduction is the same C
 * compiled for two instruction sets (popcount and tzcnt are single
 * instructions in the AVX2 build).
 *
 * The zero skip touches every bitmap word once, with wide loads, and the
 * run assembly only ever looks at non-zero words; a run is emitted per
 * maximal stretch of set bits, built from per-word segments (ctz of the
 * word, ctz of its inverse) so that a run of any length costs a few
 * instructions per word it spans.
 */
#include <stdint.h>
#include <string.h>

#include "scan.h"

#ifdef SCAN_AVX2
#include <immintrin.h>
#endif

static inline uint64_t mask_from(unsigned int bit) /* bits [bit, 64) */
{
	return ~0ull << bit;
}

static inline uint64_t mask_below(unsigned int bit) /* bits [0, bit), bit in 1..64 */
{
	return ~0ull >> (64 - bit);
}

/* First word index in [i, n) that is non-zero, or n. */
static inline size_t find_nonzero(const uint64_t *w, size_t i, size_t n)
{
#ifdef SCAN_AVX2
	for (; i < n && ((uintptr_t)(w + i) & 31); i++)
		if (w[i])
			return i;
	for (; i + 16 <= n; i += 16) {
		__m256i a = _mm256_load_si256((const __m256i *)(w + i));
		__m256i b = _mm256_load_si256((const __m256i *)(w + i + 4));
		__m256i c = _mm256_load_si256((const __m256i *)(w + i + 8));
		__m256i d = _mm256_load_si256((const __m256i *)(w + i + 12));
		__m256i o = _mm256_or_si256(_mm256_or_si256(a, b), _mm256_or_si256(c, d));

		if (!_mm256_testz_si256(o, o))
			break;
	}
#else
	for (; i < n && ((uintptr_t)(w + i) & 63); i++)
		if (w[i])
			return i;
	for (; i + 8 <= n; i += 8)
		if (w[i] | w[i + 1] | w[i + 2] | w[i + 3] | w[i + 4] | w[i + 5] | w[i + 6] | w[i + 7])
			break;
#endif
	for (; i < n; i++)
		if (w[i])
			return i;
	return n;
}

static uint64_t scan_next_set(const uint64_t *map, uint64_t from, uint64_t end)
{
	size_t wi, wend;
	uint64_t w, bit;

	if (from >= end)
		return end;
	wi = from / 64;
	wend = (end - 1) / 64 + 1;
	w = map[wi] & mask_from(from % 64);
	while (!w) {
		wi = find_nonzero(map, wi + 1, wend);
		if (wi >= wend)
			return end;
		w = map[wi];
	}
	bit = wi * 64 + (uint64_t)__builtin_ctzll(w);
	return bit < end ? bit : end;
}

static uint64_t scan_count(const uint64_t *map, uint64_t start, uint64_t end)
{
	size_t ws, we, i;
	uint64_t c;

	if (start >= end)
		return 0;
	ws = start / 64;
	we = (end - 1) / 64;
	if (ws == we)
		return (uint64_t)__builtin_popcountll(map[ws] & mask_from(start % 64) &
						      mask_below((unsigned int)((end - 1) % 64 + 1)));
	c = (uint64_t)__builtin_popcountll(map[ws] & mask_from(start % 64));
	for (i = find_nonzero(map, ws + 1, we); i < we; i = find_nonzero(map, i + 1, we))
		c += (uint64_t)__builtin_popcountll(map[i]);
	return c + (uint64_t)__builtin_popcountll(map[we] & mask_below((unsigned int)((end - 1) % 64 + 1)));
}

/* Append run [first, end); when out is full, park *pos at first instead. */
static inline bool emit(struct kvmdirty_run *out, size_t *n, size_t max, uint64_t first, uint64_t end,
			uint64_t *pos)
{
	if (*n == max) {
		*pos = first;
		return false;
	}
	out[*n].first = first;
	out[*n].count = end - first;
	(*n)++;
	return true;
}

static size_t scan_runs(const uint64_t *map, uint64_t *pos, uint64_t end, struct kvmdirty_run *out,
			size_t max)
{
	uint64_t start = *pos, open_first = 0, open_end = 0;
	size_t n = 0, wi, wfirst, wlast;
	bool open = false;

	if (start >= end || !max)
		return 0;
	wfirst = start / 64;
	wlast = (end - 1) / 64;
	wi = find_nonzero(map, wfirst, wlast + 1);
	while (wi <= wlast) {
		uint64_t w = map[wi], base = (uint64_t)wi * 64;

		if (wi == wfirst)
			w &= mask_from(start % 64);
		if (wi == wlast)
			w &= mask_below((unsigned int)((end - 1) % 64 + 1));
		while (w) {
			unsigned int s = (unsigned int)__builtin_ctzll(w);
			uint64_t x = ~(w >> s);
			unsigned int len = x ? (unsigned int)__builtin_ctzll(x) : 64;

			if (open && base + s == open_end) {
				open_end += len; /* the run goes on from the last word */
			} else {
				if (open && !emit(out, &n, max, open_first, open_end, pos))
					return n;
				open = true;
				open_first = base + s;
				open_end = base + s + len;
			}
			if (s + len >= 64)
				break;
			w &= mask_from(s + len);
		}
		/* dense stretches go word by word, sparse ones through the zero skip */
		if (wi < wlast && map[wi + 1])
			wi++;
		else
			wi = find_nonzero(map, wi + 1, wlast + 1);
	}
	if (open && !emit(out, &n, max, open_first, open_end, pos))
		return n;
	*pos = end;
	return n;
}

static uint64_t scan_take(uint64_t *dst, uint64_t *src, uint64_t start, uint64_t end)
{
	size_t wi, wfirst, wlast;
	uint64_t fresh = 0;

	if (start >= end)
		return 0;
	wfirst = start / 64;
	wlast = (end - 1) / 64;
	/*
	 * The zero skip reads src without atomics: a bit set after that read
	 * is not lost, it stays in src for the next take.  Only non-zero
	 * words pay for the locked exchange.
	 */
	for (wi = find_nonzero(src, wfirst, wlast + 1); wi <= wlast; wi = find_nonzero(src, wi + 1, wlast + 1)) {
		uint64_t m = ~0ull, v;

		if (wi == wfirst)
			m &= mask_from(start % 64);
		if (wi == wlast)
			m &= mask_below((unsigned int)((end - 1) % 64 + 1));
		if (m == ~0ull)
			v = __atomic_exchange_n(&src[wi], 0, __ATOMIC_ACQ_REL);
		else if (src[wi] & m)
			v = __atomic_fetch_and(&src[wi], ~m, __ATOMIC_ACQ_REL) & m;
		else
			continue;
		fresh += (uint64_t)__builtin_popcountll(v & ~dst[wi]);
		dst[wi] |= v;
	}
	return fresh;
}

static uint64_t scan_or_reduce(const uint64_t *map, size_t words)
{
	size_t i = 0;
	uint64_t r = 0;

#ifdef SCAN_AVX2
	__m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;

	for (; i < words && ((uintptr_t)(map + i) & 31); i++)
		r |= map[i];
	for (; i + 16 <= words; i += 16) {
		a = _mm256_or_si256(a, _mm256_load_si256((const __m256i *)(map + i)));
		b = _mm256_or_si256(b, _mm256_load_si256((const __m256i *)(map + i + 4)));
		c = _mm256_or_si256(c, _mm256_load_si256((const __m256i *)(map + i + 8)));
		d = _mm256_or_si256(d, _mm256_load_si256((const __m256i *)(map + i + 12)));
	}
	a = _mm256_or_si256(_mm256_or_si256(a, b), _mm256_or_si256(c, d));
	r |= (uint64_t)_mm256_extract_epi64(a, 0) | (uint64_t)_mm256_extract_epi64(a, 1) |
	     (uint64_t)_mm256_extract_epi64(a, 2) | (uint64_t)_mm256_extract_epi64(a, 3);
#else
	uint64_t r1 = 0, r2 = 0, r3 = 0;

	for (; i + 4 <= words; i += 4) {
		r |= map[i];
		r1 |= map[i + 1];
		r2 |= map[i + 2];
		r3 |= map[i + 3];
	}
	r |= r1 | r2 | r3;
#endif
	for (; i < words; i++)
		r |= map[i];
	return r;
}

const struct kd_scan_ops SCAN_OPS = {
#ifdef SCAN_AVX2
	.name = "avx2",
#else
	.name = "portable",
#endif
	.next_set = scan_next_set,
	.count = scan_count,
	.runs = scan_runs,
	.take = scan_take,
	.or_reduce = scan_or_reduce,
};
