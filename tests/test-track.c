// SPDX-License-Identifier: MIT
/*
 * The tracker against the real KVM (rig.h): no lost write in every mode,
 * protect before read, each write reported exactly once, state changes
 * (logging switched behind the tracker, a sync or a stop that fails) that
 * lose nothing, and marks from several threads while regions move.
 */
#include <pthread.h>
#include <sys/ioctl.h>
#include <linux/kvm.h>

#include "hooks.h"
#include "kvm-uapi.h"
#include "rig.h"
#include "rng.h"
#include "track-modes.h"
#include "vcpu.h"

static struct testvm *new_tracked(enum kvmdirty_mode mode, unsigned int vcpus)
{
	struct testvm_opts o = { .nr_vcpus = vcpus, .track = true, .track_opts = { .mode = mode } };
	struct testvm *tv = NULL;

	ck_assert_ok(testvm_new(&o, &tv));
	return tv;
}

/*
 * A small ring must fill at least once, whatever the reaper and the syncs
 * do, or its ring-full path goes untested where they outpace the guest:
 * until the first KVM_EXIT_DIRTY_RING_FULL, a harvest that took entries
 * waits before their reset (10 s at most), holding the vCPU set, while the
 * vCPUs write on.  The vCPU's hook comes before it takes the set's lock.
 */
static int ring_filled;

static void fill_first(enum kd_hook_point p, void *obj)
{
	unsigned int i;

	(void)obj;
	if (p == KD_HOOK_RING_FULL)
		__atomic_store_n(&ring_filled, 1, __ATOMIC_RELEASE);
	for (i = 0; p == KD_HOOK_RING_HARVESTED && i < 10000 && !__atomic_load_n(&ring_filled, __ATOMIC_ACQUIRE); i++) {
		struct timespec ts = { 0, 1000000 };

		nanosleep(&ts, NULL);
	}
}

struct scenario {
	const char *name;
	enum kvmdirty_mode mode;
	unsigned int vcpus;
	uint32_t pattern;
	bool ring0;
	uint32_t ring_entries;
	uint64_t chunk_pages;
	uint64_t until_pass;  /* 0: run until stopped */
	unsigned int rounds;  /* syncs at least */
	unsigned int passes;  /* guest passes at least (0: 3) */
	bool clear_late;      /* the wrong order: must lose writes */
	bool toggle_remove;   /* stop/start one region and remove another mid-run */
	uint32_t reaper_ms;
};

/*
 * Three adjacent regions: 1 GiB + 3 pages (its tail is not a multiple of
 * 64 pages), 8 MiB, 4 MiB + 5 pages; the guest writes across all three
 * boundaries, and (with toggle_remove) a fourth region it never touches is
 * removed while tracked.
 */
static void run_scenario(const struct scenario *s)
{
	uint64_t r0 = 4 * GIB, s0 = GIB + 3 * PAGE, r1 = r0 + s0, s1 = 8 << 20, r2 = r1 + s1,
		 s2 = (4 << 20) + 5 * PAGE, r3 = 16 * GIB, s3 = 1 << 20;
	uint64_t ws_first = r0 + s0 - (4 << 20), ws_end = r2 + s2, ws_pages, stale;
	struct testvm_opts o = { .nr_vcpus = s->vcpus, .ring0 = s->ring0, .track = true };
	unsigned int i, bad = 0, passes = s->passes ? s->passes : 3;
	struct kvmdirty_region *reg[4];
	struct kvmdirty_stats st;
	struct testvm_exit ex;
	struct rig g = { 0 };
	char first[160];
	void *mem[4];
	int ret;

	hooks_off();
	if (s->ring0) /* emulated writes: 16,384 pages a pass, across all three regions */
		ws_first = r2 + s2 - (64 << 20);
	o.track_opts.mode = s->mode;
	o.track_opts.ring_entries = s->ring_entries;
	o.track_opts.clear_chunk_pages = s->chunk_pages;
	o.track_opts.reaper_ms = s->reaper_ms;
	ret = testvm_new(&o, &g.tv);
	ck_assert_msg(ret == 0, "%s: testvm_new: %s", s->name, strerror(-ret));
	g.t = g.tv->tracker;
	g.delay_us = s->clear_late ? 3000 : 500;
	ck_assert_ok(testvm_add_memory(g.tv, r0, s0, 0, &mem[0], &reg[0]));
	ck_assert_ok(testvm_add_memory(g.tv, r1, s1, 0, &mem[1], &reg[1]));
	ck_assert_ok(testvm_add_memory(g.tv, r2, s2, 0, &mem[2], &reg[2]));
	ck_assert_ok(testvm_add_memory(g.tv, r3, s3, 0, &mem[3], &reg[3]));
	rig_add_copy(&g, g.tv->sys_region, true, false);
	for (i = 0; i < 4; i++)
		rig_add_copy(&g, reg[i], false, false);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	ck_assert_uint_eq(kvmdirty_tracker_pending(g.t), (GUEST_SYS_SIZE + s0 + s1 + s2 + s3) / PAGE);

	ws_pages = (ws_end - ws_first) / PAGE;
	for (i = 0; i < s->vcpus; i++) {
		struct guest_vcpu *mb = testvm_mailbox(g.tv, i);
		uint64_t share = ws_pages / s->vcpus;

		rig_work(g.tv, i, ws_first + i * share * PAGE, i + 1 == s->vcpus ? ws_pages - i * share : share,
			 s->pattern, GUEST_F_CHECK);
		mb->until_pass = s->until_pass;
	}
	/* the whole of memory once, before the guest runs */
	rig_consume(&g);
	ring_filled = 0;
	kd_test_hooks_set(NULL, s->ring_entries && s->ring_entries <= 1024 ? fill_first : NULL, s->clear_late);
	ck_assert_ok(testvm_spawn(g.tv));
	/* the rounds asked for, and the guest passes (bounded by a number of syncs, not by time) */
	for (i = 0; i < s->rounds || (!s->until_pass && testvm_mailbox(g.tv, 0)->pass < passes && i < 100000);
	     i++) {
		rig_sync_consume(&g);
		if (s->toggle_remove && i == s->rounds / 3) {
			ck_assert_ok(kvmdirty_tracker_stop(g.t, reg[1]));
			ck_assert_ok(kvmdirty_region_remove(g.tv->vm, reg[3]));
			g.copies[4].region = NULL; /* gone: nothing to compare */
		}
		if (s->toggle_remove && i == s->rounds / 2)
			ck_assert_ok(kvmdirty_tracker_start(g.t, reg[1]));
	}
	if (!s->until_pass)
		testvm_stop_all(g.tv);
	ret = testvm_join(g.tv, &bad, &ex);
	ck_assert_msg(ret == 0, "%s: vCPU %u: %s (%s), check page 0x%" PRIx64, s->name, bad,
		      ret == -EIO ? testvm_event_name(ex.event) : strerror(-ret), testvm_event_name(ex.event),
		      testvm_mailbox(g.tv, bad)->err_gpa);
	/* stop-and-copy: vCPUs are out of KVM_RUN, one last sync sees everything */
	rig_sync_consume(&g);
	kd_test_hooks_set(NULL, NULL, false);
	ck_assert_uint_eq(kvmdirty_tracker_pending(g.t), 0);

	stale = rig_stale(&g, first, sizeof(first));
	ck_assert_ok(kvmdirty_tracker_stats(g.t, &st, sizeof(st)));
	printf("%s: %u vCPU(s), pass %" PRIu64 ", %" PRIu64 " pages handed out over %" PRIu64 " syncs, %" PRIu64
	       " clears, ring: %" PRIu64 " harvested, %" PRIu64 " full exits, %" PRIu64 " overflows, %" PRIu64
	       " recoveries, %" PRIu64 " reaper runs; stale copies: %" PRIu64 "\n",
	       s->name, s->vcpus, testvm_mailbox(g.tv, 0)->pass, g.handed_out, st.syncs, st.clear_calls,
	       st.ring_harvested, st.ring_full_exits, st.ring_overflows, st.ring_recoveries, st.ring_reaper_runs,
	       stale);
	if (s->clear_late)
		ck_assert_msg(stale > 0, "%s: clearing after the read lost no write: the test cannot see loss",
			      s->name);
	else
		ck_assert_msg(stale == 0, "%s: %" PRIu64 " pages changed without being reported; first: %s",
			      s->name, stale, first);
	ck_assert_uint_ge(testvm_mailbox(g.tv, 0)->pass, 1);
	if (s->mode == KVMDIRTY_MODE_DIRTY_RING && s->ring0)
		ck_assert_msg(st.ring_full_exits > 0, "%s: the ring never filled", s->name);
	if (s->mode == KVMDIRTY_MODE_DIRTY_RING && !s->ring0)
		/* native writes never push past the ring: nothing lost, nothing to recover */
		ck_assert_msg(!st.ring_overflows && !st.ring_recoveries,
			      "%s: %" PRIu64 " overflows, %" PRIu64 " recoveries without a ring-0 guest", s->name,
			      st.ring_overflows, st.ring_recoveries);
	if (s->ring_entries && s->ring_entries <= 1024)
		ck_assert_msg(st.ring_full_exits > 0, "%s: a %u-entry ring never filled", s->name, s->ring_entries);
	if (s->reaper_ms) {
		ck_assert_msg(st.ring_reaper_runs > 0, "%s: the reaper never ran", s->name);
		/* every sweep reads the rings at least: it takes time, and KVM's part is within it */
		ck_assert_msg(st.ring_reaper_ns > 0 && st.ring_reaper_kernel_ns <= st.ring_reaper_ns,
			      "%s: %" PRIu64 " reaper runs took %" PRIu64 " ns, %" PRIu64 " in KVM", s->name,
			      st.ring_reaper_runs, st.ring_reaper_ns, st.ring_reaper_kernel_ns);
	}

	testvm_free(g.tv);
	for (i = 0; i < 4; i++)
		testvm_unmap(mem[i], i == 0 ? s0 : i == 1 ? s1 : i == 2 ? s2 : s3);
	rig_free(&g);
}

