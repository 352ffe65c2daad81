// SPDX-License-Identifier: MIT
/*
 * The control socket (control.h): one thread, one poll() over a wakeup
 * eventfd, the listening socket and the clients.  Every socket is
 * non-blocking: a client's requests are read as they come, a chunk a
 * round, and its replies wait in a bounded buffer of its own until it reads
 * them, so that no client holds the thread or another client's reply; only
 * the ops can, and they are the daemon's.
 */
#define _GNU_SOURCE /* accept4, struct ucred */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <kvmdirty-version.h>

#include "control.h"
#include "errf.h"
#include "json.h"

/* a longest line and its newline */
#define IN_SIZE (MIG_CONTROL_MAX_LINE + 1)
/* accept(2) out of descriptors or memory: the listener rests this long instead of waking poll() at once */
#define ACCEPT_REST_MS 100

/*
 * Keys in the replies are written KEY("name"), never as a quoted literal
 * followed by a colon: tests/check-man.py takes every such literal in these
 * sources for a statistics key that kvmdirty-migrate-stream(5) must list.
 */
#define KEY(k) "\"" k "\":"

static const char greeting[] = "{" KEY("QMP") "{" KEY("version") "{" KEY("kvmdirty-migrate") "\""
	KVMDIRTY_VERSION_STRING "\"}," KEY("capabilities") "[]}}\n";

static const char generic[] = "GenericError";

struct client {
	int fd;
	char *in; /* IN_SIZE bytes: what came after the last whole line */
	size_t in_len;
	char *out; /* replies not sent yet: out[out_off..out_len) */
	size_t out_off, out_len, out_cap;
	bool overflow; /* a reply did not fit MIG_CONTROL_MAX_OUTPUT (or memory): dropped, not cut */
	bool done;     /* closed after what is queued has gone out */
	bool sub;      /* subscribed: events are fed to it */
	uint64_t seq;  /* ... the next one for it */
	uint64_t lost; /* ... and how many it missed, not yet told */
};

struct mig_control {
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	bool bound, running, accept_rest;
	dev_t dev; /* the socket file this server made: unlinked only if still there */
	ino_t ino;
	uid_t uid;
	int lfd, wake;
	int efd; /* the ops' event fd, or -1 */
	pthread_t thread;
	const struct mig_control_ops *ops;
	void *ctx;
	struct client *clients[MIG_CONTROL_MAX_CLIENTS];
	unsigned int n;
	char query[MIG_CONTROL_QUERY_SIZE];
};

/* What a request names, for its reply. */
struct request {
	const char *line;	     /* as it came: the id is echoed from it */
	const struct mig_json *id;   /* NULL: none */
	const struct mig_json *args; /* NULL: none */
};

/* ---- text ---- */

/* The length of the UTF-8 sequence at s (RFC 3629: shortest form, no surrogates), or 0. */
static size_t utf8_len(const unsigned char *s, size_t n)
{
	unsigned char lo = 0x80, hi = 0xbf;
	size_t len, i;

	if (s[0] < 0x80)
		return 1;
	if (s[0] >= 0xc2 && s[0] <= 0xdf)
		len = 2;
	else if (s[0] >= 0xe0 && s[0] <= 0xef)
		len = 3;
	else if (s[0] >= 0xf0 && s[0] <= 0xf4)
		len = 4;
	else
		return 0;
	if (s[0] == 0xe0)
		lo = 0xa0;
	else if (s[0] == 0xed)
		hi = 0x9f;
	else if (s[0] == 0xf0)
		lo = 0x90;
	else if (s[0] == 0xf4)
		hi = 0x8f;
	if (n < len)
		return 0;
	for (i = 1; i < len; i++, lo = 0x80, hi = 0xbf)
		if (s[i] < lo || s[i] > hi)
			return 0;
	return len;
}

