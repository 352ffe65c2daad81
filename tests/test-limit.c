// SPDX-License-Identifier: MIT
/*
 * Per-vCPU dirty accounting and the dirty limit, on the real KVM: a vCPU
 * over its limit is held (the guest's own count of pages written stays
 * within what the limit allows), one under it is not, a limit of 0 turns
 * it off and frees a held vCPU, each harvest is charged to the vCPU that
 * wrote, a kick takes a vCPU over its limit out of KVM_RUN without an
 * exit, a VMM's pause gets a held vCPU back, and a kicker never signals a
 * thread that left.  Every run ends with the copy checked against guest
 * memory: holding a vCPU loses no write.
 *
 * Interleavings forced here (hooks compiled into the test build only):
 * - a harvest kicks a vCPU while its thread leaves kvmdirty_vcpu_run():
 *   the thread waits for the kicker (kick_while_leaving);
 * - the VMM pauses a vCPU while it is held (pause_while_held);
 * - a new limit while a vCPU is held (limit_zero_frees_held).
 */
#include <inttypes.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <linux/kvm.h>

#include "ring-util.h"

#define L_GPA (4 * GIB)
#define L_GPA2 (8 * GIB)

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static struct kvmdirty_vcpu_stats vstats(struct testvm *tv, unsigned int i)
{
	struct kvmdirty_vcpu_stats st;

	ck_assert_ok(kvmdirty_vcpu_stats(tv->vcpu[i], &st, sizeof(st)));
	return st;
}

static void install_kick_handler(void)
{
	struct sigaction sa = { .sa_handler = on_kick };

	/* no SA_RESTART: the signal must end KVM_RUN with EINTR */
	sigaction(SIGUSR1, &sa, NULL);
}

/* Sync and consume every ms until *done or the guest of vCPU i wrote until pages (0: no such end). */
static void sync_while(struct rig *g, unsigned int i, uint64_t until, unsigned int ms, double secs)
{
	double end = now_s() + secs;
	struct guest_vcpu *mb = testvm_mailbox(g->tv, i);

	while (now_s() < end && (!until || mb->writes < until)) {
		rig_sync_consume(g);
		rig_pause_us(ms * 1000);
	}
}

/* Stop the guests, join, and check the copy against memory after a last sync. */
static void finish(struct rig *g, struct runner *r, unsigned int n)
{
	unsigned int i;

	testvm_stop_all(g->tv);
	for (i = 0; i < n; i++)
		runner_join(&r[i]);
	rig_finish(g, "after the last sync");
}

/*
 * A flat-out dirtier under a limit of L pages/s writes at most L a second,
 * give or take a ring (harvested in one piece and charged at once), a ring
 * written while it owed time and not yet charged, and the 10 ms saved: the
 * guest's own count of pages written is held to that.  A second vCPU under
 * the same limit that only computes is never held.
 */
START_TEST(over_limit_held)
{
	const uint64_t limit = 4000, ring = 256;
	struct rig g = ring_rig(2, ring, 0, 0);
	struct kvmdirty_vcpu_stats s0, s1;
	struct kvmdirty_region *ra;
	struct guest_vcpu *mb0;
	struct runner r[2];
	double t0, el;
	uint64_t allowed;
	void *ma;

	ck_assert_ok(testvm_add_memory(g.tv, L_GPA, 2048 * PAGE, 0, &ma, &ra));
	rig_add_copy(&g, ra, false, false);
	rig_work(g.tv, 0, L_GPA, 2048, GUEST_SEQUENTIAL, 0);
	rig_work(g.tv, 1, 0, 1000, GUEST_COMPUTE, 0);
	mb0 = testvm_mailbox(g.tv, 0);
	rig_add_copy(&g, g.tv->sys_region, true, false);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);
	ck_assert_ok(kvmdirty_vcpu_set_dirty_limit(g.tv->vcpu[0], limit));
	ck_assert_ok(kvmdirty_vcpu_set_dirty_limit(g.tv->vcpu[1], limit));
	t0 = now_s();
	runner_start(&r[0], g.tv, 0);
	runner_start(&r[1], g.tv, 1);
	sync_while(&g, 0, 0, 20, 1.0);
	s0 = vstats(g.tv, 0);
	s1 = vstats(g.tv, 1);
	el = now_s() - t0;
	allowed = (uint64_t)(limit * el) + limit / 100 + 3 * ring;
	ck_assert_msg(mb0->writes <= allowed, "dirtier wrote %" PRIu64 " pages in %.3f s, limit %" PRIu64
		      "/s allows %" PRIu64, mb0->writes, el, limit, allowed);
	ck_assert_msg(s0.holds > 0 && s0.held_ns > 0, "dirtier never held (%" PRIu64 " pages)", mb0->writes);
	ck_assert_uint_eq(s0.dirty_limit, limit);
	ck_assert_msg(s1.holds == 0 && s1.held_ns == 0, "the computing vCPU was held %" PRIu64 " times",
		      s1.holds);
	ck_assert_uint_gt(testvm_mailbox(g.tv, 1)->writes, 0);
	/* free the dirtier so that it finishes its pass at once */
	ck_assert_ok(kvmdirty_vcpu_set_dirty_limit(g.tv->vcpu[0], 0));
	finish(&g, r, 2);
}
END_TEST

