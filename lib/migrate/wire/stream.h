/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_STREAM_H
#define KVMDIRTY_MIGRATE_STREAM_H

/*
 * The migration stream, version 4: everything the two ends exchange, and
 * the one encoder and decoder of it (the source, the destination, the
 * tests and the fuzzer all use these).  Integers are little-endian (both
 * ends are x86-64).
 *
 *   header      struct mig_header
 *   regions     struct mig_region[header.nr_regions], in slot order
 *   records     struct mig_record, each followed by its payload:
 *     DATA      index = region, first = page, count = pages
 *               (1 .. MIG_RUN_PAGES); payload: with MIG_F_PAGE_HASH,
 *               count uint64_t mig_page_hash() values, one a page, taken
 *               as the source sent it; then count * page_size bytes of
 *               memory
 *     ZERO      index = region, first = page, count = pages; no payload
 *     PASS      a pre-copy pass ended; first = pass number (1, 2, ...),
 *               index = count = 0; no payload
 *     VCPU      index = vCPU, first = 0, count = sizeof(struct
 *               mig_vcpu_state); payload: that state (below)
 *     VM        index = first = 0, count = sizeof(struct mig_vm_state);
 *               payload: the VM's own state (below), once, after the
 *               VCPU records
 *     DEVICES   index = first = 0, count = bytes (0 .. MIG_DEVICES_MAX);
 *               payload: the VMM's devices' state, opaque to the engine,
 *               once, after the VM record
 *     DEVICES_LIVE  as DEVICES: the part of the devices' state the VMM
 *               gives while the guest still runs (its bulk), at most once,
 *               before the first VCPU record; loaded before DEVICES's.  The
 *               two together MIG_DEVICES_MAX bytes at most.  A destination
 *               older than it refuses the stream by its kind.
 *     LEFT      index = region, first = page, count = pages; no payload:
 *               pages whose latest copy stays at the source, to come
 *               after the handoff (post-copy, below).  Only in a stream
 *               whose header has MIG_F_POSTCOPY, by the chunk rule of
 *               DATA; a later DATA or ZERO of a page replaces it
 *     DATA_Z    DATA compressed (only in a stream whose header has
 *               MIG_F_ZSTD): index = region, first = page, count = the
 *               pages (bits 0-31, 1 .. MIG_RUN_PAGES) and the compressed
 *               bytes (bits 32-63, 1 .. mig_zbound(pages)); payload: the
 *               page hashes as DATA's, then one zstd frame that
 *               decompresses to exactly the pages' bytes (a frame that
 *               gives more or fewer, or does not say its size, is
 *               refused by name; the output never exceeds the pages).
 *               END's checksum covers it as the DATA record it stands
 *               for (kind DATA, count the pages): a sender may compress a
 *               record after it was encoded
 *     END       index = count = 0; first = FNV-1a 64 of every byte before
 *               it except DATA and DATA_Z payloads (which the page hashes
 *               check)
 *   handoff     struct mig_ack messages, on connection 0 (sealed like the
 *               records when the session has a key):
 *     destination -> source   READY: the stream is complete and every vCPU
 *                             loaded; the guest stays paused.  Or REFUSED
 *                             (status < 0, message: why): nothing runs there
 *     source -> destination   COMMIT (the destination is to run the guest)
 *                             or ABORT (it is to drop it)
 *     destination -> source   ACK: status 0, done as asked; status < 0, the
 *                             guest was dropped (message: why: a resolve
 *                             came first, or the message was neither)
 *   post-copy  after an ACK of status 0 to COMMIT, in a stream with LEFT
 *             pages (MIG_F_POSTCOPY, a session with MIG_S_POSTCOPY): the
 *             guest runs at the destination, its LEFT pages missing
 *             (userfaultfd); records as above, no checksum (the page
 *             hashes and the sealed channel guard them):
 *     destination -> source, fault channel   REQ (index = region, first
 *               = page, count = 1 .. MIG_RUN_PAGES): pages a fault needs
 *               now; ALL_IN: every LEFT page is in place, the source may
 *               drop its guest; index = faults that asked for a page,
 *               first and count = their median and 99th percentile wait
 *               in ns, the destination's figures for the source's summary;
 *               PC_FAILED (index = 0, first = the errno, count = 0): a
 *               page failed its hash or a record was out of form, the
 *               guest there was paused for good; nothing follows
 *     source -> destination, fault channel   ALL_IN (all zero): the
 *               destination's ALL_IN heard; then the source ends
 *   post-copy recovery  a connection lost pauses post-copy; the source
 *             opens a new session (same key, same connections) and, on
 *             its fault channel, sends RECOVER (index = first = 0, count =
 *             32; payload: the id of the session that began the
 *             migration); the destination answers with the pages it still
 *             lacks, LEFT records, then END (first = their number), and
 *             both go on over the new session
 *     source -> destination, fault channel   DATA: the pages a REQ asked
 *               for, hashes first, as in the stream
 *     source -> destination, each lane       DATA: the other LEFT pages,
 *               in the lane's chunks (the chunk rule), nearest to recent
 *               faults first; each page at most once a connection; then
 *               END (all zero): the lane's part is out (a lane that ends
 *               without it was cut)
 *   A page is placed only if it was LEFT, is still missing and matches
 *   its hash; another copy of a page placed already is passed over.
 *   The source sends nothing after END until READY arrives.  Who may run
 *   the guest after each message is kvmdirty-migrate(1)'s state table; in
 *   short, the source resumes by itself at any failure before READY and
 *   never after it sent COMMIT; the destination runs only after COMMIT.
 *   A side that cannot know (the source between COMMIT and ACK, the
 *   destination between READY and COMMIT or ABORT) keeps its guest paused
 *   until told (status.h).
 *
 * Version 3's VCPU record carried registers, special registers, XSAVE
 * and one MSR (IA32_TSC) only: a guest's XCR0, its other MSRs, LAPIC,
 * pending events, MP state and debug registers were lost.  It is refused
 * by name.
 *
 * Version 2 had no handoff: the destination answered once, with status
 * 0 or a refusal, and ran its guest, whether or not the answer arrived.
 * Versions 1 and 2 are refused by name.
 *
 * Version 1 sent a DIGEST record (kind 5) per region after stop-and-copy:
 * every page hashed on both ends while the guest was paused, so
 * verification cost downtime in proportion to the guest.  It is refused
 * by name.
 *
 * The destination checks every field before it acts on it and names the
 * one that is wrong: a magic, version, page size, flag or region table
 * other than its own, a reserved field set, a record kind, region, vCPU,
 * page range or length outside what it registered or what the kind fixes,
 * a vCPU state's part or MSR list out of form, a VCPU record missing or
 * repeated, a pass out of order, a bad checksum, bytes missing before END
 * or present after it.  Memory is received straight into guest memory,
 * but only after the record header that places it was checked.  The guest
 * runs only from a complete stream: END is refused unless every page of
 * every region arrived (in a DATA or ZERO record) and, with
 * MIG_F_PAGE_HASH, the latest copy of every DATA page matched its hash.
 * (While the source's guest runs, a write between the source's hash and
 * its send gives a torn copy that does not match; the tracker reports
 * that write, so the page comes again.  A copy that never does is a
 * damaged transfer, refused before the guest runs.)
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <linux/kvm.h>

#define MIG_MAGIC "KVMDMIG"
#define MIG_VERSION 4
#define MIG_PAGE_SIZE 4096u
#define MIG_MAX_REGIONS 65535u /* the library's own limit (KVM's memslots, at most 65,535 ids) */
#define MIG_MAX_VCPUS 1024 /* KVM's default KVM_MAX_VCPUS on x86 */
#define MIG_RUN_PAGES 256u /* pages a DATA record carries at most (1 MiB) */

