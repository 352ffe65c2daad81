// SPDX-License-Identifier: MIT
/*
 * The sealed channel's ends and keys (lib/migrate/net/channel.c), with
 * no KVM, over socket pairs and streams in memory, under keys made up
 * here:
 *   - every direction ends with its last record (MIG_SEAL_LAST), and
 *     nothing may follow it: a further record, even one sealed right
 *     under the direction's key, or any byte, is refused at the read that
 *     would take it; a connection that ends without its last record is
 *     refused as cut;
 *   - keys change every few records or bytes (the limits lowered for the
 *     test): a hundred records of random sizes each way come through
 *     whole, and the wire shows the changes (a reader that keeps its key
 *     fails at the first record under the next one); a record moved,
 *     dropped or replayed across a change of key is refused; bytes count
 *     toward the limit, not only records; the keys and nonces are the ones
 *     channel.h documents, as computed apart from the engine;
 *   - a byte flipped anywhere in a record (every byte of a short stream's
 *     records, over a socket and from memory; a 256 KiB record's header,
 *     tag and every 509th payload byte): the record refused and none of
 *     its bytes in the reader's buffer; through the destination's decoder,
 *     none of the page bytes it or a later record carried in guest memory;
 *   - records trickled a few bytes at a time come through whole (the
 *     receiver reads as many records as the socket holds, up to 256 KiB);
 *     a sender cuts its records at MIG_SEAL_RECORD;
 *   - the destination (mig_recv()) ends each of its directions with its
 *     last record, and answers a stream it refuses for its deadline.
 */
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>

#include <openssl/evp.h>

#include "channel.h"
#include "dest.h"
#include "errf.h"
#include "handoff.h"
#include "migrate-util.h"
#include "rng.h"
#include "session.h"
#include "test-util.h"

#define CONN 7	      /* the connection index in the nonce: any */
#define T_MS 5000     /* each wait for the peer */
#define FEW_RECORDS 5 /* the lowered limits */
#define FEW_BYTES 4096

static const struct mig_chan_keys keys_a = { .send = { 0xa0, 1 }, .recv = { 0xb0, 2 }, .conn = CONN };

/* The other end's keys: a's, the directions swapped. */
static struct mig_chan_keys keys_of(bool b, bool encrypt)
{
	struct mig_chan_keys k = keys_a;

	if (b) {
		memcpy(k.send, keys_a.recv, sizeof(k.send));
		memcpy(k.recv, keys_a.send, sizeof(k.recv));
	}
	k.encrypt = encrypt;
	return k;
}

/* One end of a connection: its socket, transport and channel. */
struct end {
	int fd;
	struct mig_conn *c;
	struct mig_chan *ch;
};

static void end_open(struct end *e, int fd, bool b, bool encrypt, uint64_t records, uint64_t bytes)
{
	struct mig_chan_keys k = keys_of(b, encrypt);

	e->fd = fd;
	ck_assert_ok(mig_conn_new(fd, T_MS, &e->c));
	ck_assert_ok(mig_chan_new(e->c, &k, &e->ch));
	mig_chan_set_rekey_limit_for_tests(e->ch, records, bytes);
}

static void end_close(struct end *e)
{
	mig_chan_free(e->ch);
	mig_conn_free(e->c);
	close(e->fd);
}

/* Record i's payload: n bytes of its own. */
static void fill(uint8_t *buf, size_t n, unsigned int i)
{
	uint64_t x = 0x9e3779b97f4a7c15ull * (i + 1);
	size_t k;

	for (k = 0; k < n; k++)
		buf[k] = (uint8_t)(xorshift64(&x) >> 32);
}

static int send_rec(struct mig_chan *ch, unsigned int i, size_t n)
{
	uint8_t buf[MIG_SEAL_MAX / 8];
	struct iovec iov = { buf, n };

	ck_assert_uint_le(n, sizeof(buf));
	fill(buf, n, i);
	return mig_chan_writev(ch, &iov, 1);
}

/* Read record i (n bytes) whole and check it: 1, or the read's result where it is not all of it. */
static int recv_rec(struct mig_chan *ch, unsigned int i, size_t n)
{
	uint8_t got[MIG_SEAL_MAX / 8], want[MIG_SEAL_MAX / 8];
	int ret = mig_chan_read(ch, got, n);

	if (ret != (int)n)
		return ret < 0 ? ret : -ENODATA;
	fill(want, n, i);
	expect(!memcmp(got, want, n), "record %u: not what was sent", i);
	return 1;
}

static void write_exact(int fd, const void *buf, size_t n)
{
	ck_assert_int_eq(write(fd, buf, n), (ssize_t)n);
}

/* ---- the wire of one direction, sealed by the channel ---- */

struct wire {
	uint8_t *buf;
	size_t len;
	size_t off[256]; /* where record i starts; off[n] the end */
	unsigned int n;	 /* records, the last one included */
};

/* Where each record of w starts, from its headers. */
static void wire_index(struct wire *w)
{
	size_t pos = 0;

	w->n = 0;
	while (pos < w->len) {
		struct mig_seal h;

		ck_assert_uint_lt(w->n, 255);
		ck_assert_uint_le(pos + sizeof(h), w->len);
		memcpy(&h, w->buf + pos, sizeof(h));
		w->off[w->n++] = pos;
		pos += sizeof(h) + h.len + MIG_SEAL_TAG;
	}
	ck_assert_uint_eq(pos, w->len);
	w->off[w->n] = pos;
}

/* Records of sizes[0..n), sealed as a sender with these limits seals them, then (last) its last record. */
static void wire_seal(struct wire *w, bool encrypt, uint64_t records, uint64_t bytes, const size_t *sizes,
		      unsigned int n, bool last)
{
	struct fake_drain d = { 0 };
	struct end e;
	pthread_t th;
	unsigned int i;
	int sv[2];

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	d.fd = sv[1];
	ck_assert_int_eq(pthread_create(&th, NULL, fake_drain_run, &d), 0);
	end_open(&e, sv[0], false, encrypt, records, bytes);
	for (i = 0; i < n; i++)
		ck_assert_ok(send_rec(e.ch, i, sizes[i]));
	if (last)
		ck_assert_ok(mig_chan_close_write(e.ch));
	shutdown(sv[0], SHUT_WR);
	pthread_join(th, NULL);
	end_close(&e);
	close(sv[1]);
	w->buf = d.buf;
	w->len = d.len;
	wire_index(w);
	ck_assert_uint_eq(w->n, n + last);
}

/* w with record i's bytes replaced by record j's (or dropped: j < 0), and after it extra. */
static struct wire wire_edit(const struct wire *w, unsigned int i, int j, const void *extra, size_t elen)
{
	struct wire t = { .buf = malloc(w->len * 2 + elen + 1) };
	unsigned int k;

	for (k = 0; k < w->n; k++) {
		int from = k == i ? j : (int)k;

		if (from < 0)
			continue;
		memcpy(t.buf + t.len, w->buf + w->off[from], w->off[from + 1] - w->off[from]);
		t.len += w->off[from + 1] - w->off[from];
	}
	if (elen)
		memcpy(t.buf + t.len, extra, elen);
	t.len += elen;
	return t;
}

/*
 * Read w's records (sizes[0..n)) as end b (else a) with these limits, over a
 * socket (its end closed after w) or from memory; then one read past them.
 * The first result that is not a whole record (0 where the end came
 * clean after them), its reason, and the records read whole before it.
 */
