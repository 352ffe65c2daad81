/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_TEST_API_GUEST_H
#define KVMDIRTY_TEST_API_GUEST_H

/*
 * The test VM (examples/vmm/testvm.h) behind the public API's guest
 * (kvmdirty-migrate.h), as a VMM would put its own: pause and resume
 * through the test VM, one data region, the guest described once.  For
 * the tests of the API (test-whole-guest.c, test-api-control.c).
 */
#include <string.h>

#include <check.h>
#include <kvmdirty-migrate.h>

#include "testvm.h"

struct api_side {
	struct testvm *tv;
	void *data;
	uint64_t size;
	struct kvmdirty_mig_guest *g;
};

static inline void api_pause(void *ctx)
{
	testvm_pause_all(ctx);
}

static inline void api_resume(void *ctx)
{
	testvm_resume_all(ctx);
}

static const struct kvmdirty_mig_ops api_ops = { .pause = api_pause, .resume = api_resume };

/* Each of the n vCPUs writes and checks its share of the data region at gpa (tsc_per_page: its pace, 0 flat out). */
static inline void api_shares(struct api_side *s, uint64_t gpa, unsigned int n, uint64_t tsc_per_page)
{
	unsigned int i;

	for (i = 0; i < n; i++) {
		struct guest_vcpu *v = testvm_mailbox(s->tv, i);

		v->gpa = gpa + i * (s->size / n);
		v->pages = s->size / n / 4096;
		v->flags = GUEST_F_CHECK;
		v->tsc_per_page = tsc_per_page;
	}
}

/*
 * A VM of o (o->track: a source's), a data region of size bytes at gpa,
 * and setup (may be NULL) run on it before it is described: a source's
 * guest set up, a destination's (not tracked) bare and FRESH.
 */
static inline void api_side_new(struct api_side *s, const struct testvm_opts *o, uint64_t gpa, uint64_t size,
				void (*setup)(struct api_side *s))
{
	memset(s, 0, sizeof(*s));
	s->size = size;
	ck_assert_int_eq(testvm_new(o, &s->tv), 0);
	ck_assert_int_eq(testvm_add_memory(s->tv, gpa, size, 0, &s->data, NULL), 0);
	if (setup)
		setup(s);
	ck_assert_int_eq(kvmdirty_mig_guest_new(s->tv->vm, s->tv->tracker, s->tv->vcpu, o->nr_vcpus,
						o->track ? 0 : KVMDIRTY_MIG_FRESH, &api_ops, s->tv, &s->g),
			 0);
}

static inline void api_side_free(struct api_side *s)
{
	kvmdirty_mig_guest_free(s->g);
	testvm_free(s->tv);
	testvm_unmap(s->data, s->size);
}

#endif