static const struct scenario scenarios[] = {
	{ .name = "clear-log seq 1 vCPU", .mode = KVMDIRTY_MODE_CLEAR_LOG, .vcpus = 1, .pattern = GUEST_SEQUENTIAL,
	  .rounds = 12 },
	{ .name = "clear-log random 2 vCPUs, 64-page chunks", .mode = KVMDIRTY_MODE_CLEAR_LOG, .vcpus = 2,
	  .pattern = GUEST_RANDOM, .chunk_pages = 64, .rounds = 12, .toggle_remove = true },
	{ .name = "dirty-log seq 2 vCPUs", .mode = KVMDIRTY_MODE_DIRTY_LOG, .vcpus = 2, .pattern = GUEST_SEQUENTIAL,
	  .rounds = 12, .toggle_remove = true },
	{ .name = "dirty-log random 1 vCPU", .mode = KVMDIRTY_MODE_DIRTY_LOG, .vcpus = 1, .pattern = GUEST_RANDOM,
	  .rounds = 12 },
	{ .name = "dirty-ring seq 1 vCPU", .mode = KVMDIRTY_MODE_DIRTY_RING, .vcpus = 1,
	  .pattern = GUEST_SEQUENTIAL, .ring_entries = 4096, .rounds = 12 },
	{ .name = "dirty-ring random 2 vCPUs", .mode = KVMDIRTY_MODE_DIRTY_RING, .vcpus = 2, .pattern = GUEST_RANDOM,
	  .ring_entries = 4096, .rounds = 12, .toggle_remove = true },
	{ .name = "dirty-ring 4096 entries, ring-0 guest", .mode = KVMDIRTY_MODE_DIRTY_RING, .vcpus = 1,
	  .pattern = GUEST_SEQUENTIAL, .ring0 = true, .ring_entries = 4096, .until_pass = 2, .rounds = 6 },
	{ .name = "dirty-ring random 2 vCPUs, reaper 1 ms", .mode = KVMDIRTY_MODE_DIRTY_RING, .vcpus = 2,
	  .pattern = GUEST_RANDOM, .ring_entries = 4096, .rounds = 12, .toggle_remove = true, .reaper_ms = 1 },
	/*
	 * Many ring-full exits concurrent with syncs and reaper sweeps, for
	 * several seconds: a 256-entry ring fills every 192 writes.
	 */
	{ .name = "dirty-ring 256 entries, 2 vCPUs, reaper 1 ms, 30 passes", .mode = KVMDIRTY_MODE_DIRTY_RING,
	  .vcpus = 2, .pattern = GUEST_RANDOM, .ring_entries = 256, .rounds = 12, .passes = 30,
	  .toggle_remove = true, .reaper_ms = 1 },
};

START_TEST(no_lost_write)
{
	run_scenario(&scenarios[_i]);
}
END_TEST

/* Invariant 2: the same run with each clear issued after the read must lose writes. */
START_TEST(clear_after_read_loses_writes)
{
	const struct scenario s = { .name = "clear-log, clear after read", .mode = KVMDIRTY_MODE_CLEAR_LOG,
				    .vcpus = 1, .pattern = GUEST_SEQUENTIAL, .chunk_pages = 64, .rounds = 8,
				    .clear_late = true };

	run_scenario(&s);
}
END_TEST

/*
 * A rig of one vCPU writing one region of size at 4 GiB every pass, the
 * system region and it copied; nothing tracked yet.
 */
static void one_region(struct rig *g, enum kvmdirty_mode mode, uint64_t size, void **mem, struct kvmdirty_region **r)
{
	hooks_off();
	g->tv = new_tracked(mode, 1);
	g->t = g->tv->tracker;
	ck_assert_ok(testvm_add_memory(g->tv, 4 * GIB, size, 0, mem, r));
	rig_add_copy(g, g->tv->sys_region, true, false);
	rig_add_copy(g, *r, false, false);
	rig_work(g->tv, 0, 4 * GIB, size / PAGE, GUEST_SEQUENTIAL, GUEST_F_EXIT_EVERY_PASS | GUEST_F_CHECK);
}

/*
 * Lockstep: the guest writes every page once per pass and stops; the host
 * syncs, takes what is handed out, reads it; the guest writes again.  A
 * write between the read and a clear issued too late is lost, every time.
 */
static uint64_t lockstep(enum kvmdirty_mode mode, bool clear_late)
{
	struct kvmdirty_range rg[64];
	struct kvmdirty_region *r;
	struct rig g = { 0 };
	uint64_t stale, size = 1 << 20;
	char first[160];
	void *mem;
	int k, n;

	one_region(&g, mode, size, &mem, &r);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);
	kd_test_hooks_set(NULL, NULL, clear_late);
	for (k = 0; k < 4; k++) {
		rig_run_pass(g.tv, 0);
		rig_sync(&g);
		/* one call: what it hands out is read before the guest runs again */
		n = kvmdirty_tracker_next(g.t, rg, 64, 0);
		ck_assert_int_ge(n, 0);
		rig_read(&g, rg, n);
	}
	kd_test_hooks_set(NULL, NULL, false);
	rig_sync_consume(&g);
	rig_sync_consume(&g);
	stale = rig_stale(&g, first, sizeof(first));
	printf("lockstep %s%s: pass %" PRIu64 ", stale copies %" PRIu64 "%s%s\n", mode_name(mode),
	       clear_late ? ", clear after read" : "", testvm_mailbox(g.tv, 0)->pass, stale, stale ? ", first: " : "",
	       first);
	testvm_free(g.tv);
	testvm_unmap(mem, size);
	rig_free(&g);
	return stale;
}

