// SPDX-License-Identifier: MIT
/*
 * Steering a migration through the daemon's control socket without KVM
 * (lib/migrate/control/daemon.h over a real status): set, each parameter
 * taken and shown by the next query, every bad value refused by name with
 * nothing changed; cancel before the migration begins, refused once COMMIT
 * is on its way, once it is over and at a destination; events in order to
 * subscribers, a subscriber that never reads beside one that reads every
 * event (the one loses, tells it in one events_lost and nothing else; the
 * other loses nothing), and the engine's own fd and callback.  The same
 * against a running migration: tests/test-migrate-steer.c.
 */
#define _GNU_SOURCE /* pipe2 */
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "control-client.h"
#include "daemon.h"
#include "json.h"
#include "test-util.h"

#define EMPTY_REPLY "{\"return\":{}}\n"
#define GENERIC(desc) "{\"error\":{\"class\":\"GenericError\",\"desc\":\"" desc "\"}}\n"

static const struct mig_params start_params = {
	.downtime_ms = 50, .max_passes = 10, .timeout_ms = 60000, .max_bandwidth = 0, .throttle = true
};

static char dir[64], path[96];
static struct mig_daemon d;

static void open_daemon(bool dest)
{
	snprintf(dir, sizeof(dir), "/tmp/kvmdirty-steer-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/ctl.sock", dir);
	ck_assert_int_eq(mig_daemon_init(&d, dest, path, dest ? NULL : &start_params, NULL, NULL), 0);
}

static void setup(void)
{
	signal(SIGPIPE, SIG_IGN);
	open_daemon(false);
}

static void teardown(void)
{
	char cmd[128];

	mig_daemon_fini(&d);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	ck_assert_int_eq(system(cmd), 0);
}

static int client(void)
{
	char line[4096];
	int fd = connect_to(path);

	ck_assert(get_line(fd, line, sizeof(line)));
	ck_assert_ptr_nonnull(strstr(line, "\"QMP\""));
	return fd;
}

static void ask(int fd, const char *request, const char *want)
{
	ck_assert(send_all(fd, request, strlen(request)) && send_all(fd, "\n", 1));
	expect_line(fd, want);
}

/* ---- what query shows ---- */

static double member_num(const struct mig_json *obj, const char *key)
{
	const struct mig_json *v = mig_json_get(obj, key);

	ck_assert_msg(v && v->type == MIG_JSON_NUMBER, "'%s' is not a number", key);
	return v->num;
}

/* The parameters and the cancel state, as the socket's query shows them. */
static void query_params(int fd, struct mig_params *p, char *cancel, size_t len)
{
	const struct mig_json *ret, *par, *thr, *can;
	struct mig_json_error e;
	struct mig_json v;
	char line[MIG_CONTROL_QUERY_SIZE + 64];

	ck_assert(send_all(fd, "{\"execute\":\"query\"}\n", 20));
	ck_assert(get_line(fd, line, sizeof(line)));
	ck_assert_msg(mig_json_parse(line, strlen(line), &v, &e) == 0, "not JSON: %s", line);
	ret = mig_json_get(&v, "return");
	par = mig_json_get(ret, "parameters");
	ck_assert_msg(par && par->type == MIG_JSON_OBJECT, "no parameters in %s", line);
	p->downtime_ms = (uint64_t)member_num(par, "downtime_ms");
	p->max_passes = (uint64_t)member_num(par, "max_passes");
	p->timeout_ms = (uint64_t)member_num(par, "timeout_ms");
	p->max_bandwidth = (uint64_t)member_num(par, "max_bandwidth");
	thr = mig_json_get(par, "throttle");
	ck_assert(thr && (thr->type == MIG_JSON_TRUE || thr->type == MIG_JSON_FALSE));
	p->throttle = thr->type == MIG_JSON_TRUE;
	{
		const struct mig_json *z = mig_json_get(par, "compress");

		ck_assert_msg(z && z->type == MIG_JSON_STRING, "no compress in %s", line);
		p->compress = !strcmp(z->str.s, "auto") ? 1 : !strcmp(z->str.s, "zstd") ? 2 : 0;
		ck_assert_msg(p->compress || !strcmp(z->str.s, "off"), "compress \"%s\"", z->str.s);
	}
	can = mig_json_get(ret, "cancel");
	ck_assert(can && can->type == MIG_JSON_STRING);
	snprintf(cancel, len, "%s", can->str.s);
	mig_json_free(&v);
}

