/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_H
#define KVMDIRTY_MIGRATE_H

/*
 * libkvmdirty-migrate: live migration and snapshots of a KVM guest whose
 * memory and vCPUs a VMM keeps through libkvmdirty (kvmdirty.h).
 *
 * Version 0.x: the calls and structures below may still change between
 * minor releases (rebuild against the new header).  What one host sends
 * another is guarded by the stream's own version
 * (kvmdirty-migrate-stream(5)): two hosts whose streams differ refuse each
 * other by name, whatever their libraries' versions.
 *
 * A VMM describes its guest once (kvmdirty_mig_guest_new()): its VM and
 * the regions it has then, its vCPUs, its tracker (source side), and the
 * calls the engine makes into it: pause and resume the vCPUs, and
 * optionally its devices' state, the throttle's run share and each
 * vCPU's progress.  The engine saves and loads the whole KVM x86 state
 * itself, through the VM's and vCPUs' file descriptors: every vCPU's
 * registers, special registers, XSAVE and XCR0, LAPIC, pending events,
 * debug registers, MP state and the MSRs the host saves
 * (KVM_GET_MSR_INDEX_LIST), and the VM's in-kernel irqchip (PIC, IOAPIC),
 * PIT and clock, loaded in the order KVM requires.
 *
 * Then, on that guest:
 *   - kvmdirty_mig_send(): pre-copy, stop-and-copy and the handoff to a
 *     destination that runs kvmdirty_mig_recv();
 *   - kvmdirty_mig_snap_new() and kvmdirty_mig_snap_take(): a full
 *     snapshot, then diffs, with the guest running but for a short pause;
 *     kvmdirty_mig_restore() loads a chain into a fresh guest.
 *
 * Errors: every call that can fail returns 0 (or a count) or a negative
 * errno, and where it takes err/len it writes one line there saying what
 * failed and why (never more than len bytes, always terminated; err may be
 * NULL with len 0).  Link with pkg-config --cflags --libs
 * libkvmdirty-migrate.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <kvmdirty.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVMDIRTY_MIG_MAX_VCPUS 1024		    /* vCPUs of a guest, at most */
#define KVMDIRTY_MIG_DEVICES_MAX (256ul * 1048576) /* device state a stream or snapshot carries, all parts, at most */
#define KVMDIRTY_MIG_MAX_CONNS 16		    /* connections of a migration, at most */
#define KVMDIRTY_MIG_MAX_MIBPS 1048576		    /* a bandwidth cap, at most (MiB/s) */
#define KVMDIRTY_MIG_MAX_REGIONS 65535u	    /* regions of a guest, at most */
#define KVMDIRTY_MIG_CONTROL_PATH_MAX 107	    /* a control socket's path, at most (bytes) */
#define KVMDIRTY_MIG_NAME_MAX 63		    /* a name (peer_name, name), at most (bytes) */

/* A guest as the engine knows it (kvmdirty_mig_guest_new()). */
struct kvmdirty_mig_guest;
/* A series of snapshots of one guest (kvmdirty_mig_snap_new()). */
struct kvmdirty_mig_snap;
struct kvmdirty_mig_control;

/*
 * The calls into the VMM.  ctx is kvmdirty_mig_guest_new()'s.  The engine
 * calls them from the thread that called it, or from its own threads
 * where said; none of them may call back into this library for the same
 * guest.
 */
struct kvmdirty_mig_ops {
	/*
	 * Source (send and snapshots): pause takes every vCPU out of
	 * KVM_RUN and keeps it out until resume, whatever the guest does;
	 * resume lets them go on where they were.  Required on a source.
	 */
	void (*pause)(void *ctx);
	void (*resume)(void *ctx);
	/*
	 * Optional (NULL: no devices; a stream or snapshot then carries
	 * none): the devices' state as one byte string, opaque to the
	 * engine, of any size up to KVMDIRTY_MIG_DEVICES_MAX.  devices_save
	 * runs with the vCPUs paused, after the VM's state is saved;
	 * *ret_state is malloc()ed and the engine frees it (NULL with
	 * *ret_len 0: nothing).  devices_load runs on the destination (or a
	 * restore) after the vCPUs' and VM's states are loaded, before any
	 * vCPU runs; state is the engine's, valid for the call.  0 or
	 * -errno: a save that fails fails the migration or snapshot (the
	 * guest runs on); a load that fails refuses the stream (the guest
	 * runs on at the source) or the restore.  A stream or snapshot with
	 * device state is refused by a guest without devices_load.
	 */
	int (*devices_save)(void *ctx, void **ret_state, size_t *ret_len);
	int (*devices_load)(void *ctx, const void *state, size_t len);
	/*
	 * Optional, together, beside devices_save/_load (NULL: all of the
	 * devices' state is saved in the pause): the part of it the VMM can
	 * give while the guest still runs, such as a device's bulk that
	 * changes seldom (a frame buffer, a table), so that it does not fall
	 * into the downtime.  devices_save_live runs once on the source, in
	 * the first pre-copy pass after its pages, from the thread in
	 * kvmdirty_mig_send(), with the vCPUs running; devices_save then gives
	 * what is left or changed since, at the pause.  The destination keeps
	 * the live part until the stream is complete, then calls
	 * devices_load_live before devices_load.  Same limits, ownership and
	 * refusals as devices_save/_load; both parts together at most
	 * KVMDIRTY_MIG_DEVICES_MAX.  devices_load_live is called for every
	 * stream and restore, with 0 bytes where none was given: drop what an
	 * earlier one left.  A snapshot has no "before the pause": it saves
	 * both parts at its pause, and a restore loads both.
	 */
	int (*devices_save_live)(void *ctx, void **ret_state, size_t *ret_len);
	int (*devices_load_live)(void *ctx, const void *state, size_t len);
	/*
	 * Source, optional (NULL: unknown): how far vCPU i's workload has
	 * got, in units of the guest's own that only grow; from any thread.
	 * Reported per vCPU in the events and statistics.
	 */
	uint64_t (*progress)(void *ctx, unsigned int vcpu);
	/*
	 * Source, optional (NULL: the bitmap modes are not throttled): keep
	 * vCPU i in KVM_RUN for only permille/1000 of each short period
	 * (1000: always), from the engine's threads; 0 or -errno.
	 * kept_out_ns: how long vCPU i was kept out so far.  In DIRTY_RING
	 * mode the engine sets per-vCPU dirty limits instead
	 * (kvmdirty_vcpu_set_dirty_limit(): run the vCPUs through
	 * kvmdirty_vcpu_run()).
	 */
	int (*set_run_share)(void *ctx, unsigned int vcpu, unsigned int permille);
	uint64_t (*kept_out_ns)(void *ctx, unsigned int vcpu);
};

