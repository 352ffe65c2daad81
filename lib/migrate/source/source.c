// SPDX-License-Identifier: MIT
/*
 * The source: mig_send(), step by step (setup, session, header, pre-copy,
 * stop-and-copy, teardown), and the life of its state.  How pages go out
 * and which file does what: source-int.h.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "errf.h"
#include "source-int.h"

/* The source's state, and what the guest gives checked against the stream's limits. */
static int source_init(struct source *s, const struct mig_guest *g, const struct mig_send_opts *o, char *err,
		       size_t len)
{
	const struct mig_params p = { .downtime_ms = o->downtime_ms, .max_passes = o->max_passes,
				      .timeout_ms = o->timeout_ms, .max_bandwidth = o->max_bandwidth,
				      .throttle = o->throttle, .compress = (int)o->compress };

	s->g = g;
	s->o = o;
	s->cpu0_ns = mig_thread_cpu_ns(pthread_self());
	mig_status_init(&s->own, false);
	/*
	 * Its own status until the caller's is begun: a call refused here
	 * (another migration under way on the caller's status) must not
	 * write that migration's outcome when it ends
	 */
	s->st = &s->own;
	pthread_mutex_init(&s->pace_lock, NULL);
	s->t0 = s->sample_ms = mig_clock_msf();
	s->pagemap = -1;
	if (o->max_bandwidth > MIG_MAX_BANDWIDTH_MIBPS)
		return mig_errf(err, len, -EINVAL, "a bandwidth cap of %" PRIu64 " MiB/s: at most %d", o->max_bandwidth,
				MIG_MAX_BANDWIDTH_MIBPS);
	if (mig_status_begin(o->status ? o->status : &s->own, &p) < 0)
		return mig_errf(err, len, -EBUSY, "the status is another migration's, under way");
	s->st = o->status ? o->status : &s->own;
	s->begun = true;
	mig_status_sink(s->st, o->event, o->event_ctx, o->event_to_fd ? o->event_fd : -1);
	src_take_params(s);
	/* the session offers compression as the migration began (a set refuses turning it on otherwise) */
	s->z_offer = mig_status_compress_is_able(s->st);
	if (o->postcopy && !o->verify)
		return mig_errf(err, len, -EINVAL, "post-copy needs page hashes (verify): a page is checked before it is "
				"placed");
	if (o->postcopy && (o->connections > MIG_MAX_CONNS - 1 || !g->ops->pause))
		return mig_errf(err, len, -EINVAL, "post-copy: at most %d connections beside its fault channel, and the "
				"guest's pause", MIG_MAX_CONNS - 1);
	s->postcopy = o->postcopy;
	mig_status_postcopy_able(s->st, o->postcopy);
	if (!g->tracker || g->nr_regions > MIG_MAX_REGIONS || g->nr_vcpus > MIG_MAX_VCPUS)
		return mig_errf(err, len, -EINVAL,
				"the source guest has no tracker, or more than %u regions or %u vCPUs", MIG_MAX_REGIONS,
				MIG_MAX_VCPUS);
	return 0;
}

/* The session first: a destination that cannot prove the key sees nothing of the guest; then a lane a connection. */
static int session(struct source *s, int fd, char *err, size_t len)
{
	const struct mig_send_opts *o = s->o;
	struct mig_session_opts so;
	int ret;

	src_session_opts(s, &so);

	/* a cancel ends the handshake's waits at once (registered first: one asked before is seen below) */
	mig_status_cancel_fds(s->st, &fd, 1, SHUT_RDWR);
	ret = src_cancel_check(s);
	if (ret == 0)
		ret = mig_session_connect(fd, &so, o->connect, o->connect_ctx, &s->sess, err, len);
	if (ret == 0)
		ret = src_lanes_new(s, err, len);
	/* compression as asked, once the destination agreed to it */
	if (ret == 0 && (s->sess.flags & MIG_S_ZSTD))
		__atomic_store_n(&s->zmode, s->par.compress, __ATOMIC_RELAXED);
	/* the stream's waits, now that the session is made: -T, and what the guest's size adds */
	for (unsigned int i = 0; ret == 0 && i < s->sess.conns; i++)
		mig_conn_set_timeout(s->sess.conn[i], mig_guest_wait_ms(s->g, o->peer_timeout_ms));
	/* while the stream goes: a cancel cuts it, the destination drops it */
	if (ret == 0)
		mig_status_cancel_fds(s->st, s->sess.fd, s->sess.conns, SHUT_WR);
	/* asked while the session was made: the destination, told nothing more, drops it */
	if (ret == 0)
		src_cancel_check(s);
	return s->cancelled ? src_cancelled(s, err, len) : ret;
}

