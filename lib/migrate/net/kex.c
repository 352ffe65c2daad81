// SPDX-License-Identifier: MIT
/* X25519 through libcrypto's EVP_PKEY (kex.h). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "kex.h"

struct mig_kex {
	EVP_PKEY *key;
};

int mig_kex_new(struct mig_kex **ret_k, uint8_t share[MIG_KEX_SHARE])
{
	struct mig_kex *k = calloc(1, sizeof(*k));
	EVP_PKEY_CTX *ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_X25519, NULL);
	size_t n = MIG_KEX_SHARE;
	int ret = -EIO;

	if (!k || !ctx) {
		ret = -ENOMEM;
		goto out;
	}
	if (EVP_PKEY_keygen_init(ctx) == 1 && EVP_PKEY_keygen(ctx, &k->key) == 1 &&
	    EVP_PKEY_get_raw_public_key(k->key, share, &n) == 1 && n == MIG_KEX_SHARE) {
		*ret_k = k;
		k = NULL;
		ret = 0;
	}
out:
	EVP_PKEY_CTX_free(ctx);
	mig_kex_free(k);
	return ret;
}

static void warm(void)
{
	struct mig_kex *k = NULL;
	uint8_t share[MIG_KEX_SHARE];

	if (mig_kex_new(&k, share) == 0)
		mig_kex_free(k);
}

void mig_kex_ready(void)
{
	static pthread_once_t once = PTHREAD_ONCE_INIT;

	pthread_once(&once, warm);
}

int mig_kex_derive(struct mig_kex *k, const uint8_t peer[MIG_KEX_SHARE], uint8_t secret[32])
{
	static const uint8_t zero[32];
	EVP_PKEY *theirs = EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, NULL, peer, MIG_KEX_SHARE);
	EVP_PKEY_CTX *ctx = theirs ? EVP_PKEY_CTX_new(k->key, NULL) : NULL;
	size_t n = 32;
	int ret = -EIO;

	/* libcrypto refuses a share whose secret is all zero (RFC 7748 6.1); the check is kept for any other */
	if (ctx && EVP_PKEY_derive_init(ctx) == 1 && EVP_PKEY_derive_set_peer(ctx, theirs) == 1) {
		ret = EVP_PKEY_derive(ctx, secret, &n) == 1 && n == 32 ? 0 : -EPROTO;
		if (ret == 0 && !CRYPTO_memcmp(secret, zero, sizeof(zero)))
			ret = -EPROTO;
	}
	if (ret < 0)
		OPENSSL_cleanse(secret, 32);
	EVP_PKEY_CTX_free(ctx);
	EVP_PKEY_free(theirs);
	return ret;
}

void mig_kex_free(struct mig_kex *k)
{
	if (!k)
		return;
	/* EVP_PKEY_free clears the private key as it frees it */
	EVP_PKEY_free(k->key);
	free(k);
}
