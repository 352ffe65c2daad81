/* SPDX-License-Identifier: MIT */
/*
 * workload: the Linux guest's load, run by /init in the initramfs.
 *
 * Writer threads rewrite a working set at a set rate, each page holding a
 * pattern that follows from its index and generation, and check what they
 * find before each rewrite: a page that a migration or a snapshot lost or
 * mixed up shows as "bad".  A timer thread counts its wake-ups, so a guest
 * timer that stalls or slows after a restore shows in tick_hz; every thread
 * checks that CLOCK_MONOTONIC never steps back ("back").
 *
 * Built static (cc -static -O2 -pthread) by examples/linux/mkguest.sh.
 *
 *   workload [--mib N] [--rate MIBPS] [--secs S] [--hz H] [--threads T]
 *   workload --exit N	write N to port 0x501 (the VMM exits with N)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/io.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define WL_EXIT_PORT	0x501
#define WL_MAX_THREADS	256
#define WL_MAX_REPORTS	8	/* BAD / BACK lines printed, each */
#define WL_GOLDEN	0x9e3779b97f4a7c15ull

struct wl_opts {
	unsigned int mib;
	unsigned int rate;	/* MiB/s over all writers, 0 = flat out */
	unsigned int secs;	/* 0 = forever */
	unsigned int hz;
	unsigned int threads;
};

struct wl_clock {
	uint64_t last;		/* this thread's previous CLOCK_MONOTONIC, ns */
	const char *who;
};

struct wl_writer {
	pthread_t tid;
	uint8_t *base;		/* this thread's share of the working set */
	uint64_t first;		/* index of its first page in the whole set */
	uint64_t npages;
	uint32_t *gen;		/* generation each page holds; 0 = never written */
	double pps;		/* pages per second, 0 = flat out */
	_Atomic uint64_t written;
};

static size_t page_size;
static atomic_bool stop;
static _Atomic uint64_t ticks, bad, back;
static atomic_uint bad_reports, back_reports;

static uint64_t ts_ns(const struct timespec *ts)
{
	return (uint64_t)ts->tv_sec * 1000000000ull + (uint64_t)ts->tv_nsec;
}

static struct timespec ns_ts(uint64_t ns)
{
	struct timespec ts = {
		.tv_sec = (time_t)(ns / 1000000000ull),
		.tv_nsec = (long)(ns % 1000000000ull),
	};

	return ts;
}

/* Read CLOCK_MONOTONIC and count a step back from this thread's last read. */
static uint64_t wl_now(struct wl_clock *c)
{
	struct timespec ts;
	uint64_t now;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	now = ts_ns(&ts);
	if (c->last && now < c->last) {
		atomic_fetch_add(&back, 1);
		if (atomic_fetch_add(&back_reports, 1) < WL_MAX_REPORTS) {
			printf("wl: BACK thread=%s prev=%" PRIu64 " now=%" PRIu64
			       " step=-%" PRIu64 "ns\n", c->who, c->last, now,
			       c->last - now);
			fflush(stdout);
		}
	}
	c->last = now;
	return now;
}

static double wl_secs(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t splitmix64(uint64_t x)
{
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/*
 * Word w of page p at generation g: the splitmix64 sequence seeded by
 * (p, g), so neighbouring pages, generations and words all differ.
 * Generation 0 is an untouched anonymous page and must read as zeros.
 */
static uint64_t wl_word(uint64_t seed, uint64_t w)
{
	return seed ? splitmix64(seed + (w + 1) * WL_GOLDEN) : 0;
}

static uint64_t wl_seed(uint64_t page, uint32_t gen)
{
	return gen ? splitmix64((page << 32) ^ gen) | 1 : 0;
}

static void wl_check_page(const uint64_t *p, uint64_t page, uint32_t gen)
{
	uint64_t seed = wl_seed(page, gen);
	size_t w, words = page_size / sizeof(*p);

	for (w = 0; w < words; w++) {
		uint64_t want = wl_word(seed, w);

		if (p[w] == want)
			continue;
		atomic_fetch_add(&bad, 1);
		if (atomic_fetch_add(&bad_reports, 1) < WL_MAX_REPORTS) {
			printf("wl: BAD page=%" PRIu64 " gen=%" PRIu32
			       " word=%zu seen=%016" PRIx64 " want=%016" PRIx64
			       "\n", page, gen, w, p[w], want);
			fflush(stdout);
		}
		return;		/* pages are counted, not words */
	}
}

static void wl_fill_page(uint64_t *p, uint64_t page, uint32_t gen)
{
	uint64_t seed = wl_seed(page, gen);
	size_t w, words = page_size / sizeof(*p);

	for (w = 0; w < words; w++)
		p[w] = wl_word(seed, w);
}

static void *wl_writer_main(void *arg)
{
	struct wl_writer *wr = arg;
	struct wl_clock clk = { .who = "writer" };
	uint64_t t0 = wl_now(&clk), done = 0, i = 0;

	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		uint64_t *p = (uint64_t *)(wr->base + i * page_size);
		uint64_t page = wr->first + i;

		wl_check_page(p, page, wr->gen[i]);
		if (++wr->gen[i] == 0)
			wr->gen[i] = 1;
		wl_fill_page(p, page, wr->gen[i]);
		atomic_store_explicit(&wr->written, ++done,
				      memory_order_relaxed);
		if (++i == wr->npages)
			i = 0;

		if (wr->pps > 0) {
			uint64_t now = wl_now(&clk);
			uint64_t due = t0 + (uint64_t)(done * 1e9 / wr->pps);
			struct timespec ts;

			/*
			 * Behind by more than 100 ms (the guest was paused,
			 * say, for a migration's last pass): start the pace
			 * anew rather than write the lost time flat out.
			 * Sleep only when 10 ms ahead: a wake-up costs
			 * milliseconds in an emulated guest, and a sleep per
			 * page would cap the rate there.
			 */
			if (now > due + 100000000ull) {
				t0 = now - (uint64_t)(done * 1e9 / wr->pps);
			} else if (due > now + 10000000ull) {
				ts = ns_ts(due);
				clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME,
						&ts, NULL);
				wl_now(&clk);
			}
		} else if ((done & 63) == 0) {
			wl_now(&clk);
		}
	}
	return NULL;
}

