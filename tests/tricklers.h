/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_TEST_TRICKLERS_H
#define KVMDIRTY_TEST_TRICKLERS_H

/*
 * Strangers at a TCP listener on 127.0.0.1: n connections, each from an
 * address of its own in 127.0.0.0/8 (127.20.0.1 on), each sending a
 * session hello (with a key, connection 0) a byte every every_ms and
 * never its last byte, and dialling again as soon as the listener ends
 * it.  One thread drives them all (non-blocking sockets, epoll), so that
 * thousands cost the host little beyond what the listener does with them.
 */
#include <stdint.h>

struct tricklers;

struct trickle_counts {
	uint64_t dials;	 /* connections made, all told */
	uint64_t ended;	 /* of those, ended by the listener */
	unsigned int up; /* connected now */
};

/* NULL (with errno) where the thread cannot start; n at most 62,500. */
struct tricklers *tricklers_start(uint16_t port, unsigned int n, unsigned int every_ms);

void tricklers_counts(struct tricklers *t, struct trickle_counts *c);

/* Stop them, every connection closed; the last counts in c (or NULL). */
void tricklers_stop(struct tricklers *t, struct trickle_counts *c);

#endif
