// SPDX-License-Identifier: MIT
/*
 * sync: pull what KVM has into the pending pages.  Walks the tracked
 * regions only (a sorted list of their slot ids), so untracked memslots
 * cost nothing.  Every bit fetched is made pending at once, with its
 * counts: a sync that fails partway keeps what it fetched (in DIRTY_LOG
 * mode KVM has already cleared those bits) and returns the error.
 */
#include <errno.h>

#include "dirty-log.h"
#include "export.h"
#include "hooks.h"
#include "tracker.h"

/* pending |= kvm_bmap (and to_clear |= kvm_bmap): the words KVM reported, found with the zero skip. */
static uint64_t merge_log(struct kd_track_region *tr, bool manual)
{
	uint64_t words = KVMDIRTY_BITMAP_WORDS(tr->npages), nbits = words * 64, fresh = 0, b;

	for (b = kvmdirty_bitmap_next_set(tr->kvm_bmap, 0, nbits); b < nbits;
	     b = kvmdirty_bitmap_next_set(tr->kvm_bmap, (b / 64 + 1) * 64, nbits)) {
		size_t i = b / 64;
		uint64_t v = tr->kvm_bmap[i];

		fresh += (uint64_t)__builtin_popcountll(v & ~tr->pending[i]);
		tr->pending[i] |= v;
		if (manual)
			tr->to_clear[i] |= v;
	}
	return fresh;
}

/* Every page of tr pending; returns how many were not. */
static uint64_t all_pending(struct kvmdirty_tracker *t, struct kd_track_region *tr)
{
	uint64_t fresh = tr->npages - tr->pending_count;

	kvmdirty_bitmap_set(tr->pending, 0, tr->npages);
	kd_track_add_pending(t, tr, fresh);
	return fresh;
}

/* Pull one region from KVM: returns the pages that became pending, or -errno. */
static int64_t fetch_region(struct kvmdirty_tracker *t, uint32_t slot, struct kd_track_region *tr,
			    uint64_t *kernel_ns)
{
	uint64_t t0 = kd_now_ns(), n;
	int ret = kd_log_get(t->kvm, slot, tr->kvm_bmap);

	*kernel_ns += kd_now_ns() - t0;
	if (ret == -ENOENT) {
		/*
		 * The slot has no dirty log: logging was switched off behind
		 * the library.  Nothing tells what is written meanwhile, so
		 * every page is pending at every sync, and once more when the
		 * log comes back (writes between this sync and then).
		 */
		tr->log_lost = true;
		if (tr->to_clear)
			kvmdirty_bitmap_clear(tr->to_clear, 0, tr->npages);
		return (int64_t)all_pending(t, tr);
	}
	if (ret < 0)
		return ret;
	n = merge_log(tr, t->mode == KVMDIRTY_MODE_CLEAR_LOG);
	kd_track_add_pending(t, tr, n);
	if (tr->log_lost) {
		tr->log_lost = false;
		n += all_pending(t, tr);
	}
	return (int64_t)n;
}

/* Dirty rate: pages made pending over the last KD_RATE_SAMPLES syncs' span. */
static void rate_sample(struct kvmdirty_tracker *t, uint64_t now, uint64_t pages, uint64_t syncs)
{
	unsigned int count, oldest, i;
	uint64_t sum = 0;

	t->rate_ns[t->rate_pos] = now;
	t->rate_pages[t->rate_pos] = pages;
	count = syncs < KD_RATE_SAMPLES ? (unsigned int)syncs : KD_RATE_SAMPLES;
	oldest = (t->rate_pos + KD_RATE_SAMPLES + 1 - count) % KD_RATE_SAMPLES;
	t->rate_pos = (t->rate_pos + 1) % KD_RATE_SAMPLES;
	/* the oldest sample's pages were made before the span starts */
	for (i = 1; i < count; i++)
		sum += t->rate_pages[(oldest + i) % KD_RATE_SAMPLES];
	if (now - t->rate_ns[oldest] >= 1000000)
		STAT_SET(t, dirty_rate, sum * 1000000000ull / (now - t->rate_ns[oldest]));
}

KD_EXPORT int64_t kvmdirty_tracker_sync(struct kvmdirty_tracker *t)
{
	uint64_t t0, now, kernel_ns = 0, fresh = 0, syncs;
	int ret = 0, r;
	uint32_t i;

	if (!t)
		return -EINVAL;
	t0 = kd_now_ns();
	/* test build only: the clears next() was made to defer */
	ret = kd_track_late_flush(t);
	if (ret < 0)
		return ret;
	if (t->mode == KVMDIRTY_MODE_DIRTY_RING)
		/* a reset failure is reported as a loss too, and handled just below */
		ret = kd_vcpus_harvest(t->vcpus, &kernel_ns);
	/* entries lost since the last sync: protect again before taking anything */
	r = kd_track_reprotect(t, &fresh);
	if (r < 0 && !ret)
		ret = r;
	KD_HOOK_POINT(KD_HOOK_SYNC_FETCH, t);

	kd_regions_rdlock(t->regions);
	for (i = 0; i < t->nr_tracked; i++) {
		struct kd_track_region *tr = &t->slots[t->tracked[i]];
		int64_t n;

		if (tr->log_off) {
			fresh += all_pending(t, tr);
		} else if (t->mode != KVMDIRTY_MODE_DIRTY_RING && !ret) {
			n = fetch_region(t, t->tracked[i], tr, &kernel_ns);
			if (n < 0)
				ret = (int)n; /* no more GETs; what other threads reported is still taken */
			else
				fresh += (uint64_t)n;
		}
		if (__atomic_exchange_n(&tr->async_any, 0, __ATOMIC_ACQ_REL)) {
			n = (int64_t)kvmdirty_bitmap_take(tr->pending, tr->async, 0, tr->npages);
			kd_track_add_pending(t, tr, (uint64_t)n);
			fresh += (uint64_t)n;
		}
	}
	kd_regions_unlock(t->regions);

	syncs = STAT_ADD(t, syncs, 1) + 1;
	STAT_SET(t, last_sync_pages, fresh);
	STAT_ADD(t, total_sync_pages, fresh);
	STAT_SET(t, last_sync_kernel_ns, kernel_ns);
	now = kd_now_ns();
	STAT_SET(t, last_sync_lib_ns, now - t0 - kernel_ns);
	rate_sample(t, now, fresh, syncs);
	return ret < 0 ? ret : (int64_t)fresh;
}
