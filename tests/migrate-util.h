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

#include <pthread.h>
#include <sys/socket.h>

#include <zstd.h>

#include "channel.h"
#include "dest.h"

#define FAKE_NR_VCPUS 2

static const struct mig_region fake_layout[] = {
	{ .gpa = 0, .size = 16 * MIG_PAGE_SIZE },
	{ .gpa = 4ull << 30, .size = 8 * MIG_PAGE_SIZE },
};

#define FAKE_NR_REGIONS (sizeof(fake_layout) / sizeof(fake_layout[0]))

struct fake_guest {
	struct mig_guest g;
	void *mem[FAKE_NR_REGIONS]; /* the regions' memory (g.regions, which mig_guest_release() frees, points here) */
	/* each vCPU's state: fresh (fake_fresh()) until a stream loads one */
	struct mig_vcpu_state loaded[FAKE_NR_VCPUS];
	/* with devices (fake_devices_ops): their state, as saved or last loaded */
	void *dev;
	size_t dev_len;
	bool fail_devices; /* the next devices_load fails with -EINVAL, loading nothing */
	/* with fake_live_ops: the part given before the pause, and the order of the loads ("LD": live, then devices) */
	void *dev_live;
	size_t dev_live_len;
	bool fail_live;
	char order[8];
	unsigned int loads;
	int fail_load; /* vCPU whose next load fails with -EIO, or -1 */
	uint64_t left; /* a post-copy input's stream: the pages it left at the source */
};

/* A VM's own state as a stream of the fake guest carries it: the clock alone. */
static const struct mig_vm_state fake_vm = { .parts = MIG_VMS_CLOCK, .clock.clock = 1000000 };

/* A vCPU's state as a new guest has it. */
static inline void fake_fresh(unsigned int i, struct mig_vcpu_state *st)
{
	memset(st, 0, sizeof(*st));
	st->regs.rip = 0x100000 + i;
	st->nr_msrs = 1;
	st->msrs[0].index = 0x10; /* IA32_TSC */
}

static inline int fake_vcpu_load(void *ctx, unsigned int i, const struct mig_vcpu_state *st)
{
	struct fake_guest *f = ctx;

	if (i >= FAKE_NR_VCPUS)
		abort();
	if ((int)i == f->fail_load) {
		/* as KVM's loads fail: part of the state set (the special registers), then an error */
		f->fail_load = -1;
		f->loaded[i].regs.rip = st->regs.rip ^ 0xbad;
		return -EIO;
	}
	f->loaded[i] = *st;
	f->loads++;
	return 0;
}

