// SPDX-License-Identifier: MIT
/*
 * The hello exchange and the key schedule (OpenSSL's libcrypto:
 * SHA-256, HMAC-SHA-256, HKDF as RFC 5869 builds it from HMAC;
 * CRYPTO_memcmp for every comparison of secrets; nonces from
 * getrandom(2)).  Secrets live in the session only as long as the
 * handshake needs them and are wiped after; the channels keep their keys'
 * schedules.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include "clock.h"
#include "errf.h"
#include "kex.h"
#include "session.h"

#define LABEL "kvmdirty-migrate session 2 "

/* ---- the key schedule ---- */

#define SHA256_SIZE 32

struct keys {
	uint8_t prk[SHA256_SIZE];
	uint8_t confirm[SHA256_SIZE];
	uint8_t transcript[SHA256_SIZE];
};

/*
 * HMAC-SHA-256 of the n pieces msg[i] (len[i] bytes each) under key.  A
 * failure of libcrypto here (out of memory) leaves nothing to migrate
 * with: abort rather than go on with keys that are not keys.
 */
static void hmac_sha256(const uint8_t *key, size_t key_len, const void *const msg[], const size_t len[], int n,
			uint8_t out[SHA256_SIZE])
{
	OSSL_PARAM params[] = { OSSL_PARAM_construct_utf8_string("digest", (char *)"SHA256", 0), OSSL_PARAM_END };
	EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
	EVP_MAC_CTX *ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
	size_t out_len = 0;
	int i, ok = ctx && EVP_MAC_init(ctx, key, key_len, params) == 1;

	for (i = 0; ok && i < n; i++)
		ok = EVP_MAC_update(ctx, msg[i], len[i]) == 1;
	if (!ok || EVP_MAC_final(ctx, out, &out_len, SHA256_SIZE) != 1 || out_len != SHA256_SIZE)
		abort();
	EVP_MAC_CTX_free(ctx);
	EVP_MAC_free(mac);
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

/*
 * T, PRK and the confirmation key of one connection, from the two hellos
 * and the input keying material: ikm[0..n), the key and the X25519
 * secret on conn 0, the session secret on a join.
 */
static void schedule(const struct mig_hello *src, const struct mig_hello *dst, const void *const ikm[],
		     const size_t ikm_len[], int n, struct keys *k)
{
	EVP_MD_CTX *md = EVP_MD_CTX_new();
	unsigned int t = SHA256_SIZE;

	if (!md || EVP_DigestInit_ex(md, EVP_sha256(), NULL) != 1 || EVP_DigestUpdate(md, src, sizeof(*src)) != 1 ||
	    EVP_DigestUpdate(md, dst, sizeof(*dst)) != 1 || EVP_DigestFinal_ex(md, k->transcript, &t) != 1)
		abort();
	EVP_MD_CTX_free(md);
	/* HKDF-Extract: PRK = HMAC(salt = T, IKM) */
	hmac_sha256(k->transcript, sizeof(k->transcript), ikm, ikm_len, n, k->prk);
	expand(k->prk, "confirm", k->confirm);
}

static void proof(const struct keys *k, const char *who, uint8_t out[MIG_PROOF])
{
	const void *msg[] = { who, k->transcript };
	const size_t len[] = { strlen(who), sizeof(k->transcript) };

	hmac_sha256(k->confirm, sizeof(k->confirm), msg, len, 2, out);
}

/*
 * An end of a connection by address, the way both sides name it: the
 * source the address it connected to (peer), the destination the one a
 * connection arrived on (local).
 */
static void address_name(int fd, bool peer, char *buf, size_t len)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char host[INET6_ADDRSTRLEN] = "?";
	int ret = peer ? getpeername(fd, (struct sockaddr *)&ss, &sl) : getsockname(fd, (struct sockaddr *)&ss, &sl);

	if (ret < 0) {
		snprintf(buf, len, "?");
	} else if (ss.ss_family == AF_UNIX && sl > offsetof(struct sockaddr_un, sun_path) + 1 &&
		   !((struct sockaddr_un *)&ss)->sun_path[0]) {
		/* abstract: "unix:@" and the name's bytes in hex (they may be anything) */
		const uint8_t *a = (const uint8_t *)((struct sockaddr_un *)&ss)->sun_path + 1;
		size_t n = sl - offsetof(struct sockaddr_un, sun_path) - 1, i, at;

		at = (size_t)snprintf(buf, len, "unix:@");
		for (i = 0; i < n && at + 3 <= len; i++)
			at += (size_t)snprintf(buf + at, len - at, "%02x", a[i]);
	} else if (ss.ss_family == AF_UNIX) {
		snprintf(buf, len, "unix:%.*s", (int)(sl - offsetof(struct sockaddr_un, sun_path)),
			 ((struct sockaddr_un *)&ss)->sun_path);
	} else if (ss.ss_family == AF_INET) {
		struct sockaddr_in *in = (struct sockaddr_in *)&ss;

		inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
		snprintf(buf, len, "%s:%u", host, ntohs(in->sin_port));
	} else if (ss.ss_family == AF_INET6) {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;

		inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
		snprintf(buf, len, "[%s]:%u", host, ntohs(in6->sin6_port));
	} else {
		snprintf(buf, len, "?");
	}
}

