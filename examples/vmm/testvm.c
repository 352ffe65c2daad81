// SPDX-License-Identifier: MIT
/*
 * A tiny VMM for the test guest.  The guest starts directly in 64-bit mode:
 * KVM_SET_SREGS loads paging, long mode and the segments, so no real-mode
 * boot code exists.  The workload runs at CPL 3 with IOPL 3: on this host
 * ring-0 guest code goes through KVM's instruction emulator and is
 * thousands of times slower, while ring 3 runs natively and can still use
 * port I/O to talk to us.
 */
#define _GNU_SOURCE /* gettid() */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <linux/kvm.h>

#include "../common/kvm-host.h"
#include "testvm.h"

extern const uint8_t guest_image[], guest_image_end[];

#define SEL_KERNEL_CS 0x08
#define SEL_KERNEL_DS 0x10
#define SEL_USER_CS (0x18 | 3)
#define SEL_USER_DS (0x20 | 3)
#define SEL_TSS 0x28

#define PTE_P (1ull << 0)
#define PTE_RW (1ull << 1)
#define PTE_US (1ull << 2)
#define PTE_PS (1ull << 7)

#define CR0_PE (1ull << 0)
#define CR0_MP (1ull << 1)
#define CR0_ET (1ull << 4)
#define CR0_NE (1ull << 5)
#define CR0_WP (1ull << 16)
#define CR0_PG (1ull << 31)
#define CR4_PAE (1ull << 5)
#define EFER_LME (1ull << 8)
#define EFER_LMA (1ull << 10)
#define RFLAGS_FIXED (1ull << 1)
#define RFLAGS_IOPL3 (3ull << 12)

static int sys_ioctl(int fd, unsigned long req, void *arg)
{
	int ret = ioctl(fd, req, arg);

	return ret < 0 ? -errno : ret;
}

