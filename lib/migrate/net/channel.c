// SPDX-License-Identifier: MIT
/*
 * Sealed records with OpenSSL's AES-256-GCM (libcrypto's EVP interface:
 * AES-NI and PCLMUL, or VAES and VPCLMULQDQ, where the CPU has them).  The
 * nonce is the connection's index and the record's sequence number,
 * neither sent: each end counts, so a record dropped, replayed or moved
 * arrives under the wrong nonce and fails its tag.
 *
 * Each page is touched once by each end's user space.  Sending, the
 * cipher reads the caller's memory (guest pages) and writes the record
 * straight into the send buffer; MAC only, the bytes are copied into it
 * and the tag taken over the copy while it is in cache, so what was
 * sealed is what is sent even while a guest writes the memory it came
 * from; the records of one write go to the socket together, 256 KiB at a
 * time.  Receiving, records are read into the receive buffer as many as
 * the socket holds (up to 256 KiB: one system call for several) and each
 * opened there, in place; only once its tag
 * matched are its bytes copied out, to the reader (guest memory): no
 * byte of a record reaches guest memory before its tag is checked.
 *
 * The cipher runs on the thread that moves the bytes, one a connection:
 * on two CPUs shared by both ends, sealing and opening on threads of
 * their own measured slower (doc/benchmarks.md), and a session of several
 * connections spreads the cipher over cores.
 *
 * Each direction changes its key before a key would seal more than
 * MIG_SEAL_REKEY_RECORDS records or MIG_SEAL_REKEY_BYTES bytes of payload
 * (channel.h); both ends count, so nothing is sent for it.  Each direction
 * ends with its MIG_SEAL_LAST record, and nothing may follow it.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "channel.h"

#define HDR sizeof(struct mig_seal)
#define IV_SIZE 12 /* GCM's own: no hashing of the nonce */
#define UNREAD_MAX 64
#define REKEY_INFO "kvmdirty-migrate rekey"

enum chan_fail {
	FAIL_NONE,
	FAIL_TAG,    /* a record failed its tag */
	FAIL_LENGTH, /* a length no record can have */
	FAIL_CUT,    /* the connection ended without MIG_SEAL_LAST */
	FAIL_AFTER,  /* bytes after the MIG_SEAL_LAST record */
};

/* One direction of a sealed channel. */
struct seal_dir {
	EVP_CIPHER_CTX *ctx; /* keyed with key; an IV each record */
	/* the key in use, kept only to derive the next one (rekey()); wiped once the direction ends */
	uint8_t key[MIG_SEAL_KEY];
	/*
	 * Records of the direction so far, the nonce's sequence number.  It
	 * goes on counting across keys: a nonce is never used twice in a
	 * direction, whatever its key, so no nonce repeats under one key
	 * even if two keys were one, and a record moved across a change of
	 * key arrives under the wrong key and the wrong nonce.
	 */
	uint64_t seq;
	uint64_t records, bytes; /* sealed (opened) under the key in use */
	uint32_t keys;		 /* keys replaced so far */
};

struct mig_chan {
	struct mig_conn *c;	/* NULL: a channel that only reads, from raw */
	struct mig_reader raw; /* where the bytes come from: c, or memory */
	bool sealed, encrypt;
	uint32_t conn;
	uint64_t rekey_records, rekey_bytes; /* a key seals at most this many records, this much payload */
	/* sending: one record at a time, [struct mig_seal][payload][tag], of up to record bytes of payload */
	uint32_t record;
	struct seal_dir tx;
	uint8_t *wbuf;
	size_t wlen; /* records sealed into wbuf, not sent yet (within one mig_chan_writev()) */
	bool closed; /* MIG_SEAL_LAST sent */
	int tx_err;  /* a record that could not be sealed or sent: nothing more is (the peer's count is off) */
	/*
	 * receiving: raw bytes [rnext's record's start, rend) of rbuf, the
	 * record opened last among them: its checked payload [roff, rlen)
	 * not yet handed on, and the record's end at rnext (what follows it
	 * is the records after it, read ahead, the last perhaps in part).
	 */
	struct seal_dir rx;
	uint8_t *rbuf;
	size_t roff, rlen, rnext, rend;
	bool ended;  /* the peer's MIG_SEAL_LAST arrived */
	bool at_end; /* ... and the end of the connection after it */
	bool torn;   /* a read gave up part way and lost what it took: mig_chan_torn() */
	enum chan_fail fail;
	uint32_t fail_len;
	uint8_t unread[UNREAD_MAX];
	size_t unread_off, unread_len;
};

