// SPDX-License-Identifier: MIT
/*
 * Key files (keyfile.h): read strictly, made from getrandom(2), and the
 * process that holds a key kept out of core dumps.  The hex digits are
 * decoded and encoded without a branch or a table lookup on their values,
 * and every buffer that held them is wiped.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "errf.h"
#include "keyfile.h"

/* What every refusal of a file's size or content says a key file is. */
#define FORM                                                                                  \
	"a key file holds 64 hex digits (a key of 32 bytes) and at most a newline; make one with " \
	"kvmdirty-migrate genkey FILE"

/* ---- hex, in constant time ---- */

/* The digit of a nibble (0 .. 15), lowercase. */
static char hex_digit(unsigned int v)
{
	/* v > 9: 9 - v wraps, and its high bits add the distance from '9' + 1 to 'a' */
	return (char)(v + '0' + (((9u - v) >> 8) & ('a' - '0' - 10)));
}

/*
 * The value of a hex digit (either case) in *ret_v; false if c is none.
 * The answer is computed the same way whatever c is; only the caller's
 * sum of all the answers is ever branched on.
 */
static bool hex_value(unsigned char c, unsigned int *ret_v)
{
	unsigned int num = c ^ 0x30u;			   /* '0' .. '9' -> 0 .. 9 */
	unsigned int num_ok = (num - 10u) >> 8;		   /* all ones below, iff num < 10 */
	unsigned int alpha = (c & ~0x20u) - 55u;	   /* 'A' .. 'F', 'a' .. 'f' -> 10 .. 15 */
	unsigned int alpha_ok = ((alpha - 10u) ^ (alpha - 16u)) >> 8; /* iff 10 <= alpha < 16 */

	*ret_v = ((num_ok & num) | (alpha_ok & alpha)) & 0xf;
	return (num_ok | alpha_ok) & 1;
}

/* ---- loading ---- */

static const char *kind_of(mode_t mode)
{
	return S_ISDIR(mode) ? "a directory" : S_ISFIFO(mode) ? "a FIFO" : S_ISSOCK(mode) ? "a socket" :
	       S_ISCHR(mode) ? "a character device" : S_ISBLK(mode) ? "a block device" : "of another kind";
}

/* Why open(2) failed on path, in err: what is there, where that says more than errno. */
static int open_failed(const char *path, int e, char *err, size_t len)
{
	struct stat st;

	if (lstat(path, &st) < 0 || S_ISREG(st.st_mode))
		return mig_errf(err, len, -e, "--psk '%s': %s", path, strerror(e));
	if (S_ISLNK(st.st_mode))
		return mig_errf(err, len, -ELOOP, "--psk '%s': a symbolic link; a key file is opened only as itself "
			       "(give the path of the file)", path);
	return mig_errf(err, len, -EINVAL, "--psk '%s': not a regular file (%s)", path, kind_of(st.st_mode));
}

/* What fstat(2) says of the open file, against keyfile.h's rules: 0 or a refusal. */
static int check_file(const char *path, const struct stat *st, char *err, size_t len)
{
	uid_t me = geteuid();

	if (!S_ISREG(st->st_mode))
		return mig_errf(err, len, -EINVAL, "--psk '%s': not a regular file (%s)", path, kind_of(st->st_mode));
	if (st->st_uid != me)
		return mig_errf(err, len, -EPERM, "--psk '%s': owned by uid %u, not by %s (uid %u); a key file must "
			       "belong to the user the daemon runs as", path, (unsigned int)st->st_uid,
			       me ? "this user" : "root", (unsigned int)me);
	if (st->st_mode & 077)
		return mig_errf(err, len, -EPERM, "--psk '%s': group or others may %s it (mode %04o); a key file must be "
			       "mode 0600 or 0400", path, (st->st_mode & 066) ? "read or write" : "execute",
			       (unsigned int)(st->st_mode & 07777));
	if (st->st_size == 0)
		return mig_errf(err, len, -EINVAL, "--psk '%s': empty, or a file of /proc or /sys (its size says 0); "
			       FORM, path);
	if (st->st_size > MIG_PSK_FILE_MAX)
		return mig_errf(err, len, -EINVAL, "--psk '%s': %lld bytes, more than a key file has; " FORM, path,
			       (long long)st->st_size);
	return 0;
}

/*
 * Read (or write, out) len bytes of fd in as many calls as it takes, up
 * to the end of the file: the bytes moved, or -errno.  Reading one byte
 * more than the largest file taken tells a file that grew.
 */
