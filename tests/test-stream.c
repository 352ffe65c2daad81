// SPDX-License-Identifier: MIT
/*
 * The migration stream without KVM: the page hash (both kernels, every
 * bit, every position), the decoder field by field, and the destination
 * over streams in memory into a guest in plain memory: the fuzzer's seeds
 * must be accepted and land where they say, its regression inputs (one a
 * defect of issue 10) refused for their own reason.
 *
 *   test-stream DIR    DIR holds seeds/ and regress/ (tests/fuzz)
 */
#include <dirent.h>
#include <inttypes.h>
#include <stdlib.h>

#include "migrate-util.h"
#include "rng.h"
#include "test-util.h"

#define PAGE ((uint64_t)MIG_PAGE_SIZE)

static const char *dir;

static uint8_t *slurp(const char *sub, const char *name, size_t *ret_len)
{
	char path[4096];
	uint8_t *buf = NULL;
	size_t len = 0, n;
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s/%s", dir, sub, name);
	f = fopen(path, "rb");
	ck_assert_msg(f, "%s: %s", path, strerror(errno));
	do {
		buf = realloc(buf, len + 65536);
		n = fread(buf + len, 1, 65536, f);
		len += n;
	} while (n);
	fclose(f);
	*ret_len = len;
	return buf;
}

static void random_page(uint8_t *p, uint64_t *rng)
{
	uint64_t *w = (uint64_t *)p;
	size_t i;

	for (i = 0; i < PAGE / 8; i++)
		w[i] = xorshift64(rng);
}

/* ---- the page hash ---- */

START_TEST(hash_kernels_agree)
{
	static uint8_t page[PAGE];
	uint64_t rng = 0x5eed;
	unsigned int i;

	for (i = 0; i < 256; i++) {
		if (i == 1)
			memset(page, 0xff, PAGE);
		else if (i > 1)
			random_page(page, &rng);
		expect(mig_page_hash(page) == mig_page_hash_portable(page), "page %u: 0x%" PRIx64 " vs portable 0x%" PRIx64,
		       i, mig_page_hash(page), mig_page_hash_portable(page));
	}
	memset(page, 0, PAGE);
	ck_assert_uint_eq(mig_zero_page_hash(), mig_page_hash_portable(page));
}
END_TEST

/* mig_page_hash_copy(): the page's hash, and the page copied exactly, from any alignment of the source. */
START_TEST(hash_copy_is_hash_and_copy)
{
	static uint8_t src[PAGE + 64], dst[PAGE];
	uint64_t rng = 0xc0b1;
	unsigned int i;

	for (i = 0; i < 256; i++) {
		uint8_t *page = src + (i % 8) * 8;

		random_page(page, &rng);
		memset(dst, 0xa5, PAGE);
		expect(mig_page_hash_copy(dst, page) == mig_page_hash_portable(page),
		       "page %u: hash_copy 0x%" PRIx64 " vs portable 0x%" PRIx64, i, mig_page_hash_copy(dst, page),
		       mig_page_hash_portable(page));
		expect(!memcmp(dst, page, PAGE), "page %u: the copy differs", i);
	}
}
END_TEST

/*
 * The hash is part of the format: a stream recorded by another build must
 * still check.  These values were taken from the first version 2 code.
 */
START_TEST(hash_known_answers)
{
	static uint8_t page[PAGE];
	size_t i;

	ck_assert_uint_eq(mig_page_hash(page), 0x3eaebe4b61bb99e1ull);
	for (i = 0; i < PAGE; i++)
		page[i] = (uint8_t)(i * 31 + 7);
	ck_assert_uint_eq(mig_page_hash(page), 0x80960e8fff578217ull);
}
END_TEST

