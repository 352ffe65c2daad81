/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_SNAPSHOT_H
#define KVMDIRTY_MIGRATE_SNAPSHOT_H

/*
 * Snapshots of a running guest into files (snapfile.h): a full one, then
 * diffs, each holding the pages written since the one before, through a
 * consumer of the guest's tracker of its own (so a migration or another
 * consumer beside it loses nothing, and takes nothing from it).
 *
 * A snapshot is taken as a migration is: passes over the pages pending
 * while the guest runs, each page written to its place in the file (a
 * page written again in a later pass replaces its copy), until what is
 * left fits the pause; then the vCPUs are paused, the tracker synced, the
 * rest written and the vCPUs' states saved, and the guest resumes.  A
 * guest that writes faster than the passes do is throttled meanwhile
 * (mig_snap_opts.no_throttle), and let go after the pause.  The
 * index, header and trailer, fsync, rename and the directory's fsync
 * follow with the guest running.  Only then does the consumer commit: a
 * snapshot that fails anywhere (a write, the sync to disk, the rename)
 * aborts it, so every page it had taken is pending again and the next
 * snapshot, which takes the failed one's number and parent, is complete.
 * The guest is never left paused by a failure, and no earlier file is
 * touched.
 *
 * One order is not safe: a migration (mig_send()) that turned tracking on
 * itself turns it off at its end, which drops every consumer's pending
 * pages, this one's too.  Begin the snapshots first (or keep tracking on
 * around both); mig_snap_free() never turns tracking off.
 *
 * Threads: one snapshot at a time, from one thread; the guest's vCPUs run
 * meanwhile (paused and resumed through the guest's ops).  The guest's
 * regions must stay as they are for the life of a mig_snap (as for a
 * migration): a chain has one layout, and a page the tracker reports in a
 * region the guest did not list fails the snapshot (-ENOENT).
 */
#include <stdbool.h>
#include <stdint.h>

#include "guest.h"
#include "snapfile.h"

struct mig_snap;

struct mig_snap_result {
	uint64_t seq; /* 0: the full snapshot */
	char path[SNAP_PATH_MAX + 32];
	unsigned int passes; /* passes while the guest ran */
	uint64_t pages;	     /* pages handed out and put, every pass and the pause's */
	uint64_t bytes;	     /* bytes written of them */
	uint64_t pause_pages;
	uint64_t data_pages, zero_pages, file_len, tables_bytes; /* what the file holds */
	double write_ms;					 /* writing pages (hashing included), the pause's too */
	double pause_ms;					 /* the vCPUs paused: from pause to resume */
	/* ... of it: taking the vCPUs out of KVM_RUN; the last sync; the last pages; saving the vCPUs' states */
	double pause_stop_ms, pause_sync_ms, pause_write_ms, pause_vcpu_ms;
	double fsync_ms; /* index, header, trailer, fsync, rename, the directory's fsync */
	double total_ms;
	double dirty_pps; /* pages the guest made dirty a second while the snapshot ran (after its first sync) */
	unsigned int throttle_permille; /* the lowest run share the throttle gave the vCPUs (1000: none) */
};

struct mig_snap_opts {
	const char *prefix;	 /* files PREFIX-NNNNNN.snap (6 digits, the snapshot's number) */
	double pause_ms;	 /* what the last pass aims at (0: 5 ms) */
	unsigned int max_passes; /* passes with the guest running at most (0: 8): then the pause takes the rest */
	/*
	 * Without it, from the third pass on, a pass that finds at least half
	 * of what the one before wrote written again halves every vCPU's run
	 * share (down to 50 permille: the guest's set_run_share, where it has
	 * one), so that a guest that writes faster than the disk takes pages
	 * still gets a short pause; lifted before the vCPUs resume from the
	 * pause, whatever happened.
	 */
	bool no_throttle;
	/*
	 * Called with the vCPUs paused, every page and vCPU state taken and
	 * the throttle lifted, before they resume (tests: memory as the file
	 * holds it).
	 */
	void (*paused)(void *ctx, const struct mig_snap_result *res);
	void *paused_ctx;
	/*
	 * Called after each pass with the guest running, before the next
	 * sync: res->passes passes done, res->throttle_permille the lowest
	 * share so far (progress; tests: what the guest wrote meanwhile).
	 */
	void (*pass_done)(void *ctx, const struct mig_snap_result *res);
	void *pass_done_ctx;
};

/*
 * Begin: a consumer of g's tracker with every page pending (the first
 * snapshot is full), which claims every region: logging on where it was
 * off, and on as long as the series lasts, whoever else comes and goes.  Every region of g must
 * be the library's (its region set).  The prefix's directory must exist.  0, or -errno with err saying why.
 */
int mig_snap_new(const struct mig_guest *g, const struct mig_snap_opts *o, struct mig_snap **ret_s, char *err,
		 size_t len);

/*
 * Take the next snapshot: the full one first, then diffs.  0 with res
 * filled, or -errno with err saying why (res->path names the file meant;
 * nothing of it is left, and the next call takes its place).
 */
int mig_snap_take(struct mig_snap *s, struct mig_snap_result *res, char *err, size_t len);

/*
 * Restore: the chain files[0 .. n) (base first) into g, whose memory is
 * all zero (fresh) and whose vCPUs have not run: the chain checked
 * (snap_chain_check()), its regions against g's, every page's newest copy
 * read and verified (snap_chain_load()), each vCPU's state from the newest
 * file loaded.  0 (the guest may run), or -errno with err naming the file
 * and what is wrong (the guest must not run).  ret_pages: pages read.
 */
int mig_snap_restore(const struct mig_guest *g, struct snap_file *const *files, unsigned int n, uint64_t *ret_pages,
		     char *err, size_t len);

/* The chain checked (snap_chain_check()) and its regions and vCPUs against g's: 0, or -errno with err. */
int mig_snap_check_guest(const struct mig_guest *g, struct snap_file *const *files, unsigned int n, char *err,
			 size_t len);

/*
 * The states of last (a chain's newest file) into g: each vCPU's (checked
 * against this host first), the VM's, the devices' live part and the
 * rest, in that order.  0, or -errno with err naming the file and the
 * piece (the guest must not run).
 */
int mig_snap_load_states(const struct mig_guest *g, const struct snap_file *last, char *err, size_t len);

/*
 * The consumer freed, and its claim on the regions with it
 * (kvmdirty_consumer_start()): logging goes off where no other consumer
 * (a migration) and not the VMM's own kvmdirty_tracker_start() still
 * needs it.  NULL is ignored.
 */
void mig_snap_free(struct mig_snap *s);

#endif
