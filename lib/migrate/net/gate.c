// SPDX-License-Identifier: MIT
/*
 * The gate (gate.h): a thread for each handshake in progress, the
 * sessions waiting for their joins, the wrong proofs of each address.
 *
 * One lock over all of it.  The thread of mig_gate_take() accepts,
 * starts slots, cuts (shutdown(2) of a slot's socket, which ends any wait
 * of its handshake at once), drops sessions past their join deadline and
 * hands out the first complete one.  A slot's thread runs one
 * connection's handshake without the lock and, under it, files what came
 * of it: a session opened, a join adopted into its session, or a refusal
 * (then it closes its socket, under the lock, so that a cut never hits a
 * reused fd).  Each tells the taker through an eventfd.
 *
 * Before a slot, the waiting room (the taker's alone, no lock): every
 * accepted connection, without a thread, until its hello is whole in its
 * socket (SO_RCVLOWAT on TCP, so that a trickle of bytes wakes no one);
 * then, in the order their hellos came whole, the next free slot.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "clock.h"
#include "errf.h"
#include "gate.h"
#include "hooks.h"
#include "kex.h"

#define PEER_KEY 17 /* a family byte, and up to 16 bytes of address */

struct peer {
	uint8_t key[PEER_KEY];
	bool used;
	unsigned int wrong;
	uint64_t last_ms; /* the last wrong proof, or the last look */
};

/*
 * An address's refusals of one kind in the interval (gate.h): lines
 * logged, and how many more were only counted.  The kind: the reason's
 * text up to its first digit, so that one kind flooding leaves the first
 * lines of another (a bogus join beside empty connections) to be seen.
 */
#define LOG_KIND 48
struct log_addr {
	uint8_t key[PEER_KEY];
	char kind[LOG_KIND];
	char name[INET6_ADDRSTRLEN + 8]; /* the address without its port */
	bool used, told;
	unsigned int lines;
	uint64_t quiet, last_ms;
};

struct log_limit {
	pthread_mutex_t lock; /* also keeps o->log's lines whole and in order */
	uint64_t since_ms;    /* the interval's start */
	unsigned int lines;   /* refusal lines logged in it */
	uint64_t quiet;	      /* refusals only counted in it, in all */
	uint64_t other_quiet; /* ... of addresses no longer in a[] */
	unsigned int other_addrs;
	struct log_addr a[MIG_GATE_LOG_ADDRS];
};

enum slot_state { SLOT_FREE, SLOT_BUSY, SLOT_DONE };

struct slot {
	struct mig_gate *gate;
	struct mig_session_opts o; /* the gate's, its handshake's budget what the waiting room left of it */
	enum slot_state state;
	bool cut;	   /* shut down by the gate */
	int claim;	   /* o.claim's (session.h): answered, or cut */
	bool joining;	   /* a join of a session open here: never cut, its session waits for it */
	bool awaiting;	     /* a join in join(), waiting for its session to be filed */
	int fd;		   /* -1 once a session owns it */
	uint64_t since_ms; /* accepted */
	uint64_t start_ms; /* given its slot, its hello whole */
	uint8_t peer[PEER_KEY]; /* for the slots it holds: an IPv6 peer by its /64 */
	uint8_t who[PEER_KEY];	/* for its wrong proofs: an IPv6 peer by its whole address */
	char name[64]; /* the peer's address, for the log */
	pthread_t thread;
};

struct pending {
	bool used;
	struct mig_greeting first;
	bool joined[MIG_MAX_CONNS];
	unsigned int n, conns;
	uint64_t since_ms, end_ms;
	char name[64]; /* the peer of its first connection */
};

/*
 * The waiting room: a connection accepted, its hello not whole yet
 * (UNHEARD), or whole and waiting for a slot: a join of a session open
 * here (JOINING, seated first: its session waits for it), or any other
 * (HEARD); each list in the
 * order of accept(2).
 */
enum { UNHEARD, HEARD, JOINING, LISTS };

struct waiter {
	int fd; /* -1: free (then next: the next free one) */
	int list;
	int prev, next;
	uint32_t gen;	   /* told apart from the entry's earlier connections in epoll's events */
	uint32_t rtt_us;   /* TCP_INFO's, at accept */
	uint64_t since_ms; /* accepted */
	struct sockaddr_storage ss;
};

struct room {
	struct waiter *w; /* MIG_GATE_ROOM */
	int epfd;
	int head[LISTS], tail[LISTS], free;
	unsigned int n[LISTS];
	unsigned int cap;   /* MIG_GATE_ROOM, or less where RLIMIT_NOFILE leaves less */
	uint64_t hold_ms;   /* out of descriptors, nothing to give way: the backlog left alone till then */
};

struct mig_gate {
	int lfd, efd;
	int lfd_flags; /* the listening fd's file status flags as the caller gave it: restored at the end */
	struct room room;
	struct mig_gate_stats stats; /* __atomic */
	struct mig_session_opts o;
	pthread_mutex_t lock;
	pthread_cond_t opened; /* a session opened: joins waiting for it look again */
	struct slot slot[MIG_GATE_SLOTS];
	struct pending pending[MIG_GATE_PENDING];
	struct peer peer[MIG_GATE_PEERS];
	struct log_limit log;
	bool taken; /* under lock: a stream was taken; handshakes still going are cut, and told so */
	unsigned int filed; /* under lock: sessions filed so far (pending_open()) */
	unsigned int promoted; /* the taker's: ... as far as room_promote() has looked */
};

static void wake(struct mig_gate *gate)
{
	uint64_t one = 1;

	(void)!write(gate->efd, &one, sizeof(one));
}

/*
 * Under log.lock: the interval's counts told and cleared, where it is
 * over (or now, with force); every address counted apart forgotten.
 */
static void log_roll(struct mig_gate *gate, uint64_t now, bool force)
{
	struct log_limit *l = &gate->log;
	uint64_t secs = (now - l->since_ms + 999) / 1000;
	unsigned int told = 0;
	struct log_addr *a;
	char line[160];

	if (!force && now - l->since_ms < MIG_GATE_LOG_INTERVAL_MS)
		return;
	for (a = l->a; a < l->a + MIG_GATE_LOG_ADDRS; a++) {
		uint64_t quiet = 0;
		struct log_addr *b;

		if (!a->used || !a->quiet || a->told)
			continue;
		/* every kind of this address's, in one count */
		for (b = a; b < l->a + MIG_GATE_LOG_ADDRS; b++)
			if (b->used && !b->told && !memcmp(b->key, a->key, PEER_KEY)) {
				quiet += b->quiet;
				b->told = true;
			}
		if (told < MIG_GATE_LOG_SUMMARIES) {
			snprintf(line, sizeof(line), "%" PRIu64 " more refusals from %s in the last %" PRIu64 " s", quiet,
				 a->name, secs);
			gate->o.log(gate->o.log_ctx, line);
			told++;
		} else {
			l->other_quiet += quiet;
			l->other_addrs++;
		}
	}
	if (l->other_quiet) {
		snprintf(line, sizeof(line), "%" PRIu64 " more refusals from %u other addresses in the last %" PRIu64 " s",
			 l->other_quiet, l->other_addrs, secs);
		gate->o.log(gate->o.log_ctx, line);
	}
	memset(l->a, 0, sizeof(l->a));
	l->since_ms = now;
	l->lines = 0;
	l->quiet = l->other_quiet = 0;
	l->other_addrs = 0;
}

