// SPDX-License-Identifier: MIT
/*
 * The tracker against the real KVM, the way the kernel's dirty_log_test
 * checks dirty logging: the test guest keeps writing (gfn, pass) tags while
 * the host syncs and copies every page it is handed, as a migration would.
 * After the guest stops and a last sync, the copy must equal guest memory:
 * any write the tracker lost leaves a stale copy behind.
 */
#include <inttypes.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <linux/kvm.h>
#include <stdlib.h>
#include <time.h>

#include "hooks.h"
#include "vcpu.h"
#include "rng.h"
#include "testvm.h"
#include "test-util.h"

#define PAGE ((uint64_t)4096)
#define GIB (1ull << 30)
#define MAX_REGIONS 8

/* What the consumer copied: the whole page for the system region, the tag elsewhere. */
struct copy {
	struct kvmdirty_region *region;
	uint8_t *hva;
	uint64_t npages;
	struct guest_tag *tags;
	uint8_t *pages;	    /* system region only */
	uint32_t *reported; /* times each page was handed out, when counting */
};

struct rig {
	struct testvm *tv;
	struct kvmdirty_tracker *t;
	struct copy copies[MAX_REGIONS];
	unsigned int nr;
	uint64_t handed_out;
	unsigned int delay_us; /* after copying each batch: a window for the guest */
};

static struct copy *copy_of(struct rig *g, struct kvmdirty_region *r)
{
	unsigned int i;

	for (i = 0; i < g->nr; i++)
		if (g->copies[i].region == r)
			return &g->copies[i];
	ck_abort_msg("range in unknown region slot %u", kvmdirty_region_slot(r));
	return NULL;
}

static void add_copy(struct rig *g, struct kvmdirty_region *r, bool whole_pages, bool count)
{
	struct copy *c = &g->copies[g->nr++];

	c->region = r;
	c->hva = kvmdirty_region_hva(r);
	c->npages = kvmdirty_region_size(r) / PAGE;
	c->tags = calloc(c->npages, sizeof(*c->tags));
	c->pages = whole_pages ? calloc(c->npages, PAGE) : NULL;
	c->reported = count ? calloc(c->npages, sizeof(uint32_t)) : NULL;
	ck_assert_ptr_nonnull(c->tags);
}

static void pause_us(unsigned int us)
{
	struct timespec ts = { 0, (long)us * 1000 };

	if (us)
		nanosleep(&ts, NULL);
}

/* Take everything pending, reading each page after the tracker hands it out. */
static void consume(struct rig *g)
{
	struct kvmdirty_range rg[64];
	int n, i;

	while ((n = kvmdirty_tracker_next(g->t, rg, 64, 4096)) > 0) {
		for (i = 0; i < n; i++) {
			struct copy *c = copy_of(g, rg[i].region);
			uint64_t p;

			expect(rg[i].page + rg[i].npages <= c->npages && rg[i].npages,
			       "range [%" PRIu64 ", +%" PRIu64 ") outside slot %u", rg[i].page, rg[i].npages,
			       kvmdirty_region_slot(rg[i].region));
			expect((uint8_t *)rg[i].hva == c->hva + rg[i].page * PAGE, "hva of range");
			for (p = rg[i].page; p < rg[i].page + rg[i].npages; p++) {
				memcpy(&c->tags[p], c->hva + p * PAGE, sizeof(c->tags[p]));
				if (c->pages)
					memcpy(c->pages + p * PAGE, c->hva + p * PAGE, PAGE);
				if (c->reported)
					c->reported[p]++;
			}
			g->handed_out += rg[i].npages;
		}
		pause_us(g->delay_us);
	}
	ck_assert_msg(n == 0, "kvmdirty_tracker_next: %d (%s)", n, strerror(-n));
	pause_us(g->delay_us);
}

