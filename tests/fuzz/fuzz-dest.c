// SPDX-License-Identifier: MIT
/*
 * libFuzzer harness over the destination's decoder: each input is a
 * stream, received into a guest in plain memory (migrate-util.h); an
 * input that starts with FAKE_SEALED_MAGIC is a stream in sealed records
 * (seeds/sealed*.bin), opened first with a fixed key, so the framing of a
 * session's records is fuzzed too.  Beyond
 * what the sanitizers catch (a write outside guest memory, an overflow), it
 * stops on a refusal without a one-line reason, and on an accepted stream
 * that left a vCPU unloaded, bytes unread or an MSR the engine does not
 * send.  An input that starts with FAKE_POSTCOPY_MAGIC (seeds/postcopy.bin,
 * postcopy-seed.py) is a stream of a session that agreed to post-copy
 * (LEFT records taken) followed by post-copy's records, each checked as
 * the destination checks the source's (mig_pc_check()), as the source
 * checks the destination's, and as a recovery's answer
 * (mig_pc_map_check()), a DATA record's payload skipped.  Built with clang
 * by tests/fuzz/meson.build; run by run-fuzz.sh.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "migrate-util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void one_line(int ret, const char *err)
{
	if (ret < 0 && (!err[0] || strchr(err, '\n'))) {
		fprintf(stderr, "refused without a one-line reason: '%s'\n", err);
		abort();
	}
}

/* Post-copy's records after the stream, from p to end: every check has its say, none may crash. */
static void postcopy_records(const struct fake_guest *f, const uint8_t *p, const uint8_t *end)
{
	struct mig_region regs[FAKE_NR_REGIONS];
	uint64_t nrec;
	unsigned int i;

	for (i = 0; i < FAKE_NR_REGIONS; i++)
		regs[i] = (struct mig_region){ f->g.regions[i].gpa, f->g.regions[i].size };
	for (nrec = 0; end - p >= (ptrdiff_t)sizeof(struct mig_record); nrec++) {
		struct mig_record rec;
		char err[256] = "";
		int ret;

		memcpy(&rec, p, sizeof(rec));
		p += sizeof(rec);
		ret = mig_pc_check(regs, FAKE_NR_REGIONS, &rec, nrec, true, err, sizeof(err));
		one_line(ret, err);
		if (ret == 0 && rec.kind == MIG_DATA) {
			uint64_t n = rec.count * (MIG_PAGE_SIZE + sizeof(uint64_t));

			if (n > (uint64_t)(end - p))
				return;
			p += n;
		}
		err[0] = 0;
		one_line(mig_pc_check(regs, FAKE_NR_REGIONS, &rec, nrec, false, err, sizeof(err)), err);
		err[0] = 0;
		one_line(mig_pc_map_check(regs, FAKE_NR_REGIONS, &rec, nrec, err, sizeof(err)), err);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct fake_guest f;
	static int ready;
	char err[256] = "";
	unsigned int i;
	size_t used;
	int ret;

	if (!ready) {
		if (fake_guest_init(&f) < 0)
			abort();
		ready = 1;
	}
	/* hashed inline: one thread, so a run is repeatable */
	ret = fake_receive(&f, data, size, true, err, sizeof(err), &used);
	one_line(ret, err);
	if (size >= 8 && !memcmp(data, FAKE_POSTCOPY_MAGIC, 8)) {
		if (ret == 0)
			postcopy_records(&f, data + used, data + size);
		return 0;
	}
	if (ret == 0) {
		if (f.loads != FAKE_NR_VCPUS || used != size) {
			fprintf(stderr, "accepted with %u vCPUs loaded, %zu of %zu bytes read\n", f.loads, used, size);
			abort();
		}
		/* every state it loaded in form */
		for (i = 0; i < FAKE_NR_VCPUS; i++)
			if (mig_vcpu_state_check(&f.loaded[i], "loaded", NULL, 0) < 0)
				abort();
	}
	return 0;
}
