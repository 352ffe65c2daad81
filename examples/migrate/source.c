// SPDX-License-Identifier: MIT
/*
 * The source.  Pages go out in runs straight from guest memory (one iovec
 * per run), zero pages as a record without payload, in batches of about
 * 512 KiB.  With verify each DATA run carries its pages' hashes, taken
 * just before the send by a thread of its own that hashes one batch while
 * the main thread sends the one before (in stop-and-copy the paused vCPUs
 * leave their CPUs to it), and kept (sent_hash, a slot per page, and
 * sent_data, which pages' latest copy was data rather than zero).  The
 * destination checks them as pages land; after its answer, with the guest
 * running over there, the source checks its final memory against
 * sent_hash, off the downtime path.
 *
 * Memory the guest never touched (in private anonymous mappings, per the
 * host's page tables: hostmem.h) goes out as ZERO records without being
 * read, so it stays unpopulated here; the check after switchover leaves it
 * unread too.  Stats are JSON lines, format version 1 (doc/migrate-stats.md).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <unistd.h>

#include "errf.h"
#include "hostmem.h"
#include "source.h"
#include "throttle.h"
#include "session.h"
#include "transport.h"
#include "worker.h"

#define PAGE ((uint64_t)MIG_PAGE_SIZE)
#define BATCH_RECORDS 256
#define BATCH_BYTES (512u << 10) /* a batch, hashed while the one before is sent */
#define BATCH_HASHES (BATCH_BYTES / MIG_PAGE_SIZE + MIG_RUN_PAGES)
#define LOST_NAMED 4 /* pages the one-line report names */
#define LOST_STATS 64 /* ... and the stats */
#define PM_BATCH 4096 /* pagemap entries read at once (32 KiB) */
#define SAMPLE_MS 100.0 /* stats samples within a pass */
/*
 * Pages taken from the tracker at a time: a page handed out is no longer
 * pending, and one the guest writes between its hand-out and its send
 * goes again next pass.  4 MiB is about 40 ms of an 800 Mbit/s link.
 */
#define HAND_OUT 1024
#define STATS_VERSION 1

/* Pages of a batch to hash: into out (the batch's hashes) and sent_hash. */
struct hash_run {
	const uint8_t *hva;
	uint32_t region;
	bool zero; /* sent as ZERO: no hashes in the stream, the zero page's hash is what to expect */
	uint64_t first, count;
	uint64_t *out;
};

struct batch {
	struct mig_record hdr[BATCH_RECORDS];
	struct iovec iov[3 * BATCH_RECORDS];
	struct hash_run runs[BATCH_RECORDS];
	uint64_t hashes[BATCH_HASHES];
	int nh, ni, nruns, nhashes;
	uint64_t bytes;
};

struct source;

/* One connection of the migration: its stream's encoder, its batches, its worker. */
struct lane {
	struct source *s;
	struct mig_chan *ch;
	struct mig_encoder enc;
	/* a batch is filled, handed to the worker, and sent while the next one is filled */
	struct batch batch[2];
	struct batch *cur, *pending;
	struct mig_worker w;
	struct batch *todo; /* handed to the worker, not yet done */
	int err;	    /* the worker failed to send: -errno */
	uint64_t hashed;    /* the worker's (or the main thread's without one) */
};

struct source {
	const struct mig_guest *g;
	const struct mig_send_opts *o;
	struct mig_session sess;
	struct lane *lane;
	unsigned int nlanes;
	bool lanes_send; /* several connections: each lane's worker sends, the main thread only fills */
	uint64_t *sent_hash[MIG_MAX_REGIONS]; /* verify: each page's latest data copy; the hasher's */
	uint64_t *sent_data[MIG_MAX_REGIONS]; /* ... whose latest copy was data (else zero); the hasher's */
	uint64_t zero_hash;
	struct mig_vcpu_state *vs;
	uint64_t pages, zero_pages, untouched_pages;
	uint64_t in_hand; /* pages handed out by the tracker, not yet queued */
	/* which pages were never touched: the regions wholly in private anonymous memory, and pagemap */
	bool anon[MIG_MAX_REGIONS];
	int pagemap;
	uint64_t pme[PM_BATCH];
	/* stats: start, last sample, and each vCPU's progress then */
	double t0, sample_ms;
	uint64_t sample_bytes;
	unsigned int pass; /* the pass under way; 0 in stop-and-copy */
	uint64_t *progress0, *progress_at; /* at the start; at the last sample */
	double before_ms;
	/*
	 * Every SAMPLE_MS (tick()): the link while busy, each vCPU's dirtying
	 * (ring entries in DIRTY_RING mode, KVM's fault count in the others),
	 * and, throttling, the pages re-dirtied since the last tick (a sync)
	 * and what the throttle makes of them.
	 */
	double tick_ms;
	uint64_t tick_acked, tick_unacked;
	double link; /* bytes/s, measured while the socket never ran dry */
	unsigned int nv; /* vCPUs measured: those the guest gave, at most MIG_THROTTLE_MAX_VCPUS */
	bool ring;
	uint64_t vcpu_count[MIG_THROTTLE_MAX_VCPUS], vcpu_held_ns[MIG_THROTTLE_MAX_VCPUS];
	double vcpu_rate[MIG_THROTTLE_MAX_VCPUS];
	bool vcpu_held[MIG_THROTTLE_MAX_VCPUS];
	double redirty; /* pages/s the guest made dirty again, at the last tick that synced */
	struct mig_throttle th;
	bool throttling;
	int sync_err; /* a tick's sync failed: -errno */
	uint64_t applied_limit[MIG_THROTTLE_MAX_VCPUS];
	unsigned int applied_share[MIG_THROTTLE_MAX_VCPUS];
};

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void hash_batch(struct lane *l, struct batch *b)
{
	struct source *s = l->s;
	int i;
	uint64_t k;

	for (i = 0; i < b->nruns; i++) {
		const struct hash_run *r = &b->runs[i];
		uint64_t *sent = s->sent_hash[r->region] + r->first;

		/*
		 * A zero page's slot is left alone (sent_data says which slots
		 * hold a data copy's hash): the slots of a huge guest that is
		 * mostly untouched are never faulted in.  With several
		 * connections, each connection's worker writes the words of its
		 * own chunks only (stream.h).
		 */
		if (r->zero) {
			kvmdirty_bitmap_clear(s->sent_data[r->region], r->first, r->first + r->count);
			continue;
		}
		for (k = 0; k < r->count; k++)
			r->out[k] = sent[k] = mig_page_hash(r->hva + k * PAGE);
		kvmdirty_bitmap_set(s->sent_data[r->region], r->first, r->first + r->count);
		l->hashed += r->count;
	}
}