START_TEST(lockstep_no_lost_write)
{
	ck_assert_uint_eq(lockstep(modes[_i], false), 0);
}
END_TEST

START_TEST(lockstep_clear_after_read_loses_writes)
{
	/* the guest's last pass is lost on every one of its 256 pages (and its stack) */
	ck_assert_uint_ge(lockstep(KVMDIRTY_MODE_CLEAR_LOG, true), 256);
}
END_TEST

/*
 * Exactly once: each pass the guest writes a random subset of its pages
 * and stops; every page it wrote in that pass must be handed out exactly
 * once before the next, and no other page.  A CLEAR skipped or issued for
 * the wrong bits reports a page again in a pass that did not write it; a
 * lost bit reports none.
 */
START_TEST(exactly_once_per_pass)
{
	enum kvmdirty_mode mode = modes[_i];
	uint64_t size = 4 << 20, npages = size / PAGE, p, written = 0;
	struct kvmdirty_region *r;
	struct rig g = { 0 };
	struct copy *c;
	unsigned int k;
	void *mem;

	hooks_off();
	g.tv = new_tracked(mode, 1);
	g.t = g.tv->tracker;
	ck_assert_ok(testvm_add_memory(g.tv, 4 * GIB, size, 0, &mem, &r));
	rig_add_copy(&g, g.tv->sys_region, true, false);
	c = rig_add_copy(&g, r, false, true);
	/* npages random writes a pass: about 63% of the pages, a different subset each time */
	rig_work(g.tv, 0, 4 * GIB, npages, GUEST_RANDOM, GUEST_F_EXIT_EVERY_PASS);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);
	for (k = 1; k <= 6; k++) {
		memset(c->reported, 0, npages * sizeof(*c->reported));
		rig_run_pass(g.tv, 0);
		rig_sync_consume(&g);
		for (p = 0; p < npages; p++) {
			const struct guest_tag *tag = (const void *)((uint8_t *)mem + p * PAGE);
			uint32_t want = tag->pass == k;

			written += want;
			expect(c->reported[p] == want,
			       "%s pass %u: page %" PRIu64 " (tag pass %" PRIu64 ") handed out %u times, expected %u",
			       mode_name(mode), k, p, tag->pass, c->reported[p], want);
		}
	}
	ck_assert_uint_eq(testvm_mailbox(g.tv, 0)->pass, 6);
	ck_assert_uint_gt(written, 6 * npages / 2);
	rig_expect_fresh(&g, mode_name(mode));
	printf("exactly once %s: 6 passes, %" PRIu64 " page writes, each handed out once\n", mode_name(mode),
	       written);
	testvm_free(g.tv);
	testvm_unmap(mem, size);
	rig_free(&g);
}
END_TEST

/* Logging switched behind the tracker: through the library, or by a raw ioctl. */
static void set_logging(struct testvm *tv, struct kvmdirty_region *r, bool on, bool raw)
{
	struct kvm_userspace_memory_region m = {
		.slot = kvmdirty_region_slot(r),
		.flags = on ? KVM_MEM_LOG_DIRTY_PAGES : 0,
		.guest_phys_addr = kvmdirty_region_gpa(r),
		.memory_size = kvmdirty_region_size(r),
		.userspace_addr = (uintptr_t)kvmdirty_region_hva(r),
	};

	if (!raw)
		ck_assert_ok(kvmdirty_region_set_logging(tv->vm, r, on));
	else
		ck_assert_msg(ioctl(kvmdirty_vm_fd(tv->vm), KVM_SET_USER_MEMORY_REGION, &m) == 0,
			      "KVM_SET_USER_MEMORY_REGION slot %u flags %u: %s", m.slot, m.flags, strerror(errno));
}

/*
 * Invariant 8: writes made while logging is off for a tracked region are
 * reported, whether it comes back on or not.  The guest writes the region
 * every pass; logging goes off, on, and off again, and the run ends with
 * it off.  Loop index: mode, and whether the switch goes behind the
 * library's back (bitmap modes only: nothing tells a ring about it).
 */
START_TEST(logging_switched_behind_tracker)
{
	enum kvmdirty_mode mode = modes[_i % MODES];
	bool raw = _i >= MODES;
	uint64_t size = 1 << 20;
	struct kvmdirty_region *r;
	struct rig g = { 0 };
	void *mem;

	one_region(&g, mode, size, &mem, &r);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);
	rig_run_pass(g.tv, 0);
	rig_sync_consume(&g);

	set_logging(g.tv, r, false, raw);
	rig_run_pass(g.tv, 0);
	rig_sync_consume(&g);
	rig_run_pass(g.tv, 0);
	rig_sync_consume(&g);
	/* not only the first sync after the switch: every sync while off takes it all */
	rig_expect_fresh(&g, "logging off, a later sync");
	rig_run_pass(g.tv, 0); /* written after the last sync while off */
	set_logging(g.tv, r, true, raw);
	rig_run_pass(g.tv, 0);
	rig_sync_consume(&g);
	rig_expect_fresh(&g, "logging back on");
	set_logging(g.tv, r, false, raw);
	rig_run_pass(g.tv, 0);
	rig_sync_consume(&g);
	rig_expect_fresh(&g, "logging off at the end");
	/* still tracked: stop works, and leaves logging off */
	ck_assert_ok(kvmdirty_tracker_stop(g.t, r));
	ck_assert_uint_eq(kvmdirty_region_flags(r) & KVMDIRTY_REGION_LOG_DIRTY, 0);
	printf("logging switched %s behind a tracked region (%s): guest pass %" PRIu64 ", no stale copy\n",
	       raw ? "by a raw ioctl" : "through the library", mode_name(mode), testvm_mailbox(g.tv, 0)->pass);
	testvm_free(g.tv);
	testvm_unmap(mem, size);
	rig_free(&g);
}
END_TEST

/* ---- changes during start ---- */

static struct {
	struct testvm *tv;
	int armed;
	bool replace; /* remove the region and add one of twice its size, which takes its slot */
	void *new_mem;
	struct kvmdirty_region *new_r;
} los;

static void los_point(enum kd_hook_point p, void *obj)
{
	struct kvmdirty_region *r = obj;
	uint64_t size = kvmdirty_region_size(r), gpa = kvmdirty_region_gpa(r);

	if (p != KD_HOOK_START_INSTALL || !__atomic_exchange_n(&los.armed, 0, __ATOMIC_ACQ_REL))
		return;
	/* the VMM's change, landing while start runs (no lock held here) */
	if (!los.replace) {
		ck_assert_ok(kvmdirty_region_set_logging(los.tv->vm, r, false));
		return;
	}
	ck_assert_ok(kvmdirty_region_remove(los.tv->vm, r));
	ck_assert_ok(testvm_add_memory(los.tv, gpa, 2 * size, 0, &los.new_mem, &los.new_r));
}

