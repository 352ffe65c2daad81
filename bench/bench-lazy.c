// SPDX-License-Identifier: MIT
/*
 * bench-lazy: a lazy restore (kvmdirty_mig_restore_lazy()) against the
 * eager one (kvmdirty_mig_restore()) of the same chain, in one run, each
 * line with its baseline and ratio.
 *
 *   bench-lazy [-D DIR] [-s GIB,GIB] [-w GIB] [--quick]
 *
 * The chains are full snapshots of the test guest (examples/guest), its
 * data pages tagged and filled with a non-zero pattern, written to DIR
 * (default /var/tmp) and read back from the page cache.
 *
 *   first  guest_gib=G data_gib=D lazy_first_ms= lazy_first_write_ms= eager_ms= ratio=
 *          for each -s size G (default 1 and 16; a guest of G GiB with
 *          D = min(G, 1) GiB of data, the rest never written): when the
 *          vCPUs may run (the call's return) and when the guest wrote its
 *          first page, against the eager restore's return.  Goal: <= 5 ms.
 *   resident guest_gib=G lazy_ms= eager_ms= ratio=   Goal: <= 1.1.
 *   faults vcpus=N p50_us= p99_us= max_us= faults=   (no fill: every page
 *          comes by a fault; 1 and 8 vCPUs each writing 32 MiB of its own
 *          flat out) and the distribution on the next line.  The time is
 *          the server's: from the read of the fault to its page placed,
 *          not the time a fault waits before that read.  Goal: p50 <= 10,
 *          p99 <= 50.
 *   workset guest_gib=W touched_mib=64 resident_writes= lazy_writes= ratio=
 *          ws_writes= ws_ratio=   pages one vCPU wrote in its first second
 *          over the last 64 MiB of a W GiB chain (-w, default 4; the last
 *          pages the fill reaches), restored eagerly
 *          (then run: "resident"), lazily, and lazily with the working-set
 *          file the lazy run wrote.  Goals: >= 0.8 and >= 0.95.
 *
 * --quick: 1 GiB guests and a 1 GiB working-set chain (a smoke run).
 * Without KVM: exit 77 after one line.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <kvmdirty-migrate.h>

#include "../examples/common/kvm-host.h"
#include "testvm.h"

#define DATA_GPA (4ull << 30)

struct side {
	struct testvm *tv;
	void *data;
	uint64_t size;
	struct kvmdirty_mig_guest *g;
};

static char dir[4096] = "/var/tmp";

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void sleep_ms(unsigned int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

static void die(const char *what, int ret, const char *err)
{
	fprintf(stderr, "bench-lazy: %s: %s%s%s\n", what, strerror(ret < 0 ? -ret : ret), err ? ": " : "",
		err ? err : "");
	exit(1);
}

static void g_pause(void *ctx)
{
	testvm_pause_all(ctx);
}

static void g_resume(void *ctx)
{
	testvm_resume_all(ctx);
}

static const struct kvmdirty_mig_ops ops = { .pause = g_pause, .resume = g_resume };

static void side_new(struct side *s, unsigned int vcpus, uint64_t gib, bool source)
{
	struct testvm_opts o = { .nr_vcpus = vcpus, .track = source, .track_opts.mode = KVMDIRTY_MODE_CLEAR_LOG };
	int ret;

	memset(s, 0, sizeof(*s));
	s->size = gib << 30;
	if ((ret = testvm_new(&o, &s->tv)) < 0)
		die("testvm_new", ret, NULL);
	if ((ret = testvm_add_memory(s->tv, DATA_GPA, s->size, 0, &s->data, NULL)) < 0)
		die("testvm_add_memory", ret, NULL);
	ret = kvmdirty_mig_guest_new(s->tv->vm, source ? s->tv->tracker : NULL, s->tv->vcpu, vcpus,
				     source ? 0 : KVMDIRTY_MIG_FRESH, &ops, s->tv, &s->g);
	if (ret < 0)
		die("kvmdirty_mig_guest_new", ret, NULL);
}

static void side_free(struct side *s)
{
	kvmdirty_mig_guest_free(s->g);
	testvm_free(s->tv);
	testvm_unmap(s->data, s->size);
}

/*
 * A chain of one full snapshot at path: a guest of gib GiB, data_mib of
 * it filled, vcpus each writing ws_mib of its own from the start, flat out.
 */
