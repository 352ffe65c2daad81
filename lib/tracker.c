// SPDX-License-Identifier: MIT
/*
 * The tracker's life: new and free, start and stop, and what the regions
 * layer reports (a region going away, logging switched by the VMM).
 *
 * Logging switched off behind a tracked region loses nothing: while it is
 * off the region is wholly pending at every sync (nothing else can tell
 * what the guest writes), and when it comes back on the region is wholly
 * pending once more and, as after start, protected before it is read.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "dirty-log.h"
#include "dirty-ring.h"
#include "export.h"
#include "kvm-uapi.h"
#include "hooks.h"
#include "tracker.h"

#define DEFAULT_CHUNK_PAGES 262144
#define DEFAULT_RING_ENTRIES 4096

static void on_region_removed(void *ctx, uint32_t slot)
{
	kd_track_drop(ctx, slot);
}

static void on_region_logging(void *ctx, uint32_t slot, bool on)
{
	struct kvmdirty_tracker *t = ctx;
	struct kd_track_region *tr;

	if (slot >= t->nr_slots || !t->slots[slot].tracking || t->reprotecting)
		return;
	tr = &t->slots[slot];
	if (on) {
		kd_track_rearm(t, slot, NULL);
	} else {
		/* the VMM's choice now, also where a re-protect had switched it off and meant to retry */
		tr->log_off = true;
		tr->log_off_ours = false;
		kd_track_touch(t, slot); /* all pending at every sync from now on */
		/* KVM dropped the slot's log: nothing fetched is left to clear */
		if (tr->to_clear)
			kvmdirty_bitmap_clear(tr->to_clear, 0, tr->npages);
	}
}

static const struct kd_region_sink region_sink = {
	.removed = on_region_removed,
	.logging = on_region_logging,
};

static int enable_mode(struct kd_kvm *kvm, struct kd_vcpus *vcpus, const struct kvmdirty_tracker_opts *o)
{
	/* what an earlier tracker enabled on the VM cannot be undone */
	if (kvm->dirty_mode)
		return kvm->dirty_mode == o->mode ? 0 : -EBUSY;
	if (o->mode == KVMDIRTY_MODE_CLEAR_LOG)
		return kd_log_enable_manual(kvm);
	if (o->mode == KVMDIRTY_MODE_DIRTY_RING) {
		/* rings are sized for every vCPU at its creation */
		if (kd_vcpus_count(vcpus))
			return -EBUSY;
		return kd_ring_enable(kvm, o->ring_entries);
	}
	return 0;
}

int kd_tracker_new(struct kd_kvm *kvm, struct kd_regions *regions, struct kd_vcpus *vcpus,
		   const struct kvmdirty_tracker_opts *opts, void *owner, struct kvmdirty_tracker **ret_tracker)
{
	struct kvmdirty_tracker_opts o = { 0 };
	struct kvmdirty_tracker *t;
	int ret;

	if (opts)
		o = *opts;
	if (!o.ring_entries)
		o.ring_entries = DEFAULT_RING_ENTRIES;
	if (!o.clear_chunk_pages)
		o.clear_chunk_pages = DEFAULT_CHUNK_PAGES;
	if (o.clear_chunk_pages % 64 || (unsigned int)o.mode > KVMDIRTY_MODE_DIRTY_RING)
		return -EINVAL;
	if (o.mode == KVMDIRTY_MODE_AUTO)
		o.mode = (kvm->caps[KVMDIRTY_CAP_MANUAL_PROTECT] & KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE)
				 ? KVMDIRTY_MODE_CLEAR_LOG
				 : KVMDIRTY_MODE_DIRTY_LOG;

	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->kvm = kvm;
	t->regions = regions;
	t->vcpus = vcpus;
	t->owner = owner;
	t->mode = o.mode;
	t->chunk_pages = o.clear_chunk_pages;
	t->page_size = kvm->page_size;
	t->nr_slots = kd_regions_max_slots(regions);
	t->slots = calloc(t->nr_slots, sizeof(*t->slots));
	t->tracked = calloc(t->nr_slots ? t->nr_slots : 1, sizeof(*t->tracked));
	t->touched = calloc(t->nr_slots / 64 + 1, sizeof(*t->touched));
	pthread_mutex_init(&t->reaper_lock, NULL);
	pthread_cond_init(&t->reaper_cond, NULL);
	pthread_mutex_init(&t->sync_lock, NULL);
	pthread_mutex_init(&t->log_lock, NULL);
	ret = -ENOMEM;
	if (!t->slots || !t->tracked || !t->touched)
		goto err;
	/* the tracker's own consumer, which its sync and next act on */
	ret = kd_cons_new(t, KVMDIRTY_CONSUMER_AUTOCOMMIT, true, &t->dflt);
	if (ret < 0)
		goto err;
	ret = enable_mode(kvm, vcpus, &o);
	if (ret < 0)
		goto err;
	ret = kd_regions_set_sink(regions, &region_sink, t);
	if (ret < 0)
		goto err;
	kd_vcpus_set_sink(vcpus, &kd_track_ring_sink, t);
	if (o.mode == KVMDIRTY_MODE_DIRTY_RING && o.reaper_ms) {
		ret = kd_track_reaper_start(t, o.reaper_ms);
		if (ret < 0) {
			kd_tracker_free(t);
			return ret;
		}
	}
	*ret_tracker = t;
	return 0;
err:
	if (t->dflt)
		kd_cons_free(t->dflt);
	free(t->consumers);
	pthread_mutex_destroy(&t->sync_lock);
	pthread_mutex_destroy(&t->log_lock);
	pthread_mutex_destroy(&t->reaper_lock);
	pthread_cond_destroy(&t->reaper_cond);
	free(t->slots);
	free(t->tracked);
	free(t->touched);
	free(t);
	return ret;
}

