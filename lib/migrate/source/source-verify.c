// SPDX-License-Identifier: MIT
/*
 * The source's page hashes (verify): each batch's pages hashed just before
 * the send, into the stream and into a slot per page (sent_hash, with
 * sent_data saying which slots hold a data copy's hash); after switchover,
 * the final memory checked against them.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>

#include "hostmem.h"
#include "source-int.h"

#define LOST_NAMED 4 /* pages the one-line report names */
#define LOST_STATS 64 /* ... and the stats */

int src_alloc_hashes(struct source *s)
{
	unsigned int i, n = s->g->nr_regions ? s->g->nr_regions : 1;

	s->sent_hash = calloc(n, sizeof(*s->sent_hash));
	s->sent_data = calloc(n, sizeof(*s->sent_data));
	if (!s->sent_hash || !s->sent_data)
		return -ENOMEM;
	for (i = 0; i < s->g->nr_regions; i++) {
		s->sent_hash[i] = calloc(s->g->regions[i].size / PAGE, sizeof(uint64_t));
		s->sent_data[i] = calloc(KVMDIRTY_BITMAP_WORDS(s->g->regions[i].size / PAGE), sizeof(uint64_t));
		if (!s->sent_hash[i] || !s->sent_data[i])
			return -ENOMEM;
	}
	return 0;
}

void src_free_hashes(struct source *s)
{
	unsigned int i;

	for (i = 0; i < s->g->nr_regions; i++) {
		if (s->sent_hash)
			free(s->sent_hash[i]);
		if (s->sent_data)
			free(s->sent_data[i]);
	}
	free(s->sent_hash);
	free(s->sent_data);
	s->sent_hash = s->sent_data = NULL;
}

void src_hash_batch(struct lane *l, struct batch *b)
{
	struct source *s = l->s;
	int i;
	uint64_t k;

	for (i = 0; i < b->nruns; i++) {
		const struct hash_run *r = &b->runs[i];
		uint64_t *sent = s->sent_hash[r->region] + r->first;

		/*
		 * A zero page's slot is left alone (sent_data says which slots
		 * hold a data copy's hash): the slots of a huge guest that is
		 * mostly untouched are never faulted in.  With several
		 * connections, each connection's worker writes the words of its
		 * own chunks only (stream.h).
		 */
		if (r->zero) {
			kvmdirty_bitmap_clear(s->sent_data[r->region], r->first, r->first + r->count);
			continue;
		}
		for (k = 0; k < r->count; k++)
			r->out[k] = sent[k] = mig_page_hash(r->hva + k * PAGE);
		kvmdirty_bitmap_set(s->sent_data[r->region], r->first, r->first + r->count);
		l->hashed += r->count;
	}
}

/* Pages hashed so far, by every lane. */
uint64_t src_hashed(const struct source *s)
{
	uint64_t n = 0;
	unsigned int i;

	for (i = 0; i < s->nlanes; i++)
		n += s->lane[i].hashed;
	return n;
}

/* What page of region i should hash to: its latest copy's hash, or the zero page's where that was a ZERO. */
static uint64_t expected(const struct source *s, unsigned int i, uint64_t page)
{
	return kvmdirty_bitmap_is_clear(s->sent_data[i], page, page + 1) ? s->zero_hash : s->sent_hash[i][page];
}

/* A page that differs: counted, the first few named in err (at: its end so far), more in the stats. */
static void lost(struct source *s, struct mig_result *res, unsigned int i, uint64_t page, char *err, size_t len,
		 size_t *at)
{
	uint64_t gpa = s->g->regions[i].gpa + page * PAGE;

	if (!res->lost_pages)
		*at = (size_t)snprintf(err, len, "after switchover: pages differ from what was sent, "
				       "so tracking lost writes:");
	if (res->lost_pages < LOST_NAMED && *at < len)
		*at += (size_t)snprintf(err + *at, len - *at, " region %u page %" PRIu64 " (gpa 0x%" PRIx64 ")", i,
					page, gpa);
	if (res->lost_pages < LOST_STATS && s->o->stats)
		fprintf(s->o->stats, "%s{\"region\":%u,\"page\":%" PRIu64 ",\"gpa\":%" PRIu64 "}",
			res->lost_pages ? "," : "", i, page, gpa);
	res->lost_pages++;
}

/* Region i against what was sent; a page never touched is zero without being read. */
/* A run of a region checked against what was sent (check_region()). */
struct check_walk {
	struct source *s;
	struct mig_result *res;
	unsigned int i;
	char *err;
	size_t len, *at;
};

static int check_walked(void *ctx, uint64_t first, uint64_t count, bool untouched)
{
	struct check_walk *w = ctx;
	const uint8_t *p = w->s->g->regions[w->i].hva;
	uint64_t page;

	for (page = first; page < first + count; page++) {
		uint64_t h = untouched ? w->s->zero_hash : mig_page_hash(p + page * PAGE);

		if (h != expected(w->s, w->i, page))
			lost(w->s, w->res, w->i, page, w->err, w->len, w->at);
	}
	return 0;
}

static void check_region(struct source *s, struct mig_result *res, unsigned int i, char *err, size_t len, size_t *at)
{
	struct check_walk w = { .s = s, .res = res, .i = i, .err = err, .len = len, .at = at };
	uint64_t n = s->g->regions[i].size / PAGE;

	mig_walk_touched(s->pagemap, s->anon && s->anon[i], s->g->regions[i].hva, n, s->pme, check_walked, &w);
	res->verified_pages += n;
}

/*
 * After switchover: the final memory against the hash of what was last
 * sent of each page.  The vCPUs are paused for good, so memory holds
 * still.  Returns the pages that differ, capped at INT32_MAX.
 */
int src_check_sent(struct source *s, struct mig_result *res, char *err, size_t len)
{
	double t0 = mig_clock_msf();
	size_t at = 0;
	unsigned int i;

	if (s->o->stats) {
		src_line_start(s, "verify");
		fprintf(s->o->stats, ",\"lost\":[");
	}
	for (i = 0; i < s->g->nr_regions; i++)
		check_region(s, res, i, err, len, &at);
	if (res->lost_pages > LOST_NAMED && at < len)
		snprintf(err + at, len - at, " and %" PRIu64 " more", res->lost_pages - LOST_NAMED);
	res->verify_ms = mig_clock_msf() - t0;
	if (s->o->stats)
		fprintf(s->o->stats,
			"],\"verified_pages\":%" PRIu64 ",\"lost_pages\":%" PRIu64 ",\"verify_ms\":%.3f}\n",
			res->verified_pages, res->lost_pages, res->verify_ms);
	return res->lost_pages > INT32_MAX ? INT32_MAX : (int)res->lost_pages;
}

