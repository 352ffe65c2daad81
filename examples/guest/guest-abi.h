/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_GUEST_ABI_H
#define KVMDIRTY_GUEST_ABI_H

/*
 * What the test guest and its host agree on: the guest-physical layout of
 * the 2 MiB system region at gpa 0, the per-vCPU mailbox, the I/O ports
 * and the tag every written page carries.  Included by the freestanding
 * guest (entry.S: the constants only) and by the host side
 * (examples/vmm/testvm.c).
 */
#ifndef __ASSEMBLER__
#include <stdint.h>
#endif

#define GUEST_PAGE_SIZE 4096ull
#define GUEST_SYS_SIZE 0x200000ull /* system region of up to GUEST_LOW_VCPUS vCPUs: gpa [0, 2 MiB) */
#define GUEST_GDT_GPA 0x1000ull
#define GUEST_TSS_GPA 0x2000ull
#define GUEST_MAILBOX_GPA 0x10000ull /* struct guest_vcpu[GUEST_LOW_VCPUS] */
#define GUEST_PML4_GPA 0x20000ull
#define GUEST_PDPT_GPA 0x21000ull
#define GUEST_PD_GPA 0x80000ull /* GUEST_PD_COUNT page directories */
#define GUEST_PD_COUNT 128ull	/* identity map of [0, 128 GiB) in 2 MiB pages */
#define GUEST_MAP_TOP (GUEST_PD_COUNT << 30)
#define GUEST_CODE_GPA 0x100000ull
#define GUEST_CODE_MAX 0x40000ull
#define GUEST_STACK_SIZE 0x2000ull /* stacks grow down from the top of the region */
#define GUEST_LOW_VCPUS 64	   /* vCPUs whose mailboxes and stacks fit the 2 MiB layout above */
#define GUEST_MAX_VCPUS 1024	   /* KVM's default KVM_MAX_VCPUS on x86 */
#define GUEST_HIGH_MAILBOX_GPA 0x200000ull /* more vCPUs: their mailboxes here, their stacks above */

/* Ports the guest writes (32-bit out) to report to the host. */
#define GUEST_PORT_PASS 0xe0  /* a pass finished (GUEST_F_EXIT_EVERY_PASS); value = pass */
#define GUEST_PORT_DONE 0xe1  /* the workload finished; value = last pass */
#define GUEST_PORT_ERROR 0xe2 /* the self-check failed; details in the mailbox */
#define GUEST_PORT_TICK 0xe3  /* GUEST_EXIT_LOOP: one exit per iteration */
#define GUEST_PORT_IDLE 0xe4  /* GUEST_IDLE: nothing to do until stop; the host may sleep, as on HLT */

/*
 * The state guest's system pieces (GUEST_F_STATE), in the 2 MiB layout's
 * free space.  Plain numbers: entry.S includes these.
 */
#define GUEST_IDT_GPA 0x3000	      /* 256 gates */
#define GUEST_STATE_TSS_GPA 0x4000    /* a TSS per vCPU, 256 bytes apart: its RSP0 and I/O bitmap */
#define GUEST_STATE_TSS_SIZE 256
#define GUEST_PVCLOCK_GPA 0x8000      /* kvmclock's page of each vCPU, 64 bytes apart */
#define GUEST_KSTACK_TOP 0x80000      /* CPL-0 stacks, 4 KiB a vCPU, down from here */
#define GUEST_KSTACK_SHIFT 12
#define GUEST_STATE_MAILBOX_GPA 0x10000 /* GUEST_MAILBOX_GPA */
#define GUEST_TIMER_OFF 0x80	      /* entry.S, from GUEST_CODE_GPA: the LAPIC timer's handler */
#define GUEST_SPURIOUS_OFF 0x100	      /* ... a spurious interrupt's */
#define GUEST_SYSCALL_OFF 0x140	      /* ... SYSCALL's (LSTAR) */
#define GUEST_TIMER_VECTOR 0x40
#define GUEST_SPURIOUS_VECTOR 0xff
#define GUEST_MAILBOX_TICKS_OFF 160 /* offsetof(struct guest_vcpu, st_ticks): entry.S counts there */
#define GUEST_MAILBOX_SEEN_OFF 184  /* offsetof(struct guest_vcpu, st_seen_pat): ... and reads MSRs to */
#define GUEST_MAILBOX_SYSCALLS_OFF 200 /* offsetof(struct guest_vcpu, st_syscalls): SYSCALL's handler counts there */
#define GUEST_MAILBOX_SEEN_AUX_OFF 208 /* offsetof(struct guest_vcpu, st_seen_aux): ... and reads TSC_AUX to */
/*
 * SYSCALL's selectors (GUEST_F_SYSCALL): STAR's kernel base (CS, SS = +8)
 * and SYSRET's user base (SS = +8, CS = +16: a user data and a user code
 * descriptor after the TSS's, in that order)
 */