/* When the counts of the interval are due to be told (0: nothing counted). */
static uint64_t log_due(struct mig_gate *gate)
{
	uint64_t due;

	pthread_mutex_lock(&gate->log.lock);
	due = gate->log.quiet ? gate->log.since_ms + MIG_GATE_LOG_INTERVAL_MS : 0;
	pthread_mutex_unlock(&gate->log.lock);
	return due;
}

static void log_tell(struct mig_gate *gate, bool force)
{
	if (!gate->o.log)
		return;
	pthread_mutex_lock(&gate->log.lock);
	log_roll(gate, mig_clock_ms(), force);
	pthread_mutex_unlock(&gate->log.lock);
}

/*
 * Under log.lock: whether a refused connection's line goes out (line:
 * "from NAME...", key: the address, name: as peer_name() gives it, the
 * port dropped here), or (past the interval's allowance, gate.h) is only
 * counted.
 */
static bool log_allowed(struct mig_gate *gate, const uint8_t key[PEER_KEY], const char *name, const char *line)
{
	struct log_limit *l = &gate->log;
	struct log_addr *a, *old = &l->a[0];
	uint64_t now = mig_clock_ms();
	char kind[LOG_KIND] = "";
	const char *colon, *why;
	size_t k;

	/* the kind: the reason, after "from NAME", up to its first digit */
	why = strncmp(line, "from ", 5) ? line : line + 5 + strlen(name);
	for (k = 0; why[k] && (why[k] < '0' || why[k] > '9') && k + 1 < LOG_KIND; k++)
		kind[k] = why[k];
	kind[k] = 0;
	log_roll(gate, now, false);
	for (a = l->a; a < l->a + MIG_GATE_LOG_ADDRS; a++) {
		if (a->used && !memcmp(a->key, key, PEER_KEY) && !strcmp(a->kind, kind))
			break;
		if (!a->used || (old->used && a->last_ms < old->last_ms))
			old = a;
	}
	if (a == l->a + MIG_GATE_LOG_ADDRS) {
		/* a new address and kind: the least recent one's count goes to the others' */
		a = old;
		if (a->used && a->quiet) {
			l->other_quiet += a->quiet;
			l->other_addrs++;
		}
		*a = (struct log_addr){ .used = true };
		memcpy(a->key, key, PEER_KEY);
		memcpy(a->kind, kind, sizeof(kind));
		/* "1.2.3.4:5", "[::1]:5": the port goes (a peer's ports are all its own) */
		colon = name[0] == '[' ? strstr(name, "]:") : strrchr(name, ':');
		snprintf(a->name, sizeof(a->name), "%.*s", colon ? (int)(colon - name + (name[0] == '[')) : (int)strlen(name),
			 name);
	}
	a->last_ms = now;
	if (a->lines >= MIG_GATE_LOG_PER_ADDR || l->lines >= MIG_GATE_LOG_ALL) {
		a->quiet++;
		l->quiet++;
		return false;
	}
	a->lines++;
	l->lines++;
	return true;
}

/*
 * A line through o->log.  key and name: a refused connection's address
 * (the line "from NAME..."), its line bounded by log_allowed(); NULL: a
 * line always logged (a session dropped).
 */
static void log_line(struct mig_gate *gate, const uint8_t *key, const char *name, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static void log_line(struct mig_gate *gate, const uint8_t *key, const char *name, const char *fmt, ...)
{
	char line[512];
	va_list ap;

	if (!gate->o.log)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&gate->log.lock);
	if (!key || log_allowed(gate, key, name, line))
		gate->o.log(gate->o.log_ctx, line);
	pthread_mutex_unlock(&gate->log.lock);
}

/* ---- wrong proofs, by address ---- */

/*
 * Who a peer is.  An IPv4 address without its port; an IPv4-mapped IPv6
 * address, or one of NAT64's 64:ff9b::/96, as the IPv4 one it carries (a
 * dual-stack listener's IPv4 peers are each their own); a Unix socket's
 * peer by its user (uid, from SO_PEERCRED), so that one local user cannot
 * have another's source counted or cut.  An IPv6 address whole (whole:
 * its wrong proofs, its grace) or by its /64 (the slots a peer holds: one
 * host or site can take a whole /64, so a finer key would be no bound on
 * how many it opens).
 */
static void peer_key(const struct sockaddr *sa, uid_t uid, bool whole, uint8_t key[PEER_KEY])
{
	static const uint8_t nat64[12] = { 0, 0x64, 0xff, 0x9b }; /* 64:ff9b::/96, RFC 6052 */

	memset(key, 0, PEER_KEY);
	key[0] = (uint8_t)sa->sa_family;
	if (sa->sa_family == AF_INET) {
		memcpy(key + 1, &((const struct sockaddr_in *)sa)->sin_addr, 4);
	} else if (sa->sa_family == AF_INET6) {
		const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;

		if (IN6_IS_ADDR_V4MAPPED(a) || !memcmp(a->s6_addr, nat64, sizeof(nat64))) {
			key[0] = AF_INET;
			memcpy(key + 1, a->s6_addr + 12, 4);
		} else {
			memcpy(key + 1, a->s6_addr, whole ? 16 : 8);
		}
	} else {
		memcpy(key + 1, &uid, sizeof(uid));
	}
}

/* A Unix socket's peer's user; 0 (root) where the kernel does not say. */
static uid_t peer_uid(int fd)
{
	struct ucred cr;
	socklen_t l = sizeof(cr);

	return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &l) == 0 ? cr.uid : 0;
}

static void peer_name(const struct sockaddr *sa, char *buf, size_t len)
{
	char ip[INET6_ADDRSTRLEN] = "?";

	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)sa;

		inet_ntop(AF_INET, &in->sin_addr, ip, sizeof(ip));
		snprintf(buf, len, "%s:%u", ip, ntohs(in->sin_port));
	} else if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;

		inet_ntop(AF_INET6, &in6->sin6_addr, ip, sizeof(ip));
		snprintf(buf, len, "[%s]:%u", ip, ntohs(in6->sin6_port));
	} else {
		snprintf(buf, len, "a local peer");
	}
}

/* Under the lock: the entry of key; with make, one made (the least recent giving way). */
static struct peer *peer_find(struct mig_gate *gate, const uint8_t key[PEER_KEY], bool make)
{
	struct peer *p, *old = &gate->peer[0];

	for (p = gate->peer; p < gate->peer + MIG_GATE_PEERS; p++) {
		if (p->used && !memcmp(p->key, key, PEER_KEY))
			return p;
		if (!p->used || (old->used && p->last_ms < old->last_ms))
			old = p;
	}
	if (!make)
		return NULL;
	*old = (struct peer){ .used = true };
	memcpy(old->key, key, PEER_KEY);
	return old;
}

/* Under the lock: how long key must still wait before a handshake (0: none). */
static uint64_t peer_wait(struct mig_gate *gate, const uint8_t key[PEER_KEY])
{
	struct peer *p = peer_find(gate, key, false);
	uint64_t wait, now = mig_clock_ms();
	unsigned int over;

	if (!p || p->wrong < MIG_GATE_FREE_GUESSES)
		return 0;
	over = p->wrong - MIG_GATE_FREE_GUESSES;
	wait = over >= 16 ? MIG_GATE_WAIT_MAX_MS : (uint64_t)MIG_GATE_WAIT_MS << over;
	if (wait > MIG_GATE_WAIT_MAX_MS)
		wait = MIG_GATE_WAIT_MAX_MS;
	return p->last_ms + wait > now ? p->last_ms + wait - now : 0;
}

