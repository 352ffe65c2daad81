/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_RATE_H
#define KVMDIRTY_MIGRATE_RATE_H

/*
 * A guest's dirty rate as an operator watches it, before deciding to
 * migrate and while a migration runs: a counting consumer of the guest's
 * tracker (kvmdirty_consumer_count(): it takes nothing from any other
 * consumer, so a migration beside it sends the pages it would send
 * without it), and each vCPU's part from the library's per-vCPU counts:
 * in DIRTY_RING mode the distinct pages its ring reported over the
 * interval (kvmdirty_vcpu_count(): a page rewritten after each harvest
 * still counts once); in the bitmap modes, which cannot tell whose write
 * a dirty bit is, the write faults KVM took for it (kvmdirty_vcpu_stats():
 * after a count protects every page it took again, a vCPU's first write
 * to each page faults once, and a harvest between counts makes it fault
 * again).
 *
 * One thread samples; mig_rate_sample() and mig_rate_free() from it.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kvmdirty.h>

struct mig_rate;

struct mig_rate_sample {
	uint64_t t_ms;	      /* when, since mig_rate_new() */
	uint64_t ns;	      /* the interval since the sample before (or mig_rate_new()) */
	uint64_t pages;	      /* distinct pages of the guest written over it */
	uint64_t pages_per_s; /* the guest's rate */
	bool by_ring;	      /* vcpu_pages[] from the rings (DIRTY_RING), else from write faults */
	unsigned int nr_vcpus;
	const uint64_t *vcpu_pages_per_s; /* [nr_vcpus], the sampler's until the next sample */
};

/*
 * Watch the guest of tracker t, its vCPUs vcpus[0..n): a counting
 * consumer that joins with nothing pending and claims every region
 * (kvmdirty_consumer_start(): logging on where it was off, and on while
 * the sampler lives).  0, or -errno with one line
 * in err.
 */
int mig_rate_new(struct kvmdirty_tracker *t, struct kvmdirty_vcpu *const *vcpus, unsigned int n,
		 struct mig_rate **ret_r, char *err, size_t len);
/* The rates since the sample before: 0, or -errno (the count's; the interval goes on). */
int mig_rate_sample(struct mig_rate *r, struct mig_rate_sample *ret_s);
/*
 * A sample as one line:
 *   rate t_ms=T guest_pages_per_s=P guest_bytes_per_s=B vcpu_by=ring|faults
 *        vcpu0=P0 vcpu0_bytes_per_s=B0 vcpu1=...
 * or with json one JSON object:
 *   {"t_ms":T,"guest_pages_per_s":P,"guest_bytes_per_s":B,"vcpu_by":"ring",
 *    "vcpus":[{"pages_per_s":P0,"bytes_per_s":B0},...]}
 * Truncated to len (a line of 64 vCPUs needs about 3 KiB; 256 bytes and 96 a
 * vCPU always do).
 */
void mig_rate_format(const struct mig_rate_sample *s, bool json, char *buf, size_t len);
/* The consumer freed, its claim with it (logging off where no one else needs it); NULL: no-op. */
void mig_rate_free(struct mig_rate *r);

#endif
