/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_TRACKER_H
#define KVMDIRTY_TRACKER_H

/*
 * The tracker: one view of what is dirty, whatever the backend.  Its
 * files split by job: tracker.c (life: new, free, start, stop, what the
 * regions layer reports), tracker-state.c (per-region state, shared by
 * all), tracker-cstate.c (each consumer's own state, joining, leaving),
 * tracker-sync.c (fetch and fan-out), tracker-next.c (handing out, with
 * its protect step), tracker-consumer.c (the consumers' API: commit,
 * abort, counts), tracker-mark.c, tracker-ring.c (what the rings report,
 * the reaper, re-protecting after lost entries).
 *
 * Consumers (tracker-consumer.c) each have their own pending pages,
 * cursor and pages owed (handed out, not yet committed); the tracker
 * keeps what is shared: the fetch from KVM, done once per sync for all of
 * them, fanned out to every consumer's pending set.
 *
 * Per tracked region, by slot id, shared by all consumers:
 *   async     pages reported by other threads: ring harvests and marks;
 *             set atomically, taken by sync (fetch-and-clear);
 *   fresh     what one sync fetched (KVM's bitmap, the async pages taken),
 *             being fanned out; all zero between syncs in ring mode;
 *   to_clear  (CLEAR_LOG) bits fetched from KVM and not yet cleared
 *             there: only these are ever passed to KVM_CLEAR_DIRTY_LOG,
 *             so no dirty bit KVM has not reported yet is cleared.
 * Per consumer and tracked region (struct kd_cons_slot): pending, and
 * owed unless the consumer commits as it goes: two bits a page at most.
 *
 * Locks, in the order they are taken (doc/consumers.md says why):
 *   sync_lock        one sync at a time, from its re-protect through its
 *                    fan-out; consumers join and leave under it;
 *   regions lock     read: sync, next, commit, abort, join, leave; write:
 *                    region changes, start, stop, re-protect;
 *   consumer lock    its pending and owed: its own calls, and a fan-out
 *                    into it;
 *   log_lock         to_clear and every KVM_CLEAR_DIRTY_LOG; a GET and
 *                    its merge into to_clear.
 * Marks and ring publishing take the regions' mark_lock alone; start,
 * stop and removal take it, inside the regions lock, to change the list
 * of tracked slots.  The vCPU set's lock orders ring harvests; it is
 * taken before the regions' locks, never while holding one.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "kvmdirty.h"
#include "regions.h"
#include "vcpu.h"

struct kd_track_region {
	uint64_t npages;
	uint64_t *async;
	uint64_t *fresh;
	uint64_t *to_clear;
	uint32_t async_any; /* atomic: async may hold bits */
	bool tracking;
	/* logging is off: every page is pending at every sync */
	bool log_off;
	/* ... because a re-protect could not switch it back on (retried; not the VMM's choice) */
	bool log_off_ours;
	/* GET said ENOENT (logging off behind the library): all pending when it works again */
	bool log_lost;
	/*
	 * Consumers that started the region and have not stopped it (the
	 * default one for kvmdirty_tracker_start()): logging stays on until
	 * the last one stops or leaves.  Under the regions lock for writing.
	 */
	uint32_t claims;
};

/* One consumer's state in one tracked region. */
struct kd_cons_slot {
	uint64_t *pending;
	uint64_t *owed; /* NULL: the consumer commits as it goes */
	uint64_t pending_count;
	uint64_t owed_count;
	uint64_t owed_lo, owed_hi; /* owed's words outside [lo, hi) are zero */
	bool listed;		   /* in the consumer's owed list */
	bool claims;		   /* the consumer started the region (counted in its claims) */
};

struct kvmdirty_consumer {
	struct kvmdirty_tracker *t;
	uint32_t flags;
	pthread_mutex_t lock;
	struct kd_cons_slot *slots; /* nr_slots entries, by slot id */
	uint64_t pending_total;	    /* written under lock (or the regions lock for writing); read by anyone */
	uint64_t owed_total;
	uint32_t cursor_slot;
	uint64_t cursor_page;
	uint16_t *owed_list; /* slots that may hold owed pages */
	uint32_t nr_owed_list;
	uint64_t count_ns;    /* counting consumers: when the last count was taken */
	uint64_t count_carry; /* pages taken by a count that failed later on, for the next */
};

