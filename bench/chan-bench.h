/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_BENCH_CHAN_BENCH_H
#define KVMDIRTY_BENCH_CHAN_BENCH_H

/* The channel alone over TCP loopback, and the cipher alone (chan-bench.c). */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define CHANBENCH_MAX_CONNS 16

struct chanbench_cfg {
	bool sealed, encrypt;
	/*
	 * plain, each end's pages through a buffer of STAGE bytes in cache (a
	 * user-space copy each end, as sealing makes): the socket's own cost
	 * with the pages' copies in user space, not the kernel's
	 */
	bool staged;
	unsigned int conns;
	uint64_t bytes; /* in all, a multiple of 1 MiB a connection */
	uint8_t key[2][32];
};

struct chanbench_result {
	double mibps; /* payload, from the sender's first byte to the receiver's answer */
	double cpu_s_per_gib_src, cpu_s_per_gib_dst; /* each end's process CPU time per GiB of payload */
};

/* size bytes of anonymous memory, faulted in, each byte set to byte (as guest memory is); NULL if mmap fails */
uint8_t *chanbench_faulted(uint64_t size, int byte);
/* AES-256-GCM on this thread over records of record bytes: seal, open, MAC only, in MiB per CPU-second. */
int chanbench_cipher(size_t record, double secs, double out[3]);
/* One run: 0, or -errno (an end failed). */
int chanbench_run(const struct chanbench_cfg *cfg, struct chanbench_result *res);

#endif
