// SPDX-License-Identifier: MIT
/*
 * The fuzzer's seed corpus and regression inputs, recorded:
 *
 *   build/tests/record-seeds tests/fuzz
 *
 * writes seeds/NAME.bin (valid streams) and regress/NAME.bin (one stream a
 * defect of issue 10, each refused for its own reason: test-stream's table
 * says which).  The seeds come from the engine's own source, migrating a
 * VM with the layout of migrate-util.h's guest (KVM, no vCPU run), with
 * and without page hashes; one more is built with the encoder to have
 * several passes, pages sent again and a page zeroed after its data.  The
 * regressions are seeds with one thing changed and END's checksum made
 * right again, so the decoder must find the change itself.  Rerun when the
 * format changes; the streams differ from run to run (vCPU state, TSC).
 *
 *   build/tests/record-seeds tests/fuzz sealed
 *
 * writes only seeds/sealed.bin and seeds/sealed-encrypted.bin: seeds/
 * hashed.bin in sealed records (migrate-util.h's fake_seal(), the
 * engine's own channel), which the fuzzer opens with the same fixed key:
 * the framing of a session's records, fuzzed (no KVM needed).
 *
 *   build/tests/record-seeds tests/fuzz zstd
 *
 * writes only seeds/zstd.bin: seeds/hashed.bin with every second DATA
 * record compressed (DATA_Z), as migrate-util.h's fake_zip() makes it.
 */
#include <errno.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include "migrate-util.h"
#include "source.h"

static const char *dir;

static void die(const char *what, int ret)
{
	fprintf(stderr, "record-seeds: %s: %s\n", what, strerror(ret < 0 ? -ret : ret));
	exit(1);
}

static void put_file(const char *sub, const char *name, const uint8_t *buf, size_t len)
{
	char path[4096];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s/%s", dir, sub, name);
	f = fopen(path, "wb");
	if (!f || fwrite(buf, 1, len, f) != len || fclose(f))
		die(path, errno);
	printf("%s: %zu bytes\n", path, len);
}

/*
 * A vCPU's whole state, its MSRs those every x86 KVM has (the TSC,
 * SYSENTER's, PAT, SYSCALL's, kvmclock's): seeds a destination on another
 * host, whose KVM lists other MSRs beside them, still takes.
 */
static int save(void *ctx, unsigned int i, struct mig_vcpu_state *st)
{
	static const uint32_t common[] = { 0x10, 0x174, 0x175, 0x176, 0x277, 0xc0000081, 0xc0000082, 0xc0000083,
					   0xc0000084, 0xc0000102, 0x4b564d00, 0x4b564d01 };
	struct kvmdirty_vcpu **v = ctx;
	unsigned int k, n = 0, c;
	int ret = mig_vcpu_save_kvm(kvmdirty_vcpu_fd(v[i]), st);

	for (k = 0; ret == 0 && k < st->nr_msrs; k++) {
		for (c = 0; c < sizeof(common) / sizeof(common[0]) && common[c] != st->msrs[k].index; c++)
			;
		if (c < sizeof(common) / sizeof(common[0]))
			st->msrs[n++] = st->msrs[k];
	}
	if (ret == 0) {
		memset(st->msrs + n, 0, (st->nr_msrs - n) * sizeof(st->msrs[0]));
		st->nr_msrs = n;
	}
	return ret;
}

static void nothing(void *ctx)
{
	(void)ctx;
}

static const struct mig_guest_ops ops = { .vcpu_save = save, .pause = nothing, .resume = nothing };

/* One migration of g into memory. */
static struct recorder record(const struct mig_guest *g, bool verify)
{
	struct mig_send_opts o = { .downtime_ms = 50, .max_passes = 4, .timeout_ms = 10000,
				   .peer_timeout_ms = 10000, .verify = verify };
	struct recorder r = { 0 };
	struct mig_result res;
	char err[512];
	pthread_t th;
	void *ok;
	int sv[2], ret;

	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		die("socketpair", errno);
	r.fd = sv[1];
	pthread_create(&th, NULL, recorder_run, &r);
	ret = mig_send(g, sv[0], &o, &res, err, sizeof(err));
	close(sv[0]);
	pthread_join(th, &ok);
	close(sv[1]);
	if (ret || !ok) {
		fprintf(stderr, "record-seeds: recording: %s\n", ret ? err : "recorder failed");
		exit(1);
	}
	return r;
}

