// SPDX-License-Identifier: MIT
/*
 * Lazy restore: the page server on userfaultfd and the fill thread
 * (lazy.h says who places a page and what a failure does).  The
 * working-set file's layout: kvmdirty-snapshot(5).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <linux/userfaultfd.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "clock.h"
#include "errf.h"
#include "hist.h"
#include "lazy.h"
#include "snapshot.h"
#include "uffd.h"

/*
 * Threads reading faults: one.  A second, polling the same userfaultfd,
 * woke with the first for every fault and took CPU from the fill and the
 * vCPUs: on a 2-CPU host the fill of a 1 GiB chain took 1398 ms with two,
 * 336 ms with one; a single vCPU's faults p50 10.3 us / p99 51.8 us with
 * two, 14.3 / 19.2 with one (bench-lazy, one run each).
 */
#define SERVERS	   1
#define FILL_CHUNK 256 /* pages the filler reads at a time: 1 MiB */
#define AROUND	   15  /* pages after a faulting one placed with it, where the same copy is their newest */
#define MSGS	   16  /* fault messages a read takes */

#define WS_MAGIC   "KVMDWSET"
#define WS_VERSION 1u

void (*mig_lazy_hook)(enum mig_lazy_hook_point p, struct mig_lazy_hook *h);

static inline void hook(enum mig_lazy_hook_point p, struct mig_lazy_hook *h)
{
	void (*fn)(enum mig_lazy_hook_point, struct mig_lazy_hook *) = __atomic_load_n(&mig_lazy_hook, __ATOMIC_ACQUIRE);

	if (fn)
		fn(p, h);
}

struct ws_header {
	char magic[8]; /* WS_MAGIC */
	uint32_t version;
	uint32_t reserved;
	uint8_t chain[SNAP_ID]; /* the identity of the chain's newest file when it was recorded */
	uint64_t count;		/* entries that follow: region << 48 | page, u64 little-endian each */
};
/* ... then the SHA-256 of the header and the entries */

struct lregion {
	uint8_t *hva;
	uint64_t size, npages;
	uint64_t *placed; /* atomic bits: the page is in memory (copied, zero page, or found there: EEXIST) */
	uint64_t *bad;	  /* atomic bits: its copy failed its check; never placed */
};

struct mig_lazy {
	struct mig_lazy *next_busy; /* under busy_lock: on busy_list until resident or freed */
	const struct mig_guest *g;
	struct snap_file **files;
	unsigned int n;
	struct lregion *r;
	uint32_t nr_regions;
	uint32_t *by_hva; /* region indexes by hva, for a fault's address */
	int uffd, stop_fd;
	struct mig_lazy_opts o;
	char ws_write[SNAP_PATH_MAX];
	uint64_t *ws_in; /* the working-set file's entries */
	pthread_t server[SERVERS], filler;
	unsigned int nr_servers;
	bool filler_started;
	int failing; /* __atomic: a failure was recorded (loops stop) */
	int stopping; /* __atomic: mig_lazy_free() */
	/* under lock */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool failed, paused, resident;
	int fail_ret;
	uint64_t failed_ns; /* when the failure was recorded */
	pthread_mutex_t rd_lock; /* a fault's read and its place in the working set's order, together */
	char why[768];
	uint64_t *ws; /* faults' DATA pages, in order, until resident */
	uint64_t ws_n, ws_cap;
	struct mig_lazy_stats st;
	double t0;
};

/*
 * The restores whose guests are not resident yet, in this process: their
 * memory reads right only through the page server, and KVM's dirty log
 * never sees what UFFDIO_COPY places, so a snapshot or a migration of it
 * must wait (mig_lazy_busy()).
 */
static pthread_mutex_t busy_lock = PTHREAD_MUTEX_INITIALIZER;
static struct mig_lazy *busy_list;

static void busy_add(struct mig_lazy *lz)
{
	pthread_mutex_lock(&busy_lock);
	lz->next_busy = busy_list;
	busy_list = lz;
	pthread_mutex_unlock(&busy_lock);
}

static void busy_del(struct mig_lazy *lz)
{
	struct mig_lazy **pp;

	pthread_mutex_lock(&busy_lock);
	for (pp = &busy_list; *pp; pp = &(*pp)->next_busy)
		if (*pp == lz) {
			*pp = lz->next_busy;
			break;
		}
	pthread_mutex_unlock(&busy_lock);
}

bool mig_lazy_busy(const struct mig_guest *g)
{
	const struct mig_lazy *lz;
	unsigned int i;
	uint32_t r;
	bool busy = false;

	pthread_mutex_lock(&busy_lock);
	for (lz = busy_list; lz && !busy; lz = lz->next_busy)
		for (r = 0; r < lz->nr_regions && !busy; r++)
			for (i = 0; i < g->nr_regions && !busy; i++) {
				uintptr_t a = (uintptr_t)g->regions[i].hva, b = (uintptr_t)lz->r[r].hva;

				busy = a < b + lz->r[r].size && b < a + g->regions[i].size;
			}
	pthread_mutex_unlock(&busy_lock);
	return busy;
}

static inline bool bit_test(uint64_t *map, uint64_t i)
{
	return __atomic_load_n(&map[i / 64], __ATOMIC_ACQUIRE) >> (i % 64) & 1;
}

static inline void bit_set(uint64_t *map, uint64_t i)
{
	__atomic_fetch_or(&map[i / 64], 1ull << (i % 64), __ATOMIC_RELEASE);
}

