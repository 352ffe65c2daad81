/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_TESTGUEST_H
#define KVMDIRTY_MIGRATE_TESTGUEST_H

/*
 * The test guest (examples/vmm) as kvmdirty-migrate builds it: the one
 * file of the daemon that knows the test VM.  Both ends build the same
 * guest (so the region tables match); the source's vCPUs dirty a working
 * set at a given rate and check each page's tag as they go, so a guest
 * that runs on at the destination proves its memory arrived.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <kvmdirty-migrate.h>

#include "testvm.h"

#define MIG_DATA_GPA (4ull << 30)
#define MIG_TESTVM_MAX_REGIONS 65534u /* data regions, at most (the engine's 65,535 less the code's) */

/* What one vCPU of the source does while it is migrated. */
enum mig_work {
	MIG_WORK_SHARE = 0, /* dirty an equal share of ws_mib at rate (idle if ws_mib is 0) */
	MIG_WORK_IDLE,	    /* run, write nothing */
	MIG_WORK_DIRTY,	    /* dirty mib of its own at rate */
	MIG_WORK_COMPUTE,   /* compute, write no memory (GUEST_COMPUTE) */
};

struct mig_vcpu_work {
	enum mig_work kind;
	uint64_t mib;  /* MIG_WORK_DIRTY */
	uint64_t rate; /* MIG_WORK_DIRTY: pages/s (0: flat out) */
};

#define MIG_FILL_WS 0		/* fill: the working sets only; the rest never touched */
#define MIG_FILL_ALL UINT64_MAX /* fill: all of memory (one page in 16 left zero) */

struct mig_testvm_opts {
	uint64_t mib;		 /* data memory */
	unsigned int vcpus;
	enum kvmdirty_mode mode; /* source's tracker */
	uint64_t ws_mib;	 /* working set the MIG_WORK_SHARE vCPUs dirty (0: idle) */
	uint64_t rate;		 /* pages/s per such vCPU (0: flat out) */
	struct mig_vcpu_work work[GUEST_MAX_VCPUS]; /* per vCPU; zero: MIG_WORK_SHARE */
	/*
	 * Source: what holds non-zero data before the vCPUs run: the
	 * working sets (MIG_FILL_WS), all of memory (MIG_FILL_ALL), or the
	 * first fill MiB and the working sets.  Memory not filled and not
	 * in a working set is never touched.
	 */
	uint64_t fill;
	/* data memory: MAP_SHARED of data_fd (filled beforehand) instead of anonymous memory */
	bool data_file;
	int data_fd;
	/*
	 * The data memory as this many regions (memslots), one after another
	 * in guest and host addresses, each of a whole number of pages, the
	 * last taking what does not divide (0 or 1: one region); at most
	 * MIG_TESTVM_MAX_REGIONS and the memory's pages.
	 */
	unsigned int regions;
	/*
	 * Destination: leave the data memory to be faulted in as pages
	 * arrive (a VMM that does not preallocate), not before the stream.
	 * Also the case, whatever this says, for a guest larger than half of
	 * the memory this process may still take (MemAvailable, less where
	 * its cgroup's memory.max leaves less; nothing where neither can be
	 * read), which faulting in would push into reclaim or the OOM killer
	 * before a byte arrived.
	 */
	bool lazy;
	/* Source: the fill is text-like (mig_testvm_fill_text_range()) rather than random bytes. */
	bool text;
};

/* Whether mig_testvm_new() faults this guest's memory in beforehand (see lazy). */
bool mig_testvm_prefaults(const struct mig_testvm_opts *g, bool source);

/*
 * Build the guest; a destination's memory is faulted in here, before any
 * stream, as a VMM allocates a guest's RAM before it starts it (unless
 * lazy, see above).  A source gets its vCPUs' workloads and its fill.
 */
/* The options alone, before anything is built: 0, or -EINVAL with the reason in err. */
int mig_testvm_check(const struct mig_testvm_opts *o, char *err, size_t len);
int mig_testvm_new(const struct mig_testvm_opts *o, bool source, struct testvm **ret_tv, char *err, size_t len);
/* testvm_free(), and the data memory it does not unmap. */
void mig_testvm_free(struct testvm *tv);
/*
 * Fill the data memory with non-zero bytes (every zero_every-th page left
 * zero; 0: none), so zero pages do not flatter a run.
 */
void mig_testvm_fill(struct testvm *tv, uint64_t zero_every);

/* Pages [first, first + count) of the data memory, the same way. */
void mig_testvm_fill_range(struct testvm *tv, uint64_t first, uint64_t count, uint64_t zero_every);

/*
 * Pages [first, first + count) of the data memory filled with text-like
 * bytes: words of one to three syllables (of 24) from a vocabulary of
 * 256, each picked with a skew (the product of two uniform draws, as
 * words of a text are), a space after each, a newline after about one in
 * 13; about 3.1:1 with zstd -1.  Every zero_every-th page left zero; the
 * first 16 bytes of each page the guest's tag, left to it.
 */
void mig_testvm_fill_text_range(struct testvm *tv, uint64_t first, uint64_t count, uint64_t zero_every);

/* vCPU i's progress: the pages it wrote, or the units it computed, so far. */
uint64_t mig_testvm_progress(struct testvm *tv, unsigned int i);

/*
 * tv behind the public API's guest (kvmdirty-migrate.h): its regions and
 * vCPUs, testvm's pause, resume, run share and progress; a source's with
 * its tracker, a destination's or a restore's fresh.  0, or -errno with
 * err.  Free it (kvmdirty_mig_guest_free()) before tv.
 */
int mig_testvm_api(struct testvm *tv, bool source, struct kvmdirty_mig_guest **ret_g, char *err, size_t len);
/* The guest's calls on tv (a struct testvm *), the same for the API's guest and the engine's */
void mig_testvm_pause(void *tv);
void mig_testvm_resume(void *tv);
uint64_t mig_testvm_progress_of(void *tv, unsigned int i);
int mig_testvm_run_share(void *tv, unsigned int i, unsigned int permille);
uint64_t mig_testvm_kept_out_ns(void *tv, unsigned int i);
/* In the dirty-ring mode, once tv's vCPU threads run: the library's kicks share testvm's SIGUSR1. */
void mig_testvm_kick_signal(struct testvm *tv);

/*
 * Run a received guest for run_ms, then take its vCPUs out of KVM_RUN
 * whatever the guest does, and check it: no vCPU reported a self-check
 * error or stopped otherwise, and each made progress where its own pacing
 * promised some in the CPU time its thread got.  One line in err either way.
 */
int mig_testvm_resume_check(struct testvm *tv, uint64_t run_ms, char *err, size_t len);

/*
 * The same check for a guest whose vCPU threads already run (the source's,
 * after a migration that failed or was abandoned): run_ms more, then stop
 * and check.  The vCPU threads have ended when it returns.
 */
int mig_testvm_check_running(struct testvm *tv, uint64_t run_ms, char *err, size_t len);

#endif