START_TEST(hash_sees_every_bit_and_position)
{
	static uint8_t page[PAGE], other[PAGE];
	uint64_t rng = 0xfeed, h;
	size_t bit, s, t;

	random_page(page, &rng);
	h = mig_page_hash(page);
	for (bit = 0; bit < PAGE * 8; bit++) {
		page[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		expect(mig_page_hash(page) != h, "bit %zu flipped: same hash", bit);
		page[bit / 8] ^= (uint8_t)(1u << (bit % 8));
	}
	/* stripes moved or swapped */
	for (s = 0; s < PAGE / 64; s++) {
		t = (s * 37 + 11) % (PAGE / 64);
		if (t == s)
			continue;
		memcpy(other, page, PAGE);
		memcpy(other + s * 64, page + t * 64, 64);
		memcpy(other + t * 64, page + s * 64, 64);
		expect(mig_page_hash(other) != h, "stripes %zu and %zu swapped: same hash", s, t);
	}
	/* two words of one stripe swapped */
	memcpy(other, page, PAGE);
	memcpy(other + 8, page + 16, 8);
	memcpy(other + 16, page + 8, 8);
	ck_assert_uint_ne(mig_page_hash(other), h);
}
END_TEST

/* ---- the decoder, field by field ---- */

static const struct mig_region layout[] = { { 0, 16 * PAGE }, { 4ull << 30, 8 * PAGE } };

struct field_case {
	struct mig_record rec;
	const char *refusal; /* NULL: accepted */
};

START_TEST(decode_record_fields)
{
	static const struct field_case cases[] = {
		{ .rec = { .kind = MIG_DATA, .index = 1, .first = 7, .count = 1 } },
		{ .rec = { .kind = MIG_DATA, .index = 2, .first = 0, .count = 1 }, .refusal = "record 0 (DATA).index" },
		{ .rec = { .kind = MIG_DATA, .index = 0, .first = 0, .count = 0 }, .refusal = "(DATA).count: 0 pages" },
		{ .rec = { .kind = MIG_DATA, .index = 0, .first = 16, .count = 1 }, .refusal = "(DATA).first: page 16" },
		{ .rec = { .kind = MIG_DATA, .index = 0, .first = 15, .count = 2 }, .refusal = "(DATA).count: pages [15, +2)" },
		{ .rec = { .kind = MIG_ZERO, .index = 0, .first = 0, .count = 16 } },
		{ .rec = { .kind = MIG_ZERO, .index = 0, .first = 1, .count = UINT64_MAX }, .refusal = "(ZERO).count" },
		{ .rec = { .kind = MIG_PASS, .first = 1 } },
		{ .rec = { .kind = MIG_PASS, .first = 2 }, .refusal = "(PASS).first: pass 2, expected pass 1" },
		{ .rec = { .kind = MIG_PASS, .index = 3, .first = 1 }, .refusal = "(PASS).index: 3" },
		{ .rec = { .kind = MIG_PASS, .first = 1, .count = 1 }, .refusal = "(PASS).count: 1" },
		{ .rec = { .kind = MIG_VCPU, .index = 1, .count = sizeof(struct mig_vcpu_state) } },
		{ .rec = { .kind = MIG_VCPU, .index = 2, .count = sizeof(struct mig_vcpu_state) },
		  .refusal = "(VCPU).index: vCPU 2, this destination has 2" },
		{ .rec = { .kind = MIG_VCPU, .index = 0, .first = 1, .count = sizeof(struct mig_vcpu_state) },
		  .refusal = "(VCPU).first: 1" },
		{ .rec = { .kind = MIG_VCPU, .index = 0, .count = 8 }, .refusal = "(VCPU).count: 8 bytes" },
		{ .rec = { .kind = MIG_END, .index = 1 }, .refusal = "(END).index: 1" },
		{ .rec = { .kind = MIG_END, .count = 1 }, .refusal = "(END).count: 1" },
		{ .rec = { .kind = MIG_END, .first = 1 }, .refusal = "(END).first: checksum 0x1" },
		{ .rec = { .kind = 5 }, .refusal = "record 0.kind: 5 (DIGEST) belongs to stream version 1" },
		{ .rec = { .kind = 0 }, .refusal = "record 0.kind: 0 is not a record kind" },
	};
	struct mig_decoder d;
	struct mig_encoder e;
	struct mig_header h;
	char err[256];
	size_t i;
	int ret;

	mig_encode_header(&e, &h, layout, 2, 2, 0);
	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct field_case *c = &cases[i];

		mig_decoder_init(&d, layout, 2, 2);
		err[0] = 0;
		ck_assert_int_eq(mig_decode_header(&d, &h, err, sizeof(err)), 0);
		ck_assert_int_eq(mig_decode_regions(&d, layout, err, sizeof(err)), 0);
		ret = mig_decode_record(&d, &c->rec, err, sizeof(err));
		if (!c->refusal)
			ck_assert_msg(ret == 0, "case %zu (%s): refused: %s", i, mig_kind_name(c->rec.kind), err);
		else
			ck_assert_msg(ret == -EPROTO && strstr(err, c->refusal), "case %zu: %d '%s', expected '%s'", i, ret,
				      err, c->refusal);
	}
	/* a vCPU twice; END before the other one */
	mig_decoder_init(&d, layout, 2, 2);
	ck_assert_int_eq(mig_decode_header(&d, &h, err, sizeof(err)), 0);
	ck_assert_int_eq(mig_decode_regions(&d, layout, err, sizeof(err)), 0);
	ck_assert_int_eq(mig_decode_record(&d, &cases[11].rec, err, sizeof(err)), 0);
	ret = mig_decode_record(&d, &cases[11].rec, err, sizeof(err));
	ck_assert_msg(ret == -EPROTO && strstr(err, "record 1 (VCPU).index: vCPU 1 sent twice"), "%s", err);
	{
		struct mig_record end = { .kind = MIG_END, .first = d.sum };

		ret = mig_decode_record(&d, &end, err, sizeof(err));
		ck_assert_msg(ret == -EPROTO && strstr(err, "no VCPU record for vCPU 0"), "%s", err);
	}
}
END_TEST

START_TEST(decode_header_fields)
{
	static const struct {
		size_t off;
		uint32_t value;
		const char *refusal;
	} cases[] = {
		{ offsetof(struct mig_header, magic), 0x4d4d4d4d, "header.magic" },
		{ offsetof(struct mig_header, version), 1, "header.version: 1 (page digests" },
		{ offsetof(struct mig_header, version), 9, "header.version: 9, this destination speaks 4" },
		{ offsetof(struct mig_header, version), 3, "header.version: 3 (a vCPU's registers, XSAVE and TSC only" },
		{ offsetof(struct mig_header, page_size), 2048, "header.page_size: 2048" },
		{ offsetof(struct mig_header, nr_regions), 3, "header.nr_regions: 3" },
		{ offsetof(struct mig_header, nr_vcpus), 4, "header.nr_vcpus: 4" },
		{ offsetof(struct mig_header, flags), 0x10, "header.flags: unknown bits 0x10" },
		{ offsetof(struct mig_header, reserved), 2, "header.reserved: 0x2, must be 0" },
	};
	struct mig_region other[2] = { layout[0], layout[1] };
	struct mig_decoder d;
	struct mig_encoder e;
	struct mig_header h;
	char err[256];
	size_t i;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		mig_encode_header(&e, &h, layout, 2, 2, MIG_F_PAGE_HASH);
		memcpy((uint8_t *)&h + cases[i].off, &cases[i].value, 4);
		mig_decoder_init(&d, layout, 2, 2);
		ck_assert_int_eq(mig_decode_header(&d, &h, err, sizeof(err)), -EPROTO);
		ck_assert_msg(strstr(err, cases[i].refusal), "'%s', expected '%s'", err, cases[i].refusal);
	}
	other[1].size += PAGE;
	mig_encode_header(&e, &h, other, 2, 2, 0);
	mig_decoder_init(&d, layout, 2, 2);
	ck_assert_int_eq(mig_decode_header(&d, &h, err, sizeof(err)), 0);
	ck_assert_int_eq(mig_decode_regions(&d, other, err, sizeof(err)), -EPROTO);
	ck_assert_msg(strstr(err, "region[1].size: 0x9000, this destination has 0x8000"), "%s", err);
}
END_TEST