void mig_gate_stats(struct mig_gate *gate, struct mig_gate_stats *st)
{
	st->accepted = __atomic_load_n(&gate->stats.accepted, __ATOMIC_RELAXED);
	st->handshakes = __atomic_load_n(&gate->stats.handshakes, __ATOMIC_RELAXED);
	st->unheard = __atomic_load_n(&gate->stats.unheard, __ATOMIC_RELAXED);
	st->cut = __atomic_load_n(&gate->stats.cut, __ATOMIC_RELAXED);
}

unsigned int mig_gate_wrong_proofs(struct mig_gate *gate, const struct sockaddr *sa, uid_t uid)
{
	uint8_t key[PEER_KEY];
	struct peer *p;
	unsigned int n;

	peer_key(sa, uid, true, key);
	pthread_mutex_lock(&gate->lock);
	p = peer_find(gate, key, false);
	n = p ? p->wrong : 0;
	pthread_mutex_unlock(&gate->lock);
	return n;
}

/* ---- sessions waiting for their joins ---- */

/* Under the lock: the open session of this id. */
static struct pending *pending_find(struct mig_gate *gate, const uint8_t session[32])
{
	struct pending *p;

	for (p = gate->pending; p < gate->pending + MIG_GATE_PENDING; p++)
		if (p->used && p->n < p->conns && !CRYPTO_memcmp(p->first.session, session, 32))
			return p;
	return NULL;
}

/* Under the lock: drop a session, its connections closed. */
static void pending_drop(struct pending *p)
{
	mig_session_free(&p->first.s); /* own_fd: closes them */
	OPENSSL_cleanse(&p->first, sizeof(p->first));
	p->used = false;
}

/* Under the lock: a proven first connection (or a plain stream) filed; the session owns fd from now. */
static int pending_open(struct mig_gate *gate, struct slot *sl, struct mig_greeting *g, char *err, size_t len)
{
	struct pending *p, *old = NULL;

	if (sl->cut) { /* its socket is shut down: a session filed now could only fail later */
		mig_greeting_free(g);
		return mig_errf(err, len, -ECONNABORTED, "cut as it was proven: the house was full");
	}
	for (p = gate->pending; p < gate->pending + MIG_GATE_PENDING; p++) {
		if (!p->used)
			break;
		if (p->n < p->conns && (!old || p->since_ms < old->since_ms))
			old = p;
	}
	if (p == gate->pending + MIG_GATE_PENDING) {
		if (!old) {
			mig_greeting_free(g);
			return mig_errf(err, len, -EBUSY, "%d streams complete already", MIG_GATE_PENDING);
		}
		log_line(gate, NULL, NULL,
			 "session from %s dropped, %d others opening after it: its connections had not all joined",
			 old->name, MIG_GATE_PENDING);
		pending_drop(old);
		p = old;
	}
	*p = (struct pending){ .used = true, .first = *g, .n = 1, .since_ms = mig_clock_ms() };
	p->conns = g->hello.conns ? g->hello.conns : 1;
	p->end_ms = p->since_ms + mig_session_join_ms(&gate->o);
	p->joined[0] = true;
	p->first.s.own_fd[0] = true;
	snprintf(p->name, sizeof(p->name), "%s", sl->name);
	OPENSSL_cleanse(g, sizeof(*g));
	sl->fd = -1;
	if (p->conns > 1)
		gate->filed++; /* only a session with joins to come has joins to move up */
	pthread_cond_broadcast(&gate->opened);
	wake(gate); /* joins whose hellos came whole before it was filed move up (room_promote()) */
	return 0;
}

/*
 * A join: the session it names looked up (its first connection may still
 * be filing it: a wait, within the handshake's budget), its proofs made
 * on a copy without the lock, then, under it, adopted if the session is
 * still there.
 */
static int join(struct mig_gate *gate, struct slot *sl, struct mig_greeting *g, char *err, size_t len)
{
	uint64_t end = sl->since_ms + (gate->o.handshake_ms ? gate->o.handshake_ms : MIG_HANDSHAKE_MS);
	struct mig_greeting *first = calloc(1, sizeof(*first));
	bool joined[MIG_MAX_CONNS];
	struct pending *p;
	int ret;

	if (!first) {
		mig_greeting_free(g);
		return mig_errf(err, len, -ENOMEM, "out of memory");
	}
	pthread_mutex_lock(&gate->lock);
	sl->awaiting = true;
	while (!(p = pending_find(gate, g->hello.session)) && !sl->cut && mig_clock_ms() < end) {
		uint64_t now = mig_clock_ms(), ms = now < end && end - now < 100 ? end - now : 100;
		uint64_t at = mig_clock_ns() + ms * 1000000u; /* the cond's clock is the engine's (mig_gate_new()) */
		struct timespec ts = { .tv_sec = (time_t)(at / 1000000000u), .tv_nsec = (long)(at % 1000000000u) };

		pthread_cond_timedwait(&gate->opened, &gate->lock, &ts);
	}
	sl->awaiting = false;
	if (p && !sl->cut)
		/*
		 * Its session waits for it: never cut from now, as one seated
		 * from JOINING is not (it may have been seated before its
		 * session was filed)
		 */
		sl->joining = true;
	if (p) {
		first->hello = p->first.hello;
		memcpy(first->session, p->first.session, 32);
		memcpy(first->secret, p->first.secret, 32);
		memcpy(joined, p->joined, sizeof(joined));
	}
	pthread_mutex_unlock(&gate->lock);
	ret = mig_session_join(g, p ? first : NULL, joined, &gate->o, err, len);
	OPENSSL_cleanse(first, sizeof(*first));
	free(first);
	if (ret < 0)
		return ret;
	pthread_mutex_lock(&gate->lock);
	p = pending_find(gate, g->hello.session);
	if (sl->cut) {
		mig_greeting_free(g);
		ret = mig_errf(err, len, -ECONNABORTED, "connection %u: cut as it was proven", g->hello.conn);
	} else if (!p) {
		mig_greeting_free(g);
		ret = mig_errf(err, len, -ETIMEDOUT, "connection %u: its session was dropped meanwhile", g->hello.conn);
	} else if ((ret = mig_session_adopt(&p->first, p->joined, g, err, len)) == 0) {
		sl->fd = -1;
		if (++p->n == p->conns)
			wake(gate);
	}
	pthread_mutex_unlock(&gate->lock);
	return ret;
}

/* ---- a slot: one connection's handshake ---- */

