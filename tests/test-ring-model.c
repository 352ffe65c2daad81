// SPDX-License-Identifier: MIT
/*
 * The ring backend (lib/dirty-ring.c) against a model of KVM's dirty ring,
 * with no KVM: the test build's ioctl hook answers KVM_RESET_DIRTY_RINGS
 * with the model's reset, and its named points push entries while a
 * harvest holds some marked (a vCPU running meanwhile) or reset behind the
 * library's back once.  The model does what KVM does (virt/kvm/dirty_ring.c):
 *
 *   push:  write slot and offset, then flags = DIRTY, at dirty_index,
 *          whatever the entry held (this host's KVM pushes past a full
 *          ring); dirty_index++;
 *   reset: from reset_index, while the entry's flags have RESET: zero it,
 *          reset_index++; returns the count.
 *
 * What must hold, whatever the order of pushes, harvests and resets:
 *   - KVM's reset never passes its write position (reset_index <=
 *     dirty_index): a free entry marked RESET would let it, and the vCPU
 *     would then see its ring full on every entry;
 *   - every entry handed back by kd_ring_collect() was reset before it
 *     returned (protect before read);
 *   - every push is handed back, unless a loss was reported: an entry
 *     overwritten before its harvest must be followed by a loss report;
 *   - the ring recovers: once pushes stop outrunning it, a few harvests
 *     bring KVM's reset index to its write position.
 * Pure: never skips.
 */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <linux/kvm.h>

#include "dirty-ring.h"
#include "hooks.h"
#include "rng.h"
#include "test-util.h"

#define MAX_PUSHES (1u << 20)
#define MAX_RINGS 8

static struct model {
	struct kvm_dirty_gfn *gfns;
	uint32_t size, soft, di, ri;
	/* per push (by position): delivered, overwritten before harvest, reset by KVM */
	uint8_t *delivered, *lost, *reprotected;
	/* pushes made before a collect that reported some harvested entries unprotected */
	uint32_t excused_below;
	uint64_t pushes, resets_outside, full_exits;
	/* what the hooks do */
	uint32_t push_at_harvested; /* entries a running vCPU pushes at KD_HOOK_RING_HARVESTED */
	bool push_once;		    /* ... at the first one only */
	bool reset_at_harvested;    /* something outside the library resets at KD_HOOK_RING_HARVESTED */
	bool in_handler;	    /* the vCPU is stopped in its ring-full exit: it pushes nothing */
	bool overwrite_taken;	    /* at KD_HOOK_RING_TAKEN, once: push over the entry being taken */
	uint64_t rng;
} ms[MAX_RINGS];

/* The model KVM: a ring a vCPU, nr_models of them; m is the one being worked on (hooks set it from the ring). */
static unsigned int cur, nr_models = 1;
#define m (ms[cur])

static void model_push(void)
{
	struct kvm_dirty_gfn *e = &m.gfns[m.di & (m.size - 1)];

	expect(m.di < MAX_PUSHES, "more than %u pushes", MAX_PUSHES);
	/* an entry pushed and never harvested is lost when overwritten */
	if (__atomic_load_n(&e->flags, __ATOMIC_ACQUIRE) == KVM_DIRTY_GFN_F_DIRTY)
		m.lost[(uint32_t)e->offset] = 1;
	e->slot = 1;
	e->offset = m.di; /* the offset names the push */
	__atomic_store_n(&e->flags, KVM_DIRTY_GFN_F_DIRTY, __ATOMIC_RELEASE);
	m.di++;
	m.pushes++;
}

static int model_reset_one(void)
{
	int n = 0;

	while (__atomic_load_n(&m.gfns[m.ri & (m.size - 1)].flags, __ATOMIC_ACQUIRE) & KVM_DIRTY_GFN_F_RESET) {
		struct kvm_dirty_gfn *e = &m.gfns[m.ri & (m.size - 1)];

		/* KVM protects the page the entry names now, whichever push wrote it */
		m.reprotected[(uint32_t)e->offset] = 1;
		__atomic_store_n(&e->flags, 0, __ATOMIC_RELEASE);
		m.ri++;
		n++;
	}
	expect((int32_t)(m.di - m.ri) >= 0, "KVM's reset ran past its write position: reset_index %u, dirty_index %u",
	       m.ri, m.di);
	return n;
}

