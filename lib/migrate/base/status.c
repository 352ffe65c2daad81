// SPDX-License-Identifier: MIT
/* A migration side's status: written by the engine, read and resolved by anyone (status.h). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "errf.h"
#include "status.h"

void mig_status_init(struct mig_status *s, bool dest)
{
	memset(s, 0, sizeof(*s));
	pthread_mutex_init(&s->lock, NULL);
	pthread_cond_init(&s->cond, NULL);
	s->dest = dest;
	s->state = dest ? "waiting" : "setup";
	s->wake_fd = -1;
	s->event_fd = -1;
	s->sink_fd = -1;
}

void mig_status_reset(struct mig_status *s)
{
	pthread_mutex_lock(&s->lock);
	s->state = s->dest ? "receiving" : "setup";
	s->stream++;
	s->pass = s->bytes_sent = s->remaining_bytes = 0;
	s->outcome = MIG_OUTCOME_PENDING;
	s->resolved = false;
	s->why[0] = 0;
	s->wake_fd = -1;
	s->postcopy_on = s->pc_paused = s->recover_asked = false;
	s->recover_addr[0] = 0;
	s->pc_missing = s->pc_faults = 0;
	s->pc_p50_us = s->pc_p99_us = 0;
	pthread_mutex_unlock(&s->lock);
}

void mig_status_destroy(struct mig_status *s)
{
	if (s->event_fd >= 0)
		close(s->event_fd);
	pthread_cond_destroy(&s->cond);
	pthread_mutex_destroy(&s->lock);
}

void mig_status_set_state(struct mig_status *s, const char *state)
{
	pthread_mutex_lock(&s->lock);
	s->state = state;
	pthread_mutex_unlock(&s->lock);
}

void mig_status_progress(struct mig_status *s, uint64_t pass, uint64_t bytes_sent, uint64_t remaining_bytes)
{
	pthread_mutex_lock(&s->lock);
	s->pass = pass;
	s->bytes_sent = bytes_sent;
	s->remaining_bytes = remaining_bytes;
	pthread_mutex_unlock(&s->lock);
}

static bool decided(enum mig_outcome o)
{
	return o == MIG_OUTCOME_HERE || o == MIG_OUTCOME_THERE;
}

enum mig_outcome mig_status_unknown(struct mig_status *s, int fd, const char *why)
{
	enum mig_outcome o;

	pthread_mutex_lock(&s->lock);
	if (!decided(s->outcome)) {
		s->outcome = MIG_OUTCOME_UNKNOWN;
		s->state = "unknown";
		s->wake_fd = fd;
		snprintf(s->why, sizeof(s->why), "%s", why);
	}
	o = s->outcome;
	pthread_mutex_unlock(&s->lock);
	return o;
}

/* Under the lock: o becomes the outcome, and whoever waits for one wakes. */
static void settle(struct mig_status *s, enum mig_outcome o, const char *why)
{
	s->outcome = o;
	s->state = o == MIG_OUTCOME_HERE ? (s->dest ? "completed" : "failed") : (s->dest ? "failed" : "completed");
	s->wake_fd = -1;
	snprintf(s->why, sizeof(s->why), "%s", why);
	pthread_cond_broadcast(&s->cond);
}

enum mig_outcome mig_status_decide(struct mig_status *s, enum mig_outcome o, const char *why)
{
	pthread_mutex_lock(&s->lock);
	if (!decided(s->outcome))
		settle(s, o, why);
	o = s->outcome;
	pthread_mutex_unlock(&s->lock);
	return o;
}

enum mig_outcome mig_status_wait(struct mig_status *s)
{
	enum mig_outcome o;

	pthread_mutex_lock(&s->lock);
	while (!decided(s->outcome))
		pthread_cond_wait(&s->cond, &s->lock);
	o = s->outcome;
	pthread_mutex_unlock(&s->lock);
	return o;
}

enum mig_outcome mig_status_outcome(struct mig_status *s)
{
	enum mig_outcome o;

	pthread_mutex_lock(&s->lock);
	o = s->outcome;
	pthread_mutex_unlock(&s->lock);
	return o;
}

void mig_status_why(struct mig_status *s, char *buf, size_t len)
{
	pthread_mutex_lock(&s->lock);
	snprintf(buf, len, "%s", s->why);
	pthread_mutex_unlock(&s->lock);
}

