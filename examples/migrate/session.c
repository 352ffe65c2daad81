// SPDX-License-Identifier: MIT
/*
 * Key files, the hello exchange and the key schedule (OpenSSL's libcrypto:
 * SHA-256, HMAC-SHA-256, HKDF as RFC 5869 builds it from HMAC;
 * CRYPTO_memcmp for every comparison of secrets; nonces from
 * getrandom(2)).  Secrets live in the session only as long as the
 * handshake needs them and are wiped after; the channels keep their keys'
 * schedules.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "errf.h"
#include "session.h"

#define LABEL "kvmdirty-migrate session 1 "

/* ---- key files ---- */

int mig_psk_load(const char *path, struct mig_psk *ret_psk, char *err, size_t len)
{
	struct stat st;
	ssize_t n;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY), ret = 0;

	if (fd < 0)
		return mig_errf(err, len, -errno, "--psk '%s': %s", path, strerror(errno));
	if (fstat(fd, &st) < 0) {
		ret = mig_errf(err, len, -errno, "--psk '%s': %s", path, strerror(errno));
	} else if (!S_ISREG(st.st_mode)) {
		ret = mig_errf(err, len, -EINVAL, "--psk '%s': not a regular file", path);
	} else if (st.st_mode & 077) {
		ret = mig_errf(err, len, -EPERM, "--psk '%s': group or others may read or write it (mode %04o); "
			       "a key file must be mode 0600 or 0400", path, (unsigned int)(st.st_mode & 07777));
	} else if (st.st_size > MIG_PSK_MAX + 64) {
		ret = mig_errf(err, len, -EINVAL, "--psk '%s': %lld bytes, a key file holds at most %d", path,
			       (long long)st.st_size, MIG_PSK_MAX);
	}
	if (ret < 0) {
		close(fd);
		return ret;
	}
	memset(ret_psk, 0, sizeof(*ret_psk));
	n = read(fd, ret_psk->key, sizeof(ret_psk->key));
	ret = -errno;
	close(fd);
	if (n < 0)
		return mig_errf(err, len, ret, "--psk '%s': %s", path, strerror(-ret));
	while (n > 0 && (ret_psk->key[n - 1] == '\n' || ret_psk->key[n - 1] == '\r' || ret_psk->key[n - 1] == ' ' ||
			 ret_psk->key[n - 1] == '\t'))
		n--;
	ret_psk->len = (size_t)n;
	if (n < MIG_PSK_MIN) {
		mig_psk_clear(ret_psk);
		return mig_errf(err, len, -EINVAL, "--psk '%s': %zd bytes of key, at least %d needed "
			       "(e.g. head -c 32 /dev/urandom | base64 > FILE)", path, n, MIG_PSK_MIN);
	}
	return 0;
}

void mig_psk_clear(struct mig_psk *psk)
{
	explicit_bzero(psk, sizeof(*psk));
}

/* ---- the key schedule ---- */

#define SHA256_SIZE 32

struct keys {
	uint8_t prk[SHA256_SIZE];
	uint8_t confirm[SHA256_SIZE];
	uint8_t transcript[SHA256_SIZE];
};

/* HMAC-SHA-256 of the n pieces msg[i] (len[i] bytes each) under key. */
static void hmac_sha256(const uint8_t *key, size_t key_len, const void *const msg[], const size_t len[], int n,
			uint8_t out[SHA256_SIZE])
{
	uint8_t buf[256];
	size_t at = 0;
	unsigned int out_len = SHA256_SIZE;
	int i;

	/* every message here is short (labels, hashes, keys): one buffer, one call */
	for (i = 0; i < n; i++) {
		if (at + len[i] > sizeof(buf))
			abort();
		memcpy(buf + at, msg[i], len[i]);
		at += len[i];
	}
	if (!HMAC(EVP_sha256(), key, (int)key_len, buf, at, out, &out_len))
		abort(); /* libcrypto out of memory or broken: nothing to migrate with */
	explicit_bzero(buf, sizeof(buf));
}

