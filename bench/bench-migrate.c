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

#include "migrate.h"

#define GUEST_MIB 2048

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* The destination, in a child; one byte on ready once its memory is in place. */
static pid_t child_destination(int lfd, const struct mig_guest *g, int ready)
{
	pid_t pid = fork();

	if (pid == 0) {
		struct testvm *tv = NULL;
		char err[256];
		bool verified;
		int fd = -1;

		/* the destination's memory is in place before the source connects */
		if (mig_guest_new(g, false, &tv, err, sizeof(err)) < 0 || write(ready, "r", 1) != 1 ||
		    (fd = mig_accept(lfd, err, sizeof(err))) < 0 ||
		    mig_recv(tv, fd, &verified, err, sizeof(err)) < 0 || mig_resume_check(tv, 100, err, sizeof(err)) < 0) {
			fprintf(stderr, "bench-migrate: destination: %s\n", err);
			_exit(1);
		}
		_exit(0);
	}
	return pid;
}

static int run(const char *name, const struct mig_guest *g, struct mig_result *r)
{
	struct mig_send_opts o = { .downtime_ms = 50, .max_passes = 10, .timeout_ms = 60000, .verify = false };
	char addr[108], err[256], c;
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
	if (mig_guest_new(g, true, &tv, err, sizeof(err)) < 0) {
		fprintf(stderr, "bench-migrate: %s: %s\n", name, err);
		return -1;
	}
	mig_guest_fill(tv, 0);
	if (testvm_spawn(tv) < 0)
		return -1;
	nanosleep(&(struct timespec){ 0, 300000000 }, NULL);
	if (read(ready[0], &c, 1) != 1)
		c = 0;
	close(ready[0]);
	close(ready[1]);
	fd = mig_connect(addr, err, sizeof(err));
	ret = fd < 0 ? fd : mig_send(tv, fd, &o, r, err, sizeof(err));
	if (fd >= 0)
		close(fd);
	waitpid(pid, &st, 0);
	unlink(addr + 5);
	testvm_free(tv);
	if (ret < 0 || !WIFEXITED(st) || WEXITSTATUS(st)) {
		fprintf(stderr, "bench-migrate: %s: %s\n", name, ret < 0 ? err : "destination failed");
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

int main(void)
{
	struct mig_guest idle = { .mib = GUEST_MIB, .vcpus = 1, .mode = KVMDIRTY_MODE_CLEAR_LOG };
	struct mig_guest flat = idle, paced = idle;
	struct mig_result r;
	double mbps, raw;

	signal(SIGPIPE, SIG_IGN);
	if (run("idle", &idle, &r) < 0)
		return 1;
	mbps = r.bytes / 1048576.0 / (r.total_ms / 1e3);
	raw = raw_mbps(r.bytes);
	printf("migrate guest_gib=%.1f total_ms=%.1f downtime_ms=%.1f mbps=%.0f raw_mbps=%.0f of_raw=%.2f\n",
	       GUEST_MIB / 1024.0, r.total_ms, r.downtime_ms, mbps, raw, raw > 0 ? mbps / raw : 0);
	fflush(stdout);

	flat.ws_mib = 512;
	if (run("flat out", &flat, &r) < 0)
		return 1;
	printf("migrate workload=512mib-flat-out total_ms=%.1f downtime_ms=%.1f sent_mib=%.1f passes=%" PRIu64
	       " converged=%s\n",
	       r.total_ms, r.downtime_ms, r.bytes / 1048576.0, r.passes, r.converged ? "yes" : "no");
	fflush(stdout);

	paced.ws_mib = 512;
	paced.rate = (100ull << 20) / 4096; /* pages/s: 100 MiB/s */
	if (run("100 MiB/s", &paced, &r) < 0)
		return 1;
	printf("migrate workload=512mib-100mibps total_ms=%.1f downtime_ms=%.1f sent_mib=%.1f passes=%" PRIu64
	       " converged=%s\n",
	       r.total_ms, r.downtime_ms, r.bytes / 1048576.0, r.passes, r.converged ? "yes" : "no");
	return 0;
}
