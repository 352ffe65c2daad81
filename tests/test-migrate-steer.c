// SPDX-License-Identifier: MIT
/*
 * Steering running migrations (source.h, status.h), each judged by what
 * arrives and by the guest's memory: every parameter changed in the middle
 * of a pass, with its effect (a lower downtime limit makes more passes,
 * fewer passes or a shorter time end pre-copy sooner, a cap bounds what
 * each later pass sends, the throttle engages once set on and lets go once
 * set off); a cancel in each phase (before the first pass, mid-pass, in
 * stop-and-copy, after READY) leaves the guest running here, with another
 * consumer of its tracker given every write, and the next migration of the
 * same guest to the same destination exact; a cancel after COMMIT is
 * refused and the migration completes; a migration that fails (its peer
 * cuts the stream) leaves another consumer given every write, in each
 * mode; events in order for a migration
 * that converges, one that does not and one cancelled, the same on the
 * engine's callback and its fd; and the daemon: cancelled through its
 * control socket (exit status 4) with a subscriber that never reads.
 * Every change is made from the engine's own event callback, so that it
 * lands in the phase meant whatever the host's speed.
 */
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "control-client.h"
#include "json.h"
#include "kvm-skip.h"
#include "migrate-spawn.h"
#include "source.h"
#include "stream.h"

#define MIB (1ull << 20)
#define MAX_EVENTS 512

/* ---- the engine's events, recorded, and the change a case makes at one of them ---- */

enum action { ACT_NONE, ACT_SET, ACT_CANCEL };

static struct {
	pthread_mutex_t lock;
	struct mig_status *st;
	/* what came, in order */
	char name[MAX_EVENTS][24];
	int pass[MAX_EVENTS];
	uint64_t bytes[MAX_EVENTS];
	double ms[MAX_EVENTS];
	char why[MAX_EVENTS][48]; /* data.why, or data.reason */
	int n;
	/* the trigger: at event `on` (of pass on_pass, 0: any), do act */
	const char *on;
	int on_pass;
	enum action act;
	struct mig_params p;
	unsigned int mask;
	bool acted;
	int act_ret;
	char act_err[256];
} ev = { .lock = PTHREAD_MUTEX_INITIALIZER };

static void act(void)
{
	if (ev.act == ACT_SET)
		ev.act_ret = mig_status_set(ev.st, &ev.p, ev.mask, ev.act_err, sizeof(ev.act_err));
	else if (ev.act == ACT_CANCEL)
		ev.act_ret = mig_status_cancel(ev.st, ev.act_err, sizeof(ev.act_err));
	ev.acted = true;
}

static double data_num(const struct mig_json *data, const char *key)
{
	const struct mig_json *v = mig_json_get(data, key);

	return v && v->type == MIG_JSON_NUMBER ? v->num : -1;
}

static void on_event(void *ctx, const char *line)
{
	const struct mig_json *name, *data, *why;
	struct mig_json_error e;
	struct mig_json v;
	int i;

	ck_assert_ptr_eq(ctx, &ev);
	ck_assert_msg(mig_json_parse(line, strlen(line), &v, &e) == 0, "an event that is not JSON: %s", line);
	name = mig_json_get(&v, "event");
	data = mig_json_get(&v, "data");
	ck_assert(name && name->type == MIG_JSON_STRING && data && data->type == MIG_JSON_OBJECT);
	pthread_mutex_lock(&ev.lock);
	ck_assert_int_lt(ev.n, MAX_EVENTS);
	i = ev.n++;
	snprintf(ev.name[i], sizeof(ev.name[i]), "%s", name->str.s);
	ev.pass[i] = (int)data_num(data, "pass");
	ev.bytes[i] = (uint64_t)data_num(data, "bytes");
	ev.ms[i] = data_num(data, "ms");
	why = mig_json_get(data, "why");
	if (!why)
		why = mig_json_get(data, "reason");
	snprintf(ev.why[i], sizeof(ev.why[i]), "%s", why && why->type == MIG_JSON_STRING ? why->str.s : "");
	if (!ev.acted && ev.on && !strcmp(ev.on, ev.name[i]) && (!ev.on_pass || ev.on_pass == ev.pass[i]))
		act();
	pthread_mutex_unlock(&ev.lock);
	mig_json_free(&v);
}

static void ev_reset(struct mig_status *st, const char *on, int on_pass, enum action a)
{
	pthread_mutex_lock(&ev.lock);
	ev.st = st;
	ev.n = 0;
	ev.on = on;
	ev.on_pass = on_pass;
	ev.act = a;
	ev.mask = 0;
	ev.acted = false;
	ev.act_ret = 1;
	ev.act_err[0] = 0;
	pthread_mutex_unlock(&ev.lock);
}

