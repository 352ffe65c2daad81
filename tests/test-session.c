// SPDX-License-Identifier: MIT
/*
 * Sessions and sealed records without KVM (key files: test-keyfile.c,
 * the listener: test-gate.c): the handshake over socket pairs, both ends
 * in this process, refusing a wrong key, a missing one, one the
 * destination does not have, a session without the encryption the
 * destination requires, a recorded session played again, a destination
 * of another name and a version 1 hello; a fake destination learning
 * nothing to guess the key with; a destination trickling its hello cut
 * within the source's bound; a recording opened with the key yielding
 * nothing; connections that do not join the session refused while the
 * real ones join; and sealed records changed,
 * dropped, reordered, replayed, moved to another connection or cut off,
 * each refused at the record it hit with nothing of that record handed
 * on, in both sealing modes.
 */
#define _GNU_SOURCE /* memmem */
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "channel.h"
#include "migrate-util.h"
#include "session.h"
#include "test-util.h"

#define KEY_A "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef\n"
#define KEY_B "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdee\n"

static char tmpdir[64];

static void write_file(const char *name, const char *content, mode_t mode, char *path, size_t len)
{
	int fd;

	snprintf(path, len, "%s/%s", tmpdir, name);
	unlink(path);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, content, strlen(content)), (ssize_t)strlen(content));
	close(fd);
	ck_assert_int_eq(chmod(path, mode), 0);
}

static struct mig_psk key_a, key_b;

/* The two keys the handshakes use (in each test's own process). */
static void load_keys(void)
{
	char path[128], err[256];

	write_file("key", KEY_A, 0600, path, sizeof(path));
	ck_assert_msg(mig_psk_load(path, &key_a, err, sizeof(err)) == 0, "%s", err);
	write_file("key", KEY_B, 0600, path, sizeof(path));
	ck_assert_msg(mig_psk_load(path, &key_b, err, sizeof(err)) == 0, "%s", err);
}

/* ---- the handshake, both ends here ---- */

/* A socket that relays a connection and records what the source sent. */
struct tap {
	int from, to;
	uint8_t *buf;
	size_t len;
	bool record;
};

static void *tap_run(void *p)
{
	struct tap *t = p;
	uint8_t b[65536];
	ssize_t k;

	while ((k = read(t->from, b, sizeof(b))) > 0) {
		if (t->record) {
			t->buf = realloc(t->buf, t->len + (size_t)k);
			memcpy(t->buf + t->len, b, (size_t)k);
			t->len += (size_t)k;
		}
		if (send(t->to, b, (size_t)k, MSG_NOSIGNAL) != k)
			break;
	}
	shutdown(t->to, SHUT_WR);
	return NULL;
}

struct side {
	struct mig_session_opts o;
	struct mig_session s;
	int fd, ret;
	char err[256];
	/* a message each way once the session is up */
	char got[64];
};

static const char hello_dst[] = "from the destination", hello_src[] = "from the source";

static void exchange(struct side *x, bool source)
{
	struct iovec iov = { (void *)(source ? hello_src : hello_dst),
			     source ? sizeof(hello_src) : sizeof(hello_dst) };
	size_t want = source ? sizeof(hello_dst) : sizeof(hello_src);

	if (source) {
		ck_assert_ok(mig_chan_writev(x->s.chan[0], &iov, 1));
		ck_assert_int_eq(mig_chan_read(x->s.chan[0], x->got, want), (int)want);
	} else {
		ck_assert_int_eq(mig_chan_read(x->s.chan[0], x->got, want), (int)want);
		ck_assert_ok(mig_chan_writev(x->s.chan[0], &iov, 1));
	}
}

/* The handshakes here fail on connection 0, before any other is opened. */
static int no_more(void *ctx, char *err, size_t len)
{
	snprintf(err, len, "no second connection here");
	return -ECONNREFUSED;
}

static void *source_run(void *p)
{
	struct side *x = p;

	x->ret = mig_session_connect(x->fd, &x->o, no_more, NULL, &x->s, x->err, sizeof(x->err));
	if (x->ret == 0) {
		exchange(x, true);
		mig_session_free(&x->s);
	}
	shutdown(x->fd, SHUT_RDWR);
	return NULL;
}

/* What the destination sent in the last handshake() that recorded (its hello first). */
static uint8_t *back_rec;
static size_t back_len;

/*
 * A source and a destination with these options over a socket pair,
 * through a tap that records what the source sends (into *rec, when
 * asked).  Both results and reasons in src and dst.
 */
