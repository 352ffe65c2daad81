// SPDX-License-Identifier: MIT
/*
 * Lazy restore (kvmdirty_mig_restore_lazy(), lib/migrate/snapshot/lazy.h)
 * through the public API, with the test build of the page server (its
 * hooks hold the server or the filler at a named point).  The source: the
 * test guest with a data region whose every page holds its tag {gfn, 0}
 * and random bytes after it, never run, snapshotted whole.  Each restore
 * runs the guest one pass over its working set (GUEST_F_CHECK_EXACT: a
 * page that is not the snapshot's fails the guest's own check), and the
 * test then compares every page beyond its tag with the source's.
 *
 * Forced: a page flipped in the file after the restore began (the guest
 * must not see it, and stops); the fill holding a page it read while a
 * fault places it (EEXIST); two vCPUs faulting on one page; the guest
 * paused (a kick) while its vCPU waits on a fault; the fill's read
 * failing; the working-set file's pages placed first on the next restore.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <dirent.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include <kvmdirty-migrate.h>

#include "api-guest.h"
#include "kvm-skip.h"
#include "lazy.h"
#include "test-util.h"

#define DATA_GPA  (4ull << 30)
#define DATA_SIZE (4ull << 20)
#define PAGES	  (DATA_SIZE / 4096)
#define HOOK_WAIT_MS 3000

static char dir[] = "/tmp/kvmdirty-lazy-XXXXXX";
static char path[256];
static uint8_t *golden; /* the source's data region */

static void sleep_ms(unsigned int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

/* ---- the hook ---- */

enum mode {
	H_NONE,
	H_HOLD_FAULT,	/* hold the first fault on page `page` of the data region until released */
	H_PAIR_FAULT,	/* hold the first fault on `page` until both vCPUs wait on faults */
	H_HOLD_PLACE,	/* hold the filler's chunk holding `page` until released */
	H_FAIL_READ,	/* the filler's first read fails with EIO */
	H_ORDER,	/* record the filler's pages in order */
};

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	enum mode mode;
	uint32_t region;
	uint64_t page;
	unsigned int arrived;
	bool held, released, paired;
	uint64_t order[PAGES];
	unsigned int nr_order;
} hk = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

static bool hk_wait(bool (*cond)(void), unsigned int ms)
{
	struct timespec until;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += ms / 1000;
	until.tv_nsec += (ms % 1000) * 1000000l;
	if (until.tv_nsec >= 1000000000l) {
		until.tv_sec++;
		until.tv_nsec -= 1000000000l;
	}
	while (!cond())
		if (pthread_cond_timedwait(&hk.cond, &hk.lock, &until) == ETIMEDOUT)
			return cond();
	return true;
}

static bool is_released(void)
{
	return hk.released;
}

static bool is_held(void)
{
	return hk.held;
}

/* Threads of this process waiting on a userfault (the kernel's wait channel). */
static unsigned int waiting_on_faults(void)
{
	char wchan[64], buf[64];
	unsigned int n = 0, tid;
	FILE *f;
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;

	while (d && (e = readdir(d))) {
		if (sscanf(e->d_name, "%u", &tid) != 1)
			continue;
		snprintf(wchan, sizeof(wchan), "/proc/self/task/%u/wchan", tid);
		if ((f = fopen(wchan, "r"))) {
			n += fgets(buf, sizeof(buf), f) && !strcmp(buf, "handle_userfault");
			fclose(f);
		}
	}
	if (d)
		closedir(d);
	return n;
}

