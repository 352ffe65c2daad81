// SPDX-License-Identifier: MIT
/*
 * The dirty-rate sampler (rate.h): a counting consumer for the guest, the
 * library's per-vCPU counts for its vCPUs.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "clock.h"
#include "errf.h"
#include "rate.h"
#include "stream.h"

struct mig_rate {
	struct kvmdirty_tracker *t;
	struct kvmdirty_consumer *cons;
	bool by_ring;
	unsigned int n;
	struct kvmdirty_vcpu *const *vcpus;
	uint64_t t0_ns, last_ns;
	uint64_t *prev;	 /* [n] each vCPU's count at the sample before */
	uint64_t *rates; /* [n] the last sample's rates */
};

/* vCPU i's page faults so far (the bitmap modes); prev where the library cannot say. */
static uint64_t vcpu_faults(const struct mig_rate *r, unsigned int i, uint64_t prev)
{
	struct kvmdirty_vcpu_stats st;

	if (kvmdirty_vcpu_stats(r->vcpus[i], &st, sizeof(st)) < 0)
		return prev;
	return st.faults;
}

/*
 * vCPU i's rate over the interval of ns that ended with the guest's count
 * (which harvested every ring): the distinct pages its ring reported
 * (DIRTY_RING), else its page faults; 0 where the library cannot say.
 */
static uint64_t vcpu_rate(struct mig_rate *r, unsigned int i, uint64_t ns)
{
	struct kvmdirty_count k;
	uint64_t c, rate;

	if (r->by_ring)
		return kvmdirty_vcpu_count(r->vcpus[i], &k, sizeof(k)) < 0 ? 0 : k.pages_per_sec;
	c = vcpu_faults(r, i, r->prev[i]);
	/* counts only grow; one that did not (a vCPU's counter started again) reads 0 */
	rate = c >= r->prev[i] ? (uint64_t)((double)(c - r->prev[i]) * 1e9 / (double)ns) : 0;
	r->prev[i] = c;
	return rate;
}

int mig_rate_new(struct kvmdirty_tracker *t, struct kvmdirty_vcpu *const *vcpus, unsigned int n,
		 struct mig_rate **ret_r, char *err, size_t len)
{
	struct kvmdirty_count k;
	struct mig_rate *r;
	unsigned int i;
	int ret;

	if (!t || (n && !vcpus))
		return mig_errf(err, len, -EINVAL, "rate: no tracker, or vCPUs missing");
	r = calloc(1, sizeof(*r));
	if (!r || !(r->prev = calloc(n ? n : 1, sizeof(uint64_t))) ||
	    !(r->rates = calloc(n ? n : 1, sizeof(uint64_t)))) {
		if (r)
			free(r->prev);
		free(r);
		return mig_errf(err, len, -ENOMEM, "rate: out of memory");
	}
	r->t = t;
	r->n = n;
	r->vcpus = vcpus;
	r->by_ring = kvmdirty_tracker_mode(t) == KVMDIRTY_MODE_DIRTY_RING;
	ret = kvmdirty_consumer_new(t, KVMDIRTY_CONSUMER_COUNT | KVMDIRTY_CONSUMER_EMPTY, &r->cons);
	/* its claim on every region: logging on where it was off, and on while the sampler lives */
	if (ret == 0)
		ret = kvmdirty_consumer_start(r->cons, NULL);
	/* the first count takes what was pending when it joined or started: the intervals start after it */
	if (ret == 0)
		ret = kvmdirty_consumer_count(r->cons, &k, sizeof(k));
	if (ret < 0) {
		mig_rate_free(r);
		return mig_errf(err, len, ret, "rate: a counting consumer of the dirty log: %s", strerror(-ret));
	}
	/* each vCPU's interval starts here too (the count above harvested every ring) */
	for (i = 0; i < n && ret == 0; i++)
		if (r->by_ring)
			ret = kvmdirty_vcpu_count(vcpus[i], &k, sizeof(k));
		else
			r->prev[i] = vcpu_faults(r, i, 0);
	if (ret < 0) {
		mig_rate_free(r);
		return mig_errf(err, len, ret, "rate: counting vCPU %u's pages: %s", i - 1, strerror(-ret));
	}
	r->t0_ns = r->last_ns = mig_clock_ns();
	*ret_r = r;
	return 0;
}