/* KVM_RESET_DIRTY_RINGS: every vCPU's ring, as KVM walks them. */
static int model_reset(void)
{
	unsigned int k, was = cur;
	int n = 0;

	for (k = 0; k < nr_models; k++) {
		cur = k;
		n += model_reset_one();
	}
	cur = was;
	return n;
}

static bool model_full(void)
{
	return m.di - m.ri >= m.soft;
}

static int fail_resets; /* the next resets that fail (-EIO), before KVM sees them */

static int hook_ioctl(int fd, unsigned long req, void *arg)
{
	(void)fd;
	(void)arg;
	expect(req == KVM_RESET_DIRTY_RINGS, "ioctl 0x%lx", req);
	if (fail_resets > 0) {
		fail_resets--;
		return -EIO;
	}
	return model_reset();
}

static void hook_point_ring(enum kd_hook_point p, struct kd_ring *ring);

/* The hooks act on the model of the ring they name. */
static void hook_point(enum kd_hook_point p, void *obj)
{
	struct kd_ring *ring = obj;
	unsigned int k, was = cur;

	for (k = 0; k < nr_models && ms[k].gfns != ring->gfns; k++)
		;
	if (k == nr_models)
		return;
	cur = k;
	hook_point_ring(p, ring);
	cur = was;
}

static void hook_point_ring(enum kd_hook_point p, struct kd_ring *ring)
{
	uint32_t i;

	if (p == KD_HOOK_RING_TAKEN && m.overwrite_taken) {
		m.overwrite_taken = false;
		while ((m.di & (m.size - 1)) != (ring->fetch & (m.size - 1)))
			model_push();
		model_push();
	}
	if (p == KD_HOOK_RING_HARVESTED && !m.in_handler) {
		for (i = 0; i < m.push_at_harvested; i++)
			model_push();
		if (m.push_once)
			m.push_at_harvested = 0;
	}
	if (p == KD_HOOK_RING_HARVESTED && m.reset_at_harvested) {
		model_reset();
		m.resets_outside++;
	}
}

static void model_init(uint32_t size, uint64_t seed)
{
	free(m.gfns);
	free(m.delivered);
	free(m.lost);
	free(m.reprotected);
	memset(&m, 0, sizeof(m));
	m.size = size;
	m.soft = size - 64; /* KVM's reserve without PML */
	m.gfns = calloc(size, sizeof(*m.gfns));
	m.delivered = calloc(MAX_PUSHES, 1);
	m.lost = calloc(MAX_PUSHES, 1);
	m.reprotected = calloc(MAX_PUSHES, 1);
	m.rng = seed;
	kd_test_hooks_set(hook_ioctl, hook_point, false);
}

static struct kd_kvm kvm = { .vm_fd = -1 };
static struct kd_ring_entry *buf;
static unsigned int loss_seen;

/* A fresh model of size entries and the library's ring over it. */
static struct kd_ring model_ring(uint32_t size, uint64_t seed)
{
	struct kd_ring ring = { 0 };

	nr_models = 1;
	cur = 0;
	model_init(size, seed);
	loss_seen = 0;
	buf = realloc(buf, 2 * size * sizeof(*buf));
	ck_assert_ptr_nonnull(buf);
	ring.gfns = m.gfns;
	ring.size = size;
	return ring;
}

/* One collect; checks that what it returns was protected again; returns its loss bits. */
static unsigned int collect(struct kd_ring *ring, bool ring_full)
{
	unsigned int loss = 0;
	uint64_t ns = 0;
	int64_t n, i;

	m.in_handler = ring_full;
	n = kd_ring_collect(ring, &kvm, buf, 2 * m.size, ring_full, &loss, &ns);
	m.in_handler = false;
	expect(n >= 0, "collect: %" PRId64, n);
	for (i = 0; i < n; i++) {
		uint64_t pos = buf[i].offset;

		expect(buf[i].slot == 1, "slot %u", buf[i].slot);
		expect(pos < m.di, "collect returned push %" PRIu64 ", only %u were made", pos, m.di);
		/* protected again before it was handed back, or a loss reported (the tracker then protects all) */
		expect(m.reprotected[pos] || (loss & (KD_RING_OVERFLOW | KD_RING_UNPROTECTED)),
		       "push %" PRIu64 " handed back before its reset, no loss reported (reset_index %u)", pos, m.ri);
		m.delivered[pos] = 1;
	}
	/* entries taken but not protected again are not handed back: the tracker protects all, all pending */
	if (loss & KD_RING_UNPROTECTED)
		m.excused_below = m.di;
	loss_seen |= loss;
	return loss;
}

