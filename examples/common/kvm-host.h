/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_EXAMPLES_KVM_HOST_H
#define KVMDIRTY_EXAMPLES_KVM_HOST_H

/*
 * A host without a usable KVM, told in one line.  kvmdirty_vm_new() opens
 * /dev/kvm, asks its API version, then creates a VM; the errnos below mean
 * that this host cannot run a VM here at all, which a tool reports as
 * "PROG: /dev/kvm: <errno's meaning>: <likely cause>" and exits with
 * KVM_HOST_MISSING_EXIT (77, what automake and meson count as skipped).
 * Any other errno is an ordinary failure of the tool.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>

#include <linux/kvm.h>

#include <kvmdirty.h>

#define KVM_HOST_MISSING_EXIT 77

/* The likely cause of kvmdirty_vm_new()'s err where it means "no usable KVM here", else NULL. */
static inline const char *kvm_host_missing_cause(int err)
{
	switch (err) {
	case -ENOENT:
		return "this host offers no KVM (no hardware virtualization, nested virtualization off in the "
		       "hypervisor below, or the kvm module not loaded)";
	case -ENODEV:
	case -ENXIO:
		return "the device node exists but no KVM driver answers it (kvm_intel or kvm_amd not loaded)";
	case -EACCES:
		return "no permission: run as a member of the group that owns /dev/kvm (usually kvm), or as root";
	case -EPERM:
		return "not permitted here (a container's device rules, or a file system mounted nodev)";
	case -ENOTTY:
		return "/dev/kvm is not a KVM device";
	case -EPROTO:
		return "this kernel's KVM API version is not 12";
	}
	return NULL;
}

/*
 * If err (from kvmdirty_vm_new() or a helper that called it) means no
 * usable KVM, print the one line to f, each piece after prefix, and
 * return true.
 */
static inline bool kvm_host_missing(FILE *f, const char *prefix, int err)
{
	const char *cause = kvm_host_missing_cause(err);

	if (!cause)
		return false;
	fprintf(f, "%s/dev/kvm: %s: %s\n", prefix, strerror(-err), cause);
	fflush(f);
	return true;
}

/*
 * Open a VM and let it go: 0 where this host can run one, else the
 * negative errno of kvmdirty_vm_new().
 */
static inline int kvm_host_probe(void)
{
	struct kvmdirty_vm *vm;
	int ret = kvmdirty_vm_new(&vm);

	if (ret == 0)
		kvmdirty_vm_free(vm);
	return ret;
}

/*
 * What a tool calls before it builds its VM: KVM_HOST_MISSING_EXIT after
 * the one line where this host has no usable KVM, else 0 (other failures
 * are left to the tool's own VM creation, which reports them).
 */
static inline int kvm_host_check(const char *prefix)
{
	int ret = kvm_host_probe();

	return ret < 0 && kvm_host_missing(stderr, prefix, ret) ? KVM_HOST_MISSING_EXIT : 0;
}

/*
 * KVM_GET_SUPPORTED_CPUID from kvm_fd (/dev/kvm's or a VM's), in a buffer
 * grown until KVM's list fits; the caller frees it.  NULL with *ret_err
 * set to the ioctl's negative errno, or -ENOMEM.
 */
static inline struct kvm_cpuid2 *kvm_host_supported_cpuid(int kvm_fd, int *ret_err)
{
	struct kvm_cpuid2 *c;
	uint32_t n;

	for (n = 64; n <= 4096; n *= 2) {
		c = calloc(1, sizeof(*c) + n * sizeof(c->entries[0]));
		if (!c) {
			*ret_err = -ENOMEM;
			return NULL;
		}
		c->nent = n;
		if (ioctl(kvm_fd, KVM_GET_SUPPORTED_CPUID, c) == 0)
			return c;
		*ret_err = -errno;
		free(c);
		if (*ret_err != -E2BIG)
			return NULL;
	}
	*ret_err = -E2BIG;
	return NULL;
}

#endif
