/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_H
#define KVMDIRTY_H

/*
 * libkvmdirty: KVM memslots and dirty-page tracking behind one small API.
 *
 * Conventions, for every function below:
 * - Functions returning int return >= 0 on success and a negative errno on
 *   failure.  A failed call changes nothing: no slot, index entry or
 *   allocation is left behind.
 * - Out-parameters are named ret_* and are written only on success.
 * - The library never prints, exits or aborts.
 * - Threading: a struct kvmdirty_vm is not locked.  Lookups
 *   (kvmdirty_region_from_*, kvmdirty_vm_gpa_to_hva, getters) may run
 *   concurrently with each other from any thread; calls that change regions
 *   (add, remove, move, logging on/off) must not run concurrently with any
 *   other call on the same VM.  Different VMs are independent.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVMDIRTY_VERSION_MAJOR 0
#define KVMDIRTY_VERSION_MINOR 1

struct kvmdirty_vm;
struct kvmdirty_region;

/* ---- VM handle and capability probe --------------------------------- */

/*
 * Open /dev/kvm, create a VM and probe its capabilities.
 *
 * Errors: -ENOENT /dev/kvm does not exist (KVM module not loaded, or no
 * hardware virtualisation); -EACCES or -EPERM no permission to open
 * /dev/kvm (add the user to the kvm group); -EPROTO the kernel's KVM API
 * version is not 12; -ENOMEM; any errno of KVM_CREATE_VM.
 * Ownership: the VM owns both fds and closes them in kvmdirty_vm_free().
 */
int kvmdirty_vm_new(struct kvmdirty_vm **ret_vm);

/*
 * Wrap a /dev/kvm fd and a VM fd a VMM already created, and probe.  The
 * library does not take ownership: kvmdirty_vm_free() leaves both fds open
 * and the caller must keep them open until then.  Slots the VMM made
 * itself are unknown to the library; slot ids it hands out may collide
 * with them, so a VMM adopting a VM lets the library create all memslots.
 * Errors: -EBADF a negative fd; -EPROTO; -ENOMEM; errno of the probe.
 */
int kvmdirty_vm_adopt(int kvm_fd, int vm_fd, struct kvmdirty_vm **ret_vm);

/*
 * Free the handle and the library's bookkeeping.  Regions are not removed
 * from KVM one by one: an owned VM fd is closed (which drops them all), an
 * adopted VM keeps its memslots.  NULL is a no-op.  Host memory given to
 * kvmdirty_region_add() belongs to the caller and is never unmapped.
 */
void kvmdirty_vm_free(struct kvmdirty_vm *vm);

/* The VM fd and the /dev/kvm fd, for the VMM's own ioctls (vCPUs...). */
int kvmdirty_vm_fd(const struct kvmdirty_vm *vm);
int kvmdirty_vm_kvm_fd(const struct kvmdirty_vm *vm);

/* What the probe found; read with kvmdirty_vm_cap(). */
enum kvmdirty_cap {
	/* 1 if KVM_SET_USER_MEMORY_REGION2 is offered (and used) */
	KVMDIRTY_CAP_USER_MEMORY2,
	/* number of memslots in address space 0 (KVM_CAP_NR_MEMSLOTS) */
	KVMDIRTY_CAP_NR_MEMSLOTS,
	/*
	 * KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2 flags the kernel accepts:
	 * bit 0 manual protect, bit 1 initially set; 0 when absent
	 */
	KVMDIRTY_CAP_MANUAL_PROTECT,
	/* largest dirty ring in bytes (16 bytes an entry); 0 when absent */
	KVMDIRTY_CAP_DIRTY_RING,
	/* same, for the acquire/release-ordered ring */
	KVMDIRTY_CAP_DIRTY_RING_ACQ_REL,
	/* 1 if a dirty ring may be backed by a bitmap (arm64) */
	KVMDIRTY_CAP_DIRTY_RING_WITH_BITMAP,
	/* 1 if read-only memslots are supported */
	KVMDIRTY_CAP_READONLY_MEM,
	/* largest vCPU count KVM accepts for this VM */
	KVMDIRTY_CAP_MAX_VCPUS,
	KVMDIRTY_CAP_COUNT
};

/*
 * Value of one probed capability, read from the handle (no ioctl).
 * Returns >= 0, or -EINVAL for an unknown cap.  Headers older than the
 * running kernel do not limit the probe: the uapi the library needs is
 * vendored.
 */
int64_t kvmdirty_vm_cap(const struct kvmdirty_vm *vm, enum kvmdirty_cap cap);

/* Host page size the VM's slots are aligned to (4096 on x86-64). */
uint64_t kvmdirty_vm_page_size(const struct kvmdirty_vm *vm);

