// SPDX-License-Identifier: MIT
/*
 * bench-sync: what one sync costs the library beyond its ioctls, by how
 * many regions are tracked and how many memslots exist.  A sync must cost
 * what is tracked: 1 tracked region among 32,764 memslots should cost what
 * 1 among 1 does.
 *
 * Each case makes a VM (no vCPU runs: the bitmaps come back clean, so the
 * figure is the library's walk, merge and bookkeeping), adds regions of
 * 2 MiB, tracks some, takes the first pass out, then times syncs: the
 * library's own share (kvmdirty_stats.last_sync_lib_ns: the sync's time
 * less the time inside KVM_GET_DIRTY_LOG) and the kernel's, each the
 * mean of the middle 80% of the syncs of the case.  Printed per case:
 *
 *   sync regions=N slots=M lib_us=... kernel_us=...
 *
 * and for 1 tracked among 32,764 slots its ratio to 1 among 1.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include <kvmdirty.h>
#include "../examples/common/kvm-host.h"

#define REGION (2ull << 20)
#define BASE_GPA (4ull << 30)

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/*
 * Mean of the middle 80%: the clock here ticks in steps of about 10 ns,
 * as long as a small sync's own share, so a median would round to a step;
 * the mean of many syncs does not, and the trim drops the ones an
 * interrupt or a preemption stretched.
 */
static double trimmed_mean_us(uint64_t *v, unsigned int n)
{
	unsigned int i, lo = n / 10, hi = n - n / 10;
	double sum = 0;

	qsort(v, n, sizeof(*v), cmp_u64);
	for (i = lo; i < hi; i++)
		sum += (double)v[i];
	return sum / (hi - lo) / 1000.0;
}

static int drain(struct kvmdirty_tracker *t)
{
	struct kvmdirty_range rg[256];
	int n;

	while ((n = kvmdirty_tracker_next(t, rg, 256, 0)) > 0)
		;
	return n;
}

/* One case: tracked regions among slots memslots; lib and kernel medians in us. */
static int run(unsigned int tracked, unsigned int slots, uint8_t *host, unsigned int syncs, double *lib_us,
	       double *kernel_us)
{
	uint64_t *lib = calloc(syncs, sizeof(*lib)), *kern = calloc(syncs, sizeof(*kern));
	struct kvmdirty_tracker *t;
	struct kvmdirty_region *r;
	struct kvmdirty_stats st;
	struct kvmdirty_vm *vm;
	unsigned int i;
	int ret;

	if (!lib || !kern)
		return -ENOMEM;
	ret = kvmdirty_vm_new(&vm);
	if (ret < 0)
		goto out_free;
	ret = kvmdirty_tracker_new(vm, NULL, &t);
	if (ret < 0)
		goto out;
	for (i = 0; i < slots; i++) {
		/* tracked ones spread over the slot ids, not bunched at the start */
		ret = kvmdirty_region_add(vm, BASE_GPA + i * REGION, REGION, host + i * REGION, 0, &r);
		if (ret < 0)
			goto out;
		if (i % (slots / tracked) == 0 && i / (slots / tracked) < tracked) {
			ret = kvmdirty_tracker_start(t, r);
			if (ret < 0)
				goto out;
		}
	}
	/* the first pass, and the all-dirty first GET of INITIALLY_SET */
	for (i = 0; i < 3; i++) {
		ret = drain(t);
		if (ret >= 0)
			ret = (int)kvmdirty_tracker_sync(t);
		if (ret < 0)
			goto out;
	}
	ret = drain(t);
	if (ret < 0)
		goto out;
	for (i = 0; i < syncs; i++) {
		int64_t n = kvmdirty_tracker_sync(t);

		if (n < 0) {
			ret = (int)n;
			goto out;
		}
		kvmdirty_tracker_stats(t, &st, sizeof(st));
		lib[i] = st.last_sync_lib_ns;
		kern[i] = st.last_sync_kernel_ns;
	}
	*lib_us = trimmed_mean_us(lib, syncs);
	*kernel_us = trimmed_mean_us(kern, syncs);
	ret = 0;
out:
	kvmdirty_vm_free(vm);
out_free:
	free(lib);
	free(kern);
	return ret;
}

int main(void)
{
	static const struct {
		unsigned int tracked, slots, syncs;
	} cases[] = {
		{ 1, 1, 20000 }, { 64, 64, 5000 }, { 4096, 4096, 200 }, { 1, 32764, 20000 },
	};
	double lib = 0, kern = 0, one_of_one = 0;
	uint64_t host_size = 32764ull * REGION;
	unsigned int c;
	uint8_t *host;

	if (kvm_host_check("bench-sync: "))
		return KVM_HOST_MISSING_EXIT;
	/* address space only: nothing is touched */
	host = mmap(NULL, host_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (host == MAP_FAILED) {
		perror("bench-sync: mmap");
		return 1;
	}
	for (c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		int ret = run(cases[c].tracked, cases[c].slots, host, cases[c].syncs, &lib, &kern);

		if (ret < 0) {
			fprintf(stderr, "bench-sync: %u tracked among %u slots: %s\n", cases[c].tracked, cases[c].slots,
				strerror(-ret));
			return 1;
		}
		if (cases[c].tracked == 1 && cases[c].slots == 1)
			one_of_one = lib;
		printf("sync regions=%u slots=%u lib_us=%.3f kernel_us=%.3f", cases[c].tracked, cases[c].slots, lib,
		       kern);
		if (cases[c].tracked == 1 && cases[c].slots > 1)
			printf(" vs_1_of_1=%.2f", lib / one_of_one);
		printf("\n");
		fflush(stdout);
	}
	munmap(host, host_size);
	return 0;
}