static void *slot_run(void *arg)
{
	struct slot *sl = arg;
	struct mig_gate *gate = sl->gate;
	struct mig_greeting *g = calloc(1, sizeof(*g));
	char err[384];
	int ret;

	if (!g)
		ret = mig_errf(err, sizeof(err), -ENOMEM, "out of memory");
	else
		ret = mig_session_greet(sl->fd, &sl->o, MIG_GREET_CONNS | MIG_GREET_JOINS, g, err, sizeof(err));
	if (ret == 0 && g->join) {
		ret = join(gate, sl, g, err, sizeof(err));
	} else if (ret == 0) {
		MIG_HOOK_POINT(MIG_HOOK_GATE_ANSWERED, gate);
		pthread_mutex_lock(&gate->lock);
		ret = pending_open(gate, sl, g, err, sizeof(err));
		if (ret < 0 && sl->cut && gate->taken && sl->fd >= 0 &&
		    __atomic_load_n(&sl->claim, __ATOMIC_ACQUIRE) != MIG_CLAIM_ANSWERED) {
			/*
			 * Cut because another stream was taken: the handshake
			 * ended at its read without an answer of its own; say why
			 * (best effort, never waiting on the peer).
			 */
			struct mig_ack ack = { .status = -ECANCELED };

			snprintf(ack.message, sizeof(ack.message), "the destination took another stream first");
			(void)!send(sl->fd, &ack, sizeof(ack), MSG_DONTWAIT | MSG_NOSIGNAL);
			ret = mig_errf(err, sizeof(err), -ECANCELED, "%s", ack.message);
		}
		pthread_mutex_unlock(&gate->lock);
	}
	pthread_mutex_lock(&gate->lock);
	if (g && g->wrong_proof && !sl->cut) {
		struct peer *p = peer_find(gate, sl->who, true);

		p->wrong++;
		p->last_ms = mig_clock_ms();
	} else if (ret == 0 && gate->o.psk) {
		struct peer *p = peer_find(gate, sl->who, false);

		if (p)
			p->wrong = 0;
	}
	if (sl->fd >= 0) {
		close(sl->fd);
		sl->fd = -1;
	}
	sl->state = SLOT_DONE;
	pthread_mutex_unlock(&gate->lock);
	if (ret < 0)
		log_line(gate, sl->who, sl->name, "from %s%s: %s", sl->name, sl->cut ? " (cut)" : "", err);
	free(g);
	wake(gate);
	return NULL;
}

/*
 * Under the lock: whether a slot is free in a moment: a cut handshake has
 * still to end, or one has ended and is not reaped yet (its thread wakes
 * the taker).  No further handshake is cut meanwhile.
 */
static bool cutting(struct mig_gate *gate)
{
	struct slot *sl;

	for (sl = gate->slot; sl < gate->slot + MIG_GATE_SLOTS; sl++)
		if ((sl->state == SLOT_BUSY && sl->cut) || sl->state == SLOT_DONE)
			return true;
	return false;
}

/* Under the lock: the handshakes in progress from sl's address. */
static unsigned int slots_of(struct mig_gate *gate, const struct slot *sl, bool whole)
{
	const struct slot *o;
	unsigned int n = 0;

	for (o = gate->slot; o < gate->slot + MIG_GATE_SLOTS; o++)
		if (o->state == SLOT_BUSY && o->fd >= 0 &&
		    !memcmp(whole ? o->who : o->peer, whole ? sl->who : sl->peer, PEER_KEY))
			n++;
	return n;
}

/* One handshake's budget, whole, from accept(2): as session.c bounds it. */
static uint64_t budget_ms(const struct mig_gate *gate)
{
	uint64_t ms = gate->o.handshake_ms ? gate->o.handshake_ms : MIG_HANDSHAKE_MS;

	return gate->o.deadline_ms && gate->o.deadline_ms < ms ? gate->o.deadline_ms : ms;
}

/* The smoothed round trip of a TCP connection, in us (0: not TCP, or unknown). */
static uint32_t rtt_us(int fd)
{
	struct tcp_info ti;
	socklen_t l = sizeof(ti);

	if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &l) < 0 || l < offsetof(struct tcp_info, tcpi_rtt) + 4)
		return 0;
	return ti.tcpi_rtt;
}

/*
 * A handshake alone from its address (the whole address: a neighbour on
 * its /64 opening many does not take this from it) is not cut before it
 * has had this long since its hello was whole: MIG_GATE_GRACE_MS and four
 * of its round trips, at most a fifth of the budget; with more whole
 * hellos waiting than there are slots, the first part shrinks in
 * proportion, down to MIG_GATE_GRACE_MIN_MS.  What is left of a real
 * source's handshake then is one round trip and the proofs' arithmetic,
 * so strangers with many addresses, one handshake each, cannot cut it
 * before its round trips are done; those whose hellos are whole and who
 * then stall get through MIG_GATE_SLOTS handshakes a grace at most.  An
 * address holding several is cut at once, its oldest first.
 */
static uint64_t grace_ms(const struct mig_gate *gate, const struct slot *sl)
{
	unsigned int waiting = gate->room.n[HEARD] + gate->room.n[JOINING];
	uint64_t most = budget_ms(gate) / 5, ms = MIG_GATE_GRACE_MS;

	if (waiting > MIG_GATE_SLOTS)
		ms = ms * MIG_GATE_SLOTS / waiting;
	if (ms < MIG_GATE_GRACE_MIN_MS)
		ms = MIG_GATE_GRACE_MIN_MS;
	ms += 4 * (uint64_t)rtt_us(sl->fd) / 1000;
	return ms < most ? ms : most;
}

/*
 * Under the lock: cut a handshake in progress, unless one is being cut
 * already (or a slot is free in a moment), never a join of a session
 * open here, one answered "ok" (its claim taken) nor, while a session
 * answered is not filed yet, a join waiting for its session: the oldest of the peer (an
 * IPv6 /64) that holds the most slots, so that one peer opening
 * connections as fast as it can cuts its own, never everyone else's; a
 * handshake alone from its whole address only once past its grace.
 * 0, or how long until one may be cut (none may now).
 */
