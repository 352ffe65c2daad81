// SPDX-License-Identifier: MIT
/* Regions against the real KVM, with the test guest reading and writing. */
#include <inttypes.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <linux/kvm.h>

#include "testvm.h"
#include "kvm-skip.h"
#include "test-util.h"

#define PAGE ((uint64_t)4096)
#define DATA_GPA (4ull << 30)

static struct testvm *new_vm(unsigned int vcpus, bool ring0)
{
	struct testvm_opts o = { .nr_vcpus = vcpus, .ring0 = ring0 };
	struct testvm *tv = NULL;

	ck_assert_ok(testvm_new(&o, &tv));
	return tv;
}

static void set_work(struct testvm *tv, unsigned int i, uint64_t gpa, uint64_t pages, uint64_t until,
		     uint32_t flags)
{
	struct guest_vcpu *mb = testvm_mailbox(tv, i);

	mb->gpa = gpa;
	mb->pages = pages;
	mb->pattern = GUEST_SEQUENTIAL;
	mb->until_pass = until;
	mb->flags = flags;
	mb->stop = 0;
}

/* Run vCPU i to the next event other than PASS; return it. */
static struct testvm_exit run_to_event(struct testvm *tv, unsigned int i)
{
	struct testvm_exit ex;

	do {
		ck_assert_ok(testvm_run(tv, i, &ex));
	} while (ex.event == TESTVM_PASS);
	return ex;
}

static void expect_done(struct testvm *tv, unsigned int i)
{
	struct testvm_exit ex = run_to_event(tv, i);
	struct guest_vcpu *mb = testvm_mailbox(tv, i);

	ck_assert_msg(ex.event == TESTVM_DONE,
		      "vCPU %u: %s (exit %u, mmio gpa 0x%" PRIx64 ", check page 0x%" PRIx64 " tag %" PRIu64
		      "/%" PRIu64 ")",
		      i, testvm_event_name(ex.event), ex.exit_reason, ex.mmio_gpa, mb->err_gpa, mb->err_tag[0],
		      mb->err_tag[1]);
}

/* Every page of [gpa, +pages) at hva holds (gfn, pass). */
static void expect_tags(const void *hva, uint64_t gpa, uint64_t pages, uint64_t pass)
{
	uint64_t i;

	for (i = 0; i < pages; i++) {
		const struct guest_tag *t = (const void *)((const uint8_t *)hva + i * PAGE);

		ck_assert_msg(t->gfn == gpa / PAGE + i && t->pass == pass,
			      "page gpa 0x%" PRIx64 ": tag (0x%" PRIx64 ", %" PRIu64 "), expected (0x%" PRIx64
			      ", %" PRIu64 ")",
			      gpa + i * PAGE, t->gfn, t->pass, gpa / PAGE + i, pass);
	}
}

static void fill_tags(void *hva, uint64_t gpa, uint64_t pages, uint64_t pass)
{
	uint64_t i;

	for (i = 0; i < pages; i++) {
		struct guest_tag *t = (void *)((uint8_t *)hva + i * PAGE);

		t->gfn = gpa / PAGE + i;
		t->pass = pass;
	}
}

/*
 * The guest's working set spans two adjacent regions with unrelated host
 * memory, plus a third apart: it must read what the host wrote in each
 * (its exact check) and the host must see what it wrote.
 */