/* Where s[0..len) has a NUL or stops being UTF-8; len if nowhere. */
static size_t bad_byte(const char *s, size_t len)
{
	size_t i, k;

	for (i = 0; i < len; i += k) {
		k = utf8_len((const unsigned char *)s + i, len - i);
		if (!s[i] || !k)
			return i;
	}
	return len;
}

static bool blank(const char *s, size_t len)
{
	size_t i;

	for (i = 0; i < len; i++)
		if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
			return false;
	return true;
}

static bool same(const struct mig_json *str, const char *s)
{
	return str->type == MIG_JSON_STRING && str->str.len == strlen(s) && !memcmp(str->str.s, s, str->str.len);
}

/* ---- replies ---- */

/* Append to c's replies; past the bound, or out of memory, c is marked to be dropped. */
static void put(struct client *c, const void *s, size_t n)
{
	size_t cap;
	char *p;

	if (c->overflow)
		return;
	if (c->out_len - c->out_off + n > MIG_CONTROL_MAX_OUTPUT) {
		c->overflow = true;
		return;
	}
	if (c->out_len + n > c->out_cap && c->out_off) {
		memmove(c->out, c->out + c->out_off, c->out_len - c->out_off);
		c->out_len -= c->out_off;
		c->out_off = 0;
	}
	if (c->out_len + n > c->out_cap) {
		cap = c->out_cap ? c->out_cap * 2 : 4096;
		if (cap < c->out_len + n)
			cap = c->out_len + n;
		p = realloc(c->out, cap);
		if (!p) {
			c->overflow = true;
			return;
		}
		c->out = p;
		c->out_cap = cap;
	}
	memcpy(c->out + c->out_len, s, n);
	c->out_len += n;
}

#define put_lit(c, s) put(c, s, sizeof(s) - 1)

/* How much of s[0..n) goes into a JSON string as it is: UTF-8 but for '"', '\' and control characters. */
static size_t plain_run(const char *s, size_t n)
{
	size_t i, k;

	for (i = 0; i < n; i += k) {
		k = utf8_len((const unsigned char *)s + i, n - i);
		if (!k || (unsigned char)s[i] < 0x20 || s[i] == '"' || s[i] == '\\')
			break;
	}
	return i;
}

/* s as a JSON string: '"', '\' and control characters escaped, a byte that is not UTF-8 as U+FFFD. */
static void put_str(struct client *c, const char *s, size_t n)
{
	static const char hex[] = "0123456789abcdef";
	size_t i;

	put_lit(c, "\"");
	for (i = 0; i < n; i++) {
		size_t run = plain_run(s + i, n - i);
		unsigned char ch;

		put(c, s + i, run);
		i += run;
		if (i == n)
			break;
		ch = (unsigned char)s[i];
		if (ch == '"' || ch == '\\')
			put(c, (char[]){ '\\', (char)ch }, 2);
		else if (ch < 0x20)
			put(c, (char[]){ '\\', 'u', '0', '0', hex[ch >> 4], hex[ch & 15] }, 6);
		else
			put_lit(c, "\\ufffd");
	}
	put_lit(c, "\"");
}

/* A reply's end: the request's id as it came, if it had one, and the newline. */
static void put_end(struct client *c, const struct request *r)
{
	if (r && r->id) {
		put_lit(c, "," KEY("id"));
		put(c, r->line + r->id->offset, r->id->end - r->id->offset);
	}
	put_lit(c, "}\n");
}

static void reply_empty(struct client *c, const struct request *r)
{
	put_lit(c, "{" KEY("return") "{}");
	put_end(c, r);
}