static uint64_t cut_oldest(struct mig_gate *gate)
{
	struct slot *sl, *old = NULL;
	uint64_t now = mig_clock_ms(), grace, soon = 0;
	unsigned int most = 0, n;
	bool unfiled = false;

	if (cutting(gate))
		return 0;
	/* a session answered "ok" and not filed yet: the joins waiting for one may be its */
	for (sl = gate->slot; sl < gate->slot + MIG_GATE_SLOTS; sl++)
		if (sl->state == SLOT_BUSY && sl->fd >= 0 && !sl->awaiting &&
		    __atomic_load_n(&sl->claim, __ATOMIC_ACQUIRE) == MIG_CLAIM_ANSWERED)
			unfiled = true;
	for (sl = gate->slot; sl < gate->slot + MIG_GATE_SLOTS; sl++) {
		if (sl->state != SLOT_BUSY || sl->fd < 0 || sl->joining || (sl->awaiting && unfiled) ||
		    __atomic_load_n(&sl->claim, __ATOMIC_ACQUIRE) == MIG_CLAIM_ANSWERED)
			continue;
		grace = grace_ms(gate, sl);
		if (now < sl->start_ms + grace && slots_of(gate, sl, true) == 1) {
			if (!soon || sl->start_ms + grace - now < soon)
				soon = sl->start_ms + grace - now;
			continue;
		}
		n = slots_of(gate, sl, false);
		if (!old || n > most || (n == most && sl->start_ms < old->start_ms)) {
			old = sl;
			most = n;
		}
	}
	if (old && !__atomic_compare_exchange_n(&old->claim, &(int){ MIG_CLAIM_OPEN }, MIG_CLAIM_CUT, false,
						 __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
		return 0; /* answered meantime: never cut now; its thread wakes the taker once it is filed */
	if (old) {
		old->cut = true;
		__atomic_add_fetch(&gate->stats.cut, 1, __ATOMIC_RELAXED);
		shutdown(old->fd, SHUT_RDWR);
		pthread_cond_broadcast(&gate->opened);
		return 0;
	}
	return soon;
}

/*
 * A connection whose hello is whole, accepted at since: turned away if its
 * address must wait, else a slot of its own, its handshake within what is
 * left of the budget.  1: the slot taken; 0: turned away, the slot free.
 */
static int start(struct mig_gate *gate, struct slot *sl, int fd, const struct sockaddr *sa, uint64_t since,
		 bool joining)
{
	uint64_t wait, now = mig_clock_ms(), budget = budget_ms(gate);
	pthread_attr_t attr;
	char why[160];
	uid_t uid;
	int ret;

	*sl = (struct slot){ .gate = gate, .o = gate->o, .fd = fd, .since_ms = since, .start_ms = now, .joining = joining };
	sl->o.handshake_ms = now - since < budget ? budget - (now - since) : 1;
	sl->o.claim = &sl->claim;
	uid = sa->sa_family == AF_UNIX ? peer_uid(fd) : 0;
	peer_key(sa, uid, false, sl->peer);
	peer_key(sa, uid, true, sl->who);
	peer_name(sa, sl->name, sizeof(sl->name));
	pthread_mutex_lock(&gate->lock);
	wait = peer_wait(gate, sl->who);
	pthread_mutex_unlock(&gate->lock);
	if (wait) {
		snprintf(why, sizeof(why), "too many wrong proofs of the key from this address: try again in %" PRIu64 " ms",
			 wait);
		mig_session_turn_away(fd, why);
		close(fd);
		log_line(gate, sl->who, sl->name, "from %s: turned away, %s", sl->name, why);
		return 0;
	}
	if (sa->sa_family != AF_UNIX)
		setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &(int){ 1 }, sizeof(int)); /* the room's, no more */
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, 256 << 10);
	__atomic_add_fetch(&gate->stats.handshakes, 1, __ATOMIC_RELAXED);
	sl->state = SLOT_BUSY;
	ret = -pthread_create(&sl->thread, &attr, slot_run, sl);
	pthread_attr_destroy(&attr);
	if (ret < 0) {
		sl->state = SLOT_FREE;
		mig_session_turn_away(fd, "the destination cannot take a connection now");
		close(fd);
		log_line(gate, sl->who, sl->name, "from %s: turned away, no thread for it: %s", sl->name, strerror(-ret));
		return 0;
	}
	return 1;
}

/* ---- the waiting room ---- */

/* The earlier of two times, 0 being none. */
static uint64_t earliest(uint64_t a, uint64_t b)
{
	return !a || (b && b < a) ? b : a;
}


static void room_unlink(struct room *r, int i)
{
	struct waiter *w = &r->w[i];

	if (w->prev >= 0)
		r->w[w->prev].next = w->next;
	else
		r->head[w->list] = w->next;
	if (w->next >= 0)
		r->w[w->next].prev = w->prev;
	else
		r->tail[w->list] = w->prev;
	r->n[w->list]--;
}

static void room_append(struct room *r, int i, int list)
{
	struct waiter *w = &r->w[i];

	w->list = list;
	w->next = -1;
	w->prev = r->tail[list];
	if (w->prev >= 0)
		r->w[w->prev].next = i;
	else
		r->head[list] = i;
	r->tail[list] = i;
	r->n[list]++;
}

static unsigned int room_count(const struct room *r)
{
	return r->n[UNHEARD] + r->n[HEARD] + r->n[JOINING];
}

/* Out of the room, its fd closed. */
static void room_release(struct room *r, int i)
{
	struct waiter *w = &r->w[i];

	room_unlink(r, i);
	if (w->fd >= 0)
		close(w->fd); /* epoll forgets it with it */
	w->fd = -1;
	w->next = r->free;
	r->free = i;
}

#define MAGIC_LEN ((int)sizeof(((struct mig_hello *)0)->magic))

/* Whether fd's first bytes are a session's magic (a session's source; else a plain stream, or nothing yet). */
static bool session_peer(int fd)
{
	char m[MAGIC_LEN];

	return recv(fd, m, sizeof(m), MSG_PEEK | MSG_DONTWAIT) == (ssize_t)sizeof(m) &&
	       !memcmp(m, MIG_SESSION_MAGIC, sizeof(m));
}

/*
 * Turn a waiter away: the peer told why (best effort, never waiting on
 * it) as it reads an answer there: a session's source a refusal hello
 * and its answer, as mig_session_turn_away() sends; anyone else the
 * answer alone (status), as a slot refusing a plain stream does.  The
 * refusal logged ("from A: ...").
 */
static void room_refuse(struct mig_gate *gate, int i, int status, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static void room_refuse(struct mig_gate *gate, int i, int status, const char *fmt, ...)
{
	struct waiter *w = &gate->room.w[i];
	struct {
		struct mig_hello h;
		struct mig_ack ack;
	} r = { .h = { .magic = MIG_SESSION_MAGIC, .version = MIG_SESSION_VERSION, .flags = MIG_S_REFUSED },
		.ack = { .status = status, .kind = MIG_MSG_REFUSED } };
	const struct sockaddr *sa = (const struct sockaddr *)&w->ss;
	uint8_t who[PEER_KEY];
	char name[64];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(r.ack.message, sizeof(r.ack.message), fmt, ap);
	va_end(ap);
	if (session_peer(w->fd)) {
		(void)!send(w->fd, &r, sizeof(r), MSG_DONTWAIT | MSG_NOSIGNAL);
	} else {
		r.ack.kind = 0;
		(void)!send(w->fd, &r.ack, sizeof(r.ack), MSG_DONTWAIT | MSG_NOSIGNAL);
	}
	peer_key(sa, sa->sa_family == AF_UNIX ? peer_uid(w->fd) : 0, true, who);
	peer_name(sa, name, sizeof(name));
	log_line(gate, who, name, "from %s: %s", name, r.ack.message);
	room_release(&gate->room, i);
}

/*
 * What became of a waiter's hello: still coming; whole (its bytes in the
 * socket, or its first eight not a session's magic: a plain stream, or
 * not a stream, which a slot says); or never to be whole, nor its
 * handshake done (the peer gone, or its end shut: a session needs its
 * proof): then *got says how much it sent.  A slot's handshake never
 * waits on a peer that has not sent its hello.
 */
enum { NOT_YET, WHOLE, GONE };

static int heard(int fd, int *got)
{
	char m[MAGIC_LEN];
	struct pollfd p = { .fd = fd, .events = POLLRDHUP };
	bool ended = poll(&p, 1, 0) == 1 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
	int avail = 0;
	ssize_t n;

	(void)!ioctl(fd, FIONREAD, &avail);
	*got = avail;
	n = recv(fd, m, sizeof(m), MSG_PEEK | MSG_DONTWAIT);
	if (n == (ssize_t)sizeof(m) && memcmp(m, MIG_SESSION_MAGIC, sizeof(m)))
		return WHOLE; /* a plain stream (whole with its end, too) */
	if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) || ended)
		return GONE;
	return avail >= (int)sizeof(struct mig_hello) ? WHOLE : NOT_YET;
}

/* A whole hello's list: JOINING for a join naming a session open here, else HEARD. */
static int hello_list(struct mig_gate *gate, int fd)
{
	struct mig_hello h;
	bool open;

	if (recv(fd, &h, sizeof(h), MSG_PEEK | MSG_DONTWAIT) != (ssize_t)sizeof(h) ||
	    memcmp(h.magic, MIG_SESSION_MAGIC, sizeof(h.magic)) || !(h.flags & MIG_S_JOIN))
		return HEARD;
	pthread_mutex_lock(&gate->lock);
	open = pending_find(gate, h.session) != NULL;
	pthread_mutex_unlock(&gate->lock);
	return open ? JOINING : HEARD;
}

