// SPDX-License-Identifier: MIT
/*
 * bench-migrate: migration on this machine.  An idle 2 GiB guest whose
 * memory all holds non-zero data (zero-page detection flatters nothing),
 * over TCP loopback, with verification and without, against a raw transfer
 * of the same number of bytes in the same run: sent from a 2 GiB buffer as
 * the source sends from guest memory, landed in a 2 GiB buffer faulted in
 * beforehand as the destination's memory is.  A 16 GiB guest that touched
 * only 64 MiB, over TCP loopback.  Over a Unix socket: a 2 GiB guest whose
 * vCPU writes one word per page over 512 MiB flat out; the same at 100
 * MiB/s; and the downtime with verification and without.  And the
 * sessions (bench-migrate sessions): the idle guest over TCP loopback
 * plain, with a key (records sealed), with a key and encryption, over one
 * connection and two, each end's CPU time per GiB, after the cipher alone
 * on this CPU and the channel alone (bench-migrate channel, which needs
 * no guest: chan-bench.c).  And the dirty-rate sampler (bench-migrate
 * rate): measured against set rates, and a migration with it beside and
 * without.  And a keyed migration through the
 * listener's gate (gate.h) with 16 strangers trickling hellos at it, and
 * with strangers from 100 to 2,500 addresses, one connection each, against
 * the same undisturbed (bench-migrate tricklers).  And the control plane
 * (bench-migrate control): query every 10 ms during a migration whose guest
 * dirties flat out on both vCPUs, against the same beside an idle daemon.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include "chan-bench.h"
#include "daemon.h"
#include "dest.h"
#include "gate.h"
#include "handoff.h"
#include "proc-status.h"
#include "hostmem.h"
#include "rate.h"
#include "source.h"
#include "testguest-engine.h"
#include "tricklers.h"
#include "../examples/common/kvm-host.h"

#define GUEST_MIB 2048

static bool inline_hash; /* hash on the threads that move the bytes */
/* the session of the next run: a key (NULL: none), encryption, connections */
static struct mig_psk bench_psk;
static const struct mig_psk *psk;
static bool encrypt;
static unsigned int conns = 1;
/* the destination takes its stream through a gate, as kvmdirty-migrate listen does */
static bool use_gate;

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static double cpu_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int accept_next(void *ctx, uint64_t timeout_ms, char *err, size_t len)
{
	return mig_accept(*(int *)ctx, err, len);
}

/* One stream through a gate over lfd, as the daemon's listener takes it. */
static int gate_recv(int lfd, const struct mig_guest *dg, const struct mig_recv_opts *o, struct mig_recv_result *res,
		     char *err, size_t len)
{
	struct mig_session_opts so;
	struct mig_session s;
	struct mig_gate *gate;
	int ret;

	mig_recv_session_opts(o, &so);
	ret = mig_gate_new(lfd, &so, &gate);
	if (ret < 0)
		return ret;
	ret = mig_gate_take(gate, &s, err, len);
	if (ret == 0)
		ret = mig_recv_session(dg, &s, o, res, err, len);
	mig_gate_free(gate);
	return ret;
}

/*
 * Peak resident memory: VmHWM of /proc/self/status, in KiB (0 where it
 * cannot be read), from the last peak_reset() on (writing 5 to clear_refs
 * sets the peak to what is resident now).
 */
static void peak_reset(void)
{
	int fd = open("/proc/self/clear_refs", O_WRONLY | O_CLOEXEC);

	if (fd >= 0) {
		if (write(fd, "5", 1) != 1)
			fprintf(stderr, "bench-migrate: clear_refs: %s (peaks count from the start)\n", strerror(errno));
		close(fd);
	}
}

static uint64_t peak_kib(void)
{
	return proc_status_kib("VmHWM");
}

/* What the destination child tells once its guest ran on: its CPU time and its peak memory. */
struct dst_report {
	double cpu;
	uint64_t peak_kib;
};

/* the last run's destination peak (KiB) and source peak (this process, from its guest's creation) */
static uint64_t run_peak_dst, run_peak_src;

/* The destination, in a child; one byte on ready once its memory is in place. */
static pid_t child_destination(int lfd, const struct mig_testvm_opts *g, int ready)
{
	pid_t pid = fork();

	if (pid == 0) {
		struct mig_recv_opts o = { .timeout_ms = 60000, .inline_hash = inline_hash, .psk = psk,
					   .encrypt = encrypt, .accept = accept_next, .accept_ctx = &lfd };
		struct mig_recv_result res;
		struct dst_report rep = { 0 };
		struct testvm *tv = NULL;
		struct mig_guest dg;
		char err[256];
		double cpu = 0;
		int fd = -1;

		peak_reset();
		/* the destination's memory is in place before the source connects */
		if (mig_testvm_new(g, false, &tv, err, sizeof(err)) < 0 || mig_testvm_guest(tv, &dg) < 0 ||
		    mig_guest_zero_known(&dg) < 0 || write(ready, "r", 1) != 1 || (cpu = cpu_now()) < 0 ||
		    (use_gate ? gate_recv(lfd, &dg, &o, &res, err, sizeof(err))
			      : (fd = mig_accept(lfd, err, sizeof(err))) < 0 ? fd
									     : mig_recv(&dg, fd, &o, &res, err, sizeof(err))) < 0 ||
		    (cpu = cpu_now() - cpu) < 0 || mig_testvm_resume_check(tv, 100, err, sizeof(err)) < 0) {
			fprintf(stderr, "bench-migrate: destination: %s\n", err);
			_exit(1);
		}
		/* its CPU time from waiting for the source to the guest's handing over */
		rep.cpu = cpu;
		rep.peak_kib = peak_kib();
		_exit(write(ready, &rep, sizeof(rep)) != sizeof(rep));
	}
	return pid;
}

static int free_port(void)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sin);
	int fd = socket(AF_INET, SOCK_STREAM, 0), port = -1;

	if (fd >= 0 && !bind(fd, (struct sockaddr *)&sin, sizeof(sin)) && !getsockname(fd, (struct sockaddr *)&sin, &sl))
		port = ntohs(sin.sin_port);
	if (fd >= 0)
		close(fd);
	return port;
}

/* The address a run uses: a Unix socket, or TCP loopback with tcp set. */
static bool tcp;

static void bench_addr(char *addr, size_t len)
{
	if (tcp)
		snprintf(addr, len, "tcp:127.0.0.1:%d", free_port());
	else
		snprintf(addr, len, "unix:/tmp/kvmdirty-bench-%d.sock", (int)getpid());
}

static int connect_again(void *ctx, char *err, size_t len)
{
	return mig_connect(ctx, 10000, err, len);
}

/*
 * Strangers at the listener: TRICKLERS connections, each sending a
 * session hello (a key, connection 0) a byte every 400 ms and connecting
 * again as soon as it is cut, for as long as the run lasts.
 */
#define TRICKLERS 16
#define TRICKLE_MS 400

struct trickler {
	const char *addr;
	volatile bool stop;
	unsigned int cut; /* times the listener cut it */
	pthread_t thread;
};

static void *trickle(void *p)
{
	struct trickler *t = p;
	struct mig_hello h = { .magic = MIG_SESSION_MAGIC, .version = MIG_SESSION_VERSION, .flags = MIG_S_PSK,
			       .conns = 1 };
	char err[256];

	memset(h.share, 7, sizeof(h.share));
	while (!t->stop) {
		int fd = mig_connect(t->addr, 2000, err, sizeof(err));
		size_t i;

		if (fd < 0) {
			nanosleep(&(struct timespec){ 0, 50000000 }, NULL);
			continue;
		}
		/* never the whole hello: the listener waits on the last byte */
		for (i = 0; i + 1 < sizeof(h) && !t->stop; i++) {
			char c;

			if (send(fd, (char *)&h + i, 1, MSG_NOSIGNAL) != 1 || recv(fd, &c, 1, MSG_DONTWAIT) == 0)
				break;
			nanosleep(&(struct timespec){ 0, TRICKLE_MS * 1000000L }, NULL);
		}
		if (!t->stop)
			t->cut++;
		close(fd);
	}
	return NULL;
}

/* the strangers of the next run (NULL: none) */
static struct trickler *trickling;
/* strangers from this many addresses at the next run, one connection each (tricklers.h; 0: none) */
static unsigned int trickle_addrs;
static uint64_t trickle_ended; /* the last run's: their connections the listener ended */
static double run_connect_ms;	/* the last run's source's connect(2), before its total_ms */

