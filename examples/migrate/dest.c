// SPDX-License-Identifier: MIT
/*
 * The destination: each record header is decoded (checked field by field)
 * before its payload is read, and the payload goes straight where the
 * checked header places it: pages into guest memory, a chunk at a time;
 * a verifier thread hashes each chunk while the next one is received.
 * Which pages have not arrived, and which arrived damaged, is kept in two
 * bitmaps a region; END is accepted only when both are empty.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dest.h"
#include "errf.h"
#include "worker.h"

#define PAGE ((uint64_t)MIG_PAGE_SIZE)
#define CHUNK_PAGES 32u	 /* received, then hashed (while in cache when inline) */
#define QUEUE 32	 /* chunks landed and not yet hashed, at most */

/* Pages that landed, to check against their hashes; or a ZERO run, whose pages are whole. */
struct vjob {
	uint32_t region;
	bool zero;
	uint64_t first, count;
	const uint8_t *hva;
	uint64_t hashes[CHUNK_PAGES];
};

struct dest {
	const struct mig_guest *g;
	const struct mig_reader *rd;
	struct mig_decoder dec;
	struct mig_region own[MIG_MAX_REGIONS];
	uint64_t *missing[MIG_MAX_REGIONS]; /* pages that have not arrived */
	uint64_t *bad[MIG_MAX_REGIONS];	    /* pages whose latest copy did not match its hash */
	struct mig_vcpu_state *vs;
	struct mig_recv_result *res;
	uint64_t hashes[MIG_RUN_PAGES];
	char *err;
	size_t len;
	/*
	 * The verifier thread hashes what landed while the main thread
	 * receives what follows (the guest's vCPUs have not run: their CPUs
	 * are free); it alone writes bad[].  Jobs [head, tail) of q are queued.
	 */
	bool inline_hash;
	struct mig_worker w;
	struct vjob q[QUEUE];
	unsigned int head, tail;
};

#define fail(d, ret, ...) mig_errf((d)->err, (d)->len, ret, __VA_ARGS__)

