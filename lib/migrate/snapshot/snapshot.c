// SPDX-License-Identifier: MIT
/*
 * Snapshots of a running guest: passes while it runs, a short pause for
 * the rest and the vCPUs, the file finished with the guest running, the
 * consumer committed only once the file is on disk under its name.
 * What and why: snapshot.h.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/stat.h>

#include "clock.h"
#include "errf.h"
#include "hostmem.h"
#include "snapshot.h"

#define HAND_OUT 8192 /* pages handed out at once (32 MiB) */
#define NRANGES	 64

struct mig_snap {
	const struct mig_guest *g;
	struct mig_snap_opts o;
	struct kvmdirty_consumer *cons;
	uint64_t seq; /* the next snapshot's number */
	uint8_t parent[SNAP_ID], base[SNAP_ID];
	struct mig_vcpu_state *vs;
	struct mig_vm_state vm;
	uint64_t *gpa, *size;
	/* pages never touched (private anonymous memory, pagemap) are zero without being read */
	bool *anon;
	int pagemap;
	uint64_t pme[MIG_PM_BATCH];
	uint32_t last_idx;  /* the region of the last range: ranges come in region order */
	unsigned int share; /* the run share the throttle gave every vCPU, permille (1000: none) */
	/* the snapshot under way */
	struct snap_writer *w;
	double ns_per_page; /* what putting a page cost in the last pass */
	uint64_t pages, bytes;
	double write_ms;
};

int mig_snap_new(const struct mig_guest *g, const struct mig_snap_opts *o, struct mig_snap **ret_s, char *err,
		 size_t len)
{
	struct mig_snap *s = calloc(1, sizeof(*s));
	void **hva = NULL;
	unsigned int i;
	int ret;

	*ret_s = NULL;
	if (!s)
		return mig_errf(err, len, -ENOMEM, "out of memory");
	s->g = g;
	s->o = *o;
	s->pagemap = -1;
	s->share = 1000;
	if (!s->o.pause_ms)
		s->o.pause_ms = 5;
	if (!s->o.max_passes)
		s->o.max_passes = 8;
	if (!g->tracker || !g->nr_regions || g->nr_regions > SNAP_MAX_REGIONS || !g->nr_vcpus ||
	    g->nr_vcpus > SNAP_MAX_VCPUS || !o->prefix) {
		free(s);
		return mig_errf(err, len, -EINVAL, "a guest with no tracker, or outside %u regions and %u vCPUs",
				SNAP_MAX_REGIONS, SNAP_MAX_VCPUS);
	}
	s->vs = calloc(g->nr_vcpus, sizeof(*s->vs));
	s->gpa = calloc(g->nr_regions, sizeof(*s->gpa));
	s->size = calloc(g->nr_regions, sizeof(*s->size));
	s->anon = calloc(g->nr_regions, sizeof(*s->anon));
	hva = calloc(g->nr_regions, sizeof(*hva));
	if (!s->vs || !s->gpa || !s->size || !s->anon || !hva) {
		free(hva);
		mig_snap_free(s);
		return mig_errf(err, len, -ENOMEM, "out of memory");
	}
	for (i = 0; i < g->nr_regions; i++) {
		/* a region the tracker does not know would be taken for all zeroes */
		if (!g->regions[i].region) {
			free(hva);
			mig_snap_free(s);
			return mig_errf(err, len, -EINVAL, "region %u (gpa 0x%" PRIx64 ") is not the library's", i,
					g->regions[i].gpa);
		}
		s->gpa[i] = g->regions[i].gpa;
		s->size[i] = g->regions[i].size;
		hva[i] = g->regions[i].hva;
	}
	/* without pagemap every page is read: slower, never wrong */
	if (mig_hostmem_private_anon_n(hva, s->size, g->nr_regions, s->anon) == 0)
		s->pagemap = mig_pagemap_open();
	free(hva);
	/* every page pending: the first snapshot is full */
	ret = kvmdirty_consumer_new(g->tracker, 0, &s->cons);
	if (ret < 0) {
		mig_snap_free(s);
		return mig_errf(err, len, ret, "a consumer of the dirty log for the snapshots: %s", strerror(-ret));
	}
	/* the series' claim on every region: logging on while it lasts, whoever else comes and goes */
	ret = kvmdirty_consumer_start(s->cons, NULL);
	if (ret < 0) {
		mig_snap_free(s);
		return mig_errf(err, len, ret, "starting dirty tracking: %s", strerror(-ret));
	}
	*ret_s = s;
	return 0;
}

