// SPDX-License-Identifier: MIT
/*
 * The source's post-copy (stream.h, "post-copy"): after the ACK, the
 * guest runs at the destination and its LEFT pages are still here, the
 * vCPUs here paused for good, so memory holds still.  This thread reads
 * the fault channel and answers each REQ at once with its pages (hashes
 * first), on the fault channel, which carries nothing else; a thread a
 * lane sends the other LEFT pages of its chunks, starting from the last
 * page asked for (nearest to recent faults first), each page once.  A page
 * asked for that a lane sent already is sent again (it may still be in
 * that lane's queue).  ALL_IN ends it: the guest may be dropped here.
 *
 * Until ALL_IN the source keeps every page the destination lacks: a
 * connection that fails pauses post-copy (postcopy-paused) and the guest's
 * memory stays here, its vCPUs paused; the caller decides what follows.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "errf.h"
#include "source-int.h"

struct spc_lane {
	struct spc *pc;
	unsigned int i;
	pthread_t thread;
	bool started;
	uint32_t r;   /* where it goes on: region, page */
	uint64_t p;
	uint64_t seq; /* the hint it last followed */
	uint64_t hashes[MIG_RUN_PAGES];
};

struct spc {
	struct source *s;
	pthread_mutex_t lock; /* left[], the hint, the counters, sent_hash and sent_data */
	uint64_t remaining;   /* LEFT pages not yet sent */
	uint32_t hint_r;      /* the last page asked for */
	uint64_t hint_p, hint_seq;
	bool stop;
	int err;	/* a lane's send failed: -errno */
	unsigned int failed_lane;
	uint64_t answered, requests, bulk;
	struct spc_lane lane[MIG_MAX_CONNS];
};

int src_left_alloc(struct source *s, char *err, size_t len)
{
	unsigned int i, n = s->g->nr_regions ? s->g->nr_regions : 1;

	s->left = calloc(n, sizeof(*s->left));
	for (i = 0; s->left && i < s->g->nr_regions; i++)
		if (!(s->left[i] = calloc(KVMDIRTY_BITMAP_WORDS(s->g->regions[i].size / PAGE), sizeof(uint64_t))))
			break;
	if (!s->left || i < s->g->nr_regions)
		return mig_errf(err, len, -ENOMEM, "post-copy: out of memory for the map of pages left here");
	return 0;
}

void src_left_free(struct source *s)
{
	unsigned int i;

	for (i = 0; s->left && i < s->g->nr_regions; i++)
		free(s->left[i]);
	free(s->left);
	s->left = NULL;
}

/*
 * Pages [p, p + n) of region r as a DATA record on ch: hashed now (memory
 * holds still), their slots of sent_hash and sent_data set (the check
 * after the migration compares against them).
 */
static int send_pages(struct spc *pc, struct mig_chan *ch, uint64_t *hashes, uint32_t r, uint64_t p, uint64_t n)
{
	struct source *s = pc->s;
	const uint8_t *hva = (const uint8_t *)s->g->regions[r].hva + p * PAGE;
	struct mig_record rec = { .kind = MIG_DATA, .index = r, .first = p, .count = n };
	struct iovec iov[3] = { { &rec, sizeof(rec) }, { hashes, n * sizeof(uint64_t) }, { (void *)hva, n * PAGE } };
	uint64_t k;

	for (k = 0; k < n; k++)
		hashes[k] = mig_page_hash(hva + k * PAGE);
	pthread_mutex_lock(&pc->lock);
	for (k = 0; k < n; k++)
		s->sent_hash[r][p + k] = hashes[k];
	kvmdirty_bitmap_set(s->sent_data[r], p, p + n);
	pthread_mutex_unlock(&pc->lock);
	return mig_chan_writev(ch, iov, 3);
}

