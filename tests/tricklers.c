// SPDX-License-Identifier: MIT
/* Strangers trickling hellos from many addresses (tricklers.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include "session.h"
#include "tricklers.h"

struct one {
	int fd;
	size_t sent;	  /* bytes of the hello */
	uint64_t next_ms; /* its next byte, or its next dial */
};

struct tricklers {
	uint16_t port;
	unsigned int n, every_ms;
	int epfd;
	bool stop; /* __atomic */
	struct trickle_counts c; /* under lock */
	pthread_mutex_t lock;
	struct one *one;
	pthread_t thread;
};

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void dial(struct tricklers *t, unsigned int i)
{
	struct sockaddr_in me = { .sin_family = AF_INET }, to = { .sin_family = AF_INET, .sin_port = htons(t->port),
								   .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP, .data.u32 = i };
	struct one *o = &t->one[i];
	unsigned int a = i / 250;

	o->sent = 0;
	o->next_ms = now_ms() + 50; /* a dial that fails is tried again so much later */
	o->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (o->fd < 0)
		return;
	me.sin_addr.s_addr = htonl(127u << 24 | (20u + a / 250) << 16 | (a % 250) << 8 | (i % 250 + 1));
	if (bind(o->fd, (struct sockaddr *)&me, sizeof(me)) < 0 ||
	    (connect(o->fd, (struct sockaddr *)&to, sizeof(to)) < 0 && errno != EINPROGRESS) ||
	    epoll_ctl(t->epfd, EPOLL_CTL_ADD, o->fd, &ev) < 0) {
		close(o->fd);
		o->fd = -1;
		return;
	}
	o->next_ms = now_ms(); /* its first byte at once */
	pthread_mutex_lock(&t->lock);
	t->c.dials++;
	t->c.up++;
	pthread_mutex_unlock(&t->lock);
}

static void hang_up(struct tricklers *t, unsigned int i, bool ended)
{
	struct one *o = &t->one[i];

	close(o->fd);
	o->fd = -1;
	o->next_ms = now_ms() + 10;
	pthread_mutex_lock(&t->lock);
	t->c.up--;
	t->c.ended += ended;
	pthread_mutex_unlock(&t->lock);
}

static void *run(void *p)
{
	struct tricklers *t = p;
	struct mig_hello h = { .magic = MIG_SESSION_MAGIC, .version = MIG_SESSION_VERSION, .flags = MIG_S_PSK,
			       .conns = 1 };
	struct epoll_event ev[256];
	unsigned int i;

	memset(h.share, 7, sizeof(h.share));
	for (i = 0; i < t->n && !__atomic_load_n(&t->stop, __ATOMIC_ACQUIRE); i++)
		dial(t, i);
	while (!__atomic_load_n(&t->stop, __ATOMIC_ACQUIRE)) {
		uint64_t now;
		int n, k;

		n = epoll_wait(t->epfd, ev, 256, 10);
		for (k = 0; k < n; k++) {
			struct one *o = &t->one[ev[k].data.u32];
			char buf[4096];
			ssize_t r;

			if (o->fd < 0)
				continue;
			while ((r = recv(o->fd, buf, sizeof(buf), MSG_DONTWAIT)) > 0)
				;
			if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
				hang_up(t, ev[k].data.u32, true);
		}
		now = now_ms();
		for (i = 0; i < t->n; i++) {
			struct one *o = &t->one[i];

			if (o->next_ms > now)
				continue;
			if (o->fd < 0) {
				dial(t, i);
				continue;
			}
			o->next_ms = now + t->every_ms;
			/* never the whole hello: the listener would wait on its last byte */
			if (o->sent + 1 >= sizeof(h))
				continue;
			if (send(o->fd, (char *)&h + o->sent, 1, MSG_DONTWAIT | MSG_NOSIGNAL) == 1)
				o->sent++;
			else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != ENOTCONN)
				hang_up(t, i, true);
			else
				o->next_ms = now + 5; /* still connecting */
		}
	}
	for (i = 0; i < t->n; i++)
		if (t->one[i].fd >= 0)
			hang_up(t, i, false);
	return NULL;
}

struct tricklers *tricklers_start(uint16_t port, unsigned int n, unsigned int every_ms)
{
	struct tricklers *t = calloc(1, sizeof(*t));
	unsigned int i;

	if (!t || n > 62500 || !(t->one = calloc(n ? n : 1, sizeof(*t->one)))) {
		free(t);
		errno = ENOMEM;
		return NULL;
	}
	t->port = port;
	t->n = n;
	t->every_ms = every_ms;
	for (i = 0; i < n; i++)
		t->one[i].fd = -1;
	pthread_mutex_init(&t->lock, NULL);
	t->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (t->epfd < 0 || (errno = pthread_create(&t->thread, NULL, run, t))) {
		int e = errno;

		if (t->epfd >= 0)
			close(t->epfd);
		free(t->one);
		free(t);
		errno = e;
		return NULL;
	}
	return t;
}

void tricklers_counts(struct tricklers *t, struct trickle_counts *c)
{
	pthread_mutex_lock(&t->lock);
	*c = t->c;
	pthread_mutex_unlock(&t->lock);
}

void tricklers_stop(struct tricklers *t, struct trickle_counts *c)
{
	__atomic_store_n(&t->stop, true, __ATOMIC_RELEASE);
	pthread_join(t->thread, NULL);
	if (c)
		*c = t->c;
	close(t->epfd);
	pthread_mutex_destroy(&t->lock);
	free(t->one);
	free(t);
}
