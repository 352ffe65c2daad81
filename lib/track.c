// SPDX-License-Identifier: MIT
/*
 * The tracker: one view of what is dirty, whatever the backend.
 *
 * Per tracked region, by slot id:
 *   pending   pages synced and not yet handed out; only the syncing thread
 *             (sync, next) touches it, so it needs no atomics;
 *   async     pages reported from other threads: ring-full handlers on
 *             vCPU threads and mark_dirty; set atomically, moved into
 *             pending by sync with the scanner's fetch-and-clear;
 *   kvm_bmap  the KVM_GET_DIRTY_LOG buffer, owned and reused;
 *   to_clear  (CLEAR_LOG) bits fetched from KVM and not yet cleared
 *             there: only these are ever passed to KVM_CLEAR_DIRTY_LOG,
 *             so no dirty bit KVM has not reported yet is cleared.
 *
 * Protect before read: next() issues the CLEAR of every dirty chunk a
 * handed-out page lies in before it returns; the ring and the legacy log
 * re-protect in sync, before next() can hand a page out.
 *
 * async_lock guards the async bitmaps' lifetime (read side: harvests and
 * marks; write side: start, stop, removal), not their bits.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "kvm-uapi.h"
#include "scan.h"

#define DEFAULT_CHUNK_PAGES 262144
#define DEFAULT_RING_ENTRIES 4096

struct late_clear {
	uint32_t slot;
	uint64_t chunk;
};

struct kd_tracker_priv {
	pthread_rwlock_t async_lock;
	/* the ring reaper */
	pthread_t reaper;
	bool reaper_on, reaper_stop;
	uint32_t reaper_ms;
	pthread_mutex_t reaper_lock;
	pthread_cond_t reaper_cond;
	uint64_t sync_kernel_ns; /* accumulates during one sync */
	struct late_clear *late;
	size_t nr_late, late_cap;
};

/* The private part lives right after the public struct. */
static struct kd_tracker_priv *priv(const struct kvmdirty_tracker *t)
{
	return (struct kd_tracker_priv *)(void *)(t + 1);
}

static uint64_t region_pages(const struct kvmdirty_region *r)
{
	return r->size / r->vm->page_size;
}

static uint64_t *bitmap_alloc(uint64_t nbits)
{
	size_t bytes = (KVMDIRTY_BITMAP_WORDS(nbits) * 8 + 63) & ~(size_t)63;

	return aligned_alloc(64, bytes ? bytes : 64);
}

static void *reaper(void *arg);
static void reaper_stop(struct kvmdirty_tracker *t);

void kd_track_kernel_ns(struct kvmdirty_tracker *t, uint64_t ns)
{
	if (t)
		__atomic_fetch_add(&priv(t)->sync_kernel_ns, ns, __ATOMIC_RELAXED);
}

KD_EXPORT int kvmdirty_tracker_new(struct kvmdirty_vm *vm, const struct kvmdirty_tracker_opts *opts,
				   struct kvmdirty_tracker **ret_tracker)
{
	struct kvmdirty_tracker_opts o = { 0 };
	struct kvmdirty_tracker *t;
	bool initially_set = false;
	int ret = 0;

	if (!vm || !ret_tracker)
		return -EINVAL;
	if (opts)
		o = *opts;
	if (vm->tracker)
		return -EBUSY;
	if (!o.ring_entries)
		o.ring_entries = DEFAULT_RING_ENTRIES;
	if (!o.clear_chunk_pages)
		o.clear_chunk_pages = DEFAULT_CHUNK_PAGES;
	if (o.clear_chunk_pages % 64 || (unsigned int)o.mode > KVMDIRTY_MODE_DIRTY_RING)
		return -EINVAL;
	if (o.mode == KVMDIRTY_MODE_AUTO)
		o.mode = (vm->caps[KVMDIRTY_CAP_MANUAL_PROTECT] & KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE)
				 ? KVMDIRTY_MODE_CLEAR_LOG
				 : KVMDIRTY_MODE_DIRTY_LOG;
	/* what an earlier tracker enabled on the VM cannot be undone */
	if (vm->kvm_mode && vm->kvm_mode != o.mode)
		return -EBUSY;

