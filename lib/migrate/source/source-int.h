/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_SOURCE_INT_H
#define KVMDIRTY_MIGRATE_SOURCE_INT_H

/*
 * The source's insides, shared by its files and by nothing else.  Pages
 * go out in runs straight from guest memory (one iovec per run), zero
 * pages as a record without payload, in batches of about 512 KiB.  With
 * verify each DATA run carries its pages' hashes, taken just before the
 * send by a thread of its own that hashes one batch while the main thread
 * sends the one before (in stop-and-copy the paused vCPUs leave their CPUs
 * to it), and kept (sent_hash, a slot per page, and sent_data, which
 * pages' latest copy was data rather than zero).  The destination checks
 * them as pages land; after its answer, with the guest running over
 * there, the source checks its final memory against sent_hash, off the
 * downtime path.
 *
 * Memory the guest never touched (in private anonymous mappings, per the
 * host's page tables: hostmem.h) goes out as ZERO records without being
 * read, so it stays unpopulated here; the check after switchover leaves it
 * unread too.  Stats are JSON lines, format version 1 (doc/migrate-stats.md).
 *
 * The files, by job, each calling only the ones below it (a line, no
 * circle: tests/check-engine-layers.py):
 *   source.c          mig_send(): setup, session, header, pre-copy,
 *                     stop-and-copy, teardown, one step each;
 *   source-stop.c     stop-and-copy, and the handoff after END;
 *   source-precopy.c  passes, drain, settle, tick (samples within a pass),
 *                     the throttle's plumbing, convergence;
 *   source-send.c     lanes, batches, their worker threads, runs and
 *                     ranges onto the wire, zero and untouched pages: the
 *                     data path, which never calls up (a full batch marks
 *                     the tick due; src_drain() runs it between ranges);
 *   source-verify.c   page hashes kept per page, the check after
 *                     switchover;
 *   source-stats.c    the --stats lines, each vCPU's speed before and
 *                     during, a cancel noted, why pre-copy did not converge.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>
#include <sys/uio.h>

#include "clock.h"
#include "hostmem.h"
#include "session.h"
#include "source.h"
#include "throttle.h"
#include "worker.h"

#define PAGE ((uint64_t)MIG_PAGE_SIZE)
#define BATCH_RECORDS 256
#define BATCH_BYTES (512u << 10) /* a batch, hashed while the one before is sent */
#define BATCH_HASHES (BATCH_BYTES / MIG_PAGE_SIZE + MIG_RUN_PAGES)
#define DOWNTIME_SHARE 0.9 /* of the downtime limit, what the rest may take at the link's rate */
#define SAMPLE_MS 100.0 /* stats samples within a pass */

/* Pages of a batch to hash: into out (the batch's hashes) and sent_hash. */
struct hash_run {
	const uint8_t *hva;
	uint32_t region;
	bool zero; /* sent as ZERO: no hashes in the stream, the zero page's hash is what to expect */
	uint64_t first, count;
	uint64_t *out;
};

struct batch {
	struct mig_record hdr[BATCH_RECORDS];
	int piov[BATCH_RECORDS]; /* the iov of each record's payload (-1: none) */
	struct iovec iov[3 * BATCH_RECORDS];
	struct hash_run runs[BATCH_RECORDS];
	uint64_t hashes[BATCH_HASHES];
	int nh, ni, nruns, nhashes;
	uint64_t bytes;
	/* compressed payloads (source-zip.c): room for a batch's worth, zused of it taken */
	uint8_t *zbuf;
	size_t zcap, zused;
};

/*
 * A lane's compression (source-zip.c): its zstd context and, for
 * MIG_COMPRESS_AUTO, what it measured: the ratio (wire bytes / raw) and
 * speed (raw bytes a second) of what it compressed, its connection's
 * speed (wire bytes a second, pacing included), each from decayed sums;
 * the raw bytes a second its batches went at, compressed and not, over
 * the last window of each (auto_on()); whether it compresses now.
 */
struct lane_zip {
	void *cctx;
	double ratio, zbps, wbps; /* the figures, read atomically across threads */
	double zraw_acc, zwire_acc, zraw_acc2, zns_acc; /* the compressing thread's */
	double wbytes_acc, wns_acc;			/* the sender's */
	double rate_on, rate_off;
	uint64_t win_at, last_at, win_raw, windows;
	bool on, trying; /* compressing now; ... in a short window that tries it */
	uint64_t batches;
	/* totals: pages compressed, their raw and wire bytes, the time it took */
	uint64_t pages, raw, wire;
	uint64_t ns;
};

