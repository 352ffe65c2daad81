/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_TEST_RIG_H
#define KVMDIRTY_TEST_RIG_H

/*
 * The migration-style rig the tracking tests share, after the kernel's
 * dirty_log_test: the test guest writes (gfn, pass) tags while the host
 * syncs and copies every page it is handed.  After the guest stops and a
 * last sync, the copy must equal guest memory: a write the tracker lost
 * leaves a stale copy behind.  Counting hand-outs per page also shows a
 * page reported twice for one write.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <time.h>

#include "testvm.h"
#include "kvm-skip.h"
#include "test-util.h"

#define PAGE ((uint64_t)4096)
#define GIB (1ull << 30)
#define RIG_MAX_REGIONS 8

/* What the consumer copied: whole pages, or the tag alone; and how often each page came. */
struct copy {
	struct kvmdirty_region *region; /* NULL once removed: not compared */
	uint8_t *hva;
	uint64_t npages;
	struct guest_tag *tags;
	uint8_t *pages;	    /* whole pages, when asked */
	uint32_t *reported; /* times each page was handed out, when asked */
};

struct rig {
	struct testvm *tv;
	struct kvmdirty_tracker *t;
	struct kvmdirty_consumer *c; /* NULL: the tracker's own calls */
	struct copy copies[RIG_MAX_REGIONS];
	unsigned int nr;
	uint64_t handed_out;
	unsigned int delay_us; /* after copying each batch: a window for the guest */
	bool regions_move;     /* another thread moves regions: no gpa check */
};

static inline struct copy *rig_copy_of(struct rig *g, const struct kvmdirty_region *r)
{
	unsigned int i;

	for (i = 0; i < g->nr; i++)
		if (g->copies[i].region == r)
			return &g->copies[i];
	ck_abort_msg("range in unknown region slot %u", kvmdirty_region_slot(r));
	return NULL;
}

static inline struct copy *rig_add_copy(struct rig *g, struct kvmdirty_region *r, bool whole_pages, bool count)
{
	struct copy *c = &g->copies[g->nr++];

	ck_assert_uint_le(g->nr, RIG_MAX_REGIONS);
	c->region = r;
	c->hva = kvmdirty_region_hva(r);
	c->npages = kvmdirty_region_size(r) / PAGE;
	c->tags = calloc(c->npages, sizeof(*c->tags));
	c->pages = whole_pages ? calloc(c->npages, PAGE) : NULL;
	c->reported = count ? calloc(c->npages, sizeof(uint32_t)) : NULL;
	ck_assert_ptr_nonnull(c->tags);
	return c;
}

static inline void rig_pause_us(unsigned int us)
{
	struct timespec ts = { (time_t)(us / 1000000), (long)(us % 1000000) * 1000 };

	if (us)
		nanosleep(&ts, NULL);
}

/* Read the pages of ranges just handed out (after next() returned, as the contract asks). */
static inline void rig_read(struct rig *g, const struct kvmdirty_range *rg, int n)
{
	int i;

	for (i = 0; i < n; i++) {
		struct copy *c = rig_copy_of(g, rg[i].region);
		uint64_t p;

		expect(rg[i].npages && rg[i].page + rg[i].npages <= c->npages,
		       "range [%" PRIu64 ", +%" PRIu64 ") outside slot %u", rg[i].page, rg[i].npages,
		       kvmdirty_region_slot(rg[i].region));
		expect((uint8_t *)rg[i].hva == c->hva + rg[i].page * PAGE, "hva of range");
		expect(g->regions_move || rg[i].gpa == kvmdirty_region_gpa(rg[i].region) + rg[i].page * PAGE,
		       "gpa of range");
		for (p = rg[i].page; p < rg[i].page + rg[i].npages; p++) {
			memcpy(&c->tags[p], c->hva + p * PAGE, sizeof(c->tags[p]));
			if (c->pages)
				memcpy(c->pages + p * PAGE, c->hva + p * PAGE, PAGE);
			if (c->reported)
				c->reported[p]++;
		}
		g->handed_out += rg[i].npages;
	}
}

/* Take everything pending, reading each page after the tracker hands it out. */
static inline void rig_consume(struct rig *g)
{
	struct kvmdirty_range rg[64];
	int n;

	while ((n = g->c ? kvmdirty_consumer_next(g->c, rg, 64, 4096) : kvmdirty_tracker_next(g->t, rg, 64, 4096)) >
	       0) {
		rig_read(g, rg, n);
		rig_pause_us(g->delay_us);
	}
	ck_assert_msg(n == 0, "kvmdirty_tracker_next: %d (%s)", n, strerror(-n));
	rig_pause_us(g->delay_us);
}

static inline void rig_sync(struct rig *g)
{
	int64_t n = g->c ? kvmdirty_consumer_sync(g->c) : kvmdirty_tracker_sync(g->t);

	ck_assert_msg(n >= 0, "kvmdirty_tracker_sync: %" PRId64 " (%s)", n, strerror((int)-n));
}

