// SPDX-License-Identifier: MIT
/* The daemon's control socket over a migration's status (daemon.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon.h"
#include "errf.h"
#include "transport.h"

static void say(struct mig_daemon *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(struct mig_daemon *d, const char *fmt, ...)
{
	char line[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (d->log) {
		d->log(d->log_ctx, line);
		return;
	}
	fprintf(stderr, "kvmdirty-migrate: %s: %s\n", d->side, line);
	fflush(stderr);
}

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
		say(d, "resolved through the control socket: %s",
		    run_here ? "the guest runs here" : "the guest is dropped here");
	return ret;
}

/* One member of set's arguments into p: an integer, a boolean for throttle, a name for compress; else the error, by name. */
static int set_member(const struct mig_json_member *m, struct mig_params *p, unsigned int *mask, char *err,
		      size_t len)
{
	static const struct {
		const char *name;
		unsigned int bit;
	} names[] = {
		{ "downtime_ms", MIG_PARAM_DOWNTIME },	 { "max_passes", MIG_PARAM_MAX_PASSES },
		{ "timeout_ms", MIG_PARAM_TIMEOUT },	 { "max_bandwidth", MIG_PARAM_MAX_BANDWIDTH },
		{ "throttle", MIG_PARAM_THROTTLE },	 { "compress", MIG_PARAM_COMPRESS },
	};
	const char *name = m->key.str.s;
	unsigned int i, bit = 0;
	int ret;

	for (i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strlen(names[i].name) == m->key.str.len && !strcmp(names[i].name, name))
			bit = names[i].bit;
	if (!bit)
		return mig_errf(err, len, -EINVAL, "Parameter '%s' is unexpected", name);
	if (*mask & bit)
		return mig_errf(err, len, -EINVAL, "Parameter '%s' is given twice", name);
	*mask |= bit;
	if (bit == MIG_PARAM_THROTTLE) {
		if (m->v.type != MIG_JSON_TRUE && m->v.type != MIG_JSON_FALSE)
			return mig_errf(err, len, -EINVAL, "Invalid parameter type for '%s', expected: boolean", name);
		p->throttle = m->v.type == MIG_JSON_TRUE;
		return 0;
	}
	if (bit == MIG_PARAM_COMPRESS) {
		static const char *const modes[] = { "off", "auto", "zstd" };

		for (i = 0; m->v.type == MIG_JSON_STRING && i < 3; i++)
			if (strlen(modes[i]) == m->v.str.len && !strcmp(modes[i], m->v.str.s)) {
				p->compress = (int)i;
				return 0;
			}
		return mig_errf(err, len, -EINVAL, "Invalid parameter value for '%s', expected: auto, zstd or off", name);
	}
	if (m->v.type != MIG_JSON_NUMBER)
		return mig_errf(err, len, -EINVAL, "Invalid parameter type for '%s', expected: integer", name);
	ret = mig_params_check(name, m->v.num, err, len);
	if (ret < 0)
		return ret;
	*(bit == MIG_PARAM_DOWNTIME ? &p->downtime_ms : bit == MIG_PARAM_MAX_PASSES ? &p->max_passes :
	  bit == MIG_PARAM_TIMEOUT ? &p->timeout_ms : &p->max_bandwidth) = (uint64_t)m->v.num;
	return 0;
}

/* set: every member checked before any is changed (all or nothing); the source's only. */
static int set(void *ctx, const struct mig_json *args, char *err, size_t len)
{
	struct mig_daemon *d = ctx;
	struct mig_params p = { 0 };
	unsigned int mask = 0;
	size_t i;
	int ret;

	if (d->st.dest)
		return mig_errf(err, len, -EOPNOTSUPP, "set is the source's: this is the destination");
	for (i = 0; args && i < args->obj.n; i++) {
		ret = set_member(&args->obj.m[i], &p, &mask, err, len);
		if (ret < 0)
			return ret;
	}
	return mig_status_set(&d->st, &p, mask, err, len);
}

static int cancel(void *ctx, const char **class, char *err, size_t len)
{
	struct mig_daemon *d = ctx;
	int ret = mig_status_cancel(&d->st, err, len);

	if (ret == -EALREADY)
		*class = "CommitSent";
	else if (ret == -ENOENT)
		*class = "NotActive";
	if (ret == 0)
		say(d, "cancel asked through the control socket");
	return ret;
}

static int postcopy_start(void *ctx, const char **class, char *err, size_t len)
{
	struct mig_daemon *d = ctx;
	int ret = mig_status_postcopy_start(&d->st, err, len);

	if (ret == -EALREADY)
		*class = "PastPrecopy";
	else if (ret == -ENOENT)
		*class = "NotActive";
	if (ret == 0)
		say(d, "post-copy asked through the control socket");
	return ret;
}

static int recover(void *ctx, const char *addr, const char **class, char *err, size_t len)
{
	struct mig_daemon *d = ctx;
	char why[200];
	int ret = addr ? mig_addr_check(addr, why, sizeof(why)) : 0;

	if (ret < 0)
		return mig_errf(err, len, ret, "%s", why);
	ret = mig_status_recover(&d->st, addr, err, len);
	if (ret == -ENOENT)
		*class = "NotActive";
	if (ret == 0)
		say(d, "post-copy: recover asked through the control socket");
	return ret;
}

static int event_fd(void *ctx)
{
	struct mig_daemon *d = ctx;

	return mig_status_event_fd(&d->st);
}

static uint64_t event_head(void *ctx)
{
	struct mig_daemon *d = ctx;

	return mig_status_event_head(&d->st);
}

static size_t event(void *ctx, uint64_t *seq, char *buf, size_t len, uint64_t *lost)
{
	struct mig_daemon *d = ctx;

	return mig_status_event_get(&d->st, seq, buf, len, lost);
}

static const struct mig_control_ops ops = { .query = query, .resolve = resolve, .set = set, .cancel = cancel,
					    .postcopy_start = postcopy_start, .recover = recover, .event_fd = event_fd, .event_head = event_head, .event = event };

static int open_control(struct mig_daemon *d, const char *path, const char *what)
{
	char err[256];
	int ret;

	snprintf(d->path, sizeof(d->path), "%s", path);
	ret = mig_control_open(d->path, &ops, d, &d->ctl, err, sizeof(err));
	if (ret < 0)
		say(d, "%s: %s", what, err);
	return ret;
}

int mig_daemon_init(struct mig_daemon *d, bool dest, const char *control_path, const struct mig_params *params,
		    void (*log)(void *ctx, const char *line), void *log_ctx)
{
	memset(d, 0, sizeof(*d));
	d->log = log;
	d->log_ctx = log_ctx;
	mig_status_init(&d->st, dest);
	if (params) {
		d->st.params = *params;
		/* its options stand as if set: a set before the migration changes only what it names */
		d->st.params_set = MIG_PARAM_DOWNTIME | MIG_PARAM_MAX_PASSES | MIG_PARAM_TIMEOUT |
				   MIG_PARAM_MAX_BANDWIDTH | MIG_PARAM_THROTTLE | MIG_PARAM_COMPRESS;
	}
	d->side = dest ? "destination" : "source";
	d->control_path = control_path;
	if (control_path) {
		int ret = open_control(d, control_path, "--control");

		if (ret < 0) {
			mig_status_destroy(&d->st);
			return ret;
		}
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

	say(d, "%s", line);
	if (!d->ctl && !d->no_default) {
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
		say(d, "control socket %s: {\"execute\":\"resolve\",\"arguments\":{\"run\":\"here\"}} or "
		    "{\"run\":\"nowhere\"}", d->path);
}
