// SPDX-License-Identifier: MIT
/*
 * The source's pre-copy: passes over what the tracker reports until the
 * rest fits the downtime (or a limit), each sampled every SAMPLE_MS
 * (src_tick(): the link, each vCPU's dirtying, the throttle's answer);
 * and, when it does not converge, why, in words.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "errf.h"
#include "source-int.h"

/*
 * Pages taken from the tracker at a time: a page handed out is no longer
 * pending, and one the guest writes between its hand-out and its send
 * goes again next pass.  4 MiB is about 40 ms of an 800 Mbit/s link.
 */
#define HAND_OUT 1024

/*
 * Pre-copy passes until the rest fits the downtime, or a limit.  A pass
 * sends what was pending when it began and ends once it is across the
 * link (settle()); then a sync, and the rest is judged at the link's rate
 * plus what that sync took (the final one, paused, takes as long) plus a
 * round trip, against DOWNTIME_SHARE (source-int.h) of the limit.
 */

/*
 * The vCPUs to measure and, with o->throttle, to slow: those the guest
 * gave (DIRTY_RING: by dirty limits; else by run shares, if the VMM can).
 */
void src_throttle_init(struct source *s)
{
	const struct mig_guest *g = s->g;
	unsigned int i;

	s->ring = kvmdirty_tracker_mode(g->tracker) == KVMDIRTY_MODE_DIRTY_RING;
	for (s->nv = 0; s->nv < g->nr_vcpus && s->nv < MIG_THROTTLE_MAX_VCPUS && g->vcpu[s->nv]; s->nv++)
		;
	mig_throttle_init(&s->th, s->ring, s->nv, 0);
	s->can_throttle = s->nv && (s->ring || g->ops->set_run_share);
	/* post-copy takes the throttle's place: a guest that outruns the link is moved, not slowed */
	s->throttling = s->par.throttle && s->can_throttle && !s->postcopy;
	for (i = 0; i < s->nv; i++) {
		struct kvmdirty_vcpu_stats st;

		s->applied_share[i] = 1000;
		if (!kvmdirty_vcpu_stats(g->vcpu[i], &st, sizeof(st)))
			s->vcpu_count[i] = s->ring ? st.dirtied : st.faults;
	}
	s->tick_ms = mig_clock_msf();
}

/* The throttle's limits or shares, on the vCPUs; a limit that moved by less than 1/16 stays. */
static void throttle_apply(struct source *s, bool all)
{
	const struct mig_guest *g = s->g;
	unsigned int i;

	for (i = 0; i < s->nv; i++) {
		uint64_t want = s->th.limit[i], had = s->applied_limit[i];

		if (s->ring) {
			if (!all && want == had)
				continue;
			if (!all && want && had && (want > had ? want - had : had - want) < had / 16)
				continue;
			if (!kvmdirty_vcpu_set_dirty_limit(g->vcpu[i], want))
				s->applied_limit[i] = want;
		} else if (g->ops->set_run_share && (all || s->th.share[i] != s->applied_share[i])) {
			if (!g->ops->set_run_share(g->ctx, i, s->th.share[i]))
				s->applied_share[i] = s->th.share[i];
		}
	}
}

/* Every limit off, every share whole: the guest runs as before (after a failure, or once it moved). */
void src_throttle_off(struct source *s)
{
	unsigned int i;

	if (!s->throttling)
		return;
	for (i = 0; i < s->nv; i++) {
		s->th.limit[i] = 0;
		s->th.share[i] = 1000;
	}
	throttle_apply(s, true);
}

/* The link over the last dt ms: acknowledged bytes, counted only while the socket never ran dry. */
static void measure_link(struct source *s, double dt)
{
	uint64_t sent = mig_session_sent(&s->sess), unacked = mig_session_unacked(&s->sess);
	uint64_t acked = sent - (unacked < sent ? unacked : sent);

	if (unacked && s->tick_unacked && acked > s->tick_acked) {
		double rate = (double)(acked - s->tick_acked) / (dt / 1e3);

		s->link = s->link > 0 ? 0.75 * s->link + 0.25 * rate : rate;
	}
	s->tick_acked = acked;
	s->tick_unacked = unacked;
}

