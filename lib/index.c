// SPDX-License-Identifier: MIT
/* Hashed range index; see index.h for the scheme. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "index.h"

#define MIN_TAB_BITS 6
#define TOMB 1u

/*
 * entry: [31:16] id + 1, [15:0] tag; 0 is empty, TOMB a deleted entry.
 * Deletion leaves a tombstone instead of shifting the chain: entries carry
 * no key to rehash, many identical ranges (aliased host memory) make
 * chains of any length, and removal must never allocate or fail.
 * Tombstones go when the table is rebuilt from the range array.
 */
/*
 * The gpa index is edited by a region move while marks read it (regions.h:
 * the move's sequence count makes them retry): every word a lookup reads
 * and an insert or remove writes goes through these, relaxed (plain moves
 * on x86).
 */
#define LD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define ST(x, v) __atomic_store_n(&(x), (v), __ATOMIC_RELAXED)

static inline uint32_t ent_make(uint32_t id, uint32_t tag)
{
	return ((id + 1) << 16) | tag;
}
static inline bool ent_live(uint32_t e) { return e >> 16; }
static inline uint32_t ent_id(uint32_t e) { return (e >> 16) - 1; }
static inline uint32_t ent_tag(uint32_t e) { return e & 0xffff; }

static inline unsigned int level_of(uint64_t len)
{
	unsigned int l = 63 - __builtin_clzll(len);

	return l - l % KD_INDEX_LEVEL_STEP;
}

/*
 * Fibonacci hashing of (level, block); the level is mixed in so that the
 * same block number at two levels lands apart.  The slot comes from the top
 * bits, the tag from the bits just below them.
 */
static inline uint64_t hash_key(uint64_t block, unsigned int level)
{
	return (block ^ ((uint64_t)level << 57) ^ ((uint64_t)level * 0x2545f4914f6cdd1dull)) *
	       0x9e3779b97f4a7c15ull;
}
static inline uint32_t hash_pos(uint64_t h, uint32_t bits) { return (uint32_t)(h >> (64 - bits)); }
static inline uint32_t hash_tag(uint64_t h, uint32_t bits) { return (uint32_t)(h >> (48 - bits)) & 0xffff; }

void kd_index_init(struct kd_index *ix)
{
	memset(ix, 0, sizeof(*ix));
}

void kd_index_reclaim(struct kd_index *ix)
{
	struct kd_index_tab *t = ix->retired, *next;

	for (; t; t = next) {
		next = t->retired;
		free(t);
	}
	ix->retired = NULL;
	ix->nr_retired = 0;
}

void kd_index_fini(struct kd_index *ix)
{
	kd_index_reclaim(ix);
	free(ix->tab);
	free(ix->ranges);
	kd_index_init(ix);
}

static void tab_put(struct kd_index_tab *tab, uint32_t id, uint64_t block, unsigned int level)
{
	uint64_t h = hash_key(block, level);
	uint32_t bits = tab->bits, mask = (1u << bits) - 1, pos = hash_pos(h, bits);

	while (tab->e[pos])
		pos = (pos + 1) & mask;
	ST(tab->e[pos], ent_make(id, hash_tag(h, bits)));
}

static void tab_del(struct kd_index_tab *tab, uint32_t id, uint64_t block, unsigned int level)
{
	uint64_t h = hash_key(block, level);
	uint32_t bits = tab->bits, mask = (1u << bits) - 1, pos = hash_pos(h, bits), tag = hash_tag(h, bits), e;

	/*
	 * Several blocks of one range may share a tag and a chain; deleting
	 * any of them first is fine since all of them are deleted together.
	 */
	for (; (e = tab->e[pos]) != 0; pos = (pos + 1) & mask) {
		if (ent_live(e) && ent_id(e) == id && ent_tag(e) == tag) {
			ST(tab->e[pos], TOMB);
			return;
		}
	}
}

static inline unsigned int range_level(const struct kd_index_range *r)
{
	return level_of(r->end - r->start);
}

static uint32_t range_blocks(const struct kd_index_range *r)
{
	unsigned int level = range_level(r);

	return (uint32_t)(((r->end - 1) >> level) - (r->start >> level) + 1);
}

static void range_put(struct kd_index_tab *tab, uint32_t id, const struct kd_index_range *r)
{
	unsigned int level = range_level(r);
	uint64_t b = r->start >> level;
	uint32_t i, n = range_blocks(r);

	for (i = 0; i < n; i++)
		tab_put(tab, id, b + i, level);
}

