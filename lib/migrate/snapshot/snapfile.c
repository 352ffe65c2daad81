// SPDX-License-Identifier: MIT
/*
 * Snapshot files: the writer (pages at fixed offsets, the index and
 * header at the end, the trailer last, then fsync, rename, the
 * directory's fsync) and the reader (every table checked before a page is
 * read; each page read checked against its hash).  The layout:
 * snapfile.h and kvmdirty-snapshot(5).
 */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>

#include <openssl/evp.h>

#include "clock.h"
#include "errf.h"
#include "snapfile.h"
#include "worker.h"

#define ROUND_UP(x, a)	(((x) + (a)-1) / (a) * (a))
#define MAX_REGION_SIZE (1ull << 46) /* 64 TiB a region: offsets stay far from overflow */
#define HCHUNK		512	     /* pages copied and hashed, then written, at a time: 2 MiB (a buffer each side) */

ssize_t (*snap_pwrite)(int fd, const void *buf, size_t n, off_t off) = pwrite;

static const uint8_t zero_id[SNAP_ID];

void snap_sha256(const void *p, size_t n, uint8_t out[SNAP_ID])
{
	unsigned int len = SNAP_ID;

	if (EVP_Digest(p, n, out, &len, EVP_sha256(), NULL) != 1)
		abort(); /* SHA-256 is built into every libcrypto: its absence is a broken install */
}

static bool is_zero(const void *p, size_t n)
{
	const uint64_t *w = p;
	size_t i;

	for (i = 0; i < n / 8; i++)
		if (w[i])
			return false;
	return true;
}

static inline bool test_bit(const uint64_t *map, uint64_t i)
{
	return map[i / 64] >> (i % 64) & 1;
}

static inline void set_bit(uint64_t *map, uint64_t i)
{
	map[i / 64] |= 1ull << (i % 64);
}

static inline void clear_bit(uint64_t *map, uint64_t i)
{
	map[i / 64] &= ~(1ull << (i % 64));
}

uint64_t snap_header_len(uint32_t nr_regions, uint32_t nr_vcpus)
{
	return ROUND_UP(sizeof(struct snap_header) + (uint64_t)nr_regions * sizeof(struct snap_region) +
				(uint64_t)nr_vcpus * sizeof(struct mig_vcpu_state) + sizeof(struct mig_vm_state),
			SNAP_PAGE);
}

/* ---- writing ---- */

struct wregion {
	uint64_t gpa, size, npages, data_off;
	uint64_t *held; /* the file lists the page */
	uint64_t *data; /* ... as DATA (else ZERO) */
	uint64_t *hash; /* [npages]: a DATA page's hash */
};

struct snap_writer {
	char path[SNAP_PATH_MAX], tmp[SNAP_PATH_MAX + 32];
	int fd;
	struct snap_header h;
	struct wregion *r;
	struct mig_vcpu_state *vcpus;
	struct mig_vm_state vm;
	void *dev;
	uint64_t zero_hash;
	/*
	 * A put copies HCHUNK pages at a time into a buffer as it hashes
	 * them (mig_page_hash_copy(): each page read from the guest once),
	 * then writes them from there: what the file holds is exactly what
	 * was hashed, whatever the guest writes meanwhile.  Where the host
	 * has a CPU to spare, the copier (a thread of its own) fills one
	 * buffer while the main thread writes the other, so that hashing
	 * costs the write nothing.  (Copying and hashing on the writing
	 * thread costs a third of the write's time; hashing apart from the
	 * copy read each page twice: either made 0.6-0.8 of a plain
	 * write's speed.)  Under cw.lock: job_* and job (set: to do;
	 * cleared by the copier when done).
	 */
	uint8_t *cbuf[2];
	uint64_t hbuf[2][HCHUNK];
	struct mig_worker cw;
	bool no_copier;
	const uint8_t *job_p;
	uint64_t job_n;
	unsigned int job_b;
	bool job;
	unsigned int copier_waits; /* hand-offs where the writer waited over a millisecond for the copier */
	bool copier_late;	   /* ... too many: the writer copies for itself */
};

static void writer_free(struct snap_writer *w)
{
	uint32_t i;

	mig_worker_stop(&w->cw);
	free(w->cbuf[0]);
	free(w->cbuf[1]);
	if (w->fd >= 0)
		close(w->fd);
	for (i = 0; w->r && i < w->h.nr_regions; i++) {
		free(w->r[i].held);
		free(w->r[i].data);
		free(w->r[i].hash);
	}
	free(w->r);
	free(w->vcpus);
	free(w->dev);
	free(w);
}

/* The layout checked, and its header's fixed part. */
static int layout(struct snap_writer *w, const struct snap_layout *l, char *err, size_t len)
{
	struct snap_header *h = &w->h;
	uint64_t off;
	uint32_t i;

	if ((l->kind != SNAP_FULL && l->kind != SNAP_DIFF) || !l->nr_regions || l->nr_regions > SNAP_MAX_REGIONS ||
	    !l->nr_vcpus || l->nr_vcpus > SNAP_MAX_VCPUS || (l->kind == SNAP_FULL) != (l->seq == 0) ||
	    (l->kind == SNAP_DIFF && (!l->parent || !l->base)))
		return mig_errf(err, len, -EINVAL,
				"%s: a snapshot of %u regions and %u vCPUs, kind %u, number %" PRIu64
				": outside the format",
				w->path, l->nr_regions, l->nr_vcpus, l->kind, l->seq);
	memcpy(h->magic, SNAP_MAGIC, sizeof(h->magic));
	h->version = SNAP_VERSION;
	h->page_size = SNAP_PAGE;
	h->kind = l->kind;
	h->nr_regions = l->nr_regions;
	h->nr_vcpus = l->nr_vcpus;
	h->vcpu_state_size = sizeof(struct mig_vcpu_state);
	h->vm_state_size = sizeof(struct mig_vm_state);
	h->seq = l->seq;
	h->header_len = snap_header_len(l->nr_regions, l->nr_vcpus);
	h->data_off = ROUND_UP(h->header_len, SNAP_ALIGN);
	if (l->kind == SNAP_DIFF) {
		memcpy(h->parent, l->parent, SNAP_ID);
		memcpy(h->base, l->base, SNAP_ID);
	}
	w->r = calloc(l->nr_regions, sizeof(*w->r));
	w->vcpus = calloc(l->nr_vcpus, sizeof(*w->vcpus));
	if (!w->r || !w->vcpus)
		return mig_errf(err, len, -ENOMEM, "%s: out of memory", w->path);
	off = h->data_off;
	for (i = 0; i < l->nr_regions; i++) {
		struct wregion *r = &w->r[i];

		if (!l->size[i] || l->size[i] % SNAP_PAGE || l->gpa[i] % SNAP_PAGE || l->size[i] > MAX_REGION_SIZE)
			return mig_errf(err, len, -EINVAL,
					"%s: region %u (gpa 0x%" PRIx64 ", %" PRIu64
					" bytes): not whole pages, or too large",
					w->path, i, l->gpa[i], l->size[i]);
		r->gpa = l->gpa[i];
		r->size = l->size[i];
		r->npages = r->size / SNAP_PAGE;
		r->data_off = off;
		off += ROUND_UP(r->size, SNAP_ALIGN);
		/* calloc'd: the kernel maps pages of them only as they are written */
		r->held = calloc((r->npages + 63) / 64, 8);
		r->data = calloc((r->npages + 63) / 64, 8);
		r->hash = calloc(r->npages, 8);
		if (!r->held || !r->data || !r->hash)
			return mig_errf(err, len, -ENOMEM, "%s: out of memory for region %u's page table", w->path, i);
	}
	h->data_len = off - h->data_off;
	h->index_off = off;
	return 0;
}

