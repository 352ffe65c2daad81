// SPDX-License-Identifier: MIT
/*
 * A guest that uses the state a kernel relies on, moved whole through the
 * public API (include/kvmdirty-migrate.h): the test guest with
 * GUEST_F_STATE (examples/guest/guest-abi.h) takes LAPIC timer interrupts
 * through its IDT and its own TSS to a CPL-0 handler that reads PAT and
 * kvmclock's MSR, keeps a value in AVX register ymm15, and reads kvmclock
 * time, checking each once a pass.  Its source sets all of that up; its
 * destination (a migration over a Unix socket, or a restore of a full
 * snapshot and a diff) gets it only from the stream or the files.  After
 * each, the guest runs on there until every vCPU took more timer ticks
 * and passed more checks; a piece of state left behind shows as a
 * self-check error naming the piece, a vCPU that stops (no XCR0: AVX
 * faults), or ticks that stop coming (no LAPIC).
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <kvmdirty-migrate.h>

#include "api-guest.h"
#include "kvm-skip.h"
#include "test-util.h"

#define VCPUS 2
#define DATA_GPA (4ull << 30)
#define DATA_SIZE (2ull << 20)
#define PERIOD_US 10000 /* the LAPIC timer: 100 Hz */

/* The source's: each vCPU checks its half of the data, the LAPIC timer set up at 100 Hz. */
static void state_setup(struct api_side *s)
{
	api_shares(s, DATA_GPA, VCPUS, testvm_tsc_per_page(s->tv, 20000));
	ck_assert_int_eq(testvm_state_setup(s->tv, PERIOD_US), 0);
	/* SYSCALL through LSTAR and TSC_AUX, where the guest's SYSCALL is its own (not on a PVM-based KVM) */
	if (!testvm_pvm_host())
		ck_assert_int_eq(testvm_syscall_setup(s->tv), 0);
}

/* A state guest: a source's set up and running, a destination's bare. */
static void side_new(struct api_side *s, bool source)
{
	struct testvm_opts o = { .nr_vcpus = VCPUS, .irqchip = true, .track = source,
				 .track_opts.mode = KVMDIRTY_MODE_CLEAR_LOG };

	api_side_new(s, &o, DATA_GPA, DATA_SIZE, source ? state_setup : NULL);
}

