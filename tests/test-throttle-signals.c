// SPDX-License-Identifier: MIT
/*
 * Interleavings around the throttles' signals that test-throttle-race
 * does not force, on the real KVM.  As there, the libc calls around the
 * points in question are interposed in this program only, and each
 * interposer lets the real call through unless a test armed it.
 *
 * - share_whole_again_while_paused: while the guest is paused, a vCPU's
 *   run share goes from 1000 to 500 and back to 1000 before its thread
 *   ever took the 500.  testvm_set_run_share() fired the thread's timer
 *   every period for the 500; back at 1000 nothing stops it, and a vCPU
 *   with its whole share is taken out of KVM_RUN every 10 ms for good.
 * - share_whole_races_slice_end: the same without a pause.  A vCPU at a
 *   share of 500 is given 1000 just as its slice ends: its thread sees
 *   1000 and stops its timer before testvm_set_run_share() takes tv->lock
 *   and fires the timer every period again.  Forced by holding the
 *   setter before it locks until the thread stopped the timer.
 * - share_whole_again_taken: the control: 500 taken, then 1000; the timer
 *   stops.
 * - share_part_races_disarm: the control for the disarm at a share of
 *   1000: the thread has seen 1000 under tv->lock and is about to stop
 *   its timer when testvm_set_run_share() exchanges 500 and goes for the
 *   lock.  The setter's firing must come after the stop: the 500 is taken
 *   by a vCPU that never exits.
 * - timer_tid_reused: a thread not of testvm_spawn() runs a vCPU under a
 *   share and ends; its timer stays, keyed by its thread id.  A later
 *   thread that gets the same id (forced in a PID namespace) is taken for
 *   the timer's owner, though the timer signals the thread that ended:
 *   a vCPU that never exits then never leaves KVM_RUN for its share.
 * - kick_off_leaks_eintr: a VMM that blocks the kick signal outside
 *   KVM_RUN (KVM_SET_SIGNAL_MASK) turns kicks off just as its vCPU
 *   thread took a kick's EINTR: the kick's signal is still pending, the
 *   library no longer eats it (it looks for the signal now set, none),
 *   and the next KVM_RUN returns -EINTR with immediate_exit clear.
 * - kick_moved_leaks_eintr: as kick_off_leaks_eintr, but the VMM moves
 *   kicks to SIGUSR2 (blocked outside KVM_RUN too) instead of turning them
 *   off, and a second kick with SIGUSR2 lands before the thread went on.
 *   The library eats the last kick's signal only: SIGUSR1 stays pending
 *   and the next KVM_RUN returns -EINTR with immediate_exit clear.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <inttypes.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <linux/kvm.h>

#include "ring-util.h"

#define L_GPA (4 * GIB)
/* ---- SIGUSR1s that reach one thread ---- */

static struct {
	pid_t tid;
	int n;
} sg;

static void count_handler(int sig)
{
	int err = errno;

	(void)sig;
	if (gettid() == __atomic_load_n(&sg.tid, __ATOMIC_ACQUIRE))
		__atomic_add_fetch(&sg.n, 1, __ATOMIC_ACQ_REL);
	errno = err;
}

/* Spawn vCPU 0 (a guest that never exits), count the SIGUSR1s its thread takes. */
static struct testvm *spawn_counted(void)
{
	struct sigaction sa = { .sa_handler = count_handler };
	struct testvm_opts o = { .nr_vcpus = 1 };
	struct testvm *tv;
	pid_t tid = 0;
	int i;

	hooks_off();
	ck_assert_ok(testvm_new(&o, &tv));
	rig_work(tv, 0, 0, 1000, GUEST_COMPUTE, 0);
	ck_assert_ok(testvm_spawn(tv));
	/* no SA_RESTART, as testvm_spawn()'s own handler */
	sigaction(SIGUSR1, &sa, NULL);
	for (i = 0; i < 10000 && !__atomic_load_n(&tv->timer_owner[0], __ATOMIC_ACQUIRE); i++)
		rig_pause_us(1000);
	tid = __atomic_load_n(&tv->thread_tid[0], __ATOMIC_RELAXED);
	ck_assert_int_ne(tid, 0);
	__atomic_store_n(&sg.n, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&sg.tid, tid, __ATOMIC_RELEASE);
	return tv;
}

/*
 * After the share went back to 1000: at most one firing may still be in
 * flight as the thread stops the timer.  Five in three seconds means the
 * timer goes on firing every period; then a second's count is reported.
 */