void *testvm_map(uint64_t size)
{
	/* over-allocate and trim so the memory is 2 MiB aligned */
	const uint64_t align = 2ull << 20;
	uint8_t *p, *a;

	p = mmap(NULL, size + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
		 -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	a = (uint8_t *)(((uintptr_t)p + align - 1) & ~(uintptr_t)(align - 1));
	if (a > p)
		munmap(p, a - p);
	if (p + align > a)
		munmap(a + size, (p + align) - a);
	/* a forked child (a migration destination, say) needs none of it */
	madvise(a, size, MADV_DONTFORK);
	return a;
}

void testvm_unmap(void *hva, uint64_t size)
{
	if (hva)
		munmap(hva, size);
}

struct guest_vcpu *testvm_mailbox(struct testvm *tv, unsigned int i)
{
	return (struct guest_vcpu *)(tv->sys + tv->mailbox_gpa) + i;
}

static uint64_t seg_desc(uint64_t access, uint64_t flags)
{
	/* base 0, limit 0xfffff with 4 KiB granularity */
	return 0xffffull | (access << 40) | (0xfull << 48) | (flags << 52);
}

static void build_system(struct testvm *tv)
{
	uint64_t *gdt = (uint64_t *)(tv->sys + GUEST_GDT_GPA);
	uint64_t *pml4 = (uint64_t *)(tv->sys + GUEST_PML4_GPA);
	uint64_t *pdpt = (uint64_t *)(tv->sys + GUEST_PDPT_GPA);
	uint64_t *pd = (uint64_t *)(tv->sys + GUEST_PD_GPA);
	uint64_t i, tss = GUEST_TSS_GPA;

	gdt[0] = 0;
	gdt[1] = seg_desc(0x9b, 0xa); /* kernel code: present, DPL 0, L */
	gdt[2] = seg_desc(0x93, 0xc); /* kernel data: present, DPL 0, D/B */
	gdt[3] = seg_desc(0xfb, 0xa); /* user code: DPL 3 */
	gdt[4] = seg_desc(0xf3, 0xc); /* user data: DPL 3 */
	/* 64-bit TSS, 16 bytes; only for completeness: nothing switches stacks */
	gdt[5] = 0x67 | ((tss & 0xffffff) << 16) | (0x89ull << 40) | ((tss >> 24 & 0xff) << 56);
	gdt[6] = tss >> 32;
	/* SYSRET's pair (GUEST_STAR_USER): user data, then user code, as SYSRET takes them */
	gdt[7] = seg_desc(0xf3, 0xc);
	gdt[8] = seg_desc(0xfb, 0xa);

	/* identity map with 2 MiB pages (1 GiB pages triple-fault on this host) */
	pml4[0] = GUEST_PDPT_GPA | PTE_P | PTE_RW | PTE_US;
	for (i = 0; i < GUEST_PD_COUNT; i++)
		pdpt[i] = (GUEST_PD_GPA + i * GUEST_PAGE_SIZE) | PTE_P | PTE_RW | PTE_US;
	for (i = 0; i < GUEST_PD_COUNT * 512; i++)
		pd[i] = (i << 21) | PTE_P | PTE_RW | PTE_US | PTE_PS;

	memcpy(tv->sys + GUEST_CODE_GPA, guest_image, (size_t)(guest_image_end - guest_image));
}

static void set_seg(struct kvm_segment *s, uint16_t sel, uint8_t type, bool code, uint8_t dpl)
{
	memset(s, 0, sizeof(*s));
	s->base = 0;
	s->limit = 0xffffffff;
	s->selector = sel;
	s->type = type;
	s->present = 1;
	s->dpl = dpl;
	s->s = 1;
	s->g = 1;
	s->l = code;
	s->db = !code;
}

static int setup_vcpu(struct testvm *tv, unsigned int i, struct kvm_cpuid2 *cpuid)
{
	bool ring0 = i < 64 ? (tv->ring0_vcpus >> i) & 1 : tv->ring0_all;
	uint8_t dpl = ring0 ? 0 : 3;
	struct kvm_sregs sregs;
	struct kvm_regs regs;
	int ret, fd;

	ret = kvmdirty_vcpu_create(tv->vm, i, &tv->vcpu[i]);
	if (ret < 0)
		return ret;
	fd = kvmdirty_vcpu_fd(tv->vcpu[i]);
	ret = sys_ioctl(fd, KVM_SET_CPUID2, cpuid);
	if (ret < 0)
		return ret;

	ret = sys_ioctl(fd, KVM_GET_SREGS, &sregs);
	if (ret < 0)
		return ret;
	sregs.cr0 = CR0_PE | CR0_MP | CR0_ET | CR0_NE | CR0_WP | CR0_PG;
	sregs.cr4 = CR4_PAE;
	sregs.cr3 = GUEST_PML4_GPA;
	sregs.efer = EFER_LME | EFER_LMA;
	set_seg(&sregs.cs, dpl ? SEL_USER_CS : SEL_KERNEL_CS, 0xb, true, dpl);
	set_seg(&sregs.ss, dpl ? SEL_USER_DS : SEL_KERNEL_DS, 0x3, false, dpl);
	sregs.ds = sregs.es = sregs.fs = sregs.gs = sregs.ss;
	memset(&sregs.tr, 0, sizeof(sregs.tr));
	sregs.tr.base = GUEST_TSS_GPA;
	sregs.tr.limit = 0x67;
	sregs.tr.selector = SEL_TSS;
	sregs.tr.type = 0xb; /* busy 64-bit TSS */
	sregs.tr.present = 1;
	memset(&sregs.ldt, 0, sizeof(sregs.ldt));
	sregs.ldt.unusable = 1;
	sregs.gdt.base = GUEST_GDT_GPA;
	sregs.gdt.limit = 9 * 8 - 1;
	sregs.idt.base = 0;
	sregs.idt.limit = 0; /* no IDT: an exception becomes a triple fault */
	ret = sys_ioctl(fd, KVM_SET_SREGS, &sregs);
	if (ret < 0)
		return ret;

	memset(&regs, 0, sizeof(regs));
	regs.rip = GUEST_CODE_GPA;
	regs.rsp = tv->sys_size - i * GUEST_STACK_SIZE;
	regs.rdi = tv->mailbox_gpa + i * sizeof(struct guest_vcpu);
	regs.rflags = RFLAGS_FIXED | (ring0 ? 0 : RFLAGS_IOPL3);
	ret = sys_ioctl(fd, KVM_SET_REGS, &regs);
	if (ret < 0)
		return ret;

	if (tv->irqchip && i > 0) {
		/* an in-kernel LAPIC starts an AP waiting for INIT and SIPI: this one runs at once */
		struct kvm_mp_state mp = { .mp_state = KVM_MP_STATE_RUNNABLE };

		ret = sys_ioctl(fd, KVM_SET_MP_STATE, &mp);
		if (ret < 0)
			return ret;
	}
	if (!tv->tsc_khz) {
		ret = sys_ioctl(fd, KVM_GET_TSC_KHZ, NULL);
		if (ret > 0)
			tv->tsc_khz = (uint64_t)ret;
	}
	return 0;
}

int testvm_set_ring0(struct testvm *tv, unsigned int i, bool ring0)
{
	struct kvm_sregs sregs;
	struct kvm_regs regs;
	int fd, ret;

	if (i >= tv->nr_vcpus)
		return -EINVAL;
	fd = kvmdirty_vcpu_fd(tv->vcpu[i]);
	ret = sys_ioctl(fd, KVM_GET_SREGS, &sregs);
	if (ret < 0)
		return ret;
	set_seg(&sregs.cs, ring0 ? SEL_KERNEL_CS : SEL_USER_CS, 0xb, true, ring0 ? 0 : 3);
	set_seg(&sregs.ss, ring0 ? SEL_KERNEL_DS : SEL_USER_DS, 0x3, false, ring0 ? 0 : 3);
	sregs.ds = sregs.es = sregs.fs = sregs.gs = sregs.ss;
	ret = sys_ioctl(fd, KVM_SET_SREGS, &sregs);
	if (ret < 0)
		return ret;
	ret = sys_ioctl(fd, KVM_GET_REGS, &regs);
	if (ret < 0)
		return ret;
	regs.rflags = (regs.rflags & ~RFLAGS_IOPL3) | (ring0 ? 0 : RFLAGS_IOPL3);
	ret = sys_ioctl(fd, KVM_SET_REGS, &regs);
	if (ret < 0)
		return ret;
	if (i < 64)
		tv->ring0_vcpus = ring0 ? tv->ring0_vcpus | (1ull << i) : tv->ring0_vcpus & ~(1ull << i);
	return 0;
}

int testvm_new(const struct testvm_opts *opts, struct testvm **ret_tv)
{
	struct kvm_cpuid2 *cpuid = NULL;
	struct testvm *tv;
	unsigned int i;
	int ret;

	if (!opts->nr_vcpus || opts->nr_vcpus > GUEST_MAX_VCPUS)
		return -EINVAL;
	if ((uint64_t)(guest_image_end - guest_image) > GUEST_CODE_MAX)
		return -E2BIG;
	tv = calloc(1, sizeof(*tv));
	if (!tv)
		return -ENOMEM;
	tv->ring0_vcpus = opts->ring0 ? ~0ull : opts->ring0_vcpus;
	tv->ring0_all = opts->ring0;
	tv->sys_size = guest_sys_size(opts->nr_vcpus);
	tv->mailbox_gpa = guest_mailbox_gpa(opts->nr_vcpus);
	pthread_mutex_init(&tv->lock, NULL);
	pthread_cond_init(&tv->cond, NULL);
	pthread_cond_init(&tv->park_cond, NULL);
	{
		pthread_condattr_t ca;

		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&tv->sit_cond, &ca);
		pthread_condattr_destroy(&ca);
	}
	for (i = 0; i < GUEST_MAX_VCPUS; i++)
		tv->share[i] = tv->timer_share[i] = 1000;

	ret = kvmdirty_vm_new(&tv->vm);
	if (ret < 0)
		goto err;
	tv->irqchip = opts->irqchip;
	if (opts->irqchip) {
		struct kvm_pit_config pit = { 0 };

		ret = sys_ioctl(kvmdirty_vm_fd(tv->vm), KVM_CREATE_IRQCHIP, NULL);
		if (ret == 0)
			ret = sys_ioctl(kvmdirty_vm_fd(tv->vm), KVM_CREATE_PIT2, &pit);
		if (ret < 0)
			goto err;
	}
	if (opts->track) {
		ret = kvmdirty_tracker_new(tv->vm, &opts->track_opts, &tv->tracker);
		if (ret < 0)
			goto err;
	}
	tv->sys = testvm_map(tv->sys_size);
	if (!tv->sys) {
		ret = -ENOMEM;
		goto err;
	}
	build_system(tv);
	ret = kvmdirty_region_add(tv->vm, 0, tv->sys_size, tv->sys, 0, &tv->sys_region);
	if (ret < 0)
		goto err;
	cpuid = kvm_host_supported_cpuid(kvmdirty_vm_kvm_fd(tv->vm), &ret);
	if (!cpuid)
		goto err;
	for (i = 0; i < opts->nr_vcpus; i++) {
		ret = setup_vcpu(tv, i, cpuid);
		tv->nr_vcpus = i + 1;
		if (ret < 0)
			goto err;
	}
	free(cpuid);
	*ret_tv = tv;
	return 0;
err:
	free(cpuid);
	testvm_free(tv);
	return ret;
}