/*
 * The vCPU runs: it pushes up to n entries, and over more past its soft
 * limit (this host's emulator overshoots).  KVM checks the soft limit
 * before entering the guest and after each push: returns true if the vCPU
 * stopped in a ring-full exit.  progress gets the entries pushed.
 */
static bool vcpu_run(uint32_t n, uint32_t over, uint32_t *progress)
{
	uint32_t done = 0;

	if (model_full()) {
		*progress = 0;
		return true;
	}
	while (done < n) {
		if (model_full() && !over--)
			break;
		model_push();
		done++;
	}
	*progress = done;
	return model_full();
}

/* A ring-full exit, handled: sometimes a sync takes the ring first (after the exit, before the handler). */
static void ring_full_exit(struct kd_ring *ring, bool sync_first)
{
	m.full_exits++;
	if (sync_first)
		collect(ring, false);
	collect(ring, true);
}

static void check_silent_loss(uint64_t seed, unsigned int round)
{
	uint64_t p;

	for (p = 0; p < m.di; p++)
		if (m.lost[p] && !m.delivered[p] && !(loss_seen & (KD_RING_OVERFLOW | KD_RING_UNPROTECTED)))
			ck_abort_msg("seed %" PRIu64 " round %u: push %" PRIu64 " lost without a loss report", seed, round, p);
}

/*
 * The stop-and-copy: the vCPU writes a little and stops; one sync (not a
 * ring-full exit) must hand back everything pushed, lost entries and those
 * a collect said it could not protect aside.
 */
static void stop_and_copy(struct kd_ring *ring, uint64_t seed, unsigned int round)
{
	uint32_t progress, pushes = m.push_at_harvested;
	uint64_t p;

	if (model_full())
		return;
	vcpu_run(8, 0, &progress);
	m.push_at_harvested = 0; /* stopped: it pushes nothing while the sync runs */
	collect(ring, false);
	m.push_at_harvested = pushes;
	for (p = 0; p < m.di; p++)
		expect(m.delivered[p] || m.lost[p] || p < m.excused_below,
		       "seed %" PRIu64 " round %u: push %" PRIu64 " not handed back by a sync after the vCPU stopped "
		       "(KVM reset %u, write %u; library fetch %u, reset %u, suspect %d)",
		       seed, round, p, m.ri, m.di, ring->fetch, ring->reset_pos, ring->suspect);
}

/*
 * A vCPU that overshoots its ring now and then, harvests from a sync at
 * random moments (sometimes between a ring-full exit and its handler),
 * pushes while a sync holds marked entries, resets from outside.  Then
 * a quiet phase: the vCPU must make progress and the ring come back to
 * KVM's count.
 */
