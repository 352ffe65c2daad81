// SPDX-License-Identifier: MIT
/*
 * The handoff after END (lib/migrate/net/handoff.c), with no KVM: a
 * source and a destination on threads of their own, over a relay that
 * drops, delays past -T, duplicates, corrupts, cuts, or splits (half
 * now, half past -T) one message of the handoff (READY, COMMIT, ACK),
 * plain and sealed.  Cutting both
 * connections at a message is what a kill of either process does to the
 * other.  In every case:
 *   - at most one side runs the guest, and exactly one once every unknown
 *     outcome was resolved;
 *   - a side the table (handoff.h) says knows its outcome decides it by
 *     itself, and is never left unknown; a side it says cannot know is;
 *   - a resolved unknown runs exactly the side chosen.
 * Each case is named after its step and fault.
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "handoff.h"
#include "json.h"
#include "stream.h"
#include "test-util.h"

#define T_MS 300    /* -T of both sides */
#define LATE_MS 900 /* a delay past it */

enum fault { PASS, DROP, DELAY, DUP, CORRUPT, CUT, SPLIT };
enum step { READY, COMMIT, ACK }; /* which message; ABORT travels where COMMIT would */

struct hcase {
	const char *name;
	enum step step;
	enum fault fault;
	bool sealed;
	/* what the table says: whether each side is left unknown, and where the guest runs without a resolve */
	bool src_unknown, dst_unknown;
	enum mig_outcome src, dst; /* for a side left unknown: what the resolver below chooses */
	/* unknown for a while, then decided by the peer's late message */
	bool src_late, dst_late;
};

