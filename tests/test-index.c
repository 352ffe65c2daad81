// SPDX-License-Identifier: MIT
/* The hashed range index against a reference model (a plain array). */
#include <check.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "index.h"
#include "pageset.h"
#include "rng.h"
#include "test-util.h"

#define MAX_IDS 32764u

struct model {
	uint64_t start[MAX_IDS], len[MAX_IDS];
	bool used[MAX_IDS];
	uint32_t count;
	uint32_t hi; /* ids in use are below this */
};

static uint64_t rng_state = 88172645463325252ull;

static uint64_t rnd(void)
{
	return xorshift64(&rng_state);
}

static uint32_t model_lookup(const struct model *m, uint64_t addr)
{
	uint32_t id;

	for (id = 0; id < m->hi; id++)
		if (m->used[id] && addr - m->start[id] < m->len[id])
			return id;
	return KD_INDEX_NO_ID;
}

static bool model_overlaps(const struct model *m, uint64_t start, uint64_t len, uint32_t skip)
{
	uint32_t id;

	for (id = 0; id < m->hi; id++)
		if (m->used[id] && id != skip && m->start[id] < start + len && start < m->start[id] + m->len[id])
			return true;
	return false;
}

/* Check lookups at and around each range's edges and at random points. */
static void check_all(const struct kd_index *ix, const struct model *m, uint64_t span, int random_points)
{
	uint32_t id;
	int i;

	for (id = 0; id < m->hi; id++) {
		uint64_t probes[4];
		int k;

		if (!m->used[id])
			continue;
		probes[0] = m->start[id];
		probes[1] = m->start[id] + m->len[id] - 1;
		probes[2] = m->start[id] + m->len[id];
		probes[3] = m->start[id] - 1;
		for (k = 0; k < 4; k++) {
			uint32_t got = kd_index_lookup(ix, probes[k]), want = model_lookup(m, probes[k]);

			expect(got == want, "lookup(0x%" PRIx64 ") = %u, model %u (range %u [0x%" PRIx64
				      ", +0x%" PRIx64 "))", probes[k], got, want, id, m->start[id], m->len[id]);
		}
	}
	for (i = 0; i < random_points; i++) {
		uint64_t a = rnd() % span;
		uint32_t got = kd_index_lookup(ix, a), want = model_lookup(m, a);

		expect(got == want, "lookup(0x%" PRIx64 ") = %u, model %u", a, got, want);
	}
}

/* A range of a random shape: tiny, small, medium or huge, any alignment. */
static void random_range(uint64_t span, uint64_t *start, uint64_t *len)
{
	switch (rnd() % 8) {
	case 0:
		*len = 1 + rnd() % 16;
		break;
	case 1:
	case 2:
	case 3:
		*len = 4096 * (1 + rnd() % 512);
		break;
	case 4:
	case 5:
		*len = 1 + rnd() % (1 << 22);
		break;
	case 6:
		*len = (1ull << 30) + rnd() % (1ull << 32);
		break;
	default:
		*len = 1 + rnd() % (span / 64);
		break;
	}
	*start = rnd() % (span - *len);
	if (rnd() & 1)
		*start &= ~4095ull;
}

