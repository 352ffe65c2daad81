// SPDX-License-Identifier: MIT
/*
 * The dirty ring backend: enable, map, harvest, reset, and the recovery of
 * rings this host's KVM leaves stuck.
 *
 * Protocol (api.rst 4.127, 8.29): each vCPU has a ring of kvm_dirty_gfn
 * entries mapped from its fd.  KVM writes slot and offset, then sets
 * flags to DIRTY.  Userspace reads entries in order from its own fetch
 * index with acquire loads, stops at the first that is not DIRTY, marks
 * each taken entry RESET with a release store, then calls
 * KVM_RESET_DIRTY_RINGS, which re-protects those pages and hands the
 * entries back.  Since the reset happens in sync, before any page is
 * handed out, pages are protected before they are read.
 *
 * On this host KVM can push past a full ring (guest ring-0 code runs in
 * the emulator, up to 1,024 instructions between exits, more than the
 * ring's reserve), overwriting unharvested entries: a harvest that takes
 * the whole ring is therefore treated as loss and every tracked page is
 * marked dirty.  After such an overflow KVM's reset position can sit on
 * "ghost" entries (flags 0) that it counts as pushed; every reset then
 * stops there, the vCPU exits ring-full forever, and nothing is ever
 * harvested.  ring_recover() marks those entries RESET while the vCPU is
 * stopped in its ring-full exit, so that the reset goes through, and moves
 * the fetch index to where KVM pushes next.
 */
#include <errno.h>
#include <limits.h>
#include <sys/mman.h>

#include "barrier.h"
#include "internal.h"
#include "kvm-uapi.h"

int kd_ring_enable(struct kvmdirty_vm *vm, uint32_t entries)
{
	int64_t max_acq = vm->caps[KVMDIRTY_CAP_DIRTY_RING_ACQ_REL], max = vm->caps[KVMDIRTY_CAP_DIRTY_RING];
	struct kvm_enable_cap cap = { 0 };
	uint64_t bytes = (uint64_t)entries * sizeof(struct kvm_dirty_gfn);
	int ret;

	if (max_acq <= 0 && max <= 0)
		return -EOPNOTSUPP;
	/* the ordered variant where KVM offers it (the only one on arm64) */
	cap.cap = max_acq > 0 ? KVM_CAP_DIRTY_LOG_RING_ACQ_REL : KVM_CAP_DIRTY_LOG_RING;
	if (max_acq > 0)
		max = max_acq;
	if (!entries || (entries & (entries - 1)) || bytes < vm->page_size || bytes > (uint64_t)max)
		return -EINVAL;
	if (vm->nr_vcpus)
		return -EBUSY;
	cap.args[0] = bytes;
	ret = kd_ioctl(vm->vm_fd, KVM_ENABLE_CAP, &cap);
	if (ret < 0)
		return ret;
	vm->ring_entries = entries;
	return 0;
}

int kd_ring_map(struct kvmdirty_vcpu *v)
{
	size_t bytes = (size_t)v->vm->ring_entries * sizeof(struct kvm_dirty_gfn);
	void *p;

	/* offset in host pages; KVM refuses PROT_EXEC and private mappings */
	p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, v->fd,
		 (off_t)(v->vm->page_size * KD_DIRTY_LOG_PAGE_OFFSET));
	if (p == MAP_FAILED)
		return -errno;
	v->ring = p;
	v->fetch = 0;
	return 0;
}

void kd_ring_unmap(struct kvmdirty_vcpu *v)
{
	if (v->ring)
		munmap(v->ring, (size_t)v->vm->ring_entries * sizeof(struct kvm_dirty_gfn));
	v->ring = NULL;
}

/*
 * Take every DIRTY entry of v's ring into the tracker; returns how many.
 * Callers go through kd_track_harvest(), which holds the tracker's lock
 * and handles a whole-ring harvest.
 */
