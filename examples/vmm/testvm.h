/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_TESTVM_H
#define KVMDIRTY_TESTVM_H

/*
 * A tiny x86-64 VMM on libkvmdirty that runs the test guest
 * (examples/guest).  Used by the example VMM, the tests and the
 * benchmarks.  Guest memory: the 2 MiB system region at gpa 0 (page
 * tables, GDT, mailboxes, code, stacks) plus data regions the caller adds
 * anywhere in [2 MiB, 128 GiB).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kvmdirty.h>

#include "../guest/guest-abi.h"

#include <pthread.h>
#include <sys/types.h>
#include <time.h>

struct testvm_run_arg;

struct testvm {
	struct kvmdirty_vm *vm;
	struct kvmdirty_tracker *tracker; /* when asked for */
	uint8_t *sys; /* host view of the system region */
	uint64_t sys_size, mailbox_gpa; /* guest_sys_size(), guest_mailbox_gpa() of nr_vcpus */
	struct kvmdirty_region *sys_region;
	unsigned int nr_vcpus;
	uint64_t ring0_vcpus; /* bit i: vCPU i runs its workload at CPL 0 (the first 64) */
	bool ring0_all;	      /* ... all of them (opts.ring0) */
	bool irqchip;	      /* opts.irqchip */
	uint64_t tsc_khz;
	struct kvmdirty_vcpu *vcpu[GUEST_MAX_VCPUS];
	/* testvm_spawn() threads */
	pthread_t threads[GUEST_MAX_VCPUS];
	struct testvm_run_arg *args;
	unsigned int nr_threads;
	/*
	 * testvm_pause_all(): threads still running, and how many are parked;
	 * parked threads wait on cond for the resume, the pauser on park_cond
	 * for the last of them (one wake a pause, not one a vCPU for each
	 * vCPU: with 1,024 vCPUs that was half a million wake-ups).
	 */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	pthread_cond_t park_cond;
	/* CLOCK_MONOTONIC: a vCPU sitting out its run share, or idle (TESTVM_IDLE), waits here */
	pthread_cond_t sit_cond;
	bool pause_req, halt_req;
	unsigned int alive, parked;
	/*
	 * testvm_set_run_share(): per vCPU, permille of each period in
	 * KVM_RUN; the timer that signals its thread at each period's start
	 * (made by the thread that runs the vCPU, for it), and time kept out.
	 */
	unsigned int share[GUEST_MAX_VCPUS];
	timer_t timer[GUEST_MAX_VCPUS];
	uint64_t timer_owner[GUEST_MAX_VCPUS]; /* the owning thread's serial (testvm.c); 0: no timer */
	bool timer_armed[GUEST_MAX_VCPUS];     /* it fires (else it is stopped) */
	pid_t thread_tid[GUEST_MAX_VCPUS];     /* testvm_spawn()'s thread for the vCPU, once it runs */
	unsigned int timer_share[GUEST_MAX_VCPUS];
	uint64_t slice_end[GUEST_MAX_VCPUS]; /* CLOCK_MONOTONIC ns the vCPU's slice in KVM_RUN ends */
	uint64_t out_ns[GUEST_MAX_VCPUS];
};

struct testvm_opts {
	unsigned int nr_vcpus; /* 1 .. GUEST_MAX_VCPUS */
	bool ring0;	       /* run the workload at CPL 0 (KVM's emulator here) */
	uint64_t ring0_vcpus;  /* the same for the vCPUs of these bits only */
	/* create a tracker (before the vCPUs, as the dirty ring needs) */
	bool track;
	struct kvmdirty_tracker_opts track_opts;
	/* an in-kernel irqchip (LAPICs, IOAPIC, PICs) and PIT, made before the vCPUs */
	bool irqchip;
};

enum testvm_event {
	TESTVM_PASS,	 /* the guest finished a pass (GUEST_F_EXIT_EVERY_PASS) */
	TESTVM_DONE,	 /* the workload finished */
	TESTVM_ERROR,	 /* the guest's self-check failed: see the mailbox */
	TESTVM_TICK,	 /* GUEST_EXIT_LOOP */
	TESTVM_IDLE,	 /* GUEST_IDLE: the guest has nothing to do (testvm_spawn()'s threads sleep) */
	TESTVM_MMIO,	 /* the guest touched a gpa with no region */
	TESTVM_SHUTDOWN, /* triple fault */
	TESTVM_OTHER,	 /* any other exit; see run->exit_reason */
};

struct testvm_exit {
	enum testvm_event event;
	uint32_t value;	      /* port value (pass number for PASS/DONE) */
	uint64_t mmio_gpa;    /* TESTVM_MMIO */
	uint32_t exit_reason; /* KVM's */
};

/* Create the VM, its system region, its vCPUs; returns 0 or -errno. */
int testvm_new(const struct testvm_opts *opts, struct testvm **ret_tv);
void testvm_free(struct testvm *tv);

/* The mailbox of vCPU i (set the workload before its first run). */
struct guest_vcpu *testvm_mailbox(struct testvm *tv, unsigned int i);

