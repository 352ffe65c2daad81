/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_TEST_RING_UTIL_H
#define KVMDIRTY_TEST_RING_UTIL_H

/*
 * What the dirty ring tests share: a tracked test VM in ring mode, the
 * statistics, and a vCPU run on a thread of its own, which a test can take
 * out of KVM_RUN for good when a ring went wrong.
 */
#include <pthread.h>
#include <signal.h>

#include "hooks.h"
#include "rig.h"
#include "vcpu.h"

static inline void hooks_off(void)
{
	kd_test_hooks_set(NULL, NULL, false);
}

static inline struct rig ring_rig(unsigned int vcpus, uint32_t entries, uint32_t reaper_ms, uint64_t ring0_vcpus)
{
	struct testvm_opts o = { .nr_vcpus = vcpus, .ring0_vcpus = ring0_vcpus, .track = true,
				 .track_opts = { .mode = KVMDIRTY_MODE_DIRTY_RING, .ring_entries = entries,
						 .reaper_ms = reaper_ms } };
	struct rig g = { 0 };

	hooks_off();
	ck_assert_ok(testvm_new(&o, &g.tv));
	g.t = g.tv->tracker;
	return g;
}

static inline struct kvmdirty_stats stats(struct kvmdirty_tracker *t)
{
	struct kvmdirty_stats st;

	ck_assert_ok(kvmdirty_tracker_stats(t, &st, sizeof(st)));
	return st;
}

/* A vCPU on its own thread, run until its guest reports done. */
struct runner {
	struct testvm *tv;
	unsigned int i;
	pthread_t th;
	int ret;
	struct testvm_exit ex;
	int done;
	void (*on_done)(void); /* called on the vCPU's thread once it is done */
};

static inline void *runner_main(void *p)
{
	struct runner *r = p;

	do
		r->ret = testvm_run(r->tv, r->i, &r->ex);
	while (!r->ret && (r->ex.event == TESTVM_PASS || r->ex.event == TESTVM_TICK));
	__atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
	if (r->on_done)
		r->on_done();
	return NULL;
}

static inline void runner_start_cb(struct runner *r, struct testvm *tv, unsigned int i, void (*on_done)(void))
{
	*r = (struct runner){ .tv = tv, .i = i, .on_done = on_done };
	ck_assert_int_eq(pthread_create(&r->th, NULL, runner_main, r), 0);
}

static inline void runner_start(struct runner *r, struct testvm *tv, unsigned int i)
{
	runner_start_cb(r, tv, i, NULL);
}

/* Wait for the runner up to ms; true if it finished. */
static inline bool runner_wait(struct runner *r, unsigned int ms)
{
	unsigned int i;

	for (i = 0; i < ms && !__atomic_load_n(&r->done, __ATOMIC_ACQUIRE); i++)
		rig_pause_us(1000);
	return __atomic_load_n(&r->done, __ATOMIC_ACQUIRE);
}

static inline void on_kick(int sig)
{
	(void)sig;
}

/* Take a vCPU out of KVM_RUN for good: a ring gone wrong can hold it there without running the guest. */
static inline void runner_kick(struct runner *r)
{
	struct sigaction sa = { .sa_handler = on_kick };

	sigaction(SIGUSR1, &sa, NULL);
	__atomic_store_n(&r->tv->pause_req, true, __ATOMIC_RELEASE);
	__atomic_store_n(&kvmdirty_vcpu_kvm_run(r->tv->vcpu[r->i])->immediate_exit, 1, __ATOMIC_RELAXED);
	pthread_kill(r->th, SIGUSR1);
}

static inline void runner_join(struct runner *r)
{
	struct guest_vcpu *mb = testvm_mailbox(r->tv, r->i);

	pthread_join(r->th, NULL);
	ck_assert_msg(r->ret == 0, "vCPU %u: kvmdirty_vcpu_run: %s", r->i, strerror(-r->ret));
	ck_assert_msg(r->ex.event == TESTVM_DONE, "vCPU %u: %s (exit %u), check page 0x%" PRIx64 " tag (%" PRIu64
		      ", %" PRIu64 ")",
		      r->i, testvm_event_name(r->ex.event), r->ex.exit_reason, mb->err_gpa, mb->err_tag[0],
		      mb->err_tag[1]);
}


/* CLOCK_MONOTONIC in ns. */
static inline uint64_t mono_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Sleep in small steps until *n >= min or ms passed (signals only shorten a step). */
static inline bool wait_count(const int *n, int min, unsigned int ms)
{
	uint64_t end = mono_ns() + (uint64_t)ms * 1000000;

	while (__atomic_load_n(n, __ATOMIC_ACQUIRE) < min && mono_ns() < end) {
		struct timespec ts = { 0, 200000 };

		nanosleep(&ts, NULL);
	}
	return __atomic_load_n(n, __ATOMIC_ACQUIRE) >= min;
}

/* Let vCPU i's guest write n pages more (5 s at most), e.g. for the next sync to charge. */
static inline void wait_writes(struct testvm *tv, unsigned int i, uint64_t n)
{
	const struct guest_vcpu *mb = testvm_mailbox(tv, i);
	uint64_t w = mb->writes;
	int k;

	for (k = 0; k < 5000 && mb->writes < w + n; k++)
		rig_pause_us(1000);
}