/*
 * A stream over several connections (session.h): each connection carries
 * a stream of its own, framed as above, each ending with its own END
 * whose checksum covers that connection's records.  The header, the
 * region table, PASS and VCPU records travel on connection 0 only.  The
 * pages of a region go by chunks of MIG_LANE_PAGES (a multiple of 64, so
 * no two connections share a word of a page bitmap): chunk k of region r
 * on connection (k + r) % connections, always, so every copy of a page
 * takes the same connection, in order, and a copy from an earlier pass
 * can never land after a later one.  A DATA or ZERO record stays within
 * one chunk.
 */
#define MIG_LANE_PAGES 256u

static inline uint32_t mig_lane_of(uint32_t region, uint64_t page, uint32_t lanes)
{
	return (uint32_t)((page / MIG_LANE_PAGES + region) % lanes);
}

struct mig_header {
	char magic[8]; /* MIG_MAGIC, NUL-padded */
	uint32_t version;
	uint32_t page_size;
	uint32_t nr_regions;
	uint32_t nr_vcpus;
	uint32_t flags; /* MIG_F_* */
	uint32_t reserved;
};

#define MIG_F_PAGE_HASH (1u << 0) /* DATA records carry a hash per page */
/* the stream may leave pages at the source (LEFT), to come after the handoff; needs MIG_F_PAGE_HASH */
#define MIG_F_POSTCOPY (1u << 1)
/* DATA may come compressed (DATA_Z, zstd); the session agreed to it (MIG_S_ZSTD) */
#define MIG_F_ZSTD (1u << 2)