static int wire_open(const struct wire *w, bool b, bool socket, bool encrypt, uint64_t records, uint64_t bytes,
		     const size_t *sizes, unsigned int n, char *err, size_t elen, unsigned int *ret_whole)
{
	struct mem_stream m = { .buf = w->buf, .len = w->len };
	struct mig_reader rd = { .read = mem_read, .describe = mem_describe, .ctx = &m };
	struct mig_chan_keys k = keys_of(b, encrypt);
	struct mig_chan *ch;
	struct end e = { .fd = -1 };
	uint8_t past[16];
	int sv[2], ret = 1;

	if (socket) {
		ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
		ck_assert_int_ge(fcntl(sv[0], F_SETFL, O_NONBLOCK), 0);
		ck_assert_int_eq(write(sv[0], w->buf, w->len), (ssize_t)w->len);
		shutdown(sv[0], SHUT_WR);
		end_open(&e, sv[1], b, encrypt, records, bytes);
		ch = e.ch;
	} else {
		ck_assert_ok(mig_chan_new_reader(&rd, &k, &ch));
		mig_chan_set_rekey_limit_for_tests(ch, records, bytes);
	}
	err[0] = 0;
	for (*ret_whole = 0; *ret_whole < n && (ret = recv_rec(ch, *ret_whole, sizes[*ret_whole])) == 1;)
		++*ret_whole;
	if (ret == 1)
		ret = mig_chan_read(ch, past, sizeof(past));
	if (ret < 0)
		mig_chan_strerror(ch, ret, err, elen);
	if (socket) {
		end_close(&e);
		close(sv[0]);
	} else {
		mig_chan_free(ch);
	}
	return ret;
}

#define EXPECT_OPEN_BY(b, w, socket, records, bytes, sizes, n, want_ret, want_whole, says)                       \
	do {                                                                                                    \
		char __err[256];                                                                                \
		unsigned int __whole;                                                                           \
		int __ret = wire_open(w, b, socket, encrypt, records, bytes, sizes, n, __err, sizeof(__err),    \
				      &__whole);                                                                \
		ck_assert_msg(__ret == (want_ret) && __whole == (want_whole) && strstr(__err, says),             \
			      "%s:%d: %d after %u records ('%s'), expected %d after %u saying '%s'", __FILE__,   \
			      __LINE__, __ret, __whole, __err, (int)(want_ret), (unsigned int)(want_whole), says); \
	} while (0)
/* a's records, read by b */
#define EXPECT_OPEN(...) EXPECT_OPEN_BY(true, __VA_ARGS__)

/* ---- the ends of a sealed stream ---- */

START_TEST(last_ends_both_directions)
{
	const bool encrypt = _i;
	static const char hello_a[] = "from a, the whole of it", hello_b[] = "from b";
	struct end a, b;
	char buf[64];
	int sv[2], r;
	struct iovec iov;

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	end_open(&a, sv[0], false, encrypt, 0, 0);
	end_open(&b, sv[1], true, encrypt, 0, 0);
	iov = (struct iovec){ (void *)hello_a, sizeof(hello_a) };
	ck_assert_ok(mig_chan_writev(a.ch, &iov, 1));
	ck_assert_ok(mig_chan_close_write(a.ch));
	/* once is enough: a second close sends nothing, and nothing is sent after the last record */
	ck_assert_ok(mig_chan_close_write(a.ch));
	iov = (struct iovec){ (void *)hello_a, sizeof(hello_a) };
	ck_assert_errno(mig_chan_writev(a.ch, &iov, 1), EPIPE);
	iov = (struct iovec){ (void *)hello_b, sizeof(hello_b) };
	ck_assert_ok(mig_chan_writev(b.ch, &iov, 1));
	ck_assert_ok(mig_chan_close_write(b.ch));
	/* each end reads the other's bytes, fewer than asked where the last record came, then the end */
	r = mig_chan_read(b.ch, buf, sizeof(buf));
	ck_assert_int_eq(r, (int)sizeof(hello_a));
	ck_assert_str_eq(buf, hello_a);
	ck_assert_int_eq(mig_chan_read(b.ch, buf, sizeof(buf)), 0);
	ck_assert_int_eq(mig_chan_read(b.ch, buf, 1), 0);
	ck_assert_int_eq(mig_chan_read(a.ch, buf, 3), 3);
	ck_assert_int_eq(mig_chan_read(a.ch, buf + 3, sizeof(buf)), (int)sizeof(hello_b) - 3);
	ck_assert_str_eq(buf, hello_b);
	ck_assert_int_eq(mig_chan_read(a.ch, buf, sizeof(buf)), 0);
	ck_assert(!mig_chan_torn(a.ch) && !mig_chan_torn(b.ch));
	end_close(&a);
	end_close(&b);
}
END_TEST

static const size_t three[] = { 100, 2000, 7 };

START_TEST(record_after_last_refused)
{
	const bool encrypt = _i;
	static const size_t five[] = { 100, 2000, 7, 30, 40 };
	struct wire ended, longer, t;
	unsigned int s;

	/* the direction as its sender ends it: three records and the last */
	wire_seal(&ended, encrypt, 0, 0, three, 3, true);
	/* the same sender, had it gone on: its record 4 is sealed right for the place after the last record */
	wire_seal(&longer, encrypt, 0, 0, five, 5, false);
	for (s = 0; s < 2; s++) {
		EXPECT_OPEN(&ended, s, 0, 0, three, 3, 0, 3, "");
		EXPECT_OPEN(&longer, s, 0, 0, five, 5, -EPIPE, 5, "without its last one");
		/* that record after the last one: its tag holds, and it is refused all the same */
		t = wire_edit(&ended, 99, 0, longer.buf + longer.off[4], longer.off[5] - longer.off[4]);
		EXPECT_OPEN(&t, s, 0, 0, three, 3, -EPROTO, 3, "bytes after the last record on connection 7");
		free(t.buf);
		/* the last record twice */
		t = wire_edit(&ended, 99, 0, ended.buf + ended.off[3], ended.off[4] - ended.off[3]);
		EXPECT_OPEN(&t, s, 0, 0, three, 3, -EPROTO, 3, "(sealed record 3 ended it)");
		free(t.buf);
	}
	free(ended.buf);
	free(longer.buf);
}
END_TEST

START_TEST(trailing_bytes_after_last_refused)
{
	const bool encrypt = _i;
	static const uint8_t zeros[64];
	static const size_t sizes[] = { 1, 16, 64 };
	static const size_t asked[] = { 7, 8, 100 }; /* the last record's bytes, exactly and more */
	struct wire ended, t;
	unsigned int s, k;
	struct end e;
	uint8_t buf[128];
	int sv[2];

	wire_seal(&ended, encrypt, 0, 0, three, 3, true);
	for (s = 0; s < 2; s++) {
		for (k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
			t = wire_edit(&ended, 99, 0, zeros, sizes[k]);
			EXPECT_OPEN(&t, s, 0, 0, three, 3, -EPROTO, 3, "bytes after the last record");
			free(t.buf);
		}
	}
	/*
	 * Refused at the read that would take them, and not before: a read of
	 * what the records hold takes it whole; one that asks for more fails.
	 */
	for (k = 0; k < sizeof(asked) / sizeof(asked[0]); k++) {
		t = wire_edit(&ended, 99, 0, "x", 1);
		ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
		write_exact(sv[0], t.buf, t.len);
		shutdown(sv[0], SHUT_WR);
		end_open(&e, sv[1], true, encrypt, 0, 0);
		ck_assert_int_eq(recv_rec(e.ch, 0, three[0]), 1);
		ck_assert_int_eq(recv_rec(e.ch, 1, three[1]), 1);
		ck_assert_int_eq(mig_chan_read(e.ch, buf, asked[k]), asked[k] == 7 ? 7 : -EPROTO);
		ck_assert_int_eq(mig_chan_read(e.ch, buf, 1), -EPROTO);
		ck_assert(!mig_chan_torn(e.ch));
		end_close(&e);
		close(sv[0]);
		free(t.buf);
	}
	free(ended.buf);
}
END_TEST

