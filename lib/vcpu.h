/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_VCPU_H
#define KVMDIRTY_VCPU_H

/*
 * The vCPU layer: creation or registration, kvm_run and ring mappings,
 * the run helper, and the one owner of the dirty ring protocol.  Whoever
 * harvests (a sync, a ring-full exit, the reaper, a vCPU being freed) goes
 * through kd_vcpus_harvest() or the run helper, under the set's lock, one
 * ring at a time: entries are taken into the set's own buffer,
 * KVM_RESET_DIRTY_RINGS re-protects their pages, and only then are they
 * published through the sink the layer above installed.  A sync that takes the lock after
 * another harvester therefore sees its pages; one that comes before sees
 * the entries in the ring itself.  Without a sink (no tracker) rings are
 * still harvested and reset, and what they held is dropped.
 */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "dirty-ring.h"
#include "kvm.h"
#include "pageset.h"

struct kd_vcpus;

struct kvmdirty_vcpu {
	struct kd_vcpus *owner;
	int fd;
	bool owns_fd;
	uint32_t id; /* KVM's vCPU id, KD_VCPU_NO_ID when it cannot be told */
	struct kvm_run *run;
	size_t run_size;
	struct kd_ring ring; /* gfns NULL when the VM has no dirty ring */
	/* KVM's binary statistics of the vCPU, and where its page-fault count is; -1: none */
	int stats_fd;
	uint64_t fault_off;

	/*
	 * Dirty accounting and the dirty limit (ring mode).  Written under
	 * the set's lock by whoever harvests this vCPU's ring; the fields
	 * read elsewhere (stats, the vCPU's own thread) are read atomically.
	 */
	uint64_t dirtied;    /* ring entries harvested for this vCPU */
	uint64_t win_pages;  /* ... in the set's current rate window */
	uint64_t rate;	     /* pages/s over the last closed window */
	uint64_t limit;	     /* pages/s, 0: none */
	int64_t budget_ns;   /* time of quota saved (< 0: owed), as of budget_at */
	uint64_t budget_at;
	uint64_t hold_until; /* CLOCK_MONOTONIC ns the vCPU stays out of KVM_RUN until; 0: none */
	uint64_t held_ns, holds, kicks, full_exits;
	/*
	 * kvmdirty_vcpu_count(): the distinct pages its harvests reported
	 * since the last count, once a first count turned it on (seen.keys
	 * set; NULL: off); under the set's lock.  seen_hint (atomic) sizes
	 * the next set.
	 */
	struct kd_pageset seen;
	uint64_t seen_ns, seen_hint;
	/*
	 * The set's loss_seq at its last two counts: a loss in any ring
	 * leaves pages writable, for every vCPU, until the tracker's next
	 * sync re-protects them, so the interval that saw it and the next
	 * are both incomplete.
	 */
	uint64_t seen_loss[2];
	/*
	 * Kicks: while the vCPU's thread is in kvmdirty_vcpu_run(), in_run is
	 * set and thread names it.  A kicker raises kickers before it looks at
	 * in_run, and the thread, leaving, waits for kickers to drop after
	 * clearing in_run: so a thread is never signalled once it has left.
	 */
	pthread_t thread;
	int in_run, kickers, holding;
	uint64_t kick_seq;  /* kicks sent */
	uint64_t kick_seen; /* kick_seq when the thread last took an EINTR as the library's */
	uint64_t kick_sigs; /* bit n: kicks were sent with signal n+1 (kick_signo's bit stays; others go once eaten) */
};

/* The set's dirty-rate window and the quota a limited vCPU may save up. */
#define KD_RATE_WINDOW_NS 100000000ull
#define KD_LIMIT_BURST_NS 10000000ll
/* The longest a held vCPU sleeps before it looks at immediate_exit again. */
#define KD_HOLD_SLICE_NS 2000000ull
/* The highest dirty limit, pages/s (keeps the budget arithmetic in 64 bits). */
#define KD_LIMIT_MAX (1ull << 32)

#define KD_VCPU_NO_ID UINT32_MAX

