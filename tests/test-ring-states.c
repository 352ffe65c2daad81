// SPDX-License-Identifier: MIT
/*
 * The dirty ring across state changes, each forced on the real KVM and
 * judged by guest page contents or by the vCPU running on: a reset that
 * fails with one ring's entries marked, a vCPU freed and registered again,
 * a re-protect that KVM refuses half way, lookups during re-protects, two
 * vCPUs overflowing at once, the VMM switching logging off during a
 * re-protect, a region started with logging already on after a loss.
 */
#include <inttypes.h>
#include <sys/ioctl.h>
#include <linux/kvm.h>

#include "kvm-uapi.h"
#include "ring-util.h"

static struct {
	int fail_resets;	/* fail this many KVM_RESET_DIRTY_RINGS with -EIO */
	int resets_seen;
	struct kd_ring *push_ring; /* at KD_HOOK_RING_HARVESTED of this ring: vCPU 1 writes more */
	struct testvm *tv;
	int pushes_done;
} f1;

static int f1_ioctl(int fd, unsigned long req, void *arg)
{
	(void)fd;
	(void)arg;
	if (req == KVM_RESET_DIRTY_RINGS) {
		f1.resets_seen++;
		if (f1.fail_resets > 0) {
			f1.fail_resets--;
			return -EIO;
		}
	}
	return KD_HOOK_PASS;
}

static void f1_point(enum kd_hook_point p, void *obj)
{
	if (p == KD_HOOK_RING_HARVESTED && obj == f1.push_ring && !f1.pushes_done) {
		struct guest_vcpu *mb = testvm_mailbox(f1.tv, 1);

		f1.pushes_done = 1;
		/* vCPU 1 runs on (as it would on its own thread): 64 new pages, 64 new DIRTY entries */
		mb->gpa = 8 * GIB + 1024 * PAGE;
		mb->pages = 64;
		rig_run_pass(f1.tv, 1);
	}
}

/*
 * A reset that fails leaves one ring's entries marked; the next reset would
 * take them with another ring's, and crediting its count to that ring sent
 * KVM's reset past its write position (the other vCPU then exited
 * ring-full forever).  The failed ring is retried before any other one is
 * collected; loop index 1 makes ring 0's reset fail once.
 */