/* the resolver: an unknown side runs the guest only where the other side is known to have dropped it */
static const struct hcase cases[] = {
	{ .name = "all-pass", .step = READY, .fault = PASS, .src = MIG_OUTCOME_THERE, .dst = MIG_OUTCOME_HERE },
	{ .name = "ready-drop", .step = READY, .fault = DROP, .src = MIG_OUTCOME_HERE, .dst = MIG_OUTCOME_THERE },
	{ .name = "ready-delay", .step = READY, .fault = DELAY, .src = MIG_OUTCOME_HERE, .dst = MIG_OUTCOME_THERE },
	{ .name = "ready-dup", .step = READY, .fault = DUP, .src = MIG_OUTCOME_THERE, .dst = MIG_OUTCOME_HERE },
	{ .name = "ready-corrupt", .step = READY, .fault = CORRUPT, .src = MIG_OUTCOME_HERE, .dst = MIG_OUTCOME_THERE },
	{ .name = "ready-cut", .step = READY, .fault = CUT,
	  .src = MIG_OUTCOME_HERE, .dst = MIG_OUTCOME_THERE, .dst_unknown = true },
	{ .name = "commit-drop", .step = COMMIT, .fault = DROP,
	  .src = MIG_OUTCOME_HERE, .dst = MIG_OUTCOME_THERE, .src_unknown = true, .dst_unknown = true },
	{ .name = "commit-delay", .step = COMMIT, .fault = DELAY,
	  .src = MIG_OUTCOME_THERE, .dst = MIG_OUTCOME_HERE, .src_late = true, .dst_late = true },
	{ .name = "commit-dup", .step = COMMIT, .fault = DUP, .src = MIG_OUTCOME_THERE, .dst = MIG_OUTCOME_HERE },
	{ .name = "commit-corrupt", .step = COMMIT, .fault = CORRUPT, .src = MIG_OUTCOME_HERE, .dst = MIG_OUTCOME_THERE },
	{ .name = "commit-cut", .step = COMMIT, .fault = CUT,
	  .src = MIG_OUTCOME_HERE, .dst = MIG_OUTCOME_THERE, .src_unknown = true, .dst_unknown = true },
	{ .name = "commit-split", .step = COMMIT, .fault = SPLIT,
	  .src = MIG_OUTCOME_HERE, .dst = MIG_OUTCOME_THERE, .src_unknown = true, .dst_unknown = true },
	{ .name = "ack-drop", .step = ACK, .fault = DROP,
	  .src = MIG_OUTCOME_THERE, .dst = MIG_OUTCOME_HERE, .src_unknown = true },
	{ .name = "ack-delay", .step = ACK, .fault = DELAY,
	  .src = MIG_OUTCOME_THERE, .dst = MIG_OUTCOME_HERE, .src_late = true },
	{ .name = "ack-dup", .step = ACK, .fault = DUP, .src = MIG_OUTCOME_THERE, .dst = MIG_OUTCOME_HERE },
	{ .name = "ack-corrupt", .step = ACK, .fault = CORRUPT,
	  .src = MIG_OUTCOME_THERE, .dst = MIG_OUTCOME_HERE, .src_unknown = true },
	{ .name = "ack-cut", .step = ACK, .fault = CUT,
	  .src = MIG_OUTCOME_THERE, .dst = MIG_OUTCOME_HERE, .src_unknown = true },
	/* sealed: a record repeated or changed fails its tag, which a side cannot tell from a cut */
	{ .name = "sealed-all-pass", .step = READY, .fault = PASS, .sealed = true,
	  .src = MIG_OUTCOME_THERE, .dst = MIG_OUTCOME_HERE },
	{ .name = "sealed-ready-drop", .step = READY, .fault = DROP, .sealed = true,
	  .src = MIG_OUTCOME_HERE, .dst = MIG_OUTCOME_THERE },
	{ .name = "sealed-ready-dup", .step = READY, .fault = DUP, .sealed = true,
	  .src = MIG_OUTCOME_THERE, .dst = MIG_OUTCOME_HERE, .src_unknown = true },
	{ .name = "sealed-ready-corrupt", .step = READY, .fault = CORRUPT, .sealed = true,
	  .src = MIG_OUTCOME_HERE, .dst = MIG_OUTCOME_THERE },
	{ .name = "sealed-commit-drop", .step = COMMIT, .fault = DROP, .sealed = true,
	  .src = MIG_OUTCOME_HERE, .dst = MIG_OUTCOME_THERE, .src_unknown = true, .dst_unknown = true },
	{ .name = "sealed-commit-delay", .step = COMMIT, .fault = DELAY, .sealed = true,
	  .src = MIG_OUTCOME_THERE, .dst = MIG_OUTCOME_HERE, .src_late = true, .dst_late = true },
	{ .name = "sealed-commit-corrupt", .step = COMMIT, .fault = CORRUPT, .sealed = true,
	  .src = MIG_OUTCOME_HERE, .dst = MIG_OUTCOME_THERE, .src_unknown = true, .dst_unknown = true },
	{ .name = "sealed-commit-cut", .step = COMMIT, .fault = CUT, .sealed = true,
	  .src = MIG_OUTCOME_HERE, .dst = MIG_OUTCOME_THERE, .src_unknown = true, .dst_unknown = true },
	/* sealed, the half stays in the channel (channel.h): the late rest is COMMIT whole, and decides */
	{ .name = "sealed-commit-split", .step = COMMIT, .fault = SPLIT, .sealed = true,
	  .src = MIG_OUTCOME_THERE, .dst = MIG_OUTCOME_HERE, .src_late = true, .dst_late = true },
	{ .name = "sealed-ack-drop", .step = ACK, .fault = DROP, .sealed = true,
	  .src = MIG_OUTCOME_THERE, .dst = MIG_OUTCOME_HERE, .src_unknown = true },
	{ .name = "sealed-ack-corrupt", .step = ACK, .fault = CORRUPT, .sealed = true,
	  .src = MIG_OUTCOME_THERE, .dst = MIG_OUTCOME_HERE, .src_unknown = true },
};

