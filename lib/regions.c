// SPDX-License-Identifier: MIT
/*
 * Memslots: slot-id allocation, KVM_SET_USER_MEMORY_REGION(2), and the three
 * lookups (slot id array, gpa and hva hashed indexes).  Every change is
 * check-then-commit: validate, check overlap, reserve, ioctl, then index.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "internal.h"
#include "kvm-uapi.h"

/* KVM_MEM_MAX_NR_PAGES: the kernel indexes a slot's dirty bitmap with an int */
#define MAX_SLOT_PAGES ((1ull << 31) - 1)
#define KNOWN_FLAGS (KVMDIRTY_REGION_LOG_DIRTY | KVMDIRTY_REGION_READONLY)

static uint32_t kvm_flags(uint32_t flags)
{
	return ((flags & KVMDIRTY_REGION_LOG_DIRTY) ? KVM_MEM_LOG_DIRTY_PAGES : 0) |
	       ((flags & KVMDIRTY_REGION_READONLY) ? KVM_MEM_READONLY : 0);
}

static int set_slot_ioctl(struct kvmdirty_vm *vm, uint32_t slot, uint32_t flags, uint64_t gpa,
			  uint64_t size, void *hva)
{
	if (vm->caps[KVMDIRTY_CAP_USER_MEMORY2]) {
		struct kvm_userspace_memory_region2 r = {
			.slot = slot,
			.flags = kvm_flags(flags),
			.guest_phys_addr = gpa,
			.memory_size = size,
			.userspace_addr = (uintptr_t)hva,
		};
		return kd_ioctl(vm->vm_fd, KVM_SET_USER_MEMORY_REGION2, &r);
	} else {
		struct kvm_userspace_memory_region r = {
			.slot = slot,
			.flags = kvm_flags(flags),
			.guest_phys_addr = gpa,
			.memory_size = size,
			.userspace_addr = (uintptr_t)hva,
		};
		return kd_ioctl(vm->vm_fd, KVM_SET_USER_MEMORY_REGION, &r);
	}
}

/* One memslot update; size 0 deletes the slot. */
static int set_slot(struct kvmdirty_vm *vm, uint32_t slot, uint32_t flags, uint64_t gpa,
		    uint64_t size, void *hva)
{
	uint64_t t0 = kd_now_ns();
	int ret = set_slot_ioctl(vm, slot, flags, gpa, size, hva);

	vm->memslot_ioctl_ns += kd_now_ns() - t0;
	return ret;
}

static int slots_init(struct kvmdirty_vm *vm)
{
	uint32_t n = (uint32_t)vm->caps[KVMDIRTY_CAP_NR_MEMSLOTS];

	vm->regions = calloc(n, sizeof(*vm->regions));
	vm->slot_used = calloc((n + 63) / 64, sizeof(uint64_t));
	if (!vm->regions || !vm->slot_used) {
		free(vm->regions);
		free(vm->slot_used);
		vm->regions = NULL;
		vm->slot_used = NULL;
		return -ENOMEM;
	}
	vm->nr_slots = n;
	return 0;
}

/* Lowest free slot id: one word compare per 64 slots. */
static int slot_find_free(const struct kvmdirty_vm *vm)
{
	uint32_t w, nw = (vm->nr_slots + 63) / 64;

	for (w = 0; w < nw; w++) {
		if (~vm->slot_used[w]) {
			uint32_t id = w * 64 + (uint32_t)__builtin_ctzll(~vm->slot_used[w]);

			return id < vm->nr_slots ? (int)id : -ENOSPC;
		}
	}
	return -ENOSPC;
}

static void slot_set(struct kvmdirty_vm *vm, uint32_t id, bool used)
{
	if (used)
		vm->slot_used[id / 64] |= 1ull << (id % 64);
	else
		vm->slot_used[id / 64] &= ~(1ull << (id % 64));
}

struct kvmdirty_region *kd_slot_region(const struct kvmdirty_vm *vm, uint32_t id)
{
	if (id >= vm->nr_slots || !(vm->slot_used[id / 64] & (1ull << (id % 64))))
		return NULL;
	return &vm->regions[id];
}

static bool aligned(const struct kvmdirty_vm *vm, uint64_t v)
{
	return !(v & (vm->page_size - 1));
}

