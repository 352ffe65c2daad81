// SPDX-License-Identifier: MIT
/* The daemon's control socket over a migration's status (daemon.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"

static int query(void *ctx, char *buf, size_t len)
{
	struct mig_daemon *d = ctx;

	return mig_status_query(&d->st, buf, len);
}

static int resolve(void *ctx, bool run_here, char *err, size_t len)
{
	struct mig_daemon *d = ctx;
	int ret = mig_status_resolve(&d->st, run_here, err, len);

	if (ret == 0)
		fprintf(stderr, "kvmdirty-migrate: %s: resolved through the control socket: %s\n", d->side,
			run_here ? "the guest runs here" : "the guest is dropped here");
	return ret;
}

static const struct mig_control_ops ops = { .query = query, .resolve = resolve };

static int open_control(struct mig_daemon *d, const char *path, const char *what)
{
	char err[256];
	int ret;

	snprintf(d->path, sizeof(d->path), "%s", path);
	ret = mig_control_open(d->path, &ops, d, &d->ctl, err, sizeof(err));
	if (ret < 0)
		fprintf(stderr, "kvmdirty-migrate: %s: %s: %s\n", d->side, what, err);
	return ret;
}

int mig_daemon_init(struct mig_daemon *d, bool dest, const char *control_path)
{
	memset(d, 0, sizeof(*d));
	mig_status_init(&d->st, dest);
	d->side = dest ? "destination" : "source";
	d->control_path = control_path;
	if (control_path && open_control(d, control_path, "--control") < 0) {
		mig_status_destroy(&d->st);
		return -1;
	}
	return 0;
}

void mig_daemon_fini(struct mig_daemon *d)
{
	mig_control_close(d->ctl);
	d->ctl = NULL;
	mig_status_destroy(&d->st);
}

/* A socket path in a new directory only this user may enter: /tmp/kvmdirty-migrate-XXXXXX/control.sock. */
static int private_path(char *buf, size_t len)
{
	char dir[] = "/tmp/kvmdirty-migrate-XXXXXX";

	if (!mkdtemp(dir))
		return -1;
	snprintf(buf, len, "%s/control.sock", dir);
	return 0;
}

void mig_daemon_unknown(void *ctx, const char *line)
{
	struct mig_daemon *d = ctx;
	char path[108];

	fprintf(stderr, "kvmdirty-migrate: %s: %s\n", d->side, line);
	if (!d->ctl) {
		/*
		 * Without one, nothing but a late message from the peer or a kill
		 * ends the wait: where the default path is taken (another user may
		 * have made it first in /tmp), a directory of our own instead.
		 */
		mig_control_default_path(path, sizeof(path));
		if (open_control(d, path, "the default control socket") < 0 && private_path(path, sizeof(path)) == 0)
			open_control(d, path, "no control socket for the unknown outcome");
	}
	if (d->ctl)
		fprintf(stderr, "kvmdirty-migrate: %s: control socket %s: {\"execute\":\"resolve\",\"arguments\":"
			"{\"run\":\"here\"}} or {\"run\":\"nowhere\"}\n", d->side, d->path);
	fflush(stderr);
}
