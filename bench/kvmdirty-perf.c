// SPDX-License-Identifier: MIT
/*
 * kvmdirty-perf: dirty logging performance, laid out like the kernel's
 * dirty_log_perf_test so that runs can be compared side by side.
 *
 *   kvmdirty-perf [-v VCPUS] [-b BYTES_PER_VCPU] [-i ITERATIONS] [-M MODE] [-c CHUNK_PAGES] [-C CONSUMERS]
 *
 * MODE is dirty_log_test's: dirty-log (KVM_GET_DIRTY_LOG alone), clear-log
 * (manual protect: GET + CLEAR), dirty-ring.  Each vCPU writes one word
 * to every page of its own memory per iteration (from ring 3, so at native
 * speed here), then stops; the host then collects the dirty pages.
 * Iterations alternate between the library (sync, then next() over every
 * pending page, which issues the CLEARs) and the bare ioctls on the same
 * slots (GET, and in clear-log mode one CLEAR of the whole bitmap per
 * slot, as dirty_log_perf_test does), so both see the same dirty pattern.
 * The last line compares the two.
 *
 * With -C N (N > 1), the iterations alternate instead between N consumers
 * of the tracker (its own and N - 1 that owe their pages, joined empty
 * before the guest writes) and the tracker's own consumer alone: one sync,
 * then every page handed out to each consumer, and the owing ones commit.
 * The last line gives the ratio of the two and each consumer's memory:
 *
 *   perf mode=... consumers=N vcpus=... gib=... sync_ms=... one_consumer_ms=... vs_one_consumer=...
 *   bits_per_page=... pages=...
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>

#include <linux/kvm.h>

#include "../examples/common/cli.h"
#include "../examples/common/kvm-host.h"
#include "testvm.h"

#define DATA_GPA (4ull << 30)
#define PAGE 4096ull

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

struct perf {
	struct testvm *tv;
	/* the vCPUs' regions, then the system region */
	struct kvmdirty_region *region[GUEST_MAX_VCPUS + 1];
	uint64_t *bitmap[GUEST_MAX_VCPUS + 1]; /* the bare iterations' buffers */
	unsigned int vcpus;
	uint64_t pages; /* per vCPU */
	pthread_barrier_t go, done;
	volatile bool quit;
	volatile int error;
};

struct vcpu_arg {
	struct perf *p;
	unsigned int i;
};

/* One pass per iteration: run to the guest's PASS exit, then wait. */
static void *vcpu_thread(void *arg)
{
	struct vcpu_arg *a = arg;
	struct perf *p = a->p;
	struct testvm_exit ex;

	for (;;) {
		pthread_barrier_wait(&p->go);
		if (p->quit)
			break;
		do {
			int ret = testvm_run(p->tv, a->i, &ex);

			if (ret < 0 || (ex.event != TESTVM_PASS && ex.event != TESTVM_TICK)) {
				p->error = ret < 0 ? ret : -EIO;
				break;
			}
		} while (ex.event != TESTVM_PASS);
		pthread_barrier_wait(&p->done);
	}
	return NULL;
}

static double dirty_memory(struct perf *p)
{
	double t0 = now_s();

	pthread_barrier_wait(&p->go);
	pthread_barrier_wait(&p->done);
	return now_s() - t0;
}

/* The library: everything KVM reports, handed out (CLEARs included). */
static int lib_collect(struct perf *p, double *get_s, double *clear_s, uint64_t *pages)
{
	struct kvmdirty_range rg[256];
	double t0 = now_s(), t1;
	int64_t n = kvmdirty_tracker_sync(p->tv->tracker);
	int k, i;

	if (n < 0)
		return (int)n;
	t1 = now_s();
	*pages = 0;
	while ((k = kvmdirty_tracker_next(p->tv->tracker, rg, 256, 0)) > 0)
		for (i = 0; i < k; i++)
			*pages += rg[i].npages;
	if (k < 0)
		return k;
	*get_s = t1 - t0;
	*clear_s = now_s() - t1;
	return 0;
}

/*
 * The floor: the same ioctls on the same slots (the system region's too:
 * the library tracks it), nothing around them.
 */
