// SPDX-License-Identifier: MIT
/*
 * A stream socket through io_uring.  Each operation goes in with a linked
 * timeout, so a peer that stops sending or reading costs at most the
 * timeout; reads and writes take what the socket has (no MSG_WAITALL), so
 * the timeout bounds the time without progress, not the transfer.
 */
#define _GNU_SOURCE /* accept4 */
#include <errno.h>
#include <limits.h>
#include <liburing.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/sockios.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "clock.h"
#include "errf.h"
#include "kex.h"
#include "transport.h"

/*
 * An io_uring's rings are memory the kernel maps; one unmapped by a thread
 * may be mapped again at the same address for another thread's ring.
 * ThreadSanitizer sees no order between the two threads' accesses there
 * (munmap and mmap do not tell it), so every ring made is ordered after
 * every ring let go, through one sync object.
 */
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
static char ring_reuse;
#define RING_MADE() __tsan_acquire(&ring_reuse)
#define RING_GONE() __tsan_release(&ring_reuse)
#else
#define RING_MADE() ((void)0)
#define RING_GONE() ((void)0)
#endif

struct mig_conn {
	/* reads and writes each have a ring: one thread may read while another writes (post-copy's fault channel) */
	struct io_uring ring, wring;
	int fd;
	uint64_t sent;
	uint64_t timeout_ms;
	uint64_t deadline_ns; /* CLOCK_MONOTONIC; 0: none */
	bool torn;	      /* a read gave up part way: mig_conn_torn() */
};

/*
 * Submit the sqe just prepared, linked to a timeout of wait_ns (0: none),
 * and return its result; -ETIMEDOUT if the timeout cancelled it.
 */
static int run(struct io_uring *ring, struct io_uring_sqe *sqe, uint64_t wait_ns)
{
	struct __kernel_timespec ts = { (long long)(wait_ns / 1000000000u), (long long)(wait_ns % 1000000000u) };
	struct io_uring_cqe *cqe;
	int ret, res = -EIO, n = 1;
	bool fired = false;

	sqe->user_data = 1;
	if (wait_ns) {
		struct io_uring_sqe *t;

		sqe->flags |= IOSQE_IO_LINK;
		t = io_uring_get_sqe(ring);
		io_uring_prep_link_timeout(t, &ts, 0);
		t->user_data = 2;
		n = 2;
	}
	ret = io_uring_submit(ring);
	if (ret < 0)
		return ret;
	while (n--) {
		do
			ret = io_uring_wait_cqe(ring, &cqe);
		while (ret == -EINTR);
		if (ret < 0)
			return ret;
		if (cqe->user_data == 1)
			res = cqe->res;
		else
			fired = cqe->res == -ETIME;
		io_uring_cqe_seen(ring, cqe);
	}
	return fired && res < 0 ? -ETIMEDOUT : res;
}

/* How long the next wait may take: the timeout, cut at the deadline. */
static int wait_budget(const struct mig_conn *c, uint64_t *ret_ns)
{
	uint64_t ns = c->timeout_ms * 1000000u, now;

	if (c->deadline_ns) {
		now = mig_clock_ns();
		if (now >= c->deadline_ns)
			return -ETIMEDOUT;
		if (!ns || c->deadline_ns - now < ns)
			ns = c->deadline_ns - now;
	}
	*ret_ns = ns;
	return 0;
}

int mig_conn_new(int fd, uint64_t timeout_ms, struct mig_conn **ret_conn)
{
	struct mig_conn *c = calloc(1, sizeof(*c));
	int size = 4 << 20, one = 1, ret;

	if (!c)
		return -ENOMEM;
	c->fd = fd;
	c->timeout_ms = timeout_ms;
	/*
	 * Socket buffers of a few MiB: with the default ~200 KiB every batch
	 * goes out in hundreds of partial sends, each a poll round trip.
	 * The FORCE variants pass the sysctl caps where allowed (root).
	 */
	if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof(size)))
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof(size));
	if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof(size)))
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof(size));
	/*
	 * No Nagle (TCP; a Unix socket refuses the option, harmlessly): the
	 * pages go in large writes either way, but a small message after
	 * unacknowledged data (END, the handoff's READY, COMMIT and ACK, each
	 * inside the downtime) would otherwise wait for the peer's delayed
	 * acknowledgement, up to 40 ms.
	 */
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	ret = io_uring_queue_init(8, &c->ring, 0);
	if (ret < 0) {
		free(c);
		return ret;
	}
	ret = io_uring_queue_init(8, &c->wring, 0);
	if (ret < 0) {
		io_uring_queue_exit(&c->ring);
		free(c);
		return ret;
	}
	RING_MADE();
	*ret_conn = c;
	return 0;
}

