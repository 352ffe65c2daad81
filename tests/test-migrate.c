// SPDX-License-Identifier: MIT
/*
 * The example migration daemon end to end: migrations over TCP and Unix
 * sockets that must arrive bit-exact and run on; malformed streams that
 * must be refused with the field named and no guest run; a destination
 * killed mid-migration, after which the source guest runs on and a second
 * migration succeeds.
 */
#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "migrate.h"
#include "rng.h"
#include "stream.h"
#include "test-util.h"

extern char **environ;

#define MIB (1ull << 20)

static const struct mig_send_opts send_opts = {
	.downtime_ms = 20, .max_passes = 6, .timeout_ms = 20000, .verify = true,
};

/*
 * The destination is the kvmdirty-migrate binary, started with exec: a
 * forked copy of this process (whose vCPU threads are running) could
 * inherit a lock some thread held and hang.  Its exit status says whether
 * the guest arrived digest-exact and ran on.
 */
static pid_t spawn_listener(const char *addr, const struct mig_guest *g)
{
	static char exe[4096];
	char mib[32], vcpus[32];
	const char *env = getenv("KVMDIRTY_MIGRATE");
	char *argv[] = { "kvmdirty-migrate", "listen", (char *)addr, "-m", mib, "-v", vcpus, "--run-ms", "300", NULL };
	pid_t pid;

	if (env) {
		snprintf(exe, sizeof(exe), "%s", env);
	} else { /* beside the tests in the build tree */
		ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 64);

		ck_assert_int_gt(n, 0);
		exe[n] = 0;
		strcpy(strrchr(exe, '/'), "/../examples/migrate/kvmdirty-migrate");
	}
	snprintf(mib, sizeof(mib), "%" PRIu64, g->mib);
	snprintf(vcpus, sizeof(vcpus), "%u", g->vcpus);
	ck_assert_int_eq(posix_spawn(&pid, exe, NULL, NULL, argv, environ), 0);
	return pid;
}

/* Connect once the listener is up (it binds, then builds its guest). */
static int connect_retry(const char *addr, pid_t listener, char *err, size_t len)
{
	int i, fd = -1, st;

	for (i = 0; i < 500 && fd < 0; i++) {
		fd = mig_connect(addr, err, len);
		if (fd < 0) {
			ck_assert_msg(waitpid(listener, &st, WNOHANG) == 0, "the listener exited: %s", err);
			usleep(10000);
		}
	}
	return fd;
}

