// SPDX-License-Identifier: MIT
/*
 * The migration engine and daemon end to end: migrations over TCP and
 * Unix sockets that must arrive bit-exact and run on; recorded streams
 * broken field by field, cut short, left hanging or run past END, which
 * must be refused with the field (or what was awaited) named and no guest
 * run; a destination that keeps taking streams after a bad peer; a
 * post-resume check that ends whatever the guest does; verification whose
 * downtime share is the pages sent while paused, and whose check after
 * switchover catches a write tracking never saw; memory the guest never
 * touched sent without being read, memory backed by a file sent whole,
 * each vCPU's progress in the stats, and a pre-copy that cannot converge
 * abandoned at its time limit, counted from the start of tracking.
 */
#define _GNU_SOURCE /* memfd_create */
#include <arpa/inet.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <spawn.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include "dest-postcopy.h"
#include "dest.h"
#include "migrate-spawn.h"
#include "hostmem.h"
#include "migrate-util.h"
#include "rng.h"
#include "source.h"
#include "stream.h"
#include "kvm-skip.h"
#include "test-util.h"
#include "testguest-engine.h"

#define MIB (1ull << 20)
#define PAGE ((uint64_t)MIG_PAGE_SIZE)

/*
 * Whether pre-copy converges depends on how the host schedules both ends;
 * these tests judge what arrives, so a pre-copy that hits its limit
 * switches over all the same (time_limit_from_tracking tests giving up).
 */
static const struct mig_send_opts send_opts = {
	.downtime_ms = 20, .max_passes = 6, .timeout_ms = 20000, .peer_timeout_ms = 60000, .verify = true,
	.force_switchover = true,
};

static int migrate_once_waiting(const struct mig_guest *g, const struct mig_testvm_opts *o, const char *addr,
				const char *timeout_ms, struct mig_result *r, char *err, size_t len)
{
	pid_t pid = spawn_listener(addr, o, timeout_ms);
	int fd = connect_retry(addr, pid, err, len), ret, status;

	ck_assert_msg(fd >= 0, "%s", err);
	ret = mig_send(g, fd, &send_opts, r, err, len);
	close(fd);
	/* a source that gave up leaves the listener waiting for another stream: the failure is the source's */
	if (ret < 0)
		kill(pid, SIGTERM);
	status = child_status(pid);
	drop_addr(addr);
	return ret < 0 ? ret : ret > 0 ? -EIO : status ? -status : 0;
}

static int migrate_once(const struct mig_guest *g, const struct mig_testvm_opts *o, const char *addr,
			struct mig_result *r, char *err, size_t len)
{
	return migrate_once_waiting(g, o, addr, "60000", r, err, len);
}

struct case_ {
	const char *addr;
	unsigned int vcpus;
	enum kvmdirty_mode mode;
	uint64_t ws_mib;
};

static const struct case_ cases[] = {
	{ .addr = "tcp::0", .vcpus = 1, .mode = KVMDIRTY_MODE_CLEAR_LOG, .ws_mib = 0 },
	{ .addr = "unix", .vcpus = 2, .mode = KVMDIRTY_MODE_CLEAR_LOG, .ws_mib = 16 },
	{ .addr = "tcp::0", .vcpus = 2, .mode = KVMDIRTY_MODE_DIRTY_RING, .ws_mib = 16 },
	{ .addr = "unix", .vcpus = 1, .mode = KVMDIRTY_MODE_DIRTY_RING, .ws_mib = 0 },
	{ .addr = "tcp::0", .vcpus = 1, .mode = KVMDIRTY_MODE_DIRTY_LOG, .ws_mib = 8 },
	{ .addr = "unix", .vcpus = 2, .mode = KVMDIRTY_MODE_DIRTY_RING, .ws_mib = 32 },
};

START_TEST(migrate)
{
	const struct case_ *c = &cases[_i];
	struct mig_testvm_opts o = { .mib = 32, .vcpus = c->vcpus, .mode = c->mode, .ws_mib = c->ws_mib };
	struct mig_guest g;
	struct testvm *tv = running_source(&o, &g);
	struct mig_result r;
	char addr[128], err[512];
	int ret;

	make_addr(c->addr, addr, sizeof(addr));
	ret = migrate_once(&g, &o, addr, &r, err, sizeof(err));
	ck_assert_msg(ret == 0, "%s, %u vCPU(s), mode %d, %" PRIu64 " MiB dirtied: %d (%s)", addr, c->vcpus,
		      c->mode, c->ws_mib, ret, ret < -100 ? "destination failed: see its log" : err);
	printf("migrated over %s, %u vCPU(s), mode %d, %" PRIu64 " MiB dirtied: %" PRIu64 " passes, %.1f ms, "
	       "downtime %.1f ms, %" PRIu64 " zero pages, %" PRIu64 " pages verified after switchover\n",
	       addr, c->vcpus, c->mode, c->ws_mib, r.passes, r.total_ms, r.downtime_ms, r.zero_pages, r.verified_pages);
	ck_assert_uint_ge(r.zero_pages, 1);
	ck_assert_uint_eq(r.lost_pages, 0);
	mig_guest_release(&g);
	mig_testvm_free(tv);
}
END_TEST

/*
 * Many regions (memslots), where the stream and the engine once took 16:
 * the guest's memory as 4,096 regions, and as many as KVM's memslots
 * allow but the system region's (the library's bound here), migrated
 * while the guest dirties across their boundaries, verified page by page
 * (the source checks its final memory against what it sent) and run on
 * by the destination with its self-check.
 */
START_TEST(many_regions)
{
	struct mig_testvm_opts o = { .mib = 128, .vcpus = 2, .mode = KVMDIRTY_MODE_CLEAR_LOG, .ws_mib = 16 };
	struct kvmdirty_vm *vm;
	struct mig_result r;
	struct mig_guest g;
	struct testvm *tv;
	char addr[128], err[512];
	uint64_t slots, total = 0;
	int ret;

	ck_assert_ok(kvmdirty_vm_new(&vm));
	slots = kvmdirty_vm_cap(vm, KVMDIRTY_CAP_NR_MEMSLOTS);
	kvmdirty_vm_free(vm);
	o.regions = _i == 0 ? 4096 : (unsigned int)(slots < MIG_MAX_REGIONS ? slots : MIG_MAX_REGIONS) - 1;
	if (o.regions > (o.mib << 20) / PAGE)
		o.regions = (unsigned int)((o.mib << 20) / PAGE);
	tv = running_source(&o, &g);
	ck_assert_uint_eq(g.nr_regions, o.regions + 1);
	make_addr("unix", addr, sizeof(addr));
	/* turning logging on for thousands of memslots (after the header, before the first record) takes KVM a while */
	ret = migrate_once_waiting(&g, &o, addr, "600000", &r, err, sizeof(err));
	ck_assert_msg(ret == 0, "%u regions: %d (%s)", g.nr_regions, ret,
		      ret < -100 ? "destination failed: see its log" : err);
	printf("%u regions migrated: %" PRIu64 " passes, %.1f ms, %" PRIu64 " pages verified after switchover\n",
	       g.nr_regions, r.passes, r.total_ms, r.verified_pages);
	ck_assert_uint_eq(r.lost_pages, 0);
	for (ret = 0; ret < (int)g.nr_regions; ret++)
		total += g.regions[ret].size / PAGE;
	/* every page of every region: the source's final memory against what it sent */
	ck_assert_uint_eq(r.verified_pages, total);
	if (_i == 0) {
		/* a destination whose guest has other regions refuses by name; the guest runs on here */
		struct mig_testvm_opts other = o;
		char want[128];

		other.regions = 1;
		make_addr("unix", addr, sizeof(addr));
		ret = migrate_once_waiting(&g, &other, addr, "600000", &r, err, sizeof(err));
		snprintf(want, sizeof(want), "header.nr_regions: %u, this destination has 2", g.nr_regions);
		ck_assert_msg(ret < 0 && strstr(err, want), "to a destination of 2 regions: %d (%s)", ret, err);
		ck_assert_ok(mig_testvm_check_running(tv, 300, err, sizeof(err)));
	}
	mig_guest_release(&g);
	mig_testvm_free(tv);
}
END_TEST

/*
 * Many vCPUs, where the engine, the throttle and the test guest once took
 * 64: 65 (the first past the test guest's 2 MiB layout), and with
 * KD_TEST_MAX_VCPUS set (meson's migrate-max-vcpus, plain build only) as
 * many as KVM allows, up to 1,024.  vCPU 0 dirties, the others idle (their
 * loop writes only their mailboxes); every page verified, each vCPU's
 * state carried, the destination runs them all with its self-check.
 */
START_TEST(many_vcpus)
{
	struct mig_testvm_opts o = { .mib = 64, .mode = KVMDIRTY_MODE_DIRTY_RING, .ws_mib = 0 };
	struct kvmdirty_vm *vm;
	struct mig_result r;
	struct mig_guest g;
	struct testvm *tv;
	char addr[128], err[512];
	uint64_t total = 0;
	int64_t max;
	unsigned int i;
	int ret;

	ck_assert_ok(kvmdirty_vm_new(&vm));
	max = kvmdirty_vm_cap(vm, KVMDIRTY_CAP_MAX_VCPUS);
	kvmdirty_vm_free(vm);
	o.vcpus = _i == 0 ? GUEST_LOW_VCPUS + 1 : (unsigned int)(max < GUEST_MAX_VCPUS ? max : GUEST_MAX_VCPUS);
	if (_i == 1 && !getenv("KD_TEST_MAX_VCPUS")) {
		printf("many_vcpus: %u vCPUs only with KD_TEST_MAX_VCPUS (meson test migrate-max-vcpus)\n", o.vcpus);
		return;
	}
	o.work[0] = (struct mig_vcpu_work){ .kind = MIG_WORK_DIRTY, .mib = 8, .rate = 2000 };
	for (i = 1; i < o.vcpus; i++)
		o.work[i] = (struct mig_vcpu_work){ .kind = MIG_WORK_IDLE };
	tv = running_source(&o, &g);
	ck_assert_uint_eq(g.nr_vcpus, o.vcpus);
	make_addr("unix", addr, sizeof(addr));
	ret = migrate_once(&g, &o, addr, &r, err, sizeof(err));
	ck_assert_msg(ret == 0, "%u vCPUs: %d (%s)", o.vcpus, ret, ret < -100 ? "destination failed: see its log" : err);
	printf("%u vCPUs migrated: %" PRIu64 " passes, %.1f ms, downtime %.1f ms\n", o.vcpus, r.passes, r.total_ms,
	       r.downtime_ms);
	for (i = 0; i < g.nr_regions; i++)
		total += g.regions[i].size / PAGE;
	ck_assert_uint_eq(r.lost_pages, 0);
	ck_assert_uint_eq(r.verified_pages, total);
	mig_guest_release(&g);
	mig_testvm_free(tv);
}
END_TEST

/*
 * An idle vCPU of the test guest sleeps as a guest's vCPU does on HLT:
 * its thread is woken at most every 100 ms (each wake is one pass of the
 * guest's idle loop), never spins.  Spinning, 1,024 idle vCPUs left the
 * migration's threads of a 2-CPU host a 500th of a CPU and the migration
 * never ended.  Judged by the passes the idle loop made (one a wake)
 * against the time it ran: at most one every 10 ms, ten times the design.
 */
START_TEST(idle_vcpus_sleep)
{
	struct mig_testvm_opts o = { .mib = 16, .vcpus = 4, .mode = KVMDIRTY_MODE_CLEAR_LOG, .ws_mib = 0 };
	uint64_t pass0[4], ms;
	struct timespec t0, t1, ts = { 0, 300000000 };
	struct mig_guest g;
	struct testvm *tv;
	unsigned int i;

	o.work[0] = (struct mig_vcpu_work){ .kind = MIG_WORK_DIRTY, .mib = 1, .rate = 1000 };
	for (i = 1; i < o.vcpus; i++)
		o.work[i] = (struct mig_vcpu_work){ .kind = i == 1 ? MIG_WORK_IDLE : MIG_WORK_SHARE };
	tv = running_source(&o, &g);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (i = 0; i < o.vcpus; i++)
		pass0[i] = testvm_mailbox(tv, i)->pass;
	nanosleep(&ts, NULL);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	ms = (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000);
	for (i = 1; i < o.vcpus; i++) {
		uint64_t passes = testvm_mailbox(tv, i)->pass - pass0[i];

		printf("idle vCPU %u: %" PRIu64 " wakes in %" PRIu64 " ms\n", i, passes, ms);
		ck_assert_msg(passes <= ms / 10 + 2, "idle vCPU %u: %" PRIu64 " passes of its idle loop in %" PRIu64
			      " ms: it spins", i, passes, ms);
	}
	/* the working vCPU works on, and the idle ones stop when told */
	ck_assert_uint_gt(testvm_mailbox(tv, 0)->writes, 0);
	mig_guest_release(&g);
	mig_testvm_free(tv);
}
END_TEST

/* ---- streams recorded, and fed back ---- */

struct recording {
	uint8_t *buf;
	size_t len;
	struct {
		size_t off;
		struct mig_record r;
	} *recs;
	size_t nrec;
};

static int note_record(size_t off, const struct mig_record *r, void *opaque)
{
	struct recording *rec = opaque;

	rec->recs = realloc(rec->recs, (rec->nrec + 1) * sizeof(rec->recs[0]));
	rec->recs[rec->nrec].off = off;
	rec->recs[rec->nrec++].r = *r;
	return 0;
}

/* Migrate g into a recorder; the recording framed by the engine's own walker. */
static int record_migration(const struct mig_guest *g, const struct mig_send_opts *o, struct recording *rec,
			    struct mig_result *r, char *err, size_t len)
{
	struct recorder rd = { 0 };
	pthread_t th;
	void *ok;
	int sv[2], ret;

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	rd.fd = sv[1];
	ck_assert_int_eq(pthread_create(&th, NULL, recorder_run, &rd), 0);
	ret = mig_send(g, sv[0], o, r, err, len);
	close(sv[0]);
	pthread_join(th, &ok);
	close(sv[1]);
	ck_assert_msg(ok, "recorder failed");
	memset(rec, 0, sizeof(*rec));
	rec->buf = rd.buf;
	rec->len = rd.len;
	ck_assert_msg(ret < 0 || mig_stream_walk(rec->buf, rec->len, note_record, rec, NULL) == 0,
		      "the recording (%zu bytes) is not one framed stream", rec->len);
	return ret;
}

static void recording_free(struct recording *rec)
{
	free(rec->buf);
	free(rec->recs);
}

struct feeder {
	int fd;
	const uint8_t *buf;
	size_t len;
	bool hold; /* keep the connection open after the bytes: a silent peer */
	struct mig_ack ack; /* the destination's first answer: READY or REFUSED */
};

/*
 * A source played from a recording: the bytes, then, for a whole stream
 * (one that ends at its END), the handoff: READY answered with COMMIT.  A
 * stream cut short ends with the connection (unless held open).
 */
