/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_H
#define KVMDIRTY_H

/*
 * libkvmdirty: KVM memslots and dirty-page tracking behind one small API.
 *
 * Conventions, for every function below:
 * - Functions returning int return >= 0 on success and a negative errno on
 *   failure.  A failed call changes nothing: no slot, index entry or
 *   allocation is left behind.  Pointer arguments are checked first: a
 *   NULL object gives -EINVAL (getters return 0, NULL or -EINVAL as they
 *   say; the *_free functions do nothing).
 * - Out-parameters are named ret_* and are written only on success.
 * - The library never prints, exits or aborts.
 * - Memslots, dirty logging and ring resets go through the library only.
 *   Logging switched off behind it is detected in bitmap modes (the region
 *   is then reported whole), not with the dirty ring; a reset issued
 *   behind it is noticed in simple cases, but the ring recovery after
 *   KVM pushed past a full ring relies on knowing every reset.
 *
 * Threading, per VM (different VMs are independent):
 * - Changes: region add, remove, move and logging on/off, and tracker
 *   start and stop, may be called from any thread but not concurrently
 *   with each other.  They may run concurrently with everything below.
 * - Consumers (kvmdirty_consumer_*): each consumer's calls from one
 *   thread at a time; different consumers of one tracker (the tracker's
 *   own included, which kvmdirty_tracker_sync and _next act on) from
 *   different threads at once, concurrently with everything else.
 * - Marks (kvmdirty_tracker_mark_dirty_*): any thread, any time, also
 *   while regions are added, moved or removed: a mark sees each region
 *   whole, before or after a change.
 * - vCPUs: kvmdirty_vcpu_run() from each vCPU's thread, concurrently with
 *   everything else; its ring-full handling and the reaper may harvest
 *   while a sync does.  vCPUs may be created or freed meanwhile (a vCPU is
 *   freed only when its thread is out of kvmdirty_vcpu_run()).
 * - Lookups (kvmdirty_region_from_*, kvmdirty_vm_gpa_to_hva,
 *   kvmdirty_region_next, the region getters) take no lock: they may run
 *   concurrently with each other, with sync, next and marks, but not with
 *   a change of the regions they look at.
 * - kvmdirty_tracker_free() and kvmdirty_vm_free() run when nothing else
 *   uses the object; vCPUs may go on running across a tracker's free.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * KVMDIRTY_VERSION_MAJOR, _MINOR, _MICRO and _STRING: the version this
 * header came with (generated from the project version).
 */
#include "kvmdirty-version.h"