/*
 * What sending needs before tracking starts: room for the vCPUs' state
 * and the page hashes, the baseline (it ends where the migration's time
 * starts), which pages are untouched, the lanes' workers.
 */
static int prepare(struct source *s, struct mig_result *res, char *err, size_t len)
{
	const struct mig_send_opts *o = s->o;

	s->vs = calloc(s->g->nr_vcpus, sizeof(*s->vs));
	if (!s->vs || (o->verify && src_alloc_hashes(s) < 0) || src_baseline(s, res) < 0)
		return mig_errf(err, len, -ENOMEM, "out of memory for page hashes and vCPU state");
	s->before_ms = now_rel(s);
	s->sample_ms = mig_clock_msf();
	src_untouched_open(s);
	s->zero_hash = mig_zero_page_hash();
	return src_workers_start(s, err, len);
}

/* The stream's header: the guest's layout, on the first connection. */
static int header(struct source *s, char *err, size_t len)
{
	const struct mig_guest *g = s->g;
	struct mig_region *desc = calloc(g->nr_regions ? g->nr_regions : 1, sizeof(*desc));
	struct mig_header h;
	struct iovec iov[2] = { { &h, sizeof(h) }, { desc, g->nr_regions * sizeof(desc[0]) } };
	unsigned int i;
	int ret;

	if (!desc)
		return mig_errf(err, len, -ENOMEM, "out of memory for the region table");
	for (i = 0; i < g->nr_regions; i++)
		desc[i] = (struct mig_region){ g->regions[i].gpa, g->regions[i].size };
	mig_encode_header(&s->lane[0].enc, &h, desc, g->nr_regions, g->nr_vcpus,
			  (s->o->verify ? MIG_F_PAGE_HASH : 0) | (s->postcopy ? MIG_F_POSTCOPY : 0) |
				  (s->sess.flags & MIG_S_ZSTD ? MIG_F_ZSTD : 0));
	ret = mig_chan_writev(s->lane[0].ch, iov, 2);
	free(desc);
	/* err says why; the result stays the write's, whatever a refusing destination said */
	if (ret < 0)
		src_net_fail(s, ret, "sending the header", err, len);
	return ret;
}

/*
 * The migration's own consumer, every page pending (its first pass is
 * all of memory), and its claim on every region: logging on where it was
 * off, and on until the consumer goes (and no one else needs it).
 */
static int track(struct source *s, char *err, size_t len)
{
	struct kvmdirty_tracker *t = s->g->tracker;
	int ret;

	ret = kvmdirty_consumer_new(t, 0, &s->cons);
	if (ret < 0)
		return mig_errf(err, len, ret, "a consumer of the dirty log for the migration: %s", strerror(-ret));
	ret = kvmdirty_consumer_start(s->cons, NULL);
	if (ret < 0)
		return mig_errf(err, len, ret, "starting dirty tracking: %s", strerror(-ret));
	s->started = true;
	return 0;
}

/*
 * The throttle's measures, the start line, the header, and tracking on.
 * The header goes first: a plain stream's first bytes must reach the
 * destination within its handshake budget (MIG_HANDSHAKE_MS), and turning
 * dirty logging on for thousands of memslots can take KVM longer; after
 * the header the destination waits -T for each record instead.  (What
 * prepare() does, --baseline's wait included, still comes before it.)
 */
static int start(struct source *s, const struct mig_result *res, char *err, size_t len)
{
	int ret;

	if (src_cancel_check(s) < 0)
		return src_cancelled(s, err, len);
	src_throttle_init(s);
	if (s->o->stats)
		src_start_line(s, res);
	ret = header(s, err, len);
	if (ret < 0)
		return ret;
	ret = track(s, err, len);
	if (ret < 0)
		return ret;
	mig_status_set_state(s->st, "precopy");
	return 0;
}

