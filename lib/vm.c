// SPDX-License-Identifier: MIT
/*
 * The VM handle and the public calls that take one: each hands its work
 * to the layer that does it.  Freeing goes top down from here.
 */
#include <errno.h>
#include <stdlib.h>

#include "export.h"
#include "vm.h"

static int vm_alloc(struct kvmdirty_vm **ret_vm)
{
	struct kvmdirty_vm *vm = calloc(1, sizeof(*vm));

	if (!vm)
		return -ENOMEM;
	vm->kvm.kvm_fd = vm->kvm.vm_fd = -1;
	*ret_vm = vm;
	return 0;
}

static void vm_init_layers(struct kvmdirty_vm *vm)
{
	kd_regions_init(&vm->regions, &vm->kvm);
	kd_vcpus_init(&vm->vcpus, &vm->kvm);
}

KD_EXPORT int kvmdirty_vm_new(struct kvmdirty_vm **ret_vm)
{
	struct kvmdirty_vm *vm;
	int ret;

	if (!ret_vm)
		return -EINVAL;
	ret = vm_alloc(&vm);
	if (ret < 0)
		return ret;
	ret = kd_kvm_open(&vm->kvm);
	if (ret < 0) {
		free(vm);
		return ret;
	}
	vm_init_layers(vm);
	*ret_vm = vm;
	return 0;
}

KD_EXPORT int kvmdirty_vm_adopt(int kvm_fd, int vm_fd, struct kvmdirty_vm **ret_vm)
{
	struct kvmdirty_vm *vm;
	int ret;

	if (kvm_fd < 0 || vm_fd < 0)
		return -EBADF;
	if (!ret_vm)
		return -EINVAL;
	ret = vm_alloc(&vm);
	if (ret < 0)
		return ret;
	ret = kd_kvm_adopt(&vm->kvm, kvm_fd, vm_fd);
	if (ret < 0) {
		free(vm);
		return ret;
	}
	vm_init_layers(vm);
	*ret_vm = vm;
	return 0;
}

KD_EXPORT void kvmdirty_vm_free(struct kvmdirty_vm *vm)
{
	if (!vm)
		return;
	kd_tracker_free(vm->tracker);
	kd_vcpus_fini(&vm->vcpus);
	kd_regions_fini(&vm->regions);
	kd_kvm_close(&vm->kvm);
	free(vm);
}

KD_EXPORT int kvmdirty_vm_fd(const struct kvmdirty_vm *vm)
{
	return vm ? vm->kvm.vm_fd : -EINVAL;
}

KD_EXPORT int kvmdirty_vm_kvm_fd(const struct kvmdirty_vm *vm)
{
	return vm ? vm->kvm.kvm_fd : -EINVAL;
}

KD_EXPORT int64_t kvmdirty_vm_cap(const struct kvmdirty_vm *vm, enum kvmdirty_cap cap)
{
	if (!vm || (unsigned int)cap >= KVMDIRTY_CAP_COUNT)
		return -EINVAL;
	return vm->kvm.caps[cap];
}

KD_EXPORT uint64_t kvmdirty_vm_page_size(const struct kvmdirty_vm *vm)
{
	return vm ? vm->kvm.page_size : 0;
}

/* ---- regions ---- */

KD_EXPORT int kvmdirty_region_add(struct kvmdirty_vm *vm, uint64_t gpa, uint64_t size, void *hva,
				  uint32_t flags, struct kvmdirty_region **ret_region)
{
	if (!vm)
		return -EINVAL;
	return kd_region_add(&vm->regions, gpa, size, hva, flags, ret_region);
}

KD_EXPORT int kvmdirty_region_remove(struct kvmdirty_vm *vm, struct kvmdirty_region *r)
{
	return vm ? kd_region_remove(&vm->regions, r) : -EINVAL;
}

KD_EXPORT int kvmdirty_region_move(struct kvmdirty_vm *vm, struct kvmdirty_region *r, uint64_t new_gpa)
{
	return vm ? kd_region_move(&vm->regions, r, new_gpa) : -EINVAL;
}