static ssize_t whole(int fd, void *buf, size_t len, bool out)
{
	size_t n = 0;
	ssize_t k;

	while (n < len) {
		k = out ? write(fd, (char *)buf + n, len - n) : read(fd, (char *)buf + n, len - n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -errno;
		if (k == 0)
			break;
		n += (size_t)k;
	}
	return (ssize_t)n;
}

/* The key in the n bytes of a key file: 0, or -EINVAL if they are not its form. */
static int decode(const uint8_t *buf, size_t n, uint8_t key[MIG_PSK_LEN])
{
	unsigned int bad = 0, hi, lo;
	size_t i;

	/* the form's length and its newline are no secret: only the digits are decoded without a branch */
	if (!(n == MIG_PSK_HEX || (n == MIG_PSK_HEX + 1 && buf[MIG_PSK_HEX] == '\n') ||
	      (n == MIG_PSK_HEX + 2 && buf[MIG_PSK_HEX] == '\r' && buf[MIG_PSK_HEX + 1] == '\n')))
		return -EINVAL;
	for (i = 0; i < MIG_PSK_LEN; i++) {
		bad |= !hex_value(buf[2 * i], &hi);
		bad |= !hex_value(buf[2 * i + 1], &lo);
		key[i] = (uint8_t)(hi << 4 | lo);
	}
	return bad ? -EINVAL : 0;
}

int mig_psk_load(const char *path, struct mig_psk *ret_psk, char *err, size_t len)
{
	uint8_t buf[MIG_PSK_FILE_MAX + 1];
	struct stat st;
	ssize_t n;
	int fd, ret;

	memset(ret_psk, 0, sizeof(*ret_psk));
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
	if (fd < 0)
		return open_failed(path, errno, err, len);
	if (fstat(fd, &st) < 0)
		ret = mig_errf(err, len, -errno, "--psk '%s': %s", path, strerror(errno));
	else
		ret = check_file(path, &st, err, len);
	if (ret < 0) {
		close(fd);
		return ret;
	}
	n = whole(fd, buf, sizeof(buf), false);
	close(fd);
	if (n < 0)
		ret = mig_errf(err, len, (int)n, "--psk '%s': %s", path, strerror((int)-n));
	else if (n != st.st_size)
		ret = mig_errf(err, len, -EINVAL, "--psk '%s': %zd bytes read where its size says %lld: a file of /proc "
			       "or /sys, or one that changed while read", path, n, (long long)st.st_size);
	else if (decode(buf, (size_t)n, ret_psk->key) < 0)
		ret = mig_errf(err, len, -EINVAL, "--psk '%s': not a key file (%zd bytes); " FORM, path, n);
	explicit_bzero(buf, sizeof(buf));
	if (ret < 0)
		mig_psk_clear(ret_psk);
	else
		ret_psk->len = MIG_PSK_LEN;
	return ret;
}

void mig_psk_clear(struct mig_psk *psk)
{
	explicit_bzero(psk, sizeof(*psk));
}

/* ---- genkey ---- */

/* The directory that holds path, fsync'd so that the new name lasts: best effort (it may not be readable). */
static void sync_dir(const char *path)
{
	char dir[PATH_MAX];
	const char *slash = strrchr(path, '/');
	int fd;

	if (!slash)
		snprintf(dir, sizeof(dir), ".");
	else if ((size_t)snprintf(dir, sizeof(dir), "%.*s", slash == path ? 1 : (int)(slash - path), path) >=
		 sizeof(dir))
		return;
	fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0) {
		fsync(fd);
		close(fd);
	}
}

/* The new file's mode, its content, on disk: 0, or -errno with the step that failed in *what. */
static int fill(int fd, char *buf, size_t len, const char **what)
{
	ssize_t n;

	*what = "setting its mode";
	if (fchmod(fd, 0600) < 0) /* whatever the umask */
		return -errno;
	*what = "writing it";
	n = whole(fd, buf, len, true);
	if (n < 0 || (size_t)n < len)
		return n < 0 ? (int)n : -EIO;
	*what = "syncing it";
	return fsync(fd) < 0 ? -errno : 0;
}

int mig_psk_generate(const char *path, char *err, size_t len)
{
	uint8_t key[MIG_PSK_LEN];
	char hex[MIG_PSK_HEX + 1];
	const char *what;
	size_t n = 0, i;
	ssize_t k;
	int fd, ret;

	while (n < sizeof(key)) {
		k = getrandom(key + n, sizeof(key) - n, 0);
		if (k < 0 && errno != EINTR) {
			ret = -errno;
			explicit_bzero(key, sizeof(key));
			return mig_errf(err, len, ret, "genkey '%s': getrandom: %s", path, strerror(-ret));
		}
		if (k > 0)
			n += (size_t)k;
	}
	for (i = 0; i < sizeof(key); i++) {
		hex[2 * i] = hex_digit(key[i] >> 4);
		hex[2 * i + 1] = hex_digit(key[i] & 0xf);
	}
	hex[MIG_PSK_HEX] = '\n';
	explicit_bzero(key, sizeof(key));
	fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY, 0600);
	if (fd < 0) {
		ret = -errno;
		explicit_bzero(hex, sizeof(hex));
		if (ret == -EEXIST)
			return mig_errf(err, len, ret, "genkey '%s': something of that name exists; genkey never "
				       "replaces a file (remove it, or name another)", path);
		return mig_errf(err, len, ret, "genkey '%s': %s", path, strerror(-ret));
	}
	ret = fill(fd, hex, sizeof(hex), &what);
	explicit_bzero(hex, sizeof(hex));
	if (close(fd) < 0 && ret == 0) {
		what = "closing it";
		ret = -errno;
	}
	if (ret < 0) {
		unlink(path); /* created above: ours, and not a key */
		return mig_errf(err, len, ret, "genkey '%s': %s: %s", path, what, strerror(-ret));
	}
	sync_dir(path);
	return 0;
}

/* ---- the process ---- */

int mig_psk_protect_process(char *err, size_t len)
{
	static const struct rlimit no_core = { 0, 0 };

	if (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0)
		return mig_errf(err, len, -errno, "prctl(PR_SET_DUMPABLE, 0): %s", strerror(errno));
	if (setrlimit(RLIMIT_CORE, &no_core) < 0)
		return mig_errf(err, len, -errno, "setrlimit(RLIMIT_CORE, 0): %s", strerror(errno));
	return 0;
}