static void handshake(struct side *src, struct side *dst, uint8_t **rec, size_t *rec_len)
{
	int a[2], b[2];
	struct tap t;
	pthread_t ts, tt;

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, a), 0);
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, b), 0);
	/* source a[0] ... a[1] tap b[0] ... b[1] destination; the answers go back untapped */
	t = (struct tap){ .from = a[1], .to = b[0], .record = rec != NULL };
	src->fd = a[0];
	dst->fd = b[1];
	ck_assert_int_eq(pthread_create(&ts, NULL, source_run, src), 0);
	ck_assert_int_eq(pthread_create(&tt, NULL, tap_run, &t), 0);
	{
		struct tap back = { .from = b[0], .to = a[1], .record = rec != NULL };
		pthread_t tb;

		ck_assert_int_eq(pthread_create(&tb, NULL, tap_run, &back), 0);
		dst->ret = mig_session_accept(dst->fd, &dst->o, NULL, NULL, &dst->s, dst->err, sizeof(dst->err));
		if (dst->ret == 0) {
			exchange(dst, false);
			mig_session_free(&dst->s);
		}
		shutdown(dst->fd, SHUT_RDWR);
		pthread_join(ts, NULL);
		shutdown(a[1], SHUT_RDWR);
		shutdown(b[0], SHUT_RDWR);
		pthread_join(tt, NULL);
		pthread_join(tb, NULL);
		back_rec = back.buf;
		back_len = back.len;
	}
	if (rec) {
		*rec = t.buf;
		*rec_len = t.len;
	}
	close(a[0]);
	close(a[1]);
	close(b[0]);
	close(b[1]);
}

static void expect_side(const struct side *x, const char *who, int ret, const char *says)
{
	ck_assert_msg(x->ret == ret, "%s: %d (%s), expected %d", who, x->ret, x->err, ret);
	if (says)
		ck_assert_msg(strstr(x->err, says) && !strchr(x->err, '\n'), "%s: '%s', expected one line saying '%s'",
			      who, x->err, says);
}

START_TEST(handshake_proves_the_key)
{
	static const struct {
		const struct mig_psk *src, *dst;
		bool src_encrypt, dst_encrypt;
		int ret;
		const char *dst_says, *src_says;
	} cases[] = {
		{ .src = &key_a, .dst = &key_a, .ret = 0 },
		{ .src = &key_a, .dst = &key_a, .src_encrypt = true, .dst_encrypt = true, .ret = 0 },
		{ .src = &key_a, .dst = &key_a, .src_encrypt = true, .ret = 0 },
		/* the destination proves first: the source, finding it wrong, proves nothing */
		{ .src = &key_b, .dst = &key_a, .ret = -EACCES,
		  .dst_says = "authentication: the peer's proof of the key",
		  .src_says = "authentication failed: the destination on connection 0 does not prove that it holds the key" },
		{ .src = NULL, .dst = &key_a, .ret = -EACCES,
		  .dst_says = "authentication: the peer has no key, this destination requires one" },
		{ .src = &key_a, .dst = NULL, .ret = -EACCES,
		  .dst_says = "authentication: the peer offers a key, this destination has none",
		  .src_says = "destination refused: authentication" },
		{ .src = &key_a, .dst = &key_a, .dst_encrypt = true, .ret = -EACCES,
		  .dst_says = "authentication: the peer does not encrypt, this destination requires it",
		  .src_says = "destination refused: authentication" },
	};
	unsigned int i;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct side src = { .o = { .psk = cases[i].src, .encrypt = cases[i].src_encrypt, .timeout_ms = 5000,
					   .conns = cases[i].src ? 1 : 2 } },
			    dst = { .o = { .psk = cases[i].dst, .encrypt = cases[i].dst_encrypt, .timeout_ms = 5000 } };

		/* a source without a key opens a session only with several connections: two, refused first */
		handshake(&src, &dst, NULL, NULL);
		if (!cases[i].src) {
			ck_assert_msg(dst.ret == -EACCES && strstr(dst.err, cases[i].dst_says), "case %u: %d '%s'", i,
				      dst.ret, dst.err);
			continue;
		}
		expect_side(&dst, "destination", cases[i].ret, cases[i].dst_says);
		expect_side(&src, "source", cases[i].ret, cases[i].src_says);
		if (!cases[i].ret) {
			ck_assert_str_eq(src.got, hello_dst);
			ck_assert_str_eq(dst.got, hello_src);
		}
	}
}
END_TEST

START_TEST(plain_stream_refused_with_a_key)
{
	struct mig_session_opts o = { .psk = &key_a, .timeout_ms = 5000 };
	struct mig_header h = { .magic = MIG_MAGIC, .version = MIG_VERSION };
	struct mig_session s;
	struct mig_ack ack;
	char err[256];
	int sv[2];

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	ck_assert_int_eq(write(sv[0], &h, sizeof(h)), (ssize_t)sizeof(h));
	ck_assert_errno(mig_session_accept(sv[1], &o, NULL, NULL, &s, err, sizeof(err)), EACCES);
	ck_assert_msg(strstr(err, "authentication: the peer sent a stream without a key"), "%s", err);
	/* the plain peer hears why, in its own terms */
	ck_assert_int_eq(read(sv[0], &ack, sizeof(ack)), (ssize_t)sizeof(ack));
	ck_assert_int_eq(ack.status, -EACCES);
	ck_assert_msg(strstr(ack.message, "authentication"), "%s", ack.message);
	close(sv[0]);
	close(sv[1]);
}
END_TEST