int mig_rate_sample(struct mig_rate *r, struct mig_rate_sample *ret_s)
{
	struct kvmdirty_count k;
	unsigned int i;
	uint64_t now, ns;
	int ret = kvmdirty_consumer_count(r->cons, &k, sizeof(k));

	if (ret < 0)
		return ret;
	now = mig_clock_ns();
	ns = now - r->last_ns ? now - r->last_ns : 1;
	r->last_ns = now;
	for (i = 0; i < r->n; i++)
		r->rates[i] = vcpu_rate(r, i, ns);
	*ret_s = (struct mig_rate_sample){ .t_ms = (now - r->t0_ns) / 1000000u,
					   .ns = k.ns,
					   .pages = k.pages,
					   .pages_per_s = k.pages_per_sec,
					   .by_ring = r->by_ring,
					   .nr_vcpus = r->n,
					   .vcpu_pages_per_s = r->rates };
	return 0;
}

/* Append to buf at *off, never past len (what does not fit is cut). */
static void put(char *buf, size_t len, size_t *off, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static void put(char *buf, size_t len, size_t *off, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (*off >= len)
		return;
	va_start(ap, fmt);
	n = vsnprintf(buf + *off, len - *off, fmt, ap);
	va_end(ap);
	if (n > 0)
		*off = *off + (size_t)n < len ? *off + (size_t)n : len;
}

void mig_rate_format(const struct mig_rate_sample *s, bool json, char *buf, size_t len)
{
	const uint64_t page = MIG_PAGE_SIZE;
	size_t off = 0;
	unsigned int i;

	if (!len)
		return;
	buf[0] = 0;
	if (json) {
		put(buf, len, &off,
		    "{\"t_ms\":%" PRIu64 ",\"guest_pages_per_s\":%" PRIu64 ",\"guest_bytes_per_s\":%" PRIu64
		    ",\"vcpu_by\":\"%s\",\"vcpus\":[",
		    s->t_ms, s->pages_per_s, s->pages_per_s * page, s->by_ring ? "ring" : "faults");
		for (i = 0; i < s->nr_vcpus; i++)
			put(buf, len, &off, "%s{\"pages_per_s\":%" PRIu64 ",\"bytes_per_s\":%" PRIu64 "}", i ? "," : "",
			    s->vcpu_pages_per_s[i], s->vcpu_pages_per_s[i] * page);
		put(buf, len, &off, "]}");
		return;
	}
	put(buf, len, &off,
	    "rate t_ms=%" PRIu64 " guest_pages_per_s=%" PRIu64 " guest_bytes_per_s=%" PRIu64 " vcpu_by=%s", s->t_ms,
	    s->pages_per_s, s->pages_per_s * page, s->by_ring ? "ring" : "faults");
	for (i = 0; i < s->nr_vcpus; i++)
		put(buf, len, &off, " vcpu%u=%" PRIu64 " vcpu%u_bytes_per_s=%" PRIu64, i, s->vcpu_pages_per_s[i], i,
		    s->vcpu_pages_per_s[i] * page);
}

void mig_rate_free(struct mig_rate *r)
{
	unsigned int i;

	if (!r)
		return;
	/* each vCPU's set of pages goes: nobody asks any more */
	for (i = 0; r->by_ring && i < r->n; i++)
		kvmdirty_vcpu_count(r->vcpus[i], NULL, 0);
	/* its claim goes with it: logging off where no one else needs it */
	kvmdirty_consumer_free(r->cons);
	free(r->prev);
	free(r->rates);
	free(r);
}
