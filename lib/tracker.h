/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_TRACKER_H
#define KVMDIRTY_TRACKER_H

/*
 * The tracker: one view of what is dirty, whatever the backend.  Its
 * files split by job: tracker.c (life: new, free, start, stop, what the
 * regions layer reports), tracker-state.c (per-region state, shared by
 * all), tracker-sync.c, tracker-next.c (handing out, with its protect
 * step), tracker-mark.c, tracker-ring.c (what the rings report, the
 * reaper, re-protecting after lost entries).
 *
 * Per tracked region, by slot id:
 *   pending   pages synced and not yet handed out; touched by sync and
 *             next only (one thread at a time), and by region changes,
 *             which hold the regions lock for writing;
 *   async     pages reported by other threads: ring harvests and marks;
 *             set atomically, moved into pending by sync (fetch-and-clear);
 *   kvm_bmap  the KVM_GET_DIRTY_LOG buffer, owned and reused;
 *   to_clear  (CLEAR_LOG) bits fetched from KVM and not yet cleared
 *             there: only these are ever passed to KVM_CLEAR_DIRTY_LOG,
 *             so no dirty bit KVM has not reported yet is cleared.
 *
 * Locking: the per-slot state and the list of tracked slots live and die
 * under the regions lock (kd_regions_rdlock for use: sync, next, marks,
 * ring publishing; the write side is held by region changes, start and
 * stop).  The vCPU set's lock orders ring harvests; it is taken before
 * the regions lock, never while holding it.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "kvmdirty.h"
#include "regions.h"
#include "vcpu.h"

struct kd_track_region {
	uint64_t npages;
	uint64_t *pending;
	uint64_t *async;
	uint64_t *kvm_bmap;
	uint64_t *to_clear;
	uint64_t pending_count;
	uint32_t async_any; /* atomic: async may hold bits */
	bool tracking;
	/* logging is off: every page is pending at every sync */
	bool log_off;
	/* ... because a re-protect could not switch it back on (retried; not the VMM's choice) */
	bool log_off_ours;
	/* GET said ENOENT (logging off behind the library): all pending when it works again */
	bool log_lost;
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
	uint64_t pending_total; /* written by sync, next and changes; read by anyone */
	uint32_t cursor_slot;
	uint64_t cursor_page;

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
	/* clears deferred by the clear_late hook: the real clear path, reordered */
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

/* tracker-state.c */
uint64_t *kd_bitmap_alloc(uint64_t nbits);
int kd_track_state_new(struct kvmdirty_tracker *t, uint64_t npages, struct kd_track_region *ret);
void kd_track_state_free(struct kd_track_region *tr);
/* with the regions lock held for writing */
void kd_track_install(struct kvmdirty_tracker *t, uint32_t slot, const struct kd_track_region *tr);
void kd_track_drop(struct kvmdirty_tracker *t, uint32_t slot);
/* every page of a tracked region pending again, as after start (logging back on); returns how many were not */
uint64_t kd_track_rearm(struct kvmdirty_tracker *t, struct kd_track_region *tr);
/* with the regions lock held for reading: pages reported by any thread */
void kd_track_mark(struct kvmdirty_tracker *t, uint32_t slot, uint64_t first, uint64_t end);
void kd_track_add_pending(struct kvmdirty_tracker *t, struct kd_track_region *tr, uint64_t n);
void kd_track_sub_pending(struct kvmdirty_tracker *t, struct kd_track_region *tr, uint64_t n);
/* index of the first tracked slot >= slot */
uint32_t kd_track_lower_bound(const struct kvmdirty_tracker *t, uint32_t slot);

/* tracker-ring.c */
extern const struct kd_ring_sink kd_track_ring_sink;
int kd_track_reaper_start(struct kvmdirty_tracker *t, uint32_t ms);
void kd_track_reaper_stop(struct kvmdirty_tracker *t);
/* if entries were lost: logging off and on for every tracked region, each wholly pending */
int kd_track_reprotect(struct kvmdirty_tracker *t, uint64_t *fresh);

/* tracker-next.c: the test build's deferred clears, issued (sync calls it first) */
#ifdef KD_TEST_HOOKS
int kd_track_late_flush(struct kvmdirty_tracker *t);
void kd_track_late_free(struct kvmdirty_tracker *t);
#else
static inline int kd_track_late_flush(struct kvmdirty_tracker *t) { (void)t; return 0; }
static inline void kd_track_late_free(struct kvmdirty_tracker *t) { (void)t; }
#endif

#endif