/*
 * A test guest's exit from kvmdirty_vcpu_run() that returned 0: 1 for a
 * pass or a tick (run on), 0 when the guest is done, -EIO for anything else.
 */
static inline int guest_exit(const struct kvm_run *run)
{
	if (run->exit_reason != KVM_EXIT_IO)
		return -EIO;
	if (run->io.direction == KVM_EXIT_IO_OUT &&
	    (run->io.port == GUEST_PORT_PASS || run->io.port == GUEST_PORT_TICK))
		return 1;
	return run->io.port == GUEST_PORT_DONE ? 0 : -EIO;
}

/* 0 where KVM offers a dirty ring; 77 and one line where it does not. */
static inline int require_ring(const char *test)
{
	struct kvmdirty_vm *vm;
	int64_t ring;
	int ret = kvmdirty_vm_new(&vm);

	if (ret < 0) {
		printf("%s: creating a VM: %s\n", test, strerror(-ret));
		return 1;
	}
	ring = kvmdirty_vm_cap(vm, KVMDIRTY_CAP_DIRTY_RING_ACQ_REL) + kvmdirty_vm_cap(vm, KVMDIRTY_CAP_DIRTY_RING);
	kvmdirty_vm_free(vm);
	if (ring > 0)
		return 0;
	printf("%s: skipped: KVM has no dirty ring\n", test);
	return 77;
}

/*
 * Host quirk "ring-overflow": KVM pushes entries past a full dirty ring
 * when guest CPL-0 code writes memory through its instruction emulator,
 * which runs up to 1,024 instructions between exits, more than the ring's
 * 64-entry reserve (PVM-based nested hosts, these machines); the entries it
 * overwrites are lost.  Hardware-assisted KVM (VMX, SVM with nested paging)
 * stops the vCPU at the ring's soft limit and loses nothing.  The probe
 * does what the overflow tests need: one vCPU at CPL 0 over 16,384 pages,
 * a 4,096-entry ring harvested only at its ring-full exits.  1 where KVM
 * overflowed the ring, 0 where it never did, -errno where the probe could
 * not run.  Bounded on any host: the pass ends whether or not it overflows.
 */
#define RING_OVERFLOW_QUIRK "host quirk ring-overflow"

static inline int host_ring_overflows(void)
{
	const uint64_t pages = 16384;
	struct testvm_opts o = { .nr_vcpus = 1, .ring0_vcpus = 1, .track = true,
				 .track_opts = { .mode = KVMDIRTY_MODE_DIRTY_RING, .ring_entries = 4096 } };
	struct kvmdirty_stats st;
	struct testvm_exit ex;
	struct testvm *tv;
	void *mem = NULL;
	int ret;

	ret = testvm_new(&o, &tv);
	if (ret < 0)
		return ret;
	ret = testvm_add_memory(tv, 4 * GIB, pages * PAGE, 0, &mem, NULL);
	if (ret == 0) {
		rig_work(tv, 0, 4 * GIB, pages, GUEST_SEQUENTIAL, GUEST_F_EXIT_EVERY_PASS);
		ret = kvmdirty_tracker_start(tv->tracker, NULL);
	}
	while (ret == 0 && (ret = testvm_run(tv, 0, &ex)) == 0 && ex.event == TESTVM_TICK)
		;
	if (ret == 0 && ex.event != TESTVM_PASS)
		ret = -EIO;
	if (ret == 0)
		ret = kvmdirty_tracker_stats(tv->tracker, &st, sizeof(st));
	if (ret == 0)
		ret = st.ring_overflows > 0;
	testvm_free(tv);
	if (mem)
		testvm_unmap(mem, pages * PAGE);
	return ret;
}

/*
 * For a test program's cases that need the quirk: 0 to run them; 77 and
 * the one line that names the quirk where this host does not have it; 1
 * where the probe failed.  Before Check allocates anything.
 */
static inline int require_ring_overflow(const char *test)
{
	int ret = host_ring_overflows();

	if (ret > 0)
		return 0;
	if (ret == 0) {
		printf("%s: skipped: needs " RING_OVERFLOW_QUIRK " (KVM pushing past a full dirty ring under guest "
		       "CPL-0 writes, as on PVM-based nested hosts); here a CPL-0 pass over 16384 pages with a 4096-entry "
		       "ring lost no entry\n", test);
		return 77;
	}
	printf("%s: the ring-overflow probe failed: %s\n", test, strerror(-ret));
	return 1;
}

/*
 * The start of a ring test program: "PROG overflow" runs only its cases
 * that need RING_OVERFLOW_QUIRK (*ret_overflow), plain "PROG" the others.
 * 0 to go on, else the exit status of a skip or a failed probe, decided
 * before Check allocates anything.
 */
static inline int ring_program_start(int argc, char **argv, const char *prog, bool *ret_overflow)
{
	bool overflow = argc > 1 && !strcmp(argv[1], "overflow");
	char name[64];
	int skip;

	snprintf(name, sizeof(name), "%s%s", prog, overflow ? " overflow" : "");
	skip = require_kvm(name);
	if (!skip)
		skip = require_ring(name);
	if (!skip && overflow)
		skip = require_ring_overflow(name);
	*ret_overflow = overflow;
	return skip;
}

#endif