void mig_conn_free(struct mig_conn *c)
{
	if (!c)
		return;
	RING_GONE();
	io_uring_queue_exit(&c->ring);
	io_uring_queue_exit(&c->wring);
	free(c);
}

void mig_conn_set_deadline(struct mig_conn *c, uint64_t ms)
{
	c->deadline_ns = ms ? mig_clock_ns() + ms * 1000000u : 0;
}

void mig_conn_set_timeout(struct mig_conn *c, uint64_t ms)
{
	c->timeout_ms = ms;
}

bool mig_conn_torn(const struct mig_conn *c)
{
	return c->torn;
}

void mig_conn_keepalive(struct mig_conn *c)
{
	int on = 1, idle = 2, intvl = 1, cnt = 5;

	/* a Unix socket refuses these: harmless */
	setsockopt(c->fd, SOL_SOCKET, SO_KEEPALIVE, &on, sizeof(on));
	setsockopt(c->fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
	setsockopt(c->fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
	setsockopt(c->fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
}

uint64_t mig_conn_sent(const struct mig_conn *c)
{
	/* a connection's own thread sends while the main thread measures the link */
	return __atomic_load_n(&c->sent, __ATOMIC_RELAXED);
}

uint64_t mig_conn_unacked(const struct mig_conn *c)
{
	int n = 0;

	/* TCP: sent and not acknowledged; a Unix socket: not yet read by the peer */
	if (ioctl(c->fd, SIOCOUTQ, &n) < 0 || n < 0)
		return 0;
	return (uint64_t)n;
}

uint64_t mig_conn_rtt_us(const struct mig_conn *c)
{
	struct tcp_info ti;
	socklen_t n = sizeof(ti);

	memset(&ti, 0, sizeof(ti));
	if (getsockopt(c->fd, IPPROTO_TCP, TCP_INFO, &ti, &n) < 0 || n < offsetof(struct tcp_info, tcpi_rttvar))
		return 0;
	return ti.tcpi_rtt;
}

void mig_conn_strerror(const struct mig_conn *c, int ret, char *buf, size_t len)
{
	if (ret != -ETIMEDOUT)
		snprintf(buf, len, "%s", strerror(-ret));
	else if (c->deadline_ns && mig_clock_ns() >= c->deadline_ns)
		snprintf(buf, len, "the connection's deadline passed");
	else
		snprintf(buf, len, "no progress with the peer for %llu ms", (unsigned long long)c->timeout_ms);
}

int mig_conn_read(struct mig_conn *c, void *buf, size_t len)
{
	return mig_conn_read_ahead(c, buf, len, len);
}

int mig_conn_read_ahead(struct mig_conn *c, void *buf, size_t len, size_t max)
{
	size_t got = 0;

	if (max > INT_MAX || max < len)
		return -EINVAL;
	while (got < len) {
		struct io_uring_sqe *sqe;
		uint64_t ns;
		int ret = wait_budget(c, &ns);

		if (ret == 0) {
			sqe = io_uring_get_sqe(&c->ring);
			io_uring_prep_recv(sqe, c->fd, (char *)buf + got, max - got, 0);
			ret = run(&c->ring, sqe, ns);
		}
		if (ret < 0) {
			c->torn |= got > 0;
			return ret;
		}
		if (!ret)
			break; /* the peer closed its side */
		got += (size_t)ret;
	}
	return (int)got;
}

int mig_conn_writev(struct mig_conn *c, struct iovec *iov, int n)
{
	while (n > 0) {
		struct msghdr msg = { .msg_iov = iov, .msg_iovlen = (size_t)(n < 1024 ? n : 1024) };
		struct io_uring_sqe *sqe;
		size_t done;
		uint64_t ns;
		int ret = wait_budget(c, &ns);

		if (ret < 0)
			return ret;
		sqe = io_uring_get_sqe(&c->wring);
		io_uring_prep_sendmsg(sqe, c->fd, &msg, MSG_NOSIGNAL);
		ret = run(&c->wring, sqe, ns);
		if (ret < 0)
			return ret;
		if (!ret)
			return -EPIPE;
		__atomic_fetch_add(&c->sent, (uint64_t)ret, __ATOMIC_RELAXED);
		for (done = (size_t)ret; n > 0 && done >= iov->iov_len; n--, iov++)
			done -= iov->iov_len;
		if (n > 0) {
			iov->iov_base = (char *)iov->iov_base + done;
			iov->iov_len -= done;
		}
	}
	return 0;
}

int mig_conn_close_write(struct mig_conn *c)
{
	return shutdown(c->fd, SHUT_WR) ? -errno : 0;
}

/* ---- addresses ---- */

static int resolve(const char *addr, struct sockaddr_storage *ss, socklen_t *sl, char *err, size_t len)
{
	if (!strncmp(addr, "unix:", 5)) {
		struct sockaddr_un *un = (struct sockaddr_un *)ss;

		if (!addr[5] || strlen(addr + 5) >= sizeof(un->sun_path))
			return mig_errf(err, len, -EINVAL, "address '%s': unix path empty or too long", addr);
		memset(un, 0, sizeof(*un));
		un->sun_family = AF_UNIX;
		strcpy(un->sun_path, addr + 5);
		*sl = sizeof(*un);
		return 0;
	}
	if (!strncmp(addr, "tcp:", 4)) {
		const char *colon = strrchr(addr + 4, ':');
		struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *ai;
		char host[256];
		size_t hl;
		int ret;

		if (!colon || !colon[1])
			return mig_errf(err, len, -EINVAL, "address '%s': expected tcp:HOST:PORT", addr);
		hl = (size_t)(colon - (addr + 4));
		if (hl >= sizeof(host))
			return mig_errf(err, len, -EINVAL, "address '%s': host too long", addr);
		memcpy(host, addr + 4, hl);
		host[hl] = 0;
		if (!hl) /* HOST empty: loopback */
			strcpy(host, "127.0.0.1");
		ret = getaddrinfo(host, colon + 1, &hints, &ai);
		if (ret)
			return mig_errf(err, len, -EINVAL, "address '%s': %s", addr, gai_strerror(ret));
		memcpy(ss, ai->ai_addr, ai->ai_addrlen);
		*sl = ai->ai_addrlen;
		freeaddrinfo(ai);
		return 0;
	}
	return mig_errf(err, len, -EINVAL, "address '%s': expected tcp:HOST:PORT or unix:PATH", addr);
}

int mig_addr_check(const char *addr, char *err, size_t len)
{
	struct sockaddr_storage ss;
	socklen_t sl;

	return resolve(addr, &ss, &sl, err, len);
}

int mig_listen(const char *addr, char *err, size_t len)
{
	struct sockaddr_storage ss;
	socklen_t sl;
	int fd, one = 1, ret = resolve(addr, &ss, &sl, err, len);

	if (ret < 0)
		return ret;
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return mig_errf(err, len, -errno, "socket: %s", strerror(errno));
	if (ss.ss_family == AF_UNIX)
		unlink(((struct sockaddr_un *)&ss)->sun_path);
	else
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&ss, sl) < 0 || listen(fd, 4) < 0) {
		ret = -errno;
		close(fd);
		return mig_errf(err, len, ret, "listening on '%s': %s", addr, strerror(-ret));
	}
	return fd;
}

int mig_accept(int lfd, char *err, size_t len)
{
	int fd;

	do
		fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	while (fd < 0 && (errno == EINTR || errno == ECONNABORTED));
	return fd < 0 ? mig_errf(err, len, -errno, "accept: %s", strerror(errno)) : fd;
}

int mig_connect(const char *addr, uint64_t timeout_ms, char *err, size_t len)
{
	struct sockaddr_storage ss;
	struct io_uring ring;
	socklen_t sl;
	int fd, ret = resolve(addr, &ss, &sl, err, len);

	if (ret < 0)
		return ret;
	mig_kex_ready(); /* a session's hello follows the connect at once */
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return mig_errf(err, len, -errno, "socket: %s", strerror(errno));
	ret = io_uring_queue_init(2, &ring, 0);
	if (ret == 0) {
		struct io_uring_sqe *sqe;

		RING_MADE();
		sqe = io_uring_get_sqe(&ring);

		io_uring_prep_connect(sqe, fd, (struct sockaddr *)&ss, sl);
		ret = run(&ring, sqe, timeout_ms * 1000000u);
		RING_GONE();
		io_uring_queue_exit(&ring);
	}
	if (ret < 0) {
		close(fd);
		if (ret == -ETIMEDOUT)
			return mig_errf(err, len, ret, "connecting to '%s': no answer in %llu ms", addr,
				    (unsigned long long)timeout_ms);
		return mig_errf(err, len, ret, "connecting to '%s': %s", addr, strerror(-ret));
	}
	return fd;
}
