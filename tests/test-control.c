// SPDX-License-Identifier: MIT
/*
 * The control socket (lib/migrate/control/control.h) without KVM, against
 * fake ops: the greeting, each command and each error as exact lines; the
 * id echoed as it came; the lines that close a connection, and those that
 * do not; the limits (64 KiB a line, 16 clients, a client that never reads)
 * with another client answered meanwhile; a peer of another user; the
 * socket file's mode, a stale one replaced, a live one, a regular file and
 * a symlink refused, none but its own removed; the default path; and
 * close() with clients connected and with an op running.
 */
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>

#include <kvmdirty-version.h>

#include "control.h"
#include "control-client.h"
#include "test-util.h"

#define GREETING "{\"QMP\":{\"version\":{\"kvmdirty-migrate\":\"" KVMDIRTY_VERSION_STRING "\"},\"capabilities\":[]}}\n"
#define QUERY_OBJECT \
	"{\"state\":\"active\",\"pass\":3,\"bytes_sent\":1048576,\"remaining_bytes\":4096,\"outcome\":null}"
#define QUERY "{\"execute\":\"query\"}"
#define QUERY_REPLY "{\"return\":" QUERY_OBJECT "}\n"
#define EMPTY_REPLY "{\"return\":{}}\n"
#define ERROR(class, desc) "{\"error\":{\"class\":\"" class "\",\"desc\":\"" desc "\"}}\n"
#define GENERIC(desc) ERROR("GenericError", desc)
#define GENERIC_ID(desc, id) "{\"error\":{\"class\":\"GenericError\",\"desc\":\"" desc "\"},\"id\":" id "}\n"
#define RESOLVE(run) "{\"execute\":\"resolve\",\"arguments\":{\"run\":\"" run "\"}}"

/* ---- the fake ops: what they were asked, under a lock (they run on the server's thread) ---- */

enum query_mode { QUERY_OK, QUERY_FAILS, QUERY_NOT_OBJECT, QUERY_NEWLINES };

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	pthread_t test_thread;
	const char *broken; /* what an op saw wrong: checked on the test's thread */
	enum query_mode query;
	int here, nowhere;   /* resolve calls, by argument */
	int fail;	     /* resolve returns -fail ... */
	const char *reason;  /* ... with this reason */
	int delay_ms;	     /* resolve takes this long */
	bool resolving;	     /* a resolve began */
	bool resolved;	     /* and returned */
	struct timespec began;
} fake = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

static void check_thread(void)
{
	if (pthread_equal(pthread_self(), fake.test_thread))
		fake.broken = "an op ran on the caller's thread";
}

#define FAKE_SET(field, value)                                                                \
	do {                                                                                  \
		pthread_mutex_lock(&fake.lock);                                               \
		fake.field = (value);                                                         \
		pthread_mutex_unlock(&fake.lock);                                             \
	} while (0)

static int fake_query(void *ctx, char *buf, size_t len)
{
	static const char *const text[] = {
		[QUERY_OK] = QUERY_OBJECT,
		[QUERY_NOT_OBJECT] = "[1, 2]",
		[QUERY_NEWLINES] = "{\"state\":\n\"active\",\r\n\"pass\":3}",
	};
	enum query_mode mode;

	pthread_mutex_lock(&fake.lock);
	check_thread();
	mode = fake.query;
	if (len != MIG_CONTROL_QUERY_SIZE)
		fake.broken = "query() was given a buffer of another size";
	pthread_mutex_unlock(&fake.lock);
	if (mode == QUERY_FAILS)
		return -EIO;
	snprintf(buf, len, "%s", text[mode]);
	return 0;
}

static int fake_resolve(void *ctx, bool run_here, char *err, size_t len)
{
	struct timespec ts = { 0, 0 };
	int ret;

	pthread_mutex_lock(&fake.lock);
	check_thread();
	*(run_here ? &fake.here : &fake.nowhere) += 1;
	fake.resolving = true;
	clock_gettime(CLOCK_MONOTONIC, &fake.began);
	pthread_cond_broadcast(&fake.cond);
	ts.tv_nsec = fake.delay_ms * 1000000L;
	ret = -fake.fail;
	if (fake.reason)
		snprintf(err, len, "%s", fake.reason);
	pthread_mutex_unlock(&fake.lock);
	nanosleep(&ts, NULL);
	pthread_mutex_lock(&fake.lock);
	fake.resolved = true;
	pthread_mutex_unlock(&fake.lock);
	return ret;
}