int snap_writer_open(const char *path, const struct snap_layout *l, struct snap_writer **ret_w, char *err, size_t len)
{
	struct snap_writer *w = calloc(1, sizeof(*w));
	struct stat st;
	int ret;

	*ret_w = NULL;
	if (!w)
		return mig_errf(err, len, -ENOMEM, "%s: out of memory", path);
	w->fd = -1;
	if (strlen(path) >= sizeof(w->path)) {
		free(w);
		return mig_errf(err, len, -ENAMETOOLONG, "a snapshot path of %zu bytes: at most %d", strlen(path),
				SNAP_PATH_MAX - 1);
	}
	snprintf(w->path, sizeof(w->path), "%s", path);
	/* NAME.tmp.XXXXXX: unique, so a leftover of a killed run never stands in the way */
	snprintf(w->tmp, sizeof(w->tmp), "%s.tmp.XXXXXX", path);
	w->zero_hash = mig_zero_page_hash();
	w->cbuf[0] = aligned_alloc(SNAP_PAGE, HCHUNK * SNAP_PAGE);
	w->cbuf[1] = aligned_alloc(SNAP_PAGE, HCHUNK * SNAP_PAGE);
	ret = w->cbuf[0] && w->cbuf[1] ? layout(w, l, err, len) : mig_errf(err, len, -ENOMEM, "%s: out of memory", path);
	if (ret == 0 && lstat(path, &st) == 0)
		ret = mig_errf(err, len, -EEXIST, "%s: exists already: a snapshot is never written over a file", path);
	if (ret == 0) {
		/* guest memory: the user's alone (mkostemp makes it 0600) */
		w->fd = mkostemp(w->tmp, O_CLOEXEC);
		if (w->fd < 0)
			ret = mig_errf(err, len, -errno, "%s: %s", w->tmp, strerror(errno));
	}
	if (ret < 0) {
		writer_free(w);
		return ret;
	}
	*ret_w = w;
	return 0;
}

static int write_all(struct snap_writer *w, const void *buf, uint64_t n, uint64_t off, char *err, size_t len)
{
	const uint8_t *p = buf;

	while (n) {
		ssize_t k = snap_pwrite(w->fd, p, n > (1u << 30) ? (1u << 30) : n, (off_t)off);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return mig_errf(err, len, k < 0 ? -errno : -EIO, "writing %s at offset %" PRIu64 ": %s", w->tmp,
					off, k < 0 ? strerror(errno) : "nothing written");
		p += k;
		off += (uint64_t)k;
		n -= (uint64_t)k;
	}
	return 0;
}

/* n pages at p into buffer b, and their hashes: each page read once. */
static void copy_hash(struct snap_writer *w, const uint8_t *p, uint64_t n, unsigned int b)
{
	uint64_t i;

	for (i = 0; i < n; i++)
		w->hbuf[b][i] = mig_page_hash_copy(w->cbuf[b] + i * SNAP_PAGE, p + i * SNAP_PAGE);
}

static void *copier_run(void *arg)
{
	struct snap_writer *w = arg;

	pthread_mutex_lock(&w->cw.lock);
	for (;;) {
		if (w->job) {
			const uint8_t *p = w->job_p;
			uint64_t n = w->job_n;
			unsigned int b = w->job_b;

			pthread_mutex_unlock(&w->cw.lock);
			copy_hash(w, p, n, b);
			pthread_mutex_lock(&w->cw.lock);
			w->job = false;
			pthread_cond_broadcast(&w->cw.cond);
		} else if (w->cw.quit) {
			break;
		} else {
			pthread_cond_wait(&w->cw.cond, &w->cw.lock);
		}
	}
	pthread_mutex_unlock(&w->cw.lock);
	return NULL;
}

/* The copier, started the first time a put is long enough to use it; false where there is none. */
static bool copier(struct snap_writer *w)
{
	if (w->cw.running)
		return true;
	if (w->no_copier || sysconf(_SC_NPROCESSORS_ONLN) < 2 || mig_worker_start(&w->cw, copier_run, w) < 0) {
		w->no_copier = true;
		return false;
	}
	return true;
}

static void copy_async(struct snap_writer *w, const uint8_t *p, uint64_t n, unsigned int b)
{
	pthread_mutex_lock(&w->cw.lock);
	w->job_p = p;
	w->job_n = n;
	w->job_b = b;
	w->job = true;
	pthread_cond_broadcast(&w->cw.cond);
	pthread_mutex_unlock(&w->cw.lock);
}

/*
 * Until the copier is done; false once it keeps the writer waiting: where
 * no CPU is free (a guest's vCPUs on all of them), a hand-off costs the
 * writer a wait for the copier's turn on a CPU, and the writer copies for
 * itself from then on, for the rest of the file.
 */
static bool copy_wait(struct snap_writer *w)
{
	uint64_t t0 = 0;
	bool waited = false;

	pthread_mutex_lock(&w->cw.lock);
	while (w->job) {
		if (!waited)
			t0 = mig_clock_ns();
		waited = true;
		pthread_cond_wait(&w->cw.cond, &w->cw.lock);
	}
	pthread_mutex_unlock(&w->cw.lock);
	if (waited) {
		/* a millisecond: several times the copier's work on a chunk, so a wait for a CPU */
		if (mig_clock_ns() - t0 > 1000000 && ++w->copier_waits > 4)
			w->copier_late = true;
	}
	return !w->copier_late;
}

