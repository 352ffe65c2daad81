// SPDX-License-Identifier: MIT
/*
 * A vCPU's whole state through KVM's ioctls (guest.h), in the order KVM
 * needs it back: registers, XSAVE, XCR0, special registers, MSRs (all
 * but the TSC deadline), MP state, LAPIC, the TSC deadline (it is armed
 * against the LAPIC's timer mode), pending events, debug registers.  The
 * MSRs are those the host's KVM saves (KVM_GET_MSR_INDEX_LIST) and the
 * ones a kernel sets, each kept only where this vCPU reads it.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "errf.h"
#include "guest.h"

#define MSR_TSC_DEADLINE 0x6e0u

/* A kernel sets these; asked for even where the host's list leaves one out. */
static const uint32_t kernel_msrs[] = {
	0x10,	    /* IA32_TSC */
	0x11,	    /* kvmclock's first wall clock */
	0x12,	    /* ... and system time */
	0x174,	    /* SYSENTER_CS */
	0x175,	    /* SYSENTER_ESP */
	0x176,	    /* SYSENTER_EIP */
	0x277,	    /* PAT */
	0xc0000081, /* STAR */
	0xc0000082, /* LSTAR */
	0xc0000083, /* CSTAR */
	0xc0000084, /* SFMASK */
	0xc0000102, /* KERNEL_GS_BASE */
	0xc0000103, /* TSC_AUX */
	0x4b564d00, /* kvmclock: wall clock */
	0x4b564d01, /* kvmclock: system time */
	0x4b564d02, /* async page faults */
	0x4b564d03, /* steal time */
	0x4b564d04, /* PV EOI */
};

static struct {
	pthread_once_t once;
	uint32_t *index; /* ascending, no two the same */
	unsigned int n;
	bool listed; /* the host's list was read (else: the kernel's alone, and no host check) */
} host = { .once = PTHREAD_ONCE_INIT };

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

static void host_list(void)
{
	unsigned int nk = sizeof(kernel_msrs) / sizeof(kernel_msrs[0]), n = 0, i;
	struct kvm_msr_list probe = { 0 }, *l = NULL;
	int fd = open("/dev/kvm", O_RDWR | O_CLOEXEC);

	if (fd >= 0 && ioctl(fd, KVM_GET_MSR_INDEX_LIST, &probe) < 0 && errno == E2BIG && probe.nmsrs < 4096) {
		l = calloc(1, sizeof(*l) + probe.nmsrs * sizeof(uint32_t));
		if (l) {
			l->nmsrs = probe.nmsrs;
			if (ioctl(fd, KVM_GET_MSR_INDEX_LIST, l) < 0)
				l->nmsrs = 0;
			else
				host.listed = true;
		}
	}
	if (fd >= 0)
		close(fd);
	host.index = calloc(nk + (l ? l->nmsrs : 0), sizeof(uint32_t));
	if (host.index) {
		for (i = 0; l && i < l->nmsrs; i++)
			host.index[n++] = l->indices[i];
		for (i = 0; i < nk; i++)
			host.index[n++] = kernel_msrs[i];
		qsort(host.index, n, sizeof(uint32_t), cmp_u32);
		for (i = 0; i < n; i++)
			if (!host.n || host.index[host.n - 1] != host.index[i])
				host.index[host.n++] = host.index[i];
	}
	free(l);
}

static bool host_knows(uint32_t index)
{
	return bsearch(&index, host.index, host.n, sizeof(uint32_t), cmp_u32) != NULL;
}

struct msrs {
	struct kvm_msrs hdr;
	struct kvm_msr_entry e[MIG_VCPU_MSRS];
};

/* The MSRs of the list this vCPU reads, into st (ascending, as the list is). */
static int save_msrs(int fd, struct mig_vcpu_state *st)
{
	struct msrs *m = calloc(1, sizeof(*m));
	unsigned int at = 0, k;
	int n, ret = 0;

	if (!m)
		return -ENOMEM;
	while (at < host.n) {
		unsigned int batch = host.n - at < MIG_VCPU_MSRS ? host.n - at : MIG_VCPU_MSRS;

		memset(m, 0, sizeof(*m));
		m->hdr.nmsrs = batch;
		for (k = 0; k < batch; k++)
			m->e[k].index = host.index[at + k];
		n = ioctl(fd, KVM_GET_MSRS, m);
		if (n < 0) {
			ret = -errno;
			break;
		}
		/* the first n were read; the one after them was not (this vCPU lacks it): skipped */
		if (st->nr_msrs + (unsigned int)n > MIG_VCPU_MSRS) {
			ret = -E2BIG;
			break;
		}
		memcpy(st->msrs + st->nr_msrs, m->e, (size_t)n * sizeof(m->e[0]));
		st->nr_msrs += (unsigned int)n;
		at += (unsigned int)n + ((unsigned int)n < batch);
	}
	free(m);
	return ret;
}

/* An optional part: saved (parts |= bit), absent from this vCPU (EINVAL: no in-kernel LAPIC, no XSAVE), or a failure. */
static int save_part(int fd, unsigned long req, void *part, uint32_t bit, struct mig_vcpu_state *st)
{
	if (ioctl(fd, req, part) == 0) {
		st->parts |= bit;
		return 0;
	}
	if (errno == EINVAL || errno == ENXIO) {
		memset(part, 0, _IOC_SIZE(req));
		return 0;
	}
	return -errno;
}