int64_t kd_ring_harvest(struct kvmdirty_tracker *t, struct kvmdirty_vcpu *v)
{
	uint32_t size = v->vm->ring_entries, mask = size - 1, n;

	pthread_mutex_lock(&v->ring_lock);
	for (n = 0; n < size; n++) {
		struct kvm_dirty_gfn *e = &v->ring[(v->fetch + n) & mask];

		if (load_acquire(&e->flags) != KVM_DIRTY_GFN_F_DIRTY)
			break;
		/* address space 0 only: the library makes no other */
		if (!(e->slot >> 16))
			kd_track_async_page(t, e->slot & 0xffff, e->offset);
		store_release(&e->flags, KVM_DIRTY_GFN_F_RESET);
	}
	v->fetch += n;
	pthread_mutex_unlock(&v->ring_lock);
	return n;
}

/*
 * KVM_RESET_DIRTY_RINGS until done: since the 2025 fixes a call may stop
 * early (-EINTR on a pending signal, or INT_MAX entries) with its
 * progress kept.
 */
int kd_ring_reset(struct kvmdirty_vm *vm, bool in_sync)
{
	uint64_t t0 = kd_now_ns();
	int ret;

	do
		ret = kd_ioctl(vm->vm_fd, KVM_RESET_DIRTY_RINGS, NULL);
	while (ret == INT_MAX);
	if (in_sync)
		kd_track_kernel_ns(vm->tracker, kd_now_ns() - t0);
	return ret < 0 ? ret : 0;
}

/* See the comment at the top.  v is stopped in a ring-full exit. */
static int ring_recover(struct kvmdirty_tracker *t, struct kvmdirty_vcpu *v)
{
	uint32_t size = v->vm->ring_entries, mask = size - 1, i, ghosts;
	int ret;

	pthread_mutex_lock(&v->ring_lock);
	for (i = 0; i < size; i++) {
		struct kvm_dirty_gfn *e = &v->ring[(v->fetch + i) & mask];

		if (!load_acquire(&e->flags))
			store_release(&e->flags, KVM_DIRTY_GFN_F_RESET);
	}
	ret = kd_ring_reset(v->vm, false);
	/*
	 * KVM reset (zeroed) the entries up to where it pushes next and
	 * stopped there: the first entry still marked is that place.
	 */
	for (ghosts = 0; ghosts < size; ghosts++)
		if (load_acquire(&v->ring[(v->fetch + ghosts) & mask].flags))
			break;
	for (i = ghosts; i < size; i++) {
		struct kvm_dirty_gfn *e = &v->ring[(v->fetch + i) & mask];

		if (load_acquire(&e->flags) == KVM_DIRTY_GFN_F_RESET)
			store_release(&e->flags, 0);
	}
	v->fetch += ghosts;
	pthread_mutex_unlock(&v->ring_lock);
	if (ghosts) {
		/* what those entries recorded is gone */
		__atomic_fetch_add(&t->stats.ring_recoveries, 1, __ATOMIC_RELAXED);
		kd_track_mark_all(t);
	}
	return ret;
}

int kd_ring_full(struct kvmdirty_vcpu *v)
{
	struct kvmdirty_tracker *t = v->vm->tracker;
	uint64_t t0 = kd_now_ns();
	int64_t n;
	int ret;

	if (!t || !v->ring)
		return -EIO; /* KVM has a ring the library did not map: cannot happen */
	__atomic_fetch_add(&t->stats.ring_full_exits, 1, __ATOMIC_RELAXED);
	n = kd_track_harvest(t, v);
	ret = kd_ring_reset(v->vm, false);
	/* full, yet nothing to take: maybe a sync took it, maybe a stuck ring */
	if (ret >= 0 && !n)
		ret = ring_recover(t, v);
	__atomic_fetch_add(&t->stats.ring_full_ns, kd_now_ns() - t0, __ATOMIC_RELAXED);
	return ret < 0 ? ret : 0;
}