static inline void rig_sync_consume(struct rig *g)
{
	rig_sync(g);
	rig_consume(g);
}

/* Pages whose copy differs from guest memory; the first one described in first. */
static inline uint64_t rig_stale(struct rig *g, char *first, size_t len)
{
	uint64_t stale = 0, p;
	unsigned int i;

	first[0] = 0;
	for (i = 0; i < g->nr; i++) {
		struct copy *c = &g->copies[i];

		for (p = 0; c->region && p < c->npages; p++) {
			const struct guest_tag *m = (const void *)(c->hva + p * PAGE);
			bool same = c->pages ? !memcmp(c->pages + p * PAGE, c->hva + p * PAGE, PAGE)
					     : !memcmp(&c->tags[p], m, sizeof(*m));

			if (!same && !stale++)
				snprintf(first, len,
					 "gpa 0x%" PRIx64 " copy (%" PRIu64 ", %" PRIu64 ") memory (%" PRIu64 ", %" PRIu64 ")",
					 kvmdirty_region_gpa(c->region) + p * PAGE, c->tags[p].gfn, c->tags[p].pass,
					 m->gfn, m->pass);
		}
	}
	return stale;
}

/* The copy equals memory, or the test fails naming the first stale page. */
static inline void rig_expect_fresh(struct rig *g, const char *what)
{
	char first[160];
	uint64_t stale = rig_stale(g, first, sizeof(first));

	ck_assert_msg(stale == 0, "%s: %" PRIu64 " pages changed without being reported; first: %s", what,
		      stale, first);
}

static inline void rig_free(struct rig *g)
{
	unsigned int i;

	for (i = 0; i < g->nr; i++) {
		free(g->copies[i].tags);
		free(g->copies[i].pages);
		free(g->copies[i].reported);
	}
	g->nr = 0;
}

/* The end of a run: a last sync, the copy checked against memory, the rig and its guest freed. */
static inline void rig_finish(struct rig *g, const char *what)
{
	rig_sync_consume(g);
	rig_expect_fresh(g, what);
	rig_free(g);
	testvm_free(g->tv);
}

/* A guest workload for vCPU i. */
static inline void rig_work(struct testvm *tv, unsigned int i, uint64_t gpa, uint64_t pages, uint32_t pattern,
			    uint32_t flags)
{
	struct guest_vcpu *mb = testvm_mailbox(tv, i);

	mb->gpa = gpa;
	mb->pages = pages;
	mb->pattern = pattern;
	mb->flags = flags;
	mb->seed = 12345 + i;
}

/* Run vCPU i on this thread until its guest finishes a pass (GUEST_F_EXIT_EVERY_PASS). */
static inline void rig_run_pass(struct testvm *tv, unsigned int i)
{
	struct testvm_exit ex;
	int ret;

	do {
		ret = testvm_run(tv, i, &ex);
		ck_assert_msg(ret == 0, "vCPU %u: KVM_RUN: %s", i, strerror(-ret));
		ck_assert_msg(ex.event == TESTVM_PASS || ex.event == TESTVM_TICK,
			      "vCPU %u: %s (exit %u), check page 0x%" PRIx64, i, testvm_event_name(ex.event),
			      ex.exit_reason, testvm_mailbox(tv, i)->err_gpa);
	} while (ex.event != TESTVM_PASS);
}

/*
 * A hand-off between a thread held at a hook point and the test's main
 * thread: the held thread posts and waits for go (or for a bound, so that
 * a main thread blocked by the library's own lock lets it go on); the main
 * thread waits for the post.  States only move forward.
 */
struct handoff {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int posted, go;
};

#define HANDOFF_INIT { PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, 0, 0 }

static inline void handoff_post(struct handoff *h)
{
	pthread_mutex_lock(&h->lock);
	h->posted = 1;
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->lock);
}

/* Wait until go, or at most ms (0: no bound); true if go was given. */
static inline bool handoff_wait_go(struct handoff *h, unsigned int ms)
{
	struct timespec ts;
	bool go;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += ms / 1000;
	ts.tv_nsec += (long)(ms % 1000) * 1000000;
	if (ts.tv_nsec >= 1000000000) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&h->lock);
	while (!h->go)
		if (ms && pthread_cond_timedwait(&h->cond, &h->lock, &ts))
			break;
		else if (!ms)
			pthread_cond_wait(&h->cond, &h->lock);
	go = h->go;
	pthread_mutex_unlock(&h->lock);
	return go;
}

static inline void handoff_wait_posted(struct handoff *h)
{
	pthread_mutex_lock(&h->lock);
	while (!h->posted)
		pthread_cond_wait(&h->cond, &h->lock);
	pthread_mutex_unlock(&h->lock);
}

static inline void handoff_go(struct handoff *h)
{
	pthread_mutex_lock(&h->lock);
	h->go = 1;
	pthread_cond_broadcast(&h->cond);
	pthread_mutex_unlock(&h->lock);
}

#endif
