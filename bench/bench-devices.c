// SPDX-License-Identifier: MIT
/*
 * bench-devices [MIB [RUNS]]: what device state costs in the downtime,
 * through the public API (kvmdirty-migrate.h).  A guest of 16 MiB and one
 * vCPU with MIB (default 64) of device state migrates over a Unix socket
 * to a second VM of the same process, RUNS times (default 5) each way,
 * interleaved:
 *   baseline  all of it saved and sent in the pause (devices_save);
 *   live      all but 64 KiB given before the pause (devices_save_live),
 *             the 64 KiB in the pause.
 * Prints each way's median downtime (vCPUs paused to the destination's
 * ACK) and total, and live's downtime as a share of the baseline's.
 * Exit 77 (one line why) where the host has no KVM.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <kvmdirty-migrate.h>

#include "../examples/common/kvm-host.h"

#define MEM (16u << 20)
#define TAIL (64u << 10)

struct vmm {
	struct kvmdirty_vm *vm;
	struct kvmdirty_tracker *tracker;
	struct kvmdirty_vcpu *vcpu;
	struct kvmdirty_mig_guest *g;
	unsigned char *mem, *dev;
	size_t dev_len;
	bool live; /* give all but TAIL before the pause */
};

static void nothing(void *ctx)
{
	(void)ctx;
}

static int give(const unsigned char *p, size_t n, void **ret, size_t *ret_len)
{
	*ret = malloc(n ? n : 1);
	if (!*ret)
		return -ENOMEM;
	memcpy(*ret, p, n);
	*ret_len = n;
	return 0;
}

static int take(unsigned char *p, size_t cap, const void *s, size_t n)
{
	if (n > cap)
		return -EINVAL;
	memcpy(p, s, n);
	return 0;
}

/* the pause's part: all of it, or the tail */
static int dev_save(void *ctx, void **ret, size_t *ret_len)
{
	struct vmm *v = ctx;
	size_t off = v->live ? v->dev_len - TAIL : 0;

	return give(v->dev + off, v->dev_len - off, ret, ret_len);
}

static int dev_load(void *ctx, const void *s, size_t n)
{
	struct vmm *v = ctx;
	size_t off = n < v->dev_len ? v->dev_len - n : 0;

	return take(v->dev + off, v->dev_len - off, s, n);
}

static int dev_save_live(void *ctx, void **ret, size_t *ret_len)
{
	struct vmm *v = ctx;

	return give(v->dev, v->live ? v->dev_len - TAIL : 0, ret, ret_len);
}

static int dev_load_live(void *ctx, const void *s, size_t n)
{
	struct vmm *v = ctx;

	return take(v->dev, v->dev_len, s, n);
}

static const struct kvmdirty_mig_ops ops = {
	.pause = nothing, .resume = nothing, .devices_save = dev_save, .devices_load = dev_load,
	.devices_save_live = dev_save_live, .devices_load_live = dev_load_live,
};