/*
 * The name a side puts in its hello: the one given (at most MIG_NAME_MAX -
 * 1 bytes, checked by the caller), else its end's address.  An address too
 * long for the hello (a Unix socket's path can take 107 bytes) is not cut,
 * which would make two paths of one long prefix one name: its first 22
 * bytes, '~' and 40 hex digits of the SHA-256 of all of it.
 */
static void own_name(const struct mig_session_opts *o, int fd, bool source, char name[MIG_NAME_MAX])
{
	char buf[256];
	size_t n;

	memset(name, 0, MIG_NAME_MAX);
	if (o->name)
		snprintf(buf, sizeof(buf), "%s", o->name);
	else
		address_name(fd, source, buf, sizeof(buf));
	n = strlen(buf);
	if (n > MIG_NAME_MAX - 1) {
		uint8_t md[32];
		unsigned int i, mdlen = sizeof(md);

		EVP_Digest(buf, n, md, &mdlen, EVP_sha256(), NULL);
		n = 22;
		buf[n++] = '~';
		for (i = 0; i < 20; i++, n += 2)
			snprintf(buf + n, 3, "%02x", md[i]);
	}
	memcpy(name, buf, n < MIG_NAME_MAX - 1 ? n : MIG_NAME_MAX - 1);
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

/*
 * The budget of one connection's handshake (hellos and proofs), whole: a
 * few seconds (MIG_HANDSHAKE_MS), not -T, or the stream's deadline where
 * that is shorter, so that a peer sending a byte a little faster than any
 * timeout cannot hold a handshake for long.
 */
static uint64_t handshake_ms(const struct mig_session_opts *o)
{
	uint64_t ms = o->handshake_ms ? o->handshake_ms : MIG_HANDSHAKE_MS;

	return o->deadline_ms && o->deadline_ms < ms ? o->deadline_ms : ms;
}


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
	return o->psk || o->conns > 1 || o->postcopy || o->compress;
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

/* A hello of ours for connection i (its nonce and, where it has one, the share its kex made). */
static int hello_new(struct mig_hello *h, uint32_t flags, unsigned int conns, unsigned int i, struct mig_kex **kex,
		     char *err, size_t len)
{
	int ret;

	*h = (struct mig_hello){ .magic = MIG_SESSION_MAGIC, .version = MIG_SESSION_VERSION, .flags = flags,
				 .conns = conns, .conn = i };
	ret = fresh(h->nonce, sizeof(h->nonce));
	if (ret < 0)
		return mig_errf(err, len, ret, "getrandom: %s", strerror(-ret));
	if (kex && (ret = mig_kex_new(kex, h->share)) < 0)
		return mig_errf(err, len, ret, "X25519: a key pair: %s", strerror(-ret));
	return 0;
}

/*
 * T, PRK and the confirmation key from both hellos: with the key and the
 * X25519 secret of the two shares (conn 0: kex, ours), or with the
 * session secret (a join).  The ephemeral key is freed, wiped, here: from
 * now on nothing but the session's own keys opens what follows.
 */
static int keys_of(const struct mig_hello *src, const struct mig_hello *dst, bool source, struct mig_kex **kex,
		   const struct mig_psk *psk, const uint8_t *secret, struct keys *k, char *err, size_t len)
{
	uint8_t dh[32];
	int ret;

	if (secret) {
		const void *ikm[] = { secret };
		const size_t ikm_len[] = { 32 };

		schedule(src, dst, ikm, ikm_len, 1, k);
		return 0;
	}
	ret = mig_kex_derive(*kex, source ? dst->share : src->share, dh);
	mig_kex_free(*kex);
	*kex = NULL;
	if (ret < 0)
		return mig_errf(err, len, -EACCES, "authentication: the peer's X25519 share is not a usable one");
	{
		const void *ikm[] = { psk->key, dh };
		const size_t ikm_len[] = { psk->len, sizeof(dh) };

		schedule(src, dst, ikm, ikm_len, 2, k);
	}
	OPENSSL_cleanse(dh, sizeof(dh));
	return 0;
}

/* A hello whose magic is ours: the version and the refusal flag, as the source reads them. */
static int source_check_hello(const struct mig_hello *h, unsigned int i, char *err, size_t len)
{
	if (memcmp(h->magic, MIG_SESSION_MAGIC, sizeof(h->magic)))
		return mig_errf(err, len, -EPROTO, "connection %u: the destination does not speak sessions "
				"(an older kvmdirty-migrate?)", i);
	if (h->version != MIG_SESSION_VERSION)
		return mig_errf(err, len, -EPROTO, "connection %u: the destination speaks session version %u, this source "
				"%d (version 1 had no forward secrecy: update it)", i, h->version, MIG_SESSION_VERSION);
	return 0;
}

/* The destination's refusal after its hello, as one line. */
static int source_refused(struct mig_conn *c, char *err, size_t len)
{
	struct mig_ack ack;
	int ret = recv_all(c, &ack, sizeof(ack), "the destination's refusal", err, len);

	if (ret < 0)
		return ret;
	return mig_errf(err, len, ack.status < 0 ? ack.status : -EPROTO, "destination refused: %s", mig_ack_text(&ack));
}

/*
 * With a key: the destination's proof first, checked before anything of
 * ours that depends on the key goes out; then ours.
 */
static int source_prove(struct mig_conn *c, unsigned int i, const struct keys *k, char *err, size_t len)
{
	uint8_t theirs[MIG_PROOF], want[MIG_PROOF], mine[MIG_PROOF];
	int ret = recv_all(c, theirs, sizeof(theirs), "the destination's proof", err, len);

	if (ret < 0)
		return ret;
	proof(k, "destination proof", want);
	if (CRYPTO_memcmp(want, theirs, sizeof(want)) != 0)
		return mig_errf(err, len, -EACCES, "authentication failed: the destination on connection %u does not prove "
				"that it holds the key (another key, or not the destination this source means)", i);
	proof(k, "source proof", mine);
	ret = send_all(c, mine, sizeof(mine), NULL, 0);
	if (ret < 0)
		return mig_errf(err, len, ret, "connection %u: sending our proof: %s", i, strerror(-ret));
	return 0;
}

/*
 * One connection's handshake from the source's side: our hello, the
 * destination's (and with a key its proof, then ours), its answer.  Conn
 * 0 learns the session's id (session) and, with a key, its secret; a join
 * (secret given) proves both.
 */
static int source_hello(struct mig_session *s, unsigned int i, const struct mig_session_opts *o, uint8_t session[32],
			uint8_t secret[32], char name[MIG_NAME_MAX], char *err, size_t len)
{
	bool psk = s->flags & MIG_S_PSK;
	struct mig_kex *kex = NULL;
	struct mig_hello mine, theirs;
	struct mig_ack ack;
	struct keys k;
	int ret = hello_new(&mine, s->flags | (i ? MIG_S_JOIN : 0), s->conns, i, psk && !i ? &kex : NULL, err, len);

	if (ret < 0)
		return ret;
	/* the destination meant, named once for the session: a join that comes another way means the same one */
	if (!i)
		own_name(o, s->fd[0], true, name);
	memcpy(mine.name, name, MIG_NAME_MAX);
	if (i)
		memcpy(mine.session, session, 32);
	ret = send_all(s->conn[i], &mine, sizeof(mine), NULL, 0);
	if (ret < 0) {
		int sent = ret;

		/* turned away before our hello got there: the refusal it left says why */
		if (recv_all(s->conn[i], &theirs, sizeof(theirs), "", err, len) == 0 &&
		    source_check_hello(&theirs, i, err, len) == 0 && (theirs.flags & MIG_S_REFUSED))
			ret = source_refused(s->conn[i], err, len);
		else
			mig_errf(err, len, sent, "connection %u: sending the hello: %s", i, strerror(-sent));
		goto out;
	}
	ret = recv_all(s->conn[i], &theirs, sizeof(theirs), "the destination's hello", err, len);
	if (ret == 0)
		ret = source_check_hello(&theirs, i, err, len);
	if (ret == 0 && (theirs.flags & MIG_S_REFUSED))
		ret = source_refused(s->conn[i], err, len);
	if (ret < 0)
		goto out;
	if (!i)
		memcpy(session, theirs.session, 32);
	if (psk) {
		ret = keys_of(&mine, &theirs, true, &kex, o->psk, i ? secret : NULL, &k, err, len);
		if (ret == 0)
			ret = source_prove(s->conn[i], i, &k, err, len);
		if (ret < 0)
			goto out;
	}
	ret = recv_all(s->conn[i], &ack, sizeof(ack), "the destination's answer", err, len);
	if (ret == 0 && ack.status)
		ret = mig_errf(err, len, ack.status < 0 ? ack.status : -EPROTO, "destination refused: %s",
			       mig_ack_text(&ack));
	if (ret < 0)
		goto out;
	if (!i && psk)
		expand(k.prk, "session secret", secret);
	ret = open_chan(s, i, &k, true);
	if (ret < 0)
		mig_errf(err, len, ret, "out of memory");
out:
	mig_kex_free(kex);
	OPENSSL_cleanse(&k, sizeof(k));
	return ret;
}

int mig_session_connect(int fd, const struct mig_session_opts *o, int (*connect)(void *ctx, char *err, size_t len),
			void *ctx, struct mig_session *ret_s, char *err, size_t len)
{
	struct mig_session *s = ret_s;
	uint8_t session[32] = { 0 }, secret[32] = { 0 };
	char name[MIG_NAME_MAX];
	uint64_t end;
	unsigned int i;
	int ret;

	session_init(s);
	s->conns = o->conns ? o->conns : 1;
	s->flags = (o->psk ? MIG_S_PSK : 0) | (o->psk && o->encrypt ? MIG_S_ENCRYPT : 0) |
		   (o->postcopy ? MIG_S_POSTCOPY : 0) | (o->compress ? MIG_S_ZSTD : 0);
	if (o->postcopy && s->conns < 2)
		return mig_errf(err, len, -EINVAL, "post-copy needs a fault channel besides the stream's connections");
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
	/* the whole handshake, every connection's, within one bound: a trickling peer cannot hold the source */
	end = mig_clock_ms() + 2 * handshake_ms(o);
	mig_conn_set_deadline(s->conn[0], 2 * handshake_ms(o));
	ret = source_hello(s, 0, o, session, secret, name, err, len);
	memcpy(s->id, session, sizeof(s->id));
	memcpy(s->name, name, sizeof(s->name));
	/* the key is not needed again: the session's keys exist, and joins prove the session's secret */
	if (o->wipe_psk && o->psk)
		mig_psk_clear((struct mig_psk *)o->psk);
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
		mig_conn_set_deadline(s->conn[i], end > mig_clock_ms() ? end - mig_clock_ms() : 1);
		ret = source_hello(s, i, o, session, secret, name, err, len);
	}
	for (i = 0; ret == 0 && i < s->conns; i++)
		mig_conn_set_deadline(s->conn[i], 0);
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

/* The answer after the proofs: ok, or why not. */
static int answer(struct mig_conn *c, int status, const char *why)
{
	struct mig_ack ack = { .status = status, .kind = status < 0 ? MIG_MSG_REFUSED : MIG_MSG_ACK };

	snprintf(ack.message, sizeof(ack.message), "%s", why);
	return send_all(c, &ack, sizeof(ack), NULL, 0);
}

/*
 * What any hello asks, against what this destination takes: 0, or a
 * refusal (-EACCES for authentication) in err.  how: MIG_GREET_*.
 */
static int check_hello(const struct mig_hello *h, const struct mig_session_opts *o, unsigned int how, char *err,
		       size_t len)
{
	if (h->version == 1)
		return mig_errf(err, len, -EPROTO, "hello.version: 1 (no forward secrecy, the source proving first) is no "
				"longer accepted; this destination speaks session version %d", MIG_SESSION_VERSION);
	if (h->version != MIG_SESSION_VERSION)
		return mig_errf(err, len, -EPROTO, "hello.version: %u, this destination speaks session version %d",
				h->version, MIG_SESSION_VERSION);
	if (h->flags & ~MIG_S_FLAGS || h->reserved)
		return mig_errf(err, len, -EPROTO, "hello.flags: 0x%x or hello.reserved set", h->flags);
	if (h->name[MIG_NAME_MAX - 1])
		return mig_errf(err, len, -EPROTO, "hello.name: not terminated within its %d bytes", MIG_NAME_MAX);
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
	if ((h->flags & MIG_S_POSTCOPY) && !o->postcopy)
		return mig_errf(err, len, -EPROTO, "hello.flags: post-copy, which this destination does not take "
				"(listen --postcopy)");
	if ((h->flags & MIG_S_POSTCOPY) && h->conns < 2)
		return mig_errf(err, len, -EPROTO, "hello.conns: %u, post-copy needs a fault channel besides the stream's",
				h->conns);
	if (h->flags & MIG_S_JOIN) {
		if (!(how & MIG_GREET_JOINS))
			return mig_errf(err, len, -EACCES, "authentication: connection %u joins a session that is not open",
					h->conn);
		if (!h->conn || h->conn >= h->conns)
			return mig_errf(err, len, -EPROTO, "hello.conn: %u, not a joining connection of %u", h->conn,
					h->conns);
		return 0;
	}
	if (how & MIG_GREET_ONLY_JOINS)
		return mig_errf(err, len, -EBUSY, "a session is waiting for its connections to join: not another one");
	if (h->conn)
		return mig_errf(err, len, -EPROTO, "hello.conn: %u, a session opens on connection 0", h->conn);
	if (h->conns > 1 && !(how & MIG_GREET_CONNS))
		return mig_errf(err, len, -EPROTO, "hello.conns: %u, this destination takes one connection", h->conns);
	return 0;
}

/* A join's hello against the session it names (first: NULL, no such session is open). */
static int check_join(const struct mig_hello *h, const struct mig_greeting *first, const bool *joined, char *err,
		      size_t len)
{
	if (!first || CRYPTO_memcmp(h->session, first->session, 32) != 0)
		return mig_errf(err, len, -EACCES, "authentication: connection %u does not join a session open here",
				h->conn);
	if ((h->flags & ~MIG_S_JOIN) != first->hello.flags || h->conns != first->hello.conns)
		return mig_errf(err, len, -EPROTO, "hello.flags or .conns: not those of the session it joins");
	if (joined[h->conn])
		return mig_errf(err, len, -EPROTO, "hello.conn: %u, a connection of the session that has joined already",
				h->conn);
	return 0;
}

/* The source must mean this destination: its hello's name against ours. */
static int check_name(const struct mig_hello *theirs, const char mine[MIG_NAME_MAX], char *err, size_t len)
{
	char want[MIG_NAME_MAX * 4], got[MIG_NAME_MAX * 4];

	if (!strncmp(theirs->name, mine, MIG_NAME_MAX))
		return 0;
	mig_printable(theirs->name, strnlen(theirs->name, MIG_NAME_MAX), got, sizeof(got));
	mig_printable(mine, strnlen(mine, MIG_NAME_MAX), want, sizeof(want));
	return mig_errf(err, len, -EACCES, "authentication: the source means '%s', this destination is '%s' (--name, "
			"--peer-name)", got, want);
}

/*
 * One connection's handshake from the destination's side, its hello read
 * and checked: our hello and, with a key, our proof; the peer's proof,
 * checked before anything else of it is read; our answer.  Conn 0 makes
 * the session's id (session); a join is keyed by the session secret and
 * answers to the name its session's first connection matched (name; NULL
 * on conn 0: our own, o->name or the address fd arrived at), whichever
 * way it came.  *wrong_proof: the peer sent a proof, and it was wrong.
 */
static int dest_hello(struct mig_conn *c, int fd, const struct mig_hello *theirs, const struct mig_session_opts *o,
		      const char *name, const uint8_t *secret, uint8_t session[32], struct keys *k, bool *wrong_proof,
		      char *err, size_t len)
{
	bool psk = theirs->flags & MIG_S_PSK;
	struct mig_kex *kex = NULL;
	uint8_t mine_p[MIG_PROOF], p[MIG_PROOF], want[MIG_PROOF];
	struct mig_hello mine;
	int ret = hello_new(&mine, theirs->flags & ~MIG_S_JOIN, theirs->conns, theirs->conn,
			    psk && !theirs->conn ? &kex : NULL, err, len);

	if (ret == 0 && !theirs->conn)
		ret = fresh(session, 32);
	if (ret < 0) {
		refuse_hello(c, ret, "the destination failed");
		goto out;
	}
	if (name)
		memcpy(mine.name, name, MIG_NAME_MAX);
	else
		own_name(o, fd, false, mine.name);
	ret = check_name(theirs, mine.name, err, len);
	if (ret < 0) {
		refuse_hello(c, ret, err);
		goto out;
	}
	memcpy(mine.session, session, 32);
	if (psk) {
		ret = keys_of(theirs, &mine, false, &kex, o->psk, theirs->conn ? secret : NULL, k, err, len);
		if (ret < 0) {
			refuse_hello(c, ret, err);
			goto out;
		}
		proof(k, "destination proof", mine_p);
	}
	/* the hello and, with a key, our proof at once: the source checks it before it proves anything */
	ret = send_all(c, &mine, sizeof(mine), psk ? mine_p : NULL, psk ? sizeof(mine_p) : 0);
	if (ret < 0) {
		mig_errf(err, len, ret, "sending the hello: %s", strerror(-ret));
		goto out;
	}
	if (psk) {
		ret = recv_all(c, p, sizeof(p), "authentication: the peer's proof of the key", err, len);
		if (ret < 0) {
			/*
			 * Ended in place of a proof, once it had ours: what a
			 * source of another key does (it stops at our proof),
			 * or one that gave up waiting.  No guess was tested,
			 * so none is counted (gate.h), nor a wait that ran out.
			 */
			ret = ret == -EPROTO ? -EACCES : ret;
			goto out;
		}
		proof(k, "source proof", want);
		if (CRYPTO_memcmp(want, p, sizeof(p)) != 0) {
			*wrong_proof = true;
			ret = mig_errf(err, len, -EACCES, "authentication failed on connection %u: the peer does not prove "
				       "that it holds the key (a wrong key, or a recorded session played again)",
				       theirs->conn);
			answer(c, ret, err);
			goto out;
		}
	}
	if (o->claim && !__atomic_compare_exchange_n(o->claim, &(int){ MIG_CLAIM_OPEN }, MIG_CLAIM_ANSWERED, false,
						     __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
		ret = mig_errf(err, len, -ECONNABORTED, "cut as it was proven: the house was full");
		goto out;
	}
	ret = answer(c, 0, "ok");
	if (ret < 0)
		mig_errf(err, len, ret, "sending the answer: %s", strerror(-ret));
out:
	mig_kex_free(kex);
	return ret;
}

/*
 * With a key, a peer that has not proved it decides nothing: a hello cut
 * short or malformed, a reset, a silence, all are failures of
 * authentication (a listener with --once goes on accepting).
 */
static int unproved(const struct mig_session_opts *o, int ret, char *err, size_t len)
{
	char why[256];

	if (!o->psk || ret == -EACCES)
		return ret;
	snprintf(why, sizeof(why), "%s", err);
	return mig_errf(err, len, -EACCES, "authentication: the peer did not prove the key: %s", why);
}

void mig_greeting_free(struct mig_greeting *g)
{
	bool wrong_proof = g->wrong_proof;
	unsigned int i;

	for (i = 0; i < MIG_MAX_CONNS; i++)
		g->s.own_fd[i] = false; /* the fd is the caller's */
	mig_session_free(&g->s);
	OPENSSL_cleanse(g, sizeof(*g));
	session_init(&g->s);
	g->wrong_proof = wrong_proof;
}

/*
 * A connection whose first got bytes (in h) are not a session's magic: a
 * plain stream (or not a stream: the decoder says what is wrong with it),
 * opened on s's connection 0 with those bytes to read again; or refused
 * (-errno, why in err): a key required, or only joins taken now.
 */
static int greet_plain(struct mig_session *s, struct mig_hello *h, int got, const struct mig_session_opts *o,
		       unsigned int how, char *err, size_t len)
{
	struct mig_conn *c = s->conn[0];
	char head[sizeof(h->magic)];
	int ret;

	if (o->psk)
		return mig_errf(err, len, -EACCES, "authentication: the peer %s, this destination requires a key "
				"(--psk)", got ? "sent a stream without a key" : "closed without a word");
	if (how & MIG_GREET_ONLY_JOINS)
		return mig_errf(err, len, -EBUSY, "a session is waiting for its connections to join: not a stream");
	memcpy(head, h->magic, sizeof(head));
	memset(h, 0, sizeof(*h));
	/* a plain stream: bounded as a stream is, from when it was taken */
	mig_conn_set_deadline(c, o->deadline_ms);
	ret = mig_chan_new(c, NULL, &s->chan[0]);
	if (ret == 0)
		ret = mig_chan_unread(s->chan[0], head, (size_t)got);
	return ret < 0 ? mig_errf(err, len, ret, "out of memory") : 0;
}

int mig_session_greet(int fd, const struct mig_session_opts *o, unsigned int how, struct mig_greeting *g, char *err,
		      size_t len)
{
	struct mig_session *s = &g->s;
	struct mig_hello *h = &g->hello;
	struct keys k = { 0 };
	struct mig_conn *c;
	int ret;

	memset(g, 0, sizeof(*g));
	session_init(s);
	s->fd[0] = fd;
	ret = mig_conn_new(fd, o->timeout_ms, &s->conn[0]);
	if (ret < 0)
		return mig_errf(err, len, ret, "io_uring: %s", strerror(-ret));
	c = s->conn[0];
	/* a peer that trickles its hello holds this connection for one handshake's budget, whole */
	mig_conn_set_deadline(c, handshake_ms(o));
	s->conns = 1;
	ret = mig_conn_read(c, h, sizeof(h->magic));
	if (ret < 0) {
		char why[96];

		mig_conn_strerror(c, ret, why, sizeof(why));
		mig_errf(err, len, ret, "awaiting the header: %s", why);
		goto plain_refusal;
	}
	if (ret < (int)sizeof(h->magic) || memcmp(h->magic, MIG_SESSION_MAGIC, sizeof(h->magic))) {
		ret = greet_plain(s, h, ret, o, how, err, len);
		if (ret == 0)
			return 0;
		goto plain_refusal;
	}
	ret = recv_all(c, (uint8_t *)h + sizeof(h->magic), sizeof(*h) - sizeof(h->magic), "the hello", err, len);
	if (ret < 0)
		goto fail;
	ret = check_hello(h, o, how, err, len);
	if (ret < 0) {
		refuse_hello(c, ret, err);
		goto fail;
	}
	if (h->flags & MIG_S_JOIN) {
		/* mig_session_join() goes on, once the session it names is known: the connection at its index */
		s->conn[h->conn] = c;
		s->fd[h->conn] = fd;
		s->conn[0] = NULL;
		s->fd[0] = -1;
		g->join = true;
		return 0;
	}
	s->flags = h->flags;
	ret = dest_hello(c, fd, h, o, NULL, NULL, g->session, &k, &g->wrong_proof, err, len);
	/* past the handshake, the stream's own bound */
	mig_conn_set_deadline(c, o->deadline_ms);
	if (ret == 0 && (s->flags & MIG_S_PSK))
		expand(k.prk, "session secret", g->secret);
	if (ret == 0 && (ret = open_chan(s, 0, &k, false)) < 0)
		mig_errf(err, len, ret, "out of memory");
	OPENSSL_cleanse(&k, sizeof(k));
	if (ret < 0)
		goto fail;
	return 0;
plain_refusal: {
	struct mig_ack ack = { .status = ret };

	/* the answer has its own wait (-T), past a handshake's deadline */
	mig_conn_set_deadline(c, 0);
	snprintf(ack.message, sizeof(ack.message), "%s", err);
	send_all(c, &ack, sizeof(ack), NULL, 0); /* best effort */
}
fail:
	ret = unproved(o, ret, err, len);
	mig_greeting_free(g);
	return ret;
}

int mig_session_join(struct mig_greeting *g, const struct mig_greeting *first, const bool *joined,
		     const struct mig_session_opts *o, char *err, size_t len)
{
	unsigned int i = g->hello.conn;
	struct mig_conn *c = g->s.conn[i];
	struct keys k = { 0 };
	uint8_t session[32];
	int ret = check_join(&g->hello, first, joined, err, len);

	if (ret < 0) {
		refuse_hello(c, ret, err);
		goto out;
	}
	g->s.flags = first->hello.flags;
	memcpy(session, first->session, 32);
	ret = dest_hello(c, g->s.fd[i], &g->hello, o, first->hello.name, first->secret, session, &k, &g->wrong_proof,
			 err, len);
	if (ret == 0) {
		mig_conn_set_deadline(c, o->deadline_ms);
		if ((ret = open_chan(&g->s, i, &k, false)) < 0)
			mig_errf(err, len, ret, "out of memory");
	}
	OPENSSL_cleanse(&k, sizeof(k));
out:
	if (ret < 0) {
		ret = unproved(o, ret, err, len);
		mig_greeting_free(g);
	}
	return ret;
}

int mig_session_adopt(struct mig_greeting *first, bool *joined, struct mig_greeting *g, char *err, size_t len)
{
	unsigned int i = g->hello.conn;
	struct mig_session *s = &first->s;

	if (!g->join || !g->s.chan[i] || joined[i]) {
		mig_greeting_free(g);
		return mig_errf(err, len, -EALREADY, "connection %u: joined the session already", i);
	}
	s->conn[i] = g->s.conn[i];
	s->chan[i] = g->s.chan[i];
	s->fd[i] = g->s.fd[i];
	s->own_fd[i] = true;
	joined[i] = true;
	g->s.conn[i] = NULL;
	g->s.chan[i] = NULL;
	g->s.fd[i] = -1;
	mig_greeting_free(g);
	return 0;
}

/* Nothing but a refusal, with no wait: for a connection not taken at all. */
void mig_session_turn_away(int fd, const char *why)
{
	struct {
		struct mig_hello h;
		struct mig_ack ack;
	} r = { .h = { .magic = MIG_SESSION_MAGIC, .version = MIG_SESSION_VERSION, .flags = MIG_S_REFUSED },
		.ack = { .status = -EAGAIN, .kind = MIG_MSG_REFUSED } };

	snprintf(r.ack.message, sizeof(r.ack.message), "%s", why);
	(void)!send(fd, &r, sizeof(r), MSG_DONTWAIT | MSG_NOSIGNAL);
}

int mig_session_accept(int fd, const struct mig_session_opts *o,
		       int (*accept)(void *ctx, uint64_t timeout_ms, char *err, size_t len), void *ctx,
		       struct mig_session *ret_s, char *err, size_t len)
{
	struct mig_greeting first, g;
	bool joined[MIG_MAX_CONNS] = { true };
	struct mig_session_opts jo = *o;
	uint64_t end, now;
	unsigned int n;
	int ret;

	ret = mig_session_greet(fd, o, accept ? MIG_GREET_CONNS : 0, &first, err, len);
	if (ret < 0)
		return ret;
	/* the other connections, all within one bound; whoever connects meanwhile and does not join is refused */
	end = mig_clock_ms() + mig_session_join_ms(o);
	for (n = 1; n < first.hello.conns;) {
		char why[256];
		int cfd;

		now = mig_clock_ms();
		if (now >= end) {
			ret = mig_errf(err, len, -ETIMEDOUT, "awaiting connection %u of the session's %u: not joined within "
				       "%" PRIu64 " ms", n, first.hello.conns, mig_session_join_ms(o));
			goto fail;
		}
		cfd = accept(ctx, end - now, why, sizeof(why));
		if (cfd < 0) {
			ret = mig_errf(err, len, cfd, "awaiting connection %u of the session's %u: %s", n,
				       first.hello.conns, why);
			goto fail;
		}
		jo.handshake_ms = end - now < handshake_ms(o) ? end - now : handshake_ms(o);
		ret = mig_session_greet(cfd, &jo, MIG_GREET_JOINS | MIG_GREET_ONLY_JOINS, &g, why, sizeof(why));
		if (ret == 0)
			ret = mig_session_join(&g, &first, joined, &jo, why, sizeof(why));
		if (ret == 0)
			ret = mig_session_adopt(&first, joined, &g, why, sizeof(why));
		if (ret < 0) {
			close(cfd);
			if (o->log)
				o->log(o->log_ctx, why);
			continue;
		}
		n++;
	}
	*ret_s = first.s;
	ret_s->conns = first.hello.conns ? first.hello.conns : 1;
	memcpy(ret_s->id, first.session, sizeof(ret_s->id));
	memcpy(ret_s->name, first.hello.name, sizeof(ret_s->name));
	OPENSSL_cleanse(&first, sizeof(first));
	return 0;
fail:
	mig_greeting_free(&first);
	return ret;
}

uint64_t mig_session_join_ms(const struct mig_session_opts *o)
{
	uint64_t ms = 2 * (o->handshake_ms ? o->handshake_ms : MIG_HANDSHAKE_MS);

	return o->deadline_ms && o->deadline_ms < ms ? o->deadline_ms : ms;
}