void kd_tracker_free(struct kvmdirty_tracker *t)
{
	if (!t)
		return;
	kd_track_reaper_stop(t);
	/* from here on vCPUs harvest and reset their rings, and drop what they held */
	kd_vcpus_set_sink(t->vcpus, NULL, NULL);
	/* every consumer's claims: logging off wherever the library turned it on */
	for (uint32_t i = 0; i < t->nr_consumers; i++)
		kd_track_stop(t, t->consumers[i], NULL, false);
	kd_regions_wrlock(t->regions);
	while (t->nr_tracked) /* regions whose logging could not be switched off */
		kd_track_drop(t, t->tracked[t->nr_tracked - 1]);
	kd_regions_unlock(t->regions);
	kd_regions_set_sink(t->regions, NULL, NULL);
	kd_track_late_free(t);
	while (t->nr_consumers) /* the default one, and any the VMM left */
		kd_cons_free(t->consumers[t->nr_consumers - 1]);
	free(t->consumers);
	pthread_mutex_destroy(&t->sync_lock);
	pthread_mutex_destroy(&t->log_lock);
	pthread_mutex_destroy(&t->reaper_lock);
	pthread_cond_destroy(&t->reaper_cond);
	free(t->slots);
	free(t->tracked);
	free(t->touched);
	free(t);
}

KD_EXPORT enum kvmdirty_mode kvmdirty_tracker_mode(const struct kvmdirty_tracker *t)
{
	return t ? t->mode : KVMDIRTY_MODE_AUTO;
}

/* c's claim on a tracked slot, counted (under the regions lock for writing). */
static void claim(struct kvmdirty_tracker *t, struct kvmdirty_consumer *c, uint32_t slot)
{
	if (c->slots[slot].claims)
		return;
	c->slots[slot].claims = true;
	t->slots[slot].claims++;
}

static int start_one(struct kvmdirty_tracker *t, struct kvmdirty_consumer *c, struct kvmdirty_region *r)
{
	struct kd_track_region n;
	bool was_on;
	int ret;

	if (!kd_region_valid(t->regions, r))
		return -EINVAL;
	kd_regions_wrlock(t->regions);
	if (kd_region_valid(t->regions, r) && t->slots[r->slot].tracking) {
		/* tracked already, for another consumer or for this one: a claim of c's too, nothing else */
		claim(t, c, r->slot);
		kd_regions_unlock(t->regions);
		return 0;
	}
	kd_regions_unlock(t->regions);
	ret = kd_track_state_new(t, r->size / t->page_size, &n);
	if (ret < 0)
		return ret;
	KD_HOOK_POINT(KD_HOOK_START_INSTALL, r);
	/*
	 * Logging on and the state in, one step under the write lock: no
	 * change falls between them (a logging switch the sink would ignore,
	 * the slot not yet tracked; a removal; another region given the
	 * slot).  Changes are not concurrent with each other by the
	 * contract; this holds whatever a VMM does.
	 */
	kd_regions_wrlock(t->regions);
	if (!kd_region_valid(t->regions, r) || r->size / t->page_size != n.npages) {
		ret = -EINVAL; /* removed (and its slot given to another size) since the look above */
		goto out;
	}
	if (t->slots[r->slot].tracking) {
		claim(t, c, r->slot);
		ret = 0;
		goto out;
	}
	was_on = kvmdirty_region_flags(r) & KVMDIRTY_REGION_LOG_DIRTY;
	/*
	 * Logging first: every write from now on is seen, and every page is
	 * pending.  With the ring, logging already on (the region was added
	 * with it) may hide pages left writable by entries an overflow lost
	 * before tracking: switch it off and on, which protects the slot.
	 */
	ret = t->mode == KVMDIRTY_MODE_DIRTY_RING && was_on ? kd_region_set_logging_locked(t->regions, r, false) : 0;
	if (ret == 0) {
		ret = kd_region_set_logging_locked(t->regions, r, true);
		/* logging back as the VMM had it: a failed start changes nothing it set (once more, best effort) */
		if (ret < 0 && t->mode == KVMDIRTY_MODE_DIRTY_RING && was_on)
			kd_region_set_logging_locked(t->regions, r, true);
	}
	if (ret == 0) {
		ret = kd_track_install(t, r->slot, &n);
		if (ret < 0 && !was_on)
			kd_region_set_logging_locked(t->regions, r, false);
		if (ret == 0) {
			claim(t, c, r->slot);
			kd_regions_unlock(t->regions);
			return 0; /* the state is the slot's now */
		}
	}
out:
	kd_regions_unlock(t->regions);
	kd_track_state_free(&n);
	return ret;
}

