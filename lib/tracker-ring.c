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
#include <stdlib.h>
#include <time.h>

#include "tracker.h"

static void ring_pages(void *ctx, struct kvmdirty_vcpu *vcpu, const struct kd_ring_entry *e, uint32_t n)
{
	struct kvmdirty_tracker *t = ctx;
	uint32_t i;

	kd_regions_rdlock(t->regions);
	for (i = 0; i < n; i++)
		/* address space 0 only: the library makes no other */
		if (!(e[i].slot >> 16))
			kd_track_mark(t, e[i].slot, e[i].offset, e[i].offset + 1);
	kd_regions_unlock(t->regions);
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

int kd_track_reprotect(struct kvmdirty_tracker *t)
{
	uint16_t *slots;
	uint32_t i, n;
	int ret = 0;

	if (!__atomic_exchange_n(&t->lost, 0, __ATOMIC_ACQ_REL))
		return 0;
	kd_regions_rdlock(t->regions);
	n = t->nr_tracked;
	slots = malloc((n ? n : 1) * sizeof(*slots));
	if (slots)
		for (i = 0, n = 0; i < t->nr_tracked; i++)
			/* logging the VMM switched off stays off: such a region is all pending anyway */
			if (!t->slots[t->tracked[i]].log_off)
				slots[n++] = t->tracked[i];
	kd_regions_unlock(t->regions);
	if (!slots) {
		ret = -ENOMEM;
		goto out;
	}
	/* each toggle reaches the tracker through the regions sink: on makes the region all pending */
	for (i = 0; i < n && !ret; i++) {
		ret = kd_region_set_logging_slot(t->regions, slots[i], false);
		if (!ret)
			ret = kd_region_set_logging_slot(t->regions, slots[i], true);
		if (ret == -ENOENT) /* removed meanwhile */
			ret = 0;
	}
	free(slots);
out:
	/* whatever is left is done at the next sync */
	if (ret < 0)
		__atomic_store_n(&t->lost, 1, __ATOMIC_RELEASE);
	return ret;
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
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += (long)(t->reaper_ms % 1000) * 1000000;
		ts.tv_sec += t->reaper_ms / 1000 + ts.tv_nsec / 1000000000;
		ts.tv_nsec %= 1000000000;
		pthread_cond_timedwait(&t->reaper_cond, &t->reaper_lock, &ts);
		if (t->reaper_stop)
			break;
		pthread_mutex_unlock(&t->reaper_lock);
		kd_vcpus_harvest(t->vcpus, NULL);
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
