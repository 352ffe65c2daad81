// SPDX-License-Identifier: MIT
/*
 * The source's stop-and-copy, the vCPUs paused by the caller: the rest of
 * memory, their state and END on every connection; then the handoff, all
 * that passes between source and destination after END.
 */
#include <errno.h>
#include <string.h>

#include "errf.h"
#include "source-int.h"

static const char STOP_SENDING[] = "stop-and-copy: sending to the destination";

/* The rest of memory, each vCPU's state, END on each connection: all of it out. */
static int send_rest(struct source *s, char *err, size_t len)
{
	const struct mig_guest *g = s->g;
	unsigned int i;
	int ret = (int)kvmdirty_tracker_sync(g->tracker);

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
	/* each connection's stream ends with its own END */
	for (i = 0; ret >= 0 && i < s->nlanes; i++)
		ret = src_put(&s->lane[i], mig_encode_end(&s->lane[i].enc), NULL, 0, NULL);
	if (ret >= 0)
		ret = src_flush(s);
	if (ret < 0)
		return src_net_fail(s, ret, STOP_SENDING, err, len);
	return 0;
}

/*
 * After END: the source closes its side of every connection and the
 * destination answers on the first, once it has checked the stream and
 * resumed the guest.  0 when it took the guest over; a refusal, a failure
 * or silence leaves the guest here (the caller resumes it).
 */
static int handoff(struct source *s, char *err, size_t len)
{
	struct mig_ack ack;
	unsigned int i;
	int ret = 0;

	for (i = 0; ret >= 0 && i < s->nlanes; i++)
		ret = mig_chan_close_write(s->lane[i].ch);
	if (ret < 0)
		return src_net_fail(s, ret, STOP_SENDING, err, len);
	ret = mig_chan_read(s->lane[0].ch, &ack, sizeof(ack));
	if (ret < 0)
		return src_net_fail(s, ret, "awaiting the destination's answer", err, len);
	if (ret < (int)sizeof(ack))
		return mig_errf(err, len, -EPROTO, "the destination closed the connection without answering");
	if (ack.status)
		return mig_errf(err, len, ack.status < 0 ? ack.status : -EPROTO, "destination refused: %s",
				mig_ack_text(&ack));
	return 0;
}

/* vCPUs paused: the rest, their state, END; then the destination's answer. */
int src_stop_and_copy(struct source *s, char *err, size_t len)
{
	int ret = send_rest(s, err, len);

	return ret < 0 ? ret : handoff(s, err, len);
}
