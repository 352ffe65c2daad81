// SPDX-License-Identifier: MIT
/*
 * Memslots: slot-id allocation, KVM_SET_USER_MEMORY_REGION(2), and the three
 * lookups (slot id array, gpa and hva hashed indexes).  Every change is
 * check-then-commit: validate, check overlap, reserve, ioctl, then index,
 * all under the write lock so that readers see a region whole or not at all.
 */
#define _GNU_SOURCE /* pthread_rwlockattr_setkind_np */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "export.h"
#include "kvm-uapi.h"
#include "hooks.h"
#include "regions.h"

/* KVM_MEM_MAX_NR_PAGES: the kernel indexes a slot's dirty bitmap with an int */
#define MAX_SLOT_PAGES ((1ull << 31) - 1)
#define KNOWN_FLAGS (KVMDIRTY_REGION_LOG_DIRTY | KVMDIRTY_REGION_READONLY)

static uint32_t kvm_flags(uint32_t flags)
{
	return ((flags & KVMDIRTY_REGION_LOG_DIRTY) ? KVM_MEM_LOG_DIRTY_PAGES : 0) |
	       ((flags & KVMDIRTY_REGION_READONLY) ? KVM_MEM_READONLY : 0);
}

/* One memslot update; size 0 deletes the slot. */
static int set_slot(struct kd_regions *rs, uint32_t slot, uint32_t flags, uint64_t gpa, uint64_t size,
		    void *hva)
{
	struct kd_kvm *kvm = rs->kvm;

	if (kvm->caps[KVMDIRTY_CAP_USER_MEMORY2]) {
		struct kvm_userspace_memory_region2 r = {
			.slot = slot,
			.flags = kvm_flags(flags),
			.guest_phys_addr = gpa,
			.memory_size = size,
			.userspace_addr = (uintptr_t)hva,
		};
		return kd_ioctl(kvm->vm_fd, KVM_SET_USER_MEMORY_REGION2, &r);
	} else {
		struct kvm_userspace_memory_region r = {
			.slot = slot,
			.flags = kvm_flags(flags),
			.guest_phys_addr = gpa,
			.memory_size = size,
			.userspace_addr = (uintptr_t)hva,
		};
		return kd_ioctl(kvm->vm_fd, KVM_SET_USER_MEMORY_REGION, &r);
	}
}

/*
 * glibc's default rwlock prefers readers: with threads marking back to
 * back a change never got the lock.  Writers first, and no reader takes
 * either lock twice (a nested read would deadlock behind a waiting writer).
 */
