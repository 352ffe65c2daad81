// SPDX-License-Identifier: MIT
/*
 * next: hand a consumer's pending pages out as runs, with the protect step.
 *
 * Protect before read: in CLEAR_LOG mode, next() issues the
 * KVM_CLEAR_DIRTY_LOG of every dirty chunk a handed-out page lies in
 * before it returns (only with bits fetched from KVM, see to_clear); the
 * ring and the legacy log re-protect in sync, before next() can see a
 * page.  The caller reads pages after next() returned, so a write after
 * its read is reported by a later sync.  to_clear is shared by all
 * consumers: a clear one consumer issues only erases bits every consumer
 * already has pending (the fan-out came first), and one consumer's clears
 * and another's are kept apart by log_lock (doc/consumers.md, C2 and C3).
 */
#include <errno.h>
#include <stdlib.h>

#include "dirty-log.h"
#include "export.h"
#include "hooks.h"
#include "tracker.h"

/* KVM_CLEAR_DIRTY_LOG of one chunk's fetched bits, then forget them. */
static int clear_chunk(struct kvmdirty_tracker *t, uint32_t slot, struct kd_track_region *tr, uint64_t chunk)
{
	uint64_t first = chunk * t->chunk_pages;
	uint64_t end = first + t->chunk_pages < tr->npages ? first + t->chunk_pages : tr->npages;
	int ret;

	if (kvmdirty_bitmap_is_clear(tr->to_clear, first, end))
		return 0;
	ret = kd_log_clear(t->kvm, slot, tr->npages, first, end - first, tr->to_clear + first / 64);
	if (ret < 0)
		return ret;
	kvmdirty_bitmap_clear(tr->to_clear, first, end);
	STAT_ADD(t, clear_calls, 1);
	return 0;
}

#ifdef KD_TEST_HOOKS
/* The clear_late hook: the same clears, issued at the next sync, after the caller read the pages. */
static int late_add(struct kvmdirty_tracker *t, uint32_t slot, uint64_t chunk)
{
	if (t->nr_late == t->late_cap) {
		size_t cap = t->late_cap ? t->late_cap * 2 : 64;
		struct kd_late_clear *l = realloc(t->late, cap * sizeof(*l));

		if (!l)
			return -ENOMEM;
		t->late = l;
		t->late_cap = cap;
	}
	t->late[t->nr_late++] = (struct kd_late_clear){ slot, chunk };
	return 0;
}

int kd_track_late_flush(struct kvmdirty_tracker *t)
{
	size_t i;
	int ret = 0;

	pthread_mutex_lock(&t->log_lock);
	for (i = 0; i < t->nr_late && ret >= 0; i++) {
		struct kd_track_region *tr = &t->slots[t->late[i].slot];

		if (tr->tracking)
			ret = clear_chunk(t, t->late[i].slot, tr, t->late[i].chunk);
	}
	t->nr_late = 0;
	pthread_mutex_unlock(&t->log_lock);
	return ret;
}

void kd_track_late_free(struct kvmdirty_tracker *t)
{
	free(t->late);
	t->late = NULL;
	t->nr_late = t->late_cap = 0;
}
#endif

/*
 * Protect [first, first + n) of a region: clear the dirty chunks it
 * touches.  Runs come in address order within one call, so chunks below
 * *done were handled for an earlier run of this call: many small runs in
 * one chunk check it once, not once each.
 */
int kd_track_protect(struct kvmdirty_tracker *t, uint32_t slot, uint64_t first, uint64_t n, uint64_t *done)
{
	uint64_t c = first / t->chunk_pages, last = (first + n - 1) / t->chunk_pages;
	struct kd_track_region *tr = &t->slots[slot];
	int ret;

	if (t->mode != KVMDIRTY_MODE_CLEAR_LOG)
		return 0;
	for (c = c > *done ? c : *done; c <= last; c++) {
		KD_HOOK_POINT(KD_HOOK_PROTECT, t);
		pthread_mutex_lock(&t->log_lock);
#ifdef KD_TEST_HOOKS
		if (KD_HOOK_CLEAR_LATE())
			ret = late_add(t, slot, c);
		else
#endif
			ret = clear_chunk(t, slot, tr, c);
		pthread_mutex_unlock(&t->log_lock);
		if (ret < 0)
			return ret;
		*done = c + 1;
	}
	return 0;
}