/* Fill the source's memory: all of it non-zero (the old default), or as the options say. */
static bool fill_all = true;
/* The source's vCPUs never run (a halted guest). */
static bool halted;
/* the status of the next run's source (its control socket's), or NULL */
static struct mig_status *run_status;
/* a dirty-rate sampler beside the next run's migration, every run_sampler_ms (0: none) */
static uint64_t run_sampler_ms;
static unsigned int run_samples; /* the last run's samples taken */
static double run_sampler_cpu_ms; /* the CPU its thread took, sampling */
static uint64_t run_max_bw;	  /* the next run's max_bandwidth (MiB/s; 0: none) */

struct bench_sampler {
	struct mig_rate *r;
	_Atomic bool stop;
	unsigned int samples;
	double cpu_ms;
	pthread_t thread;
};

static void *bench_sampler_run(void *p)
{
	struct bench_sampler *b = p;
	struct mig_rate_sample smp;

	while (!b->stop) {
		nanosleep(&(struct timespec){ (time_t)(run_sampler_ms / 1000), (long)(run_sampler_ms % 1000) * 1000000 },
			  NULL);
		if (!b->stop && mig_rate_sample(b->r, &smp) == 0)
			b->samples++;
	}
	{
		struct timespec t;

		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
		b->cpu_ms = t.tv_sec * 1e3 + t.tv_nsec / 1e6;
	}
	return NULL;
}
/* the last run's CPU seconds: the source's process (its guest halted) and the destination's, each its own */
static double run_cpu_src, run_cpu_dst;

static int run(const char *name, const struct mig_testvm_opts *g, bool verify, struct mig_result *r)
{
	char addr[108], err[512], c;
	struct mig_send_opts o = { .downtime_ms = 50, .max_passes = 10, .timeout_ms = 60000,
				   .peer_timeout_ms = 60000, .verify = verify, .inline_hash = inline_hash,
				   .psk = psk, .encrypt = encrypt, .connections = conns, .connect = connect_again,
				   .connect_ctx = addr, .status = run_status, .force_switchover = run_status != NULL,
				   .max_bandwidth = run_max_bw };
	struct bench_sampler smp = { 0 };
	struct tricklers *many = NULL;
	struct mig_guest sg;
	struct testvm *tv;
	int lfd, fd, ret, st, ready[2], i;
	pid_t pid;

	bench_addr(addr, sizeof(addr));
	lfd = mig_listen(addr, err, sizeof(err));
	if (lfd < 0 || pipe(ready)) {
		fprintf(stderr, "bench-migrate: %s\n", err);
		return -1;
	}
	/* forked before the source has threads: a child of a threaded process could inherit held locks */
	pid = child_destination(lfd, g, ready[1]);
	close(lfd);
	if (pid < 0) {
		fprintf(stderr, "bench-migrate: %s: fork: %s\n", name, strerror(errno));
		return -1;
	}
	/* the comparisons with a raw transfer assume a destination faulted in beforehand: say where it is not */
	if (!g->lazy && !mig_testvm_prefaults(g, false))
		fprintf(stderr, "bench-migrate: %s: the destination's %" PRIu64 " MiB are not faulted in beforehand "
				"(more than half of the memory it may take)\n",
			name, g->mib);
	peak_reset();
	if (mig_testvm_new(g, true, &tv, err, sizeof(err)) < 0 || mig_testvm_guest(tv, &sg) < 0) {
		fprintf(stderr, "bench-migrate: %s: %s\n", name, err);
		return -1;
	}
	if (fill_all)
		mig_testvm_fill(tv, 0);
	/* an idle guest is halted: the test guest's idle loop would spin on one of two CPUs */
	if (!halted && testvm_spawn(tv) < 0)
		return -1;
	nanosleep(&(struct timespec){ 0, 300000000 }, NULL);
	close(ready[1]);
	if (read(ready[0], &c, 1) != 1)
		c = 0;
	for (i = 0; trickling && i < TRICKLERS; i++) {
		trickling[i] = (struct trickler){ .addr = addr };
		if (pthread_create(&trickling[i].thread, NULL, trickle, &trickling[i]))
			return -1;
	}
	if (trickling) /* all of them in, trickling, before the source */
		nanosleep(&(struct timespec){ 0, 500000000 }, NULL);
	if (trickle_addrs) {
		struct trickle_counts tc = { 0 };

		many = tricklers_start((uint16_t)atoi(strrchr(addr, ':') + 1), trickle_addrs, TRICKLE_MS);
		/* all of them connected, trickling, before the source */
		for (i = 0; many && i < 3000 && tc.up < trickle_addrs; i++) {
			nanosleep(&(struct timespec){ 0, 10000000 }, NULL);
			tricklers_counts(many, &tc);
		}
		if (!many || tc.up < trickle_addrs)
			fprintf(stderr, "bench-migrate: %s: %u of %u strangers connected\n", name, tc.up, trickle_addrs);
		nanosleep(&(struct timespec){ 0, 500000000 }, NULL);
	}
	if (run_sampler_ms && (mig_rate_new(tv->tracker, tv->vcpu, tv->nr_vcpus, &smp.r, err, sizeof(err)) < 0 ||
			       (pthread_create(&smp.thread, NULL, bench_sampler_run, &smp) &&
				snprintf(err, sizeof(err), "cannot start its thread") > 0))) {
		fprintf(stderr, "bench-migrate: %s: the sampler: %s\n", name, err);
		/* nothing started: the destination waits for a source that will not come */
		mig_rate_free(smp.r);
		kill(pid, SIGKILL); /* pid > 0: checked after the fork */
		waitpid(pid, NULL, 0);
		close(ready[0]);
		if (!tcp)
			unlink(addr + 5);
		mig_guest_release(&sg);
		mig_testvm_free(tv);
		return -1;
	}
	run_cpu_src = cpu_now();
	run_connect_ms = now_ms();
	fd = mig_connect(addr, 10000, err, sizeof(err));
	run_connect_ms = now_ms() - run_connect_ms;
	ret = fd < 0 ? fd : mig_send(&sg, fd, &o, r, err, sizeof(err));
	run_cpu_src = cpu_now() - run_cpu_src;
	run_peak_src = peak_kib();
	if (run_sampler_ms) {
		smp.stop = true;
		pthread_join(smp.thread, NULL);
		mig_rate_free(smp.r);
		run_samples = smp.samples;
		run_sampler_cpu_ms = smp.cpu_ms;
	}
	if (fd >= 0)
		close(fd);
	for (i = 0; trickling && i < TRICKLERS; i++)
		trickling[i].stop = true;
	for (i = 0; trickling && i < TRICKLERS; i++)
		pthread_join(trickling[i].thread, NULL);
	if (many) {
		struct trickle_counts tc;

		tricklers_stop(many, &tc);
		trickle_ended = tc.ended;
	}
	{
		struct dst_report rep;

		if (read(ready[0], &rep, sizeof(rep)) != sizeof(rep))
			rep = (struct dst_report){ 0 };
		run_cpu_dst = rep.cpu;
		run_peak_dst = rep.peak_kib;
	}
	close(ready[0]);
	waitpid(pid, &st, 0);
	if (!tcp)
		unlink(addr + 5);
	mig_guest_release(&sg);
	mig_testvm_free(tv);
	if (ret != 0 || !WIFEXITED(st) || WEXITSTATUS(st)) {
		fprintf(stderr, "bench-migrate: %s: %s\n", name, ret ? err : "destination failed");
		return -1;
	}
	return 0;
}

/*
 * The same bytes over the same kind of connection, with the engine's
 * socket buffers: sent from a 2 GiB buffer, received into a 2 GiB buffer
 * faulted in beforehand (wrapping around), as a migration moves guest
 * memory.  MiB/s from the first byte sent to the receiver's answer.
 */