static void expect_timer_quiet(struct testvm *tv, const char *what)
{
	struct itimerspec its = { 0 };
	int n0, n1;

	__atomic_store_n(&sg.n, 0, __ATOMIC_RELEASE);
	if (!wait_count(&sg.n, 5, 3000))
		return;
	n0 = __atomic_load_n(&sg.n, __ATOMIC_ACQUIRE);
	{
		struct timespec one = { 1, 0 };

		nanosleep(&one, NULL);
	}
	n1 = __atomic_load_n(&sg.n, __ATOMIC_ACQUIRE);
	timer_gettime(tv->timer[0], &its);
	ck_abort_msg("%s: vCPU 0 at a run share of %u took %d SIGUSR1 (KVM_RUN -EINTR) in the next second; "
		     "its timer still fires every %ld ns",
		     what, tv->share[0], n1 - n0, its.it_interval.tv_nsec);
}

/* A share of 500 for vCPU 0, taken: its thread sat out once. */
static void share_500_taken(struct testvm *tv)
{
	int i;

	ck_assert_ok(testvm_set_run_share(tv, 0, 500));
	for (i = 0; i < 5000 && !testvm_out_ns(tv, 0); i++)
		rig_pause_us(1000);
	ck_assert_uint_gt(testvm_out_ns(tv, 0), 0);
}

START_TEST(share_whole_again_while_paused)
{
	struct testvm *tv = spawn_counted();

	rig_pause_us(20000);
	testvm_pause_all(tv);
	ck_assert_ok(testvm_set_run_share(tv, 0, 500));
	ck_assert_ok(testvm_set_run_share(tv, 0, 1000));
	testvm_resume_all(tv);
	expect_timer_quiet(tv, "500 then 1000 while paused");
	testvm_free(tv);
}
END_TEST

START_TEST(share_whole_again_taken)
{
	struct testvm *tv = spawn_counted();

	share_500_taken(tv);
	ck_assert_ok(testvm_set_run_share(tv, 0, 1000));
	rig_pause_us(50000);
	expect_timer_quiet(tv, "500 taken, then 1000");
	testvm_free(tv);
}
END_TEST

/* ---- timer_tid_reused ---- */

static struct {
	struct testvm *tv;
	pid_t t1, t2;
	int t2_sigs;
} tr;

static void tr_handler(int sig)
{
	int err = errno;

	(void)sig;
	if (gettid() == __atomic_load_n(&tr.t2, __ATOMIC_ACQUIRE))
		__atomic_add_fetch(&tr.t2_sigs, 1, __ATOMIC_ACQ_REL);
	errno = err;
}

static void *tr_first(void *p)
{
	struct testvm_exit ex;

	(void)p;
	tr.t1 = gettid();
	/* one pass at a share of 500: this thread's timer is made and armed */
	testvm_run(tr.tv, 0, &ex);
	return NULL;
}

static void *tr_second(void *p)
{
	struct testvm_exit ex;

	(void)p;
	__atomic_store_n(&tr.t2, gettid(), __ATOMIC_RELEASE);
	testvm_run(tr.tv, 0, &ex);
	return NULL;
}

/* In the PID namespace's first process: what the test reads back, or a line why it could not run. */
struct tr_result {
	pid_t t1, t2;
	int sigs;
	uint64_t out_ns;
	char why[128];
};

static void tr_child(struct tr_result *res)
{
	struct testvm_opts o = { .nr_vcpus = 1 };
	struct sigaction sa = { .sa_handler = tr_handler };
	struct guest_vcpu *mb;
	struct timespec ts;
	pthread_t a, b;
	uint64_t out0;
	char buf[32];
	int fd;

	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) || mount("proc", "/proc", "proc", 0, NULL)) {
		snprintf(res->why, sizeof(res->why), "mount proc: %s", strerror(errno));
		return;
	}
	if (testvm_new(&o, &tr.tv)) {
		snprintf(res->why, sizeof(res->why), "testvm_new failed");
		return;
	}
	sigaction(SIGUSR1, &sa, NULL); /* no SA_RESTART */
	rig_work(tr.tv, 0, 0, 1000, GUEST_COMPUTE, GUEST_F_EXIT_EVERY_PASS);
	testvm_set_run_share(tr.tv, 0, 500);
	pthread_create(&a, NULL, tr_first, NULL);
	pthread_join(a, NULL);
	/* from now on the guest never exits */
	mb = testvm_mailbox(tr.tv, 0);
	mb->flags = 0;
	fd = open("/proc/sys/kernel/ns_last_pid", O_WRONLY);
	snprintf(buf, sizeof(buf), "%d", tr.t1 - 1);
	if (fd < 0 || write(fd, buf, strlen(buf)) < 0) {
		snprintf(res->why, sizeof(res->why), "ns_last_pid: %s", strerror(errno));
		return;
	}
	close(fd);
	pthread_create(&b, NULL, tr_second, NULL);
	ts = (struct timespec){ 0, 100000000 };
	nanosleep(&ts, NULL);
	out0 = testvm_out_ns(tr.tv, 0);
	/* a second: a hundred periods of 10 ms */
	ts = (struct timespec){ 1, 0 };
	nanosleep(&ts, NULL);
	res->t1 = tr.t1;
	res->t2 = __atomic_load_n(&tr.t2, __ATOMIC_ACQUIRE);
	res->sigs = __atomic_load_n(&tr.t2_sigs, __ATOMIC_ACQUIRE);
	res->out_ns = testvm_out_ns(tr.tv, 0) - out0;
	/* the second thread is in KVM_RUN for good: the namespace ends with this process */
}

