// SPDX-License-Identifier: MIT
/*
 * The bitmap scanner against a bit-by-bit reference, on random bitmaps of
 * many densities and shapes, for the portable and the AVX2 kernels alike;
 * and a concurrency test of set_atomic against take.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>

#include <kvmdirty.h>

#include "scan.h"
#include "rng.h"
#include "test-util.h"

static const char *const impls[] = { "portable", "avx2" };

static uint64_t rng = 0x853c49e6748fea9bull;

static uint64_t rnd(void)
{
	return xorshift64(&rng);
}

static bool ref_bit(const uint64_t *m, uint64_t b)
{
	return (m[b / 64] >> (b % 64)) & 1;
}

static void select_impl(int i)
{
	int ret = kd_scan_select(impls[i]);

	if (ret == -EOPNOTSUPP && i == 1) {
		/* a CPU without AVX2 runs the portable kernels twice */
		ck_assert_uint_eq(kd_scan_select("portable"), 0);
		return;
	}
	ck_assert_uint_eq(ret, 0);
	ck_assert_str_eq(kvmdirty_bitmap_impl(), impls[i]);
}

/*
 * A bitmap of nbits at density p, with planted shapes: runs across word
 * and 512-bit chunk edges, the first and last bit.  Bits past nbits in the
 * last word are set too: the scanner must ignore them.
 */
static void fill(uint64_t *m, uint64_t nbits, double p)
{
	uint64_t words = KVMDIRTY_BITMAP_WORDS(nbits), i, b;

	memset(m, 0, words * 8);
	if (p >= 1) {
		memset(m, 0xff, words * 8);
		return;
	}
	for (b = 0; b < nbits; b++)
		if ((double)(rnd() >> 11) / (double)(1ull << 53) < p)
			m[b / 64] |= 1ull << (b % 64);
	if (p > 0) {
		for (i = 0; i < 3; i++) {
			uint64_t at = (rnd() % (words)) * 64, len = 1 + rnd() % 200;

			at = at >= 3 ? at - 3 : at; /* straddle a word edge */
			for (b = at; b < at + len && b < nbits; b++)
				m[b / 64] |= 1ull << (b % 64);
		}
		m[0] |= 1;
		m[(nbits - 1) / 64] |= 1ull << ((nbits - 1) % 64);
	}
	if (nbits % 64)
		m[words - 1] |= ~0ull << (nbits % 64);
}

static void check_range(const uint64_t *m, uint64_t start, uint64_t end)
{
	static const size_t batches[] = { 1, 3, 32, 33, 34, 64 };
	static struct kvmdirty_run want[300000 / 2 + 1];
	struct kvmdirty_run runs[64];
	uint64_t b, count = 0, nwant = 0, pos, got_count;
	size_t n, k, max, total, mi;

	for (b = start; b < end; b++) {
		if (!ref_bit(m, b))
			continue;
		count++;
		if (nwant && want[nwant - 1].first + want[nwant - 1].count == b) {
			want[nwant - 1].count++;
		} else {
			want[nwant].first = b;
			want[nwant].count = 1;
			nwant++;
		}
	}
	got_count = kvmdirty_bitmap_count(m, start, end);
	expect(got_count == count, "count [%" PRIu64 ", %" PRIu64 ") = %" PRIu64 ", want %" PRIu64, start,
		      end, got_count, count);
	ck_assert_uint_eq(kvmdirty_bitmap_is_clear(m, start, end), count == 0);

	/* next_set from every run start, the bit after it, and random points */
	for (k = 0; k < nwant && k < 64; k++) {
		uint64_t f = want[k].first, got = kvmdirty_bitmap_next_set(m, f, end);

		expect(got == f, "next_set(%" PRIu64 ") = %" PRIu64, f, got);
		got = kvmdirty_bitmap_next_set(m, f + want[k].count, end);
		b = k + 1 < nwant ? want[k + 1].first : end;
		expect(got == b, "next_set(%" PRIu64 ") = %" PRIu64 ", want %" PRIu64, f + want[k].count, got, b);
	}
	for (k = 0; k < 16 && end > start; k++) {
		uint64_t f = start + rnd() % (end - start), want_b = end;

		for (b = f; b < end; b++)
			if (ref_bit(m, b)) {
				want_b = b;
				break;
			}
		ck_assert_uint_eq(kvmdirty_bitmap_next_set(m, f, end), want_b);
	}

	/* runs, in batches of 1, 3, 32, 33, 34 and 64 (33: a word's 32 starts and one run still open) */
	for (mi = 0; mi < sizeof(batches) / sizeof(batches[0]); mi++) {
		max = batches[mi];
		total = 0;
		pos = start;
		while ((n = kvmdirty_bitmap_runs(m, &pos, end, runs, max)) > 0) {
			expect(n <= max, "%zu runs returned, max %zu", n, max);
			for (k = 0; k < n; k++, total++) {
				expect(total < nwant, "extra run at %" PRIu64, runs[k].first);
				expect(runs[k].first == want[total].first && runs[k].count == want[total].count,
					      "run %zu (max %zu) of [%" PRIu64 ", %" PRIu64 "): (%" PRIu64 ", %" PRIu64
					      "), want (%" PRIu64 ", %" PRIu64 ")",
					      total, max, start, end, runs[k].first, runs[k].count, want[total].first,
					      want[total].count);
			}
		}
		expect(total == nwant, "%zu runs, want %" PRIu64, total, nwant);
	}

	/* dirty chunks of several sizes */
	{
		static const uint64_t sizes[] = { 1, 64, 100, 512, 4096 };

		for (k = 0; k < 5; k++) {
			uint64_t cs = sizes[k], c = kvmdirty_bitmap_next_dirty_chunk(m, start, end, cs), from = start;

			while (true) {
				uint64_t want_c = end, lo;

				for (b = from; b < end; b++)
					if (ref_bit(m, b)) {
						want_c = b - b % cs;
						break;
					}
				expect(c == want_c, "chunk(%" PRIu64 ", size %" PRIu64 ") = %" PRIu64 ", want %" PRIu64,
					      from, cs, c, want_c);
				if (c >= end)
					break;
				lo = c < start ? start : c;
				expect(!kvmdirty_bitmap_is_clear(m, lo, c + cs < end ? c + cs : end), "chunk %" PRIu64 " is clear", c);
				from = c + cs;
				c = kvmdirty_bitmap_next_dirty_chunk(m, from, end, cs);
			}
		}
	}
}

