/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_GUEST_H
#define KVMDIRTY_MIGRATE_GUEST_H

/*
 * What the migration engine knows of a guest, all of it: its memory
 * regions (from libkvmdirty: gpa, size, host address), its vCPU count,
 * its tracker (source side), and four calls into the VMM that runs it.
 * No engine file includes a VMM's header: a VMM fills this in
 * (testguest.c does it for the test VM of examples/vmm).
 */
#include <kvmdirty.h>

#include "stream.h"

struct mig_guest_ops {
	/*
	 * vCPU i's state, read on the source with the vCPUs paused, written
	 * on the destination before any vCPU ran; 0 or -errno.
	 */
	int (*vcpu_save)(void *ctx, unsigned int vcpu, struct mig_vcpu_state *ret_state);
	int (*vcpu_load)(void *ctx, unsigned int vcpu, const struct mig_vcpu_state *state);
	/*
	 * Source only.  pause takes every vCPU out of KVM_RUN and keeps it
	 * out until resume, whatever the guest does (stop-and-copy, then a
	 * final sync); resume lets them go on where they were (after a failed
	 * migration the guest runs on here).
	 */
	void (*pause)(void *ctx);
	void (*resume)(void *ctx);
};

struct mig_guest_region {
	struct kvmdirty_region *region; /* NULL for memory outside libkvmdirty (tests) */
	uint64_t gpa, size;
	void *hva;
};

struct mig_guest {
	unsigned int nr_regions;
	struct mig_guest_region regions[MIG_MAX_REGIONS];
	unsigned int nr_vcpus;
	struct kvmdirty_tracker *tracker; /* source: tracks the regions above */
	const struct mig_guest_ops *ops;
	void *ctx;
};

/*
 * Set g's regions to vm's, in the library's order (both ends list them
 * the same way); -E2BIG past MIG_MAX_REGIONS.
 */
int mig_guest_set_regions(struct mig_guest *g, const struct kvmdirty_vm *vm);

/*
 * The state a VCPU record carries, through KVM's ioctls on a vCPU fd
 * (registers, special registers, XSAVE, the MSRs of mig_msr_index): for
 * a VMM whose vcpu_save and vcpu_load need nothing else.
 */
int mig_vcpu_save_kvm(int vcpu_fd, struct mig_vcpu_state *ret_state);
int mig_vcpu_load_kvm(int vcpu_fd, const struct mig_vcpu_state *state);

#endif