#define KD_RATE_SAMPLES 8

struct kvmdirty_tracker {
	struct kd_kvm *kvm;
	struct kd_regions *regions;
	struct kd_vcpus *vcpus;
	void *owner; /* the VM handle; opaque here */
	enum kvmdirty_mode mode;
	uint64_t chunk_pages;
	uint64_t page_size;

	struct kd_track_region *slots; /* nr_slots entries, by slot id */
	uint32_t nr_slots;
	uint16_t *tracked; /* slot ids of tracked regions, ascending */
	uint32_t nr_tracked;
	/*
	 * By slot id, atomic: regions a DIRTY_RING sync must visit, those
	 * marked (by rings or by the VMM) and those with logging off; the
	 * others hold nothing for it.  Set after the mark it announces;
	 * sync takes each word with an exchange, and sets again the bit of
	 * a region whose logging is still off.  Left alone in other modes.
	 */
	uint64_t *touched;

	pthread_mutex_t sync_lock;
	pthread_mutex_t log_lock;
	struct kvmdirty_consumer **consumers;
	uint32_t nr_consumers, consumers_cap;
	struct kvmdirty_consumer *dflt; /* what the tracker's own calls act on */

	/* ring entries were lost: sync re-protects every tracked region first */
	uint32_t lost;
	bool reprotecting; /* under the regions lock: its logging toggles are not the VMM's */

	struct kvmdirty_stats stats; /* every field read and written atomically */
	uint64_t rate_ns[KD_RATE_SAMPLES], rate_pages[KD_RATE_SAMPLES];
	unsigned int rate_pos;

	pthread_t reaper;
	bool reaper_on, reaper_stop;
	uint32_t reaper_ms;
	pthread_mutex_t reaper_lock;
	pthread_cond_t reaper_cond;

#ifdef KD_TEST_HOOKS
	/* clears deferred by the clear_late hook (under log_lock): the real clear path, reordered */
	struct kd_late_clear {
		uint32_t slot;
		uint64_t chunk;
	} *late;
	size_t nr_late, late_cap;
#endif
};

#define STAT_ADD(t, field, v) __atomic_fetch_add(&(t)->stats.field, (v), __ATOMIC_RELAXED)
#define STAT_SET(t, field, v) __atomic_store_n(&(t)->stats.field, (v), __ATOMIC_RELAXED)
#define STAT_GET(t, field) __atomic_load_n(&(t)->stats.field, __ATOMIC_RELAXED)

/* tracker.c */
int kd_tracker_new(struct kd_kvm *kvm, struct kd_regions *regions, struct kd_vcpus *vcpus,
		   const struct kvmdirty_tracker_opts *opts, void *owner, struct kvmdirty_tracker **ret_tracker);
void kd_tracker_free(struct kvmdirty_tracker *t);
/*
 * c's claims (kvmdirty_consumer_start/_stop, the tracker's own through
 * its default consumer): start tracks the region where no one did and
 * claims it for c; stop gives c's claim up, and the last one turns
 * logging off.  for_good: c is leaving (a failed switch hands its claim
 * to the default consumer).
 */
int kd_track_start(struct kvmdirty_tracker *t, struct kvmdirty_consumer *c, struct kvmdirty_region *r);
int kd_track_stop(struct kvmdirty_tracker *t, struct kvmdirty_consumer *c, struct kvmdirty_region *r, bool for_good);

/* tracker-state.c */
int kd_track_state_new(struct kvmdirty_tracker *t, uint64_t npages, struct kd_track_region *ret);
void kd_track_state_free(struct kd_track_region *tr);
/* with the regions lock held for writing: -ENOMEM and nothing changed, or tracked */
int kd_track_install(struct kvmdirty_tracker *t, uint32_t slot, const struct kd_track_region *tr);
void kd_track_drop(struct kvmdirty_tracker *t, uint32_t slot);
/* every page of a tracked region pending again for every consumer, as after start (logging back on);
 * returns how many were not for self (NULL: 0) */