/* count pages of region r at hva, hashed already (hashes[i]): data runs written, zero pages noted. */
static int put_hashed(struct snap_writer *w, struct wregion *r, uint64_t first, uint64_t count, const uint8_t *p,
		      const uint64_t *hashes, uint64_t *bytes, char *err, size_t len)
{
	uint64_t i, run = 0;
	int ret;

	/* data pages gather into runs, each one write; a zero page ends a run and is a hole */
	for (i = 0; i <= count; i++) {
		uint64_t pg = first + i;
		bool zero = false;

		if (i < count)
			/* a page this file already holds as data stays data: its old copy must be overwritten */
			zero = hashes[i] == w->zero_hash && is_zero(p + i * SNAP_PAGE, SNAP_PAGE) &&
			       !test_bit(r->data, pg);
		if ((i == count || zero) && i > run) {
			ret = write_all(w, p + run * SNAP_PAGE, (i - run) * SNAP_PAGE,
					r->data_off + (first + run) * SNAP_PAGE, err, len);
			if (ret < 0)
				return ret;
			*bytes += (i - run) * SNAP_PAGE;
		}
		if (i == count)
			break;
		set_bit(r->held, pg);
		if (zero) {
			run = i + 1;
			continue;
		}
		set_bit(r->data, pg);
		r->hash[pg] = hashes[i];
	}
	return 0;
}

int snap_writer_put(struct snap_writer *w, uint32_t region, uint64_t first, uint64_t count, const void *hva,
		    uint64_t *ret_bytes, char *err, size_t len)
{
	const uint8_t *p = hva;
	uint64_t bytes = 0, c, n, next_n;
	bool async;
	int ret = 0;

	if (ret_bytes)
		*ret_bytes = 0;
	if (region >= w->h.nr_regions || first > w->r[region].npages || count > w->r[region].npages - first)
		return mig_errf(err, len, -EINVAL, "%s: pages %" PRIu64 "+%" PRIu64 " of region %u: outside it",
				w->path, first, count, region);
	async = count > HCHUNK && !w->copier_late && copier(w);
	n = count < HCHUNK ? count : HCHUNK;
	copy_hash(w, p, n, 0);
	for (c = 0; c < count && ret == 0; c += n, n = next_n) {
		unsigned int b = (c / HCHUNK) % 2;

		/* the next chunk copied meanwhile, by the copier (or here, after this one) */
		next_n = count - c - n < HCHUNK ? count - c - n : HCHUNK;
		if (next_n && async)
			copy_async(w, p + (c + n) * SNAP_PAGE, next_n, !b);
		ret = put_hashed(w, &w->r[region], first + c, n, w->cbuf[b], w->hbuf[b], &bytes, err, len);
		if (next_n && async)
			async = copy_wait(w);
		else if (next_n)
			copy_hash(w, p + (c + n) * SNAP_PAGE, next_n, !b);
	}
	if (ret_bytes)
		*ret_bytes = bytes;
	return ret;
}

int snap_writer_zero(struct snap_writer *w, uint32_t region, uint64_t first, uint64_t count, char *err, size_t len)
{
	struct wregion *r;
	uint64_t pg;

	if (region >= w->h.nr_regions || first > w->r[region].npages || count > w->r[region].npages - first)
		return mig_errf(err, len, -EINVAL, "%s: pages %" PRIu64 "+%" PRIu64 " of region %u: outside it",
				w->path, first, count, region);
	r = &w->r[region];
	for (pg = first; pg < first + count; pg++) {
		/* held as data already: the page must read as zero, and a hole it is not */
		if (test_bit(r->data, pg)) {
			static const uint8_t zero[SNAP_PAGE];
			int ret = snap_writer_put(w, region, pg, 1, zero, NULL, err, len);

			if (ret < 0)
				return ret;
			continue;
		}
		set_bit(r->held, pg);
	}
	return 0;
}

void snap_writer_devices(struct snap_writer *w, void *dev, size_t len)
{
	free(w->dev);
	w->dev = dev;
	w->h.dev_len = len;
}

int snap_writer_devices_parts(struct snap_writer *w, void *live, size_t live_len, void *rest, size_t rest_len)
{
	uint8_t *b = malloc(sizeof(uint64_t) + live_len + rest_len);
	uint64_t n = htole64(live_len);

	if (!b) {
		free(live);
		free(rest);
		return -ENOMEM;
	}
	memcpy(b, &n, sizeof(n));
	if (live_len)
		memcpy(b + sizeof(n), live, live_len);
	if (rest_len)
		memcpy(b + sizeof(n) + live_len, rest, rest_len);
	free(live);
	free(rest);
	snap_writer_devices(w, b, sizeof(n) + live_len + rest_len);
	w->h.flags = SNAP_F_DEVICES_LIVE;
	return 0;
}

void snap_writer_vcpus(struct snap_writer *w, const struct mig_vcpu_state *states, const struct mig_vm_state *vm)
{
	memcpy(w->vcpus, states, w->h.nr_vcpus * sizeof(*states));
	w->vm = *vm;
}

/* The runs and hashes of what the file holds, in region and page order; a full lists no zero run. */
static int build_index(struct snap_writer *w, void **ret_buf, uint64_t *ret_len)
{
	uint64_t nruns = 0, ndata = 0, nzero = 0, pass, k;
	struct snap_run *runs = NULL;
	uint64_t *hashes = NULL;
	void *buf;
	uint32_t i;

	/* two passes: count, then fill */
	for (pass = 0; pass < 2; pass++) {
		uint64_t run_i = 0, hash_i = 0;

		for (i = 0; i < w->h.nr_regions; i++) {
			const struct wregion *r = &w->r[i];
			uint64_t pg = 0;

			while (pg < r->npages) {
				bool data;

				if (!(r->held[pg / 64] >> (pg % 64))) {
					pg = (pg | 63) + 1; /* the rest of the word holds nothing */
					continue;
				}
				if (!test_bit(r->held, pg)) {
					pg++;
					continue;
				}
				data = test_bit(r->data, pg);
				for (k = pg + 1; k < r->npages && test_bit(r->held, k) && test_bit(r->data, k) == data;
				     k++)
					;
				if (data || w->h.kind == SNAP_DIFF) {
					if (pass == 1) {
						runs[run_i] =
							(struct snap_run){ i, data ? SNAP_RUN_DATA : SNAP_RUN_ZERO, pg,
									   k - pg, data ? hash_i : 0 };
						if (data)
							memcpy(hashes + hash_i, r->hash + pg, (k - pg) * 8);
					}
					run_i++;
					if (data)
						hash_i += k - pg;
					else if (pass == 0)
						nzero += k - pg;
				}
				pg = k;
			}
		}
		if (pass == 0) {
			nruns = run_i;
			ndata = hash_i;
			buf = malloc(nruns * sizeof(*runs) + ndata * 8 + 1);
			if (!buf)
				return -ENOMEM;
			runs = buf;
			hashes = (uint64_t *)(runs + nruns);
		}
	}
	w->h.nr_runs = nruns;
	w->h.data_pages = ndata;
	w->h.zero_pages = nzero;
	*ret_buf = buf;
	*ret_len = nruns * sizeof(*runs) + ndata * 8;
	return 0;
}