static void make_chain(const char *path_prefix, unsigned int vcpus, uint64_t gib, uint64_t data_mib, uint64_t ws_mib,
		       uint64_t ws_off_mib)
{
	struct kvmdirty_mig_snap_opts so = { .prefix = path_prefix };
	struct kvmdirty_mig_snap_result res;
	struct kvmdirty_mig_snap *snap;
	struct side s;
	char err[512], path[4200];
	uint64_t p, i;
	int ret;

	snprintf(path, sizeof(path), "%s-000000.snap", path_prefix);
	unlink(path);
	side_new(&s, vcpus, gib, true);
	for (i = 0; i < vcpus; i++) {
		struct guest_vcpu *v = testvm_mailbox(s.tv, (unsigned int)i);

		v->gpa = DATA_GPA + (ws_off_mib << 20) + i * (ws_mib << 20);
		v->pages = (ws_mib << 20) / 4096;
		v->flags = GUEST_F_CHECK;
	}
	for (p = 0; p < (data_mib << 20) / 4096; p++) {
		uint64_t *w = (uint64_t *)((uint8_t *)s.data + p * 4096);

		w[0] = DATA_GPA / 4096 + p;
		w[1] = 0;
		for (i = 2; i < 512; i += 2)
			w[i] = p * 0x9e3779b97f4a7c15ull + i;
	}
	if ((ret = kvmdirty_mig_snap_new(s.g, &so, &snap, err, sizeof(err))) < 0 ||
	    (ret = kvmdirty_mig_snap_take(snap, &res, err, sizeof(err))) < 0)
		die("snapshot", ret, err);
	kvmdirty_mig_snap_free(snap);
	side_free(&s);
}

static uint64_t writes(struct side *s, unsigned int vcpus)
{
	uint64_t n = 0;
	unsigned int i;

	for (i = 0; i < vcpus; i++)
		n += testvm_mailbox(s->tv, i)->writes;
	return n;
}

static void stop(struct side *s)
{
	struct testvm_exit ex;
	unsigned int bad;

	testvm_halt_all(s->tv);
	if (testvm_join(s->tv, &bad, &ex) < 0)
		fprintf(stderr, "bench-lazy: vCPU %u: %s (the guest's check failed)\n", bad, testvm_event_name(ex.event));
}

/* Eager: the restore's time (its return: the vCPUs may run and the guest is resident). */
static double eager(const char *path, unsigned int vcpus, uint64_t gib, struct side *s)
{
	const char *chain[1] = { path };
	char err[512];
	double t;
	int ret;

	side_new(s, vcpus, gib, false);
	t = now_ms();
	if ((ret = kvmdirty_mig_restore(s->g, chain, 1, NULL, err, sizeof(err))) < 0)
		die("restore", ret, err);
	return now_ms() - t;
}

static struct kvmdirty_mig_lazy *lazy(const char *path, unsigned int vcpus, uint64_t gib, struct side *s,
				      struct kvmdirty_mig_lazy_opts *lo)
{
	const char *chain[1] = { path };
	struct kvmdirty_mig_lazy *lz;
	char err[512];
	int ret;

	side_new(s, vcpus, gib, false);
	if ((ret = kvmdirty_mig_restore_lazy(s->g, chain, 1, lo, &lz, err, sizeof(err))) < 0)
		die("restore --lazy", ret, err);
	return lz;
}

