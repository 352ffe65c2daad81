// SPDX-License-Identifier: MIT
/*
 * Consumers: several independent readers of one tracker's log.  Each has
 * its own pending pages and cursor, and, unless it commits as it goes, the
 * pages it was handed since its last commit (owed), which abort makes
 * pending again.  A sync by any consumer fetches for all of them and fans
 * what it fetched out to every pending set; doc/consumers.md gives the
 * invariants that keep every write reaching every consumer.
 *
 * Commit and abort walk only the regions a consumer was handed pages of
 * since its last commit (its owed list), and in each only the words
 * between the lowest and highest page handed out.  A consumer's own state
 * lives in tracker-cstate.c; this file is the API over it.
 */
#include <errno.h>
#include <string.h>

#include "export.h"
#include "tracker.h"

KD_EXPORT int kvmdirty_consumer_new(struct kvmdirty_tracker *t, uint32_t flags,
				    struct kvmdirty_consumer **ret_consumer)
{
	if (!t || !ret_consumer)
		return -EINVAL;
	if ((flags & KVMDIRTY_CONSUMER_COUNT) && (flags & KVMDIRTY_CONSUMER_AUTOCOMMIT))
		return -EINVAL;
	return kd_cons_new(t, flags, false, ret_consumer);
}

KD_EXPORT void kvmdirty_consumer_free(struct kvmdirty_consumer *c)
{
	/* the tracker's own lives and dies with it */
	if (!c || c == c->t->dflt)
		return;
	/* its claims go: logging off where it was the last to need it */
	kd_track_stop(c->t, c, NULL, true);
	kd_cons_free(c);
}

KD_EXPORT int kvmdirty_consumer_start(struct kvmdirty_consumer *c, struct kvmdirty_region *r)
{
	if (!c)
		return -EINVAL;
	return kd_track_start(c->t, c, r);
}

KD_EXPORT int kvmdirty_consumer_stop(struct kvmdirty_consumer *c, struct kvmdirty_region *r)
{
	if (!c)
		return -EINVAL;
	return kd_track_stop(c->t, c, r, false);
}

KD_EXPORT struct kvmdirty_consumer *kvmdirty_tracker_consumer(const struct kvmdirty_tracker *t)
{
	return t ? t->dflt : NULL;
}

KD_EXPORT int64_t kvmdirty_consumer_sync(struct kvmdirty_consumer *c)
{
	return c ? kd_cons_sync(c) : -EINVAL;
}

KD_EXPORT int kvmdirty_consumer_next(struct kvmdirty_consumer *c, struct kvmdirty_range *ranges, size_t max_ranges,
				     uint64_t max_pages)
{
	if (!c || (!ranges && max_ranges) || (c->flags & KVMDIRTY_CONSUMER_COUNT))
		return -EINVAL;
	return kd_cons_next(c, ranges, max_ranges, max_pages);
}

KD_EXPORT uint64_t kvmdirty_consumer_pending(const struct kvmdirty_consumer *c)
{
	return c ? __atomic_load_n(&c->pending_total, __ATOMIC_RELAXED) : 0;
}

/* Here, not in tracker.c: the tracker's own consumer is a consumer (and tracker.c calls nothing of this file). */
KD_EXPORT uint64_t kvmdirty_tracker_pending(const struct kvmdirty_tracker *t)
{
	return t ? kvmdirty_consumer_pending(t->dflt) : 0;
}

/* Owed pages of one region back to pending (abort) or forgotten (commit); returns how many were owed. */
static uint64_t settle_slot(struct kvmdirty_consumer *c, uint32_t slot, bool back)
{
	struct kd_cons_slot *cs = &c->slots[slot];
	uint64_t owed = cs->owed_count, fresh = 0, i;

	cs->listed = false;
	if (!cs->owed)
		return 0;
	for (i = cs->owed_lo; i < cs->owed_hi; i++) {
		uint64_t v = cs->owed[i];

		if (!v)
			continue;
		if (back) {
			fresh += (uint64_t)__builtin_popcountll(v & ~cs->pending[i]);
			cs->pending[i] |= v;
		}
		cs->owed[i] = 0;
	}
	if (fresh)
		kd_cons_add_pending(c, cs, (int64_t)fresh);
	kd_cons_add_owed(c, cs, -(int64_t)owed);
	cs->owed_lo = cs->owed_hi = 0;
	return owed;
}

