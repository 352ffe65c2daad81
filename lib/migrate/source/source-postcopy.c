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
#include <unistd.h>

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
	uint8_t id[32];	 /* the session the migration began on: a recovery names it */
	char name[MIG_NAME_MAX]; /* ... and the destination's name it agreed */
	uint64_t **next; /* [nr_regions]: a recovery's map, built before it replaces s->left */
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

	uint64_t n = 0;

	for (;;) {
		uint32_t r = 0;
		uint64_t p = 0;

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
	/* this lane's part is out: END says so (a lane that ends without it was cut), then its direction ends */
	if (ret == 0 && !n) {
		struct mig_record end = { .kind = MIG_END };
		struct iovec iov = { &end, sizeof(end) };

		pthread_mutex_lock(&pc->lock);
		ret = pc->stop ? -ECANCELED : 0;
		pthread_mutex_unlock(&pc->lock);
		if (ret == 0 && mig_chan_writev(ch, &iov, 1) == 0)
			mig_chan_close_write(ch);
	}
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

/* The lanes' threads stopped (a lost connection: every one shut down first, so that a blocked send ends). */
static void spc_stop(struct spc *pc, bool cut)
{
	struct source *s = pc->s;
	unsigned int i;

	pthread_mutex_lock(&pc->lock);
	pc->stop = true;
	pthread_mutex_unlock(&pc->lock);
	for (i = 0; cut && i < s->sess.conns; i++)
		shutdown(s->sess.fd[i], SHUT_RDWR);
	for (i = 0; i < s->nlanes; i++)
		if (pc->lane[i].started)
			pthread_join(pc->lane[i].thread, NULL);
	for (i = 0; i < s->nlanes; i++)
		pc->lane[i].started = false;
	pthread_mutex_lock(&pc->lock);
	pc->stop = false;
	pc->err = 0;
	pthread_mutex_unlock(&pc->lock);
}

static void spc_start(struct spc *pc)
{
	unsigned int i;

	for (i = 0; i < pc->s->nlanes; i++) {
		pc->lane[i] = (struct spc_lane){ .pc = pc, .i = i };
		if (pthread_create(&pc->lane[i].thread, NULL, lane_main, &pc->lane[i]) == 0)
			pc->lane[i].started = true;
	}
}

/* What ended serve(): every page in, the destination failed, a record out of form, or a connection lost. */
enum served { SERVED_ALL_IN, SERVED_FAILED, SERVED_LOST };

/* The fault channel read and answered until ALL_IN, PC_FAILED, or a failure (err says which). */
static enum served serve(struct spc *pc, struct mig_result *res, const struct mig_region *regs, uint64_t *hashes,
			 int *ret_err, char *err, size_t len)
{
	struct source *s = pc->s;
	struct mig_chan *fch = s->sess.chan[s->sess.conns - 1];
	uint64_t nrec;
	int ret;

	for (nrec = 0;; nrec++) {
		struct mig_record rec;
		int n = mig_chan_read(fch, &rec, sizeof(rec));

		if (n != (int)sizeof(rec)) {
			char why[120];

			if (n >= 0)
				snprintf(why, sizeof(why), "the fault channel ended before ALL_IN");
			else
				mig_chan_strerror(fch, n, why, sizeof(why));
			*ret_err = mig_errf(err, len, n < 0 ? n : -EPIPE, "post-copy paused: %s", why);
			return SERVED_LOST;
		}
		ret = mig_pc_check(regs, s->g->nr_regions, &rec, nrec, false, err, len);
		if (ret < 0) {
			*ret_err = ret;
			return SERVED_FAILED;
		}
		if (rec.kind == MIG_PC_FAILED) {
			*ret_err = mig_errf(err, len, -EREMOTEIO, "post-copy failed at the destination (%s): the guest there "
					    "was paused for good, and this copy is older than the state that ran there",
					    strerror((int)-(int64_t)rec.first));
			return SERVED_FAILED;
		}
		if (rec.kind == MIG_ALL_IN) {
			res->postcopy_faults = rec.index;
			res->fault_p50_us = (double)rec.first / 1e3;
			res->fault_p99_us = (double)rec.count / 1e3;
			return SERVED_ALL_IN;
		}
		ret = answer(pc, &rec, hashes);
		if (ret < 0) {
			char why[120];

			mig_chan_strerror(fch, ret, why, sizeof(why));
			*ret_err = mig_errf(err, len, ret, "post-copy paused: answering a fault: %s", why);
			return SERVED_LOST;
		}
		pthread_mutex_lock(&pc->lock);
		if (pc->err) {
			/* a lane's connection failed: the session is made again, whole */
			ret = pc->err;
			pthread_mutex_unlock(&pc->lock);
			*ret_err = mig_errf(err, len, ret, "post-copy paused: connection %u: %s", pc->failed_lane,
					    strerror(-ret));
			return SERVED_LOST;
		}
		if (!(nrec % 64))
			mig_status_postcopy_progress(s->st, pc->remaining, pc->requests, 0, 0);
		pthread_mutex_unlock(&pc->lock);
	}
}

/*
 * A new session in place of the lost one: dialled as the first (connect,
 * every connection), RECOVER with the id of the session the migration
 * began on, and the destination's answer, the pages it still lacks, made
 * the map of what to send.  0 with s->sess the new session; -errno with
 * err (the old one stays, cut).
 */
static int reconnect(struct spc *pc, const struct mig_region *regs, char *err, size_t len)
{
	struct source *s = pc->s;
	const struct mig_send_opts *o = s->o;
	struct mig_session_opts so;
	struct mig_session s2;
	struct mig_record rec = { .kind = MIG_RECOVER, .count = sizeof(pc->id) };
	struct iovec iov[2] = { { &rec, sizeof(rec) }, { pc->id, sizeof(pc->id) } };
	struct mig_chan *fch;
	uint64_t total = 0, listed = 0, nrec;
	unsigned int i;
	int fd, ret;

	fd = o->connect(o->connect_ctx, err, len);
	if (fd < 0)
		return fd;
	src_session_opts(s, &so);
	/* the destination the migration began with, whatever address this connection reached it by */
	so.name = pc->name;
	ret = mig_session_connect(fd, &so, o->connect, o->connect_ctx, &s2, err, len);
	if (ret < 0) {
		close(fd);
		return ret;
	}
	s2.own_fd[0] = true;
	fch = s2.chan[s2.conns - 1];
	for (i = 0; i < s2.conns; i++)
		mig_conn_set_timeout(s2.conn[i], o->peer_timeout_ms);
	ret = mig_chan_writev(fch, iov, 2);
	for (i = 0; i < s->g->nr_regions; i++)
		memset(pc->next[i], 0, KVMDIRTY_BITMAP_WORDS(regs[i].size / PAGE) * sizeof(uint64_t));
	/* the destination's word on what it lacks: LEFT runs, then END with their count */
	for (nrec = 0; ret == 0; nrec++) {
		int n = mig_chan_read(fch, &rec, sizeof(rec));

		if (n != (int)sizeof(rec)) {
			ret = mig_errf(err, len, n < 0 ? n : -EPIPE, "post-copy recovery: awaiting the pages the "
				       "destination lacks: %s", n < 0 ? strerror(-n) : "the connection ended");
			break;
		}
		ret = mig_pc_map_check(regs, s->g->nr_regions, &rec, nrec, err, len);
		if (ret > 0) {
			ret = 0;
			if (rec.first != total)
				ret = mig_errf(err, len, -EPROTO, "post-copy recovery: END says %" PRIu64 " pages, the runs "
					       "before it %" PRIu64, rec.first, total);
			break;
		}
		if (ret < 0)
			break;
		kvmdirty_bitmap_set(pc->next[rec.index], rec.first, rec.first + rec.count);
		total += rec.count;
	}
	if (ret < 0) {
		mig_session_free(&s2);
		return ret;
	}
	for (i = 0; i < s2.conns; i++)
		mig_conn_set_timeout(s2.conn[i], 0);
	/* the new session and map in place of the old: nothing the destination has is sent again */
	pthread_mutex_lock(&pc->lock);
	for (i = 0; i < s->g->nr_regions; i++) {
		uint64_t *t = s->left[i];

		s->left[i] = pc->next[i];
		pc->next[i] = t;
		listed += kvmdirty_bitmap_count(s->left[i], 0, regs[i].size / PAGE);
	}
	pc->remaining = listed;
	pc->hint_seq++;
	pthread_mutex_unlock(&pc->lock);
	mig_session_free(&s->sess);
	s->sess = s2;
	for (i = 0; i < s->nlanes; i++)
		s->lane[i].ch = s->sess.chan[i];
	return 0;
}

/*
 * Post-copy paused: a new session, dialled once a second for recover_ms
 * (0: until it works), then whenever the status asks (recover); the guest's
 * memory is kept all the while.  0 once recovered.
 */
static int recover(struct spc *pc, const struct mig_region *regs, char *err, size_t len)
{
	struct source *s = pc->s;
	double t0 = mig_clock_msf();
	char why[512] = "", last[512] = "";

	for (;;) {
		bool asked = mig_status_recover_take(s->st, NULL, 0);
		int ret;

		if (asked)
			t0 = mig_clock_msf();
		if (asked || !s->o->recover_ms || mig_clock_msf() - t0 < (double)s->o->recover_ms) {
			ret = reconnect(pc, regs, why, sizeof(why));
			if (ret == 0)
				return 0;
			if (strcmp(why, last)) {
				char esc[2 * MIG_EVENT_LINE / 3];

				mig_event_str(esc, sizeof(esc), why);
				mig_status_event(s->st, "postcopy-recover-failed", "\"side\":\"source\",\"error\":\"%s\"", esc);
				snprintf(last, sizeof(last), "%s", why);
			}
		}
		/* a second between tries, a recover asked meanwhile taken at once */
		for (int i = 0; i < 10 && !mig_status_recover_pending(s->st); i++)
			usleep(100000);
		snprintf(err, len, "%s", last);
	}
}

int src_postcopy(struct source *s, struct mig_result *res, char *err, size_t len)
{
	struct mig_region *regs = calloc(s->g->nr_regions ? s->g->nr_regions : 1, sizeof(*regs));
	uint64_t *hashes = malloc(MIG_RUN_PAGES * sizeof(uint64_t));
	struct spc *pc = calloc(1, sizeof(*pc));
	double t0 = mig_clock_msf();
	enum served how;
	unsigned int i;
	int ret = 0;

	if (pc)
		pc->next = calloc(s->g->nr_regions ? s->g->nr_regions : 1, sizeof(*pc->next));
	for (i = 0; pc && pc->next && i < s->g->nr_regions; i++)
		pc->next[i] = calloc(KVMDIRTY_BITMAP_WORDS(s->g->regions[i].size / PAGE), sizeof(uint64_t));
	if (!pc || !regs || !hashes || !pc->next || (s->g->nr_regions && !pc->next[s->g->nr_regions - 1])) {
		ret = mig_errf(err, len, -ENOMEM, "post-copy: out of memory");
		goto out;
	}
	for (i = 0; i < s->g->nr_regions; i++)
		regs[i] = (struct mig_region){ s->g->regions[i].gpa, s->g->regions[i].size };
	pc->s = s;
	pc->remaining = s->left_pages;
	/*
	 * The bulk held to nine tenths of the link as pre-copy measured it
	 * (unless a cap holds it lower): a fault's answer then finds the
	 * link's queues nearly empty instead of waiting behind the bulk.
	 */
	if (!__atomic_load_n(&s->cap_bps, __ATOMIC_RELAXED) && src_link(s) > 0)
		__atomic_store_n(&s->cap_bps, (uint64_t)(0.9 * src_link(s)), __ATOMIC_RELAXED);
	memcpy(pc->id, s->sess.id, sizeof(pc->id));
	memcpy(pc->name, s->sess.name, sizeof(pc->name));
	pthread_mutex_init(&pc->lock, NULL);
	s->pc = pc;
	mig_status_set_state(s->st, "postcopy");
	mig_status_postcopy_progress(s->st, s->left_pages, 0, 0, 0);
	mig_status_event(s->st, "postcopy-started",
			 "\"side\":\"source\",\"missing_pages\":%" PRIu64 ",\"switch_pause_ms\":%.1f,\"why\":\"%s\"",
			 s->left_pages, res->switch_pause_ms, res->postcopy_why ? res->postcopy_why : "asked");
	for (;;) {
		/* no wait for the destination gives up: a cut ends a read (and pauses post-copy), silence is its right */
		for (i = 0; i < s->sess.conns; i++) {
			mig_conn_set_deadline(s->sess.conn[i], 0);
			mig_conn_set_timeout(s->sess.conn[i], 0);
			mig_conn_keepalive(s->sess.conn[i]);
		}
		spc_start(pc);
		how = serve(pc, res, regs, hashes, &ret, err, len);
		spc_stop(pc, how != SERVED_ALL_IN);
		if (how != SERVED_LOST)
			break;
		{
			char esc[2 * MIG_EVENT_LINE / 3];

			mig_event_str(esc, sizeof(esc), err);
			mig_status_set_state(s->st, "postcopy-paused");
			mig_status_postcopy_paused(s->st, true);
			mig_status_event(s->st, "postcopy-paused",
					 "\"side\":\"source\",\"missing_pages\":%" PRIu64 ",\"why\":\"%s\"", pc->remaining, esc);
		}
		ret = recover(pc, regs, err, len);
		if (ret < 0)
			break;
		res->postcopy_recoveries++;
		mig_status_postcopy_paused(s->st, false);
		mig_status_set_state(s->st, "postcopy");
		mig_status_event(s->st, "postcopy-recovered",
				 "\"side\":\"source\",\"missing_pages\":%" PRIu64 ",\"recoveries\":%" PRIu64, pc->remaining,
				 res->postcopy_recoveries);
	}
	res->postcopy_ms = mig_clock_msf() - t0;
	res->postcopy_requests = pc->requests;
	res->postcopy_answered = pc->answered;
	res->postcopy_bulk = pc->bulk;
	if (how == SERVED_ALL_IN) {
		struct mig_record ack = { .kind = MIG_ALL_IN };
		struct iovec iov = { &ack, sizeof(ack) };

		ret = 0;
		mig_status_postcopy_progress(s->st, 0, res->postcopy_faults, res->fault_p50_us, res->fault_p99_us);
		/* heard: the destination may stop listening for a recovery (best effort: it has every page) */
		mig_chan_writev(s->sess.chan[s->sess.conns - 1], &iov, 1);
		mig_chan_close_write(s->sess.chan[s->sess.conns - 1]);
	} else {
		char esc[2 * MIG_EVENT_LINE / 3];

		mig_event_str(esc, sizeof(esc), err);
		mig_status_set_state(s->st, "failed");
		mig_status_event(s->st, "postcopy-failed", "\"side\":\"source\",\"error\":\"%s\"", esc);
	}
	s->pc = NULL;
	pthread_mutex_destroy(&pc->lock);
out:
	for (i = 0; pc && pc->next && i < s->g->nr_regions; i++)
		free(pc->next[i]);
	if (pc)
		free(pc->next);
	free(pc);
	free(regs);
	free(hashes);
	return ret;
}