struct mig_region {
	uint64_t gpa;
	uint64_t size;
};

enum mig_kind {
	MIG_DATA = 1,
	MIG_ZERO = 2,
	MIG_PASS = 3,
	MIG_VCPU = 4,
	/* 5 was version 1's DIGEST */
	MIG_END = 6,
	MIG_VM = 7,
	MIG_DEVICES = 8,
	MIG_DEVICES_LIVE = 9,
	MIG_LEFT = 10,
	/* post-copy, after the handoff */
	MIG_REQ = 11,
	MIG_ALL_IN = 12,
	MIG_PC_FAILED = 13,
	MIG_RECOVER = 14,
	MIG_DATA_Z = 15,
};

#define MIG_DEVICES_MAX (256ull << 20) /* device state a stream or snapshot carries at most, both parts together */

struct mig_record {
	uint32_t kind;
	uint32_t index;
	uint64_t first;
	uint64_t count;
};

/* DATA_Z's count: its pages and its compressed bytes */
static inline uint64_t mig_zpages(const struct mig_record *rec)
{
	return rec->count & 0xffffffffu;
}

static inline uint64_t mig_zbytes(const struct mig_record *rec)
{
	return rec->count >> 32;
}

/* The compressed bytes a DATA_Z of pages may carry at most: zstd's bound for that input. */
uint64_t mig_zbound(uint64_t pages);

/*
 * A DATA_Z frame's receiver: a zstd decompression context whose window
 * is bounded by a record's pages (NULL: out of memory); freed with
 * mig_unzip_free().  mig_unzip(): the frame at src (zbytes) into dst
 * (pages * MIG_PAGE_SIZE bytes, never more written): 0 when it said
 * its size and gave exactly that, else -EPROTO with "record N (DATA_Z):
 * why" in err (nrec: the record's number).
 */
void *mig_unzip_new(void);
void mig_unzip_free(void *dctx);
int mig_unzip(void *dctx, void *dst, uint64_t pages, const void *src, uint64_t zbytes, uint64_t nrec, char *err,
	      size_t len);

/* The DATA_Z record that stands for data (a DATA record already encoded), its frame zbytes long. */
static inline struct mig_record mig_data_z(const struct mig_record *data, uint64_t zbytes)
{
	return (struct mig_record){ .kind = MIG_DATA_Z, .index = data->index, .first = data->first,
				    .count = data->count | (zbytes << 32) };
}

/*
 * A vCPU's whole state, as KVM gives it (guest.h: mig_vcpu_save_kvm()):
 * registers, special registers (the APIC base among them), XSAVE, XCR0,
 * the in-kernel LAPIC, pending events, MP state, debug registers and the
 * MSRs the host's KVM saves (KVM_GET_MSR_INDEX_LIST, and the ones a
 * kernel sets: SYSCALL's, SYSENTER's, PAT, TSC_AUX, kvmclock's).  parts
 * says which of the optional parts were saved (a VMM without an in-kernel
 * LAPIC has none): a part not saved is all zero and left alone at load.
 * msrs[0 .. nr_msrs) in ascending index, no two the same; every byte past
 * them, and reserved, zero.  The load order is KVM's (guest.c).
 */