static int send_batch(struct lane *l, struct batch *b)
{
	int ret = b->ni ? mig_chan_writev(l->ch, b->iov, b->ni) : 0;

	b->nh = b->ni = b->nruns = b->nhashes = 0;
	b->bytes = 0;
	return ret;
}

/*
 * A lane's worker: over one connection it hashes a batch while the main
 * thread sends the one before; over several it hashes and sends, one
 * worker a connection, while the main thread fills the next batches.
 */
static void *lane_worker(void *p)
{
	struct lane *l = p;

	pthread_mutex_lock(&l->w.lock);
	for (;;) {
		struct batch *b;
		int ret;

		while (!l->todo && !l->w.quit)
			pthread_cond_wait(&l->w.cond, &l->w.lock);
		b = l->todo;
		if (!b)
			break;
		pthread_mutex_unlock(&l->w.lock);
		if (l->s->sent_hash[0])
			hash_batch(l, b);
		ret = l->s->lanes_send ? send_batch(l, b) : 0;
		pthread_mutex_lock(&l->w.lock);
		if (ret < 0 && !l->err)
			l->err = ret;
		l->todo = NULL;
		pthread_cond_broadcast(&l->w.cond);
	}
	pthread_mutex_unlock(&l->w.lock);
	return NULL;
}

/* Wait until the worker is done with what it was given. */
static void worker_wait(struct lane *l)
{
	if (!l->w.running)
		return;
	pthread_mutex_lock(&l->w.lock);
	while (l->todo)
		pthread_cond_wait(&l->w.cond, &l->w.lock);
	pthread_mutex_unlock(&l->w.lock);
}

static void worker_give(struct lane *l, struct batch *b)
{
	pthread_mutex_lock(&l->w.lock);
	l->todo = b;
	pthread_cond_broadcast(&l->w.cond);
	pthread_mutex_unlock(&l->w.lock);
}

static int tick(struct source *s);

/*
 * Hand the batch being filled to the worker.  Over one connection, send
 * the one before (hashed by now) meanwhile; without a worker, hash it and
 * send it while its pages are in cache.
 */
static int ship(struct lane *l)
{
	struct batch *b = l->cur;
	int ret = 0;

	if (!l->w.running) {
		if (l->s->sent_hash[0])
			hash_batch(l, b);
		return send_batch(l, b);
	}
	worker_wait(l);
	if (l->err)
		return l->err;
	worker_give(l, b);
	if (!l->s->lanes_send && l->pending)
		ret = send_batch(l, l->pending);
	l->pending = l->s->lanes_send ? NULL : b;
	l->cur = b == &l->batch[0] ? &l->batch[1] : &l->batch[0];
	return ret;
}

/* Everything queued on a lane, out. */
static int flush_lane(struct lane *l)
{
	int ret = ship(l);

	if (!l->w.running)
		return ret;
	worker_wait(l);
	if (ret == 0)
		ret = l->err;
	if (ret == 0 && l->pending)
		ret = send_batch(l, l->pending);
	l->pending = NULL;
	return ret;
}

/* Everything queued, on every connection, out. */
static int flush(struct source *s)
{
	unsigned int i;
	int ret = 0, r;

	for (i = 0; i < s->nlanes; i++) {
		r = flush_lane(&s->lane[i]);
		if (r < 0 && ret == 0)
			ret = r;
	}
	return ret;
}

