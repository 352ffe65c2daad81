// SPDX-License-Identifier: MIT
/* vCPUs: creation or registration, kvm_run and ring mappings, harvests, the run helper. */
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "export.h"
#include "hooks.h"
#include "kvm-uapi.h"
#include "vcpu.h"

void kd_vcpus_init(struct kd_vcpus *vs, struct kd_kvm *kvm)
{
	memset(vs, 0, sizeof(*vs));
	vs->kvm = kvm;
	pthread_mutex_init(&vs->lock, NULL);
}

#define LOAD(x) __atomic_load_n(&(x), __ATOMIC_RELAXED)
#define STORE(x, val) __atomic_store_n(&(x), (val), __ATOMIC_RELAXED)

/*
 * Signal v's thread if it is in kvmdirty_vcpu_run(), so that a vCPU in
 * KVM_RUN without exits comes out to be held.  A kick that lands between
 * the thread's look at hold_until and KVM_RUN is lost; the next harvest
 * kicks again, as long as the vCPU owes time.
 */
static void kick(struct kd_vcpus *vs, struct kvmdirty_vcpu *v)
{
	int signo = LOAD(vs->kick_signo);

	if (!signo || LOAD(v->holding))
		return;
	__atomic_add_fetch(&v->kickers, 1, __ATOMIC_SEQ_CST);
	if (__atomic_load_n(&v->in_run, __ATOMIC_SEQ_CST) && !pthread_equal(v->thread, pthread_self())) {
		KD_HOOK_POINT(KD_HOOK_KICK, v);
		/* seq_cst: a vCPU thread whose drop of old bits reads this one then sees the change before it */
		__atomic_or_fetch(&v->kick_sigs, 1ull << (signo - 1), __ATOMIC_SEQ_CST);
		__atomic_add_fetch(&v->kick_seq, 1, __ATOMIC_SEQ_CST);
		KD_HOOK_POINT(KD_HOOK_KICK_SEND, v);
		if (!pthread_kill(v->thread, signo))
			STORE(v->kicks, v->kicks + 1);
	}
	__atomic_sub_fetch(&v->kickers, 1, __ATOMIC_SEQ_CST);
}

/*
 * Charge n harvested entries to v (NULL: a freed vCPU's ring, counted for
 * no one): its count, the rate window, and under a limit its budget,
 * which sets how long it stays out of KVM_RUN.  Callers hold the lock.
 */
static void account(struct kd_vcpus *vs, struct kvmdirty_vcpu *v, uint64_t n)
{
	uint64_t now = kd_now_ns(), limit, el;
	uint32_t i;

	if (!vs->win_start)
		vs->win_start = now;
	el = now - vs->win_start;
	if (el >= KD_RATE_WINDOW_NS) {
		/* one window for all: the vCPUs' rates add up to the guest's */
		for (i = 0; i < vs->n; i++) {
			struct kvmdirty_vcpu *w = vs->v[i];

			STORE(w->rate, w->win_pages * 1000000000ull / el);
			w->win_pages = 0;
		}
		vs->win_start = now;
	}
	if (!v || !n)
		return;
	STORE(v->dirtied, v->dirtied + n);
	v->win_pages += n;
	limit = LOAD(v->limit);
	if (!limit)
		return;
	/*
	 * The entries were written since the last charge, not at once: the
	 * time since then is all quota, and only what is saved beyond it is
	 * capped.  A vCPU under its limit is never held however seldom its
	 * ring is harvested; one that idled may spend one harvest's worth.
	 */
	el = now - v->budget_at;
	if (el > (uint64_t)INT64_MAX / 2)
		el = (uint64_t)INT64_MAX / 2;
	v->budget_ns += (int64_t)el;
	if (v->budget_ns > KD_LIMIT_BURST_NS && v->budget_ns > (int64_t)el)
		v->budget_ns = (int64_t)el > KD_LIMIT_BURST_NS ? (int64_t)el : KD_LIMIT_BURST_NS;
	v->budget_at = now;
	v->budget_ns -= (int64_t)(n * 1000000000ull / limit);
	if (v->budget_ns >= 0)
		return;
	STORE(v->hold_until, now + (uint64_t)-v->budget_ns);
	kick(vs, v);
}

