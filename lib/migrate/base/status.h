/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_STATUS_H
#define KVMDIRTY_MIGRATE_STATUS_H

/*
 * What a migration's side is doing and where its guest runs, for anyone
 * who asks (the control socket's query) and for the one who decides an
 * outcome the engine cannot know (its resolve).  The engine writes it from
 * the migration's threads; every call here is safe from any thread.
 *
 * Outcomes, from this side's view of the guest:
 *   PENDING  the migration is under way (the source's guest runs, or is
 *            paused for stop-and-copy; the destination's is not started)
 *   HERE     it runs here: a source that kept or took back its guest, a
 *            destination that was told COMMIT (or resolved "here")
 *   THERE    it does not run here: a source whose guest moved (or was
 *            resolved "nowhere"), a destination that dropped its copy
 *   UNKNOWN  this side cannot know which, and keeps its guest paused until
 *            told: the source from sending COMMIT until the destination's
 *            ACK, the destination from sending READY until COMMIT or ABORT
 * HERE and THERE are final: the first decided stands, whoever decides it
 * (the handoff's messages, or a resolve).
 */
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum mig_outcome {
	MIG_OUTCOME_PENDING,
	MIG_OUTCOME_HERE,
	MIG_OUTCOME_THERE,
	MIG_OUTCOME_UNKNOWN,
};

/*
 * What steers a source's migration while it runs: set by anyone
 * (mig_status_set(), the control socket's set), read by the engine at
 * each sample (every 100 ms, and at each pass's end), shown by query.
 * Ranges, checked by mig_params_check(): downtime_ms 0..3600000,
 * max_passes 1..100000, timeout_ms 1..86400000 (from the start of
 * tracking), max_bandwidth 0..1048576 MiB/s (0: none).
 */
struct mig_params {
	uint64_t downtime_ms;
	uint64_t max_passes;
	uint64_t timeout_ms;
	uint64_t max_bandwidth; /* MiB/s; 0: as fast as the link goes */
	bool throttle;
	int compress; /* source.h's enum mig_compress: OFF, AUTO, ZSTD */
};

/* Which members of a struct mig_params a set gives. */
enum {
	MIG_PARAM_DOWNTIME = 1u << 0,
	MIG_PARAM_MAX_PASSES = 1u << 1,
	MIG_PARAM_TIMEOUT = 1u << 2,
	MIG_PARAM_MAX_BANDWIDTH = 1u << 3,
	MIG_PARAM_THROTTLE = 1u << 4,
	/*
	 * Compression: changes a migration under way only where its session
	 * agreed to compression (begun with it on): mig_status_set() refuses
	 * turning it on in one that did not (-EOPNOTSUPP).
	 */
	MIG_PARAM_COMPRESS = 1u << 5,
};

#define MIG_MAX_BANDWIDTH_MIBPS 1048576
/* events kept for subscribers that read late, and the longest event line */
#define MIG_EVENTS_KEPT 128
#define MIG_EVENT_LINE 512
/* the connections a cancel may have to shut down: as many as a session has */
#define MIG_STATUS_CANCEL_FDS 16

struct mig_status {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool compress_able; /* the migration under way may compress (its session agreed) */
	bool dest; /* the destination's side */
	const char *state;
	uint64_t stream; /* destination: streams taken so far (the one this status is about) */
	uint64_t pass, bytes_sent, remaining_bytes;
	enum mig_outcome outcome;
	bool resolved; /* the outcome was decided by a resolve */
	char why[160]; /* why the outcome is unknown, or what decided it */
	int wake_fd;   /* while UNKNOWN: a resolve shuts its reading side down to wake the engine (-1: none) */
	/* steering (source): the parameters, a cancel asked for, COMMIT's point of no return passed */
	struct mig_params params;
	/*
	 * The members of params set (MIG_PARAM_*) while no migration ran:
	 * the next one starts from its options with these put over them
	 */
	unsigned int params_set;
	bool cancel, committed, cancelled;
	bool running; /* mig_send() is under way */
	/*
	 * post-copy: the migration may switch to it (source), a switch asked
	 * for (postcopy-start), and, once it runs, its figures for query
	 */
	bool postcopy_able, postcopy_asked, postcopy_on;
	uint64_t pc_missing, pc_faults;
	double pc_p50_us, pc_p99_us;
	/* post-copy paused: a recover asked for (and where: "" the address the migration had) */
	bool pc_paused, recover_asked;
	char recover_addr[256];
	/* what a cancel shuts down, and how, to end a wait of the engine's on the peer (until the commit point) */
	int cancel_fd[MIG_STATUS_CANCEL_FDS];
	unsigned int n_cancel_fd;
	int cancel_how;
	/* events: the last MIG_EVENTS_KEPT lines, event number n at n % MIG_EVENTS_KEPT */
	char events[MIG_EVENTS_KEPT][MIG_EVENT_LINE];
	uint64_t events_head; /* events so far */
	int event_fd;	      /* an eventfd written at each event (-1 until asked for) */
	/* the engine's own sink for the migration under way: a callback, an fd (mig_send_opts) */
	void (*sink)(void *ctx, const char *line);
	void *sink_ctx;
	int sink_fd;
	uint64_t sink_lost;	     /* events the fd could not take, not yet told */
	char sink_rest[MIG_EVENT_LINE]; /* the part of a line the fd has not taken yet */
	size_t sink_rest_len;
};