static void sync_and_consume(struct rig *g)
{
	int64_t n = kvmdirty_tracker_sync(g->t);

	ck_assert_msg(n >= 0, "kvmdirty_tracker_sync: %" PRId64 " (%s)", n, strerror((int)-n));
	consume(g);
}

/* Pages whose copy differs from guest memory. */
static uint64_t stale_pages(struct rig *g, char *first, size_t len)
{
	uint64_t stale = 0, p;
	unsigned int i;

	first[0] = 0;
	for (i = 0; i < g->nr; i++) {
		struct copy *c = &g->copies[i];

		for (p = 0; c->region && p < c->npages; p++) {
			bool same = c->pages ? !memcmp(c->pages + p * PAGE, c->hva + p * PAGE, PAGE)
					     : !memcmp(&c->tags[p], c->hva + p * PAGE, sizeof(c->tags[p]));

			if (!same && !stale++)
				snprintf(first, len, "gpa 0x%" PRIx64 " copy (%" PRIu64 ", %" PRIu64 ") memory (%" PRIu64
						     ", %" PRIu64 ")",
					 kvmdirty_region_gpa(c->region) + p * PAGE, c->tags[p].gfn, c->tags[p].pass,
					 ((struct guest_tag *)(c->hva + p * PAGE))->gfn,
					 ((struct guest_tag *)(c->hva + p * PAGE))->pass);
		}
	}
	return stale;
}

static void rig_free(struct rig *g)
{
	unsigned int i;

	for (i = 0; i < g->nr; i++) {
		free(g->copies[i].tags);
		free(g->copies[i].pages);
		free(g->copies[i].reported);
	}
}

struct scenario {
	const char *name;
	enum kvmdirty_mode mode;
	unsigned int vcpus;
	uint32_t pattern;
	bool ring0;
	uint32_t ring_entries;
	uint64_t chunk_pages;
	uint64_t until_pass; /* 0: run until stopped */
	unsigned int rounds;
	bool clear_late;     /* the wrong order: must lose writes */
	bool toggle_remove;  /* stop/start one region and remove another mid-run */
	uint32_t reaper_ms;
};

/*
 * Three adjacent regions: 1 GiB + 3 pages (its tail is not a multiple of
 * 64 pages), 8 MiB, 4 MiB + 5 pages; the guest writes across all three
 * boundaries, and (with toggle_remove) a fourth region it never touches is
 * removed while tracked.
 */
