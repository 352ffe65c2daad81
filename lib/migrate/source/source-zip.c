// SPDX-License-Identifier: MIT
/*
 * The source's compression: a batch's DATA records as DATA_Z (stream.h),
 * zstd level 1, on the thread that hashes the batch (the lane's worker,
 * or the sending thread without one), after the hashes were taken.  A
 * record whose frame would not save at least a 32nd of its bytes goes as
 * it was.  The record header is rewritten in place: END's checksum covers
 * a DATA_Z as the DATA it stands for, so the encoder's sum stands.
 *
 * MIG_COMPRESS_AUTO decides per connection, from what the connection
 * measured: sending a raw byte costs 1/W (W: the connection's speed in
 * wire bytes a second, the time in the cap's pacing and in the write
 * both counted); compressed it costs 1/Z + R/W (Z: raw bytes compressed a
 * second on this thread, R: wire bytes per raw byte).  Compression pays
 * when R + W/Z < 0.9 (a tenth kept for what the figures miss): on a slow
 * link (W small) with a fill that compresses (R small); never on a fast
 * one (W large: the CPU is the bottleneck) nor on data that does not
 * shrink (R near 1).  While off, one record in PROBE_EVERY batches is
 * compressed to keep R and Z current (and sent so, if it shrank); the
 * first PROBE_FIRST batches are compressed whole, to decide soon.
 */
#include <stdlib.h>

#include <zstd.h>

#include "source-int.h"

#define ZLEVEL 1
#define PROBE_FIRST 4
#define PROBE_EVERY 16
#define EWMA 0.2
#define PAYS 0.9

static void ewma(double *v, double x)
{
	*v = *v > 0 ? *v + EWMA * (x - *v) : x;
}

/*
 * AUTO: whether compressing moves this connection's pages faster, by its
 * measures (unknown: yes, to learn).  wbps is the sender's (the main
 * thread may send while the worker compresses the next batch): read
 * atomically; the rest is the compressing thread's own.
 */
static bool pays(const struct lane_zip *z)
{
	double w;

	__atomic_load(&z->wbps, &w, __ATOMIC_RELAXED);
	if (!(z->ratio > 0) || !(z->zbps > 0) || !(w > 0))
		return true;
	return z->ratio + w / z->zbps < PAYS;
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
	ewma(&z->ratio, n < p->iov_len ? (double)n / (double)p->iov_len : 1.0);
	if (t0)
		ewma(&z->zbps, (double)p->iov_len * 1e9 / (double)t0);
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
	if (mode == MIG_COMPRESS_AUTO)
		z->on = pays(z);
	all = mode == MIG_COMPRESS_ZSTD || z->on || z->batches <= PROBE_FIRST;
	if (!all && z->batches % PROBE_EVERY)
		return;
	for (k = 0; k < b->nh; k++) {
		if (b->hdr[k].kind != MIG_DATA || b->piov[k] < 0)
			continue;
		zip_record(l, b, k);
		if (!all)
			break; /* a probe: one record */
	}
}

void src_zip_sent(struct lane *l, uint64_t bytes, uint64_t ns)
{
	double w;

	if (!bytes || !ns || __atomic_load_n(&l->s->zmode, __ATOMIC_RELAXED) == MIG_COMPRESS_OFF)
		return;
	/* one sender a lane at a time: the load and the store need not be one */
	__atomic_load(&l->z.wbps, &w, __ATOMIC_RELAXED);
	ewma(&w, (double)bytes * 1e9 / (double)ns);
	__atomic_store(&l->z.wbps, &w, __ATOMIC_RELAXED);
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
	unsigned int i;

	for (i = 0; s->lane && i < s->nlanes; i++) {
		const struct lane_zip *z = &s->lane[i].z;

		res->zpages += __atomic_load_n(&z->pages, __ATOMIC_RELAXED);
		res->zraw_bytes += __atomic_load_n(&z->raw, __ATOMIC_RELAXED);
		res->zwire_bytes += __atomic_load_n(&z->wire, __ATOMIC_RELAXED);
		res->zcpu_s += (double)__atomic_load_n(&z->ns, __ATOMIC_RELAXED) / 1e9;
	}
}
