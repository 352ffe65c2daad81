/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_GATE_H
#define KVMDIRTY_MIGRATE_GATE_H

/*
 * The gate: a destination's listener taking streams from whoever
 * connects, strangers included, without any one of them stalling the
 * rest.
 *
 * - The listen backlog is drained as fast as it fills, into a waiting
 *   room of up to MIG_GATE_ROOM connections (fewer where RLIMIT_NOFILE
 *   leaves less) that hold a descriptor and no thread: there a
 *   connection waits until its hello is whole in its socket (the first
 *   sizeof(struct mig_hello) bytes; or 8 that are not a session's magic,
 *   a plain stream).  A real source sends its hello as soon as it
 *   connects; a stranger trickling bytes never gets further, nor one that
 *   hangs up, resets, or shuts its end before its handshake could be
 *   done (turned away in the room, no thread).  The room's connections
 *   have the whole budget for their hellos while it is at most half
 *   full; beyond, less as it fills, down to MIG_GATE_HELLO_MIN_MS and
 *   four round trips (TCP_INFO's, at accept); a connection arriving at a
 *   full room makes the oldest whose hello is not whole give way (so does
 *   running out of descriptors).  Each turned away is told why (a
 *   session's source as mig_session_turn_away() tells it; "awaiting the
 *   header: ...").
 * - A connection whose hello is whole gets a slot: first the joins of a
 *   session open here (it waits for them), then in the order the hellos
 *   came whole; its handshake on a thread of its own, up to
 *   MIG_GATE_SLOTS at once, within what is left of one handshake's budget
 *   from accept (mig_session_opts.handshake_ms, a few seconds, whatever
 *   the peer does).  With every slot taken and a whole hello waiting, a
 *   handshake still in progress is cut (which one: below), never a join
 *   of a session open here (its session waits for it; its id, the
 *   session's, is not to be guessed), nor one that has answered its
 *   source "ok" (mig_session_opts.claim: the answer and the cut exclude
 *   each other, so a source that had its answer finds its session filed).
 *   A join whose hello came whole before its session was filed (its
 *   source had the answer first) moves up with the joins once it is; one
 *   seated meanwhile is not cut while a session answered is being filed,
 *   and is a join once its session is.
 * - A session's first connection, proven, waits for its others to join:
 *   all within mig_session_join_ms() (which --deadline also bounds), or
 *   it is dropped, its connections closed.  A join is matched to its
 *   session by the session's id and keyed by its secret; a connection
 *   that joins nothing costs only its own slot.
 * - Handshakes are told apart by peer (an IPv4 address, an IPv6 /64, a
 *   Unix socket's user).  When one must be cut, it is the oldest of the
 *   peer holding the most slots, so that a peer opening connections as
 *   fast as it can cuts its own handshakes, not another peer's; and a
 *   handshake alone from its whole address is not cut within a grace
 *   from its slot: MIG_GATE_GRACE_MS and four of its round trips
 *   (TCP_INFO's), at most a fifth of the budget; with more whole hellos
 *   waiting than there are slots, the first part shrinks in proportion,
 *   down to MIG_GATE_GRACE_MIN_MS.  What is left of a real source's
 *   handshake then is one round trip and the proofs' arithmetic, so that
 *   strangers with many addresses, one connection each, cannot cut a real
 *   source's before it is done: while every handshake is in its grace,
 *   whole hellos wait in the room.
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
 *   every session still joining dropped, every connection in the room
 *   turned away (told "the destination took another stream first").
 *   While the caller receives the stream nothing is accepted: later
 *   connections wait in the listen backlog (MIG_GATE_BACKLOG, as far as
 *   net.core.somaxconn allows) for the next mig_gate_take().
 *
 * What that guarantees a real source, whatever strangers do: while they
 * do not send whole hellos (trickle, or say nothing), it waits for no
 * handshake of theirs, only for the gate to drain the backlog ahead of
 * it; while they do, it waits behind at most the whole hellos accepted
 * before its own, MIG_GATE_SLOTS at a time, each for a grace at most.
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
 * io_uring), a connection in the room one, so a full house needs
 * MIG_GATE_ROOM + 2 * MIG_GATE_SLOTS beside the caller's own; accept(2)
 * running out (EMFILE, ENFILE) makes the room's oldest unheard connection
 * give way, or with none cuts a handshake; a handshake whose io_uring
 * cannot be made is refused.  Leave room (RLIMIT_NOFILE; kvmdirty-migrate
 * raises its soft limit to 65536 where the hard one allows).
 */
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "session.h"

#define MIG_GATE_SLOTS 64
#define MIG_GATE_BACKLOG 4096
#define MIG_GATE_ROOM 4096	  /* connections waiting for their hellos, or for a slot */
#define MIG_GATE_HELLO_MIN_MS 100 /* the least time for a hello, from accept, with four round trips */
#define MIG_GATE_GRACE_MS 250	  /* a lone handshake's grace, from its slot, with four round trips */
#define MIG_GATE_GRACE_MIN_MS 25  /* ... shrunk so far, where more whole hellos wait than there are slots */
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
 * A gate over lfd (a stream socket, bound: made to listen with its
 * backlog raised to MIG_GATE_BACKLOG, and non-blocking while the gate
 * lives; mig_gate_free() gives its flags back, and it is still the
 * caller's to close).  o is copied; o->psk and o->log_ctx must outlive
 * the gate.  0, or -EPROTOTYPE (not a stream socket), -ENOTSOCK (not a
 * socket), listen(2)'s -errno, -ENOMEM.
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
/* What the gate did with the connections it accepted, so far. */
struct mig_gate_stats {
	uint64_t accepted;   /* taken from the backlog */
	uint64_t handshakes; /* given a slot, their hellos whole */
	uint64_t unheard;    /* turned away from the room (hellos not whole, or no place) */
	uint64_t cut;	     /* handshakes cut to make room */
};

/* The counts so far; from any thread. */
void mig_gate_stats(struct mig_gate *gate, struct mig_gate_stats *st);

unsigned int mig_gate_wrong_proofs(struct mig_gate *gate, const struct sockaddr *sa, uid_t uid);

void mig_gate_free(struct mig_gate *gate);

#endif
