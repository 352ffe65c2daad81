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
#include <sys/socket.h>

#include "clock.h"
#include "dest-postcopy.h"
#include "dest.h"
#include "errf.h"
#include "handoff.h"
#include "session.h"
#include "worker.h"

#define MIG_MAX_LANES 16

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
	/* [g->nr_regions] each, connection 0's, which the other connections share */
	struct mig_region *own;
	uint64_t **missing; /* pages that have not arrived */
	uint64_t **bad;	    /* pages whose latest copy did not match its hash */
	uint64_t **left;    /* post-copy: pages whose latest copy stays at the source (LEFT); NULL without */
	uint64_t left_pages; /* connection 0's count of LEFT pages, all connections' once joined */
	struct mig_vcpu_state *vs;
	struct mig_vm_state vm; /* connection 0's */
	void *dev;		/* ... and the devices' state, dev_len bytes */
	uint64_t dev_len;
	void *dev_live; /* ... and the part given before the pause (DEVICES_LIVE), dev_live_len bytes */
	uint64_t dev_live_len;
	/* each vCPU as it was before the stream: loaded back on any refusal or drop */
	struct mig_vcpu_state *fresh;
	/* connection 0's socket and channel where the handoff follows END (its stream does not end there), else -1 */
	int handoff_fd;
	struct mig_chan *handoff_ch;
	struct mig_recv_result *res;
	uint64_t hashes[MIG_RUN_PAGES];
	uint64_t cpu_ns; /* a lane's thread's CPU time, as it ended; connection 0's: its verifier's */
	/* DATA_Z: its frame as read, and the context that decompresses it (made at the first) */
	uint8_t *zbuf;
	void *unzip;
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
	/* a stream over several connections: one struct dest a connection, each on a thread of its own but 0's */
	struct lanes *sh;
	unsigned int lane;
	pthread_t thread;
	struct mig_recv_result lane_res;
	char lane_err[256];
};

/*
 * What the connections of one stream share: the first refusal (it is
 * the one reported; the others follow from the cancel it makes) and how
 * to wake the connections still reading.
 */
