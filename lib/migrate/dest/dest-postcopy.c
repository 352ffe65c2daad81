// SPDX-License-Identifier: MIT
/*
 * Post-copy at the destination (dest-postcopy.h): faults into requests on
 * the fault channel, pages from every connection checked and placed.
 *
 * Who places a page: whichever receiving thread's UFFDIO_COPY comes first
 * (an answer and the bulk copy of one page may both arrive); the other
 * one's fails with EEXIST and is passed over.  A page's "left" bit is
 * cleared, under the lock, after its copy or its EEXIST, never before, so
 * that "no page left" means every LEFT page is in memory.
 */
#define _GNU_SOURCE /* qsort_r */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <linux/userfaultfd.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include "clock.h"
#include "dest-postcopy.h"
#include "errf.h"
#include "handoff.h"
#include "stream.h"
#include "uffd.h"

#define PAGE ((uint64_t)MIG_PAGE_SIZE)
#define PC_AROUND 16 /* pages a fault asks for: its own and the LEFT ones after it, not yet asked for */
#define PC_MSGS 16   /* faults read at a time */
#define PC_PEND 1024 /* faults awaiting their page, timed (more are served, not timed) */

struct pc_region {
	uint8_t *hva;
	uint64_t size, npages, gpa;
	uint64_t *was;	/* LEFT at the switch (never changes) */
	uint64_t *left; /* ... and not yet placed (under lock) */
	uint64_t *req;	/* ... asked for (under lock) */
};

struct pend {
	uint32_t r;
	uint64_t p, t_ns;
};

struct rx {
	struct mig_pc *pc;
	unsigned int i;
	uint64_t gen;	     /* the session it reads */
	struct mig_chan *ch; /* its connection's channel, of the session it was started on */
	bool fault;	     /* ... the fault channel */
	pthread_t thread;
	bool started;
};

struct mig_pc {
	const struct mig_guest *g;
	struct pc_region *r;
	struct mig_region *regs; /* the same, as the stream has them (mig_pc_check()) */
	uint32_t nr;
	uint32_t *by_hva; /* region indexes in address order */
	int uffd, stop_fd;
	struct mig_session *s;
	struct mig_chan *fch; /* the fault channel: the session's last connection (read and written under wlock) */
	uint64_t gen;	      /* the session's number: 1, then one more at each recovery (under lock and wlock) */
	unsigned int nconns;  /* the session's connections (every recovered one has as many) */
	struct mig_status *st;
	struct mig_status own_st; /* st where the caller gave none */
	bool own_st_used;
	pthread_t fault_thread;
	bool fault_started;
	struct rx rx[MIG_MAX_CONNS];
	pthread_mutex_t lock;  /* everything below, the bitmaps' left and req */
	pthread_mutex_t wlock; /* writes on the fault channel */
	pthread_cond_t cond;
	uint64_t missing;
	bool complete, failed, paused, stopping, registered;
	bool acked; /* complete, and the source closed the fault channel after ALL_IN: it knows */
	bool pause_done; /* failed and the guest paused: a fault is served zeroes from now */
	int ret;
	struct mig_pc_stats stt;
	struct pend pend[PC_PEND];
	unsigned int npend;
	double t0;
	/* recovery: where a new session comes (-1: nowhere), how it is taken, the session it must name */
	int lfd;
	struct mig_session_opts so;
	struct mig_psk psk;
	uint8_t id[32];
	char name[MIG_NAME_MAX]; /* the name the session agreed: a recovery must mean it */
	pthread_t rec_thread;
	bool rec_started;
	uint64_t recoveries;
};

static bool bit(const uint64_t *m, uint64_t i)
{
	return m[i / 64] >> (i % 64) & 1;
}

static void bit_set(uint64_t *m, uint64_t i)
{
	m[i / 64] |= 1ull << (i % 64);
}

static void bit_clear(uint64_t *m, uint64_t i)
{
	m[i / 64] &= ~(1ull << (i % 64));
}

static uint32_t region_of(const struct mig_pc *pc, uint64_t a)
{
	uint32_t lo = 0, hi = pc->nr;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		const struct pc_region *r = &pc->r[pc->by_hva[mid]];
		uint64_t base = (uint64_t)(uintptr_t)r->hva;

		if (a < base)
			hi = mid;
		else if (a >= base + r->size)
			lo = mid + 1;
		else
			return pc->by_hva[mid];
	}
	return UINT32_MAX;
}

static int send_rec_on(struct mig_pc *pc, struct mig_record rec, uint64_t *ret_gen);

static int send_rec(struct mig_pc *pc, struct mig_record rec)
{
	return send_rec_on(pc, rec, NULL);
}

/*
 * Failed, the guest paused for good: a thread waiting on a missing page
 * (a VMM thread reading guest memory) gets zeroes, not a wait for ever;
 * later faults too (on_fault()).  Never the copy that failed.
 */
static void zero_waiters(struct mig_pc *pc)
{
	uint32_t r;
	uint64_t p;

	for (r = 0; r < pc->nr; r++) {
		struct pc_region *rg = &pc->r[r];

		for (p = 0; p < rg->npages; p++) {
			bool want;

			pthread_mutex_lock(&pc->lock);
			/* every missing page: a waiter's request may have been cleared by a recovery */
			want = bit(rg->left, p);
			pthread_mutex_unlock(&pc->lock);
			if (want)
				mig_uffd_place(pc->uffd, rg->hva + p * PAGE, NULL, PAGE);
		}
	}
}