static const double densities[] = { 0, 1e-5, 0.001, 0.01, 0.5, 1 };
static const uint64_t sizes[] = { 1, 63, 64, 65, 127, 1000, 4097, 65536 + 13, 300000 };

START_TEST(against_reference)
{
	uint64_t *buf = aligned_alloc(64, (300000 / 64 + 24) / 8 * 64); /* a multiple of 64 bytes */
	unsigned int d, s, off, k;

	select_impl(_i);
	for (d = 0; d < 6; d++) {
		for (s = 0; s < 9; s++) {
			uint64_t n = sizes[s];

			/* word offsets from a 64-byte boundary reach every alignment path */
			for (off = 0; off < 4; off++) {
				uint64_t *m = buf + off;

				fill(m, n, densities[d]);
				check_range(m, 0, n);
				check_range(m, n, n);
				check_range(m, n - 1, n);
				for (k = 0; k < 6; k++) {
					uint64_t a = rnd() % n, b = a + rnd() % (n - a + 1);

					check_range(m, a, b);
				}
			}
		}
	}
	free(buf);
}
END_TEST

START_TEST(set_clear_take)
{
	static uint64_t m[1024], ref[1024], dst[1024], refdst[1024];
	unsigned int round;

	select_impl(_i);
	for (round = 0; round < 2000; round++) {
		uint64_t a = rnd() % 65536, b = a + rnd() % (65536 - a + 1), x, fresh = 0, got;
		int op = (int)(rnd() % 5);

		if (round % 50 == 0) {
			fill(m, 65536, round % 100 ? 0.3 : 0.001);
			fill(dst, 65536, 0.01);
			memcpy(ref, m, sizeof(m));
			memcpy(refdst, dst, sizeof(dst));
		}
		switch (op) {
		case 0:
		case 1:
			(op ? kvmdirty_bitmap_set_atomic : kvmdirty_bitmap_set)(m, a, b);
			for (x = a; x < b; x++)
				ref[x / 64] |= 1ull << (x % 64);
			break;
		case 2:
		case 3:
			(op == 3 ? kvmdirty_bitmap_clear_atomic : kvmdirty_bitmap_clear)(m, a, b);
			for (x = a; x < b; x++)
				ref[x / 64] &= ~(1ull << (x % 64));
			break;
		default:
			got = kvmdirty_bitmap_take(dst, m, a, b);
			for (x = a; x < b; x++) {
				if (!ref_bit(ref, x))
					continue;
				fresh += !ref_bit(refdst, x);
				refdst[x / 64] |= 1ull << (x % 64);
				ref[x / 64] &= ~(1ull << (x % 64));
			}
			expect(got == fresh, "take [%" PRIu64 ", %" PRIu64 ") = %" PRIu64 " new, want %" PRIu64, a, b,
				      got, fresh);
			expect(!memcmp(dst, refdst, sizeof(dst)), "take: destination differs");
			break;
		}
		expect(!memcmp(m, ref, sizeof(m)), "op %d on [%" PRIu64 ", %" PRIu64 ") differs", op, a, b);
	}
}
END_TEST