/* kvmdirty_mig_guest_new() flags */
/*
 * The guest's memory is all zero (fresh anonymous memory, as a VMM has it
 * before a stream or a restore): pages a stream never writes are left
 * alone, neither faulted in nor cleared.
 */
#define KVMDIRTY_MIG_FRESH (1u << 0)

/*
 * Describe a guest: vm with the regions it has now (in the library's
 * order: both ends must add the same regions, of the same sizes, at the
 * same addresses), vcpus[0 .. nr_vcpus) (1 .. KVMDIRTY_MIG_MAX_VCPUS, in
 * the same order at both ends), tracker (a source's, tracking vm's
 * regions; NULL for a destination or a restore), ops (copied; NULL only
 * where the guest is never a source) and ctx for them.  The guest keeps
 * pointers to vm, tracker and the vCPUs (not to the vcpus array): they
 * must outlive it.  A VMM that adds, removes or moves a region frees the
 * guest and describes it again, between migrations and snapshot series.
 * 0, or -EINVAL (no vm, no vCPU or too many, flags unknown), -E2BIG (too
 * many regions), -ENOMEM.  Any thread.
 */
int kvmdirty_mig_guest_new(struct kvmdirty_vm *vm, struct kvmdirty_tracker *tracker,
			   struct kvmdirty_vcpu *const *vcpus, unsigned int nr_vcpus, uint32_t flags,
			   const struct kvmdirty_mig_ops *ops, void *ctx, struct kvmdirty_mig_guest **ret_guest);

/* Free the description (nothing of the VM, its vCPUs or tracker).  NULL is ignored. */
void kvmdirty_mig_guest_free(struct kvmdirty_mig_guest *guest);

/* Where a guest runs after a migration, as each end sees it. */
enum kvmdirty_mig_outcome {
	KVMDIRTY_MIG_HERE = 0, /* this end runs it (source: resumed; destination: run it) */
	KVMDIRTY_MIG_THERE,    /* the other end has it (source: keep the vCPUs paused; destination: dropped) */
	/*
	 * Neither knows: the last message of the handoff was lost (the
	 * source sent COMMIT and no ACK came).  The guest is paused here; run
	 * it on neither end until the other end's result is known
	 * (kvmdirty-migrate(1), "Who runs the guest").
	 */
	KVMDIRTY_MIG_UNKNOWN,
	/* kvmdirty_mig_control_outcome() only: a migration under way, or none begun */
	KVMDIRTY_MIG_PENDING,
};

/*
 * ---- a migration's control ----
 * What one side of a migration is doing, where its guest runs, and the
 * way to steer it while it runs or decide an outcome the engine cannot
 * know: a status object handed to kvmdirty_mig_send() or
 * kvmdirty_mig_recv() (their opts' control), with, if asked, a control
 * socket over it that speaks kvmdirty-migrate-control(7) (query, resolve;
 * the source's set, cancel and subscribe), as the kvmdirty-migrate daemon's
 * --control does.
 *
 * With a control, an unknown outcome (the source sent COMMIT and heard no
 * ACK; the destination sent READY and heard neither COMMIT nor ABORT) is
 * waited out inside kvmdirty_mig_send()/_recv(), the vCPUs paused, until a
 * late message from the peer or a resolve decides it: from another thread
 * (kvmdirty_mig_control_resolve()) or through the socket.  Without one,
 * those calls return -EINPROGRESS at once and the guest's fate is the
 * caller's to learn.
 */
struct kvmdirty_mig_control_opts {
	/*
	 * A Unix socket to listen at (at most 107 bytes; an existing socket
	 * file there that nobody listens on is replaced, anything else
	 * refused), mode 0600; NULL: no socket, the calls below only.
	 */
	const char *path;
	bool destination; /* a destination's (kvmdirty_mig_recv()); else a source's (kvmdirty_mig_send()) */
	/*
	 * A line for each resolve or cancel that came through the socket,
	 * and when an outcome becomes unknown; from the engine's or the
	 * socket's thread; it must not block.  NULL: none.
	 */
	void (*log)(void *ctx, const char *line);
	void *log_ctx;
	/*
	 * When an outcome becomes unknown and no socket is open: open one at
	 * the default path ($XDG_RUNTIME_DIR/kvmdirty-migrate-PID.sock, else
	 * /tmp/kvmdirty-migrate-PID.sock, else a directory of its own) and say
	 * where in a line, so that someone can resolve it.
	 */
	bool socket_on_unknown;
	/*
	 * A source's: the opts its kvmdirty_mig_send() will take, whose
	 * parameters a query shows until the migration begins (NULL: the
	 * defaults).  Read here only.
	 */
	const struct kvmdirty_mig_send_opts *send_opts;
};

/*
 * A control (opts required): 0, or -EINVAL (opts NULL, a path too long or
 * empty), -EADDRINUSE (a server listens at path already), -EEXIST (path
 * exists and is not a socket) or the socket's -errno, with err naming the
 * path.  One control serves one migration at
 * a time, and may serve the next after it (a destination's: every stream
 * kvmdirty_mig_recv() takes).  Its calls are safe from any thread.
 */
