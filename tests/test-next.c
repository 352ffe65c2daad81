// SPDX-License-Identifier: MIT
/*
 * A tracker's hand-out (next) with no KVM: the test build's ioctl hook
 * answers for a KVM with manual protect and INITIALLY_SET, keeping each
 * slot's dirty bits as KVM does (a GET reports them and leaves them, a
 * CLEAR takes them, a write sets them).  What must hold, whatever
 * max_pages and max ranges a caller passes:
 *   - every pending page is handed out once, in slot and page order from
 *     the cursor, and nothing else;
 *   - a page pending beyond the first max_pages pages of the scan is
 *     still found in the same call (a scan bounded by the pages left
 *     must start from the next pending page, not from the cursor).
 * Pure: never skips.
 */
#include <check.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <linux/kvm.h>

#include <kvmdirty.h>

#include "hooks.h"
#include "test-util.h"

#define PAGE	  4096ull
#define NSLOTS	  8
#define BASE_GPA  (4ull << 30)

/* The stub KVM: per slot, its size and its dirty bits. */
static struct {
	uint64_t npages[NSLOTS];
	uint64_t *bits[NSLOTS];
	bool log[NSLOTS];
} k;

static int stub_ioctl(int fd, unsigned long req, void *arg)
{
	(void)fd;
	switch (req) {
	case KVM_GET_API_VERSION:
		return KVM_API_VERSION;
	case KVM_CHECK_EXTENSION:
		if ((long)arg == KVM_CAP_NR_MEMSLOTS)
			return NSLOTS;
		if ((long)arg == KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2)
			return KVM_DIRTY_LOG_MANUAL_PROTECT_ENABLE | KVM_DIRTY_LOG_INITIALLY_SET;
		return 0;
	case KVM_ENABLE_CAP:
		return 0;
	case KVM_SET_USER_MEMORY_REGION: {
		const struct kvm_userspace_memory_region *m = arg;
		uint32_t s = m->slot;
		bool log = m->flags & KVM_MEM_LOG_DIRTY_PAGES;

		if (s >= NSLOTS)
			return -EINVAL;
		if (!m->memory_size) {
			free(k.bits[s]);
			k.bits[s] = NULL;
			k.npages[s] = 0;
			k.log[s] = false;
			return 0;
		}
		if (!k.bits[s]) {
			k.npages[s] = m->memory_size / PAGE;
			k.bits[s] = calloc(KVMDIRTY_BITMAP_WORDS(k.npages[s]), 8);
		}
		if (log && !k.log[s]) /* INITIALLY_SET */
			kvmdirty_bitmap_set(k.bits[s], 0, k.npages[s]);
		k.log[s] = log;
		return 0;
	}
	case KVM_GET_DIRTY_LOG: {
		const struct kvm_dirty_log *l = arg;

		if (l->slot >= NSLOTS || !k.log[l->slot])
			return -ENOENT;
		memcpy(l->dirty_bitmap, k.bits[l->slot], KVMDIRTY_BITMAP_WORDS(k.npages[l->slot]) * 8);
		return 0;
	}
	case KVM_CLEAR_DIRTY_LOG: {
		const struct kvm_clear_dirty_log *c = arg;
		const uint64_t *mask = c->dirty_bitmap;
		uint64_t i;

		if (c->slot >= NSLOTS || !k.log[c->slot] || c->first_page % 64 ||
		    c->first_page + c->num_pages > k.npages[c->slot])
			return -EINVAL;
		for (i = 0; i < c->num_pages; i++)
			if (mask[i / 64] >> (i % 64) & 1)
				kvmdirty_bitmap_clear(k.bits[c->slot], c->first_page + i, c->first_page + i + 1);
		return 0;
	}
	}
	return -ENOTTY;
}

struct rig {
	struct kvmdirty_vm *vm;
	struct kvmdirty_tracker *t;
	struct kvmdirty_region *r[NSLOTS];
	uint8_t *mem;
	uint64_t size;
	unsigned int n;
	uint64_t region_pages;
};

