// SPDX-License-Identifier: MIT
/*
 * The source's --stats: JSON lines, format version 1
 * (doc/migrate-stats.md): start, then samples and pass lines, then verify
 * and end; and each vCPU's speed before tracking (the baseline) and
 * during pre-copy, which those lines report.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "errf.h"
#include "source-int.h"

#define STATS_VERSION 1

/*
 * Before tracking starts: each vCPU's speed over baseline_ms, and where
 * the speed during the migration is counted from.
 */
int src_baseline(struct source *s, struct mig_result *res)
{
	const struct mig_guest *g = s->g;
	unsigned int i;
	double t;

	s->progress0 = calloc(g->nr_vcpus, sizeof(uint64_t));
	s->progress_at = calloc(g->nr_vcpus, sizeof(uint64_t));
	if (!s->progress0 || !s->progress_at)
		return -ENOMEM;
	if (!g->ops->progress)
		return 0;
	for (i = 0; i < g->nr_vcpus; i++)
		s->progress0[i] = g->ops->progress(g->ctx, i);
	if (s->o->baseline_ms) {
		t = mig_clock_msf();
		usleep((useconds_t)(s->o->baseline_ms * 1000));
		t = mig_clock_msf() - t;
		for (i = 0; i < g->nr_vcpus; i++) {
			uint64_t p = g->ops->progress(g->ctx, i);

			res->vcpu_before[i] = (double)(p - s->progress0[i]) / (t / 1e3);
			s->progress0[i] = p;
		}
	}
	memcpy(s->progress_at, s->progress0, g->nr_vcpus * sizeof(uint64_t));
	return 0;
}

/* Each vCPU's speed from the start of tracking to now (the pause). */
void src_during(struct source *s, struct mig_result *res)
{
	const struct mig_guest *g = s->g;
	double t = now_rel(s) - s->before_ms;
	unsigned int i;

	for (i = 0; g->ops->progress && s->progress0 && i < g->nr_vcpus && t > 0; i++)
		res->vcpu_during[i] = (double)(g->ops->progress(g->ctx, i) - s->progress0[i]) / (t / 1e3);
}

