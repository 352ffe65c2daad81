/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_CLOCK_H
#define KVMDIRTY_MIGRATE_CLOCK_H

/*
 * The engine's one clock: CLOCK_MONOTONIC, never wall time (a step of
 * the wall clock must move no deadline and no figure).  In nanoseconds,
 * whole milliseconds (deadlines) or fractional milliseconds (figures).
 */
#include <pthread.h>
#include <stdint.h>
#include <time.h>

static inline uint64_t mig_clock_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline uint64_t mig_clock_ms(void)
{
	return mig_clock_ns() / 1000000u;
}

static inline double mig_clock_msf(void)
{
	return (double)mig_clock_ns() / 1e6;
}

/* CPU time a thread has used (a live or not yet joined one), in ns; 0 where it cannot be read. */
static inline uint64_t mig_thread_cpu_ns(pthread_t t)
{
	struct timespec ts;
	clockid_t c;

	if (pthread_getcpuclockid(t, &c) || clock_gettime(c, &ts))
		return 0;
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

#endif