/*
 * Sessions filed since the last look: joins naming one of them, whose
 * hellos came whole before it was (its source had its answer first), out
 * of HEARD into JOINING.  A look at every whole hello waiting, once a
 * session proven by its key (or, without one, a first connection) opens.
 */
static void room_promote(struct mig_gate *gate)
{
	struct room *r = &gate->room;
	unsigned int opened;
	int i, next;

	pthread_mutex_lock(&gate->lock);
	opened = gate->filed;
	pthread_mutex_unlock(&gate->lock);
	if (opened == gate->promoted)
		return;
	gate->promoted = opened;
	for (i = r->head[HEARD]; i >= 0; i = next) {
		next = r->w[i].next;
		if (hello_list(gate, r->w[i].fd) == JOINING) {
			room_unlink(r, i);
			room_append(r, i, JOINING);
		}
	}
}

/* An UNHEARD waiter looked at again: to a list of whole hellos, turned away, or left. */
static void room_listen(struct mig_gate *gate, int i)
{
	struct room *r = &gate->room;
	struct waiter *w = &r->w[i];
	int got, h;

	if (w->list != UNHEARD)
		return;
	h = heard(w->fd, &got);
	if (h == NOT_YET && w->ss.ss_family != AF_UNIX && got >= MAGIC_LEN && session_peer(w->fd))
		/* a session's magic: wake for the whole hello, not each byte of it */
		setsockopt(w->fd, SOL_SOCKET, SO_RCVLOWAT, &(int){ (int)sizeof(struct mig_hello) }, sizeof(int));
	if (h == NOT_YET)
		return;
	if (h == GONE) {
		__atomic_add_fetch(&gate->stats.unheard, 1, __ATOMIC_RELAXED);
		if (!got && gate->o.psk)
			room_refuse(gate, i, -EACCES, "authentication: the peer closed without a word");
		else
			room_refuse(gate, i, -ECONNRESET, "awaiting the header: the peer %s (%d bytes)",
				    got < (int)sizeof(struct mig_hello) ? "hung up before its hello was whole"
									: "shut its end after its hello",
				    got);
		return;
	}
	epoll_ctl(r->epfd, EPOLL_CTL_DEL, w->fd, NULL);
	room_unlink(r, i);
	room_append(r, i, hello_list(gate, w->fd));
}

/*
 * How long an UNHEARD waiter has for its hello, from accept: the budget
 * while the room is at most half full; beyond, less as it fills (none
 * when full), but never less than MIG_GATE_HELLO_MIN_MS and four of its
 * round trips (rtt_us: 0 for the least any waiter has).
 */
static uint64_t hello_ms(const struct mig_gate *gate, uint32_t rtt)
{
	unsigned int n = room_count(&gate->room), cap = gate->room.cap, half = cap / 2;
	uint64_t budget = budget_ms(gate), least = MIG_GATE_HELLO_MIN_MS + 4 * (uint64_t)rtt / 1000, ms;

	ms = n <= half ? budget : budget * (cap - (n < cap ? n : cap)) / (half ? half : 1);
	if (ms < least)
		ms = least;
	return ms < budget ? ms : budget;
}

/*
 * The waiters past their time, turned away: an UNHEARD one past its time
 * for its hello ("awaiting the header", as a slot would say), a whole
 * hello that found no slot within the budget.  When the next is due (0:
 * none).  Each later waiter of a list is younger, and an UNHEARD one's
 * time no shorter than the least: the look stops at the first that
 * cannot be due.
 */
static uint64_t room_expire(struct mig_gate *gate, uint64_t now)
{
	struct room *r = &gate->room;
	uint64_t least = hello_ms(gate, 0), next = 0;
	int i = r->head[UNHEARD], list;

	while (i >= 0) {
		struct waiter *w = &r->w[i];
		int after = w->next;
		uint64_t ms = hello_ms(gate, w->rtt_us);

		if (w->since_ms + least > now) {
			next = earliest(next, w->since_ms + least);
			break;
		}
		if (w->since_ms + ms <= now) {
			__atomic_add_fetch(&gate->stats.unheard, 1, __ATOMIC_RELAXED);
			room_refuse(gate, i, -ETIMEDOUT, "awaiting the header: no whole hello within %" PRIu64
				    " ms (%u connections waiting)", ms, room_count(r));
		} else {
			next = earliest(next, w->since_ms + ms);
		}
		i = after;
	}
	/*
	 * Whole hellos that found no slot within the budget: HEARD in the
	 * order of accept; JOINING (short: joins of open sessions) looked at
	 * whole, a join moved up from HEARD being older than those before it.
	 */
	for (list = HEARD; list <= JOINING; list++) {
		int next_i;

		for (i = r->head[list]; i >= 0; i = next_i) {
			next_i = r->w[i].next;
			if (r->w[i].since_ms + budget_ms(gate) > now) {
				next = earliest(next, r->w[i].since_ms + budget_ms(gate));
				if (list == HEARD)
					break;
				continue;
			}
			room_refuse(gate, i, -ETIMEDOUT, "no slot for its handshake within %" PRIu64 " ms (%u "
				    "connections waiting)", budget_ms(gate), room_count(r));
		}
	}
	return next;
}

/*
 * The oldest UNHEARD waiter whose hello is still not whole turned away
 * (why: the end of "given way to a later connection, ..."): false when
 * every waiter's hello is whole.  Each is looked at again first: a hello
 * that came whole since epoll's last word (the gate accepting a burst
 * meanwhile) is moved to its list, not lost, and a peer gone frees its
 * place without costing anyone theirs.  Each waiter leaves UNHEARD once,
 * so the looks cost one per connection.
 */
static bool room_give_way(struct mig_gate *gate, const char *why)
{
	struct room *r = &gate->room;
	unsigned int n = room_count(r);

	while (r->head[UNHEARD] >= 0) {
		int i = r->head[UNHEARD];

		room_listen(gate, i);
		if (room_count(r) < n)
			return true; /* its peer was gone */
		if (r->w[i].list != UNHEARD || r->head[UNHEARD] != i)
			continue; /* whole: it keeps its place; the next oldest */
		__atomic_add_fetch(&gate->stats.unheard, 1, __ATOMIC_RELAXED);
		room_refuse(gate, i, -EBUSY, "awaiting the header: given way to a later connection, %s", why);
		return true;
	}
	return false;
}

/*
 * Room for one more waiter: a free entry, or the oldest UNHEARD one
 * turned away to make it (-1: every waiter's hello is whole, none given
 * way).
 */
static int room_make(struct mig_gate *gate)
{
	struct room *r = &gate->room;
	char why[32];
	int i;

	if (room_count(r) >= r->cap) {
		snprintf(why, sizeof(why), "%u waiting", r->cap);
		if (!room_give_way(gate, why))
			return -1;
	}
	i = r->free;
	r->free = r->w[i].next;
	return i;
}

