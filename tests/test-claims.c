// SPDX-License-Identifier: MIT
/*
 * kvmdirty_consumer_free() gives up the consumer's claims and may turn
 * logging off, while other threads use the tracker.
 *
 * The header (kvmdirty.h, "Threading") lets consumer calls run
 * "concurrently with everything else", changes included, and the man
 * page says consumers may be used "concurrently with marks, vCPUs and
 * region changes"; kvmdirty_consumer_free() may run while other
 * consumers sync and hand out.  The free decides "this is the last
 * claim", switches logging off and drops the region under one hold of
 * the regions lock for writing; when it dropped the lock between those
 * steps, a change that landed between the decision and the drop was
 * undone silently: "dirty-log: logging off while the tracker's user
 * claims the region (its start returned 0)".
 *
 * The window has no hook of the library's, so this program interposes
 * pthread_rwlock_wrlock() (as test-throttle-race interposes libc calls):
 * armed, it runs a callback just before the Nth write lock taken by the
 * armed thread; each case runs the start before the free's first write
 * lock, its second, and so on, until the free takes no more.  Not under ThreadSanitizer
 * (whose own interceptor the interposer would hide): those cases skip.
 *
 * - free_races_tracker_start: consumer A alone claims region R; while A
 *   is freed, the tracker's user calls kvmdirty_tracker_start(R), which
 *   returns 0.  The user's claim must hold: logging on, R tracked, one
 *   guest pass handed out whole.
 * - free_races_remove_add_start: the same window, with the VMM removing
 *   R, adding a new region R2 (same slot id) and starting it.
 * - free_races_region_add (threads, for ThreadSanitizer): consumer_free()
 *   on one thread, region add/remove on another, unforced: the free's
 *   walk of the regions (kd_track_stop(.., NULL): kd_region_next(), no
 *   lock, once) read what the change writes under the lock.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <linux/kvm.h>

#include "kvm-uapi.h"

#include "hooks.h"
#include "rig.h"
#include "track-modes.h"

#define R_GPA (4 * GIB)
#define R_SIZE (1ull << 20)

/* ---- pthread_rwlock_wrlock, interposed ---- */

#ifndef __SANITIZE_THREAD__
static int (*real_wrlock)(pthread_rwlock_t *);
static __thread int armed_left; /* write locks to let through before the callback; 0: disarmed */
static __thread void (*armed_fn)(void *);
static __thread void *armed_arg;

int pthread_rwlock_wrlock(pthread_rwlock_t *l)
{
	if (!real_wrlock)
		*(void **)&real_wrlock = dlsym(RTLD_NEXT, "pthread_rwlock_wrlock");
	if (armed_left && --armed_left == 0) {
		void (*fn)(void *) = armed_fn;

		armed_fn = NULL;
		fn(armed_arg);
	}
	return real_wrlock(l);
}

static void arm(int nth, void (*fn)(void *), void *arg)
{
	armed_fn = fn;
	armed_arg = arg;
	armed_left = nth;
}
#endif

struct lockstep {
	struct testvm *tv;
	struct kvmdirty_region *r;
	void *mem;
	uint64_t pages;
};

static void lockstep_new(struct lockstep *l, enum kvmdirty_mode mode)
{
	struct testvm_opts o = { .nr_vcpus = 1, .track = true, .track_opts = { .mode = mode } };

	hooks_off();
	ck_assert_ok(testvm_new(&o, &l->tv));
	ck_assert_ok(testvm_add_memory(l->tv, R_GPA, R_SIZE, 0, &l->mem, &l->r));
	l->pages = R_SIZE / PAGE;
	rig_work(l->tv, 0, R_GPA, l->pages, GUEST_SEQUENTIAL, GUEST_F_EXIT_EVERY_PASS | GUEST_F_CHECK);
}