/* Under tv->lock, or where no other thread can look (testvm_free). */
static void drop_timer(struct testvm *tv, unsigned int i)
{
	if (tv->timer_owner[i])
		timer_delete(tv->timer[i]);
	__atomic_store_n(&tv->timer_owner[i], 0, __ATOMIC_RELAXED);
	__atomic_store_n(&tv->timer_armed[i], false, __ATOMIC_RELAXED);
	tv->timer_share[i] = 1000;
	tv->slice_end[i] = 0;
}

void testvm_free(struct testvm *tv)
{
	unsigned int i;

	if (!tv)
		return;
	if (tv->nr_threads) {
		testvm_halt_all(tv);
		testvm_join(tv, NULL, NULL);
	}
	for (i = 0; i < GUEST_MAX_VCPUS; i++)
		drop_timer(tv, i);
	/* frees the tracker and the vCPUs too */
	kvmdirty_vm_free(tv->vm);
	testvm_unmap(tv->sys, tv->sys_size);
	pthread_mutex_destroy(&tv->lock);
	pthread_cond_destroy(&tv->cond);
	pthread_cond_destroy(&tv->park_cond);
	pthread_cond_destroy(&tv->sit_cond);
	free(tv);
}

int testvm_add_memory(struct testvm *tv, uint64_t gpa, uint64_t size, uint32_t flags,
		      void **ret_hva, struct kvmdirty_region **ret_region)
{
	void *hva;
	int ret;

	if (gpa < tv->sys_size || gpa + size > GUEST_MAP_TOP || gpa + size < gpa)
		return -ERANGE;
	hva = testvm_map(size);
	if (!hva)
		return -ENOMEM;
	ret = kvmdirty_region_add(tv->vm, gpa, size, hva, flags, ret_region);
	if (ret < 0) {
		testvm_unmap(hva, size);
		return ret;
	}
	if (ret_hva)
		*ret_hva = hva;
	return 0;
}

