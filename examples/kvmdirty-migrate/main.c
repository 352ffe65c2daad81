// SPDX-License-Identifier: MIT
/*
 * kvmdirty-migrate: live-migrate the test guest between two processes or
 * two hosts.
 *
 *   kvmdirty-migrate listen ADDR [guest options] [--run-ms MS] [-T MS] [--deadline S]
 *   kvmdirty-migrate send ADDR [guest options] [migration options]
 *   kvmdirty-migrate demo
 *   kvmdirty-migrate rate [guest options] [--interval MS] [--count N] [--json] [--during-migration]
 *   kvmdirty-migrate plot STATS.json [-o OUT.svg]
 *   kvmdirty-migrate genkey FILE
 *
 * ADDR is tcp:HOST:PORT (HOST empty: loopback) or unix:PATH.
 * Guest options (both ends must agree): -m MIB memory (256), -v VCPUS (2);
 * source only: -M dirty-log|clear-log|dirty-ring (clear-log),
 * -w MIB working set the vCPUs keep dirtying (0: idle), -r PAGES_PER_SEC
 * per vCPU (0: flat out); --vcpu I=WORK gives vCPU I a workload of its
 * own (dirty:MIB[:PAGES_PER_SEC], compute, idle; the others share -w);
 * --fill ws|all|MIB: what holds non-zero data (ws: the working sets, the
 * rest never touched; all: all memory; MIB: the first MIB and the working
 * sets).  Migration options: -d DOWNTIME_MS (50), -p MAX_PASSES (10),
 * -t TIMEOUT_S (60), --no-verify, --no-throttle (the vCPUs that dirty
 * are not slowed, see source.h), --force-switchover (stop the guest and
 * send the rest even when pre-copy did not converge; by default the
 * migration is then abandoned and the guest runs on here), --stats FILE
 * (JSON lines, version 1: doc/migrate-stats.md), --baseline MS (each
 * vCPU's speed before tracking; 500 with --stats, else 0).
 * Both ends: -T MS, how long any wait for the peer may go without
 * progress (30000); listen: --deadline S for a whole stream (0: none).
 * Both ends: --psk FILE, a pre-shared key both must hold (session.h:
 * each proves it to the other, every record is sealed), in a file genkey
 * made (keyfile.h: 64 hex digits, the user's own, mode 0600); --encrypt, the
 * records encrypted too (send: do it; listen: require it); --name NAME
 * (listen), the name this destination answers to (by default the address
 * each connection arrived on), --peer-name NAME (send), the destination
 * meant (by default the address dialled): a source that means another
 * destination is refused.  send:
 * --connections N (1), the pages spread over N connections;
 * --max-bandwidth MIB_PER_S (0: none), the stream capped, stop-and-copy
 * included.  Both ends: --control PATH, a socket that answers query and
 * resolve, and on the source set (the parameters while it runs), cancel
 * (before COMMIT) and subscribe (its events) (kvmdirty-migrate-control(7));
 * without it, one is opened at a default path the moment the handoff's
 * outcome becomes unknown (handoff.h: the guest then stays paused until a
 * late message or a resolve decides).
 *
 * listen takes streams until one is accepted (a refused or silent peer is
 * dropped with a line on stderr; with --once the first stream from a peer
 * that passed authentication decides: one that fails it never ends the
 * listener), then
 * runs the guest for --run-ms and checks it; it exits 0 if the guest ran
 * on, 1 otherwise.  send exits 0
 * when the guest moved, 1 when it did not (it runs on here: the source
 * then runs it --run-ms more and checks it as the destination would), 3
 * when it moved but the check after switchover found pages that differ
 * from what was sent, 4 when a cancel through the control socket ended it
 * before COMMIT (the guest runs on here, and is run and checked as after a
 * failure).
 *
 * plot draws a --stats file as one SVG (plot.h), by default beside it
 * (run.json: run.svg; -o - for standard output); it exits 0 when it drew
 * one (also from a file cut short, marked incomplete and said so on
 * stderr), 1 when it refused the file or could not write the picture.
 *
 * genkey writes a new key to FILE, which it creates mode 0600 and never
 * overwrites: 64 hex digits of getrandom(2) and a newline, for --psk on
 * both hosts.  It exits 0 when it wrote one, 1 when it did not (one line
 * naming FILE; nothing left behind).
 *
 * Every command first makes the process not dumpable (keyfile.h): no core
 * dump, no ptrace by the user's other processes, before any key is read.
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <kvmdirty-migrate.h>

#include "../common/cli.h"
#include "../common/kvm-host.h"
#include "plot.h"
#include "snapcmd.h"
#include "testguest.h"

#define EXIT_LOST 3
#define EXIT_CANCELLED 4

struct args {
	const char *cmd, *addr, *stats;
	const char *mode; /* -M as given */
	bool baseline_set, ws_set, run_ms_set; /* given on the command line */
	struct mig_testvm_opts guest;
	struct kvmdirty_mig_send_opts send;
	struct kvmdirty_mig_recv_opts recv;
	uint64_t run_ms;
	const char *psk_file;
	const char *control; /* --control PATH, or NULL */
	struct kvmdirty_mig_control *ctl; /* the side's control (its socket at --control), or NULL */
	/* rate: every interval_ms, count times (0: until interrupted), as JSON, beside a migration */
	uint64_t rate_interval_ms, rate_count;
	bool rate_json, rate_migrate, rate_opts; /* rate_opts: one of them given */
	/* snapshot: -o PREFIX, --every MS, --count N */
	const char *snap_prefix;
	uint64_t snap_every_ms, snap_count;
};

/* Long options without a short one. */
enum { OPT_REGIONS = 0x100, OPT_LAZY, OPT_EVERY, OPT_POSTCOPY, OPT_POSTCOPY_AFTER, OPT_COMPRESS, OPT_FILL_DATA };

static void usage(void)
{
	fprintf(stderr, "usage: kvmdirty-migrate listen ADDR [-m MIB] [-v VCPUS] [--regions N] [--run-ms MS] [-T|--peer-timeout MS]\n"
			"                                [--deadline S] [--once] [--lazy]\n"
			"                                [--psk FILE] [--encrypt] [--name NAME] [--control PATH] [--postcopy]\n"
			"       kvmdirty-migrate send ADDR [-m MIB] [-v VCPUS] [--regions N] [-M MODE] [-w MIB] [-r PAGES_PER_SEC]\n"
			"                              [--vcpu I=dirty:MIB[:PAGES_PER_SEC]|I=compute|I=idle]...\n"
			"                              [--fill ws|all|MIB] [--fill-data random|text] [-d DOWNTIME_MS] [-p MAX_PASSES]\n"
			"                              [-t TIMEOUT_S] [-T|--peer-timeout MS] [--no-verify] [--no-throttle] [--force-switchover]\n"
			"                              [--stats FILE] [--baseline MS] [--run-ms MS] [--psk FILE] [--encrypt]\n"
			"                              [--peer-name NAME] [--connections N] [--control PATH] [--max-bandwidth MIB_PER_S]\n"
			"                              [--postcopy [--postcopy-after PASSES]] [--compress auto|zstd|off]\n"
			"       kvmdirty-migrate demo [send options]     (both ends here, over a Unix socket)\n"
			"       kvmdirty-migrate rate [guest options] [--interval MS] [--count N] [--json]\n"
			"                             [--during-migration [send options]]   (the test guest's dirty rate)\n"
			"       kvmdirty-migrate snapshot -o PREFIX [guest options] [--every MS] [--count N] [--run-ms MS]\n"
			"       kvmdirty-migrate restore FILE... [--run-ms MS] [--check] [--lazy [--no-workset]]  (a full snapshot, then its diffs in order)\n"
			"       kvmdirty-migrate plot STATS.json [-o OUT.svg]\n"
			"       kvmdirty-migrate probe                   (what this host's KVM offers; 77 where none)\n"
			"       kvmdirty-migrate genkey FILE             (a new key for --psk, in a new file, mode 0600)\n"
			"       kvmdirty-migrate -h|--help\n");
}