/* A connection accepted, into the room (or turned away: the room full of whole hellos). */
static void room_enter(struct mig_gate *gate, int fd, const struct sockaddr_storage *ss)
{
	struct room *r = &gate->room;
	struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP | EPOLLET };
	struct waiter *w;
	int i;

	__atomic_add_fetch(&gate->stats.accepted, 1, __ATOMIC_RELAXED);
	i = room_make(gate);
	if (i < 0) {
		mig_session_turn_away(fd, "the destination is busy: every place is taken by a connection whose "
					  "hello is whole");
		close(fd);
		__atomic_add_fetch(&gate->stats.unheard, 1, __ATOMIC_RELAXED);
		return;
	}
	w = &r->w[i];
	w->fd = fd;
	w->gen++;
	w->since_ms = mig_clock_ms();
	w->ss = *ss;
	w->rtt_us = 0;
	room_append(r, i, UNHEARD);
	if (ss->ss_family != AF_UNIX) {
		/*
		 * A trickle of bytes wakes no one: epoll says readable once the
		 * magic is here (a plain stream's header may be short), then
		 * once the whole hello is (room_listen())
		 */
		setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &(int){ MAGIC_LEN }, sizeof(int));
		w->rtt_us = rtt_us(fd);
	}
	ev.data.u64 = (uint64_t)w->gen << 32 | (uint32_t)i;
	if (epoll_ctl(r->epfd, EPOLL_CTL_ADD, fd, &ev) < 0) {
		/* not watched: given its slot whatever it sent, so that it is never lost */
		room_unlink(r, i);
		room_append(r, i, HEARD);
		return;
	}
	room_listen(gate, i); /* its hello may be here already */
}

/* The room's events: waiters whose hellos may have come whole, or whose peers left. */
static void room_events(struct mig_gate *gate)
{
	struct room *r = &gate->room;
	struct epoll_event ev[64];
	int n, k;

	while ((n = epoll_wait(r->epfd, ev, 64, 0)) > 0) {
		for (k = 0; k < n; k++) {
			uint32_t i = (uint32_t)ev[k].data.u64;

			if (i < MIG_GATE_ROOM && r->w[i].fd >= 0 && r->w[i].gen == (uint32_t)(ev[k].data.u64 >> 32))
				room_listen(gate, (int)i);
		}
		if (n < 64)
			break;
	}
}

/* Every waiter turned away, told why (status, why). */
static void room_empty(struct mig_gate *gate, int status, const char *why)
{
	int list;

	for (list = 0; list < LISTS; list++)
		while (gate->room.head[list] >= 0)
			room_refuse(gate, gate->room.head[list], status, "%s", why);
}

/*
 * The room's places: MIG_GATE_ROOM, or what RLIMIT_NOFILE leaves beside
 * two descriptors a slot, the sessions joining and 256 of the caller's.
 */
static unsigned int room_cap(void)
{
	struct rlimit rl;
	long spare;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0 || rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur > (rlim_t)1 << 30)
		return MIG_GATE_ROOM;
	spare = (long)rl.rlim_cur - 2 * MIG_GATE_SLOTS - MIG_GATE_PENDING * MIG_MAX_CONNS - 256;
	return spare < 16 ? 16 : spare < MIG_GATE_ROOM ? (unsigned int)spare : MIG_GATE_ROOM;
}

static int room_init(struct room *r)
{
	int i;

	r->w = calloc(MIG_GATE_ROOM, sizeof(*r->w));
	if (!r->w)
		return -ENOMEM;
	r->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (r->epfd < 0) {
		int ret = -errno;

		free(r->w);
		return ret;
	}
	for (i = 0; i < LISTS; i++)
		r->head[i] = r->tail[i] = -1;
	for (i = 0; i < MIG_GATE_ROOM; i++) {
		r->w[i].fd = -1;
		r->w[i].next = i + 1 < MIG_GATE_ROOM ? i + 1 : -1;
	}
	r->free = 0;
	r->cap = room_cap();
	return 0;
}

static void room_fini(struct room *r)
{
	close(r->epfd);
	free(r->w);
}

/* ---- the gate ---- */

int mig_gate_new(int lfd, const struct mig_session_opts *o, struct mig_gate **ret_gate)
{
	struct mig_gate *gate;
	socklen_t sl = sizeof(int);
	int fl, type;

	/*
	 * A stream socket that listens, or nothing: another kind of fd never
	 * has a connection to give, and its readiness would spin the gate.
	 */
	if (getsockopt(lfd, SOL_SOCKET, SO_TYPE, &type, &sl) < 0)
		return -errno;
	if (type != SOCK_STREAM)
		return -EPROTOTYPE;
	if (listen(lfd, MIG_GATE_BACKLOG) < 0) /* a listening socket's backlog may be raised so */
		return -errno;
	if (o->psk)
		mig_kex_ready(); /* not in the first slot's handshake */
	fl = fcntl(lfd, F_GETFL);
	if (fl < 0)
		return -errno;
	gate = calloc(1, sizeof(*gate));
	if (!gate)
		return -ENOMEM;
	gate->lfd = lfd;
	gate->lfd_flags = fl;
	gate->o = *o;
	gate->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (gate->efd < 0) {
		int ret = -errno;

		free(gate);
		return ret;
	}
	if ((fl = room_init(&gate->room)) < 0) {
		close(gate->efd);
		free(gate);
		return fl;
	}
	pthread_mutex_init(&gate->lock, NULL);
	pthread_mutex_init(&gate->log.lock, NULL);
	gate->log.since_ms = mig_clock_ms();
	{
		pthread_condattr_t ca;

		pthread_condattr_init(&ca);
		pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
		pthread_cond_init(&gate->opened, &ca);
		pthread_condattr_destroy(&ca);
	}
	fcntl(lfd, F_SETFL, gate->lfd_flags | O_NONBLOCK);
	*ret_gate = gate;
	return 0;
}

/* A slot's state, read under the lock (its thread sets DONE). */
static enum slot_state state_of(struct mig_gate *gate, struct slot *sl)
{
	enum slot_state st;

	pthread_mutex_lock(&gate->lock);
	st = sl->state;
	pthread_mutex_unlock(&gate->lock);
	return st;
}

/* Join the threads of the slots that are done (without the lock: each has let go of it). */
static void reap(struct mig_gate *gate)
{
	struct slot *sl;

	for (sl = gate->slot; sl < gate->slot + MIG_GATE_SLOTS; sl++)
		if (state_of(gate, sl) == SLOT_DONE) {
			pthread_join(sl->thread, NULL);
			sl->state = SLOT_FREE;
		}
}

/* Cut every handshake in progress, wait for them all; drop every session but keep (or NULL). */
static void cut_all(struct mig_gate *gate, struct pending *keep)
{
	struct pending *p;
	struct slot *sl;

	pthread_mutex_lock(&gate->lock);
	gate->taken = true;
	for (sl = gate->slot; sl < gate->slot + MIG_GATE_SLOTS; sl++)
		if (sl->state == SLOT_BUSY && !sl->cut) {
			sl->cut = true;
			/* reading only: its thread still answers the peer (slot_run()) */
			if (sl->fd >= 0)
				shutdown(sl->fd, SHUT_RD);
		}
	pthread_cond_broadcast(&gate->opened);
	pthread_mutex_unlock(&gate->lock);
	/* as the slots' handshakes, the connections still waiting for one */
	room_empty(gate, -ECANCELED, "the destination took another stream first");
	for (sl = gate->slot; sl < gate->slot + MIG_GATE_SLOTS; sl++)
		if (state_of(gate, sl) != SLOT_FREE) {
			pthread_join(sl->thread, NULL);
			sl->state = SLOT_FREE;
		}
	for (p = gate->pending; p < gate->pending + MIG_GATE_PENDING; p++)
		if (p->used && p != keep) {
			log_line(gate, NULL, NULL, "session from %s dropped: another stream was taken first", p->name);
			pending_drop(p);
		}
}