static void hook(enum mig_lazy_hook_point p, struct mig_lazy_hook *h)
{

	pthread_mutex_lock(&hk.lock);
	if ((p == MIG_LAZY_HOOK_FAULT && h->region == hk.region && h->page == hk.page &&
	     (hk.mode == H_HOLD_FAULT || hk.mode == H_PAIR_FAULT)) ||
	    (p == MIG_LAZY_HOOK_PLACE && hk.mode == H_HOLD_PLACE && h->region == hk.region && hk.page >= h->page &&
	     hk.page < h->page + h->count && !hk.held)) {
		hk.arrived++;
		if (hk.arrived == 1 && hk.mode == H_PAIR_FAULT) {
			unsigned int i;

			/* held until both vCPUs wait on a fault (the second on this page: it is the first it writes) */
			hk.held = true;
			pthread_mutex_unlock(&hk.lock);
			for (i = 0; i < HOOK_WAIT_MS * 3 && waiting_on_faults() < 2; i++)
				sleep_ms(1);
			pthread_mutex_lock(&hk.lock);
			hk.paired = waiting_on_faults() >= 2;
		} else if (hk.arrived == 1) {
			hk.held = true;
			pthread_cond_broadcast(&hk.cond);
			hk_wait(is_released, HOOK_WAIT_MS * 3);
		}
		pthread_cond_broadcast(&hk.cond);
	} else if (p == MIG_LAZY_HOOK_READ && hk.mode == H_FAIL_READ && h->fill && !hk.held) {
		hk.held = true;
		h->inject = EIO;
	} else if (p == MIG_LAZY_HOOK_PLACE && hk.mode == H_ORDER) {
		uint64_t i;

		for (i = 0; i < h->count && hk.nr_order < PAGES; i++)
			hk.order[hk.nr_order++] = (uint64_t)h->region << 48 | (h->page + i);
	}
	pthread_mutex_unlock(&hk.lock);
}

static void hk_set(enum mode m, uint64_t page)
{
	pthread_mutex_lock(&hk.lock);
	hk.mode = m;
	hk.region = 1; /* the data region: the code's comes first */
	hk.page = page;
	hk.arrived = 0;
	hk.held = hk.released = hk.paired = false;
	hk.nr_order = 0;
	pthread_mutex_unlock(&hk.lock);
	__atomic_store_n(&mig_lazy_hook, hook, __ATOMIC_RELEASE);
}

static void hk_release(void)
{
	pthread_mutex_lock(&hk.lock);
	hk.released = true;
	pthread_cond_broadcast(&hk.cond);
	pthread_mutex_unlock(&hk.lock);
}

static bool hk_wait_held(void)
{
	bool ok;

	pthread_mutex_lock(&hk.lock);
	ok = hk_wait(is_held, HOOK_WAIT_MS);
	pthread_mutex_unlock(&hk.lock);
	return ok;
}

/* ---- the guest ---- */

/* Each of the source's vCPUs' working set: vCPU i pages [i * share, (i + 1) * share), or all for shared. */
static void workloads(struct api_side *s, unsigned int vcpus, bool shared, uint32_t flags)
{
	unsigned int i;

	for (i = 0; i < vcpus; i++) {
		struct guest_vcpu *v = testvm_mailbox(s->tv, i);

		v->gpa = DATA_GPA + (shared ? 0 : i * (DATA_SIZE / vcpus));
		v->pages = shared ? PAGES : PAGES / vcpus;
		v->flags = flags;
		v->until_pass = 1;
	}
}

/* The source: data filled, snapshotted (full) into path; golden keeps its data. */
static void make_chain(unsigned int vcpus, bool shared, uint32_t flags)
{
	struct testvm_opts o = { .nr_vcpus = vcpus, .track = true, .track_opts.mode = KVMDIRTY_MODE_CLEAR_LOG };
	struct kvmdirty_mig_snap_opts so = { 0 };
	struct kvmdirty_mig_snap_result res;
	struct kvmdirty_mig_snap *snap;
	struct api_side src;
	char prefix[200], err[512];
	uint64_t p, i, x = 0x9e3779b97f4a7c15ull;

	api_side_new(&src, &o, DATA_GPA, DATA_SIZE, NULL);
	workloads(&src, vcpus, shared, flags);
	for (p = 0; p < PAGES; p++) {
		uint64_t *w = (uint64_t *)((uint8_t *)src.data + p * 4096);

		w[0] = DATA_GPA / 4096 + p;
		w[1] = 0;
		for (i = 2; i < 512; i++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			w[i] = x;
		}
	}
	memcpy(golden, src.data, DATA_SIZE);
	snprintf(prefix, sizeof(prefix), "%s/c%u", dir, vcpus);
	snprintf(path, sizeof(path), "%s-000000.snap", prefix);
	unlink(path);
	so.prefix = prefix;
	ck_assert_msg(kvmdirty_mig_snap_new(src.g, &so, &snap, err, sizeof(err)) == 0, "snap_new: %s", err);
	ck_assert_msg(kvmdirty_mig_snap_take(snap, &res, err, sizeof(err)) == 0, "snap_take: %s", err);
	kvmdirty_mig_snap_free(snap);
	api_side_free(&src);
}

