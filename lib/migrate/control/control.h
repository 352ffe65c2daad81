/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_CONTROL_H
#define KVMDIRTY_MIGRATE_CONTROL_H

/*
 * The daemon's control socket: a Unix stream socket that speaks JSON lines
 * in QMP's shape (kvmdirty-migrate-control(7)), so that an orchestrator
 * can ask how a migration stands and resolve one whose outcome is unknown.
 * The server runs on a thread of its own and calls the ops below from that
 * thread only, one call at a time; whatever they share with the engine's
 * threads they guard themselves.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "json.h"

/* Limits, as the manual page gives them. */
#define MIG_CONTROL_MAX_LINE 65536     /* bytes of a request, without its newline */
#define MIG_CONTROL_MAX_CLIENTS 16     /* connected at once */
#define MIG_CONTROL_MAX_OUTPUT 262144  /* replies a client has not read yet; past this it is dropped */
#define MIG_CONTROL_QUERY_SIZE 16384   /* the buffer query() fills */
#define MIG_CONTROL_ERR_SIZE 256       /* the buffer resolve() writes its reason in */
/*
 * A subscriber's events waiting in the server beyond what its socket took:
 * past this none is taken for it (the engine never waits), and those it
 * misses are told in one events_lost event once it reads again.
 */
#define MIG_CONTROL_EVENT_BACKLOG 16384
#define MIG_CONTROL_EVENT_LINE 1024    /* the buffer event() fills */

struct mig_control;

struct mig_control_ops {
	/*
	 * Fill buf (len is MIG_CONTROL_QUERY_SIZE) with the members of the
	 * query's "return" object, as JSON text of one object ("{...}"),
	 * NUL-terminated, in UTF-8; 0, or -errno.  Called from the server's
	 * thread.  Text that is not one JSON object is answered with an
	 * error, not passed on.
	 */
	int (*query)(void *ctx, char *buf, size_t len);
	/*
	 * Resolve an unknown outcome: run_here true for {"run":"here"}, false
	 * for {"run":"nowhere"}.  0, or -errno with a one-line reason in err
	 * (len is MIG_CONTROL_ERR_SIZE; sent back as the error's desc).  From
	 * the server's thread; the server answers no one while it runs.
	 */
	int (*resolve)(void *ctx, bool run_here, char *err, size_t len);
	/*
	 * set: args is the request's "arguments" object (NULL: none), checked
	 * by the op; 0, or -errno with a one-line reason in err.  NULL: set is
	 * not a command of this server.
	 */
	int (*set)(void *ctx, const struct mig_json *args, char *err, size_t len);
	/*
	 * cancel: 0, or -errno with a one-line reason in err and the error's
	 * class in *class (NULL: GenericError).  NULL: not a command.
	 */
	int (*cancel)(void *ctx, const char **class, char *err, size_t len);
	/* postcopy-start: as cancel (0, or -errno, err and *class).  NULL: not a command. */
	int (*postcopy_start)(void *ctx, const char **class, char *err, size_t len);
	/* recover (post-copy paused): addr NULL or the one given; as cancel.  NULL: not a command. */
	int (*recover)(void *ctx, const char *addr, const char **class, char *err, size_t len);
	/*
	 * Events (subscribe): event_fd() once, at open: an fd that is readable
	 * while there are events not yet taken (the server reads it down; it
	 * stays the op's).  event_head(): the number of the next event, where a
	 * new subscriber starts.  event(): event *seq's line (newline and NUL
	 * included, len is MIG_CONTROL_EVENT_LINE) and its length, *seq moved
	 * past it, or 0 when there is none yet; events no longer kept are
	 * skipped, counted into *lost, and told first in one events_lost line
	 * (the op's to write).  NULL: no subscribe.
	 */
	int (*event_fd)(void *ctx);
	uint64_t (*event_head)(void *ctx);
	size_t (*event)(void *ctx, uint64_t *seq, char *buf, size_t len, uint64_t *lost);
};

/*
 * Listen on the Unix socket at path (mode 0600 from creation: no window
 * where it is wider; a stale socket file nobody listens on is replaced; one
 * in use, or a path that exists and is not a socket, is refused), serve
 * clients on a thread of its own until mig_control_close().  ops and ctx
 * must outlive it.  0 or -errno with a one-line reason naming the path in
 * err.
 */
int mig_control_open(const char *path, const struct mig_control_ops *ops, void *ctx, struct mig_control **ret,
		     char *err, size_t len);

/*
 * Stop the thread (after the op it is in, if any, returns), close every
 * client, unlink the socket if it is still the one this server made.  NULL
 * is a no-op.
 */
void mig_control_close(struct mig_control *c);

/*
 * The default path for a daemon of this pid:
 * $XDG_RUNTIME_DIR/kvmdirty-migrate-PID.sock where that variable names an
 * absolute path to a directory that exists, else
 * /tmp/kvmdirty-migrate-PID.sock.
 */
void mig_control_default_path(char *buf, size_t len);

#endif