void mig_snap_free(struct mig_snap *s)
{
	if (!s)
		return;
	/* its claim goes with it: logging stays on where another consumer (a migration, the VMM) needs it */
	if (s->cons)
		kvmdirty_consumer_free(s->cons);
	if (s->pagemap >= 0)
		close(s->pagemap);
	free(s->vs);
	free(s->gpa);
	free(s->size);
	free(s->anon);
	free(s);
}

/* The index in g->regions of a handed-out range's region, or nr_regions. */
static uint32_t region_index(struct mig_snap *s, const struct kvmdirty_range *rg)
{
	uint32_t i = s->last_idx;

	if (i < s->g->nr_regions && s->g->regions[i].region == rg->region)
		return i;
	for (i = 0; i < s->g->nr_regions && s->g->regions[i].region != rg->region; i++)
		;
	return s->last_idx = i;
}

/* A run of a handed-out range, to the writer (put_range()). */
struct put_run {
	struct mig_snap *s;
	const struct kvmdirty_range *rg;
	uint32_t idx;
	char *err;
	size_t len;
};

static int put_run(void *ctx, uint64_t first, uint64_t count, bool untouched)
{
	struct put_run *r = ctx;
	uint64_t bytes = 0;
	int ret;

	if (untouched)
		return snap_writer_zero(r->s->w, r->idx, r->rg->page + first, count, r->err, r->len);
	ret = snap_writer_put(r->s->w, r->idx, r->rg->page + first, count, (const uint8_t *)r->rg->hva + first * SNAP_PAGE,
			      &bytes, r->err, r->len);
	r->s->bytes += bytes;
	return ret;
}

/* One handed-out range (protected by now): pages never touched noted as zero, unread; the rest put. */
static int put_range(struct mig_snap *s, const struct kvmdirty_range *rg, char *err, size_t len)
{
	struct put_run r = { .s = s, .rg = rg, .idx = region_index(s, rg), .err = err, .len = len };

	if (r.idx == s->g->nr_regions)
		return mig_errf(err, len, -ENOENT, "the tracker reported a region the guest lacks");
	return mig_walk_touched(s->pagemap, s->anon[r.idx], rg->hva, rg->npages, s->pme, put_run, &r);
}

/* Every page pending now, put; how many in *ret_pages. */
static int put_pending(struct mig_snap *s, uint64_t *ret_pages, char *err, size_t len)
{
	struct kvmdirty_range rg[NRANGES];
	double t0 = mig_clock_msf();
	uint64_t pages = 0;
	int n, i, ret;

	while ((n = kvmdirty_consumer_next(s->cons, rg, NRANGES, HAND_OUT)) > 0) {
		for (i = 0; i < n; i++) {
			ret = put_range(s, &rg[i], err, len);
			if (ret < 0)
				return ret;
			pages += rg[i].npages;
		}
	}
	if (n < 0)
		return mig_errf(err, len, n, "taking dirty pages from the tracker: %s", strerror(-n));
	s->write_ms += mig_clock_msf() - t0;
	s->pages += pages;
	if (pages)
		s->ns_per_page = (mig_clock_msf() - t0) * 1e6 / pages;
	*ret_pages = pages;
	return 0;
}

static int sync_fail(int64_t n, char *err, size_t len)
{
	return mig_errf(err, len, (int)n, "syncing the dirty log: %s", strerror((int)-n));
}

/*
 * The throttle: each vCPU kept in KVM_RUN for half the share it had (at
 * least 50 permille), through the VMM's run share (the guest's
 * set_run_share; none: no throttle).  Lifted by unthrottle() before the
 * vCPUs resume from the pause, and after a failure that never paused.
 */
