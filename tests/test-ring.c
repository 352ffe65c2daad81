// SPDX-License-Identifier: MIT
/*
 * The dirty ring under the interleavings that matter, each forced with the
 * test build's hooks (lib/hooks.h) and judged by guest page contents:
 *
 *   a sync harvests between a vCPU's ring-full exit and its handler;
 *   a sync runs while a ring-full handler has ghost entries marked;
 *   a sync runs while a ring-full exit, the reaper or a vCPU being freed
 *     holds entries it harvested and has not reset yet;
 *   entries lost to an overflow, then native writes to their pages;
 *   the tracker freed while a vCPU fills its ring.
 */
#include <pthread.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <linux/kvm.h>

#include "ring-util.h"

/* What the hook callback looks at; one test at a time. */
static struct {
	enum kd_hook_point point;
	const void *obj;       /* only this object (ring or vCPU), NULL: any */
	bool on_thread;	       /* only on this thread */
	pthread_t thread;
	int times;	       /* how many more times to act */
	struct handoff *h;
	unsigned int bound_ms; /* 0: wait for go without bound */
	int abandon;	       /* a failing test lets held threads go */
	int hits;
	bool turnstile;	       /* every time: wait until the main thread took its turn */
} hold;

/* The turnstile: a held thread asks for a turn and waits until it was taken. */
static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int asked, taken, done;
} turn = { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0, 0 };

static void turn_ask(void)
{
	int n;

	pthread_mutex_lock(&turn.lock);
	n = ++turn.asked;
	pthread_cond_broadcast(&turn.cond);
	while (turn.taken < n && !__atomic_load_n(&hold.abandon, __ATOMIC_ACQUIRE))
		pthread_cond_wait(&turn.cond, &turn.lock);
	pthread_mutex_unlock(&turn.lock);
}

/* Wait for a turn to take; false once done is set and none is asked. */
static bool turn_wait(void)
{
	bool ok;

	pthread_mutex_lock(&turn.lock);
	while (turn.asked == turn.taken && !turn.done)
		pthread_cond_wait(&turn.cond, &turn.lock);
	ok = turn.asked > turn.taken;
	pthread_mutex_unlock(&turn.lock);
	return ok;
}

static void turn_taken(void)
{
	pthread_mutex_lock(&turn.lock);
	turn.taken = turn.asked;
	pthread_cond_broadcast(&turn.cond);
	pthread_mutex_unlock(&turn.lock);
}

static void turn_done(void)
{
	pthread_mutex_lock(&turn.lock);
	turn.done = 1;
	pthread_cond_broadcast(&turn.cond);
	pthread_mutex_unlock(&turn.lock);
}

static void hold_point(enum kd_hook_point p, void *obj)
{
	if (p != hold.point || (hold.obj && hold.obj != obj) || __atomic_load_n(&hold.abandon, __ATOMIC_ACQUIRE) ||
	    (__atomic_load_n(&hold.on_thread, __ATOMIC_ACQUIRE) && !pthread_equal(hold.thread, pthread_self())))
		return;
	if (__atomic_fetch_sub(&hold.times, 1, __ATOMIC_ACQ_REL) <= 0)
		return;
	__atomic_fetch_add(&hold.hits, 1, __ATOMIC_RELAXED);
	if (hold.turnstile) {
		turn_ask();
		return;
	}
	handoff_post(hold.h);
	handoff_wait_go(hold.h, hold.bound_ms);
}

static void hold_set(enum kd_hook_point p, const void *obj, int times, struct handoff *h, unsigned int bound_ms)
{
	memset(&hold, 0, sizeof(hold));
	hold.point = p;
	hold.obj = obj;
	hold.times = times;
	hold.h = h;
	hold.bound_ms = bound_ms;
	kd_test_hooks_set(NULL, hold_point, false);
}