KD_EXPORT int kvmdirty_region_set_logging(struct kvmdirty_vm *vm, struct kvmdirty_region *r, bool enable)
{
	return vm ? kd_region_set_logging(&vm->regions, r, enable) : -EINVAL;
}

KD_EXPORT int kvmdirty_vm_set_logging(struct kvmdirty_vm *vm, bool enable)
{
	return vm ? kd_regions_set_logging(&vm->regions, enable) : -EINVAL;
}

KD_EXPORT struct kvmdirty_region *kvmdirty_region_from_slot(const struct kvmdirty_vm *vm, uint32_t slot)
{
	return vm ? kd_region_at_slot(&vm->regions, slot) : NULL;
}

KD_EXPORT struct kvmdirty_region *kvmdirty_region_from_gpa(const struct kvmdirty_vm *vm, uint64_t gpa)
{
	return vm ? kd_region_at_gpa(&vm->regions, gpa) : NULL;
}

KD_EXPORT struct kvmdirty_region *kvmdirty_region_from_hva(const struct kvmdirty_vm *vm, const void *hva)
{
	return vm ? kd_region_at_hva(&vm->regions, (uintptr_t)hva) : NULL;
}

KD_EXPORT void *kvmdirty_vm_gpa_to_hva(const struct kvmdirty_vm *vm, uint64_t gpa)
{
	const struct kvmdirty_region *r = kvmdirty_region_from_gpa(vm, gpa);

	return r ? (char *)r->hva + (gpa - r->gpa) : NULL;
}

KD_EXPORT struct kvmdirty_region *kvmdirty_region_next(const struct kvmdirty_vm *vm,
						       const struct kvmdirty_region *prev)
{
	return vm ? kd_region_next(&vm->regions, prev) : NULL;
}

KD_EXPORT unsigned int kvmdirty_vm_region_count(const struct kvmdirty_vm *vm)
{
	return vm ? vm->regions.nr_regions : 0;
}

/* ---- the tracker ---- */

KD_EXPORT int kvmdirty_tracker_new(struct kvmdirty_vm *vm, const struct kvmdirty_tracker_opts *opts,
				   struct kvmdirty_tracker **ret_tracker)
{
	struct kvmdirty_tracker *t;
	int ret;

	if (!vm || !ret_tracker)
		return -EINVAL;
	if (vm->tracker)
		return -EBUSY;
	ret = kd_tracker_new(&vm->kvm, &vm->regions, &vm->vcpus, opts, vm, &t);
	if (ret < 0)
		return ret;
	vm->tracker = t;
	*ret_tracker = t;
	return 0;
}

KD_EXPORT void kvmdirty_tracker_free(struct kvmdirty_tracker *t)
{
	struct kvmdirty_vm *vm;

	if (!t)
		return;
	vm = t->owner;
	vm->tracker = NULL;
	kd_tracker_free(t);
}

/* ---- vCPUs ---- */

KD_EXPORT int kvmdirty_vcpu_create(struct kvmdirty_vm *vm, uint32_t id, struct kvmdirty_vcpu **ret_vcpu)
{
	if (!vm || !ret_vcpu)
		return -EINVAL;
	return kd_vcpu_create(&vm->vcpus, id, ret_vcpu);
}

KD_EXPORT int kvmdirty_vcpu_add(struct kvmdirty_vm *vm, int vcpu_fd, struct kvmdirty_vcpu **ret_vcpu)
{
	if (!vm || !ret_vcpu)
		return -EINVAL;
	return kd_vcpu_add(&vm->vcpus, vcpu_fd, ret_vcpu);
}

KD_EXPORT int kvmdirty_vm_set_kick_signal(struct kvmdirty_vm *vm, int signo)
{
	if (!vm)
		return -EINVAL;
	return kd_vcpus_set_kick_signal(&vm->vcpus, signo);
}