/* The events' names, but the throttle's (they come when the host's speed has them come), as one string. */
static void ev_names(char *buf, size_t len, bool throttle_too)
{
	size_t k = 0;
	int i;

	buf[0] = 0;
	pthread_mutex_lock(&ev.lock);
	for (i = 0; i < ev.n && k < len; i++)
		if (throttle_too || strncmp(ev.name[i], "throttle_", 9))
			k += (size_t)snprintf(buf + k, len - k, "%s%s", k ? " " : "", ev.name[i]);
	pthread_mutex_unlock(&ev.lock);
}

static int ev_find(const char *name, int from)
{
	int i;

	for (i = from; i < ev.n; i++)
		if (!strcmp(ev.name[i], name))
			return i;
	return -1;
}

/* ---- the source, the destination, one migration ---- */

static const struct mig_send_opts base_opts = {
	.downtime_ms = 3600000, .max_passes = 4, .timeout_ms = 600000, .peer_timeout_ms = 60000, .verify = true,
	.force_switchover = true, .throttle = false, .event = on_event, .event_ctx = &ev,
};

static struct mig_testvm_opts guest_opts(enum kvmdirty_mode mode)
{
	return (struct mig_testvm_opts){ .mib = 16, .vcpus = 2, .mode = mode, .ws_mib = 4 };
}

struct rig {
	struct mig_testvm_opts go;
	struct testvm *tv;
	struct mig_guest g;
	char addr[128];
	pid_t listener;
	struct mig_status st;
};

static void rig_up(struct rig *r, enum kvmdirty_mode mode)
{
	r->go = guest_opts(mode);
	r->tv = running_source(&r->go, &r->g);
	make_addr("unix", r->addr, sizeof(r->addr));
	r->listener = spawn_listener(r->addr, &r->go, "60000");
	mig_status_init(&r->st, false);
}

static int migrate(struct rig *r, struct mig_send_opts *o, struct mig_result *res, char *err, size_t len)
{
	int fd = connect_retry(r->addr, r->listener, err, len), ret;

	ck_assert_msg(fd >= 0, "%s", err);
	o->status = &r->st;
	ret = mig_send(&r->g, fd, o, res, err, len);
	close(fd);
	return ret;
}

/* The listener took a stream and ran the guest it brought, checked (exit 0). */
static void rig_down(struct rig *r, bool moved)
{
	if (!moved)
		kill(r->listener, SIGTERM);
	ck_assert_int_eq(child_status(r->listener), moved ? 0 : 128 + SIGTERM);
	drop_addr(r->addr);
	mig_status_destroy(&r->st);
	mig_guest_release(&r->g);
	mig_testvm_free(r->tv);
}

static void expect_moved(int ret, const struct mig_result *res, const char *err)
{
	ck_assert_msg(ret == 0, "the migration failed: %d (%s)", ret, err);
	ck_assert_int_eq(res->outcome, MIG_OUTCOME_THERE);
	ck_assert_uint_eq(res->lost_pages, 0);
	ck_assert_uint_gt(res->verified_pages, 0);
}

/* ---- parameters ---- */

START_TEST(lower_downtime_makes_more_passes)
{
	struct mig_send_opts o = base_opts;
	struct mig_result res;
	struct rig r;
	char err[512];
	int ret;

	rig_up(&r, KVMDIRTY_MODE_CLEAR_LOG);
	ev_reset(&r.st, "pass_started", 1, _i ? ACT_SET : ACT_NONE);
	ev.p.downtime_ms = 0;
	ev.mask = MIG_PARAM_DOWNTIME;
	ret = migrate(&r, &o, &res, err, sizeof(err));
	expect_moved(ret, &res, err);
	if (!_i) {
		/* an hour's downtime fits after the first pass */
		ck_assert_uint_eq(res.passes, 1);
		ck_assert_str_eq(res.reason, "fits_downtime");
	} else {
		/* nothing fits none: every pass allowed is made */
		ck_assert_int_eq(ev.act_ret, 0);
		ck_assert_uint_eq(res.passes, 4);
		ck_assert_str_eq(res.reason, "pass_limit");
	}
	rig_down(&r, true);
}
END_TEST

