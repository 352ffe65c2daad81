// SPDX-License-Identifier: MIT
/*
 * Stress for the per-vCPU dirty limit: every party at once, also run
 * under ThreadSanitizer (KD_STRESS_SECS sets the length, 6 s by default).  Two vCPUs dirty flat out
 * (own threads calling kvmdirty_vcpu_run() directly), the reaper every
 * 1 ms kicks them (SIGUSR1), a thread changes their limits at random
 * (0, 1, 50, 500, 5000, 2^32 pages/s), a thread reads their stats, and
 * the main thread syncs and copies, and pauses and resumes the vCPUs
 * (immediate_exit + SIGUSR2) every 100 ms.  Checked: every pause gets
 * both vCPUs back (a held one too), kvmdirty_vcpu_run() never returns
 * -EINTR with immediate_exit clear (the only other signal is the
 * library's own kick), and the copy equals guest memory at the end.
 */
#include <inttypes.h>
#include <signal.h>
#include <linux/kvm.h>

#include "ring-util.h"

#define L_GPA (4 * GIB)
#define L_GPA2 (8 * GIB)

static void nop_handler(int sig)
{
	(void)sig;
}

struct vthread {
	struct testvm *tv;
	unsigned int i;
	pthread_t th;
	int ret, done, parked;
	uint64_t eintr_no_ie, runs;
};

static int pause_req, stop_aux;