/* A string as JSON. */
static void json_str(FILE *f, const char *str)
{
	fputc('"', f);
	for (; *str; str++) {
		unsigned char c = (unsigned char)*str;

		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

/* Every line starts the same: the format's version, its type, ms since the start. */
void src_line_start(const struct source *s, const char *type)
{
	fprintf(s->o->stats, "{\"v\":%d,\"type\":\"%s\",\"t_ms\":%.3f", STATS_VERSION, type, now_rel(s));
}

/* How long vCPU i was held by its dirty limit, or kept out by its run share, so far. */
double src_held_ms(const struct source *s, unsigned int i)
{
	struct kvmdirty_vcpu_stats st;

	if (s->ring)
		return i < s->nv && !kvmdirty_vcpu_stats(s->g->vcpu[i], &st, sizeof(st)) ? st.held_ns / 1e6 : 0;
	return s->g->ops->kept_out_ns ? s->g->ops->kept_out_ns(s->g->ctx, i) / 1e6 : 0;
}

/*
 * "vcpu":[{"id":0,"progress":N,"per_s":X,"dirty_per_s":D,...},...]:
 * progress since the last sample (which moves on), the dirtying the last
 * tick measured, and the throttle on the vCPU.
 */
static void vcpu_samples(struct source *s, double dt_ms)
{
	unsigned int i;

	if (!s->g->ops->progress && !s->nv)
		return;
	fprintf(s->o->stats, ",\"vcpu\":[");
	for (i = 0; i < s->g->nr_vcpus; i++) {
		fprintf(s->o->stats, "%s{\"id\":%u", i ? "," : "", i);
		if (s->g->ops->progress) {
			uint64_t p = s->g->ops->progress(s->g->ctx, i);

			fprintf(s->o->stats, ",\"progress\":%" PRIu64 ",\"per_s\":%.1f", p,
				dt_ms > 0 ? (double)(p - s->progress_at[i]) / (dt_ms / 1e3) : 0.0);
			s->progress_at[i] = p;
		}
		if (i < s->nv) {
			fprintf(s->o->stats, ",\"dirty_per_s\":%.0f", s->vcpu_rate[i]);
			if (s->ring)
				fprintf(s->o->stats, ",\"dirty_limit\":%" PRIu64, s->applied_limit[i]);
			else
				fprintf(s->o->stats, ",\"run_share\":%u", s->applied_share[i]);
			fprintf(s->o->stats, ",\"held_ms\":%.1f", src_held_ms(s, i));
		}
		fputc('}', s->o->stats);
	}
	fputc(']', s->o->stats);
}

/* The figures a sample and a pass line share: sent so far, still dirty, the link, the dirty rate. */
static void flow_fields(struct source *s, double dt_ms)
{
	struct kvmdirty_stats st;
	uint64_t sent = mig_session_sent(&s->sess);

	kvmdirty_tracker_stats(s->g->tracker, &st, sizeof(st));
	/* the link: acknowledged bytes while the socket never ran dry; until measured, what was written */
	fprintf(s->o->stats,
		",\"pass\":%u,\"bytes_sent\":%" PRIu64 ",\"pages_sent\":%" PRIu64 ",\"dirty_bytes\":%" PRIu64
		",\"link_bytes_per_s\":%.0f,\"dirty_pages_per_s\":%" PRIu64 ",\"redirty_pages_per_s\":%.0f"
		",\"throttled\":%s",
		s->pass, sent, s->pages, (kvmdirty_consumer_pending(s->cons) + s->in_hand) * PAGE,
		s->link > 0 ? s->link : dt_ms > 0 ? (double)(sent - s->sample_bytes) / (dt_ms / 1e3) : 0.0,
		st.dirty_rate, s->redirty, s->th.engaged ? "true" : "false");
	vcpu_samples(s, dt_ms);
	s->sample_bytes = sent;
	s->sample_ms = mig_clock_msf();
}

/* A sample within a pass (src_tick()), dt_ms after the last line. */
void src_sample_line(struct source *s, double dt_ms)
{
	src_line_start(s, "sample");
	flow_fields(s, dt_ms);
	fprintf(s->o->stats, "}\n");
}

void src_pass_line(struct source *s, uint64_t pages, uint64_t zero, uint64_t untouched, uint64_t bytes, double ms,
		   uint64_t remaining, double mib_s, double est_ms)
{
	if (s->o->stats) {
		src_line_start(s, "pass");
		flow_fields(s, mig_clock_msf() - s->sample_ms);
		fprintf(s->o->stats,
			",\"pass_pages\":%" PRIu64 ",\"pass_zero_pages\":%" PRIu64 ",\"pass_untouched_pages\":%" PRIu64
			",\"pass_bytes\":%" PRIu64 ",\"pass_ms\":%.3f,\"pass_bytes_per_s\":%.0f,\"remaining_pages\":%"
			PRIu64 ",\"est_downtime_ms\":%.3f}\n",
			pages, zero, untouched, bytes, ms, mib_s * 1048576.0, remaining, est_ms);
	}
	if (s->o->progress) {
		struct kvmdirty_stats st;

		kvmdirty_tracker_stats(s->g->tracker, &st, sizeof(st));
		fprintf(stderr, "\rpass %u: %.1f MiB remaining, %.0f MiB/s, dirty %" PRIu64
				" pages/s, est. downtime %.1f ms   ",
			s->pass, remaining * PAGE / 1048576.0, mib_s, st.dirty_rate, est_ms);
	}
}

static const char *mode_name(enum kvmdirty_mode m)
{
	return m == KVMDIRTY_MODE_DIRTY_LOG ? "dirty-log" : m == KVMDIRTY_MODE_CLEAR_LOG ? "clear-log"
	       : m == KVMDIRTY_MODE_DIRTY_RING ? "dirty-ring" : "auto";
}

void src_start_line(struct source *s, const struct mig_result *res)
{
	const struct mig_guest *g = s->g;
	uint64_t pages = 0;
	unsigned int i;

	for (i = 0; i < g->nr_regions; i++)
		pages += g->regions[i].size / PAGE;
	src_line_start(s, "start");
	fprintf(s->o->stats,
		",\"mode\":\"%s\",\"regions\":%u,\"guest_pages\":%" PRIu64 ",\"page_size\":%u,\"vcpus\":%u"
		",\"downtime_limit_ms\":%" PRIu64 ",\"max_passes\":%u,\"timeout_ms\":%" PRIu64 ",\"verify\":%s"
		",\"baseline_ms\":%" PRIu64 ",\"connections\":%u,\"psk\":%s,\"encrypt\":%s,\"vcpu\":[",
		mode_name(kvmdirty_tracker_mode(g->tracker)), g->nr_regions, pages, MIG_PAGE_SIZE, g->nr_vcpus,
		s->par.downtime_ms, (unsigned int)s->par.max_passes, s->par.timeout_ms, s->o->verify ? "true" : "false",
		s->o->baseline_ms, s->nlanes, (s->sess.flags & MIG_S_PSK) ? "true" : "false",
		(s->sess.flags & MIG_S_ENCRYPT) ? "true" : "false");
	for (i = 0; i < g->nr_vcpus; i++) {
		fprintf(s->o->stats, "%s{\"id\":%u", i ? "," : "", i);
		if (g->ops->progress)
			fprintf(s->o->stats, ",\"progress\":%" PRIu64, s->progress0[i]);
		if (g->ops->progress && s->o->baseline_ms)
			fprintf(s->o->stats, ",\"before_per_s\":%.1f", res->vcpu_before[i]);
		fputc('}', s->o->stats);
	}
	fprintf(s->o->stats, "]}\n");
}

/* The end line's "vcpu":[...]: each vCPU's speed during, before and their ratio, and how long it was held. */
static void end_vcpus(struct source *s, const struct mig_result *res)
{
	const struct mig_guest *g = s->g;
	unsigned int i;

	if (!g->ops->progress && !s->nv)
		return;
	fprintf(s->o->stats, ",\"vcpu\":[");
	for (i = 0; i < g->nr_vcpus; i++) {
		fprintf(s->o->stats, "%s{\"id\":%u", i ? "," : "", i);
		if (g->ops->progress)
			fprintf(s->o->stats, ",\"during_per_s\":%.1f", res->vcpu_during[i]);
		if (g->ops->progress && s->o->baseline_ms)
			fprintf(s->o->stats, ",\"before_per_s\":%.1f,\"speed\":%.4f", res->vcpu_before[i],
				res->vcpu_before[i] > 0 ? res->vcpu_during[i] / res->vcpu_before[i] : 0.0);
		if (i < s->nv)
			fprintf(s->o->stats, ",\"held_ms\":%.1f", res->vcpu_held_ms[i]);
		fputc('}', s->o->stats);
	}
	fputc(']', s->o->stats);
}

void src_end_line(struct source *s, const struct mig_result *res, int ret, const char *err)
{
	src_line_start(s, "end");
	fprintf(s->o->stats,
		",\"ok\":%s,\"converged\":%s,\"reason\":\"%s\",\"total_ms\":%.3f,\"downtime_ms\":%.3f"
		",\"bytes_sent\":%" PRIu64 ",\"passes\":%" PRIu64 ",\"pages_sent\":%" PRIu64 ",\"zero_pages\":%" PRIu64
		",\"untouched_pages\":%" PRIu64 ",\"downtime_pages\":%" PRIu64 ",\"est_downtime_ms\":%.3f"
		",\"link_bytes_per_s\":%.0f,\"verified\":%s,\"lost_pages\":%" PRIu64,
		ret < 0 ? "false" : "true", res->converged ? "true" : "false", res->reason ? res->reason : "failed",
		res->total_ms, res->downtime_ms, res->bytes, res->passes, res->pages, res->zero_pages,
		res->untouched_pages, res->downtime_pages, res->est_downtime_ms, res->link_bytes_per_s,
		ret == 0 && s->o->verify ? "true" : "false", res->lost_pages);
	fprintf(s->o->stats, ",\"remaining_pages\":%" PRIu64 ",\"dirty_pages_per_s\":%" PRIu64,
		res->remaining_pages, res->dirty_pages_per_s);
	if (ret < 0) {
		fprintf(s->o->stats, ",\"error\":");
		json_str(s->o->stats, err);
	}
	if (!res->converged && res->reason && strcmp(res->reason, "failed")) {
		char why[256];

		src_not_converged(s, res, why, sizeof(why));
		fprintf(s->o->stats, ",\"detail\":");
		json_str(s->o->stats, why);
	}
	fprintf(s->o->stats, ",\"throttle\":%s,\"throttled\":%s", s->throttling ? "true" : "false",
		res->throttled ? "true" : "false");
	fprintf(s->o->stats, ",\"outcome\":\"%s\",\"resolved\":%s,\"ready_ms\":%.3f,\"handoff_ms\":%.3f",
		mig_outcome_name(res->outcome), res->resolved ? "true" : "false", res->ready_ms, res->handoff_ms);
	fprintf(s->o->stats, ",\"postcopy\":%s", res->postcopy ? "true" : "false");
	if (res->postcopy)
		fprintf(s->o->stats,
			",\"postcopy_why\":\"%s\",\"switch_pause_ms\":%.3f,\"postcopy_ms\":%.3f,\"postcopy_pages\":%" PRIu64
			",\"postcopy_requests\":%" PRIu64 ",\"postcopy_bulk\":%" PRIu64 ",\"postcopy_faults\":%" PRIu64
			",\"fault_p50_us\":%.1f,\"fault_p99_us\":%.1f,\"postcopy_recoveries\":%" PRIu64,
			res->postcopy_why ? res->postcopy_why : "asked", res->switch_pause_ms, res->postcopy_ms,
			res->postcopy_pages, res->postcopy_requests, res->postcopy_bulk, res->postcopy_faults,
			res->fault_p50_us, res->fault_p99_us, res->postcopy_recoveries);
	if (s->o->compress != MIG_COMPRESS_OFF || res->zpages)
		fprintf(s->o->stats,
			",\"compress\":\"%s\",\"zpages\":%" PRIu64 ",\"zraw_bytes\":%" PRIu64 ",\"zwire_bytes\":%" PRIu64
			",\"zcpu_s\":%.3f",
			s->par.compress == MIG_COMPRESS_AUTO ? "auto" : s->par.compress == MIG_COMPRESS_ZSTD ? "zstd" : "off",
			res->zpages, res->zraw_bytes, res->zwire_bytes,
			res->zcpu_s);
	fprintf(s->o->stats, ",\"cpu_s\":%.3f", res->cpu_s);
	if (s->o->compress != MIG_COMPRESS_OFF || res->zpages)
		src_zip_lanes_json(s, s->o->stats);
	end_vcpus(s, res);
	fprintf(s->o->stats, "}\n");
}

void src_resumed(struct source *s)
{
	char why[256];

	mig_status_why(s->st, why, sizeof(why));
	if (s->o->stats) {
		src_line_start(s, "resume");
		fprintf(s->o->stats, ",\"why\":");
		json_str(s->o->stats, why);
		fprintf(s->o->stats, "}\n");
		fflush(s->o->stats);
	}
	mig_status_event(s->st, "resumed", "\"side\":\"source\"");
}

/*
 * The handoff's unknown(): COMMIT went out and no ACK came.  A stats line
 * at once (a reader of the file learns it while the source waits), then
 * the caller's own line.
 */
void src_unknown(void *ctx, const char *line)
{
	struct source *s = ctx;

	if (s->o->stats) {
		src_line_start(s, "outcome");
		fprintf(s->o->stats, ",\"outcome\":\"unknown\",\"why\":");
		json_str(s->o->stats, line);
		fprintf(s->o->stats, "}\n");
		fflush(s->o->stats);
	}
	if (s->o->unknown)
		s->o->unknown(s->o->unknown_ctx, line);
}

/* Why pre-copy did not converge, in words: what was left, what the link took, what the guest dirtied. */
void src_not_converged(const struct source *s, const struct mig_result *res, char *buf, size_t len)
{
	snprintf(buf, len, "after %" PRIu64 " passes the rest (%.1f MiB) needed %.0f ms at %.1f MiB/s, "
		 "over the %.0f ms kept for it of the %" PRIu64 " ms limit; the guest dirtied %" PRIu64
		 " pages/s (%.1f MiB/s)%s",
		 res->passes, res->remaining_pages * PAGE / 1048576.0, res->est_downtime_ms,
		 res->link_bytes_per_s / 1048576.0, DOWNTIME_SHARE * (double)s->par.downtime_ms, s->par.downtime_ms,
		 res->dirty_pages_per_s,
		 res->dirty_pages_per_s * PAGE / 1048576.0,
		 !s->throttling ? ", not throttled" : "");
}

/* A cancel asked for: noted (everything unwinds from here), -ECANCELED; else 0. */
int src_cancel_check(struct source *s)
{
	if (!s->cancelled && mig_status_cancel_asked(s->st))
		s->cancelled = true;
	return s->cancelled ? -ECANCELED : 0;
}

/* The error a cancel ends the migration with, naming where it was. */
int src_cancelled(struct source *s, char *err, size_t len)
{
	s->cancelled = s->cancel_told = true;
	if (s->end_sent)
		return mig_errf(err, len, -ECANCELED, "cancelled after END, before COMMIT: ABORT sent (best effort), "
				"the guest runs on here");
	if (s->paused)
		return mig_errf(err, len, -ECANCELED, "cancelled in stop-and-copy: the guest runs on here");
	if (s->pass)
		return mig_errf(err, len, -ECANCELED, "cancelled in pre-copy pass %u: the guest runs on here", s->pass);
	return mig_errf(err, len, -ECANCELED, "cancelled before the first pass: the guest runs on here");
}