/* Read len bytes of what, or say why they did not come. */
static int get(struct dest *d, void *buf, size_t len, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static int get(struct dest *d, void *buf, size_t len, const char *fmt, ...)
{
	int ret = d->rd->read(d->rd->ctx, buf, len);
	char what[64], why[96];
	va_list ap;

	if (ret >= 0 && (size_t)ret == len)
		return 0;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	if (ret < 0) {
		d->rd->describe(d->rd->ctx, ret, why, sizeof(why));
		return fail(d, ret, "awaiting %s: %s", what, why);
	}
	if (!ret)
		return fail(d, -EPROTO, "%s: the stream ended before END", what);
	return fail(d, -EPROTO, "%s: the stream ended after %d of %zu bytes", what, ret, len);
}

static void verify(struct dest *d, const struct vjob *j)
{
	uint64_t *bad = d->bad[j->region], k;

	if (j->zero) {
		kvmdirty_bitmap_clear(bad, j->first, j->first + j->count);
		return;
	}
	for (k = 0; k < j->count; k++) {
		if (mig_page_hash(j->hva + k * PAGE) == j->hashes[k])
			kvmdirty_bitmap_clear(bad, j->first + k, j->first + k + 1);
		else
			kvmdirty_bitmap_set(bad, j->first + k, j->first + k + 1);
	}
}

static void *verifier(void *p)
{
	struct dest *d = p;

	pthread_mutex_lock(&d->w.lock);
	for (;;) {
		while (d->head == d->tail && !d->w.quit)
			pthread_cond_wait(&d->w.cond, &d->w.lock);
		if (d->head == d->tail)
			break;
		pthread_mutex_unlock(&d->w.lock);
		verify(d, &d->q[d->head % QUEUE]);
		pthread_mutex_lock(&d->w.lock);
		d->head++;
		pthread_cond_broadcast(&d->w.cond);
	}
	pthread_mutex_unlock(&d->w.lock);
	return NULL;
}

/* The next job's slot, free once the verifier is done with it. */
static struct vjob *job_slot(struct dest *d)
{
	if (d->w.running) {
		pthread_mutex_lock(&d->w.lock);
		while (d->tail - d->head == QUEUE)
			pthread_cond_wait(&d->w.cond, &d->w.lock);
		pthread_mutex_unlock(&d->w.lock);
	}
	return &d->q[d->tail % QUEUE];
}

static void job_push(struct dest *d, struct vjob *j)
{
	if (!d->w.running) {
		verify(d, j);
		return;
	}
	pthread_mutex_lock(&d->w.lock);
	d->tail++;
	pthread_cond_broadcast(&d->w.cond);
	pthread_mutex_unlock(&d->w.lock);
}

/* Every page that landed checked. */
static void verifier_drain(struct dest *d)
{
	if (!d->w.running)
		return;
	pthread_mutex_lock(&d->w.lock);
	while (d->head != d->tail)
		pthread_cond_wait(&d->w.cond, &d->w.lock);
	pthread_mutex_unlock(&d->w.lock);
}

/*
 * Before pages of [first, first + count) of a region are written again:
 * wait for the verifier if it has yet to hash one of them (a stream may
 * send a page twice in a row; the verifier must not read a page that is
 * being written).
 */
static void verifier_fence(struct dest *d, uint32_t region, uint64_t first, uint64_t count)
{
	unsigned int i, head;

	if (!d->w.running)
		return;
	pthread_mutex_lock(&d->w.lock);
	head = d->head;
	pthread_mutex_unlock(&d->w.lock);
	for (i = head; i != d->tail; i++) {
		const struct vjob *j = &d->q[i % QUEUE];

		if (!j->zero && j->region == region && j->first < first + count && first < j->first + j->count) {
			verifier_drain(d);
			return;
		}
	}
}

static int recv_data(struct dest *d, const struct mig_record *rec)
{
	const uint64_t nrec = d->dec.nrec - 1;
	uint8_t *hva = (uint8_t *)d->g->regions[rec->index].hva + rec->first * PAGE;
	const bool hashed = d->dec.flags & MIG_F_PAGE_HASH;
	uint64_t done, n;
	int ret;

	if (hashed) {
		ret = get(d, d->hashes, rec->count * sizeof(uint64_t), "record %" PRIu64 " (DATA) hashes", nrec);
		if (ret < 0)
			return ret;
	}
	/* before the bytes land: a page cut off halfway is not zero any more */
	if (d->g->regions[rec->index].written)
		kvmdirty_bitmap_set(d->g->regions[rec->index].written, rec->first, rec->first + rec->count);
	for (done = 0; done < rec->count; done += n) {
		n = rec->count - done < CHUNK_PAGES ? rec->count - done : CHUNK_PAGES;
		verifier_fence(d, rec->index, rec->first + done, n);
		/* the decoder checked the range: straight into guest memory */
		ret = get(d, hva + done * PAGE, n * PAGE, "record %" PRIu64 " (DATA) pages", nrec);
		if (ret < 0)
			return ret;
		if (hashed) {
			struct vjob *j = job_slot(d);

			*j = (struct vjob){ .region = rec->index, .first = rec->first + done, .count = n,
					    .hva = hva + done * PAGE };
			memcpy(j->hashes, d->hashes + done, n * sizeof(uint64_t));
			job_push(d, j);
		}
	}
	kvmdirty_bitmap_clear(d->missing[rec->index], rec->first, rec->first + rec->count);
	d->res->pages += rec->count;
	return 0;
}

/* Clear the pages of a written run: they are zero again. */
static int clear_run(uint64_t first, uint64_t count, void *opaque)
{
	const struct mig_guest_region *r = opaque;

	memset((uint8_t *)r->hva + first * PAGE, 0, count * PAGE);
	kvmdirty_bitmap_clear(r->written, first, first + count);
	return 0;
}

static void recv_zero(struct dest *d, const struct mig_record *rec)
{
	const struct mig_guest_region *r = &d->g->regions[rec->index];

	verifier_fence(d, rec->index, rec->first, rec->count);
	/* pages never written are zero: neither faulted in nor cleared */
	if (r->written)
		kvmdirty_bitmap_for_each_run(r->written, rec->first, rec->first + rec->count, clear_run, (void *)r);
	else
		memset((uint8_t *)r->hva + rec->first * PAGE, 0, rec->count * PAGE);
	if (d->dec.flags & MIG_F_PAGE_HASH) {
		struct vjob *j = job_slot(d);

		*j = (struct vjob){ .region = rec->index, .zero = true, .first = rec->first, .count = rec->count };
		job_push(d, j);
	}
	kvmdirty_bitmap_clear(d->missing[rec->index], rec->first, rec->first + rec->count);
	d->res->pages += rec->count;
}

static int recv_vcpu(struct dest *d, const struct mig_record *rec)
{
	int ret = get(d, &d->vs[rec->index], sizeof(d->vs[0]), "record %" PRIu64 " (VCPU) state", d->dec.nrec - 1);

	return ret < 0 ? ret : mig_decode_vcpu_state(&d->dec, &d->vs[rec->index], d->err, d->len);
}

/* After END: the end of the stream, every page arrived, every page whole. */
static int check_complete(struct dest *d)
{
	uint8_t extra;
	unsigned int i;
	int ret = d->rd->read(d->rd->ctx, &extra, 1);

	if (ret > 0)
		return fail(d, -EPROTO, "after END: more bytes; the stream must end at END");
	if (ret < 0) {
		char why[96];

		d->rd->describe(d->rd->ctx, ret, why, sizeof(why));
		return fail(d, ret, "awaiting the end of the stream after END: %s", why);
	}
	for (i = 0; i < d->g->nr_regions; i++) {
		uint64_t n = d->own[i].size / PAGE, p = kvmdirty_bitmap_next_set(d->missing[i], 0, n);

		if (p < n)
			return fail(d, -EPROTO, "END: region %u page %" PRIu64 " (gpa 0x%" PRIx64 ") never arrived (%" PRIu64
				    " of the region's %" PRIu64 " pages missing)",
				    i, p, d->own[i].gpa + p * PAGE, kvmdirty_bitmap_count(d->missing[i], 0, n), n);
	}
	verifier_drain(d);
	for (i = 0; i < d->g->nr_regions; i++) {
		uint64_t n = d->own[i].size / PAGE, p = kvmdirty_bitmap_next_set(d->bad[i], 0, n);

		if (p < n)
			return fail(d, -EIO, "END: region %u page %" PRIu64 " (gpa 0x%" PRIx64 ") does not match its hash"
				    " and no whole copy followed (%" PRIu64 " such pages): the transfer was damaged",
				    i, p, d->own[i].gpa + p * PAGE, kvmdirty_bitmap_count(d->bad[i], 0, n));
	}
	return 0;
}

static int receive(struct dest *d)
{
	struct mig_region theirs[MIG_MAX_REGIONS];
	struct mig_header h;
	struct mig_record rec;
	unsigned int i;
	int ret;

	ret = get(d, &h, sizeof(h), "the header");
	if (ret == 0)
		ret = mig_decode_header(&d->dec, &h, d->err, d->len);
	if (ret == 0 && (h.flags & MIG_F_PAGE_HASH) && !d->inline_hash && mig_worker_start(&d->w, verifier, d) < 0)
		ret = fail(d, -EAGAIN, "this destination: cannot start the verifier thread");
	if (ret == 0)
		ret = get(d, theirs, d->g->nr_regions * sizeof(theirs[0]), "the region table");
	if (ret == 0)
		ret = mig_decode_regions(&d->dec, theirs, d->err, d->len);
	if (ret < 0)
		return ret;
	for (;;) {
		ret = get(d, &rec, sizeof(rec), "record %" PRIu64, d->dec.nrec);
		if (ret == 0)
			ret = mig_decode_record(&d->dec, &rec, d->err, d->len);
		if (ret < 0)
			return ret;
		if (rec.kind == MIG_END)
			break;
		if (rec.kind == MIG_DATA)
			ret = recv_data(d, &rec);
		else if (rec.kind == MIG_ZERO)
			recv_zero(d, &rec);
		else if (rec.kind == MIG_VCPU)
			ret = recv_vcpu(d, &rec);
		if (ret < 0)
			return ret;
	}
	d->res->records = d->dec.nrec - 1;
	ret = check_complete(d);
	if (ret < 0)
		return ret;
	for (i = 0; i < d->g->nr_vcpus; i++) {
		ret = d->g->ops->vcpu_load(d->g->ctx, i, &d->vs[i]);
		if (ret < 0)
			return fail(d, ret, "loading vCPU %u state: %s", i, strerror(-ret));
	}
	d->res->hashed = d->dec.flags & MIG_F_PAGE_HASH;
	return 0;
}

int mig_recv_stream(const struct mig_guest *g, const struct mig_reader *rd, bool inline_hash,
		    struct mig_recv_result *res, char *err, size_t len)
{
	struct dest *d = calloc(1, sizeof(*d));
	unsigned int i;
	int ret = 0;

	memset(res, 0, sizeof(*res));
	if (!d)
		return -ENOMEM;
	d->g = g;
	d->rd = rd;
	d->inline_hash = inline_hash;
	d->res = res;
	d->err = err;
	d->len = len;
	if (g->nr_regions > MIG_MAX_REGIONS || g->nr_vcpus > MIG_MAX_VCPUS) {
		ret = fail(d, -EINVAL, "this destination: %u regions and %u vCPUs, the stream carries at most %u and %u",
			   g->nr_regions, g->nr_vcpus, MIG_MAX_REGIONS, MIG_MAX_VCPUS);
		goto out;
	}
	d->vs = calloc(g->nr_vcpus, sizeof(*d->vs));
	for (i = 0; i < g->nr_regions; i++) {
		uint64_t n = g->regions[i].size / PAGE;

		d->own[i] = (struct mig_region){ g->regions[i].gpa, g->regions[i].size };
		d->missing[i] = malloc(KVMDIRTY_BITMAP_WORDS(n) * sizeof(uint64_t));
		d->bad[i] = calloc(KVMDIRTY_BITMAP_WORDS(n), sizeof(uint64_t));
		if (!d->missing[i] || !d->bad[i])
			break;
		kvmdirty_bitmap_set(d->missing[i], 0, n);
	}
	if (!d->vs || i < g->nr_regions) {
		ret = fail(d, -ENOMEM, "this destination: out of memory");
		goto out;
	}
	mig_decoder_init(&d->dec, d->own, g->nr_regions, g->nr_vcpus);
	ret = receive(d);
	mig_worker_stop(&d->w);
out:
	for (i = 0; i < MIG_MAX_REGIONS; i++) {
		free(d->missing[i]);
		free(d->bad[i]);
	}
	free(d->vs);
	free(d);
	return ret;
}

int mig_recv(const struct mig_guest *g, int fd, const struct mig_recv_opts *o, struct mig_recv_result *res,
	     char *err, size_t len)
{
	struct mig_ack ack = { 0 };
	struct iovec iov = { &ack, sizeof(ack) };
	struct mig_reader rd;
	struct mig_conn *c;
	int ret = mig_conn_new(fd, o->timeout_ms, &c), wret;

	memset(res, 0, sizeof(*res));
	if (ret < 0) {
		snprintf(err, len, "io_uring: %s", strerror(-ret));
		return ret;
	}
	mig_conn_set_deadline(c, o->deadline_ms);
	rd = mig_conn_reader(c);
	ret = mig_recv_stream(g, &rd, o->inline_hash, res, err, len);
	ack.status = ret;
	snprintf(ack.message, sizeof(ack.message), "%s", ret < 0 ? err : "ok");
	/* best effort on a refusal: the peer may be gone */
	wret = mig_conn_writev(c, &iov, 1);
	if (ret == 0 && wret < 0) {
		char why[96];

		mig_conn_strerror(c, wret, why, sizeof(why));
		snprintf(err, len, "answering the source: %s", why);
		ret = wret;
	}
	mig_conn_free(c);
	return ret;
}
