/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_SOURCE_H
#define KVMDIRTY_MIGRATE_SOURCE_H

/*
 * The source: pre-copy (all of memory, then what the tracker reports,
 * until the rest fits the downtime at the bandwidth measured), then
 * stop-and-copy (vCPUs paused, the rest, their state, END), then the
 * destination's answer.  With verify, each page's hash goes with it and
 * the source keeps the hash of each page's latest copy; once the
 * destination has taken over, the source hashes its final memory against
 * those: a page that differs is a write tracking lost.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "guest.h"
#include "session.h"
#include "status.h"

/* Compression of DATA records (stream.h's DATA_Z). */
enum mig_compress {
	MIG_COMPRESS_OFF = 0, /* none: a plain session, or none at all */
	MIG_COMPRESS_AUTO,    /* each connection compresses while that moves pages faster (source-zip.c) */
	MIG_COMPRESS_ZSTD,    /* every DATA record that shrinks */
};

struct mig_send_opts {
	uint64_t downtime_ms;	  /* stop-and-copy once the rest fits this */
	unsigned int max_passes;  /* ... or after this many passes */
	uint64_t timeout_ms;	  /* ... or after this long, from the start of tracking */
	uint64_t peer_timeout_ms; /* each wait for the destination (0: none) */
	bool verify;		  /* page hashes, and the check after switchover */
	bool inline_hash;	  /* hash on the sending thread, not on a thread of its own */
	FILE *stats;		  /* JSON lines (format: doc/migrate-stats.md), or NULL */
	uint64_t baseline_ms;	  /* before tracking starts: each vCPU's speed over this long (0: not measured) */
	bool progress;		  /* a status line on stderr */
	/*
	 * Slow the vCPUs that dirty, as much as the link needs, once the guest
	 * re-dirties more than a third of it (throttle.h): per-vCPU dirty
	 * limits in DIRTY_RING mode, run shares in the bitmap modes.
	 */
	bool throttle;
	/*
	 * When pre-copy ends without converging (pass or time limit): stop
	 * the guest and send the rest anyway, however long that takes.
	 * Otherwise (the default) the migration is abandoned: the guest runs
	 * on here, untouched, and mig_send() returns -ETIME.
	 */
	bool force_switchover;
	/*
	 * At most this many MiB/s on the wire, all connections together (0:
	 * as fast as the link goes), stop-and-copy included: the downtime
	 * estimate and the throttle take the capped rate for the link's, so
	 * the rest the pause sends fits the downtime at the cap.
	 */
	uint64_t max_bandwidth;
	/*
	 * Events (status.h: one JSON line each, the names in
	 * kvmdirty-migrate-control(7)) as they happen: to event(), called on
	 * the engine's threads (it must not block: the migration waits for
	 * it), and, with event_to_fd, written to event_fd without blocking
	 * (a pipe or a socket, made O_NONBLOCK and left so; lines it cannot
	 * take are counted and told in one events_lost line, at the latest
	 * when the migration ends, which waits at most 100 ms for room).
	 * Also kept in the status for its subscribers.
	 */
	void (*event)(void *ctx, const char *line);
	void *event_ctx;
	bool event_to_fd;
	int event_fd;
	/*
	 * A key (session.h): source and destination prove to each other that
	 * they hold it, and every record is sealed; with encrypt, encrypted
	 * too.  NULL: a plain stream.
	 */
	const struct mig_psk *psk;
	bool encrypt;
	/*
	 * The destination meant (session.h): a destination of another name
	 * refuses.  NULL: the address connected to ("IP:PORT", "[IPv6]:PORT",
	 * "unix:PATH").
	 */
	const char *peer_name;
	/* Wipe *psk (cast) once the session's keys exist: nothing needs it after. */
	bool wipe_psk;
	/*
	 * Connections, 1 (0 counts as 1) .. MIG_MAX_CONNS: pages spread over
	 * them by chunk (stream.h), each sent by a thread of its own; connect
	 * opens each one after the first (an fd, or -errno with a reason in
	 * err).
	 */
	unsigned int connections;
	int (*connect)(void *ctx, char *err, size_t len);
	void *connect_ctx;
	/*
	 * Where the migration's state and the handoff's outcome are kept,
	 * queried and resolved (status.h; the caller inits it).  With one, an
	 * unknown outcome (COMMIT sent, no ACK) is waited out in mig_send()
	 * until a late ACK or a resolve decides it; without (NULL), mig_send()
	 * returns -EINPROGRESS at once, the guest paused, its fate the caller's.
	 */
	struct mig_status *status;
	/* once, when the outcome becomes unknown: one line saying why (or NULL) */
	void (*unknown)(void *ctx, const char *line);
	void *unknown_ctx;
	/*
	 * Post-copy (stream.h; needs verify): the session gets a fault channel
	 * besides its connections, and pre-copy switches to post-copy instead
	 * of throttling (the throttle stays off) when it will not converge:
	 * a pass after the second that leaves more than half of what the one
	 * before left, the pass or time limit, or postcopy_after passes (0:
	 * no such limit), or when the status asks (mig_status_postcopy_start()).
	 * A pre-copy that converges ends as ever.  At the switch the vCPUs
	 * pause, the pages still dirty go as LEFT, then the state, END and the
	 * handoff; after the ACK the guest runs at the destination while the
	 * source answers its faults first and sends the rest (source-postcopy.c)
	 * until ALL_IN.
	 */
	bool postcopy;
	unsigned int postcopy_after;
	/*
	 * Post-copy paused (a connection lost): dial again (connect, for
	 * every connection of a new session with the same key) once a second
	 * for this long (0: until it works); past it, only when the status
	 * asks (mig_status_recover()).  The guest's memory is kept meanwhile:
	 * mig_send() does not return before every page is in (or the
	 * destination failed).
	 */
	uint64_t recover_ms;
	/*
	 * Compression (MIG_COMPRESS_*): anything but OFF makes a session
	 * that agrees to it (session.h's MIG_S_ZSTD; a destination older
	 * than it refuses by the hello's flags) and compresses DATA records
	 * with zstd on the connections' own threads.
	 */
	enum mig_compress compress;
};