/* --vcpu I=dirty:MIB[:PAGES_PER_SEC] | I=compute | I=idle */
static int parse_work(struct args *a, const char *arg)
{
	char buf[128], *eq, *spec, *rate;
	struct mig_vcpu_work w = { 0 };
	uint64_t i;

	snprintf(buf, sizeof(buf), "%s", arg);
	eq = strchr(buf, '=');
	if (!eq)
		goto bad;
	*eq = 0;
	spec = eq + 1;
	if (cli_number("kvmdirty-migrate", "--vcpu", buf, 0, GUEST_MAX_VCPUS - 1, &i))
		return -1;
	if (!strcmp(spec, "compute")) {
		w.kind = MIG_WORK_COMPUTE;
	} else if (!strcmp(spec, "idle")) {
		w.kind = MIG_WORK_IDLE;
	} else if (!strncmp(spec, "dirty:", 6)) {
		w.kind = MIG_WORK_DIRTY;
		rate = strchr(spec + 6, ':');
		if (rate)
			*rate++ = 0;
		if (cli_number("kvmdirty-migrate", "--vcpu dirty MIB", spec + 6, 1, 1 << 16, &w.mib) ||
		    (rate && cli_number("kvmdirty-migrate", "--vcpu dirty PAGES_PER_SEC", rate, 0, UINT32_MAX, &w.rate)))
			return -1;
	} else {
		goto bad;
	}
	a->guest.work[i] = w;
	return 0;
bad:
	fprintf(stderr, "kvmdirty-migrate: --vcpu '%s': expected I=dirty:MIB[:PAGES_PER_SEC], I=compute or I=idle\n",
		arg);
	return -1;
}

static int parse_fill(struct args *a, const char *arg)
{
	if (!strcmp(arg, "ws"))
		a->guest.fill = MIG_FILL_WS;
	else if (!strcmp(arg, "all"))
		a->guest.fill = MIG_FILL_ALL;
	else if (!isdigit((unsigned char)arg[0]) ||
		 cli_number("kvmdirty-migrate", "--fill", arg, 1, 1 << 16, &a->guest.fill)) {
		if (!isdigit((unsigned char)arg[0]))
			fprintf(stderr, "kvmdirty-migrate: --fill '%s': expected ws, all or a size in MiB\n", arg);
		return -1;
	}
	return 0;
}

/* --name, --peer-name: what a hello carries, 1 .. KVMDIRTY_MIG_NAME_MAX printable ASCII characters */
static int bad_name(const char *opt, const char *arg)
{
	const char *p;

	for (p = arg; *p; p++)
		if (*p < 0x21 || *p > 0x7e)
			break;
	if (!*arg || *p || p - arg > KVMDIRTY_MIG_NAME_MAX) {
		char shown[KVMDIRTY_MIG_NAME_MAX + 2];
		size_t i;

		/* what it holds, each byte a terminal would take as a control one shown as '?' */
		for (i = 0; arg[i] && i <= KVMDIRTY_MIG_NAME_MAX; i++)
			shown[i] = (unsigned char)arg[i] >= 0x20 && (unsigned char)arg[i] < 0x7f ? arg[i] : '?';
		shown[i] = 0;
		fprintf(stderr, "kvmdirty-migrate: %s '%s%s': a name of 1 to %d printable ASCII characters, no space\n",
			opt, shown, strlen(arg) > KVMDIRTY_MIG_NAME_MAX ? "..." : "", KVMDIRTY_MIG_NAME_MAX);
		return -1;
	}
	return 0;
}

/* ---- the options: one table, a setter each ---- */

#define NUMBER(opt, arg, lo, hi, out) cli_number("kvmdirty-migrate", opt, arg, lo, hi, out)

static int set_mib(struct args *a, const char *arg)
{
	if (NUMBER("-m", arg, 4, 1 << 16, &a->guest.mib))
		return -1;
	if (a->guest.mib % 2) {
		fprintf(stderr, "kvmdirty-migrate: -m '%s': must be a multiple of 2 MiB\n", arg);
		return -1;
	}
	return 0;
}

static int set_vcpus(struct args *a, const char *arg)
{
	uint64_t v;

	if (NUMBER("-v", arg, 1, GUEST_MAX_VCPUS, &v))
		return -1;
	a->guest.vcpus = (unsigned int)v;
	return 0;
}

static int set_mode(struct args *a, const char *arg)
{
	if (!strcmp(arg, "dirty-log")) {
		a->guest.mode = KVMDIRTY_MODE_DIRTY_LOG;
	} else if (!strcmp(arg, "clear-log")) {
		a->guest.mode = KVMDIRTY_MODE_CLEAR_LOG;
	} else if (!strcmp(arg, "dirty-ring")) {
		a->guest.mode = KVMDIRTY_MODE_DIRTY_RING;
	} else {
		fprintf(stderr, "kvmdirty-migrate: -M '%s': expected dirty-log, clear-log or dirty-ring\n", arg);
		return -1;
	}
	a->mode = arg;
	return 0;
}

static int set_ws(struct args *a, const char *arg)
{
	a->ws_set = true;
	return NUMBER("-w", arg, 0, 1 << 16, &a->guest.ws_mib);
}

static int set_rate(struct args *a, const char *arg)
{
	return NUMBER("-r", arg, 0, UINT32_MAX, &a->guest.rate);
}

static int set_downtime(struct args *a, const char *arg)
{
	return NUMBER("-d", arg, 0, 3600000, &a->send.downtime_ms);
}

static int set_passes(struct args *a, const char *arg)
{
	uint64_t v;

	if (NUMBER("-p", arg, 1, 100000, &v))
		return -1;
	a->send.max_passes = (unsigned int)v;
	return 0;
}

static int set_timeout(struct args *a, const char *arg)
{
	uint64_t v;

	if (NUMBER("-t", arg, 1, 86400, &v))
		return -1;
	a->send.timeout_ms = v * 1000;
	return 0;
}

static int set_peer_timeout(struct args *a, const char *arg)
{
	uint64_t v;

	if (NUMBER("-T", arg, 1, 86400000, &v))
		return -1;
	a->send.peer_timeout_ms = a->recv.timeout_ms = v;
	return 0;
}

static int set_deadline(struct args *a, const char *arg)
{
	uint64_t v;

	if (NUMBER("--deadline", arg, 0, 864000, &v))
		return -1;
	a->recv.deadline_ms = v * 1000;
	/* send: how long a post-copy paused by a lost connection dials again by itself */
	a->send.postcopy_recover_ms = v * 1000;
	return 0;
}

static int set_run_ms(struct args *a, const char *arg)
{
	a->run_ms_set = true;
	return NUMBER("--run-ms", arg, 0, 3600000, &a->run_ms);
}

static int set_regions(struct args *a, const char *arg)
{
	uint64_t v;

	if (NUMBER("--regions", arg, 1, MIG_TESTVM_MAX_REGIONS, &v))
		return -1;
	a->guest.regions = (unsigned int)v;
	return 0;
}

static int set_baseline(struct args *a, const char *arg)
{
	a->baseline_set = true;
	return NUMBER("--baseline", arg, 0, 60000, &a->send.baseline_ms);
}

static int set_bandwidth(struct args *a, const char *arg)
{
	return NUMBER("--max-bandwidth", arg, 0, KVMDIRTY_MIG_MAX_MIBPS, &a->send.max_mibps);
}

static int set_postcopy_after(struct args *a, const char *arg)
{
	uint64_t v;

	if (NUMBER("--postcopy-after", arg, 1, 100000, &v))
		return -1;
	a->send.postcopy_after = (unsigned int)v;
	return 0;
}

static int set_fill_data(struct args *a, const char *arg)
{
	if (strcmp(arg, "random") && strcmp(arg, "text")) {
		fprintf(stderr, "kvmdirty-migrate: --fill-data '%s': random or text\n", arg);
		return -1;
	}
	a->guest.text = !strcmp(arg, "text");
	return 0;
}

static int set_compress(struct args *a, const char *arg)
{
	static const char *const names[] = { "off", "auto", "zstd" };
	unsigned int i;

	for (i = 0; i < 3; i++)
		if (!strcmp(arg, names[i])) {
			a->send.compress = (enum kvmdirty_mig_compress)i;
			return 0;
		}
	fprintf(stderr, "kvmdirty-migrate: --compress '%s': auto, zstd or off\n", arg);
	return -1;
}

