/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_HOOKS_H
#define KVMDIRTY_MIGRATE_HOOKS_H

/*
 * The engine's test-build hooks, as lib/hooks.h is the tracking
 * library's.  Shipped code is compiled without MIG_TEST_HOOKS and every
 * hook is then nothing at all.  A test build of a layer compiles it again
 * with -DMIG_TEST_HOOKS and links tests/mig-hooks.c, which defines
 * mig_test_hook: a test holds a thread at a named point there while
 * another runs (a forced interleaving).
 */
#ifdef MIG_TEST_HOOKS
enum mig_hook_point {
	/*
	 * A slot of the gate: a session's first connection answered (its
	 * source may dial its joins now), the session not filed yet; obj:
	 * the gate
	 */
	MIG_HOOK_GATE_ANSWERED,
	/*
	 * The gate: a connection accepted and in the waiting room (or turned
	 * away, its fd closed), more of a burst maybe still to accept; obj:
	 * the fd as accepted (int *)
	 */
	MIG_HOOK_GATE_ENTERED,
};

extern void (*mig_test_hook)(enum mig_hook_point p, void *obj); /* __atomic */

#define MIG_HOOK_POINT(p, obj)                                                                       \
	do {                                                                                         \
		void (*__fn)(enum mig_hook_point, void *) = __atomic_load_n(&mig_test_hook, __ATOMIC_ACQUIRE); \
		if (__fn)                                                                            \
			__fn((p), (obj));                                                            \
	} while (0)
#else
#define MIG_HOOK_POINT(p, obj) ((void)0)
#endif

#endif