static double raw_mbps(uint64_t bytes)
{
	const uint64_t size = (uint64_t)GUEST_MIB << 20;
	int lfd, fd, st, size_buf = 4 << 20;
	uint64_t left = bytes, off = 0;
	char addr[108], err[256], ack;
	uint8_t *src;
	double t0, t;
	pid_t pid;

	bench_addr(addr, sizeof(addr));
	lfd = mig_listen(addr, err, sizeof(err));
	if (lfd < 0)
		return 0;
	pid = fork();
	if (pid == 0) {
		uint8_t *dst = chanbench_faulted(size, 0);
		uint64_t got = 0;
		int c;

		c = dst ? mig_accept(lfd, err, sizeof(err)) : -1;
		if (c < 0)
			_exit(1);
		setsockopt(c, SOL_SOCKET, SO_RCVBUFFORCE, &size_buf, sizeof(size_buf));
		while (got < bytes) {
			uint64_t at = got % size, n = bytes - got < size - at ? bytes - got : size - at;
			ssize_t k = read(c, dst + at, n < (1u << 20) ? n : (1u << 20));

			if (k <= 0)
				_exit(1);
			got += (uint64_t)k;
		}
		_exit(write(c, "k", 1) != 1);
	}
	close(lfd);
	src = chanbench_faulted(size, 0x5a);
	fd = src ? mig_connect(addr, 10000, err, sizeof(err)) : -1;
	if (fd < 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		return 0;
	}
	setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &size_buf, sizeof(size_buf));
	t0 = now_ms();
	while (left) {
		uint64_t n = left < size - off ? left : size - off;
		ssize_t k = write(fd, src + off, n < (1u << 20) ? n : (1u << 20));

		if (k <= 0)
			break;
		left -= (uint64_t)k;
		off = (off + (uint64_t)k) % size;
	}
	if (read(fd, &ack, 1) != 1)
		left = bytes;
	t = now_ms() - t0;
	close(fd);
	waitpid(pid, &st, 0);
	munmap(src, size);
	if (!tcp)
		unlink(addr + 5);
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

/*
 * An idle 2 GiB guest, all memory non-zero, over TCP loopback, with and
 * without verification, against raw: rounds of (verify, raw, no verify,
 * raw), the medians, and each run's figure (this machine's two CPUs are
 * shared, so single runs scatter).
 */
static int idle(int rounds)
{
	struct mig_testvm_opts g = { .mib = GUEST_MIB, .vcpus = 1, .mode = KVMDIRTY_MODE_CLEAR_LOG };
	double mbps[2][16], raw[16 * 2], verify_ms[16], m[2], rm;
	struct mig_result r;
	int i, v, nraw = 0;

	if (rounds > 16)
		rounds = 16;
	tcp = true;
	fill_all = true;
	halted = true;
	for (i = 0; i < rounds; i++) {
		for (v = 1; v >= 0; v--) {
			if (run(v ? "idle" : "idle, no verify", &g, v, &r) < 0)
				return -1;
			mbps[v][i] = r.bytes / 1048576.0 / (r.total_ms / 1e3);
			if (v)
				verify_ms[i] = r.verify_ms;
			raw[nraw++] = raw_mbps(r.bytes);
		}
	}
	halted = false;
	rm = median(raw, nraw);
	for (v = 1; v >= 0; v--) {
		m[v] = median(mbps[v], rounds);
		printf("migrate net=loopback guest_gib=%.1f fill=all verify=%s%s runs=%d mbps=%.0f raw_mbps=%.0f of_raw=%.2f",
		       GUEST_MIB / 1024.0, v ? "on" : "off", v && inline_hash ? " inline_hash" : "", rounds, m[v], rm,
		       rm > 0 ? m[v] / rm : 0);
		if (v)
			printf(" verify_after_ms=%.1f", median(verify_ms, rounds));
		printf("\n");
	}
	for (v = 1; v >= 0; v--) {
		printf("  %s:", v ? "verify   " : "no-verify");
		for (i = 0; i < rounds; i++)
			printf(" %.0f", mbps[v][i]);
		printf(" MiB/s (sorted)\n");
	}
	printf("  raw:      ");
	for (i = 0; i < nraw; i++)
		printf(" %.0f", raw[i]);
	printf(" MiB/s (sorted)\n");
	fflush(stdout);
	return 0;
}

/* The sessions a benchmark compares: plain, sealed (MAC only), sealed and encrypted, over 1 and 2 connections. */
static const struct bench_session {
	const char *name;
	bool psk, encrypt;
	unsigned int conns;
} sess_cfg[] = {
	{ "plain", false, false, 1 },	  { "psk", true, false, 1 },	 { "psk+encrypt", true, true, 1 },
	{ "plain", false, false, 2 }, { "psk", true, false, 2 }, { "psk+encrypt", true, true, 2 },
};
enum { NSESS = sizeof(sess_cfg) / sizeof(sess_cfg[0]) };

/* the last cipher_line(): MiB/s sealing, opening, and MAC only */
static double cipher_mibps[3];

/* The cipher alone on this CPU, over the channel's records: the limit a sealed channel is measured against. */
static double cipher_line(void)
{
	double *c = cipher_mibps;

	if (chanbench_cipher(MIG_SEAL_RECORD, 0.5, c) < 0) {
		fprintf(stderr, "bench-migrate: the cipher failed\n");
		return 0;
	}
	printf("cipher aes-256-gcm record_kib=%u mibps=%.0f open_mibps=%.0f mac_only_mibps=%.0f\n", MIG_SEAL_RECORD >> 10,
	       c[0], c[1], c[2]);
	fflush(stdout);
	return c[0];
}

/*
 * The channel alone (chan-bench.c, no guest: any host), mib MiB over TCP
 * loopback in each session, rounds of all six in turn: the medians, each
 * against plain over the same connections.
 */
static int channel(int rounds, uint64_t mib)
{
	struct chanbench_result r[NSESS][16];
	double v[16], mibps[NSESS], src[NSESS], dst[NSESS];
	struct chanbench_cfg cfg = { .bytes = mib << 20 };
	int i, k;

	if (rounds > 16)
		rounds = 16;
	if (getrandom(cfg.key, sizeof(cfg.key), 0) != sizeof(cfg.key))
		return -1;
	for (i = 0; i < rounds; i++) {
		for (k = 0; k < NSESS; k++) {
			cfg.sealed = sess_cfg[k].psk;
			cfg.encrypt = sess_cfg[k].encrypt;
			cfg.conns = sess_cfg[k].conns;
			if (chanbench_run(&cfg, &r[k][i]) < 0) {
				fprintf(stderr, "bench-migrate: channel %s conns=%u: an end failed\n", sess_cfg[k].name,
					cfg.conns);
				return -1;
			}
		}
	}
	for (k = 0; k < NSESS; k++) {
		int base = sess_cfg[k].conns > 1 ? 3 : 0;

		for (i = 0; i < rounds; i++)
			v[i] = r[k][i].mibps;
		mibps[k] = median(v, rounds);
		for (i = 0; i < rounds; i++)
			v[i] = r[k][i].cpu_s_per_gib_src;
		src[k] = median(v, rounds);
		for (i = 0; i < rounds; i++)
			v[i] = r[k][i].cpu_s_per_gib_dst;
		dst[k] = median(v, rounds);
		printf("channel net=loopback session=%s conns=%u runs=%d mibps=%.0f vs_plain=%.2f cpu_s_per_gib_src=%.3f "
		       "cpu_s_per_gib_dst=%.3f\n",
		       sess_cfg[k].name, sess_cfg[k].conns, rounds, mibps[k], mibps[base] > 0 ? mibps[k] / mibps[base] : 0,
		       src[k], dst[k]);
	}
	for (k = 0; k < NSESS; k++) {
		printf("  %-11s conns=%u:", sess_cfg[k].name, sess_cfg[k].conns);
		for (i = 0; i < rounds; i++)
			printf(" %.0f", r[k][i].mibps);
		printf(" MiB/s\n");
	}
	/*
	 * Plain again, each end's pages through a 128 KiB buffer in user
	 * space: what the socket costs once the pages' copies are user
	 * space's, as they are when sealed (on a host whose kernel copies
	 * from and to cold user memory slowly, plain pays that and sealed
	 * does not).
	 */
	cfg.sealed = cfg.encrypt = false;
	cfg.staged = true;
	for (k = 0; k < 2; k++) {
		cfg.conns = k + 1;
		for (i = 0; i < rounds; i++) {
			if (chanbench_run(&cfg, &r[0][i]) < 0)
				return -1;
			v[i] = r[0][i].mibps;
		}
		printf("channel net=loopback session=plain-staged conns=%u runs=%d mibps=%.0f vs_plain=%.2f\n", cfg.conns,
		       rounds, median(v, rounds), mibps[3 * k] > 0 ? median(v, rounds) / mibps[3 * k] : 0);
	}
	fflush(stdout);
	return 0;
}

/*
 * The idle 2 GiB guest (or mib MiB; all memory non-zero, verified) over TCP loopback
 * in each session: plain, --psk (MAC only), --psk --encrypt, over one
 * connection and over two; rounds of all six in turn.  Each line: the
 * medians of the rate (guest MiB a second), the ratio to plain over the
 * same connections, and each end's CPU seconds per GiB of guest; first
 * the cipher alone on this CPU, the limit, and the channel alone.
 */