	t = calloc(1, sizeof(*t) + sizeof(struct kd_tracker_priv));
	if (!t)
		return -ENOMEM;
	t->vm = vm;
	t->mode = o.mode;
	t->chunk_pages = o.clear_chunk_pages;
	t->slots = calloc((size_t)vm->caps[KVMDIRTY_CAP_NR_MEMSLOTS], sizeof(*t->slots));
	if (!t->slots) {
		free(t);
		return -ENOMEM;
	}
	if (!vm->kvm_mode) {
		if (o.mode == KVMDIRTY_MODE_CLEAR_LOG) {
			ret = kd_log_enable_manual(vm, &initially_set);
			vm->initially_set = initially_set;
		}
		else if (o.mode == KVMDIRTY_MODE_DIRTY_RING)
			ret = kd_ring_enable(vm, o.ring_entries);
		if (ret < 0) {
			free(t->slots);
			free(t);
			return ret;
		}
		vm->kvm_mode = o.mode;
	}
	pthread_rwlock_init(&priv(t)->async_lock, NULL);
	pthread_mutex_init(&priv(t)->reaper_lock, NULL);
	pthread_cond_init(&priv(t)->reaper_cond, NULL);
	vm->tracker = t;
	if (o.mode == KVMDIRTY_MODE_DIRTY_RING && o.reaper_ms) {
		priv(t)->reaper_ms = o.reaper_ms;
		if (pthread_create(&priv(t)->reaper, NULL, reaper, t)) {
			kvmdirty_tracker_free(t);
			return -EAGAIN;
		}
		priv(t)->reaper_on = true;
	}
	*ret_tracker = t;
	return 0;
}

static void track_region_drop(struct kvmdirty_tracker *t, uint32_t slot)
{
	struct kd_track_region *tr = &t->slots[slot];

	if (!tr->tracking)
		return;
	pthread_rwlock_wrlock(&priv(t)->async_lock);
	__atomic_store_n(&tr->tracking, false, __ATOMIC_RELEASE);
	free(tr->async);
	tr->async = NULL;
	pthread_rwlock_unlock(&priv(t)->async_lock);
	free(tr->pending);
	free(tr->kvm_bmap);
	free(tr->to_clear);
	t->pending_total -= tr->pending_count;
	memset(tr, 0, sizeof(*tr));
}

KD_EXPORT void kvmdirty_tracker_free(struct kvmdirty_tracker *t)
{
	if (!t)
		return;
	reaper_stop(t);
	kvmdirty_tracker_stop(t, NULL);
	t->vm->tracker = NULL;
	pthread_rwlock_destroy(&priv(t)->async_lock);
	pthread_mutex_destroy(&priv(t)->reaper_lock);
	pthread_cond_destroy(&priv(t)->reaper_cond);
	free(priv(t)->late);
	free(t->slots);
	free(t);
}

KD_EXPORT enum kvmdirty_mode kvmdirty_tracker_mode(const struct kvmdirty_tracker *t)
{
	return t->mode;
}