/* Hand out runs of one region from page *pos; returns ranges written or -errno. */
static int next_in_region(struct kvmdirty_consumer *c, uint32_t slot, uint64_t *pos, uint64_t end,
			  struct kvmdirty_range *out, size_t max, uint64_t *pages_left)
{
	struct kvmdirty_tracker *t = c->t;
	struct kd_cons_slot *cs = &c->slots[slot];
	struct kvmdirty_region *r = kd_region_at_slot(t->regions, slot);
	struct kvmdirty_run runs[64];
	uint64_t done = 0;
	size_t k = 0, n, i;
	uint64_t lim;
	int ret;

	/*
	 * From the next pending page on, the scan stops where the pages left
	 * run out: a run is cut there anyway, and scanning on to its end made
	 * each call cost the rest of the region (all of it pending on a first
	 * pass: quadratic in its size over the calls of a pass).
	 */
	while (k < max && *pages_left) {
		*pos = kvmdirty_bitmap_next_set(cs->pending, *pos, end);
		if (*pos >= end) {
			*pos = end;
			break;
		}
		lim = end - *pos > *pages_left ? *pos + *pages_left : end;
		n = kvmdirty_bitmap_runs(cs->pending, pos, lim, runs, max - k < 64 ? max - k : 64);
		if (!n)
			break;
		for (i = 0; i < n && k < max && *pages_left; i++) {
			uint64_t first = runs[i].first, cnt = runs[i].count;

			if (cnt > *pages_left)
				cnt = *pages_left;
			ret = kd_track_protect(t, slot, first, cnt, &done);
			if (ret < 0) {
				*pos = first; /* the cursor stays on what was not handed out */
				return k ? (int)k : ret;
			}
			kvmdirty_bitmap_clear(cs->pending, first, first + cnt);
			kd_cons_add_pending(c, cs, -(int64_t)cnt);
			kd_cons_owe(c, slot, first, cnt);
			*pages_left -= cnt;
			out[k++] = (struct kvmdirty_range){
				.region = r,
				.page = first,
				.npages = cnt,
				.gpa = r->gpa + first * t->page_size,
				.hva = (char *)r->hva + first * t->page_size,
			};
			*pos = first + cnt;
		}
		if (i < n)
			break;
	}
	return (int)k;
}

int kd_cons_next(struct kvmdirty_consumer *c, struct kvmdirty_range *out, size_t max, uint64_t max_pages)
{
	struct kvmdirty_tracker *t = c->t;
	uint64_t pages_left = max_pages ? max_pages : UINT64_MAX, start_page;
	uint32_t nt, step, first_idx;
	size_t k = 0;
	int ret, err = 0;

	if (!max)
		return 0;
	kd_regions_rdlock(t->regions);
	pthread_mutex_lock(&c->lock);
	nt = t->nr_tracked;
	if (!c->pending_total || !nt)
		goto out;
	/* resume at the cursor; if its region went, at the next tracked one */
	first_idx = kd_track_lower_bound(t, c->cursor_slot);
	start_page = first_idx < nt && t->tracked[first_idx] == c->cursor_slot ? c->cursor_page : 0;
	if (start_page > t->slots[c->cursor_slot].npages)
		start_page = 0;
	if (first_idx == nt)
		first_idx = 0;
	/* one lap from the cursor, ending with the cursor region's head */
	for (step = 0; step <= nt && k < max && pages_left && c->pending_total; step++) {
		uint32_t slot = t->tracked[(first_idx + step) % nt];
		uint64_t pos, end;

		if (!c->slots[slot].pending_count)
			continue;
		pos = step == 0 ? start_page : 0;
		end = step == nt ? start_page : t->slots[slot].npages;
		if (pos >= end)
			continue;
		ret = next_in_region(c, slot, &pos, end, out + k, max - k, &pages_left);
		if (ret < 0) {
			err = ret;
			break;
		}
		k += (size_t)ret;
		if (ret) {
			c->cursor_slot = slot;
			c->cursor_page = pos;
		}
	}
out:
	pthread_mutex_unlock(&c->lock);
	kd_regions_unlock(t->regions);
	/* pages a failed CLEAR would have covered stay pending */
	return k ? (int)k : err;
}

KD_EXPORT int kvmdirty_tracker_next(struct kvmdirty_tracker *t, struct kvmdirty_range *out, size_t max,
				    uint64_t max_pages)
{
	if (!t || (!out && max))
		return -EINVAL;
	return kd_cons_next(t->dflt, out, max, max_pages);
}