/* ---- streams in memory: the fuzzer's seeds and regressions ---- */

static const char *const seeds[] = { "hashed.bin", "plain.bin", "passes.bin", "zstd.bin" };

START_TEST(seeds_accepted)
{
	struct fake_guest f;
	char err[256];
	size_t len, used, end;
	uint8_t *buf = slurp("seeds", seeds[_i], &len);
	int ret;

	ck_assert_ok(fake_guest_init(&f));
	ck_assert_int_eq(mig_stream_walk(buf, len, NULL, NULL, &end), 0);
	ck_assert_uint_eq(end, len);
	/* pages hashed on the calling thread, then on the verifier thread */
	ret = fake_receive(&f, buf, len, true, err, sizeof(err), &used);
	ck_assert_msg(ret == 0, "seed %s refused: %s", seeds[_i], err);
	ck_assert_uint_eq(used, len);
	ck_assert_uint_eq(f.loads, FAKE_NR_VCPUS);
	ret = fake_receive(&f, buf, len, false, err, sizeof(err), &used);
	ck_assert_msg(ret == 0, "seed %s refused with a verifier thread: %s", seeds[_i], err);
	fake_guest_free(&f);
	free(buf);
}
END_TEST

/*
 * The fuzzer's post-copy seed (postcopy-seed.py): its stream accepted with
 * two pages left at the source, post-copy's records after END read, none
 * refused without a reason; the same stream without post-copy's consent
 * refused by name (a LEFT the decoder would otherwise take).
 */
START_TEST(postcopy_seed_reaches)
{
	struct fake_guest f;
	char err[256];
	size_t len, used;
	uint8_t *buf = slurp("seeds", "postcopy.bin", &len);
	int ret;

	ck_assert_ok(fake_guest_init(&f));
	ck_assert(len > 8 && !memcmp(buf, FAKE_POSTCOPY_MAGIC, 8));
	ret = fake_receive(&f, buf, len, true, err, sizeof(err), &used);
	ck_assert_msg(ret == 0, "the post-copy seed refused: %s", err);
	ck_assert_uint_eq(f.left, 2);
	ck_assert_uint_eq(f.loads, FAKE_NR_VCPUS);
	/* post-copy's records follow, as fuzz-dest reads them */
	ck_assert_uint_gt(len - used, 4 * sizeof(struct mig_record));
	/* without the magic: a plain stream, whose header's post-copy flag is refused */
	ret = fake_receive(&f, buf + 8, len - 8, true, err, sizeof(err), &used);
	ck_assert_int_eq(ret, -EPROTO);
	ck_assert_msg(strstr(err, "post-copy"), "%s", err);
	fake_guest_free(&f);
	free(buf);
}
END_TEST

/* Where the DEVICES record of a stream is (the walk's callback). */
static int find_devices(size_t off, const struct mig_record *rec, void *opaque)
{
	if (rec->kind == MIG_DEVICES)
		*(size_t *)opaque = off;
	return 0;
}

/*
 * The seed hashed.bin with n bytes of device state (a pattern from seed),
 * resealed: *ret_len bytes, the caller's to free.
 */
static uint8_t *with_devices(size_t n, unsigned int seed, size_t *ret_len)
{
	size_t len, off = 0, k;
	uint8_t *seedbuf = slurp("seeds", "hashed.bin", &len), *b;
	struct mig_record rec = { .kind = MIG_DEVICES, .count = n }, end = { .kind = MIG_END };

	ck_assert_int_eq(mig_stream_walk(seedbuf, len, find_devices, &off, NULL), 0);
	ck_assert_uint_gt(off, 0);
	b = malloc(off + sizeof(rec) + n + sizeof(end));
	ck_assert_ptr_nonnull(b);
	memcpy(b, seedbuf, off);
	memcpy(b + off, &rec, sizeof(rec));
	for (k = 0; k < n; k++)
		b[off + sizeof(rec) + k] = (uint8_t)(k * 131 + seed + (k >> 12));
	memcpy(b + off + sizeof(rec) + n, &end, sizeof(end));
	*ret_len = off + sizeof(rec) + n + sizeof(end);
	ck_assert_int_eq(mig_stream_reseal(b, *ret_len), 0);
	free(seedbuf);
	return b;
}

/*
 * The devices' state crosses whole, of any size up to the bound: 3 MiB
 * arrive byte for byte into a guest with devices.  A guest without them
 * refuses it by name; a load that fails refuses the stream and leaves its
 * vCPUs as they were; a byte of it changed fails END's checksum.
 */