/* The directory that holds path, synced (after a rename into it, or out of it). */
static int sync_dir(const char *path)
{
	char buf[SNAP_PATH_MAX];
	int fd, ret = 0;

	snprintf(buf, sizeof(buf), "%s", path);
	fd = open(dirname(buf), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (fsync(fd) < 0)
		ret = -errno;
	close(fd);
	return ret;
}

/* tmp to path, never over a file there (renameat2's NOREPLACE; link and unlink where a file system lacks it). */
static int rename_new(const char *tmp, const char *path)
{
	if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE) == 0)
		return 0;
	if (errno != EINVAL && errno != ENOSYS)
		return -errno;
	if (link(tmp, path) < 0)
		return -errno;
	unlink(tmp);
	return 0;
}

/* The header and its tables in one buffer, header_len long. */
static void *header_bytes(struct snap_writer *w)
{
	uint8_t *buf = calloc(1, w->h.header_len);
	struct snap_region *reg;
	uint32_t i;

	if (!buf)
		return NULL;
	memcpy(buf, &w->h, sizeof(w->h));
	reg = (struct snap_region *)(buf + sizeof(w->h));
	for (i = 0; i < w->h.nr_regions; i++)
		reg[i] = (struct snap_region){ w->r[i].gpa, w->r[i].size, w->r[i].data_off, 0 };
	memcpy(reg + w->h.nr_regions, w->vcpus, w->h.nr_vcpus * sizeof(*w->vcpus));
	memcpy((uint8_t *)(reg + w->h.nr_regions) + w->h.nr_vcpus * sizeof(*w->vcpus), &w->vm, sizeof(w->vm));
	return buf;
}

static int finish(struct snap_writer *w, uint8_t id[SNAP_ID], struct snap_written *st, char *err, size_t len)
{
	struct snap_trailer t = { 0 };
	struct timespec now;
	void *index = NULL, *hdr = NULL;
	uint64_t ilen;
	int ret;

	ret = build_index(w, &index, &ilen);
	if (ret < 0)
		return mig_errf(err, len, ret, "%s: out of memory for the index", w->path);
	clock_gettime(CLOCK_REALTIME, &now);
	w->h.time_ns = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
	w->h.index_len = ilen;
	snap_sha256(index, ilen, w->h.index_sha);
	snap_sha256(w->dev, w->h.dev_len, w->h.dev_sha);
	hdr = header_bytes(w);
	if (!hdr)
		ret = mig_errf(err, len, -ENOMEM, "%s: out of memory for the header", w->path);
	if (ret == 0)
		ret = write_all(w, index, ilen, w->h.index_off, err, len);
	if (ret == 0 && w->h.dev_len)
		ret = write_all(w, w->dev, w->h.dev_len, w->h.index_off + ilen, err, len);
	if (ret == 0)
		ret = write_all(w, hdr, w->h.header_len, 0, err, len);
	if (ret == 0) {
		memcpy(t.magic, SNAP_TRAILER_MAGIC, sizeof(t.magic));
		t.version = SNAP_VERSION;
		t.header_len = w->h.header_len;
		t.index_off = w->h.index_off;
		t.index_len = ilen;
		t.file_len = w->h.index_off + ilen + w->h.dev_len + sizeof(t);
		snap_sha256(hdr, w->h.header_len, t.id);
		snap_sha256(&t, offsetof(struct snap_trailer, sha), t.sha);
		/* last: until it is there, the file is not a snapshot */
		ret = write_all(w, &t, sizeof(t), w->h.index_off + ilen + w->h.dev_len, err, len);
	}
	free(index);
	free(hdr);
	if (ret < 0)
		return ret;
	memcpy(id, t.id, SNAP_ID);
	if (st)
		*st = (struct snap_written){ w->h.data_pages, w->h.zero_pages, t.file_len,
					     w->h.header_len + ilen + w->h.dev_len + sizeof(t) };
	return 0;
}

int snap_writer_commit(struct snap_writer *w, uint8_t ret_id[SNAP_ID], struct snap_written *ret_stats, char *err,
		       size_t len)
{
	int ret = finish(w, ret_id, ret_stats, err, len);

	if (ret == 0 && fsync(w->fd) < 0)
		ret = mig_errf(err, len, -errno, "syncing %s: %s", w->tmp, strerror(errno));
	if (ret == 0) {
		ret = rename_new(w->tmp, w->path);
		if (ret < 0)
			mig_errf(err, len, ret, "renaming %s to %s: %s", w->tmp, w->path, strerror(-ret));
	}
	if (ret < 0) {
		snap_writer_abandon(w);
		return ret;
	}
	ret = sync_dir(w->path);
	if (ret < 0) {
		/* not known to last: taken back, so the next file of the chain takes its place */
		mig_errf(err, len, ret, "syncing the directory of %s: %s", w->path, strerror(-ret));
		unlink(w->path);
		sync_dir(w->path);
	}
	writer_free(w);
	return ret;
}

void snap_writer_abandon(struct snap_writer *w)
{
	if (!w)
		return;
	if (w->fd >= 0)
		unlink(w->tmp);
	writer_free(w);
}

/* ---- reading ---- */

void snap_file_close(struct snap_file *f)
{
	if (!f)
		return;
	if (f->fd >= 0)
		close(f->fd);
	free(f->regions);
	free(f->runs);
	free(f->dev);
	free(f);
}

static int read_all(const struct snap_file *f, void *buf, uint64_t n, uint64_t off, const char *what, char *err,
		    size_t len)
{
	uint8_t *p = buf;

	while (n) {
		ssize_t k = pread(f->fd, p, n > (1u << 30) ? (1u << 30) : n, (off_t)off);

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return mig_errf(err, len, k < 0 ? -errno : -EPROTO, "%s: reading %s at offset %" PRIu64 ": %s",
					f->path, what, off, k < 0 ? strerror(errno) : "the file ends there");
		p += k;
		off += (uint64_t)k;
		n -= (uint64_t)k;
	}
	return 0;
}

#define BAD(...) mig_errf(err, len, -EPROTO, __VA_ARGS__)

static int read_devices(struct snap_file *f, char *err, size_t len);