/* HKDF-Expand (RFC 5869) of one block: HMAC(PRK, info || 0x01). */
static void expand(const uint8_t prk[SHA256_SIZE], const char *what, uint8_t out[32])
{
	static const uint8_t one = 1;
	char info[64];
	int n = snprintf(info, sizeof(info), LABEL "%s", what);
	const void *msg[] = { info, &one };
	const size_t len[] = { (size_t)n, 1 };

	hmac_sha256(prk, SHA256_SIZE, msg, len, 2, out);
}

/* T, PRK and the confirmation key of one connection, from the two hellos and ikm (the key or the session secret). */
static void schedule(const struct mig_hello *src, const struct mig_hello *dst, const uint8_t *ikm, size_t ikm_len,
		     struct keys *k)
{
	const void *msg[] = { ikm };
	const size_t len[] = { ikm_len };
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	unsigned int n = SHA256_SIZE;

	if (!md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1 || EVP_DigestUpdate(md, src, sizeof(*src)) != 1 ||
	    EVP_DigestUpdate(md, dst, sizeof(*dst)) != 1 || EVP_DigestFinal_ex(md, k->transcript, &n) != 1)
		abort();
	EVP_MD_CTX_free(md);
	/* HKDF-Extract: PRK = HMAC(salt = T, IKM) */
	hmac_sha256(k->transcript, sizeof(k->transcript), msg, len, 1, k->prk);
	expand(k->prk, "confirm", k->confirm);
}

static void proof(const struct keys *k, const char *who, uint8_t out[MIG_PROOF])
{
	const void *msg[] = { who, k->transcript };
	const size_t len[] = { strlen(who), sizeof(k->transcript) };

	hmac_sha256(k->confirm, sizeof(k->confirm), msg, len, 2, out);
}

/* The connection's channel, under keys of its own for each direction. */
static int open_chan(struct mig_session *s, unsigned int i, const struct keys *k, bool source)
{
	struct mig_chan_keys ck = { .conn = i, .encrypt = s->flags & MIG_S_ENCRYPT };
	int ret;

	if (!(s->flags & MIG_S_PSK))
		return mig_chan_new(s->conn[i], NULL, &s->chan[i]);
	expand(k->prk, "source to destination", source ? ck.send : ck.recv);
	expand(k->prk, "destination to source", source ? ck.recv : ck.send);
	ret = mig_chan_new(s->conn[i], &ck, &s->chan[i]);
	explicit_bzero(&ck, sizeof(ck));
	return ret;
}

static int fresh(uint8_t *buf, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t k = getrandom(buf + got, n - got, 0);

		if (k < 0 && errno != EINTR)
			return -errno;
		if (k > 0)
			got += (size_t)k;
	}
	return 0;
}

/* ---- both ends ---- */

static int send_all(struct mig_conn *c, const void *a, size_t alen, const void *b, size_t blen)
{
	struct iovec iov[2] = { { (void *)a, alen }, { (void *)b, blen } };

	return mig_conn_writev(c, iov, b ? 2 : 1);
}

/* Read exactly len bytes of what; a one-line reason otherwise. */
static int recv_all(struct mig_conn *c, void *buf, size_t n, const char *what, char *err, size_t len)
{
	int ret = mig_conn_read(c, buf, n);
	char why[96];

	if (ret >= 0 && (size_t)ret == n)
		return 0;
	if (ret >= 0)
		return mig_errf(err, len, -EPROTO, "awaiting %s: the connection ended", what);
	mig_conn_strerror(c, ret, why, sizeof(why));
	return mig_errf(err, len, ret, "awaiting %s: %s", what, why);
}

bool mig_session_needed(const struct mig_session_opts *o)
{
	return o->psk || o->conns > 1;
}

void mig_session_free(struct mig_session *s)
{
	unsigned int i;

	for (i = 0; i < MIG_MAX_CONNS; i++) {
		mig_chan_free(s->chan[i]);
		mig_conn_free(s->conn[i]);
		if (s->own_fd[i] && s->fd[i] >= 0)
			close(s->fd[i]);
	}
	memset(s, 0, sizeof(*s));
}