static const struct mig_control_ops ops = { .query = fake_query, .resolve = fake_resolve };

/* ---- the fixture: a server at path in a directory of its own ---- */

static char dir[64], path[80];
static struct mig_control *ctl;

static void setup(void)
{
	char err[256];

	signal(SIGPIPE, SIG_IGN);
	fake.test_thread = pthread_self();
	snprintf(dir, sizeof(dir), "/tmp/kvmdirty-control-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/ctl.sock", dir);
	ck_assert_msg(mig_control_open(path, &ops, NULL, &ctl, err, sizeof(err)) == 0, "%s", err);
}

static void teardown(void)
{
	char cmd[128];

	mig_control_close(ctl);
	ctl = NULL;
	pthread_mutex_lock(&fake.lock);
	ck_assert_msg(!fake.broken, "%s", fake.broken);
	pthread_mutex_unlock(&fake.lock);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	ck_assert_int_eq(system(cmd), 0);
}

/* resolve() was called so many times with each argument. */
static void expect_resolves(int here, int nowhere)
{
	pthread_mutex_lock(&fake.lock);
	ck_assert_msg(fake.here == here && fake.nowhere == nowhere,
		      "resolve() here %d and nowhere %d times, expected %d and %d", fake.here, fake.nowhere, here,
		      nowhere);
	pthread_mutex_unlock(&fake.lock);
}

static int client(void)
{
	int fd = connect_to(path);

	expect_line(fd, GREETING);
	return fd;
}

/* One request (its newline added) and the exact reply. */
static void ask(int fd, const char *request, const char *want)
{
	ck_assert(send_all(fd, request, strlen(request)) && send_all(fd, "\n", 1));
	expect_line(fd, want);
}

/* ---- the commands ---- */

START_TEST(greeting_and_capabilities)
{
	int fd = client();

	ask(fd, "{\"execute\":\"qmp_capabilities\"}", EMPTY_REPLY);
	ask(fd, "{\"execute\":\"qmp_capabilities\",\"arguments\":{}}", EMPTY_REPLY);
	ask(fd, "{\"execute\":\"qmp_capabilities\",\"arguments\":{\"enable\":[]}}",
	    GENERIC("Parameter 'enable' is unexpected"));
	/* blank lines are no requests */
	ask(fd, " \t\r\n\n" QUERY, QUERY_REPLY);
	close(fd);
}
END_TEST

START_TEST(query)
{
	int fd = client();

	ask(fd, QUERY, QUERY_REPLY);
	ask(fd, " { \"execute\" : \"query\" } ", QUERY_REPLY);
	FAKE_SET(query, QUERY_FAILS);
	ask(fd, QUERY, GENERIC("the daemon cannot say: Input/output error"));
	FAKE_SET(query, QUERY_NOT_OBJECT);
	ask(fd, QUERY, GENERIC("the daemon's answer is not one JSON object"));
	/* white space of the ops' text that would end the line becomes spaces */
	FAKE_SET(query, QUERY_NEWLINES);
	ask(fd, QUERY, "{\"return\":{\"state\": \"active\",  \"pass\":3}}\n");
	close(fd);
}
END_TEST

START_TEST(resolve_recorded_once)
{
	int fd = client();

	ask(fd, RESOLVE("here"), EMPTY_REPLY);
	expect_resolves(1, 0);
	ask(fd, RESOLVE("nowhere"), EMPTY_REPLY);
	expect_resolves(1, 1);
	close(fd);
}
END_TEST

START_TEST(resolve_fails)
{
	int fd = client();

	FAKE_SET(fail, EBUSY);
	FAKE_SET(reason, "no outcome to resolve: the migration is in pass 3");
	ask(fd, RESOLVE("here"), GENERIC("no outcome to resolve: the migration is in pass 3"));
	/* a reason is escaped, and cut where it breaks UTF-8 */
	FAKE_SET(reason, "a \"quote\", a \\, a\ttab\nand \xc3");
	ask(fd, RESOLVE("nowhere"), GENERIC("a \\\"quote\\\", a \\\\, a\\u0009tab\\u000aand \\ufffd"));
	/* no reason: the errno's */
	FAKE_SET(reason, NULL);
	ask(fd, RESOLVE("nowhere"), GENERIC("Device or resource busy"));
	expect_resolves(1, 2);
	close(fd);
}
END_TEST