struct lanes {
	pthread_mutex_t lock;
	bool failed;
	int ret;
	char err[256];
	void (*cancel)(void *ctx);
	void *cancel_ctx;
	struct dest *d[MIG_MAX_LANES];
	unsigned int n, started;
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
	/* read once the thread is joined (mig_worker_stop()) */
	d->cpu_ns = mig_thread_cpu_ns(pthread_self());
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

/*
 * DATA_Z: the hashes and the frame read, the frame decompressed straight
 * into guest memory (bounded by the record's pages, and only once every
 * page of it was checked by the verifier), then each page checked
 * against its hash as DATA's are.
 */
static int recv_data_z(struct dest *d, const struct mig_record *rec)
{
	const uint64_t nrec = d->dec.nrec - 1, pages = mig_zpages(rec), zbytes = mig_zbytes(rec);
	uint8_t *hva = (uint8_t *)d->g->regions[rec->index].hva + rec->first * PAGE;
	const bool hashed = d->dec.flags & MIG_F_PAGE_HASH;
	uint64_t done, n;
	int ret;

	if (!d->zbuf)
		d->zbuf = malloc(mig_zbound(MIG_RUN_PAGES));
	if (!d->unzip)
		d->unzip = mig_unzip_new();
	if (!d->zbuf || !d->unzip)
		return fail(d, -ENOMEM, "this destination: out of memory for record %" PRIu64 " (DATA_Z)", nrec);
	if (hashed) {
		ret = get(d, d->hashes, pages * sizeof(uint64_t), "record %" PRIu64 " (DATA_Z) hashes", nrec);
		if (ret < 0)
			return ret;
	}
	ret = get(d, d->zbuf, zbytes, "record %" PRIu64 " (DATA_Z) frame", nrec);
	if (ret < 0)
		return ret;
	if (d->g->regions[rec->index].written)
		kvmdirty_bitmap_set(d->g->regions[rec->index].written, rec->first, rec->first + pages);
	verifier_fence(d, rec->index, rec->first, pages);
	ret = mig_unzip(d->unzip, hva, pages, d->zbuf, zbytes, nrec, d->err, d->len);
	if (ret < 0)
		return ret;
	for (done = 0; hashed && done < pages; done += n) {
		struct vjob *j = job_slot(d);

		n = pages - done < CHUNK_PAGES ? pages - done : CHUNK_PAGES;
		*j = (struct vjob){ .region = rec->index, .first = rec->first + done, .count = n, .hva = hva + done * PAGE };
		memcpy(j->hashes, d->hashes + done, n * sizeof(uint64_t));
		job_push(d, j);
	}
	kvmdirty_bitmap_clear(d->missing[rec->index], rec->first, rec->first + pages);
	if (d->left)
		kvmdirty_bitmap_clear(d->left[rec->index], rec->first, rec->first + pages);
	d->res->pages += pages;
	d->res->zpages += pages;
	return 0;
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
	if (d->left)
		kvmdirty_bitmap_clear(d->left[rec->index], rec->first, rec->first + rec->count);
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
	if (d->left)
		kvmdirty_bitmap_clear(d->left[rec->index], rec->first, rec->first + rec->count);
	d->res->pages += rec->count;
}

/*
 * LEFT: the pages' latest copies come after the handoff; what an earlier
 * pass brought is stale (emptied before the guest runs) and no longer
 * checked (the hashes still queued are waited out first: LEFT records come
 * together, at the switch, so the wait is paid once).
 */
static void recv_left(struct dest *d, const struct mig_record *rec)
{
	/* every hash queued checked first, zero runs' too: the verifier writes words of bad[] this clears */
	verifier_drain(d);
	kvmdirty_bitmap_clear(d->bad[rec->index], rec->first, rec->first + rec->count);
	kvmdirty_bitmap_clear(d->missing[rec->index], rec->first, rec->first + rec->count);
	kvmdirty_bitmap_set(d->left[rec->index], rec->first, rec->first + rec->count);
	d->left_pages += rec->count;
}

static int recv_vcpu(struct dest *d, const struct mig_record *rec)
{
	int ret = get(d, &d->vs[rec->index], sizeof(d->vs[0]), "record %" PRIu64 " (VCPU) state", d->dec.nrec - 1);

	char what[48];

	if (ret == 0)
		ret = mig_decode_vcpu_state(&d->dec, &d->vs[rec->index], d->err, d->len);
	snprintf(what, sizeof(what), "record %" PRIu64 " (VCPU)", d->dec.nrec - 1);
	return ret < 0 ? ret : mig_vcpu_state_host_check(&d->vs[rec->index], what, d->err, d->len);
}

static int recv_vm(struct dest *d)
{
	int ret = get(d, &d->vm, sizeof(d->vm), "record %" PRIu64 " (VM) state", d->dec.nrec - 1);

	return ret < 0 ? ret : mig_decode_vm_state(&d->dec, &d->vm, d->err, d->len);
}

/* A DEVICES or DEVICES_LIVE record's state, kept whole until the stream is (the guest's own until then). */
static int recv_devices(struct dest *d, const struct mig_record *rec)
{
	bool live = rec->kind == MIG_DEVICES_LIVE;
	const char *name = mig_kind_name(rec->kind);
	void **buf = live ? &d->dev_live : &d->dev;
	int ret;

	if (rec->count && !(live ? d->g->ops->devices_load_live : d->g->ops->devices_load))
		return fail(d, -EPROTO, "record %" PRIu64 " (%s): %" PRIu64 " bytes of device state, and this "
			    "destination's guest has no devices to load them into", d->dec.nrec - 1, name, rec->count);
	free(*buf);
	*buf = rec->count ? malloc(rec->count) : NULL;
	if (rec->count && !*buf)
		return fail(d, -ENOMEM, "record %" PRIu64 " (%s): out of memory for %" PRIu64 " bytes", d->dec.nrec - 1,
			    name, rec->count);
	*(live ? &d->dev_live_len : &d->dev_len) = rec->count;
	if (!rec->count)
		return 0; /* no devices: nothing to read */
	ret = get(d, *buf, rec->count, "record %" PRIu64 " (%s) state", d->dec.nrec - 1, name);
	if (ret == 0)
		mig_decode_devices_state(&d->dec, *buf, rec->count);
	return ret;
}

/*
 * A complete stream's state into the guest: each vCPU's, then the VM's.
 * On a failure the vCPUs go back as they were (nothing of a refused
 * stream stays in them; the VM's own state the next stream sets whole).
 */
static int load_state(struct dest *d)
{
	unsigned int i, n = d->g->nr_vcpus;
	int ret = 0;

	for (i = 0; i < d->g->nr_vcpus; i++) {
		ret = d->g->ops->vcpu_load(d->g->ctx, i, &d->vs[i]);
		if (ret < 0) {
			fail(d, ret, "loading vCPU %u state: %s", i, strerror(-ret));
			/* ... and it too: a load that failed part way may have set some of its state */
			n = i + 1;
			break;
		}
	}
	if (ret == 0 && d->g->ops->vm_load && (ret = d->g->ops->vm_load(d->g->ctx, &d->vm)) < 0)
		fail(d, ret, "loading the VM's state (irqchip, PIT, clock): %s", strerror(-ret));
	/*
	 * The part the source gave before its pause first, then the rest;
	 * a guest that takes such a part is told of every stream's, none (0
	 * bytes) included, so nothing of an earlier stream's stays.
	 */
	if (ret == 0 && d->g->ops->devices_load_live &&
	    (ret = d->g->ops->devices_load_live(d->g->ctx, d->dev_live, (size_t)d->dev_live_len)) < 0)
		fail(d, ret, "loading the devices' state given before the pause (%" PRIu64 " bytes): %s",
		     d->dev_live_len, strerror(-ret));
	if (ret == 0 && d->g->ops->devices_load &&
	    (ret = d->g->ops->devices_load(d->g->ctx, d->dev, (size_t)d->dev_len)) < 0)
		fail(d, ret, "loading the devices' state (%" PRIu64 " bytes): %s", d->dev_len, strerror(-ret));
	if (ret < 0)
		return mig_recv_restore(d->g, d->fresh, n, d->err, d->len) < 0 ? -ENOTRECOVERABLE : ret;
	return 0;
}

/* After END: the end of this connection's stream. */
static int check_end(struct dest *d)
{
	uint8_t extra;
	int ret = d->rd->read(d->rd->ctx, &extra, 1);

	if (ret > 0)
		return fail(d, -EPROTO, "after END: more bytes; the stream must end at END");
	if (ret < 0) {
		char why[160];

		d->rd->describe(d->rd->ctx, ret, why, sizeof(why));
		return fail(d, ret, "awaiting the end of the stream after END: %s", why);
	}
	return 0;
}

/* A connection's refusal: the stream's, if it is the first; every connection still reading is woken. */
static int lane_failed(struct dest *d, int ret)
{
	struct lanes *sh = d->sh;

	if (!sh)
		return ret;
	pthread_mutex_lock(&sh->lock);
	if (!sh->failed) {
		sh->failed = true;
		sh->ret = ret;
		if (d->lane)
			snprintf(sh->err, sizeof(sh->err), "connection %u: %s", d->lane, d->err);
		else
			snprintf(sh->err, sizeof(sh->err), "%s", d->err);
		if (sh->cancel)
			sh->cancel(sh->cancel_ctx);
	}
	pthread_mutex_unlock(&sh->lock);
	return ret;
}

/* Records up to END on a connection other than 0: DATA and ZERO only (the decoder refuses the rest). */
static int receive_lane(struct dest *d)
{
	struct mig_record rec;
	int ret;

	for (;;) {
		ret = get(d, &rec, sizeof(rec), "record %" PRIu64, d->dec.nrec);
		if (ret == 0)
			ret = mig_decode_record(&d->dec, &rec, d->err, d->len);
		if (ret < 0 || rec.kind == MIG_END)
			break;
		if (rec.kind == MIG_DATA)
			ret = recv_data(d, &rec);
		else if (rec.kind == MIG_DATA_Z)
			ret = recv_data_z(d, &rec);
		else if (rec.kind == MIG_LEFT)
			recv_left(d, &rec);
		else
			recv_zero(d, &rec);
		if (ret < 0)
			break;
	}
	if (ret == 0) {
		d->res->records = d->dec.nrec - 1;
		/* post-copy: the lane carries the pages left at the source after the handoff */
		ret = d->dec.flags & MIG_F_POSTCOPY ? 0 : check_end(d);
	}
	return ret;
}

static void *lane_thread(void *p)
{
	struct dest *d = p;
	int ret = receive_lane(d);

	if (ret < 0)
		lane_failed(d, ret);
	/* read once the thread is joined (join_lanes()) */
	d->cpu_ns = mig_thread_cpu_ns(pthread_self());
	return NULL;
}

/* Start connection 1.. on threads of their own, once the header set the flags. */
static int start_lanes(struct dest *d0)
{
	struct lanes *sh = d0->sh;
	unsigned int i;

	for (i = 1; i < sh->n; i++) {
		struct dest *d = sh->d[i];

		d->dec = (struct mig_decoder){ .regions = d0->own, .nr_regions = d0->dec.nr_regions,
					       .nr_vcpus = d0->dec.nr_vcpus, .flags = d0->dec.flags, .sum = MIG_SUM_INIT,
					       .lane = i, .lanes = sh->n, .postcopy_ok = d0->dec.postcopy_ok,
					       .zstd_ok = d0->dec.zstd_ok };
		d->left = d0->left;
		if (pthread_create(&d->thread, NULL, lane_thread, d))
			return fail(d0, -EAGAIN, "this destination: cannot start a thread for connection %u", i);
		sh->started = i + 1;
	}
	return 0;
}

/* Wait for every connection's thread; the first refusal, if any. */
static int join_lanes(struct dest *d0)
{
	struct lanes *sh = d0->sh;
	unsigned int i;

	if (!sh)
		return 0;
	for (i = 1; i < sh->started; i++)
		pthread_join(sh->d[i]->thread, NULL);
	sh->started = 0;
	return sh->failed ? sh->ret : 0;
}

/*
 * After END on a connection that carries the handoff: the source sends
 * nothing more until READY.  Bytes already there are refused as bytes
 * after END are; any that come after READY are read as the handoff's.
 */
static int check_nothing_yet(struct dest *d)
{
	uint8_t extra;

	/* in the channel already (sealed in END's record, given back), or waiting in the socket */
	if ((d->handoff_ch && mig_chan_buffered(d->handoff_ch)) ||
	    recv(d->handoff_fd, &extra, 1, MSG_PEEK | MSG_DONTWAIT) > 0)
		return fail(d, -EPROTO, "after END: more bytes before READY; the stream must end at END");
	return 0;
}

/* After END: every connection's stream ended, every page arrived, every page whole. */
static int check_complete(struct dest *d)
{
	unsigned int i;
	/* a stream held in memory (tests, the fuzzer) with post-copy: post-copy's records follow END */
	int ret = d->handoff_fd >= 0 ? check_nothing_yet(d) : d->dec.flags & MIG_F_POSTCOPY ? 0 : check_end(d);

	if (ret < 0)
		return ret;
	ret = join_lanes(d);
	if (ret < 0)
		return ret;
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

/* Post-copy's maps of the pages left at the source, one a region, shared by every connection. */
static int left_maps(struct dest *d)
{
	unsigned int i;

	d->left = calloc(d->g->nr_regions ? d->g->nr_regions : 1, sizeof(*d->left));
	for (i = 0; d->left && i < d->g->nr_regions; i++)
		if (!(d->left[i] = calloc(KVMDIRTY_BITMAP_WORDS(d->g->regions[i].size / PAGE), sizeof(uint64_t))))
			return fail(d, -ENOMEM, "this destination: out of memory");
	return d->left ? 0 : fail(d, -ENOMEM, "this destination: out of memory");
}

static void left_free(uint64_t **left, unsigned int n)
{
	unsigned int i;

	for (i = 0; left && i < n; i++)
		free(left[i]);
	free(left);
}

static int receive_table(struct dest *d)
{
	struct mig_region *theirs = calloc(d->g->nr_regions ? d->g->nr_regions : 1, sizeof(*theirs));
	int ret;

	if (!theirs)
		return fail(d, -ENOMEM, "this destination: out of memory for the region table");
	ret = get(d, theirs, d->g->nr_regions * sizeof(theirs[0]), "the region table");
	if (ret == 0)
		ret = mig_decode_regions(&d->dec, theirs, d->err, d->len);
	free(theirs);
	return ret;
}

static int receive(struct dest *d)
{
	struct mig_header h;
	struct mig_record rec;
	int ret;

	ret = get(d, &h, sizeof(h), "the header");
	if (ret == 0)
		ret = mig_decode_header(&d->dec, &h, d->err, d->len);
	if (ret == 0 && (h.flags & MIG_F_POSTCOPY))
		ret = left_maps(d);
	if (ret == 0 && (h.flags & MIG_F_PAGE_HASH) && !d->inline_hash && mig_worker_start(&d->w, verifier, d) < 0)
		ret = fail(d, -EAGAIN, "this destination: cannot start the verifier thread");
	if (ret == 0)
		ret = receive_table(d);
	if (ret == 0 && d->sh)
		ret = start_lanes(d);
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
		else if (rec.kind == MIG_DATA_Z)
			ret = recv_data_z(d, &rec);
		else if (rec.kind == MIG_ZERO)
			recv_zero(d, &rec);
		else if (rec.kind == MIG_LEFT)
			recv_left(d, &rec);
		else if (rec.kind == MIG_VCPU)
			ret = recv_vcpu(d, &rec);
		else if (rec.kind == MIG_VM)
			ret = recv_vm(d);
		else if (rec.kind == MIG_DEVICES || rec.kind == MIG_DEVICES_LIVE)
			ret = recv_devices(d, &rec);
		if (ret < 0)
			return ret;
	}
	d->res->records += d->dec.nrec - 1;
	ret = check_complete(d);
	if (ret == 0)
		ret = load_state(d);
	if (ret < 0)
		return ret;
	d->res->hashed = d->dec.flags & MIG_F_PAGE_HASH;
	return 0;
}

int mig_recv_restore(const struct mig_guest *g, const struct mig_vcpu_state *fresh, unsigned int n, char *err,
		     size_t len)
{
	unsigned int i;
	int ret;

	for (i = 0; i < n; i++) {
		ret = g->ops->vcpu_load(g->ctx, i, &fresh[i]);
		if (ret < 0)
			return mig_errf(err, len, ret, "vCPU %u: its state before the stream cannot be loaded back (%s): "
					"this destination's guest is not fit for another stream", i, strerror(-ret));
	}
	return 0;
}

/* Each vCPU's state before any stream touched it, for mig_recv_restore(). */
static int save_fresh(struct dest *d)
{
	unsigned int i;
	int ret;

	for (i = 0; i < d->g->nr_vcpus; i++) {
		ret = d->g->ops->vcpu_save(d->g->ctx, i, &d->fresh[i]);
		if (ret < 0)
			return fail(d, ret, "this destination: saving vCPU %u's state before the stream: %s", i,
				    strerror(-ret));
	}
	return 0;
}

/*
 * Receive over rd[0..n): connection 0 on this thread, the others on
 * threads of their own (each hashing what it lands), all into the same
 * bitmaps, whose words no two connections share (stream.h).
 */
/* The destination's own maps of the guest: its regions, which pages are still missing and which bad. */
static int dest_maps(struct dest *d)
{
	const struct mig_guest *g = d->g;
	unsigned int i;

	d->vs = calloc(g->nr_vcpus, sizeof(*d->vs));
	d->own = calloc(g->nr_regions ? g->nr_regions : 1, sizeof(*d->own));
	d->missing = calloc(g->nr_regions ? g->nr_regions : 1, sizeof(*d->missing));
	d->bad = calloc(g->nr_regions ? g->nr_regions : 1, sizeof(*d->bad));
	for (i = 0; d->own && d->missing && d->bad && i < g->nr_regions; i++) {
		uint64_t np = g->regions[i].size / PAGE;

		d->own[i] = (struct mig_region){ g->regions[i].gpa, g->regions[i].size };
		d->missing[i] = malloc(KVMDIRTY_BITMAP_WORDS(np) * sizeof(uint64_t));
		d->bad[i] = calloc(KVMDIRTY_BITMAP_WORDS(np), sizeof(uint64_t));
		if (!d->missing[i] || !d->bad[i])
			break;
		kvmdirty_bitmap_set(d->missing[i], 0, np);
	}
	if (!d->vs || i < g->nr_regions)
		return fail(d, -ENOMEM, "this destination: out of memory");
	return 0;
}

/* The connections after the first, each a lane of its own sharing d's maps (sh: theirs and d's). */
static int lanes_new(struct dest *d, const struct mig_reader *rd, unsigned int n, struct lanes *sh)
{
	unsigned int i;

	pthread_mutex_init(&sh->lock, NULL);
	d->sh = sh;
	d->dec.lanes = n;
	sh->d[0] = d;
	for (i = 1; i < n; i++) {
		struct dest *l = calloc(1, sizeof(*l));

		if (!l)
			return fail(d, -ENOMEM, "this destination: out of memory");
		*l = (struct dest){ .g = d->g, .rd = &rd[i], .inline_hash = true, .sh = sh, .lane = i, .handoff_fd = -1,
				    .err = l->lane_err, .len = sizeof(l->lane_err) };
		l->res = &l->lane_res;
		l->own = d->own;
		l->missing = d->missing;
		l->bad = d->bad;
		sh->d[i] = l;
	}
	return 0;
}

static void dest_free(struct dest *d, unsigned int n, struct lanes *sh)
{
	unsigned int i;

	for (i = 1; i < n && i < MIG_MAX_LANES; i++) {
		if (sh->d[i]) {
			free(sh->d[i]->zbuf);
			mig_unzip_free(sh->d[i]->unzip);
		}
		free(sh->d[i]);
	}
	free(d->zbuf);
	mig_unzip_free(d->unzip);
	if (d->sh)
		pthread_mutex_destroy(&sh->lock);
	for (i = 0; i < d->g->nr_regions && d->missing && d->bad; i++) {
		free(d->missing[i]);
		free(d->bad[i]);
	}
	free(d->own);
	free(d->missing);
	free(d->bad);
	left_free(d->left, d->g->nr_regions);
	free(d->vs);
	free(d->dev);
	free(d->dev_live);
	free(d);
}

/* What a stream may carry beyond DATA: what its session agreed to. */
#define TAKES_POSTCOPY 1u /* LEFT records (post-copy) */
#define TAKES_ZSTD 2u	  /* DATA_Z records */

/*
 * takes: TAKES_*; with post-copy, where the stream left pages at the source, *ret_left gets their maps (the
 * caller's to free, left_free()), else NULL.
 */
static int recv_lanes(const struct mig_guest *g, const struct mig_reader *rd, unsigned int n, bool inline_hash,
		      struct mig_vcpu_state *fresh, int handoff_fd, struct mig_chan *handoff_ch,
		      void (*cancel)(void *ctx), void *cancel_ctx, unsigned int takes, uint64_t ***ret_left,
		      struct mig_recv_result *res, char *err, size_t len)
{
	struct dest *d = calloc(1, sizeof(*d));
	struct lanes sh = { .n = n, .cancel = cancel, .cancel_ctx = cancel_ctx };
	uint64_t cpu0 = mig_thread_cpu_ns(pthread_self()), cpu;
	unsigned int i;
	int ret = 0;

