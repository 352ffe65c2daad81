/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_SNAPCMD_H
#define KVMDIRTY_MIGRATE_SNAPCMD_H

/*
 * kvmdirty-migrate snapshot and restore (kvmdirty-migrate(1)):
 *
 *   snapshot -o PREFIX [guest options] [--every MS] [--count N]
 *       count snapshots of the running test guest, every MS from the
 *       start of the one before: PREFIX-000000.snap full, then diffs.  A
 *       line each (mig_snap_line()); a failed one is said on stderr, leaves
 *       nothing, and the next takes its number.  1 if any failed.
 *   restore FILE... [--run-ms MS] [--check]
 *       a chain, base first, into a new test guest, checked and verified
 *       (kvmdirty_mig_restore()), which then runs MS and checks itself.  0 when it
 *       ran and passed, 1 refused or failed (one line naming the file),
 *       2 a bad command line, 77 no KVM here.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include <kvmdirty-migrate.h>

#include "testguest.h"

#define MIG_SNAP_PATH_MAX 4096 /* a snapshot file's path, at most (with its NUL) */

/*
 * -o PREFIX before a guest is built: its directory exists and is one, and
 * its first file (PREFIX-000000.snap) does not exist.  0, or -errno with a
 * line in err naming it.
 */
int mig_snap_prefix_check(const char *prefix, char *err, size_t len);
/* "snapshot kind=... seq=... pause_ms=... fsync_ms=... write_mibps=..." on out. */
void mig_snap_line(FILE *out, const struct kvmdirty_mig_snap_result *r, uint64_t alloc_bytes);
/* Bytes allocated to path (st_blocks), 0 where it cannot be read. */
uint64_t mig_snap_allocated(const char *path);
/* The snapshot loop above, for a guest whose vCPUs run. */
int mig_snap_run(struct kvmdirty_mig_guest *g, const char *prefix, uint64_t every_ms, uint64_t count, bool throttle);
/* kvmdirty-migrate restore: its exit status. */
int mig_snap_restore_cmd(int argc, char **argv);

#endif