/* Queue a record (encoded just before, in its lane's stream order), its payload and the pages to hash. */
static int put(struct lane *l, struct mig_record rec, const void *payload, size_t plen, const struct hash_run *run)
{
	struct source *s = l->s;
	struct batch *b = l->cur;
	int ret;

	if (b->nh == BATCH_RECORDS || b->bytes >= BATCH_BYTES) {
		ret = ship(l);
		if (ret < 0)
			return ret;
		ret = tick(s);
		if (ret < 0)
			return ret;
		b = l->cur;
	}
	b->hdr[b->nh] = rec;
	b->iov[b->ni++] = (struct iovec){ &b->hdr[b->nh++], sizeof(rec) };
	if (run && s->sent_hash[0]) {
		b->runs[b->nruns] = *run;
		if (!run->zero) {
			b->runs[b->nruns].out = b->hashes + b->nhashes;
			b->iov[b->ni++] = (struct iovec){ b->hashes + b->nhashes, run->count * sizeof(uint64_t) };
			b->nhashes += (int)run->count;
		}
		b->nruns++;
	}
	if (plen)
		b->iov[b->ni++] = (struct iovec){ (void *)payload, plen };
	b->bytes += sizeof(rec) + plen;
	return 0;
}

static bool page_is_zero(const uint8_t *p)
{
	static const uint8_t zero[PAGE];

	return !memcmp(p, zero, PAGE);
}

/* One run on its lane; over several connections, cut at chunk boundaries (stream.h). */
static int send_run(struct source *s, uint32_t idx, uint64_t first, uint64_t count, const uint8_t *hva, bool zero)
{
	s->pages += count;
	s->in_hand -= count < s->in_hand ? count : s->in_hand;
	if (zero)
		s->zero_pages += count;
	while (count) {
		uint64_t n = s->nlanes == 1 ? count : MIG_LANE_PAGES - first % MIG_LANE_PAGES;
		struct lane *l = &s->lane[s->nlanes == 1 ? 0 : mig_lane_of(idx, first, s->nlanes)];
		/* out is set by put(): slots of the batch's hashes */
		struct hash_run run = { .hva = hva, .region = idx, .zero = zero, .first = first };
		int ret;

		if (n > count)
			n = count;
		run.count = n;
		if (zero)
			ret = put(l, mig_encode_zero(&l->enc, idx, first, n), NULL, 0, &run);
		else
			ret = put(l, mig_encode_data(&l->enc, idx, first, n), hva, n * PAGE, &run);
		if (ret < 0)
			return ret;
		first += n;
		count -= n;
		if (hva)
			hva += n * PAGE;
	}
	return 0;
}

/* Pages read to be sent: zero runs and data runs of at most MIG_RUN_PAGES. */
static int send_read(struct source *s, uint32_t idx, uint64_t page, uint64_t n, const uint8_t *p)
{
	uint64_t i = 0, j;
	int ret;

	while (i < n) {
		bool zero = page_is_zero(p + i * PAGE);

		for (j = i + 1; j < n && (zero || j - i < MIG_RUN_PAGES) && page_is_zero(p + j * PAGE) == zero; j++)
			;
		ret = send_run(s, idx, page + i, j - i, p + i * PAGE, zero);
		if (ret < 0)
			return ret;
		i = j;
	}
	return 0;
}

/*
 * Pagemap entries of up to PM_BATCH pages of region idx from page into
 * s->pme: how many, or 0 where the host cannot say which are untouched
 * (not private anonymous memory, no pagemap): every page is then read.
 */
static uint64_t untouched_map(struct source *s, uint32_t idx, uint64_t page, uint64_t n)
{
	const uint8_t *hva = (const uint8_t *)s->g->regions[idx].hva + page * PAGE;

	if (n > PM_BATCH)
		n = PM_BATCH;
	if (!s->anon[idx] || s->pagemap < 0 || mig_pagemap_read(s->pagemap, hva, n, s->pme) < 0)
		return 0;
	return n;
}

/*
 * One handed-out range (protected by now): pages never touched as ZERO
 * runs, unread; the others read, as zero runs and data runs.
 */
static int send_range(struct source *s, const struct kvmdirty_range *rg)
{
	const uint8_t *p = rg->hva;
	uint64_t done = 0, k, i, j;
	uint32_t idx;
	int ret;

	for (idx = 0; idx < s->g->nr_regions && s->g->regions[idx].region != rg->region; idx++)
		;
	if (idx == s->g->nr_regions)
		return -ENOENT;
	while (done < rg->npages) {
		k = untouched_map(s, idx, rg->page + done, rg->npages - done);
		if (!k)
			return send_read(s, idx, rg->page + done, rg->npages - done, p + done * PAGE);
		for (i = 0; i < k; i = j) {
			bool untouched = mig_pm_untouched(s->pme[i]);

			for (j = i + 1; j < k && mig_pm_untouched(s->pme[j]) == untouched; j++)
				;
			if (untouched) {
				s->untouched_pages += j - i;
				ret = send_run(s, idx, rg->page + done + i, j - i, NULL, true);
			} else {
				ret = send_read(s, idx, rg->page + done + i, j - i, p + (done + i) * PAGE);
			}
			if (ret < 0)
				return ret;
		}
		done += k;
	}
	return 0;
}