#define CR4_OSFXSR (1ull << 9)
#define CR4_OSXMMEXCPT (1ull << 10)
#define CR4_OSXSAVE (1ull << 18)
#define RFLAGS_IF (1ull << 9)
#define MSR_PAT 0x277u
#define MSR_KVM_SYSTEM_TIME_NEW 0x4b564d01u
#define STATE_PAT 0x0007010600070106ull /* WB, WC, UC-, UC: not the reset value, so a lost PAT shows */
#define APIC_SPIV 0xf0
#define APIC_LVTT 0x320
#define APIC_TMICT 0x380
#define APIC_TDCR 0x3e0

static void lapic_set(struct kvm_lapic_state *l, unsigned int reg, uint32_t v)
{
	memcpy(&l->regs[reg], &v, sizeof(v));
}

/* An interrupt gate to GUEST_CODE_GPA + off, CPL 0. */
static void idt_gate(uint64_t *idt, unsigned int vector, uint64_t off)
{
	uint64_t a = GUEST_CODE_GPA + off;

	idt[vector * 2] = (a & 0xffff) | ((uint64_t)SEL_KERNEL_CS << 16) | (0x8eull << 40) | ((a >> 16 & 0xffff) << 48);
	idt[vector * 2 + 1] = a >> 32;
}

static int state_vcpu(struct testvm *tv, unsigned int i, uint64_t period_us)
{
	struct {
		struct kvm_msrs h;
		struct kvm_msr_entry e[2];
	} msrs = { .h.nmsrs = 2 };
	struct guest_vcpu *v = testvm_mailbox(tv, i);
	uint64_t tss = GUEST_STATE_TSS_GPA + i * (uint64_t)GUEST_STATE_TSS_SIZE;
	struct kvm_lapic_state lapic;
	struct kvm_sregs sregs;
	struct kvm_regs regs;
	struct kvm_xcrs xcrs;
	int fd = kvmdirty_vcpu_fd(tv->vcpu[i]), ret;
	unsigned int k;

	v->st_pat = STATE_PAT;
	v->st_pvclock_gpa = GUEST_PVCLOCK_GPA + i * 64ull;
	v->st_kvmclock = v->st_pvclock_gpa | 1;
	for (k = 0; k < 4; k++)
		v->st_ymm[k] = 0x5eed000000000000ull | (uint64_t)i << 8 | k;
	/*
	 * The TSS: RSP0, and an I/O bitmap that lets CPL 3 use ports 0-255
	 * (zero bits, then the 0xff that ends a map), whatever IOPL says.
	 */
	memset(tv->sys + tss, 0, GUEST_STATE_TSS_SIZE);
	memcpy(tv->sys + tss + 4, &(uint64_t){ GUEST_KSTACK_TOP - (uint64_t)i * (1u << GUEST_KSTACK_SHIFT) }, 8);
	memcpy(tv->sys + tss + 102, &(uint16_t){ 104 }, 2);
	tv->sys[tss + 104 + 32] = 0xff;

	ret = sys_ioctl(fd, KVM_GET_SREGS, &sregs);
	if (ret < 0)
		return ret;
	sregs.cr4 |= CR4_OSFXSR | CR4_OSXMMEXCPT | CR4_OSXSAVE;
	sregs.idt.base = GUEST_IDT_GPA;
	sregs.idt.limit = 256 * 16 - 1;
	sregs.tr.base = tss;
	sregs.tr.limit = 104 + 32; /* the bitmap's last byte, the 0xff */
	ret = sys_ioctl(fd, KVM_SET_SREGS, &sregs);
	if (ret < 0)
		return ret;
	memset(&xcrs, 0, sizeof(xcrs));
	xcrs.nr_xcrs = 1;
	xcrs.xcrs[0].xcr = 0;
	xcrs.xcrs[0].value = 7; /* x87, SSE, AVX */
	ret = sys_ioctl(fd, KVM_SET_XCRS, &xcrs);
	if (ret < 0)
		return ret;
	msrs.e[0] = (struct kvm_msr_entry){ .index = MSR_PAT, .data = STATE_PAT };
	msrs.e[1] = (struct kvm_msr_entry){ .index = MSR_KVM_SYSTEM_TIME_NEW, .data = v->st_kvmclock };
	ret = sys_ioctl(fd, KVM_SET_MSRS, &msrs);
	if (ret >= 0 && ret != 2)
		return -EOPNOTSUPP; /* KVM took the MSRs before msrs.e[ret] only */
	if (ret < 0)
		return ret;
	ret = sys_ioctl(fd, KVM_GET_LAPIC, &lapic);
	if (ret < 0)
		return ret;
	lapic_set(&lapic, APIC_SPIV, 0x100 | GUEST_SPURIOUS_VECTOR);
	lapic_set(&lapic, APIC_TDCR, 0xb);			      /* divide by 1 */
	lapic_set(&lapic, APIC_LVTT, GUEST_TIMER_VECTOR | 1u << 17); /* periodic */
	/* KVM's APIC bus runs at 1 GHz: a count of a ns */
	lapic_set(&lapic, APIC_TMICT, (uint32_t)(period_us * 1000));
	ret = sys_ioctl(fd, KVM_SET_LAPIC, &lapic);
	if (ret < 0)
		return ret;
	ret = sys_ioctl(fd, KVM_GET_REGS, &regs);
	if (ret < 0)
		return ret;
	regs.rflags |= RFLAGS_IF;
	ret = sys_ioctl(fd, KVM_SET_REGS, &regs);
	if (ret < 0)
		return ret;
	v->flags |= GUEST_F_STATE;
	return 0;
}