START_TEST(guest_reads_and_writes_regions)
{
	struct testvm *tv = new_vm(1, false);
	uint64_t a_gpa = DATA_GPA, a_size = 1 << 20, b_gpa = a_gpa + a_size, b_size = 3 << 20;
	uint64_t c_gpa = 64ull << 30, c_size = 2 << 20;
	void *a, *b, *c;
	struct testvm_exit ex;
	struct guest_vcpu *mb = testvm_mailbox(tv, 0);

	ck_assert_ok(testvm_add_memory(tv, a_gpa, a_size, 0, &a, NULL));
	ck_assert_ok(testvm_add_memory(tv, b_gpa, b_size, 0, &b, NULL));
	ck_assert_ok(testvm_add_memory(tv, c_gpa, c_size, 0, &c, NULL));
	fill_tags(a, a_gpa, a_size / PAGE, 5);
	fill_tags(b, b_gpa, b_size / PAGE, 5);
	fill_tags(c, c_gpa, c_size / PAGE, 5);

	/* pass 6 over a+b: every page must hold pass 5 first */
	set_work(tv, 0, a_gpa, (a_size + b_size) / PAGE, 6, GUEST_F_CHECK_EXACT);
	mb->pass = 5;
	expect_done(tv, 0);
	ck_assert_uint_eq(mb->pass, 6);
	expect_tags(a, a_gpa, a_size / PAGE, 6);
	expect_tags(b, b_gpa, b_size / PAGE, 6);
	expect_tags(c, c_gpa, c_size / PAGE, 5);
	testvm_free(tv);

	/* a host write the guest must read: it stops at the changed page */
	tv = new_vm(1, false);
	mb = testvm_mailbox(tv, 0);
	ck_assert_ok(kvmdirty_region_add(tv->vm, c_gpa, c_size, c, 0, NULL));
	((struct guest_tag *)((uint8_t *)c + 77 * PAGE))->pass = 4;
	set_work(tv, 0, c_gpa, c_size / PAGE, 6, GUEST_F_CHECK_EXACT);
	mb->pass = 5;
	ex = run_to_event(tv, 0);
	ck_assert_msg(ex.event == TESTVM_ERROR, "expected the guest to see the host's write, got %s",
		      testvm_event_name(ex.event));
	ck_assert_uint_eq(mb->err_gpa, c_gpa + 77 * PAGE);
	ck_assert_uint_eq(mb->err_tag[1], 4);
	testvm_free(tv);
	testvm_unmap(a, a_size);
	testvm_unmap(b, b_size);
	testvm_unmap(c, c_size);
}
END_TEST

START_TEST(two_vcpus_ring3_and_ring0)
{
	bool ring0 = _i;
	uint64_t pages = ring0 ? 64 : 4096, size = pages * PAGE;
	struct testvm *tv = new_vm(2, ring0);
	void *m[2];
	unsigned int i, bad = 0;
	struct testvm_exit ex;

	for (i = 0; i < 2; i++) {
		ck_assert_ok(testvm_add_memory(tv, DATA_GPA + i * size, size, 0, &m[i], NULL));
		set_work(tv, i, DATA_GPA + i * size, pages, 3, GUEST_F_CHECK);
	}
	ck_assert_msg(testvm_run_all(tv, &bad, &ex) == 0, "vCPU %u: %s", bad, testvm_event_name(ex.event));
	for (i = 0; i < 2; i++)
		expect_tags(m[i], DATA_GPA + i * size, pages, 3);
	testvm_free(tv);
	for (i = 0; i < 2; i++)
		testvm_unmap(m[i], size);
}
END_TEST

/* After removal the guest's access exits as MMIO: the slot is gone in KVM. */
START_TEST(removed_region_is_gone)
{
	struct testvm *tv = new_vm(1, false);
	uint64_t size = 1 << 20;
	struct kvmdirty_region *r;
	struct testvm_exit ex;
	void *m;

	ck_assert_ok(testvm_add_memory(tv, DATA_GPA, size, 0, &m, &r));
	set_work(tv, 0, DATA_GPA, size / PAGE, 1, 0);
	expect_done(tv, 0);
	expect_tags(m, DATA_GPA, size / PAGE, 1);
	ck_assert_ok(kvmdirty_region_remove(tv->vm, r));
	ck_assert_ptr_null(kvmdirty_region_from_gpa(tv->vm, DATA_GPA));
	ck_assert_ptr_null(kvmdirty_region_from_hva(tv->vm, m));
	ck_assert_uint_eq(kvmdirty_vm_region_count(tv->vm), 1);
	testvm_free(tv);

	/* fresh guest, region added then removed before the guest runs */
	tv = new_vm(1, false);
	ck_assert_ok(kvmdirty_region_add(tv->vm, DATA_GPA, size, m, 0, &r));
	ck_assert_ok(kvmdirty_region_remove(tv->vm, r));
	set_work(tv, 0, DATA_GPA, size / PAGE, 1, 0);
	ex = run_to_event(tv, 0);
	ck_assert_msg(ex.event == TESTVM_MMIO, "expected an MMIO exit, got %s", testvm_event_name(ex.event));
	ck_assert_msg(ex.mmio_gpa >= DATA_GPA && ex.mmio_gpa < DATA_GPA + size, "mmio at 0x%" PRIx64, ex.mmio_gpa);
	testvm_free(tv);
	testvm_unmap(m, size);
}
END_TEST