/* Fewer passes, or a time limit already past, set in pass 1: pre-copy ends after it. */
START_TEST(lower_limits_end_precopy)
{
	struct mig_send_opts o = base_opts;
	struct mig_result res;
	struct rig r;
	char err[512];
	int ret;

	rig_up(&r, KVMDIRTY_MODE_CLEAR_LOG);
	o.downtime_ms = 0;
	o.max_passes = 50;
	ev_reset(&r.st, "pass_started", 1, ACT_SET);
	if (_i == 0) {
		ev.p.max_passes = 2;
		ev.mask = MIG_PARAM_MAX_PASSES;
	} else {
		ev.p.timeout_ms = 1;
		ev.mask = MIG_PARAM_TIMEOUT;
	}
	ret = migrate(&r, &o, &res, err, sizeof(err));
	expect_moved(ret, &res, err);
	ck_assert_int_eq(ev.act_ret, 0);
	ck_assert_uint_eq(res.passes, _i == 0 ? 2 : 1);
	ck_assert_str_eq(res.reason, _i == 0 ? "pass_limit" : "time_limit");
	rig_down(&r, true);
}
END_TEST

/*
 * A cap set in pass 1 (taken at the next sample): every later pass sends
 * at most what the cap lets through in its time, a batch and the pacer's
 * credit besides.  An upper bound only: a slow host sends less, never
 * more.  The estimate takes the capped rate for the link's.
 */
START_TEST(cap_bounds_later_passes)
{
	const uint64_t cap_mib = 4;
	struct mig_send_opts o = base_opts;
	struct mig_result res;
	struct rig r;
	char err[512];
	int ret, i, later = 0;

	rig_up(&r, KVMDIRTY_MODE_CLEAR_LOG);
	o.downtime_ms = 0;
	o.max_passes = 3;
	ev_reset(&r.st, "pass_started", 1, ACT_SET);
	ev.p.max_bandwidth = cap_mib;
	ev.mask = MIG_PARAM_MAX_BANDWIDTH;
	ret = migrate(&r, &o, &res, err, sizeof(err));
	expect_moved(ret, &res, err);
	ck_assert_uint_eq(res.passes, 3);
	for (i = 0; i < ev.n; i++) {
		double allowed;

		if (strcmp(ev.name[i], "pass_ended") || ev.pass[i] < 2)
			continue;
		allowed = (double)(cap_mib * MIB) * ev.ms[i] / 1e3 + 1.0 * MIB;
		printf("cap %" PRIu64 " MiB/s: pass %d sent %.2f MiB in %.0f ms (%.2f MiB/s)\n", cap_mib, ev.pass[i],
		       ev.bytes[i] / (double)MIB, ev.ms[i], ev.bytes[i] / (double)MIB / (ev.ms[i] / 1e3));
		ck_assert_msg(ev.bytes[i] <= allowed, "pass %d sent %" PRIu64 " bytes in %.0f ms, over the cap's %.0f",
			      ev.pass[i], ev.bytes[i], ev.ms[i], allowed);
		later++;
	}
	ck_assert_int_eq(later, 2);
	ck_assert_msg(res.link_bytes_per_s <= (double)(cap_mib * MIB), "the estimate's link %.0f B/s is over the cap",
		      res.link_bytes_per_s);
	rig_down(&r, true);
}
END_TEST

/*
 * The throttle (DIRTY_RING: per-vCPU dirty limits), on a link held to
 * 4 MiB/s so that the guest re-dirties more than a third of it: set on in
 * pass 1, it engages; on from the start, set off once it engaged, it is
 * released at once, and never engages again.
 */
START_TEST(throttle_set_on_and_off)
{
	struct mig_send_opts o = base_opts;
	struct mig_result res;
	struct rig r;
	char err[512], names[4096];
	int ret, engaged, released;

	rig_up(&r, KVMDIRTY_MODE_DIRTY_RING);
	o.downtime_ms = 0;
	o.max_passes = 3;
	o.max_bandwidth = 4;
	o.throttle = _i == 1;
	ev_reset(&r.st, _i == 0 ? "pass_started" : "throttle_engaged", _i == 0 ? 1 : 0, ACT_SET);
	ev.p.throttle = _i == 0;
	ev.mask = MIG_PARAM_THROTTLE;
	ret = migrate(&r, &o, &res, err, sizeof(err));
	expect_moved(ret, &res, err);
	ev_names(names, sizeof(names), true);
	engaged = ev_find("throttle_engaged", 0);
	ck_assert_msg(engaged >= 0, "the throttle never engaged: %s", names);
	ck_assert(res.throttled);
	if (_i == 1) {
		released = ev_find("throttle_released", engaged);
		ck_assert_msg(released > engaged, "not released after it was set off: %s", names);
		ck_assert_str_eq(ev.why[released], "set throttle false");
		ck_assert_int_eq(ev_find("throttle_engaged", released), -1);
	}
	printf("throttle %s: %s\n", _i == 0 ? "set on" : "set off", names);
	rig_down(&r, true);
}
END_TEST

/* ---- cancel ---- */