/*
 * Issue: recovery used to mark every zero entry RESET, free ones too, when
 * a sync took the ring between a ring-full exit and its handler; KVM's
 * reset then ran past its write position and the vCPU exited ring-full on
 * every entry.  Here every ring-full exit waits while the main thread
 * syncs: the handler finds the ring empty, and must leave it alone.
 */
START_TEST(sync_between_ring_full_and_handler)
{
	uint64_t pages = 16384, passes = 4, bound;
	struct rig g = ring_rig(1, 4096, 0, 0);
	struct kvmdirty_stats st;
	struct kvmdirty_region *r;
	struct runner vcpu;
	int syncs = 0;
	void *mem;

	ck_assert_ok(testvm_add_memory(g.tv, 4 * GIB, pages * PAGE, 0, &mem, &r));
	rig_add_copy(&g, g.tv->sys_region, true, false);
	rig_add_copy(&g, r, false, false);
	rig_work(g.tv, 0, 4 * GIB, pages, GUEST_SEQUENTIAL, GUEST_F_CHECK);
	testvm_mailbox(g.tv, 0)->until_pass = passes;
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);
	hold_set(KD_HOOK_RING_FULL, g.tv->vcpu[0], 1 << 30, NULL, 0);
	hold.turnstile = true;
	turn.asked = turn.taken = turn.done = 0;
	runner_start_cb(&vcpu, g.tv, 0, turn_done);
	/* each pass fills the ring about pages / 4032 times; many more exits mean a ring gone wrong */
	bound = 10 * passes * (pages / 4032 + 1);
	while (turn_wait()) {
		rig_sync_consume(&g);
		syncs++;
		st = stats(g.t);
		if (st.ring_full_exits > bound) {
			/* the ring went wrong: let the vCPU go and take it out of KVM_RUN; the checks fail */
			__atomic_store_n(&hold.abandon, 1, __ATOMIC_RELEASE);
			turn_taken();
			runner_kick(&vcpu);
			break;
		}
		turn_taken();
	}
	runner_join(&vcpu);
	hooks_off();
	rig_sync_consume(&g);
	st = stats(g.t);
	printf("sync between ring-full exit and handler: %d times, %" PRIu64 " full exits, %" PRIu64 " recoveries, %" PRIu64
	       " overflows\n",
	       syncs, st.ring_full_exits, st.ring_recoveries, st.ring_overflows);
	ck_assert_msg(st.ring_full_exits <= bound, "%" PRIu64 " ring-full exits for %" PRIu64 " passes of %" PRIu64
		      " pages: the ring went wrong", st.ring_full_exits, passes, pages);
	ck_assert_int_gt(syncs, 0);
	ck_assert_uint_eq(testvm_mailbox(g.tv, 0)->pass, passes);
	ck_assert_msg(!st.ring_recoveries && !st.ring_overflows, "%" PRIu64 " recoveries, %" PRIu64
		      " overflows: nothing was lost", st.ring_recoveries, st.ring_overflows);
	rig_expect_fresh(&g, "sync between ring-full exit and handler");
	testvm_free(g.tv);
	testvm_unmap(mem, pages * PAGE);
	rig_free(&g);
}
END_TEST

/*
 * A ring-0 guest overflows the ring (this host's KVM pushes past it) and
 * its ring-full handler marks ghost entries; at that moment the main
 * thread syncs, which harvests and resets too.  The sync must wait until
 * the handler's own reset is done (otherwise its reset takes the marked
 * ghosts and the handler's count of KVM's reset index goes wrong); the
 * guest must run on and nothing may go stale.
 */
static void *sync_main(void *p);

struct sync_thread {
	struct rig *g;
	pthread_t th;
	int done;
	int64_t ret;
};