/* Under the lock: drop the sessions past their join deadline; the first complete one, or NULL. */
static struct pending *sweep(struct mig_gate *gate, uint64_t *next_ms)
{
	struct pending *p, *done = NULL;
	uint64_t now = mig_clock_ms();

	*next_ms = 0;
	for (p = gate->pending; p < gate->pending + MIG_GATE_PENDING; p++) {
		if (!p->used)
			continue;
		if (p->n == p->conns) {
			if (!done || p->since_ms < done->since_ms)
				done = p;
			continue;
		}
		if (now >= p->end_ms) {
			log_line(gate, NULL, NULL,
				 "session from %s dropped: %u of its %u connections joined within %" PRIu64 " ms",
				 p->name, p->n, p->conns, mig_session_join_ms(&gate->o));
			pending_drop(p);
			continue;
		}
		if (!*next_ms || p->end_ms < *next_ms)
			*next_ms = p->end_ms;
	}
	return done;
}

/* Whole hellos to the free slots: joins of open sessions first, then in the order they came whole. */
static void seat(struct mig_gate *gate)
{
	struct room *r = &gate->room;
	struct slot *sl = gate->slot;

	while (sl < gate->slot + MIG_GATE_SLOTS && (r->head[JOINING] >= 0 || r->head[HEARD] >= 0)) {
		bool joining = r->head[JOINING] >= 0;
		int i = joining ? r->head[JOINING] : r->head[HEARD];
		struct sockaddr_storage ss = r->w[i].ss;
		uint64_t since = r->w[i].since_ms;
		int fd = r->w[i].fd;

		if (state_of(gate, sl) != SLOT_FREE) {
			sl++;
			continue;
		}
		r->w[i].fd = -1; /* the slot's now */
		room_release(r, i);
		sl += start(gate, sl, fd, (struct sockaddr *)&ss, since, joining); /* turned away: the slot for the next */
	}
}

/*
 * Drain the listener's backlog into the room.  0, or -errno with a line
 * in err when accepting itself fails (not a peer's doing).
 */
static int drain(struct mig_gate *gate, char *err, size_t len)
{
	unsigned int k;

	for (k = 0; k < 256; k++) {
		struct sockaddr_storage ss;
		socklen_t sl_len = sizeof(ss);
		int fd = accept4(gate->lfd, (struct sockaddr *)&ss, &sl_len, SOCK_CLOEXEC);

		if (fd < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO || errno == ENETDOWN ||
			    errno == ENOPROTOOPT || errno == EHOSTDOWN || errno == ENONET || errno == EHOSTUNREACH ||
			    errno == EOPNOTSUPP || errno == ENETUNREACH)
				continue;
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
				/*
				 * Out of descriptors: the oldest connection whose hello is
				 * not whole gives way; with none, a handshake, and the
				 * peer waits in the backlog.
				 */
				if (room_give_way(gate, "the destination out of descriptors"))
					continue;
				pthread_mutex_lock(&gate->lock);
				cut_oldest(gate);
				pthread_mutex_unlock(&gate->lock);
				gate->room.hold_ms = mig_clock_ms() + 10; /* not a spin on the listener meanwhile */
				return 0;
			}
			return mig_errf(err, len, -errno, "accept: %s", strerror(errno));
		}
		if (sl_len < sizeof(sa_family_t))
			ss.ss_family = AF_UNIX;
		room_enter(gate, fd, &ss);
		MIG_HOOK_POINT(MIG_HOOK_GATE_ENTERED, &fd);
	}
	return 0;
}

int mig_gate_take(struct mig_gate *gate, struct mig_session *ret_s, char *err, size_t len)
{
	pthread_mutex_lock(&gate->lock);
	gate->taken = false; /* every handshake of the last take was cut and is over */
	pthread_mutex_unlock(&gate->lock);
	for (;;) {
		struct pollfd pfd[3] = { { .fd = gate->efd, .events = POLLIN },
					 { .fd = gate->lfd, .events = POLLIN },
					 { .fd = gate->room.epfd, .events = POLLIN } };
		struct pending *done;
		uint64_t next_ms, now, v;
		int ret, timeout;

		reap(gate);
		pthread_mutex_lock(&gate->lock);
		done = sweep(gate, &next_ms);
		pthread_mutex_unlock(&gate->lock);
		if (done) {
			unsigned int i;

			cut_all(gate, done);
			*ret_s = done->first.s;
			ret_s->conns = done->conns;
			memcpy(ret_s->id, done->first.session, sizeof(ret_s->id));
			memcpy(ret_s->name, done->first.hello.name, sizeof(ret_s->name));
			/* from now, the stream's own bound */
			for (i = 0; i < ret_s->conns; i++)
				mig_conn_set_deadline(ret_s->conn[i], gate->o.deadline_ms);
			OPENSSL_cleanse(&done->first, sizeof(done->first));
			done->used = false;
			return 0;
		}
		room_events(gate);
		room_promote(gate);
		now = mig_clock_ms();
		next_ms = earliest(next_ms, room_expire(gate, now));
		seat(gate);
		if (gate->room.head[HEARD] >= 0 || gate->room.head[JOINING] >= 0) {
			/* whole hellos waiting, every slot taken: a handshake gives way (or, all in their grace, one will) */
			uint64_t soon;

			pthread_mutex_lock(&gate->lock);
			soon = cut_oldest(gate);
			pthread_mutex_unlock(&gate->lock);
			if (soon)
				next_ms = earliest(next_ms, now + soon);
		}
		/* refusals only counted: told once their interval is over, even if nothing else comes */
		log_tell(gate, false);
		next_ms = earliest(next_ms, log_due(gate));
		if (gate->room.hold_ms > mig_clock_ms()) {
			pfd[1].events = 0;
			next_ms = earliest(next_ms, gate->room.hold_ms);
		}
		timeout = -1;
		if (next_ms) {
			now = mig_clock_ms();
			timeout = next_ms > now ? (int)(next_ms - now > INT32_MAX ? INT32_MAX : next_ms - now) : 0;
		}
		ret = poll(pfd, 3, timeout);
		if (ret < 0 && errno != EINTR)
			return mig_errf(err, len, -errno, "poll: %s", strerror(errno));
		if (ret <= 0)
			continue;
		if (pfd[0].revents & POLLIN)
			(void)!read(gate->efd, &v, sizeof(v));
		if ((pfd[1].revents & (POLLIN | POLLERR | POLLHUP)) && (ret = drain(gate, err, len)) < 0)
			return ret;
	}
}

void mig_gate_free(struct mig_gate *gate)
{
	if (!gate)
		return;
	cut_all(gate, NULL);
	log_tell(gate, true); /* the refusals only counted so far */
	room_fini(&gate->room);
	close(gate->efd);
	pthread_cond_destroy(&gate->opened);
	pthread_mutex_destroy(&gate->lock);
	pthread_mutex_destroy(&gate->log.lock);
	OPENSSL_cleanse(gate->peer, sizeof(gate->peer));
	fcntl(gate->lfd, F_SETFL, gate->lfd_flags); /* the caller's fd as it came */
	free(gate);
}