/* f summed over the session's connections */
static uint64_t sum_conns(const struct mig_session *s, uint64_t (*f)(const struct mig_conn *c))
{
	uint64_t n = 0;
	unsigned int i;

	for (i = 0; i < s->conns; i++)
		n += f(s->conn[i]);
	return n;
}

uint64_t mig_session_sent(const struct mig_session *s)
{
	return sum_conns(s, mig_conn_sent);
}

uint64_t mig_session_unacked(const struct mig_session *s)
{
	return sum_conns(s, mig_conn_unacked);
}

uint64_t mig_session_rtt_us(const struct mig_session *s)
{
	uint64_t rtt = 0, r;
	unsigned int i;

	for (i = 0; i < s->conns; i++)
		if ((r = mig_conn_rtt_us(s->conn[i])) > rtt)
			rtt = r;
	return rtt;
}

static void session_init(struct mig_session *s)
{
	unsigned int i;

	memset(s, 0, sizeof(*s));
	for (i = 0; i < MIG_MAX_CONNS; i++)
		s->fd[i] = -1;
}

/* ---- the source ---- */

/*
 * One connection's handshake from the source's side: hello, the
 * destination's hello, our proof, its answer and proof.  ikm: the key
 * (conn 0) or the session secret; session: the id (joins), filled in
 * from the destination's hello on conn 0.
 */
static int source_hello(struct mig_session *s, unsigned int i, const struct mig_session_opts *o, const uint8_t *ikm,
			size_t ikm_len, uint8_t session[32], uint8_t secret[32], char *err, size_t len)
{
	struct mig_hello mine = { .magic = MIG_SESSION_MAGIC, .version = MIG_SESSION_VERSION, .flags = s->flags,
				  .conns = s->conns, .conn = i }, theirs;
	uint8_t mine_proof[MIG_PROOF], their_proof[MIG_PROOF], want[MIG_PROOF];
	struct mig_ack ack;
	struct keys k;
	int ret;

	if (i) {
		mine.flags |= MIG_S_JOIN;
		memcpy(mine.session, session, 32);
	}
	ret = fresh(mine.nonce, sizeof(mine.nonce));
	if (ret < 0)
		return mig_errf(err, len, ret, "getrandom: %s", strerror(-ret));
	ret = send_all(s->conn[i], &mine, sizeof(mine), NULL, 0);
	if (ret < 0)
		return mig_errf(err, len, ret, "connection %u: sending the hello: %s", i, strerror(-ret));
	ret = recv_all(s->conn[i], &theirs, sizeof(theirs), "the destination's hello", err, len);
	if (ret < 0)
		return ret;
	if (memcmp(theirs.magic, MIG_SESSION_MAGIC, sizeof(theirs.magic)) || theirs.version != MIG_SESSION_VERSION)
		return mig_errf(err, len, -EPROTO, "connection %u: the destination does not speak sessions "
				"(an older kvmdirty-migrate?)", i);
	if (theirs.flags & MIG_S_REFUSED) {
		ret = recv_all(s->conn[i], &ack, sizeof(ack), "the destination's refusal", err, len);
		if (ret < 0)
			return ret;
		return mig_errf(err, len, ack.status < 0 ? ack.status : -EPROTO, "destination refused: %s", mig_ack_text(&ack));
	}
	if (!i)
		memcpy(session, theirs.session, 32);
	schedule(&mine, &theirs, ikm, ikm_len, &k);
	if (s->flags & MIG_S_PSK) {
		proof(&k, "source proof", mine_proof);
		ret = send_all(s->conn[i], mine_proof, sizeof(mine_proof), NULL, 0);
		if (ret < 0) {
			mig_errf(err, len, ret, "connection %u: sending our proof: %s", i, strerror(-ret));
			goto out;
		}
	}
	ret = recv_all(s->conn[i], &ack, sizeof(ack), "the destination's answer", err, len);
	if (ret == 0)
		ret = recv_all(s->conn[i], their_proof, sizeof(their_proof), "the destination's proof", err, len);
	if (ret < 0)
		goto out;
	if (ack.status) {
		ret = mig_errf(err, len, ack.status < 0 ? ack.status : -EPROTO, "destination refused: %s", mig_ack_text(&ack));
		goto out;
	}
	if (s->flags & MIG_S_PSK) {
		proof(&k, "destination proof", want);
		if (CRYPTO_memcmp(want, their_proof, sizeof(want)) != 0) {
			ret = mig_errf(err, len, -EACCES, "authentication failed: the destination on connection %u "
				       "does not prove that it holds the key", i);
			goto out;
		}
	}
	if (!i && (s->flags & MIG_S_PSK))
		expand(k.prk, "session secret", secret);
	ret = open_chan(s, i, &k, true);
	if (ret < 0)
		mig_errf(err, len, ret, "out of memory");
out:
	explicit_bzero(&k, sizeof(k));
	return ret;
}

