/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_SESSION_H
#define KVMDIRTY_MIGRATE_SESSION_H

/*
 * A migration session: the peers proving to each other that they hold
 * one pre-shared key, agreeing on keys a recording cannot reveal later,
 * and the connections of one migration bound to it.
 *
 * A plain migration over one connection needs no session: its stream
 * starts with struct mig_header, as ever.  Any other (a key, or several
 * connections) opens with a hello exchange on each connection (version 2):
 *
 *   source -> dest   struct mig_hello  (a fresh nonce; with a key on conn
 *                                        0 an ephemeral X25519 share; the
 *                                        name of the destination it
 *                                        means; conn 0 opens the session,
 *                                        conn i > 0 joins it)
 *   dest -> source   struct mig_hello  (a fresh nonce and share; on conn 0
 *                                        the session's id; MIG_S_REFUSED
 *                                        and a struct mig_ack if it will
 *                                        not go on), then, with a key, its
 *                                        proof, 32 bytes
 *   source -> dest   with a key, its proof, 32 bytes, once the
 *                                        destination's checked out
 *   dest -> source   struct mig_ack   (ok, or why not)
 *
 * With a key, T = SHA-256(source's hello || destination's hello), and PRK
 * = HKDF-Extract(salt T, the key || X25519 of the two shares) on conn 0,
 * HKDF-Extract(salt T, the session secret) on a joining connection, so
 * that joining proves the session as well as the key.  From PRK
 * (HKDF-Expand, SHA-256): the confirmation key, with which each side's
 * proof is HMAC-SHA-256 of a label of its own and T; on conn 0 the session
 * secret; and the two keys of the connection's sealed records (channel.h),
 * one a direction.  This is the pattern of TLS 1.3's psk_dhe_ke and of
 * Noise's NNpsk0: the ephemeral private keys are wiped once the session's
 * keys exist, so a recording of a session cannot be opened later even by
 * whoever holds the key file (forward secrecy); the key authenticates the
 * peers, and a holder of the key who is present during the handshake can
 * always take part as either side.
 *
 * The destination proves first, and the source sends its proof only once
 * the destination's checked out: a destination without the key learns
 * nothing it could test guesses of the key against.  (A source without
 * the key learns the destination's proof, which a key of 256 random bits,
 * the only kind kvmdirty-migrate takes, keeps from any guessing.)  Both
 * nonces are fresh, so a recorded session played again fails its proof.
 * The source names the destination it means, in its hello and so in T: a
 * destination of another name refuses, and a proof made for one name does
 * not pass at another.  Without a key a session only binds connections
 * together (plain, in clear), and the names are checked all the same.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "channel.h"
#include "keyfile.h"
#include "stream.h"
#include "transport.h"

#define MIG_SESSION_MAGIC "KVMDSES"
#define MIG_SESSION_VERSION 2
#define MIG_NAME_MAX 64 /* bytes of a name in a hello, with its NUL */
#define MIG_HANDSHAKE_MS 5000 /* one connection's handshake, whole, by default */
#define MIG_MAX_CONNS 16
#define MIG_PROOF 32

#define MIG_S_PSK (1u << 0)	/* both prove the key; every record sealed */
#define MIG_S_ENCRYPT (1u << 1) /* ... and encrypted */
#define MIG_S_JOIN (1u << 2)	/* this connection joins session[] */
#define MIG_S_REFUSED (1u << 3) /* destination: a struct mig_ack saying why follows */
/*
 * The source may end the stream with pages left behind (post-copy,
 * stream.h): the session's last connection is the fault channel, which
 * carries nothing before the handoff and only requests and their answers
 * after it; the stream's lanes are the connections before it (at least
 * one).  A destination that did not agree to post-copy refuses it.
 */
#define MIG_S_POSTCOPY (1u << 4)
/*
 * The source may compress DATA records (DATA_Z, stream.h's MIG_F_ZSTD);
 * a destination that knows it takes it (echoing the flag), an older one
 * refuses the hello by its flags.
 */