static void run_scenario(const struct scenario *s)
{
	uint64_t r0 = 4 * GIB, s0 = GIB + 3 * PAGE, r1 = r0 + s0, s1 = 8 << 20, r2 = r1 + s1,
		 s2 = (4 << 20) + 5 * PAGE, r3 = 16 * GIB, s3 = 1 << 20;
	uint64_t ws_first = r0 + s0 - (4 << 20), ws_end = r2 + s2, ws_pages, stale;
	struct testvm_opts o = { .nr_vcpus = s->vcpus, .ring0 = s->ring0, .track = true };
	struct kvmdirty_region *reg[4];
	struct kvmdirty_stats st;
	struct testvm_exit ex;
	struct rig g = { 0 };
	unsigned int i, bad = 0;
	char first[160];
	void *mem[4];
	int ret;

	if (s->ring0) /* emulated writes: 16,384 pages a pass, across all three regions */
		ws_first = r2 + s2 - (64 << 20);
	o.track_opts.mode = s->mode;
	o.track_opts.ring_entries = s->ring_entries;
	o.track_opts.clear_chunk_pages = s->chunk_pages;
	o.track_opts.reaper_ms = s->reaper_ms;
	ret = testvm_new(&o, &g.tv);
	if (ret == -EOPNOTSUPP) {
		printf("%s: mode %d not supported by this kernel: skipped\n", s->name, s->mode);
		return;
	}
	ck_assert_msg(ret == 0, "%s: testvm_new: %s", s->name, strerror(-ret));
	g.t = g.tv->tracker;
	kd_test_hooks.clear_late = s->clear_late;
	g.delay_us = s->clear_late ? 3000 : 500;
	ck_assert_ok(testvm_add_memory(g.tv, r0, s0, 0, &mem[0], &reg[0]));
	ck_assert_ok(testvm_add_memory(g.tv, r1, s1, 0, &mem[1], &reg[1]));
	ck_assert_ok(testvm_add_memory(g.tv, r2, s2, 0, &mem[2], &reg[2]));
	ck_assert_ok(testvm_add_memory(g.tv, r3, s3, 0, &mem[3], &reg[3]));
	add_copy(&g, g.tv->sys_region, true, false);
	for (i = 0; i < 4; i++)
		add_copy(&g, reg[i], false, false);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	ck_assert_uint_eq(kvmdirty_tracker_pending(g.t), (GUEST_SYS_SIZE + s0 + s1 + s2 + s3) / PAGE);

	ws_pages = (ws_end - ws_first) / PAGE;
	for (i = 0; i < s->vcpus; i++) {
		struct guest_vcpu *mb = testvm_mailbox(g.tv, i);
		uint64_t share = ws_pages / s->vcpus;

		mb->gpa = ws_first + i * share * PAGE;
		mb->pages = i + 1 == s->vcpus ? ws_pages - i * share : share;
		mb->pattern = s->pattern;
		mb->until_pass = s->until_pass;
		mb->seed = 12345 + i;
		mb->flags = GUEST_F_CHECK;
	}
	/* the whole of memory once, before the guest runs */
	consume(&g);
	ck_assert_ok(testvm_spawn(g.tv));
	/* at least the rounds asked for, and three guest passes (up to 20 s) */
	for (i = 0; i < s->rounds || (!s->until_pass && testvm_mailbox(g.tv, 0)->pass < 3 && i < 40000); i++) {
		sync_and_consume(&g);
		if (s->toggle_remove && i == s->rounds / 3) {
			ck_assert_ok(kvmdirty_tracker_stop(g.t, reg[1]));
			ck_assert_ok(kvmdirty_region_remove(g.tv->vm, reg[3]));
			g.copies[4].region = NULL; /* gone: nothing to compare */
		}
		if (s->toggle_remove && i == s->rounds / 2)
			ck_assert_ok(kvmdirty_tracker_start(g.t, reg[1]));
	}
	if (!s->until_pass)
		testvm_stop_all(g.tv);
	ret = testvm_join(g.tv, &bad, &ex);
	ck_assert_msg(ret == 0, "%s: vCPU %u: %s (%s), check page 0x%" PRIx64, s->name, bad,
		      ret == -EIO ? testvm_event_name(ex.event) : strerror(-ret), testvm_event_name(ex.event),
		      testvm_mailbox(g.tv, bad)->err_gpa);
	/* stop-and-copy: vCPUs are out of KVM_RUN, one last sync sees everything */
	sync_and_consume(&g);
	ck_assert_uint_eq(kvmdirty_tracker_pending(g.t), 0);

	stale = stale_pages(&g, first, sizeof(first));
	ck_assert_ok(kvmdirty_tracker_stats(g.t, &st, sizeof(st)));
	printf("%s: %u vCPU(s), pass %" PRIu64 ", %" PRIu64 " pages handed out over %" PRIu64 " syncs, %" PRIu64
	       " clears, ring: %" PRIu64 " harvested, %" PRIu64 " full exits, %" PRIu64 " overflows, %" PRIu64
	       " recoveries; stale copies: %" PRIu64 "\n",
	       s->name, s->vcpus, testvm_mailbox(g.tv, 0)->pass, g.handed_out, st.syncs, st.clear_calls,
	       st.ring_harvested, st.ring_full_exits, st.ring_overflows, st.ring_recoveries, stale);
	if (s->clear_late)
		ck_assert_msg(stale > 0, "%s: clearing after the read lost no write: the test cannot see loss",
			      s->name);
	else
		ck_assert_msg(stale == 0, "%s: %" PRIu64 " pages changed without being reported; first: %s",
			      s->name, stale, first);
	ck_assert_uint_ge(testvm_mailbox(g.tv, 0)->pass, 1);
	if (s->mode == KVMDIRTY_MODE_DIRTY_RING && s->ring0)
		ck_assert_msg(st.ring_full_exits > 0, "%s: the ring never filled", s->name);
	if (s->reaper_ms)
		ck_assert_msg(st.ring_reaper_runs > 0, "%s: the reaper never ran", s->name);

	testvm_free(g.tv);
	for (i = 0; i < 4; i++)
		testvm_unmap(mem[i], i == 0 ? s0 : i == 1 ? s1 : i == 2 ? s2 : s3);
	rig_free(&g);
}