START_TEST(cut_without_last_refused)
{
	const bool encrypt = _i;
	struct wire ended, t;
	unsigned int s;

	wire_seal(&ended, encrypt, 0, 0, three, 3, true);
	for (s = 0; s < 2; s++) {
		/* the last record dropped, or part of it */
		t = wire_edit(&ended, 3, -1, NULL, 0);
		EXPECT_OPEN(&t, s, 0, 0, three, 3, -EPIPE, 3, "ended after 3 sealed records without its last one");
		t.len += 20;
		memcpy(t.buf + ended.off[3], ended.buf + ended.off[3], 20);
		EXPECT_OPEN(&t, s, 0, 0, three, 3, -EPIPE, 3, "without its last one");
		free(t.buf);
		/* and record 2 with it */
		t = wire_edit(&ended, 3, -1, NULL, 0);
		t.len = ended.off[2];
		EXPECT_OPEN(&t, s, 0, 0, three, 3, -EPIPE, 2, "ended after 2 sealed records");
		free(t.buf);
	}
	free(ended.buf);
}
END_TEST

/* ---- keys that change ---- */

#define NREC 100

/* Random sizes: some below a tenth of FEW_BYTES, some above it whole; each fits a socket's buffer. */
static void random_sizes(size_t *sizes, unsigned int n, uint64_t seed)
{
	unsigned int i;

	for (i = 0; i < n; i++) {
		uint64_t r = xorshift64(&seed);

		sizes[i] = r % 4 ? 1 + (r >> 8) % (FEW_BYTES / 8) : 1 + (r >> 8) % (3 * FEW_BYTES);
	}
}

/* Move one record (header, then the rest) from fd to to, and keep its bytes in w. */
static void relay_record(int from, int to, struct wire *w)
{
	struct mig_seal h;

	ck_assert_int_eq(recv(from, &h, sizeof(h), MSG_WAITALL), (ssize_t)sizeof(h));
	w->buf = realloc(w->buf, w->len + sizeof(h) + h.len + MIG_SEAL_TAG);
	memcpy(w->buf + w->len, &h, sizeof(h));
	ck_assert_int_eq(recv(from, w->buf + w->len + sizeof(h), h.len + MIG_SEAL_TAG, MSG_WAITALL),
			 (ssize_t)(h.len + MIG_SEAL_TAG));
	write_exact(to, w->buf + w->len, sizeof(h) + h.len + MIG_SEAL_TAG);
	w->len += sizeof(h) + h.len + MIG_SEAL_TAG;
}

/* The last record, then the end of the connection. */
static void relay_end(int from, int to, struct wire *w)
{
	uint8_t x;

	relay_record(from, to, w);
	ck_assert_int_eq(read(from, &x, 1), 0);
	shutdown(to, SHUT_WR);
}

START_TEST(rekey_many_records_both_ways)
{
	const bool encrypt = _i;
	size_t sz_ab[NREC], sz_ba[NREC];
	struct wire ab = { 0 }, ba = { 0 };
	struct end a, b;
	int p[2], q[2];
	unsigned int i;
	uint8_t x;

	random_sizes(sz_ab, NREC, 0x1234567 + encrypt);
	random_sizes(sz_ba, NREC, 0x7654321 + encrypt);
	/* a on p[0], b on q[1]; between them the test, which keeps each direction's wire */
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, p), 0);
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, q), 0);
	end_open(&a, p[0], false, encrypt, FEW_RECORDS, FEW_BYTES);
	end_open(&b, q[1], true, encrypt, FEW_RECORDS, FEW_BYTES);
	for (i = 0; i < NREC; i++) {
		ck_assert_ok(send_rec(a.ch, i, sz_ab[i]));
		relay_record(p[1], q[0], &ab);
		ck_assert_int_eq(recv_rec(b.ch, i, sz_ab[i]), 1);
		ck_assert_ok(send_rec(b.ch, i, sz_ba[i]));
		relay_record(q[0], p[1], &ba);
		ck_assert_int_eq(recv_rec(a.ch, i, sz_ba[i]), 1);
	}
	ck_assert_ok(mig_chan_close_write(a.ch));
	relay_end(p[1], q[0], &ab);
	ck_assert_ok(mig_chan_close_write(b.ch));
	relay_end(q[0], p[1], &ba);
	ck_assert_int_eq(mig_chan_read(b.ch, &x, 1), 0);
	ck_assert_int_eq(mig_chan_read(a.ch, &x, 1), 0);
	end_close(&a);
	end_close(&b);
	close(p[1]);
	close(q[0]);
	/*
	 * The wires: what the ends read; and under keys that changed on the
	 * way, the first change at record 5 or before (the byte limit).  A
	 * reader that keeps its first key fails there, and at nothing before.
	 */
	wire_index(&ab);
	wire_index(&ba);
	ck_assert_uint_eq(ab.n, NREC + 1);
	ck_assert_uint_eq(ba.n, NREC + 1);
	for (i = 0; i < 2; i++) {
		const struct wire *w = i ? &ba : &ab;
		const size_t *sizes = i ? sz_ba : sz_ab;
		unsigned int first = 1;
		uint64_t bytes = sizes[0];

		while (first < FEW_RECORDS && bytes + sizes[first] <= FEW_BYTES)
			bytes += sizes[first++];
		EXPECT_OPEN_BY(!i, w, false, FEW_RECORDS, FEW_BYTES, sizes, NREC, 0, NREC, "");
		EXPECT_OPEN_BY(!i, w, false, 0, 0, sizes, NREC, -EACCES, first, "failed its check");
	}
	free(ab.buf);
	free(ba.buf);
}
END_TEST

START_TEST(moved_across_rekey_refused)
{
	const bool encrypt = _i;
	static const size_t sizes[] = { 100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100 };
	const unsigned int n = sizeof(sizes) / sizeof(sizes[0]);
	/* records 0..4 under the first key, 5..9 under the second, 10 and 11 under the third */
	static const struct {
		unsigned int at;
		int from;
		unsigned int whole;
	} moves[] = {
		{ 4, 5, 4 },  /* the first record under the second key where the last under the first was */
		{ 5, 4, 5 },  /* ... and the other way round: 4 twice */
		{ 5, 0, 5 },  /* the first under the first key, in the place of the first under the second */
		{ 5, -1, 5 }, /* the first under the second key dropped */
		{ 10, 5, 10 }, /* the first under the second key, replayed as the first under the third */
		{ 9, 10, 9 },  /* the first under the third key, early */
	};
	struct wire w, t;
	unsigned int k;

	wire_seal(&w, encrypt, FEW_RECORDS, 1 << 20, sizes, n, true);
	EXPECT_OPEN(&w, false, FEW_RECORDS, 1 << 20, sizes, n, 0, n, "");
	for (k = 0; k < sizeof(moves) / sizeof(moves[0]); k++) {
		t = wire_edit(&w, moves[k].at, moves[k].from, NULL, 0);
		EXPECT_OPEN(&t, false, FEW_RECORDS, 1 << 20, sizes, n, -EACCES, moves[k].whole, "failed its check");
		free(t.buf);
	}
	free(w.buf);
}
END_TEST

START_TEST(receiver_that_keeps_its_key_fails)
{
	const bool encrypt = _i;
	static const size_t sizes[] = { 10, 20, 30, 40, 50, 60, 70, 80 };
	const unsigned int n = sizeof(sizes) / sizeof(sizes[0]);
	struct wire changed, kept;

	/* the sender changes keys after 5 records, the receiver does not: the record after them fails */
	wire_seal(&changed, encrypt, FEW_RECORDS, 0, sizes, n, true);
	EXPECT_OPEN(&changed, true, 0, 0, sizes, n, -EACCES, FEW_RECORDS, "sealed record 5 on connection 7 failed");
	EXPECT_OPEN(&changed, true, FEW_RECORDS, 0, sizes, n, 0, n, "");
	/* the other way round: the receiver changes keys, the sender does not; the receiver's reason says where */
	wire_seal(&kept, encrypt, 0, 0, sizes, n, true);
	EXPECT_OPEN(&kept, true, FEW_RECORDS, 0, sizes, n, -EACCES, FEW_RECORDS,
		    "sealed record 5 on connection 7 (the first under key 1) failed");
	free(changed.buf);
	free(kept.buf);
}
END_TEST