static void random_ops(uint32_t target, uint64_t span, int rounds)
{
	static struct model m;
	struct kd_index ix;
	int r;

	memset(&m, 0, sizeof(m));
	kd_index_init(&ix);
	for (r = 0; r < rounds; r++) {
		uint32_t id = (uint32_t)(rnd() % (target * 5 / 4 + 1));
		uint64_t start, len;
		int op = (int)(rnd() % 10), ret;

		if (id >= MAX_IDS)
			id = MAX_IDS - 1;
		if (m.used[id] && op < 3) { /* remove */
			ret = kd_index_remove(&ix, id);
			expect(ret == 0, "remove %u: %d", id, ret);
			m.used[id] = false;
			m.count--;
		} else if (m.used[id] && op < 5) { /* move: remove + insert elsewhere */
			random_range(span, &start, &len);
			len = m.len[id];
			if (start + len > span)
				start = span - len;
			if (model_overlaps(&m, start, len, id)) {
				expect(kd_index_overlaps(&ix, start, len, id),
					      "overlap of [0x%" PRIx64 ", +0x%" PRIx64 ") missed", start, len);
				continue;
			}
			ck_assert(!kd_index_overlaps(&ix, start, len, id));
			ck_assert_int_eq(kd_index_remove(&ix, id), 0);
			ret = kd_index_insert(&ix, id, start, len);
			expect(ret == 0, "reinsert %u: %d", id, ret);
			m.start[id] = start;
		} else if (!m.used[id]) { /* add */
			random_range(span, &start, &len);
			if (model_overlaps(&m, start, len, KD_INDEX_NO_ID)) {
				expect(kd_index_overlaps(&ix, start, len, KD_INDEX_NO_ID),
					      "overlap of [0x%" PRIx64 ", +0x%" PRIx64 ") missed", start, len);
				continue;
			}
			expect(!kd_index_overlaps(&ix, start, len, KD_INDEX_NO_ID),
				      "false overlap for [0x%" PRIx64 ", +0x%" PRIx64 ")", start, len);
			ret = kd_index_insert(&ix, id, start, len);
			expect(ret == 0, "insert %u [0x%" PRIx64 ", +0x%" PRIx64 "): %d", id, start, len, ret);
			m.used[id] = true;
			if (id >= m.hi)
				m.hi = id + 1;
			m.start[id] = start;
			m.len[id] = len;
			m.count++;
		}
		if (r % (rounds / 8 + 1) == 0)
			check_all(&ix, &m, span, 200);
	}
	ck_assert_uint_eq(ix.nr_ranges, m.count);
	check_all(&ix, &m, span, 2000);
	kd_index_fini(&ix);
}

START_TEST(random_small)
{
	random_ops(8, 1ull << 40, 4000);
}
END_TEST

START_TEST(random_medium)
{
	random_ops(512, 1ull << 40, 6000);
}
END_TEST

START_TEST(random_large)
{
	random_ops(4096, 1ull << 46, 12000);
}
END_TEST

/* 32,764 neighbouring page-sized ranges, then one huge one beside them. */
START_TEST(many_neighbours)
{
	struct kd_index ix;
	uint32_t id;

	kd_index_init(&ix);
	for (id = 0; id < MAX_IDS - 1; id++)
		ck_assert_int_eq(kd_index_insert(&ix, id, 0x100000000ull + id * 4096ull, 4096), 0);
	ck_assert_int_eq(kd_index_insert(&ix, MAX_IDS - 1, 1ull << 40, 1ull << 39), 0);
	for (id = 0; id < MAX_IDS - 1; id++) {
		uint64_t a = 0x100000000ull + id * 4096ull;

		ck_assert_uint_eq(kd_index_lookup(&ix, a), id);
		ck_assert_uint_eq(kd_index_lookup(&ix, a + 4095), id);
	}
	ck_assert_uint_eq(kd_index_lookup(&ix, 0x100000000ull - 1), KD_INDEX_NO_ID);
	ck_assert_uint_eq(kd_index_lookup(&ix, 0x100000000ull + (MAX_IDS - 1) * 4096ull), KD_INDEX_NO_ID);
	ck_assert_uint_eq(kd_index_lookup(&ix, (1ull << 40) + 12345), MAX_IDS - 1);
	ck_assert_uint_eq(kd_index_lookup(&ix, (1ull << 40) + (1ull << 39) - 1), MAX_IDS - 1);
	ck_assert_uint_eq(kd_index_lookup(&ix, (1ull << 40) + (1ull << 39)), KD_INDEX_NO_ID);
	/* a new range covering many small ones must be seen to overlap */
	ck_assert(kd_index_overlaps(&ix, 0, 1ull << 36, KD_INDEX_NO_ID));
	ck_assert(kd_index_overlaps(&ix, 0x100000000ull + 5 * 4096 + 17, 1, KD_INDEX_NO_ID));
	ck_assert(!kd_index_overlaps(&ix, 0, 0x100000000ull, KD_INDEX_NO_ID));
	/* remove every other one; the rest must still be found */
	for (id = 0; id < MAX_IDS - 1; id += 2)
		ck_assert_int_eq(kd_index_remove(&ix, id), 0);
	for (id = 0; id < MAX_IDS - 1; id++) {
		uint64_t a = 0x100000000ull + id * 4096ull + 100;

		ck_assert_uint_eq(kd_index_lookup(&ix, a), id % 2 ? id : KD_INDEX_NO_ID);
	}
	kd_index_fini(&ix);
}
END_TEST

