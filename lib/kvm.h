/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_KVM_H
#define KVMDIRTY_KVM_H

/*
 * The kvm layer: the VM's fds, its capabilities, the ioctl wrapper (the
 * one place errno is read) and the clock.  What KVM was set up for (manual
 * protect, the dirty ring) is recorded here by the backend that did it:
 * it holds for the VM's life.
 */
#include <stdbool.h>
#include <stdint.h>

#include "kvmdirty.h"

struct kd_kvm {
	int kvm_fd;
	int vm_fd;
	bool owns_fds;
	uint64_t page_size;
	int64_t caps[KVMDIRTY_CAP_COUNT];
	/* 0 until a tracker set KVM up; then its mode, for the VM's life */
	enum kvmdirty_mode dirty_mode;
	bool initially_set;	/* manual protect with KVM_DIRTY_LOG_INITIALLY_SET */
	uint32_t ring_entries;	/* dirty ring size in entries once enabled, else 0 */
};

/* /dev/kvm, KVM_CREATE_VM and the probe; the fds are owned. */
int kd_kvm_open(struct kd_kvm *kvm);
/* Wrap fds a VMM made (not owned) and probe. */
int kd_kvm_adopt(struct kd_kvm *kvm, int kvm_fd, int vm_fd);
/* Close owned fds. */
void kd_kvm_close(struct kd_kvm *kvm);

/* ioctl returning its result, or -errno; EINTR is retried. */
int kd_ioctl(int fd, unsigned long req, void *arg);
/* KVM_CHECK_EXTENSION; 0 when absent or on error */
int64_t kd_check_extension(int fd, long cap);
/* CLOCK_MONOTONIC in ns */
uint64_t kd_now_ns(void);

#endif