START_TEST(bytes_count_toward_the_limit)
{
	const bool encrypt = _i;
	static const size_t exact[] = { 1024, 1024, 1024, 1024, 1024, 1024 };
	static const size_t over[] = { 1000, 1000, 1000, 1000, 1000, 1000 };
	static const size_t big[] = { 5000, 10, 6000 };
	struct wire w;

	/* the limit reached exactly by four records: the fifth under a new key */
	wire_seal(&w, encrypt, 0, FEW_BYTES, exact, 6, true);
	EXPECT_OPEN(&w, false, 0, FEW_BYTES, exact, 6, 0, 6, "");
	EXPECT_OPEN(&w, false, 0, 0, exact, 6, -EACCES, 4, "failed its check");
	/* ... and not before: a limit one byte lower has the fourth under a new key */
	EXPECT_OPEN(&w, false, 0, FEW_BYTES - 1, exact, 6, -EACCES, 3, "failed its check");
	free(w.buf);
	/* the fifth would take it past the limit: it goes under the next key */
	wire_seal(&w, encrypt, 0, FEW_BYTES, over, 6, true);
	EXPECT_OPEN(&w, false, 0, FEW_BYTES, over, 6, 0, 6, "");
	EXPECT_OPEN(&w, false, 0, 0, over, 6, -EACCES, 4, "failed its check");
	free(w.buf);
	/* a record larger than the limit goes alone under a key of its own */
	wire_seal(&w, encrypt, 0, FEW_BYTES, big, 3, true);
	EXPECT_OPEN(&w, false, 0, FEW_BYTES, big, 3, 0, 3, "");
	EXPECT_OPEN(&w, false, 0, 0, big, 3, -EACCES, 1, "failed its check");
	free(w.buf);
}
END_TEST

/*
 * Keys as channel.h says, so that another implementation can follow: the
 * key after the first change, and after the second, computed apart from
 * the engine (python3: hmac.new(key, b"kvmdirty-migrate rekey\x01",
 * hashlib.sha256), from a's sending key), open records 1 and 2 of a
 * direction that changes keys after each record, under the sequence
 * numbers 1 and 2: they go on counting across keys.
 */
static const uint8_t key1[MIG_SEAL_KEY] = {
	0x73, 0x75, 0xc4, 0x29, 0xfd, 0xb5, 0x72, 0x1b, 0xd7, 0xd7, 0xd1, 0x3a, 0xde, 0x4f, 0xf5, 0xca,
	0xee, 0x7b, 0x47, 0x02, 0x21, 0xf7, 0xb4, 0x0e, 0xb3, 0x8c, 0xb3, 0x2b, 0xff, 0x4f, 0x6b, 0x8e,
};
static const uint8_t key2[MIG_SEAL_KEY] = {
	0x61, 0x63, 0x40, 0x6e, 0x08, 0xb7, 0x00, 0x81, 0xd0, 0x4e, 0xa8, 0x7c, 0x9d, 0x51, 0xa9, 0x38,
	0x43, 0xe1, 0xd7, 0xb1, 0xfa, 0x11, 0x3f, 0x93, 0x5a, 0xf9, 0x7d, 0xfb, 0x87, 0x4f, 0xb9, 0x6d,
};

/* Open record i of w (encrypted) with key under sequence number seq, by libcrypto alone: whether its tag holds. */
static bool open_alone(const struct wire *w, unsigned int i, const uint8_t *key, uint64_t seq, uint8_t *out)
{
	const uint8_t *rec = w->buf + w->off[i];
	size_t len = w->off[i + 1] - w->off[i] - sizeof(struct mig_seal) - MIG_SEAL_TAG;
	uint32_t conn = CONN;
	uint8_t iv[12], tag[MIG_SEAL_TAG];
	EVP_CIPHER_CTX *c = EVP_CIPHER_CTX_new();
	int n;
	bool ok;

	memcpy(iv, &conn, 4);
	memcpy(iv + 4, &seq, 8);
	memcpy(tag, rec + sizeof(struct mig_seal) + len, sizeof(tag));
	ok = c && EVP_DecryptInit_ex(c, EVP_aes_256_gcm(), NULL, key, iv) == 1 &&
	     EVP_DecryptUpdate(c, NULL, &n, rec, sizeof(struct mig_seal)) == 1 &&
	     EVP_DecryptUpdate(c, out, &n, rec + sizeof(struct mig_seal), (int)len) == 1 &&
	     EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, sizeof(tag), tag) == 1 &&
	     EVP_DecryptFinal_ex(c, out + len, &n) == 1;
	EVP_CIPHER_CTX_free(c);
	return ok;
}

START_TEST(keys_as_documented)
{
	const bool encrypt = true;
	static const size_t sizes[] = { 10, 20, 30 };
	uint8_t got[64], want[64];
	struct wire w;

	wire_seal(&w, encrypt, 1, 0, sizes, 3, true);
	EXPECT_OPEN(&w, false, 1, 0, sizes, 3, 0, 3, "");
	ck_assert(open_alone(&w, 0, keys_a.send, 0, got));
	ck_assert(open_alone(&w, 1, key1, 1, got));
	fill(want, sizes[1], 1);
	ck_assert_mem_eq(got, want, sizes[1]);
	ck_assert(open_alone(&w, 2, key2, 2, got));
	fill(want, sizes[2], 2);
	ck_assert_mem_eq(got, want, sizes[2]);
	/* and under nothing else: not the key before, not a sequence number started again */
	ck_assert(!open_alone(&w, 1, keys_a.send, 1, got));
	ck_assert(!open_alone(&w, 1, key1, 0, got));
	ck_assert(!open_alone(&w, 2, key2, 0, got));
	free(w.buf);
}
END_TEST

/* ---- a flipped byte anywhere in a record ---- */

#define SENTINEL 0xee

/*
 * w with byte pos of record r flipped (xor mask), read by b over a socket
 * or from memory: the records before r whole; then record r's read
 * refused (a negative result, whatever the reason: its tag, its length,
 * a cut), every byte of the reader's buffer as it was, and the read after
 * it refused too.
 */
static void flip_refused(const struct wire *w, unsigned int r, size_t pos, uint8_t mask, bool socket, bool encrypt,
			 const size_t *sizes, unsigned int nsizes)
{
	struct wire t = wire_edit(w, UINT_MAX, 0, NULL, 0);
	struct mem_stream m = { .buf = t.buf, .len = t.len };
	struct mig_reader rd = { .read = mem_read, .describe = mem_describe, .ctx = &m };
	struct mig_chan_keys k = keys_of(true, encrypt);
	uint8_t got[MIG_SEAL_MAX / 8];
	struct end e = { .fd = -1 };
	struct mig_chan *ch;
	unsigned int i;
	int sv[2], ret;
	size_t n;

	t.buf[w->off[r] + pos] ^= mask;
	if (socket) {
		ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
		ck_assert_int_eq(write(sv[0], t.buf, t.len), (ssize_t)t.len);
		shutdown(sv[0], SHUT_WR);
		end_open(&e, sv[1], true, encrypt, 0, 0);
		ch = e.ch;
	} else {
		ck_assert_ok(mig_chan_new_reader(&rd, &k, &ch));
	}
	for (i = 0; i < r; i++)
		ck_assert_int_eq(recv_rec(ch, i, sizes[i]), 1);
	n = r < nsizes ? sizes[r] : 1; /* the last record: a read past the ones before */
	memset(got, SENTINEL, sizeof(got));
	ret = mig_chan_read(ch, got, n);
	ck_assert_msg(ret < 0, "record %u, byte %zu ^ 0x%02x (%s): read gave %d, not a refusal", r, pos, mask,
		      socket ? "socket" : "memory", ret);
	/* one assertion a read: Check marks each one it passes */
	for (i = 0; i < sizeof(got) && got[i] == SENTINEL; i++)
		;
	ck_assert_msg(i == sizeof(got), "record %u, byte %zu ^ 0x%02x: byte %u of the refused record handed on", r, pos,
		      mask, i);
	ck_assert_int_lt(mig_chan_read(ch, got, 1), 0);
	if (socket) {
		end_close(&e);
		close(sv[0]);
	} else {
		mig_chan_free(ch);
	}
	free(t.buf);
}

