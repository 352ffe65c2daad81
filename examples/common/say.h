/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_EXAMPLES_SAY_H
#define KVMDIRTY_EXAMPLES_SAY_H

/* One line of error text into a caller's buffer, for the example tools' helpers. */
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

/* Format one line into err (len bytes; nothing where err is NULL or len 0); returns ret. */
static inline int say(char *err, size_t len, int ret, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static inline int say(char *err, size_t len, int ret, const char *fmt, ...)
{
	va_list ap;

	if (err && len) {
		va_start(ap, fmt);
		vsnprintf(err, len, fmt, ap);
		va_end(ap);
	}
	return ret;
}

#endif
