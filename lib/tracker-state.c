// SPDX-License-Identifier: MIT
/* The tracker's per-region state: allocation, the list of tracked slots, marks, counts. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "hooks.h"
#include "tracker.h"

static void bitmap_zero(uint64_t *map, uint64_t nbits)
{
	memset(map, 0, KVMDIRTY_BITMAP_WORDS(nbits) * 8);
}

void kd_track_state_free(struct kd_track_region *tr)
{
	free(tr->async);
	free(tr->fresh);
	free(tr->to_clear);
	memset(tr, 0, sizeof(*tr));
}

/* What every page pending means for to_clear (see kd_track_state_new()). */
static void to_clear_after_arm(const struct kvmdirty_tracker *t, struct kd_track_region *tr)
{
	if (!tr->to_clear)
		return;
	bitmap_zero(tr->to_clear, tr->npages);
	if (t->mode == KVMDIRTY_MODE_CLEAR_LOG && t->kvm->initially_set)
		kvmdirty_bitmap_set(tr->to_clear, 0, tr->npages);
}

int kd_track_state_new(struct kvmdirty_tracker *t, uint64_t npages, struct kd_track_region *ret)
{
	bool manual = t->mode == KVMDIRTY_MODE_CLEAR_LOG;
	struct kd_track_region n = { .npages = npages };

	n.async = kd_bitmap_alloc(npages);
	n.fresh = kd_bitmap_alloc(npages);
	if (manual)
		n.to_clear = kd_bitmap_alloc(npages);
	if (!n.async || !n.fresh || (manual && !n.to_clear)) {
		kd_track_state_free(&n);
		return -ENOMEM;
	}
	bitmap_zero(n.async, npages);
	bitmap_zero(n.fresh, npages); /* ring mode keeps it zero between syncs */
	/*
	 * With INITIALLY_SET, KVM starts the slot all dirty and unprotected:
	 * take that as fetched, so that the first pass clears (protects) each
	 * chunk before handing it out and the next GET reports only what was
	 * written after, instead of every page a second time.  Clearing a
	 * bit not fetched is safe here because every page is pending for
	 * every consumer and is handed out only after its chunk's clear.
	 */
	to_clear_after_arm(t, &n);
	*ret = n;
	return 0;
}

uint32_t kd_track_lower_bound(const struct kvmdirty_tracker *t, uint32_t slot)
{
	uint32_t lo = 0, hi = t->nr_tracked;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (t->tracked[mid] < slot)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/*
 * Every consumer's state first (the part that can fail), then, with marks
 * held off, the region joins the list marks walk.
 */
int kd_track_install(struct kvmdirty_tracker *t, uint32_t slot, const struct kd_track_region *tr)
{
	uint32_t pos = kd_track_lower_bound(t, slot), i;
	struct kd_cons_slot *cs;
	int ret;

	for (i = 0; i < t->nr_consumers; i++) {
		struct kvmdirty_consumer *c = t->consumers[i];

		ret = kd_cons_slot_new(c, tr->npages, true, &c->slots[slot]);
		if (ret < 0) {
			while (i--)
				kd_cons_slot_drop(t->consumers[i], slot);
			return ret;
		}
		cs = &c->slots[slot];
		kd_cons_add_pending(c, cs, (int64_t)tr->npages);
	}
	kd_regions_mark_wrlock(t->regions);
	t->slots[slot] = *tr;
	t->slots[slot].tracking = true;
	memmove(t->tracked + pos + 1, t->tracked + pos, (t->nr_tracked - pos) * sizeof(*t->tracked));
	t->tracked[pos] = (uint16_t)slot;
	t->nr_tracked++;
	kd_regions_mark_unlock(t->regions);
	return 0;
}

/* Out of the list marks walk; its bitmaps are freed after, with marks going on. */
static void untrack(struct kvmdirty_tracker *t, uint32_t slot)
{
	uint32_t pos;

	kd_regions_mark_wrlock(t->regions);
	pos = kd_track_lower_bound(t, slot);
	memmove(t->tracked + pos, t->tracked + pos + 1, (t->nr_tracked - pos - 1) * sizeof(*t->tracked));
	t->nr_tracked--;
	t->slots[slot].tracking = false;
	kd_regions_mark_unlock(t->regions);
}

void kd_track_drop(struct kvmdirty_tracker *t, uint32_t slot)
{
	struct kd_track_region *tr = &t->slots[slot];
	uint32_t i;

	if (!tr->tracking)
		return;
	for (i = 0; i < t->nr_consumers; i++)
		kd_cons_slot_drop(t->consumers[i], slot);
	untrack(t, slot);
	kd_track_state_free(tr);
}

uint64_t kd_track_rearm(struct kvmdirty_tracker *t, uint32_t slot, const struct kvmdirty_consumer *self)
{
	struct kd_track_region *tr = &t->slots[slot];
	uint64_t mine = 0, n;
	uint32_t i;

	for (i = 0; i < t->nr_consumers; i++) {
		n = kd_cons_all_pending(t->consumers[i], slot, tr->npages);
		if (t->consumers[i] == self)
			mine = n;
	}
	to_clear_after_arm(t, tr);
	tr->log_off = tr->log_off_ours = false;
	tr->log_lost = false;
	return mine;
}

void kd_track_mark(struct kvmdirty_tracker *t, uint32_t slot, uint64_t first, uint64_t end)
{
	struct kd_track_region *tr;

	if (slot >= t->nr_slots)
		return;
	tr = &t->slots[slot];
	if (!tr->tracking || first >= tr->npages)
		return;
	kvmdirty_bitmap_set_atomic(tr->async, first, end < tr->npages ? end : tr->npages);
	__atomic_store_n(&tr->async_any, 1, __ATOMIC_RELEASE);
	/* after async_any: a sync that finds the bit finds the mark (only ring syncs look) */
	KD_HOOK_POINT(KD_HOOK_MARK_TOUCH, t);
	if (t->mode == KVMDIRTY_MODE_DIRTY_RING)
		kd_track_touch(t, slot);
}