int testvm_state_setup(struct testvm *tv, uint64_t period_us)
{
	uint64_t *idt = (uint64_t *)(tv->sys + GUEST_IDT_GPA);
	unsigned int i;
	int ret;

	if (!tv->irqchip || tv->nr_vcpus > GUEST_LOW_VCPUS || tv->ring0_vcpus || tv->ring0_all || !period_us ||
	    period_us > 4000000)
		return -EOPNOTSUPP;
	memset(idt, 0, 256 * 16);
	idt_gate(idt, GUEST_TIMER_VECTOR, GUEST_TIMER_OFF);
	idt_gate(idt, GUEST_SPURIOUS_VECTOR, GUEST_SPURIOUS_OFF);
	for (i = 0; i < tv->nr_vcpus; i++) {
		ret = state_vcpu(tv, i, period_us);
		if (ret < 0)
			return ret;
	}
	return 0;
}

#define MSR_STAR 0xc0000081u
#define MSR_LSTAR 0xc0000082u
#define MSR_SFMASK 0xc0000084u
#define MSR_TSC_AUX 0xc0000103u
#define EFER_SCE (1ull << 0)

static int syscall_vcpu(struct testvm *tv, unsigned int i)
{
	struct {
		struct kvm_msrs h;
		struct kvm_msr_entry e[4];
	} msrs = { .h.nmsrs = 4 };
	struct guest_vcpu *v = testvm_mailbox(tv, i);
	int fd = kvmdirty_vcpu_fd(tv->vcpu[i]), ret;
	struct kvm_sregs sregs;

	ret = sys_ioctl(fd, KVM_GET_SREGS, &sregs);
	if (ret < 0)
		return ret;
	sregs.efer |= EFER_SCE;
	ret = sys_ioctl(fd, KVM_SET_SREGS, &sregs);
	if (ret < 0)
		return ret;
	v->st_aux = 0x7a000000u | i;
	msrs.e[0] = (struct kvm_msr_entry){ .index = MSR_STAR,
					    .data = (uint64_t)GUEST_STAR_USER << 48 | (uint64_t)GUEST_STAR_KERNEL << 32 };
	msrs.e[1] = (struct kvm_msr_entry){ .index = MSR_LSTAR, .data = GUEST_CODE_GPA + GUEST_SYSCALL_OFF };
	msrs.e[2] = (struct kvm_msr_entry){ .index = MSR_SFMASK, .data = 0x700 }; /* TF, IF, DF: no interrupt on the user's stack */
	msrs.e[3] = (struct kvm_msr_entry){ .index = MSR_TSC_AUX, .data = v->st_aux };
	ret = sys_ioctl(fd, KVM_SET_MSRS, &msrs);
	if (ret >= 0 && ret != 4)
		return -EOPNOTSUPP;
	if (ret < 0)
		return ret;
	v->flags |= GUEST_F_SYSCALL;
	return 0;
}

bool testvm_pvm_host(void)
{
	return access("/sys/module/kvm_pvm", F_OK) == 0;
}

int testvm_syscall_setup(struct testvm *tv)
{
	unsigned int i;
	int ret;

	if (testvm_pvm_host() || !(testvm_mailbox(tv, 0)->flags & GUEST_F_STATE))
		return -EOPNOTSUPP;
	for (i = 0; i < tv->nr_vcpus; i++) {
		ret = syscall_vcpu(tv, i);
		if (ret < 0)
			return ret;
	}
	return 0;
}

uint64_t testvm_tsc_per_page(const struct testvm *tv, uint64_t pages_per_sec)
{
	if (!pages_per_sec || !tv->tsc_khz)
		return 0;
	return tv->tsc_khz * 1000 / pages_per_sec;
}

static uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#define THROTTLE_PERIOD_NS 10000000ull

/*
 * The run share, by the thread that runs vCPU i: a timer aimed at that
 * thread (SIGEV_THREAD_ID) ends each slice in KVM_RUN, and the rest of
 * the period the vCPU stays out.  A thread of testvm_spawn() makes its
 * timer as it starts (another thread, at its first share), so that
 * testvm_set_run_share() can fire it: a new share reaches a vCPU that
 * never exits, and a signal lost just before KVM_RUN is made up by the
 * next firing, a period later.  The timer and its owner change under
 * tv->lock.
 */