static void expect_params(int fd, const struct mig_params *want)
{
	struct mig_params got;
	char cancel[16];

	query_params(fd, &got, cancel, sizeof(cancel));
	ck_assert_uint_eq(got.downtime_ms, want->downtime_ms);
	ck_assert_uint_eq(got.max_passes, want->max_passes);
	ck_assert_uint_eq(got.timeout_ms, want->timeout_ms);
	ck_assert_uint_eq(got.max_bandwidth, want->max_bandwidth);
	ck_assert_int_eq(got.throttle, want->throttle);
	ck_assert_int_eq(got.compress, want->compress);
}

/* ---- set ---- */

START_TEST(set_each_parameter)
{
	static const struct {
		const char *args;
		size_t member; /* offsetof in struct mig_params */
		uint64_t value;
	} sets[] = {
		{ "{\"downtime_ms\":300}", offsetof(struct mig_params, downtime_ms), 300 },
		{ "{\"max_bandwidth\":40}", offsetof(struct mig_params, max_bandwidth), 40 },
		{ "{\"max_passes\":1}", offsetof(struct mig_params, max_passes), 1 },
		{ "{\"timeout_ms\":86400000}", offsetof(struct mig_params, timeout_ms), 86400000 },
	};
	struct mig_params want = start_params;
	char req[128];
	size_t i;
	int fd = client();

	expect_params(fd, &want);
	/* one at a time, each shown by the next query, the others as they were */
	for (i = 0; i < sizeof(sets) / sizeof(sets[0]); i++) {
		snprintf(req, sizeof(req), "{\"execute\":\"set\",\"arguments\":%s}", sets[i].args);
		ask(fd, req, EMPTY_REPLY);
		*(uint64_t *)((char *)&want + sets[i].member) = sets[i].value;
		expect_params(fd, &want);
	}
	ask(fd, "{\"execute\":\"set\",\"arguments\":{\"throttle\":false}}", EMPTY_REPLY);
	want.throttle = false;
	expect_params(fd, &want);
	ask(fd, "{\"execute\":\"set\",\"arguments\":{\"compress\":\"zstd\"}}", EMPTY_REPLY);
	want.compress = 2;
	expect_params(fd, &want);
	/* several at once, the bounds included */
	ask(fd, "{\"execute\":\"set\",\"arguments\":{\"downtime_ms\":0,\"max_bandwidth\":1048576,\"max_passes\":100000,"
		"\"timeout_ms\":1,\"throttle\":true},\"id\":7}", "{\"return\":{},\"id\":7}\n");
	want = (struct mig_params){ 0, 100000, 1, 1048576, true, 2 };
	expect_params(fd, &want);
	/* the engine's view is the same */
	mig_status_params(&d.st, &want);
	ck_assert_uint_eq(want.max_bandwidth, 1048576);
	ck_assert_uint_eq(want.timeout_ms, 1);
	close(fd);
}
END_TEST

static const struct {
	const char *args, *reply;
} bad_sets[] = {
	{ "{\"downtime_ms\":3600001}", GENERIC("Parameter 'downtime_ms' must be 0 to 3600000, not 3600001") },
	{ "{\"downtime_ms\":-1}", GENERIC("Parameter 'downtime_ms' must be 0 to 3600000, not -1") },
	{ "{\"max_passes\":0}", GENERIC("Parameter 'max_passes' must be 1 to 100000, not 0") },
	{ "{\"timeout_ms\":0}", GENERIC("Parameter 'timeout_ms' must be 1 to 86400000, not 0") },
	{ "{\"max_bandwidth\":1048577}", GENERIC("Parameter 'max_bandwidth' must be 0 to 1048576, not 1048577") },
	{ "{\"max_bandwidth\":1e300}", GENERIC("Parameter 'max_bandwidth' must be 0 to 1048576, not 1.0000000000000001e+300") },
	{ "{\"max_bandwidth\":2.5}", GENERIC("Invalid parameter type for 'max_bandwidth', expected: integer") },
	{ "{\"downtime_ms\":\"5\"}", GENERIC("Invalid parameter type for 'downtime_ms', expected: integer") },
	{ "{\"throttle\":1}", GENERIC("Invalid parameter type for 'throttle', expected: boolean") },
	{ "{\"throttle\":null}", GENERIC("Invalid parameter type for 'throttle', expected: boolean") },
	{ "{\"bandwidth\":5}", GENERIC("Parameter 'bandwidth' is unexpected") },
	{ "{\"downtime_ms\":5,\"downtime_ms\":6}", GENERIC("Parameter 'downtime_ms' is given twice") },
	{ "{}", GENERIC("no parameter given: downtime_ms, max_bandwidth, max_passes, timeout_ms, throttle or compress") },
	{ "{\"compress\":\"lz4\"}", GENERIC("Invalid parameter value for 'compress', expected: auto, zstd or off") },
	{ "{\"compress\":1}", GENERIC("Invalid parameter value for 'compress', expected: auto, zstd or off") },
	/* all or nothing: the good one is not taken either */
	{ "{\"downtime_ms\":7,\"max_passes\":0}", GENERIC("Parameter 'max_passes' must be 1 to 100000, not 0") },
	{ "{\"max_passes\":3,\"throttle\":\"no\"}", GENERIC("Invalid parameter type for 'throttle', expected: boolean") },
};