uint64_t kd_track_rearm(struct kvmdirty_tracker *t, uint32_t slot, const struct kvmdirty_consumer *self);
/* with the regions' mark lock held for reading: pages reported by any thread */
void kd_track_mark(struct kvmdirty_tracker *t, uint32_t slot, uint64_t first, uint64_t end);

/* The next DIRTY_RING sync visits slot (see touched). */
static inline void kd_track_touch(struct kvmdirty_tracker *t, uint32_t slot)
{
	__atomic_fetch_or(&t->touched[slot / 64], 1ull << (slot % 64), __ATOMIC_RELEASE);
}
/* index of the first tracked slot >= slot */
uint32_t kd_track_lower_bound(const struct kvmdirty_tracker *t, uint32_t slot);

/* tracker-cstate.c: a consumer's own state; fan-out with sync_lock and the regions lock held for reading */
uint64_t *kd_bitmap_alloc(uint64_t nbits);
bool kd_cons_owes(const struct kvmdirty_consumer *c);
void kd_cons_add_owed(struct kvmdirty_consumer *c, struct kd_cons_slot *cs, int64_t n);
int kd_cons_new(struct kvmdirty_tracker *t, uint32_t flags, bool dflt, struct kvmdirty_consumer **ret);
void kd_cons_free(struct kvmdirty_consumer *c);
/* one region's state for c, every page pending or none; -ENOMEM */
int kd_cons_slot_new(struct kvmdirty_consumer *c, uint64_t npages, bool all, struct kd_cons_slot *ret);
void kd_cons_slot_drop(struct kvmdirty_consumer *c, uint32_t slot);
/* every page of slot pending for c; returns how many were not */
uint64_t kd_cons_all_pending(struct kvmdirty_consumer *c, uint32_t slot, uint64_t npages);
/* c's pending |= fresh over npages; returns how many were not pending */
uint64_t kd_cons_fan_out(struct kvmdirty_consumer *c, uint32_t slot, const uint64_t *fresh, uint64_t npages);
void kd_cons_add_pending(struct kvmdirty_consumer *c, struct kd_cons_slot *cs, int64_t n);
/* under c's lock: [first, first + n) of slot handed out, owed until commit or abort */
void kd_cons_owe(struct kvmdirty_consumer *c, uint32_t slot, uint64_t first, uint64_t n);
/* with the regions lock held for reading, c's lock held: protect [first, first + n) (tracker-next.c) */
int kd_track_protect(struct kvmdirty_tracker *t, uint32_t slot, uint64_t first, uint64_t n, uint64_t *done);
int64_t kd_cons_sync(struct kvmdirty_consumer *c);
int kd_cons_next(struct kvmdirty_consumer *c, struct kvmdirty_range *out, size_t max, uint64_t max_pages);

/* tracker-ring.c */
extern const struct kd_ring_sink kd_track_ring_sink;
int kd_track_reaper_start(struct kvmdirty_tracker *t, uint32_t ms);
void kd_track_reaper_stop(struct kvmdirty_tracker *t);
/* if entries were lost: logging off and on for every tracked region, each wholly pending */
int kd_track_reprotect(struct kvmdirty_tracker *t, const struct kvmdirty_consumer *self, uint64_t *fresh,
		       uint64_t *fetched);

/* tracker-next.c: the test build's deferred clears, issued (sync calls it first, with the regions lock read) */
#ifdef KD_TEST_HOOKS
int kd_track_late_flush(struct kvmdirty_tracker *t);
void kd_track_late_free(struct kvmdirty_tracker *t);
#else
static inline int kd_track_late_flush(struct kvmdirty_tracker *t) { (void)t; return 0; }
static inline void kd_track_late_free(struct kvmdirty_tracker *t) { (void)t; }
#endif

#endif