/* A lane's next run of LEFT pages, from where it is (the hint, when a fault came since), taken; 0: none left. */
static uint64_t next_run(struct spc *pc, struct spc_lane *l, uint32_t *ret_r, uint64_t *ret_p)
{
	struct source *s = pc->s;
	uint32_t nl = s->nlanes, nr = s->g->nr_regions, tried;
	uint64_t n = 0;

	if (l->seq != pc->hint_seq) {
		l->seq = pc->hint_seq;
		l->r = pc->hint_r;
		l->p = pc->hint_p;
	}
	/* every region once round, from the lane's place on */
	for (tried = 0; tried <= nr && !n; tried++) {
		uint32_t r = l->r;
		uint64_t np = s->g->regions[r].size / PAGE, p = l->p;

		while (p < np) {
			uint64_t chunk = p / MIG_LANE_PAGES, end, q;

			if (mig_lane_of(r, p, nl) != l->i) {
				p = (chunk + 1) * MIG_LANE_PAGES;
				continue;
			}
			end = (chunk + 1) * MIG_LANE_PAGES < np ? (chunk + 1) * MIG_LANE_PAGES : np;
			q = kvmdirty_bitmap_next_set(s->left[r], p, end);
			if (q >= end) {
				p = end;
				continue;
			}
			for (n = 0; q + n < end && n < MIG_RUN_PAGES && !kvmdirty_bitmap_is_clear(s->left[r], q + n, q + n + 1);
			     n++)
				;
			kvmdirty_bitmap_clear(s->left[r], q, q + n);
			pc->remaining -= n;
			*ret_r = r;
			*ret_p = q;
			l->p = q + n;
			return n;
		}
		l->r = r + 1 < nr ? r + 1 : 0;
		l->p = 0;
	}
	return 0;
}

static void *lane_main(void *arg)
{
	struct spc_lane *l = arg;
	struct spc *pc = l->pc;
	struct source *s = pc->s;
	struct mig_chan *ch = s->sess.chan[l->i];
	int ret = 0;

	for (;;) {
		uint32_t r = 0;
		uint64_t p = 0, n;

		pthread_mutex_lock(&pc->lock);
		n = pc->stop || !s->g->nr_regions ? 0 : next_run(pc, l, &r, &p);
		pthread_mutex_unlock(&pc->lock);
		if (!n)
			break;
		ret = src_pace(s, sizeof(struct mig_record) + n * (PAGE + sizeof(uint64_t)));
		if (ret == 0)
			ret = send_pages(pc, ch, l->hashes, r, p, n);
		if (ret < 0) {
			/* not across: its pages are still the destination's to ask for */
			pthread_mutex_lock(&pc->lock);
			if (!pc->err) {
				pc->err = ret;
				pc->failed_lane = l->i;
			}
			pthread_mutex_unlock(&pc->lock);
			break;
		}
		pthread_mutex_lock(&pc->lock);
		pc->bulk += n;
		pthread_mutex_unlock(&pc->lock);
	}
	/* this lane's part is out: its direction ends (the destination's thread for it then ends too) */
	if (ret == 0)
		mig_chan_close_write(ch);
	return NULL;
}

/* A REQ: its pages at once on the fault channel, and the lanes go on from there. */
static int answer(struct spc *pc, const struct mig_record *rec, uint64_t *hashes)
{
	struct source *s = pc->s;
	uint64_t k, was = 0;

	pthread_mutex_lock(&pc->lock);
	for (k = rec->first; k < rec->first + rec->count; k++) {
		if (!kvmdirty_bitmap_is_clear(s->left[rec->index], k, k + 1)) {
			kvmdirty_bitmap_clear(s->left[rec->index], k, k + 1);
			was++;
		}
	}
	pc->remaining -= was;
	pc->requests++;
	pc->answered += rec->count;
	pc->hint_r = rec->index;
	pc->hint_p = rec->first + rec->count;
	pc->hint_seq++;
	pthread_mutex_unlock(&pc->lock);
	return send_pages(pc, s->sess.chan[s->sess.conns - 1], hashes, rec->index, rec->first, rec->count);
}

static void spc_stop(struct spc *pc)
{
	struct source *s = pc->s;
	unsigned int i;

	pthread_mutex_lock(&pc->lock);
	pc->stop = true;
	pthread_mutex_unlock(&pc->lock);
	for (i = 0; i < s->nlanes; i++)
		if (pc->lane[i].started)
			pthread_join(pc->lane[i].thread, NULL);
}