START_TEST(devices_carried)
{
	struct mig_vcpu_state fresh;
	struct fake_guest f;
	size_t len, n = 3u << 20, k, off = 0;
	uint8_t *b = with_devices(n, 7, &len);
	char err[256];
	int ret;

	ck_assert_ok(fake_guest_init(&f));
	f.g.ops = &fake_devices_ops;
	ret = fake_receive(&f, b, len, true, err, sizeof(err), NULL);
	ck_assert_msg(ret == 0, "%s", err);
	ck_assert_uint_eq(f.dev_len, n);
	ck_assert_msg(!memcmp(f.dev, b + len - sizeof(struct mig_record) - n, n), "the devices' state differs");
	/* a load that fails: refused, every vCPU back as it was */
	fake_guest_free(&f);
	ck_assert_ok(fake_guest_init(&f));
	f.g.ops = &fake_devices_ops;
	f.fail_devices = true;
	ret = fake_receive(&f, b, len, true, err, sizeof(err), NULL);
	ck_assert_msg(ret == -EINVAL && strstr(err, "loading the devices' state (3145728 bytes)"), "%d '%s'", ret, err);
	for (k = 0; k < FAKE_NR_VCPUS; k++) {
		fake_fresh((unsigned int)k, &fresh);
		ck_assert_msg(!memcmp(&f.loaded[k], &fresh, sizeof(fresh)), "vCPU %zu keeps the refused stream's state", k);
	}
	fake_guest_free(&f);
	/* no devices here */
	ck_assert_ok(fake_guest_init(&f));
	ret = fake_receive(&f, b, len, true, err, sizeof(err), NULL);
	ck_assert_msg(ret == -EPROTO && strstr(err, "(DEVICES): 3145728 bytes of device state, and this destination's "
						   "guest has no devices"), "%d '%s'", ret, err);
	fake_guest_free(&f);
	/* one byte of it changed */
	ck_assert_ok(fake_guest_init(&f));
	f.g.ops = &fake_devices_ops;
	b[len - sizeof(struct mig_record) - n / 2] ^= 1;
	ret = fake_receive(&f, b, len, true, err, sizeof(err), NULL);
	ck_assert_msg(ret == -EPROTO && strstr(err, "it was corrupted"), "%d '%s'", ret, err);
	ck_assert_uint_eq(f.dev_len, 0);
	fake_guest_free(&f);
	/* past the bound: refused before a byte of it is read */
	ck_assert_int_eq(mig_stream_walk(b, len, find_devices, &off, NULL), 0);
	{
		uint64_t c = MIG_DEVICES_MAX + 1;

		memcpy(b + off + offsetof(struct mig_record, count), &c, sizeof(c));
	}
	ck_assert_ok(fake_guest_init(&f));
	f.g.ops = &fake_devices_ops;
	ret = fake_receive(&f, b, len, true, err, sizeof(err), NULL);
	ck_assert_msg(ret == -EPROTO && strstr(err, "(DEVICES).count: 268435457 bytes of device state, at most"),
		      "%d '%s'", ret, err);
	fake_guest_free(&f);
	free(b);
}
END_TEST

/* Where a stream's first PASS record ends, and its first VCPU record begins (the walk's callback). */
struct marks {
	size_t pass_end, vcpu;
};

static int find_marks(size_t off, const struct mig_record *rec, void *opaque)
{
	struct marks *m = opaque;

	if (rec->kind == MIG_PASS && !m->pass_end)
		m->pass_end = off + sizeof(*rec);
	if (rec->kind == MIG_VCPU && !m->vcpu)
		m->vcpu = off;
	return 0;
}

/* b[0 .. len) with a DEVICES_LIVE record of n bytes (a pattern) put at off, resealed; the caller frees it. */
static uint8_t *with_live(const uint8_t *b, size_t len, size_t at, size_t n, size_t *ret_len)
{
	struct mig_record rec = { .kind = MIG_DEVICES_LIVE, .count = n };
	uint8_t *o = malloc(len + sizeof(rec) + n);
	size_t k;

	ck_assert_ptr_nonnull(o);
	memcpy(o, b, at);
	memcpy(o + at, &rec, sizeof(rec));
	for (k = 0; k < n; k++)
		o[at + sizeof(rec) + k] = (uint8_t)(k * 29 + 5);
	memcpy(o + at + sizeof(rec) + n, b + at, len - at);
	*ret_len = len + sizeof(rec) + n;
	ck_assert_int_eq(mig_stream_reseal(o, *ret_len), 0);
	return o;
}

static int receive_live(const uint8_t *b, size_t len, struct fake_guest *f, const struct mig_guest_ops *ops,
			char *err, size_t elen)
{
	ck_assert_ok(fake_guest_init(f));
	f->g.ops = ops;
	return fake_receive(f, b, len, true, err, elen, NULL);
}

/*
 * The devices' state given before the pause (DEVICES_LIVE, after PASS 1)
 * crosses whole beside the rest and is loaded first, after the stream is
 * complete; a guest without a load for it refuses it by name, as does a
 * destination given one after the pause began or twice; a load of it that
 * fails refuses the stream and leaves the vCPUs as they were.
 */
