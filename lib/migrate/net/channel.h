/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_CHANNEL_H
#define KVMDIRTY_MIGRATE_CHANNEL_H

/*
 * One connection of a migration as the stream sees it: the bytes as they
 * are (a plain connection), or cut into sealed records, each covered by
 * an AES-256-GCM tag under a key of this connection and this direction
 * (session.h derives the keys), with the connection's index and the
 * record's sequence number (implicit: 0, 1, 2, ... in each direction) in
 * the nonce.  A sealed record changed, dropped, replayed or reordered in
 * flight fails its tag; none of its bytes is handed on.  With encrypt the
 * payload is also encrypted; without, it travels in clear and only the
 * tag is added.
 *
 *   struct mig_seal   16 bytes, in clear, covered by the tag
 *   payload           len bytes (1 .. MIG_SEAL_MAX; 0 only with MIG_SEAL_LAST)
 *   tag               16 bytes
 *
 * Every direction of a sealed connection ends with a record that carries
 * MIG_SEAL_LAST (mig_chan_close_write() sends it): a connection that ends
 * without one was cut short in flight, and reading it fails; so does
 * reading anything after it (a record, or any byte: not the peer's).
 *
 * Each direction changes its key after MIG_SEAL_REKEY_RECORDS records, or
 * before a record that would take the payload sealed under one key past
 * MIG_SEAL_REKEY_BYTES, whichever comes first (RFC 8446 5.5's margin for
 * AES-GCM): key' = HKDF-Expand(key, "kvmdirty-migrate rekey", 32), with
 * SHA-256.  Both ends count records and bytes, so nothing is sent for it.
 * The sequence number in the nonce goes on counting across keys.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "transport.h"

#define MIG_SEAL_KEY 32
#define MIG_SEAL_TAG 16
#define MIG_SEAL_MAX (256u << 10) /* payload bytes of one sealed record, at most */
/*
 * Payload bytes a sender puts in a record, at most: sized for the cipher
 * and the socket together (records sealed into a buffer that goes to the
 * socket 256 KiB at a time, while it is in cache; 64 KiB records measured
 * faster than 32, 128 or 256 KiB, doc/benchmarks.md).
 * A receiver takes any length up to MIG_SEAL_MAX.
 */
#define MIG_SEAL_RECORD (64u << 10)
#define MIG_SEAL_LAST (1u << 0)
/* a key seals at most this many records, and at most this many bytes of payload */
#define MIG_SEAL_REKEY_RECORDS (UINT64_C(1) << 24)
#define MIG_SEAL_REKEY_BYTES (UINT64_C(64) << 30)

struct mig_seal {
	uint32_t len;	   /* payload bytes */
	uint32_t flags;	   /* MIG_SEAL_* */
	uint64_t reserved; /* 0 */
};

_Static_assert(sizeof(struct mig_seal) == 16, "stream layout");

/* The keys of one connection: what it sends under, what it receives under. */
struct mig_chan_keys {
	uint8_t send[MIG_SEAL_KEY], recv[MIG_SEAL_KEY];
	uint32_t conn; /* the connection's index in its session, in the nonce */
	bool encrypt;
};

struct mig_chan;

/*
 * A channel over c (not taken over: the caller frees c after the channel),
 * sealed with keys, or plain when keys is NULL.  0 or -ENOMEM.
 */
int mig_chan_new(struct mig_conn *c, const struct mig_chan_keys *keys, struct mig_chan **ret_ch);
/*
 * A channel that only reads, from raw (a stream held in memory: the tests
 * and the fuzzer); writing to it is -EBADF.
 */
int mig_chan_new_reader(const struct mig_reader *raw, const struct mig_chan_keys *keys, struct mig_chan **ret_ch);
void mig_chan_free(struct mig_chan *ch);
struct mig_conn *mig_chan_conn(struct mig_chan *ch);

/*
 * Bytes already read off a plain connection, handed back: the next reads
 * return them first (at most 64 bytes; -EINVAL on a sealed channel).
 */
int mig_chan_unread(struct mig_chan *ch, const void *buf, size_t len);

/* mig_conn_writev()'s contract; sealed, the bytes go in records of up to MIG_SEAL_RECORD. */
int mig_chan_writev(struct mig_chan *ch, struct iovec *iov, int n);
/*
 * mig_conn_read()'s contract.  Sealed: only bytes of records whose tag
 * matched; fewer than len only after the peer's MIG_SEAL_LAST record, once
 * the connection ended there; -EACCES for a record that failed its tag or
 * whose length cannot be (a failure of authentication: the bytes are not
 * the peer's), -EPIPE for a connection that ended without MIG_SEAL_LAST,
 * -EPROTO for bytes after it.  A read that gives up (a timeout) after it
 * handed on bytes loses them: mig_chan_torn().  Sealed, the bytes of a
 * record not yet whole are kept across a read that gives up, and the
 * next read goes on with them (plain: the transport's, which loses what
 * a read that gave up took).
 */
int mig_chan_read(struct mig_chan *ch, void *buf, size_t len);
/*
 * A read gave up (a timeout) part way through, and the bytes it took are
 * gone: the next read would not start where a message does (transport.h).
 */
bool mig_chan_torn(const struct mig_chan *ch);
/*
 * Bytes the channel holds that no read has handed on yet: a sealed
 * record's rest, bytes given back, and bytes read ahead of the next
 * record (its header, or part of it, not yet checked).  Any of them
 * after the stream's END is a byte the peer sent after it.
 */
size_t mig_chan_buffered(const struct mig_chan *ch);
/*
 * Nothing more will be sent (sealed: the MIG_SEAL_LAST record first, once;
 * the direction's key is wiped).  Whoever finishes a direction calls it:
 * the peer reads a direction that ends without it as cut short.  Sealed,
 * a write after it is -EPIPE, and so is any after a record that could not
 * be sealed or sent whole (that error again): the peer's count of records
 * would no longer be ours.
 */
int mig_chan_close_write(struct mig_chan *ch);
/* A negative result in words; a sealed channel's own failures name authentication. */
void mig_chan_strerror(const struct mig_chan *ch, int ret, char *buf, size_t len);
struct mig_reader mig_chan_reader(struct mig_chan *ch);

/*
 * For tests only: keys of this channel (both directions) seal at most
 * records records and bytes bytes of payload (0: the limit above), so
 * that a test sees keys change within a short stream.  Both ends must use
 * the same limits, set before the first record.
 */
void mig_chan_set_rekey_limit_for_tests(struct mig_chan *ch, uint64_t records, uint64_t bytes);
/* For tests only: records of up to bytes of payload (1 .. MIG_SEAL_MAX; 0: MIG_SEAL_RECORD) from now on. */
void mig_chan_set_record_for_tests(struct mig_chan *ch, uint32_t bytes);

#endif