START_TEST(move_region)
{
	struct testvm *tv = new_vm(1, false);
	uint64_t size = 2 << 20, new_gpa = 16ull << 30;
	struct kvmdirty_region *r;
	struct testvm_exit ex;
	uint8_t *m;

	ck_assert_ok(testvm_add_memory(tv, DATA_GPA, size, KVMDIRTY_REGION_LOG_DIRTY, (void **)&m, &r));
	ck_assert_ok(kvmdirty_region_move(tv->vm, r, new_gpa));
	ck_assert_uint_eq(kvmdirty_region_gpa(r), new_gpa);
	ck_assert_uint_eq(kvmdirty_region_flags(r), KVMDIRTY_REGION_LOG_DIRTY);
	ck_assert_ptr_eq(kvmdirty_region_from_gpa(tv->vm, new_gpa + size - 1), r);
	ck_assert_ptr_null(kvmdirty_region_from_gpa(tv->vm, DATA_GPA));
	ck_assert_ptr_eq(kvmdirty_vm_gpa_to_hva(tv->vm, new_gpa + 5 * PAGE + 8), m + 5 * PAGE + 8);
	ck_assert_ok(kvmdirty_region_move(tv->vm, r, new_gpa)); /* same place: no-op */
	/* moving onto the system region or wrapping is refused, nothing changes */
	ck_assert_errno(kvmdirty_region_move(tv->vm, r, 0), EEXIST);
	ck_assert_errno(kvmdirty_region_move(tv->vm, r, UINT64_MAX & ~(PAGE - 1)), EINVAL);
	ck_assert_errno(kvmdirty_region_move(tv->vm, r, new_gpa + 1), EINVAL);
	ck_assert_uint_eq(kvmdirty_region_gpa(r), new_gpa);

	set_work(tv, 0, new_gpa, size / PAGE, 1, 0);
	expect_done(tv, 0);
	expect_tags(m, new_gpa, size / PAGE, 1);
	testvm_free(tv);

	/* the old place is empty for the guest */

	tv = new_vm(1, false);
	ck_assert_ok(kvmdirty_region_add(tv->vm, new_gpa, size, m, 0, &r));
	ck_assert_ok(kvmdirty_region_move(tv->vm, r, DATA_GPA));
	set_work(tv, 0, new_gpa, 1, 1, 0);
	ex = run_to_event(tv, 0);
	ck_assert_msg(ex.event == TESTVM_MMIO && ex.mmio_gpa == new_gpa, "old gpa: %s at 0x%" PRIx64,
		      testvm_event_name(ex.event), ex.mmio_gpa);
	testvm_free(tv);
	testvm_unmap(m, size);
}
END_TEST

/* KVM_GET_DIRTY_LOG tells whether KVM has a dirty bitmap for the slot. */
static int get_log(struct testvm *tv, struct kvmdirty_region *r)
{
	uint64_t bitmap[512] = { 0 };
	struct kvm_dirty_log log = { .slot = kvmdirty_region_slot(r), .dirty_bitmap = bitmap };

	ck_assert_uint_le(kvmdirty_region_size(r) / PAGE, sizeof(bitmap) * 8);
	return ioctl(kvmdirty_vm_fd(tv->vm), KVM_GET_DIRTY_LOG, &log) < 0 ? -errno : 0;
}

