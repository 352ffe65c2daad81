// SPDX-License-Identifier: MIT
/*
 * Key files without KVM (keyfile.h): every kind of file refused (too
 * open, another user's, a symbolic link, a FIFO, at once, a directory, a
 * socket, a device, /proc/self/environ, a file of /sys (as root), empty,
 * too large, any content but 64 hex digits and at most one newline), each
 * with one line naming the file and never a byte of what it holds; the
 * forms accepted and the key they give; genkey's file (mode 0600 whatever
 * the umask, taken by the loader, never made twice, never through a link);
 * a process that protects itself not dumpable, its pagemap opened before
 * still there, and the daemon not dumpable from its start.
 *
 * usage: test-keyfile [KVMDIRTY-MIGRATE]   (the daemon's case only with it)
 */
#define _GNU_SOURCE /* memmem, pipe2, setresuid */
#include <ctype.h>
#include <glob.h>
#include <grp.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>

#include "hostmem.h"
#include "keyfile.h"
#include "test-util.h"

/* A key and its file's digits: key[i] = i * 7 + 3. */
#define KEY_HEX "030a11181f262d343b424950575e656c737a81888f969da4abb2b9c0c7ced5dc"
#define KEY_HEX63 "30a11181f262d343b424950575e656c737a81888f969da4abb2b9c0c7ced5dc" /* without its first */
#define KEY_HEX62 "0a11181f262d343b424950575e656c737a81888f969da4abb2b9c0c7ced5dc"  /* ... two */
#define NOBODY 65534

static char tmpdir[64];
static const char *daemon_path;

static void write_file(const char *name, const void *content, size_t n, mode_t mode, char *path, size_t len)
{
	int fd;

	snprintf(path, len, "%s/%s", tmpdir, name);
	unlink(path);
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, content, n), (ssize_t)n);
	close(fd);
	ck_assert_int_eq(chmod(path, mode), 0);
}

/*
 * A refusal as every one must be: ret as expected, one line in err
 * naming path and saying says, no 8 bytes in a row of content, and no key.
 */
static void refused(const char *what, int ret, int want, const char *err, const char *path, const char *says,
		    const void *content, size_t n, const struct mig_psk *psk)
{
	static const struct mig_psk none;
	size_t i;

	ck_assert_msg(ret == want, "%s: %d (%s), expected %d", what, ret, err, want);
	ck_assert_msg(strstr(err, path) && strstr(err, says) && !strchr(err, '\n'),
		      "%s: '%s', expected one line naming %s and saying '%s'", what, err, path, says);
	for (i = 0; i + 8 <= n; i++)
		ck_assert_msg(!memmem(err, strlen(err), (const char *)content + i, 8), "%s: the content in '%s'", what,
			      err);
	ck_assert_msg(!memcmp(psk, &none, sizeof(none)), "%s: a key left behind", what);
}

/* path as a key file: refused with want and says. */
static void expect_refused(const char *what, const char *path, int want, const char *says, const void *content,
			   size_t n)
{
	struct mig_psk psk;
	char err[512] = "";
	int ret;

	memset(&psk, 0x55, sizeof(psk));
	ret = mig_psk_load(path, &psk, err, sizeof(err));
	refused(what, ret, want, err, path, says, content, n, &psk);
}

/* What every refusal of a size or a content says a key file must be, and how to make one. */
#define FORM "64 hex digits"
#define HOW "kvmdirty-migrate genkey FILE"