static void stress(uint32_t size, uint64_t seed, uint32_t push_at_harvested, uint32_t max_over)
{
	struct kd_ring ring = model_ring(size, seed);
	uint64_t lost = 0, p, exits_quiet = 0, quiet_pushes = 0;
	unsigned int round;
	uint32_t progress;

	m.push_at_harvested = push_at_harvested;
	for (round = 0; round < 2000 && m.di < MAX_PUSHES / 2; round++) {
		uint64_t r = xorshift64(&m.rng);
		uint32_t over = (r % 4 == 0) ? (uint32_t)(r >> 8) % (max_over + 1) : 0;

		if (vcpu_run((uint32_t)(r >> 20) % size, over, &progress))
			ring_full_exit(&ring, (r >> 40) % 3 == 0);
		else if ((r >> 44) % 2)
			collect(&ring, false);
		if (round % 64 == 0)
			check_silent_loss(seed, round);
		if (round % 16 == 15)
			stop_and_copy(&ring, seed, round);
	}
	/* quiet: no overshoot; every ring-full exit handled; the vCPU must get on */
	m.push_at_harvested = 0;
	for (round = 0; round < 200; round++) {
		uint64_t r = xorshift64(&m.rng);

		if (vcpu_run(size / 8, 0, &progress)) {
			exits_quiet++;
			ring_full_exit(&ring, (r >> 40) % 3 == 0);
		} else if (r % 2) {
			collect(&ring, false);
		}
		quiet_pushes += progress;
	}
	ck_assert_msg(quiet_pushes >= 100 * (size / 8),
		      "seed %" PRIu64 ": the vCPU made no progress: %" PRIu64 " pushes in 200 runs, %" PRIu64
		      " ring-full exits (KVM reset %u, write %u; library fetch %u, reset %u)",
		      seed, quiet_pushes, exits_quiet, m.ri, m.di, ring.fetch, ring.reset_pos);
	stop_and_copy(&ring, seed, round);
	/* run to a ring-full exit and handle it: then the library and KVM agree */
	while (!vcpu_run(size, 0, &progress))
		;
	ring_full_exit(&ring, false);
	ck_assert_msg(m.ri == m.di && ring.fetch == m.di && ring.reset_pos == m.ri,
		      "seed %" PRIu64 ": the ring did not come back: KVM reset %u, write %u; library fetch %u, reset %u",
		      seed, m.ri, m.di, ring.fetch, ring.reset_pos);
	/* every push not overwritten came back, or a collect said it could not protect it */
	for (p = 0; p < m.di; p++) {
		lost += m.lost[p];
		expect(m.delivered[p] || m.lost[p] || p < m.excused_below,
		       "seed %" PRIu64 ": push %" PRIu64 " never handed back, no loss reported", seed, p);
	}
	check_silent_loss(seed, round);
	printf("ring model size %u seed %" PRIu64 " overshoot <= %u%s: %" PRIu64 " pushes, %" PRIu64
	       " overwritten (reported), %" PRIu64 " ring-full exits, losses seen 0x%x\n",
	       size, seed, max_over, push_at_harvested ? ", pushes while marked" : "", m.pushes, lost, m.full_exits,
	       loss_seen);
}

/* Without overshoot nothing is lost, nothing recovered, and every push comes back once. */
START_TEST(quiet_ring_needs_no_recovery)
{
	struct kd_ring ring = model_ring(256, 1);
	unsigned int i;
	uint32_t progress;

	for (i = 0; i < 2000; i++) {
		uint64_t r = xorshift64(&m.rng);

		if (vcpu_run((uint32_t)(r % 300), 0, &progress))
			ring_full_exit(&ring, (r >> 32) % 2);
		else if ((r >> 40) % 2)
			collect(&ring, false);
	}
	collect(&ring, false);
	ck_assert_uint_eq(m.ri, m.di);
	ck_assert_uint_eq(loss_seen, 0);
	for (i = 0; i < m.di; i++)
		expect(m.delivered[i], "push %u never handed back", i);
}
END_TEST

/*
 * A ring-full exit handled after a sync took the ring: nothing to take,
 * and nothing may be marked (the entries past KVM's write position are
 * free, not ghosts).
 */
START_TEST(empty_ring_at_ring_full)
{
	struct kd_ring ring = model_ring(256, 2);
	unsigned int i;
	uint32_t progress;

	for (i = 0; i < 300; i++) {
		ck_assert(vcpu_run(1000, 0, &progress));
		ring_full_exit(&ring, true);
		ck_assert_uint_eq(m.ri, m.di);
		ck_assert_uint_eq(ring.fetch, m.di);
	}
	ck_assert_uint_eq(loss_seen, 0);
}
END_TEST

/*
 * KVM pushes over entries a harvest marked and has not reset yet: the reset
 * stops at the first of them, and the pages of the entries it overwrote
 * are not protected again.  The collect must say so.  100 entries are
 * taken; while they await their reset 166 more are pushed, the last 10 of
 * them over the first 10 taken.
 */