	memset(res, 0, sizeof(*res));
	if (!d)
		return -ENOMEM;
	d->g = g;
	d->rd = &rd[0];
	d->fresh = fresh;
	d->handoff_fd = handoff_fd;
	d->handoff_ch = handoff_ch;
	d->inline_hash = inline_hash || n > 1;
	d->res = res;
	d->err = err;
	d->len = len;
	if (g->nr_regions > MIG_MAX_REGIONS || g->nr_vcpus > MIG_MAX_VCPUS || n > MIG_MAX_LANES) {
		ret = fail(d, -EINVAL, "this destination: %u regions, %u vCPUs and %u connections, the stream carries "
			   "at most %u, %u and %u", g->nr_regions, g->nr_vcpus, n, MIG_MAX_REGIONS, MIG_MAX_VCPUS,
			   MIG_MAX_LANES);
		goto out;
	}
	ret = dest_maps(d);
	if (ret < 0)
		goto out;
	mig_decoder_init(&d->dec, d->own, g->nr_regions, g->nr_vcpus);
	d->dec.postcopy_ok = takes & TAKES_POSTCOPY;
	d->dec.zstd_ok = takes & TAKES_ZSTD;
	ret = save_fresh(d);
	if (ret == 0 && n > 1)
		ret = lanes_new(d, rd, n, &sh);
	if (ret < 0)
		goto out;
	ret = receive(d);
	if (ret < 0)
		lane_failed(d, ret);
	join_lanes(d);
	for (i = 1; i < sh.n; i++) {
		res->pages += sh.d[i]->res->pages;
		res->zpages += sh.d[i]->res->zpages;
		res->records += sh.d[i]->res->records;
	}
	for (i = 1; i < sh.n; i++)
		d->left_pages += sh.d[i]->left_pages;
	if (sh.failed) {
		snprintf(err, len, "%s", sh.err);
		ret = sh.ret;
	}
	mig_worker_stop(&d->w);
	/* the CPU of the threads that received it: this one's since it began, each lane's, the verifier's */
	cpu = mig_thread_cpu_ns(pthread_self());
	cpu = (cpu > cpu0 ? cpu - cpu0 : 0) + d->cpu_ns;
	for (i = 1; i < sh.n; i++)
		cpu += sh.d[i]->cpu_ns;
	res->cpu_s = (double)cpu / 1e9;
	/* pages left at the source: the caller's, for post-copy */
	if (ret == 0 && d->left && d->left_pages && ret_left) {
		*ret_left = d->left;
		d->left = NULL;
	}
out:
	dest_free(d, n, &sh);
	return ret;
}

int mig_recv_stream_postcopy(const struct mig_guest *g, const struct mig_reader *rd, bool inline_hash,
			     uint64_t *ret_left, struct mig_recv_result *res, char *err, size_t len)
{
	struct mig_vcpu_state *fresh = calloc(g->nr_vcpus ? g->nr_vcpus : 1, sizeof(*fresh));
	uint64_t **left = NULL;
	unsigned int i;
	int ret;

	if (ret_left)
		*ret_left = 0;
	if (!fresh)
		return mig_errf(err, len, -ENOMEM, "this destination: out of memory");
	/* a stream held in memory (tests, the fuzzer) may carry whatever a session could agree to */
	ret = recv_lanes(g, rd, 1, inline_hash, fresh, -1, NULL, NULL, NULL, (ret_left ? TAKES_POSTCOPY : 0) | TAKES_ZSTD,
			 &left, res, err, len);
	for (i = 0; left && ret_left && i < g->nr_regions; i++)
		*ret_left += kvmdirty_bitmap_count(left[i], 0, g->regions[i].size / PAGE);
	left_free(left, g->nr_regions);
	free(fresh);
	return ret;
}

int mig_recv_stream(const struct mig_guest *g, const struct mig_reader *rd, bool inline_hash,
		    struct mig_recv_result *res, char *err, size_t len)
{
	return mig_recv_stream_postcopy(g, rd, inline_hash, NULL, res, err, len);
}

/* A refusal wakes every connection of the stream still reading. */
static void cancel_session(void *ctx)
{
	const struct mig_session *s = ctx;
	unsigned int i;

	/* reads only: connection 0 still carries the answer that says why */
	for (i = 0; i < s->conns; i++)
		shutdown(s->fd[i], SHUT_RD);
}

/*
 * This end writes nothing more on the session's connections: each of its
 * directions ends with its last record (sealed: MIG_SEAL_LAST, channel.h),
 * best effort, and each in its own wait (-T): the stream's deadline may
 * have passed meanwhile.
 */
static void end_writing(struct mig_session *s)
{
	unsigned int i;

	for (i = 0; i < s->conns; i++) {
		if (!s->chan[i])
			continue;
		mig_conn_set_deadline(s->conn[i], 0);
		mig_chan_close_write(s->chan[i]);
	}
}

/* Post-copy's memory made ready at COMMIT, before the ACK (handoff.h: on_commit). */
struct commit_ctx {
	const struct mig_guest *g;
	uint64_t **left;
	struct mig_pc *pc;
};

static int pc_on_commit(void *ctx, char *why, size_t len)
{
	struct commit_ctx *c = ctx;
	char e[200];
	int ret = mig_pc_prepare(c->g, c->left, &c->pc, e, sizeof(e));

	if (ret < 0)
		snprintf(why, len, "post-copy cannot run here: %s; the guest was dropped", e);
	return ret;
}

/* Connection 0 once the stream is in: READY, then COMMIT or ABORT (handoff.h). */
static int handoff(const struct mig_guest *g, const struct mig_recv_opts *o, struct mig_session *s,
		   const struct mig_vcpu_state *fresh, struct commit_ctx *pcc, struct mig_recv_result *res, char *err,
		   size_t len)
{
	struct mig_status own;
	struct mig_handoff h = { .ch = s->chan[0], .fd = s->fd[0], .timeout_ms = mig_guest_wait_ms(g, o->timeout_ms),
				 .st = o->status ? o->status : &own,
				 .unknown = o->unknown, .ctx = o->unknown_ctx, .wait = o->status != NULL,
				 .on_commit = pcc->left ? pc_on_commit : NULL, .commit_ctx = pcc };
	char why[256];
	int ret;

	if (!o->status)
		mig_status_init(&own, true);
	res->outcome = mig_handoff_dest(&h, err, len);
	if (!o->status)
		mig_status_destroy(&own);
	/* run here by a resolve before COMMIT came: post-copy's memory made ready now */
	if (res->outcome == MIG_OUTCOME_HERE && pcc->left && !pcc->pc &&
	    mig_pc_prepare(g, pcc->left, &pcc->pc, err, len) < 0)
		return -ENOTRECOVERABLE;
	if (res->outcome == MIG_OUTCOME_HERE)
		return 0;
	mig_pc_free(pcc->pc);
	pcc->pc = NULL;
	if (res->outcome == MIG_OUTCOME_UNKNOWN)
		return -EINPROGRESS;
	/* dropped: the vCPUs as before the stream, for the next one */
	ret = mig_recv_restore(g, fresh, g->nr_vcpus, why, sizeof(why));
	if (ret < 0) {
		snprintf(err, len, "%s", why);
		return -ENOTRECOVERABLE;
	}
	return -ECANCELED;
}

/* How the stream ended here, as an event: completed (the guest runs here) or failed (dropped). */
static void dest_event(struct mig_status *st, const struct mig_recv_result *res, int ret, const char *err)
{
	char why[2 * MIG_EVENT_LINE / 3];

	mig_event_str(why, sizeof(why), err);
	if (ret == 0 && res->outcome == MIG_OUTCOME_HERE)
		mig_status_event(st, "completed", "\"side\":\"destination\"");
	else if (res->outcome != MIG_OUTCOME_UNKNOWN)
		mig_status_event(st, "failed", "\"side\":\"destination\",\"outcome\":\"dropped\",\"error\":\"%s\"", why);
}

void mig_recv_session_opts(const struct mig_recv_opts *o, struct mig_session_opts *so)
{
	*so = (struct mig_session_opts){ .psk = o->psk, .encrypt = o->encrypt, .timeout_ms = o->timeout_ms,
					 .deadline_ms = o->deadline_ms, .log = o->log, .log_ctx = o->log_ctx,
					 .name = o->name, .postcopy = o->postcopy };
}

int mig_recv_session(const struct mig_guest *g, struct mig_session *s, const struct mig_recv_opts *o,
		     struct mig_recv_result *res, char *err, size_t len)
{
	struct mig_reader rd[MIG_MAX_CONNS];
	struct mig_vcpu_state *fresh;
	struct commit_ctx pcc = { .g = g };
	bool postcopy = s->flags & MIG_S_POSTCOPY;
	unsigned int i;
	int ret;