int mig_session_connect(int fd, const struct mig_session_opts *o, int (*connect)(void *ctx, char *err, size_t len),
			void *ctx, struct mig_session *ret_s, char *err, size_t len)
{
	struct mig_session *s = ret_s;
	uint8_t session[32] = { 0 }, secret[32] = { 0 };
	unsigned int i;
	int ret;

	session_init(s);
	s->conns = o->conns ? o->conns : 1;
	s->flags = (o->psk ? MIG_S_PSK : 0) | (o->psk && o->encrypt ? MIG_S_ENCRYPT : 0);
	if (s->conns > MIG_MAX_CONNS || (s->conns > 1 && !connect))
		return mig_errf(err, len, -EINVAL, "%u connections: at most %d, and more than one needs a way to connect",
				s->conns, MIG_MAX_CONNS);
	if (o->encrypt && !o->psk)
		return mig_errf(err, len, -EINVAL, "encryption needs a key (--psk)");
	s->fd[0] = fd;
	ret = mig_conn_new(fd, o->timeout_ms, &s->conn[0]);
	if (ret < 0)
		return mig_errf(err, len, ret, "io_uring: %s", strerror(-ret));
	if (!mig_session_needed(o)) {
		ret = mig_chan_new(s->conn[0], NULL, &s->chan[0]);
		if (ret < 0)
			mig_errf(err, len, ret, "out of memory");
		goto out;
	}
	ret = source_hello(s, 0, o, o->psk ? o->psk->key : NULL, o->psk ? o->psk->len : 0, session, secret, err, len);
	for (i = 1; ret == 0 && i < s->conns; i++) {
		char why[192];

		s->fd[i] = connect(ctx, why, sizeof(why));
		if (s->fd[i] < 0) {
			ret = mig_errf(err, len, s->fd[i], "connection %u: %s", i, why);
			break;
		}
		s->own_fd[i] = true;
		ret = mig_conn_new(s->fd[i], o->timeout_ms, &s->conn[i]);
		if (ret < 0) {
			mig_errf(err, len, ret, "io_uring: %s", strerror(-ret));
			break;
		}
		ret = source_hello(s, i, o, secret, sizeof(secret), session, NULL, err, len);
	}
out:
	explicit_bzero(secret, sizeof(secret));
	if (ret < 0)
		mig_session_free(s);
	return ret;
}

/* ---- the destination ---- */

/* Refuse a hello: our hello saying so, then why. */
static int refuse_hello(struct mig_conn *c, int ret, const char *why)
{
	struct mig_hello h = { .magic = MIG_SESSION_MAGIC, .version = MIG_SESSION_VERSION, .flags = MIG_S_REFUSED };
	struct mig_ack ack = { .status = ret, .kind = MIG_MSG_REFUSED };

	snprintf(ack.message, sizeof(ack.message), "%s", why);
	send_all(c, &h, sizeof(h), &ack, sizeof(ack)); /* best effort: the peer may be gone */
	return ret;
}

/* The answer after the proofs: ok and our proof, or why not. */
static int answer(struct mig_conn *c, int status, const char *why, const uint8_t *p)
{
	static const uint8_t none[MIG_PROOF];
	struct mig_ack ack = { .status = status, .kind = status < 0 ? MIG_MSG_REFUSED : MIG_MSG_ACK };

	snprintf(ack.message, sizeof(ack.message), "%s", why);
	return send_all(c, &ack, sizeof(ack), p ? p : none, MIG_PROOF);
}