static int set_connections(struct args *a, const char *arg)
{
	uint64_t v;

	if (NUMBER("--connections", arg, 1, KVMDIRTY_MIG_MAX_CONNS, &v))
		return -1;
	a->send.connections = (unsigned int)v;
	return 0;
}

static int set_control(struct args *a, const char *arg)
{
	size_t most = KVMDIRTY_MIG_CONTROL_PATH_MAX;

	if (!arg[0] || strlen(arg) > most) {
		fprintf(stderr, "kvmdirty-migrate: --control '%s': a socket path of 1 to %zu bytes\n", arg, most);
		return -1;
	}
	a->control = arg;
	return 0;
}

static int set_name(struct args *a, const char *arg)
{
	a->recv.name = arg;
	return bad_name("--name", arg);
}

static int set_peer_name(struct args *a, const char *arg)
{
	a->send.peer_name = arg;
	return bad_name("--peer-name", arg);
}

static int set_interval(struct args *a, const char *arg)
{
	a->rate_opts = true;
	return NUMBER("--interval", arg, 10, 3600000, &a->rate_interval_ms);
}

/* --count: snapshot's (files), else rate's (samples) */
static int set_count(struct args *a, const char *arg)
{
	if (!strcmp(a->cmd, "snapshot"))
		return NUMBER("--count", arg, 1, 1000000, &a->snap_count);
	a->rate_opts = true;
	return NUMBER("--count", arg, 0, UINT32_MAX, &a->rate_count);
}

/* -o and --every: snapshot's only */
static int set_prefix(struct args *a, const char *arg)
{
	if (strcmp(a->cmd, "snapshot")) {
		fprintf(stderr, "kvmdirty-migrate: -o and --every are snapshot's options\n");
		return -1;
	}
	if (!arg[0]) {
		fprintf(stderr, "kvmdirty-migrate: -o '': a prefix for the snapshot files\n");
		return -1;
	}
	a->snap_prefix = arg;
	return 0;
}

static int set_every(struct args *a, const char *arg)
{
	if (strcmp(a->cmd, "snapshot")) {
		fprintf(stderr, "kvmdirty-migrate: -o and --every are snapshot's options\n");
		return -1;
	}
	return NUMBER("--every", arg, 0, 86400000, &a->snap_every_ms);
}

static int set_stats(struct args *a, const char *arg)
{
	a->stats = arg;
	return 0;
}

static int set_psk(struct args *a, const char *arg)
{
	a->psk_file = arg;
	return 0;
}

/* The options without an argument: each sets its flag. */
static int set_flag(struct args *a, int key)
{
	switch (key) {
	case 'N':
		a->send.no_verify = true;
		break;
	case 'X':
		a->send.no_throttle = true;
		break;
	case 'W':
		a->send.force_switchover = true;
		break;
	case 'O':
		a->recv.once = true;
		break;
	case OPT_LAZY:
		a->guest.lazy = true;
		break;
	case OPT_POSTCOPY:
		a->send.postcopy = a->recv.postcopy = true;
		break;
	case 'E':
		a->send.encrypt = a->recv.encrypt = true;
		break;
	case 'G':
		a->rate_json = a->rate_opts = true;
		break;
	case 'U':
		a->rate_migrate = a->rate_opts = true;
		break;
	case 'h':
		usage();
		exit(0);
	}
	return 0;
}

/*
 * Every option of every command that takes its options here (listen,
 * send, demo, rate, snapshot): its long name (NULL: a short one only),
 * whether it takes an argument, its key (a short option's letter, or
 * OPT_*), and what sets it (NULL: a flag, set_flag()).
 */
static const struct opt {
	const char *name;
	int has_arg, key;
	int (*set)(struct args *a, const char *arg);
} opts[] = {
	{ NULL, required_argument, 'm', set_mib },
	{ NULL, required_argument, 'v', set_vcpus },
	{ NULL, required_argument, 'M', set_mode },
	{ NULL, required_argument, 'w', set_ws },
	{ NULL, required_argument, 'r', set_rate },
	{ NULL, required_argument, 'd', set_downtime },
	{ NULL, required_argument, 'p', set_passes },
	{ NULL, required_argument, 't', set_timeout },
	{ NULL, required_argument, 'o', set_prefix },
	{ "run-ms", required_argument, 'R', set_run_ms },
	{ "no-verify", no_argument, 'N', NULL },
	{ "stats", required_argument, 'S', set_stats },
	{ "peer-timeout", required_argument, 'T', set_peer_timeout },
	{ "deadline", required_argument, 'D', set_deadline },
	{ "vcpu", required_argument, 'V', parse_work },
	{ "fill", required_argument, 'F', parse_fill },
	{ "regions", required_argument, OPT_REGIONS, set_regions },
	{ "lazy", no_argument, OPT_LAZY, NULL },
	{ "baseline", required_argument, 'B', set_baseline },
	{ "no-throttle", no_argument, 'X', NULL },
	{ "force-switchover", no_argument, 'W', NULL },
	{ "once", no_argument, 'O', NULL },
	{ "psk", required_argument, 'K', set_psk },
	{ "encrypt", no_argument, 'E', NULL },
	{ "connections", required_argument, 'C', set_connections },
	{ "control", required_argument, 'Q', set_control },
	{ "name", required_argument, 'A', set_name },
	{ "peer-name", required_argument, 'P', set_peer_name },
	{ "max-bandwidth", required_argument, 'Y', set_bandwidth },
	{ "interval", required_argument, 'I', set_interval },
	{ "count", required_argument, 'J', set_count },
	{ "json", no_argument, 'G', NULL },
	{ "during-migration", no_argument, 'U', NULL },
	{ "every", required_argument, OPT_EVERY, set_every },
	{ "postcopy", no_argument, OPT_POSTCOPY, NULL },
	{ "postcopy-after", required_argument, OPT_POSTCOPY_AFTER, set_postcopy_after },
	{ "compress", required_argument, OPT_COMPRESS, set_compress },
	{ "fill-data", required_argument, OPT_FILL_DATA, set_fill_data },
	{ "help", no_argument, 'h', NULL },
};

#define NR_OPTS (sizeof(opts) / sizeof(opts[0]))

static void defaults(struct args *a)
{
	a->guest = (struct mig_testvm_opts){ .mib = 256, .vcpus = 2, .mode = KVMDIRTY_MODE_CLEAR_LOG };
	a->send = (struct kvmdirty_mig_send_opts){ .downtime_ms = 50, .max_passes = 10, .timeout_ms = 60000,
						   .peer_timeout_ms = 30000 };
	a->recv = (struct kvmdirty_mig_recv_opts){ .timeout_ms = 30000 };
	a->run_ms = 1000;
	a->mode = "clear-log";
	a->rate_interval_ms = 1000;
	a->rate_count = 10;
	a->snap_every_ms = 1000;
	a->snap_count = 1;
}

