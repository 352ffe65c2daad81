/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_TEST_MIGRATE_SPAWN_H
#define KVMDIRTY_TEST_MIGRATE_SPAWN_H

/*
 * kvmdirty-migrate as a process for the migration tests (the binary
 * beside them in the build tree, or $KVMDIRTY_MIGRATE), a running source
 * guest in the test's own process, and an address for a case.
 */
#include <arpa/inet.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "transport.h"
#include "testguest-engine.h"
#include "test-util.h"

extern char **environ;

static inline const char *migrate_exe(void)
{
	static char exe[4096];
	const char *env = getenv("KVMDIRTY_MIGRATE");

	if (env) {
		snprintf(exe, sizeof(exe), "%s", env);
	} else { /* beside the tests in the build tree */
		ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 64);

		ck_assert_int_gt(n, 0);
		exe[n] = 0;
		strcpy(strrchr(exe, '/'), "/../examples/kvmdirty-migrate/kvmdirty-migrate");
	}
	return exe;
}

/*
 * Run kvmdirty-migrate with args (NULL-terminated, after the program
 * name), stderr to errfd when >= 0.  The destination is the binary, started
 * with exec: a forked copy of this process (whose vCPU threads run) could
 * inherit a lock some thread held and hang.
 */
static inline pid_t spawn_migrate(char *const *args, int errfd)
{
	char *argv[32] = { "kvmdirty-migrate" };
	posix_spawn_file_actions_t fa;
	unsigned int i;
	pid_t pid;

	for (i = 0; args[i]; i++)
		argv[i + 1] = args[i];
	posix_spawn_file_actions_init(&fa);
	if (errfd >= 0)
		posix_spawn_file_actions_adddup2(&fa, errfd, 2);
	ck_assert_int_eq(posix_spawn(&pid, migrate_exe(), &fa, NULL, argv, environ), 0);
	posix_spawn_file_actions_destroy(&fa);
	return pid;
}

static inline pid_t spawn_listener(const char *addr, const struct mig_testvm_opts *g, const char *timeout_ms)
{
	char mib[32], vcpus[32], regions[32];
	char *args[] = { "listen",  (char *)addr, "-m",		  mib, "-v", vcpus, "--run-ms", "300",
			 "-T",	    (char *)timeout_ms, "--regions", regions, NULL };

	snprintf(mib, sizeof(mib), "%" PRIu64, g->mib);
	snprintf(vcpus, sizeof(vcpus), "%u", g->vcpus);
	snprintf(regions, sizeof(regions), "%u", g->regions ? g->regions : 1);
	return spawn_migrate(args, -1);
}

/*
 * Connect once the listener is up (it builds its guest, then binds:
 * thousands of memslots take KVM a while), for up to 10 minutes or until
 * the listener exits.
 */
static inline int connect_retry(const char *addr, pid_t listener, char *err, size_t len)
{
	int i, fd = -1, st;

	for (i = 0; i < 60000 && fd < 0; i++) {
		fd = mig_connect(addr, 10000, err, len);
		if (fd < 0) {
			ck_assert_msg(waitpid(listener, &st, WNOHANG) == 0, "the listener exited: %s", err);
			usleep(10000);
		}
	}
	return fd;
}

static inline int child_status(pid_t pid)
{
	int st;

	ck_assert_int_eq(waitpid(pid, &st, 0), pid);
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static inline struct testvm *running_source(const struct mig_testvm_opts *g, struct mig_guest *ret_g)
{
	struct testvm *tv;
	char err[256];
	int ret = mig_testvm_new(g, true, &tv, err, sizeof(err));

	ck_assert_msg(ret == 0, "source: %s", err);
	if (g->text)
		mig_testvm_fill_text_range(tv, 0, (g->mib << 20) / MIG_PAGE_SIZE, 16);
	else
		mig_testvm_fill(tv, 16);
	ck_assert_ok(mig_testvm_guest(tv, ret_g));
	ck_assert_ok(testvm_spawn(tv));
	return tv;
}

/* A free loopback port, or a fresh socket path, for a case's address. */
static inline void make_addr(const char *kind, char *addr, size_t len)
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

static inline void drop_addr(const char *addr)
{
	if (!strncmp(addr, "unix:", 5))
		unlink(addr + 5);
}

#endif
