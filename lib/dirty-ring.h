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
	/*
	 * A batch's reset (dirty-ring.c): where KVM's reset got to lies in
	 * [reset_pos + span_lo, reset_pos + span_hi]; unsure: it could not be
	 * told, and the larger was taken.
	 */
	uint32_t span_lo, span_hi;
	bool unsure;
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

/*
 * Many rings at once (a sync, the reaper): collected in batches, each with
 * one KVM_RESET_DIRTY_RINGS instead of one a ring.  KVM's reset walks
 * every vCPU of the VM and then makes a request of each (its TLB flush),
 * so a reset a ring made a harvest of N vCPUs cost N^2: with 1,024 vCPUs
 * holding a page or two each, seconds a sync.
 *
 * Only a ring with nothing awaiting a reset and no history of KVM pushing
 * past it goes in a batch; less than a lap of it is taken.  After the
 * batch's reset, where KVM's reset got to in each ring is read off the
 * ring itself, with the reset's count to settle what a ring cannot say
 * (dirty-ring.c: reset_batch()); where neither can, the ring is reported
 * as overflowed, which makes the tracker protect every page again.  A ring whose
 * reset_pos is then short of fetch (KVM pushed into an entry that awaited
 * the reset) is finished alone with kd_ring_collect(): the other short
 * rings stay stuck at their pushed entries, so each of its resets counts
 * its own.  A ring's entries are published only once all of them were
 * re-protected; until then, none.  Rings that cannot go in a batch are
 * collected alone, the batch so far reset first (only one ring may then
 * await a reset).
 */
struct kd_ring_seg {
	uint32_t ring; /* index into the rings collected */
	uint32_t off, n; /* its entries, at buf[off, off + n) */
	unsigned int loss;
};

/* The caller's room: kept between collects, sized by kd_rings_room(). */
struct kd_ring_room {
	/* buf[0, batch_cap): a batch's entries; buf[batch_cap, buf_cap): one ring's collect (two rings' worth) */
	struct kd_ring_entry *buf;
	uint32_t batch_cap, buf_cap;
	/* a batch's rings (room for every ring collected at once) */
	struct kd_ring_seg *segs;
	struct kd_ring **seg_rings;
	uint32_t segs_cap;
};

/* What collects found, by the index of the ring in the array collected. */
struct kd_ring_out {
	/* entries of ring i, harvested and re-protected: their pages may be read now */
	void (*pages)(void *ctx, uint32_t i, const struct kd_ring_entry *e, uint32_t n);
	/* enum kd_ring_loss bits found in ring i */
	void (*lost)(void *ctx, uint32_t i, unsigned int loss);
	void *ctx;
};

/*
 * Room for collects of up to nr_rings rings of ring_size entries (grows
 * only).  -ENOMEM leaves what was there; a room too small for a batch
 * makes kd_rings_collect() take each ring alone.
 */
int kd_rings_room(struct kd_ring_room *room, uint32_t ring_size, uint32_t nr_rings);
void kd_rings_room_free(struct kd_ring_room *room);

/*
 * Collect rings[0 .. n) (entries NULL gfns are skipped), publishing
 * through out.  Call kd_rings_retry_failed() first where a reset failed.
 * Returns 0, or -errno of a reset (it stops there; the rings whose
 * entries it left marked are reset_failed, their loss reported as
 * KD_RING_UNPROTECTED).
 */
int kd_rings_collect(struct kd_ring *const *rings, uint32_t n, struct kd_kvm *kvm, struct kd_ring_room *room,
		     const struct kd_ring_out *out, uint64_t *kernel_ns);

/* One ring alone (a ring-full exit, a vCPU freed), published as ring index i. */
int kd_rings_collect_one(struct kd_ring *ring, uint32_t i, struct kd_kvm *kvm, struct kd_ring_room *room,
			 bool ring_full, const struct kd_ring_out *out, uint64_t *kernel_ns);

/*
 * A reset that failed left the entries of the rings it was for marked:
 * the next reset would take them too and counts could not be told apart.
 * Reset those rings again (all at once where each holds less than a lap
 * awaiting its reset, as a batch leaves them; else one at a time), and
 * collect each alone where that left it short.  Returns 0 once no ring of
 * rings[0 .. n) is reset_failed, else -errno (nothing else may be
 * collected).
 */
int kd_rings_retry_failed(struct kd_ring *const *rings, uint32_t n, struct kd_kvm *kvm, struct kd_ring_room *room,
			  const struct kd_ring_out *out, uint64_t *kernel_ns);

#endif