static inline int fake_vcpu_save(void *ctx, unsigned int i, struct mig_vcpu_state *st)
{
	struct fake_guest *f = ctx;

	if (i >= FAKE_NR_VCPUS)
		abort();
	*st = f->loaded[i];
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

static inline int fake_devices_save(void *ctx, void **ret, size_t *ret_len)
{
	struct fake_guest *f = ctx;

	*ret = f->dev_len ? malloc(f->dev_len) : NULL;
	if (f->dev_len && !*ret)
		return -ENOMEM;
	if (f->dev_len)
		memcpy(*ret, f->dev, f->dev_len);
	*ret_len = f->dev_len;
	return 0;
}

static inline int fake_devices_load(void *ctx, const void *state, size_t len)
{
	struct fake_guest *f = ctx;

	if (f->fail_devices) {
		f->fail_devices = false;
		return -EINVAL;
	}
	free(f->dev);
	f->dev = len ? malloc(len) : NULL;
	if (len && !f->dev)
		return -ENOMEM;
	if (len)
		memcpy(f->dev, state, len);
	f->dev_len = len;
	return 0;
}

static inline int fake_copy(void **dst, size_t *dst_len, const void *src, size_t len)
{
	free(*dst);
	*dst = len ? malloc(len) : NULL;
	if (len && !*dst)
		return -ENOMEM;
	if (len)
		memcpy(*dst, src, len);
	*dst_len = len;
	return 0;
}

static inline int fake_live_save(void *ctx, void **ret, size_t *ret_len)
{
	struct fake_guest *f = ctx;

	*ret = NULL;
	return fake_copy(ret, ret_len, f->dev_live, f->dev_live_len);
}

static inline int fake_live_load(void *ctx, const void *state, size_t len)
{
	struct fake_guest *f = ctx;

	if (f->fail_live) {
		f->fail_live = false;
		return -EINVAL;
	}
	strncat(f->order, "L", sizeof(f->order) - strlen(f->order) - 1);
	return fake_copy(&f->dev_live, &f->dev_live_len, state, len);
}

static inline int fake_live_devices_load(void *ctx, const void *state, size_t len)
{
	struct fake_guest *f = ctx;

	strncat(f->order, "D", sizeof(f->order) - strlen(f->order) - 1);
	return fake_devices_load(ctx, state, len);
}

/* The fake guest with devices whose bulk goes before the pause (dev_live), the rest in dev. */
static const struct mig_guest_ops fake_live_ops = {
	.vcpu_save = fake_vcpu_save,
	.vcpu_load = fake_vcpu_load,
	.devices_save = fake_devices_save,
	.devices_load = fake_live_devices_load,
	.devices_save_live = fake_live_save,
	.devices_load_live = fake_live_load,
	.pause = fake_nothing,
	.resume = fake_nothing,
};

/* The fake guest with devices: its state a byte string in dev. */
static const struct mig_guest_ops fake_devices_ops = {
	.vcpu_save = fake_vcpu_save,
	.vcpu_load = fake_vcpu_load,
	.devices_save = fake_devices_save,
	.devices_load = fake_devices_load,
	.pause = fake_nothing,
	.resume = fake_nothing,
};

static inline int fake_guest_init(struct fake_guest *f)
{
	unsigned int i;

	memset(f, 0, sizeof(*f));
	f->fail_load = -1;
	for (i = 0; i < FAKE_NR_VCPUS; i++)
		fake_fresh(i, &f->loaded[i]);
	f->g.nr_regions = FAKE_NR_REGIONS;
	f->g.nr_vcpus = FAKE_NR_VCPUS;
	f->g.ops = &fake_ops;
	f->g.ctx = f;
	f->g.regions = calloc(FAKE_NR_REGIONS, sizeof(*f->g.regions));
	if (!f->g.regions)
		return -ENOMEM;
	for (i = 0; i < FAKE_NR_REGIONS; i++) {
		f->mem[i] = calloc(1, fake_layout[i].size);
		f->g.regions[i] = (struct mig_guest_region){ .gpa = fake_layout[i].gpa, .size = fake_layout[i].size,
							     .hva = f->mem[i] };
		if (!f->mem[i])
			return -ENOMEM;
	}
	return 0;
}

static inline void fake_guest_free(struct fake_guest *f)
{
	unsigned int i;

	mig_guest_release(&f->g);
	for (i = 0; i < FAKE_NR_REGIONS; i++)
		free(f->mem[i]);
	free(f->dev);
	free(f->dev_live);
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

/*
 * A stream in sealed records (channel.h), as the fuzzer takes one: this
 * magic, one byte (bit 0: encrypted), then the records of connection 0
 * under FAKE_SEAL_KEY, the source's direction.
 */
#define FAKE_SEALED_MAGIC "KVMDSEAL"
/* an input of the fuzzer's that is a post-copy stream, then post-copy's records (fuzz-dest.c) */
#define FAKE_POSTCOPY_MAGIC "KVMDPCP"
#define FAKE_SEALED_HDR 9

static inline struct mig_chan_keys fake_seal_keys(bool encrypt, bool source)
{
	struct mig_chan_keys k = { .conn = 0, .encrypt = encrypt };

	memset(source ? k.send : k.recv, 0x5e, MIG_SEAL_KEY);
	memset(source ? k.recv : k.send, 0xa1, MIG_SEAL_KEY);
	return k;
}

/*
 * Receive buf into f; mig_recv_stream()'s result, and *ret_used the bytes
 * it read.  A buffer that starts with FAKE_SEALED_MAGIC is opened from
 * its sealed records first.
 */
static inline int fake_receive(struct fake_guest *f, const uint8_t *buf, size_t len, bool inline_hash, char *err,
			       size_t elen, size_t *ret_used)
{
	struct mem_stream m = { .buf = buf, .len = len };
	struct mig_reader rd = { .read = mem_read, .describe = mem_describe, .ctx = &m };
	struct mig_recv_result res;
	struct mig_chan *ch = NULL;
	int ret;

	f->loads = 0;
	f->left = 0;
	/* a stream of a session that agreed to post-copy (LEFT taken); post-copy's records may follow it */
	if (len >= 8 && !memcmp(buf, FAKE_POSTCOPY_MAGIC, 8)) {
		m.off = 8;
		ret = mig_recv_stream_postcopy(&f->g, &rd, inline_hash, &f->left, &res, err, elen);
		if (ret_used)
			*ret_used = m.off;
		return ret;
	}
	if (len >= FAKE_SEALED_HDR && !memcmp(buf, FAKE_SEALED_MAGIC, 8)) {
		struct mig_chan_keys k = fake_seal_keys(buf[8] & 1, false);

		m.off = FAKE_SEALED_HDR;
		if (mig_chan_new_reader(&rd, &k, &ch) < 0)
			abort();
		rd = mig_chan_reader(ch);
	}
	ret = mig_recv_stream(&f->g, &rd, inline_hash, &res, err, elen);
	mig_chan_free(ch);
	if (ret_used)
		*ret_used = m.off;
	return ret;
}

/*
 * A stream's DATA records as DATA_Z (the header gets MIG_F_ZSTD, END's
 * checksum made right again): every second DATA record (every one with
 * FAKE_ZIP_ALL), its pages compressed as how says.  A new buffer
 * (*ret_len bytes, the caller's to free), or NULL.
 */
enum fake_zip {
	FAKE_ZIP_OK,	    /* each frame its record's pages, as a sender makes it */
	FAKE_ZIP_ALL,	    /* ... every DATA record */
	FAKE_ZIP_FEWER,	    /* the frame holds a page fewer than the record says */
	FAKE_ZIP_NO_SIZE,   /* the frame does not say its size */
	FAKE_ZIP_TRAILER,   /* the right frame, then a second: 64 MiB of zeroes */
	FAKE_ZIP_GIANT,	    /* a frame of 64 MiB of zeroes in place of the pages */
	FAKE_ZIP_WRONG,	    /* the frame's pages are not those the hashes are of (first byte flipped) */
	FAKE_ZIP_OVERBOUND, /* the record says more bytes than zstd's bound for its pages (the frame padded) */
	FAKE_ZIP_NO_FLAG,   /* as OK, without MIG_F_ZSTD in the header */
	FAKE_ZIP_SKIPPABLE, /* the right frame, then a skippable frame of 64 bytes */
	FAKE_ZIP_LEGACY,    /* the pages in a frame of zstd's legacy v0.7 format (raw blocks) */
	FAKE_ZIP_WINDOW,    /* the right frame's header rewritten to ask for a window of 1 GiB */
};

static inline size_t fake_le32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
	return 4;
}

/* bytes in a frame of zstd's legacy v0.7 format: its magic, a 4-byte content size, raw blocks of 128 KiB, the end */
static inline size_t fake_legacy07(uint8_t *o, const uint8_t *in, size_t bytes)
{
	size_t n = fake_le32(o, 0xfd2fb527u), off, b;

	o[n++] = 0xa0; /* content size in 4 bytes, a single segment */
	n += fake_le32(o + n, (uint32_t)bytes);
	for (off = 0; off < bytes; off += b) {
		b = bytes - off > (128u << 10) ? 128u << 10 : bytes - off;
		o[n++] = (uint8_t)(1u << 6 | ((b >> 16) & 7)); /* a raw block */
		o[n++] = (uint8_t)(b >> 8);
		o[n++] = (uint8_t)b;
		memcpy(o + n, in + off, b);
		n += b;
	}
	o[n++] = 0xc0; /* the end */
	o[n++] = 0;
	o[n++] = 0;
	return n;
}

/* A frame of n bytes made to ask for a window of 1 GiB: not single-segment, window byte 2^30, size in 4 bytes. */
static inline size_t fake_big_window(uint8_t *frame, size_t n)
{
	static const unsigned int did_len[] = { 0, 1, 2, 4 };
	uint8_t fhd = frame[4], *copy = malloc(n);
	unsigned int ss = (fhd >> 5) & 1, fcs = fhd >> 6;
	size_t hs = 5 + !ss + did_len[fhd & 3] + (fcs == 0 ? ss : fcs == 1 ? 2 : fcs == 2 ? 4 : 8), k;
	uint64_t size = ZSTD_getFrameContentSize(frame, n);

	if (!copy)
		return 0;
	memcpy(copy, frame, n);
	k = fake_le32(frame, 0xfd2fb528u);
	frame[k++] = (uint8_t)(2u << 6 | (fhd & 4)); /* content size in 4 bytes, the checksum flag as it was */
	frame[k++] = (30 - 10) << 3;		      /* a window of 2^30 */
	k += fake_le32(frame + k, (uint32_t)size);
	memcpy(frame + k, copy + hs, n - hs);
	free(copy);
	return k + n - hs;
}

struct fake_zip_walk {
	const uint8_t *in;
	uint8_t *out;
	size_t len, cap;
	uint32_t flags;
	unsigned int n;
	enum fake_zip how;
	int err;
};

/* zeroes, a MiB at a time, pledged as total bytes: a frame that says it holds them */
static inline size_t fake_zeroes_frame(ZSTD_CCtx *z, uint8_t *out, size_t cap, uint64_t total)
{
	static const uint8_t mib[1 << 20];
	ZSTD_outBuffer o = { out, cap, 0 };
	uint64_t fed;

	ZSTD_CCtx_reset(z, ZSTD_reset_session_and_parameters);
	ZSTD_CCtx_setPledgedSrcSize(z, total);
	for (fed = 0; fed < total; fed += sizeof(mib)) {
		ZSTD_inBuffer i = { mib, sizeof(mib), 0 };

		while (i.pos < i.size)
			if (ZSTD_isError(ZSTD_compressStream2(z, &o, &i, ZSTD_e_continue)))
				return 0;
	}
	for (;;) {
		ZSTD_inBuffer i = { NULL, 0, 0 };
		size_t left = ZSTD_compressStream2(z, &o, &i, ZSTD_e_end);

		if (ZSTD_isError(left))
			return 0;
		if (!left)
			return o.pos;
	}
}

static inline int fake_zip_one(size_t off, const struct mig_record *rec, void *opaque)
{
	struct fake_zip_walk *w = opaque;
	uint64_t plen = rec->kind == MIG_END ? 0 : mig_payload_len(w->flags, rec);
	const uint8_t *payload = w->in + off + sizeof(*rec);
	bool zip = rec->kind == MIG_DATA && (w->how != FAKE_ZIP_OK || w->n++ % 2 == 0);
	uint64_t hlen = zip && (w->flags & MIG_F_PAGE_HASH) ? rec->count * 8 : 0, bytes = rec->count * MIG_PAGE_SIZE;
	size_t need = sizeof(*rec) + plen + (zip ? ZSTD_compressBound(bytes) + 4096 : 0), n = 0;
	ZSTD_CCtx *z;
	uint8_t *pages;

	if (w->cap - w->len < need) {
		uint8_t *o = realloc(w->out, w->len + need + (1 << 20));

		if (!o)
			return w->err = -ENOMEM;
		w->out = o;
		w->cap = w->len + need + (1 << 20);
	}
	if (!zip) {
		memcpy(w->out + w->len, w->in + off, sizeof(*rec) + plen);
		w->len += sizeof(*rec) + plen;
		return 0;
	}
	z = ZSTD_createCCtx();
	pages = malloc(bytes);
	if (!z || !pages) {
		ZSTD_freeCCtx(z);
		free(pages);
		return w->err = -ENOMEM;
	}
	memcpy(pages, payload + hlen, bytes);
	if (w->how == FAKE_ZIP_WRONG)
		pages[100] ^= 1;
	{
		uint8_t *frame = w->out + w->len + sizeof(*rec) + hlen;
		size_t room = w->cap - w->len - sizeof(*rec) - hlen;

		if (w->how == FAKE_ZIP_NO_SIZE)
			ZSTD_CCtx_setParameter(z, ZSTD_c_contentSizeFlag, 0);
		if (w->how == FAKE_ZIP_GIANT) {
			n = fake_zeroes_frame(z, frame, room, 64ull << 20);
		} else if (w->how == FAKE_ZIP_LEGACY) {
			n = fake_legacy07(frame, pages, bytes);
		} else {
			ZSTD_CCtx_setParameter(z, ZSTD_c_compressionLevel, 1);
			n = ZSTD_compress2(z, frame, room, pages,
					   w->how == FAKE_ZIP_FEWER ? bytes - MIG_PAGE_SIZE : bytes);
			if (ZSTD_isError(n))
				n = 0;
		}
		if (n && w->how == FAKE_ZIP_TRAILER) {
			size_t t = fake_zeroes_frame(z, frame + n, room - n, 64ull << 20);

			n = t ? n + t : 0;
		}
		if (n && w->how == FAKE_ZIP_SKIPPABLE) {
			n += fake_le32(frame + n, 0x184d2a50u);
			n += fake_le32(frame + n, 64);
			memset(frame + n, 0x5a, 64);
			n += 64;
		}
		if (n && w->how == FAKE_ZIP_WINDOW)
			n = fake_big_window(frame, n);
		if (n && w->how == FAKE_ZIP_OVERBOUND) {
			size_t pad = mig_zbound(rec->count) + 1 - n;

			memset(frame + n, 0, pad); /* zero bytes after a frame: never read, the length refused first */
			n += pad;
		}
	}
	ZSTD_freeCCtx(z);
	free(pages);
	if (!n)
		return w->err = -EIO;
	{
		struct mig_record zr = mig_data_z(rec, n);

		memcpy(w->out + w->len, &zr, sizeof(zr));
		memcpy(w->out + w->len + sizeof(zr), payload, hlen);
		w->len += sizeof(zr) + hlen + n;
	}
	return 0;
}

static inline uint8_t *fake_zip(const uint8_t *buf, size_t len, enum fake_zip how, size_t *ret_len)
{
	struct fake_zip_walk w = { .in = buf, .how = how };
	struct mig_header h;
	size_t table;

	if (len < sizeof(h))
		return NULL;
	memcpy(&h, buf, sizeof(h));
	w.flags = h.flags;
	table = sizeof(h) + h.nr_regions * sizeof(struct mig_region);
	w.cap = table + (1 << 20);
	w.out = malloc(w.cap);
	if (!w.out)
		return NULL;
	memcpy(w.out, buf, table);
	if (how != FAKE_ZIP_NO_FLAG)
		h.flags |= MIG_F_ZSTD;
	memcpy(w.out, &h, sizeof(h));
	w.len = table;
	if (mig_stream_walk(buf, len, fake_zip_one, &w, NULL) || w.err || mig_stream_reseal(w.out, w.len)) {
		free(w.out);
		return NULL;
	}
	*ret_len = w.len;
	return w.out;
}

struct fake_drain {
	int fd;
	uint8_t *buf;
	size_t len;
};

static inline void *fake_drain_run(void *p)
{
	struct fake_drain *d = p;
	uint8_t b[65536];
	ssize_t k;

	while ((k = read(d->fd, b, sizeof(b))) > 0) {
		d->buf = realloc(d->buf, d->len + (size_t)k);
		memcpy(d->buf + d->len, b, (size_t)k);
		d->len += (size_t)k;
	}
	return NULL;
}

/*
 * A plain stream sealed as fake_receive() opens it, by the engine's own
 * channel, written in pieces of at most piece bytes (so records of that
 * size).  A malloc()ed buffer, or NULL.
 */
static inline uint8_t *fake_seal(const uint8_t *plain, size_t len, bool encrypt, size_t piece, size_t *ret_len)
{
	struct mig_chan_keys k = fake_seal_keys(encrypt, true);
	struct fake_drain d = { 0 };
	struct mig_chan *ch = NULL;
	struct mig_conn *c = NULL;
	pthread_t th;
	size_t off;
	int sv[2], ret = -1;

	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		return NULL;
	d.fd = sv[1];
	d.buf = malloc(FAKE_SEALED_HDR);
	memcpy(d.buf, FAKE_SEALED_MAGIC, 8);
	d.buf[8] = encrypt;
	d.len = FAKE_SEALED_HDR;
	if (pthread_create(&th, NULL, fake_drain_run, &d) == 0) {
		ret = mig_conn_new(sv[0], 10000, &c);
		if (ret == 0)
			ret = mig_chan_new(c, &k, &ch);
		for (off = 0; ret == 0 && off < len; off += piece) {
			struct iovec iov = { (void *)(plain + off), len - off < piece ? len - off : piece };

			ret = mig_chan_writev(ch, &iov, 1);
		}
		if (ret == 0)
			ret = mig_chan_close_write(ch);
		shutdown(sv[0], SHUT_WR);
		pthread_join(th, NULL);
	}
	mig_chan_free(ch);
	mig_conn_free(c);
	close(sv[0]);
	close(sv[1]);
	if (ret < 0) {
		free(d.buf);
		return NULL;
	}
	*ret_len = d.len;
	return d.buf;
}

/* Read a whole handoff message; false where the connection ended first. */
static inline bool read_msg(int fd, struct mig_ack *m)
{
	size_t got = 0;

	memset(m, 0, sizeof(*m));
	while (got < sizeof(*m)) {
		ssize_t k = read(fd, (char *)m + got, sizeof(*m) - got);

		if (k <= 0)
			return false;
		got += (size_t)k;
	}
	return true;
}

static inline bool write_msg(int fd, uint32_t kind, int32_t status, const char *text)
{
	struct mig_ack m = { .status = status, .kind = kind };

	snprintf(m.message, sizeof(m.message), "%s", text);
	return write(fd, &m, sizeof(m)) == (ssize_t)sizeof(m);
}

/*
 * A destination that reads a plain stream up to its END, says READY, and
 * acknowledges the source's COMMIT: the source's guest moves, as far as it
 * knows.
 */
struct recorder {
	int fd;
	uint8_t *buf;
	size_t len, cap;
};

/* pthread entry: r on success, NULL if the stream could not be read or the handoff did not go through */
static inline void *recorder_run(void *p)
{
	struct recorder *r = p;
	struct mig_ack m;
	size_t end = 0;
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
	} while (k > 0 && mig_stream_walk(r->buf, r->len, NULL, NULL, &end) < 0);
	if (k <= 0 || end != r->len || !write_msg(r->fd, MIG_MSG_READY, 0, "ready") || !read_msg(r->fd, &m) ||
	    m.kind != MIG_MSG_COMMIT || !write_msg(r->fd, MIG_MSG_ACK, 0, "running"))
		return NULL;
	return r;
}

#endif