/* One connection of the migration: its stream's encoder, its batches, its worker. */
struct lane {
	struct source *s;
	struct mig_chan *ch;
	struct mig_encoder enc;
	/* a batch is filled, handed to the worker, and sent while the next one is filled */
	struct batch batch[2];
	struct batch *cur, *pending;
	struct mig_worker w;
	struct batch *todo; /* handed to the worker, not yet done */
	int err;	    /* the worker failed to send: -errno */
	uint64_t hashed;    /* the worker's (or the main thread's without one) */
	struct lane_zip z;  /* the worker's (or the main thread's without one) */
};

struct source {
	const struct mig_guest *g;
	const struct mig_send_opts *o;
	struct mig_status *st; /* o->status, or own */
	struct mig_status own;
	struct mig_session sess;
	struct lane *lane;
	unsigned int nlanes;
	bool lanes_send; /* several connections: each lane's worker sends, the main thread only fills */
	/* [nr_regions], or NULL without verify */
	uint64_t **sent_hash; /* verify: each page's latest data copy; the hasher's */
	uint64_t **sent_data; /* ... whose latest copy was data (else zero); the hasher's */
	uint64_t zero_hash;
	struct mig_vcpu_state *vs;
	struct mig_vm_state vm;
	void *dev; /* the devices' state (guest ops' devices_save()), dev_len bytes: the stream's until freed */
	size_t dev_len;
	void *dev_live; /* ... and the part given before the pause (devices_save_live()), dev_live_len bytes */
	size_t dev_live_len;
	uint64_t pages, zero_pages, untouched_pages;
	uint64_t in_hand; /* pages handed out by the tracker, not yet queued */
	/* which pages were never touched: the regions wholly in private anonymous memory, and pagemap */
	bool *anon; /* [nr_regions]; NULL: none known to be (out of memory) */
	/* a handed-out range's region by its slot id: [slot] = index in g->regions, UINT32_MAX none; NULL: walk */
	uint32_t *slot_idx;
	uint32_t nr_slot_idx;
	int pagemap;
	uint64_t pme[MIG_PM_BATCH]; /* mig_walk_touched()'s scratch */
	/* stats: start, last sample, and each vCPU's progress then */
	double t0, sample_ms;
	uint64_t sample_bytes;
	unsigned int pass; /* the pass under way; 0 in stop-and-copy */
	uint64_t *progress0, *progress_at; /* at the start; at the last sample */
	double before_ms;
	/*
	 * Every SAMPLE_MS (src_tick()): the link while busy, each vCPU's
	 * dirtying (ring entries in DIRTY_RING mode, KVM's fault count in the
	 * others), and, throttling, the pages re-dirtied since the last tick
	 * (a sync) and what the throttle makes of them.
	 */
	double tick_ms;
	bool tick_due; /* a batch went out since the last tick: src_drain() runs one between ranges */
	uint64_t tick_acked, tick_unacked;
	double link; /* bytes/s, measured while the socket never ran dry */
	unsigned int nv; /* vCPUs measured: those the guest gave, at most MIG_THROTTLE_MAX_VCPUS */
	bool ring;
	uint64_t vcpu_count[MIG_THROTTLE_MAX_VCPUS], vcpu_held_ns[MIG_THROTTLE_MAX_VCPUS];
	double vcpu_rate[MIG_THROTTLE_MAX_VCPUS];
	bool vcpu_held[MIG_THROTTLE_MAX_VCPUS];
	double redirty; /* pages/s the guest made dirty again, at the last tick that synced */
	struct mig_throttle th;
	bool throttling;
	int sync_err; /* a tick's sync failed: -errno */
	uint64_t applied_limit[MIG_THROTTLE_MAX_VCPUS];
	unsigned int applied_share[MIG_THROTTLE_MAX_VCPUS];
	/* the migration's own consumer of the tracker, which claims every region while it lives */
	struct kvmdirty_consumer *cons;
	/* the parameters as last taken from the status (each sample), and what they make */
	struct mig_params par;
	uint64_t cap_bps;  /* bytes/s on the wire (0: none); read by the lanes' workers, atomically */
	uint64_t cpu0_ns; /* the calling thread's CPU time when mig_send() began */
	bool z_offer;	  /* the session offers compression (the status's compress_able as the migration began) */
	/* compression (enum mig_compress) while the session agreed to it; read by the lanes' workers, atomically */
	int zmode;
	bool can_throttle; /* the guest's vCPUs can be slowed */
	bool throttled_ever;
	bool cancelled; /* a cancel was acted on: everything unwinds, the guest stays here */
	bool cancel_told; /* ... and err says so */
	bool begun;	  /* the status was begun (mig_status_begin()): it is ended */
	bool end_sent;	  /* END's flush began: a cancel is answered at READY */
	/* the cap: the last batch let go, when and how big (under pace_lock: several lanes send) */
	pthread_mutex_t pace_lock;
	double pace_at;
	uint64_t pace_bytes;
	/* post-copy (source-postcopy.c): the session has a fault channel; the switch is due; LEFT sent */
	bool postcopy;
	bool go_postcopy;
	uint64_t prev_remaining; /* the rest after the pass before, for post-copy's rule */
	double pc_sync_ms;	 /* post-copy's rule within a pass: its last sync */
	bool postcopy_rule;	 /* ... which found the guest outrunning the link */
	bool left_mode; /* stop-and-copy of a post-copy: pages still dirty go as LEFT */
	uint64_t **left; /* [nr_regions]: pages the destination lacks, cleared as they go (under the post-copy lock) */
	uint64_t left_pages;
	struct spc *pc; /* the post-copy phase's state */
	/* how far mig_send() got, for its teardown */
	bool started;	/* tracking is on */
	bool paused;	/* the vCPUs were paused for stop-and-copy */
	bool abandoned; /* pre-copy did not converge: the guest stays here */
};