static const struct scenario scenarios[] = {
	{ "clear-log seq 1 vCPU", KVMDIRTY_MODE_CLEAR_LOG, 1, GUEST_SEQUENTIAL, false, 0, 0, 0, 12, false, false, 0 },
	{ "clear-log random 2 vCPUs, 64-page chunks", KVMDIRTY_MODE_CLEAR_LOG, 2, GUEST_RANDOM, false, 0, 64, 0, 12,
	  false, true, 0 },
	{ "dirty-log seq 2 vCPUs", KVMDIRTY_MODE_DIRTY_LOG, 2, GUEST_SEQUENTIAL, false, 0, 0, 0, 12, false, true, 0 },
	{ "dirty-log random 1 vCPU", KVMDIRTY_MODE_DIRTY_LOG, 1, GUEST_RANDOM, false, 0, 0, 0, 12, false, false, 0 },
	{ "dirty-ring seq 1 vCPU", KVMDIRTY_MODE_DIRTY_RING, 1, GUEST_SEQUENTIAL, false, 4096, 0, 0, 12, false, false, 0 },
	{ "dirty-ring random 2 vCPUs", KVMDIRTY_MODE_DIRTY_RING, 2, GUEST_RANDOM, false, 4096, 0, 0, 12, false, true, 0 },
	{ "dirty-ring 4096 entries, ring-0 guest", KVMDIRTY_MODE_DIRTY_RING, 1, GUEST_SEQUENTIAL, true, 4096, 0, 2, 6,
	  false, false, 0 },
	{ "dirty-ring random 2 vCPUs, reaper 1 ms", KVMDIRTY_MODE_DIRTY_RING, 2, GUEST_RANDOM, false, 4096, 0, 0, 12,
	  false, true, 1 },
};

/*
 * Lockstep: the guest writes every page once per pass and stops; the host
 * syncs, takes what is handed out, reads it; the guest writes again.  A
 * write between the read and a clear issued too late is lost, every time.
 */
