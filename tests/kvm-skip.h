/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_TEST_KVM_SKIP_H
#define KVMDIRTY_TEST_KVM_SKIP_H

#include <stdio.h>
#include <string.h>

#include "../examples/common/kvm-host.h"

/*
 * KVM tests skip (exit 77, one line why) only where this host has no usable
 * KVM, for the errnos kvm_host_missing_cause() names (missing, not ours to
 * open, no driver behind it, not a KVM device, another API version), with
 * the line the tools print (examples/common/kvm-host.h).  Any other failure to make a VM fails the
 * test.  Call it before Check allocates anything, so that the skip leaks
 * nothing (LeakSanitizer).
 */
static inline int require_kvm(const char *test)
{
	char prefix[128];
	int ret = kvm_host_probe();

	if (!ret)
		return 0;
	snprintf(prefix, sizeof(prefix), "%s: skipped: ", test);
	if (kvm_host_missing(stdout, prefix, ret))
		return 77;
	printf("%s: creating a VM: %s\n", test, strerror(-ret));
	return 1;
}

#endif