/* The trailer: present, whole, its own checksum, the file's length. */
static int check_trailer(struct snap_file *f, struct snap_trailer *t, char *err, size_t len)
{
	uint8_t sha[SNAP_ID];
	int ret = read_all(f, t, sizeof(*t), f->size - sizeof(*t), "the trailer", err, len);

	if (ret < 0)
		return ret;
	if (memcmp(t->magic, SNAP_TRAILER_MAGIC, sizeof(t->magic)))
		return BAD("%s: no trailer at its end: cut short, or never finished", f->path);
	snap_sha256(t, offsetof(struct snap_trailer, sha), sha);
	if (memcmp(sha, t->sha, SNAP_ID))
		return BAD("%s: trailer damaged (its checksum does not match)", f->path);
	if (t->version == 1)
		return BAD("%s: snapshot version 1 (a vCPU's registers, XSAVE and TSC only: no XCR0, LAPIC, events or "
			   "MSRs) is no longer read; this reads version %d", f->path, SNAP_VERSION);
	if (t->version != SNAP_VERSION)
		return BAD("%s: trailer version %u, this reads %d", f->path, t->version, SNAP_VERSION);
	if (t->reserved0 || !is_zero(t->reserved, sizeof(t->reserved)))
		return BAD("%s: trailer: a reserved field set", f->path);
	if (t->file_len != f->size)
		return BAD("%s: %" PRIu64 " bytes long, its trailer says %" PRIu64 ": cut or extended", f->path,
			   f->size, t->file_len);
	if (t->header_len < sizeof(struct snap_header) ||
	    t->header_len > snap_header_len(SNAP_MAX_REGIONS, SNAP_MAX_VCPUS) || t->header_len > f->size - sizeof(*t))
		return BAD("%s: trailer: a header of %" PRIu64 " bytes does not fit", f->path, t->header_len);
	return 0;
}

static int check_regions(struct snap_file *f, uint64_t *ret_pages, char *err, size_t len)
{
	const struct snap_header *h = &f->h;
	uint64_t off = h->data_off, pages = 0;
	uint32_t i;

	for (i = 0; i < h->nr_regions; i++) {
		const struct snap_region *r = &f->regions[i];

		if (!r->size || r->size % SNAP_PAGE || r->gpa % SNAP_PAGE || r->size > MAX_REGION_SIZE ||
		    r->gpa > UINT64_MAX - r->size || r->reserved)
			return BAD("%s: header: region %u (gpa 0x%" PRIx64 ", %" PRIu64 " bytes): not whole pages",
				   f->path, i, r->gpa, r->size);
		if (r->data_off != off)
			return BAD("%s: header: region %u's pages at offset %" PRIu64
				   ", the layout puts them at %" PRIu64,
				   f->path, i, r->data_off, off);
		off += ROUND_UP(r->size, SNAP_ALIGN);
		pages += r->size / SNAP_PAGE;
	}
	*ret_pages = pages;
	if (h->data_len != off - h->data_off || h->index_off != off)
		return BAD("%s: header: the page area (%" PRIu64 " bytes, index at %" PRIu64 ") does not add up to its "
			   "regions (%" PRIu64 ")",
			   f->path, h->data_len, h->index_off, off - h->data_off);
	return 0;
}

/* The header's fields, against the trailer and each other. */
static int check_header(struct snap_file *f, const struct snap_trailer *t, char *err, size_t len)
{
	const struct snap_header *h = &f->h;
	uint64_t pages = 0;
	uint32_t i;

	if (h->page_size != SNAP_PAGE || (h->flags & ~SNAP_F_DEVICES_LIVE) ||
	    ((h->flags & SNAP_F_DEVICES_LIVE) && h->dev_len < sizeof(uint64_t)))
		return BAD("%s: header: page size %u, flags 0x%x or a reserved field set", f->path, h->page_size,
			   h->flags);
	if (h->kind != SNAP_FULL && h->kind != SNAP_DIFF)
		return BAD("%s: header: kind %u, neither full (1) nor diff (2)", f->path, h->kind);
	if (!h->nr_regions || h->nr_regions > SNAP_MAX_REGIONS || !h->nr_vcpus || h->nr_vcpus > SNAP_MAX_VCPUS ||
	    h->vcpu_state_size != sizeof(struct mig_vcpu_state) || h->vm_state_size != sizeof(struct mig_vm_state))
		return BAD("%s: header: %u regions, %u vCPUs of %u bytes, a VM state of %u: outside the format", f->path,
			   h->nr_regions, h->nr_vcpus, h->vcpu_state_size, h->vm_state_size);
	if (h->header_len != snap_header_len(h->nr_regions, h->nr_vcpus) || h->header_len != t->header_len ||
	    h->data_off != ROUND_UP(h->header_len, SNAP_ALIGN))
		return BAD("%s: header: length %" PRIu64 " or page area at %" PRIu64 ": not what %u regions and %u "
			   "vCPUs make",
			   f->path, h->header_len, h->data_off, h->nr_regions, h->nr_vcpus);
	if (h->kind == SNAP_FULL
		    ? h->seq || memcmp(h->parent, zero_id, SNAP_ID) || memcmp(h->base, zero_id, SNAP_ID)
		    : !h->seq || !memcmp(h->parent, zero_id, SNAP_ID) || !memcmp(h->base, zero_id, SNAP_ID))
		return BAD("%s: header: a %s numbered %" PRIu64 " %s a parent", f->path,
			   h->kind == SNAP_FULL ? "full snapshot" : "diff", h->seq,
			   h->kind == SNAP_FULL ? "with" : "without");
	if (check_regions(f, &pages, err, len) < 0)
		return -EPROTO;
	/* a run and a hash at most a page: an index larger than the guest's pages allow is refused unread */
	if (h->index_off != t->index_off || h->index_len != t->index_len || h->nr_runs > pages ||
	    h->data_pages > pages || h->zero_pages > pages || h->nr_runs > h->index_len / 32 ||
	    h->data_pages > h->index_len / 8 || h->nr_runs * 32 + h->data_pages * 8 != h->index_len ||
	    h->dev_len > MIG_DEVICES_MAX + (h->flags & SNAP_F_DEVICES_LIVE ? sizeof(uint64_t) : 0) || h->index_off + h->index_len + h->dev_len + sizeof(*t) != f->size)
		return BAD("%s: header: an index of %" PRIu64 " runs and %" PRIu64 " hashes at %" PRIu64
			   " (and %" PRIu64 " bytes of device state) does not fit the file",
			   f->path, h->nr_runs, h->data_pages, h->index_off, h->dev_len);
	for (i = 0; i < h->nr_vcpus; i++) {
		char what[64], why[256];

		snprintf(what, sizeof(what), "vCPU %u's state", i);
		if (mig_vcpu_state_check(&f->vcpus[i], what, why, sizeof(why)) < 0)
			return BAD("%s: header: %s", f->path, why);
	}
	{
		char why[256];

		if (mig_vm_state_check(f->vm, "the VM's state", why, sizeof(why)) < 0)
			return BAD("%s: header: %s", f->path, why);
	}
	return 0;
}

/* Where the index's walk is: runs seen, hashes and zero pages they account for, the run before. */
struct index_walk {
	uint64_t i, hash_i, zero;
	struct snap_run prev;
};