void mig_status_init(struct mig_status *s, bool dest);
/*
 * A destination's next stream begins (its session accepted): PENDING,
 * nothing resolved, the stream counted.  Until then the last stream's
 * outcome stays for anyone to query.
 */
void mig_status_reset(struct mig_status *s);
void mig_status_destroy(struct mig_status *s);

/*
 * ---- the engine's side ----
 * state: "setup", "precopy", "stop-and-copy", "handoff" (the source;
 * the destination: "waiting", "receiving", "handoff"), then "unknown",
 * "completed" or "failed"; a string that outlives s.
 */
void mig_status_set_state(struct mig_status *s, const char *state);
void mig_status_progress(struct mig_status *s, uint64_t pass, uint64_t bytes_sent, uint64_t remaining_bytes);
/*
 * From now the outcome is unknown (unless already decided): a resolve
 * will shut down fd's reading side, so that a read the engine waits in
 * ends.  Returns the outcome: UNKNOWN, or the one already decided.
 */
enum mig_outcome mig_status_unknown(struct mig_status *s, int fd, const char *why);
/* Decide o (HERE or THERE) unless decided already; returns the outcome that stands. */
enum mig_outcome mig_status_decide(struct mig_status *s, enum mig_outcome o, const char *why);
/* Wait until the outcome is HERE or THERE; returns it. */
enum mig_outcome mig_status_wait(struct mig_status *s);
enum mig_outcome mig_status_outcome(struct mig_status *s);
/* Why the outcome is what it is (one line), into buf. */
void mig_status_why(struct mig_status *s, char *buf, size_t len);
/* "pending", "here", "there", "unknown" */
const char *mig_outcome_name(enum mig_outcome o);

/*
 * ---- steering (the source's) ----
 * A migration under way: mig_send() begins it (mig_status_begin(): the
 * parameters from its options, but for the members someone set since the
 * last migration ended (or before the first), which stand; a status whose
 * last migration ended is made fresh;
 * -EBUSY while another migration runs on it) and ends it (the engine's
 * sink given what it still owes, for at most 100 ms).
 */
int mig_status_begin(struct mig_status *s, const struct mig_params *from_opts);
/*
 * Before the caller dials for a migration it will begin on s (the public
 * API's kvmdirty_mig_send()): -EBUSY while another runs on s; else a
 * status whose last migration ended is made fresh now, so that a cancel
 * asked while it dials is due, and taken as the migration begins.
 */
int mig_status_prepare(struct mig_status *s);
/*
 * The migration prepared for never began (its checks or its dial failed,
 * or the engine refused it first): decided HERE with why, unless it began
 * (then a no-op).  Returns whether a cancel had been asked (then the end
 * is the cancel's, and s says so).  The caller keeps any other call off s
 * from prepare to abandon (the public API's control is taken meanwhile).
 */
bool mig_status_abandon(struct mig_status *s, const char *why);
void mig_status_end(struct mig_status *s);
/*
 * What a query shows as the parameters until a migration begins (its
 * options give them then): p, but for the members a set named, which stand.
 */
void mig_status_show_params(struct mig_status *s, const struct mig_params *p);
/* The parameters as they stand. */
void mig_status_params(struct mig_status *s, struct mig_params *ret);
/*
 * Whether v is an integer in range for the member named ("throttle": 0 or
 * 1); -ERANGE (or -EINVAL: not an integer, or no such member) with a line
 * naming it in err.
 */
int mig_params_check(const char *name, double v, char *err, size_t len);
/*
 * Set the members of p that mask names: each checked first, and nothing
 * changed unless all are in range (-ERANGE, the member named in err).
 * Anyone, any time; the engine takes them at its next sample.
 */
int mig_status_set(struct mig_status *s, const struct mig_params *p, unsigned int mask, char *err, size_t len);
/*
 * Cancel the source's migration: 0, and the engine ends it at its next
 * sample (the guest runs on here; mig_send() returns -ECANCELED).  A
 * source not yet begun is cancelled as it begins.  -EALREADY once COMMIT
 * is being sent (the guest's fate is the destination's ACK, or a resolve);
 * -ENOENT when its migration is over; -EOPNOTSUPP for a destination.
 * err: one line.
 */
int mig_status_cancel(struct mig_status *s, char *err, size_t len);
/*
 * The engine: the sockets a cancel shuts down (shutdown(2) with how) to
 * end a wait on the peer at once: SHUT_RDWR in the session, SHUT_WR on
 * every connection while the stream goes (the destination sees it cut
 * and drops it), SHUT_RD on the first from END's flush to the commit point
 * (the wait for READY ends; ABORT can still be written).  n 0: none.  A
 * cancel already asked for shuts nothing: the engine checks after.
 */
