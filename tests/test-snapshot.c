// SPDX-License-Identifier: MIT
/*
 * Snapshots of a running test guest (lib/migrate/snapshot/snapshot.h) on
 * KVM, in each tracking mode.  While the guest's vCPUs write pages of
 * their working sets (one at random, one in order), a chain is taken; at each snapshot's pause the
 * test copies all of guest memory and the vCPUs' states (the source's
 * copy).  Every prefix of the chain is then restored into a new guest and
 * compared page for page with the copy taken at its last file's pause;
 * the newest restore runs and passes the guest's own self-check.
 *
 * failed_snapshots_retaken: a diff whose header write fails (after every
 * page and the pause: the consumer had taken everything), and one whose
 * third page write fails, each leave nothing; the guest runs on, and the
 * next diff, which takes the failed one's number, is complete (compared
 * page for page like the others).
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <pthread.h>
#include <sys/socket.h>

#include "dest.h"
#include "kvm-skip.h"
#include "snapshot.h"
#include "source.h"
#include "status.h"
#include "test-util.h"
#include "testguest-engine.h"

#define MAX_SNAPS 8
#define MODES	  3

static const enum kvmdirty_mode modes[MODES] = { KVMDIRTY_MODE_CLEAR_LOG, KVMDIRTY_MODE_DIRTY_LOG,
						 KVMDIRTY_MODE_DIRTY_RING };

static const char *mode_name(enum kvmdirty_mode m)
{
	return m == KVMDIRTY_MODE_CLEAR_LOG ? "clear-log" : m == KVMDIRTY_MODE_DIRTY_LOG ? "dirty-log" : "dirty-ring";
}

struct copy {
	uint8_t **mem; /* [nr]: a copy of each region */
	unsigned int nr;
	struct mig_vcpu_state vs[2];
	unsigned int share[2]; /* each vCPU's run share as the vCPUs were about to resume */
	uint8_t dev[4096];     /* the rig's devices' state at the pause (dev_len bytes) */
	size_t dev_len;
	bool taken;
};

struct rig {
	struct testvm *tv;
	struct mig_guest g;
	struct copy copy[MAX_SNAPS];
	char dir[64];
};

