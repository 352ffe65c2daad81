// SPDX-License-Identifier: MIT
/*
 * The handoff after END: READY, COMMIT or ABORT, ACK (handoff.h has each
 * side's table).  The one rule behind it: a side decides only what it can
 * know.  The destination cannot know whether COMMIT was sent until it
 * arrives, the source whether COMMIT arrived until the ACK does; between,
 * each keeps its guest paused and leaves the decision to the peer's late
 * message or to whoever resolves it, never to a timer.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "errf.h"
#include "handoff.h"

static int msg_send(const struct mig_handoff *h, uint32_t kind, int32_t status, const char *text)
{
	struct mig_ack m = { .status = status, .kind = kind };
	struct iovec iov = { &m, sizeof(m) };

	/* as much of the reason as fits, terminated */
	memcpy(m.message, text, strnlen(text, sizeof(m.message) - 1));
	return mig_chan_writev(h->ch, &iov, 1);
}

/*
 * One whole message: 0, or -errno (the channel's; -EPIPE for a connection
 * that ended, a message cut short included), with what went wrong in why.
 */
static int msg_recv(const struct mig_handoff *h, struct mig_ack *m, const char *awaiting, char *why, size_t len)
{
	char what[120];
	int ret = mig_chan_read(h->ch, m, sizeof(*m));

	if (ret == (int)sizeof(*m))
		return 0;
	if (ret >= 0) {
		snprintf(what, sizeof(what), ret ? "the connection ended inside the message" : "the connection ended");
		ret = -EPIPE;
	} else {
		mig_chan_strerror(h->ch, ret, what, sizeof(what));
	}
	snprintf(why, len, "awaiting %s: %s", awaiting, what);
	return ret;
}

/* A whole message as the protocol has it: its kind known, its status as the kind wants. */
static bool msg_valid(const struct mig_ack *m)
{
	switch (m->kind) {
	case MIG_MSG_REFUSED:
		return m->status < 0;
	case MIG_MSG_READY:
	case MIG_MSG_COMMIT:
	case MIG_MSG_ABORT:
		return m->status == 0;
	case MIG_MSG_ACK:
		return m->status <= 0;
	}
	return false;
}

/*
 * From a side's last message until the peer's answer the outcome is
 * unknown (status.h), and resolvable at once.  The peer's answer decides
 * (decide() turns a message into an outcome, or PENDING to pass it over);
 * past one -T in all without it (passed-over messages do not extend it),
 * or when the connection ends, the side says so once and goes on reading
 * without a timeout, so a late answer still decides, unless the read that
 * gave up had taken part of a message: the connection then cannot be read
 * right again, and only a resolve decides.  A resolve ends any read (the
 * socket's reading side shut down) and is told to the peer, best effort.
 */
static enum mig_outcome await(const struct mig_handoff *h, const char *awaiting, const char *why,
			      enum mig_outcome (*decide)(const struct mig_handoff *h, struct mig_ack *m),
			      void (*resolved)(const struct mig_handoff *h, enum mig_outcome o))
{
	struct mig_conn *c = mig_chan_conn(h->ch);
	enum mig_outcome o = mig_status_unknown(h->st, h->fd, why);
	bool said = false;
	struct mig_ack m;
	char line[320], what[200], esc[300];
	int ret;

	mig_conn_set_deadline(c, h->timeout_ms);
	while ((o = mig_status_outcome(h->st)) == MIG_OUTCOME_UNKNOWN) {
		ret = msg_recv(h, &m, awaiting, what, sizeof(what));
		if (ret == 0) {
			o = decide(h, &m);
			if (o != MIG_OUTCOME_PENDING)
				return o;
			continue;
		}
		if (mig_status_outcome(h->st) != MIG_OUTCOME_UNKNOWN)
			break; /* the read a resolve ended */
		if (!said) {
			snprintf(line, sizeof(line), "the outcome is unknown (%s): the guest stays paused here until told",
				 what);
			mig_status_unknown(h->st, h->fd, what);
			mig_event_str(esc, sizeof(esc), what);
			mig_status_event(h->st, "unknown", "\"side\":\"%s\",\"why\":\"%s\"",
					 h->st->dest ? "destination" : "source", esc);
			if (h->unknown)
				h->unknown(h->ctx, line);
			said = true;
			if (!h->wait)
				return MIG_OUTCOME_UNKNOWN;
		}
		if (ret != -ETIMEDOUT || mig_chan_torn(h->ch))
			break;
		mig_conn_set_deadline(c, 0);
		mig_conn_set_timeout(c, 0);
	}
	/* what the resolve decides goes out in its own time: the answer's deadline is past */
	mig_conn_set_deadline(c, 0);
	o = mig_status_wait(h->st);
	if (h->st->resolved)
		resolved(h, o);
	return o;
}