void mig_status_cancel_fds(struct mig_status *s, const int *fds, unsigned int n, int how);
/* The engine: whether a cancel was asked for (and, once it acts on it, mark it done). */
bool mig_status_cancel_asked(struct mig_status *s);
void mig_status_mark_cancelled(struct mig_status *s);
/*
 * Post-copy (the source's): switch to it at the engine's next sample.
 * 0; -EOPNOTSUPP for a destination or a migration begun without
 * post-copy (send --postcopy); -ENOENT when no migration runs; -EALREADY
 * once it switched (or stop-and-copy began).  err: one line.
 */
int mig_status_postcopy_start(struct mig_status *s, char *err, size_t len);
/* The engine: the migration may switch (set at its start), whether a switch was asked, that it switched. */
void mig_status_postcopy_able(struct mig_status *s, bool able);
/*
 * Whether the migration under way may compress: mig_status_begin() sets it
 * from the parameters it begins with (its session offers compression as
 * they say); tests set it by hand.
 */
void mig_status_compress_able(struct mig_status *s, bool able);
bool mig_status_compress_is_able(struct mig_status *s);
bool mig_status_postcopy_asked(struct mig_status *s);
/* The engine: post-copy's figures for query (either side): pages still only at the source, faults, waits. */
void mig_status_postcopy_progress(struct mig_status *s, uint64_t missing, uint64_t faults, double p50_us,
				  double p99_us);
/*
 * Post-copy paused (either side): the engine says so (paused true) and
 * that it recovered (false).  A recover asked for (the control socket's
 * recover): try again now, at addr where given (NULL: the address the
 * migration had; the destination: listen there); 0, -ENOENT when
 * post-copy is not paused, -ENAMETOOLONG.  The engine takes it
 * (mig_status_recover_take(): whether one was asked, and its address).
 */
void mig_status_postcopy_paused(struct mig_status *s, bool paused);
int mig_status_recover(struct mig_status *s, const char *addr, char *err, size_t len);
bool mig_status_recover_take(struct mig_status *s, char *addr, size_t len);
/* Whether a recover was asked for and not yet taken. */
bool mig_status_recover_pending(struct mig_status *s);
/* The address the last recover gave ("" none), for the source's dial: into addr. */
void mig_status_recover_addr(struct mig_status *s, char *addr, size_t len);
/* The engine, READY in hand: true, and no cancel is taken from now; false when a cancel came first. */
bool mig_status_commit_point(struct mig_status *s);

/*
 * ---- events ----
 * One event: a line {"event":NAME,"data":{DATA},"timestamp":{...}}, kept
 * for subscribers (the last MIG_EVENTS_KEPT), written to the engine's fd
 * without blocking (what it cannot take is counted, and told in one
 * events_lost line once it takes lines again) and given to its callback,
 * from the emitting thread, after the lock is dropped.  data: the members
 * of the data object as JSON text ("" for none); a line longer than
 * MIG_EVENT_LINE loses its data.  Never blocks on anyone's reading.
 */
void __attribute__((format(printf, 3, 4))) mig_status_event(struct mig_status *s, const char *name,
							    const char *data_fmt, ...);
/* The engine's sink for the migration under way (NULL and -1: none); fd is made non-blocking. */
void mig_status_sink(struct mig_status *s, void (*cb)(void *ctx, const char *line), void *ctx, int fd);
/* An eventfd that becomes readable at each event (made on the first call); -errno. */
int mig_status_event_fd(struct mig_status *s);
/*
 * The next line for a reader at event *seq into buf (with its newline,
 * NUL-terminated), and its length; 0 when there is none yet.  Events no
 * longer kept are skipped and counted into *lost; while *lost is not 0 the
 * line is an events_lost for them (and *lost is 0 after it), else event
 * *seq's (and *seq moves past it).
 */
size_t mig_status_event_get(struct mig_status *s, uint64_t *seq, char *buf, size_t len, uint64_t *lost);
/* The number the next event will have: a new subscriber starts there. */
uint64_t mig_status_event_head(struct mig_status *s);
/* s as the inside of a JSON string (quotes, backslashes escaped; control characters as '?'), cut to fit. */
void mig_event_str(char *buf, size_t len, const char *s);
/* An events_lost line for count events into buf (with its newline); its length. */
size_t mig_event_lost_line(uint64_t count, char *buf, size_t len);

/*
 * ---- anyone's side ----
 * The status as the members of one JSON object ("{...}", NUL-terminated):
 * side, state, stream, pass, bytes_sent, remaining_bytes, outcome, resolved,
 * why where there is something to say, and (the source's) parameters and
 * cancel ("none", "asked", "done").  0, or -ENOSPC when len is short.
 */
int mig_status_query(struct mig_status *s, char *buf, size_t len);
/*
 * Resolve an unknown outcome: run_here true runs the guest on this side,
 * false drops it here.  0; -EINVAL with a one-line reason in err when the
 * outcome is not unknown (still pending, or known already: nothing to
 * decide).
 */
int mig_status_resolve(struct mig_status *s, bool run_here, char *err, size_t len);

#endif
