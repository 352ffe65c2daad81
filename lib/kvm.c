// SPDX-License-Identifier: MIT
/* The kvm layer: fds, the ioctl wrapper, the clock and the capability probe. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "hooks.h"
#include "kvm-uapi.h"
#include "kvm.h"

int kd_ioctl(int fd, unsigned long req, void *arg)
{
	int ret;

#ifdef KD_TEST_HOOKS
	int (*hook)(int, unsigned long, void *) = __atomic_load_n(&kd_test_hooks.ioctl, __ATOMIC_ACQUIRE);

	if (hook) {
		ret = hook(fd, req, arg);
		if (ret != KD_HOOK_PASS)
			return ret;
	}
#endif
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
static void probe(struct kd_kvm *kvm)
{
	int fd = kvm->vm_fd;
	int64_t *c = kvm->caps;

	c[KVMDIRTY_CAP_USER_MEMORY2] = kd_check_extension(fd, KVM_CAP_USER_MEMORY2) > 0;
	c[KVMDIRTY_CAP_NR_MEMSLOTS] = kd_check_extension(fd, KVM_CAP_NR_MEMSLOTS);
	/* 0 means "not reported": KVM then guarantees 32 (QEMU assumes the same) */
	if (!c[KVMDIRTY_CAP_NR_MEMSLOTS])
		c[KVMDIRTY_CAP_NR_MEMSLOTS] = 32;
	/* slot ids are 16 bits (the upper half of kvm's slot field is the address space) */
	if (c[KVMDIRTY_CAP_NR_MEMSLOTS] > 0xffff)
		c[KVMDIRTY_CAP_NR_MEMSLOTS] = 0xffff;
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

/*
 * The first ioctl on the fd: -ENOTTY where the file is not a KVM device
 * (/dev/null bound there, a stale node), -EPROTO for another API.
 */
static int check_api(int kvm_fd)
{
	int ret = kd_ioctl(kvm_fd, KVM_GET_API_VERSION, NULL);

	if (ret < 0)
		return ret;
	return ret == KVM_API_VERSION ? 0 : -EPROTO;
}

static void kvm_init(struct kd_kvm *kvm, int kvm_fd, int vm_fd, bool owns)
{
	memset(kvm, 0, sizeof(*kvm));
	kvm->kvm_fd = kvm_fd;
	kvm->vm_fd = vm_fd;
	kvm->owns_fds = owns;
	kvm->page_size = (uint64_t)sysconf(_SC_PAGESIZE);
	probe(kvm);
}

int kd_kvm_open(struct kd_kvm *kvm)
{
	int kvm_fd, vm_fd, ret;

	kvm_fd = open("/dev/kvm", O_RDWR | O_CLOEXEC);
	if (kvm_fd < 0)
		return -errno;
	ret = check_api(kvm_fd);
	if (ret < 0) {
		close(kvm_fd);
		return ret;
	}
	vm_fd = kd_ioctl(kvm_fd, KVM_CREATE_VM, (void *)0);
	if (vm_fd < 0) {
		close(kvm_fd);
		return vm_fd;
	}
	kvm_init(kvm, kvm_fd, vm_fd, true);
	return 0;
}

int kd_kvm_adopt(struct kd_kvm *kvm, int kvm_fd, int vm_fd)
{
	int ret = check_api(kvm_fd);

	if (ret < 0)
		return ret;
	kvm_init(kvm, kvm_fd, vm_fd, false);
	return 0;
}

void kd_kvm_close(struct kd_kvm *kvm)
{
	if (!kvm->owns_fds)
		return;
	if (kvm->vm_fd >= 0)
		close(kvm->vm_fd);
	if (kvm->kvm_fd >= 0)
		close(kvm->kvm_fd);
	kvm->vm_fd = kvm->kvm_fd = -1;
}