/*
 * Relative sleeps, one wake-up counted each: a timer that fires late or
 * not at all lowers the count (a timerfd's overruns would hide that).
 */
static void *wl_timer_main(void *arg)
{
	struct wl_clock clk = { .who = "timer" };
	struct timespec ts = ns_ts(1000000000ull / *(unsigned int *)arg);

	wl_now(&clk);
	while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
		if (clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, NULL))
			continue;
		atomic_fetch_add_explicit(&ticks, 1, memory_order_relaxed);
		wl_now(&clk);
	}
	return NULL;
}

static int wl_exit_port(const char *arg)
{
	char *end;
	long v;
	int fd;

	errno = 0;
	v = strtol(arg, &end, 0);
	if (errno || end == arg || *end || v < 0 || v > 255) {
		fprintf(stderr, "wl: --exit: bad value '%s' (0..255)\n", arg);
		return 2;
	}
	/*
	 * Through /dev/port: the kernel's OUT, not ours.  A user-mode OUT
	 * after ioperm() depends on the TSS's I/O bitmap, which the
	 * emulator under kvm-under-tcg gets wrong for a nested guest (a
	 * general protection fault on the OUT).
	 */
	fd = open("/dev/port", O_WRONLY | O_CLOEXEC);
	if (fd >= 0) {
		uint8_t b = (uint8_t)v;
		ssize_t n = pwrite(fd, &b, 1, WL_EXIT_PORT);

		close(fd);
		if (n == 1)
			return 0;
	}
	if (ioperm(WL_EXIT_PORT, 1, 1)) {
		fprintf(stderr, "wl: --exit: /dev/port and ioperm(0x%x): %s\n",
			WL_EXIT_PORT, strerror(errno));
		return 1;
	}
	outb((uint8_t)v, WL_EXIT_PORT);
	return 0;
}

static int wl_parse_uint(const char *opt, const char *arg, unsigned int min,
			 unsigned int max, unsigned int *ret_val)
{
	char *end;
	unsigned long v;

	if (!arg) {
		fprintf(stderr, "wl: %s: missing value\n", opt);
		return -EINVAL;
	}
	errno = 0;
	v = strtoul(arg, &end, 10);
	if (errno || end == arg || *end || arg[0] == '-' || v < min ||
	    v > max) {
		fprintf(stderr, "wl: %s: bad value '%s' (%u..%u)\n", opt, arg,
			min, max);
		return -EINVAL;
	}
	*ret_val = (unsigned int)v;
	return 0;
}

static int wl_parse(int argc, char **argv, struct wl_opts *o)
{
	static const struct {
		const char *name;
		size_t off;
		unsigned int min, max;
	} table[] = {
		{ "--mib", offsetof(struct wl_opts, mib), 1, 1u << 20 },
		{ "--rate", offsetof(struct wl_opts, rate), 0, 1u << 20 },
		{ "--secs", offsetof(struct wl_opts, secs), 0, 1u << 30 },
		{ "--hz", offsetof(struct wl_opts, hz), 1, 100000 },
		{ "--threads", offsetof(struct wl_opts, threads), 1,
		  WL_MAX_THREADS },
	};
	int i;

	for (i = 1; i < argc; i++) {
		char *val = strchr(argv[i], '=');
		size_t len = val ? (size_t)(val - argv[i]) : strlen(argv[i]);
		size_t k;

		for (k = 0; k < sizeof(table) / sizeof(table[0]); k++)
			if (strlen(table[k].name) == len &&
			    !strncmp(argv[i], table[k].name, len))
				break;
		if (k == sizeof(table) / sizeof(table[0])) {
			fprintf(stderr, "wl: unknown option '%s'\n", argv[i]);
			return -EINVAL;
		}
		if (val)
			val++;
		else
			val = argv[++i < argc ? i : argc];	/* NULL at end */
		if (wl_parse_uint(table[k].name, val, table[k].min,
				  table[k].max,
				  (unsigned int *)((char *)o + table[k].off)))
			return -EINVAL;
	}
	return 0;
}

