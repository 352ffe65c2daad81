// SPDX-License-Identifier: MIT
/*
 * bench-index: gpa -> region lookup through the library's hashed index on
 * a real VM with 8 .. 32,764 memslots, against a linear scan (what QEMU's
 * slot lookups do) and a binary search over a sorted array, measured in the
 * same run on the same addresses.  Also what one memslot add/remove costs
 * at each count, the kernel's ioctl apart from the library's bookkeeping.
 *
 * Layout per count: mostly small neighbouring regions (1..512 pages, half
 * with no gap between them) and a few huge ones (1..4 GiB); hits pick a
 * region uniformly, then an offset in it; misses fall in gaps or beyond.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>

#include <kvmdirty.h>

#include "hooks.h"
#include "kvm-uapi.h"
#include "rng.h"
#include "../examples/common/kvm-host.h"

#define PAGE 4096ull
#define NR_ADDRS (1u << 20)
#define BASE_GPA (4ull << 30)

struct slot_ref {
	uint64_t gpa, size;
	struct kvmdirty_region *r;
};

static uint64_t rng = 0x2545f4914f6cdd1dull;

static uint64_t rnd(void)
{
	return xorshift64(&rng);
}

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

/*
 * Time inside memslot ioctls, through the test build's ioctl hook: the
 * kernel's share of a region add or remove, apart from the library's.
 */
static uint64_t memslot_ioctl_ns;

static int time_memslot_ioctl(int fd, unsigned long req, void *arg)
{
	double t0;
	int ret;

	if (req != KVM_SET_USER_MEMORY_REGION && req != KVM_SET_USER_MEMORY_REGION2)
		return KD_HOOK_PASS;
	t0 = now_ns();
	ret = ioctl(fd, req, arg);
	memslot_ioctl_ns += (uint64_t)(now_ns() - t0);
	return ret < 0 ? -errno : ret;
}

/* QEMU-style: walk the slots until one contains addr. */
static struct kvmdirty_region *linear_lookup(const struct slot_ref *s, unsigned int n, uint64_t addr)
{
	unsigned int i;

	for (i = 0; i < n; i++)
		if (addr - s[i].gpa < s[i].size)
			return s[i].r;
	return NULL;
}

/* s sorted by gpa: the last start <= addr, if it contains addr. */
static struct kvmdirty_region *binary_lookup(const struct slot_ref *s, unsigned int n, uint64_t addr)
{
	unsigned int lo = 0, hi = n;