/* The vCPUs paused, stop-and-copy, the destination's answer: the downtime is all of it. */
static int switchover(struct source *s, struct mig_result *res, char *err, size_t len)
{
	const struct mig_guest *g = s->g;
	double t0 = mig_clock_msf();
	uint64_t hashed0 = src_hashed(s), pages0 = s->pages;
	int ret;

	if (src_cancel_check(s) < 0)
		return src_cancelled(s, err, len);
	mig_status_event(s->st, "switchover",
			 "\"passes\":%" PRIu64 ",\"remaining_bytes\":%" PRIu64 ",\"est_downtime_ms\":%.1f,\"converged\":%s",
			 res->passes, res->remaining_pages * PAGE, res->est_downtime_ms, res->converged ? "true" : "false");
	src_during(s, res);
	/* post-copy: what is still dirty at the pause stays here (LEFT), to go after the ACK */
	if (s->go_postcopy) {
		ret = src_left_alloc(s, err, len);
		if (ret < 0)
			return ret;
		s->left_mode = true;
	}
	g->ops->pause(g->ctx);
	s->paused = true;
	s->pass = 0;
	ret = src_stop_and_copy(s, res, err, len);
	if (ret == 0) {
		res->downtime_ms = mig_clock_msf() - t0;
		res->downtime_hashed = src_hashed(s) - hashed0;
		res->downtime_pages = s->pages - pages0;
	}
	if (ret == 0 && s->left_mode) {
		res->postcopy = true;
		res->switch_pause_ms = res->downtime_ms;
		res->postcopy_pages = s->left_pages;
		/*
		 * Nothing left (the pass had sent it all when the switch came):
		 * the destination took the guest whole, as after pre-copy, and
		 * waits for no page; neither does this side.
		 */
		if (s->left_pages)
			ret = src_postcopy(s, res, err, len);
	}
	return ret;
}

/* The figures of the migration as it ended, however far it got. */
static void results(struct source *s, struct mig_result *res, int ret)
{
	unsigned int i;

	/* never paused (abandoned, or failed in pre-copy): each vCPU's speed up to now */
	if (s->started && !s->paused)
		src_during(s, res);
	if (s->o->progress)
		fprintf(stderr, "\n");
	/* the migration proper: from the start of tracking (a baseline measured before is not part of it) */
	res->total_ms = mig_clock_msf() - (s->started ? s->t0 + s->before_ms : s->t0);
	res->bytes = mig_session_sent(&s->sess);
	src_zip_result(s, res);
	res->pages = s->pages;
	res->zero_pages = s->zero_pages;
	res->untouched_pages = s->untouched_pages;
	/* abandoned for not converging: the reason stays why */
	if (ret < 0 && !s->abandoned)
		res->reason = s->cancelled ? "cancelled" : "failed";
	res->cancelled = s->cancelled;
	if (s->cancelled && res->outcome == MIG_OUTCOME_PENDING)
		res->outcome = mig_status_decide(s->st, MIG_OUTCOME_HERE, "cancelled: the guest runs here");
	if (s->cancelled)
		mig_status_mark_cancelled(s->st);
	/* failed before the handoff, or abandoned: the guest stays here */
	if (ret < 0 && res->outcome == MIG_OUTCOME_PENDING)
		res->outcome = mig_status_decide(s->st, MIG_OUTCOME_HERE, "the migration failed: the guest runs here");
	res->throttled = s->throttled_ever;
	for (i = 0; i < s->nv; i++)
		res->vcpu_held_ms[i] = src_held_ms(s, i);
}

/*
 * The guest as mig_send() leaves it: unthrottled; the migration's pages
 * done with (moved) or owed no more (stays here: its consumer aborts,
 * which touches no other consumer's); its consumer gone, and with it its
 * claim on the regions (logging off where no one else needs it); running
 * here unless it moved.
 */