struct collect {
	uint32_t ids[16];
	int n;
};

static int collect_id(uint32_t id, void *p)
{
	struct collect *c = p;

	ck_assert_int_lt(c->n, 16);
	c->ids[c->n++] = id;
	return 0;
}

/* Aliased ranges (as host addresses of two memslots can be). */
START_TEST(aliases)
{
	struct kd_index ix;
	struct collect c = { .n = 0 };
	int i, seen_3 = 0, seen_4 = 0, seen_5 = 0;

	kd_index_init(&ix);
	ck_assert_int_eq(kd_index_insert(&ix, 3, 0x10000, 0x4000), 0);
	ck_assert_int_eq(kd_index_insert(&ix, 4, 0x10000, 0x4000), 0);
	ck_assert_int_eq(kd_index_insert(&ix, 5, 0x8000, 0x100000), 0);
	kd_index_for_each_at(&ix, 0x12000, collect_id, &c);
	for (i = 0; i < c.n; i++) {
		seen_3 += c.ids[i] == 3;
		seen_4 += c.ids[i] == 4;
		seen_5 += c.ids[i] == 5;
	}
	expect(c.n == 3 && seen_3 == 1 && seen_4 == 1 && seen_5 == 1, "visited %d ids", c.n);
	c.n = 0;
	kd_index_for_each_at(&ix, 0x9000, collect_id, &c);
	expect(c.n == 1 && c.ids[0] == 5, "visited %d ids", c.n);
	ck_assert_uint_ne(kd_index_lookup(&ix, 0x13fff), KD_INDEX_NO_ID);
	kd_index_fini(&ix);
}
END_TEST

static int count_id(uint32_t id, void *p)
{
	uint32_t *seen = p;

	seen[id]++;
	return 0;
}

/* Many identical ranges (every memslot aliasing one host page), churned. */
START_TEST(identical_ranges)
{
	static uint32_t seen[4096];
	struct kd_index ix;
	uint32_t id, round;

	kd_index_init(&ix);
	for (round = 0; round < 3; round++) {
		for (id = 0; id < 4096; id++)
			ck_assert_int_eq(kd_index_insert(&ix, id, 0x7f0000001000ull, 4096), 0);
		memset(seen, 0, sizeof(seen));
		kd_index_for_each_at(&ix, 0x7f0000001800ull, count_id, seen);
		for (id = 0; id < 4096; id++)
			expect(seen[id] == 1, "id %u visited %u times", id, seen[id]);
		ck_assert_uint_lt(kd_index_lookup(&ix, 0x7f0000001fffull), 4096);
		ck_assert_uint_eq(kd_index_lookup(&ix, 0x7f0000002000ull), KD_INDEX_NO_ID);
		for (id = 0; id < 4096; id += 1 + round)
			ck_assert_int_eq(kd_index_remove(&ix, id), 0);
		for (id = 0; id < 4096; id++)
			if (kd_index_range(&ix, id))
				ck_assert_int_eq(kd_index_remove(&ix, id), 0);
		ck_assert_uint_eq(kd_index_lookup(&ix, 0x7f0000001000ull), KD_INDEX_NO_ID);
		ck_assert_uint_eq(ix.nr_ranges, 0);
	}
	kd_index_fini(&ix);
}
END_TEST

