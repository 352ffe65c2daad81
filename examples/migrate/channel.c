// SPDX-License-Identifier: MIT
/*
 * Sealed records with OpenSSL's AES-256-GCM (libcrypto's EVP interface:
 * AES-NI and PCLMUL, or VAES and VPCLMULQDQ, where the CPU has them).  The nonce is the connection's index and the record's
 * sequence number, neither sent: each end counts, so a record dropped,
 * replayed or moved arrives under the wrong nonce and fails its tag.  A
 * record is read whole and checked before any of its bytes is handed on,
 * which costs the receiver a copy; the sender copies too, into the buffer
 * it seals, so what was sealed is what is sent even while a guest writes
 * the memory it came from.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "channel.h"

#define HDR sizeof(struct mig_seal)
#define IV_SIZE 12 /* GCM's own: no hashing of the nonce */
#define UNREAD_MAX 64

enum chan_fail {
	FAIL_NONE,
	FAIL_TAG,    /* a record failed its tag */
	FAIL_LENGTH, /* a length no record can have */
	FAIL_CUT,    /* the connection ended without MIG_SEAL_LAST */
};

struct mig_chan {
	struct mig_conn *c;	/* NULL: a channel that only reads, from raw */
	struct mig_reader raw; /* where the bytes come from: c, or memory */
	bool sealed, encrypt;
	uint32_t conn;
	EVP_CIPHER_CTX *tx, *rx; /* keyed once; an IV each record */
	uint64_t tx_seq, rx_seq;
	/* sending: [struct mig_seal][payload][tag], filled up to MIG_SEAL_MAX */
	uint8_t *wbuf;
	size_t wlen;
	/* receiving: a checked record's payload, [roff, rlen) not yet handed on */
	uint8_t *rbuf;
	size_t roff, rlen;
	bool ended; /* the peer's MIG_SEAL_LAST arrived */
	bool torn;  /* a record's read gave up after its header: mig_chan_torn() */
	enum chan_fail fail;
	uint32_t fail_len;
	uint8_t unread[UNREAD_MAX];
	size_t unread_off, unread_len;
};

static int conn_read(void *ctx, void *buf, size_t len)
{
	return mig_conn_read(ctx, buf, len);
}

static void conn_describe(void *ctx, int ret, char *buf, size_t len)
{
	mig_conn_strerror(ctx, ret, buf, len);
}

static int chan_new(struct mig_conn *c, const struct mig_reader *raw, const struct mig_chan_keys *keys,
		    struct mig_chan **ret_ch)
{
	struct mig_chan *ch = calloc(1, sizeof(*ch));