START_TEST(devices_live_carried)
{
	size_t len, llen, blen, n = 1u << 20, k;
	uint8_t *d = with_devices(4096, 3, &len), *b, *bad;
	struct mig_vcpu_state fresh;
	struct fake_guest f;
	struct marks m = { 0 };
	char err[256];
	int ret;

	ck_assert_int_eq(mig_stream_walk(d, len, find_marks, &m, NULL), 0);
	ck_assert_msg(m.pass_end > 0 && m.vcpu >= m.pass_end, "PASS ends at %zu, VCPU at %zu", m.pass_end, m.vcpu);
	b = with_live(d, len, m.pass_end, n, &llen);
	ret = receive_live(b, llen, &f, &fake_live_ops, err, sizeof(err));
	ck_assert_msg(ret == 0, "%s", err);
	ck_assert_str_eq(f.order, "LD");
	ck_assert_uint_eq(f.dev_live_len, n);
	ck_assert_uint_eq(f.dev_len, 4096);
	for (k = 0; k < n; k++)
		ck_assert_msg(((uint8_t *)f.dev_live)[k] == (uint8_t)(k * 29 + 5), "byte %zu of the live state", k);
	fake_guest_free(&f);
	/* a guest with devices but no load for the live part */
	ret = receive_live(b, llen, &f, &fake_devices_ops, err, sizeof(err));
	ck_assert_msg(ret == -EPROTO && strstr(err, "(DEVICES_LIVE): 1048576 bytes of device state, and this "
						   "destination's guest has no devices"), "%d '%s'", ret, err);
	fake_guest_free(&f);
	/* a load of it that fails: refused, no vCPU keeps the stream's state */
	ck_assert_ok(fake_guest_init(&f));
	f.g.ops = &fake_live_ops;
	f.fail_live = true;
	ret = fake_receive(&f, b, llen, true, err, sizeof(err), NULL);
	ck_assert_msg(ret == -EINVAL && strstr(err, "given before the pause (1048576 bytes)"), "%d '%s'", ret, err);
	for (k = 0; k < FAKE_NR_VCPUS; k++) {
		fake_fresh((unsigned int)k, &fresh);
		ck_assert_msg(!memcmp(&f.loaded[k], &fresh, sizeof(fresh)), "vCPU %zu keeps the refused stream's state", k);
	}
	ck_assert_str_eq(f.order, "");
	fake_guest_free(&f);
	/*
	 * A stream whose live part loaded and whose rest did not, then one
	 * with none: the second tells the guest so (0 bytes), and nothing of
	 * the refused stream's live part stays.
	 */
	ck_assert_ok(fake_guest_init(&f));
	f.g.ops = &fake_live_ops;
	f.fail_devices = true;
	ret = fake_receive(&f, b, llen, true, err, sizeof(err), NULL);
	ck_assert_msg(ret == -EINVAL && f.dev_live_len == n, "%d '%s', live %zu", ret, err, f.dev_live_len);
	ret = fake_receive(&f, d, len, true, err, sizeof(err), NULL);
	ck_assert_msg(ret == 0, "%s", err);
	ck_assert_msg(f.dev_live_len == 0, "the refused stream's live part stays: %zu bytes", f.dev_live_len);
	ck_assert_str_eq(f.order, "LDLD");
	fake_guest_free(&f);
	/* twice */
	bad = with_live(b, llen, m.pass_end, 16, &blen);
	ret = receive_live(bad, blen, &f, &fake_live_ops, err, sizeof(err));
	ck_assert_msg(ret == -EPROTO && strstr(err, "DEVICES_LIVE sent twice"), "%d '%s'", ret, err);
	fake_guest_free(&f);
	free(bad);
	/* after the pause began: the first VCPU record */
	bad = with_live(d, len, m.vcpu + sizeof(struct mig_record) + sizeof(struct mig_vcpu_state), 16, &blen);
	ret = receive_live(bad, blen, &f, &fake_live_ops, err, sizeof(err));
	ck_assert_msg(ret == -EPROTO && strstr(err, "(DEVICES_LIVE).kind: DEVICES_LIVE after a VCPU record"), "%d '%s'",
		      ret, err);
	fake_guest_free(&f);
	free(bad);
	/* after the VM record, and after DEVICES (both after the VCPU records: moved to END's place) */
	bad = with_live(d, len, len - sizeof(struct mig_record), 16, &blen);
	ret = receive_live(bad, blen, &f, &fake_live_ops, err, sizeof(err));
	ck_assert_msg(ret == -EPROTO && strstr(err, "DEVICES_LIVE after a DEVICES record"), "%d '%s'", ret, err);
	fake_guest_free(&f);
	free(bad);
	free(b);
	free(d);
}
END_TEST

/*
 * The bound holds for both parts together: DEVICES after a DEVICES_LIVE of
 * MIG_DEVICES_MAX - 10 bytes may bring 10, not 11; and DEVICES_LIVE comes
 * before any record of the pause, a VM record too (the decoder alone: no
 * payload read).
 */
START_TEST(devices_bound_together)
{
	struct mig_record live = { .kind = MIG_DEVICES_LIVE, .count = MIG_DEVICES_MAX - 10 },
			  dev = { .kind = MIG_DEVICES, .count = 11 }, vm = { .kind = MIG_VM };
	struct mig_decoder dec;
	char err[256];
	int ret;

	mig_decoder_init(&dec, NULL, 0, 1);
	ck_assert_int_eq(mig_decode_record(&dec, &live, err, sizeof(err)), 0);
	dec.vm_seen = true; /* as if the VCPU and VM records came */
	dec.stopped = true;
	ret = mig_decode_record(&dec, &dev, err, sizeof(err));
	ck_assert_msg(ret == -EPROTO && strstr(err, "(DEVICES).count: 11 bytes of device state, at most 268435456 with "
						   "DEVICES_LIVE's (10 left)"), "%d '%s'", ret, err);
	dev.count = 10;
	ret = mig_decode_record(&dec, &dev, err, sizeof(err));
	ck_assert_msg(ret == 0, "%s", err);
	/* VM and DEVICES before any VCPU record, then DEVICES_LIVE: the pause's records came, refused */
	mig_decoder_init(&dec, NULL, 0, 1);
	vm.count = sizeof(struct mig_vm_state);
	ck_assert_int_eq(mig_decode_record(&dec, &vm, err, sizeof(err)), 0);
	ret = mig_decode_record(&dec, &live, err, sizeof(err));
	ck_assert_msg(ret == -EPROTO && strstr(err, "DEVICES_LIVE after a VM record"), "%d '%s'", ret, err);
}
END_TEST