/*
 * A change while start runs, before it took the regions lock (outside
 * the threading contract: changes are not concurrent with each other;
 * still, nothing may be lost or overrun).  Loop index: mode, and (from
 * MODES on) the change.  Logging switched off: start switches it on and
 * tracks the region, every write reported.  When start let go of the
 * lock between logging on and the state going in, the switch landed in
 * between and was ignored (the slot not yet tracked): in ring mode the
 * region's writes were never reported.  The region removed and a larger
 * one added in its slot: start refuses (-EINVAL), the new region is not
 * tracked, and nothing sized for the old one is used for it.
 */
START_TEST(change_during_start)
{
	enum kvmdirty_mode mode = modes[_i % MODES];
	uint64_t size = 1 << 20;
	struct kvmdirty_region *r;
	struct rig g = { 0 };
	void *mem;
	int ret;

	one_region(&g, mode, size, &mem, &r);
	ck_assert_ok(kvmdirty_tracker_start(g.t, g.tv->sys_region));
	ck_assert_ok(kvmdirty_region_set_logging(g.tv->vm, r, true));
	los = (typeof(los)){ .tv = g.tv, .armed = 1, .replace = _i >= MODES };
	kd_test_hooks_set(NULL, los_point, false);
	ret = kvmdirty_tracker_start(g.t, r);
	hooks_off();
	ck_assert_int_eq(los.armed, 0);
	if (los.replace) {
		ck_assert_int_eq(ret, -EINVAL);
		ck_assert_uint_eq(kvmdirty_region_flags(los.new_r) & KVMDIRTY_REGION_LOG_DIRTY, 0);
		rig_consume(&g); /* the system region's first pass */
		ck_assert_int_ge(kvmdirty_tracker_sync(g.t), 0);
		rig_consume(&g);
		ck_assert_uint_eq(kvmdirty_tracker_pending(g.t), 0);
		printf("region replaced during start (%s): refused, the new region untracked\n", mode_name(mode));
		testvm_free(g.tv);
		testvm_unmap(los.new_mem, 2 * size);
		testvm_unmap(mem, size);
		rig_free(&g);
		return;
	}
	ck_assert_int_eq(ret, 0);
	ck_assert_uint_ne(kvmdirty_region_flags(r) & KVMDIRTY_REGION_LOG_DIRTY, 0);
	rig_consume(&g);
	rig_run_pass(g.tv, 0);
	rig_sync_consume(&g);
	rig_expect_fresh(&g, "logging off during start, first sync");
	rig_run_pass(g.tv, 0);
	rig_sync_consume(&g);
	rig_expect_fresh(&g, "logging off during start, a later sync");
	printf("logging off during start (%s): guest pass %" PRIu64 ", no stale copy\n", mode_name(mode),
	       testvm_mailbox(g.tv, 0)->pass);
	testvm_free(g.tv);
	testvm_unmap(mem, size);
	rig_free(&g);
}
END_TEST

/* The ioctl hook: fail the n-th call of one request, once. */
static struct {
	unsigned long req;
	unsigned int skip; /* calls to let through first */
	int err;
	unsigned int seen, failed;
} inject;

static int inject_ioctl(int fd, unsigned long req, void *arg)
{
	if (req != inject.req || inject.failed)
		return KD_HOOK_PASS;
	if (inject.seen++ < inject.skip)
		return KD_HOOK_PASS;
	inject.failed++;
	return -inject.err;
}

static void inject_arm(unsigned long req, unsigned int skip, int err)
{
	inject.req = req;
	inject.skip = skip;
	inject.err = err;
	inject.seen = inject.failed = 0;
	kd_test_hooks_set(inject_ioctl, NULL, false);
}

/*
 * A sync that fails partway keeps what it fetched: in DIRTY_LOG mode KVM
 * cleared those bits, so a page dropped here is lost for good.  The sync
 * fails on its third region (the system region and the first data region
 * fetched); in ring mode the reset fails instead, which leaves the
 * harvested pages unprotected: everything is protected again and made
 * pending.  Pending counts must stay consistent (no wrap) and the next
 * calls hand every fetched page out.
 */
START_TEST(sync_fails_partway)
{
	enum kvmdirty_mode mode = modes[_i];
	uint64_t size = 1 << 20, total = (GUEST_SYS_SIZE + 2 * size) / PAGE, pending, handed;
	struct kvmdirty_region *a, *b;
	struct rig g = { 0 };
	int64_t ret;
	void *ma, *mb;

	hooks_off();
	g.tv = new_tracked(mode, 1);
	g.t = g.tv->tracker;
	ck_assert_ok(testvm_add_memory(g.tv, 4 * GIB, size, 0, &ma, &a));
	ck_assert_ok(testvm_add_memory(g.tv, 8 * GIB, size, 0, &mb, &b));
	rig_add_copy(&g, g.tv->sys_region, true, false);
	rig_add_copy(&g, a, false, false);
	rig_add_copy(&g, b, false, false);
	/* the guest writes both regions: a sequential pass over [4 GiB, 8 GiB + 1 MiB) would be too long */
	rig_work(g.tv, 0, 4 * GIB, size / PAGE, GUEST_SEQUENTIAL, GUEST_F_EXIT_EVERY_PASS);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);
	rig_run_pass(g.tv, 0);
	testvm_mailbox(g.tv, 0)->gpa = 8 * GIB;
	rig_run_pass(g.tv, 0);

	if (mode == KVMDIRTY_MODE_DIRTY_RING)
		inject_arm(KVM_RESET_DIRTY_RINGS, 0, EIO);
	else
		inject_arm(KVM_GET_DIRTY_LOG, 2, EIO);
	ret = kvmdirty_tracker_sync(g.t);
	ck_assert_msg(ret == -EIO, "%s: sync with an ioctl failing: %" PRId64 ", expected -EIO", mode_name(mode), ret);
	ck_assert_uint_eq(inject.failed, 1);
	kd_test_hooks_set(NULL, NULL, false);
	pending = kvmdirty_tracker_pending(g.t);
	ck_assert_msg(pending > 0 && pending <= total, "%s: %" PRIu64 " pages pending after the failed sync (of %" PRIu64
		      ")", mode_name(mode), pending, total);
	/* the next calls hand out exactly what is pending */
	handed = g.handed_out;
	rig_consume(&g);
	ck_assert_uint_eq(g.handed_out - handed, pending);
	ck_assert_uint_eq(kvmdirty_tracker_pending(g.t), 0);
	/* the rest comes with the next sync; nothing the failed one fetched is lost */
	rig_sync_consume(&g);
	ck_assert_uint_le(kvmdirty_tracker_pending(g.t), total);
	rig_expect_fresh(&g, mode_name(mode));
	printf("sync failing partway (%s): %" PRIu64 " pages kept pending and handed out\n", mode_name(mode), pending);
	testvm_free(g.tv);
	testvm_unmap(ma, size);
	testvm_unmap(mb, size);
	rig_free(&g);
}
END_TEST

