/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_SNAPFILE_H
#define KVMDIRTY_MIGRATE_SNAPFILE_H

/*
 * Snapshot files, version 2: the one writer and reader of them (the
 * snapshot engine, restore, the tests).  Byte by byte in
 * kvmdirty-snapshot(5); in short (integers little-endian):
 *
 *   0           header: struct snap_header, the region table (struct
 *               snap_region[nr_regions]), the vCPU table (nr_vcpus
 *               struct mig_vcpu_state) and the VM's state (struct
 *               mig_vm_state); header_len bytes in all
 *   data_off    the page area: region r's page p at regions[r].data_off +
 *               p * 4096, every region starting on a 2 MiB boundary.  Only
 *               the pages the file holds as data are written; every other
 *               page of the area is a hole, never written, never read
 *   index_off   the index: struct snap_run[nr_runs] (sorted by region and
 *               page, disjoint), then one mig_page_hash() a DATA page, in
 *               run order
 *   + index_len the devices' state, dev_len bytes (SHA-256 dev_sha)
 *   file end    struct snap_trailer, written last: a file cut short has
 *               none, and is never taken for a snapshot
 *
 * A full snapshot (seq 0) holds every page that is not zero; a diff
 * (seq n) holds, as DATA or ZERO runs, every page written since its
 * parent (seq n - 1), which it names by identity: the SHA-256 of the
 * parent's header, which covers its index's SHA-256, which covers every
 * page hash.  A page a file does not list is zero (full) or as in the
 * parent (diff).  The layout serves a lazy restore too: a page's place in
 * each file is a function of its region and number, its hash is in the
 * index, and the newest file listing it holds its copy.
 *
 * Files are written to a temporary name beside the final one, synced,
 * renamed without replacing anything, and the directory synced: a name
 * of the final form is always a whole file.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "stream.h"

#define SNAP_MAGIC	   "KVMDSNAP"
#define SNAP_TRAILER_MAGIC "KVMDSEND"
#define SNAP_VERSION	   2 /* 1: a vCPU's registers, XSAVE and TSC only (stream version 3's VCPU record) */
#define SNAP_PAGE	   4096u
#define SNAP_ALIGN	   (2ull << 20) /* each region's pages start on a 2 MiB boundary of the file */
#define SNAP_MAX_REGIONS   MIG_MAX_REGIONS
#define SNAP_MAX_VCPUS	   MIG_MAX_VCPUS
#define SNAP_ID		   32 /* SHA-256 */
#define SNAP_PATH_MAX	   4096

enum snap_kind {
	SNAP_FULL = 1,
	SNAP_DIFF = 2,
};

enum snap_run_kind {
	SNAP_RUN_DATA = 1, /* pages in the page area, a hash each in the index */
	SNAP_RUN_ZERO = 2, /* pages that are zero (diffs only): holes */
};

/*
 * header.flags: the devices' state comes in two parts, as a VMM with
 * devices_save_live gives it (guest.h): a little-endian u64, the first
 * part's length, that part, then the rest.  No other flag.
 */
#define SNAP_F_DEVICES_LIVE 1u

struct snap_header {
	char magic[8]; /* SNAP_MAGIC */
	uint32_t version;
	uint32_t page_size;
	uint32_t kind;	/* enum snap_kind */
	uint32_t flags; /* 0, or SNAP_F_DEVICES_LIVE */
	uint32_t nr_regions, nr_vcpus;
	uint32_t vcpu_state_size; /* sizeof(struct mig_vcpu_state) */
	uint32_t vm_state_size;	  /* sizeof(struct mig_vm_state) */
	uint64_t seq;	  /* 0: full; n: the nth diff of its chain */
	uint64_t time_ns; /* CLOCK_REALTIME when the file was finished */
	uint64_t header_len;
	uint64_t data_off, data_len;
	uint64_t index_off, index_len;
	uint64_t nr_runs, data_pages, zero_pages;
	uint8_t parent[SNAP_ID];    /* the parent's identity; zero in a full */
	uint8_t base[SNAP_ID];	    /* the chain's full snapshot's identity; zero in the full itself */
	uint8_t index_sha[SNAP_ID]; /* SHA-256 of the index */
	uint64_t dev_len;	    /* the devices' state, after the index (at most MIG_DEVICES_MAX) */
	uint8_t dev_sha[SNAP_ID];   /* SHA-256 of it */
};

