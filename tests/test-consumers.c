// SPDX-License-Identifier: MIT
/*
 * Several consumers of one tracker, on the real KVM, judged by guest page
 * contents: each consumer keeps its own copy of memory, updated from what
 * it is handed (and, for one that owes, only at its commits); after the
 * guest stopped and a last pass, every copy must equal memory.
 *
 * - paces: three and four consumers at different paces on their own
 *   threads, one aborting a partial hand-out every few passes, one
 *   joining and leaving again and again, one joining empty mid-run, marks
 *   from a device thread throughout, the device's region stopped and
 *   started again; each mode.
 * - abort_puts_back, commit_forgets: exact hand-out counts over a guest
 *   that writes every page once per pass; each mode.
 * - fetch_to_clear_window (CLEAR_LOG): consumer A held just before it
 *   clears a chunk it fetched; the guest writes that chunk's pages and a
 *   consumer joins empty meanwhile; each consumer must see those writes.
 * - counting: a counting consumer's count equals the pages the guest
 *   wrote, 0 for an idle guest, and takes nothing from the others.
 * - vcpu_count: each vCPU's distinct pages, however often its ring
 *   reported them; 0 for a vCPU that writes nothing; counted while the
 *   vCPU runs and every harvester harvests, nothing lost or counted twice.
 * doc/consumers.md names the invariant each test guards.
 */
#include <pthread.h>
#include <linux/kvm.h>

#include "hooks.h"
#include "rig.h"
#include "rng.h"
#include "track-modes.h"

#define R_GPA (4 * GIB)
#define R_SIZE (8ull << 20) /* 2048 pages the guest writes */
#define DEV_GPA (8 * GIB)
#define DEV_SIZE (1ull << 20) /* 256 pages a device thread writes */

/*
 * One consumer and its copies: mirror (what it committed), stage (what it
 * was handed since its last commit) and the ranges handed out since.
 */
struct cons {
	const char *name;
	struct rig mirror, stage;
	struct kvmdirty_consumer *c;
	bool owes;
	struct kvmdirty_range *log;
	size_t nlog, cap;
	uint64_t handed, aborts, commits;
};

static void cons_copies(struct cons *k, struct testvm *tv, struct kvmdirty_region *const *regs, unsigned int n)
{
	unsigned int i;

	k->mirror.tv = k->stage.tv = tv;
	k->mirror.t = k->stage.t = tv->tracker;
	k->mirror.c = k->stage.c = k->c;
	rig_add_copy(&k->mirror, tv->sys_region, true, false);
	rig_add_copy(&k->stage, tv->sys_region, true, false);
	for (i = 0; i < n; i++) {
		rig_add_copy(&k->mirror, regs[i], true, false);
		rig_add_copy(&k->stage, regs[i], true, false);
	}
}

/* The copy starts as memory is now (a consumer that joins empty, with nothing writing). */
static void cons_snapshot(struct cons *k)
{
	unsigned int i;

	for (i = 0; i < k->mirror.nr; i++) {
		struct copy *c = &k->mirror.copies[i];

		memcpy(c->pages, c->hva, c->npages * PAGE);
	}
}

/* Staged pages into the mirror: the ranges handed out since the last commit. */
static void cons_apply(struct cons *k)
{
	size_t i;

	for (i = 0; i < k->nlog; i++) {
		struct copy *from = rig_copy_of(&k->stage, k->log[i].region);
		struct copy *to = rig_copy_of(&k->mirror, k->log[i].region);

		memcpy(to->pages + k->log[i].page * PAGE, from->pages + k->log[i].page * PAGE,
		       k->log[i].npages * PAGE);
	}
	k->nlog = 0;
}

/* One next() call: read what it hands out; returns the ranges (0: nothing pending). */
static int cons_next(struct cons *k, uint64_t max_pages)
{
	struct kvmdirty_range rg[64];
	int n = kvmdirty_consumer_next(k->c, rg, 64, max_pages);
	int i;

	expect(n >= 0, "%s: kvmdirty_consumer_next: %d (%s)", k->name, n, strerror(-n));
	if (!k->owes) {
		rig_read(&k->mirror, rg, n);
	} else {
		rig_read(&k->stage, rg, n);
		for (i = 0; i < n; i++) {
			if (k->nlog == k->cap) {
				k->cap = k->cap ? k->cap * 2 : 256;
				k->log = realloc(k->log, k->cap * sizeof(*k->log));
				ck_assert_ptr_nonnull(k->log);
			}
			k->log[k->nlog++] = rg[i];
		}
	}
	for (i = 0; i < n; i++)
		k->handed += rg[i].npages;
	return n;
}

static void cons_commit(struct cons *k)
{
	int64_t n;

	if (!k->owes)
		return;
	n = kvmdirty_consumer_commit(k->c);
	expect(n >= 0, "%s: commit: %" PRId64, k->name, n);
	cons_apply(k);
	k->commits++;
}

/* What was handed out since the last commit is thrown away, as a failed snapshot would. */
static int64_t cons_abort(struct cons *k)
{
	int64_t n = kvmdirty_consumer_abort(k->c);

	expect(n >= 0, "%s: abort: %" PRId64, k->name, n);
	k->nlog = 0;
	k->aborts++;
	return n;
}

/* A whole pass: sync, everything pending handed out and read, committed. */
static void cons_pass(struct cons *k)
{
	int64_t s = kvmdirty_consumer_sync(k->c);

	expect(s >= 0, "%s: sync: %" PRId64 " (%s)", k->name, s, strerror((int)-s));
	while (cons_next(k, 4096) > 0)
		;
	cons_commit(k);
}

static void cons_expect_fresh(struct cons *k)
{
	char first[160];
	uint64_t stale = rig_stale(&k->mirror, first, sizeof(first));

	ck_assert_msg(stale == 0, "%s: %" PRIu64 " pages changed without reaching it; first: %s", k->name, stale,
		      first);
}

static void cons_free(struct cons *k)
{
	rig_free(&k->mirror);
	rig_free(&k->stage);
	free(k->log);
	memset(k, 0, sizeof(*k));
}

/* ---- paces ---- */

/* The device: writes a page's counter, then marks it, as a VMM's device model must. */
static struct {
	uint8_t *hva;
	uint64_t gpa;
	pthread_mutex_t mu; /* held for each write and its mark: a pause takes it */
	int stop;
	uint64_t writes;
} dev = { .mu = PTHREAD_MUTEX_INITIALIZER };

/*
 * The device's write, as the guest's: unseen by ThreadSanitizer, whose
 * checks would otherwise take the consumers' copies of the page, made as
 * they must be with the device going on, for a race of the library's.
 */
static void dev_write(uint64_t *w)
{
	__asm__ volatile("incq %0" : "+m"(*w));
}

static void *device(void *p)
{
	struct kvmdirty_tracker *t = p;
	uint64_t seed = 99, i;

	while (!__atomic_load_n(&dev.stop, __ATOMIC_ACQUIRE)) {
		uint64_t page = xorshift64(&seed) % (DEV_SIZE / PAGE), n = 1 + xorshift64(&seed) % 3;
		int r;

		if (page + n > DEV_SIZE / PAGE)
			n = DEV_SIZE / PAGE - page;
		pthread_mutex_lock(&dev.mu);
		for (i = 0; i < n; i++)
			dev_write((uint64_t *)(dev.hva + (page + i) * PAGE + 8 * (seed % 512)));
		r = (seed & 1) ? kvmdirty_tracker_mark_dirty_hva(t, dev.hva + page * PAGE, n * PAGE)
			       : kvmdirty_tracker_mark_dirty_gpa(t, dev.gpa + page * PAGE, n * PAGE);
		dev.writes++;
		pthread_mutex_unlock(&dev.mu);
		expect(r == 0, "mark: %d", r);
		rig_pause_us(50);
	}
	return NULL;
}