/*
 * What a hello asks, against what this destination takes: 0, or a
 * refusal (-EACCES for authentication) in err.  join: the session's
 * hello on conn 0, the one a joining connection must match.
 */
static int check_hello(const struct mig_hello *h, const struct mig_session_opts *o, bool can_join,
		       const struct mig_hello *join, const uint8_t *session, const bool *joined, char *err, size_t len)
{
	if (h->version != MIG_SESSION_VERSION)
		return mig_errf(err, len, -EPROTO, "hello.version: %u, this destination speaks session version %d",
				h->version, MIG_SESSION_VERSION);
	if (h->flags & ~MIG_S_FLAGS || h->reserved)
		return mig_errf(err, len, -EPROTO, "hello.flags: 0x%x or hello.reserved set", h->flags);
	if (o->psk && !(h->flags & MIG_S_PSK))
		return mig_errf(err, len, -EACCES, "authentication: the peer has no key, this destination requires one "
				"(--psk)");
	if (!o->psk && (h->flags & MIG_S_PSK))
		return mig_errf(err, len, -EACCES, "authentication: the peer offers a key, this destination has none "
				"(--psk)");
	if (o->encrypt && !(h->flags & MIG_S_ENCRYPT))
		return mig_errf(err, len, -EACCES, "authentication: the peer does not encrypt, this destination "
				"requires it (--encrypt)");
	if ((h->flags & MIG_S_ENCRYPT) && !(h->flags & MIG_S_PSK))
		return mig_errf(err, len, -EPROTO, "hello.flags: encryption without a key");
	if (!h->conns || h->conns > MIG_MAX_CONNS)
		return mig_errf(err, len, -EPROTO, "hello.conns: %u, must be 1..%d", h->conns, MIG_MAX_CONNS);
	if (!join) {
		if (h->flags & MIG_S_JOIN)
			return mig_errf(err, len, -EACCES, "authentication: connection %u joins a session that is not open",
					h->conn);
		if (h->conn)
			return mig_errf(err, len, -EPROTO, "hello.conn: %u, a session opens on connection 0", h->conn);
		if (h->conns > 1 && !can_join)
			return mig_errf(err, len, -EPROTO, "hello.conns: %u, this destination takes one connection",
					h->conns);
		return 0;
	}
	if (!(h->flags & MIG_S_JOIN) || CRYPTO_memcmp(h->session, session, 32) != 0)
		return mig_errf(err, len, -EACCES, "authentication: a connection that does not join this session");
	if ((h->flags & ~MIG_S_JOIN) != join->flags || h->conns != join->conns)
		return mig_errf(err, len, -EPROTO, "hello.flags or .conns: not those of the session it joins");
	if (!h->conn || h->conn >= h->conns || joined[h->conn])
		return mig_errf(err, len, -EPROTO, "hello.conn: %u, not a connection of the session still to join",
				h->conn);
	return 0;
}

/*
 * The handshake of one connection (its hello, ours, its proof) as a
 * whole: within twice -T (a silent peer is still told it was silent for
 * -T), or the stream's deadline if that is shorter, so that a peer
 * sending a byte a little faster than -T cannot hold the listener.
 */
static uint64_t handshake_ms(const struct mig_session_opts *o)
{
	uint64_t ms = 2 * (o->timeout_ms ? o->timeout_ms : 30000);

	return o->deadline_ms && o->deadline_ms < ms ? o->deadline_ms : ms;
}

/*
 * One connection's handshake from the destination's side, its hello
 * read.  conn 0 (join NULL): ikm is the key; a join: the secret.
 */
static int dest_hello(struct mig_session *s, struct mig_conn *c, const struct mig_hello *theirs,
		      const struct mig_session_opts *o, const uint8_t *ikm, size_t ikm_len, uint8_t session[32],
		      struct keys *k, char *err, size_t len)
{
	struct mig_hello mine = { .magic = MIG_SESSION_MAGIC, .version = MIG_SESSION_VERSION,
				  .flags = theirs->flags & ~MIG_S_JOIN, .conns = theirs->conns, .conn = theirs->conn };
	uint8_t p[MIG_PROOF], want[MIG_PROOF];
	int ret = fresh(mine.nonce, sizeof(mine.nonce));