static int sessions(int rounds, int mib)
{
	struct mig_testvm_opts g = { .mib = (uint64_t)mib, .vcpus = 1, .mode = KVMDIRTY_MODE_CLEAR_LOG };
	double ms[NSESS][16], src[NSESS][16], dst[NSESS][16], m[NSESS], v[16];
	const double gib = mib / 1024.0;
	struct mig_result r;
	int i, k;

	if (rounds > 16)
		rounds = 16;
	if (!cipher_line() || channel(rounds, (uint64_t)mib) < 0)
		return -1;
	tcp = true;
	fill_all = true;
	halted = true;
	bench_psk.len = 32;
	if (getrandom(bench_psk.key, 32, 0) != 32)
		return -1;
	for (i = 0; i < rounds; i++) {
		for (k = 0; k < NSESS; k++) {
			psk = sess_cfg[k].psk ? &bench_psk : NULL;
			encrypt = sess_cfg[k].encrypt;
			conns = sess_cfg[k].conns;
			if (run(sess_cfg[k].name, &g, true, &r) < 0)
				return -1;
			ms[k][i] = r.total_ms;
			src[k][i] = run_cpu_src / gib;
			dst[k][i] = run_cpu_dst / gib;
		}
	}
	psk = NULL;
	encrypt = false;
	conns = 1;
	halted = false;
	for (k = 0; k < NSESS; k++)
		m[k] = median(ms[k], rounds);
	for (k = 0; k < NSESS; k++) {
		int base = sess_cfg[k].conns > 1 ? 3 : 0;
		double cs, cd;

		memcpy(v, src[k], sizeof(v));
		cs = median(v, rounds);
		memcpy(v, dst[k], sizeof(v));
		cd = median(v, rounds);
		printf("migrate net=loopback guest_gib=%.2f fill=all verify=on hash=%s session=%s conns=%u runs=%d total_ms=%.1f "
		       "mibps=%.0f vs_plain=%.2f cpu_s_per_gib_src=%.3f cpu_s_per_gib_dst=%.3f\n",
		       gib, inline_hash ? "inline" : "thread", sess_cfg[k].name, sess_cfg[k].conns, rounds, m[k],
		       mib / (m[k] / 1e3), m[k] > 0 ? m[base] / m[k] : 0, cs, cd);
	}
	for (k = 0; k < NSESS; k++) {
		printf("  %-11s conns=%u:", sess_cfg[k].name, sess_cfg[k].conns);
		for (i = 0; i < rounds; i++)
			printf(" %.0f", ms[k][i]);
		printf(" ms\n");
	}
	/*
	 * The goal: what sealing adds at each end per GiB, beyond the
	 * cipher's own cost on this CPU (sealing at the source, opening at
	 * the destination; the MAC alone for psk), at most 0.25x that cost.
	 * What it adds: the session's CPU less plain's over as many
	 * connections, less the cipher's.
	 */
	for (k = 0; k < NSESS; k++) {
		int base = sess_cfg[k].conns > 1 ? 3 : 0, end;

		if (!sess_cfg[k].psk)
			continue;
		for (end = 0; end < 2; end++) {
			double (*cpu)[16] = end ? dst : src, cs, cb, cipher, beyond;
			double mibps = sess_cfg[k].encrypt ? cipher_mibps[end] : cipher_mibps[2];

			memcpy(v, cpu[k], sizeof(v));
			cs = median(v, rounds);
			memcpy(v, cpu[base], sizeof(v));
			cb = median(v, rounds);
			cipher = mibps > 0 ? 1024.0 / mibps : 0;
			beyond = cs - cb - cipher;
			printf("goal sealed session=%s conns=%u end=%s cpu_s_per_gib=%.3f plain_cpu_s_per_gib=%.3f "
			       "cipher_cpu_s_per_gib=%.3f beyond_cipher=%.3f of_cipher=%.2f (goal <= 0.25): %s\n",
			       sess_cfg[k].name, sess_cfg[k].conns, end ? "dst" : "src", cs, cb, cipher, beyond,
			       cipher > 0 ? beyond / cipher : 0, cipher > 0 && beyond / cipher <= 0.25 ? "met" : "MISSED");
		}
	}
	fflush(stdout);
	return 0;
}

/*
 * The dirty-rate sampler (rate.h), right and undisturbing.  Right: a vCPU
 * dirtying a working set of twice what it writes in an interval (so no
 * page is written twice in one) at 1, 10 and 100 MiB/s, beside an idle
 * one; 5 intervals of 1 s after one let go, the guest's measured rate
 * against the set one, and what the guest itself says it wrote
 * (mig_testvm_progress()) over the same intervals.  Undisturbing: a
 * migration of a 1 GiB guest whose two vCPUs dirty 64 MiB at 10 MiB/s
 * each, over a Unix socket, with a sampler every 100 ms beside it and
 * without, rounds of both in turn: the medians of the time, of what was
 * sent and of the source's CPU, and their ratios; once as fast as it
 * goes, once capped at 160 MiB/s so that it lasts long enough for 50
 * samples and more.
 */
static int rate_bench(int rounds)
{
	static const uint64_t set_mibps[] = { 1, 10, 100 };
	/* the bitmap modes split the rate by vCPU from faults, the ring from its distinct pages */
	static const enum kvmdirty_mode modes[] = { KVMDIRTY_MODE_CLEAR_LOG, KVMDIRTY_MODE_DIRTY_RING };
	unsigned int k, i;

	for (k = 0; k < 2 * sizeof(set_mibps) / sizeof(set_mibps[0]); k++) {
		unsigned int si = k % 3;
		uint64_t ws = 2 * set_mibps[si] < 4 ? 4 : 2 * set_mibps[si];
		struct mig_testvm_opts g = { .mib = ws + 64 < 256 ? 256 : ws + 64, .vcpus = 2, .mode = modes[k / 3] };
		double measured = 0, says = 0, v0 = 0;
		struct mig_rate_sample smp;
		struct mig_rate *r = NULL;
		struct testvm *tv = NULL;
		char err[256] = "";
		uint64_t p0, p1;

		g.work[0] = (struct mig_vcpu_work){ .kind = MIG_WORK_DIRTY, .mib = ws, .rate = set_mibps[si] * 256 };
		g.work[1] = (struct mig_vcpu_work){ .kind = MIG_WORK_IDLE };
		if (mig_testvm_new(&g, true, &tv, err, sizeof(err)) < 0 ||
		    (testvm_spawn(tv) < 0 && snprintf(err, sizeof(err), "starting the vCPUs") > 0) ||
		    mig_rate_new(tv->tracker, tv->vcpu, tv->nr_vcpus, &r, err, sizeof(err)) < 0) {
			fprintf(stderr, "bench-migrate: rate %" PRIu64 " MiB/s: %s\n", set_mibps[si], err);
			mig_testvm_free(tv);
			return -1;
		}
		/* the first interval let go: the vCPU's first pass maps its pages */
		for (i = 0; i <= 5; i++) {
			p0 = mig_testvm_progress(tv, 0);
			nanosleep(&(struct timespec){ 1, 0 }, NULL);
			p1 = mig_testvm_progress(tv, 0);
			if (mig_rate_sample(r, &smp) < 0) {
				fprintf(stderr, "bench-migrate: rate: counting failed\n");
				mig_rate_free(r);
				mig_testvm_free(tv);
				return -1;
			}
			if (!i)
				continue;
			measured += smp.pages_per_s / 256.0 / 5;
			v0 += smp.vcpu_pages_per_s[0] / 256.0 / 5;
			says += (double)(p1 - p0) / (smp.ns / 1e9) / 256.0 / 5;
		}
		/* ratio: against the rate set; of_guest: against what the guest says it wrote (a host too slow for the set rate) */
		printf("rate mode=%s set_mibps=%" PRIu64 " measured_mibps=%.2f ratio=%.3f guest_says_mibps=%.2f of_guest=%.3f "
		       "vcpu0_mibps=%.2f vcpu1_pages_per_s=%" PRIu64 "\n",
		       k / 3 ? "dirty-ring" : "clear-log", set_mibps[si], measured, measured / set_mibps[si], says,
		       says > 0 ? measured / says : 0, v0, smp.vcpu_pages_per_s[1]);
		fflush(stdout);
		mig_rate_free(r);
		mig_testvm_free(tv);
	}
	/*
	 * Two migrations, each with a sampler and without, in turn: as fast
	 * as the socket goes (about a second here: few samples, the cost in
	 * time), and capped at 160 MiB/s (a 1 GiB guest, all of it data:
	 * over 6 s, 60 samples and more; the cost in the source's CPU and in
	 * what was sent, the time being the cap's).
	 */
	for (int capped = 0; capped < 2; capped++) {
		struct mig_testvm_opts g = { .mib = 1024, .vcpus = 2, .mode = KVMDIRTY_MODE_CLEAR_LOG, .ws_mib = 64,
					     .rate = 10 * 256 };
		double ms[2][16], mib[2][16], cpu[16], m[2], b[2], c;
		unsigned int samples = 0, fewest = ~0u;
		struct mig_result res;
		int on;

		if (rounds > 16)
			rounds = 16;
		tcp = false;
		fill_all = capped;
		run_max_bw = capped ? 160 : 0;
		for (i = 0; i < (unsigned int)rounds; i++) {
			for (on = 1; on >= 0; on--) {
				run_sampler_ms = on ? 100 : 0;
				if (run(on ? "sampler on" : "sampler off", &g, true, &res) < 0) {
					run_sampler_ms = 0;
					run_max_bw = 0;
					fill_all = true;
					return -1;
				}
				ms[on][i] = res.total_ms;
				mib[on][i] = res.bytes / 1048576.0;
				if (on) {
					cpu[i] = run_sampler_cpu_ms;
					samples += run_samples;
					fewest = run_samples < fewest ? run_samples : fewest;
				}
			}
		}
		run_sampler_ms = 0;
		run_max_bw = 0;
		fill_all = true;
		for (on = 0; on < 2; on++) {
			m[on] = median(ms[on], rounds);
			b[on] = median(mib[on], rounds);
		}
		c = median(cpu, rounds);
		/* sampler_cpu_ms: its own thread's CPU in a run (what else it costs shows in the time and the bytes) */
		printf("migrate sampler=on every_ms=100 cap_mibps=%s fill=%s runs=%d total_ms=%.1f sent_mib=%.1f "
		       "vs_off=%.3f sent_vs_off=%.3f samples=%u fewest_in_a_run=%u sampler_cpu_ms=%.1f of_run=%.4f\n",
		       capped ? "160" : "none", capped ? "all" : "sparse", rounds, m[1], b[1], m[0] > 0 ? m[1] / m[0] : 0,
		       b[0] > 0 ? b[1] / b[0] : 0, samples, fewest, c, m[1] > 0 ? c / m[1] : 0);
		printf("migrate sampler=off cap_mibps=%s runs=%d total_ms=%.1f sent_mib=%.1f\n", capped ? "160" : "none",
		       rounds, m[0], b[0]);
		if (capped)
			printf("goal sampler: a migration of >= 5000 ms with >= 50 samples: %s (%.0f ms, fewest %u); "
			       "vs_off=%.3f (goal <= 1.05): %s\n",
			       m[1] >= 5000 && fewest >= 50 ? "met" : "MISSED", m[1], fewest, m[1] / m[0],
			       m[1] / m[0] <= 1.05 ? "met" : "MISSED");
		fflush(stdout);
	}
	return 0;
}