struct pacer {
	struct cons *k;
	unsigned int sync_every; /* passes between syncs */
	unsigned int delay_us;	 /* after each next() */
	unsigned int abort_every; /* 0: never */
	int *stop;
	uint64_t passes;
};

static void *pace(void *p)
{
	struct pacer *pc = p;
	struct cons *k = pc->k;

	while (!__atomic_load_n(pc->stop, __ATOMIC_ACQUIRE)) {
		int64_t s = 0;

		if (pc->passes % pc->sync_every == 0)
			s = kvmdirty_consumer_sync(k->c);
		expect(s >= 0, "%s: sync: %" PRId64, k->name, s);
		if (pc->abort_every && pc->passes % pc->abort_every == pc->abort_every - 1) {
			/* a partial hand-out that fails */
			cons_next(k, 128);
			cons_next(k, 128);
			cons_abort(k);
		} else {
			while (cons_next(k, 512) > 0)
				rig_pause_us(pc->delay_us);
			cons_commit(k);
		}
		__atomic_add_fetch(&pc->passes, 1, __ATOMIC_RELEASE);
		rig_pause_us(pc->delay_us * 4);
	}
	return NULL;
}

/* Joins with everything pending, takes a pass or two, leaves; again and again. */
struct churner {
	struct testvm *tv;
	struct kvmdirty_region *regs[2];
	int *stop;
	uint64_t rounds;
};

static void *churn(void *p)
{
	struct churner *ch = p;

	while (!__atomic_load_n(ch->stop, __ATOMIC_ACQUIRE)) {
		struct cons k = { .name = "churner", .owes = ch->rounds % 2 };

		expect(kvmdirty_consumer_new(ch->tv->tracker, k.owes ? 0 : KVMDIRTY_CONSUMER_AUTOCOMMIT, &k.c) == 0,
		       "churner: consumer_new");
		cons_copies(&k, ch->tv, ch->regs, 2);
		/* every page pending at first (the device region's too, unless it is stopped just now) */
		expect(kvmdirty_consumer_pending(k.c) >= (GUEST_SYS_SIZE + R_SIZE) / PAGE,
		       "churner: %" PRIu64 " pages pending at its start", kvmdirty_consumer_pending(k.c));
		cons_pass(&k);
		if (ch->rounds % 3 == 0)
			cons_pass(&k);
		kvmdirty_consumer_free(k.c);
		cons_free(&k);
		__atomic_add_fetch(&ch->rounds, 1, __ATOMIC_RELEASE);
	}
	return NULL;
}

static void run_paces(enum kvmdirty_mode mode, unsigned int nr_cons)
{
	struct testvm_opts o = { .nr_vcpus = 2, .track = true, .track_opts = { .mode = mode } };
	struct cons k[4] = { { .name = "default (auto-commit)" }, { .name = "slow, owes", .owes = true },
			     { .name = "aborts, owes", .owes = true }, { .name = "joined empty", .owes = true } };
	struct pacer pc[4] = { { .sync_every = 1, .delay_us = 0 }, { .sync_every = 3, .delay_us = 300 },
			       { .sync_every = 2, .delay_us = 100, .abort_every = 3 }, { .sync_every = 1 } };
	struct churner ch = { 0 };
	struct kvmdirty_region *regs[2];
	pthread_t th[4], dev_th, churn_th;
	struct testvm_exit ex;
	struct testvm *tv;
	unsigned int i, bad = 0;
	int stop = 0, ret;
	void *mem[2];

	hooks_off();
	ck_assert_ok(testvm_new(&o, &tv));
	ck_assert_ok(testvm_add_memory(tv, R_GPA, R_SIZE, 0, &mem[0], &regs[0]));
	ck_assert_ok(testvm_add_memory(tv, DEV_GPA, DEV_SIZE, 0, &mem[1], &regs[1]));
	ck_assert_ok(kvmdirty_tracker_start(tv->tracker, NULL));
	k[0].c = kvmdirty_tracker_consumer(tv->tracker);
	for (i = 1; i < 3; i++)
		ck_assert_ok(kvmdirty_consumer_new(tv->tracker, 0, &k[i].c));
	for (i = 0; i < 3; i++) {
		cons_copies(&k[i], tv, regs, 2);
		pc[i].k = &k[i];
		pc[i].stop = &stop;
	}
	dev.hva = mem[1];
	dev.gpa = DEV_GPA;
	dev.stop = 0;
	for (i = 0; i < 2; i++)
		rig_work(tv, i, R_GPA + i * (R_SIZE / 2), R_SIZE / 2 / PAGE, GUEST_RANDOM, GUEST_F_CHECK);
	/* everything once before anything writes */
	for (i = 0; i < 3; i++)
		cons_pass(&k[i]);
	ck_assert_ok(testvm_spawn(tv));
	ck_assert_int_eq(pthread_create(&dev_th, NULL, device, tv->tracker), 0);
	for (i = 0; i < 3; i++)
		ck_assert_int_eq(pthread_create(&th[i], NULL, pace, &pc[i]), 0);
	ch = (struct churner){ .tv = tv, .regs = { regs[0], regs[1] }, .stop = &stop };
	ck_assert_int_eq(pthread_create(&churn_th, NULL, churn, &ch), 0);

	while (testvm_mailbox(tv, 0)->pass < 2 || testvm_mailbox(tv, 1)->pass < 2)
		rig_pause_us(10000);
	if (nr_cons == 4) {
		/* a consumer joins empty: nothing writes while its copy is taken and it joins */
		pthread_mutex_lock(&dev.mu);
		testvm_pause_all(tv);
		ck_assert_ok(kvmdirty_consumer_new(tv->tracker, KVMDIRTY_CONSUMER_EMPTY, &k[3].c));
		cons_copies(&k[3], tv, regs, 2);
		cons_snapshot(&k[3]);
		testvm_resume_all(tv);
		pthread_mutex_unlock(&dev.mu);
		pc[3].k = &k[3];
		pc[3].stop = &stop;
		ck_assert_int_eq(pthread_create(&th[3], NULL, pace, &pc[3]), 0);
	}
	/* the device's region stopped and started again: wholly pending for every consumer then */
	for (i = 0; i < 3; i++) {
		ck_assert_ok(kvmdirty_tracker_stop(tv->tracker, regs[1]));
		rig_pause_us(20000);
		ck_assert_ok(kvmdirty_tracker_start(tv->tracker, regs[1]));
		rig_pause_us(20000);
	}
	while (testvm_mailbox(tv, 0)->pass < 5 || testvm_mailbox(tv, 1)->pass < 5 ||
	       __atomic_load_n(&pc[1].passes, __ATOMIC_ACQUIRE) < 6 || __atomic_load_n(&pc[2].passes, __ATOMIC_ACQUIRE) < 9 ||
	       __atomic_load_n(&ch.rounds, __ATOMIC_ACQUIRE) < 3)
		rig_pause_us(10000);

	__atomic_store_n(&dev.stop, 1, __ATOMIC_RELEASE);
	pthread_join(dev_th, NULL);
	testvm_stop_all(tv);
	ret = testvm_join(tv, &bad, &ex);
	ck_assert_msg(ret == 0, "vCPU %u: %s", bad, ret == -EIO ? testvm_event_name(ex.event) : strerror(-ret));
	__atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
	for (i = 0; i < nr_cons; i++)
		pthread_join(th[i], NULL);
	pthread_join(churn_th, NULL);
	/* stop-and-copy, consumer by consumer: one's last sync fetches for all */
	for (i = 0; i < nr_cons; i++) {
		cons_pass(&k[i]);
		ck_assert_uint_eq(kvmdirty_consumer_pending(k[i].c), 0);
	}
	printf("paces %s, %u consumers: guest passes %" PRIu64 "/%" PRIu64 ", device writes %" PRIu64
	       ", churner rounds %" PRIu64 "\n",
	       mode_name(mode), nr_cons, testvm_mailbox(tv, 0)->pass, testvm_mailbox(tv, 1)->pass, dev.writes,
	       ch.rounds);
	for (i = 0; i < nr_cons; i++) {
		printf("  %s: %" PRIu64 " passes, %" PRIu64 " pages handed out, %" PRIu64 " commits, %" PRIu64
		       " aborts\n",
		       k[i].name, pc[i].passes, k[i].handed, k[i].commits, k[i].aborts);
		cons_expect_fresh(&k[i]);
	}
	ck_assert_uint_gt(k[2].aborts, 0);
	for (i = 0; i < nr_cons; i++) {
		if (i)
			kvmdirty_consumer_free(k[i].c);
		cons_free(&k[i]);
	}
	testvm_free(tv);
	testvm_unmap(mem[0], R_SIZE);
	testvm_unmap(mem[1], DEV_SIZE);
}