static uint64_t lockstep(enum kvmdirty_mode mode, bool clear_late)
{
	struct testvm_opts o = { .nr_vcpus = 1, .track = true, .track_opts = { .mode = mode } };
	struct kvmdirty_range rg[64];
	struct kvmdirty_region *r;
	struct testvm_exit ex;
	struct rig g = { 0 };
	struct guest_vcpu *mb;
	uint64_t stale, size = 1 << 20;
	char first[160];
	int k, n, i;
	void *mem;

	ck_assert_ok(testvm_new(&o, &g.tv));
	g.t = g.tv->tracker;
	ck_assert_ok(testvm_add_memory(g.tv, 4 * GIB, size, 0, &mem, &r));
	add_copy(&g, g.tv->sys_region, true, false);
	add_copy(&g, r, false, false);
	mb = testvm_mailbox(g.tv, 0);
	mb->gpa = 4 * GIB;
	mb->pages = size / PAGE;
	mb->flags = GUEST_F_EXIT_EVERY_PASS | GUEST_F_CHECK;
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	consume(&g);
	kd_test_hooks.clear_late = clear_late;
	for (k = 0; k < 4; k++) {
		do
			ck_assert_ok(testvm_run(g.tv, 0, &ex));
		while (ex.event != TESTVM_PASS);
		ck_assert_int_ge(kvmdirty_tracker_sync(g.t), 0);
		/* one call: what it hands out is read before the guest runs again */
		n = kvmdirty_tracker_next(g.t, rg, 64, 0);
		ck_assert_int_ge(n, 0);
		for (i = 0; i < n; i++) {
			struct copy *c = copy_of(&g, rg[i].region);
			uint64_t p;

			for (p = rg[i].page; p < rg[i].page + rg[i].npages; p++) {
				memcpy(&c->tags[p], c->hva + p * PAGE, sizeof(c->tags[p]));
				if (c->pages)
					memcpy(c->pages + p * PAGE, c->hva + p * PAGE, PAGE);
			}
		}
	}
	kd_test_hooks.clear_late = false;
	sync_and_consume(&g);
	sync_and_consume(&g);
	stale = stale_pages(&g, first, sizeof(first));
	printf("lockstep mode %d%s: pass %" PRIu64 ", stale copies %" PRIu64 "%s%s\n", mode,
	       clear_late ? ", clear after read" : "", mb->pass, stale, stale ? ", first: " : "", first);
	testvm_free(g.tv);
	testvm_unmap(mem, size);
	rig_free(&g);
	return stale;
}

START_TEST(lockstep_no_lost_write)
{
	static const enum kvmdirty_mode modes[] = { KVMDIRTY_MODE_CLEAR_LOG, KVMDIRTY_MODE_DIRTY_LOG,
						    KVMDIRTY_MODE_DIRTY_RING };

	ck_assert_uint_eq(lockstep(modes[_i], false), 0);
}
END_TEST

START_TEST(lockstep_clear_after_read_loses_writes)
{
	/* the guest's last pass is lost on every one of its 256 pages (and its stack) */
	ck_assert_uint_ge(lockstep(KVMDIRTY_MODE_CLEAR_LOG, true), 256);
}
END_TEST

START_TEST(no_lost_write)
{
	run_scenario(&scenarios[_i]);
}
END_TEST

/* Invariant 2: the same run with each clear issued after the read must lose writes. */
START_TEST(clear_after_read_loses_writes)
{
	const struct scenario s = { "clear-log, clear after read", KVMDIRTY_MODE_CLEAR_LOG, 1, GUEST_SEQUENTIAL,
				    false, 0, 64, 0, 8, true, false, 0 };

	run_scenario(&s);
}
END_TEST

struct marker {
	struct testvm *tv;
	struct kvmdirty_tracker *t;
	uint64_t gpa, npages;
	uint8_t *hva;
	volatile bool done;
};

/* Mark every page once, in random order, by gpa or by hva, one to four pages at a time. */
static void *mark_thread(void *p)
{
	struct marker *m = p;
	uint64_t *order = malloc(m->npages * sizeof(*order)), i, x = 0x9e3779b97f4a7c15ull;

	for (i = 0; i < m->npages; i++)
		order[i] = i;
	shuffle_u64(order, m->npages, &x);
	for (i = 0; i < m->npages; i++) {
		uint64_t pg = order[i];
		int ret = (i & 1) ? kvmdirty_tracker_mark_dirty_hva(m->t, m->hva + pg * PAGE + (i % 7), 1)
				  : kvmdirty_tracker_mark_dirty_gpa(m->t, m->gpa + pg * PAGE, PAGE);

		if (ret)
			abort();
	}
	free(order);
	m->done = true;
	return NULL;
}