#define MIG_S_ZSTD (1u << 5)
#define MIG_S_FLAGS (MIG_S_PSK | MIG_S_ENCRYPT | MIG_S_JOIN | MIG_S_POSTCOPY | MIG_S_ZSTD)

struct mig_hello {
	char magic[8];	  /* MIG_SESSION_MAGIC, NUL-padded */
	uint32_t version; /* MIG_SESSION_VERSION */
	uint32_t flags;	  /* MIG_S_* */
	uint32_t conns;	  /* connections in the session, 1 .. MIG_MAX_CONNS */
	uint32_t conn;	  /* this one's index */
	uint8_t nonce[32];
	uint8_t session[32]; /* the session's id: the destination's on conn 0, echoed by each join */
	uint8_t share[32];   /* with a key, on conn 0: an ephemeral X25519 public key; else zero */
	/*
	 * The source's: the destination it means; the destination's: its own
	 * name.  NUL-terminated, NUL-padded.
	 */
	char name[MIG_NAME_MAX];
	uint64_t reserved;
};

_Static_assert(sizeof(struct mig_hello) == 192, "stream layout");

struct mig_session_opts {
	const struct mig_psk *psk; /* NULL: no authentication */
	bool encrypt;		   /* source: seal with encryption; destination: require it */
	unsigned int conns;	   /* source: connections, 1 .. MIG_MAX_CONNS (the fault channel counted) */
	/* source: post-copy may follow (MIG_S_POSTCOPY); destination: it is taken */
	bool postcopy;
	/* source: DATA may come compressed (MIG_S_ZSTD; a session even for one plain connection) */
	bool compress;
	uint64_t timeout_ms;	   /* each wait for the peer */
	uint64_t deadline_ms;	   /* destination: each connection's stream (0: none); a handshake is bounded by timeout_ms */
	/* destination: a line for each connection refused on the way (or NULL) */
	void (*log)(void *ctx, const char *line);
	void *log_ctx;
	/*
	 * source: the name of the destination it means (NULL: the address its
	 * first connection connected to, "IP:PORT", "[IPv6]:PORT" or
	 * "unix:PATH"), the same in every connection's hello; destination:
	 * its own (NULL: the address the session's first connection arrived
	 * on, in the same form; a join answers to the name its session's
	 * first connection matched, whichever way it came).  An address too
	 * long for the hello is named by its first 22 bytes, '~' and 40 hex
	 * digits of its SHA-256.  A session whose names differ is refused.
	 */
	const char *name;
	/* source: wipe the key (psk, cast) once the session's keys exist: it is not needed again */
	bool wipe_psk;
	/*
	 * One connection's handshake, whole (0: MIG_HANDSHAKE_MS); the
	 * source's, every connection's together, within twice that.
	 */
	uint64_t handshake_ms;
	/*
	 * destination, a gate's (NULL: none): taken (MIG_CLAIM_OPEN ->
	 * MIG_CLAIM_ANSWERED, __atomic) just before a proven handshake's
	 * answer "ok" goes out, as the gate takes it (-> MIG_CLAIM_CUT)
	 * before it cuts the connection: whichever comes first, the other
	 * does not happen.  A source that had its answer is never cut before
	 * its session is filed; one that is cut never had it (-ECONNABORTED).
	 */
	int *claim;
};

enum { MIG_CLAIM_OPEN, MIG_CLAIM_ANSWERED, MIG_CLAIM_CUT };