/* A vCPU thread kept off the CPU, as on a loaded host: the signal's handler sleeps 600 ms. */
static void off_cpu(int sig)
{
	struct timespec ts = { 0, 600 * 1000 * 1000 };

	(void)sig;
	nanosleep(&ts, NULL);
}

/*
 * A vCPU that writes at a quarter of its limit, harvested seldom (every
 * 200 ms, 200 pages at once): never held, whatever the batch.  Once its
 * thread is kept off the CPU for 600 ms (a loaded host): the guest starts
 * its pace again (GUEST_F_PACE_STEADY) instead of writing what it owes flat
 * out, which would be over the limit for a moment and held, rightly.
 */
START_TEST(under_limit_not_held)
{
	const uint64_t limit = 4000, rate = 1000;
	struct rig g = ring_rig(1, 256, 0, 0);
	struct kvmdirty_vcpu_stats s0;
	struct kvmdirty_region *ra;
	struct guest_vcpu *mb0;
	struct runner r;
	void *ma;

	ck_assert_ok(testvm_add_memory(g.tv, L_GPA, 4096 * PAGE, 0, &ma, &ra));
	rig_add_copy(&g, ra, false, false);
	rig_work(g.tv, 0, L_GPA, 4096, GUEST_SEQUENTIAL, 0);
	mb0 = testvm_mailbox(g.tv, 0);
	mb0->tsc_per_page = testvm_tsc_per_page(g.tv, rate);
	ck_assert_uint_gt(mb0->tsc_per_page, 0);
	/* a vCPU thread kept off the CPU (a loaded host) must not catch up flat out: that is over the limit */
	mb0->flags |= GUEST_F_PACE_STEADY;
	rig_add_copy(&g, g.tv->sys_region, true, false);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);
	ck_assert_ok(kvmdirty_vcpu_set_dirty_limit(g.tv->vcpu[0], limit));
	runner_start(&r, g.tv, 0);
	sync_while(&g, 0, 300, 200, 60.0);
	{
		struct sigaction sa = { .sa_handler = off_cpu };

		ck_assert_int_eq(sigaction(SIGUSR2, &sa, NULL), 0);
		ck_assert_int_eq(pthread_kill(r.th, SIGUSR2), 0);
	}
	sync_while(&g, 0, 1200, 200, 60.0);
	s0 = vstats(g.tv, 0);
	ck_assert_uint_ge(mb0->writes, 1200);
	ck_assert_uint_gt(s0.dirtied, 0);
	ck_assert_msg(s0.holds == 0 && s0.held_ns == 0, "held %" PRIu64 " times at a quarter of its limit",
		      s0.holds);
	finish(&g, &r, 1);
}
END_TEST

/*
 * A vCPU held for minutes (limit 1 page/s) stops writing; a changed
 * limit keeps it held for what it owes; setting its limit to 0 lets it
 * go on at once.  A second vCPU with no limit dirties
 * flat out and is never held.
 */
START_TEST(limit_zero_frees_held)
{
	struct rig g = ring_rig(2, 256, 0, 0);
	struct kvmdirty_region *ra, *rb;
	struct guest_vcpu *mb0;
	struct runner r[2];
	uint64_t w;
	void *ma, *mb;
	int i;

	ck_assert_ok(testvm_add_memory(g.tv, L_GPA, 2048 * PAGE, 0, &ma, &ra));
	ck_assert_ok(testvm_add_memory(g.tv, L_GPA2, 2048 * PAGE, 0, &mb, &rb));
	rig_add_copy(&g, ra, false, false);
	rig_add_copy(&g, rb, false, false);
	rig_work(g.tv, 0, L_GPA, 2048, GUEST_SEQUENTIAL, 0);
	rig_work(g.tv, 1, L_GPA2, 2048, GUEST_SEQUENTIAL, 0);
	mb0 = testvm_mailbox(g.tv, 0);
	rig_add_copy(&g, g.tv->sys_region, true, false);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);
	ck_assert_ok(kvmdirty_vcpu_set_dirty_limit(g.tv->vcpu[0], 1));
	runner_start(&r[0], g.tv, 0);
	runner_start(&r[1], g.tv, 1);
	/* the first ring-full exit charges 256 pages: minutes owed */
	for (i = 0; i < 60000 && !vstats(g.tv, 0).holds; i++)
		rig_pause_us(1000);
	ck_assert_msg(vstats(g.tv, 0).holds > 0, "vCPU 0 never held at 1 page/s");
	rig_sync_consume(&g);
	w = mb0->writes;
	rig_pause_us(200000);
	ck_assert_msg(mb0->writes == w, "a held vCPU wrote %" PRIu64 " pages", mb0->writes - w);
	/* a changed limit keeps the debt: at 2 pages/s it still owes minutes */
	ck_assert_ok(kvmdirty_vcpu_set_dirty_limit(g.tv->vcpu[0], 2));
	rig_pause_us(200000);
	ck_assert_msg(mb0->writes == w, "a new limit freed a vCPU that owes minutes (%" PRIu64 " pages on)",
		      mb0->writes - w);
	ck_assert_ok(kvmdirty_vcpu_set_dirty_limit(g.tv->vcpu[0], 0));
	for (i = 0; i < 60000 && mb0->writes < w + 1000; i++)
		rig_pause_us(1000);
	ck_assert_msg(mb0->writes >= w + 1000, "limit 0 did not free the held vCPU (%" PRIu64 " pages on)",
		      mb0->writes - w);
	ck_assert_uint_eq(vstats(g.tv, 0).dirty_limit, 0);
	ck_assert_msg(vstats(g.tv, 1).holds == 0, "vCPU 1 without a limit was held");
	ck_assert_uint_gt(vstats(g.tv, 1).dirtied, 0);
	finish(&g, r, 2);
}
END_TEST

