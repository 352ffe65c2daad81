// SPDX-License-Identifier: MIT
/* Bitmap backends: KVM_GET_DIRTY_LOG, manual protect and KVM_CLEAR_DIRTY_LOG. */
#include <errno.h>

#include "dirty-log.h"
#include "kvm-uapi.h"

/*
 * Manual protect with INITIALLY_SET where offered: GET then no longer
 * re-protects the slot, CLEAR does, per 64-page aligned chunk and only for
 * the bits passed.  Ask for the flags KVM reports, nothing more (the old
 * KVM_CAP_MANUAL_DIRTY_LOG_PROTECT is never used: it was buggy).
 */
int kd_log_enable_manual(struct kd_kvm *kvm)
{
	uint64_t avail = (uint64_t)kvm->caps[KVMDIRTY_CAP_MANUAL_PROTECT];
	struct kvm_enable_cap cap = { .cap = KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2 };
	int ret;

	if (!(avail & KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE))
		return -EOPNOTSUPP;
	cap.args[0] = avail & (KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE | KVM_DIRTY_LOG_INITIALLY_SET);
	ret = kd_ioctl(kvm->vm_fd, KVM_ENABLE_CAP, &cap);
	if (ret < 0)
		return ret;
	kvm->initially_set = cap.args[0] & KVM_DIRTY_LOG_INITIALLY_SET;
	kvm->dirty_mode = KVMDIRTY_MODE_CLEAR_LOG;
	return 0;
}

int kd_log_get(struct kd_kvm *kvm, uint32_t slot, uint64_t *bitmap)
{
	struct kvm_dirty_log log = { .slot = slot, .dirty_bitmap = bitmap };
	int ret = kd_ioctl(kvm->vm_fd, KVM_GET_DIRTY_LOG, &log);

	return ret < 0 ? ret : 0;
}

int kd_log_clear(struct kd_kvm *kvm, uint32_t slot, uint64_t slot_pages, uint64_t first, uint64_t n,
		 uint64_t *bitmap)
{
	struct kvm_clear_dirty_log c = {
		.slot = slot, .num_pages = (uint32_t)n, .first_page = first, .dirty_bitmap = bitmap,
	};
	int ret;

	if (first % 64 || (n % 64 && first + n != slot_pages) || first + n > slot_pages || n > UINT32_MAX)
		return -EINVAL;
	ret = kd_ioctl(kvm->vm_fd, KVM_CLEAR_DIRTY_LOG, &c);
	return ret < 0 ? ret : 0;
}