const char *mig_outcome_name(enum mig_outcome o)
{
	static const char *const names[] = { "pending", "here", "there", "unknown" };

	return (unsigned int)o < sizeof(names) / sizeof(names[0]) ? names[o] : "?";
}

void mig_event_str(char *buf, size_t len, const char *s)
{
	size_t i, k = 0;

	for (i = 0; s && s[i] && k + 2 < len; i++) {
		unsigned char c = (unsigned char)s[i];

		if (c == '"' || c == '\\')
			buf[k++] = '\\';
		buf[k++] = c < 0x20 ? '?' : (char)c;
	}
	if (len)
		buf[k] = 0;
}

/* s as JSON text into buf, escaping the one free-form string. */
static int query_locked(const struct mig_status *s, char *buf, size_t len)
{
	char why[2 * sizeof(s->why)];
	size_t k;
	int n;

	mig_event_str(why, sizeof(why), s->why);
	k = strlen(why);
	n = snprintf(buf, len,
		     "{\"side\":\"%s\",\"state\":\"%s\",\"stream\":%" PRIu64 ",\"pass\":%" PRIu64 ",\"bytes_sent\":%" PRIu64
		     ",\"remaining_bytes\":%" PRIu64 ",\"outcome\":\"%s\",\"resolved\":%s%s%s%s",
		     s->dest ? "destination" : "source", s->state, s->stream, s->pass, s->bytes_sent, s->remaining_bytes,
		     mig_outcome_name(s->outcome), s->resolved ? "true" : "false", k ? ",\"why\":\"" : "", why,
		     k ? "\"" : "");
	if (n < 0 || (size_t)n >= len)
		return -ENOSPC;
	if (!s->dest)
		n += snprintf(buf + n, len - (size_t)n,
			      ",\"cancel\":\"%s\",\"parameters\":{\"downtime_ms\":%" PRIu64 ",\"max_bandwidth\":%" PRIu64
			      ",\"max_passes\":%" PRIu64 ",\"timeout_ms\":%" PRIu64 ",\"throttle\":%s,\"compress\":\"%s\"}",
			      s->cancelled ? "done" : s->cancel ? "asked" : "none", s->params.downtime_ms,
			      s->params.max_bandwidth, s->params.max_passes, s->params.timeout_ms,
			      s->params.throttle ? "true" : "false",
			      s->params.compress == 1 ? "auto" : s->params.compress == 2 ? "zstd" : "off");
	if (s->postcopy_on && (size_t)n < len)
		n += snprintf(buf + n, len - (size_t)n,
			      ",\"postcopy\":{\"missing_pages\":%" PRIu64 ",\"faults\":%" PRIu64
			      ",\"fault_p50_us\":%.1f,\"fault_p99_us\":%.1f}",
			      s->pc_missing, s->pc_faults, s->pc_p50_us, s->pc_p99_us);
	if ((size_t)n + 1 >= len)
		return -ENOSPC;
	strcpy(buf + n, "}");
	return 0;
}

int mig_status_postcopy_start(struct mig_status *s, char *err, size_t len)
{
	int ret = 0;

	pthread_mutex_lock(&s->lock);
	if (s->dest)
		ret = mig_errf(err, len, -EOPNOTSUPP, "postcopy-start is the source's: this is the destination");
	else if (!s->running || decided(s->outcome) || s->outcome == MIG_OUTCOME_UNKNOWN)
		ret = mig_errf(err, len, -ENOENT, "no migration to switch: none runs (%s)", s->state);
	else if (!s->postcopy_able)
		ret = mig_errf(err, len, -EOPNOTSUPP, "this migration was begun without post-copy (send --postcopy)");
	else if (s->postcopy_on || strcmp(s->state, "precopy") != 0)
		ret = mig_errf(err, len, -EALREADY, "the migration is past pre-copy (%s)", s->state);
	else
		__atomic_store_n(&s->postcopy_asked, true, __ATOMIC_RELAXED);
	pthread_mutex_unlock(&s->lock);
	return ret;
}

void mig_status_postcopy_paused(struct mig_status *s, bool paused)
{
	pthread_mutex_lock(&s->lock);
	s->pc_paused = paused;
	if (!paused)
		s->recover_asked = false;
	pthread_mutex_unlock(&s->lock);
}