static void throttle_step(struct mig_snap *s, struct mig_snap_result *res)
{
	const struct mig_guest *g = s->g;
	unsigned int i, share = s->share / 2 < 50 ? 50 : s->share / 2;

	if (s->o.no_throttle || !g->ops->set_run_share || share == s->share)
		return;
	for (i = 0; i < g->nr_vcpus; i++)
		g->ops->set_run_share(g->ctx, i, share);
	s->share = res->throttle_permille = share;
}

static void unthrottle(struct mig_snap *s)
{
	const struct mig_guest *g = s->g;
	unsigned int i;

	if (s->share == 1000)
		return;
	for (i = 0; i < g->nr_vcpus; i++)
		g->ops->set_run_share(g->ctx, i, 1000);
	s->share = 1000;
}

/* Passes while the guest runs, until what is pending fits the pause or the passes run out. */
static int passes(struct mig_snap *s, struct mig_snap_result *res, double *ret_t_first, uint64_t *ret_redirty,
		  char *err, size_t len)
{
	uint64_t pages, redirty = 0;
	int64_t n;
	int ret;

	uint64_t pending, last = 0;

	for (;;) {
		n = kvmdirty_consumer_sync(s->cons);
		if (n < 0)
			return sync_fail(n, err, len);
		if (res->passes) {
			redirty += (uint64_t)n;
			pending = kvmdirty_consumer_pending(s->cons);
			if (pending * s->ns_per_page <= s->o.pause_ms * 1e6 || res->passes >= s->o.max_passes)
				break;
			/* not converging: the guest wrote again at least half of what the last pass wrote */
			if (res->passes >= 2 && pending * 2 > last)
				throttle_step(s, res);
		} else {
			*ret_t_first = mig_clock_msf();
		}
		ret = put_pending(s, &pages, err, len);
		if (ret < 0)
			return ret;
		last = pages;
		res->passes++;
		if (s->o.pass_done)
			s->o.pass_done(s->o.pass_done_ctx, res);
	}
	*ret_redirty = redirty;
	return 0;
}

/* Paused: the last sync, the rest, the vCPUs' states; resumed whatever happened. */
/*
 * The devices' state at the pause: devices_save's, and with
 * devices_save_live the VMM's live part beside it (SNAP_F_DEVICES_LIVE):
 * a snapshot has no "before the pause".  Both together MIG_DEVICES_MAX at
 * most.  0, or -errno with err.
 */
static int save_devices(struct mig_snap *s, char *err, size_t len)
{
	const struct mig_guest *g = s->g;
	void *dev = NULL, *live = NULL;
	size_t dev_len = 0, live_len = 0;
	int ret;

	ret = g->ops->devices_save(g->ctx, &dev, &dev_len);
	if (ret < 0)
		return mig_errf(err, len, ret, "saving the devices' state: %s", strerror(-ret));
	if (g->ops->devices_save_live && (ret = g->ops->devices_save_live(g->ctx, &live, &live_len)) < 0) {
		free(dev);
		return mig_errf(err, len, ret, "saving the devices' live part: %s", strerror(-ret));
	}
	if (dev_len > MIG_DEVICES_MAX || live_len > MIG_DEVICES_MAX - dev_len) {
		free(dev);
		free(live);
		return mig_errf(err, len, -EFBIG, "the devices' state: %zu bytes%s, a snapshot holds at most %llu",
				dev_len + live_len, live_len ? " in two parts" : "", MIG_DEVICES_MAX);
	}
	if (!g->ops->devices_save_live) {
		snap_writer_devices(s->w, dev, dev_len);
		return 0;
	}
	ret = snap_writer_devices_parts(s->w, live, live_len, dev, dev_len);
	return ret < 0 ? mig_errf(err, len, ret, "the devices' state: out of memory") : 0;
}