	if (!ch)
		return -ENOMEM;
	ch->c = c;
	ch->raw = c ? (struct mig_reader){ .read = conn_read, .describe = conn_describe, .ctx = c } : *raw;
	if (keys) {
		ch->sealed = true;
		ch->encrypt = keys->encrypt;
		ch->conn = keys->conn;
		ch->tx = EVP_CIPHER_CTX_new();
		ch->rx = EVP_CIPHER_CTX_new();
		ch->wbuf = malloc(HDR + MIG_SEAL_MAX + MIG_SEAL_TAG);
		ch->rbuf = malloc(HDR + MIG_SEAL_MAX + MIG_SEAL_TAG);
		if (!ch->tx || !ch->rx || !ch->wbuf || !ch->rbuf ||
		    EVP_EncryptInit_ex(ch->tx, EVP_aes_256_gcm(), NULL, keys->send, NULL) != 1 ||
		    EVP_DecryptInit_ex(ch->rx, EVP_aes_256_gcm(), NULL, keys->recv, NULL) != 1) {
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
	/* the key schedules: libcrypto wipes them as it frees them */
	EVP_CIPHER_CTX_free(ch->tx);
	EVP_CIPHER_CTX_free(ch->rx);
	free(ch->wbuf);
	free(ch->rbuf);
	free(ch);
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

static void nonce(const struct mig_chan *ch, uint64_t seq, uint8_t out[IV_SIZE])
{
	memcpy(out, &ch->conn, 4);
	memcpy(out + 4, &seq, 8);
}

/* Seal what wbuf holds (wlen payload bytes) and send it. */
static int seal_send(struct mig_chan *ch, uint32_t flags)
{
	struct mig_seal h = { .len = (uint32_t)ch->wlen, .flags = flags };
	uint8_t iv[IV_SIZE], *payload = ch->wbuf + HDR;
	struct iovec iov;
	int n, ok;

	if (!ch->c)
		return -EBADF;
	memcpy(ch->wbuf, &h, HDR);
	nonce(ch, ch->tx_seq++, iv);
	/* encrypted: the header is associated data, the payload encrypted; else both are associated data */
	ok = EVP_EncryptInit_ex(ch->tx, NULL, NULL, NULL, iv) == 1 &&
	     EVP_EncryptUpdate(ch->tx, NULL, &n, ch->wbuf, (int)(ch->encrypt ? HDR : HDR + ch->wlen)) == 1 &&
	     (!ch->encrypt || !ch->wlen || EVP_EncryptUpdate(ch->tx, payload, &n, payload, (int)ch->wlen) == 1) &&
	     EVP_EncryptFinal_ex(ch->tx, payload + ch->wlen, &n) == 1 &&
	     EVP_CIPHER_CTX_ctrl(ch->tx, EVP_CTRL_GCM_GET_TAG, MIG_SEAL_TAG, payload + ch->wlen) == 1;
	if (!ok)
		return -EIO;
	iov = (struct iovec){ ch->wbuf, HDR + ch->wlen + MIG_SEAL_TAG };
	ch->wlen = 0;
	return mig_conn_writev(ch->c, &iov, 1);
}

int mig_chan_writev(struct mig_chan *ch, struct iovec *iov, int n)
{
	int i, ret;

	if (!ch->c)
		return -EBADF;
	if (!ch->sealed)
		return mig_conn_writev(ch->c, iov, n);
	for (i = 0; i < n; i++) {
		const uint8_t *p = iov[i].iov_base;
		size_t left = iov[i].iov_len;

		while (left) {
			size_t k = MIG_SEAL_MAX - ch->wlen < left ? MIG_SEAL_MAX - ch->wlen : left;

			memcpy(ch->wbuf + HDR + ch->wlen, p, k);
			ch->wlen += k;
			p += k;
			left -= k;
			if (ch->wlen == MIG_SEAL_MAX && (ret = seal_send(ch, 0)) < 0)
				return ret;
		}
	}
	return ch->wlen ? seal_send(ch, 0) : 0;
}

int mig_chan_close_write(struct mig_chan *ch)
{
	int ret = ch->sealed ? seal_send(ch, MIG_SEAL_LAST) : 0;

	if (!ch->c)
		return -EBADF;
	return ret < 0 ? ret : mig_conn_close_write(ch->c);
}

/* The next record, read whole and checked: 0, or -errno with ch->fail saying why. */
static int open_record(struct mig_chan *ch)
{
	struct mig_seal h;
	uint8_t iv[IV_SIZE], tag[MIG_SEAL_TAG], *payload = ch->rbuf + HDR;
	int n, ok, ret = ch->raw.read(ch->raw.ctx, ch->rbuf, HDR);

	if (ret >= 0 && ret < (int)HDR) {
		ch->fail = FAIL_CUT;
		return -EPIPE;
	}
	if (ret < 0)
		return ret;
	memcpy(&h, ch->rbuf, HDR);
	if (h.len > MIG_SEAL_MAX || (!h.len && !(h.flags & MIG_SEAL_LAST))) {
		ch->fail = FAIL_LENGTH;
		ch->fail_len = h.len;
		return -EACCES;
	}
	ret = ch->raw.read(ch->raw.ctx, payload, h.len + MIG_SEAL_TAG);
	if (ret >= 0 && ret < (int)(h.len + MIG_SEAL_TAG)) {
		ch->fail = FAIL_CUT;
		return -EPIPE;
	}
	if (ret < 0) {
		/* the header is taken: the next read would take the payload for one */
		ch->torn = true;
		return ret;
	}
	nonce(ch, ch->rx_seq, iv);
	memcpy(tag, payload + h.len, sizeof(tag));
	/* the tag is checked by the final step, in constant time, before any byte is handed on */
	ok = EVP_DecryptInit_ex(ch->rx, NULL, NULL, NULL, iv) == 1 &&
	     EVP_DecryptUpdate(ch->rx, NULL, &n, ch->rbuf, (int)(ch->encrypt ? HDR : HDR + h.len)) == 1 &&
	     (!ch->encrypt || !h.len || EVP_DecryptUpdate(ch->rx, payload, &n, payload, (int)h.len) == 1) &&
	     EVP_CIPHER_CTX_ctrl(ch->rx, EVP_CTRL_GCM_SET_TAG, sizeof(tag), tag) == 1 &&
	     EVP_DecryptFinal_ex(ch->rx, payload + h.len, &n) == 1;
	/* the flags and the reserved field count only once the tag says they are the sender's */
	if (!ok || h.reserved || (h.flags & ~MIG_SEAL_LAST)) {
		ch->fail = FAIL_TAG;
		return -EACCES;
	}
	ch->rx_seq++;
	ch->roff = HDR;
	ch->rlen = HDR + h.len;
	ch->ended = h.flags & MIG_SEAL_LAST;
	return 0;
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
		return ch->fail == FAIL_CUT ? -EPIPE : -EACCES;
	while (got < len) {
		if (ch->roff == ch->rlen) {
			if (ch->ended)
				break;
			ret = open_record(ch);
			if (ret < 0)
				return ret;
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
	if (ch->fail == FAIL_TAG && ret == -EACCES)
		snprintf(buf, len, "authentication: sealed record %" PRIu64 " on connection %" PRIu32
			 " failed its check (changed, dropped, replayed or reordered in flight)", ch->rx_seq, ch->conn);
	else if (ch->fail == FAIL_LENGTH && ret == -EACCES)
		snprintf(buf, len, "authentication: sealed record %" PRIu64 " on connection %" PRIu32
			 " claims %" PRIu32 " bytes (1..%u): not a sealed record", ch->rx_seq, ch->conn, ch->fail_len,
			 MIG_SEAL_MAX);
	else if (ch->fail == FAIL_CUT && ret == -EPIPE)
		snprintf(buf, len, "authentication: connection %" PRIu32 " ended after %" PRIu64
			 " sealed records without its last one (records cut off in flight)", ch->conn, ch->rx_seq);
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
	return (ch->rlen - ch->roff) + (ch->unread_len - ch->unread_off);
}

struct mig_reader mig_chan_reader(struct mig_chan *ch)
{
	return (struct mig_reader){ .read = reader_read, .describe = reader_describe, .ctx = ch };
}
