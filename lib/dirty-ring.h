/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_DIRTY_RING_H
#define KVMDIRTY_DIRTY_RING_H

/*
 * The dirty ring backend: enable, map, harvest (with the recovery of rings
 * this host's KVM leaves stuck), reset.  It knows one ring at a time and
 * nothing of what the pages mean: callers harvest into their own buffer,
 * reset, and only then publish the pages (protect before read).
 */
#include <stdbool.h>
#include <stdint.h>

#include "kvm.h"

struct kvm_dirty_gfn;

/* One harvested entry: page offset within memslot slot (address space 0). */
struct kd_ring_entry {
	uint32_t slot;
	uint64_t offset;
};

struct kd_ring {
	struct kvm_dirty_gfn *gfns;
	uint32_t size;	/* entries, a power of two */
	uint32_t fetch; /* next entry to harvest, counted from 0 forever */
	/*
	 * KVM's own reset index, mirrored from the counts its resets return
	 * (exact because one ring at a time is reset and a reset is never cut
	 * short by a signal).  Entries in [reset_pos, fetch) were harvested
	 * and await their reset.  Resets go through the library only; if
	 * another reset consumed them anyway, they read 0 and reset_pos
	 * catches up.
	 */
	uint32_t reset_pos;
	/* a reset walked with more than a lap outstanding: zeros behind fetch are ghosts */
	bool lapped;
	/* resets that took entries of this ring; its value at the last ring-full exit handled */
	uint32_t gen, gen_at_full;
	/* a reset failed with entries of this ring marked: retry it before any other ring's */
	bool reset_failed;
	/*
	 * KVM pushed past this ring at least once: ghost entries (flags 0,
	 * counted as pushed by KVM) may sit at fetch, now or later.  Every
	 * harvest that stops at a zero entry then looks for them.  Nothing
	 * short of KVM's write position, which userspace cannot see, would
	 * tell that none are left (a DIRTY entry at fetch may be a later
	 * lap's), so it stays set.
	 */
	bool suspect;
};

/* What a harvest found, beyond its entries. */
enum kd_ring_loss {
	KD_RING_OK = 0,
	KD_RING_OVERFLOW = 1 << 0, /* KVM pushed past the ring: entries were overwritten */
	KD_RING_GHOSTS = 1 << 1,   /* ghost entries were marked so that KVM's reset gets past them */
	KD_RING_UNPROTECTED = 1 << 2, /* entries were harvested but not all reset: not re-protected */
};

/* Before any vCPU exists; records the size in kvm. */
int kd_ring_enable(struct kd_kvm *kvm, uint32_t entries);
int kd_ring_map(struct kd_ring *ring, const struct kd_kvm *kvm, int vcpu_fd);
void kd_ring_unmap(struct kd_ring *ring);

/*
 * Harvest the ring into out[0 .. cap) and reset until KVM's reset index
 * caught up with fetch, so that every entry returned has been re-protected
 * (protect before read: publish them only after this returns).  cap must
 * be at least the ring size.  ring_full: the ring's vCPU is stopped in a
 * KVM_EXIT_DIRTY_RING_FULL exit (on this thread), so that what KVM said
 * then may be relied on if no reset took entries since.  Returns how
 * many entries were taken and re-protected (0 if they could not all be:
 * KD_RING_UNPROTECTED is then set in *loss), or -errno of the reset.
 * Callers never collect two rings at once, nor one ring from two threads.
 * *kernel_ns grows by the time spent in KVM_RESET_DIRTY_RINGS.
 */
int64_t kd_ring_collect(struct kd_ring *ring, struct kd_kvm *kvm, struct kd_ring_entry *out, uint32_t cap,
			bool ring_full, unsigned int *loss, uint64_t *kernel_ns);

#endif