/*
 * Each harvest is charged to the vCPU whose ring held it: two vCPUs
 * writing 1000 and 300 pages once each are charged exactly that, and
 * together the guest's count; a vCPU that only computes dirties nothing
 * and has a rate of 0 while the dirtier's is not.
 */
START_TEST(rates_add_up)
{
	struct rig g = ring_rig(2, 256, 0, 0);
	struct kvmdirty_vcpu_stats s0, s1;
	struct kvmdirty_region *ra, *rb;
	struct kvmdirty_stats st;
	struct runner r[2];
	uint64_t s1_first;
	void *ma, *mb;

	ck_assert_ok(testvm_add_memory(g.tv, L_GPA, 2048 * PAGE, 0, &ma, &ra));
	ck_assert_ok(testvm_add_memory(g.tv, L_GPA2, 2048 * PAGE, 0, &mb, &rb));
	rig_add_copy(&g, ra, false, false);
	rig_add_copy(&g, rb, false, false);
	/* the data regions only: the mailboxes and stacks are not charged */
	ck_assert_ok(kvmdirty_tracker_start(g.t, ra));
	ck_assert_ok(kvmdirty_tracker_start(g.t, rb));
	rig_consume(&g);
	rig_work(g.tv, 0, L_GPA, 1000, GUEST_SEQUENTIAL, GUEST_F_EXIT_EVERY_PASS);
	rig_work(g.tv, 1, L_GPA2, 300, GUEST_SEQUENTIAL, GUEST_F_EXIT_EVERY_PASS);
	rig_run_pass(g.tv, 0);
	rig_run_pass(g.tv, 1);
	rig_sync_consume(&g);
	s0 = vstats(g.tv, 0);
	s1 = vstats(g.tv, 1);
	st = stats(g.t);
	/* a page's tag is two stores: a ring-full exit between them makes a second entry */
	ck_assert_msg(s0.dirtied >= 1000 && s0.dirtied <= 1000 + s0.ring_full_exits,
		      "vCPU 0 charged %" PRIu64 " entries for 1000 pages (%" PRIu64 " ring-full exits)",
		      s0.dirtied, s0.ring_full_exits);
	ck_assert_msg(s1.dirtied >= 300 && s1.dirtied <= 300 + s1.ring_full_exits,
		      "vCPU 1 charged %" PRIu64 " entries for 300 pages (%" PRIu64 " ring-full exits)",
		      s1.dirtied, s1.ring_full_exits);
	ck_assert_uint_gt(s0.ring_full_exits, 0);
	ck_assert_uint_eq(st.ring_harvested, s0.dirtied + s1.dirtied);
	rig_expect_fresh(&g, "one pass each");
	s1_first = s1.dirtied;

	/* then vCPU 0 dirties flat out and vCPU 1 computes: rates over one shared window */
	rig_work(g.tv, 0, L_GPA, 2048, GUEST_SEQUENTIAL, 0);
	rig_work(g.tv, 1, 0, 1000, GUEST_COMPUTE, 0);
	runner_start(&r[0], g.tv, 0);
	runner_start(&r[1], g.tv, 1);
	sync_while(&g, 0, 0, 10, 0.5);
	s0 = vstats(g.tv, 0);
	s1 = vstats(g.tv, 1);
	ck_assert_msg(s0.dirty_rate > 0, "dirtier's rate 0 after %" PRIu64 " pages", s0.dirtied);
	ck_assert_uint_eq(s1.dirty_rate, 0);
	ck_assert_uint_eq(vstats(g.tv, 1).dirtied, s1_first);
	finish(&g, r, 2);
}
END_TEST

/*
 * A ring of 4096 entries that the reaper drains every 5 ms never fills,
 * so a vCPU writing at three times its limit never exits: only a kick
 * holds it (loop 0); without a kick signal it is not held (loop 1, the
 * documented limit of exits alone).
 */