/* Another consumer of the guest's tracker (a snapshot, a rate sampler): its own copy of memory. */
struct sampler {
	struct kvmdirty_consumer *c;
	uint8_t *copy[4]; /* the test guest has two regions */
};

static void sampler_take(struct sampler *sm, const struct mig_guest *g)
{
	struct kvmdirty_range rg[64];
	unsigned int i, k;
	int n;

	ck_assert_int_ge(kvmdirty_consumer_sync(sm->c), 0);
	while ((n = kvmdirty_consumer_next(sm->c, rg, 64, 0)) > 0)
		for (k = 0; k < (unsigned int)n; k++)
			for (i = 0; i < g->nr_regions; i++)
				if (rg[k].gpa >= g->regions[i].gpa && rg[k].gpa < g->regions[i].gpa + g->regions[i].size)
					memcpy(sm->copy[i] + (rg[k].gpa - g->regions[i].gpa), rg[k].hva,
					       rg[k].npages * MIG_PAGE_SIZE);
	ck_assert_int_eq(n, 0);
	ck_assert_int_ge(kvmdirty_consumer_commit(sm->c), 0);
}

static void sampler_start(struct sampler *sm, const struct mig_guest *g)
{
	unsigned int i;

	/* tracking on before the migration: the migration does not turn it off after */
	ck_assert_ok(kvmdirty_tracker_start(g->tracker, NULL));
	ck_assert_ok(kvmdirty_consumer_new(g->tracker, 0, &sm->c));
	ck_assert_uint_le(g->nr_regions, sizeof(sm->copy) / sizeof(sm->copy[0]));
	for (i = 0; i < g->nr_regions; i++) {
		sm->copy[i] = malloc(g->regions[i].size);
		ck_assert_ptr_nonnull(sm->copy[i]);
	}
	sampler_take(sm, g);
}

/* The guest paused: the sampler's copy, brought up to date, is memory. */
static void sampler_check(struct sampler *sm, const struct mig_guest *g)
{
	unsigned int i;
	uint64_t p;

	g->ops->pause(g->ctx);
	sampler_take(sm, g);
	for (i = 0; i < g->nr_regions; i++)
		for (p = 0; p < g->regions[i].size / MIG_PAGE_SIZE; p++)
			ck_assert_msg(!memcmp(sm->copy[i] + p * MIG_PAGE_SIZE, (uint8_t *)g->regions[i].hva + p * MIG_PAGE_SIZE,
					      MIG_PAGE_SIZE),
				      "the sampler missed a write to region %u page %" PRIu64 " after the migration ended", i, p);
	g->ops->resume(g->ctx);
}

static void sampler_free(struct sampler *sm, const struct mig_guest *g)
{
	unsigned int i;

	kvmdirty_consumer_free(sm->c);
	for (i = 0; i < g->nr_regions; i++)
		free(sm->copy[i]);
}

/* Phases: where the cancel lands. */
enum phase { BEFORE_FIRST_PASS, MID_PASS, STOP_AND_COPY, AFTER_READY, AFTER_COMMIT };
static const char *const phase_name[] = { "before the first pass", "mid-pass", "in stop-and-copy",
					  "after READY", "after COMMIT" };

/* The guest's ops with a cancel at the first progress read (the baseline, after the session) or at the pause. */
static const struct mig_guest_ops *real_ops;
static struct mig_guest_ops cancel_ops;

static uint64_t progress_then_cancel(void *ctx, unsigned int i)
{
	pthread_mutex_lock(&ev.lock);
	if (!ev.acted)
		act();
	pthread_mutex_unlock(&ev.lock);
	return real_ops->progress(ctx, i);
}

static void pause_then_cancel(void *ctx)
{
	real_ops->pause(ctx);
	pthread_mutex_lock(&ev.lock);
	if (!ev.acted)
		act();
	pthread_mutex_unlock(&ev.lock);
}

/* The guest runs: each vCPU's progress grows (as long as it takes; the test's timeout bounds it). */
static void expect_running(struct testvm *tv, unsigned int vcpus)
{
	uint64_t before[2];
	unsigned int i;

	for (i = 0; i < vcpus; i++)
		before[i] = mig_testvm_progress(tv, i);
	for (i = 0; i < vcpus; i++)
		while (mig_testvm_progress(tv, i) == before[i])
			usleep(1000);
}