START_TEST(mark_dirty_concurrent)
{
	struct testvm_opts o = { .nr_vcpus = 1, .track = true };
	struct marker m = { 0 };
	struct kvmdirty_region *r;
	struct rig g = { 0 };
	pthread_t th;
	uint64_t p, size = 16 << 20;
	void *mem;

	ck_assert_ok(testvm_new(&o, &g.tv));
	g.t = g.tv->tracker;
	ck_assert_ok(testvm_add_memory(g.tv, 4 * GIB, size, 0, &mem, &r));
	add_copy(&g, g.tv->sys_region, true, false);
	add_copy(&g, r, false, true);
	ck_assert_ok(kvmdirty_tracker_start(g.t, NULL));
	sync_and_consume(&g);
	sync_and_consume(&g); /* INITIALLY_SET: the first GET reports every page once more */
	sync_and_consume(&g);
	memset(g.copies[1].reported, 0, (size / PAGE) * sizeof(uint32_t));
	ck_assert_uint_eq(kvmdirty_tracker_pending(g.t), 0);

	/* bad input, and pages outside tracked memory, change nothing */
	ck_assert_errno(kvmdirty_tracker_mark_dirty_gpa(g.t, 4 * GIB, 0), EINVAL);
	ck_assert_errno(kvmdirty_tracker_mark_dirty_gpa(g.t, UINT64_MAX - 10, 100), EINVAL);
	ck_assert_ok(kvmdirty_tracker_mark_dirty_gpa(g.t, 64 * GIB, 1 << 20));
	ck_assert_ok(kvmdirty_tracker_mark_dirty_hva(g.t, &m, sizeof(m)));
	ck_assert_int_eq(kvmdirty_tracker_sync(g.t), 0);

	m = (struct marker){ .tv = g.tv, .t = g.t, .gpa = 4 * GIB, .npages = size / PAGE, .hva = mem };
	ck_assert_int_eq(pthread_create(&th, NULL, mark_thread, &m), 0);
	while (!m.done)
		sync_and_consume(&g);
	pthread_join(th, NULL);
	sync_and_consume(&g);
	for (p = 0; p < size / PAGE; p++)
		expect(g.copies[1].reported[p] == 1, "page %" PRIu64 " reported %u times", p, g.copies[1].reported[p]);

	/* logging switched off behind the tracker's back: sync goes on */
	ck_assert_ok(kvmdirty_region_set_logging(g.tv->vm, r, false));
	ck_assert_int_ge(kvmdirty_tracker_sync(g.t), 0);
	ck_assert_ok(kvmdirty_region_set_logging(g.tv->vm, r, true));
	sync_and_consume(&g); /* KVM starts the slot all dirty again */
	ck_assert_uint_eq(kvmdirty_tracker_pending(g.t), 0);

	/* a range across the region's end marks only what is inside */
	ck_assert_ok(kvmdirty_tracker_mark_dirty_gpa(g.t, 4 * GIB + size - 2 * PAGE, 8 * PAGE));
	ck_assert_int_eq(kvmdirty_tracker_sync(g.t), 2);
	ck_assert_uint_eq(kvmdirty_tracker_pending(g.t), 2);
	testvm_free(g.tv);
	testvm_unmap(mem, size);
	rig_free(&g);
}
END_TEST

/* A vCPU the VMM created: registered, its ring mapped, its fd left open. */
START_TEST(vcpu_add_keeps_fd)
{
	struct kvmdirty_tracker_opts o = { .mode = KVMDIRTY_MODE_DIRTY_RING, .ring_entries = 4096 };
	struct kvmdirty_tracker *t;
	struct kvmdirty_vcpu *v, *w;
	struct kvmdirty_vm *vm;
	int fd;

	ck_assert_ok(kvmdirty_vm_new(&vm));
	ck_assert_ok(kvmdirty_tracker_new(vm, &o, &t));
	fd = ioctl(kvmdirty_vm_fd(vm), KVM_CREATE_VCPU, 0);
	ck_assert_int_ge(fd, 0);
	ck_assert_errno(kvmdirty_vcpu_add(vm, -1, &v), EBADF);
	ck_assert_ok(kvmdirty_vcpu_add(vm, fd, &v));
	ck_assert_int_eq(kvmdirty_vcpu_fd(v), fd);
	ck_assert_ptr_nonnull(kvmdirty_vcpu_kvm_run(v));
	ck_assert_ptr_nonnull(v->ring.gfns);
	ck_assert_errno(kvmdirty_vcpu_create(vm, 0, &w), EEXIST);
	ck_assert_ok(kvmdirty_vcpu_create(vm, 1, &w));
	ck_assert_ptr_nonnull(w->ring.gfns);
	ck_assert_int_eq(kvmdirty_tracker_sync(t), 0);
	kvmdirty_vcpu_free(v);
	ck_assert_int_ge(fcntl(fd, F_GETFD), 0); /* still the VMM's */
	kvmdirty_vm_free(vm);			  /* frees w */
	close(fd);
}
END_TEST