/* ---- source ---- */

/* After COMMIT: an ACK decides; anything else leaves it unknown (0). */
static enum mig_outcome source_decide(const struct mig_handoff *h, struct mig_ack *m)
{
	char why[160];

	if (!msg_valid(m) || m->kind != MIG_MSG_ACK)
		return MIG_OUTCOME_PENDING;
	if (m->status == 0)
		return mig_status_decide(h->st, MIG_OUTCOME_THERE, "committed: the guest runs at the destination");
	snprintf(why, sizeof(why), "the destination dropped its copy: %s", mig_ack_text(m));
	return mig_status_decide(h->st, MIG_OUTCOME_HERE, why);
}

/* Resolved: here, the destination is told to drop its copy (it may not have read COMMIT yet). */
static void source_resolved(const struct mig_handoff *h, enum mig_outcome o)
{
	if (o == MIG_OUTCOME_HERE)
		msg_send(h, MIG_MSG_ABORT, 0, "resolved: the guest runs at the source");
}

/* Before COMMIT was sent: the guest runs here, and the destination is told, if it still listens. */
static enum mig_outcome source_keeps(const struct mig_handoff *h, const char *why, bool abort)
{
	if (abort)
		msg_send(h, MIG_MSG_ABORT, 0, why);
	return mig_status_decide(h->st, MIG_OUTCOME_HERE, why);
}

enum mig_outcome mig_handoff_source(const struct mig_handoff *h, struct mig_handoff_times *ret_t, char *err,
				    size_t len)
{
	double t0 = mig_clock_msf(), t1;
	enum mig_outcome o;
	struct mig_ack m;
	char why[200];
	int ret;

	*ret_t = (struct mig_handoff_times){ 0 };
	mig_status_set_state(h->st, "handoff");
	if (msg_recv(h, &m, "READY", why, sizeof(why)) < 0) {
		o = source_keeps(h, why, true);
	} else if (m.kind == MIG_MSG_REFUSED && msg_valid(&m)) {
		snprintf(why, sizeof(why), "destination refused: %s", mig_ack_text(&m));
		o = source_keeps(h, why, false);
	} else if (m.kind != MIG_MSG_READY || !msg_valid(&m)) {
		snprintf(why, sizeof(why), "expected READY, got %s (status %d)", mig_msg_name(m.kind), m.status);
		o = source_keeps(h, why, true);
	} else {
		t1 = mig_clock_msf();
		ret_t->ready_ms = t1 - t0;
		mig_status_event(h->st, "ready", "\"side\":\"source\",\"ready_ms\":%.1f", ret_t->ready_ms);
		if (!mig_status_commit_point(h->st)) {
			/* a cancel came first: COMMIT is never sent, and the destination drops its copy */
			ret_t->cancelled = true;
			o = source_keeps(h, "cancelled before COMMIT: the guest runs here", true);
		} else if ((ret = msg_send(h, MIG_MSG_COMMIT, 0, "commit")) < 0) {
			/* not sent: the destination never reads a COMMIT, so it never runs the guest */
			mig_chan_strerror(h->ch, ret, why, sizeof(why));
			o = source_keeps(h, why, false);
		} else {
			/* from here the destination may run the guest: never again here, unless it says it dropped it */
			mig_status_event(h->st, "commit", "\"side\":\"source\"");
			/* an ACK decides; a message that is not one (a READY repeated) is passed over */
			o = await(h, "the ACK of COMMIT", "COMMIT sent, awaiting its ACK", source_decide, source_resolved);
		}
		ret_t->commit_ms = mig_clock_msf() - t1;
	}
	mig_status_why(h->st, err, len);
	return o;
}