START_TEST(failed_reset_then_other_ring)
{
	uint64_t pages = 2048;
	struct rig g = ring_rig(2, 4096, 0, 0);
	struct kvmdirty_region *ra, *rb;
	struct kvmdirty_stats st0, st;
	struct guest_vcpu *mb1;
	struct runner vcpu;
	void *ma, *mb;
	int64_t s;
	bool finished;

	ck_assert_ok(testvm_add_memory(g.tv, 4 * GIB, pages * PAGE, 0, &ma, &ra));
	ck_assert_ok(testvm_add_memory(g.tv, 8 * GIB, pages * PAGE, 0, &mb, &rb));
	rig_add_copy(&g, g.tv->sys_region, true, false);
	rig_add_copy(&g, ra, false, false);
	rig_add_copy(&g, rb, false, false);
	rig_work(g.tv, 0, 4 * GIB, 2000, GUEST_SEQUENTIAL, GUEST_F_EXIT_EVERY_PASS);
	rig_work(g.tv, 1, 8 * GIB, 512, GUEST_SEQUENTIAL, GUEST_F_EXIT_EVERY_PASS);
	mb1 = testvm_mailbox(g.tv, 1);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);
	ck_assert_int_ge(kvmdirty_tracker_sync(g.t), 0);
	rig_consume(&g);

	rig_run_pass(g.tv, 0); /* ~2000 entries in ring 0 */
	rig_run_pass(g.tv, 1); /* ~512 entries in ring 1 */

	memset(&f1, 0, sizeof(f1));
	f1.fail_resets = _i; /* ring 0's reset fails: its entries stay marked RESET */
	f1.push_ring = &g.tv->vcpu[1]->ring;
	f1.tv = g.tv;
	kd_test_hooks_set(f1_ioctl, f1_point, false);
	st0 = stats(g.t);
	s = kvmdirty_tracker_sync(g.t);
	kd_test_hooks_set(NULL, NULL, false);
	printf("failed reset [fail=%d]: sync with ring 0's reset failing: %" PRId64 " (%s)\n", _i, s,
	       s < 0 ? strerror((int)-s) : "ok");
	ck_assert_int_eq(s, _i ? -EIO : s);
	/* the next sync retries ring 0's reset before it takes ring 1, whose vCPU writes meanwhile */
	kd_test_hooks_set(f1_ioctl, f1_point, false);
	ck_assert_int_ge(kvmdirty_tracker_sync(g.t), 0);
	kd_test_hooks_set(NULL, NULL, false);
	ck_assert_int_eq(f1.pushes_done, 1);
	rig_consume(&g);
	ck_assert_uint_eq(g.tv->vcpu[1]->ring.reset_pos, g.tv->vcpu[1]->ring.fetch);

	/* vCPU 1 goes on: 512 more pages, well under its 4096-entry ring */
	mb1->gpa = 8 * GIB;
	mb1->pages = 512;
	mb1->until_pass = mb1->pass + 1;
	mb1->flags = 0;
	runner_start(&vcpu, g.tv, 1);
	finished = runner_wait(&vcpu, 5000);
	st = stats(g.t);
	printf("failed reset [fail=%d]: vCPU 1 %s; ring-full exits during that pass: %" PRIu64 "\n", _i,
	       finished ? "finished its pass" : "is STUCK in ring-full exits",
	       st.ring_full_exits - st0.ring_full_exits);
	if (!finished)
		runner_kick(&vcpu);
	pthread_join(vcpu.th, NULL);
	ck_assert_msg(finished, "vCPU 1 never finished a 512-page pass: %" PRIu64
		      " ring-full exits; KVM's reset ran past its write position",
		      st.ring_full_exits - st0.ring_full_exits);
	rig_sync_consume(&g);
	rig_expect_fresh(&g, "a failed reset, then another ring");
	testvm_free(g.tv);
	testvm_unmap(ma, pages * PAGE);
	testvm_unmap(mb, pages * PAGE);
	rig_free(&g);
}
END_TEST


/*
 * A vCPU freed from the library and registered again (QEMU parks unplugged
 * vCPU fds and reuses them): KVM's ring indices are wherever they were, so
 * the ring must be picked up where the library left it.  Loop index 1 runs
 * on, passes that wrap the ring, with syncs meanwhile.
 */