/*
 * A refusal leaves nothing behind: a stream refused because vCPU 1's state
 * would not load leaves vCPU 0 as it was before the stream (loaded back),
 * and every page the stream made non-zero marked written, so that a ZERO
 * record of the next stream clears it rather than leaving it to show
 * through.  Then the same guest takes the stream whole.
 */
START_TEST(refusal_leaves_nothing)
{
	struct fake_guest f;
	struct mig_vcpu_state fresh;
	char err[256];
	size_t len;
	uint8_t *buf = slurp("seeds", "hashed.bin", &len);
	unsigned int r, i;
	uint64_t p, nonzero = 0;
	int ret;

	ck_assert_ok(fake_guest_init(&f));
	ck_assert_ok(mig_guest_zero_known(&f.g));
	f.fail_load = 1;
	ret = fake_receive(&f, buf, len, true, err, sizeof(err), NULL);
	ck_assert_msg(ret == -EIO && strstr(err, "loading vCPU 1 state"), "%d '%s'", ret, err);
	for (i = 0; i < FAKE_NR_VCPUS; i++) {
		fake_fresh(i, &fresh);
		ck_assert_msg(!memcmp(&f.loaded[i], &fresh, sizeof(fresh)),
			      "vCPU %u keeps state from the refused stream (rip 0x%llx)", i,
			      (unsigned long long)f.loaded[i].regs.rip);
	}
	for (r = 0; r < FAKE_NR_REGIONS; r++) {
		const uint8_t *m = f.g.regions[r].hva;

		for (p = 0; p < f.g.regions[r].size / PAGE; p++) {
			bool zero = true;
			size_t k;

			for (k = 0; k < PAGE && zero; k++)
				zero = !m[p * PAGE + k];
			nonzero += !zero;
			ck_assert_msg(zero || !kvmdirty_bitmap_is_clear(f.g.regions[r].written, p, p + 1),
				      "region %u page %" PRIu64 ": written by the refused stream, not marked", r, p);
		}
	}
	ck_assert_msg(nonzero > 0, "the refused stream wrote no page: the check sees nothing");
	ret = fake_receive(&f, buf, len, true, err, sizeof(err), NULL);
	ck_assert_msg(ret == 0 && f.loads == FAKE_NR_VCPUS, "the whole stream after the refusal: %d '%s'", ret, err);
	mig_guest_release(&f.g);
	fake_guest_free(&f);
	free(buf);
}
END_TEST

/*
 * The sealed seeds (hashed.bin in sealed records, both modes): accepted,
 * and the guest they leave is the one hashed.bin leaves; a flipped byte
 * in any record is refused naming authentication, with a guest never
 * loaded.
 */
START_TEST(sealed_seeds_accepted)
{
	static const char *const sealed[] = { "sealed.bin", "sealed-encrypted.bin" };
	struct fake_guest f, want;
	char err[256];
	size_t len, plen, used;
	uint8_t *buf = slurp("seeds", sealed[_i], &len), *plain = slurp("seeds", "hashed.bin", &plen);
	unsigned int r;
	size_t at;
	int ret;

	ck_assert_ok(fake_guest_init(&f));
	ck_assert_ok(fake_guest_init(&want));
	ck_assert_msg(fake_receive(&want, plain, plen, true, err, sizeof(err), NULL) == 0, "%s", err);
	ret = fake_receive(&f, buf, len, true, err, sizeof(err), &used);
	ck_assert_msg(ret == 0, "seed %s refused: %s", sealed[_i], err);
	ck_assert_uint_eq(used, len);
	ck_assert_uint_eq(f.loads, FAKE_NR_VCPUS);
	for (r = 0; r < FAKE_NR_REGIONS; r++)
		ck_assert(!memcmp(f.g.regions[r].hva, want.g.regions[r].hva, f.g.regions[r].size));
	ck_assert(!memcmp(f.loaded, want.loaded, sizeof(f.loaded)));
	/* a byte flipped anywhere after the magic: refused, naming authentication (or the cut it makes) */
	for (at = FAKE_SEALED_HDR; at < len; at += 997) {
		buf[at] ^= 0x20;
		ret = fake_receive(&f, buf, len, true, err, sizeof(err), NULL);
		buf[at] ^= 0x20;
		expect(ret < 0 && f.loads == 0 && strstr(err, "authentication") && !strchr(err, '\n'),
		       "%s, byte %zu flipped: %d '%s', %u vCPUs loaded", sealed[_i], at, ret, err, f.loads);
	}
	fake_guest_free(&f);
	fake_guest_free(&want);
	free(buf);
	free(plain);
}
END_TEST