struct events {
	pthread_mutex_t lock;
	unsigned int resident, failed;
	char line[1024];
};

static void on_event(void *ctx, enum kvmdirty_mig_lazy_event ev, const char *line)
{
	struct events *e = ctx;

	pthread_mutex_lock(&e->lock);
	if (ev == KVMDIRTY_MIG_LAZY_RESIDENT)
		e->resident++;
	else
		e->failed++;
	snprintf(e->line, sizeof(e->line), "%s", line);
	pthread_mutex_unlock(&e->lock);
}

struct dst {
	struct api_side s;
	struct kvmdirty_mig_lazy *lz;
	struct events ev;
};

static void dst_restore_tracked(struct dst *d, unsigned int vcpus, struct kvmdirty_mig_lazy_opts *lo, bool track)
{
	struct testvm_opts o = { .nr_vcpus = vcpus, .track = track, .track_opts.mode = KVMDIRTY_MODE_CLEAR_LOG };
	const char *chain[1] = { path };
	char err[1024];

	memset(d, 0, sizeof(*d));
	pthread_mutex_init(&d->ev.lock, NULL);
	api_side_new(&d->s, &o, DATA_GPA, DATA_SIZE, NULL);
	lo->event = on_event;
	lo->ctx = &d->ev;
	ck_assert_msg(kvmdirty_mig_restore_lazy(d->s.g, chain, 1, lo, &d->lz, err, sizeof(err)) == 0, "restore: %s", err);
}

static void dst_restore(struct dst *d, unsigned int vcpus, struct kvmdirty_mig_lazy_opts *lo)
{
	dst_restore_tracked(d, vcpus, lo, false);
}

/* Flip a byte of page `page` of the data region in the chain's file (its tag's), for the check to catch. */
static void flip_page(uint64_t page)
{
	struct {
		uint64_t gpa, size, data_off, reserved;
	} reg;
	uint64_t tag;
	int fd = open(path, O_RDWR);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, &reg, sizeof(reg), 256 + 32), (ssize_t)sizeof(reg));
	ck_assert_int_eq(pread(fd, &tag, 8, (off_t)(reg.data_off + page * 4096)), 8);
	tag ^= 0x40;
	ck_assert_int_eq(pwrite(fd, &tag, 8, (off_t)(reg.data_off + page * 4096)), 8);
	close(fd);
}

static void dst_free(struct dst *d)
{
	kvmdirty_mig_lazy_free(d->lz);
	api_side_free(&d->s);
}

/* Every data page as the source had it beyond its tag, and its tag {gfn, pass}. */
static void same_as_golden(struct dst *d, uint64_t pass)
{
	uint64_t p;

	for (p = 0; p < PAGES; p++) {
		const uint64_t *w = (const uint64_t *)((uint8_t *)d->s.data + p * 4096);

		ck_assert_msg(w[0] == DATA_GPA / 4096 + p && w[1] == pass, "page %" PRIu64 ": tag {%" PRIu64 ", %" PRIu64 "}",
			      p, w[0], w[1]);
		ck_assert_msg(!memcmp(w + 2, golden + p * 4096 + 16, 4096 - 16),
			      "page %" PRIu64 ": not the snapshot's bytes", p);
	}
}

static void run_to_done(struct dst *d)
{
	struct testvm_exit ex;
	unsigned int bad = 0;
	int ret = testvm_join(d->s.tv, &bad, &ex);

	ck_assert_msg(ret == 0, "vCPU %u: %s (err_gpa 0x%" PRIx64 ", tag {%" PRIu64 ", %" PRIu64 "})", bad,
		      testvm_event_name(ex.event), testvm_mailbox(d->s.tv, bad)->err_gpa,
		      testvm_mailbox(d->s.tv, bad)->err_tag[0], testvm_mailbox(d->s.tv, bad)->err_tag[1]);
}