START_TEST(sync_while_ghosts_marked)
{
	uint64_t pages = 16384;
	struct rig g = ring_rig(1, 4096, 0, 1);
	struct handoff h = HANDOFF_INIT;
	struct kvmdirty_stats st;
	struct kvmdirty_region *r;
	struct sync_thread s = { .g = &g };
	struct runner vcpu;
	bool early = false;
	unsigned int i;
	void *mem;

	ck_assert_ok(testvm_add_memory(g.tv, 4 * GIB, pages * PAGE, 0, &mem, &r));
	rig_add_copy(&g, g.tv->sys_region, true, false);
	rig_add_copy(&g, r, false, false);
	rig_work(g.tv, 0, 4 * GIB, pages, GUEST_SEQUENTIAL, GUEST_F_CHECK);
	testvm_mailbox(g.tv, 0)->until_pass = 2;
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);
	hold_set(KD_HOOK_RING_GHOSTS, NULL, 1, &h, 2000);
	runner_start(&vcpu, g.tv, 0);
	hold.thread = vcpu.th;
	__atomic_store_n(&hold.on_thread, true, __ATOMIC_RELEASE);
	/*
	 * No sync until the handler is held: a sync that harvested an
	 * overflowed ring first would recover it itself, and the handler
	 * would have no ghost to mark (under load, when the slow ring-0 guest
	 * fills the ring only between syncs, every time).
	 */
	for (i = 0; i < 100000 && !__atomic_load_n(&vcpu.done, __ATOMIC_ACQUIRE); i++) {
		pthread_mutex_lock(&h.lock);
		if (h.posted && !h.go) {
			pthread_mutex_unlock(&h.lock);
			ck_assert_int_eq(pthread_create(&s.th, NULL, sync_main, &s), 0);
			rig_pause_us(200000);
			early = __atomic_load_n(&s.done, __ATOMIC_ACQUIRE);
			handoff_go(&h);
			pthread_join(s.th, NULL);
			ck_assert_msg(s.ret >= 0, "sync: %s", strerror((int)-s.ret));
			rig_consume(&g);
			continue;
		}
		pthread_mutex_unlock(&h.lock);
		rig_pause_us(1000);
	}
	runner_join(&vcpu);
	hooks_off();
	rig_sync_consume(&g);
	st = stats(g.t);
	printf("sync while ghosts marked: %d times, the sync %s; %" PRIu64 " full exits, %" PRIu64 " overflows, %" PRIu64
	       " recoveries\n",
	       hold.hits, early ? "did not wait" : "waited", st.ring_full_exits, st.ring_overflows, st.ring_recoveries);
	ck_assert_msg(hold.hits > 0, "no ghost entry was marked at a ring-full exit: the interleaving never happened");
	ck_assert_uint_gt(st.ring_overflows, 0);
	rig_expect_fresh(&g, "sync while ghosts marked");
	testvm_free(g.tv);
	testvm_unmap(mem, pages * PAGE);
	rig_free(&g);
}
END_TEST