START_TEST(kick_holds_vcpu_in_kvm_run)
{
	const uint64_t limit = 1000;
	struct rig g = ring_rig(1, 4096, 5, 0);
	struct kvmdirty_vcpu_stats s0;
	struct kvmdirty_region *ra;
	struct guest_vcpu *mb0;
	struct runner r;
	void *ma;
	int i;

	install_kick_handler();
	if (_i == 0)
		ck_assert_ok(kvmdirty_vm_set_kick_signal(g.tv->vm, SIGUSR1));
	ck_assert_ok(testvm_add_memory(g.tv, L_GPA, 4096 * PAGE, 0, &ma, &ra));
	rig_add_copy(&g, ra, false, false);
	rig_work(g.tv, 0, L_GPA, 4096, GUEST_SEQUENTIAL, 0);
	mb0 = testvm_mailbox(g.tv, 0);
	mb0->tsc_per_page = testvm_tsc_per_page(g.tv, 3 * limit);
	rig_add_copy(&g, g.tv->sys_region, true, false);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);
	ck_assert_ok(kvmdirty_vcpu_set_dirty_limit(g.tv->vcpu[0], limit));
	runner_start(&r, g.tv, 0);
	if (_i == 0) {
		for (i = 0; i < 60000 && !vstats(g.tv, 0).holds; i++)
			rig_pause_us(1000);
		s0 = vstats(g.tv, 0);
		ck_assert_msg(s0.holds > 0 && s0.kicks > 0, "holds %" PRIu64 " kicks %" PRIu64, s0.holds,
			      s0.kicks);
		ck_assert_uint_eq(s0.ring_full_exits, 0);
	} else {
		for (i = 0; i < 60000 && mb0->writes < 2 * limit; i++)
			rig_pause_us(1000);
		s0 = vstats(g.tv, 0);
		ck_assert_uint_ge(mb0->writes, 2 * limit);
		ck_assert_uint_eq(s0.ring_full_exits, 0);
		ck_assert_uint_eq(s0.kicks, 0);
		ck_assert_uint_eq(s0.holds, 0);
	}
	ck_assert_ok(kvmdirty_vcpu_set_dirty_limit(g.tv->vcpu[0], 0));
	finish(&g, &r, 1);
}
END_TEST

/*
 * The VMM pauses a vCPU held for minutes (immediate_exit and its signal):
 * kvmdirty_vcpu_run() returns -EINTR and the thread parks; resumed, the
 * vCPU is held again for what it still owes.
 */
START_TEST(pause_while_held)
{
	struct rig g = ring_rig(1, 256, 0, 0);
	struct kvmdirty_region *ra;
	struct guest_vcpu *mb0;
	uint64_t w, holds;
	void *ma;
	int i;

	ck_assert_ok(testvm_add_memory(g.tv, L_GPA, 2048 * PAGE, 0, &ma, &ra));
	rig_add_copy(&g, ra, false, false);
	rig_work(g.tv, 0, L_GPA, 2048, GUEST_SEQUENTIAL, 0);
	mb0 = testvm_mailbox(g.tv, 0);
	rig_add_copy(&g, g.tv->sys_region, true, false);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);
	ck_assert_ok(kvmdirty_vcpu_set_dirty_limit(g.tv->vcpu[0], 1));
	ck_assert_ok(testvm_spawn(g.tv));
	for (i = 0; i < 60000 && !vstats(g.tv, 0).holds; i++)
		rig_pause_us(1000);
	holds = vstats(g.tv, 0).holds;
	ck_assert_uint_gt(holds, 0);
	/* returns only once the held thread came out and parked */
	testvm_pause_all(g.tv);
	w = mb0->writes;
	rig_sync_consume(&g);
	rig_expect_fresh(&g, "paused while held");
	testvm_resume_all(g.tv);
	for (i = 0; i < 60000 && vstats(g.tv, 0).holds == holds; i++)
		rig_pause_us(1000);
	ck_assert_msg(vstats(g.tv, 0).holds > holds, "resumed, the vCPU that owes minutes was not held");
	ck_assert_uint_eq(mb0->writes, w);
	ck_assert_ok(kvmdirty_vcpu_set_dirty_limit(g.tv->vcpu[0], 0));
	testvm_stop_all(g.tv);
	ck_assert_ok(testvm_join(g.tv, NULL, NULL));
	rig_finish(&g, "after the last sync");
}
END_TEST

/*
 * A sync kicks a vCPU over its limit while the VMM takes that vCPU out
 * of KVM_RUN for good: held at the kick (after the kicker saw the thread
 * in kvmdirty_vcpu_run()), the thread leaves, and must still be inside
 * kvmdirty_vcpu_run() until the kicker is done with it, never exited and
 * joined under a signal aimed at it.
 */
static struct {
	struct runner *r;
	struct kvmdirty_vcpu *v;
	int seen, left_early, saw_out;
} f7;

static void f7_point(enum kd_hook_point p, void *obj)
{
	int i;

	if (p != KD_HOOK_KICK || obj != f7.v || f7.seen++)
		return;
	runner_kick(f7.r);
	for (i = 0; i < 10000 && __atomic_load_n(&f7.v->in_run, __ATOMIC_SEQ_CST); i++)
		rig_pause_us(1000);
	f7.saw_out = !__atomic_load_n(&f7.v->in_run, __ATOMIC_SEQ_CST);
	rig_pause_us(100000);
	f7.left_early = __atomic_load_n(&f7.r->done, __ATOMIC_ACQUIRE);
}

