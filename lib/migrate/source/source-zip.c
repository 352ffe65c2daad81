// SPDX-License-Identifier: MIT
/*
 * The source's compression: a batch's DATA records as DATA_Z (stream.h),
 * zstd level 1, on the thread that hashes the batch (the lane's worker,
 * or the sending thread without one), after the hashes were taken.  A
 * record whose frame would not save at least a 32nd of its bytes goes as
 * it was.  The record header is rewritten in place: END's checksum covers
 * a DATA_Z as the DATA it stands for, so the encoder's sum stands.
 *
 * MIG_COMPRESS_AUTO decides per connection, by what the connection
 * delivers: the raw bytes of its batches per second of wall time, over
 * windows of WIN_NS, measured both ways.  It runs in one mode and, one
 * window in EXPLORE, tries the other; it keeps the mode whose last window
 * delivered more (by a margin of HYSTERESIS to change).  Whatever holds
 * the connection back (the link, the cap's pacing, the CPU, the guest's
 * vCPUs beside it) is in that figure, where a model of it (link speed,
 * compression speed, ratio) misjudged a link whose socket buffers swallow
 * bursts.  The first window does not compress, the second does, then it
 * decides; a window that tries compression while it is off lasts
 * TRY_ON_NS only (where the CPU is the bottleneck such a window is the
 * price of looking).  Pages that do not shrink (R, wire bytes per raw byte of what
 * it compressed, above NO_GAIN) are not tried compressed at all; while off,
 * the smallest record of one batch in PROBE_EVERY is compressed to keep R
 * current (and sent so if it shrank).  A pause longer than GAP_NS between
 * two batches (a sync between passes) starts the window again.
 */
#include <stdlib.h>

#include <zstd.h>

#include "source-int.h"

#define ZLEVEL 1
#define PROBE_EVERY 16		/* batches between probes while off */
#define DECAY 0.8		/* each sample, what the sums keep of the ones before */
#define WIN_NS 50000000ull	/* a window of measure */
#define TRY_ON_NS 10000000ull	/* ... a window that tries compression while off: short, it may cost */
#define GAP_NS 100000000ull	/* a pause between batches that a window does not count */
#define EXPLORE 8		/* one window in this many tries the other mode */
#define HYSTERESIS 1.03		/* how much more the other mode must deliver to be taken */
#define NO_GAIN 0.9		/* a ratio above this: compression is not tried */

/*
 * A ratio of decayed sums (num/den, each sample adding to both): a
 * speed averaged over bytes and time, as a link's is, where an average
 * of each batch's speed would let the many batches a socket's buffer
 * swallows at once outweigh the few that wait for the link.  Stored
 * atomically: the end line (and, for wbps, the compressing thread)
 * reads it from another thread.
 */
static void decayed(double *num, double *den, double x_num, double x_den, double *out)
{
	double v;

	*num = *num * DECAY + x_num;
	*den = *den * DECAY + x_den;
	v = *den > 0 ? *num / *den : 0;
	__atomic_store(out, &v, __ATOMIC_RELAXED);
}

/*
 * AUTO, at each batch: the window's bytes counted; a window over, its
 * delivery kept for its mode and the next window's mode chosen.  Returns
 * whether this batch is to be compressed whole.
 */
static bool auto_on(struct lane_zip *z, uint64_t raw)
{
	uint64_t now = mig_clock_ns();
	bool shrinks = !(z->ratio > 0) || z->ratio < NO_GAIN;

	if (!z->win_at || now - z->last_at > GAP_NS) {
		/* the first batch, or after a pause: the window starts afresh (this batch's time unknown) */
		z->win_at = z->last_at = now;
		z->win_raw = 0;
		return z->on && shrinks;
	}
	z->last_at = now;
	z->win_raw += raw;
	if (now - z->win_at >= (z->on && z->trying ? TRY_ON_NS : WIN_NS)) {
		double rate = (double)z->win_raw * 1e9 / (double)(now - z->win_at);
		bool was = z->on, next;

		*(was ? &z->rate_on : &z->rate_off) = rate;
		z->windows++;
		z->trying = false;
		if (!shrinks)
			next = false;
		else if (!(z->rate_on > 0))
			next = z->trying = true; /* the second window: compressed, a try */
		else if (z->windows % EXPLORE == 0)
			next = !was; /* a window the other way */
		else if (z->windows % EXPLORE == 1 && z->windows > 2)
			next = z->rate_on > z->rate_off; /* after a window the other way: the better */
		else if (was)
			next = !(z->rate_off > z->rate_on * HYSTERESIS);
		else
			next = z->rate_on > z->rate_off * HYSTERESIS;
		if (next && !was)
			z->trying = z->windows % EXPLORE == 0 || z->windows == 1;
		__atomic_store_n(&z->on, next, __ATOMIC_RELAXED);
		z->win_at = now;
		z->win_raw = 0;
	}
	return z->on && shrinks;
}