static bool is_ours(const struct kvmdirty_vm *vm, const struct kvmdirty_region *r)
{
	return r && r->vm == vm && kd_slot_region(vm, r->slot) == r;
}

KD_EXPORT int kvmdirty_region_add(struct kvmdirty_vm *vm, uint64_t gpa, uint64_t size, void *hva,
				  uint32_t flags, struct kvmdirty_region **ret_region)
{
	uintptr_t h = (uintptr_t)hva;
	struct kvmdirty_region *r;
	int slot, ret;

	if (!vm || !size || !aligned(vm, gpa) || !aligned(vm, size) || !aligned(vm, h) ||
	    gpa + size < gpa || gpa + size == 0 || (flags & ~KNOWN_FLAGS))
		return -EINVAL;
	if (size / vm->page_size > MAX_SLOT_PAGES)
		return -E2BIG;
	if ((flags & KVMDIRTY_REGION_READONLY) && !vm->caps[KVMDIRTY_CAP_READONLY_MEM])
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
	if (kd_index_overlaps(&vm->gpa_index, gpa, size, KD_INDEX_NO_ID))
		return -EEXIST;
	if (!vm->regions) {
		ret = slots_init(vm);
		if (ret)
			return ret;
	}
	slot = slot_find_free(vm);
	if (slot < 0)
		return slot;

	r = &vm->regions[slot];
	*r = (struct kvmdirty_region){ .vm = vm, .gpa = gpa, .size = size, .hva = hva,
				       .slot = (uint32_t)slot, .flags = flags };
	ret = kd_index_insert(&vm->gpa_index, r->slot, gpa, size);
	if (ret)
		return ret;
	ret = kd_index_insert(&vm->hva_index, r->slot, h, size);
	if (ret)
		goto err_gpa;
	ret = set_slot(vm, r->slot, flags, gpa, size, hva);
	if (ret < 0)
		goto err_hva;

	slot_set(vm, r->slot, true);
	vm->nr_regions++;
	if (ret_region)
		*ret_region = r;
	return 0;

err_hva:
	kd_index_remove(&vm->hva_index, r->slot);
err_gpa:
	kd_index_remove(&vm->gpa_index, r->slot);
	return ret;
}

KD_EXPORT int kvmdirty_region_remove(struct kvmdirty_vm *vm, struct kvmdirty_region *r)
{
	int ret;

	if (!vm || !is_ours(vm, r))
		return -EINVAL;
	ret = set_slot(vm, r->slot, r->flags, r->gpa, 0, r->hva);
	if (ret < 0)
		return ret;
	if (vm->tracker)
		kd_track_region_removed(vm->tracker, r);
	kd_index_remove(&vm->gpa_index, r->slot);
	kd_index_remove(&vm->hva_index, r->slot);
	slot_set(vm, r->slot, false);
	vm->nr_regions--;
	return 0;
}

KD_EXPORT int kvmdirty_region_move(struct kvmdirty_vm *vm, struct kvmdirty_region *r, uint64_t new_gpa)
{
	uint32_t blocks;
	int ret;

	if (!vm || !is_ours(vm, r) || !aligned(vm, new_gpa) || new_gpa + r->size < new_gpa ||
	    new_gpa + r->size == 0)
		return -EINVAL;
	if (new_gpa == r->gpa)
		return 0;
	if (kd_index_overlaps(&vm->gpa_index, new_gpa, r->size, r->slot))
		return -EEXIST;
	/* room for the move and for its undo, so that neither can fail */
	blocks = kd_index_blocks(r->gpa, r->size) + kd_index_blocks(new_gpa, r->size);
	ret = kd_index_reserve(&vm->gpa_index, 2 * blocks);
	if (ret)
		return ret;
	kd_index_remove(&vm->gpa_index, r->slot);
	kd_index_insert(&vm->gpa_index, r->slot, new_gpa, r->size);
	ret = set_slot(vm, r->slot, r->flags, new_gpa, r->size, r->hva);
	if (ret < 0) {
		kd_index_remove(&vm->gpa_index, r->slot);
		kd_index_insert(&vm->gpa_index, r->slot, r->gpa, r->size);
		return ret;
	}
	r->gpa = new_gpa;
	return 0;
}