	while (lo < hi) {
		unsigned int mid = lo + (hi - lo) / 2;

		if (s[mid].gpa <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (lo && addr - s[lo - 1].gpa < s[lo - 1].size)
		return s[lo - 1].r;
	return NULL;
}

enum method { HASHED, BINARY, LINEAR };

/* ns per lookup, repeating the address list until at least 200 ms passed. */
static double time_lookups(enum method m, const struct kvmdirty_vm *vm, const struct slot_ref *sorted,
			   const struct slot_ref *linear, unsigned int n, const uint64_t *addrs,
			   uintptr_t *sink)
{
	double t0 = now_ns(), t;
	uint64_t done = 0;
	uintptr_t acc = 0;
	unsigned int i, chunk = m == LINEAR ? 4096 : NR_ADDRS;

	do {
		for (i = 0; i < chunk; i++) {
			uint64_t a = addrs[(done + i) & (NR_ADDRS - 1)];

			if (m == HASHED)
				acc += (uintptr_t)kvmdirty_region_from_gpa(vm, a);
			else if (m == BINARY)
				acc += (uintptr_t)binary_lookup(sorted, n, a);
			else
				acc += (uintptr_t)linear_lookup(linear, n, a);
		}
		done += chunk;
		t = now_ns();
	} while (t - t0 < 200e6);
	*sink += acc;
	return (t - t0) / done;
}

static int set_slot_raw(int vm_fd, uint32_t slot, uint64_t gpa, uint64_t size, void *hva)
{
	struct kvm_userspace_memory_region2 r = {
		.slot = slot, .guest_phys_addr = gpa, .memory_size = size, .userspace_addr = (uintptr_t)hva,
	};

	return ioctl(vm_fd, KVM_SET_USER_MEMORY_REGION2, &r) < 0 ? -errno : 0;
}

static int cmp_ref(const void *a, const void *b)
{
	const struct slot_ref *x = a, *y = b;

	return x->gpa < y->gpa ? -1 : x->gpa > y->gpa;
}

struct result {
	unsigned int n;
	double hit[3], miss[3];
	double add_us, remove_us, kadd_us, kremove_us, in_add_us, in_remove_us;
};

static int run(unsigned int n, uint8_t *host, uint64_t host_size, struct result *res, uintptr_t *sink)
{
	struct slot_ref *linear = calloc(n, sizeof(*linear)), *sorted = calloc(n, sizeof(*sorted));
	uint64_t *hits = malloc(NR_ADDRS * sizeof(uint64_t)), *misses = malloc(NR_ADDRS * sizeof(uint64_t));
	uint64_t gpa = BASE_GPA, hva_off = 0, end;
	struct kvmdirty_vm *vm = NULL;
	struct kvmdirty_region *r;
	unsigned int i, k, reps = 200;
	double t0, add = 0, rem = 0, kadd = 0, krem = 0, in_add = 0, in_rem = 0;
	uint64_t k0;
	uint32_t slot;
	int ret = -ENOMEM;

	if (!linear || !sorted || !hits || !misses)
		goto out;
	ret = kvmdirty_vm_new(&vm);
	if (ret < 0) {
		fprintf(stderr, "bench-index: creating a VM: %s\n", strerror(-ret));
		goto out;
	}
	if (n > (unsigned int)kvmdirty_vm_cap(vm, KVMDIRTY_CAP_NR_MEMSLOTS)) {
		fprintf(stderr, "bench-index: %u regions but KVM offers %" PRId64 " memslots\n", n,
			kvmdirty_vm_cap(vm, KVMDIRTY_CAP_NR_MEMSLOTS));
		ret = -ENOSPC;
		goto out;
	}
	for (i = 0; i < n; i++) {
		uint64_t size = (i % 4096 == 3) ? (1 + rnd() % 4) << 30 : PAGE * (1 + rnd() % 512);

		if (rnd() & 1)
			gpa += PAGE * (1 + rnd() % 256);
		if (hva_off + size > host_size) {
			ret = -ENOSPC;
			goto out;
		}
		ret = kvmdirty_region_add(vm, gpa, size, host + hva_off, 0, &r);
		if (ret < 0) {
			fprintf(stderr, "bench-index: region %u at gpa 0x%" PRIx64 " size 0x%" PRIx64 ": %s\n", i,
				gpa, size, strerror(-ret));
			goto out;
		}
		linear[i] = (struct slot_ref){ .gpa = gpa, .size = size, .r = r };
		gpa += size;
		hva_off += size;
	}
	end = gpa;
	memcpy(sorted, linear, n * sizeof(*sorted));
	qsort(sorted, n, sizeof(*sorted), cmp_ref);
	/* slots in a VMM's table are in creation order, not address order */
	for (i = n - 1; i > 0; i--) {
		struct slot_ref tmp = linear[i];

		k = (unsigned int)(rnd() % (i + 1));
		linear[i] = linear[k];
		linear[k] = tmp;
	}
	for (i = 0; i < NR_ADDRS; i++) {
		const struct slot_ref *s = &sorted[rnd() % n];

		hits[i] = s->gpa + rnd() % s->size;
		do
			misses[i] = BASE_GPA + rnd() % (end - BASE_GPA + (end - BASE_GPA) / 8);
		while (binary_lookup(sorted, n, misses[i]));
	}

	res->n = n;
	res->hit[HASHED] = time_lookups(HASHED, vm, sorted, linear, n, hits, sink);
	res->hit[BINARY] = time_lookups(BINARY, vm, sorted, linear, n, hits, sink);
	res->hit[LINEAR] = time_lookups(LINEAR, vm, sorted, linear, n, hits, sink);
	res->miss[HASHED] = time_lookups(HASHED, vm, sorted, linear, n, misses, sink);
	res->miss[BINARY] = time_lookups(BINARY, vm, sorted, linear, n, misses, sink);
	res->miss[LINEAR] = time_lookups(LINEAR, vm, sorted, linear, n, misses, sink);
	/* every lookup must agree with the reference before its time counts */
	for (i = 0; i < NR_ADDRS; i += 97) {
		if (kvmdirty_region_from_gpa(vm, hits[i]) != binary_lookup(sorted, n, hits[i]) ||
		    kvmdirty_region_from_gpa(vm, misses[i])) {
			fprintf(stderr, "bench-index: lookup of 0x%" PRIx64 " disagrees with the reference\n", hits[i]);
			ret = -EIO;
			goto out;
		}
	}

	/* add/remove the n-th region: free one slot first */
	ret = kvmdirty_region_remove(vm, linear[0].r);
	if (ret < 0)
		goto out;
	for (k = 0; k < reps; k++) {
		k0 = memslot_ioctl_ns;
		t0 = now_ns();
		ret = kvmdirty_region_add(vm, end + PAGE, PAGE, host, 0, &r);
		add += now_ns() - t0;
		in_add += (double)(memslot_ioctl_ns - k0);
		if (ret < 0)
			goto out;
		slot = kvmdirty_region_slot(r);
		k0 = memslot_ioctl_ns;
		t0 = now_ns();
		ret = kvmdirty_region_remove(vm, r);
		rem += now_ns() - t0;
		in_rem += (double)(memslot_ioctl_ns - k0);
		if (ret < 0)
			goto out;
		/* the same memslot update without the library */
		t0 = now_ns();
		ret = set_slot_raw(kvmdirty_vm_fd(vm), slot, end + PAGE, PAGE, host);
		kadd += now_ns() - t0;
		if (ret < 0)
			goto out;
		t0 = now_ns();
		ret = set_slot_raw(kvmdirty_vm_fd(vm), slot, end + PAGE, 0, host);
		krem += now_ns() - t0;
		if (ret < 0)
			goto out;
	}
	res->add_us = add / reps / 1e3;
	res->remove_us = rem / reps / 1e3;
	res->kadd_us = kadd / reps / 1e3;
	res->kremove_us = krem / reps / 1e3;
	res->in_add_us = in_add / reps / 1e3;
	res->in_remove_us = in_rem / reps / 1e3;
	ret = 0;
out:
	if (ret < 0 && ret != -ENOSPC)
		fprintf(stderr, "bench-index: %u regions: %s\n", n, strerror(-ret));
	kvmdirty_vm_free(vm);
	free(linear);
	free(sorted);
	free(hits);
	free(misses);
	return ret;
}

int main(void)
{
	static const unsigned int counts[] = { 8, 64, 512, 4096, 32764 };
	struct result res[5];
	uint64_t host_size = 1ull << 46;
	uintptr_t sink = 0;
	uint8_t *host;
	unsigned int i;

	if (kvm_host_check("bench-index: "))
		return KVM_HOST_MISSING_EXIT;
	kd_test_hooks_set(time_memslot_ioctl, NULL, false);
	/* address space only: no guest runs, nothing is touched */
	host = mmap(NULL, host_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (host == MAP_FAILED) {
		perror("bench-index: mmap");
		return 1;
	}
	for (i = 0; i < 5; i++) {
		rng = 0x2545f4914f6cdd1dull + i;
		if (run(counts[i], host, host_size, &res[i], &sink) < 0)
			return 1;
		/*
		 * kernel_*: the ioctl inside the library call; lib_*: the rest of
		 * the call; bare_*: the same ioctl issued without the library.
		 */
		printf("memslot regions=%u add_us=%.2f remove_us=%.2f kernel_add_us=%.2f kernel_remove_us=%.2f "
		       "lib_add_us=%.2f lib_remove_us=%.2f bare_add_us=%.2f bare_remove_us=%.2f\n",
		       res[i].n, res[i].add_us, res[i].remove_us, res[i].in_add_us, res[i].in_remove_us,
		       res[i].add_us - res[i].in_add_us, res[i].remove_us - res[i].in_remove_us, res[i].kadd_us,
		       res[i].kremove_us);
		printf("lookup regions=%u miss hashed_ns=%.2f binary_ns=%.2f linear_ns=%.2f speedup_vs_linear=%.1f\n",
		       res[i].n, res[i].miss[HASHED], res[i].miss[BINARY], res[i].miss[LINEAR],
		       res[i].miss[LINEAR] / res[i].miss[HASHED]);
		fflush(stdout);
	}
	for (i = 0; i < 5; i++)
		printf("index regions=%u hashed_ns=%.2f binary_ns=%.2f linear_ns=%.2f speedup_vs_linear=%.1f "
		       "vs_8_regions=%.2f\n",
		       res[i].n, res[i].hit[HASHED], res[i].hit[BINARY], res[i].hit[LINEAR],
		       res[i].hit[LINEAR] / res[i].hit[HASHED], res[i].hit[HASHED] / res[0].hit[HASHED]);
	return sink == 1; /* keeps the lookups from being optimised away */
}
