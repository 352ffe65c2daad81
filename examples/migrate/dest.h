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
#include "transport.h"

struct mig_recv_result {
	bool hashed;	  /* pages came with hashes, and every page's latest copy matched */
	uint64_t records; /* records before END */
	uint64_t pages;	  /* pages received, DATA and ZERO, re-sent ones counted again */
};

/*
 * Receive a stream from rd into g and load its vCPUs' state.  0 once the
 * stream is complete: header and regions match g, every page of every
 * region arrived, with MIG_F_PAGE_HASH every page's latest copy matched
 * its hash, END's checksum matched and nothing followed END.  On a
 * refusal the vCPUs are untouched (never loaded from a refused stream)
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
};

/*
 * The same over a connected socket, answering the source with the outcome
 * (struct mig_ack, sealed in a session with a key).  The session first
 * (session.h): a source that fails authentication is refused (-EACCES,
 * "authentication" in err) before any byte of its stream is read, and
 * with several connections each runs on a thread of its own, hashing what
 * it lands.  Returns 0 only when the stream was accepted and the answer
 * went out: a guest whose source may not know is not to be run.
 */
int mig_recv(const struct mig_guest *g, int fd, const struct mig_recv_opts *o, struct mig_recv_result *res,
	     char *err, size_t len);

#endif