static int start_one(struct kvmdirty_tracker *t, struct kvmdirty_region *r)
{
	struct kd_track_region *tr = &t->slots[r->slot], n = { 0 };
	bool bitmap_mode = t->mode != KVMDIRTY_MODE_DIRTY_RING;
	int ret;

	if (tr->tracking)
		return 0;
	n.npages = region_pages(r);
	n.pending = bitmap_alloc(n.npages);
	n.async = bitmap_alloc(n.npages);
	if (bitmap_mode) {
		n.kvm_bmap = bitmap_alloc(n.npages);
		n.to_clear = bitmap_alloc(n.npages);
	}
	if (!n.pending || !n.async || (bitmap_mode && (!n.kvm_bmap || !n.to_clear))) {
		ret = -ENOMEM;
		goto err;
	}
	memset(n.async, 0, KVMDIRTY_BITMAP_WORDS(n.npages) * 8);
	if (bitmap_mode)
		memset(n.to_clear, 0, KVMDIRTY_BITMAP_WORDS(n.npages) * 8);
	/*
	 * With INITIALLY_SET, KVM starts the slot all dirty and unprotected:
	 * take that as fetched, so that the first pass clears (protects) each
	 * chunk before handing it out and the next GET reports only what was
	 * written after, instead of every page a second time.  Clearing a
	 * bit not fetched is safe here because every page is pending and is
	 * handed out only after its chunk's clear.
	 */
	if (t->mode == KVMDIRTY_MODE_CLEAR_LOG && t->vm->initially_set)
		kvmdirty_bitmap_set(n.to_clear, 0, n.npages);
	/* the first pass reports every page */
	memset(n.pending, 0, KVMDIRTY_BITMAP_WORDS(n.npages) * 8);
	kvmdirty_bitmap_set(n.pending, 0, n.npages);
	n.pending_count = n.npages;

	ret = kvmdirty_region_set_logging(t->vm, r, true);
	if (ret < 0)
		goto err;
	pthread_rwlock_wrlock(&priv(t)->async_lock);
	*tr = n;
	__atomic_store_n(&tr->tracking, true, __ATOMIC_RELEASE);
	pthread_rwlock_unlock(&priv(t)->async_lock);
	t->pending_total += n.npages;
	return 0;
err:
	free(n.pending);
	free(n.async);
	free(n.kvm_bmap);
	free(n.to_clear);
	return ret;
}

KD_EXPORT int kvmdirty_tracker_start(struct kvmdirty_tracker *t, struct kvmdirty_region *r)
{
	int ret;

	if (!t)
		return -EINVAL;
	if (r) {
		if (r->vm != t->vm || kd_slot_region(t->vm, r->slot) != r)
			return -EINVAL;
		return start_one(t, r);
	}
	for (r = kvmdirty_region_next(t->vm, NULL); r; r = kvmdirty_region_next(t->vm, r)) {
		ret = start_one(t, r);
		if (ret < 0)
			return ret;
	}
	return 0;
}

KD_EXPORT int kvmdirty_tracker_stop(struct kvmdirty_tracker *t, struct kvmdirty_region *r)
{
	int ret, first = 0;

	if (!t)
		return -EINVAL;
	if (r) {
		if (r->vm != t->vm || kd_slot_region(t->vm, r->slot) != r)
			return -EINVAL;
		if (!t->slots[r->slot].tracking)
			return 0;
		ret = kvmdirty_region_set_logging(t->vm, r, false);
		track_region_drop(t, r->slot);
		return ret;
	}
	for (r = kvmdirty_region_next(t->vm, NULL); r; r = kvmdirty_region_next(t->vm, r)) {
		if (!t->slots[r->slot].tracking)
			continue;
		ret = kvmdirty_region_set_logging(t->vm, r, false);
		if (ret < 0 && !first)
			first = ret;
		track_region_drop(t, r->slot);
	}
	return first;
}

void kd_track_region_removed(struct kvmdirty_tracker *t, struct kvmdirty_region *r)
{
	track_region_drop(t, r->slot);
}

/* Callers hold async_lock for reading. */
static void async_set(struct kvmdirty_tracker *t, uint32_t slot, uint64_t first, uint64_t end)
{
	struct kd_track_region *tr;

	if (slot >= t->vm->nr_slots)
		return;
	tr = &t->slots[slot];
	if (!__atomic_load_n(&tr->tracking, __ATOMIC_ACQUIRE) || first >= tr->npages)
		return;
	kvmdirty_bitmap_set_atomic(tr->async, first, end < tr->npages ? end : tr->npages);
}

/* Called by the ring harvest, which kd_track_harvest() runs under the read lock. */
void kd_track_async_page(struct kvmdirty_tracker *t, uint32_t slot, uint64_t page)
{
	async_set(t, slot, page, page + 1);
}

void kd_track_mark_all(struct kvmdirty_tracker *t)
{
	uint32_t slot;

	pthread_rwlock_rdlock(&priv(t)->async_lock);
	for (slot = 0; slot < t->vm->nr_slots; slot++)
		async_set(t, slot, 0, UINT64_MAX);
	pthread_rwlock_unlock(&priv(t)->async_lock);
}

/*
 * Harvest one vCPU's ring under the read lock (taken once per harvest,
 * not per entry).  A harvest that took the whole ring may have lost
 * entries KVM pushed over: every tracked page is marked then.
 */