/* What no single option can tell: options that do not go together, or not with the command. */
static int check_args(struct args *a)
{
	uint64_t v;

	for (v = 0; v < GUEST_MAX_VCPUS; v++) {
		if (a->guest.work[v].kind != MIG_WORK_SHARE && v >= a->guest.vcpus) {
			fprintf(stderr, "kvmdirty-migrate: --vcpu %" PRIu64 ": the guest has %u vCPUs (-v)\n", v,
				a->guest.vcpus);
			return -1;
		}
	}
	if (a->rate_opts && strcmp(a->cmd, "rate")) {
		fprintf(stderr, "kvmdirty-migrate: --interval, --count, --json and --during-migration are rate's options\n");
		return -1;
	}
	if (!strcmp(a->cmd, "rate") && !a->rate_migrate &&
	    (a->stats || a->control || a->psk_file || a->send.connections || a->send.peer_name || a->recv.name ||
	     a->send.max_mibps || a->recv.deadline_ms)) {
		fprintf(stderr, "kvmdirty-migrate: rate: --stats, --control, --psk, --connections, --name, --peer-name, "
				"--max-bandwidth and --deadline are the migration's: with --during-migration only\n");
		return -1;
	}
	if (!strcmp(a->cmd, "snapshot") &&
	    (a->stats || a->control || a->psk_file || a->send.connections || a->send.peer_name || a->recv.name ||
	     a->send.max_mibps || a->recv.deadline_ms || a->send.encrypt)) {
		fprintf(stderr, "kvmdirty-migrate: snapshot: --stats, --control, --psk, --encrypt, --connections, --name, "
				"--peer-name, --max-bandwidth and --deadline are a migration's\n");
		return -1;
	}
	if (!strcmp(a->cmd, "snapshot") && !a->snap_prefix) {
		fprintf(stderr, "kvmdirty-migrate: snapshot needs -o PREFIX (files PREFIX-000000.snap, ...)\n");
		return -1;
	}
	if (!a->baseline_set && a->stats)
		a->send.baseline_ms = 500;
	if (a->send.encrypt && !a->psk_file) {
		fprintf(stderr, "kvmdirty-migrate: --encrypt: needs a key (--psk FILE)\n");
		return -1;
	}
	return 0;
}

static int parse(int argc, char **argv, struct args *a)
{
	struct option longopts[NR_OPTS + 1];
	size_t i, n = 0;
	int c;

	for (i = 0; i < NR_OPTS; i++)
		if (opts[i].name)
			longopts[n++] = (struct option){ opts[i].name, opts[i].has_arg, NULL, opts[i].key };
	longopts[n] = (struct option){ 0 };
	defaults(a);
	optind = 2;
	while ((c = getopt_long(argc, argv, "m:v:M:w:r:d:p:t:T:o:h", longopts, NULL)) != -1) {
		for (i = 0; i < NR_OPTS && opts[i].key != c; i++)
			;
		if (i == NR_OPTS) /* getopt said what was wrong */
			return -1;
		if ((opts[i].set ? opts[i].set(a, optarg) : set_flag(a, c)) < 0)
			return -1;
	}
	if (optind != argc) {
		fprintf(stderr, "kvmdirty-migrate: unexpected argument '%s'\n", argv[optind]);
		return -1;
	}
	return check_args(a);
}

static void sleep_ms(uint64_t ms)
{
	struct timespec ts = { (time_t)(ms / 1000), (long)(ms % 1000) * 1000000 };

	nanosleep(&ts, NULL);
}

/*
 * The destination's lines: a stream refused (and another awaited) as the
 * library says it, any other a connection refused at the gate.
 */
static void log_refused(void *ctx, const char *line)
{
	(void)ctx;
	if (!strncmp(line, "stream refused, waiting", 23) || !strncmp(line, "dropped at the handoff, waiting", 31))
		fprintf(stderr, "kvmdirty-migrate: destination: %s\n", line);
	else
		fprintf(stderr, "kvmdirty-migrate: destination: connection refused: %s\n", line);
}

/* A control's lines (a resolve, a cancel, an unknown outcome), on stderr as the daemon's (ctx: the side). */
static void log_control(void *ctx, const char *line)
{
	fprintf(stderr, "kvmdirty-migrate: %s: %s\n", (const char *)ctx, line);
	fflush(stderr);
}

/*
 * The side's control: its socket at --control now (or, without one, at
 * the default path the moment an outcome becomes unknown, said on stderr).
 * 0, or -1 after one line.
 */
static int control_new(struct args *a, bool dest, const char *path)
{
	struct kvmdirty_mig_control_opts o = { .path = path, .destination = dest, .log = log_control,
					       .log_ctx = (void *)(dest ? "destination" : "source"),
					       .socket_on_unknown = true, .send_opts = dest ? NULL : &a->send };
	char err[256];

	if (kvmdirty_mig_control_new(&o, &a->ctl, err, sizeof(err)) < 0) {
		fprintf(stderr, "kvmdirty-migrate: %s: --control: %s\n", dest ? "destination" : "source", err);
		return -1;
	}
	/* -d 0 means 0 ms (send opts' 0 is the library's default) */
	if (!dest && !a->send.downtime_ms &&
	    kvmdirty_mig_control_set(a->ctl, &(struct kvmdirty_mig_params){ .downtime_ms = 0 }, KVMDIRTY_MIG_SET_DOWNTIME,
				     err, sizeof(err)) < 0) {
		fprintf(stderr, "kvmdirty-migrate: source: -d 0: %s\n", err);
		kvmdirty_mig_control_free(a->ctl);
		a->ctl = NULL;
		return -1;
	}
	return 0;
}

/*
 * Take streams until one is accepted, through the library's gate (many
 * handshakes at once, none of them able to hold the others); a refused
 * or silent peer is dropped and logged.  With --once the first stream
 * whose peer passed authentication decides.
 */
static int take_stream(const struct args *a, int lfd, struct kvmdirty_mig_guest *g,
		       struct kvmdirty_mig_recv_result *res)
{
	struct kvmdirty_mig_recv_opts o = a->recv;
	char err[512];
	int ret;

	o.psk_file = a->psk_file;
	o.log = log_refused;
	o.control = a->ctl;
	ret = kvmdirty_mig_recv(g, lfd, &o, res, err, sizeof(err));
	if (ret < 0 && o.once && ret != -ENOTRECOVERABLE && ret != -EACCES && ret != -EINPROGRESS)
		fprintf(stderr, "kvmdirty-migrate: destination: %s: %s\n",
			ret == -ECANCELED ? "dropped at the handoff" : "stream refused", err);
	else if (ret < 0)
		fprintf(stderr, "kvmdirty-migrate: destination: %s\n", err);
	return ret;
}

static double mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/*
 * Post-copy: the guest runs here at once, the pages it lacks brought in as
 * it touches them; until every one is in.  0, or -1 said (the guest was
 * paused for good on a failure; a lost connection is waited out).
 */
static int postcopy_run(struct testvm *tv, struct kvmdirty_mig_guest *g)
{
	struct kvmdirty_mig_postcopy_stats st;
	uint64_t w0, w1;
	double t0, t1;
	char err[512];
	int ret;

	printf("destination: stream complete, the pages still at the source come as the guest touches them; "
	       "resuming the guest\n");
	fflush(stdout);
	/* vCPU 0's pages written while post-copy runs: its speed, against its speed before the migration */
	w0 = testvm_mailbox(tv, 0)->writes;
	t0 = mono_ms();
	ret = testvm_spawn(tv);
	if (ret < 0) {
		fprintf(stderr, "kvmdirty-migrate: destination: starting vCPUs: %s\n", strerror(-ret));
		return -1;
	}
	while ((ret = kvmdirty_mig_postcopy_wait(g, 1000, &st, err, sizeof(err))) == -ETIMEDOUT)
		if (st.paused)
			fprintf(stderr, "kvmdirty-migrate: destination: post-copy paused, %" PRIu64 " pages still at the "
				"source: %s\n", st.missing, st.why);
	if (ret < 0) {
		fprintf(stderr, "kvmdirty-migrate: destination: post-copy failed, the guest is paused for good: %s\n", err);
		return -1;
	}
	w1 = testvm_mailbox(tv, 0)->writes;
	t1 = mono_ms();
	printf("destination: post-copy complete: %" PRIu64 " pages in %.1f ms, faults=%" PRIu64 " zero_faults=%" PRIu64
	       " requested=%" PRIu64 " fault_p50_us=%.1f fault_p99_us=%.1f fault_max_us=%.1f vcpu0_writes_per_s=%.0f\n",
	       st.left, st.complete_ms, st.faults, st.zero_faults, st.requested, st.fault_p50_us, st.fault_p99_us,
	       st.fault_max_us, t1 > t0 ? (double)(w1 - w0) * 1e3 / (t1 - t0) : 0.0);
	return 0;
}

/*
 * Build the guest, take a stream, resume, let it run, check it.  With lfd
 * -1, listen once the guest's memory is in place: a source that connects
 * finds the destination ready.
 */
