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
	 * Optional (NULL: the VM has no state of its own to move, a VM
	 * record with no part saved goes): the VM's state (irqchip, PIT,
	 * clock), saved on the source after its vCPUs', loaded on the
	 * destination after its vCPUs'; 0 or -errno.
	 */
	int (*vm_save)(void *ctx, struct mig_vm_state *ret_state);
	int (*vm_load)(void *ctx, const struct mig_vm_state *state);
	/*
	 * Optional (NULL: no devices; a stream or snapshot of the guest then
	 * carries none): the VMM's devices' state as one byte string, opaque
	 * to the engine, of any size up to MIG_DEVICES_MAX (a serial port's
	 * few bytes, a device's megabytes).  devices_save runs on the source
	 * with the vCPUs paused, after vm_save; *ret_state is malloc()ed, the
	 * engine frees it (NULL with *ret_len 0: nothing).  devices_load runs
	 * on the destination after vm_load, before any vCPU runs; state is
	 * the engine's, valid for the call.  A load that fails (-errno)
	 * refuses the stream: the guest runs on at the source.  A stream
	 * with device state to a guest without devices_load is refused.
	 */
	int (*devices_save)(void *ctx, void **ret_state, size_t *ret_len);
	int (*devices_load)(void *ctx, const void *state, size_t len);
	/*
	 * Optional, together (NULL: all of the devices' state goes in the
	 * pause): the part of it the VMM can give while the guest still runs
	 * (a device's bulk), saved and sent once, in the first pre-copy pass
	 * after its pages, so that it does not fall into the downtime; devices_save
	 * then gives the rest at the pause.  The destination keeps it until
	 * the stream is complete, then loads it (devices_load_live) before
	 * devices_load's part, for every stream and restore (0 bytes: none
	 * given); a load that fails refuses the stream.  Both parts together
	 * at most MIG_DEVICES_MAX; the same ownership as devices_save/_load.
	 * A snapshot saves both at its pause, and a restore loads both.
	 */
	int (*devices_save_live)(void *ctx, void **ret_state, size_t *ret_len);
	int (*devices_load_live)(void *ctx, const void *state, size_t len);
	/*
	 * Source only.  pause takes every vCPU out of KVM_RUN and keeps it
	 * out until resume, whatever the guest does (stop-and-copy, then a
	 * final sync); resume lets them go on where they were (after a failed
	 * migration the guest runs on here).
	 */
	void (*pause)(void *ctx);
	void (*resume)(void *ctx);
	/*
	 * Source, optional (NULL: unknown): how far vCPU i's workload has
	 * got, in units of the guest's own that only grow (pages written,
	 * work done), from any thread.  The stats report each vCPU's speed
	 * from it, before and during the migration.
	 */
	uint64_t (*progress)(void *ctx, unsigned int vcpu);
	/*
	 * Source, optional (NULL: the bitmap modes are not throttled): keep
	 * vCPU i in KVM_RUN for only permille/1000 of each short period
	 * (1000: always), as the throttle asks where a dirty page cannot be
	 * traced to a ring; 0 or -errno.  kept_out_ns: the time it was kept
	 * out so far.  In DIRTY_RING mode the engine sets libkvmdirty's
	 * per-vCPU dirty limits on the vCPUs below instead.
	 */
	int (*set_run_share)(void *ctx, unsigned int vcpu, unsigned int permille);
	uint64_t (*kept_out_ns)(void *ctx, unsigned int vcpu);
};

struct mig_guest_region {
	struct kvmdirty_region *region; /* NULL for memory outside libkvmdirty (tests) */
	uint64_t gpa, size;
	void *hva;
	/*
	 * Destination: a bitmap of the pages that may be non-zero, or NULL
	 * (unknown: every page may be).  mig_guest_zero_known() sets it up;
	 * the destination then sets a page's bit when it writes the page and
	 * leaves a page whose bit is clear alone for a ZERO record: it is
	 * neither faulted in nor cleared.
	 */
	uint64_t *written;
};