START_TEST(logging_on_off)
{
	struct testvm *tv = new_vm(1, false);
	struct kvmdirty_region *r1, *r2;
	void *m1, *m2;

	ck_assert_ok(testvm_add_memory(tv, DATA_GPA, 1 << 20, 0, &m1, &r1));
	ck_assert_ok(testvm_add_memory(tv, 2 * DATA_GPA, 1 << 20, KVMDIRTY_REGION_LOG_DIRTY, &m2, &r2));
	ck_assert_errno(get_log(tv, r1), ENOENT);
	ck_assert_ok(get_log(tv, r2));
	ck_assert_ok(kvmdirty_region_set_logging(tv->vm, r1, true));
	ck_assert_ok(kvmdirty_region_set_logging(tv->vm, r1, true));
	ck_assert_uint_eq(kvmdirty_region_flags(r1), KVMDIRTY_REGION_LOG_DIRTY);
	ck_assert_ok(get_log(tv, r1));
	ck_assert_ok(kvmdirty_region_set_logging(tv->vm, r2, false));
	ck_assert_errno(get_log(tv, r2), ENOENT);
	ck_assert_ok(get_log(tv, r1));

	ck_assert_ok(kvmdirty_vm_set_logging(tv->vm, true));
	ck_assert_ok(get_log(tv, r1));
	ck_assert_ok(get_log(tv, r2));
	ck_assert_ok(get_log(tv, tv->sys_region));
	ck_assert_ok(kvmdirty_vm_set_logging(tv->vm, false));
	ck_assert_errno(get_log(tv, r1), ENOENT);
	ck_assert_errno(get_log(tv, r2), ENOENT);
	ck_assert_errno(get_log(tv, tv->sys_region), ENOENT);
	ck_assert_errno(kvmdirty_region_set_logging(tv->vm, NULL, true), EINVAL);
	ck_assert_errno(kvmdirty_vm_set_logging(NULL, true), EINVAL);

	/* the guest still runs through regions whose flags changed */
	set_work(tv, 0, DATA_GPA, (1 << 20) / PAGE, 2, GUEST_F_CHECK);
	expect_done(tv, 0);
	expect_tags(m1, DATA_GPA, (1 << 20) / PAGE, 2);
	testvm_free(tv);
	testvm_unmap(m1, 1 << 20);
	testvm_unmap(m2, 1 << 20);
}
END_TEST