static void setup(void)
{
	strcpy(dir, "/tmp/kvmdirty-lazy-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	golden = malloc(DATA_SIZE);
	ck_assert_ptr_nonnull(golden);
}

static void teardown(void)
{
	char cmd[300];

	__atomic_store_n(&mig_lazy_hook, NULL, __ATOMIC_RELEASE);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", dir);
	free(golden);
}

/* The plain case: the guest runs at once, every page right, resident, the working-set file written. */
START_TEST(restores_whole)
{
	struct kvmdirty_mig_lazy_opts lo = { 0 };
	struct kvmdirty_mig_lazy_stats st;
	struct dst d;
	char ws[300], err[1024];

	make_chain(2, false, GUEST_F_CHECK_EXACT);
	snprintf(ws, sizeof(ws), "%s.ws", path);
	lo.workset_write = ws;
	dst_restore(&d, 2, &lo);
	ck_assert_int_eq(testvm_spawn(d.s.tv), 0);
	run_to_done(&d);
	ck_assert_msg(kvmdirty_mig_lazy_wait(d.lz, 60000, err, sizeof(err)) == 0, "wait: %s", err);
	kvmdirty_mig_lazy_stats(d.lz, &st);
	ck_assert(st.resident && !st.failed);
	ck_assert_int_eq(d.ev.resident, 1);
	same_as_golden(&d, 1);
	ck_assert_msg(access(ws, F_OK) == 0, "no working-set file");
	dst_free(&d);
}
END_TEST

/*
 * A page flipped in the file after the restore began, which the guest
 * then touches: never placed, the guest paused, the file and page named.
 * Red without the check before UFFDIO_COPY: the guest's own check meets
 * the flipped tag (an ERROR exit).
 */
START_TEST(flipped_page_never_seen)
{
	struct kvmdirty_mig_lazy_opts lo = { .no_fill = true };
	struct dst d;
	char err[1024], page[64];
	uint64_t victim = PAGES / 2 + 3;
	int ret;

	make_chain(1, false, GUEST_F_CHECK_EXACT);
	dst_restore(&d, 1, &lo);
	flip_page(victim);
	ck_assert_int_eq(testvm_spawn(d.s.tv), 0);
	ret = kvmdirty_mig_lazy_wait(d.lz, 60000, err, sizeof(err));
	ck_assert_msg(ret == -EPROTO, "wait: %d %s", ret, err);
	snprintf(page, sizeof(page), "region 1 page %" PRIu64 " ", victim);
	ck_assert_msg(strstr(err, path) && strstr(err, page) && strstr(err, "not its hash"), "%s", err);
	ck_assert_int_eq(d.ev.failed, 1);
	/* paused before it got past the page (the pages after a fault are read with it: it may stop short), no error */
	sleep_ms(50);
	ck_assert_uint_le(testvm_mailbox(d.s.tv, 0)->writes, victim);
	testvm_halt_all(d.s.tv);
	{
		struct testvm_exit ex;
		unsigned int bad;

		ret = testvm_join(d.s.tv, &bad, &ex);
		ck_assert_msg(ret == 0, "the guest saw something: %s", testvm_event_name(ex.event));
	}
	dst_free(&d);
}
END_TEST

/* The fill holds a chunk it read and checked while a fault places one of its pages: EEXIST, all right. */
START_TEST(fill_and_fault_on_one_page)
{
	struct kvmdirty_mig_lazy_opts lo = { 0 };
	struct kvmdirty_mig_lazy_stats st;
	struct dst d;
	char err[1024];
	uint64_t page = 700;
	volatile uint64_t *w;

	make_chain(1, false, GUEST_F_CHECK_EXACT);
	hk_set(H_HOLD_PLACE, page);
	dst_restore(&d, 1, &lo);
	ck_assert_msg(hk_wait_held(), "the filler never read page %" PRIu64, page);
	/* a fault on it while the filler holds its copy: the server places it */
	w = (volatile uint64_t *)((uint8_t *)d.s.data + page * 4096);
	ck_assert_uint_eq(w[0], DATA_GPA / 4096 + page);
	hk_release();
	ck_assert_msg(kvmdirty_mig_lazy_wait(d.lz, 60000, err, sizeof(err)) == 0, "wait: %s", err);
	kvmdirty_mig_lazy_stats(d.lz, &st);
	ck_assert_uint_ge(st.raced, 1);
	ck_assert_int_eq(testvm_spawn(d.s.tv), 0);
	run_to_done(&d);
	same_as_golden(&d, 1);
	dst_free(&d);
}
END_TEST

/*
 * Two vCPUs fault on the same page at once (the server holds the first
 * until both vCPU threads wait in the kernel on a userfault): both see it
 * right, every page the snapshot's.
 */
START_TEST(two_vcpus_one_page)
{
	struct kvmdirty_mig_lazy_opts lo = { .no_fill = true };
	struct dst d;
	uint64_t p;

	make_chain(2, true, GUEST_F_CHECK);
	hk_set(H_PAIR_FAULT, 0);
	dst_restore(&d, 2, &lo);
	ck_assert_int_eq(testvm_spawn(d.s.tv), 0);
	run_to_done(&d);
	pthread_mutex_lock(&hk.lock);
	ck_assert_msg(hk.paired, "the second vCPU never waited on a fault while the first's was held");
	pthread_mutex_unlock(&hk.lock);
	for (p = 0; p < PAGES; p++) {
		const uint64_t *w = (const uint64_t *)((uint8_t *)d.s.data + p * 4096);

		ck_assert_msg(w[0] == DATA_GPA / 4096 + p && w[1] == 1, "page %" PRIu64, p);
		ck_assert_msg(!memcmp(w + 2, golden + p * 4096 + 16, 4096 - 16), "page %" PRIu64 ": not the snapshot's", p);
	}
	dst_free(&d);
}
END_TEST

/*
 * The guest paused (each vCPU kicked) while its vCPU waits on a fault the
 * server holds: the pause completes, and after it the guest runs on right.
 */
START_TEST(paused_while_fault_pending)
{
	struct kvmdirty_mig_lazy_opts lo = { .no_fill = true };
	struct dst d;

	make_chain(1, false, GUEST_F_CHECK_EXACT);
	/* page 0's fault brings 1-15 with it: 16 is the next to fault */
	hk_set(H_HOLD_FAULT, 16);
	dst_restore(&d, 1, &lo);
	ck_assert_int_eq(testvm_spawn(d.s.tv), 0);
	ck_assert_msg(hk_wait_held(), "no fault on page 16");
	testvm_pause_all(d.s.tv);
	/* out of KVM_RUN with its fault unserved */
	pthread_mutex_lock(&hk.lock);
	ck_assert_msg(!hk.released, "the pause waited for the fault");
	pthread_mutex_unlock(&hk.lock);
	ck_assert_uint_eq(testvm_mailbox(d.s.tv, 0)->writes, 16);
	hk_release();
	sleep_ms(20);
	testvm_resume_all(d.s.tv);
	run_to_done(&d);
	same_as_golden(&d, 1);
	dst_free(&d);
}
END_TEST

/* The fill's read fails: the restore fails by name, the guest paused. */
START_TEST(fill_read_fails)
{
	struct kvmdirty_mig_lazy_opts lo = { 0 };
	struct dst d;
	char err[1024];
	int ret;

	make_chain(1, false, GUEST_F_CHECK_EXACT);
	hk_set(H_FAIL_READ, 0);
	dst_restore(&d, 1, &lo);
	ck_assert_int_eq(testvm_spawn(d.s.tv), 0);
	ret = kvmdirty_mig_lazy_wait(d.lz, 60000, err, sizeof(err));
	ck_assert_msg(ret == -EIO && strstr(err, path) && strstr(err, "Input/output error"), "wait: %d %s", ret, err);
	ck_assert_int_eq(d.ev.failed, 1);
	testvm_halt_all(d.s.tv);
	{
		struct testvm_exit ex;
		unsigned int bad;

		ck_assert_int_eq(testvm_join(d.s.tv, &bad, &ex), 0);
	}
	dst_free(&d);
}
END_TEST

/*
 * A restore records the pages its faults brought in; the next restore of
 * the chain places exactly those first, in that order.  A damaged file is
 * left unused, by name.
 */
START_TEST(working_set_first)
{
	struct kvmdirty_mig_lazy_opts lo = { 0 };
	struct kvmdirty_mig_lazy_stats st;
	struct dst d;
	char ws[300], err[1024];
	uint64_t rec[64], i, n;
	int fd;

	make_chain(1, false, GUEST_F_CHECK_EXACT);
	snprintf(ws, sizeof(ws), "%s.ws", path);
	/* the host touches 64 pages 16 apart (each fault brings the 15 after it), scrambled, while the fill waits */
	for (n = 0; n < 64; n++)
		rec[n] = (n * 37 % 64) * 16;
	lo.workset_write = ws;
	hk_set(H_HOLD_PLACE, 0); /* the fill waits at its first chunk until the host touched the 64 */
	dst_restore(&d, 1, &lo);
	ck_assert(hk_wait_held());
	for (i = 0; i < 64; i++)
		ck_assert_uint_eq(((volatile uint64_t *)((uint8_t *)d.s.data + rec[i] * 4096))[0], DATA_GPA / 4096 + rec[i]);
	hk_release();
	ck_assert_msg(kvmdirty_mig_lazy_wait(d.lz, 60000, err, sizeof(err)) == 0, "wait: %s", err);
	dst_free(&d);
	/* the third: with the file, the fill's first 64 pages are those, in order */
	lo.workset_read = ws;
	lo.workset_write = NULL;
	hk_set(H_ORDER, 0);
	dst_restore(&d, 1, &lo);
	ck_assert_msg(kvmdirty_mig_lazy_wait(d.lz, 60000, err, sizeof(err)) == 0, "wait: %s", err);
	kvmdirty_mig_lazy_stats(d.lz, &st);
	ck_assert_msg(st.workset_pages >= 64, "the file lists %" PRIu64 " pages (%s)", st.workset_pages, st.ws_note);
	pthread_mutex_lock(&hk.lock);
	ck_assert_uint_ge(hk.nr_order, 64);
	/* the touched pages, in the order touched, among the fill's first (each with the 15 after it) */
	for (i = 0, n = 0; i < hk.nr_order && n < 64; i++) {
		if (hk.order[i] >> 48 != 1 || (hk.order[i] & 15))
			continue;
		ck_assert_msg((hk.order[i] & 0xffffffffffffull) == rec[n], "placed %" PRIu64 "th: page %" PRIu64
			      ", the working set's %" PRIu64, n, (uint64_t)(hk.order[i] & 0xffffffffffffull), rec[n]);
		n++;
	}
	pthread_mutex_unlock(&hk.lock);
	ck_assert_uint_eq(st.prefetched, st.workset_pages);
	dst_free(&d);
	/* damaged: left unused, and said */
	fd = open(ws, O_RDWR);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pwrite(fd, "X", 1, 60), 1);
	close(fd);
	hk_set(H_NONE, 0);
	dst_restore(&d, 1, &lo);
	ck_assert_msg(kvmdirty_mig_lazy_wait(d.lz, 60000, err, sizeof(err)) == 0, "wait: %s", err);
	kvmdirty_mig_lazy_stats(d.lz, &st);
	ck_assert_msg(st.workset_pages == 0 && strstr(st.ws_note, "damaged"), "note: %s", st.ws_note);
	ck_assert_int_eq(testvm_spawn(d.s.tv), 0);
	run_to_done(&d);
	same_as_golden(&d, 1);
	dst_free(&d);
}
END_TEST