/* Each vCPU's dirtying over the last dt ms, and whether its limit held it for more than a tenth of them. */
static void measure_vcpus(struct source *s, double dt)
{
	unsigned int i;

	for (i = 0; i < s->nv; i++) {
		struct kvmdirty_vcpu_stats st;
		uint64_t n;

		if (kvmdirty_vcpu_stats(s->g->vcpu[i], &st, sizeof(st)))
			continue;
		n = s->ring ? st.dirtied : st.faults;
		s->vcpu_rate[i] = (double)(n - s->vcpu_count[i]) / (dt / 1e3);
		s->vcpu_count[i] = n;
		s->vcpu_held[i] = (double)(st.held_ns - s->vcpu_held_ns[i]) > 0.1 * dt * 1e6;
		s->vcpu_held_ns[i] = st.held_ns;
	}
}

/*
 * Post-copy's rule within a pass: every POSTCOPY_SYNC_MS a sync, whose new
 * pages are what the guest dirtied again; where that outruns nine tenths
 * of the link (measured), pre-copy can never converge: the switch is due
 * now (src_drain() ends the pass), not at the pass's end.
 */
#define POSTCOPY_SYNC_MS 300.0

static int postcopy_tick(struct source *s)
{
	double t = mig_clock_msf(), dt = t - s->pc_sync_ms, link = src_link_raw(s);
	int64_t fresh;

	if (!s->postcopy || !s->pass || s->go_postcopy || !(link > 0) || dt < POSTCOPY_SYNC_MS)
		return 0;
	if (!s->pc_sync_ms) {
		s->pc_sync_ms = t;
		return 0;
	}
	fresh = kvmdirty_consumer_sync(s->cons);
	if (fresh < 0)
		return s->sync_err = (int)fresh;
	s->pc_sync_ms = t;
	s->redirty = (double)fresh / (dt / 1e3);
	if (s->redirty * PAGE > 0.9 * link) {
		s->go_postcopy = true;
		s->postcopy_rule = true;
	}
	return 0;
}

/* Throttling in pre-copy: a sync, whose new pages are the guest's re-dirtying, and the throttle's answer. */
static int throttle_tick(struct source *s, double dt)
{
	struct mig_throttle_sample smp = { .link_pages_per_s = src_link_raw(s) / PAGE };
	bool was = s->th.engaged;
	int64_t fresh;

	if (!s->throttling || !s->pass || !(smp.link_pages_per_s > 0))
		return 0;
	fresh = kvmdirty_consumer_sync(s->cons);
	if (fresh < 0)
		return s->sync_err = (int)fresh;
	smp.redirty_per_s = s->redirty = (double)fresh / (dt / 1e3);
	memcpy(smp.vcpu_rate, s->vcpu_rate, sizeof(smp.vcpu_rate));
	memcpy(smp.vcpu_held, s->vcpu_held, sizeof(smp.vcpu_held));
	if (mig_throttle_update(&s->th, &smp))
		throttle_apply(s, false);
	if (s->th.engaged && !was) {
		s->throttled_ever = true;
		mig_status_event(s->st, "throttle_engaged",
				 "\"pass\":%u,\"link_mibps\":%.1f,\"redirty_pages_per_s\":%.0f", s->pass,
				 smp.link_pages_per_s * PAGE / 1048576.0, s->redirty);
	}
	return 0;
}

/*
 * A sample, every SAMPLE_MS while sending: the link, each vCPU's dirtying,
 * and, throttling in pre-copy, the throttle.  Then the stats line.
 */
int src_tick(struct source *s)
{
	double t = mig_clock_msf(), dt = t - s->tick_ms;
	int ret = src_cancel_check(s);

	/* a switch to post-copy asked for: the pass under way ends at once (src_drain()) */
	if (ret == 0 && s->postcopy && s->pass && mig_status_postcopy_asked(s->st))
		s->go_postcopy = true;
	if (ret < 0 || dt < SAMPLE_MS)
		return ret;
	src_take_params(s);
	measure_link(s, dt);
	s->tick_ms = t;
	measure_vcpus(s, dt);
	ret = throttle_tick(s, dt);
	if (ret == 0)
		ret = postcopy_tick(s);
	if (ret < 0)
		return ret;
	if (s->o->stats)
		src_sample_line(s, t - s->sample_ms);
	mig_status_progress(s->st, s->pass, mig_session_sent(&s->sess),
			    (kvmdirty_consumer_pending(s->cons) + s->in_hand) * MIG_PAGE_SIZE);
	return 0;
}

/*
 * Pages handed out at once: HAND_OUT (4 MiB: at the link's speed a few
 * ms between ticks), or under a cap about a batch's worth (at least 16),
 * so that the tick between ranges (src_put() only marks it due) comes as
 * often as a paced batch goes out.
 */
