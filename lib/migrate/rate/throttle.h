/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_THROTTLE_H
#define KVMDIRTY_MIGRATE_THROTTLE_H

/*
 * The source's throttle: from what it measures as it goes (the link, the
 * pages the guest makes dirty again after they were sent, each vCPU's own
 * dirtying) it decides how much each vCPU may dirty.  No I/O, no clock:
 * the source feeds it samples and applies what it returns, as per-vCPU
 * dirty limits (DIRTY_RING, where harvests are charged to vCPUs) or as
 * run shares (the bitmap modes, where a vCPU's dirtying is told by the
 * page faults KVM counts for it).
 *
 * Policy.  Pre-copy converges when what is dirtied again during a pass is
 * smaller than the pass: the guest's re-dirtying rate below the link
 * rate.  Once it exceeds a share of the link (alpha, a third by default:
 * each pass then a third of the one before, about five passes from 512
 * MiB to a 30 ms rest on this rig), the dirtying vCPUs together are held
 * to that share, split by water-filling: a vCPU that dirties less than an
 * equal part keeps all of its own, the others share the rest equally.  A
 * vCPU that does not dirty is never slowed.  If the guest still re-dirties
 * more than the target (a vCPU's measure overstates or understates its
 * part), the budget is corrected by the ratio, and relaxed again as the
 * guest falls well below it.
 */
#include <stdbool.h>
#include <stdint.h>

#define MIG_THROTTLE_MAX_VCPUS 1024 /* MIG_MAX_VCPUS: every vCPU a stream carries */
/* below this share of the link a vCPU counts as not dirtying */
#define MIG_THROTTLE_IDLE 0.01

struct mig_throttle {
	bool ring; /* limits in pages/s; else run shares in permille */
	unsigned int nr_vcpus;
	double alpha;
	bool engaged;
	double correction; /* budget = correction * alpha * link */
	double target;	   /* alpha * link at the last update, pages/s */
	double free_rate[MIG_THROTTLE_MAX_VCPUS]; /* estimated unthrottled rate, pages/s */
	uint64_t limit[MIG_THROTTLE_MAX_VCPUS];	  /* ring: pages/s, 0 none */
	unsigned int share[MIG_THROTTLE_MAX_VCPUS]; /* bitmap: permille in KVM_RUN, 1000 none */
};

struct mig_throttle_sample {
	double link_pages_per_s; /* the link, measured while busy */
	double redirty_per_s;	 /* pages made pending again per second (sent, then written) */
	/*
	 * each vCPU's dirtying as measured under the current throttle:
	 * ring entries per second (ring), page faults per second (bitmap)
	 */
	double vcpu_rate[MIG_THROTTLE_MAX_VCPUS];
	/*
	 * ring: the vCPU was held by its limit for part of the sample: it
	 * would have dirtied more (its rate, charged a ring at a time, says
	 * too little of what it wants)
	 */
	bool vcpu_held[MIG_THROTTLE_MAX_VCPUS];
};

/* alpha <= 0 or >= 1 picks the default third. */
void mig_throttle_init(struct mig_throttle *t, bool ring, unsigned int nr_vcpus, double alpha);

/* Take a sample; true when a limit or share changed (the caller applies them). */
bool mig_throttle_update(struct mig_throttle *t, const struct mig_throttle_sample *s);

#endif
