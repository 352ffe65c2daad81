// SPDX-License-Identifier: MIT
/*
 * A vCPU's and a VM's whole state through the engine
 * (lib/migrate/guest/vcpu.c, vm.c).  The vCPU's:
 * set on a vCPU of one VM with an in-kernel irqchip, saved, checked as a
 * VCPU record's payload, loaded into a fresh vCPU of another VM and read
 * back there.  Each part a kernel relies on compared by name: XCR0 (AVX
 * state), the SYSCALL/SYSENTER MSRs, PAT, TSC_AUX, kvmclock's MSR, the
 * TSC, the LAPIC (its timer's vector and count, the TSC deadline armed
 * against it), debug registers, MP state, a pending NMI.  Leave one part
 * out of save or load and its line goes red.  The VM's: an IOAPIC
 * redirection entry, both PICs' masks, the PIT's channel 0 count and mode,
 * the clock (never behind where it was).
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <linux/kvm.h>

#include "guest.h"
#include "kvm-skip.h"
#include "test-util.h"

#define APIC_LVTT 0x320
#define APIC_TMICT 0x380
#define APIC_TDCR 0x3e0
#define APIC_SPIV 0xf0

struct vm {
	int kvm, vm, vcpu;
};

static void vm_make(struct vm *v)
{
	struct kvm_cpuid2 *cpuid = calloc(1, sizeof(*cpuid) + 256 * sizeof(struct kvm_cpuid_entry2));

	ck_assert_ptr_nonnull(cpuid);
	v->kvm = open("/dev/kvm", O_RDWR | O_CLOEXEC);
	ck_assert_int_ge(v->kvm, 0);
	v->vm = ioctl(v->kvm, KVM_CREATE_VM, 0);
	ck_assert_int_ge(v->vm, 0);
	ck_assert_int_eq(ioctl(v->vm, KVM_CREATE_IRQCHIP, 0), 0);
	ck_assert_int_eq(ioctl(v->vm, KVM_CREATE_PIT2, &(struct kvm_pit_config){ 0 }), 0);
	v->vcpu = ioctl(v->vm, KVM_CREATE_VCPU, 0);
	ck_assert_int_ge(v->vcpu, 0);
	cpuid->nent = 256;
	ck_assert_int_eq(ioctl(v->kvm, KVM_GET_SUPPORTED_CPUID, cpuid), 0);
	ck_assert_int_eq(ioctl(v->vcpu, KVM_SET_CPUID2, cpuid), 0);
	free(cpuid);
}

static void vm_free(struct vm *v)
{
	close(v->vcpu);
	close(v->vm);
	close(v->kvm);
}

/* The vCPU's MSR index, or 0 and false where it cannot be read. */
static bool msr_get(int vcpu, uint32_t index, uint64_t *ret)
{
	struct {
		struct kvm_msrs hdr;
		struct kvm_msr_entry e;
	} m = { .hdr.nmsrs = 1, .e.index = index };

	*ret = 0;
	if (ioctl(vcpu, KVM_GET_MSRS, &m) != 1)
		return false;
	*ret = m.e.data;
	return true;
}

static bool msr_set(int vcpu, uint32_t index, uint64_t data)
{
	struct {
		struct kvm_msrs hdr;
		struct kvm_msr_entry e;
	} m = { .hdr.nmsrs = 1, .e = { .index = index, .data = data } };

	return ioctl(vcpu, KVM_SET_MSRS, &m) == 1;
}

static uint32_t apic_reg(const struct kvm_lapic_state *l, unsigned int off)
{
	uint32_t v;

	memcpy(&v, l->regs + off, 4);
	return v;
}

static void apic_set(struct kvm_lapic_state *l, unsigned int off, uint32_t v)
{
	memcpy(l->regs + off, &v, 4);
}

