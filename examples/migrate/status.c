// SPDX-License-Identifier: MIT
/* A migration side's status: written by the engine, read and resolved by anyone (status.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

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
	pthread_mutex_unlock(&s->lock);
}

void mig_status_destroy(struct mig_status *s)
{
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

/* s as JSON text into buf, escaping the one free-form string. */
static int query_locked(const struct mig_status *s, char *buf, size_t len)
{
	char why[2 * sizeof(s->why)];
	size_t i, k = 0;
	int n;

	for (i = 0; s->why[i] && k + 2 < sizeof(why); i++) {
		unsigned char c = (unsigned char)s->why[i];

		if (c == '"' || c == '\\')
			why[k++] = '\\';
		why[k++] = c < 0x20 ? '?' : (char)c;
	}
	why[k] = 0;
	n = snprintf(buf, len,
		     "{\"side\":\"%s\",\"state\":\"%s\",\"stream\":%" PRIu64 ",\"pass\":%" PRIu64 ",\"bytes_sent\":%" PRIu64
		     ",\"remaining_bytes\":%" PRIu64 ",\"outcome\":\"%s\",\"resolved\":%s%s%s%s}",
		     s->dest ? "destination" : "source", s->state, s->stream, s->pass, s->bytes_sent, s->remaining_bytes,
		     mig_outcome_name(s->outcome), s->resolved ? "true" : "false", k ? ",\"why\":\"" : "", why,
		     k ? "\"" : "");
	return n < 0 || (size_t)n >= len ? -ENOSPC : 0;
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