int kvmdirty_mig_control_new(const struct kvmdirty_mig_control_opts *opts, struct kvmdirty_mig_control **ret_ctl,
			     char *err, size_t len);
/*
 * Where the guest runs as this side sees it now: PENDING while a
 * migration is under way (or none began), then HERE, THERE or UNKNOWN (a
 * destination whose kvmdirty_mig_recv() returned without taking a stream:
 * THERE).
 * ctl must not be NULL (the calls below refuse a NULL one with -EINVAL).
 */
enum kvmdirty_mig_outcome kvmdirty_mig_control_outcome(struct kvmdirty_mig_control *ctl);
/*
 * The control socket's query answer (one JSON object, no newline:
 * kvmdirty-migrate-control(7)) into buf: its length, or -ENOSPC when len
 * is short (or buf NULL).
 */
int kvmdirty_mig_control_query(struct kvmdirty_mig_control *ctl, char *buf, size_t len);
/*
 * Decide an unknown outcome: run_here true runs the guest on this side
 * (kvmdirty_mig_send() returns as for HERE, kvmdirty_mig_recv() returns
 * 0), false drops it here.  Only the one who knows the other side's fate
 * may call it: a guest must never run on both sides.  0, or -EINVAL with a
 * line in err when the outcome is not unknown (nothing to decide).
 */
int kvmdirty_mig_control_resolve(struct kvmdirty_mig_control *ctl, bool run_here, char *err, size_t len);
/* A source's parameters, as the control socket's set names them. */
struct kvmdirty_mig_params {
	uint64_t downtime_ms; /* 0 .. 3,600,000 */
	uint64_t max_passes;  /* 1 .. 100,000 */
	uint64_t timeout_ms;  /* 1 .. 86,400,000, from the start of tracking */
	uint64_t max_mibps;   /* 0 .. KVMDIRTY_MIG_MAX_MIBPS (0: no cap) */
	bool throttle;
	/*
	 * enum kvmdirty_mig_compress: a migration under way changes it only
	 * where it began with compression (else -EOPNOTSUPP)
	 */
	int compress;
};

/* Which members of a struct kvmdirty_mig_params a set gives */
#define KVMDIRTY_MIG_SET_DOWNTIME (1u << 0)
#define KVMDIRTY_MIG_SET_MAX_PASSES (1u << 1)
#define KVMDIRTY_MIG_SET_TIMEOUT (1u << 2)
#define KVMDIRTY_MIG_SET_MAX_MIBPS (1u << 3)
#define KVMDIRTY_MIG_SET_THROTTLE (1u << 4)
#define KVMDIRTY_MIG_SET_COMPRESS (1u << 5)

/*
 * Set the members of p that mask names on a source's control, as the
 * socket's set does: each checked first, nothing changed unless all are
 * in range.  While a migration runs it takes them at its next sample
 * (within 100 ms); before one begins, it begins with them (and with its
 * opts' for the rest: a zero downtime_ms here is 0 ms, not the default).
 * 0, -EINVAL (mask 0 or unknown bits), -ERANGE (a member out of range,
 * named in err), -EOPNOTSUPP (a destination's control).
 */
int kvmdirty_mig_control_set(struct kvmdirty_mig_control *ctl, const struct kvmdirty_mig_params *p, unsigned int mask,
			     char *err, size_t len);

/*
 * Cancel a source's migration: 0, and kvmdirty_mig_send() ends it at its
 * next sample (within 100 ms) and returns -ECANCELED, the guest running
 * on here; one not yet begun (or still connecting: the connect is not cut
 * short, it ends within peer_timeout_ms) is cancelled as it begins, and a
 * call whose connect fails ends as that cancel; the next call on the
 * control is not touched by it.  -EALREADY once
 * COMMIT is being sent, -ENOENT when no migration is under way or due,
 * -EOPNOTSUPP on a destination's control; err: one line.
 */
int kvmdirty_mig_control_cancel(struct kvmdirty_mig_control *ctl, char *err, size_t len);
/*
 * Switch the source's migration to post-copy (one begun with
 * kvmdirty_mig_send_opts.postcopy) at its next sample, whatever its
 * policy says: the pass under way ends, the guest pauses and resumes at
 * the destination with the pages still dirty missing.  0; -EOPNOTSUPP
 * (a destination's control, or a migration without post-copy), -ENOENT
 * (no migration under way), -EALREADY (past pre-copy); err: one line.
 * Any thread.
 */
int kvmdirty_mig_control_postcopy_start(struct kvmdirty_mig_control *ctl, char *err, size_t len);
/*
 * The socket closed (its path removed) and the control freed; no
 * migration may be using it.  NULL is ignored.
 */
void kvmdirty_mig_control_free(struct kvmdirty_mig_control *ctl);

enum kvmdirty_mig_compress {
	KVMDIRTY_MIG_COMPRESS_OFF = 0,
	KVMDIRTY_MIG_COMPRESS_AUTO,
	KVMDIRTY_MIG_COMPRESS_ZSTD,
};