static void *feed(void *p)
{
	struct feeder *f = p;
	size_t off = 0, end = 0;
	struct mig_ack ack;
	bool whole = mig_stream_walk(f->buf, f->len, NULL, NULL, &end) == 0 && end == f->len;

	while (off < f->len) {
		ssize_t k = write(f->fd, f->buf + off, f->len - off);

		if (k <= 0)
			break;
		off += (size_t)k;
	}
	if (!f->hold && !whole)
		shutdown(f->fd, SHUT_WR);
	if (read_msg(f->fd, &f->ack) && f->ack.kind == MIG_MSG_READY && write_msg(f->fd, MIG_MSG_COMMIT, 0, "commit"))
		read_msg(f->fd, &ack);
	return NULL;
}

static struct mig_testvm_opts bad_guest = { .mib = 8, .vcpus = 2, .mode = KVMDIRTY_MODE_CLEAR_LOG, .ws_mib = 2 };
static struct recording rec;
static struct testvm *dst;
static struct mig_guest dst_g;

/* Feed bytes to the destination; mig_recv's result, err its reason, ack what the peer was told. */
static int feed_stream_to(const uint8_t *buf, size_t len, bool hold, uint64_t timeout_ms, char *err, size_t elen,
			  struct mig_ack *ack)
{
	struct feeder f = { .buf = buf, .len = len, .hold = hold };
	struct mig_recv_opts o = { .timeout_ms = timeout_ms };
	struct mig_recv_result res;
	pthread_t th;
	int sv[2], ret;

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	f.fd = sv[1];
	ck_assert_int_eq(pthread_create(&th, NULL, feed, &f), 0);
	ret = mig_recv(&dst_g, sv[0], &o, &res, err, elen);
	close(sv[0]);
	pthread_join(th, NULL);
	close(sv[1]);
	if (ack)
		*ack = f.ack;
	return ret;
}

static int feed_stream(const uint8_t *buf, size_t len, char *err, size_t elen)
{
	return feed_stream_to(buf, len, false, 60000, err, elen, NULL);
}

static void expect_refused(const uint8_t *buf, size_t len, const char *field, const char *what)
{
	char err[256] = "";
	int ret = feed_stream(buf, len, err, sizeof(err));

	expect(ret < 0, "%s: accepted", what);
	expect(!field || strstr(err, field), "%s: refused with '%s', expected it to name '%s'", what, err, field);
	expect(!strchr(err, '\n'), "%s: the reason is more than one line: '%s'", what, err);
}

/* A copy of the recording with bytes at off replaced; resealed (END's checksum made right) if asked. */
static uint8_t *patched(size_t off, const void *bytes, size_t n, bool reseal)
{
	uint8_t *b = malloc(rec.len);

	memcpy(b, rec.buf, rec.len);
	memcpy(b + off, bytes, n);
	/* where the change leaves the framing whole; the field is refused before END either way */
	if (reseal)
		mig_stream_reseal(b, rec.len);
	return b;
}

/* The recording with n bytes at off replaced must be refused, naming field. */
static void refuse_patch(size_t off, const void *bytes, size_t n, bool reseal, const char *field, const char *what)
{
	uint8_t *b = patched(off, bytes, n, reseal);

	expect_refused(b, rec.len, field, what);
	free(b);
}

static size_t nth_record(uint32_t kind, size_t nth)
{
	size_t i;

	for (i = 0; i < rec.nrec; i++)
		if (rec.recs[i].r.kind == kind && !nth--)
			return i;
	ck_abort_msg("no record of kind %u in the recording", kind);
	return 0;
}

static size_t rec_off(uint32_t kind)
{
	return rec.recs[nth_record(kind, 0)].off;
}

/* True if a record in [from, rec.nrec) other than record skip sends page. */
static bool sent_by_another(size_t from, size_t skip, uint32_t region, uint64_t page)
{
	size_t i;

	for (i = from; i < rec.nrec; i++) {
		const struct mig_record *r = &rec.recs[i].r;

		if (i != skip && (r->kind == MIG_DATA || r->kind == MIG_ZERO) && r->index == region &&
		    page - r->first < r->count)
			return true;
	}
	return false;
}

/*
 * True if the byte at off is a page's data or hash in a DATA record that a
 * later record sends again: changing it changes nothing the destination
 * ends up with.
 */
static bool superseded(size_t off)
{
	const struct mig_record *r;
	size_t i, hashes, pages;

	for (i = 0; i + 1 < rec.nrec && rec.recs[i + 1].off <= off; i++)
		;
	r = &rec.recs[i].r;
	hashes = rec.recs[i].off + sizeof(struct mig_record);
	pages = hashes + r->count * sizeof(uint64_t);
	if (r->kind != MIG_DATA || off < hashes)
		return false;
	return sent_by_another(i + 1, i, r->index,
			       r->first + (off < pages ? (off - hashes) / sizeof(uint64_t) : (off - pages) / PAGE));
}

/*
 * A DATA or ZERO record none of whose pages a later record sends again
 * (only: nor an earlier one).
 */
static size_t last_word_on(uint32_t kind, bool only)
{
	size_t i;
	uint64_t k;

	for (i = rec.nrec; i-- > 0;) {
		const struct mig_record *r = &rec.recs[i].r;

		if (r->kind != kind)
			continue;
		for (k = 0; k < r->count && !sent_by_another(only ? 0 : i + 1, i, r->index, r->first + k); k++)
			;
		if (k == r->count)
			return i;
	}
	ck_abort_msg("every %s record is superseded", mig_kind_name(kind));
	return 0;
}

/* The recording without record i (and its payload), resealed. */
static uint8_t *without_record(size_t i, size_t *ret_len)
{
	size_t start = rec.recs[i].off, end = rec.recs[i + 1].off;
	uint8_t *b = malloc(rec.len);

	memcpy(b, rec.buf, start);
	memcpy(b + start, rec.buf + end, rec.len - end);
	*ret_len = rec.len - (end - start);
	ck_assert_int_eq(mig_stream_reseal(b, *ret_len), 0);
	return b;
}

static void record_stream(bool verify)
{
	struct mig_send_opts o = send_opts;
	struct mig_guest g;
	struct testvm *src = running_source(&bad_guest, &g);
	struct mig_result r;
	char err[512];

	o.verify = verify;
	ck_assert_msg(record_migration(&g, &o, &rec, &r, err, sizeof(err)) == 0, "recording a stream: %s", err);
	mig_guest_release(&g);
	mig_testvm_free(src);
	if (!dst) {
		ck_assert_msg(mig_testvm_new(&bad_guest, false, &dst, err, sizeof(err)) == 0, "%s", err);
		ck_assert_ok(mig_testvm_guest(dst, &dst_g));
	}
}

static void bad_streams_done(void)
{
	mig_guest_release(&dst_g);
	mig_testvm_free(dst);
	dst = NULL;
	recording_free(&rec);
}

START_TEST(bad_fields)
{
	char err[256];
	uint32_t u32;
	uint64_t u64[2];
	size_t data, vcpu, pass, end;

	record_stream(true);
	/* the recording itself is fine */
	ck_assert_msg(feed_stream(rec.buf, rec.len, err, sizeof(err)) == 0, "valid stream refused: %s", err);

	refuse_patch(0, "KVMDMIX", 8, false, "header.magic", "bad magic");
	u32 = 1;
	refuse_patch(offsetof(struct mig_header, version), &u32, 4, true, "header.version: 1", "version 1");
	u32 = 2;
	refuse_patch(offsetof(struct mig_header, version), &u32, 4, true, "header.version: 2 (no commit at the handoff",
		     "version 2");
	u32 = 3;
	refuse_patch(offsetof(struct mig_header, version), &u32, 4, true,
		     "header.version: 3 (a vCPU's registers, XSAVE and TSC only", "version 3");
	u32 = MIG_VERSION + 1;
	refuse_patch(offsetof(struct mig_header, version), &u32, 4, true, "header.version: 5", "unknown version");
	u32 = 8192;
	refuse_patch(offsetof(struct mig_header, page_size), &u32, 4, true, "header.page_size", "page size");
	u32 = 3;
	refuse_patch(offsetof(struct mig_header, nr_regions), &u32, 4, false, "header.nr_regions", "region count");
	u32 = 1;
	refuse_patch(offsetof(struct mig_header, nr_vcpus), &u32, 4, true, "header.nr_vcpus", "vCPU count");
	u32 = 0x19;
	refuse_patch(offsetof(struct mig_header, flags), &u32, 4, true, "header.flags: unknown bits 0x18", "flags");
	/* compression's flag where the session did not agree to it (a plain stream cannot) */
	u32 = MIG_F_PAGE_HASH | MIG_F_ZSTD;
	refuse_patch(offsetof(struct mig_header, flags), &u32, 4, true,
		     "header.flags: compression, which this session did not agree to", "compression flag");
	/* post-copy's flag where the session did not agree to it (a plain stream cannot) */
	u32 = MIG_F_PAGE_HASH | MIG_F_POSTCOPY;
	refuse_patch(offsetof(struct mig_header, flags), &u32, 4, true,
		     "header.flags: post-copy, which this session did not agree to", "post-copy unasked");
	u32 = 1;
	refuse_patch(offsetof(struct mig_header, reserved), &u32, 4, true, "header.reserved: 0x1", "reserved set");
	u64[0] = 8ull << 30;
	refuse_patch(sizeof(struct mig_header) + sizeof(struct mig_region), u64, 8, true, "region[1].gpa",
		     "region gpa");
	u64[0] = 4096;
	refuse_patch(sizeof(struct mig_header) + sizeof(struct mig_region) + 8, u64, 8, true, "region[1].size",
		     "region size");

	data = rec_off(MIG_DATA);
	u32 = 99;
	refuse_patch(data + offsetof(struct mig_record, kind), &u32, 4, true, ".kind: 99", "record kind");
	u32 = 5;
	refuse_patch(data + offsetof(struct mig_record, kind), &u32, 4, true, ".kind: 5 (DIGEST)", "version 1 kind");
	u32 = 7;
	refuse_patch(data + offsetof(struct mig_record, index), &u32, 4, true, "(DATA).index", "record region");
	u64[0] = 1ull << 40;
	refuse_patch(data + offsetof(struct mig_record, first), u64, 8, true, "(DATA).first", "run outside the region");
	u64[0] = 1;
	u64[1] = UINT64_MAX; /* first + count wraps */
	refuse_patch(data + offsetof(struct mig_record, first), u64, 16, true, "(DATA).count", "run that overruns");
	u64[0] = MIG_RUN_PAGES + 1;
	refuse_patch(data + offsetof(struct mig_record, count), u64, 8, true, "(DATA).count: 257", "run too long");
	vcpu = rec_off(MIG_VCPU);
	u64[0] = 100;
	refuse_patch(vcpu + offsetof(struct mig_record, count), u64, 8, true, "(VCPU).count", "vCPU state length");
	u64[0] = 3;
	refuse_patch(vcpu + offsetof(struct mig_record, first), u64, 8, true, "(VCPU).first: 3", "VCPU first");
	u32 = 5;
	refuse_patch(vcpu + offsetof(struct mig_record, index), &u32, 4, true, "(VCPU).index: vCPU 5", "vCPU index");
	/* a vCPU state's MSR list out of form: out of order, too long, an MSR no KVM saves */
	u32 = 0;
	refuse_patch(vcpu + sizeof(struct mig_record) + offsetof(struct mig_vcpu_state, msrs) + 16, &u32, 4, true,
		     "(VCPU).msrs[1].index: 0x0 after", "MSR order");
	u32 = MIG_VCPU_MSRS + 44;
	refuse_patch(vcpu + sizeof(struct mig_record) + offsetof(struct mig_vcpu_state, nr_msrs), &u32, 4, true,
		     "(VCPU).nr_msrs: 300, at most 256", "MSR count");
	u32 = 1u << 9;
	refuse_patch(vcpu + sizeof(struct mig_record) + offsetof(struct mig_vcpu_state, parts), &u32, 4, true,
		     "(VCPU).parts: 0x200", "vCPU state parts");
	u32 = 1;
	refuse_patch(vcpu + sizeof(struct mig_record) + offsetof(struct mig_vcpu_state, msrs) + 4, &u32, 4, true,
		     "(VCPU).msrs[0].reserved", "MSR reserved");
	u64[0] = 4;
	refuse_patch(rec_off(MIG_VM) + offsetof(struct mig_record, first), u64, 8, true, "(VM).first: 4", "VM first");
	u32 = 1u << 5;
	refuse_patch(rec_off(MIG_VM) + sizeof(struct mig_record) + offsetof(struct mig_vm_state, parts), &u32, 4, true,
		     "(VM).parts: 0x20", "VM state parts");
	u64[0] = 2;
	refuse_patch(rec_off(MIG_DEVICES) + offsetof(struct mig_record, first), u64, 8, true, "(DEVICES).first: 2",
		     "DEVICES first");
	pass = rec_off(MIG_PASS);
	u32 = 1;
	refuse_patch(pass + offsetof(struct mig_record, index), &u32, 4, true, "(PASS).index", "PASS index");
	u64[0] = 1;
	refuse_patch(pass + offsetof(struct mig_record, count), u64, 8, true, "(PASS).count", "PASS count");
	u64[0] = 7;
	refuse_patch(pass + offsetof(struct mig_record, first), u64, 8, true, "(PASS).first: pass 7", "PASS order");
	end = rec_off(MIG_END);
	u64[0] = 1;
	refuse_patch(end + offsetof(struct mig_record, count), u64, 8, false, "(END).count", "END count");
	u32 = 1;
	refuse_patch(end + offsetof(struct mig_record, index), &u32, 4, false, "(END).index", "END index");
	/* a checksummed byte changed in flight */
	u32 = 0x12345;
	refuse_patch(vcpu + sizeof(struct mig_record) + offsetof(struct mig_vcpu_state, regs), &u32, 4, false,
		     "(END).first", "vCPU state changed");
	bad_streams_done();
}
END_TEST