/*
 * What a harvest of v's ring brought, into the pages it dirtied since its
 * last count: address space 0 only, as the tracker (its slot ids are
 * below 2^16, so the set's keys never alias).
 */
static void note_seen(struct kvmdirty_vcpu *v, const struct kd_ring_entry *e, uint32_t n)
{
	uint32_t i;

	for (i = 0; i < n; i++)
		if (!(e[i].slot >> 16))
			kd_pageset_add(&v->seen, e[i].slot, e[i].offset);
}

/* Entries of v's ring, re-protected: counted, noted for counts, handed to the sink. */
static void publish(struct kd_vcpus *vs, struct kvmdirty_vcpu *v, const struct kd_ring_entry *e, uint32_t n)
{
	account(vs, v, n);
	if (v && v->seen.keys)
		note_seen(v, e, n);
	if (vs->sink)
		vs->sink->pages(vs->sink_ctx, v, e, n);
}

/* Whose ring a collect means: ring i of vs->rings, or the one vCPU of a collect alone. */
struct whose {
	struct kd_vcpus *vs;
	struct kvmdirty_vcpu *one;
	bool alone;
};

static struct kvmdirty_vcpu *whose_vcpu(const struct whose *w, uint32_t i)
{
	if (w->alone)
		return w->one;
	/* parked rings (freed vCPUs) come after the vCPUs' own */
	return i < w->vs->n ? w->vs->v[i] : NULL;
}

static void out_pages(void *ctx, uint32_t i, const struct kd_ring_entry *e, uint32_t n)
{
	const struct whose *w = ctx;

	publish(w->vs, whose_vcpu(w, i), e, n);
}

static void out_lost(void *ctx, uint32_t i, unsigned int loss)
{
	const struct whose *w = ctx;

	w->vs->loss_seq++;
	if (w->vs->sink)
		w->vs->sink->lost(w->vs->sink_ctx, whose_vcpu(w, i), loss);
}

/* Every ring in vs->rings, in order (the vCPUs', then the parked ones); how many, or -ENOMEM. */
static int64_t list_rings(struct kd_vcpus *vs)
{
	uint32_t i, n = vs->n + vs->nr_parked;

	if (vs->rings_cap < n) {
		uint32_t cap = n < 64 ? 64 : 2 * n;
		struct kd_ring **r = realloc(vs->rings, cap * sizeof(*r));

		if (!r)
			return -ENOMEM;
		vs->rings = r;
		vs->rings_cap = cap;
	}
	for (i = 0; i < vs->n; i++)
		vs->rings[i] = &vs->v[i]->ring;
	for (i = 0; i < vs->nr_parked; i++)
		vs->rings[vs->n + i] = &vs->parked[i].ring;
	return n;
}

/*
 * A reset that failed left some rings' entries marked: reset them again
 * before any other ring is collected (dirty-ring.h).  -errno if that
 * still fails.
 */
static int retry_failed(struct kd_vcpus *vs)
{
	struct whose w = { .vs = vs };
	const struct kd_ring_out out = { out_pages, out_lost, &w };
	int64_t n;
	int ret;

	if (!vs->any_failed)
		return 0;
	n = list_rings(vs);
	if (n < 0)
		return (int)n;
	ret = kd_rings_retry_failed(vs->rings, (uint32_t)n, vs->kvm, &vs->room, &out, &vs->kernel_ns);
	/* every ring's reset went through: none is left to retry until another fails */
	if (ret == 0)
		vs->any_failed = false;
	return ret;
}

/*
 * Collect one ring (harvest and reset until settled, see dirty-ring.c)
 * and only then publish its pages: they are re-protected by now.  Callers
 * hold the lock.
 */