START_TEST(reset_stops_at_overwrite)
{
	struct kd_ring ring = model_ring(256, 3);
	unsigned int loss, i;

	for (i = 0; i < 100; i++)
		model_push();
	m.push_at_harvested = 166;
	m.push_once = true;
	loss = collect(&ring, false);
	ck_assert_msg(loss & (KD_RING_OVERFLOW | KD_RING_UNPROTECTED), "loss 0x%x: entries overwritten while marked, "
		      "not reported", loss);
	collect(&ring, false);
	ck_assert_uint_eq(m.ri, m.di);
	for (i = 0; i < m.di; i++)
		expect(m.delivered[i], "push %u never handed back", i);
}
END_TEST

/* KVM pushes over the very entry a harvest is taking: both are handed back, and a loss reported. */
START_TEST(push_over_entry_being_taken)
{
	struct kd_ring ring = model_ring(256, 4);
	unsigned int loss, i;
	uint32_t progress;

	for (i = 0; i < 10; i++)
		model_push();
	m.overwrite_taken = true;
	loss = collect(&ring, false);
	ck_assert_msg(loss & KD_RING_OVERFLOW, "loss 0x%x: an entry overwritten while taken, not reported", loss);
	/* the vCPU runs on to its next ring-full exit: the ghost this left is taken care of */
	while (!vcpu_run(256, 0, &progress))
		;
	ring_full_exit(&ring, false);
	collect(&ring, false);
	ck_assert_uint_eq(m.ri, m.di);
	for (i = 0; i < m.di; i++)
		expect(m.delivered[i] || m.lost[i], "push %u never handed back", i);
	ck_assert_uint_eq(m.delivered[256], 1);
}
END_TEST

START_TEST(stress_overshoot)
{
	/* up to 1,024 entries past the soft limit: the emulator's run between exits */
	stress(_i < 3 ? 256 : 4096, 0x1234567ull + (uint64_t)_i * 7919, 0, 1024);
}
END_TEST

START_TEST(stress_pushes_while_marked)
{
	stress(256, 0x9e3779b9ull + (uint64_t)_i * 104729, 1 + (uint32_t)_i * 37, 512);
}
END_TEST

/*
 * Resets go through the library; one made outside it anyway, while a
 * collect's entries await their reset, takes them: the library's reset
 * then finds nothing, sees them reset and goes on.
 */
START_TEST(outside_reset_is_noticed)
{
	struct kd_ring ring = model_ring(256, 5);
	unsigned int i, round;
	uint32_t progress;

	for (round = 0; round < 50; round++) {
		vcpu_run(100, 0, &progress);
		m.reset_at_harvested = round % 2;
		collect(&ring, false);
		ck_assert_uint_eq(ring.reset_pos, m.ri);
		ck_assert_uint_eq(ring.fetch, m.di);
	}
	ck_assert_uint_eq(m.resets_outside, 25);
	ck_assert_uint_eq(loss_seen, 0);
	for (i = 0; i < m.di; i++)
		expect(m.delivered[i], "push %u never handed back", i);
}
END_TEST

/* ---- many rings at once: kd_rings_collect(), kd_rings_collect_one(), kd_rings_retry_failed() ---- */

static struct {
	struct kd_ring ring[MAX_RINGS];
	struct kd_ring *rings[MAX_RINGS];
	struct kd_ring_room room;
	unsigned int loss[MAX_RINGS]; /* what the collect under way reported for each ring */
	unsigned int seen[MAX_RINGS]; /* ... and every collect so far */
	bool failed;		      /* a reset failed: retry before anything else is collected */
	uint64_t collects, resets_failed, shorts;
} b;

static void b_pages(void *ctx, uint32_t i, const struct kd_ring_entry *e, uint32_t n)
{
	unsigned int was = cur;
	uint32_t k;

	(void)ctx;
	expect(i < nr_models, "pages for ring %u of %u", i, nr_models);
	cur = i;
	for (k = 0; k < n; k++) {
		uint64_t pos = e[k].offset;

		expect(pos < m.di, "ring %u: push %" PRIu64 " handed back, only %u were made", i, pos, m.di);
		/* protected again before it was handed back, or a loss reported for its ring first */
		expect(m.reprotected[pos] || (b.loss[i] & (KD_RING_OVERFLOW | KD_RING_UNPROTECTED)),
		       "ring %u: push %" PRIu64 " handed back before its reset, no loss reported (reset_index %u)", i,
		       pos, m.ri);
		m.delivered[pos] = 1;
	}
	cur = was;
}