START_TEST(vcpu_fd_registered_again)
{
	uint64_t pages = 16384;
	struct rig g = ring_rig(1, 4096, 0, 0);
	struct kvmdirty_region *r;
	struct kvmdirty_vcpu *v;
	struct guest_vcpu *mb;
	struct kvmdirty_stats st;
	char first[160];
	uint64_t stale;
	int fd;
	void *mem;

	ck_assert_ok(testvm_add_memory(g.tv, 4 * GIB, pages * PAGE, 0, &mem, &r));
	rig_add_copy(&g, g.tv->sys_region, true, false);
	rig_add_copy(&g, r, false, false);
	mb = testvm_mailbox(g.tv, 0);
	rig_work(g.tv, 0, 4 * GIB, 100, GUEST_SEQUENTIAL, GUEST_F_EXIT_EVERY_PASS);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);
	rig_run_pass(g.tv, 0); /* ~100 entries: KVM's ring indices move to ~100 */
	rig_sync_consume(&g);

	/* unplug: the VMM keeps the fd (parked), the library lets the vCPU go */
	fd = dup(kvmdirty_vcpu_fd(g.tv->vcpu[0]));
	ck_assert_int_ge(fd, 0);
	kvmdirty_vcpu_free(g.tv->vcpu[0]);
	/* replug: the same KVM vCPU registered again */
	ck_assert_ok(kvmdirty_vcpu_add(g.tv->vm, fd, &v));
	g.tv->vcpu[0] = v;

	mb->gpa = 4 * GIB;
	mb->pages = 2048; /* 2048 pages: half the ring, no ring-full exit */
	rig_run_pass(g.tv, 0);
	/* stop-and-copy: the vCPU is stopped; the last sync must report all it wrote */
	rig_sync_consume(&g);
	st = stats(g.t);
	stale = rig_stale(&g, first, sizeof(first));
	printf("vCPU registered again: ring fetch %u reset_pos %u; harvested %" PRIu64 " entries in all; %" PRIu64
	       " stale pages after the final sync; first %s\n",
	       v->ring.fetch, v->ring.reset_pos, st.ring_harvested, stale, first);
	if (_i == 1) {
		/* go on: passes over 2048 pages while the owner syncs; the ring wraps past the marked entries */
		struct runner vcpu;
		bool finished;
		uint64_t t_full0 = st.ring_full_exits, w = __atomic_load_n(&mb->writes, __ATOMIC_RELAXED);
		int still = 0;
		struct timespec t0, t1;

		mb->until_pass = mb->pass + 6;
		mb->pages = pages;
		mb->flags = 0;
		mb->tsc_per_page = testvm_tsc_per_page(g.tv, 50000);
		clock_gettime(CLOCK_MONOTONIC, &t0);
		runner_start(&vcpu, g.tv, 0);
		/*
		 * Stuck: no page written over 5000 syncs in a row (5 s and more),
		 * however slowly a loaded host runs the vCPU (it was once a bound
		 * on the whole run, which a busy host missed with no ring-full
		 * exit at all).
		 */
		while (!__atomic_load_n(&vcpu.done, __ATOMIC_ACQUIRE) && still < 5000) {
			uint64_t now;

			rig_sync_consume(&g);
			rig_pause_us(1000);
			now = __atomic_load_n(&mb->writes, __ATOMIC_RELAXED);
			still = now == w ? still + 1 : 0;
			w = now;
		}
		finished = __atomic_load_n(&vcpu.done, __ATOMIC_ACQUIRE);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		st = stats(g.t);
		printf("vCPU registered again: %s in %.1f s; ring-full exits %" PRIu64 ", recoveries %" PRIu64
		       ", ring fetch %u reset_pos %u\n",
		       finished ? "finished 6 passes" : "is STUCK", (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9,
		       st.ring_full_exits - t_full0, st.ring_recoveries, v->ring.fetch, v->ring.reset_pos);
		if (!finished)
			runner_kick(&vcpu);
		pthread_join(vcpu.th, NULL);
		ck_assert_msg(finished, "re-added vCPU stuck in ring-full exits");
	} else
		ck_assert_msg(stale == 0, "%" PRIu64 " pages written by the re-added vCPU never reported; first: %s", stale, first);
	testvm_free(g.tv);
	testvm_unmap(mem, pages * PAGE);
	rig_free(&g);
}
END_TEST



static struct {
	int fail_reset, fail_enable;
	uint32_t slot;
	int enables_failed;
} f3;

static int f3_ioctl(int fd, unsigned long req, void *arg)
{
	(void)fd;
	if (req == KVM_RESET_DIRTY_RINGS && f3.fail_reset > 0) {
		f3.fail_reset--;
		return -EIO;
	}
	if (req == KVM_SET_USER_MEMORY_REGION2 || req == KVM_SET_USER_MEMORY_REGION) {
		/* both structs start with slot, flags */
		const struct kvm_userspace_memory_region *r = arg;

		if (r->slot == f3.slot && (r->flags & KVM_MEM_LOG_DIRTY_PAGES) && r->memory_size && f3.fail_enable > 0) {
			f3.fail_enable--;
			f3.enables_failed++;
			return -ENOMEM;
		}
	}
	return KD_HOOK_PASS;
}