/* The first failure wins: the guest paused (from this thread), every waiter told. */
static void pc_fail(struct mig_pc *pc, int ret, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void pc_fail(struct mig_pc *pc, int ret, const char *fmt, ...)
{
	char esc[2 * MIG_EVENT_LINE / 3];
	va_list ap;

	pthread_mutex_lock(&pc->lock);
	if (pc->failed || pc->complete || pc->stopping) {
		pthread_mutex_unlock(&pc->lock);
		return;
	}
	pc->failed = true;
	pc->ret = ret;
	va_start(ap, fmt);
	vsnprintf(pc->stt.why, sizeof(pc->stt.why), fmt, ap);
	va_end(ap);
	pthread_mutex_unlock(&pc->lock);
	/* every vCPU out of KVM_RUN (one waiting on a page leaves on the kick) before anyone is told */
	pc->g->ops->pause(pc->g->ctx);
	pthread_mutex_lock(&pc->lock);
	pc->pause_done = true;
	pthread_cond_broadcast(&pc->cond);
	pthread_mutex_unlock(&pc->lock);
	mig_event_str(esc, sizeof(esc), pc->stt.why);
	mig_status_event(pc->st, "postcopy-failed", "\"side\":\"destination\",\"error\":\"%s\"", esc);
	mig_status_set_state(pc->st, "failed");
	zero_waiters(pc);
	/* the source is told (best effort): the guest is lost, its copy there is older than the state that ran here */
	if (send_rec(pc, (struct mig_record){ .kind = MIG_PC_FAILED, .first = (uint64_t)(int64_t)ret }) == 0) {
		pthread_mutex_lock(&pc->wlock);
		mig_chan_close_write(pc->fch);
		pthread_mutex_unlock(&pc->wlock);
	}
}

/* query's post-copy figures (the status's), from the stats now. */
static void pc_progress(struct mig_pc *pc)
{
	struct mig_pc_stats st;

	mig_pc_get_stats(pc, &st);
	mig_status_postcopy_progress(pc->st, st.missing, st.faults, st.fault_p50_us, st.fault_p99_us);
}

/*
 * A connection ended or failed before every page was in: post-copy waits
 * (a vCPU that touches a missing page waits), the pages in stay, and the
 * whole session is cut, so that the source hears it on every connection;
 * a recovery makes a new one (recover_main()).
 */
static void link_down(struct mig_pc *pc, struct mig_chan *ch, uint64_t gen, unsigned int i, int ret)
{
	char why[200], esc[300];
	uint64_t missing;
	unsigned int k;

	if (ret >= 0)
		snprintf(why, sizeof(why), "connection %u ended with pages still at the source", i);
	else {
		char what[120];

		/* the channel's own words are its reader's to ask for (a writer would race the reading thread) */
		if (ch)
			mig_chan_strerror(ch, ret, what, sizeof(what));
		else
			snprintf(what, sizeof(what), "sending: %s", strerror(-ret));
		snprintf(why, sizeof(why), "connection %u: %s", i, what);
	}
	pthread_mutex_lock(&pc->lock);
	if (pc->complete || pc->failed || pc->stopping || pc->paused || gen != pc->gen) {
		/* over, paused already (this session: resume_with() unpauses before its threads start), or an old session */
		pthread_mutex_unlock(&pc->lock);
		return;
	}
	pc->paused = true;
	snprintf(pc->stt.why, sizeof(pc->stt.why), "%s", why);
	missing = pc->missing;
	for (k = 0; pc->s && k < pc->s->conns; k++)
		shutdown(pc->s->fd[k], SHUT_RDWR);
	pthread_cond_broadcast(&pc->cond);
	pthread_mutex_unlock(&pc->lock);
	mig_status_postcopy_paused(pc->st, true);
	pc_progress(pc);
	mig_event_str(esc, sizeof(esc), why);
	mig_status_event(pc->st, "postcopy-paused",
			 "\"side\":\"destination\",\"missing_pages\":%" PRIu64 ",\"why\":\"%s\"", missing, esc);
	mig_status_set_state(pc->st, "postcopy-paused");
}

/*
 * A record on the fault channel, once post-copy has it (a fault before
 * the ACK waits for it, and one while paused for the recovered session's);
 * *ret_ch (may be NULL): the channel it went on.
 */
static int send_rec_on(struct mig_pc *pc, struct mig_record rec, uint64_t *ret_gen)
{
	struct iovec iov = { &rec, sizeof(rec) };
	int ret;

	for (;;) {
		struct mig_chan *ch;
		uint64_t gen;

		/* not before the channel exists, nor while post-copy is paused: the recovered session's then */
		pthread_mutex_lock(&pc->lock);
		while ((!pc->fch || pc->paused) && !pc->stopping && !pc->pause_done)
			pthread_cond_wait(&pc->cond, &pc->lock);
		pthread_mutex_unlock(&pc->lock);
		/* the channel read where it is written, under wlock: a recovery swaps (and frees) it under wlock too */
		pthread_mutex_lock(&pc->wlock);
		pthread_mutex_lock(&pc->lock);
		ch = pc->stopping || (pc->paused && !pc->pause_done) ? NULL : pc->fch;
		gen = pc->gen;
		ret = pc->stopping ? -ECANCELED : 0;
		pthread_mutex_unlock(&pc->lock);
		if (ch)
			ret = mig_chan_writev(ch, &iov, 1);
		pthread_mutex_unlock(&pc->wlock);
		if (ret_gen)
			*ret_gen = gen;
		if (ch || ret < 0)
			return ret;
	}
}

/* Every LEFT page is in: ALL_IN, the regions unregistered (called once, outside the lock). */
/*
 * ALL_IN on the fault channel, with the figures, and this end of it closed
 * (the source acknowledges with its own ALL_IN); not while paused (the
 * recovered session carries it: resume_with()).
 */
static void send_all_in(struct mig_pc *pc)
{
	struct mig_pc_stats st;
	struct mig_record rec;
	struct iovec iov = { &rec, sizeof(rec) };
	struct mig_chan *ch;

	mig_pc_get_stats(pc, &st);
	rec = (struct mig_record){ .kind = MIG_ALL_IN, .index = st.faults > UINT32_MAX ? UINT32_MAX : (uint32_t)st.faults,
				   .first = (uint64_t)(st.fault_p50_us * 1e3), .count = (uint64_t)(st.fault_p99_us * 1e3) };
	pthread_mutex_lock(&pc->wlock);
	pthread_mutex_lock(&pc->lock);
	ch = pc->paused ? NULL : pc->fch;
	pthread_mutex_unlock(&pc->lock);
	if (ch && mig_chan_writev(ch, &iov, 1) == 0)
		mig_chan_close_write(ch);
	pthread_mutex_unlock(&pc->wlock);
}

static void all_in(struct mig_pc *pc)
{
	uint32_t r;

	for (r = 0; r < pc->nr; r++)
		mig_uffd_unregister(pc->uffd, pc->r[r].hva, pc->r[r].size);
	/* paused: the recovered session carries ALL_IN (resume_with()) */
	struct mig_pc_stats st;

	send_all_in(pc);
	mig_pc_get_stats(pc, &st);
	mig_status_event(pc->st, "postcopy-completed",
			 "\"side\":\"destination\",\"pages\":%" PRIu64 ",\"faults\":%" PRIu64 ",\"ms\":%.1f", st.left,
			 st.faults, st.complete_ms);
	mig_status_set_state(pc->st, "completed");
}

/* Pages [p, p + n) of region r are in memory (placed here or found there): each counted once. */
static void mark(struct mig_pc *pc, uint32_t r, uint64_t p, uint64_t n)
{
	struct pc_region *rg = &pc->r[r];
	uint64_t now = mig_clock_ns(), k, placed0;
	bool done = false, progress;
	unsigned int j;

	pthread_mutex_lock(&pc->lock);
	placed0 = pc->stt.placed;
	for (k = p; k < p + n; k++) {
		if (!bit(rg->left, k)) {
			pc->stt.dups++;
			continue;
		}
		bit_clear(rg->left, k);
		pc->missing--;
		pc->stt.placed++;
		for (j = 0; j < pc->npend;) {
			if (pc->pend[j].r == r && pc->pend[j].p == k) {
				uint64_t ns = now - pc->pend[j].t_ns;
				double us = (double)ns / 1e3;

				pc->stt.hist[mig_hist_bucket(ns)]++;
				if (us > pc->stt.fault_max_us)
					pc->stt.fault_max_us = us;
				pc->pend[j] = pc->pend[--pc->npend];
			} else {
				j++;
			}
		}
	}
	pc->stt.missing = pc->missing;
	/* query's figures every 256 pages placed */
	progress = pc->stt.placed / 256 != placed0 / 256;
	if (!pc->missing && !pc->complete && !pc->failed) {
		pc->complete = done = true;
		pc->stt.complete = true;
		pc->stt.complete_ms = mig_clock_msf() - pc->t0;
	}
	pthread_mutex_unlock(&pc->lock);
	if (progress || done)
		pc_progress(pc);
	if (done) {
		all_in(pc);
		pthread_mutex_lock(&pc->lock);
		pthread_cond_broadcast(&pc->cond);
		pthread_mutex_unlock(&pc->lock);
	}
}

/* Whether post-copy is over for a receiving thread (complete, failed, stopping): what still comes is dropped. */
static bool over(struct mig_pc *pc)
{
	bool o;

	pthread_mutex_lock(&pc->lock);
	o = pc->complete || pc->failed || pc->stopping;
	pthread_mutex_unlock(&pc->lock);
	return o;
}

/* The checked copies buf of pages [p, p + n) of region r, placed where still missing. */
static int place(struct mig_pc *pc, uint32_t r, uint64_t p, uint64_t n, const uint8_t *buf)
{
	struct pc_region *rg = &pc->r[r];
	uint64_t k = 0;

	while (k < n) {
		int64_t res = mig_uffd_place(pc->uffd, rg->hva + (p + k) * PAGE, buf + k * PAGE, (n - k) * PAGE);

		if (res > 0) {
			mark(pc, r, p + k, (uint64_t)res / PAGE);
			k += (uint64_t)res / PAGE;
		} else if (res == -EEXIST) {
			mark(pc, r, p + k, 1);
			k++;
		} else {
			if (over(pc))
				return 0; /* unregistered: complete (or stopping) meanwhile */
			pc_fail(pc, (int)res, "placing region %u page %" PRIu64 " (UFFDIO_COPY): %s", r, p + k,
				strerror((int)-res));
			return (int)res;
		}
	}
	return 0;
}

/* Read exactly len bytes of x's connection: 0, or what ended it (link_down() told). */
static int rx_get(struct rx *x, void *buf, size_t len, bool at_record)
{
	int ret = mig_chan_read(x->ch, buf, len);

	if (ret == (int)len)
		return 0;
	/* an end between records once post-copy is over (its ALL_IN acknowledged, or not: recover_main() knows) */
	if (ret == 0 && at_record && over(x->pc))
		return 1;
	if (!over(x->pc))
		link_down(x->pc, x->ch, x->gen, x->i, ret > 0 ? 0 : ret);
	return -EPIPE;
}

static void *rx_main(void *arg)
{
	struct rx *x = arg;
	struct mig_pc *pc = x->pc;
	uint8_t *buf = malloc((size_t)MIG_RUN_PAGES * PAGE);
	uint64_t hashes[MIG_RUN_PAGES], nrec = 0, k;
	struct mig_record rec;
	char err[256];

	if (!buf) {
		pc_fail(pc, -ENOMEM, "post-copy: out of memory for connection %u's pages", x->i);
		return NULL;
	}
	for (;; nrec++) {
		struct pc_region *rg;

		if (rx_get(x, &rec, sizeof(rec), true))
			break;
		if (mig_pc_check(pc->regs, pc->nr, &rec, nrec, true, err, sizeof(err)) < 0) {
			pc_fail(pc, -EPROTO, "connection %u: %s", x->i, err);
			break;
		}
		if (rec.kind == MIG_END && !x->fault)
			break; /* the lane's part is out: its end follows */
		if (rec.kind == MIG_ALL_IN) {
			/* the source heard ALL_IN: no recovery is needed any more */
			pthread_mutex_lock(&pc->lock);
			pc->acked = pc->complete;
			pthread_cond_broadcast(&pc->cond);
			pthread_mutex_unlock(&pc->lock);
			continue;
		}
		rg = &pc->r[rec.index];
		if (rx_get(x, hashes, rec.count * sizeof(uint64_t), false) || rx_get(x, buf, rec.count * PAGE, false))
			break;
		for (k = 0; k < rec.count && bit(rg->was, rec.first + k); k++)
			;
		if (k < rec.count) {
			pc_fail(pc, -EPROTO, "connection %u: post-copy record %" PRIu64 " (DATA): region %" PRIu32 " page %" PRIu64
				" was not left at the source", x->i, nrec, rec.index, rec.first + k);
			break;
		}
		for (k = 0; k < rec.count && mig_page_hash(buf + k * PAGE) == hashes[k]; k++)
			;
		if (k < rec.count) {
			pc_fail(pc, -EIO, "connection %u: region %" PRIu32 " page %" PRIu64 " (gpa 0x%" PRIx64 "): its copy does "
				"not match its hash; not placed, the guest paused", x->i, rec.index, rec.first + k,
				rg->gpa + (rec.first + k) * PAGE);
			break;
		}
		if (over(pc))
			continue; /* complete: what still comes is a copy of a page placed, passed over */
		if (place(pc, rec.index, rec.first, rec.count, buf) < 0)
			break;
	}
	free(buf);
	return NULL;
}

/* A fault at address a: ask for its page (and the LEFT ones after it), or place a zero page, or wake. */
static void on_fault(struct mig_pc *pc, uint64_t a, uint64_t t_ns)
{
	uint32_t r = region_of(pc, a);
	struct pc_region *rg;
	uint64_t p, n = 0;
	bool zero = false, failed;
	uint64_t gen = 0;
	int ret;

	if (r == UINT32_MAX)
		return;
	rg = &pc->r[r];
	p = (a - (uint64_t)(uintptr_t)rg->hva) / PAGE;
	pthread_mutex_lock(&pc->lock);
	failed = pc->pause_done;
	if (!failed && !bit(rg->was, p)) {
		zero = true; /* the stream left it zero and it was never written here */
		pc->stt.zero_faults++;
	} else if (!failed && bit(rg->left, p)) {
		pc->stt.faults++;
		if (pc->npend < PC_PEND)
			pc->pend[pc->npend++] = (struct pend){ r, p, t_ns };
		if (!bit(rg->req, p)) {
			for (n = 0; n < PC_AROUND && p + n < rg->npages && bit(rg->left, p + n) && !bit(rg->req, p + n);
			     n++)
				bit_set(rg->req, p + n);
			pc->stt.requested += n;
		}
	}
	pthread_mutex_unlock(&pc->lock);
	if (failed) {
		/* the guest is paused for good: a VMM thread reading the page is not held for ever */
		mig_uffd_place(pc->uffd, rg->hva + p * PAGE, NULL, PAGE);
		return;
	}
	if (zero) {
		mig_uffd_place(pc->uffd, rg->hva + p * PAGE, NULL, PAGE);
		return;
	}
	if (!n) {
		/* asked for already, or placed since the fault was queued: its copy wakes it */
		if (!bit(rg->was, p))
			return;
		pthread_mutex_lock(&pc->lock);
		if (!bit(rg->left, p))
			mig_uffd_wake(pc->uffd, rg->hva + p * PAGE, PAGE);
		pthread_mutex_unlock(&pc->lock);
		return;
	}
	ret = send_rec_on(pc, (struct mig_record){ .kind = MIG_REQ, .index = r, .first = p, .count = n }, &gen);
	if (ret < 0 && !over(pc)) {
		/* not gone: asked again after the recovery (this fault is pending: a recovery asks for those) */
		pthread_mutex_lock(&pc->lock);
		while (n--)
			bit_clear(rg->req, p + n);
		pthread_mutex_unlock(&pc->lock);
		link_down(pc, NULL, gen, pc->nconns - 1, ret);
	}
}

static void *fault_main(void *arg)
{
	struct mig_pc *pc = arg;
	struct pollfd pfd[2] = { { .fd = pc->uffd, .events = POLLIN }, { .fd = pc->stop_fd, .events = POLLIN } };
	struct uffd_msg msgs[PC_MSGS];

	for (;;) {
		ssize_t n;
		int i;

		if (poll(pfd, 2, -1) < 0)
			continue; /* EINTR */
		if (pfd[1].revents)
			break;
		n = read(pc->uffd, msgs, sizeof(msgs));
		if (n <= 0)
			continue; /* EAGAIN: another read took it */
		for (i = 0; i < (int)(n / (ssize_t)sizeof(msgs[0])); i++)
			if (msgs[i].event == UFFD_EVENT_PAGEFAULT)
				on_fault(pc, msgs[i].arg.pagefault.address & ~(PAGE - 1), mig_clock_ns());
	}
	return NULL;
}

static int cmp_hva(const void *a, const void *b, void *arg)
{
	const struct pc_region *r = arg;
	uintptr_t x = (uintptr_t)r[*(const uint32_t *)a].hva, y = (uintptr_t)r[*(const uint32_t *)b].hva;

	return x < y ? -1 : x > y;
}

/* Empty [p, p + n) of a region: the copy of an earlier pass goes, the page faults. */
static int discard_run(uint64_t first, uint64_t count, void *opaque)
{
	const struct pc_region *rg = opaque;
	uint8_t *a = rg->hva + first * PAGE;

	/* shared memory keeps its pages in the file: punched out; private memory: dropped */
	if (madvise(a, count * PAGE, MADV_REMOVE) < 0 && madvise(a, count * PAGE, MADV_DONTNEED) < 0)
		return -errno;
	return 0;
}

int mig_pc_prepare(const struct mig_guest *g, uint64_t *const *left, struct mig_pc **ret, char *err, size_t len)
{
	struct mig_pc *pc = calloc(1, sizeof(*pc));
	pthread_condattr_t ca;
	uint32_t r;
	int rc;

	*ret = NULL;
	if (!pc)
		return mig_errf(err, len, -ENOMEM, "post-copy: out of memory");
	pc->g = g;
	pc->uffd = pc->stop_fd = pc->lfd = -1;
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_mutex_init(&pc->lock, NULL);
	pthread_mutex_init(&pc->wlock, NULL);
	pthread_cond_init(&pc->cond, &ca);
	pthread_condattr_destroy(&ca);
	pc->nr = g->nr_regions;
	pc->r = calloc(pc->nr ? pc->nr : 1, sizeof(*pc->r));
	pc->regs = calloc(pc->nr ? pc->nr : 1, sizeof(*pc->regs));
	pc->by_hva = calloc(pc->nr ? pc->nr : 1, sizeof(*pc->by_hva));
	if (!g->ops->pause) {
		rc = mig_errf(err, len, -EINVAL, "post-copy needs the guest's pause (it stops the guest on a bad page)");
		goto fail;
	}
	if (!pc->r || !pc->regs || !pc->by_hva) {
		rc = mig_errf(err, len, -ENOMEM, "post-copy: out of memory");
		goto fail;
	}
	for (r = 0; r < pc->nr; r++) {
		struct pc_region *rg = &pc->r[r];
		size_t words = KVMDIRTY_BITMAP_WORDS(g->regions[r].size / PAGE);

		rg->hva = g->regions[r].hva;
		rg->size = g->regions[r].size;
		rg->gpa = g->regions[r].gpa;
		rg->npages = rg->size / PAGE;
		pc->regs[r] = (struct mig_region){ rg->gpa, rg->size };
		rg->was = malloc(words * 8);
		rg->left = malloc(words * 8);
		rg->req = calloc(words, 8);
		if (!rg->was || !rg->left || !rg->req) {
			rc = mig_errf(err, len, -ENOMEM, "post-copy: out of memory");
			goto fail;
		}
		memcpy(rg->was, left[r], words * 8);
		memcpy(rg->left, left[r], words * 8);
		pc->missing += kvmdirty_bitmap_count(rg->left, 0, rg->npages);
		pc->by_hva[r] = r;
	}
	qsort_r(pc->by_hva, pc->nr, sizeof(*pc->by_hva), cmp_hva, pc->r);
	pc->stt.left = pc->stt.missing = pc->missing;
	rc = mig_uffd_open(err, len);
	if (rc < 0)
		goto fail;
	pc->uffd = rc;
	pc->stop_fd = eventfd(0, EFD_CLOEXEC);
	if (pc->stop_fd < 0) {
		rc = mig_errf(err, len, -errno, "eventfd: %s", strerror(errno));
		goto fail;
	}
	/* every region registered first (a page the stream left zero may be missing too), then the LEFT ones emptied */
	for (r = 0; r < pc->nr; r++) {
		rc = mig_uffd_register(pc->uffd, pc->r[r].hva, pc->r[r].size, r, pc->r[r].gpa, err, len);
		if (rc < 0)
			goto fail;
	}
	pc->registered = true;
	for (r = 0; r < pc->nr; r++) {
		rc = kvmdirty_bitmap_for_each_run(pc->r[r].was, 0, pc->r[r].npages, discard_run, &pc->r[r]);
		if (rc < 0) {
			rc = mig_errf(err, len, rc, "region %u (gpa 0x%" PRIx64 "): emptying the pages left at the source: %s", r,
				      pc->r[r].gpa, strerror(-rc));
			goto fail;
		}
	}
	/* faults are served from now (a device's access before the vCPUs run included); requests wait for the channel */
	rc = pthread_create(&pc->fault_thread, NULL, fault_main, pc);
	if (rc) {
		rc = mig_errf(err, len, -rc, "post-copy: the fault thread: %s", strerror(rc));
		goto fail;
	}
	pc->fault_started = true;
	*ret = pc;
	return 0;
fail:
	mig_pc_free(pc);
	return rc;
}

/* A receiving thread a connection of s (the session post-copy runs on now). */
static int start_rx(struct mig_pc *pc, struct mig_session *s)
{
	unsigned int i;
	int rc;

	for (i = 0; i < s->conns; i++) {
		pc->rx[i] = (struct rx){ .pc = pc, .i = i, .ch = s->chan[i], .fault = i + 1 == s->conns, .gen = pc->gen };
		mig_conn_keepalive(s->conn[i]);
		rc = pthread_create(&pc->rx[i].thread, NULL, rx_main, &pc->rx[i]);
		if (rc) {
			pc_fail(pc, -rc, "post-copy: a thread for connection %u: %s", i, strerror(rc));
			return -rc;
		}
		pc->rx[i].started = true;
	}
	return 0;
}

static void join_rx(struct mig_pc *pc)
{
	unsigned int i;

	for (i = 0; i < MIG_MAX_CONNS; i++)
		if (pc->rx[i].started)
			pthread_join(pc->rx[i].thread, NULL);
	for (i = 0; i < MIG_MAX_CONNS; i++)
		pc->rx[i].started = false;
}

/* Whether the recovery listener has nothing more to wait for: stopping, failed, or complete and acknowledged. */
static bool rec_over(struct mig_pc *pc)
{
	bool o;

	pthread_mutex_lock(&pc->lock);
	o = pc->stopping || pc->pause_done || (pc->complete && pc->acked);
	pthread_mutex_unlock(&pc->lock);
	return o;
}

/* A connection on the recovery listener within timeout_ms (the stop ends the wait): an fd or -errno. */
static int rec_accept(void *ctx, uint64_t timeout_ms, char *err, size_t len)
{
	struct mig_pc *pc = ctx;
	double until = mig_clock_msf() + (double)timeout_ms;

	for (;;) {
		struct pollfd pfd[2] = { { .fd = pc->lfd, .events = POLLIN }, { .fd = pc->stop_fd, .events = POLLIN } };
		double left = until - mig_clock_msf();
		int n, fd;

		if (left <= 0)
			return mig_errf(err, len, -ETIMEDOUT, "no connection within %" PRIu64 " ms", timeout_ms);
		n = poll(pfd, pc->lfd >= 0 ? 2 : 1, left > 200 ? 200 : (int)left + 1);
		if (rec_over(pc))
			return mig_errf(err, len, -ECANCELED, "post-copy is over");
		if (n <= 0 || !(pfd[0].revents & POLLIN))
			continue;
		fd = accept4(pc->lfd, NULL, NULL, SOCK_CLOEXEC);
		if (fd >= 0)
			return fd;
	}
}

/*
 * A recovery's session, from the listener (or, once the status asked for
 * it, from a new one at the address it gave): a session that is not one
 * of this post-copy (its flags, its connections, the id it names) is
 * refused and the next taken.  0 with *ret_s; -ECANCELED once there is
 * nothing more to recover.
 */
static int take_recovery(struct mig_pc *pc, struct mig_session *ret_s)
{
	char why[256], addr[256];

	for (;;) {
		struct mig_record rec;
		uint8_t id[32];
		int fd, ret;

		if (rec_over(pc))
			return -ECANCELED;
		if (mig_status_recover_take(pc->st, addr, sizeof(addr)) && addr[0]) {
			int nfd = mig_listen(addr, why, sizeof(why));

			if (nfd >= 0) {
				if (pc->lfd >= 0)
					close(pc->lfd);
				pc->lfd = nfd;
			}
		}
		fd = rec_accept(pc, 200, why, sizeof(why));
		if (fd == -ECANCELED)
			return fd;
		if (fd < 0)
			continue;
		ret = mig_session_accept(fd, &pc->so, rec_accept, pc, ret_s, why, sizeof(why));
		if (ret < 0) {
			close(fd);
			continue;
		}
		ret_s->own_fd[0] = true;
		if (!(ret_s->flags & MIG_S_POSTCOPY) || ret_s->conns != pc->nconns) {
			mig_handoff_refuse(ret_s->chan[0], -EBUSY, "a post-copy is under way here: only its recovery is taken");
			mig_session_free(ret_s);
			continue;
		}
		/* RECOVER within one handshake's budget: a peer that never says it holds the listener no longer */
		mig_conn_set_timeout(ret_s->conn[ret_s->conns - 1], MIG_HANDSHAKE_MS);
		ret = mig_chan_read(ret_s->chan[ret_s->conns - 1], &rec, sizeof(rec));
		if (ret == (int)sizeof(rec) && rec.kind == MIG_RECOVER && !rec.index && !rec.first &&
		    rec.count == sizeof(id) &&
		    mig_chan_read(ret_s->chan[ret_s->conns - 1], id, sizeof(id)) == (int)sizeof(id) &&
		    !memcmp(id, pc->id, sizeof(id)))
			return 0;
		mig_handoff_refuse(ret_s->chan[0], -EPROTO, "not a recovery of the post-copy under way here");
		mig_session_free(ret_s);
	}
}

/* Runs of missing pages as LEFT records on ch, then END with their count. */
static int send_missing(struct mig_pc *pc, struct mig_chan *ch)
{
	uint64_t total = 0;
	uint32_t r;
	int ret = 0;

	for (r = 0; r < pc->nr && ret == 0; r++) {
		struct pc_region *rg = &pc->r[r];
		uint64_t p = 0;

		while (ret == 0 && (p = kvmdirty_bitmap_next_set(rg->left, p, rg->npages)) < rg->npages) {
			uint64_t e = p + 1;
			struct mig_record rec;
			struct iovec iov = { &rec, sizeof(rec) };

			while (e < rg->npages && bit(rg->left, e))
				e++;
			rec = (struct mig_record){ .kind = MIG_LEFT, .index = r, .first = p, .count = e - p };
			ret = mig_chan_writev(ch, &iov, 1);
			total += e - p;
			p = e;
		}
	}
	if (ret == 0) {
		struct mig_record end = { .kind = MIG_END, .first = total };
		struct iovec iov = { &end, sizeof(end) };

		ret = mig_chan_writev(ch, &iov, 1);
	}
	return ret;
}

/*
 * Post-copy goes on over s2: the old session's threads ended (it was cut),
 * the pages still missing told, the faults waiting asked for again, new
 * threads on s2's connections.
 */
static void resume_with(struct mig_pc *pc, struct mig_session *s2)
{
	struct mig_session *own = malloc(sizeof(*own)), *old;
	struct mig_chan *fch = s2->chan[s2->conns - 1];
	struct pend again[PC_PEND];
	uint64_t missing, recoveries, gen;
	unsigned int i, j, n = 0;
	bool complete;
	int ret;

	if (!own) {
		mig_session_free(s2);
		return;
	}
	*own = *s2;
	join_rx(pc);
	/* the map within the peer's time: a peer that stops reading does not hold the recovery for ever */
	for (i = 0; i < own->conns; i++) {
		mig_conn_set_deadline(own->conn[i], 0);
		mig_conn_set_timeout(own->conn[i], pc->so.timeout_ms ? pc->so.timeout_ms : 30000);
	}
	/* the receiving threads are stopped and the fault thread waits (paused): the map holds still */
	ret = send_missing(pc, fch);
	if (ret < 0) {
		/* the new session failed at once: paused still, on the old (cut) one, for the next recovery */
		mig_session_free(own);
		free(own);
		return;
	}
	for (i = 0; i < own->conns; i++)
		mig_conn_set_timeout(own->conn[i], 0);
	/*
	 * The swap, under both locks (a writer reads the channel under wlock),
	 * and post-copy unpaused before the new threads start: a connection of
	 * this session that fails pauses it again (link_down() tells a session
	 * by its number).  The faults still waiting are asked for again (their
	 * requests may have gone with the old session).
	 */
	pthread_mutex_lock(&pc->wlock);
	pthread_mutex_lock(&pc->lock);
	old = pc->s;
	pc->s = own;
	pc->fch = fch;
	gen = ++pc->gen;
	complete = pc->complete;
	for (i = 0; i < pc->nr; i++)
		memset(pc->r[i].req, 0, KVMDIRTY_BITMAP_WORDS(pc->r[i].npages) * sizeof(uint64_t));
	for (j = 0; j < pc->npend; j++) {
		struct pend pd = pc->pend[j];

		if (!bit(pc->r[pd.r].left, pd.p) || bit(pc->r[pd.r].req, pd.p))
			continue;
		bit_set(pc->r[pd.r].req, pd.p);
		again[n++] = pd;
	}
	pc->paused = false;
	recoveries = ++pc->recoveries;
	missing = pc->missing;
	pthread_cond_broadcast(&pc->cond);
	pthread_mutex_unlock(&pc->lock);
	pthread_mutex_unlock(&pc->wlock);
	mig_session_free(old);
	free(old);
	start_rx(pc, own);
	/* every page was in already: the source had not heard it */
	if (complete)
		send_all_in(pc);
	for (j = 0; j < n; j++) {
		ret = send_rec_on(pc, (struct mig_record){ .kind = MIG_REQ, .index = again[j].r, .first = again[j].p,
							   .count = 1 }, &gen);
		if (ret < 0) {
			if (!over(pc))
				link_down(pc, NULL, gen, pc->nconns - 1, ret);
			break;
		}
	}
	mig_status_postcopy_paused(pc->st, false);
	mig_status_set_state(pc->st, complete ? "completed" : "postcopy");
	mig_status_event(pc->st, "postcopy-recovered",
			 "\"side\":\"destination\",\"missing_pages\":%" PRIu64 ",\"recoveries\":%" PRIu64, missing,
			 recoveries);
}

/* Recoveries, for as long as post-copy may need one: paused, or complete and the source not yet told. */
static void *recover_main(void *arg)
{
	struct mig_pc *pc = arg;

	for (;;) {
		struct mig_session s2;

		pthread_mutex_lock(&pc->lock);
		while (!pc->stopping && !pc->pause_done && !pc->paused && !(pc->complete && !pc->acked))
			pthread_cond_wait(&pc->cond, &pc->lock);
		pthread_mutex_unlock(&pc->lock);
		if (take_recovery(pc, &s2) < 0)
			break;
		resume_with(pc, &s2);
	}
	return NULL;
}

int mig_pc_listen(struct mig_pc *pc, int lfd, const struct mig_session_opts *so, const struct mig_psk *psk)
{
	int rc;

	pc->lfd = lfd;
	pc->so = *so;
	pc->so.log = NULL;
	if (psk) {
		pc->psk = *psk;
		pc->so.psk = &pc->psk;
	}
	pc->so.postcopy = true;
	pc->so.wipe_psk = false;
	/* set once post-copy started (mig_pc_start() before this): the name the first session agreed */
	pc->so.name = pc->name[0] ? pc->name : NULL;
	rc = pthread_create(&pc->rec_thread, NULL, recover_main, pc);
	if (rc)
		return -rc;
	pc->rec_started = true;
	return 0;
}

int mig_pc_start(struct mig_pc *pc, struct mig_session *s, struct mig_status *st, char *err, size_t len)
{
	unsigned int i;
	int rc;

	struct mig_session *own = malloc(sizeof(*own));

	if (!own) {
		mig_session_free(s);
		return mig_errf(err, len, -ENOMEM, "post-copy: out of memory");
	}
	*own = *s;
	memset(s, 0, sizeof(*s));
	if (!st) {
		mig_status_init(&pc->own_st, true);
		pc->own_st_used = true;
		st = &pc->own_st;
	}
	pc->st = st;
	pc->t0 = mig_clock_msf();
	/* the source may take its time: no wait for it gives up (a cut ends a read, and post-copy pauses) */
	for (i = 0; i < own->conns; i++) {
		mig_conn_set_deadline(own->conn[i], 0);
		mig_conn_set_timeout(own->conn[i], 0);
	}
	mig_status_set_state(st, "postcopy");
	mig_status_postcopy_progress(st, pc->missing, 0, 0, 0);
	mig_status_event(st, "postcopy-started", "\"side\":\"destination\",\"missing_pages\":%" PRIu64, pc->missing);
	/* the fault thread may send its requests now */
	pthread_mutex_lock(&pc->lock);
	pc->s = own;
	pc->gen = 1;
	pc->nconns = own->conns;
	memcpy(pc->id, own->id, sizeof(pc->id));
	memcpy(pc->name, own->name, sizeof(pc->name));
	pc->fch = own->chan[own->conns - 1];
	pthread_cond_broadcast(&pc->cond);
	pthread_mutex_unlock(&pc->lock);
	rc = start_rx(pc, own);
	if (rc < 0)
		return mig_errf(err, len, rc, "post-copy: a thread for a connection: %s", strerror(-rc));
	/* nothing was left: complete at once */
	if (!pc->stt.left)
		mark(pc, 0, 0, 0);
	return 0;
}

int mig_pc_wait(struct mig_pc *pc, int64_t timeout_ms, char *err, size_t len)
{
	struct timespec until;
	int ret = 0;

	clock_gettime(CLOCK_MONOTONIC, &until);
	if (timeout_ms > 0) {
		until.tv_sec += timeout_ms / 1000;
		until.tv_nsec += (timeout_ms % 1000) * 1000000;
		if (until.tv_nsec >= 1000000000) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000;
		}
	}
	pthread_mutex_lock(&pc->lock);
	while (!pc->complete && !pc->pause_done && ret == 0) {
		if (timeout_ms < 0)
			pthread_cond_wait(&pc->cond, &pc->lock);
		else if (!timeout_ms || pthread_cond_timedwait(&pc->cond, &pc->lock, &until) == ETIMEDOUT)
			ret = -ETIMEDOUT;
	}
	if (pc->complete)
		ret = 0;
	else if (pc->pause_done)
		ret = mig_errf(err, len, pc->ret, "%s", pc->stt.why);
	else
		mig_errf(err, len, ret, "post-copy %s: %" PRIu64 " pages still at the source%s%s",
			 pc->paused ? "paused" : "under way", pc->missing, pc->paused ? ": " : "",
			 pc->paused ? pc->stt.why : "");
	pthread_mutex_unlock(&pc->lock);
	return ret;
}

