/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_TRANSPORT_H
#define KVMDIRTY_MIGRATE_TRANSPORT_H

/*
 * The engine's transport: a connected stream socket driven through
 * io_uring, and the addresses both ends take.  Every wait for the peer
 * (connect, each read, each write) gives up after timeout_ms without
 * progress, and none outlives the connection's deadline when one is set;
 * 0 means no limit.  Functions return -errno; -ETIMEDOUT when the peer
 * kept the engine waiting past either.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

struct mig_conn;

/* Drive fd (not taken over: the caller closes it after mig_conn_free()). */
int mig_conn_new(int fd, uint64_t timeout_ms, struct mig_conn **ret_conn);
void mig_conn_free(struct mig_conn *c);

/* Every wait ends by now + ms at the latest (0: no deadline). */
void mig_conn_set_deadline(struct mig_conn *c, uint64_t ms);
/* Each wait from now on gives up after ms without progress (0: waits as long as it takes). */
void mig_conn_set_timeout(struct mig_conn *c, uint64_t ms);
/*
 * A read gave up (timeout, deadline) after it had taken some of its bytes:
 * they are gone, and what the connection reads next is not where the
 * reader thinks it is.
 */
bool mig_conn_torn(const struct mig_conn *c);

/*
 * Read len bytes (len <= INT_MAX).  Returns len; fewer when the peer
 * closed its side first (a clean end of the stream, 0 at its very end);
 * -ETIMEDOUT, or -errno of the socket.
 */
int mig_conn_read(struct mig_conn *c, void *buf, size_t len);
/*
 * The same, taking also what else the socket holds up to max bytes in
 * all (len <= max <= INT_MAX), never waiting for more than len: one
 * system call can bring a record and the next one's header.  Returns the
 * bytes read, len .. max (fewer than len only at the end of the stream).
 */
int mig_conn_read_ahead(struct mig_conn *c, void *buf, size_t len, size_t max);
/* Send all of iov[0..n); iov is consumed.  0, -ETIMEDOUT or -errno. */
int mig_conn_writev(struct mig_conn *c, struct iovec *iov, int n);
/*
 * A peer gone silent is found out within seconds (TCP keepalive: idle 2
 * s, probes every second, 5 unanswered), where waits have no timeout
 * (post-copy); a no-op on other sockets.
 */
void mig_conn_keepalive(struct mig_conn *c);
/* Nothing more will be sent: the peer reads the end of the stream. */
int mig_conn_close_write(struct mig_conn *c);

uint64_t mig_conn_sent(const struct mig_conn *c);
/* Of what was sent, the bytes still in the socket or on the link: not yet acknowledged (TCP) or read (Unix). */
uint64_t mig_conn_unacked(const struct mig_conn *c);
/* The round trip to the peer in microseconds as TCP smooths it (TCP_INFO); 0 where unknown (Unix sockets). */
uint64_t mig_conn_rtt_us(const struct mig_conn *c);

/* A few words on a negative result: "nothing from the peer for 30000 ms", ... */
void mig_conn_strerror(const struct mig_conn *c, int ret, char *buf, size_t len);

/*
 * Where a destination's bytes come from: a connection's channel
 * (channel.h), or memory (the tests and the fuzzer).  read() is
 * mig_conn_read()'s contract; describe() puts a negative read result in
 * words.
 */
struct mig_reader {
	int (*read)(void *ctx, void *buf, size_t len);
	void (*describe)(void *ctx, int ret, char *buf, size_t len);
	void *ctx;
};

/*
 * "tcp:HOST:PORT" (HOST empty: loopback) or "unix:PATH".  Each returns an
 * fd or -errno with a one-line reason naming the address in err.
 */
int mig_listen(const char *addr, char *err, size_t len);
int mig_accept(int lfd, char *err, size_t len);
int mig_connect(const char *addr, uint64_t timeout_ms, char *err, size_t len);
/* 0 where addr parses and its host resolves; else as above, before anything is built. */
int mig_addr_check(const char *addr, char *err, size_t len);

#endif