double mig_lazy_bucket_us(unsigned int i)
{
	return mig_hist_bound_us(i);
}

/* The first failure wins: its reason kept, the filler told to pause the guest. */
static void lazy_fail(struct mig_lazy *lz, int ret, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void lazy_fail(struct mig_lazy *lz, int ret, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&lz->lock);
	if (!lz->failed && !lz->resident) {
		lz->failed = true;
		lz->fail_ret = ret;
		lz->failed_ns = mig_clock_ns();
		va_start(ap, fmt);
		vsnprintf(lz->why, sizeof(lz->why), fmt, ap);
		va_end(ap);
		__atomic_store_n(&lz->failing, 1, __ATOMIC_RELEASE);
		pthread_cond_broadcast(&lz->cond);
	}
	pthread_mutex_unlock(&lz->lock);
}

static bool halted(struct mig_lazy *lz)
{
	return __atomic_load_n(&lz->failing, __ATOMIC_ACQUIRE) || __atomic_load_n(&lz->stopping, __ATOMIC_ACQUIRE);
}

/*
 * Where page p of region r comes from: the newest file listing it (*ret_f,
 * *ret_run), or none (0: the page is zero in the chain, or listed ZERO).
 */
static bool lookup(const struct mig_lazy *lz, uint32_t r, uint64_t p, const struct snap_file **ret_f,
		   const struct snap_run **ret_run)
{
	unsigned int j = lz->n;

	while (j--) {
		const struct snap_file *f = lz->files[j];
		uint64_t lo = 0, hi = f->h.nr_runs;

		/* the last run starting at or before (r, p) */
		while (lo < hi) {
			uint64_t mid = lo + (hi - lo) / 2;
			const struct snap_run *m = &f->runs[mid];

			if (m->region < r || (m->region == r && m->first <= p))
				lo = mid + 1;
			else
				hi = mid;
		}
		if (lo) {
			const struct snap_run *run = &f->runs[lo - 1];

			if (run->region == r && p < run->first + run->count) {
				*ret_f = f;
				*ret_run = run;
				return run->kind == SNAP_RUN_DATA;
			}
		}
	}
	return false;
}

/*
 * count pages from page p of run in f into buf, each checked against its
 * hash: 0, or -errno (the restore failed).  A fault's page is checked
 * always; fill (the filler, and the pages after a fault) skips a page
 * placed meanwhile, and its caller must then copy only pages still
 * missing (fill_chunk()): those were missing here too, so were checked.
 */
static int read_checked(struct mig_lazy *lz, const struct snap_file *f, const struct snap_run *run, uint64_t p,
			uint64_t count, uint8_t *buf, bool fill)
{
	const struct snap_region *reg = &f->regions[run->region];
	struct mig_lazy_hook h = { .region = run->region, .page = p, .count = count, .fill = fill };
	uint64_t off = reg->data_off + p * SNAP_PAGE, n = count * SNAP_PAGE, got = 0, i;

	hook(MIG_LAZY_HOOK_READ, &h);
	if (h.inject) {
		lazy_fail(lz, -h.inject, "%s: reading region %u page %" PRIu64 ": %s", f->path, run->region, p,
			  strerror(h.inject));
		return -h.inject;
	}
	while (got < n) {
		ssize_t k = pread(f->fd, buf + got, n - got, (off_t)(off + got));

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			int e = k < 0 ? errno : 0;
			struct stat sb;

			if (!e && fstat(f->fd, &sb) == 0 && (uint64_t)sb.st_size != f->size)
				lazy_fail(lz, -EPROTO, "%s: changed under the restore: %" PRIu64 " bytes, %" PRIu64
					  " when it began", f->path, (uint64_t)sb.st_size, f->size);
			else
				lazy_fail(lz, e ? -e : -EPROTO, "%s: reading region %u page %" PRIu64 ": %s", f->path,
					  run->region, p + got / SNAP_PAGE, e ? strerror(e) : "the file ends there");
			return e ? -e : -EPROTO;
		}
		got += (uint64_t)k;
	}
	for (i = 0; i < count; i++) {
		uint64_t pg = p + i;

		if (fill && bit_test(lz->r[run->region].placed, pg))
			continue;
		if (mig_page_hash(buf + i * SNAP_PAGE) != f->hashes[run->hash_first + pg - run->first]) {
			bit_set(lz->r[run->region].bad, pg);
			lazy_fail(lz, -EPROTO,
				  "%s: region %u page %" PRIu64 " (gpa 0x%" PRIx64 "): not its hash (damaged, or the "
				  "file changed since the restore began); the guest never saw it",
				  f->path, run->region, pg, reg->gpa + pg * SNAP_PAGE);
			return -EPROTO;
		}
	}
	return 0;
}

/*
 * Place count pages of region r from page p (copies in src, or the zero
 * page where src is NULL): each one placed or found there (EEXIST) gets
 * its bit.  0, or -errno of the kernel (the restore failed).  *ret_new:
 * pages this call placed.
 */
