// SPDX-License-Identifier: MIT
/*
 * A migration's control through the public API (kvmdirty-migrate.h):
 * kvmdirty_mig_control_new() and its calls, its socket
 * (kvmdirty-migrate-control(7)), and what it changes in
 * kvmdirty_mig_send() and kvmdirty_mig_recv():
 *   - misuse refused by name, a socket path taken refused, query and
 *     outcome before any migration, a destination's control no source's;
 *   - a cancel asked before the migration begins, and one through the
 *     socket while it runs: -ECANCELED, and the guest runs on at the
 *     source with every page it wrote intact;
 *   - an unknown outcome (a relay passes READY and then nothing, so that
 *     COMMIT and the ACK are lost): without a control the source returns
 *     -EINPROGRESS at once; with one, each side waits, paused, until
 *     resolved, the destination through its socket ("here") and the
 *     source by the call ("nowhere"): the guest runs at the destination
 *     only, its pages as the source left them.
 */
#define _GNU_SOURCE
#include <check.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <kvmdirty-migrate.h>

#include "api-guest.h"
#include "control-client.h"
#include "kvm-skip.h"
#include "test-util.h"

#define VCPUS 2
#define DATA_GPA (4ull << 30)
#define DATA_SIZE (8ull << 20)

static char dir[64];