START_TEST(id_echoed)
{
	int fd = client();

	ask(fd, "{\"execute\":\"query\",\"id\":42}", "{\"return\":" QUERY_OBJECT ",\"id\":42}\n");
	ask(fd, "{\"id\":-1.50e3,\"execute\":\"qmp_capabilities\"}", "{\"return\":{},\"id\":-1.50e3}\n");
	ask(fd, "{\"execute\":\"query\",\"id\":\"a \\\"b\\\" \\u00e9\"}",
	    "{\"return\":" QUERY_OBJECT ",\"id\":\"a \\\"b\\\" \\u00e9\"}\n");
	ask(fd, "{\"execute\":\"query\",\"id\": {\"n\": [1, 2.0, null], \"s\": \"x\"} }",
	    "{\"return\":" QUERY_OBJECT ",\"id\":{\"n\": [1, 2.0, null], \"s\": \"x\"}}\n");
	ask(fd, "{\"execute\":\"resolve\",\"id\":[true,false]}", GENERIC_ID("Parameter 'run' is missing", "[true,false]"));
	ask(fd, "{\"execute\":\"nothing\",\"id\":null}",
	    "{\"error\":{\"class\":\"CommandNotFound\",\"desc\":\"The command nothing has not been found\"},"
	    "\"id\":null}\n");
	close(fd);
}
END_TEST

START_TEST(unknown_command_keeps_the_connection)
{
	int fd = client();

	ask(fd, "{\"execute\":\"migrate\"}", ERROR("CommandNotFound", "The command migrate has not been found"));
	ask(fd, "{\"execute\":\"qu\\\"ery\\n\"}",
	    ERROR("CommandNotFound", "The command qu\\\"ery\\u000a has not been found"));
	ask(fd, QUERY, QUERY_REPLY);
	close(fd);
}
END_TEST

START_TEST(bad_arguments_keep_the_connection)
{
	static const struct {
		const char *request, *reply;
	} cases[] = {
		{ "{\"execute\":\"resolve\"}", GENERIC("Parameter 'run' is missing") },
		{ "{\"execute\":\"resolve\",\"arguments\":{}}", GENERIC("Parameter 'run' is missing") },
		{ "{\"execute\":\"resolve\",\"arguments\":{\"run\":1}}",
		  GENERIC("Invalid parameter type for 'run', expected: string") },
		{ "{\"execute\":\"resolve\",\"arguments\":{\"run\":null}}",
		  GENERIC("Invalid parameter type for 'run', expected: string") },
		{ "{\"execute\":\"resolve\",\"arguments\":{\"run\":[\"here\"]}}",
		  GENERIC("Invalid parameter type for 'run', expected: string") },
		{ "{\"execute\":\"resolve\",\"arguments\":{\"run\":\"there\"}}",
		  GENERIC("Parameter 'run' does not accept value 'there'") },
		{ "{\"execute\":\"resolve\",\"arguments\":{\"run\":\"Here\"}}",
		  GENERIC("Parameter 'run' does not accept value 'Here'") },
		{ "{\"execute\":\"resolve\",\"arguments\":{\"run\":\"here\",\"force\":true}}",
		  GENERIC("Parameter 'force' is unexpected") },
		{ "{\"execute\":\"resolve\",\"arguments\":{\"run\":\"here\",\"run\":\"nowhere\"}}",
		  GENERIC("Parameter 'run' is given twice") },
		{ "{\"execute\":\"resolve\",\"arguments\":[\"here\"]}",
		  GENERIC("QMP input member 'arguments' must be an object") },
		{ "{\"execute\":\"resolve\",\"arguments\":\"here\"}",
		  GENERIC("QMP input member 'arguments' must be an object") },
		{ "{\"execute\":\"query\",\"arguments\":{\"all\":true}}", GENERIC("Parameter 'all' is unexpected") },
		{ "{\"execute\":\"query\",\"arguments\":null}", GENERIC("QMP input member 'arguments' must be an object") },
		{ "{\"execute\":\"query\",\"extra\":1}", GENERIC("QMP input member 'extra' is unexpected") },
		{ "{\"execute\":\"query\",\"execute\":\"resolve\"}", GENERIC("QMP input member 'execute' is given twice") },
	};
	int fd = client();
	unsigned int i;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		ask(fd, cases[i].request, cases[i].reply);
		ask(fd, QUERY, QUERY_REPLY);
	}
	expect_resolves(0, 0);
	close(fd);
}
END_TEST