#define MIG_VCPU_MSRS 256 /* MSRs a record holds: a host's KVM saves 40 to 150 (its PMU's among them) */

#define MIG_VS_XCRS (1u << 0)
#define MIG_VS_LAPIC (1u << 1)
#define MIG_VS_EVENTS (1u << 2)
#define MIG_VS_MP_STATE (1u << 3)
#define MIG_VS_DEBUGREGS (1u << 4)
#define MIG_VS_ALL 0x1fu

struct mig_vcpu_state {
	struct kvm_regs regs;
	struct kvm_sregs sregs;
	struct kvm_xsave xsave;
	struct kvm_xcrs xcrs;
	struct kvm_lapic_state lapic;
	struct kvm_vcpu_events events;
	struct kvm_debugregs debugregs;
	struct kvm_mp_state mp_state;
	uint32_t parts; /* MIG_VS_* */
	uint32_t nr_msrs;
	uint32_t reserved;
	struct kvm_msr_entry msrs[MIG_VCPU_MSRS];
};

_Static_assert(sizeof(struct mig_vcpu_state) == 10272, "the VCPU record's payload: no padding, the same everywhere");

/*
 * The VM's own state, as KVM gives it (guest.h: mig_vm_save_kvm()): the
 * in-kernel irqchip (both PICs and the IOAPIC), the PIT and the clock
 * (kvmclock's base).  parts says which were saved (a VMM without an
 * in-kernel irqchip or PIT has none); a part not saved is all zero and
 * left alone at load.  The load order is KVM's: irqchip, PIT, clock last.
 */
#define MIG_VMS_IRQCHIP (1u << 0)
#define MIG_VMS_PIT (1u << 1)
#define MIG_VMS_CLOCK (1u << 2)
#define MIG_VMS_ALL 0x7u

struct mig_vm_state {
	uint32_t parts; /* MIG_VMS_* */
	uint32_t reserved;
	struct kvm_irqchip pic[2]; /* chip_id KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE */
	struct kvm_irqchip ioapic; /* chip_id KVM_IRQCHIP_IOAPIC */
	struct kvm_pit_state2 pit;
	struct kvm_clock_data clock;
};

_Static_assert(sizeof(struct mig_vm_state) == 1728, "the VM record's payload: no padding, the same everywhere");

/* Whether st is in form (parts known, each chip's id its place's, reserved zero): as mig_vcpu_state_check(). */
int mig_vm_state_check(const struct mig_vm_state *st, const char *what, char *err, size_t len);

/*
 * Whether st is in form (parts known, the MSR list ascending and within
 * bounds, nothing past it): 0, or -EPROTO with "what: field: why" in err
 * (what: "record 7 (VCPU)", a snapshot's "vCPU 2", ...).
 */
int mig_vcpu_state_check(const struct mig_vcpu_state *st, const char *what, char *err, size_t len);

/* Every 128-byte message after the stream, and every refusal, session's included. */
enum mig_msg_kind {
	MIG_MSG_REFUSED = 0, /* status < 0 */
	MIG_MSG_READY = 1,
	MIG_MSG_COMMIT = 2,
	MIG_MSG_ABORT = 3,
	MIG_MSG_ACK = 4,
};

struct mig_ack {
	int32_t status; /* 0, or a negative errno */
	uint32_t kind;	/* enum mig_msg_kind */
	char message[120];
};

/*
 * Text a peer sent, n bytes of in, as it may be printed: printable ASCII
 * only (every other byte a '?'), cut to fit out[len], terminated.
 */
void mig_printable(const char *in, size_t n, char *out, size_t len);

/* "REFUSED", "READY", ... or "?" */
const char *mig_msg_name(uint32_t kind);

/*
 * An answer's message as the peer sent it, made safe to print on one
 * line and to quote in JSON: terminated, every control byte (newlines,
 * escapes) and every byte outside ASCII a '?'.
 * Returns ack->message.
 */