int mig_status_recover(struct mig_status *s, const char *addr, char *err, size_t len)
{
	int ret = 0;

	pthread_mutex_lock(&s->lock);
	if (!s->pc_paused)
		ret = mig_errf(err, len, -ENOENT, "nothing to recover: post-copy is not paused (%s)", s->state);
	else if (addr && strlen(addr) >= sizeof(s->recover_addr))
		ret = mig_errf(err, len, -ENAMETOOLONG, "the address is longer than %zu bytes",
			       sizeof(s->recover_addr) - 1);
	else {
		if (addr)
			snprintf(s->recover_addr, sizeof(s->recover_addr), "%s", addr);
		s->recover_asked = true;
		pthread_cond_broadcast(&s->cond);
	}
	pthread_mutex_unlock(&s->lock);
	return ret;
}

bool mig_status_recover_take(struct mig_status *s, char *addr, size_t len)
{
	bool asked;

	pthread_mutex_lock(&s->lock);
	asked = s->recover_asked;
	s->recover_asked = false;
	if (addr && len)
		snprintf(addr, len, "%s", asked ? s->recover_addr : "");
	pthread_mutex_unlock(&s->lock);
	return asked;
}

bool mig_status_recover_pending(struct mig_status *s)
{
	bool asked;

	pthread_mutex_lock(&s->lock);
	asked = s->recover_asked;
	pthread_mutex_unlock(&s->lock);
	return asked;
}

void mig_status_recover_addr(struct mig_status *s, char *addr, size_t len)
{
	pthread_mutex_lock(&s->lock);
	snprintf(addr, len, "%s", s->recover_addr);
	pthread_mutex_unlock(&s->lock);
}

void mig_status_compress_able(struct mig_status *s, bool able)
{
	pthread_mutex_lock(&s->lock);
	s->compress_able = able;
	pthread_mutex_unlock(&s->lock);
}

bool mig_status_compress_is_able(struct mig_status *s)
{
	bool able;

	pthread_mutex_lock(&s->lock);
	able = s->compress_able;
	pthread_mutex_unlock(&s->lock);
	return able;
}

void mig_status_postcopy_able(struct mig_status *s, bool able)
{
	pthread_mutex_lock(&s->lock);
	s->postcopy_able = able;
	pthread_mutex_unlock(&s->lock);
}

bool mig_status_postcopy_asked(struct mig_status *s)
{
	return __atomic_load_n(&s->postcopy_asked, __ATOMIC_RELAXED);
}

void mig_status_postcopy_progress(struct mig_status *s, uint64_t missing, uint64_t faults, double p50_us,
				  double p99_us)
{
	pthread_mutex_lock(&s->lock);
	s->postcopy_on = true;
	s->pc_missing = missing;
	s->pc_faults = faults;
	s->pc_p50_us = p50_us;
	s->pc_p99_us = p99_us;
	pthread_mutex_unlock(&s->lock);
}

int mig_status_query(struct mig_status *s, char *buf, size_t len)
{
	int ret;

	pthread_mutex_lock(&s->lock);
	ret = query_locked(s, buf, len);
	pthread_mutex_unlock(&s->lock);
	return ret;
}

int mig_status_resolve(struct mig_status *s, bool run_here, char *err, size_t len)
{
	int ret = 0;

	pthread_mutex_lock(&s->lock);
	if (s->outcome != MIG_OUTCOME_UNKNOWN) {
		ret = mig_errf(err, len, -EINVAL, "nothing to resolve: the outcome is %s (%s)",
			       mig_outcome_name(s->outcome), s->outcome == MIG_OUTCOME_PENDING ? "the migration is under way"
											      : "known already");
	} else {
		/* the engine may be reading the peer without a timeout: end that read */
		if (s->wake_fd >= 0)
			shutdown(s->wake_fd, SHUT_RD);
		s->resolved = true;
		settle(s, run_here ? MIG_OUTCOME_HERE : MIG_OUTCOME_THERE,
		       run_here ? "resolved: run here" : "resolved: run nowhere");
	}
	pthread_mutex_unlock(&s->lock);
	return ret;
}

/* ---- steering ---- */

static ssize_t sink_write(int fd, const char *buf, size_t n);
static bool sink_owed(struct mig_status *s);

static bool decided_locked(const struct mig_status *s)
{
	return decided(s->outcome);
}

