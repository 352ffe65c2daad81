// SPDX-License-Identifier: MIT
/*
 * Pre-copy live migration over io_uring: the source sends all of memory,
 * then what the tracker reports, until the rest fits the downtime at the
 * bandwidth measured; then it pauses the vCPUs, sends the rest, their
 * state and (optionally) a digest of every page, and waits for the
 * destination's answer.  Pages go out in runs straight from guest memory
 * (one iovec per run) and come in straight into guest memory; zero pages
 * are sent as a record without payload.
 */
#define _GNU_SOURCE /* accept4 */
#include <errno.h>
#include <inttypes.h>
#include <liburing.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "migrate.h"
#include "stream.h"

#define PAGE 4096ull

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif
#define MAX_REGIONS 16
#define BATCH_RECORDS 256
#define RUN_PAGES 4096 /* pages a run carries at most: 16 MiB in one iovec */

static int fail(char *err, size_t len, int ret, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static int fail(char *err, size_t len, int ret, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, len, fmt, ap);
	va_end(ap);
	return ret;
}

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* ---- transport: blocking stream socket driven through io_uring ---- */

struct xport {
	struct io_uring ring;
	int fd;
	uint64_t sent;
};

static int xport_init(struct xport *x, int fd)
{
	int size = 4 << 20;

	x->fd = fd;
	x->sent = 0;
	/*
	 * Socket buffers of a few MiB: with the default ~200 KiB every batch
	 * goes out in hundreds of partial sends, each a poll round trip.
	 * The FORCE variants pass the sysctl caps where allowed (root).
	 */
	if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof(size)))
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
	if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof(size)))
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
	return io_uring_queue_init(8, &x->ring, 0);
}

static int xport_wait(struct xport *x)
{
	struct io_uring_cqe *cqe;
	int ret = io_uring_submit_and_wait(&x->ring, 1);

	if (ret < 0)
		return ret;
	ret = io_uring_wait_cqe(&x->ring, &cqe);
	if (ret < 0)
		return ret;
	ret = cqe->res;
	io_uring_cqe_seen(&x->ring, cqe);
	return ret;
}

/* Send all of iov[0..n); one sendmsg per batch, resubmitted after a short send. */
static int xport_writev(struct xport *x, struct iovec *iov, int n)
{
	while (n > 0) {
		struct msghdr msg = { .msg_iov = iov, .msg_iovlen = (size_t)(n < 1024 ? n : 1024) };
		struct io_uring_sqe *sqe = io_uring_get_sqe(&x->ring);
		int ret;
		size_t done;

		/* MSG_WAITALL: io_uring itself retries partial sends of a stream socket */
		io_uring_prep_sendmsg(sqe, x->fd, &msg, MSG_NOSIGNAL | MSG_WAITALL);
		ret = xport_wait(x);
		if (ret < 0)
			return ret;
		if (!ret)
			return -EPIPE;
		x->sent += (uint64_t)ret;
		for (done = (size_t)ret; n > 0 && done >= iov->iov_len; n--, iov++)
			done -= iov->iov_len;
		if (n > 0) {
			iov->iov_base = (char *)iov->iov_base + done;
			iov->iov_len -= done;
		}
	}
	return 0;
}

/* Read exactly len bytes; -ECONNRESET if the stream ends first. */
static int xport_read(struct xport *x, void *buf, size_t len)
{
	while (len) {
		struct io_uring_sqe *sqe = io_uring_get_sqe(&x->ring);
		int ret;

		io_uring_prep_recv(sqe, x->fd, buf, len < (1u << 30) ? len : (1u << 30), MSG_WAITALL);
		ret = xport_wait(x);
		if (ret < 0)
			return ret;
		if (!ret)
			return -ECONNRESET;
		buf = (char *)buf + ret;
		len -= (size_t)ret;
	}
	return 0;
}

/* ---- the guest both ends build ---- */

