// SPDX-License-Identifier: MIT
/*
 * The stream's encoder and decoder (format in stream.h).  No I/O and no
 * guest: the source and the destination move the bytes, these say what
 * they are and whether they may be acted on.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <immintrin.h>
/* ZSTD_getFrameHeader(): the window a frame asks for, read before it is decoded */
#define ZSTD_STATIC_LINKING_ONLY
#include <zstd.h>

#include "errf.h"
#include "stream.h"


/* ---- page hash ---- */

#define HASH_WORDS (MIG_PAGE_SIZE / 8)

static const uint64_t hash_key[8] = {
	0xbe4ba423396cfeb8ull, 0x1cad21f72c81017cull, 0xdb979083e96dd4deull, 0x1f67b3b7a4a44072ull,
	0x78e5c0cc4ee679cbull, 0x2172ffcc7dd05a82ull, 0x8e2443f7744608b8ull, 0x4c263a81e69035e0ull,
};
static const uint64_t hash_step[8] = {
	0x9e3779b97f4a7c15ull, 0xc2b2ae3d27d4eb4full, 0x165667b19e3779f9ull, 0x85ebca77c2b2ae63ull,
	0x27d4eb2f165667c5ull, 0xff51afd7ed558ccdull, 0xc4ceb9fe1a85ec53ull, 0xd6e8feb86659fd93ull,
};

static uint64_t fold128(uint64_t a, uint64_t b)
{
	unsigned __int128 p = (unsigned __int128)a * b;

	return (uint64_t)p ^ (uint64_t)(p >> 64);
}

/* Fold the lanes: each pair's 128-bit product, summed, then an avalanche. */
static uint64_t hash_finish(const uint64_t prod[8], const uint64_t sum[8])
{
	uint64_t h = 0x27d4eb2f165667c5ull;
	int j;

	for (j = 0; j < 8; j++)
		h += fold128(prod[j] ^ hash_step[j], sum[j] ^ hash_key[(j + 1) % 8]);
	h ^= h >> 37;
	h *= 0x165667919e3779f9ull;
	return h ^ (h >> 32);
}

/*
 * Eight lanes; word w of 64-byte stripe s goes to lane j = w % 8 with the
 * key k = key[j] + s * step[j]: x = w ^ k, prod[j] += lo32(x) * hi32(x)
 * (NH, as in UMAC and XXH3: a word's halves multiplied, non-linear in
 * the word), sum[j] += w (so a word whose product is zero still counts).
 * The stripe-dependent key makes a word's position count.
 */
uint64_t mig_page_hash_portable(const void *page)
{
	const uint64_t *w = page;
	uint64_t prod[8], sum[8], key[8];
	unsigned int s, j;

	memcpy(prod, hash_key, sizeof(prod));
	memcpy(sum, hash_key, sizeof(sum));
	memcpy(key, hash_key, sizeof(key));
	for (s = 0; s < HASH_WORDS / 8; s++, w += 8) {
		for (j = 0; j < 8; j++) {
			uint64_t x = w[j] ^ key[j];

			prod[j] += (x & 0xffffffffu) * (x >> 32);
			sum[j] += w[j];
			key[j] += hash_step[j];
		}
	}
	return hash_finish(prod, sum);
}

/*
 * The same, two stripes a turn (few enough registers that no accumulator
 * spills); with dst, each stripe is also stored there as it is read (the
 * page read once for its hash and its copy).  Inlined into each caller
 * below with dst constant, so the hash alone has no store and no test.
 */
__attribute__((target("avx2"), always_inline)) static inline uint64_t page_hash_avx2_into(void *dst,
											   const void *page)
{
#define LD(p) _mm256_loadu_si256((const __m256i *)(p))
#define NH(x) _mm256_mul_epu32((x), _mm256_srli_epi64((x), 32))
	const __m256i *w = page;
	__m256i *o = dst;
	const __m256i s0 = LD(hash_step), s1 = LD(hash_step + 4);
	const __m256i t0 = _mm256_add_epi64(s0, s0), t1 = _mm256_add_epi64(s1, s1);
	__m256i k0 = LD(hash_key), k1 = LD(hash_key + 4), l0 = _mm256_add_epi64(k0, s0), l1 = _mm256_add_epi64(k1, s1);
	__m256i p0 = k0, p1 = k1, a0 = k0, a1 = k1;
	uint64_t prod[8], sum[8];
	unsigned int s;

	for (s = 0; s < HASH_WORDS / 8; s += 2, w += 4) {
		__m256i d0 = LD(w), d1 = LD(w + 1), d2 = LD(w + 2), d3 = LD(w + 3);
		__m256i x0 = _mm256_xor_si256(d0, k0), x1 = _mm256_xor_si256(d1, k1);
		__m256i x2 = _mm256_xor_si256(d2, l0), x3 = _mm256_xor_si256(d3, l1);

		if (o) {
			_mm256_storeu_si256(o, d0);
			_mm256_storeu_si256(o + 1, d1);
			_mm256_storeu_si256(o + 2, d2);
			_mm256_storeu_si256(o + 3, d3);
			o += 4;
		}
		p0 = _mm256_add_epi64(p0, _mm256_add_epi64(NH(x0), NH(x2)));
		p1 = _mm256_add_epi64(p1, _mm256_add_epi64(NH(x1), NH(x3)));
		a0 = _mm256_add_epi64(a0, _mm256_add_epi64(d0, d2));
		a1 = _mm256_add_epi64(a1, _mm256_add_epi64(d1, d3));
		k0 = _mm256_add_epi64(k0, t0);
		k1 = _mm256_add_epi64(k1, t1);
		l0 = _mm256_add_epi64(l0, t0);
		l1 = _mm256_add_epi64(l1, t1);
	}
	_mm256_storeu_si256((__m256i *)prod, p0);
	_mm256_storeu_si256((__m256i *)prod + 1, p1);
	_mm256_storeu_si256((__m256i *)sum, a0);
	_mm256_storeu_si256((__m256i *)sum + 1, a1);
	/* the upper halves clean before code without AVX runs (hash_finish, the caller's, a syscall's) */
	_mm256_zeroupper();
	return hash_finish(prod, sum);
#undef NH
#undef LD
}