static int destination(const struct args *a, int lfd)
{
	struct kvmdirty_mig_recv_result res;
	struct kvmdirty_mig_guest *g = NULL;
	struct testvm *tv = NULL;
	char err[512];
	int ret;

	if (!a->guest.lazy && !a->guest.data_file && !mig_testvm_prefaults(&a->guest, false))
		fprintf(stderr, "kvmdirty-migrate: -m %" PRIu64 ": more than half of the memory this process may take: "
				"faulted in as pages arrive, as with --lazy\n",
			a->guest.mib);
	ret = mig_testvm_new(&a->guest, false, &tv, err, sizeof(err));
	/* fresh memory: ZERO records for pages no stream wrote cost nothing */
	if (ret == 0)
		ret = mig_testvm_api(tv, false, &g, err, sizeof(err));
	if (ret == 0 && lfd < 0)
		lfd = ret = kvmdirty_mig_listen(a->addr, err, sizeof(err));
	if (ret < 0) {
		fprintf(stderr, "kvmdirty-migrate: destination: %s\n", err);
		kvmdirty_mig_guest_free(g);
		if (tv)
			mig_testvm_free(tv);
		return 1;
	}
	ret = take_stream(a, lfd, g, &res);
	close(lfd);
	if (ret < 0) {
		kvmdirty_mig_guest_free(g);
		mig_testvm_free(tv);
		return 1;
	}
	if (res.postcopy) {
		ret = postcopy_run(tv, g);
		kvmdirty_mig_guest_free(g);
		if (ret < 0) {
			mig_testvm_free(tv);
			return 1;
		}
		ret = mig_testvm_check_running(tv, a->run_ms, err, sizeof(err));
		goto checked;
	}
	kvmdirty_mig_guest_free(g);
	printf("destination: stream complete, every page arrived%s; resuming the guest\n",
	       res.hashed ? " and matched its hash" : " (no hashes sent)");
	printf("destination: %" PRIu64 " pages received, %" PRIu64 " of them compressed; cpu_s=%.2f\n", res.pages,
	       res.zpages, res.cpu_s);
	fflush(stdout);
	ret = mig_testvm_resume_check(tv, a->run_ms, err, sizeof(err));
checked:
	if (ret < 0)
		fprintf(stderr, "kvmdirty-migrate: destination: %s\n", err);
	else
		printf("destination: guest ran %" PRIu64 " ms after resume, %s, self-check ok\n", a->run_ms, err);
	mig_testvm_free(tv);
	return ret < 0;
}

static int cmd_listen(struct args *a)
{
	return destination(a, -1);
}

/* Build the source guest and let it run a little before it is migrated. */
static int source_guest(const struct args *a, struct testvm **ret_tv)
{
	unsigned int i, v;
	char err[256];
	int ret = mig_testvm_new(&a->guest, true, ret_tv, err, sizeof(err));

	if (ret < 0) {
		fprintf(stderr, "kvmdirty-migrate: source: %s\n", err);
		return -1;
	}
	ret = testvm_spawn(*ret_tv);
	if (ret < 0) {
		fprintf(stderr, "kvmdirty-migrate: source: starting vCPUs: %s\n", strerror(-ret));
		mig_testvm_free(*ret_tv);
		return -1;
	}
	sleep_ms(200);
	/*
	 * Steady state before the baseline: a vCPU's first pass pays for
	 * KVM's first mapping of each page (microseconds a page here).
	 */
	for (i = 0; i < 1000; i++) {
		for (v = 0; v < a->guest.vcpus && testvm_mailbox(*ret_tv, v)->pass >= 2; v++)
			;
		if (v == a->guest.vcpus)
			break;
		sleep_ms(10);
	}
	return 0;
}

/* After a failed or abandoned migration: the guest is still whole here, and running. */
static void guest_runs_on(const struct args *a, struct testvm *tv, const char *how)
{
	char err[256];

	fflush(stderr);
	if (mig_testvm_check_running(tv, a->run_ms, err, sizeof(err)) < 0)
		fprintf(stderr, "kvmdirty-migrate: source: the guest after the %s migration: %s\n", how, err);
	else
		printf("source: guest ran on here %" PRIu64 " ms after the %s migration, %s, self-check ok\n",
		       a->run_ms, how, err);
}

static int migrate_to(const struct args *a, struct testvm *tv)
{
	struct kvmdirty_mig_send_opts o = a->send;
	struct kvmdirty_mig_send_result r = { 0 }; /* read below also where it failed before it began */
	struct kvmdirty_mig_guest *g = NULL;
	char err[512];
	int ret;

	o.progress = isatty(2);
	o.psk_file = a->psk_file;
	o.control = a->ctl;
	if (a->stats) {
		o.stats = fopen(a->stats, "w");
		if (!o.stats) {
			fprintf(stderr, "kvmdirty-migrate: --stats '%s': %s\n", a->stats, strerror(errno));
			return 1;
		}
	}
	ret = mig_testvm_api(tv, true, &g, err, sizeof(err));
	if (ret < 0) {
		fprintf(stderr, "kvmdirty-migrate: source: %s\n", err);
	} else {
		ret = kvmdirty_mig_send(g, a->addr, &o, &r, err, sizeof(err));
		if (ret < 0 && r.postcopy && r.outcome == KVMDIRTY_MIG_THERE) {
			/* the guest ran at the destination: it cannot run here again */
			fprintf(stderr, "kvmdirty-migrate: post-copy failed, the guest ran at the destination and cannot run "
				"here: %s\n", err);
		} else if (ret < 0 && r.cancelled) {
			fprintf(stderr, "kvmdirty-migrate: migration cancelled, the guest runs on here: %s\n", err);
			guest_runs_on(a, tv, "cancelled");
		} else if (ret < 0 && !r.passes && !r.bytes && strstr(err, "connecting to '")) {
			/* nothing was sent: the guest never stopped running here */
			fprintf(stderr, "kvmdirty-migrate: %s\n", err);
		} else if (ret < 0) {
			fprintf(stderr, "kvmdirty-migrate: migration failed, the guest runs on here%s: %s\n",
				r.resolved ? " (resolved)" : "", err);
			guest_runs_on(a, tv, "failed");
		} else
			printf("source: migrated %.1f MiB (%" PRIu64 " pages, %" PRIu64 " zero, %" PRIu64 " of them never touched"
			       " and not read) in %" PRIu64 " passes, %.1f ms total, %.1f ms downtime, %s; wire_mib=%.1f"
			       " guest_mib=%.1f cpu_s=%.2f; %s\n",
			       r.bytes / 1048576.0, r.pages, r.zero_pages, r.untouched_pages, r.passes, r.total_ms, r.downtime_ms,
			       r.converged ? "converged" : "not converged (pass or time limit)", r.bytes / 1048576.0,
			       (double)(r.pages - r.zero_pages) * 4096 / 1048576.0, r.cpu_s,
			       o.no_verify ? "not verified (--no-verify)" : ret ? "VERIFICATION FAILED" : "verified");
		if (ret >= 0 && o.compress != KVMDIRTY_MIG_COMPRESS_OFF)
			printf("source: compression (%s): %" PRIu64 " pages went compressed, %.1f MiB in %.1f MiB on the wire"
			       " (ratio %.3f), %.2f s compressing\n",
			       o.compress == KVMDIRTY_MIG_COMPRESS_AUTO ? "auto" : "zstd", r.zpages, r.zraw_bytes / 1048576.0,
			       r.zwire_bytes / 1048576.0, r.zraw_bytes ? (double)r.zwire_bytes / (double)r.zraw_bytes : 1.0,
			       r.zcpu_s);
		if (ret >= 0 && r.postcopy)
			printf("source: post-copy (%s): %" PRIu64 " pages left at the switch, %" PRIu64 " requests answered, %"
			       PRIu64 " pages sent behind them, in %.1f ms, %" PRIu64 " recoveries; postcopy_faults=%" PRIu64
			       " fault_p50_us=%.1f fault_p99_us=%.1f switch_pause_ms=%.1f\n",
			       r.postcopy_why, r.postcopy_pages, r.postcopy_requests, r.postcopy_bulk, r.postcopy_ms,
			       r.postcopy_recoveries, r.postcopy_faults, r.fault_p50_us, r.fault_p99_us, r.switch_pause_ms);
		if (ret > 0)
			fprintf(stderr, "kvmdirty-migrate: source: %s\n", err);
	}
	kvmdirty_mig_guest_free(g);
	if (o.stats)
		fclose(o.stats);
	return ret < 0 ? (r.cancelled ? EXIT_CANCELLED : 1) : ret > 0 ? EXIT_LOST : 0;
}