/* Lines that cannot be requests: the error, then the end, and what followed them unanswered. */
static const struct {
	const char *line;
	size_t len;
	const char *reply;
} fatal[] = {
#define LINE(s) s, sizeof(s) - 1
	{ LINE("{\"execute\":"), GENERIC("not JSON at byte 11: expected a value") },
	{ LINE("{\"execute\":\"query\"} x"), GENERIC("not JSON at byte 20: expected the end after the value") },
	{ LINE("execute query"), GENERIC("not JSON at byte 0: expected a value") },
	{ LINE("[\"execute\",\"query\"]"), GENERIC("QMP input must be a JSON object") },
	{ LINE("\"query\""), GENERIC("QMP input must be a JSON object") },
	{ LINE("{\"id\":7}"), GENERIC_ID("QMP input lacks member 'execute'", "7") },
	{ LINE("{}"), GENERIC("QMP input lacks member 'execute'") },
	{ LINE("{\"execute\":[\"query\"]}"), GENERIC("QMP input member 'execute' must be a string") },
	{ LINE("{\"execute\":\"qu\0ery\"}"), GENERIC("a NUL byte at byte 14") },
	{ LINE("\0"), GENERIC("a NUL byte at byte 0") },
	{ LINE("{\"execute\":\"\xc3\x28\"}"), GENERIC("not UTF-8 at byte 12") },
	{ LINE("{\"execute\":\"query\",\"id\":\"\xff\"}"), GENERIC("not UTF-8 at byte 25") },
	/* overlong, a surrogate, past U+10FFFF, cut short */
	{ LINE("{\"execute\":\"\xc0\xaf\"}"), GENERIC("not UTF-8 at byte 12") },
	{ LINE("{\"execute\":\"\xed\xa0\x80\"}"), GENERIC("not UTF-8 at byte 12") },
	{ LINE("{\"execute\":\"\xf4\x90\x80\x80\"}"), GENERIC("not UTF-8 at byte 12") },
	{ LINE("{\"execute\":\"\xe2\x82\"}"), GENERIC("not UTF-8 at byte 12") },
#undef LINE
};

START_TEST(fatal_line_closes)
{
	int fd = client();
	char buf[256];
	size_t n;

	ask(fd, QUERY, QUERY_REPLY);
	/* the bad line and a good one after it, in one write */
	memcpy(buf, fatal[_i].line, fatal[_i].len);
	n = fatal[_i].len;
	memcpy(buf + n, "\n" QUERY "\n", sizeof(QUERY) + 1);
	n += sizeof(QUERY) + 1;
	ck_assert(send_all(fd, buf, n));
	expect_line(fd, fatal[_i].reply);
	expect_closed(fd);
	/* and valid UTF-8 outside ASCII is no error */
	if (_i == 0) {
		fd = client();
		ask(fd, "{\"execute\":\"query\",\"id\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}",
		    "{\"return\":" QUERY_OBJECT ",\"id\":\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"}\n");
		close(fd);
	}
}
END_TEST

/* ---- the limits ---- */

static char *line_of(size_t len, char fill)
{
	char *s = malloc(len + 1);

	ck_assert_ptr_nonnull(s);
	memset(s, fill, len);
	s[len] = 0;
	return s;
}

/* fd's line refused as too long, fd closed; other answered still. */
static void expect_too_long(int fd, int other)
{
	expect_line(fd, GENERIC("a line longer than 65536 bytes"));
	expect_closed(fd);
	ask(other, QUERY, QUERY_REPLY);
	close(other);
}

START_TEST(longest_line)
{
	char *line = line_of(MIG_CONTROL_MAX_LINE + 1, ' ');
	int fd = client(), other = client();

	/* 65,536 bytes: a request, its spaces white space */
	memcpy(line, QUERY, strlen(QUERY));
	line[MIG_CONTROL_MAX_LINE] = '\n';
	ck_assert(send_all(fd, line, MIG_CONTROL_MAX_LINE + 1));
	expect_line(fd, QUERY_REPLY);
	/* 65,537: the first half, another client served meanwhile, then the rest */
	line[MIG_CONTROL_MAX_LINE] = ' ';
	ck_assert(send_all(fd, line, 40000));
	ask(other, QUERY, QUERY_REPLY);
	send_all(fd, line + 40000, MIG_CONTROL_MAX_LINE + 1 - 40000);
	send_all(fd, "\n", 1);
	expect_too_long(fd, other);
	free(line);
}
END_TEST