/* The members of from that mask names, put over to. */
static void overlay(struct mig_params *to, const struct mig_params *from, unsigned int mask)
{
	if (mask & MIG_PARAM_DOWNTIME)
		to->downtime_ms = from->downtime_ms;
	if (mask & MIG_PARAM_MAX_PASSES)
		to->max_passes = from->max_passes;
	if (mask & MIG_PARAM_TIMEOUT)
		to->timeout_ms = from->timeout_ms;
	if (mask & MIG_PARAM_MAX_BANDWIDTH)
		to->max_bandwidth = from->max_bandwidth;
	if (mask & MIG_PARAM_THROTTLE)
		to->throttle = from->throttle;
	if (mask & MIG_PARAM_COMPRESS)
		to->compress = from->compress;
}

/* The last migration of this status ended: the next starts afresh (the lock held). */
static void afresh_locked(struct mig_status *s)
{
	if (!decided_locked(s))
		return;
	s->outcome = MIG_OUTCOME_PENDING;
	s->resolved = false;
	s->why[0] = 0;
	__atomic_store_n(&s->cancel, false, __ATOMIC_RELAXED);
	s->committed = s->cancelled = false;
	s->pass = s->bytes_sent = s->remaining_bytes = 0;
	__atomic_store_n(&s->postcopy_asked, false, __ATOMIC_RELAXED);
	s->postcopy_able = s->postcopy_on = false;
	s->compress_able = false;
	s->pc_paused = s->recover_asked = false;
	s->recover_addr[0] = 0;
	s->pc_missing = s->pc_faults = 0;
	s->pc_p50_us = s->pc_p99_us = 0;
}

int mig_status_prepare(struct mig_status *s)
{
	int ret = 0;

	pthread_mutex_lock(&s->lock);
	if (s->running)
		ret = -EBUSY;
	else
		afresh_locked(s);
	pthread_mutex_unlock(&s->lock);
	return ret;
}

bool mig_status_abandon(struct mig_status *s, const char *why)
{
	bool cancelled = false;

	pthread_mutex_lock(&s->lock);
	if (!s->running && s->outcome == MIG_OUTCOME_PENDING) {
		cancelled = __atomic_load_n(&s->cancel, __ATOMIC_RELAXED);
		s->cancelled = cancelled;
		s->outcome = MIG_OUTCOME_HERE;
		s->state = "failed";
		snprintf(s->why, sizeof(s->why), "%s", cancelled ? "cancelled before it began: the guest runs here" : why);
	}
	pthread_mutex_unlock(&s->lock);
	return cancelled;
}

int mig_status_begin(struct mig_status *s, const struct mig_params *from_opts)
{
	pthread_mutex_lock(&s->lock);
	if (s->running) {
		pthread_mutex_unlock(&s->lock);
		return -EBUSY;
	}
	afresh_locked(s);
	/* its options' parameters, but for the members set since the last migration ended (or before the first) */
	{
		struct mig_params p = *from_opts;

		overlay(&p, &s->params, s->params_set);
		s->params = p;
		s->params_set = 0;
		/* the session offers compression as these say: a set from now on is judged by it (under this lock) */
		s->compress_able = p.compress != 0;
	}
	s->running = true;
	s->n_cancel_fd = 0;
	s->state = "setup";
	pthread_mutex_unlock(&s->lock);
	return 0;
}

/* What the sink's fd still owes (a line in part, a lost count), for at most 100 ms in all. */
static void sink_settle(struct mig_status *s)
{
	int i;

	for (i = 0; i < 100 && s->sink_fd >= 0 && !sink_owed(s); i++)
		poll(&(struct pollfd){ .fd = s->sink_fd, .events = POLLOUT }, 1, 1);
}

void mig_status_end(struct mig_status *s)
{
	pthread_mutex_lock(&s->lock);
	sink_settle(s);
	s->running = false;
	s->n_cancel_fd = 0;
	/* the next migration takes its options' parameters, but for what a set names before it */
	s->sink = NULL;
	s->sink_ctx = NULL;
	s->sink_fd = -1;
	s->sink_lost = s->sink_rest_len = 0;
	pthread_mutex_unlock(&s->lock);
}

void mig_status_show_params(struct mig_status *s, const struct mig_params *p)
{
	struct mig_params cur;
	unsigned int m;

	pthread_mutex_lock(&s->lock);
	cur = s->params;
	m = s->params_set;
	if (!s->running) {
		s->params = *p;
		overlay(&s->params, &cur, m);
	}
	pthread_mutex_unlock(&s->lock);
}