/* A failure to send or to hear from the destination, in one line. */
static int net_fail(struct source *s, int ret, const char *what, char *err, size_t len)
{
	char why[96];

	if (ret == -ENOENT)
		return mig_errf(err, len, ret, "the tracker reported a region the guest lacks");
	if (ret == -EPIPE || ret == -ECONNRESET) {
		struct mig_ack ack;

		/* a destination that refused said why before it closed: that is the reason to give */
		if (mig_chan_read(s->lane[0].ch, &ack, sizeof(ack)) == (int)sizeof(ack) && ack.status < 0) {
			return mig_errf(err, len, ack.status, "destination refused: %s", mig_ack_text(&ack));
		}
	}
	mig_chan_strerror(s->lane[0].ch, ret, why, sizeof(why));
	return mig_errf(err, len, ret, "%s: %s", what, why);
}

static uint64_t hashed(const struct source *s)
{
	uint64_t n = 0;
	unsigned int i;

	for (i = 0; i < s->nlanes; i++)
		n += s->lane[i].hashed;
	return n;
}

static double now_rel(const struct source *s)
{
	return now_ms() - s->t0;
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
static void line_start(const struct source *s, const char *type)
{
	fprintf(s->o->stats, "{\"v\":%d,\"type\":\"%s\",\"t_ms\":%.3f", STATS_VERSION, type, now_rel(s));
}

/* How long vCPU i was held by its dirty limit, or kept out by its run share, so far. */
static double held_ms(const struct source *s, unsigned int i)
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
			fprintf(s->o->stats, ",\"held_ms\":%.1f", held_ms(s, i));
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
		s->pass, sent, s->pages, (kvmdirty_tracker_pending(s->g->tracker) + s->in_hand) * PAGE,
		s->link > 0 ? s->link : dt_ms > 0 ? (double)(sent - s->sample_bytes) / (dt_ms / 1e3) : 0.0,
		st.dirty_rate, s->redirty, s->th.engaged ? "true" : "false");
	vcpu_samples(s, dt_ms);
	s->sample_bytes = sent;
	s->sample_ms = now_ms();
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
static void throttle_off(struct source *s)
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

/*
 * A sample, every SAMPLE_MS while sending: the link (acknowledged bytes,
 * counted only while the socket never ran dry), each vCPU's dirtying,
 * and, throttling in pre-copy, a sync whose new pages are the guest's
 * re-dirtying, for the throttle.  Then the stats line.
 */
static int tick(struct source *s)
{
	double t = now_ms(), dt = t - s->tick_ms;
	uint64_t sent, unacked, acked;
	unsigned int i;

	if (dt < SAMPLE_MS)
		return 0;
	sent = mig_session_sent(&s->sess);
	unacked = mig_session_unacked(&s->sess);
	acked = sent - (unacked < sent ? unacked : sent);
	if (unacked && s->tick_unacked && acked > s->tick_acked) {
		double rate = (double)(acked - s->tick_acked) / (dt / 1e3);

		s->link = s->link > 0 ? 0.75 * s->link + 0.25 * rate : rate;
	}
	s->tick_acked = acked;
	s->tick_unacked = unacked;
	s->tick_ms = t;
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
	if (s->throttling && s->pass && s->link > 0) {
		struct mig_throttle_sample smp = { .link_pages_per_s = s->link / PAGE };
		int64_t fresh = kvmdirty_tracker_sync(s->g->tracker);

		if (fresh < 0)
			return s->sync_err = (int)fresh;
		smp.redirty_per_s = s->redirty = (double)fresh / (dt / 1e3);
		memcpy(smp.vcpu_rate, s->vcpu_rate, sizeof(smp.vcpu_rate));
		memcpy(smp.vcpu_held, s->vcpu_held, sizeof(smp.vcpu_held));
		if (mig_throttle_update(&s->th, &smp))
			throttle_apply(s, false);
	}
	if (s->o->stats) {
		line_start(s, "sample");
		flow_fields(s, t - s->sample_ms);
		fprintf(s->o->stats, "}\n");
	}
	return 0;
}

/*
 * Hand out and send what is pending, at most max_pages (0: all there is,
 * however long the guest keeps dirtying): a pass sends what was pending
 * when it began, while the ticks' syncs add what the guest re-dirties.
 */
static int drain(struct source *s, uint64_t max_pages)
{
	struct kvmdirty_range rg[64];
	uint64_t left = max_pages;
	int n = 0, i, ret;

	while ((!max_pages || left) &&
	       (n = kvmdirty_tracker_next(s->g->tracker, rg, 64, max_pages && left < HAND_OUT ? left : HAND_OUT)) > 0) {
		for (i = 0; i < n; i++) {
			s->in_hand += rg[i].npages;
			left -= max_pages ? rg[i].npages : 0;
		}
		for (i = 0; i < n; i++) {
			ret = send_range(s, &rg[i]);
			if (ret < 0)
				return ret;
		}
	}
	return n < 0 ? n : flush(s);
}

/*
 * Wait until what was sent has left the socket and crossed the link
 * (acknowledged), ticking meanwhile: a pass ends when its pages are
 * across, so the rest measured after it is what the guest dirtied while
 * they went, and a pause after it waits for nothing queued.
 */