static int cmd_send(struct args *a)
{
	struct testvm *tv;
	int status;

	if (source_guest(a, &tv) < 0)
		return 1;
	status = migrate_to(a, tv);
	mig_testvm_free(tv);
	return status;
}

/*
 * The destination of a migration over a Unix socket of this process's, in
 * a child: its pid, or -1 (said why).  Forked before the source's guest
 * and threads exist: no thread of ours is in the child.
 */
static pid_t fork_destination(struct args *a, char *addr, size_t len)
{
	char err[256];
	int lfd, ret;
	pid_t pid;

	snprintf(addr, len, "unix:/tmp/kvmdirty-%s-%d.sock", a->cmd, (int)getpid());
	a->addr = addr;
	lfd = kvmdirty_mig_listen(addr, err, sizeof(err));
	if (lfd < 0) {
		fprintf(stderr, "kvmdirty-migrate: %s\n", err);
		return -1;
	}
	pid = fork();
	if (pid < 0) {
		fprintf(stderr, "kvmdirty-migrate: fork: %s\n", strerror(errno));
		close(lfd);
		unlink(addr + 5);
		return -1;
	}
	if (pid == 0) {
		/*
		 * rate: a terminal's interrupt reaches the whole process group;
		 * the source cancels (or, after COMMIT, completes), and the
		 * destination must live through it to answer or to run the guest
		 */
		if (a->rate_migrate)
			signal(SIGINT, SIG_IGN);
		/* the destination's own control; --control is the source's */
		ret = control_new(a, true, NULL);
		if (ret == 0) {
			ret = destination(a, lfd);
			kvmdirty_mig_control_free(a->ctl);
		}
		fflush(stdout);
		_exit(ret ? 1 : 0);
	}
	close(lfd);
	return pid;
}

/* The sampler of rate, on a thread of its own beside a migration or on the caller's. */
struct sampler {
	struct kvmdirty_mig_rate *r;
	const struct args *a;
	_Atomic bool stop;
	int ret;
	pthread_t thread;
};

static volatile sig_atomic_t interrupted;

static void on_interrupt(int sig)
{
	(void)sig;
	interrupted = 1;
}

static void *sampler_run(void *p)
{
	struct sampler *sm = p;
	/* at most 96 bytes a vCPU, as text or JSON (rate.h) */
	size_t len = 256 + 96 * (size_t)sm->a->guest.vcpus;
	char *line = malloc(len);
	uint64_t i, waited;

	if (!line) {
		sm->ret = -ENOMEM;
		fprintf(stderr, "kvmdirty-migrate: rate: out of memory\n");
		return NULL;
	}
	for (i = 0; !sm->stop && !interrupted && (!sm->a->rate_count || i < sm->a->rate_count); i++) {
		struct kvmdirty_mig_rate_sample s;

		/* in slices: a stop or an interrupt ends the wait */
		for (waited = 0; waited < sm->a->rate_interval_ms && !sm->stop && !interrupted; waited += 10)
			sleep_ms(sm->a->rate_interval_ms - waited < 10 ? sm->a->rate_interval_ms - waited : 10);
		if (sm->stop || interrupted)
			break;
		sm->ret = kvmdirty_mig_rate_sample(sm->r, &s);
		if (sm->ret < 0) {
			fprintf(stderr, "kvmdirty-migrate: rate: counting: %s\n", strerror(-sm->ret));
			break;
		}
		kvmdirty_mig_rate_format(&s, sm->a->rate_json, line, len);
		printf("%s\n", line);
		fflush(stdout);
	}
	/* beside a migration, the lines done: an interrupt still cancels it until it ends */
	while (sm->a->rate_migrate && !sm->stop && !interrupted)
		sleep_ms(10);
	/* interrupted beside a migration still under way: cancel it (too late after COMMIT: it completes) */
	if (interrupted && !sm->stop && sm->a->rate_migrate && sm->a->ctl) {
		char err[256];

		if (kvmdirty_mig_control_cancel(sm->a->ctl, err, sizeof(err)) < 0)
			fprintf(stderr, "kvmdirty-migrate: rate: interrupted, the migration goes on: %s\n", err);
	}
	free(line);
	return NULL;
}

/*
 * rate: the test guest (send's guest options) and its dirty rate every
 * --interval, --count times; with --during-migration a migration of the
 * same guest over a Unix socket to a destination in a child runs at the
 * same time, the sampler on a thread of its own until it ends.
 */
static int cmd_rate(struct args *a)
{
	struct sampler sm = { .a = a };
	char addr[108] = "", err[256];
	struct sigaction sa = { .sa_handler = on_interrupt };
	struct kvmdirty_mig_guest *rg = NULL;
	int status = 0, wstatus, ret;
	bool migrated = false;
	struct testvm *tv;
	pid_t pid = -1;

	if (a->rate_migrate && (pid = fork_destination(a, addr, sizeof(addr))) < 0)
		return 1;
	/*
	 * After the fork: the destination keeps the default actions, so that
	 * SIGTERM ends it on the way out below.  Here an interrupt ends the
	 * sampling and cancels a migration under way as the control socket's
	 * cancel does (the guest runs on here; after COMMIT it is too late,
	 * and the migration completes).
	 */
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	ret = a->rate_migrate ? control_new(a, false, a->control) : 0;
	if (ret < 0 || source_guest(a, &tv) < 0) {
		if (pid > 0) {
			kill(pid, SIGTERM);
			waitpid(pid, NULL, 0);
			unlink(addr + 5);
		}
		kvmdirty_mig_control_free(a->ctl);
		return 1;
	}
	ret = mig_testvm_api(tv, true, &rg, err, sizeof(err));
	if (ret == 0)
		ret = kvmdirty_mig_rate_new(rg, &sm.r, err, sizeof(err));
	if (ret < 0) {
		fprintf(stderr, "kvmdirty-migrate: %s\n", err);
		status = 1;
	} else if (!a->rate_migrate) {
		sampler_run(&sm);
		status = sm.ret < 0;
	} else if (pthread_create(&sm.thread, NULL, sampler_run, &sm)) {
		fprintf(stderr, "kvmdirty-migrate: rate: cannot start the sampler's thread\n");
		status = 1;
	} else {
		migrated = true;
		status = migrate_to(a, tv);
		fflush(stdout);
		sm.stop = true;
		pthread_join(sm.thread, NULL);
	}
	kvmdirty_mig_rate_free(sm.r);
	kvmdirty_mig_guest_free(rg);
	mig_testvm_free(tv);
	if (pid > 0) {
		/*
		 * A migration that never started leaves the destination waiting:
		 * end it.  One that did, whatever its outcome, the destination
		 * ends on its own (it took that one stream; its waits are
		 * bounded), and may hold the only running guest: wait for it.
		 */
		if (!migrated)
			kill(pid, SIGTERM);
		while ((ret = waitpid(pid, &wstatus, 0)) < 0 && errno == EINTR)
			;
		if (migrated && !status && (ret < 0 || !WIFEXITED(wstatus) || WEXITSTATUS(wstatus)))
			status = 1;
		unlink(addr + 5);
	}
	kvmdirty_mig_control_free(a->ctl);
	/* a count that failed (said in its own line) once the migration's outcome is settled: it decided the above */
	if (!status && sm.ret < 0)
		status = 1;
	return status;
}