void mig_status_params(struct mig_status *s, struct mig_params *ret)
{
	pthread_mutex_lock(&s->lock);
	*ret = s->params;
	pthread_mutex_unlock(&s->lock);
}

static const struct param_range {
	const char *name;
	uint64_t min, max;
} ranges[] = {
	{ "downtime_ms", 0, 3600000 },
	{ "max_passes", 1, 100000 },
	{ "timeout_ms", 1, 86400000 },
	{ "max_bandwidth", 0, MIG_MAX_BANDWIDTH_MIBPS },
	{ "throttle", 0, 1 },
	{ "compress", 0, 2 },
};

int mig_params_check(const char *name, double v, char *err, size_t len)
{
	size_t i;

	for (i = 0; i < sizeof(ranges) / sizeof(ranges[0]); i++) {
		if (strcmp(name, ranges[i].name))
			continue;
		if (!(v >= (double)ranges[i].min && v <= (double)ranges[i].max))
			return mig_errf(err, len, -ERANGE, "Parameter '%s' must be %" PRIu64 " to %" PRIu64 ", not %.17g",
					name, ranges[i].min, ranges[i].max, v);
		if (v != (double)(uint64_t)v) /* in range: the cast is defined */
			return mig_errf(err, len, -EINVAL, "Invalid parameter type for '%s', expected: integer", name);
		return 0;
	}
	return mig_errf(err, len, -EINVAL, "Parameter '%s' is unexpected", name);
}

int mig_status_set(struct mig_status *s, const struct mig_params *p, unsigned int mask, char *err, size_t len)
{
	const uint64_t v[] = { p->downtime_ms, p->max_passes, p->timeout_ms, p->max_bandwidth, p->throttle,
			       (uint64_t)p->compress };
	unsigned int i;
	int ret;

	if (!mask)
		return mig_errf(err, len, -EINVAL, "no parameter given: downtime_ms, max_bandwidth, max_passes, "
				"timeout_ms, throttle or compress");
	for (i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
		ret = mask & (1u << i) ? mig_params_check(ranges[i].name, (double)v[i], err, len) : 0;
		if (ret < 0)
			return ret;
	}
	pthread_mutex_lock(&s->lock);
	/* compression on where the session did not agree to it: nothing changed */
	if ((mask & MIG_PARAM_COMPRESS) && p->compress && s->running && !decided_locked(s) && !s->compress_able) {
		pthread_mutex_unlock(&s->lock);
		return mig_errf(err, len, -EOPNOTSUPP, "compress: this migration began without compression (its session "
				"did not agree to it); it applies to the next");
	}
	if (mask & MIG_PARAM_DOWNTIME)
		s->params.downtime_ms = p->downtime_ms;
	if (mask & MIG_PARAM_MAX_PASSES)
		s->params.max_passes = p->max_passes;
	if (mask & MIG_PARAM_TIMEOUT)
		s->params.timeout_ms = p->timeout_ms;
	if (mask & MIG_PARAM_MAX_BANDWIDTH)
		s->params.max_bandwidth = p->max_bandwidth;
	if (mask & MIG_PARAM_THROTTLE)
		s->params.throttle = p->throttle;
	if (mask & MIG_PARAM_COMPRESS)
		s->params.compress = p->compress;
	/* before a migration begins, or once its outcome is decided: the next one's too */
	if (!s->running || decided_locked(s))
		s->params_set |= mask;
	pthread_mutex_unlock(&s->lock);
	return 0;
}

int mig_status_cancel(struct mig_status *s, char *err, size_t len)
{
	int ret = 0;

	pthread_mutex_lock(&s->lock);
	if (s->dest)
		ret = mig_errf(err, len, -EOPNOTSUPP, "cancel is the source's: this is the destination "
			       "(a stream its source cancels is dropped here)");
	else if (s->committed)
		ret = mig_errf(err, len, -EALREADY, "COMMIT was sent: the guest's fate is the destination's answer "
			       "(resolve if it never comes)");
	else if (decided_locked(s) || s->outcome == MIG_OUTCOME_UNKNOWN)
		ret = mig_errf(err, len, -ENOENT, "no migration to cancel: the last one is over (%s)", s->state);
	else if (!s->cancel) {
		unsigned int i;

		__atomic_store_n(&s->cancel, true, __ATOMIC_RELAXED);
		/* a wait of the engine's on the peer ends now, not at its timeout */
		for (i = 0; i < s->n_cancel_fd; i++)
			shutdown(s->cancel_fd[i], s->cancel_how);
	}
	pthread_mutex_unlock(&s->lock);
	return ret;
}