/* Record k of b compressed into b's room; false where it did not shrink enough (or no room). */
static bool zip_record(struct lane *l, struct batch *b, int k)
{
	struct lane_zip *z = &l->z;
	struct iovec *p = &b->iov[b->piov[k]];
	size_t bound = ZSTD_compressBound(p->iov_len), n;
	uint64_t t0;

	if (b->zcap - b->zused < bound)
		return false;
	t0 = mig_clock_ns();
	n = ZSTD_compressCCtx(z->cctx, b->zbuf + b->zused, bound, p->iov_base, p->iov_len, ZLEVEL);
	t0 = mig_clock_ns() - t0;
	/* the totals: read by src_zip_result(), maybe while a failed migration's worker still runs */
	__atomic_add_fetch(&z->ns, t0, __ATOMIC_RELAXED);
	if (ZSTD_isError(n))
		return false;
	decayed(&z->zwire_acc, &z->zraw_acc, (double)(n < p->iov_len ? n : p->iov_len), (double)p->iov_len, &z->ratio);
	decayed(&z->zraw_acc2, &z->zns_acc, (double)p->iov_len * 1e9, (double)t0, &z->zbps);
	if (n > p->iov_len - p->iov_len / 32)
		return false;
	__atomic_add_fetch(&z->pages, b->hdr[k].count, __ATOMIC_RELAXED);
	__atomic_add_fetch(&z->raw, p->iov_len, __ATOMIC_RELAXED);
	__atomic_add_fetch(&z->wire, n, __ATOMIC_RELAXED);
	b->hdr[k] = mig_data_z(&b->hdr[k], n);
	*p = (struct iovec){ b->zbuf + b->zused, n };
	b->zused += n;
	return true;
}

void src_zip_batch(struct lane *l, struct batch *b)
{
	int mode = __atomic_load_n(&l->s->zmode, __ATOMIC_RELAXED);
	struct lane_zip *z = &l->z;
	uint64_t raw = 0;
	bool all;
	int k;

	if (mode == MIG_COMPRESS_OFF)
		return;
	if (!z->cctx)
		z->cctx = ZSTD_createCCtx();
	if (!b->zbuf) {
		b->zcap = ZSTD_compressBound(BATCH_BYTES + MIG_RUN_PAGES * MIG_PAGE_SIZE);
		b->zbuf = malloc(b->zcap);
	}
	if (!z->cctx || !b->zbuf)
		return; /* out of memory: sent as it is */
	z->batches++;
	for (k = 0; k < b->nh; k++)
		if (b->hdr[k].kind == MIG_DATA && b->piov[k] >= 0)
			raw += b->iov[b->piov[k]].iov_len;
	all = mode == MIG_COMPRESS_ZSTD || auto_on(z, raw);
	if (!all) {
		/* a probe: the batch's smallest record, to keep the ratio current */
		int best = -1;

		if (z->batches % PROBE_EVERY)
			return;
		for (k = 0; k < b->nh; k++)
			if (b->hdr[k].kind == MIG_DATA && b->piov[k] >= 0 &&
			    (best < 0 || b->iov[b->piov[k]].iov_len < b->iov[b->piov[best]].iov_len))
				best = k;
		if (best >= 0)
			zip_record(l, b, best);
		return;
	}
	for (k = 0; k < b->nh; k++)
		if (b->hdr[k].kind == MIG_DATA && b->piov[k] >= 0)
			zip_record(l, b, k);
}

void src_zip_sent(struct lane *l, uint64_t bytes, uint64_t ns)
{
	if (!bytes || !ns || __atomic_load_n(&l->s->zmode, __ATOMIC_RELAXED) == MIG_COMPRESS_OFF)
		return;
	/* one sender a lane at a time: its sums are its own */
	decayed(&l->z.wbytes_acc, &l->z.wns_acc, (double)bytes * 1e9, (double)ns, &l->z.wbps);
}

void src_zip_lanes_json(const struct source *s, FILE *f)
{
	unsigned int i;

	fprintf(f, ",\"zlanes\":[");
	for (i = 0; s->lane && i < s->nlanes; i++) {
		const struct lane_zip *z = &s->lane[i].z;
		double w, r, zb;

		/* the compressing thread's figures: it is idle by now, or a failed migration's (approximate) */
		__atomic_load(&z->wbps, &w, __ATOMIC_RELAXED);
		__atomic_load(&z->ratio, &r, __ATOMIC_RELAXED);
		__atomic_load(&z->zbps, &zb, __ATOMIC_RELAXED);
		fprintf(f, "%s{\"on\":%s,\"ratio\":%.3f,\"z_mibps\":%.1f,\"w_mibps\":%.1f}", i ? "," : "",
			__atomic_load_n(&z->on, __ATOMIC_RELAXED) ? "true" : "false", r, zb / 1048576.0, w / 1048576.0);
	}
	fputc(']', f);
}

void src_zip_free(struct lane *l)
{
	unsigned int i;

	ZSTD_freeCCtx(l->z.cctx);
	l->z.cctx = NULL;
	for (i = 0; i < 2; i++) {
		free(l->batch[i].zbuf);
		l->batch[i].zbuf = NULL;
	}
}

void src_zip_result(const struct source *s, struct mig_result *res)
{
	uint64_t now = mig_thread_cpu_ns(pthread_self()), cpu = now > s->cpu0_ns ? now - s->cpu0_ns : 0;
	unsigned int i;

	/* the lanes' workers are alive (not yet joined) until the lanes are freed */
	for (i = 0; s->lane && i < s->nlanes; i++)
		if (s->lane[i].w.running)
			cpu += mig_thread_cpu_ns(s->lane[i].w.thread);
	res->cpu_s = (double)cpu / 1e9;

	for (i = 0; s->lane && i < s->nlanes; i++) {
		const struct lane_zip *z = &s->lane[i].z;

		res->zpages += __atomic_load_n(&z->pages, __ATOMIC_RELAXED);
		res->zraw_bytes += __atomic_load_n(&z->raw, __ATOMIC_RELAXED);
		res->zwire_bytes += __atomic_load_n(&z->wire, __ATOMIC_RELAXED);
		res->zcpu_s += (double)__atomic_load_n(&z->ns, __ATOMIC_RELAXED) / 1e9;
	}
}