/*
 * Every byte of a record (header, payload, tag) flipped, one at a time,
 * in a record between two others, in the first and in the last one: the
 * record refused and none of its bytes handed on, over a socket (where
 * the channel reads several records at once) and from
 * memory.
 */
START_TEST(flipped_byte_anywhere_refused)
{
	const bool encrypt = _i;
	static const size_t sizes[] = { 100, 1500, 7 };
	static const uint8_t masks[] = { 0xff, 0x01, 0x80 };
	struct wire w;
	unsigned int r, m;
	size_t pos;

	wire_seal(&w, encrypt, 0, 0, sizes, 3, true);
	/* from memory each of three flips of every byte; over a socket (a transport each: slower) one */
	for (r = 0; r < w.n; r++)
		for (pos = 0; pos < w.off[r + 1] - w.off[r]; pos++)
			for (m = 0; m < sizeof(masks); m++)
				flip_refused(&w, r, pos, masks[m], m == 0, encrypt, sizes, 3);
	free(w.buf);
}
END_TEST

/*
 * buf sealed under k as a sender seals it, a writev each chunk bytes, in
 * records of up to record bytes (0: the sender's own size), then the last
 * record: the wire.
 */
static struct wire seal_chunks(const struct mig_chan_keys *k, const uint8_t *buf, size_t len, size_t chunk,
			       uint32_t record)
{
	struct fake_drain d = { 0 };
	struct wire w;
	struct end a = { .fd = -1 };
	pthread_t th;
	size_t pos;
	int sv[2];

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	d.fd = sv[1];
	ck_assert_int_eq(pthread_create(&th, NULL, fake_drain_run, &d), 0);
	a.fd = sv[0];
	ck_assert_ok(mig_conn_new(sv[0], T_MS, &a.c));
	ck_assert_ok(mig_chan_new(a.c, k, &a.ch));
	mig_chan_set_record_for_tests(a.ch, record);
	for (pos = 0; pos < len; pos += chunk) {
		struct iovec iov = { (void *)(buf + pos), len - pos < chunk ? len - pos : chunk };

		ck_assert_ok(mig_chan_writev(a.ch, &iov, 1));
	}
	ck_assert_ok(mig_chan_close_write(a.ch));
	shutdown(sv[0], SHUT_WR);
	pthread_join(th, NULL);
	end_close(&a);
	close(sv[1]);
	w = (struct wire){ .buf = d.buf, .len = d.len };
	wire_index(&w);
	return w;
}

/* Write buf to fd, as far as the peer takes it. */
struct feed {
	int fd;
	const uint8_t *buf;
	size_t len;
};

static void *feed_run(void *p)
{
	struct feed *f = p;
	size_t off = 0;
	ssize_t k;

	while (off < f->len && (k = send(f->fd, f->buf + off, f->len - off, MSG_NOSIGNAL)) > 0)
		off += (size_t)k;
	return NULL;
}

/* Write buf to fd in pieces of 1 .. 41 bytes, a pause between, so that a read finds records in parts. */
static void *trickle_run(void *p)
{
	struct feed *f = p;
	uint64_t seed = 0x51ced;
	size_t off = 0;

	while (off < f->len) {
		size_t k = 1 + xorshift64(&seed) % 41;
		ssize_t n;

		if (k > f->len - off)
			k = f->len - off;
		n = send(f->fd, f->buf + off, k, MSG_NOSIGNAL);
		if (n <= 0)
			break;
		off += (size_t)n;
		nanosleep(&(struct timespec){ 0, 20000 }, NULL);
	}
	shutdown(f->fd, SHUT_WR);
	return NULL;
}

/*
 * Records arriving in pieces (a header split, a record and part of the
 * next header in one read, and so on): each read whole and right, and the
 * end clean after the last one.
 */
START_TEST(records_in_pieces_whole)
{
	const bool encrypt = _i;
	size_t sizes[60];
	uint8_t past;
	struct wire w;
	struct feed f;
	struct end b;
	pthread_t th;
	unsigned int i;
	int sv[2];

	random_sizes(sizes, 60, 0xabc + encrypt);
	for (i = 0; i < 60; i++)
		sizes[i] = sizes[i] % 300 + 1;
	wire_seal(&w, encrypt, 0, 0, sizes, 60, true);
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	end_open(&b, sv[1], true, encrypt, 0, 0);
	f = (struct feed){ .fd = sv[0], .buf = w.buf, .len = w.len };
	ck_assert_int_eq(pthread_create(&th, NULL, trickle_run, &f), 0);
	for (i = 0; i < 60; i++)
		ck_assert_int_eq(recv_rec(b.ch, i, sizes[i]), 1);
	ck_assert_int_eq(mig_chan_read(b.ch, &past, 1), 0);
	pthread_join(th, NULL);
	ck_assert(!mig_chan_torn(b.ch));
	end_close(&b);
	close(sv[0]);
	free(w.buf);
}
END_TEST

/* One writev of 200 KiB: records of MIG_SEAL_RECORD bytes and the rest, then the last one; read back whole. */
START_TEST(sender_records_sized)
{
	const bool encrypt = _i;
	const size_t len = 200 << 10, hdr = sizeof(struct mig_seal);
	uint8_t *buf = malloc(len), *got = malloc(len);
	struct mig_chan_keys k = keys_of(false, encrypt);
	struct wire w;
	unsigned int i;

	ck_assert_ptr_nonnull(buf);
	ck_assert_ptr_nonnull(got);
	fill(buf, len, 3);
	w = seal_chunks(&k, buf, len, len, 0);
	ck_assert_uint_eq(w.n, (len + MIG_SEAL_RECORD - 1) / MIG_SEAL_RECORD + 1);
	for (i = 0; i + 1 < w.n; i++)
		ck_assert_uint_eq(w.off[i + 1] - w.off[i] - hdr - MIG_SEAL_TAG,
				  i + 2 < w.n ? MIG_SEAL_RECORD : len % MIG_SEAL_RECORD);
	ck_assert_uint_eq(w.off[w.n] - w.off[w.n - 1], hdr + MIG_SEAL_TAG);
	{
		struct mem_stream m = { .buf = w.buf, .len = w.len };
		struct mig_reader rd = { .read = mem_read, .describe = mem_describe, .ctx = &m };
		struct mig_chan_keys kb = keys_of(true, encrypt);
		struct mig_chan *ch;

		ck_assert_ok(mig_chan_new_reader(&rd, &kb, &ch));
		ck_assert_int_eq(mig_chan_read(ch, got, len), (int)len);
		ck_assert_mem_eq(got, buf, len);
		ck_assert_int_eq(mig_chan_read(ch, got, 1), 0);
		mig_chan_free(ch);
	}
	free(w.buf);
	free(buf);
	free(got);
}
END_TEST