/* Each run's time, undisturbed and disturbed (named so), sorted by median(). */
static void print_pair(const char *disturbed, double ms[2][16], int rounds)
{
	int i, k;

	for (k = 0; k < 2; k++) {
		printf("  %-11s:", k ? disturbed : "undisturbed");
		for (i = 0; i < rounds; i++)
			printf(" %.0f", ms[k][i]);
		printf(" ms (sorted)\n");
	}
	fflush(stdout);
}

/*
 * A keyed migration of a 256 MiB guest (all memory non-zero, verified)
 * through the destination's gate, as kvmdirty-migrate listen takes it,
 * alone and with TRICKLERS strangers trickling hellos from before the
 * source connects until it is done, in turn, rounds times: the medians,
 * and whether the disturbed one stays within the undisturbed one plus one
 * handshake's budget (MIG_HANDSHAKE_MS), the goal.
 */
static int tricklers_bench(int rounds)
{
	struct mig_testvm_opts g = { .mib = 256, .vcpus = 1, .mode = KVMDIRTY_MODE_CLEAR_LOG };
	double ms[2][16], m[2];
	unsigned int cuts = 0;
	struct mig_result r;
	int i, k, j;

	if (rounds > 16)
		rounds = 16;
	tcp = true;
	fill_all = true;
	halted = true;
	use_gate = true;
	psk = &bench_psk;
	bench_psk.len = 32;
	if (getrandom(bench_psk.key, 32, 0) != 32)
		return -1;
	for (i = 0; i < rounds; i++) {
		for (k = 0; k < 2; k++) {
			struct trickler t[TRICKLERS];

			trickling = k ? t : NULL;
			if (run(k ? "tricklers" : "undisturbed", &g, true, &r) < 0)
				return -1;
			ms[k][i] = r.total_ms;
			for (j = 0; k && j < TRICKLERS; j++)
				cuts += t[j].cut;
		}
	}
	trickling = NULL;
	m[0] = median(ms[0], rounds);
	m[1] = median(ms[1], rounds);
	printf("migrate session=psk tricklers=%d trickle_ms=%d guest_mib=256 runs=%d total_ms=%.1f undisturbed_ms=%.1f"
	       " budget_ms=%d ratio=%.2f within_budget=%s cuts=%u\n",
	       TRICKLERS, TRICKLE_MS, rounds, m[1], m[0], MIG_HANDSHAKE_MS, m[0] > 0 ? m[1] / m[0] : 0,
	       m[1] <= m[0] + MIG_HANDSHAKE_MS ? "yes" : "no", cuts);
	print_pair("tricklers", ms, rounds);
	/*
	 * Strangers from many addresses, one connection each (127.20.0.1
	 * on), each trickling a byte of a hello every TRICKLE_MS: the goal,
	 * the source served within twice its undisturbed time at 2,500.
	 */
	{
		static const unsigned int addrs[] = { 100, 300, 1000, 2500 };
		struct rlimit rl;
		unsigned int a;

		/* both ends here: this process's and the destination's (a child) */
		if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
			rl.rlim_cur = rl.rlim_max;
			setrlimit(RLIMIT_NOFILE, &rl);
		}
		for (a = 0; a < sizeof(addrs) / sizeof(addrs[0]); a++) {
			uint64_t ended = 0;

			if (rl.rlim_cur < addrs[a] + 1024) {
				printf("migrate session=psk addresses=%u: not run, RLIMIT_NOFILE %llu\n", addrs[a],
				       (unsigned long long)rl.rlim_cur);
				continue;
			}
			for (i = 0; i < rounds; i++) {
				for (k = 0; k < 2; k++) {
					trickle_addrs = k ? addrs[a] : 0;
					if (run(k ? "addresses" : "undisturbed", &g, true, &r) < 0) {
						trickle_addrs = 0;
						return -1;
					}
					/* from the source's connect: a backlog full of strangers would show there */
					ms[k][i] = run_connect_ms + r.total_ms;
					ended += k ? trickle_ended : 0;
				}
			}
			trickle_addrs = 0;
			m[0] = median(ms[0], rounds);
			m[1] = median(ms[1], rounds);
			printf("migrate session=psk addresses=%u trickle_ms=%d guest_mib=256 runs=%d connect_and_total_ms=%.1f "
			       "undisturbed_ms=%.1f ratio=%.2f within_2x=%s ended=%" PRIu64 "\n",
			       addrs[a], TRICKLE_MS, rounds, m[1], m[0], m[0] > 0 ? m[1] / m[0] : 0,
			       m[1] <= 2 * m[0] ? "yes" : "no", ended);
			print_pair("addresses", ms, rounds);
		}
	}
	use_gate = false;
	psk = NULL;
	halted = false;
	return 0;
}

/*
 * A round trip of one 128-byte message each way over a TCP loopback
 * connection, through the engine's own transport and channel as the
 * handoff's messages travel (the median of 2,000): what the commit adds to
 * the downtime at the least.
 */
