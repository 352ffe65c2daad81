// SPDX-License-Identifier: MIT
/*
 * bench-snapshot: incremental snapshots of a running guest
 * (lib/migrate/snapshot/snapshot.h) against their goals, in one run.
 *
 *   bench-snapshot [-m MIB] [-w MIB] [-r PAGES_PER_SEC] [-M MODE] [-n DIFFS] [-D DIR] [--writer-only]
 *
 * The test guest (2 GiB, 2 vCPUs) writes its 512 MiB working set in order
 * at -r pages/s a vCPU while a full snapshot is taken, then -n diffs, each
 * once the guest has written 64 MiB since its parent's pause.  Then, for
 * each (the files kept until then; the guest still running):
 *
 *   snapshot kind=diff dirty_mib=64.0 pause_ms=... fsync_ms=... write_mibps=...
 *            plainwrite_mibps=... of_plain=... guest_dirty_pps=... alloc_mib=...
 *            expected_mib=... alloc_of_expected=...
 *
 * pause_ms: the vCPUs paused (the last sync, the rest of the pages, the
 * vCPU states), not the fsync and rename that follow (fsync_ms).
 * write_mibps: bytes the snapshot wrote into the page cache over the time
 * it spent writing them (hashing and the tracker's hand-outs included);
 * plainwrite_mibps: plain pwrite(2) calls of the same pages from guest
 * memory, in the file's order, to a new file in the same directory, with
 * the guest still running, fsync timed apart, once the snapshot's file is
 * removed (the plain write reuses its page cache); of_plain their ratio.
 * plainwrite_fresh_mibps, of_plain_fresh: the same while the snapshot's
 * file still holds its page cache, into new page cache as the snapshot
 * wrote (see report(): on this host the two differ by up to tenfold).
 * alloc_mib: the file's blocks; expected_mib: its data pages and tables.
 * guest_dirty_pps: pages the guest wrote a second while the snapshot ran.
 *
 * First, and alone with --writer-only (which needs no KVM), the writer
 * without a guest: write_mibps against plainwrite_mibps for -w MiB of
 * host memory, five rounds in turn.  Then the goals, each met or missed.
 * Without KVM (and without --writer-only): exit 77 after one line.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#include "../examples/common/cli.h"
#include "../examples/common/kvm-host.h"
#include "snapcmd.h"
#include "snapshot.h"
#include "testguest-engine.h"

#define MAX_DIFFS 64

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void sleep_ms(double ms)
{
	struct timespec ts = { (time_t)(ms / 1e3), (long)((ms - (time_t)(ms / 1e3) * 1e3) * 1e6) };

	nanosleep(&ts, NULL);
}

static int cmp_double(const void *a, const void *b);

struct plain {
	double mibps, fsync_ms;
};

/*
 * The pages file lists as DATA, in its order, written with plain pwrite
 * calls (a run each, as the snapshot writes them) from mem[region] to a
 * new file in dir; fsync timed apart.
 */
static int plain_write(const char *dir, const struct snap_file *f, void *const *mem, struct plain *ret)
{
	char path[SNAP_PATH_MAX];
	uint64_t i, off = 0;
	double t0, t;
	int fd;

	snprintf(path, sizeof(path), "%s/plain.%ld", dir, (long)getpid());
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
	if (fd < 0)
		return -errno;
	t0 = now_ms();
	for (i = 0; i < f->h.nr_runs; i++) {
		const struct snap_run *r = &f->runs[i];
		uint64_t n = r->count * SNAP_PAGE;

		if (r->kind != SNAP_RUN_DATA)
			continue;
		if (pwrite(fd, (uint8_t *)mem[r->region] + r->first * SNAP_PAGE, n, (off_t)off) != (ssize_t)n) {
			close(fd);
			unlink(path);
			return -EIO;
		}
		off += n;
	}
	t = now_ms() - t0;
	t0 = now_ms();
	fsync(fd);
	ret->fsync_ms = now_ms() - t0;
	ret->mibps = t > 0 ? off / 1048576.0 / (t / 1e3) : 0;
	close(fd);
	unlink(path);
	return 0;
}