START_TEST(timer_tid_reused)
{
	struct tr_result *res = mmap(NULL, sizeof(*res), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	pid_t pid;
	int st;

	ck_assert_ptr_ne(res, MAP_FAILED);
	memset(res, 0, sizeof(*res));
	hooks_off();
	/*
	 * The namespace is made in a process of its own, which only waits:
	 * this one stays in its own (LeakSanitizer, at its exit, cannot stop
	 * the world from a process whose next child would be a new init).
	 */
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (!pid) {
		pid_t inner;

		if (unshare(CLONE_NEWPID | CLONE_NEWNS)) {
			snprintf(res->why, sizeof(res->why), "unshare: %s", strerror(errno));
			_exit(0);
		}
		inner = fork();
		if (inner < 0) {
			snprintf(res->why, sizeof(res->why), "fork: %s", strerror(errno));
			_exit(0);
		}
		if (!inner) {
			tr_child(res);
			_exit(0);
		}
		waitpid(inner, &st, 0);
		_exit(0);
	}
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(!res->why[0], "%s", res->why);
	ck_assert_msg(res->t2 == res->t1, "the second thread got id %d, not the first's %d", res->t2, res->t1);
	ck_assert_msg(res->sigs > 0,
		      "a vCPU at a run share of 500 whose thread reused the id of an ended one took %d SIGUSR1 "
		      "and was kept out %.1f ms in 1 s (its timer signals the thread that ended)",
		      res->sigs, (double)res->out_ns / 1e6);
	munmap(res, sizeof(*res));
}
END_TEST

/* ---- interposed: pthread_mutex_lock, timer_settime, ioctl ---- */

static int (*real_mutex_lock)(pthread_mutex_t *);
static int (*real_timer_settime)(timer_t, int, const struct itimerspec *, struct itimerspec *);
static int (*real_ioctl)(int, unsigned long, void *);

static __attribute__((unused)) void (*lock_hook)(pthread_mutex_t *m);
static __attribute__((unused)) void (*settime_hook)(const struct itimerspec *its);
static void (*run_done_hook)(int ret, int err);

__attribute__((constructor)) static void resolve_real(void)
{
	*(void **)&real_mutex_lock = dlsym(RTLD_NEXT, "pthread_mutex_lock");
	*(void **)&real_timer_settime = dlvsym(RTLD_NEXT, "timer_settime", "GLIBC_2.34");
	*(void **)&real_ioctl = dlsym(RTLD_NEXT, "ioctl");
}

#ifndef __SANITIZE_THREAD__
int pthread_mutex_lock(pthread_mutex_t *m)
{
	void (*hook)(pthread_mutex_t *) = __atomic_load_n(&lock_hook, __ATOMIC_ACQUIRE);

	if (!real_mutex_lock)
		resolve_real();
	if (hook)
		hook(m);
	return real_mutex_lock(m);
}

int timer_settime(timer_t t, int flags, const struct itimerspec *its, struct itimerspec *old)
{
	void (*hook)(const struct itimerspec *) = __atomic_load_n(&settime_hook, __ATOMIC_ACQUIRE);

	if (!real_timer_settime)
		resolve_real();
	if (hook)
		hook(its);
	return real_timer_settime(t, flags, its, old);
}
#endif

int ioctl(int fd, unsigned long req, ...)
{
	void (*hook)(int, int);
	va_list ap;
	void *arg;
	int r, err;

	va_start(ap, req);
	arg = va_arg(ap, void *);
	va_end(ap);
	if (!real_ioctl)
		resolve_real();
	r = real_ioctl(fd, req, arg);
	/* looked at once the call returned: a KVM_RUN under way when a test arms it counts */
	hook = __atomic_load_n(&run_done_hook, __ATOMIC_ACQUIRE);
	if (hook && req == KVM_RUN) {
		err = errno;
		hook(r, err);
		errno = err;
	}
	return r;
}

/* ---- share_whole_races_slice_end (not under ThreadSanitizer, which owns pthread_mutex_lock) ---- */
#ifndef __SANITIZE_THREAD__

static struct {
	struct testvm *tv;
	pthread_t setter;
	int armed, watch, stopped, setter_held;
} rs;

static void rs_settime(const struct itimerspec *its)
{
	/* the vCPU thread in sit_out(), at a share of 1000: it stops its timer */
	if (!__atomic_load_n(&rs.watch, __ATOMIC_ACQUIRE) || gettid() != __atomic_load_n(&sg.tid, __ATOMIC_ACQUIRE) || its->it_value.tv_sec ||
	    its->it_value.tv_nsec || its->it_interval.tv_nsec)
		return;
	__atomic_store_n(&rs.stopped, 1, __ATOMIC_RELEASE);
}

static void rs_lock(pthread_mutex_t *m)
{
	/* testvm_set_run_share() on the main thread, share exchanged, about to lock */
	if (m != &rs.tv->lock || !pthread_equal(pthread_self(), rs.setter) ||
	    !__atomic_exchange_n(&rs.armed, 0, __ATOMIC_ACQ_REL))
		return;
	__atomic_store_n(&rs.setter_held, 1, __ATOMIC_RELEASE);
	/* until the thread's slice ended and it stopped the timer for its share of 1000 */
	wait_count(&rs.stopped, 1, 5000);
}

START_TEST(share_whole_races_slice_end)
{
	struct testvm *tv = spawn_counted();

	share_500_taken(tv);
	rs = (typeof(rs)){ .tv = tv, .setter = pthread_self(), .armed = 1, .watch = 1 };
	__atomic_store_n(&settime_hook, rs_settime, __ATOMIC_RELEASE);
	__atomic_store_n(&lock_hook, rs_lock, __ATOMIC_RELEASE);
	ck_assert_ok(testvm_set_run_share(tv, 0, 1000));
	__atomic_store_n(&lock_hook, NULL, __ATOMIC_RELEASE);
	__atomic_store_n(&settime_hook, NULL, __ATOMIC_RELEASE);
	ck_assert_msg(rs.setter_held, "testvm_set_run_share() never locked tv->lock");
	ck_assert_msg(__atomic_load_n(&rs.stopped, __ATOMIC_ACQUIRE),
		      "the vCPU thread never stopped its timer for the share of 1000");
	rig_pause_us(50000);
	expect_timer_quiet(tv, "1000 set as the slice of 500 ended");
	testvm_free(tv);
}
END_TEST
#endif

/* ---- share_part_races_disarm (not under ThreadSanitizer, as above) ---- */
#ifndef __SANITIZE_THREAD__

static struct {
	struct testvm *tv;
	pthread_t setter;
	int watch, at_disarm, lock_armed, setter_at_lock;
} dz;

static void dz_settime(const struct itimerspec *its)
{
	/* the vCPU thread in sit_out(), share 1000 seen under tv->lock: it is about to stop its timer */
	if (gettid() != __atomic_load_n(&sg.tid, __ATOMIC_ACQUIRE) || its->it_value.tv_sec || its->it_value.tv_nsec ||
	    its->it_interval.tv_nsec || !__atomic_exchange_n(&dz.watch, 0, __ATOMIC_ACQ_REL))
		return;
	__atomic_store_n(&dz.at_disarm, 1, __ATOMIC_RELEASE);
	/* until testvm_set_run_share() exchanged 500 and goes for tv->lock */
	wait_count(&dz.setter_at_lock, 1, 10000);
}

static void dz_lock(pthread_mutex_t *m)
{
	if (m != &dz.tv->lock || !pthread_equal(pthread_self(), dz.setter) ||
	    !__atomic_exchange_n(&dz.lock_armed, 0, __ATOMIC_ACQ_REL))
		return;
	__atomic_store_n(&dz.setter_at_lock, 1, __ATOMIC_RELEASE);
}

START_TEST(share_part_races_disarm)
{
	struct testvm *tv = spawn_counted();
	uint64_t out;
	int i;

	share_500_taken(tv);
	dz = (typeof(dz)){ .tv = tv, .setter = pthread_self(), .watch = 1 };
	__atomic_store_n(&settime_hook, dz_settime, __ATOMIC_RELEASE);
	__atomic_store_n(&lock_hook, dz_lock, __ATOMIC_RELEASE);
	ck_assert_ok(testvm_set_run_share(tv, 0, 1000));
	ck_assert_msg(wait_count(&dz.at_disarm, 1, 10000), "the vCPU thread never stopped its timer at 1000");
	__atomic_store_n(&dz.lock_armed, 1, __ATOMIC_RELEASE);
	ck_assert_ok(testvm_set_run_share(tv, 0, 500));
	__atomic_store_n(&lock_hook, NULL, __ATOMIC_RELEASE);
	__atomic_store_n(&settime_hook, NULL, __ATOMIC_RELEASE);
	ck_assert_msg(dz.setter_at_lock, "testvm_set_run_share() never locked tv->lock");
	/* the 500 reaches a vCPU that never exits only by its timer: it sits out again */
	out = testvm_out_ns(tv, 0);
	for (i = 0; i < 5000 && testvm_out_ns(tv, 0) == out; i++)
		rig_pause_us(1000);
	ck_assert_msg(testvm_out_ns(tv, 0) > out,
		      "the share of 500 set as the thread stopped its timer for 1000 was never taken");
	testvm_free(tv);
}
END_TEST
#endif

/* ---- kick_off_leaks_eintr, kick_moved_leaks_eintr ---- */

static struct {
	struct testvm *tv;
	struct kvmdirty_vcpu *v;
	pthread_t th;
	sigset_t set; /* blocked on the vCPU thread outside KVM_RUN */
	int armed, kick_hooked, at_eintr, off_done, eintr_no_ie, eintr_ie, ret, done;
} ko;

static void ko_run_done(int r, int err)
{
	/* the vCPU thread, KVM_RUN ended by the kick's signal (pending: blocked here) */
	if (r >= 0 || err != EINTR || !pthread_equal(pthread_self(), ko.th) ||
	    __atomic_load_n(&kvmdirty_vcpu_kvm_run(ko.v)->immediate_exit, __ATOMIC_RELAXED) ||
	    !__atomic_exchange_n(&ko.armed, 0, __ATOMIC_ACQ_REL))
		return;
	__atomic_store_n(&ko.at_eintr, 1, __ATOMIC_RELEASE);
	/* until the VMM turned kicks off (or moved them, and kicked again) */
	wait_count(&ko.off_done, 1, 10000);
}

static void *ko_vcpu(void *p)
{
	struct kvm_run *run = kvmdirty_vcpu_kvm_run(ko.v);
	struct {
		struct kvm_signal_mask m;
		uint8_t set[8];
	} km = { .m = { .len = 8 } };
	int r;

	(void)p;
	pthread_sigmask(SIG_BLOCK, &ko.set, NULL);
	/* inside KVM_RUN nothing is blocked */
	if (ioctl(kvmdirty_vcpu_fd(ko.v), KVM_SET_SIGNAL_MASK, &km) < 0) {
		ko.ret = -errno;
		return NULL;
	}
	for (;;) {
		r = kvmdirty_vcpu_run(ko.v);
		if (r == -EINTR) {
			struct timespec zero = { 0, 0 };

			if (__atomic_load_n(&run->immediate_exit, __ATOMIC_RELAXED)) {
				ko.eintr_ie++;
				break;
			}
			__atomic_add_fetch(&ko.eintr_no_ie, 1, __ATOMIC_ACQ_REL);
			while (sigtimedwait(&ko.set, NULL, &zero) > 0)
				;
			continue;
		}
		if (r < 0) {
			ko.ret = r;
			break;
		}
		r = guest_exit(run);
		if (r > 0)
			continue;
		ko.ret = r;
		break;
	}
	__atomic_store_n(&ko.done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static void nop_handler(int sig)
{
	(void)sig;
}

static void ko_point(enum kd_hook_point p, void *obj)
{
	if (p != KD_HOOK_KICK || obj != ko.v || __atomic_fetch_add(&ko.kick_hooked, 1, __ATOMIC_ACQ_REL))
		return;
	/* the first kick: let the guest write a few dozen pages more for the next sync to charge */
	wait_writes(ko.tv, 0, 30);
}

/*
 * A vCPU at three times its limit, a 4096-entry ring that never fills,
 * synced by hand; its thread blocks SIGUSR1 (and SIGUSR2) outside
 * KVM_RUN, kicks go with SIGUSR1.  After 200 ms the first sync charges it
 * into debt and kicks it; its thread is held after the kick's EINTR until
 * ko.off_done.  Nothing else signals the thread; immediate_exit stays
 * clear until ko_finish().  moved: SIGUSR2 blocked too, and the first
 * kick stalled in ko_point().
 */
/*
 * The common part: the rig, the vCPU at three times its limit, its thread
 * (blocking SIGUSR1, and SIGUSR2 and SIGRTMIN with also_usr2) started,
 * 1,500 pages of it.
 *
 * What follows needs the first sync to find the vCPU in KVM_RUN and in
 * debt, however the host schedules it.  It was 200 ms of a guest at three
 * times a limit set before its thread started: where the thread's first
 * KVM_RUN came late (ThreadSanitizer on a loaded host with KVM), the sync
 * charged less than the time that passed, found no debt, sent no kick,
 * and "the kick never ended KVM_RUN".  Now the limit is set once the
 * guest wrote KO_CHARGE pages: the sync charges them all (1.5 s at the
 * limit) against the moments since.  The working set stays under the
 * ring's soft limit, so that no ring-full exit charges the vCPU and holds
 * it first, however late the sync (a page written again before a harvest
 * pushes no entry; a held vCPU is out of KVM_RUN and not kicked).
 */
#define KO_CHARGE 1500
#define KO_WS 2048

static struct rig ko_setup(bool also_usr2)
{
	const uint64_t limit = 1000;
	struct rig g = ring_rig(1, 4096, 0, 0);
	struct sigaction sa = { .sa_handler = nop_handler };
	struct kvmdirty_region *ra;
	struct guest_vcpu *mb0;
	void *ma;

	sigaction(SIGUSR1, &sa, NULL);
	sigaction(SIGUSR2, &sa, NULL);
	sigaction(SIGRTMIN, &sa, NULL);
	ck_assert_ok(kvmdirty_vm_set_kick_signal(g.tv->vm, SIGUSR1));
	ck_assert_ok(testvm_add_memory(g.tv, L_GPA, 4096 * PAGE, 0, &ma, &ra));
	rig_add_copy(&g, ra, false, false);
	rig_add_copy(&g, g.tv->sys_region, true, false);
	rig_work(g.tv, 0, L_GPA, KO_WS, GUEST_SEQUENTIAL, 0);
	mb0 = testvm_mailbox(g.tv, 0);
	mb0->tsc_per_page = testvm_tsc_per_page(g.tv, 3 * limit);
	ck_assert_uint_gt(mb0->tsc_per_page, 0);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);
	ko = (typeof(ko)){ .tv = g.tv, .v = g.tv->vcpu[0] };
	sigemptyset(&ko.set);
	sigaddset(&ko.set, SIGUSR1);
	if (also_usr2) {
		sigaddset(&ko.set, SIGUSR2);
		sigaddset(&ko.set, SIGRTMIN);
	}
	ck_assert_int_eq(pthread_create(&ko.th, NULL, ko_vcpu, NULL), 0);
	wait_writes(g.tv, 0, KO_CHARGE);
	ck_assert_msg(mb0->writes >= KO_CHARGE, "the guest wrote %" PRIu64 " pages in 5 s", mb0->writes);
	/* from nothing saved and nothing owed: the next sync charges KO_CHARGE pages or more, 1.5 s at the limit */
	ck_assert_ok(kvmdirty_vcpu_set_dirty_limit(ko.v, limit));
	return g;
}

static struct rig ko_start(bool moved)
{
	struct rig g = ko_setup(moved);

	if (moved)
		kd_test_hooks_set(NULL, ko_point, false);
	__atomic_store_n(&run_done_hook, ko_run_done, __ATOMIC_RELEASE);
	__atomic_store_n(&ko.armed, 1, __ATOMIC_RELEASE);
	rig_sync_consume(&g);
	ck_assert_msg(wait_count(&ko.at_eintr, 1, 10000), "the kick never ended KVM_RUN");
	return g;
}

/* Let the thread go on; the vCPU must not have returned -EINTR with immediate_exit clear. */
static void ko_finish(struct rig *g, const char *what)
{
	struct guest_vcpu *mb0 = testvm_mailbox(g->tv, 0);
	uint64_t w;
	int i;

	__atomic_store_n(&ko.off_done, 1, __ATOMIC_RELEASE);
	/* the thread is held for its debt, then goes back in: until the guest wrote again or it returned */
	w = mb0->writes;
	for (i = 0; i < 5000 && mb0->writes == w && !__atomic_load_n(&ko.eintr_no_ie, __ATOMIC_ACQUIRE); i++)
		rig_pause_us(1000);
	rig_pause_us(20000);
	__atomic_store_n(&run_done_hook, NULL, __ATOMIC_RELEASE);
	kd_test_hooks_set(NULL, NULL, false);
	ck_assert_ok(kvmdirty_vcpu_set_dirty_limit(ko.v, 0));
	__atomic_store_n(&kvmdirty_vcpu_kvm_run(ko.v)->immediate_exit, 1, __ATOMIC_RELAXED);
	pthread_kill(ko.th, SIGUSR1);
	pthread_join(ko.th, NULL);
	ck_assert_msg(ko.ret == 0, "vCPU thread: %s", strerror(-ko.ret));
	ck_assert_msg(ko.eintr_no_ie == 0,
		      "kvmdirty_vcpu_run() returned -EINTR %d time(s) with immediate_exit clear; the only "
		      "signals before the end were the library's kicks, %s",
		      ko.eintr_no_ie, what);
	rig_finish(g, "after the last sync");
}

/* The VMM turns kicks off (kvmdirty_vm_set_kick_signal(vm, 0)) as the thread took the kick's EINTR. */
START_TEST(kick_off_leaks_eintr)
{
	struct rig g = ko_start(false);

	ck_assert_ok(kvmdirty_vm_set_kick_signal(g.tv->vm, 0));
	ko_finish(&g, "taken as the VMM turned kicks off");
}
END_TEST

/*
 * The first kick is stalled before its signal until the guest wrote 30
 * pages more; as the thread took its EINTR, the VMM moves kicks to
 * SIGUSR2 and a second sync charges those pages (still in debt): a second
 * kick, with SIGUSR2, before the thread went on.
 */
START_TEST(kick_moved_leaks_eintr)
{
	struct kvmdirty_vcpu_stats st;
	struct rig g = ko_start(true);
	ck_assert_ok(kvmdirty_vm_set_kick_signal(g.tv->vm, SIGUSR2));
	rig_sync_consume(&g);
	ck_assert_ok(kvmdirty_vcpu_stats(ko.v, &st, sizeof(st)));
	ck_assert_msg(st.kicks == 2, "%" PRIu64 " kick(s) sent, not 2", st.kicks);
	ko_finish(&g, "one with SIGUSR1, then one with SIGUSR2");
}
END_TEST

/* ---- kick_between_wait_and_eat ---- */

static struct {
	int armed, kick1_hooked, at_eat, counted, eaten;
} we;

static void we_point(enum kd_hook_point p, void *obj)
{
	if (obj != ko.v)
		return;
	if (p == KD_HOOK_KICK && !__atomic_fetch_add(&we.kick1_hooked, 1, __ATOMIC_ACQ_REL)) {
		/* the first kick: let the guest write a few dozen pages more for the next sync to charge */
		wait_writes(ko.tv, 0, 30);
	} else if (p == KD_HOOK_EAT_KICK && __atomic_exchange_n(&we.armed, 0, __ATOMIC_ACQ_REL)) {
		/* the vCPU thread waited out the kickers of kick 1: until kick 2 is counted, not sent */
		__atomic_store_n(&we.at_eat, 1, __ATOMIC_RELEASE);
		wait_count(&we.counted, 1, 10000);
	} else if (p == KD_HOOK_HOLD && __atomic_load_n(&we.counted, __ATOMIC_ACQUIRE)) {
		/* past eat_kick(), held for its debt */
		__atomic_store_n(&we.eaten, 1, __ATOMIC_RELEASE);
	} else if (p == KD_HOOK_KICK_SEND && __atomic_load_n(&we.at_eat, __ATOMIC_ACQUIRE) &&
		   !__atomic_exchange_n(&we.counted, 1, __ATOMIC_ACQ_REL)) {
		/* kick 2: its bit set and kick_seq counted; the signal goes once kick 1's eat_kick() ran */
		wait_count(&we.eaten, 1, 2000);
	}
}

/*
 * Kick 1 ends KVM_RUN; the vCPU thread (SIGUSR1 blocked outside KVM_RUN)
 * waits out the kickers and is held before eat_kick() while a second sync
 * charges the pages the guest wrote meanwhile and kicks again: kick 2 sets
 * its bit and counts itself, and signals only once the thread went past
 * eat_kick().  Kick 2's signal, pending, ends the next KVM_RUN; its EINTR
 * must be taken as kick 2's too.  When eat_kick() took kick 2's bit with
 * kick 1's, nothing ate that signal and the KVM_RUN after returned -EINTR.
 */
START_TEST(kick_between_wait_and_eat)
{
	struct kvmdirty_vcpu_stats st;
	struct rig g;

	we = (typeof(we)){ .armed = 1 };
	g = ko_setup(false);
	kd_test_hooks_set(NULL, we_point, false);
	rig_sync_consume(&g);
	ck_assert_msg(wait_count(&we.at_eat, 1, 10000), "kick 1's EINTR never reached eat_kick()");
	rig_sync_consume(&g);
	ck_assert_msg(__atomic_load_n(&we.counted, __ATOMIC_ACQUIRE), "the second sync sent no kick");
	ck_assert_ok(kvmdirty_vcpu_stats(ko.v, &st, sizeof(st)));
	ck_assert_msg(st.kicks == 2, "%" PRIu64 " kick(s) sent, not 2", st.kicks);
	ko_finish(&g, "a second kick counted between wait_kickers() and eat_kick() of the first");
}
END_TEST

/* ---- kicks_moved_back_while_forgetting ---- */

static struct {
	struct handoff at_eat, at_forget;
	int kick1_hooked, eat_armed, forget_armed;
} mb = { .at_eat = HANDOFF_INIT, .at_forget = HANDOFF_INIT };

static void mb_point(enum kd_hook_point p, void *obj)
{
	if (obj != ko.v)
		return;
	if (p == KD_HOOK_KICK && !__atomic_fetch_add(&mb.kick1_hooked, 1, __ATOMIC_ACQ_REL)) {
		/* kick 1: let the guest write a few dozen pages more for the next sync to charge */
		wait_writes(ko.tv, 0, 30);
	} else if (p == KD_HOOK_EAT_KICK && __atomic_exchange_n(&mb.eat_armed, 0, __ATOMIC_ACQ_REL)) {
		handoff_post(&mb.at_eat);
		handoff_wait_go(&mb.at_eat, 10000);
	} else if (p == KD_HOOK_KICK_FORGET && __atomic_exchange_n(&mb.forget_armed, 0, __ATOMIC_ACQ_REL)) {
		handoff_post(&mb.at_forget);
		handoff_wait_go(&mb.at_forget, 10000);
	}
}

/*
 * Kick 1 goes with SIGUSR1; before the vCPU thread takes its signal the
 * VMM moves kicks to SIGUSR2, so SIGUSR1's bit is to be forgotten once
 * its signal is taken.  Just before it is, the VMM moves kicks back to
 * SIGUSR1, a sync kicks with it (kick 2, its signal pending, blocked), and
 * the VMM moves kicks on to SIGRTMIN.  Forgetting SIGUSR1's bit then
 * drops kick 2's: its signal ends the next KVM_RUN with nothing to eat it
 * by, and the KVM_RUN after returns -EINTR.
 */
START_TEST(kicks_moved_back_while_forgetting)
{
	struct kvmdirty_vcpu_stats st;
	struct rig g;

	mb.kick1_hooked = 0;
	mb.at_eat.posted = mb.at_eat.go = mb.at_forget.posted = mb.at_forget.go = 0;
	__atomic_store_n(&mb.eat_armed, 1, __ATOMIC_RELEASE);
	__atomic_store_n(&mb.forget_armed, 1, __ATOMIC_RELEASE);
	g = ko_setup(true);
	kd_test_hooks_set(NULL, mb_point, false);
	rig_sync_consume(&g); /* kick 1, SIGUSR1 */
	handoff_wait_posted(&mb.at_eat);
	ck_assert_ok(kvmdirty_vm_set_kick_signal(g.tv->vm, SIGUSR2));
	handoff_go(&mb.at_eat);
	handoff_wait_posted(&mb.at_forget);
	ck_assert_ok(kvmdirty_vm_set_kick_signal(g.tv->vm, SIGUSR1));
	rig_sync_consume(&g); /* kick 2, SIGUSR1 */
	ck_assert_ok(kvmdirty_vm_set_kick_signal(g.tv->vm, SIGRTMIN));
	handoff_go(&mb.at_forget);
	ck_assert_ok(kvmdirty_vcpu_stats(ko.v, &st, sizeof(st)));
	ck_assert_msg(st.kicks == 2, "%" PRIu64 " kick(s) sent, not 2", st.kicks);
	ko_finish(&g, "kicks moved back to an old signal, a kick with it, and moved on, as the old one's bit went");
}
END_TEST

int main(void)
{
	int skip = require_kvm("test-throttle-signals");
	Suite *s;
	TCase *tc;

	if (skip)
		return skip; /* before Check allocates anything: no leak on the way out */
	s = suite_create("throttle-signals");
	tc = tcase_create("throttle-signals");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, share_whole_again_while_paused);
	tcase_add_test(tc, share_whole_again_taken);
	tcase_add_test(tc, timer_tid_reused);
#ifndef __SANITIZE_THREAD__
	tcase_add_test(tc, share_whole_races_slice_end);
	tcase_add_test(tc, share_part_races_disarm);
#endif
	tcase_add_test(tc, kick_off_leaks_eintr);
	tcase_add_test(tc, kick_moved_leaks_eintr);
	tcase_add_test(tc, kick_between_wait_and_eat);
	tcase_add_test(tc, kicks_moved_back_while_forgetting);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