START_TEST(three_consumers)
{
	run_paces(modes[_i], 3);
}
END_TEST

START_TEST(four_consumers_one_joins_empty)
{
	run_paces(modes[_i], 4);
}
END_TEST

/* ---- lockstep: a guest that writes each of its pages once per pass and stops ---- */

struct lockstep {
	struct testvm *tv;
	struct kvmdirty_region *r;
	void *mem;
	uint64_t pages;
};

static void lockstep_new(struct lockstep *l, enum kvmdirty_mode mode, uint64_t size)
{
	struct testvm_opts o = { .nr_vcpus = 1, .track = true, .track_opts = { .mode = mode } };

	hooks_off();
	ck_assert_ok(testvm_new(&o, &l->tv));
	ck_assert_ok(testvm_add_memory(l->tv, R_GPA, size, 0, &l->mem, &l->r));
	l->pages = size / PAGE;
	rig_work(l->tv, 0, R_GPA, l->pages, GUEST_SEQUENTIAL, GUEST_F_EXIT_EVERY_PASS | GUEST_F_CHECK);
	/* only the guest's own pages: the counts below are exact */
	ck_assert_ok(kvmdirty_tracker_start(l->tv->tracker, l->r));
}

static void lockstep_free(struct lockstep *l)
{
	testvm_free(l->tv);
	testvm_unmap(l->mem, l->pages * PAGE);
}

/* Hand out up to max pages of c; each page handed out counted in seen. */
static uint64_t take(struct kvmdirty_consumer *c, uint64_t max, uint8_t *seen)
{
	struct kvmdirty_range rg[64];
	uint64_t got = 0, p;
	int n, i;

	while (got < max && (n = kvmdirty_consumer_next(c, rg, 64, max - got)) > 0)
		for (i = 0; i < n; i++) {
			for (p = rg[i].page; p < rg[i].page + rg[i].npages; p++)
				seen[p]++;
			got += rg[i].npages;
		}
	return got;
}

/*
 * Abort after a partial hand-out: every page handed out comes back, the
 * others stay pending, nothing twice; a commit then forgets them.
 */
START_TEST(abort_puts_back)
{
	enum kvmdirty_mode mode = modes[_i];
	struct kvmdirty_consumer *c, *other;
	struct kvmdirty_consumer_info in;
	struct lockstep l;
	uint8_t *seen, *again;
	uint64_t p, got;
	int pass;

	lockstep_new(&l, mode, 1 << 20);
	ck_assert_ok(kvmdirty_consumer_new(l.tv->tracker, 0, &c));
	ck_assert_ok(kvmdirty_consumer_new(l.tv->tracker, KVMDIRTY_CONSUMER_AUTOCOMMIT, &other));
	seen = calloc(l.pages, 1);
	again = calloc(l.pages, 1);
	ck_assert_ptr_nonnull(seen);
	ck_assert_ptr_nonnull(again);
	/* the first pass: all of memory, committed */
	ck_assert_uint_eq(take(c, UINT64_MAX, seen), l.pages);
	ck_assert_int_eq(kvmdirty_consumer_commit(c), (int64_t)l.pages);
	ck_assert_int_eq(kvmdirty_consumer_abort(c), 0);
	for (pass = 0; pass < 3; pass++) {
		memset(seen, 0, l.pages);
		memset(again, 0, l.pages);
		rig_run_pass(l.tv, 0);
		ck_assert_int_ge(kvmdirty_consumer_sync(c), 0);
		ck_assert_uint_eq(kvmdirty_consumer_pending(c), l.pages);
		/* a partial hand-out: 100 pages, 37 more */
		got = take(c, 100, seen) + take(c, 37, seen);
		ck_assert_uint_eq(got, 137);
		ck_assert_ok(kvmdirty_consumer_info(c, &in, sizeof(in)));
		ck_assert_uint_eq(in.owed, 137);
		ck_assert_uint_eq(in.pending, l.pages - 137);
		ck_assert_int_eq(kvmdirty_consumer_abort(c), 137);
		ck_assert_uint_eq(kvmdirty_consumer_pending(c), l.pages);
		/* after the abort, the whole pass again: each page once, the aborted ones included */
		ck_assert_uint_eq(take(c, UINT64_MAX, again), l.pages);
		for (p = 0; p < l.pages; p++)
			ck_assert_msg(again[p] == 1, "page %" PRIu64 " handed out %u times after the abort (%u before)",
				      p, again[p], seen[p]);
		ck_assert_int_eq(kvmdirty_consumer_commit(c), (int64_t)l.pages);
		ck_assert_int_eq(kvmdirty_consumer_abort(c), 0);
		ck_assert_uint_eq(kvmdirty_consumer_pending(c), 0);
		/* the other consumer had all of it too, untouched by the abort */
		ck_assert_uint_eq(kvmdirty_consumer_pending(other), l.pages);
		memset(again, 0, l.pages);
		ck_assert_uint_eq(take(other, UINT64_MAX, again), l.pages);
		ck_assert_int_eq(kvmdirty_consumer_abort(other), 0); /* it commits as it goes */
	}
	free(seen);
	free(again);
	kvmdirty_consumer_free(c);
	kvmdirty_consumer_free(other);
	lockstep_free(&l);
}
END_TEST

/*
 * Pages handed out and thrown away (staged, never committed) must come
 * back, as must a write after the hand-out: on even passes nothing writes
 * between the hand-out and the last pass, so only the abort brings those
 * pages back; on odd ones the guest writes every page again first.
 */
