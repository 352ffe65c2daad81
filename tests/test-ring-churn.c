// SPDX-License-Identifier: MIT
/*
 * Batched ring harvests on the real KVM (a 1 ms reaper and a
 * consumer's syncs) while every vCPU exits ring-full again and again (256
 * entries) and two vCPUs are freed and registered again from their own
 * threads (kvmdirty_vcpu_free(): collected alone, parked, harvested with
 * the others; kvmdirty_vcpu_add() of a copy of the fd takes the ring
 * over).  Judged by page contents: after the vCPUs stop and a last sync,
 * the consumer's copy must equal guest memory.  Meant for ThreadSanitizer
 * too (suite threads).
 */
#include <pthread.h>
#include <unistd.h>
#include <linux/kvm.h>

#include "ring-util.h"

#define GPA (4 * GIB)
#define NV 4
#define PER (256ull) /* pages a vCPU writes */

static struct {
	struct rig g;
	int stop;
	uint64_t passes[NV], frees[NV];
} s;

static void *vcpu_thread(void *p)
{
	unsigned int i = (unsigned int)(uintptr_t)p;
	struct testvm_exit ex;

	while (!__atomic_load_n(&s.stop, __ATOMIC_ACQUIRE)) {
		int ret = testvm_run(s.g.tv, i, &ex);

		expect(ret == 0, "vCPU %u: %d (%s)", i, ret, strerror(-ret));
		expect(ex.event == TESTVM_PASS || ex.event == TESTVM_TICK, "vCPU %u: %s (exit %u)", i,
		       testvm_event_name(ex.event), ex.exit_reason);
		if (ex.event == TESTVM_PASS)
			s.passes[i]++;
		/* vCPUs 0 and 1: every third pass, out of the library and back (a copy of the fd), on this thread */
		if (i < 2 && ex.event == TESTVM_PASS && s.passes[i] % 3 == 0) {
			struct kvmdirty_vcpu *v = s.g.tv->vcpu[i], *nv;
			int fd = dup(kvmdirty_vcpu_fd(v));

			expect(fd >= 0, "dup");
			kvmdirty_vcpu_free(v);
			expect(kvmdirty_vcpu_add(s.g.tv->vm, fd, &nv) == 0, "vCPU %u registered again", i);
			s.g.tv->vcpu[i] = nv;
			__atomic_add_fetch(&s.frees[i], 1, __ATOMIC_RELAXED);
		}
	}
	return NULL;
}

START_TEST(frees_full_exits_and_batches)
{
	struct kvmdirty_region *r;
	pthread_t th[NV];
	unsigned int i, rounds = 0;
	void *mem;

	static const uint32_t reaper[] = { 1, 0, 7, 1, 0 };
	static const unsigned int pause_us[] = { 2000, 10000, 3000, 2000, 10000 };
	/* the last two: vCPUs 2 and 3 write in ring 0 (KVM's emulator here: it pushes past a full ring) */
	uint64_t ring0 = _i >= 3 ? 0xc : 0;

	memset(&s, 0, sizeof(s));
	s.g = ring_rig(NV, 256, reaper[_i], ring0);
	s.stop = 0;
	ck_assert_ok(testvm_add_memory(s.g.tv, GPA, NV * PER * PAGE, 0, &mem, &r));
	rig_add_copy(&s.g, s.g.tv->sys_region, true, false);
	rig_add_copy(&s.g, r, false, false);
	for (i = 0; i < NV; i++)
		rig_work(s.g.tv, i, GPA + i * PER * PAGE, PER, GUEST_RANDOM, GUEST_F_EXIT_EVERY_PASS);
	ck_assert_ok(kvmdirty_tracker_start(s.g.t, NULL));
	rig_sync_consume(&s.g);
	for (i = 0; i < NV; i++)
		ck_assert_int_eq(pthread_create(&th[i], NULL, vcpu_thread, (void *)(uintptr_t)i), 0);
	/* the consumer: sync and copy while the guest writes, about 2 s */
	while (rounds < 400 && (rounds < 100 || __atomic_load_n(&s.frees[0], __ATOMIC_RELAXED) < 10 ||
				    __atomic_load_n(&s.frees[1], __ATOMIC_RELAXED) < 10)) {
		rig_sync_consume(&s.g);
		rig_pause_us(pause_us[_i]);
		rounds++;
	}
	__atomic_store_n(&s.stop, 1, __ATOMIC_RELEASE);
	for (i = 0; i < NV; i++)
		pthread_join(th[i], NULL);
	rig_sync_consume(&s.g);
	{
		struct kvmdirty_stats st = stats(s.g.t);

		printf("%u vCPUs%s, ring 256, reaper %u ms, a sync every %u us: %u syncs; passes %" PRIu64 "/%" PRIu64 "/%" PRIu64 "/%" PRIu64
		       "; frees %" PRIu64 "/%" PRIu64 "; ring-full exits %" PRIu64 ", reaper runs %" PRIu64
		       ", overflows %" PRIu64 ", entries %" PRIu64 "\n",
		       NV, ring0 ? " (2 and 3 in ring 0)" : "", reaper[_i], pause_us[_i], rounds, s.passes[0], s.passes[1], s.passes[2], s.passes[3], s.frees[0], s.frees[1],
		       st.ring_full_exits, st.ring_reaper_runs, st.ring_overflows, st.ring_harvested);
		fflush(stdout);
	}
	rig_expect_fresh(&s.g, "frees, ring-full exits and batched harvests");
	rig_free(&s.g);
	testvm_free(s.g.tv);
	testvm_unmap(mem, NV * PER * PAGE);
}
END_TEST

int main(void)
{
	int skip = require_kvm("test-ring-churn");
	Suite *su;
	TCase *tc;

	if (skip)
		return skip;
	su = suite_create("ring-churn");
	tc = tcase_create("ring-churn");
	tcase_set_timeout(tc, 300);
	tcase_add_loop_test(tc, frees_full_exits_and_batches, 0, 5);
	suite_add_tcase(su, tc);
	return run_suite(su);
}