/*
 * A re-protect whose "logging on" KVM refuses once: the region stays all
 * pending meanwhile, and the next sync switches logging back on; unless
 * (vmm_off) the VMM switches the region's logging off meanwhile, which
 * is then its choice: the library must leave it off (it switched it back
 * on, the VMM's "off" having returned 0 as a no-op).
 */
static void reprotect_half_failed(bool vmm_off)
{
	uint64_t pages = 512;
	struct rig g = ring_rig(1, 4096, 0, 0);
	struct kvmdirty_region *r;
	struct kvmdirty_stats st;
	int64_t s;
	int i;
	void *mem;

	ck_assert_ok(testvm_add_memory(g.tv, 4 * GIB, pages * PAGE, 0, &mem, &r));
	rig_add_copy(&g, g.tv->sys_region, true, false);
	rig_add_copy(&g, r, false, false);
	rig_work(g.tv, 0, 4 * GIB, 256, GUEST_SEQUENTIAL, GUEST_F_EXIT_EVERY_PASS);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);
	rig_run_pass(g.tv, 0);

	memset(&f3, 0, sizeof(f3));
	f3.fail_reset = 1;  /* a reset fails: entries unprotected, the sync re-protects */
	f3.fail_enable = 1; /* ... and KVM refuses logging back on once (ENOMEM) */
	f3.slot = kvmdirty_region_slot(r);
	kd_test_hooks_set(f3_ioctl, NULL, false);
	s = kvmdirty_tracker_sync(g.t);
	kd_test_hooks_set(NULL, NULL, false);
	printf("re-protect half failed: sync with the failures: %" PRId64 " (%s); enables refused %d; region flags now 0x%x\n", s,
	       s < 0 ? strerror((int)-s) : "ok", f3.enables_failed, kvmdirty_region_flags(r));
	ck_assert_int_eq(f3.enables_failed, 1);
	rig_consume(&g);
	if (vmm_off)
		ck_assert_ok(kvmdirty_region_set_logging(g.tv->vm, r, false));
	/* the guest is idle from here; KVM is healthy again */
	for (i = 0; i < 3; i++) {
		rig_sync_consume(&g);
		st = stats(g.t);
		printf("re-protect half failed: idle sync %d: %" PRIu64 " pages made pending; region flags 0x%x (LOG_DIRTY %s)\n", i,
		       st.last_sync_pages, kvmdirty_region_flags(r),
		       kvmdirty_region_flags(r) & KVMDIRTY_REGION_LOG_DIRTY ? "on" : "OFF");
	}
	if (vmm_off)
		ck_assert_msg(!(kvmdirty_region_flags(r) & KVMDIRTY_REGION_LOG_DIRTY),
			      "the library switched logging back on after the VMM switched it off");
	else
		ck_assert_msg(kvmdirty_region_flags(r) & KVMDIRTY_REGION_LOG_DIRTY,
			      "a tracked region's logging stayed off after a transient failure; every sync reports all "
			      "%" PRIu64 " of its pages", pages);
	rig_expect_fresh(&g, "after the last sync");
	testvm_free(g.tv);
	testvm_unmap(mem, pages * PAGE);
	rig_free(&g);
}

START_TEST(reprotect_half_failed_retried)
{
	reprotect_half_failed(false);
}
END_TEST

START_TEST(reprotect_half_failed_then_vmm_off)
{
	reprotect_half_failed(true);
}
END_TEST



static int f4_fail_reset;

static int f4_ioctl(int fd, unsigned long req, void *arg)
{
	(void)fd;
	(void)arg;
	if (req == KVM_RESET_DIRTY_RINGS && __atomic_load_n(&f4_fail_reset, __ATOMIC_ACQUIRE) > 0) {
		__atomic_fetch_sub(&f4_fail_reset, 1, __ATOMIC_ACQ_REL);
		return -EIO;
	}
	return KD_HOOK_PASS;
}