START_TEST(incomplete_streams)
{
	size_t i, len, data, zero, end;
	uint8_t *b;

	record_stream(true);
	/* a page whose only copy is dropped never arrives */
	data = last_word_on(MIG_DATA, true);
	b = without_record(data, &len);
	expect_refused(b, len, "never arrived", "a DATA record dropped");
	free(b);
	zero = last_word_on(MIG_ZERO, true);
	b = without_record(zero, &len);
	expect_refused(b, len, "never arrived", "a ZERO record dropped");
	free(b);
	/* ... the same with the vCPU state gone */
	b = without_record(nth_record(MIG_VCPU, 1), &len);
	expect_refused(b, len, "no VCPU record for vCPU 1", "a VCPU record dropped");
	free(b);
	/* ... and the VM's, and the devices' */
	b = without_record(nth_record(MIG_VM, 0), &len);
	expect_refused(b, len, "DEVICES before the VM record", "the VM record dropped");
	free(b);
	b = without_record(nth_record(MIG_DEVICES, 0), &len);
	expect_refused(b, len, "no DEVICES record before it", "the DEVICES record dropped");
	free(b);

	/* anything after END */
	b = malloc(rec.len + 1);
	memcpy(b, rec.buf, rec.len);
	b[rec.len] = 0;
	expect_refused(b, rec.len + 1, "after END", "a byte after END");
	free(b);

	/* cut at every record boundary and inside every record: ended, never "reset" */
	for (i = 0; i < rec.nrec; i++) {
		size_t off = rec.recs[i].off;
		char err[256] = "";

		expect_refused(rec.buf, off, "the stream ended before END", "cut before a record");
		expect_refused(rec.buf, off + 10, "the stream ended after 10 of 24", "cut inside a record header");
		if (rec.recs[i].r.kind == MIG_DATA || rec.recs[i].r.kind == MIG_VCPU || rec.recs[i].r.kind == MIG_VM)
			expect_refused(rec.buf, off + sizeof(struct mig_record) + 7, "the stream ended after 7",
				       "cut inside a payload");
		feed_stream(rec.buf, off, err, sizeof(err));
		expect(!strstr(err, "reset"), "a clean end of stream reported as '%s'", err);
	}
	expect_refused(rec.buf, rec.len - 1, "ended after 23 of 24", "cut inside END");
	expect_refused(rec.buf, 20, "header: the stream ended after 20 of 32", "cut inside the header");
	recording_free(&rec);

	/* without hashes: header, regions, the vCPUs and END, no page at all */
	record_stream(false);
	end = rec_off(MIG_END);
	b = malloc(rec.len);
	memcpy(b, rec.buf, rec.recs[0].off);
	len = rec.recs[0].off;
	for (i = 0; i < rec.nrec; i++) {
		if (rec.recs[i].r.kind != MIG_VCPU && rec.recs[i].r.kind != MIG_VM && rec.recs[i].r.kind != MIG_DEVICES)
			continue;
		memcpy(b + len, rec.buf + rec.recs[i].off, rec.recs[i + 1].off - rec.recs[i].off);
		len += rec.recs[i + 1].off - rec.recs[i].off;
	}
	memcpy(b + len, rec.buf + end, sizeof(struct mig_record));
	len += sizeof(struct mig_record);
	ck_assert_int_eq(mig_stream_reseal(b, len), 0);
	expect_refused(b, len, "region 0 page 0 (gpa 0x0) never arrived", "no pages at all");
	free(b);
	bad_streams_done();
}
END_TEST

START_TEST(damaged_pages)
{
	uint64_t rng = 0x1234567;
	char err[256];
	size_t i, last, off;
	uint8_t *b;

	record_stream(true);
	/* a page changed in flight whose copy is the last: refused before the guest runs */
	last = last_word_on(MIG_DATA, false);
	off = rec.recs[last].off + sizeof(struct mig_record) + rec.recs[last].r.count * sizeof(uint64_t) + 100;
	b = patched(0, "", 0, false);
	b[off] ^= 0x5a;
	expect_refused(b, rec.len, "does not match its hash", "changed page");
	free(b);
	/* ... its hash changed instead (END's checksum leaves DATA payloads to the hashes) */
	off = rec.recs[last].off + sizeof(struct mig_record);
	b = patched(0, "", 0, false);
	b[off] ^= 1;
	expect_refused(b, rec.len, "does not match its hash", "changed hash");
	free(b);
	/*
	 * A torn copy that a later one replaces is what pre-copy makes of a
	 * page written while it was sent: the first DATA record once more
	 * before END, its first copy torn, must be taken.
	 */
	i = nth_record(MIG_DATA, 0);
	{
		size_t rlen = rec.recs[i + 1].off - rec.recs[i].off, end = rec_off(MIG_END);

		b = malloc(rec.len + rlen);
		memcpy(b, rec.buf, end);
		memcpy(b + end, rec.buf + rec.recs[i].off, rlen);
		memcpy(b + end + rlen, rec.buf + end, rec.len - end);
		b[rec.recs[i].off + sizeof(struct mig_record) + rec.recs[i].r.count * sizeof(uint64_t)] ^= 1;
		ck_assert_int_eq(mig_stream_reseal(b, rec.len + rlen), 0);
		ck_assert_msg(feed_stream(b, rec.len + rlen, err, sizeof(err)) == 0, "a torn copy sent again refused: %s",
			      err);
		free(b);
	}

	/* a random byte flipped anywhere: refused, whatever the field */
	for (i = 0; i < 300; i++) {
		size_t at = xorshift64(&rng) % rec.len;
		uint8_t flip = (uint8_t)(1u << (xorshift64(&rng) % 8));

		if (superseded(at)) {
			i--;
			continue;
		}
		b = patched(0, "", 0, false);
		b[at] ^= flip;
		expect(feed_stream(b, rec.len, err, sizeof(err)) < 0, "byte %zu of %zu flipped (0x%x): accepted", at,
		       rec.len, flip);
		free(b);
	}
	bad_streams_done();
}
END_TEST

/*
 * A peer that sends part of a stream and then nothing: refused once the
 * wait times out, naming what it awaited and how long it waited: -T and
 * what the guest's size adds (mig_guest_wait_ms()).
 */
START_TEST(silent_peers)
{
	const char *awaited[4] = { "awaiting the header:", "awaiting record 3:", " (DATA) pages:", "awaiting record " };
	size_t cuts[4], data;
	struct mig_ack ack;
	char err[256], waited[64];
	unsigned int i;
	int ret;

	record_stream(true);
	ck_assert_uint_gt(mig_guest_wait_ms(&dst_g, 300), 300);
	snprintf(waited, sizeof(waited), "for %" PRIu64 " ms", mig_guest_wait_ms(&dst_g, 300));
	data = nth_record(MIG_DATA, 0);
	cuts[0] = 20;		       /* half a header */
	cuts[1] = rec.recs[3].off + 12; /* half a record header */
	cuts[2] = rec.recs[data].off + sizeof(struct mig_record) + rec.recs[data].r.count * sizeof(uint64_t) + 2000;
	cuts[3] = rec.recs[rec.nrec - 1].off; /* everything but END */
	for (i = 0; i < 4; i++) {
		ret = feed_stream_to(rec.buf, cuts[i], true, 300, err, sizeof(err), &ack);
		ck_assert_msg(ret == -ETIMEDOUT, "cut at %zu: %d (%s), expected a timeout", cuts[i], ret, err);
		ck_assert_msg(strstr(err, awaited[i]) && strstr(err, waited), "cut at %zu: '%s' should name '%s' and '%s'",
			      cuts[i], err, awaited[i], waited);
		/* the peer is told too */
		ck_assert_msg(ack.status == -ETIMEDOUT && strstr(ack.message, awaited[i]),
			      "cut at %zu: the peer heard %d '%.124s'", cuts[i], ack.status, ack.message);
	}
	/* the same guest then takes a whole stream */
	ck_assert_msg(feed_stream(rec.buf, rec.len, err, sizeof(err)) == 0, "valid stream after the silent ones: %s",
		      err);
	bad_streams_done();
}
END_TEST

/* ---- the listener keeps taking streams ---- */

static void read_ack(int fd, struct mig_ack *ack)
{
	read_msg(fd, ack);
}

START_TEST(listener_outlives_bad_peers)
{
	struct mig_testvm_opts o = { .mib = 16, .vcpus = 1, .mode = KVMDIRTY_MODE_CLEAR_LOG, .ws_mib = 4 };
	struct mig_header h = { .magic = "KVMDMIX", .version = MIG_VERSION };
	struct mig_result r;
	struct mig_guest g;
	struct mig_ack ack;
	struct testvm *tv;
	char addr[128], err[512];
	int silent, bad, fd, ret;
	pid_t pid;

	make_addr("tcp", addr, sizeof(addr));
	pid = spawn_listener(addr, &o, "3000"); /* generous: the real source waits on this listener too */
	/* first in line: connects and says nothing */
	silent = connect_retry(addr, pid, err, sizeof(err));
	ck_assert_msg(silent >= 0, "%s", err);
	/* second: not a stream at all */
	bad = mig_connect(addr, 10000, err, sizeof(err));
	ck_assert_msg(bad >= 0, "%s", err);
	ck_assert_int_eq(write(bad, &h, sizeof(h)), sizeof(h));
	shutdown(bad, SHUT_WR);
	/* third: the real source, whose stream waits in the socket meanwhile */
	tv = running_source(&o, &g);
	fd = mig_connect(addr, 10000, err, sizeof(err));
	ck_assert_msg(fd >= 0, "%s", err);
	ret = mig_send(&g, fd, &send_opts, &r, err, sizeof(err));
	close(fd);
	ck_assert_msg(ret == 0, "the real source, after two bad peers: %d (%s)", ret, err);
	ck_assert_int_eq(child_status(pid), 0);
	/*
	 * The silent peer's handshake ends at its deadline, or, where the real
	 * stream was taken first (peers are served side by side), when the
	 * destination stops listening: either way it is told.
	 */
	read_ack(silent, &ack);
	ck_assert_msg((ack.status == -ETIMEDOUT && strstr(ack.message, "awaiting the header")) ||
			      (ack.status == -ECANCELED && strstr(ack.message, "took another stream")),
		      "the silent peer heard %d '%.124s'", ack.status, ack.message);
	read_ack(bad, &ack);
	ck_assert_msg(ack.status == -EPROTO && strstr(ack.message, "header.magic"), "the bad peer heard %d '%.124s'",
		      ack.status, ack.message);
	close(silent);
	close(bad);
	mig_guest_release(&g);
	mig_testvm_free(tv);
}
END_TEST

/* ---- the check after resume ends whatever the guest does ---- */

/* A destination guest whose mailboxes say what a stream could have set, run and checked. */
static int resume_with(uint64_t tsc_per_page, bool stopped, char *err, size_t len)
{
	struct mig_testvm_opts o = { .mib = 4, .vcpus = 2 };
	struct testvm *tv;
	unsigned int i;
	int ret;

	ck_assert_msg(mig_testvm_new(&o, false, &tv, err, len) == 0, "%s", err);
	for (i = 0; i < o.vcpus; i++) {
		struct guest_vcpu *mb = testvm_mailbox(tv, i);

		mb->gpa = MIG_DATA_GPA + i * PAGE;
		mb->pages = 1;
		mb->tsc_per_page = tsc_per_page;
		mb->stop = stopped;
	}
	ret = mig_testvm_resume_check(tv, 100, err, len);
	mig_testvm_free(tv);
	return ret;
}

START_TEST(resume_check_bounded)
{
	char err[256];
	int ret;

	/* one page in 2^62 TSC ticks: the guest never looks at its stop flag again, and is too slow to judge */
	ret = resume_with(1ull << 62, false, err, sizeof(err));
	ck_assert_msg(ret == 0, "a guest too slow to judge: %d (%s)", ret, err);
	/* flat out: progress is due, and made */
	ret = resume_with(0, false, err, sizeof(err));
	ck_assert_msg(ret == 0, "a guest writing flat out: %d (%s)", ret, err);
	/* ... and not made, by a guest that stops at once */
	ret = resume_with(0, true, err, sizeof(err));
	ck_assert_msg(ret == -EIO && strstr(err, "no progress"), "a guest that did nothing: %d (%s)", ret, err);
}
END_TEST

/* `send -w 2 -r 1`: a guest writing a page a second per vCPU; both ends must finish. */
START_TEST(slow_guest_both_ends_finish)
{
	char addr[128], err[256];
	char *largs[] = { "listen", addr, "-m", "8", "-v", "2", "--run-ms", "300", NULL };
	char *sargs[] = { "send", addr, "-m", "8", "-v", "2", "-w", "2", "-r", "1", NULL };
	pid_t listener, source;
	int fd;

	make_addr("unix", addr, sizeof(addr));
	listener = spawn_migrate(largs, -1);
	/* wait for the listener to be up */
	fd = connect_retry(addr, listener, err, sizeof(err));
	ck_assert_msg(fd >= 0, "%s", err);
	close(fd); /* a peer that leaves at once: refused, and the listener takes the next */
	source = spawn_migrate(sargs, -1);
	ck_assert_int_eq(child_status(source), 0);
	ck_assert_int_eq(child_status(listener), 0);
	drop_addr(addr);
}
END_TEST

/* ---- verification ---- */

START_TEST(verify_off_the_downtime)
{
	struct mig_testvm_opts o = { .mib = 32, .vcpus = 2, .mode = KVMDIRTY_MODE_CLEAR_LOG, .ws_mib = 4 };
	struct mig_guest g;
	struct testvm *tv = running_source(&o, &g);
	uint64_t total = 0;
	struct mig_result r;
	char err[512];
	unsigned int i;
	int ret;

	for (i = 0; i < g.nr_regions; i++)
		total += g.regions[i].size / PAGE;
	ret = record_migration(&g, &send_opts, &rec, &r, err, sizeof(err));
	ck_assert_msg(ret == 0, "%d (%s)", ret, err);
	/* in the downtime: the pages sent then, not the guest */
	ck_assert_msg(r.downtime_hashed <= r.downtime_pages && r.downtime_pages < total / 2,
		      "%" PRIu64 " pages hashed in the downtime, %" PRIu64 " sent then, guest %" PRIu64 " pages",
		      r.downtime_hashed, r.downtime_pages, total);
	/* after it: every page */
	ck_assert_uint_eq(r.verified_pages, total);
	ck_assert_uint_eq(r.lost_pages, 0);
	recording_free(&rec);
	mig_guest_release(&g);
	mig_testvm_free(tv);
}
END_TEST

/* A write tracking cannot see (the host's own, untracked) after the page was sent. */
static struct {
	uint8_t *page;
	const struct mig_guest_ops *ops;
} scribble;

static void scribbling_pause(void *ctx)
{
	scribble.ops->pause(ctx);
	scribble.page[3000] ^= 0xff;
}

START_TEST(verify_catches_a_lost_write)
{
	struct mig_testvm_opts o = { .mib = 8, .vcpus = 1, .mode = KVMDIRTY_MODE_CLEAR_LOG };
	struct mig_guest g;
	struct testvm *tv = running_source(&o, &g);
	struct mig_guest_ops ops = *g.ops;
	struct mig_result r;
	char err[512], want[128];
	int ret;

	/* page 5 of the data region, outside the idle guest's reach */
	scribble.page = (uint8_t *)g.regions[1].hva + 5 * PAGE;
	scribble.ops = g.ops;
	ops.pause = scribbling_pause;
	g.ops = &ops;
	ret = record_migration(&g, &send_opts, &rec, &r, err, sizeof(err));
	ck_assert_msg(ret == 1 && r.lost_pages == 1, "%d, %" PRIu64 " lost (%s)", ret, r.lost_pages, err);
	snprintf(want, sizeof(want), "region 1 page 5 (gpa 0x%" PRIx64 ")", (uint64_t)(MIG_DATA_GPA + 5 * PAGE));
	ck_assert_msg(strstr(err, want) && strstr(err, "tracking lost writes"), "'%s' should name %s", err, want);
	/* the stream itself is consistent: a destination takes it */
	ck_assert_msg(mig_testvm_new(&o, false, &dst, err, sizeof(err)) == 0, "%s", err);
	ck_assert_ok(mig_testvm_guest(dst, &dst_g));
	ck_assert_msg(feed_stream(rec.buf, rec.len, err, sizeof(err)) == 0, "destination: %s", err);
	bad_streams_done();
	mig_guest_release(&g);
	mig_testvm_free(tv);
}
END_TEST

