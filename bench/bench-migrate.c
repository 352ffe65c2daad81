// SPDX-License-Identifier: MIT
/*
 * bench-migrate: migration over a Unix socket on this machine, against the
 * raw throughput of the same socket type measured in the same run (the
 * same number of bytes sent from a buffer and discarded).  Guest memory
 * holds non-zero data, so zero-page detection flatters nothing.  Cases: an
 * idle 2 GiB guest; a 2 GiB guest whose vCPU writes one word per page over
 * 512 MiB flat out; the same at 100 MiB/s.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "dest.h"
#include "source.h"
#include "testguest.h"

#define GUEST_MIB 2048

static bool inline_hash; /* hash on the threads that move the bytes */

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* The destination, in a child; one byte on ready once its memory is in place. */
static pid_t child_destination(int lfd, const struct mig_testvm_opts *g, int ready)
{
	pid_t pid = fork();

	if (pid == 0) {
		struct mig_recv_opts o = { .timeout_ms = 60000, .inline_hash = inline_hash };
		struct mig_recv_result res;
		struct testvm *tv = NULL;
		struct mig_guest dg;
		char err[256];
		int fd = -1;

		/* the destination's memory is in place before the source connects */
		if (mig_testvm_new(g, false, &tv, err, sizeof(err)) < 0 || mig_testvm_guest(tv, &dg) < 0 ||
		    write(ready, "r", 1) != 1 || (fd = mig_accept(lfd, err, sizeof(err))) < 0 ||
		    mig_recv(&dg, fd, &o, &res, err, sizeof(err)) < 0 ||
		    mig_testvm_resume_check(tv, 100, err, sizeof(err)) < 0) {
			fprintf(stderr, "bench-migrate: destination: %s\n", err);
			_exit(1);
		}
		_exit(0);
	}
	return pid;
}

static int run(const char *name, const struct mig_testvm_opts *g, bool verify, struct mig_result *r)
{
	struct mig_send_opts o = { .downtime_ms = 50, .max_passes = 10, .timeout_ms = 60000,
				   .peer_timeout_ms = 60000, .verify = verify, .inline_hash = inline_hash };
	char addr[108], err[512], c;
	struct mig_guest sg;
	struct testvm *tv;
	int lfd, fd, ret, st, ready[2];
	pid_t pid;

	snprintf(addr, sizeof(addr), "unix:/tmp/kvmdirty-bench-%d.sock", (int)getpid());
	lfd = mig_listen(addr, err, sizeof(err));
	if (lfd < 0 || pipe(ready)) {
		fprintf(stderr, "bench-migrate: %s\n", err);
		return -1;
	}
	/* forked before the source has threads: a child of a threaded process could inherit held locks */
	pid = child_destination(lfd, g, ready[1]);
	close(lfd);
	if (mig_testvm_new(g, true, &tv, err, sizeof(err)) < 0 || mig_testvm_guest(tv, &sg) < 0) {
		fprintf(stderr, "bench-migrate: %s: %s\n", name, err);
		return -1;
	}
	mig_testvm_fill(tv, 0);
	if (testvm_spawn(tv) < 0)
		return -1;
	nanosleep(&(struct timespec){ 0, 300000000 }, NULL);
	if (read(ready[0], &c, 1) != 1)
		c = 0;
	close(ready[0]);
	close(ready[1]);
	fd = mig_connect(addr, 10000, err, sizeof(err));
	ret = fd < 0 ? fd : mig_send(&sg, fd, &o, r, err, sizeof(err));
	if (fd >= 0)
		close(fd);
	waitpid(pid, &st, 0);
	unlink(addr + 5);
	mig_testvm_free(tv);
	if (ret != 0 || !WIFEXITED(st) || WEXITSTATUS(st)) {
		fprintf(stderr, "bench-migrate: %s: %s\n", name, ret ? err : "destination failed");
		return -1;
	}
	return 0;
}