struct looker {
	struct kvmdirty_vm *vm;
	struct kvmdirty_region *r;
	int stop;
	uint64_t seen_off;
};

static void *look_main(void *p)
{
	struct looker *l = p;

	while (!__atomic_load_n(&l->stop, __ATOMIC_ACQUIRE)) {
		/* a VMM's lookup: region from gpa, its flags */
		struct kvmdirty_region *r = kvmdirty_region_from_gpa(l->vm, 4 * GIB);

		if (!(kvmdirty_region_flags(r) & KVMDIRTY_REGION_LOG_DIRTY))
			l->seen_off++;
	}
	return NULL;
}

/*
 * Lookups may run concurrently with sync, whose re-protect switches region
 * flags: clean under ThreadSanitizer, and nothing lost.
 */
START_TEST(lookups_during_reprotect)
{
	uint64_t pages = 512;
	struct rig g = ring_rig(1, 4096, 0, 0);
	struct kvmdirty_region *r;
	struct looker l = { 0 };
	pthread_t th;
	int i;
	void *mem;

	ck_assert_ok(testvm_add_memory(g.tv, 4 * GIB, pages * PAGE, 0, &mem, &r));
	rig_add_copy(&g, g.tv->sys_region, true, false);
	rig_add_copy(&g, r, false, false);
	rig_work(g.tv, 0, 4 * GIB, 64, GUEST_SEQUENTIAL, GUEST_F_EXIT_EVERY_PASS);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);
	l.vm = g.tv->vm;
	l.r = r;
	ck_assert_int_eq(pthread_create(&th, NULL, look_main, &l), 0);
	kd_test_hooks_set(f4_ioctl, NULL, false);
	for (i = 0; i < 20; i++) {
		rig_run_pass(g.tv, 0);
		__atomic_store_n(&f4_fail_reset, 1, __ATOMIC_RELEASE);
		kvmdirty_tracker_sync(g.t); /* fails (EIO), then re-protects: logging off and on */
		rig_consume(&g);
	}
	kd_test_hooks_set(NULL, NULL, false);
	__atomic_store_n(&l.stop, 1, __ATOMIC_RELEASE);
	pthread_join(th, NULL);
	printf("lookups during re-protects: LOG_DIRTY seen off %" PRIu64 " times (the re-protect's own toggle)\n",
	       l.seen_off);
	rig_sync_consume(&g);
	rig_expect_fresh(&g, "lookups during re-protects");
	testvm_free(g.tv);
	testvm_unmap(mem, pages * PAGE);
	rig_free(&g);
}
END_TEST