static int place(struct mig_lazy *lz, uint32_t r, uint64_t p, uint64_t count, const uint8_t *src, uint64_t *ret_new)
{
	struct lregion *lr = &lz->r[r];
	uint64_t done = 0, placed = 0, raced = 0;
	int ret = 0;

	while (done < count) {
		uint64_t at = (uint64_t)(uintptr_t)lr->hva + (p + done) * SNAP_PAGE, len = (count - done) * SNAP_PAGE;
		int64_t res;
		int rc;

		if (src) {
			struct uffdio_copy c = { .dst = at, .src = (uint64_t)(uintptr_t)(src + done * SNAP_PAGE), .len = len };

			rc = ioctl(lz->uffd, UFFDIO_COPY, &c);
			res = c.copy;
		} else {
			struct uffdio_zeropage z = { .range = { .start = at, .len = len } };

			rc = ioctl(lz->uffd, UFFDIO_ZEROPAGE, &z);
			res = z.zeropage;
		}
		if (rc == 0)
			res = (int64_t)len;
		if (res > 0) {
			uint64_t k = (uint64_t)res / SNAP_PAGE, i;

			for (i = 0; i < k; i++)
				bit_set(lr->placed, p + done + i);
			done += k;
			placed += k;
			continue;
		}
		if (res == -EAGAIN || (rc < 0 && errno == EAGAIN && res == 0))
			continue;
		if (res == -EEXIST) {
			struct uffdio_range w = { .start = at, .len = SNAP_PAGE };

			/* there already: whoever placed it woke its waiters; wake again all the same */
			ioctl(lz->uffd, UFFDIO_WAKE, &w);
			bit_set(lr->placed, p + done);
			done++;
			raced++;
			continue;
		}
		ret = res < 0 ? (int)res : -errno;
		pthread_mutex_lock(&lz->lock);
		if (lz->resident)
			ret = 0; /* unregistered: every DATA page is in, the rest reads as zero */
		pthread_mutex_unlock(&lz->lock);
		if (ret)
			lazy_fail(lz, ret, "placing region %u page %" PRIu64 " (%s): %s", r, p + done,
				  src ? "UFFDIO_COPY" : "UFFDIO_ZEROPAGE", strerror(-ret));
		break;
	}
	if (raced) {
		pthread_mutex_lock(&lz->lock);
		lz->st.raced += raced;
		pthread_mutex_unlock(&lz->lock);
	}
	if (ret_new)
		*ret_new = placed;
	return ret;
}

/* The region holding hva (UINT32_MAX: none of the guest's). */
static uint32_t region_of(const struct mig_lazy *lz, uint64_t hva)
{
	uint32_t lo = 0, hi = lz->nr_regions;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		if ((uint64_t)(uintptr_t)lz->r[lz->by_hva[mid]].hva <= hva)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo) {
		const struct lregion *lr = &lz->r[lz->by_hva[lo - 1]];

		if (hva - (uint64_t)(uintptr_t)lr->hva < lr->size)
			return lz->by_hva[lo - 1];
	}
	return UINT32_MAX;
}

static void record(struct mig_lazy *lz, uint64_t t_read, bool zero)
{
	uint64_t ns = mig_clock_ns() - t_read;

	pthread_mutex_lock(&lz->lock);
	lz->st.faults++;
	lz->st.zero_faults += zero;
	lz->st.hist[mig_hist_bucket(ns)]++;
	if (ns / 1e3 > lz->st.fault_max_us)
		lz->st.fault_max_us = ns / 1e3;
	pthread_mutex_unlock(&lz->lock);
}

/* A fault on page p of region r, in the order the faults were read (the working-set file keeps its DATA pages). */
static void note_order(struct mig_lazy *lz, uint32_t r, uint64_t p)
{
	pthread_mutex_lock(&lz->lock);
	if (!lz->resident && lz->ws_n < (1ull << 26)) {
		if (lz->ws_n == lz->ws_cap) {
			uint64_t cap = lz->ws_cap ? lz->ws_cap * 2 : 4096;
			uint64_t *w = realloc(lz->ws, cap * sizeof(*w));

			if (w) {
				lz->ws = w;
				lz->ws_cap = cap;
			}
		}
		if (lz->ws_n < lz->ws_cap)
			lz->ws[lz->ws_n++] = (uint64_t)r << 48 | p;
	}
	pthread_mutex_unlock(&lz->lock);
}

static bool bad_settled(struct mig_lazy *lz)
{
	return lz->paused || __atomic_load_n(&lz->stopping, __ATOMIC_ACQUIRE) ||
	       (lz->failed && mig_clock_ns() - lz->failed_ns > 100000000ull);
}

/*
 * A fault on a page that failed its check.  Never its copy: once the
 * guest is paused (or 100 ms after the failure, by when the pause's kicks
 * have gone out and no vCPU enters the guest again), the zero page, so
 * that a VMM thread reading guest memory (a device, the pause's own
 * bookkeeping) is not held for ever; the guest must not run again.
 */
static void serve_bad(struct mig_lazy *lz, uint32_t r, uint64_t p)
{
	struct uffdio_zeropage z = { .range = { .start = (uint64_t)(uintptr_t)lz->r[r].hva + p * SNAP_PAGE,
						 .len = SNAP_PAGE } };

	pthread_mutex_lock(&lz->lock);
	while (!bad_settled(lz)) {
		struct timespec ts;

		clock_gettime(CLOCK_MONOTONIC, &ts);
		ts.tv_nsec += 10000000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&lz->cond, &lz->lock, &ts);
	}
	pthread_mutex_unlock(&lz->lock);
	if (ioctl(lz->uffd, UFFDIO_ZEROPAGE, &z) < 0 && errno == EEXIST)
		ioctl(lz->uffd, UFFDIO_WAKE, &z.range);
}