#define GUEST_STAR_KERNEL 0x08
#define GUEST_STAR_USER 0x30

/* entry.S includes what is above */
#ifndef __ASSEMBLER__
enum guest_pattern {
	GUEST_SEQUENTIAL = 0, /* pages 0, 1, 2, ... */
	GUEST_RANDOM = 1,     /* uniformly random pages (xorshift64), pages writes a pass */
	GUEST_STRIDED = 2,    /* 0, s, 2s, ..., then 1, 1+s, ...: every page once a pass */
	GUEST_EXIT_LOOP = 3,  /* no writes: out to GUEST_PORT_TICK in a tight loop */
	GUEST_COMPUTE = 4,    /* no writes: pages units of arithmetic a pass, counted in writes */
	/*
	 * No writes but the mailbox's pass: an out to GUEST_PORT_IDLE a pass,
	 * the guest's HLT (a CPL-3 guest has none).  An idle vCPU that spun
	 * instead would take a host CPU from everything else: a guest of
	 * 1,024 such vCPUs on 2 host CPUs left its VMM's threads about a
	 * 500th of a CPU.
	 */
	GUEST_IDLE = 5,
};

/* xorshift rounds in one GUEST_COMPUTE unit (about a microsecond natively) */
#define GUEST_COMPUTE_ROUNDS 1024

#define GUEST_F_EXIT_EVERY_PASS (1u << 0) /* out to GUEST_PORT_PASS after each pass */
#define GUEST_F_CHECK (1u << 1) /* before writing a page, its tag must be its own (or zero), from no later pass */
#define GUEST_F_CHECK_EXACT (1u << 2) /* ... and from exactly the previous pass */
/*
 * Each pass, check the vCPU state a kernel relies on, which the host set
 * up before the first run (testvm_state_setup()) and which only a whole
 * migration or restore brings along: the LAPIC timer's interrupts,
 * through the IDT and the vCPU's own TSS to a CPL-0 handler that counts
 * them (the host checks that they keep coming) and reads PAT and
 * kvmclock's MSR for the workload to compare; AVX register ymm15 (XCR0,
 * XSAVE); kvmclock time that never goes back (the TSC, the pvclock page).
 * CPL 3 only, at most GUEST_LOW_VCPUS vCPUs; port I/O through the TSS's
 * I/O bitmap, as an interrupt's return loses IOPL on a PVM-based KVM.  A
 * failed check: GUEST_PORT_ERROR with err_gpa 0, err_tag[0] the check
 * (GUEST_STATE_*), err_tag[1] what was seen.
 */
#define GUEST_F_STATE (1u << 3)
/*
 * With GUEST_F_STATE, each pass: a SYSCALL (CPL 3 to LSTAR's handler at
 * CPL 0, STAR's selectors, SFMASK's flags, SYSRET back), whose handler
 * counts it and reads TSC_AUX (RDMSR) for the workload to compare with
 * st_aux.  A kernel's system-call path, and the MSRs it rests on, which
 * only a whole migration or restore brings along.  Not on a PVM-based
 * KVM, whose own switcher owns SYSCALL (testvm_syscall_setup() refuses).
 */
#define GUEST_F_SYSCALL (1u << 4)
/*
 * With tsc_per_page: a write that comes due more than one page late (the
 * vCPU's thread was not on a CPU) starts the pace again from now instead
 * of writing the pages it owes flat out.  A test that needs the vCPU
 * never faster than its rate, even for a moment, sets it.
 */
#define GUEST_F_PACE_STEADY (1u << 5)
enum guest_state_check {
	GUEST_STATE_PAT = 1,
	GUEST_STATE_KVMCLOCK_MSR,
	GUEST_STATE_YMM,
	GUEST_STATE_TIME_BACK,
	GUEST_STATE_SYSCALL, /* the call never reached LSTAR's handler (err_tag[1]: calls counted) */
	GUEST_STATE_TSC_AUX, /* TSC_AUX as the handler read it */
};

/*
 * One vCPU's mailbox, 256 bytes at GUEST_MAILBOX_GPA + 256 * index.  The
 * guest gets its address in rdi.
 */