/* Two ring-0 vCPUs overflowing their rings at once, syncs far apart, with and without the reaper. */
START_TEST(two_overflowing_vcpus)
{
	uint64_t pages = 16384;
	uint32_t reaper = _i & 1 ? 5 : 0;
	uint32_t entries = _i & 2 ? 1024 : 4096;
	struct rig g = ring_rig(2, entries, reaper, 3);
	struct kvmdirty_region *ra, *rb;
	struct kvmdirty_stats st;
	struct runner v0, v1;
	void *ma, *mb;
	bool ok;
	unsigned int k;

	ck_assert_ok(testvm_add_memory(g.tv, 4 * GIB, pages * PAGE, 0, &ma, &ra));
	ck_assert_ok(testvm_add_memory(g.tv, 8 * GIB, pages * PAGE, 0, &mb, &rb));
	rig_add_copy(&g, g.tv->sys_region, true, false);
	rig_add_copy(&g, ra, false, false);
	rig_add_copy(&g, rb, false, false);
	rig_work(g.tv, 0, 4 * GIB, pages, GUEST_SEQUENTIAL, GUEST_F_CHECK);
	rig_work(g.tv, 1, 8 * GIB, pages, GUEST_STRIDED, GUEST_F_CHECK);
	testvm_mailbox(g.tv, 1)->stride = 7;
	testvm_mailbox(g.tv, 0)->until_pass = 2;
	testvm_mailbox(g.tv, 1)->until_pass = 2;
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);
	runner_start(&v0, g.tv, 0);
	runner_start(&v1, g.tv, 1);
	for (k = 0; k < 1200 && !(__atomic_load_n(&v0.done, __ATOMIC_ACQUIRE) && __atomic_load_n(&v1.done, __ATOMIC_ACQUIRE)); k++) {
		rig_sync_consume(&g);
		rig_pause_us(100000);
	}
	ok = v0.done && v1.done;
	st = stats(g.t);
	printf("two overflowing vCPUs [reaper %u, ring %u]: %s after %u syncs: full exits %" PRIu64 " overflows %" PRIu64 " recoveries %" PRIu64
	       " passes %" PRIu64 "/%" PRIu64 "\n", reaper, entries, ok ? "done" : "NOT DONE", k, st.ring_full_exits,
	       st.ring_overflows, st.ring_recoveries, testvm_mailbox(g.tv, 0)->pass, testvm_mailbox(g.tv, 1)->pass);
	if (!v0.done)
		runner_kick(&v0);
	if (!v1.done)
		runner_kick(&v1);
	pthread_join(v0.th, NULL);
	pthread_join(v1.th, NULL);
	ck_assert_msg(ok, "vCPUs did not finish");
	ck_assert_msg(v0.ret == 0 && v0.ex.event == TESTVM_DONE, "vCPU 0: %d %s", v0.ret, testvm_event_name(v0.ex.event));
	ck_assert_msg(v1.ret == 0 && v1.ex.event == TESTVM_DONE, "vCPU 1: %d %s", v1.ret, testvm_event_name(v1.ex.event));
	rig_sync_consume(&g);
	rig_expect_fresh(&g, "two overflowing vCPUs");
	testvm_free(g.tv);
	testvm_unmap(ma, pages * PAGE);
	testvm_unmap(mb, pages * PAGE);
	rig_free(&g);
}
END_TEST


/*
 * The VMM switches a region's logging off while a sync re-protects after a
 * loss (loop index 1; 0 without a loss): the VMM's change must stand.
 */
static int f6_fail, f6_failed;

static int f6_ioctl(int fd, unsigned long req, void *arg)
{
	(void)fd;
	(void)arg;
	if (req == KVM_RESET_DIRTY_RINGS && __atomic_load_n(&f6_fail, __ATOMIC_ACQUIRE)) {
		__atomic_store_n(&f6_fail, 0, __ATOMIC_RELEASE);
		__atomic_store_n(&f6_failed, 1, __ATOMIC_RELEASE);
		return -EIO;
	}
	return KD_HOOK_PASS;
}

struct f6_sync {
	struct kvmdirty_tracker *t;
	pthread_t th;
	int64_t ret;
	int done;
};

