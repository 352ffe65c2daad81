// SPDX-License-Identifier: MIT
/*
 * The test VM behind the engine's own guest interface (guest.h), for the
 * engine's tests and benchmarks, which drive mig_send() and its kin
 * directly.  kvmdirty-migrate itself goes through the public API
 * (testguest.c's mig_testvm_api()).
 */
#include <signal.h>
#include <string.h>

#include "testguest-engine.h"

static int eg_vcpu_save(void *ctx, unsigned int i, struct mig_vcpu_state *st)
{
	struct testvm *tv = ctx;

	return mig_vcpu_save_kvm(kvmdirty_vcpu_fd(tv->vcpu[i]), st);
}

static int eg_vcpu_load(void *ctx, unsigned int i, const struct mig_vcpu_state *st)
{
	struct testvm *tv = ctx;

	return mig_vcpu_load_kvm(kvmdirty_vcpu_fd(tv->vcpu[i]), st);
}

static int eg_vm_save(void *ctx, struct mig_vm_state *st)
{
	struct testvm *tv = ctx;

	return mig_vm_save_kvm(kvmdirty_vm_fd(tv->vm), st);
}

static int eg_vm_load(void *ctx, const struct mig_vm_state *st)
{
	struct testvm *tv = ctx;

	return mig_vm_load_kvm(kvmdirty_vm_fd(tv->vm), st);
}

static const struct mig_guest_ops eg_ops = {
	.vcpu_save = eg_vcpu_save,
	.progress = mig_testvm_progress_of,
	.vcpu_load = eg_vcpu_load,
	.vm_save = eg_vm_save,
	.vm_load = eg_vm_load,
	.pause = mig_testvm_pause,
	.resume = mig_testvm_resume,
	.set_run_share = mig_testvm_run_share,
	.kept_out_ns = mig_testvm_kept_out_ns,
};

int mig_testvm_guest(struct testvm *tv, struct mig_guest *g)
{
	unsigned int i;

	memset(g, 0, sizeof(*g));
	g->nr_vcpus = tv->nr_vcpus;
	g->tracker = tv->tracker;
	g->ops = &eg_ops;
	g->ctx = tv;
	for (i = 0; i < tv->nr_vcpus && i < MIG_MAX_VCPUS; i++)
		g->vcpu[i] = tv->vcpu[i];
	mig_testvm_kick_signal(tv);
	return mig_guest_set_regions(g, tv->vm);
}