struct figures {
	double pause_ms, fsync_ms, of_plain, alloc_ratio, dirty_mib;
};

/* One snapshot's line: its own figures, the plain write of its pages, its blocks. */
static int report(const char *dir, const struct mig_snap_result *r, void *const *mem, struct figures *fg)
{
	struct snap_file *f;
	struct plain p = { 0 }, reused = { 0 };
	uint64_t alloc = mig_snap_allocated(r->path);
	double expected = r->data_pages * 4096.0 + r->tables_bytes;
	double wr = r->write_ms > 0 ? r->bytes / 1048576.0 / (r->write_ms / 1e3) : 0;
	char err[512];
	int ret = snap_file_open(r->path, &f, err, sizeof(err));

	if (ret < 0) {
		fprintf(stderr, "bench-snapshot: %s\n", err);
		return ret;
	}
	/*
	 * The plain write twice: while the snapshot's file still holds its
	 * page cache (plainwrite_fresh: new page cache, as the snapshot
	 * had), and once that file is gone, into the page cache it freed (the
	 * figure of_plain compares with, as before).  On this nested host a
	 * page of the page cache used for the first time costs several times
	 * one used before (memory the machine below maps on first use), so
	 * whichever write gets the new pages pays: the two orders gave the
	 * same snapshots 0.1-0.6 and 1.5-8.5 of plain.  Both are printed.
	 */
	ret = plain_write(dir, f, mem, &p);
	close(f->fd);
	f->fd = -1;
	unlink(r->path);
	if (ret == 0)
		ret = plain_write(dir, f, mem, &reused);
	snap_file_close(f);
	if (ret < 0) {
		fprintf(stderr, "bench-snapshot: a plain write in %s: %s\n", dir, strerror(-ret));
		return ret;
	}
	*fg = (struct figures){ r->pause_ms, r->fsync_ms, reused.mibps > 0 ? wr / reused.mibps : 0, alloc / expected,
				(r->data_pages + r->zero_pages) * 4096.0 / 1048576 };
	printf("snapshot kind=%s seq=%" PRIu64 " dirty_mib=%.1f passes=%u pause_ms=%.2f pause_pages=%" PRIu64
	       " pause_stop_ms=%.2f pause_sync_ms=%.2f pause_write_ms=%.2f pause_vcpu_ms=%.2f fsync_ms=%.2f "
	       "write_mibps=%.0f "
	       "plainwrite_mibps=%.0f plain_fsync_ms=%.2f of_plain=%.2f plainwrite_fresh_mibps=%.0f of_plain_fresh=%.2f"
	       " guest_dirty_pps=%.0f throttle_permille=%u alloc_mib=%.2f expected_mib=%.2f alloc_of_expected=%.4f\n",
	       r->seq ? "diff" : "full", r->seq, fg->dirty_mib, r->passes, r->pause_ms, r->pause_pages,
	       r->pause_stop_ms, r->pause_sync_ms, r->pause_write_ms, r->pause_vcpu_ms, r->fsync_ms, wr, reused.mibps,
	       reused.fsync_ms, fg->of_plain, p.mibps, p.mibps > 0 ? wr / p.mibps : 0, r->dirty_pps, r->throttle_permille, alloc / 1048576.0, expected / 1048576.0,
	       fg->alloc_ratio);
	fflush(stdout);
	return 0;
}

/*
 * A throwaway write, synced and removed, of n memory ranges to a file in
 * dir, before anything is measured.  Here (a nested guest whose memory the
 * machine below maps lazily) the kernel's first read of a page of user
 * memory and the first use of a page of the page cache each cost several
 * times a later one: whichever side of a comparison came first would pay
 * for both.  Pages never touched are left out (a read would fault them in).
 */
static void warm_up(const char *dir, void *const *mem, const uint64_t *size, unsigned int n)
{
	char path[SNAP_PATH_MAX];
	uint64_t off = 0, i;
	unsigned int r;
	int fd;

	snprintf(path, sizeof(path), "%s/warm-up.%ld", dir, (long)getpid());
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
	if (fd < 0)
		return;
	for (r = 0; r < n; r++)
		for (i = 0; i < size[r]; i += 1 << 20, off += 1 << 20)
			if (pwrite(fd, (uint8_t *)mem[r] + i, size[r] - i < (1 << 20) ? size[r] - i : 1 << 20,
				   (off_t)off) < 0)
				break;
	fsync(fd);
	close(fd);
	unlink(path);
}