static int fill_chunk(struct mig_lazy *lz, const struct snap_file *f, const struct snap_run *run, uint64_t p,
		      uint64_t k, uint8_t *buf, uint64_t *ret_new);

/*
 * The pages after p (at most k) whose newest copy is in the same run of f
 * and that are not in yet: how many, from p.
 */
static uint64_t same_source(struct mig_lazy *lz, const struct snap_file *f, const struct snap_run *run, uint32_t r,
			    uint64_t p, uint64_t k)
{
	const struct snap_file *g;
	const struct snap_run *gr;
	uint64_t n;

	for (n = 0; n < k && p + n < run->first + run->count && !bit_test(lz->r[r].placed, p + n); n++)
		if (!lookup(lz, r, p + n, &g, &gr) || g != f || gr != run)
			break;
	return n;
}

/*
 * After a fault on a DATA page, the next pages of its copy (the same
 * checks, the filler's way): a guest that walks its memory faults once in
 * AROUND + 1 pages instead of on each.
 */
static void around(struct mig_lazy *lz, const struct snap_file *f, const struct snap_run *run, uint32_t r, uint64_t p,
		   uint8_t *buf)
{
	uint64_t k = same_source(lz, f, run, r, p, AROUND), n;

	/* as the filler: only pages still missing after their check are copied (a page checked is never skipped) */
	if (k && !halted(lz) && fill_chunk(lz, f, run, p, k, buf, &n) == 0) {
		uint64_t i;

		pthread_mutex_lock(&lz->lock);
		lz->st.around += n;
		pthread_mutex_unlock(&lz->lock);
		/* part of the working set as the guest will walk it again: noted after the page that faulted */
		for (i = 0; lz->ws_write[0] && i < k; i++)
			note_order(lz, r, p + i);
	}
}

/* A fault: its page placed; true with *ret_f, *ret_run where the pages after it may follow (around()). */
static bool serve(struct mig_lazy *lz, uint32_t r, uint64_t p, uint64_t t_read, uint8_t *buf,
		  const struct snap_file **ret_f, const struct snap_run **ret_run)
{
	struct mig_lazy_hook h;
	const struct snap_file *f = NULL;
	const struct snap_run *run = NULL;
	uint64_t placed = 0;
	bool data;

	if (bit_test(lz->r[r].bad, p)) {
		serve_bad(lz, r, p);
		return false;
	}
	/*
	 * Placed already or not, the page is read, checked and copied: a
	 * fault on a placed page is one read before the copy woke it (the
	 * copy then finds it there: EEXIST, and wakes again), or one the VMM
	 * discarded since (MADV_DONTNEED), which needs its copy again.
	 */
	data = lookup(lz, r, p, &f, &run);
	h = (struct mig_lazy_hook){ .region = r, .page = p, .count = 1 };
	hook(MIG_LAZY_HOOK_FAULT, &h);
	if (data && read_checked(lz, f, run, p, 1, buf, false) < 0) {
		serve_bad(lz, r, p);
		return false;
	}
	if (place(lz, r, p, 1, data ? buf : NULL, &placed) < 0 || !placed)
		return false;
	record(lz, t_read, !data);
	*ret_f = f;
	*ret_run = run;
	return data;
}

static void *server_main(void *arg)
{
	struct mig_lazy *lz = arg;
	struct uffd_msg msg[MSGS];
	uint32_t r[MSGS];
	uint64_t p[MSGS];
	const struct snap_file *af[MSGS];
	const struct snap_run *arun[MSGS];
	bool more[MSGS];
	uint8_t *buf = aligned_alloc(SNAP_PAGE, AROUND * SNAP_PAGE);

	if (!buf) {
		lazy_fail(lz, -ENOMEM, "the page server: out of memory");
		return NULL;
	}
	for (;;) {
		struct pollfd pf[2] = { { .fd = lz->uffd, .events = POLLIN }, { .fd = lz->stop_fd, .events = POLLIN } };
		ssize_t k;
		uint64_t t;
		int i, n;

		if (poll(pf, 2, -1) < 0 && errno != EINTR)
			break;
		if (pf[1].revents)
			break;
		/* the faults' order, as read, is the working set's: read and noted under one lock */
		pthread_mutex_lock(&lz->rd_lock);
		k = read(lz->uffd, msg, sizeof(msg));
		t = mig_clock_ns();
		if (k < 0) {
			int e = errno;

			pthread_mutex_unlock(&lz->rd_lock);
			if (e == EAGAIN || e == EINTR)
				continue;
			lazy_fail(lz, -e, "the page server: reading faults: %s", strerror(e));
			break;
		}
		n = 0;
		for (i = 0; i < k / (ssize_t)sizeof(msg[0]); i++) {
			uint64_t a = msg[i].arg.pagefault.address & ~(uint64_t)(SNAP_PAGE - 1);

			if (msg[i].event != UFFD_EVENT_PAGEFAULT || (r[n] = region_of(lz, a)) == UINT32_MAX)
				continue; /* not ours: nothing of the guest is registered there */
			p[n] = (a - (uint64_t)(uintptr_t)lz->r[r[n]].hva) / SNAP_PAGE;
			if (lz->ws_write[0])
				note_order(lz, r[n], p[n]);
			n++;
		}
		pthread_mutex_unlock(&lz->rd_lock);
		/* every fault of the read first, then the pages after each */
		for (i = 0; i < n; i++)
			more[i] = serve(lz, r[i], p[i], t, buf, &af[i], &arun[i]);
		for (i = 0; i < n; i++)
			if (more[i])
				around(lz, af[i], arun[i], r[i], p[i] + 1, buf);
	}
	free(buf);
	return NULL;
}