static int vmm_new(struct vmm *v, bool source, size_t dev_len)
{
	struct kvmdirty_tracker_opts to = { .mode = KVMDIRTY_MODE_CLEAR_LOG };
	int ret;

	memset(v, 0, sizeof(*v));
	v->dev_len = dev_len;
	v->dev = malloc(dev_len);
	v->mem = mmap(NULL, MEM, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (!v->dev || v->mem == MAP_FAILED)
		return -ENOMEM;
	memset(v->dev, source ? 0x5a : 0, dev_len);
	if (source)
		memset(v->mem, 0x33, MEM);
	ret = kvmdirty_vm_new(&v->vm);
	if (ret == 0)
		ret = kvmdirty_region_add(v->vm, 0, MEM, v->mem, 0, NULL);
	if (ret == 0 && source)
		ret = kvmdirty_tracker_new(v->vm, &to, &v->tracker);
	if (ret == 0)
		ret = kvmdirty_vcpu_create(v->vm, 0, &v->vcpu);
	if (ret == 0)
		ret = kvmdirty_mig_guest_new(v->vm, v->tracker, &v->vcpu, 1, source ? 0 : KVMDIRTY_MIG_FRESH, &ops, v,
					     &v->g);
	return ret;
}

static void vmm_free(struct vmm *v)
{
	kvmdirty_mig_guest_free(v->g);
	if (v->tracker)
		kvmdirty_tracker_free(v->tracker);
	if (v->vcpu)
		kvmdirty_vcpu_free(v->vcpu);
	if (v->vm)
		kvmdirty_vm_free(v->vm);
	if (v->mem && v->mem != MAP_FAILED)
		munmap(v->mem, MEM);
	free(v->dev);
}

struct job {
	struct vmm *dst;
	int lfd, ret;
	char err[256];
};

static void *receive(void *p)
{
	struct job *j = p;
	struct kvmdirty_mig_recv_opts o = { .once = true };

	j->ret = kvmdirty_mig_recv(j->dst->g, j->lfd, &o, NULL, j->err, sizeof(j->err));
	return NULL;
}

/* One migration: 0 with its downtime and total in ms, or -errno said. */
static int once(const char *dir, size_t dev_len, bool live, double *downtime, double *total)
{
	struct kvmdirty_mig_send_result res;
	struct vmm src, dst;
	struct job j = { .dst = &dst, .lfd = -1 };
	char addr[256], err[256];
	pthread_t t;
	int ret;

	snprintf(addr, sizeof(addr), "unix:%s/sock", dir);
	ret = vmm_new(&src, true, dev_len);
	if (ret == 0)
		ret = vmm_new(&dst, false, dev_len);
	src.live = live;
	if (ret == 0)
		j.lfd = ret = kvmdirty_mig_listen(addr, err, sizeof(err));
	if (ret >= 0 && !(ret = -pthread_create(&t, NULL, receive, &j))) {
		ret = kvmdirty_mig_send(src.g, addr, NULL, &res, err, sizeof(err));
		pthread_join(t, NULL);
		if (ret == 0 && j.ret < 0)
			ret = j.ret;
		if (ret == 0 && memcmp(src.dev, dst.dev, dev_len))
			ret = -EBADMSG;
		if (ret < 0)
			fprintf(stderr, "bench-devices: %s: %s\n", strerror(-ret), j.ret < 0 ? j.err : err);
	}
	*downtime = res.downtime_ms;
	*total = res.total_ms;
	if (j.lfd >= 0)
		close(j.lfd);
	unlink(addr + 5);
	vmm_free(&dst);
	vmm_free(&src);
	return ret < 0 ? ret : 0;
}

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	unsigned long mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 64, runs = argc > 2 ? strtoul(argv[2], NULL, 10) : 5;
	double dt[2][64], tot[2][64];
	char dir[] = "/tmp/bench-devices.XXXXXX";
	unsigned long r;
	int ret = kvm_host_check("bench-devices: "), w;

	if (ret)
		return ret;
	if (!mib || mib > 256 || !runs || runs > 64) {
		fprintf(stderr, "bench-devices: usage: bench-devices [MIB 1..256 [RUNS 1..64]]\n");
		return 2;
	}
	if (!mkdtemp(dir))
		return 1;
	for (r = 0; r < runs; r++)
		for (w = 0; w < 2; w++)
			if (once(dir, mib << 20, w == 1, &dt[w][r], &tot[w][r]) < 0) {
				rmdir(dir);
				return 1;
			}
	rmdir(dir);
	for (w = 0; w < 2; w++) {
		qsort(dt[w], runs, sizeof(double), cmp);
		qsort(tot[w], runs, sizeof(double), cmp);
	}
	printf("devices mib=%lu runs=%lu baseline(all in the pause) downtime_ms=%.2f total_ms=%.1f\n", mib, runs,
	       dt[0][runs / 2], tot[0][runs / 2]);
	printf("devices mib=%lu runs=%lu live(all but 64 KiB before the pause) downtime_ms=%.2f total_ms=%.1f\n", mib,
	       runs, dt[1][runs / 2], tot[1][runs / 2]);
	printf("devices mib=%lu live downtime of baseline's: %.3f\n", mib, dt[1][runs / 2] / dt[0][runs / 2]);
	return 0;
}