/* ---- a destination that dies ---- */

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
	struct mig_testvm_opts o = { .mib = 32, .vcpus = 2, .mode = KVMDIRTY_MODE_CLEAR_LOG, .ws_mib = 8 };
	struct timespec ts = { 0, 200 * 1000 * 1000 };
	struct mig_result r;
	struct mig_guest g;
	char addr[128], err[512];
	struct testvm *tv;
	uint64_t pass;
	int lfd, fd, ret;
	unsigned int k;
	pid_t pid;

	make_addr("unix", addr, sizeof(addr));
	lfd = mig_listen(addr, err, sizeof(err));
	ck_assert_msg(lfd >= 0, "%s", err);
	/* forked before the source's vCPU threads exist */
	pid = dying_destination(lfd);
	close(lfd);
	tv = running_source(&o, &g);
	fd = mig_connect(addr, 10000, err, sizeof(err));
	ck_assert_msg(fd >= 0, "%s", err);
	ret = mig_send(&g, fd, &send_opts, &r, err, sizeof(err));
	close(fd);
	ck_assert_int_eq(child_status(pid), 128 + SIGKILL);
	ck_assert_msg(ret < 0, "migration to a dead destination succeeded");
	printf("drop: %s\n", err);
	/* the source guest runs on, untracked */
	ck_assert_uint_eq(kvmdirty_tracker_pending(tv->tracker), 0);
	/* (a while for it on a loaded host: 200 ms at a time, up to 10 s) */
	pass = testvm_mailbox(tv, 0)->pass;
	for (k = 0; k < 50 && testvm_mailbox(tv, 0)->pass == pass; k++)
		nanosleep(&ts, NULL);
	ck_assert_msg(testvm_mailbox(tv, 0)->pass > pass, "the source's guest did not run on: pass %" PRIu64
		      " after %u ms", pass, k * 200);
	/* and moves on the second try */
	drop_addr(addr);
	make_addr("unix", addr, sizeof(addr));
	ret = migrate_once(&g, &o, addr, &r, err, sizeof(err));
	ck_assert_msg(ret == 0, "second migration: %d (%s)", ret, err);
	mig_guest_release(&g);
	mig_testvm_free(tv);
}
END_TEST


/* ---- memory never touched, memory backed by a file ---- */

/*
 * Pages of [hva, hva + pages) that the host's page tables map here (or
 * hold in swap): read or written by this process, or by KVM for it.
 */
static uint64_t mapped_pages(const void *hva, uint64_t pages)
{
	uint64_t *e = malloc(pages * sizeof(uint64_t)), i, n = 0;
	int fd = mig_pagemap_open();

	ck_assert_ptr_nonnull(e);
	ck_assert_int_ge(fd, 0);
	ck_assert_ok(mig_pagemap_read(fd, hva, pages, e));
	for (i = 0; i < pages; i++)
		n += !mig_pm_untouched(e[i]);
	close(fd);
	free(e);
	return n;
}

/*
 * A guest that works in 4 MiB of its 64 and never touched the rest: the
 * source sends the rest as ZERO records without reading it (a read would
 * map it), the check after switchover too, and the guest arrives whole.
 */
START_TEST(untouched_never_read)
{
	struct mig_testvm_opts o = { .mib = 64, .vcpus = 2, .mode = KVMDIRTY_MODE_CLEAR_LOG,
				     .work = { { .kind = MIG_WORK_DIRTY, .mib = 4 }, { .kind = MIG_WORK_COMPUTE } } };
	const uint64_t ws = (4 * MIB) / PAGE, pages = (64 * MIB) / PAGE;
	struct testvm *tv;
	struct mig_guest g;
	struct mig_result r;
	char addr[128], err[512];
	const uint8_t *data;
	int ret;

	ck_assert_msg(mig_testvm_new(&o, true, &tv, err, sizeof(err)) == 0, "source: %s", err);
	ck_assert_ok(mig_testvm_guest(tv, &g));
	data = g.regions[1].hva;
	/* pages, not huge pages: a host with transparent huge pages always on would map 2 MiB at a touch */
	ck_assert_int_eq(madvise((void *)data, pages * PAGE, MADV_NOHUGEPAGE), 0);
	ck_assert_uint_eq(mapped_pages(data + ws * PAGE, pages - ws), 0);
	ck_assert_ok(testvm_spawn(tv));
	make_addr("unix", addr, sizeof(addr));
	ret = migrate_once(&g, &o, addr, &r, err, sizeof(err));
	ck_assert_msg(ret == 0, "%d (%s)", ret, ret < -100 ? "destination failed: see its log" : err);
	ck_assert_msg(r.untouched_pages >= pages - ws, "%" PRIu64 " pages sent unread, the guest never touched %" PRIu64,
		      r.untouched_pages, pages - ws);
	ck_assert_uint_eq(r.lost_pages, 0);
	ck_assert_uint_eq(r.verified_pages, pages + GUEST_SYS_SIZE / PAGE);
	/* nothing outside the working set was read: none of it is mapped */
	ret = (int)mapped_pages(data + ws * PAGE, pages - ws);
	ck_assert_msg(ret == 0, "%d pages the guest never touched were read by the source (of %" PRIu64 ")", ret,
		      pages - ws);
	mig_guest_release(&g);
	mig_testvm_free(tv);
}
END_TEST

/*
 * Guest memory backed by a file (MAP_SHARED of a memfd) filled through
 * the fd, never through the mapping: this process's page tables show none
 * of it, yet every page holds data.  It must arrive with the file's
 * contents: pages the pagemap shows absent are untouched only in private
 * anonymous memory.
 */
START_TEST(file_backed_arrives)
{
	const uint64_t mib = 8, pages = (mib * MIB) / PAGE;
	struct mig_testvm_opts o = { .mib = mib, .vcpus = 1, .mode = KVMDIRTY_MODE_CLEAR_LOG, .data_file = true };
	struct mig_testvm_opts d = { .mib = mib, .vcpus = 1 };
	uint8_t *want = malloc(mib * MIB);
	uint64_t rng = 0xf11e, k, bad = 0, first = UINT64_MAX;
	struct testvm *tv;
	struct mig_guest g;
	struct mig_result r;
	char err[512];
	int ret;

	ck_assert_ptr_nonnull(want);
	o.data_fd = memfd_create("guest", MFD_CLOEXEC);
	ck_assert_int_ge(o.data_fd, 0);
	for (k = 0; k < mib * MIB / 8; k++)
		((uint64_t *)want)[k] = xorshift64(&rng);
	ck_assert_int_eq(pwrite(o.data_fd, want, mib * MIB, 0), (ssize_t)(mib * MIB));
	ck_assert_msg(mig_testvm_new(&o, true, &tv, err, sizeof(err)) == 0, "source: %s", err);
	ck_assert_ok(mig_testvm_guest(tv, &g));
	ck_assert_uint_eq(mapped_pages(g.regions[1].hva, pages), 0);
	ck_assert_ok(testvm_spawn(tv));
	ret = record_migration(&g, &send_opts, &rec, &r, err, sizeof(err));
	ck_assert_msg(ret == 0, "%d (%s)", ret, err);
	ck_assert_msg(mig_testvm_new(&d, false, &dst, err, sizeof(err)) == 0, "%s", err);
	ck_assert_ok(mig_testvm_guest(dst, &dst_g));
	ck_assert_ok(mig_guest_zero_known(&dst_g));
	ck_assert_msg(feed_stream(rec.buf, rec.len, err, sizeof(err)) == 0, "destination: %s", err);
	for (k = 0; k < pages; k++) {
		if (memcmp((uint8_t *)dst_g.regions[1].hva + k * PAGE, want + k * PAGE, PAGE)) {
			bad++;
			if (first == UINT64_MAX)
				first = k;
		}
	}
	ck_assert_msg(!bad, "%" PRIu64 " of %" PRIu64 " file-backed pages arrived other than the file holds (first: page "
		      "%" PRIu64 ")", bad, pages, first);
	mig_guest_release(&dst_g);
	bad_streams_done();
	mig_guest_release(&g);
	mig_testvm_free(tv);
	close(o.data_fd);
	free(want);
}
END_TEST

/*
 * A destination whose memory is known zero, and a stream of an idle guest
 * one page in 16 of whose data is zero: those pages come as ZERO records
 * only, and stay unmapped; a page an earlier stream wrote is cleared by a
 * ZERO record all the same.
 */
START_TEST(dest_leaves_unwritten_alone)
{
	struct mig_testvm_opts o = { .mib = 8, .vcpus = 1, .mode = KVMDIRTY_MODE_CLEAR_LOG };
	const uint64_t pages = (8 * MIB) / PAGE, data = pages - pages / 16;
	struct testvm *tv;
	struct mig_guest g;
	struct mig_result r;
	char err[512];
	uint64_t n;
	uint8_t *mem;
	int ret;

	/* the destination's memory as a VMM may have it: fresh, not faulted in */
	mem = testvm_map(8 * MIB);
	ck_assert_ptr_nonnull(mem);
	ck_assert_int_eq(madvise(mem, 8 * MIB, MADV_NOHUGEPAGE), 0);
	tv = running_source(&o, &g);
	ret = record_migration(&g, &send_opts, &rec, &r, err, sizeof(err));
	ck_assert_msg(ret == 0, "%d (%s)", ret, err);
	ck_assert_msg(mig_testvm_new(&o, false, &dst, err, sizeof(err)) == 0, "%s", err);
	ck_assert_ok(mig_testvm_guest(dst, &dst_g));
	ck_assert_ok(mig_guest_zero_known(&dst_g));
	/* the data region received into unfaulted memory of the same size */
	dst_g.regions[1].hva = mem;
	ck_assert_msg(feed_stream(rec.buf, rec.len, err, sizeof(err)) == 0, "destination: %s", err);
	n = mapped_pages(mem, pages);
	ck_assert_msg(n == data, "%" PRIu64 " of %" PRIu64 " pages mapped at the destination; the stream has data for %"
		      PRIu64 ", ZERO records only for the others", n, pages, data);
	n = kvmdirty_bitmap_count(dst_g.regions[1].written, 0, pages);
	ck_assert_msg(n == data, "%" PRIu64 " pages marked written, the stream wrote %" PRIu64, n, data);
	/* page 0 (zero in the stream) as an earlier, refused stream may have left it */
	memset(mem, 0xa5, PAGE);
	kvmdirty_bitmap_set(dst_g.regions[1].written, 0, 1);
	ck_assert_msg(feed_stream(rec.buf, rec.len, err, sizeof(err)) == 0, "destination, again: %s", err);
	for (n = 0; n < PAGE && !mem[n]; n++)
		;
	ck_assert_msg(n == PAGE, "a page written by an earlier stream was not cleared by a ZERO record (byte %" PRIu64
		      " is 0x%x)", n, mem[n]);
	ck_assert_uint_eq(mapped_pages(mem, pages), data + 1);
	mig_guest_release(&dst_g);
	bad_streams_done();
	testvm_unmap(mem, 8 * MIB);
	mig_guest_release(&g);
	mig_testvm_free(tv);
}
END_TEST

/* ---- stats ---- */

/*
 * The source's pause, once vCPU 1 moved on from where the engine last saw
 * it: on two busy CPUs a vCPU thread may not run at all in a short
 * migration, and the test is of what the stats report, not of the host's
 * scheduler.
 */
static struct {
	const struct mig_guest_ops *ops;
	struct testvm *tv;
	uint64_t seen;
} moved;

static uint64_t progress_seen(void *ctx, unsigned int i)
{
	uint64_t p = moved.ops->progress(ctx, i);

	if (i == 1)
		moved.seen = p;
	return p;
}

static void pause_once_moved(void *ctx)
{
	unsigned int i;

	for (i = 0; i < 30000 && mig_testvm_progress(moved.tv, 1) == moved.seen; i++)
		usleep(1000);
	moved.ops->pause(ctx);
}

/* The next line of f into buf; false at the end. */
static bool next_line(FILE *f, char *buf, size_t len)
{
	return fgets(buf, (int)len, f) != NULL;
}

/*
 * Each vCPU's progress in the stats: on every line that reports vCPUs,
 * one entry per vCPU, progress never going back; the compute vCPU (no
 * memory written) moves on while the other dirties; the end line has both
 * speeds and their ratio.
 */
START_TEST(vcpu_progress_reported)
{
	struct mig_testvm_opts o = { .mib = 32, .vcpus = 2, .mode = KVMDIRTY_MODE_DIRTY_RING,
				     .work = { { .kind = MIG_WORK_DIRTY, .mib = 8 }, { .kind = MIG_WORK_COMPUTE } } };
	struct mig_send_opts so = send_opts;
	uint64_t last[2] = { 0, 0 }, first1 = UINT64_MAX, p;
	unsigned int lines = 0, vlines = 0, ends = 0, i;
	static char line[1 << 16];
	struct mig_guest_ops ops;
	struct testvm *tv;
	struct mig_guest g;
	struct mig_result r;
	char err[512];
	FILE *f = tmpfile();
	int ret;

	ck_assert_ptr_nonnull(f);
	ck_assert_msg(mig_testvm_new(&o, true, &tv, err, sizeof(err)) == 0, "source: %s", err);
	ck_assert_ok(mig_testvm_guest(tv, &g));
	ops = *g.ops;
	moved.ops = g.ops;
	moved.tv = tv;
	ops.pause = pause_once_moved;
	ops.progress = progress_seen;
	g.ops = &ops;
	ck_assert_ok(testvm_spawn(tv));
	/* the vCPUs run before the migration (the baseline) and during it */
	usleep(50000);
	so.stats = f;
	so.baseline_ms = 200;
	ret = record_migration(&g, &so, &rec, &r, err, sizeof(err));
	ck_assert_msg(ret == 0, "%d (%s)", ret, err);
	rewind(f);
	while (next_line(f, line, sizeof(line))) {
		char *v = strstr(line, "\"vcpu\":[");

		lines++;
		ck_assert_msg(!strncmp(line, "{\"v\":1,\"type\":\"", 15), "line %u: no version first: %.200s", lines, line);
		if (strstr(line, "\"type\":\"end\"")) {
			double during, before, speed;

			ends++;
			for (i = 0; i < 2; i++) {
				char want[32], *e;

				snprintf(want, sizeof(want), "{\"id\":%u,", i);
				e = v ? strstr(v, want) : NULL;
				ck_assert_msg(e && sscanf(e + strlen(want), "\"during_per_s\":%lf,\"before_per_s\":%lf,\"speed\":%lf",
							  &during, &before, &speed) == 3, "end line without vCPU %u's speeds: %.300s",
					      i, line);
				ck_assert_msg(during - r.vcpu_during[i] < 0.1 && r.vcpu_during[i] - during < 0.1,
					      "vCPU %u: %.1f/s in the stats, %.1f/s in the result", i, during, r.vcpu_during[i]);
			}
			continue;
		}
		if (!v)
			continue;
		vlines++;
		for (i = 0; i < 2; i++) {
			char want[32], *e;

			snprintf(want, sizeof(want), "{\"id\":%u,\"progress\":", i);
			e = strstr(v, want);
			ck_assert_msg(e && sscanf(e + strlen(want), "%" SCNu64, &p) == 1, "line %u lacks vCPU %u: %.300s", lines,
				      i, line);
			ck_assert_msg(p >= last[i], "line %u: vCPU %u's progress went back from %" PRIu64 " to %" PRIu64, lines,
				      i, last[i], p);
			last[i] = p;
			if (i == 1 && first1 == UINT64_MAX)
				first1 = p;
		}
	}
	ck_assert_msg(ends == 1 && vlines >= 2, "%u lines: %u with vCPUs, %u end lines", lines, vlines, ends);
	/* the compute vCPU wrote no memory and still moved on; its mailbox is where the stats read it */
	ck_assert_msg(mig_testvm_progress(tv, 1) > first1 && last[1] <= mig_testvm_progress(tv, 1),
		      "compute vCPU: progress %" PRIu64 " at start, %" PRIu64 " last reported, %" PRIu64 " now", first1,
		      last[1], mig_testvm_progress(tv, 1));
	ck_assert_msg(r.vcpu_during[1] > 0, "compute vCPU: %.1f/s during", r.vcpu_during[1]);
	fclose(f);
	recording_free(&rec);
	mig_guest_release(&g);
	mig_testvm_free(tv);
}
END_TEST