static inline double now_rel(const struct source *s)
{
	return mig_clock_msf() - s->t0;
}

/* source-send.c */
int src_lanes_new(struct source *s, char *err, size_t len);
int src_workers_start(struct source *s, char *err, size_t len);
void src_lanes_free(struct source *s);
int src_put(struct lane *l, struct mig_record rec, const void *payload, size_t plen, const struct hash_run *run);
uint64_t src_batch_bytes(const struct source *s);
int src_flush(struct source *s);
int src_send_range(struct source *s, const struct kvmdirty_range *rg);
void src_untouched_open(struct source *s);
void src_untouched_close(struct source *s);
int src_net_fail(struct source *s, int ret, const char *what, char *err, size_t len);
/* The session's options (a post-copy's recovery makes the session again with them). */
void src_session_opts(const struct source *s, struct mig_session_opts *so);
int src_pace(struct source *s, uint64_t bytes);

/* source-zip.c */
/* The batch's DATA records compressed where that pays (the lane's mode and measures); after hashing. */
void src_zip_batch(struct lane *l, struct batch *b);
/* A batch of bytes sent in ns, pacing included: the lane's connection's speed. */
void src_zip_sent(struct lane *l, uint64_t bytes, uint64_t ns);
void src_zip_free(struct lane *l);
/* The totals of every lane into res, and the CPU time of the threads that sent (res->cpu_s). */
void src_zip_result(const struct source *s, struct mig_result *res);
/* Each lane's measures as the stats' end line gives them: ,"zlanes":[{...},...] */
void src_zip_lanes_json(const struct source *s, FILE *f);

/* source-precopy.c */
void src_throttle_init(struct source *s);
void src_throttle_off(struct source *s);
int src_tick(struct source *s);
int src_drain(struct source *s, uint64_t max_pages);
int src_precopy(struct source *s, struct mig_result *res, char *err, size_t len);
void src_take_params(struct source *s);
double src_link(const struct source *s);
/* Pages' bytes per wire byte so far (compression), and the link in pages' bytes a second. */
double src_expansion(const struct source *s);
double src_link_raw(const struct source *s);

/* source-stop.c */
int src_stop_and_copy(struct source *s, struct mig_result *res, char *err, size_t len);

/* source-postcopy.c */
int src_left_alloc(struct source *s, char *err, size_t len);
void src_left_free(struct source *s);
/* After the ACK: faults answered and the rest sent until ALL_IN.  0, or -errno with err. */
int src_postcopy(struct source *s, struct mig_result *res, char *err, size_t len);

/* source-verify.c */
int src_alloc_hashes(struct source *s);
void src_free_hashes(struct source *s);
void src_hash_batch(struct lane *l, struct batch *b);
uint64_t src_hashed(const struct source *s);
int src_check_sent(struct source *s, struct mig_result *res, char *err, size_t len);

/* source-stats.c */
int src_baseline(struct source *s, struct mig_result *res);
void src_during(struct source *s, struct mig_result *res);
double src_held_ms(const struct source *s, unsigned int i);
void src_line_start(const struct source *s, const char *type);
void src_start_line(struct source *s, const struct mig_result *res);
void src_sample_line(struct source *s, double dt_ms);
void src_pass_line(struct source *s, uint64_t pages, uint64_t zero, uint64_t untouched, uint64_t bytes, double ms,
		   uint64_t remaining, double mib_s, double est_ms);
void src_end_line(struct source *s, const struct mig_result *res, int ret, const char *err);
void src_unknown(void *ctx, const char *line);
void src_not_converged(const struct source *s, const struct mig_result *res, char *buf, size_t len);
int src_cancel_check(struct source *s);
int src_cancelled(struct source *s, char *err, size_t len);
/* The guest, paused, is about to run here again: the stats' resume line (flushed) and the event resumed. */
void src_resumed(struct source *s);

#endif