static int echo_chan(int fd, bool first, double *t, int n)
{
	struct mig_conn *c = NULL;
	struct mig_chan *ch = NULL;
	char m[128] = { 0 };
	struct iovec iov;
	double t0;
	int i = 0;

	if (mig_conn_new(fd, 10000, &c) == 0 && mig_chan_new(c, NULL, &ch) == 0) {
		for (; i < n; i++) {
			t0 = now_ms();
			iov = (struct iovec){ m, sizeof(m) };
			if (!first && mig_chan_read(ch, m, sizeof(m)) != (int)sizeof(m))
				break;
			if (mig_chan_writev(ch, &iov, 1) < 0)
				break;
			if (first && mig_chan_read(ch, m, sizeof(m)) != (int)sizeof(m))
				break;
			if (t)
				t[i] = now_ms() - t0;
		}
	}
	mig_chan_free(ch);
	mig_conn_free(c);
	return i;
}

static double rtt_ms(void)
{
	double t[2000];
	char addr[108], err[256];
	int lfd, fd, n = 0;
	pid_t pid;

	tcp = true;
	bench_addr(addr, sizeof(addr));
	lfd = mig_listen(addr, err, sizeof(err));
	if (lfd < 0)
		return 0;
	pid = fork();
	if (pid == 0) {
		fd = mig_accept(lfd, err, sizeof(err));
		if (fd >= 0)
			echo_chan(fd, false, NULL, 2000);
		_exit(0);
	}
	close(lfd);
	fd = mig_connect(addr, 10000, err, sizeof(err));
	if (fd >= 0) {
		n = echo_chan(fd, true, t, 2000);
		close(fd);
	}
	waitpid(pid, NULL, 0);
	return n == 2000 ? median(t, n) : 0;
}

/* One side of a handoff over fd, for handoff_alone(): its time from READY to the ACK (source). */
struct ho_side {
	int fd;
	bool dest;
	double commit_ms;
	enum mig_outcome o;
};

static void *ho_side_main(void *p)
{
	struct ho_side *x = p;
	struct mig_handoff_times t = { 0 };
	struct mig_conn *c = NULL;
	struct mig_status st;
	char err[256];

	mig_status_init(&st, x->dest);
	if (mig_conn_new(x->fd, 10000, &c) == 0) {
		struct mig_handoff h = { .fd = x->fd, .timeout_ms = 10000, .st = &st };
		char m[128] = { 0 };
		struct iovec iov;
		int i;

		/* a connection in use, as a migration's is by its end: a few round trips first */
		if (mig_chan_new(c, NULL, &h.ch) == 0) {
			for (i = 0; i < 20; i++) {
				iov = (struct iovec){ m, sizeof(m) };
				if (x->dest ? mig_chan_read(h.ch, m, sizeof(m)) != (int)sizeof(m) || mig_chan_writev(h.ch, &iov, 1)
					    : mig_chan_writev(h.ch, &iov, 1) || mig_chan_read(h.ch, m, sizeof(m)) != (int)sizeof(m))
					break;
			}
			x->o = x->dest ? mig_handoff_dest(&h, err, sizeof(err)) : mig_handoff_source(&h, &t, err, sizeof(err));
		}
		mig_chan_free(h.ch);
	}
	mig_conn_free(c);
	mig_status_destroy(&st);
	x->commit_ms = t.commit_ms;
	return NULL;
}

/*
 * The handoff alone, no guest and no KVM: READY, COMMIT, ACK between two
 * threads over a TCP loopback connection, 500 times; the median of the
 * commit (READY's arrival to the ACK's) against the median round trip of
 * 128-byte messages through the same transport, measured in the same run.
 */
static int handoff_alone(void)
{
	double c[500], rtt;
	char addr[108], err[256];
	int lfd, i;

	tcp = true;
	for (i = 0; i < 500; i++) {
		struct ho_side s = { .dest = false }, d = { .dest = true };
		pthread_t ts, td;

		bench_addr(addr, sizeof(addr));
		lfd = mig_listen(addr, err, sizeof(err));
		s.fd = lfd < 0 ? -1 : mig_connect(addr, 10000, err, sizeof(err));
		d.fd = s.fd < 0 ? -1 : mig_accept(lfd, err, sizeof(err));
		if (lfd >= 0)
			close(lfd);
		if (d.fd < 0) {
			fprintf(stderr, "bench-migrate: handoff-alone: %s\n", err);
			return -1;
		}
		pthread_create(&ts, NULL, ho_side_main, &s);
		pthread_create(&td, NULL, ho_side_main, &d);
		pthread_join(ts, NULL);
		pthread_join(td, NULL);
		close(s.fd);
		close(d.fd);
		if (s.o != MIG_OUTCOME_THERE || d.o != MIG_OUTCOME_HERE) {
			fprintf(stderr, "bench-migrate: handoff-alone: run %d ended %d/%d\n", i, s.o, d.o);
			return -1;
		}
		c[i] = s.commit_ms;
	}
	rtt = rtt_ms();
	printf("migrate handoff-alone net=loopback runs=500 commit_ms=%.4f rtt_ms=%.4f commit_rtts=%.2f\n",
	       median(c, 500), rtt, rtt > 0 ? median(c, 500) / rtt : 0);
	fflush(stdout);
	return 0;
}

/*
 * The commit's share of the downtime: a 256 MiB guest dirtying 64 MiB at
 * 10 MiB/s, over TCP loopback, rounds runs.  downtime_ms is the pause to the ACK;
 * handoff_ms READY's arrival to the ACK's (the round trip the commit adds);
 * ready_ms END to READY (the destination's checks and vCPU loads, there
 * before the commit too).  Beside them, the loopback round trip measured
 * in the same run: the goal is a commit of at most about one of those.
 */
static int handoff_share(int rounds)
{
	/* paced at 10 MiB/s: converges on any host, so every run reaches the handoff */
	struct mig_testvm_opts g = { .mib = 256, .vcpus = 1, .mode = KVMDIRTY_MODE_CLEAR_LOG, .ws_mib = 64,
				     .rate = (10u << 20) / 4096 };
	double down[16], ho[16], ready[16], rtt, md, mh;
	struct mig_result r;
	int i;

	if (rounds > 16)
		rounds = 16;
	tcp = true;
	fill_all = true;
	for (i = 0; i < rounds; i++) {
		if (run("handoff", &g, true, &r) < 0)
			return -1;
		down[i] = r.downtime_ms;
		ho[i] = r.handoff_ms;
		ready[i] = r.ready_ms;
	}
	rtt = rtt_ms();
	md = median(down, rounds);
	mh = median(ho, rounds);
	printf("migrate handoff net=loopback guest_mib=256 ws_mib=64 mibps=10 runs=%d downtime_ms=%.2f handoff_ms=%.3f"
	       " ready_ms=%.3f rtt_ms=%.3f handoff_rtts=%.2f handoff_of_downtime=%.3f\n",
	       rounds, md, mh, median(ready, rounds), rtt, rtt > 0 ? mh / rtt : 0, md > 0 ? mh / md : 0);
	fflush(stdout);
	return 0;
}

/* A 16 GiB guest that touched only 64 MiB, idle, over TCP loopback: start to the destination's answer. */
static int sparse(void)
{
	struct mig_testvm_opts g = { .mib = 16384, .vcpus = 1, .mode = KVMDIRTY_MODE_CLEAR_LOG, .fill = 64,
				     .work = { { .kind = MIG_WORK_IDLE } } };
	struct mig_result r;

	tcp = true;
	fill_all = false;
	halted = true;
	if (run("sparse", &g, true, &r) < 0)
		return -1;
	halted = false;
	printf("migrate net=loopback guest_gib=16 touched_mib=64 total_ms=%.1f downtime_ms=%.1f handoff_ms=%.3f"
	       " sent_mib=%.1f untouched_pages=%" PRIu64 " passes=%" PRIu64 " target_ms=250 %s verify_after_ms=%.1f\n",
	       r.total_ms, r.downtime_ms, r.handoff_ms, r.bytes / 1048576.0, r.untouched_pages, r.passes,
	       r.total_ms <= 250 ? "ok" : "MISSED", r.verify_ms);
	fflush(stdout);
	return 0;
}

/*
 * The floor of a guest of gib GiB that touched 64 MiB: what the source
 * cannot avoid doing for its untouched memory, measured here on a mapping
 * of the same size and kind (private anonymous, MAP_NORESERVE, the first
 * 64 MiB written): read its pagemap in the engine's batches and walk a
 * bitmap of its pages, all set (the first pass has every page pending).
 * Milliseconds, best of three; 0 where it could not be measured.
 */
