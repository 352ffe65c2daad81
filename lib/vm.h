/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_VM_H
#define KVMDIRTY_VM_H

/*
 * The VM handle: it owns one object of each layer and sits above them
 * all.  vm.c holds the public calls that take a VM and frees the parts
 * top down (tracker, vCPUs, regions, fds); no layer reaches up to it.
 */
#include "kvm.h"
#include "regions.h"
#include "tracker.h"
#include "vcpu.h"

struct kvmdirty_vm {
	struct kd_kvm kvm;
	struct kd_regions regions;
	struct kd_vcpus vcpus;
	struct kvmdirty_tracker *tracker;
};

#endif