/*
 * A VMM thread reads a page that fails its check: it is not held for
 * ever (the zero page once the guest is paused, never the copy), and the
 * restore fails by name.  Red before: the read waited in the kernel for
 * good (the server never answered a bad page).
 */
START_TEST(bad_page_read_by_the_vmm)
{
	struct kvmdirty_mig_lazy_opts lo = { .no_fill = true };
	struct dst d;
	char err[1024];
	uint64_t v;

	make_chain(1, false, GUEST_F_CHECK_EXACT);
	dst_restore(&d, 1, &lo);
	flip_page(77);
	v = ((volatile uint64_t *)((uint8_t *)d.s.data + 77 * 4096))[0];
	ck_assert_msg(v == 0, "the VMM read 0x%" PRIx64 " from the damaged page", v);
	ck_assert_int_eq(kvmdirty_mig_lazy_wait(d.lz, 60000, err, sizeof(err)), -EPROTO);
	ck_assert_msg(strstr(err, "region 1 page 77 "), "%s", err);
	dst_free(&d);
}
END_TEST

/*
 * A page placed, then discarded by the VMM (MADV_DONTNEED) before the
 * guest is resident: touched again, it comes again.  Red before: the
 * server only woke a fault on a page it had placed, and the touch
 * faulted for ever.
 */
