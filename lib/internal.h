/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_INTERNAL_H
#define KVMDIRTY_INTERNAL_H

#include <stdint.h>

#include "kvmdirty.h"
#include "index.h"

#define KD_EXPORT __attribute__((visibility("default")))

struct kvmdirty_region {
	struct kvmdirty_vm *vm;
	uint64_t gpa;
	uint64_t size;
	void *hva;
	uint32_t slot;
	uint32_t flags;
};

struct kvmdirty_vm {
	int kvm_fd;
	int vm_fd;
	bool owns_fds;
	uint64_t page_size;
	int64_t caps[KVMDIRTY_CAP_COUNT];

	/*
	 * Regions live in an array indexed by slot id, allocated on the
	 * first add: a lookup's result is an address computed from the id,
	 * not one more pointer to load.  slot_used says which are live.
	 */
	struct kvmdirty_region *regions;
	uint64_t *slot_used; /* bitmap over slot ids */
	uint32_t nr_slots;
	uint32_t nr_regions;
	struct kd_index gpa_index;
	struct kd_index hva_index;

	/* time spent inside memslot ioctls, for the benchmarks' kernel/library split */
	uint64_t memslot_ioctl_ns;
};

uint64_t kd_now_ns(void);

/* ioctl returning its result, or -errno: the one place errno is read */
int kd_ioctl(int fd, unsigned long req, void *arg);
/* KVM_CHECK_EXTENSION; 0 when absent or on error */
int64_t kd_check_extension(int fd, long cap);

void kd_regions_fini(struct kvmdirty_vm *vm);

#endif