	if (ret == 0 && !theirs->conn)
		ret = fresh(session, 32);
	if (ret < 0)
		return refuse_hello(c, mig_errf(err, len, ret, "getrandom: %s", strerror(-ret)), "the destination failed");
	memcpy(mine.session, session, 32);
	ret = send_all(c, &mine, sizeof(mine), NULL, 0);
	if (ret < 0)
		return mig_errf(err, len, ret, "sending the hello: %s", strerror(-ret));
	schedule(theirs, &mine, ikm, ikm_len, k);
	if (mine.flags & MIG_S_PSK) {
		/* the peer's proof, before anything else of it is read */
		ret = recv_all(c, p, sizeof(p), "authentication: the peer's proof of the key", err, len);
		if (ret < 0)
			return ret == -EPROTO ? -EACCES : ret;
		proof(k, "source proof", want);
		if (CRYPTO_memcmp(want, p, sizeof(p)) != 0) {
			mig_errf(err, len, -EACCES, "authentication failed on connection %u: the peer does not prove that it "
				 "holds the key (a wrong key, or a recorded session played again)", theirs->conn);
			answer(c, -EACCES, err, NULL);
			return -EACCES;
		}
		proof(k, "destination proof", p);
	}
	return answer(c, 0, "ok", (mine.flags & MIG_S_PSK) ? p : NULL);
}

/* A join's hello, from a connection accepted for the session. */
static int take_join(struct mig_session *s, int fd, const struct mig_session_opts *o, const struct mig_hello *first,
		     const uint8_t *session, const uint8_t *secret, bool *joined, char *err, size_t len)
{
	struct mig_hello h;
	struct mig_conn *c;
	struct keys k;
	uint8_t sess[32];
	int ret = mig_conn_new(fd, o->timeout_ms, &c);

	if (ret < 0)
		return mig_errf(err, len, ret, "io_uring: %s", strerror(-ret));
	mig_conn_set_deadline(c, handshake_ms(o));
	ret = recv_all(c, &h, sizeof(h), "a joining connection's hello", err, len);
	if (ret == 0 && memcmp(h.magic, MIG_SESSION_MAGIC, sizeof(h.magic)))
		ret = mig_errf(err, len, -EACCES, "authentication: a connection that does not join this session");
	if (ret == 0 && (ret = check_hello(&h, o, true, first, session, joined, err, len)) < 0)
		refuse_hello(c, ret, err);
	memcpy(sess, session, 32);
	if (ret == 0)
		ret = dest_hello(s, c, &h, o, secret, 32, sess, &k, err, len);
	if (ret == 0) {
		mig_conn_set_deadline(c, o->deadline_ms);
		s->conn[h.conn] = c;
		ret = open_chan(s, h.conn, &k, false);
		if (ret == 0) {
			/* the session owns it now: the caller closes fd only on failure */
			s->fd[h.conn] = fd;
			s->own_fd[h.conn] = true;
			joined[h.conn] = true;
			c = NULL;
		} else {
			s->conn[h.conn] = NULL;
			mig_errf(err, len, ret, "out of memory");
		}
	}
	explicit_bzero(&k, sizeof(k));
	mig_conn_free(c);
	return ret;
}

int mig_session_accept(int fd, const struct mig_session_opts *o,
		       int (*accept)(void *ctx, uint64_t timeout_ms, char *err, size_t len), void *ctx,
		       struct mig_session *ret_s, char *err, size_t len)
{
	struct mig_session *s = ret_s;
	struct mig_hello h;
	uint8_t session[32], secret[32] = { 0 };
	bool joined[MIG_MAX_CONNS] = { true };
	bool proved = false; /* the peer proved the key (or none is required) */
	struct keys k;
	unsigned int n;
	int ret;