START_TEST(contents_refused)
{
	static char big[MIG_PSK_FILE_MAX + 1];
	static const struct {
		const char *content;
		const char *says;
	} cases[] = {
		{ "", "empty" },
		{ KEY_HEX63, "(63 bytes)" },				/* 63 digits */
		{ KEY_HEX63 "\n", "(64 bytes)" },			/* 63 and a newline */
		{ "0" KEY_HEX, "(65 bytes)" },				/* 65 */
		{ "0" KEY_HEX "\n", "(66 bytes)" },
		{ "g" KEY_HEX63, "(64 bytes)" },			/* not hex */
		{ KEY_HEX "\n\n", "(66 bytes)" },			/* something after the newline */
		{ KEY_HEX "\nsecret", "(71 bytes)" },
		{ KEY_HEX "\r", "(65 bytes)" },				/* a CR alone */
		{ KEY_HEX "\n\r", "(66 bytes)" },
		{ KEY_HEX " ", "(65 bytes)" },
		{ " " KEY_HEX, "(65 bytes)" },
		{ "0x" KEY_HEX62, "(64 bytes)" },
		{ "RodTuF7kZaqMd5cGWsLGawqvqjUt2kLJQ+ox2c1pSfI=\n", "(45 bytes)" }, /* the base64 key of old */
	};
	char path[128], says[64];
	unsigned int i;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		write_file("k", cases[i].content, strlen(cases[i].content), 0600, path, sizeof(path));
		snprintf(says, sizeof(says), "case %u", i);
		expect_refused(says, path, -EINVAL, cases[i].says, cases[i].content, strlen(cases[i].content));
		expect_refused(says, path, -EINVAL, HOW, cases[i].content, strlen(cases[i].content));
		expect_refused(says, path, -EINVAL, FORM, cases[i].content, strlen(cases[i].content));
	}
	/* a NUL in the digits, which a string would hide */
	write_file("k", KEY_HEX "\0", 65, 0600, path, sizeof(path));
	expect_refused("a NUL", path, -EINVAL, "(65 bytes)", KEY_HEX, 64);
	/* the largest file is read (and refused for its content), one byte more never */
	memset(big, 'a', sizeof(big));
	write_file("k", big, MIG_PSK_FILE_MAX, 0600, path, sizeof(path));
	expect_refused("4096 bytes", path, -EINVAL, "(4096 bytes)", big, MIG_PSK_FILE_MAX);
	write_file("k", big, sizeof(big), 0600, path, sizeof(path));
	expect_refused("4097 bytes", path, -EINVAL, "4097 bytes, more than a key file has", big, sizeof(big));
	expect_refused("4097 bytes", path, -EINVAL, HOW, big, sizeof(big));
}
END_TEST

START_TEST(modes_refused)
{
	static const mode_t modes[] = { 0644, 0640, 0604, 0620, 0602, 0660, 0666, 0610, 0601, 0700 | 010, 0777 };
	char path[128], says[64];
	unsigned int i;

	for (i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
		write_file("k", KEY_HEX "\n", 65, modes[i], path, sizeof(path));
		snprintf(says, sizeof(says), "(mode %04o)", (unsigned int)modes[i]);
		expect_refused(says, path, -EPERM, says, KEY_HEX, 64);
		expect_refused(says, path, -EPERM, (modes[i] & 066) ? "group or others may read or write it" :
									"group or others may execute it",
			       KEY_HEX, 64);
	}
}
END_TEST

