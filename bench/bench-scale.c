// SPDX-License-Identifier: MIT
/*
 * bench-scale: how the library's costs grow, one dimension at a time,
 * each point printed and then the slope.
 *
 *   scan   the bitmap scanner (kvmdirty_bitmap_runs(), what a sync and a
 *          hand-out walk) over bitmaps of 3, 48 and 384 MiB (guests of 96
 *          GiB to 12 TiB), empty and 1% dirty in runs of 64 pages, against
 *          the read roofline of the same buffer in the same run (an
 *          OR-reduction with the widest loads the CPU has):
 *            scan bytes=384M density=0 gbps=... roofline_gbps=... of_roofline=...
 *          and per density the time per MiB at the largest size over the
 *          smallest, against the same ratio of the roofline (the buffer
 *          leaves the caches as it grows; vs_roofline 1.0: the scan's cost
 *          grows with the bitmap as reading it does, and nothing else):
 *            scan slope density=0 ns_per_mib_3M=... ns_per_mib_384M=... ratio=...
 *                       roofline_ratio=... vs_roofline=...
 *          The goal: at least 0.9 of the roofline for the empty 384 MiB one.
 *
 *   regions  tracked regions of 2 MiB, 1, 64, 1,024 and 8,192, clear-log
 *          and dirty-ring, one of them dirtied by the guest between syncs
 *          (all 512 of its pages): the library's time per sync beside the
 *          kernel's (the log ioctls, timed apart by the library's
 *          statistics), medians of 15 syncs:
 *            scale regions=N mode=... lib_us=... kernel_us=... dirty_pages=...
 *                  rss_kib=...
 *          and per mode the library's time at 8,192 over its time at 1
 *          (goal: at most 1.5), its time per region, and the memory a
 *          region takes (resident memory the VM of 8,192 grew by beyond
 *          the VM of one, a region):
 *            scale regions slope mode=... lib_us_1=... lib_us_8192=...
 *                  ratio=... goal=1.50 lib_ns_per_region=... kernel_ratio=...
 *                  bytes_per_region=...
 *          (clear-log must GET each region's log, one ioctl a region, and
 *          its library time counts the work around each; dirty-ring visits
 *          only the regions its rings or marks touched)
 *   vcpus  1, 16, 64 and 256 vCPUs, all but one never entering KVM_RUN
 *          (parked), the one dirtying a 2 MiB region between syncs, in each
 *          mode: the library's time per sync beside the kernel's (the log
 *          ioctls or KVM_RESET_DIRTY_RINGS), medians of 15 syncs, and the
 *          library's time per idle vCPU against the single vCPU's (goal:
 *          at most 0.5 us):
 *            scale vcpus=N mode=... lib_us=... kernel_us=... per_idle_vcpu_us=...
 *                  dirty_pages=... rss_kib=... bytes_per_vcpu=...
 *          (bytes_per_vcpu: resident memory beyond the one-vCPU VM's, a
 *          vCPU; the rings and kvm_run are the kernel's, mapped, and count
 *          where touched); then in ring mode a reaper sweeping every 2 ms
 *          over the same vCPUs, all idle, for 400 ms: its time per sweep,
 *          KVM's part of it, and the library's per idle vCPU (same goal):
 *            scale vcpus=N mode=dirty-ring reaper_ms=2 reaper_us=...
 *                  reaper_kernel_us=... reaper_lib_us=... per_idle_vcpu_us=...
 *          Needs KVM (exit 77 with the reason where there is none).
 *
 *   gib    guests of 1, 16, 64 and 256 GiB (up to MAX_GIB) that touched 64
 *          MiB, migrated idle over TCP loopback: bench-migrate's gib case
 *          (the migration engine is its), run from the same directory:
 *            scale gib=N touched_mib=64 total_ms=... floor_ms=... of_floor=...
 *                  src_rss_mib=... dst_rss_mib=... sent_mib=...
 *          the floor being what the source cannot avoid for untouched
 *          memory, measured in the same run on a mapping of the same size:
 *          reading its pagemap and walking a bitmap of its pages; then
 *          the slope per untouched GiB against the floor's (goal: at most
 *          2x) and each end's peak memory per GiB (VmHWM).
 *
 * Usage: bench-scale [scan|regions|vcpus|gib [MAX_GIB]|all]
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <kvmdirty.h>

#include "../examples/common/kvm-host.h"
#include "bitmap-fill.h"
#include "proc-status.h"
#include "scan.h"
#include "testvm.h"

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static uint64_t sink;

/* Set bits seen by the library's run iteration over the whole bitmap. */
static uint64_t lib_scan(const uint64_t *map, uint64_t nbits)
{
	struct kvmdirty_run runs[256];
	uint64_t pos = 0, bits = 0;
	size_t n, i;

	while ((n = kvmdirty_bitmap_runs(map, &pos, nbits, runs, 256)) > 0)
		for (i = 0; i < n; i++)
			bits += runs[i].count;
	return bits;
}