START_TEST(cancel_in_each_phase)
{
	enum phase ph = (enum phase)_i;
	struct mig_send_opts o = base_opts;
	struct mig_result res;
	struct sampler sm;
	char err[512], names[4096];
	struct rig r;
	int ret;

	rig_up(&r, KVMDIRTY_MODE_CLEAR_LOG);
	sampler_start(&sm, &r.g);
	o.downtime_ms = ph == MID_PASS ? 0 : o.downtime_ms;
	o.max_passes = ph == MID_PASS ? 5 : 2;
	real_ops = r.g.ops;
	cancel_ops = *r.g.ops;
	if (ph == BEFORE_FIRST_PASS)
		cancel_ops.progress = progress_then_cancel;
	if (ph == STOP_AND_COPY)
		cancel_ops.pause = pause_then_cancel;
	r.g.ops = &cancel_ops;
	ev_reset(&r.st, ph == MID_PASS ? "pass_started" : ph == AFTER_READY ? "ready" : ph == AFTER_COMMIT ? "commit" : NULL,
		 ph == MID_PASS ? 2 : 0, ACT_CANCEL);
	ret = migrate(&r, &o, &res, err, sizeof(err));
	r.g.ops = real_ops;
	ev_names(names, sizeof(names), false);
	printf("cancel %s: %d (%s); events: %s\n", phase_name[ph], ret, err, names);
	ck_assert(ev.acted);
	if (ph == AFTER_COMMIT) {
		ck_assert_int_eq(ev.act_ret, -EALREADY);
		ck_assert_msg(strstr(ev.act_err, "COMMIT was sent"), "%s", ev.act_err);
		expect_moved(ret, &res, err);
		ck_assert(!res.cancelled);
		ck_assert_str_eq(names, "pass_started pass_ended switchover ready commit completed");
		sampler_free(&sm, &r.g);
		rig_down(&r, true);
		return;
	}
	ck_assert_int_eq(ev.act_ret, 0);
	ck_assert_msg(ret == -ECANCELED, "%d: %s", ret, err);
	ck_assert(res.cancelled);
	ck_assert_int_eq(res.outcome, MIG_OUTCOME_HERE);
	ck_assert_str_eq(res.reason, "cancelled");
	ck_assert_msg(strstr(err, "cancelled"), "%s", err);
	/* an hour's downtime fits after one pass; mid-pass, none does */
	ck_assert_str_eq(names, ph == BEFORE_FIRST_PASS ? "cancelled" :
				ph == MID_PASS ? "pass_started pass_ended pass_started cancelled" :
				ph == STOP_AND_COPY ? "pass_started pass_ended switchover resumed cancelled" :
						      "pass_started pass_ended switchover ready resumed cancelled");
	/* the status says it was done */
	{
		char q[16384];

		ck_assert_int_eq(mig_status_query(&r.st, q, sizeof(q)), 0);
		ck_assert_msg(strstr(q, "\"cancel\":\"done\"") && strstr(q, "\"outcome\":\"here\""), "%s", q);
	}
	/* the guest runs on here, and the other consumer of its log lost nothing */
	expect_running(r.tv, r.go.vcpus);
	sampler_check(&sm, &r.g);
	/* the destination dropped the stream and takes the next: the same guest, all of it again, exact */
	ev_reset(&r.st, NULL, 0, ACT_NONE);
	o = base_opts;
	ret = migrate(&r, &o, &res, err, sizeof(err));
	expect_moved(ret, &res, err);
	ck_assert(!res.cancelled);
	sampler_free(&sm, &r.g);
	rig_down(&r, true);
}
END_TEST

/*
 * A cancel while the engine waits on its peer ends the wait at once, not
 * at its timeout (an hour here): a destination that takes nothing (the
 * send blocked mid-stream; the stream is cut), and one that takes the
 * whole stream and never answers (the wait for READY; the source then
 * says ABORT, the last message it writes).  The cancel comes from the
 * test's thread once the engine is past the event named.
 */
struct peer {
	int fd;
	bool read_all; /* read and drop everything (else never read) */
	uint8_t last[sizeof(struct mig_ack)];
	size_t got;
	pthread_t thread;
};

static void *sink_peer(void *p)
{
	struct peer *pe = p;
	uint8_t buf[65536];
	ssize_t k;

	while (pe->read_all && (k = read(pe->fd, buf, sizeof(buf))) > 0) {
		size_t n = (size_t)k, keep = sizeof(pe->last);

		/* the last message's bytes: what came last on the connection */
		if (n >= keep) {
			memcpy(pe->last, buf + n - keep, keep);
		} else {
			memmove(pe->last, pe->last + n, keep - n);
			memcpy(pe->last + keep - n, buf, n);
		}
		pe->got += n;
	}
	return NULL;
}

static struct {
	pthread_mutex_t lock;
	pthread_cond_t cond;
	const char *wait_for;
	bool seen;
} gate = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

static void note_event(void *ctx, const char *line)
{
	char want[64];

	on_event(ctx, line);
	snprintf(want, sizeof(want), "\"event\":\"%s\"", gate.wait_for);
	if (strstr(line, want)) {
		pthread_mutex_lock(&gate.lock);
		gate.seen = true;
		pthread_cond_broadcast(&gate.cond);
		pthread_mutex_unlock(&gate.lock);
	}
}