/* Not a regular file, or not one to hold a key: each refused for what it is. */
START_TEST(kinds_refused)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	char path[128], link[160], fifo[128];
	struct timespec t0, t1;
	int fd;

	write_file("k", KEY_HEX "\n", 65, 0600, path, sizeof(path));
	snprintf(link, sizeof(link), "%s/link", tmpdir);
	ck_assert_int_eq(symlink(path, link), 0);
	expect_refused("a symbolic link to a good key file", link, -ELOOP, "a symbolic link", KEY_HEX, 64);
	unlink(link);
	ck_assert_int_eq(symlink("/nonexistent/key", link), 0);
	expect_refused("a dangling symbolic link", link, -ELOOP, "a symbolic link", "", 0);

	expect_refused("a directory", tmpdir, -EINVAL, "not a regular file (a directory)", "", 0);

	/* a FIFO no one writes: open(2) must not wait for a writer */
	snprintf(fifo, sizeof(fifo), "%s/fifo", tmpdir);
	ck_assert_int_eq(mkfifo(fifo, 0600), 0);
	clock_gettime(CLOCK_MONOTONIC, &t0);
	expect_refused("a FIFO", fifo, -EINVAL, "not a regular file (a FIFO)", "", 0);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	ck_assert_msg(t1.tv_sec - t0.tv_sec < 2, "a FIFO held the loader %ld s", (long)(t1.tv_sec - t0.tv_sec));

	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/sock", tmpdir);
	fd = socket(AF_UNIX, SOCK_STREAM, 0);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	expect_refused("a socket", sa.sun_path, -EINVAL, "not a regular file (a socket)", "", 0);
	close(fd);

	expect_refused("/dev/null", "/dev/null", -EINVAL, "not a regular file (a character device)", "", 0);

	/* regular, ours, mode 0400, and its size says 0 whatever it holds */
	expect_refused("/proc/self/environ", "/proc/self/environ", -EINVAL, "/proc", "", 0);

	snprintf(path, sizeof(path), "%s/none", tmpdir);
	expect_refused("no file", path, -ENOENT, "No such file or directory", "", 0);
}
END_TEST

/*
 * A file of /sys: regular, its size a page whatever it holds, and refused
 * for that, where one is the user's own with no permission for others
 * (root's, mode 0400 or 0600).
 */