START_TEST(abort_then_write)
{
	enum kvmdirty_mode mode = modes[_i];
	struct cons k = { .name = "aborting", .owes = true };
	struct lockstep l;
	int pass;

	lockstep_new(&l, mode, 1 << 20);
	ck_assert_ok(kvmdirty_consumer_new(l.tv->tracker, 0, &k.c));
	k.mirror.tv = k.stage.tv = l.tv;
	k.mirror.c = k.stage.c = k.c;
	rig_add_copy(&k.mirror, l.r, true, false);
	rig_add_copy(&k.stage, l.r, true, false);
	cons_pass(&k);
	for (pass = 0; pass < 4; pass++) {
		rig_run_pass(l.tv, 0);
		ck_assert_int_ge(kvmdirty_consumer_sync(k.c), 0);
		cons_next(&k, 200);
		if (pass % 2)
			/* the guest writes every page again before the hand-out's fate is known */
			rig_run_pass(l.tv, 0);
		ck_assert_int_eq(cons_abort(&k), 200);
		cons_pass(&k);
		cons_expect_fresh(&k);
	}
	kvmdirty_consumer_free(k.c);
	cons_free(&k);
	lockstep_free(&l);
}
END_TEST

/* ---- fetch_to_clear_window ---- */

static struct {
	struct handoff h;
	int armed;
} fc = { .h = HANDOFF_INIT };

static void fc_point(enum kd_hook_point p, void *obj)
{
	(void)obj;
	if (p != KD_HOOK_PROTECT || !__atomic_exchange_n(&fc.armed, 0, __ATOMIC_ACQ_REL))
		return;
	handoff_post(&fc.h);
	handoff_wait_go(&fc.h, 60000);
}

struct fc_next {
	struct cons *k;
	uint64_t max;
};

static void *fc_thread(void *p)
{
	struct fc_next *a = p;

	cons_next(a->k, a->max);
	return NULL;
}

/*
 * CLEAR_LOG, 64-page chunks.  The guest writes every page; one sync
 * fetches for A, B and (when asked) nobody else; A's next() of 64 pages is
 * held before its KVM_CLEAR_DIRTY_LOG while the guest writes every page
 * again (the second writes land between the fetch and the clear, leaving
 * KVM's dirty bits as they were) and, with join, a consumer D joins empty.
 * Then A clears and reads.  A, B and D must each end with every page as
 * the guest left it.  B has the pages pending from the fan-out; D only
 * from the fetched-not-cleared bits it joins with.
 */
static void fetch_to_clear(bool join)
{
	struct testvm_opts o = { .nr_vcpus = 1, .track = true,
				 .track_opts = { .mode = KVMDIRTY_MODE_CLEAR_LOG, .clear_chunk_pages = 64 } };
	struct cons a = { .name = "A (held before its clear)" }, b = { .name = "B", .owes = true },
		    d = { .name = "D (joined empty in the window)", .owes = true };
	struct fc_next arg = { &a, 64 };
	struct lockstep l;
	pthread_t th;

	hooks_off();
	ck_assert_ok(testvm_new(&o, &l.tv));
	ck_assert_ok(testvm_add_memory(l.tv, R_GPA, 1 << 20, 0, &l.mem, &l.r));
	l.pages = 256;
	rig_work(l.tv, 0, R_GPA, l.pages, GUEST_SEQUENTIAL, GUEST_F_EXIT_EVERY_PASS | GUEST_F_CHECK);
	ck_assert_ok(kvmdirty_tracker_start(l.tv->tracker, l.r));
	a.c = kvmdirty_tracker_consumer(l.tv->tracker);
	ck_assert_ok(kvmdirty_consumer_new(l.tv->tracker, 0, &b.c));
	a.mirror.tv = b.mirror.tv = b.stage.tv = l.tv;
	a.mirror.c = a.c;
	b.mirror.c = b.stage.c = b.c;
	rig_add_copy(&a.mirror, l.r, true, false);
	rig_add_copy(&b.mirror, l.r, true, false);
	rig_add_copy(&b.stage, l.r, true, false);
	cons_pass(&a);
	cons_pass(&b);

	rig_run_pass(l.tv, 0);
	ck_assert_int_ge(kvmdirty_consumer_sync(a.c), 0); /* the fetch, for A and B */
	__atomic_store_n(&fc.armed, 1, __ATOMIC_RELEASE);
	fc.h.posted = fc.h.go = 0;
	kd_test_hooks_set(NULL, fc_point, false);
	ck_assert_int_eq(pthread_create(&th, NULL, fc_thread, &arg), 0);
	handoff_wait_posted(&fc.h);
	if (join) {
		ck_assert_ok(kvmdirty_consumer_new(l.tv->tracker, KVMDIRTY_CONSUMER_EMPTY, &d.c));
		d.mirror.tv = d.stage.tv = l.tv;
		d.mirror.c = d.stage.c = d.c;
		rig_add_copy(&d.mirror, l.r, true, false);
		rig_add_copy(&d.stage, l.r, true, false);
		cons_snapshot(&d);
	}
	/* in the window: every page written again, KVM's bits already set */
	rig_run_pass(l.tv, 0);
	handoff_go(&fc.h);
	pthread_join(th, NULL);
	hooks_off();
	/* no more writes: each consumer's last pass */
	cons_pass(&a);
	cons_pass(&b);
	cons_expect_fresh(&a);
	cons_expect_fresh(&b);
	if (join) {
		cons_pass(&d);
		printf("fetch-to-clear: D, joined empty in the window, was handed %" PRIu64 " pages\n", d.handed);
		cons_expect_fresh(&d);
		kvmdirty_consumer_free(d.c);
		cons_free(&d);
	}
	kvmdirty_consumer_free(b.c);
	cons_free(&a);
	cons_free(&b);
	lockstep_free(&l);
}

START_TEST(fetch_to_clear_window)
{
	fetch_to_clear(false);
}
END_TEST

START_TEST(join_empty_in_fetch_to_clear_window)
{
	fetch_to_clear(true);
}
END_TEST

/* ---- mark_touch_window ---- */

static struct {
	struct handoff h;
	int armed;
} mt = { .h = HANDOFF_INIT };

static void mt_point(enum kd_hook_point p, void *obj)
{
	(void)obj;
	if (p != KD_HOOK_MARK_TOUCH || !__atomic_exchange_n(&mt.armed, 0, __ATOMIC_ACQ_REL))
		return;
	handoff_post(&mt.h);
	handoff_wait_go(&mt.h, 60000);
}

struct mt_mark {
	struct kvmdirty_tracker *t;
	uint64_t gpa;
	int ret;
};

static void *mt_thread(void *p)
{
	struct mt_mark *a = p;

	a->ret = kvmdirty_tracker_mark_dirty_gpa(a->t, a->gpa, PAGE);
	return NULL;
}

/*
 * DIRTY_RING: a sync visits only the regions whose touched bit is set.  A
 * device writes a page from the host and marks it; the mark is held after
 * it set the page's async bit and async_any and before it set the
 * region's touched bit, while the tracker syncs (that sync need not take
 * the page: the mark has not returned).  Once the mark returned, the next
 * sync must hand the page out.  With the touched bit set before async_any,
 * the held sync takes the bit and finds nothing, and the page is never
 * handed out again.
 */
