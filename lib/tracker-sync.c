// SPDX-License-Identifier: MIT
/*
 * sync: pull what KVM has and fan it out to every consumer's pending
 * pages, whichever consumer asked.  Walks the tracked regions only (a
 * sorted list of their slot ids), so untracked memslots cost nothing.
 * Every bit fetched is made pending at once, with its counts: a sync that
 * fails partway keeps what it fetched (in DIRTY_LOG mode KVM has already
 * cleared those bits) and returns the error.
 */
#include <string.h>
#include <errno.h>

#include "dirty-log.h"
#include "export.h"
#include "hooks.h"
#include "tracker.h"

/*
 * to_clear |= fresh: the words KVM reported, found with the zero skip.
 * Returns the bits that were not there: a page fetched and not yet
 * cleared is reported by every GET until it is, and counts once.  *any:
 * whether KVM reported any bit at all.
 */
static uint64_t merge_to_clear(struct kd_track_region *tr, bool *any)
{
	uint64_t nbits = KVMDIRTY_BITMAP_WORDS(tr->npages) * 64, b, n = 0;

	*any = false;
	for (b = kvmdirty_bitmap_next_set(tr->fresh, 0, nbits); b < nbits;
	     b = kvmdirty_bitmap_next_set(tr->fresh, (b / 64 + 1) * 64, nbits)) {
		n += (uint64_t)__builtin_popcountll(tr->fresh[b / 64] & ~tr->to_clear[b / 64]);
		tr->to_clear[b / 64] |= tr->fresh[b / 64];
		*any = true;
	}
	return n;
}

enum fetched {
	FETCHED_NONE,	/* fresh holds nothing of this sync */
	FETCHED_BITMAP, /* fresh holds what to fan out */
	FETCHED_ALL,	/* every page, for every consumer */
};

/*
 * Pull one region from KVM into fresh.  In CLEAR_LOG, the GET and its
 * merge into to_clear are one step under log_lock, so that no clear lands
 * between them (doc/consumers.md, C3).
 */
static int fetch_region(struct kvmdirty_tracker *t, uint32_t slot, struct kd_track_region *tr,
			uint64_t *kernel_ns, enum fetched *what, uint64_t *fetched)
{
	uint64_t t0, n;
	int ret;

	pthread_mutex_lock(&t->log_lock);
	t0 = kd_now_ns();
	ret = kd_log_get(t->kvm, slot, tr->fresh);
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
		*what = FETCHED_ALL;
		ret = 0;
	} else if (ret == 0) {
		bool any;

		if (t->mode == KVMDIRTY_MODE_CLEAR_LOG) {
			*fetched += merge_to_clear(tr, &any);
		} else {
			n = kvmdirty_bitmap_count(tr->fresh, 0, tr->npages);
			*fetched += n;
			any = n;
		}
		/* a clean region: nothing to fan out (fresh is all zero) */
		*what = tr->log_lost ? FETCHED_ALL : any ? FETCHED_BITMAP : FETCHED_NONE;
		tr->log_lost = false;
	}
	pthread_mutex_unlock(&t->log_lock);
	return ret;
}

/* Dirty rate: pages fetched over the last KD_RATE_SAMPLES syncs' span. */
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

/* Zero the words of fresh that hold bits (ring mode keeps it zero between syncs). */
static void fresh_zero(struct kd_track_region *tr)
{
	uint64_t nbits = KVMDIRTY_BITMAP_WORDS(tr->npages) * 64, b;

	for (b = kvmdirty_bitmap_next_set(tr->fresh, 0, nbits); b < nbits;
	     b = kvmdirty_bitmap_next_set(tr->fresh, (b / 64 + 1) * 64, nbits))
		tr->fresh[b / 64] = 0;
}

/*
 * Fetch one region (KVM's log, the pages other threads reported) and fan
 * it out to every consumer; returns what became pending for self.
 */
