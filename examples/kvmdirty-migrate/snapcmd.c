// SPDX-License-Identifier: MIT
/*
 * kvmdirty-migrate's snapshot and restore commands (snapcmd.h): the
 * test guest into a chain of files, and a chain into a new test guest
 * that then runs and checks itself.
 */
#include <errno.h>
#include <getopt.h>
#include <stdbool.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>

#include "../common/cli.h"
#include "../common/kvm-host.h"
#include "snapcmd.h"

static volatile sig_atomic_t stop_asked;

static double now_msf(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

static void on_stop(int sig)
{
	(void)sig;
	stop_asked = 1;
}

void mig_snap_line(FILE *out, const struct kvmdirty_mig_snap_result *r, uint64_t alloc_bytes)
{
	uint64_t held = r->data_pages + r->zero_pages;

	fprintf(out,
		"snapshot kind=%s seq=%" PRIu64 " file=%s passes=%u dirty_mib=%.1f data_pages=%" PRIu64
		" zero_pages=%" PRIu64 " pages_written=%" PRIu64 " pause_pages=%" PRIu64
		" pause_ms=%.2f pause_stop_ms=%.2f pause_sync_ms=%.2f pause_write_ms=%.2f"
		" pause_vcpu_ms=%.2f fsync_ms=%.2f"
		" write_ms=%.1f write_mibps=%.0f guest_dirty_pps=%.0f throttle_permille=%u file_mib=%.1f "
		"alloc_mib=%.2f total_ms=%.1f\n",
		r->seq ? "diff" : "full", r->seq, r->path, r->passes, held * 4096.0 / 1048576, r->data_pages,
		r->zero_pages, r->pages, r->pause_pages, r->pause_ms, r->pause_stop_ms, r->pause_sync_ms,
		r->pause_write_ms, r->pause_vcpu_ms, r->fsync_ms, r->write_ms,
		r->write_ms > 0 ? r->bytes / 1048576.0 / (r->write_ms / 1e3) : 0, r->dirty_pps, r->throttle_permille,
		r->file_len / 1048576.0, alloc_bytes / 1048576.0, r->total_ms);
	fflush(out);
}

int mig_snap_prefix_check(const char *prefix, char *err, size_t len)
{
	char dir[MIG_SNAP_PATH_MAX], first[MIG_SNAP_PATH_MAX + 16];
	const char *slash = strrchr(prefix, '/');
	struct stat st;

	if (strlen(prefix) >= MIG_SNAP_PATH_MAX - 32)
		return snprintf(err, len, "-o: a prefix of at most %d bytes", MIG_SNAP_PATH_MAX - 33), -ENAMETOOLONG;
	snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - prefix) + 1 : 1, slash ? prefix : ".");
	if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode))
		return snprintf(err, len, "-o '%.256s': %.256s: %s", prefix, dir,
				stat(dir, &st) < 0 ? strerror(errno) : "not a directory"),
		       -ENOTDIR;
	snprintf(first, sizeof(first), "%s-000000.snap", prefix);
	if (lstat(first, &st) == 0)
		return snprintf(err, len,
				"-o '%.256s': %.256s exists: a chain is never written over (another prefix, "
				"or remove it)",
				prefix, first),
		       -EEXIST;
	return 0;
}

uint64_t mig_snap_allocated(const char *path)
{
	struct stat st;

	return stat(path, &st) == 0 ? (uint64_t)st.st_blocks * 512 : 0;
}

int mig_snap_run(struct kvmdirty_mig_guest *g, const char *prefix, uint64_t every_ms, uint64_t count, bool throttle)
{
	struct sigaction sa = { .sa_handler = on_stop }, old_int, old_term;
	struct kvmdirty_mig_snap_opts o = { .prefix = prefix, .no_throttle = !throttle };
	struct kvmdirty_mig_snap_result r;
	struct kvmdirty_mig_snap *s;
	unsigned int failed = 0;
	char err[512];
	uint64_t i;
	double next;
	int ret;

	ret = kvmdirty_mig_snap_new(g, &o, &s, err, sizeof(err));
	if (ret < 0) {
		fprintf(stderr, "kvmdirty-migrate: snapshot: %s\n", err);
		return 1;
	}
	sigaction(SIGINT, &sa, &old_int);
	sigaction(SIGTERM, &sa, &old_term);
	next = now_msf();
	for (i = 0; i < count && !stop_asked; i++) {
		if (i) {
			/* every every_ms from the start of the one before; one that overran starts the next at once */
			next += (double)every_ms;
			while (!stop_asked && now_msf() < next) {
				double left = next - now_msf();
				struct timespec ts = { 0, (long)((left > 10 ? 10 : left) * 1e6) };

				nanosleep(&ts, NULL);
			}
			if (stop_asked)
				break;
			next = now_msf();
		}
		ret = kvmdirty_mig_snap_take(s, &r, err, sizeof(err));
		if (ret < 0) {
			failed++;
			fprintf(stderr,
				"kvmdirty-migrate: snapshot %s failed, nothing of it kept (the next takes its "
				"place): %s\n",
				r.path, err);
			continue;
		}
		mig_snap_line(stdout, &r, mig_snap_allocated(r.path));
	}
	sigaction(SIGINT, &old_int, NULL);
	sigaction(SIGTERM, &old_term, NULL);
	kvmdirty_mig_snap_free(s);
	return failed ? 1 : 0;
}