struct mig_guest {
	unsigned int nr_regions; /* at most MIG_MAX_REGIONS */
	/* [nr_regions]: mig_guest_set_regions() allocates it, mig_guest_release() frees it */
	struct mig_guest_region *regions;
	unsigned int nr_vcpus;
	struct kvmdirty_tracker *tracker; /* source: tracks the regions above */
	/*
	 * Source: the vCPUs as libkvmdirty knows them (NULL: not throttled),
	 * for their dirty rates, their page-fault counts, and the dirty limit
	 * (DIRTY_RING; the VMM runs them through kvmdirty_vcpu_run()).
	 */
	struct kvmdirty_vcpu *vcpu[MIG_MAX_VCPUS];
	const struct mig_guest_ops *ops;
	void *ctx;
};

/*
 * Set g's regions to vm's, in the library's order (both ends list them
 * the same way): an array of its own, which mig_guest_release() frees
 * (g's earlier one is freed here); -E2BIG past MIG_MAX_REGIONS, -ENOMEM.
 */
int mig_guest_set_regions(struct mig_guest *g, const struct kvmdirty_vm *vm);

/*
 * How long either end of a migration of g waits for its peer without
 * progress: timeout_ms (the -T of the tools; 0: as long as it takes), and
 * on top of it what the peer may spend in steps that grow with the guest
 * and say nothing meanwhile: turning logging on for its regions, a sync,
 * pausing and saving or loading its vCPUs, checking its pages at END.
 * 1 ms a vCPU, 1 ms a region, 50 ms a GiB of memory: about ten times what
 * these steps were seen to take on a nested host (1,024 vCPUs paused,
 * saved and synced in about 115 ms).
 */
static inline uint64_t mig_guest_wait_ms(const struct mig_guest *g, uint64_t timeout_ms)
{
	uint64_t bytes = 0;
	unsigned int i;

	if (!timeout_ms)
		return 0;
	for (i = 0; i < g->nr_regions; i++)
		bytes += g->regions[i].size;
	return timeout_ms + g->nr_vcpus + g->nr_regions + 50 * (bytes >> 30);
}

/*
 * Destination: g's memory is all zero now (fresh anonymous memory,
 * faulted in or not, as a VMM has it before a stream): keep a bitmap a
 * region of the pages the streams write (see mig_guest_region.written),
 * so that ZERO records for the others cost nothing.  0 or -ENOMEM (the
 * bitmaps are then NULL).  mig_guest_release() frees them.
 */
int mig_guest_zero_known(struct mig_guest *g);
/* The written bitmaps and the regions array freed (a region array a caller set is freed too); g has no regions. */
void mig_guest_release(struct mig_guest *g);

/*
 * A vCPU's whole state (stream.h: struct mig_vcpu_state) through KVM's
 * ioctls on its fd, for a VMM whose vcpu_save and vcpu_load need nothing
 * else: saved with the vCPU out of KVM_RUN (the parts it lacks, as an
 * in-kernel LAPIC without an irqchip, left out), loaded in the order KVM
 * requires before it runs.  0, or -errno of the ioctl that failed
 * (-EINVAL: KVM took fewer MSRs than given; -E2BIG: more MSRs readable
 * than a record holds).  Any thread; the first call reads the host's MSR
 * list from /dev/kvm.
 */
int mig_vcpu_save_kvm(int vcpu_fd, struct mig_vcpu_state *ret_state);
int mig_vcpu_load_kvm(int vcpu_fd, const struct mig_vcpu_state *state);

/*
 * The VM's own state (stream.h: struct mig_vm_state) through KVM's
 * ioctls on its fd: the in-kernel irqchip and PIT where the VM has them,
 * the clock's value always; loaded in that order.  0, or -errno of the
 * ioctl that failed.  Any thread, the vCPUs out of KVM_RUN.
 */
int mig_vm_save_kvm(int vm_fd, struct mig_vm_state *ret_state);
int mig_vm_load_kvm(int vm_fd, const struct mig_vm_state *state);

/*
 * Whether this host's KVM can load st's MSRs: each one that its
 * KVM_GET_MSR_INDEX_LIST names or a kernel sets (vcpu.c).  0, or -EPROTO
 * naming the first other one ("WHAT.msrs[3]: MSR 0x...").  0 where there
 * is no /dev/kvm to ask.
 */
int mig_vcpu_state_host_check(const struct mig_vcpu_state *st, const char *what, char *err, size_t len);

#endif