static void release(struct source *s, enum mig_outcome o)
{
	if (s->throttling && s->th.engaged)
		mig_status_event(s->st, "throttle_released", "\"why\":\"the migration ended\"");
	src_throttle_off(s);
	if (s->cons) {
		if (o == MIG_OUTCOME_THERE)
			kvmdirty_consumer_commit(s->cons);
		else
			kvmdirty_consumer_abort(s->cons);
		kvmdirty_consumer_free(s->cons);
		s->cons = NULL;
	}
	/*
	 * Where the guest stays here, it runs on where it was; where its fate
	 * is unknown, it stays paused.  A guest paused and now run again is
	 * said to be first (a stats line, flushed; an event), before its vCPUs
	 * run: a source that died with no such line never ran its guest after
	 * the pause, and only then may a destination left unknown run it
	 * (kvmdirty-migrate-control(7), resolve).
	 */
	if (o == MIG_OUTCOME_HERE && s->paused) {
		src_resumed(s);
		s->g->ops->resume(s->g->ctx);
	}
}

static void source_free(struct source *s)
{
	/* post-copy kept the key for a recovery: not needed any more */
	if (s->o->postcopy && s->o->wipe_psk && s->o->psk)
		mig_psk_clear((struct mig_psk *)s->o->psk);
	if (s->begun)
		mig_status_end(s->st);
	mig_status_destroy(&s->own);
	/* the lanes' workers joined first: a worker of a failed migration may still be in src_pace() */
	src_lanes_free(s);
	pthread_mutex_destroy(&s->pace_lock);
	mig_session_free(&s->sess);
	src_untouched_close(s);
	free(s->vs);
	free(s->dev);
	free(s->dev_live);
	free(s->progress0);
	free(s->progress_at);
	src_free_hashes(s);
	src_left_free(s);
	free(s);
}

/* How it ended, as an event: completed, cancelled, failed (unknown was told when it became so). */
static void outcome_event(struct source *s, const struct mig_result *res, int ret, const char *err)
{
	char why[2 * MIG_EVENT_LINE / 3];

	mig_event_str(why, sizeof(why), err);
	if (res->outcome == MIG_OUTCOME_THERE)
		mig_status_event(s->st, "completed",
				 "\"total_ms\":%.1f,\"downtime_ms\":%.1f,\"passes\":%" PRIu64 ",\"bytes\":%" PRIu64
				 ",\"lost_pages\":%" PRIu64, res->total_ms, res->downtime_ms, res->passes, res->bytes,
				 res->lost_pages);
	else if (res->cancelled)
		mig_status_event(s->st, "cancelled", "\"passes\":%" PRIu64 ",\"outcome\":\"here\"", res->passes);
	else if (res->outcome == MIG_OUTCOME_HERE)
		mig_status_event(s->st, "failed", "\"reason\":\"%s\",\"outcome\":\"here\",\"error\":\"%s\"",
				 res->reason ? res->reason : "failed", why);
}

/* Teardown, whatever happened: the results, the guest released, the check after switchover, the end line. */
static int finish(struct source *s, struct mig_result *res, int ret, char *err, size_t len)
{
	results(s, res, ret);
	release(s, res->outcome);
	if (ret == 0 && s->o->verify)
		ret = src_check_sent(s, res, err, len);
	if (s->o->stats)
		src_end_line(s, res, ret, err);
	outcome_event(s, res, ret, err);
	source_free(s);
	return ret;
}

int mig_send(const struct mig_guest *g, int fd, const struct mig_send_opts *o, struct mig_result *res, char *err,
	     size_t len)
{
	struct source *s = calloc(1, sizeof(*s));
	int ret;

	memset(res, 0, sizeof(*res));
	err[0] = 0;
	if (!s)
		return mig_errf(err, len, -ENOMEM, "out of memory");
	ret = source_init(s, g, o, err, len);
	if (ret == 0)
		ret = session(s, fd, err, len);
	if (ret == 0)
		ret = prepare(s, res, err, len);
	if (ret == 0)
		ret = start(s, res, err, len);
	if (ret == 0)
		ret = src_precopy(s, res, err, len);
	if (ret == 0)
		ret = switchover(s, res, err, len);
	/*
	 * A failure where a cancel was asked for (before the commit point:
	 * after it, none is taken) is the cancel's doing: it shut the
	 * connections down to end a wait, or came as the migration failed.
	 * Either way the guest stays here, and it is told as cancelled.
	 */
	if (ret < 0 && s->begun && res->outcome != MIG_OUTCOME_THERE && res->outcome != MIG_OUTCOME_UNKNOWN &&
	    src_cancel_check(s) < 0 && !s->cancel_told)
		ret = src_cancelled(s, err, len);
	return finish(s, res, ret, err, len);
}