static double floor_ms(uint64_t gib)
{
	uint64_t size = gib << 30, pages = size / 4096, batch = 4096, at, untouched = 0, set = 0, best = UINT64_MAX;
	uint64_t *pme = calloc(batch, sizeof(*pme)), *bm = calloc(KVMDIRTY_BITMAP_WORDS(pages), sizeof(*bm));
	void *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	int fd = mig_pagemap_open(), k;

	if (!pme || !bm || mem == MAP_FAILED || fd < 0)
		goto out;
	memset(mem, 0x5a, 64u << 20);
	kvmdirty_bitmap_set(bm, 0, pages);
	for (k = 0; k < 3; k++) {
		double t0 = now_ms();

		untouched = 0;
		for (at = 0; at < pages; at += batch) {
			uint64_t n = pages - at < batch ? pages - at : batch, i;

			if (mig_pagemap_read(fd, (uint8_t *)mem + at * 4096, n, pme) < 0)
				goto out;
			for (i = 0; i < n; i++)
				untouched += mig_pm_untouched(pme[i]);
		}
		set = kvmdirty_bitmap_count(bm, 0, pages);
		t0 = (now_ms() - t0) * 1e3;
		if (t0 < best)
			best = (uint64_t)t0;
	}
	/* the 64 MiB written, and with transparent huge pages up to a 2 MiB page more at each end */
	if (set != pages || untouched > pages - (64u << 20) / 4096 || untouched + 1024 < pages - (64u << 20) / 4096) {
		fprintf(stderr, "bench-migrate: floor of %" PRIu64 " GiB: %" PRIu64 " untouched of %" PRIu64 " pages\n",
			gib, untouched, pages);
		best = UINT64_MAX;
	}
out:
	if (fd >= 0)
		close(fd);
	if (mem != MAP_FAILED)
		munmap(mem, size);
	free(bm);
	free(pme);
	return best == UINT64_MAX ? 0 : best / 1e3;
}

/* Least-squares slope of y over x (n >= 2 points): per GiB, from every point. */
static double slope(const uint64_t *x, const double *y, unsigned int n)
{
	double mx = 0, my = 0, sxy = 0, sxx = 0;
	unsigned int i;

	for (i = 0; i < n; i++) {
		mx += (double)x[i] / n;
		my += y[i] / n;
	}
	for (i = 0; i < n; i++) {
		sxy += ((double)x[i] - mx) * (y[i] - my);
		sxx += ((double)x[i] - mx) * ((double)x[i] - mx);
	}
	return sxx > 0 ? sxy / sxx : 0;
}

/*
 * Guests of 1, 16, 64 and 256 GiB (up to max_gib) that touched 64 MiB,
 * idle, over TCP loopback: the migration's total time against the floor
 * (floor_ms()), and each end's peak resident memory, which must grow with
 * the bitmaps and the pages sent, not with the guest.  Each point the
 * best of two migrations.  Then the slopes per untouched GiB, fitted to
 * every point (least squares).
 */
static int gib_sweep(uint64_t max_gib)
{
	static const uint64_t sizes[] = { 1, 16, 64, 256 };
	double total[4], fl[4], src[4], dst[4];
	unsigned int n = 0, i;

	tcp = true;
	fill_all = false;
	halted = true;
	for (i = 0; i < 4 && sizes[i] <= max_gib; i++, n++) {
		/* lazy: the destination's memory faulted in by what arrives, not beforehand */
		struct mig_testvm_opts g = { .mib = sizes[i] << 10, .vcpus = 1, .mode = KVMDIRTY_MODE_CLEAR_LOG,
					     .fill = 64, .work = { { .kind = MIG_WORK_IDLE } }, .lazy = true };
		struct mig_result r, best;
		int k;

		/* best of two: the first migration of a run also pays for warming up */
		for (k = 0; k < 2; k++) {
			if (run("guest size", &g, true, &r) < 0)
				return -1;
			if (!k || r.total_ms < best.total_ms)
				best = r;
			src[i] = k && src[i] > run_peak_src / 1024.0 ? src[i] : run_peak_src / 1024.0;
			dst[i] = k && dst[i] > run_peak_dst / 1024.0 ? dst[i] : run_peak_dst / 1024.0;
		}
		r = best;
		total[i] = r.total_ms;
		fl[i] = floor_ms(sizes[i]);
		printf("scale gib=%" PRIu64 " touched_mib=64 total_ms=%.1f floor_ms=%.1f of_floor=%.2f src_rss_mib=%.1f"
		       " dst_rss_mib=%.1f sent_mib=%.1f untouched_pages=%" PRIu64 " passes=%" PRIu64 "\n",
		       sizes[i], total[i], fl[i], fl[i] > 0 ? total[i] / fl[i] : 0, src[i], dst[i], r.bytes / 1048576.0,
		       r.untouched_pages, r.passes);
		fflush(stdout);
	}
	halted = false;
	if (n >= 2) {
		double ms = slope(sizes, total, n), fms = slope(sizes, fl, n);

		printf("scale gib slope from_gib=%" PRIu64 " to_gib=%" PRIu64 " ms_per_untouched_gib=%.2f"
		       " floor_ms_per_gib=%.2f of_floor=%.2f goal=2.00 src_rss_mib_per_gib=%.3f dst_rss_mib_per_gib=%.3f\n",
		       sizes[0], sizes[n - 1], ms, fms, fms > 0 ? ms / fms : 0, slope(sizes, src, n),
		       slope(sizes, dst, n));
	}
	return 0;
}

static int throughput(void)
{
	struct mig_testvm_opts flat = { .mib = GUEST_MIB, .vcpus = 1, .mode = KVMDIRTY_MODE_CLEAR_LOG };
	struct mig_testvm_opts paced = flat;
	struct mig_result r;

	tcp = false;
	fill_all = true;
	flat.ws_mib = 512;
	if (run("flat out", &flat, true, &r) < 0)
		return -1;
	printf("migrate workload=512mib-flat-out total_ms=%.1f downtime_ms=%.1f handoff_ms=%.3f sent_mib=%.1f passes=%" PRIu64
	       " converged=%s\n",
	       r.total_ms, r.downtime_ms, r.handoff_ms, r.bytes / 1048576.0, r.passes, r.converged ? "yes" : "no");
	fflush(stdout);

	paced.ws_mib = 512;
	paced.rate = (100ull << 20) / 4096; /* pages/s: 100 MiB/s */
	if (run("100 MiB/s", &paced, true, &r) < 0)
		return -1;
	printf("migrate workload=512mib-100mibps total_ms=%.1f downtime_ms=%.1f handoff_ms=%.3f sent_mib=%.1f passes=%" PRIu64
	       " converged=%s\n",
	       r.total_ms, r.downtime_ms, r.handoff_ms, r.bytes / 1048576.0, r.passes, r.converged ? "yes" : "no");
	fflush(stdout);
	return 0;
}

/*
 * The control plane: a client of the source's control socket that asks
 * query every 10 ms and times each answer, first beside an idle daemon
 * (the baseline), then during a migration whose guest dirties flat out on
 * both vCPUs (and both CPUs of this machine).
 */
#define QUERY_EVERY_MS 10
#define MAX_QUERIES 100000

struct querier {
	const char *path;
	volatile bool stop;
	double us[MAX_QUERIES];
	int n, failed;
	pthread_t thread;
};

/* One reply line from fd: false at its end or on an error. */
static bool reply_line(int fd, char *buf, size_t len)
{
	size_t n = 0;

	while (n + 1 < len) {
		ssize_t k = recv(fd, buf + n, 1, 0);

		if (k <= 0)
			return false;
		if (buf[n++] == '\n')
			break;
	}
	buf[n] = 0;
	return true;
}

static void *query_loop(void *p)
{
	struct querier *q = p;
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	char line[32768];
	double next;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	snprintf(a.sun_path, sizeof(a.sun_path), "%s", q->path);
	if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0 || !reply_line(fd, line, sizeof(line))) {
		q->failed++;
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	next = now_ms();
	while (!q->stop && q->n < MAX_QUERIES) {
		double t0 = now_ms();

		if (send(fd, "{\"execute\":\"query\"}\n", 20, MSG_NOSIGNAL) != 20 || !reply_line(fd, line, sizeof(line)) ||
		    !strstr(line, "\"return\"")) {
			q->failed++;
			break;
		}
		q->us[q->n++] = (now_ms() - t0) * 1e3;
		next += QUERY_EVERY_MS;
		if (next > now_ms())
			nanosleep(&(struct timespec){ 0, (long)((next - now_ms()) * 1e6) }, NULL);
	}
	close(fd);
	return NULL;
}

