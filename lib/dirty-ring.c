// SPDX-License-Identifier: MIT
/*
 * The dirty ring backend.
 *
 * Protocol (api.rst 4.127, 8.29): each vCPU has a ring of kvm_dirty_gfn
 * entries mapped from its fd.  KVM writes slot and offset, then sets flags
 * to DIRTY.  Userspace reads entries in order from its own fetch index
 * with acquire loads, stops at the first that is not DIRTY, marks each
 * taken entry RESET with a release store, then calls
 * KVM_RESET_DIRTY_RINGS, which re-protects those pages and zeroes the
 * entries.  Only after that reset may the pages be read (protect before
 * read): callers harvest into a buffer of their own and publish after it.
 *
 * On this host KVM can push past a full ring (guest ring-0 code runs in
 * the emulator, up to 1,024 instructions between exits, more than the
 * ring's reserve), overwriting unharvested entries.  A harvest that takes
 * the whole ring reports KD_RING_OVERFLOW: the entries KVM overwrote are
 * lost, and their pages stay writable in KVM's page tables until logging
 * is switched off and on (the tracker does that at its next sync).
 *
 * KVM's reset walks entries by their flags from its own reset index, not
 * up to its write position, and zeroes each one it passes.  After an
 * overflow that leaves two kinds of stray zeros, both entries KVM counts
 * as pushed:
 *  - ahead of fetch ("ghosts"): a whole-ring harvest read slots KVM had
 *    overwritten with later pushes, and the reset then zeroed those
 *    later entries too.  Ghosts and free entries both read 0; what tells
 *    them apart is a DIRTY entry after them.  KVM pushes in order, so a
 *    DIRTY entry at fetch + k means every entry from fetch up to it was
 *    pushed: zeros there are ghosts, and only those are marked RESET
 *    (marking a free entry would let KVM's reset run past its write
 *    position and wrap its count of used entries).
 *  - behind fetch: a reset stopped early at a slot KVM overwrote while
 *    its entries awaited the reset; the harvest then took more than a
 *    lap ahead of KVM's reset index, and the next reset walked a whole
 *    lap, zeroing slots of entries it had not reached yet.  The ring
 *    keeps KVM's reset index (reset_pos, from the counts the resets
 *    return) and notes such a walk (lapped): zeros in [reset_pos, fetch)
 *    are then entries harvested and not reset, and are marked RESET
 *    until the reset catches up.
 * Every mark goes from 0 to RESET by compare-and-exchange, so a slot KVM
 * pushes into meanwhile is left DIRTY for the next harvest.
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "barrier.h"
#include "dirty-ring.h"
#include "hooks.h"
#include "kvm-uapi.h"

int kd_ring_enable(struct kd_kvm *kvm, uint32_t entries)
{
	int64_t max_acq = kvm->caps[KVMDIRTY_CAP_DIRTY_RING_ACQ_REL], max = kvm->caps[KVMDIRTY_CAP_DIRTY_RING];
	struct kvm_enable_cap cap = { 0 };
	uint64_t bytes = (uint64_t)entries * sizeof(struct kvm_dirty_gfn);
	int ret;

	if (max_acq <= 0 && max <= 0)
		return -EOPNOTSUPP;
	/* the ordered variant where KVM offers it (the only one on arm64) */
	cap.cap = max_acq > 0 ? KVM_CAP_DIRTY_LOG_RING_ACQ_REL : KVM_CAP_DIRTY_LOG_RING;
	if (max_acq > 0)
		max = max_acq;
	if (!entries || (entries & (entries - 1)) || bytes < kvm->page_size || bytes > (uint64_t)max)
		return -EINVAL;
	cap.args[0] = bytes;
	ret = kd_ioctl(kvm->vm_fd, KVM_ENABLE_CAP, &cap);
	if (ret < 0)
		return ret;
	kvm->ring_entries = entries;
	kvm->dirty_mode = KVMDIRTY_MODE_DIRTY_RING;
	return 0;
}