KD_EXPORT int kvmdirty_region_set_logging(struct kvmdirty_vm *vm, struct kvmdirty_region *r, bool enable)
{
	uint32_t flags;
	int ret;

	if (!vm || !is_ours(vm, r))
		return -EINVAL;
	flags = enable ? r->flags | KVMDIRTY_REGION_LOG_DIRTY : r->flags & ~KVMDIRTY_REGION_LOG_DIRTY;
	if (flags == r->flags)
		return 0;
	ret = set_slot(vm, r->slot, flags, r->gpa, r->size, r->hva);
	if (ret < 0)
		return ret;
	r->flags = flags;
	return 0;
}

KD_EXPORT int kvmdirty_vm_set_logging(struct kvmdirty_vm *vm, bool enable)
{
	uint64_t *changed;
	uint32_t id, undo;
	int ret = 0;

	if (!vm)
		return -EINVAL;
	if (!vm->nr_regions)
		return 0;
	changed = calloc((vm->nr_slots + 63) / 64, sizeof(*changed));
	if (!changed)
		return -ENOMEM;
	for (id = 0; id < vm->nr_slots && ret >= 0; id++) {
		struct kvmdirty_region *r = kd_slot_region(vm, id);
		uint32_t before;

		if (!r)
			continue;
		before = r->flags;
		ret = kvmdirty_region_set_logging(vm, r, enable);
		if (r->flags != before)
			changed[id / 64] |= 1ull << (id % 64);
	}
	if (ret < 0) {
		for (undo = 0; undo < vm->nr_slots; undo++)
			if (changed[undo / 64] & (1ull << (undo % 64)))
				kvmdirty_region_set_logging(vm, kd_slot_region(vm, undo), !enable);
	}
	free(changed);
	return ret < 0 ? ret : 0;
}

void kd_regions_fini(struct kvmdirty_vm *vm)
{
	free(vm->regions);
	free(vm->slot_used);
	vm->regions = NULL;
	vm->slot_used = NULL;
	vm->nr_slots = 0;
	vm->nr_regions = 0;
}

KD_EXPORT struct kvmdirty_region *kvmdirty_region_from_slot(const struct kvmdirty_vm *vm, uint32_t slot)
{
	return kd_slot_region(vm, slot);
}

KD_EXPORT struct kvmdirty_region *kvmdirty_region_from_gpa(const struct kvmdirty_vm *vm, uint64_t gpa)
{
	uint32_t id = kd_index_lookup(&vm->gpa_index, gpa);

	return id == KD_INDEX_NO_ID ? NULL : &vm->regions[id];
}

KD_EXPORT struct kvmdirty_region *kvmdirty_region_from_hva(const struct kvmdirty_vm *vm, const void *hva)
{
	uint32_t id = kd_index_lookup(&vm->hva_index, (uintptr_t)hva);

	return id == KD_INDEX_NO_ID ? NULL : &vm->regions[id];
}

KD_EXPORT void *kvmdirty_vm_gpa_to_hva(const struct kvmdirty_vm *vm, uint64_t gpa)
{
	const struct kvmdirty_region *r = kvmdirty_region_from_gpa(vm, gpa);

	return r ? (char *)r->hva + (gpa - r->gpa) : NULL;
}

KD_EXPORT struct kvmdirty_region *kvmdirty_region_next(const struct kvmdirty_vm *vm,
						       const struct kvmdirty_region *prev)
{
	uint32_t id = prev ? prev->slot + 1 : 0;

	for (; id < vm->nr_slots; id++)
		if (kd_slot_region(vm, id))
			return &vm->regions[id];
	return NULL;
}

KD_EXPORT unsigned int kvmdirty_vm_region_count(const struct kvmdirty_vm *vm)
{
	return vm->nr_regions;
}

KD_EXPORT uint64_t kvmdirty_region_gpa(const struct kvmdirty_region *r) { return r->gpa; }
KD_EXPORT uint64_t kvmdirty_region_size(const struct kvmdirty_region *r) { return r->size; }
KD_EXPORT void *kvmdirty_region_hva(const struct kvmdirty_region *r) { return r->hva; }
KD_EXPORT uint32_t kvmdirty_region_slot(const struct kvmdirty_region *r) { return r->slot; }
KD_EXPORT uint32_t kvmdirty_region_flags(const struct kvmdirty_region *r) { return r->flags; }
