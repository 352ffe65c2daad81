// SPDX-License-Identifier: MIT
/*
 * A VMM outside the tree, built only with pkg-config's flags for
 * libkvmdirty-migrate: it snapshots a guest (memory, a vCPU's registers
 * and an MSR, an IOAPIC entry of the in-kernel irqchip, its devices'
 * state) twice, a full
 * snapshot and a diff, restores the chain into a second VM (and lazily into
 * a third, the VMM reading a page at once, served), then migrates
 * the guest to a fourth VM over a Unix socket, and a second guest by
 * post-copy (its source's control asks for the switch; the VMM reads a
 * page at once, served) to a fifth, and checks each landed whole.  Exit 0 all held, 1 not (one line saying what), 77 no KVM here.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <linux/kvm.h>

#include <kvmdirty-migrate.h>

#define MEM (4u << 20)
#define MSR_TSC_AUX 0xc0000103u

struct vmm {
	struct kvmdirty_vm *vm;
	struct kvmdirty_tracker *tracker;
	struct kvmdirty_vcpu *vcpu;
	struct kvmdirty_mig_guest *guest;
	unsigned char *mem;
	unsigned int paused, resumed;
	char devices[64]; /* a device's state: what a serial port would keep */
	/* a device's bulk (a frame buffer), given before the pause in a migration */
	unsigned char *fb;
	unsigned int live_saved, live_loaded;
};

#define FB (2u << 20)

static int fail(const char *what, int ret, const char *err)
{
	fprintf(stderr, "consumer-migrate: %s: %s%s%s\n", what, strerror(ret < 0 ? -ret : ret), err && *err ? ": " : "",
		err ? err : "");
	return 1;
}

static void v_pause(void *ctx)
{
	((struct vmm *)ctx)->paused++;
}

static void v_resume(void *ctx)
{
	((struct vmm *)ctx)->resumed++;
}

static int v_devices_save(void *ctx, void **ret_state, size_t *ret_len)
{
	struct vmm *v = ctx;

	*ret_len = strlen(v->devices) + 1;
	*ret_state = malloc(*ret_len);
	if (!*ret_state)
		return -ENOMEM;
	memcpy(*ret_state, v->devices, *ret_len);
	return 0;
}

static int v_devices_load(void *ctx, const void *state, size_t len)
{
	struct vmm *v = ctx;

	if (len > sizeof(v->devices) || !len || ((const char *)state)[len - 1])
		return -EINVAL;
	memcpy(v->devices, state, len);
	return 0;
}

static int v_fb_save(void *ctx, void **ret_state, size_t *ret_len)
{
	struct vmm *v = ctx;

	*ret_state = malloc(FB);
	if (!*ret_state)
		return -ENOMEM;
	memcpy(*ret_state, v->fb, FB);
	*ret_len = FB;
	v->live_saved++;
	return 0;
}

static int v_fb_load(void *ctx, const void *state, size_t len)
{
	struct vmm *v = ctx;

	if (len != FB)
		return -EINVAL;
	memcpy(v->fb, state, FB);
	v->live_loaded++;
	return 0;
}

static const struct kvmdirty_mig_ops ops = {
	.pause = v_pause, .resume = v_resume, .devices_save = v_devices_save, .devices_load = v_devices_load,
	.devices_save_live = v_fb_save, .devices_load_live = v_fb_load,
};

