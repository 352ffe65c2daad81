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

/*
 * Take DIRTY entries from fetch (and ghosts before them); returns how
 * many entries were stored in out, at most max.
 */
static uint32_t harvest(struct kd_ring *ring, struct kd_ring_entry *out, uint32_t max, bool ghosts,
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
		if ((!ring->suspect && !ghosts) || n == max)
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
		n += harvest(ring, out + n, cap - n, ring_full, loss);
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