static void arm_timer(struct testvm *tv, unsigned int i, uint64_t at, uint64_t every)
{
	struct itimerspec its = { 0 };

	its.it_value.tv_sec = (time_t)(at / 1000000000ull);
	its.it_value.tv_nsec = (long)(at % 1000000000ull);
	its.it_interval.tv_nsec = (long)every;
	timer_settime(tv->timer[i], TIMER_ABSTIME, &its, NULL);
	__atomic_store_n(&tv->timer_armed[i], at != 0, __ATOMIC_RELAXED);
}

/*
 * This thread's number, unique for the life of the process: thread ids
 * (and pthread_t values) are reused after a thread ends, and a timer
 * aimed at an ended thread must not pass for a later thread's.
 */
static uint64_t thread_serial(void)
{
	static uint64_t next;
	static __thread uint64_t mine;

	if (!mine)
		mine = __atomic_add_fetch(&next, 1, __ATOMIC_RELAXED);
	return mine;
}

/* vCPU i's timer aimed at this thread, made if it is not; false if it cannot be made. */
static bool own_timer(struct testvm *tv, unsigned int i)
{
	struct sigevent sev = { .sigev_notify = SIGEV_THREAD_ID, .sigev_signo = SIGUSR1 };
	uint64_t me = thread_serial();
	bool ok = true;

	if (__atomic_load_n(&tv->timer_owner[i], __ATOMIC_RELAXED) == me)
		return true;
	pthread_mutex_lock(&tv->lock);
	drop_timer(tv, i);
	sev._sigev_un._tid = gettid();
	if (timer_create(CLOCK_MONOTONIC, &sev, &tv->timer[i]))
		ok = false;
	else
		__atomic_store_n(&tv->timer_owner[i], me, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&tv->lock);
	return ok;
}

/*
 * Before each KVM_RUN, on the thread that runs vCPU i: under a run share,
 * a slice of share/1000 of the period in KVM_RUN, ended by its timer,
 * then the rest of the period out, ended at once by a pause (the wait is
 * on tv->sit_cond, which testvm_pause_all() wakes under tv->lock).  A
 * signal of another kind within the slice goes back in.
 */
static void sit_out(struct testvm *tv, unsigned int i)
{
	unsigned int share = __atomic_load_n(&tv->share[i], __ATOMIC_RELAXED);
	uint64_t now, t0, end;

	if (share >= 1000) {
		/* armed by this thread's last share, or fired by testvm_set_run_share() for one it never took */
		if (__atomic_load_n(&tv->timer_armed[i], __ATOMIC_RELAXED)) {
			pthread_mutex_lock(&tv->lock);
			if (tv->timer_owner[i] == thread_serial() && share >= 1000 &&
			    __atomic_load_n(&tv->share[i], __ATOMIC_RELAXED) >= 1000)
				arm_timer(tv, i, 0, 0);
			pthread_mutex_unlock(&tv->lock);
		}
		tv->timer_share[i] = 1000;
		tv->slice_end[i] = 0;
		return;
	}
	if (!own_timer(tv, i))
		return;
	now = mono_ns();
	if (share == tv->timer_share[i] && tv->slice_end[i] && now < tv->slice_end[i])
		return; /* within its slice */
	pthread_mutex_lock(&tv->lock);
	if (tv->slice_end[i] && now >= tv->slice_end[i]) {
		struct timespec ts;

		t0 = now;
		end = now + (1000 - share) * THROTTLE_PERIOD_NS / 1000;
		ts.tv_sec = (time_t)(end / 1000000000ull);
		ts.tv_nsec = (long)(end % 1000000000ull);
		while (now < end && !__atomic_load_n(&tv->pause_req, __ATOMIC_ACQUIRE)) {
			pthread_cond_timedwait(&tv->sit_cond, &tv->lock, &ts);
			now = mono_ns();
		}
		__atomic_add_fetch(&tv->out_ns[i], now - t0, __ATOMIC_RELAXED);
	}
	tv->slice_end[i] = now + share * THROTTLE_PERIOD_NS / 1000 + 1;
	tv->timer_share[i] = share;
	/* then every period: a signal lost just before KVM_RUN is made up */
	arm_timer(tv, i, tv->slice_end[i], THROTTLE_PERIOD_NS);
	pthread_mutex_unlock(&tv->lock);
}

int testvm_run(struct testvm *tv, unsigned int i, struct testvm_exit *ret)
{
	struct kvm_run *run;
	int r;

	if (i >= tv->nr_vcpus)
		return -EINVAL;
	run = kvmdirty_vcpu_kvm_run(tv->vcpu[i]);
	do {
		sit_out(tv, i);
		r = kvmdirty_vcpu_run(tv->vcpu[i]);
	} while (r == -EINTR && !__atomic_load_n(&tv->pause_req, __ATOMIC_ACQUIRE));
	if (r < 0)
		return r;

	memset(ret, 0, sizeof(*ret));
	ret->exit_reason = run->exit_reason;
	switch (run->exit_reason) {
	case KVM_EXIT_IO:
		if (run->io.direction == KVM_EXIT_IO_OUT && run->io.size == 4) {
			memcpy(&ret->value, (uint8_t *)run + run->io.data_offset, 4);
			switch (run->io.port) {
			case GUEST_PORT_PASS:
				ret->event = TESTVM_PASS;
				return 0;
			case GUEST_PORT_DONE:
				ret->event = TESTVM_DONE;
				return 0;
			case GUEST_PORT_ERROR:
				ret->event = TESTVM_ERROR;
				return 0;
			case GUEST_PORT_TICK:
				ret->event = TESTVM_TICK;
				return 0;
			case GUEST_PORT_IDLE:
				ret->event = TESTVM_IDLE;
				return 0;
			}
		}
		ret->event = TESTVM_OTHER;
		return 0;
	case KVM_EXIT_MMIO:
		ret->event = TESTVM_MMIO;
		ret->mmio_gpa = run->mmio.phys_addr;
		return 0;
	case KVM_EXIT_SHUTDOWN:
		ret->event = TESTVM_SHUTDOWN;
		return 0;
	default:
		ret->event = TESTVM_OTHER;
		return 0;
	}
}