static int collect(struct kd_vcpus *vs, struct kd_ring *ring, struct kvmdirty_vcpu *v, bool ring_full)
{
	struct whose w = { .vs = vs, .one = v, .alone = true };
	const struct kd_ring_out out = { out_pages, out_lost, &w };
	int ret;

	if (!ring->gfns)
		return 0;
	ret = retry_failed(vs);
	if (ret == 0)
		ret = kd_rings_collect_one(ring, 0, vs->kvm, &vs->room, ring_full, &out, &vs->kernel_ns);
	if (ret < 0)
		vs->any_failed = true;
	return ret;
}

int kd_vcpus_harvest(struct kd_vcpus *vs, uint64_t *ret_kernel_ns)
{
	struct whose w = { .vs = vs };
	const struct kd_ring_out out = { out_pages, out_lost, &w };
	int64_t n;
	int ret;

	pthread_mutex_lock(&vs->lock);
	vs->kernel_ns = 0;
	ret = retry_failed(vs);
	n = ret < 0 ? ret : list_rings(vs);
	if (n >= 0 && vs->room.buf) {
		/* room for a batch of them all, or each is collected alone */
		kd_rings_room(&vs->room, vs->kvm->ring_entries, (uint32_t)n);
		ret = kd_rings_collect(vs->rings, (uint32_t)n, vs->kvm, &vs->room, &out, &vs->kernel_ns);
	} else if (n < 0 && ret == 0) {
		ret = (int)n;
	}
	if (ret < 0)
		vs->any_failed = true;
	if (ret_kernel_ns)
		*ret_kernel_ns = vs->kernel_ns;
	pthread_mutex_unlock(&vs->lock);
	return ret;
}

void kd_vcpus_set_sink(struct kd_vcpus *vs, const struct kd_ring_sink *sink, void *ctx)
{
	pthread_mutex_lock(&vs->lock);
	vs->sink = sink;
	vs->sink_ctx = ctx;
	pthread_mutex_unlock(&vs->lock);
}

uint32_t kd_vcpus_count(struct kd_vcpus *vs)
{
	uint32_t n;

	pthread_mutex_lock(&vs->lock);
	n = vs->n;
	pthread_mutex_unlock(&vs->lock);
	return n;
}

static int vcpu_register(struct kd_vcpus *vs, struct kvmdirty_vcpu *v)
{
	uint32_t i;
	int ret = 0;

	pthread_mutex_lock(&vs->lock);
	for (i = 0; i < vs->n; i++) {
		if (v->id != KD_VCPU_NO_ID && vs->v[i]->id == v->id) {
			ret = -EEXIST; /* registered already */
			goto out;
		}
	}
	if (v->ring.gfns) {
		/* room to collect its ring (the first vCPU's makes it), and a batch with the others' */
		ret = kd_rings_room(&vs->room, v->ring.size, vs->n + vs->nr_parked + 1);
		if (ret < 0 && !vs->room.buf)
			goto out;
		ret = 0;
	}
	if (vs->n == vs->cap) {
		uint32_t cap = vs->cap ? vs->cap * 2 : 8;
		struct kvmdirty_vcpu **p = realloc(vs->v, cap * sizeof(*p));

		if (!p) {
			ret = -ENOMEM;
			goto out;
		}
		vs->v = p;
		vs->cap = cap;
	}
	/* registered again: its ring where the library left it */
	for (i = 0; v->ring.gfns && v->id != KD_VCPU_NO_ID && i < vs->nr_parked; i++) {
		if (vs->parked[i].id == v->id) {
			kd_ring_unmap(&v->ring);
			v->ring = vs->parked[i].ring;
			vs->parked[i] = vs->parked[--vs->nr_parked];
			break;
		}
	}
	vs->v[vs->n++] = v;
out:
	pthread_mutex_unlock(&vs->lock);
	return ret;
}

/* Keep a freed vCPU's ring (mapped, harvested); callers hold the lock.  Unmapped if out of memory. */
static void park(struct kd_vcpus *vs, struct kvmdirty_vcpu *v)
{
	if (!v->ring.gfns)
		return;
	if (vs->nr_parked == vs->parked_cap) {
		uint32_t cap = vs->parked_cap ? vs->parked_cap * 2 : 8;
		struct kd_parked_ring *p = realloc(vs->parked, cap * sizeof(*p));

		if (!p) {
			kd_ring_unmap(&v->ring);
			return;
		}
		vs->parked = p;
		vs->parked_cap = cap;
	}
	vs->parked[vs->nr_parked++] = (struct kd_parked_ring){ v->id, v->ring };
	v->ring.gfns = NULL;
}

