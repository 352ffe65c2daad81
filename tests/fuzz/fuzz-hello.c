// SPDX-License-Identifier: MIT
/*
 * libFuzzer harness over the session handshake (session.h), both ends:
 * each input's first byte picks the side and its options, the rest is
 * what the peer sends, whole, before it closes its side.
 *
 *   bit 0: 0, a destination greets it (mig_session_greet(), and for a join
 *          mig_session_join() against a fixed open session: id 0x11...,
 *          four connections, the key's flags); 1, a source opens a
 *          session against it (mig_session_connect(), one connection)
 *   bit 1: a key (the source always has one: without, no session)
 *   bit 2: encryption (the destination's: required)
 *   bit 3: both ends named "fuzz" (else their addresses)
 *
 * Beyond what the sanitizers catch, it stops on a refusal without a
 * one-line reason, on a reason with a byte that is not printable ASCII
 * (a peer's text reaching a terminal), and on any success no peer
 * without the key could have had.  Seeds: hello-seeds/ (made by
 * hello-seeds.py).
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "session.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_reason(int ret, const char *err)
{
	const char *p;

	if (ret >= 0)
		return;
	if (!err[0]) {
		fprintf(stderr, "refused without a reason\n");
		abort();
	}
	for (p = err; *p; p++)
		if (*p < 0x20 || *p > 0x7e) {
			fprintf(stderr, "a reason with byte 0x%02x: '%s'\n", (unsigned char)*p, err);
			abort();
		}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct mig_psk key = { .len = MIG_PSK_LEN };
	struct mig_session_opts o = { .timeout_ms = 1000, .handshake_ms = 1000 };
	char err[256] = "";
	int sv[2], ret;

	if (!size)
		return 0;
	memset(key.key, 0x42, sizeof(key.key));
	o.psk = (data[0] & 2) || (data[0] & 1) ? &key : NULL;
	o.encrypt = (data[0] & 4) && o.psk;
	o.name = data[0] & 8 ? "fuzz" : NULL;
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
		abort();
	if (size > 1 && write(sv[0], data + 1, size - 1) != (ssize_t)(size - 1))
		abort();
	shutdown(sv[0], SHUT_WR);
	if (data[0] & 1) {
		struct mig_session s;

		o.conns = 1;
		ret = mig_session_connect(sv[1], &o, NULL, NULL, &s, err, sizeof(err));
		if (ret == 0) {
			fprintf(stderr, "a source took a destination that cannot hold the key\n");
			abort();
		}
	} else {
		struct mig_greeting g, first = { .hello = { .conns = 4 } };
		bool joined[MIG_MAX_CONNS] = { true };

		ret = mig_session_greet(sv[1], &o, MIG_GREET_CONNS | MIG_GREET_JOINS, &g, err, sizeof(err));
		if (ret == 0 && o.psk && !g.join) {
			fprintf(stderr, "a session opened without the key\n");
			abort();
		}
		if (ret == 0 && g.join) {
			first.hello.flags = o.psk ? MIG_S_PSK | (o.encrypt ? MIG_S_ENCRYPT : 0) : 0;
			memset(first.session, 0x11, sizeof(first.session));
			memset(first.secret, 0x22, sizeof(first.secret));
			ret = mig_session_join(&g, &first, joined, &o, err, sizeof(err));
			if (ret == 0 && o.psk) {
				fprintf(stderr, "a join without the session's secret\n");
				abort();
			}
		}
		if (ret == 0)
			mig_greeting_free(&g);
	}
	check_reason(ret, err);
	close(sv[0]);
	close(sv[1]);
	return 0;
}
