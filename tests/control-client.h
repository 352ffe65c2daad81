/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_TEST_CONTROL_CLIENT_H
#define KVMDIRTY_TEST_CONTROL_CLIENT_H

/*
 * A client of the control socket (lib/migrate/control/control.h) for the
 * tests: blocking, every wait at most 5 s, each reply line checked.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <check.h>

/* A connection to p, or -1 with errno. */
static inline int dial(const char *p)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	snprintf(a.sun_path, sizeof(a.sun_path), "%s", p);
	if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static inline int connect_to(const char *p)
{
	struct timeval tv = { 5, 0 };
	int fd = dial(p);

	ck_assert_msg(fd >= 0, "connect %s: %s", p, strerror(errno));
	ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
	ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)), 0);
	return fd;
}

/* The next line, newline included; false when the server closed the connection first. */
static inline bool get_line(int fd, char *line, size_t len)
{
	size_t n = 0;
	ssize_t k;

	while (n + 1 < len) {
		k = recv(fd, line + n, 1, 0);
		if (k < 0 && errno == EINTR)
			continue;
		ck_assert_msg(k >= 0 || errno == ECONNRESET, "recv: %s", strerror(errno));
		if (k <= 0)
			break;
		if (line[n++] == '\n')
			break;
	}
	line[n] = 0;
	ck_assert_msg(n == 0 || line[n - 1] == '\n', "closed inside a line: '%s'", line);
	return n > 0;
}

static inline void expect_line(int fd, const char *want)
{
	char got[4096];

	ck_assert_msg(get_line(fd, got, sizeof(got)), "closed; expected %s", want);
	ck_assert_str_eq(got, want);
}

static inline void expect_closed(int fd)
{
	char got[4096];

	ck_assert_msg(!get_line(fd, got, sizeof(got)), "expected the end, got %s", got);
	close(fd);
}

/* All of s, or false when the server has closed the connection. */
static inline bool send_all(int fd, const char *s, size_t n)
{
	while (n) {
		ssize_t k = send(fd, s, n, MSG_NOSIGNAL);

		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0) {
			ck_assert_msg(errno == EPIPE || errno == ECONNRESET, "send: %s", strerror(errno));
			return false;
		}
		s += k;
		n -= (size_t)k;
	}
	return true;
}

#endif