static int bare_collect(struct perf *p, bool clear, double *get_s, double *clear_s)
{
	int fd = kvmdirty_vm_fd(p->tv->vm);
	double t0 = now_s(), t1;
	unsigned int i;

	for (i = 0; i <= p->vcpus; i++) {
		struct kvm_dirty_log log = { .slot = kvmdirty_region_slot(p->region[i]), .dirty_bitmap = p->bitmap[i] };

		if (ioctl(fd, KVM_GET_DIRTY_LOG, &log) < 0)
			return -errno;
	}
	t1 = now_s();
	for (i = 0; clear && i <= p->vcpus; i++) {
		struct kvm_clear_dirty_log c = {
			.slot = kvmdirty_region_slot(p->region[i]),
			.num_pages = (uint32_t)(kvmdirty_region_size(p->region[i]) / PAGE),
			.first_page = 0,
			.dirty_bitmap = p->bitmap[i],
		};

		if (ioctl(fd, KVM_CLEAR_DIRTY_LOG, &c) < 0)
			return -errno;
	}
	*get_s = t1 - t0;
	*clear_s = now_s() - t1;
	return 0;
}

/* Every page pending for c handed out; returns the pages, or -errno. */
static int64_t drain(struct kvmdirty_consumer *c)
{
	struct kvmdirty_range rg[256];
	int64_t pages = 0;
	int k, i;

	while ((k = kvmdirty_consumer_next(c, rg, 256, 0)) > 0)
		for (i = 0; i < k; i++)
			pages += (int64_t)rg[i].npages;
	return k < 0 ? k : pages;
}

