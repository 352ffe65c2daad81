// SPDX-License-Identifier: MIT
/*
 * bench-scan: the scanner's run iteration against, in the same run on the
 * same bitmap, a word-at-a-time find-next-set-bit loop (the shape of
 * QEMU's migration bitmap walk), a bit-by-bit loop (a per-page dirty
 * check), and the machine's read-bandwidth roofline for the buffer (an
 * OR-reduction with wide loads).  Bitmaps of 3 MiB (a 96 GiB guest) and
 * 256 MiB, at densities 0, 0.001, 0.01, 0.5 and 1.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <kvmdirty.h>

#include "bitmap-fill.h"
#include "scan.h"

struct result {
	uint64_t bits, sum; /* set bits seen, and a checksum of their positions */
};

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void lib_runs(const uint64_t *map, uint64_t nbits, struct result *r)
{
	struct kvmdirty_run runs[256];
	uint64_t pos = 0;
	size_t n, i;

	while ((n = kvmdirty_bitmap_runs(map, &pos, nbits, runs, 256)) > 0) {
		for (i = 0; i < n; i++) {
			r->bits += runs[i].count;
			r->sum += runs[i].first * runs[i].count + runs[i].count * (runs[i].count - 1) / 2;
		}
	}
}

/* find_next_bit() as VMMs carry it: one word at a time, one call per bit. */
static __attribute__((noinline)) uint64_t find_next_bit(const uint64_t *map, uint64_t size, uint64_t from)
{
	uint64_t i = from / 64, w;

	if (from >= size)
		return size;
	w = map[i] & (~0ull << (from % 64));
	while (!w) {
		if (++i >= (size + 63) / 64)
			return size;
		w = map[i];
	}
	from = i * 64 + (uint64_t)__builtin_ctzll(w);
	return from < size ? from : size;
}

static void word_loop(const uint64_t *map, uint64_t nbits, struct result *r)
{
	uint64_t b;

	for (b = find_next_bit(map, nbits, 0); b < nbits; b = find_next_bit(map, nbits, b + 1)) {
		r->bits++;
		r->sum += b;
	}
}

static void bit_loop(const uint64_t *map, uint64_t nbits, struct result *r)
{
	uint64_t b;

	for (b = 0; b < nbits; b++) {
		if ((map[b / 64] >> (b % 64)) & 1) {
			r->bits++;
			r->sum += b;
		}
	}
}

static uint64_t roof_sink;
static const struct kd_scan_ops *roof_ops; /* the widest loads this CPU has */

static void roofline(const uint64_t *map, uint64_t nbits, struct result *r)
{
	roof_sink += roof_ops->or_reduce(map, KVMDIRTY_BITMAP_WORDS(nbits));
	(void)r;
}

/* GB/s over the bitmap's bytes; repeats until min_ns passed. */
static double measure(void (*fn)(const uint64_t *, uint64_t, struct result *), const uint64_t *map,
		      uint64_t nbits, double min_ns, struct result *ret)
{
	double t0 = now_ns(), t;
	uint64_t reps = 0;

	do {
		memset(ret, 0, sizeof(*ret));
		fn(map, nbits, ret);
		reps++;
		t = now_ns();
	} while (t - t0 < min_ns);
	return (double)(nbits / 8) * (double)reps / (t - t0);
}

int main(void)
{
	static const uint64_t mib[] = { 3, 256 };
	static const double dens[] = { 0, 0.001, 0.01, 0.5, 1, 0.01 };
	/* the last case: the same density in runs of 64 pages, as guests dirty memory */
	static const unsigned int run_len[] = { 1, 1, 1, 1, 1, 64 };
	uint64_t rng = 0x9e3779b97f4a7c15ull;
	unsigned int s, d;
	int status = 0;

	if (kd_scan_select("avx2") < 0) {
		printf("bench-scan: this CPU has no AVX2: the roofline and library figures use portable code\n");
		kd_scan_select("portable");
	}
	roof_ops = kd_scan_ops();
	printf("bench-scan: scanner kernels: %s\n", kvmdirty_bitmap_impl());
	for (s = 0; s < 2; s++) {
		uint64_t nbits = mib[s] << 23, *map = aligned_alloc(64, mib[s] << 20);

		if (!map) {
			perror("bench-scan");
			return 1;
		}
		for (d = 0; d < 6; d++) {
			struct result rl, rp, rw, rb, rr;
			double lib, port, word, bit, roof, min_ns = 300e6;

			bitmap_fill(map, nbits, dens[d], run_len[d], &rng);
			roof = measure(roofline, map, nbits, min_ns, &rr);
			kd_scan_select(roof_ops->name);
			lib = measure(lib_runs, map, nbits, min_ns, &rl);
			kd_scan_select("portable");
			port = measure(lib_runs, map, nbits, min_ns, &rp);
			kd_scan_select(roof_ops->name);
			word = measure(word_loop, map, nbits, min_ns, &rw);
			bit = measure(bit_loop, map, nbits, 0, &rb);
			if (rl.bits != rw.bits || rl.sum != rw.sum || rb.bits != rw.bits || rb.sum != rw.sum ||
			    rp.bits != rw.bits || rp.sum != rw.sum) {
				fprintf(stderr, "bench-scan: %" PRIu64 " MiB at %g: methods disagree (%" PRIu64 " vs %" PRIu64
						" vs %" PRIu64 " bits)\n",
					mib[s], dens[d], rl.bits, rw.bits, rb.bits);
				status = 1;
			}
			printf("scan size_mib=%" PRIu64 " density=%g%s lib_gbps=%.2f wordloop_gbps=%.2f bitloop_gbps=%.3f "
			       "roofline_gbps=%.2f vs_wordloop=%.1f vs_bitloop=%.0f of_roofline=%.2f portable_gbps=%.2f "
			       "set_bits=%" PRIu64 "\n",
			       mib[s], dens[d], run_len[d] > 1 ? " runs=64" : "", lib, word, bit, roof, lib / word, lib / bit, lib / roof, port, rl.bits);
			fflush(stdout);
		}
		free(map);
	}
	return status;
}