/* No guest: mib of host memory (one page in 16 zero) through the writer, then the same plainly. */
/* One snapshot of mem (size bytes, one region) through the writer into r->path: r's figures. */
static int writer_once(uint64_t *mem, uint64_t size, struct mig_snap_result *r, char *err, size_t len)
{
	uint64_t gpa = 0, bytes = 0;
	struct snap_layout l = { .kind = SNAP_FULL, .nr_regions = 1, .nr_vcpus = 1, .gpa = &gpa, .size = &size };
	struct mig_vcpu_state vs = { .nr_msrs = 1, .msrs = { { .index = 0x10 } } }; /* IA32_TSC */
	struct snap_written wr;
	struct snap_writer *w;
	uint8_t id[SNAP_ID];
	double t0;
	int ret = snap_writer_open(r->path, &l, &w, err, len);

	if (ret < 0)
		return ret;
	t0 = now_ms();
	ret = snap_writer_put(w, 0, 0, size / SNAP_PAGE, mem, &bytes, err, len);
	r->write_ms = now_ms() - t0;
	r->bytes = bytes;
	if (ret < 0) {
		snap_writer_abandon(w);
		return ret;
	}
	snap_writer_vcpus(w, &vs, &(struct mig_vm_state){ 0 });
	t0 = now_ms();
	ret = snap_writer_commit(w, id, &wr, err, len);
	r->fsync_ms = now_ms() - t0;
	r->data_pages = wr.data_pages;
	r->tables_bytes = wr.tables_bytes;
	return ret;
}

/*
 * No guest: mib of host memory (one page in 16 zero) through the writer,
 * then the same plainly, ROUNDS times in turn (this host's write speed
 * varies by a factor of two from one second to the next): each line, and
 * the median ratio.
 */
#define ROUNDS 5
static int writer_only(const char *dir, uint64_t mib)
{
	uint64_t size = mib << 20, i;
	struct mig_snap_result r = { .seq = 0, .throttle_permille = 1000 };
	struct figures fg;
	double ratio[ROUNDS];
	uint64_t *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	char err[512];
	int ret = 0;

	if (mem == MAP_FAILED)
		return -ENOMEM;
	for (i = 0; i < size / 8; i++)
		mem[i] = (i / 512) % 16 ? i * 0x9e3779b97f4a7c15ull : 0;
	warm_up(dir, (void *const *)&mem, &size, 1);
	printf("writer: %" PRIu64 " MiB of host memory (one page in 16 zero), no guest, %d rounds\n", mib, ROUNDS);
	for (i = 0; i < ROUNDS && ret == 0; i++) {
		snprintf(r.path, sizeof(r.path), "%s/writer.%ld.snap", dir, (long)getpid());
		ret = writer_once(mem, size, &r, err, sizeof(err));
		if (ret < 0)
			fprintf(stderr, "bench-snapshot: %s\n", err);
		else
			ret = report(dir, &r, (void *const *)&mem, &fg);
		ratio[i] = fg.of_plain;
	}
	if (ret == 0) {
		qsort(ratio, ROUNDS, sizeof(ratio[0]), cmp_double);
		printf("writer: of_plain median %.2f (min %.2f, max %.2f)\n", ratio[ROUNDS / 2], ratio[0],
		       ratio[ROUNDS - 1]);
	}
	munmap(mem, size);
	return ret;
}

struct wait_ctx {
	struct testvm *tv;
	uint64_t progress; /* the guest's pages written, at the last pause */
};

static uint64_t progress(struct testvm *tv)
{
	uint64_t sum = 0;
	unsigned int i;

	for (i = 0; i < tv->nr_vcpus; i++)
		sum += mig_testvm_progress(tv, i);
	return sum;
}