/* ---- destination ---- */

/* After READY: COMMIT runs, ABORT drops, any other whole message drops; each is acknowledged. */
static enum mig_outcome dest_decide(const struct mig_handoff *h, struct mig_ack *m)
{
	enum mig_outcome o;
	char why[160];

	if (msg_valid(m) && m->kind == MIG_MSG_COMMIT) {
		int ret;

		mig_status_event(h->st, "commit", "\"side\":\"destination\"");
		if (h->on_commit && mig_status_outcome(h->st) == MIG_OUTCOME_UNKNOWN &&
		    (ret = h->on_commit(h->commit_ctx, why, sizeof(why))) < 0) {
			o = mig_status_decide(h->st, MIG_OUTCOME_THERE, why);
			if (o == MIG_OUTCOME_THERE) {
				msg_send(h, MIG_MSG_ACK, ret, why);
				return o;
			}
		}
		o = mig_status_decide(h->st, MIG_OUTCOME_HERE, "committed: the guest runs here");
	}
	else if (msg_valid(m) && m->kind == MIG_MSG_ABORT)
		o = mig_status_decide(h->st, MIG_OUTCOME_THERE, "the source aborted: the guest runs there");
	else {
		snprintf(why, sizeof(why), "expected COMMIT or ABORT, got %s (status %d): the guest was dropped",
			 mig_msg_name(m->kind), m->status);
		o = mig_status_decide(h->st, MIG_OUTCOME_THERE, why);
		msg_send(h, MIG_MSG_ACK, -EPROTO, why);
		return o;
	}
	/* what was asked was done, or a resolve decided first: say which */
	if ((o == MIG_OUTCOME_HERE) == (m->kind == MIG_MSG_COMMIT))
		msg_send(h, MIG_MSG_ACK, 0, o == MIG_OUTCOME_HERE ? "running" : "dropped");
	else
		msg_send(h, MIG_MSG_ACK, o == MIG_OUTCOME_HERE ? -EEXIST : -ECANCELED,
			 o == MIG_OUTCOME_HERE ? "resolved before: the guest runs here" : "resolved before: dropped here");
	return o;
}

/* Resolved: the source, if it still waits for the ACK, learns what became of the guest here. */
static void dest_resolved(const struct mig_handoff *h, enum mig_outcome o)
{
	if (o == MIG_OUTCOME_HERE)
		msg_send(h, MIG_MSG_ACK, 0, "resolved: the guest runs at the destination");
	else
		msg_send(h, MIG_MSG_ACK, -ECANCELED, "resolved: the destination dropped its copy");
}

enum mig_outcome mig_handoff_dest(const struct mig_handoff *h, char *err, size_t len)
{
	enum mig_outcome o;
	char why[200];
	int ret;

	mig_status_set_state(h->st, "handoff");
	ret = msg_send(h, MIG_MSG_READY, 0, "ready");
	if (ret < 0) {
		/* not sent: the source never sees READY, so it never sends COMMIT */
		mig_chan_strerror(h->ch, ret, why, sizeof(why));
		o = mig_status_decide(h->st, MIG_OUTCOME_THERE, why);
	} else {
		mig_status_event(h->st, "ready", "\"side\":\"destination\"");
		o = await(h, "COMMIT or ABORT", "READY sent, awaiting COMMIT or ABORT", dest_decide, dest_resolved);
	}
	mig_status_why(h->st, err, len);
	return o;
}

void mig_handoff_refuse(struct mig_chan *ch, int status, const char *why)
{
	const struct mig_handoff h = { .ch = ch };

	msg_send(&h, MIG_MSG_REFUSED, status < 0 ? status : -EPROTO, why);
}