/* A peer that takes whatever comes and never answers. */
static void *swallow(void *p)
{
	char buf[65536];
	int fd = *(int *)p;

	while (read(fd, buf, sizeof(buf)) > 0)
		;
	return NULL;
}

/*
 * A pre-copy that cannot converge (a downtime of 0: no rest fits) ends at
 * its time limit, counted from the start of tracking as total_ms is (the
 * baseline measured before, longer than the limit here, is not part of
 * it); the migration is abandoned, the guest runs on, and the end line
 * still gives each vCPU's speed during pre-copy.
 */
START_TEST(time_limit_from_tracking)
{
	struct mig_testvm_opts o = { .mib = 8, .vcpus = 2, .mode = KVMDIRTY_MODE_CLEAR_LOG,
				     .work = { { .kind = MIG_WORK_DIRTY, .mib = 2 }, { .kind = MIG_WORK_COMPUTE } } };
	struct mig_send_opts so = send_opts;
	static char line[1 << 16], end[1 << 16];
	const char *want = "{\"id\":1,\"during_per_s\":";
	double during = -1;
	struct testvm *tv;
	struct mig_guest g;
	struct mig_result r;
	pthread_t th;
	char err[512], *e;
	uint64_t p;
	FILE *f = tmpfile();
	int sv[2], ret, i;

	ck_assert_ptr_nonnull(f);
	ck_assert_msg(mig_testvm_new(&o, true, &tv, err, sizeof(err)) == 0, "source: %s", err);
	ck_assert_ok(mig_testvm_guest(tv, &g));
	ck_assert_ok(testvm_spawn(tv));
	so.downtime_ms = 0;
	so.force_switchover = false;
	so.max_passes = 100000;
	so.timeout_ms = 1000;
	so.baseline_ms = 1500;
	so.stats = f;
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	ck_assert_int_eq(pthread_create(&th, NULL, swallow, &sv[1]), 0);
	ret = mig_send(&g, sv[0], &so, &r, err, sizeof(err));
	close(sv[0]);
	pthread_join(th, NULL);
	close(sv[1]);
	ck_assert_msg(ret == -ETIME && r.reason && !strcmp(r.reason, "time_limit") && strstr(err, "did not converge"),
		      "%d, reason %s (%s)", ret, r.reason ? r.reason : "none", err);
	ck_assert_msg(r.total_ms >= (double)so.timeout_ms, "pre-copy stopped at its time limit of %" PRIu64
		      " ms after %.1f ms of tracking (%" PRIu64 " passes)", so.timeout_ms, r.total_ms, r.passes);
	ck_assert_msg(r.vcpu_during[1] > 0, "compute vCPU: %.1f/s during pre-copy", r.vcpu_during[1]);
	rewind(f);
	end[0] = 0;
	while (next_line(f, line, sizeof(line)))
		memcpy(end, line, sizeof(line));
	e = strstr(end, want);
	ck_assert_msg(strstr(end, "\"type\":\"end\"") && e && sscanf(e + strlen(want), "%lf", &during) == 1 &&
		      during - r.vcpu_during[1] < 0.1 && r.vcpu_during[1] - during < 0.1,
		      "vCPU 1: %.1f/s in the end line, %.1f/s in the result: %.300s", during, r.vcpu_during[1], end);
	/* never paused: the guest runs on here */
	p = mig_testvm_progress(tv, 1);
	for (i = 0; i < 30000 && mig_testvm_progress(tv, 1) == p; i++)
		usleep(1000);
	ck_assert_msg(mig_testvm_progress(tv, 1) != p, "the source's guest stopped after an abandoned migration");
	fclose(f);
	mig_guest_release(&g);
	mig_testvm_free(tv);
}
END_TEST

/* ---- sessions: keys, sealed records, several connections ---- */

/* A new key file of this process's own, as genkey makes it, and the key from it. */
static void make_key(const char *tag, char *path, size_t len, struct mig_psk *psk)
{
	char err[256];

	snprintf(path, len, "/tmp/kvmdirty-test-%d-%s.key", (int)getpid(), tag);
	unlink(path);
	ck_assert_msg(mig_psk_generate(path, err, sizeof(err)) == 0, "%s", err);
	ck_assert_msg(mig_psk_load(path, psk, err, sizeof(err)) == 0, "%s", err);
}

enum mitm { MITM_NONE, MITM_FLIP, MITM_DROP, MITM_SWAP };

/* A piece the relay holds back. */
struct late {
	struct late *next;
	double due_ms;
	size_t n;
	uint8_t buf[];
};

/*
 * A relay between a source (src, one end of a socket pair) and a
 * destination (dst), which may be late (it takes every piece at once, so
 * the source counts it delivered, and passes it on late_ms later) or a
 * man in the middle: on a sealed connection (the hello and the proof,
 * then sealed records) it flips a byte in record k, drops it, or swaps it
 * with record k + 1.  It can record what the source sent.
 */
struct relay {
	int src, dst;
	bool gone; /* the destination closed: the writer's alone */
	bool sealed;
	enum mitm mitm;
	bool drop_down; /* what the destination sends is swallowed (__atomic: set while it runs) */
	unsigned int k;
	unsigned int late_ms;
	bool record; /* keep what the source sent in rec (the caller frees it) */
	uint8_t *rec;
	size_t rec_len;
	pthread_t up, down, writer;
	/* what a late relay holds: [head .. tail], under lock; done once the source ended */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct late *head, **tail;
	bool done;
};

static double mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static bool relay_read(struct relay *r, void *buf, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t k = read(r->src, (uint8_t *)buf + got, n - got);

		if (k <= 0)
			return false;
		got += (size_t)k;
	}
	if (!r->record)
		return true;
	r->rec = realloc(r->rec, r->rec_len + n);
	memcpy(r->rec + r->rec_len, buf, n);
	r->rec_len += n;
	return true;
}

/* Pass bytes on; once the destination is gone, keep reading so that the source finds out from its answer. */
static void relay_send(struct relay *r, const void *buf, size_t n)
{
	if (!r->gone && send(r->dst, buf, n, MSG_NOSIGNAL) != (ssize_t)n)
		r->gone = true;
}

/* Pass bytes on now, or hold them late_ms. */
static void relay_write(struct relay *r, const void *buf, size_t n)
{
	struct late *l;

	if (!r->late_ms) {
		relay_send(r, buf, n);
		return;
	}
	l = malloc(sizeof(*l) + n);
	l->next = NULL;
	l->due_ms = mono_ms() + r->late_ms;
	l->n = n;
	memcpy(l->buf, buf, n);
	pthread_mutex_lock(&r->lock);
	*r->tail = l;
	r->tail = &l->next;
	pthread_cond_signal(&r->cond);
	pthread_mutex_unlock(&r->lock);
}

static void *relay_late(void *p)
{
	struct relay *r = p;

	pthread_mutex_lock(&r->lock);
	for (;;) {
		struct late *l;
		double wait;

		while (!r->head && !r->done)
			pthread_cond_wait(&r->cond, &r->lock);
		l = r->head;
		if (!l)
			break;
		r->head = l->next;
		if (!r->head)
			r->tail = &r->head;
		pthread_mutex_unlock(&r->lock);
		wait = l->due_ms - mono_ms();
		if (wait > 0)
			usleep((useconds_t)(wait * 1e3));
		relay_send(r, l->buf, l->n);
		free(l);
		pthread_mutex_lock(&r->lock);
	}
	pthread_mutex_unlock(&r->lock);
	shutdown(r->dst, SHUT_WR);
	return NULL;
}

static void *relay_up(void *p)
{
	struct relay *r = p;
	size_t cap = sizeof(struct mig_seal) + MIG_SEAL_MAX + MIG_SEAL_TAG;
	uint8_t *buf = malloc(cap), *held = malloc(cap);
	size_t held_len = 0;
	unsigned int i;

	/* the hello, then (once the destination answered it) the proof */
	if (r->sealed && relay_read(r, buf, sizeof(struct mig_hello)))
		relay_write(r, buf, sizeof(struct mig_hello));
	if (r->sealed && relay_read(r, buf, MIG_PROOF))
		relay_write(r, buf, MIG_PROOF);
	for (i = 0;; i++) {
		size_t n;

		if (r->sealed) {
			struct mig_seal h;

			if (!relay_read(r, &h, sizeof(h)) || h.len > MIG_SEAL_MAX)
				break;
			memcpy(buf, &h, sizeof(h));
			n = sizeof(h) + h.len + MIG_SEAL_TAG;
			if (!relay_read(r, buf + sizeof(h), n - sizeof(h)))
				break;
		} else {
			ssize_t k = read(r->src, buf, 65536);

			if (k <= 0)
				break;
			n = (size_t)k;
		}
		if (r->mitm != MITM_NONE && i == r->k) {
			if (r->mitm == MITM_FLIP) {
				buf[n / 2] ^= 0x10;
			} else if (r->mitm == MITM_SWAP) {
				memcpy(held, buf, n);
				held_len = n;
			}
			if (r->mitm != MITM_FLIP)
				continue;
		}
		relay_write(r, buf, n);
		if (held_len) {
			relay_write(r, held, held_len);
			held_len = 0;
		}
	}
	if (r->late_ms) {
		pthread_mutex_lock(&r->lock);
		r->done = true;
		pthread_cond_signal(&r->cond);
		pthread_mutex_unlock(&r->lock);
	} else {
		shutdown(r->dst, SHUT_WR);
	}
	free(buf);
	free(held);
	return NULL;
}

static void *relay_down(void *p)
{
	struct relay *r = p;
	uint8_t buf[4096];
	ssize_t k;

	while ((k = read(r->dst, buf, sizeof(buf))) > 0) {
		if (__atomic_load_n(&r->drop_down, __ATOMIC_ACQUIRE))
			continue;
		if (send(r->src, buf, (size_t)k, MSG_NOSIGNAL) != k)
			break;
	}
	shutdown(r->src, SHUT_WR);
	return NULL;
}

/* The relay killed: both its connections cut at once, as a link that goes down. */
static void relay_kill(struct relay *r)
{
	shutdown(r->src, SHUT_RDWR);
	shutdown(r->dst, SHUT_RDWR);
}

/* Relay to fd; the source's end of the relay. */
static int relay_start(struct relay *r, int fd)
{
	int sv[2];

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	r->src = sv[1];
	r->dst = fd;
	pthread_mutex_init(&r->lock, NULL);
	pthread_cond_init(&r->cond, NULL);
	r->tail = &r->head;
	if (r->late_ms)
		ck_assert_int_eq(pthread_create(&r->writer, NULL, relay_late, r), 0);
	ck_assert_int_eq(pthread_create(&r->up, NULL, relay_up, r), 0);
	ck_assert_int_eq(pthread_create(&r->down, NULL, relay_down, r), 0);
	return sv[0];
}

static void relay_stop(struct relay *r)
{
	pthread_join(r->up, NULL);
	if (r->late_ms)
		pthread_join(r->writer, NULL);
	shutdown(r->dst, SHUT_RDWR);
	pthread_join(r->down, NULL);
	pthread_mutex_destroy(&r->lock);
	pthread_cond_destroy(&r->cond);
	close(r->src);
	close(r->dst);
}

/* Each connection of a session through a relay of its own, connection 1 late by 100 ms. */
struct lanes_net {
	char addr[128];
	int lfd;
	bool sealed;
	struct relay relay[MIG_MAX_CONNS];
	unsigned int n;
};

static int lanes_connect(void *ctx, char *err, size_t len)
{
	struct lanes_net *ln = ctx;
	struct relay *r = &ln->relay[ln->n];
	int fd = mig_connect(ln->addr, 10000, err, len);

	if (fd < 0)
		return fd;
	/* ln->n 0: the session's connection 1 */
	*r = (struct relay){ .sealed = ln->sealed, .late_ms = ln->n == 0 ? 100 : 0 };
	fd = relay_start(r, fd);
	/* published: a chaos thread may take the relay from here */
	__atomic_store_n(&ln->n, ln->n + 1, __ATOMIC_RELEASE);
	return fd;
}

static int lanes_accept(void *ctx, uint64_t timeout_ms, char *err, size_t len)
{
	struct lanes_net *ln = ctx;
	struct pollfd pfd = { .fd = ln->lfd, .events = POLLIN };
	int n = poll(&pfd, 1, timeout_ms > INT_MAX ? INT_MAX : (int)timeout_ms);

	/* within the destination's wait, as a listener does: a join refused is not waited for ever */
	if (n == 0) {
		snprintf(err, len, "no connection within %" PRIu64 " ms", timeout_ms);
		return -ETIMEDOUT;
	}
	return mig_accept(ln->lfd, err, len);
}

struct receiving {
	const struct mig_guest *g;
	struct mig_recv_opts o;
	int fd, ret;
	struct mig_recv_result res;
	char err[512];
};

static void *receiving_run(void *p)
{
	struct receiving *rv = p;

	rv->ret = mig_recv(rv->g, rv->fd, &rv->o, &rv->res, rv->err, sizeof(rv->err));
	return NULL;
}

struct lanes_case {
	unsigned int conns;
	enum kvmdirty_mode mode;
	bool psk, encrypt;
	enum mig_compress compress; /* with it, a text-like fill: DATA_Z records among DATA */
};

static const struct lanes_case lanes_cases[] = {
	{ .conns = 2, .mode = KVMDIRTY_MODE_CLEAR_LOG },
	{ .conns = 2, .mode = KVMDIRTY_MODE_DIRTY_RING },
	{ .conns = 3, .mode = KVMDIRTY_MODE_DIRTY_LOG },
	{ .conns = 3, .mode = KVMDIRTY_MODE_CLEAR_LOG, .psk = true },
	{ .conns = 3, .mode = KVMDIRTY_MODE_DIRTY_RING, .psk = true, .encrypt = true },
	{ .conns = 1, .mode = KVMDIRTY_MODE_CLEAR_LOG, .psk = true, .encrypt = true },
	{ .conns = 1, .mode = KVMDIRTY_MODE_CLEAR_LOG, .compress = MIG_COMPRESS_ZSTD },
	{ .conns = 2, .mode = KVMDIRTY_MODE_DIRTY_LOG, .psk = true, .compress = MIG_COMPRESS_ZSTD },
	{ .conns = 3, .mode = KVMDIRTY_MODE_DIRTY_RING, .psk = true, .encrypt = true, .compress = MIG_COMPRESS_AUTO },
};