/* One run of the index: within its region, after the one before, its hashes where the counts say. */
static int check_run(const struct snap_file *f, struct index_walk *w, const struct snap_run *r, char *err, size_t len)
{
	const struct snap_header *h = &f->h;
	const struct snap_run *p = w->i ? &w->prev : NULL;

	if (r->region >= h->nr_regions || !r->count || r->first > f->regions[r->region].size / SNAP_PAGE ||
	    r->count > f->regions[r->region].size / SNAP_PAGE - r->first)
		return BAD("%s: index: run %" PRIu64 " (region %u, pages %" PRIu64 "+%" PRIu64 ") outside its region",
			   f->path, w->i, r->region, r->first, r->count);
	if (p && (r->region < p->region || (r->region == p->region && r->first < p->first + p->count)))
		return BAD("%s: index: run %" PRIu64 " out of order or overlapping the one before", f->path, w->i);
	if (r->kind == SNAP_RUN_DATA && r->hash_first == w->hash_i)
		w->hash_i += r->count;
	else if (r->kind == SNAP_RUN_ZERO && h->kind == SNAP_DIFF && !r->hash_first)
		w->zero += r->count;
	else
		return BAD("%s: index: run %" PRIu64 " of kind %u, its hashes at %" PRIu64 ": not in the format",
			   f->path, w->i, r->kind, r->hash_first);
	w->prev = *r;
	w->i++;
	return 0;
}

/*
 * The index read 1 MiB at a time: its SHA-256 against the header's and
 * every run checked as it goes, before anything the size of the index is
 * allocated.  An index that does not add up (a damaged length, a sparse
 * run of zeroes, runs outside the regions) costs time, not memory: what
 * is allocated after is bounded by an index whose runs are all in order,
 * 8 bytes a page the file holds as data and 32 a run.
 */
static int index_check(struct snap_file *f, char *err, size_t len)
{
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	uint64_t off = 0, n, runs_len = f->h.nr_runs * sizeof(struct snap_run), k;
	struct index_walk w = { 0 };
	uint8_t sha[SNAP_ID];
	uint8_t *buf = malloc(1u << 20);
	int ret = 0;

	if (!ctx || !buf || EVP_DigestInit_ex(ctx, EVP_sha256(), NULL) != 1)
		ret = mig_errf(err, len, -ENOMEM, "%s: out of memory", f->path);
	for (; ret == 0 && off < f->h.index_len; off += n) {
		n = f->h.index_len - off < (1u << 20) ? f->h.index_len - off : (1u << 20);
		ret = read_all(f, buf, n, f->h.index_off + off, "the index", err, len);
		if (ret == 0 && EVP_DigestUpdate(ctx, buf, n) != 1)
			ret = mig_errf(err, len, -ENOMEM, "%s: hashing the index", f->path);
		/* 1 MiB is whole runs: the runs of this piece, if any */
		for (k = 0; ret == 0 && off + k < runs_len && k < n; k += sizeof(struct snap_run))
			ret = check_run(f, &w, (const struct snap_run *)(buf + k), err, len);
	}
	if (ret == 0 && (EVP_DigestFinal_ex(ctx, sha, NULL) != 1 || memcmp(sha, f->h.index_sha, SNAP_ID)))
		ret = BAD("%s: index damaged (its hash is not the header's)", f->path);
	if (ret == 0 && (w.hash_i != f->h.data_pages || w.zero != f->h.zero_pages))
		ret = BAD("%s: index: %" PRIu64 " data and %" PRIu64 " zero pages, the header says %" PRIu64
			  " and %" PRIu64,
			  f->path, w.hash_i, w.zero, f->h.data_pages, f->h.zero_pages);
	EVP_MD_CTX_free(ctx);
	free(buf);
	return ret;
}

/* The index as read into memory: the same bytes as checked (the file may have changed since). */
static int index_same(struct snap_file *f, char *err, size_t len)
{
	uint8_t sha[SNAP_ID];

	snap_sha256(f->runs, f->h.index_len, sha);
	if (memcmp(sha, f->h.index_sha, SNAP_ID))
		return BAD("%s: index damaged (its hash is not the header's)", f->path);
	return 0;
}

/* The run holding file offset off (the runs are in file order: regions' areas ascend), or NULL. */
static const struct snap_run *run_at(const struct snap_file *f, uint64_t off)
{
	uint64_t lo = 0, hi = f->h.nr_runs;

	while (lo < hi) {
		uint64_t mid = lo + (hi - lo) / 2;
		const struct snap_run *r = &f->runs[mid];
		uint64_t start = f->regions[r->region].data_off + r->first * SNAP_PAGE;

		if (off < start)
			hi = mid;
		else if (off >= start + r->count * SNAP_PAGE)
			lo = mid + 1;
		else
			return r;
	}
	return NULL;
}

/* The file offset where the first run starting after off starts, or end. */
static uint64_t next_run_start(const struct snap_file *f, uint64_t off, uint64_t end)
{
	uint64_t lo = 0, hi = f->h.nr_runs;

	while (lo < hi) {
		uint64_t mid = lo + (hi - lo) / 2;
		const struct snap_run *r = &f->runs[mid];

		if (f->regions[r->region].data_off + r->first * SNAP_PAGE <= off)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo == f->h.nr_runs)
		return end;
	off = f->regions[f->runs[lo].region].data_off + f->runs[lo].first * SNAP_PAGE;
	return off < end ? off : end;
}

/*
 * Bytes [off, end) of the file, which no DATA run lists, through buf (64
 * KiB): 0 if all zero, 1 with the offset of the first that is not, or
 * -errno.
 */
static int zero_gap(const struct snap_file *f, uint8_t *buf, uint64_t off, uint64_t end, uint64_t *ret_bad, char *err,
		    size_t len)
{
	uint64_t n, i;
	int ret;

	for (; off < end; off += n) {
		n = end - off < (64u << 10) ? end - off : (64u << 10);
		ret = read_all(f, buf, n, off, "the page area", err, len);
		if (ret < 0)
			return ret;
		for (i = 0; i < n; i++)
			if (buf[i]) {
				*ret_bad = off + i;
				return 1;
			}
	}
	return 0;
}

/*
 * Data in the page area only where a DATA run lists it: bytes elsewhere
 * are never read, so a change there would go unseen.  Where the file
 * system reports data there (in blocks larger than a page, as tmpfs with
 * huge pages and ZFS do; or everywhere, where it keeps no holes, or in a
 * copy that filled them), those bytes are read and must be zero: a file
 * without holes costs a read of its page area.
 */