/* What a recorded session's source sent, played again to a destination: its proof is stale. */
START_TEST(replayed_session_refused)
{
	struct side src = { .o = { .psk = &key_a, .timeout_ms = 5000 } }, dst = { .o = { .psk = &key_a, .timeout_ms = 5000 } };
	struct mig_session_opts o = { .psk = &key_a, .timeout_ms = 5000 };
	struct mig_session s;
	uint8_t *rec;
	size_t len;
	char err[256];
	int sv[2];

	handshake(&src, &dst, &rec, &len);
	ck_assert_msg(src.ret == 0 && dst.ret == 0, "the recorded session failed: %s / %s", src.err, dst.err);
	ck_assert_uint_gt(len, sizeof(struct mig_hello) + MIG_PROOF);
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	ck_assert_int_eq(write(sv[0], rec, len), (ssize_t)len);
	shutdown(sv[0], SHUT_WR);
	ck_assert_errno(mig_session_accept(sv[1], &o, NULL, NULL, &s, err, sizeof(err)), EACCES);
	ck_assert_msg(strstr(err, "authentication failed on connection 0") && strstr(err, "played again"), "%s", err);
	close(sv[0]);
	close(sv[1]);
	free(rec);
}
END_TEST

/*
 * A destination without the key: it answers the source's hello with one
 * of its own and a proof it cannot make.  The source checks that proof
 * before it sends anything that depends on the key: all the fake
 * destination ever gets is the source's hello (nonce, share, name),
 * nothing to test guesses of the key against.
 */
START_TEST(fake_destination_gets_nothing)
{
	struct side src = { .o = { .psk = &key_a, .timeout_ms = 5000 } };
	struct mig_hello theirs, fake = { .magic = MIG_SESSION_MAGIC, .version = MIG_SESSION_VERSION,
					  .flags = MIG_S_PSK, .conns = 1 };
	uint8_t proof[MIG_PROOF], more[64];
	pthread_t ts;
	int sv[2];
	ssize_t k;

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	src.fd = sv[0];
	ck_assert_int_eq(pthread_create(&ts, NULL, source_run, &src), 0);
	ck_assert_int_eq(read(sv[1], &theirs, sizeof(theirs)), (ssize_t)sizeof(theirs));
	/* the source's hello carries a share of its own, and the name it means */
	ck_assert(memcmp(theirs.share, (uint8_t[32]){ 0 }, 32));
	ck_assert_str_eq(theirs.name, "unix:");
	memcpy(fake.name, theirs.name, sizeof(fake.name));
	memset(fake.share, 9, sizeof(fake.share));
	memset(proof, 0x5a, sizeof(proof));
	ck_assert_int_eq(write(sv[1], &fake, sizeof(fake)), (ssize_t)sizeof(fake));
	ck_assert_int_eq(write(sv[1], proof, sizeof(proof)), (ssize_t)sizeof(proof));
	pthread_join(ts, NULL);
	ck_assert_msg(src.ret == -EACCES && strstr(src.err, "does not prove that it holds the key"), "%d %s", src.ret,
		      src.err);
	/* and nothing after the hello: no proof of the source's, no byte */
	k = read(sv[1], more, sizeof(more));
	ck_assert_msg(k == 0, "the source sent %zd bytes more", k);
	close(sv[0]);
	close(sv[1]);
}
END_TEST

/*
 * A destination trickling its hello, a byte each 50 ms (each byte well
 * within the source's -T of 5000 ms): the source's handshake is bounded as
 * a whole (twice handshake_ms, 2 x 300 ms here), so it gives up with
 * -ETIMEDOUT long before the hello's 192 bytes are in, and sends nothing
 * after its own hello.  Without the whole bound it waited for every byte.
 */
START_TEST(trickling_destination_bounded)
{
	struct side src = { .o = { .psk = &key_a, .timeout_ms = 5000, .handshake_ms = 300 } };
	struct mig_hello theirs, fake = { .magic = MIG_SESSION_MAGIC, .version = MIG_SESSION_VERSION,
					  .flags = MIG_S_PSK, .conns = 1 };
	const uint8_t *b = (const uint8_t *)&fake;
	uint8_t more[64];
	size_t sent = 0;
	pthread_t ts;
	int sv[2];
	ssize_t k;

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	src.fd = sv[0];
	ck_assert_int_eq(pthread_create(&ts, NULL, source_run, &src), 0);
	ck_assert_int_eq(read(sv[1], &theirs, sizeof(theirs)), (ssize_t)sizeof(theirs));
	memcpy(fake.name, theirs.name, sizeof(fake.name));
	memset(fake.share, 9, sizeof(fake.share));
	/* a byte at a time until the source hangs up (its shutdown ends our sends) */
	while (sent < sizeof(fake) && send(sv[1], b + sent, 1, MSG_NOSIGNAL) == 1) {
		sent++;
		usleep(50 * 1000);
		if (recv(sv[1], more, sizeof(more), MSG_DONTWAIT) == 0)
			break;
	}
	pthread_join(ts, NULL);
	ck_assert_msg(src.ret == -ETIMEDOUT, "%d %s", src.ret, src.err);
	ck_assert_msg(sent < sizeof(fake), "the source waited for all %zu bytes of a trickled hello", sent);
	k = read(sv[1], more, sizeof(more));
	ck_assert_msg(k <= 0, "the source sent %zd bytes after its hello", k);
	close(sv[0]);
	close(sv[1]);
}
END_TEST