static void *sync_main(void *p)
{
	struct sync_thread *s = p;

	s->ret = kvmdirty_tracker_sync(s->g->t);
	__atomic_store_n(&s->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

/*
 * The harvester is held after taking vCPU 0's entries, before their reset.
 * A sync starts meanwhile.  If it returns while the harvester is held, its
 * pages are read and vCPU 1 writes them all again: those writes must still
 * be reported, which they are not if the pages were handed out before the
 * reset that re-protects them.  (With the library's lock the sync waits for
 * the harvester instead, and the same steps follow.)
 */
static void sync_while_harvest_held(struct rig *g, struct handoff *h, uint64_t gpa, uint64_t pages)
{
	struct sync_thread s = { .g = g };
	bool returned_early;
	unsigned int i;

	handoff_wait_posted(h);
	ck_assert_int_eq(pthread_create(&s.th, NULL, sync_main, &s), 0);
	for (i = 0; i < 300 && !__atomic_load_n(&s.done, __ATOMIC_ACQUIRE); i++)
		rig_pause_us(1000);
	returned_early = __atomic_load_n(&s.done, __ATOMIC_ACQUIRE);
	if (returned_early) {
		rig_consume(g);
		rig_run_pass(g->tv, 1);
	}
	handoff_go(h);
	pthread_join(s.th, NULL);
	ck_assert_msg(s.ret >= 0, "sync: %s", strerror((int)-s.ret));
	if (!returned_early) {
		rig_consume(g);
		rig_run_pass(g->tv, 1);
	}
	printf("  the sync %s the harvester's reset\n", returned_early ? "returned before" : "waited for");
	(void)gpa;
	(void)pages;
}

enum harvester { BY_RING_FULL, BY_REAPER, BY_VCPU_FREE };

static void *free_vcpu0(void *p)
{
	struct testvm *tv = p;

	kvmdirty_vcpu_free(tv->vcpu[0]);
	return NULL;
}

START_TEST(pages_published_after_reset)
{
	enum harvester who = _i;
	uint64_t pages = who == BY_RING_FULL ? 8192 : 2048;
	struct rig g = ring_rig(2, 4096, who == BY_REAPER ? 1 : 0, 0);
	struct handoff h = HANDOFF_INIT;
	struct kvmdirty_region *r;
	struct runner vcpu;
	pthread_t freer;
	void *mem;

	ck_assert_ok(testvm_add_memory(g.tv, 4 * GIB, pages * PAGE, 0, &mem, &r));
	rig_add_copy(&g, g.tv->sys_region, true, false);
	rig_add_copy(&g, r, false, false);
	/* both vCPUs write the same pages; vCPU 1 one pass at a time */
	rig_work(g.tv, 0, 4 * GIB, pages, GUEST_SEQUENTIAL, GUEST_F_EXIT_EVERY_PASS);
	rig_work(g.tv, 1, 4 * GIB, pages, GUEST_SEQUENTIAL, GUEST_F_EXIT_EVERY_PASS);
	testvm_mailbox(g.tv, 0)->until_pass = 1;
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);
	hold_set(KD_HOOK_RING_HARVESTED, &g.tv->vcpu[0]->ring, 1, &h, 2000);
	printf("harvester %s:\n", who == BY_RING_FULL ? "ring-full exit" : who == BY_REAPER ? "reaper" : "vCPU freed");
	switch (who) {
	case BY_RING_FULL: /* 8192 pages fill the 4096-entry ring */
		runner_start(&vcpu, g.tv, 0);
		sync_while_harvest_held(&g, &h, 4 * GIB, pages);
		runner_join(&vcpu);
		break;
	case BY_REAPER: /* 2048 pages: no ring-full exit, the reaper takes them */
		rig_run_pass(g.tv, 0);
		sync_while_harvest_held(&g, &h, 4 * GIB, pages);
		break;
	case BY_VCPU_FREE:
		rig_run_pass(g.tv, 0);
		ck_assert_int_eq(pthread_create(&freer, NULL, free_vcpu0, g.tv), 0);
		sync_while_harvest_held(&g, &h, 4 * GIB, pages);
		pthread_join(freer, NULL);
		break;
	}
	hooks_off();
	ck_assert_int_eq(hold.hits, 1);
	rig_sync_consume(&g);
	rig_expect_fresh(&g, "pages published after their reset");
	if (who == BY_VCPU_FREE)
		g.tv->vcpu[0] = NULL;
	testvm_free(g.tv);
	testvm_unmap(mem, pages * PAGE);
	rig_free(&g);
}
END_TEST

/*
 * Entries lost to an overflow: their pages stay writable in KVM until
 * logging is switched off and on, so a later native write to them is never
 * logged unless the tracker protects them again.  One vCPU writes 256
 * pages P natively (each first write makes the page writable and pushes an
 * entry), then, before anyone harvests, floods other pages Q from ring 0
 * through the emulator, which pushes past the ring and overwrites P's
 * entries; then it writes P natively again.
 */
START_TEST(native_writes_after_overflow)
{
	uint64_t p_pages = 256, q_pages = 16384;
	struct rig g = ring_rig(1, 4096, 0, 0);
	struct kvmdirty_region *rp, *rq;
	struct guest_vcpu *mb;
	struct kvmdirty_stats st;
	void *mp, *mq;

	ck_assert_ok(testvm_add_memory(g.tv, 4 * GIB, p_pages * PAGE, 0, &mp, &rp));
	ck_assert_ok(testvm_add_memory(g.tv, 8 * GIB, q_pages * PAGE, 0, &mq, &rq));
	rig_add_copy(&g, g.tv->sys_region, true, false);
	rig_add_copy(&g, rp, false, false);
	rig_add_copy(&g, rq, false, false);
	mb = testvm_mailbox(g.tv, 0);
	rig_work(g.tv, 0, 4 * GIB, p_pages, GUEST_SEQUENTIAL, GUEST_F_EXIT_EVERY_PASS);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);
	rig_run_pass(g.tv, 0); /* native, P: its entries stay in the ring */
	ck_assert_ok(testvm_set_ring0(g.tv, 0, true));
	mb->gpa = 8 * GIB;
	mb->pages = q_pages;
	rig_run_pass(g.tv, 0); /* ring 0, Q: past the ring, over P's entries */
	ck_assert_ok(testvm_set_ring0(g.tv, 0, false));
	st = stats(g.t);
	ck_assert_msg(st.ring_overflows > 0, "the ring-0 pass did not overflow the ring: the test cannot see loss");
	rig_sync_consume(&g);
	mb->gpa = 4 * GIB;
	mb->pages = p_pages;
	rig_run_pass(g.tv, 0); /* native again, P */
	rig_sync_consume(&g);
	st = stats(g.t);
	printf("native writes after an overflow: %" PRIu64 " overflows, %" PRIu64 " recoveries, %" PRIu64
	       " pages handed out\n",
	       st.ring_overflows, st.ring_recoveries, g.handed_out);
	rig_expect_fresh(&g, "native writes after an overflow");
	testvm_free(g.tv);
	testvm_unmap(mp, p_pages * PAGE);
	testvm_unmap(mq, q_pages * PAGE);
	rig_free(&g);
}
END_TEST