__attribute__((target("avx2"))) static uint64_t page_hash_avx2(const void *page)
{
	return page_hash_avx2_into(NULL, page);
}

__attribute__((target("avx2"))) static uint64_t page_hash_copy_avx2(void *dst, const void *page)
{
	return page_hash_avx2_into(dst, page);
}

static bool use_avx2(void)
{
	static int avx2 = -1; /* benign race: every thread computes the same */
	int use = __atomic_load_n(&avx2, __ATOMIC_RELAXED);

	if (use < 0) {
		__builtin_cpu_init();
		use = __builtin_cpu_supports("avx2") ? 1 : 0;
		__atomic_store_n(&avx2, use, __ATOMIC_RELAXED);
	}
	return use;
}

uint64_t mig_page_hash(const void *page)
{
	return use_avx2() ? page_hash_avx2(page) : mig_page_hash_portable(page);
}

uint64_t mig_page_hash_copy(void *dst, const void *page)
{
	if (use_avx2())
		return page_hash_copy_avx2(dst, page);
	memcpy(dst, page, MIG_PAGE_SIZE);
	return mig_page_hash_portable(dst);
}

uint64_t mig_zero_page_hash(void)
{
	static const uint64_t zero[HASH_WORDS];

	return mig_page_hash(zero);
}

/* ---- checksum and framing ---- */

uint64_t mig_sum(uint64_t sum, const void *p, size_t n)
{
	const uint8_t *b = p;

	while (n--)
		sum = (sum ^ *b++) * 0x100000001b3ull;
	return sum;
}

uint64_t mig_payload_len(uint32_t flags, const struct mig_record *rec)
{
	uint64_t per = MIG_PAGE_SIZE + (flags & MIG_F_PAGE_HASH ? sizeof(uint64_t) : 0), n;

	switch (rec->kind) {
	case MIG_DATA:
		return __builtin_mul_overflow(rec->count, per, &n) ? UINT64_MAX : n;
	case MIG_DATA_Z:
		return mig_zpages(rec) * (per - MIG_PAGE_SIZE) + mig_zbytes(rec);
	case MIG_VCPU:
	case MIG_VM:
	case MIG_DEVICES:
	case MIG_DEVICES_LIVE:
		return rec->count;
	default:
		return 0;
	}
}

/* The payload bytes END's checksum covers: vCPU state; DATA payloads are the page hashes' job. */
static uint64_t covered_len(const struct mig_record *rec)
{
	return rec->kind == MIG_VCPU || rec->kind == MIG_VM || rec->kind == MIG_DEVICES || rec->kind == MIG_DEVICES_LIVE
		       ? rec->count
		       : 0;
}

const char *mig_kind_name(uint32_t kind)
{
	static const char *const n[] = { "?",	"DATA", "ZERO", "PASS",	  "VCPU",
					 "DIGEST", "END",  "VM",   "DEVICES", "DEVICES_LIVE", "LEFT", "REQ", "ALL_IN",
					 "PC_FAILED", "RECOVER", "DATA_Z" };

	return kind < sizeof(n) / sizeof(n[0]) ? n[kind] : "?";
}

/* ---- encoding ---- */

void mig_encode_header(struct mig_encoder *e, struct mig_header *ret_h, const struct mig_region *regions,
		       uint32_t nr_regions, uint32_t nr_vcpus, uint32_t flags)
{
	*ret_h = (struct mig_header){ .magic = MIG_MAGIC, .version = MIG_VERSION, .page_size = MIG_PAGE_SIZE,
				      .nr_regions = nr_regions, .nr_vcpus = nr_vcpus, .flags = flags };
	e->flags = flags;
	e->sum = mig_sum(mig_sum(MIG_SUM_INIT, ret_h, sizeof(*ret_h)), regions, nr_regions * sizeof(*regions));
}

static struct mig_record encode(struct mig_encoder *e, uint32_t kind, uint32_t index, uint64_t first,
				uint64_t count, const void *payload)
{
	struct mig_record rec = { kind, index, first, count };

	e->sum = mig_sum(e->sum, &rec, sizeof(rec));
	if (payload)
		e->sum = mig_sum(e->sum, payload, covered_len(&rec));
	return rec;
}

struct mig_record mig_encode_data(struct mig_encoder *e, uint32_t region, uint64_t first, uint64_t count)
{
	return encode(e, MIG_DATA, region, first, count, NULL);
}

struct mig_record mig_encode_zero(struct mig_encoder *e, uint32_t region, uint64_t first, uint64_t count)
{
	return encode(e, MIG_ZERO, region, first, count, NULL);
}

