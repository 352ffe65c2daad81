// SPDX-License-Identifier: MIT
/* The engine's view of a guest: regions from libkvmdirty, vCPU state from KVM. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>

#include "guest.h"

int mig_guest_set_regions(struct mig_guest *g, const struct kvmdirty_vm *vm)
{
	struct kvmdirty_region *r;
	unsigned int n = 0;

	free(g->regions);
	g->regions = NULL;
	g->nr_regions = 0;
	for (r = kvmdirty_region_next(vm, NULL); r; r = kvmdirty_region_next(vm, r))
		n++;
	if (n > MIG_MAX_REGIONS)
		return -E2BIG;
	g->regions = calloc(n ? n : 1, sizeof(*g->regions));
	if (!g->regions)
		return -ENOMEM;
	/* bounded by the count: a region the VMM adds meanwhile is not written past the array */
	g->nr_regions = n;
	n = 0;
	for (r = kvmdirty_region_next(vm, NULL); r && n < g->nr_regions; r = kvmdirty_region_next(vm, r))
		g->regions[n++] = (struct mig_guest_region){ .region = r, .gpa = kvmdirty_region_gpa(r),
							     .size = kvmdirty_region_size(r),
							     .hva = kvmdirty_region_hva(r) };
	g->nr_regions = n;
	return 0;
}

static void free_written(struct mig_guest *g)
{
	unsigned int i;

	for (i = 0; i < g->nr_regions; i++) {
		free(g->regions[i].written);
		g->regions[i].written = NULL;
	}
}

int mig_guest_zero_known(struct mig_guest *g)
{
	unsigned int i;

	for (i = 0; i < g->nr_regions; i++) {
		g->regions[i].written = calloc(KVMDIRTY_BITMAP_WORDS(g->regions[i].size / MIG_PAGE_SIZE),
					       sizeof(uint64_t));
		if (!g->regions[i].written) {
			free_written(g);
			return -ENOMEM;
		}
	}
	return 0;
}

void mig_guest_release(struct mig_guest *g)
{
	free_written(g);
	free(g->regions);
	g->regions = NULL;
	g->nr_regions = 0;
}