struct kvmdirty_mig_send_opts {
	uint64_t downtime_ms;	  /* stop-and-copy once the rest fits this (0: 50) */
	unsigned int max_passes;  /* ... or after this many pre-copy passes (0: 10) */
	uint64_t timeout_ms;	  /* ... or this long after tracking started (0: 60,000) */
	uint64_t peer_timeout_ms; /* each wait for the destination, connecting included (0: 30,000) */
	/*
	 * When pre-copy ends without converging: stop the guest and send the
	 * rest anyway.  Otherwise the migration is abandoned (-ETIME), the
	 * guest runs on here.
	 */
	bool force_switchover;
	bool no_verify;	    /* no page hashes and no check after switchover */
	bool no_throttle;   /* never slow the vCPUs that dirty faster than the link takes */
	uint64_t max_mibps; /* at most this many MiB/s on the wire (0: as fast as the link goes) */
	/* connections, 1 .. 16 (0: 1), each sending its share of the pages on a thread of its own */
	unsigned int connections;
	/*
	 * A key file (kvmdirty-migrate genkey): both ends prove they hold
	 * the key and every record is sealed; with encrypt, encrypted too.
	 * NULL: a plain stream.
	 */
	const char *psk_file;
	bool encrypt;
	/* the destination's name (its recv opts' name); NULL: the address */
	const char *peer_name;
	/*
	 * Events, one JSON line each (kvmdirty-migrate-control(7)), called
	 * on the engine's threads as they happen; it must not block.  NULL:
	 * none.
	 */
	void (*event)(void *ctx, const char *line);
	void *event_ctx;
	/*
	 * A source's control (NULL: none): steered and queried through it
	 * while the migration runs; an unknown outcome waited out (see
	 * above).  It must outlive the call.
	 */
	struct kvmdirty_mig_control *control;
	/*
	 * Statistics as JSON lines (doc/migrate-stats.md, version 1): every
	 * 100 ms and at each pass's end, then a summary; written and flushed
	 * by the engine's thread, left open (NULL: none).
	 */
	FILE *stats;
	/* a progress line on stderr, rewritten in place, while it runs (a terminal's) */
	bool progress;
	/*
	 * Each vCPU's progress (ops.progress) measured this long before
	 * tracking starts, to compare with its progress during pre-copy in
	 * the statistics (0: not measured)
	 */
	uint64_t baseline_ms;
	/*
	 * Post-copy (the destination must take it: its recv opts' postcopy).
	 * The throttle stays off; where pre-copy will not converge (a pass
	 * after the second leaves more than half of what the one before left;
	 * the pass or time limit; postcopy_after passes, 0: no such limit; or
	 * kvmdirty_mig_control_postcopy_start()), the guest pauses, its
	 * state and the list of pages still dirty go, and it resumes at the
	 * destination with those pages missing: each is fetched when the
	 * guest touches it (a connection of its own, answered before the
	 * rest) while the rest follows on the other connections, every page
	 * checked against its hash before it is placed.  The call returns
	 * once the destination has every page (then the guest here may be
	 * freed).  A pre-copy that converges ends as without it.
	 */
	bool postcopy;
	unsigned int postcopy_after;
	/*
	 * Post-copy paused (a connection lost): both ends keep their state;
	 * the source dials the address again, a new session with the same
	 * key, once a second for this long (0: until it works), then only
	 * when its control's recover asks (kvmdirty-migrate-control(7)); the
	 * destination takes the recovery on its listening socket.  The call
	 * does not return while pages are only here (unless the destination
	 * failed): the guest's memory is kept.
	 */
	uint64_t postcopy_recover_ms;
	/*
	 * Compression of guest pages with zstd (KVMDIRTY_MIG_COMPRESS_*, 0:
	 * off): AUTO compresses on each connection while that moves pages
	 * faster (a slow link and pages that shrink; never where the CPU is
	 * the bottleneck or the pages do not shrink), ZSTD every record that
	 * shrinks.  Either needs a destination of this version or later
	 * (an older one refuses the session by its flags); each page is
	 * still checked against its hash after it was decompressed.
	 */
	enum kvmdirty_mig_compress compress;
};

struct kvmdirty_mig_send_result {
	enum kvmdirty_mig_outcome outcome;
	double total_ms;    /* start of tracking to the destination's ACK */
	double downtime_ms; /* vCPUs paused to the destination's ACK */
	uint64_t bytes;	    /* on the wire */
	uint64_t passes, pages, zero_pages;
	bool converged;	     /* the rest fitted the downtime */
	uint64_t lost_pages; /* pages whose final contents differ from what was sent (the check after switchover) */
	uint64_t untouched_pages; /* of zero_pages: never faulted in, sent without being read */
	uint64_t verified_pages;  /* pages the check after switchover compared */
	bool cancelled;		  /* a cancel ended it before COMMIT: the guest runs here (-ECANCELED) */
	bool resolved;		  /* the outcome was decided by a resolve */
	bool throttled;		  /* the throttle slowed the vCPUs at some point */
	/* why pre-copy ended: "fits_downtime", "pass_limit", "time_limit", "postcopy", "cancelled" or "failed" */
	const char *reason;
	/* post-copy ran: why ("rule", "pass_limit", "time_limit", "postcopy_after", "asked") and how it went */
	bool postcopy;
	const char *postcopy_why;
	uint64_t postcopy_pages;    /* pages left for post-copy at the switch (0: none, the destination took it whole) */
	uint64_t postcopy_requests; /* requests the destination's faults made, answered */
	uint64_t postcopy_bulk;	    /* pages sent on the other connections */
	double switch_pause_ms;	    /* the guest's pause at the switch: vCPUs paused here to the ACK */
	double postcopy_ms;	    /* the ACK to the destination's word that every page is in */
	/* the destination's figures: faults that asked for a page, and their waits (median, 99th percentile) */
	uint64_t postcopy_faults;
	double fault_p50_us, fault_p99_us;
	uint64_t postcopy_recoveries; /* sessions made again after a lost connection */
	/*
	 * Compression: pages that went compressed, their bytes before and
	 * after (bytes above counts the latter), and the seconds the
	 * source's threads spent compressing, probes included.
	 */
	uint64_t zpages, zraw_bytes, zwire_bytes;
	double zcpu_s;
	/* CPU seconds of the threads that sent the stream (the caller's and each connection's), post-copy's apart */
	double cpu_s;
};