static void rwlock_init_writers_first(pthread_rwlock_t *l)
{
	pthread_rwlockattr_t a;

	pthread_rwlockattr_init(&a);
#ifdef __GLIBC__
	pthread_rwlockattr_setkind_np(&a, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
#endif
	pthread_rwlock_init(l, &a);
	pthread_rwlockattr_destroy(&a);
}

void kd_regions_init(struct kd_regions *rs, struct kd_kvm *kvm)
{
	memset(rs, 0, sizeof(*rs));
	rs->kvm = kvm;
	kd_index_init(&rs->gpa_index);
	kd_index_init(&rs->hva_index);
	rwlock_init_writers_first(&rs->lock);
	rwlock_init_writers_first(&rs->mark_lock);
}

void kd_regions_fini(struct kd_regions *rs)
{
	free(rs->regions);
	free(rs->slot_used);
	kd_index_fini(&rs->gpa_index);
	kd_index_fini(&rs->hva_index);
	pthread_rwlock_destroy(&rs->lock);
	pthread_rwlock_destroy(&rs->mark_lock);
	memset(rs, 0, sizeof(*rs));
}

uint32_t kd_regions_max_slots(const struct kd_regions *rs)
{
	uint64_t n = (uint64_t)rs->kvm->caps[KVMDIRTY_CAP_NR_MEMSLOTS];

	return n > KD_INDEX_MAX_ID + 1 ? KD_INDEX_MAX_ID + 1 : (uint32_t)n;
}

static int slots_init(struct kd_regions *rs)
{
	uint32_t n = kd_regions_max_slots(rs);

	rs->regions = calloc(n, sizeof(*rs->regions));
	rs->slot_used = calloc((n + 63) / 64, sizeof(uint64_t));
	if (!rs->regions || !rs->slot_used) {
		free(rs->regions);
		free(rs->slot_used);
		rs->regions = NULL;
		rs->slot_used = NULL;
		return -ENOMEM;
	}
	rs->nr_slots = n;
	return 0;
}

/* Lowest free slot id: one word compare per 64 slots. */
static int slot_find_free(const struct kd_regions *rs)
{
	uint32_t w, nw = (rs->nr_slots + 63) / 64;

	for (w = 0; w < nw; w++) {
		if (~rs->slot_used[w]) {
			uint32_t id = w * 64 + (uint32_t)__builtin_ctzll(~rs->slot_used[w]);

			return id < rs->nr_slots ? (int)id : -ENOSPC;
		}
	}
	return -ENOSPC;
}

static void slot_set(struct kd_regions *rs, uint32_t id, bool used)
{
	if (used)
		rs->slot_used[id / 64] |= 1ull << (id % 64);
	else
		rs->slot_used[id / 64] &= ~(1ull << (id % 64));
}

struct kvmdirty_region *kd_region_at_slot(const struct kd_regions *rs, uint32_t id)
{
	if (id >= rs->nr_slots || !(rs->slot_used[id / 64] & (1ull << (id % 64))))
		return NULL;
	return &rs->regions[id];
}

bool kd_region_valid(const struct kd_regions *rs, const struct kvmdirty_region *r)
{
	return r && r->owner == rs && kd_region_at_slot(rs, r->slot) == r;
}

static bool aligned(const struct kd_regions *rs, uint64_t v)
{
	return !(v & (rs->kvm->page_size - 1));
}

int kd_region_add(struct kd_regions *rs, uint64_t gpa, uint64_t size, void *hva, uint32_t flags,
		  struct kvmdirty_region **ret_region)
{
	uintptr_t h = (uintptr_t)hva;
	struct kvmdirty_region *r;
	int slot, ret;

	if (!size || !aligned(rs, gpa) || !aligned(rs, size) || !aligned(rs, h) || gpa + size < gpa ||
	    gpa + size == 0 || (flags & ~KNOWN_FLAGS))
		return -EINVAL;
	if (size / rs->kvm->page_size > MAX_SLOT_PAGES)
		return -E2BIG;
	if ((flags & KVMDIRTY_REGION_READONLY) && !rs->kvm->caps[KVMDIRTY_CAP_READONLY_MEM])
		return -EOPNOTSUPP;
	if (!hva || h + size < h)
		return -EFAULT;
	/*
	 * KVM only checks that the range lies in user space; a range that is
	 * not mapped would be accepted and fault at the first guest access.
	 * msync() walks the VMAs and fails with ENOMEM on any hole.
	 */
	if (msync(hva, size, MS_ASYNC) < 0)
		return -EFAULT;

	pthread_rwlock_wrlock(&rs->lock);
	pthread_rwlock_wrlock(&rs->mark_lock);
	if (kd_index_overlaps(&rs->gpa_index, gpa, size, KD_INDEX_NO_ID)) {
		ret = -EEXIST;
		goto out;
	}
	if (!rs->regions) {
		ret = slots_init(rs);
		if (ret)
			goto out;
	}
	slot = slot_find_free(rs);
	if (slot < 0) {
		ret = slot;
		goto out;
	}
	r = &rs->regions[slot];
	*r = (struct kvmdirty_region){ .owner = rs, .gpa = gpa, .size = size, .hva = hva,
				       .slot = (uint32_t)slot, .flags = flags };
	ret = kd_index_insert(&rs->gpa_index, r->slot, gpa, size);
	if (ret)
		goto out;
	ret = kd_index_insert(&rs->hva_index, r->slot, h, size);
	if (ret)
		goto err_gpa;
	ret = set_slot(rs, r->slot, flags, gpa, size, hva);
	if (ret < 0)
		goto err_hva;
	slot_set(rs, r->slot, true);
	rs->nr_regions++;
	if (ret_region)
		*ret_region = r;
	ret = 0;
	goto out;

err_hva:
	kd_index_remove(&rs->hva_index, r->slot);
err_gpa:
	kd_index_remove(&rs->gpa_index, r->slot);
out:
	/* no mark is inside: the tables this (or a move) replaced can go */
	kd_index_reclaim(&rs->gpa_index);
	kd_index_reclaim(&rs->hva_index);
	pthread_rwlock_unlock(&rs->mark_lock);
	pthread_rwlock_unlock(&rs->lock);
	return ret;
}

int kd_region_remove(struct kd_regions *rs, struct kvmdirty_region *r)
{
	int ret;

	pthread_rwlock_wrlock(&rs->lock);
	if (!kd_region_valid(rs, r)) {
		ret = -EINVAL;
		goto out;
	}
	ret = set_slot(rs, r->slot, r->flags, r->gpa, 0, r->hva);
	if (ret < 0)
		goto out;
	/* the layer above takes the mark lock itself for what marks see of it */
	if (rs->sink)
		rs->sink->removed(rs->sink_ctx, r->slot);
	pthread_rwlock_wrlock(&rs->mark_lock);
	kd_index_remove(&rs->gpa_index, r->slot);
	kd_index_remove(&rs->hva_index, r->slot);
	slot_set(rs, r->slot, false);
	rs->nr_regions--;
	kd_index_reclaim(&rs->gpa_index);
	kd_index_reclaim(&rs->hva_index);
	pthread_rwlock_unlock(&rs->mark_lock);
	ret = 0;
out:
	pthread_rwlock_unlock(&rs->lock);
	return ret;
}

uint32_t kd_regions_move_wait(const struct kd_regions *rs)
{
	uint32_t s;
	int i;

	/* a move holds it odd for an edit of the index: spin a little, then let the mover have the CPU */
	for (i = 0; (s = __atomic_load_n(&rs->move_seq, __ATOMIC_ACQUIRE)) & 1; i++) {
		if (i < 128)
			__asm__ volatile("pause" ::: "memory");
		else
			sched_yield();
	}
	return s;
}

int kd_region_move(struct kd_regions *rs, struct kvmdirty_region *r, uint64_t new_gpa)
{
	uint32_t blocks;
	int ret;

	pthread_rwlock_wrlock(&rs->lock);
	if (!kd_region_valid(rs, r) || !aligned(rs, new_gpa) || new_gpa + r->size < new_gpa ||
	    new_gpa + r->size == 0) {
		ret = -EINVAL;
		goto out;
	}
	ret = 0;
	if (new_gpa == r->gpa)
		goto out;
	if (kd_index_overlaps(&rs->gpa_index, new_gpa, r->size, r->slot)) {
		ret = -EEXIST;
		goto out;
	}
	/*
	 * Room for the move and for its undo, so that neither can fail nor
	 * replace the table.  A table the reserve replaces is retired, not
	 * freed: a mark may still be reading it (regions.h: move_seq).
	 */
	blocks = kd_index_blocks(r->gpa, r->size) + kd_index_blocks(new_gpa, r->size);
	ret = kd_index_reserve(&rs->gpa_index, 2 * blocks);
	if (ret < 0)
		goto out;
	/*
	 * KVM first, then the index inside the count (a microsecond, not the
	 * ioctl): while KVM moves the slot, a mark still resolves the old
	 * address to the slot, whose pages it marks, and nothing of a move
	 * KVM refuses ever reaches the index.
	 */
	ret = set_slot(rs, r->slot, r->flags, new_gpa, r->size, r->hva);
	if (ret < 0)
		goto out;
	__atomic_store_n(&rs->move_seq, rs->move_seq + 1, __ATOMIC_RELAXED);
	__atomic_thread_fence(__ATOMIC_RELEASE);
	KD_HOOK_POINT(KD_HOOK_MOVE_EDIT, r);
	kd_index_remove(&rs->gpa_index, r->slot);
	kd_index_insert(&rs->gpa_index, r->slot, new_gpa, r->size);
	__atomic_store_n(&r->gpa, new_gpa, __ATOMIC_RELAXED);
	__atomic_store_n(&rs->move_seq, rs->move_seq + 1, __ATOMIC_RELEASE);
	/* tables retired by moves: freed once no mark is inside (at once if none is now, or after a few) */
	if (rs->gpa_index.retired) {
		if (rs->gpa_index.nr_retired < 64 ? pthread_rwlock_trywrlock(&rs->mark_lock) == 0
						  : pthread_rwlock_wrlock(&rs->mark_lock) == 0) {
			kd_index_reclaim(&rs->gpa_index);
			pthread_rwlock_unlock(&rs->mark_lock);
		}
	}
out:
	pthread_rwlock_unlock(&rs->lock);
	return ret;
}

int kd_region_set_logging_locked(struct kd_regions *rs, struct kvmdirty_region *r, bool enable)
{
	uint32_t flags = enable ? r->flags | KVMDIRTY_REGION_LOG_DIRTY : r->flags & ~KVMDIRTY_REGION_LOG_DIRTY;
	int ret;

	if (flags == r->flags) {
		/*
		 * Off already: the layer above still hears it, for logging
		 * it switched off itself (and meant to switch back on) is the
		 * caller's choice from now on.
		 */
		if (!enable && rs->sink)
			rs->sink->logging(rs->sink_ctx, r->slot, false);
		return 0;
	}
	ret = set_slot(rs, r->slot, flags, r->gpa, r->size, r->hva);
	if (ret < 0)
		return ret;
	/* lookups read flags without the lock (kvmdirty_region_flags()) */
	__atomic_store_n(&r->flags, flags, __ATOMIC_RELAXED);
	if (rs->sink)
		rs->sink->logging(rs->sink_ctx, r->slot, enable);
	return 0;
}

int kd_region_set_logging(struct kd_regions *rs, struct kvmdirty_region *r, bool enable)
{
	int ret;

	pthread_rwlock_wrlock(&rs->lock);
	ret = kd_region_valid(rs, r) ? kd_region_set_logging_locked(rs, r, enable) : -EINVAL;
	pthread_rwlock_unlock(&rs->lock);
	return ret;
}

int kd_regions_set_logging(struct kd_regions *rs, bool enable)
{
	uint64_t *changed;
	uint32_t id;
	int ret = 0;

	pthread_rwlock_wrlock(&rs->lock);
	if (!rs->nr_regions)
		goto out;
	changed = calloc((rs->nr_slots + 63) / 64, sizeof(*changed));
	if (!changed) {
		ret = -ENOMEM;
		goto out;
	}
	for (id = 0; id < rs->nr_slots && ret >= 0; id++) {
		struct kvmdirty_region *r = kd_region_at_slot(rs, id);
		uint32_t before;

		if (!r)
			continue;
		before = r->flags;
		ret = kd_region_set_logging_locked(rs, r, enable);
		if (r->flags != before)
			changed[id / 64] |= 1ull << (id % 64);
	}
	if (ret < 0) {
		for (id = 0; id < rs->nr_slots; id++)
			if (changed[id / 64] & (1ull << (id % 64)))
				kd_region_set_logging_locked(rs, kd_region_at_slot(rs, id), !enable);
	}
	free(changed);
out:
	pthread_rwlock_unlock(&rs->lock);
	return ret < 0 ? ret : 0;
}

struct kvmdirty_region *kd_region_at_gpa(const struct kd_regions *rs, uint64_t gpa)
{
	uint32_t id = kd_index_lookup(&rs->gpa_index, gpa);

	return id == KD_INDEX_NO_ID ? NULL : &rs->regions[id];
}

struct kvmdirty_region *kd_region_at_hva(const struct kd_regions *rs, uint64_t hva)
{
	uint32_t id = kd_index_lookup(&rs->hva_index, hva);

	return id == KD_INDEX_NO_ID ? NULL : &rs->regions[id];
}

int kd_region_for_each_at_hva(const struct kd_regions *rs, uint64_t hva,
			      int (*fn)(uint32_t slot, void *ctx), void *ctx)
{
	return kd_index_for_each_at(&rs->hva_index, hva, fn, ctx);
}

struct kvmdirty_region *kd_region_next(const struct kd_regions *rs, const struct kvmdirty_region *prev)
{
	uint32_t id = prev ? prev->slot + 1 : 0;

	for (; id < rs->nr_slots; id++)
		if (kd_region_at_slot(rs, id))
			return &rs->regions[id];
	return NULL;
}

int kd_regions_set_sink(struct kd_regions *rs, const struct kd_region_sink *sink, void *ctx)
{
	int ret = 0;

	pthread_rwlock_wrlock(&rs->lock);
	if (sink && rs->sink)
		ret = -EBUSY;
	else {
		rs->sink = sink;
		rs->sink_ctx = ctx;
	}
	pthread_rwlock_unlock(&rs->lock);
	return ret;
}

KD_EXPORT uint64_t kvmdirty_region_gpa(const struct kvmdirty_region *r) { return r ? r->gpa : 0; }
KD_EXPORT uint64_t kvmdirty_region_size(const struct kvmdirty_region *r) { return r ? r->size : 0; }
KD_EXPORT void *kvmdirty_region_hva(const struct kvmdirty_region *r) { return r ? r->hva : NULL; }
KD_EXPORT uint32_t kvmdirty_region_slot(const struct kvmdirty_region *r) { return r ? r->slot : UINT32_MAX; }
KD_EXPORT uint32_t kvmdirty_region_flags(const struct kvmdirty_region *r)
{
	return r ? __atomic_load_n(&r->flags, __ATOMIC_RELAXED) : 0;
}