struct testvm_run_arg {
	struct testvm *tv;
	unsigned int i;
	int ret;
	struct testvm_exit exit;
};

static void park(struct testvm *tv)
{
	pthread_mutex_lock(&tv->lock);
	if (++tv->parked >= tv->alive)
		pthread_cond_broadcast(&tv->park_cond);
	while (tv->pause_req)
		pthread_cond_wait(&tv->cond, &tv->lock);
	tv->parked--;
	pthread_mutex_unlock(&tv->lock);
}

/*
 * The guest's HLT: vCPU i has nothing to do until its mailbox says stop.
 * Its thread sleeps instead of going back into KVM_RUN at once, until a
 * pause, a halt, a stop or IDLE_NS, whichever comes first (the wake-ups
 * of 1,024 idle vCPUs cost about 10,000 exits a second).
 */
#define IDLE_NS 100000000ull

static void idle(struct testvm *tv, unsigned int i)
{
	uint64_t now = mono_ns(), end = now + IDLE_NS;
	struct timespec ts = { (time_t)(end / 1000000000ull), (long)(end % 1000000000ull) };

	pthread_mutex_lock(&tv->lock);
	while (now < end && !__atomic_load_n(&tv->pause_req, __ATOMIC_ACQUIRE) &&
	       !__atomic_load_n(&tv->halt_req, __ATOMIC_ACQUIRE) && !testvm_mailbox(tv, i)->stop) {
		pthread_cond_timedwait(&tv->sit_cond, &tv->lock, &ts);
		now = mono_ns();
	}
	pthread_mutex_unlock(&tv->lock);
}

static void *run_thread(void *p)
{
	struct testvm_run_arg *a = p;

	__atomic_store_n(&a->tv->thread_tid[a->i], gettid(), __ATOMIC_RELAXED);
	/* before its first look at the share: testvm_set_run_share() fires this timer from then on */
	own_timer(a->tv, a->i);

	for (;;) {
		if (__atomic_load_n(&a->tv->pause_req, __ATOMIC_ACQUIRE))
			park(a->tv);
		if (__atomic_load_n(&a->tv->halt_req, __ATOMIC_ACQUIRE)) {
			a->ret = 0;
			break;
		}
		a->ret = testvm_run(a->tv, a->i, &a->exit);
		if (a->ret == -EINTR)
			continue; /* paused */
		if (a->ret < 0)
			break;
		if (a->exit.event == TESTVM_IDLE)
			idle(a->tv, a->i);
		if (a->exit.event == TESTVM_PASS || a->exit.event == TESTVM_TICK || a->exit.event == TESTVM_IDLE)
			continue;
		if (a->exit.event != TESTVM_DONE)
			a->ret = -EIO;
		break;
	}
	pthread_mutex_lock(&a->tv->lock);
	/* the timer signals this thread, which is about to end */
	if (a->tv->timer_owner[a->i] == thread_serial())
		drop_timer(a->tv, a->i);
	a->tv->alive--;
	pthread_cond_broadcast(&a->tv->park_cond);
	pthread_mutex_unlock(&a->tv->lock);
	return NULL;
}

static void on_kick(int sig)
{
	(void)sig;
}

void testvm_pause_all(struct testvm *tv)
{
	unsigned int i;

	pthread_mutex_lock(&tv->lock);
	__atomic_store_n(&tv->pause_req, true, __ATOMIC_RELEASE);
	/* a vCPU sitting out its run share comes out at once */
	pthread_cond_broadcast(&tv->sit_cond);
	/* immediate_exit covers a vCPU about to enter KVM_RUN, the signal one inside */
	for (i = 0; i < tv->nr_vcpus; i++)
		__atomic_store_n(&kvmdirty_vcpu_kvm_run(tv->vcpu[i])->immediate_exit, 1, __ATOMIC_RELAXED);
	for (i = 0; i < tv->nr_threads; i++)
		pthread_kill(tv->threads[i], SIGUSR1);
	while (tv->parked < tv->alive)
		pthread_cond_wait(&tv->park_cond, &tv->lock);
	pthread_mutex_unlock(&tv->lock);
}

void testvm_halt_all(struct testvm *tv)
{
	__atomic_store_n(&tv->halt_req, true, __ATOMIC_RELEASE);
	testvm_pause_all(tv);
}

