/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_INDEX_H
#define KVMDIRTY_INDEX_H

/*
 * Hashed range index: maps an address to the id of a range containing it, in
 * O(1) whatever the number of ranges.  Pure data structure: no KVM, no fds.
 *
 * A range of length len belongs to the size class L = floor(log2(len))
 * rounded down to a multiple of KD_INDEX_LEVEL_STEP.  Its length is below
 * 2^(L + STEP), so it overlaps at most 2^STEP + 1 aligned blocks of 2^L
 * bytes; it is entered in the hash table once for each of them, keyed by
 * (L, block number).  A lookup hashes (L, addr >> L) for each size class in
 * use (a handful in a real VM, independent of the range count), most
 * populated class first, and checks the candidates' bounds.
 *
 * Table entries are 32 bits (id and a 16-bit tag of the key), so the table
 * for 32,764 ranges stays small enough for the L2 cache.  The table is
 * derived state: it can always be rebuilt from the range array, which is
 * what growth and tombstone clean-up do.
 *
 * Ranges may overlap (host addresses of two memslots may alias); a lookup
 * then returns one of them and kd_index_for_each_at() visits all.
 */

#include <stdbool.h>
#include <stdint.h>

#define KD_INDEX_LEVEL_STEP 3
#define KD_INDEX_MAX_ID 65534u
#define KD_INDEX_NO_ID UINT32_MAX

/*
 * 16 bytes, so that a lookup's bounds check touches one cache line: the
 * size class is recomputed from the length, and end == 0 marks a free id
 * (a range never ends at 0: it cannot wrap).
 */
struct kd_index_range {
	uint64_t start;
	uint64_t end; /* exclusive */
};

/*
 * The hash table, with its size: one pointer that a growth or a clean-up
 * replaces whole, so that a reader that loaded it reads a table and its
 * size that agree.  A replaced table is retired, not freed: a reader that
 * takes no lock (a mark during a region move, regions.h) may still be in
 * it; its owner frees retired tables with kd_index_reclaim() once no
 * reader can be.
 */
struct kd_index_tab {
	struct kd_index_tab *retired; /* the next older retired table */
	uint32_t bits;
	uint32_t e[];
};

struct kd_index {
	struct kd_index_tab *tab;
	struct kd_index_tab *retired;
	uint32_t nr_retired;
	uint32_t nr_entries; /* live */
	uint32_t nr_tombs;
	uint32_t nr_ranges;
	struct kd_index_range *ranges; /* indexed by id */
	uint32_t ranges_cap;
	uint32_t level_count[64];
	/* levels in use, most populated first */
	uint8_t order[64];
	uint8_t nr_levels;
};

void kd_index_init(struct kd_index *ix);
void kd_index_fini(struct kd_index *ix);

/*
 * Add range [start, start + len) under id.  len > 0, start + len must not
 * wrap, id <= KD_INDEX_MAX_ID and not in use.  Returns 0, -EINVAL, -EEXIST
 * (id in use) or -ENOMEM; on error the index is unchanged.
 */
int kd_index_insert(struct kd_index *ix, uint32_t id, uint64_t start, uint64_t len);

/* Remove id; returns 0 or -ENOENT.  Never allocates, never fails otherwise. */
int kd_index_remove(struct kd_index *ix, uint32_t id);

/*
 * Make room so that inserts and removes adding up to extra table entries
 * (kd_index_blocks() of each range inserted or removed) cannot allocate:
 * a caller that must undo a change reserves for the undo first.  0 or
 * -ENOMEM (index unchanged).
 */
int kd_index_reserve(struct kd_index *ix, uint32_t extra);
/* Free the tables growth and clean-ups retired: when no reader that takes no lock can be in them. */
void kd_index_reclaim(struct kd_index *ix);
uint32_t kd_index_blocks(uint64_t start, uint64_t len);

/* Id of a range containing addr, or KD_INDEX_NO_ID. */
uint32_t kd_index_lookup(const struct kd_index *ix, uint64_t addr);

/* True if any range but skip_id (KD_INDEX_NO_ID: none) overlaps [start, start + len). */
bool kd_index_overlaps(const struct kd_index *ix, uint64_t start, uint64_t len, uint32_t skip_id);

/*
 * Call fn(id, ctx) for every range containing addr, each once, in no
 * particular order; stops early and returns fn's value if it is non-zero.
 */
int kd_index_for_each_at(const struct kd_index *ix, uint64_t addr,
			 int (*fn)(uint32_t id, void *ctx), void *ctx);

static inline const struct kd_index_range *
kd_index_range(const struct kd_index *ix, uint32_t id)
{
	if (id >= ix->ranges_cap || !ix->ranges[id].end)
		return 0;
	return &ix->ranges[id];
}

#endif