int mig_guest_new(const struct mig_guest *g, bool source, struct testvm **ret_tv, char *err, size_t len)
{
	struct testvm_opts o = { .nr_vcpus = g->vcpus, .track = source, .track_opts = { .mode = g->mode } };
	uint64_t ws = g->ws_mib << 20, per;
	struct testvm *tv;
	void *mem;
	unsigned int i;
	int ret;

	if (g->ws_mib > g->mib)
		return fail(err, len, -EINVAL, "working set %" PRIu64 " MiB exceeds memory %" PRIu64 " MiB",
			    g->ws_mib, g->mib);
	ret = testvm_new(&o, &tv);
	if (ret < 0)
		return fail(err, len, ret, "creating the VM: %s", strerror(-ret));
	ret = testvm_add_memory(tv, MIG_DATA_GPA, g->mib << 20, 0, &mem, NULL);
	if (ret < 0) {
		testvm_free(tv);
		return fail(err, len, ret, "adding %" PRIu64 " MiB of guest memory: %s", g->mib, strerror(-ret));
	}
	/*
	 * A destination faults its memory in before the stream starts, as a
	 * VMM allocates a guest's RAM before it is started: first touches
	 * cost about 5 us a page on this nested host, which would otherwise
	 * be paid inside the migration (and its downtime).
	 */
	if (!source && madvise(mem, g->mib << 20, MADV_POPULATE_WRITE))
		memset(mem, 0, g->mib << 20);
	per = ws / g->vcpus / PAGE;
	for (i = 0; source && i < g->vcpus; i++) {
		struct guest_vcpu *mb = testvm_mailbox(tv, i);

		mb->gpa = MIG_DATA_GPA + i * per * PAGE;
		mb->pages = per;
		mb->pattern = GUEST_SEQUENTIAL;
		mb->tsc_per_page = testvm_tsc_per_page(tv, g->rate);
		mb->flags = GUEST_F_CHECK;
	}
	*ret_tv = tv;
	return 0;
}

void mig_guest_fill(struct testvm *tv, uint64_t zero_every)
{
	struct kvmdirty_region *r = kvmdirty_region_from_gpa(tv->vm, MIG_DATA_GPA);
	uint8_t *p = kvmdirty_region_hva(r);
	uint64_t i, n = kvmdirty_region_size(r) / PAGE, x = 0x9e3779b97f4a7c15ull;

	for (i = 0; i < n; i++, p += PAGE) {
		uint64_t *w = (uint64_t *)p, k;

		if (zero_every && i % zero_every == 0)
			continue;
		/* the first 16 bytes are the guest's tag: left to it */
		for (k = 2; k < PAGE / 8; k++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			w[k] = x;
		}
	}
}

/* ---- shared pieces ---- */

struct layout {
	struct kvmdirty_region *r[MAX_REGIONS];
	struct mig_region desc[MAX_REGIONS];
	uint32_t n;
	uint32_t index_of_slot[65536];
};

static int layout_of(struct testvm *tv, struct layout *l)
{
	struct kvmdirty_region *r;

	l->n = 0;
	for (r = kvmdirty_region_next(tv->vm, NULL); r; r = kvmdirty_region_next(tv->vm, r)) {
		if (l->n == MAX_REGIONS)
			return -E2BIG;
		l->r[l->n] = r;
		l->desc[l->n] = (struct mig_region){ kvmdirty_region_gpa(r), kvmdirty_region_size(r) };
		l->index_of_slot[kvmdirty_region_slot(r)] = l->n;
		l->n++;
	}
	return 0;
}

/*
 * A page's digest: four independent multiply-xor lanes (a single chain
 * made hashing, which runs while the guest is paused, the larger part of
 * the demo's downtime), folded at the end.
 */
static uint64_t page_hash(const uint8_t *p)
{
	const uint64_t *w = (const uint64_t *)p;
	uint64_t h[4] = { 0x243f6a8885a308d3ull, 0x13198a2e03707344ull, 0xa4093822299f31d0ull, 0x082efa98ec4e6c89ull };
	size_t i, k;

	for (i = 0; i < PAGE / 8; i += 4)
		for (k = 0; k < 4; k++)
			h[k] = (h[k] ^ w[i + k]) * 0x9e3779b97f4a7c15ull;
	for (k = 1; k < 4; k++)
		h[0] = (h[0] ^ (h[k] >> 29) ^ h[k]) * 0xbf58476d1ce4e5b9ull;
	return h[0] ^ (h[0] >> 31);
}

/* FNV-1a over the stream's headers and small payloads: END carries it. */
static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const uint8_t *b = p;

	while (n--)
		h = (h ^ *b++) * 0x100000001b3ull;
	return h;
}

#define FNV_INIT 0xcbf29ce484222325ull

static bool page_is_zero(const uint8_t *p)
{
	static const uint8_t zero[PAGE];

	return !memcmp(p, zero, PAGE);
}

/* ---- source ---- */

struct batch {
	struct xport *x;
	uint64_t sum; /* the stream checksum so far */
	struct mig_record hdr[BATCH_RECORDS];
	struct iovec iov[2 * BATCH_RECORDS];
	int nh, ni;
};

static int flush(struct batch *b)
{
	int ret = b->ni ? xport_writev(b->x, b->iov, b->ni) : 0;

	b->nh = b->ni = 0;
	return ret;
}