/*
 * Migrate guest (a source: its tracker set, its vCPUs running) to the
 * destination listening at addr ("tcp:HOST:PORT": HOST a name or an
 * address, IPv6 without brackets, empty for loopback; or "unix:PATH").
 * opts may be NULL (every default).  Returns:
 *   0: the destination runs the guest (THERE); keep the vCPUs here paused
 *      and free them when you will;
 *   > 0: the same, but that many pages' final contents here differ from
 *      what was sent (a write tracking lost; named in err);
 *   -EINPROGRESS: the outcome is unknown (UNKNOWN; only without a control,
 *      which waits it out instead): the vCPUs stay paused;
 *   any other -errno: the guest runs on here (HERE), resumed where it was
 *      paused, and may be migrated again: -ETIME (did not converge and
 *      force_switchover off), -EACCES (authentication failed on either
 *      side), -ECONNREFUSED and the like (the address), -EPROTO (the
 *      destination refused the stream, err says which field), -ENOENT
 *      (psk_file), -EINVAL (opts), -EBUSY (opts->control is another
 *      migration's, under way: refused before anything is dialled, that
 *      migration untouched), -ECANCELED (a cancel through the control).
 * res (may be NULL) says the same and how it went.  One migration of a
 * guest at a time, from any thread; snapshots of the guest may be taken
 * beside it where the series began first (kvmdirty_mig_snap_new()).
 */
int kvmdirty_mig_send(struct kvmdirty_mig_guest *guest, const char *addr, const struct kvmdirty_mig_send_opts *opts,
		      struct kvmdirty_mig_send_result *res, char *err, size_t len);

/*
 * Listen at addr (as kvmdirty_mig_send()'s; port 0: any, see
 * getsockname()) for kvmdirty_mig_recv(): the socket's fd (close it when
 * done), or -errno with err naming the address.
 */
int kvmdirty_mig_listen(const char *addr, char *err, size_t len);

struct kvmdirty_mig_recv_opts {
	uint64_t timeout_ms;  /* each wait for the source (0: 30,000) */
	uint64_t deadline_ms; /* a whole stream (0: none) */
	/* the source must prove it holds this key (NULL: plain streams only); encrypt: encrypted only */
	const char *psk_file;
	bool encrypt;
	/* the name this destination answers to (NULL: the address each connection came to) */
	const char *name;
	/*
	 * Take one stream: a refused one ends the call.  Otherwise a refused
	 * stream (or a source that failed authentication) is logged and the
	 * next one taken.
	 */
	bool once;
	/* a line for each connection or stream refused (NULL: none) */
	void (*log)(void *ctx, const char *line);
	void *log_ctx;
	/* a destination's control (NULL: none); see kvmdirty_mig_send_opts' */
	struct kvmdirty_mig_control *control;
	/*
	 * Take a source's post-copy (its send opts' postcopy; refused by name
	 * without this): kvmdirty_mig_recv() may return 0 with pages still at
	 * the source (res->postcopy), brought in as the guest touches them
	 * (userfaultfd; the guest needs ops.pause); see
	 * kvmdirty_mig_postcopy_wait().
	 */
	bool postcopy;
};

struct kvmdirty_mig_recv_result {
	enum kvmdirty_mig_outcome outcome;
	/*
	 * The guest runs in post-copy: kvmdirty_mig_postcopy_wait() says
	 * when every page is in.  False after a switch that left no page
	 * at the source: the guest is whole, as after pre-copy.
	 */
	bool postcopy;
	bool hashed;	  /* pages came with hashes and every page's latest copy matched */
	uint64_t pages;	  /* pages received, DATA and ZERO, re-sent ones counted again */
	uint64_t records; /* records before END */
	uint64_t zpages;  /* of pages, those that came compressed */
	double cpu_s;	  /* CPU seconds of the threads that received the stream (the caller's included) */
};

/*
 * Receive a migration into guest (a destination: its vCPUs created and
 * never run, its regions those of the source) on listen_fd
 * (kvmdirty_mig_listen(), or a bound stream socket of the caller's, which
 * is made to listen, kept non-blocking during the call and given its
 * flags back after); each source's handshake runs on a thread of its own,
 * so none holds the others.  opts may be NULL.  The wait for a source has
 * no limit: timeout_ms and deadline_ms count from its first byte.
 * Returns 0 once the source committed: every page arrived and matched,
 * every vCPU's and the VM's state and the devices' state are loaded: run
 * the guest.  Otherwise do not run it: -EINPROGRESS (outcome unknown, see
 * enum kvmdirty_mig_outcome; only without a control), -ENOTRECOVERABLE (the vCPUs could not be
 * loaded back as they were before a refused stream: free the guest),
 * -ENOTSOCK or -EPROTOTYPE (listen_fd is not a stream socket), or with
 * once a refusal's -errno (-EPROTO, -ECANCELED for a stream the source
 * dropped at the handoff, -ETIMEDOUT): guest memory may hold part of that
 * stream, and another stream must bring every page again.  A source that
 * fails authentication never ends the call, once or not: it is logged and
 * the next one taken.  After a refused stream the devices may hold what
 * its devices_load_live or devices_load gave them; the next stream's
 * loads replace it (devices_load_live is called for every stream, with 0
 * bytes where it has no such part).  err: one line.
 */
int kvmdirty_mig_recv(struct kvmdirty_mig_guest *guest, int listen_fd, const struct kvmdirty_mig_recv_opts *opts,
		      struct kvmdirty_mig_recv_result *res, char *err, size_t len);

struct kvmdirty_mig_postcopy_stats {
	bool complete; /* every page is in: the source may drop its copy */
	bool failed;   /* a page failed its hash or the stream was out of form: the guest was paused for good */
	bool paused;   /* a connection ended before every page was in: vCPUs that touch a missing page wait */
	uint64_t left;	      /* pages left at the source at the switch */
	uint64_t missing;     /* ... still missing (only at the source) */
	uint64_t faults;      /* faults on a missing page */
	uint64_t zero_faults; /* faults on pages the stream left zero, placed here */
	uint64_t requested;   /* pages asked for (a fault's and those after it) */
	uint64_t placed;      /* pages placed */
	double complete_ms;   /* the guest's resume here to every page in */
	double fault_p50_us, fault_p99_us, fault_max_us; /* a fault's wait: its read to its page placed */
	char why[256];					 /* failed or paused: why */
};