static void range_del(struct kd_index_tab *tab, uint32_t id, const struct kd_index_range *r)
{
	unsigned int level = range_level(r);
	uint64_t b = r->start >> level;
	uint32_t i, n = range_blocks(r);

	for (i = 0; i < n; i++)
		tab_del(tab, id, b + i, level);
}

/* Rebuild the table from the used ranges, without tombstones; the old one is retired (see index.h). */
static int rebuild(struct kd_index *ix, uint32_t bits)
{
	struct kd_index_tab *tab = calloc(1, sizeof(*tab) + ((size_t)1 << bits) * sizeof(tab->e[0]));
	uint32_t id;

	if (!tab)
		return -ENOMEM;
	tab->bits = bits;
	for (id = 0; id < ix->ranges_cap; id++)
		if (ix->ranges[id].end)
			range_put(tab, id, &ix->ranges[id]);
	if (ix->tab) {
		ix->tab->retired = ix->retired;
		ix->retired = ix->tab;
		ix->nr_retired++;
	}
	/* whole before it is seen */
	__atomic_store_n(&ix->tab, tab, __ATOMIC_RELEASE);
	ix->nr_tombs = 0;
	return 0;
}

int kd_index_reserve(struct kd_index *ix, uint32_t extra)
{
	uint64_t used = (uint64_t)ix->nr_entries + ix->nr_tombs + extra;
	uint32_t bits = MIN_TAB_BITS;

	/*
	 * Live entries and tombstones fill at most half the table: misses
	 * probe to an empty entry, and at 3/4 they cost twice as much.
	 */
	if (ix->tab && used * 2 <= 1ull << ix->tab->bits)
		return 0;
	while (((uint64_t)ix->nr_entries + extra) * 2 > (1ull << bits))
		bits++;
	if (bits > 30)
		return -ENOMEM;
	return rebuild(ix, bits);
}

static void update_order(struct kd_index *ix)
{
	unsigned int l, i, n = 0;

	for (l = 0; l < 64; l++) {
		if (!ix->level_count[l])
			continue;
		for (i = n; i > 0 && ix->level_count[ix->order[i - 1]] < ix->level_count[l]; i--)
			ST(ix->order[i], ix->order[i - 1]);
		ST(ix->order[i], (uint8_t)l);
		n++;
	}
	ST(ix->nr_levels, (uint8_t)n);
}

static int grow_ranges(struct kd_index *ix, uint32_t id)
{
	uint32_t cap = ix->ranges_cap ? ix->ranges_cap : 16;
	struct kd_index_range *r;

	while (cap <= id)
		cap *= 2;
	if (cap > KD_INDEX_MAX_ID + 1)
		cap = KD_INDEX_MAX_ID + 1;
	r = realloc(ix->ranges, cap * sizeof(*r));
	if (!r)
		return -ENOMEM;
	memset(r + ix->ranges_cap, 0, (cap - ix->ranges_cap) * sizeof(*r));
	ix->ranges = r;
	ix->ranges_cap = cap;
	return 0;
}

uint32_t kd_index_blocks(uint64_t start, uint64_t len)
{
	struct kd_index_range r = { .start = start, .end = start + len };

	return range_blocks(&r);
}

static int check_range(uint64_t start, uint64_t len)
{
	return !len || start + len < start || start + len == 0 ? -EINVAL : 0;
}

int kd_index_insert(struct kd_index *ix, uint32_t id, uint64_t start, uint64_t len)
{
	struct kd_index_range *r;
	int ret;

	if (check_range(start, len) || id > KD_INDEX_MAX_ID)
		return -EINVAL;
	if (id < ix->ranges_cap && ix->ranges[id].end)
		return -EEXIST;
	if (id >= ix->ranges_cap) {
		ret = grow_ranges(ix, id);
		if (ret)
			return ret;
	}
	ret = kd_index_reserve(ix, kd_index_blocks(start, len));
	if (ret)
		return ret;
	r = &ix->ranges[id];
	ST(r->start, start);
	ST(r->end, start + len);
	range_put(ix->tab, id, r);
	ix->nr_entries += range_blocks(r);
	ix->nr_ranges++;
	ix->level_count[range_level(r)]++;
	update_order(ix);
	return 0;
}

int kd_index_remove(struct kd_index *ix, uint32_t id)
{
	struct kd_index_range *r;

	if (id >= ix->ranges_cap || !ix->ranges[id].end)
		return -ENOENT;
	r = &ix->ranges[id];
	range_del(ix->tab, id, r);
	ix->nr_entries -= range_blocks(r);
	ix->nr_tombs += range_blocks(r);
	ix->nr_ranges--;
	ix->level_count[range_level(r)]--;
	ST(r->end, 0);
	update_order(ix);
	return 0;
}

