// SPDX-License-Identifier: MIT
/*
 * Snapshot files (lib/migrate/snapshot/snapfile.h) without KVM: guest memory
 * is host memory here.  A chain written and read back page for page at
 * every step; the allocated size; a file cut at every boundary and a byte
 * flipped in every part, each refused by name; chains with a gap, out of
 * order, mixed or with a wrong parent refused by name; a write that fails
 * (an injected error, a real file size limit) leaving nothing behind and
 * every earlier file whole; never a file written over.
 */
#define _GNU_SOURCE
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/stat.h>

#include <openssl/evp.h>
#include <sys/stat.h>

#include "rng.h"
#include "snapfile.h"
#include "test-util.h"

#define NREG 3
#define NV   2
static const uint64_t reg_gpa[NREG] = { 0, 4ull << 30, (4ull << 30) + (3ull << 20) };
static const uint64_t reg_size[NREG] = { 64 * 4096, 3ull << 20, 700 * 4096 }; /* the last not on 2 MiB */

struct mem {
	uint8_t *r[NREG];
	struct mig_vcpu_state vs[NV];
	struct mig_vm_state vm;
	uint8_t dev[5000]; /* the devices' state */
	size_t dev_len;
};

static char dir[64];

static void mem_new(struct mem *m)
{
	unsigned int i;

	for (i = 0; i < NREG; i++) {
		m->r[i] = mmap(NULL, reg_size[i], PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		ck_assert_ptr_ne(m->r[i], MAP_FAILED);
	}
	memset(m->vs, 0, sizeof(m->vs));
	for (i = 0; i < NV; i++) {
		m->vs[i].regs.rip = 0x1000 + i;
		m->vs[i].nr_msrs = 1;
		m->vs[i].msrs[0].index = 0x10; /* IA32_TSC */
		m->vs[i].msrs[0].data = 1234 + i;
	}
	m->vm = (struct mig_vm_state){ .parts = MIG_VMS_CLOCK, .clock.clock = 987654321 };
	m->dev_len = sizeof(m->dev);
	for (i = 0; i < m->dev_len; i++)
		m->dev[i] = (uint8_t)(i * 7 + 3);
}

static void mem_free(struct mem *m)
{
	unsigned int i;

	for (i = 0; i < NREG; i++)
		munmap(m->r[i], reg_size[i]);
}

static void mem_copy(struct mem *dst, const struct mem *src)
{
	unsigned int i;

	for (i = 0; i < NREG; i++)
		memcpy(dst->r[i], src->r[i], reg_size[i]);
	memcpy(dst->vs, src->vs, sizeof(dst->vs));
	dst->vm = src->vm;
	memcpy(dst->dev, src->dev, sizeof(dst->dev));
	dst->dev_len = src->dev_len;
}

/* Page pg of region r: random words, or zero. */
static void page_set(struct mem *m, unsigned int r, uint64_t pg, uint64_t *rng, bool zero)
{
	uint64_t *w = (uint64_t *)(m->r[r] + pg * 4096);
	unsigned int i;

	for (i = 0; i < 512; i++)
		w[i] = zero ? 0 : xorshift64(rng);
}

static void path_of(char *buf, size_t len, const char *name)
{
	snprintf(buf, len, "%s/%s", dir, name);
}

struct pagelist {
	unsigned int r[4096];
	uint64_t pg[4096];
	unsigned int n;
};

/* write_snap(): the devices' state in two parts, the first this long (0: one part); a framing that lies */
static size_t two_parts;
static bool bad_parts;

/*
 * A snapshot of m: full (every page put) when parent is NULL, else a diff
 * of the pages in pl.  Returns 0 or the writer's -errno; err says why.
 */
static int write_snap(const char *name, const struct mem *m, uint64_t seq, const uint8_t *parent, const uint8_t *base,
		      const struct pagelist *pl, uint8_t id[SNAP_ID], char *err, size_t len)
{
	struct snap_layout l = { .kind = parent ? SNAP_DIFF : SNAP_FULL,
				 .seq = seq,
				 .parent = parent,
				 .base = base,
				 .nr_regions = NREG,
				 .nr_vcpus = NV,
				 .gpa = reg_gpa,
				 .size = reg_size };
	struct snap_writer *w;
	char path[256];
	unsigned int i;
	int ret;

	path_of(path, sizeof(path), name);
	ret = snap_writer_open(path, &l, &w, err, len);
	if (ret < 0)
		return ret;
	for (i = 0; i < NREG && !pl; i++) {
		/* in two halves, the second put twice: a page put again replaces its copy */
		uint64_t n = reg_size[i] / 4096, half = n / 2;

		ret = snap_writer_put(w, i, 0, half, m->r[i], NULL, err, len);
		if (ret == 0)
			ret = snap_writer_put(w, i, half, n - half, m->r[i] + half * 4096, NULL, err, len);
		if (ret == 0)
			ret = snap_writer_put(w, i, half, n - half, m->r[i] + half * 4096, NULL, err, len);
		if (ret < 0)
			break;
	}
	for (i = 0; pl && i < pl->n && ret == 0; i++)
		ret = snap_writer_put(w, pl->r[i], pl->pg[i], 1, m->r[pl->r[i]] + pl->pg[i] * 4096, NULL, err, len);
	if (ret < 0) {
		snap_writer_abandon(w);
		return ret;
	}
	snap_writer_vcpus(w, m->vs, &m->vm);
	{
		void *dev = malloc(m->dev_len), *live = NULL;

		ck_assert_ptr_nonnull(dev);
		memcpy(dev, m->dev, m->dev_len);
		if (!two_parts) {
			snap_writer_devices(w, dev, m->dev_len);
		} else {
			/* the first two_parts bytes as the live part */
			live = malloc(two_parts);
			ck_assert_ptr_nonnull(live);
			memcpy(live, m->dev, two_parts);
			memmove(dev, (uint8_t *)dev + two_parts, m->dev_len - two_parts);
			ck_assert_int_eq(snap_writer_devices_parts(w, live, two_parts, dev, m->dev_len - two_parts), 0);
		}
		if (bad_parts) {
			/* the parts' framing with a first part longer than what follows, hashed as written */
			uint8_t *b = calloc(1, 8 + 16);
			uint64_t n = 17;

			ck_assert_ptr_nonnull(b);
			memcpy(b, &n, 8);
			snap_writer_devices(w, b, 8 + 16);
		}
	}
	return snap_writer_commit(w, id, NULL, err, len);
}

/* Open names[0..n) and load them into fresh memory; 0 or -errno with err. */
static int load_chain(const char *const *names, unsigned int n, struct mem *out, char *err, size_t len)
{
	struct snap_file *f[8] = { 0 };
	char path[256];
	unsigned int i;
	int ret = 0;

	for (i = 0; i < n && ret == 0; i++) {
		path_of(path, sizeof(path), names[i]);
		ret = snap_file_open(path, &f[i], err, len);
	}
	if (ret == 0)
		ret = snap_chain_check(f, n, err, len);
	if (ret == 0) {
		ret = snap_chain_load(f, n, (void *const *)out->r, NULL, err, len);
		if (ret == 0)
			memcpy(out->vs, f[n - 1]->vcpus, sizeof(out->vs));
		if (ret == 0)
			out->vm = *f[n - 1]->vm;
		if (ret == 0 && f[n - 1]->h.dev_len <= sizeof(out->dev)) {
			out->dev_len = f[n - 1]->h.dev_len;
			if (out->dev_len) /* a file without devices has no buffer for them */
				memcpy(out->dev, f[n - 1]->dev, out->dev_len);
		}
		if (ret == 0)
			ck_assert_uint_le(f[n - 1]->h.dev_len, sizeof(out->dev));
	}
	for (i = 0; i < n; i++)
		snap_file_close(f[i]);
	return ret;
}

static void expect_same(const struct mem *a, const struct mem *b, const char *what)
{
	unsigned int i;
	uint64_t pg;

	for (i = 0; i < NREG; i++)
		for (pg = 0; pg < reg_size[i] / 4096; pg++)
			expect(!memcmp(a->r[i] + pg * 4096, b->r[i] + pg * 4096, 4096),
			       "%s: region %u page %" PRIu64 " differs from memory at the snapshot", what, i, pg);
	ck_assert_msg(!memcmp(a->vs, b->vs, sizeof(a->vs)), "%s: vCPU states differ", what);
	ck_assert_msg(!memcmp(&a->vm, &b->vm, sizeof(a->vm)), "%s: the VM's states differ", what);
	ck_assert_msg(a->dev_len == b->dev_len && !memcmp(a->dev, b->dev, a->dev_len), "%s: the devices' states differ",
		      what);
}

/* Memory with data and zero pages, its full snapshot s0, and diffs s1, s2 (m1, m2: memory at each). */
struct chain {
	struct mem m[3];
	uint8_t id[3][SNAP_ID];
};

static void dirty_some(struct mem *m, struct pagelist *pl, uint64_t *rng, unsigned int n)
{
	unsigned int i;

	pl->n = 0;
	for (i = 0; i < n; i++) {
		unsigned int r = xorshift64(rng) % NREG;
		uint64_t pg = xorshift64(rng) % (reg_size[r] / 4096);

		/* one in four written zero: a diff must say so, or the parent's copy would come back */
		page_set(m, r, pg, rng, xorshift64(rng) % 4 == 0);
		pl->r[pl->n] = r;
		pl->pg[pl->n++] = pg;
	}
	m->vs[0].regs.rip += 0x10;
}

static void chain_make(struct chain *c, uint64_t seed)
{
	uint64_t rng = seed, pg;
	struct pagelist pl;
	char err[512];
	unsigned int i, r;

	for (i = 0; i < 3; i++)
		mem_new(&c->m[i]);
	for (r = 0; r < NREG; r++)
		for (pg = 0; pg < reg_size[r] / 4096; pg++)
			if (pg % 5) /* every fifth page zero (and never written: a hole) */
				page_set(&c->m[0], r, pg, &rng, false);
	ck_assert_msg(write_snap("s0", &c->m[0], 0, NULL, NULL, NULL, c->id[0], err, sizeof(err)) == 0, "%s", err);
	for (i = 1; i < 3; i++) {
		mem_copy(&c->m[i], &c->m[i - 1]);
		dirty_some(&c->m[i], &pl, &rng, 200);
		ck_assert_msg(write_snap(i == 1 ? "s1" : "s2", &c->m[i], i, c->id[i - 1], c->id[0], &pl, c->id[i], err,
					 sizeof(err)) == 0,
			      "%s", err);
	}
}

static void chain_free(struct chain *c)
{
	unsigned int i;

	for (i = 0; i < 3; i++)
		mem_free(&c->m[i]);
}

static void setup(void)
{
	snprintf(dir, sizeof(dir), "/tmp/kvmdirty-snapfile-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	ck_assert_int_eq(system(cmd), 0);
}

START_TEST(chain_round_trip)
{
	static const char *const names[] = { "s0", "s1", "s2" };
	struct chain c;
	struct mem out;
	char err[512];
	unsigned int k;

	chain_make(&c, 0x1234567);
	/* every prefix of the chain gives memory as it was at that snapshot */
	for (k = 1; k <= 3; k++) {
		mem_new(&out);
		ck_assert_msg(load_chain(names, k, &out, err, sizeof(err)) == 0, "chain of %u: %s", k, err);
		expect_same(&out, &c.m[k - 1], names[k - 1]);
		mem_free(&out);
	}
	chain_free(&c);
}
END_TEST

/*
 * The devices' state in two parts (SNAP_F_DEVICES_LIVE): read back as
 * written, each part where it was; a first part longer than the bytes
 * after it is refused by name, though its hash holds.
 */
START_TEST(devices_in_two_parts)
{
	struct mem m;
	uint8_t id[SNAP_ID];
	struct snap_file *f;
	char err[512], path[256];

	mem_new(&m);
	two_parts = 100;
	ck_assert_msg(write_snap("p0", &m, 0, NULL, NULL, NULL, id, err, sizeof(err)) == 0, "%s", err);
	two_parts = 0;
	path_of(path, sizeof(path), "p0");
	ck_assert_msg(snap_file_open(path, &f, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(f->h.flags, SNAP_F_DEVICES_LIVE);
	ck_assert_uint_eq(f->dev_live_len, 100);
	ck_assert_uint_eq(f->dev_rest_len, m.dev_len - 100);
	ck_assert(!memcmp(f->dev_live, m.dev, 100) && !memcmp(f->dev_rest, m.dev + 100, m.dev_len - 100));
	snap_file_close(f);
	unlink(path);
	two_parts = 100; /* the flag set, then the bytes replaced */
	bad_parts = true;
	ck_assert_msg(write_snap("p1", &m, 0, NULL, NULL, NULL, id, err, sizeof(err)) == 0, "%s", err);
	bad_parts = false;
	two_parts = 0;
	path_of(path, sizeof(path), "p1");
	ck_assert_int_eq(snap_file_open(path, &f, err, sizeof(err)), -EPROTO);
	ck_assert_msg(strstr(err, "the devices' state: a first part of 17 bytes in 16"), "%s", err);
	unlink(path);
	mem_free(&m);
}
END_TEST

/* A file's blocks: its data pages and its tables, nothing for holes or zero pages. */
START_TEST(allocated_size)
{
	struct snap_file *f;
	char path[256], err[512];
	struct chain c;
	struct stat st;
	uint64_t want, got;
	unsigned int k;

	chain_make(&c, 99);
	for (k = 0; k < 3; k++) {
		snprintf(path, sizeof(path), "%s/s%u", dir, k);
		ck_assert_msg(snap_file_open(path, &f, err, sizeof(err)) == 0, "%s", err);
		ck_assert_int_eq(stat(path, &st), 0);
		/*
		 * Within 1% of the pages and tables, and a block for the index's
		 * last one and one of the file system's own (an extent tree
		 * block): a zero page written would be one more block each.
		 */
		want = f->h.data_pages * 4096 + f->h.header_len + f->h.index_len + sizeof(struct snap_trailer);
		got = (uint64_t)st.st_blocks * 512;
		ck_assert_msg(got <= want + want / 100 + 8192 && got >= f->h.data_pages * 4096,
			      "%s: %" PRIu64 " bytes allocated for %" PRIu64 " data pages and %" PRIu64 " of tables",
			      path, got, f->h.data_pages, want - f->h.data_pages * 4096);
		if (k == 0) /* every fifth page is zero: not held */
			ck_assert_uint_lt(f->h.data_pages, (64 + 768 + 700) * 4 / 5 + 2);
		snap_file_close(f);
	}
	chain_free(&c);
}
END_TEST

static void copy_file(const char *from, const char *to)
{
	char cmd[600];

	snprintf(cmd, sizeof(cmd), "cp --sparse=always '%s' '%s'", from, to);
	ck_assert_int_eq(system(cmd), 0);
}

/* Open path: must be refused, err naming it and containing want. */
static void expect_refused(const char *path, const char *want, const char *what)
{
	struct snap_file *f;
	char err[512];
	int ret = snap_file_open(path, &f, err, sizeof(err));

	ck_assert_msg(ret < 0, "%s: taken for a snapshot", what);
	ck_assert_msg(strstr(err, path) && strstr(err, want), "%s: refused as '%s', expected it named and '%s'", what,
		      err, want);
}

START_TEST(cut_at_every_boundary)
{
	struct snap_file *f;
	char src[256], cut[256], err[512];
	struct chain c;
	uint64_t at[32];
	unsigned int n = 0, i;

	chain_make(&c, 7);
	path_of(src, sizeof(src), "s1");
	path_of(cut, sizeof(cut), "cut");
	ck_assert_msg(snap_file_open(src, &f, err, sizeof(err)) == 0, "%s", err);
	at[n++] = 0;
	at[n++] = 1;
	at[n++] = sizeof(struct snap_header) - 1;
	at[n++] = sizeof(struct snap_header);
	at[n++] = sizeof(struct snap_header) + 5;
	at[n++] = f->h.header_len - 1;
	at[n++] = f->h.header_len;
	at[n++] = f->h.data_off;
	at[n++] = f->h.data_off + 4096;
	at[n++] = f->h.index_off - 1;
	at[n++] = f->h.index_off;
	at[n++] = f->h.index_off + f->h.nr_runs * 32;
	at[n++] = f->h.index_off + f->h.index_len - 1;
	at[n++] = f->h.index_off + f->h.index_len;
	at[n++] = f->h.index_off + f->h.index_len + 64;
	at[n++] = f->size - 1;
	snap_file_close(f);
	for (i = 0; i < n; i++) {
		char what[64];

		unlink(cut);
		copy_file(src, cut);
		ck_assert_int_eq(truncate(cut, (off_t)at[i]), 0);
		snprintf(what, sizeof(what), "cut at %" PRIu64, at[i]);
		/* short of a header and trailer: "cut short"; longer: no trailer where it ends */
		expect_refused(cut, at[i] < 384 ? "cut short" : "no trailer", what);
	}
	/* and one byte more than written */
	unlink(cut);
	copy_file(src, cut);
	ck_assert_int_eq(truncate(cut, (off_t)(at[n - 1] + 2)), 0);
	expect_refused(cut, "no trailer", "extended by a byte");
	chain_free(&c);
}
END_TEST

static void flip(const char *path, uint64_t off)
{
	int fd = open(path, O_RDWR);
	uint8_t b;

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pread(fd, &b, 1, (off_t)off), 1);
	b ^= 0x20;
	ck_assert_int_eq(pwrite(fd, &b, 1, (off_t)off), 1);
	close(fd);
}

/* A byte of s2 flipped at off: refused at open (want), or at load when want_load. */
static void flip_case(uint64_t off, const char *want, bool at_load)
{
	static const char *const names[] = { "s0", "s1", "bad" };
	char src[256], bad[256], err[512], what[96];
	struct mem out;
	int ret;

	path_of(src, sizeof(src), "s2");
	path_of(bad, sizeof(bad), "bad");
	unlink(bad);
	copy_file(src, bad);
	flip(bad, off);
	snprintf(what, sizeof(what), "byte %" PRIu64 " flipped (%s)", off, want);
	if (!at_load) {
		expect_refused(bad, want, what);
		return;
	}
	mem_new(&out);
	ret = load_chain(names, 3, &out, err, sizeof(err));
	ck_assert_msg(ret < 0, "%s: restored", what);
	ck_assert_msg(strstr(err, bad) && strstr(err, want), "%s: refused as '%s'", what, err);
	mem_free(&out);
}

/*
 * A copy in the full snapshot of a page a later diff replaces, damaged:
 * the chain loads right (the newest copy is read, as snapfile.h says),
 * and snap_chain_verify() refuses it by file, region and page; the
 * undamaged chain verifies, every DATA page of every file read.
 */
START_TEST(older_copy_damaged_found_by_verify)
{
	static const char *const names[] = { "old", "s1", "s2" };
	struct snap_file *f[3] = { 0 };
	char path[256], src[256], err[512], want[96];
	uint64_t pages = 0, listed = 0, i, pg = 0;
	uint32_t reg = 0;
	struct chain c;
	struct mem out;
	bool found = false;
	unsigned int j;

	chain_make(&c, 31);
	path_of(src, sizeof(src), "s2");
	ck_assert_msg(snap_file_open(src, &f[2], err, sizeof(err)) == 0, "%s", err);
	/* a page s2 holds whose copy in s0 is data (s0 holds every page but each fifth) */
	for (i = 0; i < f[2]->h.nr_runs && !found; i++) {
		const struct snap_run *run = &f[2]->runs[i];

		if (run->kind != SNAP_RUN_DATA)
			continue;
		for (pg = run->first; pg < run->first + run->count && pg % 5 == 0; pg++)
			;
		if (pg < run->first + run->count) {
			found = true;
			reg = run->region;
		}
	}
	snap_file_close(f[2]);
	ck_assert(found);
	path_of(src, sizeof(src), "s0");
	path_of(path, sizeof(path), "old");
	unlink(path);
	copy_file(src, path);
	ck_assert_msg(snap_file_open(path, &f[0], err, sizeof(err)) == 0, "%s", err);
	flip(path, f[0]->regions[reg].data_off + pg * 4096 + 77);
	snap_file_close(f[0]);
	mem_new(&out);
	ck_assert_msg(load_chain(names, 3, &out, err, sizeof(err)) == 0, "the chain with an older copy damaged: %s", err);
	expect_same(&out, &c.m[2], "the chain with an older copy damaged");
	mem_free(&out);
	for (j = 0; j < 3; j++) {
		path_of(path, sizeof(path), names[j]);
		ck_assert_msg(snap_file_open(path, &f[j], err, sizeof(err)) == 0, "%s", err);
	}
	ck_assert_int_eq(snap_chain_check(f, 3, err, sizeof(err)), 0);
	ck_assert_int_eq(snap_chain_verify(f, 3, NULL, err, sizeof(err)), -EPROTO);
	snprintf(want, sizeof(want), "region %u page %" PRIu64 " ", reg, pg);
	ck_assert_msg(strstr(err, "old") && strstr(err, want) && strstr(err, "damaged (not its hash)"),
		      "verify refused as '%s', not for %s of old", err, want);
	snap_file_close(f[0]);
	path_of(path, sizeof(path), "s0");
	ck_assert_msg(snap_file_open(path, &f[0], err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(snap_chain_verify(f, 3, &pages, err, sizeof(err)) == 0, "the undamaged chain: %s", err);
	for (j = 0; j < 3; j++) {
		for (i = 0; i < f[j]->h.nr_runs; i++)
			listed += f[j]->runs[i].kind == SNAP_RUN_DATA ? f[j]->runs[i].count : 0;
		snap_file_close(f[j]);
	}
	ck_assert_uint_eq(pages, listed);
	chain_free(&c);
}
END_TEST

START_TEST(flipped_byte_in_every_part)
{
	struct snap_file *f;
	char src[256], err[512];
	struct chain c;
	uint64_t off, i;

	chain_make(&c, 11);
	path_of(src, sizeof(src), "s2");
	ck_assert_msg(snap_file_open(src, &f, err, sizeof(err)) == 0, "%s", err);
	/* the header's every field: magic and version by name, the rest by the header's hash */
	flip_case(0, "not a snapshot", false);
	flip_case(8, "version", false);
	for (off = 12; off < sizeof(struct snap_header); off += 4)
		flip_case(off, "header damaged", false);
	flip_case(sizeof(struct snap_header) + 3, "header damaged", false);		 /* the region table */
	flip_case(sizeof(struct snap_header) + NREG * 32 + 17, "header damaged", false); /* a vCPU's state */
	flip_case(f->h.header_len - 1, "header damaged", false);			 /* the padding */
	/* the page area: a held page at load; a hole, and the gap before the pages, at open */
	for (i = 0; i < f->h.nr_runs && f->runs[i].kind != SNAP_RUN_DATA; i++)
		;
	ck_assert_uint_lt(i, f->h.nr_runs);
	flip_case(f->regions[f->runs[i].region].data_off + f->runs[i].first * 4096 + 100, "damaged (not its hash)",
		  true);
	flip_case(f->regions[0].data_off + 64 * 4096 + 5, "where the index lists no page", false);
	flip_case(f->regions[1].data_off + (3u << 20) + 5, "where the index lists no page", false);
	flip_case(f->h.header_len + 10, "where the index lists no page", false);
	/* the index: runs and hashes */
	/* a run: its structure fails first (the walk stops there, the hash unread); a hash: the hash */
	flip_case(f->h.index_off + 1, "index: run 0", false);
	flip_case(f->h.index_off + f->h.index_len - 1, "index damaged", false);
	/* the devices' state */
	flip_case(f->h.index_off + f->h.index_len + 4321, "the devices' state (5000 bytes) damaged", false);
	/* the trailer, every part */
	for (off = 0; off < sizeof(struct snap_trailer); off += 8)
		flip_case(f->size - sizeof(struct snap_trailer) + off, off < 8 ? "no trailer" : "trailer damaged",
			  false);
	snap_file_close(f);
	chain_free(&c);
}
END_TEST

static void chain_refused(const char *const *names, unsigned int n, const char *who, const char *want)
{
	struct mem out;
	char err[512], path[256];

	mem_new(&out);
	ck_assert_msg(load_chain(names, n, &out, err, sizeof(err)) < 0, "chain with %s taken", want);
	path_of(path, sizeof(path), who);
	ck_assert_msg(strstr(err, path) && strstr(err, want), "refused as '%s', expected %s named and '%s'", err, path,
		      want);
	mem_free(&out);
}

START_TEST(chains_that_do_not_add_up)
{
	struct chain c, d;
	struct pagelist pl;
	uint8_t id[SNAP_ID];
	char err[512], path[256], other[256];
	uint64_t rng = 5;

	chain_make(&c, 21);
	/* another chain beside it: t0, t1 */
	path_of(path, sizeof(path), "s0");
	path_of(other, sizeof(other), "t0");
	ck_assert_int_eq(rename(path, other), 0);
	path_of(path, sizeof(path), "s1");
	path_of(other, sizeof(other), "t1");
	ck_assert_int_eq(rename(path, other), 0);
	path_of(path, sizeof(path), "s2");
	path_of(other, sizeof(other), "t2");
	ck_assert_int_eq(rename(path, other), 0);
	chain_make(&d, 22);
	/* a second diff 1 of d's s0: the same number, another snapshot */
	dirty_some(&d.m[1], &pl, &rng, 50);
	ck_assert_msg(write_snap("s1b", &d.m[1], 1, d.id[0], d.id[0], &pl, id, err, sizeof(err)) == 0, "%s", err);

	chain_refused((const char *const[]){ "s1" }, 1, "s1", "a chain starts with its full snapshot");
	chain_refused((const char *const[]){ "s0", "s0" }, 2, "s0", "only a chain's first file is full");
	chain_refused((const char *const[]){ "s0", "s2" }, 2, "s2", "a gap");
	chain_refused((const char *const[]){ "s0", "s2", "s1" }, 3, "s2", "a gap");
	chain_refused((const char *const[]){ "s0", "s1", "s1" }, 3, "s1", "out of order or repeated");
	chain_refused((const char *const[]){ "s0", "t1" }, 2, "t1", "another chain");
	chain_refused((const char *const[]){ "s0", "s1b", "s2" }, 3, "s2", "its parent is not");
	/* and the good ones still restore */
	{
		struct mem out;

		mem_new(&out);
		ck_assert_msg(load_chain((const char *const[]){ "t0", "t1", "t2" }, 3, &out, err, sizeof(err)) == 0,
			      "%s", err);
		expect_same(&out, &c.m[2], "the other chain");
		mem_free(&out);
	}
	chain_free(&c);
	chain_free(&d);
}
END_TEST

static int fail_after;
static ssize_t failing_pwrite(int fd, const void *buf, size_t n, off_t off)
{
	if (fail_after-- <= 0) {
		/* half of it lands, as on a disk that fills mid-write; then the error */
		if (n > 4096 && fail_after == -1)
			return pwrite(fd, buf, n / 2, off);
		errno = ENOSPC;
		return -1;
	}
	return pwrite(fd, buf, n, off);
}

/* Only names[] (and nothing temporary) in the directory. */
static void expect_dir(const char *const *names, unsigned int n)
{
	char cmd[256], buf[512] = "";
	FILE *p;
	size_t got;

	snprintf(cmd, sizeof(cmd), "ls -1 '%s' | sort | tr '\\n' ' '", dir);
	p = popen(cmd, "r");
	ck_assert_ptr_nonnull(p);
	got = fread(buf, 1, sizeof(buf) - 1, p);
	buf[got] = 0;
	pclose(p);
	{
		char want[512] = "";
		unsigned int i;

		for (i = 0; i < n; i++) {
			strcat(want, names[i]);
			strcat(want, " ");
		}
		ck_assert_str_eq(buf, want);
	}
}

START_TEST(write_errors_leave_nothing)
{
	static const char *const names[] = { "s0", "s1", "s2" };
	struct pagelist pl;
	struct chain c;
	struct mem m, out;
	uint8_t id[SNAP_ID];
	char err[512];
	uint64_t rng = 77;
	int k, ret;

	chain_make(&c, 31);
	mem_new(&m);
	mem_copy(&m, &c.m[2]);
	dirty_some(&m, &pl, &rng, 300);
	/* a diff 3 whose nth write fails, for every n until one succeeds: nothing of it is left each time */
	for (k = 0;; k++) {
		fail_after = k;
		snap_pwrite = failing_pwrite;
		ret = write_snap("s3", &m, 3, c.id[2], c.id[0], &pl, id, err, sizeof(err));
		snap_pwrite = pwrite;
		if (ret == 0)
			break;
		ck_assert_msg(ret == -ENOSPC && strstr(err, "No space left"), "write %d failed as: %s", k, err);
		expect_dir(names, 3);
		/* the chain before it untouched */
		mem_new(&out);
		ck_assert_msg(load_chain(names, 3, &out, err, sizeof(err)) == 0, "after failed write %d: %s", k, err);
		expect_same(&out, &c.m[2], "the chain after a failed diff");
		mem_free(&out);
	}
	ck_assert_int_ge(k, 4); /* pages, the index, the header, the trailer: each failed once */
	mem_new(&out);
	ck_assert_msg(load_chain((const char *const[]){ "s0", "s1", "s2", "s3" }, 4, &out, err, sizeof(err)) == 0, "%s",
		      err);
	expect_same(&out, &m, "the diff taken after the failures");
	mem_free(&out);
	mem_free(&m);
	chain_free(&c);
}
END_TEST

/* A real limit: the file system says the file is too large (RLIMIT_FSIZE), mid-snapshot. */
START_TEST(file_too_large)
{
	struct rlimit rl = { 64 << 10, RLIM_INFINITY }, old;
	struct mem m;
	uint8_t id[SNAP_ID];
	uint64_t rng = 3, pg;
	char err[512];
	int ret;

	mem_new(&m);
	for (pg = 0; pg < reg_size[1] / 4096; pg++)
		page_set(&m, 1, pg, &rng, false);
	signal(SIGXFSZ, SIG_IGN);
	getrlimit(RLIMIT_FSIZE, &old);
	ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
	ret = write_snap("big", &m, 0, NULL, NULL, NULL, id, err, sizeof(err));
	setrlimit(RLIMIT_FSIZE, &old);
	ck_assert_msg(ret == -EFBIG && strstr(err, "big.tmp"), "%d: %s", ret, err);
	expect_dir(NULL, 0);
	mem_free(&m);
}
END_TEST

START_TEST(never_over_a_file)
{
	struct snap_layout l = {
		.kind = SNAP_FULL, .nr_regions = NREG, .nr_vcpus = NV, .gpa = reg_gpa, .size = reg_size
	};
	struct snap_writer *w;
	struct mem m;
	uint8_t id[SNAP_ID];
	char path[256], err[512], buf[8] = "";
	int fd;

	mem_new(&m);
	path_of(path, sizeof(path), "x");
	fd = open(path, O_CREAT | O_WRONLY, 0600);
	ck_assert_int_eq(write(fd, "mine", 4), 4);
	close(fd);
	ck_assert_int_eq(snap_writer_open(path, &l, &w, err, sizeof(err)), -EEXIST);
	ck_assert_msg(strstr(err, path), "%s", err);
	/* one that appears while the snapshot is written is not replaced either */
	unlink(path);
	ck_assert_msg(snap_writer_open(path, &l, &w, err, sizeof(err)) == 0, "%s", err);
	fd = open(path, O_CREAT | O_WRONLY, 0600);
	ck_assert_int_eq(write(fd, "mine", 4), 4);
	close(fd);
	snap_writer_vcpus(w, m.vs, &m.vm);
	ck_assert_int_eq(snap_writer_commit(w, id, NULL, err, sizeof(err)), -EEXIST);
	fd = open(path, O_RDONLY);
	ck_assert_int_eq(read(fd, buf, sizeof(buf)), 4);
	close(fd);
	ck_assert_str_eq(buf, "mine");
	expect_dir((const char *const[]){ "x" }, 1);
	mem_free(&m);
}
END_TEST

/* Pages [first, first + n) of region r of the snapshot at name, as they read back through a fresh load of it alone. */
static void sha(const void *p, size_t n, uint8_t out[SNAP_ID])
{
	unsigned int len = SNAP_ID;

	ck_assert_int_eq(EVP_Digest(p, n, out, &len, EVP_sha256(), NULL), 1);
}

/*
 * The whole file in memory, changed by fn, then sealed again (the index's
 * hash into the header, the header's into the trailer, the trailer's own)
 * and written back: damage that every hash agrees with, which only the
 * reader's structural checks can catch.
 */
static void reseal(const char *path, void (*fn)(uint8_t *b, struct snap_header *h, void *arg), void *arg)
{
	struct snap_header *h;
	struct snap_trailer *t;
	struct stat st;
	uint8_t *b;
	int fd = open(path, O_RDWR);

	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(fstat(fd, &st), 0);
	b = malloc(st.st_size);
	ck_assert_int_eq(pread(fd, b, st.st_size, 0), st.st_size);
	h = (struct snap_header *)b;
	t = (struct snap_trailer *)(b + st.st_size - sizeof(*t));
	fn(b, h, arg);
	sha(b + t->index_off, t->index_len, h->index_sha);
	sha(b, t->header_len, t->id);
	sha(t, offsetof(struct snap_trailer, sha), t->sha);
	ck_assert_int_eq(pwrite(fd, b, st.st_size, 0), st.st_size);
	close(fd);
	free(b);
}

static struct snap_run *runs_of(uint8_t *b, struct snap_header *h)
{
	return (struct snap_run *)(b + h->index_off);
}

static void run_past_region(uint8_t *b, struct snap_header *h, void *arg)
{
	(void)arg;
	runs_of(b, h)[0].count += 100000;
}

static void runs_swapped(uint8_t *b, struct snap_header *h, void *arg)
{
	struct snap_run *r = runs_of(b, h), x = r[0];

	(void)arg;
	r[0] = r[1];
	r[1] = x;
	/* the hashes in their new order's places: only the order is wrong */
	r[0].hash_first = 0;
	r[1].hash_first = r[0].count;
}

static void runs_overlap(uint8_t *b, struct snap_header *h, void *arg)
{
	struct snap_run *r = runs_of(b, h);

	(void)arg;
	r[1].region = r[0].region;
	r[1].first = r[0].first;
}

static void hash_first_wrong(uint8_t *b, struct snap_header *h, void *arg)
{
	(void)arg;
	runs_of(b, h)[1].hash_first += 1;
}

static void zero_run_in_full(uint8_t *b, struct snap_header *h, void *arg)
{
	(void)arg;
	runs_of(b, h)[0].kind = SNAP_RUN_ZERO;
	runs_of(b, h)[0].hash_first = 0;
}

static void counts_wrong(uint8_t *b, struct snap_header *h, void *arg)
{
	(void)b;
	(void)arg;
	h->zero_pages += 1;
}

static void region_moved(uint8_t *b, struct snap_header *h, void *arg)
{
	struct snap_region *reg = (struct snap_region *)(b + sizeof(*h));

	(void)arg;
	reg[1].data_off += 4096;
}

static void region_not_pages(uint8_t *b, struct snap_header *h, void *arg)
{
	struct snap_region *reg = (struct snap_region *)(b + sizeof(*h));

	(void)arg;
	reg[2].size -= 1;
}

static void full_with_parent(uint8_t *b, struct snap_header *h, void *arg)
{
	(void)b;
	(void)arg;
	h->parent[3] = 1;
}

static void unchanged(uint8_t *b, struct snap_header *h, void *arg)
{
	(void)b;
	(void)h;
	(void)arg;
}

static void more_runs_than_pages(uint8_t *b, struct snap_header *h, void *arg)
{
	(void)b;
	(void)arg;
	h->nr_runs = 1ull << 40;
}

/* Damage the hashes agree with: refused by the structural checks, by name. */
START_TEST(sealed_damage_refused)
{
	static const struct {
		const char *file;
		void (*fn)(uint8_t *, struct snap_header *, void *);
		const char *want;
	} cases[] = {
		{ "s0", run_past_region, "outside its region" },
		{ "s0", runs_swapped, "out of order or overlapping" },
		{ "s1", runs_overlap, "out of order or overlapping" },
		{ "s0", hash_first_wrong, "not in the format" },
		{ "s0", zero_run_in_full, "not in the format" },
		{ "s1", counts_wrong, "the header says" },
		{ "s0", region_moved, "the layout puts them" },
		{ "s0", region_not_pages, "not whole pages" },
		{ "s0", full_with_parent, "with a parent" },
		{ "s1", more_runs_than_pages, "does not fit" },
	};
	char src[256], bad[256], err[512];
	struct snap_file *f;
	struct chain c;
	unsigned int i;

	chain_make(&c, 41);
	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		path_of(src, sizeof(src), cases[i].file);
		path_of(bad, sizeof(bad), "sealed");
		unlink(bad);
		copy_file(src, bad);
		reseal(bad, cases[i].fn, NULL);
		expect_refused(bad, cases[i].want, cases[i].want);
	}
	/* and a file resealed unchanged is taken: the sealing is the writer's, the refusals the damage's */
	unlink(bad);
	copy_file(src, bad);
	reseal(bad, unchanged, NULL);
	ck_assert_msg(snap_file_open(bad, &f, err, sizeof(err)) == 0, "resealed unchanged: %s", err);
	snap_file_close(f);
	chain_free(&c);
}
END_TEST

/* Written as data, then zero within the same snapshot: the data must not come back. */
START_TEST(stale_copies_never_come_back)
{
	struct snap_layout l = {
		.kind = SNAP_FULL, .nr_regions = NREG, .nr_vcpus = NV, .gpa = reg_gpa, .size = reg_size
	};
	static const char *const names[] = { "z0", "z1" };
	static const uint8_t zero[4096];
	struct snap_writer *w;
	struct mem m, out;
	uint8_t id[2][SNAP_ID];
	char path[256], err[512];
	uint64_t rng = 9, pg;
	unsigned int k;

	mem_new(&m);
	for (pg = 0; pg < reg_size[1] / 4096; pg++)
		page_set(&m, 1, pg, &rng, false);
	for (k = 0; k < 2; k++) {
		l.kind = k ? SNAP_DIFF : SNAP_FULL;
		l.seq = k;
		l.parent = k ? id[0] : NULL;
		l.base = k ? id[0] : NULL;
		path_of(path, sizeof(path), names[k]);
		ck_assert_msg(snap_writer_open(path, &l, &w, err, sizeof(err)) == 0, "%s", err);
		/* full: every page; diff: pages 3 to 9 again */
		ck_assert_int_eq(snap_writer_put(w, 1, k ? 3 : 0, k ? 7 : reg_size[1] / 4096,
						 m.r[1] + (k ? 3 : 0) * 4096, NULL, err, sizeof(err)),
				 0);
		/* then page 3 is zero when put again, and page 5 is found untouched (zero without a read) */
		page_set(&m, 1, 3, &rng, true);
		page_set(&m, 1, 5, &rng, true);
		ck_assert_int_eq(snap_writer_put(w, 1, 3, 1, zero, NULL, err, sizeof(err)), 0);
		ck_assert_int_eq(snap_writer_zero(w, 1, 5, 1, err, sizeof(err)), 0);
		snap_writer_vcpus(w, m.vs, &m.vm);
		m.dev_len = 0; /* no devices: a file without their state */
		ck_assert_msg(snap_writer_commit(w, id[k], NULL, err, sizeof(err)) == 0, "%s", err);
		mem_new(&out);
		ck_assert_msg(load_chain(names, k + 1, &out, err, sizeof(err)) == 0, "%s", err);
		expect_same(&out, &m, k ? "the diff" : "the full snapshot");
		mem_free(&out);
		/* the next snapshot starts from data again */
		page_set(&m, 1, 3, &rng, false);
		page_set(&m, 1, 5, &rng, false);
	}
	mem_free(&m);
}
END_TEST

/*
 * A page the guest writes between the writer's look at it and the
 * write: the file holds one copy, and that copy matches its hash (a
 * restore never refuses a file for a write the tracker would report
 * anyway).  Forced at each pwrite: the source pages change just before
 * the bytes go to the file.  Hashing the guest's page and then writing
 * it from there wrote the new bytes under the old hash.
 */
static uint8_t *scribble_on;
static size_t scribble_len;

/*
 * Not instrumented for ThreadSanitizer: the scribbler stands in for a
 * vCPU, whose stores to guest memory no sanitizer sees, and the writer's
 * copier reading the same pages at the same time is the case under test.
 */
__attribute__((no_sanitize("thread")))
static ssize_t scribbling_pwrite(int fd, const void *buf, size_t n, off_t off)
{
	size_t i;

	for (i = 0; i < scribble_len; i += 4096)
		scribble_on[i + 100]++;
	return pwrite(fd, buf, n, off);
}

START_TEST(page_changed_as_written)
{
	struct snap_layout l = {
		.kind = SNAP_FULL, .nr_regions = NREG, .nr_vcpus = NV, .gpa = reg_gpa, .size = reg_size
	};
	static const char *const names[] = { "w0" };
	struct snap_writer *w;
	struct mem m, out;
	uint8_t id[SNAP_ID];
	char path[256], err[512];
	uint64_t rng = 21, pg, n = reg_size[1] / 4096;
	int ret;

	mem_new(&m);
	for (pg = 0; pg < n; pg++)
		page_set(&m, 1, pg, &rng, false);
	path_of(path, sizeof(path), names[0]);
	ck_assert_msg(snap_writer_open(path, &l, &w, err, sizeof(err)) == 0, "%s", err);
	scribble_on = m.r[1];
	scribble_len = n * 4096;
	snap_pwrite = scribbling_pwrite;
	ret = snap_writer_put(w, 1, 0, n, m.r[1], NULL, err, sizeof(err));
	snap_pwrite = pwrite;
	ck_assert_msg(ret == 0, "%s", err);
	snap_writer_vcpus(w, m.vs, &m.vm);
	ck_assert_msg(snap_writer_commit(w, id, NULL, err, sizeof(err)) == 0, "%s", err);
	mem_new(&out);
	ret = load_chain(names, 1, &out, err, sizeof(err));
	ck_assert_msg(ret == 0, "a page changed as it was written: the file refused: %s", err);
	mem_free(&out);
	mem_free(&m);
}
END_TEST

/*
 * Zeroes where the index lists no page are taken (a file system that
 * reports data in blocks larger than a page shows the holes beside a page
 * as data); a FIFO is refused at once, not waited on.
 */
START_TEST(zeroes_beside_pages_and_fifos)
{
	static const uint8_t zero[4096];
	struct snap_file *f;
	char src[256], z[256], err[512];
	struct chain c;
	int fd;

	chain_make(&c, 51);
	path_of(src, sizeof(src), "s1");
	path_of(z, sizeof(z), "zeroes");
	copy_file(src, z);
	ck_assert_msg(snap_file_open(z, &f, err, sizeof(err)) == 0, "%s", err);
	fd = open(z, O_WRONLY);
	/* region 1's padding after its last page, and the gap after the header */
	ck_assert_int_eq(pwrite(fd, zero, 4096, (off_t)(f->regions[1].data_off + (3u << 20))), 4096);
	ck_assert_int_eq(pwrite(fd, zero, 4096, (off_t)f->h.header_len), 4096);
	close(fd);
	snap_file_close(f);
	ck_assert_msg(snap_file_open(z, &f, err, sizeof(err)) == 0, "zeroes beside the pages: %s", err);
	snap_file_close(f);
	path_of(z, sizeof(z), "fifo");
	ck_assert_int_eq(mkfifo(z, 0600), 0);
	expect_refused(z, "not a regular file", "a FIFO");
	chain_free(&c);
}
END_TEST

/*
 * A file whose page area the file system keeps no holes in (a copy that
 * filled them): taken as it is, and refused once a byte outside the
 * listed pages is not zero.
 */
START_TEST(no_holes_still_checked)
{
	struct snap_file *f;
	char src[256], full[256], cmd[600], err[512];
	struct chain c;

	chain_make(&c, 61);
	path_of(src, sizeof(src), "s1");
	path_of(full, sizeof(full), "filled");
	snprintf(cmd, sizeof(cmd), "cp --sparse=never '%s' '%s'", src, full);
	ck_assert_int_eq(system(cmd), 0);
	ck_assert_msg(snap_file_open(full, &f, err, sizeof(err)) == 0, "a copy without holes: %s", err);
	flip(full, f->regions[1].data_off + (3u << 20) + 5);
	snap_file_close(f);
	expect_refused(full, "where the index lists no page", "a copy without holes, a byte set in the padding");
	chain_free(&c);
}
END_TEST

static long maxrss_kib(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_maxrss;
}

/*
 * A small sparse file whose header claims a 64 GiB region and a 512 MiB
 * index of zeroes, every hash right: refused at its first run, before
 * anything the size of the index is allocated or read.
 */
START_TEST(huge_claimed_index_refused_cheaply)
{
	static uint8_t zero[1 << 20];
	struct snap_header *h;
	struct snap_region *reg;
	struct snap_trailer t = { 0 };
	EVP_MD_CTX *ctx = EVP_MD_CTX_new();
	char src[256], big[256];
	struct chain c;
	struct stat st;
	uint8_t *hdr;
	uint64_t i, off;
	long rss0;
	int fd;

	chain_make(&c, 71);
	path_of(src, sizeof(src), "s0");
	path_of(big, sizeof(big), "big");
	fd = open(src, O_RDONLY);
	ck_assert_int_eq(fstat(fd, &st), 0);
	hdr = malloc(st.st_size);
	ck_assert_int_eq(pread(fd, hdr, st.st_size, 0), st.st_size);
	close(fd);
	h = (struct snap_header *)hdr;
	reg = (struct snap_region *)(hdr + sizeof(*h));
	reg[2].size = 64ull << 30;
	off = reg[2].data_off + reg[2].size;
	h->data_len = off - h->data_off;
	h->index_off = off;
	h->dev_len = 0;
	h->nr_runs = (512u << 20) / sizeof(struct snap_run);
	h->data_pages = h->zero_pages = 0;
	h->index_len = h->nr_runs * sizeof(struct snap_run);
	ck_assert_int_eq(EVP_DigestInit_ex(ctx, EVP_sha256(), NULL), 1);
	for (i = 0; i < h->index_len; i += sizeof(zero))
		ck_assert_int_eq(EVP_DigestUpdate(ctx, zero, sizeof(zero)), 1);
	ck_assert_int_eq(EVP_DigestFinal_ex(ctx, h->index_sha, NULL), 1);
	EVP_MD_CTX_free(ctx);
	memcpy(t.magic, SNAP_TRAILER_MAGIC, sizeof(t.magic));
	t.version = SNAP_VERSION;
	t.header_len = h->header_len;
	t.index_off = h->index_off;
	t.index_len = h->index_len;
	t.file_len = h->index_off + h->index_len + sizeof(t);
	sha(hdr, h->header_len, t.id);
	sha(&t, offsetof(struct snap_trailer, sha), t.sha);
	fd = open(big, O_WRONLY | O_CREAT | O_EXCL, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(pwrite(fd, hdr, h->header_len, 0), (ssize_t)h->header_len);
	ck_assert_int_eq(pwrite(fd, &t, sizeof(t), (off_t)(t.file_len - sizeof(t))), (ssize_t)sizeof(t));
	close(fd);
	free(hdr);
	rss0 = maxrss_kib();
	expect_refused(big, "index: run 0 (region 0, pages 0+0) outside its region", "a 512 MiB index of zeroes");
	ck_assert_msg(maxrss_kib() < rss0 + 128 * 1024, "opening it took %ld KiB more at its peak",
		      maxrss_kib() - rss0);
	unlink(big);
	chain_free(&c);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("snapfile");
	TCase *tc = tcase_create("files");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, chain_round_trip);
	tcase_add_test(tc, devices_in_two_parts);
	tcase_add_test(tc, allocated_size);
	tcase_add_test(tc, cut_at_every_boundary);
	tcase_add_test(tc, flipped_byte_in_every_part);
	tcase_add_test(tc, older_copy_damaged_found_by_verify);
	tcase_add_test(tc, chains_that_do_not_add_up);
	tcase_add_test(tc, write_errors_leave_nothing);
	tcase_add_test(tc, file_too_large);
	tcase_add_test(tc, never_over_a_file);
	tcase_add_test(tc, sealed_damage_refused);
	tcase_add_test(tc, stale_copies_never_come_back);
	tcase_add_test(tc, page_changed_as_written);
	tcase_add_test(tc, zeroes_beside_pages_and_fifos);
	tcase_add_test(tc, no_holes_still_checked);
	tcase_add_test(tc, huge_claimed_index_refused_cheaply);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
