// SPDX-License-Identifier: MIT
/* A program outside the tree, built only with pkg-config's flags. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvmdirty.h>

int main(void)
{
	struct kvmdirty_vm *vm;
	struct kvmdirty_region *r;
	void *mem;
	int ret;

	if (strcmp(kvmdirty_version_string(), KVMDIRTY_VERSION_STRING)) {
		fprintf(stderr, "consumer: built against libkvmdirty %s, loaded %s\n", KVMDIRTY_VERSION_STRING,
			kvmdirty_version_string());
		return 1;
	}
	/* the library's own part ran; a host without KVM ends here */
	ret = kvmdirty_vm_new(&vm);
	/* no usable KVM on this host (kvmdirty_vm_new(3)): skip */
	if (ret == -ENOENT || ret == -EACCES || ret == -EPERM || ret == -ENXIO || ret == -ENODEV || ret == -ENOTTY ||
	    ret == -EPROTO) {
		printf("consumer: skipped: /dev/kvm: %s\n", strerror(-ret));
		return 77;
	}
	if (ret < 0) {
		fprintf(stderr, "consumer: kvmdirty_vm_new: %s\n", strerror(-ret));
		return 1;
	}
	mem = aligned_alloc(4096, 1 << 20);
	if (!mem) {
		fprintf(stderr, "consumer: out of memory\n");
		kvmdirty_vm_free(vm);
		return 1;
	}
	ret = kvmdirty_region_add(vm, 1 << 20, 1 << 20, mem, KVMDIRTY_REGION_LOG_DIRTY, &r);
	if (ret < 0 || kvmdirty_region_from_gpa(vm, (1 << 20) + 123) != r ||
	    kvmdirty_vm_gpa_to_hva(vm, (1 << 20) + 4096) != (char *)mem + 4096) {
		fprintf(stderr, "consumer: region add/lookup failed: %s\n", strerror(-ret));
		return 1;
	}
	printf("consumer: linked against libkvmdirty %s, slot %u, %u region(s)\n", kvmdirty_version_string(),
	       kvmdirty_region_slot(r), kvmdirty_vm_region_count(vm));
	kvmdirty_vm_free(vm);
	free(mem);
	return 0;
}