static int child_status(pid_t pid)
{
	int st;

	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static struct testvm *running_source(const struct mig_guest *g)
{
	struct testvm *tv;
	char err[256];
	int ret = mig_guest_new(g, true, &tv, err, sizeof(err));

	ck_assert_msg(ret == 0, "source: %s", err);
	mig_guest_fill(tv, 16);
	ck_assert_ok(testvm_spawn(tv));
	return tv;
}

struct case_ {
	const char *addr;
	unsigned int vcpus;
	enum kvmdirty_mode mode;
	uint64_t ws_mib;
};

static const struct case_ cases[] = {
	{ "tcp::0", 1, KVMDIRTY_MODE_CLEAR_LOG, 0 },
	{ "unix", 2, KVMDIRTY_MODE_CLEAR_LOG, 16 },
	{ "tcp::0", 2, KVMDIRTY_MODE_DIRTY_RING, 16 },
	{ "unix", 1, KVMDIRTY_MODE_DIRTY_RING, 0 },
	{ "tcp::0", 1, KVMDIRTY_MODE_DIRTY_LOG, 8 },
	{ "unix", 2, KVMDIRTY_MODE_DIRTY_RING, 32 },
};

/* A free loopback port, or a fresh socket path, for a case's address. */
static void make_addr(const char *kind, char *addr, size_t len)
{
	static int seq;

	if (!strcmp(kind, "unix")) {
		snprintf(addr, len, "unix:/tmp/kvmdirty-test-%d-%d.sock", (int)getpid(), seq++);
	} else {
		struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		socklen_t sl = sizeof(sin);
		int fd = socket(AF_INET, SOCK_STREAM, 0);

		ck_assert_int_eq(bind(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
		ck_assert_int_eq(getsockname(fd, (struct sockaddr *)&sin, &sl), 0);
		close(fd);
		snprintf(addr, len, "tcp:127.0.0.1:%u", ntohs(sin.sin_port));
	}
}

static int migrate_once(struct testvm *tv, const struct mig_guest *g, const char *addr, struct mig_result *r,
			char *err, size_t len)
{
	pid_t pid = spawn_listener(addr, g);
	int fd = connect_retry(addr, pid, err, len), ret, status;

	ck_assert_msg(fd >= 0, "%s", err);
	ret = mig_send(tv, fd, &send_opts, r, err, len);
	close(fd);
	status = child_status(pid);
	if (!strncmp(addr, "unix:", 5))
		unlink(addr + 5);
	return ret < 0 ? ret : status ? -status : 0;
}

START_TEST(migrate)
{
	const struct case_ *c = &cases[_i];
	struct mig_guest g = { .mib = 32, .vcpus = c->vcpus, .mode = c->mode, .ws_mib = c->ws_mib };
	struct testvm *tv = running_source(&g);
	struct mig_result r;
	char addr[128], err[256];
	int ret;

	make_addr(c->addr, addr, sizeof(addr));
	ret = migrate_once(tv, &g, addr, &r, err, sizeof(err));
	ck_assert_msg(ret == 0, "%s, %u vCPU(s), mode %d, %" PRIu64 " MiB dirtied: %d (%s)", addr, c->vcpus,
		      c->mode, c->ws_mib, ret, ret < -100 ? "destination failed: see its log" : err);
	printf("migrated over %s, %u vCPU(s), mode %d, %" PRIu64 " MiB dirtied: %" PRIu64 " passes, %.1f ms, "
	       "downtime %.1f ms, %" PRIu64 " zero pages\n",
	       addr, c->vcpus, c->mode, c->ws_mib, r.passes, r.total_ms, r.downtime_ms, r.zero_pages);
	ck_assert_uint_ge(r.zero_pages, 1);
	testvm_free(tv);
}
END_TEST

/* ---- malformed streams ---- */

struct recording {
	uint8_t *buf;
	size_t len, cap;
	size_t rec_off[65536]; /* where each record header starts */
	uint32_t rec_kind[65536];
	struct mig_record recs[65536];
	size_t nrec;
	int fd;
};

static int rec_read(struct recording *r, size_t n)
{
	while (r->len + n > r->cap) {
		r->cap = r->cap ? r->cap * 2 : 1 << 20;
		r->buf = realloc(r->buf, r->cap);
	}
	while (n) {
		ssize_t k = read(r->fd, r->buf + r->len, n);

		if (k <= 0)
			return -1;
		r->len += (size_t)k;
		n -= (size_t)k;
	}
	return 0;
}

/* A destination that records the stream, knows where records start, and says ok. */
static void *recorder(void *p)
{
	struct recording *r = p;
	struct mig_header h;
	struct mig_ack ack = { .status = 0, .message = "ok" };

	if (rec_read(r, sizeof(h)))
		return NULL;
	memcpy(&h, r->buf, sizeof(h));
	if (rec_read(r, h.nr_regions * sizeof(struct mig_region)))
		return NULL;
	for (;;) {
		struct mig_record rec;
		size_t off = r->len;

		if (rec_read(r, sizeof(rec)))
			return NULL;
		memcpy(&rec, r->buf + off, sizeof(rec));
		r->rec_off[r->nrec] = off;
		r->recs[r->nrec] = rec;
		r->rec_kind[r->nrec++] = rec.kind;
		if (rec.kind == MIG_END)
			break;
		if (rec.kind == MIG_DATA && rec_read(r, rec.count * 4096))
			return NULL;
		if ((rec.kind == MIG_VCPU || rec.kind == MIG_DIGEST) &&
		    rec_read(r, rec.kind == MIG_VCPU ? rec.count : rec.count * 8))
			return NULL;
	}
	if (write(r->fd, &ack, sizeof(ack)) != sizeof(ack))
		return NULL;
	return r;
}

struct feeder {
	int fd;
	const uint8_t *buf;
	size_t len;
};

static void *feed(void *p)
{
	struct feeder *f = p;
	size_t off = 0;
	char ack[sizeof(struct mig_ack)];

	while (off < f->len) {
		ssize_t k = write(f->fd, f->buf + off, f->len - off);

		if (k <= 0)
			break;
		off += (size_t)k;
	}
	shutdown(f->fd, SHUT_WR);
	while (read(f->fd, ack, sizeof(ack)) > 0)
		;
	return NULL;
}

static struct mig_guest bad_guest = { .mib = 8, .vcpus = 2, .mode = KVMDIRTY_MODE_CLEAR_LOG, .ws_mib = 2 };
static struct recording rec;
static struct testvm *dst;

/* Feed bytes to a destination; returns mig_recv's result, err its reason. */
static int feed_stream(const uint8_t *buf, size_t len, char *err, size_t elen)
{
	struct feeder f = { .buf = buf, .len = len };
	pthread_t th;
	bool verified;
	int sv[2], ret;

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	f.fd = sv[1];
	ck_assert_int_eq(pthread_create(&th, NULL, feed, &f), 0);
	ret = mig_recv(dst, sv[0], &verified, err, elen);
	close(sv[0]);
	pthread_join(th, NULL);
	close(sv[1]);
	return ret;
}

static void record_stream(void)
{
	struct testvm *src = running_source(&bad_guest);
	struct mig_result r;
	char err[256];
	pthread_t th;
	void *ok;
	int sv[2], ret;

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	memset(&rec, 0, sizeof(rec));
	rec.fd = sv[1];
	ck_assert_int_eq(pthread_create(&th, NULL, recorder, &rec), 0);
	ret = mig_send(src, sv[0], &send_opts, &r, err, sizeof(err));
	ck_assert_msg(ret == 0, "recording a stream: %s", err);
	pthread_join(th, &ok);
	ck_assert_ptr_nonnull(ok);
	close(sv[0]);
	close(sv[1]);
	testvm_free(src);
	ck_assert_msg(mig_guest_new(&bad_guest, false, &dst, err, sizeof(err)) == 0, "%s", err);
}

static void expect_refused(const uint8_t *buf, size_t len, const char *field, const char *what)
{
	char err[256] = "";
	int ret = feed_stream(buf, len, err, sizeof(err));

	expect(ret < 0, "%s: accepted", what);
	expect(!field || strstr(err, field), "%s: refused with '%s', expected it to name '%s'", what, err, field);
}

/* A copy of the recording with bytes at off replaced. */
static uint8_t *patched(size_t off, const void *bytes, size_t n)
{
	uint8_t *b = malloc(rec.len);

	memcpy(b, rec.buf, rec.len);
	memcpy(b + off, bytes, n);
	return b;
}

/* The recording with n bytes at off replaced must be refused, naming field. */
static void refuse_patch(size_t off, const void *bytes, size_t n, const char *field, const char *what)
{
	uint8_t *b = patched(off, bytes, n);

	expect_refused(b, rec.len, field, what);
	free(b);
}

static size_t first_record(uint32_t kind)
{
	size_t i;

	for (i = 0; i < rec.nrec; i++)
		if (rec.rec_kind[i] == kind)
			return rec.rec_off[i];
	ck_abort_msg("no record of kind %u in the recording", kind);
	return 0;
}

/*
 * True if the byte at off is page data that a later record sends again:
 * flipping it changes nothing the destination ends up with.
 */
static bool superseded(size_t off)
{
	size_t i, j;

	for (i = 0; i + 1 < rec.nrec && rec.rec_off[i + 1] <= off; i++)
		;
	if (rec.rec_kind[i] != MIG_DATA || off < rec.rec_off[i] + sizeof(struct mig_record))
		return false;
	for (j = i + 1; j < rec.nrec; j++) {
		uint64_t page = rec.recs[i].first + (off - rec.rec_off[i] - sizeof(struct mig_record)) / 4096;

		if ((rec.rec_kind[j] == MIG_DATA || rec.rec_kind[j] == MIG_ZERO) &&
		    rec.recs[j].index == rec.recs[i].index && page - rec.recs[j].first < rec.recs[j].count)
			return true;
	}
	return false;
}

START_TEST(bad_streams)
{
	char err[256];
	uint32_t u32;
	uint64_t u64[2];
	size_t i, data, vcpu, digest, end;
	uint64_t rng = 0x1234567;
	uint8_t *b;

	record_stream();
	/* the recording itself is fine */
	ck_assert_msg(feed_stream(rec.buf, rec.len, err, sizeof(err)) == 0, "valid stream refused: %s", err);

	refuse_patch(0, "KVMDMIX", 8, "header.magic", "bad magic");
	u32 = 2;
	refuse_patch(offsetof(struct mig_header, version), &u32, 4, "header.version", "unknown version");
	u32 = 8192;
	refuse_patch(offsetof(struct mig_header, page_size), &u32, 4, "header.page_size", "page size");
	u32 = 3;
	refuse_patch(offsetof(struct mig_header, nr_regions), &u32, 4, "header.nr_regions", "region count");
	u32 = 1;
	refuse_patch(offsetof(struct mig_header, nr_vcpus), &u32, 4, "header.nr_vcpus", "vCPU count");
	u64[0] = 8ull << 30;
	refuse_patch(sizeof(struct mig_header) + sizeof(struct mig_region), u64, 8, "region[1]", "region table");

	data = first_record(MIG_DATA);
	u32 = 99;
	refuse_patch(data + offsetof(struct mig_record, kind), &u32, 4, ".kind", "record kind");
	u32 = 7;
	refuse_patch(data + offsetof(struct mig_record, index), &u32, 4, ".region", "record region");
	u64[0] = 1ull << 40;
	refuse_patch(data + offsetof(struct mig_record, first), u64, 8, ".pages", "run outside the region");
	u64[0] = 1;
	u64[1] = UINT64_MAX; /* first + count wraps */
	refuse_patch(data + offsetof(struct mig_record, first), u64, 16, ".pages", "run length that overruns");
	vcpu = first_record(MIG_VCPU);
	u64[0] = 100;
	refuse_patch(vcpu + offsetof(struct mig_record, count), u64, 8, "(VCPU).length", "vCPU state length");
	u32 = 5;
	refuse_patch(vcpu + offsetof(struct mig_record, index), &u32, 4, "(VCPU).vcpu", "vCPU index");
	digest = first_record(MIG_DIGEST);
	u64[0] = 3;
	refuse_patch(digest + offsetof(struct mig_record, count), u64, 8, "(DIGEST).pages", "digest length");
	/* a stream that skips from the header to END */
	end = first_record(MIG_END);
	b = malloc(rec.len);
	memcpy(b, rec.buf, rec.rec_off[0]);
	memcpy(b + rec.rec_off[0], rec.buf + end, sizeof(struct mig_record));
	expect_refused(b, rec.rec_off[0] + sizeof(struct mig_record), "END", "no vCPU state");
	free(b);
	/* one page changed in flight: the digests see it */
	b = patched(0, "", 0);
	b[data + sizeof(struct mig_record) + 100] ^= 0x5a;
	expect_refused(b, rec.len, "digest", "changed page");
	free(b);

	/* truncated at every record boundary and inside every record */
	for (i = 0; i < rec.nrec; i++) {
		size_t off = rec.rec_off[i];

		expect_refused(rec.buf, off, "truncated", "cut before a record");
		expect_refused(rec.buf, off + 10, "truncated", "cut inside a record header");
		if (rec.rec_kind[i] == MIG_DATA || rec.rec_kind[i] == MIG_VCPU || rec.rec_kind[i] == MIG_DIGEST)
			expect_refused(rec.buf, off + sizeof(struct mig_record) + 7, "truncated", "cut inside a payload");
	}
	expect_refused(rec.buf, rec.len - 1, "truncated", "cut inside END");
	expect_refused(rec.buf, 20, "truncated", "cut inside the header");

	/* a random byte flipped anywhere: refused, whatever the field */
	for (i = 0; i < 300; i++) {
		size_t off = xorshift64(&rng) % rec.len;
		uint8_t flip = (uint8_t)(1u << (xorshift64(&rng) % 8));

		if (superseded(off)) {
			i--;
			continue;
		}
		b = patched(0, "", 0);
		b[off] ^= flip;
		expect(feed_stream(b, rec.len, err, sizeof(err)) < 0, "byte %zu of %zu flipped (0x%x): accepted", off,
		       rec.len, flip);
		free(b);
	}
	testvm_free(dst);
	free(rec.buf);
}
END_TEST

/* A destination that takes a megabyte and dies. */
static pid_t dying_destination(int lfd)
{
	pid_t pid = fork();

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		char buf[65536], err[128];
		size_t got = 0;
		int fd = mig_accept(lfd, err, sizeof(err));

		while (fd >= 0 && got < MIB) {
			ssize_t k = read(fd, buf, sizeof(buf));

			if (k <= 0)
				break;
			got += (size_t)k;
		}
		raise(SIGKILL);
	}
	return pid;
}

START_TEST(connection_drop)
{
	struct mig_guest g = { .mib = 32, .vcpus = 2, .mode = KVMDIRTY_MODE_CLEAR_LOG, .ws_mib = 8 };
	struct timespec ts = { 0, 200 * 1000 * 1000 };
	struct mig_result r;
	char addr[128], err[256];
	struct testvm *tv;
	uint64_t pass;
	int lfd, fd, ret;
	pid_t pid;

	make_addr("unix", addr, sizeof(addr));
	lfd = mig_listen(addr, err, sizeof(err));
	ck_assert_msg(lfd >= 0, "%s", err);
	/* forked before the source's vCPU threads exist */
	pid = dying_destination(lfd);
	close(lfd);
	tv = running_source(&g);
	fd = mig_connect(addr, err, sizeof(err));
	ck_assert_msg(fd >= 0, "%s", err);
	ret = mig_send(tv, fd, &send_opts, &r, err, sizeof(err));
	close(fd);
	ck_assert_int_eq(child_status(pid), 128 + SIGKILL);
	ck_assert_msg(ret < 0, "migration to a dead destination succeeded");
	printf("drop: %s\n", err);
	/* the source guest runs on, untracked */
	ck_assert_uint_eq(kvmdirty_tracker_pending(tv->tracker), 0);
	pass = testvm_mailbox(tv, 0)->pass;
	nanosleep(&ts, NULL);
	ck_assert_uint_gt(testvm_mailbox(tv, 0)->pass, pass);
	/* and moves on the second try */
	unlink(addr + 5);
	make_addr("unix", addr, sizeof(addr));
	ret = migrate_once(tv, &g, addr, &r, err, sizeof(err));
	ck_assert_msg(ret == 0, "second migration: %d (%s)", ret, err);
	testvm_free(tv);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("migrate");
	TCase *tc = tcase_create("migrate");
	int skip = require_kvm("test-migrate");

	if (skip)
		return skip;
	signal(SIGPIPE, SIG_IGN);
	tcase_set_timeout(tc, 300);
	tcase_add_loop_test(tc, migrate, 0, (int)(sizeof(cases) / sizeof(cases[0])));
	tcase_add_test(tc, bad_streams);
	tcase_add_test(tc, connection_drop);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