static int cmd_demo(struct args *a)
{
	char addr[108];
	int status, wstatus, ret;
	struct testvm *tv;
	pid_t pid;

	pid = fork_destination(a, addr, sizeof(addr));
	if (pid < 0)
		return 1;
	if (a->guest.rate)
		printf("demo: %" PRIu64 " MiB guest, %u vCPUs dirtying %" PRIu64 " MiB at %" PRIu64 " pages/s each, "
		       "tracked with %s, over %s\n", a->guest.mib, a->guest.vcpus, a->guest.ws_mib, a->guest.rate, a->mode,
		       addr);
	else
		printf("demo: %" PRIu64 " MiB guest, %u vCPUs dirtying %" PRIu64 " MiB flat out, tracked with %s, over %s\n",
		       a->guest.mib, a->guest.vcpus, a->guest.ws_mib, a->mode, addr);
	fflush(stdout);
	/* the source's control and --control, once the child is forked: no thread of ours is in it */
	ret = control_new(a, false, a->control);
	if (ret < 0 || source_guest(a, &tv) < 0) {
		kill(pid, SIGTERM);
		waitpid(pid, NULL, 0);
		unlink(addr + 5);
		kvmdirty_mig_control_free(a->ctl);
		return 1;
	}
	status = migrate_to(a, tv);
	fflush(stdout);
	mig_testvm_free(tv);
	kvmdirty_mig_control_free(a->ctl);
	ret = waitpid(pid, &wstatus, 0);
	unlink(addr + 5);
	if (ret < 0 || !WIFEXITED(wstatus) || WEXITSTATUS(wstatus))
		status = 1;
	printf("demo: %s\n", status ? "FAILED" : "the guest was migrated bit-exact and runs on at the destination");
	return status;
}

/*
 * snapshot: the test guest, running as send's would, snapshotted --count
 * times (snapcmd.h), then run --run-ms more and checked: whatever failed,
 * it runs on.
 */
static int cmd_snapshot(struct args *a)
{
	struct kvmdirty_mig_guest *g = NULL;
	struct testvm *tv;
	char err[256];
	int status, ret;

	if (source_guest(a, &tv) < 0)
		return 1;
	ret = mig_testvm_api(tv, true, &g, err, sizeof(err));
	if (ret < 0) {
		fprintf(stderr, "kvmdirty-migrate: snapshot: %s\n", err);
		status = 1;
	} else {
		status = mig_snap_run(g, a->snap_prefix, a->snap_every_ms, a->snap_count, !a->send.no_throttle);
	}
	kvmdirty_mig_guest_free(g);
	fflush(stdout);
	if (mig_testvm_check_running(tv, a->run_ms, err, sizeof(err)) < 0) {
		fprintf(stderr, "kvmdirty-migrate: snapshot: the guest after its snapshots: %s\n", err);
		status = 1;
	} else {
		printf("snapshot: guest ran on %" PRIu64 " ms after its snapshots, %s, self-check ok\n", a->run_ms, err);
	}
	mig_testvm_free(tv);
	return status;
}

/* The whole of a file ("-": standard input), at most MIG_PLOT_MAX_FILE + 1 bytes; NULL with errno. */
static char *slurp(const char *path, size_t *ret_len)
{
	FILE *f = strcmp(path, "-") ? fopen(path, "rb") : stdin;
	size_t len = 0, cap = 1 << 16, n;
	char *buf = NULL, *b;
	int e = 0;

	if (!f)
		return NULL;
	for (;;) {
		b = realloc(buf, cap);
		if (!b) {
			e = ENOMEM;
			break;
		}
		buf = b;
		errno = 0;
		n = fread(buf + len, 1, cap - len, f);
		len += n;
		if (len < cap || len > MIG_PLOT_MAX_FILE) {
			e = ferror(f) ? (errno ? errno : EIO) : 0;
			break;
		}
		/* one byte past the limit tells a file too long */
		cap = cap * 2 > MIG_PLOT_MAX_FILE ? (size_t)MIG_PLOT_MAX_FILE + 1 : cap * 2;
	}
	if (f != stdin)
		fclose(f);
	if (e) {
		free(buf);
		errno = e;
		return NULL;
	}
	*ret_len = len;
	return buf;
}

/* kvmdirty-migrate plot STATS [-o OUT]: 0 drawn, 1 refused or not written, 2 a bad command line. */
/* The picture written to out ("-": standard output), and what it lacked said; 0, or -errno. */
static int plot_write(struct mig_plot *p, const char *in, const char *out)
{
	FILE *f = strcmp(out, "-") ? fopen(out, "w") : stdout;
	int ret = f ? mig_plot_svg(p, in, f) : -errno;

	if (f && f != stdout && fclose(f) && ret == 0)
		ret = -errno;
	if (f == stdout && fflush(f) && ret == 0)
		ret = -errno;
	if (ret < 0) {
		fprintf(stderr, "kvmdirty-migrate: plot: writing '%s': %s\n", out, strerror(-ret));
		if (f && f != stdout)
			unlink(out);
		return ret;
	}
	if (p->cut_line)
		fprintf(stderr, "kvmdirty-migrate: plot: '%s': line %u is cut short; the picture is marked "
				"incomplete\n", in, p->cut_line);
	else if (!p->has_end)
		fprintf(stderr, "kvmdirty-migrate: plot: '%s': no end line; the picture is marked incomplete\n", in);
	if (f != stdout)
		printf("plot: %s: %zu samples, %s\n", out, p->n,
		       p->incomplete ? "incomplete" : p->converged ? "converged" : "not converged");
	return 0;
}

