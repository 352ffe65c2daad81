/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_SESSION_H
#define KVMDIRTY_MIGRATE_SESSION_H

/*
 * A migration session: the peers proving to each other that they hold
 * one pre-shared key, and the connections of one migration bound to it.
 *
 * A plain migration over one connection needs no session: its stream
 * starts with struct mig_header, as ever.  Any other (a key, or several
 * connections) opens with a hello exchange on each connection:
 *
 *   source -> dest   struct mig_hello  (a fresh nonce; conn 0 opens the
 *                                        session, conn i > 0 joins it)
 *   dest -> source   struct mig_hello  (a fresh nonce; on conn 0 the
 *                                        session's id, MIG_S_REFUSED if
 *                                        it will not go on)
 *   source -> dest   proof, 32 bytes   (with a key)
 *   dest -> source   struct mig_ack, then its proof, 32 bytes (zero
 *                                        without a key or on a refusal)
 *
 * With a key, T = SHA-256(source's hello || destination's hello), and
 * PRK = HKDF-Extract(salt T, the key) on conn 0, HKDF-Extract(salt T, the
 * session secret) on a joining connection, so that joining proves the
 * session as well as the key.  From PRK (HKDF-Expand, SHA-256): the
 * confirmation key, with which each side's proof is HMAC-SHA-256 of a
 * label of its own and T; on conn 0 the session secret; and the two keys
 * of the connection's sealed records (channel.h), one a direction.  The
 * destination checks the source's proof, in constant time, before it
 * reads anything else from it; the source checks the destination's before
 * it sends any of the guest.  Both nonces are fresh, so a recorded session
 * played again fails its proof.  Without a key a session only binds
 * connections together (plain, in clear).
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "channel.h"
#include "stream.h"
#include "transport.h"

#define MIG_SESSION_MAGIC "KVMDSES"
#define MIG_SESSION_VERSION 1
#define MIG_MAX_CONNS 16
#define MIG_PSK_MIN 16	 /* bytes of a key, at least */
#define MIG_PSK_MAX 4096 /* ... at most */
#define MIG_PROOF 32

#define MIG_S_PSK (1u << 0)	/* both prove the key; every record sealed */
#define MIG_S_ENCRYPT (1u << 1) /* ... and encrypted */
#define MIG_S_JOIN (1u << 2)	/* this connection joins session[] */
#define MIG_S_REFUSED (1u << 3) /* destination: a struct mig_ack saying why follows */
#define MIG_S_FLAGS (MIG_S_PSK | MIG_S_ENCRYPT | MIG_S_JOIN)

struct mig_hello {
	char magic[8];	  /* MIG_SESSION_MAGIC, NUL-padded */
	uint32_t version; /* MIG_SESSION_VERSION */
	uint32_t flags;	  /* MIG_S_* */
	uint32_t conns;	  /* connections in the session, 1 .. MIG_MAX_CONNS */
	uint32_t conn;	  /* this one's index */
	uint8_t nonce[32];
	uint8_t session[32]; /* the session's id: the destination's on conn 0, echoed by each join */
	uint64_t reserved;
};

_Static_assert(sizeof(struct mig_hello) == 96, "stream layout");

/* A pre-shared key, as read from its file. */
struct mig_psk {
	uint8_t key[MIG_PSK_MAX];
	size_t len;
};

/*
 * Read a key file: a regular file that neither group nor others may read
 * or write, of MIG_PSK_MIN .. MIG_PSK_MAX bytes once trailing newlines,
 * spaces and tabs are cut (any bytes before them count).  0, or -errno
 * with a one-line reason naming the file (never the key) in err.
 */
int mig_psk_load(const char *path, struct mig_psk *ret_psk, char *err, size_t len);
/* Wipe it. */
void mig_psk_clear(struct mig_psk *psk);

struct mig_session_opts {
	const struct mig_psk *psk; /* NULL: no authentication */
	bool encrypt;		   /* source: seal with encryption; destination: require it */
	unsigned int conns;	   /* source: connections, 1 .. MIG_MAX_CONNS */
	uint64_t timeout_ms;	   /* each wait for the peer */
	uint64_t deadline_ms;	   /* destination: each connection's stream (0: none); a handshake is bounded by timeout_ms */
	/* destination: a line for each connection refused on the way (or NULL) */
	void (*log)(void *ctx, const char *line);
	void *log_ctx;
};

/* The connections of a session, each with its channel; [0] carries the stream's header. */
struct mig_session {
	unsigned int conns;
	uint32_t flags; /* MIG_S_PSK, MIG_S_ENCRYPT */
	struct mig_conn *conn[MIG_MAX_CONNS];
	struct mig_chan *chan[MIG_MAX_CONNS];
	int fd[MIG_MAX_CONNS];
	bool own_fd[MIG_MAX_CONNS]; /* fd[i] was opened for the session: free closes it */
};

/* Whether a source with these options opens a session (else: a plain stream on one connection). */
bool mig_session_needed(const struct mig_session_opts *o);

/*
 * Source: open the session over fd (connected), then connect() the other
 * connections and join them.  0, or -errno with one line in err:
 * -EACCES when the destination failed its proof or refused ours.
 */
int mig_session_connect(int fd, const struct mig_session_opts *o, int (*connect)(void *ctx, char *err, size_t len),
			void *ctx, struct mig_session *ret_s, char *err, size_t len);

/*
 * Destination: take a session or a plain stream over fd.  A plain stream
 * (its first bytes a struct mig_header) is handed back on one plain
 * channel, unless a key is required.  A session's other connections are
 * taken with accept() (a connection that does not join this session is
 * refused, logged, and the next one taken).  0, or -errno with one line
 * in err: -EACCES for every failure of authentication (no key, a wrong
 * key, a replayed session, encryption required and not offered).
 */
int mig_session_accept(int fd, const struct mig_session_opts *o,
		       int (*accept)(void *ctx, uint64_t timeout_ms, char *err, size_t len), void *ctx,
		       struct mig_session *ret_s, char *err, size_t len);

/* Channels, connections, the fds opened for it, the keys. */
void mig_session_free(struct mig_session *s);

/* Sent and not yet acknowledged, over every connection. */
uint64_t mig_session_sent(const struct mig_session *s);
uint64_t mig_session_unacked(const struct mig_session *s);
/* The longest round trip of its connections (mig_conn_rtt_us()). */
uint64_t mig_session_rtt_us(const struct mig_session *s);

#endif