int64_t kd_track_harvest(struct kvmdirty_tracker *t, struct kvmdirty_vcpu *v)
{
	int64_t n;

	pthread_rwlock_rdlock(&priv(t)->async_lock);
	n = kd_ring_harvest(t, v);
	pthread_rwlock_unlock(&priv(t)->async_lock);
	__atomic_fetch_add(&t->stats.ring_harvested, (uint64_t)n, __ATOMIC_RELAXED);
	if (n == (int64_t)t->vm->ring_entries) {
		__atomic_fetch_add(&t->stats.ring_overflows, 1, __ATOMIC_RELAXED);
		kd_track_mark_all(t);
	}
	return n;
}

static void harvest_all(struct kvmdirty_tracker *t)
{
	struct kvmdirty_vm *vm = t->vm;
	uint32_t i;

	pthread_mutex_lock(&vm->vcpus_lock);
	for (i = 0; i < vm->nr_vcpus; i++)
		kd_track_harvest(t, vm->vcpus[i]);
	pthread_mutex_unlock(&vm->vcpus_lock);
}

/*
 * The reaper: every reaper_ms, harvest all rings and reset them, as QEMU's
 * reaper thread does each second.  What it takes goes to the async
 * bitmaps; the pages are re-protected by its reset before any sync can
 * hand them out.
 */
static void *reaper(void *arg)
{
	struct kvmdirty_tracker *t = arg;
	struct kd_tracker_priv *p = priv(t);

	pthread_mutex_lock(&p->reaper_lock);
	while (!p->reaper_stop) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += (long)(p->reaper_ms % 1000) * 1000000;
		ts.tv_sec += p->reaper_ms / 1000 + ts.tv_nsec / 1000000000;
		ts.tv_nsec %= 1000000000;
		pthread_cond_timedwait(&p->reaper_cond, &p->reaper_lock, &ts);
		if (p->reaper_stop)
			break;
		pthread_mutex_unlock(&p->reaper_lock);
		harvest_all(t);
		kd_ring_reset(t->vm, false);
		__atomic_fetch_add(&t->stats.ring_reaper_runs, 1, __ATOMIC_RELAXED);
		pthread_mutex_lock(&p->reaper_lock);
	}
	pthread_mutex_unlock(&p->reaper_lock);
	return NULL;
}

static void reaper_stop(struct kvmdirty_tracker *t)
{
	struct kd_tracker_priv *p = priv(t);

	if (!p->reaper_on)
		return;
	pthread_mutex_lock(&p->reaper_lock);
	p->reaper_stop = true;
	pthread_cond_signal(&p->reaper_cond);
	pthread_mutex_unlock(&p->reaper_lock);
	pthread_join(p->reaper, NULL);
	p->reaper_on = false;
}

/*
 * pending |= kvm_bmap (and to_clear |= kvm_bmap): the words KVM reported
 * dirty, found with the scanner's zero skip; returns the new pages.
 */
static uint64_t merge_log(struct kd_track_region *tr, bool manual)
{
	uint64_t words = KVMDIRTY_BITMAP_WORDS(tr->npages), nbits = words * 64, fresh = 0, b;

	for (b = kvmdirty_bitmap_next_set(tr->kvm_bmap, 0, nbits); b < nbits;
	     b = kvmdirty_bitmap_next_set(tr->kvm_bmap, (b / 64 + 1) * 64, nbits)) {
		size_t i = b / 64;
		uint64_t v = tr->kvm_bmap[i];

		fresh += (uint64_t)__builtin_popcountll(v & ~tr->pending[i]);
		tr->pending[i] |= v;
		if (manual)
			tr->to_clear[i] |= v;
	}
	return fresh;
}

static int late_flush(struct kvmdirty_tracker *t);