START_TEST(mark_touch_window)
{
	struct testvm_opts o = { .nr_vcpus = 1, .track = true,
				 .track_opts = { .mode = KVMDIRTY_MODE_DIRTY_RING, .ring_entries = 4096 } };
	struct cons a = { .name = "the tracker (its mark held before the touched bit)" };
	struct mt_mark arg;
	struct lockstep l;
	pthread_t th;
	int64_t s;

	hooks_off();
	ck_assert_ok(testvm_new(&o, &l.tv));
	ck_assert_ok(testvm_add_memory(l.tv, R_GPA, 1 << 20, 0, &l.mem, &l.r));
	l.pages = 256;
	ck_assert_ok(kvmdirty_tracker_start(l.tv->tracker, l.r));
	a.c = kvmdirty_tracker_consumer(l.tv->tracker);
	a.mirror.tv = l.tv;
	a.mirror.c = a.c;
	rig_add_copy(&a.mirror, l.r, true, false);
	cons_pass(&a); /* every page, as at start */

	/* the device's write, then its mark, held before the touched bit */
	memset((uint8_t *)l.mem + 5 * PAGE, 0xa5, PAGE);
	arg = (struct mt_mark){ l.tv->tracker, R_GPA + 5 * PAGE, -1 };
	__atomic_store_n(&mt.armed, 1, __ATOMIC_RELEASE);
	mt.h.posted = mt.h.go = 0;
	kd_test_hooks_set(NULL, mt_point, false);
	ck_assert_int_eq(pthread_create(&th, NULL, mt_thread, &arg), 0);
	handoff_wait_posted(&mt.h);
	s = kvmdirty_consumer_sync(a.c);
	handoff_go(&mt.h);
	pthread_join(th, NULL);
	hooks_off();
	ck_assert_msg(s >= 0, "the sync beside the held mark: %" PRId64, s);
	ck_assert_int_eq(arg.ret, 0);
	/* the mark returned: this pass must copy the page */
	cons_pass(&a);
	cons_expect_fresh(&a);
	cons_free(&a);
	lockstep_free(&l);
}
END_TEST

/* ---- counting ---- */

START_TEST(counting)
{
	enum kvmdirty_mode mode = modes[_i];
	struct kvmdirty_consumer *cnt, *other;
	struct kvmdirty_vcpu_stats v0, v1;
	struct kvmdirty_count k;
	struct lockstep l;
	uint8_t *seen;
	int pass;

	lockstep_new(&l, mode, 1 << 20);
	ck_assert_ok(kvmdirty_consumer_new(l.tv->tracker, KVMDIRTY_CONSUMER_COUNT, &cnt));
	ck_assert_ok(kvmdirty_consumer_new(l.tv->tracker, KVMDIRTY_CONSUMER_EMPTY | KVMDIRTY_CONSUMER_AUTOCOMMIT,
					   &other));
	seen = calloc(l.pages, 1);
	ck_assert_ptr_nonnull(seen);
	ck_assert_errno(kvmdirty_consumer_next(cnt, NULL, 0, 0), EINVAL);
	/* the first count: every page (joined with all pending) */
	ck_assert_ok(kvmdirty_consumer_count(cnt, &k, sizeof(k)));
	ck_assert_uint_eq(k.pages, l.pages);
	for (pass = 0; pass < 3; pass++) {
		ck_assert_ok(kvmdirty_vcpu_stats(l.tv->vcpu[0], &v0, sizeof(v0)));
		rig_run_pass(l.tv, 0);
		ck_assert_ok(kvmdirty_consumer_count(cnt, &k, sizeof(k)));
		ck_assert_msg(k.pages == l.pages, "pass %d: counted %" PRIu64 " pages, the guest wrote %" PRIu64, pass,
			      k.pages, l.pages);
		ck_assert_ok(kvmdirty_vcpu_stats(l.tv->vcpu[0], &v1, sizeof(v1)));
		if (mode == KVMDIRTY_MODE_DIRTY_RING)
			ck_assert_uint_eq(v1.dirtied - v0.dirtied, l.pages);
		/* nothing written since: 0 */
		ck_assert_ok(kvmdirty_consumer_count(cnt, &k, sizeof(k)));
		ck_assert_uint_eq(k.pages, 0);
		/* the other consumer still gets every page the guest wrote */
		memset(seen, 0, l.pages);
		ck_assert_int_ge(kvmdirty_consumer_sync(other), 0);
		ck_assert_uint_eq(take(other, UINT64_MAX, seen), l.pages);
	}
	free(seen);
	kvmdirty_consumer_free(cnt);
	kvmdirty_consumer_free(other);
	lockstep_free(&l);
}
END_TEST

/*
 * Each vCPU's distinct pages (kvmdirty_vcpu_count): vCPU 0 writes every
 * page of its region twice an interval, with a harvest (and so a
 * re-protect) between, so its ring reports each page twice; vCPU 1 runs
 * all along and writes no tracked page.  The counts are exactly the
 * region's pages and 0; the bitmap modes refuse by name.
 */
START_TEST(vcpu_count)
{
	enum kvmdirty_mode mode = modes[_i];
	struct testvm_opts o = { .nr_vcpus = 2, .track = true, .track_opts = { .mode = mode } };
	struct kvmdirty_vcpu_stats s0, s1;
	struct kvmdirty_count k0, k1;
	struct kvmdirty_region *r;
	struct testvm *tv;
	uint64_t pages = (1 << 20) / PAGE;
	void *mem;
	int round, half;

	hooks_off();
	ck_assert_ok(testvm_new(&o, &tv));
	ck_assert_ok(testvm_add_memory(tv, R_GPA, pages * PAGE, 0, &mem, &r));
	rig_work(tv, 0, R_GPA, pages, GUEST_SEQUENTIAL, GUEST_F_EXIT_EVERY_PASS | GUEST_F_CHECK);
	/* its mailbox and stack are in the system region, which is not tracked here */
	rig_work(tv, 1, R_GPA, 64, GUEST_COMPUTE, GUEST_F_EXIT_EVERY_PASS);
	ck_assert_ok(kvmdirty_tracker_start(tv->tracker, r));
	ck_assert_errno(kvmdirty_vcpu_count(NULL, &k0, sizeof(k0)), EINVAL);
	ck_assert_errno(kvmdirty_vcpu_count(tv->vcpu[0], &k0, 0), EINVAL);
	if (mode != KVMDIRTY_MODE_DIRTY_RING) {
		ck_assert_errno(kvmdirty_vcpu_count(tv->vcpu[0], &k0, sizeof(k0)), EOPNOTSUPP);
		goto out;
	}
	ck_assert_int_ge(kvmdirty_tracker_sync(tv->tracker), 0);
	/* the first count starts the interval */
	ck_assert_ok(kvmdirty_vcpu_count(tv->vcpu[0], &k0, sizeof(k0)));
	ck_assert_ok(kvmdirty_vcpu_count(tv->vcpu[1], &k1, sizeof(k1)));
	ck_assert_uint_eq(k0.pages, 0);
	ck_assert_uint_eq(k0.ns, 0);
	for (round = 0; round < 3; round++) {
		ck_assert_ok(kvmdirty_vcpu_stats(tv->vcpu[0], &s0, sizeof(s0)));
		for (half = 0; half < 2; half++) {
			rig_run_pass(tv, 0);
			rig_run_pass(tv, 1);
			ck_assert_int_ge(kvmdirty_tracker_sync(tv->tracker), 0);
		}
		ck_assert_ok(kvmdirty_vcpu_stats(tv->vcpu[0], &s1, sizeof(s1)));
		/* the ring reported every page twice ... */
		ck_assert_uint_eq(s1.dirtied - s0.dirtied, 2 * pages);
		/* ... the count has each once */
		ck_assert_ok(kvmdirty_vcpu_count(tv->vcpu[0], &k0, sizeof(k0)));
		ck_assert_ok(kvmdirty_vcpu_count(tv->vcpu[1], &k1, sizeof(k1)));
		ck_assert_msg(k0.pages == pages && !k0.flags, "round %d: vCPU 0 counted %" PRIu64 " (flags %" PRIu64
			      "), it wrote %" PRIu64 " distinct pages", round, k0.pages, k0.flags, pages);
		ck_assert_msg(k1.pages == 0 && !k1.flags, "round %d: vCPU 1 wrote nothing and counted %" PRIu64,
			      round, k1.pages);
		ck_assert_uint_gt(k0.ns, 0);
		ck_assert_uint_gt(testvm_mailbox(tv, 1)->pass, (uint64_t)2 * round);
		/* nothing written since */
		ck_assert_ok(kvmdirty_vcpu_count(tv->vcpu[0], &k0, sizeof(k0)));
		ck_assert_uint_eq(k0.pages, 0);
	}
	/* stopped, what comes after is not counted: the next count starts again */
	ck_assert_ok(kvmdirty_vcpu_count(tv->vcpu[0], NULL, 0));
	rig_run_pass(tv, 0);
	ck_assert_int_ge(kvmdirty_tracker_sync(tv->tracker), 0);
	ck_assert_ok(kvmdirty_vcpu_count(tv->vcpu[0], &k0, sizeof(k0)));
	ck_assert_msg(k0.pages == 0 && k0.ns == 0, "after a stop: %" PRIu64 " pages over %" PRIu64 " ns", k0.pages,
		      k0.ns);
out:
	testvm_free(tv);
	testvm_unmap(mem, pages * PAGE);
}
END_TEST