static void b_lost(void *ctx, uint32_t i, unsigned int loss)
{
	(void)ctx;
	expect(i < nr_models, "loss for ring %u of %u", i, nr_models);
	b.loss[i] |= loss;
	b.seen[i] |= loss;
	/* entries taken but not protected again are not handed back: the tracker protects all, all pending */
	if (loss & KD_RING_UNPROTECTED)
		ms[i].excused_below = ms[i].di;
}

static const struct kd_ring_out b_out = { b_pages, b_lost, NULL };

static void b_init(unsigned int n, uint32_t size, uint64_t seed)
{
	unsigned int k;

	kd_rings_room_free(&b.room);
	memset(&b, 0, sizeof(b));
	nr_models = n;
	for (k = 0; k < n; k++) {
		cur = k;
		model_init(size, seed + k);
		b.ring[k] = (struct kd_ring){ .gfns = m.gfns, .size = size };
		b.rings[k] = &b.ring[k];
	}
	cur = 0;
	fail_resets = 0;
	ck_assert_int_eq(kd_rings_room(&b.room, size, n), 0);
}

/* A harvest of every ring (a sync or the reaper), after the retry a failed reset owes. */
static void b_collect_all(void)
{
	uint64_t ns = 0;
	int ret = 0;

	memset(b.loss, 0, sizeof(b.loss));
	b.collects++;
	if (b.failed)
		ret = kd_rings_retry_failed(b.rings, nr_models, &kvm, &b.room, &b_out, &ns);
	if (ret == 0) {
		b.failed = false;
		ret = kd_rings_collect(b.rings, nr_models, &kvm, &b.room, &b_out, &ns);
	}
	if (ret < 0) {
		expect(ret == -EIO, "collect: %d", ret);
		b.failed = true;
		b.resets_failed++;
	}
}

/* Ring k's vCPU in its ring-full exit: that ring alone, as the vCPU's thread does. */
static void b_ring_full(unsigned int k)
{
	uint64_t ns = 0;
	int ret = 0;

	memset(b.loss, 0, sizeof(b.loss));
	if (b.failed)
		ret = kd_rings_retry_failed(b.rings, nr_models, &kvm, &b.room, &b_out, &ns);
	if (ret == 0) {
		b.failed = false;
		cur = k;
		m.full_exits++;
		m.in_handler = true;
		ret = kd_rings_collect_one(b.rings[k], k, &kvm, &b.room, true, &b_out, &ns);
		m.in_handler = false;
	}
	if (ret < 0) {
		expect(ret == -EIO, "collect of ring %u: %d", k, ret);
		b.failed = true;
		b.resets_failed++;
	}
}

static void b_check_all_back(uint64_t seed, const char *when)
{
	unsigned int k;
	uint64_t p;

	for (k = 0; k < nr_models; k++) {
		cur = k;
		for (p = 0; p < m.di; p++)
			expect(m.delivered[p] || m.lost[p] || p < m.excused_below,
			       "seed %" PRIu64 " %s: ring %u push %" PRIu64 " never handed back (KVM reset %u, write %u; "
			       "library fetch %u, reset %u, suspect %d)",
			       seed, when, k, p, m.ri, m.di, b.ring[k].fetch, b.ring[k].reset_pos, b.ring[k].suspect);
		for (p = 0; p < m.di; p++)
			if (m.lost[p] && !m.delivered[p] && !(b.seen[k] & (KD_RING_OVERFLOW | KD_RING_UNPROTECTED)))
				ck_abort_msg("seed %" PRIu64 " %s: ring %u push %" PRIu64 " lost without a loss report",
					     seed, when, k, p);
	}
}