static int pause_and_take(struct mig_snap *s, struct mig_snap_result *res, char *err, size_t len)
{
	const struct mig_guest *g = s->g;
	double t0 = mig_clock_msf();
	uint64_t pages = 0;
	unsigned int i;
	int64_t n;
	int ret = 0;
	double t;

	g->ops->pause(g->ctx);
	t = mig_clock_msf();
	res->pause_stop_ms = t - t0;
	n = kvmdirty_consumer_sync(s->cons);
	res->pause_sync_ms = mig_clock_msf() - t;
	if (n < 0)
		ret = sync_fail(n, err, len);
	t = mig_clock_msf();
	if (ret == 0)
		ret = put_pending(s, &pages, err, len);
	res->pause_write_ms = mig_clock_msf() - t;
	t = mig_clock_msf();
	for (i = 0; ret == 0 && i < g->nr_vcpus; i++) {
		ret = g->ops->vcpu_save(g->ctx, i, &s->vs[i]);
		if (ret < 0)
			mig_errf(err, len, ret, "saving vCPU %u's state: %s", i, strerror(-ret));
	}
	memset(&s->vm, 0, sizeof(s->vm));
	if (ret == 0 && g->ops->vm_save && (ret = g->ops->vm_save(g->ctx, &s->vm)) < 0)
		mig_errf(err, len, ret, "saving the VM's state: %s", strerror(-ret));
	if (ret == 0 && g->ops->devices_save)
		ret = save_devices(s, err, len);
	res->pause_vcpu_ms = mig_clock_msf() - t;
	/* every vCPU at its whole share again before it runs: none sits out a throttle's period after the pause */
	unthrottle(s);
	if (ret == 0) {
		snap_writer_vcpus(s->w, s->vs, &s->vm);
		res->pause_pages = pages;
		if (s->o.paused)
			s->o.paused(s->o.paused_ctx, res);
	}
	g->ops->resume(g->ctx);
	res->pause_ms = mig_clock_msf() - t0;
	return ret;
}

int mig_snap_take(struct mig_snap *s, struct mig_snap_result *res, char *err, size_t len)
{
	const struct mig_guest *g = s->g;
	struct snap_layout l = { .kind = s->seq ? SNAP_DIFF : SNAP_FULL,
				 .seq = s->seq,
				 .parent = s->seq ? s->parent : NULL,
				 .base = s->seq ? s->base : NULL,
				 .nr_regions = g->nr_regions,
				 .nr_vcpus = g->nr_vcpus,
				 .gpa = s->gpa,
				 .size = s->size };
	double t0 = mig_clock_msf(), t_first = t0, t_last;
	struct snap_written wr;
	uint8_t id[SNAP_ID];
	uint64_t redirty = 0;
	int ret;

	memset(res, 0, sizeof(*res));
	res->seq = s->seq;
	res->throttle_permille = 1000;
	snprintf(res->path, sizeof(res->path), "%s-%06" PRIu64 ".snap", s->o.prefix, s->seq);
	s->pages = s->bytes = 0;
	s->write_ms = 0;
	ret = snap_writer_open(res->path, &l, &s->w, err, len);
	if (ret < 0)
		return ret;
	ret = passes(s, res, &t_first, &redirty, err, len);
	t_last = mig_clock_msf();
	if (ret == 0)
		ret = pause_and_take(s, res, err, len);
	/* the guest at full speed again, whatever happened (after the pause: lifted before it ended) */
	unthrottle(s);
	res->pages = s->pages;
	res->bytes = s->bytes;
	res->write_ms = s->write_ms;
	res->dirty_pps = t_last > t_first ? redirty / ((t_last - t_first) / 1e3) : 0;
	if (ret < 0) {
		snap_writer_abandon(s->w);
	} else {
		double tc = mig_clock_msf();

		ret = snap_writer_commit(s->w, id, &wr, err, len);
		res->fsync_ms = mig_clock_msf() - tc;
	}
	s->w = NULL;
	if (ret < 0) {
		/* everything taken since the last snapshot that stands is pending again: the next one is whole */
		kvmdirty_consumer_abort(s->cons);
		res->total_ms = mig_clock_msf() - t0;
		return ret;
	}
	kvmdirty_consumer_commit(s->cons);
	res->data_pages = wr.data_pages;
	res->zero_pages = wr.zero_pages;
	res->file_len = wr.file_len;
	res->tables_bytes = wr.tables_bytes;
	memcpy(s->parent, id, SNAP_ID);
	if (!s->seq)
		memcpy(s->base, id, SNAP_ID);
	s->seq++;
	res->total_ms = mig_clock_msf() - t0;
	return 0;
}