struct guest_vcpu {
	/* set by the host before the vCPU first runs */
	uint64_t gpa;	       /* first byte of the working set (page aligned) */
	uint64_t pages;	       /* working-set size in pages */
	uint32_t pattern;      /* enum guest_pattern */
	uint32_t flags;	       /* GUEST_F_* */
	uint64_t stride;       /* GUEST_STRIDED step, pages */
	uint64_t until_pass;   /* stop after completing this pass; 0: run until stop */
	uint64_t tsc_per_page; /* pacing: TSC ticks between page writes; 0: flat out */
	uint64_t seed;	       /* GUEST_RANDOM */
	/* host -> guest, any time */
	volatile uint64_t stop; /* non-zero: finish this pass and report done */
	/* guest -> host */
	volatile uint64_t pass;	    /* last completed pass (the host may preset it) */
	volatile uint64_t writes;   /* pages written (exits made, units computed), all passes */
	volatile uint64_t err_gpa;  /* GUEST_PORT_ERROR: the page that failed the check */
	volatile uint64_t err_tag[2]; /* ... and the tag found there */
	/* GUEST_F_STATE: what the host set up, which the guest expects */
	uint64_t st_pat, st_kvmclock, st_pvclock_gpa;
	uint64_t st_ymm[4];
	/* ... and what the guest counts */
	volatile uint64_t st_ticks;    /* LAPIC timer interrupts (entry.S) */
	volatile uint64_t st_checks;   /* passes whose state checks held */
	volatile uint64_t st_last_ns;  /* kvmclock time at the last check */
	/* the timer's handler: the MSRs as it read them last */
	volatile uint64_t st_seen_pat, st_seen_kvmclock;
	/* GUEST_F_SYSCALL: SYSCALL's handler counts its calls and reads TSC_AUX; what TSC_AUX must be */
	volatile uint64_t st_syscalls, st_seen_aux;
	uint64_t st_aux;
	uint64_t reserved[4];
};

/*
 * The tag the guest writes at offset 0 of every page it touches: the
 * page's guest frame number and the pass that wrote it.  A host that finds
 * (gfn, pass) in a page knows which pass last wrote it.
 */
struct guest_tag {
	uint64_t gfn;
	uint64_t pass;
};

#ifndef __cplusplus
_Static_assert(sizeof(struct guest_vcpu) == 256, "mailbox layout");
_Static_assert(__builtin_offsetof(struct guest_vcpu, st_ticks) == GUEST_MAILBOX_TICKS_OFF, "entry.S's tick counter");
_Static_assert(__builtin_offsetof(struct guest_vcpu, st_seen_pat) == GUEST_MAILBOX_SEEN_OFF, "entry.S's MSRs");
_Static_assert(__builtin_offsetof(struct guest_vcpu, st_seen_kvmclock) == GUEST_MAILBOX_SEEN_OFF + 8, "entry.S's MSRs");
_Static_assert(GUEST_STATE_MAILBOX_GPA == GUEST_MAILBOX_GPA, "entry.S's mailboxes");
_Static_assert(__builtin_offsetof(struct guest_vcpu, st_syscalls) == GUEST_MAILBOX_SYSCALLS_OFF, "entry.S's SYSCALL count");
_Static_assert(__builtin_offsetof(struct guest_vcpu, st_seen_aux) == GUEST_MAILBOX_SEEN_AUX_OFF, "entry.S's TSC_AUX");
#endif

/*
 * The system region of a guest of nr_vcpus: 2 MiB up to GUEST_LOW_VCPUS;
 * beyond, the mailboxes from 2 MiB on and the stacks above them, in
 * whole 2 MiB pages.  Both ends of a migration agree on it by the vCPU
 * count.
 */
static inline uint64_t guest_sys_size(unsigned int nr_vcpus)
{
	uint64_t end = GUEST_HIGH_MAILBOX_GPA + (uint64_t)nr_vcpus * (sizeof(struct guest_vcpu) + GUEST_STACK_SIZE);

	return nr_vcpus <= GUEST_LOW_VCPUS ? GUEST_SYS_SIZE : (end + GUEST_SYS_SIZE - 1) & ~(GUEST_SYS_SIZE - 1);
}

static inline uint64_t guest_mailbox_gpa(unsigned int nr_vcpus)
{
	return nr_vcpus <= GUEST_LOW_VCPUS ? GUEST_MAILBOX_GPA : GUEST_HIGH_MAILBOX_GPA;
}

#endif /* __ASSEMBLER__ */

#endif