/* The MSRs a kernel sets, and a value for each that a vCPU takes. */
static const struct {
	uint32_t index;
	uint64_t value;
	const char *name;
} msrs[] = {
	{ 0x174, 0x10, "SYSENTER_CS" },
	{ 0x175, 0xffff888000123000ull, "SYSENTER_ESP" },
	{ 0x176, 0xffffffff81a00000ull, "SYSENTER_EIP" },
	{ 0x277, 0x0007010600070106ull, "PAT" },
	{ 0xc0000081, 0x0023001000000000ull, "STAR" },
	{ 0xc0000082, 0xffffffff81c00080ull, "LSTAR" },
	{ 0xc0000083, 0xffffffff81c01540ull, "CSTAR" },
	{ 0xc0000084, 0x47700, "SFMASK" },
	{ 0xc0000102, 0xffff88807fc00000ull, "KERNEL_GS_BASE" },
	{ 0xc0000103, 0x1, "TSC_AUX" },
	{ 0x4b564d01, 0x12345001, "kvmclock system time" },
};

/* What the source vCPU was given: the pieces it took (a host may lack TSC_AUX, or XSAVE's AVX). */
struct given {
	bool msr[sizeof(msrs) / sizeof(msrs[0])];
	/*
	 * ... and what the vCPU holds then: KVM on AMD keeps SYSENTER_ESP
	 * and SYSENTER_EIP 32 bits wide for a guest of AMD's CPUID.
	 */
	uint64_t held[sizeof(msrs) / sizeof(msrs[0])];
	uint64_t xcr0;
	uint64_t tsc;
	uint64_t deadline;
};

static void give(int vcpu, struct given *gv)
{
	struct kvm_debugregs dr;
	struct kvm_mp_state mp = { .mp_state = KVM_MP_STATE_HALTED };
	struct kvm_vcpu_events ev;
	struct kvm_lapic_state l;
	struct kvm_xcrs x;
	unsigned int i;

	memset(gv, 0, sizeof(*gv));
	for (i = 0; i < sizeof(msrs) / sizeof(msrs[0]); i++) {
		gv->msr[i] = msr_set(vcpu, msrs[i].index, msrs[i].value);
		if (gv->msr[i])
			ck_assert(msr_get(vcpu, msrs[i].index, &gv->held[i]));
	}
	/* XCR0: x87, SSE and, where the host has it, AVX */
	ck_assert_int_eq(ioctl(vcpu, KVM_GET_XCRS, &x), 0);
	x.nr_xcrs = 1;
	x.xcrs[0].xcr = 0;
	x.xcrs[0].value = 0x7;
	gv->xcr0 = ioctl(vcpu, KVM_SET_XCRS, &x) == 0 ? 0x7 : 0x3;
	if (gv->xcr0 == 0x3) {
		x.xcrs[0].value = 0x3;
		ck_assert_int_eq(ioctl(vcpu, KVM_SET_XCRS, &x), 0);
	}
	/* the LAPIC on, its timer periodic at vector 0xec, a count running down */
	ck_assert_int_eq(ioctl(vcpu, KVM_GET_LAPIC, &l), 0);
	apic_set(&l, APIC_SPIV, 0x1ff);
	apic_set(&l, APIC_TDCR, 0xb);
	apic_set(&l, APIC_LVTT, 0xec | (1u << 17));
	apic_set(&l, APIC_TMICT, 0x7fffffff);
	ck_assert_int_eq(ioctl(vcpu, KVM_SET_LAPIC, &l), 0);
	memset(&dr, 0, sizeof(dr));
	dr.db[0] = 0x401000;
	dr.db[3] = 0x7ff000;
	dr.dr7 = 0x403; /* L0, G0: a breakpoint set */
	dr.dr6 = 0xffff0ff0;
	ck_assert_int_eq(ioctl(vcpu, KVM_SET_DEBUGREGS, &dr), 0);
	ck_assert_int_eq(ioctl(vcpu, KVM_SET_MP_STATE, &mp), 0);
	ck_assert_int_eq(ioctl(vcpu, KVM_GET_VCPU_EVENTS, &ev), 0);
	ev.nmi.pending = 1;
	ev.flags |= KVM_VCPUEVENT_VALID_NMI_PENDING;
	ck_assert_int_eq(ioctl(vcpu, KVM_SET_VCPU_EVENTS, &ev), 0);
	/*
	 * Hours ahead of any VM's own count: KVM takes a host's TSC write
	 * within a second of what it expects from the VM's last one for a
	 * vCPU being synchronized, and matches it to that instead (seen
	 * under kvm-under-tcg, where two fresh VMs' seconds pass slowly).
	 */
	ck_assert(msr_set(vcpu, 0x10, 0x123456789abcull));
	ck_assert(msr_get(vcpu, 0x10, &gv->tsc));
}

