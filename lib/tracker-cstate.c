// SPDX-License-Identifier: MIT
/*
 * A consumer's own state: its pending and owed bitmaps per tracked region
 * and their counts, what a fan-out adds to them, and a consumer's joining
 * and leaving.  The layer under the hand-out (tracker-next.c), the sync
 * (tracker-sync.c) and the region state (tracker-state.c).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "tracker.h"

#define KNOWN_FLAGS (KVMDIRTY_CONSUMER_EMPTY | KVMDIRTY_CONSUMER_AUTOCOMMIT | KVMDIRTY_CONSUMER_COUNT)

uint64_t *kd_bitmap_alloc(uint64_t nbits)
{
	size_t bytes = (KVMDIRTY_BITMAP_WORDS(nbits) * 8 + 63) & ~(size_t)63;

	return aligned_alloc(64, bytes ? bytes : 64);
}

void kd_cons_add_pending(struct kvmdirty_consumer *c, struct kd_cons_slot *cs, int64_t n)
{
	cs->pending_count += (uint64_t)n;
	__atomic_store_n(&c->pending_total, c->pending_total + (uint64_t)n, __ATOMIC_RELAXED);
}

void kd_cons_add_owed(struct kvmdirty_consumer *c, struct kd_cons_slot *cs, int64_t n)
{
	cs->owed_count += (uint64_t)n;
	__atomic_store_n(&c->owed_total, c->owed_total + (uint64_t)n, __ATOMIC_RELAXED);
}

bool kd_cons_owes(const struct kvmdirty_consumer *c)
{
	return !(c->flags & (KVMDIRTY_CONSUMER_AUTOCOMMIT | KVMDIRTY_CONSUMER_COUNT));
}

int kd_cons_slot_new(struct kvmdirty_consumer *c, uint64_t npages, bool all, struct kd_cons_slot *ret)
{
	size_t bytes = KVMDIRTY_BITMAP_WORDS(npages) * 8;
	struct kd_cons_slot n = { 0 };

	n.pending = kd_bitmap_alloc(npages);
	if (kd_cons_owes(c))
		n.owed = kd_bitmap_alloc(npages);
	if (!n.pending || (kd_cons_owes(c) && !n.owed)) {
		free(n.pending);
		free(n.owed);
		return -ENOMEM;
	}
	memset(n.pending, 0, bytes);
	if (n.owed)
		memset(n.owed, 0, bytes);
	if (all)
		kvmdirty_bitmap_set(n.pending, 0, npages);
	/* the caller counts what it made pending */
	*ret = n;
	return 0;
}

static void unlist(struct kvmdirty_consumer *c, uint32_t slot)
{
	uint32_t i;

	for (i = 0; i < c->nr_owed_list; i++)
		if (c->owed_list[i] == slot) {
			c->owed_list[i] = c->owed_list[--c->nr_owed_list];
			break;
		}
	c->slots[slot].listed = false;
}

/* The region went or stopped being tracked: what c had pending or owed there goes with it. */
void kd_cons_slot_drop(struct kvmdirty_consumer *c, uint32_t slot)
{
	struct kd_cons_slot *cs = &c->slots[slot];

	if (cs->listed)
		unlist(c, slot);
	/* a region later given the same slot id starts from its head, not from this one's place */
	if (c->cursor_slot == slot)
		c->cursor_page = 0;
	kd_cons_add_pending(c, cs, -(int64_t)cs->pending_count);
	kd_cons_add_owed(c, cs, -(int64_t)cs->owed_count);
	free(cs->pending);
	free(cs->owed);
	memset(cs, 0, sizeof(*cs));
}

uint64_t kd_cons_all_pending(struct kvmdirty_consumer *c, uint32_t slot, uint64_t npages)
{
	struct kd_cons_slot *cs = &c->slots[slot];
	uint64_t fresh = npages - cs->pending_count;

	kvmdirty_bitmap_set(cs->pending, 0, npages);
	kd_cons_add_pending(c, cs, (int64_t)fresh);
	return fresh;
}

uint64_t kd_cons_fan_out(struct kvmdirty_consumer *c, uint32_t slot, const uint64_t *fresh, uint64_t npages)
{
	struct kd_cons_slot *cs = &c->slots[slot];
	uint64_t nbits = KVMDIRTY_BITMAP_WORDS(npages) * 64, n = 0, b;

	/* the words the sync fetched, found with the scanner's zero skip */
	for (b = kvmdirty_bitmap_next_set(fresh, 0, nbits); b < nbits;
	     b = kvmdirty_bitmap_next_set(fresh, (b / 64 + 1) * 64, nbits)) {
		size_t i = b / 64;

		n += (uint64_t)__builtin_popcountll(fresh[i] & ~cs->pending[i]);
		cs->pending[i] |= fresh[i];
	}
	kd_cons_add_pending(c, cs, (int64_t)n);
	return n;
}

/*
 * A new consumer's state in every tracked region: all pending, or, for
 * one that joins empty, what is writable in KVM without a record a later
 * sync would see: in CLEAR_LOG the bits fetched and not yet cleared (the
 * clear that another consumer's next() issues would erase a write landing
 * after this join), and the whole of a region whose logging is off.
 */