static uint64_t sync_region(struct kvmdirty_tracker *t, struct kvmdirty_consumer *self, uint32_t slot,
			    uint64_t *kernel_ns, uint64_t *fetched, int *err)
{
	struct kd_track_region *tr = &t->slots[slot];
	enum fetched what = FETCHED_NONE;
	uint64_t mine = 0, got = 0, n;
	bool took = false;
	uint32_t i;
	int ret;

	if (tr->log_off) {
		what = FETCHED_ALL;
	} else if (t->mode != KVMDIRTY_MODE_DIRTY_RING && !*err) {
		ret = fetch_region(t, slot, tr, kernel_ns, &what, &got);
		if (ret < 0)
			*err = ret; /* no more GETs; what other threads reported is still taken */
	}
	if (__atomic_exchange_n(&tr->async_any, 0, __ATOMIC_ACQ_REL)) {
		/* the GET's bits stay; anything else in fresh is a failed GET's */
		if (what == FETCHED_NONE && t->mode != KVMDIRTY_MODE_DIRTY_RING)
			memset(tr->fresh, 0, KVMDIRTY_BITMAP_WORDS(tr->npages) * 8);
		got += kvmdirty_bitmap_take(tr->fresh, tr->async, 0, tr->npages);
		took = true;
		if (what == FETCHED_NONE)
			what = FETCHED_BITMAP;
	}
	if (what == FETCHED_NONE)
		return 0;
	/* what this sync brought, whoever had it pending already: the statistics' figure */
	*fetched += what == FETCHED_ALL ? tr->npages : got;
	KD_HOOK_POINT(KD_HOOK_FAN_OUT, t);
	for (i = 0; i < t->nr_consumers; i++) {
		struct kvmdirty_consumer *c = t->consumers[i];

		pthread_mutex_lock(&c->lock);
		if (what == FETCHED_ALL)
			n = kd_cons_all_pending(c, slot, tr->npages);
		else
			n = kd_cons_fan_out(c, slot, tr->fresh, tr->npages);
		pthread_mutex_unlock(&c->lock);
		if (c == self)
			mine = n;
	}
	if (t->mode == KVMDIRTY_MODE_DIRTY_RING && took)
		fresh_zero(tr);
	return mine;
}

/*
 * DIRTY_RING: only the regions touched since the last sync hold anything
 * (rings publish into async; KVM keeps no log to GET), so only they are
 * visited, in slot order as the tracked list would have them.  A region
 * whose logging is still off is all pending at every sync: its bit is set
 * again for the next.  Under the regions lock for reading, so tracking
 * and log_off hold still.
 */
static uint64_t sync_touched(struct kvmdirty_tracker *t, struct kvmdirty_consumer *self, uint64_t *kernel_ns,
			     uint64_t *fetched, int *err)
{
	uint32_t w, slot, words = t->nr_slots / 64 + 1;
	uint64_t fresh = 0, bits;

	for (w = 0; w < words; w++) {
		if (!__atomic_load_n(&t->touched[w], __ATOMIC_RELAXED))
			continue;
		/* acquire: pairs with kd_track_touch(), after the marks it announces */
		bits = __atomic_exchange_n(&t->touched[w], 0, __ATOMIC_ACQ_REL);
		for (; bits; bits &= bits - 1) {
			slot = w * 64 + (uint32_t)__builtin_ctzll(bits);
			if (slot >= t->nr_slots || !t->slots[slot].tracking)
				continue;
			fresh += sync_region(t, self, slot, kernel_ns, fetched, err);
			if (t->slots[slot].log_off)
				kd_track_touch(t, slot);
		}
	}
	return fresh;
}

int64_t kd_cons_sync(struct kvmdirty_consumer *c)
{
	struct kvmdirty_tracker *t = c->t;
	uint64_t t0, now, kernel_ns = 0, fresh = 0, fetched = 0, syncs;
	int ret = 0, r;
	uint32_t i;

	t0 = kd_now_ns();
	if (t->mode == KVMDIRTY_MODE_DIRTY_RING)
		/* a reset failure is reported as a loss too, and handled just below */
		ret = kd_vcpus_harvest(t->vcpus, &kernel_ns);
	/*
	 * One sync at a time, from the re-protect to the last fan-out: a
	 * consumer's sync returns only once whatever an earlier one fetched
	 * has reached it, and joins see no fan-out half done.
	 */
	pthread_mutex_lock(&t->sync_lock);
	/* entries lost since the last sync: protect again before taking anything */
	r = kd_track_reprotect(t, c, &fresh, &fetched);
	if (r < 0 && !ret)
		ret = r;
	KD_HOOK_POINT(KD_HOOK_SYNC_FETCH, t);

	kd_regions_rdlock(t->regions);
	/* test build only: the clears next() was made to defer */
	r = kd_track_late_flush(t);
	if (r < 0 && !ret)
		ret = r;
	if (t->mode == KVMDIRTY_MODE_DIRTY_RING)
		fresh += sync_touched(t, c, &kernel_ns, &fetched, &ret);
	else
		for (i = 0; i < t->nr_tracked; i++)
			fresh += sync_region(t, c, t->tracked[i], &kernel_ns, &fetched, &ret);
	kd_regions_unlock(t->regions);

	syncs = STAT_ADD(t, syncs, 1) + 1;
	STAT_SET(t, last_sync_pages, fetched);
	STAT_ADD(t, total_sync_pages, fetched);
	STAT_SET(t, last_sync_kernel_ns, kernel_ns);
	now = kd_now_ns();
	STAT_SET(t, last_sync_lib_ns, now - t0 - kernel_ns);
	rate_sample(t, now, fetched, syncs);
	pthread_mutex_unlock(&t->sync_lock);
	return ret < 0 ? ret : (int64_t)fresh;
}

KD_EXPORT int64_t kvmdirty_tracker_sync(struct kvmdirty_tracker *t)
{
	return t ? kd_cons_sync(t->dflt) : -EINVAL;
}
