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
 * Parse s (decimal digits, or 0x and hex digits; an optional K/M/G suffix;
 * no blanks, no sign, and a leading 0 is still decimal) into [min, max];
 * 0, or -1 after printing "prog: opt 's': expected a number in [min, max]".
 */
static inline int cli_number(const char *prog, const char *opt, const char *s, uint64_t min, uint64_t max,
			     uint64_t *ret)
{
	const char *digits = s;
	unsigned long long v = 0;
	unsigned int shift = 0;
	int base = 10;
	char *end = (char *)s;

	if (s[0] == '0' && (s[1] == 'x' || s[1] == 'X'))
		digits = s + 2, base = 16;
	errno = 0;
	/* strtoull itself would take blanks and a sign first */
	if ((*digits >= '0' && *digits <= '9') || (base == 16 && ((*digits | 0x20) >= 'a' && (*digits | 0x20) <= 'f')))
		v = strtoull(digits, &end, base);
	if (*end == 'K' || *end == 'k')
		shift = 10, end++;
	else if (*end == 'M' || *end == 'm')
		shift = 20, end++;
	else if (*end == 'G' || *end == 'g')
		shift = 30, end++;
	if (end == s || errno || *end || v > (UINT64_MAX >> shift) || (v << shift) < min || (v << shift) > max) {
		fprintf(stderr, "%s: %s '%s': expected a number in [%" PRIu64 ", %" PRIu64 "]\n", prog, opt, s, min,
			max);
		return -1;
	}
	*ret = (uint64_t)v << shift;
	return 0;
}

#endif