/*
 * rbuf: records read ahead, as many as the socket holds, up to 256 KiB
 * and one record of the largest size.  One receive takes four records of
 * the sender's size where it once took one and the next one's header
 * (with this host's KVM a system call costs more than opening a record's
 * worth of bytes); the records are opened where they landed, and only
 * the last one's part moves to the front, when less than a whole record
 * of room is left behind it.  Not more than 256 KiB: the records must
 * still be in the cache (512 KiB of L2 here) when they are opened, and
 * 1 MiB ahead measured no better.
 */
#define RBUF_RECORD (HDR + MIG_SEAL_MAX + MIG_SEAL_TAG)
#define RBUF_SIZE   ((256u << 10) + RBUF_RECORD)
/* wbuf: the records of one mig_chan_writev() sealed in turn, sent together once 256 KiB of them waits (the same) */
#define WBUF_BATCH (256u << 10)
#define WBUF_SIZE  (WBUF_BATCH + RBUF_RECORD)

static int conn_read(void *ctx, void *buf, size_t len)
{
	return mig_conn_read(ctx, buf, len);
}

static void conn_describe(void *ctx, int ret, char *buf, size_t len)
{
	mig_conn_strerror(ctx, ret, buf, len);
}

static int dir_init(struct seal_dir *d, const uint8_t key[MIG_SEAL_KEY], bool enc)
{
	d->ctx = EVP_CIPHER_CTX_new();
	memcpy(d->key, key, MIG_SEAL_KEY);
	return d->ctx && EVP_CipherInit_ex(d->ctx, EVP_aes_256_gcm(), NULL, key, NULL, enc) == 1;
}

/* A direction that seals or opens nothing more: its key and key schedule wiped. */
static void dir_end(struct seal_dir *d)
{
	OPENSSL_cleanse(d->key, sizeof(d->key));
	if (d->ctx)
		EVP_CIPHER_CTX_reset(d->ctx); /* wipes the schedule */
}

static int chan_new(struct mig_conn *c, const struct mig_reader *raw, const struct mig_chan_keys *keys,
		    struct mig_chan **ret_ch)
{
	struct mig_chan *ch = calloc(1, sizeof(*ch));

	if (!ch)
		return -ENOMEM;
	ch->c = c;
	ch->raw = c ? (struct mig_reader){ .read = conn_read, .describe = conn_describe, .ctx = c } : *raw;
	ch->rekey_records = MIG_SEAL_REKEY_RECORDS;
	ch->rekey_bytes = MIG_SEAL_REKEY_BYTES;
	ch->record = MIG_SEAL_RECORD;
	if (keys) {
		ch->sealed = true;
		ch->encrypt = keys->encrypt;
		ch->conn = keys->conn;
		ch->wbuf = malloc(WBUF_SIZE); /* records of any size the tests set */
		ch->rbuf = malloc(RBUF_SIZE);
		if (!dir_init(&ch->tx, keys->send, true) || !dir_init(&ch->rx, keys->recv, false) || !ch->wbuf ||
		    !ch->rbuf) {
			mig_chan_free(ch);
			return -ENOMEM;
		}
	}
	*ret_ch = ch;
	return 0;
}

int mig_chan_new(struct mig_conn *c, const struct mig_chan_keys *keys, struct mig_chan **ret_ch)
{
	return chan_new(c, NULL, keys, ret_ch);
}

int mig_chan_new_reader(const struct mig_reader *raw, const struct mig_chan_keys *keys, struct mig_chan **ret_ch)
{
	return chan_new(NULL, raw, keys, ret_ch);
}

void mig_chan_free(struct mig_chan *ch)
{
	if (!ch)
		return;
	OPENSSL_cleanse(ch->tx.key, sizeof(ch->tx.key));
	OPENSSL_cleanse(ch->rx.key, sizeof(ch->rx.key));
	/* the key schedules: libcrypto wipes them as it frees them */
	EVP_CIPHER_CTX_free(ch->tx.ctx);
	EVP_CIPHER_CTX_free(ch->rx.ctx);
	/* plaintext of guest memory: wiped, as the keys are */
	if (ch->wbuf)
		OPENSSL_cleanse(ch->wbuf, WBUF_SIZE);
	if (ch->rbuf)
		OPENSSL_cleanse(ch->rbuf, RBUF_SIZE);
	free(ch->wbuf);
	free(ch->rbuf);
	free(ch);
}

