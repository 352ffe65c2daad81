// SPDX-License-Identifier: MIT
/* The kvm layer: VM handle, adoption, capability probe. */
#include <sys/ioctl.h>
#include <linux/kvm.h>

#include <kvmdirty.h>

#include "kvm-skip.h"
#include "test-util.h"

/* Capability numbers asked directly, not through possibly old headers. */
static int64_t direct_cap(int fd, long cap)
{
	int r = ioctl(fd, KVM_CHECK_EXTENSION, cap);

	return r < 0 ? 0 : r;
}

START_TEST(probe_matches_kernel)
{
	struct kvmdirty_vm *vm;
	int fd;

	ck_assert_ok(kvmdirty_vm_new(&vm));
	fd = kvmdirty_vm_fd(vm);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_ge(kvmdirty_vm_kvm_fd(vm), 0);
	ck_assert_int_eq(kvmdirty_vm_cap(vm, KVMDIRTY_CAP_NR_MEMSLOTS), direct_cap(fd, 10));
	ck_assert_int_eq(kvmdirty_vm_cap(vm, KVMDIRTY_CAP_MANUAL_PROTECT), direct_cap(fd, 168));
	ck_assert_int_eq(kvmdirty_vm_cap(vm, KVMDIRTY_CAP_DIRTY_RING), direct_cap(fd, 192));
	ck_assert_int_eq(kvmdirty_vm_cap(vm, KVMDIRTY_CAP_DIRTY_RING_ACQ_REL), direct_cap(fd, 223));
	ck_assert_int_eq(kvmdirty_vm_cap(vm, KVMDIRTY_CAP_DIRTY_RING_WITH_BITMAP), direct_cap(fd, 225) > 0);
	/* 231 is newer than the build machine's <linux/kvm.h>: vendored */
	ck_assert_int_eq(kvmdirty_vm_cap(vm, KVMDIRTY_CAP_USER_MEMORY2), direct_cap(fd, 231) > 0);
	ck_assert_int_eq(kvmdirty_vm_cap(vm, KVMDIRTY_CAP_READONLY_MEM), direct_cap(fd, 81) > 0);
	ck_assert_int_gt(kvmdirty_vm_cap(vm, KVMDIRTY_CAP_MAX_VCPUS), 0);
	ck_assert_int_eq(kvmdirty_vm_cap(vm, KVMDIRTY_CAP_COUNT), -EINVAL);
	ck_assert_int_eq(kvmdirty_vm_cap(vm, (enum kvmdirty_cap)-1), -EINVAL);
	ck_assert_uint_eq(kvmdirty_vm_page_size(vm), (uint64_t)sysconf(_SC_PAGESIZE));
	ck_assert_uint_eq(kvmdirty_vm_region_count(vm), 0);
	kvmdirty_vm_free(vm);
}
END_TEST

START_TEST(adopt_leaves_fds_open)
{
	struct kvmdirty_vm *vm = NULL;
	int kvm_fd = open("/dev/kvm", O_RDWR | O_CLOEXEC), vm_fd, vcpu_fd;
	static char mem[1 << 16] __attribute__((aligned(4096)));

	ck_assert_int_ge(kvm_fd, 0);
	vm_fd = ioctl(kvm_fd, KVM_CREATE_VM, 0);
	ck_assert_int_ge(vm_fd, 0);
	ck_assert_ok(kvmdirty_vm_adopt(kvm_fd, vm_fd, &vm));
	ck_assert_int_eq(kvmdirty_vm_fd(vm), vm_fd);
	ck_assert_int_gt(kvmdirty_vm_cap(vm, KVMDIRTY_CAP_NR_MEMSLOTS), 0);
	ck_assert_ok(kvmdirty_region_add(vm, 0x100000, sizeof(mem), mem, 0, NULL));
	kvmdirty_vm_free(vm);
	/* both fds are still the caller's and still work */
	ck_assert_int_ge(fcntl(kvm_fd, F_GETFD), 0);
	ck_assert_int_ge(fcntl(vm_fd, F_GETFD), 0);
	vcpu_fd = ioctl(vm_fd, KVM_CREATE_VCPU, 0);
	ck_assert_int_ge(vcpu_fd, 0);
	close(vcpu_fd);
	close(vm_fd);
	close(kvm_fd);
}
END_TEST

START_TEST(bad_adopt)
{
	struct kvmdirty_vm *vm = (struct kvmdirty_vm *)0x1;
	int null_fd = open("/dev/null", O_RDWR);

	ck_assert_errno(kvmdirty_vm_adopt(-1, 3, &vm), EBADF);
	ck_assert_errno(kvmdirty_vm_adopt(3, -1, &vm), EBADF);
	/* not a KVM fd: KVM_GET_API_VERSION is refused */
	ck_assert_errno(kvmdirty_vm_adopt(null_fd, null_fd, &vm), ENOTTY);
	ck_assert_ptr_eq(vm, (struct kvmdirty_vm *)0x1); /* untouched on error */
	ck_assert_errno(kvmdirty_vm_new(NULL), EINVAL);
	kvmdirty_vm_free(NULL);
	close(null_fd);
}
END_TEST

int main(void)
{
	int skip = require_kvm("test-kvm");
	Suite *s;
	TCase *tc;

	if (skip)
		return skip; /* before Check allocates anything: no leak on the way out */
	s = suite_create("kvm");
	tc = tcase_create("kvm");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, probe_matches_kernel);
	tcase_add_test(tc, adopt_leaves_fds_open);
	tcase_add_test(tc, bad_adopt);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