/* Several passes, pages sent again, a page zeroed after its data: what pre-copy of a busy guest sends. */
static struct recorder synthesize(const struct mig_guest *g)
{
	static uint8_t page[MIG_PAGE_SIZE];
	struct recorder r = { 0 };
	struct mig_encoder e;
	struct mig_header h;
	struct mig_record rec;
	struct mig_vcpu_state st;
	uint64_t hash;
	unsigned int i;

#define EMIT(p, n)                                                  \
	do {                                                        \
		r.buf = realloc(r.buf, r.len + (n));                \
		memcpy(r.buf + r.len, (p), (n));                    \
		r.len += (n);                                       \
	} while (0)
#define DATA(region, pg)                                                        \
	do {                                                                    \
		memset(page, 0x40 + (int)((region) * 16 + (pg)), sizeof(page)); \
		hash = mig_page_hash(page);                                     \
		rec = mig_encode_data(&e, region, pg, 1);                      \
		EMIT(&rec, sizeof(rec));                                        \
		EMIT(&hash, sizeof(hash));                                      \
		EMIT(page, sizeof(page));                                       \
	} while (0)
	mig_encode_header(&e, &h, fake_layout, FAKE_NR_REGIONS, FAKE_NR_VCPUS, MIG_F_PAGE_HASH);
	EMIT(&h, sizeof(h));
	EMIT(fake_layout, sizeof(fake_layout));
	for (i = 0; i < 16; i += 2)
		DATA(0, i);
	rec = mig_encode_zero(&e, 0, 1, 1);
	EMIT(&rec, sizeof(rec));
	for (i = 3; i < 16; i += 2) {
		rec = mig_encode_zero(&e, 0, i, 1);
		EMIT(&rec, sizeof(rec));
	}
	rec = mig_encode_zero(&e, 1, 0, 8);
	EMIT(&rec, sizeof(rec));
	/* the devices' state given before the pause: none, so a guest without devices takes it */
	rec = mig_encode_devices_live(&e, NULL, 0);
	EMIT(&rec, sizeof(rec));
	rec = mig_encode_pass(&e, 1);
	EMIT(&rec, sizeof(rec));
	DATA(1, 3);
	DATA(0, 2);
	rec = mig_encode_pass(&e, 2);
	EMIT(&rec, sizeof(rec));
	rec = mig_encode_zero(&e, 0, 2, 1);
	EMIT(&rec, sizeof(rec));
	DATA(1, 7);
	for (i = 0; i < FAKE_NR_VCPUS; i++) {
		if (g->ops->vcpu_save(g->ctx, i, &st))
			die("vCPU state", EIO);
		rec = mig_encode_vcpu(&e, i, &st);
		EMIT(&rec, sizeof(rec));
		EMIT(&st, sizeof(st));
	}
	{
		struct mig_vm_state vm = { .parts = MIG_VMS_CLOCK, .clock.clock = 123456789 };

		rec = mig_encode_vm(&e, &vm);
		EMIT(&rec, sizeof(rec));
		EMIT(&vm, sizeof(vm));
	}
	rec = mig_encode_devices(&e, NULL, 0);
	EMIT(&rec, sizeof(rec));
	rec = mig_encode_end(&e);
	EMIT(&rec, sizeof(rec));
	return r;
#undef DATA
#undef EMIT
}

/* ---- regressions: a seed with one thing changed ---- */

struct find {
	uint32_t kind;
	size_t nth;
	size_t off, next; /* the record's offset, and the next record's */
	bool found;
};

static int find_one(size_t off, const struct mig_record *rec, void *opaque)
{
	struct find *f = opaque;

	if (f->found) {
		f->next = off;
		return 1;
	}
	if (rec->kind == f->kind && !f->nth--) {
		f->off = off;
		f->found = true;
	}
	return 0;
}

static struct find find(const struct recorder *s, uint32_t kind, size_t nth)
{
	struct find f = { .kind = kind, .nth = nth };

