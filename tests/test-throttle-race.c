// SPDX-License-Identifier: MIT
/*
 * Forced interleavings of the two throttles' signals, on the real KVM:
 * the library's kick of a vCPU over its dirty limit, and the test VMM's
 * run share.  The points where the races sit have no hook of the
 * library's, so the test interposes the libc calls around them
 * (pthread_kill, ioctl) in this program only; each interposer lets the
 * real call through unless a test armed it.
 *
 * - kick_seq_before_signal: a kicker bumps kick_seq, and only then
 *   signals.  A vCPU thread taking an earlier kick's EINTR in between
 *   reads the new kick_seq, counts it as seen, and goes back into
 *   KVM_RUN; the late signal then ends that KVM_RUN, and
 *   kvmdirty_vcpu_run() returns -EINTR with immediate_exit clear,
 *   which the header says it never does for the library's own kick.
 * - share_signal_before_run: testvm_set_run_share() signals the vCPU
 *   thread once; a signal that lands between sit_out() and KVM_RUN is
 *   lost, and a vCPU that had no share (no timer armed) and does not
 *   exit then never takes its share.
 * - held_while_held: kvmdirty_vcpu_stats() read while a vCPU is held
 *   reports only the holds that ended: held_ns stands still for as long
 *   as a hold lasts, and the source's tick (lib/migrate/source/source-precopy.c)
 *   takes a vCPU held through a whole sample for one that neither dirties
 *   nor is held.
 * - pause_during_sit_out: a vCPU sitting out the rest of its period is
 *   paused as it begins to wait: the pause must not wait out the period
 *   (up to 10 ms of downtime); it did when the sit-out was a sleep that
 *   the pause's signal, landing just before it, could not cut short.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/ioctl.h>
#include <linux/kvm.h>

#include "ring-util.h"

#define L_GPA (4 * GIB)

#define wait_flag(flag, ms) wait_count((flag), 1, (ms))

/* ---- pthread_kill, ioctl and pthread_cond_timedwait, interposed ---- */

static int (*real_pthread_kill)(pthread_t, int);
static int (*real_ioctl)(int, unsigned long, void *);

#ifndef __SANITIZE_THREAD__
static int (*real_cond_timedwait)(pthread_cond_t *, pthread_mutex_t *, const struct timespec *);
#endif

static void (*kill_hook)(pthread_t th, int sig);
static void (*run_hook)(void);
#ifndef __SANITIZE_THREAD__
static void (*sleep_hook)(const struct timespec *ts);
#endif

int pthread_kill(pthread_t th, int sig)
{
	void (*hook)(pthread_t, int) = __atomic_load_n(&kill_hook, __ATOMIC_ACQUIRE);

	if (!real_pthread_kill)
		*(void **)&real_pthread_kill = dlsym(RTLD_NEXT, "pthread_kill");
	if (hook)
		hook(th, sig);
	return real_pthread_kill(th, sig);
}

int ioctl(int fd, unsigned long req, ...)
{
	void (*hook)(void) = __atomic_load_n(&run_hook, __ATOMIC_ACQUIRE);
	va_list ap;
	void *arg;

	va_start(ap, req);
	arg = va_arg(ap, void *);
	va_end(ap);
	if (!real_ioctl)
		*(void **)&real_ioctl = dlsym(RTLD_NEXT, "ioctl");
	if (hook && req == KVM_RUN)
		hook();
	return real_ioctl(fd, req, arg);
}

/*
 * Not under ThreadSanitizer, whose own pthread_cond_timedwait tells it the
 * mutex is let go while waiting: passing the call on past it would make
 * every later lock look doubled (pause_during_sit_out runs in the plain
 * and ASan builds).
 */
#ifndef __SANITIZE_THREAD__
int pthread_cond_timedwait(pthread_cond_t *restrict cond, pthread_mutex_t *restrict m,
			   const struct timespec *restrict ts)
{
	void (*hook)(const struct timespec *) = __atomic_load_n(&sleep_hook, __ATOMIC_ACQUIRE);

	if (!real_cond_timedwait)
		*(void **)&real_cond_timedwait = dlvsym(RTLD_NEXT, "pthread_cond_timedwait", "GLIBC_2.3.2");
	if (hook)
		hook(ts);
	return real_cond_timedwait(cond, m, ts);
}
#endif

