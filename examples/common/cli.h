/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_EXAMPLES_CLI_H
#define KVMDIRTY_EXAMPLES_CLI_H

/* Command-line numbers for the example tools: one line naming the bad input. */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/*
 * Parse s (decimal, 0x hex, optional K/M/G suffix) into [min, max];
 * 0, or -1 after printing "prog: opt 's': expected a number in [min, max]".
 */
static inline int cli_number(const char *prog, const char *opt, const char *s, uint64_t min, uint64_t max,
			     uint64_t *ret)
{
	unsigned long long v;
	unsigned int shift = 0;
	char *end;

	errno = 0;
	v = strtoull(s, &end, 0);
	if (*end == 'K' || *end == 'k')
		shift = 10, end++;
	else if (*end == 'M' || *end == 'm')
		shift = 20, end++;
	else if (*end == 'G' || *end == 'g')
		shift = 30, end++;
	if (errno || *end || !*s || s[0] == '-' || v > (UINT64_MAX >> shift) || (v << shift) < min ||
	    (v << shift) > max) {
		fprintf(stderr, "%s: %s '%s': expected a number in [%" PRIu64 ", %" PRIu64 "]\n", prog, opt, s, min,
			max);
		return -1;
	}
	*ret = (uint64_t)v << shift;
	return 0;
}

#endif