/*
 * Producers set every bit of their share once, in random order, while the
 * consumer takes concurrently into a scratch bitmap; each bit must be taken
 * exactly once.
 */
#define CONC_BITS (1u << 20)
#define PRODUCERS 3

static uint64_t conc_src[CONC_BITS / 64];
static uint8_t conc_seen[CONC_BITS];
static volatile int producers_done;

static void *producer(void *arg)
{
	uintptr_t id = (uintptr_t)arg;
	uint64_t x = 0x9e3779b97f4a7c15ull * (id + 1), i, n = CONC_BITS / PRODUCERS;
	uint64_t *order = malloc(n * sizeof(*order));

	for (i = 0; i < n; i++)
		order[i] = id + i * PRODUCERS;
	shuffle_u64(order, n, &x);
	for (i = 0; i < n; i++)
		kvmdirty_bitmap_set_atomic(conc_src, order[i], order[i] + 1);
	free(order);
	__atomic_fetch_add(&producers_done, 1, __ATOMIC_RELEASE);
	return NULL;
}

START_TEST(concurrent_take)
{
	static uint64_t scratch[CONC_BITS / 64];
	pthread_t th[PRODUCERS];
	uint64_t total = 0, b, expected = (CONC_BITS / PRODUCERS) * PRODUCERS;
	uintptr_t i;
	bool last = false;

	select_impl(_i);
	memset(conc_src, 0, sizeof(conc_src));
	memset(conc_seen, 0, sizeof(conc_seen));
	producers_done = 0;
	for (i = 0; i < PRODUCERS; i++)
		ck_assert_uint_eq(pthread_create(&th[i], NULL, producer, (void *)i), 0);
	while (!last) {
		uint64_t lo = rnd() % CONC_BITS, hi = lo + rnd() % (CONC_BITS - lo + 1), got, pos;
		struct kvmdirty_run runs[64];
		size_t n, k;

		last = __atomic_load_n(&producers_done, __ATOMIC_ACQUIRE) == PRODUCERS;
		if (last) { /* everything set: one last take of the whole map */
			lo = 0;
			hi = CONC_BITS;
		}
		memset(scratch, 0, sizeof(scratch));
		got = kvmdirty_bitmap_take(scratch, conc_src, lo, hi);
		ck_assert_uint_eq(got, kvmdirty_bitmap_count(scratch, 0, CONC_BITS));
		pos = 0;
		while ((n = kvmdirty_bitmap_runs(scratch, &pos, CONC_BITS, runs, 64)) > 0)
			for (k = 0; k < n; k++)
				for (b = runs[k].first; b < runs[k].first + runs[k].count; b++)
					conc_seen[b]++;
		total += got;
	}
	for (i = 0; i < PRODUCERS; i++)
		pthread_join(th[i], NULL);
	for (b = 0; b < CONC_BITS; b++)
		expect(conc_seen[b] == (b < expected), "bit %" PRIu64 " taken %u times", b, conc_seen[b]);
	ck_assert_uint_eq(total, expected);
	ck_assert(kvmdirty_bitmap_is_clear(conc_src, 0, CONC_BITS));
}
END_TEST

static int stop_at_third(uint64_t first, uint64_t count, void *p)
{
	int *n = p;

	(void)first;
	(void)count;
	return ++*n == 3 ? 42 : 0;
}

START_TEST(for_each_stops)
{
	uint64_t m[4] = { 0x5555555555555555ull, 0, 0, 1 };
	int n = 0;

	select_impl(_i);
	ck_assert_uint_eq(kvmdirty_bitmap_for_each_run(m, 0, 256, stop_at_third, &n), 42);
	ck_assert_uint_eq(n, 3);
	n = 0;
	ck_assert_uint_eq(kvmdirty_bitmap_for_each_run(m, 190, 256, stop_at_third, &n), 0);
	ck_assert_uint_eq(n, 1);
	ck_assert_uint_eq(kvmdirty_bitmap_next_dirty_chunk(m, 0, 256, 0), 256);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("scan");
	TCase *tc = tcase_create("scan");

	tcase_set_timeout(tc, 240);
	tcase_add_loop_test(tc, against_reference, 0, 2);
	tcase_add_loop_test(tc, set_clear_take, 0, 2);
	tcase_add_loop_test(tc, concurrent_take, 0, 2);
	tcase_add_loop_test(tc, for_each_stops, 0, 2);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
