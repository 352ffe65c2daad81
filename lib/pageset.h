/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_PAGESET_H
#define KVMDIRTY_PAGESET_H

/*
 * A set of guest pages, each named by its slot and its page in the slot:
 * open addressing with linear probing over a power-of-two table, grown
 * at half full, so that adding a page costs a multiply and, most of the
 * time, one cache line.  It holds what changed (the pages a vCPU's ring
 * reported over an interval), so its size follows the pages written, not
 * the guest.  Not thread-safe: its owner serializes.
 */
#include <stdbool.h>
#include <stdint.h>

struct kd_pageset {
	uint64_t *keys; /* 0: empty; else key + 1 */
	uint64_t cap;	/* a power of two */
	uint64_t n;
	bool failed; /* a growth failed: pages were dropped since the set was made */
};

/* An empty set with room for about n pages before it grows; -ENOMEM. */
int kd_pageset_init(struct kd_pageset *s, uint64_t n);
void kd_pageset_fini(struct kd_pageset *s);
/* Add a page; true if it was not there.  A growth that fails drops it and sets failed. */
bool kd_pageset_add(struct kd_pageset *s, uint32_t slot, uint64_t page);

#endif
