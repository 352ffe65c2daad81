// SPDX-License-Identifier: MIT
/*
 * Ring policy: what the vCPU layer's harvests report (pages, lost
 * entries, ring-full exits), the reaper thread, and re-protecting after a
 * loss.
 *
 * Pages from rings arrive already re-protected (the vCPU layer publishes
 * after KVM_RESET_DIRTY_RINGS) and go to the async bitmaps, which sync
 * moves into pending.  A loss (a harvest of a whole ring, ghost entries, a
 * failed reset) is only recorded where it is seen, often a vCPU thread in
 * its ring-full exit: the pages whose entries were overwritten stay
 * writable in KVM's page tables, and no reset will ever protect them.  The
 * tracker's own thread, at its next sync and before it takes any page,
 * switches dirty logging off and on for every tracked region, which
 * write-protects each whole slot, and makes every page pending.
 */
#include <errno.h>
#include <time.h>

#include "tracker.h"

static void ring_pages(void *ctx, struct kvmdirty_vcpu *vcpu, const struct kd_ring_entry *e, uint32_t n)
{
	struct kvmdirty_tracker *t = ctx;
	uint32_t i;

	kd_regions_mark_rdlock(t->regions);
	for (i = 0; i < n; i++)
		/* address space 0 only: the library makes no other */
		if (!(e[i].slot >> 16))
			kd_track_mark(t, e[i].slot, e[i].offset, e[i].offset + 1);
	kd_regions_mark_unlock(t->regions);
	STAT_ADD(t, ring_harvested, n);
}

static void ring_lost(void *ctx, struct kvmdirty_vcpu *vcpu, unsigned int loss)
{
	struct kvmdirty_tracker *t = ctx;

	if (loss & KD_RING_OVERFLOW)
		STAT_ADD(t, ring_overflows, 1);
	if (loss & KD_RING_GHOSTS)
		STAT_ADD(t, ring_recoveries, 1);
	__atomic_store_n(&t->lost, 1, __ATOMIC_RELEASE);
}

static void ring_full_exit(void *ctx, struct kvmdirty_vcpu *vcpu, uint64_t ns)
{
	struct kvmdirty_tracker *t = ctx;

	STAT_ADD(t, ring_full_exits, 1);
	STAT_ADD(t, ring_full_ns, ns);
}

const struct kd_ring_sink kd_track_ring_sink = {
	.pages = ring_pages,
	.lost = ring_lost,
	.full_exit = ring_full_exit,
};

/*
 * Logging off and on for every tracked region, each pair under one hold
 * of the regions lock, so that nothing (a VMM switching a region's
 * logging, a stop, a removal) lands between the two.  A region whose
 * logging the VMM switched off is left alone: it is all pending at every
 * sync anyway.  One whose "on" fails stays off, marked as the library's
 * doing (log_off_ours), all pending at every sync, and is retried next.
 */
int kd_track_reprotect(struct kvmdirty_tracker *t, const struct kvmdirty_consumer *self, uint64_t *fresh,
		       uint64_t *fetched)
{
	int ret, first = 0;
	uint32_t i;

	if (!__atomic_exchange_n(&t->lost, 0, __ATOMIC_ACQ_REL))
		return 0;
	kd_regions_wrlock(t->regions);
	t->reprotecting = true; /* the regions sink leaves these toggles to us */
	for (i = 0; i < t->nr_tracked; i++) {
		struct kd_track_region *tr = &t->slots[t->tracked[i]];
		struct kvmdirty_region *r = kd_region_at_slot(t->regions, t->tracked[i]);

		if (!r || (tr->log_off && !tr->log_off_ours))
			continue;
		if (!tr->log_off_ours) {
			ret = kd_region_set_logging_locked(t->regions, r, false);
			if (ret < 0) {
				first = first ? first : ret;
				continue;
			}
			tr->log_off = tr->log_off_ours = true;
			kd_track_touch(t, t->tracked[i]);
			if (tr->to_clear)
				kvmdirty_bitmap_clear(tr->to_clear, 0, tr->npages);
		}
		ret = kd_region_set_logging_locked(t->regions, r, true);
		if (ret < 0) {
			first = first ? first : ret;
			continue;
		}
		*fresh += kd_track_rearm(t, t->tracked[i], self);
		*fetched += tr->npages;
	}
	t->reprotecting = false;
	kd_regions_unlock(t->regions);
	/* whatever is left is done at the next sync */
	if (first < 0)
		__atomic_store_n(&t->lost, 1, __ATOMIC_RELEASE);
	return first;
}

/*
 * The reaper: every reaper_ms, harvest all rings, as QEMU's reaper thread
 * does each second, so that busy vCPUs seldom stop on a full ring.
 */
static void *reaper(void *arg)
{
	struct kvmdirty_tracker *t = arg;

	pthread_mutex_lock(&t->reaper_lock);
	while (!t->reaper_stop) {
		uint64_t t0, kernel_ns = 0;
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += (long)(t->reaper_ms % 1000) * 1000000;
		ts.tv_sec += t->reaper_ms / 1000 + ts.tv_nsec / 1000000000;
		ts.tv_nsec %= 1000000000;
		pthread_cond_timedwait(&t->reaper_cond, &t->reaper_lock, &ts);
		if (t->reaper_stop)
			break;
		pthread_mutex_unlock(&t->reaper_lock);
		t0 = kd_now_ns();
		kd_vcpus_harvest(t->vcpus, &kernel_ns);
		STAT_ADD(t, ring_reaper_ns, kd_now_ns() - t0);
		STAT_ADD(t, ring_reaper_kernel_ns, kernel_ns);
		STAT_ADD(t, ring_reaper_runs, 1);
		pthread_mutex_lock(&t->reaper_lock);
	}
	pthread_mutex_unlock(&t->reaper_lock);
	return NULL;
}

int kd_track_reaper_start(struct kvmdirty_tracker *t, uint32_t ms)
{
	t->reaper_ms = ms;
	t->reaper_stop = false;
	if (pthread_create(&t->reaper, NULL, reaper, t))
		return -EAGAIN;
	t->reaper_on = true;
	return 0;
}

void kd_track_reaper_stop(struct kvmdirty_tracker *t)
{
	if (!t->reaper_on)
		return;
	pthread_mutex_lock(&t->reaper_lock);
	t->reaper_stop = true;
	pthread_cond_signal(&t->reaper_cond);
	pthread_mutex_unlock(&t->reaper_lock);
	pthread_join(t->reaper, NULL);
	t->reaper_on = false;
}
