/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_STREAM_H
#define KVMDIRTY_MIGRATE_STREAM_H

/*
 * The migration stream, version 1.  Everything the two ends exchange is
 * defined here.  Integers are little-endian (both ends are x86-64).
 *
 *   header      struct mig_header
 *   regions     struct mig_region[header.nr_regions], in slot order
 *   records     struct mig_record, each followed by its payload:
 *     DATA      index = region, first = page, count = pages;
 *               payload: count * page_size bytes of memory
 *     ZERO      index = region, first = page, count = pages; no payload
 *     PASS      a pre-copy pass ended; first = pass number; no payload
 *     VCPU      index = vCPU, count = sizeof(struct mig_vcpu_state);
 *               payload: that state
 *     DIGEST    index = region, count = the region's pages;
 *               payload: one uint64_t hash per page
 *     END       the stream is complete; first = FNV-1a 64 of every byte
 *               before it except DATA payloads (which the digests cover)
 *   ack         destination -> source: struct mig_ack, after END
 *
 * The destination checks every field before it acts on it: a magic,
 * version, page size or region table other than its own, a record kind,
 * region, vCPU or page range outside what it registered, a payload length
 * other than the one the kind fixes, a VCPU or DIGEST record missing or
 * repeated, bytes missing at the end.  Memory is received straight into
 * guest memory, but only after the record header that places it was
 * checked, and the guest runs only after END (and the digests, when sent)
 * checked out.
 */
#include <stdint.h>

#include <linux/kvm.h>

#define MIG_MAGIC "KVMDMIG"
#define MIG_VERSION 1

struct mig_header {
	char magic[8]; /* MIG_MAGIC, NUL-padded */
	uint32_t version;
	uint32_t page_size;
	uint32_t nr_regions;
	uint32_t nr_vcpus;
	uint32_t flags; /* MIG_F_* */
	uint32_t reserved;
};

#define MIG_F_DIGEST (1u << 0) /* DIGEST records precede END */

struct mig_region {
	uint64_t gpa;
	uint64_t size;
};

enum mig_kind {
	MIG_DATA = 1,
	MIG_ZERO = 2,
	MIG_PASS = 3,
	MIG_VCPU = 4,
	MIG_DIGEST = 5,
	MIG_END = 6,
};

struct mig_record {
	uint32_t kind;
	uint32_t index;
	uint64_t first;
	uint64_t count;
};

#define MIG_NR_MSRS 1 /* IA32_TSC: the guest paces itself with rdtsc */

struct mig_vcpu_state {
	struct kvm_regs regs;
	struct kvm_sregs sregs;
	struct kvm_xsave xsave;
	struct kvm_msr_entry msrs[MIG_NR_MSRS];
};

struct mig_ack {
	int32_t status; /* 0, or a negative errno */
	char message[124];
};

_Static_assert(sizeof(struct mig_header) == 32, "stream layout");
_Static_assert(sizeof(struct mig_record) == 24, "stream layout");
_Static_assert(sizeof(struct mig_ack) == 128, "stream layout");

#endif