START_TEST(kick_while_leaving)
{
	struct rig g = ring_rig(1, 4096, 0, 0);
	struct kvmdirty_region *ra;
	struct guest_vcpu *mb0;
	struct runner r;
	void *ma;
	int i;

	install_kick_handler();
	ck_assert_ok(kvmdirty_vm_set_kick_signal(g.tv->vm, SIGUSR1));
	ck_assert_ok(testvm_add_memory(g.tv, L_GPA, 4096 * PAGE, 0, &ma, &ra));
	rig_add_copy(&g, ra, false, false);
	rig_work(g.tv, 0, L_GPA, 4096, GUEST_SEQUENTIAL, 0);
	mb0 = testvm_mailbox(g.tv, 0);
	mb0->tsc_per_page = testvm_tsc_per_page(g.tv, 2000);
	rig_add_copy(&g, g.tv->sys_region, true, false);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);
	ck_assert_ok(kvmdirty_vcpu_set_dirty_limit(g.tv->vcpu[0], 10));
	f7 = (typeof(f7)){ .r = &r, .v = g.tv->vcpu[0] };
	kd_test_hooks_set(NULL, f7_point, false);
	runner_start(&r, g.tv, 0);
	/* a few dozen pages at 10 pages/s: the sync's charge puts it seconds in debt and kicks */
	for (i = 0; i < 600 && !f7.seen; i++) {
		rig_pause_us(50000);
		rig_sync_consume(&g);
	}
	hooks_off();
	ck_assert_msg(f7.seen, "no kick in 30 s");
	ck_assert_msg(f7.saw_out, "the vCPU thread did not leave kvmdirty_vcpu_run()");
	ck_assert_msg(!f7.left_early, "the vCPU thread returned while a kicker was about to signal it");
	pthread_join(r.th, NULL);
	ck_assert_int_eq(r.ret, -EINTR);
	rig_finish(&g, "after the last sync");
}
END_TEST

/*
 * The bitmap modes cannot say whose write a dirty bit is; KVM's per-vCPU
 * fault count can: after tracking starts, a vCPU writing 1000 pages takes
 * a fault for each, one that computes takes next to none.
 */
START_TEST(faults_per_vcpu)
{
	struct testvm_opts o = { .nr_vcpus = 2, .track = true,
				 .track_opts = { .mode = _i ? KVMDIRTY_MODE_DIRTY_LOG : KVMDIRTY_MODE_CLEAR_LOG } };
	struct rig g = { 0 };
	struct kvmdirty_vcpu_stats a0, a1, b0, b1;
	struct kvmdirty_region *ra;
	void *ma;

	hooks_off();
	ck_assert_ok(testvm_new(&o, &g.tv));
	g.t = g.tv->tracker;
	ck_assert_ok(testvm_add_memory(g.tv, L_GPA, 2048 * PAGE, 0, &ma, &ra));
	rig_add_copy(&g, ra, false, false);
	rig_add_copy(&g, g.tv->sys_region, true, false);
	/* a first pass each faults memory in; tracking starts after it */
	rig_work(g.tv, 0, L_GPA, 1000, GUEST_SEQUENTIAL, GUEST_F_EXIT_EVERY_PASS);
	rig_work(g.tv, 1, 0, 1000, GUEST_COMPUTE, GUEST_F_EXIT_EVERY_PASS);
	rig_run_pass(g.tv, 0);
	rig_run_pass(g.tv, 1);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);
	a0 = vstats(g.tv, 0);
	a1 = vstats(g.tv, 1);
	ck_assert_msg(a0.faults > 0, "no fault counted for a vCPU that faulted 1000 pages in");
	rig_run_pass(g.tv, 0);
	rig_run_pass(g.tv, 1);
	b0 = vstats(g.tv, 0);
	b1 = vstats(g.tv, 1);
	ck_assert_msg(b0.faults - a0.faults >= 1000, "writer: %" PRIu64 " faults for 1000 protected pages",
		      b0.faults - a0.faults);
	ck_assert_msg(b1.faults - a1.faults < 16, "computing vCPU: %" PRIu64 " faults", b1.faults - a1.faults);
	ck_assert_uint_eq(b0.dirtied, 0);
	rig_finish(&g, "after the last sync");
}
END_TEST

/*
 * The test VMM's run share, the bitmap modes' throttle: a vCPU at a
 * quarter of each period sits out the rest, the other never; the writer
 * kept out loses no write.
 */
START_TEST(run_share)
{
	struct testvm_opts o = { .nr_vcpus = 2, .track = true, .track_opts = { .mode = KVMDIRTY_MODE_CLEAR_LOG } };
	struct rig g = { 0 };
	struct kvmdirty_region *ra;
	void *ma;
	int i;

	hooks_off();
	ck_assert_ok(testvm_new(&o, &g.tv));
	g.t = g.tv->tracker;
	ck_assert_ok(testvm_add_memory(g.tv, L_GPA, 2048 * PAGE, 0, &ma, &ra));
	rig_add_copy(&g, ra, false, false);
	rig_add_copy(&g, g.tv->sys_region, true, false);
	rig_work(g.tv, 0, L_GPA, 2048, GUEST_SEQUENTIAL, 0);
	rig_work(g.tv, 1, 0, 1000, GUEST_COMPUTE, 0);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);
	ck_assert_ok(testvm_spawn(g.tv));
	ck_assert_errno(testvm_set_run_share(g.tv, 0, 1001), EINVAL);
	ck_assert_errno(testvm_set_run_share(g.tv, 2, 250), EINVAL);
	ck_assert_ok(testvm_set_run_share(g.tv, 0, 250));
	for (i = 0; i < 20; i++) {
		rig_pause_us(20000);
		rig_sync_consume(&g);
	}
	ck_assert_msg(testvm_out_ns(g.tv, 0) > 0, "a vCPU at a run share of 250 was never kept out");
	ck_assert_uint_eq(testvm_out_ns(g.tv, 1), 0);
	testvm_stop_all(g.tv);
	ck_assert_ok(testvm_join(g.tv, NULL, NULL));
	rig_finish(&g, "after the last sync");
}
END_TEST