/* KVM's id of the vCPU behind fd, from its name ("anon_inode:kvm-vcpu:ID"). */
static uint32_t vcpu_id_of(int fd)
{
	char path[64], name[64];
	unsigned int id;
	ssize_t n;

	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	n = readlink(path, name, sizeof(name) - 1);
	if (n <= 0)
		return KD_VCPU_NO_ID;
	name[n] = 0;
	return sscanf(name, "anon_inode:kvm-vcpu:%u", &id) == 1 ? id : KD_VCPU_NO_ID;
}

/*
 * KVM's count of the page faults the vCPU took ("pf_taken" in its binary
 * statistics, Linux 5.14+): after tracking starts, mostly its first writes
 * to write-protected pages, so the bitmap modes can tell which vCPU
 * dirties.  Left at -1 where KVM has no such statistic.
 */
static void open_fault_stat(struct kvmdirty_vcpu *v)
{
	struct kvm_stats_header h;
	char *descs = NULL;
	size_t dsz;
	uint32_t i;
	int fd;

	fd = kd_ioctl(v->fd, KVM_GET_STATS_FD, NULL);
	if (fd < 0)
		return;
	if (pread(fd, &h, sizeof(h), 0) != (ssize_t)sizeof(h) || !h.num_desc || h.num_desc > 4096 ||
	    h.name_size < 16 || h.name_size > 4096)
		goto out;
	dsz = sizeof(struct kvm_stats_desc) + h.name_size;
	descs = malloc(dsz * h.num_desc);
	if (!descs || pread(fd, descs, dsz * h.num_desc, h.desc_offset) != (ssize_t)(dsz * h.num_desc))
		goto out;
	for (i = 0; i < h.num_desc; i++) {
		struct kvm_stats_desc *d = (void *)(descs + i * dsz);

		d->name[h.name_size - 1] = 0;
		if (strcmp(d->name, "pf_taken") || d->size != 1 ||
		    (d->flags & KVM_STATS_TYPE_MASK) != KVM_STATS_TYPE_CUMULATIVE)
			continue;
		v->fault_off = h.data_offset + d->offset;
		v->stats_fd = fd;
		free(descs);
		return;
	}
out:
	free(descs);
	close(fd);
}

static uint64_t read_faults(const struct kvmdirty_vcpu *v)
{
	uint64_t n;

	if (v->stats_fd < 0 || pread(v->stats_fd, &n, sizeof(n), (off_t)v->fault_off) != (ssize_t)sizeof(n))
		return 0;
	return n;
}

static void vcpu_unmap(struct kvmdirty_vcpu *v)
{
	if (v->stats_fd >= 0)
		close(v->stats_fd);
	v->stats_fd = -1;
	kd_ring_unmap(&v->ring);
	if (v->run)
		munmap(v->run, v->run_size);
	v->run = NULL;
}