/* A stop whose memslot ioctl fails keeps the region tracked: its writes are still reported. */
START_TEST(stop_fails_keeps_tracking)
{
	enum kvmdirty_mode mode = modes[_i];
	unsigned long req;
	uint64_t size = 1 << 20;
	struct kvmdirty_region *r;
	struct rig g = { 0 };
	void *mem;

	hooks_off();
	g.tv = new_tracked(mode, 1);
	g.t = g.tv->tracker;
	req = kvmdirty_vm_cap(g.tv->vm, KVMDIRTY_CAP_USER_MEMORY2) ? KVM_SET_USER_MEMORY_REGION2
								   : KVM_SET_USER_MEMORY_REGION;
	ck_assert_ok(testvm_add_memory(g.tv, 4 * GIB, size, 0, &mem, &r));
	rig_add_copy(&g, g.tv->sys_region, true, false);
	rig_add_copy(&g, r, false, false);
	rig_work(g.tv, 0, 4 * GIB, size / PAGE, GUEST_SEQUENTIAL, GUEST_F_EXIT_EVERY_PASS | GUEST_F_CHECK);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);

	inject_arm(req, 0, EIO);
	ck_assert_errno(kvmdirty_tracker_stop(g.t, r), EIO);
	inject_arm(req, 1, EIO); /* stop of everything: the system region stops, the data region fails */
	ck_assert_errno(kvmdirty_tracker_stop(g.t, NULL), EIO);
	kd_test_hooks_set(NULL, NULL, false);
	g.copies[0].region = NULL; /* no longer tracked: not compared */
	ck_assert_uint_eq(kvmdirty_region_flags(g.tv->sys_region) & KVMDIRTY_REGION_LOG_DIRTY, 0);
	ck_assert_uint_ne(kvmdirty_region_flags(r) & KVMDIRTY_REGION_LOG_DIRTY, 0);
	rig_run_pass(g.tv, 0);
	rig_sync_consume(&g);
	rig_expect_fresh(&g, mode_name(mode));
	ck_assert_ok(kvmdirty_tracker_stop(g.t, NULL));
	ck_assert_uint_eq(kvmdirty_tracker_pending(g.t), 0);
	testvm_free(g.tv);
	testvm_unmap(mem, size);
	rig_free(&g);
}
END_TEST

/*
 * Marks from two threads while a third moves regions and adds and removes
 * others (the index is rebuilt under the marks), and the main thread syncs
 * and takes pages out, round after round.  Every page marked in a round
 * must be handed out exactly once in it:
 *   - S stays put; every page is marked once by gpa;
 *   - N moves back and forth far away; every page is marked once by hva;
 *   - M moves by one page back and forth; gpa B + q pages (q even) lies in
 *     M at both places, as its page q or q + 1: exactly one of the two.
 */
#define MARK_S_PAGES 4096
#define MARK_N_PAGES 4096
#define MARK_M_PAGES 8192
#define MARK_ROUNDS 12

struct mark_run {
	struct kvmdirty_tracker *t;
	struct kvmdirty_vm *vm;
	uint64_t gpa_s, gpa_m_b;
	uint8_t *hva_n;
	struct kvmdirty_region *m, *n;
	uint64_t gpa_m_a, gpa_n[2];
	uint8_t *scratch;
	pthread_barrier_t start, done;
	int marking, stop;
	uint64_t moves, churn;
};

static void *mark_by_gpa(void *p)
{
	struct mark_run *run = p;
	uint64_t *order = malloc((MARK_S_PAGES + MARK_M_PAGES / 2) * sizeof(*order));
	uint64_t n, i, x = 0x9e3779b97f4a7c15ull;
	unsigned int round;

	for (round = 0; round < MARK_ROUNDS; round++) {
		pthread_barrier_wait(&run->start);
		for (n = 0, i = 0; i < MARK_S_PAGES; i++)
			order[n++] = run->gpa_s + i * PAGE;
		for (i = 0; i < MARK_M_PAGES - 1; i += 2)
			order[n++] = run->gpa_m_b + i * PAGE + (i % 7);
		shuffle_u64(order, n, &x);
		for (i = 0; i < n; i++)
			if (kvmdirty_tracker_mark_dirty_gpa(run->t, order[i], 1))
				abort();
		__atomic_fetch_sub(&run->marking, 1, __ATOMIC_RELEASE);
		pthread_barrier_wait(&run->done);
	}
	free(order);
	return NULL;
}

static void *mark_by_hva(void *p)
{
	struct mark_run *run = p;
	uint64_t *order = malloc(MARK_N_PAGES * sizeof(*order)), i, x = 0x2545f4914f6cdd1dull;
	unsigned int round;

	for (round = 0; round < MARK_ROUNDS; round++) {
		pthread_barrier_wait(&run->start);
		for (i = 0; i < MARK_N_PAGES; i++)
			order[i] = i;
		shuffle_u64(order, MARK_N_PAGES, &x);
		for (i = 0; i < MARK_N_PAGES; i++)
			if (kvmdirty_tracker_mark_dirty_hva(run->t, run->hva_n + order[i] * PAGE + 100, PAGE - 200))
				abort();
		__atomic_fetch_sub(&run->marking, 1, __ATOMIC_RELEASE);
		pthread_barrier_wait(&run->done);
	}
	free(order);
	return NULL;
}

static void *move_regions(void *p)
{
	struct mark_run *run = p;
	struct kvmdirty_region *tmp[8];
	unsigned int k;

	while (!__atomic_load_n(&run->stop, __ATOMIC_ACQUIRE)) {
		uint64_t flip = run->moves & 1;

		if (kvmdirty_region_move(run->vm, run->m, flip ? run->gpa_m_a : run->gpa_m_b) ||
		    kvmdirty_region_move(run->vm, run->n, run->gpa_n[!flip]))
			abort();
		run->moves++;
		/* more regions and back: the index grows and shrinks under the marks */
		for (k = 0; k < 8; k++)
			if (kvmdirty_region_add(run->vm, 32 * GIB + k * (1 << 20), 1 << 20, run->scratch, 0, &tmp[k]))
				abort();
		for (k = 0; k < 8; k++)
			if (kvmdirty_region_remove(run->vm, tmp[k]))
				abort();
		run->churn++;
	}
	return NULL;
}

/* ---- move_never_waits_for_marks ---- */

static struct {
	struct handoff at_mark, at_edit;
	int hold_mark, hold_edit, mover_done, marker_done;
	struct kvmdirty_tracker *t;
	struct kvmdirty_vm *vm;
	struct kvmdirty_region *m;
	uint64_t to, mark_gpa;
} mv;

static void mv_point(enum kd_hook_point p, void *obj)
{
	(void)obj;
	if (p == KD_HOOK_MARK_TOUCH && __atomic_exchange_n(&mv.hold_mark, 0, __ATOMIC_ACQ_REL)) {
		handoff_post(&mv.at_mark);
		handoff_wait_go(&mv.at_mark, 20000);
	} else if (p == KD_HOOK_MOVE_EDIT && __atomic_exchange_n(&mv.hold_edit, 0, __ATOMIC_ACQ_REL)) {
		handoff_post(&mv.at_edit);
		handoff_wait_go(&mv.at_edit, 20000);
	}
}