int mig_snap_restore(const struct mig_guest *g, struct snap_file *const *files, unsigned int n, uint64_t *ret_pages,
		     char *err, size_t len)
{
	const struct snap_file *last;
	void **hva;
	unsigned int i;
	int ret = mig_snap_check_guest(g, files, n, err, len);

	if (ret < 0)
		return ret;
	last = files[n - 1];
	hva = calloc(g->nr_regions, sizeof(*hva));
	if (!hva)
		return mig_errf(err, len, -ENOMEM, "out of memory");
	for (i = 0; i < g->nr_regions; i++)
		hva[i] = g->regions[i].hva;
	ret = snap_chain_load(files, n, hva, ret_pages, err, len);
	free(hva);
	return ret < 0 ? ret : mig_snap_load_states(g, last, err, len);
}

int mig_snap_check_guest(const struct mig_guest *g, struct snap_file *const *files, unsigned int n, char *err,
			 size_t len)
{
	unsigned int i;
	int ret = snap_chain_check(files, n, err, len);

	if (ret < 0)
		return ret;
	if (files[0]->h.nr_regions != g->nr_regions || files[0]->h.nr_vcpus != g->nr_vcpus)
		return mig_errf(err, len, -EINVAL, "%s: %u regions and %u vCPUs, the guest has %u and %u",
				files[0]->path, files[0]->h.nr_regions, files[0]->h.nr_vcpus, g->nr_regions,
				g->nr_vcpus);
	for (i = 0; i < g->nr_regions; i++)
		if (files[0]->regions[i].gpa != g->regions[i].gpa || files[0]->regions[i].size != g->regions[i].size)
			return mig_errf(err, len, -EINVAL,
					"%s: region %u (gpa 0x%" PRIx64 ", %" PRIu64 " bytes) is not the guest's",
					files[0]->path, i, files[0]->regions[i].gpa, files[0]->regions[i].size);
	return 0;
}

int mig_snap_load_states(const struct mig_guest *g, const struct snap_file *last, char *err, size_t len)
{
	unsigned int i;
	int ret = 0;

	for (i = 0; ret == 0 && i < g->nr_vcpus; i++) {
		char what[SNAP_PATH_MAX + 32], why[SNAP_PATH_MAX + 256];

		snprintf(what, sizeof(what), "%s: vCPU %u's state", last->path, i);
		ret = mig_vcpu_state_host_check(&last->vcpus[i], what, why, sizeof(why));
		if (ret < 0) {
			mig_errf(err, len, ret, "%s", why);
			break;
		}
		ret = g->ops->vcpu_load(g->ctx, i, &last->vcpus[i]);
		if (ret < 0)
			mig_errf(err, len, ret, "%s: loading vCPU %u's state: %s", last->path, i, strerror(-ret));
	}
	if (ret == 0 && g->ops->vm_load && (ret = g->ops->vm_load(g->ctx, last->vm)) < 0)
		mig_errf(err, len, ret, "%s: loading the VM's state (irqchip, PIT, clock): %s", last->path, strerror(-ret));
	if (ret == 0 && last->dev_rest_len && !g->ops->devices_load)
		ret = mig_errf(err, len, -EPROTO, "%s: %" PRIu64 " bytes of device state, and this guest has no devices "
			       "to load them into", last->path, last->dev_rest_len);
	if (ret == 0 && last->dev_live_len && !g->ops->devices_load_live)
		ret = mig_errf(err, len, -EPROTO, "%s: %" PRIu64 " bytes of the devices' live part, and this guest "
			       "takes none", last->path, last->dev_live_len);
	/* the live part first (none: 0 bytes, for a guest that takes one), as a migration's destination does */
	if (ret == 0 && g->ops->devices_load_live &&
	    (ret = g->ops->devices_load_live(g->ctx, last->dev_live, last->dev_live_len)) < 0)
		mig_errf(err, len, ret, "%s: loading the devices' live part (%" PRIu64 " bytes): %s", last->path,
			 last->dev_live_len, strerror(-ret));
	if (ret == 0 && g->ops->devices_load &&
	    (ret = g->ops->devices_load(g->ctx, last->dev_rest, last->dev_rest_len)) < 0)
		mig_errf(err, len, ret, "%s: loading the devices' state (%" PRIu64 " bytes): %s", last->path,
			 last->dev_rest_len, strerror(-ret));
	return ret;
}