/* The destination the source means, by name: another refuses, naming both. */
START_TEST(names_bind_the_destination)
{
	struct side src = { .o = { .psk = &key_a, .timeout_ms = 5000, .name = "d1.example:4444" } },
		    dst = { .o = { .psk = &key_a, .timeout_ms = 5000, .name = "d2.example:4444" } };

	handshake(&src, &dst, NULL, NULL);
	expect_side(&dst, "destination", -EACCES, "the source means 'd1.example:4444', this destination is "
		    "'d2.example:4444'");
	expect_side(&src, "source", -EACCES, "destination refused: authentication: the source means 'd1.example:4444'");
	/* the same names: through */
	src = (struct side){ .o = { .psk = &key_a, .timeout_ms = 5000, .name = "d2.example:4444" } };
	dst = (struct side){ .o = { .psk = &key_a, .timeout_ms = 5000, .name = "d2.example:4444" } };
	handshake(&src, &dst, NULL, NULL);
	ck_assert_msg(src.ret == 0 && dst.ret == 0, "%s / %s", src.err, dst.err);
	/* hostile bytes in a name are not printed as they are */
	src = (struct side){ .o = { .psk = &key_a, .timeout_ms = 5000, .name = "\x1b[31mred\n" } };
	dst = (struct side){ .o = { .psk = &key_a, .timeout_ms = 5000, .name = "d2" } };
	handshake(&src, &dst, NULL, NULL);
	ck_assert_msg(dst.ret == -EACCES && !strchr(dst.err, '\x1b') && !strchr(dst.err, '\n') &&
			      strstr(dst.err, "'?[31mred?'"), "%s", dst.err);
}
END_TEST

static int unix_connect(const char *path);

/* A Unix listener at tmpdir/<70 x 'p'><last>, its path in path. */
static int long_listener(char last, char *path, size_t len)
{
	struct sockaddr_un un = { .sun_family = AF_UNIX };
	char pad[71];
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);

	memset(pad, 'p', 70);
	pad[70] = 0;
	snprintf(path, len, "%s/%s%c", tmpdir, pad, last);
	ck_assert_uint_lt(strlen(path), sizeof(un.sun_path));
	snprintf(un.sun_path, sizeof(un.sun_path), "%s", path);
	unlink(path);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&un, sizeof(un)), 0);
	ck_assert_int_eq(listen(fd, 4), 0);
	return fd;
}

/*
 * Default names from Unix paths longer than a hello's name, alike in
 * their first 63 bytes: a source that dialled one (A) and is relayed to
 * the other (B) is refused, the names told apart by a digest of the whole
 * path; dialling B itself, it gets in (both ends name B alike).  Cut to
 * 63 bytes, A and B were one name, and B took a session meant for A.
 */
START_TEST(long_addresses_kept_apart)
{
	char pa[160], pb[160];
	int la = long_listener('A', pa, sizeof(pa)), lb = long_listener('B', pb, sizeof(pb));
	struct side src = { .o = { .psk = &key_a, .timeout_ms = 5000 } },
		    dst = { .o = { .psk = &key_a, .timeout_ms = 5000 } };
	struct tap up, down;
	pthread_t ts, tu, td;
	int fa, fb, fd;

	/* source -> A, relayed -> B */
	src.fd = unix_connect(pa);
	ck_assert_int_eq(pthread_create(&ts, NULL, source_run, &src), 0);
	fa = accept(la, NULL, NULL);
	fb = unix_connect(pb);
	up = (struct tap){ .from = fa, .to = fb };
	down = (struct tap){ .from = fb, .to = fa };
	ck_assert_int_eq(pthread_create(&tu, NULL, tap_run, &up), 0);
	ck_assert_int_eq(pthread_create(&td, NULL, tap_run, &down), 0);
	fd = accept(lb, NULL, NULL);
	dst.ret = mig_session_accept(fd, &dst.o, NULL, NULL, &dst.s, dst.err, sizeof(dst.err));
	shutdown(fd, SHUT_RDWR);
	pthread_join(ts, NULL);
	shutdown(fa, SHUT_RDWR);
	shutdown(fb, SHUT_RDWR);
	pthread_join(tu, NULL);
	pthread_join(td, NULL);
	close(fa);
	close(fb);
	close(fd);
	close(src.fd);
	expect_side(&dst, "destination", -EACCES, "authentication: the source means 'unix:");
	ck_assert_int_lt(src.ret, 0);
	/* straight to B: in */
	src = (struct side){ .o = { .psk = &key_a, .timeout_ms = 5000 } };
	dst = (struct side){ .o = { .psk = &key_a, .timeout_ms = 5000 } };
	src.fd = unix_connect(pb);
	ck_assert_int_eq(pthread_create(&ts, NULL, source_run, &src), 0);
	fd = accept(lb, NULL, NULL);
	dst.ret = mig_session_accept(fd, &dst.o, NULL, NULL, &dst.s, dst.err, sizeof(dst.err));
	if (dst.ret == 0) {
		exchange(&dst, false);
		mig_session_free(&dst.s);
	}
	pthread_join(ts, NULL);
	ck_assert_msg(src.ret == 0 && dst.ret == 0, "%s / %s", src.err, dst.err);
	close(fd);
	close(src.fd);
	close(la);
	close(lb);
	unlink(pa);
	unlink(pb);
}
END_TEST

