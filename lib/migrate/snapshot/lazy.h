/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_LAZY_H
#define KVMDIRTY_MIGRATE_LAZY_H

/*
 * Lazy restore: a snapshot chain's pages placed in guest memory when the
 * guest (or the VMM) first touches them, through userfaultfd, while a
 * fill thread places the rest; the vCPUs run from the start.
 *
 * The page server.  The guest's regions are emptied (whatever the VMM put
 * there goes: a restore replaces memory whole) and registered for missing
 * pages.  A fault on page p of region r is served from the newest file
 * listing p: its copy read (pread), checked against the hash in that
 * file's index, and only then placed (UFFDIO_COPY); a page the chain
 * holds as zero is placed as the zero page (UFFDIO_ZEROPAGE).  The fill
 * thread walks the files newest first, each in page order, placing every
 * DATA page not yet in place (after the working-set file's pages, when
 * one is given); when it is through, every page is in place or zero and
 * the regions are unregistered: the guest is resident and the files are
 * needed no more.
 *
 * Who places a page: the server on a fault or the filler, whichever comes
 * first; the other's UFFDIO_COPY fails with EEXIST, which is the sign that
 * the page is there (the faulting thread was woken by the copy that
 * placed it; EEXIST wakes the range again all the same).  A page's
 * "placed" bit is set after its copy or its EEXIST, never before, so that
 * the filler's end means every DATA page is in memory.
 *
 * A copy that fails its check (damaged, or the file changed since the
 * restore began), a read that fails, or a copy the kernel refuses: the
 * page is never placed, the restore fails (its first reason kept), the
 * filler stops and calls the guest's pause (every vCPU out of KVM_RUN: a
 * vCPU waiting on that page takes the kick's EINTR, Linux 6.2+ lets a
 * signal end a KVM fault's wait), then says so (event).  The server goes
 * on placing good pages for whoever waits on one (a VMM thread reading
 * guest memory while the pause comes), never the bad one.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "guest.h"
#include "hist.h"
#include "snapfile.h"

enum mig_lazy_event {
	MIG_LAZY_RESIDENT = 1, /* every page in place: the files are needed no more */
	MIG_LAZY_FAILED,       /* the restore failed; the guest was paused and must not run again */
};

struct mig_lazy_opts {
	/*
	 * The working-set file to read (NULL: none; absent or of another
	 * chain: ignored, and said in the stats), whose pages the filler
	 * places first, and the one to write once resident (NULL: none):
	 * the DATA pages faults placed, in their order (kvmdirty-snapshot(5)).
	 */
	const char *ws_read, *ws_write;
	double t0_ms; /* mig_clock_msf() when the restore began (its files opened since; 0: at the call) */
	bool no_fill; /* no fill thread: pages come in only when touched (tests, benchmarks) */
	/* called once each from the filler: line says what happened (resident and when, or the failure) */
	void (*event)(void *ctx, enum mig_lazy_event ev, const char *line);
	void *ctx;
};

#define MIG_LAZY_HIST MIG_HIST /* hist.h: 100 ns buckets to 100 us, then 10 us buckets to 10 ms */

struct mig_lazy_stats {
	double first_ms;    /* mig_lazy_start(): its start to its return (the vCPUs may run) */
	double resident_ms; /* its start to every page in place (0: not yet) */
	bool resident, failed;
	uint64_t faults;      /* faults that placed a page (DATA or zero) */
	uint64_t zero_faults; /* ... of them, zero pages */
	uint64_t raced;	      /* faults or fill copies that found the page placed already (EEXIST) */
	uint64_t filled;      /* DATA pages the filler placed */
	uint64_t around;      /* DATA pages placed after a faulting one, from the same copy */
	uint64_t prefetched;  /* ... of them, from the working-set file */
	uint64_t ws_pages;    /* pages the working-set file read listed (0: none read) */
	char ws_note[160];    /* why a working-set file given was not used ("" when it was, or none given) */
	uint64_t data_pages;  /* DATA pages of the chain, each page once (known when the fill is through) */
	/* faults' service times, from the read that brought the fault to its page placed */
	double fault_p50_us, fault_p99_us, fault_max_us;
	uint64_t hist[MIG_LAZY_HIST + 1]; /* the distribution: see mig_lazy_bucket_us() */
};

struct mig_lazy;

/*
 * Restore files[0 .. n) (a checked chain, snap_chain_check(), whose
 * regions are g's) lazily: regions emptied and registered, every vCPU's,
 * the VM's and the devices' state loaded, the server and filler started.
 * 0: run the guest (the files are the restore's from here on, closed by
 * mig_lazy_free()); -errno with err (nothing is left running; the files
 * stay the caller's; -EPERM/-ENOSYS: no userfaultfd here, said as such).
 * g->ops->pause is required (the failure path): -EINVAL without it.
 */
int mig_lazy_start(const struct mig_guest *g, struct snap_file **files, unsigned int n,
		   const struct mig_lazy_opts *o, struct mig_lazy **ret_lz, char *err, size_t len);

/*
 * Wait up to timeout_ms (< 0: for ever) for the guest to be resident (0)
 * or the restore to fail and the guest paused (its -errno, err saying
 * why: -EPROTO for a page that failed its check).  -ETIMEDOUT otherwise.
 */
int mig_lazy_wait(struct mig_lazy *lz, int64_t timeout_ms, char *err, size_t len);

/*
 * Whether memory of g is under a lazy restore of this process that is not
 * resident yet (a snapshot or a migration of it must wait: -EBUSY).
 */
bool mig_lazy_busy(const struct mig_guest *g);

void mig_lazy_get_stats(struct mig_lazy *lz, struct mig_lazy_stats *st);
/* The upper bound, in microseconds, of histogram bucket i. */
double mig_lazy_bucket_us(unsigned int i);

/*
 * Stop the server and the filler and close the files.  Before the guest
 * is resident its memory is incomplete: every vCPU must be out of
 * KVM_RUN for good first (a page touched afterwards reads as zero).
 */
void mig_lazy_free(struct mig_lazy *lz);

/*
 * Tests only: a call at named points of the server and the filler, so
 * that a test holds one there while another runs (a forced interleaving).
 * NULL (always, outside tests) costs a load a fault or a chunk.  As
 * snap_pwrite, it lives in the shipped code (a second build of the page
 * server for tests would lose to the engine's copy at link time), never
 * exported from the shared library.
 */
enum mig_lazy_hook_point {
	MIG_LAZY_HOOK_FAULT, /* the server: a fault read, its page looked up, before its copy is read */
	MIG_LAZY_HOOK_PLACE, /* the filler: pages read, checked and seen missing, just before their UFFDIO_COPY */
	MIG_LAZY_HOOK_READ,  /* either, before it reads pages: set inject to an errno to fail the read with it */
};
struct mig_lazy_hook;
extern void (*mig_lazy_hook)(enum mig_lazy_hook_point p, struct mig_lazy_hook *h); /* __atomic */

/* What the hook gets: the page(s), whose they are, and for READ an errno to inject. */
struct mig_lazy_hook {
	uint32_t region;
	uint64_t page, count;
	bool fill;  /* the filler's (else a fault's) */
	int inject; /* MIG_HOOK_LAZY_READ: set to an errno to fail the read with it */
};

#endif