/* The same bytes through the same socket type, from a buffer, discarded at the other end. */
static double raw_mbps(uint64_t bytes)
{
	static char buf[1 << 20];
	int sv[2];
	pid_t pid;
	double t0, t;
	uint64_t left = bytes;
	char ack;

	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		return 0;
	pid = fork();
	if (pid == 0) {
		uint64_t got = 0;

		close(sv[0]);
		while (got < bytes) {
			ssize_t k = read(sv[1], buf, sizeof(buf));

			if (k <= 0)
				_exit(1);
			got += (uint64_t)k;
		}
		_exit(write(sv[1], "k", 1) != 1);
	}
	close(sv[1]);
	memset(buf, 0x5a, sizeof(buf));
	t0 = now_ms();
	while (left) {
		ssize_t k = write(sv[0], buf, left < sizeof(buf) ? left : sizeof(buf));

		if (k <= 0)
			break;
		left -= (uint64_t)k;
	}
	if (read(sv[0], &ack, 1) != 1)
		left = bytes;
	t = now_ms() - t0;
	close(sv[0]);
	waitpid(pid, NULL, 0);
	return left ? 0 : bytes / 1048576.0 / (t / 1e3);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

static double median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/*
 * Downtime with and without verification on the same workload, in
 * alternating order, rounds times: the medians and their ratio.  Each run
 * stops where its own last pass left off, so the downtimes of single runs
 * scatter more than the verification costs; the pages sent while paused
 * are printed beside them.
 */
static int downtime(uint64_t mib, uint64_t ws_mib, int rounds)
{
	struct mig_testvm_opts g = { .mib = mib, .vcpus = 1, .mode = KVMDIRTY_MODE_CLEAR_LOG, .ws_mib = ws_mib };
	double ms[2][16], pages[2][16], us[2][16], m[2], p[2], u[2];
	struct mig_result r;
	int i, k, v;

	if (rounds > 16)
		rounds = 16;
	for (i = 0; i < rounds; i++) {
		for (k = 0; k < 2; k++) {
			v = (i + k) % 2; /* 1: verify on */
			if (run(v ? "verify" : "no-verify", &g, v, &r) < 0)
				return -1;
			ms[v][i] = r.downtime_ms;
			pages[v][i] = (double)r.downtime_pages;
			us[v][i] = r.downtime_pages ? r.downtime_ms * 1e3 / (double)r.downtime_pages : 0;
		}
	}
	for (v = 0; v < 2; v++) {
		m[v] = median(ms[v], rounds);
		p[v] = median(pages[v], rounds);
		u[v] = median(us[v], rounds);
	}
	printf("migrate downtime guest_mib=%" PRIu64 " ws_mib=%" PRIu64 " runs=%d%s verify_ms=%.1f noverify_ms=%.1f"
	       " ratio=%.2f verify_pages=%.0f noverify_pages=%.0f verify_us_per_page=%.3f noverify_us_per_page=%.3f"
	       " per_page_ratio=%.2f\n",
	       mib, ws_mib, rounds, inline_hash ? " inline_hash" : "", m[1], m[0], m[0] > 0 ? m[1] / m[0] : 0, p[1],
	       p[0], u[1], u[0], u[0] > 0 ? u[1] / u[0] : 0);
	for (v = 1; v >= 0; v--) {
		printf("  %s:", v ? "verify   " : "no-verify");
		for (i = 0; i < rounds; i++)
			printf(" %.1f", ms[v][i]);
		printf(" ms\n");
	}
	fflush(stdout);
	return 0;
}

static int throughput(void)
{
	struct mig_testvm_opts idle = { .mib = GUEST_MIB, .vcpus = 1, .mode = KVMDIRTY_MODE_CLEAR_LOG };
	struct mig_testvm_opts flat = idle, paced = idle;
	struct mig_result r;
	double mbps, raw;

	if (run("idle", &idle, true, &r) < 0)
		return -1;
	mbps = r.bytes / 1048576.0 / (r.total_ms / 1e3);
	raw = raw_mbps(r.bytes);
	printf("migrate guest_gib=%.1f total_ms=%.1f downtime_ms=%.1f mbps=%.0f raw_mbps=%.0f of_raw=%.2f"
	       " verify_after_ms=%.1f\n",
	       GUEST_MIB / 1024.0, r.total_ms, r.downtime_ms, mbps, raw, raw > 0 ? mbps / raw : 0, r.verify_ms);
	fflush(stdout);

	flat.ws_mib = 512;
	if (run("flat out", &flat, true, &r) < 0)
		return -1;
	printf("migrate workload=512mib-flat-out total_ms=%.1f downtime_ms=%.1f sent_mib=%.1f passes=%" PRIu64
	       " converged=%s\n",
	       r.total_ms, r.downtime_ms, r.bytes / 1048576.0, r.passes, r.converged ? "yes" : "no");
	fflush(stdout);

	paced.ws_mib = 512;
	paced.rate = (100ull << 20) / 4096; /* pages/s: 100 MiB/s */
	if (run("100 MiB/s", &paced, true, &r) < 0)
		return -1;
	printf("migrate workload=512mib-100mibps total_ms=%.1f downtime_ms=%.1f sent_mib=%.1f passes=%" PRIu64
	       " converged=%s\n",
	       r.total_ms, r.downtime_ms, r.bytes / 1048576.0, r.passes, r.converged ? "yes" : "no");
	fflush(stdout);
	return 0;
}

/*
 * bench-migrate [throughput|downtime [ROUNDS [MIB]]]: both by default, 5
 * rounds, 256 MiB and 2 GiB (MIB: only that one).
 */
int main(int argc, char **argv)
{
	const char *what = argc > 1 ? argv[1] : "all";
	int rounds = argc > 2 ? atoi(argv[2]) : 5, only = argc > 3 ? atoi(argv[3]) : 0;

	signal(SIGPIPE, SIG_IGN);
	if (rounds < 1)
		rounds = 1;
	if (strcmp(what, "downtime") && throughput() < 0)
		return 1;
	/* as kvmdirty-migrate chooses; BENCH_HASH=inline or thread to choose */
	inline_hash = getenv("BENCH_HASH") ? !strcmp(getenv("BENCH_HASH"), "inline") : sysconf(_SC_NPROCESSORS_ONLN) <= 2;
	if (strcmp(what, "throughput") && ((only != GUEST_MIB && downtime(256, 64, rounds) < 0) ||
					   (only != 256 && downtime(GUEST_MIB, 512, rounds) < 0)))
		return 1;
	return 0;
}