static uint64_t hand_out(const struct source *s)
{
	uint64_t pages = src_batch_bytes(s) / PAGE;

	if (!__atomic_load_n(&s->cap_bps, __ATOMIC_RELAXED) || pages >= HAND_OUT)
		return HAND_OUT;
	return pages < 16 ? 16 : pages;
}

/*
 * Hand out and send what is pending, at most max_pages (0: all there is,
 * however long the guest keeps dirtying): a pass sends what was pending
 * when it began, while the ticks' syncs add what the guest re-dirties.
 */
int src_drain(struct source *s, uint64_t max_pages)
{
	struct kvmdirty_range rg[64];
	uint64_t left = max_pages;
	int n = 0, i, ret;

	uint64_t hand = hand_out(s);

	/* in pre-copy a switch to post-copy ends the pass: what is still pending goes as LEFT */
	while ((!max_pages || left) && !(s->go_postcopy && !s->left_mode) &&
	       (n = kvmdirty_consumer_next(s->cons, rg, 64, max_pages && left < hand ? left : hand)) > 0) {
		for (i = 0; i < n; i++) {
			s->in_hand += rg[i].npages;
			left -= max_pages ? rg[i].npages : 0;
		}
		for (i = 0; i < n; i++) {
			ret = src_send_range(s, &rg[i]);
			if (ret == 0 && s->tick_due) {
				s->tick_due = false;
				ret = src_tick(s);
			}
			if (ret < 0)
				return ret;
		}
		hand = hand_out(s); /* a cap may have been set meanwhile */
	}
	return n < 0 ? n : src_flush(s);
}

/*
 * Wait until what was sent has left the socket and crossed the link
 * (acknowledged), ticking meanwhile: a pass ends when its pages are
 * across, so the rest measured after it is what the guest dirtied while
 * they went, and a pause after it waits for nothing queued.
 */
static int settle(struct source *s)
{
	double t0 = mig_clock_msf(), wait = (double)mig_guest_wait_ms(s->g, s->o->peer_timeout_ms);
	int ret;

	while (mig_session_unacked(&s->sess)) {
		if (wait > 0 && mig_clock_msf() - t0 > wait)
			return -ETIMEDOUT;
		usleep(200);
		ret = src_tick(s);
		if (ret < 0)
			return ret;
	}
	return 0;
}

/* Where a pass began: the counters its pass line reports the growth of. */
struct pass_mark {
	uint64_t pages, zero, untouched, bytes;
	double t;
};

/*
 * The part of the devices' state the VMM gives while the guest runs
 * (guest.h: devices_save_live), once, in the first pass after its pages
 * and before its PASS record: on the first connection, before any VCPU
 * record, and across the link before the pass ends, so that the estimate
 * of the rest does not count it and the pause does not wait for it.
 */
static int send_devices_live(struct source *s, char *err, size_t len)
{
	const struct mig_guest *g = s->g;
	int ret;

	ret = g->ops->devices_save_live(g->ctx, &s->dev_live, &s->dev_live_len);
	if (ret < 0)
		return mig_errf(err, len, ret, "saving the devices' state before the pause: %s", strerror(-ret));
	if (s->dev_live_len > MIG_DEVICES_MAX)
		return mig_errf(err, len, -EFBIG, "the devices' state before the pause: %zu bytes, a stream carries "
				"at most %llu", s->dev_live_len, MIG_DEVICES_MAX);
	/* the batch points at it until it is shipped: it is the migration's until the end */
	ret = src_put(&s->lane[0], mig_encode_devices_live(&s->lane[0].enc, s->dev_live, s->dev_live_len),
		      s->dev_live, s->dev_live_len, NULL);
	if (ret < 0)
		return src_net_fail(s, ret, "sending the devices' state before the pause", err, len);
	mig_status_event(s->st, "devices_live_sent", "\"bytes\":%zu", s->dev_live_len);
	return 0;
}