/* The connections of a session, each with its channel; [0] carries the stream's header. */
struct mig_session {
	unsigned int conns;
	uint32_t flags; /* MIG_S_PSK, MIG_S_ENCRYPT */
	struct mig_conn *conn[MIG_MAX_CONNS];
	struct mig_chan *chan[MIG_MAX_CONNS];
	int fd[MIG_MAX_CONNS];
	bool own_fd[MIG_MAX_CONNS]; /* fd[i] was opened for the session: free closes it */
	uint8_t id[32]; /* the session's id (the destination's, in the hellos; zero for a plain stream) */
	char name[MIG_NAME_MAX]; /* the destination's name both agreed on ("" for a plain stream) */
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
 * Destination: take a session or a plain stream over fd (connected; the
 * caller's to close).  A plain stream (its first bytes a struct
 * mig_header) is handed back on one plain channel, unless a key is
 * required.  A session's other connections are taken with accept(), all
 * within mig_session_join_ms() (a connection that does not join this
 * session is refused, logged, and the next one taken; the joined ones are
 * the session's).  0, or -errno with one line in err: -EACCES for every
 * failure of authentication (no key, a wrong key, a replayed session,
 * encryption required and not offered, another name), -ETIMEDOUT when the
 * session's connections did not all join in time.  One connection at a
 * time: a listener facing strangers takes connections through a gate
 * (gate.h), which runs many handshakes at once.
 */
int mig_session_accept(int fd, const struct mig_session_opts *o,
		       int (*accept)(void *ctx, uint64_t timeout_ms, char *err, size_t len), void *ctx,
		       struct mig_session *ret_s, char *err, size_t len);

/* The join phase of a session, whole: twice one handshake's budget, or the deadline where shorter. */
uint64_t mig_session_join_ms(const struct mig_session_opts *o);

/*
 * The destination's side, one connection at a time, for a listener that
 * runs many handshakes at once (gate.h).  A greeting is one accepted
 * connection's handshake: a plain stream or a session's first connection
 * (s, connection 0 open: the session, its other connections still to
 * join), or a join (its hello read, the rest left to mig_session_join()
 * once the session it names is known).  A greeting never owns its fd.
 */
struct mig_greeting {
	struct mig_session s;
	struct mig_hello hello; /* the peer's (all zero: a plain stream) */
	uint8_t session[32];	/* a first connection: the session's id */
	uint8_t secret[32];	/* a first connection, with a key: the secret its joins are keyed by */
	bool join;		/* a join: its connection is s.conn[hello.conn] */
	/*
	 * The peer, having the destination's proof, sent one of its own that
	 * does not hold: a guess of the key tested (a connection that ended
	 * in place of a proof, or a wait that ran out, tested none).
	 */
	bool wrong_proof;
};

#define MIG_GREET_CONNS (1u << 0)      /* sessions of several connections are taken */
#define MIG_GREET_JOINS (1u << 1)      /* a join is handed back (else refused) */
#define MIG_GREET_ONLY_JOINS (1u << 2) /* anything but a join is refused (-EBUSY) */

/*
 * fd's handshake, bounded by one handshake's budget (o->handshake_ms)
 * whatever the peer does: 0 with *g filled, or -errno as
 * mig_session_accept() (the peer answered, g freed).  Thread-safe:
 * shares nothing but o.
 */
int mig_session_greet(int fd, const struct mig_session_opts *o, unsigned int how, struct mig_greeting *g, char *err,
		      size_t len);

/*
 * A join's proofs, against first (the session it names, a copy will do;
 * NULL: no session of that id is open) and joined[] (its connections in
 * already): 0 with g's channel open, or -errno (the peer answered, g
 * freed).  Touches nothing of first.
 */
int mig_session_join(struct mig_greeting *g, const struct mig_greeting *first, const bool *joined,
		     const struct mig_session_opts *o, char *err, size_t len);

/*
 * Move a proven join (g) into its session (first), joined[] updated;
 * never waits.  g is freed either way; -EALREADY if its connection joined
 * already.  From then on first's session owns g's fd.
 */
int mig_session_adopt(struct mig_greeting *first, bool *joined, struct mig_greeting *g, char *err, size_t len);

/* A greeting's connections, channels and secrets (never its fds); wrong_proof stays. */
void mig_greeting_free(struct mig_greeting *g);

/* Send fd a refusal (why) without waiting, for a connection turned away before any handshake. */
void mig_session_turn_away(int fd, const char *why);

/* Channels, connections, the fds opened for it, the keys. */
void mig_session_free(struct mig_session *s);

/* Sent and not yet acknowledged, over every connection. */
uint64_t mig_session_sent(const struct mig_session *s);
uint64_t mig_session_unacked(const struct mig_session *s);
/* The longest round trip of its connections (mig_conn_rtt_us()). */
uint64_t mig_session_rtt_us(const struct mig_session *s);

#endif