START_TEST(bad_input)
{
	struct kd_index ix;

	kd_index_init(&ix);
	ck_assert_uint_eq(kd_index_lookup(&ix, 0), KD_INDEX_NO_ID);
	ck_assert(!kd_index_overlaps(&ix, 0, 100, KD_INDEX_NO_ID));
	ck_assert_int_eq(kd_index_insert(&ix, 1, 100, 0), -EINVAL);
	ck_assert_int_eq(kd_index_insert(&ix, 1, UINT64_MAX - 10, 100), -EINVAL);
	ck_assert_int_eq(kd_index_insert(&ix, 1, UINT64_MAX - 99, 100), -EINVAL);
	ck_assert_int_eq(kd_index_insert(&ix, KD_INDEX_MAX_ID + 1, 0, 100), -EINVAL);
	ck_assert_int_eq(kd_index_insert(&ix, 1, 0, 100), 0);
	ck_assert_int_eq(kd_index_insert(&ix, 1, 1000, 100), -EEXIST);
	ck_assert_uint_eq(kd_index_lookup(&ix, 1000), KD_INDEX_NO_ID);
	ck_assert_int_eq(kd_index_remove(&ix, 2), -ENOENT);
	ck_assert_int_eq(kd_index_remove(&ix, 1), 0);
	ck_assert_int_eq(kd_index_remove(&ix, 1), -ENOENT);
	ck_assert_uint_eq(kd_index_lookup(&ix, 50), KD_INDEX_NO_ID);
	/* the top of the address space */
	ck_assert_int_eq(kd_index_insert(&ix, 7, UINT64_MAX - 4095, 4095), 0);
	ck_assert_uint_eq(kd_index_lookup(&ix, UINT64_MAX - 1), 7);
	ck_assert_uint_eq(kd_index_lookup(&ix, UINT64_MAX), KD_INDEX_NO_ID);
	ck_assert(kd_index_overlaps(&ix, UINT64_MAX - 10, 5, KD_INDEX_NO_ID));
	kd_index_fini(&ix);
}
END_TEST

/*
 * The set of pages kvmdirty_vcpu_count() counts with: against a plain
 * bitmap of the same (slot, page) pairs, through many growths, each pair
 * added several times, neighbours and far slots that share low bits.
 */
START_TEST(pageset_distinct)
{
	enum { SLOTS = 4, PAGES = 1 << 16 };
	static const uint32_t slots[SLOTS] = { 0, 1, 1u << 16 | 1, 32763 };
	static uint8_t ref[SLOTS][PAGES];
	uint64_t x = 99, n = 0, i, wrong = 0, bad_i = 0;
	struct kd_pageset s;

	memset(ref, 0, sizeof(ref));
	ck_assert_int_eq(kd_pageset_init(&s, 0), 0);
	for (i = 0; i < 400000; i++) {
		unsigned int k = (unsigned int)(xorshift64(&x) % SLOTS);
		/* pages clustered low (rewritten often) and spread high, the top of the 40 bits too */
		uint64_t p = xorshift64(&x) % (i & 1 ? 4096 : PAGES);
		uint64_t page = p == PAGES - 1 ? (1ull << 40) - 1 : p;
		uint64_t slot_page = p;
		bool added = kd_pageset_add(&s, slots[k], page), fresh = !ref[k][slot_page];

		ref[k][slot_page] = 1;
		n += fresh;
		if (added != fresh && !wrong++)
			bad_i = i;
	}
	ck_assert_msg(!wrong, "%" PRIu64 " adds answered wrongly, the first at %" PRIu64, wrong, bad_i);
	ck_assert_uint_eq(s.n, n);
	ck_assert(!s.failed);
	ck_assert_uint_ge(s.cap, 2 * s.n);
	kd_pageset_fini(&s);
	/* sized ahead: no growth needed for what it was sized for */
	ck_assert_int_eq(kd_pageset_init(&s, 5000), 0);
	ck_assert_uint_ge(s.cap, 10000);
	kd_pageset_fini(&s);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("index");
	TCase *tc = tcase_create("index");

	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, bad_input);
	tcase_add_test(tc, aliases);
	tcase_add_test(tc, identical_ranges);
	tcase_add_test(tc, many_neighbours);
	tcase_add_test(tc, random_small);
	tcase_add_test(tc, random_medium);
	tcase_add_test(tc, random_large);
	tcase_add_test(tc, pageset_distinct);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
