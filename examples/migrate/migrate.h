/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_H
#define KVMDIRTY_MIGRATE_H

/*
 * Live migration of the test guest on libkvmdirty: the source and
 * destination halves, the address parsing, and the guest both ends build.
 * Errors come back as -errno with a one-line reason in err.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "testvm.h"

#define MIG_DATA_GPA (4ull << 30)

/* The guest both ends build: same layout, so the region tables match. */
struct mig_guest {
	uint64_t mib;		 /* data memory */
	unsigned int vcpus;
	enum kvmdirty_mode mode; /* source's tracker */
	uint64_t ws_mib;	 /* working set the vCPUs dirty (0: idle) */
	uint64_t rate;		 /* pages/s per vCPU (0: flat out) */
};

int mig_guest_new(const struct mig_guest *g, bool source, struct testvm **ret_tv, char *err, size_t len);
/*
 * Fill the data memory with non-zero bytes (every zero_every-th page left
 * zero; 0: none), so zero pages do not flatter a run.
 */
void mig_guest_fill(struct testvm *tv, uint64_t zero_every);

struct mig_send_opts {
	uint64_t downtime_ms; /* stop-and-copy once the rest fits this */
	unsigned int max_passes;
	uint64_t timeout_ms;
	bool verify;   /* send page digests */
	FILE *stats;   /* JSON lines, or NULL */
	bool progress; /* a status line on stderr */
};

struct mig_result {
	double total_ms, downtime_ms;
	uint64_t bytes, passes, pages, zero_pages;
	bool converged;
};

/*
 * Migrate tv (its vCPUs running under testvm_spawn) over fd.  On success
 * the source's vCPUs are left paused; on failure they run on and tracking
 * is stopped, so the guest is as before and can be migrated again.
 */
int mig_send(struct testvm *tv, int fd, const struct mig_send_opts *o, struct mig_result *res, char *err,
	     size_t len);

/*
 * Receive into tv (built by mig_guest_new(.., false, ..)) and set its
 * vCPUs' state; the guest is not run.  Returns 0 once the stream is
 * complete and its digests (if sent) match; otherwise -errno and a reason
 * naming the field.  Answers the source with the outcome.
 */
int mig_recv(struct testvm *tv, int fd, bool *ret_verified, char *err, size_t len);

/*
 * Run a received guest for run_ms and check it: no vCPU reports a
 * self-check error or stops otherwise, and vCPU 0's pass counter moved.
 */
int mig_resume_check(struct testvm *tv, uint64_t run_ms, char *err, size_t len);

/* "tcp:HOST:PORT" or "unix:PATH". */
int mig_listen(const char *addr, char *err, size_t len);
int mig_accept(int lfd, char *err, size_t len);
int mig_connect(const char *addr, char *err, size_t len);

#endif