#ifdef __cplusplus
extern "C" {
#endif

struct kvmdirty_vm;
struct kvmdirty_region;
struct kvmdirty_tracker;
struct kvmdirty_consumer;
struct kvmdirty_vcpu;
struct kvm_run;

/* ---- VM handle and capability probe --------------------------------- */

/*
 * Open /dev/kvm, create a VM and probe its capabilities.
 *
 * Errors: -ENOENT /dev/kvm does not exist (KVM module not loaded, or no
 * hardware virtualisation); -EACCES or -EPERM no permission to open
 * /dev/kvm (add the user to the kvm group); -ENXIO or -ENODEV the node
 * exists but no KVM driver answers it; -ENOTTY /dev/kvm is not a KVM device
 * (KVM_GET_API_VERSION, the first ioctl, is refused); -EPROTO the kernel's
 * KVM API version is not 12; -ENOMEM; any errno of KVM_CREATE_VM.
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
 * Free the handle and the library's bookkeeping, its tracker and every
 * vCPU registered with it (their pointers die; vCPU fds the VMM passed to
 * kvmdirty_vcpu_add() stay open).  Regions are not removed from KVM one by
 * one: an owned VM fd is closed (which drops them all), an adopted VM keeps
 * its memslots.  NULL is a no-op.  Host memory given to
 * kvmdirty_region_add() belongs to the caller and is never unmapped.
 */
void kvmdirty_vm_free(struct kvmdirty_vm *vm);

/*
 * The VM fd and the /dev/kvm fd, for the VMM's own ioctls; owned by the
 * handle (or by the caller, when adopted).  Memslots must go through
 * kvmdirty_region_*: a slot made behind the library's back may collide
 * with the ids it hands out.  -EINVAL for NULL.
 */
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
 * Returns >= 0, or -EINVAL for an unknown cap or NULL.  Headers older than the
 * running kernel do not limit the probe: the uapi the library needs is
 * vendored.
 */
int64_t kvmdirty_vm_cap(const struct kvmdirty_vm *vm, enum kvmdirty_cap cap);

/* Host page size the VM's slots are aligned to (4096 on x86-64); 0 for NULL. */
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
 * memory stays the caller's.  A tracked region stops being tracked and its
 * pending pages are dropped (they are no longer guest memory): sync first
 * if they matter.
 * Errors: -EINVAL region is NULL or not of this VM; errno of the ioctl (the
 * region then stays as it was).
 */
int kvmdirty_region_remove(struct kvmdirty_vm *vm, struct kvmdirty_region *region);

/*
 * Move a region to another guest physical address, keeping its slot, host
 * memory and flags (KVM's MOVE).  Tracking goes on: pending pages and
 * marks stay with the region's pages.  Errors: -EINVAL unaligned or
 * wrapping new_gpa, region not of this VM; -EEXIST the new range overlaps
 * another region; -ENOMEM for the index; errno of the ioctl.  Moving to
 * the current gpa is a no-op.
 */
int kvmdirty_region_move(struct kvmdirty_vm *vm, struct kvmdirty_region *region, uint64_t new_gpa);

/*
 * Turn KVM's dirty logging on or off for one region (its LOG_DIRTY flag).
 * Setting the state a region already has is a no-op.  Errors: -EINVAL;
 * errno of the ioctl (the region then stays as it was).
 *
 * On a tracked region this loses no write: while logging is off, nothing
 * can tell what the guest writes there, so every page of the region is
 * pending again at every sync; when logging comes back on, every page is
 * pending once more (the writes between the last sync and then), and is
 * protected again before next() hands it out.  The region stays tracked
 * throughout.  kvmdirty_tracker_stop() is the way to stop tracking it.
 */
int kvmdirty_region_set_logging(struct kvmdirty_vm *vm, struct kvmdirty_region *region, bool enable);

/*
 * The same for every region, tracked ones as above.  All or nothing: when
 * one region fails, those already switched are switched back (best effort)
 * and the first error is returned.  Errors: -EINVAL; -ENOMEM; errno of the
 * ioctls.
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
/* Number of regions; 0 for NULL. */
unsigned int kvmdirty_vm_region_count(const struct kvmdirty_vm *vm);

/* Region attributes of a live region; 0 (NULL, UINT32_MAX for the slot) for NULL. */
uint64_t kvmdirty_region_gpa(const struct kvmdirty_region *region);
uint64_t kvmdirty_region_size(const struct kvmdirty_region *region);
void *kvmdirty_region_hva(const struct kvmdirty_region *region);
uint32_t kvmdirty_region_slot(const struct kvmdirty_region *region);
uint32_t kvmdirty_region_flags(const struct kvmdirty_region *region);

/* ---- Dirty tracking -------------------------------------------------- */

/*
 * How KVM reports dirty pages.  The names in quotes are those of the
 * kernel's dirty_log_test and dirty_log_perf_test.
 */
enum kvmdirty_mode {
	/* CLEAR_LOG where the kernel has it, else DIRTY_LOG */
	KVMDIRTY_MODE_AUTO = 0,
	/* "dirty-log": KVM_GET_DIRTY_LOG alone, which re-protects the slot */
	KVMDIRTY_MODE_DIRTY_LOG,
	/*
	 * "clear-log": manual protect (KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2,
	 * with INITIALLY_SET where offered): KVM_GET_DIRTY_LOG, then
	 * KVM_CLEAR_DIRTY_LOG per dirty chunk just before its pages are
	 * handed out
	 */
	KVMDIRTY_MODE_CLEAR_LOG,
	/* "dirty-ring": per-vCPU rings (KVM_CAP_DIRTY_LOG_RING[_ACQ_REL]) */
	KVMDIRTY_MODE_DIRTY_RING,
};

struct kvmdirty_tracker_opts {
	enum kvmdirty_mode mode;
	/* DIRTY_RING: entries per vCPU, a power of two; 0: 4096 */
	uint32_t ring_entries;
	/*
	 * CLEAR_LOG: pages per KVM_CLEAR_DIRTY_LOG, a multiple of 64; 0:
	 * 262144 (1 GiB of 4 KiB pages).  Smaller chunks hold KVM's mmu
	 * lock for less time and re-protect fewer pages early.
	 */
	uint64_t clear_chunk_pages;
	/*
	 * DIRTY_RING: harvest every vCPU's ring from a library thread every
	 * this many ms (0: none; rings are then harvested by sync and at
	 * ring-full exits), so that busy vCPUs seldom stop on a full ring.
	 */
	uint32_t reaper_ms;
};

/*
 * Create the VM's tracker (one per VM: several readers of its log are its
 * consumers, kvmdirty_consumer_new()) and set KVM up for its mode: this
 * enables manual protect, or the dirty ring, on the VM.  The ring can only
 * be enabled before the first vCPU exists, so create the tracker before
 * kvmdirty_vcpu_create()/_add() in every mode.  opts NULL means AUTO.
 *
 * Errors: -EOPNOTSUPP the kernel lacks the mode; -EINVAL bad options
 * (an unknown mode, ring size not a power of two, below a page or above
 * the kernel's maximum, chunk not a multiple of 64); -EBUSY the VM already
 * has a tracker, or (DIRTY_RING) vCPUs, or an earlier tracker enabled
 * another mode; -EAGAIN the reaper thread could not be started (the mode
 * stays enabled on the VM); -ENOMEM; errno of KVM_ENABLE_CAP.  Apart from
 * -EAGAIN, nothing changes on error.
 */
int kvmdirty_tracker_new(struct kvmdirty_vm *vm, const struct kvmdirty_tracker_opts *opts,
			 struct kvmdirty_tracker **ret_tracker);

/*
 * Stop tracking everything and free the tracker.  NULL is a no-op.  The
 * dirty ring, once enabled, stays the VM's: vCPUs may keep running in
 * kvmdirty_vcpu_run() (also while this runs); their rings are then
 * harvested, reset and dropped.  A later tracker must use the same mode.
 */
void kvmdirty_tracker_free(struct kvmdirty_tracker *tracker);

/* The mode in use (AUTO resolved); AUTO for NULL. */
enum kvmdirty_mode kvmdirty_tracker_mode(const struct kvmdirty_tracker *tracker);

/*
 * Start tracking one region (or every region, with region NULL) for the
 * tracker's own user: where no one tracked it, turns KVM's dirty logging
 * on for it and marks every page of it pending for every consumer, so
 * that the first pass after start reports all of memory; where a
 * consumer already started it (kvmdirty_consumer_start()), only claims it
 * too (nothing becomes pending again).  Starting a region this user
 * started is a no-op.  Regions added later are not tracked until started.
 * Sync, next and marks walk tracked regions only: a VM with many memslots
 * pays for the ones it tracks.  Errors: -EINVAL; -ENOMEM; errno of the
 * memslot update (with NULL, regions already started stay started).
 */
int kvmdirty_tracker_start(struct kvmdirty_tracker *tracker, struct kvmdirty_region *region);

/*
 * Give up the tracker's own user's claim on one region (or on all it
 * started).  The last claim on a region (no consumer started it either)
 * stops tracking it: dirty logging off, its pending pages dropped for
 * every consumer.  A region some consumer still claims stays tracked,
 * logging on and every consumer's pages theirs: one reader's stop never
 * drops another's writes.  If KVM refuses the memslot update the region
 * stays tracked, pending pages and all, and the errno is returned; with
 * NULL the others are still stopped and the first error returned.
 * Stopping a region this user never started is a no-op.  Removing a
 * tracked region stops its tracking, every claim with it.
 */
int kvmdirty_tracker_stop(struct kvmdirty_tracker *tracker, struct kvmdirty_region *region);

/*
 * Sync, pending and next act on the tracker's own consumer
 * (kvmdirty_tracker_consumer()); see "Consumers" below for others.
 *
 * Pull what KVM has into the pending pages of every consumer:
 * KVM_GET_DIRTY_LOG for each tracked region, or a harvest of every vCPU's
 * ring and KVM_RESET_DIRTY_RINGS; plus pages marked with
 * kvmdirty_tracker_mark_*.  Returns how many pages became pending for the
 * tracker's own consumer (were not already), or -errno.
 * Cost: the ioctls plus O(tracked regions), whatever the memslot count,
 * in the bitmap modes (a GET each; a region KVM reports clean costs no
 * more than its GET and a look at the bitmap); in DIRTY_RING mode the
 * rings plus O(regions touched since the last sync), with a fixed look at
 * one bit per memslot id (a tracked region nothing touched costs nothing).
 *
 * A sync that fails partway (an ioctl error on one region) keeps every
 * page it fetched pending, with consistent counts, still takes the marks,
 * and returns the error; a later sync goes on.  In DIRTY_RING mode, if
 * ring entries were lost (KVM pushed past a full ring, as this host's KVM
 * does under emulated guest writes, or a reset failed), the sync first
 * switches dirty logging off and on for every tracked region, which
 * write-protects all of it again, and makes every page pending: nothing
 * lost is handed out unprotected.  The statistics count such events
 * (ring_overflows, ring_recoveries).
 *
 * For a complete final sync (stop-and-copy) the VMM first stops every
 * vCPU (out of KVM_RUN: a signal, or immediate_exit), so that buffered
 * hardware state (PML) is flushed to the rings and no write races the
 * last harvest; then calls sync once more.  A ring-full exit or a reaper
 * sweep still harvesting then finishes first: sync waits for it.
 */
int64_t kvmdirty_tracker_sync(struct kvmdirty_tracker *tracker);

/* Pages pending (synced, not yet handed out); O(1), from any thread; 0 for NULL. */
uint64_t kvmdirty_tracker_pending(const struct kvmdirty_tracker *tracker);

/* A run of dirty pages inside one region. */
struct kvmdirty_range {
	struct kvmdirty_region *region;
	uint64_t page;	 /* first page, counted from the region's start */
	uint64_t npages;
	uint64_t gpa;	 /* guest physical address of the first page */
	void *hva;	 /* host address of the first page */
};

/*
 * Hand out pending pages as runs, in region and address order, resuming
 * where the previous call stopped and wrapping around: at most max_ranges
 * runs and max_pages pages (0: no page limit; a longer run is split).
 * What is handed out is no longer pending.
 *
 * Protect before read: before it returns, every page it hands out is
 * write-protected in KVM again (its chunk's KVM_CLEAR_DIRTY_LOG issued;
 * for the other modes, sync already did it), so a guest write after the
 * caller reads the page will be reported by a later sync.  The caller
 * reads the pages after this returns, never before.
 *
 * Returns the number of ranges (0: nothing pending) or -errno of
 * KVM_CLEAR_DIRTY_LOG (the pages then stay pending; a call that handed out
 * ranges before the failure returns those).  -EINVAL also for NULL ranges
 * with max_ranges not 0.
 */
int kvmdirty_tracker_next(struct kvmdirty_tracker *tracker, struct kvmdirty_range *ranges,
			  size_t max_ranges, uint64_t max_pages);

/*
 * Record writes the VMM made itself (emulated devices, DMA) to
 * [addr, addr + len), by guest physical or host address; pages outside
 * tracked regions are ignored, and a host range aliased by several
 * regions marks each.  Reported by the next sync.  Safe from any thread,
 * concurrently with sync, next and region changes; a guest physical
 * address is resolved when the mark is made, so a device whose writes may
 * straddle a move of their region marks by host address, which a move
 * does not change.  Cost: O(min(pages in the range, tracked regions)),
 * so a huge range over holes costs what the tracked regions do.
 * Errors: -EINVAL NULL tracker, len 0 or a range that wraps.
 */
int kvmdirty_tracker_mark_dirty_gpa(struct kvmdirty_tracker *tracker, uint64_t gpa, uint64_t len);
int kvmdirty_tracker_mark_dirty_hva(struct kvmdirty_tracker *tracker, const void *hva, uint64_t len);

struct kvmdirty_stats {
	uint64_t syncs;
	uint64_t last_sync_pages;     /* pages reported dirty by the last sync, for all consumers (each page once
				       * until it is protected again) */
	uint64_t total_sync_pages;
	uint64_t last_sync_kernel_ns; /* inside KVM ioctls during the last sync */
	uint64_t last_sync_lib_ns;    /* the rest of the last sync */
	uint64_t dirty_rate;	      /* pages/s brought by the last syncs (up to 8, at least 1 ms) */
	uint64_t clear_calls;	      /* KVM_CLEAR_DIRTY_LOG issued */
	uint64_t ring_harvested;      /* ring entries collected */
	uint64_t ring_full_exits;     /* KVM_EXIT_DIRTY_RING_FULL handled */
	uint64_t ring_overflows;      /* entries KVM pushed over (a whole ring taken, a reset cut short) */
	uint64_t ring_recoveries;     /* rings KVM left stuck behind zeroed entries, set going again */
	uint64_t ring_full_ns;	      /* spent handling KVM_EXIT_DIRTY_RING_FULL */
	uint64_t ring_reaper_runs;    /* sweeps of the reaper thread */
	/* since 0.4: */
	uint64_t ring_reaper_ns;	/* spent in the reaper's sweeps, inside KVM and out (and waiting for
					 * a sync's or a ring-full exit's harvest to end) */
	uint64_t ring_reaper_kernel_ns; /* of which inside KVM_RESET_DIRTY_RINGS */
};

/*
 * Copy the statistics, from any thread (each field is read atomically).
 * size is sizeof(struct kvmdirty_stats) as the caller knows it (fields
 * added later are not written).  -EINVAL if size is 0.
 */
int kvmdirty_tracker_stats(const struct kvmdirty_tracker *tracker, struct kvmdirty_stats *ret_stats,
			   size_t size);

/* ---- Consumers of one tracker ----------------------------------------- */

/*
 * Several independent readers of one VM's dirty log: a migration, periodic
 * snapshots, a display, a dirty-rate monitor.  Each consumer has its own
 * pending pages and its own place in them: its sync followed by its next()
 * calls hands out every page written since that page was last handed to
 * it, once, whatever the other consumers do and whenever they join or
 * leave.  KVM's work (the GET, ring harvest and reset, the CLEAR of each
 * chunk) is done once for all of them: a sync by any consumer fetches and
 * fans the pages out to every consumer's pending set, and a chunk one
 * consumer protects stays protected for the others.  Marks reach every
 * consumer.  The tracker's own calls (kvmdirty_tracker_sync, _next,
 * _pending) act on its default consumer (kvmdirty_tracker_consumer()).
 *
 * Pages handed out stay owed by the consumer until it commits them;
 * kvmdirty_consumer_abort() makes every page handed out since the last
 * commit pending again, so an interrupted snapshot or a cancelled
 * migration loses nothing and its next pass is complete.
 *
 * Memory: per tracked page, one bit (pending) for each consumer, two for
 * one that owes (pending and owed).  The tracker's shared state is three
 * bits a page (CLEAR_LOG; two otherwise), whatever the consumers.
 */

/* Flags of kvmdirty_consumer_new(). */
enum {
	/*
	 * Join with nothing pending: every write after kvmdirty_consumer_new()
	 * returned reaches the consumer (some earlier ones may too).  In
	 * CLEAR_LOG mode the pages fetched and not yet protected again are
	 * pending at first (a write to them would leave no trace): all of a
	 * region just started, with INITIALLY_SET, until some consumer's first
	 * pass handed it out.  Without the flag, every page of every tracked
	 * region is pending at first.
	 */
	KVMDIRTY_CONSUMER_EMPTY = 1u << 0,
	/* Commit every page as it is handed out: nothing owed, no owed bitmap, abort returns 0. */
	KVMDIRTY_CONSUMER_AUTOCOMMIT = 1u << 1,
	/*
	 * A counting consumer: kvmdirty_consumer_count() instead of next(),
	 * for dirty rates.  It takes nothing from anyone (other consumers'
	 * pages stay theirs) and owes nothing.
	 */
	KVMDIRTY_CONSUMER_COUNT = 1u << 2,
};

/*
 * A new consumer of the tracker's log; the tracker's regions started later
 * are wholly pending for it, as for every consumer.  Any thread, also
 * while other consumers sync and hand out (it waits for a sync under way).
 * Errors: -EINVAL NULL, unknown flags, or COUNT with AUTOCOMMIT; -ENOMEM.
 */
int kvmdirty_consumer_new(struct kvmdirty_tracker *tracker, uint32_t flags,
			  struct kvmdirty_consumer **ret_consumer);

/*
 * End a consumer: its pending and owed pages are dropped (nothing owed
 * survives it; the other consumers keep theirs), and its claims on
 * regions given up (kvmdirty_consumer_start()).  Call it when no call of
 * this consumer runs; other consumers may.  kvmdirty_tracker_free() frees
 * the consumers still there.  NULL and the tracker's default consumer: no-op.
 */
void kvmdirty_consumer_free(struct kvmdirty_consumer *consumer);

/* The consumer the tracker's own sync, next and pending act on; NULL for NULL. */
struct kvmdirty_consumer *kvmdirty_tracker_consumer(const struct kvmdirty_tracker *tracker);

/*
 * Since 0.5.  Tracking as this consumer's own need: logging stays on for
 * a region while any consumer (the tracker's own user included, through
 * kvmdirty_tracker_start()) claims it, and goes off when the last claim
 * goes.  kvmdirty_consumer_start() is kvmdirty_tracker_start() for this
 * consumer: the region (NULL: every region) tracked where it was not,
 * every page pending for every consumer then, and a claim of this
 * consumer's either way.  kvmdirty_consumer_stop() gives the claim up as
 * kvmdirty_tracker_stop() does the tracker's own.  kvmdirty_consumer_free()
 * gives up every claim of the consumer, so a reader that ends (a
 * migration done, a snapshot series over) never turns logging off under
 * another; if KVM refuses that memslot update, the claim passes to the
 * tracker's own user (its kvmdirty_tracker_stop() tries again).  Errors:
 * as kvmdirty_tracker_start() and _stop(); -EINVAL for NULL.  Threads:
 * changes, as kvmdirty_tracker_start() and _stop() (not concurrently with
 * each other on the same VM).
 */
int kvmdirty_consumer_start(struct kvmdirty_consumer *consumer, struct kvmdirty_region *region);
int kvmdirty_consumer_stop(struct kvmdirty_consumer *consumer, struct kvmdirty_region *region);

/*
 * kvmdirty_tracker_sync() for every consumer at once: fetches from KVM and
 * fans out to every consumer; returns how many pages became pending for
 * this one, or -errno as kvmdirty_tracker_sync().  Syncs of different
 * consumers run one at a time; one returns once all an earlier one fetched
 * has reached every consumer.
 */
int64_t kvmdirty_consumer_sync(struct kvmdirty_consumer *consumer);

/*
 * kvmdirty_tracker_next() for this consumer: hands out its pending pages,
 * protect before read included, and (unless AUTOCOMMIT) records them as
 * owed.  -EINVAL also for a counting consumer.
 */
int kvmdirty_consumer_next(struct kvmdirty_consumer *consumer, struct kvmdirty_range *ranges,
			   size_t max_ranges, uint64_t max_pages);

/* Pages pending for this consumer; O(1), from any thread; 0 for NULL. */
uint64_t kvmdirty_consumer_pending(const struct kvmdirty_consumer *consumer);

/*
 * The pages handed out since the last commit are done with: forgotten.
 * Returns how many there were.  Cost: the regions and the span of pages
 * handed out since the last commit, never memory not handed out.
 * -EINVAL for NULL.
 */
int64_t kvmdirty_consumer_commit(struct kvmdirty_consumer *consumer);

/*
 * What was done with the pages handed out since the last commit failed:
 * every one of them is pending again, for this consumer only, and will be
 * handed out again (protected again as needed; a write since is not lost
 * either, as it is reported by a later sync).  Returns how many there
 * were; the same cost as commit.  -EINVAL for NULL.
 */
int64_t kvmdirty_consumer_abort(struct kvmdirty_consumer *consumer);

struct kvmdirty_consumer_info {
	uint32_t flags;
	uint64_t pending;
	uint64_t owed;		/* handed out since the last commit */
	uint64_t tracked_pages; /* pages of the tracked regions */
	uint64_t bitmap_bytes;	/* the consumer's own bitmaps over them */
};

/* A consumer's counts and memory, from any thread; size as for kvmdirty_tracker_stats(). -EINVAL NULL or size 0. */
int kvmdirty_consumer_info(const struct kvmdirty_consumer *consumer, struct kvmdirty_consumer_info *ret_info,
			   size_t size);

struct kvmdirty_count {
	uint64_t pages;		/* distinct pages written over the interval */
	uint64_t ns;		/* the interval: since the last count (or the consumer's creation) */
	uint64_t pages_per_sec; /* pages over ns */
	uint64_t flags;		/* KVMDIRTY_COUNT_* (0.4; kvmdirty_vcpu_count() only, 0 from a consumer) */
};

/* pages is a lower bound: ring entries were lost (an overflow), or memory ran out to hold them */
#define KVMDIRTY_COUNT_INCOMPLETE (1ull << 0)

/*
 * A counting consumer's measure: sync, then take every page it has
 * pending at once (each protected again, so that a later write counts
 * again) and report how many there were since the last count.  In
 * DIRTY_RING mode, kvmdirty_vcpu_stats() splits the rate by vCPU (its
 * dirtied count).  Errors: -EINVAL NULL, size 0, not a counting consumer;
 * -errno of the sync or of KVM_CLEAR_DIRTY_LOG (the interval then goes on).
 */
int kvmdirty_consumer_count(struct kvmdirty_consumer *consumer, struct kvmdirty_count *ret_count, size_t size);

/* ---- vCPUs ------------------------------------------------------------ */

/*
 * KVM_CREATE_VCPU with this id and map its kvm_run (and its dirty ring,
 * in DIRTY_RING mode).  The vCPU is the library's: kvmdirty_vcpu_free()
 * closes it.  Register/adjust CPUID, registers etc. through its fd.
 * Errors: -EEXIST id in use; errno of the ioctls; -ENOMEM.
 */
int kvmdirty_vcpu_create(struct kvmdirty_vm *vm, uint32_t id, struct kvmdirty_vcpu **ret_vcpu);

/*
 * Register a vCPU fd the VMM created; the fd stays the VMM's (not closed
 * by kvmdirty_vcpu_free()).  The library maps kvm_run and the ring itself.
 * A vCPU freed from the library and registered again (a parked fd, or a
 * copy of it) takes its ring up where the library left it.  Register a
 * vCPU before it first runs with a dirty ring, or its entries may be
 * missed.  Errors: -EBADF; -EEXIST this vCPU is registered already;
 * -ENOMEM; errno of the mappings.
 */
int kvmdirty_vcpu_add(struct kvmdirty_vm *vm, int vcpu_fd, struct kvmdirty_vcpu **ret_vcpu);

/*
 * Unregister, harvest what its ring holds (reset, then reported to the
 * tracker like any harvest), unmap kvm_run and (if created by the
 * library) close.  The vCPU lives on in KVM until the VM goes, so its
 * ring stays mapped and harvested by every sync: writes of a vCPU the VMM
 * keeps running through another fd are still reported.  Call it when the
 * vCPU's thread is out of kvmdirty_vcpu_run().  NULL: no-op.
 */
void kvmdirty_vcpu_free(struct kvmdirty_vcpu *vcpu);

/*
 * The vCPU's fd (for KVM_SET_REGS, KVM_SET_CPUID2 and the like) and its
 * kvm_run mapping, both valid until kvmdirty_vcpu_free() (-EINVAL and
 * NULL for a NULL vCPU).  Set kvm_run->immediate_exit and signal the
 * vCPU's thread to take it out of KVM_RUN (kvmdirty_vcpu_run() then
 * returns -EINTR).
 */
int kvmdirty_vcpu_fd(const struct kvmdirty_vcpu *vcpu);
struct kvm_run *kvmdirty_vcpu_kvm_run(const struct kvmdirty_vcpu *vcpu);

/*
 * KVM_RUN until an exit the VMM must see.  KVM_EXIT_DIRTY_RING_FULL is
 * handled here (this vCPU's ring harvested and reset, then its pages
 * reported to the tracker; a ring KVM left stuck set going; without a
 * tracker the ring is harvested, reset and dropped) and the vCPU resumed;
 * every other exit returns 0 with kvm_run->exit_reason as KVM left it.
 * A vCPU over its dirty limit (kvmdirty_vcpu_set_dirty_limit()) is held
 * here, out of KVM_RUN, before it enters again.  The library's cost per
 * exit is two loads and a compare.  Returns -errno of KVM_RUN, including
 * -EINTR when a signal kicked the vCPU out, or of a ring reset that
 * failed (the pages it held are then protected again at the next sync).
 * A held vCPU returns -EINTR too once kvm_run->immediate_exit is set:
 * within one 2 ms slice of the hold, sooner with a signal (which cuts the
 * slice short unless it lands just before the slice begins; the library
 * reads the flag between slices: set it with an atomic store).  The VMM's kicks
 * set immediate_exit before they signal, as they must anyway, for a
 * signal that comes just before KVM_RUN is otherwise lost; an EINTR
 * without immediate_exit that follows a kick of the library's
 * (kvmdirty_vm_set_kick_signal()) is taken as that kick's, not returned.  Call from the vCPU's thread; may run
 * concurrently with everything else on the VM.  -EINVAL for NULL.
 */
int kvmdirty_vcpu_run(struct kvmdirty_vcpu *vcpu);

/*
 * Limit how fast a vCPU may dirty memory, in pages per second (0: no
 * limit, the default), DIRTY_RING mode only: each harvest of its ring is
 * charged to it, and a vCPU that used more than its share is held in
 * kvmdirty_vcpu_run() before it enters KVM_RUN again, for as long as
 * the excess takes at the limit.  What a harvest brings is taken as
 * written since the last one, so a vCPU under its limit is never held
 * however seldom its ring is harvested; quota unused beyond that is saved
 * up to 10 ms worth.  The limit acts where the library sees the vCPU's entries:
 * at its ring-full exits (so a ring of N entries lets it write up to N
 * pages before it is held: at a limit L, choose N near L / 100 for a
 * hold every 10 ms), at every other exit, and, with a kick signal set,
 * within one harvest (the reaper's period, a sync) of the vCPU running
 * over.  A changed limit keeps what the vCPU owes, re-timed at the new
 * limit (a held vCPU is held for as long as its excess takes at that
 * limit); a first limit starts from nothing saved or owed; 0 forgets it
 * all and frees a held vCPU.  Any thread, any time.  Errors: -EINVAL NULL vCPU or a
 * limit above 2^32; -EOPNOTSUPP the VM has no dirty ring.
 */
int kvmdirty_vcpu_set_dirty_limit(struct kvmdirty_vcpu *vcpu, uint64_t pages_per_sec);

/*
 * A signal the library sends a vCPU thread that is over its dirty limit
 * while in KVM_RUN, so that it is held within a harvest instead of at its
 * next exit (0, the default: no kicks).  Install a handler for it first
 * (one that does nothing will do; without SA_RESTART, so that KVM_RUN
 * returns EINTR); the VMM's own kick signal may be the same one.  The
 * signal may reach the thread just after kvmdirty_vcpu_run() returned,
 * never after it returned and the thread exited, and none is sent once a
 * call that changes or clears the signal has returned (one sent just
 * before may still be delivered after).  Errors: -EINVAL
 * NULL VM, a signal out of range or one with no handler installed.
 */
int kvmdirty_vm_set_kick_signal(struct kvmdirty_vm *vm, int signo);

/* One vCPU's dirtying: the ring's counts in DIRTY_RING mode (0 in the others), faults in all. */
struct kvmdirty_vcpu_stats {
	uint64_t dirtied;	  /* ring entries harvested for it: pages it dirtied */
	uint64_t dirty_rate;	  /* pages/s over the last closed 100 ms window (all vCPUs share it) */
	uint64_t dirty_limit;	  /* pages/s, 0: none */
	uint64_t held_ns;	  /* time held out of KVM_RUN by the limit (a hold under way: to its last 2 ms slice) */
	uint64_t holds;		  /* times held */
	uint64_t kicks;		  /* kick signals sent to it */
	uint64_t ring_full_exits; /* its KVM_EXIT_DIRTY_RING_FULL exits handled */
	/*
	 * Page faults KVM took for it, in any mode (KVM's per-vCPU statistic
	 * pf_taken, Linux 5.14+; 0 where KVM lacks it).  Once memory is
	 * faulted in and tracking started, these are mostly first writes to
	 * write-protected pages: how the bitmap modes, which cannot tell
	 * whose write a dirty bit is, can tell which vCPUs dirty.
	 */
	uint64_t faults;
};

/*
 * Copy a vCPU's statistics, from any thread.  A window closes at the
 * first harvest after 100 ms; the rates of all vCPUs are over the same
 * window and add up to the guest's (when no harvest closed a window for
 * 200 ms, over the time since the last one closed).  Entries of a vCPU
 * freed from the library count for no vCPU.  size as for
 * kvmdirty_tracker_stats().  Errors: -EINVAL NULL or size 0.
 */
int kvmdirty_vcpu_stats(const struct kvmdirty_vcpu *vcpu, struct kvmdirty_vcpu_stats *ret_stats, size_t size);

/*
 * The distinct pages one vCPU dirtied since the last call for it
 * (DIRTY_RING mode): every page its ring reported, each counted once
 * however often it was written again and harvested again.  A vCPU that
 * writes nothing reads 0; a page two vCPUs write counts for each whose
 * ring reported it (KVM reports a page once per re-protect, to the vCPU
 * that wrote it first).  The first call starts counting and reads 0 over
 * 0 ns; ret_count NULL stops counting (the set freed; the next call
 * starts again).  It counts what harvests took: sync first
 * (kvmdirty_consumer_count() and kvmdirty_tracker_sync() harvest every
 * ring) for an interval that ends now.  Memory while counting: 16 to 32
 * bytes per page dirtied in the interval (never per page of the guest),
 * freed at the next call; stop counting when no longer asking.  Any
 * thread; one caller per vCPU makes the intervals (two would split them).
 * Entries lost to an overflow of any vCPU's ring (in this interval or the
 * one before: the lost pages stay writable until a sync re-protects
 * them), or a set that could not grow: KVMDIRTY_COUNT_INCOMPLETE.  size as
 * for kvmdirty_tracker_stats() (zero the struct first where the library
 * may be older than the header).  Errors: -EINVAL NULL vcpu, size 0;
 * -EOPNOTSUPP not DIRTY_RING mode (the bitmap modes cannot tell whose write
 * a dirty bit is: kvmdirty_vcpu_stats().faults); -ENOMEM (the interval
 * goes on).
 */
int kvmdirty_vcpu_count(struct kvmdirty_vcpu *vcpu, struct kvmdirty_count *ret_count, size_t size);

/* ---- Version ---------------------------------------------------------- */

/*
 * The version of the library loaded at run time, which may be newer than
 * the header the program was built with (KVMDIRTY_VERSION_*): a program
 * that needs a call of a later version compares these before it makes it.
 * They need no VM, never fail and may be called from any thread.
 */
int kvmdirty_version_major(void);
int kvmdirty_version_minor(void);
/* "MAJOR.MINOR.MICRO", a static string. */
const char *kvmdirty_version_string(void);

/* ---- Bitmap scanner --------------------------------------------------- */

/*
 * A bitmap is an array of uint64_t with bit i in bit i % 64 of word i / 64
 * (little-endian words: the layout of KVM's dirty bitmaps), allocated by
 * the caller with KVMDIRTY_BITMAP_WORDS(nbits) words; 32-byte alignment
 * makes the scan fastest, any 8-byte alignment works.  Ranges are
 * [start, end) in bits, any start and end (not only multiples of 64);
 * end <= start is an empty range.  Bits outside the range are never
 * reported nor changed, so a bitmap's tail bits need not be clear.
 *
 * These functions need no VM, never allocate and never fail.  Clean
 * stretches are skipped with wide loads (AVX2 where the CPU has it; set
 * KVMDIRTY_SCAN=portable in the environment before the first call to use
 * the portable code, which gives the same answers).
 *
 * Threading: any number of readers at once.  Writers that run concurrently
 * with other users of the same words must use the _atomic functions or
 * kvmdirty_bitmap_take(); the plain set/clear are for bitmaps one thread
 * owns.
 */
#define KVMDIRTY_BITMAP_WORDS(nbits) (((nbits) + 63) / 64)

/* A maximal stretch of set bits: [first, first + count). */
struct kvmdirty_run {
	uint64_t first;
	uint64_t count;
};

/* "avx2" or "portable": the kernels in use. */
const char *kvmdirty_bitmap_impl(void);

/* First set bit in [from, end), or end if there is none. */
uint64_t kvmdirty_bitmap_next_set(const uint64_t *map, uint64_t from, uint64_t end);

/* Number of set bits in [start, end). */
uint64_t kvmdirty_bitmap_count(const uint64_t *map, uint64_t start, uint64_t end);

/* True if no bit of [start, end) is set. */
bool kvmdirty_bitmap_is_clear(const uint64_t *map, uint64_t start, uint64_t end);

/*
 * Runs of set bits in [*pos, end), in order, into runs[0 .. max_runs).
 * Returns how many were written; 0 means none are left.  *pos advances
 * past what was reported, so calling again continues; a run is never
 * split between calls (it is cut only at end).  The usual loop:
 *
 *	uint64_t pos = 0;
 *	while ((n = kvmdirty_bitmap_runs(map, &pos, nbits, runs, 64)) > 0)
 *		for (i = 0; i < n; i++)
 *			send(runs[i].first, runs[i].count);
 */
size_t kvmdirty_bitmap_runs(const uint64_t *map, uint64_t *pos, uint64_t end,
			    struct kvmdirty_run *runs, size_t max_runs);

/*
 * fn(first, count, opaque) for each run in [start, end), in order.  A
 * non-zero return from fn stops the walk and is returned; otherwise 0.
 */
int kvmdirty_bitmap_for_each_run(const uint64_t *map, uint64_t start, uint64_t end,
				 int (*fn)(uint64_t first, uint64_t count, void *opaque), void *opaque);

/*
 * Chunks are the aligned blocks [k * chunk_bits, (k + 1) * chunk_bits).
 * Returns the first bit of the first chunk holding a set bit of
 * [from, end) (which is below from when from is inside that chunk), or
 * end if none does, or if chunk_bits is 0.  Walk with
 * from = chunk + chunk_bits.
 */
uint64_t kvmdirty_bitmap_next_dirty_chunk(const uint64_t *map, uint64_t from, uint64_t end,
					  uint64_t chunk_bits);

/* Set or clear every bit of [start, end); plain stores. */
void kvmdirty_bitmap_set(uint64_t *map, uint64_t start, uint64_t end);
void kvmdirty_bitmap_clear(uint64_t *map, uint64_t start, uint64_t end);

/*
 * The same with atomic read-modify-writes (release order: what the caller
 * wrote before setting a bit is visible to whoever takes it).
 */
void kvmdirty_bitmap_set_atomic(uint64_t *map, uint64_t start, uint64_t end);
void kvmdirty_bitmap_clear_atomic(uint64_t *map, uint64_t start, uint64_t end);

/*
 * Fetch-and-clear the bits of [start, end) in src atomically (word-wise
 * exchange with zero, acquire-release) and OR them into dst at the same
 * positions.  Returns how many of them were not already set in dst.
 * Producers may keep setting bits of src with kvmdirty_bitmap_set_atomic()
 * meanwhile: each set bit is taken by exactly one take.  dst must not be
 * written by anyone else during the call.
 */
uint64_t kvmdirty_bitmap_take(uint64_t *dst, uint64_t *src, uint64_t start, uint64_t end);

#ifdef __cplusplus
}
#endif

#endif