START_TEST(endless_line)
{
	char *chunk = line_of(4096, 'x');
	int fd = client(), other = client();
	unsigned int i;

	/* 16 chunks are 65,536 bytes: still a line if a newline came now */
	for (i = 0; i < 16; i++) {
		ck_assert(send_all(fd, chunk, 4096));
		ask(other, QUERY, QUERY_REPLY);
	}
	send_all(fd, chunk, 4096);
	expect_too_long(fd, other);
	free(chunk);
}
END_TEST

/* A connection that is refused: its one error line, then the end. */
static void expect_refused(const char *reply)
{
	int fd = connect_to(path);

	expect_line(fd, reply);
	expect_closed(fd);
}

START_TEST(sixteen_clients)
{
	int fd[MIG_CONTROL_MAX_CLIENTS], i, tries;

	for (i = 0; i < MIG_CONTROL_MAX_CLIENTS; i++)
		fd[i] = client();
	expect_refused(GENERIC("too many clients: 16 are connected"));
	for (i = 0; i < MIG_CONTROL_MAX_CLIENTS; i++)
		ask(fd[i], QUERY, QUERY_REPLY);
	/* one leaves: a new one is taken once the server has seen it go */
	close(fd[0]);
	for (tries = 0;; tries++) {
		char line[4096];

		fd[0] = connect_to(path);
		ck_assert(get_line(fd[0], line, sizeof(line)));
		if (!strcmp(line, GREETING))
			break;
		ck_assert_str_eq(line, GENERIC("too many clients: 16 are connected"));
		ck_assert_int_lt(tries, 200);
		close(fd[0]);
		usleep(10000);
	}
	for (i = 0; i < MIG_CONTROL_MAX_CLIENTS; i++) {
		ask(fd[i], QUERY, QUERY_REPLY);
		close(fd[i]);
	}
}
END_TEST

static double ms_since(const struct timespec *t0)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)(t.tv_sec - t0->tv_sec) * 1e3 + (double)(t.tv_nsec - t0->tv_nsec) / 1e6;
}

START_TEST(client_that_never_reads)
{
	static const char request[] = QUERY "\n";
	int deaf = client(), other = client();
	unsigned int i;
	struct timespec t0;
	double slowest = 0;

	/* its replies pile up, past MIG_CONTROL_MAX_OUTPUT and the socket's buffers: it is dropped */
	for (i = 0; i < 40000 && send_all(deaf, request, sizeof(request) - 1); i++) {
		if (i % 500)
			continue;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		ask(other, QUERY, QUERY_REPLY);
		if (ms_since(&t0) > slowest)
			slowest = ms_since(&t0);
	}
	ck_assert_msg(i < 40000, "a client that never reads was never dropped");
	ck_assert_msg(slowest < 1000, "another client waited %.0f ms for a reply", slowest);
	printf("client_that_never_reads: dropped after %u requests; the other client's slowest reply %.1f ms\n", i,
	       slowest);
	close(deaf);
	ask(other, QUERY, QUERY_REPLY);
	close(other);
}
END_TEST

/* ---- peers ---- */

START_TEST(other_user_refused)
{
	pid_t pid;
	int status;

	if (geteuid() != 0) {
		printf("other_user_refused: skipped: the client must setuid(65534), which needs root\n");
		return;
	}
	/* past the file's mode, so that only the server's own check stands in the way */
	ck_assert_int_eq(chmod(dir, 0711), 0);
	ck_assert_int_eq(chmod(path, 0666), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		static const char want[] =
			GENERIC("user 65534 may not connect: only the daemon's user (0) and root may");
		struct timeval tv = { 5, 0 };
		char got[512];
		ssize_t n = 0, k;
		int fd;

		if (setgid(65534) || setuid(65534))
			_exit(2);
		fd = dial(path);
		if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)))
			_exit(3);
		while ((k = read(fd, got + n, sizeof(got) - 1 - (size_t)n)) > 0)
			n += k;
		got[n] = 0;
		_exit(strcmp(got, want) ? 4 : 0);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		      "the client of user 65534: status %#x (2: setuid, 3: connect, 4: not the one error line)", status);
	/* root, the daemon's user here, is served */
	{
		int fd = client();

		ask(fd, QUERY, QUERY_REPLY);
		close(fd);
	}
}
END_TEST