/*
 * A guest dirtying its working set flat out, over several passes forced
 * (no downtime fits a limit of 0 ms: the first pass never converges), over N connections of which connection 1
 * arrives 100 ms late (its relay takes each piece at once, so the source
 * counts it delivered and goes on with the next pass): copies of a page
 * from several passes are in flight at once, the older ones on the late
 * connection if a page could change connection.  The destination's memory
 * must equal the paused source's, byte for byte, in every region.
 */
/*
 * On the engine's thread, after each pass: until the guest wrote its
 * working set's worth of pages again (5 s at most), so that the next pass
 * has pages to send however the host schedules the guest (beside the
 * engine's and the relays' threads on 2 CPUs it once wrote nothing in pass
 * 1, and pre-copy "converged" after one pass).
 */
static void writes_after_pass(void *ctx, const char *line)
{
	struct testvm *tv = ctx;
	uint64_t w0, w1;
	unsigned int i;

	if (!strstr(line, "\"event\":\"pass_ended\""))
		return;
	w0 = testvm_mailbox(tv, 0)->writes + testvm_mailbox(tv, 1)->writes;
	for (i = 0; i < 5000; i++) {
		w1 = testvm_mailbox(tv, 0)->writes + testvm_mailbox(tv, 1)->writes;
		if (w1 - w0 >= 2048)
			break;
		nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
	}
}

START_TEST(connections_digest_exact)
{
	const struct lanes_case *c = &lanes_cases[_i];
	struct mig_testvm_opts o = { .mib = 32, .vcpus = 2, .mode = c->mode, .ws_mib = 8, .text = c->compress };
	struct mig_send_opts so = send_opts;
	struct lanes_net ln = { .sealed = c->psk };
	struct receiving rv = { 0 };
	struct mig_guest g, dg;
	struct testvm *tv, *dtv;
	struct mig_result r;
	struct mig_psk psk;
	char keypath[128], err[512];
	uint64_t guest_pages = 0;
	pthread_t th;
	unsigned int i;
	int fd, ret;

	make_key("lanes", keypath, sizeof(keypath), &psk);
	ck_assert_msg(mig_testvm_new(&o, false, &dtv, err, sizeof(err)) == 0, "%s", err);
	ck_assert_ok(mig_testvm_guest(dtv, &dg));
	ck_assert_ok(mig_guest_zero_known(&dg));
	tv = running_source(&o, &g);
	make_addr("unix", ln.addr, sizeof(ln.addr));
	ln.lfd = mig_listen(ln.addr, err, sizeof(err));
	ck_assert_msg(ln.lfd >= 0, "%s", err);
	rv.g = &dg;
	/*
	 * No names given: the source names the destination by the address its
	 * first connection reached, and the joins, relayed (their source ends
	 * a socketpair, no address), mean the same one.
	 */
	rv.o = (struct mig_recv_opts){ .timeout_ms = 60000, .psk = c->psk ? &psk : NULL, .encrypt = c->encrypt,
				       .accept = lanes_accept, .accept_ctx = &ln };
	/*
	 * A limit of 0 ms: the first pass, which sends the whole guest, never
	 * converges (its estimate includes the sync's time), then the switch
	 * once the rest is nothing or after max_passes.  A limit of 1 ms let
	 * pre-copy converge after one pass whenever the guest got no CPU
	 * during it (the sync that judges a pass comes before its pass_ended
	 * event, so writes_after_pass() cannot help the first).
	 */
	so.downtime_ms = 0;
	so.force_switchover = true;
	so.max_passes = 4;
	so.psk = c->psk ? &psk : NULL;
	so.encrypt = c->encrypt;
	so.connections = c->conns;
	so.connect = lanes_connect;
	so.connect_ctx = &ln;
	so.event = writes_after_pass;
	so.event_ctx = tv;
	so.compress = c->compress;
	fd = mig_connect(ln.addr, 10000, err, sizeof(err));
	ck_assert_msg(fd >= 0, "%s", err);
	rv.fd = mig_accept(ln.lfd, err, sizeof(err));
	ck_assert_msg(rv.fd >= 0, "%s", err);
	ck_assert_int_eq(pthread_create(&th, NULL, receiving_run, &rv), 0);
	ret = mig_send(&g, fd, &so, &r, err, sizeof(err));
	pthread_join(th, NULL);
	for (i = 0; i < ln.n; i++)
		relay_stop(&ln.relay[i]);
	close(fd);
	close(rv.fd);
	close(ln.lfd);
	drop_addr(ln.addr);
	ck_assert_msg(ret == 0 && rv.ret == 0, "%u connections, mode %d, psk %d, encrypt %d: source %d (%s), "
		      "destination %d (%s)", c->conns, c->mode, c->psk, c->encrypt, ret, err, rv.ret, rv.err);
	ck_assert_uint_eq(ln.n, c->conns - 1);
	ck_assert_uint_eq(r.lost_pages, 0);
	ck_assert(rv.res.hashed);
	for (i = 0; i < g.nr_regions; i++) {
		guest_pages += g.regions[i].size / PAGE;
		ck_assert_msg(!memcmp(g.regions[i].hva, dg.regions[i].hva, g.regions[i].size),
			      "region %u differs between the source and the destination", i);
	}
	/* several passes, pages sent more than once, the destination counted every copy */
	ck_assert_uint_ge(r.passes, 2);
	ck_assert_uint_gt(r.pages, guest_pages);
	ck_assert_uint_eq(rv.res.pages, r.pages);
	/* compressed: the destination took as many pages from DATA_Z records as the source sent so */
	ck_assert_uint_eq(rv.res.zpages, r.zpages);
	ck_assert(c->compress ? r.zpages > 0 && r.zwire_bytes < r.zraw_bytes : r.zpages == 0);
	printf("%u connections, mode %d, psk %d, encrypt %d, compress %d: %" PRIu64 " pages (%" PRIu64
	       " compressed) in %" PRIu64 " passes, %" PRIu64 " records, %.1f MiB on the wire, digest-exact\n", c->conns,
	       c->mode, c->psk, c->encrypt, c->compress, r.pages, r.zpages, r.passes, rv.res.records,
	       r.bytes / 1048576.0);
	mig_guest_release(&dg);
	mig_testvm_free(dtv);
	mig_guest_release(&g);
	mig_testvm_free(tv);
	unlink(keypath);
	mig_psk_clear(&psk);
}
END_TEST

/*
 * Post-copy.  The destination's side runs on a thread: mig_recv() (which
 * returns with pages still at the source), then, while post-copy runs, a
 * read of every page of guest memory from that thread (a VMM thread: each
 * page missing is a fault served over the fault channel), compared with
 * the source's, paused since the switch; then the end of post-copy.
 */
struct pc_dest {
	struct receiving rv;
	struct testvm *tv;
	const struct mig_guest *src; /* the source's guest, paused from the switch on */
	bool read_all;		     /* read and compare every page while post-copy runs */
	uint64_t read_page;	     /* ... else only this page of region 0 (UINT64_MAX: none) */
	int wait_ret;
	struct mig_pc_stats st;
	uint64_t differ; /* pages that differed from the source's */
	uint8_t seen[MIG_PAGE_SIZE]; /* read_page as the destination's reader saw it */
	char why[512];
	struct mig_pc *pub; /* the post-copy, once its recovery listens (__atomic: the chaos thread's) */
};

static void *pc_dest_run(void *p)
{
	struct pc_dest *d = p;
	const struct mig_guest *g = d->rv.g;
	unsigned int i;
	uint64_t k;

	d->rv.ret = mig_recv(g, d->rv.fd, &d->rv.o, &d->rv.res, d->rv.err, sizeof(d->rv.err));
	if (d->rv.ret < 0 || !d->rv.res.pc)
		return NULL;
	if (d->read_page != UINT64_MAX)
		memcpy(d->seen, (uint8_t *)g->regions[0].hva + d->read_page * PAGE, PAGE);
	for (i = 0; d->read_all && i < g->nr_regions; i++)
		for (k = 0; k < g->regions[i].size / PAGE; k++)
			if (memcmp((uint8_t *)g->regions[i].hva + k * PAGE, (uint8_t *)d->src->regions[i].hva + k * PAGE,
				   PAGE))
				d->differ++;
	d->wait_ret = mig_pc_wait(d->rv.res.pc, 60000, d->why, sizeof(d->why));
	mig_pc_get_stats(d->rv.res.pc, &d->st);
	return NULL;
}

struct pc_case {
	unsigned int conns;
	enum kvmdirty_mode mode;
	bool psk, encrypt;
};

static const struct pc_case pc_cases[] = {
	{ .conns = 1, .mode = KVMDIRTY_MODE_CLEAR_LOG },
	{ .conns = 2, .mode = KVMDIRTY_MODE_DIRTY_RING, .psk = true },
	{ .conns = 3, .mode = KVMDIRTY_MODE_DIRTY_LOG, .psk = true, .encrypt = true },
};

/*
 * A guest writing its working set flat out, switched to post-copy after
 * its first pass, the bulk held to 16 MiB/s so that most pages come by
 * faults: every page the destination's reader touches while post-copy
 * runs equals the paused source's, and so does all of memory after it;
 * the source's check finds no page it did not send.
 */
START_TEST(postcopy_exact)
{
	const struct pc_case *c = &pc_cases[_i];
	struct mig_testvm_opts o = { .mib = 32, .vcpus = 2, .mode = c->mode, .ws_mib = 16 };
	struct mig_send_opts so = send_opts;
	struct lanes_net ln = { .sealed = c->psk };
	struct pc_dest d = { .read_all = true, .read_page = UINT64_MAX };
	struct mig_guest g, dg;
	struct testvm *tv, *dtv;
	struct mig_result r;
	struct mig_psk psk;
	char keypath[128], err[512];
	pthread_t th;
	unsigned int i;
	int fd, ret;

	make_key("postcopy", keypath, sizeof(keypath), &psk);
	ck_assert_msg(mig_testvm_new(&o, false, &dtv, err, sizeof(err)) == 0, "%s", err);
	ck_assert_ok(mig_testvm_guest(dtv, &dg));
	ck_assert_ok(mig_guest_zero_known(&dg));
	tv = running_source(&o, &g);
	make_addr("unix", ln.addr, sizeof(ln.addr));
	ln.lfd = mig_listen(ln.addr, err, sizeof(err));
	ck_assert_msg(ln.lfd >= 0, "%s", err);
	d.rv.g = &dg;
	d.src = &g;
	d.rv.o = (struct mig_recv_opts){ .timeout_ms = 60000, .psk = c->psk ? &psk : NULL, .encrypt = c->encrypt,
					 .accept = lanes_accept, .accept_ctx = &ln, .postcopy = true };
	so.downtime_ms = 0;
	so.postcopy = true;
	so.postcopy_after = 1;
	so.max_bandwidth = 16;
	so.psk = c->psk ? &psk : NULL;
	so.encrypt = c->encrypt;
	so.connections = c->conns;
	so.connect = lanes_connect;
	so.connect_ctx = &ln;
	fd = mig_connect(ln.addr, 10000, err, sizeof(err));
	ck_assert_msg(fd >= 0, "%s", err);
	d.rv.fd = mig_accept(ln.lfd, err, sizeof(err));
	ck_assert_msg(d.rv.fd >= 0, "%s", err);
	ck_assert_int_eq(pthread_create(&th, NULL, pc_dest_run, &d), 0);
	ret = mig_send(&g, fd, &so, &r, err, sizeof(err));
	pthread_join(th, NULL);
	for (i = 0; i < ln.n; i++)
		relay_stop(&ln.relay[i]);
	close(fd);
	close(d.rv.fd);
	close(ln.lfd);
	drop_addr(ln.addr);
	ck_assert_msg(ret == 0 && d.rv.ret == 0 && d.wait_ret == 0,
		      "%u connections, mode %d: source %d (%s), destination %d (%s), post-copy %d (%s)", c->conns, c->mode,
		      ret, err, d.rv.ret, d.rv.err, d.wait_ret, d.why);
	ck_assert_msg(r.postcopy && d.rv.res.pc, "no post-copy: %s", r.reason);
	ck_assert_uint_eq(r.lost_pages, 0);
	ck_assert_msg(d.differ == 0, "%" PRIu64 " pages read during post-copy differ from the source's", d.differ);
	for (i = 0; i < g.nr_regions; i++)
		ck_assert_msg(!memcmp(g.regions[i].hva, dg.regions[i].hva, g.regions[i].size),
			      "region %u differs between the source and the destination", i);
	ck_assert_uint_gt(d.st.left, 0);
	ck_assert_uint_gt(d.st.faults, 0);
	ck_assert_uint_eq(d.st.placed, d.st.left);
	ck_assert_uint_eq(r.postcopy_pages, d.st.left);
	printf("post-copy, %u connections, mode %d, psk %d: %" PRIu64 " pages left, %" PRIu64 " faults, %" PRIu64
	       " requests answered, %" PRIu64 " sent behind them, switch pause %.1f ms, exact\n", c->conns, c->mode,
	       c->psk, d.st.left, d.st.faults, r.postcopy_requests, r.postcopy_bulk, r.switch_pause_ms);
	mig_pc_free(d.rv.res.pc);
	mig_guest_release(&dg);
	mig_testvm_free(dtv);
	mig_guest_release(&g);
	mig_testvm_free(tv);
	unlink(keypath);
	mig_psk_clear(&psk);
}
END_TEST

/*
 * The fault channel (the session's last connection) through a relay that
 * flips a byte of the first piece after its hello: an answer's bytes.
 */
static int flip_connect(void *ctx, char *err, size_t len)
{
	struct lanes_net *ln = ctx;
	struct relay *r = &ln->relay[ln->n];
	int fd = mig_connect(ln->addr, 10000, err, len);

	if (fd < 0)
		return fd;
	*r = (struct relay){ .mitm = MITM_FLIP, .k = 1 };
	ln->n++;
	return relay_start(r, fd);
}

static unsigned int pauses;

static void counting_pause(void *ctx)
{
	__atomic_fetch_add(&pauses, 1, __ATOMIC_RELAXED);
	mig_testvm_pause(ctx);
}

/*
 * A copy damaged on the fault channel (a plain session: nothing seals
 * it) is never placed: the first answer's bytes flipped, post-copy fails,
 * the destination's guest is paused, and the reader waiting on that page
 * gets zeroes, not the damaged copy nor a wait for ever.
 */