static int64_t settle(struct kvmdirty_consumer *c, bool back)
{
	struct kvmdirty_tracker *t;
	uint64_t n = 0;
	uint32_t i;

	if (!c)
		return -EINVAL;
	t = c->t;
	kd_regions_rdlock(t->regions);
	pthread_mutex_lock(&c->lock);
	for (i = 0; i < c->nr_owed_list; i++)
		n += settle_slot(c, c->owed_list[i], back);
	c->nr_owed_list = 0;
	pthread_mutex_unlock(&c->lock);
	kd_regions_unlock(t->regions);
	return (int64_t)n;
}

KD_EXPORT int64_t kvmdirty_consumer_commit(struct kvmdirty_consumer *c)
{
	return settle(c, false);
}

KD_EXPORT int64_t kvmdirty_consumer_abort(struct kvmdirty_consumer *c)
{
	return settle(c, true);
}

KD_EXPORT int kvmdirty_consumer_info(const struct kvmdirty_consumer *c, struct kvmdirty_consumer_info *ret_info,
				     size_t size)
{
	struct kvmdirty_consumer_info in = { 0 };
	struct kvmdirty_tracker *t;
	uint32_t i;

	if (!c || !ret_info || !size)
		return -EINVAL;
	t = c->t;
	in.flags = c->flags;
	in.pending = __atomic_load_n(&c->pending_total, __ATOMIC_RELAXED);
	in.owed = __atomic_load_n(&c->owed_total, __ATOMIC_RELAXED);
	kd_regions_rdlock(t->regions);
	for (i = 0; i < t->nr_tracked; i++) {
		uint64_t npages = t->slots[t->tracked[i]].npages, bytes = KVMDIRTY_BITMAP_WORDS(npages) * 8;

		in.tracked_pages += npages;
		in.bitmap_bytes += bytes * (kd_cons_owes(c) ? 2 : 1);
	}
	kd_regions_unlock(t->regions);
	memcpy(ret_info, &in, size < sizeof(in) ? size : sizeof(in));
	return 0;
}

/*
 * A counting consumer takes no ranges: each count syncs, then takes every
 * page it has pending at once, protecting them as next() would (so that a
 * later write is counted again), and forgets them.
 */
KD_EXPORT int kvmdirty_consumer_count(struct kvmdirty_consumer *c, struct kvmdirty_count *ret_count, size_t size)
{
	struct kvmdirty_count out = { 0 };
	struct kvmdirty_tracker *t;
	uint64_t now;
	int64_t s;
	uint32_t i;
	int ret = 0;

	if (!c || !ret_count || !size || !(c->flags & KVMDIRTY_CONSUMER_COUNT))
		return -EINVAL;
	t = c->t;
	s = kd_cons_sync(c);
	if (s < 0)
		return (int)s;
	kd_regions_rdlock(t->regions);
	pthread_mutex_lock(&c->lock);
	now = kd_now_ns();
	for (i = 0; i < t->nr_tracked && ret >= 0; i++) {
		uint32_t slot = t->tracked[i];
		struct kd_cons_slot *cs = &c->slots[slot];
		uint64_t npages = t->slots[slot].npages, done = 0, b;

		if (!cs->pending_count)
			continue;
		/* one look per chunk: protect() clears the whole chunk a page lies in */
		for (b = kvmdirty_bitmap_next_set(cs->pending, 0, npages);
		     t->mode == KVMDIRTY_MODE_CLEAR_LOG && b < npages && ret >= 0;
		     b = kvmdirty_bitmap_next_set(cs->pending, (b / t->chunk_pages + 1) * t->chunk_pages, npages))
			ret = kd_track_protect(t, slot, b, 1, &done);
		if (ret < 0)
			break;
		/* taken: counted now, or at the next count if a later region's clear fails */
		c->count_carry += cs->pending_count;
		kvmdirty_bitmap_clear(cs->pending, 0, npages);
		kd_cons_add_pending(c, cs, -(int64_t)cs->pending_count);
	}
	out.ns = now - c->count_ns;
	if (ret >= 0) {
		out.pages = c->count_carry;
		c->count_carry = 0;
		c->count_ns = now;
	}
	pthread_mutex_unlock(&c->lock);
	kd_regions_unlock(t->regions);
	if (ret < 0)
		return ret; /* pages a failed CLEAR would have covered stay pending; the interval goes on */
	out.pages_per_sec = out.ns ? (uint64_t)((__uint128_t)out.pages * 1000000000u / out.ns) : 0;
	memcpy(ret_count, &out, size < sizeof(out) ? size : sizeof(out));
	return 0;
}