/* A hello of session version 1 is refused by name. */
START_TEST(version_1_refused)
{
	struct mig_session_opts o = { .psk = &key_a, .timeout_ms = 5000 };
	struct mig_hello h = { .magic = MIG_SESSION_MAGIC, .version = 1, .flags = MIG_S_PSK, .conns = 1 };
	struct mig_session s;
	char err[256];
	int sv[2];

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	ck_assert_int_eq(write(sv[0], &h, sizeof(h)), (ssize_t)sizeof(h));
	ck_assert_errno(mig_session_accept(sv[1], &o, NULL, NULL, &s, err, sizeof(err)), EACCES);
	ck_assert_msg(strstr(err, "hello.version: 1 (no forward secrecy"), "%s", err);
	close(sv[0]);
	close(sv[1]);
}
END_TEST

/*
 * The keys of the source's records as the key file and a recording give
 * them: T of the recorded hellos, PRK = HMAC(T, key), the record key
 * HMAC(PRK, label || 1), with the labels of session version v.
 */
static void recording_keys(const struct mig_hello *sh, const struct mig_hello *dh, const struct mig_psk *psk, int v,
			   struct mig_chan_keys *ck)
{
	uint8_t t[32], prk[32], in[128];
	unsigned int n = 32;
	int k;

	memset(ck, 0, sizeof(*ck));
	ck->encrypt = true;
	{
		EVP_MD_CTX *md = EVP_MD_CTX_new();

		ck_assert(EVP_DigestInit_ex(md, EVP_sha256(), NULL) == 1 && EVP_DigestUpdate(md, sh, sizeof(*sh)) == 1 &&
			  EVP_DigestUpdate(md, dh, sizeof(*dh)) == 1 && EVP_DigestFinal_ex(md, t, &n) == 1);
		EVP_MD_CTX_free(md);
	}
	ck_assert(HMAC(EVP_sha256(), t, 32, psk->key, psk->len, prk, &n));
	k = snprintf((char *)in, sizeof(in), "kvmdirty-migrate session %d source to destination", v);
	in[k] = 1;
	ck_assert(HMAC(EVP_sha256(), prk, 32, in, (size_t)k + 1, ck->recv, &n));
	memcpy(ck->send, ck->recv, sizeof(ck->send));
}

/*
 * A recording of a whole session, both directions, and the key file:
 * whatever the recording and the key give (the hellos, their nonces and
 * shares, the key) does not open the records, and what was sent sealed
 * does not show in it.  The records' keys came from the X25519 secret
 * too, whose private halves were wiped once the keys existed.
 */
START_TEST(recording_and_key_open_nothing)
{
	struct side src = { .o = { .psk = &key_a, .encrypt = true, .timeout_ms = 5000 } },
		    dst = { .o = { .psk = &key_a, .encrypt = true, .timeout_ms = 5000 } };
	struct mig_hello sh, dh;
	struct mig_chan_keys ck;
	struct mem_stream m;
	struct mig_reader rd;
	struct mig_chan *ch;
	uint8_t *rec;
	size_t len, off;
	char got[64];
	int ret, v;

	handshake(&src, &dst, &rec, &len);
	ck_assert_msg(src.ret == 0 && dst.ret == 0, "%s / %s", src.err, dst.err);
	ck_assert_uint_gt(len, sizeof(sh) + MIG_PROOF);
	ck_assert_uint_gt(back_len, sizeof(dh));
	memcpy(&sh, rec, sizeof(sh));
	memcpy(&dh, back_rec, sizeof(dh));
	/* sealed and encrypted: what the source sent does not show */
	ck_assert(memmem(rec, len, hello_src, sizeof(hello_src)) == NULL);
	/* the record keys the recording and the key give: HKDF-Extract(T, key), either version's labels */
	off = sizeof(sh) + MIG_PROOF;
	{
		/* a sealed record starts there indeed (its header in clear): the keys, not the framing, fail below */
		struct mig_seal hdr;

		memcpy(&hdr, rec + off, sizeof(hdr));
		ck_assert_msg(!hdr.reserved && !(hdr.flags & ~MIG_SEAL_LAST) && hdr.len <= MIG_SEAL_MAX &&
				      off + sizeof(hdr) + hdr.len + MIG_SEAL_TAG <= len,
			      "no sealed record at %zu: len %u flags %u", off, hdr.len, hdr.flags);
	}
	for (v = 1; v <= 2; v++) {
		recording_keys(&sh, &dh, &key_a, v, &ck);
		m = (struct mem_stream){ .buf = rec + off, .len = len - off };
		rd = (struct mig_reader){ .read = mem_read, .describe = mem_describe, .ctx = &m };
		ck_assert_int_eq(mig_chan_new_reader(&rd, &ck, &ch), 0);
		ret = mig_chan_read(ch, got, sizeof(hello_src));
		ck_assert_msg(ret == -EACCES, "the recording opened with the key alone (labels of version %d): %d", v, ret);
		mig_chan_free(ch);
	}
	free(rec);
	free(back_rec);
	back_rec = NULL;
}
END_TEST

/* ---- connections joining a session ---- */

struct joiner {
	char path[108];
	int lfd;
	unsigned int intruders; /* connections to make first that do not join */
	unsigned int refused;
	/* joins through a relay: the source's end a socket pair, the destination's the socket at path */
	bool relayed;
	struct tap taps[2 * MIG_MAX_CONNS];
	pthread_t tap_th[2 * MIG_MAX_CONNS];
	unsigned int ntaps;
};

static int unix_connect(const char *path)
{
	struct sockaddr_un un = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);

	snprintf(un.sun_path, sizeof(un.sun_path), "%s", path);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&un, sizeof(un)), 0);
	return fd;
}