void mig_chan_set_rekey_limit_for_tests(struct mig_chan *ch, uint64_t records, uint64_t bytes)
{
	ch->rekey_records = records ? records : MIG_SEAL_REKEY_RECORDS;
	ch->rekey_bytes = bytes ? bytes : MIG_SEAL_REKEY_BYTES;
}

void mig_chan_set_record_for_tests(struct mig_chan *ch, uint32_t bytes)
{
	ch->record = bytes && bytes <= MIG_SEAL_MAX ? bytes : MIG_SEAL_RECORD;
}

struct mig_conn *mig_chan_conn(struct mig_chan *ch)
{
	return ch->c;
}

int mig_chan_unread(struct mig_chan *ch, const void *buf, size_t len)
{
	if (ch->sealed || ch->unread_len - ch->unread_off + len > UNREAD_MAX)
		return -EINVAL;
	memmove(ch->unread, ch->unread + ch->unread_off, ch->unread_len - ch->unread_off);
	ch->unread_len -= ch->unread_off;
	ch->unread_off = 0;
	memcpy(ch->unread + ch->unread_len, buf, len);
	ch->unread_len += len;
	return 0;
}

/*
 * Before a record of len payload bytes, in either direction: a new key
 * where the one in use has sealed rekey_records records, or would seal
 * more than rekey_bytes of payload with this one (a record alone larger
 * than that goes under a fresh key of its own).  Both ends decide from
 * what both know: the counts, and the record's length (the receiver's
 * from the header, which the tag then covers).
 */
static bool rekey_due(const struct mig_chan *ch, const struct seal_dir *d, uint32_t len)
{
	return d->records && (d->records >= ch->rekey_records || d->bytes + len > ch->rekey_bytes);
}

/*
 * The next key: HKDF-Expand(key, REKEY_INFO, 32) (RFC 5869; one block of
 * SHA-256: HMAC(key, info || 0x01)).  The key it replaces is wiped.
 */
static int rekey(struct seal_dir *d)
{
	static const uint8_t info[] = REKEY_INFO "\x01";
	uint8_t next[MIG_SEAL_KEY];
	unsigned int n = sizeof(next);
	bool ok = HMAC(EVP_sha256(), d->key, sizeof(d->key), info, sizeof(info) - 1, next, &n) && n == sizeof(next);

	OPENSSL_cleanse(d->key, sizeof(d->key));
	if (ok) {
		memcpy(d->key, next, sizeof(next));
		ok = EVP_CipherInit_ex(d->ctx, NULL, NULL, d->key, NULL, -1) == 1; /* -1: as it was, sealing or opening */
	}
	OPENSSL_cleanse(next, sizeof(next));
	d->records = d->bytes = 0;
	d->keys++;
	return ok ? 0 : -EIO;
}

static void nonce(const struct mig_chan *ch, uint64_t seq, uint8_t out[IV_SIZE])
{
	memcpy(out, &ch->conn, 4);
	memcpy(out + 4, &seq, 8);
}

/* Where the caller's bytes are: iov[i] from off. */
struct iov_at {
	const struct iovec *iov;
	int i;
	size_t off;
};

/*
 * Bytes the cipher takes at a time where it only authenticates: each
 * piece copied into the record, then hashed while it is in L1.
 */
#define MAC_PIECE (16u << 10)

/* The records sealed into wbuf, sent: 0, or -errno and nothing more is sent (the peer's count is off). */
static int flush(struct mig_chan *ch)
{
	struct iovec iov = { ch->wbuf, ch->wlen };
	int ret;

	if (!ch->wlen)
		return 0;
	ret = mig_conn_writev(ch->c, &iov, 1);
	ch->wlen = 0;
	/* a record not sent, or part of one: the peer's count of records is not ours any more */
	if (ret < 0)
		ch->tx_err = ret;
	return ret;
}

/*
 * Seal len bytes from at (advanced past them) as one record, straight
 * into wbuf behind the records waiting there (sent first where it would
 * not fit).  Encrypting, the cipher reads the caller's memory once and
 * writes the record; MAC only, each piece is copied in and the tag taken
 * over the copy, so that the tag covers what is sent.  The caller sends.
 */