/* passes.bin: pages sent twice, one zeroed after its data; what lands is the last word on each. */
START_TEST(seed_pages_land)
{
	static uint8_t want[PAGE];
	struct fake_guest f;
	char err[256];
	size_t len;
	uint8_t *buf = slurp("seeds", "passes.bin", &len);
	unsigned int r;
	uint64_t k;

	ck_assert_ok(fake_guest_init(&f));
	for (r = 0; r < FAKE_NR_REGIONS; r++) /* what a failed earlier stream could have left */
		memset(f.g.regions[r].hva, 0xee, f.g.regions[r].size);
	ck_assert_msg(fake_receive(&f, buf, len, false, err, sizeof(err), NULL) == 0, "%s", err);
	for (r = 0; r < FAKE_NR_REGIONS; r++) {
		for (k = 0; k < f.g.regions[r].size / PAGE; k++) {
			bool data = r == 0 ? k % 2 == 0 && k != 2 : k == 3 || k == 7;

			memset(want, data ? 0x40 + (int)(r * 16 + k) : 0, PAGE);
			expect(!memcmp((uint8_t *)f.g.regions[r].hva + k * PAGE, want, PAGE), "region %u page %" PRIu64
			       " holds 0x%02x, expected 0x%02x", r, k, ((uint8_t *)f.g.regions[r].hva)[k * PAGE], want[0]);
		}
	}
	fake_guest_free(&f);
	free(buf);
}
END_TEST

/*
 * Compressed records (DATA_Z, stream.h), made from hashed.bin: every
 * second DATA record, or every one, compressed: the guest the stream
 * leaves is hashed.bin's, page for page.  A frame that lies about its
 * size (a page fewer, or nothing said), a second frame of 64 MiB after
 * the right one, a frame of 64 MiB of zeroes, a length past zstd's bound
 * and DATA_Z without the header's flag, a skippable frame after the right
 * one, a frame of zstd's legacy format and a frame asking for a window
 * of 1 GiB are each refused by name, no
 * vCPU loaded, nothing written past the record's pages; pages whose
 * frame decompresses to other bytes than their hashes are caught at END.
 */
START_TEST(zstd_records)
{
	static const struct {
		enum fake_zip how;
		const char *refusal; /* NULL: accepted */
	} cases[] = {
		{ FAKE_ZIP_OK, NULL },
		{ FAKE_ZIP_ALL, NULL },
		{ FAKE_ZIP_FEWER, "(DATA_Z): its frame says" },
		{ FAKE_ZIP_NO_SIZE, "(DATA_Z): its frame does not say its size" },
		{ FAKE_ZIP_TRAILER, "its frame's end is not theirs" },
		{ FAKE_ZIP_GIANT, "(DATA_Z): its frame asks for a window of" },
		{ FAKE_ZIP_WRONG, "does not match its hash" },
		{ FAKE_ZIP_OVERBOUND, "(DATA_Z).count: a frame of" },
		{ FAKE_ZIP_NO_FLAG, "(DATA_Z).kind: DATA_Z in a stream without compression" },
		{ FAKE_ZIP_SKIPPABLE, "its frame's end is not theirs" },
		{ FAKE_ZIP_LEGACY, "(DATA_Z): not a zstd frame" },
		{ FAKE_ZIP_WINDOW, "(DATA_Z): its frame asks for a window of 1073741824 bytes" },
	};
	struct fake_guest plain, f;
	char err[256];
	size_t len, zlen;
	uint8_t *buf = slurp("seeds", "hashed.bin", &len);
	unsigned int i, r;

	ck_assert_ok(fake_guest_init(&plain));
	ck_assert_msg(fake_receive(&plain, buf, len, true, err, sizeof(err), NULL) == 0, "hashed.bin: %s", err);
	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint8_t *z = fake_zip(buf, len, cases[i].how, &zlen);
		int ret;

		ck_assert_msg(z, "case %u: the stream could not be compressed", i);
		ck_assert_ok(fake_guest_init(&f));
		/* a byte no stream writes: what a refused record must leave past its pages */
		for (r = 0; r < FAKE_NR_REGIONS; r++)
			memset(f.g.regions[r].hva, 0xee, f.g.regions[r].size);
		ret = fake_receive(&f, z, zlen, i % 2, err, sizeof(err), NULL);
		if (!cases[i].refusal) {
			ck_assert_msg(ret == 0 && f.loads == FAKE_NR_VCPUS, "case %u: %d '%s'", i, ret, err);
			for (r = 0; r < FAKE_NR_REGIONS; r++)
				ck_assert_msg(!memcmp(f.g.regions[r].hva, plain.g.regions[r].hva, f.g.regions[r].size),
					      "case %u: region %u is not what the plain stream leaves", i, r);
			printf("compressed (%s): %zu bytes for hashed.bin's %zu, the guest as the plain stream's\n",
			       cases[i].how == FAKE_ZIP_ALL ? "every DATA record" : "every second", zlen, len);
		} else {
			ck_assert_msg(ret < 0 && strstr(err, cases[i].refusal), "case %u: %d '%s', expected '%s'", i, ret,
				      err, cases[i].refusal);
			ck_assert_uint_eq(f.loads, 0);
			printf("refused: %s\n", err);
		}
		if (cases[i].how == FAKE_ZIP_TRAILER || cases[i].how == FAKE_ZIP_GIANT) {
			/* hashed.bin's first DATA record is region 0's from page 0: nothing after its pages was written */
			const uint8_t *m = f.g.regions[1].hva;
			size_t k;

			for (k = 0; k < f.g.regions[1].size && m[k] == 0xee; k++)
				;
			ck_assert_msg(k == f.g.regions[1].size, "case %u: region 1 written at byte %zu", i, k);
		}
		fake_guest_free(&f);
		free(z);
	}
	fake_guest_free(&plain);
	free(buf);
}
END_TEST