static int join_slot(struct kvmdirty_consumer *c, uint32_t slot)
{
	struct kvmdirty_tracker *t = c->t;
	struct kd_track_region *tr = &t->slots[slot];
	bool empty = c->flags & KVMDIRTY_CONSUMER_EMPTY;
	bool all = !empty || tr->log_off || tr->log_lost;
	struct kd_cons_slot *cs = &c->slots[slot];
	int ret;

	ret = kd_cons_slot_new(c, tr->npages, all, cs);
	if (ret < 0)
		return ret;
	if (!all && tr->to_clear) {
		pthread_mutex_lock(&t->log_lock);
		memcpy(cs->pending, tr->to_clear, KVMDIRTY_BITMAP_WORDS(tr->npages) * 8);
		pthread_mutex_unlock(&t->log_lock);
	}
	kd_cons_add_pending(c, cs, (int64_t)(all ? tr->npages : kvmdirty_bitmap_count(cs->pending, 0, tr->npages)));
	return 0;
}

static void cons_release(struct kvmdirty_consumer *c)
{
	uint32_t i;

	for (i = 0; i < c->t->nr_tracked; i++)
		kd_cons_slot_drop(c, c->t->tracked[i]);
	pthread_mutex_destroy(&c->lock);
	free(c->slots);
	free(c->owed_list);
	free(c);
}

int kd_cons_new(struct kvmdirty_tracker *t, uint32_t flags, bool dflt, struct kvmdirty_consumer **ret_c)
{
	struct kvmdirty_consumer *c;
	uint32_t i;
	int ret = -ENOMEM;

	if (flags & ~KNOWN_FLAGS)
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->t = t;
	c->flags = flags;
	pthread_mutex_init(&c->lock, NULL);
	c->count_ns = kd_now_ns();
	/* by slot id: untouched entries of the (lazily zeroed) arrays cost no memory */
	c->slots = calloc(t->nr_slots ? t->nr_slots : 1, sizeof(*c->slots));
	c->owed_list = calloc(t->nr_slots ? t->nr_slots : 1, sizeof(*c->owed_list));
	if (!c->slots || !c->owed_list) {
		pthread_mutex_destroy(&c->lock);
		free(c->slots);
		free(c->owed_list);
		free(c);
		return -ENOMEM;
	}

	/* no fan-out under way, no region change */
	pthread_mutex_lock(&t->sync_lock);
	kd_regions_rdlock(t->regions);
	if (t->nr_consumers == t->consumers_cap) {
		uint32_t cap = t->consumers_cap ? t->consumers_cap * 2 : 4;
		struct kvmdirty_consumer **n = realloc(t->consumers, cap * sizeof(*n));

		if (!n)
			goto err;
		t->consumers = n;
		t->consumers_cap = cap;
	}
	for (i = 0; i < t->nr_tracked; i++) {
		ret = join_slot(c, t->tracked[i]);
		if (ret < 0)
			goto err;
	}
	t->consumers[t->nr_consumers++] = c;
	if (dflt)
		t->dflt = c;
	kd_regions_unlock(t->regions);
	pthread_mutex_unlock(&t->sync_lock);
	*ret_c = c;
	return 0;
err:
	cons_release(c);
	kd_regions_unlock(t->regions);
	pthread_mutex_unlock(&t->sync_lock);
	return ret;
}

void kd_cons_free(struct kvmdirty_consumer *c)
{
	struct kvmdirty_tracker *t = c->t;
	uint32_t i;

	pthread_mutex_lock(&t->sync_lock);
	kd_regions_rdlock(t->regions);
	for (i = 0; i < t->nr_consumers; i++)
		if (t->consumers[i] == c) {
			memmove(t->consumers + i, t->consumers + i + 1, (t->nr_consumers - i - 1) * sizeof(c));
			t->nr_consumers--;
			break;
		}
	if (t->dflt == c)
		t->dflt = NULL;
	cons_release(c);
	kd_regions_unlock(t->regions);
	pthread_mutex_unlock(&t->sync_lock);
}

/* Record pages handed out as owed (tracker-next.c calls it, under c's lock). */
void kd_cons_owe(struct kvmdirty_consumer *c, uint32_t slot, uint64_t first, uint64_t n)
{
	struct kd_cons_slot *cs = &c->slots[slot];
	uint64_t lo = first / 64, hi = (first + n + 63) / 64, already;

	if (!cs->owed)
		return;
	if (!cs->listed) {
		c->owed_list[c->nr_owed_list++] = (uint16_t)slot;
		cs->listed = true;
		cs->owed_lo = lo;
		cs->owed_hi = hi;
	}
	if (lo < cs->owed_lo)
		cs->owed_lo = lo;
	if (hi > cs->owed_hi)
		cs->owed_hi = hi;
	/* a page handed out again before a commit is owed once */
	already = kvmdirty_bitmap_count(cs->owed, first, first + n);
	kvmdirty_bitmap_set(cs->owed, first, first + n);
	kd_cons_add_owed(c, cs, (int64_t)(n - already));
}