/* The destination's vCPU against what the source's was given, part by part. */
static void compare(int vcpu, const struct given *gv)
{
	struct kvm_debugregs dr;
	struct kvm_mp_state mp;
	struct kvm_vcpu_events ev;
	struct kvm_lapic_state l;
	struct kvm_xcrs x;
	unsigned int i;
	uint64_t v;
	int khz;

	for (i = 0; i < sizeof(msrs) / sizeof(msrs[0]); i++) {
		if (!gv->msr[i])
			continue;
		ck_assert_msg(msr_get(vcpu, msrs[i].index, &v) && v == gv->held[i],
			      "%s (0x%x): 0x%" PRIx64 " after the load, 0x%" PRIx64 " before", msrs[i].name, msrs[i].index,
			      v, gv->held[i]);
	}
	ck_assert_int_eq(ioctl(vcpu, KVM_GET_XCRS, &x), 0);
	ck_assert_msg(x.nr_xcrs >= 1 && x.xcrs[0].value == gv->xcr0, "XCR0: 0x%llx after the load, 0x%" PRIx64 " before",
		      (unsigned long long)x.xcrs[0].value, gv->xcr0);
	ck_assert_int_eq(ioctl(vcpu, KVM_GET_LAPIC, &l), 0);
	ck_assert_msg(apic_reg(&l, APIC_LVTT) == (0xec | (1u << 17)) && apic_reg(&l, APIC_TMICT) == 0x7fffffff &&
			      apic_reg(&l, APIC_SPIV) == 0x1ff,
		      "LAPIC: timer LVT 0x%x, initial count 0x%x, SPIV 0x%x after the load", apic_reg(&l, APIC_LVTT),
		      apic_reg(&l, APIC_TMICT), apic_reg(&l, APIC_SPIV));
	ck_assert_int_eq(ioctl(vcpu, KVM_GET_DEBUGREGS, &dr), 0);
	ck_assert_msg(dr.db[0] == 0x401000 && dr.db[3] == 0x7ff000 && (dr.dr7 & 0xff) == 0x03,
		      "debug registers: dr0 0x%llx dr3 0x%llx dr7 0x%llx after the load", (unsigned long long)dr.db[0],
		      (unsigned long long)dr.db[3], (unsigned long long)dr.dr7);
	ck_assert_int_eq(ioctl(vcpu, KVM_GET_MP_STATE, &mp), 0);
	ck_assert_msg(mp.mp_state == KVM_MP_STATE_HALTED, "MP state: %u after the load, HALTED (%u) before", mp.mp_state,
		      KVM_MP_STATE_HALTED);
	ck_assert_int_eq(ioctl(vcpu, KVM_GET_VCPU_EVENTS, &ev), 0);
	ck_assert_msg(ev.nmi.pending, "events: the pending NMI was lost");
	/*
	 * The TSC: never behind what it was at the save (it runs on, from
	 * there), give or take 1 ms: where the host's own TSC is unstable
	 * (kvm-under-tcg: its emulated CPUs' counters differ by tens of
	 * microseconds) KVM offsets each vCPU as the thread moves, and a
	 * reading on one VM is not exact on another's clock.
	 */
	ck_assert(msr_get(vcpu, 0x10, &v));
	khz = ioctl(vcpu, KVM_GET_TSC_KHZ, 0);
	ck_assert_int_gt(khz, 0);
	ck_assert_msg(v + (uint64_t)khz >= gv->tsc, "TSC: 0x%" PRIx64 " after the load, 0x%" PRIx64 " when set", v,
		      gv->tsc);
}