/* Dirty rate: pages made pending over the last KD_RATE_SAMPLES syncs' span. */
static void rate_sample(struct kvmdirty_tracker *t, uint64_t now, uint64_t pages)
{
	unsigned int count, oldest, i;
	uint64_t sum = 0;

	t->rate_ns[t->rate_pos] = now;
	t->rate_pages[t->rate_pos] = pages;
	count = t->stats.syncs < KD_RATE_SAMPLES ? (unsigned int)t->stats.syncs : KD_RATE_SAMPLES;
	oldest = (t->rate_pos + KD_RATE_SAMPLES + 1 - count) % KD_RATE_SAMPLES;
	t->rate_pos = (t->rate_pos + 1) % KD_RATE_SAMPLES;
	/* the oldest sample's pages were made before the span starts */
	for (i = 1; i < count; i++)
		sum += t->rate_pages[(oldest + i) % KD_RATE_SAMPLES];
	if (now - t->rate_ns[oldest] >= 1000000)
		t->stats.dirty_rate = sum * 1000000000ull / (now - t->rate_ns[oldest]);
}

KD_EXPORT int64_t kvmdirty_tracker_sync(struct kvmdirty_tracker *t)
{
	struct kvmdirty_vm *vm;
	uint64_t t0, now, fresh = 0;
	uint32_t slot;
	int ret;

	if (!t)
		return -EINVAL;
	vm = t->vm;
	t0 = kd_now_ns();
	__atomic_store_n(&priv(t)->sync_kernel_ns, 0, __ATOMIC_RELAXED);
	/* test hook only: the clears next() should have issued, after the read */
	ret = late_flush(t);
	if (ret < 0)
		return ret;

	if (t->mode == KVMDIRTY_MODE_DIRTY_RING) {
		harvest_all(t);
		ret = kd_ring_reset(vm, true);
		if (ret < 0)
			return ret;
	} else {
		for (slot = 0; slot < vm->nr_slots; slot++) {
			struct kd_track_region *tr = &t->slots[slot];
			uint64_t n;

			if (!tr->tracking)
				continue;
			ret = kd_log_get(vm, &vm->regions[slot], tr->kvm_bmap);
			/* logging turned off behind the tracker's back: nothing to fetch */
			if (ret == -ENOENT)
				continue;
			if (ret < 0)
				return ret;
			n = merge_log(tr, t->mode == KVMDIRTY_MODE_CLEAR_LOG);
			tr->pending_count += n;
			fresh += n;
		}
	}
	/* what other threads reported */
	pthread_rwlock_rdlock(&priv(t)->async_lock);
	for (slot = 0; slot < vm->nr_slots; slot++) {
		struct kd_track_region *tr = &t->slots[slot];
		uint64_t n;

		if (!tr->tracking)
			continue;
		n = kvmdirty_bitmap_take(tr->pending, tr->async, 0, tr->npages);
		tr->pending_count += n;
		fresh += n;
	}
	pthread_rwlock_unlock(&priv(t)->async_lock);

	t->pending_total += fresh;
	t->stats.syncs++;
	t->stats.last_sync_pages = fresh;
	t->stats.total_sync_pages += fresh;
	t->stats.last_sync_kernel_ns = __atomic_load_n(&priv(t)->sync_kernel_ns, __ATOMIC_RELAXED);
	now = kd_now_ns();
	t->stats.last_sync_lib_ns = now - t0 - t->stats.last_sync_kernel_ns;
	rate_sample(t, now, fresh);
	return (int64_t)fresh;
}

KD_EXPORT uint64_t kvmdirty_tracker_pending(const struct kvmdirty_tracker *t)
{
	return t->pending_total;
}

/* KVM_CLEAR_DIRTY_LOG of one chunk's fetched bits, then forget them. */
static int clear_chunk(struct kvmdirty_tracker *t, struct kvmdirty_region *r, struct kd_track_region *tr,
		       uint64_t chunk)
{
	uint64_t first = chunk * t->chunk_pages;
	uint64_t end = first + t->chunk_pages < tr->npages ? first + t->chunk_pages : tr->npages;
	int ret;

	if (kvmdirty_bitmap_is_clear(tr->to_clear, first, end))
		return 0;
	ret = kd_log_clear(t->vm, r, first, end - first, tr->to_clear + first / 64);
	if (ret < 0)
		return ret;
	kvmdirty_bitmap_clear(tr->to_clear, first, end);
	t->stats.clear_calls++;
	return 0;
}