	session_init(s);
	s->fd[0] = fd;
	ret = mig_conn_new(fd, o->timeout_ms, &s->conn[0]);
	if (ret < 0)
		return mig_errf(err, len, ret, "io_uring: %s", strerror(-ret));
	/* a peer that trickles its hello holds the listener no longer than twice -T, whole */
	mig_conn_set_deadline(s->conn[0], handshake_ms(o));
	s->conns = 1;
	ret = mig_conn_read(s->conn[0], &h, sizeof(h.magic));
	if (ret < 0) {
		char why[96];

		mig_conn_strerror(s->conn[0], ret, why, sizeof(why));
		mig_errf(err, len, ret, "awaiting the header: %s", why);
		goto plain_refusal;
	}
	if (ret < (int)sizeof(h.magic) || memcmp(h.magic, MIG_SESSION_MAGIC, sizeof(h.magic))) {
		/* a plain stream (or not a stream): the decoder says what is wrong with it */
		if (o->psk) {
			ret = mig_errf(err, len, -EACCES, "authentication: the peer %s, this destination requires a key "
				       "(--psk)", ret ? "sent a stream without a key" : "closed without a word");
			goto plain_refusal;
		}
		int got = ret;

		/* a plain stream: bounded as a stream is, from when it was taken */
		mig_conn_set_deadline(s->conn[0], o->deadline_ms);
		ret = mig_chan_new(s->conn[0], NULL, &s->chan[0]);
		if (ret == 0 && (ret = mig_chan_unread(s->chan[0], &h, (size_t)got)) == 0)
			return 0;
		mig_errf(err, len, ret, "out of memory");
		goto plain_refusal;
	}
	ret = recv_all(s->conn[0], (uint8_t *)&h + sizeof(h.magic), sizeof(h) - sizeof(h.magic), "the hello", err, len);
	if (ret < 0)
		goto fail;
	ret = check_hello(&h, o, accept != NULL, NULL, NULL, NULL, err, len);
	if (ret < 0) {
		refuse_hello(s->conn[0], ret, err);
		goto fail;
	}
	s->flags = h.flags;
	ret = dest_hello(s, s->conn[0], &h, o, o->psk ? o->psk->key : NULL, o->psk ? o->psk->len : 0, session, &k, err,
			 len);
	proved = ret == 0;
	/* past the handshake, the stream's own bound */
	mig_conn_set_deadline(s->conn[0], o->deadline_ms);
	if (ret == 0 && (s->flags & MIG_S_PSK))
		expand(k.prk, "session secret", secret);
	if (ret == 0)
		ret = open_chan(s, 0, &k, false);
	explicit_bzero(&k, sizeof(k));
	if (ret < 0)
		goto fail;
	/* the other connections: whoever connects meanwhile and does not join is refused */
	for (n = 1; n < h.conns;) {
		char why[256];
		int cfd = accept(ctx, o->timeout_ms, why, sizeof(why));

		if (cfd < 0) {
			ret = mig_errf(err, len, cfd, "awaiting connection %u of the session's %u: %s", n, h.conns, why);
			goto fail;
		}
		ret = take_join(s, cfd, o, &h, session, secret, joined, why, sizeof(why));
		if (ret < 0) {
			close(cfd);
			if (o->log)
				o->log(o->log_ctx, why);
			continue;
		}
		n++;
	}
	s->conns = h.conns;
	explicit_bzero(secret, sizeof(secret));
	return 0;
plain_refusal: {
	struct mig_ack ack = { .status = ret };

	/* the answer has its own wait (-T), past a handshake's deadline */
	mig_conn_set_deadline(s->conn[0], 0);

	snprintf(ack.message, sizeof(ack.message), "%s", err);
	send_all(s->conn[0], &ack, sizeof(ack), NULL, 0); /* best effort */
}
fail:
	/*
	 * With a key, a peer that has not proved it decides nothing: a hello
	 * cut short or malformed, a reset, a silence, all are failures of
	 * authentication (a listener with --once goes on accepting).
	 */
	if (o->psk && !proved && ret != -EACCES) {
		char why[256];

		snprintf(why, sizeof(why), "%s", err);
		ret = mig_errf(err, len, -EACCES, "authentication: the peer did not prove the key: %s", why);
	}
	explicit_bzero(secret, sizeof(secret));
	mig_session_free(s);
	return ret;
}