	mig_stream_walk(s->buf, s->len, find_one, &f, NULL);
	if (!f.found || !f.next)
		die("a record to change", ENOENT);
	return f;
}

static void patch(const struct recorder *s, const char *name, size_t off, const void *bytes, size_t n)
{
	uint8_t *b = malloc(s->len);

	memcpy(b, s->buf, s->len);
	memcpy(b + off, bytes, n);
	mig_stream_reseal(b, s->len);
	put_file("regress", name, b, s->len);
	free(b);
}

/* The stream with [from, to) cut out, resealed. */
static void cut(const struct recorder *s, const char *name, size_t from, size_t to)
{
	uint8_t *b = malloc(s->len);

	memcpy(b, s->buf, from);
	memcpy(b + from, s->buf + to, s->len - to);
	if (mig_stream_reseal(b, s->len - (to - from)))
		die(name, EPROTO);
	put_file("regress", name, b, s->len - (to - from));
	free(b);
}

static void regressions(const struct recorder *hashed, const struct recorder *plain)
{
	size_t end, vcpu0, first;
	struct find f;
	uint32_t u32;
	uint64_t u64;
	uint8_t *b;

	/* 3: a stream without some pages (the seeds send every page once) */
	f = find(hashed, MIG_DATA, 0);
	cut(hashed, "3-data-dropped.bin", f.off, f.next);
	f = find(hashed, MIG_ZERO, 0);
	cut(hashed, "3-zero-dropped.bin", f.off, f.next);
	first = sizeof(struct mig_header) + sizeof(fake_layout);
	vcpu0 = find(plain, MIG_VCPU, 0).off;
	cut(plain, "3-no-pages.bin", first, vcpu0); /* header, regions, VCPU records, END */
	/* 4: fields named as they are */
	u32 = 1;
	patch(hashed, "4-header-reserved.bin", offsetof(struct mig_header, reserved), &u32, 4);
	u64 = 1;
	patch(hashed, "4-vcpu-first.bin", find(hashed, MIG_VCPU, 0).off + offsetof(struct mig_record, first), &u64, 8);
	u32 = 5;
	patch(hashed, "4-digest-kind.bin", find(hashed, MIG_PASS, 0).off + offsetof(struct mig_record, kind), &u32, 4);
	u32 = 1;
	patch(hashed, "4-pass-index.bin", find(hashed, MIG_PASS, 0).off + offsetof(struct mig_record, index), &u32, 4);
	u32 = 1;
	patch(hashed, "4-version-1.bin", offsetof(struct mig_header, version), &u32, 4);
	u32 = 2;
	patch(hashed, "4-version-2.bin", offsetof(struct mig_header, version), &u32, 4);
	u32 = 3;
	patch(hashed, "4-version-3.bin", offsetof(struct mig_header, version), &u32, 4);
	/* 5: a vCPU state's MSR list out of form: longer than a record holds */
	u32 = MIG_VCPU_MSRS + 1;
	patch(hashed, "5-nr-msrs.bin",
	      find(hashed, MIG_VCPU, 1).off + sizeof(struct mig_record) + offsetof(struct mig_vcpu_state, nr_msrs), &u32,
	      4);
	/* 6: bytes after END; a stream that ends before END */
	b = malloc(hashed->len + 8);
	memcpy(b, hashed->buf, hashed->len);
	memset(b + hashed->len, 0, 8);
	put_file("regress", "6-after-end.bin", b, hashed->len + 8);
	free(b);
	mig_stream_walk(hashed->buf, hashed->len, NULL, NULL, &end);
	put_file("regress", "6-ends-early.bin", hashed->buf, end - sizeof(struct mig_record));
}

/* seeds/hashed.bin, read whole. */
static uint8_t *hashed_seed(size_t *ret_len)
{
	char path[4096];
	uint8_t *plain = NULL;
	size_t len = 0, n;
	FILE *f;

	snprintf(path, sizeof(path), "%s/seeds/hashed.bin", dir);
	f = fopen(path, "rb");
	if (!f)
		die(path, errno);
	do {
		plain = realloc(plain, len + 65536);
		n = fread(plain + len, 1, 65536, f);
		len += n;
	} while (n);
	fclose(f);
	*ret_len = len;
	return plain;
}