static void sleep_ms(unsigned int ms)
{
	struct timespec ts = { (time_t)(ms / 1000), (long)(ms % 1000) * 1000000 };

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

/* ---- the relay: one thread a direction, a message (or a sealed record) at a time ---- */

struct relay {
	int s_fd, d_fd; /* the relay's ends: toward the source, toward the destination */
	const struct hcase *c;
	pthread_t th[2];
	int cut;
	uint64_t ready_ns; /* when the destination's first message (READY) reached the relay; 0: never */
	uint64_t answer_ns; /* when the source's first message (COMMIT, ABORT) or its end reached the relay */
};

static uint64_t now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

struct dir {
	struct relay *r;
	int from, to;
	bool to_source;
};

static bool read_all(int fd, void *buf, size_t len)
{
	size_t got = 0;

	while (got < len) {
		ssize_t n = read(fd, (char *)buf + got, len - got);

		if (n <= 0)
			return false;
		got += (size_t)n;
	}
	return true;
}

static void write_all(int fd, const void *buf, size_t len)
{
	if (send(fd, buf, len, MSG_NOSIGNAL) != (ssize_t)len)
		return; /* the other side is gone: what a process killed leaves */
}

/* One message: 128 bytes plain, a sealed record (header, payload, tag) sealed. */
static size_t read_msg(struct dir *d, uint8_t *buf)
{
	struct mig_seal h;

	if (!d->r->c->sealed)
		return read_all(d->from, buf, sizeof(struct mig_ack)) ? sizeof(struct mig_ack) : 0;
	if (!read_all(d->from, &h, sizeof(h)) || h.len > 512)
		return 0;
	memcpy(buf, &h, sizeof(h));
	return read_all(d->from, buf + sizeof(h), h.len + MIG_SEAL_TAG) ? sizeof(h) + h.len + MIG_SEAL_TAG : 0;
}

static void cut_all(struct relay *r)
{
	__atomic_store_n(&r->cut, 1, __ATOMIC_RELEASE);
	shutdown(r->s_fd, SHUT_RDWR);
	shutdown(r->d_fd, SHUT_RDWR);
}

static void *relay_dir(void *p)
{
	struct dir *d = p;
	const struct hcase *c = d->r->c;
	uint8_t buf[1024];
	unsigned int nth = 0; /* messages seen this way */
	size_t n;

	while ((n = read_msg(d, buf)) > 0) {
		/* source-bound: READY is the first, ACK the second; destination-bound: COMMIT (or ABORT) */
		enum step s = !d->to_source ? COMMIT : nth == 0 ? READY : ACK;
		bool hit = s == c->step && nth < 2;

		if (d->to_source && nth == 0)
			__atomic_store_n(&d->r->ready_ns, now_ns(), __ATOMIC_RELEASE);
		if (!d->to_source && nth == 0)
			__atomic_store_n(&d->r->answer_ns, now_ns(), __ATOMIC_RELEASE);
		nth++;
		if (!hit || c->fault == PASS) {
			write_all(d->to, buf, n);
			continue;
		}
		switch (c->fault) {
		case DROP:
			break;
		case DELAY:
			sleep_ms(LATE_MS);
			write_all(d->to, buf, n);
			break;
		case DUP:
			write_all(d->to, buf, n);
			write_all(d->to, buf, n);
			break;
		case CORRUPT:
			if (c->sealed)
				buf[n - 1] ^= 1; /* the tag */
			else
				((struct mig_ack *)buf)->kind = 77;
			write_all(d->to, buf, n);
			break;
		case CUT:
			cut_all(d->r);
			return NULL;
		case SPLIT:
			/* half the message, the rest past -T: plain, the read that gave up took the half */
			write_all(d->to, buf, n / 2);
			sleep_ms(LATE_MS);
			write_all(d->to, buf + n / 2, n - n / 2);
			break;
		default:
			break;
		}
	}
	if (!d->to_source && !nth)
		__atomic_store_n(&d->r->answer_ns, now_ns(), __ATOMIC_RELEASE);
	return NULL;
}

/* ---- the two sides ---- */

struct side {
	struct mig_handoff h;
	struct mig_status st;
	struct mig_conn *conn;
	int fd;
	enum mig_outcome o;
	int unknown_lines;
	pthread_t th;
	bool dest;
	char err[256];
};

static void on_unknown(void *ctx, const char *line)
{
	struct side *s = ctx;

	__atomic_fetch_add(&s->unknown_lines, 1, __ATOMIC_RELAXED);
	expect(strstr(line, "unknown"), "the unknown line does not say so: %s", line);
}

static void *side_main(void *p)
{
	struct side *s = p;
	struct mig_handoff_times t;

	if (s->dest)
		s->o = mig_handoff_dest(&s->h, s->err, sizeof(s->err));
	else
		s->o = mig_handoff_source(&s->h, &t, s->err, sizeof(s->err));
	return NULL;
}

static void side_open(struct side *s, int fd, bool dest, bool sealed)
{
	static const struct mig_chan_keys k = { .send = { 1 }, .recv = { 2 }, .encrypt = true };
	struct mig_chan_keys mine = k;

	memset(s, 0, sizeof(*s));
	s->fd = fd;
	s->dest = dest;
	if (dest) {
		memcpy(mine.send, k.recv, sizeof(mine.send));
		memcpy(mine.recv, k.send, sizeof(mine.recv));
	}
	mig_status_init(&s->st, dest);
	ck_assert_int_eq(mig_conn_new(fd, T_MS, &s->conn), 0);
	ck_assert_int_eq(mig_chan_new(s->conn, sealed ? &mine : NULL, &s->h.ch), 0);
	s->h.fd = fd;
	s->h.st = &s->st;
	s->h.unknown = on_unknown;
	s->h.ctx = s;
	s->h.wait = true;
	s->h.timeout_ms = T_MS;
}

static void side_close(struct side *s)
{
	mig_chan_free(s->h.ch);
	mig_conn_free(s->conn);
	close(s->fd);
	mig_status_destroy(&s->st);
}

/*
 * Resolve what is unknown as kvmdirty-migrate(1) says an orchestrator
 * should: both unknown, the destination "nowhere" first (the source then
 * learns it, where the connection still carries the destination's answer),
 * then the source "here"; one unknown, it runs the guest only where the
 * other side is known to have dropped it.
 */
static void resolve_unknowns(struct side *src, struct side *dst)
{
	enum mig_outcome so = mig_status_outcome(&src->st), d_o = mig_status_outcome(&dst->st);
	char err[160];
	int k;

	if (d_o == MIG_OUTCOME_UNKNOWN)
		ck_assert_int_eq(mig_status_resolve(&dst->st, so == MIG_OUTCOME_THERE, err, sizeof(err)), 0);
	for (k = 0; k < 100 && so == MIG_OUTCOME_UNKNOWN && mig_status_outcome(&src->st) == MIG_OUTCOME_UNKNOWN; k++)
		sleep_ms(10);
	d_o = mig_status_outcome(&dst->st);
	if (mig_status_outcome(&src->st) == MIG_OUTCOME_UNKNOWN)
		ck_assert_int_eq(mig_status_resolve(&src->st, d_o != MIG_OUTCOME_HERE, err, sizeof(err)), 0);
}

static bool finished(struct side *s)
{
	enum mig_outcome o = mig_status_outcome(&s->st);

	return o == MIG_OUTCOME_HERE || o == MIG_OUTCOME_THERE;
}

/* A run's end: what is unknown resolved, both sides and the relay's threads ended. */
static void run_end(struct relay *r, struct side *src, struct side *dst)
{
	resolve_unknowns(src, dst);
	pthread_join(src->th, NULL);
	pthread_join(dst->th, NULL);
	cut_all(r);
	pthread_join(r->th[0], NULL);
	pthread_join(r->th[1], NULL);
}

/*
 * One run of case c.  The case's premise is that READY leaves the
 * destination within the source's -T of its wait; on a loaded host (a
 * sanitizer build beside other tests on 2 CPUs) it once took longer, and
 * the source rightly gave up on READY first ("awaiting READY: no progress
 * with the peer for 300 ms"), which is another case.  Such a run is told,
 * undone and false (unless it is the last try); otherwise checked, true.
 */
static bool handoff_once(const struct hcase *c, bool last_try)
{
	struct relay r = { .c = c };
	struct dir ds, dd;
	struct side src, dst;
	int a[2], b[2], k;
	char err[160];
	uint64_t src_ns, ready_ns, answer_ns;

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, a), 0);
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, b), 0);
	r.s_fd = a[1];
	r.d_fd = b[1];
	ds = (struct dir){ .r = &r, .from = b[1], .to = a[1], .to_source = true };
	dd = (struct dir){ .r = &r, .from = a[1], .to = b[1], .to_source = false };
	side_open(&src, a[0], false, c->sealed);
	side_open(&dst, b[0], true, c->sealed);
	/* nothing to resolve before the handoff */
	ck_assert_int_eq(mig_status_resolve(&src.st, true, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(pthread_create(&r.th[0], NULL, relay_dir, &ds), 0);
	ck_assert_int_eq(pthread_create(&r.th[1], NULL, relay_dir, &dd), 0);
	src_ns = now_ns();
	ck_assert_int_eq(pthread_create(&src.th, NULL, side_main, &src), 0);
	/* as after END: the source waits for READY while the destination still checks and loads */
	sleep_ms(T_MS / 2);
	ck_assert_int_eq(pthread_create(&dst.th, NULL, side_main, &dst), 0);
	/* long enough for every -T and every delay: whatever is unknown then stays so until resolved */
	for (k = 0; k < 400 && !(finished(&src) && finished(&dst)); k++)
		sleep_ms(10);
	sleep_ms(LATE_MS + 3 * T_MS);
	ready_ns = __atomic_load_n(&r.ready_ns, __ATOMIC_ACQUIRE);
	if (!last_try && (!ready_ns || ready_ns - src_ns > (T_MS - 50) * 1000000ull)) {
		printf("%-22s READY reached the relay %s %.0f ms into the source's wait of %d: the host was too slow for "
		       "the case; again\n",
		       c->name, ready_ns ? "only" : "never,", ready_ns ? (double)(ready_ns - src_ns) / 1e6 : 0.0, T_MS);
		run_end(&r, &src, &dst);
		side_close(&src);
		side_close(&dst);
		close(a[1]);
		close(b[1]);
		return false;
	}
	/*
	 * A destination the table says decides (not unknown, not late)
	 * hears the source's answer within its own -T from READY; under load
	 * the source once answered later than that (sealed-ready-corrupt:
	 * "unknown lines: source 0, destination 1"), which is another case.
	 */
	answer_ns = __atomic_load_n(&r.answer_ns, __ATOMIC_ACQUIRE);
	if (!last_try && !c->dst_unknown && !c->dst_late &&
	    (!answer_ns || answer_ns - ready_ns > (T_MS - 50) * 1000000ull)) {
		printf("%-22s the source's answer reached the relay %s %.0f ms after READY, within the destination's wait "
		       "of %d: the host was too slow for the case; again\n",
		       c->name, answer_ns ? "only" : "never,", answer_ns ? (double)(answer_ns - ready_ns) / 1e6 : 0.0, T_MS);
		run_end(&r, &src, &dst);
		side_close(&src);
		side_close(&dst);
		close(a[1]);
		close(b[1]);
		return false;
	}
	/* at most one side runs the guest before anyone resolved anything */
	expect(!(mig_status_outcome(&src.st) == MIG_OUTCOME_HERE && mig_status_outcome(&dst.st) == MIG_OUTCOME_HERE),
	       "%s: both sides run the guest (source: %s, destination: %s)", c->name, src.err, dst.err);
	expect((mig_status_outcome(&src.st) == MIG_OUTCOME_UNKNOWN) == c->src_unknown,
	       "%s: the source is %s, the table says %s (%s)", c->name, mig_outcome_name(mig_status_outcome(&src.st)),
	       c->src_unknown ? "unknown" : "known", src.err);
	expect((mig_status_outcome(&dst.st) == MIG_OUTCOME_UNKNOWN) == c->dst_unknown,
	       "%s: the destination is %s, the table says %s (%s)", c->name,
	       mig_outcome_name(mig_status_outcome(&dst.st)), c->dst_unknown ? "unknown" : "known", dst.err);
	run_end(&r, &src, &dst);
	printf("%-22s source %-5s%s destination %-5s%s (%s | %s)\n", c->name, mig_outcome_name(src.o),
	       src.st.resolved ? " (resolved)" : "", mig_outcome_name(dst.o), dst.st.resolved ? " (resolved)" : "",
	       src.err, dst.err);
	expect(src.o == c->src && dst.o == c->dst, "%s: source %s, destination %s; expected %s and %s", c->name,
	       mig_outcome_name(src.o), mig_outcome_name(dst.o), mig_outcome_name(c->src), mig_outcome_name(c->dst));
	expect((src.o == MIG_OUTCOME_HERE) + (dst.o == MIG_OUTCOME_HERE) == 1, "%s: the guest runs on %d sides",
	       c->name, (src.o == MIG_OUTCOME_HERE) + (dst.o == MIG_OUTCOME_HERE));
	/* a side says it is unknown once, exactly when it was */
	expect(src.unknown_lines == (int)(c->src_unknown || c->src_late) &&
		       dst.unknown_lines == (int)(c->dst_unknown || c->dst_late),
	       "%s: unknown lines: source %d, destination %d", c->name, src.unknown_lines, dst.unknown_lines);
	/* a side left unknown was resolved, or (the source) learnt the destination's resolve from it */
	expect((!src.st.resolved || c->src_unknown) && dst.st.resolved == c->dst_unknown,
	       "%s: resolved where not unknown", c->name);
	/* decided: a resolve now changes nothing */
	ck_assert_int_eq(mig_status_resolve(&src.st, src.o != MIG_OUTCOME_HERE, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(mig_status_outcome(&src.st), src.o);
	side_close(&src);
	side_close(&dst);
	close(a[1]);
	close(b[1]);
	return true;
}

START_TEST(handoff_fault)
{
	int tries = 0;

	while (!handoff_once(&cases[_i], ++tries == 5))
		;
}
END_TEST

/* A refusal in place of READY: the source keeps its guest, nothing is left unknown. */
START_TEST(refused_instead_of_ready)
{
	struct side src, dst;
	int sv[2];
	char buf[1];

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	side_open(&src, sv[0], false, false);
	side_open(&dst, sv[1], true, false);
	mig_handoff_refuse(dst.h.ch, -EPROTO, "record 12 (VCPU).first: 3, must be 0\nand a second line \xff\xfe\"");
	ck_assert_int_eq(pthread_create(&src.th, NULL, side_main, &src), 0);
	pthread_join(src.th, NULL);
	ck_assert_int_eq(src.o, MIG_OUTCOME_HERE);
	ck_assert_msg(strstr(src.err, "destination refused: record 12 (VCPU).first") && !strchr(src.err, '\n'),
		      "%s", src.err);
	ck_assert_int_eq(src.unknown_lines, 0);
	/* the peer's words, in the query: one line of JSON whatever bytes they were */
	{
		char q[1024];
		struct mig_json v;
		struct mig_json_error je;

		ck_assert_int_eq(mig_status_query(&src.st, q, sizeof(q)), 0);
		ck_assert_msg(mig_json_parse(q, strlen(q), &v, &je) == 0 && !strchr(q, '\n') && !strchr(q, '\xff'),
			      "not one line of JSON: %s (%s)", q, je.msg);
		mig_json_free(&v);
	}
	/* the source did not answer a refusal */
	ck_assert_int_eq(recv(sv[1], buf, 1, MSG_DONTWAIT), -1);
	side_close(&src);
	side_close(&dst);
}
END_TEST

/*
 * A destination that, after COMMIT, keeps sending what is not an ACK
 * (READY again and again, each within -T of the last): the source is
 * unknown from its COMMIT, resolvable at once, and says so within one -T
 * in all; a resolve ends the wait.
 */
struct chatter {
	int fd, stop;
};

static void *chatter_main(void *p)
{
	struct chatter *c = p;
	struct mig_ack m = { .kind = MIG_MSG_READY };

	write_all(c->fd, &m, sizeof(m));
	read_all(c->fd, &m, sizeof(m)); /* COMMIT */
	m = (struct mig_ack){ .kind = MIG_MSG_READY };
	while (!__atomic_load_n(&c->stop, __ATOMIC_ACQUIRE)) {
		write_all(c->fd, &m, sizeof(m));
		sleep_ms(T_MS / 3);
	}
	return NULL;
}

START_TEST(peer_that_never_answers_but_chatters)
{
	struct chatter ch = { 0 };
	struct side src;
	pthread_t th;
	int sv[2], k;
	char err[160];

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	ch.fd = sv[1];
	side_open(&src, sv[0], false, false);
	ck_assert_int_eq(pthread_create(&th, NULL, chatter_main, &ch), 0);
	ck_assert_int_eq(pthread_create(&src.th, NULL, side_main, &src), 0);
	for (k = 0; k < 200 && mig_status_outcome(&src.st) != MIG_OUTCOME_UNKNOWN; k++)
		sleep_ms(5);
	ck_assert_int_eq(mig_status_outcome(&src.st), MIG_OUTCOME_UNKNOWN);
	/* one -T in all, however often the peer speaks */
	sleep_ms(T_MS * 3);
	ck_assert_int_eq(__atomic_load_n(&src.unknown_lines, __ATOMIC_RELAXED), 1);
	ck_assert_int_eq(mig_status_resolve(&src.st, false, err, sizeof(err)), 0);
	pthread_join(src.th, NULL);
	ck_assert_int_eq(src.o, MIG_OUTCOME_THERE);
	__atomic_store_n(&ch.stop, 1, __ATOMIC_RELEASE);
	pthread_join(th, NULL);
	side_close(&src);
	close(sv[1]);
}
END_TEST

/* The query while unknown names it, and a resolve wakes a side waiting on a silent peer. */
START_TEST(query_and_resolve_while_unknown)
{
	struct side dst;
	int sv[2], k;
	char q[512], err[160];
	struct mig_ack ready;

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	side_open(&dst, sv[1], true, false);
	ck_assert_int_eq(pthread_create(&dst.th, NULL, side_main, &dst), 0);
	ck_assert(read_all(sv[0], &ready, sizeof(ready)));
	ck_assert_int_eq(ready.kind, MIG_MSG_READY);
	for (k = 0; k < 300 && mig_status_outcome(&dst.st) != MIG_OUTCOME_UNKNOWN; k++)
		sleep_ms(10);
	ck_assert_int_eq(mig_status_query(&dst.st, q, sizeof(q)), 0);
	ck_assert_msg(strstr(q, "\"side\":\"destination\"") && strstr(q, "\"outcome\":\"unknown\"") &&
			      strstr(q, "\"state\":\"unknown\"") && strstr(q, "awaiting COMMIT or ABORT"),
		      "%s", q);
	ck_assert_int_eq(mig_status_query(&dst.st, q, 20), -ENOSPC);
	ck_assert_int_eq(mig_status_resolve(&dst.st, true, err, sizeof(err)), 0);
	pthread_join(dst.th, NULL);
	ck_assert_int_eq(dst.o, MIG_OUTCOME_HERE);
	ck_assert_int_eq(mig_status_query(&dst.st, q, sizeof(q)), 0);
	ck_assert_msg(strstr(q, "\"outcome\":\"here\"") && strstr(q, "\"resolved\":true"), "%s", q);
	close(sv[0]);
	side_close(&dst);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("handoff");
	TCase *tc = tcase_create("handoff");

	tcase_set_timeout(tc, 60);
	tcase_add_loop_test(tc, handoff_fault, 0, (int)(sizeof(cases) / sizeof(cases[0])));
	tcase_add_test(tc, refused_instead_of_ready);
	tcase_add_test(tc, query_and_resolve_while_unknown);
	tcase_add_test(tc, peer_that_never_answers_but_chatters);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