static void rig_new(struct rig *g, unsigned int n, uint64_t region_pages)
{
	struct kvmdirty_tracker_opts o = { .mode = KVMDIRTY_MODE_CLEAR_LOG, .clear_chunk_pages = 64 };
	unsigned int i;

	memset(&k, 0, sizeof(k));
	kd_test_hooks_set(stub_ioctl, NULL, false);
	g->n = n;
	g->region_pages = region_pages;
	g->size = n * region_pages * PAGE;
	g->mem = mmap(NULL, g->size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	ck_assert_ptr_ne(g->mem, MAP_FAILED);
	ck_assert_ok(kvmdirty_vm_adopt(open("/dev/null", O_RDWR | O_CLOEXEC), open("/dev/null", O_RDWR | O_CLOEXEC),
				       &g->vm));
	ck_assert_ok(kvmdirty_tracker_new(g->vm, &o, &g->t));
	for (i = 0; i < n; i++)
		ck_assert_ok(kvmdirty_region_add(g->vm, BASE_GPA + i * region_pages * PAGE, region_pages * PAGE,
						 g->mem + i * region_pages * PAGE, 0, &g->r[i]));
	ck_assert_ok(kvmdirty_tracker_start(g->t, NULL));
}

static void rig_free(struct rig *g)
{
	unsigned int i;

	kvmdirty_vm_free(g->vm);
	munmap(g->mem, g->size);
	kd_test_hooks_set(NULL, NULL, false);
	for (i = 0; i < NSLOTS; i++)
		free(k.bits[i]);
}

/* A guest write: the page's dirty bit in its slot. */
static void guest_write(struct rig *g, unsigned int region, uint64_t page)
{
	uint32_t s = kvmdirty_region_slot(g->r[region]);

	kvmdirty_bitmap_set(k.bits[s], page, page + 1);
}

/*
 * Drain with next(max, max_pages) until it returns 0: every range within
 * a tracked region and in order from the last, each page once; returns the
 * pages handed out, counting them in seen (one byte a page of all regions).
 */
static uint64_t drain(struct rig *g, size_t max, uint64_t max_pages, uint8_t *seen, unsigned int *calls)
{
	struct kvmdirty_range rg[64];
	uint64_t total = 0, got;
	int n, i;

	*calls = 0;
	while ((n = kvmdirty_tracker_next(g->t, rg, max, max_pages)) > 0) {
		(*calls)++;
		got = 0;
		for (i = 0; i < n; i++) {
			uint64_t at = (uint64_t)((uint8_t *)rg[i].hva - g->mem) / PAGE, p;

			expect(rg[i].npages > 0 && at + rg[i].npages <= g->n * g->region_pages,
			       "range %d of call %u: page %" PRIu64 " + %" PRIu64, i, *calls, at, rg[i].npages);
			for (p = at; p < at + rg[i].npages; p++) {
				expect(!seen[p], "page %" PRIu64 " handed out twice", p);
				seen[p] = 1;
			}
			got += rg[i].npages;
		}
		expect(!max_pages || got <= max_pages, "call %u: %" PRIu64 " pages for a max of %" PRIu64, *calls, got,
		       max_pages);
		total += got;
	}
	ck_assert_int_eq(n, 0);
	return total;
}

/*
 * The first pass (every page pending, INITIALLY_SET) in small hands:
 * max_pages of 1, 7, 64 and 512 pages, max ranges of 1, 33 and 64, over
 * three regions; every page once (with 33 ranges, the scanner returned
 * none while a run longer than a word was pending: next() said 0).
 */
START_TEST(first_pass_small_hands)
{
	static const uint64_t hands[] = { 1, 7, 64, 512 };
	uint64_t pages = 3 * 4096, max_pages = hands[_i % 4];
	size_t max = _i < 4 ? 1 : _i < 8 ? 33 : 64;
	uint8_t *seen = calloc(pages, 1);
	unsigned int calls;
	struct rig g;

	rig_new(&g, 3, 4096);
	ck_assert_uint_eq(drain(&g, max, max_pages, seen, &calls), pages);
	ck_assert_ptr_eq(memchr(seen, 0, pages), NULL);
	ck_assert_uint_ge(calls, pages / (max * max_pages));
	rig_free(&g);
	free(seen);
}
END_TEST

/*
 * A few pages pending far past the cursor, in a hand smaller than the gap:
 * one call must find them.  With the scan bounded by the pages left from
 * the cursor instead of from the next pending page, the call found nothing
 * and the pass ended with the pages still pending.
 */
START_TEST(pending_beyond_the_hand)
{
	uint64_t pages = 2 * 8192;
	uint8_t *seen = calloc(pages, 1);
	struct kvmdirty_range rg[64];
	unsigned int calls;
	struct rig g;
	int n;

	rig_new(&g, 2, 8192);
	ck_assert_uint_eq(drain(&g, 64, 0, seen, &calls), pages);
	memset(seen, 0, pages);
	guest_write(&g, 0, 7000);
	guest_write(&g, 0, 7001);
	guest_write(&g, 1, 8100);
	ck_assert_int_eq(kvmdirty_tracker_sync(g.t), 3);
	n = kvmdirty_tracker_next(g.t, rg, 64, 100);
	ck_assert_int_eq(n, 2);
	ck_assert_uint_eq(rg[0].page, 7000);
	ck_assert_uint_eq(rg[0].npages, 2);
	ck_assert_ptr_eq(rg[0].region, g.r[0]);
	ck_assert_uint_eq(rg[1].page, 8100);
	ck_assert_ptr_eq(rg[1].region, g.r[1]);
	ck_assert_int_eq(kvmdirty_tracker_next(g.t, rg, 64, 100), 0);
	ck_assert_uint_eq(kvmdirty_tracker_pending(g.t), 0);
	rig_free(&g);
	free(seen);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("next");
	TCase *tc = tcase_create("next");

	tcase_set_timeout(tc, 120);
	tcase_add_loop_test(tc, first_pass_small_hands, 0, 12);
	tcase_add_test(tc, pending_beyond_the_hand);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