int mig_vcpu_save_kvm(int fd, struct mig_vcpu_state *st)
{
	int ret;

	pthread_once(&host.once, host_list);
	if (!host.index)
		return -ENOMEM;
	memset(st, 0, sizeof(*st));
	if (ioctl(fd, KVM_GET_REGS, &st->regs) < 0 || ioctl(fd, KVM_GET_XSAVE, &st->xsave) < 0 ||
	    ioctl(fd, KVM_GET_SREGS, &st->sregs) < 0)
		return -errno;
	if ((ret = save_part(fd, KVM_GET_XCRS, &st->xcrs, MIG_VS_XCRS, st)) < 0 || (ret = save_msrs(fd, st)) < 0 ||
	    (ret = save_part(fd, KVM_GET_MP_STATE, &st->mp_state, MIG_VS_MP_STATE, st)) < 0 ||
	    (ret = save_part(fd, KVM_GET_LAPIC, &st->lapic, MIG_VS_LAPIC, st)) < 0 ||
	    (ret = save_part(fd, KVM_GET_VCPU_EVENTS, &st->events, MIG_VS_EVENTS, st)) < 0 ||
	    (ret = save_part(fd, KVM_GET_DEBUGREGS, &st->debugregs, MIG_VS_DEBUGREGS, st)) < 0)
		return ret;
	return 0;
}

/* Whether vCPU fd reads MSR e's value already (a write KVM refuses is then nothing lost). */
static bool msr_holds(int fd, const struct kvm_msr_entry *e)
{
	struct {
		struct kvm_msrs hdr;
		struct kvm_msr_entry e;
	} m = { .hdr.nmsrs = 1, .e.index = e->index };

	return ioctl(fd, KVM_GET_MSRS, &m) == 1 && m.e.data == e->data;
}

/*
 * st's MSRs, those other than the TSC deadline (late: false) or it alone
 * (late: true).  An MSR KVM will not take (kvmclock's async-PF vector on
 * a vCPU without an in-kernel LAPIC, even as 0) is passed over where the
 * vCPU holds that value already; any other is -EINVAL.
 */
static int load_msrs(int fd, const struct mig_vcpu_state *st, bool late)
{
	struct msrs *m = calloc(1, sizeof(*m));
	unsigned int i, n = 0, at = 0;
	int ret = 0;

	if (!m)
		return -ENOMEM;
	for (i = 0; i < st->nr_msrs && i < MIG_VCPU_MSRS; i++)
		if ((st->msrs[i].index == MSR_TSC_DEADLINE) == late)
			m->e[n++] = st->msrs[i];
	while (at < n) {
		int set;

		m->hdr.nmsrs = n - at;
		memmove(m->e, m->e + at, (n - at) * sizeof(m->e[0]));
		n -= at;
		set = ioctl(fd, KVM_SET_MSRS, m);
		if (set < 0) {
			ret = -errno;
			break;
		}
		if ((unsigned int)set < n && !msr_holds(fd, &m->e[set])) {
			ret = -EINVAL;
			break;
		}
		at = (unsigned int)set + 1;
	}
	free(m);
	return ret;
}

int mig_vcpu_load_kvm(int fd, const struct mig_vcpu_state *st)
{
	struct kvm_vcpu_events ev = st->events;
	int ret;

	if (ioctl(fd, KVM_SET_REGS, &st->regs) < 0 || ioctl(fd, KVM_SET_XSAVE, &st->xsave) < 0)
		return -errno;
	if ((st->parts & MIG_VS_XCRS) && ioctl(fd, KVM_SET_XCRS, &st->xcrs) < 0)
		return -errno;
	if (ioctl(fd, KVM_SET_SREGS, &st->sregs) < 0)
		return -errno;
	if ((ret = load_msrs(fd, st, false)) < 0)
		return ret;
	if ((st->parts & MIG_VS_MP_STATE) && ioctl(fd, KVM_SET_MP_STATE, &st->mp_state) < 0)
		return -errno;
	if ((st->parts & MIG_VS_LAPIC) && ioctl(fd, KVM_SET_LAPIC, &st->lapic) < 0)
		return -errno;
	if ((ret = load_msrs(fd, st, true)) < 0)
		return ret;
	/* what GET said it filled in, and the NMI and SIPI fields it always fills */
	ev.flags |= KVM_VCPUEVENT_VALID_NMI_PENDING | KVM_VCPUEVENT_VALID_SIPI_VECTOR;
	if ((st->parts & MIG_VS_EVENTS) && ioctl(fd, KVM_SET_VCPU_EVENTS, &ev) < 0)
		return -errno;
	if ((st->parts & MIG_VS_DEBUGREGS) && ioctl(fd, KVM_SET_DEBUGREGS, &st->debugregs) < 0)
		return -errno;
	return 0;
}

int mig_vcpu_state_host_check(const struct mig_vcpu_state *st, const char *what, char *err, size_t len)
{
	unsigned int i;

	pthread_once(&host.once, host_list);
	if (!host.listed)
		return 0; /* no KVM here to ask: its load will say */
	for (i = 0; i < st->nr_msrs && i < MIG_VCPU_MSRS; i++)
		if (!host_knows(st->msrs[i].index))
			return mig_errf(err, len, -EPROTO, "%s.msrs[%u]: MSR 0x%" PRIx32 " is not one this host's KVM "
					"saves or the engine knows (KVM_GET_MSR_INDEX_LIST)", what, i, st->msrs[i].index);
	return 0;
}