#ifndef __SANITIZE_THREAD__
static uint64_t take_all(struct kvmdirty_consumer *c)
{
	struct kvmdirty_range rg[64];
	uint64_t got = 0;
	int n, i;

	while ((n = kvmdirty_consumer_next(c, rg, 64, UINT64_MAX)) > 0)
		for (i = 0; i < n; i++)
			got += rg[i].npages;
	return got;
}

struct race {
	struct lockstep *l;
	int start_ret, remove_ret, add_ret, done;
	bool logging_in_window, spawned;
	void *mem2;
	struct kvmdirty_region *r2;
	bool remove_add;
	pthread_t th;
};

/* What the other thread does: the tracker's user starts R (or removes R, adds R2 at its slot and starts it). */
static void *other_thread(void *p)
{
	struct race *rc = p;

	if (rc->remove_add) {
		rc->remove_ret = kvmdirty_region_remove(rc->l->tv->vm, rc->l->r);
		rc->add_ret = testvm_add_memory(rc->l->tv, R_GPA, R_SIZE, 0, &rc->mem2, &rc->r2);
		rc->start_ret = kvmdirty_tracker_start(rc->l->tv->tracker, rc->r2);
	} else {
		rc->start_ret = kvmdirty_tracker_start(rc->l->tv->tracker, rc->l->r);
	}
	__atomic_store_n(&rc->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

/*
 * Before the free's nth write lock: the other thread runs, and the free
 * goes on once it finished or 200 ms passed (it waits for a lock the free
 * holds: it then runs after the free, as a real thread would).
 */
static void in_window(void *p)
{
	struct race *rc = p;
	int i;

	/*
	 * No call that takes a lock of the library's here: this runs on the
	 * free's thread, which may hold the regions lock for writing (a read
	 * lock taken then is refused, and its unlock would release the
	 * free's).  The flags are read without one.
	 */
	rc->logging_in_window = kvmdirty_region_flags(rc->l->r) & KVMDIRTY_REGION_LOG_DIRTY;
	rc->spawned = pthread_create(&rc->th, NULL, other_thread, rc) == 0;
	for (i = 0; rc->spawned && i < 200 && !__atomic_load_n(&rc->done, __ATOMIC_ACQUIRE); i++)
		rig_pause_us(1000);
}
#endif

#ifndef __SANITIZE_THREAD__
/* The start before the free's nth write lock; false once the free takes fewer. */
static bool free_race_at(enum kvmdirty_mode mode, bool remove_add, int nth)
{
	struct kvmdirty_consumer *a, *d;
	struct kvmdirty_consumer_info in;
	struct kvmdirty_region *r, *rr;
	struct lockstep l;
	struct race rc = { .l = &l, .start_ret = 1, .remove_add = remove_add };
	uint64_t got;
	uint32_t slot;
	bool logging;

	lockstep_new(&l, mode);
	r = l.r;
	slot = kvmdirty_region_slot(r);
	d = kvmdirty_tracker_consumer(l.tv->tracker);
	ck_assert_ok(kvmdirty_consumer_new(l.tv->tracker, 0, &a));
	ck_assert_ok(kvmdirty_consumer_start(a, r)); /* A is R's only claimant */
	ck_assert(kvmdirty_region_flags(r) & KVMDIRTY_REGION_LOG_DIRTY);
	/*
	 * kvmdirty_consumer_free(A): the callback runs just before the nth
	 * write lock (of any rwlock) the free takes.  When the free decided
	 * "the last claim" under one hold and switched logging off under
	 * another, one of these landed between the two.
	 */
	(void)rr;
	arm(nth, in_window, &rc);
	kvmdirty_consumer_free(a);
	arm(0, NULL, NULL);
	if (rc.spawned)
		pthread_join(rc.th, NULL);
	if (!rc.spawned) {
		/* the free took fewer write locks: every place before one was tried */
		testvm_free(l.tv);
		testvm_unmap(l.mem, R_SIZE);
		return false;
	}
	if (remove_add) {
		ck_assert_ok(rc.remove_ret);
		ck_assert_ok(rc.add_ret);
		ck_assert_msg(kvmdirty_region_slot(rc.r2) == slot, "R2 got slot %u, not %u", kvmdirty_region_slot(rc.r2),
			      slot);
		r = rc.r2;
	}
	printf("%s%s, before the free's write lock %d: R had logging %s; kvmdirty_tracker_start() returned %d\n",
	       mode_name(mode), remove_add ? " (R removed, R2 added at its slot)" : "", nth,
	       rc.logging_in_window ? "on" : "off", rc.start_ret);
	fflush(stdout);
	ck_assert_ok(rc.start_ret);
	/* what the tracker's user was told: R is tracked for it */
	logging = kvmdirty_region_flags(r) & KVMDIRTY_REGION_LOG_DIRTY;
	ck_assert_ok(kvmdirty_consumer_info(d, &in, sizeof(in)));
	/* everything pending from the start, taken; then one guest pass must reach the user whole */
	kvmdirty_tracker_sync(l.tv->tracker);
	take_all(d);
	rig_run_pass(l.tv, 0);
	ck_assert_int_ge(kvmdirty_tracker_sync(l.tv->tracker), 0);
	got = take_all(d);
	printf("  after the free: logging %s, tracked pages %" PRIu64 "; a guest pass over %" PRIu64
	       " pages, handed to the tracker's user: %" PRIu64 "\n",
	       logging ? "on" : "off", in.tracked_pages, l.pages, got);
	fflush(stdout);
	ck_assert_msg(logging, "%s: logging off while the tracker's user claims the region (its start returned 0)",
		      mode_name(mode));
	ck_assert_msg(in.tracked_pages == l.pages, "%s: region untracked while the tracker's user claims it",
		      mode_name(mode));
	ck_assert_msg(got >= l.pages, "%s: a guest pass wrote %" PRIu64 " pages, %" PRIu64 " handed out", mode_name(mode),
		      l.pages, got);
	testvm_free(l.tv);
	testvm_unmap(l.mem, R_SIZE);
	if (rc.mem2)
		testvm_unmap(rc.mem2, R_SIZE);
	return true;
}

#endif

/* The start (or a remove, an add and a start) before each write lock the free takes, in turn. */
static void free_race(enum kvmdirty_mode mode, bool remove_add)
{
#ifdef __SANITIZE_THREAD__
	(void)mode;
	(void)remove_add;
	printf("skipped under ThreadSanitizer (pthread_rwlock_wrlock interposed)\n");
#else
	int nth;

	for (nth = 1; nth < 64 && free_race_at(mode, remove_add, nth); nth++)
		;
	ck_assert_int_gt(nth, 1);
#endif
}

START_TEST(free_races_tracker_start)
{
	free_race(modes[_i], false);
}
END_TEST

START_TEST(free_races_remove_add_start)
{
	free_race(modes[_i], true);
}
END_TEST

/* ---- unforced: the free's walk of the regions against a region change on another thread ---- */

static struct {
	struct testvm *tv;
	int stop;
	uint64_t rounds;
	pthread_mutex_t mu; /* held for each change: consumer_start (a change too) waits for it */
} ch = { .mu = PTHREAD_MUTEX_INITIALIZER };

static void *changer(void *p)
{
	(void)p;
	while (!__atomic_load_n(&ch.stop, __ATOMIC_ACQUIRE)) {
		struct kvmdirty_region *r;
		void *m;

		/* changes, allowed concurrently with consumer calls (not with another change) */
		pthread_mutex_lock(&ch.mu);
		if (testvm_add_memory(ch.tv, 16 * GIB, 64 * PAGE, 0, &m, &r) == 0) {
			kvmdirty_region_remove(ch.tv->vm, r);
			testvm_unmap(m, 64 * PAGE);
		}
		pthread_mutex_unlock(&ch.mu);
		__atomic_add_fetch(&ch.rounds, 1, __ATOMIC_RELEASE);
	}
	return NULL;
}

START_TEST(free_races_region_add)
{
	struct lockstep l;
	pthread_t th;
	unsigned int i;

	lockstep_new(&l, KVMDIRTY_MODE_CLEAR_LOG);
	ch.tv = l.tv;
	ch.stop = 0;
	ch.rounds = 0;
	ck_assert_int_eq(pthread_create(&th, NULL, changer, NULL), 0);
	for (i = 0; i < 200; i++) {
		struct kvmdirty_consumer *c;

		ck_assert_ok(kvmdirty_consumer_new(l.tv->tracker, 0, &c));
		pthread_mutex_lock(&ch.mu); /* consumer_start is a change: never with another */
		ck_assert_ok(kvmdirty_consumer_start(c, l.r));
		pthread_mutex_unlock(&ch.mu);
		kvmdirty_consumer_free(c); /* a consumer call: concurrently with the changes */
	}
	__atomic_store_n(&ch.stop, 1, __ATOMIC_RELEASE);
	pthread_join(th, NULL);
	printf("200 consumer frees against %" PRIu64 " region add/remove rounds on another thread\n", ch.rounds);
	testvm_free(l.tv);
	testvm_unmap(l.mem, R_SIZE);
}
END_TEST

/*
 * (Pre-existing in start_one(), kept by 507b70a.)  With the ring, a region
 * the VMM added with logging on is switched off and on by start; if KVM
 * refuses the "on", start returns the error and leaves the region with
 * logging off: the VMM's own setting changed by a failed call (invariant 5).
 */
static int memslot_calls, memslot_fail_at;

static int fail_nth_memslot(int fd, unsigned long req, void *arg)
{
	(void)fd;
	(void)arg;
	if (req == KVM_SET_USER_MEMORY_REGION || req == KVM_SET_USER_MEMORY_REGION2)
		if (++memslot_calls == memslot_fail_at)
			return -EIO;
	return KD_HOOK_PASS;
}

START_TEST(failed_start_turns_vmm_logging_off)
{
	struct testvm_opts o = { .nr_vcpus = 1, .track = true, .track_opts = { .mode = KVMDIRTY_MODE_DIRTY_RING } };
	struct kvmdirty_region *r;
	struct testvm *tv;
	void *mem;
	int ret;

	hooks_off();
	ck_assert_ok(testvm_new(&o, &tv));
	ck_assert_ok(testvm_add_memory(tv, R_GPA, R_SIZE, KVMDIRTY_REGION_LOG_DIRTY, &mem, &r));
	ck_assert(kvmdirty_region_flags(r) & KVMDIRTY_REGION_LOG_DIRTY);
	memslot_calls = 0;
	memslot_fail_at = 2; /* the off goes through, the on is refused */
	kd_test_hooks_set(fail_nth_memslot, NULL, false);
	ret = kvmdirty_tracker_start(tv->tracker, r);
	hooks_off();
	printf("dirty-ring, region added with logging on: kvmdirty_tracker_start() = %d (%s); logging now %s\n", ret,
	       strerror(-ret), kvmdirty_region_flags(r) & KVMDIRTY_REGION_LOG_DIRTY ? "on" : "off");
	fflush(stdout);
	ck_assert_int_lt(ret, 0);
	ck_assert_msg(kvmdirty_region_flags(r) & KVMDIRTY_REGION_LOG_DIRTY,
		      "a failed kvmdirty_tracker_start() left the VMM's region with logging off");
	testvm_free(tv);
	testvm_unmap(mem, R_SIZE);
}
END_TEST

int main(void)
{
	int skip = require_kvm("test-claims");
	Suite *s;
	TCase *tc;

	if (skip)
		return skip;
	s = suite_create("claims");
	tc = tcase_create("claims");
	tcase_set_timeout(tc, 300);
	tcase_add_loop_test(tc, free_races_tracker_start, 0, MODES);
	tcase_add_loop_test(tc, free_races_remove_add_start, 0, MODES);
	tcase_add_test(tc, free_races_region_add);
	tcase_add_test(tc, failed_start_turns_vmm_logging_off);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