START_TEST(set_refused_by_name)
{
	char req[256];
	int fd = client();

	snprintf(req, sizeof(req), "{\"execute\":\"set\",\"arguments\":%s}", bad_sets[_i].args);
	ask(fd, req, bad_sets[_i].reply);
	expect_params(fd, &start_params);
	/* no arguments at all */
	ask(fd, "{\"execute\":\"set\"}",
	    GENERIC("no parameter given: downtime_ms, max_bandwidth, max_passes, timeout_ms, throttle or compress"));
	expect_params(fd, &start_params);
	close(fd);
}
END_TEST

START_TEST(destination_refuses_set_and_cancel)
{
	int fd;

	teardown();
	open_daemon(true);
	fd = client();
	ask(fd, "{\"execute\":\"set\",\"arguments\":{\"downtime_ms\":5}}",
	    GENERIC("set is the source's: this is the destination"));
	ask(fd, "{\"execute\":\"cancel\"}",
	    GENERIC("cancel is the source's: this is the destination (a stream its source cancels is dropped here)"));
	close(fd);
}
END_TEST

/* ---- cancel ---- */

static void expect_cancel(int fd, const char *want)
{
	struct mig_params p;
	char cancel[16];

	query_params(fd, &p, cancel, sizeof(cancel));
	ck_assert_str_eq(cancel, want);
}

START_TEST(cancel_before_begin)
{
	int fd = client();

	expect_cancel(fd, "none");
	ask(fd, "{\"execute\":\"cancel\"}", EMPTY_REPLY);
	expect_cancel(fd, "asked");
	/* asked twice: still one cancel */
	ask(fd, "{\"execute\":\"cancel\"}", EMPTY_REPLY);
	ask(fd, "{\"execute\":\"cancel\",\"arguments\":{\"now\":true}}", GENERIC("Parameter 'now' is unexpected"));
	/* the migration that begins is cancelled from its start: the engine sees it, COMMIT is never reached */
	ck_assert_int_eq(mig_status_begin(&d.st, &start_params), 0);
	ck_assert(mig_status_cancel_asked(&d.st));
	ck_assert(!mig_status_commit_point(&d.st));
	mig_status_mark_cancelled(&d.st);
	mig_status_decide(&d.st, MIG_OUTCOME_HERE, "cancelled");
	expect_cancel(fd, "done");
	/* over: nothing to cancel */
	ask(fd, "{\"execute\":\"cancel\"}",
	    "{\"error\":{\"class\":\"NotActive\",\"desc\":\"no migration to cancel: the last one is over (failed)\"}}\n");
	/* the next migration of the status begins afresh: no cancel carried over */
	mig_status_end(&d.st);
	ck_assert_int_eq(mig_status_begin(&d.st, &start_params), 0);
	ck_assert(!mig_status_cancel_asked(&d.st));
	expect_cancel(fd, "none");
	close(fd);
}
END_TEST

/*
 * compress while a migration runs: turned on in one that began without it
 * (its session did not agree) refused by name, nothing changed; off
 * taken; in one that began with it, any mode taken.  Red without the
 * refusal: the set returned {} and the query said "auto" for a session
 * that cannot carry DATA_Z.
 */