/* A header with compression from a session that did not agree to it (and a decoder that did), by name. */
START_TEST(zstd_header_agreed)
{
	struct mig_decoder d;
	struct mig_encoder e;
	struct mig_header h;
	char err[256];

	mig_encode_header(&e, &h, layout, 2, 2, MIG_F_PAGE_HASH | MIG_F_ZSTD);
	mig_decoder_init(&d, layout, 2, 2);
	ck_assert_int_eq(mig_decode_header(&d, &h, err, sizeof(err)), -EPROTO);
	ck_assert_msg(strstr(err, "header.flags: compression, which this session did not agree to"), "%s", err);
	mig_decoder_init(&d, layout, 2, 2);
	d.zstd_ok = true;
	ck_assert_int_eq(mig_decode_header(&d, &h, err, sizeof(err)), 0);
}
END_TEST

/* One input a stream defect of issue 10, and the refusal it must get. */
static const struct {
	const char *file, *refusal;
} regressions[] = {
	{ "3-data-dropped.bin", "never arrived" },
	{ "3-zero-dropped.bin", "never arrived" },
	{ "3-no-pages.bin", "region 0 page 0 (gpa 0x0) never arrived" },
	{ "4-header-reserved.bin", "header.reserved: 0x1, must be 0" },
	{ "4-vcpu-first.bin", "(VCPU).first: 1, must be 0" },
	{ "4-digest-kind.bin", ".kind: 5 (DIGEST) belongs to stream version 1" },
	{ "4-pass-index.bin", "(PASS).index: 1, must be 0" },
	{ "4-version-1.bin", "header.version: 1 (page digests hashed in the downtime) is no longer accepted" },
	{ "4-version-2.bin", "header.version: 2 (no commit at the handoff: both ends could run the guest) is no longer accepted" },
	{ "4-version-3.bin", "header.version: 3 (a vCPU's registers, XSAVE and TSC only: no XCR0, LAPIC, events or MSRs) "
			     "is no longer accepted" },
	{ "5-nr-msrs.bin", "(VCPU).nr_msrs: 257, at most 256" },
	{ "6-after-end.bin", "after END: more bytes" },
	{ "6-ends-early.bin", "the stream ended before END" },
};

START_TEST(regressions_refused)
{
	struct fake_guest f;
	char err[256] = "";
	size_t len;
	uint8_t *buf = slurp("regress", regressions[_i].file, &len);
	int ret;

	ck_assert_ok(fake_guest_init(&f));
	ret = fake_receive(&f, buf, len, _i % 2, err, sizeof(err), NULL);
	ck_assert_msg(ret < 0 && strstr(err, regressions[_i].refusal), "%s: %d '%s', expected '%s'",
		      regressions[_i].file, ret, err, regressions[_i].refusal);
	ck_assert_msg(!strstr(err, "reset"), "%s: '%s'", regressions[_i].file, err);
	ck_assert_uint_eq(f.loads, 0); /* no vCPU state from a refused stream */
	fake_guest_free(&f);
	free(buf);
}
END_TEST

/* Every file under regress/ is in the table: an input nobody checks protects nothing. */
START_TEST(regressions_listed)
{
	char path[4096];
	struct dirent *e;
	size_t i, n = 0;
	DIR *d;

	snprintf(path, sizeof(path), "%s/regress", dir);
	d = opendir(path);
	ck_assert_msg(d, "%s: %s", path, strerror(errno));
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		for (i = 0; i < sizeof(regressions) / sizeof(regressions[0]); i++)
			if (!strcmp(e->d_name, regressions[i].file))
				break;
		ck_assert_msg(i < sizeof(regressions) / sizeof(regressions[0]), "%s/%s has no expected refusal", path,
			      e->d_name);
		n++;
	}
	closedir(d);
	ck_assert_uint_eq(n, sizeof(regressions) / sizeof(regressions[0]));
}
END_TEST

int main(int argc, char **argv)
{
	Suite *s = suite_create("stream");
	TCase *tc = tcase_create("stream");

	if (argc != 2) {
		fprintf(stderr, "usage: test-stream DIR (tests/fuzz)\n");
		return 2;
	}
	dir = argv[1];
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, hash_kernels_agree);
	tcase_add_test(tc, hash_copy_is_hash_and_copy);
	tcase_add_test(tc, hash_known_answers);
	tcase_add_test(tc, hash_sees_every_bit_and_position);
	tcase_add_test(tc, decode_record_fields);
	tcase_add_test(tc, decode_header_fields);
	tcase_add_loop_test(tc, sealed_seeds_accepted, 0, 2);
	tcase_add_loop_test(tc, seeds_accepted, 0, (int)(sizeof(seeds) / sizeof(seeds[0])));
	tcase_add_test(tc, postcopy_seed_reaches);
	tcase_add_test(tc, seed_pages_land);
	tcase_add_test(tc, zstd_records);
	tcase_add_test(tc, zstd_header_agreed);
	tcase_add_test(tc, refusal_leaves_nothing);
	tcase_add_test(tc, devices_carried);
	tcase_add_test(tc, devices_live_carried);
	tcase_add_test(tc, devices_bound_together);
	tcase_add_loop_test(tc, regressions_refused, 0, (int)(sizeof(regressions) / sizeof(regressions[0])));
	tcase_add_test(tc, regressions_listed);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