/* plot's IN and -o OUT (by default IN with .svg for .json; "-" for IN "-"); 0, 1 (out of memory) or 2. */
static int plot_args(int argc, char **argv, const char **in, const char **out, char **def)
{
	static const struct option longopts[] = {
		{ "output", required_argument, NULL, 'o' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	size_t len;
	int c;

	optind = 2;
	while ((c = getopt_long(argc, argv, "o:h", longopts, NULL)) != -1) {
		if (c == 'o') {
			*out = optarg;
		} else if (c == 'h') {
			usage();
			exit(0);
		} else {
			return 2;
		}
	}
	if (optind == argc) {
		fprintf(stderr, "kvmdirty-migrate: plot needs a stats file (plot STATS.json [-o OUT.svg])\n");
		return 2;
	}
	if (optind + 1 < argc) {
		fprintf(stderr, "kvmdirty-migrate: unexpected argument '%s'\n", argv[optind + 1]);
		return 2;
	}
	*in = argv[optind];
	if (!*out && strcmp(*in, "-")) {
		len = strlen(*in);
		*def = malloc(len + 5);
		if (!*def) {
			fprintf(stderr, "kvmdirty-migrate: plot: out of memory\n");
			return 1;
		}
		if (len > 5 && !strcmp(*in + len - 5, ".json"))
			len -= 5;
		snprintf(*def, len + 5, "%.*s.svg", (int)len, *in);
		*out = *def;
	}
	if (!*out)
		*out = "-";
	return 0;
}

static int cmd_plot(int argc, char **argv)
{
	const char *in = NULL, *out = NULL;
	char err[256], *buf, *def = NULL;
	struct mig_plot *p;
	size_t len;
	int ret;

	ret = plot_args(argc, argv, &in, &out, &def);
	if (ret)
		return ret;
	buf = slurp(in, &len);
	if (!buf) {
		fprintf(stderr, "kvmdirty-migrate: plot: '%s': %s\n", in, strerror(errno));
		free(def);
		return 1;
	}
	ret = mig_plot_read(buf, len, &p, err, sizeof(err));
	free(buf);
	if (ret < 0) {
		fprintf(stderr, "kvmdirty-migrate: plot: '%s': %s\n", in, ret == -ENOMEM ? "out of memory" : err);
		free(def);
		return 1;
	}
	ret = plot_write(p, in, out);
	mig_plot_free(p);
	free(def);
	return ret < 0;
}

/* --psk FILE, read before any guest is built: a bad key file costs nothing */
static int load_key(struct args *a)
{
	char err[256];

	if (a->psk_file && kvmdirty_mig_key_check(a->psk_file, err, sizeof(err)) < 0) {
		fprintf(stderr, "kvmdirty-migrate: %s\n", err);
		return -1;
	}
	return 0;
}

/* kvmdirty-migrate genkey FILE: 0 written, 1 not (one line naming FILE), 2 a bad command line. */
static int cmd_genkey(int argc, char **argv)
{
	char err[512];

	if (argc < 3) {
		fprintf(stderr, "kvmdirty-migrate: genkey needs a file to create (genkey FILE)\n");
		return 2;
	}
	if (argv[2][0] == '-') {
		fprintf(stderr, "kvmdirty-migrate: genkey takes no option: '%s' (a file of that name: ./%s)\n", argv[2],
			argv[2]);
		return 2;
	}
	if (argc > 3) {
		fprintf(stderr, "kvmdirty-migrate: unexpected argument '%s'\n", argv[3]);
		return 2;
	}
	if (kvmdirty_mig_genkey(argv[2], err, sizeof(err)) < 0) {
		fprintf(stderr, "kvmdirty-migrate: %s\n", err);
		return 1;
	}
	printf("genkey: '%s': a new key, mode 0600; give both ends a copy (--psk FILE)\n", argv[2]);
	return 0;
}

/*
 * kvmdirty-migrate probe: one line of what this host's KVM offers the
 * daemon, exit 0; where there is no usable KVM the one line that says why,
 * exit 77 (what a test harness counts as skipped).
 */
static int cmd_probe(int argc)
{
	struct kvmdirty_vm *vm;
	int64_t ring, manual;
	int ret;

	if (argc > 2) {
		fprintf(stderr, "kvmdirty-migrate: probe takes no arguments\n");
		return 2;
	}
	ret = kvmdirty_vm_new(&vm);
	if (ret < 0) {
		if (kvm_host_missing(stderr, "kvmdirty-migrate: ", ret))
			return KVM_HOST_MISSING_EXIT;
		fprintf(stderr, "kvmdirty-migrate: creating a VM: %s\n", strerror(-ret));
		return 1;
	}
	manual = kvmdirty_vm_cap(vm, KVMDIRTY_CAP_MANUAL_PROTECT);
	ring = kvmdirty_vm_cap(vm, KVMDIRTY_CAP_DIRTY_RING_ACQ_REL);
	if (ring <= 0)
		ring = kvmdirty_vm_cap(vm, KVMDIRTY_CAP_DIRTY_RING);
	printf("probe: /dev/kvm: %" PRId64 " memslots, up to %" PRId64 " vCPUs; modes: dirty-log", 
	       kvmdirty_vm_cap(vm, KVMDIRTY_CAP_NR_MEMSLOTS), kvmdirty_vm_cap(vm, KVMDIRTY_CAP_MAX_VCPUS));
	if (manual > 0)
		printf(" clear-log (manual protect flags %" PRId64 ")", manual);
	if (ring > 0)
		printf(" dirty-ring (up to %" PRId64 " entries a vCPU)", ring / 16);
	printf("\n");
	kvmdirty_vm_free(vm);
	return 0;
}

/*
 * Before a guest is built: a bad address is a mistake in the command line
 * whatever the host (exit 1, as before), and a host without KVM says so
 * in one line (exit 77).
 */
static int before_guest(const struct args *a, const char *addr)
{
	char err[256];

	if (mig_testvm_check(&a->guest, err, sizeof(err)) < 0) {
		fprintf(stderr, "kvmdirty-migrate: %s\n", err);
		return 1;
	}
	if (addr && kvmdirty_mig_addr_check(addr, err, sizeof(err)) < 0) {
		fprintf(stderr, "kvmdirty-migrate: %s\n", err);
		return 1;
	}
	return kvm_host_check("kvmdirty-migrate: ");
}

/* Run cmd with the side's control (and --control's socket) in place. */
static int with_control(struct args *a, int (*cmd)(struct args *a))
{
	int ret;

	if (control_new(a, !strcmp(a->cmd, "listen"), a->control) < 0)
		return 1;
	ret = cmd(a);
	kvmdirty_mig_control_free(a->ctl);
	a->ctl = NULL;
	return ret;
}

/*
 * Room for descriptors: a gate's handshakes take two each (a socket, an
 * io_uring), MIG_GATE_SLOTS of them, the backlog beside; the default soft
 * limit of 1024 is raised towards the hard one (at most 65536), so a
 * full house never fails for want of a descriptor.  Best effort.
 */
static void room_for_fds(void)
{
	struct rlimit r;

	if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < 65536 && r.rlim_cur < r.rlim_max) {
		r.rlim_cur = r.rlim_max < 65536 ? r.rlim_max : 65536;
		(void)setrlimit(RLIMIT_NOFILE, &r);
	}
}

/* ---- the commands ---- */

static int run_demo(int argc, char **argv, struct args *a)
{
	int ret;

	if (parse(argc, argv, a) || load_key(a))
		return 2;
	/* the demo's own defaults, where -w and --run-ms were not given */
	if (!a->ws_set)
		a->guest.ws_mib = 64;
	if (!a->run_ms_set)
		a->run_ms = 500;
	/* the one peer is the source: a stream it gave up on must not leave the destination waiting */
	a->recv.once = true;
	ret = before_guest(a, NULL);
	if (!ret)
		ret = cmd_demo(a);
	return ret;
}

static int run_rate(int argc, char **argv, struct args *a)
{
	int ret;

	if (parse(argc, argv, a) || load_key(a))
		return 2;
	/* one migration at most, from here: the destination takes the first stream */
	a->recv.once = true;
	ret = before_guest(a, NULL);
	if (!ret)
		ret = cmd_rate(a);
	return ret;
}

static int run_snapshot(int argc, char **argv, struct args *a)
{
	char err[256];
	int ret;

	if (parse(argc, argv, a))
		return 2;
	if (mig_snap_prefix_check(a->snap_prefix, err, sizeof(err)) < 0) {
		fprintf(stderr, "kvmdirty-migrate: %s\n", err);
		return 1;
	}
	ret = before_guest(a, NULL);
	return ret ? ret : cmd_snapshot(a);
}

/* listen and send: ADDR, then the options */
static int run_migration(int argc, char **argv, struct args *a)
{
	int ret;

	if (argc < 3) {
		fprintf(stderr, "kvmdirty-migrate: %s needs an address (tcp:HOST:PORT or unix:PATH)\n", a->cmd);
		return 2;
	}
	a->addr = argv[2];
	argv[2] = argv[1]; /* options start after ADDR */
	if (parse(argc - 1, argv + 1, a))
		return 2;
	if (load_key(a))
		return 2;
	ret = before_guest(a, a->addr);
	if (!ret)
		ret = with_control(a, !strcmp(a->cmd, "listen") ? cmd_listen : cmd_send);
	return ret;
}

static int run_restore(int argc, char **argv, struct args *a)
{
	return mig_snap_restore_cmd(argc, argv);
}

static int run_plot(int argc, char **argv, struct args *a)
{
	return cmd_plot(argc, argv);
}

static int run_probe(int argc, char **argv, struct args *a)
{
	return cmd_probe(argc);
}

static int run_genkey(int argc, char **argv, struct args *a)
{
	return cmd_genkey(argc, argv);
}

static int run_help(int argc, char **argv, struct args *a)
{
	usage();
	return 0;
}

static const struct command {
	const char *name;
	int (*run)(int argc, char **argv, struct args *a);
} commands[] = {
	{ "listen", run_migration }, { "send", run_migration }, { "demo", run_demo },
	{ "rate", run_rate },	     { "snapshot", run_snapshot }, { "restore", run_restore },
	{ "plot", run_plot },	     { "probe", run_probe },	   { "genkey", run_genkey },
	{ "-h", run_help },	     { "--help", run_help },
};

int main(int argc, char **argv)
{
	struct args a = { 0 };
	char err[256];
	size_t i;

	room_for_fds();
	/* pagemap kept, then not dumpable: before any thread and any key */
	if (kvmdirty_mig_protect_process(err, sizeof(err)) < 0) {
		fprintf(stderr, "kvmdirty-migrate: %s\n", err);
		return 1;
	}
	if (argc < 2) {
		usage();
		return 2;
	}
	a.cmd = argv[1];
	for (i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (!strcmp(a.cmd, commands[i].name))
			return commands[i].run(argc, argv, &a);
	fprintf(stderr, "kvmdirty-migrate: unknown command '%s' (listen, send, demo, rate, snapshot, restore, plot, probe "
			"or genkey; --help for more)\n", a.cmd);
	return 2;
}
