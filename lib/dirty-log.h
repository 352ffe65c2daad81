/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_DIRTY_LOG_H
#define KVMDIRTY_DIRTY_LOG_H

/*
 * The bitmap backend: KVM_GET_DIRTY_LOG, manual protect and
 * KVM_CLEAR_DIRTY_LOG, by slot id.  Bitmaps are the caller's, sized
 * ALIGN(npages, 64) / 8 bytes as the kernel writes them.
 */
#include <stdint.h>

#include "kvm.h"

/* Manual protect (with INITIALLY_SET where offered); records it in kvm. */
int kd_log_enable_manual(struct kd_kvm *kvm);
int kd_log_get(struct kd_kvm *kvm, uint32_t slot, uint64_t *bitmap);
/*
 * Clear (re-protect) the set bits of bitmap for pages [first, first + n)
 * of a slot of slot_pages pages.  first must be a multiple of 64, and n
 * too unless the range ends the slot; bit 0 of bitmap is page first.
 */
int kd_log_clear(struct kd_kvm *kvm, uint32_t slot, uint64_t slot_pages, uint64_t first, uint64_t n,
		 uint64_t *bitmap);

#endif
