// SPDX-License-Identifier: MIT
/* vCPUs: creation or registration, kvm_run and ring mappings, the run helper. */
#include <errno.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "internal.h"
#include "kvm-uapi.h"

static int vcpu_register(struct kvmdirty_vm *vm, struct kvmdirty_vcpu *v)
{
	int ret = 0;

	pthread_mutex_lock(&vm->vcpus_lock);
	if (vm->nr_vcpus == vm->vcpus_cap) {
		uint32_t cap = vm->vcpus_cap ? vm->vcpus_cap * 2 : 8;
		struct kvmdirty_vcpu **p = realloc(vm->vcpus, cap * sizeof(*p));

		if (!p) {
			ret = -ENOMEM;
			goto out;
		}
		vm->vcpus = p;
		vm->vcpus_cap = cap;
	}
	vm->vcpus[vm->nr_vcpus++] = v;
out:
	pthread_mutex_unlock(&vm->vcpus_lock);
	return ret;
}

static int vcpu_setup(struct kvmdirty_vm *vm, int fd, bool owns, struct kvmdirty_vcpu **ret_vcpu)
{
	struct kvmdirty_vcpu *v = calloc(1, sizeof(*v));
	int ret;

	if (!v)
		return -ENOMEM;
	v->vm = vm;
	v->fd = fd;
	v->owns_fd = owns;
	pthread_mutex_init(&v->ring_lock, NULL);
	ret = kd_ioctl(vm->kvm_fd, KVM_GET_VCPU_MMAP_SIZE, NULL);
	if (ret < 0)
		goto err;
	v->run_size = (size_t)ret;
	v->run = mmap(NULL, v->run_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (v->run == MAP_FAILED) {
		v->run = NULL;
		ret = -errno;
		goto err;
	}
	if (vm->ring_entries) {
		ret = kd_ring_map(v);
		if (ret < 0)
			goto err;
	}
	ret = vcpu_register(vm, v);
	if (ret < 0)
		goto err;
	*ret_vcpu = v;
	return 0;
err:
	v->owns_fd = false; /* the caller closes what it opened */
	kd_ring_unmap(v);
	if (v->run)
		munmap(v->run, v->run_size);
	pthread_mutex_destroy(&v->ring_lock);
	free(v);
	return ret;
}

KD_EXPORT int kvmdirty_vcpu_create(struct kvmdirty_vm *vm, uint32_t id, struct kvmdirty_vcpu **ret_vcpu)
{
	int fd, ret;

	if (!vm || !ret_vcpu)
		return -EINVAL;
	fd = kd_ioctl(vm->vm_fd, KVM_CREATE_VCPU, (void *)(uintptr_t)id);
	if (fd < 0)
		return fd;
	ret = vcpu_setup(vm, fd, true, ret_vcpu);
	if (ret < 0)
		close(fd);
	return ret;
}

KD_EXPORT int kvmdirty_vcpu_add(struct kvmdirty_vm *vm, int vcpu_fd, struct kvmdirty_vcpu **ret_vcpu)
{
	if (!vm || !ret_vcpu)
		return -EINVAL;
	if (vcpu_fd < 0)
		return -EBADF;
	return vcpu_setup(vm, vcpu_fd, false, ret_vcpu);
}

KD_EXPORT void kvmdirty_vcpu_free(struct kvmdirty_vcpu *v)
{
	struct kvmdirty_vm *vm;
	uint32_t i;

	if (!v)
		return;
	vm = v->vm;
	pthread_mutex_lock(&vm->vcpus_lock);
	for (i = 0; i < vm->nr_vcpus; i++) {
		if (vm->vcpus[i] == v) {
			vm->vcpus[i] = vm->vcpus[--vm->nr_vcpus];
			break;
		}
	}
	pthread_mutex_unlock(&vm->vcpus_lock);
	/* what the ring still holds is not lost: the next sync cannot see it */
	if (v->ring && vm->tracker)
		kd_track_harvest(vm->tracker, v);
	kd_ring_unmap(v);
	if (v->run)
		munmap(v->run, v->run_size);
	if (v->owns_fd)
		close(v->fd);
	pthread_mutex_destroy(&v->ring_lock);
	free(v);
}

KD_EXPORT int kvmdirty_vcpu_fd(const struct kvmdirty_vcpu *v)
{
	return v->fd;
}

KD_EXPORT struct kvm_run *kvmdirty_vcpu_kvm_run(const struct kvmdirty_vcpu *v)
{
	return v->run;
}

KD_EXPORT int kvmdirty_vcpu_run(struct kvmdirty_vcpu *v)
{
	int ret;

	for (;;) {
		if (ioctl(v->fd, KVM_RUN, NULL) < 0)
			return -errno;
		/* the one check the library adds to every exit */
		if (v->run->exit_reason != KVM_EXIT_DIRTY_RING_FULL)
			return 0;
		ret = kd_ring_full(v);
		if (ret < 0)
			return ret;
	}
}