/*
 * 6 MiB in records of nearly the largest size and of an odd one, over a
 * connection that holds many of them: the receiver reads records ahead
 * into its buffer, opens them where they landed and moves a record's
 * part to the front when the buffer's end is near (several times here,
 * with a record across the end each time: neither size divides the
 * buffer).  Read back in pieces of 1 byte to 300 KiB, each byte as sent.
 */
START_TEST(records_read_ahead_across_the_buffer)
{
	static const uint32_t records[] = { MIG_SEAL_MAX - 5, 65521 };
	const bool encrypt = _i % 2;
	const size_t len = 6u << 20;
	uint8_t *buf = malloc(len), *got = malloc(len), past;
	struct mig_chan_keys k = keys_of(false, encrypt);
	uint64_t seed = 0x7eadu + (uint64_t)_i;
	struct wire w;
	struct feed f;
	struct end b;
	pthread_t th;
	size_t pos = 0;
	int sv[2];

	ck_assert_ptr_nonnull(buf);
	ck_assert_ptr_nonnull(got);
	fill(buf, len, 11);
	w = seal_chunks(&k, buf, len, len, records[_i / 2]);
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	end_open(&b, sv[1], true, encrypt, 0, 0);
	f = (struct feed){ .fd = sv[0], .buf = w.buf, .len = w.len };
	ck_assert_int_eq(pthread_create(&th, NULL, feed_run, &f), 0);
	while (pos < len) {
		uint64_t r = xorshift64(&seed);
		size_t n = r % 8 ? 1 + (r >> 8) % (300u << 10) : 1 + (r >> 8) % 64;
		int ret;

		if (n > len - pos)
			n = len - pos;
		ret = mig_chan_read(b.ch, got + pos, n);
		ck_assert_msg(ret == (int)n, "reading %zu bytes at %zu: %d", n, pos, ret);
		pos += n;
	}
	ck_assert_msg(!memcmp(got, buf, len), "the bytes read are not the bytes sent");
	pthread_join(th, NULL);
	shutdown(sv[0], SHUT_WR);
	ck_assert_int_eq(mig_chan_read(b.ch, &past, 1), 0);
	ck_assert_uint_eq(mig_chan_buffered(b.ch), 0);
	end_close(&b);
	close(sv[0]);
	free(w.buf);
	free(buf);
	free(got);
}
END_TEST

/* Empty entries (a NULL base) among a writev's, inside a record and at its ends: the bytes arrive as they were. */
START_TEST(empty_entries_sealed)
{
	const bool encrypt = _i;
	uint8_t buf[150], got[150];
	struct iovec iov[] = { { NULL, 0 }, { buf, 100 }, { NULL, 0 }, { buf + 100, 50 }, { NULL, 0 } };
	struct end a, b;
	int sv[2];

	fill(buf, sizeof(buf), 5);
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	end_open(&a, sv[0], false, encrypt, 0, 0);
	end_open(&b, sv[1], true, encrypt, 0, 0);
	ck_assert_ok(mig_chan_writev(a.ch, iov, 5));
	ck_assert_ok(mig_chan_writev(a.ch, iov, 1)); /* nothing at all: no record */
	ck_assert_ok(mig_chan_close_write(a.ch));
	ck_assert_int_eq(mig_chan_read(b.ch, got, sizeof(got)), (int)sizeof(got));
	ck_assert_mem_eq(got, buf, sizeof(got));
	ck_assert_int_eq(mig_chan_read(b.ch, got, 1), 0);
	end_close(&a);
	end_close(&b);
}
END_TEST

/*
 * A record's header arrives and its payload does not, past the reader's
 * timeout: nothing was lost (the header stays with the channel), so the
 * channel is not torn and, once the rest comes, the record reads whole.
 */
START_TEST(timeout_after_header_reads_on)
{
	const bool encrypt = _i;
	static const size_t sizes[] = { 100 };
	uint8_t got[100], want[100];
	struct wire w;
	struct end b;
	int sv[2];

	wire_seal(&w, encrypt, 0, 0, sizes, 1, true);
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	end_open(&b, sv[1], true, encrypt, 0, 0);
	mig_conn_set_timeout(b.c, 100);
	write_exact(sv[0], w.buf, sizeof(struct mig_seal));
	ck_assert_int_eq(mig_chan_read(b.ch, got, sizeof(got)), -ETIMEDOUT);
	ck_assert_msg(!mig_chan_torn(b.ch), "a wait that lost nothing said torn");
	write_exact(sv[0], w.buf + sizeof(struct mig_seal), w.len - sizeof(struct mig_seal));
	shutdown(sv[0], SHUT_WR);
	ck_assert_int_eq(mig_chan_read(b.ch, got, sizeof(got)), (int)sizeof(got));
	fill(want, sizeof(want), 0);
	ck_assert_mem_eq(got, want, sizeof(got));
	ck_assert_int_eq(mig_chan_read(b.ch, got, 1), 0);
	end_close(&b);
	close(sv[0]);
	free(w.buf);
}
END_TEST

/* A record of the largest size: its header and tag every byte, its payload every 509th and its ends. */
START_TEST(flipped_byte_in_largest_record_refused)
{
	const bool encrypt = _i;
	uint8_t *big = malloc(MIG_SEAL_MAX), *got = malloc(MIG_SEAL_MAX);
	const size_t hdr = sizeof(struct mig_seal), len = hdr + MIG_SEAL_MAX + MIG_SEAL_TAG;
	struct mig_chan_keys k;
	struct wire w;
	struct end b;
	struct feed f;
	pthread_t th;
	int sv[2], ret;
	size_t pos, i;

	ck_assert_ptr_nonnull(big);
	ck_assert_ptr_nonnull(got);
	fill(big, MIG_SEAL_MAX, 9);
	k = keys_of(false, encrypt);
	w = seal_chunks(&k, big, MIG_SEAL_MAX, MIG_SEAL_MAX, MIG_SEAL_MAX); /* larger than a sender's own */
	ck_assert_uint_eq(w.n, 2); /* the record, then the last one */
	for (pos = 0; pos < len; pos = pos < hdr || pos + MIG_SEAL_TAG + 1 >= len ? pos + 1 : pos + 509) {
		w.buf[pos] ^= 0x10;
		ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
		b.fd = -1;
		end_open(&b, sv[1], true, encrypt, 0, 0);
		memset(got, SENTINEL, MIG_SEAL_MAX);
		/* a thread of its own: the record is larger than the socket holds */
		f = (struct feed){ .fd = sv[0], .buf = w.buf, .len = w.len };
		ck_assert_int_eq(pthread_create(&th, NULL, feed_run, &f), 0);
		ret = mig_chan_read(b.ch, got, MIG_SEAL_MAX);
		shutdown(sv[1], SHUT_RDWR);
		pthread_join(th, NULL);
		ck_assert_msg(ret < 0, "byte %zu flipped: read gave %d", pos, ret);
		for (i = 0; i < MIG_SEAL_MAX && got[i] == SENTINEL; i++)
			;
		ck_assert_msg(i == MIG_SEAL_MAX, "byte %zu flipped: byte %zu of it handed on", pos, i);
		end_close(&b);
		close(sv[0]);
		w.buf[pos] ^= 0x10;
	}
	free(w.buf);
	free(big);
	free(got);
}
END_TEST

/* ---- at the destination: nothing of a refused record reaches guest memory ---- */

#define DS_CHUNK 5000u /* plain stream bytes a sealed record */

static uint8_t page_byte(unsigned int p, size_t k)
{
	return (uint8_t)((p * 37 + k * 11) | 1); /* never zero */
}