struct canceller {
	struct mig_status *st;
	bool await_ready;
	int ret;
	pthread_t thread;
};

static void *cancel_later(void *p)
{
	struct canceller *c = p;
	char err[256];

	char q[16384];

	pthread_mutex_lock(&gate.lock);
	while (!gate.seen)
		pthread_cond_wait(&gate.cond, &gate.lock);
	pthread_mutex_unlock(&gate.lock);
	/* awaiting READY: END sent, the handoff begun */
	while (c->await_ready && (mig_status_query(c->st, q, sizeof(q)) || !strstr(q, "\"state\":\"handoff\"")))
		usleep(1000);
	/* the engine blocks on its peer by now (it has nothing else to do); a cancel later than that is the same */
	usleep(300000);
	c->ret = mig_status_cancel(c->st, err, sizeof(err));
	return NULL;
}

START_TEST(cancel_ends_a_wait_on_the_peer)
{
	struct mig_testvm_opts go = guest_opts(KVMDIRTY_MODE_CLEAR_LOG);
	struct mig_send_opts o = base_opts;
	struct peer pe = { .read_all = _i == 1 };
	struct canceller c = { .ret = 1, .await_ready = _i == 1 };
	struct mig_guest g;
	struct mig_status st;
	struct mig_result res;
	struct testvm *tv = running_source(&go, &g);
	struct mig_ack ack;
	char err[512];
	int sv[2], ret;

	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	pe.fd = sv[1];
	mig_status_init(&st, false);
	ev_reset(&st, NULL, 0, ACT_NONE);
	gate.wait_for = "pass_started";
	gate.seen = false;
	c.st = &st;
	o.peer_timeout_ms = 3600000;
	o.verify = false;
	o.event = note_event;
	o.status = &st;
	ck_assert_int_eq(pthread_create(&pe.thread, NULL, sink_peer, &pe), 0);
	ck_assert_int_eq(pthread_create(&c.thread, NULL, cancel_later, &c), 0);
	ret = mig_send(&g, sv[0], &o, &res, err, sizeof(err));
	pthread_join(c.thread, NULL);
	close(sv[0]);
	pthread_join(pe.thread, NULL);
	close(sv[1]);
	printf("cancel while %s: %d (%s), the peer got %zu bytes\n",
	       _i == 1 ? "awaiting READY" : "blocked mid-stream", ret, err, pe.got);
	ck_assert_int_eq(c.ret, 0);
	ck_assert_msg(ret == -ECANCELED && res.cancelled, "%d: %s", ret, err);
	ck_assert_int_eq(res.outcome, MIG_OUTCOME_HERE);
	if (_i == 1) {
		/* told to drop what it has: the source's last word was ABORT */
		ck_assert_uint_ge(pe.got, sizeof(pe.last));
		/* pe.last is bytes off the wire, aligned as bytes: copied out, never cast */
		memcpy(&ack, pe.last, sizeof(ack));
		ck_assert_uint_eq(ack.kind, MIG_MSG_ABORT);
	}
	expect_running(tv, go.vcpus);
	mig_status_destroy(&st);
	mig_guest_release(&g);
	mig_testvm_free(tv);
}
END_TEST

/* A peer that reads part of the stream (its first MiB), then cuts the connection both ways. */
static void *cutting_peer(void *p)
{
	struct peer *pe = p;
	uint8_t buf[65536];
	ssize_t k;

	while (pe->got < (1u << 20) && (k = read(pe->fd, buf, sizeof(buf))) > 0)
		pe->got += (size_t)k;
	shutdown(pe->fd, SHUT_RDWR);
	return NULL;
}

/*
 * A migration that fails (its peer cuts the stream in the first pass):
 * the guest runs on here and another consumer of its tracker, there from
 * before the migration, is given every write (the migration's consumer is
 * aborted and freed, tracking left on: the migration did not turn it on);
 * in each mode.
 */
