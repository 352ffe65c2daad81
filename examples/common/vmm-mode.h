/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_EXAMPLES_VMM_MODE_H
#define KVMDIRTY_EXAMPLES_VMM_MODE_H

/*
 * What an example VMM does with its guest, from its command line: run it,
 * migrate it (--migrate-to ADDR), receive one (--incoming ADDR), snapshot
 * it (--snapshot PREFIX) or restore one (--restore FILE...).  Errors are
 * one line on stderr naming the option, and the exit status 2.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

enum vmm_mode { RUN, MIGRATE_TO, INCOMING, SNAPSHOT, RESTORE };

struct vmm_mode_args {
	enum vmm_mode mode;
	const char *addr;   /* --migrate-to's or --incoming's */
	const char *prefix; /* --snapshot's */
	char **files;	    /* --restore's, in argv */
	unsigned int nr_files;
};

/* Take mode m (arg: its address or prefix): 0, or 2 after the line where a mode was already given. */
static inline int vmm_mode_set(const char *prog, struct vmm_mode_args *a, enum vmm_mode m, const char *arg)
{
	if (a->mode != RUN) {
		fprintf(stderr, "%s: --migrate-to, --incoming, --snapshot and --restore: one at most\n", prog);
		return 2;
	}
	a->mode = m;
	if (m == SNAPSHOT)
		a->prefix = arg;
	else
		a->addr = arg;
	return 0;
}

/* The arguments after the options (argv[optind..]): --restore's files, else none. 0 or 2 said. */
static inline int vmm_mode_rest(const char *prog, struct vmm_mode_args *a, int argc, char **argv, int optind)
{
	if (a->mode == RESTORE) {
		a->files = argv + optind;
		a->nr_files = (unsigned int)(argc - optind);
		if (!a->nr_files) {
			fprintf(stderr, "%s: --restore: no snapshot file given\n", prog);
			return 2;
		}
	} else if (optind != argc) {
		fprintf(stderr, "%s: unexpected argument '%s'\n", prog, argv[optind]);
		return 2;
	}
	return 0;
}

/* Sleep ms milliseconds, whatever signals come meanwhile. */
static inline void vmm_sleep_ms(uint64_t ms)
{
	struct timespec ts = { (time_t)(ms / 1000), (long)(ms % 1000) * 1000000 };

	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}

#endif
