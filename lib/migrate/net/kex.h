/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_KEX_H
#define KVMDIRTY_MIGRATE_KEX_H

/*
 * The session's ephemeral key exchange: X25519 (RFC 7748) through
 * OpenSSL's libcrypto.  Each side makes a key pair for one handshake,
 * sends the public share in its hello, and derives the shared secret from
 * the peer's share; the private key is wiped when the pair is freed, which
 * the session does as soon as its keys exist: a recording of the session
 * cannot be opened later with the pre-shared key alone.
 */
#include <stdint.h>

#define MIG_KEX_SHARE 32

struct mig_kex;

/* A fresh key pair and its public share; 0 or -ENOMEM (-EIO: libcrypto refused). */
int mig_kex_new(struct mig_kex **ret_k, uint8_t share[MIG_KEX_SHARE]);
/*
 * The shared secret with the peer's share: 0, or -EPROTO for a share that
 * gives the all-zero secret (a low-order point: a peer that would make the
 * exchange contribute nothing), -EIO where libcrypto refused.
 */
int mig_kex_derive(struct mig_kex *k, const uint8_t peer[MIG_KEX_SHARE], uint8_t secret[32]);
/*
 * libcrypto made ready for a hello at once: its first key pair in a
 * process costs milliseconds (its X25519 method fetched and set up; 2 ms
 * here, 5 under ASan, more with the CPU busy), later ones 50 us.  Called
 * before a connection exists (mig_connect(), mig_gate_new()), so that a
 * hello follows its connect at once: a destination whose waiting room a
 * flood keeps full gives the connection whose hello is late its place.
 * Once per process; thread-safe.
 */
void mig_kex_ready(void);
/* The pair, its private key wiped. NULL is a no-op. */
void mig_kex_free(struct mig_kex *k);

#endif
