// SPDX-License-Identifier: MIT
/* The tracker's per-region state: allocation, the list of tracked slots, marks, counts. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tracker.h"

uint64_t *kd_bitmap_alloc(uint64_t nbits)
{
	size_t bytes = (KVMDIRTY_BITMAP_WORDS(nbits) * 8 + 63) & ~(size_t)63;

	return aligned_alloc(64, bytes ? bytes : 64);
}

static void bitmap_zero(uint64_t *map, uint64_t nbits)
{
	memset(map, 0, KVMDIRTY_BITMAP_WORDS(nbits) * 8);
}

void kd_track_state_free(struct kd_track_region *tr)
{
	free(tr->pending);
	free(tr->async);
	free(tr->kvm_bmap);
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
	bool bitmap_mode = t->mode != KVMDIRTY_MODE_DIRTY_RING;
	struct kd_track_region n = { .npages = npages };

	n.pending = kd_bitmap_alloc(npages);
	n.async = kd_bitmap_alloc(npages);
	if (bitmap_mode) {
		n.kvm_bmap = kd_bitmap_alloc(npages);
		n.to_clear = kd_bitmap_alloc(npages);
	}
	if (!n.pending || !n.async || (bitmap_mode && (!n.kvm_bmap || !n.to_clear))) {
		kd_track_state_free(&n);
		return -ENOMEM;
	}
	bitmap_zero(n.async, npages);
	/*
	 * With INITIALLY_SET, KVM starts the slot all dirty and unprotected:
	 * take that as fetched, so that the first pass clears (protects) each
	 * chunk before handing it out and the next GET reports only what was
	 * written after, instead of every page a second time.  Clearing a
	 * bit not fetched is safe here because every page is pending and is
	 * handed out only after its chunk's clear.
	 */
	to_clear_after_arm(t, &n);
	/* the first pass reports every page */
	bitmap_zero(n.pending, npages);
	kvmdirty_bitmap_set(n.pending, 0, npages);
	n.pending_count = npages;
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

static void total_add(struct kvmdirty_tracker *t, int64_t n)
{
	__atomic_store_n(&t->pending_total, t->pending_total + (uint64_t)n, __ATOMIC_RELAXED);
}

void kd_track_add_pending(struct kvmdirty_tracker *t, struct kd_track_region *tr, uint64_t n)
{
	tr->pending_count += n;
	total_add(t, (int64_t)n);
}

void kd_track_sub_pending(struct kvmdirty_tracker *t, struct kd_track_region *tr, uint64_t n)
{
	tr->pending_count -= n;
	total_add(t, -(int64_t)n);
}

void kd_track_install(struct kvmdirty_tracker *t, uint32_t slot, const struct kd_track_region *tr)
{
	uint32_t pos = kd_track_lower_bound(t, slot);

	t->slots[slot] = *tr;
	t->slots[slot].tracking = true;
	memmove(t->tracked + pos + 1, t->tracked + pos, (t->nr_tracked - pos) * sizeof(*t->tracked));
	t->tracked[pos] = (uint16_t)slot;
	t->nr_tracked++;
	total_add(t, (int64_t)tr->pending_count);
}

void kd_track_drop(struct kvmdirty_tracker *t, uint32_t slot)
{
	struct kd_track_region *tr = &t->slots[slot];
	uint32_t pos;

	if (!tr->tracking)
		return;
	pos = kd_track_lower_bound(t, slot);
	memmove(t->tracked + pos, t->tracked + pos + 1, (t->nr_tracked - pos - 1) * sizeof(*t->tracked));
	t->nr_tracked--;
	total_add(t, -(int64_t)tr->pending_count);
	kd_track_state_free(tr);
}

uint64_t kd_track_rearm(struct kvmdirty_tracker *t, struct kd_track_region *tr)
{
	uint64_t fresh = tr->npages - tr->pending_count;

	kvmdirty_bitmap_set(tr->pending, 0, tr->npages);
	kd_track_add_pending(t, tr, fresh);
	to_clear_after_arm(t, tr);
	tr->log_off = tr->log_off_ours = false;
	tr->log_lost = false;
	return fresh;
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
}