/* {"error":{"class":CLASS,"desc":DESC}}, with r's id if it has one. */
static void __attribute__((format(printf, 4, 5)))
reply_error(struct client *c, const struct request *r, const char *class, const char *fmt, ...)
{
	char desc[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(desc, sizeof(desc), fmt, ap);
	va_end(ap);
	put_lit(c, "{" KEY("error") "{" KEY("class"));
	put_str(c, class, strlen(class));
	put_lit(c, "," KEY("desc"));
	put_str(c, desc, strlen(desc));
	put_lit(c, "}");
	put_end(c, r);
}

/* ---- commands ---- */

/*
 * Each member of obj is one of allowed (NULL-terminated), once; else the
 * error, naming the member as what (QMP's words), and false.
 */
static bool members_ok(struct client *c, const struct request *r, const struct mig_json *obj,
		       const char *const *allowed, const char *what)
{
	size_t i, j;

	for (i = 0; obj && i < obj->obj.n; i++) {
		const struct mig_json *key = &obj->obj.m[i].key;

		for (j = 0; allowed[j] && !same(key, allowed[j]); j++)
			;
		if (!allowed[j]) {
			reply_error(c, r, generic, "%s '%s' is unexpected", what, key->str.s);
			return false;
		}
		if (mig_json_get(obj, allowed[j]) != &obj->obj.m[i].v) {
			reply_error(c, r, generic, "%s '%s' is given twice", what, key->str.s);
			return false;
		}
	}
	return true;
}

static bool no_arguments(struct client *c, const struct request *r)
{
	static const char *const none[] = { NULL };

	return members_ok(c, r, r->args, none, "Parameter");
}

static void cmd_capabilities(struct mig_control *s, struct client *c, const struct request *r)
{
	if (no_arguments(c, r))
		reply_empty(c, r);
}

/* The ops' text is one JSON object in UTF-8; its newlines, white space in it, become spaces. */
static bool one_object(char *text, size_t len)
{
	struct mig_json v;
	struct mig_json_error e;
	bool ok;
	size_t i;

	if (len >= MIG_CONTROL_QUERY_SIZE || bad_byte(text, len) != len || mig_json_parse(text, len, &v, &e) < 0)
		return false;
	ok = v.type == MIG_JSON_OBJECT;
	mig_json_free(&v);
	for (i = 0; i < len; i++)
		if (text[i] == '\n' || text[i] == '\r')
			text[i] = ' ';
	return ok;
}

static void cmd_query(struct mig_control *s, struct client *c, const struct request *r)
{
	size_t len;
	int ret;

	if (!no_arguments(c, r))
		return;
	s->query[0] = 0;
	ret = s->ops->query(s->ctx, s->query, sizeof(s->query));
	if (ret < 0) {
		reply_error(c, r, generic, "the daemon cannot say: %s", strerror(-ret));
		return;
	}
	len = strnlen(s->query, sizeof(s->query));
	if (!one_object(s->query, len)) {
		reply_error(c, r, generic, "the daemon's answer is not one JSON object");
		return;
	}
	put_lit(c, "{" KEY("return"));
	put(c, s->query, len);
	put_end(c, r);
}

/* "run" of resolve's arguments: 1 for "here", 0 for "nowhere"; else the error, and -1. */
static int run_argument(struct client *c, const struct request *r)
{
	static const char *const args[] = { "run", NULL };
	const struct mig_json *run;

	if (!members_ok(c, r, r->args, args, "Parameter"))
		return -1;
	run = mig_json_get(r->args, "run");
	if (!run) {
		reply_error(c, r, generic, "Parameter 'run' is missing");
		return -1;
	}
	if (run->type != MIG_JSON_STRING) {
		reply_error(c, r, generic, "Invalid parameter type for 'run', expected: string");
		return -1;
	}
	if (same(run, "here") || same(run, "nowhere"))
		return same(run, "here");
	reply_error(c, r, generic, "Parameter 'run' does not accept value '%s'", run->str.s);
	return -1;
}

static void cmd_resolve(struct mig_control *s, struct client *c, const struct request *r)
{
	char err[MIG_CONTROL_ERR_SIZE] = "";
	int here = run_argument(c, r), ret;

	if (here < 0)
		return;
	ret = s->ops->resolve(s->ctx, here, err, sizeof(err));
	err[sizeof(err) - 1] = 0;
	if (ret < 0)
		reply_error(c, r, generic, "%s", err[0] ? err : strerror(-ret));
	else
		reply_empty(c, r);
}

static void cmd_set(struct mig_control *s, struct client *c, const struct request *r)
{
	char err[MIG_CONTROL_ERR_SIZE] = "";
	int ret;

	ret = s->ops->set(s->ctx, r->args, err, sizeof(err));
	err[sizeof(err) - 1] = 0;
	if (ret < 0)
		reply_error(c, r, generic, "%s", err[0] ? err : strerror(-ret));
	else
		reply_empty(c, r);
}

static void cmd_cancel_or(struct mig_control *s, struct client *c, const struct request *r,
			  int (*op)(void *ctx, const char **class, char *err, size_t len))
{
	char err[MIG_CONTROL_ERR_SIZE] = "";
	const char *class = NULL;
	int ret;

	if (!no_arguments(c, r))
		return;
	ret = op(s->ctx, &class, err, sizeof(err));
	err[sizeof(err) - 1] = 0;
	if (ret < 0)
		reply_error(c, r, class ? class : generic, "%s", err[0] ? err : strerror(-ret));
	else
		reply_empty(c, r);
}

static void cmd_cancel(struct mig_control *s, struct client *c, const struct request *r)
{
	cmd_cancel_or(s, c, r, s->ops->cancel);
}

static void cmd_postcopy_start(struct mig_control *s, struct client *c, const struct request *r)
{
	cmd_cancel_or(s, c, r, s->ops->postcopy_start);
}

/* recover, with an optional "addr" (a string without NULs): post-copy paused tries again, there */
static void cmd_recover(struct mig_control *s, struct client *c, const struct request *r)
{
	static const char *const args[] = { "addr", NULL };
	char err[MIG_CONTROL_ERR_SIZE] = "";
	const struct mig_json *addr;
	const char *class = NULL;
	int ret;

	if (!members_ok(c, r, r->args, args, "Parameter"))
		return;
	addr = mig_json_get(r->args, "addr");
	if (addr && (addr->type != MIG_JSON_STRING || strlen(addr->str.s) != addr->str.len || !addr->str.len)) {
		reply_error(c, r, generic, "Invalid parameter type for 'addr', expected: string");
		return;
	}
	ret = s->ops->recover(s->ctx, addr ? addr->str.s : NULL, &class, err, sizeof(err));
	err[sizeof(err) - 1] = 0;
	if (ret < 0)
		reply_error(c, r, class ? class : generic, "%s", err[0] ? err : strerror(-ret));
	else
		reply_empty(c, r);
}

/* Events from the next one on; a second subscribe is answered and changes nothing. */
static void cmd_subscribe(struct mig_control *s, struct client *c, const struct request *r)
{
	if (!no_arguments(c, r))
		return;
	if (!c->sub) {
		c->sub = true;
		c->seq = s->ops->event_head(s->ctx);
		c->lost = 0;
	}
	reply_empty(c, r);
}

static const struct command {
	const char *name;
	void (*run)(struct mig_control *s, struct client *c, const struct request *r);
	size_t op; /* the op the command needs (offsetof in struct mig_control_ops), or 0 */
} commands[] = {
	{ "qmp_capabilities", cmd_capabilities, 0 },
	{ "query", cmd_query, 0 },
	{ "resolve", cmd_resolve, 0 },
	{ "set", cmd_set, offsetof(struct mig_control_ops, set) },
	{ "cancel", cmd_cancel, offsetof(struct mig_control_ops, cancel) },
	{ "postcopy-start", cmd_postcopy_start, offsetof(struct mig_control_ops, postcopy_start) },
	{ "recover", cmd_recover, offsetof(struct mig_control_ops, recover) },
	{ "subscribe", cmd_subscribe, offsetof(struct mig_control_ops, event) },
};

/* Whether the ops have what command k needs. */
static bool served(const struct mig_control *s, size_t k)
{
	const void *const *op;

	if (!commands[k].op)
		return true;
	op = (const void *const *)((const char *)s->ops + commands[k].op);
	return *op != NULL && (commands[k].run != cmd_subscribe || s->efd >= 0);
}

/* ---- requests ---- */

/* A request that parsed: false when it cannot be one and c is to be closed. */
static bool serve_request(struct mig_control *s, struct client *c, const struct mig_json *v, struct request *r)
{
	static const char *const top[] = { "execute", "arguments", "id", NULL };
	const struct mig_json *exec;
	size_t i;

	if (v->type != MIG_JSON_OBJECT) {
		reply_error(c, NULL, generic, "QMP input must be a JSON object");
		return false;
	}
	r->id = mig_json_get(v, "id");
	exec = mig_json_get(v, "execute");
	if (!exec || exec->type != MIG_JSON_STRING) {
		reply_error(c, r, generic, exec ? "QMP input member 'execute' must be a string" :
						  "QMP input lacks member 'execute'");
		return false;
	}
	if (!members_ok(c, r, v, top, "QMP input member"))
		return true;
	r->args = mig_json_get(v, "arguments");
	if (r->args && r->args->type != MIG_JSON_OBJECT) {
		reply_error(c, r, generic, "QMP input member 'arguments' must be an object");
		return true;
	}
	for (i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (same(exec, commands[i].name) && served(s, i)) {
			commands[i].run(s, c, r);
			return true;
		}
	reply_error(c, r, "CommandNotFound", "The command %s has not been found", exec->str.s);
	return true;
}

/* One line, its newline taken off: false when c is to be closed. */
static bool serve_line(struct mig_control *s, struct client *c, const char *line, size_t len)
{
	struct request r = { .line = line };
	struct mig_json_error e;
	struct mig_json v;
	size_t bad;
	bool keep;
	int ret;

	if (blank(line, len))
		return true;
	bad = bad_byte(line, len);
	if (bad < len) {
		reply_error(c, NULL, generic, line[bad] ? "not UTF-8 at byte %zu" : "a NUL byte at byte %zu", bad);
		return false;
	}
	ret = mig_json_parse(line, len, &v, &e);
	if (ret == -ENOMEM)
		c->overflow = true;
	if (ret < 0) {
		reply_error(c, NULL, generic, "not JSON at byte %zu: expected %s", e.offset, e.msg);
		return false;
	}
	keep = serve_request(s, c, &v, &r);
	mig_json_free(&v);
	return keep;
}

/* The whole lines in c's input, from the first newline at or after from: false when c is to be closed. */
static bool serve_lines(struct mig_control *s, struct client *c, size_t from)
{
	size_t start = 0;
	char *nl;

	while (!c->overflow && (nl = memchr(c->in + from, '\n', c->in_len - from))) {
		size_t end = (size_t)(nl - c->in);

		if (!serve_line(s, c, c->in + start, end - start))
			return false;
		start = from = end + 1;
	}
	memmove(c->in, c->in + start, c->in_len - start);
	c->in_len -= start;
	if (c->in_len == IN_SIZE) {
		reply_error(c, NULL, generic, "a line longer than %d bytes", MIG_CONTROL_MAX_LINE);
		return false;
	}
	return true;
}

/* What c sent, one read's worth: false when c is to be closed (it closed, failed, or broke the protocol). */
static bool serve_input(struct mig_control *s, struct client *c)
{
	ssize_t k = recv(c->fd, c->in + c->in_len, IN_SIZE - c->in_len, 0);

	if (k < 0)
		return errno == EAGAIN || errno == EINTR;
	if (k == 0)
		return false;
	c->in_len += (size_t)k;
	return serve_lines(s, c, c->in_len - (size_t)k);
}

/* ---- clients ---- */

/* Send what of c's replies the socket takes now: false when c is to be dropped. */
static bool flush(struct client *c)
{
	while (c->out_off < c->out_len) {
		ssize_t k = send(c->fd, c->out + c->out_off, c->out_len - c->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);

		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return errno == EAGAIN;
		c->out_off += (size_t)k;
	}
	c->out_off = c->out_len = 0;
	return true;
}

/*
 * A subscriber's events, as many as fit its backlog: those it missed
 * first, as one events_lost line.  The events stay the ops'; what the
 * subscriber does not take in time is lost to it alone.  true when it
 * stopped at the backlog (there may be more), false when none is left.
 */
static bool feed(struct mig_control *s, struct client *c)
{
	char line[MIG_CONTROL_EVENT_LINE];
	size_t n;

	while (c->sub && !c->overflow) {
		if (c->out_len - c->out_off >= MIG_CONTROL_EVENT_BACKLOG)
			return true;
		n = s->ops->event(s->ctx, &c->seq, line, sizeof(line), &c->lost);
		if (!n)
			return false;
		put(c, line, n);
	}
	return false;
}

/*
 * Feed c and send what its socket takes, until its socket is full (it
 * will be polled for room) or no event is left: false when c is to be
 * dropped.
 */
static bool pump(struct mig_control *s, struct client *c)
{
	bool more;

	do {
		more = feed(s, c);
		if (c->overflow || !flush(c))
			return false;
	} while (more && c->out_off == c->out_len);
	return true;
}

static void drop(struct mig_control *s, unsigned int i)
{
	struct client *c = s->clients[i];

	close(c->fd);
	free(c->in);
	free(c->out);
	free(c);
	s->clients[i] = s->clients[--s->n];
}

/* One error line to a connection that is not taken, then closed. */
static void __attribute__((format(printf, 2, 3))) refuse(int fd, const char *fmt, ...)
{
	struct client c = { .fd = fd };
	char desc[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(desc, sizeof(desc), fmt, ap);
	va_end(ap);
	reply_error(&c, NULL, generic, "%s", desc);
	if (!c.overflow)
		flush(&c);
	free(c.out);
	close(fd);
}

/* A new connection: taken and greeted, or refused for its peer or for the number of clients. */
static void admit(struct mig_control *s, int fd)
{
	struct ucred cred;
	socklen_t len = sizeof(cred);
	struct client *c;

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0) {
		refuse(fd, "the peer's credentials are unknown: %s", strerror(errno));
		return;
	}
	if (cred.uid != s->uid && cred.uid != 0) {
		refuse(fd, "user %u may not connect: only the daemon's user (%u) and root may", (unsigned int)cred.uid,
		       (unsigned int)s->uid);
		return;
	}
	if (s->n == MIG_CONTROL_MAX_CLIENTS) {
		refuse(fd, "too many clients: %d are connected", MIG_CONTROL_MAX_CLIENTS);
		return;
	}
	c = calloc(1, sizeof(*c));
	if (!c || !(c->in = malloc(IN_SIZE))) {
		free(c);
		close(fd);
		return;
	}
	c->fd = fd;
	s->clients[s->n++] = c;
	put_lit(c, greeting);
	if (c->overflow || !flush(c))
		drop(s, s->n - 1);
}

/* The connections waiting, a bounded number a round so that the clients' turn comes. */
static void accept_clients(struct mig_control *s)
{
	int i, fd;

	for (i = 0; i < MIG_CONTROL_MAX_CLIENTS; i++) {
		fd = accept4(s->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd >= 0) {
			admit(s, fd);
			continue;
		}
		/* out of descriptors or memory, the connection stays queued: poll() would wake at once for it */
		s->accept_rest = errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM;
		if (errno != EINTR && errno != ECONNABORTED)
			return;
	}
}

/* Client i's events: its requests served, its replies sent; dropped when it is done with or broke. */
static void tend(struct mig_control *s, unsigned int i, short revents)
{
	struct client *c = s->clients[i];

	if (!revents)
		return;
	if (!c->done && (revents & (POLLIN | POLLHUP | POLLERR)) && !serve_input(s, c))
		c->done = true;
	/* room again: the events it has not had */
	if (!c->overflow && flush(c) && !c->done && pump(s, c))
		return;
	if (c->overflow || !flush(c) || (c->done && c->out_off == c->out_len))
		drop(s, i);
}

/* New events: each subscriber fed, as far as its backlog goes, and sent what its socket takes. */
static void publish(struct mig_control *s)
{
	uint64_t n;
	unsigned int i;

	while (read(s->efd, &n, sizeof(n)) < 0 && errno == EINTR)
		;
	for (i = s->n; i-- > 0;) {
		struct client *c = s->clients[i];

		if (c->sub && !c->done && !pump(s, c))
			drop(s, i);
	}
}

/* The poll set: the wakeup, the listener (unless it rests), each client for what it waits on. */
static nfds_t watch(const struct mig_control *s, struct pollfd *p)
{
	unsigned int i;

	p[0] = (struct pollfd){ .fd = s->wake, .events = POLLIN };
	p[1] = (struct pollfd){ .fd = s->accept_rest ? -1 : s->lfd, .events = POLLIN };
	p[2] = (struct pollfd){ .fd = s->efd, .events = POLLIN };
	for (i = 0; i < s->n; i++) {
		const struct client *c = s->clients[i];

		p[3 + i] = (struct pollfd){ .fd = c->fd,
					    .events = (short)((c->done ? 0 : POLLIN) |
							      (c->out_off < c->out_len ? POLLOUT : 0)) };
	}
	return 3 + s->n;
}

static void *serve(void *arg)
{
	struct pollfd p[3 + MIG_CONTROL_MAX_CLIENTS];
	struct mig_control *s = arg;
	unsigned int i;

	for (;;) {
		nfds_t n = watch(s, p);
		int timeout = s->accept_rest ? ACCEPT_REST_MS : -1;

		s->accept_rest = false;
		if (poll(p, n, timeout) < 0)
			continue;
		if (p[0].revents)
			return NULL;
		/* from the last: drop() moves the last client into the place it empties */
		for (i = s->n; i-- > 0;)
			tend(s, i, p[3 + i].revents);
		if (p[2].revents)
			publish(s);
		if (p[1].revents)
			accept_clients(s);
	}
}

/* ---- the socket ---- */

/* Room at a's path: nothing there, or a socket file nobody listens on, which is removed. */
static int clear_stale(const struct sockaddr_un *a, char *err, size_t len)
{
	const char *path = a->sun_path;
	struct stat st;
	int fd, ret;

	if (lstat(path, &st) < 0)
		return errno == ENOENT ? 0 : mig_errf(err, len, -errno, "%s: %s", path, strerror(errno));
	if (!S_ISSOCK(st.st_mode))
		return mig_errf(err, len, -EEXIST, "%s: exists and is not a socket", path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return mig_errf(err, len, -errno, "%s: socket: %s", path, strerror(errno));
	ret = connect(fd, (const struct sockaddr *)a, sizeof(*a)) < 0 ? -errno : 0;
	close(fd);
	if (ret == 0 || ret == -EAGAIN)
		return mig_errf(err, len, -EADDRINUSE, "%s: a server listens there already", path);
	if (ret != -ECONNREFUSED)
		return mig_errf(err, len, ret, "%s: a socket that cannot be probed: %s", path, strerror(-ret));
	if (unlink(path) < 0 && errno != ENOENT)
		return mig_errf(err, len, -errno, "%s: a stale socket that cannot be removed: %s", path,
				strerror(errno));
	return 0;
}

static int listen_at(struct mig_control *s, const char *path, char *err, size_t len)
{
	struct sockaddr_un a = { .sun_family = AF_UNIX };
	struct stat st;
	int ret;

	if (!path[0])
		return mig_errf(err, len, -EINVAL, "the control socket's path is empty");
	if (strlen(path) >= sizeof(a.sun_path))
		return mig_errf(err, len, -ENAMETOOLONG, "%s: longer than the %zu bytes a socket's path may have", path,
				sizeof(a.sun_path) - 1);
	strcpy(a.sun_path, path);
	ret = clear_stale(&a, err, len);
	if (ret < 0)
		return ret;
	s->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (s->lfd < 0)
		return mig_errf(err, len, -errno, "%s: socket: %s", path, strerror(errno));
	/* bind() makes the file with the socket's own mode less the umask: 0600 before, so never wider */
	if (fchmod(s->lfd, 0600) < 0 || bind(s->lfd, (const struct sockaddr *)&a, sizeof(a)) < 0)
		return mig_errf(err, len, -errno, "%s: %s", path, strerror(errno));
	strcpy(s->path, path);
	s->bound = true;
	if (lstat(path, &st) < 0)
		return mig_errf(err, len, -errno, "%s: %s", path, strerror(errno));
	s->dev = st.st_dev;
	s->ino = st.st_ino;
	if (st.st_mode & 077)
		return mig_errf(err, len, -EPERM, "%s: made with mode %04o, wider than 0600", path,
				(unsigned int)(st.st_mode & 07777));
	if (listen(s->lfd, 2 * MIG_CONTROL_MAX_CLIENTS) < 0)
		return mig_errf(err, len, -errno, "%s: listen: %s", path, strerror(errno));
	return 0;
}

/* The thread, with every signal blocked: the daemon's signals are for its other threads. */
static int start(struct mig_control *s, char *err, size_t len)
{
	sigset_t all, old;
	int ret;

	s->wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (s->wake < 0)
		return mig_errf(err, len, -errno, "%s: eventfd: %s", s->path, strerror(errno));
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	ret = pthread_create(&s->thread, NULL, serve, s);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	if (ret)
		return mig_errf(err, len, -ret, "%s: cannot start the server's thread: %s", s->path, strerror(ret));
	s->running = true;
	return 0;
}

/* Everything but the thread; the socket file only if it is still the one bind() made. */
static void teardown(struct mig_control *s)
{
	struct stat st;

	while (s->n)
		drop(s, s->n - 1);
	if (s->lfd >= 0)
		close(s->lfd);
	if (s->wake >= 0)
		close(s->wake);
	if (s->bound && !lstat(s->path, &st) && st.st_dev == s->dev && st.st_ino == s->ino)
		unlink(s->path);
	free(s);
}

int mig_control_open(const char *path, const struct mig_control_ops *ops, void *ctx, struct mig_control **ret,
		     char *err, size_t len)
{
	struct mig_control *s = calloc(1, sizeof(*s));
	int r;

	if (!s)
		return mig_errf(err, len, -ENOMEM, "%s: out of memory", path);
	s->lfd = s->wake = -1;
	s->ops = ops;
	s->ctx = ctx;
	s->efd = ops->event && ops->event_head && ops->event_fd ? ops->event_fd(ctx) : -1;
	s->uid = geteuid();
	r = listen_at(s, path, err, len);
	if (!r)
		r = start(s, err, len);
	if (r < 0) {
		teardown(s);
		return r;
	}
	*ret = s;
	return 0;
}

void mig_control_close(struct mig_control *s)
{
	uint64_t one = 1;

	if (!s)
		return;
	if (s->running) {
		while (write(s->wake, &one, sizeof(one)) < 0 && errno == EINTR)
			;
		pthread_join(s->thread, NULL);
	}
	teardown(s);
}

void mig_control_default_path(char *buf, size_t len)
{
	const char *dir = getenv("XDG_RUNTIME_DIR");
	struct stat st;

	if (!dir || dir[0] != '/' || stat(dir, &st) < 0 || !S_ISDIR(st.st_mode))
		dir = "/tmp";
	snprintf(buf, len, "%s/kvmdirty-migrate-%ld.sock", dir, (long)getpid());
}