/* The filler's pages [p, p + k) of run in f (DATA), those not in place yet. */
static int fill_chunk(struct mig_lazy *lz, const struct snap_file *f, const struct snap_run *run, uint64_t p,
		      uint64_t k, uint8_t *buf, uint64_t *ret_new)
{
	struct lregion *lr = &lz->r[run->region];
	struct mig_lazy_hook h = { .region = run->region, .page = p, .count = k, .fill = true };
	uint64_t i, j, n, total = 0;
	int ret;

	*ret_new = 0;
	for (i = 0; i < k && bit_test(lr->placed, p + i); i++)
		;
	while (k && bit_test(lr->placed, p + k - 1))
		k--;
	if (i >= k)
		return 0;
	p += i;
	k -= i;
	ret = read_checked(lz, f, run, p, k, buf, true);
	if (ret < 0)
		return ret;
	for (i = 0; i < k; i = j) {
		for (; i < k && bit_test(lr->placed, p + i); i++)
			;
		for (j = i; j < k && !bit_test(lr->placed, p + j); j++)
			;
		if (j > i) {
			h.page = p + i;
			h.count = j - i;
			hook(MIG_LAZY_HOOK_PLACE, &h);
			ret = place(lz, run->region, p + i, j - i, buf + i * SNAP_PAGE, &n);
			total += n;
			if (ret < 0)
				break;
		}
	}
	*ret_new = total;
	return ret;
}

/* The working set's pages first, then every file newest first, each in page order. */
static int fill(struct mig_lazy *lz, uint8_t *buf)
{
	uint64_t **decided = calloc(lz->nr_regions, sizeof(*decided)), i, p, k, n, filled = 0, pre = 0, data = 0;
	uint32_t r;
	unsigned int j;
	int ret = 0;

	if (!decided)
		return -ENOMEM;
	for (r = 0; r < lz->nr_regions && !ret; r++)
		if (!(decided[r] = calloc((lz->r[r].npages + 63) / 64, 8)))
			ret = -ENOMEM;
	for (i = 0; !ret && lz->ws_in && i < lz->st.ws_pages && !halted(lz); i++) {
		const struct snap_file *f;
		const struct snap_run *run;

		r = (uint32_t)(lz->ws_in[i] >> 48);
		p = lz->ws_in[i] & ((1ull << 48) - 1);
		if (!lookup(lz, r, p, &f, &run))
			continue;
		/* the entries that follow on in the same copy, read and placed together */
		for (k = 1; k < FILL_CHUNK && i + k < lz->st.ws_pages && lz->ws_in[i + k] == lz->ws_in[i] + k &&
			    p + k < run->first + run->count;
		     k++) {
			const struct snap_file *g;
			const struct snap_run *gr;

			if (!lookup(lz, r, p + k, &g, &gr) || g != f || gr != run)
				break;
		}
		if ((ret = fill_chunk(lz, f, run, p, k, buf, &n)) == 0)
			pre += n;
		i += k - 1;
	}
	pthread_mutex_lock(&lz->lock);
	lz->st.prefetched = pre; /* known before the rest comes */
	pthread_mutex_unlock(&lz->lock);
	for (j = lz->n; j-- && !ret;) {
		const struct snap_file *f = lz->files[j];

		for (i = 0; i < f->h.nr_runs && !ret && !halted(lz); i++) {
			const struct snap_run *run = &f->runs[i];
			uint64_t *d = decided[run->region];

			for (p = run->first; p < run->first + run->count && !ret && !halted(lz); p = k) {
				/* the pages a newer file did not decide, up to a chunk */
				for (k = p; k < run->first + run->count && k - p < FILL_CHUNK && !(d[k / 64] >> (k % 64) & 1);
				     k++)
					d[k / 64] |= 1ull << (k % 64);
				if (k > p && run->kind == SNAP_RUN_DATA) {
					data += k - p;
					ret = fill_chunk(lz, f, run, p, k - p, buf, &n);
					filled += n;
				}
				for (; k < run->first + run->count && (d[k / 64] >> (k % 64) & 1); k++)
					;
			}
		}
	}
	for (r = 0; r < lz->nr_regions; r++)
		free(decided[r]);
	free(decided);
	pthread_mutex_lock(&lz->lock);
	lz->st.filled = filled + pre;
	lz->st.prefetched = pre;
	lz->st.data_pages = data;
	pthread_mutex_unlock(&lz->lock);
	return ret ? ret : halted(lz) ? -ECANCELED : 0;
}