/* -C: one sync, every page to each consumer, commits; pages handed to the first. */
static int multi_collect(struct perf *p, struct kvmdirty_consumer **extra, unsigned int n, double *s,
			 uint64_t *pages)
{
	double t0 = now_s();
	int64_t r = kvmdirty_tracker_sync(p->tv->tracker);
	unsigned int i;

	if (r >= 0)
		r = drain(kvmdirty_tracker_consumer(p->tv->tracker));
	if (r < 0)
		return (int)r;
	*pages = (uint64_t)r;
	for (i = 0; i < n; i++) {
		r = drain(extra[i]);
		if (r >= 0)
			r = kvmdirty_consumer_commit(extra[i]);
		if (r < 0)
			return (int)r;
		if ((uint64_t)r != *pages) {
			fprintf(stderr, "kvmdirty-perf: consumer %u was handed %" PRId64 " pages, the first %" PRIu64 "\n",
				i + 1, r, *pages);
			return -EIO;
		}
	}
	*s = now_s() - t0;
	return 0;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

/* Median: this host's timings have outliers either way. */
static double median(double *v, uint64_t n)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int main(int argc, char **argv)
{
	uint64_t vcpus = 1, bytes = 1ull << 30, iters = 3, chunk = 0, consumers = 1;
	struct kvmdirty_consumer *extra[63];
	double bits_per_page = 0;
	struct testvm_opts o = { .track = true };
	const char *mode_name = "clear-log";
	double t0, lib_get = 0, lib_clear = 0, bare_get = 0, bare_clear = 0, floor_s, lib_s;
	struct perf p = { 0 };
	struct vcpu_arg args[GUEST_MAX_VCPUS];
	pthread_t th[GUEST_MAX_VCPUS];
	uint64_t pages_total = 0, it;
	double *lib_it, *bare_it;
	struct kvmdirty_stats st;
	unsigned int i;
	int c, ret;

	while ((c = getopt(argc, argv, "v:b:i:M:c:C:h")) != -1) {
		switch (c) {
		case 'v':
			if (cli_number("kvmdirty-perf", "-v", optarg, 1, GUEST_MAX_VCPUS, &vcpus))
				return 2;
			break;
		case 'b':
			if (cli_number("kvmdirty-perf", "-b", optarg, 2 << 20, 64ull << 30, &bytes))
				return 2;
			break;
		case 'i':
			if (cli_number("kvmdirty-perf", "-i", optarg, 1, 1000, &iters))
				return 2;
			break;
		case 'c':
			if (cli_number("kvmdirty-perf", "-c", optarg, 64, 1ull << 31, &chunk))
				return 2;
			break;
		case 'M':
			mode_name = optarg;
			break;
		case 'C':
			if (cli_number("kvmdirty-perf", "-C", optarg, 1, 64, &consumers))
				return 2;
			break;
		default:
			fprintf(stderr, "usage: kvmdirty-perf [-v VCPUS] [-b BYTES_PER_VCPU] [-i ITERATIONS] "
					"[-M dirty-log|clear-log|dirty-ring] [-c CLEAR_CHUNK_PAGES] [-C CONSUMERS]\n");
			return c == 'h' ? 0 : 2;
		}
	}
	if (!strcmp(mode_name, "dirty-log"))
		o.track_opts.mode = KVMDIRTY_MODE_DIRTY_LOG;
	else if (!strcmp(mode_name, "clear-log"))
		o.track_opts.mode = KVMDIRTY_MODE_CLEAR_LOG;
	else if (!strcmp(mode_name, "dirty-ring"))
		o.track_opts.mode = KVMDIRTY_MODE_DIRTY_RING;
	else {
		fprintf(stderr, "kvmdirty-perf: -M '%s': expected dirty-log, clear-log or dirty-ring\n", mode_name);
		return 2;
	}
	if (bytes % (2 << 20)) {
		fprintf(stderr, "kvmdirty-perf: -b %" PRIu64 ": must be a multiple of 2 MiB\n", bytes);
		return 2;
	}
	ret = kvm_host_check("kvmdirty-perf: ");
	if (ret)
		return ret;
	lib_it = calloc(iters, sizeof(double));
	bare_it = calloc(iters, sizeof(double));
	o.track_opts.clear_chunk_pages = chunk;
	o.track_opts.ring_entries = 65536;
	o.nr_vcpus = (unsigned int)vcpus;
	ret = testvm_new(&o, &p.tv);
	if (ret < 0) {
		fprintf(stderr, "kvmdirty-perf: creating the VM (%s): %s\n", mode_name, strerror(-ret));
		return 1;
	}
	p.vcpus = (unsigned int)vcpus;
	p.pages = bytes / PAGE;
	printf("Testing guest mode: ring-3 workload, 4K pages, mode %s\n", mode_name);
	for (i = 0; i < p.vcpus; i++) {
		struct guest_vcpu *mb = testvm_mailbox(p.tv, i);
		uint64_t gpa = DATA_GPA + i * bytes;

		ret = testvm_add_memory(p.tv, gpa, bytes, 0, NULL, &p.region[i]);
		if (ret < 0) {
			fprintf(stderr, "kvmdirty-perf: %" PRIu64 " bytes at gpa 0x%" PRIx64 ": %s\n", bytes, gpa,
				strerror(-ret));
			return 1;
		}
		p.bitmap[i] = calloc(KVMDIRTY_BITMAP_WORDS(p.pages), 8);
		mb->gpa = gpa;
		mb->pages = p.pages;
		mb->pattern = GUEST_SEQUENTIAL;
		mb->flags = GUEST_F_EXIT_EVERY_PASS;
	}
	p.region[p.vcpus] = p.tv->sys_region;
	p.bitmap[p.vcpus] = calloc(KVMDIRTY_BITMAP_WORDS(p.tv->sys_size / PAGE), 8);
	pthread_barrier_init(&p.go, NULL, p.vcpus + 1);
	pthread_barrier_init(&p.done, NULL, p.vcpus + 1);
	for (i = 0; i < p.vcpus; i++) {
		args[i] = (struct vcpu_arg){ &p, i };
		pthread_create(&th[i], NULL, vcpu_thread, &args[i]);
	}

	printf("Populate memory time: %.6fs\n", dirty_memory(&p));
	t0 = now_s();
	ret = kvmdirty_tracker_start(p.tv->tracker, NULL);
	printf("Enabling dirty logging time: %.6fs\n", now_s() - t0);
	if (ret < 0) {
		fprintf(stderr, "kvmdirty-perf: starting tracking: %s\n", strerror(-ret));
		return 1;
	}
	/* the migration's first pass: everything once (not measured) */
	{
		double g, cl;
		uint64_t n;

		ret = lib_collect(&p, &g, &cl, &n);
	}

	for (it = 1; it <= 2 * iters && !ret && !p.error && consumers > 1; it++) {
		unsigned int n = it % 2 ? (unsigned int)consumers - 1 : 0, k;
		double dm, t = 0;
		uint64_t pages = 0;

		/* the others join empty before the guest writes (not timed) */
		for (k = 0; k < n && !ret; k++)
			ret = kvmdirty_consumer_new(p.tv->tracker, KVMDIRTY_CONSUMER_EMPTY, &extra[k]);
		if (ret < 0)
			break;
		if (n) {
			struct kvmdirty_consumer_info in;

			kvmdirty_consumer_info(extra[0], &in, sizeof(in));
			bits_per_page = in.tracked_pages ? 8.0 * in.bitmap_bytes / in.tracked_pages : 0;
		}
		dm = dirty_memory(&p);
		if (p.error)
			break;
		ret = multi_collect(&p, extra, n, &t, &pages);
		for (k = 0; k < n; k++)
			kvmdirty_consumer_free(extra[k]);
		if (n) {
			lib_it[(it - 1) / 2] = t;
			pages_total += pages;
		} else {
			bare_it[(it - 1) / 2] = t;
		}
		printf("Iteration %" PRIu64 " dirty memory time: %.6fs, %u consumer(s): %.6fs\n", (it + 1) / 2, dm,
		       n + 1, t);
	}
	for (it = 1; it <= 2 * iters && !ret && !p.error && consumers == 1; it++) {
		double dm = dirty_memory(&p), g = 0, cl = 0;
		uint64_t n = 0;

		if (p.error)
			break;
		/* odd iterations through the library, even ones bare */
		if (it % 2) {
			ret = lib_collect(&p, &g, &cl, &n);
			lib_get += g;
			lib_clear += cl;
			lib_it[(it - 1) / 2] = g + cl;
			pages_total += n;
			printf("Iteration %" PRIu64 " dirty memory time: %.6fs\n", (it + 1) / 2, dm);
			printf("Iteration %" PRIu64 " get dirty log time: %.6fs\n", (it + 1) / 2, g);
			printf("Iteration %" PRIu64 " clear dirty log time: %.6fs\n", (it + 1) / 2, cl);
		} else if (o.track_opts.mode != KVMDIRTY_MODE_DIRTY_RING) {
			ret = bare_collect(&p, o.track_opts.mode == KVMDIRTY_MODE_CLEAR_LOG, &g, &cl);
			bare_get += g;
			bare_clear += cl;
			bare_it[(it - 1) / 2] = g + cl;
		} else {
			/* no bare ring harvest exists outside the library: collect through it */
			ret = lib_collect(&p, &g, &cl, &n);
		}
	}
	p.quit = true;
	pthread_barrier_wait(&p.go);
	for (i = 0; i < p.vcpus; i++)
		pthread_join(th[i], NULL);
	if (ret < 0 || p.error) {
		fprintf(stderr, "kvmdirty-perf: %s\n", strerror(-(ret < 0 ? ret : p.error)));
		return 1;
	}
	t0 = now_s();
	ret = kvmdirty_tracker_stop(p.tv->tracker, NULL);
	printf("Disabling dirty logging time: %.6fs\n", now_s() - t0);
	printf("Get dirty log over %" PRIu64 " iterations took %.6fs. (Avg %.6fs/iteration)\n", iters, lib_get,
	       lib_get / (double)iters);
	printf("Clear dirty log over %" PRIu64 " iterations took %.6fs. (Avg %.6fs/iteration)\n", iters, lib_clear,
	       lib_clear / (double)iters);
	kvmdirty_tracker_stats(p.tv->tracker, &st, sizeof(st));

	/* per-iteration medians: sync + handing out every page, against the bare ioctls */
	lib_s = median(lib_it, iters);
	floor_s = median(bare_it, iters);
	if (consumers > 1)
		printf("perf mode=%s consumers=%" PRIu64 " vcpus=%u gib=%.2f sync_ms=%.3f one_consumer_ms=%.3f "
		       "vs_one_consumer=%.3f bits_per_page=%.2f pages=%" PRIu64 "\n",
		       mode_name, consumers, p.vcpus, (double)(p.vcpus * bytes) / (1 << 30), lib_s * 1e3, floor_s * 1e3,
		       lib_s / floor_s, bits_per_page, pages_total / iters);
	else if (o.track_opts.mode == KVMDIRTY_MODE_DIRTY_RING)
		printf("perf mode=%s vcpus=%u gib=%.2f sync_ms=%.3f floor_ms=n/a overhead=n/a pages=%" PRIu64
		       " harvested_pages_per_s=%.0f ring_full_exits=%" PRIu64 "\n",
		       mode_name, p.vcpus, (double)(p.vcpus * bytes) / (1 << 30), lib_s * 1e3, pages_total / iters,
		       (double)st.ring_harvested / ((lib_get + lib_clear) + st.ring_full_ns / 1e9), st.ring_full_exits);
	else
		printf("perf mode=%s vcpus=%u gib=%.2f sync_ms=%.3f floor_ms=%.3f overhead=%.3f pages=%" PRIu64 "\n",
		       mode_name, p.vcpus, (double)(p.vcpus * bytes) / (1 << 30), lib_s * 1e3,
		       floor_s * 1e3, lib_s / floor_s - 1, pages_total / iters);
	testvm_free(p.tv);
	return 0;
}
