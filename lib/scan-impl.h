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

#define RUN_BLOCK 32 /* words whose masks are computed at once */

/*
 * Which words of [w, w + n) (n <= RUN_BLOCK) the run assembly must look at:
 * the non-zero ones, except all-ones words between two all-ones words
 * (inside a long run they start and end nothing).  The first and last
 * word of a block are always looked at, so neighbours outside the block
 * need not be known.
 */
static inline uint64_t words_to_visit(const uint64_t *w, size_t n)
{
	uint64_t nz = 0, ones = 0;
	size_t k = 0;

#ifdef SCAN_AVX2
	if (n == RUN_BLOCK) {
		const __m256i zero = _mm256_setzero_si256();
		__m256i v[8], o;

#pragma GCC unroll 8
		for (k = 0; k < 8; k++)
			v[k] = _mm256_loadu_si256((const __m256i *)(w + 4 * k));
		o = _mm256_or_si256(_mm256_or_si256(_mm256_or_si256(v[0], v[1]), _mm256_or_si256(v[2], v[3])),
				    _mm256_or_si256(_mm256_or_si256(v[4], v[5]), _mm256_or_si256(v[6], v[7])));
		if (_mm256_testz_si256(o, o))
			return 0;
#pragma GCC unroll 8
		for (k = 0; k < 8; k++)
			nz |= (uint64_t)_mm256_movemask_pd(_mm256_castsi256_pd(_mm256_cmpeq_epi64(v[k], zero))) << (4 * k);
		nz = ~nz & 0xffffffffull;
		/* all-ones words only matter where most words are set */
		if (__builtin_popcountll(nz) < RUN_BLOCK / 2)
			return nz;
#pragma GCC unroll 8
		for (k = 0; k < 8; k++)
			ones |= (uint64_t)_mm256_movemask_pd(_mm256_castsi256_pd(
					_mm256_cmpeq_epi64(v[k], _mm256_set1_epi64x(-1)))) << (4 * k);
		return nz & ~(ones & (ones << 1) & (ones >> 1));
	}
#endif
	for (k = 0; k < n; k++) {
		nz |= (uint64_t)(w[k] != 0) << k;
		ones |= (uint64_t)(w[k] == ~0ull) << k;
	}
	return nz & ~(ones & (ones << 1) & (ones >> 1));
}

/*
 * Runs from per-word start and end masks: a run starts at a set bit whose
 * lower neighbour is clear and ends at a set bit whose upper neighbour is
 * clear, the neighbours coming from the adjacent words.  Starts and ends
 * alternate, so the k-th end closes the k-th start: starts are written to
 * out[].first as they come, ends (exclusive) to out[].count, and counts
 * are fixed up at the end.
 *
 * The first start and end of a word are written without a branch (a word
 * with none writes a slot that is overwritten later), so a sparse bitmap
 * costs no mispredicted branch per run; further ones loop.  wp points at
 * the word, with its neighbours at wp[-1] and wp[1].  The counters travel
 * by value: out[].first has the type of a size_t, so counters behind a
 * pointer would be reloaded after every store.
 */
struct counters {
	size_t ns, ne;
};

static inline struct counters visit_word(const uint64_t *wp, uint64_t base, struct kvmdirty_run *out,
					 struct counters c)
{
	uint64_t w = wp[0];
	uint64_t sm = w & ~((w << 1) | (wp[-1] >> 63)), em = w & ~((w >> 1) | (wp[1] << 63));

	out[c.ns].first = base + (uint64_t)__builtin_ctzll(sm | (1ull << 63));
	c.ns += sm != 0;
	out[c.ne].count = base + (uint64_t)__builtin_ctzll(em | (1ull << 63)) + 1;
	c.ne += em != 0;
	for (sm &= sm - 1; sm; sm &= sm - 1)
		out[c.ns++].first = base + (uint64_t)__builtin_ctzll(sm);
	for (em &= em - 1; em; em &= em - 1)
		out[c.ne++].count = base + (uint64_t)__builtin_ctzll(em) + 1;
	return c;
}

/* An edge word of the range: masked, with its out-of-range neighbours zero. */
static inline struct counters visit_edge(const uint64_t *map, size_t j, size_t wfirst, size_t wlast,
					 uint64_t mfirst, uint64_t mlast, struct kvmdirty_run *out,
					 struct counters c)
{
	uint64_t win[3] = { j > wfirst ? map[j - 1] : 0, map[j], j < wlast ? map[j + 1] : 0 };

	if (j == wfirst)
		win[1] &= mfirst;
	if (j == wlast)
		win[1] &= mlast;
	return visit_word(win + 1, (uint64_t)j * 64, out, c);
}

/*
 * Needs max > 33: a word holds up to 32 starts, and one run may still be
 * open before it (with max 33 a run longer than a word stopped the scan
 * before any run ended: 0 returned with runs left).
 */