int kd_track_start(struct kvmdirty_tracker *t, struct kvmdirty_consumer *c, struct kvmdirty_region *r)
{
	int ret;

	if (r)
		return start_one(t, c, r);
	for (r = kd_region_next(t->regions, NULL); r; r = kd_region_next(t->regions, r)) {
		ret = start_one(t, c, r);
		if (ret < 0)
			return ret;
	}
	return 0;
}

KD_EXPORT int kvmdirty_tracker_start(struct kvmdirty_tracker *t, struct kvmdirty_region *r)
{
	if (!t)
		return -EINVAL;
	return kd_track_start(t, t->dflt, r);
}

/*
 * c's claim on the region given up; the last claim turns logging off,
 * then the state goes, all under one hold of the regions lock for
 * writing, so that no start or change falls between the decision and the
 * drop.  If KVM refuses, the region stays tracked and the claim c's
 * (for_good: a consumer leaving hands it to the tracker's own consumer
 * instead, whose stop then retries).
 */
static int stop_locked(struct kvmdirty_tracker *t, struct kvmdirty_consumer *c, struct kvmdirty_region *r,
		       bool for_good)
{
	uint32_t slot = r->slot;
	int ret;

	if (!t->slots[slot].tracking || !c->slots[slot].claims)
		return 0;
	if (t->slots[slot].claims > 1) {
		/* others still need the log: it stays on, their pages theirs */
		c->slots[slot].claims = false;
		t->slots[slot].claims--;
		return 0;
	}
	ret = kd_region_set_logging_locked(t->regions, r, false);
	if (ret < 0) {
		if (for_good && c != t->dflt) {
			c->slots[slot].claims = false;
			t->slots[slot].claims--;
			claim(t, t->dflt, slot);
		}
		return ret;
	}
	kd_track_drop(t, slot);
	return 0;
}

int kd_track_stop(struct kvmdirty_tracker *t, struct kvmdirty_consumer *c, struct kvmdirty_region *r, bool for_good)
{
	struct kvmdirty_region *next;
	int ret, first = 0;

	/* the walk too: a consumer leaves while the VMM may add and remove regions */
	kd_regions_wrlock(t->regions);
	if (r) {
		first = kd_region_valid(t->regions, r) ? stop_locked(t, c, r, for_good) : -EINVAL;
	} else {
		for (r = kd_region_next(t->regions, NULL); r; r = next) {
			next = kd_region_next(t->regions, r);
			ret = stop_locked(t, c, r, for_good);
			if (ret < 0 && !first)
				first = ret;
		}
	}
	kd_regions_unlock(t->regions);
	return first;
}

KD_EXPORT int kvmdirty_tracker_stop(struct kvmdirty_tracker *t, struct kvmdirty_region *r)
{
	if (!t)
		return -EINVAL;
	return kd_track_stop(t, t->dflt, r, false);
}

KD_EXPORT int kvmdirty_tracker_stats(const struct kvmdirty_tracker *t, struct kvmdirty_stats *ret_stats,
				     size_t size)
{
	uint64_t s[sizeof(struct kvmdirty_stats) / sizeof(uint64_t)];
	const uint64_t *src;
	size_t i;

	_Static_assert(sizeof(struct kvmdirty_stats) % sizeof(uint64_t) == 0, "stats are uint64_t");
	if (!t || !ret_stats || !size)
		return -EINVAL;
	/* every field is a uint64_t written atomically: read each the same way */
	src = (const uint64_t *)&t->stats;
	for (i = 0; i < sizeof(s) / sizeof(s[0]); i++)
		s[i] = __atomic_load_n(&src[i], __ATOMIC_RELAXED);
	memcpy(ret_stats, s, size < sizeof(s) ? size : sizeof(s));
	return 0;
}
