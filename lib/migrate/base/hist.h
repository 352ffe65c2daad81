/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_HIST_H
#define KVMDIRTY_MIGRATE_HIST_H

/*
 * A histogram of service times (faults served by a lazy restore or by
 * post-copy): MIG_HIST + 1 buckets, 100 ns steps to 100 us, 10 us steps
 * to 10 ms, then one for the rest.  Bucket i holds the times at most
 * mig_hist_bound_us(i) and above bucket i - 1's bound.
 */
#include <stdint.h>

#define MIG_HIST 2000

static inline unsigned int mig_hist_bucket(uint64_t ns)
{
	uint64_t x = ns ? ns - 1 : 0;

	if (x < 100000)
		return (unsigned int)(x / 100);
	if (x < 10000000)
		return 1000 + (unsigned int)((x - 100000) / 10000);
	return MIG_HIST;
}

static inline double mig_hist_bound_us(unsigned int i)
{
	if (i < 1000)
		return (i + 1) * 0.1;
	if (i < MIG_HIST)
		return 100.0 + (i - 999) * 10.0;
	return 1e12;
}

/* The median and the 99th percentile of hist (each the bound of its bucket, at most max_us); 0 when empty. */
static inline void mig_hist_pcts(const uint64_t *hist, double max_us, double *ret_p50, double *ret_p99)
{
	uint64_t total = 0, seen = 0, p50, p99;
	unsigned int i;

	*ret_p50 = *ret_p99 = 0;
	for (i = 0; i <= MIG_HIST; i++)
		total += hist[i];
	p50 = (total + 1) / 2;
	p99 = total - total / 100;
	for (i = 0; i <= MIG_HIST && total; i++) {
		double b = mig_hist_bound_us(i) < max_us ? mig_hist_bound_us(i) : max_us;

		seen += hist[i];
		if (!*ret_p50 && seen >= p50)
			*ret_p50 = b;
		if (seen >= p99) {
			*ret_p99 = b;
			break;
		}
	}
}

#endif
