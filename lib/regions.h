/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_REGIONS_H
#define KVMDIRTY_REGIONS_H

/*
 * The regions layer: memslots (slot-id allocation,
 * KVM_SET_USER_MEMORY_REGION(2)) and the three lookups (slot id array,
 * gpa and hva hashed indexes).  Every change is check-then-commit.
 *
 * Locking, two reader-writer locks, both preferring writers (a change
 * waits for the readers inside, never for readers that come after it),
 * taken in this order:
 *   lock       for writing by every change (add, remove, move, logging,
 *              a tracker's start and stop); for reading by whoever walks
 *              what hangs off regions (a tracker's sync, next, commit and
 *              abort, which may take a while over large bitmaps);
 *   mark_lock  for reading by marks and ring publishing, which are short;
 *              for writing, inside lock, by the part of a change that
 *              alters what they see or frees what they read: the
 *              indexes, the set of tracked slots.  So a mark never waits
 *              behind a walk of memory: a change first waits out the
 *              walkers holding only lock, then takes mark_lock for the
 *              moment it edits.
 * A move is the one change that never waits for marks (a mark preempted
 * inside its read section, one of eight marking threads on two CPUs, held
 * a move up to 20 ms): it frees nothing (the gpa index has room reserved
 * first, under mark_lock only where the table must grow) and edits the
 * gpa index and the region's gpa under move_seq, odd while it edits
 * (after KVM moved the slot: a failed move never reaches the index).  A
 * mark by guest address reads inside the count: it waits while it is odd
 * and reads again if it changed, before it sets a bit, so that it
 * resolves the address as before the move or as after it, never half way.
 * Plain lookups (from_gpa and friends) take no lock: the caller keeps
 * them apart from changes.
 *
 * News goes up through a sink the layer above installs: a region going
 * away (after KVM dropped the slot) and dirty logging switched (after KVM
 * did it), both called with lock held for writing and mark_lock not held.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "index.h"
#include "kvm.h"

struct kd_regions;

struct kvmdirty_region {
	struct kd_regions *owner;
	uint64_t gpa;
	uint64_t size;
	void *hva;
	uint32_t slot;
	uint32_t flags; /* KVMDIRTY_REGION_*; written atomically (a sync may switch logging) */
};

struct kd_region_sink {
	void (*removed)(void *ctx, uint32_t slot);
	void (*logging)(void *ctx, uint32_t slot, bool on);
};

struct kd_regions {
	struct kd_kvm *kvm;
	/*
	 * Regions live in an array indexed by slot id, allocated on the
	 * first add: a lookup's result is an address computed from the id,
	 * not one more pointer to load.  slot_used says which are live.
	 */
	struct kvmdirty_region *regions;
	uint64_t *slot_used;
	uint32_t nr_slots; /* ids the array holds: KVM's memslot count */
	uint32_t nr_regions;
	struct kd_index gpa_index;
	struct kd_index hva_index;
	pthread_rwlock_t lock;
	pthread_rwlock_t mark_lock;
	uint32_t move_seq; /* odd while a move edits what marks read (above) */
	const struct kd_region_sink *sink;
	void *sink_ctx;
};

void kd_regions_init(struct kd_regions *rs, struct kd_kvm *kvm);
void kd_regions_fini(struct kd_regions *rs);

/* Slot ids a region may get: KVM's memslot count, bounded by the index. */
uint32_t kd_regions_max_slots(const struct kd_regions *rs);

int kd_region_add(struct kd_regions *rs, uint64_t gpa, uint64_t size, void *hva, uint32_t flags,
		  struct kvmdirty_region **ret_region);
int kd_region_remove(struct kd_regions *rs, struct kvmdirty_region *r);
int kd_region_move(struct kd_regions *rs, struct kvmdirty_region *r, uint64_t new_gpa);
int kd_region_set_logging(struct kd_regions *rs, struct kvmdirty_region *r, bool enable);
/* The same for a caller that holds the lock for writing. */
int kd_region_set_logging_locked(struct kd_regions *rs, struct kvmdirty_region *r, bool enable);
/* Every region; all or nothing (best-effort undo). */
int kd_regions_set_logging(struct kd_regions *rs, bool enable);

/* r is a live region of rs. */
bool kd_region_valid(const struct kd_regions *rs, const struct kvmdirty_region *r);
struct kvmdirty_region *kd_region_at_slot(const struct kd_regions *rs, uint32_t slot);
struct kvmdirty_region *kd_region_at_gpa(const struct kd_regions *rs, uint64_t gpa);
struct kvmdirty_region *kd_region_at_hva(const struct kd_regions *rs, uint64_t hva);
/* fn(slot, ctx) for each region whose host range holds hva; see kd_index_for_each_at(). */
int kd_region_for_each_at_hva(const struct kd_regions *rs, uint64_t hva,
			      int (*fn)(uint32_t slot, void *ctx), void *ctx);
struct kvmdirty_region *kd_region_next(const struct kd_regions *rs, const struct kvmdirty_region *prev);

/* -EBUSY when another sink is installed; NULL uninstalls. */
int kd_regions_set_sink(struct kd_regions *rs, const struct kd_region_sink *sink, void *ctx);

static inline void kd_regions_rdlock(struct kd_regions *rs)
{
	pthread_rwlock_rdlock(&rs->lock);
}

static inline void kd_regions_wrlock(struct kd_regions *rs)
{
	pthread_rwlock_wrlock(&rs->lock);
}

static inline void kd_regions_unlock(struct kd_regions *rs)
{
	pthread_rwlock_unlock(&rs->lock);
}

/* Marks and ring publishing. */
static inline void kd_regions_mark_rdlock(struct kd_regions *rs)
{
	pthread_rwlock_rdlock(&rs->mark_lock);
}

/* Until no move is under way (regions.c): its count, even. */
uint32_t kd_regions_move_wait(const struct kd_regions *rs);

/* A mark's reading of what a move edits: begin (waits out a move under way) and whether to read again. */
static inline uint32_t kd_regions_move_read_begin(const struct kd_regions *rs)
{
	uint32_t s = __atomic_load_n(&rs->move_seq, __ATOMIC_ACQUIRE);

	return s & 1 ? kd_regions_move_wait(rs) : s;
}

static inline bool kd_regions_move_read_retry(const struct kd_regions *rs, uint32_t s)
{
	__atomic_thread_fence(__ATOMIC_ACQUIRE);
	return __atomic_load_n(&rs->move_seq, __ATOMIC_RELAXED) != s;
}

/* A region's gpa, which a move may change under a mark (move_seq). */
static inline uint64_t kd_region_gpa_now(const struct kvmdirty_region *r)
{
	return __atomic_load_n(&r->gpa, __ATOMIC_RELAXED);
}

/* What marks see changes: with lock held for writing. */
static inline void kd_regions_mark_wrlock(struct kd_regions *rs)
{
	pthread_rwlock_wrlock(&rs->mark_lock);
}

static inline void kd_regions_mark_unlock(struct kd_regions *rs)
{
	pthread_rwlock_unlock(&rs->mark_lock);
}

#endif