/* Each bad input: its errno, no region left behind, the VM still works. */
START_TEST(bad_input)
{
	struct testvm *tv = new_vm(1, false);
	struct kvmdirty_vm *vm = tv->vm, *other;
	uint64_t size = 1 << 20, g = DATA_GPA;
	struct kvmdirty_region *r, *ro, *keep = (struct kvmdirty_region *)0x1;
	uint8_t *m = testvm_map(size * 4), *holey = testvm_map(3 * PAGE);
	unsigned int n;

	ck_assert_ptr_nonnull(m);
	ck_assert_ptr_nonnull(holey);
	ck_assert_int_eq(munmap(holey + PAGE, PAGE), 0);
	ck_assert_ok(kvmdirty_region_add(vm, g, size, m, 0, &r));
	n = kvmdirty_vm_region_count(vm);

	ck_assert_errno(kvmdirty_region_add(vm, 2 * g, 0, m, 0, &keep), EINVAL);
	ck_assert_errno(kvmdirty_region_add(vm, 2 * g + 8, size, m, 0, &keep), EINVAL);
	ck_assert_errno(kvmdirty_region_add(vm, 2 * g, size + 100, m, 0, &keep), EINVAL);
	ck_assert_errno(kvmdirty_region_add(vm, 2 * g, size, m + 64, 0, &keep), EINVAL);
	ck_assert_errno(kvmdirty_region_add(vm, UINT64_MAX & ~(PAGE - 1), 2 * PAGE, m, 0, &keep), EINVAL);
	ck_assert_errno(kvmdirty_region_add(vm, 2 * g, size, m, 1u << 7, &keep), EINVAL);
	ck_assert_errno(kvmdirty_region_add(NULL, 2 * g, size, m, 0, &keep), EINVAL);
	ck_assert_errno(kvmdirty_region_add(vm, 2 * g, 1ull << 43, m, 0, &keep), E2BIG);
	ck_assert_errno(kvmdirty_region_add(vm, 2 * g, size, NULL, 0, &keep), EFAULT);
	ck_assert_errno(kvmdirty_region_add(vm, 2 * g, 3 * PAGE, holey, 0, &keep), EFAULT);
	ck_assert_errno(kvmdirty_region_add(vm, 2 * g, 4 * PAGE, holey, 0, &keep), EFAULT);
	ck_assert_errno(kvmdirty_region_add(vm, 2 * g, PAGE, (void *)(UINTPTR_MAX & ~(PAGE - 1)), 0, &keep), EFAULT);
	/* guest-physical overlap in every shape; host aliasing is allowed */
	ck_assert_errno(kvmdirty_region_add(vm, g, size, m + size, 0, &keep), EEXIST);
	ck_assert_errno(kvmdirty_region_add(vm, g - PAGE, 2 * PAGE, m + size, 0, &keep), EEXIST);
	ck_assert_errno(kvmdirty_region_add(vm, g + size - PAGE, 2 * PAGE, m + size, 0, &keep), EEXIST);
	ck_assert_errno(kvmdirty_region_add(vm, g + PAGE, PAGE, m + size, 0, &keep), EEXIST);
	ck_assert_errno(kvmdirty_region_add(vm, g - size, 3 * size, m + size, 0, &keep), EEXIST);
	ck_assert_errno(kvmdirty_region_add(vm, 0, PAGE, m + size, 0, &keep), EEXIST);
	ck_assert_ptr_eq(keep, (struct kvmdirty_region *)0x1);
	ck_assert_uint_eq(kvmdirty_vm_region_count(vm), n);
	ck_assert_ptr_null(kvmdirty_region_from_gpa(vm, 2 * g));
	ck_assert_ptr_null(kvmdirty_region_from_gpa(vm, g - PAGE));
	ck_assert_ptr_null(kvmdirty_region_from_hva(vm, m + size));
	ck_assert_ptr_eq(kvmdirty_region_from_gpa(vm, g), r);

	if (kvmdirty_vm_cap(vm, KVMDIRTY_CAP_READONLY_MEM)) {
		ck_assert_ok(kvmdirty_region_add(vm, 2 * g, size, m, KVMDIRTY_REGION_READONLY, &ro));
		ck_assert_ok(kvmdirty_region_remove(vm, ro));
	} else {
		ck_assert_errno(kvmdirty_region_add(vm, 2 * g, size, m, KVMDIRTY_REGION_READONLY, &ro), EOPNOTSUPP);
	}
	/* an alias of r's host memory at another gpa is fine */
	ck_assert_ok(kvmdirty_region_add(vm, 2 * g, size, m, 0, &ro));
	ck_assert_ok(kvmdirty_region_remove(vm, ro));

	ck_assert_errno(kvmdirty_region_remove(vm, NULL), EINVAL);
	ck_assert_ok(kvmdirty_vm_new(&other));
	ck_assert_errno(kvmdirty_region_remove(other, r), EINVAL);
	ck_assert_errno(kvmdirty_region_move(other, r, 2 * g), EINVAL);
	ck_assert_errno(kvmdirty_region_set_logging(other, r, true), EINVAL);
	kvmdirty_vm_free(other);
	ck_assert_uint_eq(kvmdirty_vm_region_count(vm), n);

	/* the VM is intact: the guest reads and writes r */
	fill_tags(m, g, size / PAGE, 1);
	set_work(tv, 0, g, size / PAGE, 2, GUEST_F_CHECK_EXACT);
	testvm_mailbox(tv, 0)->pass = 1;
	expect_done(tv, 0);
	expect_tags(m, g, size / PAGE, 2);
	testvm_free(tv);
	testvm_unmap(m, size * 4);
	munmap(holey, PAGE);
	munmap(holey + 2 * PAGE, PAGE);
}
END_TEST

/*
 * When KVM itself refuses (here: a slot the VMM made behind the library's
 * back overlaps), nothing of the region may remain.
 */
START_TEST(failed_ioctl_leaves_nothing)
{
	int kvm_fd = open("/dev/kvm", O_RDWR | O_CLOEXEC), vm_fd;
	uint8_t *m = testvm_map(1 << 20);
	struct kvm_userspace_memory_region own = {
		.slot = 1000, .guest_phys_addr = DATA_GPA, .memory_size = 1 << 20, .userspace_addr = (uintptr_t)m,
	};
	struct kvmdirty_region *r;
	struct kvmdirty_vm *vm;

	ck_assert_int_ge(kvm_fd, 0);
	vm_fd = ioctl(kvm_fd, KVM_CREATE_VM, 0);
	ck_assert_int_ge(vm_fd, 0);
	ck_assert_int_eq(ioctl(vm_fd, KVM_SET_USER_MEMORY_REGION, &own), 0);
	ck_assert_ok(kvmdirty_vm_adopt(kvm_fd, vm_fd, &vm));
	ck_assert_errno(kvmdirty_region_add(vm, DATA_GPA, 1 << 20, m, 0, &r), EEXIST);
	ck_assert_uint_eq(kvmdirty_vm_region_count(vm), 0);
	ck_assert_ptr_null(kvmdirty_region_from_gpa(vm, DATA_GPA));
	ck_assert_ptr_null(kvmdirty_region_from_hva(vm, m));
	ck_assert_ptr_null(kvmdirty_region_from_slot(vm, 0));
	/* slot 0 is still free, in the library and in KVM */
	ck_assert_ok(kvmdirty_region_add(vm, 2 * DATA_GPA, 1 << 20, m, 0, &r));
	ck_assert_uint_eq(kvmdirty_region_slot(r), 0);
	kvmdirty_vm_free(vm);
	close(vm_fd);
	close(kvm_fd);
	testvm_unmap(m, 1 << 20);
}
END_TEST