START_TEST(discarded_page_comes_again)
{
	struct kvmdirty_mig_lazy_opts lo = { .no_fill = true };
	struct dst d;
	uint8_t *pg;

	make_chain(1, false, GUEST_F_CHECK_EXACT);
	dst_restore(&d, 1, &lo);
	pg = (uint8_t *)d.s.data + 300 * 4096;
	ck_assert_uint_eq(((volatile uint64_t *)pg)[0], DATA_GPA / 4096 + 300);
	ck_assert_int_eq(madvise(pg, 4096, MADV_DONTNEED), 0);
	ck_assert_uint_eq(((volatile uint64_t *)pg)[0], DATA_GPA / 4096 + 300);
	ck_assert(!memcmp(pg + 16, golden + 300 * 4096 + 16, 4096 - 16));
	dst_free(&d);
}
END_TEST

/*
 * A snapshot of the restored guest before it is resident is refused
 * (-EBUSY): its memory is not all there, and what the server placed is
 * in no dirty log.  Once resident it is taken, and restores right.  Red
 * before: the snapshot was taken, "data_pages=0", every page lost.
 */
START_TEST(snapshot_waits_for_resident)
{
	struct kvmdirty_mig_lazy_opts lo = { 0 };
	struct kvmdirty_mig_snap_opts so = { 0 };
	struct kvmdirty_mig_snap *snap = NULL;
	struct kvmdirty_mig_snap_result res;
	struct dst d;
	char prefix[200], err[1024];

	make_chain(1, false, GUEST_F_CHECK_EXACT);
	hk_set(H_HOLD_PLACE, 0); /* the fill held: not resident */
	dst_restore_tracked(&d, 1, &lo, true);
	ck_assert(hk_wait_held());
	snprintf(prefix, sizeof(prefix), "%s/again", dir);
	so.prefix = prefix;
	ck_assert_int_eq(kvmdirty_mig_snap_new(d.s.g, &so, &snap, err, sizeof(err)), -EBUSY);
	ck_assert_msg(strstr(err, "lazy restore"), "%s", err);
	hk_release();
	ck_assert_msg(kvmdirty_mig_lazy_wait(d.lz, 60000, err, sizeof(err)) == 0, "wait: %s", err);
	ck_assert_msg(kvmdirty_mig_snap_new(d.s.g, &so, &snap, err, sizeof(err)) == 0, "snap_new: %s", err);
	ck_assert_msg(kvmdirty_mig_snap_take(snap, &res, err, sizeof(err)) == 0, "snap_take: %s", err);
	ck_assert_uint_ge(res.data_pages, PAGES);
	kvmdirty_mig_snap_free(snap);
	dst_free(&d);
}
END_TEST

