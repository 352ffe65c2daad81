// SPDX-License-Identifier: MIT
/*
 * kvmdirty-vmm: run the test guest on libkvmdirty and report what it did.
 *
 *   kvmdirty-vmm [-v VCPUS] [-m MIB_PER_VCPU] [-p PASSES] [-P seq|random|strided]
 *                [-s STRIDE] [-r PAGES_PER_SEC] [-0]
 *
 * Each vCPU gets its own data region at 4 GiB + i * size, writes
 * (gfn, pass) into each page per pass, and the host checks every tag
 * afterwards.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../common/cli.h"
#include "../common/kvm-host.h"
#include "testvm.h"

#define DATA_GPA (4ull << 30)

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void usage(void)
{
	fprintf(stderr, "usage: kvmdirty-vmm [-v VCPUS] [-m MIB_PER_VCPU] [-p PASSES] "
			"[-P seq|random|strided] [-s STRIDE] [-r PAGES_PER_SEC] [-0]\n");
}

/* Count pages whose tag is not what the workload must have left there. */
static uint64_t check_tags(const uint8_t *mem, uint64_t gpa, uint64_t pages, uint64_t last_pass,
			   bool every_page)
{
	uint64_t i, bad = 0;

	for (i = 0; i < pages; i++) {
		const struct guest_tag *t = (const void *)(mem + i * GUEST_PAGE_SIZE);
		uint64_t gfn = gpa / GUEST_PAGE_SIZE + i;

		if (every_page ? (t->gfn != gfn || t->pass != last_pass)
			       : !((t->gfn == gfn && t->pass && t->pass <= last_pass) || (!t->gfn && !t->pass)))
			bad++;
	}
	return bad;
}

int main(int argc, char **argv)
{
	uint64_t vcpus = 2, mib = 64, passes = 8, stride = 16, rate = 0, pattern = GUEST_SEQUENTIAL;
	struct testvm_opts opts = { 0 };
	struct testvm_exit ex;
	struct testvm *tv;
	uint8_t *mem[GUEST_MAX_VCPUS];
	unsigned int i, bad_vcpu = 0;
	double t0, t1;
	int c, ret, status = 0;

	while ((c = getopt(argc, argv, "v:m:p:P:s:r:0h")) != -1) {
		switch (c) {
		case 'v':
			if (cli_number("kvmdirty-vmm", "-v", optarg, 1, GUEST_MAX_VCPUS, &vcpus))
				return 2;
			break;
		case 'm':
			if (cli_number("kvmdirty-vmm", "-m", optarg, 1, 4096, &mib))
				return 2;
			break;
		case 'p':
			if (cli_number("kvmdirty-vmm", "-p", optarg, 1, UINT32_MAX, &passes))
				return 2;
			break;
		case 's':
			if (cli_number("kvmdirty-vmm", "-s", optarg, 1, UINT32_MAX, &stride))
				return 2;
			break;
		case 'r':
			if (cli_number("kvmdirty-vmm", "-r", optarg, 0, UINT32_MAX, &rate))
				return 2;
			break;
		case 'P':
			if (!strcmp(optarg, "seq"))
				pattern = GUEST_SEQUENTIAL;
			else if (!strcmp(optarg, "random"))
				pattern = GUEST_RANDOM;
			else if (!strcmp(optarg, "strided"))
				pattern = GUEST_STRIDED;
			else {
				fprintf(stderr, "kvmdirty-vmm: -P '%s': expected seq, random or strided\n", optarg);
				return 2;
			}
			break;
		case '0':
			opts.ring0 = true;
			break;
		case 'h':
			usage();
			return 0;
		default: /* getopt said what was wrong */
			return 2;
		}
	}
	if (optind != argc) {
		fprintf(stderr, "kvmdirty-vmm: unexpected argument '%s'\n", argv[optind]);
		return 2;
	}

	opts.nr_vcpus = (unsigned int)vcpus;
	ret = kvm_host_check("kvmdirty-vmm: ");
	if (ret)
		return ret;
	ret = testvm_new(&opts, &tv);
	if (ret < 0) {
		fprintf(stderr, "kvmdirty-vmm: creating the VM: %s\n", strerror(-ret));
		return 1;
	}
	printf("VM: %u vCPU(s) at CPL %d, %" PRIu64 " MiB each, %" PRIu64 " passes, memslots %" PRId64
	       ", dirty ring max %" PRId64 " entries, manual protect flags %" PRId64 "\n",
	       tv->nr_vcpus, opts.ring0 ? 0 : 3, mib, passes,
	       kvmdirty_vm_cap(tv->vm, KVMDIRTY_CAP_NR_MEMSLOTS),
	       kvmdirty_vm_cap(tv->vm, KVMDIRTY_CAP_DIRTY_RING) / 16,
	       kvmdirty_vm_cap(tv->vm, KVMDIRTY_CAP_MANUAL_PROTECT));

	for (i = 0; i < tv->nr_vcpus; i++) {
		uint64_t gpa = DATA_GPA + i * (mib << 20);
		struct guest_vcpu *mb = testvm_mailbox(tv, i);

		ret = testvm_add_memory(tv, gpa, mib << 20, 0, (void **)&mem[i], NULL);
		if (ret < 0) {
			fprintf(stderr, "kvmdirty-vmm: adding %" PRIu64 " MiB at gpa 0x%" PRIx64 ": %s\n", mib,
				gpa, strerror(-ret));
			return 1;
		}
		mb->gpa = gpa;
		mb->pages = (mib << 20) / GUEST_PAGE_SIZE;
		mb->pattern = (uint32_t)pattern;
		mb->stride = stride;
		mb->until_pass = passes;
		mb->seed = 0x9e3779b97f4a7c15ull * (i + 1);
		mb->tsc_per_page = testvm_tsc_per_page(tv, rate);
		mb->flags = GUEST_F_CHECK;
	}

	t0 = now();
	ret = testvm_run_all(tv, &bad_vcpu, &ex);
	t1 = now();
	if (ret < 0) {
		struct guest_vcpu *mb = testvm_mailbox(tv, bad_vcpu);

		fprintf(stderr, "kvmdirty-vmm: vCPU %u stopped: %s (exit reason %u, gpa 0x%" PRIx64
				", self-check page 0x%" PRIx64 " held gfn 0x%" PRIx64 " pass %" PRIu64 ")\n",
			bad_vcpu, ret == -EIO ? testvm_event_name(ex.event) : strerror(-ret), ex.exit_reason,
			ex.mmio_gpa, mb->err_gpa, mb->err_tag[0], mb->err_tag[1]);
		return 1;
	}

	for (i = 0; i < tv->nr_vcpus; i++) {
		struct guest_vcpu *mb = testvm_mailbox(tv, i);
		uint64_t bad = check_tags(mem[i], mb->gpa, mb->pages, mb->pass, pattern != GUEST_RANDOM);

		printf("vCPU %u: %" PRIu64 " passes, %" PRIu64 " page writes in %.3f s (%.0f pages/s); "
		       "host check of %" PRIu64 " pages: %s (%" PRIu64 " bad)\n",
		       i, mb->pass, mb->writes, t1 - t0, mb->writes / (t1 - t0), mb->pages,
		       bad ? "FAILED" : "ok", bad);
		if (bad || mb->pass != passes)
			status = 1;
	}
	vcpus = tv->nr_vcpus;
	testvm_free(tv);
	for (i = 0; i < vcpus; i++)
		testvm_unmap(mem[i], mib << 20);
	return status;
}