START_TEST(set_compress_midway)
{
	struct mig_params want = start_params;
	int fd = client();

	ck_assert_int_eq(mig_status_begin(&d.st, &start_params), 0);
	mig_status_compress_able(&d.st, false);
	ask(fd, "{\"execute\":\"set\",\"arguments\":{\"compress\":\"auto\"}}",
	    GENERIC("compress: this migration began without compression (its session did not agree to it); it applies "
		    "to the next"));
	expect_params(fd, &want);
	ask(fd, "{\"execute\":\"set\",\"arguments\":{\"compress\":\"off\"}}", EMPTY_REPLY);
	expect_params(fd, &want);
	mig_status_decide(&d.st, MIG_OUTCOME_HERE, "failed");
	mig_status_end(&d.st);
	/* the next one begins with it (its session offers it), and may change it as it runs */
	want.compress = 2;
	ck_assert_int_eq(mig_status_begin(&d.st, &want), 0);
	mig_status_compress_able(&d.st, true);
	ask(fd, "{\"execute\":\"set\",\"arguments\":{\"compress\":\"auto\"}}", EMPTY_REPLY);
	want.compress = 1;
	expect_params(fd, &want);
	ask(fd, "{\"execute\":\"set\",\"arguments\":{\"compress\":\"off\"}}", EMPTY_REPLY);
	want.compress = 0;
	expect_params(fd, &want);
	mig_status_decide(&d.st, MIG_OUTCOME_HERE, "failed");
	mig_status_end(&d.st);
	close(fd);
}
END_TEST

START_TEST(cancel_after_commit_refused)
{
	int fd = client();

	ck_assert_int_eq(mig_status_begin(&d.st, &start_params), 0);
	ck_assert(mig_status_commit_point(&d.st));
	ask(fd, "{\"execute\":\"cancel\",\"id\":\"c\"}",
	    "{\"error\":{\"class\":\"CommitSent\",\"desc\":\"COMMIT was sent: the guest's fate is the destination's answer "
	    "(resolve if it never comes)\"},\"id\":\"c\"}\n");
	expect_cancel(fd, "none");
	ck_assert(!mig_status_cancel_asked(&d.st));
	/* unknown, then moved: still refused, by what stands */
	mig_status_unknown(&d.st, -1, "COMMIT sent, awaiting its ACK");
	ask(fd, "{\"execute\":\"cancel\"}",
	    "{\"error\":{\"class\":\"CommitSent\",\"desc\":\"COMMIT was sent: the guest's fate is the destination's answer "
	    "(resolve if it never comes)\"}}\n");
	mig_status_decide(&d.st, MIG_OUTCOME_THERE, "committed");
	ask(fd, "{\"execute\":\"cancel\"}",
	    "{\"error\":{\"class\":\"CommitSent\",\"desc\":\"COMMIT was sent: the guest's fate is the destination's answer "
	    "(resolve if it never comes)\"}}\n");
	close(fd);
}
END_TEST

/* ---- events ---- */

/* Event line: its name and data.n (-1: none); false for anything but an event line. */
static bool event_of(const char *line, char *name, size_t len, int64_t *n)
{
	const struct mig_json *ev, *data, *ts, *num;
	struct mig_json_error e;
	struct mig_json v;
	bool ok;

	if (mig_json_parse(line, strlen(line), &v, &e) < 0)
		return false;
	ev = mig_json_get(&v, "event");
	data = mig_json_get(&v, "data");
	ts = mig_json_get(&v, "timestamp");
	ok = ev && ev->type == MIG_JSON_STRING && data && data->type == MIG_JSON_OBJECT && ts &&
	     mig_json_get(ts, "seconds") && mig_json_get(ts, "microseconds");
	if (ok) {
		snprintf(name, len, "%s", ev->str.s);
		num = mig_json_get(data, strcmp(name, "events_lost") ? "n" : "count");
		*n = num && num->type == MIG_JSON_NUMBER ? (int64_t)num->num : -1;
	}
	mig_json_free(&v);
	return ok;
}

static void expect_event(int fd, int64_t want)
{
	char line[2048], name[64];
	int64_t n;

	ck_assert_msg(get_line(fd, line, sizeof(line)), "closed; expected event %" PRId64, want);
	ck_assert_msg(event_of(line, name, sizeof(name), &n), "not an event: %s", line);
	ck_assert_str_eq(name, "tick");
	ck_assert_int_eq(n, want);
}

START_TEST(events_in_order)
{
	int fd = client(), i;

	/* before subscribing: not for this client */
	mig_status_event(&d.st, "tick", "\"n\":%d", -5);
	ask(fd, "{\"execute\":\"subscribe\"}", EMPTY_REPLY);
	ask(fd, "{\"execute\":\"subscribe\",\"id\":2}", "{\"return\":{},\"id\":2}\n");
	/* as many as are kept: however late the server's thread runs, none is lost */
	for (i = 0; i < MIG_EVENTS_KEPT; i++)
		mig_status_event(&d.st, "tick", "\"n\":%d", i);
	for (i = 0; i < MIG_EVENTS_KEPT; i++)
		expect_event(fd, i);
	mig_status_event(&d.st, "tick", "\"n\":%d", MIG_EVENTS_KEPT);
	expect_event(fd, MIG_EVENTS_KEPT);
	close(fd);
}
END_TEST