/* One pass: what is pending now, then PASS, and across the link. */
static int send_pass(struct source *s, struct mig_result *res, char *err, size_t len)
{
	uint64_t pending = kvmdirty_consumer_pending(s->cons);
	int ret;

	if (src_cancel_check(s) < 0)
		return src_cancelled(s, err, len);
	s->pass = (unsigned int)++res->passes;
	mig_status_event(s->st, "pass_started", "\"pass\":%u,\"pending_bytes\":%" PRIu64, s->pass,
			 pending * PAGE);
	ret = src_drain(s, pending);
	if (ret == 0 && s->pass == 1 && s->g->ops->devices_save_live) {
		ret = send_devices_live(s, err, len);
		if (ret < 0)
			return ret;
	}
	if (ret == 0)
		ret = src_put(&s->lane[0], mig_encode_pass(&s->lane[0].enc, res->passes), NULL, 0, NULL);
	if (ret == 0)
		ret = src_flush(s);
	if (ret == 0)
		ret = settle(s);
	/* across the link: done with, as far as the migration's consumer goes */
	if (ret == 0)
		kvmdirty_consumer_commit(s->cons);
	/* a lane's worker may have seen the cancel first, waiting on the cap */
	if (ret == -ECANCELED)
		src_cancel_check(s);
	if (s->cancelled)
		return src_cancelled(s, err, len);
	if (s->sync_err)
		return mig_errf(err, len, s->sync_err, "dirty log sync: %s", strerror(-s->sync_err));
	if (ret < 0)
		return src_net_fail(s, ret, "pre-copy: sending to the destination", err, len);
	return 0;
}

/* After a pass: a sync, the rest's transfer estimated, the pass line, and the figures in res. */
static int estimate(struct source *s, const struct pass_mark *m, struct mig_result *res, char *err, size_t len)
{
	struct kvmdirty_tracker *t = s->g->tracker;
	struct kvmdirty_stats st;
	double ms = mig_clock_msf() - m->t, mib_s, est, link, ts;
	uint64_t pending;
	int ret;

	mib_s = ms > 0 ? (mig_session_sent(&s->sess) - m->bytes) / 1048576.0 / (ms / 1e3) : 0;
	ts = mig_clock_msf();
	ret = (int)kvmdirty_consumer_sync(s->cons);
	if (ret < 0)
		return mig_errf(err, len, ret, "dirty log sync: %s", strerror(-ret));
	ts = mig_clock_msf() - ts;
	pending = kvmdirty_consumer_pending(s->cons);
	/* the link as measured, or the pass's rate; never above the cap; in pages' bytes (compression carries more) */
	link = s->link > 0 ? s->link / 1048576.0 : mib_s;
	if (s->cap_bps && (!(link > 0) || link > s->cap_bps / 1048576.0))
		link = s->cap_bps / 1048576.0;
	link *= src_expansion(s);
	/* what the pause sends at the link's rate, the final sync (as long as this one), a round trip */
	est = link > 0 ? pending * PAGE / 1048576.0 / link * 1e3 + ts + mig_session_rtt_us(&s->sess) / 1e3 : 0;
	src_pass_line(s, s->pages - m->pages, s->zero_pages - m->zero, s->untouched_pages - m->untouched,
		      mig_session_sent(&s->sess) - m->bytes, ms, pending, mib_s, est);
	res->est_downtime_ms = est;
	res->link_bytes_per_s = link * 1048576.0;
	res->remaining_pages = pending;
	kvmdirty_tracker_stats(t, &st, sizeof(st));
	res->dirty_pages_per_s = st.dirty_rate;
	mig_status_event(s->st, "pass_ended",
			 "\"pass\":%u,\"bytes\":%" PRIu64 ",\"ms\":%.1f,\"mibps\":%.1f,\"remaining_bytes\":%" PRIu64
			 ",\"est_downtime_ms\":%.1f,\"dirty_pages_per_s\":%" PRIu64, s->pass,
			 mig_session_sent(&s->sess) - m->bytes, ms, mib_s, pending * PAGE, est, res->dirty_pages_per_s);
	return 0;
}

/* Pre-copy ends without converging: with post-copy, the switch to it (why), else it is abandoned. */
static bool postcopy_instead(struct source *s, struct mig_result *res, const char *why)
{
	if (s->postcopy) {
		s->go_postcopy = true;
		res->postcopy_why = why;
		res->reason = "postcopy";
	}
	return true;
}