/* ---- kick_seq_before_signal ---- */

static struct {
	struct testvm *tv;
	struct kvmdirty_vcpu *v;
	pthread_t th;
	int armed;	    /* the first kick after this is stalled before it bumps kick_seq */
	int kick_hooked;    /* KD_HOOK_KICK seen */
	int kills;	    /* library kicks that reached pthread_kill */
	int in_handler;	    /* the first kick's signal is being handled on the vCPU thread */
	int handler_done;
	int second_entered; /* the second kick bumped kick_seq and is about to signal */
	int second_sent;
	int back_in_guest;  /* the guest wrote again after the second kick's seq was read */
	int stop;
	int ret;
	uint64_t eintr_no_ie, eintr_ie;
} k;

static void k_handler(int sig)
{
	(void)sig;
	if (!pthread_equal(pthread_self(), k.th) || !__atomic_load_n(&k.armed, __ATOMIC_ACQUIRE) ||
	    __atomic_load_n(&k.in_handler, __ATOMIC_ACQUIRE))
		return;
	__atomic_store_n(&k.in_handler, 1, __ATOMIC_RELEASE);
	/* the thread took the first kick's EINTR: hold it here until the second kick bumped kick_seq */
	wait_flag(&k.second_entered, 10000);
	__atomic_store_n(&k.handler_done, 1, __ATOMIC_RELEASE);
}

static void k_point(enum kd_hook_point p, void *obj)
{
	if (p != KD_HOOK_KICK || obj != k.v || __atomic_fetch_add(&k.kick_hooked, 1, __ATOMIC_ACQ_REL))
		return;
	/* the first kick: let the guest write a few dozen pages more for the next sync to charge */
	wait_writes(k.tv, 0, 30);
}

static void k_kill(pthread_t th, int sig)
{
	struct guest_vcpu *mb;
	uint64_t w;
	int n;

	if (sig != SIGUSR1 || !pthread_equal(th, k.th) || !__atomic_load_n(&k.armed, __ATOMIC_ACQUIRE))
		return;
	n = __atomic_add_fetch(&k.kills, 1, __ATOMIC_ACQ_REL);
	if (n != 2)
		return;
	/* the second kick: kick_seq is bumped; the signal goes once the thread is back in the guest */
	__atomic_store_n(&k.second_entered, 1, __ATOMIC_RELEASE);
	if (!wait_flag(&k.handler_done, 10000))
		return;
	mb = testvm_mailbox(k.tv, 0);
	w = mb->writes;
	for (n = 0; n < 2000 && mb->writes == w; n++)
		rig_pause_us(1000);
	__atomic_store_n(&k.back_in_guest, mb->writes != w, __ATOMIC_RELEASE);
	__atomic_store_n(&k.second_sent, 1, __ATOMIC_RELEASE);
}

static void *k_vcpu(void *p)
{
	struct kvm_run *run = kvmdirty_vcpu_kvm_run(k.v);
	int r;

	(void)p;
	for (;;) {
		r = kvmdirty_vcpu_run(k.v);
		if (r == -EINTR) {
			if (__atomic_load_n(&run->immediate_exit, __ATOMIC_RELAXED)) {
				k.eintr_ie++;
				k.ret = 0;
				break;
			}
			k.eintr_no_ie++;
			continue;
		}
		if (r < 0) {
			k.ret = r;
			break;
		}
		r = guest_exit(run);
		if (r > 0)
			continue;
		k.ret = r;
		break;
	}
	return NULL;
}