static int put(struct batch *b, uint32_t kind, uint32_t index, uint64_t first, uint64_t count,
	       const void *payload, size_t plen)
{
	int ret;

	if (b->nh == BATCH_RECORDS) {
		ret = flush(b);
		if (ret < 0)
			return ret;
	}
	if (kind == MIG_END)
		first = b->sum;
	b->hdr[b->nh] = (struct mig_record){ kind, index, first, count };
	if (kind != MIG_END)
		b->sum = fnv(b->sum, &b->hdr[b->nh], sizeof(struct mig_record));
	/* page data is covered by the digests, everything else by the checksum */
	if (kind == MIG_VCPU || kind == MIG_DIGEST)
		b->sum = fnv(b->sum, payload, plen);
	b->iov[b->ni++] = (struct iovec){ &b->hdr[b->nh++], sizeof(struct mig_record) };
	if (plen)
		b->iov[b->ni++] = (struct iovec){ (void *)payload, plen };
	return 0;
}

struct send_state {
	struct testvm *tv;
	struct batch b;
	struct layout l;
	uint64_t pages, zero_pages;
};

/* One handed-out range, split into data and zero runs. */
static int send_range(struct send_state *s, const struct kvmdirty_range *rg)
{
	uint32_t idx = s->l.index_of_slot[kvmdirty_region_slot(rg->region)];
	const uint8_t *p = rg->hva;
	uint64_t i = 0, j;
	int ret;

	while (i < rg->npages) {
		bool zero = page_is_zero(p + i * PAGE);

		for (j = i + 1; j < rg->npages && page_is_zero(p + j * PAGE) == zero; j++)
			;
		ret = put(&s->b, zero ? MIG_ZERO : MIG_DATA, idx, rg->page + i, j - i, zero ? NULL : p + i * PAGE,
			  zero ? 0 : (j - i) * PAGE);
		if (ret < 0)
			return ret;
		if (zero)
			s->zero_pages += j - i;
		s->pages += j - i;
		i = j;
	}
	return 0;
}

/* Hand out and send everything pending. */
static int drain(struct send_state *s)
{
	struct kvmdirty_range rg[64];
	int n, i, ret;

	while ((n = kvmdirty_tracker_next(s->tv->tracker, rg, 64, 16 * RUN_PAGES)) > 0) {
		for (i = 0; i < n; i++) {
			struct kvmdirty_range part = rg[i];

			/* at most RUN_PAGES a record, so a payload stays a modest iovec */
			while (part.npages) {
				struct kvmdirty_range r = part;

				r.npages = part.npages < RUN_PAGES ? part.npages : RUN_PAGES;
				ret = send_range(s, &r);
				if (ret < 0)
					return ret;
				part.page += r.npages;
				part.hva = (char *)part.hva + r.npages * PAGE;
				part.npages -= r.npages;
			}
		}
	}
	return n < 0 ? n : flush(&s->b);
}

static int vcpu_state_get(struct testvm *tv, unsigned int i, struct mig_vcpu_state *st)
{
	int fd = kvmdirty_vcpu_fd(tv->vcpu[i]);
	struct {
		struct kvm_msrs hdr;
		struct kvm_msr_entry e[MIG_NR_MSRS];
	} msrs = { .hdr.nmsrs = MIG_NR_MSRS, .e = { { .index = 0x10 } } };

	memset(st, 0, sizeof(*st));
	if (ioctl(fd, KVM_GET_REGS, &st->regs) < 0 || ioctl(fd, KVM_GET_SREGS, &st->sregs) < 0 ||
	    ioctl(fd, KVM_GET_XSAVE, &st->xsave) < 0)
		return -errno;
	if (ioctl(fd, KVM_GET_MSRS, &msrs) != MIG_NR_MSRS)
		return -EIO;
	memcpy(st->msrs, msrs.e, sizeof(st->msrs));
	return 0;
}

static int vcpu_state_set(struct testvm *tv, unsigned int i, const struct mig_vcpu_state *st)
{
	int fd = kvmdirty_vcpu_fd(tv->vcpu[i]);
	struct {
		struct kvm_msrs hdr;
		struct kvm_msr_entry e[MIG_NR_MSRS];
	} msrs = { .hdr.nmsrs = MIG_NR_MSRS };

	memcpy(msrs.e, st->msrs, sizeof(st->msrs));
	if (ioctl(fd, KVM_SET_SREGS, &st->sregs) < 0 || ioctl(fd, KVM_SET_REGS, &st->regs) < 0 ||
	    ioctl(fd, KVM_SET_XSAVE, &st->xsave) < 0)
		return -errno;
	if (ioctl(fd, KVM_SET_MSRS, &msrs) != MIG_NR_MSRS)
		return -EIO;
	return 0;
}