int main(int argc, char **argv)
{
	struct wl_opts o = { .mib = 16, .rate = 8, .secs = 0, .hz = 100 };
	struct wl_writer *wr;
	struct wl_clock clk = { .who = "main" };
	pthread_t timer;
	uint64_t total, t_start, deadline, prev_t, prev_ticks = 0;
	uint64_t prev_pages = 0, pages = 0;
	unsigned int n = 0, t;
	uint8_t *mem;
	long cpus;

	if (argc >= 2 && !strcmp(argv[1], "--exit")) {
		if (argc != 3) {
			fprintf(stderr, "wl: --exit: takes one value\n");
			return 2;
		}
		return wl_exit_port(argv[2]);
	}
	cpus = sysconf(_SC_NPROCESSORS_ONLN);
	o.threads = cpus < 1 ? 1 : cpus > WL_MAX_THREADS ? WL_MAX_THREADS
							 : (unsigned int)cpus;
	if (wl_parse(argc, argv, &o))
		return 2;

	page_size = (size_t)sysconf(_SC_PAGESIZE);
	total = (uint64_t)o.mib * (1ull << 20) / page_size;
	/*
	 * Populated up front: the set is resident from the first line on,
	 * and first-touch faults, slow in an emulated guest, stay out of
	 * the paced rewrites.  The pages still read as zeros (generation 0).
	 */
	mem = mmap(NULL, total * page_size, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
	wr = calloc(o.threads, sizeof(*wr));
	if (mem == MAP_FAILED || !wr) {
		fprintf(stderr, "wl: cannot allocate %u MiB: %s\n", o.mib,
			strerror(errno));
		return 1;
	}

	printf("wl: start threads=%u mib=%u rate=%u hz=%u secs=%u\n",
	       o.threads, o.mib, o.rate, o.hz, o.secs);
	fflush(stdout);

	for (t = 0; t < o.threads; t++) {
		uint64_t first = total * t / o.threads;
		uint64_t end = total * (t + 1) / o.threads;

		wr[t].base = mem + first * page_size;
		wr[t].first = first;
		wr[t].npages = end - first;
		wr[t].gen = calloc(end - first, sizeof(*wr[t].gen));
		wr[t].pps = (double)o.rate * (1 << 20) / page_size / o.threads;
		if (!wr[t].gen || pthread_create(&wr[t].tid, NULL,
						 wl_writer_main, &wr[t])) {
			fprintf(stderr, "wl: cannot start writer %u\n", t);
			return 1;
		}
	}
	if (pthread_create(&timer, NULL, wl_timer_main, &o.hz)) {
		fprintf(stderr, "wl: cannot start the timer thread\n");
		return 1;
	}

	t_start = prev_t = deadline = wl_now(&clk);
	for (;;) {
		struct timespec ts;
		uint64_t now, tk;
		double dt;

		deadline += 1000000000ull;
		ts = ns_ts(deadline);
		while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts,
				       NULL) == EINTR)
			;
		now = wl_now(&clk);
		/* After a long pause: one line, then back on the second. */
		while (deadline + 1000000000ull <= now)
			deadline += 1000000000ull;

		tk = atomic_load(&ticks);
		for (pages = 0, t = 0; t < o.threads; t++)
			pages += atomic_load(&wr[t].written);
		dt = (now - prev_t) / 1e9;
		printf("wl: n=%u t=%.3f real=%.3f ticks=%" PRIu64
		       " tick_hz=%.1f pages=%" PRIu64 " mibps=%.1f bad=%" PRIu64
		       " back=%" PRIu64 " ok=%d\n", ++n, now / 1e9,
		       wl_secs(CLOCK_REALTIME), tk, (tk - prev_ticks) / dt,
		       pages, (double)(pages - prev_pages) * page_size /
		       (1 << 20) / dt, atomic_load(&bad), atomic_load(&back),
		       !atomic_load(&bad) && !atomic_load(&back));
		fflush(stdout);
		prev_t = now;
		prev_ticks = tk;
		prev_pages = pages;
		if (o.secs && now - t_start >= o.secs * 1000000000ull)
			break;
	}

	atomic_store(&stop, true);
	pthread_join(timer, NULL);
	for (pages = 0, t = 0; t < o.threads; t++) {
		pthread_join(wr[t].tid, NULL);
		pages += atomic_load(&wr[t].written);
	}
	printf("wl: end n=%u pages=%" PRIu64 " bad=%" PRIu64 " back=%" PRIu64
	       " ok=%d\n", n, pages, atomic_load(&bad), atomic_load(&back),
	       !atomic_load(&bad) && !atomic_load(&back));
	fflush(stdout);
	return atomic_load(&bad) || atomic_load(&back);
}
