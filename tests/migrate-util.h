/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_TEST_MIGRATE_UTIL_H
#define KVMDIRTY_TEST_MIGRATE_UTIL_H

/*
 * What the migration tests share.  A destination that records a stream
 * to its end and says ok.  A guest in plain memory behind the engine's
 * guest interface, and a stream read from memory: the destination's
 * decoder with no KVM and no socket (test-stream, the fuzzer).  Its
 * layout is the one the
 * fuzzer's seed streams were recorded from (tests/fuzz/record-seeds.c):
 * 16 pages at gpa 0, 8 pages at 4 GiB, two vCPUs.  Region memory is
 * allocated to the byte, so AddressSanitizer sees any write past it.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dest.h"

#define FAKE_NR_VCPUS 2

static const struct mig_region fake_layout[] = {
	{ .gpa = 0, .size = 16 * MIG_PAGE_SIZE },
	{ .gpa = 4ull << 30, .size = 8 * MIG_PAGE_SIZE },
};

#define FAKE_NR_REGIONS (sizeof(fake_layout) / sizeof(fake_layout[0]))

struct fake_guest {
	struct mig_guest g;
	struct mig_vcpu_state loaded[FAKE_NR_VCPUS];
	unsigned int loads;
};

static inline int fake_vcpu_load(void *ctx, unsigned int i, const struct mig_vcpu_state *st)
{
	struct fake_guest *f = ctx;

	if (i >= FAKE_NR_VCPUS)
		abort();
	f->loaded[i] = *st;
	f->loads++;
	return 0;
}

static inline int fake_vcpu_save(void *ctx, unsigned int i, struct mig_vcpu_state *st)
{
	(void)ctx;
	memset(st, 0, sizeof(*st));
	st->regs.rip = 0x100000 + i;
	st->msrs[0].index = mig_msr_index[0];
	return 0;
}

static inline void fake_nothing(void *ctx)
{
	(void)ctx;
}

static const struct mig_guest_ops fake_ops = {
	.vcpu_save = fake_vcpu_save,
	.vcpu_load = fake_vcpu_load,
	.pause = fake_nothing,
	.resume = fake_nothing,
};

static inline int fake_guest_init(struct fake_guest *f)
{
	unsigned int i;

	memset(f, 0, sizeof(*f));
	f->g.nr_regions = FAKE_NR_REGIONS;
	f->g.nr_vcpus = FAKE_NR_VCPUS;
	f->g.ops = &fake_ops;
	f->g.ctx = f;
	for (i = 0; i < FAKE_NR_REGIONS; i++) {
		f->g.regions[i] = (struct mig_guest_region){ .gpa = fake_layout[i].gpa, .size = fake_layout[i].size,
							     .hva = calloc(1, fake_layout[i].size) };
		if (!f->g.regions[i].hva)
			return -ENOMEM;
	}
	return 0;
}

static inline void fake_guest_free(struct fake_guest *f)
{
	unsigned int i;

	for (i = 0; i < FAKE_NR_REGIONS; i++)
		free(f->g.regions[i].hva);
}

struct mem_stream {
	const uint8_t *buf;
	size_t len, off;
};

static inline int mem_read(void *ctx, void *buf, size_t len)
{
	struct mem_stream *m = ctx;
	size_t n = m->len - m->off < len ? m->len - m->off : len;

	memcpy(buf, m->buf + m->off, n);
	m->off += n;
	return (int)n;
}

static inline void mem_describe(void *ctx, int ret, char *buf, size_t len)
{
	(void)ctx;
	snprintf(buf, len, "%s", strerror(-ret));
}

/* Receive buf into f; mig_recv_stream()'s result, and *ret_used the bytes it read. */
static inline int fake_receive(struct fake_guest *f, const uint8_t *buf, size_t len, bool inline_hash, char *err,
			       size_t elen, size_t *ret_used)
{
	struct mem_stream m = { .buf = buf, .len = len };
	struct mig_reader rd = { .read = mem_read, .describe = mem_describe, .ctx = &m };
	struct mig_recv_result res;
	int ret;

	f->loads = 0;
	ret = mig_recv_stream(&f->g, &rd, inline_hash, &res, err, elen);
	if (ret_used)
		*ret_used = m.off;
	return ret;
}

/* A destination that reads a stream to its end, then answers ok. */
struct recorder {
	int fd;
	uint8_t *buf;
	size_t len, cap;
};

/* pthread entry: r on success, NULL if the stream could not be read or answered */
static inline void *recorder_run(void *p)
{
	struct recorder *r = p;
	struct mig_ack ack = { .status = 0, .message = "ok" };
	ssize_t k;

	do {
		if (r->len == r->cap) {
			r->cap = r->cap ? r->cap * 2 : 1 << 20;
			r->buf = realloc(r->buf, r->cap);
			if (!r->buf)
				return NULL;
		}
		k = read(r->fd, r->buf + r->len, r->cap - r->len);
		if (k > 0)
			r->len += (size_t)k;
	} while (k > 0);
	if (k < 0 || write(r->fd, &ack, sizeof(ack)) != sizeof(ack))
		return NULL;
	return r;
}

#endif