/* Every part saved, in form, and each MSR a kernel sets among them. */
START_TEST(whole_state_moves)
{
	struct mig_vcpu_state *st = calloc(2, sizeof(*st));
	struct given gv;
	struct vm a, b;
	char err[256];
	unsigned int i, k;

	ck_assert_ptr_nonnull(st);
	vm_make(&a);
	vm_make(&b);
	give(a.vcpu, &gv);
	ck_assert_int_eq(mig_vcpu_save_kvm(a.vcpu, &st[0]), 0);
	ck_assert_msg(mig_vcpu_state_check(&st[0], "saved", err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(mig_vcpu_state_host_check(&st[0], "saved", err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(st[0].parts == MIG_VS_ALL, "parts saved: 0x%x, all: 0x%x", st[0].parts, MIG_VS_ALL);
	printf("whole state: %u MSRs saved, parts 0x%x, XCR0 0x%" PRIx64 "%s\n", st[0].nr_msrs, st[0].parts, gv.xcr0,
	       gv.msr[9] ? "" : " (this host's vCPU takes no TSC_AUX)");
	for (i = 0; i < sizeof(msrs) / sizeof(msrs[0]); i++) {
		if (!gv.msr[i])
			continue;
		for (k = 0; k < st[0].nr_msrs && st[0].msrs[k].index != msrs[i].index; k++)
			;
		ck_assert_msg(k < st[0].nr_msrs, "%s (0x%x): set on the vCPU, not saved", msrs[i].name, msrs[i].index);
		ck_assert_msg(st[0].msrs[k].data == gv.held[i], "%s (0x%x): 0x%" PRIx64 " saved, the vCPU held 0x%" PRIx64,
			      msrs[i].name, msrs[i].index, (uint64_t)st[0].msrs[k].data, gv.held[i]);
	}
	ck_assert_int_eq(mig_vcpu_load_kvm(b.vcpu, &st[0]), 0);
	compare(b.vcpu, &gv);
	/* and saved again there: the same MSR list */
	ck_assert_int_eq(mig_vcpu_save_kvm(b.vcpu, &st[1]), 0);
	ck_assert_uint_eq(st[1].nr_msrs, st[0].nr_msrs);
	for (k = 0; k < st[0].nr_msrs; k++)
		ck_assert_uint_eq(st[1].msrs[k].index, st[0].msrs[k].index);
	vm_free(&a);
	vm_free(&b);
	free(st);
}
END_TEST

/* A record this host cannot load is refused by name: an MSR no KVM saves; a list out of form. */
START_TEST(refused_by_name)
{
	struct mig_vcpu_state *st = calloc(1, sizeof(*st));
	struct vm a;
	char err[256];

	ck_assert_ptr_nonnull(st);
	vm_make(&a);
	ck_assert_int_eq(mig_vcpu_save_kvm(a.vcpu, st), 0);
	ck_assert_uint_gt(st->nr_msrs, 1);
	st->msrs[st->nr_msrs - 1].index = 0xfffffff0; /* past every known one: still ascending */
	ck_assert_int_eq(mig_vcpu_state_check(st, "record 9 (VCPU)", err, sizeof(err)), 0);
	ck_assert_int_eq(mig_vcpu_state_host_check(st, "record 9 (VCPU)", err, sizeof(err)), -EPROTO);
	ck_assert_msg(strstr(err, "record 9 (VCPU).msrs[") && strstr(err, "0xfffffff0"), "%s", err);
	st->msrs[1].index = st->msrs[0].index;
	ck_assert_int_eq(mig_vcpu_state_check(st, "record 9 (VCPU)", err, sizeof(err)), -EPROTO);
	ck_assert_msg(strstr(err, "record 9 (VCPU).msrs[1].index") && strstr(err, "ascending"), "%s", err);
	st->msrs[1].index = st->msrs[0].index + 1;
	st->nr_msrs = MIG_VCPU_MSRS + 1;
	ck_assert_int_eq(mig_vcpu_state_check(st, "v", err, sizeof(err)), -EPROTO);
	ck_assert_msg(strstr(err, "v.nr_msrs: 257"), "%s", err);
	st->nr_msrs = 2;
	ck_assert_int_eq(mig_vcpu_state_check(st, "v", err, sizeof(err)), -EPROTO);
	ck_assert_msg(strstr(err, "not zero past the list"), "%s", err);
	st->parts |= 1u << 7;
	ck_assert_int_eq(mig_vcpu_state_check(st, "v", err, sizeof(err)), -EPROTO);
	ck_assert_msg(strstr(err, "v.parts: 0x"), "%s", err);
	vm_free(&a);
	free(st);
}
END_TEST

/* The VM's irqchip, PIT and clock, set on one VM, saved, loaded into another, compared. */
START_TEST(vm_state_moves)
{
	struct mig_vm_state st, back;
	struct kvm_irqchip chip = { .chip_id = KVM_IRQCHIP_IOAPIC };
	struct kvm_pit_state2 pit;
	struct kvm_clock_data clock = { .clock = 5000000000ull };
	struct vm a, b;
	char err[256];
	int k;

	vm_make(&a);
	vm_make(&b);
	ck_assert_int_eq(ioctl(a.vm, KVM_GET_IRQCHIP, &chip), 0);
	chip.chip.ioapic.redirtbl[4].bits = 0x10000 | 0x24; /* masked, vector 0x24 */
	chip.chip.ioapic.redirtbl[9].bits = 0x31;
	ck_assert_int_eq(ioctl(a.vm, KVM_SET_IRQCHIP, &chip), 0);
	for (k = 0; k < 2; k++) {
		chip = (struct kvm_irqchip){ .chip_id = (uint32_t)k };
		ck_assert_int_eq(ioctl(a.vm, KVM_GET_IRQCHIP, &chip), 0);
		chip.chip.pic.imr = k ? 0x5a : 0xa5;
		chip.chip.pic.irq_base = k ? 0x28 : 0x20;
		ck_assert_int_eq(ioctl(a.vm, KVM_SET_IRQCHIP, &chip), 0);
	}
	ck_assert_int_eq(ioctl(a.vm, KVM_GET_PIT2, &pit), 0);
	pit.channels[0].count = 11932;
	pit.channels[0].mode = 2;
	ck_assert_int_eq(ioctl(a.vm, KVM_SET_PIT2, &pit), 0);
	ck_assert_int_eq(ioctl(a.vm, KVM_SET_CLOCK, &clock), 0);
	ck_assert_int_eq(mig_vm_save_kvm(a.vm, &st), 0);
	ck_assert_msg(mig_vm_state_check(&st, "saved", err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(st.parts == MIG_VMS_ALL, "parts saved: 0x%x, all: 0x%x", st.parts, MIG_VMS_ALL);
	ck_assert_int_eq(mig_vm_load_kvm(b.vm, &st), 0);
	ck_assert_int_eq(mig_vm_save_kvm(b.vm, &back), 0);
	ck_assert_msg(back.ioapic.chip.ioapic.redirtbl[4].bits == (0x10000 | 0x24) &&
			      back.ioapic.chip.ioapic.redirtbl[9].bits == 0x31,
		      "IOAPIC: entries 4 and 9 0x%llx 0x%llx after the load",
		      (unsigned long long)back.ioapic.chip.ioapic.redirtbl[4].bits,
		      (unsigned long long)back.ioapic.chip.ioapic.redirtbl[9].bits);
	ck_assert_msg(back.pic[0].chip.pic.imr == 0xa5 && back.pic[1].chip.pic.imr == 0x5a &&
			      back.pic[1].chip.pic.irq_base == 0x28,
		      "PIC: masks 0x%x 0x%x, slave base 0x%x after the load", back.pic[0].chip.pic.imr,
		      back.pic[1].chip.pic.imr, back.pic[1].chip.pic.irq_base);
	ck_assert_msg(back.pit.channels[0].count == 11932 && back.pit.channels[0].mode == 2,
		      "PIT: channel 0 count %u mode %u after the load", back.pit.channels[0].count,
		      back.pit.channels[0].mode);
	ck_assert_msg(back.clock.clock >= st.clock.clock && st.clock.clock >= clock.clock,
		      "clock: %llu set, %llu saved, %llu after the load", (unsigned long long)clock.clock,
		      (unsigned long long)st.clock.clock, (unsigned long long)back.clock.clock);
	vm_free(&a);
	vm_free(&b);
}
END_TEST

int main(void)
{
	int skip = require_kvm("test-guest-state");
	Suite *s;
	TCase *tc;

	if (skip)
		return skip;
	s = suite_create("guest-state");
	tc = tcase_create("guest-state");
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, whole_state_moves);
	tcase_add_test(tc, refused_by_name);
	tcase_add_test(tc, vm_state_moves);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