static int seal_one(struct mig_chan *ch, struct iov_at *at, uint32_t len, uint32_t flags)
{
	struct mig_seal h = { .len = len, .flags = flags };
	uint8_t iv[IV_SIZE], *rec, *out;
	int n, ret;
	bool ok;

	if (!ch->c)
		return -EBADF;
	if (ch->tx_err)
		return ch->tx_err;
	if (ch->closed)
		return -EPIPE;
	/* defensive: mig_chan_writev() sends at WBUF_BATCH, so a record of any size fits behind the rest */
	if (WBUF_SIZE - ch->wlen < HDR + (size_t)len + MIG_SEAL_TAG && (ret = flush(ch)) < 0)
		return ret;
	if (rekey_due(ch, &ch->tx, h.len) && (ret = rekey(&ch->tx)) < 0)
		return ch->tx_err = ret;
	rec = ch->wbuf + ch->wlen;
	out = rec + HDR;
	memcpy(rec, &h, HDR);
	nonce(ch, ch->tx.seq++, iv);
	ch->tx.records++;
	ch->tx.bytes += h.len;
	/* the header is associated data; the payload encrypted, or associated data too */
	ok = EVP_EncryptInit_ex(ch->tx.ctx, NULL, NULL, NULL, iv) == 1 &&
	     EVP_EncryptUpdate(ch->tx.ctx, NULL, &n, rec, (int)HDR) == 1;
	while (ok && len) {
		const uint8_t *p = (const uint8_t *)at->iov[at->i].iov_base + at->off;
		size_t k = at->iov[at->i].iov_len - at->off;

		if (k > len)
			k = len;
		if (!ch->encrypt && k > MAC_PIECE)
			k = MAC_PIECE;
		if (ch->encrypt) {
			ok = EVP_EncryptUpdate(ch->tx.ctx, out, &n, p, (int)k) == 1;
		} else if (k) { /* an empty entry's base may be NULL */
			memcpy(out, p, k);
			ok = EVP_EncryptUpdate(ch->tx.ctx, NULL, &n, out, (int)k) == 1;
		}
		out += k;
		len -= (uint32_t)k;
		at->off += k;
		if (at->off == at->iov[at->i].iov_len) {
			at->i++;
			at->off = 0;
		}
	}
	ok = ok && EVP_EncryptFinal_ex(ch->tx.ctx, out, &n) == 1 &&
	     EVP_CIPHER_CTX_ctrl(ch->tx.ctx, EVP_CTRL_GCM_GET_TAG, MIG_SEAL_TAG, out) == 1;
	if (!ok)
		return ch->tx_err = -EIO;
	ch->wlen += HDR + h.len + MIG_SEAL_TAG;
	return 0;
}

int mig_chan_writev(struct mig_chan *ch, struct iovec *iov, int n)
{
	struct iov_at at = { .iov = iov };
	uint64_t left = 0;
	int i, ret;

	if (!ch->c)
		return -EBADF;
	if (!ch->sealed)
		return mig_conn_writev(ch->c, iov, n);
	if (ch->tx_err || ch->closed)
		return ch->tx_err ? ch->tx_err : -EPIPE;
	for (i = 0; i < n; i++)
		left += iov[i].iov_len;
	/* seal_one() steps over empty entries as its cursor reaches them */
	while (left) {
		uint32_t k = left < ch->record ? (uint32_t)left : ch->record;

		ret = seal_one(ch, &at, k, 0);
		if (ret == 0 && ch->wlen >= WBUF_BATCH)
			ret = flush(ch);
		if (ret < 0)
			return ret;
		left -= k;
	}
	return flush(ch);
}

int mig_chan_close_write(struct mig_chan *ch)
{
	int ret = 0;

	if (!ch->c)
		return -EBADF;
	if (ch->sealed) {
		if (ch->closed)
			return 0;
		ret = seal_one(ch, &(struct iov_at){ 0 }, 0, MIG_SEAL_LAST);
		if (ret == 0)
			ret = flush(ch);
		ch->closed = true;
		/* the direction's last key: nothing more is sealed under it, nor under any after it */
		dir_end(&ch->tx);
	}
	return ret < 0 ? ret : mig_conn_close_write(ch->c);
}

/*
 * At least want raw bytes from rnext on in rbuf (the next record's, or
 * its header's): the part of a record at rnext moved to the front first
 * where a whole record would not fit behind it; then what the socket
 * holds, up to rbuf's end (a connection; a reader of memory: only what
 * is missing).  0, fewer bytes than wanted only at the end of the stream;
 * or -errno, every byte that came kept (each receive waits for one byte
 * or more, so a wait that gives up has taken none): the next read goes
 * on from there, and a record sent in parts around a timeout still opens.
 */