/* restore's guest options, from the chain's first file: the test guest's layout (testguest.h). */
static int guest_opts(const char *path, struct mig_testvm_opts *o, char *err, size_t len)
{
	struct kvmdirty_mig_snap_region reg[256];
	struct kvmdirty_mig_snap_info in;
	uint64_t data = 0;
	uint32_t i, n = 0;
	int ret;

	memset(o, 0, sizeof(*o));
	ret = kvmdirty_mig_snap_info(path, &in, reg, 256, err, len);
	if (ret < 0)
		return ret;
	for (i = 0; i < in.nr_regions && i < 256; i++) {
		if (reg[i].gpa < MIG_DATA_GPA)
			continue;
		data += reg[i].size;
		n++;
	}
	o->mib = data >> 20;
	o->vcpus = in.nr_vcpus;
	o->regions = n;
	o->lazy = true; /* fresh memory, faulted in as pages are read: the holes never are */
	if (!n || in.nr_regions > 256 || data % (2u << 20) || mig_testvm_check(o, err, len) < 0)
		return snprintf(err, len, "%.200s: its regions and vCPUs are not a test guest's", path), -EINVAL;
	return 0;
}

static int restore_usage(void)
{
	fprintf(stderr,
		"usage: kvmdirty-migrate restore FILE... [--run-ms MS] [--check] [--lazy [--no-workset]]   (a full snapshot, then its diffs in order)\n");
	return 2;
}

/* The lazy restore's event: resident, a line on stdout (a failure is said once, as the command ends). */
static void lazy_event(void *ctx, enum kvmdirty_mig_lazy_event ev, const char *line)
{
	(void)ctx;
	if (ev == KVMDIRTY_MIG_LAZY_RESIDENT) {
		printf("restore: %s\n", line);
		fflush(stdout);
	}
}

/*
 * The working-set file to read: the newest file of the chain with one
 * beside it (FILE.ws), into path (empty: none).
 */
static void workset_of(const char *const *files, unsigned int n, char *path, size_t len)
{
	struct stat sb;

	path[0] = 0;
	while (n--) {
		snprintf(path, len, "%s.ws", files[n]);
		if (stat(path, &sb) == 0)
			return;
	}
	path[0] = 0;
}

/*
 * kvmdirty_mig_restore_lazy() into g: 0 (the guest may run, *ret_lazy
 * set), 1 where userfaultfd is not to be had here (said in one line: the
 * eager restore follows), or -errno with err.
 */
static int restore_lazy(struct kvmdirty_mig_guest *g, const char *const *files, unsigned int n, bool workset,
			struct kvmdirty_mig_lazy **ret_lazy, char *err, size_t len)
{
	static char ws_in[MIG_SNAP_PATH_MAX + 8], ws_out[MIG_SNAP_PATH_MAX + 8];
	struct kvmdirty_mig_lazy_opts lo = { .event = lazy_event };
	int ret;

	if (workset) {
		workset_of(files, n, ws_in, sizeof(ws_in));
		snprintf(ws_out, sizeof(ws_out), "%s.ws", files[n - 1]);
		lo.workset_read = ws_in[0] ? ws_in : NULL;
		lo.workset_write = ws_out;
	}
	ret = kvmdirty_mig_restore_lazy(g, files, n, &lo, ret_lazy, err, len);
	if (ret == -EPERM || ret == -ENOSYS) {
		fprintf(stderr, "kvmdirty-migrate: restore --lazy: %s; restoring eagerly\n", err);
		return 1;
	}
	return ret;
}

/* The lazy restore's figures, one line, once resident (or as far as it got). */
static void lazy_line(struct kvmdirty_mig_lazy *lz)
{
	struct kvmdirty_mig_lazy_stats st;

	kvmdirty_mig_lazy_stats(lz, &st);
	printf("restore --lazy: first_instruction_ms=%.2f resident_ms=%.1f faults=%" PRIu64 " fault_p50_us=%.1f "
	       "fault_p99_us=%.1f zero_faults=%" PRIu64 " around=%" PRIu64 " filled=%" PRIu64 " prefetched=%" PRIu64
	       " workset_pages=%" PRIu64 " raced=%" PRIu64 "\n",
	       st.first_instruction_ms, st.resident_ms, st.faults, st.fault_p50_us, st.fault_p99_us, st.zero_faults,
	       st.around, st.filled, st.prefetched, st.workset_pages, st.raced);
	if (st.ws_note[0])
		printf("restore --lazy: working-set file %s\n", st.ws_note);
}