/* A vCPU on a thread of its own, run until its guest is done. */
struct run_once {
	struct testvm *tv;
	int ret, done;
	struct testvm_exit ex;
};

static void *run_once_main(void *p)
{
	struct run_once *r = p;

	do
		r->ret = testvm_run(r->tv, 0, &r->ex);
	while (!r->ret && (r->ex.event == TESTVM_PASS || r->ex.event == TESTVM_TICK));
	__atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
	return NULL;
}

/*
 * kvmdirty_vcpu_count() from another thread while the vCPU runs, its
 * small ring filling (ring-full exits harvested by the run helper), the
 * reaper harvesting every millisecond and syncs harvesting too: each
 * harvest's pages go into one interval's set or the next, the swap being
 * under the lock every harvest takes.  The guest writes each page once
 * (its tag, two stores: a harvest between them reports the page again),
 * so the intervals' counts add up to at least its pages, and to at most
 * the entries its ring reported: a page dropped at a swap makes the sum
 * short, a set not emptied by a count makes it overshoot.
 */
START_TEST(vcpu_count_while_running)
{
	struct testvm_opts o = { .nr_vcpus = 1, .track = true,
				 .track_opts = { .mode = KVMDIRTY_MODE_DIRTY_RING, .ring_entries = 256, .reaper_ms = 1 } };
	uint64_t pages = (16ull << 20) / PAGE, total = 0, flags = 0, counts = 0, entries;
	struct kvmdirty_vcpu_stats s0, s1;
	struct kvmdirty_region *r;
	struct kvmdirty_count k;
	struct run_once ro;
	pthread_t th;
	struct testvm *tv;
	void *mem;

	hooks_off();
	ck_assert_ok(testvm_new(&o, &tv));
	ck_assert_ok(testvm_add_memory(tv, R_GPA, pages * PAGE, 0, &mem, &r));
	rig_work(tv, 0, R_GPA, pages, GUEST_SEQUENTIAL, GUEST_F_CHECK);
	testvm_mailbox(tv, 0)->until_pass = 1;
	ck_assert_ok(kvmdirty_tracker_start(tv->tracker, r));
	ck_assert_int_ge(kvmdirty_tracker_sync(tv->tracker), 0);
	ck_assert_ok(kvmdirty_vcpu_count(tv->vcpu[0], &k, sizeof(k)));
	ck_assert_ok(kvmdirty_vcpu_stats(tv->vcpu[0], &s0, sizeof(s0)));
	ro = (struct run_once){ .tv = tv };
	ck_assert_int_eq(pthread_create(&th, NULL, run_once_main, &ro), 0);
	while (!__atomic_load_n(&ro.done, __ATOMIC_ACQUIRE)) {
		if (counts++ % 2 && kvmdirty_tracker_sync(tv->tracker) < 0)
			break;
		if (kvmdirty_vcpu_count(tv->vcpu[0], &k, sizeof(k)) < 0)
			break;
		total += k.pages;
		flags |= k.flags;
	}
	pthread_join(th, NULL);
	ck_assert_msg(ro.ret == 0 && ro.ex.event == TESTVM_DONE, "the guest: %s, %s", strerror(-ro.ret),
		      testvm_event_name(ro.ex.event));
	ck_assert_int_ge(kvmdirty_tracker_sync(tv->tracker), 0);
	ck_assert_ok(kvmdirty_vcpu_count(tv->vcpu[0], &k, sizeof(k)));
	total += k.pages;
	flags |= k.flags;
	ck_assert_ok(kvmdirty_vcpu_stats(tv->vcpu[0], &s1, sizeof(s1)));
	entries = s1.dirtied - s0.dirtied;
	ck_assert_msg(total >= pages && total <= entries && !flags,
		      "%" PRIu64 " counts added up to %" PRIu64 " pages (flags %" PRIu64 "), the guest wrote %" PRIu64
		      ", its ring reported %" PRIu64,
		      counts, total, flags, pages, entries);
	testvm_free(tv);
	testvm_unmap(mem, pages * PAGE);
}
END_TEST

/*
 * A consumer's place (cursor) in a region that is removed, and the slot id
 * given to a smaller region: the next hand-out must start at that
 * region's head and stay inside it.  Each consumer's cursor went stale
 * this way (ranges past the end of the region, a pending count wrapped).
 */
START_TEST(slot_reused_cursor)
{
	struct testvm_opts o = { .nr_vcpus = 1, .track = true, .track_opts = { .mode = modes[_i] } };
	struct kvmdirty_region *r1, *r2;
	struct kvmdirty_consumer *c[2];
	struct kvmdirty_range rg[64];
	struct testvm *tv;
	void *m1, *m2;
	uint64_t total;
	int i, n, k;

	hooks_off();
	ck_assert_ok(testvm_new(&o, &tv));
	ck_assert_ok(testvm_add_memory(tv, R_GPA, R_SIZE, 0, &m1, &r1));
	ck_assert_ok(kvmdirty_tracker_start(tv->tracker, r1));
	c[0] = kvmdirty_tracker_consumer(tv->tracker);
	ck_assert_ok(kvmdirty_consumer_new(tv->tracker, 0, &c[1]));
	for (i = 0; i < 2; i++) {
		uint8_t seen[R_SIZE / PAGE] = { 0 };

		ck_assert_uint_eq(take(c[i], 1500, seen), 1500);
	}
	ck_assert_ok(kvmdirty_region_remove(tv->vm, r1));
	ck_assert_ok(testvm_add_memory(tv, DEV_GPA, DEV_SIZE, 0, &m2, &r2));
	ck_assert_uint_eq(kvmdirty_region_slot(r2), kvmdirty_region_slot(r1));
	ck_assert_ok(kvmdirty_tracker_start(tv->tracker, r2));
	for (i = 0; i < 2; i++) {
		ck_assert_uint_eq(kvmdirty_consumer_pending(c[i]), DEV_SIZE / PAGE);
		total = 0;
		while ((n = kvmdirty_consumer_next(c[i], rg, 64, 0)) > 0)
			for (k = 0; k < n; k++) {
				ck_assert_msg(rg[k].region == r2 && rg[k].page + rg[k].npages <= DEV_SIZE / PAGE,
					      "consumer %d: range [%" PRIu64 ", +%" PRIu64 ") outside the %" PRIu64
					      "-page region",
					      i, rg[k].page, rg[k].npages, (uint64_t)(DEV_SIZE / PAGE));
				total += rg[k].npages;
			}
		ck_assert_int_eq(n, 0);
		ck_assert_uint_eq(total, DEV_SIZE / PAGE);
		ck_assert_uint_eq(kvmdirty_consumer_pending(c[i]), 0);
	}
	testvm_free(tv);
	testvm_unmap(m1, R_SIZE);
	testvm_unmap(m2, DEV_SIZE);
}
END_TEST