START_TEST(sys_file_refused)
{
	static const char *const where[] = { "/sys/kernel/slab/*/*", "/sys/module/*/parameters/*", "/sys/kernel/mm/*/*" };
	const char *found = NULL;
	struct stat st;
	unsigned int i;
	glob_t g;
	size_t k;

	for (i = 0; i < sizeof(where) / sizeof(where[0]) && !found; i++) {
		if (glob(where[i], 0, NULL, &g))
			continue;
		for (k = 0; k < g.gl_pathc && !found; k++)
			if (lstat(g.gl_pathv[k], &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
			    !(st.st_mode & 077) && st.st_size > 0 && access(g.gl_pathv[k], R_OK) == 0)
				found = strdup(g.gl_pathv[k]);
		globfree(&g);
	}
	if (!found) {
		printf("test-keyfile: sys_file_refused: skipped: no file of /sys here is this user's, mode 0400 or 0600\n");
		return;
	}
	expect_refused(found, found, -EINVAL, "bytes read where its size says", "", 0);
	free((void *)found);
}
END_TEST

START_TEST(other_owner_refused)
{
	char path[128];

	if (geteuid() != 0) {
		printf("test-keyfile: other_owner_refused: skipped: a file of another user needs root to make\n");
		return;
	}
	write_file("k", KEY_HEX "\n", 65, 0600, path, sizeof(path));
	ck_assert_int_eq(chown(path, NOBODY, NOBODY), 0);
	expect_refused("a file of uid 65534, loaded by root", path, -EPERM, "owned by uid 65534, not by root (uid 0)",
		       KEY_HEX, 64);
}
END_TEST

/* The key a file's digits give: key[i] = i * 7 + 3. */
static void expect_key(const char *what, const char *content, size_t n, mode_t mode)
{
	struct mig_psk psk;
	char path[128], err[512];
	unsigned int i;

	write_file("k", content, n, mode, path, sizeof(path));
	ck_assert_msg(mig_psk_load(path, &psk, err, sizeof(err)) == 0, "%s: %s", what, err);
	ck_assert_uint_eq(psk.len, MIG_PSK_LEN);
	for (i = 0; i < MIG_PSK_LEN; i++)
		ck_assert_msg(psk.key[i] == (uint8_t)(i * 7 + 3), "%s: key[%u] = 0x%02x", what, i, psk.key[i]);
	mig_psk_clear(&psk);
	ck_assert_uint_eq(psk.len, 0);
}

START_TEST(forms_accepted)
{
	char upper[] = KEY_HEX "\n", mixed[] = KEY_HEX;
	unsigned int i;

	for (i = 0; upper[i]; i++)
		upper[i] = (char)toupper((unsigned char)upper[i]);
	for (i = 0; mixed[i]; i += 2)
		mixed[i] = (char)toupper((unsigned char)mixed[i]);
	expect_key("no newline", KEY_HEX, 64, 0600);
	expect_key("a newline", KEY_HEX "\n", 65, 0600);
	expect_key("CR LF", KEY_HEX "\r\n", 66, 0600);
	expect_key("upper case", upper, 65, 0600);
	expect_key("mixed case", mixed, 64, 0600);
	expect_key("mode 0400", KEY_HEX "\n", 65, 0400);
}
END_TEST

/* Every byte as the last digit: taken exactly when it is a hex digit, for its value. */
START_TEST(every_byte_as_a_digit)
{
	char content[64], path[128], err[512];
	struct mig_psk psk;
	unsigned int c;
	int ret, v;

	memset(content, '0', sizeof(content));
	for (c = 0; c < 256; c++) {
		content[63] = (char)c;
		write_file("k", content, sizeof(content), 0600, path, sizeof(path));
		ret = mig_psk_load(path, &psk, err, sizeof(err));
		v = c >= '0' && c <= '9' ? (int)c - '0' : c >= 'a' && c <= 'f' ? (int)c - 'a' + 10 :
		    c >= 'A' && c <= 'F' ? (int)c - 'A' + 10 : -1;
		ck_assert_msg(v < 0 ? ret == -EINVAL : ret == 0, "byte 0x%02x: %d (%s)", c, ret, err);
		if (v >= 0)
			ck_assert_msg(psk.key[31] == v, "byte 0x%02x: the key's last byte 0x%02x", c, psk.key[31]);
	}
}
END_TEST

START_TEST(genkey_makes_a_key_file)
{
	char path[128], path2[128], link[128], buf[128], buf2[128], err[512];
	struct mig_psk a, b;
	struct stat st;
	unsigned int i;
	mode_t old;
	int fd;

	snprintf(path, sizeof(path), "%s/new.key", tmpdir);
	unlink(path);
	/* mode 0600 whatever the umask */
	old = umask(0777);
	ck_assert_msg(mig_psk_generate(path, err, sizeof(err)) == 0, "%s", err);
	umask(old);
	ck_assert_int_eq(lstat(path, &st), 0);
	ck_assert_msg(S_ISREG(st.st_mode) && (st.st_mode & 07777) == 0600, "mode %04o", st.st_mode & 07777);
	ck_assert_uint_eq(st.st_uid, geteuid());
	ck_assert_int_eq(st.st_size, 65);
	fd = open(path, O_RDONLY);
	ck_assert_int_eq(read(fd, buf, sizeof(buf)), 65);
	close(fd);
	for (i = 0; i < 64; i++)
		ck_assert_msg(strchr("0123456789abcdef", buf[i]) && buf[i], "byte %u: 0x%02x", i, (unsigned char)buf[i]);
	ck_assert_int_eq(buf[64], '\n');
	ck_assert_msg(mig_psk_load(path, &a, err, sizeof(err)) == 0, "%s", err);
	for (i = 0; i < MIG_PSK_LEN; i++)
		ck_assert_int_eq(a.key[i], strtoul((char[]){ buf[2 * i], buf[2 * i + 1], 0 }, NULL, 16));

	/* never again over it: refused, naming it, the file as it was */
	ck_assert_errno(mig_psk_generate(path, err, sizeof(err)), EEXIST);
	ck_assert_msg(strstr(err, path) && !strchr(err, '\n'), "%s", err);
	fd = open(path, O_RDONLY);
	ck_assert_int_eq(read(fd, buf2, sizeof(buf2)), 65);
	close(fd);
	ck_assert_int_eq(memcmp(buf, buf2, 65), 0);

	/* a second file: another key */
	snprintf(path2, sizeof(path2), "%s/new2.key", tmpdir);
	unlink(path2);
	ck_assert_msg(mig_psk_generate(path2, err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(mig_psk_load(path2, &b, err, sizeof(err)), 0);
	ck_assert_msg(memcmp(a.key, b.key, MIG_PSK_LEN), "two keys alike");

	/* never through a link, dangling or not: nothing made where it points */
	snprintf(link, sizeof(link), "%s/link.key", tmpdir);
	unlink(link);
	unlink(path2);
	ck_assert_int_eq(symlink(path2, link), 0);
	ck_assert_errno(mig_psk_generate(link, err, sizeof(err)), EEXIST);
	ck_assert_msg(strstr(err, link) && !strchr(err, '\n'), "%s", err);
	ck_assert_int_eq(access(path2, F_OK), -1);
	ck_assert_errno(mig_psk_generate(tmpdir, err, sizeof(err)), EEXIST);

	/* a directory that is not there: named, nothing made */
	snprintf(path2, sizeof(path2), "%s/none/new.key", tmpdir);
	ck_assert_errno(mig_psk_generate(path2, err, sizeof(err)), ENOENT);
	ck_assert_msg(strstr(err, path2) && !strchr(err, '\n'), "%s", err);
	mig_psk_clear(&a);
	mig_psk_clear(&b);
}
END_TEST

START_TEST(protected_process_not_dumpable)
{
	struct rlimit rl;
	char err[256];

	ck_assert_int_eq(prctl(PR_GET_DUMPABLE, 0, 0, 0, 0), 1);
	ck_assert_msg(mig_psk_protect_process(err, sizeof(err)) == 0, "%s", err);
	ck_assert_int_eq(prctl(PR_GET_DUMPABLE, 0, 0, 0, 0), 0);
	ck_assert_int_eq(getrlimit(RLIMIT_CORE, &rl), 0);
	ck_assert_msg(rl.rlim_cur == 0 && rl.rlim_max == 0, "RLIMIT_CORE %llu/%llu", (unsigned long long)rl.rlim_cur,
		      (unsigned long long)rl.rlim_max);
}
END_TEST

/*
 * /proc/self/pagemap, which the source reads, opened before the process
 * protects itself (hostmem.h), is still there after; opened after, it is
 * not, for a user that is not root.  In a child, as nobody when this runs
 * as root.
 */
START_TEST(pagemap_kept_across_protection)
{
	char err[256];
	int status, fd, late;
	pid_t pid = fork();

	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		/* a change of user leaves the process not dumpable: dumpable again, as a daemon starts */
		if (geteuid() == 0 && (setgroups(0, NULL) || setresgid(NOBODY, NOBODY, NOBODY) ||
				       setresuid(NOBODY, NOBODY, NOBODY) || prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)))
			_exit(10);
		if (mig_pagemap_keep() < 0)
			_exit(11);
		if (mig_psk_protect_process(err, sizeof(err)) < 0)
			_exit(12);
		fd = mig_pagemap_open();
		late = open("/proc/self/pagemap", O_RDONLY);
		_exit(fd < 0 ? 13 : late >= 0 ? 14 : 0);
	}
	ck_assert_int_eq(waitpid(pid, &status, 0), pid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
		      "status 0x%x (10: becoming nobody, 11: keeping pagemap, 12: protecting, 13: pagemap not kept, "
		      "14: pagemap opened after protection)", status);
}
END_TEST

/*
 * The daemon itself, from its start: its /proc/PID files belong to root
 * once it is not dumpable, to the user it runs as before.  It runs as a
 * user that is not root (nobody, when this runs as root), `plot -` on a
 * pipe: once it has read what the pipe held, it is past its start.
 */
START_TEST(daemon_not_dumpable)
{
	char proc[64], *argv[] = { (char *)daemon_path, "plot", "-", "-o", "/dev/null", NULL };
	int in[2], execd[2], status, queued = 1, e = 0, i;
	struct stat st;
	pid_t pid;

	if (!daemon_path) {
		printf("test-keyfile: daemon_not_dumpable: skipped: no kvmdirty-migrate given\n");
		return;
	}
	ck_assert_int_eq(pipe(in), 0);
	ck_assert_int_eq(pipe2(execd, O_CLOEXEC), 0);
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		dup2(in[0], 0);
		close(in[1]);
		e = open("/dev/null", O_WRONLY); /* its refusal of the stats is no news */
		if (e >= 0)
			dup2(e, 2);
		e = 0;
		close(execd[0]);
		if (geteuid() == 0 && (setgroups(0, NULL) || setresgid(NOBODY, NOBODY, NOBODY) ||
				       setresuid(NOBODY, NOBODY, NOBODY)))
			e = errno;
		/* a program its user cannot read runs not dumpable whatever it does: that would prove nothing */
		if (!e && access(daemon_path, R_OK | X_OK))
			e = errno;
		if (!e)
			execv(daemon_path, argv);
		e = e ? e : errno;
		if (write(execd[1], &e, sizeof(e)) < 0)
			_exit(126);
		_exit(127);
	}
	close(in[0]);
	close(execd[1]);
	/* EOF: the daemon was executed; else why it could not be */
	if (read(execd[0], &e, sizeof(e)) == (ssize_t)sizeof(e)) {
		close(in[1]);
		waitpid(pid, &status, 0);
		printf("test-keyfile: daemon_not_dumpable: skipped: %s cannot run as uid %d: %s\n", daemon_path,
		       geteuid() ? (int)geteuid() : NOBODY, strerror(e));
		return;
	}
	close(execd[0]);
	ck_assert_int_eq(write(in[1], "{", 1), 1);
	for (i = 0; i < 1000 && queued; i++) {
		ck_assert_int_eq(ioctl(in[1], FIONREAD, &queued), 0);
		if (queued)
			usleep(10000);
	}
	ck_assert_msg(!queued, "the daemon read nothing in 10 s");
	snprintf(proc, sizeof(proc), "/proc/%d/environ", (int)pid);
	ck_assert_int_eq(stat(proc, &st), 0);
	close(in[1]); /* the daemon refuses the stats ("{") and exits */
	waitpid(pid, &status, 0);
	ck_assert_msg(st.st_uid == 0, "the daemon's %s belongs to uid %d: it is dumpable", proc, (int)st.st_uid);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 1, "the daemon: status 0x%x", status);
}
END_TEST

int main(int argc, char **argv)
{
	Suite *s = suite_create("keyfile");
	TCase *tc = tcase_create("keyfile");
	char cmd[128];
	int ret;

	daemon_path = argc > 1 ? argv[1] : NULL;
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/kvmdirty-keyfile-XXXXXX");
	if (!mkdtemp(tmpdir)) {
		perror("mkdtemp");
		return 1;
	}
	tcase_set_timeout(tc, 30);
	tcase_add_test(tc, contents_refused);
	tcase_add_test(tc, modes_refused);
	tcase_add_test(tc, kinds_refused);
	tcase_add_test(tc, sys_file_refused);
	tcase_add_test(tc, other_owner_refused);
	tcase_add_test(tc, forms_accepted);
	tcase_add_test(tc, every_byte_as_a_digit);
	tcase_add_test(tc, genkey_makes_a_key_file);
	tcase_add_test(tc, protected_process_not_dumpable);
	tcase_add_test(tc, pagemap_kept_across_protection);
	tcase_add_test(tc, daemon_not_dumpable);
	suite_add_tcase(s, tc);
	ret = run_suite(s);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
	if (system(cmd))
		ret = 1;
	return ret;
}