static int check_holes(struct snap_file *f, char *err, size_t len)
{
	uint64_t end = f->h.index_off, pos = f->h.header_len, bad, next;
	uint8_t *buf = malloc(64u << 10);
	int ret = 0;

	if (!buf)
		return mig_errf(err, len, -ENOMEM, "%s: out of memory", f->path);
	while (ret == 0 && pos < end) {
		off_t a = lseek(f->fd, (off_t)pos, SEEK_DATA), b;

		if (a < 0 && errno == ENXIO)
			break; /* no data past pos */
		b = a < 0 ? -1 : lseek(f->fd, a, SEEK_HOLE);
		if (a < 0 || b < 0) {
			ret = mig_errf(err, len, -errno, "%s: finding its holes: %s", f->path, strerror(errno));
			break;
		}
		if ((uint64_t)a >= end)
			break;
		pos = (uint64_t)a;
		while (ret == 0 && pos < (uint64_t)b && pos < end) {
			const struct snap_run *r = run_at(f, pos);

			if (r && r->kind == SNAP_RUN_DATA) {
				pos = f->regions[r->region].data_off + (r->first + r->count) * SNAP_PAGE;
				continue;
			}
			next = next_run_start(f, pos, (uint64_t)b < end ? (uint64_t)b : end);
			ret = zero_gap(f, buf, pos, next, &bad, err, len);
			if (ret > 0)
				ret = BAD("%s: page area: data at offset %" PRIu64 ", where the index lists no page",
					  f->path, bad);
			pos = next;
		}
	}
	free(buf);
	return ret;
}

static int file_check(struct snap_file *f, char *err, size_t len)
{
	struct snap_trailer t;
	uint8_t *hdr = NULL;
	uint8_t sha[SNAP_ID];
	int ret;

	ret = read_all(f, &f->h, sizeof(f->h), 0, "the header", err, len);
	if (ret < 0)
		return ret;
	if (memcmp(f->h.magic, SNAP_MAGIC, sizeof(f->h.magic)))
		return BAD("%s: not a snapshot file (no %s at its start)", f->path, SNAP_MAGIC);
	if (f->h.version == 1)
		return BAD("%s: snapshot version 1 (a vCPU's registers, XSAVE and TSC only: no XCR0, LAPIC, events or "
			   "MSRs) is no longer read; this reads version %d", f->path, SNAP_VERSION);
	if (f->h.version != SNAP_VERSION)
		return BAD("%s: snapshot version %u, this reads version %d", f->path, f->h.version, SNAP_VERSION);
	ret = check_trailer(f, &t, err, len);
	if (ret < 0)
		return ret;
	hdr = malloc(t.header_len);
	if (!hdr)
		return mig_errf(err, len, -ENOMEM, "%s: out of memory", f->path);
	ret = read_all(f, hdr, t.header_len, 0, "the header", err, len);
	if (ret == 0) {
		snap_sha256(hdr, t.header_len, sha);
		if (memcmp(sha, t.id, SNAP_ID))
			ret = BAD("%s: header damaged (its hash is not the trailer's)", f->path);
	}
	if (ret == 0) {
		memcpy(&f->h, hdr, sizeof(f->h));
		memcpy(f->id, t.id, SNAP_ID);
		if (f->h.nr_regions > SNAP_MAX_REGIONS || f->h.nr_vcpus > SNAP_MAX_VCPUS ||
		    snap_header_len(f->h.nr_regions, f->h.nr_vcpus) != t.header_len)
			ret = BAD("%s: header: %u regions and %u vCPUs do not fit its %" PRIu64 " bytes", f->path,
				  f->h.nr_regions, f->h.nr_vcpus, t.header_len);
	}
	if (ret == 0) {
		/* the tables stay in one block: regions, then vCPUs */
		f->regions = (struct snap_region *)hdr;
		memmove(hdr, hdr + sizeof(f->h), t.header_len - sizeof(f->h));
		f->vcpus = (struct mig_vcpu_state *)(f->regions + f->h.nr_regions);
		f->vm = (struct mig_vm_state *)(f->vcpus + f->h.nr_vcpus);
		hdr = NULL;
		ret = check_header(f, &t, err, len);
	}
	free(hdr);
	if (ret < 0)
		return ret;
	/* the index checked first, read in pieces (index_check()); then read whole */
	ret = index_check(f, err, len);
	if (ret < 0)
		return ret;
	f->runs = malloc(f->h.index_len + 1);
	if (!f->runs)
		return mig_errf(err, len, -ENOMEM, "%s: out of memory for an index of %" PRIu64 " bytes", f->path,
				f->h.index_len);
	f->hashes = (uint64_t *)(f->runs + f->h.nr_runs);
	ret = read_all(f, f->runs, f->h.index_len, f->h.index_off, "the index", err, len);
	if (ret == 0)
		ret = index_same(f, err, len);
	if (ret == 0)
		ret = check_holes(f, err, len);
	if (ret == 0)
		ret = read_devices(f, err, len);
	return ret;
}

/* The devices' state after the index, read whole and checked against its hash. */
static int read_devices(struct snap_file *f, char *err, size_t len)
{
	uint8_t sha[SNAP_ID];
	int ret;

	if (!f->h.dev_len)
		return 0;
	f->dev = malloc(f->h.dev_len);
	if (!f->dev)
		return mig_errf(err, len, -ENOMEM, "%s: out of memory for %" PRIu64 " bytes of device state", f->path,
				f->h.dev_len);
	ret = read_all(f, f->dev, f->h.dev_len, f->h.index_off + f->h.index_len, "the devices' state", err, len);
	if (ret < 0)
		return ret;
	snap_sha256(f->dev, f->h.dev_len, sha);
	if (memcmp(sha, f->h.dev_sha, SNAP_ID))
		return BAD("%s: the devices' state (%" PRIu64 " bytes) damaged (not its hash)", f->path, f->h.dev_len);
	f->dev_rest = f->dev;
	f->dev_rest_len = f->h.dev_len;
	if (f->h.flags & SNAP_F_DEVICES_LIVE) {
		uint64_t n;

		memcpy(&n, f->dev, sizeof(n));
		n = le64toh(n);
		if (n > f->h.dev_len - sizeof(n))
			return BAD("%s: the devices' state: a first part of %" PRIu64 " bytes in %" PRIu64, f->path, n,
				   f->h.dev_len - sizeof(n));
		f->dev_live = (const uint8_t *)f->dev + sizeof(n);
		f->dev_live_len = n;
		f->dev_rest = f->dev_live + n;
		f->dev_rest_len = f->h.dev_len - sizeof(n) - n;
	}
	return 0;
}

