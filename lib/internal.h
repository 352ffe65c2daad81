/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_INTERNAL_H
#define KVMDIRTY_INTERNAL_H

#include <pthread.h>
#include <stdint.h>

#include "kvmdirty.h"
#include "index.h"

#define KD_EXPORT __attribute__((visibility("default")))

struct kvmdirty_region {
	struct kvmdirty_vm *vm;
	uint64_t gpa;
	uint64_t size;
	void *hva;
	uint32_t slot;
	uint32_t flags;
};

struct kvmdirty_vm {
	int kvm_fd;
	int vm_fd;
	bool owns_fds;
	uint64_t page_size;
	int64_t caps[KVMDIRTY_CAP_COUNT];

	/*
	 * Regions live in an array indexed by slot id, allocated on the
	 * first add: a lookup's result is an address computed from the id,
	 * not one more pointer to load.  slot_used says which are live.
	 */
	struct kvmdirty_region *regions;
	uint64_t *slot_used; /* bitmap over slot ids */
	uint32_t nr_slots;
	uint32_t nr_regions;
	struct kd_index gpa_index;
	struct kd_index hva_index;

	/* time spent inside memslot ioctls, for the benchmarks' kernel/library split */
	uint64_t memslot_ioctl_ns;

	struct kvmdirty_tracker *tracker;
	/* the mode KVM was set up for (manual protect or ring), 0 if neither */
	enum kvmdirty_mode kvm_mode;
	bool initially_set; /* manual protect with KVM_DIRTY_LOG_INITIALLY_SET */
	/* registered vCPUs; vcpus_lock guards the array (sync, reaper, add, free) */
	struct kvmdirty_vcpu **vcpus;
	uint32_t nr_vcpus, vcpus_cap;
	pthread_mutex_t vcpus_lock;
	/* ring size in entries once the dirty ring is enabled, else 0 */
	uint32_t ring_entries;
};

struct kvm_dirty_gfn;

struct kvmdirty_vcpu {
	struct kvmdirty_vm *vm;
	int fd;
	bool owns_fd;
	struct kvm_run *run;
	size_t run_size;
	/* dirty ring: entries, our fetch index, and a lock so that the
	 * vCPU's ring-full handler and a sync never harvest at once */
	struct kvm_dirty_gfn *ring;
	uint32_t fetch;
	pthread_mutex_t ring_lock;
};

/* A tracked region's bitmaps, one bit per page, by slot id. */
struct kd_track_region {
	uint64_t npages;
	uint64_t *pending;  /* owned by the syncing thread */
	uint64_t *async;    /* set atomically: ring-full handlers, mark_dirty */
	uint64_t *kvm_bmap; /* KVM_GET_DIRTY_LOG buffer */
	uint64_t *to_clear; /* CLEAR_LOG: fetched from KVM, not yet cleared there */
	uint64_t pending_count;
	bool tracking;
};

#define KD_RATE_SAMPLES 8

struct kvmdirty_tracker {
	struct kvmdirty_vm *vm;
	enum kvmdirty_mode mode;
	uint64_t chunk_pages;
	struct kd_track_region *slots; /* vm->nr_slots entries, lazily */
	uint64_t pending_total;
	uint32_t cursor_slot;
	uint64_t cursor_page;

	struct kvmdirty_stats stats; /* ring_* fields updated atomically */
	uint64_t rate_ns[KD_RATE_SAMPLES], rate_pages[KD_RATE_SAMPLES];
	unsigned int rate_pos;

	/*
	 * Test hook: issue each chunk's KVM_CLEAR_DIRTY_LOG at the start of
	 * the next sync instead of before handing its pages out (clear after
	 * the consumer read them), so a test can show that this order loses
	 * writes.  Never set otherwise.
	 */
	bool test_clear_late;
};

uint64_t kd_now_ns(void);

/* ioctl returning its result, or -errno: the one place errno is read */
int kd_ioctl(int fd, unsigned long req, void *arg);
/* KVM_CHECK_EXTENSION; 0 when absent or on error */
int64_t kd_check_extension(int fd, long cap);

void kd_regions_fini(struct kvmdirty_vm *vm);
struct kvmdirty_region *kd_slot_region(const struct kvmdirty_vm *vm, uint32_t slot);

/* tracker hooks for region changes */
void kd_track_region_removed(struct kvmdirty_tracker *t, struct kvmdirty_region *r);

/* dirty-log.c */
int kd_log_enable_manual(struct kvmdirty_vm *vm, bool *ret_initially_set);
int kd_log_get(struct kvmdirty_vm *vm, struct kvmdirty_region *r, uint64_t *bitmap);
int kd_log_clear(struct kvmdirty_vm *vm, struct kvmdirty_region *r, uint64_t first_page,
		 uint64_t npages, uint64_t *bitmap);

/* dirty-ring.c */
int kd_ring_enable(struct kvmdirty_vm *vm, uint32_t entries);
int kd_ring_map(struct kvmdirty_vcpu *v);
void kd_ring_unmap(struct kvmdirty_vcpu *v);
int64_t kd_ring_harvest(struct kvmdirty_tracker *t, struct kvmdirty_vcpu *v);
int kd_ring_reset(struct kvmdirty_vm *vm, bool in_sync);
int kd_ring_full(struct kvmdirty_vcpu *v);

/* track.c: mark every page of every tracked region dirty (lost ring entries) */
void kd_track_mark_all(struct kvmdirty_tracker *t);
void kd_track_async_page(struct kvmdirty_tracker *t, uint32_t slot, uint64_t page);
int64_t kd_track_harvest(struct kvmdirty_tracker *t, struct kvmdirty_vcpu *v);
/* time spent in KVM ioctls by the tracker, added to the current sync */
void kd_track_kernel_ns(struct kvmdirty_tracker *t, uint64_t ns);

#endif