/* Before each real connection, an intruder whose hello names another session. */
static int join_connect(void *ctx, char *err, size_t len)
{
	struct joiner *j = ctx;

	while (j->intruders) {
		struct mig_hello h = { .magic = MIG_SESSION_MAGIC, .version = MIG_SESSION_VERSION,
				       .flags = MIG_S_PSK | MIG_S_JOIN, .conns = 3, .conn = 1 };
		int fd = unix_connect(j->path);
		struct mig_hello back;

		memset(h.session, 0x5a, sizeof(h.session));
		ck_assert_int_eq(write(fd, &h, sizeof(h)), (ssize_t)sizeof(h));
		/* refused before any proof is asked */
		ck_assert_int_eq(read(fd, &back, sizeof(back)), (ssize_t)sizeof(back));
		ck_assert_uint_eq(back.flags & MIG_S_REFUSED, MIG_S_REFUSED);
		close(fd);
		j->intruders--;
	}
	if (j->relayed) {
		int sv[2], fd = unix_connect(j->path), k;

		ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
		j->taps[j->ntaps] = (struct tap){ .from = sv[1], .to = fd };
		j->taps[j->ntaps + 1] = (struct tap){ .from = fd, .to = sv[1] };
		for (k = 0; k < 2; k++, j->ntaps++)
			ck_assert_int_eq(pthread_create(&j->tap_th[j->ntaps], NULL, tap_run, &j->taps[j->ntaps]), 0);
		return sv[0];
	}
	return unix_connect(j->path);
}

static int join_accept(void *ctx, uint64_t timeout_ms, char *err, size_t len)
{
	struct joiner *j = ctx;
	struct pollfd p = { .fd = j->lfd, .events = POLLIN };
	int fd;

	if (poll(&p, 1, (int)timeout_ms) != 1) {
		snprintf(err, len, "no connection within %" PRIu64 " ms", timeout_ms);
		return -ETIMEDOUT;
	}
	fd = accept(j->lfd, NULL, NULL);
	return fd < 0 ? -errno : fd;
}

static void join_log(void *ctx, const char *line)
{
	struct joiner *j = ctx;

	ck_assert_msg(strstr(line, "does not join a session open here") &&
			      !strchr(line, '\n'),
		      "refused with '%s'", line);
	j->refused++;
}

struct connecting {
	struct joiner *j;
	struct mig_session_opts o;
	struct mig_session s;
	int ret;
	char err[256];
};

static void *connecting_run(void *p)
{
	struct connecting *c = p;
	unsigned int i;

	c->ret = mig_session_connect(unix_connect(c->j->path), &c->o, join_connect, c->j, &c->s, c->err,
				     sizeof(c->err));
	for (i = 0; c->ret == 0 && i < c->s.conns; i++) {
		struct iovec iov = { &i, sizeof(i) };

		ck_assert_ok(mig_chan_writev(c->s.chan[i], &iov, 1));
		ck_assert_ok(mig_chan_close_write(c->s.chan[i]));
	}
	return NULL;
}

/*
 * A session of three connections from c's source, taken at j's socket
 * with o: the destination's end in *s (its first fd in *fd), each
 * connection's record read, each connection ended by its last record.
 */
static void take_joined(struct joiner *j, struct connecting *c, const struct mig_session_opts *o,
			struct mig_session *s, int *fd)
{
	struct sockaddr_un un = { .sun_family = AF_UNIX };
	char err[256];
	pthread_t th;
	unsigned int i, v;

	snprintf(j->path, sizeof(j->path), "%s/sock", tmpdir);
	snprintf(un.sun_path, sizeof(un.sun_path), "%s", j->path);
	unlink(j->path);
	j->lfd = socket(AF_UNIX, SOCK_STREAM, 0);
	ck_assert_int_eq(bind(j->lfd, (struct sockaddr *)&un, sizeof(un)), 0);
	ck_assert_int_eq(listen(j->lfd, 8), 0);
	ck_assert_int_eq(pthread_create(&th, NULL, connecting_run, c), 0);
	*fd = accept(j->lfd, NULL, NULL);
	ck_assert_int_ge(*fd, 0);
	ck_assert_msg(mig_session_accept(*fd, o, join_accept, j, s, err, sizeof(err)) == 0, "%s", err);
	pthread_join(th, NULL);
	ck_assert_msg(c->ret == 0, "source: %s", c->err);
	ck_assert_uint_eq(s->conns, 3);
	/* each connection under keys of its own, each ending with its last record */
	for (i = 0; i < 3; i++) {
		ck_assert_int_eq(mig_chan_read(s->chan[i], &v, sizeof(v)), (int)sizeof(v));
		ck_assert_uint_eq(v, i);
		ck_assert_int_eq(mig_chan_read(s->chan[i], &v, sizeof(v)), 0);
	}
}

START_TEST(joins_bound_to_the_session)
{
	struct joiner j = { .intruders = 2 };
	struct connecting c = { .j = &j, .o = { .psk = &key_a, .encrypt = true, .conns = 3, .timeout_ms = 5000 } };
	struct mig_session_opts o = { .psk = &key_a, .timeout_ms = 5000, .log = join_log, .log_ctx = &j };
	struct mig_session s;
	int fd;

	take_joined(&j, &c, &o, &s, &fd);
	ck_assert_uint_eq(j.refused, 2);
	ck_assert_uint_eq(s.flags, MIG_S_PSK | MIG_S_ENCRYPT);
	mig_session_free(&c.s);
	mig_session_free(&s);
	close(fd);
	close(j.lfd);
	unlink(j.path);
}
END_TEST