static void stats_line(const struct mig_send_opts *o, unsigned int pass, uint64_t pages, uint64_t zero,
		       uint64_t bytes, double ms, uint64_t remaining, double mib_s, uint64_t rate, double est_ms)
{
	if (o->stats)
		fprintf(o->stats,
			"{\"pass\":%u,\"pages\":%" PRIu64 ",\"zero_pages\":%" PRIu64 ",\"bytes\":%" PRIu64
			",\"ms\":%.3f,\"remaining_pages\":%" PRIu64 ",\"mib_per_s\":%.1f,\"dirty_pages_per_s\":%" PRIu64
			",\"est_downtime_ms\":%.3f}\n",
			pass, pages, zero, bytes, ms, remaining, mib_s, rate, est_ms);
	if (o->progress)
		fprintf(stderr, "\rpass %u: %.1f MiB remaining, %.0f MiB/s, dirty %" PRIu64
				" pages/s, est. downtime %.1f ms   ",
			pass, remaining * PAGE / 1048576.0, mib_s, rate, est_ms);
}

int mig_send(struct testvm *tv, int fd, const struct mig_send_opts *o, struct mig_result *res, char *err,
	     size_t len)
{
	struct send_state *s = calloc(1, sizeof(*s));
	struct kvmdirty_tracker *t = tv->tracker;
	struct mig_header h = { .magic = MIG_MAGIC, .version = MIG_VERSION, .page_size = PAGE };
	struct xport x;
	struct mig_ack ack;
	struct kvmdirty_stats st;
	double t0 = now_ms(), tp, tdown = 0;
	uint64_t *hashes = NULL;
	bool paused = false;
	unsigned int pass = 0, i;
	int ret;

	memset(res, 0, sizeof(*res));
	if (!s)
		return fail(err, len, -ENOMEM, "out of memory");
	if (!t) {
		free(s);
		return fail(err, len, -EINVAL, "the source VM has no tracker");
	}
	ret = xport_init(&x, fd);
	if (ret < 0) {
		free(s);
		return fail(err, len, ret, "io_uring: %s", strerror(-ret));
	}
	s->tv = tv;
	s->b.x = &x;
	ret = layout_of(tv, &s->l);
	if (ret < 0)
		goto out;
	h.nr_regions = s->l.n;
	h.nr_vcpus = tv->nr_vcpus;
	h.flags = o->verify ? MIG_F_DIGEST : 0;
	ret = kvmdirty_tracker_start(t, NULL);
	if (ret < 0) {
		fail(err, len, ret, "starting dirty tracking: %s", strerror(-ret));
		goto out;
	}
	{
		struct iovec iov[2] = { { &h, sizeof(h) }, { s->l.desc, s->l.n * sizeof(struct mig_region) } };

		s->b.sum = fnv(fnv(FNV_INIT, &h, sizeof(h)), s->l.desc, s->l.n * sizeof(struct mig_region));
		ret = xport_writev(&x, iov, 2);
		if (ret < 0)
			goto net;
	}

	/* pre-copy: all of memory, then what was written meanwhile */
	for (;;) {
		uint64_t pages0 = s->pages, zero0 = s->zero_pages, bytes0 = x.sent, pending;
		double ms, mib_s, est;

		pass++;
		tp = now_ms();
		ret = drain(s);
		if (ret == 0)
			ret = put(&s->b, MIG_PASS, 0, pass, 0, NULL, 0);
		if (ret < 0)
			goto net;
		ms = now_ms() - tp;
		mib_s = ms > 0 ? (x.sent - bytes0) / 1048576.0 / (ms / 1e3) : 0;
		ret = (int)kvmdirty_tracker_sync(t);
		if (ret < 0) {
			fail(err, len, ret, "dirty log sync: %s", strerror(-ret));
			goto out;
		}
		pending = kvmdirty_tracker_pending(t);
		kvmdirty_tracker_stats(t, &st, sizeof(st));
		est = mib_s > 0 ? pending * PAGE / 1048576.0 / mib_s * 1e3 : 0;
		stats_line(o, pass, s->pages - pages0, s->zero_pages - zero0, x.sent - bytes0, ms, pending, mib_s,
			   st.dirty_rate, est);
		if (est <= (double)o->downtime_ms) {
			res->converged = true;
			break;
		}
		if (pass >= o->max_passes || now_ms() - t0 >= (double)o->timeout_ms)
			break;
	}

	/* stop-and-copy */
	tdown = now_ms();
	testvm_pause_all(tv);
	paused = true;
	ret = (int)kvmdirty_tracker_sync(t);
	if (ret < 0) {
		fail(err, len, ret, "final dirty log sync: %s", strerror(-ret));
		goto out;
	}
	ret = drain(s);
	if (ret < 0)
		goto net;
	for (i = 0; i < tv->nr_vcpus; i++) {
		static struct mig_vcpu_state vs[GUEST_MAX_VCPUS];

		ret = vcpu_state_get(tv, i, &vs[i]);
		if (ret < 0) {
			fail(err, len, ret, "reading vCPU %u state: %s", i, strerror(-ret));
			goto out;
		}
		ret = put(&s->b, MIG_VCPU, i, 0, sizeof(vs[i]), &vs[i], sizeof(vs[i]));
		if (ret < 0)
			goto net;
	}
	if (o->verify) {
		uint64_t total = 0, k, off = 0;

		for (i = 0; i < s->l.n; i++)
			total += s->l.desc[i].size / PAGE;
		hashes = malloc(total * sizeof(*hashes));
		if (!hashes) {
			ret = fail(err, len, -ENOMEM, "out of memory for digests");
			goto out;
		}
		for (i = 0; i < s->l.n; i++) {
			uint64_t n = s->l.desc[i].size / PAGE;
			const uint8_t *p = kvmdirty_region_hva(s->l.r[i]);

			for (k = 0; k < n; k++)
				hashes[off + k] = page_hash(p + k * PAGE);
			ret = put(&s->b, MIG_DIGEST, i, 0, n, hashes + off, n * sizeof(*hashes));
			if (ret < 0)
				goto net;
			off += n;
		}
	}
	ret = put(&s->b, MIG_END, 0, 0, 0, NULL, 0);
	if (ret == 0)
		ret = flush(&s->b);
	if (ret < 0)
		goto net;
	ret = xport_read(&x, &ack, sizeof(ack));
	if (ret < 0)
		goto net;
	ack.message[sizeof(ack.message) - 1] = 0;
	if (ack.status) {
		ret = fail(err, len, ack.status < 0 ? ack.status : -EPROTO, "destination refused: %s", ack.message);
		goto out;
	}
	res->downtime_ms = now_ms() - tdown;
	ret = 0;
	goto out;
net:
	fail(err, len, ret, "connection: %s", strerror(-ret));
out:
	if (o->progress)
		fprintf(stderr, "\n");
	res->total_ms = now_ms() - t0;
	res->bytes = x.sent;
	res->passes = pass;
	res->pages = s->pages;
	res->zero_pages = s->zero_pages;
	kvmdirty_tracker_stop(t, NULL);
	/* a failed migration leaves the guest running where it was */
	if (ret < 0 && paused)
		testvm_resume_all(tv);
	if (o->stats)
		fprintf(o->stats,
			"{\"summary\":true,\"ok\":%s,\"total_ms\":%.3f,\"downtime_ms\":%.3f,\"bytes\":%" PRIu64
			",\"passes\":%u,\"pages\":%" PRIu64 ",\"zero_pages\":%" PRIu64 ",\"converged\":%s}\n",
			ret ? "false" : "true", res->total_ms, res->downtime_ms, res->bytes, pass, s->pages,
			s->zero_pages, res->converged ? "true" : "false");
	io_uring_queue_exit(&x.ring);
	free(hashes);
	free(s);
	return ret;
}