struct mig_record mig_encode_pass(struct mig_encoder *e, uint64_t pass)
{
	return encode(e, MIG_PASS, 0, pass, 0, NULL);
}

struct mig_record mig_encode_vcpu(struct mig_encoder *e, uint32_t vcpu, const struct mig_vcpu_state *st)
{
	return encode(e, MIG_VCPU, vcpu, 0, sizeof(*st), st);
}

struct mig_record mig_encode_vm(struct mig_encoder *e, const struct mig_vm_state *st)
{
	return encode(e, MIG_VM, 0, 0, sizeof(*st), st);
}

struct mig_record mig_encode_devices(struct mig_encoder *e, const void *state, uint64_t len)
{
	return encode(e, MIG_DEVICES, 0, 0, len, state);
}

struct mig_record mig_encode_devices_live(struct mig_encoder *e, const void *state, uint64_t len)
{
	return encode(e, MIG_DEVICES_LIVE, 0, 0, len, state);
}

struct mig_record mig_encode_left(struct mig_encoder *e, uint32_t region, uint64_t first, uint64_t count)
{
	return encode(e, MIG_LEFT, region, first, count, NULL);
}

struct mig_record mig_encode_end(struct mig_encoder *e)
{
	return (struct mig_record){ MIG_END, 0, e->sum, 0 };
}

/* ---- decoding ---- */

#define refuse(err, len, ...) mig_errf(err, len, -EPROTO, __VA_ARGS__)