/* A VM with an in-kernel irqchip, MEM of memory at guest address 0 and one vCPU; 0, 77 or 1. */
static int vmm_new(struct vmm *v, bool source)
{
	struct kvmdirty_tracker_opts to = { .mode = KVMDIRTY_MODE_CLEAR_LOG };
	int ret;

	memset(v, 0, sizeof(*v));
	ret = kvmdirty_vm_new(&v->vm);
	if (ret == -ENOENT || ret == -EACCES || ret == -EPERM || ret == -ENXIO || ret == -ENODEV || ret == -ENOTTY ||
	    ret == -EPROTO) {
		printf("consumer-migrate: skipped: /dev/kvm: %s\n", strerror(-ret));
		return 77;
	}
	if (ret < 0)
		return fail("kvmdirty_vm_new", ret, NULL);
	if (ioctl(kvmdirty_vm_fd(v->vm), KVM_CREATE_IRQCHIP, 0) < 0)
		return fail("KVM_CREATE_IRQCHIP", errno, NULL);
	v->mem = mmap(NULL, MEM, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	v->fb = calloc(1, FB);
	if (v->mem == MAP_FAILED || !v->fb)
		return fail("memory", ENOMEM, NULL);
	ret = kvmdirty_region_add(v->vm, 0, MEM, v->mem, 0, NULL);
	if (ret < 0)
		return fail("kvmdirty_region_add", ret, NULL);
	if (source && (ret = kvmdirty_tracker_new(v->vm, &to, &v->tracker)) < 0)
		return fail("kvmdirty_tracker_new", ret, NULL);
	ret = kvmdirty_vcpu_create(v->vm, 0, &v->vcpu);
	if (ret < 0)
		return fail("kvmdirty_vcpu_create", ret, NULL);
	ret = kvmdirty_mig_guest_new(v->vm, v->tracker, &v->vcpu, 1, source ? 0 : KVMDIRTY_MIG_FRESH, &ops, v,
				     &v->guest);
	if (ret < 0)
		return fail("kvmdirty_mig_guest_new", ret, NULL);
	return 0;
}

static void vmm_free(struct vmm *v)
{
	kvmdirty_mig_guest_free(v->guest);
	if (v->tracker)
		kvmdirty_tracker_free(v->tracker);
	if (v->vcpu)
		kvmdirty_vcpu_free(v->vcpu);
	if (v->vm)
		kvmdirty_vm_free(v->vm);
	if (v->mem && v->mem != MAP_FAILED)
		munmap(v->mem, MEM);
	free(v->fb);
}

struct msrs {
	struct kvm_msrs h;
	struct kvm_msr_entry e[1];
};

/* The IOAPIC's redirection entry 5, the VM's state the guest would have set. */
static int ioapic_entry(struct vmm *v, uint64_t *bits, bool set)
{
	struct kvm_irqchip chip = { .chip_id = KVM_IRQCHIP_IOAPIC };

	if (ioctl(kvmdirty_vm_fd(v->vm), KVM_GET_IRQCHIP, &chip) < 0)
		return fail("KVM_GET_IRQCHIP", errno, NULL);
	if (!set) {
		*bits = chip.chip.ioapic.redirtbl[5].bits;
		return 0;
	}
	chip.chip.ioapic.redirtbl[5].bits = *bits;
	if (ioctl(kvmdirty_vm_fd(v->vm), KVM_SET_IRQCHIP, &chip) < 0)
		return fail("KVM_SET_IRQCHIP", errno, NULL);
	return 0;
}

/* The vCPU's RBX and TSC_AUX, with the IOAPIC entry in the top of aux's report: 0, or 1 said. */
static int vcpu_get(struct vmm *v, uint64_t *rbx, uint64_t *aux)
{
	struct msrs m = { .h.nmsrs = 1, .e[0].index = MSR_TSC_AUX };
	struct kvm_regs regs;
	int fd = kvmdirty_vcpu_fd(v->vcpu);
	uint64_t io;

	if (ioapic_entry(v, &io, false))
		return 1;
	if (ioctl(fd, KVM_GET_REGS, &regs) < 0)
		return fail("KVM_GET_REGS", errno, NULL);
	if (ioctl(fd, KVM_GET_MSRS, &m) != 1)
		return fail("KVM_GET_MSRS TSC_AUX", errno, NULL);
	*rbx = regs.rbx;
	*aux = m.e[0].data | (io & 0xff) << 32;
	return 0;
}

/* RBX, TSC_AUX = aux's low half, the IOAPIC entry's vector = aux's bits 32-39 */
static int vcpu_set(struct vmm *v, uint64_t rbx, uint64_t aux)
{
	struct msrs m = { .h.nmsrs = 1, .e[0] = { .index = MSR_TSC_AUX, .data = (uint32_t)aux } };
	uint64_t io = (aux >> 32 & 0xff) | 1ull << 16; /* the vector, masked */
	struct kvm_regs regs;
	int fd = kvmdirty_vcpu_fd(v->vcpu);

	if (ioapic_entry(v, &io, true))
		return 1;

	if (ioctl(fd, KVM_GET_REGS, &regs) < 0)
		return fail("KVM_GET_REGS", errno, NULL);
	regs.rbx = rbx;
	if (ioctl(fd, KVM_SET_REGS, &regs) < 0)
		return fail("KVM_SET_REGS", errno, NULL);
	if (ioctl(fd, KVM_SET_MSRS, &m) != 1)
		return fail("KVM_SET_MSRS TSC_AUX", errno, NULL);
	return 0;
}

/* Whether v holds src's memory, registers and devices: 0, or 1 said. */
static int same(struct vmm *v, struct vmm *src, const char *what)
{
	uint64_t rbx, aux, want_rbx, want_aux;

	if (memcmp(v->mem, src->mem, MEM)) {
		fprintf(stderr, "consumer-migrate: %s: memory differs from the source's\n", what);
		return 1;
	}
	if (vcpu_get(v, &rbx, &aux) || vcpu_get(src, &want_rbx, &want_aux))
		return 1;
	if (rbx != want_rbx || aux != want_aux || strcmp(v->devices, src->devices)) {
		fprintf(stderr,
			"consumer-migrate: %s: rbx %#" PRIx64 " (source %#" PRIx64 "), IOAPIC vector:TSC_AUX %#" PRIx64
			" (source %#" PRIx64 "), devices '%s' (source '%s')\n",
			what, rbx, want_rbx, aux, want_aux, v->devices, src->devices);
		return 1;
	}
	return 0;
}

/* A rate sampler beside the snapshots sees a write of 3 pages (the VMM's, marked). */
static int rate_sees(struct vmm *v)
{
	struct kvmdirty_mig_rate_sample smp;
	struct kvmdirty_mig_rate *rate;
	char err[256];
	int ret;

	ret = kvmdirty_mig_rate_new(v->guest, &rate, err, sizeof(err));
	if (ret < 0)
		return fail("kvmdirty_mig_rate_new", ret, err) ? -EIO : 0;
	memset(v->mem + 65536, 0x77, 3 * 4096);
	ret = kvmdirty_tracker_mark_dirty_hva(v->tracker, v->mem + 65536, 3 * 4096);
	if (ret == 0)
		ret = kvmdirty_mig_rate_sample(rate, &smp);
	if (ret < 0 || smp.pages != 3 || smp.nr_vcpus != 1) {
		fprintf(stderr, "consumer-migrate: the rate sampler: %s, %" PRIu64 " pages (3 written), %u vCPUs\n",
			strerror(ret < 0 ? -ret : 0), ret < 0 ? 0 : smp.pages, ret < 0 ? 0 : smp.nr_vcpus);
		kvmdirty_mig_rate_free(rate);
		return -EIO;
	}
	{
		/* the sample as a line and as JSON, the vCPU's part in each */
		char line[512], json[512];

		kvmdirty_mig_rate_format(&smp, false, line, sizeof(line));
		kvmdirty_mig_rate_format(&smp, true, json, sizeof(json));
		if (strncmp(line, "rate t_ms=", 10) || !strstr(line, " vcpu0=") || json[0] != '{' ||
		    !strstr(json, "\"vcpus\":[{\"pages_per_s\":")) {
			fprintf(stderr, "consumer-migrate: the rate's lines: '%s' and '%s'\n", line, json);
			kvmdirty_mig_rate_free(rate);
			return -EIO;
		}
	}
	kvmdirty_mig_rate_free(rate);
	return 0;
}

struct recv_job {
	struct vmm *v;
	const char *psk;
	bool postcopy;
	int lfd, ret;
	char err[512];
	/* post-copy: a page read by the VMM as soon as the guest runs here, and the figures at the end */
	unsigned char probe[4096];
	struct kvmdirty_mig_recv_result res;
	struct kvmdirty_mig_postcopy_stats st;
};

#define PROBE_OFF (MEM - 4096 * 3)

static void *receive(void *p)
{
	struct recv_job *j = p;
	struct kvmdirty_mig_recv_opts o = { .once = true, .psk_file = j->psk, .encrypt = true, .postcopy = j->postcopy };

	j->ret = kvmdirty_mig_recv(j->v->guest, j->lfd, &o, &j->res, j->err, sizeof(j->err));
	if (j->ret == 0 && j->res.postcopy) {
		/* the guest is here with pages missing: a read of one is served (a fault of the VMM's thread) */
		memcpy(j->probe, j->v->mem + PROBE_OFF, sizeof(j->probe));
		j->ret = kvmdirty_mig_postcopy_wait(j->v->guest, 60000, &j->st, j->err, sizeof(j->err));
	}
	return NULL;
}

/*
 * A source's events: as its first pass begins, the VMM writes 64 pages of
 * guest memory (a device's DMA: marked dirty with the tracker), then its
 * control asks for post-copy (an orchestrator's force-complete): those
 * pages at least are left for post-copy.
 */
struct asker {
	struct vmm *src;
	struct kvmdirty_mig_control *ctl;
	int ret; /* 1: not asked yet */
	char err[256];
};

#define DMA_PAGES 64

static void ask_postcopy(void *ctx, const char *line)
{
	struct asker *a = ctx;
	unsigned char *at = a->src->mem + PROBE_OFF - (DMA_PAGES - 1) * 4096;

	if (a->ret != 1 || !strstr(line, "\"event\":\"pass_started\""))
		return;
	memset(at, 0x5a, DMA_PAGES * 4096);
	if (kvmdirty_tracker_mark_dirty_hva(a->src->tracker, at, DMA_PAGES * 4096) < 0) {
		a->ret = -EIO;
		snprintf(a->err, sizeof(a->err), "kvmdirty_tracker_mark_dirty_hva failed");
		return;
	}
	a->ret = kvmdirty_mig_control_postcopy_start(a->ctl, a->err, sizeof(a->err));
}

/*
 * Migrate src to a new VM over a Unix socket, sealed and encrypted; with
 * postcopy, the source's control switches it at the first pass and the
 * destination waits for every page.  0, 77 or 1.
 */
static int migrate(struct vmm *src, const char *dir, bool postcopy)
{
	struct kvmdirty_mig_control_opts co = { 0 };
	struct asker ask = { .src = src, .ret = 1 };
	/* pre-copy compressed (the pages are patterns: they shrink) */
	struct kvmdirty_mig_send_opts so = { .encrypt = true, .postcopy = postcopy,
					     .compress = postcopy ? KVMDIRTY_MIG_COMPRESS_OFF : KVMDIRTY_MIG_COMPRESS_ZSTD };
	struct kvmdirty_mig_send_result res;
	struct recv_job j = { .lfd = -1, .postcopy = postcopy };
	struct vmm dst;
	char addr[4200], key[4200] = "", err[512];
	unsigned int saved = 0;
	pthread_t t;
	int ret;

	ret = vmm_new(&dst, false);
	if (ret) {
		vmm_free(&dst);
		return ret;
	}
	if (postcopy) {
		ret = kvmdirty_mig_control_new(&co, &ask.ctl, err, sizeof(err));
		if (ret < 0) {
			vmm_free(&dst);
			return fail("kvmdirty_mig_control_new", ret, err);
		}
		so.control = ask.ctl;
		so.event = ask_postcopy;
		so.event_ctx = &ask;
	}
	snprintf(addr, sizeof(addr), "unix:%s/sock", dir);
	/* a key both ends hold (genkey never writes over one) */
	snprintf(key, sizeof(key), "%s/key", dir);
	if (kvmdirty_mig_genkey(key, err, sizeof(err)) < 0 || kvmdirty_mig_genkey(key, NULL, 0) != -EEXIST) {
		ret = fail("kvmdirty_mig_genkey", EIO, err);
		goto out;
	}
	so.psk_file = j.psk = key;
	j.v = &dst;
	j.lfd = kvmdirty_mig_listen(addr, err, sizeof(err));
	if (j.lfd < 0 || pthread_create(&t, NULL, receive, &j)) {
		ret = fail("listen", j.lfd < 0 ? j.lfd : EAGAIN, err);
		goto out;
	}
	saved = src->live_saved;
	ret = kvmdirty_mig_send(src->guest, addr, &so, &res, err, sizeof(err));
	pthread_join(t, NULL);
	if (ret == 0 && (fcntl(j.lfd, F_GETFL) & O_NONBLOCK)) {
		ret = fail("kvmdirty_mig_recv: the listening fd was left non-blocking", EINVAL, NULL);
		goto out;
	}
	if (ret != 0 || res.outcome != KVMDIRTY_MIG_THERE) {
		ret = fail("kvmdirty_mig_send", ret, err);
		goto out;
	}
	if (j.ret != 0) {
		ret = fail(postcopy ? "kvmdirty_mig_recv or kvmdirty_mig_postcopy_wait" : "kvmdirty_mig_recv", j.ret, j.err);
		goto out;
	}
	if (postcopy) {
		char e2[256] = "";
		int after = kvmdirty_mig_control_postcopy_start(ask.ctl, e2, sizeof(e2));

		if (ask.ret != 0 || !res.postcopy || !j.res.postcopy || strcmp(res.postcopy_why, "asked") ||
		    j.st.left < DMA_PAGES || !j.st.complete || j.st.missing || j.st.placed != j.st.left || after != -ENOENT) {
			fprintf(stderr,
				"consumer-migrate: post-copy: postcopy-start returned %d (%s), source post-copy %d (%s), "
				"destination %d, complete %d, %" PRIu64 " of %" PRIu64 " pages placed, %" PRIu64
				" missing; postcopy-start after it returned %d (%s)\n",
				ask.ret, ask.err, res.postcopy, res.postcopy_why ? res.postcopy_why : "-", j.res.postcopy,
				j.st.complete, j.st.placed, j.st.left, j.st.missing, after, e2);
			ret = 1;
			goto out;
		}
		if (memcmp(j.probe, src->mem + PROBE_OFF, sizeof(j.probe))) {
			fprintf(stderr, "consumer-migrate: post-copy: the page the VMM read at once differs\n");
			ret = 1;
			goto out;
		}
	}
	if (!postcopy && (!res.zpages || res.zwire_bytes >= res.zraw_bytes)) {
		fprintf(stderr, "consumer-migrate: compressed: %" PRIu64 " pages, %" PRIu64 " bytes in %" PRIu64 "\n",
			res.zpages, res.zraw_bytes, res.zwire_bytes);
		ret = 1;
		goto out;
	}
	ret = same(&dst, src, "after the migration");
	if (ret == 0 && (src->live_saved - saved != 1 || dst.live_loaded != 1 || memcmp(dst.fb, src->fb, FB))) {
		fprintf(stderr, "consumer-migrate: the frame buffer given before the pause: saved %u times, loaded %u, %s\n",
			src->live_saved - saved, dst.live_loaded, memcmp(dst.fb, src->fb, FB) ? "differs" : "the same");
		ret = 1;
	}
	if (ret == 0 && postcopy)
		printf("consumer-migrate: migrated by post-copy (its control asked): %" PRIu64 " pages left at the switch, "
		       "%" PRIu64 " faults, every page in after %.1f ms; memory, registers and devices as the source's\n",
		       j.st.left, j.st.faults, j.st.complete_ms);
	else if (ret == 0)
		printf("consumer-migrate: migrated %" PRIu64 " pages in %" PRIu64 " passes (a key of genkey's, encrypted, "
		       "%" PRIu64 " pages compressed: %" PRIu64 " bytes in %" PRIu64 "), %.1f ms downtime; memory, registers, "
		       "TSC_AUX, the IOAPIC and devices arrived, the frame buffer before the pause\n",
		       res.pages, res.passes, res.zpages, res.zraw_bytes, res.zwire_bytes, res.downtime_ms);
out:
	if (j.lfd >= 0)
		close(j.lfd);
	if (*key)
		unlink(key);
	unlink(addr + 5);
	vmm_free(&dst);
	kvmdirty_mig_control_free(ask.ctl);
	return ret;
}

static void lazy_event(void *ctx, enum kvmdirty_mig_lazy_event ev, const char *line)
{
	(void)line;
	*(int *)ctx = ev == KVMDIRTY_MIG_LAZY_RESIDENT ? 1 : -1;
}

/*
 * The same chain restored lazily into another VM: the VMM's own read of
 * guest memory is served before the fill has placed it, then every page,
 * register and device is as the source's once resident.  0, 77 or 1.
 */
static int restore_lazily(struct vmm *src, const char *const *chain)
{
	int seen = 0;
	struct kvmdirty_mig_lazy_opts lo = { .event = lazy_event, .ctx = &seen };
	struct kvmdirty_mig_lazy_stats st;
	struct kvmdirty_mig_lazy *lazy = NULL;
	unsigned char probe[4096];
	struct vmm dst;
	char err[512];
	int ret;

	ret = vmm_new(&dst, false);
	if (ret) {
		vmm_free(&dst);
		return ret;
	}
	ret = kvmdirty_mig_restore_lazy(dst.guest, chain, 2, &lo, &lazy, err, sizeof(err));
	if (ret == -EPERM || ret == -ENOSYS) {
		printf("consumer-migrate: the lazy restore left out: %s\n", err);
		vmm_free(&dst);
		return 0;
	}
	if (ret < 0) {
		vmm_free(&dst);
		return fail("kvmdirty_mig_restore_lazy", ret, err);
	}
	/* a page the diff rewrote, read by the VMM at once: served from the diff, not the full snapshot */
	memcpy(probe, dst.mem + 8192, sizeof(probe));
	ret = kvmdirty_mig_lazy_wait(lazy, 60000, err, sizeof(err));
	kvmdirty_mig_lazy_stats(lazy, &st);
	if (ret < 0)
		ret = fail("kvmdirty_mig_lazy_wait", ret, err);
	else if (memcmp(probe, src->mem + 8192, sizeof(probe)) || !st.resident || seen != 1 || !st.data_pages ||
		 kvmdirty_mig_lazy_bucket_us(0) <= 0) {
		fprintf(stderr,
			"consumer-migrate: the lazy restore: the page read at once %s, resident %d, event %d, %" PRIu64
			" data pages\n",
			memcmp(probe, src->mem + 8192, sizeof(probe)) ? "differs" : "the same", st.resident, seen,
			st.data_pages);
		ret = 1;
	} else
		ret = same(&dst, src, "after the lazy restore");
	if (ret == 0)
		printf("consumer-migrate: restored lazily: %" PRIu64 " faults, %" PRIu64 " pages filled, resident in %.1f ms; "
		       "memory, registers and devices as they were\n",
		       st.faults, st.filled, st.resident_ms);
	kvmdirty_mig_lazy_free(lazy);
	vmm_free(&dst);
	return ret;
}

static int snapshot_restore(struct vmm *src, const char *dir)
{
	struct kvmdirty_mig_snap_opts so = { 0 };
	struct kvmdirty_mig_snap_result r0, r1;
	struct kvmdirty_mig_snap *snap;
	char prefix[4200], err[512];
	const char *chain[2];
	struct vmm dst;
	uint64_t pages;
	int ret;

	snprintf(prefix, sizeof(prefix), "%s/snap", dir);
	so.prefix = prefix;
	ret = kvmdirty_mig_snap_new(src->guest, &so, &snap, err, sizeof(err));
	if (ret < 0)
		return fail("kvmdirty_mig_snap_new", ret, err);
	ret = kvmdirty_mig_snap_take(snap, &r0, err, sizeof(err));
	if (ret == 0) {
		/* what the diff must carry: a page, a register, the devices */
		memset(src->mem + 8192, 0x5a, 4096);
		/* the VMM's own write to guest memory: KVM does not see it, the tracker must be told */
		ret = kvmdirty_tracker_mark_dirty_hva(src->tracker, src->mem + 8192, 4096);
		if (ret == 0)
			ret = rate_sees(src);
		strcpy(src->devices, "serial: lcr=0x03 after the full snapshot");
		src->fb[12345] ^= 0xff; /* the frame buffer too: the diff's copy of it counts */
		if (ret == 0)
			ret = vcpu_set(src, 0xd1ff, 0x4100000007ull) ? -EIO : 0;
	}
	if (ret == 0)
		ret = kvmdirty_mig_snap_take(snap, &r1, err, sizeof(err));
	kvmdirty_mig_snap_free(snap);
	if (ret < 0)
		return fail("kvmdirty_mig_snap_take", ret, err);
	chain[0] = r0.path;
	chain[1] = r1.path;
	/* every copy of every page of the chain against its hash, no guest needed */
	ret = kvmdirty_mig_verify(chain, 2, &pages, err, sizeof(err));
	if (ret < 0 || pages < MEM / 4096 * 7 / 8) {
		unlink(r0.path);
		unlink(r1.path);
		return fail("kvmdirty_mig_verify", ret ? ret : EPROTO, err);
	}
	ret = vmm_new(&dst, false);
	if (ret == 0) {
		ret = kvmdirty_mig_restore(dst.guest, chain, 2, &pages, err, sizeof(err));
		ret = ret < 0 ? fail("kvmdirty_mig_restore", ret, err) : same(&dst, src, "after the restore");
		/* a snapshot keeps the live part too: it has no "before the pause" */
		if (ret == 0 && (dst.live_loaded != 1 || memcmp(dst.fb, src->fb, FB))) {
			fprintf(stderr, "consumer-migrate: after the restore: the frame buffer loaded %u times, %s\n",
				dst.live_loaded, memcmp(dst.fb, src->fb, FB) ? "differs" : "the same");
			ret = 1;
		}
	}
	if (ret == 0)
		printf("consumer-migrate: snapshots %" PRIu64 " (full) and %" PRIu64 " (diff), verified, restored: %" PRIu64
		       " pages read; memory, registers, TSC_AUX, the IOAPIC, devices and frame buffer as they were; "
		       "the rate sampler saw 3 pages\n",
		       r0.seq, r1.seq, pages);
	vmm_free(&dst);
	if (ret == 0)
		ret = restore_lazily(src, chain);
	unlink(r0.path);
	unlink(r1.path);
	return ret;
}

/*
 * Calls made wrong are refused at once, their outputs set: a snapshot
 * series of no guest, a receive on a datagram socket and on a file.
 */
static int misuse(struct vmm *v)
{
	struct kvmdirty_mig_snap *snap = (struct kvmdirty_mig_snap *)&snap;
	struct kvmdirty_mig_snap_result r;
	char err[256];
	int fd, ret;

	ret = kvmdirty_mig_snap_new(NULL, NULL, &snap, err, sizeof(err));
	if (ret != -EINVAL || snap)
		return fail("kvmdirty_mig_snap_new(NULL): not refused, or the series not NULL", EINVAL, NULL);
	memset(&r, 0x41, sizeof(r));
	if (kvmdirty_mig_snap_take(NULL, &r, NULL, 0) != -EINVAL || r.seq || r.path[0])
		return fail("kvmdirty_mig_snap_take(NULL): the result not cleared", EINVAL, NULL);
	fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	ret = kvmdirty_mig_recv(v->guest, fd, NULL, NULL, err, sizeof(err));
	close(fd);
	if (ret != -EPROTOTYPE)
		return fail("kvmdirty_mig_recv on a datagram socket", ret, err);
	fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	ret = kvmdirty_mig_recv(v->guest, fd, NULL, NULL, err, sizeof(err));
	close(fd);
	if (ret != -ENOTSOCK)
		return fail("kvmdirty_mig_recv on /dev/null", ret, err);
	return 0;
}

int main(void)
{
	char dir[] = "/tmp/consumer-migrate.XXXXXX";
	struct vmm src;
	unsigned int i;
	int ret;

	if (kvmdirty_mig_stream_version() < 1 || !*kvmdirty_mig_version_string()) {
		fprintf(stderr, "consumer-migrate: no version\n");
		return 1;
	}
	/* a bad call is refused with -EINVAL, nothing built */
	if (kvmdirty_mig_guest_new(NULL, NULL, NULL, 0, 0, NULL, NULL, &src.guest) != -EINVAL || src.guest) {
		fprintf(stderr, "consumer-migrate: kvmdirty_mig_guest_new(NULL) was not refused\n");
		return 1;
	}
	ret = vmm_new(&src, true);
	if (ret || !mkdtemp(dir)) {
		vmm_free(&src);
		return ret ? ret : fail("mkdtemp", errno, NULL);
	}
	/* the guest's memory: a pattern, one page in 8 left zero */
	for (i = 0; i < MEM / 4096; i++)
		if (i % 8)
			memset(src.mem + (size_t)i * 4096, (int)(i * 7 + 1), 4096);
	strcpy(src.devices, "serial: lcr=0x03 ier=0x01 scratch=0x42");
	for (i = 0; i < FB; i++)
		src.fb[i] = (unsigned char)(i * 13 + (i >> 12));
	ret = vcpu_set(&src, 0xfeedfacecafe, 0x3300001234ull);
	if (ret == 0)
		ret = misuse(&src);
	/* snapshots first: a guest that moved stays paused at its source */
	if (ret == 0)
		ret = snapshot_restore(&src, dir);
	if (ret == 0)
		ret = migrate(&src, dir, false);
	if (ret == 0 && (src.paused < 3 || src.resumed < 2)) {
		fprintf(stderr, "consumer-migrate: pause called %u times, resume %u\n", src.paused, src.resumed);
		ret = 1;
	}
	vmm_free(&src);
	/* a second guest, moved by post-copy */
	if (ret == 0) {
		ret = vmm_new(&src, true);
		for (i = 0; ret == 0 && i < MEM / 4096; i++)
			if (i % 5)
				memset(src.mem + (size_t)i * 4096, (int)(i * 3 + 2), 4096);
		if (ret == 0) {
			strcpy(src.devices, "serial: lcr=0x07");
			ret = vcpu_set(&src, 0xabad1dea, 0x77);
		}
		if (ret == 0)
			ret = migrate(&src, dir, true);
		vmm_free(&src);
	}
	rmdir(dir);
	printf("consumer-migrate: linked against libkvmdirty-migrate %s, stream version %u: %s\n",
	       kvmdirty_mig_version_string(), kvmdirty_mig_stream_version(), ret ? "FAILED" : "ok");
	return ret;
}