static void first_and_resident(uint64_t gib)
{
	struct kvmdirty_mig_lazy_opts lo = { 0 };
	struct kvmdirty_mig_lazy_stats st;
	struct kvmdirty_mig_lazy *lz;
	uint64_t data_mib = gib < 1 ? gib << 10 : 1024;
	char prefix[4200], path[4300], err[512];
	struct side s;
	double e, t0, first_write = -1;
	int ret;

	snprintf(prefix, sizeof(prefix), "%s/bench-lazy-%" PRIu64 "g", dir, gib);
	snprintf(path, sizeof(path), "%s-000000.snap", prefix);
	make_chain(prefix, 1, gib, data_mib, 64, 0);
	e = eager(path, 1, gib, &s);
	side_free(&s);
	t0 = now_ms();
	lz = lazy(path, 1, gib, &s, &lo);
	if (testvm_spawn(s.tv) < 0)
		die("spawn", EAGAIN, NULL);
	while (now_ms() - t0 < 10000 && first_write < 0) {
		if (writes(&s, 1))
			first_write = now_ms() - t0;
	}
	stop(&s);
	if ((ret = kvmdirty_mig_lazy_wait(lz, -1, err, sizeof(err))) < 0)
		die("lazy wait", ret, err);
	kvmdirty_mig_lazy_stats(lz, &st);
	printf("first guest_gib=%" PRIu64 " data_gib=%.2f lazy_first_ms=%.2f lazy_first_write_ms=%.2f eager_ms=%.1f "
	       "ratio=%.4f goal<=5ms %s\n",
	       gib, data_mib / 1024.0, st.first_instruction_ms, first_write, e, st.first_instruction_ms / e,
	       st.first_instruction_ms <= 5 ? "met" : "missed");
	printf("resident guest_gib=%" PRIu64 " lazy_ms=%.1f eager_ms=%.1f ratio=%.2f goal<=1.1 %s (faults=%" PRIu64
	       " filled=%" PRIu64 ", the guest running until its first write)\n",
	       gib, st.resident_ms, e, st.resident_ms / e, st.resident_ms / e <= 1.1 ? "met" : "missed", st.faults,
	       st.filled);
	kvmdirty_mig_lazy_free(lz);
	side_free(&s);
	unlink(path);
}

static void faults(unsigned int vcpus)
{
	struct kvmdirty_mig_lazy_opts lo = { .no_fill = true };
	struct kvmdirty_mig_lazy_stats st;
	struct kvmdirty_mig_lazy *lz;
	char prefix[4200], path[4300];
	struct side s;
	unsigned int i;
	int printed = 0;

	snprintf(prefix, sizeof(prefix), "%s/bench-lazy-f%u", dir, vcpus);
	snprintf(path, sizeof(path), "%s-000000.snap", prefix);
	make_chain(prefix, vcpus, 1, 32 * vcpus, 32, 0);
	lz = lazy(path, vcpus, 1, &s, &lo);
	if (testvm_spawn(s.tv) < 0)
		die("spawn", EAGAIN, NULL);
	/* until every vCPU went through its 32 MiB once (a fault a page) or 20 s */
	for (i = 0; i < 2000 && writes(&s, vcpus) < (uint64_t)vcpus * 8192; i++)
		sleep_ms(10);
	stop(&s);
	kvmdirty_mig_lazy_stats(lz, &st);
	printf("faults vcpus=%u p50_us=%.1f p99_us=%.1f max_us=%.1f faults=%" PRIu64 " goal p50<=10 %s p99<=50 %s\n",
	       vcpus, st.fault_p50_us, st.fault_p99_us, st.fault_max_us, st.faults,
	       st.fault_p50_us <= 10 ? "met" : "missed", st.fault_p99_us <= 50 ? "met" : "missed");
	/* the distribution, in coarser steps */
	{
		static const double bound[] = { 2, 5, 10, 20, 50, 100, 200, 500, 1000, 1e12 };
		uint64_t n[sizeof(bound) / sizeof(bound[0])] = { 0 };
		unsigned int k;

		for (i = 0; i < sizeof(st.hist) / sizeof(st.hist[0]); i++) {
			double b = i + 1 < sizeof(st.hist) / sizeof(st.hist[0]) ? kvmdirty_mig_lazy_bucket_us(i) : 1e12;

			for (k = 0; bound[k] < b; k++)
				;
			n[k] += st.hist[i];
		}
		printf("faults vcpus=%u distribution:", vcpus);
		for (k = 0; k < sizeof(bound) / sizeof(bound[0]); k++)
			if (bound[k] < 1e12)
				printf(" <=%gus:%" PRIu64, bound[k], n[k]);
			else
				printf(" more:%" PRIu64, n[k]);
		printf("\n");
		(void)printed;
	}
	kvmdirty_mig_lazy_free(lz);
	side_free(&s);
	unlink(path);
}