/*
 * The joins come another way than the first connection (through a relay
 * whose source end has no address): the source names the destination once
 * for the session, from its first connection, and the destination answers
 * a join to the name its first connection matched, so they still join.
 * Named from each connection's own address, a join would mean 'unix:' at
 * a destination that is 'unix:PATH'.
 */
START_TEST(joins_come_another_way)
{
	struct joiner j = { .relayed = true };
	struct connecting c = { .j = &j, .o = { .psk = &key_a, .conns = 3, .timeout_ms = 5000 } };
	struct mig_session_opts o = { .psk = &key_a, .timeout_ms = 5000 };
	struct mig_session s;
	unsigned int i;
	int fd;

	take_joined(&j, &c, &o, &s, &fd);
	mig_session_free(&c.s);
	mig_session_free(&s);
	for (i = 0; i < j.ntaps; i++)
		pthread_join(j.tap_th[i], NULL);
	for (i = 0; i < j.ntaps; i += 2) {
		close(j.taps[i].from);
		close(j.taps[i].to);
	}
	close(fd);
	close(j.lfd);
	unlink(j.path);
}
END_TEST

/* ---- sealed records in flight ---- */

#define NREC 6

static const struct mig_chan_keys keys0 = { .send = { 1 }, .recv = { 2 }, .conn = 0 };

/* NREC sealed records (record i: 1000 + i bytes of 'a' + i) and the last one, as the wire carries them. */
static uint8_t *sealed(bool encrypt, uint32_t conn, size_t *ret_len, size_t off[NREC + 2])
{
	struct mig_chan_keys k = keys0;
	struct mig_chan *ch;
	struct mig_conn *c;
	uint8_t *buf = malloc(1 << 20), msg[2000];
	size_t len = 0, pos = 0;
	ssize_t n;
	int sv[2], i;

	k.encrypt = encrypt;
	k.conn = conn;
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	ck_assert_ok(mig_conn_new(sv[0], 5000, &c));
	ck_assert_ok(mig_chan_new(c, &k, &ch));
	for (i = 0; i < NREC; i++) {
		struct iovec iov = { msg, 1000 + (size_t)i };

		memset(msg, 'a' + i, sizeof(msg));
		ck_assert_ok(mig_chan_writev(ch, &iov, 1));
	}
	ck_assert_ok(mig_chan_close_write(ch));
	while ((n = read(sv[1], buf + len, (1 << 20) - len)) > 0)
		len += (size_t)n;
	mig_chan_free(ch);
	mig_conn_free(c);
	close(sv[0]);
	close(sv[1]);
	/* where each record starts, and the end */
	for (i = 0; i < NREC + 1; i++) {
		struct mig_seal h;

		off[i] = pos;
		memcpy(&h, buf + pos, sizeof(h));
		pos += sizeof(h) + h.len + MIG_SEAL_TAG;
	}
	off[NREC + 1] = pos;
	ck_assert_uint_eq(pos, len);
	*ret_len = len;
	return buf;
}

/*
 * Feed bytes to a reader on connection 0 with the receiving key; read
 * every record.  The result of the failing read (0 if none failed), its
 * reason, and the records read whole before it.
 */
static int feed(bool encrypt, const uint8_t *buf, size_t len, char *err, size_t elen, int *ret_whole)
{
	struct mig_chan_keys k = { .conn = 0, .encrypt = encrypt };
	struct mig_chan *ch;
	struct mig_conn *c;
	uint8_t msg[2000];
	int sv[2], i, ret = 0;

	memcpy(k.recv, keys0.send, sizeof(k.recv));
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	ck_assert_int_eq(write(sv[0], buf, len), (ssize_t)len);
	shutdown(sv[0], SHUT_WR);
	ck_assert_ok(mig_conn_new(sv[1], 5000, &c));
	ck_assert_ok(mig_chan_new(c, &k, &ch));
	*ret_whole = 0;
	for (i = 0; i < NREC; i++) {
		ret = mig_chan_read(ch, msg, 1000 + (size_t)i);
		if (ret != 1000 + i)
			break;
		/* what is handed on is what was sent, nothing of a bad record */
		ck_assert_msg(msg[0] == 'a' + i && msg[999 + i] == 'a' + i, "record %d handed on changed", i);
		++*ret_whole;
	}
	if (i == NREC)
		ret = mig_chan_read(ch, msg, 1); /* the end: 0 after the last record */
	if (ret < 0)
		mig_chan_strerror(ch, ret, err, elen);
	mig_chan_free(ch);
	mig_conn_free(c);
	close(sv[0]);
	close(sv[1]);
	return ret;
}

