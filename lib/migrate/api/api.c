// SPDX-License-Identifier: MIT
/*
 * libkvmdirty-migrate's public face (include/kvmdirty-migrate.h): a VMM's
 * guest put behind the engine's guest interface (guest.h), with the whole
 * KVM state saved and loaded through the VM's and vCPUs' fds, and the
 * engine's calls (mig_send(), mig_recv_session() behind a gate,
 * mig_snap_*()) under one prefix.  Nothing here decides anything the
 * engine does not: it fills in options and translates results.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <kvmdirty-migrate.h>

#include "daemon.h"
#include "dest-postcopy.h"
#include "dest.h"
#include "gate.h"
#include "guest.h"
#include "hostmem.h"
#include "lazy.h"
#include "keyfile.h"
#include "clock.h"
#include "rate.h"
#include "snapfile.h"
#include "snapshot.h"
#include "source.h"
#include "transport.h"

#define EXPORT __attribute__((visibility("default")))

_Static_assert((int)KVMDIRTY_MIG_COMPRESS_OFF == MIG_COMPRESS_OFF && (int)KVMDIRTY_MIG_COMPRESS_AUTO == MIG_COMPRESS_AUTO &&
		       (int)KVMDIRTY_MIG_COMPRESS_ZSTD == MIG_COMPRESS_ZSTD,
	       "the header's compression modes are the engine's");
_Static_assert(KVMDIRTY_MIG_MAX_VCPUS == MIG_MAX_VCPUS, "the header's vCPU limit is the engine's");
_Static_assert(KVMDIRTY_MIG_DEVICES_MAX == MIG_DEVICES_MAX, "the header's device state limit is the engine's");
_Static_assert(KVMDIRTY_MIG_MAX_CONNS == MIG_MAX_CONNS, "the header's connections are the engine's");
_Static_assert(KVMDIRTY_MIG_MAX_MIBPS == MIG_MAX_BANDWIDTH_MIBPS, "the header's bandwidth cap is the engine's");
_Static_assert(KVMDIRTY_MIG_MAX_REGIONS == MIG_MAX_REGIONS, "the header's regions are the engine's");
_Static_assert(KVMDIRTY_MIG_SET_DOWNTIME == MIG_PARAM_DOWNTIME && KVMDIRTY_MIG_SET_MAX_PASSES == MIG_PARAM_MAX_PASSES &&
		       KVMDIRTY_MIG_SET_TIMEOUT == MIG_PARAM_TIMEOUT && KVMDIRTY_MIG_SET_MAX_MIBPS == MIG_PARAM_MAX_BANDWIDTH &&
		       KVMDIRTY_MIG_SET_THROTTLE == MIG_PARAM_THROTTLE && KVMDIRTY_MIG_SET_COMPRESS == MIG_PARAM_COMPRESS,
	       "the header's set bits are the status's");
_Static_assert(KVMDIRTY_MIG_NAME_MAX + 1 == MIG_NAME_MAX, "the header's names are the hello's");
_Static_assert(KVMDIRTY_MIG_CONTROL_PATH_MAX + 1 == sizeof(((struct mig_daemon *)0)->path),
	       "the header's control path is the daemon's");
_Static_assert(sizeof(((struct kvmdirty_mig_snap_result *)0)->path) ==
		       sizeof(((struct mig_snap_result *)0)->path),
	       "the header's snapshot path is the engine's");
struct kvmdirty_mig_guest {
	struct mig_guest g; /* first: the engine's ops get it as their ctx */
	struct mig_guest_ops ops;
	struct kvmdirty_mig_ops user;
	void *user_ctx;
	struct kvmdirty_vm *vm;
	int vcpu_fd[MIG_MAX_VCPUS];
	/* a post-copy under way into this guest (kvmdirty_mig_recv()), or NULL; under pc_lock */
	struct mig_pc *pc;
	pthread_mutex_t pc_lock;
};

struct kvmdirty_mig_snap {
	struct mig_snap *s;
};

/* kvmdirty_mig_send()'s parameters where its opts give none (a control's query shows them before) */
static const struct mig_params send_defaults = { .downtime_ms = 50, .max_passes = 10, .timeout_ms = 60000,
						 .throttle = true };

/* The parameters of send opts u, the defaults where it gives none. */
static void send_params(const struct kvmdirty_mig_send_opts *u, struct mig_params *p)
{
	p->downtime_ms = u->downtime_ms ? u->downtime_ms : send_defaults.downtime_ms;
	p->max_passes = u->max_passes ? u->max_passes : send_defaults.max_passes;
	p->timeout_ms = u->timeout_ms ? u->timeout_ms : send_defaults.timeout_ms;
	p->max_bandwidth = u->max_mibps;
	p->throttle = !u->no_throttle;
	p->compress = (int)u->compress;
}

/* The daemon's status and control socket (daemon.h), its lines to the caller's log. */
struct kvmdirty_mig_control {
	struct mig_daemon d;
	void (*log)(void *ctx, const char *line);
	void *log_ctx;
	/*
	 * The first line said while it is made (__atomic making): the reason
	 * it could not be.  Said by kvmdirty_mig_control_new()'s thread
	 * before the socket's thread exists, or by that thread alone (the
	 * engine has no use of the control yet).
	 */
	bool making;
	char first[256];
	/*
	 * __atomic: a kvmdirty_mig_send() or _recv() uses it, from its first
	 * check to its return; another call on it is refused -EBUSY at once
	 */
	bool busy;
};