/* The reader that keeps up: acknowledges each event, the emitter waits for that. */
static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	int fd;
	int64_t seen; /* the last event it read in order */
	const char *broken;
} fast = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

#define EVENTS 20000

static void *fast_reader(void *p)
{
	char line[2048], name[64];
	int64_t n, i;

	(void)p;
	for (i = 0; i < EVENTS; i++) {
		const char *broken = NULL;

		if (!get_line(fast.fd, line, sizeof(line)))
			broken = "the reading subscriber was closed";
		else if (!event_of(line, name, sizeof(name), &n) || strcmp(name, "tick") || n != i)
			broken = "the reading subscriber got an event out of order, or an events_lost";
		pthread_mutex_lock(&fast.lock);
		fast.broken = broken;
		fast.seen = i;
		pthread_cond_broadcast(&fast.cond);
		pthread_mutex_unlock(&fast.lock);
		if (broken)
			break;
	}
	return NULL;
}

START_TEST(subscriber_that_never_reads)
{
	int slow = client(), n_prefix = 0, n_tail = 0, i;
	char line[2048], name[64];
	int64_t n, next = 0, lost = 0, lost_lines = 0;
	pthread_t t;

	fast.fd = client();
	fast.seen = -1;
	fast.broken = NULL;
	ask(slow, "{\"execute\":\"subscribe\"}", EMPTY_REPLY);
	ask(fast.fd, "{\"execute\":\"subscribe\"}", EMPTY_REPLY);
	ck_assert_int_eq(pthread_create(&t, NULL, fast_reader, NULL), 0);
	for (i = 0; i < EVENTS; i++) {
		/* the emitter never waits for the slow one: only for the fast one to keep the test lossless for it */
		mig_status_event(&d.st, "tick", "\"n\":%d,\"pad\":\"%064d\"", i, 0);
		pthread_mutex_lock(&fast.lock);
		while (fast.seen < i && !fast.broken)
			pthread_cond_wait(&fast.cond, &fast.lock);
		pthread_mutex_unlock(&fast.lock);
		ck_assert_msg(!fast.broken, "%s at event %d", fast.broken, i);
	}
	pthread_join(t, NULL);
	ck_assert_int_eq(fast.seen, EVENTS - 1);
	/* the slow one, now: a prefix in order, one events_lost, the rest in order, every event accounted for */
	while (next + lost < EVENTS) {
		ck_assert_msg(get_line(slow, line, sizeof(line)), "the slow subscriber was dropped at %" PRId64, next);
		ck_assert_msg(event_of(line, name, sizeof(name), &n), "not an event: %s", line);
		if (!strcmp(name, "events_lost")) {
			ck_assert_int_gt(n, 0);
			lost += n;
			lost_lines++;
			continue;
		}
		ck_assert_int_eq(n, next + lost);
		next++;
		if (lost)
			n_tail++;
		else
			n_prefix++;
	}
	ck_assert_int_eq(lost_lines, 1);
	ck_assert_int_gt(n_prefix, 0);
	ck_assert_int_gt(n_tail, 0);
	ck_assert_int_le(n_tail, MIG_EVENTS_KEPT);
	printf("a subscriber that never read: %d events, then %" PRId64 " lost in one events_lost, then the last %d\n",
	       n_prefix, lost, n_tail);
	close(slow);
	close(fast.fd);
}
END_TEST

/* What the sink's reader has of a line not yet whole. */
static char sink_buf[65536];
static size_t have;

/* Lines from fd (non-blocking); each whole line checked as an event, numbered after *next. */
static void drain_sink(int fd, int64_t *next, int64_t *lost, int *lost_lines)
{
	char *buf = sink_buf, name[64];
	ssize_t k;
	int64_t n;

	for (;;) {
		char *nl;

		k = read(fd, buf + have, sizeof(sink_buf) - have - 1);
		if (k <= 0)
			break;
		have += (size_t)k;
		buf[have] = 0;
		while ((nl = strchr(buf, '\n'))) {
			*nl = 0;
			ck_assert_msg(event_of(buf, name, sizeof(name), &n), "not an event: %s", buf);
			if (!strcmp(name, "events_lost")) {
				*lost += n;
				++*lost_lines;
			} else {
				ck_assert_int_eq(n, *next + *lost);
				++*next;
			}
			have -= (size_t)(nl + 1 - buf);
			memmove(buf, nl + 1, have + 1);
		}
	}
	ck_assert_msg(k < 0 && errno == EAGAIN, "the sink's reader: %s", k ? strerror(errno) : "end of file");
}