/* All memslots in use, ENOSPC, then freed ids are reused lowest first. */
START_TEST(all_slots)
{
	struct kvmdirty_vm *vm;
	struct kvmdirty_region **rs, *r;
	uint8_t *page = testvm_map(PAGE);
	uint32_t i, n;

	ck_assert_ok(kvmdirty_vm_new(&vm));
	n = (uint32_t)kvmdirty_vm_cap(vm, KVMDIRTY_CAP_NR_MEMSLOTS);
	rs = calloc(n, sizeof(*rs));
	ck_assert_ptr_nonnull(rs);
	/* one host page aliased by every slot, 2 pages apart in the guest */
	for (i = 0; i < n; i++) {
		int ret = kvmdirty_region_add(vm, DATA_GPA + 2 * i * PAGE, PAGE, page, 0, &rs[i]);

		ck_assert_msg(ret == 0, "slot %u of %u: %d (%s)", i, n, ret, strerror(-ret));
		ck_assert_uint_eq(kvmdirty_region_slot(rs[i]), i);
	}
	ck_assert_errno(kvmdirty_region_add(vm, 2 * DATA_GPA, PAGE, page, 0, &r), ENOSPC);
	ck_assert_uint_eq(kvmdirty_vm_region_count(vm), n);
	for (i = 0; i < n; i++) {
		ck_assert_ptr_eq(kvmdirty_region_from_gpa(vm, DATA_GPA + 2 * i * PAGE + 100), rs[i]);
		ck_assert_ptr_null(kvmdirty_region_from_gpa(vm, DATA_GPA + (2 * i + 1) * PAGE));
		ck_assert_ptr_eq(kvmdirty_region_from_slot(vm, i), rs[i]);
	}
	ck_assert_ptr_nonnull(kvmdirty_region_from_hva(vm, page + 5));
	ck_assert_ok(kvmdirty_region_remove(vm, rs[n - 1]));
	ck_assert_ok(kvmdirty_region_remove(vm, rs[7]));
	ck_assert_ok(kvmdirty_region_add(vm, 2 * DATA_GPA, PAGE, page, 0, &r));
	ck_assert_uint_eq(kvmdirty_region_slot(r), 7);
	ck_assert_ok(kvmdirty_region_add(vm, 3 * DATA_GPA, PAGE, page, 0, &r));
	ck_assert_uint_eq(kvmdirty_region_slot(r), n - 1);
	ck_assert_errno(kvmdirty_region_add(vm, 4 * DATA_GPA, PAGE, page, 0, &r), ENOSPC);
	for (r = kvmdirty_region_next(vm, NULL), i = 0; r; r = kvmdirty_region_next(vm, r), i++)
		ck_assert_uint_eq(kvmdirty_region_slot(r), i);
	ck_assert_uint_eq(i, n);
	kvmdirty_vm_free(vm);
	free(rs);
	testvm_unmap(page, PAGE);
}
END_TEST

int main(void)
{
	int skip = require_kvm("test-regions");
	Suite *s;
	TCase *tc;

	if (skip)
		return skip; /* before Check allocates anything: no leak on the way out */
	s = suite_create("regions");
	tc = tcase_create("regions");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, guest_reads_and_writes_regions);
	tcase_add_loop_test(tc, two_vcpus_ring3_and_ring0, 0, 2);
	tcase_add_test(tc, removed_region_is_gone);
	tcase_add_test(tc, move_region);
	tcase_add_test(tc, logging_on_off);
	tcase_add_test(tc, bad_input);
	tcase_add_test(tc, failed_ioctl_leaves_nothing);
	tcase_add_test(tc, all_slots);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