static int late_add(struct kvmdirty_tracker *t, uint32_t slot, uint64_t chunk)
{
	struct kd_tracker_priv *p = priv(t);

	if (p->nr_late == p->late_cap) {
		size_t cap = p->late_cap ? p->late_cap * 2 : 64;
		struct late_clear *l = realloc(p->late, cap * sizeof(*l));

		if (!l)
			return -ENOMEM;
		p->late = l;
		p->late_cap = cap;
	}
	p->late[p->nr_late++] = (struct late_clear){ slot, chunk };
	return 0;
}

static int late_flush(struct kvmdirty_tracker *t)
{
	struct kd_tracker_priv *p = priv(t);
	size_t i;
	int ret = 0;

	for (i = 0; i < p->nr_late && ret >= 0; i++) {
		struct kd_track_region *tr = &t->slots[p->late[i].slot];

		if (tr->tracking)
			ret = clear_chunk(t, &t->vm->regions[p->late[i].slot], tr, p->late[i].chunk);
	}
	p->nr_late = 0;
	return ret;
}

/*
 * Protect [first, first + n) of r: clear the dirty chunks it touches.
 * Runs come in address order within one call, so chunks below *done were
 * handled for an earlier run of this call: many small runs in one chunk
 * check it once, not once each.
 */
static int protect(struct kvmdirty_tracker *t, struct kvmdirty_region *r, struct kd_track_region *tr,
		   uint64_t first, uint64_t n, uint64_t *done)
{
	uint64_t c = first / t->chunk_pages, last = (first + n - 1) / t->chunk_pages;
	int ret;

	if (t->mode != KVMDIRTY_MODE_CLEAR_LOG)
		return 0;
	for (c = c > *done ? c : *done; c <= last; c++) {
		ret = t->test_clear_late ? late_add(t, r->slot, c) : clear_chunk(t, r, tr, c);
		if (ret < 0)
			return ret;
		*done = c + 1;
	}
	return 0;
}

/* Hand out runs of one region from page *pos; returns ranges written or -errno. */
static int next_in_region(struct kvmdirty_tracker *t, uint32_t slot, uint64_t *pos, uint64_t end,
			  struct kvmdirty_range *out, size_t max, uint64_t *pages_left)
{
	struct kd_track_region *tr = &t->slots[slot];
	struct kvmdirty_region *r = &t->vm->regions[slot];
	struct kvmdirty_run runs[64];
	uint64_t done = 0;
	size_t k = 0, n, i;
	int ret;

	while (k < max && *pages_left && (n = kvmdirty_bitmap_runs(tr->pending, pos, end, runs,
								   max - k < 64 ? max - k : 64)) > 0) {
		for (i = 0; i < n && k < max && *pages_left; i++) {
			uint64_t first = runs[i].first, cnt = runs[i].count;

			if (cnt > *pages_left)
				cnt = *pages_left;
			ret = protect(t, r, tr, first, cnt, &done);
			if (ret < 0)
				return k ? (int)k : ret;
			kvmdirty_bitmap_clear(tr->pending, first, first + cnt);
			tr->pending_count -= cnt;
			t->pending_total -= cnt;
			*pages_left -= cnt;
			out[k++] = (struct kvmdirty_range){
				.region = r,
				.page = first,
				.npages = cnt,
				.gpa = r->gpa + first * t->vm->page_size,
				.hva = (char *)r->hva + first * t->vm->page_size,
			};
			*pos = first + cnt;
		}
		if (i < n)
			break;
	}
	return (int)k;
}

