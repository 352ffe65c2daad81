// SPDX-License-Identifier: MIT
/* A set of guest pages (pageset.h). */
#include <errno.h>
#include <stdlib.h>

#include "pageset.h"

#define MIN_CAP 1024u

/* A gfn fits in 40 bits on every host KVM runs on (52-bit physical addresses, 4 KiB pages). */
static uint64_t key_of(uint32_t slot, uint64_t page)
{
	return ((uint64_t)slot << 40 | (page & ((1ull << 40) - 1))) + 1;
}

static uint64_t home(uint64_t key, uint64_t cap)
{
	/* Fibonacci hashing: the high bits of the product are well mixed */
	return (key * 0x9e3779b97f4a7c15ull) >> (64 - __builtin_ctzll(cap));
}

int kd_pageset_init(struct kd_pageset *s, uint64_t n)
{
	uint64_t cap = MIN_CAP;

	while (cap < 2 * n && cap < (1ull << 40))
		cap <<= 1;
	s->keys = calloc(cap, sizeof(uint64_t));
	if (!s->keys)
		return -ENOMEM;
	s->cap = cap;
	s->n = 0;
	s->failed = false;
	return 0;
}

void kd_pageset_fini(struct kd_pageset *s)
{
	free(s->keys);
	s->keys = NULL;
	s->cap = s->n = 0;
}

static void insert(uint64_t *keys, uint64_t cap, uint64_t key)
{
	uint64_t i = home(key, cap);

	while (keys[i])
		i = (i + 1) & (cap - 1);
	keys[i] = key;
}

static int grow(struct kd_pageset *s)
{
	uint64_t cap = s->cap * 2, i, *keys = calloc(cap, sizeof(uint64_t));

	if (!keys)
		return -ENOMEM;
	for (i = 0; i < s->cap; i++)
		if (s->keys[i])
			insert(keys, cap, s->keys[i]);
	free(s->keys);
	s->keys = keys;
	s->cap = cap;
	return 0;
}

bool kd_pageset_add(struct kd_pageset *s, uint32_t slot, uint64_t page)
{
	uint64_t key = key_of(slot, page), i = home(key, s->cap);

	for (; s->keys[i]; i = (i + 1) & (s->cap - 1))
		if (s->keys[i] == key)
			return false;
	if (2 * (s->n + 1) > s->cap) {
		if (grow(s) < 0) {
			s->failed = true;
			return false;
		}
		insert(s->keys, s->cap, key);
	} else {
		s->keys[i] = key;
	}
	s->n++;
	return true;
}
