/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_TEST_UTIL_H
#define KVMDIRTY_TEST_UTIL_H

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Run one suite; the exit status meson reads. */
static inline int run_suite(Suite *s)
{
	SRunner *sr = srunner_create(s);
	int failed;

	srunner_run_all(sr, CK_NORMAL);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? 1 : 0;
}

/*
 * ck_assert_msg() for hot loops: Check reports every passing assertion to
 * its parent process through a pipe, a write(2) each; this only calls into
 * Check when the condition fails.
 */
#define expect(cond, ...)                                                                     \
	do {                                                                                  \
		if (!(cond))                                                                  \
			ck_abort_msg(__VA_ARGS__);                                            \
	} while (0)

#define ck_assert_ok(expr)                                                                    \
	do {                                                                                  \
		int __r = (expr);                                                             \
		ck_assert_msg(__r >= 0, "%s = %d (%s)", #expr, __r, strerror(-__r));          \
	} while (0)

#define ck_assert_errno(expr, err)                                                            \
	do {                                                                                  \
		int __r = (expr);                                                             \
		ck_assert_msg(__r == -(err), "%s = %d (%s), expected -%s", #expr, __r,        \
			      __r < 0 ? strerror(-__r) : "success", #err);                     \
	} while (0)

#endif