void mig_pc_get_stats(struct mig_pc *pc, struct mig_pc_stats *st)
{
	pthread_mutex_lock(&pc->lock);
	*st = pc->stt;
	st->failed = pc->failed;
	st->paused = pc->paused;
	pthread_mutex_unlock(&pc->lock);
	mig_hist_pcts(st->hist, st->fault_max_us, &st->fault_p50_us, &st->fault_p99_us);
}

void mig_pc_free(struct mig_pc *pc)
{
	uint64_t one = 1;
	unsigned int i;
	uint32_t r;

	if (!pc)
		return;
	pthread_mutex_lock(&pc->lock);
	pc->stopping = true;
	pthread_cond_broadcast(&pc->cond);
	pthread_mutex_unlock(&pc->lock);
	if (pc->stop_fd >= 0 && write(pc->stop_fd, &one, sizeof(one)) < 0)
		abort(); /* an eventfd takes a write below its limit */
	pthread_mutex_lock(&pc->lock);
	for (i = 0; pc->s && i < pc->s->conns; i++)
		shutdown(pc->s->fd[i], SHUT_RDWR);
	pthread_mutex_unlock(&pc->lock);
	if (pc->rec_started)
		pthread_join(pc->rec_thread, NULL);
	pthread_mutex_lock(&pc->lock);
	for (i = 0; pc->s && i < pc->s->conns; i++)
		shutdown(pc->s->fd[i], SHUT_RDWR);
	pthread_mutex_unlock(&pc->lock);
	join_rx(pc);
	if (pc->fault_started)
		pthread_join(pc->fault_thread, NULL);
	for (r = 0; pc->registered && !pc->complete && r < pc->nr; r++)
		mig_uffd_unregister(pc->uffd, pc->r[r].hva, pc->r[r].size);
	if (pc->uffd >= 0)
		close(pc->uffd);
	if (pc->stop_fd >= 0)
		close(pc->stop_fd);
	if (pc->lfd >= 0)
		close(pc->lfd);
	mig_psk_clear(&pc->psk);
	if (pc->s) {
		mig_session_free(pc->s);
		free(pc->s);
	}
	for (r = 0; pc->r && r < pc->nr; r++) {
		free(pc->r[r].was);
		free(pc->r[r].left);
		free(pc->r[r].req);
	}
	free(pc->r);
	free(pc->regs);
	free(pc->by_hva);
	pthread_mutex_destroy(&pc->lock);
	pthread_mutex_destroy(&pc->wlock);
	pthread_cond_destroy(&pc->cond);
	if (pc->own_st_used)
		mig_status_destroy(&pc->own_st);
	free(pc);
}