int snap_file_open(const char *path, struct snap_file **ret_f, char *err, size_t len)
{
	struct snap_file *f = calloc(1, sizeof(*f));
	struct stat st;
	int ret;

	*ret_f = NULL;
	if (!f)
		return mig_errf(err, len, -ENOMEM, "%s: out of memory", path);
	snprintf(f->path, sizeof(f->path), "%s", path);
	/* O_NONBLOCK: a FIFO is refused as not a regular file, not waited on */
	f->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (f->fd < 0)
		ret = mig_errf(err, len, -errno, "%s: %s", path, strerror(errno));
	else if (fstat(f->fd, &st) < 0)
		ret = mig_errf(err, len, -errno, "%s: %s", path, strerror(errno));
	else if (!S_ISREG(st.st_mode))
		ret = BAD("%s: not a regular file", path);
	else if ((uint64_t)st.st_size < sizeof(struct snap_header) + sizeof(struct snap_trailer))
		ret = BAD("%s: %lld bytes: cut short (no header and trailer)", path, (long long)st.st_size);
	else {
		f->size = (uint64_t)st.st_size;
		ret = file_check(f, err, len);
	}
	if (ret < 0) {
		/* the tables are one block from regions on: freed through it */
		if (!f->regions)
			f->vcpus = NULL;
		snap_file_close(f);
		return ret;
	}
	*ret_f = f;
	return 0;
}

int snap_chain_check(struct snap_file *const *files, unsigned int n, char *err, size_t len)
{
	const struct snap_file *b;
	unsigned int i;
	uint32_t r;

	if (!n)
		return mig_errf(err, len, -EINVAL, "no snapshot file given");
	b = files[0];
	if (b->h.kind != SNAP_FULL)
		return BAD("%s: a diff (number %" PRIu64 " of its chain): a chain starts with its full snapshot",
			   b->path, b->h.seq);
	for (i = 1; i < n; i++) {
		const struct snap_file *f = files[i], *p = files[i - 1];

		if (f->h.kind == SNAP_FULL)
			return BAD("%s: a full snapshot after %s: only a chain's first file is full", f->path, p->path);
		if (memcmp(f->h.base, b->id, SNAP_ID))
			return BAD("%s: of another chain (its full snapshot is not %s)", f->path, b->path);
		if (f->h.seq > i)
			return BAD("%s: number %" PRIu64 " of its chain, after %s (number %u): a gap", f->path,
				   f->h.seq, p->path, i - 1);
		if (f->h.seq < i)
			return BAD("%s: number %" PRIu64
				   " of its chain, after %s (number %u): out of order or repeated",
				   f->path, f->h.seq, p->path, i - 1);
		if (memcmp(f->h.parent, p->id, SNAP_ID))
			return BAD("%s: its parent is not %s (another snapshot of that number)", f->path, p->path);
		if (f->h.nr_regions != b->h.nr_regions || f->h.nr_vcpus != b->h.nr_vcpus)
			return BAD("%s: %u regions and %u vCPUs, %s has %u and %u", f->path, f->h.nr_regions,
				   f->h.nr_vcpus, b->path, b->h.nr_regions, b->h.nr_vcpus);
		for (r = 0; r < f->h.nr_regions; r++)
			if (f->regions[r].gpa != b->regions[r].gpa || f->regions[r].size != b->regions[r].size)
				return BAD("%s: region %u differs from %s's", f->path, r, b->path);
	}
	return 0;
}

/* DATA pages [pg, pg + k) of run r of f, into hva, each checked against its hash. */
/* Pages pg .. pg + k of run r (DATA) read into dst, each checked against its hash. */
static int load_pages(const struct snap_file *f, const struct snap_run *r, uint64_t pg, uint64_t k, uint8_t *dst,
		      char *err, size_t len)
{
	const struct snap_region *reg = &f->regions[r->region];
	uint64_t i;
	int ret = read_all(f, dst, k * SNAP_PAGE, reg->data_off + pg * SNAP_PAGE, "pages", err, len);

	if (ret < 0)
		return ret;
	for (i = pg; i < pg + k; i++)
		if (mig_page_hash(dst + (i - pg) * SNAP_PAGE) != f->hashes[r->hash_first + i - r->first])
			return BAD("%s: region %u page %" PRIu64 " (gpa 0x%" PRIx64 "): damaged (not its hash)",
				   f->path, r->region, i, reg->gpa + i * SNAP_PAGE);
	return 0;
}

int snap_chain_verify(struct snap_file *const *files, unsigned int n, uint64_t *ret_pages, char *err, size_t len)
{
	enum { CHUNK = 256 }; /* pages a read: 1 MiB */
	uint8_t *buf = malloc((size_t)CHUNK * SNAP_PAGE);
	uint64_t pages = 0, i, pg, k;
	unsigned int j;
	int ret = 0;

	if (!buf)
		return mig_errf(err, len, -ENOMEM, "out of memory");
	for (j = 0; j < n && !ret; j++) {
		const struct snap_file *f = files[j];

		for (i = 0; i < f->h.nr_runs && !ret; i++) {
			const struct snap_run *run = &f->runs[i];

			if (run->kind != SNAP_RUN_DATA)
				continue;
			for (pg = run->first; pg < run->first + run->count && !ret; pg += k) {
				k = run->first + run->count - pg < CHUNK ? run->first + run->count - pg : CHUNK;
				ret = load_pages(f, run, pg, k, buf, err, len);
				pages += k;
			}
		}
	}
	free(buf);
	if (ret_pages)
		*ret_pages = pages;
	return ret;
}

int snap_chain_load(struct snap_file *const *files, unsigned int n, void *const *hva, uint64_t *ret_pages, char *err,
		    size_t len)
{
	const struct snap_file *b = files[0];
	uint64_t **done = calloc(b->h.nr_regions, sizeof(*done)), pages = 0, i, pg, k;
	uint32_t r;
	int ret = 0;

	if (!done)
		return mig_errf(err, len, -ENOMEM, "out of memory");
	for (r = 0; r < b->h.nr_regions && !ret; r++)
		if (!(done[r] = calloc((b->regions[r].size / SNAP_PAGE + 63) / 64, 8)))
			ret = mig_errf(err, len, -ENOMEM, "out of memory");
	/* newest first: a page's newest copy is read, older ones never */
	while (n-- && !ret) {
		const struct snap_file *f = files[n];

		for (i = 0; i < f->h.nr_runs && !ret; i++) {
			const struct snap_run *run = &f->runs[i];
			uint64_t *d = done[run->region];

			for (pg = run->first; pg < run->first + run->count && !ret; pg = k) {
				for (k = pg; k < run->first + run->count && !test_bit(d, k); k++)
					set_bit(d, k);
				if (k > pg && run->kind == SNAP_RUN_DATA) {
					ret = load_pages(f, run, pg, k - pg, (uint8_t *)hva[run->region] + pg * SNAP_PAGE,
							 err, len);
					pages += k - pg;
				}
				/* pages a newer file gave: skipped */
				for (; k < run->first + run->count && test_bit(d, k); k++)
					;
			}
		}
	}
	for (r = 0; r < b->h.nr_regions; r++)
		free(done[r]);
	free(done);
	if (ret_pages)
		*ret_pages = pages;
	return ret;
}