/* Pages the guest wrote in its first second after its vCPUs started. */
static uint64_t first_second(struct side *s)
{
	uint64_t n;

	if (testvm_spawn(s->tv) < 0)
		die("spawn", EAGAIN, NULL);
	sleep_ms(1000);
	n = writes(s, 1);
	stop(s);
	return n;
}

static void workset(uint64_t gib)
{
	struct kvmdirty_mig_lazy_opts lo = { 0 };
	struct kvmdirty_mig_lazy_stats st;
	struct kvmdirty_mig_lazy *lz;
	char prefix[4200], path[4300], ws[4400], err[512];
	uint64_t w_res, w_lazy, w_ws, pre;
	struct side s;
	int ret;

	snprintf(prefix, sizeof(prefix), "%s/bench-lazy-ws", dir);
	snprintf(path, sizeof(path), "%s-000000.snap", prefix);
	snprintf(ws, sizeof(ws), "%s.ws", path);
	unlink(ws);
	make_chain(prefix, 1, gib, gib << 10, 64, (gib << 10) - 64); /* the last 64 MiB: the fill's last */
	eager(path, 1, gib, &s);
	w_res = first_second(&s);
	side_free(&s);
	lo.workset_write = ws;
	lz = lazy(path, 1, gib, &s, &lo);
	w_lazy = first_second(&s);
	if ((ret = kvmdirty_mig_lazy_wait(lz, -1, err, sizeof(err))) < 0)
		die("lazy wait", ret, err);
	kvmdirty_mig_lazy_free(lz);
	side_free(&s);
	lo.workset_read = ws;
	lo.workset_write = NULL;
	lz = lazy(path, 1, gib, &s, &lo);
	w_ws = first_second(&s);
	kvmdirty_mig_lazy_stats(lz, &st);
	pre = st.prefetched;
	if ((ret = kvmdirty_mig_lazy_wait(lz, -1, err, sizeof(err))) < 0)
		die("lazy wait", ret, err);
	kvmdirty_mig_lazy_stats(lz, &st);
	printf("workset guest_gib=%" PRIu64 " touched_mib=64 resident_writes=%" PRIu64 " lazy_writes=%" PRIu64
	       " ratio=%.2f goal>=0.8 %s ws_writes=%" PRIu64 " ws_ratio=%.2f goal>=0.95 %s (workset_pages=%" PRIu64
	       ", prefetched %" PRIu64 " in the first second%s%s)\n",
	       gib, w_res, w_lazy, (double)w_lazy / w_res, (double)w_lazy / w_res >= 0.8 ? "met" : "missed", w_ws,
	       (double)w_ws / w_res, (double)w_ws / w_res >= 0.95 ? "met" : "missed", st.workset_pages, pre,
	       st.ws_note[0] ? "; " : "", st.ws_note);
	kvmdirty_mig_lazy_free(lz);
	side_free(&s);
	unlink(path);
	unlink(ws);
}

int main(int argc, char **argv)
{
	static const struct option longopts[] = { { "quick", no_argument, NULL, 'q' }, { 0 } };
	uint64_t sizes[8] = { 1, 16 }, ws_gib = 4;
	unsigned int nr_sizes = 2, i;
	char *p;
	int c, ret;

	while ((c = getopt_long(argc, argv, "D:s:w:", longopts, NULL)) != -1) {
		if (c == 'D') {
			snprintf(dir, sizeof(dir), "%s", optarg);
		} else if (c == 's') {
			for (nr_sizes = 0, p = optarg; *p && nr_sizes < 8; p++) {
				sizes[nr_sizes++] = strtoull(p, &p, 10);
				if (*p != ',')
					break;
			}
		} else if (c == 'w') {
			ws_gib = strtoull(optarg, NULL, 10);
		} else if (c == 'q') {
			sizes[0] = 1;
			nr_sizes = 1;
			ws_gib = 1;
		} else {
			fprintf(stderr, "usage: bench-lazy [-D DIR] [-s GIB,GIB] [-w GIB] [--quick]\n");
			return 2;
		}
	}
	ret = kvm_host_check("bench-lazy: ");
	if (ret)
		return ret;
	for (i = 0; i < nr_sizes; i++)
		first_and_resident(sizes[i]);
	faults(1);
	faults(8);
	workset(ws_gib);
	return 0;
}