/* ---- destination ---- */

static int recv_fail(struct xport *x, char *err, size_t len, int ret, const char *fmt, ...)
	__attribute__((format(printf, 5, 6)));

/* Record the reason and tell the source (best effort: it may be gone). */
static int recv_fail(struct xport *x, char *err, size_t len, int ret, const char *fmt, ...)
{
	struct mig_ack ack = { .status = ret };
	struct iovec iov = { &ack, sizeof(ack) };
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, len, fmt, ap);
	va_end(ap);
	snprintf(ack.message, sizeof(ack.message), "%s", err);
	xport_writev(x, &iov, 1);
	return ret;
}

static const char *kind_name(uint32_t k)
{
	static const char *const n[] = { "?", "DATA", "ZERO", "PASS", "VCPU", "DIGEST", "END" };

	return k < 7 ? n[k] : "?";
}

int mig_recv(struct testvm *tv, int fd, bool *ret_verified, char *err, size_t len)
{
	static struct mig_vcpu_state vs[GUEST_MAX_VCPUS];
	struct layout *l = calloc(1, sizeof(*l));
	uint64_t *digest[MAX_REGIONS] = { 0 }, nrec = 0;
	bool have_vcpu[GUEST_MAX_VCPUS] = { 0 };
	struct mig_region theirs[MAX_REGIONS];
	struct mig_header h;
	struct mig_record rec;
	struct xport x;
	uint64_t sum;
	uint32_t i;
	int ret;

	*ret_verified = false;
	if (!l)
		return fail(err, len, -ENOMEM, "out of memory");
	ret = xport_init(&x, fd);
	if (ret < 0) {
		free(l);
		return fail(err, len, ret, "io_uring: %s", strerror(-ret));
	}
	ret = layout_of(tv, l);
	if (ret < 0) {
		ret = recv_fail(&x, err, len, ret, "local layout: too many regions");
		goto out;
	}
	ret = xport_read(&x, &h, sizeof(h));
	if (ret < 0) {
		ret = recv_fail(&x, err, len, ret, "header: stream truncated (%s)", strerror(-ret));
		goto out;
	}
	if (memcmp(h.magic, MIG_MAGIC, sizeof(h.magic))) {
		ret = recv_fail(&x, err, len, -EPROTO, "header.magic: not a kvmdirty-migrate stream");
		goto out;
	}
	if (h.version != MIG_VERSION) {
		ret = recv_fail(&x, err, len, -EPROTO, "header.version: %u, this destination speaks %u", h.version,
				MIG_VERSION);
		goto out;
	}
	if (h.page_size != PAGE) {
		ret = recv_fail(&x, err, len, -EPROTO, "header.page_size: %u, expected %llu", h.page_size, PAGE);
		goto out;
	}
	if (h.nr_regions != l->n) {
		ret = recv_fail(&x, err, len, -EPROTO, "header.nr_regions: %u, this destination has %u", h.nr_regions,
				l->n);
		goto out;
	}
	if (h.nr_vcpus != tv->nr_vcpus) {
		ret = recv_fail(&x, err, len, -EPROTO, "header.nr_vcpus: %u, this destination has %u", h.nr_vcpus,
				tv->nr_vcpus);
		goto out;
	}
	if (h.flags & ~MIG_F_DIGEST || h.reserved) {
		ret = recv_fail(&x, err, len, -EPROTO, "header.flags: unknown bits 0x%x", h.flags & ~MIG_F_DIGEST);
		goto out;
	}
	ret = xport_read(&x, theirs, l->n * sizeof(theirs[0]));
	if (ret < 0) {
		ret = recv_fail(&x, err, len, ret, "region table: stream truncated");
		goto out;
	}
	for (i = 0; i < l->n; i++) {
		if (theirs[i].gpa != l->desc[i].gpa || theirs[i].size != l->desc[i].size) {
			ret = recv_fail(&x, err, len, -EPROTO,
					"region[%u]: gpa 0x%" PRIx64 " size 0x%" PRIx64 ", this destination has gpa 0x%" PRIx64
					" size 0x%" PRIx64,
					i, theirs[i].gpa, theirs[i].size, l->desc[i].gpa, l->desc[i].size);
			goto out;
		}
	}

	sum = fnv(fnv(FNV_INIT, &h, sizeof(h)), theirs, l->n * sizeof(theirs[0]));
	for (;; nrec++) {
		uint64_t npages;
		uint8_t *hva;

		ret = xport_read(&x, &rec, sizeof(rec));
		if (ret < 0) {
			ret = recv_fail(&x, err, len, ret, "record %" PRIu64 ": stream truncated before END", nrec);
			goto out;
		}
		if (rec.kind != MIG_END)
			sum = fnv(sum, &rec, sizeof(rec));
		switch (rec.kind) {
		case MIG_DATA:
		case MIG_ZERO:
			if (rec.index >= l->n) {
				ret = recv_fail(&x, err, len, -EPROTO, "record %" PRIu64 " (%s).region: %u, stream has %u",
						nrec, kind_name(rec.kind), rec.index, l->n);
				goto out;
			}
			npages = l->desc[rec.index].size / PAGE;
			if (!rec.count || rec.first >= npages || rec.count > npages - rec.first) {
				ret = recv_fail(&x, err, len, -EPROTO,
						"record %" PRIu64 " (%s).pages: [%" PRIu64 ", +%" PRIu64
						") outside region %u (%" PRIu64 " pages)",
						nrec, kind_name(rec.kind), rec.first, rec.count, rec.index, npages);
				goto out;
			}
			hva = (uint8_t *)kvmdirty_region_hva(l->r[rec.index]) + rec.first * PAGE;
			if (rec.kind == MIG_ZERO) {
				memset(hva, 0, rec.count * PAGE);
				break;
			}
			/* checked above: straight into guest memory */
			ret = xport_read(&x, hva, rec.count * PAGE);
			if (ret < 0) {
				ret = recv_fail(&x, err, len, ret, "record %" PRIu64 " (DATA) payload: stream truncated",
						nrec);
				goto out;
			}
			break;
		case MIG_PASS:
			if (rec.index || rec.count) {
				ret = recv_fail(&x, err, len, -EPROTO, "record %" PRIu64 " (PASS): non-zero index or count",
						nrec);
				goto out;
			}
			break;
		case MIG_VCPU:
			if (rec.index >= tv->nr_vcpus || have_vcpu[rec.index]) {
				ret = recv_fail(&x, err, len, -EPROTO, "record %" PRIu64 " (VCPU).vcpu: %u %s", nrec,
						rec.index, rec.index >= tv->nr_vcpus ? "out of range" : "sent twice");
				goto out;
			}
			if (rec.count != sizeof(vs[0]) || rec.first) {
				ret = recv_fail(&x, err, len, -EPROTO, "record %" PRIu64 " (VCPU).length: %" PRIu64
						", expected %zu", nrec, rec.count, sizeof(vs[0]));
				goto out;
			}
			ret = xport_read(&x, &vs[rec.index], sizeof(vs[0]));
			if (ret < 0) {
				ret = recv_fail(&x, err, len, ret, "record %" PRIu64 " (VCPU) payload: stream truncated",
						nrec);
				goto out;
			}
			have_vcpu[rec.index] = true;
			sum = fnv(sum, &vs[rec.index], sizeof(vs[0]));
			break;
		case MIG_DIGEST:
			if (!(h.flags & MIG_F_DIGEST) || rec.index >= l->n || digest[rec.index]) {
				ret = recv_fail(&x, err, len, -EPROTO, "record %" PRIu64 " (DIGEST).region: %u unexpected",
						nrec, rec.index);
				goto out;
			}
			npages = l->desc[rec.index].size / PAGE;
			if (rec.count != npages || rec.first) {
				ret = recv_fail(&x, err, len, -EPROTO, "record %" PRIu64 " (DIGEST).pages: %" PRIu64
						", region %u has %" PRIu64, nrec, rec.count, rec.index, npages);
				goto out;
			}
			digest[rec.index] = malloc(npages * sizeof(uint64_t));
			if (!digest[rec.index]) {
				ret = recv_fail(&x, err, len, -ENOMEM, "out of memory for digests");
				goto out;
			}
			ret = xport_read(&x, digest[rec.index], npages * sizeof(uint64_t));
			if (ret < 0) {
				ret = recv_fail(&x, err, len, ret, "record %" PRIu64 " (DIGEST) payload: stream truncated",
						nrec);
				goto out;
			}
			sum = fnv(sum, digest[rec.index], npages * sizeof(uint64_t));
			break;
		case MIG_END:
			if (rec.index || rec.count) {
				ret = recv_fail(&x, err, len, -EPROTO, "record %" PRIu64 " (END): non-zero fields", nrec);
				goto out;
			}
			if (rec.first != sum) {
				ret = recv_fail(&x, err, len, -EPROTO, "END.checksum: the stream was corrupted");
				goto out;
			}
			goto end;
		default:
			ret = recv_fail(&x, err, len, -EPROTO, "record %" PRIu64 ".kind: %u is not a record kind", nrec,
					rec.kind);
			goto out;
		}
	}
end:
	for (i = 0; i < tv->nr_vcpus; i++) {
		if (!have_vcpu[i]) {
			ret = recv_fail(&x, err, len, -EPROTO, "END: no VCPU record for vCPU %u", i);
			goto out;
		}
	}
	if (h.flags & MIG_F_DIGEST) {
		for (i = 0; i < l->n; i++) {
			const uint8_t *p = kvmdirty_region_hva(l->r[i]);
			uint64_t k, n = l->desc[i].size / PAGE;

			if (!digest[i]) {
				ret = recv_fail(&x, err, len, -EPROTO, "END: no DIGEST record for region %u", i);
				goto out;
			}
			for (k = 0; k < n; k++) {
				if (page_hash(p + k * PAGE) != digest[i][k]) {
					ret = recv_fail(&x, err, len, -EIO,
							"digest: region %u page %" PRIu64 " (gpa 0x%" PRIx64 ") differs",
							i, k, l->desc[i].gpa + k * (uint64_t)PAGE);
					goto out;
				}
			}
		}
		*ret_verified = true;
	}
	for (i = 0; i < tv->nr_vcpus; i++) {
		ret = vcpu_state_set(tv, i, &vs[i]);
		if (ret < 0) {
			ret = recv_fail(&x, err, len, ret, "setting vCPU %u state: %s", i, strerror(-ret));
			goto out;
		}
	}
	{
		struct mig_ack ack = { .status = 0 };
		struct iovec iov = { &ack, sizeof(ack) };

		snprintf(ack.message, sizeof(ack.message), "ok");
		ret = xport_writev(&x, &iov, 1);
		if (ret < 0) {
			fail(err, len, ret, "answering the source: %s", strerror(-ret));
			goto out;
		}
	}
	ret = 0;
out:
	for (i = 0; i < MAX_REGIONS; i++)
		free(digest[i]);
	io_uring_queue_exit(&x.ring);
	free(l);
	return ret;
}

