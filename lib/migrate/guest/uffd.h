/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_UFFD_H
#define KVMDIRTY_MIGRATE_UFFD_H

/*
 * Guest memory served by userfaultfd (the lazy restore, post-copy's
 * destination): the descriptor, a region registered for missing pages,
 * pages placed.  The callers keep which pages are in place.
 */
#include <stddef.h>
#include <stdint.h>

/*
 * A userfaultfd (close-on-exec, non-blocking), its API agreed: the fd, or
 * -errno with one line in err (-EPERM: no CAP_SYS_PTRACE where
 * vm.unprivileged_userfaultfd is 0, or a seccomp filter; -ENOSYS: none in
 * this kernel).
 */
int mig_uffd_open(char *err, size_t len);

/*
 * Register [hva, hva + size) of region r (gpa, for the message) for
 * missing pages: 0, or -errno with one line in err; -EOPNOTSUPP where
 * 4 KiB pages and zero pages cannot both be placed there (huge pages).
 */
int mig_uffd_register(int uffd, void *hva, uint64_t size, uint32_t r, uint64_t gpa, char *err, size_t len);

/* Unregister the range: its missing pages fault as ordinary memory from now on. */
void mig_uffd_unregister(int uffd, void *hva, uint64_t size);

/*
 * Place len bytes at dst (page-aligned, missing) from src, or zero pages
 * where src is NULL, waking whoever waits on them.  Returns the bytes
 * placed from dst on (a multiple of the page), or -EEXIST when dst's
 * first page was there already (its waiters woken all the same), or
 * another -errno of the kernel.  EAGAIN (the mapping changing) is retried.
 */
int64_t mig_uffd_place(int uffd, void *dst, const void *src, uint64_t len);

/* Whoever waits on [dst, dst + len) runs again. */
void mig_uffd_wake(int uffd, void *dst, uint64_t len);

#endif