/*
 * A vCPU at three times its limit, a 4096-entry ring that never fills,
 * synced by hand.  Sync 1 charges it into debt and kicks (kick 1,
 * stalled at KD_HOOK_KICK while the guest writes 30 pages on); the vCPU thread
 * takes kick 1's EINTR and is held in the signal handler.  Sync 2
 * charges what was written meanwhile and kicks again (kick 2): kick_seq
 * is bumped, and the signal is held back until the thread, back from
 * the handler, read that kick_seq, was held for its debt and wrote
 * again.  Then kick 2's signal ends that KVM_RUN.  Nothing else signals
 * the thread and immediate_exit stays clear until the end.
 */
START_TEST(kick_seq_before_signal)
{
	const uint64_t limit = 1000;
	struct rig g = ring_rig(1, 4096, 0, 0);
	struct sigaction sa = { .sa_handler = k_handler };
	struct kvmdirty_region *ra;
	struct guest_vcpu *mb0;
	void *ma;

	sigaction(SIGUSR1, &sa, NULL); /* no SA_RESTART */
	ck_assert_ok(kvmdirty_vm_set_kick_signal(g.tv->vm, SIGUSR1));
	ck_assert_ok(testvm_add_memory(g.tv, L_GPA, 4096 * PAGE, 0, &ma, &ra));
	rig_add_copy(&g, ra, false, false);
	rig_add_copy(&g, g.tv->sys_region, true, false);
	rig_work(g.tv, 0, L_GPA, 4096, GUEST_SEQUENTIAL, 0);
	mb0 = testvm_mailbox(g.tv, 0);
	mb0->tsc_per_page = testvm_tsc_per_page(g.tv, 3 * limit);
	ck_assert_uint_gt(mb0->tsc_per_page, 0);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);
	k = (typeof(k)){ .tv = g.tv, .v = g.tv->vcpu[0] };
	ck_assert_ok(kvmdirty_vcpu_set_dirty_limit(k.v, limit));
	ck_assert_int_eq(pthread_create(&k.th, NULL, k_vcpu, NULL), 0);
	/* 200 ms at three times the limit: 400 ms owed at the first charge */
	rig_pause_us(200000);
	__atomic_store_n(&kill_hook, k_kill, __ATOMIC_RELEASE);
	kd_test_hooks_set(NULL, k_point, false);
	__atomic_store_n(&k.armed, 1, __ATOMIC_RELEASE);
	rig_sync_consume(&g);
	ck_assert_msg(wait_flag(&k.in_handler, 10000), "kick 1 (kills %d) never reached the vCPU thread",
		      __atomic_load_n(&k.kills, __ATOMIC_ACQUIRE));
	rig_sync_consume(&g);
	ck_assert_msg(__atomic_load_n(&k.second_sent, __ATOMIC_ACQUIRE), "sync 2 sent no kick (kills %d)",
		      __atomic_load_n(&k.kills, __ATOMIC_ACQUIRE));
	/* kick 2's signal had its effect; then lift the limit and take the thread out for good */
	rig_pause_us(100000);
	hooks_off();
	__atomic_store_n(&kill_hook, NULL, __ATOMIC_RELEASE);
	ck_assert_ok(kvmdirty_vcpu_set_dirty_limit(k.v, 0));
	__atomic_store_n(&kvmdirty_vcpu_kvm_run(k.v)->immediate_exit, 1, __ATOMIC_RELAXED);
	real_pthread_kill(k.th, SIGUSR1);
	pthread_join(k.th, NULL);
	ck_assert_msg(k.ret == 0, "vCPU thread: %s", strerror(-k.ret));
	ck_assert_msg(k.eintr_no_ie == 0,
		      "kvmdirty_vcpu_run() returned -EINTR %" PRIu64 " time(s) with immediate_exit clear; "
		      "the only signals before the end were the library's %d kicks (kick 2's sent %s)",
		      k.eintr_no_ie, __atomic_load_n(&k.kills, __ATOMIC_ACQUIRE),
		      __atomic_load_n(&k.back_in_guest, __ATOMIC_ACQUIRE) ? "once the guest ran again"
									  : "after a 2 s wait");
	rig_finish(&g, "after the last sync");
}
END_TEST

/* ---- share_signal_before_run ---- */

