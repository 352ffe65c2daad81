// SPDX-License-Identifier: MIT
/*
 * kvmdirty-vmm: run the test guest on libkvmdirty and report what it did;
 * migrate it, snapshot it and restore it through libkvmdirty-migrate's
 * public header (kvmdirty-migrate.h) and nothing else of the engine's.
 *
 *   kvmdirty-vmm [-v VCPUS] [-m MIB_PER_VCPU] [-p PASSES] [-P seq|random|strided]
 *                [-s STRIDE] [-r PAGES_PER_SEC] [-0] [--state]
 *                [--migrate-to ADDR [--after MS] | --incoming ADDR |
 *                 --snapshot PREFIX [--every MS] | --restore FILE...]
 *
 * Each vCPU gets its own data region at 4 GiB + i * size, writes
 * (gfn, pass) into each page per pass, and the host checks every tag once
 * the guest is done.  Both ends of a migration, and a restore, take the
 * same -v and -m (the regions must match) and the same --state; the
 * workload (-p, -P, ...) travels with the guest.  --state: the guest also
 * checks the vCPU state a kernel relies on (LAPIC timer, PAT, kvmclock,
 * AVX; testvm_state_setup()).  The VMM's one device, a counter of the
 * passes the vCPUs reported, travels as device state.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <kvmdirty-migrate.h>

#include "../common/cli.h"
#include "../common/kvm-host.h"
#include "../common/vmm-mode.h"
#include "testvm.h"

#define DATA_GPA (4ull << 30)
#define PROG "kvmdirty-vmm"

struct vmm {
	uint64_t vcpus, mib, passes, stride, rate, pattern, after_ms, every_ms;
	bool ring0, state;
	struct vmm_mode_args run;
	struct testvm *tv;
	uint8_t *mem[GUEST_MAX_VCPUS];
	/* the VMM's device: what it keeps of the guest, carried as device state */
	struct {
		char magic[8];
		uint64_t started_ms; /* CLOCK_REALTIME when the guest was first started */
		uint64_t moves;	     /* migrations and restores it went through */
	} dev;
};

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void usage(void)
{
	fprintf(stderr, "usage: " PROG " [-v VCPUS] [-m MIB_PER_VCPU] [-p PASSES] [-P seq|random|strided] [-s STRIDE]\n"
			"                    [-r PAGES_PER_SEC] [-0] [--state]\n"
			"                    [--migrate-to ADDR [--after MS] | --incoming ADDR |\n"
			"                     --snapshot PREFIX [--every MS] | --restore FILE...]\n");
}

static int parse_pattern(struct vmm *v, const char *arg)
{
	if (!strcmp(arg, "seq"))
		v->pattern = GUEST_SEQUENTIAL;
	else if (!strcmp(arg, "random"))
		v->pattern = GUEST_RANDOM;
	else if (!strcmp(arg, "strided"))
		v->pattern = GUEST_STRIDED;
	else {
		fprintf(stderr, PROG ": -P '%s': expected seq, random or strided\n", arg);
		return 2;
	}
	return 0;
}