static int raw_take(struct mig_chan *ch, size_t want)
{
	size_t have = ch->rend - ch->rnext;
	int ret;

	if (have >= want)
		return 0;
	if (RBUF_SIZE - ch->rnext < RBUF_RECORD) {
		memmove(ch->rbuf, ch->rbuf + ch->rnext, have);
		ch->rend = have;
		ch->rnext = ch->roff = ch->rlen = 0;
	}
	do {
		ret = ch->c ? mig_conn_read_ahead(ch->c, ch->rbuf + ch->rend, 1, RBUF_SIZE - ch->rend)
			    : ch->raw.read(ch->raw.ctx, ch->rbuf + ch->rend, want - (ch->rend - ch->rnext));
		if (ret > 0)
			ch->rend += (size_t)ret;
	} while (ret > 0 && ch->rend - ch->rnext < want);
	return ret < 0 ? ret : 0;
}

/* The next record, read whole and checked: 0, or -errno with ch->fail saying why. */
static int open_record(struct mig_chan *ch)
{
	struct mig_seal h;
	uint8_t iv[IV_SIZE], tag[MIG_SEAL_TAG], *rec, *payload;
	size_t need;
	int n, ok, ret;

	/* the record before is handed on whole: this one starts at its end, perhaps read with it */
	ch->roff = ch->rlen = ch->rnext;
	ret = raw_take(ch, HDR);
	if (ret < 0)
		return ret;
	if (ch->rend - ch->rnext < HDR) {
		ch->fail = FAIL_CUT;
		return -EPIPE;
	}
	memcpy(&h, ch->rbuf + ch->rnext, HDR);
	if (h.len > MIG_SEAL_MAX || (!h.len && !(h.flags & MIG_SEAL_LAST))) {
		ch->fail = FAIL_LENGTH;
		ch->fail_len = h.len;
		return -EACCES;
	}
	need = HDR + h.len + MIG_SEAL_TAG;
	ret = raw_take(ch, need);
	/*
	 * A wait that gave up: the header and what came of the record
	 * after it stay in rbuf, so the next read goes on from there; a
	 * wait that gave up after it took bytes lost them (mig_conn_torn(),
	 * and so mig_chan_torn()).
	 */
	if (ret < 0)
		return ret;
	if (ch->rend - ch->rnext < need) {
		ch->fail = FAIL_CUT;
		return -EPIPE;
	}
	rec = ch->rbuf + ch->rnext;
	payload = rec + HDR;
	/* the record is here whole: under the key the sender used for it, if it counted as we do */
	if (rekey_due(ch, &ch->rx, h.len) && rekey(&ch->rx) < 0)
		ok = 0;
	else {
		nonce(ch, ch->rx.seq, iv);
		memcpy(tag, payload + h.len, sizeof(tag));
		/* the tag is checked by the final step, in constant time, before any byte is handed on */
		ok = EVP_DecryptInit_ex(ch->rx.ctx, NULL, NULL, NULL, iv) == 1 &&
		     EVP_DecryptUpdate(ch->rx.ctx, NULL, &n, rec, (int)(ch->encrypt ? HDR : HDR + h.len)) == 1 &&
		     (!ch->encrypt || !h.len || EVP_DecryptUpdate(ch->rx.ctx, payload, &n, payload, (int)h.len) == 1) &&
		     EVP_CIPHER_CTX_ctrl(ch->rx.ctx, EVP_CTRL_GCM_SET_TAG, sizeof(tag), tag) == 1 &&
		     EVP_DecryptFinal_ex(ch->rx.ctx, payload + h.len, &n) == 1;
	}
	/* the flags and the reserved field count only once the tag says they are the sender's */
	if (!ok || h.reserved || (h.flags & ~MIG_SEAL_LAST)) {
		ch->fail = FAIL_TAG;
		dir_end(&ch->rx);
		return -EACCES;
	}
	ch->rx.seq++;
	ch->rx.records++;
	ch->rx.bytes += h.len;
	ch->roff = ch->rnext + HDR;
	ch->rlen = ch->rnext + HDR + h.len;
	ch->rnext += need;
	ch->ended = h.flags & MIG_SEAL_LAST;
	if (ch->ended)
		dir_end(&ch->rx);
	return 0;
}

/*
 * A read goes past the peer's last record: the connection must end there.
 * 0 at its end; -EPROTO for a byte after it (a record, or anything else:
 * not the peer's).
 */
