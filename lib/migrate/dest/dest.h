/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_DEST_H
#define KVMDIRTY_MIGRATE_DEST_H

/*
 * The destination: a stream in, a guest ready to run out.  The guest is
 * one whose vCPUs have not run; its regions must match the source's.
 * Refusals come back as -errno with one line in err naming the field that
 * is wrong, or what was awaited when the peer fell silent or the stream
 * ended.
 */
#include <stdbool.h>
#include <stdint.h>

#include "guest.h"
#include "session.h"
#include "status.h"
#include "transport.h"

struct mig_recv_result {
	bool hashed;	  /* pages came with hashes, and every page's latest copy matched */
	uint64_t records; /* records before END */
	uint64_t pages;	  /* pages received, DATA and ZERO, re-sent ones counted again */
	uint64_t zpages;  /* ... of them, pages that came compressed (DATA_Z) */
	double cpu_s;	  /* CPU seconds of the threads that received the stream (the caller's, lanes', verifier's) */
	/* mig_recv(): HERE (run the guest), THERE (dropped), UNKNOWN (paused; without a status only) */
	enum mig_outcome outcome;
	/*
	 * Post-copy under way (dest-postcopy.h): the guest runs with pages
	 * still at the source, which this brings in; the caller's to wait on
	 * and to free (mig_pc_free()) after the guest stops for good.  NULL:
	 * every page is here.
	 */
	struct mig_pc *pc;
};

/*
 * Receive a stream from rd into g and load its vCPUs' state.  0 once the
 * stream is complete: header and regions match g, every page of every
 * region arrived, with MIG_F_PAGE_HASH every page's latest copy matched
 * its hash, END's checksum matched and nothing followed END.  On a
 * refusal the vCPUs are as they were before the stream (a failed load
 * loads back the ones before it; -ENOTRECOVERABLE where that fails too)
 * and guest memory may hold part of the stream: another stream can be
 * received into the same guest, and must then bring every page again.
 * Pages are hashed on a thread of their own while the next ones are
 * received, or with inline_hash on the calling thread.  Where g's regions
 * have written bitmaps (mig_guest_zero_known()), a DATA record sets its
 * pages' bits before they land and a ZERO record clears only pages whose
 * bit is set: the others are zero already and stay unmapped.
 */
int mig_recv_stream(const struct mig_guest *g, const struct mig_reader *rd, bool inline_hash,
		    struct mig_recv_result *res, char *err, size_t len);
/*
 * The same for a stream of a session that agreed to post-copy (LEFT
 * records taken): *ret_left the pages it left at the source (tests, the
 * fuzzer; nothing of post-copy runs).
 */
int mig_recv_stream_postcopy(const struct mig_guest *g, const struct mig_reader *rd, bool inline_hash,
			     uint64_t *ret_left, struct mig_recv_result *res, char *err, size_t len);

struct mig_recv_opts {
	uint64_t timeout_ms;  /* each wait for the peer (0: none) */
	uint64_t deadline_ms; /* the whole stream (0: none) */
	bool inline_hash;     /* see mig_recv_stream() */
	/*
	 * A key (session.h): the source must prove it holds it before any of
	 * its stream is read, and every record is sealed.  NULL: plain
	 * streams, and sessions without a key.  encrypt: refuse a session
	 * whose records are not encrypted.
	 */
	const struct mig_psk *psk;
	bool encrypt;
	/*
	 * The other connections of a session of several: the next connection
	 * within timeout_ms (an fd, or -errno with a reason in err).  NULL: a
	 * session of one connection only.
	 */
	int (*accept)(void *ctx, uint64_t timeout_ms, char *err, size_t len);
	void *accept_ctx;
	/* a line for each connection refused while the session gathers its own (or NULL) */
	void (*log)(void *ctx, const char *line);
	void *log_ctx;
	/*
	 * The name this destination answers to (session.h): a source that
	 * means another is refused.  NULL: the address each connection
	 * arrived on ("IP:PORT", "[IPv6]:PORT", "unix:PATH").
	 */
	const char *name;
	/*
	 * Where the handoff's outcome is kept, queried and resolved (status.h;
	 * the caller inits it).  With one, an unknown outcome is waited out in
	 * mig_recv() until a late COMMIT or ABORT, or a resolve, decides it;
	 * without (NULL), mig_recv() returns -EINPROGRESS at once, the guest
	 * loaded and paused, its fate the caller's.
	 */
	struct mig_status *status;
	/* once, when the outcome becomes unknown: one line saying why (or NULL) */
	void (*unknown)(void *ctx, const char *line);
	void *unknown_ctx;
	/* post-copy is taken (a source that may leave pages behind): the guest must have a pause */
	bool postcopy;
};

/*
 * The same over a connected socket, then the handoff (handoff.h): READY,
 * the source's COMMIT or ABORT, ACK; a refusal is answered with REFUSED
 * (all sealed in a session with a key).  The session first (session.h): a
 * source that fails authentication is refused (-EACCES, "authentication"
 * in err) before any byte of its stream is read, and with several
 * connections each runs on a thread of its own, hashing what it lands.
 * Returns 0 only when the source committed (or a resolve said run here):
 * run the guest.  Otherwise the guest must not run: -errno for a refused
 * stream, -ECANCELED for one dropped at the handoff (ABORT, a resolve, a
 * message that was neither), each with the vCPUs loaded back as they were
 * before the stream and memory fit for another stream, which must bring
 * every page again; -ENOTRECOVERABLE where the vCPUs could not be loaded
 * back (take no other stream); -EINPROGRESS (no status) for an unknown
 * outcome.  res->outcome says the same.  err: one line.
 */
int mig_recv(const struct mig_guest *g, int fd, const struct mig_recv_opts *o, struct mig_recv_result *res,
	     char *err, size_t len);

/* The session options mig_recv() uses (for a gate, gate.h, in front of mig_recv_session()). */
void mig_recv_session_opts(const struct mig_recv_opts *o, struct mig_session_opts *so);

struct mig_pc;

/*
 * mig_recv() over a session already taken (mig_gate_take(),
 * mig_session_accept()): the stream and the handoff, the same results.
 * s is the call's: freed (its own fds closed) whatever the outcome.
 */
int mig_recv_session(const struct mig_guest *g, struct mig_session *s, const struct mig_recv_opts *o,
		     struct mig_recv_result *res, char *err, size_t len);

/* Load fresh[0..n) into g's vCPUs: 0, or -errno with one line in err. */
int mig_recv_restore(const struct mig_guest *g, const struct mig_vcpu_state *fresh, unsigned int n, char *err,
		     size_t len);

#endif