uint32_t kd_index_lookup(const struct kd_index *ix, uint64_t addr)
{
	const struct kd_index_tab *tab = __atomic_load_n(&ix->tab, __ATOMIC_ACQUIRE);
	uint32_t bits = tab ? tab->bits : 0, mask = (1u << bits) - 1;
	unsigned int i, n = tab ? LD(ix->nr_levels) : 0;

	for (i = 0; i < n && i < 64; i++) {
		unsigned int level = LD(ix->order[i]);
		uint64_t h = hash_key(addr >> level, level);
		uint32_t pos = hash_pos(h, bits), tag = hash_tag(h, bits), e;

		for (; (e = LD(tab->e[pos])) != 0; pos = (pos + 1) & mask) {
			const struct kd_index_range *r;
			uint64_t start, end;

			if (!ent_live(e) || ent_tag(e) != tag)
				continue;
			r = &ix->ranges[ent_id(e)];
			start = LD(r->start);
			end = LD(r->end);
			if (addr - start < end - start)
				return ent_id(e);
		}
	}
	return KD_INDEX_NO_ID;
}

static bool range_overlaps(const struct kd_index_range *r, uint64_t first, uint64_t last)
{
	return r->end && r->start <= last && r->end - 1 >= first;
}

bool kd_index_overlaps(const struct kd_index *ix, uint64_t start, uint64_t len, uint32_t skip_id)
{
	const struct kd_index_tab *tab = ix->tab;
	uint32_t bits = tab ? tab->bits : 0, mask = (1u << bits) - 1, id;
	uint64_t first = start, last = start + len - 1, probes = 0;
	unsigned int i;

	if (!len || !ix->nr_ranges)
		return false;
	if (last < first)
		last = UINT64_MAX;
	/*
	 * Probing every block of the query at every level costs the query's
	 * length over the level's block size; when that exceeds the number
	 * of ranges, comparing against each range is cheaper.
	 */
	for (i = 0; i < ix->nr_levels; i++) {
		unsigned int level = ix->order[i];
		uint64_t n = (last >> level) - (first >> level);

		if (n >= ix->nr_ranges || (probes += n + 1) > ix->nr_ranges) {
			for (id = 0; id < ix->ranges_cap; id++)
				if (id != skip_id && range_overlaps(&ix->ranges[id], first, last))
					return true;
			return false;
		}
	}
	for (i = 0; i < ix->nr_levels; i++) {
		unsigned int level = ix->order[i];
		uint64_t b;

		for (b = first >> level; b <= last >> level; b++) {
			uint64_t h = hash_key(b, level);
			uint32_t pos = hash_pos(h, bits), tag = hash_tag(h, bits), e;

			for (; (e = tab->e[pos]) != 0; pos = (pos + 1) & mask)
				if (ent_live(e) && ent_tag(e) == tag && ent_id(e) != skip_id &&
				    range_overlaps(&ix->ranges[ent_id(e)], first, last))
					return true;
			if (b == UINT64_MAX >> level)
				break;
		}
	}
	return false;
}

int kd_index_for_each_at(const struct kd_index *ix, uint64_t addr,
			 int (*fn)(uint32_t id, void *ctx), void *ctx)
{
	const struct kd_index_tab *tab = ix->tab;
	uint32_t bits = tab ? tab->bits : 0, mask = (1u << bits) - 1;
	unsigned int i;
	int ret;

	for (i = 0; tab && i < ix->nr_levels; i++) {
		unsigned int level = ix->order[i];
		uint64_t h = hash_key(addr >> level, level);
		uint32_t home = hash_pos(h, bits), tag = hash_tag(h, bits), pos, p, e;

		for (pos = home; (e = tab->e[pos]) != 0; pos = (pos + 1) & mask) {
			const struct kd_index_range *r;
			bool seen = false;

			if (!ent_live(e) || ent_tag(e) != tag)
				continue;
			r = &ix->ranges[ent_id(e)];
			if (addr - r->start >= r->end - r->start)
				continue;
			/* another block of the same range may share this chain and tag */
			for (p = home; p != pos && !seen; p = (p + 1) & mask)
				seen = ent_live(tab->e[p]) && ent_id(tab->e[p]) == ent_id(e) &&
				       ent_tag(tab->e[p]) == tag;
			if (seen)
				continue;
			ret = fn(ent_id(e), ctx);
			if (ret)
				return ret;
		}
	}
	return 0;
}