static void sleep_ms(unsigned int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

/*
 * The rig's devices: their state a few KiB whose length and bytes follow
 * vCPU 0's passes at the pause, so that each snapshot's differs.
 */
static int rig_devices_save(void *ctx, void **ret, size_t *ret_len)
{
	uint64_t pass = testvm_mailbox(ctx, 0)->pass;
	size_t n = 3000 + pass % 1000, i;
	uint8_t *b = malloc(n);

	if (!b)
		return -ENOMEM;
	for (i = 0; i < n; i++)
		b[i] = (uint8_t)(pass * 31 + i * 7);
	*ret = b;
	*ret_len = n;
	return 0;
}

static struct mig_guest_ops rig_ops;

/* What a restore handed to the devices. */
static uint8_t restored_dev[4096];
static size_t restored_dev_len;

static int restore_devices_load(void *ctx, const void *state, size_t len)
{
	(void)ctx;
	if (len > sizeof(restored_dev))
		return -EFBIG;
	memcpy(restored_dev, state, len);
	restored_dev_len = len;
	return 0;
}

/* At the pause: all of memory, the vCPUs and the devices, as the snapshot must hold them. */
static void on_paused(void *ctx, const struct mig_snap_result *res)
{
	struct rig *r = ctx;
	struct copy *c = &r->copy[res->seq];
	unsigned int i;

	if (res->seq >= MAX_SNAPS)
		abort();
	if (!c->mem) {
		c->mem = calloc(r->g.nr_regions, sizeof(*c->mem));
		c->nr = r->g.nr_regions;
	}
	for (i = 0; i < r->g.nr_regions; i++) {
		if (!c->mem[i])
			c->mem[i] = malloc(r->g.regions[i].size);
		if (!c->mem[i])
			abort();
		memcpy(c->mem[i], r->g.regions[i].hva, r->g.regions[i].size);
	}
	for (i = 0; i < r->g.nr_vcpus; i++) {
		if (r->g.ops->vcpu_save(r->g.ctx, i, &c->vs[i]) < 0)
			abort();
		c->share[i] = __atomic_load_n(&r->tv->share[i], __ATOMIC_RELAXED);
	}
	{
		void *dev;

		if (r->g.ops->devices_save(r->g.ctx, &dev, &c->dev_len) < 0 || c->dev_len > sizeof(c->dev))
			abort();
		memcpy(c->dev, dev, c->dev_len);
		free(dev);
	}
	c->taken = true;
}

/*
 * After each pass: until vCPU 1, writing flat out, wrote its working set
 * over again (5 s at most), so that the next pass finds at least half of
 * what the last one wrote written again however the host schedules the
 * guest.  (On a loaded host the guest once got no CPU between two passes:
 * nothing pending, "converged", and the throttle never engaged.)
 */
static void refill_after_pass(void *ctx, const struct mig_snap_result *res)
{
	struct rig *r = ctx;
	const struct guest_vcpu *mb = testvm_mailbox(r->tv, 1);
	uint64_t w = mb->writes;
	unsigned int i;

	(void)res;
	for (i = 0; i < 5000 && mb->writes < w + mb->pages; i++)
		sleep_ms(1);
}

static void rig_new(struct rig *r, enum kvmdirty_mode mode, bool flat_out)
{
	struct mig_testvm_opts o = { .mib = 16, .vcpus = 2, .mode = mode, .ws_mib = 8, .fill = MIG_FILL_WS };
	char err[256];
	unsigned int i;

	memset(r, 0, sizeof(*r));
	snprintf(r->dir, sizeof(r->dir), "/tmp/kvmdirty-snapshot-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(r->dir));
	ck_assert_msg(mig_testvm_new(&o, true, &r->tv, err, sizeof(err)) == 0, "%s", err);
	/*
	 * Paced, so that every snapshot finds pages written since the one
	 * before: vCPU 0 random pages of its working set; vCPU 1 its pages in
	 * order, once a pass, so that each of its writes changes its page
	 * (a tag of the page and the pass: a page written again within a pass
	 * would be the same, and its loss unseen).
	 */
	for (i = 0; i < 2; i++) {
		struct guest_vcpu *mb = testvm_mailbox(r->tv, i);

		mb->pattern = i ? GUEST_SEQUENTIAL : GUEST_RANDOM;
		mb->seed = 0x9e3779b97f4a7c15ull;
		/* vCPU 1 slower: a pass takes about a second, so the pages a lost diff held are not soon written again
		 */
		mb->tsc_per_page = testvm_tsc_per_page(r->tv, i ? 1000 : 20000);
		/* or as fast as it can: faster than the snapshot can write */
		if (flat_out && i)
			mb->tsc_per_page = 0;
	}
	ck_assert_int_eq(testvm_spawn(r->tv), 0);
	ck_assert_int_eq(mig_testvm_guest(r->tv, &r->g), 0);
	rig_ops = *r->g.ops;
	rig_ops.devices_save = rig_devices_save;
	r->g.ops = &rig_ops;
	sleep_ms(50);
}

static void rig_free(struct rig *r)
{
	char cmd[128];
	unsigned int i, k;

	mig_guest_release(&r->g);
	mig_testvm_free(r->tv);
	for (k = 0; k < MAX_SNAPS; k++) {
		for (i = 0; r->copy[k].mem && i < r->copy[k].nr; i++)
			free(r->copy[k].mem[i]);
		free(r->copy[k].mem);
	}
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", r->dir);
	ck_assert_int_eq(system(cmd), 0);
}

/* The guest's vCPUs made progress: it was left running. */
static void expect_running(struct rig *r, const char *when)
{
	uint64_t w0 = testvm_mailbox(r->tv, 0)->writes, w1 = testvm_mailbox(r->tv, 1)->writes;
	unsigned int i;

	for (i = 0; i < 2000 && testvm_mailbox(r->tv, 0)->writes == w0 && testvm_mailbox(r->tv, 1)->writes == w1; i++)
		sleep_ms(5);
	ck_assert_msg(testvm_mailbox(r->tv, 0)->writes != w0 || testvm_mailbox(r->tv, 1)->writes != w1,
		      "%s: the guest does not run", when);
}

/* Files 0 .. k restored into a new guest, compared with the copy at k's pause; run and checked when asked. */
static void restore_and_compare(struct rig *r, unsigned int k, bool run, const char *mode)
{
	struct mig_testvm_opts o = { .mib = 16, .vcpus = 2, .lazy = true };
	struct snap_file *f[MAX_SNAPS] = { 0 };
	struct mig_guest g;
	struct testvm *tv;
	char path[128], err[512];
	unsigned int i;
	uint64_t pg;
	int ret = 0;

	for (i = 0; i <= k && ret == 0; i++) {
		snprintf(path, sizeof(path), "%s/s-%06u.snap", r->dir, i);
		ret = snap_file_open(path, &f[i], err, sizeof(err));
	}
	ck_assert_msg(ret == 0, "%s: %s", mode, err);
	ck_assert_msg(mig_testvm_new(&o, false, &tv, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(mig_testvm_guest(tv, &g), 0);
	{
		static struct mig_guest_ops ops;

		ops = *g.ops;
		ops.devices_load = restore_devices_load;
		g.ops = &ops;
	}
	restored_dev_len = 0;
	ret = mig_snap_restore(&g, f, k + 1, NULL, err, sizeof(err));
	ck_assert_msg(ret == 0, "%s: restoring %u files: %s", mode, k + 1, err);
	ck_assert(r->copy[k].taken);
	ck_assert_msg(restored_dev_len == r->copy[k].dev_len && !memcmp(restored_dev, r->copy[k].dev, restored_dev_len),
		      "%s: chain of %u: the devices' state (%zu bytes) is not as at the pause (%zu bytes)", mode, k + 1,
		      restored_dev_len, r->copy[k].dev_len);
	for (i = 0; i < g.nr_regions; i++) {
		const uint8_t *a = g.regions[i].hva, *b = r->copy[k].mem[i];

		for (pg = 0; pg < g.regions[i].size / 4096; pg++)
			expect(!memcmp(a + pg * 4096, b + pg * 4096, 4096),
			       "%s: chain of %u: region %u page %" PRIu64 " (gpa 0x%" PRIx64 ") is not as at the pause",
			       mode, k + 1, i, pg, g.regions[i].gpa + pg * 4096);
	}
	for (i = 0; i < 2; i++) {
		struct mig_vcpu_state st;

		ck_assert_int_eq(g.ops->vcpu_save(g.ctx, i, &st), 0);
		ck_assert_msg(st.regs.rip == r->copy[k].vs[i].regs.rip && st.regs.rsp == r->copy[k].vs[i].regs.rsp &&
				      st.sregs.cr3 == r->copy[k].vs[i].sregs.cr3,
			      "%s: vCPU %u's state is not as at the pause", mode, i);
	}
	mig_guest_release(&g);
	if (run) {
		ret = mig_testvm_resume_check(tv, 300, err, sizeof(err));
		ck_assert_msg(ret == 0, "%s: the restored guest: %s", mode, err);
	}
	mig_testvm_free(tv);
	for (i = 0; i <= k; i++)
		snap_file_close(f[i]);
}

static struct mig_snap *snap_new(struct rig *r, double pause_ms)
{
	static char prefix[96];
	struct mig_snap_opts o = { .prefix = prefix, .pause_ms = pause_ms, .paused = on_paused, .paused_ctx = r,
				   .pass_done = pause_ms < 1e-3 ? refill_after_pass : NULL, .pass_done_ctx = r };
	struct mig_snap *s;
	char err[256];

	snprintf(prefix, sizeof(prefix), "%s/s", r->dir);
	ck_assert_msg(mig_snap_new(&r->g, &o, &s, err, sizeof(err)) == 0, "%s", err);
	return s;
}

static void take(struct mig_snap *s, uint64_t seq, const char *mode)
{
	struct mig_snap_result res;
	char err[512];

	ck_assert_msg(mig_snap_take(s, &res, err, sizeof(err)) == 0, "%s: snapshot %" PRIu64 ": %s", mode, seq, err);
	ck_assert_uint_eq(res.seq, seq);
	ck_assert_msg(seq == 0 || res.data_pages + res.zero_pages > 0, "%s: diff %" PRIu64 " holds no page", mode, seq);
}

/* The snapshots done: the guest stopped, every prefix of the 4-file chain restored and compared, the newest run. */
static void end_and_compare(struct rig *r, struct mig_snap *s, const char *mode)
{
	unsigned int k;

	mig_snap_free(s);
	expect_running(r, mode);
	testvm_halt_all(r->tv);
	ck_assert_int_eq(testvm_join(r->tv, NULL, NULL), 0);
	for (k = 0; k < 4; k++)
		restore_and_compare(r, k, k == 3, mode);
	rig_free(r);
}

START_TEST(chain_matches_memory)
{
	enum kvmdirty_mode mode = modes[_i];
	struct mig_snap *s;
	struct rig r;
	unsigned int k;

	rig_new(&r, mode, false);
	s = snap_new(&r, 0);
	for (k = 0; k < 4; k++) {
		take(s, k, mode_name(mode));
		sleep_ms(100);
	}
	end_and_compare(&r, s, mode_name(mode));
}
END_TEST

static int fail_write_at; /* fail the write at this offset (UINT64_MAX: none) or the nth write (count down) */
static uint64_t fail_off = UINT64_MAX;

static ssize_t failing_pwrite(int fd, const void *buf, size_t n, off_t off)
{
	if ((fail_off != UINT64_MAX && (uint64_t)off == fail_off) || (fail_write_at > 0 && --fail_write_at == 0)) {
		errno = ENOSPC;
		return -1;
	}
	return pwrite(fd, buf, n, off);
}

static void take_failing(struct mig_snap *s, uint64_t seq, const char *mode, const char *why)
{
	struct mig_snap_result res;
	char err[512], cmd[300];

	snap_pwrite = failing_pwrite;
	ck_assert_msg(mig_snap_take(s, &res, err, sizeof(err)) == -ENOSPC, "%s: %s: taken", mode, why);
	snap_pwrite = pwrite;
	fail_off = UINT64_MAX;
	fail_write_at = 0;
	ck_assert_uint_eq(res.seq, seq);
	ck_assert_msg(access(res.path, F_OK) < 0, "%s: %s: %s left behind", mode, why, res.path);
	/* nothing temporary either */
	snprintf(cmd, sizeof(cmd), "test -z \"$(ls '%.*s' | grep tmp)\"", (int)(strrchr(res.path, '/') - res.path),
		 res.path);
	ck_assert_msg(system(cmd) == 0, "%s: %s: a temporary file left behind", mode, why);
}

START_TEST(failed_snapshots_retaken)
{
	enum kvmdirty_mode mode = modes[_i];
	struct mig_snap *s;
	struct rig r;

	rig_new(&r, mode, false);
	s = snap_new(&r, 0);
	take(s, 0, mode_name(mode));
	sleep_ms(100);
	take(s, 1, mode_name(mode));
	sleep_ms(100);
	/* the header is written at offset 0, after every page and the pause */
	fail_off = 0;
	take_failing(s, 2, mode_name(mode), "the header's write failed");
	expect_running(&r, "after a failed commit");
	take(s, 2, mode_name(mode));
	sleep_ms(100);
	fail_write_at = 3;
	take_failing(s, 3, mode_name(mode), "the third write failed");
	expect_running(&r, "after a failed page write");
	take(s, 3, mode_name(mode));
	end_and_compare(&r, s, mode_name(mode));
}
END_TEST

/*
 * A vCPU writing flat out (its working set written over again between
 * passes: refill_after_pass()), and a pause aimed at 1 ns: the passes
 * never converge, the throttle halves the vCPUs' run share, and every
 * vCPU is back at its whole share before it resumes from the pause (none
 * sits out a throttle's period after it: the time kept out does not grow
 * once the snapshot is taken); the chain still matches memory.
 */
START_TEST(throttled_then_lifted)
{
	struct mig_snap_result res;
	unsigned int k, i, lowest = 1000;
	uint64_t out[2];
	struct mig_snap *s;
	char err[512];
	struct rig r;

	rig_new(&r, KVMDIRTY_MODE_CLEAR_LOG, true);
	s = snap_new(&r, 1e-6);
	for (k = 0; k < 4; k++) {
		ck_assert_msg(mig_snap_take(s, &res, err, sizeof(err)) == 0, "snapshot %u: %s", k, err);
		for (i = 0; i < 2; i++)
			out[i] = testvm_out_ns(r.tv, i);
		lowest = res.throttle_permille < lowest ? res.throttle_permille : lowest;
		for (i = 0; i < 2; i++) {
			ck_assert_msg(r.copy[k].share[i] == 1000, "snapshot %u (lowest share %u): vCPU %u resumed at %u "
				      "permille", k, res.throttle_permille, i, r.copy[k].share[i]);
			ck_assert_msg(r.tv->share[i] == 1000, "snapshot %u: vCPU %u left at %u permille", k, i,
				      r.tv->share[i]);
		}
		sleep_ms(100);
		for (i = 0; i < 2; i++)
			ck_assert_msg(testvm_out_ns(r.tv, i) == out[i], "snapshot %u: vCPU %u sat out %" PRIu64
				      " ns after it", k, i, testvm_out_ns(r.tv, i) - out[i]);
	}
	ck_assert_msg(lowest < 1000, "a guest writing flat out was never throttled (%u passes in the last)",
		      res.passes);
	end_and_compare(&r, s, "throttled");
}
END_TEST

/* ---- snapshots_and_migration: a snapshot series and a migration of one guest, in every order ---- */

/*
 * The migration (M): mig_send() on a thread of its own, to a destination
 * guest in this process on another thread, at 4 MiB/s so that it lasts;
 * either cancelled (the guest runs on here) or let go to its end (the
 * guest moves: the source checks its memory against every page it sent).
 */
struct mig_run {
	struct mig_guest *src;
	struct mig_status st;
	int s_done; /* S has ended: M may switch over */
	pthread_t th, dth;
	int sv[2];
	int ret, dret;
	struct mig_result res;
	char err[512], derr[512];
	struct testvm *dtv;
	struct mig_guest dg;
};

/* M's events, on its thread: it switches over (pauses the guest) only once S has ended (60 s at most) */
static void mig_run_event(void *ctx, const char *line)
{
	struct mig_run *m = ctx;
	unsigned int i;

	for (i = 0; strstr(line, "\"event\":\"switchover\"") && i < 60000 && !__atomic_load_n(&m->s_done, __ATOMIC_ACQUIRE);
	     i++)
		sleep_ms(1);
}

static void *mig_run_src(void *p)
{
	struct mig_run *m = p;
	struct mig_send_opts o = { .downtime_ms = 20, .max_passes = 6, .timeout_ms = 60000, .peer_timeout_ms = 60000,
				   .verify = true, .force_switchover = true, .max_bandwidth = 4, .status = &m->st,
				   .event = mig_run_event, .event_ctx = m };

	m->ret = mig_send(m->src, m->sv[0], &o, &m->res, m->err, sizeof(m->err));
	shutdown(m->sv[0], SHUT_RDWR);
	return NULL;
}

static void *mig_run_dst(void *p)
{
	struct mig_run *m = p;
	struct mig_recv_opts o = { .timeout_ms = 60000 };
	struct mig_recv_result res;

	m->dret = mig_recv(&m->dg, m->sv[1], &o, &res, m->derr, sizeof(m->derr));
	return NULL;
}

/* M begun: once its tracking is on (the state past setup) */
static void mig_run_start(struct mig_run *m, struct rig *r)
{
	struct mig_testvm_opts o = { .mib = 16, .vcpus = 2, .lazy = true };
	char q[16384], err[256];
	unsigned int i;

	memset(m, 0, sizeof(*m));
	m->src = &r->g;
	mig_status_init(&m->st, false);
	ck_assert_msg(mig_testvm_new(&o, false, &m->dtv, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(mig_testvm_guest(m->dtv, &m->dg), 0);
	{
		/* the destination's devices take what the source's had at its pause */
		static struct mig_guest_ops ops;

		ops = *m->dg.ops;
		ops.devices_load = restore_devices_load;
		m->dg.ops = &ops;
	}
	restored_dev_len = 0;
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, m->sv), 0);
	ck_assert_int_eq(pthread_create(&m->dth, NULL, mig_run_dst, m), 0);
	ck_assert_int_eq(pthread_create(&m->th, NULL, mig_run_src, m), 0);
	for (i = 0; i < 10000 && (mig_status_query(&m->st, q, sizeof(q)) || !strstr(q, "\"state\":\"precopy\"")); i++)
		sleep_ms(1);
	ck_assert_msg(strstr(q, "\"state\":\"precopy\""), "the migration never reached pre-copy: %s", q);
}

/* M ended: cancelled (the guest runs on here), or to its end (the guest moved, every page checked) */
static void mig_run_end(struct mig_run *m, bool cancel, const char *order)
{
	char err[256];

	if (cancel)
		ck_assert_msg(mig_status_cancel(&m->st, err, sizeof(err)) == 0, "%s: cancel: %s", order, err);
	pthread_join(m->th, NULL);
	pthread_join(m->dth, NULL);
	close(m->sv[0]);
	close(m->sv[1]);
	if (cancel) {
		ck_assert_msg(m->ret == -ECANCELED && m->res.outcome == MIG_OUTCOME_HERE, "%s: cancelled: %d (%s)", order,
			      m->ret, m->err);
	} else {
		uint64_t total = 0;
		unsigned int i;

		for (i = 0; i < m->src->nr_regions; i++)
			total += m->src->regions[i].size / 4096;
		ck_assert_msg(m->ret == 0 && m->res.outcome == MIG_OUTCOME_THERE, "%s: migration: %d (%s); destination: %d "
			      "(%s)", order, m->ret, m->err, m->dret, m->derr);
		ck_assert_msg(m->res.lost_pages == 0 && m->res.verified_pages == total,
			      "%s: the migration lost %" PRIu64 " pages (%" PRIu64 " of %" PRIu64 " verified)", order,
			      m->res.lost_pages, m->res.verified_pages, total);
		/* the devices' state as the source's guest had it at the switchover (its vCPU 0's passes then) */
		ck_assert_msg(restored_dev_len >= 3000 && restored_dev_len < 4000,
			      "%s: the destination's devices got %zu bytes", order, restored_dev_len);
		for (i = 0; i < restored_dev_len; i++)
			ck_assert_msg((uint8_t)(restored_dev[i] - restored_dev[0]) == (uint8_t)(i * 7),
				      "%s: the destination's devices' state differs at byte %u", order, i);
	}
	mig_guest_release(&m->dg);
	mig_testvm_free(m->dtv);
	mig_status_destroy(&m->st);
}

/*
 * The series (S) and the migration (M) of one guest, each begun and ended
 * in every order: S M M S, M S M S, S M S M, M S S M.  Whichever begins
 * first turns logging on; whichever ends first must not turn it off under
 * the other.  S's chain is then compared page for page with memory at
 * each of its pauses (and run, where the guest stayed here); M, where it
 * ends last, moves the guest and checks every page it sent.  M ends by a
 * cancel where S goes on after it (the guest must stay here to be
 * snapshotted), and is held at its switchover until S ended where S
 * ends first.  Each order in each mode (under ThreadSanitizer, each order
 * once, in one mode or another).
 */
START_TEST(snapshots_and_migration)
{
	/* 4 orders and 3 modes: _i 0 .. 11 meets each pair once (4 and 3 share no factor) */
	enum kvmdirty_mode mode = modes[_i % MODES];
	unsigned int order = _i % 4, k;
	const bool m_first = order == 1 || order == 3, s_last = order < 2;
	static const char *const names[] = { "S M M S", "M S M S", "S M S M", "M S S M" };
	char what[64];
	struct mig_snap *s = NULL;
	struct mig_run m;
	struct rig r;

	snprintf(what, sizeof(what), "%s, %s", names[order], mode_name(mode));
	rig_new(&r, mode, false);
	if (m_first)
		mig_run_start(&m, &r);
	s = snap_new(&r, 0);
	if (!m_first)
		mig_run_start(&m, &r);
	take(s, 0, what);
	sleep_ms(100);
	take(s, 1, what);
	if (s_last) {
		/* M ends first, and S goes on */
		mig_run_end(&m, true, what);
		for (k = 2; k < 4; k++) {
			sleep_ms(100);
			take(s, k, what);
		}
		end_and_compare(&r, s, what);
	} else {
		/* S ends first, and M goes on to its end */
		for (k = 2; k < 4; k++) {
			sleep_ms(100);
			take(s, k, what);
		}
		mig_snap_free(s);
		__atomic_store_n(&m.s_done, 1, __ATOMIC_RELEASE);
		mig_run_end(&m, false, what);
		testvm_halt_all(r.tv);
		ck_assert_int_eq(testvm_join(r.tv, NULL, NULL), 0);
		for (k = 0; k < 4; k++)
			restore_and_compare(&r, k, false, what);
		rig_free(&r);
	}
	printf("snapshots and a migration, %s: every file matches memory at its pause\n", what);
}
END_TEST

int main(void)
{
	int skip = require_kvm("test-snapshot");
	Suite *s;
	TCase *tc;

	if (skip)
		return skip;
	s = suite_create("snapshot");
	tc = tcase_create("snapshot");
	tcase_set_timeout(tc, 600);
	tcase_add_loop_test(tc, chain_matches_memory, 0, MODES);
	tcase_add_loop_test(tc, failed_snapshots_retaken, 0, MODES);
	tcase_add_test(tc, throttled_then_lifted);
#ifdef __SANITIZE_THREAD__
	/* each order once, the modes in turn: the threads meet as in all twelve, in a third of the time */
	tcase_add_loop_test(tc, snapshots_and_migration, 0, 4);
#else
	tcase_add_loop_test(tc, snapshots_and_migration, 0, 4 * MODES);
#endif
	suite_add_tcase(s, tc);
	return run_suite(s);
}