static void sleep_ms(unsigned int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

static const char *check_name(uint64_t c)
{
	switch (c) {
	case GUEST_STATE_PAT:
		return "PAT (read by the timer's CPL-0 handler)";
	case GUEST_STATE_KVMCLOCK_MSR:
		return "kvmclock's MSR (read by the timer's CPL-0 handler)";
	case GUEST_STATE_YMM:
		return "ymm15 (XSAVE state)";
	case GUEST_STATE_TIME_BACK:
		return "kvmclock time went back";
	case GUEST_STATE_SYSCALL:
		return "SYSCALL did not reach LSTAR's handler (calls counted)";
	case GUEST_STATE_TSC_AUX:
		return "TSC_AUX (read by SYSCALL's CPL-0 handler)";
	}
	return "a page's tag";
}

/*
 * Run the guest whose vCPU threads run until every vCPU took 3 more timer
 * ticks and passed 3 more state checks than at the start (each vCPU's
 * counts from its own memory, as it arrived), or 20 s went by; then stop
 * it and require a clean stop.  what: where it runs, for the messages.
 */
static void runs_on(struct api_side *s, const char *what)
{
	uint64_t ticks0[VCPUS], checks0[VCPUS];
	struct testvm_exit ex = { 0 };
	unsigned int i, waited, bad = 0;
	bool moved = false;
	int ret;

	for (i = 0; i < VCPUS; i++) {
		ticks0[i] = testvm_mailbox(s->tv, i)->st_ticks;
		checks0[i] = testvm_mailbox(s->tv, i)->st_checks;
	}
	for (waited = 0; waited < 20000 && !moved; waited += 10) {
		sleep_ms(10);
		moved = true;
		for (i = 0; i < VCPUS; i++) {
			struct guest_vcpu *v = testvm_mailbox(s->tv, i);

			if (v->err_tag[0] || v->st_ticks < ticks0[i] + 3 || v->st_checks < checks0[i] + 3)
				moved = false;
			if (v->err_tag[0])
				waited = 20000;
		}
	}
	testvm_stop_all(s->tv);
	ret = testvm_join(s->tv, &bad, &ex);
	for (i = 0; i < VCPUS; i++) {
		struct guest_vcpu *v = testvm_mailbox(s->tv, i);

		ck_assert_msg(!v->err_tag[0], "%s: vCPU %u's self-check failed: %s, seen %#" PRIx64, what, i,
			      check_name(v->err_tag[0]), v->err_tag[1]);
		/* a vCPU that stopped (an AVX instruction without XCR0's AVX: #UD, no handler: shutdown) */
		ck_assert_msg(ret == 0 || bad != i, "%s: vCPU %u stopped with %s (exit reason %u): %s", what, bad,
			      testvm_event_name(ex.event), ex.exit_reason, strerror(-ret));
		ck_assert_msg(v->st_ticks >= ticks0[i] + 3,
			      "%s: vCPU %u took %" PRIu64 " timer ticks in %u ms (%" PRIu64 " before): its LAPIC "
			      "timer stopped",
			      what, i, v->st_ticks - ticks0[i], waited, ticks0[i]);
		ck_assert_msg(v->st_checks >= checks0[i] + 3, "%s: vCPU %u passed %" PRIu64 " state checks in %u ms",
			      what, i, v->st_checks - checks0[i], waited);
	}
	ck_assert_msg(ret == 0, "%s: vCPU %u stopped with %s (exit reason %u): %s", what, bad,
		      testvm_event_name(ex.event), ex.exit_reason, strerror(-ret));
}

struct recv_job {
	struct api_side *dst;
	int lfd, ret;
	char err[512];
};

static void *receive(void *p)
{
	struct recv_job *j = p;
	struct kvmdirty_mig_recv_opts o = { .once = true };

	j->ret = kvmdirty_mig_recv(j->dst->g, j->lfd, &o, NULL, j->err, sizeof(j->err));
	return NULL;
}

START_TEST(migrated_whole)
{
	char dir[] = "/tmp/test-whole-guest.XXXXXX", addr[128], err[512];
	struct kvmdirty_mig_send_result res;
	struct recv_job j = { 0 };
	struct api_side src, dst;
	pthread_t t;
	int ret;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(addr, sizeof(addr), "unix:%s/sock", dir);
	side_new(&src, true);
	side_new(&dst, false);
	ck_assert_int_eq(testvm_spawn(src.tv), 0);
	sleep_ms(200); /* ticks and checks under way at the source */
	j.dst = &dst;
	j.lfd = kvmdirty_mig_listen(addr, err, sizeof(err));
	ck_assert_msg(j.lfd >= 0, "listen: %s", err);
	ck_assert_int_eq(pthread_create(&t, NULL, receive, &j), 0);
	/* the state is the point, not convergence: a slow host (kvm-under-tcg) moves the rest anyway */
	ret = kvmdirty_mig_send(src.g, addr, &(struct kvmdirty_mig_send_opts){ .force_switchover = true }, &res, err,
				sizeof(err));
	pthread_join(t, NULL);
	close(j.lfd);
	ck_assert_msg(ret == 0 && res.outcome == KVMDIRTY_MIG_THERE, "send: %s (%d)", err, ret);
	ck_assert_msg(j.ret == 0, "recv: %s (%d)", j.err, j.ret);
	ck_assert_msg(testvm_mailbox(dst.tv, 0)->st_ticks > 0, "the source's guest took no tick before it moved");
	/* the source's vCPUs stay paused: their threads end without running again */
	testvm_stop_all(src.tv);
	testvm_halt_all(src.tv);
	ck_assert_int_eq(testvm_spawn(dst.tv), 0);
	runs_on(&dst, "after the migration");
	api_side_free(&src);
	api_side_free(&dst);
	unlink(addr + 5);
	rmdir(dir);
}
END_TEST

START_TEST(restored_whole)
{
	char dir[] = "/tmp/test-whole-guest.XXXXXX", prefix[128], err[512];
	struct kvmdirty_mig_snap_result r0, r1;
	struct kvmdirty_mig_snap_opts so = { .prefix = prefix };
	struct kvmdirty_mig_snap *snap;
	const char *chain[2];
	struct api_side src, dst;
	uint64_t pages;

	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(prefix, sizeof(prefix), "%s/s", dir);
	side_new(&src, true);
	ck_assert_int_eq(testvm_spawn(src.tv), 0);
	sleep_ms(200);
	ck_assert_int_eq(kvmdirty_mig_snap_new(src.g, &so, &snap, err, sizeof(err)), 0);
	ck_assert_msg(kvmdirty_mig_snap_take(snap, &r0, err, sizeof(err)) == 0, "full snapshot: %s", err);
	sleep_ms(200); /* more ticks and writes for the diff */
	ck_assert_msg(kvmdirty_mig_snap_take(snap, &r1, err, sizeof(err)) == 0, "diff: %s", err);
	kvmdirty_mig_snap_free(snap);
	testvm_stop_all(src.tv);
	testvm_halt_all(src.tv);

	{
		/* what the files say a guest to restore them into must have */
		struct kvmdirty_mig_snap_region reg[8];
		struct kvmdirty_mig_snap_info in0, in1;
		unsigned int i;
		bool data = false;

		ck_assert_msg(kvmdirty_mig_snap_info(r0.path, &in0, reg, 8, err, sizeof(err)) == 0, "info: %s", err);
		ck_assert_msg(kvmdirty_mig_snap_info(r1.path, &in1, NULL, 0, err, sizeof(err)) == 0, "info: %s", err);
		ck_assert_uint_eq(in0.seq, 0);
		ck_assert_uint_eq(in1.seq, 1);
		ck_assert_uint_eq(in0.nr_vcpus, VCPUS);
		ck_assert_uint_eq(in1.nr_regions, in0.nr_regions);
		ck_assert_uint_le(in0.nr_regions, 8);
		for (i = 0; i < in0.nr_regions; i++)
			data |= reg[i].gpa == DATA_GPA && reg[i].size == DATA_SIZE;
		ck_assert_msg(data, "the data region is not in %s's table", r0.path);
		ck_assert_int_eq(kvmdirty_mig_snap_info(dir, &in0, NULL, 0, err, sizeof(err)) < 0, 1);
		ck_assert_msg(strstr(err, dir), "a directory, not a snapshot, not named: %s", err);
	}
	side_new(&dst, false);
	chain[0] = r0.path;
	chain[1] = r1.path;
	ck_assert_msg(kvmdirty_mig_restore(dst.g, chain, 2, &pages, err, sizeof(err)) == 0, "restore: %s", err);
	ck_assert_msg(testvm_mailbox(dst.tv, 0)->st_ticks > 0, "the snapshot's guest took no tick");
	ck_assert_int_eq(testvm_spawn(dst.tv), 0);
	runs_on(&dst, "after the restore");
	api_side_free(&src);
	api_side_free(&dst);
	unlink(r0.path);
	unlink(r1.path);
	rmdir(dir);
}
END_TEST

int main(void)
{
	int skip = require_kvm("test-whole-guest");
	Suite *s;
	TCase *tc;

	if (skip)
		return skip;
	printf("whole-guest: %s\n", testvm_pvm_host() ? "a PVM-based KVM: SYSCALL and TSC_AUX left out of the guest's checks"
						      : "SYSCALL through LSTAR and TSC_AUX in the guest's checks");
	s = suite_create("whole-guest");
	tc = tcase_create("whole-guest");
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, migrated_whole);
	tcase_add_test(tc, restored_whole);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
