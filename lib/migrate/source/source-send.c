// SPDX-License-Identifier: MIT
/*
 * The source's sending: a lane per connection, each with its encoder, two
 * batches and a worker thread; records queued into batches (src_put()),
 * runs of pages cut by chunk onto their lanes, zero pages found, and the
 * pages the guest never touched sent without being read (pagemap).
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "errf.h"
#include "hostmem.h"
#include "source-int.h"

/*
 * The cap (struct source's cap_bps): a batch goes once the last one has
 * had its time at the cap now in force, so the stream holds the cap over
 * any stretch longer than a batch (512 KiB: 12.5 ms at 40 MiB/s), and a
 * cap set while it waits counts from then.  Waits in slices of at most
 * PACE_SLICE_MS, a cancel ending them; a stream that fell behind (idle, or
 * the link slower) gets at most PACE_CREDIT_MS of credit back.
 */
#define PACE_SLICE_MS 10.0
#define PACE_CREDIT_MS 20.0

int src_pace(struct source *s, uint64_t bytes)
{
	double at;
	int ret = 0;

	pthread_mutex_lock(&s->pace_lock);
	for (;;) {
		uint64_t cap = __atomic_load_n(&s->cap_bps, __ATOMIC_RELAXED);
		double now = mig_clock_msf();

		if (!cap) {
			at = now;
			break;
		}
		at = s->pace_at + (double)s->pace_bytes * 1e3 / (double)cap;
		if (at <= now) {
			if (at < now - PACE_CREDIT_MS)
				at = now - PACE_CREDIT_MS;
			break;
		}
		if (mig_status_cancel_asked(s->st)) {
			ret = -ECANCELED;
			break;
		}
		usleep((useconds_t)((at - now < PACE_SLICE_MS ? at - now : PACE_SLICE_MS) * 1e3));
	}
	if (ret == 0) {
		s->pace_at = at;
		s->pace_bytes = bytes;
	}
	pthread_mutex_unlock(&s->pace_lock);
	return ret;
}

static int send_batch(struct lane *l, struct batch *b)
{
	uint64_t bytes = 0, t0 = mig_clock_ns();
	int i, ret;

	for (i = 0; i < b->ni; i++)
		bytes += b->iov[i].iov_len;
	ret = b->ni ? src_pace(l->s, bytes) : 0;
	if (ret == 0 && b->ni)
		ret = mig_chan_writev(l->ch, b->iov, b->ni);
	if (ret == 0)
		src_zip_sent(l, bytes, mig_clock_ns() - t0);
	b->nh = b->ni = b->nruns = b->nhashes = 0;
	b->bytes = 0;
	b->zused = 0;
	return ret;
}

