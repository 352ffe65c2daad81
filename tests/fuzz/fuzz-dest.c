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
 * send.  Built with clang by tests/fuzz/meson.build; run by run-fuzz.sh.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "migrate-util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

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
	if (ret < 0 && (!err[0] || strchr(err, '\n'))) {
		fprintf(stderr, "refused without a one-line reason: '%s'\n", err);
		abort();
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