/* 0, or the exit status of a bad command line (2) or of help (-1: 0). */
static int parse(int argc, char **argv, struct vmm *v)
{
	static const struct option longopts[] = {
		{ "state", no_argument, NULL, 'S' },	       { "migrate-to", required_argument, NULL, 'M' },
		{ "after", required_argument, NULL, 'A' },     { "incoming", required_argument, NULL, 'I' },
		{ "snapshot", required_argument, NULL, 'N' },  { "every", required_argument, NULL, 'E' },
		{ "restore", no_argument, NULL, 'R' },	       { "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	int c, ret = 0;

	while (ret == 0 && (c = getopt_long(argc, argv, "v:m:p:P:s:r:0h", longopts, NULL)) != -1) {
		switch (c) {
		case 'v': ret = cli_number(PROG, "-v", optarg, 1, GUEST_LOW_VCPUS, &v->vcpus) ? 2 : 0; break;
		case 'm': ret = cli_number(PROG, "-m", optarg, 1, 4096, &v->mib) ? 2 : 0; break;
		case 'p': ret = cli_number(PROG, "-p", optarg, 1, UINT32_MAX, &v->passes) ? 2 : 0; break;
		case 's': ret = cli_number(PROG, "-s", optarg, 1, UINT32_MAX, &v->stride) ? 2 : 0; break;
		case 'r': ret = cli_number(PROG, "-r", optarg, 0, UINT32_MAX, &v->rate) ? 2 : 0; break;
		case 'A': ret = cli_number(PROG, "--after", optarg, 0, 3600000, &v->after_ms) ? 2 : 0; break;
		case 'E': ret = cli_number(PROG, "--every", optarg, 1, 3600000, &v->every_ms) ? 2 : 0; break;
		case 'P': ret = parse_pattern(v, optarg); break;
		case '0': v->ring0 = true; break;
		case 'S': v->state = true; break;
		case 'M': ret = vmm_mode_set(PROG, &v->run, MIGRATE_TO, optarg); break;
		case 'I': ret = vmm_mode_set(PROG, &v->run, INCOMING, optarg); break;
		case 'N': ret = vmm_mode_set(PROG, &v->run, SNAPSHOT, optarg); break;
		case 'R': ret = vmm_mode_set(PROG, &v->run, RESTORE, NULL); break;
		case 'h': usage(); return -1;
		default: return 2; /* getopt said what was wrong */
		}
	}
	if (ret)
		return ret;
	if (vmm_mode_rest(PROG, &v->run, argc, argv, optind))
		return 2;
	if (v->state && v->ring0) {
		fprintf(stderr, PROG ": --state: the state guest runs at CPL 3, not with -0\n");
		return 2;
	}
	return 0;
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

/*
 * The VM, its regions and vCPUs: with the workload set (a guest that will
 * start here) or bare (one that arrives: a migration's destination, a
 * restore).  0, or 1 said.
 */
static int build(struct vmm *v, bool start_here)
{
	struct testvm_opts opts = { .nr_vcpus = (unsigned int)v->vcpus, .ring0 = v->ring0, .irqchip = true,
				    .track = v->run.mode == MIGRATE_TO || v->run.mode == SNAPSHOT };
	unsigned int i;
	int ret;

	ret = testvm_new(&opts, &v->tv);
	if (ret < 0) {
		fprintf(stderr, PROG ": creating the VM: %s\n", strerror(-ret));
		return 1;
	}
	for (i = 0; i < v->tv->nr_vcpus; i++) {
		uint64_t gpa = DATA_GPA + i * (v->mib << 20);
		struct guest_vcpu *mb = testvm_mailbox(v->tv, i);

		ret = testvm_add_memory(v->tv, gpa, v->mib << 20, 0, (void **)&v->mem[i], NULL);
		if (ret < 0) {
			fprintf(stderr, PROG ": adding %" PRIu64 " MiB at gpa 0x%" PRIx64 ": %s\n", v->mib, gpa,
				strerror(-ret));
			return 1;
		}
		if (!start_here)
			continue;
		mb->gpa = gpa;
		mb->pages = (v->mib << 20) / GUEST_PAGE_SIZE;
		mb->pattern = (uint32_t)v->pattern;
		mb->stride = v->stride;
		mb->until_pass = v->passes;
		mb->seed = 0x9e3779b97f4a7c15ull * (i + 1);
		mb->tsc_per_page = testvm_tsc_per_page(v->tv, v->rate);
		mb->flags = GUEST_F_CHECK;
	}
	if (start_here && v->state && (ret = testvm_state_setup(v->tv, 10000)) < 0) {
		fprintf(stderr, PROG ": --state: setting the vCPUs up: %s\n", strerror(-ret));
		return 1;
	}
	return 0;
}

/* Wait for the running guest to finish its passes, then check every tag: the exit status. */
static int finish(struct vmm *v, double t0)
{
	struct testvm_exit ex = { 0 };
	unsigned int i, bad_vcpu = 0;
	int ret = testvm_join(v->tv, &bad_vcpu, &ex), status = 0;
	double t1 = now();

	if (ret < 0) {
		struct guest_vcpu *mb = testvm_mailbox(v->tv, bad_vcpu);

		fprintf(stderr, PROG ": vCPU %u stopped: %s (exit reason %u, gpa 0x%" PRIx64
				  ", self-check page 0x%" PRIx64 " held 0x%" PRIx64 " / %" PRIu64 ")\n",
			bad_vcpu, ret == -EIO ? testvm_event_name(ex.event) : strerror(-ret), ex.exit_reason, ex.mmio_gpa,
			mb->err_gpa, mb->err_tag[0], mb->err_tag[1]);
		return 1;
	}
	for (i = 0; i < v->tv->nr_vcpus; i++) {
		struct guest_vcpu *mb = testvm_mailbox(v->tv, i);
		uint64_t bad = check_tags(v->mem[i], mb->gpa, mb->pages, mb->pass, mb->pattern != GUEST_RANDOM);

		printf("vCPU %u: %" PRIu64 " passes, %" PRIu64 " page writes in %.3f s (%.0f pages/s); "
		       "host check of %" PRIu64 " pages: %s (%" PRIu64 " bad)",
		       i, mb->pass, mb->writes, t1 - t0, mb->writes / (t1 - t0), mb->pages, bad ? "FAILED" : "ok", bad);
		if (mb->flags & GUEST_F_STATE)
			printf("; state: %" PRIu64 " timer ticks, %" PRIu64 " checks held", mb->st_ticks, mb->st_checks);
		printf("\n");
		if (bad || mb->pass != mb->until_pass)
			status = 1;
	}
	return status;
}

static void v_pause(void *ctx)
{
	testvm_pause_all(((struct vmm *)ctx)->tv);
}

static void v_resume(void *ctx)
{
	testvm_resume_all(((struct vmm *)ctx)->tv);
}

static int v_devices_save(void *ctx, void **ret_state, size_t *ret_len)
{
	struct vmm *v = ctx;

	*ret_state = malloc(sizeof(v->dev));
	if (!*ret_state)
		return -ENOMEM;
	memcpy(*ret_state, &v->dev, sizeof(v->dev));
	*ret_len = sizeof(v->dev);
	return 0;
}

static int v_devices_load(void *ctx, const void *state, size_t len)
{
	struct vmm *v = ctx;

	if (len != sizeof(v->dev) || memcmp(state, PROG, 8))
		return -EPROTO; /* not this VMM's device */
	memcpy(&v->dev, state, len);
	v->dev.moves++;
	return 0;
}

static uint64_t v_progress(void *ctx, unsigned int i)
{
	return testvm_mailbox(((struct vmm *)ctx)->tv, i)->writes;
}

static int v_set_run_share(void *ctx, unsigned int i, unsigned int permille)
{
	return testvm_set_run_share(((struct vmm *)ctx)->tv, i, permille);
}

static uint64_t v_kept_out_ns(void *ctx, unsigned int i)
{
	return testvm_out_ns(((struct vmm *)ctx)->tv, i);
}

static const struct kvmdirty_mig_ops vmm_ops = {
	.pause = v_pause, .resume = v_resume, .devices_save = v_devices_save, .devices_load = v_devices_load,
	.progress = v_progress, .set_run_share = v_set_run_share, .kept_out_ns = v_kept_out_ns,
};

/* The engine's view of this VMM's guest: 0, or 1 said. */
static int describe(struct vmm *v, bool fresh, struct kvmdirty_mig_guest **ret_g)
{
	int ret = kvmdirty_mig_guest_new(v->tv->vm, v->tv->tracker, v->tv->vcpu, v->tv->nr_vcpus,
					 fresh ? KVMDIRTY_MIG_FRESH : 0, &vmm_ops, v, ret_g);

	if (ret < 0)
		fprintf(stderr, PROG ": describing the guest to the engine: %s\n", strerror(-ret));
	return ret < 0;
}

/* --migrate-to: run, move after --after ms; the guest finishes here only if the move failed. */
static int migrate_to(struct vmm *v, double t0)
{
	struct kvmdirty_mig_send_result res;
	struct kvmdirty_mig_guest *g;
	char err[512];
	int ret;

	if (describe(v, false, &g))
		return 1;
	vmm_sleep_ms(v->after_ms);
	ret = kvmdirty_mig_send(g, v->run.addr, NULL, &res, err, sizeof(err));
	kvmdirty_mig_guest_free(g);
	if (ret < 0 && res.outcome == KVMDIRTY_MIG_HERE) {
		fprintf(stderr, PROG ": migration to %s failed, the guest runs on here: %s\n", v->run.addr, err);
		return finish(v, t0) ? 1 : 3;
	}
	if (ret < 0) {
		fprintf(stderr, PROG ": migration to %s: outcome unknown, the guest stays paused: %s\n", v->run.addr, err);
		return 4;
	}
	printf("migrated to %s: %" PRIu64 " pages in %" PRIu64 " passes, %.1f ms total, %.1f ms downtime%s\n",
	       v->run.addr, res.pages, res.passes, res.total_ms, res.downtime_ms,
	       ret > 0 ? "; pages lost by tracking: VERIFICATION FAILED" : "");
	testvm_stop_all(v->tv);
	testvm_halt_all(v->tv);
	return ret > 0;
}

/* A guest that arrived (a stream, a restore): run it to its end here. */
static int run_arrived(struct vmm *v)
{
	int ret;

	fflush(stdout);
	ret = testvm_spawn(v->tv);
	if (ret < 0) {
		fprintf(stderr, PROG ": starting vCPUs: %s\n", strerror(-ret));
		return 1;
	}
	return finish(v, now());
}

/* --incoming: a bare guest takes a stream, then runs to its end here. */
static int incoming(struct vmm *v)
{
	struct kvmdirty_mig_recv_result res;
	struct kvmdirty_mig_guest *g;
	char err[512];
	int lfd, ret;

	if (describe(v, true, &g))
		return 1;
	lfd = kvmdirty_mig_listen(v->run.addr, err, sizeof(err));
	if (lfd < 0) {
		fprintf(stderr, PROG ": --incoming: %s\n", err);
		kvmdirty_mig_guest_free(g);
		return 1;
	}
	printf("listening at %s\n", v->run.addr);
	fflush(stdout);
	ret = kvmdirty_mig_recv(g, lfd, NULL, &res, err, sizeof(err));
	close(lfd);
	kvmdirty_mig_guest_free(g);
	if (ret < 0) {
		fprintf(stderr, PROG ": --incoming: no guest to run: %s\n", err);
		return 1;
	}
	printf("incoming: %" PRIu64 " pages, every one %s; device state: %" PRIu64 " move(s); running the guest\n",
	       res.pages, res.hashed ? "matched its hash" : "arrived", v->dev.moves);
	return run_arrived(v);
}

/* Whether every vCPU has done its passes, or stopped otherwise. */
static bool done(struct vmm *v)
{
	unsigned int i, alive;

	pthread_mutex_lock(&v->tv->lock);
	alive = v->tv->alive;
	pthread_mutex_unlock(&v->tv->lock);
	for (i = 0; alive && i < v->tv->nr_vcpus; i++)
		if (testvm_mailbox(v->tv, i)->pass < v->passes)
			return false;
	return true;
}

/* --snapshot: a snapshot every --every ms while the guest runs, then its end. */
static int snapshots(struct vmm *v, double t0)
{
	struct kvmdirty_mig_snap_opts so = { .prefix = v->run.prefix };
	struct kvmdirty_mig_snap_result r;
	struct kvmdirty_mig_snap *snap;
	struct kvmdirty_mig_guest *g;
	int ret, failed = 0;
	char err[512];

	if (describe(v, false, &g))
		return 1;
	ret = kvmdirty_mig_snap_new(g, &so, &snap, err, sizeof(err));
	if (ret < 0) {
		fprintf(stderr, PROG ": --snapshot: %s\n", err);
		kvmdirty_mig_guest_free(g);
		testvm_stop_all(v->tv);
		finish(v, t0);
		return 1;
	}
	while (!done(v)) {
		ret = kvmdirty_mig_snap_take(snap, &r, err, sizeof(err));
		if (ret < 0) {
			fprintf(stderr, PROG ": --snapshot: %s\n", err);
			failed = 1;
		} else {
			printf("snapshot %s: %s, %" PRIu64 " pages, %.2f ms paused, %.1f ms in all\n", r.path,
			       r.seq ? "diff" : "full", r.pages, r.pause_ms, r.total_ms);
		}
		vmm_sleep_ms(v->every_ms);
	}
	kvmdirty_mig_snap_free(snap);
	kvmdirty_mig_guest_free(g);
	return finish(v, t0) | failed;
}

/* --restore: a bare guest from a chain of snapshots, then run to its end. */
static int restore(struct vmm *v)
{
	struct kvmdirty_mig_guest *g;
	uint64_t pages;
	char err[512];
	int ret;

	if (describe(v, true, &g))
		return 1;
	ret = kvmdirty_mig_restore(g, (const char *const *)v->run.files, v->run.nr_files, &pages, err, sizeof(err));
	kvmdirty_mig_guest_free(g);
	if (ret < 0) {
		fprintf(stderr, PROG ": --restore refused, the guest does not run: %s\n", err);
		return 1;
	}
	printf("restored %u file(s): %" PRIu64 " pages read, each matched its hash; device state: %" PRIu64
	       " move(s); running the guest\n",
	       v->run.nr_files, pages, v->dev.moves);
	return run_arrived(v);
}

/* A guest that starts here: run it (and move or snapshot it, as asked). */
static int start(struct vmm *v)
{
	double t0;
	int ret;

	memcpy(v->dev.magic, PROG, 8);
	v->dev.started_ms = (uint64_t)time(NULL) * 1000;
	t0 = now();
	ret = testvm_spawn(v->tv);
	if (ret < 0) {
		fprintf(stderr, PROG ": starting vCPUs: %s\n", strerror(-ret));
		return 1;
	}
	if (v->run.mode == MIGRATE_TO)
		return migrate_to(v, t0);
	if (v->run.mode == SNAPSHOT)
		return snapshots(v, t0);
	return finish(v, t0);
}

int main(int argc, char **argv)
{
	struct vmm v = { .vcpus = 2, .mib = 64, .passes = 8, .stride = 16, .pattern = GUEST_SEQUENTIAL,
			 .after_ms = 300, .every_ms = 200 };
	bool arrives;
	unsigned int i;
	int ret;

	ret = parse(argc, argv, &v);
	if (ret)
		return ret < 0 ? 0 : ret;
	ret = kvm_host_check(PROG ": ");
	if (ret)
		return ret;
	arrives = v.run.mode == INCOMING || v.run.mode == RESTORE;
	ret = build(&v, !arrives);
	if (ret == 0) {
		printf("VM: %u vCPU(s) at CPL %d, %" PRIu64 " MiB each%s, memslots %" PRId64 "\n", v.tv->nr_vcpus,
		       v.ring0 ? 0 : 3, v.mib, v.state ? ", state checks" : "",
		       kvmdirty_vm_cap(v.tv->vm, KVMDIRTY_CAP_NR_MEMSLOTS));
		fflush(stdout);
		ret = v.run.mode == INCOMING ? incoming(&v) : v.run.mode == RESTORE ? restore(&v) : start(&v);
	}
	testvm_free(v.tv);
	for (i = 0; i < v.vcpus; i++)
		testvm_unmap(v.mem[i], v.mib << 20);
	return ret;
}