/*
 * The ring of a vCPU freed from the library.  The vCPU lives on in KVM
 * (KVM never destroys one before its VM), and the VMM may run it through
 * a copy of its fd or register it again: its ring stays mapped and
 * harvested, and a vCPU registered again with its id takes it over, with
 * the ring's state (where the library is in it, and KVM's reset index).
 */
struct kd_parked_ring {
	uint32_t id;
	struct kd_ring ring;
};

struct kd_ring_sink {
	/*
	 * entries of vcpu's ring, harvested and re-protected: their pages may
	 * be read now (vcpu is NULL for the ring of a vCPU freed from the library)
	 */
	void (*pages)(void *ctx, struct kvmdirty_vcpu *vcpu, const struct kd_ring_entry *e, uint32_t n);
	/* enum kd_ring_loss bits for vcpu's ring (NULL: a freed vCPU's) */
	void (*lost)(void *ctx, struct kvmdirty_vcpu *vcpu, unsigned int loss);
	/* a KVM_EXIT_DIRTY_RING_FULL of vcpu was handled, in ns */
	void (*full_exit)(void *ctx, struct kvmdirty_vcpu *vcpu, uint64_t ns);
};

struct kd_vcpus {
	struct kd_kvm *kvm;
	/* guards the array, the sink, and each harvest from its first entry to its publishing */
	pthread_mutex_t lock;
	struct kvmdirty_vcpu **v;
	uint32_t n, cap;
	struct kd_parked_ring *parked;
	uint32_t nr_parked, parked_cap;
	const struct kd_ring_sink *sink;
	void *sink_ctx;
	/* entries between their harvest and their publishing (dirty-ring.h) */
	struct kd_ring_room room;
	/* every ring, for a harvest: the vCPUs' in order, then the parked ones */
	struct kd_ring **rings;
	uint32_t rings_cap;
	uint64_t kernel_ns; /* in KVM_RESET_DIRTY_RINGS, for kd_vcpus_harvest() */
	uint64_t win_start; /* the rate window's start, CLOCK_MONOTONIC ns */
	uint64_t loss_seq;  /* ring losses seen, any ring (under the lock) */
	/*
	 * Some ring's reset may have failed since retry_failed() last found
	 * none (under the lock): without it, each collect would look at every
	 * ring first, O(vCPUs) per ring and O(vCPUs^2) per harvest.
	 */
	bool any_failed;
	int kick_signo;	    /* signal that takes a vCPU over its limit out of KVM_RUN; 0: none */
	uint32_t kick_gen;  /* kick_signo's changes, counted (atomic) */
};

void kd_vcpus_init(struct kd_vcpus *vs, struct kd_kvm *kvm);
/* Free every vCPU still registered. */
void kd_vcpus_fini(struct kd_vcpus *vs);

int kd_vcpu_create(struct kd_vcpus *vs, uint32_t id, struct kvmdirty_vcpu **ret_vcpu);
int kd_vcpu_add(struct kd_vcpus *vs, int vcpu_fd, struct kvmdirty_vcpu **ret_vcpu);
uint32_t kd_vcpus_count(struct kd_vcpus *vs);

/* Install (or, with NULL, remove) the sink; returns once no harvest uses the old one. */
void kd_vcpus_set_sink(struct kd_vcpus *vs, const struct kd_ring_sink *sink, void *ctx);

/*
 * Harvest every ring, reset, publish: the rings in batches, each with one
 * KVM_RESET_DIRTY_RINGS (O(vCPUs) in KVM for all of them, not for each),
 * a ring with a history of KVM pushing past it alone.  Returns 0 or
 * -errno of a reset (the entries are then reported as
 * KD_RING_UNPROTECTED, not published); *ret_kernel_ns gets the time spent
 * in the reset ioctl.
 */
int kd_vcpus_harvest(struct kd_vcpus *vs, uint64_t *ret_kernel_ns);

/* The signal for kicks (0: none); -EINVAL unless a handler is installed for it. */
int kd_vcpus_set_kick_signal(struct kd_vcpus *vs, int signo);

#endif
