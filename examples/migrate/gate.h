/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_GATE_H
#define KVMDIRTY_MIGRATE_GATE_H

/*
 * The gate: a destination's listener taking streams from whoever
 * connects, strangers included, without any one of them stalling the
 * rest.
 *
 * - Every accepted connection's handshake runs on a thread of its own, up
 *   to MIG_GATE_SLOTS at once, each within one handshake's budget
 *   (mig_session_opts.handshake_ms, a few seconds, whatever the peer
 *   does).  With every slot taken and another connection waiting (or
 *   one arriving later: the listener is watched all the while), a
 *   handshake still in progress is cut (which one: below).
 * - A session's first connection, proven, waits for its others to join:
 *   all within mig_session_join_ms() (which --deadline also bounds), or
 *   it is dropped, its connections closed.  A join is matched to its
 *   session by the session's id and keyed by its secret; a connection
 *   that joins nothing costs only its own slot.
 * - Handshakes are told apart by peer (an IPv4 address, an IPv6 /64, a
 *   Unix socket's user).  When one must be cut, it is the oldest of the
 *   peer holding the most slots, so that a peer opening connections as
 *   fast as it can cuts its own handshakes, not another peer's; and a
 *   handshake alone from its whole address is not cut before a grace of
 *   a fifth of the budget (1 s by default), so that strangers with many
 *   addresses, one connection each, cannot cut a real source's before its
 *   round trips are done: while every handshake is in its grace, later
 *   connections wait in the backlog.
 * - Wrong proofs of the key are counted per address (an IPv6 one whole,
 *   IPv4 as above, a Unix socket's user): a proof that arrived
 *   and does not hold.  A connection that ends in place of a proof (a
 *   source of another key, which stops at the destination's proof; a
 *   source that gave up waiting) tests no guess and is not counted, nor
 *   is a wait that ran out, nor a cut.  After MIG_GATE_FREE_GUESSES, that
 *   peer is turned away with a refusal, unread, until a wait doubling
 *   with each further wrong proof (MIG_GATE_WAIT_MS up to
 *   MIG_GATE_WAIT_MAX_MS) has passed since its last one.  A right proof
 *   clears the count.  The table keeps MIG_GATE_PEERS addresses, the least
 *   recent giving way.  Peers behind one address (NAT) share its count:
 *   a stranger there can keep them waiting, not learn the key.
 * - mig_gate_take() returns the first stream that is complete (a plain
 *   one where no key is required, or a session with all its connections
 *   proven and joined); every other handshake in progress is cut then,
 *   every session still joining dropped.  While the caller receives the
 *   stream nothing is accepted: later connections wait in the listen
 *   backlog (MIG_GATE_BACKLOG) for the next mig_gate_take().
 *
 * Refused connections are logged through o->log, one line each, but
 * not more than MIG_GATE_LOG_PER_ADDR from one address (whole, as for its
 * wrong proofs) nor MIG_GATE_LOG_ALL in all in an interval of
 * MIG_GATE_LOG_INTERVAL_MS; the rest are counted, and told once the
 * interval is over (within it and a poll's wake-up, or at
 * mig_gate_free()): "N more refusals from A in the last S s", for up to
 * MIG_GATE_LOG_SUMMARIES addresses, then one line for the others.  Every
 * refusal is in a line or in a count.
 *
 * Descriptors: a handshake in progress holds two (its socket and its
 * io_uring), so a full house needs 2 * MIG_GATE_SLOTS beside the
 * caller's own; accept(2) running out (EMFILE, ENFILE) cuts a handshake,
 * a handshake whose io_uring cannot be made is refused.  Leave room
 * (RLIMIT_NOFILE; kvmdirty-migrate raises its soft limit to 65536 where
 * the hard one allows).
 */
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "session.h"

#define MIG_GATE_SLOTS 64
#define MIG_GATE_BACKLOG 128
#define MIG_GATE_PENDING 8 /* sessions waiting for their joins, at once: the oldest gives way */
#define MIG_GATE_FREE_GUESSES 3
#define MIG_GATE_WAIT_MS 1000
#define MIG_GATE_WAIT_MAX_MS 60000
#define MIG_GATE_PEERS 256
#define MIG_GATE_LOG_INTERVAL_MS 10000
#define MIG_GATE_LOG_PER_ADDR 3
#define MIG_GATE_LOG_ALL 20
#define MIG_GATE_LOG_SUMMARIES 8
#define MIG_GATE_LOG_ADDRS 64 /* addresses counted apart in an interval; the least recent joins "the others" */

struct mig_gate;

/*
 * A gate over lfd (listening; made non-blocking, its backlog raised to
 * MIG_GATE_BACKLOG; still the caller's to close after mig_gate_free()).
 * o is copied; o->psk and o->log_ctx must outlive the gate.  0 or
 * -ENOMEM.
 */
int mig_gate_new(int lfd, const struct mig_session_opts *o, struct mig_gate **ret_gate);

/*
 * Wait for the next complete stream: 0 with *ret_s (its connections the
 * session's own, closed by mig_session_free(); each connection's
 * deadline the stream's, o->deadline_ms from now), or -errno with one
 * line in err when accepting itself fails (not a peer's doing).  Not to
 * be called by two threads at once.
 */
int mig_gate_take(struct mig_gate *gate, struct mig_session *ret_s, char *err, size_t len);

/*
 * Wrong proofs counted so far against a peer (sa: as accept(2) gives it;
 * uid: a Unix socket's peer's user, ignored for other families).
 */
unsigned int mig_gate_wrong_proofs(struct mig_gate *gate, const struct sockaddr *sa, uid_t uid);

void mig_gate_free(struct mig_gate *gate);

#endif
