/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_HOOKS_H
#define KVMDIRTY_HOOKS_H

/*
 * Test-build hooks.  The shipped library is compiled without
 * KD_TEST_HOOKS and every hook below is then nothing at all.  The test
 * build compiles lib/ a second time with -DKD_TEST_HOOKS and links
 * tests/hooks.c, which defines kd_test_hooks: tests use it to inject ioctl
 * failures, to hold a thread at a named point while another one runs (a
 * forced interleaving), and to reorder the real CLEAR path.
 */
#ifdef KD_TEST_HOOKS
#include <stdbool.h>

enum kd_hook_point {
	/* vCPU thread, KVM_EXIT_DIRTY_RING_FULL seen, nothing taken yet; obj: the vCPU */
	KD_HOOK_RING_FULL,
	/* a harvester holds entries it took (marked RESET), before their reset; obj: the ring */
	KD_HOOK_RING_HARVESTED,
	/* a harvest read an entry and has not marked it yet; obj: the ring */
	KD_HOOK_RING_TAKEN,
	/* ring recovery marked ghost entries RESET, before its reset; obj: the ring */
	KD_HOOK_RING_GHOSTS,
	/* a batch's reset stopped short of fetch in this ring, before it is collected alone; obj: the ring */
	KD_HOOK_RING_BATCH_SHORT,
	/* sync took the rings' pages and is about to fetch the regions'; obj: the tracker */
	KD_HOOK_SYNC_FETCH,
	/* a vCPU over its dirty limit is about to stay out of KVM_RUN; obj: the vCPU */
	KD_HOOK_HOLD,
	/* a harvester found the vCPU in kvmdirty_vcpu_run() and is about to signal it; obj: the vCPU */
	KD_HOOK_KICK,
	/* a kicker counted its kick (kick_seq, kick_sigs) and has not signalled yet; obj: the vCPU */
	KD_HOOK_KICK_SEND,
	/* a vCPU thread waited out the kickers after a kick's EINTR, before taking the signal; obj: the vCPU */
	KD_HOOK_EAT_KICK,
	/* ... took the signals, and is about to forget those kicks no longer use; obj: the vCPU */
	KD_HOOK_KICK_FORGET,
	/* next() (or a count) is about to clear one chunk in KVM; obj: the tracker */
	KD_HOOK_PROTECT,
	/* sync fetched every region and is about to fan the pages out to the consumers; obj: the tracker */
	KD_HOOK_FAN_OUT,
	/* a mark set its pages and async_any, and has not set the region's touched bit yet; obj: the tracker */
	KD_HOOK_MARK_TOUCH,
	/* start made a region's state and has not taken the regions lock yet; obj: the region */
	KD_HOOK_START_INSTALL,
	/* KVM_RUN returned -1 on the vCPU's thread (a signal handler may run here); obj: the vCPU */
	KD_HOOK_RUN_FAILED,
	/* a move made move_seq odd and has not edited the gpa index yet; obj: the region */
	KD_HOOK_MOVE_EDIT,
};

/* Returned by the ioctl hook to let the real ioctl run. */
#define KD_HOOK_PASS (-4096)

struct kd_test_hooks {
	/* called before every library ioctl except KVM_RUN: -errno, a result, or KD_HOOK_PASS */
	int (*ioctl)(int fd, unsigned long req, void *arg);
	void (*point)(enum kd_hook_point p, void *obj);
	/* next(): issue each chunk's CLEAR at the next sync, after the caller read its pages */
	bool clear_late;
};

extern struct kd_test_hooks kd_test_hooks;

#define KD_HOOK_POINT(p, obj)                                                                   \
	do {                                                                                    \
		void (*__fn)(enum kd_hook_point, void *) =                                      \
			__atomic_load_n(&kd_test_hooks.point, __ATOMIC_ACQUIRE);                \
		if (__fn)                                                                       \
			__fn((p), (obj));                                                       \
	} while (0)
#define KD_HOOK_CLEAR_LATE() __atomic_load_n(&kd_test_hooks.clear_late, __ATOMIC_ACQUIRE)

/* For tests: the library's threads may read the hooks at any time. */
static inline void kd_test_hooks_set(int (*ioctl_fn)(int, unsigned long, void *),
				     void (*point_fn)(enum kd_hook_point, void *), bool clear_late)
{
	__atomic_store_n(&kd_test_hooks.ioctl, ioctl_fn, __ATOMIC_RELEASE);
	__atomic_store_n(&kd_test_hooks.point, point_fn, __ATOMIC_RELEASE);
	__atomic_store_n(&kd_test_hooks.clear_late, clear_late, __ATOMIC_RELEASE);
}
#else
#define KD_HOOK_POINT(p, obj) ((void)0)
#define KD_HOOK_CLEAR_LATE() false
#endif

#endif