START_TEST(sealed_records_refused_in_flight)
{
	const bool encrypt = _i;
	size_t len, len1, off[NREC + 2], off1[NREC + 2];
	uint8_t *buf = sealed(encrypt, 0, &len, off), *other = sealed(encrypt, 1, &len1, off1);
	uint8_t *t = malloc(len + 65536);
	char err[256];
	size_t n, r2 = off[3] - off[2], r3 = off[4] - off[3];
	int whole, ret;

	/* as sent: every record, then the end */
	ck_assert_int_eq(feed(encrypt, buf, len, err, sizeof(err), &whole), 0);
	ck_assert_int_eq(whole, NREC);
	/* encrypted, the payload is not in clear; sealed only, it is */
	ck_assert_int_eq(buf[off[2] + sizeof(struct mig_seal) + 10] == 'a' + 2, !encrypt);

#define EXPECT_REFUSED(what, want_ret, want_whole, says)                                                         \
	do {                                                                                                     \
		ret = feed(encrypt, t, n, err, sizeof(err), &whole);                                             \
		ck_assert_msg(ret == (want_ret) && whole == (want_whole) && strstr(err, says) &&                 \
				      !strchr(err, '\n'),                                                        \
			      "%s (encrypt %d): %d after %d records, '%s'; expected %d after %d saying '%s'", what, \
			      encrypt, ret, whole, err, want_ret, want_whole, says);                             \
	} while (0)

	/* a byte flipped in record 2's payload, its tag, or its header */
	static const size_t flips[] = { sizeof(struct mig_seal) + 500, 0 /* tag */, 5 /* flags */, 8 /* reserved */ };
	for (unsigned int f = 0; f < sizeof(flips) / sizeof(flips[0]); f++) {
		memcpy(t, buf, len);
		n = len;
		t[flips[f] ? off[2] + flips[f] : off[3] - 1] ^= 0x04;
		EXPECT_REFUSED("flipped byte", -EACCES, 2,
			       "authentication: sealed record 2 on connection 0 failed its check");
	}
	/* record 2 dropped */
	memcpy(t, buf, off[2]);
	memcpy(t + off[2], buf + off[3], len - off[3]);
	n = len - r2;
	EXPECT_REFUSED("dropped record", -EACCES, 2, "sealed record 2 on connection 0 failed its check");
	/* records 2 and 3 swapped */
	memcpy(t, buf, off[2]);
	memcpy(t + off[2], buf + off[3], r3);
	memcpy(t + off[2] + r3, buf + off[2], r2);
	memcpy(t + off[4], buf + off[4], len - off[4]);
	n = len;
	EXPECT_REFUSED("reordered records", -EACCES, 2, "sealed record 2 on connection 0 failed its check");
	/* record 1 played again in place of record 2 */
	memcpy(t, buf, off[2]);
	memcpy(t + off[2], buf + off[1], off[2] - off[1]);
	memcpy(t + off[2] + (off[2] - off[1]), buf + off[3], len - off[3]);
	n = len - r2 + (off[2] - off[1]);
	EXPECT_REFUSED("replayed record", -EACCES, 2, "sealed record 2 on connection 0 failed its check");
	/* record 2 of connection 1 (same keys here, another nonce) in place of connection 0's */
	memcpy(t, buf, off[2]);
	memcpy(t + off[2], other + off1[2], off1[3] - off1[2]);
	memcpy(t + off[3], buf + off[3], len - off[3]);
	n = len;
	EXPECT_REFUSED("record of another connection", -EACCES, 2, "sealed record 2 on connection 0 failed its check");
	/* a length no record has */
	memcpy(t, buf, len);
	n = len;
	{
		uint32_t big = MIG_SEAL_MAX + 1;

		memcpy(t + off[2], &big, sizeof(big));
	}
	EXPECT_REFUSED("bad length", -EACCES, 2, "sealed record 2 on connection 0 claims");
	/* the tail cut: the last record (and the one before) never arrive */
	memcpy(t, buf, off[NREC - 1]);
	n = off[NREC - 1];
	EXPECT_REFUSED("tail cut", -EPIPE, NREC - 1, "connection 0 ended after 5 sealed records without its last one");
	memcpy(t, buf, off[NREC]);
	n = off[NREC];
	EXPECT_REFUSED("last record cut", -EPIPE, NREC, "without its last one");
	/* cut inside a record */
	n = off[3] + 20;
	EXPECT_REFUSED("record cut", -EPIPE, 3, "records cut off in flight");
#undef EXPECT_REFUSED
	free(t);
	free(buf);
	free(other);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("session");
	TCase *tc = tcase_create("session");
	int ret;

	snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvmdirty-session-XXXXXX");
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	tcase_add_checked_fixture(tc, load_keys, NULL);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, handshake_proves_the_key);
	tcase_add_test(tc, plain_stream_refused_with_a_key);
	tcase_add_test(tc, replayed_session_refused);
	tcase_add_test(tc, fake_destination_gets_nothing);
	tcase_add_test(tc, trickling_destination_bounded);
	tcase_add_test(tc, names_bind_the_destination);
	tcase_add_test(tc, long_addresses_kept_apart);
	tcase_add_test(tc, version_1_refused);
	tcase_add_test(tc, recording_and_key_open_nothing);
	tcase_add_test(tc, joins_bound_to_the_session);
	tcase_add_test(tc, joins_come_another_way);
	tcase_add_loop_test(tc, sealed_records_refused_in_flight, 0, 2);
	suite_add_tcase(s, tc);
	ret = run_suite(s);
	{
		char cmd[128];

		snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
		if (system(cmd))
			ret = 1;
	}
	return ret;
}