/* The working-set file: the faults' DATA pages, each once, in the order the faults were read. */
static void ws_save(struct mig_lazy *lz)
{
	char tmp[SNAP_PATH_MAX + 32];
	struct ws_header h = { .version = WS_VERSION };
	uint8_t sha[SNAP_ID], *all = NULL;
	uint64_t **seen = calloc(lz->nr_regions, sizeof(*seen)), *e, i, m = 0;
	uint32_t r;
	int fd = -1, e_no = ENOMEM;

	for (r = 0; seen && r < lz->nr_regions; r++)
		if (!(seen[r] = calloc((lz->r[r].npages + 63) / 64, 8)))
			goto out;
	all = seen ? malloc(sizeof(h) + lz->ws_n * 8) : NULL;
	if (!all)
		goto out;
	e = (uint64_t *)(all + sizeof(h));
	for (i = 0; i < lz->ws_n; i++) {
		const struct snap_file *f;
		const struct snap_run *run;
		uint64_t p = lz->ws[i] & ((1ull << 48) - 1);

		r = (uint32_t)(lz->ws[i] >> 48);
		if (seen[r][p / 64] >> (p % 64) & 1 || !lookup(lz, r, p, &f, &run))
			continue;
		seen[r][p / 64] |= 1ull << (p % 64);
		e[m++] = lz->ws[i];
	}
	memcpy(h.magic, WS_MAGIC, 8);
	memcpy(h.chain, lz->files[lz->n - 1]->id, SNAP_ID);
	h.count = m;
	memcpy(all, &h, sizeof(h));
	snap_sha256(all, sizeof(h) + m * 8, sha);
	snprintf(tmp, sizeof(tmp), "%s.tmp.XXXXXX", lz->ws_write);
	fd = mkstemp(tmp);
	if (fd < 0) {
		e_no = errno;
		goto out;
	}
	/* whole or not at all: written beside, synced, renamed over the last one */
	if (write(fd, all, sizeof(h) + m * 8) == (ssize_t)(sizeof(h) + m * 8) &&
	    write(fd, sha, sizeof(sha)) == (ssize_t)sizeof(sha) && fsync(fd) == 0 && rename(tmp, lz->ws_write) == 0)
		e_no = 0;
	else
		e_no = errno ? errno : EIO;
	if (e_no)
		unlink(tmp);
out:
	if (fd >= 0)
		close(fd);
	if (e_no) {
		pthread_mutex_lock(&lz->lock);
		snprintf(lz->st.ws_note, sizeof(lz->st.ws_note), "%.100s: not written: %s", lz->ws_write, strerror(e_no));
		pthread_mutex_unlock(&lz->lock);
	}
	for (r = 0; seen && r < lz->nr_regions; r++)
		free(seen[r]);
	free(seen);
	free(all);
}

static void *filler_main(void *arg)
{
	struct mig_lazy *lz = arg;
	uint8_t *buf = aligned_alloc(SNAP_PAGE, (size_t)FILL_CHUNK * SNAP_PAGE);
	char line[900];
	uint32_t r;
	int ret = buf ? 0 : -ENOMEM;

	if (ret == 0 && !lz->o.no_fill)
		ret = fill(lz, buf);
	free(buf);
	if (ret == -ENOMEM)
		lazy_fail(lz, ret, "the fill thread: out of memory");
	if (ret == 0 && !lz->o.no_fill) {
		/* every DATA page is in: the rest is zero, which the kernel gives a missing page once unregistered */
		for (r = 0; r < lz->nr_regions; r++) {
			struct uffdio_range u = { .start = (uint64_t)(uintptr_t)lz->r[r].hva, .len = lz->r[r].size };

			ioctl(lz->uffd, UFFDIO_UNREGISTER, &u);
		}
		busy_del(lz);
		pthread_mutex_lock(&lz->lock);
		lz->resident = true; /* no fault records a page from here on */
		lz->st.resident_ms = mig_clock_msf() - lz->t0;
		snprintf(line, sizeof(line),
			 "resident after %.1f ms: %" PRIu64 " pages placed by faults, %" PRIu64
			 " by the fill; the snapshot files are needed no more",
			 lz->st.resident_ms, lz->st.faults, lz->st.filled);
		pthread_mutex_unlock(&lz->lock);
		if (lz->ws_write[0])
			ws_save(lz);
		if (lz->o.event)
			lz->o.event(lz->o.ctx, MIG_LAZY_RESIDENT, line);
		/* mig_lazy_wait() returns once the file is written and the event said */
		pthread_mutex_lock(&lz->lock);
		lz->st.resident = true;
		pthread_cond_broadcast(&lz->cond);
		pthread_mutex_unlock(&lz->lock);
		return NULL;
	}
	/* not resident: wait for a failure (then stop the guest) or the end */
	pthread_mutex_lock(&lz->lock);
	while (!lz->failed && !__atomic_load_n(&lz->stopping, __ATOMIC_ACQUIRE))
		pthread_cond_wait(&lz->cond, &lz->lock);
	if (!lz->failed || __atomic_load_n(&lz->stopping, __ATOMIC_ACQUIRE)) {
		pthread_mutex_unlock(&lz->lock);
		return NULL;
	}
	pthread_mutex_unlock(&lz->lock);
	/* every vCPU out of KVM_RUN: one waiting on the bad page takes the kick's EINTR */
	lz->g->ops->pause(lz->g->ctx);
	snprintf(line, sizeof(line), "lazy restore failed, the guest stopped: %s", lz->why);
	if (lz->o.event)
		lz->o.event(lz->o.ctx, MIG_LAZY_FAILED, line);
	pthread_mutex_lock(&lz->lock);
	lz->paused = true;
	lz->st.failed = true;
	pthread_cond_broadcast(&lz->cond);
	pthread_mutex_unlock(&lz->lock);
	return NULL;
}