/*
 * After kvmdirty_mig_recv() returned 0 with res->postcopy (run the vCPUs
 * first): wait up to timeout_ms (negative: for ever) until every page is
 * in (0), or post-copy failed (-EIO: a page that failed its hash, never
 * placed; -EPROTO: a record out of form; err says which): the guest was
 * paused (ops.pause) and must not run again (its memory is incomplete),
 * a VMM thread reading a missing page gets zeroes from then.  -ETIMEDOUT
 * otherwise (still under way, or paused for a lost connection: err
 * says).  st (may be NULL): the figures so far.  -ENOENT: no post-copy on
 * this guest.  Any thread.  kvmdirty_mig_guest_free() ends post-copy;
 * before it completed, every vCPU must be out of KVM_RUN for good first.
 */
int kvmdirty_mig_postcopy_wait(struct kvmdirty_mig_guest *guest, int timeout_ms,
			       struct kvmdirty_mig_postcopy_stats *st, char *err, size_t len);

struct kvmdirty_mig_snap_opts {
	/* files PREFIX-NNNNNN.snap (the snapshot's number, 6 digits); the directory must exist */
	const char *prefix;
	double pause_ms;	 /* what the last pass with the guest running aims at (0: 5) */
	unsigned int max_passes; /* passes with the guest running, at most (0: 8) */
	bool no_throttle;	 /* never slow a guest that writes faster than the disk takes */
};

struct kvmdirty_mig_snap_result {
	uint64_t seq;	    /* 0: the full snapshot, then 1, 2, ...: diffs */
	char path[4128];    /* the file written (or, on failure, meant) */
	double pause_ms;    /* the vCPUs paused */
	double total_ms;    /* the whole snapshot, the file synced to disk included */
	uint64_t pages;	    /* pages written, every pass */
	uint64_t file_len;  /* the file's length */
	unsigned int passes; /* passes while the guest ran */
	uint64_t bytes;	     /* bytes of pages written */
	uint64_t pause_pages; /* pages written in the pause */
	uint64_t data_pages, zero_pages; /* what the file holds */
	double write_ms;		 /* writing pages (hashing included), the pause's too */
	/* of pause_ms: the vCPUs out of KVM_RUN; the last sync; the last pages; the vCPUs' and VM's state */
	double pause_stop_ms, pause_sync_ms, pause_write_ms, pause_vcpu_ms;
	double fsync_ms;		/* index, header, trailer, fsync, rename, the directory's fsync */
	double dirty_pps;		/* pages the guest made dirty a second meanwhile */
	unsigned int throttle_permille; /* the lowest run share the throttle gave the vCPUs (1000: none) */
};

/*
 * Begin a series of snapshots of guest (a source: tracker set, vCPUs
 * running or not): its own consumer of the tracker (kvmdirty.h), which
 * keeps logging on for the guest's regions until kvmdirty_mig_snap_free().
 * opts->prefix required.  0, or -EINVAL (opts), -ENAMETOOLONG (a prefix
 * past 4,064 bytes), -ENOENT/-ENOTDIR (the prefix's directory), -ENOMEM,
 * or the tracker's -errno; err says which.  *ret_snap is NULL on failure.
 */
int kvmdirty_mig_snap_new(struct kvmdirty_mig_guest *guest, const struct kvmdirty_mig_snap_opts *opts,
			  struct kvmdirty_mig_snap **ret_snap, char *err, size_t len);

/*
 * Take the series' next snapshot (the first one full, then diffs of the
 * pages written since the one before) while the guest runs, paused only
 * for the last pages, the states and the devices' state; the file is on
 * disk (fsync, rename, the directory's fsync) when it returns.  0 with res
 * filled, or -errno with err naming the file: nothing of it is left, no
 * earlier file is touched, the guest runs on, and the next call takes its
 * number.  One call at a time per series.
 */
int kvmdirty_mig_snap_take(struct kvmdirty_mig_snap *snap, struct kvmdirty_mig_snap_result *res, char *err,
			   size_t len);

/* End the series (its consumer freed; logging off where nothing else needs it).  NULL is ignored. */
void kvmdirty_mig_snap_free(struct kvmdirty_mig_snap *snap);

/*
 * Restore the chain paths[0 .. n) (the full snapshot first, then its diffs
 * in order) into guest (fresh memory, its vCPUs never run, its regions
 * those the snapshots list): every file checked whole, every page's
 * newest copy read and verified against its hash, each vCPU's, the VM's
 * and the devices' state loaded.  0: run the guest; ret_pages (may be
 * NULL): the pages read.  Otherwise -errno (-EPROTO: a file is not the
 * chain's or is damaged; -ENOENT: a file; -EINVAL: n is 0) with err
 * naming the file and what is wrong: do not run the guest.
 */
int kvmdirty_mig_restore(struct kvmdirty_mig_guest *guest, const char *const *paths, unsigned int n,
			 uint64_t *ret_pages, char *err, size_t len);

/* A lazy restore under way (kvmdirty_mig_restore_lazy()). */
struct kvmdirty_mig_lazy;

enum kvmdirty_mig_lazy_event {
	KVMDIRTY_MIG_LAZY_RESIDENT = 1, /* every page in place: the snapshot files are needed no more */
	KVMDIRTY_MIG_LAZY_FAILED,	/* the restore failed and the guest was paused: it must not run again */
};

struct kvmdirty_mig_lazy_opts {
	/*
	 * The working-set file to read (NULL: none), whose pages the fill
	 * places first: one recorded by a restore of this chain or of a
	 * chain it extends; one absent, damaged or of another chain is left
	 * unused (said in the stats' ws_note), never an error.  And the one
	 * to write once resident (NULL: none; replaced whole): the pages the
	 * guest's faults brought in, in their order (kvmdirty-snapshot(5)).
	 */
	const char *workset_read, *workset_write;
	/* no fill: pages come in only when touched, and the guest never becomes resident (tests, benchmarks) */
	bool no_fill;
	/*
	 * Optional: called once, from the restore's own thread, when the
	 * guest is resident or when the restore failed (the guest paused
	 * first); line says what happened and when, or why (the file and the
	 * page).  It may not call kvmdirty_mig_lazy_free().
	 */
	void (*event)(void *ctx, enum kvmdirty_mig_lazy_event ev, const char *line);
	void *ctx;
};