/* A FIFO where the working-set file should be: not opened for ever, left unused by name. */
START_TEST(workset_fifo)
{
	struct kvmdirty_mig_lazy_opts lo = { 0 };
	struct kvmdirty_mig_lazy_stats st;
	struct dst d;
	char ws[300], err[1024];

	make_chain(1, false, GUEST_F_CHECK_EXACT);
	snprintf(ws, sizeof(ws), "%s/fifo.ws", dir);
	ck_assert_int_eq(mkfifo(ws, 0600), 0);
	lo.workset_read = ws;
	dst_restore(&d, 1, &lo);
	ck_assert_msg(kvmdirty_mig_lazy_wait(d.lz, 60000, err, sizeof(err)) == 0, "wait: %s", err);
	kvmdirty_mig_lazy_stats(d.lz, &st);
	ck_assert_msg(strstr(st.ws_note, "not a regular file"), "note: %s", st.ws_note);
	dst_free(&d);
}
END_TEST

/*
 * A page the fill placed (checked), then discarded by the VMM while the
 * file's copy of it changed, inside the range the server places after a
 * fault: that range's copy of the page is never placed unchecked.  The
 * hook holds the fill at its first chunk until the server reads the pages
 * after page 10; the fill then places pages 0-255, the page 12 is
 * discarded and its tag flipped in the file, and the server goes on.  Red
 * (helper attack) when the server copied its whole range after a check
 * that skipped pages placed meanwhile: "resident with an unchecked, wrong
 * page 12: tag 0x10004c".
 */