/*
 * mmap size bytes (2 MiB aligned so the host can back guest huge pages),
 * add them as a region at gpa; ret_hva gets the memory, which
 * testvm_free() does not unmap: use testvm_unmap().
 */
int testvm_add_memory(struct testvm *tv, uint64_t gpa, uint64_t size, uint32_t flags,
		      void **ret_hva, struct kvmdirty_region **ret_region);
void *testvm_map(uint64_t size);
void testvm_unmap(void *hva, uint64_t size);

/*
 * Move vCPU i's workload to CPL 0 or back to CPL 3, between two runs (it
 * is stopped at an exit): the same code goes on at the other privilege
 * level.  Returns 0 or -errno.
 */
int testvm_set_ring0(struct testvm *tv, unsigned int i, bool ring0);

/*
 * The state guest (GUEST_F_STATE, guest-abi.h), before any vCPU ran: on
 * every vCPU, set up what it checks each pass (PAT, XCR0 with
 * AVX and ymm15's value, kvmclock's MSR, an IDT, a TSS of its own,
 * interrupts on and the LAPIC timer ticking every period_us) and set the
 * flag in its mailbox.  The VM needs its irqchip (opts.irqchip), at most
 * GUEST_LOW_VCPUS vCPUs, all at CPL 3.  0, or -EOPNOTSUPP (no irqchip, too
 * many vCPUs, an MSR KVM did not take) or -errno of an ioctl.  Only a source does this: a destination gets all of it from the
 * stream or the snapshot, or its guest fails its checks.
 */
int testvm_state_setup(struct testvm *tv, uint64_t period_us);
/*
 * After testvm_state_setup(), before any vCPU ran: the system-call path
 * too (GUEST_F_SYSCALL): EFER.SCE, STAR, LSTAR at the guest's handler,
 * SFMASK, and TSC_AUX (0x7a000000 | the vCPU's index, which the handler
 * reads).  -EOPNOTSUPP on a PVM-based KVM (its switcher owns SYSCALL: the
 * guest's never reaches LSTAR there) or without the state guest.
 */
int testvm_syscall_setup(struct testvm *tv);
/* Whether this host's KVM is the PVM-based one (kvm_pvm loaded). */
bool testvm_pvm_host(void);

/* Pages/second to GUEST's tsc_per_page, from the vCPU's TSC frequency. */
uint64_t testvm_tsc_per_page(const struct testvm *tv, uint64_t pages_per_sec);

/*
 * Run vCPU i until it reports something (any port the guest uses, MMIO,
 * shutdown or another exit).  Returns 0 and fills *ret, or -errno of
 * KVM_RUN.
 */
int testvm_run(struct testvm *tv, unsigned int i, struct testvm_exit *ret);

/*
 * Run every vCPU on its own thread until it reports DONE (PASS and TICK
 * exits are resumed).  Returns 0 if all finished, -EIO if a vCPU reported
 * ERROR, MMIO, SHUTDOWN or another exit (its index in *ret_bad_vcpu and the
 * exit in *ret_exit when not NULL), or -errno.
 */
int testvm_run_all(struct testvm *tv, unsigned int *ret_bad_vcpu, struct testvm_exit *ret_exit);

/*
 * The same in two halves: start the threads, and later (after setting
 * the mailboxes' stop, or for a guest that ends by itself) wait for them.
 */
int testvm_spawn(struct testvm *tv);
int testvm_join(struct testvm *tv, unsigned int *ret_bad_vcpu, struct testvm_exit *ret_exit);
/* Ask every vCPU's workload to finish its pass and report done. */
void testvm_stop_all(struct testvm *tv);

/*
 * Take every spawned vCPU out of KVM_RUN (immediate_exit and a signal) and
 * park its thread; returns when all are parked.  Resume lets them go on
 * exactly where they were.  For stop-and-copy, and for a source that must
 * keep running after a failed migration.
 */
void testvm_pause_all(struct testvm *tv);
void testvm_resume_all(struct testvm *tv);
/*
 * Take every spawned vCPU out of KVM_RUN for good, the same way, whatever
 * the guest does; testvm_join() then collects the threads (a vCPU that had
 * not failed counts as done).
 */
void testvm_halt_all(struct testvm *tv);

/*
 * Keep vCPU i in KVM_RUN for only permille/1000 of each 10 ms period
 * (1000: no limit), as a VMM slows a vCPU whose dirty pages it cannot
 * attribute to a ring: the thread running the vCPU arms a timer
 * (SIGUSR1) to end its slice of permille/1000 of a period in KVM_RUN,
 * then sits out the rest of the period before it enters again.  The thread
 * needs SIGUSR1's handler (testvm_spawn() installs it).  Returns 0 or
 * -EINVAL (i or permille out of range).  testvm_out_ns(): how long vCPU
 * i was kept out so far.
 */
int testvm_set_run_share(struct testvm *tv, unsigned int i, unsigned int permille);
uint64_t testvm_out_ns(const struct testvm *tv, unsigned int i);

const char *testvm_event_name(enum testvm_event e);

#endif