START_TEST(bad_setup)
{
	struct kvmdirty_tracker_opts o = { .mode = KVMDIRTY_MODE_DIRTY_RING, .ring_entries = 4096 };
	struct kvmdirty_tracker *t = NULL, *t2;
	struct kvmdirty_vcpu *v;
	struct kvmdirty_vm *vm;

	ck_assert_ok(kvmdirty_vm_new(&vm));
	o.ring_entries = 3000;
	ck_assert_errno(kvmdirty_tracker_new(vm, &o, &t), EINVAL);
	o.ring_entries = 1u << 30;
	ck_assert_errno(kvmdirty_tracker_new(vm, &o, &t), EINVAL);
	o = (struct kvmdirty_tracker_opts){ .mode = KVMDIRTY_MODE_CLEAR_LOG, .clear_chunk_pages = 100 };
	ck_assert_errno(kvmdirty_tracker_new(vm, &o, &t), EINVAL);
	o.mode = (enum kvmdirty_mode)42;
	o.clear_chunk_pages = 0;
	ck_assert_errno(kvmdirty_tracker_new(vm, &o, &t), EINVAL);
	ck_assert_ptr_null(t);
	/* a vCPU exists: the ring can no longer be enabled */
	ck_assert_ok(kvmdirty_vcpu_create(vm, 0, &v));
	o = (struct kvmdirty_tracker_opts){ .mode = KVMDIRTY_MODE_DIRTY_RING };
	ck_assert_errno(kvmdirty_tracker_new(vm, &o, &t), EBUSY);
	ck_assert_ok(kvmdirty_tracker_new(vm, NULL, &t));
	ck_assert_int_eq(kvmdirty_tracker_mode(t), KVMDIRTY_MODE_CLEAR_LOG);
	ck_assert_errno(kvmdirty_tracker_new(vm, NULL, &t2), EBUSY);
	kvmdirty_tracker_free(t);
	/* manual protect stays on in KVM: a legacy tracker would be wrong */
	o.mode = KVMDIRTY_MODE_DIRTY_LOG;
	ck_assert_errno(kvmdirty_tracker_new(vm, &o, &t), EBUSY);
	ck_assert_ok(kvmdirty_tracker_new(vm, NULL, &t));
	kvmdirty_vm_free(vm); /* frees the tracker and the vCPU too */
}
END_TEST

int main(void)
{
	Suite *s = suite_create("track");
	TCase *tc = tcase_create("track");
	int skip = require_kvm("test-track");

	if (skip)
		return skip;
	tcase_set_timeout(tc, 240);
	tcase_add_loop_test(tc, no_lost_write, 0, (int)(sizeof(scenarios) / sizeof(scenarios[0])));
	tcase_add_test(tc, clear_after_read_loses_writes);
	tcase_add_loop_test(tc, lockstep_no_lost_write, 0, 3);
	tcase_add_test(tc, lockstep_clear_after_read_loses_writes);
	tcase_add_test(tc, mark_dirty_concurrent);
	tcase_add_test(tc, bad_setup);
	tcase_add_test(tc, vcpu_add_keeps_fd);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