/* hashed.bin with every second DATA record compressed (DATA_Z, migrate-util.h's fake_zip()). */
static void zstd_seed(void)
{
	size_t len, zlen;
	uint8_t *plain = hashed_seed(&len), *z = fake_zip(plain, len, FAKE_ZIP_OK, &zlen);

	if (!z)
		die("compressing hashed.bin", EIO);
	put_file("seeds", "zstd.bin", z, zlen);
	free(z);
	free(plain);
}

/* hashed.bin in sealed records, both modes, records of 8 KiB and 16 KiB. */
static void sealed_seeds(void)
{
	size_t len, slen;
	uint8_t *plain = hashed_seed(&len), *sealed;

	sealed = fake_seal(plain, len, false, 8192, &slen);
	if (!sealed)
		die("sealing hashed.bin", EIO);
	put_file("seeds", "sealed.bin", sealed, slen);
	free(sealed);
	sealed = fake_seal(plain, len, true, 16384, &slen);
	if (!sealed)
		die("sealing hashed.bin", EIO);
	put_file("seeds", "sealed-encrypted.bin", sealed, slen);
	free(sealed);
	free(plain);
}

int main(int argc, char **argv)
{
	struct kvmdirty_tracker_opts to = { .mode = KVMDIRTY_MODE_CLEAR_LOG };
	struct kvmdirty_vcpu *vcpu[FAKE_NR_VCPUS];
	struct recorder hashed, plain, passes;
	struct kvmdirty_tracker *t;
	struct kvmdirty_vm *vm;
	struct mig_guest g = { .nr_vcpus = FAKE_NR_VCPUS, .ops = &ops, .ctx = vcpu };
	unsigned int i;
	uint64_t k;
	int ret;

	if (argc != 2 && !(argc == 3 && (!strcmp(argv[2], "sealed") || !strcmp(argv[2], "zstd")))) {
		fprintf(stderr, "usage: record-seeds DIR (tests/fuzz) [sealed|zstd]\n");
		return 2;
	}
	dir = argv[1];
	if (argc == 3) {
		if (!strcmp(argv[2], "zstd"))
			zstd_seed();
		else
			sealed_seeds();
		return 0;
	}
	if ((ret = kvmdirty_vm_new(&vm)) < 0 || (ret = kvmdirty_tracker_new(vm, &to, &t)) < 0)
		die("a VM and its tracker", ret);
	for (i = 0; i < FAKE_NR_REGIONS; i++) {
		uint8_t *p = mmap(NULL, fake_layout[i].size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		if (p == MAP_FAILED)
			die("memory", errno);
		/* every third page zero, the others a pattern of their own */
		for (k = 0; k < fake_layout[i].size / MIG_PAGE_SIZE; k++)
			if (k % 3 != 1)
				memset(p + k * MIG_PAGE_SIZE, (int)(k * 7 + i + 1), MIG_PAGE_SIZE);
		ret = kvmdirty_region_add(vm, fake_layout[i].gpa, fake_layout[i].size, p, 0, NULL);
		if (ret < 0)
			die("a region", ret);
	}
	for (i = 0; i < FAKE_NR_VCPUS; i++)
		if ((ret = kvmdirty_vcpu_create(vm, i, &vcpu[i])) < 0)
			die("a vCPU", ret);
	g.tracker = t;
	if ((ret = mig_guest_set_regions(&g, vm)) < 0)
		die("regions", ret);
	for (i = 0; i < FAKE_NR_REGIONS; i++)
		if (g.regions[i].gpa != fake_layout[i].gpa)
			die("regions in the layout's order", EINVAL);
	hashed = record(&g, true);
	plain = record(&g, false);
	passes = synthesize(&g);
	put_file("seeds", "hashed.bin", hashed.buf, hashed.len);
	put_file("seeds", "plain.bin", plain.buf, plain.len);
	put_file("seeds", "passes.bin", passes.buf, passes.len);
	regressions(&hashed, &plain);
	sealed_seeds();
	mig_guest_release(&g);
	kvmdirty_vm_free(vm);
	return 0;
}