/* Whether pre-copy is over: converged, or a limit reached; res->reason says which. */
static bool precopy_done(struct source *s, struct mig_result *res)
{
	const struct mig_params *o = &s->par;

	/* the parameters as they stand now: a set during the pass judges this pass */
	src_take_params(s);
	if (s->postcopy && mig_status_postcopy_asked(s->st))
		s->go_postcopy = true;
	if (s->go_postcopy) {
		res->postcopy_why = s->postcopy_rule ? "rule" : "asked";
		res->reason = "postcopy";
		return true;
	}
	/*
	 * Within nine tenths of the limit: the rest is kept for what
	 * cannot be measured before it happens (pausing the vCPUs,
	 * their state, the destination's resume before it answers).
	 */
	if (res->est_downtime_ms <= DOWNTIME_SHARE * (double)o->downtime_ms) {
		res->converged = true;
		res->reason = "fits_downtime";
		return true;
	}
	if (s->cancelled)
		return true;
	if (res->passes >= o->max_passes) {
		res->reason = "pass_limit";
		return postcopy_instead(s, res, "pass_limit");
	}
	/* from the start of tracking, as total_ms: a baseline measured before is not pre-copy */
	if (now_rel(s) - s->before_ms >= (double)o->timeout_ms) {
		res->reason = "time_limit";
		return postcopy_instead(s, res, "time_limit");
	}
	if (s->postcopy && s->o->postcopy_after && res->passes >= s->o->postcopy_after)
		return postcopy_instead(s, res, "postcopy_after");
	/* the rule: a pass after the second that left more than half of what the one before it left */
	if (s->postcopy && res->passes > 2 && res->remaining_pages * 2 > s->prev_remaining)
		return postcopy_instead(s, res, "rule");
	s->prev_remaining = res->remaining_pages;
	return false;
}

/*
 * Pre-copy to its end.  Not converged and force_switchover off: -ETIME,
 * with why in err, and the migration abandoned.
 */
int src_precopy(struct source *s, struct mig_result *res, char *err, size_t len)
{
	struct pass_mark m;
	int ret;

	do {
		m.pages = s->pages;
		m.zero = s->zero_pages;
		m.untouched = s->untouched_pages;
		m.bytes = mig_session_sent(&s->sess);
		m.t = mig_clock_msf();
		ret = send_pass(s, res, err, len);
		if (ret == 0)
			ret = estimate(s, &m, res, err, len);
		if (ret < 0)
			return ret;
	} while (!precopy_done(s, res));
	if (s->cancelled)
		return src_cancelled(s, err, len);
	if (!res->converged && !s->o->force_switchover && !s->go_postcopy) {
		char why[256];

		/* the downtime promised cannot be kept: the guest stays here, running */
		src_not_converged(s, res, why, sizeof(why));
		s->abandoned = true;
		return mig_errf(err, len, -ETIME, "pre-copy did not converge (%s): %s", res->reason, why);
	}
	return 0;
}

/* The link's rate on the wire: as measured, never above the cap (bytes/s). */
double src_link(const struct source *s)
{
	double cap = (double)s->cap_bps;

	if (cap > 0 && (!(s->link > 0) || s->link > cap))
		return cap;
	return s->link;
}

/*
 * How many bytes of pages a wire byte has carried so far: 1 without
 * compression; with it, the pages' bytes over what they took on the wire
 * (the link counts compressed bytes, the guest dirties raw ones).
 */
double src_expansion(const struct source *s)
{
	struct mig_result z = { 0 };
	uint64_t sent = mig_session_sent(&s->sess);

	if (__atomic_load_n(&s->zmode, __ATOMIC_RELAXED) == MIG_COMPRESS_OFF && !s->lane)
		return 1.0;
	src_zip_result(s, &z);
	return sent > 0 && z.zraw_bytes > z.zwire_bytes ? (double)(sent + z.zraw_bytes - z.zwire_bytes) / (double)sent
							 : 1.0;
}

/* The link's rate in pages' bytes, for the estimate, the throttle and post-copy's rule. */
double src_link_raw(const struct source *s)
{
	return src_link(s) * src_expansion(s);
}

/*
 * The parameters as the status has them now (a set since the last
 * sample): the cap for the lanes, the throttle on or off (off: every
 * limit lifted at once; on: from the next sample).
 */
void src_take_params(struct source *s)
{
	struct mig_params p;

	mig_status_params(s->st, &p);
	__atomic_store_n(&s->cap_bps, p.max_bandwidth << 20, __ATOMIC_RELAXED);
	/* compression, where the session agreed to it (a set refuses turning it on where it did not) */
	if (s->sess.flags & MIG_S_ZSTD)
		__atomic_store_n(&s->zmode, p.compress, __ATOMIC_RELAXED);
	if (s->started && p.throttle != s->par.throttle) {
		if (!p.throttle && s->throttling) {
			bool was = s->th.engaged;

			src_throttle_off(s);
			s->throttling = false;
			mig_throttle_init(&s->th, s->ring, s->nv, 0);
			if (was)
				mig_status_event(s->st, "throttle_released", "\"why\":\"set throttle false\"");
		} else if (p.throttle) {
			s->throttling = s->can_throttle && !s->postcopy;
		}
	}
	s->par = p;
}