struct freer {
	struct kvmdirty_tracker *t;
	int done;
};

static void *free_tracker(void *p)
{
	struct freer *f = p;

	kvmdirty_tracker_free(f->t);
	__atomic_store_n(&f->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

/*
 * The tracker freed while a vCPU fills its ring: at its ring-full exit
 * before the handler (0), or while the handler holds harvested entries (1).
 * The vCPU runs on through several more ring fills, its rings harvested
 * and dropped, and its guest checks every page it writes.
 */
START_TEST(tracker_freed_while_vcpu_runs)
{
	uint64_t pages = 8192;
	struct rig g = ring_rig(1, 4096, 0, 0);
	struct handoff h = HANDOFF_INIT;
	struct freer f = { 0 };
	struct kvmdirty_region *r;
	struct runner vcpu;
	pthread_t th;
	void *mem;

	ck_assert_ok(testvm_add_memory(g.tv, 4 * GIB, pages * PAGE, 0, &mem, &r));
	rig_work(g.tv, 0, 4 * GIB, pages, GUEST_SEQUENTIAL, GUEST_F_CHECK);
	testvm_mailbox(g.tv, 0)->until_pass = 4;
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	if (_i == 0)
		hold_set(KD_HOOK_RING_FULL, g.tv->vcpu[0], 1, &h, 0);
	else
		hold_set(KD_HOOK_RING_HARVESTED, &g.tv->vcpu[0]->ring, 1, &h, 2000);
	runner_start(&vcpu, g.tv, 0);
	handoff_wait_posted(&h);
	f.t = g.t;
	ck_assert_int_eq(pthread_create(&th, NULL, free_tracker, &f), 0);
	if (_i == 0)
		pthread_join(th, NULL); /* the vCPU holds nothing: the free goes through */
	handoff_go(&h);
	if (_i == 1)
		pthread_join(th, NULL);
	g.tv->tracker = NULL;
	runner_join(&vcpu);
	hooks_off();
	ck_assert_int_eq(hold.hits, 1);
	ck_assert_uint_eq(testvm_mailbox(g.tv, 0)->pass, 4);
	printf("tracker freed %s: the vCPU ran on to pass 4\n",
	       _i == 0 ? "at a ring-full exit" : "while the handler held entries");
	testvm_free(g.tv);
	testvm_unmap(mem, pages * PAGE);
}
END_TEST

/* ---- one_reset_for_many_rings ---- */

static int resets;

static int count_resets(int fd, unsigned long req, void *arg)
{
	(void)fd;
	(void)arg;
	if (req == KVM_RESET_DIRTY_RINGS)
		__atomic_add_fetch(&resets, 1, __ATOMIC_RELAXED);
	return KD_HOOK_PASS;
}

/*
 * KVM's reset walks every vCPU of the VM and makes a request of each: a
 * sync that reset each vCPU's ring on its own cost vCPUs^2 (1,024 vCPUs
 * with a page or two each took seconds a sync, and a migration never
 * ended).  128 vCPUs write 4 pages each, one after another; one sync
 * must take all 512 pages (and the mailboxes) with one reset, and hand out
 * each page's latest contents.
 */
START_TEST(one_reset_for_many_rings)
{
	const unsigned int vcpus = 128, pages = 4;
	struct rig g = ring_rig(vcpus, 4096, 0, 0);
	struct kvmdirty_region *r;
	unsigned int i;
	void *mem;

	ck_assert_ok(testvm_add_memory(g.tv, 4 * GIB, vcpus * pages * PAGE, 0, &mem, &r));
	rig_add_copy(&g, g.tv->sys_region, true, false);
	rig_add_copy(&g, r, false, false);
	for (i = 0; i < vcpus; i++)
		rig_work(g.tv, i, 4 * GIB + i * pages * PAGE, pages, GUEST_SEQUENTIAL, GUEST_F_EXIT_EVERY_PASS);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);
	for (i = 0; i < vcpus; i++)
		rig_run_pass(g.tv, i);
	resets = 0;
	kd_test_hooks_set(count_resets, NULL, false);
	rig_sync_consume(&g);
	hooks_off();
	printf("%u vCPUs, %u pages each: %d reset(s) in one sync, %" PRIu64 " entries harvested\n", vcpus, pages,
	       resets, stats(g.t).ring_harvested);
	ck_assert_msg(resets == 1, "%d KVM_RESET_DIRTY_RINGS for one sync of %u rings", resets, vcpus);
	ck_assert_uint_ge(stats(g.t).ring_harvested, vcpus * pages);
	rig_expect_fresh(&g, "one reset for many rings");
	testvm_free(g.tv);
	testvm_unmap(mem, vcpus * pages * PAGE);
	rig_free(&g);
}
END_TEST

/*
 * test-ring: the cases any KVM with a dirty ring runs.  test-ring overflow:
 * those that need entries lost to an overflow (RING_OVERFLOW_QUIRK), which
 * skip naming the quirk where the host's KVM never overflows a ring; the
 * recovery they cover is also tested without KVM against a model of its
 * ring (test-ring-model).
 */
int main(int argc, char **argv)
{
	bool overflow;
	int skip = ring_program_start(argc, argv, "test-ring", &overflow);
	Suite *s;
	TCase *tc;

	if (skip)
		return skip; /* before Check allocates anything: no leak on the way out */
	s = suite_create("ring");
	tc = tcase_create(overflow ? "overflow" : "ring");
	tcase_set_timeout(tc, 240);
	if (overflow) {
		tcase_add_test(tc, sync_while_ghosts_marked);
		tcase_add_test(tc, native_writes_after_overflow);
	} else {
		tcase_add_test(tc, sync_between_ring_full_and_handler);
		tcase_add_loop_test(tc, pages_published_after_reset, 0, 3);
		tcase_add_loop_test(tc, tracker_freed_while_vcpu_runs, 0, 2);
		tcase_add_test(tc, one_reset_for_many_rings);
	}
	suite_add_tcase(s, tc);
	return run_suite(s);
}