KD_EXPORT int kvmdirty_tracker_next(struct kvmdirty_tracker *t, struct kvmdirty_range *out, size_t max,
				    uint64_t max_pages)
{
	uint32_t nr_slots, step, slot, start_slot;
	uint64_t pages_left = max_pages ? max_pages : UINT64_MAX, start_page;
	size_t k = 0;
	int ret;

	if (!t || (!out && max))
		return -EINVAL;
	nr_slots = t->vm->nr_slots;
	if (!t->pending_total || !max || !nr_slots)
		return 0;
	if (t->cursor_slot >= nr_slots)
		t->cursor_slot = 0;
	start_slot = t->cursor_slot;
	start_page = t->cursor_page;
	/* one lap from the cursor, ending with the cursor region's head */
	for (step = 0; step <= nr_slots && k < max && pages_left && t->pending_total; step++) {
		struct kd_track_region *tr;
		uint64_t pos, end;

		slot = (start_slot + step) % nr_slots;
		tr = &t->slots[slot];
		if (!tr->tracking || !tr->pending_count)
			continue;
		pos = step == 0 ? start_page : 0;
		end = step == nr_slots ? start_page : tr->npages;
		if (pos >= end)
			continue;
		ret = next_in_region(t, slot, &pos, end, out + k, max - k, &pages_left);
		if (ret < 0)
			return k ? (int)k : ret;
		k += (size_t)ret;
		if (ret) {
			t->cursor_slot = slot;
			t->cursor_page = pos;
		}
	}
	return (int)k;
}

static int mark_range(struct kvmdirty_tracker *t, uint64_t addr, uint64_t len, bool by_hva);

KD_EXPORT int kvmdirty_tracker_mark_dirty_gpa(struct kvmdirty_tracker *t, uint64_t gpa, uint64_t len)
{
	return mark_range(t, gpa, len, false);
}

KD_EXPORT int kvmdirty_tracker_mark_dirty_hva(struct kvmdirty_tracker *t, const void *hva, uint64_t len)
{
	return mark_range(t, (uintptr_t)hva, len, true);
}

struct mark_ctx {
	struct kvmdirty_tracker *t;
	uint64_t addr;
};

static int mark_hva_one(uint32_t slot, void *p)
{
	struct mark_ctx *c = p;
	struct kvmdirty_region *r = &c->t->vm->regions[slot];
	uint64_t page = (c->addr - (uintptr_t)r->hva) / c->t->vm->page_size;

	async_set(c->t, slot, page, page + 1);
	return 0;
}

static int mark_range(struct kvmdirty_tracker *t, uint64_t addr, uint64_t len, bool by_hva)
{
	uint64_t ps, a, last;

	if (!t || !len || addr + len < addr)
		return -EINVAL;
	ps = t->vm->page_size;
	last = (addr + len - 1) & ~(ps - 1);
	pthread_rwlock_rdlock(&priv(t)->async_lock);
	for (a = addr & ~(ps - 1);; a += ps) {
		if (by_hva) {
			struct mark_ctx c = { t, a };

			kd_index_for_each_at(&t->vm->hva_index, a, mark_hva_one, &c);
		} else {
			struct kvmdirty_region *r = kvmdirty_region_from_gpa(t->vm, a);

			if (r) {
				/* the rest of the range inside this region at once */
				uint64_t first = (a - r->gpa) / ps;
				uint64_t stop = r->gpa + r->size - 1 < last ? r->gpa + r->size - ps : last;

				async_set(t, r->slot, first, first + (stop - a) / ps + 1);
				a = stop;
			}
		}
		if (a == last)
			break;
	}
	pthread_rwlock_unlock(&priv(t)->async_lock);
	return 0;
}

KD_EXPORT int kvmdirty_tracker_stats(const struct kvmdirty_tracker *t, struct kvmdirty_stats *ret_stats,
				     size_t size)
{
	struct kvmdirty_stats s;

	if (!t || !ret_stats || !size)
		return -EINVAL;
	s = t->stats;
	s.ring_harvested = __atomic_load_n(&t->stats.ring_harvested, __ATOMIC_RELAXED);
	s.ring_full_exits = __atomic_load_n(&t->stats.ring_full_exits, __ATOMIC_RELAXED);
	s.ring_overflows = __atomic_load_n(&t->stats.ring_overflows, __ATOMIC_RELAXED);
	s.ring_recoveries = __atomic_load_n(&t->stats.ring_recoveries, __ATOMIC_RELAXED);
	s.ring_full_ns = __atomic_load_n(&t->stats.ring_full_ns, __ATOMIC_RELAXED);
	s.ring_reaper_runs = __atomic_load_n(&t->stats.ring_reaper_runs, __ATOMIC_RELAXED);
	memcpy(ret_stats, &s, size < sizeof(s) ? size : sizeof(s));
	return 0;
}