/* A stream of the fake guest's, region 0's 16 pages as data (4 records): its length; each page's offset in page_at. */
static size_t data_stream(uint8_t *buf, size_t *page_at)
{
	struct mig_encoder e;
	struct mig_header h;
	struct mig_record rec;
	struct mig_vcpu_state st;
	unsigned int i, p;
	size_t n = 0, k;

#define PUT(p_, len_)                         \
	do {                                  \
		memcpy(buf + n, (p_), (len_)); \
		n += (len_);                  \
	} while (0)
	mig_encode_header(&e, &h, fake_layout, FAKE_NR_REGIONS, FAKE_NR_VCPUS, 0);
	PUT(&h, sizeof(h));
	PUT(fake_layout, sizeof(fake_layout));
	for (i = 0; i < 4; i++) {
		rec = mig_encode_data(&e, 0, i * 4, 4);
		PUT(&rec, sizeof(rec));
		for (p = i * 4; p < i * 4 + 4; p++) {
			page_at[p] = n;
			for (k = 0; k < MIG_PAGE_SIZE; k++)
				buf[n + k] = page_byte(p, k);
			n += MIG_PAGE_SIZE;
		}
	}
	rec = mig_encode_zero(&e, 1, 0, fake_layout[1].size / MIG_PAGE_SIZE);
	PUT(&rec, sizeof(rec));
	for (i = 0; i < FAKE_NR_VCPUS; i++) {
		fake_fresh(i, &st);
		rec = mig_encode_vcpu(&e, i, &st);
		PUT(&rec, sizeof(rec));
		PUT(&st, sizeof(st));
	}
	rec = mig_encode_vm(&e, &fake_vm);
	PUT(&rec, sizeof(rec));
	PUT(&fake_vm, sizeof(fake_vm));
	rec = mig_encode_devices(&e, NULL, 0);
	PUT(&rec, sizeof(rec));
	rec = mig_encode_end(&e);
	PUT(&rec, sizeof(rec));
#undef PUT
	return n;
}

/*
 * The destination's decoder (mig_recv_stream(), through a sealed reader)
 * takes a stream of pages in sealed records of DS_CHUNK bytes each.  A
 * byte flipped anywhere in any record (each byte of its header and tag,
 * every 97th of its payload): the stream refused for authentication, and
 * every page byte that record or a later one carried still zero in guest
 * memory; only the records before it landed.
 */
START_TEST(dest_uses_nothing_of_a_refused_record)
{
	const bool encrypt = _i;
	const size_t hdr = sizeof(struct mig_seal);
	size_t page_at[16], plain_len, pos, rlen, p, k;
	uint8_t *plain = malloc(128 << 10), *wire;
	struct mig_chan_keys keys = fake_seal_keys(encrypt, true);
	struct fake_guest f;
	struct wire w;
	char err[256];
	unsigned int r;
	int ret;

	ck_assert_ptr_nonnull(plain);
	plain_len = data_stream(plain, page_at);
	/* sealed as the source seals it: a writev a chunk */
	w = seal_chunks(&keys, plain, plain_len, DS_CHUNK, 0);
	ck_assert_uint_eq(w.n, (plain_len + DS_CHUNK - 1) / DS_CHUNK + 1);
	wire = malloc(FAKE_SEALED_HDR + w.len);
	memcpy(wire, FAKE_SEALED_MAGIC, 8);
	wire[8] = encrypt;
	memcpy(wire + FAKE_SEALED_HDR, w.buf, w.len);
	/* whole, it lands */
	ck_assert_ok(fake_guest_init(&f));
	ret = fake_receive(&f, wire, FAKE_SEALED_HDR + w.len, true, err, sizeof(err), NULL);
	ck_assert_msg(ret == 0, "%s", err);
	for (p = 0; p < 16; p++)
		ck_assert_mem_eq((uint8_t *)f.g.regions[0].hva + p * MIG_PAGE_SIZE, plain + page_at[p], MIG_PAGE_SIZE);
	fake_guest_free(&f);
	for (r = 0; r < w.n; r++) {
		/* the plain bytes before record r: only those may have landed */
		size_t before = r * DS_CHUNK < plain_len ? r * DS_CHUNK : plain_len;

		rlen = w.off[r + 1] - w.off[r];
		for (pos = 0; pos < rlen; pos = pos < hdr || pos + MIG_SEAL_TAG + 1 >= rlen ? pos + 1 : pos + 97) {
			const uint8_t *g;

			wire[FAKE_SEALED_HDR + w.off[r] + pos] ^= 0xff;
			ck_assert_ok(fake_guest_init(&f));
			ret = fake_receive(&f, wire, FAKE_SEALED_HDR + w.len, true, err, sizeof(err), NULL);
			wire[FAKE_SEALED_HDR + w.off[r] + pos] ^= 0xff;
			ck_assert_msg(ret < 0 && strstr(err, "authentication"),
				      "record %u byte %zu flipped: %d '%s', not refused for authentication", r, pos, ret,
				      err);
			g = f.g.regions[0].hva;
			for (p = 0; p < 16; p++) {
				for (k = 0; k < MIG_PAGE_SIZE && (page_at[p] + k < before || !g[p * MIG_PAGE_SIZE + k]); k++)
					;
				ck_assert_msg(k == MIG_PAGE_SIZE,
					      "record %u byte %zu flipped: page %zu byte %zu, carried by it or after, "
					      "landed",
					      r, pos, p, k);
			}
			fake_guest_free(&f);
		}
	}
	free(wire);
	free(w.buf);
	free(plain);
}
END_TEST

/* ---- the destination's ends ---- */

static const struct mig_psk test_psk = { .key = { 0x6b, 0x65, 0x79, 1, 2, 3 },
					 .len = sizeof(((struct mig_psk *)0)->key) };

/* Connections of a session over socket pairs: the source's connect() hands the other end to the destination's accept(). */
struct pairs {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int fd[MIG_MAX_CONNS];
	unsigned int made, taken;
};

static int pairs_connect(void *ctx, char *err, size_t len)
{
	struct pairs *p = ctx;
	int sv[2];

	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		return mig_errf(err, len, -errno, "socketpair: %s", strerror(errno));
	pthread_mutex_lock(&p->lock);
	p->fd[p->made++] = sv[1];
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
	return sv[0];
}

static int pairs_accept(void *ctx, uint64_t timeout_ms, char *err, size_t len)
{
	struct pairs *p = ctx;
	int fd;

	(void)timeout_ms;
	pthread_mutex_lock(&p->lock);
	while (p->taken == p->made)
		pthread_cond_wait(&p->cond, &p->lock);
	fd = p->fd[p->taken++];
	pthread_mutex_unlock(&p->lock);
	(void)err;
	(void)len;
	return fd;
}

/* A stream of the fake guest's over conns connections (1 or 2): all its pages zero, each vCPU fresh. */
static void fake_stream(unsigned int conns, struct iovec lane[2], uint8_t *buf0, uint8_t *buf1)
{
	struct mig_encoder e0, e1 = { .sum = MIG_SUM_INIT };
	struct mig_header h;
	struct mig_record rec;
	struct mig_vcpu_state st;
	size_t n0 = 0, n1 = 0;
	unsigned int i;

#define PUT(buf, n, p, len)                         \
	do {                                        \
		memcpy((buf) + (n), (p), (len));    \
		(n) += (len);                       \
	} while (0)
	mig_encode_header(&e0, &h, fake_layout, FAKE_NR_REGIONS, FAKE_NR_VCPUS, 0);
	PUT(buf0, n0, &h, sizeof(h));
	PUT(buf0, n0, fake_layout, sizeof(fake_layout));
	/* over two, region r's first chunk goes on connection r (stream.h) */
	rec = mig_encode_zero(&e0, 0, 0, fake_layout[0].size / MIG_PAGE_SIZE);
	PUT(buf0, n0, &rec, sizeof(rec));
	if (conns > 1) {
		rec = mig_encode_zero(&e1, 1, 0, fake_layout[1].size / MIG_PAGE_SIZE);
		PUT(buf1, n1, &rec, sizeof(rec));
	} else {
		rec = mig_encode_zero(&e0, 1, 0, fake_layout[1].size / MIG_PAGE_SIZE);
		PUT(buf0, n0, &rec, sizeof(rec));
	}
	for (i = 0; i < FAKE_NR_VCPUS; i++) {
		fake_fresh(i, &st);
		rec = mig_encode_vcpu(&e0, i, &st);
		PUT(buf0, n0, &rec, sizeof(rec));
		PUT(buf0, n0, &st, sizeof(st));
	}
	rec = mig_encode_vm(&e0, &fake_vm);
	PUT(buf0, n0, &rec, sizeof(rec));
	PUT(buf0, n0, &fake_vm, sizeof(fake_vm));
	rec = mig_encode_devices(&e0, NULL, 0);
	PUT(buf0, n0, &rec, sizeof(rec));
	rec = mig_encode_end(&e0);
	PUT(buf0, n0, &rec, sizeof(rec));
	rec = mig_encode_end(&e1);
	PUT(buf1, n1, &rec, sizeof(rec));
#undef PUT
	lane[0] = (struct iovec){ buf0, n0 };
	lane[1] = (struct iovec){ buf1, n1 };
}