int mig_resume_check(struct testvm *tv, uint64_t run_ms, char *err, size_t len)
{
	struct timespec ts = { (time_t)(run_ms / 1000), (long)(run_ms % 1000) * 1000000 };
	uint64_t pass0 = testvm_mailbox(tv, 0)->pass;
	struct testvm_exit ex;
	unsigned int bad = 0;
	int ret = testvm_spawn(tv);

	if (ret < 0)
		return fail(err, len, ret, "starting vCPUs: %s", strerror(-ret));
	nanosleep(&ts, NULL);
	testvm_stop_all(tv);
	ret = testvm_join(tv, &bad, &ex);
	if (ret < 0)
		return fail(err, len, ret, "vCPU %u after resume: %s (page 0x%" PRIx64 ")", bad,
			    ret == -EIO ? testvm_event_name(ex.event) : strerror(-ret), testvm_mailbox(tv, bad)->err_gpa);
	if (testvm_mailbox(tv, 0)->pass <= pass0)
		return fail(err, len, -EIO, "the guest made no progress after resume (pass %" PRIu64 ")", pass0);
	return fail(err, len, 0, "pass %" PRIu64 " -> %" PRIu64, pass0, testvm_mailbox(tv, 0)->pass);
}

/* ---- addresses ---- */

static int resolve(const char *addr, bool passive, struct sockaddr_storage *ss, socklen_t *sl, char *err,
		   size_t len)
{
	if (!strncmp(addr, "unix:", 5)) {
		struct sockaddr_un *un = (struct sockaddr_un *)ss;

		if (!addr[5] || strlen(addr + 5) >= sizeof(un->sun_path))
			return fail(err, len, -EINVAL, "address '%s': unix path empty or too long", addr);
		memset(un, 0, sizeof(*un));
		un->sun_family = AF_UNIX;
		strcpy(un->sun_path, addr + 5);
		*sl = sizeof(*un);
		return 0;
	}
	if (!strncmp(addr, "tcp:", 4)) {
		const char *colon = strrchr(addr + 4, ':');
		struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai;
		char host[256];
		size_t hl;
		int ret;

		if (!colon || !colon[1])
			return fail(err, len, -EINVAL, "address '%s': expected tcp:HOST:PORT", addr);
		hl = (size_t)(colon - (addr + 4));
		if (hl >= sizeof(host))
			return fail(err, len, -EINVAL, "address '%s': host too long", addr);
		memcpy(host, addr + 4, hl);
		host[hl] = 0;
		if (!hl) /* listening defaults to loopback */
			strcpy(host, "127.0.0.1");
		(void)passive;
		ret = getaddrinfo(host, colon + 1, &hints, &ai);
		if (ret)
			return fail(err, len, -EINVAL, "address '%s': %s", addr, gai_strerror(ret));
		memcpy(ss, ai->ai_addr, ai->ai_addrlen);
		*sl = ai->ai_addrlen;
		freeaddrinfo(ai);
		return 0;
	}
	return fail(err, len, -EINVAL, "address '%s': expected tcp:HOST:PORT or unix:PATH", addr);
}

