// SPDX-License-Identifier: MIT
/*
 * bench-exit: the cost the library adds to a vCPU exit.  The test guest
 * exits in a tight loop (an out instruction per iteration); the same vCPU
 * runs that loop through kvmdirty_vcpu_run() and through a bare KVM_RUN
 * ioctl, in alternating rounds of the same length, with the dirty ring on
 * (the mode in which the helper has work to do).  Prints ns per exit for
 * both and their ratio.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>

#include <linux/kvm.h>

#include "testvm.h"
#include "../examples/common/kvm-host.h"

#define EXITS 5000
#define ROUNDS 10

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/* Both loops check the same thing per exit: an out to the tick port. */
static int run_lib(struct kvmdirty_vcpu *v, struct kvm_run *run)
{
	int i, ret;

	for (i = 0; i < EXITS; i++) {
		ret = kvmdirty_vcpu_run(v);
		if (ret < 0)
			return ret;
		if (run->exit_reason != KVM_EXIT_IO || run->io.port != GUEST_PORT_TICK)
			return -EIO;
	}
	return 0;
}

static int run_bare(int fd, struct kvm_run *run)
{
	int i;

	for (i = 0; i < EXITS; i++) {
		if (ioctl(fd, KVM_RUN, NULL) < 0)
			return -errno;
		if (run->exit_reason != KVM_EXIT_IO || run->io.port != GUEST_PORT_TICK)
			return -EIO;
	}
	return 0;
}

int main(void)
{
	struct testvm_opts o = { .nr_vcpus = 1, .track = true,
				 .track_opts = { .mode = KVMDIRTY_MODE_DIRTY_RING, .ring_entries = 4096 } };
	double lib = 0, bare = 0, best_lib = 1e30, best_bare = 1e30;
	struct testvm *tv;
	struct kvm_run *run;
	int r, ret, fd;

	ret = kvm_host_check("bench-exit: ");
	if (ret)
		return ret;
	ret = testvm_new(&o, &tv);
	if (ret == -EOPNOTSUPP) {
		o.track_opts.mode = KVMDIRTY_MODE_AUTO;
		ret = testvm_new(&o, &tv);
	}
	if (ret < 0) {
		fprintf(stderr, "bench-exit: creating the VM: %s\n", strerror(-ret));
		return 1;
	}
	testvm_mailbox(tv, 0)->pattern = GUEST_EXIT_LOOP;
	run = kvmdirty_vcpu_kvm_run(tv->vcpu[0]);
	fd = kvmdirty_vcpu_fd(tv->vcpu[0]);
	ret = run_bare(fd, run); /* warm up */
	for (r = 0; r < ROUNDS && !ret; r++) {
		double t0 = now_ns(), t1, t2;

		ret = run_lib(tv->vcpu[0], run);
		t1 = now_ns();
		if (!ret)
			ret = run_bare(fd, run);
		t2 = now_ns();
		lib += t1 - t0;
		bare += t2 - t1;
		best_lib = t1 - t0 < best_lib ? t1 - t0 : best_lib;
		best_bare = t2 - t1 < best_bare ? t2 - t1 : best_bare;
	}
	if (ret < 0) {
		fprintf(stderr, "bench-exit: running the guest: %s\n", ret == -EIO ? "unexpected exit" : strerror(-ret));
		return 1;
	}
	printf("exit rounds=%d exits_per_round=%d lib_ns=%.0f bare_ns=%.0f ratio=%.4f best_lib_ns=%.0f "
	       "best_bare_ns=%.0f best_ratio=%.4f mode=%s\n",
	       ROUNDS, EXITS, lib / ROUNDS / EXITS, bare / ROUNDS / EXITS, lib / bare, best_lib / EXITS,
	       best_bare / EXITS, best_lib / best_bare,
	       kvmdirty_tracker_mode(tv->tracker) == KVMDIRTY_MODE_DIRTY_RING ? "dirty-ring" : "bitmap");
	testvm_free(tv);
	return 0;
}