	memset(res, 0, sizeof(*res));
	res->outcome = MIG_OUTCOME_THERE;
	fresh = calloc(g->nr_vcpus ? g->nr_vcpus : 1, sizeof(*fresh));
	if (!fresh) {
		ret = mig_errf(err, len, -ENOMEM, "this destination: out of memory");
		mig_handoff_refuse(s->chan[0], ret, err);
		goto out;
	}
	if (o->status)
		mig_status_reset(o->status);
	/* the stream's waits, now that the session is made: -T, and what the guest's size adds */
	for (i = 0; i < s->conns; i++) {
		mig_conn_set_timeout(s->conn[i], mig_guest_wait_ms(g, o->timeout_ms));
		rd[i] = mig_chan_reader(s->chan[i]);
	}
	/* post-copy's fault channel, the last connection, carries nothing of the stream */
	ret = recv_lanes(g, rd, s->conns - (postcopy ? 1 : 0), o->inline_hash, fresh, s->fd[0], s->chan[0],
			 cancel_session, s, (postcopy ? TAKES_POSTCOPY : 0) | (s->flags & MIG_S_ZSTD ? TAKES_ZSTD : 0),
			 &pcc.left, res, err, len);
	res->outcome = MIG_OUTCOME_THERE;
	if (ret < 0) {
		/* the answer has its own wait (-T): a stream refused for its deadline still hears why */
		mig_conn_set_deadline(s->conn[0], 0);
		mig_handoff_refuse(s->chan[0], ret, err); /* best effort: the peer may be gone */
	} else {
		ret = handoff(g, o, s, fresh, &pcc, res, err, len);
	}
	/* post-copy: the guest runs here, its pages left at the source come over the session, which it takes */
	if (ret == 0 && pcc.pc) {
		ret = mig_pc_start(pcc.pc, s, o->status, err, len);
		res->pc = pcc.pc;
		pcc.pc = NULL;
	}
out:
	if (o->status)
		dest_event(o->status, res, ret, err);
	end_writing(s);
	mig_session_free(s);
	left_free(pcc.left, g->nr_regions);
	free(fresh);
	return ret;
}

int mig_recv(const struct mig_guest *g, int fd, const struct mig_recv_opts *o, struct mig_recv_result *res,
	     char *err, size_t len)
{
	struct mig_session_opts so;
	struct mig_session s;
	int ret;

	memset(res, 0, sizeof(*res));
	res->outcome = MIG_OUTCOME_THERE;
	mig_recv_session_opts(o, &so);
	/* the session (or a plain stream), every connection of it joined: nothing of the guest read yet */
	ret = mig_session_accept(fd, &so, o->accept, o->accept_ctx, &s, err, len);
	if (ret < 0)
		return ret; /* answered */
	return mig_recv_session(g, &s, o, res, err, len);
}
