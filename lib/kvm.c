// SPDX-License-Identifier: MIT
/* The VM handle, the ioctl wrapper and the capability probe. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "kvm-uapi.h"

int kd_ioctl(int fd, unsigned long req, void *arg)
{
	int ret;

	do {
		ret = ioctl(fd, req, arg);
	} while (ret < 0 && errno == EINTR);
	return ret < 0 ? -errno : ret;
}

uint64_t kd_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int64_t kd_check_extension(int fd, long cap)
{
	int ret = kd_ioctl(fd, KVM_CHECK_EXTENSION, (void *)cap);

	return ret < 0 ? 0 : ret;
}

/*
 * Ask the VM fd rather than /dev/kvm: since 4.x the answers are per VM
 * (memslot count, ring size), and the VM fd is what the caller will use.
 */
static void probe(struct kvmdirty_vm *vm)
{
	int fd = vm->vm_fd;
	int64_t *c = vm->caps;

	c[KVMDIRTY_CAP_USER_MEMORY2] = kd_check_extension(fd, KVM_CAP_USER_MEMORY2) > 0;
	c[KVMDIRTY_CAP_NR_MEMSLOTS] = kd_check_extension(fd, KVM_CAP_NR_MEMSLOTS);
	/* 0 means "not reported": KVM then guarantees 32 (QEMU assumes the same) */
	if (!c[KVMDIRTY_CAP_NR_MEMSLOTS])
		c[KVMDIRTY_CAP_NR_MEMSLOTS] = 32;
	/* the slot id is 16 bits and the index keys on it */
	if (c[KVMDIRTY_CAP_NR_MEMSLOTS] > KD_INDEX_MAX_ID)
		c[KVMDIRTY_CAP_NR_MEMSLOTS] = KD_INDEX_MAX_ID;
	c[KVMDIRTY_CAP_MANUAL_PROTECT] = kd_check_extension(fd, KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2);
	c[KVMDIRTY_CAP_DIRTY_RING] = kd_check_extension(fd, KVM_CAP_DIRTY_LOG_RING);
	c[KVMDIRTY_CAP_DIRTY_RING_ACQ_REL] = kd_check_extension(fd, KVM_CAP_DIRTY_LOG_RING_ACQ_REL);
	c[KVMDIRTY_CAP_DIRTY_RING_WITH_BITMAP] =
		kd_check_extension(fd, KVM_CAP_DIRTY_LOG_RING_WITH_BITMAP) > 0;
	c[KVMDIRTY_CAP_READONLY_MEM] = kd_check_extension(fd, KVM_CAP_READONLY_MEM) > 0;
	c[KVMDIRTY_CAP_MAX_VCPUS] = kd_check_extension(fd, KVM_CAP_MAX_VCPUS);
	if (!c[KVMDIRTY_CAP_MAX_VCPUS])
		c[KVMDIRTY_CAP_MAX_VCPUS] = kd_check_extension(fd, KVM_CAP_NR_VCPUS);
}

static int vm_init(int kvm_fd, int vm_fd, bool owns, struct kvmdirty_vm **ret_vm)
{
	struct kvmdirty_vm *vm;
	int ret;

	ret = kd_ioctl(kvm_fd, KVM_GET_API_VERSION, NULL);
	if (ret < 0)
		return ret;
	if (ret != KVM_API_VERSION)
		return -EPROTO;
	vm = calloc(1, sizeof(*vm));
	if (!vm)
		return -ENOMEM;
	vm->kvm_fd = kvm_fd;
	vm->vm_fd = vm_fd;
	vm->owns_fds = owns;
	vm->page_size = (uint64_t)sysconf(_SC_PAGESIZE);
	kd_index_init(&vm->gpa_index);
	kd_index_init(&vm->hva_index);
	pthread_mutex_init(&vm->vcpus_lock, NULL);
	probe(vm);
	*ret_vm = vm;
	return 0;
}

KD_EXPORT int kvmdirty_vm_new(struct kvmdirty_vm **ret_vm)
{
	int kvm_fd = -1, vm_fd = -1, ret;

	if (!ret_vm)
		return -EINVAL;
	kvm_fd = open("/dev/kvm", O_RDWR | O_CLOEXEC);
	if (kvm_fd < 0)
		return -errno;
	ret = kd_ioctl(kvm_fd, KVM_CREATE_VM, (void *)0);
	if (ret < 0)
		goto err;
	vm_fd = ret;
	ret = vm_init(kvm_fd, vm_fd, true, ret_vm);
	if (ret < 0)
		goto err;
	return 0;
err:
	if (vm_fd >= 0)
		close(vm_fd);
	close(kvm_fd);
	return ret;
}

KD_EXPORT int kvmdirty_vm_adopt(int kvm_fd, int vm_fd, struct kvmdirty_vm **ret_vm)
{
	if (kvm_fd < 0 || vm_fd < 0)
		return -EBADF;
	if (!ret_vm)
		return -EINVAL;
	return vm_init(kvm_fd, vm_fd, false, ret_vm);
}

KD_EXPORT void kvmdirty_vm_free(struct kvmdirty_vm *vm)
{
	if (!vm)
		return;
	kvmdirty_tracker_free(vm->tracker);
	while (vm->nr_vcpus)
		kvmdirty_vcpu_free(vm->vcpus[vm->nr_vcpus - 1]);
	free(vm->vcpus);
	pthread_mutex_destroy(&vm->vcpus_lock);
	kd_regions_fini(vm);
	kd_index_fini(&vm->gpa_index);
	kd_index_fini(&vm->hva_index);
	if (vm->owns_fds) {
		if (vm->vm_fd >= 0)
			close(vm->vm_fd);
		if (vm->kvm_fd >= 0)
			close(vm->kvm_fd);
	}
	free(vm);
}

KD_EXPORT int kvmdirty_vm_fd(const struct kvmdirty_vm *vm)
{
	return vm->vm_fd;
}

KD_EXPORT int kvmdirty_vm_kvm_fd(const struct kvmdirty_vm *vm)
{
	return vm->kvm_fd;
}

KD_EXPORT int64_t kvmdirty_vm_cap(const struct kvmdirty_vm *vm, enum kvmdirty_cap cap)
{
	if ((unsigned int)cap >= KVMDIRTY_CAP_COUNT)
		return -EINVAL;
	return vm->caps[cap];
}

KD_EXPORT uint64_t kvmdirty_vm_page_size(const struct kvmdirty_vm *vm)
{
	return vm->page_size;
}