START_TEST(postcopy_damaged_page_never_placed)
{
	struct mig_testvm_opts o = { .mib = 16, .vcpus = 1, .mode = KVMDIRTY_MODE_CLEAR_LOG, .ws_mib = 8 };
	struct mig_send_opts so = send_opts;
	struct lanes_net ln = { 0 };
	struct pc_dest d = { 0 };
	struct mig_guest_ops dops;
	struct mig_guest g, dg;
	struct testvm *tv, *dtv;
	struct mig_result r;
	char err[512];
	static const uint8_t zero[MIG_PAGE_SIZE];
	pthread_t th;
	unsigned int i;
	int fd, ret;

	ck_assert_msg(mig_testvm_new(&o, false, &dtv, err, sizeof(err)) == 0, "%s", err);
	ck_assert_ok(mig_testvm_guest(dtv, &dg));
	dops = *dg.ops;
	dops.pause = counting_pause;
	dg.ops = &dops;
	pauses = 0;
	tv = running_source(&o, &g);
	make_addr("unix", ln.addr, sizeof(ln.addr));
	ln.lfd = mig_listen(ln.addr, err, sizeof(err));
	ck_assert_msg(ln.lfd >= 0, "%s", err);
	d.rv.g = &dg;
	d.src = &g;
	/* every page read while post-copy runs (the bulk, at 1 MiB/s, is far behind): the first fault's answer is flipped */
	d.read_all = true;
	d.read_page = UINT64_MAX;
	d.rv.o = (struct mig_recv_opts){ .timeout_ms = 60000, .accept = lanes_accept, .accept_ctx = &ln,
					 .postcopy = true };
	so.downtime_ms = 0;
	so.postcopy = true;
	so.postcopy_after = 1;
	so.max_bandwidth = 1;
	so.connect = flip_connect;
	so.connect_ctx = &ln;
	fd = mig_connect(ln.addr, 10000, err, sizeof(err));
	ck_assert_msg(fd >= 0, "%s", err);
	d.rv.fd = mig_accept(ln.lfd, err, sizeof(err));
	ck_assert_msg(d.rv.fd >= 0, "%s", err);
	ck_assert_int_eq(pthread_create(&th, NULL, pc_dest_run, &d), 0);
	ret = mig_send(&g, fd, &so, &r, err, sizeof(err));
	pthread_join(th, NULL);
	/* the destination failed: the source hears no ALL_IN and keeps what it has */
	ck_assert_msg(ret < 0, "the source completed a post-copy whose copy was damaged");
	ck_assert_msg(d.rv.ret == 0 && d.rv.res.pc, "destination: %d (%s)", d.rv.ret, d.rv.err);
	ck_assert_msg(d.wait_ret == -EIO || d.wait_ret == -EPROTO, "post-copy: %d (%s)", d.wait_ret, d.why);
	ck_assert_msg(d.st.failed && __atomic_load_n(&pauses, __ATOMIC_RELAXED) >= 1,
		      "failed %d, the guest paused %u times", d.st.failed, pauses);
	/* no page holds anything but the source's copy or zeroes: the damaged copy was never placed */
	for (i = 0; i < g.nr_regions; i++) {
		uint64_t k;

		for (k = 0; k < g.regions[i].size / PAGE; k++) {
			const uint8_t *p = (uint8_t *)dg.regions[i].hva + k * PAGE;

			ck_assert_msg(!memcmp(p, (uint8_t *)g.regions[i].hva + k * PAGE, PAGE) || !memcmp(p, zero, PAGE),
				      "region %u page %" PRIu64 " holds neither the source's copy nor zeroes", i, k);
		}
	}
	ck_assert_uint_gt(d.differ, 0); /* the reader met the failure: zeroes where the source has data */
	printf("post-copy, a damaged copy: %s; the guest paused, the reader got zeroes\n", d.why);
	mig_pc_free(d.rv.res.pc);
	for (i = 0; i < ln.n; i++)
		relay_stop(&ln.relay[i]);
	close(fd);
	close(d.rv.fd);
	close(ln.lfd);
	drop_addr(ln.addr);
	mig_guest_release(&dg);
	mig_testvm_free(dtv);
	mig_guest_release(&g);
	mig_testvm_free(tv);
}
END_TEST

/*
 * Recovery.  Where post-copy is cut: a lane's relay killed mid-bulk (the
 * other lane late by 100 ms, as in every session here), the fault
 * channel's killed mid-fault, and the fault channel's answers from the
 * destination swallowed until every page is in, then killed (the source
 * never heard ALL_IN).  Each time the source dials a new session
 * (lanes_connect: relayed), the destination takes it on its listener,
 * and post-copy goes on: every page read while it ran, and all of memory
 * after, equals the paused source's; no page the destination had is
 * counted placed twice.
 */
enum pc_cut { CUT_MID_BULK, CUT_MID_FAULT, CUT_AFTER_ALL_IN };

struct pc_recovery_case {
	enum pc_cut cut;
	bool psk;
};

static const struct pc_recovery_case pc_recovery_cases[] = {
	{ CUT_MID_BULK, false },
	{ CUT_MID_FAULT, false },
	{ CUT_AFTER_ALL_IN, false },
	{ CUT_MID_FAULT, true },
};

struct chaos {
	struct pc_dest *d;
	struct lanes_net *ln;
	enum pc_cut cut;
	bool done, cut_made;
	struct mig_session_opts so;
	const struct mig_psk *psk;
};

static struct mig_pc *dest_pc(struct pc_dest *d)
{
	return __atomic_load_n(&d->pub, __ATOMIC_ACQUIRE);
}

static void *chaos_run(void *p)
{
	struct chaos *c = p;
	/* the first session: relay 0 is connection 1 (a lane), relay 1 connection 2 (the fault channel) */
	struct relay *lane = &c->ln->relay[0], *fault = &c->ln->relay[1];
	struct mig_pc_stats st;
	struct mig_pc *pc;
	int i;

	for (i = 0; i < 60000 && (!(pc = dest_pc(c->d)) || __atomic_load_n(&c->ln->n, __ATOMIC_ACQUIRE) < 2) &&
		    !__atomic_load_n(&c->done, __ATOMIC_ACQUIRE); i++)
		usleep(1000);
	if (!pc || __atomic_load_n(&c->ln->n, __ATOMIC_ACQUIRE) < 2)
		return NULL;
	if (c->cut == CUT_AFTER_ALL_IN)
		__atomic_store_n(&fault->drop_down, true, __ATOMIC_RELEASE);
	for (i = 0; i < 60000 && !__atomic_load_n(&c->done, __ATOMIC_ACQUIRE); i++) {
		mig_pc_get_stats(pc, &st);
		if ((c->cut == CUT_MID_BULK && st.placed > st.left / 4) || (c->cut == CUT_MID_FAULT && st.faults > 20) ||
		    (c->cut == CUT_AFTER_ALL_IN && st.complete)) {
			relay_kill(c->cut == CUT_MID_BULK ? lane : fault);
			__atomic_store_n(&c->cut_made, true, __ATOMIC_RELEASE);
			break;
		}
		usleep(1000);
	}
	return NULL;
}

static void *pc_dest_listening(void *p)
{
	struct chaos *c = p;
	struct pc_dest *d = c->d;
	const struct mig_guest *g = d->rv.g;
	struct mig_pc *pc;
	unsigned int i;
	uint64_t k;

	d->rv.ret = mig_recv(g, d->rv.fd, &d->rv.o, &d->rv.res, d->rv.err, sizeof(d->rv.err));
	pc = d->rv.res.pc;
	if (d->rv.ret < 0 || !pc)
		return NULL;
	/* the recovery's listener: the test's listening socket, a copy */
	ck_assert_int_eq(mig_pc_listen(pc, fcntl(c->ln->lfd, F_DUPFD_CLOEXEC, 0), &c->so, c->psk), 0);
	__atomic_store_n(&d->pub, pc, __ATOMIC_RELEASE);
	for (i = 0; i < g->nr_regions; i++)
		for (k = 0; k < g->regions[i].size / PAGE; k++)
			if (memcmp((uint8_t *)g->regions[i].hva + k * PAGE, (uint8_t *)d->src->regions[i].hva + k * PAGE,
				   PAGE))
				d->differ++;
	d->wait_ret = mig_pc_wait(pc, 60000, d->why, sizeof(d->why));
	mig_pc_get_stats(pc, &d->st);
	return NULL;
}

START_TEST(postcopy_recovers)
{
	const struct pc_recovery_case *c = &pc_recovery_cases[_i];
	struct mig_testvm_opts o = { .mib = 32, .vcpus = 2, .mode = KVMDIRTY_MODE_CLEAR_LOG, .ws_mib = 16 };
	struct mig_send_opts so = send_opts;
	struct lanes_net ln = { .sealed = c->psk };
	struct pc_dest d = { .read_all = true, .read_page = UINT64_MAX };
	struct chaos ch = { .d = &d, .ln = &ln, .cut = c->cut };
	struct mig_guest g, dg;
	struct testvm *tv, *dtv;
	struct mig_result r;
	struct mig_psk psk;
	char keypath[128], err[512];
	pthread_t th, cth;
	unsigned int i;
	int fd, ret;

	make_key("pcrec", keypath, sizeof(keypath), &psk);
	ck_assert_msg(mig_testvm_new(&o, false, &dtv, err, sizeof(err)) == 0, "%s", err);
	ck_assert_ok(mig_testvm_guest(dtv, &dg));
	ck_assert_ok(mig_guest_zero_known(&dg));
	tv = running_source(&o, &g);
	make_addr("unix", ln.addr, sizeof(ln.addr));
	ln.lfd = mig_listen(ln.addr, err, sizeof(err));
	ck_assert_msg(ln.lfd >= 0, "%s", err);
	d.rv.g = &dg;
	d.src = &g;
	d.rv.o = (struct mig_recv_opts){ .timeout_ms = 60000, .psk = c->psk ? &psk : NULL, .accept = lanes_accept,
					 .accept_ctx = &ln, .postcopy = true };
	mig_recv_session_opts(&d.rv.o, &ch.so);
	ch.psk = c->psk ? &psk : NULL;
	so.downtime_ms = 0;
	so.postcopy = true;
	so.postcopy_after = 1;
	so.max_bandwidth = 16;
	so.psk = c->psk ? &psk : NULL;
	so.connections = 2;
	so.connect = lanes_connect;
	so.connect_ctx = &ln;
	fd = mig_connect(ln.addr, 10000, err, sizeof(err));
	ck_assert_msg(fd >= 0, "%s", err);
	d.rv.fd = mig_accept(ln.lfd, err, sizeof(err));
	ck_assert_msg(d.rv.fd >= 0, "%s", err);
	ck_assert_int_eq(pthread_create(&th, NULL, pc_dest_listening, &ch), 0);
	ck_assert_int_eq(pthread_create(&cth, NULL, chaos_run, &ch), 0);
	ret = mig_send(&g, fd, &so, &r, err, sizeof(err));
	pthread_join(th, NULL);
	__atomic_store_n(&ch.done, true, __ATOMIC_RELEASE);
	pthread_join(cth, NULL);
	ck_assert_msg(ret == 0 && d.rv.ret == 0 && d.wait_ret == 0,
		      "cut %d, psk %d: source %d (%s), destination %d (%s), post-copy %d (%s)", c->cut, c->psk, ret, err,
		      d.rv.ret, d.rv.err, d.wait_ret, d.why);
	ck_assert_msg(ch.cut_made, "the cut never came");
	ck_assert_msg(r.postcopy_recoveries >= 1, "cut %d: no recovery (%" PRIu64 ")", c->cut, r.postcopy_recoveries);
	ck_assert_uint_eq(r.lost_pages, 0);
	ck_assert_msg(d.differ == 0, "%" PRIu64 " pages read during post-copy differ from the source's", d.differ);
	for (i = 0; i < g.nr_regions; i++)
		ck_assert_msg(!memcmp(g.regions[i].hva, dg.regions[i].hva, g.regions[i].size),
			      "region %u differs between the source and the destination", i);
	/* each LEFT page placed once: a recovery sends nothing that was placed */
	ck_assert_uint_eq(d.st.placed, d.st.left);
	printf("post-copy cut %d (psk %d): %" PRIu64 " recoveries, %" PRIu64 " pages left, %" PRIu64 " faults, %" PRIu64
	       " copies passed over, exact\n", c->cut, c->psk, r.postcopy_recoveries, d.st.left, d.st.faults, d.st.dups);
	mig_pc_free(d.rv.res.pc);
	for (i = 0; i < ln.n; i++)
		relay_stop(&ln.relay[i]);
	close(fd);
	close(d.rv.fd);
	close(ln.lfd);
	drop_addr(ln.addr);
	mig_guest_release(&dg);
	mig_testvm_free(dtv);
	mig_guest_release(&g);
	mig_testvm_free(tv);
	unlink(keypath);
	mig_psk_clear(&psk);
}
END_TEST

/* The source's events: post-copy asked for through its status once its first pass ended. */
static void ask_postcopy_at_pass(void *ctx, const char *line)
{
	if (strstr(line, "\"event\":\"pass_ended\""))
		mig_status_postcopy_start(ctx, NULL, 0);
}

/*
 * Post-copy asked for when the switch leaves nothing (a guest whose vCPUs
 * never ran, the switch asked once its first pass sent every page): both
 * ends agree that nothing is missing.  The destination takes the guest
 * whole, the source returns with post-copy's switch and no page left.  Before, the source
 * waited for an ALL_IN that a destination with nothing missing never
 * sends, then dialled a recovery for ever.
 */
START_TEST(postcopy_nothing_left)
{
	struct mig_testvm_opts o = { .mib = 8, .vcpus = 1, .mode = KVMDIRTY_MODE_CLEAR_LOG, .ws_mib = 0 };
	struct mig_send_opts so = send_opts;
	struct lanes_net ln = { 0 };
	struct receiving rv = { 0 };
	struct mig_status st;
	struct mig_guest g, dg;
	struct testvm *tv, *dtv;
	struct mig_result r;
	char err[512];
	pthread_t th;
	unsigned int i;
	int fd, ret;

	mig_status_init(&st, false);
	ck_assert_msg(mig_testvm_new(&o, false, &dtv, err, sizeof(err)) == 0, "%s", err);
	ck_assert_ok(mig_testvm_guest(dtv, &dg));
	ck_assert_ok(mig_guest_zero_known(&dg));
	/* the source's vCPUs never run: nothing is dirtied after the first pass read it */
	ck_assert_msg(mig_testvm_new(&o, true, &tv, err, sizeof(err)) == 0, "source: %s", err);
	mig_testvm_fill(tv, 16);
	ck_assert_ok(mig_testvm_guest(tv, &g));
	make_addr("unix", ln.addr, sizeof(ln.addr));
	ln.lfd = mig_listen(ln.addr, err, sizeof(err));
	ck_assert_msg(ln.lfd >= 0, "%s", err);
	rv.g = &dg;
	rv.o = (struct mig_recv_opts){ .timeout_ms = 10000, .accept = lanes_accept, .accept_ctx = &ln, .postcopy = true };
	so.postcopy = true;
	so.status = &st;
	so.event = ask_postcopy_at_pass;
	so.event_ctx = &st;
	so.connect = lanes_connect;
	so.connect_ctx = &ln;
	fd = mig_connect(ln.addr, 10000, err, sizeof(err));
	ck_assert_msg(fd >= 0, "%s", err);
	rv.fd = mig_accept(ln.lfd, err, sizeof(err));
	ck_assert_msg(rv.fd >= 0, "%s", err);
	ck_assert_int_eq(pthread_create(&th, NULL, receiving_run, &rv), 0);
	ret = mig_send(&g, fd, &so, &r, err, sizeof(err));
	pthread_join(th, NULL);
	ck_assert_msg(ret == 0 && rv.ret == 0, "source %d (%s), destination %d (%s)", ret, err, rv.ret, rv.err);
	ck_assert_msg(r.postcopy && r.postcopy_why && !strcmp(r.postcopy_why, "asked"), "the switch: %s, why %s",
		      r.postcopy ? "post-copy" : "none", r.postcopy_why ? r.postcopy_why : "-");
	ck_assert_uint_eq(r.postcopy_pages, 0);
	ck_assert_msg(!rv.res.pc, "the destination waits for pages the source left none of");
	ck_assert_uint_eq(r.lost_pages, 0);
	for (i = 0; i < g.nr_regions; i++)
		ck_assert_msg(!memcmp(g.regions[i].hva, dg.regions[i].hva, g.regions[i].size),
			      "region %u differs between the source and the destination", i);
	for (i = 0; i < ln.n; i++)
		relay_stop(&ln.relay[i]);
	close(fd);
	close(rv.fd);
	close(ln.lfd);
	drop_addr(ln.addr);
	mig_guest_release(&dg);
	mig_testvm_free(dtv);
	mig_guest_release(&g);
	mig_testvm_free(tv);
	mig_status_destroy(&st);
}
END_TEST

