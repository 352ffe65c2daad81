// SPDX-License-Identifier: MIT
/*
 * Marks: writes the VMM made itself (emulated devices, DMA), by guest
 * physical or host address, from any thread.  A mark holds the regions'
 * mark lock for reading, so a region added or removed meanwhile is seen
 * whole before or after the change, never half way; a change holds that
 * lock only while it edits (never while a sync walks memory).  A move
 * takes no part of it: what a mark by guest address reads of the gpa
 * index and a region's gpa it reads inside the move's count, and reads
 * again if a move came between, before it sets a bit (regions.h).  Its cost is bounded
 * by the smaller of the range's pages and the tracked regions: a long
 * range over holes walks the tracked regions instead of the holes.
 */
#include <errno.h>

#include "export.h"
#include "tracker.h"

/* The part of [first, last] (page addresses, inclusive) that lies in [start, start + size), as pages; false: none. */
static bool overlap(const struct kvmdirty_tracker *t, uint64_t start, uint64_t size, uint64_t first, uint64_t last,
		    uint64_t *ret_first, uint64_t *ret_end)
{
	uint64_t ps = t->page_size, lo = first > start ? first : start;
	uint64_t hi = last < start + size - ps ? last : start + size - ps;

	if (lo > hi)
		return false;
	*ret_first = (lo - start) / ps;
	*ret_end = (hi - start) / ps + 1;
	return true;
}

/* Mark the part of [first, last] that lies in [start, start + size). */
static void mark_overlap(struct kvmdirty_tracker *t, uint32_t slot, uint64_t start, uint64_t size,
			 uint64_t first, uint64_t last)
{
	uint64_t p, end;

	if (overlap(t, start, size, first, last, &p, &end))
		kd_track_mark(t, slot, p, end);
}

/*
 * Where [first, last] meets region r by guest address, read inside a
 * move's count (regions.h) so that it is where KVM has r before or after
 * the move, never half way: what is then marked is exactly one of them.
 */
static bool gpa_overlap(const struct kvmdirty_tracker *t, const struct kvmdirty_region *r, uint64_t first,
			uint64_t last, uint64_t *ret_first, uint64_t *ret_end)
{
	uint32_t seq;
	bool any;

	do {
		seq = kd_regions_move_read_begin(t->regions);
		any = overlap(t, kd_region_gpa_now(r), r->size, first, last, ret_first, ret_end);
	} while (kd_regions_move_read_retry(t->regions, seq));
	return any;
}

/* By the tracked regions: O(tracked regions) whatever the range. */
static void mark_by_regions(struct kvmdirty_tracker *t, uint64_t first, uint64_t last, bool by_hva)
{
	uint64_t p, end;
	uint32_t i;

	for (i = 0; i < t->nr_tracked; i++) {
		const struct kvmdirty_region *r = kd_region_at_slot(t->regions, t->tracked[i]);

		if (!r)
			continue;
		if (by_hva)
			mark_overlap(t, r->slot, (uintptr_t)r->hva, r->size, first, last);
		else if (gpa_overlap(t, r, first, last, &p, &end))
			kd_track_mark(t, r->slot, p, end);
	}
}

struct hva_ctx {
	struct kvmdirty_tracker *t;
	uint64_t addr;
};

static int mark_hva_one(uint32_t slot, void *p)
{
	struct hva_ctx *c = p;
	const struct kvmdirty_region *r = kd_region_at_slot(c->t->regions, slot);

	mark_overlap(c->t, slot, (uintptr_t)r->hva, r->size, c->addr, c->addr);
	return 0;
}

/* By the pages: O(pages), one lookup for each (each alias of a host page is marked). */
static void mark_by_pages(struct kvmdirty_tracker *t, uint64_t first, uint64_t last, bool by_hva)
{
	uint64_t ps = t->page_size, a;

	for (a = first;; a += ps) {
		if (by_hva) {
			struct hva_ctx c = { t, a };

			kd_region_for_each_at_hva(t->regions, a, mark_hva_one, &c);
		} else {
			const struct kvmdirty_region *r;
			uint64_t gpa = 0, stop = a, p = 0, end = 0;
			uint32_t seq;
			bool any;

			/* the region at a, and the rest of the range inside it, as one move never half done left them */
			do {
				seq = kd_regions_move_read_begin(t->regions);
				r = kd_region_at_gpa(t->regions, a);
				any = false;
				if (r) {
					gpa = kd_region_gpa_now(r);
					stop = gpa + r->size - ps < last ? gpa + r->size - ps : last;
					stop = stop < a ? a : stop;
					any = overlap(t, gpa, r->size, a, stop, &p, &end);
				}
			} while (kd_regions_move_read_retry(t->regions, seq));
			if (any)
				kd_track_mark(t, r->slot, p, end);
			if (r)
				a = stop;
		}
		if (a == last)
			break;
	}
}

static int mark_range(struct kvmdirty_tracker *t, uint64_t addr, uint64_t len, bool by_hva)
{
	uint64_t ps, first, last;

	if (!t || !len || addr + len < addr)
		return -EINVAL;
	ps = t->page_size;
	first = addr & ~(ps - 1);
	last = (addr + len - 1) & ~(ps - 1);
	kd_regions_mark_rdlock(t->regions);
	if ((last - first) / ps >= t->nr_tracked)
		mark_by_regions(t, first, last, by_hva);
	else
		mark_by_pages(t, first, last, by_hva);
	kd_regions_mark_unlock(t->regions);
	return 0;
}

KD_EXPORT int kvmdirty_tracker_mark_dirty_gpa(struct kvmdirty_tracker *t, uint64_t gpa, uint64_t len)
{
	return mark_range(t, gpa, len, false);
}

KD_EXPORT int kvmdirty_tracker_mark_dirty_hva(struct kvmdirty_tracker *t, const void *hva, uint64_t len)
{
	return mark_range(t, (uintptr_t)hva, len, true);
}