/*
 * n vCPUs, a ring each, collected together: pushes while a batch holds
 * entries marked (some over entries awaiting the batch's reset, so that
 * the reset stops short in that ring), overshoots, ring-full exits handled
 * alone, and now and then a reset that fails.  What holds for one ring
 * (above) must hold for each; the batch must reset only once where no
 * ring needs more.  Then quiet: every ring back to KVM's count.
 */
static void batch_stress(unsigned int n, uint32_t size, uint64_t seed, uint32_t max_over, bool failures)
{
	uint64_t rng = seed | 1, p;
	unsigned int round, k;
	uint32_t progress;

	b_init(n, size, seed);
	for (round = 0; round < 1500; round++) {
		uint64_t r = xorshift64(&rng);

		for (k = 0; k < n; k++) {
			uint64_t rk = xorshift64(&rng);
			uint32_t over = (rk % 5 == 0) ? (uint32_t)(rk >> 8) % (max_over + 1) : 0;

			cur = k;
			if (m.di >= MAX_PUSHES / 2)
				continue;
			/* now and then a vCPU runs on while a batch holds its entries */
			m.push_at_harvested = (rk >> 20) % 7 == 0 ? (uint32_t)(rk >> 24) % size : 0;
			if (vcpu_run((uint32_t)(rk >> 40) % (size / 2), over, &progress) && (rk >> 60) % 2)
				b_ring_full(k);
		}
		if (failures && r % 29 == 0)
			fail_resets = 1;
		if ((r >> 32) % 3)
			b_collect_all();
		if (round % 50 == 49) {
			/* the vCPUs stop: one harvest brings back everything pushed */
			for (k = 0; k < n; k++)
				ms[k].push_at_harvested = 0;
			fail_resets = 0;
			b_collect_all();
			if (b.failed)
				b_collect_all();
			b_check_all_back(seed, "after the vCPUs stopped");
		}
	}
	/*
	 * Quiet: no overshoot, no push while marked, no failure; each ring to
	 * a ring-full exit and back, until every ring agrees with KVM (a ring
	 * KVM pushed more than a lap past comes back by a bounded number of
	 * ghosts an exit).
	 */
	fail_resets = 0;
	for (k = 0; k < n; k++)
		ms[k].push_at_harvested = 0;
	b_collect_all();
	for (round = 0; round < 64; round++) {
		bool agree = true;

		for (k = 0; k < n; k++) {
			cur = k;
			while (!vcpu_run(size, 0, &progress))
				;
			b_ring_full(k);
		}
		b_collect_all();
		for (k = 0; k < n; k++)
			agree = agree && ms[k].ri == ms[k].di && b.ring[k].fetch == ms[k].di;
		if (agree)
			break;
	}
	for (k = 0; k < n; k++) {
		cur = k;
		ck_assert_msg(m.ri == m.di && b.ring[k].fetch == m.di && b.ring[k].reset_pos == m.ri,
			      "seed %" PRIu64 ": ring %u did not come back: KVM reset %u, write %u; library fetch %u, "
			      "reset %u",
			      seed, k, m.ri, m.di, b.ring[k].fetch, b.ring[k].reset_pos);
	}
	b_check_all_back(seed, "at the end");
	for (k = 0, p = 0; k < n; k++)
		p += ms[k].pushes;
	printf("ring model: %u rings of %u, seed %" PRIu64 ", overshoot <= %u%s: %" PRIu64 " pushes, %" PRIu64
	       " harvests of all, %" PRIu64 " failed resets\n",
	       n, size, seed, max_over, failures ? ", failing resets" : "", p, b.collects, b.resets_failed);
}

/* Quiet rings: one reset for all of them at each harvest, and every push back once. */
START_TEST(batch_resets_once)
{
	unsigned int k, round, before;
	uint32_t progress;
	uint64_t p;

	b_init(MAX_RINGS, 256, 11);
	for (round = 0; round < 200; round++) {
		for (k = 0; k < MAX_RINGS; k++) {
			cur = k;
			vcpu_run(1 + (round * 7 + k * 13) % 150, 0, &progress);
		}
		before = ms[0].ri;
		b_collect_all();
		(void)before;
	}
	for (k = 0; k < MAX_RINGS; k++) {
		cur = k;
		ck_assert_uint_eq(m.ri, m.di);
		ck_assert_uint_eq(b.seen[k], 0);
		for (p = 0; p < m.di; p++)
			expect(m.delivered[p], "ring %u push %" PRIu64 " never handed back", k, p);
	}
}
END_TEST