/* ---- a count whose clear fails partway ---- */

static uint32_t fail_clear_slot = UINT32_MAX;

static int fail_clear(int fd, unsigned long req, void *arg)
{
	(void)fd;
	if (req == KVM_CLEAR_DIRTY_LOG && ((struct kvm_clear_dirty_log *)arg)->slot == fail_clear_slot)
		return -EIO;
	return KD_HOOK_PASS;
}

/*
 * CLEAR_LOG, two regions wholly pending for a counting consumer; its
 * count's clear fails in the second.  The pages the count took from the
 * first (cleared, gone from its pending set) must be in the next count:
 * they were dropped before.  A sync of a consumer that has every page
 * pending already still reports, in the statistics, what it fetched.
 */
START_TEST(count_fails_partway)
{
	struct testvm_opts o = { .nr_vcpus = 1, .track = true, .track_opts = { .mode = KVMDIRTY_MODE_CLEAR_LOG } };
	struct kvmdirty_consumer *cnt, *idle;
	struct kvmdirty_region *r1, *r2;
	struct kvmdirty_stats st;
	struct kvmdirty_count k;
	struct testvm *tv;
	void *m1, *m2;

	hooks_off();
	ck_assert_ok(testvm_new(&o, &tv));
	ck_assert_ok(testvm_add_memory(tv, R_GPA, 1 << 20, 0, &m1, &r1));
	ck_assert_ok(testvm_add_memory(tv, DEV_GPA, DEV_SIZE, 0, &m2, &r2));
	ck_assert_ok(kvmdirty_tracker_start(tv->tracker, r1));
	ck_assert_ok(kvmdirty_tracker_start(tv->tracker, r2));
	ck_assert_ok(kvmdirty_consumer_new(tv->tracker, KVMDIRTY_CONSUMER_COUNT, &cnt));
	ck_assert_ok(kvmdirty_consumer_new(tv->tracker, 0, &idle));
	fail_clear_slot = kvmdirty_region_slot(r2);
	kd_test_hooks_set(fail_clear, NULL, false);
	ck_assert_errno(kvmdirty_consumer_count(cnt, &k, sizeof(k)), EIO);
	hooks_off();
	ck_assert_ok(kvmdirty_consumer_count(cnt, &k, sizeof(k)));
	ck_assert_msg(k.pages == 512, "the count after a failed one: %" PRIu64 " pages, not the 512 pending at first",
		      k.pages);
	/* the device writes 3 pages; the idle consumer (everything still pending) syncs */
	memset(m2, 7, 3 * PAGE);
	ck_assert_ok(kvmdirty_tracker_mark_dirty_hva(tv->tracker, m2, 3 * PAGE));
	ck_assert_int_eq(kvmdirty_consumer_sync(idle), 0);
	ck_assert_ok(kvmdirty_tracker_stats(tv->tracker, &st, sizeof(st)));
	ck_assert_msg(st.last_sync_pages == 3, "last_sync_pages %" PRIu64 " after a sync that fetched 3 marked pages",
		      st.last_sync_pages);
	ck_assert_ok(kvmdirty_consumer_count(cnt, &k, sizeof(k)));
	ck_assert_uint_eq(k.pages, 3);
	testvm_free(tv);
	testvm_unmap(m1, 1 << 20);
	testvm_unmap(m2, DEV_SIZE);
}
END_TEST

/*
 * Claims: logging stays on for a region while any of the tracker's own
 * user (D, kvmdirty_tracker_start/_stop) and two consumers (A, B,
 * kvmdirty_consumer_start, then kvmdirty_consumer_free for A and
 * kvmdirty_consumer_stop for B) still needs it.  For every order of the
 * three starts and every choice of the one that ends last: after the
 * other two ended, a guest pass must reach that one whole, each page
 * once (a write logging-off hid would be missing); when it ends too,
 * logging is off and nothing is tracked.
 */
enum { CL_D, CL_A, CL_B };

static struct kvmdirty_consumer *cl_cons(struct lockstep *l, struct kvmdirty_consumer **ab, int who)
{
	return who == CL_D ? kvmdirty_tracker_consumer(l->tv->tracker) : ab[who - 1];
}

static void cl_start(struct lockstep *l, struct kvmdirty_consumer **ab, int who)
{
	if (who == CL_D)
		ck_assert_ok(kvmdirty_tracker_start(l->tv->tracker, l->r));
	else
		ck_assert_ok(kvmdirty_consumer_start(ab[who - 1], l->r));
}

static void cl_end(struct lockstep *l, struct kvmdirty_consumer **ab, int who)
{
	if (who == CL_D) {
		ck_assert_ok(kvmdirty_tracker_stop(l->tv->tracker, NULL));
	} else if (who == CL_A) {
		kvmdirty_consumer_free(ab[0]);
		ab[0] = NULL;
	} else {
		ck_assert_ok(kvmdirty_consumer_stop(ab[1], l->r));
	}
}