/* The engine's fd: a pipe, and a stream socket (where a line can be taken in part). */
START_TEST(engine_fd_never_blocks)
{
	int64_t next = 0, lost = 0;
	int sv[2], lost_lines = 0, i;

	have = 0;
	if (_i == 0)
		ck_assert_int_eq(pipe2(sv, O_CLOEXEC), 0);
	else
		ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	ck_assert_int_eq(mig_status_begin(&d.st, &start_params), 0);
	mig_status_sink(&d.st, NULL, NULL, _i == 0 ? sv[1] : sv[0]);
	for (i = 0; i < 5000; i++)
		mig_status_event(&d.st, "tick", "\"n\":%d,\"pad\":\"%0100d\"", i, 0);
	ck_assert_int_eq(fcntl(_i == 0 ? sv[0] : sv[1], F_SETFL, O_NONBLOCK), 0);
	drain_sink(_i == 0 ? sv[0] : sv[1], &next, &lost, &lost_lines);
	ck_assert_int_gt(next, 0);
	/* some did not fit (an events_lost may have, where a shorter line fits and an event does not) */
	ck_assert_int_lt(next + lost, 5000);
	/* room again: the next event is preceded by what was lost (a line taken in part is finished first) */
	mig_status_event(&d.st, "tick", "\"n\":%d", 5000);
	mig_status_event(&d.st, "tick", "\"n\":%d", 5001);
	drain_sink(_i == 0 ? sv[0] : sv[1], &next, &lost, &lost_lines);
	ck_assert_int_ge(lost_lines, 1);
	ck_assert_int_eq(next + lost, 5002);
	ck_assert_uint_eq(have, 0);
	printf("engine fd (%s): %" PRId64 " events taken, %" PRId64 " lost, told in %d events_lost\n",
	       _i == 0 ? "pipe" : "socket", next, lost, lost_lines);
	mig_status_end(&d.st);
	close(sv[0]);
	close(sv[1]);
}
END_TEST

static int64_t cb_next;
static bool cb_broken;

static void on_event(void *ctx, const char *line)
{
	char name[64];
	int64_t n;

	if (ctx != &cb_next || !event_of(line, name, sizeof(name), &n) || n != cb_next)
		cb_broken = true;
	cb_next++;
}

START_TEST(engine_callback_in_order)
{
	int i;

	cb_next = 0;
	cb_broken = false;
	ck_assert_int_eq(mig_status_begin(&d.st, &start_params), 0);
	mig_status_sink(&d.st, on_event, &cb_next, -1);
	for (i = 0; i < 1000; i++)
		mig_status_event(&d.st, "tick", "\"n\":%d", i);
	mig_status_end(&d.st);
	/* the migration over: its callback is not called any more */
	mig_status_event(&d.st, "tick", "\"n\":%d", -1);
	ck_assert(!cb_broken);
	ck_assert_int_eq(cb_next, 1000);
}
END_TEST

/* Data longer than a line: the event without it, nothing written past the line (AddressSanitizer's build). */
START_TEST(event_too_long_loses_its_data)
{
	char line[2048], name[64];
	int64_t n;
	int fd = client();

	ask(fd, "{\"execute\":\"subscribe\"}", EMPTY_REPLY);
	mig_status_event(&d.st, "tick", "\"n\":7,\"pad\":\"%0600d\"", 0);
	mig_status_event(&d.st, "tick", "\"n\":%d", 8);
	ck_assert(get_line(fd, line, sizeof(line)));
	ck_assert_msg(event_of(line, name, sizeof(name), &n), "not an event: %s", line);
	ck_assert_str_eq(name, "tick");
	ck_assert_int_eq(n, -1);
	ck_assert_ptr_nonnull(strstr(line, "\"data\":{}"));
	expect_event(fd, 8);
	close(fd);
}
END_TEST

/* A sink that could take nothing more before the migration ended still hears what it lost: from the end. */
static void *read_later(void *p)
{
	int *fd = p;
	ssize_t k;

	usleep(20000);
	have = 0;
	while ((k = read(*fd, sink_buf + have, sizeof(sink_buf) - 1 - have)) > 0)
		have += (size_t)k;
	sink_buf[have] = 0;
	return NULL;
}

