/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_KVM_UAPI_H
#define KVMDIRTY_KVM_UAPI_H

/*
 * The subset of <linux/kvm.h> the library needs that older headers lack
 * (Debian 12 ships 6.1 headers; the kernels it runs on are newer).  Values
 * and layouts are the kernel's ABI and never change.
 */
#include <linux/kvm.h>

#ifndef KVM_CAP_DIRTY_LOG_RING_ACQ_REL
#define KVM_CAP_DIRTY_LOG_RING_ACQ_REL 223
#endif
#ifndef KVM_CAP_DIRTY_LOG_RING_WITH_BITMAP
#define KVM_CAP_DIRTY_LOG_RING_WITH_BITMAP 225
#endif
#ifndef KVM_CAP_USER_MEMORY2
#define KVM_CAP_USER_MEMORY2 231

struct kvm_userspace_memory_region2 {
	__u32 slot;
	__u32 flags;
	__u64 guest_phys_addr;
	__u64 memory_size;
	__u64 userspace_addr;
	__u64 guest_memfd_offset;
	__u32 guest_memfd;
	__u32 pad1;
	__u64 pad2[14];
};

#define KVM_SET_USER_MEMORY_REGION2 _IOW(KVMIO, 0x49, struct kvm_userspace_memory_region2)
#endif

/*
 * Where a vCPU's dirty ring sits in its fd, in host pages.  <linux/kvm.h>
 * defaults KVM_DIRTY_LOG_PAGE_OFFSET to 0 unless <asm/kvm.h> defines it,
 * and older x86 headers do not: 64 is x86's (and arm64's) value.
 */
#define KD_DIRTY_LOG_PAGE_OFFSET 64

_Static_assert(sizeof(struct kvm_userspace_memory_region2) == 160, "uapi layout");
_Static_assert(sizeof(struct kvm_dirty_gfn) == 16, "uapi layout");

#endif