/* "record 12 (VCPU).first: ..." */
static int refuse_field(const struct mig_decoder *d, const struct mig_record *rec, const char *field, char *err,
			size_t len, const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static int refuse_field(const struct mig_decoder *d, const struct mig_record *rec, const char *field, char *err,
			size_t len, const char *fmt, ...)
{
	va_list ap;
	int n = snprintf(err, len, "record %" PRIu64 " (%s).%s: ", d->nrec, mig_kind_name(rec->kind), field);

	va_start(ap, fmt);
	if (n >= 0 && (size_t)n < len)
		vsnprintf(err + n, len - (size_t)n, fmt, ap);
	va_end(ap);
	return -EPROTO;
}

void mig_decoder_init(struct mig_decoder *d, const struct mig_region *regions, uint32_t nr_regions,
		      uint32_t nr_vcpus)
{
	*d = (struct mig_decoder){ .regions = regions, .nr_regions = nr_regions, .nr_vcpus = nr_vcpus };
}

int mig_decode_header(struct mig_decoder *d, const struct mig_header *h, char *err, size_t len)
{
	if (memcmp(h->magic, MIG_MAGIC, sizeof(h->magic)))
		return refuse(err, len, "header.magic: not a kvmdirty-migrate stream");
	if (h->version == 1)
		return refuse(err, len, "header.version: 1 (page digests hashed in the downtime) is no longer accepted; "
				       "this destination speaks %u", MIG_VERSION);
	if (h->version == 3)
		return refuse(err, len, "header.version: 3 (a vCPU's registers, XSAVE and TSC only: no XCR0, LAPIC, "
			      "events or MSRs) is no longer accepted; this destination speaks %u", MIG_VERSION);
	if (h->version == 2)
		return refuse(err, len, "header.version: 2 (no commit at the handoff: both ends could run the guest) is "
			      "no longer accepted; this destination speaks %u", MIG_VERSION);
	if (h->version != MIG_VERSION)
		return refuse(err, len, "header.version: %" PRIu32 ", this destination speaks %u", h->version,
			      MIG_VERSION);
	if (h->page_size != MIG_PAGE_SIZE)
		return refuse(err, len, "header.page_size: %" PRIu32 ", expected %u", h->page_size, MIG_PAGE_SIZE);
	if (h->nr_regions != d->nr_regions)
		return refuse(err, len, "header.nr_regions: %" PRIu32 ", this destination has %" PRIu32, h->nr_regions,
			      d->nr_regions);
	if (h->nr_vcpus != d->nr_vcpus)
		return refuse(err, len, "header.nr_vcpus: %" PRIu32 ", this destination has %" PRIu32, h->nr_vcpus,
			      d->nr_vcpus);
	if (h->flags & ~(MIG_F_PAGE_HASH | MIG_F_POSTCOPY | MIG_F_ZSTD))
		return refuse(err, len, "header.flags: unknown bits 0x%" PRIx32,
			      h->flags & ~(MIG_F_PAGE_HASH | MIG_F_POSTCOPY | MIG_F_ZSTD));
	if ((h->flags & MIG_F_ZSTD) && !d->zstd_ok)
		return refuse(err, len, "header.flags: compression, which this session did not agree to");
	if ((h->flags & MIG_F_POSTCOPY) && !d->postcopy_ok)
		return refuse(err, len, "header.flags: post-copy, which this session did not agree to");
	if ((h->flags & MIG_F_POSTCOPY) && !(h->flags & MIG_F_PAGE_HASH))
		return refuse(err, len, "header.flags: post-copy without page hashes (a page is checked before it is "
			      "placed)");
	if (h->reserved)
		return refuse(err, len, "header.reserved: 0x%" PRIx32 ", must be 0", h->reserved);
	d->flags = h->flags;
	d->sum = mig_sum(MIG_SUM_INIT, h, sizeof(*h));
	return 0;
}

int mig_decode_regions(struct mig_decoder *d, const struct mig_region *theirs, char *err, size_t len)
{
	uint32_t i;

	for (i = 0; i < d->nr_regions; i++) {
		if (theirs[i].gpa != d->regions[i].gpa)
			return refuse(err, len, "region[%" PRIu32 "].gpa: 0x%" PRIx64 ", this destination has 0x%" PRIx64,
				      i, theirs[i].gpa, d->regions[i].gpa);
		if (theirs[i].size != d->regions[i].size)
			return refuse(err, len, "region[%" PRIu32 "].size: 0x%" PRIx64 ", this destination has 0x%" PRIx64,
				      i, theirs[i].size, d->regions[i].size);
	}
	d->sum = mig_sum(d->sum, theirs, d->nr_regions * sizeof(*theirs));
	return 0;
}

static void accept_record(struct mig_decoder *d, const struct mig_record *rec)
{
	d->sum = mig_sum(d->sum, rec, sizeof(*rec));
	d->nrec++;
}

/* DATA, ZERO, LEFT, DATA_Z: a run of pages [first, first + count) inside the region, count <= max. */
static int check_pages(const struct mig_decoder *d, const struct mig_record *rec, uint64_t count, uint64_t max,
		       char *err, size_t len)
{
	uint64_t npages;

	if (rec->index >= d->nr_regions)
		return refuse_field(d, rec, "index", err, len, "region %" PRIu32 ", the stream has %" PRIu32,
				    rec->index, d->nr_regions);
	npages = d->regions[rec->index].size / MIG_PAGE_SIZE;
	if (!count || count > max)
		return refuse_field(d, rec, "count", err, len, "%" PRIu64 " pages, must be 1..%" PRIu64, count,
				    max);
	if (rec->first >= npages)
		return refuse_field(d, rec, "first", err, len, "page %" PRIu64 " outside region %" PRIu32
				    " (%" PRIu64 " pages)", rec->first, rec->index, npages);
	if (count > npages - rec->first)
		return refuse_field(d, rec, "count", err, len, "pages [%" PRIu64 ", +%" PRIu64 ") run past region %"
				    PRIu32 " (%" PRIu64 " pages)", rec->first, count, rec->index, npages);
	if (d->lanes > 1 && (rec->first / MIG_LANE_PAGES != (rec->first + count - 1) / MIG_LANE_PAGES ||
			     mig_lane_of(rec->index, rec->first, d->lanes) != d->lane))
		return refuse_field(d, rec, "first", err, len, "pages [%" PRIu64 ", +%" PRIu64 ") of region %" PRIu32
				    " on connection %" PRIu32 ": a record's pages are one chunk's, and chunk %" PRIu64
				    " travels on connection %" PRIu32, rec->first, count, rec->index, d->lane,
				    rec->first / MIG_LANE_PAGES, mig_lane_of(rec->index, rec->first, d->lanes));
	return 0;
}

static int check_run(struct mig_decoder *d, const struct mig_record *rec, uint64_t max, char *err, size_t len)
{
	int ret = check_pages(d, rec, rec->count, max, err, len);

	if (ret == 0)
		accept_record(d, rec);
	return ret;
}

int mig_decode_data(struct mig_decoder *d, const struct mig_record *rec, char *err, size_t len)
{
	return check_run(d, rec, MIG_RUN_PAGES, err, len);
}

uint64_t mig_zbound(uint64_t pages)
{
	return ZSTD_COMPRESSBOUND(pages * MIG_PAGE_SIZE);
}

void *mig_unzip_new(void)
{
	ZSTD_DCtx *z = ZSTD_createDCtx();

	/* the window a frame may ask for: a record's pages at most (a frame asking more is refused, not allocated) */
	if (z && ZSTD_isError(ZSTD_DCtx_setParameter(z, ZSTD_d_windowLogMax, 20))) {
		ZSTD_freeDCtx(z);
		return NULL;
	}
	return z;
}

void mig_unzip_free(void *dctx)
{
	ZSTD_freeDCtx(dctx);
}

_Static_assert(MIG_RUN_PAGES * MIG_PAGE_SIZE <= 1u << 20, "a record's pages fit the window mig_unzip_new() allows");

int mig_unzip(void *dctx, void *dst, uint64_t pages, const void *src, uint64_t zbytes, uint64_t nrec, char *err,
	      size_t len)
{
	unsigned long long said = ZSTD_getFrameContentSize(src, zbytes);
	ZSTD_frameHeader fh;
	size_t got;

	/* one frame of today's format, nothing after it: not a legacy or skippable one, not a run of them */
	if (zbytes < 4 || ((const uint8_t *)src)[0] != 0x28 || ((const uint8_t *)src)[1] != 0xb5 ||
	    ((const uint8_t *)src)[2] != 0x2f || ((const uint8_t *)src)[3] != 0xfd || said == ZSTD_CONTENTSIZE_ERROR ||
	    ZSTD_getFrameHeader(&fh, src, zbytes) != 0 || fh.frameType != ZSTD_frame)
		return refuse(err, len, "record %" PRIu64 " (DATA_Z): not a zstd frame", nrec);
	if (ZSTD_findFrameCompressedSize(src, zbytes) != zbytes)
		return refuse(err, len, "record %" PRIu64 " (DATA_Z): %" PRIu64 " bytes, its frame's end is not theirs (a "
			      "frame is cut short, or something follows it)", nrec, zbytes);
	if (fh.windowSize > MIG_RUN_PAGES * MIG_PAGE_SIZE)
		return refuse(err, len, "record %" PRIu64 " (DATA_Z): its frame asks for a window of %llu bytes, a "
			      "record's pages are at most %u", nrec, fh.windowSize, MIG_RUN_PAGES * MIG_PAGE_SIZE);
	if (said == ZSTD_CONTENTSIZE_UNKNOWN)
		return refuse(err, len, "record %" PRIu64 " (DATA_Z): its frame does not say its size (its %" PRIu64
			      " pages are %" PRIu64 " bytes)", nrec, pages, pages * MIG_PAGE_SIZE);
	if (said != pages * MIG_PAGE_SIZE)
		return refuse(err, len, "record %" PRIu64 " (DATA_Z): its frame says %llu bytes, its %" PRIu64
			      " pages are %" PRIu64, nrec, said, pages, pages * MIG_PAGE_SIZE);
	got = ZSTD_decompressDCtx(dctx, dst, pages * MIG_PAGE_SIZE, src, zbytes);
	if (ZSTD_isError(got))
		return refuse(err, len, "record %" PRIu64 " (DATA_Z): its frame does not decompress to its %" PRIu64
			      " pages: %s", nrec, pages, ZSTD_getErrorName(got));
	if (got != pages * MIG_PAGE_SIZE)
		return refuse(err, len, "record %" PRIu64 " (DATA_Z): its frame gives %zu bytes, its %" PRIu64
			      " pages are %" PRIu64, nrec, got, pages, pages * MIG_PAGE_SIZE);
	return 0;
}

/*
 * DATA_Z: as the DATA record it stands for (its pages' range, the chunk
 * rule, END's checksum), and its frame's size within zstd's bound for
 * those pages.  The frame itself is the receiver's (mig_unzip()).
 */
int mig_decode_data_z(struct mig_decoder *d, const struct mig_record *rec, char *err, size_t len)
{
	struct mig_record data = { MIG_DATA, rec->index, rec->first, mig_zpages(rec) };
	int ret;

	if (!(d->flags & MIG_F_ZSTD))
		return refuse_field(d, rec, "kind", err, len, "DATA_Z in a stream without compression (header.flags)");
	if (!mig_zpages(rec) || mig_zpages(rec) > MIG_RUN_PAGES)
		return refuse_field(d, rec, "count", err, len, "%" PRIu64 " pages, must be 1..%u", mig_zpages(rec),
				    MIG_RUN_PAGES);
	if (!mig_zbytes(rec) || mig_zbytes(rec) > mig_zbound(mig_zpages(rec)))
		return refuse_field(d, rec, "count", err, len, "a frame of %" PRIu64 " bytes for %" PRIu64
				    " pages, must be 1..%" PRIu64, mig_zbytes(rec), mig_zpages(rec),
				    mig_zbound(mig_zpages(rec)));
	ret = check_pages(d, rec, data.count, MIG_RUN_PAGES, err, len);
	if (ret == 0)
		accept_record(d, &data);
	return ret;
}

int mig_decode_zero(struct mig_decoder *d, const struct mig_record *rec, char *err, size_t len)
{
	return check_run(d, rec, UINT64_MAX, err, len);
}

int mig_decode_left(struct mig_decoder *d, const struct mig_record *rec, char *err, size_t len)
{
	if (!(d->flags & MIG_F_POSTCOPY))
		return refuse_field(d, rec, "kind", err, len, "LEFT in a stream without post-copy (header.flags)");
	return check_run(d, rec, UINT64_MAX, err, len);
}

int mig_pc_map_check(const struct mig_region *regions, uint32_t nr, const struct mig_record *rec, uint64_t nrec,
		     char *err, size_t len)
{
	uint64_t np = rec->index < nr ? regions[rec->index].size / MIG_PAGE_SIZE : 0;

	if (rec->kind == MIG_END)
		return 1;
	if (rec->kind != MIG_LEFT || rec->index >= nr || !rec->count || rec->first >= np || rec->count > np - rec->first)
		return refuse(err, len, "post-copy recovery: record %" PRIu64 " (%s): region %" PRIu32 " pages [%" PRIu64
			      ", +%" PRIu64 "): not a run of the guest's", nrec, mig_kind_name(rec->kind), rec->index,
			      rec->first, rec->count);
	return 0;
}

int mig_pc_check(const struct mig_region *regions, uint32_t nr, const struct mig_record *rec, uint64_t nrec,
		 bool to_dest, char *err, size_t len)
{
	const char *k = mig_kind_name(rec->kind);
	uint64_t np;

	if ((rec->kind == MIG_ALL_IN || rec->kind == MIG_PC_FAILED) && !to_dest)
		return 0; /* its figures (errno) are the destination's word, printed, never acted on */
	if ((rec->kind == MIG_ALL_IN || rec->kind == MIG_END) && to_dest && !rec->index && !rec->first && !rec->count)
		return 0; /* the source's acknowledgment of ALL_IN; a lane's end */
	if (rec->kind != (to_dest ? MIG_DATA : MIG_REQ))
		return refuse(err, len, "post-copy record %" PRIu64 ".kind: %" PRIu32 " (%s), %s", nrec, rec->kind, k,
			      to_dest ? "the source sends DATA and ALL_IN only" : "the destination sends REQ and ALL_IN only");
	if (rec->index >= nr)
		return refuse(err, len, "post-copy record %" PRIu64 " (%s).index: region %" PRIu32 ", the guest has %" PRIu32,
			      nrec, k, rec->index, nr);
	np = regions[rec->index].size / MIG_PAGE_SIZE;
	if (!rec->count || rec->count > MIG_RUN_PAGES || rec->first >= np || rec->count > np - rec->first)
		return refuse(err, len, "post-copy record %" PRIu64 " (%s): pages [%" PRIu64 ", +%" PRIu64 ") of region %"
			      PRIu32 " (%" PRIu64 " pages; 1..%u a record)", nrec, k, rec->first, rec->count, rec->index,
			      np, MIG_RUN_PAGES);
	return 0;
}

/* PASS and VCPU: connection 0's alone. */
static int on_first_lane(struct mig_decoder *d, const struct mig_record *rec, char *err, size_t len)
{
	return refuse_field(d, rec, "kind", err, len, "%s on connection %" PRIu32 ", it travels on connection 0 only",
			    mig_kind_name(rec->kind), d->lane);
}

int mig_decode_pass(struct mig_decoder *d, const struct mig_record *rec, char *err, size_t len)
{
	if (d->lane)
		return on_first_lane(d, rec, err, len);
	if (rec->index)
		return refuse_field(d, rec, "index", err, len, "%" PRIu32 ", must be 0", rec->index);
	if (rec->count)
		return refuse_field(d, rec, "count", err, len, "%" PRIu64 ", must be 0", rec->count);
	if (rec->first != d->pass + 1)
		return refuse_field(d, rec, "first", err, len, "pass %" PRIu64 ", expected pass %" PRIu64, rec->first,
				    d->pass + 1);
	d->pass = rec->first;
	accept_record(d, rec);
	return 0;
}

/*
 * A record of the VM's or the devices' state: index and first 0, exactly
 * exact bytes, or (exact 0) device state within what the stream may still
 * carry of it.
 */
static int state_record(struct mig_decoder *d, const struct mig_record *rec, uint64_t exact, char *err, size_t len)
{
	uint64_t room = MIG_DEVICES_MAX - d->devices_live_bytes;

	if (rec->index)
		return refuse_field(d, rec, "index", err, len, "%" PRIu32 ", must be 0", rec->index);
	if (rec->first)
		return refuse_field(d, rec, "first", err, len, "%" PRIu64 ", must be 0", rec->first);
	if (exact && rec->count != exact)
		return refuse_field(d, rec, "count", err, len, "%" PRIu64 " bytes, expected %" PRIu64, rec->count, exact);
	if (!exact && rec->count > room)
		return refuse_field(d, rec, "count", err, len,
				    "%" PRIu64 " bytes of device state, at most %llu%s (%" PRIu64 " left)", rec->count,
				    MIG_DEVICES_MAX, d->devices_live_bytes ? " with DEVICES_LIVE's" : "", room);
	accept_record(d, rec);
	return 0;
}

int mig_decode_vcpu(struct mig_decoder *d, const struct mig_record *rec, char *err, size_t len)
{
	if (d->lane)
		return on_first_lane(d, rec, err, len);
	if (rec->index >= d->nr_vcpus)
		return refuse_field(d, rec, "index", err, len, "vCPU %" PRIu32 ", this destination has %" PRIu32,
				    rec->index, d->nr_vcpus);
	if (d->vcpu_seen[rec->index / 64] & (1ull << (rec->index % 64)))
		return refuse_field(d, rec, "index", err, len, "vCPU %" PRIu32 " sent twice", rec->index);
	if (rec->first)
		return refuse_field(d, rec, "first", err, len, "%" PRIu64 ", must be 0", rec->first);
	if (rec->count != sizeof(struct mig_vcpu_state))
		return refuse_field(d, rec, "count", err, len, "%" PRIu64 " bytes, expected %zu", rec->count,
				    sizeof(struct mig_vcpu_state));
	d->vcpu_seen[rec->index / 64] |= 1ull << (rec->index % 64);
	d->stopped = true;
	accept_record(d, rec);
	return 0;
}

int mig_decode_vm(struct mig_decoder *d, const struct mig_record *rec, char *err, size_t len)
{
	int ret;

	if (d->lane)
		return on_first_lane(d, rec, err, len);
	if (d->vm_seen)
		return refuse_field(d, rec, "kind", err, len, "VM sent twice");
	ret = state_record(d, rec, sizeof(struct mig_vm_state), err, len);
	d->vm_seen = ret == 0;
	return ret;
}

int mig_decode_devices(struct mig_decoder *d, const struct mig_record *rec, char *err, size_t len)
{
	int ret;

	if (d->lane)
		return on_first_lane(d, rec, err, len);
	if (d->devices_seen)
		return refuse_field(d, rec, "kind", err, len, "DEVICES sent twice");
	if (!d->vm_seen)
		return refuse_field(d, rec, "kind", err, len, "DEVICES before the VM record");
	ret = state_record(d, rec, 0, err, len);
	d->devices_seen = ret == 0;
	return ret;
}

int mig_decode_devices_live(struct mig_decoder *d, const struct mig_record *rec, char *err, size_t len)
{
	int ret;

	if (d->lane)
		return on_first_lane(d, rec, err, len);
	if (d->devices_live_seen)
		return refuse_field(d, rec, "kind", err, len, "DEVICES_LIVE sent twice");
	if (d->stopped || d->vm_seen || d->devices_seen)
		return refuse_field(d, rec, "kind", err, len, "DEVICES_LIVE after a %s record (the guest's pause)",
				    d->devices_seen ? "DEVICES" : d->vm_seen ? "VM" : "VCPU");
	ret = state_record(d, rec, 0, err, len);
	d->devices_live_seen = ret == 0;
	if (ret == 0)
		d->devices_live_bytes = rec->count;
	return ret;
}

void mig_decode_devices_state(struct mig_decoder *d, const void *state, uint64_t len)
{
	d->sum = mig_sum(d->sum, state, len);
}

int mig_decode_end(struct mig_decoder *d, const struct mig_record *rec, char *err, size_t len)
{
	uint32_t i;

	if (rec->index)
		return refuse_field(d, rec, "index", err, len, "%" PRIu32 ", must be 0", rec->index);
	if (rec->count)
		return refuse_field(d, rec, "count", err, len, "%" PRIu64 ", must be 0", rec->count);
	if (rec->first != d->sum)
		return refuse_field(d, rec, "first", err, len, "checksum 0x%" PRIx64 ", the stream's is 0x%" PRIx64
				    ": it was corrupted", rec->first, d->sum);
	for (i = 0; !d->lane && i < d->nr_vcpus; i++)
		if (!(d->vcpu_seen[i / 64] & (1ull << (i % 64))))
			return refuse(err, len, "record %" PRIu64 " (END): no VCPU record for vCPU %" PRIu32 " before it",
				      d->nrec, i);
	if (!d->lane && !d->vm_seen)
		return refuse(err, len, "record %" PRIu64 " (END): no VM record before it", d->nrec);
	if (!d->lane && !d->devices_seen)
		return refuse(err, len, "record %" PRIu64 " (END): no DEVICES record before it", d->nrec);
	d->nrec++;
	return 0;
}

int mig_decode_record(struct mig_decoder *d, const struct mig_record *rec, char *err, size_t len)
{
	switch (rec->kind) {
	case MIG_DATA:
		return mig_decode_data(d, rec, err, len);
	case MIG_ZERO:
		return mig_decode_zero(d, rec, err, len);
	case MIG_PASS:
		return mig_decode_pass(d, rec, err, len);
	case MIG_VCPU:
		return mig_decode_vcpu(d, rec, err, len);
	case MIG_END:
		return mig_decode_end(d, rec, err, len);
	case MIG_VM:
		return mig_decode_vm(d, rec, err, len);
	case MIG_DEVICES:
		return mig_decode_devices(d, rec, err, len);
	case MIG_DEVICES_LIVE:
		return mig_decode_devices_live(d, rec, err, len);
	case MIG_LEFT:
		return mig_decode_left(d, rec, err, len);
	case MIG_DATA_Z:
		return mig_decode_data_z(d, rec, err, len);
	case 5:
		return refuse(err, len, "record %" PRIu64 ".kind: 5 (DIGEST) belongs to stream version 1", d->nrec);
	default:
		return refuse(err, len, "record %" PRIu64 ".kind: %" PRIu32 " is not a record kind", d->nrec, rec->kind);
	}
}

int mig_vcpu_state_check(const struct mig_vcpu_state *st, const char *what, char *err, size_t len)
{
	const uint8_t *rest = (const uint8_t *)(st->msrs + (st->nr_msrs < MIG_VCPU_MSRS ? st->nr_msrs : MIG_VCPU_MSRS));
	const uint8_t *end = (const uint8_t *)(st + 1);
	unsigned int i;

	if (st->parts & ~MIG_VS_ALL)
		return refuse(err, len, "%s.parts: 0x%" PRIx32 ", parts this engine does not know", what, st->parts);
	if (st->reserved)
		return refuse(err, len, "%s.reserved: 0x%" PRIx32 ", must be 0", what, st->reserved);
	if (st->nr_msrs > MIG_VCPU_MSRS)
		return refuse(err, len, "%s.nr_msrs: %" PRIu32 ", at most %d", what, st->nr_msrs, MIG_VCPU_MSRS);
	for (i = 0; i < st->nr_msrs; i++) {
		if (st->msrs[i].reserved)
			return refuse(err, len, "%s.msrs[%u].reserved: 0x%" PRIx32 ", must be 0", what, i,
				      st->msrs[i].reserved);
		if (i && st->msrs[i].index <= st->msrs[i - 1].index)
			return refuse(err, len, "%s.msrs[%u].index: 0x%" PRIx32 " after 0x%" PRIx32
				      ", not in ascending order", what, i, st->msrs[i].index, st->msrs[i - 1].index);
	}
	for (; rest < end; rest++)
		if (*rest)
			return refuse(err, len, "%s.msrs[%" PRIu32 "..]: not zero past the list", what, st->nr_msrs);
	return 0;
}

int mig_vm_state_check(const struct mig_vm_state *st, const char *what, char *err, size_t len)
{
	static const uint32_t ids[3] = { KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE, KVM_IRQCHIP_IOAPIC };
	const struct kvm_irqchip *chip[3] = { &st->pic[0], &st->pic[1], &st->ioapic };
	unsigned int i;

	if (st->parts & ~MIG_VMS_ALL)
		return refuse(err, len, "%s.parts: 0x%" PRIx32 ", parts this engine does not know", what, st->parts);
	if (st->reserved)
		return refuse(err, len, "%s.reserved: 0x%" PRIx32 ", must be 0", what, st->reserved);
	for (i = 0; (st->parts & MIG_VMS_IRQCHIP) && i < 3; i++)
		if (chip[i]->chip_id != ids[i] || chip[i]->pad)
			return refuse(err, len, "%s: irqchip %u: chip_id %" PRIu32 " (pad %" PRIu32 "), must be %" PRIu32,
				      what, i, chip[i]->chip_id, chip[i]->pad, ids[i]);
	return 0;
}

/* A state payload (VCPU's or VM's) checked by check as "record N (KIND)", then summed. */
static int decode_state(struct mig_decoder *d, const char *kind, const void *st, size_t size,
			int (*check)(const void *st, const char *what, char *err, size_t len), char *err, size_t len)
{
	char what[48];
	int ret;

	/* the record this payload belongs to */
	snprintf(what, sizeof(what), "record %" PRIu64 " (%s)", d->nrec - 1, kind);
	ret = check(st, what, err, len);
	if (ret < 0)
		return ret;
	d->sum = mig_sum(d->sum, st, size);
	return 0;
}

static int check_vm(const void *st, const char *what, char *err, size_t len)
{
	return mig_vm_state_check(st, what, err, len);
}

static int check_vcpu(const void *st, const char *what, char *err, size_t len)
{
	return mig_vcpu_state_check(st, what, err, len);
}

int mig_decode_vm_state(struct mig_decoder *d, const struct mig_vm_state *st, char *err, size_t len)
{
	return decode_state(d, "VM", st, sizeof(*st), check_vm, err, len);
}

int mig_decode_vcpu_state(struct mig_decoder *d, const struct mig_vcpu_state *st, char *err, size_t len)
{
	return decode_state(d, "VCPU", st, sizeof(*st), check_vcpu, err, len);
}

/* ---- streams in memory ---- */

int mig_stream_walk(const void *buf, size_t len, int (*fn)(size_t off, const struct mig_record *rec, void *opaque),
		    void *opaque, size_t *ret_end)
{
	const uint8_t *b = buf;
	struct mig_header h;
	struct mig_record rec;
	uint64_t off = sizeof(h), plen;
	int ret;

	if (len < sizeof(h))
		return -EPROTO;
	memcpy(&h, b, sizeof(h));
	off += (uint64_t)h.nr_regions * sizeof(struct mig_region);
	for (;;) {
		if (off > len || len - off < sizeof(rec))
			return -EPROTO;
		memcpy(&rec, b + off, sizeof(rec));
		plen = rec.kind == MIG_END ? 0 : mig_payload_len(h.flags, &rec);
		if (plen > len - off - sizeof(rec))
			return -EPROTO;
		ret = fn ? fn((size_t)off, &rec, opaque) : 0;
		if (ret)
			return ret;
		off += sizeof(rec) + plen;
		if (rec.kind == MIG_END)
			break;
	}
	if (ret_end)
		*ret_end = (size_t)off;
	return 0;
}

struct reseal {
	uint8_t *buf;
	uint64_t sum;
};

static int reseal_one(size_t off, const struct mig_record *rec, void *opaque)
{
	struct reseal *r = opaque;

	if (rec->kind == MIG_END) {
		memcpy(r->buf + off + offsetof(struct mig_record, first), &r->sum, sizeof(r->sum));
		return 0;
	}
	if (rec->kind == MIG_DATA_Z) {
		/* summed as the DATA it stands for */
		struct mig_record data = { MIG_DATA, rec->index, rec->first, mig_zpages(rec) };

		r->sum = mig_sum(r->sum, &data, sizeof(data));
		return 0;
	}
	r->sum = mig_sum(r->sum, rec, sizeof(*rec));
	r->sum = mig_sum(r->sum, r->buf + off + sizeof(*rec), covered_len(rec));
	return 0;
}

int mig_stream_reseal(void *buf, size_t len)
{
	struct reseal r = { .buf = buf };
	struct mig_header h;

	if (len < sizeof(h))
		return -EPROTO;
	memcpy(&h, buf, sizeof(h));
	if ((uint64_t)h.nr_regions * sizeof(struct mig_region) > len - sizeof(h))
		return -EPROTO;
	r.sum = mig_sum(MIG_SUM_INIT, buf, sizeof(h) + h.nr_regions * sizeof(struct mig_region));
	return mig_stream_walk(buf, len, reseal_one, &r, NULL);
}

void mig_printable(const char *in, size_t n, char *out, size_t len)
{
	size_t i;

	if (!len)
		return;
	for (i = 0; i < n && i + 1 < len; i++)
		out[i] = (unsigned char)in[i] >= 0x20 && (unsigned char)in[i] < 0x7f ? in[i] : '?';
	out[i] = 0;
}

const char *mig_msg_name(uint32_t kind)
{
	static const char *const n[] = { "REFUSED", "READY", "COMMIT", "ABORT", "ACK" };

	return kind < sizeof(n) / sizeof(n[0]) ? n[kind] : "?";
}

const char *mig_ack_text(struct mig_ack *ack)
{
	mig_printable(ack->message, strnlen(ack->message, sizeof(ack->message) - 1), ack->message, sizeof(ack->message));
	return ack->message;
}