const char *mig_ack_text(struct mig_ack *ack);

_Static_assert(sizeof(struct mig_header) == 32, "stream layout");
_Static_assert(sizeof(struct mig_region) == 16, "stream layout");
_Static_assert(sizeof(struct mig_record) == 24, "stream layout");
_Static_assert(sizeof(struct mig_ack) == 128, "stream layout");

/*
 * A page's hash, part of the format: eight 64-bit lanes of
 * multiply-accumulate over the page's words with a key that changes from
 * one 64-byte stripe to the next (so moved or swapped stripes change it),
 * folded at the end.  The AVX2 code and the portable code give the same
 * value; mig_page_hash() picks the AVX2 one where the CPU has it.
 */
uint64_t mig_page_hash(const void *page);
uint64_t mig_page_hash_portable(const void *page);
/*
 * mig_page_hash(page), and the page copied to dst (MIG_PAGE_SIZE bytes,
 * not overlapping) as it is read: what dst holds is what was hashed,
 * whatever writes the page meanwhile, and the page is read once.
 */
uint64_t mig_page_hash_copy(void *dst, const void *page);
/* The hash of a page of zeroes. */
uint64_t mig_zero_page_hash(void);

/* END's checksum: FNV-1a 64. */
#define MIG_SUM_INIT 0xcbf29ce484222325ull
uint64_t mig_sum(uint64_t sum, const void *p, size_t n);

/* Payload bytes that follow rec in a stream whose header has flags. */
uint64_t mig_payload_len(uint32_t flags, const struct mig_record *rec);

/* "DATA", "ZERO", ... or "?" */
const char *mig_kind_name(uint32_t kind);

/*
 * ---- encoding ----
 * One function a record kind.  Each returns the record to send and folds
 * it, and the payload END covers, into e->sum; the caller sends the record
 * and its payload as mig_payload_len() says, in the order of the calls
 * (a DATA record's hashes may be computed after the call: END does not
 * cover them).
 */
struct mig_encoder {
	uint32_t flags;
	uint64_t sum;
};

void mig_encode_header(struct mig_encoder *e, struct mig_header *ret_h, const struct mig_region *regions,
		       uint32_t nr_regions, uint32_t nr_vcpus, uint32_t flags);
struct mig_record mig_encode_data(struct mig_encoder *e, uint32_t region, uint64_t first, uint64_t count);
struct mig_record mig_encode_zero(struct mig_encoder *e, uint32_t region, uint64_t first, uint64_t count);
struct mig_record mig_encode_pass(struct mig_encoder *e, uint64_t pass);
struct mig_record mig_encode_vcpu(struct mig_encoder *e, uint32_t vcpu, const struct mig_vcpu_state *st);
struct mig_record mig_encode_vm(struct mig_encoder *e, const struct mig_vm_state *st);
struct mig_record mig_encode_devices(struct mig_encoder *e, const void *state, uint64_t len);
struct mig_record mig_encode_devices_live(struct mig_encoder *e, const void *state, uint64_t len);
struct mig_record mig_encode_left(struct mig_encoder *e, uint32_t region, uint64_t first, uint64_t count);
struct mig_record mig_encode_end(struct mig_encoder *e);

/*
 * ---- decoding ----
 * The destination's side: each function checks one part of the stream
 * against what the destination registered and the stream so far, folds it
 * into the checksum, and returns 0, or -EPROTO with a one-line reason in
 * err naming the field ("record 12 (VCPU).first: 3, must be 0").  Pages
 * (coverage, hashes) are the caller's: the decoder has no memory.
 */
struct mig_decoder {
	const struct mig_region *regions; /* the destination's own */
	uint32_t nr_regions, nr_vcpus;
	uint32_t flags; /* the header's */
	uint64_t sum;
	uint64_t nrec; /* records decoded so far */
	uint64_t pass; /* last PASS */
	uint64_t vcpu_seen[MIG_MAX_VCPUS / 64];
	bool vm_seen, devices_seen, devices_live_seen;
	uint64_t devices_live_bytes; /* DEVICES_LIVE's count: DEVICES may bring MIG_DEVICES_MAX less it */
	bool stopped; /* a VCPU record came: the guest was paused */
	uint32_t lane, lanes; /* which connection of how many this stream is on (0 of 1 unless set) */
	bool postcopy_ok;     /* MIG_F_POSTCOPY is taken (the session agreed to it) */
	bool zstd_ok;	      /* MIG_F_ZSTD is taken (the session agreed to it) */
};