/*
 * The floor: a server thread that answers each line at once with a fixed
 * reply of a query's size, over the same kind of socket, asked by the same
 * client beside the control socket's.  What the two share is this
 * machine's scheduling under the migration's load; the difference is the
 * control plane's own.
 */
struct echo {
	int lfd;
	pthread_t thread;
};

static void *echo_loop(void *p)
{
	static const char reply[] = "{\"return\":{\"side\":\"source\",\"state\":\"precopy\",\"stream\":0,\"pass\":3,"
				    "\"bytes_sent\":123456789,\"remaining_bytes\":1234567,\"outcome\":\"pending\","
				    "\"resolved\":false}}\n";
	struct echo *e = p;
	char line[4096];
	int fd = accept(e->lfd, NULL, NULL);

	if (fd < 0 || send(fd, "{}\n", 3, MSG_NOSIGNAL) != 3) {
		if (fd >= 0)
			close(fd);
		return NULL;
	}
	while (reply_line(fd, line, sizeof(line)))
		if (send(fd, reply, sizeof(reply) - 1, MSG_NOSIGNAL) != (ssize_t)sizeof(reply) - 1)
			break;
	close(fd);
	return NULL;
}

static double percentile(double *v, int n, double pct)
{
	int i = (int)(pct / 100.0 * (n - 1) + 0.5);

	qsort(v, (size_t)n, sizeof(*v), cmp_double);
	return n ? v[i < n ? i : n - 1] : 0;
}

static int control(void)
{
	struct mig_testvm_opts g = { .mib = 1024, .vcpus = 2, .mode = KVMDIRTY_MODE_CLEAR_LOG, .ws_mib = 256 };
	const struct mig_params params = { .downtime_ms = 50, .max_passes = 10, .timeout_ms = 60000, .throttle = false };
	static struct querier idle_q, busy_q, echo_q;
	char dir[] = "/tmp/bench-control-XXXXXX", path[64], echo_path[64];
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct mig_daemon d;
	struct mig_result r;
	struct echo e;
	double p50, p99, max, i50, i99, e50, e99;
	int ret;

	if (!mkdtemp(dir))
		return -1;
	snprintf(path, sizeof(path), "%s/ctl.sock", dir);
	snprintf(echo_path, sizeof(echo_path), "%s/echo.sock", dir);
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", echo_path);
	e.lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (e.lfd < 0 || bind(e.lfd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(e.lfd, 1) < 0 ||
	    pthread_create(&e.thread, NULL, echo_loop, &e))
		return -1;
	if (mig_daemon_init(&d, false, path, &params, NULL, NULL) < 0)
		return -1;
	idle_q.path = busy_q.path = path;
	echo_q.path = echo_path;
	/* the baseline: the same client, 2 s, nothing migrating */
	pthread_create(&idle_q.thread, NULL, query_loop, &idle_q);
	nanosleep(&(struct timespec){ 2, 0 }, NULL);
	idle_q.stop = true;
	pthread_join(idle_q.thread, NULL);
	/* during a migration: the querier starts as the run does, and stops when it is over */
	pthread_create(&busy_q.thread, NULL, query_loop, &busy_q);
	pthread_create(&echo_q.thread, NULL, query_loop, &echo_q);
	fill_all = false;
	tcp = false;
	run_status = &d.st;
	ret = run("control", &g, true, &r);
	run_status = NULL;
	busy_q.stop = echo_q.stop = true;
	pthread_join(busy_q.thread, NULL);
	pthread_join(echo_q.thread, NULL);
	pthread_join(e.thread, NULL);
	close(e.lfd);
	unlink(echo_path);
	mig_daemon_fini(&d);
	rmdir(dir);
	if (ret < 0 || idle_q.failed || busy_q.failed || echo_q.failed || !busy_q.n || !idle_q.n || !echo_q.n) {
		fprintf(stderr, "bench-migrate: control: %s\n", ret < 0 ? "the migration failed" : "a query failed");
		return -1;
	}
	i50 = percentile(idle_q.us, idle_q.n, 50);
	i99 = percentile(idle_q.us, idle_q.n, 99);
	p50 = percentile(busy_q.us, busy_q.n, 50);
	p99 = percentile(busy_q.us, busy_q.n, 99);
	max = busy_q.us[busy_q.n - 1];
	e50 = percentile(echo_q.us, echo_q.n, 50);
	e99 = percentile(echo_q.us, echo_q.n, 99);
	printf("control query_us_p50=%.0f p99=%.0f max=%.0f queries=%d during a migration of %.0f ms (%" PRIu64
	       " passes, %.0f MiB, guest dirtying %" PRIu64 " MiB flat out on %u vCPUs); the same client's echo server"
	       " beside it: echo_p50=%.0f echo_p99=%.0f echo_max=%.0f p99_vs_echo=%.2f; idle daemon: idle_p50=%.0f idle_p99=%.0f;"
	       " goal_p99_us=10000\n",
	       p50, p99, max, busy_q.n, r.total_ms, r.passes, r.bytes / 1048576.0, g.ws_mib, g.vcpus, e50, e99, echo_q.us[echo_q.n - 1],
	       e99 > 0 ? p99 / e99 : 0, i50, i99);
	return 0;
}

/*
 * bench-migrate [all|idle|sparse|throughput|sessions|channel|rate|tricklers|handoff|handoff-alone|control|downtime
 * [ROUNDS [MIB]]]: every case by default, 5 rounds of downtime at 256 MiB
 * and 2 GiB (MIB: only that one); sessions and channel move 2 GiB (MIB:
 * that much instead, for a slow host).  bench-migrate gib [MAX_GIB]: the
 * guest-size sweep (not in all), its points up to MAX_GIB (256).
 */
int main(int argc, char **argv)
{
	const char *what = argc > 1 ? argv[1] : "all";
	int rounds = argc > 2 ? atoi(argv[2]) : 5, only = argc > 3 ? atoi(argv[3]) : 0;
	bool all = !strcmp(what, "all");
	uint64_t max_gib = 256;

	signal(SIGPIPE, SIG_IGN);
	/* a mistake on the command line is named first, with or without KVM */
	if (!strcmp(what, "gib") && argc > 2) {
		char *e = NULL;

		errno = 0;
		max_gib = strtoull(argv[2], &e, 10);
		if (!*argv[2] || *e || errno || max_gib < 1 || argv[2][0] == '-') {
			fprintf(stderr, "bench-migrate: gib %s: MAX_GIB is a whole number of GiB, at least 1\n", argv[2]);
			return 2;
		}
	}
	/* the measures that need no guest */
	if (!strcmp(what, "handoff-alone"))
		return handoff_alone() < 0;
	if (!strcmp(what, "channel"))
		return !cipher_line() || channel(rounds, only > 0 ? (uint64_t)only : GUEST_MIB) < 0;
	if (kvm_host_check("bench-migrate: "))
		return KVM_HOST_MISSING_EXIT;
	if (rounds < 1)
		rounds = 1;
	/* as kvmdirty-migrate chooses; BENCH_HASH=inline or thread to choose */
	inline_hash = getenv("BENCH_HASH") ? !strcmp(getenv("BENCH_HASH"), "inline") : sysconf(_SC_NPROCESSORS_ONLN) <= 2;
	if ((all || !strcmp(what, "idle")) && idle(rounds) < 0)
		return 1;
	if ((all || !strcmp(what, "sparse")) && sparse() < 0)
		return 1;
	/* not in this all (bench-scale's all runs it): a 256 GiB address space, and minutes on a slow host */
	if (!strcmp(what, "gib") && gib_sweep(max_gib) < 0)
		return 1;
	if ((all || !strcmp(what, "throughput")) && throughput() < 0)
		return 1;
	if ((all || !strcmp(what, "sessions")) && sessions(rounds, only > 0 ? only : GUEST_MIB) < 0)
		return 1;
	if ((all || !strcmp(what, "rate")) && rate_bench(rounds) < 0)
		return 1;
	if ((all || !strcmp(what, "tricklers")) && tricklers_bench(rounds) < 0)
		return 1;
	if ((all || !strcmp(what, "handoff")) && handoff_share(rounds) < 0)
		return 1;
	if ((all || !strcmp(what, "control")) && control() < 0)
		return 1;
	tcp = false;
	fill_all = true;
	if ((all || !strcmp(what, "downtime")) && ((only != GUEST_MIB && downtime(256, 64, rounds) < 0) ||
						  (only != 256 && downtime(GUEST_MIB, 512, rounds) < 0)))
		return 1;
	return 0;
}