/* ---- the socket file ---- */

static int open_at(const char *p, struct mig_control **c, char *err, size_t len)
{
	err[0] = 0;
	return mig_control_open(p, &ops, NULL, c, err, len);
}

START_TEST(socket_file_mode)
{
	struct mig_control *c = NULL;
	char p[160], err[256];
	struct stat st;
	mode_t old;
	int fd;

	ck_assert_int_eq(stat(path, &st), 0);
	ck_assert_msg(S_ISSOCK(st.st_mode) && (st.st_mode & 07777) == 0600, "mode %o", st.st_mode);
	/* whatever the umask */
	old = umask(0);
	snprintf(p, sizeof(p), "%s/umask0.sock", dir);
	ck_assert_msg(open_at(p, &c, err, sizeof(err)) == 0, "%s", err);
	umask(old);
	ck_assert_int_eq(stat(p, &st), 0);
	ck_assert_msg(S_ISSOCK(st.st_mode) && (st.st_mode & 07777) == 0600, "mode %o", st.st_mode);
	mig_control_close(c);
	ck_assert_msg(lstat(p, &st) < 0 && errno == ENOENT, "the socket file stays after close");
	mig_control_close(NULL);
	/* a file put in its place meanwhile is not the server's to remove */
	ck_assert_msg(open_at(p, &c, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(unlink(p), 0);
	fd = open(p, O_CREAT | O_WRONLY, 0600);
	ck_assert_int_ge(fd, 0);
	close(fd);
	mig_control_close(c);
	ck_assert_msg(lstat(p, &st) == 0 && S_ISREG(st.st_mode), "close() removed a file it did not make");
}
END_TEST

START_TEST(stale_socket_replaced)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct mig_control *c = NULL;
	char err[256];
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);

	/* a socket file whose server is gone */
	snprintf(a.sun_path, sizeof(a.sun_path), "%s/stale.sock", dir);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
	close(fd);
	ck_assert_msg(open_at(a.sun_path, &c, err, sizeof(err)) == 0, "%s", err);
	fd = connect_to(a.sun_path);
	expect_line(fd, GREETING);
	ask(fd, QUERY, QUERY_REPLY);
	close(fd);
	mig_control_close(c);
}
END_TEST

START_TEST(path_in_use_refused)
{
	struct mig_control *c = NULL;
	char p[160], err[256];
	struct stat st;
	int fd;

	/* a live server's */
	ck_assert_errno(open_at(path, &c, err, sizeof(err)), EADDRINUSE);
	ck_assert_msg(strstr(err, path) && strstr(err, "a server listens there already") && !strchr(err, '\n'),
		      "%s", err);
	fd = client();
	ask(fd, QUERY, QUERY_REPLY);
	close(fd);
	/* a regular file, a directory, a symlink to a socket */
	snprintf(p, sizeof(p), "%s/file", dir);
	fd = open(p, O_CREAT | O_WRONLY, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, "x", 1), 1);
	close(fd);
	ck_assert_errno(open_at(p, &c, err, sizeof(err)), EEXIST);
	ck_assert_msg(strstr(err, p) && strstr(err, "exists and is not a socket"), "%s", err);
	ck_assert_int_eq(stat(p, &st), 0);
	ck_assert_msg(S_ISREG(st.st_mode) && st.st_size == 1, "the file was touched");
	ck_assert_errno(open_at(dir, &c, err, sizeof(err)), EEXIST);
	snprintf(p, sizeof(p), "%s/link", dir);
	ck_assert_int_eq(symlink(path, p), 0);
	ck_assert_errno(open_at(p, &c, err, sizeof(err)), EEXIST);
	/* a path a socket cannot have */
	ck_assert_errno(open_at("", &c, err, sizeof(err)), EINVAL);
	memset(p, 'a', sizeof(p) - 1);
	p[0] = '/';
	p[sizeof(p) - 1] = 0;
	ck_assert_errno(open_at(p, &c, err, sizeof(err)), ENAMETOOLONG);
	ck_assert_msg(strstr(err, p) && strstr(err, "107 bytes"), "%s", err);
	snprintf(p, sizeof(p), "%s/none/ctl.sock", dir);
	ck_assert_errno(open_at(p, &c, err, sizeof(err)), ENOENT);
	ck_assert_msg(strstr(err, p), "%s", err);
}
END_TEST