int mig_snap_restore_cmd(int argc, char **argv)
{
	static const struct option longopts[] = { { "run-ms", required_argument, NULL, 'R' },
						  { "check", no_argument, NULL, 'C' },
						  { "lazy", no_argument, NULL, 'L' },
						  { "no-workset", no_argument, NULL, 'W' },
						  { "help", no_argument, NULL, 'h' },
						  { 0 } };
	struct kvmdirty_mig_guest *g = NULL;
	struct kvmdirty_mig_lazy *lz = NULL;
	struct mig_testvm_opts go;
	struct testvm *tv = NULL;
	uint64_t run_ms = 1000, pages = 0, checked = 0;
	const char *const *files;
	unsigned int n;
	bool check = false, lazy = false, workset = true;
	char err[1024];
	int c, ret = 0;

	optind = 2;
	while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		if (c == 'R') {
			if (cli_number("kvmdirty-migrate", "--run-ms", optarg, 0, 3600000, &run_ms))
				return 2;
		} else if (c == 'C') {
			check = true;
		} else if (c == 'L') {
			lazy = true;
		} else if (c == 'W') {
			workset = false;
		} else {
			return c == 'h' ? (restore_usage(), 0) : restore_usage();
		}
	}
	if (optind == argc)
		return restore_usage();
	if (!workset && !lazy) {
		fprintf(stderr, "kvmdirty-migrate: --no-workset: only with --lazy\n");
		return 2;
	}
	files = (const char *const *)argv + optind;
	n = (unsigned int)(argc - optind);
	/* every file whole and the chain in order before anything is built */
	ret = kvmdirty_mig_snap_check(files, n, err, sizeof(err));
	/* --check: every copy of every page, older ones too, before anything is built */
	if (ret == 0 && check)
		ret = kvmdirty_mig_verify(files, n, &checked, err, sizeof(err));
	if (ret == 0)
		ret = guest_opts(files[0], &go, err, sizeof(err));
	if (ret < 0) {
		fprintf(stderr, "kvmdirty-migrate: restore refused: %s\n", err);
		goto out;
	}
	ret = kvm_host_check("kvmdirty-migrate: ");
	if (ret) {
		ret = -ret;
		goto out;
	}
	ret = mig_testvm_new(&go, false, &tv, err, sizeof(err));
	if (ret == 0)
		ret = mig_testvm_api(tv, false, &g, err, sizeof(err));
	if (ret == 0 && lazy && (ret = restore_lazy(g, files, n, workset, &lz, err, sizeof(err))) == 1)
		lazy = false, ret = 0;
	if (ret == 0 && !lazy)
		ret = kvmdirty_mig_restore(g, files, n, &pages, err, sizeof(err));
	if (ret < 0) {
		kvmdirty_mig_guest_free(g);
		fprintf(stderr, "kvmdirty-migrate: restore refused, the guest does not run: %s\n", err);
		goto out;
	}
	if (check)
		printf("restore: --check: %" PRIu64 " pages of the %u file%s, every copy, each matched its hash\n", checked, n,
		       n == 1 ? "" : "s");
	if (lazy)
		printf("restore: %u file%s, a chain, lazily: pages placed as the guest touches them, each checked first; "
		       "resuming the guest\n", n, n == 1 ? "" : "s");
	else
		printf("restore: %u file%s, a chain; %" PRIu64 " pages read, each matched its hash; resuming the guest\n",
		       n, n == 1 ? "" : "s", pages);
	fflush(stdout);
	ret = mig_testvm_resume_check(tv, run_ms, err, sizeof(err));
	if (lz) {
		char why[1024];
		/* a failure stopped the guest: that, not what the stopped guest's check says, is the news */
		int lret = kvmdirty_mig_lazy_wait(lz, ret < 0 ? 0 : -1, why, sizeof(why));

		if (lret < 0 && lret != -ETIMEDOUT) {
			fprintf(stderr, "kvmdirty-migrate: restore --lazy failed, the guest stopped: %s\n", why);
			ret = lret;
			lazy_line(lz);
			kvmdirty_mig_lazy_free(lz);
			kvmdirty_mig_guest_free(g);
			goto out;
		}
	}
	if (ret < 0)
		fprintf(stderr, "kvmdirty-migrate: restore: %s\n", err);
	else
		printf("restore: guest ran %" PRIu64 " ms after restore, %s, self-check ok\n", run_ms, err);
	if (lz) {
		lazy_line(lz);
		kvmdirty_mig_lazy_free(lz);
	}
	kvmdirty_mig_guest_free(g);
out:
	if (tv)
		mig_testvm_free(tv);
	/* a host without KVM: its exit status, said in one line */
	return ret == -KVM_HOST_MISSING_EXIT ? KVM_HOST_MISSING_EXIT : ret < 0;
}
