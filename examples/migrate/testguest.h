/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_TESTGUEST_H
#define KVMDIRTY_MIGRATE_TESTGUEST_H

/*
 * The test guest (examples/vmm) as the migration engine sees it: the one
 * file of the daemon that knows the test VM.  Both ends build the same
 * guest (so the region tables match); the source's vCPUs dirty a working
 * set at a given rate and check each page's tag as they go, so a guest
 * that runs on at the destination proves its memory arrived.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "guest.h"
#include "testvm.h"

#define MIG_DATA_GPA (4ull << 30)

struct mig_testvm_opts {
	uint64_t mib;		 /* data memory */
	unsigned int vcpus;
	enum kvmdirty_mode mode; /* source's tracker */
	uint64_t ws_mib;	 /* working set the vCPUs dirty (0: idle) */
	uint64_t rate;		 /* pages/s per vCPU (0: flat out) */
};

/*
 * Build the guest; a destination's memory is faulted in here, before any
 * stream, as a VMM allocates a guest's RAM before it starts it.
 */
int mig_testvm_new(const struct mig_testvm_opts *o, bool source, struct testvm **ret_tv, char *err, size_t len);
/* testvm_free(), and the data memory it does not unmap. */
void mig_testvm_free(struct testvm *tv);
/*
 * Fill the data memory with non-zero bytes (every zero_every-th page left
 * zero; 0: none), so zero pages do not flatter a run.
 */
void mig_testvm_fill(struct testvm *tv, uint64_t zero_every);

/* The engine's view of tv: its regions, KVM vCPU state, testvm's pause and resume. */
int mig_testvm_guest(struct testvm *tv, struct mig_guest *ret_g);

/*
 * Run a received guest for run_ms, then take its vCPUs out of KVM_RUN
 * whatever the guest does, and check it: no vCPU reported a self-check
 * error or stopped otherwise, and each made progress where its own pacing
 * promised some in the CPU time its thread got.  One line in err either way.
 */
int mig_testvm_resume_check(struct testvm *tv, uint64_t run_ms, char *err, size_t len);

#endif