struct mig_result {
	double total_ms;	  /* start of tracking to the destination's ACK */
	double downtime_ms;	  /* vCPUs paused to the destination's ACK */
	double verify_ms;	  /* the check after switchover */
	uint64_t bytes, passes, pages, zero_pages;
	uint64_t untouched_pages; /* of zero_pages: never faulted in, sent without being read */
	uint64_t downtime_pages;  /* pages sent while paused */
	uint64_t downtime_hashed; /* pages hashed while paused */
	uint64_t verified_pages;  /* pages the check after switchover compared */
	uint64_t lost_pages;	  /* ... and found changed since they were sent */
	bool converged;
	double est_downtime_ms;	  /* the last pass's estimate of the rest's transfer */
	double link_bytes_per_s;  /* ... at the rate that pass measured */
	uint64_t remaining_pages; /* ... of the rest, pending after it */
	uint64_t dirty_pages_per_s; /* the dirty rate the tracker saw then */
	/* why pre-copy ended: "fits_downtime", "pass_limit", "time_limit", "cancelled", or "failed" */
	const char *reason;
	/*
	 * vCPU i's progress per second before tracking (baseline_ms; 0: not
	 * measured) and during pre-copy (to the pause, or to giving up)
	 */
	double vcpu_before[MIG_MAX_VCPUS], vcpu_during[MIG_MAX_VCPUS];
	bool throttled; /* the throttle engaged */
	bool cancelled; /* a cancel (mig_status_cancel()) ended it: the guest runs here */
	/* where the guest runs: HERE (resumed), THERE (moved), UNKNOWN (paused; without a status only) */
	enum mig_outcome outcome;
	bool resolved;	  /* ... as a resolve decided */
	double ready_ms;  /* END sent to READY's arrival: the destination's checks and loads */
	double handoff_ms; /* READY's arrival to the ACK's: what the commit adds to the downtime */
	/* how long each vCPU was held by its dirty limit or kept out by its run share */
	double vcpu_held_ms[MIG_MAX_VCPUS];
	/* post-copy: it ran; why it began ("rule", "pass_limit", "time_limit", "postcopy_after", "asked") */
	bool postcopy;
	const char *postcopy_why;
	uint64_t postcopy_pages;    /* pages left at the switch */
	uint64_t postcopy_requests; /* REQ records answered */
	uint64_t postcopy_answered; /* ... pages sent for them */
	uint64_t postcopy_bulk;	    /* pages sent on the lanes */
	double switch_pause_ms;	    /* vCPUs paused at the switch to the ACK: the guest's pause */
	double postcopy_ms;	    /* the ACK to ALL_IN */
	/* the destination's figures (ALL_IN): faults that asked for a page, their waits' median and 99th percentile */
	uint64_t postcopy_faults;
	double fault_p50_us, fault_p99_us;
	uint64_t postcopy_recoveries; /* sessions made again after a lost connection */	/* compression: pages that went compressed, their bytes before and after, the time spent on it */
	uint64_t zpages, zraw_bytes, zwire_bytes;
	double zcpu_s;
	/* CPU seconds of the threads that sent the stream: the caller's since mig_send() began, each lane's worker */
	double cpu_s;
};

/*
 * Migrate g (its vCPUs running, g->tracker covering its regions) over fd,
 * the session first (session.h: -EACCES when authentication failed on
 * either side, with "authentication" in err; the guest is then untouched).
 * After END, the handoff (handoff.h): READY, COMMIT, ACK.
 * Returns -errno when the guest stays here (res->outcome HERE; -ETIME:
 * pre-copy did not converge and force_switchover is off; -ECANCELED: a
 * cancel came before COMMIT was sent (res->cancelled); a failure or a
 * refusal before READY, or the destination's ACK saying it dropped its
 * copy; a resolve "here"): the vCPUs run on here (resumed where they were
 * paused), its consumer aborted and freed (other consumers of the tracker
 * keep theirs), tracking stopped where mig_send() started it, and the
 * guest can be migrated again: a later migration sends all of it afresh.
 * The pages go through a consumer of the tracker of the migration's own
 * (kvmdirty_consumer_new()); the parameters of struct mig_params
 * (status.h) can be changed while it runs, through the status.
 * Otherwise the destination has the guest (THERE: its ACK, or a resolve
 * "nowhere") and the vCPUs here stay paused; returns 0, or with verify the
 * number of pages (capped at INT_MAX) whose final contents differ from
 * what was sent, named in err (one line), in the stats and in
 * res->lost_pages.  Without a status, -EINPROGRESS for an unknown outcome:
 * the vCPUs stay paused and tracking stopped.
 */
int mig_send(const struct mig_guest *g, int fd, const struct mig_send_opts *o, struct mig_result *res, char *err,
	     size_t len);

#endif
