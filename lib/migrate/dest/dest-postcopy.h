/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_DEST_POSTCOPY_H
#define KVMDIRTY_MIGRATE_DEST_POSTCOPY_H

/*
 * Post-copy at the destination (stream.h, "post-copy"): the guest runs
 * here while the pages the source left behind (LEFT) come in.  Every
 * region is registered with userfaultfd for missing pages and the LEFT
 * pages emptied (a copy of an earlier pass is stale) once COMMIT arrives,
 * before the ACK: where that fails the ACK says so and the source keeps
 * its guest.  Then a thread reads the faults: a LEFT page not yet asked
 * for becomes a REQ on the fault channel (with the LEFT pages after it,
 * up to PC_AROUND), a page that was never LEFT and is missing is a page
 * the stream left zero (UFFDIO_ZEROPAGE).  A thread a connection reads
 * DATA (answers on the fault channel, the rest on the lanes): each page
 * must be a LEFT one (else the stream is refused) and match its hash
 * before it is placed (UFFDIO_COPY); a page placed already is passed
 * over.  Once every LEFT page is in, ALL_IN goes to the source, the
 * regions are unregistered, and post-copy is complete.
 *
 * A page that fails its hash, or a record out of form: the guest is
 * paused (ops->pause) and post-copy failed: the guest must not run again
 * (its memory is incomplete and the source's copy is older than its
 * state).  A connection that ends before every page is in: post-copy is
 * paused (vCPUs that touch a missing page wait), the event
 * postcopy_paused is told, and the pages already in stay.
 */
#include <stdbool.h>
#include <stdint.h>

#include "guest.h"
#include "hist.h"
#include "keyfile.h"
#include "session.h"
#include "status.h"

struct mig_pc;

struct mig_pc_stats {
	bool complete, failed, paused;
	uint64_t left;	      /* LEFT pages at the switch */
	uint64_t missing;     /* ... not yet in place */
	uint64_t faults;      /* faults that asked for a LEFT page */
	uint64_t zero_faults; /* faults on pages the stream left zero, placed here */
	uint64_t requested;   /* pages asked for (REQ), fault-around's included */
	uint64_t placed;      /* LEFT pages placed */
	uint64_t dups;	      /* copies of pages placed already, passed over */
	double complete_ms;   /* mig_pc_start() to ALL_IN */
	/* a fault on a LEFT page: from its read off the userfaultfd to its page placed */
	double fault_p50_us, fault_p99_us, fault_max_us;
	uint64_t hist[MIG_HIST + 1];
	char why[256]; /* failed or paused: why */
};

/*
 * After COMMIT (the guest loaded, not running): left[r] the LEFT pages
 * of each region (copied).  0 with *ret, or -errno with err (nothing
 * changed that matters: the guest is dropped, the ACK tells the source).
 */
int mig_pc_prepare(const struct mig_guest *g, uint64_t *const *left, struct mig_pc **ret, char *err, size_t len);

/*
 * After the ACK: serve faults and take pages over s's connections (the
 * last its fault channel); s is taken over (freed by mig_pc_free()).
 * st: events (postcopy_completed, postcopy_paused, postcopy_failed).
 */
int mig_pc_start(struct mig_pc *pc, struct mig_session *s, struct mig_status *st, char *err, size_t len);

/*
 * Recovery (stream.h): a connection lost pauses post-copy; a new session
 * of the same source is taken from lfd (the pc's from now, closed by
 * mig_pc_free(); or, once the status's recover names an address, from a
 * new listener there), with so's handshake (psk copied), refused unless
 * it names the session post-copy began on, and post-copy goes on over it:
 * the pages still missing told, the faults waiting asked for again.  Also
 * after every page is in, until the source acknowledged ALL_IN (it may
 * not have heard it).  0, or -errno (no thread).
 */
int mig_pc_listen(struct mig_pc *pc, int lfd, const struct mig_session_opts *so, const struct mig_psk *psk);

/*
 * Wait up to timeout_ms (< 0: for ever) for post-copy to complete (0) or
 * fail (-EPROTO, -EIO, ...: err says why; the guest was paused).
 * -ETIMEDOUT otherwise (paused or still under way).
 */
int mig_pc_wait(struct mig_pc *pc, int64_t timeout_ms, char *err, size_t len);
void mig_pc_get_stats(struct mig_pc *pc, struct mig_pc_stats *st);

/*
 * Stop its threads, close its connections.  Before it completed, the
 * guest's memory is incomplete: every vCPU must be out of KVM_RUN for
 * good first.
 */
void mig_pc_free(struct mig_pc *pc);

#endif