/* The working-set file at path for this chain, into lz->ws_in; a file unusable is noted, never an error. */
static void ws_load(struct mig_lazy *lz, const char *path)
{
	struct ws_header h;
	struct stat sb;
	uint64_t max = 0, i, size;
	uint8_t *all = NULL, sha[SNAP_ID];
	unsigned int j;
	/* never held by a FIFO or a device: non-blocking, and a regular file only */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
	const char *why = NULL;

	if (fd < 0) {
		if (errno != ENOENT)
			snprintf(lz->st.ws_note, sizeof(lz->st.ws_note), "%.100s: %s", path, strerror(errno));
		return;
	}
	for (i = 0; i < lz->nr_regions; i++)
		max += lz->r[i].npages;
	if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode)) {
		why = "not a regular file";
	} else if ((uint64_t)sb.st_size < sizeof(h) + SNAP_ID) {
		why = "too short";
	} else {
		size = (uint64_t)sb.st_size;
		if ((size - sizeof(h) - SNAP_ID) % 8 || (size - sizeof(h) - SNAP_ID) / 8 > max)
			why = "not a working-set file of this guest's size";
		else if (!(all = malloc(size)))
			why = "out of memory";
		else if (pread(fd, all, size, 0) != (ssize_t)size)
			why = "cannot be read";
		else {
			memcpy(&h, all, sizeof(h));
			snap_sha256(all, size - SNAP_ID, sha);
			if (memcmp(h.magic, WS_MAGIC, 8) || h.version != WS_VERSION)
				why = "not a working-set file of this version";
			else if (memcmp(sha, all + size - SNAP_ID, SNAP_ID) || h.count != (size - sizeof(h) - SNAP_ID) / 8)
				why = "damaged (its checksum)";
		}
		if (!why) {
			for (j = 0; j < lz->n && memcmp(lz->files[j]->id, h.chain, SNAP_ID); j++)
				;
			if (j == lz->n)
				why = "recorded for another chain";
		}
		if (!why) {
			uint64_t *e = (uint64_t *)(all + sizeof(h));

			for (i = 0; i < h.count && !why; i++)
				if ((e[i] >> 48) >= lz->nr_regions || (e[i] & ((1ull << 48) - 1)) >= lz->r[e[i] >> 48].npages)
					why = "lists a page outside the guest";
			if (!why && h.count && (lz->ws_in = malloc(h.count * 8))) {
				memcpy(lz->ws_in, e, h.count * 8);
				lz->st.ws_pages = h.count;
			}
		}
	}
	if (why)
		snprintf(lz->st.ws_note, sizeof(lz->st.ws_note), "%.100s: %s, not used", path, why);
	free(all);
	close(fd);
}

static int cmp_hva(const void *a, const void *b, void *arg)
{
	const struct lregion *r = arg;
	uintptr_t x = (uintptr_t)r[*(const uint32_t *)a].hva, y = (uintptr_t)r[*(const uint32_t *)b].hva;

	return x < y ? -1 : x > y;
}

void mig_lazy_free(struct mig_lazy *lz)
{
	unsigned int i;
	uint64_t one = 1;

	if (!lz)
		return;
	__atomic_store_n(&lz->stopping, 1, __ATOMIC_RELEASE);
	busy_del(lz);
	if (lz->stop_fd >= 0 && write(lz->stop_fd, &one, sizeof(one)) < 0)
		abort(); /* an eventfd takes a write below its limit */
	pthread_mutex_lock(&lz->lock);
	pthread_cond_broadcast(&lz->cond);
	pthread_mutex_unlock(&lz->lock);
	for (i = 0; i < lz->nr_servers; i++)
		pthread_join(lz->server[i], NULL);
	if (lz->filler_started)
		pthread_join(lz->filler, NULL);
	if (lz->uffd >= 0)
		close(lz->uffd);
	if (lz->stop_fd >= 0)
		close(lz->stop_fd);
	for (i = 0; lz->files && i < lz->n; i++)
		snap_file_close(lz->files[i]);
	free(lz->files);
	for (i = 0; lz->r && i < lz->nr_regions; i++) {
		free(lz->r[i].placed);
		free(lz->r[i].bad);
	}
	free(lz->r);
	free(lz->by_hva);
	free(lz->ws);
	free(lz->ws_in);
	pthread_mutex_destroy(&lz->lock);
	pthread_mutex_destroy(&lz->rd_lock);
	pthread_cond_destroy(&lz->cond);
	free(lz);
}

