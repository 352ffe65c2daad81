// SPDX-License-Identifier: MIT
/* Bitmap backends: KVM_GET_DIRTY_LOG, manual protect and KVM_CLEAR_DIRTY_LOG. */
#include <errno.h>

#include "internal.h"
#include "kvm-uapi.h"

/*
 * Manual protect with INITIALLY_SET where offered: GET then no longer
 * re-protects the slot, CLEAR does, per 64-page aligned chunk and only for
 * the bits passed.  Ask for the flags KVM reports, nothing more (the old
 * KVM_CAP_MANUAL_DIRTY_LOG_PROTECT is never used: it was buggy).
 */
int kd_log_enable_manual(struct kvmdirty_vm *vm, bool *ret_initially_set)
{
	uint64_t avail = (uint64_t)vm->caps[KVMDIRTY_CAP_MANUAL_PROTECT];
	struct kvm_enable_cap cap = { .cap = KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2 };
	int ret;

	if (!(avail & KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE))
		return -EOPNOTSUPP;
	cap.args[0] = avail & (KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE | KVM_DIRTY_LOG_INITIALLY_SET);
	ret = kd_ioctl(vm->vm_fd, KVM_ENABLE_CAP, &cap);
	if (ret < 0)
		return ret;
	*ret_initially_set = cap.args[0] & KVM_DIRTY_LOG_INITIALLY_SET;
	return 0;
}

/* The kernel writes ALIGN(npages, 64) / 8 bytes: callers' buffers are sized so. */
int kd_log_get(struct kvmdirty_vm *vm, struct kvmdirty_region *r, uint64_t *bitmap)
{
	struct kvm_dirty_log log = { .slot = r->slot, .dirty_bitmap = bitmap };
	uint64_t t0 = kd_now_ns();
	int ret = kd_ioctl(vm->vm_fd, KVM_GET_DIRTY_LOG, &log);

	kd_track_kernel_ns(vm->tracker, kd_now_ns() - t0);
	return ret < 0 ? ret : 0;
}

/*
 * Clear (re-protect) the set bits of bitmap for pages [first, first + n)
 * of r.  KVM requires first to be a multiple of 64 and n too, unless the
 * range ends the slot; bit 0 of bitmap is page first.
 */
int kd_log_clear(struct kvmdirty_vm *vm, struct kvmdirty_region *r, uint64_t first, uint64_t n,
		 uint64_t *bitmap)
{
	struct kvm_clear_dirty_log c = {
		.slot = r->slot, .num_pages = (uint32_t)n, .first_page = first, .dirty_bitmap = bitmap,
	};
	uint64_t t0, npages = r->size / vm->page_size;
	int ret;

	if (first % 64 || (n % 64 && first + n != npages) || first + n > npages || n > UINT32_MAX)
		return -EINVAL;
	t0 = kd_now_ns();
	ret = kd_ioctl(vm->vm_fd, KVM_CLEAR_DIRTY_LOG, &c);
	kd_track_kernel_ns(vm->tracker, kd_now_ns() - t0);
	return ret < 0 ? ret : 0;
}