void testvm_resume_all(struct testvm *tv)
{
	unsigned int i;

	pthread_mutex_lock(&tv->lock);
	for (i = 0; i < tv->nr_vcpus; i++)
		__atomic_store_n(&kvmdirty_vcpu_kvm_run(tv->vcpu[i])->immediate_exit, 0, __ATOMIC_RELAXED);
	__atomic_store_n(&tv->pause_req, false, __ATOMIC_RELEASE);
	pthread_cond_broadcast(&tv->cond);
	pthread_mutex_unlock(&tv->lock);
}

int testvm_set_run_share(struct testvm *tv, unsigned int i, unsigned int permille)
{
	if (i >= tv->nr_vcpus || permille > 1000)
		return -EINVAL;
	if (__atomic_exchange_n(&tv->share[i], permille, __ATOMIC_RELAXED) == permille)
		return 0;
	/*
	 * A vCPU that never exits would not see it: fire its thread's timer
	 * now and every period until the thread, at its next turn, sets the
	 * timer to the new share (a firing that lands just before KVM_RUN
	 * is lost, the next one is not).
	 */
	pthread_mutex_lock(&tv->lock);
	if (tv->timer_owner[i])
		arm_timer(tv, i, mono_ns() + 1000, THROTTLE_PERIOD_NS);
	else if (i < tv->nr_threads)
		pthread_kill(tv->threads[i], SIGUSR1);
	pthread_mutex_unlock(&tv->lock);
	return 0;
}

uint64_t testvm_out_ns(const struct testvm *tv, unsigned int i)
{
	return i < tv->nr_vcpus ? __atomic_load_n(&tv->out_ns[i], __ATOMIC_RELAXED) : 0;
}

int testvm_spawn(struct testvm *tv)
{
	struct sigaction sa = { .sa_handler = on_kick };
	unsigned int i;

	if (tv->nr_threads)
		return -EBUSY;
	/* no SA_RESTART: the signal must end KVM_RUN with EINTR */
	sigaction(SIGUSR1, &sa, NULL);
	tv->args = calloc(tv->nr_vcpus, sizeof(*tv->args));
	if (!tv->args)
		return -ENOMEM;
	/* under the lock: a pause from another thread (a lazy restore's) sees every thread or none */
	pthread_mutex_lock(&tv->lock);
	tv->alive = tv->nr_vcpus;
	for (i = 0; i < tv->nr_vcpus; i++) {
		tv->args[i] = (struct testvm_run_arg){ .tv = tv, .i = i };
		if (pthread_create(&tv->threads[i], NULL, run_thread, &tv->args[i])) {
			tv->alive = i;
			pthread_mutex_unlock(&tv->lock);
			testvm_stop_all(tv);
			testvm_join(tv, NULL, NULL);
			return -EAGAIN;
		}
		tv->nr_threads++;
	}
	pthread_mutex_unlock(&tv->lock);
	return 0;
}

void testvm_stop_all(struct testvm *tv)
{
	unsigned int i;

	for (i = 0; i < tv->nr_vcpus; i++)
		testvm_mailbox(tv, i)->stop = 1;
	/* idle vCPUs see it at once */
	pthread_mutex_lock(&tv->lock);
	pthread_cond_broadcast(&tv->sit_cond);
	pthread_mutex_unlock(&tv->lock);
}

int testvm_join(struct testvm *tv, unsigned int *ret_bad_vcpu, struct testvm_exit *ret_exit)
{
	unsigned int i, n = tv->nr_threads;
	int ret = 0;

	testvm_resume_all(tv); /* parked threads must see the stop */
	for (i = 0; i < n; i++)
		pthread_join(tv->threads[i], NULL);
	for (i = 0; i < n && !ret; i++) {
		if (tv->args[i].ret < 0) {
			ret = tv->args[i].ret;
			if (ret_bad_vcpu)
				*ret_bad_vcpu = i;
			if (ret_exit)
				*ret_exit = tv->args[i].exit;
		}
	}
	tv->nr_threads = 0;
	__atomic_store_n(&tv->halt_req, false, __ATOMIC_RELEASE);
	free(tv->args);
	tv->args = NULL;
	return ret;
}

int testvm_run_all(struct testvm *tv, unsigned int *ret_bad_vcpu, struct testvm_exit *ret_exit)
{
	int ret = testvm_spawn(tv);

	return ret < 0 ? ret : testvm_join(tv, ret_bad_vcpu, ret_exit);
}

const char *testvm_event_name(enum testvm_event e)
{
	static const char *const names[] = {
		[TESTVM_PASS] = "pass", [TESTVM_DONE] = "done", [TESTVM_ERROR] = "self-check error",
		[TESTVM_TICK] = "tick", [TESTVM_IDLE] = "idle", [TESTVM_MMIO] = "mmio", [TESTVM_SHUTDOWN] = "shutdown",
		[TESTVM_OTHER] = "other exit",
	};

	return (unsigned int)e < sizeof(names) / sizeof(names[0]) ? names[e] : "?";
}