static struct {
	int armed, at_run, shared;
} sh;

static void s_run(void)
{
	/* the vCPU thread, past sit_out() with no share, about to enter KVM_RUN */
	if (!__atomic_exchange_n(&sh.armed, 0, __ATOMIC_ACQ_REL))
		return;
	__atomic_store_n(&sh.at_run, 1, __ATOMIC_RELEASE);
	wait_flag(&sh.shared, 10000);
}

/*
 * A vCPU that only computes (it never exits) runs with the whole period.
 * Its thread has left sit_out() and is about to enter KVM_RUN when the
 * migration thread gives it a run share of 5 permille; the share's
 * signal reaches the thread there (it is not blocked), before KVM_RUN.
 * The share must still apply: the vCPU is kept out within a few periods.
 */
START_TEST(share_signal_before_run)
{
	struct testvm_opts o = { .nr_vcpus = 1 };
	struct testvm *tv;
	unsigned int i;

	hooks_off();
	ck_assert_ok(testvm_new(&o, &tv));
	rig_work(tv, 0, 0, 1000, GUEST_COMPUTE, 0);
	sh = (typeof(sh)){ .armed = 1 };
	__atomic_store_n(&run_hook, s_run, __ATOMIC_RELEASE);
	ck_assert_ok(testvm_spawn(tv));
	ck_assert_msg(wait_flag(&sh.at_run, 10000), "the vCPU thread never entered KVM_RUN");
	ck_assert_ok(testvm_set_run_share(tv, 0, 5));
	/* the signal is taken by the thread now, in its wait above */
	rig_pause_us(50000);
	__atomic_store_n(&sh.shared, 1, __ATOMIC_RELEASE);
	/* 5 permille: out 9.95 ms of each 10 ms period once the share applies; allow 200 periods */
	for (i = 0; i < 2000 && !testvm_out_ns(tv, 0); i++)
		rig_pause_us(1000);
	__atomic_store_n(&run_hook, NULL, __ATOMIC_RELEASE);
	ck_assert_msg(testvm_out_ns(tv, 0) > 0,
		      "a run share of 5 permille set while the vCPU thread entered KVM_RUN never applied "
		      "(kept out %" PRIu64 " ns after %u ms)", testvm_out_ns(tv, 0), i);
	/* takes the vCPU out for good (halt) and joins it */
	testvm_free(tv);
}
END_TEST

/* ---- held_while_held ---- */

static struct kvmdirty_vcpu_stats vstats(struct kvmdirty_vcpu *v)
{
	struct kvmdirty_vcpu_stats st;

	ck_assert_ok(kvmdirty_vcpu_stats(v, &st, sizeof(st)));
	return st;
}

/*
 * A vCPU charged a full ring at 1 page/s is held for minutes.  Read
 * 300 ms apart within that hold, its statistics must show it held for
 * longer at the second read: held_ns is "time held out of KVM_RUN by the
 * limit", and the source's throttle judges a vCPU held by how much it
 * grew over a 100 ms sample.
 */
START_TEST(held_while_held)
{
	struct rig g = ring_rig(1, 256, 0, 0);
	struct kvmdirty_vcpu_stats a, b;
	struct kvmdirty_region *ra;
	struct runner r;
	void *ma;
	int i;

	ck_assert_ok(testvm_add_memory(g.tv, L_GPA, 2048 * PAGE, 0, &ma, &ra));
	rig_add_copy(&g, ra, false, false);
	rig_add_copy(&g, g.tv->sys_region, true, false);
	rig_work(g.tv, 0, L_GPA, 2048, GUEST_SEQUENTIAL, 0);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);
	ck_assert_ok(kvmdirty_vcpu_set_dirty_limit(g.tv->vcpu[0], 1));
	runner_start(&r, g.tv, 0);
	/* the first ring-full exit charges 256 pages: minutes owed */
	for (i = 0; i < 60000 && !vstats(g.tv->vcpu[0]).holds; i++)
		rig_pause_us(1000);
	a = vstats(g.tv->vcpu[0]);
	ck_assert_uint_gt(a.holds, 0);
	rig_pause_us(300000);
	b = vstats(g.tv->vcpu[0]);
	ck_assert_uint_eq(b.holds, a.holds);
	ck_assert_msg(b.held_ns > a.held_ns,
		      "held_ns stood still at %" PRIu64 " ns through 300 ms of a hold (holds %" PRIu64 ")",
		      b.held_ns, b.holds);
	ck_assert_ok(kvmdirty_vcpu_set_dirty_limit(g.tv->vcpu[0], 0));
	testvm_stop_all(g.tv);
	runner_join(&r);
	rig_finish(&g, "after the last sync");
}
END_TEST