static int settle(struct source *s)
{
	double t0 = now_ms();
	int ret;

	while (mig_session_unacked(&s->sess)) {
		if (s->o->peer_timeout_ms && now_ms() - t0 > (double)s->o->peer_timeout_ms)
			return -ETIMEDOUT;
		usleep(200);
		ret = tick(s);
		if (ret < 0)
			return ret;
	}
	return 0;
}

static void pass_line(struct source *s, uint64_t pages, uint64_t zero, uint64_t untouched, uint64_t bytes, double ms,
		      uint64_t remaining, double mib_s, double est_ms)
{
	if (s->o->stats) {
		line_start(s, "pass");
		flow_fields(s, now_ms() - s->sample_ms);
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

/*
 * After switchover: the final memory against the hash of what was last
 * sent of each page.  The vCPUs are paused for good, so memory holds still;
 * a page never touched is zero without being read.
 */
static void check_sent(struct source *s, struct mig_result *res, char *err, size_t len)
{
	const struct mig_guest *g = s->g;
	double t0 = now_ms();
	size_t at = 0;
	unsigned int i;
	uint64_t k, m, n, b;

	if (s->o->stats) {
		line_start(s, "verify");
		fprintf(s->o->stats, ",\"lost\":[");
	}
	for (i = 0; i < g->nr_regions; i++) {
		const uint8_t *p = g->regions[i].hva;

		n = g->regions[i].size / PAGE;
		for (k = 0; k < n; k += b) {
			b = untouched_map(s, i, k, n - k);
			for (m = 0; m < (b ? b : 1); m++) {
				uint64_t page = k + m, gpa = g->regions[i].gpa + page * PAGE;
				uint64_t h = b && mig_pm_untouched(s->pme[m]) ? s->zero_hash : mig_page_hash(p + page * PAGE);

				if (h == (kvmdirty_bitmap_is_clear(s->sent_data[i], page, page + 1) ? s->zero_hash
													  : s->sent_hash[i][page]))
					continue;
				if (!res->lost_pages)
					at = (size_t)snprintf(err, len, "after switchover: pages differ from what was sent, "
							 "so tracking lost writes:");
				if (res->lost_pages < LOST_NAMED && at < len)
					at += (size_t)snprintf(err + at, len - at, " region %u page %" PRIu64 " (gpa 0x%" PRIx64
							       ")", i, page, gpa);
				if (res->lost_pages < LOST_STATS && s->o->stats)
					fprintf(s->o->stats, "%s{\"region\":%u,\"page\":%" PRIu64 ",\"gpa\":%" PRIu64 "}",
						res->lost_pages ? "," : "", i, page, gpa);
				res->lost_pages++;
			}
			if (!b)
				b = 1;
		}
		res->verified_pages += n;
	}
	if (res->lost_pages > LOST_NAMED && at < len)
		snprintf(err + at, len - at, " and %" PRIu64 " more", res->lost_pages - LOST_NAMED);
	res->verify_ms = now_ms() - t0;
	if (s->o->stats)
		fprintf(s->o->stats, "],\"verified_pages\":%" PRIu64 ",\"lost_pages\":%" PRIu64 ",\"verify_ms\":%.3f}\n",
			res->verified_pages, res->lost_pages, res->verify_ms);
}

static int alloc_hashes(struct source *s)
{
	unsigned int i;

	for (i = 0; i < s->g->nr_regions; i++) {
		s->sent_hash[i] = calloc(s->g->regions[i].size / PAGE, sizeof(uint64_t));
		s->sent_data[i] = calloc(KVMDIRTY_BITMAP_WORDS(s->g->regions[i].size / PAGE), sizeof(uint64_t));
		if (!s->sent_hash[i] || !s->sent_data[i])
			return -ENOMEM;
	}
	return 0;
}

/*
 * Pre-copy passes until the rest fits the downtime, or a limit.  A pass
 * sends what was pending when it began and ends once it is across the
 * link (settle()); then a sync, and the rest is judged at the link's rate
 * plus what that sync took (the final one, paused, takes as long) plus a
 * round trip, against DOWNTIME_SHARE of the limit.
 */
#define DOWNTIME_SHARE 0.9

static int precopy(struct source *s, struct mig_result *res, char *err, size_t len)
{
	const struct mig_send_opts *o = s->o;
	struct kvmdirty_tracker *t = s->g->tracker;
	struct kvmdirty_stats st;

	for (;;) {
		uint64_t pages0 = s->pages, zero0 = s->zero_pages, un0 = s->untouched_pages;
		uint64_t bytes0 = mig_session_sent(&s->sess), pending;
		double tp = now_ms(), ms, mib_s, est, link, ts;
		int ret;

		s->pass = (unsigned int)++res->passes;
		ret = drain(s, kvmdirty_tracker_pending(t));
		if (ret == 0)
			ret = put(&s->lane[0], mig_encode_pass(&s->lane[0].enc, res->passes), NULL, 0, NULL);
		if (ret == 0)
			ret = flush(s);
		if (ret == 0)
			ret = settle(s);
		if (s->sync_err)
			return mig_errf(err, len, s->sync_err, "dirty log sync: %s", strerror(-s->sync_err));
		if (ret < 0)
			return net_fail(s, ret, "pre-copy: sending to the destination", err, len);
		ms = now_ms() - tp;
		mib_s = ms > 0 ? (mig_session_sent(&s->sess) - bytes0) / 1048576.0 / (ms / 1e3) : 0;
		ts = now_ms();
		ret = (int)kvmdirty_tracker_sync(t);
		if (ret < 0)
			return mig_errf(err, len, ret, "dirty log sync: %s", strerror(-ret));
		ts = now_ms() - ts;
		pending = kvmdirty_tracker_pending(t);
		link = s->link > 0 ? s->link / 1048576.0 : mib_s;
		/* what the pause sends at the link's rate, the final sync (as long as this one), a round trip */
		est = link > 0 ? pending * PAGE / 1048576.0 / link * 1e3 + ts + mig_session_rtt_us(&s->sess) / 1e3 : 0;
		pass_line(s, s->pages - pages0, s->zero_pages - zero0, s->untouched_pages - un0,
			  mig_session_sent(&s->sess) - bytes0, ms, pending, mib_s, est);
		res->est_downtime_ms = est;
		res->link_bytes_per_s = link * 1048576.0;
		res->remaining_pages = pending;
		kvmdirty_tracker_stats(t, &st, sizeof(st));
		res->dirty_pages_per_s = st.dirty_rate;
		/*
		 * Within nine tenths of the limit: the rest is kept for what
		 * cannot be measured before it happens (pausing the vCPUs,
		 * their state, the destination's resume before it answers).
		 */
		if (est <= DOWNTIME_SHARE * (double)o->downtime_ms) {
			res->converged = true;
			res->reason = "fits_downtime";
			return 0;
		}
		if (res->passes >= o->max_passes) {
			res->reason = "pass_limit";
			return 0;
		}
		/* from the start of tracking, as total_ms: a baseline measured before is not pre-copy */
		if (now_rel(s) - s->before_ms >= (double)o->timeout_ms) {
			res->reason = "time_limit";
			return 0;
		}
	}
}

/* vCPUs paused: the rest, their state, END; then the destination's answer. */
static int stop_and_copy(struct source *s, char *err, size_t len)
{
	const struct mig_guest *g = s->g;
	struct mig_ack ack;
	unsigned int i;
	int ret = (int)kvmdirty_tracker_sync(g->tracker);

	if (ret < 0)
		return mig_errf(err, len, ret, "final dirty log sync: %s", strerror(-ret));
	ret = drain(s, 0);
	for (i = 0; ret >= 0 && i < g->nr_vcpus; i++) {
		ret = g->ops->vcpu_save(g->ctx, i, &s->vs[i]);
		if (ret < 0)
			return mig_errf(err, len, ret, "reading vCPU %u state: %s", i, strerror(-ret));
		ret = put(&s->lane[0], mig_encode_vcpu(&s->lane[0].enc, i, &s->vs[i]), &s->vs[i], sizeof(s->vs[i]), NULL);
	}
	/* each connection's stream ends with its own END */
	for (i = 0; ret >= 0 && i < s->nlanes; i++)
		ret = put(&s->lane[i], mig_encode_end(&s->lane[i].enc), NULL, 0, NULL);
	if (ret >= 0)
		ret = flush(s);
	for (i = 0; ret >= 0 && i < s->nlanes; i++)
		ret = mig_chan_close_write(s->lane[i].ch);
	if (ret < 0)
		return net_fail(s, ret, "stop-and-copy: sending to the destination", err, len);
	ret = mig_chan_read(s->lane[0].ch, &ack, sizeof(ack));
	if (ret < 0)
		return net_fail(s, ret, "awaiting the destination's answer", err, len);
	if (ret < (int)sizeof(ack))
		return mig_errf(err, len, -EPROTO, "the destination closed the connection without answering");
	if (ack.status)
		return mig_errf(err, len, ack.status < 0 ? ack.status : -EPROTO, "destination refused: %s", mig_ack_text(&ack));
	return 0;
}

/*
 * The vCPUs to measure and, with o->throttle, to slow: those the guest
 * gave (DIRTY_RING: by dirty limits; else by run shares, if the VMM can).
 */
static void throttle_init(struct source *s)
{
	const struct mig_guest *g = s->g;
	unsigned int i;

	s->ring = kvmdirty_tracker_mode(g->tracker) == KVMDIRTY_MODE_DIRTY_RING;
	for (s->nv = 0; s->nv < g->nr_vcpus && s->nv < MIG_THROTTLE_MAX_VCPUS && g->vcpu[s->nv]; s->nv++)
		;
	mig_throttle_init(&s->th, s->ring, s->nv, 0);
	s->throttling = s->o->throttle && s->nv && (s->ring || g->ops->set_run_share);
	for (i = 0; i < s->nv; i++) {
		struct kvmdirty_vcpu_stats st;

		s->applied_share[i] = 1000;
		if (!kvmdirty_vcpu_stats(g->vcpu[i], &st, sizeof(st)))
			s->vcpu_count[i] = s->ring ? st.dirtied : st.faults;
	}
	s->tick_ms = now_ms();
}

static const char *mode_name(enum kvmdirty_mode m)
{
	return m == KVMDIRTY_MODE_DIRTY_LOG ? "dirty-log" : m == KVMDIRTY_MODE_CLEAR_LOG ? "clear-log"
	       : m == KVMDIRTY_MODE_DIRTY_RING ? "dirty-ring" : "auto";
}

/*
 * Before tracking starts: each vCPU's speed over baseline_ms, and where
 * the speed during the migration is counted from.
 */
static int baseline(struct source *s, struct mig_result *res)
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
		t = now_ms();
		usleep((useconds_t)(s->o->baseline_ms * 1000));
		t = now_ms() - t;
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
static void during(struct source *s, struct mig_result *res)
{
	const struct mig_guest *g = s->g;
	double t = now_rel(s) - s->before_ms;
	unsigned int i;

	for (i = 0; g->ops->progress && s->progress0 && i < g->nr_vcpus && t > 0; i++)
		res->vcpu_during[i] = (double)(g->ops->progress(g->ctx, i) - s->progress0[i]) / (t / 1e3);
}

static void start_line(struct source *s, const struct mig_result *res)
{
	const struct mig_guest *g = s->g;
	uint64_t pages = 0;
	unsigned int i;

	for (i = 0; i < g->nr_regions; i++)
		pages += g->regions[i].size / PAGE;
	line_start(s, "start");
	fprintf(s->o->stats,
		",\"mode\":\"%s\",\"regions\":%u,\"guest_pages\":%" PRIu64 ",\"page_size\":%u,\"vcpus\":%u"
		",\"downtime_limit_ms\":%" PRIu64 ",\"max_passes\":%u,\"timeout_ms\":%" PRIu64 ",\"verify\":%s"
		",\"baseline_ms\":%" PRIu64 ",\"connections\":%u,\"psk\":%s,\"encrypt\":%s,\"vcpu\":[",
		mode_name(kvmdirty_tracker_mode(g->tracker)), g->nr_regions, pages, MIG_PAGE_SIZE, g->nr_vcpus,
		s->o->downtime_ms, s->o->max_passes, s->o->timeout_ms, s->o->verify ? "true" : "false",
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

/* Why pre-copy did not converge, in words: what was left, what the link took, what the guest dirtied. */
static void not_converged(const struct source *s, const struct mig_result *res, char *buf, size_t len)
{
	snprintf(buf, len, "after %" PRIu64 " passes the rest (%.1f MiB) needed %.0f ms at %.1f MiB/s, "
		 "over the %.0f ms kept for it of the %" PRIu64 " ms limit; the guest dirtied %" PRIu64
		 " pages/s (%.1f MiB/s)%s",
		 res->passes, res->remaining_pages * PAGE / 1048576.0, res->est_downtime_ms,
		 res->link_bytes_per_s / 1048576.0, DOWNTIME_SHARE * (double)s->o->downtime_ms, s->o->downtime_ms,
		 res->dirty_pages_per_s,
		 res->dirty_pages_per_s * PAGE / 1048576.0,
		 !s->throttling ? ", not throttled" : "");
}

static void end_line(struct source *s, const struct mig_result *res, int ret, const char *err)
{
	const struct mig_guest *g = s->g;
	unsigned int i;

	line_start(s, "end");
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

		not_converged(s, res, why, sizeof(why));
		fprintf(s->o->stats, ",\"detail\":");
		json_str(s->o->stats, why);
	}
	fprintf(s->o->stats, ",\"throttle\":%s,\"throttled\":%s", s->throttling ? "true" : "false",
		res->throttled ? "true" : "false");
	if (g->ops->progress || s->nv) {
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
	fprintf(s->o->stats, "}\n");
}

int mig_send(const struct mig_guest *g, int fd, const struct mig_send_opts *o, struct mig_result *res, char *err,
	     size_t len)
{
	struct source *s = calloc(1, sizeof(*s));
	struct mig_region desc[MIG_MAX_REGIONS];
	struct mig_session_opts so = { .psk = o->psk, .encrypt = o->encrypt, .conns = o->connections,
				       .timeout_ms = o->peer_timeout_ms };
	struct mig_header h;
	double tdown = 0;
	uint64_t hashed0 = 0, pages0 = 0;
	bool paused = false, started = false, abandoned = false;
	unsigned int i;
	int ret;

	memset(res, 0, sizeof(*res));
	err[0] = 0;
	if (!s)
		return mig_errf(err, len, -ENOMEM, "out of memory");
	s->g = g;
	s->o = o;
	s->t0 = s->sample_ms = now_ms();
	s->pagemap = -1;
	if (!g->tracker || g->nr_regions > MIG_MAX_REGIONS || g->nr_vcpus > MIG_MAX_VCPUS) {
		ret = mig_errf(err, len, -EINVAL, "the source guest has no tracker, or more than %u regions or %u vCPUs",
			       MIG_MAX_REGIONS, MIG_MAX_VCPUS);
		goto out;
	}
	/* the session first: a destination that cannot prove the key sees nothing of the guest */
	ret = mig_session_connect(fd, &so, o->connect, o->connect_ctx, &s->sess, err, len);
	if (ret < 0)
		goto out;
	s->nlanes = s->sess.conns;
	s->lanes_send = s->nlanes > 1;
	s->lane = calloc(s->nlanes, sizeof(*s->lane));
	if (!s->lane) {
		ret = mig_errf(err, len, -ENOMEM, "out of memory");
		goto out;
	}
	for (i = 0; i < s->nlanes; i++) {
		struct lane *l = &s->lane[i];

		l->s = s;
		l->ch = s->sess.chan[i];
		l->cur = &l->batch[0];
		l->enc = (struct mig_encoder){ .flags = o->verify ? MIG_F_PAGE_HASH : 0, .sum = MIG_SUM_INIT };
	}
	s->vs = calloc(g->nr_vcpus, sizeof(*s->vs));
	if (!s->vs || (o->verify && alloc_hashes(s) < 0) || baseline(s, res) < 0) {
		ret = mig_errf(err, len, -ENOMEM, "out of memory for page hashes and vCPU state");
		goto out;
	}
	s->before_ms = now_rel(s);
	s->sample_ms = now_ms();
	/* without pagemap every page is read: slower, never wrong */
	s->pagemap = mig_pagemap_open();
	for (i = 0; i < g->nr_regions; i++)
		s->anon[i] = mig_hostmem_private_anon(g->regions[i].hva, g->regions[i].size) == 1;
	s->zero_hash = mig_zero_page_hash();
	for (i = 0; i < s->nlanes; i++) {
		if (!s->lanes_send && !(o->verify && !o->inline_hash))
			break;
		ret = mig_worker_start(&s->lane[i].w, lane_worker, &s->lane[i]);
		if (ret < 0) {
			mig_errf(err, len, ret, "starting a thread for connection %u: %s", i, strerror(-ret));
			goto out;
		}
	}
	for (i = 0; i < g->nr_regions; i++)
		desc[i] = (struct mig_region){ g->regions[i].gpa, g->regions[i].size };
	throttle_init(s);
	if (o->stats)
		start_line(s, res);
	ret = kvmdirty_tracker_start(g->tracker, NULL);
	if (ret < 0) {
		mig_errf(err, len, ret, "starting dirty tracking: %s", strerror(-ret));
		goto out;
	}
	started = true;
	mig_encode_header(&s->lane[0].enc, &h, desc, g->nr_regions, g->nr_vcpus, o->verify ? MIG_F_PAGE_HASH : 0);
	{
		struct iovec iov[2] = { { &h, sizeof(h) }, { desc, g->nr_regions * sizeof(desc[0]) } };

		ret = mig_chan_writev(s->lane[0].ch, iov, 2);
		if (ret < 0)
			net_fail(s, ret, "sending the header", err, len);
	}
	if (ret == 0)
		ret = precopy(s, res, err, len);
	if (ret == 0 && !res->converged && !o->force_switchover) {
		char why[256];

		/* the downtime promised cannot be kept: the guest stays here, running */
		not_converged(s, res, why, sizeof(why));
		ret = mig_errf(err, len, -ETIME, "pre-copy did not converge (%s): %s", res->reason, why);
		abandoned = true;
	}
	if (ret == 0) {
		tdown = now_ms();
		hashed0 = hashed(s);
		pages0 = s->pages;
		during(s, res);
		g->ops->pause(g->ctx);
		paused = true;
		s->pass = 0;
		ret = stop_and_copy(s, err, len);
	}
	if (ret == 0) {
		res->downtime_ms = now_ms() - tdown;
		res->downtime_hashed = hashed(s) - hashed0;
		res->downtime_pages = s->pages - pages0;
	}
out:
	/* never paused (abandoned, or failed in pre-copy): each vCPU's speed up to now */
	if (started && !paused)
		during(s, res);
	if (o->progress)
		fprintf(stderr, "\n");
	/* the migration proper: from the start of tracking (a baseline measured before is not part of it) */
	res->total_ms = now_ms() - (started ? s->t0 + s->before_ms : s->t0);
	res->bytes = mig_session_sent(&s->sess);
	res->pages = s->pages;
	res->zero_pages = s->zero_pages;
	res->untouched_pages = s->untouched_pages;
	/* abandoned for not converging: the reason stays why */
	if (ret < 0 && !abandoned)
		res->reason = "failed";
	res->throttled = s->th.engaged;
	for (i = 0; i < s->nv; i++)
		res->vcpu_held_ms[i] = held_ms(s, i);
	throttle_off(s);
	if (started)
		kvmdirty_tracker_stop(g->tracker, NULL);
	/* a failed migration leaves the guest running where it was */
	if (ret < 0 && paused)
		g->ops->resume(g->ctx);
	if (ret == 0 && o->verify) {
		check_sent(s, res, err, len);
		ret = res->lost_pages > INT32_MAX ? INT32_MAX : (int)res->lost_pages;
	}
	if (o->stats)
		end_line(s, res, ret, err);
	for (i = 0; i < s->nlanes; i++)
		mig_worker_stop(&s->lane[i].w);
	free(s->lane);
	mig_session_free(&s->sess);
	if (s->pagemap >= 0)
		close(s->pagemap);
	free(s->vs);
	free(s->progress0);
	free(s->progress_at);
	for (i = 0; i < MIG_MAX_REGIONS; i++) {
		free(s->sent_hash[i]);
		free(s->sent_data[i]);
	}
	free(s);
	return ret;
}