static int check_after_last(struct mig_chan *ch)
{
	uint8_t extra;
	int ret;

	if (ch->at_end)
		return 0;
	/* read with the last record: a record's header, or anything */
	if (ch->rend > ch->rnext) {
		ch->fail = FAIL_AFTER;
		return -EPROTO;
	}
	ret = ch->raw.read(ch->raw.ctx, &extra, 1);
	if (ret > 0) {
		ch->fail = FAIL_AFTER;
		return -EPROTO;
	}
	ch->at_end = ret == 0;
	return ret;
}

static int fail_ret(const struct mig_chan *ch)
{
	switch (ch->fail) {
	case FAIL_CUT:
		return -EPIPE;
	case FAIL_AFTER:
		return -EPROTO;
	default:
		return -EACCES;
	}
}

int mig_chan_read(struct mig_chan *ch, void *buf, size_t len)
{
	size_t got = 0, k;
	int ret;

	if (len > INT_MAX)
		return -EINVAL;
	k = ch->unread_len - ch->unread_off < len ? ch->unread_len - ch->unread_off : len;
	memcpy(buf, ch->unread + ch->unread_off, k);
	ch->unread_off += k;
	got = k;
	if (!ch->sealed) {
		if (got == len)
			return (int)got;
		ret = ch->raw.read(ch->raw.ctx, (uint8_t *)buf + got, len - got);
		return ret < 0 ? ret : (int)got + ret;
	}
	if (ch->fail)
		return fail_ret(ch);
	while (got < len) {
		if (ch->roff == ch->rlen) {
			ret = ch->ended ? check_after_last(ch) : open_record(ch);
			if (ret < 0) {
				/* a wait that gave up: the bytes this read took are gone with it */
				ch->torn |= got && !ch->fail;
				return ret;
			}
			if (ch->ended && ch->at_end)
				break;
			continue;
		}
		k = ch->rlen - ch->roff < len - got ? ch->rlen - ch->roff : len - got;
		memcpy((uint8_t *)buf + got, ch->rbuf + ch->roff, k);
		ch->roff += k;
		got += k;
	}
	return (int)got;
}

void mig_chan_strerror(const struct mig_chan *ch, int ret, char *buf, size_t len)
{
	char key[64] = "";

	/* the first record under a new key: a peer that does not change keys when this end does fails there */
	if (ch->rx.keys && !ch->rx.records)
		snprintf(key, sizeof(key), " (the first under key %" PRIu32 ")", ch->rx.keys);
	if (ch->fail == FAIL_TAG && ret == -EACCES)
		snprintf(buf, len, "authentication: sealed record %" PRIu64 " on connection %" PRIu32
			 "%s failed its check (changed, dropped, replayed or reordered in flight)", ch->rx.seq, ch->conn,
			 key);
	else if (ch->fail == FAIL_LENGTH && ret == -EACCES)
		snprintf(buf, len, "authentication: sealed record %" PRIu64 " on connection %" PRIu32
			 " claims %" PRIu32 " bytes (1..%u): not a sealed record", ch->rx.seq, ch->conn, ch->fail_len,
			 MIG_SEAL_MAX);
	else if (ch->fail == FAIL_CUT && ret == -EPIPE)
		snprintf(buf, len, "authentication: connection %" PRIu32 " ended after %" PRIu64
			 " sealed records without its last one (records cut off in flight)", ch->conn, ch->rx.seq);
	else if (ch->fail == FAIL_AFTER && ret == -EPROTO)
		snprintf(buf, len, "authentication: bytes after the last record on connection %" PRIu32
			 " (sealed record %" PRIu64 " ended it): not the peer's", ch->conn, ch->rx.seq - 1);
	else
		ch->raw.describe(ch->raw.ctx, ret, buf, len);
}

static int reader_read(void *ctx, void *buf, size_t len)
{
	return mig_chan_read(ctx, buf, len);
}

static void reader_describe(void *ctx, int ret, char *buf, size_t len)
{
	mig_chan_strerror(ctx, ret, buf, len);
}

bool mig_chan_torn(const struct mig_chan *ch)
{
	return ch->torn || (ch->c && mig_conn_torn(ch->c));
}

size_t mig_chan_buffered(const struct mig_chan *ch)
{
	return (ch->rlen - ch->roff) + (ch->rend - ch->rnext) + (ch->unread_len - ch->unread_off);
}

struct mig_reader mig_chan_reader(struct mig_chan *ch)
{
	return (struct mig_reader){ .read = reader_read, .describe = reader_describe, .ctx = ch };
}