static void setup(void)
{
	signal(SIGPIPE, SIG_IGN);
	snprintf(dir, sizeof(dir), "/tmp/test-api-control.XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void teardown(void)
{
	char cmd[128];

	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	ck_assert_int_eq(system(cmd), 0);
}

static void sleep_ms(unsigned int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

/* Lines a control logged, kept for the test to look at. */
struct lines {
	pthread_mutex_t lock;
	char text[4096];
};

static void keep_line(void *ctx, const char *line)
{
	struct lines *l = ctx;

	pthread_mutex_lock(&l->lock);
	snprintf(l->text + strlen(l->text), sizeof(l->text) - strlen(l->text), "%s\n", line);
	pthread_mutex_unlock(&l->lock);
}

static bool said(struct lines *l, const char *what)
{
	bool found;

	pthread_mutex_lock(&l->lock);
	found = strstr(l->text, what) != NULL;
	pthread_mutex_unlock(&l->lock);
	return found;
}

/* A request on the control socket at path, and its answer's line. */
static void socket_ask(const char *path, const char *request, char *answer, size_t len)
{
	int fd = connect_to(path);

	ck_assert(get_line(fd, answer, len));
	ck_assert_ptr_nonnull(strstr(answer, "\"QMP\""));
	ck_assert(send_all(fd, request, strlen(request)) && send_all(fd, "\n", 1));
	ck_assert(get_line(fd, answer, len));
	close(fd);
}

START_TEST(misuse_refused)
{
	struct kvmdirty_mig_control *c = (void *)1, *d, *again;
	struct kvmdirty_mig_control_opts o = { 0 };
	char path[200], longer[200], err[256], buf[4096];
	int fd;

	ck_assert_int_eq(kvmdirty_mig_control_new(NULL, &c, err, sizeof(err)), -EINVAL);
	ck_assert_ptr_null(c);
	ck_assert_ptr_nonnull(strstr(err, "opts"));
	o.path = "";
	ck_assert_int_eq(kvmdirty_mig_control_new(&o, &c, err, sizeof(err)), -EINVAL);
	memset(longer, 'x', 150);
	longer[150] = 0;
	o.path = longer;
	ck_assert_int_eq(kvmdirty_mig_control_new(&o, &c, err, sizeof(err)), -EINVAL);
	ck_assert_msg(strstr(err, "xxxx") && strstr(err, "107"), "%s", err);
	/* a path that is a file, not a socket: refused, the file left alone */
	snprintf(path, sizeof(path), "%s/file", dir);
	fd = open(path, O_CREAT | O_WRONLY, 0600);
	ck_assert_int_ge(fd, 0);
	close(fd);
	o.path = path;
	ck_assert_int_lt(kvmdirty_mig_control_new(&o, &c, err, sizeof(err)), 0);
	ck_assert_ptr_null(c);
	ck_assert_msg(strstr(err, path), "the path is not named: %s", err);
	ck_assert_int_eq(access(path, F_OK), 0);
	/* a socket another control listens on: refused, the first one untouched */
	snprintf(path, sizeof(path), "%s/ctl.sock", dir);
	o.destination = true;
	ck_assert_int_eq(kvmdirty_mig_control_new(&o, &d, err, sizeof(err)), 0);
	ck_assert_int_lt(kvmdirty_mig_control_new(&o, &again, err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, path), "the path is not named: %s", err);
	socket_ask(path, "{\"execute\":\"query\"}", buf, sizeof(buf));
	ck_assert_msg(strstr(buf, "\"return\""), "query through the socket: %s", buf);
	/* before any migration: pending, nothing to resolve, a destination's cannot cancel */
	ck_assert_int_eq(kvmdirty_mig_control_outcome(d), KVMDIRTY_MIG_PENDING);
	ck_assert_int_gt(kvmdirty_mig_control_query(d, buf, sizeof(buf)), 0);
	ck_assert_int_eq(buf[0], '{');
	ck_assert_int_eq(kvmdirty_mig_control_query(d, buf, 8), -ENOSPC);
	ck_assert_int_eq(kvmdirty_mig_control_resolve(d, true, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(kvmdirty_mig_control_cancel(d, err, sizeof(err)), -EOPNOTSUPP);
	ck_assert_int_eq(kvmdirty_mig_control_set(d, &(struct kvmdirty_mig_params){ .downtime_ms = 5 },
						  KVMDIRTY_MIG_SET_DOWNTIME, err, sizeof(err)),
			 -EOPNOTSUPP);
	kvmdirty_mig_control_free(d);
	ck_assert_int_ne(access(path, F_OK), 0); /* its socket file gone */
	/* a source's: a set before the migration names one parameter; the others show send's defaults */
	o.destination = false;
	ck_assert_int_eq(kvmdirty_mig_control_new(&o, &c, err, sizeof(err)), 0);
	socket_ask(path, "{\"execute\":\"set\",\"arguments\":{\"downtime_ms\":200}}", buf, sizeof(buf));
	ck_assert_msg(strstr(buf, "\"return\""), "set through the socket: %s", buf);
	ck_assert_int_gt(kvmdirty_mig_control_query(c, buf, sizeof(buf)), 0);
	ck_assert_msg(strstr(buf, "\"downtime_ms\":200") && strstr(buf, "\"max_passes\":10") &&
			      strstr(buf, "\"timeout_ms\":60000") && strstr(buf, "\"throttle\":true"),
		      "query after a set of downtime_ms: %s", buf);
	ck_assert_int_eq(kvmdirty_mig_control_outcome(c), KVMDIRTY_MIG_PENDING);
	/* the same set from code: each member checked, nothing changed unless all are in range */
	ck_assert_int_eq(kvmdirty_mig_control_set(c, &(struct kvmdirty_mig_params){ .max_passes = 0, .timeout_ms = 5 },
						  KVMDIRTY_MIG_SET_MAX_PASSES | KVMDIRTY_MIG_SET_TIMEOUT, err, sizeof(err)),
			 -ERANGE);
	ck_assert_msg(strstr(err, "max_passes"), "the member is not named: %s", err);
	ck_assert_int_eq(kvmdirty_mig_control_set(c, &(struct kvmdirty_mig_params){ 0 }, 0, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(kvmdirty_mig_control_set(c, &(struct kvmdirty_mig_params){ 0 }, 1u << 7, err, sizeof(err)),
			 -EINVAL);
	ck_assert_int_eq(kvmdirty_mig_control_set(c, &(struct kvmdirty_mig_params){ .downtime_ms = 0, .max_mibps = 7 },
						  KVMDIRTY_MIG_SET_DOWNTIME | KVMDIRTY_MIG_SET_MAX_MIBPS, err, sizeof(err)),
			 0);
	ck_assert_int_gt(kvmdirty_mig_control_query(c, buf, sizeof(buf)), 0);
	ck_assert_msg(strstr(buf, "\"downtime_ms\":0,") && strstr(buf, "\"max_bandwidth\":7") &&
			      strstr(buf, "\"timeout_ms\":60000"),
		      "query after the sets: %s", buf);
	kvmdirty_mig_control_free(c);
	/* a source's without a socket, handed to a destination */
	o.path = NULL;
	o.destination = false;
	ck_assert_int_eq(kvmdirty_mig_control_new(&o, &c, err, sizeof(err)), 0);
	ck_assert_int_eq(kvmdirty_mig_recv((void *)1, 0, &(struct kvmdirty_mig_recv_opts){ .control = c }, NULL, err,
					   sizeof(err)),
			 -EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "source's"));
	kvmdirty_mig_control_free(c);
	kvmdirty_mig_control_free(NULL);
	ck_assert_int_eq(kvmdirty_mig_control_query(NULL, buf, sizeof(buf)), -EINVAL);
	ck_assert_int_eq(kvmdirty_mig_control_resolve(NULL, true, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(kvmdirty_mig_control_cancel(NULL, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(kvmdirty_mig_control_set(NULL, &(struct kvmdirty_mig_params){ 0 }, KVMDIRTY_MIG_SET_DOWNTIME, err,
						  sizeof(err)),
			 -EINVAL);
}
END_TEST

/* The checks a tool makes before it builds a guest, and the process's protection. */
START_TEST(checks_before_a_guest)
{
	char key[200], err[256];
	pid_t pid;
	int st;

	snprintf(key, sizeof(key), "%s/key", dir);
	ck_assert_int_eq(kvmdirty_mig_key_check(key, err, sizeof(err)), -ENOENT);
	ck_assert_msg(strstr(err, key), "the file is not named: %s", err);
	ck_assert_int_eq(kvmdirty_mig_genkey(key, err, sizeof(err)), 0);
	ck_assert_msg(kvmdirty_mig_key_check(key, err, sizeof(err)) == 0, "genkey's key: %s", err);
	ck_assert_int_eq(chmod(key, 0644), 0);
	ck_assert_int_eq(kvmdirty_mig_key_check(key, err, sizeof(err)), -EPERM);
	ck_assert_int_eq(kvmdirty_mig_key_check(NULL, err, sizeof(err)), -EINVAL);
	ck_assert_int_eq(kvmdirty_mig_addr_check("unix:/tmp/x.sock", err, sizeof(err)), 0);
	ck_assert_int_eq(kvmdirty_mig_addr_check("tcp:127.0.0.1:4444", err, sizeof(err)), 0);
	ck_assert_int_eq(kvmdirty_mig_addr_check("tcp::4444", err, sizeof(err)), 0);
	ck_assert_int_lt(kvmdirty_mig_addr_check("no-port-here", err, sizeof(err)), 0);
	ck_assert_msg(strstr(err, "no-port-here"), "the address is not named: %s", err);
	/* in a child: it holds for the process */
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0)
		_exit(kvmdirty_mig_protect_process(err, sizeof(err)) == 0 && prctl(PR_GET_DUMPABLE) == 0 ? 0 : 1);
	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the protected child is dumpable");
}
END_TEST

/* ---- with a guest ---- */

/* The source's: each vCPU writes and checks its half of the data. */
static void halves(struct api_side *s)
{
	api_shares(s, DATA_GPA, VCPUS, 0);
}

/* A guest whose vCPUs write and check their halves of DATA_SIZE (a source's), or a bare one. */
static void side_new(struct api_side *s, bool source)
{
	struct testvm_opts o = { .nr_vcpus = VCPUS, .track = source, .track_opts.mode = KVMDIRTY_MODE_CLEAR_LOG };

	api_side_new(s, &o, DATA_GPA, DATA_SIZE, source ? halves : NULL);
}

/*
 * The guest runs on where s is: every vCPU completes 2 more passes over
 * its half (each pass checking every page's tag from the one before), then
 * stops cleanly with no self-check error.
 */
static void runs_on(struct api_side *s, const char *where)
{
	uint64_t pass0[VCPUS];
	struct testvm_exit ex = { 0 };
	unsigned int i, waited, bad = 0;
	bool moved = false;
	int ret;

	for (i = 0; i < VCPUS; i++)
		pass0[i] = testvm_mailbox(s->tv, i)->pass;
	for (waited = 0; waited < 30000 && !moved; waited += 10) {
		sleep_ms(10);
		moved = true;
		for (i = 0; i < VCPUS; i++)
			if (testvm_mailbox(s->tv, i)->pass < pass0[i] + 2 || testvm_mailbox(s->tv, i)->err_gpa)
				moved = false;
	}
	testvm_stop_all(s->tv);
	ret = testvm_join(s->tv, &bad, &ex);
	for (i = 0; i < VCPUS; i++) {
		struct guest_vcpu *v = testvm_mailbox(s->tv, i);

		ck_assert_msg(!v->err_gpa, "%s: vCPU %u's check found page %#" PRIx64 " tagged %#" PRIx64, where, i,
			      v->err_gpa, v->err_tag[0]);
		ck_assert_msg(v->pass >= pass0[i] + 2, "%s: vCPU %u made %" PRIu64 " passes in %u ms", where, i,
			      v->pass - pass0[i], waited);
	}
	ck_assert_msg(ret == 0, "%s: vCPU %u stopped with %s: %s", where, bad, testvm_event_name(ex.event),
		      strerror(-ret));
}

struct recv_job {
	struct api_side *dst;
	struct kvmdirty_mig_control *ctl;
	int lfd, ret;
	struct kvmdirty_mig_recv_result res;
	char err[512];
};

static void *receive(void *p)
{
	struct recv_job *j = p;
	struct kvmdirty_mig_recv_opts o = { .once = true, .timeout_ms = 1000, .control = j->ctl };

	j->ret = kvmdirty_mig_recv(j->dst->g, j->lfd, &o, &j->res, j->err, sizeof(j->err));
	return NULL;
}

/* dst listening at addr, its kvmdirty_mig_recv() on thread *t. */
static void recv_start(struct recv_job *j, struct api_side *dst, const char *addr, pthread_t *t)
{
	char err[256];

	j->dst = dst;
	j->lfd = kvmdirty_mig_listen(addr, err, sizeof(err));
	ck_assert_msg(j->lfd >= 0, "listen: %s", err);
	ck_assert_int_eq(pthread_create(t, NULL, receive, j), 0);
}

/* The source's guest running a pass or two before the migration. */
static void source_running(struct api_side *src)
{
	unsigned int k;

	side_new(src, true);
	ck_assert_int_eq(testvm_spawn(src->tv), 0);
	for (k = 0; k < 10000 && testvm_mailbox(src->tv, 0)->pass < 2; k++)
		sleep_ms(1);
}

START_TEST(cancel_before_begin)
{
	char addr[128], err[512];
	struct kvmdirty_mig_control *c;
	struct kvmdirty_mig_send_result res;
	struct api_side src;
	int lfd, ret;

	source_running(&src);
	snprintf(addr, sizeof(addr), "unix:%s/sock", dir);
	lfd = kvmdirty_mig_listen(addr, err, sizeof(err));
	ck_assert_msg(lfd >= 0, "listen: %s", err);
	/* a destination's control handed to a source: refused before anything is dialled */
	ck_assert_int_eq(kvmdirty_mig_control_new(&(struct kvmdirty_mig_control_opts){ .destination = true }, &c, err,
						  sizeof(err)),
			 0);
	ret = kvmdirty_mig_send(src.g, addr, &(struct kvmdirty_mig_send_opts){ .control = c }, &res, err, sizeof(err));
	ck_assert_msg(ret == -EINVAL && strstr(err, "destination's"), "a destination's control: %d %s", ret, err);
	kvmdirty_mig_control_free(c);
	ck_assert_int_eq(kvmdirty_mig_control_new(&(struct kvmdirty_mig_control_opts){ 0 }, &c, err, sizeof(err)), 0);
	ck_assert_int_eq(kvmdirty_mig_control_cancel(c, err, sizeof(err)), 0);
	ret = kvmdirty_mig_send(src.g, addr, &(struct kvmdirty_mig_send_opts){ .control = c }, &res, err, sizeof(err));
	ck_assert_msg(ret == -ECANCELED, "send after a cancel: %d %s", ret, err);
	ck_assert_int_eq(res.outcome, KVMDIRTY_MIG_HERE);
	ck_assert_int_eq(kvmdirty_mig_control_outcome(c), KVMDIRTY_MIG_HERE);
	/* nothing due any more */
	ck_assert_int_eq(kvmdirty_mig_control_cancel(c, err, sizeof(err)), -ENOENT);
	runs_on(&src, "the source after a cancel");
	kvmdirty_mig_control_free(c);
	close(lfd);
	api_side_free(&src);
}
END_TEST

struct send_job {
	struct api_side *src;
	const char *addr;
	struct kvmdirty_mig_send_opts o;
	struct kvmdirty_mig_send_result res;
	int ret;
	char err[512];
};

static void *send_run(void *p)
{
	struct send_job *s = p;

	s->ret = kvmdirty_mig_send(s->src->g, s->addr, &s->o, &s->res, s->err, sizeof(s->err));
	return NULL;
}

START_TEST(cancel_through_socket)
{
	char addr[128], path[128], err[512], answer[4096] = "";
	struct kvmdirty_mig_control *c;
	struct recv_job j = { 0 };
	struct lines log = { .lock = PTHREAD_MUTEX_INITIALIZER };
	struct api_side src, dst;
	struct send_job sj;
	pthread_t t, st;
	unsigned int k;
	FILE *stats;

	source_running(&src);
	side_new(&dst, false);
	snprintf(addr, sizeof(addr), "unix:%s/sock", dir);
	snprintf(path, sizeof(path), "%s/ctl.sock", dir);
	/* the destination's control: once its call ends without a stream, the guest does not run there */
	ck_assert_int_eq(kvmdirty_mig_control_new(&(struct kvmdirty_mig_control_opts){ .destination = true }, &j.ctl, err,
						  sizeof(err)),
			 0);
	recv_start(&j, &dst, addr, &t);
	ck_assert_int_eq(kvmdirty_mig_control_new(&(struct kvmdirty_mig_control_opts){ .path = path, .log = keep_line,
											.log_ctx = &log },
						  &c, err, sizeof(err)),
			 0);
	/* at 1 MiB/s the 8 MiB guest takes seconds: the cancel comes while it runs */
	stats = tmpfile();
	ck_assert_ptr_nonnull(stats);
	sj = (struct send_job){ .src = &src, .addr = addr, .o = { .control = c, .max_mibps = 1, .stats = stats } };
	ck_assert_int_eq(pthread_create(&st, NULL, send_run, &sj), 0);
	for (k = 0; k < 20000 && !strstr(answer, "\"precopy\""); k += 10) {
		kvmdirty_mig_control_query(c, answer, sizeof(answer));
		sleep_ms(10);
	}
	ck_assert_msg(strstr(answer, "\"precopy\""), "never in pre-copy: %s", answer);
	socket_ask(path, "{\"execute\":\"cancel\"}", answer, sizeof(answer));
	ck_assert_msg(strstr(answer, "\"return\""), "cancel through the socket: %s", answer);
	pthread_join(st, NULL);
	pthread_join(t, NULL);
	ck_assert_msg(sj.ret == -ECANCELED, "send cancelled through the socket: %d %s", sj.ret, sj.err);
	ck_assert_int_eq(sj.res.outcome, KVMDIRTY_MIG_HERE);
	ck_assert_msg(said(&log, "cancel asked through the control socket"), "the log: %s", log.text);
	ck_assert(sj.res.cancelled);
	ck_assert_str_eq(sj.res.reason, "cancelled");
	{
		/* the statistics: a start line first, an end line last saying where the guest runs and why */
		char line[8192], last[8192] = "";

		rewind(stats);
		ck_assert_ptr_nonnull(fgets(line, sizeof(line), stats));
		ck_assert_msg(strstr(line, "\"v\":1") && strstr(line, "\"type\":\"start\""), "first line: %s", line);
		while (fgets(line, sizeof(line), stats))
			snprintf(last, sizeof(last), "%s", line);
		ck_assert_msg(strstr(last, "\"type\":\"end\"") && strstr(last, "\"outcome\":\"here\"") &&
				      strstr(last, "\"reason\":\"cancelled\""),
			      "last line: %s", last);
		fclose(stats);
	}
	ck_assert_msg(j.ret < 0, "the destination took a cancelled stream: %s", j.err);
	ck_assert_int_eq(kvmdirty_mig_control_outcome(j.ctl), KVMDIRTY_MIG_THERE);
	kvmdirty_mig_control_free(j.ctl);
	runs_on(&src, "the source after a cancel through the socket");
	kvmdirty_mig_control_free(c);
	close(j.lfd);
	api_side_free(&dst);
	api_side_free(&src);
}
END_TEST

/*
 * ---- an unknown outcome ----
 * A relay between a source and a destination on Unix sockets: both
 * directions passed on until the destination's first bytes (READY: in a
 * plain stream of one connection the destination says nothing before it)
 * have gone to the source; from then on, nothing more either way (COMMIT
 * and the ACK lost), the connections held open.
 */
struct relay {
	int lfd;
	char to[108];
	bool ready_passed; /* __atomic */
	bool stop;	   /* __atomic */
	pthread_t th;
};

static int unix_dial(const char *path)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
	ck_assert_int_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	return fd;
}

static void *relay_run(void *p)
{
	struct relay *r = p;
	int src = accept(r->lfd, NULL, NULL), dst = unix_dial(r->to);
	char buf[65536];

	while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE)) {
		struct pollfd pf[2] = { { .fd = src, .events = POLLIN }, { .fd = dst, .events = POLLIN } };
		bool cut = __atomic_load_n(&r->ready_passed, __ATOMIC_ACQUIRE);
		ssize_t n;

		if (poll(pf, 2, 50) <= 0)
			continue;
		if (pf[0].revents) {
			n = read(src, buf, sizeof(buf));
			if (n <= 0)
				break;
			if (!cut)
				ck_assert(send_all(dst, buf, (size_t)n));
		}
		if (pf[1].revents) {
			n = read(dst, buf, sizeof(buf));
			if (n <= 0)
				break;
			if (!cut) {
				ck_assert(send_all(src, buf, (size_t)n));
				__atomic_store_n(&r->ready_passed, true, __ATOMIC_RELEASE);
			}
		}
	}
	while (!__atomic_load_n(&r->stop, __ATOMIC_ACQUIRE))
		sleep_ms(10);
	close(src);
	close(dst);
	return NULL;
}

static void relay_start(struct relay *r, const char *listen_path, const char *to)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };

	memset(r, 0, sizeof(*r));
	snprintf(r->to, sizeof(r->to), "%s", to);
	snprintf(a.sun_path, sizeof(a.sun_path), "%s", listen_path);
	r->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	ck_assert_int_eq(bind(r->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
	ck_assert_int_eq(listen(r->lfd, 4), 0);
	ck_assert_int_eq(pthread_create(&r->th, NULL, relay_run, r), 0);
}

static void relay_stop(struct relay *r)
{
	__atomic_store_n(&r->stop, true, __ATOMIC_RELEASE);
	pthread_join(r->th, NULL);
	close(r->lfd);
}

START_TEST(unknown_without_control)
{
	char dst_addr[128], relay_path[128], relay_addr[140];
	struct send_job s = { 0 };
	struct recv_job j = { 0 };
	struct api_side src, dst;
	struct relay r;
	pthread_t t;

	source_running(&src);
	side_new(&dst, false);
	snprintf(dst_addr, sizeof(dst_addr), "unix:%s/dst.sock", dir);
	snprintf(relay_path, sizeof(relay_path), "%s/relay.sock", dir);
	recv_start(&j, &dst, dst_addr, &t);
	relay_start(&r, relay_path, dst_addr + 5);
	snprintf(relay_addr, sizeof(relay_addr), "unix:%s", relay_path);
	s = (struct send_job){ .src = &src, .addr = relay_addr, .o = { .peer_timeout_ms = 1000, .force_switchover = true } };
	send_run(&s);
	ck_assert_msg(__atomic_load_n(&r.ready_passed, __ATOMIC_ACQUIRE), "READY never passed: %d %s", s.ret, s.err);
	ck_assert_msg(s.ret == -EINPROGRESS, "source whose ACK was lost, without a control: %d %s", s.ret, s.err);
	ck_assert_int_eq(s.res.outcome, KVMDIRTY_MIG_UNKNOWN);
	pthread_join(t, NULL);
	ck_assert_msg(j.ret == -EINPROGRESS, "destination whose COMMIT was lost, without a control: %d %s", j.ret,
		      j.err);
	ck_assert_int_eq(j.res.outcome, KVMDIRTY_MIG_UNKNOWN);
	relay_stop(&r);
	close(j.lfd);
	testvm_stop_all(src.tv);
	testvm_join(src.tv, NULL, NULL);
	api_side_free(&dst);
	api_side_free(&src);
}
END_TEST

START_TEST(unknown_resolved)
{
	char dst_addr[128], relay_path[128], relay_addr[140], dst_ctl[128], err[512], answer[4096];
	struct kvmdirty_mig_control *src_ctl;
	struct lines src_log = { .lock = PTHREAD_MUTEX_INITIALIZER }, dst_log = { .lock = PTHREAD_MUTEX_INITIALIZER };
	struct send_job s = { 0 };
	struct recv_job j = { 0 };
	struct api_side src, dst;
	struct relay r;
	pthread_t t, st;
	unsigned int k;
	uint64_t pass_at_pause[VCPUS];
	unsigned int i;

	source_running(&src);
	side_new(&dst, false);
	snprintf(dst_addr, sizeof(dst_addr), "unix:%s/dst.sock", dir);
	snprintf(relay_path, sizeof(relay_path), "%s/relay.sock", dir);
	snprintf(dst_ctl, sizeof(dst_ctl), "%s/dst-ctl.sock", dir);
	ck_assert_int_eq(kvmdirty_mig_control_new(&(struct kvmdirty_mig_control_opts){ .path = dst_ctl,
											.destination = true,
											.log = keep_line,
											.log_ctx = &dst_log },
						  &j.ctl, err, sizeof(err)),
			 0);
	ck_assert_int_eq(kvmdirty_mig_control_new(&(struct kvmdirty_mig_control_opts){ .log = keep_line,
											.log_ctx = &src_log },
						  &src_ctl, err, sizeof(err)),
			 0);
	recv_start(&j, &dst, dst_addr, &t);
	relay_start(&r, relay_path, dst_addr + 5);
	snprintf(relay_addr, sizeof(relay_addr), "unix:%s", relay_path);
	s.src = &src;
	s.addr = relay_addr;
	s.o = (struct kvmdirty_mig_send_opts){ .control = src_ctl, .peer_timeout_ms = 1000, .force_switchover = true };
	ck_assert_int_eq(pthread_create(&st, NULL, send_run, &s), 0);
	/* both sides unknown, and both still in their calls: each waits for a word */
	for (k = 0; k < 60000 && (kvmdirty_mig_control_outcome(src_ctl) != KVMDIRTY_MIG_UNKNOWN ||
				  kvmdirty_mig_control_outcome(j.ctl) != KVMDIRTY_MIG_UNKNOWN);
	     k += 10)
		sleep_ms(10);
	ck_assert_int_eq(kvmdirty_mig_control_outcome(src_ctl), KVMDIRTY_MIG_UNKNOWN);
	ck_assert_int_eq(kvmdirty_mig_control_outcome(j.ctl), KVMDIRTY_MIG_UNKNOWN);
	/* past -T (1 s): each said so, and each still waits */
	for (k = 0; k < 10000 && !(said(&src_log, "unknown") && said(&dst_log, "unknown")); k += 10)
		sleep_ms(10);
	ck_assert_msg(said(&src_log, "unknown"), "the source's log: %s", src_log.text);
	ck_assert_msg(said(&dst_log, "unknown"), "the destination's log: %s", dst_log.text);
	ck_assert_int_eq(pthread_tryjoin_np(st, NULL), EBUSY);
	ck_assert_int_eq(pthread_tryjoin_np(t, NULL), EBUSY);
	/* the source's vCPUs are paused: they make no pass meanwhile */
	for (i = 0; i < VCPUS; i++)
		pass_at_pause[i] = testvm_mailbox(src.tv, i)->pass;
	sleep_ms(200);
	for (i = 0; i < VCPUS; i++)
		ck_assert_uint_eq(testvm_mailbox(src.tv, i)->pass, pass_at_pause[i]);
	/* the orchestrator, who knows both sides: the destination runs it (its socket), the source drops it */
	socket_ask(dst_ctl, "{\"execute\":\"resolve\",\"arguments\":{\"run\":\"here\"}}", answer, sizeof(answer));
	ck_assert_msg(strstr(answer, "\"return\""), "resolve through the socket: %s", answer);
	pthread_join(t, NULL);
	ck_assert_msg(j.ret == 0, "destination resolved here: %d %s", j.ret, j.err);
	ck_assert_int_eq(j.res.outcome, KVMDIRTY_MIG_HERE);
	ck_assert_int_eq(kvmdirty_mig_control_outcome(j.ctl), KVMDIRTY_MIG_HERE);
	ck_assert_int_eq(kvmdirty_mig_control_resolve(src_ctl, false, err, sizeof(err)), 0);
	pthread_join(st, NULL);
	ck_assert_msg(s.ret == 0, "source resolved nowhere: %d %s", s.ret, s.err);
	ck_assert_int_eq(s.res.outcome, KVMDIRTY_MIG_THERE);
	ck_assert_int_eq(kvmdirty_mig_control_outcome(src_ctl), KVMDIRTY_MIG_THERE);
	/* decided: a second resolve has nothing to decide */
	ck_assert_int_eq(kvmdirty_mig_control_resolve(src_ctl, true, err, sizeof(err)), -EINVAL);
	relay_stop(&r);
	/* the source's vCPUs stayed paused; the destination runs the guest, every page as the source left it */
	ck_assert_int_eq(testvm_spawn(dst.tv), 0);
	runs_on(&dst, "the destination resolved here");
	for (i = 0; i < VCPUS; i++)
		ck_assert_uint_eq(testvm_mailbox(src.tv, i)->pass, pass_at_pause[i]);
	testvm_stop_all(src.tv);
	testvm_resume_all(src.tv);
	testvm_join(src.tv, NULL, NULL);
	kvmdirty_mig_control_free(src_ctl);
	kvmdirty_mig_control_free(j.ctl);
	close(j.lfd);
	api_side_free(&dst);
	api_side_free(&src);
}
END_TEST

/*
 * A second kvmdirty_mig_send() on a control whose migration runs is
 * refused (-EBUSY) and leaves the running one alone.  It once decided the
 * running migration's status HERE as it tore down, and the running one,
 * finding its outcome decided, resumed the guest at the source after its
 * COMMIT while the destination ran it too: checked here by running both
 * sides' vCPUs where the outcomes say so.
 */
START_TEST(busy_send_splits_brain)
{
	char addr[128], other[128], path[128], err[512], answer[4096] = "";
	struct kvmdirty_mig_control *c;
	struct recv_job j = { 0 };
	struct api_side src, dst;
	struct send_job sj;
	pthread_t t, st;
	unsigned int k;
	int lfd2, ret;
	enum kvmdirty_mig_outcome before, after;

	source_running(&src);
	side_new(&dst, false);
	snprintf(addr, sizeof(addr), "unix:%s/sock", dir);
	snprintf(other, sizeof(other), "unix:%s/other", dir);
	snprintf(path, sizeof(path), "%s/ctl.sock", dir);
	recv_start(&j, &dst, addr, &t);
	lfd2 = kvmdirty_mig_listen(other, err, sizeof(err)); /* somewhere the refused call may dial */
	ck_assert_int_ge(lfd2, 0);
	ck_assert_int_eq(kvmdirty_mig_control_new(&(struct kvmdirty_mig_control_opts){ .path = path }, &c, err,
						  sizeof(err)), 0);
	sj = (struct send_job){ .src = &src, .addr = addr,
				.o = { .control = c, .max_mibps = 1, .force_switchover = true } };
	ck_assert_int_eq(pthread_create(&st, NULL, send_run, &sj), 0);
	for (k = 0; k < 20000 && !strstr(answer, "\"precopy\""); k += 10) {
		kvmdirty_mig_control_query(c, answer, sizeof(answer));
		sleep_ms(10);
	}
	ck_assert_msg(strstr(answer, "\"precopy\""), "never in pre-copy: %s", answer);
	before = kvmdirty_mig_control_outcome(c);
	ret = kvmdirty_mig_send(src.g, other, &(struct kvmdirty_mig_send_opts){ .control = c }, NULL, err, sizeof(err));
	after = kvmdirty_mig_control_outcome(c);
	kvmdirty_mig_control_query(c, answer, sizeof(answer));
	printf("busy send: second send on a busy control: %d (%s); outcome before %d after %d (PENDING=%d HERE=%d)\n", ret, err,
	       before, after, KVMDIRTY_MIG_PENDING, KVMDIRTY_MIG_HERE);
	printf("busy send: query while the first still runs: %s\n", answer);
	/* the first one now at full speed */
	socket_ask(path, "{\"execute\":\"set\",\"arguments\":{\"max_bandwidth\":0}}", answer, sizeof(answer));
	pthread_join(st, NULL);
	pthread_join(t, NULL);
	printf("busy send: first send: %d outcome %d (%s)\nbusy send: recv: %d outcome %d (%s)\n", sj.ret, sj.res.outcome, sj.err,
	       j.ret, j.res.outcome, j.err);
	fflush(stdout);
	if (sj.res.outcome == KVMDIRTY_MIG_HERE && j.ret == 0 && j.res.outcome == KVMDIRTY_MIG_HERE) {
		/* both sides run the guest: each makes passes over its pages */
		ck_assert_int_eq(testvm_spawn(dst.tv), 0);
		runs_on(&dst, "the destination (told COMMIT)");
		runs_on(&src, "the source (resumed after its COMMIT)");
		printf("busy send: the guest ran on BOTH sides: each vCPU made 2+ passes at the source and at the destination\n");
		fflush(stdout);
	}
	ck_assert_msg(after == KVMDIRTY_MIG_PENDING, "a refused second send decided the running migration: %d", after);
	ck_assert_msg(!(sj.res.outcome == KVMDIRTY_MIG_HERE && j.res.outcome == KVMDIRTY_MIG_HERE && j.ret == 0),
		      "SPLIT BRAIN: source returned %d outcome HERE (%s) and destination returned 0 outcome HERE",
		      sj.ret, sj.err);
	kvmdirty_mig_control_free(c);
	close(lfd2);
	close(j.lfd);
	api_side_free(&dst);
	api_side_free(&src);
}
END_TEST

/*
 * A cancel asked before a kvmdirty_mig_send() that fails before it begins
 * (its dial, or its own checks: its key file missing) ends that call
 * (-ECANCELED) and not the next, unrelated migration on the control (it
 * once outlived a failed dial, and then a failed check: "a cancel aimed at
 * a call refused by its checks ended the next migration: -125").
 */
static void cancel_then_failed_call(bool by_checks)
{
	char addr[128], nobody[128], nokey[128], err[512], answer[4096];
	struct kvmdirty_mig_control *c;
	struct kvmdirty_mig_send_result res;
	struct recv_job j = { 0 };
	struct api_side src, dst;
	const char *what = by_checks ? "refused by its checks" : "that could not dial";
	pthread_t t;
	int ret;

	source_running(&src);
	side_new(&dst, false);
	snprintf(addr, sizeof(addr), "unix:%s/sock", dir);
	snprintf(nobody, sizeof(nobody), "unix:%s/nobody", dir);
	snprintf(nokey, sizeof(nokey), "%s/no-such-key", dir);
	ck_assert_int_eq(kvmdirty_mig_control_new(&(struct kvmdirty_mig_control_opts){ 0 }, &c, err, sizeof(err)), 0);
	ck_assert_int_eq(kvmdirty_mig_control_cancel(c, err, sizeof(err)), 0);
	ret = kvmdirty_mig_send(src.g, by_checks ? addr : nobody,
				&(struct kvmdirty_mig_send_opts){ .control = c, .psk_file = by_checks ? nokey : NULL }, &res,
				err, sizeof(err));
	kvmdirty_mig_control_query(c, answer, sizeof(answer));
	printf("a cancelled send %s: %d (%s); query after it: %s\n", what, ret, err, answer);
	ck_assert_int_eq(ret, by_checks ? -ENOENT : -ECANCELED);
	recv_start(&j, &dst, addr, &t);
	ret = kvmdirty_mig_send(src.g, addr, &(struct kvmdirty_mig_send_opts){ .control = c, .force_switchover = true },
				&res, err, sizeof(err));
	printf("the next send, no cancel asked for it: %d (%s) outcome %d\n", ret, err, res.outcome);
	ck_assert_msg(ret == 0, "a cancel aimed at a call %s ended the next migration: %d %s", what, ret, err);
	pthread_join(t, NULL);
	ck_assert_msg(j.ret == 0, "the destination of the next migration: %s", j.err);
	testvm_stop_all(src.tv);
	testvm_join(src.tv, NULL, NULL);
	kvmdirty_mig_control_free(c);
	close(j.lfd);
	api_side_free(&dst);
	api_side_free(&src);
}

START_TEST(cancel_outlives_failed_send)
{
	cancel_then_failed_call(false);
}
END_TEST

START_TEST(cancel_outlives_checked_send)
{
	cancel_then_failed_call(true);
}
END_TEST

/*
 * A control reused (its last migration over), and a cancel asked while
 * kvmdirty_mig_send() dials the next (its connect waits on a full
 * backlog): taken (0), and the migration ends -ECANCELED as it begins.
 */
START_TEST(cancel_lost_during_dial_on_reused_control)
{
	char addr[128], err[512];
	struct kvmdirty_mig_control *c;
	struct kvmdirty_mig_send_result res;
	struct recv_job j = { 0 };
	struct api_side src, dst;
	struct send_job sj;
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int lfd, fill[16], nfill = 0, ret;
	pthread_t t, st;

	source_running(&src);
	side_new(&dst, false);
	snprintf(addr, sizeof(addr), "unix:%s/sock", dir);
	ck_assert_int_eq(kvmdirty_mig_control_new(&(struct kvmdirty_mig_control_opts){ 0 }, &c, err, sizeof(err)), 0);
	/* migration 1: cancelled, the guest stays here (HERE, "may be migrated again") */
	lfd = kvmdirty_mig_listen(addr, err, sizeof(err));
	ck_assert_int_eq(kvmdirty_mig_control_cancel(c, err, sizeof(err)), 0);
	ret = kvmdirty_mig_send(src.g, addr, &(struct kvmdirty_mig_send_opts){ .control = c }, &res, err, sizeof(err));
	ck_assert_int_eq(ret, -ECANCELED);
	close(lfd);
	/* migration 2: the destination's backlog full, so that the dial waits */
	lfd = kvmdirty_mig_listen(addr, err, sizeof(err));
	ck_assert_int_ge(lfd, 0);
	snprintf(a.sun_path, sizeof(a.sun_path), "%s/sock", dir);
	for (nfill = 0; nfill < 16; nfill++) {
		fill[nfill] = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
		if (connect(fill[nfill], (struct sockaddr *)&a, sizeof(a)) < 0) {
			close(fill[nfill]);
			break;
		}
	}
	sj = (struct send_job){ .src = &src, .addr = addr, .o = { .control = c, .force_switchover = true } };
	ck_assert_int_eq(pthread_create(&st, NULL, send_run, &sj), 0);
	sleep_ms(500);
	ck_assert_int_eq(pthread_tryjoin_np(st, NULL), EBUSY);
	ret = kvmdirty_mig_control_cancel(c, err, sizeof(err));
	printf("cancel while dialling: %d fillers; cancel while send dials (call under way): %d (%s)\n", nfill, ret, err);
	fflush(stdout);
	for (int i = 0; i < nfill; i++)
		close(fill[i]);
	j.lfd = lfd;
	j.dst = &dst;
	ck_assert_int_eq(pthread_create(&t, NULL, receive, &j), 0);
	pthread_join(st, NULL);
	printf("cancel while dialling: send: %d outcome %d (%s)\n", sj.ret, sj.res.outcome, sj.err);
	fflush(stdout);
	ck_assert_msg(ret == 0 && sj.ret == -ECANCELED,
		      "a cancel during the call was refused (%d) and the migration went on: send %d outcome %d", ret,
		      sj.ret, sj.res.outcome);
	ck_assert_int_eq(sj.res.outcome, KVMDIRTY_MIG_HERE);
	/* the guest ran on here and the control serves the next: it moves, and runs there (the waiting destination) */
	ret = kvmdirty_mig_send(src.g, addr, &(struct kvmdirty_mig_send_opts){ .control = c, .force_switchover = true },
				&res, err, sizeof(err));
	ck_assert_msg(ret == 0 && res.outcome == KVMDIRTY_MIG_THERE, "the next send on the control: %d %s", ret, err);
	pthread_join(t, NULL);
	ck_assert_msg(j.ret == 0, "the destination: %s", j.err);
	ck_assert_int_eq(testvm_spawn(dst.tv), 0);
	runs_on(&dst, "the destination of the send after the cancelled one");
	testvm_stop_all(src.tv);
	testvm_join(src.tv, NULL, NULL);
	kvmdirty_mig_control_free(c);
	close(lfd);
	api_side_free(&dst);
	api_side_free(&src);
}
END_TEST

/*
 * ---- a hook on open(2): the engine is linked statically, so its calls
 * resolve here; it holds only a thread that asked for it (hk_me), at the
 * path armed, until released ----
 */

static pthread_mutex_t hk_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hk_cond = PTHREAD_COND_INITIALIZER;
static char hk_path[256];
static bool hk_entered, hk_release;
static __thread bool hk_me; /* the hook holds only the thread that asked for it */

static void hk_gate(const char *path)
{
	pthread_mutex_lock(&hk_lock);
	if (hk_me && hk_path[0] && path && !strcmp(path, hk_path)) {
		hk_entered = true;
		pthread_cond_broadcast(&hk_cond);
		while (!hk_release)
			pthread_cond_wait(&hk_cond, &hk_lock);
	}
	pthread_mutex_unlock(&hk_lock);
}

static int (*real_open(const char *name))(const char *, int, ...)
{
	return (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, name);
}

int open(const char *path, int flags, ...)
{
	mode_t mode = 0;
	va_list ap;

	va_start(ap, flags);
	if (flags & (O_CREAT | O_TMPFILE))
		mode = va_arg(ap, mode_t);
	va_end(ap);
	hk_gate(path);
	/* with _FILE_OFFSET_BITS=64 this is open64, as the engine calls it */
	return real_open(sizeof(off_t) == 8 ? "open64" : "open")(path, flags, mode);
}

static void hk_arm(const char *path)
{
	pthread_mutex_lock(&hk_lock);
	snprintf(hk_path, sizeof(hk_path), "%s", path);
	hk_entered = hk_release = false;
	pthread_mutex_unlock(&hk_lock);
}

static void hk_wait_entered(void)
{
	pthread_mutex_lock(&hk_lock);
	while (!hk_entered)
		pthread_cond_wait(&hk_cond, &hk_lock);
	pthread_mutex_unlock(&hk_lock);
}

static void hk_open_up(void)
{
	pthread_mutex_lock(&hk_lock);
	hk_release = true;
	hk_path[0] = 0;
	pthread_cond_broadcast(&hk_cond);
	pthread_mutex_unlock(&hk_lock);
}

/* A destination still waiting on thread t given a stream that ends it (no control), and joined. */
static void drain(struct api_side *src, const char *addr, pthread_t t, const char *psk)
{
	char err[512];

	if (pthread_tryjoin_np(t, NULL) != EBUSY)
		return;
	kvmdirty_mig_send(src->g, addr, &(struct kvmdirty_mig_send_opts){ .force_switchover = true, .psk_file = psk }, NULL, err,
			  sizeof(err));
	pthread_join(t, NULL);
}

/*
 * A reused control; kvmdirty_mig_send() is inside its call, held by the
 * hook as it reads its key file (as a slow file system or a host name's
 * lookup would): a cancel then is taken and the call ends -ECANCELED (it
 * was once refused -ENOENT and the guest moved).
 */
static char a2_key[128];

static void *receive_psk(void *p)
{
	struct recv_job *j = p;
	struct kvmdirty_mig_recv_opts o = { .once = true, .timeout_ms = 1000, .psk_file = a2_key, .control = j->ctl };

	j->ret = kvmdirty_mig_recv(j->dst->g, j->lfd, &o, &j->res, j->err, sizeof(j->err));
	return NULL;
}

static void *send_run_hooked(void *p)
{
	hk_me = true;
	return send_run(p);
}

START_TEST(cancel_refused_before_prepare)
{
	char addr[128], key[128], err[512];
	struct kvmdirty_mig_control *c;
	struct kvmdirty_mig_send_result res;
	struct recv_job j = { 0 };
	struct api_side src, dst;
	struct send_job sj;
	pthread_t t, st;
	int lfd, ret;

	source_running(&src);
	side_new(&dst, false);
	snprintf(addr, sizeof(addr), "unix:%s/sock", dir);
	snprintf(key, sizeof(key), "%s/key", dir);
	ck_assert_int_eq(kvmdirty_mig_genkey(key, err, sizeof(err)), 0);
	ck_assert_int_eq(kvmdirty_mig_control_new(&(struct kvmdirty_mig_control_opts){ 0 }, &c, err, sizeof(err)), 0);
	/* migration 1: cancelled as it begins; the control's last migration is over */
	lfd = kvmdirty_mig_listen(addr, err, sizeof(err));
	ck_assert_int_eq(kvmdirty_mig_control_cancel(c, err, sizeof(err)), 0);
	ck_assert_int_eq(kvmdirty_mig_send(src.g, addr, &(struct kvmdirty_mig_send_opts){ .control = c }, &res, err,
					   sizeof(err)),
			 -ECANCELED);
	close(lfd);
	/* migration 2: held while it opens its key file */
	snprintf(a2_key, sizeof(a2_key), "%s", key);
	j = (struct recv_job){ .dst = &dst };
	j.lfd = kvmdirty_mig_listen(addr, err, sizeof(err));
	ck_assert_int_ge(j.lfd, 0);
	ck_assert_int_eq(pthread_create(&t, NULL, receive_psk, &j), 0);
	hk_arm(key);
	sj = (struct send_job){ .src = &src, .addr = addr, .o = { .control = c, .force_switchover = true, .psk_file = key } };
	ck_assert_int_eq(pthread_create(&st, NULL, send_run_hooked, &sj), 0);
	hk_wait_entered();
	ret = kvmdirty_mig_control_cancel(c, err, sizeof(err));
	printf("cancel while send reads its key (call under way): %d (%s)\n", ret, err);
	hk_open_up();
	pthread_join(st, NULL);
	drain(&src, addr, t, key);
	printf("send: %d outcome %d (%s)\n", sj.ret, sj.res.outcome, sj.err);
	if (sj.ret == 0)
		printf("recv: %d outcome %d: the guest moved after its cancel was refused\n", j.ret, j.res.outcome);
	fflush(stdout);
	ck_assert_msg(ret == 0 && sj.ret == -ECANCELED,
		      "a cancel while the call read its key was refused (%d) and the migration went on: send %d outcome %d",
		      ret, sj.ret, sj.res.outcome);
	testvm_stop_all(src.tv);
	testvm_join(src.tv, NULL, NULL);
	kvmdirty_mig_control_free(c);
	close(j.lfd);
	api_side_free(&dst);
	api_side_free(&src);
}
END_TEST

/*
 * Two sends on one control: A dials (the destination's backlog full), a
 * cancel is asked for it (0), then B on the same control is refused
 * -EBUSY at once, A untouched, and A ends -ECANCELED.  (B once dialled,
 * took A's cancel with its failed dial, and A migrated.)
 */
START_TEST(second_send_takes_first_cancel)
{
	char addr[128], nobody[128], err[512];
	struct kvmdirty_mig_control *c;
	struct recv_job j = { 0 };
	struct api_side src, dst;
	struct send_job sj;
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int lfd, fill[16], nfill = 0, ret, retb;
	pthread_t t, st;

	source_running(&src);
	side_new(&dst, false);
	snprintf(addr, sizeof(addr), "unix:%s/sock", dir);
	snprintf(nobody, sizeof(nobody), "unix:%s/nobody", dir);
	ck_assert_int_eq(kvmdirty_mig_control_new(&(struct kvmdirty_mig_control_opts){ 0 }, &c, err, sizeof(err)), 0);
	lfd = kvmdirty_mig_listen(addr, err, sizeof(err));
	ck_assert_int_ge(lfd, 0);
	snprintf(a.sun_path, sizeof(a.sun_path), "%s/sock", dir);
	for (nfill = 0; nfill < 16; nfill++) {
		fill[nfill] = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0);
		if (connect(fill[nfill], (struct sockaddr *)&a, sizeof(a)) < 0) {
			close(fill[nfill]);
			break;
		}
	}
	sj = (struct send_job){ .src = &src, .addr = addr, .o = { .control = c, .force_switchover = true } };
	ck_assert_int_eq(pthread_create(&st, NULL, send_run, &sj), 0);
	sleep_ms(500);
	ck_assert_int_eq(pthread_tryjoin_np(st, NULL), EBUSY);
	ret = kvmdirty_mig_control_cancel(c, err, sizeof(err));
	printf("cancel while A dials: %d (%s)\n", ret, err);
	retb = kvmdirty_mig_send(src.g, nobody, &(struct kvmdirty_mig_send_opts){ .control = c }, NULL, err, sizeof(err));
	printf("B on the same control while A dials: %d (%s)\n", retb, err);
	fflush(stdout);
	for (int i = 0; i < nfill; i++)
		close(fill[i]);
	j.lfd = lfd;
	j.dst = &dst;
	ck_assert_int_eq(pthread_create(&t, NULL, receive, &j), 0);
	pthread_join(st, NULL);
	printf("A: %d outcome %d (%s)\n", sj.ret, sj.res.outcome, sj.err);
	fflush(stdout);
	drain(&src, addr, t, NULL);
	ck_assert_msg(retb == -EBUSY, "a second send on a control whose send dials was not refused -EBUSY: %d", retb);
	ck_assert_msg(ret == 0 && sj.ret == -ECANCELED,
		      "the cancel asked (%d) while A dialled was lost: A returned %d outcome %d", ret, sj.ret,
		      sj.res.outcome);
	testvm_stop_all(src.tv);
	testvm_join(src.tv, NULL, NULL);
	kvmdirty_mig_control_free(c);
	close(j.lfd);
	api_side_free(&dst);
	api_side_free(&src);
}
END_TEST

/*
 * A set the moment a migration ends (from its "cancelled" event: its
 * outcome decided, its call not returned) is the next migration's too
 * (it was once lost: the next began with its opts' downtime, 50 ms).
 */
struct set_ctx {
	struct kvmdirty_mig_control *c;
	int set_ret;
	bool on_end;
	char seen[4096];
};

static void set_on_end(void *ctx, const char *line)
{
	struct set_ctx *x = ctx;

	if (x->on_end && (strstr(line, "\"event\":\"cancelled\"") || strstr(line, "\"event\":\"failed\""))) {
		struct kvmdirty_mig_params p = { .downtime_ms = 1234 };
		char err[256];

		x->set_ret = kvmdirty_mig_control_set(x->c, &p, KVMDIRTY_MIG_SET_DOWNTIME, err, sizeof(err));
		x->on_end = false;
	} else if (!x->on_end && strstr(line, "\"event\":\"failed\"") && !x->seen[0]) {
		kvmdirty_mig_control_query(x->c, x->seen, sizeof(x->seen));
	}
}

START_TEST(set_at_the_end_lost)
{
	char addr[128], err[512], answer[4096];
	struct kvmdirty_mig_control *c;
	struct kvmdirty_mig_send_result res;
	struct api_side src;
	struct set_ctx x = { 0 };
	int lfd, ret;

	source_running(&src);
	snprintf(addr, sizeof(addr), "unix:%s/sock", dir);
	lfd = kvmdirty_mig_listen(addr, err, sizeof(err)); /* never accepted: the backlog takes the dial */
	ck_assert_int_ge(lfd, 0);
	ck_assert_int_eq(kvmdirty_mig_control_new(&(struct kvmdirty_mig_control_opts){ 0 }, &c, err, sizeof(err)), 0);
	x.c = c;
	x.on_end = true;
	ck_assert_int_eq(kvmdirty_mig_control_cancel(c, err, sizeof(err)), 0);
	ret = kvmdirty_mig_send(src.g, addr,
				&(struct kvmdirty_mig_send_opts){ .control = c, .event = set_on_end, .event_ctx = &x }, &res,
				err, sizeof(err));
	ck_assert_int_eq(ret, -ECANCELED);
	kvmdirty_mig_control_query(c, answer, sizeof(answer));
	printf("set from the \"cancelled\" event: %d; query after the call: %s\n", x.set_ret, answer);
	/* the next migration: its hello never answered, it fails; its parameters seen at its "failed" event */
	ret = kvmdirty_mig_send(src.g, addr,
				&(struct kvmdirty_mig_send_opts){ .control = c, .event = set_on_end, .event_ctx = &x,
								  .peer_timeout_ms = 300 },
				&res, err, sizeof(err));
	printf("next send: %d (%s)\nits parameters: %s\n", ret, err, x.seen);
	fflush(stdout);
	ck_assert_int_eq(x.set_ret, 0);
	ck_assert_msg(strstr(x.seen, "\"downtime_ms\":1234"),
		      "a set that returned 0 before the next migration began was lost: %s", x.seen);
	testvm_stop_all(src.tv);
	testvm_join(src.tv, NULL, NULL);
	kvmdirty_mig_control_free(c);
	close(lfd);
	api_side_free(&src);
}
END_TEST

/*
 * A destination's control serves one kvmdirty_mig_recv() at a time: a
 * second call on it, while the first (held by the hook as it reads its
 * key) has it, is refused -EBUSY at once; the first then takes its stream.
 */
static void *receive_psk_hooked(void *p)
{
	hk_me = true;
	return receive_psk(p);
}

START_TEST(recv_busy_control)
{
	char addr[128], addr2[128], key[128], err[512];
	struct kvmdirty_mig_control *c;
	struct kvmdirty_mig_send_result res;
	struct recv_job j = { 0 };
	struct api_side src, dst;
	pthread_t t;
	int lfd2, ret;

	source_running(&src);
	side_new(&dst, false);
	snprintf(addr, sizeof(addr), "unix:%s/sock", dir);
	snprintf(addr2, sizeof(addr2), "unix:%s/sock2", dir);
	snprintf(key, sizeof(key), "%s/key", dir);
	ck_assert_int_eq(kvmdirty_mig_genkey(key, err, sizeof(err)), 0);
	snprintf(a2_key, sizeof(a2_key), "%s", key);
	ck_assert_int_eq(kvmdirty_mig_control_new(&(struct kvmdirty_mig_control_opts){ .destination = true }, &c, err,
						  sizeof(err)),
			 0);
	j = (struct recv_job){ .dst = &dst, .ctl = c };
	j.lfd = kvmdirty_mig_listen(addr, err, sizeof(err));
	lfd2 = kvmdirty_mig_listen(addr2, err, sizeof(err));
	ck_assert_int_ge(j.lfd, 0);
	ck_assert_int_ge(lfd2, 0);
	hk_arm(key);
	ck_assert_int_eq(pthread_create(&t, NULL, receive_psk_hooked, &j), 0);
	hk_wait_entered();
	ret = kvmdirty_mig_recv(dst.g, lfd2, &(struct kvmdirty_mig_recv_opts){ .control = c, .once = true }, NULL, err,
				sizeof(err));
	hk_open_up();
	ck_assert_msg(ret == -EBUSY, "a second recv on a control in use: %d %s", ret, err);
	ret = kvmdirty_mig_send(src.g, addr, &(struct kvmdirty_mig_send_opts){ .force_switchover = true, .psk_file = key },
				&res, err, sizeof(err));
	ck_assert_msg(ret == 0, "send: %s", err);
	pthread_join(t, NULL);
	ck_assert_msg(j.ret == 0, "the first recv: %s", j.err);
	ck_assert_int_eq(kvmdirty_mig_control_outcome(c), KVMDIRTY_MIG_HERE);
	testvm_stop_all(src.tv);
	testvm_join(src.tv, NULL, NULL);
	kvmdirty_mig_control_free(c);
	close(j.lfd);
	close(lfd2);
	api_side_free(&dst);
	api_side_free(&src);
}
END_TEST

/*
 * CK_RUN_CASE=control: the cases without a guest (no KVM needed);
 * CK_RUN_CASE=kvm: the guest's, skipped (77) on a host without KVM.
 */
int main(void)
{
	const char *only = getenv("CK_RUN_CASE");
	Suite *s;
	TCase *tc, *kvm;

	if (only && !strcmp(only, "kvm")) {
		int skip = require_kvm("test-api-control");

		if (skip)
			return skip;
	}
	s = suite_create("api-control");
	tc = tcase_create("control");
	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_add_test(tc, misuse_refused);
	tcase_add_test(tc, checks_before_a_guest);
	suite_add_tcase(s, tc);
	kvm = tcase_create("kvm");
	tcase_add_checked_fixture(kvm, setup, teardown);
	tcase_set_timeout(kvm, 120);
	tcase_add_test(kvm, cancel_before_begin);
	tcase_add_test(kvm, cancel_through_socket);
	tcase_add_test(kvm, unknown_without_control);
	tcase_add_test(kvm, unknown_resolved);
	tcase_add_test(kvm, busy_send_splits_brain);
	tcase_add_test(kvm, cancel_outlives_failed_send);
	tcase_add_test(kvm, cancel_lost_during_dial_on_reused_control);
	tcase_add_test(kvm, cancel_outlives_checked_send);
	tcase_add_test(kvm, cancel_refused_before_prepare);
	tcase_add_test(kvm, second_send_takes_first_cancel);
	tcase_add_test(kvm, set_at_the_end_lost);
	tcase_add_test(kvm, recv_busy_control);
	suite_add_tcase(s, kvm);
	return run_suite(s);
}