static size_t runs_wide(const uint64_t *map, uint64_t *pos, uint64_t end, struct kvmdirty_run *out,
			size_t max)
{
	static const uint64_t zeros[3];
	uint64_t start = *pos, mfirst = mask_from(start % 64), mlast = mask_below((unsigned int)((end - 1) % 64 + 1));
	size_t wfirst = start / 64, wlast = (end - 1) / 64, wi, k;
	struct counters c = { 0, 0 };
	uint64_t stop = end;

	c = visit_edge(map, wfirst, wfirst, wlast, mfirst, mlast, out, c);
	/*
	 * Interior words need no mask, and their neighbours' bits 63 and 0
	 * are inside [start, end).
	 */
	for (wi = wfirst + 1; wi < wlast;) {
		size_t n = wlast - wi < RUN_BLOCK ? wlast - wi : RUN_BLOCK;
		uint64_t visit = words_to_visit(map + wi, n);

		if (!visit) {
			wi = find_nonzero(map, wi + n, wlast);
			continue;
		}
		if (c.ns + 33 * (size_t)__builtin_popcountll(visit) <= max) {
			/* three visits without a branch cover most sparse blocks */
#pragma GCC unroll 3
			for (k = 0; k < 3; k++) {
				size_t i = (size_t)__builtin_ctzll(visit | (1ull << RUN_BLOCK));
				const uint64_t *wp = i < n ? map + wi + i : zeros + 1;

				c = visit_word(wp, (uint64_t)(wi + i) * 64, out, c);
				visit &= visit - 1;
			}
			for (; visit; visit &= visit - 1) {
				size_t i = (size_t)__builtin_ctzll(visit);

				c = visit_word(map + wi + i, (uint64_t)(wi + i) * 64, out, c);
			}
		} else {
			for (; visit; visit &= visit - 1) {
				size_t i = (size_t)__builtin_ctzll(visit);

				if (c.ns + 33 > max) {
					stop = (uint64_t)(wi + i) * 64;
					goto out;
				}
				c = visit_word(map + wi + i, (uint64_t)(wi + i) * 64, out, c);
			}
		}
		wi += n;
	}
	if (wlast > wfirst) {
		if (c.ns + 33 > max) {
			stop = (uint64_t)wlast * 64;
			goto out;
		}
		c = visit_edge(map, wlast, wfirst, wlast, mfirst, mlast, out, c);
	}
out:
	for (k = 0; k < c.ne; k++)
		out[k].count -= out[k].first;
	/* a run whose end was not reached is reported by the next call */
	*pos = c.ns > c.ne ? out[c.ne].first : stop;
	return c.ne;
}

static size_t scan_runs(const uint64_t *map, uint64_t *pos, uint64_t end, struct kvmdirty_run *out,
			size_t max)
{
	struct kvmdirty_run tmp[64];
	uint64_t p = *pos;
	size_t n;

	if (*pos >= end || !max)
		return 0;
	if (max > 33)
		return runs_wide(map, pos, end, out, max);
	/*
	 * Small batches: collect into a larger one and hand out the first
	 * max runs; runs are maximal and ordered, so the next call can
	 * start from the first run not handed out.
	 */
	n = runs_wide(map, &p, end, tmp, 64);
	if (n > max) {
		p = tmp[max].first;
		n = max;
	}
	memcpy(out, tmp, n * sizeof(*tmp));
	*pos = p;
	return n;
}

/*
 * First word index in [i, n) that is non-zero, or n, for a bitmap other
 * threads set bits in meanwhile: relaxed atomic loads (plain moves on
 * x86), eight words a step.  A bit set after its word was read is not
 * lost: it stays for the next take.
 */
static inline size_t find_nonzero_shared(uint64_t *w, size_t i, size_t n)
{
	for (; i + 8 <= n; i += 8) {
		uint64_t o = __atomic_load_n(&w[i], __ATOMIC_RELAXED) | __atomic_load_n(&w[i + 1], __ATOMIC_RELAXED) |
			     __atomic_load_n(&w[i + 2], __ATOMIC_RELAXED) | __atomic_load_n(&w[i + 3], __ATOMIC_RELAXED) |
			     __atomic_load_n(&w[i + 4], __ATOMIC_RELAXED) | __atomic_load_n(&w[i + 5], __ATOMIC_RELAXED) |
			     __atomic_load_n(&w[i + 6], __ATOMIC_RELAXED) | __atomic_load_n(&w[i + 7], __ATOMIC_RELAXED);

		if (o)
			break;
	}
	for (; i < n; i++)
		if (__atomic_load_n(&w[i], __ATOMIC_RELAXED))
			return i;
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
	/* only non-zero words pay for the locked exchange */
	for (wi = find_nonzero_shared(src, wfirst, wlast + 1); wi <= wlast;
	     wi = find_nonzero_shared(src, wi + 1, wlast + 1)) {
		uint64_t m = ~0ull, v;

		if (wi == wfirst)
			m &= mask_from(start % 64);
		if (wi == wlast)
			m &= mask_below((unsigned int)((end - 1) % 64 + 1));
		if (m == ~0ull)
			v = __atomic_exchange_n(&src[wi], 0, __ATOMIC_ACQ_REL);
		else if (__atomic_load_n(&src[wi], __ATOMIC_RELAXED) & m)
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