static void *vcpu_main(void *p)
{
	struct vthread *t = p;
	struct kvmdirty_vcpu *v = t->tv->vcpu[t->i];
	struct kvm_run *run = kvmdirty_vcpu_kvm_run(v);
	int r;

	for (;;) {
		if (__atomic_load_n(&pause_req, __ATOMIC_ACQUIRE)) {
			__atomic_store_n(&t->parked, 1, __ATOMIC_RELEASE);
			while (__atomic_load_n(&pause_req, __ATOMIC_ACQUIRE))
				rig_pause_us(200);
			__atomic_store_n(&t->parked, 0, __ATOMIC_RELEASE);
		}
		r = kvmdirty_vcpu_run(v);
		t->runs++;
		if (r == -EINTR) {
			if (!__atomic_load_n(&run->immediate_exit, __ATOMIC_RELAXED))
				t->eintr_no_ie++;
			continue;
		}
		if (r < 0) {
			t->ret = r;
			break;
		}
		r = guest_exit(run);
		if (r > 0)
			continue;
		t->ret = r;
		break;
	}
	__atomic_store_n(&t->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

static void *limiter(void *p)
{
	static const uint64_t limits[] = { 0, 1, 50, 500, 5000, 1ull << 32 };
	struct testvm *tv = p;
	unsigned int seed = 7;

	while (!__atomic_load_n(&stop_aux, __ATOMIC_ACQUIRE)) {
		unsigned int i = (unsigned int)rand_r(&seed) % 2;
		uint64_t l = limits[(unsigned int)rand_r(&seed) % 6];

		kvmdirty_vcpu_set_dirty_limit(tv->vcpu[i], l);
		rig_pause_us(1000 + (unsigned int)rand_r(&seed) % 5000);
	}
	return NULL;
}

static void *statser(void *p)
{
	struct testvm *tv = p;
	struct kvmdirty_vcpu_stats st;
	uint64_t sum = 0;

	while (!__atomic_load_n(&stop_aux, __ATOMIC_ACQUIRE)) {
		kvmdirty_vcpu_stats(tv->vcpu[0], &st, sizeof(st));
		sum += st.dirtied;
		kvmdirty_vcpu_stats(tv->vcpu[1], &st, sizeof(st));
		sum += st.dirty_rate;
		rig_pause_us(300);
	}
	return (void *)(uintptr_t)sum;
}

static uint64_t vstats_limit(struct testvm *tv, unsigned int i)
{
	struct kvmdirty_vcpu_stats st;

	kvmdirty_vcpu_stats(tv->vcpu[i], &st, sizeof(st));
	return st.dirty_limit;
}

static bool wait_parked(struct vthread *t, unsigned int n, unsigned int ms)
{
	unsigned int i, k, ok = 0;

	for (k = 0; k < ms && ok < n; k++) {
		for (i = 0, ok = 0; i < n; i++)
			ok += __atomic_load_n(&t[i].parked, __ATOMIC_ACQUIRE) ||
			      __atomic_load_n(&t[i].done, __ATOMIC_ACQUIRE);
		if (ok < n)
			rig_pause_us(1000);
	}
	return ok == n;
}

START_TEST(everyone_at_once)
{
	struct rig g = ring_rig(2, 256, 1, 0);
	struct sigaction sa = { .sa_handler = nop_handler };
	struct kvmdirty_region *ra, *rb;
	struct kvmdirty_vcpu_stats s[2];
	struct vthread t[2];
	pthread_t lim, sts;
	double secs = 6.0;
	unsigned int i, k, pauses = 0;
	void *ma, *mb;

	sigaction(SIGUSR1, &sa, NULL);
	sigaction(SIGUSR2, &sa, NULL);
	ck_assert_ok(kvmdirty_vm_set_kick_signal(g.tv->vm, SIGUSR1));
	ck_assert_ok(testvm_add_memory(g.tv, L_GPA, 2048 * PAGE, 0, &ma, &ra));
	ck_assert_ok(testvm_add_memory(g.tv, L_GPA2, 2048 * PAGE, 0, &mb, &rb));
	rig_add_copy(&g, ra, false, false);
	rig_add_copy(&g, rb, false, false);
	rig_add_copy(&g, g.tv->sys_region, true, false);
	rig_work(g.tv, 0, L_GPA, 2048, GUEST_SEQUENTIAL, 0);
	rig_work(g.tv, 1, L_GPA2, 2048, GUEST_RANDOM, 0);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	rig_consume(&g);
	__atomic_store_n(&pause_req, 0, __ATOMIC_RELEASE);
	__atomic_store_n(&stop_aux, 0, __ATOMIC_RELEASE);
	for (i = 0; i < 2; i++) {
		t[i] = (struct vthread){ .tv = g.tv, .i = i };
		ck_assert_int_eq(pthread_create(&t[i].th, NULL, vcpu_main, &t[i]), 0);
	}
	ck_assert_int_eq(pthread_create(&lim, NULL, limiter, g.tv), 0);
	ck_assert_int_eq(pthread_create(&sts, NULL, statser, g.tv), 0);
	if (getenv("KD_STRESS_SECS"))
		secs = atof(getenv("KD_STRESS_SECS"));
	for (k = 0; k < (unsigned int)(secs * 100); k++) {
		rig_sync_consume(&g);
		rig_pause_us(10000);
		if (k % 10 != 9)
			continue;
		/* pause: immediate_exit, then the VMM's own signal */
		__atomic_store_n(&pause_req, 1, __ATOMIC_RELEASE);
		for (i = 0; i < 2; i++)
			__atomic_store_n(&kvmdirty_vcpu_kvm_run(g.tv->vcpu[i])->immediate_exit, 1, __ATOMIC_RELAXED);
		for (i = 0; i < 2; i++)
			pthread_kill(t[i].th, SIGUSR2);
		ck_assert_msg(wait_parked(t, 2, 10000), "pause %u: a vCPU did not come back in 10 s (limits %" PRIu64
			      ", %" PRIu64 ")", pauses, vstats_limit(g.tv, 0), vstats_limit(g.tv, 1));
		pauses++;
		rig_sync_consume(&g);
		for (i = 0; i < 2; i++)
			__atomic_store_n(&kvmdirty_vcpu_kvm_run(g.tv->vcpu[i])->immediate_exit, 0, __ATOMIC_RELAXED);
		__atomic_store_n(&pause_req, 0, __ATOMIC_RELEASE);
	}
	__atomic_store_n(&stop_aux, 1, __ATOMIC_RELEASE);
	pthread_join(lim, NULL);
	pthread_join(sts, NULL);
	for (i = 0; i < 2; i++) {
		ck_assert_ok(kvmdirty_vcpu_set_dirty_limit(g.tv->vcpu[i], 0));
		ck_assert_ok(kvmdirty_vcpu_stats(g.tv->vcpu[i], &s[i], sizeof(s[i])));
	}
	testvm_stop_all(g.tv);
	for (i = 0; i < 2; i++) {
		pthread_join(t[i].th, NULL);
		ck_assert_msg(t[i].ret == 0, "vCPU %u: %s", i, strerror(-t[i].ret));
	}
	printf("pauses %u; vCPU0 dirtied %" PRIu64 " holds %" PRIu64 " kicks %" PRIu64 " runs %" PRIu64
	       "; vCPU1 dirtied %" PRIu64 " holds %" PRIu64 " kicks %" PRIu64 " runs %" PRIu64 "\n",
	       pauses, s[0].dirtied, s[0].holds, s[0].kicks, t[0].runs, s[1].dirtied, s[1].holds, s[1].kicks,
	       t[1].runs);
	for (i = 0; i < 2; i++)
		ck_assert_msg(t[i].eintr_no_ie == 0,
			      "vCPU %u: kvmdirty_vcpu_run() returned -EINTR %" PRIu64 " times with immediate_exit "
			      "clear (library kicks: %" PRIu64 ")",
			      i, t[i].eintr_no_ie, s[i].kicks);
	rig_finish(&g, "after the last sync");
}
END_TEST

int main(void)
{
	int skip = require_kvm("limit-stress");
	Suite *s;
	TCase *tc;

	if (skip)
		return skip; /* before Check allocates anything: no leak on the way out */
	s = suite_create("limit-stress");
	tc = tcase_create("limit-stress");
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, everyone_at_once);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