static void *f6_sync_main(void *p)
{
	struct f6_sync *s = p;

	s->ret = kvmdirty_tracker_sync(s->t);
	__atomic_store_n(&s->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

START_TEST(logging_off_during_reprotect)
{
	struct rig g = ring_rig(1, 4096, 0, 0);
	struct kvmdirty_region *w, *r, *small[64];
	void *wm, *rm, *sm;
	unsigned int i, it, undone = 0, tries = 0, losses = 0;

	ck_assert_ok(testvm_add_memory(g.tv, 4 * GIB, 64 * PAGE, 0, &wm, &w));
	sm = testvm_map(64 * PAGE);
	for (i = 0; i < 64; i++)
		ck_assert_ok(kvmdirty_region_add(g.tv->vm, 16 * GIB + i * PAGE, PAGE, (char *)sm + i * PAGE, 0, &small[i]));
	ck_assert_ok(testvm_add_memory(g.tv, 8 * GIB, 64 * PAGE, 0, &rm, &r));
	rig_work(g.tv, 0, 4 * GIB, 16, GUEST_SEQUENTIAL, GUEST_F_EXIT_EVERY_PASS);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	kd_test_hooks_set(f6_ioctl, NULL, false);
	for (it = 0; it < 300 && !undone; it++) {
		struct f6_sync s = { .t = g.t };

		ck_assert_ok(kvmdirty_region_set_logging(g.tv->vm, r, true));
		ck_assert_ok(kvmdirty_tracker_sync(g.t));
		rig_run_pass(g.tv, 0); /* a few entries in the ring */
		__atomic_store_n(&f6_failed, 0, __ATOMIC_RELEASE);
		__atomic_store_n(&f6_fail, _i, __ATOMIC_RELEASE);
		ck_assert_int_eq(pthread_create(&s.th, NULL, f6_sync_main, &s), 0);
		/* bounded: a sync that found nothing to reset ends without the failure */
		while (_i && !__atomic_load_n(&f6_failed, __ATOMIC_ACQUIRE) && !__atomic_load_n(&s.done, __ATOMIC_ACQUIRE))
			;
		losses += __atomic_load_n(&f6_failed, __ATOMIC_ACQUIRE);
		rig_pause_us(it % 50 * 20);
		/* the VMM: logging off for r (a change, allowed concurrently with sync) */
		ck_assert_ok(kvmdirty_region_set_logging(g.tv->vm, r, false));
		pthread_join(s.th, NULL);
		tries++;
		if (kvmdirty_region_flags(r) & KVMDIRTY_REGION_LOG_DIRTY)
			undone++;
	}
	kd_test_hooks_set(NULL, NULL, false);
	printf("logging off during a re-protect [loss=%d]: after kvmdirty_region_set_logging(r, false) returned 0 and the sync ended, r's logging was ON in %u of %u tries\n",
	       _i, undone, tries);
	ck_assert_msg(!_i || losses, "no sync's reset failed: the re-protect after a loss never ran");
	ck_assert_msg(!undone, "the VMM's logging off was undone by a concurrent sync's re-protect");
	testvm_free(g.tv);
	testvm_unmap(wm, 64 * PAGE);
	testvm_unmap(rm, 64 * PAGE);
	testvm_unmap(sm, 64 * PAGE);
}
END_TEST


/*
 * A region added with logging on, written, its entries lost to an overflow
 * while it was not tracked, then started: start must protect it (logging
 * off and on), or native writes after the hand-out go unseen.  Loop index
 * 1: added with logging off, the control.
 */
START_TEST(start_after_loss_logging_on)
{
	uint64_t p_pages = 900, q_pages = 16384;
	struct rig g = ring_rig(1, 1024, 0, 0);
	uint32_t pflags = _i ? 0 : KVMDIRTY_REGION_LOG_DIRTY;
	struct kvmdirty_region *rp, *rq;
	struct guest_vcpu *mb;
	struct kvmdirty_stats st;
	char first[160] = "";
	uint64_t stale = 0, total_stale = 0;
	unsigned int trial, bad_trials = 0;
	void *mp, *mq;

	/* P: the VMM turned logging on (flag at add, or kvmdirty_vm_set_logging) and tracks it later */
	ck_assert_ok(testvm_add_memory(g.tv, 4 * GIB, p_pages * PAGE, pflags, &mp, &rp));
	ck_assert_ok(testvm_add_memory(g.tv, 8 * GIB, q_pages * PAGE, 0, &mq, &rq));
	rig_add_copy(&g, g.tv->sys_region, true, false);
	rig_add_copy(&g, rp, false, false);
	rig_add_copy(&g, rq, false, false);
	mb = testvm_mailbox(g.tv, 0);
	rig_work(g.tv, 0, 4 * GIB, p_pages, GUEST_SEQUENTIAL, GUEST_F_EXIT_EVERY_PASS);
	ck_assert_ok(kvmdirty_tracker_start(g.t, g.tv->sys_region));
	ck_assert_ok(kvmdirty_tracker_start(g.t, rq));
	for (trial = 0; trial < 20; trial++) {
		rig_sync_consume(&g); /* the ring is empty */
		mb->gpa = 4 * GIB;
		mb->pages = p_pages;
		rig_run_pass(g.tv, 0); /* native, P: entries in the ring, pages writable */
		ck_assert_ok(testvm_set_ring0(g.tv, 0, true));
		mb->gpa = 8 * GIB;
		mb->pages = 512;
		rig_run_pass(g.tv, 0); /* ring 0, Q: past the ring, over P's entries */
		ck_assert_ok(testvm_set_ring0(g.tv, 0, false));
		rig_sync_consume(&g); /* re-protects the tracked regions (sys, Q): P is not tracked */
		ck_assert_ok(kvmdirty_tracker_start(g.t, rp)); /* with logging on already nothing is protected */
		rig_consume(&g); /* P handed out and read */
		mb->gpa = 4 * GIB;
		mb->pages = p_pages;
		rig_run_pass(g.tv, 0); /* native again, P */
		rig_sync_consume(&g);
		stale = rig_stale(&g, first, sizeof(first));
		if (stale) {
			bad_trials++;
			total_stale += stale;
			printf("start after a loss [P logging at add %s] trial %u: %" PRIu64 " stale; first %s\n", pflags ? "on" : "off", trial,
			       stale, first);
		}
		/* resync the copy; back to "P untracked, logging as at add" */
		kvmdirty_tracker_mark_dirty_gpa(g.t, 4 * GIB, p_pages * PAGE);
		rig_sync_consume(&g);
		ck_assert_ok(kvmdirty_tracker_stop(g.t, rp));
		if (pflags)
			ck_assert_ok(kvmdirty_region_set_logging(g.tv->vm, rp, true));
	}
	st = stats(g.t);
	printf("start after a loss [P logging at add %s]: %" PRIu64 " overflows; %u of 20 trials lost writes (%" PRIu64 " pages)\n",
	       pflags ? "on" : "off", st.ring_overflows, bad_trials, total_stale);
	ck_assert_msg(bad_trials == 0, "%u trials lost writes after start", bad_trials);
	testvm_free(g.tv);
	testvm_unmap(mp, p_pages * PAGE);
	testvm_unmap(mq, q_pages * PAGE);
	rig_free(&g);
}
END_TEST


/* As test-ring: "overflow" runs the cases that need RING_OVERFLOW_QUIRK, or skips naming it. */
int main(int argc, char **argv)
{
	bool overflow;
	int skip = ring_program_start(argc, argv, "test-ring-states", &overflow);
	Suite *s;
	TCase *tc;

	if (skip)
		return skip; /* before Check allocates anything: no leak on the way out */
	s = suite_create("ring-states");
	tc = tcase_create(overflow ? "overflow" : "ring-states");
	tcase_set_timeout(tc, 240);
	if (overflow) {
		tcase_add_loop_test(tc, two_overflowing_vcpus, 0, 4);
		tcase_add_loop_test(tc, start_after_loss_logging_on, 0, 2);
	} else {
		tcase_add_loop_test(tc, failed_reset_then_other_ring, 0, 2);
		tcase_add_loop_test(tc, vcpu_fd_registered_again, 0, 2);
		tcase_add_test(tc, reprotect_half_failed_retried);
		tcase_add_test(tc, reprotect_half_failed_then_vmm_off);
		tcase_add_test(tc, lookups_during_reprotect);
		tcase_add_loop_test(tc, logging_off_during_reprotect, 0, 2);
	}
	suite_add_tcase(s, tc);
	return run_suite(s);
}