START_TEST(failure_leaves_other_consumers_whole)
{
	static const enum kvmdirty_mode modes[] = { KVMDIRTY_MODE_CLEAR_LOG, KVMDIRTY_MODE_DIRTY_LOG,
						    KVMDIRTY_MODE_DIRTY_RING };
	struct mig_testvm_opts go = guest_opts(modes[_i]);
	struct mig_send_opts o = base_opts;
	struct peer pe = { 0 };
	struct mig_status st;
	struct mig_result res;
	struct sampler sm;
	struct mig_guest g;
	struct testvm *tv = running_source(&go, &g);
	char err[512];
	int sv[2], ret;

	sampler_start(&sm, &g);
	ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	pe.fd = sv[1];
	mig_status_init(&st, false);
	ev_reset(&st, NULL, 0, ACT_NONE);
	o.status = &st;
	o.verify = false;
	ck_assert_int_eq(pthread_create(&pe.thread, NULL, cutting_peer, &pe), 0);
	ret = mig_send(&g, sv[0], &o, &res, err, sizeof(err));
	pthread_join(pe.thread, NULL);
	close(sv[0]);
	close(sv[1]);
	printf("failure (%d): %d (%s), the peer got %zu bytes\n", _i, ret, err, pe.got);
	ck_assert_msg(ret < 0 && ret != -ECANCELED, "%d: %s", ret, err);
	ck_assert_int_eq(res.outcome, MIG_OUTCOME_HERE);
	expect_running(tv, go.vcpus);
	sampler_check(&sm, &g);
	sampler_free(&sm, &g);
	mig_status_destroy(&st);
	mig_guest_release(&g);
	mig_testvm_free(tv);
}
END_TEST

/* ---- events ---- */

/* Lines from a pipe's reading end, as one string of their names. */
static void fd_names(int fd, char *buf, size_t len)
{
	char lines[65536], *p, *nl;
	size_t have = 0, k = 0;
	ssize_t n;

	while ((n = read(fd, lines + have, sizeof(lines) - 1 - have)) > 0)
		have += (size_t)n;
	lines[have] = 0;
	buf[0] = 0;
	for (p = lines; (nl = strchr(p, '\n')); p = nl + 1) {
		struct mig_json_error e;
		struct mig_json v;
		const struct mig_json *name;

		*nl = 0;
		ck_assert_msg(mig_json_parse(p, strlen(p), &v, &e) == 0, "not JSON: %s", p);
		name = mig_json_get(&v, "event");
		ck_assert(name && name->type == MIG_JSON_STRING);
		if (strncmp(name->str.s, "throttle_", 9))
			k += (size_t)snprintf(buf + k, len - k, "%s%s", k ? " " : "", name->str.s);
		mig_json_free(&v);
	}
	ck_assert_str_eq(p, ""); /* nothing cut short */
}

/* A migration that converges, one that does not: their events in order, the same on the callback and the fd. */
START_TEST(events_in_order)
{
	struct mig_send_opts o = base_opts;
	struct mig_result res;
	char err[512], names[4096], from_fd[4096];
	struct rig r;
	int ret, pfd[2];

	rig_up(&r, KVMDIRTY_MODE_CLEAR_LOG);
	ck_assert_int_eq(pipe(pfd), 0);
	o.event_to_fd = true;
	o.event_fd = pfd[1];
	if (_i == 1) {
		o.downtime_ms = 0;
		o.max_passes = 2;
		o.force_switchover = false;
	}
	ev_reset(&r.st, NULL, 0, ACT_NONE);
	ret = migrate(&r, &o, &res, err, sizeof(err));
	close(pfd[1]);
	ev_names(names, sizeof(names), false);
	fd_names(pfd[0], from_fd, sizeof(from_fd));
	close(pfd[0]);
	if (_i == 0) {
		expect_moved(ret, &res, err);
		ck_assert_str_eq(names, "pass_started pass_ended switchover ready commit completed");
	} else {
		ck_assert_msg(ret == -ETIME, "%d: %s", ret, err);
		ck_assert_str_eq(names, "pass_started pass_ended pass_started pass_ended failed");
		ck_assert_str_eq(ev.why[ev.n - 1], "pass_limit");
	}
	ck_assert_str_eq(from_fd, names);
	rig_down(&r, _i == 0);
}
END_TEST

/* ---- the daemon ---- */

/* The next event of a subscriber, its name in name; the replies to requests are passed over. */
static void next_event(int fd, char *name, size_t len, int *pass)
{
	char line[4096];

	for (;;) {
		struct mig_json_error e;
		struct mig_json v;
		const struct mig_json *n, *data;

		ck_assert_msg(get_line(fd, line, sizeof(line)), "the control socket closed");
		ck_assert_msg(mig_json_parse(line, strlen(line), &v, &e) == 0, "not JSON: %s", line);
		n = mig_json_get(&v, "event");
		if (n && n->type == MIG_JSON_STRING) {
			snprintf(name, len, "%s", n->str.s);
			data = mig_json_get(&v, "data");
			*pass = (int)data_num(data, "pass");
			mig_json_free(&v);
			return;
		}
		mig_json_free(&v);
	}
}

