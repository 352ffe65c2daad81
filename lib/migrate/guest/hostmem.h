/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_HOSTMEM_H
#define KVMDIRTY_MIGRATE_HOSTMEM_H

/*
 * What the host's page tables say of this process's memory, so that the
 * source sends memory the guest never touched without reading it (a read
 * would fault every such page in: about a microsecond each, and the zero
 * page mapped where nothing was).
 *
 * A page is untouched when /proc/self/pagemap has it neither present nor
 * swapped AND it lies in a private anonymous mapping: only there does a
 * page that was never faulted in read as zeroes.  A file-backed or shared
 * mapping (a memfd, shmem, hugetlbfs) holds data in the page cache that
 * this process's page tables need not show, and a swapped-out or migrating
 * page has its swap bit set: both are read.  mincore() alone cannot tell
 * these apart and would send such pages as zeroes.
 *
 * The answer holds only while nothing can fault the page in unseen: ask
 * after the page is write-protected for dirty tracking (after
 * kvmdirty_tracker_next() handed it out), so a guest write that faults it
 * in afterwards is reported by a later sync.  The source reads the
 * mappings once, when a migration starts: a VMM must not replace guest
 * memory's mapping (mmap over it, mremap) during a migration.
 * Userfaultfd-registered memory is not supported.
 */
#include <stdbool.h>
#include <stdint.h>

#define MIG_PM_PRESENT (1ull << 63)
#define MIG_PM_SWAPPED (1ull << 62)

/* True if a pagemap entry says the page was never faulted in (in private anonymous memory: zero). */
static inline bool mig_pm_untouched(uint64_t entry)
{
	return !(entry & (MIG_PM_PRESENT | MIG_PM_SWAPPED));
}

/*
 * 1 if [hva, hva + size) lies wholly in private anonymous mappings of
 * this process (read from /proc/self/maps), 0 if any of it does not (or
 * is unmapped), -errno if the maps cannot be read.
 */
int mig_hostmem_private_anon(const void *hva, uint64_t size);

/*
 * The same for n ranges at once, from one read of the maps (a guest of
 * thousands of regions would read them thousands of times): ret_anon[i]
 * for [hva[i], hva[i] + size[i]).  0, or -errno (-ENOMEM; the maps
 * unreadable), ret_anon then all false.
 */
int mig_hostmem_private_anon_n(void *const *hva, const uint64_t *size, unsigned int n, bool *ret_anon);

/*
 * Open /proc/self/pagemap now and keep it for mig_pagemap_open(), in a
 * process that is about to make itself not dumpable (keyfile.h): /proc/self
 * then belongs to root, and a process that is not root can no longer open
 * the file (mode 0400).  Call it before any thread starts.  0, or -errno
 * (mig_pagemap_open() then opens the file as before).
 */
int mig_pagemap_keep(void);

/*
 * /proc/self/pagemap, open for reading (a copy of the fd kept, in the
 * process that kept it): an fd, or -errno.
 */
int mig_pagemap_open(void);

/*
 * The pagemap entries of n pages (4 KiB) from page-aligned hva into
 * ret_entries[0 .. n).  0 or -errno.
 */
int mig_pagemap_read(int fd, const void *hva, uint64_t n, uint64_t *ret_entries);

#define MIG_PM_BATCH 4096 /* pagemap entries read at once (32 KiB) */

/*
 * The one page walk that sorts touched pages from pages never touched
 * (the source's sender and the snapshot writer both go through it): n
 * pages from page-aligned hva, in runs of at most MIG_PM_BATCH pages all
 * touched or all never touched, fn(ctx, first, count, untouched) for
 * each in order (first: from hva, in pages).  Where the host cannot say
 * (anon false: not wholly private anonymous memory; pagemap < 0; a read
 * that fails) every page counts as touched.  pme: scratch of MIG_PM_BATCH
 * entries.  0, or fn's first negative return.  Read after the pages were
 * handed out (write-protected): a page faulted in later is reported by a
 * later sync.
 */
int mig_walk_touched(int pagemap, bool anon, const void *hva, uint64_t n, uint64_t *pme,
		     int (*fn)(void *ctx, uint64_t first, uint64_t count, bool untouched), void *ctx);

#endif