START_TEST(default_path)
{
	char want[160], got[160];

	ck_assert_int_eq(setenv("XDG_RUNTIME_DIR", dir, 1), 0);
	snprintf(want, sizeof(want), "%s/kvmdirty-migrate-%ld.sock", dir, (long)getpid());
	mig_control_default_path(got, sizeof(got));
	ck_assert_str_eq(got, want);
	snprintf(want, sizeof(want), "/tmp/kvmdirty-migrate-%ld.sock", (long)getpid());
	ck_assert_int_eq(setenv("XDG_RUNTIME_DIR", "/nonexistent/run", 1), 0);
	mig_control_default_path(got, sizeof(got));
	ck_assert_str_eq(got, want);
	ck_assert_int_eq(setenv("XDG_RUNTIME_DIR", path, 1), 0); /* not a directory */
	mig_control_default_path(got, sizeof(got));
	ck_assert_str_eq(got, want);
	ck_assert_int_eq(setenv("XDG_RUNTIME_DIR", "run", 1), 0); /* not absolute */
	mig_control_default_path(got, sizeof(got));
	ck_assert_str_eq(got, want);
	ck_assert_int_eq(unsetenv("XDG_RUNTIME_DIR"), 0);
	mig_control_default_path(got, sizeof(got));
	ck_assert_str_eq(got, want);
}
END_TEST

/* ---- close ---- */

START_TEST(close_with_clients)
{
	int idle = client(), partial = client(), deaf = client(), i, replies = 0;
	char line[4096];
	struct stat st;

	ck_assert(send_all(partial, "{\"execute\":", 11));
	for (i = 0; i < 10; i++)
		ck_assert(send_all(deaf, QUERY "\n", sizeof(QUERY)));
	mig_control_close(ctl);
	ctl = NULL;
	ck_assert_msg(lstat(path, &st) < 0 && errno == ENOENT, "the socket file stays after close");
	expect_closed(idle);
	expect_closed(partial);
	/* the replies it was sent before the close, whole, then the end */
	while (get_line(deaf, line, sizeof(line))) {
		ck_assert_str_eq(line, QUERY_REPLY);
		replies++;
	}
	ck_assert_int_le(replies, 10);
	close(deaf);
}
END_TEST

START_TEST(close_while_resolving)
{
	struct timespec deadline;
	int fd = client();
	double ran;

	FAKE_SET(delay_ms, 100);
	ck_assert(send_all(fd, RESOLVE("here") "\n", sizeof(RESOLVE("here"))));
	clock_gettime(CLOCK_REALTIME, &deadline);
	deadline.tv_sec += 5;
	pthread_mutex_lock(&fake.lock);
	while (!fake.resolving)
		ck_assert_int_ne(pthread_cond_timedwait(&fake.cond, &fake.lock, &deadline), ETIMEDOUT);
	pthread_mutex_unlock(&fake.lock);
	mig_control_close(ctl);
	ctl = NULL;
	pthread_mutex_lock(&fake.lock);
	ck_assert_msg(fake.resolved, "close() returned while the op ran");
	ran = ms_since(&fake.began);
	pthread_mutex_unlock(&fake.lock);
	ck_assert_msg(ran >= 100, "close() returned %.1f ms after the op began", ran);
	expect_resolves(1, 0);
	/* the op's answer went out before the end */
	expect_line(fd, EMPTY_REPLY);
	expect_closed(fd);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("control");
	TCase *tc = tcase_create("control");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, greeting_and_capabilities);
	tcase_add_test(tc, query);
	tcase_add_test(tc, resolve_recorded_once);
	tcase_add_test(tc, resolve_fails);
	tcase_add_test(tc, id_echoed);
	tcase_add_test(tc, unknown_command_keeps_the_connection);
	tcase_add_test(tc, bad_arguments_keep_the_connection);
	tcase_add_loop_test(tc, fatal_line_closes, 0, sizeof(fatal) / sizeof(fatal[0]));
	tcase_add_test(tc, longest_line);
	tcase_add_test(tc, endless_line);
	tcase_add_test(tc, sixteen_clients);
	tcase_add_test(tc, client_that_never_reads);
	tcase_add_test(tc, other_user_refused);
	tcase_add_test(tc, socket_file_mode);
	tcase_add_test(tc, stale_socket_replaced);
	tcase_add_test(tc, path_in_use_refused);
	tcase_add_test(tc, default_path);
	tcase_add_test(tc, close_with_clients);
	tcase_add_test(tc, close_while_resolving);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