struct kvmdirty_mig_lazy_stats {
	double first_instruction_ms; /* the call's start to its return: when the vCPUs may run */
	double resident_ms;	     /* the call's start to every page in place (0: not yet) */
	bool resident, failed;
	uint64_t faults;      /* faults that placed a page, zero pages included */
	uint64_t zero_faults; /* ... of them, pages the chain holds as zero */
	uint64_t raced;	      /* a fault's or the fill's copy found its page placed already */
	uint64_t filled;      /* pages the fill placed */
	uint64_t around;      /* pages placed after a faulting one, from the same copy (up to 15 a fault) */
	uint64_t prefetched;  /* ... of them, the working-set file's */
	uint64_t workset_pages; /* pages the working-set file read lists (0: none used) */
	char ws_note[160];	/* why a working-set file given was not used ("" otherwise) */
	uint64_t data_pages;	/* pages the chain holds as data (known once the fill is through) */
	/*
	 * Each fault's service: from the read that brought it to the page
	 * placed (the time a fault waits before that read is not in it).
	 * hist[i]: faults that took at most kvmdirty_mig_lazy_bucket_us(i)
	 * and more than bucket i - 1's (0.1 us steps to 100 us, 10 us steps
	 * to 10 ms, then the rest).
	 */
	double fault_p50_us, fault_p99_us, fault_max_us;
	uint64_t hist[2001];
};

/*
 * Restore the chain paths[0 .. n) into guest as kvmdirty_mig_restore()
 * does, but lazily: the files checked whole (not their pages), the
 * guest's memory emptied (whatever the VMM put there goes) and registered
 * with userfaultfd, each vCPU's, the VM's and the devices' state loaded
 * (the devices may read guest memory: it is served), and 0 returned: run
 * the vCPUs at once.  A page the guest (or any thread) touches is read
 * from the newest file listing it and checked against its hash before it
 * is placed; a thread of the restore's own places the rest, the
 * working set's first (opts), then every file newest first in page order.
 * Once every page is in, the guest is resident (event, stats): the files
 * may go.  A page that fails its check (damaged, or its file changed
 * since) or a read that fails is never placed: the restore pauses the
 * guest (ops->pause, required, called from the restore's thread at any
 * time after this returns, also before the VMM started its vCPUs: it must
 * hold for vCPUs started later; a vCPU waiting on that page leaves
 * KVM_RUN on the pause's kick, as Linux 6.2+ lets a signal end a KVM
 * fault's wait) and says so (event; kvmdirty_mig_lazy_wait()): the guest
 * must not run again.  A VMM thread that reads that page gets zeroes once
 * the guest is paused (or 100 ms after the failure), never the copy.  The
 * files must not be changed meanwhile.  Until the guest is resident its
 * memory is whole only as seen through these mappings: a second mapping
 * of shared memory must not be touched, a page the VMM discards
 * (MADV_DONTNEED) comes again when touched (after it, reads as zero), and
 * kvmdirty_mig_snap_new() and kvmdirty_mig_send() on any guest over this
 * memory refuse with -EBUSY.
 * Errors (nothing left running, the guest must not run): as
 * kvmdirty_mig_restore()'s before its pages, -EINVAL (no pause op), and
 * -EPERM or -ENOSYS where this process may not have userfaultfd
 * (vm.unprivileged_userfaultfd=0 for a caller without CAP_SYS_PTRACE, a
 * seccomp filter; err says so): the eager kvmdirty_mig_restore() remains.
 * The guest's regions must be private anonymous or shared memory, of 4
 * KiB pages (hugetlbfs: -EOPNOTSUPP, refused before anything is emptied).
 * *ret_lazy: free it with kvmdirty_mig_lazy_free().  Any thread.
 */
int kvmdirty_mig_restore_lazy(struct kvmdirty_mig_guest *guest, const char *const *paths, unsigned int n,
			      const struct kvmdirty_mig_lazy_opts *opts, struct kvmdirty_mig_lazy **ret_lazy,
			      char *err, size_t len);

/*
 * Wait up to timeout_ms (negative: for ever) until the guest is resident
 * (0) or the restore failed and the guest is paused (-EPROTO for a page
 * that failed its check or a file that changed, else the -errno of what
 * failed; err names the file and the page).  -ETIMEDOUT otherwise.  Any
 * thread.
 */
int kvmdirty_mig_lazy_wait(struct kvmdirty_mig_lazy *lazy, int timeout_ms, char *err, size_t len);

/* The restore's figures so far (any thread, any time). */
void kvmdirty_mig_lazy_stats(struct kvmdirty_mig_lazy *lazy, struct kvmdirty_mig_lazy_stats *ret);

/* The upper bound (microseconds) of histogram bucket i of kvmdirty_mig_lazy_stats.hist. */
double kvmdirty_mig_lazy_bucket_us(unsigned int i);

/*
 * End the restore: its threads stopped, the files closed.  Once resident,
 * the guest runs on untouched.  Before that its memory is incomplete:
 * every vCPU must be out of KVM_RUN for good, and no thread may touch
 * guest memory, from then on (a page not placed reads as zero).  NULL is
 * ignored.
 */
void kvmdirty_mig_lazy_free(struct kvmdirty_mig_lazy *lazy);

/* What a snapshot file holds, from its header: what a guest to restore it into must have. */
struct kvmdirty_mig_snap_region {
	uint64_t gpa, size; /* in the guest, bytes */
};

struct kvmdirty_mig_snap_info {
	uint64_t seq;	         /* 0: a full snapshot; then its diffs' numbers */
	unsigned int nr_vcpus;   /* vCPUs, in the order of the guest that was saved */
	unsigned int nr_regions; /* regions, in the library's order */
};