static int vcpu_setup(struct kd_vcpus *vs, int fd, bool owns, uint32_t id, struct kvmdirty_vcpu **ret_vcpu)
{
	struct kvmdirty_vcpu *v = calloc(1, sizeof(*v));
	int ret;

	if (!v)
		return -ENOMEM;
	v->owner = vs;
	v->fd = fd;
	v->stats_fd = -1;
	v->owns_fd = owns;
	v->id = id;
	ret = kd_ioctl(vs->kvm->kvm_fd, KVM_GET_VCPU_MMAP_SIZE, NULL);
	if (ret < 0)
		goto err;
	v->run_size = (size_t)ret;
	v->run = mmap(NULL, v->run_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (v->run == MAP_FAILED) {
		v->run = NULL;
		ret = -errno;
		goto err;
	}
	open_fault_stat(v);
	if (vs->kvm->ring_entries) {
		ret = kd_ring_map(&v->ring, vs->kvm, fd);
		if (ret < 0)
			goto err;
	}
	ret = vcpu_register(vs, v);
	if (ret < 0)
		goto err;
	*ret_vcpu = v;
	return 0;
err:
	vcpu_unmap(v);
	free(v);
	return ret;
}

int kd_vcpu_create(struct kd_vcpus *vs, uint32_t id, struct kvmdirty_vcpu **ret_vcpu)
{
	int fd, ret;

	fd = kd_ioctl(vs->kvm->vm_fd, KVM_CREATE_VCPU, (void *)(uintptr_t)id);
	if (fd < 0)
		return fd;
	ret = vcpu_setup(vs, fd, true, id, ret_vcpu);
	if (ret < 0)
		close(fd);
	return ret;
}

int kd_vcpu_add(struct kd_vcpus *vs, int vcpu_fd, struct kvmdirty_vcpu **ret_vcpu)
{
	if (vcpu_fd < 0)
		return -EBADF;
	return vcpu_setup(vs, vcpu_fd, false, vcpu_id_of(vcpu_fd), ret_vcpu);
}

KD_EXPORT void kvmdirty_vcpu_free(struct kvmdirty_vcpu *v)
{
	struct kd_vcpus *vs;
	uint32_t i;

	if (!v)
		return;
	vs = v->owner;
	pthread_mutex_lock(&vs->lock);
	/*
	 * What the ring holds is harvested, reset and published like any
	 * harvest, v still listed (a retry of a failed reset must count its
	 * marked entries with the others'); then it leaves, and its ring is
	 * kept.
	 */
	collect(vs, &v->ring, v, false);
	for (i = 0; i < vs->n; i++) {
		if (vs->v[i] == v) {
			vs->v[i] = vs->v[--vs->n];
			break;
		}
	}
	park(vs, v);
	pthread_mutex_unlock(&vs->lock);
	vcpu_unmap(v);
	if (v->owns_fd)
		close(v->fd);
	kd_pageset_fini(&v->seen);
	free(v);
}

void kd_vcpus_fini(struct kd_vcpus *vs)
{
	uint32_t i;

	while (vs->n)
		kvmdirty_vcpu_free(vs->v[vs->n - 1]);
	for (i = 0; i < vs->nr_parked; i++)
		kd_ring_unmap(&vs->parked[i].ring);
	free(vs->parked);
	free(vs->v);
	kd_rings_room_free(&vs->room);
	free(vs->rings);
	pthread_mutex_destroy(&vs->lock);
	memset(vs, 0, sizeof(*vs));
}

KD_EXPORT int kvmdirty_vcpu_fd(const struct kvmdirty_vcpu *v)
{
	return v ? v->fd : -EINVAL;
}

KD_EXPORT struct kvm_run *kvmdirty_vcpu_kvm_run(const struct kvmdirty_vcpu *v)
{
	return v ? v->run : NULL;
}

/*
 * KVM_EXIT_DIRTY_RING_FULL: collect this vCPU's ring, looking for ghost
 * entries whatever the ring's state (a ring KVM left stuck behind them
 * exits here again and again).  If another thread harvested between the
 * exit and here there is nothing to take, and the vCPU simply goes on.
 */
static int ring_full(struct kvmdirty_vcpu *v)
{
	struct kd_vcpus *vs = v->owner;
	uint64_t t0 = kd_now_ns();
	int ret;

	KD_HOOK_POINT(KD_HOOK_RING_FULL, v);
	pthread_mutex_lock(&vs->lock);
	ret = collect(vs, &v->ring, v, true);
	STORE(v->full_exits, v->full_exits + 1);
	if (vs->sink)
		vs->sink->full_exit(vs->sink_ctx, v, kd_now_ns() - t0);
	pthread_mutex_unlock(&vs->lock);
	return ret;
}

/*
 * Stay out of KVM_RUN until hold_until (re-read: a harvest may push it
 * on, a new limit may drop it), in slices, so that a VMM that sets
 * immediate_exit gets its vCPU back within a slice, or at once with its
 * signal.  -EINTR then.
 */
static int hold(struct kvmdirty_vcpu *v)
{
	uint64_t t0 = kd_now_ns(), now = t0, until;
	int ret = 0;

	STORE(v->holding, 1);
	STORE(v->holds, v->holds + 1);
	KD_HOOK_POINT(KD_HOOK_HOLD, v);
	while ((until = LOAD(v->hold_until)) > now) {
		uint64_t ns = until - now < KD_HOLD_SLICE_NS ? until - now : KD_HOLD_SLICE_NS;
		struct timespec ts = { 0, (long)ns };

		if (LOAD(v->run->immediate_exit)) {
			ret = -EINTR;
			break;
		}
		nanosleep(&ts, NULL);
		/* counted slice by slice: a reader during a long hold sees it grow */
		STORE(v->held_ns, v->held_ns + (kd_now_ns() - now));
		now = kd_now_ns();
	}
	STORE(v->holding, 0);
	return ret;
}

/*
 * A thread that blocks the kick signal outside KVM_RUN (KVM_SET_SIGNAL_MASK
 * unblocks it inside) still has it pending after the EINTR, and every
 * KVM_RUN would end at once: take it.  Unblocked, its handler ran already.
 *
 * kick_sigs says which signals kicks were sent with.  The bit of the
 * signal kicks use now stays set: a second kicker may have set it and
 * counted its kick (kick_seq) but not signalled yet; its signal then ends
 * the next KVM_RUN, whose EINTR sees the new kick_seq and comes back here
 * for it.  Taking the bit here (as an exchange once did) left that signal
 * with no bit to be eaten by, and the KVM_RUN after returned -EINTR to the
 * VMM.  Bits of signals kicks no longer use are dropped once their
 * signals are taken: the change waited out every kicker that read them.
 */
static void eat_kick(struct kvmdirty_vcpu *v)
{
	uint32_t gen = __atomic_load_n(&v->owner->kick_gen, __ATOMIC_ACQUIRE);
	int cur = __atomic_load_n(&v->owner->kick_signo, __ATOMIC_ACQUIRE);
	uint64_t sigs = __atomic_load_n(&v->kick_sigs, __ATOMIC_RELAXED), old;
	struct timespec zero = { 0, 0 };
	sigset_t cur_mask, these;
	int signo;

	if (!sigs || pthread_sigmask(SIG_BLOCK, NULL, &cur_mask))
		return;
	sigemptyset(&these);
	for (signo = 1; signo <= 64; signo++)
		if ((sigs & (1ull << (signo - 1))) && sigismember(&cur_mask, signo))
			sigaddset(&these, signo);
	while (sigtimedwait(&these, NULL, &zero) > 0)
		;
	old = sigs & ~(cur ? 1ull << (cur - 1) : 0);
	if (!old)
		return;
	KD_HOOK_POINT(KD_HOOK_KICK_FORGET, v);
	__atomic_and_fetch(&v->kick_sigs, ~old, __ATOMIC_SEQ_CST);
	/* kicks moved (perhaps back to one of those) meanwhile: a bit may be a new kicker's; keep them all */
	if (__atomic_load_n(&v->owner->kick_gen, __ATOMIC_SEQ_CST) != gen)
		__atomic_or_fetch(&v->kick_sigs, old, __ATOMIC_SEQ_CST);
}

/*
 * Until no kicker is between its look at in_run and its signal: a few
 * yields (a kicker takes well under a microsecond there), then short
 * sleeps, so that a kicker this thread has pushed off the CPU (a vCPU
 * thread of a higher real-time priority on the same CPU) can finish.
 */
static void wait_kickers(struct kvmdirty_vcpu *v)
{
	struct timespec ts = { 0, 50000 };
	int i;

	for (i = 0; __atomic_load_n(&v->kickers, __ATOMIC_SEQ_CST); i++) {
		if (i < 16)
			sched_yield();
		else
			nanosleep(&ts, NULL);
	}
}

static int run_loop(struct kvmdirty_vcpu *v)
{
	int ret;

	for (;;) {
		uint64_t until = LOAD(v->hold_until);

		if (until && until > kd_now_ns()) {
			ret = hold(v);
			if (ret < 0)
				return ret;
		}
		if (ioctl(v->fd, KVM_RUN, NULL) < 0) {
			/* KVM_RUN's, before a signal handler that does not keep errno runs */
			int err = errno;
			uint64_t seq;

			KD_HOOK_POINT(KD_HOOK_RUN_FAILED, v);
			/*
			 * An EINTR without immediate_exit after a kick of the
			 * library's is taken as that kick's (its signal may have
			 * waited, blocked, for KVM_RUN to unblock it): be held, go
			 * on.  The VMM's kicks set immediate_exit and are returned.
			 */
			if (err == EINTR && !LOAD(v->run->immediate_exit) &&
			    (seq = __atomic_load_n(&v->kick_seq, __ATOMIC_SEQ_CST)) != v->kick_seen) {
				v->kick_seen = seq;
				/*
				 * A kicker counted in seq may not have signalled
				 * yet: let it, then take its signal here (the
				 * sigmask call delivers an unblocked one, eat_kick
				 * takes a blocked one), not in the next KVM_RUN.
				 */
				wait_kickers(v);
				KD_HOOK_POINT(KD_HOOK_EAT_KICK, v);
				eat_kick(v);
				continue;
			}
			return -err;
		}
		/* the one check the library adds to every exit */
		if (v->run->exit_reason != KVM_EXIT_DIRTY_RING_FULL)
			return 0;
		ret = ring_full(v);
		if (ret < 0)
			return ret;
	}
}

KD_EXPORT int kvmdirty_vcpu_run(struct kvmdirty_vcpu *v)
{
	int ret;

	if (!v)
		return -EINVAL;
	v->thread = pthread_self();
	__atomic_store_n(&v->in_run, 1, __ATOMIC_SEQ_CST);
	ret = run_loop(v);
	/* a kicker that saw in_run set finishes with v->thread before this returns */
	__atomic_store_n(&v->in_run, 0, __ATOMIC_SEQ_CST);
	wait_kickers(v);
	return ret;
}

KD_EXPORT int kvmdirty_vcpu_set_dirty_limit(struct kvmdirty_vcpu *v, uint64_t pages_per_sec)
{
	uint64_t now, old, el;
	struct kd_vcpus *vs;

	if (!v || pages_per_sec > KD_LIMIT_MAX)
		return -EINVAL;
	vs = v->owner;
	if (!vs->kvm->ring_entries)
		return -EOPNOTSUPP;
	pthread_mutex_lock(&vs->lock);
	now = kd_now_ns();
	old = v->limit;
	if (old && pages_per_sec) {
		/* what is saved or owed, brought up to now as account() does, re-timed at the new limit */
		el = now - v->budget_at;
		if (el > (uint64_t)INT64_MAX / 2)
			el = (uint64_t)INT64_MAX / 2;
		v->budget_ns += (int64_t)el;
		if (v->budget_ns > KD_LIMIT_BURST_NS && v->budget_ns > (int64_t)el)
			v->budget_ns = (int64_t)el > KD_LIMIT_BURST_NS ? (int64_t)el : KD_LIMIT_BURST_NS;
		v->budget_ns = (int64_t)((__int128)v->budget_ns * (__int128)old / (__int128)pages_per_sec);
		if (v->budget_ns > KD_LIMIT_BURST_NS)
			v->budget_ns = KD_LIMIT_BURST_NS;
	} else {
		/* a first limit starts from nothing saved and nothing owed; none forgets it all */
		v->budget_ns = 0;
	}
	v->budget_at = now;
	STORE(v->limit, pages_per_sec);
	STORE(v->hold_until, v->budget_ns < 0 ? now + (uint64_t)-v->budget_ns : 0);
	pthread_mutex_unlock(&vs->lock);
	return 0;
}

KD_EXPORT int kvmdirty_vcpu_stats(const struct kvmdirty_vcpu *v, struct kvmdirty_vcpu_stats *ret_stats,
				  size_t size)
{
	struct kvmdirty_vcpu_stats st = { 0 };
	struct kd_vcpus *vs;
	uint64_t now, el;

	if (!v || !ret_stats || !size)
		return -EINVAL;
	vs = v->owner;
	pthread_mutex_lock(&vs->lock);
	now = kd_now_ns();
	el = vs->win_start ? now - vs->win_start : 0;
	st.dirtied = v->dirtied;
	/* no harvest closed a window for two: the rate is what came since the last one closed */
	st.dirty_rate = el >= 2 * KD_RATE_WINDOW_NS ? v->win_pages * 1000000000ull / el : v->rate;
	st.dirty_limit = v->limit;
	pthread_mutex_unlock(&vs->lock);
	st.held_ns = LOAD(v->held_ns);
	st.holds = LOAD(v->holds);
	st.kicks = LOAD(v->kicks);
	st.ring_full_exits = LOAD(v->full_exits);
	st.faults = read_faults(v);
	memcpy(ret_stats, &st, size < sizeof(st) ? size : sizeof(st));
	return 0;
}

/* Stop counting v's pages: its set freed. */
static int count_stop(struct kvmdirty_vcpu *v)
{
	struct kd_vcpus *vs = v->owner;
	struct kd_pageset old;

	pthread_mutex_lock(&vs->lock);
	old = v->seen;
	v->seen = (struct kd_pageset){ 0 };
	pthread_mutex_unlock(&vs->lock);
	kd_pageset_fini(&old);
	return 0;
}

KD_EXPORT int kvmdirty_vcpu_count(struct kvmdirty_vcpu *v, struct kvmdirty_count *ret_count, size_t size)
{
	struct kvmdirty_count k = { 0 };
	struct kd_pageset fresh, old = { 0 };
	struct kd_vcpus *vs;
	uint64_t now;
	int ret;

	if (!v || (ret_count && !size))
		return -EINVAL;
	if (!v->ring.gfns)
		return -EOPNOTSUPP;
	if (!ret_count)
		return count_stop(v);
	vs = v->owner;
	/* the next interval's set, made outside the lock that harvests wait for */
	ret = kd_pageset_init(&fresh, LOAD(v->seen_hint));
	if (ret < 0)
		return ret;
	pthread_mutex_lock(&vs->lock);
	now = kd_now_ns();
	if (v->seen.keys) {
		old = v->seen;
		k.pages = old.n;
		k.ns = now - v->seen_ns;
		/* a loss in this interval or the one before (its pages writable until a sync re-protected them) */
		if (old.failed || vs->loss_seq != v->seen_loss[0])
			k.flags |= KVMDIRTY_COUNT_INCOMPLETE;
		v->seen_loss[0] = v->seen_loss[1];
	} else {
		v->seen_loss[0] = vs->loss_seq;
	}
	v->seen_loss[1] = vs->loss_seq;
	v->seen = fresh;
	v->seen_ns = now;
	STORE(v->seen_hint, k.pages);
	pthread_mutex_unlock(&vs->lock);
	kd_pageset_fini(&old);
	if (k.ns)
		k.pages_per_sec = (uint64_t)((unsigned __int128)k.pages * 1000000000u / k.ns);
	memcpy(ret_count, &k, size < sizeof(k) ? size : sizeof(k));
	return 0;
}

int kd_vcpus_set_kick_signal(struct kd_vcpus *vs, int signo)
{
	struct sigaction sa;

	if (signo) {
		if (signo < 1 || signo > SIGRTMAX || sigaction(signo, NULL, &sa) < 0)
			return -EINVAL;
		if (!(sa.sa_flags & SA_SIGINFO) && (sa.sa_handler == SIG_DFL || sa.sa_handler == SIG_IGN))
			return -EINVAL;
	}
	/* every kick runs under the lock: none with the old signal is under way once this returns */
	pthread_mutex_lock(&vs->lock);
	/* a vCPU thread that reads the new signal sees every kick with the old one sent */
	__atomic_store_n(&vs->kick_signo, signo, __ATOMIC_SEQ_CST);
	/* after the signal: a thread that sees the new count sees the new signal too */
	__atomic_store_n(&vs->kick_gen, vs->kick_gen + 1, __ATOMIC_RELEASE);
	pthread_mutex_unlock(&vs->lock);
	return 0;
}