/* ---- pause_during_sit_out (not under ThreadSanitizer: see pthread_cond_timedwait above) ---- */
#ifndef __SANITIZE_THREAD__

static struct {
	struct testvm *tv;
	int armed, at_sleep;
	uint64_t end; /* CLOCK_MONOTONIC ns the sit-out was to end */
} ps;

static void ps_sleep(const struct timespec *ts)
{
	/* the vCPU thread in sit_out(), about to wait for the period's end (it holds tv->lock) */
	if (!pthread_equal(pthread_self(), ps.tv->threads[0]) || !__atomic_exchange_n(&ps.armed, 0, __ATOMIC_ACQ_REL))
		return;
	ps.end = (uint64_t)ts->tv_sec * 1000000000ull + (uint64_t)ts->tv_nsec;
	__atomic_store_n(&ps.at_sleep, 1, __ATOMIC_RELEASE);
}

/*
 * A vCPU at a run share of 5 permille sits out 9.95 ms of each period.
 * The source pauses it (stop-and-copy) as its thread begins to wait for
 * the period's end.  The pause must not wait for the rest of the sit-out:
 * it returns before the sit-out would have ended.  (The wait checks
 * pause_req under tv->lock and the pause wakes it under the same lock;
 * a pause that only signalled, or a sleep that a signal landing just
 * before it cannot cut short, waits out the period.)
 */
START_TEST(pause_during_sit_out)
{
	struct testvm_opts o = { .nr_vcpus = 1 };
	uint64_t done;

	hooks_off();
	ck_assert_ok(testvm_new(&o, &ps.tv));
	rig_work(ps.tv, 0, 0, 1000, GUEST_COMPUTE, 0);
	ck_assert_ok(testvm_spawn(ps.tv));
	ck_assert_ok(testvm_set_run_share(ps.tv, 0, 5));
	/* a few periods in: the share is on */
	rig_pause_us(50000);
	ck_assert_uint_gt(testvm_out_ns(ps.tv, 0), 0);
	__atomic_store_n(&sleep_hook, ps_sleep, __ATOMIC_RELEASE);
	__atomic_store_n(&ps.armed, 1, __ATOMIC_RELEASE);
	ck_assert_msg(wait_flag(&ps.at_sleep, 10000), "the vCPU never sat out again");
	testvm_pause_all(ps.tv);
	done = mono_ns();
	__atomic_store_n(&sleep_hook, NULL, __ATOMIC_RELEASE);
	ck_assert_msg(done < ps.end,
		      "the pause returned %.3f ms after the sit-out's end: it waited for the whole sit-out",
		      (double)(done - ps.end) / 1e6);
	testvm_resume_all(ps.tv);
	testvm_free(ps.tv);
}
END_TEST
#endif

int main(void)
{
	int skip = require_kvm("test-throttle-race");
	Suite *s;
	TCase *tc;

	if (skip)
		return skip; /* before Check allocates anything: no leak on the way out */
	s = suite_create("throttle-race");
	tc = tcase_create("throttle-race");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, kick_seq_before_signal);
	tcase_add_test(tc, share_signal_before_run);
	tcase_add_test(tc, held_while_held);
#ifndef __SANITIZE_THREAD__
	tcase_add_test(tc, pause_during_sit_out);
#endif
	suite_add_tcase(s, tc);
	return run_suite(s);
}