static void *mv_mover(void *p)
{
	(void)p;
	if (kvmdirty_region_move(mv.vm, mv.m, mv.to))
		abort();
	__atomic_store_n(&mv.mover_done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static void *mv_marker(void *p)
{
	(void)p;
	if (kvmdirty_tracker_mark_dirty_gpa(mv.t, mv.mark_gpa, 1))
		abort();
	__atomic_store_n(&mv.marker_done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static bool mv_wait(int *flag, unsigned int ms)
{
	unsigned int i;

	for (i = 0; i < ms && !__atomic_load_n(flag, __ATOMIC_ACQUIRE); i++)
		rig_pause_us(1000);
	return __atomic_load_n(flag, __ATOMIC_ACQUIRE);
}

/*
 * A region move never waits for a mark: one marker held inside its mark
 * (its bits set, the mark lock still held for reading, as a marker
 * preempted there is) while the region moves; the move must end (5 s at
 * most) before the marker goes on.  A writer-preferring rwlock made it
 * wait for the marker: with eight markers on two CPUs, 20 ms at worst.
 * And a mark by guest address that comes while a move edits the index (a
 * move held there) resolves the address as after the move, never as half
 * of it: it waits, then marks the right page, and only it.
 */
START_TEST(move_never_waits_for_marks)
{
	struct kvmdirty_region *s, *m;
	struct kvmdirty_range rg[8];
	struct testvm *tv;
	pthread_t a, b;
	void *ms_, *mm;
	int n;

	hooks_off();
	tv = new_tracked(KVMDIRTY_MODE_CLEAR_LOG, 1);
	ck_assert_ok(testvm_add_memory(tv, 4 * GIB, 1024 * PAGE, 0, &ms_, &s));
	ck_assert_ok(testvm_add_memory(tv, 8 * GIB, 512 * PAGE, 0, &mm, &m));
	ck_assert_ok(kvmdirty_tracker_start(tv->tracker, s));
	ck_assert_ok(kvmdirty_tracker_start(tv->tracker, m));
	ck_assert_int_ge(kvmdirty_tracker_sync(tv->tracker), 0);
	while (kvmdirty_tracker_next(tv->tracker, rg, 8, 0) > 0)
		;
	mv = (typeof(mv)){ .at_mark = HANDOFF_INIT, .at_edit = HANDOFF_INIT, .t = tv->tracker, .vm = tv->vm, .m = m };

	/* a marker held inside its mark; the move goes through meanwhile */
	mv.hold_mark = 1;
	mv.mark_gpa = 4 * GIB + 7 * PAGE;
	kd_test_hooks_set(NULL, mv_point, false);
	ck_assert_int_eq(pthread_create(&a, NULL, mv_marker, NULL), 0);
	handoff_wait_posted(&mv.at_mark);
	mv.to = 16 * GIB;
	ck_assert_int_eq(pthread_create(&b, NULL, mv_mover, NULL), 0);
	ck_assert_msg(mv_wait(&mv.mover_done, 5000), "a move waited 5 s for a mark held inside it");
	handoff_go(&mv.at_mark);
	pthread_join(a, NULL);
	pthread_join(b, NULL);

	/* a move held as it edits the index; a mark of its new address waits, then marks page 5 of it */
	mv.marker_done = mv.mover_done = 0;
	mv.hold_edit = 1;
	mv.to = 24 * GIB;
	ck_assert_int_eq(pthread_create(&b, NULL, mv_mover, NULL), 0);
	handoff_wait_posted(&mv.at_edit);
	mv.mark_gpa = 24 * GIB + 5 * PAGE;
	ck_assert_int_eq(pthread_create(&a, NULL, mv_marker, NULL), 0);
	ck_assert_msg(!mv_wait(&mv.marker_done, 200), "a mark of the new address returned while the move edited "
		      "the index: it resolved the address half way");
	handoff_go(&mv.at_edit);
	pthread_join(b, NULL);
	pthread_join(a, NULL);
	hooks_off();
	ck_assert_int_ge(kvmdirty_tracker_sync(tv->tracker), 0);
	n = kvmdirty_tracker_next(tv->tracker, rg, 8, 0);
	ck_assert_int_eq(n, 2);
	/* S's page 7 (the first mark), M's page 5 (the second), nothing else */
	ck_assert_msg(rg[0].region == s && rg[0].page == 7 && rg[0].npages == 1, "first run: region %p page %" PRIu64
		      " x%" PRIu64, (void *)rg[0].region, rg[0].page, rg[0].npages);
	ck_assert_msg(rg[1].region == m && rg[1].page == 5 && rg[1].npages == 1 && rg[1].gpa == 24 * GIB + 5 * PAGE,
		      "second run: page %" PRIu64 " x%" PRIu64 " at gpa 0x%" PRIx64, rg[1].page, rg[1].npages,
		      rg[1].gpa);
	printf("a move ended while a mark was held inside; a mark during a move's edit waited and marked page 5\n");
	testvm_free(tv);
	testvm_unmap(ms_, 1024 * PAGE);
	testvm_unmap(mm, 512 * PAGE);
}
END_TEST

START_TEST(marks_while_regions_change)
{
	struct kvmdirty_region *s, *m, *n;
	struct mark_run run = { 0 };
	pthread_t th[3];
	struct copy *cs, *cm, *cn;
	struct rig g = { 0 };
	void *mem_s, *mem_m, *mem_n;
	unsigned int round;
	uint64_t i;

	hooks_off();
	g.tv = new_tracked(KVMDIRTY_MODE_CLEAR_LOG, 1);
	g.t = g.tv->tracker;
	g.regions_move = true;
	ck_assert_ok(testvm_add_memory(g.tv, 4 * GIB, MARK_S_PAGES * PAGE, 0, &mem_s, &s));
	ck_assert_ok(testvm_add_memory(g.tv, 8 * GIB, MARK_M_PAGES * PAGE, 0, &mem_m, &m));
	ck_assert_ok(testvm_add_memory(g.tv, 12 * GIB, MARK_N_PAGES * PAGE, 0, &mem_n, &n));
	rig_add_copy(&g, g.tv->sys_region, false, false);
	cs = rig_add_copy(&g, s, false, true);
	cm = rig_add_copy(&g, m, false, true);
	cn = rig_add_copy(&g, n, false, true);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_sync_consume(&g);
	rig_sync_consume(&g); /* INITIALLY_SET: the first GET reports every page once more */
	rig_sync_consume(&g);

	run = (struct mark_run){ .t = g.t, .vm = g.tv->vm, .gpa_s = 4 * GIB, .gpa_m_a = 8 * GIB,
				 .gpa_m_b = 8 * GIB + PAGE, .hva_n = mem_n, .m = m, .n = n,
				 .gpa_n = { 12 * GIB, 20 * GIB } };
	run.scratch = testvm_map(1 << 20);
	ck_assert_ptr_nonnull(run.scratch);
	pthread_barrier_init(&run.start, NULL, 3);
	pthread_barrier_init(&run.done, NULL, 3);
	ck_assert_int_eq(pthread_create(&th[0], NULL, move_regions, &run), 0);
	ck_assert_int_eq(pthread_create(&th[1], NULL, mark_by_gpa, &run), 0);
	ck_assert_int_eq(pthread_create(&th[2], NULL, mark_by_hva, &run), 0);
	for (round = 0; round < MARK_ROUNDS; round++) {
		memset(cs->reported, 0, MARK_S_PAGES * sizeof(uint32_t));
		memset(cm->reported, 0, MARK_M_PAGES * sizeof(uint32_t));
		memset(cn->reported, 0, MARK_N_PAGES * sizeof(uint32_t));
		__atomic_store_n(&run.marking, 2, __ATOMIC_RELEASE);
		pthread_barrier_wait(&run.start);
		while (__atomic_load_n(&run.marking, __ATOMIC_ACQUIRE))
			rig_sync_consume(&g);
		pthread_barrier_wait(&run.done);
		rig_sync_consume(&g);
		for (i = 0; i < MARK_S_PAGES; i++)
			expect(cs->reported[i] == 1, "round %u: S page %" PRIu64 " (marked by gpa) handed out %u times",
			       round, i, cs->reported[i]);
		for (i = 0; i < MARK_N_PAGES; i++)
			expect(cn->reported[i] == 1, "round %u: N page %" PRIu64 " (marked by hva, moving) handed out %u times",
			       round, i, cn->reported[i]);
		for (i = 0; i < MARK_M_PAGES; i += 2)
			expect(cm->reported[i] + cm->reported[i + 1] == 1,
			       "round %u: M pages %" PRIu64 "/%" PRIu64 " (one gpa mark, M moving) handed out %u + %u times",
			       round, i, i + 1, cm->reported[i], cm->reported[i + 1]);
	}
	__atomic_store_n(&run.stop, 1, __ATOMIC_RELEASE);
	for (i = 0; i < 3; i++)
		pthread_join(th[i], NULL);
	printf("marks while regions change: %d rounds of %d marks, %" PRIu64 " moves of two regions, %" PRIu64
	       " rounds of 8 regions added and removed; each marked page handed out once a round\n",
	       MARK_ROUNDS, MARK_S_PAGES + MARK_N_PAGES + MARK_M_PAGES / 2, run.moves, run.churn);
	ck_assert_uint_gt(run.moves, 1);
	pthread_barrier_destroy(&run.start);
	pthread_barrier_destroy(&run.done);
	testvm_free(g.tv);
	testvm_unmap(run.scratch, 1 << 20);
	testvm_unmap(mem_s, MARK_S_PAGES * PAGE);
	testvm_unmap(mem_m, MARK_M_PAGES * PAGE);
	testvm_unmap(mem_n, MARK_N_PAGES * PAGE);
	rig_free(&g);
}
END_TEST

/*
 * A mark over most of the address space walks the tracked regions, not
 * the holes (2^50 pages would never end): every tracked page is marked,
 * an untracked region is not.
 */
START_TEST(mark_huge_range)
{
	uint64_t size = 1 << 20, want = (GUEST_SYS_SIZE + 2 * size) / PAGE;
	struct kvmdirty_region *a, *b, *u;
	struct testvm *tv;
	void *ma, *mb, *mu;

	hooks_off();
	tv = new_tracked(KVMDIRTY_MODE_CLEAR_LOG, 1);
	ck_assert_ok(testvm_add_memory(tv, 4 * GIB, size, 0, &ma, &a));
	ck_assert_ok(testvm_add_memory(tv, 100 * GIB, size, 0, &mb, &b));
	ck_assert_ok(testvm_add_memory(tv, 50 * GIB, size, 0, &mu, &u));
	ck_assert_ok(kvmdirty_tracker_start(tv->tracker, tv->sys_region));
	ck_assert_ok(kvmdirty_tracker_start(tv->tracker, a));
	ck_assert_ok(kvmdirty_tracker_start(tv->tracker, b));
	ck_assert_uint_eq(kvmdirty_tracker_pending(tv->tracker), want);
	while (kvmdirty_tracker_pending(tv->tracker)) {
		struct kvmdirty_range rg[64];

		ck_assert_int_ge(kvmdirty_tracker_next(tv->tracker, rg, 64, 0), 0);
	}
	/* INITIALLY_SET: the first GET reports every page once more */
	ck_assert_int_ge(kvmdirty_tracker_sync(tv->tracker), 0);
	while (kvmdirty_tracker_pending(tv->tracker)) {
		struct kvmdirty_range rg[64];

		ck_assert_int_ge(kvmdirty_tracker_next(tv->tracker, rg, 64, 0), 0);
	}
	ck_assert_ok(kvmdirty_tracker_mark_dirty_gpa(tv->tracker, 0, 1ull << 62));
	ck_assert_int_eq(kvmdirty_tracker_sync(tv->tracker), (int64_t)want);
	ck_assert_ok(kvmdirty_tracker_stop(tv->tracker, NULL));
	ck_assert_ok(kvmdirty_tracker_start(tv->tracker, a));
	while (kvmdirty_tracker_pending(tv->tracker)) {
		struct kvmdirty_range rg[64];

		ck_assert_int_ge(kvmdirty_tracker_next(tv->tracker, rg, 64, 0), 0);
	}
	ck_assert_int_ge(kvmdirty_tracker_sync(tv->tracker), 0);
	while (kvmdirty_tracker_pending(tv->tracker)) {
		struct kvmdirty_range rg[64];

		ck_assert_int_ge(kvmdirty_tracker_next(tv->tracker, rg, 64, 0), 0);
	}
	/* by host address: from the first page to the top of user space */
	ck_assert_ok(kvmdirty_tracker_mark_dirty_hva(tv->tracker, (void *)(uintptr_t)PAGE, (1ull << 47) - 2 * PAGE));
	ck_assert_int_eq(kvmdirty_tracker_sync(tv->tracker), (int64_t)(size / PAGE));
	testvm_free(tv);
	testvm_unmap(ma, size);
	testvm_unmap(mb, size);
	testvm_unmap(mu, size);
}
END_TEST

struct marker {
	struct kvmdirty_tracker *t;
	uint64_t gpa, npages;
	uint8_t *hva;
	int done;
};

/* Mark every page once, in random order, by gpa or by hva. */
static void *mark_thread(void *p)
{
	struct marker *m = p;
	uint64_t *order = malloc(m->npages * sizeof(*order)), i, x = 0x9e3779b97f4a7c15ull;

	for (i = 0; i < m->npages; i++)
		order[i] = i;
	shuffle_u64(order, m->npages, &x);
	for (i = 0; i < m->npages; i++) {
		uint64_t pg = order[i];
		int ret = (i & 1) ? kvmdirty_tracker_mark_dirty_hva(m->t, m->hva + pg * PAGE + (i % 7), 1)
				  : kvmdirty_tracker_mark_dirty_gpa(m->t, m->gpa + pg * PAGE, PAGE);

		if (ret)
			abort();
	}
	free(order);
	__atomic_store_n(&m->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

START_TEST(mark_dirty_concurrent)
{
	struct marker m = { 0 };
	struct kvmdirty_region *r;
	struct rig g = { 0 };
	struct copy *c;
	pthread_t th;
	uint64_t p, size = 16 << 20;
	void *mem;

	hooks_off();
	g.tv = new_tracked(KVMDIRTY_MODE_AUTO, 1);
	g.t = g.tv->tracker;
	ck_assert_ok(testvm_add_memory(g.tv, 4 * GIB, size, 0, &mem, &r));
	rig_add_copy(&g, g.tv->sys_region, true, false);
	c = rig_add_copy(&g, r, false, true);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_sync_consume(&g);
	rig_sync_consume(&g); /* INITIALLY_SET: the first GET reports every page once more */
	rig_sync_consume(&g);
	memset(c->reported, 0, (size / PAGE) * sizeof(uint32_t));
	ck_assert_uint_eq(kvmdirty_tracker_pending(g.t), 0);

	/* bad input, and pages outside tracked memory, change nothing */
	ck_assert_errno(kvmdirty_tracker_mark_dirty_gpa(g.t, 4 * GIB, 0), EINVAL);
	ck_assert_errno(kvmdirty_tracker_mark_dirty_gpa(g.t, UINT64_MAX - 10, 100), EINVAL);
	ck_assert_errno(kvmdirty_tracker_mark_dirty_gpa(NULL, 4 * GIB, 1), EINVAL);
	ck_assert_ok(kvmdirty_tracker_mark_dirty_gpa(g.t, 64 * GIB, 1 << 20));
	ck_assert_ok(kvmdirty_tracker_mark_dirty_hva(g.t, &m, sizeof(m)));
	ck_assert_int_eq(kvmdirty_tracker_sync(g.t), 0);

	m = (struct marker){ .t = g.t, .gpa = 4 * GIB, .npages = size / PAGE, .hva = mem };
	ck_assert_int_eq(pthread_create(&th, NULL, mark_thread, &m), 0);
	while (!__atomic_load_n(&m.done, __ATOMIC_ACQUIRE))
		rig_sync_consume(&g);
	pthread_join(th, NULL);
	rig_sync_consume(&g);
	for (p = 0; p < size / PAGE; p++)
		expect(c->reported[p] == 1, "page %" PRIu64 " reported %u times", p, c->reported[p]);

	/* a range across the region's end marks only what is inside */
	ck_assert_ok(kvmdirty_tracker_mark_dirty_gpa(g.t, 4 * GIB + size - 2 * PAGE, 8 * PAGE));
	ck_assert_int_eq(kvmdirty_tracker_sync(g.t), 2);
	ck_assert_uint_eq(kvmdirty_tracker_pending(g.t), 2);
	testvm_free(g.tv);
	testvm_unmap(mem, size);
	rig_free(&g);
}
END_TEST

/* A vCPU the VMM created: registered, its ring mapped, its fd left open. */
START_TEST(vcpu_add_keeps_fd)
{
	struct kvmdirty_tracker_opts o = { .mode = KVMDIRTY_MODE_DIRTY_RING, .ring_entries = 4096 };
	struct kvmdirty_tracker *t;
	struct kvmdirty_vcpu *v, *w;
	struct kvmdirty_vm *vm;
	int fd;

	ck_assert_ok(kvmdirty_vm_new(&vm));
	ck_assert_ok(kvmdirty_tracker_new(vm, &o, &t));
	fd = ioctl(kvmdirty_vm_fd(vm), KVM_CREATE_VCPU, 0);
	ck_assert_int_ge(fd, 0);
	ck_assert_errno(kvmdirty_vcpu_add(vm, -1, &v), EBADF);
	ck_assert_ok(kvmdirty_vcpu_add(vm, fd, &v));
	ck_assert_int_eq(kvmdirty_vcpu_fd(v), fd);
	ck_assert_ptr_nonnull(kvmdirty_vcpu_kvm_run(v));
	ck_assert_ptr_nonnull(v->ring.gfns);
	ck_assert_errno(kvmdirty_vcpu_create(vm, 0, &w), EEXIST);
	ck_assert_ok(kvmdirty_vcpu_create(vm, 1, &w));
	ck_assert_ptr_nonnull(w->ring.gfns);
	ck_assert_int_eq(kvmdirty_tracker_sync(t), 0);
	kvmdirty_vcpu_free(v);
	ck_assert_int_ge(fcntl(fd, F_GETFD), 0); /* still the VMM's */
	kvmdirty_vm_free(vm);			  /* frees w */
	close(fd);
}
END_TEST

START_TEST(bad_setup)
{
	struct kvmdirty_tracker_opts o = { .mode = KVMDIRTY_MODE_DIRTY_RING, .ring_entries = 4096 };
	struct kvmdirty_tracker *t = NULL, *t2;
	struct kvmdirty_stats st;
	struct kvmdirty_range rg;
	struct kvmdirty_vcpu *v;
	struct kvmdirty_vm *vm;

	ck_assert_ok(kvmdirty_vm_new(&vm));
	o.ring_entries = 3000;
	ck_assert_errno(kvmdirty_tracker_new(vm, &o, &t), EINVAL);
	o.ring_entries = 1u << 30;
	ck_assert_errno(kvmdirty_tracker_new(vm, &o, &t), EINVAL);
	o = (struct kvmdirty_tracker_opts){ .mode = KVMDIRTY_MODE_CLEAR_LOG, .clear_chunk_pages = 100 };
	ck_assert_errno(kvmdirty_tracker_new(vm, &o, &t), EINVAL);
	o.mode = (enum kvmdirty_mode)42;
	o.clear_chunk_pages = 0;
	ck_assert_errno(kvmdirty_tracker_new(vm, &o, &t), EINVAL);
	ck_assert_errno(kvmdirty_tracker_new(NULL, NULL, &t), EINVAL);
	ck_assert_errno(kvmdirty_tracker_new(vm, NULL, NULL), EINVAL);
	ck_assert_ptr_null(t);
	/* NULL trackers: every call says so */
	ck_assert_errno(kvmdirty_tracker_sync(NULL), EINVAL);
	ck_assert_errno(kvmdirty_tracker_next(NULL, &rg, 1, 0), EINVAL);
	ck_assert_errno(kvmdirty_tracker_start(NULL, NULL), EINVAL);
	ck_assert_errno(kvmdirty_tracker_stop(NULL, NULL), EINVAL);
	ck_assert_errno(kvmdirty_tracker_stats(NULL, &st, sizeof(st)), EINVAL);
	ck_assert_uint_eq(kvmdirty_tracker_pending(NULL), 0);
	kvmdirty_tracker_free(NULL);
	/* a vCPU exists: the ring can no longer be enabled */
	ck_assert_ok(kvmdirty_vcpu_create(vm, 0, &v));
	o = (struct kvmdirty_tracker_opts){ .mode = KVMDIRTY_MODE_DIRTY_RING };
	ck_assert_errno(kvmdirty_tracker_new(vm, &o, &t), EBUSY);
	ck_assert_ok(kvmdirty_tracker_new(vm, NULL, &t));
	ck_assert_int_eq(kvmdirty_tracker_mode(t), KVMDIRTY_MODE_CLEAR_LOG);
	ck_assert_errno(kvmdirty_tracker_new(vm, NULL, &t2), EBUSY);
	ck_assert_errno(kvmdirty_tracker_next(t, NULL, 1, 0), EINVAL);
	ck_assert_errno(kvmdirty_tracker_stats(t, &st, 0), EINVAL);
	kvmdirty_tracker_free(t);
	/* manual protect stays on in KVM: a legacy tracker would be wrong */
	o.mode = KVMDIRTY_MODE_DIRTY_LOG;
	ck_assert_errno(kvmdirty_tracker_new(vm, &o, &t), EBUSY);
	ck_assert_ok(kvmdirty_tracker_new(vm, NULL, &t));
	kvmdirty_vm_free(vm); /* frees the tracker and the vCPU too */
}
END_TEST

int main(void)
{
	int skip = require_kvm("test-track");
	Suite *s;
	TCase *tc;

	if (skip)
		return skip; /* before Check allocates anything: no leak on the way out */
	s = suite_create("track");
	tc = tcase_create("track");
	tcase_set_timeout(tc, 240);
	tcase_add_loop_test(tc, no_lost_write, 0, (int)(sizeof(scenarios) / sizeof(scenarios[0])));
	tcase_add_test(tc, clear_after_read_loses_writes);
	tcase_add_loop_test(tc, lockstep_no_lost_write, 0, MODES);
	tcase_add_test(tc, lockstep_clear_after_read_loses_writes);
	tcase_add_loop_test(tc, exactly_once_per_pass, 0, MODES);
	tcase_add_loop_test(tc, logging_switched_behind_tracker, 0, MODES + 2);
	tcase_add_loop_test(tc, change_during_start, 0, 2 * MODES);
	tcase_add_loop_test(tc, sync_fails_partway, 0, MODES);
	tcase_add_loop_test(tc, stop_fails_keeps_tracking, 0, MODES);
	tcase_add_test(tc, marks_while_regions_change);
	tcase_add_test(tc, move_never_waits_for_marks);
	tcase_add_test(tc, mark_huge_range);
	tcase_add_test(tc, mark_dirty_concurrent);
	tcase_add_test(tc, bad_setup);
	tcase_add_test(tc, vcpu_add_keeps_fd);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