int mig_listen(const char *addr, char *err, size_t len)
{
	struct sockaddr_storage ss;
	socklen_t sl;
	int fd, one = 1, ret = resolve(addr, true, &ss, &sl, err, len);

	if (ret < 0)
		return ret;
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return fail(err, len, -errno, "socket: %s", strerror(errno));
	if (ss.ss_family == AF_UNIX)
		unlink(((struct sockaddr_un *)&ss)->sun_path);
	else
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&ss, sl) < 0 || listen(fd, 1) < 0) {
		ret = -errno;
		close(fd);
		return fail(err, len, ret, "listening on '%s': %s", addr, strerror(-ret));
	}
	return fd;
}

int mig_accept(int lfd, char *err, size_t len)
{
	int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);

	return fd < 0 ? fail(err, len, -errno, "accept: %s", strerror(errno)) : fd;
}

int mig_connect(const char *addr, char *err, size_t len)
{
	struct sockaddr_storage ss;
	socklen_t sl;
	int fd, ret = resolve(addr, false, &ss, &sl, err, len);

	if (ret < 0)
		return ret;
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return fail(err, len, -errno, "socket: %s", strerror(errno));
	if (connect(fd, (struct sockaddr *)&ss, sl) < 0) {
		ret = -errno;
		close(fd);
		return fail(err, len, ret, "connecting to '%s': %s", addr, strerror(-ret));
	}
	return fd;
}