START_TEST(sink_told_at_the_end)
{
	int64_t next = 0, lost = 0, n;
	int sv[2], lost_lines = 0, i;
	char name[64], *p, *nl, *last = NULL;
	pthread_t t;

	ck_assert_int_eq(pipe2(sv, O_CLOEXEC), 0);
	ck_assert_int_eq(mig_status_begin(&d.st, &start_params), 0);
	mig_status_sink(&d.st, NULL, NULL, sv[1]);
	for (i = 0; i < 2000; i++)
		mig_status_event(&d.st, "tick", "\"n\":%d,\"pad\":\"%0100d\"", i, 0);
	/* the pipe is full, events were lost, and the reader comes only after the end began */
	ck_assert_int_eq(pthread_create(&t, NULL, read_later, &sv[0]), 0);
	mig_status_end(&d.st);
	close(sv[1]);
	pthread_join(t, NULL);
	close(sv[0]);
	for (p = sink_buf; (nl = strchr(p, '\n')); p = nl + 1) {
		*nl = 0;
		ck_assert_msg(event_of(p, name, sizeof(name), &n), "not an event: %s", p);
		if (!strcmp(name, "events_lost")) {
			lost += n;
			lost_lines++;
		} else {
			ck_assert_int_eq(n, next + lost);
			next++;
		}
		last = name[0] == 'e' ? "events_lost" : "tick";
	}
	ck_assert_str_eq(p, "");
	ck_assert_ptr_nonnull(last);
	ck_assert_str_eq(last, "events_lost");
	ck_assert_int_eq(next + lost, 2000);
	printf("a sink full at the end: %" PRId64 " events taken, %" PRId64 " lost, told in %d events_lost\n", next,
	       lost, lost_lines);
}
END_TEST

/* A set after a migration ended is the next one's; a status under way takes no second migration. */
START_TEST(set_between_migrations)
{
	struct mig_params want = start_params;
	int fd = client();

	ck_assert_int_eq(mig_status_begin(&d.st, &start_params), 0);
	ck_assert_int_eq(mig_status_begin(&d.st, &start_params), -EBUSY);
	mig_status_decide(&d.st, MIG_OUTCOME_THERE, "moved");
	mig_status_end(&d.st);
	ask(fd, "{\"execute\":\"set\",\"arguments\":{\"max_bandwidth\":5}}", EMPTY_REPLY);
	ck_assert_int_eq(mig_status_begin(&d.st, &start_params), 0);
	want.max_bandwidth = 5;
	expect_params(fd, &want);
	mig_status_end(&d.st);
	/* with no set since: the options' */
	ck_assert_int_eq(mig_status_begin(&d.st, &start_params), 0);
	expect_params(fd, &start_params);
	close(fd);
}
END_TEST

/*
 * A status made without parameters (a control of the public API's): a set
 * before the first migration names one member; the migration takes its
 * options' for the others, and the set one (without the set members kept
 * apart it ran with max_passes 0 and a timeout of 0 ms).  After it ends,
 * a set names another, and the next migration's options give the rest.
 */
static bool same_params(const struct mig_params *a, const struct mig_params *b)
{
	return a->downtime_ms == b->downtime_ms && a->max_passes == b->max_passes && a->timeout_ms == b->timeout_ms &&
	       a->max_bandwidth == b->max_bandwidth && a->throttle == b->throttle;
}