struct snap_region {
	uint64_t gpa, size;
	uint64_t data_off; /* in the file */
	uint64_t reserved;
};

struct snap_run {
	uint32_t region;
	uint32_t kind; /* enum snap_run_kind */
	uint64_t first, count;
	uint64_t hash_first; /* DATA: its first page's hash in the index's hashes; ZERO: 0 */
};

struct snap_trailer {
	char magic[8]; /* SNAP_TRAILER_MAGIC */
	uint32_t version;
	uint32_t reserved0;
	uint64_t header_len;
	uint64_t index_off, index_len;
	uint64_t file_len;
	uint8_t id[SNAP_ID]; /* SHA-256 of the header: the file's identity */
	uint8_t reserved[16];
	uint8_t sha[SNAP_ID]; /* SHA-256 of the trailer's bytes before this field */
};

_Static_assert(sizeof(struct snap_header) == 256, "snapshot layout");
_Static_assert(sizeof(struct snap_region) == 32, "snapshot layout");
_Static_assert(sizeof(struct snap_run) == 32, "snapshot layout");
_Static_assert(sizeof(struct snap_trailer) == 128, "snapshot layout");

/* SHA-256 of p[0 .. n) (the files' identities and checksums). */
void snap_sha256(const void *p, size_t n, uint8_t out[SNAP_ID]);

/* The header's length and the page area's place for a layout (page-aligned; data_off on SNAP_ALIGN). */
uint64_t snap_header_len(uint32_t nr_regions, uint32_t nr_vcpus);

/* ---- writing ---- */

struct snap_writer;

struct snap_layout {
	uint32_t kind; /* enum snap_kind */
	uint64_t seq;
	const uint8_t *parent, *base; /* SNAP_ID bytes each; NULL for a full */
	uint32_t nr_regions, nr_vcpus;
	const uint64_t *gpa, *size; /* [nr_regions]: page-aligned, sizes non-zero */
};

/*
 * Begin the file path (its directory must exist; path must not): a
 * temporary file beside it (path.tmp.XXXXXX, unique), made here.  0, or -errno with the reason in
 * err naming path (-EEXIST where path exists, -EINVAL for a layout
 * outside the format's limits).
 */
int snap_writer_open(const char *path, const struct snap_layout *l, struct snap_writer **ret_w, char *err, size_t len);

/*
 * Pages [first, first + count) of region at hva, as they are now: hashed
 * and written where they belong, or noted as zero (a page of zeroes is a
 * hole).  A page put again replaces its earlier copy.  Pages known to be
 * zero without reading them: snap_writer_zero().  0 or -errno (err says
 * why, naming the file).  ret_bytes: bytes written.
 */
int snap_writer_put(struct snap_writer *w, uint32_t region, uint64_t first, uint64_t count, const void *hva,
		    uint64_t *ret_bytes, char *err, size_t len);
int snap_writer_zero(struct snap_writer *w, uint32_t region, uint64_t first, uint64_t count, char *err, size_t len);

/* Every vCPU's state (nr_vcpus of them, as the layout said), and the VM's, copied. */
void snap_writer_vcpus(struct snap_writer *w, const struct mig_vcpu_state *states, const struct mig_vm_state *vm);
/* The devices' state: len bytes (at most MIG_DEVICES_MAX) of dev, the writer's from now (it frees them). */
void snap_writer_devices(struct snap_writer *w, void *dev, size_t len);
/*
 * The devices' state in two parts (SNAP_F_DEVICES_LIVE): live and rest,
 * each malloc()ed or NULL, the writer's from here on.  0, or -ENOMEM
 * (both freed, nothing set).
 */
int snap_writer_devices_parts(struct snap_writer *w, void *live, size_t live_len, void *rest, size_t rest_len);