int kd_ring_map(struct kd_ring *ring, const struct kd_kvm *kvm, int vcpu_fd)
{
	size_t bytes = (size_t)kvm->ring_entries * sizeof(struct kvm_dirty_gfn);
	void *p;

	/* offset in host pages; KVM refuses PROT_EXEC and private mappings */
	p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, vcpu_fd,
		 (off_t)(kvm->page_size * KD_DIRTY_LOG_PAGE_OFFSET));
	if (p == MAP_FAILED)
		return -errno;
	ring->gfns = p;
	ring->size = kvm->ring_entries;
	ring->fetch = 0;
	ring->reset_pos = 0;
	ring->lapped = false;
	ring->suspect = false;
	ring->gen = ring->gen_at_full = 0;
	ring->reset_failed = false;
	return 0;
}

void kd_ring_unmap(struct kd_ring *ring)
{
	if (ring->gfns)
		munmap(ring->gfns, (size_t)ring->size * sizeof(struct kvm_dirty_gfn));
	ring->gfns = NULL;
}

static struct kvm_dirty_gfn *gfn_at(const struct kd_ring *ring, uint32_t pos)
{
	return &ring->gfns[pos & (ring->size - 1)];
}

static uint32_t flags_at(const struct kd_ring *ring, uint32_t pos)
{
	return load_acquire(&gfn_at(ring, pos)->flags);
}