START_TEST(set_before_first_names_only_it)
{
	struct mig_status st;
	struct mig_params got, opts = start_params, want = start_params;
	char err[256];

	mig_status_init(&st, false);
	ck_assert_int_eq(mig_status_set(&st, &(struct mig_params){ .downtime_ms = 200 }, MIG_PARAM_DOWNTIME, err,
					sizeof(err)),
			 0);
	ck_assert_int_eq(mig_status_begin(&st, &opts), 0);
	mig_status_params(&st, &got);
	want.downtime_ms = 200;
	ck_assert_msg(same_params(&got, &want),
		      "began with downtime_ms %" PRIu64 " max_passes %" PRIu64 " timeout_ms %" PRIu64
		      " max_bandwidth %" PRIu64 " throttle %d",
		      got.downtime_ms, got.max_passes, got.timeout_ms, got.max_bandwidth, got.throttle);
	/* under way, a set changes it at once, and is not the next one's */
	ck_assert_int_eq(mig_status_set(&st, &(struct mig_params){ .max_passes = 3 }, MIG_PARAM_MAX_PASSES, err,
					sizeof(err)),
			 0);
	mig_status_params(&st, &got);
	ck_assert_uint_eq(got.max_passes, 3);
	mig_status_decide(&st, MIG_OUTCOME_HERE, "failed");
	mig_status_end(&st);
	ck_assert_int_eq(mig_status_set(&st, &(struct mig_params){ .throttle = false }, MIG_PARAM_THROTTLE, err,
					sizeof(err)),
			 0);
	opts.timeout_ms = 9000;
	ck_assert_int_eq(mig_status_begin(&st, &opts), 0);
	mig_status_params(&st, &got);
	want = opts;
	want.throttle = false;
	ck_assert_msg(same_params(&got, &want),
		      "the second began with downtime_ms %" PRIu64 " max_passes %" PRIu64 " timeout_ms %" PRIu64
		      " throttle %d",
		      got.downtime_ms, got.max_passes, got.timeout_ms, got.throttle);
	mig_status_end(&st);
	mig_status_destroy(&st);
}
END_TEST

/*
 * A cancel and the commit point from two threads at once, released by a
 * barrier, many times: exactly one wins.  COMMIT goes and the cancel is
 * refused (the connection the engine registered stays writable, so the
 * commit's own messages can go), or the cancel is taken and COMMIT never
 * goes (and the connection's writing side was shut down for it).
 */
static struct {
	pthread_barrier_t go;
	int ret;
} race;

static void *race_cancel(void *p)
{
	char err[256];

	(void)p;
	pthread_barrier_wait(&race.go);
	race.ret = mig_status_cancel(&d.st, err, sizeof(err));
	return NULL;
}

START_TEST(cancel_races_the_commit_point)
{
	int i, committed = 0, cancelled = 0;

	ck_assert_int_eq(pthread_barrier_init(&race.go, NULL, 2), 0);
	for (i = 0; i < 2000; i++) {
		pthread_t t;
		int sv[2];
		bool go;

		ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
		ck_assert_int_eq(mig_status_begin(&d.st, &start_params), 0);
		mig_status_cancel_fds(&d.st, sv, 1, SHUT_WR);
		ck_assert_int_eq(pthread_create(&t, NULL, race_cancel, NULL), 0);
		pthread_barrier_wait(&race.go);
		go = mig_status_commit_point(&d.st);
		pthread_join(t, NULL);
		if (go) {
			ck_assert_int_eq(race.ret, -EALREADY);
			ck_assert_int_eq(send(sv[0], "c", 1, MSG_NOSIGNAL), 1);
			committed++;
		} else {
			ck_assert_int_eq(race.ret, 0);
			ck_assert(mig_status_cancel_asked(&d.st));
			ck_assert_int_eq(send(sv[0], "c", 1, MSG_NOSIGNAL), -1);
			ck_assert_int_eq(errno, EPIPE);
			cancelled++;
		}
		mig_status_decide(&d.st, go ? MIG_OUTCOME_THERE : MIG_OUTCOME_HERE, "raced");
		mig_status_end(&d.st);
		close(sv[0]);
		close(sv[1]);
	}
	pthread_barrier_destroy(&race.go);
	printf("cancel against the commit point, 2000 times: COMMIT first %d, the cancel first %d\n", committed,
	       cancelled);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("steer");
	TCase *tc = tcase_create("control");

	tcase_set_timeout(tc, 120);
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, set_each_parameter);
	tcase_add_loop_test(tc, set_refused_by_name, 0, sizeof(bad_sets) / sizeof(bad_sets[0]));
	tcase_add_test(tc, destination_refuses_set_and_cancel);
	tcase_add_test(tc, cancel_before_begin);
	tcase_add_test(tc, cancel_after_commit_refused);
	tcase_add_test(tc, set_compress_midway);
	tcase_add_test(tc, events_in_order);
	tcase_add_test(tc, subscriber_that_never_reads);
	tcase_add_loop_test(tc, engine_fd_never_blocks, 0, 2);
	tcase_add_test(tc, engine_callback_in_order);
	tcase_add_test(tc, event_too_long_loses_its_data);
	tcase_add_test(tc, sink_told_at_the_end);
	tcase_add_test(tc, set_between_migrations);
	tcase_add_test(tc, set_before_first_names_only_it);
	tcase_add_test(tc, cancel_races_the_commit_point);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	return run_suite(suite());
}