static void nop_handler(int sig)
{
	(void)sig;
}

static void install_nop(int sig)
{
	struct sigaction sa = { .sa_handler = nop_handler };

	/* no SA_RESTART, as the header asks */
	sigaction(sig, &sa, NULL);
}

/* The exit's port, or 0 for an exit that is not one of the guest's OUTs. */
static uint16_t exit_port(struct kvm_run *run)
{
	if (run->exit_reason != KVM_EXIT_IO || run->io.direction != KVM_EXIT_IO_OUT)
		return 0;
	return run->io.port;
}

/*
 * A vCPU thread with the kick signal blocked in user space and unblocked
 * only inside KVM_RUN (KVM_SET_SIGNAL_MASK, as QEMU did before
 * immediate_exit), so that a signal never interrupts the VMM's own code;
 * after an -EINTR it eats the pending signal (sigtimedwait).  It counts the -EINTRs
 * kvmdirty_vcpu_run() returns although immediate_exit is clear (nobody
 * but the library signals it in this test).
 */
static struct {
	struct testvm *tv;
	struct handoff h;
	int hooked;
	int eintr_no_ie;
	int ret;
	pthread_t th;
} e2;

static void *e2_thread(void *p)
{
	struct kvmdirty_vcpu *v = e2.tv->vcpu[0];
	struct kvm_run *run = kvmdirty_vcpu_kvm_run(v);
	struct {
		struct kvm_signal_mask m;
		uint8_t set[8];
	} km = { .m = { .len = 8 } };
	sigset_t set;
	int r;

	(void)p;
	sigemptyset(&set);
	sigaddset(&set, SIGUSR1);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	/* inside KVM_RUN nothing is blocked */
	if (ioctl(kvmdirty_vcpu_fd(v), KVM_SET_SIGNAL_MASK, &km) < 0) {
		e2.ret = -errno;
		return NULL;
	}
	for (;;) {
		r = kvmdirty_vcpu_run(v);
		if (r == -EINTR) {
			struct timespec zero = { 0, 0 };

			if (!__atomic_load_n(&run->immediate_exit, __ATOMIC_RELAXED))
				e2.eintr_no_ie++;
			/* the signal stays pending (blocked here): eat it, as such VMMs do */
			while (sigtimedwait(&set, NULL, &zero) > 0)
				;
			continue;
		}
		if (r < 0) {
			e2.ret = r;
			break;
		}
		if (exit_port(run) == GUEST_PORT_PASS || exit_port(run) == GUEST_PORT_TICK)
			continue;
		e2.ret = exit_port(run) == GUEST_PORT_DONE ? 0 : -EIO;
		break;
	}
	return NULL;
}

static void e2_point(enum kd_hook_point p, void *obj)
{
	if (p != KD_HOOK_RING_FULL || obj != e2.tv->vcpu[0] || e2.hooked++)
		return;
	handoff_post(&e2.h);
	handoff_wait_go(&e2.h, 30000);
}

/*
 * Header: "an EINTR of the library's own kick (kvmdirty_vm_set_kick_signal())
 * without immediate_exit is not returned".  The library tells its kick
 * from others by kick_seq moving during the KVM_RUN; a kick sent while
 * the thread is in the library but out of KVM_RUN (here: handling a
 * ring-full exit, while a sync charges the vCPU) is pending when the
 * thread loads kick_seen, and the next KVM_RUN's -EINTR is returned to
 * the VMM as if the VMM had kicked (lib/vcpu.c run_loop(), the
 * kick_seq != kick_seen test).
 */
START_TEST(own_kick_eintr_not_returned)
{
	struct rig g = ring_rig(1, 256, 0, 0);
	struct kvmdirty_region *ra;
	struct kvmdirty_vcpu_stats st;
	void *ma;

	install_nop(SIGUSR1);
	ck_assert_ok(kvmdirty_vm_set_kick_signal(g.tv->vm, SIGUSR1));
	ck_assert_ok(testvm_add_memory(g.tv, L_GPA, 2048 * PAGE, 0, &ma, &ra));
	rig_add_copy(&g, ra, false, false);
	rig_add_copy(&g, g.tv->sys_region, true, false);
	rig_work(g.tv, 0, L_GPA, 2048, GUEST_SEQUENTIAL, 0);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);
	e2 = (typeof(e2)){ .tv = g.tv, .h = HANDOFF_INIT };
	kd_test_hooks_set(NULL, e2_point, false);
	ck_assert_int_eq(pthread_create(&e2.th, NULL, e2_thread, NULL), 0);
	/* the vCPU's first ring-full exit, nothing taken yet */
	handoff_wait_posted(&e2.h);
	/* a sync charges its full ring at 1 page/s: in debt, kicked */
	ck_assert_ok(kvmdirty_vcpu_set_dirty_limit(g.tv->vcpu[0], 1));
	rig_sync_consume(&g);
	st = vstats(g.tv, 0);
	ck_assert_uint_eq(st.kicks, 1);
	/* the VMM lifts the limit: the vCPU goes on */
	ck_assert_ok(kvmdirty_vcpu_set_dirty_limit(g.tv->vcpu[0], 0));
	hooks_off();
	handoff_go(&e2.h);
	rig_pause_us(200000);
	testvm_stop_all(g.tv);
	pthread_join(e2.th, NULL);
	ck_assert_msg(e2.ret == 0, "vCPU thread: %s", strerror(-e2.ret));
	ck_assert_msg(e2.eintr_no_ie == 0,
		      "kvmdirty_vcpu_run() returned -EINTR %d time(s) with immediate_exit clear; the only "
		      "signal sent was the library's own kick (kicks %" PRIu64 ")",
		      e2.eintr_no_ie, st.kicks);
	rig_finish(&g, "after the last sync");
}
END_TEST