void mig_decoder_init(struct mig_decoder *d, const struct mig_region *regions, uint32_t nr_regions,
		      uint32_t nr_vcpus);
int mig_decode_header(struct mig_decoder *d, const struct mig_header *h, char *err, size_t len);
int mig_decode_regions(struct mig_decoder *d, const struct mig_region *theirs, char *err, size_t len);
/* Any record header: dispatches on kind to the functions below. */
int mig_decode_record(struct mig_decoder *d, const struct mig_record *rec, char *err, size_t len);
int mig_decode_data(struct mig_decoder *d, const struct mig_record *rec, char *err, size_t len);
int mig_decode_zero(struct mig_decoder *d, const struct mig_record *rec, char *err, size_t len);
int mig_decode_pass(struct mig_decoder *d, const struct mig_record *rec, char *err, size_t len);
int mig_decode_vcpu(struct mig_decoder *d, const struct mig_record *rec, char *err, size_t len);
int mig_decode_vm(struct mig_decoder *d, const struct mig_record *rec, char *err, size_t len);
int mig_decode_devices(struct mig_decoder *d, const struct mig_record *rec, char *err, size_t len);
int mig_decode_devices_live(struct mig_decoder *d, const struct mig_record *rec, char *err, size_t len);
int mig_decode_left(struct mig_decoder *d, const struct mig_record *rec, char *err, size_t len);
int mig_decode_data_z(struct mig_decoder *d, const struct mig_record *rec, char *err, size_t len);
int mig_decode_end(struct mig_decoder *d, const struct mig_record *rec, char *err, size_t len);
/*
 * A post-copy record (after the handoff) against regions[0 .. nr):
 * to_dest, DATA (1 .. MIG_RUN_PAGES pages inside a region); otherwise
 * REQ (the same bounds) or ALL_IN (its figures unchecked).  0, or -EPROTO with
 * "post-copy record N (KIND).field: why" in err.
 */
int mig_pc_check(const struct mig_region *regions, uint32_t nr, const struct mig_record *rec, uint64_t nrec,
		 bool to_dest, char *err, size_t len);
/*
 * A record of a recovery's answer (the pages the destination lacks): a
 * LEFT run inside a region (any count), or END.  0 (1 for END), or
 * -EPROTO with "post-copy recovery: record N (KIND): why" in err.
 */
int mig_pc_map_check(const struct mig_region *regions, uint32_t nr, const struct mig_record *rec, uint64_t nrec,
		     char *err, size_t len);
/* A VCPU record's payload, after its record was decoded. */
int mig_decode_vcpu_state(struct mig_decoder *d, const struct mig_vcpu_state *st, char *err, size_t len);
/* A DEVICES or DEVICES_LIVE record's payload, after its record was decoded: summed. */
void mig_decode_devices_state(struct mig_decoder *d, const void *state, uint64_t len);
/* A VM record's payload, after its record was decoded. */
int mig_decode_vm_state(struct mig_decoder *d, const struct mig_vm_state *st, char *err, size_t len);

/*
 * ---- streams held in memory (tests, the fuzzer's corpus) ----
 * Walk the records of a stream framed as above: fn(off, rec, opaque) for
 * each, up to and including END; a non-zero return from fn stops the walk
 * and is returned.  *ret_end (when not NULL) gets the offset just past END.
 * -EPROTO if the buffer ends before END.  Only lengths are checked.
 */
int mig_stream_walk(const void *buf, size_t len, int (*fn)(size_t off, const struct mig_record *rec, void *opaque),
		    void *opaque, size_t *ret_end);
/* Recompute END's checksum after a change to the stream before it. */
int mig_stream_reseal(void *buf, size_t len);

#endif