/* A batch made ready to send: its pages hashed, then its DATA records compressed where that pays. */
static void prepare_batch(struct lane *l, struct batch *b)
{
	if (l->s->sent_hash)
		src_hash_batch(l, b);
	src_zip_batch(l, b);
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
		prepare_batch(l, b);
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

/* A lane per connection of the session, each with its own encoder. */
int src_lanes_new(struct source *s, char *err, size_t len)
{
	unsigned int i;

	/* post-copy's fault channel, the session's last connection, is no lane */
	s->nlanes = s->sess.conns - (s->postcopy ? 1 : 0);
	s->lanes_send = s->nlanes > 1;
	s->lane = calloc(s->nlanes, sizeof(*s->lane));
	if (!s->lane)
		return mig_errf(err, len, -ENOMEM, "out of memory");
	for (i = 0; i < s->nlanes; i++) {
		struct lane *l = &s->lane[i];

		l->s = s;
		l->ch = s->sess.chan[i];
		l->cur = &l->batch[0];
		l->enc = (struct mig_encoder){ .flags = s->o->verify ? MIG_F_PAGE_HASH : 0, .sum = MIG_SUM_INIT };
	}
	return 0;
}

/* Workers where they help: to send, over several connections; to hash, with verify (unless inline). */
int src_workers_start(struct source *s, char *err, size_t len)
{
	unsigned int i;
	int ret;

	for (i = 0; i < s->nlanes; i++) {
		if (!s->lanes_send && !(s->o->verify && !s->o->inline_hash))
			break;
		ret = mig_worker_start(&s->lane[i].w, lane_worker, &s->lane[i]);
		if (ret < 0)
			return mig_errf(err, len, ret, "starting a thread for connection %u: %s", i, strerror(-ret));
	}
	return 0;
}

void src_lanes_free(struct source *s)
{
	unsigned int i;

	for (i = 0; i < s->nlanes; i++) {
		mig_worker_stop(&s->lane[i].w);
		src_zip_free(&s->lane[i]);
	}
	free(s->lane);
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
		prepare_batch(l, b);
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
int src_flush(struct source *s)
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

/*
 * A batch's bytes: BATCH_BYTES, or under a cap what the cap lets through
 * in 10 ms (at least 64 KiB), so that the stream is paced in steps that
 * small: a second's bytes then stray from the cap by a step at most (1%).
 */
uint64_t src_batch_bytes(const struct source *s)
{
	uint64_t cap = __atomic_load_n(&s->cap_bps, __ATOMIC_RELAXED), b = cap / 100;

	if (!cap || b >= BATCH_BYTES)
		return BATCH_BYTES;
	return b < (64u << 10) ? 64u << 10 : b;
}

/* Queue a record (encoded just before, in its lane's stream order), its payload and the pages to hash. */
int src_put(struct lane *l, struct mig_record rec, const void *payload, size_t plen, const struct hash_run *run)
{
	struct source *s = l->s;
	struct batch *b = l->cur;
	int ret;

	if (b->nh == BATCH_RECORDS || b->bytes >= src_batch_bytes(s)) {
		ret = ship(l);
		if (ret < 0)
			return ret;
		/* the data path never calls up: the pass loop runs the tick (src_drain()) */
		s->tick_due = true;
		b = l->cur;
	}
	b->hdr[b->nh] = rec;
	b->piov[b->nh] = -1;
	b->iov[b->ni++] = (struct iovec){ &b->hdr[b->nh++], sizeof(rec) };
	if (run && s->sent_hash) {
		b->runs[b->nruns] = *run;
		if (!run->zero) {
			b->runs[b->nruns].out = b->hashes + b->nhashes;
			b->iov[b->ni++] = (struct iovec){ b->hashes + b->nhashes, run->count * sizeof(uint64_t) };
			b->nhashes += (int)run->count;
		}
		b->nruns++;
	}
	if (plen) {
		b->piov[b->nh - 1] = b->ni;
		b->iov[b->ni++] = (struct iovec){ (void *)payload, plen };
	}
	b->bytes += sizeof(rec) + plen;
	return 0;
}

static bool page_is_zero(const uint8_t *p)
{
	static const uint8_t zero[PAGE];

	return !memcmp(p, zero, PAGE);
}

/*
 * One run on its lane; over several connections, cut at chunk boundaries
 * (stream.h).  kind: MIG_DATA (hva), MIG_ZERO, or MIG_LEFT (the switch to
 * post-copy: the pages stay here, noted in s->left, their hashes taken
 * when they go).
 */
static int send_run(struct source *s, uint32_t idx, uint64_t first, uint64_t count, const uint8_t *hva, uint32_t kind)
{
	bool zero = kind == MIG_ZERO;

	s->in_hand -= count < s->in_hand ? count : s->in_hand;
	if (kind == MIG_LEFT) {
		kvmdirty_bitmap_set(s->left[idx], first, first + count);
		s->left_pages += count;
	} else {
		s->pages += count;
	}
	if (zero)
		s->zero_pages += count;
	while (count) {
		uint64_t n = s->nlanes == 1 ? count : MIG_LANE_PAGES - first % MIG_LANE_PAGES;
		struct lane *l = &s->lane[s->nlanes == 1 ? 0 : mig_lane_of(idx, first, s->nlanes)];
		/* out is set by src_put(): slots of the batch's hashes */
		struct hash_run run = { .hva = hva, .region = idx, .zero = zero, .first = first };
		int ret;

		if (n > count)
			n = count;
		run.count = n;
		if (kind == MIG_LEFT)
			ret = src_put(l, mig_encode_left(&l->enc, idx, first, n), NULL, 0, NULL);
		else if (zero)
			ret = src_put(l, mig_encode_zero(&l->enc, idx, first, n), NULL, 0, &run);
		else
			ret = src_put(l, mig_encode_data(&l->enc, idx, first, n), hva, n * PAGE, &run);
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
		ret = send_run(s, idx, page + i, j - i, p + i * PAGE, zero ? MIG_ZERO : MIG_DATA);
		if (ret < 0)
			return ret;
		i = j;
	}
	return 0;
}

/*
 * Each region's index by its slot id, so that a handed-out range finds
 * its region at once (a walk of thousands of regions a range made a pass
 * quadratic); out of memory, or regions outside libkvmdirty: the walk.
 */
static void slot_index(struct source *s)
{
	uint32_t i, max = 0;

	for (i = 0; i < s->g->nr_regions; i++) {
		if (!s->g->regions[i].region)
			return;
		if (kvmdirty_region_slot(s->g->regions[i].region) > max)
			max = kvmdirty_region_slot(s->g->regions[i].region);
	}
	s->slot_idx = malloc(((size_t)max + 1) * sizeof(*s->slot_idx));
	if (!s->slot_idx)
		return;
	memset(s->slot_idx, 0xff, ((size_t)max + 1) * sizeof(*s->slot_idx));
	for (i = 0; i < s->g->nr_regions; i++)
		s->slot_idx[kvmdirty_region_slot(s->g->regions[i].region)] = i;
	s->nr_slot_idx = max + 1;
}

/* The index in g->regions of a handed-out range's region; nr_regions where it is none of them. */
static uint32_t region_index(const struct source *s, const struct kvmdirty_range *rg)
{
	uint32_t slot = rg->region ? kvmdirty_region_slot(rg->region) : UINT32_MAX, idx;

	if (slot < s->nr_slot_idx && (idx = s->slot_idx[slot]) < s->g->nr_regions &&
	    s->g->regions[idx].region == rg->region)
		return idx;
	for (idx = 0; idx < s->g->nr_regions && s->g->regions[idx].region != rg->region; idx++)
		;
	return idx;
}

/* Which pages were never touched: where the guest's memory is private anonymous, pagemap says. */
void src_untouched_open(struct source *s)
{
	unsigned int i, n;
	uint64_t *size;
	void **hva;

	/* without pagemap every page is read: slower, never wrong */
	s->pagemap = mig_pagemap_open();
	n = s->g->nr_regions;
	s->anon = calloc(n ? n : 1, sizeof(*s->anon));
	hva = calloc(n ? n : 1, sizeof(*hva));
	size = calloc(n ? n : 1, sizeof(*size));
	for (i = 0; s->anon && hva && size && i < n; i++) {
		hva[i] = s->g->regions[i].hva;
		size[i] = s->g->regions[i].size;
	}
	/* one read of the maps for all regions; where it fails, none is known to be */
	if (s->anon && (!hva || !size || mig_hostmem_private_anon_n(hva, size, n, s->anon) < 0))
		memset(s->anon, 0, (n ? n : 1) * sizeof(*s->anon));
	free(hva);
	free(size);
	slot_index(s);
}

void src_untouched_close(struct source *s)
{
	if (s->pagemap >= 0)
		close(s->pagemap);
	free(s->anon);
	s->anon = NULL;
	free(s->slot_idx);
	s->slot_idx = NULL;
	s->nr_slot_idx = 0;
}

/* A run of a handed-out range, onto the wire (src_send_range()). */
struct send_walk {
	struct source *s;
	const struct kvmdirty_range *rg;
	uint32_t idx;
};

static int send_walked(void *ctx, uint64_t first, uint64_t count, bool untouched)
{
	struct send_walk *w = ctx;

	/* the switch to post-copy: what the guest touched stays here, unread (it is read when it goes) */
	if (!untouched && w->s->left_mode)
		return send_run(w->s, w->idx, w->rg->page + first, count, NULL, MIG_LEFT);
	if (!untouched)
		return send_read(w->s, w->idx, w->rg->page + first, count, (const uint8_t *)w->rg->hva + first * PAGE);
	w->s->untouched_pages += count;
	return send_run(w->s, w->idx, w->rg->page + first, count, NULL, MIG_ZERO);
}

/*
 * One handed-out range (protected by now): pages never touched as ZERO
 * runs, unread; the others read, as zero runs and data runs.
 */
int src_send_range(struct source *s, const struct kvmdirty_range *rg)
{
	struct send_walk w = { .s = s, .rg = rg, .idx = region_index(s, rg) };

	if (w.idx == s->g->nr_regions)
		return -ENOENT;
	return mig_walk_touched(s->pagemap, s->anon && s->anon[w.idx], rg->hva, rg->npages, s->pme, send_walked, &w);
}

void src_session_opts(const struct source *s, struct mig_session_opts *so)
{
	const struct mig_send_opts *o = s->o;

	/* post-copy keeps the key until every page is in: a recovery proves it again */
	*so = (struct mig_session_opts){ .psk = o->psk, .encrypt = o->encrypt,
					 .conns = (o->connections ? o->connections : 1) + (o->postcopy ? 1 : 0),
					 .timeout_ms = o->peer_timeout_ms, .name = o->peer_name,
					 .wipe_psk = o->wipe_psk && !o->postcopy, .postcopy = o->postcopy,
					 .compress = s->z_offer };
}

/* A failure to send or to hear from the destination, in one line. */
int src_net_fail(struct source *s, int ret, const char *what, char *err, size_t len)
{
	char why[96];

	/* cancelled: the connections were shut down for it; nothing the destination says matters now */
	if (src_cancel_check(s) < 0)
		return src_cancelled(s, err, len);
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
