/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_BARRIER_H
#define KVMDIRTY_BARRIER_H

/*
 * The ordering the dirty ring needs, in one place (api.rst: KVM writes an
 * entry's slot and offset, then its flags; userspace must read flags with
 * acquire before the rest, and publish RESET with release so that KVM
 * sees the entry consumed).  Required on weakly ordered CPUs, free on x86.
 */
#define load_acquire(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define store_release(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)

#endif