static void patient(int fd)
{
	struct timeval tv = { 600, 0 };

	ck_assert_int_eq(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
}

static int control_retry(const char *path, pid_t pid)
{
	char line[4096];
	int i, fd = -1, st;

	for (i = 0; i < 3000 && fd < 0; i++) {
		fd = dial(path);
		if (fd < 0) {
			ck_assert_msg(waitpid(pid, &st, WNOHANG) == 0, "the source exited before its control socket was up");
			usleep(10000);
		}
	}
	ck_assert_msg(fd >= 0, "no control socket at %s", path);
	close(fd);
	fd = connect_to(path);
	ck_assert(get_line(fd, line, sizeof(line)));
	return fd;
}

/*
 * kvmdirty-migrate send with --control: one subscriber that never reads,
 * one that cancels in pass 2 and sees it done; the source exits 4 after
 * running its guest on and checking it.
 */
START_TEST(daemon_cancelled_through_its_socket)
{
	struct mig_testvm_opts go = guest_opts(KVMDIRTY_MODE_CLEAR_LOG);
	char addr[128], ctl[96], dir[64], name[64], line[4096];
	int watcher, idle, pass = 0, status;
	pid_t listener, source;
	char *args[] = { "send", addr, "-m", "16", "-v", "2", "-w", "4", "-d", "0", "-p", "1000", "-t", "3600",
			 "--run-ms", "300", "--control", ctl, NULL };

	signal(SIGPIPE, SIG_IGN);
	snprintf(dir, sizeof(dir), "/tmp/kvmdirty-steer-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(dir));
	snprintf(ctl, sizeof(ctl), "%s/ctl.sock", dir);
	make_addr("unix", addr, sizeof(addr));
	listener = spawn_listener(addr, &go, "60000");
	source = spawn_migrate(args, -1);
	idle = control_retry(ctl, source);
	watcher = connect_to(ctl);
	ck_assert(get_line(watcher, line, sizeof(line)));
	/* events come as the migration gets on, slowly in a sanitized or emulated build: no 5 s bound on them */
	patient(idle);
	patient(watcher);
	ck_assert(send_all(idle, "{\"execute\":\"subscribe\"}\n", 24));
	ck_assert(send_all(watcher, "{\"execute\":\"subscribe\"}\n", 24));
	expect_line(watcher, "{\"return\":{}}\n");
	do
		next_event(watcher, name, sizeof(name), &pass);
	while (strcmp(name, "pass_started") || pass < 2);
	ck_assert(send_all(watcher, "{\"execute\":\"cancel\",\"id\":1}\n", 28));
	do
		next_event(watcher, name, sizeof(name), &pass);
	while (strcmp(name, "cancelled") && strcmp(name, "completed") && strcmp(name, "failed"));
	ck_assert_str_eq(name, "cancelled");
	status = child_status(source);
	ck_assert_int_eq(status, 4);
	/* the one that never read: every event, in order, the last the cancel */
	ck_assert_msg(get_line(idle, line, sizeof(line)), "the idle subscriber was closed before its reply");
	ck_assert_str_eq(line, "{\"return\":{}}\n");
	do
		next_event(idle, name, sizeof(name), &pass);
	while (strcmp(name, "cancelled"));
	close(idle);
	close(watcher);
	kill(listener, SIGTERM);
	ck_assert_int_eq(child_status(listener), 128 + SIGTERM);
	drop_addr(addr);
	rmdir(dir);
}
END_TEST

static Suite *suite(void)
{
	Suite *s = suite_create("migrate-steer");
	TCase *tc = tcase_create("steer");

	tcase_set_timeout(tc, 900);
	tcase_add_loop_test(tc, lower_downtime_makes_more_passes, 0, 2);
	tcase_add_loop_test(tc, lower_limits_end_precopy, 0, 2);
	tcase_add_test(tc, cap_bounds_later_passes);
	tcase_add_loop_test(tc, throttle_set_on_and_off, 0, 2);
	tcase_add_loop_test(tc, cancel_in_each_phase, BEFORE_FIRST_PASS, AFTER_COMMIT + 1);
	tcase_add_loop_test(tc, cancel_ends_a_wait_on_the_peer, 0, 2);
	tcase_add_loop_test(tc, events_in_order, 0, 2);
	tcase_add_test(tc, daemon_cancelled_through_its_socket);
	suite_add_tcase(s, tc);
	/* a case of its own: CK_RUN_CASE=failure runs it alone */
	tc = tcase_create("failure");
	tcase_set_timeout(tc, 900);
	tcase_add_loop_test(tc, failure_leaves_other_consumers_whole, 0, 3);
	suite_add_tcase(s, tc);
	return s;
}

int main(void)
{
	int skip = require_kvm("test-migrate-steer");

	if (skip)
		return skip; /* before Check allocates anything: no leak on the way out */
	return run_suite(suite());
}
