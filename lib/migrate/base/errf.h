/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_ERRF_H
#define KVMDIRTY_MIGRATE_ERRF_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

/* The engine's error convention: a one-line reason in err, ret (-errno) returned. */
static inline int mig_errf(char *err, size_t len, int ret, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static inline int mig_errf(char *err, size_t len, int ret, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err, len, fmt, ap);
	va_end(ap);
	return ret;
}

#endif
