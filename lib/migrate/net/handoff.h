/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_HANDOFF_H
#define KVMDIRTY_MIGRATE_HANDOFF_H

/*
 * The handoff after END (stream.h): the destination says READY, the
 * source COMMIT or ABORT, the destination ACK.  Each side's rules, the
 * state table of kvmdirty-migrate(1):
 *
 *   source                                   its guest
 *   any failure before READY arrived         runs here (ABORT sent, best effort)
 *   REFUSED                                  runs here
 *   READY, a cancel asked for before it      runs here (ABORT sent)
 *   READY, COMMIT could not be sent          runs here
 *   COMMIT sent, ACK status 0                moved: dropped here
 *   COMMIT sent, ACK status < 0              runs here (the destination dropped it)
 *   COMMIT sent, no ACK (yet)                UNKNOWN: paused (other messages passed over)
 *
 *   destination                              its guest
 *   READY could not be sent                  dropped
 *   COMMIT                                   runs (ACK status 0)
 *   ABORT                                    dropped (ACK status 0)
 *   a whole message that is neither          dropped (ACK status < 0)
 *   READY sent, no answer (yet)              UNKNOWN: paused
 *
 * Unknown from its last message on (status.h: queryable and resolvable at
 * once), a side keeps its guest paused; past -T in all without the answer,
 * or when the connection ends, it says so once (unknown()) and goes on
 * reading without a timeout: a late ACK (source) or COMMIT or ABORT
 * (destination) still decides, unless the read that gave up had taken part
 * of a message (mig_chan_torn()).  A resolve decides too, whichever comes
 * first, and is told to the peer; a side never decides by itself.
 */
#include <stdint.h>

#include "channel.h"
#include "status.h"
#include "stream.h"

struct mig_handoff {
	struct mig_chan *ch; /* connection 0's channel */
	int fd;		     /* its socket: a resolve shuts its reading side down */
	/* -T: READY awaited at most this long, and the answer to a side's last message in all (0: no limit) */
	uint64_t timeout_ms;
	struct mig_status *st;
	/* once, on the engine's thread, when the outcome becomes unknown: one line saying why (or NULL) */
	void (*unknown)(void *ctx, const char *line);
	void *ctx;
	/*
	 * Unknown: wait (reading the peer, without a timeout) until the
	 * outcome is decided; without wait, return UNKNOWN at once and leave
	 * the guest, paused, to the caller.
	 */
	bool wait;
	/*
	 * Destination (or NULL): called when COMMIT arrives, before the
	 * outcome is decided and ACK sent; where it fails (-errno, why) the
	 * guest is dropped and the ACK says so (its status): the source keeps
	 * its guest (post-copy's memory could not be made ready).
	 */
	int (*on_commit)(void *ctx, char *why, size_t len);
	void *commit_ctx;
};

struct mig_handoff_times {
	double ready_ms;  /* from the call to READY's arrival (source) */
	double commit_ms; /* from READY's arrival to the ACK's: the commit's round trip (source) */
	bool cancelled;	  /* a cancel came before COMMIT: ABORT sent instead, the guest stays (source) */
};

/*
 * Source: the guest is paused and END was sent.  Returns the outcome that
 * stands (st's): HERE, the caller resumes its guest; THERE, the guest
 * moved and the caller drops it; UNKNOWN only without wait: the guest
 * stays paused.  err: one line of what happened.
 */
enum mig_outcome mig_handoff_source(const struct mig_handoff *h, struct mig_handoff_times *ret_t, char *err,
				    size_t len);
/*
 * Destination: the stream is complete and every vCPU loaded.  Returns the
 * outcome that stands: HERE, the caller runs its guest; THERE, it drops it
 * (its vCPUs back to their state before the stream); UNKNOWN only without
 * wait.  err: one line.
 */
enum mig_outcome mig_handoff_dest(const struct mig_handoff *h, char *err, size_t len);
/* Destination: refuse the stream (status < 0, why), best effort; the peer may be gone. */
void mig_handoff_refuse(struct mig_chan *ch, int status, const char *why);

#endif