void mig_status_cancel_fds(struct mig_status *s, const int *fds, unsigned int n, int how)
{
	unsigned int i;

	pthread_mutex_lock(&s->lock);
	s->n_cancel_fd = 0;
	for (i = 0; i < n && i < MIG_STATUS_CANCEL_FDS; i++)
		if (fds[i] >= 0)
			s->cancel_fd[s->n_cancel_fd++] = fds[i];
	s->cancel_how = how;
	pthread_mutex_unlock(&s->lock);
}

bool mig_status_cancel_asked(struct mig_status *s)
{
	/* written under the lock, atomically: the engine asks at every batch without taking it */
	return __atomic_load_n(&s->cancel, __ATOMIC_RELAXED);
}

void mig_status_mark_cancelled(struct mig_status *s)
{
	pthread_mutex_lock(&s->lock);
	s->cancelled = true;
	pthread_mutex_unlock(&s->lock);
}

bool mig_status_commit_point(struct mig_status *s)
{
	bool go;

	pthread_mutex_lock(&s->lock);
	go = !s->cancel;
	s->committed = go;
	/* from here no cancel: nothing of the connections is shut down by one */
	s->n_cancel_fd = 0;
	pthread_mutex_unlock(&s->lock);
	return go;
}

/* ---- events ---- */

/* The line's head: {"event":NAME,"data":{ */
static size_t event_head(char *buf, size_t len, const char *name)
{
	int n = snprintf(buf, len, "{\"event\":\"%s\",\"data\":{", name);

	return n < 0 ? 0 : (size_t)n < len ? (size_t)n : len - 1;
}

/* ... and its tail: },"timestamp":{...}}\n; the length, or 0 when it does not fit */
static size_t event_tail(char *buf, size_t at, size_t len)
{
	struct timespec ts;
	int n;

	clock_gettime(CLOCK_REALTIME, &ts);
	n = snprintf(buf + at, len - at, "},\"timestamp\":{\"seconds\":%lld,\"microseconds\":%ld}}\n",
		     (long long)ts.tv_sec, ts.tv_nsec / 1000);
	return n < 0 || (size_t)n >= len - at ? 0 : at + (size_t)n;
}

size_t mig_event_lost_line(uint64_t count, char *buf, size_t len)
{
	size_t at = event_head(buf, len, "events_lost");
	int n = snprintf(buf + at, len - at, "\"count\":%" PRIu64, count);

	return n < 0 || (size_t)n >= len - at ? 0 : event_tail(buf, at + (size_t)n, len);
}

/*
 * Write n bytes to the sink's fd without blocking and without SIGPIPE (a
 * pipe whose reader left): how many it took, or -errno.
 */
static ssize_t sink_write(int fd, const char *buf, size_t n)
{
	sigset_t pipe_only, old;
	struct timespec zero = { 0, 0 };
	ssize_t k = send(fd, buf, n, MSG_DONTWAIT | MSG_NOSIGNAL);

	if (k >= 0 || errno != ENOTSOCK)
		return k < 0 ? -errno : k;
	sigemptyset(&pipe_only);
	sigaddset(&pipe_only, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &pipe_only, &old);
	k = write(fd, buf, n);
	if (k < 0 && errno == EPIPE)
		while (sigtimedwait(&pipe_only, NULL, &zero) < 0 && errno == EINTR)
			;
	k = k < 0 ? -errno : k;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return k;
}

/* Under the lock: as much of buf as the sink's fd takes; the rest kept to go first next time. false: none of it. */
static bool sink_try(struct mig_status *s, const char *buf, size_t n)
{
	ssize_t k = sink_write(s->sink_fd, buf, n);

	if (k <= 0)
		return false;
	memmove(s->sink_rest, buf + k, n - (size_t)k);
	s->sink_rest_len = n - (size_t)k;
	return true;
}

/*
 * Under the lock: what the sink owes before another line, out: the rest of
 * a line it took in part, then a line saying how many it lost.  true when
 * nothing is owed any more.
 */