/* ---- Regions (memslots) --------------------------------------------- */

/* KVM_MEM_LOG_DIRTY_PAGES: KVM logs writes to this region */
#define KVMDIRTY_REGION_LOG_DIRTY (1u << 0)
/* KVM_MEM_READONLY: guest writes exit to the VMM as MMIO */
#define KVMDIRTY_REGION_READONLY (1u << 1)

/*
 * Map size bytes of host memory at hva into the guest at gpa, in a memslot
 * whose id the library picks (the lowest free one; freed ids are reused).
 *
 * gpa, size and hva must be multiples of the page size; the host range
 * must be mapped when the call is made (the caller keeps it mapped until
 * the region is removed; it may alias another region's host range).
 * ret_region may be NULL; the region pointer stays valid until the region
 * is removed or the VM freed.  Cost: the KVM ioctl plus O(1) index updates.
 *
 * Errors: -EINVAL zero size, unaligned gpa/size/hva, a gpa range that
 * wraps, unknown flags; -E2BIG more pages than one memslot holds;
 * -EOPNOTSUPP READONLY without KVM support; -EFAULT the host range is not
 * (entirely) mapped or wraps; -EEXIST the guest range overlaps another
 * region; -ENOSPC every memslot is in use; -ENOMEM; any errno of
 * KVM_SET_USER_MEMORY_REGION(2).
 */
int kvmdirty_region_add(struct kvmdirty_vm *vm, uint64_t gpa, uint64_t size, void *hva,
			uint32_t flags, struct kvmdirty_region **ret_region);

/*
 * Delete the memslot and free region (the pointer is dead afterwards; the
 * next region given the same slot id may reuse its storage).  The host
 * memory stays the caller's.
 * Errors: -EINVAL region is NULL or not of this VM; errno of the ioctl (the
 * region then stays as it was).
 */
int kvmdirty_region_remove(struct kvmdirty_vm *vm, struct kvmdirty_region *region);

/*
 * Move a region to another guest physical address, keeping its slot, host
 * memory and flags (KVM's MOVE).  Errors: -EINVAL unaligned or wrapping
 * new_gpa, region not of this VM; -EEXIST the new range overlaps another
 * region; errno of the ioctl.  Moving to the current gpa is a no-op.
 */
int kvmdirty_region_move(struct kvmdirty_vm *vm, struct kvmdirty_region *region, uint64_t new_gpa);

/*
 * Turn KVM's dirty logging on or off for one region (its LOG_DIRTY flag).
 * Setting the state a region already has is a no-op.  Errors: -EINVAL;
 * errno of the ioctl.
 */
int kvmdirty_region_set_logging(struct kvmdirty_vm *vm, struct kvmdirty_region *region, bool enable);

/*
 * The same for every region.  All or nothing: when one region fails, those
 * already switched are switched back (best effort) and the first error is
 * returned.
 */
int kvmdirty_vm_set_logging(struct kvmdirty_vm *vm, bool enable);

/*
 * Lookups, O(1) whatever the number of regions: the region containing a
 * guest physical address, containing a host address, or holding a slot id;
 * NULL when there is none.  If host ranges alias, from_hva returns one of
 * the regions that contain hva.
 */
struct kvmdirty_region *kvmdirty_region_from_gpa(const struct kvmdirty_vm *vm, uint64_t gpa);
struct kvmdirty_region *kvmdirty_region_from_hva(const struct kvmdirty_vm *vm, const void *hva);
struct kvmdirty_region *kvmdirty_region_from_slot(const struct kvmdirty_vm *vm, uint32_t slot);

/* Host address backing gpa, or NULL if no region contains it. */
void *kvmdirty_vm_gpa_to_hva(const struct kvmdirty_vm *vm, uint64_t gpa);

/*
 * Regions in slot-id order: pass NULL for the first; returns NULL after
 * the last.  Not stable across add/remove.
 */
struct kvmdirty_region *kvmdirty_region_next(const struct kvmdirty_vm *vm,
					     const struct kvmdirty_region *prev);
/* Number of regions. */
unsigned int kvmdirty_vm_region_count(const struct kvmdirty_vm *vm);

/* Region attributes; the pointer must be a live region. */
uint64_t kvmdirty_region_gpa(const struct kvmdirty_region *region);
uint64_t kvmdirty_region_size(const struct kvmdirty_region *region);
void *kvmdirty_region_hva(const struct kvmdirty_region *region);
uint32_t kvmdirty_region_slot(const struct kvmdirty_region *region);
uint32_t kvmdirty_region_flags(const struct kvmdirty_region *region);

#ifdef __cplusplus
}
#endif

#endif