/*
 * kvmdirty_vm_set_kick_signal(vm, 0) must not return while a harvest that
 * read the old signal is about to send it, nor may a kick be sent after
 * it returned (a VMM may then give the signal another use).  Forced with
 * KD_HOOK_KICK: a sync on another thread is held in kick() after it read
 * the signal while the VMM turns kicks off; the vCPU stays in debt and
 * syncs go on after.
 */
static struct {
	struct rig *g;
	struct kvmdirty_vcpu *v;
	struct kvmdirty_vm *vm;
	struct handoff h;
	int hooked, stop, set_done, set_ret;
	pthread_t th, setter;
} e3;

static void *e3_set_off(void *p)
{
	(void)p;
	e3.set_ret = kvmdirty_vm_set_kick_signal(e3.vm, 0);
	__atomic_store_n(&e3.set_done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static void e3_point(enum kd_hook_point p, void *obj)
{
	if (p != KD_HOOK_KICK || obj != e3.v || e3.hooked++)
		return;
	handoff_post(&e3.h);
	handoff_wait_go(&e3.h, 30000);
}

static void *e3_syncer(void *p)
{
	(void)p;
	while (!__atomic_load_n(&e3.stop, __ATOMIC_ACQUIRE)) {
		kvmdirty_tracker_sync(e3.g->t);
		rig_pause_us(20000);
	}
	return NULL;
}

START_TEST(kick_signal_off_is_off)
{
	struct rig g = ring_rig(1, 4096, 0, 0);
	struct kvmdirty_region *ra;
	struct guest_vcpu *mb0;
	struct runner r;
	uint64_t kicks;
	void *ma;

	install_nop(SIGUSR1);
	ck_assert_ok(kvmdirty_vm_set_kick_signal(g.tv->vm, SIGUSR1));
	ck_assert_ok(testvm_add_memory(g.tv, L_GPA, 4096 * PAGE, 0, &ma, &ra));
	rig_add_copy(&g, ra, false, false);
	rig_add_copy(&g, g.tv->sys_region, true, false);
	rig_work(g.tv, 0, L_GPA, 4096, GUEST_SEQUENTIAL, 0);
	mb0 = testvm_mailbox(g.tv, 0);
	mb0->tsc_per_page = testvm_tsc_per_page(g.tv, 2000);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);
	ck_assert_ok(kvmdirty_vcpu_set_dirty_limit(g.tv->vcpu[0], 10));
	e3 = (typeof(e3)){ .g = &g, .v = g.tv->vcpu[0], .h = HANDOFF_INIT };
	kd_test_hooks_set(NULL, e3_point, false);
	runner_start(&r, g.tv, 0);
	ck_assert_int_eq(pthread_create(&e3.th, NULL, e3_syncer, NULL), 0);
	handoff_wait_posted(&e3.h);
	/* the VMM turns kicks off: the call waits for the kick under way */
	e3.vm = g.tv->vm;
	ck_assert_int_eq(pthread_create(&e3.setter, NULL, e3_set_off, NULL), 0);
	rig_pause_us(200000);
	ck_assert_msg(!__atomic_load_n(&e3.set_done, __ATOMIC_ACQUIRE),
		      "kicks turned off while a kick with the old signal was under way");
	hooks_off();
	handoff_go(&e3.h);
	pthread_join(e3.setter, NULL);
	ck_assert_int_eq(e3.set_ret, 0);
	kicks = vstats(g.tv, 0).kicks;
	ck_assert_uint_eq(kicks, 1);
	/* seconds in debt, synced every 20 ms: no kick once they are off */
	rig_pause_us(300000);
	__atomic_store_n(&e3.stop, 1, __ATOMIC_RELEASE);
	pthread_join(e3.th, NULL);
	ck_assert_uint_eq(vstats(g.tv, 0).kicks, kicks);
	ck_assert_ok(kvmdirty_vcpu_set_dirty_limit(g.tv->vcpu[0], 0));
	testvm_stop_all(g.tv);
	runner_join(&r);
	rig_finish(&g, "after the last sync");
}
END_TEST

/*
 * What kvmdirty_vcpu_run() returns is KVM_RUN's errno, whatever runs
 * between the call and the library's look at it: here a signal handler
 * of the VMM's that does not keep errno (the test build's hook at the
 * point, on the vCPU's thread) sets it to EAGAIN as KVM_RUN fails with
 * EINTR (immediate_exit set).  Read after such a handler, the VMM would
 * be told -EAGAIN.
 */
static void clobber_errno(enum kd_hook_point p, void *obj)
{
	(void)obj;
	if (p == KD_HOOK_RUN_FAILED)
		errno = EAGAIN;
}

START_TEST(run_keeps_kvm_errno)
{
	struct rig g = ring_rig(1, 256, 0, 0);
	struct kvm_run *run = kvmdirty_vcpu_kvm_run(g.tv->vcpu[0]);
	int ret;

	__atomic_store_n(&run->immediate_exit, 1, __ATOMIC_RELAXED);
	kd_test_hooks_set(NULL, clobber_errno, false);
	ret = kvmdirty_vcpu_run(g.tv->vcpu[0]);
	hooks_off();
	ck_assert_msg(ret == -EINTR, "kvmdirty_vcpu_run() with immediate_exit set: %d (%s), not -EINTR", ret,
		      strerror(-ret));
	testvm_free(g.tv);
}
END_TEST

START_TEST(errors)
{
	struct testvm_opts o = { .nr_vcpus = 1, .track = true,
				 .track_opts = { .mode = KVMDIRTY_MODE_CLEAR_LOG } };
	struct kvmdirty_vcpu_stats st;
	struct rig g = ring_rig(1, 256, 0, 0);
	struct testvm *tv;
	int unused = SIGRTMIN + 3;

	ck_assert_errno(kvmdirty_vcpu_set_dirty_limit(NULL, 1), EINVAL);
	ck_assert_errno(kvmdirty_vcpu_set_dirty_limit(g.tv->vcpu[0], (1ull << 32) + 1), EINVAL);
	ck_assert_ok(kvmdirty_vcpu_set_dirty_limit(g.tv->vcpu[0], 1ull << 32));
	ck_assert_errno(kvmdirty_vcpu_stats(NULL, &st, sizeof(st)), EINVAL);
	ck_assert_errno(kvmdirty_vcpu_stats(g.tv->vcpu[0], NULL, sizeof(st)), EINVAL);
	ck_assert_errno(kvmdirty_vcpu_stats(g.tv->vcpu[0], &st, 0), EINVAL);
	/* a short size writes only what it covers */
	memset(&st, 0xa5, sizeof(st));
	ck_assert_ok(kvmdirty_vcpu_stats(g.tv->vcpu[0], &st, sizeof(uint64_t)));
	ck_assert_uint_eq(st.dirtied, 0);
	ck_assert_uint_eq(st.dirty_rate, 0xa5a5a5a5a5a5a5a5ull);
	ck_assert_errno(kvmdirty_vm_set_kick_signal(NULL, SIGUSR1), EINVAL);
	ck_assert_errno(kvmdirty_vm_set_kick_signal(g.tv->vm, -1), EINVAL);
	ck_assert_errno(kvmdirty_vm_set_kick_signal(g.tv->vm, 4096), EINVAL);
	signal(unused, SIG_DFL);
	ck_assert_errno(kvmdirty_vm_set_kick_signal(g.tv->vm, unused), EINVAL);
	signal(unused, SIG_IGN);
	ck_assert_errno(kvmdirty_vm_set_kick_signal(g.tv->vm, unused), EINVAL);
	ck_assert_errno(kvmdirty_vm_set_kick_signal(g.tv->vm, SIGKILL), EINVAL);
	install_kick_handler();
	ck_assert_ok(kvmdirty_vm_set_kick_signal(g.tv->vm, SIGUSR1));
	ck_assert_ok(kvmdirty_vm_set_kick_signal(g.tv->vm, 0));
	testvm_free(g.tv);

	/* no dirty ring: no limit */
	ck_assert_ok(testvm_new(&o, &tv));
	ck_assert_errno(kvmdirty_vcpu_set_dirty_limit(tv->vcpu[0], 100), EOPNOTSUPP);
	ck_assert_errno(kvmdirty_vcpu_set_dirty_limit(tv->vcpu[0], 0), EOPNOTSUPP);
	ck_assert_ok(kvmdirty_vcpu_stats(tv->vcpu[0], &st, sizeof(st)));
	ck_assert_uint_eq(st.dirtied, 0);
	ck_assert_uint_eq(st.dirty_limit, 0);
	testvm_free(tv);
}
END_TEST

int main(void)
{
	int skip = require_kvm("test-limit");
	Suite *s;
	TCase *tc;

	if (skip)
		return skip; /* before Check allocates anything: no leak on the way out */
	s = suite_create("limit");
	tc = tcase_create("limit");
	tcase_set_timeout(tc, 240);
	tcase_add_test(tc, errors);
	tcase_add_test(tc, run_keeps_kvm_errno);
	tcase_add_test(tc, over_limit_held);
	tcase_add_test(tc, under_limit_not_held);
	tcase_add_test(tc, limit_zero_frees_held);
	tcase_add_test(tc, rates_add_up);
	tcase_add_loop_test(tc, kick_holds_vcpu_in_kvm_run, 0, 2);
	tcase_add_test(tc, pause_while_held);
	tcase_add_test(tc, kick_while_leaving);
	tcase_add_loop_test(tc, faults_per_vcpu, 0, 2);
	tcase_add_test(tc, run_share);
	tcase_add_test(tc, own_kick_eintr_not_returned);
	tcase_add_test(tc, kick_signal_off_is_off);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
