// SPDX-License-Identifier: MIT
/*
 * The source's stop-and-copy, the vCPUs paused by the caller: the rest of
 * memory, their state and END on every connection; then the handoff, all
 * that passes between source and destination after END: READY, COMMIT,
 * ACK, and where the guest runs after each (handoff.h).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "errf.h"
#include "handoff.h"
#include "source-int.h"

static const char STOP_SENDING[] = "stop-and-copy: sending to the destination";

/* The rest of memory, each vCPU's state, END on each connection: all of it out. */
static int send_rest(struct source *s, char *err, size_t len)
{
	const struct mig_guest *g = s->g;
	unsigned int i;
	int ret = (int)kvmdirty_consumer_sync(s->cons);

	if (ret < 0)
		return mig_errf(err, len, ret, "final dirty log sync: %s", strerror(-ret));
	ret = src_drain(s, 0);
	for (i = 0; ret >= 0 && i < g->nr_vcpus; i++) {
		ret = g->ops->vcpu_save(g->ctx, i, &s->vs[i]);
		if (ret < 0)
			return mig_errf(err, len, ret, "reading vCPU %u state: %s", i, strerror(-ret));
		ret = src_put(&s->lane[0], mig_encode_vcpu(&s->lane[0].enc, i, &s->vs[i]), &s->vs[i], sizeof(s->vs[i]),
			      NULL);
	}
	/* the VM's own state after its vCPUs' (a VMM with none sends one with no part saved) */
	memset(&s->vm, 0, sizeof(s->vm));
	if (ret >= 0 && g->ops->vm_save && (ret = g->ops->vm_save(g->ctx, &s->vm)) < 0)
		return mig_errf(err, len, ret, "reading the VM's state: %s", strerror(-ret));
	if (ret >= 0)
		ret = src_put(&s->lane[0], mig_encode_vm(&s->lane[0].enc, &s->vm), &s->vm, sizeof(s->vm), NULL);
	/* the devices' state last, whole: a VMM with no devices sends none */
	if (ret >= 0 && g->ops->devices_save) {
		free(s->dev);
		s->dev = NULL;
		s->dev_len = 0;
		ret = g->ops->devices_save(g->ctx, &s->dev, &s->dev_len);
		if (ret < 0)
			return mig_errf(err, len, ret, "saving the devices' state: %s", strerror(-ret));
		if (s->dev_len > MIG_DEVICES_MAX - s->dev_live_len)
			return mig_errf(err, len, -EFBIG, "the devices' state: %zu bytes%s, a stream carries at most %llu",
					s->dev_len, s->dev_live_len ? " beside those given before the pause" : "",
					MIG_DEVICES_MAX);
	}
	if (ret >= 0)
		ret = src_put(&s->lane[0], mig_encode_devices(&s->lane[0].enc, s->dev, s->dev_len), s->dev, s->dev_len,
			      NULL);
	/* each connection's stream ends with its own END */
	for (i = 0; ret >= 0 && i < s->nlanes; i++)
		ret = src_put(&s->lane[i], mig_encode_end(&s->lane[i].enc), NULL, 0, NULL);
	/*
	 * From END's flush, a cancel is answered at READY (ABORT): the wait
	 * for it is what a cancel ends now, the connections' writing stays
	 * (a flush blocked on a destination that does not read is not cut: it
	 * ends at -T, the guest then runs here).  One asked for before stops
	 * here: END not sent, the destination drops what it has.
	 */
	if (ret >= 0) {
		mig_status_cancel_fds(s->st, &s->sess.fd[0], 1, SHUT_RD);
		ret = src_cancel_check(s);
	}
	if (ret >= 0)
		ret = src_flush(s);
	if (ret >= 0)
		s->end_sent = true;
	if (ret == -ECANCELED)
		src_cancel_check(s);
	if (s->cancelled)
		return src_cancelled(s, err, len);
	if (ret < 0)
		return src_net_fail(s, ret, STOP_SENDING, err, len);
	return 0;
}

/*
 * After END: the other connections end there; the first carries the
 * handoff (handoff.h).  0 when the guest moved; -EREMOTEIO (a refusal, a
 * failure, silence before READY; or the destination dropped its copy, or
 * a resolve said here): it stays here, and the caller resumes it;
 * -EINPROGRESS: unknown, and no status to wait on.
 */
static int handoff(struct source *s, struct mig_result *res, char *err, size_t len)
{
	struct mig_handoff h = { .ch = s->lane[0].ch, .fd = s->sess.fd[0], .timeout_ms = mig_guest_wait_ms(s->g, s->o->peer_timeout_ms),
				 .st = s->st, .unknown = src_unknown,
				 .ctx = s, .wait = s->o->status != NULL || s->postcopy };
	struct mig_handoff_times t;
	unsigned int i;
	int ret = 0;

	/* post-copy: the lanes carry the pages left here after the ACK */
	for (i = 1; ret >= 0 && !s->left_mode && i < s->nlanes; i++)
		ret = mig_chan_close_write(s->lane[i].ch);
	if (ret < 0)
		return src_net_fail(s, ret, STOP_SENDING, err, len);
	res->outcome = mig_handoff_source(&h, &t, err, len);
	/* the source's last word on connection 0 was said: its direction ends there (sealed: its last record) */
	if (!s->left_mode || res->outcome != MIG_OUTCOME_THERE)
		mig_chan_close_write(s->lane[0].ch);
	res->ready_ms = t.ready_ms;
	res->handoff_ms = t.commit_ms;
	res->resolved = s->st->resolved;
	if (res->outcome == MIG_OUTCOME_THERE)
		return 0;
	if (t.cancelled)
		return src_cancelled(s, err, len);
	return res->outcome == MIG_OUTCOME_UNKNOWN ? -EINPROGRESS : -EREMOTEIO;
}

/* vCPUs paused: the rest, their state, END; then the handoff. */
int src_stop_and_copy(struct source *s, struct mig_result *res, char *err, size_t len)
{
	int ret;

	mig_status_set_state(s->st, "stop-and-copy");
	ret = send_rest(s, err, len);
	return ret < 0 ? ret : handoff(s, res, err, len);
}