static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int stage; /* 1: the server at page 11's read; 2: the fill past chunk 0; 3: the fill may go on */
	uint8_t *hva;
	int hits;
} dc = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

static void dc_wait(int stage)
{
	struct timespec until;

	clock_gettime(CLOCK_REALTIME, &until);
	until.tv_sec += 5;
	while (dc.stage < stage)
		if (pthread_cond_timedwait(&dc.cond, &dc.lock, &until) == ETIMEDOUT)
			break;
}

static void dc_hook(enum mig_lazy_hook_point p, struct mig_lazy_hook *h)
{
	if (p != MIG_LAZY_HOOK_READ || h->region != 1)
		return;
	pthread_mutex_lock(&dc.lock);
	if (h->fill && h->count > 15 && h->page == 0) {
		dc_wait(1);
	} else if (h->fill && h->count > 15 && h->page >= 256 && dc.stage == 1) {
		dc.stage = 2;
		pthread_cond_broadcast(&dc.cond);
		dc_wait(3);
	} else if (h->page == 11 && h->count <= 15) {
		dc.hits++;
		dc.stage = 1;
		pthread_cond_broadcast(&dc.cond);
		dc_wait(2);
		madvise(dc.hva + 12 * 4096, 4096, MADV_DONTNEED);
		pthread_mutex_unlock(&dc.lock);
		flip_page(12);
		return;
	}
	pthread_mutex_unlock(&dc.lock);
}

START_TEST(discarded_page_in_the_range_after_a_fault)
{
	struct kvmdirty_mig_lazy_opts lo = { 0 };
	struct dst d;
	char err[1024];
	uint64_t v;
	int ret;

	make_chain(1, false, GUEST_F_CHECK_EXACT);
	__atomic_store_n(&mig_lazy_hook, dc_hook, __ATOMIC_RELEASE);
	dst_restore(&d, 1, &lo);
	pthread_mutex_lock(&dc.lock);
	dc.hva = d.s.data;
	pthread_mutex_unlock(&dc.lock);
	ck_assert_uint_eq(((volatile uint64_t *)((uint8_t *)d.s.data + 10 * 4096))[0], DATA_GPA / 4096 + 10);
	sleep_ms(300);
	pthread_mutex_lock(&dc.lock);
	ck_assert_int_eq(dc.hits, 1);
	dc.stage = 3;
	pthread_cond_broadcast(&dc.cond);
	pthread_mutex_unlock(&dc.lock);
	ret = kvmdirty_mig_lazy_wait(d.lz, 60000, err, sizeof(err));
	/* resident (the page discarded reads as zero) or failed on the changed copy: never that copy */
	v = ((volatile uint64_t *)((uint8_t *)d.s.data + 12 * 4096))[0];
	ck_assert_msg(v == 0 || v == DATA_GPA / 4096 + 12, "wait %d (%s), and page 12 holds tag 0x%" PRIx64, ret,
		      ret ? err : "resident", v);
	dst_free(&d);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("lazy");
	TCase *tc = tcase_create("lazy");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 240);
	tcase_add_test(tc, restores_whole);
	tcase_add_test(tc, flipped_page_never_seen);
	tcase_add_test(tc, fill_and_fault_on_one_page);
	tcase_add_test(tc, two_vcpus_one_page);
	tcase_add_test(tc, paused_while_fault_pending);
	tcase_add_test(tc, fill_read_fails);
	tcase_add_test(tc, working_set_first);
	tcase_add_test(tc, bad_page_read_by_the_vmm);
	tcase_add_test(tc, discarded_page_comes_again);
	tcase_add_test(tc, snapshot_waits_for_resident);
	tcase_add_test(tc, workset_fifo);
	tcase_add_test(tc, discarded_page_in_the_range_after_a_fault);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	int skip = require_kvm("test-lazy");

	return skip ? skip : run_suite(suite());
}