int mig_lazy_start(const struct mig_guest *g, struct snap_file **files, unsigned int n,
		   const struct mig_lazy_opts *o, struct mig_lazy **ret_lz, char *err, size_t len)
{
	struct mig_lazy *lz;
	uint32_t r;
	unsigned int j;
	int ret;

	*ret_lz = NULL;
	if (!g->ops->pause)
		return mig_errf(err, len, -EINVAL, "a lazy restore needs the guest's pause (it stops the guest on a bad page)");
	ret = mig_snap_check_guest(g, files, n, err, len);
	if (ret < 0)
		return ret;
	if (o && o->ws_write && strlen(o->ws_write) >= SNAP_PATH_MAX - 1)
		return mig_errf(err, len, -ENAMETOOLONG, "the working-set file's path is too long");
	lz = calloc(1, sizeof(*lz));
	if (!lz)
		return mig_errf(err, len, -ENOMEM, "out of memory");
	lz->t0 = o && o->t0_ms > 0 ? o->t0_ms : mig_clock_msf();
	lz->g = g;
	lz->uffd = lz->stop_fd = -1;
	if (o)
		lz->o = *o;
	if (lz->o.ws_write)
		snprintf(lz->ws_write, sizeof(lz->ws_write), "%s", lz->o.ws_write);
	{
		pthread_condattr_t ca;

		/* mig_lazy_wait()'s deadline is on the monotonic clock */
		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_mutex_init(&lz->lock, NULL);
		pthread_mutex_init(&lz->rd_lock, NULL);
		pthread_cond_init(&lz->cond, &ca);
		pthread_condattr_destroy(&ca);
	}
	lz->nr_regions = g->nr_regions;
	lz->r = calloc(g->nr_regions, sizeof(*lz->r));
	lz->by_hva = calloc(g->nr_regions, sizeof(*lz->by_hva));
	if (!lz->r || !lz->by_hva) {
		ret = mig_errf(err, len, -ENOMEM, "out of memory");
		goto fail;
	}
	for (r = 0; r < g->nr_regions; r++) {
		struct lregion *lr = &lz->r[r];

		lr->hva = g->regions[r].hva;
		lr->size = g->regions[r].size;
		lr->npages = lr->size / SNAP_PAGE;
		lr->placed = calloc((lr->npages + 63) / 64, 8);
		lr->bad = calloc((lr->npages + 63) / 64, 8);
		if (!lr->placed || !lr->bad) {
			ret = mig_errf(err, len, -ENOMEM, "out of memory");
			goto fail;
		}
		lz->by_hva[r] = r;
	}
	qsort_r(lz->by_hva, lz->nr_regions, sizeof(*lz->by_hva), cmp_hva, lz->r);
	lz->files = files;
	lz->n = n;
	busy_add(lz);
	if (lz->o.ws_read)
		ws_load(lz, lz->o.ws_read);
	ret = mig_uffd_open(err, len);
	if (ret < 0)
		goto fail;
	lz->uffd = ret;
	lz->stop_fd = eventfd(0, EFD_CLOEXEC);
	if (lz->stop_fd < 0) {
		ret = mig_errf(err, len, -errno, "eventfd: %s", strerror(errno));
		goto fail;
	}
	/* registered first, each region checked to take both copies and zero pages: nothing is emptied before */
	for (r = 0; r < lz->nr_regions; r++) {
		struct lregion *lr = &lz->r[r];

		ret = mig_uffd_register(lz->uffd, lr->hva, lr->size, r, g->regions[r].gpa, err, len);
		if (ret < 0)
			goto fail;
	}
	for (r = 0; r < lz->nr_regions; r++) {
		struct lregion *lr = &lz->r[r];

		/* whatever the VMM put there goes (shared memory's pages too): every page missing */
		if (madvise(lr->hva, lr->size, MADV_REMOVE) < 0 && madvise(lr->hva, lr->size, MADV_DONTNEED) < 0) {
			ret = mig_errf(err, len, -errno, "region %u (gpa 0x%" PRIx64 "): emptying it: %s", r,
				       g->regions[r].gpa, strerror(errno));
			goto fail;
		}
	}
	/* the server first: a device's load may read guest memory */
	for (j = 0; j < SERVERS; j++) {
		if ((ret = pthread_create(&lz->server[j], NULL, server_main, lz)) != 0) {
			ret = mig_errf(err, len, -ret, "the page server's thread: %s", strerror(ret));
			goto fail;
		}
		lz->nr_servers++;
	}
	ret = mig_snap_load_states(g, files[n - 1], err, len);
	if (ret < 0)
		goto fail;
	if ((ret = pthread_create(&lz->filler, NULL, filler_main, lz)) != 0) {
		ret = mig_errf(err, len, -ret, "the fill thread: %s", strerror(ret));
		goto fail;
	}
	lz->filler_started = true;
	pthread_mutex_lock(&lz->lock);
	lz->st.first_ms = mig_clock_msf() - lz->t0;
	pthread_mutex_unlock(&lz->lock);
	*ret_lz = lz;
	return 0;
fail:
	lz->files = NULL; /* still the caller's */
	mig_lazy_free(lz);
	return ret;
}

int mig_lazy_wait(struct mig_lazy *lz, int64_t timeout_ms, char *err, size_t len)
{
	struct timespec until;
	int ret = 0;

	clock_gettime(CLOCK_MONOTONIC, &until);
	if (timeout_ms >= 0) {
		until.tv_sec += timeout_ms / 1000;
		until.tv_nsec += (timeout_ms % 1000) * 1000000;
		if (until.tv_nsec >= 1000000000) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000;
		}
	}
	pthread_mutex_lock(&lz->lock);
	while (!lz->st.resident && !lz->paused && ret == 0) {
		if (timeout_ms < 0)
			pthread_cond_wait(&lz->cond, &lz->lock);
		else
			ret = pthread_cond_timedwait(&lz->cond, &lz->lock, &until);
	}
	if (lz->st.resident)
		ret = 0;
	else if (lz->paused)
		ret = mig_errf(err, len, lz->fail_ret, "%s", lz->why);
	else
		ret = mig_errf(err, len, -ETIMEDOUT, "not resident yet: %" PRIu64 " pages placed by faults so far",
			       lz->st.faults);
	pthread_mutex_unlock(&lz->lock);
	return ret;
}

void mig_lazy_get_stats(struct mig_lazy *lz, struct mig_lazy_stats *st)
{
	pthread_mutex_lock(&lz->lock);
	*st = lz->st;
	pthread_mutex_unlock(&lz->lock);
	mig_hist_pcts(st->hist, st->fault_max_us, &st->fault_p50_us, &st->fault_p99_us);
}