/* A destination that did not agree to post-copy refuses the session by name; the guest runs on at the source. */
START_TEST(postcopy_refused_unasked)
{
	struct mig_testvm_opts o = { .mib = 8, .vcpus = 1, .mode = KVMDIRTY_MODE_CLEAR_LOG, .ws_mib = 2 };
	struct mig_send_opts so = send_opts;
	struct lanes_net ln = { 0 };
	struct receiving rv = { 0 };
	struct mig_guest g, dg;
	struct testvm *tv, *dtv;
	struct mig_result r;
	char err[512];
	pthread_t th;
	int fd, ret;

	ck_assert_msg(mig_testvm_new(&o, false, &dtv, err, sizeof(err)) == 0, "%s", err);
	ck_assert_ok(mig_testvm_guest(dtv, &dg));
	tv = running_source(&o, &g);
	make_addr("unix", ln.addr, sizeof(ln.addr));
	ln.lfd = mig_listen(ln.addr, err, sizeof(err));
	rv.g = &dg;
	rv.o = (struct mig_recv_opts){ .timeout_ms = 10000, .accept = lanes_accept, .accept_ctx = &ln };
	so.postcopy = true;
	so.connect = lanes_connect;
	so.connect_ctx = &ln;
	fd = mig_connect(ln.addr, 10000, err, sizeof(err));
	rv.fd = mig_accept(ln.lfd, err, sizeof(err));
	ck_assert_int_eq(pthread_create(&th, NULL, receiving_run, &rv), 0);
	ret = mig_send(&g, fd, &so, &r, err, sizeof(err));
	pthread_join(th, NULL);
	ck_assert_msg(ret < 0 && r.outcome == MIG_OUTCOME_HERE && rv.ret < 0, "source %d (%s), destination %d (%s)", ret,
		      err, rv.ret, rv.err);
	ck_assert_msg(strstr(rv.err, "post-copy") && strstr(err, "post-copy"), "source: %s; destination: %s", err,
		      rv.err);
	ck_assert_ok(mig_testvm_check_running(tv, 200, err, sizeof(err)));
	close(fd);
	close(rv.fd);
	close(ln.lfd);
	drop_addr(ln.addr);
	mig_guest_release(&dg);
	mig_testvm_free(dtv);
	mig_guest_release(&g);
	mig_testvm_free(tv);
}
END_TEST

/* A session's connection 1 through a man in the middle who flips a byte of its sealed record 3. */
struct mitm_net {
	const char *addr;
	struct relay r;
	bool used;
};

static int mitm_connect(void *ctx, char *err, size_t len)
{
	struct mitm_net *m = ctx;
	int fd = mig_connect(m->addr, 10000, err, len);

	if (fd < 0)
		return fd;
	m->r = (struct relay){ .sealed = true, .mitm = MITM_FLIP, .k = 3 };
	m->used = true;
	return relay_start(&m->r, fd);
}

/* One attempt at the listener through a relay: mig_send's result and reason. */
static int attempt(const struct mig_guest *g, const char *addr, const struct mig_send_opts *so, struct relay *r,
		   char *err, size_t len)
{
	struct mig_result res;
	int fd = mig_connect(addr, 10000, err, len), ret;

	ck_assert_msg(fd >= 0, "%s", err);
	if (r)
		fd = relay_start(r, fd);
	ret = mig_send(g, fd, so, &res, err, len);
	close(fd);
	if (r)
		relay_stop(r);
	return ret;
}

/*
 * A listener with a key (and --once) before the real source: a source
 * without a key, one with another key, a man in the middle who flips a
 * byte of a sealed record, drops one or swaps two, a recorded session
 * played again, and a byte flipped on the second connection of two.  Each is refused with one line naming authentication,
 * the guest never runs from any of them, --once does not end the
 * listener, and the real source then moves the guest.
 */
START_TEST(authentication_refused)
{
	struct mig_testvm_opts o = { .mib = 16, .vcpus = 1, .mode = KVMDIRTY_MODE_CLEAR_LOG, .ws_mib = 4 };
	struct mig_send_opts plain = send_opts, keyed = send_opts, other = send_opts;
	struct mig_psk psk, psk_b;
	char keypath[128], keypath_b[128], addr[128], err[512], logpath[128], line[512];
	char mib[32], vcpus[32];
	struct relay r;
	struct mig_guest g;
	struct testvm *tv;
	unsigned int refused = 0;
	FILE *log;
	int logfd, fd, ret;
	pid_t pid;

	make_key("real", keypath, sizeof(keypath), &psk);
	make_key("other", keypath_b, sizeof(keypath_b), &psk_b);
	keyed.psk = &psk;
	keyed.encrypt = true;
	other.psk = &psk_b;
	other.encrypt = true;
	/* a relay's end has no address to name the destination by (session version 2): --name / --peer-name */
	keyed.peer_name = "auth-dest";
	other.peer_name = "auth-dest";
	make_addr("tcp", addr, sizeof(addr));
	snprintf(logpath, sizeof(logpath), "/tmp/kvmdirty-test-%d-listener.log", (int)getpid());
	logfd = open(logpath, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	ck_assert_int_ge(logfd, 0);
	snprintf(mib, sizeof(mib), "%" PRIu64, o.mib);
	snprintf(vcpus, sizeof(vcpus), "%u", o.vcpus);
	{
		char *args[] = { "listen", addr, "-m", mib, "-v", vcpus, "--run-ms", "300", "-T", "10000", "--once",
				 "--psk", keypath, "--encrypt", "--name", "auth-dest", NULL };

		pid = spawn_migrate(args, logfd);
	}
	close(logfd);
	fd = connect_retry(addr, pid, err, sizeof(err)); /* the listener is up: this one says nothing and goes */
	close(fd);
	tv = running_source(&o, &g);

	ret = attempt(&g, addr, &plain, NULL, err, sizeof(err));
	ck_assert_msg(ret < 0 && strstr(err, "authentication"), "no key: %d (%s)", ret, err);
	ret = attempt(&g, addr, &other, NULL, err, sizeof(err));
	ck_assert_msg(ret == -EACCES && strstr(err, "authentication failed"), "another key: %d (%s)", ret, err);
	r = (struct relay){ .sealed = true, .mitm = MITM_FLIP, .k = 3, .record = true };
	ret = attempt(&g, addr, &keyed, &r, err, sizeof(err));
	ck_assert_msg(ret < 0, "flipped byte: accepted");
	/* what the source sent, before the flip: a whole hello, proof and records */
	{
		struct feeder f = { .buf = r.rec, .len = r.rec_len };
		pthread_t th;

		fd = mig_connect(addr, 10000, err, sizeof(err));
		ck_assert_msg(fd >= 0, "%s", err);
		f.fd = fd;
		ck_assert_int_eq(pthread_create(&th, NULL, feed, &f), 0);
		pthread_join(th, NULL);
		close(fd);
		free(r.rec);
	}
	r = (struct relay){ .sealed = true, .mitm = MITM_DROP, .k = 3 };
	ret = attempt(&g, addr, &keyed, &r, err, sizeof(err));
	ck_assert_msg(ret < 0, "dropped record: accepted");
	r = (struct relay){ .sealed = true, .mitm = MITM_SWAP, .k = 3 };
	ret = attempt(&g, addr, &keyed, &r, err, sizeof(err));
	ck_assert_msg(ret < 0, "swapped records: accepted");
	/* two connections, the second tampered with: the destination says which, and the source hears it */
	{
		struct mitm_net m = { .addr = addr };
		struct mig_send_opts two = keyed;

		two.connections = 2;
		two.connect = mitm_connect;
		two.connect_ctx = &m;
		ret = attempt(&g, addr, &two, NULL, err, sizeof(err));
		if (m.used)
			relay_stop(&m.r);
		ck_assert_msg(ret < 0 && strstr(err, "destination refused: connection 1: ") &&
				      strstr(err, "authentication: sealed record 3 on connection 1 failed its check"),
			      "connection 1 tampered with: %d (%s)", ret, err);
	}
	/* the real source, the guest still running here after all that */
	ret = attempt(&g, addr, &keyed, NULL, err, sizeof(err));
	ck_assert_msg(ret == 0, "the real source: %d (%s)", ret, err);
	ck_assert_int_eq(child_status(pid), 0);

	/* the listener's account: a line each, naming authentication and what was wrong */
	log = fopen(logpath, "r");
	ck_assert_ptr_nonnull(log);
	{
		/*
		 * Session version 2: a handshake's failure is the gate's, logged
		 * "connection refused: from ADDR: ..."; a session's, once its
		 * records flow, "stream refused, waiting for another: ...".
		 */
		static const char *const gate = "destination: connection refused: from 127.0.0.1:";
		static const char *const stream = "destination: stream refused, waiting for another: ";
		static const struct {
			const char *how, *what;
		} says[] = {
			{ gate, "authentication: the peer closed without a word" }, /* the first connection, to see it listens */
			{ gate, "authentication: the peer sent a stream without a key" },
			/* another key: the destination proves first, the source goes without a proof of its own */
			{ gate, "awaiting authentication: the peer's proof of the key: the connection ended" },
			{ stream, "authentication: sealed record 3 on connection 0 failed its check" },
			{ gate, "authentication failed on connection 0: the peer does not prove that it holds the key "
				"(a wrong key, or a recorded session played again)" },
			{ stream, "authentication: sealed record 3 on connection 0 failed its check" },
			{ stream, "authentication: sealed record 3 on connection 0 failed its check" },
			{ stream, "authentication: sealed record 3 on connection 1 failed its check" },
		};

		while (fgets(line, sizeof(line), log)) {
			bool ok = refused < sizeof(says) / sizeof(says[0]) && strstr(line, says[refused].how) &&
				  strstr(line, says[refused].what);

			ck_assert_msg(ok, "listener line %u: '%s', expected '%s ... %s'", refused, line,
				      refused < sizeof(says) / sizeof(says[0]) ? says[refused].how : "none",
				      refused < sizeof(says) / sizeof(says[0]) ? says[refused].what : "");
			refused++;
		}
		ck_assert_uint_eq(refused, sizeof(says) / sizeof(says[0]));
	}
	fclose(log);
	unlink(logpath);
	unlink(keypath);
	unlink(keypath_b);
	mig_psk_clear(&psk);
	mig_psk_clear(&psk_b);
	mig_guest_release(&g);
	mig_testvm_free(tv);
}
END_TEST

int main(void)
{
	int skip = require_kvm("test-migrate");
	Suite *s;
	TCase *tc;

	if (skip)
		return skip; /* before Check allocates anything: no leak on the way out */
	s = suite_create("migrate");
	tc = tcase_create("migrate");
	signal(SIGPIPE, SIG_IGN);
	tcase_set_timeout(tc, 300);
	tcase_add_loop_test(tc, migrate, 0, (int)(sizeof(cases) / sizeof(cases[0])));
	tcase_add_test(tc, bad_fields);
	tcase_add_test(tc, incomplete_streams);
	tcase_add_test(tc, damaged_pages);
	tcase_add_test(tc, silent_peers);
	tcase_add_test(tc, listener_outlives_bad_peers);
	tcase_add_test(tc, resume_check_bounded);
	tcase_add_test(tc, slow_guest_both_ends_finish);
	tcase_add_test(tc, verify_off_the_downtime);
	tcase_add_test(tc, verify_catches_a_lost_write);
	tcase_add_test(tc, connection_drop);
	tcase_add_test(tc, untouched_never_read);
	tcase_add_test(tc, file_backed_arrives);
	tcase_add_test(tc, dest_leaves_unwritten_alone);
	tcase_add_test(tc, vcpu_progress_reported);
	tcase_add_test(tc, time_limit_from_tracking);
	suite_add_tcase(s, tc);
	/* CK_RUN_CASE=vcpus runs these alone */
	tc = tcase_create("vcpus");
	tcase_set_tags(tc, "scale");
	tcase_set_timeout(tc, 1800);
	tcase_add_loop_test(tc, many_vcpus, 0, 2);
	tcase_add_test(tc, idle_vcpus_sleep);
	suite_add_tcase(s, tc);
	/* CK_RUN_CASE=regions runs these alone */
	tc = tcase_create("regions");
	tcase_set_tags(tc, "scale");
	tcase_set_timeout(tc, 1800);
	tcase_add_loop_test(tc, many_regions, 0, 2);
	suite_add_tcase(s, tc);
	/* CK_RUN_CASE=sessions runs these alone */
	tc = tcase_create("sessions");
	tcase_set_timeout(tc, 300);
	tcase_add_loop_test(tc, connections_digest_exact, 0, (int)(sizeof(lanes_cases) / sizeof(lanes_cases[0])));
	tcase_add_test(tc, authentication_refused);
	suite_add_tcase(s, tc);
	/* CK_RUN_CASE=postcopy runs these alone (a test of its own, threads: TSan too) */
	tc = tcase_create("postcopy");
	tcase_set_tags(tc, "postcopy");
	tcase_set_timeout(tc, 300);
	tcase_add_loop_test(tc, postcopy_exact, 0, (int)(sizeof(pc_cases) / sizeof(pc_cases[0])));
	tcase_add_test(tc, postcopy_damaged_page_never_placed);
	tcase_add_test(tc, postcopy_refused_unasked);
	tcase_add_test(tc, postcopy_nothing_left);
	tcase_add_loop_test(tc, postcopy_recovers, 0, (int)(sizeof(pc_recovery_cases) / sizeof(pc_recovery_cases[0])));
	suite_add_tcase(s, tc);
	return run_suite(s);
}