/*
 * A batch whose reset stops short in one ring: while its entries await
 * the reset, ring 3's vCPU pushes a lap over them.  Ring 3 is reported,
 * finished alone, and the other rings' entries are handed back protected.
 */
START_TEST(batch_short_ring)
{
	unsigned int k;
	uint32_t progress;

	b_init(6, 256, 12);
	for (k = 0; k < 6; k++) {
		cur = k;
		vcpu_run(100, 0, &progress);
	}
	ms[3].push_at_harvested = 256;
	ms[3].push_once = true;
	b_collect_all();
	ck_assert_msg(b.loss[3] & (KD_RING_OVERFLOW | KD_RING_UNPROTECTED),
		      "ring 3: entries overwritten while they awaited the batch's reset, loss 0x%x", b.loss[3]);
	for (k = 0; k < 6; k++)
		if (k != 3)
			ck_assert_msg(!b.loss[k], "ring %u: loss 0x%x", k, b.loss[k]);
	b_collect_all();
	cur = 3;
	while (!vcpu_run(256, 0, &progress))
		;
	b_ring_full(3);
	b_collect_all();
	b_check_all_back(12, "after a short ring");
	for (k = 0; k < 6; k++)
		ck_assert_msg(ms[k].ri == ms[k].di && b.ring[k].reset_pos == ms[k].ri, "ring %u: KVM reset %u, write %u, "
			      "library reset %u", k, ms[k].ri, ms[k].di, b.ring[k].reset_pos);
}
END_TEST

/* A batch's reset fails: every ring's entries reported unprotected; the retry resets them all, once. */
START_TEST(batch_reset_fails)
{
	unsigned int k;
	uint32_t progress;

	b_init(5, 256, 13);
	for (k = 0; k < 5; k++) {
		cur = k;
		vcpu_run(50, 0, &progress);
	}
	fail_resets = 1;
	b_collect_all();
	ck_assert(b.failed);
	for (k = 0; k < 5; k++) {
		ck_assert_msg(b.loss[k] & KD_RING_UNPROTECTED, "ring %u: loss 0x%x after a failed reset", k, b.loss[k]);
		ck_assert_msg(b.ring[k].reset_failed, "ring %u not marked for a retry", k);
	}
	b_collect_all();
	ck_assert(!b.failed);
	for (k = 0; k < 5; k++) {
		cur = k;
		vcpu_run(30, 0, &progress);
	}
	b_collect_all();
	b_check_all_back(13, "after a failed reset");
	for (k = 0; k < 5; k++)
		ck_assert_msg(ms[k].ri == ms[k].di && b.ring[k].reset_pos == ms[k].ri, "ring %u: KVM reset %u, write %u, "
			      "library reset %u", k, ms[k].ri, ms[k].di, b.ring[k].reset_pos);
}
END_TEST

START_TEST(batch_stress_overshoot)
{
	batch_stress(_i % 2 ? MAX_RINGS : 3, 256, 0x51ed270b27ull + (uint64_t)_i * 7919, 512, _i >= 2);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("ring-model");
	TCase *tc = tcase_create("ring-model");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, quiet_ring_needs_no_recovery);
	tcase_add_test(tc, empty_ring_at_ring_full);
	tcase_add_test(tc, reset_stops_at_overwrite);
	tcase_add_test(tc, push_over_entry_being_taken);
	tcase_add_loop_test(tc, stress_overshoot, 0, 6);
	tcase_add_loop_test(tc, stress_pushes_while_marked, 0, 6);
	tcase_add_test(tc, outside_reset_is_noticed);
	tcase_add_test(tc, batch_resets_once);
	tcase_add_test(tc, batch_short_ring);
	tcase_add_test(tc, batch_reset_fails);
	tcase_add_loop_test(tc, batch_stress_overshoot, 0, 4);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
