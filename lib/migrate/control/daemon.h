/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_DAEMON_H
#define KVMDIRTY_MIGRATE_DAEMON_H

/*
 * The daemon's side of a migration's status: the control socket that
 * answers query, resolve, set, cancel and subscribe
 * (kvmdirty-migrate-control(7)) over the
 * engine's status (status.h), opened at --control PATH from the start, or
 * at a default path the moment an outcome becomes unknown.
 */
#include <stdbool.h>

#include "control.h"
#include "status.h"

struct mig_daemon {
	struct mig_status st;
	const char *side;	   /* "source", "destination": the daemon's lines name it */
	const char *control_path;  /* --control, or NULL */
	struct mig_control *ctl;   /* open, or NULL */
	char path[108];		   /* where it listens */
	/*
	 * Its lines (a resolve or cancel through the socket, the socket
	 * opened, an unknown outcome) without the "kvmdirty-migrate: SIDE: "
	 * of stderr's; NULL: on stderr, so prefixed
	 */
	void (*log)(void *ctx, const char *line);
	void *log_ctx;
	bool no_default; /* an unknown outcome opens no socket at the default path */
};

/*
 * With --control PATH, listen there now; 0, or -errno after one line (on
 * stderr, or to log: see above; NULL for stderr).  params (a source's: its
 * options; NULL for a destination) are the status's from the start, so a
 * set that comes before the migration begins changes only what it names.
 */
int mig_daemon_init(struct mig_daemon *d, bool dest, const char *control_path, const struct mig_params *params,
		    void (*log)(void *ctx, const char *line), void *log_ctx);
void mig_daemon_fini(struct mig_daemon *d);
/*
 * The engine's unknown() callback (ctx: the daemon): the line, and (unless
 * no_default) the control socket opened at the default path if none is,
 * with a line saying where and how to resolve.
 */
void mig_daemon_unknown(void *ctx, const char *line);

#endif