struct source {
	int fd;
	struct pairs *pairs;
	struct mig_session s;
	unsigned int conns;
	bool stall;		/* send the header, then nothing */
	int ret, ended[2];	/* mig_session_connect()'s; each connection's read past the destination's last word */
	struct mig_ack answer[2]; /* READY (or REFUSED), ACK */
	char err[256];
};

/* Read one message of the handoff from connection 0. */
static bool source_msg(struct source *src, struct mig_ack *m)
{
	return mig_chan_read(src->s.chan[0], m, sizeof(*m)) == (int)sizeof(*m);
}

static void *source_run(void *p)
{
	struct source *src = p;
	struct mig_session_opts o = { .psk = &test_psk, .encrypt = true, .conns = src->conns, .timeout_ms = T_MS };
	static _Thread_local uint8_t buf0[2 * 4096 + FAKE_NR_VCPUS * sizeof(struct mig_vcpu_state)], buf1[512];
	struct iovec lane[2];
	struct mig_ack commit = { .kind = MIG_MSG_COMMIT };
	unsigned int i;

	src->ret = mig_session_connect(src->fd, &o, pairs_connect, src->pairs, &src->s, src->err, sizeof(src->err));
	if (src->ret < 0)
		return NULL;
	fake_stream(src->conns, lane, buf0, buf1);
	if (src->stall)
		lane[0].iov_len = sizeof(struct mig_header) + sizeof(fake_layout);
	ck_assert_ok(mig_chan_writev(src->s.chan[0], &lane[0], 1));
	if (src->conns > 1) {
		ck_assert_ok(mig_chan_writev(src->s.chan[1], &lane[1], 1));
		ck_assert_ok(mig_chan_close_write(src->s.chan[1]));
	}
	if (source_msg(src, &src->answer[0]) && src->answer[0].kind == MIG_MSG_READY) {
		struct iovec iov = { &commit, sizeof(commit) };

		ck_assert_ok(mig_chan_writev(src->s.chan[0], &iov, 1));
		source_msg(src, &src->answer[1]);
	}
	/* nothing more from the destination: each of its directions ended with its last record */
	for (i = 0; i < src->conns; i++) {
		uint8_t x;

		src->ended[i] = mig_chan_read(src->s.chan[i], &x, 1);
	}
	mig_chan_close_write(src->s.chan[0]);
	mig_session_free(&src->s);
	return NULL;
}

/* A source of conns connections against mig_recv() with these limits; the source's view in *src. */
static int dest_run(struct source *src, unsigned int conns, bool stall, uint64_t deadline_ms, char *err, size_t elen)
{
	struct pairs pairs = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };
	struct mig_recv_opts o = { .timeout_ms = T_MS, .deadline_ms = deadline_ms, .psk = &test_psk, .encrypt = true,
				   .accept = pairs_accept, .accept_ctx = &pairs };
	struct mig_recv_result res;
	struct fake_guest f;
	pthread_t th;
	int sv[2], ret;

	ck_assert_ok(fake_guest_init(&f));
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	*src = (struct source){ .fd = sv[0], .pairs = &pairs, .conns = conns, .stall = stall };
	ck_assert_int_eq(pthread_create(&th, NULL, source_run, src), 0);
	ret = mig_recv(&f.g, sv[1], &o, &res, err, elen);
	pthread_join(th, NULL);
	ck_assert_msg(src->ret == 0, "source: %s", src->err);
	close(sv[0]);
	close(sv[1]);
	/* pairs.fd[]: the destination's session closed them */
	fake_guest_free(&f);
	return ret;
}

START_TEST(dest_ends_each_direction_with_last)
{
	const unsigned int conns = 1 + _i;
	struct source src;
	char err[256];
	unsigned int i;
	int ret = dest_run(&src, conns, false, 0, err, sizeof(err));

	ck_assert_msg(ret == 0, "%d %s", ret, err);
	ck_assert_int_eq(src.answer[0].kind, MIG_MSG_READY);
	ck_assert_int_eq(src.answer[1].kind, MIG_MSG_ACK);
	ck_assert_int_eq(src.answer[1].status, 0);
	for (i = 0; i < conns; i++)
		ck_assert_msg(src.ended[i] == 0, "connection %u: %d, not the end after the last record", i, src.ended[i]);
}
END_TEST

START_TEST(refusal_after_deadline_answered)
{
	struct source src;
	char err[256];
	int ret = dest_run(&src, 1, true, 300, err, sizeof(err));

	ck_assert_int_eq(ret, -ETIMEDOUT);
	ck_assert_msg(strstr(err, "deadline"), "%s", err);
	/* the source hears why, and then the end */
	ck_assert_int_eq(src.answer[0].kind, MIG_MSG_REFUSED);
	ck_assert_int_eq(src.answer[0].status, -ETIMEDOUT);
	ck_assert_msg(strstr(src.answer[0].message, "deadline"), "%s", src.answer[0].message);
	ck_assert_int_eq(src.ended[0], 0);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("channel");
	TCase *tc = tcase_create("channel");

	tcase_set_timeout(tc, 60);
	/* each in both sealing modes: authenticated only, and encrypted */
	tcase_add_loop_test(tc, last_ends_both_directions, 0, 2);
	tcase_add_loop_test(tc, record_after_last_refused, 0, 2);
	tcase_add_loop_test(tc, trailing_bytes_after_last_refused, 0, 2);
	tcase_add_loop_test(tc, cut_without_last_refused, 0, 2);
	tcase_add_loop_test(tc, rekey_many_records_both_ways, 0, 2);
	tcase_add_loop_test(tc, moved_across_rekey_refused, 0, 2);
	tcase_add_loop_test(tc, receiver_that_keeps_its_key_fails, 0, 2);
	tcase_add_loop_test(tc, bytes_count_toward_the_limit, 0, 2);
	tcase_add_test(tc, keys_as_documented);
	tcase_add_loop_test(tc, records_in_pieces_whole, 0, 2);
	tcase_add_loop_test(tc, sender_records_sized, 0, 2);
	tcase_add_loop_test(tc, records_read_ahead_across_the_buffer, 0, 4);
	tcase_add_loop_test(tc, empty_entries_sealed, 0, 2);
	tcase_add_loop_test(tc, timeout_after_header_reads_on, 0, 2);
	tcase_add_loop_test(tc, flipped_byte_anywhere_refused, 0, 2);
	tcase_add_loop_test(tc, flipped_byte_in_largest_record_refused, 0, 2);
	tcase_add_loop_test(tc, dest_uses_nothing_of_a_refused_record, 0, 2);
	/* one connection, and two */
	tcase_add_loop_test(tc, dest_ends_each_direction_with_last, 0, 2);
	tcase_add_test(tc, refusal_after_deadline_answered);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