/*
 * Finish: the index, the header, the trailer, fsync, the rename to the
 * final name (never over an existing file), the directory's fsync.  The
 * writer is freed either way; on failure the temporary file is removed.
 * ret_id: the file's identity (for its child's parent); ret_stats (may be
 * NULL): what it holds.  0 or -errno with err naming the file.
 */
struct snap_written {
	uint64_t data_pages, zero_pages, file_len, tables_bytes; /* tables: header, index, trailer */
};
int snap_writer_commit(struct snap_writer *w, uint8_t ret_id[SNAP_ID], struct snap_written *ret_stats, char *err,
		       size_t len);
/* Give up: the temporary file removed, the writer freed; nothing else changed.  NULL is ignored. */
void snap_writer_abandon(struct snap_writer *w);

/*
 * Tests only: the write call the writer uses (pwrite(2) unless set), so
 * a test can fail the nth write.  Not for threads that write at once.
 */
extern ssize_t (*snap_pwrite)(int fd, const void *buf, size_t n, off_t off);

/* ---- reading ---- */

struct snap_file {
	char path[SNAP_PATH_MAX];
	int fd;
	uint64_t size;
	uint8_t id[SNAP_ID];
	struct snap_header h;
	struct snap_region *regions;  /* [h.nr_regions] */
	struct mig_vcpu_state *vcpus; /* [h.nr_vcpus] */
	struct mig_vm_state *vm;
	void *dev; /* h.dev_len bytes, checked against h.dev_sha */
	/* ... in its parts: what the VMM gave as its live part (SNAP_F_DEVICES_LIVE; else none), and the rest */
	const uint8_t *dev_live, *dev_rest;
	uint64_t dev_live_len, dev_rest_len;
	struct snap_run *runs;	      /* [h.nr_runs] */
	uint64_t *hashes;	      /* [h.data_pages] */
};

/*
 * Open a snapshot file and check that it adds up, all but its pages: the
 * trailer (present, whole, its checksum), the header against the
 * trailer's hash, every field of it, the region and vCPU tables, the
 * index against its hash and the regions (read in pieces and checked
 * before it is read whole, so what is allocated is bounded by an index
 * that adds up), and that the page area holds data only where the index
 * lists DATA pages: bytes the file system reports as data elsewhere (no
 * holes, or blocks larger than a page) are read and must be zero.  0, or -errno with a
 * one-line reason naming the file and the part (-EPROTO: not a snapshot
 * of this version, or damaged).
 */
int snap_file_open(const char *path, struct snap_file **ret_f, char *err, size_t len);
void snap_file_close(struct snap_file *f);

/*
 * A chain, base first: a full snapshot, then each diff the child of the
 * file before it (by identity), of the same chain, with the next number,
 * the same regions and vCPU count.  0, or -EPROTO naming the file that
 * does not fit and why.
 */
int snap_chain_check(struct snap_file *const *files, unsigned int n, char *err, size_t len);

/*
 * Load a checked chain into memory that is all zero now (fresh anonymous
 * memory): hva[r] for region r of the files' table.  Each page from the
 * newest file listing it, verified against its hash; pages no file lists
 * stay as they are.  0, or -EPROTO naming the file, region and page whose
 * copy does not match (the memory is then partly loaded: the guest must
 * not run), -errno of a read.  ret_pages: DATA pages read.
 */
int snap_chain_load(struct snap_file *const *files, unsigned int n, void *const *hva, uint64_t *ret_pages, char *err,
		    size_t len);

/*
 * Every DATA page every file of a checked chain lists read and checked
 * against its hash, older copies too (snap_chain_load() reads only each
 * page's newest copy, so a damaged copy that a later diff replaces goes
 * unseen there: the chain restores right, and would not without that
 * diff).  Nothing is written.  0, or -EPROTO naming the file, region and
 * page whose copy does not match, -errno of a read.  ret_pages: pages
 * read.
 */
int snap_chain_verify(struct snap_file *const *files, unsigned int n, uint64_t *ret_pages, char *err, size_t len);

#endif