START_TEST(claims_keep_logging)
{
	static const int perms[6][3] = { { 0, 1, 2 }, { 0, 2, 1 }, { 1, 0, 2 }, { 1, 2, 0 }, { 2, 0, 1 }, { 2, 1, 0 } };
	static const char *const who_name[] = { "the tracker's user", "consumer A (freed)", "consumer B (stopped)" };
	enum kvmdirty_mode mode = modes[_i];
	unsigned int p, last, k, runs = 0;
	uint8_t *seen;

	for (p = 0; p < 6; p++) {
		for (last = 0; last < 3; last++) {
			struct kvmdirty_consumer *ab[2], *surv;
			struct kvmdirty_consumer_info in;
			struct lockstep l;
			uint64_t got, q;

			lockstep_new(&l, mode, 1 << 20);
			/* lockstep_new() started the region for the tracker's user: not here, the order decides */
			ck_assert_ok(kvmdirty_tracker_stop(l.tv->tracker, NULL));
			ck_assert_ok(kvmdirty_consumer_new(l.tv->tracker, 0, &ab[0]));
			ck_assert_ok(kvmdirty_consumer_new(l.tv->tracker, 0, &ab[1]));
			seen = calloc(l.pages, 1);
			ck_assert_ptr_nonnull(seen);
			for (k = 0; k < 3; k++)
				cl_start(&l, ab, perms[p][k]);
			ck_assert(kvmdirty_region_flags(l.r) & KVMDIRTY_REGION_LOG_DIRTY);
			/* the two that end first, in the order they started */
			for (k = 0; k < 3; k++)
				if (perms[p][k] != (int)last)
					cl_end(&l, ab, perms[p][k]);
			surv = cl_cons(&l, ab, (int)last);
			ck_assert_msg(kvmdirty_region_flags(l.r) & KVMDIRTY_REGION_LOG_DIRTY,
				      "%s, starts %d%d%d: logging off while %s still needs it", mode_name(mode), perms[p][0],
				      perms[p][1], perms[p][2], who_name[last]);
			/* what the survivor had pending, gone; then one pass of the guest must reach it whole */
			ck_assert_int_ge(kvmdirty_consumer_sync(surv), 0);
			take(surv, UINT64_MAX, seen);
			kvmdirty_consumer_commit(surv);
			memset(seen, 0, l.pages);
			rig_run_pass(l.tv, 0);
			ck_assert_int_ge(kvmdirty_consumer_sync(surv), 0);
			got = take(surv, UINT64_MAX, seen);
			kvmdirty_consumer_commit(surv);
			for (q = 0; q < l.pages; q++)
				ck_assert_msg(seen[q] == 1, "%s, starts %d%d%d, %s last: page %" PRIu64 " of the pass "
					      "handed out %u times (%" PRIu64 " pages in all)",
					      mode_name(mode), perms[p][0], perms[p][1], perms[p][2], who_name[last], q,
					      seen[q], got);
			/* the last one ends: logging off, nothing tracked */
			cl_end(&l, ab, (int)last);
			ck_assert_msg(!(kvmdirty_region_flags(l.r) & KVMDIRTY_REGION_LOG_DIRTY),
				      "%s: logging on once every claim went", mode_name(mode));
			ck_assert_ok(kvmdirty_consumer_info(kvmdirty_tracker_consumer(l.tv->tracker), &in, sizeof(in)));
			ck_assert_uint_eq(in.tracked_pages, 0);
			if (ab[0])
				kvmdirty_consumer_free(ab[0]);
			kvmdirty_consumer_free(ab[1]);
			free(seen);
			lockstep_free(&l);
			runs++;
		}
	}
	printf("claims, %s: %u orders, each pass whole for the last claimant, logging off after it\n", mode_name(mode),
	       runs);
	/* every region at once: a consumer's claims on all of them go with it */
	{
		struct kvmdirty_consumer *c;
		struct lockstep l;

		lockstep_new(&l, mode, 1 << 20);
		ck_assert_ok(kvmdirty_tracker_stop(l.tv->tracker, NULL));
		ck_assert_ok(kvmdirty_consumer_new(l.tv->tracker, 0, &c));
		ck_assert_ok(kvmdirty_consumer_start(c, NULL));
		ck_assert(kvmdirty_region_flags(l.r) & KVMDIRTY_REGION_LOG_DIRTY);
		ck_assert(kvmdirty_region_flags(l.tv->sys_region) & KVMDIRTY_REGION_LOG_DIRTY);
		ck_assert_ok(kvmdirty_tracker_start(l.tv->tracker, l.tv->sys_region));
		kvmdirty_consumer_free(c);
		ck_assert(!(kvmdirty_region_flags(l.r) & KVMDIRTY_REGION_LOG_DIRTY));
		/* the tracker's user still needs the system region */
		ck_assert(kvmdirty_region_flags(l.tv->sys_region) & KVMDIRTY_REGION_LOG_DIRTY);
		lockstep_free(&l);
	}
}
END_TEST

START_TEST(bad_calls)
{
	struct kvmdirty_consumer *c;
	struct kvmdirty_count k;
	struct kvmdirty_consumer_info in;
	struct lockstep l;

	lockstep_new(&l, KVMDIRTY_MODE_AUTO, 1 << 20);
	ck_assert_errno(kvmdirty_consumer_new(NULL, 0, &c), EINVAL);
	ck_assert_errno(kvmdirty_consumer_new(l.tv->tracker, 0, NULL), EINVAL);
	ck_assert_errno(kvmdirty_consumer_new(l.tv->tracker, 1u << 7, &c), EINVAL);
	ck_assert_errno(kvmdirty_consumer_new(l.tv->tracker, KVMDIRTY_CONSUMER_COUNT | KVMDIRTY_CONSUMER_AUTOCOMMIT,
					      &c),
			EINVAL);
	ck_assert_errno(kvmdirty_consumer_sync(NULL), EINVAL);
	ck_assert_errno(kvmdirty_consumer_next(NULL, NULL, 0, 0), EINVAL);
	ck_assert_errno(kvmdirty_consumer_commit(NULL), EINVAL);
	ck_assert_errno(kvmdirty_consumer_abort(NULL), EINVAL);
	ck_assert_errno(kvmdirty_consumer_info(NULL, &in, sizeof(in)), EINVAL);
	ck_assert_errno(kvmdirty_consumer_count(NULL, &k, sizeof(k)), EINVAL);
	ck_assert_errno(kvmdirty_consumer_start(NULL, NULL), EINVAL);
	ck_assert_errno(kvmdirty_consumer_stop(NULL, NULL), EINVAL);
	ck_assert_uint_eq(kvmdirty_consumer_pending(NULL), 0);
	ck_assert_ptr_null(kvmdirty_tracker_consumer(NULL));
	ck_assert_ok(kvmdirty_consumer_new(l.tv->tracker, 0, &c));
	ck_assert_errno(kvmdirty_consumer_next(c, NULL, 1, 0), EINVAL);
	ck_assert_errno(kvmdirty_consumer_count(c, &k, sizeof(k)), EINVAL); /* not a counting one */
	ck_assert_ok(kvmdirty_consumer_info(c, &in, sizeof(in)));
	ck_assert_uint_eq(in.pending, l.pages);
	ck_assert_uint_eq(in.tracked_pages, l.pages);
	ck_assert_uint_eq(in.bitmap_bytes, 2 * KVMDIRTY_BITMAP_WORDS(l.pages) * 8);
	/* the default consumer is the tracker's: freeing it does nothing */
	kvmdirty_consumer_free(kvmdirty_tracker_consumer(l.tv->tracker));
	ck_assert_ptr_nonnull(kvmdirty_tracker_consumer(l.tv->tracker));
	ck_assert_uint_eq(kvmdirty_tracker_pending(l.tv->tracker), l.pages);
	/* a consumer left to the tracker is freed with it */
	lockstep_free(&l);
}
END_TEST

int main(void)
{
	int skip = require_kvm("test-consumers");
	Suite *s;
	TCase *tc;

	if (skip)
		return skip;
	s = suite_create("consumers");
	tc = tcase_create("consumers");
	tcase_set_timeout(tc, 600);
	tcase_add_loop_test(tc, three_consumers, 0, MODES);
	tcase_add_loop_test(tc, four_consumers_one_joins_empty, 0, MODES);
	tcase_add_loop_test(tc, abort_puts_back, 0, MODES);
	tcase_add_loop_test(tc, abort_then_write, 0, MODES);
	tcase_add_test(tc, fetch_to_clear_window);
	tcase_add_test(tc, join_empty_in_fetch_to_clear_window);
	tcase_add_loop_test(tc, counting, 0, MODES);
	tcase_add_loop_test(tc, vcpu_count, 0, MODES);
	tcase_add_test(tc, vcpu_count_while_running);
	tcase_add_loop_test(tc, slot_reused_cursor, 0, MODES);
	tcase_add_test(tc, count_fails_partway);
	tcase_add_test(tc, bad_calls);
	tcase_add_loop_test(tc, claims_keep_logging, 0, MODES);
	suite_add_tcase(s, tc);
	/* its own case, to be run alone (CK_RUN_CASE=touch) */
	tc = tcase_create("touch");
	tcase_set_timeout(tc, 600);
	tcase_add_test(tc, mark_touch_window);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