/*
 * The header of the snapshot file at path, checked whole (magic, version,
 * tables, index and checksums; not its pages: kvmdirty_mig_verify()): 0
 * with *ret filled and regions[0 .. min(nr_regions, max_regions)) (regions
 * may be NULL with max_regions 0), or -errno with err naming the file and
 * what is wrong (-ENOENT; -EPROTO: not a snapshot this library reads, or
 * damaged).  Any thread.
 */
int kvmdirty_mig_snap_info(const char *path, struct kvmdirty_mig_snap_info *ret, struct kvmdirty_mig_snap_region *regions,
			   unsigned int max_regions, char *err, size_t len);

/*
 * Check the chain paths[0 .. n) as kvmdirty_mig_restore() will before it
 * reads a page: every file whole (its header, tables, index and
 * checksums), a full snapshot first and its diffs in order, without a gap.
 * No page is read: a VMM calls it before it builds the guest.  0, or
 * -errno with err naming the file and what is wrong.
 */
int kvmdirty_mig_snap_check(const char *const *paths, unsigned int n, char *err, size_t len);

/*
 * Check the chain paths[0 .. n) without a guest: every file whole, in
 * order, and every copy of every page (older ones too) against its hash.
 * 0 with ret_pages (may be NULL) the pages read, or -errno with err naming
 * the file and the page (-EPROTO) or the read that failed.
 */
int kvmdirty_mig_verify(const char *const *paths, unsigned int n, uint64_t *ret_pages, char *err, size_t len);

/*
 * A new key file at path for kvmdirty_mig_send_opts.psk_file and
 * kvmdirty_mig_recv_opts.psk_file: 32 bytes from getrandom(2) as 64 hex
 * digits, mode 0600, created (never over anything that exists, a symbolic
 * link included) and synced to disk.  Copy it to the other host by a
 * channel you trust.  0, or -errno with err naming the file (-EEXIST:
 * something is there).
 */
int kvmdirty_mig_genkey(const char *path, char *err, size_t len);

/*
 * Whether the key file at path is one kvmdirty_mig_send()/_recv() take:
 * a regular file (not a symbolic link), this user's own, with no
 * permission for group or others, holding exactly 64 hex digits and at
 * most one newline; read, checked and wiped.  0, or -errno with err naming
 * the file (never its content): -ENOENT and the like, -ELOOP (a link),
 * -EPERM (another user's, or others may read it), -EINVAL (anything
 * else).  A tool calls it before it builds a guest: a bad key costs nothing.
 */
int kvmdirty_mig_key_check(const char *path, char *err, size_t len);

/*
 * Whether addr is an address kvmdirty_mig_send() and _listen() take
 * ("tcp:HOST:PORT" whose host resolves, "unix:PATH" of at most 107
 * bytes): 0, or -EINVAL with err naming it and what is wrong.  Nothing is
 * built or dialled.
 */
int kvmdirty_mig_addr_check(const char *addr, char *err, size_t len);

/*
 * Protect this process before any key is read: /proc/self/pagemap kept
 * open for the engine (it tells untouched guest pages from written ones;
 * once the process is not dumpable, only root may open it), then the
 * process made not dumpable (no core dump, no ptrace by this user's other
 * processes) with a core limit of 0.  It holds for the process and what it
 * forks, until execve(2).  Call it first, before any thread starts.  0, or
 * -errno with one line in err.
 */
int kvmdirty_mig_protect_process(char *err, size_t len);

/* A guest's dirty rate, sampled (kvmdirty_mig_rate_new()). */
struct kvmdirty_mig_rate;

struct kvmdirty_mig_rate_sample {
	uint64_t t_ms;	      /* when, since kvmdirty_mig_rate_new() */
	uint64_t ns;	      /* the interval since the sample before */
	uint64_t pages;	      /* distinct pages of the guest written over it */
	uint64_t pages_per_s; /* the guest's rate */
	/* each vCPU's part: from its dirty ring's distinct pages (by_ring), else from its write faults */
	bool by_ring;
	unsigned int nr_vcpus;
	const uint64_t *vcpu_pages_per_s; /* [nr_vcpus], the sampler's until its next sample */
};

/*
 * Watch guest's dirty rate (a source: its tracker set), before deciding
 * to migrate it or while a migration or snapshots run: a counting
 * consumer of the tracker of its own, which takes nothing from them (a
 * migration beside it sends what it would send without it) and keeps
 * logging on for the guest's regions while it lives.  0, or -errno with
 * one line in err (-EINVAL: no tracker).  One thread samples and frees;
 * free the sampler before the guest.
 */
int kvmdirty_mig_rate_new(struct kvmdirty_mig_guest *guest, struct kvmdirty_mig_rate **ret_rate, char *err,
			  size_t len);
/* The rates since the sample before (or kvmdirty_mig_rate_new()): 0, or -errno of the count. */
int kvmdirty_mig_rate_sample(struct kvmdirty_mig_rate *rate, struct kvmdirty_mig_rate_sample *ret_sample);
/*
 * One line for a sample into buf (NUL-terminated, truncated to len; 256
 * bytes and 96 a vCPU always do):
 *   rate t_ms=T guest_pages_per_s=P guest_bytes_per_s=B vcpu_by=ring|faults
 *        vcpu0=P0 vcpu0_bytes_per_s=B0 vcpu1=...
 * or with json one JSON object:
 *   {"t_ms":T,"guest_pages_per_s":P,"guest_bytes_per_s":B,"vcpu_by":"ring",
 *    "vcpus":[{"pages_per_s":P0,"bytes_per_s":B0},...]}
 */
void kvmdirty_mig_rate_format(const struct kvmdirty_mig_rate_sample *sample, bool json, char *buf, size_t len);
/* The sampler's consumer freed (logging off where nothing else needs it).  NULL is ignored. */
void kvmdirty_mig_rate_free(struct kvmdirty_mig_rate *rate);

/* This library's version ("0.5.0"), and the stream version it sends and takes. */
const char *kvmdirty_mig_version_string(void);
unsigned int kvmdirty_mig_stream_version(void);

#ifdef __cplusplus
}
#endif

#endif