/* 0 -> RESET unless KVM pushed into the slot meanwhile. */
static bool mark_zero(struct kd_ring *ring, uint32_t pos)
{
	uint32_t zero = 0;

	return __atomic_compare_exchange_n(&gfn_at(ring, pos)->flags, &zero, KVM_DIRTY_GFN_F_RESET, false,
					   __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

/* Ghost entries at fetch (see the top): how many, 0 if there are none or none can be told. */
static uint32_t count_ghosts(const struct kd_ring *ring)
{
	uint32_t k, i;

	for (k = 0; k < ring->size && !flags_at(ring, ring->fetch + k); k++)
		;
	if (!k || k == ring->size || flags_at(ring, ring->fetch + k) != KVM_DIRTY_GFN_F_DIRTY)
		return 0;
	/*
	 * The DIRTY entry at k, read with acquire, shows every push before it;
	 * read the zeros again after it so that an entry pushed while the
	 * first scan ran is not taken for a ghost.
	 */
	for (i = 0; i < k; i++)
		if (flags_at(ring, ring->fetch + i))
			return 0;
	return k;
}

/* When a harvest looks for ghost entries at fetch (see the top). */
enum ghosts {
	GHOSTS_NEVER,	   /* a batch's harvest: every slot it passes is an entry it took */
	GHOSTS_IF_SUSPECT, /* where KVM pushed past this ring before */
	GHOSTS_ALWAYS,	   /* in a ring-full exit */
};

/*
 * Take DIRTY entries from fetch (and ghosts before them); returns how
 * many entries were stored in out, at most max.
 */
static uint32_t harvest(struct kd_ring *ring, struct kd_ring_entry *out, uint32_t max, enum ghosts ghosts,
			unsigned int *loss)
{
	/* slots: ring slots passed by this harvest, entries taken and ghosts marked alike */
	uint32_t n = 0, slots = 0, k, i;

	for (;;) {
		while (n < max && slots < ring->size) {
			struct kvm_dirty_gfn *e = gfn_at(ring, ring->fetch);
			uint32_t slot;
			uint64_t offset;

			if (load_acquire(&e->flags) != KVM_DIRTY_GFN_F_DIRTY)
				break;
			out[n].slot = e->slot;
			out[n].offset = e->offset;
			KD_HOOK_POINT(KD_HOOK_RING_TAKEN, ring);
			store_release(&e->flags, KVM_DIRTY_GFN_F_RESET);
			/*
			 * Read again: a push past a full ring may have rewritten the
			 * slot between the read and the mark, and that entry is
			 * now marked too.  Keep it as well.
			 */
			slot = __atomic_load_n(&e->slot, __ATOMIC_ACQUIRE);
			offset = __atomic_load_n(&e->offset, __ATOMIC_ACQUIRE);
			n++;
			if (slot != out[n - 1].slot || offset != out[n - 1].offset) {
				*loss |= KD_RING_OVERFLOW;
				ring->suspect = true;
				if (n < max)
					out[n++] = (struct kd_ring_entry){ slot, offset };
			}
			ring->fetch++;
			slots++;
		}
		if (slots == ring->size) {
			/* a whole lap: KVM may have pushed over what it held */
			*loss |= KD_RING_OVERFLOW;
			ring->suspect = true;
			return n;
		}
		if (ghosts == GHOSTS_NEVER || (!ring->suspect && ghosts == GHOSTS_IF_SUSPECT) || n == max)
			return n;
		k = count_ghosts(ring);
		if (k > ring->size - slots)
			k = ring->size - slots;
		if (!k)
			return n;
		for (i = 0; i < k && mark_zero(ring, ring->fetch); i++)
			ring->fetch++;
		slots += i;
		ring->suspect = true;
		*loss |= KD_RING_GHOSTS;
		KD_HOOK_POINT(KD_HOOK_RING_GHOSTS, ring);
		if (i < k) /* KVM pushed into a slot meanwhile: take it next time */
			return n;
	}
}

/* Zeros among entries harvested and not yet reset, marked RESET (see the top); how many. */
static uint32_t mark_behind(struct kd_ring *ring)
{
	uint32_t pos, end = ring->fetch - ring->reset_pos > ring->size ? ring->reset_pos + ring->size : ring->fetch;
	uint32_t n = 0;

	for (pos = ring->reset_pos; pos != end; pos++)
		if (!flags_at(ring, pos) && mark_zero(ring, pos))
			n++;
	return n;
}

/*
 * KVM_RESET_DIRTY_RINGS with every signal blocked: since the 2025 fixes a
 * pending signal ends a reset early with -EINTR and its count lost, and
 * the count is what keeps reset_pos exact.  A call stops at INT_MAX
 * entries: go on until one returns less.
 */
static int64_t reset(struct kd_kvm *kvm)
{
	sigset_t all, old;
	int64_t total = 0;
	int ret;

	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, &old);
	do {
		ret = kd_ioctl(kvm->vm_fd, KVM_RESET_DIRTY_RINGS, NULL);
		if (ret > 0)
			total += ret;
	} while (ret == INT_MAX);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	return ret < 0 ? ret : total;
}

/* No entry of [reset_pos, fetch) awaits a reset: all were reset, by someone. */
static bool behind_all_zero(const struct kd_ring *ring)
{
	uint32_t pos, end = ring->fetch - ring->reset_pos > ring->size ? ring->reset_pos + ring->size : ring->fetch;

	for (pos = ring->reset_pos; pos != end; pos++)
		if (flags_at(ring, pos))
			return false;
	return true;
}

/*
 * A ring-full exit found nothing to take: if no reset took entries of this
 * ring since KVM said it was full, KVM still counts at least its soft limit
 * of entries as pushed and not reset, from reset_pos on.  When they all
 * read 0 (ghosts left by an overflow that went round more than once, with
 * no DIRTY entry after them to tell), up to a lower bound of that limit
 * are marked RESET: KVM's soft limit is the ring size less 64 entries,
 * less 512 more with Intel's PML.  Returns how many were marked.
 */
static uint32_t mark_full_ghosts(struct kd_ring *ring)
{
	uint32_t bound = ring->size > 1024 ? ring->size - 1024 : ring->size / 4, i;

	if (ring->fetch != ring->reset_pos || ring->gen != ring->gen_at_full)
		return 0;
	for (i = 0; i < ring->size; i++)
		if (flags_at(ring, ring->fetch + i))
			return 0;
	for (i = 0; i < bound && mark_zero(ring, ring->fetch); i++)
		ring->fetch++;
	return i;
}

int64_t kd_ring_collect(struct kd_ring *ring, struct kd_kvm *kvm, struct kd_ring_entry *out, uint32_t cap,
			bool ring_full, unsigned int *loss, uint64_t *kernel_ns)
{
	uint32_t n = 0, before, marked, round;
	int64_t c = 0;

	for (round = 0; round < 4; round++) {
		before = n;
		n += harvest(ring, out + n, cap - n, ring_full ? GHOSTS_ALWAYS : GHOSTS_IF_SUSPECT, loss);
		marked = ring->lapped ? mark_behind(ring) : 0;
		if (ring_full && !round && !n && !marked) {
			marked = mark_full_ghosts(ring);
			if (marked) {
				ring->suspect = true;
				*loss |= KD_RING_GHOSTS;
				KD_HOOK_POINT(KD_HOOK_RING_GHOSTS, ring);
			}
		}
		if (ring->reset_pos == ring->fetch)
			break;
		KD_HOOK_POINT(KD_HOOK_RING_HARVESTED, ring);
		ring->lapped = ring->fetch - ring->reset_pos > ring->size;
		{
			uint64_t t0 = kd_now_ns();

			c = reset(kvm);
			*kernel_ns += kd_now_ns() - t0;
		}
		ring->reset_failed = c < 0;
		if (c < 0)
			break;
		if (c)
			ring->gen++;
		/* only this ring has entries marked (callers retry a failed one first): never past fetch */
		if ((uint64_t)c > ring->fetch - ring->reset_pos)
			c = ring->fetch - ring->reset_pos;
		ring->reset_pos += (uint32_t)c;
		if (ring->reset_pos == ring->fetch) {
			ring->lapped = false;
			break;
		}
		if (!ring->lapped && behind_all_zero(ring)) {
			/* a reset outside the library took them: nothing is left to do */
			ring->reset_pos = ring->fetch;
			break;
		}
		/*
		 * KVM stopped short of fetch: it pushed into a slot whose entry
		 * awaited this reset, so that entry's page may not be protected
		 * again.  Report it (the tracker then protects everything), take
		 * what KVM stopped at, mark what it left, and go again.
		 */
		*loss |= KD_RING_OVERFLOW;
		ring->suspect = true;
		if (!c && n == before && !marked)
			break;
	}
	if (ring_full)
		ring->gen_at_full = ring->gen;
	if (ring->reset_pos != ring->fetch) {
		*loss |= KD_RING_UNPROTECTED;
		return c < 0 ? c : 0;
	}
	return n;
}

/* In a batch: nothing awaits a reset, and KVM never pushed past it. */
static bool batchable(const struct kd_ring *ring)
{
	return !ring->suspect && !ring->lapped && !ring->reset_failed && ring->reset_pos == ring->fetch;
}

/* Less than a lap of a batchable ring, into out[0, max): the slots from reset_pos to fetch name each entry once. */
static uint32_t take(struct kd_ring *ring, struct kd_ring_entry *out, uint32_t max, unsigned int *loss)
{
	uint32_t n;

	if (max > ring->size - 1)
		max = ring->size - 1;
	n = harvest(ring, out, max, GHOSTS_NEVER, loss);
	/* a lap less one taken and another DIRTY entry after them: KVM pushed past its soft limit, past the ring */
	if (n == ring->size - 1 && flags_at(ring, ring->fetch) == KVM_DIRTY_GFN_F_DIRTY) {
		*loss |= KD_RING_OVERFLOW;
		ring->suspect = true;
	}
	return n;
}

/*
 * One reset for rings[0 .. n), each holding less than a lap awaiting it
 * from its reset_pos; then each ring's reset_pos is where KVM's reset got
 * to in it.  0 or -errno of the reset (each ring with entries marked is
 * then reset_failed).
 *
 * Where KVM's reset got to is read off each ring, with the count to
 * settle what the ring cannot say.  KVM walked from its reset index
 * (reset_pos) while entries read RESET, zeroing each, and nothing else
 * writes 0: a slot that reads 0 was reset, and so was every slot before
 * it (lo: up to the last such slot).  A slot that still reads RESET was
 * not (hi: the first).  A slot that reads DIRTY in between holds a push a
 * lap later than the entry taken there, made either after the reset
 * freed the slot (the walk went past) or before it (the walk stopped
 * there, KVM having pushed over an entry that awaited the reset): each
 * ring's count lies in [lo, hi] (none can count more than it held: the
 * slots from fetch on read 0 or DIRTY).  The total tells which end holds
 * where all rings agree, or where one ring alone is unsure.  (A total
 * equal to what they held is not enough alone: a ring outside the batch
 * with entries marked would add to it.)  Where several are unsure and the total cannot tell, each is
 * taken at hi and reported (unsure: the caller reports an overflow, so
 * the tracker protects every page again): a reset_pos ahead of KVM's
 * catches up once the harvest reaches the push that stopped the walk.
 */
static int reset_batch(struct kd_kvm *kvm, struct kd_ring *const *rings, uint32_t n, uint64_t *kernel_ns)
{
	uint64_t t0, want = 0, sum_lo = 0, sum_hi = 0;
	uint32_t i, k, d, unsure = 0;
	bool bad;
	int64_t c;

	for (i = 0; i < n; i++) {
		rings[i]->unsure = false;
		if (rings[i]->fetch == rings[i]->reset_pos)
			continue;
		want += rings[i]->fetch - rings[i]->reset_pos;
		KD_HOOK_POINT(KD_HOOK_RING_HARVESTED, rings[i]);
	}
	if (!want)
		return 0;
	t0 = kd_now_ns();
	c = reset(kvm);
	*kernel_ns += kd_now_ns() - t0;
	for (i = 0; i < n; i++)
		rings[i]->reset_failed = c < 0 && rings[i]->fetch != rings[i]->reset_pos;
	if (c < 0)
		return (int)c;
	for (i = 0; i < n; i++) {
		struct kd_ring *ring = rings[i];
		uint32_t f;

		d = ring->fetch - ring->reset_pos;
		ring->span_lo = 0;
		for (k = 0; k < d && !((f = flags_at(ring, ring->reset_pos + k)) & KVM_DIRTY_GFN_F_RESET); k++)
			if (!f)
				ring->span_lo = k + 1;
		ring->span_hi = k;
		sum_lo += ring->span_lo;
		sum_hi += ring->span_hi;
		unsure += ring->span_lo != ring->span_hi;
	}
	/*
	 * A count outside [sum_lo, sum_hi] means the reset took entries of a
	 * ring not in the batch (its own mirror is then wrong, and these
	 * rings' counts cannot be told): every ring is taken at hi and
	 * reported.  Callers list every ring that may hold marked entries.
	 */
	bad = (uint64_t)c < sum_lo || (uint64_t)c > sum_hi;
	for (i = 0; i < n; i++) {
		struct kd_ring *ring = rings[i];

		if (bad)
			k = ring->span_hi, ring->unsure = ring->fetch != ring->reset_pos;
		else if (ring->span_lo == ring->span_hi || (uint64_t)c == sum_lo)
			k = ring->span_lo;
		else if ((uint64_t)c == sum_hi)
			k = ring->span_hi;
		else if (unsure == 1)
			k = ring->span_lo + (uint32_t)((uint64_t)c - sum_lo);
		else
			k = ring->span_hi, ring->unsure = true;
		ring->reset_pos += k;
		if (k)
			ring->gen++;
	}
	return 0;
}

int kd_rings_room(struct kd_ring_room *room, uint32_t ring_size, uint32_t nr_rings)
{
	/* a batch of a few full rings, or of many with a few entries each; a collect alone may go round twice */
	uint32_t batch = ring_size * 4 > 16384 ? ring_size * 4 : 16384, cap = batch + 2 * ring_size;

	if (room->buf_cap < cap) {
		struct kd_ring_entry *buf = realloc(room->buf, (size_t)cap * sizeof(*buf));

		if (!buf)
			return -ENOMEM;
		room->buf = buf;
		room->batch_cap = batch;
		room->buf_cap = cap;
	}
	if (room->segs_cap < nr_rings) {
		uint32_t want = nr_rings < 64 ? 64 : nr_rings * 2;
		struct kd_ring_seg *segs = realloc(room->segs, want * sizeof(*segs));
		struct kd_ring **rings;

		if (!segs)
			return -ENOMEM;
		room->segs = segs;
		rings = realloc(room->seg_rings, want * sizeof(*rings));
		if (!rings)
			return -ENOMEM;
		room->seg_rings = rings;
		room->segs_cap = want;
	}
	return 0;
}

void kd_rings_room_free(struct kd_ring_room *room)
{
	free(room->buf);
	free(room->segs);
	free(room->seg_rings);
	memset(room, 0, sizeof(*room));
}

static struct kd_ring_entry *alone_buf(const struct kd_ring_room *room)
{
	return room->buf + room->batch_cap;
}

int kd_rings_collect_one(struct kd_ring *ring, uint32_t i, struct kd_kvm *kvm, struct kd_ring_room *room,
			 bool ring_full, const struct kd_ring_out *out, uint64_t *kernel_ns)
{
	unsigned int loss = 0;
	int64_t n;

	if (!ring->gfns)
		return 0;
	n = kd_ring_collect(ring, kvm, alone_buf(room), room->buf_cap - room->batch_cap, ring_full, &loss, kernel_ns);
	if (loss)
		out->lost(out->ctx, i, loss);
	if (n > 0)
		out->pages(out->ctx, i, alone_buf(room), (uint32_t)n);
	return n < 0 ? (int)n : 0;
}

/*
 * The batch so far: its reset, then each ring's entries published once
 * its reset_pos reached fetch.  A ring KVM stopped short in is finished
 * alone, and publishes its batch entries with the rest only if it
 * settled.
 */
static int flush(struct kd_kvm *kvm, struct kd_ring_room *room, uint32_t *nseg, uint32_t *used,
		 const struct kd_ring_out *out, uint64_t *kernel_ns)
{
	uint32_t i, n = *nseg;
	int ret = reset_batch(kvm, room->seg_rings, n, kernel_ns);

	*nseg = *used = 0;
	for (i = 0; i < n; i++) {
		struct kd_ring *ring = room->seg_rings[i];
		struct kd_ring_seg *sg = &room->segs[i];
		int64_t more = 0;

		if (ret < 0 && ring->reset_pos != ring->fetch) {
			/*
			 * A reset failed: what awaits one is not re-protected, and
			 * another reset now would count other rings' entries too.
			 * Reported, never published (the tracker then protects
			 * all); retried before anything else is collected.
			 */
			ring->reset_failed = true;
			out->lost(out->ctx, sg->ring, sg->loss | KD_RING_UNPROTECTED);
			continue;
		}
		if (ring->unsure || ring->reset_pos != ring->fetch) {
			/* KVM pushed over entries that awaited the reset, or may have */
			sg->loss |= KD_RING_OVERFLOW;
			ring->suspect = true;
		}
		if (ring->reset_pos != ring->fetch) {
			KD_HOOK_POINT(KD_HOOK_RING_BATCH_SHORT, ring);
			more = kd_ring_collect(ring, kvm, alone_buf(room), room->buf_cap - room->batch_cap, false,
					       &sg->loss, kernel_ns);
			if (more < 0)
				ret = (int)more;
		}
		if (sg->loss)
			out->lost(out->ctx, sg->ring, sg->loss);
		if (ring->reset_pos != ring->fetch)
			continue;
		if (sg->n)
			out->pages(out->ctx, sg->ring, room->buf + sg->off, sg->n);
		if (more > 0)
			out->pages(out->ctx, sg->ring, alone_buf(room), (uint32_t)more);
	}
	return ret;
}

int kd_rings_collect(struct kd_ring *const *rings, uint32_t n, struct kd_kvm *kvm, struct kd_ring_room *room,
		     const struct kd_ring_out *out, uint64_t *kernel_ns)
{
	uint32_t i, nseg = 0, used = 0, got;
	int ret = 0;

	for (i = 0; i < n && ret == 0; i++) {
		struct kd_ring *ring = rings[i];

		while (ring->gfns && ret == 0) {
			unsigned int loss = 0;
			uint32_t free = room->batch_cap - used;

			if (!batchable(ring) || room->segs_cap < n) {
				/* alone, with no other ring awaiting a reset */
				ret = nseg ? flush(kvm, room, &nseg, &used, out, kernel_ns) : 0;
				if (ret == 0)
					ret = kd_rings_collect_one(ring, i, kvm, room, false, out, kernel_ns);
				break;
			}
			got = take(ring, room->buf + used, free, &loss);
			if (got || loss) {
				room->segs[nseg] = (struct kd_ring_seg){ .ring = i, .off = used, .n = got, .loss = loss };
				room->seg_rings[nseg++] = ring;
				used += got;
			}
			if (got < free)
				break;
			/* the batch is full, and this ring may hold more: after a reset, the rest */
			ret = flush(kvm, room, &nseg, &used, out, kernel_ns);
		}
	}
	if (nseg) {
		int r = flush(kvm, room, &nseg, &used, out, kernel_ns);

		if (ret == 0)
			ret = r;
	}
	return ret;
}

int kd_rings_retry_failed(struct kd_ring *const *rings, uint32_t n, struct kd_kvm *kvm, struct kd_ring_room *room,
			  const struct kd_ring_out *out, uint64_t *kernel_ns)
{
	bool batch = room->segs_cap >= n;
	uint32_t i, nf = 0;
	int ret;

	for (i = 0; i < n && batch; i++) {
		const struct kd_ring *ring = rings[i];

		if (!ring->reset_failed)
			continue;
		if (ring->lapped || ring->fetch - ring->reset_pos >= ring->size)
			batch = false;
		room->segs[nf].ring = i;
		room->seg_rings[nf++] = rings[i];
	}
	if (batch) {
		ret = reset_batch(kvm, room->seg_rings, nf, kernel_ns);
		if (ret < 0)
			return ret;
		/* their entries were reported lost when the reset failed: a short ring is only finished, alone */
		for (i = 0; i < nf; i++) {
			if (room->seg_rings[i]->unsure)
				out->lost(out->ctx, room->segs[i].ring, KD_RING_OVERFLOW);
			if (room->seg_rings[i]->unsure || room->seg_rings[i]->reset_pos != room->seg_rings[i]->fetch)
				room->seg_rings[i]->suspect = true;
			if (room->seg_rings[i]->reset_pos == room->seg_rings[i]->fetch)
				continue;
			ret = kd_rings_collect_one(room->seg_rings[i], room->segs[i].ring, kvm, room, false, out,
						   kernel_ns);
			if (ret < 0)
				return ret;
		}
		return 0;
	}
	for (i = 0; i < n; i++) {
		if (!rings[i]->reset_failed)
			continue;
		ret = kd_rings_collect_one(rings[i], i, kvm, room, false, out, kernel_ns);
		if (ret < 0)
			return ret;
	}
	return 0;
}