static bool sink_owed(struct mig_status *s)
{
	char lost[160];
	size_t ln;

	if (s->sink_rest_len) {
		char rest[MIG_EVENT_LINE];

		memcpy(rest, s->sink_rest, s->sink_rest_len);
		if (!sink_try(s, rest, s->sink_rest_len) || s->sink_rest_len)
			return false;
	}
	if (s->sink_lost) {
		ln = mig_event_lost_line(s->sink_lost, lost, sizeof(lost));
		if (!sink_try(s, lost, ln))
			return false;
		s->sink_lost = 0;
	}
	return !s->sink_rest_len;
}

/* Under the lock: line to the sink's fd, after what it owes; lost (counted) if it cannot go whole or in part. */
static void sink_put(struct mig_status *s, const char *line, size_t n)
{
	if (!sink_owed(s) || !sink_try(s, line, n))
		s->sink_lost++;
}

void mig_status_event(struct mig_status *s, const char *name, const char *data_fmt, ...)
{
	char line[MIG_EVENT_LINE];
	void (*cb)(void *ctx, const char *line);
	uint64_t one = 1;
	size_t at, n;
	va_list ap;
	void *ctx;
	int k;

	at = event_head(line, sizeof(line), name);
	va_start(ap, data_fmt);
	k = vsnprintf(line + at, sizeof(line) - at, data_fmt, ap);
	va_end(ap);
	/* vsnprintf() says what it would have written: past the line, the data is cut off, not used */
	n = k >= 0 && at + (size_t)k < sizeof(line) ? event_tail(line, at + (size_t)k, sizeof(line)) : 0;
	if (!n) /* too long: the event without its data */
		n = event_tail(line, at, sizeof(line));
	pthread_mutex_lock(&s->lock);
	memcpy(s->events[s->events_head % MIG_EVENTS_KEPT], line, n + 1);
	s->events_head++;
	if (s->sink_fd >= 0)
		sink_put(s, line, n);
	cb = s->sink;
	ctx = s->sink_ctx;
	if (s->event_fd >= 0)
		while (write(s->event_fd, &one, sizeof(one)) < 0 && errno == EINTR)
			;
	pthread_mutex_unlock(&s->lock);
	if (cb)
		cb(ctx, line);
}

void mig_status_sink(struct mig_status *s, void (*cb)(void *ctx, const char *line), void *ctx, int fd)
{
	int fl;

	if (fd >= 0 && (fl = fcntl(fd, F_GETFL)) >= 0 && !(fl & O_NONBLOCK))
		fcntl(fd, F_SETFL, fl | O_NONBLOCK);
	pthread_mutex_lock(&s->lock);
	s->sink = cb;
	s->sink_ctx = ctx;
	s->sink_fd = fd;
	s->sink_lost = s->sink_rest_len = 0;
	pthread_mutex_unlock(&s->lock);
}

int mig_status_event_fd(struct mig_status *s)
{
	int fd;

	pthread_mutex_lock(&s->lock);
	if (s->event_fd < 0)
		s->event_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	fd = s->event_fd >= 0 ? s->event_fd : -errno;
	pthread_mutex_unlock(&s->lock);
	return fd;
}

size_t mig_status_event_get(struct mig_status *s, uint64_t *seq, char *buf, size_t len, uint64_t *lost)
{
	size_t n = 0;

	pthread_mutex_lock(&s->lock);
	if (s->events_head > MIG_EVENTS_KEPT && *seq < s->events_head - MIG_EVENTS_KEPT) {
		*lost += s->events_head - MIG_EVENTS_KEPT - *seq;
		*seq = s->events_head - MIG_EVENTS_KEPT;
	}
	if (*lost) {
		/* what was missed is told first, in one line */
		n = mig_event_lost_line(*lost, buf, len);
		if (n)
			*lost = 0;
	} else if (*seq < s->events_head) {
		n = (size_t)snprintf(buf, len, "%s", s->events[*seq % MIG_EVENTS_KEPT]);
		if (n >= len)
			n = 0; /* a buffer shorter than a line: the caller's mistake, nothing taken */
		else
			++*seq;
	}
	pthread_mutex_unlock(&s->lock);
	return n;
}

uint64_t mig_status_event_head(struct mig_status *s)
{
	uint64_t h;

	pthread_mutex_lock(&s->lock);
	h = s->events_head;
	pthread_mutex_unlock(&s->lock);
	return h;
}