/* The control for one call: false (it is another's) or true, its until control_release(). */
static bool control_take(struct kvmdirty_mig_control *c)
{
	bool idle = false;

	return __atomic_compare_exchange_n(&c->busy, &idle, true, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

static void control_release(struct kvmdirty_mig_control *c)
{
	__atomic_store_n(&c->busy, false, __ATOMIC_RELEASE);
}

/* The engine's outcome as the header says it (PENDING: nothing left here, as THERE for a destination). */
static enum kvmdirty_mig_outcome outcome(enum mig_outcome o, bool source)
{
	switch (o) {
	case MIG_OUTCOME_HERE:
		return KVMDIRTY_MIG_HERE;
	case MIG_OUTCOME_THERE:
		return KVMDIRTY_MIG_THERE;
	case MIG_OUTCOME_UNKNOWN:
		return KVMDIRTY_MIG_UNKNOWN;
	default:
		return source ? KVMDIRTY_MIG_HERE : KVMDIRTY_MIG_THERE;
	}
}

static void say(char *err, size_t len, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void say(char *err, size_t len, const char *fmt, ...)
{
	va_list ap;

	if (!err || !len)
		return;
	va_start(ap, fmt);
	vsnprintf(err, len, fmt, ap);
	va_end(ap);
}

static int g_vcpu_save(void *ctx, unsigned int i, struct mig_vcpu_state *st)
{
	struct kvmdirty_mig_guest *mg = ctx;

	return mig_vcpu_save_kvm(mg->vcpu_fd[i], st);
}

static int g_vcpu_load(void *ctx, unsigned int i, const struct mig_vcpu_state *st)
{
	struct kvmdirty_mig_guest *mg = ctx;

	return mig_vcpu_load_kvm(mg->vcpu_fd[i], st);
}

static int g_vm_save(void *ctx, struct mig_vm_state *st)
{
	struct kvmdirty_mig_guest *mg = ctx;

	return mig_vm_save_kvm(kvmdirty_vm_fd(mg->vm), st);
}

static int g_vm_load(void *ctx, const struct mig_vm_state *st)
{
	struct kvmdirty_mig_guest *mg = ctx;

	return mig_vm_load_kvm(kvmdirty_vm_fd(mg->vm), st);
}

static int g_devices_save(void *ctx, void **ret_state, size_t *ret_len)
{
	struct kvmdirty_mig_guest *mg = ctx;

	return mg->user.devices_save(mg->user_ctx, ret_state, ret_len);
}

static int g_devices_load(void *ctx, const void *state, size_t len)
{
	struct kvmdirty_mig_guest *mg = ctx;

	return mg->user.devices_load(mg->user_ctx, state, len);
}

static int g_devices_save_live(void *ctx, void **ret_state, size_t *ret_len)
{
	struct kvmdirty_mig_guest *mg = ctx;

	return mg->user.devices_save_live(mg->user_ctx, ret_state, ret_len);
}

static int g_devices_load_live(void *ctx, const void *state, size_t len)
{
	struct kvmdirty_mig_guest *mg = ctx;

	return mg->user.devices_load_live(mg->user_ctx, state, len);
}

static void g_pause(void *ctx)
{
	struct kvmdirty_mig_guest *mg = ctx;

	mg->user.pause(mg->user_ctx);
}

static void g_resume(void *ctx)
{
	struct kvmdirty_mig_guest *mg = ctx;

	mg->user.resume(mg->user_ctx);
}

static uint64_t g_progress(void *ctx, unsigned int i)
{
	struct kvmdirty_mig_guest *mg = ctx;

	return mg->user.progress(mg->user_ctx, i);
}

static int g_set_run_share(void *ctx, unsigned int i, unsigned int permille)
{
	struct kvmdirty_mig_guest *mg = ctx;

	return mg->user.set_run_share(mg->user_ctx, i, permille);
}

static uint64_t g_kept_out_ns(void *ctx, unsigned int i)
{
	struct kvmdirty_mig_guest *mg = ctx;

	return mg->user.kept_out_ns(mg->user_ctx, i);
}

EXPORT int kvmdirty_mig_guest_new(struct kvmdirty_vm *vm, struct kvmdirty_tracker *tracker,
				  struct kvmdirty_vcpu *const *vcpus, unsigned int nr_vcpus, uint32_t flags,
				  const struct kvmdirty_mig_ops *ops, void *ctx, struct kvmdirty_mig_guest **ret_guest)
{
	struct kvmdirty_mig_guest *mg;
	unsigned int i;
	int ret;

	if (!ret_guest)
		return -EINVAL;
	*ret_guest = NULL;
	if (!vm || !vcpus || !nr_vcpus || nr_vcpus > MIG_MAX_VCPUS || (flags & ~KVMDIRTY_MIG_FRESH))
		return -EINVAL;
	for (i = 0; i < nr_vcpus; i++)
		if (!vcpus[i] || kvmdirty_vcpu_fd(vcpus[i]) < 0)
			return -EINVAL;
	/* pause and resume come together, as do a run share and the time kept out */
	if (ops && (!ops->pause != !ops->resume || !ops->devices_save != !ops->devices_load ||
		    !ops->devices_save_live != !ops->devices_load_live || !ops->set_run_share != !ops->kept_out_ns))
		return -EINVAL;
	mg = calloc(1, sizeof(*mg));
	if (!mg)
		return -ENOMEM; /* guest_new takes no err: its errnos say it all */
	if (ops)
		mg->user = *ops;
	mg->user_ctx = ctx;
	mg->vm = vm;
	pthread_mutex_init(&mg->pc_lock, NULL);
	mg->ops = (struct mig_guest_ops){ .vcpu_save = g_vcpu_save, .vcpu_load = g_vcpu_load,
					  .vm_save = g_vm_save, .vm_load = g_vm_load };
	if (mg->user.devices_save) {
		mg->ops.devices_save = g_devices_save;
		mg->ops.devices_load = g_devices_load;
	}
	if (mg->user.devices_save_live) {
		mg->ops.devices_save_live = g_devices_save_live;
		mg->ops.devices_load_live = g_devices_load_live;
	}
	if (mg->user.pause) {
		mg->ops.pause = g_pause;
		mg->ops.resume = g_resume;
	}
	if (mg->user.progress)
		mg->ops.progress = g_progress;
	if (mg->user.set_run_share) {
		mg->ops.set_run_share = g_set_run_share;
		mg->ops.kept_out_ns = g_kept_out_ns;
	}
	mg->g.nr_vcpus = nr_vcpus;
	mg->g.tracker = tracker;
	mg->g.ops = &mg->ops;
	mg->g.ctx = mg;
	for (i = 0; i < nr_vcpus; i++) {
		mg->g.vcpu[i] = vcpus[i];
		mg->vcpu_fd[i] = kvmdirty_vcpu_fd(vcpus[i]);
	}
	ret = mig_guest_set_regions(&mg->g, vm);
	if (ret == 0 && (flags & KVMDIRTY_MIG_FRESH))
		ret = mig_guest_zero_known(&mg->g);
	if (ret < 0) {
		kvmdirty_mig_guest_free(mg);
		return ret;
	}
	*ret_guest = mg;
	return 0;
}

EXPORT void kvmdirty_mig_guest_free(struct kvmdirty_mig_guest *guest)
{
	if (!guest)
		return;
	mig_pc_free(guest->pc);
	pthread_mutex_destroy(&guest->pc_lock);
	mig_guest_release(&guest->g);
	free(guest);
}

/* The control's lines: to the caller's log; while it is made, the first kept as the reason. */
static void control_log(void *ctx, const char *line)
{
	struct kvmdirty_mig_control *c = ctx;

	if (__atomic_load_n(&c->making, __ATOMIC_ACQUIRE)) {
		/* the reason it cannot be made: kvmdirty_mig_control_new()'s err, the path first */
		if (!c->first[0])
			snprintf(c->first, sizeof(c->first), "%s",
				 strncmp(line, "--control: ", 11) ? line : line + 11);
		return;
	}
	if (c->log)
		c->log(c->log_ctx, line);
}

EXPORT int kvmdirty_mig_control_new(const struct kvmdirty_mig_control_opts *opts,
				    struct kvmdirty_mig_control **ret_ctl, char *err, size_t len)
{
	struct kvmdirty_mig_control *c;
	size_t n;
	int ret;

	if (!ret_ctl) {
		say(err, len, "kvmdirty_mig_control_new: ret_ctl is NULL");
		return -EINVAL;
	}
	*ret_ctl = NULL;
	if (!opts) {
		say(err, len, "kvmdirty_mig_control_new: opts is NULL");
		return -EINVAL;
	}
	n = opts->path ? strlen(opts->path) : 1;
	if (!n || n >= sizeof(((struct mig_daemon *)0)->path)) {
		say(err, len, "control socket '%s': a path of 1 to %zu bytes", opts->path,
		    sizeof(((struct mig_daemon *)0)->path) - 1);
		return -EINVAL;
	}
	c = calloc(1, sizeof(*c));
	if (!c) {
		say(err, len, "control: out of memory");
		return -ENOMEM;
	}
	c->log = opts->log;
	c->log_ctx = opts->log_ctx;
	c->making = true;
	/* a source's parameters stay its send opts' (the status takes them as each migration begins) */
	ret = mig_daemon_init(&c->d, opts->destination, opts->path, NULL, control_log, c);
	if (ret < 0) {
		say(err, len, "%s", c->first);
		free(c);
		return ret;
	}
	__atomic_store_n(&c->making, false, __ATOMIC_RELEASE);
	/* shown by a query before the first migration, which takes its own opts' but for what a set names */
	if (!opts->destination) {
		struct mig_params p = send_defaults;

		if (opts->send_opts)
			send_params(opts->send_opts, &p);
		mig_status_show_params(&c->d.st, &p);
	}
	c->d.no_default = !opts->socket_on_unknown;
	*ret_ctl = c;
	return 0;
}

EXPORT enum kvmdirty_mig_outcome kvmdirty_mig_control_outcome(struct kvmdirty_mig_control *ctl)
{
	enum mig_outcome o = mig_status_outcome(&ctl->d.st);

	return o == MIG_OUTCOME_PENDING ? KVMDIRTY_MIG_PENDING : outcome(o, !ctl->d.st.dest);
}

EXPORT int kvmdirty_mig_control_query(struct kvmdirty_mig_control *ctl, char *buf, size_t len)
{
	int ret;

	if (!ctl || !buf || !len)
		return !ctl ? -EINVAL : -ENOSPC;
	ret = mig_status_query(&ctl->d.st, buf, len);
	return ret < 0 ? ret : (int)strlen(buf);
}

EXPORT int kvmdirty_mig_control_resolve(struct kvmdirty_mig_control *ctl, bool run_here, char *err, size_t len)
{
	char why[256] = "";
	int ret;

	if (!ctl) {
		say(err, len, "kvmdirty_mig_control_resolve: the control is NULL");
		return -EINVAL;
	}
	ret = mig_status_resolve(&ctl->d.st, run_here, why, sizeof(why));
	say(err, len, "%s", why);
	return ret;
}

EXPORT int kvmdirty_mig_control_set(struct kvmdirty_mig_control *ctl, const struct kvmdirty_mig_params *p,
				    unsigned int mask, char *err, size_t len)
{
	const unsigned int all = KVMDIRTY_MIG_SET_DOWNTIME | KVMDIRTY_MIG_SET_MAX_PASSES | KVMDIRTY_MIG_SET_TIMEOUT |
				 KVMDIRTY_MIG_SET_MAX_MIBPS | KVMDIRTY_MIG_SET_THROTTLE | KVMDIRTY_MIG_SET_COMPRESS;
	struct mig_params mp;
	char why[256] = "";
	int ret;

	if (!ctl || !p || !mask || (mask & ~all)) {
		say(err, len, "kvmdirty_mig_control_set: %s", !ctl ? "the control is NULL" : !p ? "p is NULL" :
							      !mask ? "no parameter named (mask 0)" : "unknown bits in mask");
		return -EINVAL;
	}
	if (ctl->d.st.dest) {
		say(err, len, "kvmdirty_mig_control_set: the parameters are the source's: this control is a destination's");
		return -EOPNOTSUPP;
	}
	mp = (struct mig_params){ .downtime_ms = p->downtime_ms, .max_passes = p->max_passes, .timeout_ms = p->timeout_ms,
				  .max_bandwidth = p->max_mibps, .throttle = p->throttle, .compress = p->compress };
	ret = mig_status_set(&ctl->d.st, &mp, mask, why, sizeof(why));
	if (ret < 0)
		say(err, len, "%s", why);
	return ret;
}

EXPORT int kvmdirty_mig_control_cancel(struct kvmdirty_mig_control *ctl, char *err, size_t len)
{
	char why[256] = "";
	int ret;

	if (!ctl) {
		say(err, len, "kvmdirty_mig_control_cancel: the control is NULL");
		return -EINVAL;
	}
	ret = mig_status_cancel(&ctl->d.st, why, sizeof(why));
	say(err, len, "%s", why);
	return ret;
}

EXPORT int kvmdirty_mig_control_postcopy_start(struct kvmdirty_mig_control *ctl, char *err, size_t len)
{
	char why[256] = "";
	int ret;

	if (!ctl) {
		say(err, len, "kvmdirty_mig_control_postcopy_start: the control is NULL");
		return -EINVAL;
	}
	ret = mig_status_postcopy_start(&ctl->d.st, why, sizeof(why));
	say(err, len, "%s", why);
	return ret;
}

EXPORT void kvmdirty_mig_control_free(struct kvmdirty_mig_control *ctl)
{
	if (!ctl)
		return;
	mig_daemon_fini(&ctl->d);
	free(ctl);
}

/* Hashing on threads of their own pays only where the host has CPUs to spare. */
static bool inline_hash(void)
{
	return sysconf(_SC_NPROCESSORS_ONLN) <= 2;
}

static int load_psk(const char *path, struct mig_psk *psk, char *err, size_t len)
{
	char why[256];
	int ret;

	if (!path)
		return 0;
	ret = mig_psk_load(path, psk, why, sizeof(why));
	if (ret < 0)
		say(err, len, "%s", why);
	return ret;
}

struct send_ctx {
	const char *addr;
	uint64_t timeout_ms;
	struct mig_status *st; /* the control's: a post-copy's recover may name another address */
};

/* A session's next connection (a post-copy recovery's: at the address a recover gave, where one did). */
static int connect_again(void *ctx, char *err, size_t len)
{
	const struct send_ctx *c = ctx;
	char addr[256] = "";

	if (c->st)
		mig_status_recover_addr(c->st, addr, sizeof(addr));
	return mig_connect(addr[0] ? addr : c->addr, c->timeout_ms, err, len);
}

/* What kvmdirty_mig_send() refuses before it loads a key or dials: 0, or -EINVAL with err. */
static int send_check(struct kvmdirty_mig_guest *guest, const char *addr, const struct kvmdirty_mig_send_opts *u,
		      char *err, size_t len)
{
	char why[256] = "";
	int ret;

	if (!guest || !addr) {
		say(err, len, "kvmdirty_mig_send: %s is NULL", !guest ? "the guest" : "the address");
		return -EINVAL;
	}
	if (!guest->g.tracker || !guest->ops.pause) {
		say(err, len, "kvmdirty_mig_send: the guest has no %s: it cannot be a source",
		    !guest->g.tracker ? "tracker" : "pause and resume");
		return -EINVAL;
	}
	if ((unsigned int)u->compress > KVMDIRTY_MIG_COMPRESS_ZSTD) {
		say(err, len, "kvmdirty_mig_send: compress %u: not a KVMDIRTY_MIG_COMPRESS_ value", (unsigned int)u->compress);
		return -EINVAL;
	}
	if (u->connections > MIG_MAX_CONNS || u->max_mibps > MIG_MAX_BANDWIDTH_MIBPS) {
		say(err, len, "kvmdirty_mig_send: %s %llu: at most %llu",
		    u->connections > MIG_MAX_CONNS ? "connections" : "max_mibps",
		    u->connections > MIG_MAX_CONNS ? (unsigned long long)u->connections
						   : (unsigned long long)u->max_mibps,
		    u->connections > MIG_MAX_CONNS ? (unsigned long long)MIG_MAX_CONNS
						   : (unsigned long long)MIG_MAX_BANDWIDTH_MIBPS);
		return -EINVAL;
	}
	if (u->control && u->control->d.st.dest) {
		say(err, len, "kvmdirty_mig_send: the control is a destination's");
		return -EINVAL;
	}
	ret = mig_addr_check(addr, why, sizeof(why));
	if (ret < 0)
		say(err, len, "%s", why);
	return ret;
}

/* The engine's options from the caller's (psk: the key loaded, or NULL; c: the joins' dialler's context). */
static void send_opts_of(const struct kvmdirty_mig_send_opts *u, const struct mig_psk *psk, struct send_ctx *c,
			 struct mig_send_opts *o)
{
	struct mig_params p;

	send_params(u, &p);
	*o = (struct mig_send_opts){ .downtime_ms = p.downtime_ms,
				     .max_passes = (unsigned int)p.max_passes,
				     .timeout_ms = p.timeout_ms,
				     .peer_timeout_ms = u->peer_timeout_ms ? u->peer_timeout_ms : 30000,
				     .verify = !u->no_verify,
				     .inline_hash = inline_hash(),
				     .throttle = p.throttle,
				     .force_switchover = u->force_switchover,
				     .max_bandwidth = p.max_bandwidth,
				     .event = u->event,
				     .event_ctx = u->event_ctx,
				     .psk = psk,
				     .encrypt = u->encrypt,
				     .wipe_psk = true,
				     .peer_name = u->peer_name,
				     .connections = u->connections ? u->connections : 1,
				     .stats = u->stats,
				     .progress = u->progress,
				     .baseline_ms = u->baseline_ms,
				     .connect = connect_again,
				     .connect_ctx = c,
				     .postcopy = u->postcopy,
				     .postcopy_after = u->postcopy_after,
				     .recover_ms = u->postcopy_recover_ms,
				     .compress = (enum mig_compress)u->compress };
	c->timeout_ms = o->peer_timeout_ms;
	c->st = u->control ? &u->control->d.st : NULL;
	if (u->control) {
		o->status = &u->control->d.st;
		o->unknown = mig_daemon_unknown;
		o->unknown_ctx = &u->control->d;
	}
}

/* The engine's result as the header says it. */
static void send_result(const struct mig_result *r, struct kvmdirty_mig_send_result *res)
{
	*res = (struct kvmdirty_mig_send_result){ .outcome = outcome(r->outcome, true),
						  .total_ms = r->total_ms,
						  .downtime_ms = r->downtime_ms,
						  .bytes = r->bytes,
						  .passes = r->passes,
						  .pages = r->pages,
						  .zero_pages = r->zero_pages,
						  .converged = r->converged,
						  .lost_pages = r->lost_pages,
						  .untouched_pages = r->untouched_pages,
						  .verified_pages = r->verified_pages,
						  .cancelled = r->cancelled,
						  .resolved = r->resolved,
						  .throttled = r->throttled,
						  .reason = r->reason ? r->reason : "failed",
						  .postcopy = r->postcopy,
						  .postcopy_why = r->postcopy_why,
						  .postcopy_pages = r->postcopy_pages,
						  .postcopy_requests = r->postcopy_requests,
						  .postcopy_bulk = r->postcopy_bulk,
						  .switch_pause_ms = r->switch_pause_ms,
						  .postcopy_ms = r->postcopy_ms,
						  .postcopy_faults = r->postcopy_faults,
						  .fault_p50_us = r->fault_p50_us,
						  .fault_p99_us = r->fault_p99_us,
						  .postcopy_recoveries = r->postcopy_recoveries,
						  .zpages = r->zpages,
						  .zraw_bytes = r->zraw_bytes,
						  .zwire_bytes = r->zwire_bytes,
						  .zcpu_s = r->zcpu_s,
						  .cpu_s = r->cpu_s };
}

EXPORT int kvmdirty_mig_send(struct kvmdirty_mig_guest *guest, const char *addr,
			     const struct kvmdirty_mig_send_opts *opts, struct kvmdirty_mig_send_result *res, char *err,
			     size_t len)
{
	static const struct kvmdirty_mig_send_opts none;
	const struct kvmdirty_mig_send_opts *u = opts ? opts : &none;
	struct kvmdirty_mig_control *ctl = u->control && !u->control->d.st.dest ? u->control : NULL;
	struct mig_result r = { .outcome = MIG_OUTCOME_HERE };
	struct send_ctx c = { .addr = addr };
	struct mig_send_opts o;
	struct mig_psk psk;
	char why[512] = "";
	int fd, ret;

	if (res)
		*res = (struct kvmdirty_mig_send_result){ .outcome = KVMDIRTY_MIG_HERE };
	/*
	 * With a control: the call's from here to its return (another on it
	 * refused at once), its status made fresh if its last migration
	 * ended, so that a cancel from now on is this call's
	 */
	if (ctl && (!control_take(ctl) || (mig_status_prepare(&ctl->d.st) < 0 && (control_release(ctl), true)))) {
		say(err, len, "kvmdirty_mig_send: the control is another migration's, under way");
		return -EBUSY;
	}
	ret = send_check(guest, addr, u, err, len);
	if (ret == 0 && mig_lazy_busy(&guest->g)) {
		say(err, len, "kvmdirty_mig_send: the guest's memory is under a lazy restore, not resident yet");
		ret = -EBUSY;
	}
	if (ret == 0)
		ret = load_psk(u->psk_file, &psk, err, len);
	if (ret < 0) {
		/* refused before a dial: a cancel asked for this call ends with it */
		if (ctl) {
			mig_status_abandon(&ctl->d.st, "refused before it began: the guest runs here");
			control_release(ctl);
		}
		return ret;
	}
	send_opts_of(u, u->psk_file ? &psk : NULL, &c, &o);
	fd = mig_connect(addr, o.peer_timeout_ms, why, sizeof(why));
	if (fd < 0 && ctl && mig_status_abandon(&ctl->d.st, why)) {
		/* a cancel asked while it dialled: the dial's failure ends it as the cancel */
		ret = -ECANCELED;
		r.cancelled = true;
		r.reason = "cancelled";
		snprintf(why, sizeof(why), "cancelled before it began: the guest runs here");
	} else if (fd < 0) {
		ret = fd;
	} else {
		ret = mig_send(&guest->g, fd, &o, &r, why, sizeof(why));
		close(fd);
	}
	if (ctl) {
		/* a migration that never began (the engine refused it first) ends here, its cancel with it */
		mig_status_abandon(&ctl->d.st, why);
		control_release(ctl);
	}
	if (u->psk_file)
		mig_psk_clear(&psk);
	say(err, len, "%s", why);
	if (res)
		send_result(&r, res);
	return ret;
}

EXPORT int kvmdirty_mig_listen(const char *addr, char *err, size_t len)
{
	char why[256] = "";
	int ret;

	if (!addr) {
		say(err, len, "kvmdirty_mig_listen: the address is NULL");
		return -EINVAL;
	}
	ret = mig_listen(addr, why, sizeof(why));
	if (ret < 0)
		say(err, len, "%s", why);
	return ret;
}

EXPORT int kvmdirty_mig_recv(struct kvmdirty_mig_guest *guest, int listen_fd, const struct kvmdirty_mig_recv_opts *opts,
			     struct kvmdirty_mig_recv_result *res, char *err, size_t len)
{
	static const struct kvmdirty_mig_recv_opts none;
	const struct kvmdirty_mig_recv_opts *u = opts ? opts : &none;
	struct mig_recv_result r = { .outcome = MIG_OUTCOME_THERE };
	struct mig_recv_opts o = { 0 };
	struct mig_session_opts so;
	struct mig_gate *gate;
	struct mig_session s;
	struct mig_psk psk;
	char why[512] = "";
	int ret;

	if (res)
		*res = (struct kvmdirty_mig_recv_result){ .outcome = KVMDIRTY_MIG_THERE };
	if (!guest || listen_fd < 0) {
		say(err, len, "kvmdirty_mig_recv: %s", !guest ? "the guest is NULL" : "no listening socket");
		return -EINVAL;
	}
	if (u->control && !u->control->d.st.dest) {
		say(err, len, "kvmdirty_mig_recv: the control is a source's");
		return -EINVAL;
	}
	if (u->control && !control_take(u->control)) {
		say(err, len, "kvmdirty_mig_recv: the control is another stream's, under way");
		return -EBUSY;
	}
	ret = load_psk(u->psk_file, &psk, err, len);
	if (ret < 0) {
		if (u->control)
			control_release(u->control);
		return ret;
	}
	o.timeout_ms = u->timeout_ms ? u->timeout_ms : 30000;
	o.deadline_ms = u->deadline_ms;
	o.inline_hash = inline_hash();
	o.psk = u->psk_file ? &psk : NULL;
	o.encrypt = u->encrypt;
	o.name = u->name;
	o.log = u->log;
	o.log_ctx = u->log_ctx;
	o.postcopy = u->postcopy;
	if (u->postcopy && !guest->ops.pause) {
		say(err, len, "kvmdirty_mig_recv: post-copy needs the guest's pause (ops.pause)");
		if (u->control)
			control_release(u->control);
		if (u->psk_file)
			mig_psk_clear(&psk);
		return -EINVAL;
	}
	/* a post-copy before this one, complete (or the guest would not be taken again): done with */
	pthread_mutex_lock(&guest->pc_lock);
	mig_pc_free(guest->pc);
	guest->pc = NULL;
	pthread_mutex_unlock(&guest->pc_lock);
	if (u->control) {
		o.status = &u->control->d.st;
		o.unknown = mig_daemon_unknown;
		o.unknown_ctx = &u->control->d;
	}
	mig_recv_session_opts(&o, &so);
	ret = mig_gate_new(listen_fd, &so, &gate);
	if (ret < 0) {
		snprintf(why, sizeof(why), "kvmdirty_mig_recv: fd %d: %s%s", listen_fd, strerror(-ret),
			 ret == -ENOTSOCK || ret == -EPROTOTYPE ? " (a listening stream socket is needed)" : "");
	} else {
		for (;;) {
			char line[600];

			ret = mig_gate_take(gate, &s, why, sizeof(why));
			if (ret < 0)
				break;
			ret = mig_recv_session(&guest->g, &s, &o, &r, why, sizeof(why));
			/* run the guest; or nothing may land right any more; or the caller takes the first's fate */
			if (ret == 0 || ret == -ENOTRECOVERABLE || ret == -EINPROGRESS || (u->once && ret != -EACCES))
				break;
			if (u->log) {
				snprintf(line, sizeof(line), "%s, waiting for another: %s",
					 ret == -ECANCELED ? "dropped at the handoff" : "stream refused", why);
				u->log(u->log_ctx, line);
			}
		}
		mig_gate_free(gate);
	}
	/* no stream taken (refused, dropped, or none came): the guest does not run here */
	if (u->control && ret < 0 && mig_status_outcome(&u->control->d.st) == MIG_OUTCOME_PENDING)
		mig_status_decide(&u->control->d.st, MIG_OUTCOME_THERE, "no stream taken: the guest does not run here");
	if (u->control)
		control_release(u->control);
	say(err, len, "%s", why);
	if (r.pc) {
		/* a lost connection is recovered through the same listening socket (a copy of it) */
		int lfd = fcntl(listen_fd, F_DUPFD_CLOEXEC, 0);

		if (lfd < 0 || mig_pc_listen(r.pc, lfd, &so, u->psk_file ? &psk : NULL) < 0) {
			if (lfd >= 0)
				close(lfd);
			if (u->log)
				u->log(u->log_ctx, "post-copy: no recovery listener (a lost connection cannot be recovered)");
		}
		pthread_mutex_lock(&guest->pc_lock);
		guest->pc = r.pc;
		pthread_mutex_unlock(&guest->pc_lock);
	}
	if (u->psk_file)
		mig_psk_clear(&psk);
	if (res)
		*res = (struct kvmdirty_mig_recv_result){ .outcome = outcome(r.outcome, false),
							  .postcopy = r.pc != NULL,
							  .hashed = r.hashed,
							  .pages = r.pages,
							  .records = r.records,
							  .zpages = r.zpages,
							  .cpu_s = r.cpu_s };
	return ret;
}

EXPORT int kvmdirty_mig_postcopy_wait(struct kvmdirty_mig_guest *guest, int timeout_ms,
				      struct kvmdirty_mig_postcopy_stats *st, char *err, size_t len)
{
	struct mig_pc_stats s;
	char why[300] = "";
	int ret;

	if (st)
		memset(st, 0, sizeof(*st));
	if (!guest) {
		say(err, len, "kvmdirty_mig_postcopy_wait: the guest is NULL");
		return -EINVAL;
	}
	pthread_mutex_lock(&guest->pc_lock);
	if (!guest->pc) {
		pthread_mutex_unlock(&guest->pc_lock);
		say(err, len, "kvmdirty_mig_postcopy_wait: no post-copy into this guest");
		return -ENOENT;
	}
	pthread_mutex_unlock(&guest->pc_lock);
	/* the post-copy stays until the guest is freed or takes another stream: neither may come meanwhile */
	ret = mig_pc_wait(guest->pc, timeout_ms, why, sizeof(why));
	if (st) {
		mig_pc_get_stats(guest->pc, &s);
		*st = (struct kvmdirty_mig_postcopy_stats){ .complete = s.complete, .failed = s.failed, .paused = s.paused,
							    .left = s.left, .missing = s.missing, .faults = s.faults,
							    .zero_faults = s.zero_faults, .requested = s.requested,
							    .placed = s.placed, .complete_ms = s.complete_ms,
							    .fault_p50_us = s.fault_p50_us, .fault_p99_us = s.fault_p99_us,
							    .fault_max_us = s.fault_max_us };
		snprintf(st->why, sizeof(st->why), "%s", s.why);
	}
	say(err, len, "%s", why);
	return ret;
}

EXPORT int kvmdirty_mig_snap_new(struct kvmdirty_mig_guest *guest, const struct kvmdirty_mig_snap_opts *opts,
				 struct kvmdirty_mig_snap **ret_snap, char *err, size_t len)
{
	struct mig_snap_opts o = { 0 };
	struct kvmdirty_mig_snap *ks;
	char why[512] = "";
	int ret;

	if (ret_snap)
		*ret_snap = NULL;
	if (!ret_snap || !guest || !opts || !opts->prefix) {
		say(err, len, "kvmdirty_mig_snap_new: %s is NULL",
		    !ret_snap ? "ret_snap" : !guest ? "the guest" : !opts ? "opts" : "the prefix");
		return -EINVAL;
	}
	if (mig_lazy_busy(&guest->g)) {
		say(err, len, "kvmdirty_mig_snap_new: the guest's memory is under a lazy restore, not resident yet");
		return -EBUSY;
	}
	if (!guest->g.tracker || !guest->ops.pause) {
		say(err, len, "kvmdirty_mig_snap_new: the guest has no %s: it cannot be snapshotted",
		    !guest->g.tracker ? "tracker" : "pause and resume");
		return -EINVAL;
	}
	if (strlen(opts->prefix) + 32 > SNAP_PATH_MAX) {
		say(err, len, "kvmdirty_mig_snap_new: prefix '%.64s...': longer than %d bytes", opts->prefix,
		    SNAP_PATH_MAX - 32);
		return -ENAMETOOLONG;
	}
	ks = calloc(1, sizeof(*ks));
	if (!ks) {
		say(err, len, "kvmdirty_mig_snap_new: out of memory");
		return -ENOMEM;
	}
	o.prefix = opts->prefix;
	o.pause_ms = opts->pause_ms;
	o.max_passes = opts->max_passes;
	o.no_throttle = opts->no_throttle;
	ret = mig_snap_new(&guest->g, &o, &ks->s, why, sizeof(why));
	if (ret < 0) {
		say(err, len, "%s", why);
		free(ks);
		return ret;
	}
	*ret_snap = ks;
	return 0;
}

EXPORT int kvmdirty_mig_snap_take(struct kvmdirty_mig_snap *snap, struct kvmdirty_mig_snap_result *res, char *err,
				  size_t len)
{
	struct mig_snap_result r;
	char why[512] = "";
	int ret;

	if (res)
		memset(res, 0, sizeof(*res));
	if (!snap) {
		say(err, len, "kvmdirty_mig_snap_take: the series is NULL");
		return -EINVAL;
	}
	memset(&r, 0, sizeof(r));
	ret = mig_snap_take(snap->s, &r, why, sizeof(why));
	if (ret < 0)
		say(err, len, "%s", why);
	if (res) {
		memset(res, 0, sizeof(*res));
		res->seq = r.seq;
		memcpy(res->path, r.path, sizeof(res->path));
		res->pause_ms = r.pause_ms;
		res->total_ms = r.total_ms;
		res->pages = r.pages;
		res->file_len = r.file_len;
		res->passes = r.passes;
		res->bytes = r.bytes;
		res->pause_pages = r.pause_pages;
		res->data_pages = r.data_pages;
		res->zero_pages = r.zero_pages;
		res->write_ms = r.write_ms;
		res->pause_stop_ms = r.pause_stop_ms;
		res->pause_sync_ms = r.pause_sync_ms;
		res->pause_write_ms = r.pause_write_ms;
		res->pause_vcpu_ms = r.pause_vcpu_ms;
		res->fsync_ms = r.fsync_ms;
		res->dirty_pps = r.dirty_pps;
		res->throttle_permille = r.throttle_permille;
	}
	return ret;
}

EXPORT void kvmdirty_mig_snap_free(struct kvmdirty_mig_snap *snap)
{
	if (!snap)
		return;
	mig_snap_free(snap->s);
	free(snap);
}

static void close_chain(struct snap_file **files, unsigned int n);
static int open_chain(const char *const *paths, unsigned int n, struct snap_file ***ret_files, char *err,
		      size_t len);

EXPORT int kvmdirty_mig_restore(struct kvmdirty_mig_guest *guest, const char *const *paths, unsigned int n,
				uint64_t *ret_pages, char *err, size_t len)
{
	struct snap_file **files;
	char why[512] = "";
	uint64_t pages = 0;
	int ret;

	if (ret_pages)
		*ret_pages = 0;
	if (!guest) {
		say(err, len, "kvmdirty_mig_restore: the guest is NULL");
		return -EINVAL;
	}
	ret = open_chain(paths, n, &files, why, sizeof(why));
	if (ret == 0) {
		ret = mig_snap_restore(&guest->g, files, n, &pages, why, sizeof(why));
		close_chain(files, n);
	}
	if (ret < 0)
		say(err, len, "%s%s", ret == -EINVAL && !n ? "kvmdirty_mig_restore: " : "", why);
	else if (ret_pages)
		*ret_pages = pages;
	return ret;
}

struct kvmdirty_mig_lazy {
	struct mig_lazy *lz;
	struct kvmdirty_mig_lazy_opts o;
};

_Static_assert(sizeof(((struct kvmdirty_mig_lazy_stats *)0)->hist) ==
		       sizeof(((struct mig_lazy_stats *)0)->hist), "the histogram's buckets");
_Static_assert((int)KVMDIRTY_MIG_LAZY_RESIDENT == (int)MIG_LAZY_RESIDENT &&
		       (int)KVMDIRTY_MIG_LAZY_FAILED == (int)MIG_LAZY_FAILED, "the lazy restore's events");

static void lazy_event(void *ctx, enum mig_lazy_event ev, const char *line)
{
	struct kvmdirty_mig_lazy *l = ctx;

	if (l->o.event)
		l->o.event(l->o.ctx, (enum kvmdirty_mig_lazy_event)ev, line);
}

EXPORT int kvmdirty_mig_restore_lazy(struct kvmdirty_mig_guest *guest, const char *const *paths, unsigned int n,
				     const struct kvmdirty_mig_lazy_opts *opts, struct kvmdirty_mig_lazy **ret_lazy,
				     char *err, size_t len)
{
	struct mig_lazy_opts o = { .t0_ms = mig_clock_msf() };
	struct kvmdirty_mig_lazy *l;
	struct snap_file **files;
	char why[768] = "";
	int ret;

	if (!ret_lazy) {
		say(err, len, "kvmdirty_mig_restore_lazy: ret_lazy is NULL");
		return -EINVAL;
	}
	*ret_lazy = NULL;
	if (!guest) {
		say(err, len, "kvmdirty_mig_restore_lazy: the guest is NULL");
		return -EINVAL;
	}
	l = calloc(1, sizeof(*l));
	if (!l) {
		say(err, len, "out of memory");
		return -ENOMEM;
	}
	if (opts)
		l->o = *opts;
	o.ws_read = l->o.workset_read;
	o.ws_write = l->o.workset_write;
	o.no_fill = l->o.no_fill;
	o.event = lazy_event;
	o.ctx = l;
	ret = open_chain(paths, n, &files, why, sizeof(why));
	if (ret == 0) {
		ret = mig_lazy_start(&guest->g, files, n, &o, &l->lz, why, sizeof(why));
		if (ret < 0)
			close_chain(files, n); /* else the files and their array are the restore's now */
	}
	if (ret < 0) {
		say(err, len, "%s", why);
		free(l);
		return ret;
	}
	*ret_lazy = l;
	return 0;
}

EXPORT int kvmdirty_mig_lazy_wait(struct kvmdirty_mig_lazy *lazy, int timeout_ms, char *err, size_t len)
{
	if (!lazy) {
		say(err, len, "kvmdirty_mig_lazy_wait: NULL");
		return -EINVAL;
	}
	return mig_lazy_wait(lazy->lz, timeout_ms, err, len);
}

EXPORT void kvmdirty_mig_lazy_stats(struct kvmdirty_mig_lazy *lazy, struct kvmdirty_mig_lazy_stats *ret)
{
	struct mig_lazy_stats st;

	memset(ret, 0, sizeof(*ret));
	if (!lazy)
		return;
	mig_lazy_get_stats(lazy->lz, &st);
	ret->first_instruction_ms = st.first_ms;
	ret->resident_ms = st.resident_ms;
	ret->resident = st.resident;
	ret->failed = st.failed;
	ret->faults = st.faults;
	ret->zero_faults = st.zero_faults;
	ret->raced = st.raced;
	ret->filled = st.filled;
	ret->around = st.around;
	ret->prefetched = st.prefetched;
	ret->workset_pages = st.ws_pages;
	snprintf(ret->ws_note, sizeof(ret->ws_note), "%s", st.ws_note);
	ret->data_pages = st.data_pages;
	ret->fault_p50_us = st.fault_p50_us;
	ret->fault_p99_us = st.fault_p99_us;
	ret->fault_max_us = st.fault_max_us;
	memcpy(ret->hist, st.hist, sizeof(ret->hist));
}

EXPORT double kvmdirty_mig_lazy_bucket_us(unsigned int i)
{
	return mig_lazy_bucket_us(i);
}

EXPORT void kvmdirty_mig_lazy_free(struct kvmdirty_mig_lazy *lazy)
{
	if (!lazy)
		return;
	mig_lazy_free(lazy->lz);
	free(lazy);
}

/* Close what open_chain() opened (NULL entries: never opened). */
static void close_chain(struct snap_file **files, unsigned int n)
{
	unsigned int i;

	for (i = 0; i < n; i++)
		if (files[i])
			snap_file_close(files[i]);
	free(files);
}

/* Open paths[0 .. n) and check them as a chain: 0 with *ret_files (the caller closes them), or -errno said. */
static int open_chain(const char *const *paths, unsigned int n, struct snap_file ***ret_files, char *err,
		      size_t len)
{
	struct snap_file **files;
	unsigned int i;
	int ret = 0;

	*ret_files = NULL;
	if (!paths || !n) {
		say(err, len, "no snapshot file");
		return -EINVAL;
	}
	for (i = 0; i < n; i++)
		if (!paths[i]) {
			say(err, len, "file %u of the chain is NULL", i);
			return -EINVAL;
		}
	files = calloc(n, sizeof(*files));
	if (!files) {
		say(err, len, "out of memory");
		return -ENOMEM;
	}
	for (i = 0; i < n && ret == 0; i++)
		ret = snap_file_open(paths[i], &files[i], err, len);
	if (ret == 0)
		ret = snap_chain_check(files, n, err, len);
	if (ret < 0) {
		close_chain(files, n);
		return ret;
	}
	*ret_files = files;
	return 0;
}

EXPORT int kvmdirty_mig_snap_check(const char *const *paths, unsigned int n, char *err, size_t len)
{
	struct snap_file **files;
	char why[512] = "";
	int ret = open_chain(paths, n, &files, why, sizeof(why));

	if (ret < 0) {
		say(err, len, "%s", why);
		return ret;
	}
	close_chain(files, n);
	return 0;
}

EXPORT int kvmdirty_mig_verify(const char *const *paths, unsigned int n, uint64_t *ret_pages, char *err,
			       size_t len)
{
	struct snap_file **files;
	char why[512] = "";
	uint64_t pages = 0;
	int ret;

	if (ret_pages)
		*ret_pages = 0;
	ret = open_chain(paths, n, &files, why, sizeof(why));
	if (ret == 0) {
		ret = snap_chain_verify(files, n, &pages, why, sizeof(why));
		close_chain(files, n);
	}
	if (ret < 0)
		say(err, len, "%s", why); /* it names the file, or the call's argument */
	else if (ret_pages)
		*ret_pages = pages;
	return ret;
}

EXPORT int kvmdirty_mig_snap_info(const char *path, struct kvmdirty_mig_snap_info *ret,
				  struct kvmdirty_mig_snap_region *regions, unsigned int max_regions, char *err,
				  size_t len)
{
	struct snap_file *f;
	char why[512] = "";
	unsigned int i;
	int r;

	if (!path || !ret || (!regions && max_regions)) {
		say(err, len, "kvmdirty_mig_snap_info: %s is NULL", !path ? "the path" : !ret ? "ret" : "regions");
		return -EINVAL;
	}
	memset(ret, 0, sizeof(*ret));
	r = snap_file_open(path, &f, why, sizeof(why));
	if (r < 0) {
		say(err, len, "%s", why);
		return r;
	}
	ret->seq = f->h.seq;
	ret->nr_vcpus = f->h.nr_vcpus;
	ret->nr_regions = f->h.nr_regions;
	for (i = 0; i < f->h.nr_regions && i < max_regions; i++)
		regions[i] = (struct kvmdirty_mig_snap_region){ .gpa = f->regions[i].gpa, .size = f->regions[i].size };
	snap_file_close(f);
	return 0;
}

EXPORT int kvmdirty_mig_genkey(const char *path, char *err, size_t len)
{
	char why[512] = "";
	int ret;

	if (!path) {
		say(err, len, "kvmdirty_mig_genkey: the path is NULL");
		return -EINVAL;
	}
	ret = mig_psk_generate(path, why, sizeof(why));
	if (ret < 0)
		say(err, len, "%s", why);
	return ret;
}

struct kvmdirty_mig_rate {
	struct mig_rate *r;
};

EXPORT int kvmdirty_mig_key_check(const char *path, char *err, size_t len)
{
	struct mig_psk psk;
	int ret;

	if (!path) {
		say(err, len, "kvmdirty_mig_key_check: the path is NULL");
		return -EINVAL;
	}
	ret = load_psk(path, &psk, err, len);
	mig_psk_clear(&psk);
	return ret;
}

EXPORT int kvmdirty_mig_addr_check(const char *addr, char *err, size_t len)
{
	char why[256] = "";
	int ret;

	if (!addr) {
		say(err, len, "kvmdirty_mig_addr_check: the address is NULL");
		return -EINVAL;
	}
	ret = mig_addr_check(addr, why, sizeof(why));
	if (ret < 0)
		say(err, len, "%s", why);
	return ret;
}

EXPORT int kvmdirty_mig_protect_process(char *err, size_t len)
{
	char why[256] = "";
	int ret;

	(void)mig_pagemap_keep(); /* where it cannot be kept, the engine opens it as before */
	ret = mig_psk_protect_process(why, sizeof(why));
	if (ret < 0)
		say(err, len, "%s", why);
	return ret;
}

EXPORT int kvmdirty_mig_rate_new(struct kvmdirty_mig_guest *guest, struct kvmdirty_mig_rate **ret_rate, char *err,
				 size_t len)
{
	struct kvmdirty_mig_rate *kr;
	char why[512] = "";
	int ret;

	if (!ret_rate || !guest || !guest->g.tracker) {
		say(err, len, "kvmdirty_mig_rate_new: %s", !ret_rate ? "ret_rate is NULL" : !guest ? "the guest is NULL"
											   : "the guest has no tracker");
		return -EINVAL;
	}
	*ret_rate = NULL;
	kr = calloc(1, sizeof(*kr));
	if (!kr) {
		say(err, len, "kvmdirty_mig_rate_new: out of memory");
		return -ENOMEM;
	}
	ret = mig_rate_new(guest->g.tracker, guest->g.vcpu, guest->g.nr_vcpus, &kr->r, why, sizeof(why));
	if (ret < 0) {
		say(err, len, "%s", why);
		free(kr);
		return ret;
	}
	*ret_rate = kr;
	return 0;
}

EXPORT int kvmdirty_mig_rate_sample(struct kvmdirty_mig_rate *rate, struct kvmdirty_mig_rate_sample *ret_sample)
{
	struct mig_rate_sample s;
	int ret;

	if (!rate || !ret_sample)
		return -EINVAL;
	ret = mig_rate_sample(rate->r, &s);
	if (ret < 0)
		return ret;
	*ret_sample = (struct kvmdirty_mig_rate_sample){ .t_ms = s.t_ms,
							  .ns = s.ns,
							  .pages = s.pages,
							  .pages_per_s = s.pages_per_s,
							  .by_ring = s.by_ring,
							  .nr_vcpus = s.nr_vcpus,
							  .vcpu_pages_per_s = s.vcpu_pages_per_s };
	return 0;
}

EXPORT void kvmdirty_mig_rate_format(const struct kvmdirty_mig_rate_sample *sample, bool json, char *buf,
				     size_t len)
{
	struct mig_rate_sample s;

	if (!buf || !len)
		return;
	if (!sample) {
		buf[0] = 0;
		return;
	}
	s = (struct mig_rate_sample){ .t_ms = sample->t_ms,
				      .ns = sample->ns,
				      .pages = sample->pages,
				      .pages_per_s = sample->pages_per_s,
				      .by_ring = sample->by_ring,
				      .nr_vcpus = sample->nr_vcpus,
				      .vcpu_pages_per_s = sample->vcpu_pages_per_s };
	mig_rate_format(&s, json, buf, len);
}

EXPORT void kvmdirty_mig_rate_free(struct kvmdirty_mig_rate *rate)
{
	if (!rate)
		return;
	mig_rate_free(rate->r);
	free(rate);
}

EXPORT const char *kvmdirty_mig_version_string(void)
{
	return KVMDIRTY_MIGRATE_VERSION;
}

EXPORT unsigned int kvmdirty_mig_stream_version(void)
{
	return MIG_VERSION;
}