static uint64_t roofline(const uint64_t *map, uint64_t nbits)
{
	return kd_scan_ops()->or_reduce(map, KVMDIRTY_BITMAP_WORDS(nbits));
}

/* ns per pass, the best of passes over at least min_ns (the best: what the code costs, not the machine's noise) */
static double best_ns(uint64_t (*fn)(const uint64_t *, uint64_t), const uint64_t *map, uint64_t nbits, double min_ns,
		      uint64_t *ret)
{
	double t0 = now_ns(), best = 1e300, t, a;

	do {
		a = now_ns();
		*ret = fn(map, nbits);
		sink += *ret;
		t = now_ns();
		if (t - a < best)
			best = t - a;
	} while (t - t0 < min_ns);
	return best;
}

static int scan_sweep(void)
{
	static const uint64_t mib[] = { 3, 48, 384 };
	static const double dens[] = { 0, 0.01 };
	double per_mib[2][3], roof_per_mib[2][3];
	uint64_t rng = 0x9e3779b97f4a7c15ull;
	unsigned int s, d;
	int status = 0;

	if (kd_scan_select("avx2") < 0)
		printf("bench-scale: this CPU has no AVX2: the scanner and the roofline use portable code\n");
	printf("bench-scale: scanner kernels: %s\n", kvmdirty_bitmap_impl());
	for (s = 0; s < 3; s++) {
		uint64_t nbits = mib[s] << 23, *map = aligned_alloc(64, mib[s] << 20);

		if (!map) {
			perror("bench-scale");
			return 1;
		}
		for (d = 0; d < 2; d++) {
			uint64_t bits, roof_bits, want;
			double lib, roof;

			bitmap_fill(map, nbits, dens[d], dens[d] > 0 ? 64 : 1, &rng);
			want = kvmdirty_bitmap_count(map, 0, nbits);
			/* the roofline first and last, the library between: a machine that slows down shows */
			roof = best_ns(roofline, map, nbits, 300e6, &roof_bits);
			lib = best_ns(lib_scan, map, nbits, 600e6, &bits);
			roof = (roof + best_ns(roofline, map, nbits, 300e6, &roof_bits)) / 2;
			if (bits != want) {
				fprintf(stderr,
					"bench-scale: %" PRIu64 " MiB at %g: the scan saw %" PRIu64 " bits of %" PRIu64
					"\n",
					mib[s], dens[d], bits, want);
				status = 1;
			}
			per_mib[d][s] = lib / (double)mib[s];
			roof_per_mib[d][s] = roof / (double)mib[s];
			printf("scan bytes=%" PRIu64
			       "M density=%g%s gbps=%.2f roofline_gbps=%.2f of_roofline=%.2f set_bits=%" PRIu64 "\n",
			       mib[s], dens[d], dens[d] > 0 ? " runs=64" : "", (double)(mib[s] << 20) / lib,
			       (double)(mib[s] << 20) / roof, roof / lib, bits);
			fflush(stdout);
		}
		free(map);
	}
	/* the buffer leaves the caches as it grows: the roofline's own slope is the baseline */
	for (d = 0; d < 2; d++)
		printf("scan slope density=%g ns_per_mib_3M=%.0f ns_per_mib_384M=%.0f ratio=%.2f roofline_ratio=%.2f "
		       "vs_roofline=%.2f\n",
		       dens[d], per_mib[d][0], per_mib[d][2], per_mib[d][2] / per_mib[d][0],
		       roof_per_mib[d][2] / roof_per_mib[d][0],
		       (per_mib[d][2] / per_mib[d][0]) / (roof_per_mib[d][2] / roof_per_mib[d][0]));
	return status;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

#define SYNCS	    15
#define REGION_SIZE (2ull << 20)
#define REGION_GPA  (4ull << 30)

/* This process's resident memory, KiB (VmRSS); 0 where it cannot be read. */
static uint64_t rss_kib(void)
{
	return proc_status_kib("VmRSS");
}

/* The measures of one point. */
struct measure {
	double lib_us, kernel_us;
	uint64_t dirty, rss_kib; /* pages the last sync brought; resident memory grown by the point's VM */
	double reaper_us, reaper_kernel_us; /* a reaper's sweep, all vCPUs idle (REAPER_MS points only) */
};

#define REAPER_MS    2
#define REAPER_SPAN  400 /* ms of sweeps measured */

/* A reaper's sweeps over idle vCPUs: REAPER_SPAN ms of them, after the syncs. */
static int reaper_sweeps(struct testvm *tv, struct measure *m)
{
	struct kvmdirty_stats a, b;
	uint64_t runs;

	if (kvmdirty_tracker_stats(tv->tracker, &a, sizeof(a)) < 0)
		return -EIO;
	nanosleep(&(struct timespec){ 0, REAPER_SPAN * 1000000L }, NULL);
	if (kvmdirty_tracker_stats(tv->tracker, &b, sizeof(b)) < 0)
		return -EIO;
	runs = b.ring_reaper_runs - a.ring_reaper_runs;
	if (!runs)
		return -ETIME;
	m->reaper_us = (double)(b.ring_reaper_ns - a.ring_reaper_ns) / runs / 1e3;
	m->reaper_kernel_us = (double)(b.ring_reaper_kernel_ns - a.ring_reaper_kernel_ns) / runs / 1e3;
	return 0;
}

/*
 * One point: n regions tracked and nv vCPUs in mode, region 0 written by
 * vCPU 0 between syncs (the others never run); medians into lib_us and
 * kernel_us.  With reaper (ring mode), a reaper sweeps every REAPER_MS
 * and its sweeps are measured once the syncs are done.
 */
static int point(unsigned int n, unsigned int nv, enum kvmdirty_mode mode, bool reaper, struct measure *ret_m)
{
	/* rings of 4,096 entries: 64 KiB a vCPU, room for a pass of 512 pages */
	struct testvm_opts o = { .nr_vcpus = nv,
				 .track = true,
				 .track_opts = { .mode = mode,
						 .ring_entries = mode == KVMDIRTY_MODE_DIRTY_RING ? 4096 : 0,
						 .reaper_ms = reaper ? REAPER_MS : 0 } };
	uint64_t lib[SYNCS], kern[SYNCS];
	struct kvmdirty_range rg[64];
	struct guest_vcpu *mb;
	struct testvm_exit ex;
	struct testvm *tv = NULL;
	uint64_t rss0 = rss_kib();
	void **mem = calloc(n, sizeof(*mem));
	unsigned int i, k;
	int ret = mem ? testvm_new(&o, &tv) : -ENOMEM;

	for (i = 0; ret == 0 && i < n; i++)
		ret = testvm_add_memory(tv, REGION_GPA + i * REGION_SIZE, REGION_SIZE, 0, &mem[i], NULL);
	if (ret < 0) {
		fprintf(stderr, "bench-scale: %u regions: %s\n", n, strerror(-ret));
		goto out;
	}
	mb = testvm_mailbox(tv, 0);
	mb->gpa = REGION_GPA;
	mb->pages = REGION_SIZE / GUEST_PAGE_SIZE;
	mb->pattern = GUEST_SEQUENTIAL;
	mb->flags = GUEST_F_EXIT_EVERY_PASS;
	ret = kvmdirty_tracker_start(tv->tracker, NULL);
	/* the first sync takes every page of every region (all pending at start): not timed */
	for (k = 0; ret >= 0 && k < SYNCS + 1; k++) {
		struct kvmdirty_stats st;

		do
			ret = testvm_run(tv, 0, &ex);
		while (ret == 0 && ex.event != TESTVM_PASS && ex.event == TESTVM_TICK);
		if (ret == 0 && ex.event != TESTVM_PASS)
			ret = -EIO;
		if (ret == 0)
			ret = (int)kvmdirty_tracker_sync(tv->tracker);
		ret_m->dirty = ret > 0 ? (uint64_t)ret : 0;
		while (ret >= 0 && kvmdirty_tracker_next(tv->tracker, rg, 64, 0) > 0)
			;
		if (ret >= 0 && (ret = kvmdirty_tracker_stats(tv->tracker, &st, sizeof(st))) == 0 && k) {
			lib[k - 1] = st.last_sync_lib_ns;
			kern[k - 1] = st.last_sync_kernel_ns;
		}
	}
	if (ret < 0) {
		fprintf(stderr, "bench-scale: %u regions: the guest or a sync: %s\n", n, strerror(-ret));
		goto out;
	}
	qsort(lib, SYNCS, sizeof(lib[0]), cmp_u64);
	qsort(kern, SYNCS, sizeof(kern[0]), cmp_u64);
	ret_m->lib_us = lib[SYNCS / 2] / 1e3;
	ret_m->kernel_us = kern[SYNCS / 2] / 1e3;
	ret_m->rss_kib = rss_kib() - rss0;
	ret = reaper ? reaper_sweeps(tv, ret_m) : 0;
	if (ret < 0)
		fprintf(stderr, "bench-scale: %u vCPUs: the reaper's sweeps: %s\n", nv, strerror(-ret));
out:
	if (tv)
		testvm_free(tv);
	for (i = 0; mem && i < n; i++)
		if (mem[i])
			testvm_unmap(mem[i], REGION_SIZE);
	free(mem);
	return ret < 0 ? 1 : 0;
}

static int regions_sweep(void)
{
	static const unsigned int counts[] = { 1, 64, 1024, 8192 };
	static const enum kvmdirty_mode modes[] = { KVMDIRTY_MODE_CLEAR_LOG, KVMDIRTY_MODE_DIRTY_RING };
	static const char *const names[] = { "clear-log", "dirty-ring" };
	struct measure m[4];
	unsigned int i, k;
	int ret = kvm_host_check("bench-scale: ");

	if (ret)
		return ret;
	for (k = 0; k < 2; k++) {
		for (i = 0; i < 4; i++) {
			if (point(counts[i], 1, modes[k], false, &m[i]))
				return 1;
			printf("scale regions=%u mode=%s lib_us=%.1f kernel_us=%.1f dirty_pages=%" PRIu64
			       " rss_kib=%" PRIu64 "\n",
			       counts[i], names[k], m[i].lib_us, m[i].kernel_us, m[i].dirty, m[i].rss_kib);
			fflush(stdout);
		}
		/* memory a region: what the VM of 8,192 holds beyond the VM of one, a region */
		printf("scale regions slope mode=%s lib_us_1=%.1f lib_us_8192=%.1f ratio=%.2f goal=1.50 "
		       "lib_ns_per_region=%.1f kernel_ratio=%.2f bytes_per_region=%.0f\n",
		       names[k], m[0].lib_us, m[3].lib_us, m[3].lib_us / m[0].lib_us,
		       (m[3].lib_us - m[0].lib_us) * 1e3 / (counts[3] - 1), m[3].kernel_us / m[0].kernel_us,
		       ((double)m[3].rss_kib - (double)m[0].rss_kib) * 1024 / (counts[3] - 1));
		fflush(stdout);
	}
	return 0;
}

static int vcpus_sweep(void)
{
	static const unsigned int counts[] = { 1, 16, 64, 256 };
	static const enum kvmdirty_mode modes[] = { KVMDIRTY_MODE_DIRTY_LOG, KVMDIRTY_MODE_CLEAR_LOG,
						    KVMDIRTY_MODE_DIRTY_RING };
	static const char *const names[] = { "dirty-log", "clear-log", "dirty-ring" };
	struct measure m[4];
	unsigned int i, k;
	int ret = kvm_host_check("bench-scale: ");

	if (ret)
		return ret;
	for (k = 0; k < 3; k++) {
		for (i = 0; i < 4; i++) {
			if (point(1, counts[i], modes[k], false, &m[i]))
				return 1;
			printf("scale vcpus=%u mode=%s lib_us=%.1f kernel_us=%.1f per_idle_vcpu_us=%.3f "
			       "dirty_pages=%" PRIu64 " rss_kib=%" PRIu64 " bytes_per_vcpu=%.0f\n",
			       counts[i], names[k], m[i].lib_us, m[i].kernel_us,
			       i ? (m[i].lib_us - m[0].lib_us) / (counts[i] - 1) : 0.0, m[i].dirty, m[i].rss_kib,
			       i ? ((double)m[i].rss_kib - (double)m[0].rss_kib) * 1024 / (counts[i] - 1) : 0.0);
			fflush(stdout);
		}
	}
	/* the reaper's sweep over idle rings, each vCPU count (its syncs are timed again, not printed) */
	for (i = 0; i < 4; i++) {
		if (point(1, counts[i], KVMDIRTY_MODE_DIRTY_RING, true, &m[i]))
			return 1;
		printf("scale vcpus=%u mode=dirty-ring reaper_ms=%d reaper_us=%.1f reaper_kernel_us=%.1f "
		       "reaper_lib_us=%.1f per_idle_vcpu_us=%.3f\n",
		       counts[i], REAPER_MS, m[i].reaper_us, m[i].reaper_kernel_us, m[i].reaper_us - m[i].reaper_kernel_us,
		       i ? ((m[i].reaper_us - m[i].reaper_kernel_us) - (m[0].reaper_us - m[0].reaper_kernel_us)) /
				   (counts[i] - 1)
			 : 0.0);
		fflush(stdout);
	}
	return 0;
}

/*
 * The guest-size sweep migrates, and the migration engine is
 * bench-migrate's: run its gib case, from the same directory.
 */
static int gib_sweep(const char *max_gib)
{
	char path[4096];
	ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 32);
	char *slash;

	if (n <= 0) {
		fprintf(stderr, "bench-scale: /proc/self/exe: %s\n", strerror(n < 0 ? errno : ENOENT));
		return 1;
	}
	path[n] = 0;
	slash = strrchr(path, '/');
	strcpy(slash ? slash + 1 : path, "bench-migrate");
	fflush(stdout);
	execl(path, path, "gib", max_gib, (char *)NULL);
	fprintf(stderr, "bench-scale: %s: %s\n", path, strerror(errno));
	return 1;
}

int main(int argc, char **argv)
{
	const char *what = argc > 1 ? argv[1] : "all";
	int ret = 0;

	if (argc > 3 || (argc > 2 && strcmp(what, "gib")) ||
	    (strcmp(what, "scan") && strcmp(what, "regions") && strcmp(what, "vcpus") && strcmp(what, "gib") &&
	     strcmp(what, "all"))) {
		fprintf(stderr, "usage: bench-scale [scan|regions|vcpus|gib [MAX_GIB]|all]\n");
		return 2;
	}
	if (!strcmp(what, "scan") || !strcmp(what, "all"))
		ret = scan_sweep();
	if (!ret && (!strcmp(what, "regions") || !strcmp(what, "all")))
		ret = regions_sweep();
	if (!ret && (!strcmp(what, "vcpus") || !strcmp(what, "all")))
		ret = vcpus_sweep();
	/* last: it takes the process over */
	if (!ret && (!strcmp(what, "gib") || !strcmp(what, "all")))
		ret = gib_sweep(argc > 2 ? argv[2] : "256");
	return ret;
}