static void on_paused(void *ctx, const struct mig_snap_result *res)
{
	struct wait_ctx *w = ctx;

	(void)res;
	w->progress = progress(w->tv);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

static const char *met(bool ok)
{
	return ok ? "met" : "MISSED";
}

struct opts {
	uint64_t mib, ws_mib, rate, diffs, diff_mib;
	enum kvmdirty_mode mode;
	const char *mode_name, *dir;
	bool writer_only;
};

static int with_guest(const struct opts *o)
{
	struct mig_testvm_opts go = {
		.mib = o->mib, .vcpus = 2, .mode = o->mode, .ws_mib = o->ws_mib, .rate = o->rate, .fill = MIG_FILL_WS
	};
	struct figures full, diff[MAX_DIFFS];
	double pauses[MAX_DIFFS], worst_ratio = 1e9, worst_alloc = 0;
	struct wait_ctx wc = { 0 };
	char prefix[SNAP_PATH_MAX], err[512];
	struct mig_snap_result res[MAX_DIFFS + 1];
	struct mig_guest g;
	struct mig_snap *s;
	void **mem = NULL;
	unsigned int i;
	uint64_t k;
	int ret;

	ret = mig_testvm_new(&go, true, &wc.tv, err, sizeof(err));
	if (ret < 0) {
		fprintf(stderr, "bench-snapshot: %s\n", err);
		return 1;
	}
	testvm_spawn(wc.tv);
	ret = mig_testvm_guest(wc.tv, &g);
	mem = calloc(g.nr_regions, sizeof(*mem));
	for (i = 0; mem && i < g.nr_regions; i++)
		mem[i] = g.regions[i].hva;
	/* the test guest: the system region, then its data (testguest.h) in one region, working sets first */
	if (ret == 0 && (g.nr_regions != 2 || g.regions[1].gpa != MIG_DATA_GPA))
		ret = -EINVAL;
	snprintf(prefix, sizeof(prefix), "%s/bench.%ld", o->dir, (long)getpid());
	if (ret == 0 && mem)
		ret = mig_snap_new(&g,
				   &(struct mig_snap_opts){ .prefix = prefix, .paused = on_paused, .paused_ctx = &wc },
				   &s, err, sizeof(err));
	if (ret < 0 || !mem) {
		fprintf(stderr, "bench-snapshot: %s\n", ret < 0 ? err : "out of memory");
		goto out;
	}
	/* the system region and the working set: the memory the guest touched */
	warm_up(o->dir, mem, (uint64_t[]){ g.regions[0].size, o->ws_mib << 20 }, 2);
	sleep_ms(500); /* the guest in its stride */
	printf("bench-snapshot: %" PRIu64 " MiB guest, 2 vCPUs writing %" PRIu64 " MiB in order at %" PRIu64
	       " pages/s each, %s; files in %s\n",
	       o->mib, o->ws_mib, o->rate, o->mode_name, o->dir);
	for (k = 0; k <= o->diffs && ret == 0; k++) {
		/* a diff once the guest wrote diff_mib since its parent's pause (distinct pages: it writes in order) */
		while (k && progress(wc.tv) - wc.progress < (o->diff_mib << 20) / 4096)
			sleep_ms(1);
		ret = mig_snap_take(s, &res[k], err, sizeof(err));
		if (ret < 0)
			fprintf(stderr, "bench-snapshot: snapshot %" PRIu64 ": %s\n", k, err);
	}
	mig_snap_free(s);
	/* then each one's figures and its plain write (the guest still running), in order */
	for (k = 0; k <= o->diffs && ret == 0; k++)
		ret = report(o->dir, &res[k], mem, k ? &diff[k - 1] : &full);
	if (ret == 0) {
		for (k = 0; k < o->diffs; k++) {
			pauses[k] = diff[k].pause_ms;
			worst_ratio = diff[k].of_plain < worst_ratio ? diff[k].of_plain : worst_ratio;
			worst_alloc = diff[k].alloc_ratio > worst_alloc ? diff[k].alloc_ratio : worst_alloc;
		}
		qsort(pauses, o->diffs, sizeof(pauses[0]), cmp_double);
		printf("goal: diff pause (%" PRIu64
		       " MiB since its parent) <= 10 ms: median %.2f ms, worst %.2f ms: %s\n",
		       o->diff_mib, pauses[o->diffs / 2], pauses[o->diffs - 1], met(pauses[o->diffs - 1] <= 10));
		printf("goal: full pause <= 20 ms: %.2f ms: %s\n", full.pause_ms, met(full.pause_ms <= 20));
		printf("goal: write_mibps >= 0.9 of a plain write: full %.2f, diffs worst %.2f: %s\n", full.of_plain,
		       worst_ratio, met(full.of_plain >= 0.9 && worst_ratio >= 0.9));
		printf("goal: a diff's blocks within 1%% of its pages and tables: worst %.4f: %s\n", worst_alloc,
		       met(worst_alloc <= 1.01));
	}
out:
	free(mem);
	mig_guest_release(&g);
	testvm_halt_all(wc.tv);
	testvm_join(wc.tv, NULL, NULL);
	mig_testvm_free(wc.tv);
	return ret < 0;
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = { { "writer-only", no_argument, NULL, 'W' }, { 0 } };
	struct opts o = { .mib = 2048,
			  .ws_mib = 512,
			  .rate = 20000,
			  .diffs = 5,
			  .diff_mib = 64,
			  .mode = KVMDIRTY_MODE_CLEAR_LOG,
			  .mode_name = "clear-log",
			  .dir = "." };
	struct statfs sf;
	int c, ret;

	while ((c = getopt_long(argc, argv, "m:w:r:M:n:D:", longopts, NULL)) != -1) {
		switch (c) {
		case 'm':
			if (cli_number("bench-snapshot", "-m", optarg, 64, 1 << 16, &o.mib))
				return 2;
			break;
		case 'w':
			if (cli_number("bench-snapshot", "-w", optarg, 16, 1 << 16, &o.ws_mib))
				return 2;
			break;
		case 'r':
			if (cli_number("bench-snapshot", "-r", optarg, 1, UINT32_MAX, &o.rate))
				return 2;
			break;
		case 'n':
			if (cli_number("bench-snapshot", "-n", optarg, 1, MAX_DIFFS, &o.diffs))
				return 2;
			break;
		case 'M':
			o.mode_name = optarg;
			if (!strcmp(optarg, "clear-log"))
				o.mode = KVMDIRTY_MODE_CLEAR_LOG;
			else if (!strcmp(optarg, "dirty-log"))
				o.mode = KVMDIRTY_MODE_DIRTY_LOG;
			else if (!strcmp(optarg, "dirty-ring"))
				o.mode = KVMDIRTY_MODE_DIRTY_RING;
			else {
				fprintf(stderr, "bench-snapshot: -M '%s': dirty-log, clear-log or dirty-ring\n",
					optarg);
				return 2;
			}
			break;
		case 'D':
			o.dir = optarg;
			break;
		case 'W':
			o.writer_only = true;
			break;
		default:
			fprintf(stderr,
				"usage: bench-snapshot [-m MIB] [-w MIB] [-r PAGES_PER_SEC] [-M MODE] [-n DIFFS] "
				"[-D DIR] [--writer-only]\n");
			return 2;
		}
	}
	if (o.ws_mib + 16 > o.mib || o.diff_mib * 2 > o.ws_mib) {
		fprintf(stderr,
			"bench-snapshot: -w %" PRIu64 ": a working set of at least twice 64 MiB, inside -m %" PRIu64
			"\n",
			o.ws_mib, o.mib);
		return 2;
	}
	if (statfs(o.dir, &sf) < 0) {
		fprintf(stderr, "bench-snapshot: -D '%s': %s\n", o.dir, strerror(errno));
		return 2;
	}
	/* a host without KVM: the one line, nothing else (--writer-only runs anywhere) */
	ret = o.writer_only ? 0 : kvm_host_check("bench-snapshot: ");
	if (ret)
		return ret;
	if (writer_only(o.dir, o.ws_mib) < 0)
		return 1;
	return o.writer_only ? 0 : with_guest(&o);
}
