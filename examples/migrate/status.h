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

struct mig_status {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool dest; /* the destination's side */
	const char *state;
	uint64_t stream; /* destination: streams taken so far (the one this status is about) */
	uint64_t pass, bytes_sent, remaining_bytes;
	enum mig_outcome outcome;
	bool resolved; /* the outcome was decided by a resolve */
	char why[160]; /* why the outcome is unknown, or what decided it */
	int wake_fd;   /* while UNKNOWN: a resolve shuts its reading side down to wake the engine (-1: none) */
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
 * ---- anyone's side ----
 * The status as the members of one JSON object ("{...}", NUL-terminated):
 * side, state, stream, pass, bytes_sent, remaining_bytes, outcome, resolved, and
 * why where there is something to say.  0, or -ENOSPC when len is short.
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