int src_postcopy(struct source *s, struct mig_result *res, char *err, size_t len)
{
	struct mig_chan *fch = s->sess.chan[s->sess.conns - 1];
	struct mig_region *regs = calloc(s->g->nr_regions ? s->g->nr_regions : 1, sizeof(*regs));
	uint64_t *hashes = malloc(MIG_RUN_PAGES * sizeof(uint64_t)), nrec = 0;
	struct spc *pc = calloc(1, sizeof(*pc));
	double t0 = mig_clock_msf();
	unsigned int i;
	int ret = 0;

	if (!pc || !regs || !hashes) {
		free(pc);
		free(regs);
		free(hashes);
		return mig_errf(err, len, -ENOMEM, "post-copy: out of memory");
	}
	for (i = 0; i < s->g->nr_regions; i++)
		regs[i] = (struct mig_region){ s->g->regions[i].gpa, s->g->regions[i].size };
	pc->s = s;
	pc->remaining = s->left_pages;
	pthread_mutex_init(&pc->lock, NULL);
	s->pc = pc;
	mig_status_set_state(s->st, "postcopy");
	mig_status_postcopy_progress(s->st, s->left_pages, 0, 0, 0);
	mig_status_event(s->st, "postcopy-started",
			 "\"side\":\"source\",\"missing_pages\":%" PRIu64 ",\"switch_pause_ms\":%.1f,\"why\":\"%s\"",
			 s->left_pages, res->switch_pause_ms, res->postcopy_why ? res->postcopy_why : "asked");
	/* no wait for the destination gives up: a cut ends a read (and pauses post-copy), silence is its right */
	for (i = 0; i < s->sess.conns; i++) {
		mig_conn_set_deadline(s->sess.conn[i], 0);
		mig_conn_set_timeout(s->sess.conn[i], 0);
	}
	for (i = 0; i < s->nlanes; i++) {
		pc->lane[i] = (struct spc_lane){ .pc = pc, .i = i };
		if (pthread_create(&pc->lane[i].thread, NULL, lane_main, &pc->lane[i]) == 0)
			pc->lane[i].started = true;
	}
	for (;; nrec++) {
		struct mig_record rec;
		int n = mig_chan_read(fch, &rec, sizeof(rec));

		if (n != (int)sizeof(rec)) {
			char why[120];

			if (n >= 0)
				snprintf(why, sizeof(why), "the fault channel ended before ALL_IN");
			else
				mig_chan_strerror(fch, n, why, sizeof(why));
			ret = mig_errf(err, len, n < 0 ? n : -EPIPE, "post-copy paused: %s; %" PRIu64 " pages are still only "
				       "here, the guest's memory is kept", why, pc->remaining);
			break;
		}
		ret = mig_pc_check(regs, s->g->nr_regions, &rec, nrec, false, err, len);
		if (ret < 0)
			break;
		if (rec.kind == MIG_PC_FAILED) {
			ret = mig_errf(err, len, -EREMOTEIO, "post-copy failed at the destination (%s): the guest there "
				       "was paused for good, and this copy is older than the state that ran there",
				       strerror((int)-(int64_t)rec.first));
			break;
		}
		if (rec.kind == MIG_ALL_IN) {
			res->postcopy_faults = rec.index;
			res->fault_p50_us = (double)rec.first / 1e3;
			res->fault_p99_us = (double)rec.count / 1e3;
			break;
		}
		ret = answer(pc, &rec, hashes);
		if (ret < 0) {
			src_net_fail(s, ret, "post-copy: answering a fault", err, len);
			break;
		}
		if (!(nrec % 64)) {
			pthread_mutex_lock(&pc->lock);
			mig_status_postcopy_progress(s->st, pc->remaining, pc->requests, 0, 0);
			pthread_mutex_unlock(&pc->lock);
		}
	}
	spc_stop(pc);
	res->postcopy_ms = mig_clock_msf() - t0;
	res->postcopy_requests = pc->requests;
	res->postcopy_answered = pc->answered;
	res->postcopy_bulk = pc->bulk;
	if (ret == 0) {
		mig_status_postcopy_progress(s->st, 0, res->postcopy_faults, res->fault_p50_us, res->fault_p99_us);
		mig_chan_close_write(fch);
	} else {
		char esc[2 * MIG_EVENT_LINE / 3];

		mig_event_str(esc, sizeof(esc), err);
		bool failed = ret == -EREMOTEIO;

		mig_status_set_state(s->st, failed ? "failed" : "postcopy-paused");
		if (failed)
			mig_status_event(s->st, "postcopy-failed", "\"side\":\"source\",\"error\":\"%s\"", esc);
		else
			mig_status_event(s->st, "postcopy-paused",
					 "\"side\":\"source\",\"missing_pages\":%" PRIu64 ",\"why\":\"%s\"", pc->remaining,
					 esc);
	}
	s->pc = NULL;
	pthread_mutex_destroy(&pc->lock);
	free(pc);
	free(regs);
	free(hashes);
	return ret;
}
