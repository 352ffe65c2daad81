// SPDX-License-Identifier: MIT
/*
 * Loading a stock Linux kernel (bzImage) with the 64-bit boot protocol:
 * Documentation/arch/x86/boot.rst for the setup header and boot_params,
 * the Intel MultiProcessor Specification 1.4 for the MP table that tells
 * the kernel its CPUs and interrupt wiring without ACPI.  Offsets into
 * boot_params are the kernel's (arch/x86/include/uapi/asm/bootparam.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <linux/kvm.h>

#include "../common/say.h"
#include "boot.h"

#define GDT_GPA 0x500ull
#define ZERO_PAGE_GPA 0x7000ull
#define PML4_GPA 0x9000ull
#define CMDLINE_GPA 0x20000ull
#define MPTABLE_GPA 0x9fc00ull
#define KERNEL_GPA 0x100000ull
#define LOAD_PHYSICAL_ADDR 0x1000000ull /* where a relocatable kernel decompresses at the lowest */

/* boot_params: offsets of the fields set here */
#define BP_E820_ENTRIES 0x1e8
#define BP_SETUP_SECTS 0x1f1
#define BP_VID_MODE 0x1fa
#define BP_JUMP_END 0x201 /* the setup header ends at 0x202 + this byte */
#define BP_HEADER 0x202
#define BP_VERSION 0x206
#define BP_TYPE_OF_LOADER 0x210
#define BP_RAMDISK_IMAGE 0x218
#define BP_RAMDISK_SIZE 0x21c
#define BP_CMD_LINE_PTR 0x228
#define BP_INITRD_ADDR_MAX 0x22c
#define BP_XLOADFLAGS 0x236
#define BP_CMDLINE_SIZE 0x238
#define BP_INIT_SIZE 0x260
#define BP_HEADER_MAX 0x268 /* as much of a newer header as this loader knows */
#define BP_E820_TABLE 0x2d0
#define XLF_KERNEL_64 (1u << 0)
#define E820_RAM 1
#define E820_RESERVED 2

static void put16(uint8_t *p, uint16_t v) { memcpy(p, &v, 2); }
static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint16_t get16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static uint32_t get32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }

/* A whole file into a malloc()ed buffer: 0 or -errno said. */
static int slurp(const char *what, const char *path, uint8_t **ret_buf, uint64_t *ret_len, uint64_t max, char *err,
		 size_t len)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	uint64_t got = 0;
	struct stat st;
	uint8_t *buf;
	ssize_t n;

	if (fd < 0)
		return say(err, len, -errno, "%s '%s': %s", what, path, strerror(errno));
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size > max) {
		int e = S_ISREG(st.st_mode) ? -EFBIG : -EINVAL;

		close(fd);
		return say(err, len, e, "%s '%s': %s", what, path,
			   e == -EFBIG ? "larger than the guest's memory" : "not a regular file");
	}
	buf = malloc(st.st_size ? (size_t)st.st_size : 1);
	if (!buf) {
		close(fd);
		return say(err, len, -ENOMEM, "%s '%s': out of memory", what, path);
	}
	while (got < (uint64_t)st.st_size && (n = read(fd, buf + got, (size_t)st.st_size - got)) > 0)
		got += (uint64_t)n;
	close(fd);
	if (got != (uint64_t)st.st_size) {
		free(buf);
		return say(err, len, -EIO, "%s '%s': short read", what, path);
	}
	*ret_buf = buf;
	*ret_len = got;
	return 0;
}

static uint8_t checksum(const uint8_t *p, size_t n)
{
	uint8_t s = 0;

	while (n--)
		s += *p++;
	return (uint8_t)-s;
}

/*
 * The MP table: a processor entry per vCPU (APIC ID = vCPU id, the first
 * the bootstrap one), one ISA bus, the IOAPIC (KVM's, at 0xfec00000, ID
 * after the vCPUs'), ISA IRQ n to IOAPIC pin n (KVM's default GSI
 * routing), ExtINT to LINT0 and NMI to LINT1.  Returns its bytes.
 */
static size_t mptable(uint8_t *p, unsigned int vcpus)
{
	uint8_t *cfg = p + 16, *e = cfg + 44;
	uint16_t entries = 0;
	unsigned int i;

	memset(p, 0, 16 + 44 + vcpus * 20 + 8 + 8 + 16 * 8 + 2 * 8);
	for (i = 0; i < vcpus; i++, entries++, e += 20) {
		e[0] = 0;			   /* processor */
		e[1] = (uint8_t)i;		   /* local APIC ID */
		e[2] = 0x14;			   /* local APIC version */
		e[3] = 1 | (i == 0 ? 2 : 0);	   /* enabled, bootstrap */
		put32(e + 4, 0x600);		   /* signature: family 6 */
		put32(e + 8, (1u << 0) | (1u << 9)); /* feature flags: FPU, APIC */
	}
	e[0] = 1; /* bus 0: ISA */
	memcpy(e + 2, "ISA   ", 6);
	e += 8, entries++;
	e[0] = 2; /* the IOAPIC */
	e[1] = (uint8_t)vcpus;
	e[2] = 0x11;
	e[3] = 1;
	put32(e + 4, 0xfec00000);
	e += 8, entries++;
	for (i = 0; i < 16; i++, e += 8, entries++) {
		e[0] = 3; /* I/O interrupt: INT, conforming polarity and trigger */
		e[4] = 0; /* bus */
		e[5] = (uint8_t)i;
		e[6] = (uint8_t)vcpus;
		e[7] = (uint8_t)i;
	}
	e[0] = 4, e[1] = 3, e[6] = 0xff, e[7] = 0; /* local interrupt: ExtINT to LINT0 */
	e += 8, entries++;
	e[0] = 4, e[1] = 1, e[6] = 0xff, e[7] = 1; /* NMI to LINT1 */
	e += 8, entries++;

	memcpy(cfg, "PCMP", 4);
	put16(cfg + 4, (uint16_t)(e - cfg));
	cfg[6] = 4; /* spec 1.4 */
	memcpy(cfg + 8, "KVMDIRTY", 8);
	memcpy(cfg + 16, "LINUX-GUEST ", 12);
	put16(cfg + 34, entries);
	put32(cfg + 36, 0xfee00000);
	cfg[7] = checksum(cfg, (size_t)(e - cfg));

	memcpy(p, "_MP_", 4);
	put32(p + 4, (uint32_t)(MPTABLE_GPA + 16));
	p[8] = 1; /* 16 bytes */
	p[9] = 4;
	p[10] = checksum(p, 16);
	return (size_t)(e - p);
}

static void e820_add(uint8_t *zp, uint64_t addr, uint64_t size, uint32_t type)
{
	uint8_t *e = zp + BP_E820_TABLE + zp[BP_E820_ENTRIES] * 20;

	put64(e, addr);
	put64(e + 8, size);
	put32(e + 16, type);
	zp[BP_E820_ENTRIES]++;
}

/* 4 GiB identity-mapped, 2 MiB pages: the PML4, one PDPT, four page directories. */
static void page_tables(uint8_t *mem)
{
	uint64_t *pml4 = (uint64_t *)(mem + PML4_GPA), *pdpt = pml4 + 512, *pd = pdpt + 512;
	unsigned int i;

	memset(pml4, 0, 6 * 4096);
	pml4[0] = (PML4_GPA + 0x1000) | 3;
	for (i = 0; i < 4; i++)
		pdpt[i] = (PML4_GPA + 0x2000 + i * 0x1000ull) | 3;
	for (i = 0; i < 4 * 512; i++)
		pd[i] = ((uint64_t)i << 21) | 0x83; /* present, writable, 2 MiB */
}

int boot_load(uint8_t *mem, uint64_t mem_size, unsigned int vcpus, const struct boot_files *f, char *err,
	      size_t len)
{
	uint64_t klen = 0, ilen = 0, pm_off, pm_len, initrd_gpa = 0, top, need;
	uint8_t *k = NULL, *initrd = NULL, *zp = mem + ZERO_PAGE_GPA;
	uint32_t init_size, cmdline_max, addr_max;
	size_t clen = strlen(f->cmdline), hdr_end;
	unsigned int sects;
	uint16_t version;
	int ret;

	if (mem_size < BOOT_MIN_MEM || mem_size > BOOT_MAX_MEM || !vcpus || vcpus > BOOT_MAX_VCPUS)
		return say(err, len, -EINVAL, "memory or vCPUs out of range");
	ret = slurp("--kernel", f->kernel, &k, &klen, mem_size, err, len);
	if (ret < 0)
		return ret;
	if (klen < 0x1000 || memcmp(k + BP_HEADER, "HdrS", 4)) {
		ret = say(err, len, -ENOEXEC, "--kernel '%s': not a bzImage (no \"HdrS\" setup header)", f->kernel);
		goto out;
	}
	version = get16(k + BP_VERSION);
	if (version < 0x20c || !(get16(k + BP_XLOADFLAGS) & XLF_KERNEL_64)) {
		ret = say(err, len, -ENOEXEC, "--kernel '%s': boot protocol %u.%02u without a 64-bit entry point "
					      "(2.12 and XLF_KERNEL_64 needed)", f->kernel, version >> 8, version & 0xff);
		goto out;
	}
	sects = k[BP_SETUP_SECTS] ? k[BP_SETUP_SECTS] : 4;
	pm_off = (sects + 1) * 512ull;
	init_size = get32(k + BP_INIT_SIZE);
	cmdline_max = get32(k + BP_CMDLINE_SIZE);
	addr_max = get32(k + BP_INITRD_ADDR_MAX);
	need = LOAD_PHYSICAL_ADDR + init_size;
	if (pm_off >= klen || KERNEL_GPA + (klen - pm_off) > mem_size || need > mem_size) {
		ret = say(err, len, -E2BIG, "--kernel '%s': needs %" PRIu64 " MiB of memory to decompress, the guest "
					    "has %" PRIu64, f->kernel, (need >> 20) + 1, mem_size >> 20);
		goto out;
	}
	pm_len = klen - pm_off;
	if (clen > cmdline_max || clen > BOOT_CMDLINE_MAX) {
		ret = say(err, len, -E2BIG, "--append: %zu bytes, the kernel takes %u at most", clen,
			  cmdline_max < BOOT_CMDLINE_MAX ? cmdline_max : BOOT_CMDLINE_MAX);
		goto out;
	}
	if (f->initrd) {
		ret = slurp("--initrd", f->initrd, &initrd, &ilen, mem_size, err, len);
		if (ret < 0)
			goto out;
		top = mem_size < (uint64_t)addr_max + 1 ? mem_size : (uint64_t)addr_max + 1;
		initrd_gpa = ilen <= top ? (top - ilen) & ~0xfffull : 0;
		if (initrd_gpa < need) {
			ret = say(err, len, -E2BIG, "--initrd '%s': %" PRIu64 " MiB do not fit in %" PRIu64
						    " MiB of memory above the kernel's %" PRIu64 " MiB",
				  f->initrd, (ilen >> 20) + 1, mem_size >> 20, (need >> 20) + 1);
			goto out;
		}
		memcpy(mem + initrd_gpa, initrd, ilen);
	}
	memcpy(mem + KERNEL_GPA, k + pm_off, pm_len);

	memset(zp, 0, 4096);
	hdr_end = 0x202 + k[BP_JUMP_END];
	if (hdr_end > BP_HEADER_MAX)
		hdr_end = BP_HEADER_MAX;
	memcpy(zp + BP_SETUP_SECTS, k + BP_SETUP_SECTS, hdr_end - BP_SETUP_SECTS);
	put16(zp + BP_VID_MODE, 0xffff);
	zp[BP_TYPE_OF_LOADER] = 0xff;
	put32(zp + BP_CMD_LINE_PTR, (uint32_t)CMDLINE_GPA);
	put32(zp + BP_RAMDISK_IMAGE, (uint32_t)initrd_gpa);
	put32(zp + BP_RAMDISK_SIZE, (uint32_t)ilen);
	e820_add(zp, 0, MPTABLE_GPA, E820_RAM);
	e820_add(zp, MPTABLE_GPA, KERNEL_GPA - MPTABLE_GPA, E820_RESERVED);
	e820_add(zp, KERNEL_GPA, mem_size - KERNEL_GPA, E820_RAM);
	memcpy(mem + CMDLINE_GPA, f->cmdline, clen + 1);

	page_tables(mem);
	memset(mem + GDT_GPA, 0, 32);
	((uint64_t *)(mem + GDT_GPA))[2] = 0x00af9b000000ffffull; /* __BOOT_CS: 64-bit code */
	((uint64_t *)(mem + GDT_GPA))[3] = 0x00cf93000000ffffull; /* __BOOT_DS: flat data */
	mptable(mem + MPTABLE_GPA, vcpus);
	ret = 0;
out:
	free(k);
	free(initrd);
	return ret;
}

int boot_setup_bsp(int fd)
{
	struct kvm_segment code = { .base = 0, .limit = 0xffffffff, .selector = 0x10, .type = 0xb, .present = 1,
				    .s = 1, .l = 1, .g = 1 };
	struct kvm_segment data = { .base = 0, .limit = 0xffffffff, .selector = 0x18, .type = 0x3, .present = 1,
				    .s = 1, .db = 1, .g = 1 };
	struct kvm_regs regs = { .rflags = 2, .rip = KERNEL_GPA + 0x200, .rsi = ZERO_PAGE_GPA };
	struct kvm_sregs sregs;

	if (ioctl(fd, KVM_GET_SREGS, &sregs) < 0)
		return -errno;
	sregs.cs = code;
	sregs.ds = sregs.es = sregs.fs = sregs.gs = sregs.ss = data;
	sregs.gdt.base = GDT_GPA;
	sregs.gdt.limit = 4 * 8 - 1;
	sregs.cr3 = PML4_GPA;
	sregs.cr4 = 1u << 5;				     /* PAE */
	sregs.cr0 = (1u << 0) | (1u << 4) | (1u << 5) | (1u << 31); /* PE, ET, NE, PG */
	sregs.efer = (1u << 8) | (1u << 10);		     /* LME, LMA */
	if (ioctl(fd, KVM_SET_SREGS, &sregs) < 0 || ioctl(fd, KVM_SET_REGS, &regs) < 0)
		return -errno;
	return 0;
}

/*
 * KVM's asynchronous page faults, left out: a guest task that waits on one
 * waits for a token only the KVM that issued it can complete.  A
 * destination's KVM sends a "wake every waiter" when the guest's async-PF
 * MSR is loaded, but under kvm-under-tcg 3 of 3 moved guests stopped
 * (interrupts held off, that wake-up left in the LAPIC's IRR at vector
 * 0xf3); with the MSR loaded after the LAPIC and the vector instead
 * (QEMU's order), 1 of 2 panicked on an exception stack.  Its gain is for
 * hosts that swap guest memory, which a migrating VMM avoids anyway.  Bits of KVM_CPUID_FEATURES: ASYNC_PF (4),
 * ASYNC_PF_VMEXIT (10), ASYNC_PF_INT (14).
 */
#define KVM_FEATURES_NOT_OFFERED ((1u << 4) | (1u << 10) | (1u << 14))

/* What leaves with XSAVE: the AVX family and protection keys, whose state only XSAVE holds. */
static void hide_xsave(struct kvm_cpuid_entry2 *e)
{
	if (e->function == 1)
		e->ecx &= ~((1u << 12) | (1u << 26) | (1u << 27) | (1u << 28) | (1u << 29)); /* FMA XSAVE OSXSAVE AVX F16C */
	if (e->function == 7 && e->index == 0) {
		e->ebx &= ~((1u << 5) | (1u << 16) | (1u << 17) | (1u << 21) | (1u << 26) | (1u << 27) | (1u << 28) |
			    (1u << 30) | (1u << 31)); /* AVX2, AVX-512 */
		e->ecx &= ~((1u << 1) | (1u << 3) | (1u << 4) | (1u << 6) | (1u << 9) | (1u << 10) | (1u << 11) |
			    (1u << 12) | (1u << 14)); /* AVX-512, PKU, VAES, VPCLMULQDQ */
		e->edx &= ~((1u << 2) | (1u << 3) | (1u << 8) | (1u << 22) | (1u << 23) | (1u << 24) | (1u << 25));
	}
	if (e->function == 7 && e->index == 1)
		e->eax &= ~((1u << 4) | (1u << 5)); /* AVX-VNNI, AVX512_BF16 */
	if (e->function == 0xd)
		e->eax = e->ebx = e->ecx = e->edx = 0;
}

int boot_set_cpuid(int vcpu_fd, const struct kvm_cpuid2 *cpuid, unsigned int id, bool tsc_deadline, bool no_xsave)
{
	size_t size = sizeof(*cpuid) + cpuid->nent * sizeof(cpuid->entries[0]);
	struct kvm_cpuid2 *c = malloc(size);
	unsigned int i;
	int ret = 0;

	if (!c)
		return -ENOMEM;
	memcpy(c, cpuid, size);
	for (i = 0; i < c->nent; i++) {
		struct kvm_cpuid_entry2 *e = &c->entries[i];

		if (no_xsave)
			hide_xsave(e);
		if (e->function == 1) {
			e->ebx = (e->ebx & 0x00ffffffu) | (id << 24); /* initial APIC ID */
			e->ecx |= 1u << 31; /* a hypervisor: look at 0x40000000 (KVM's leaves, kvmclock) */
			if (tsc_deadline)
				e->ecx |= 1u << 24; /* KVM's LAPIC has the TSC-deadline mode: no timer to calibrate */
		}
	}
	if (ioctl(vcpu_fd, KVM_SET_CPUID2, c) < 0)
		ret = -errno;
	free(c);
	return ret;
}

/*
 * XCR0 as the kernel will set it: every XSAVE feature CPUID offers that
 * Linux enables (x87, SSE, AVX, the AVX-512 states, PKRU).  The kernel's
 * own XSETBV sets the same value, so this changes nothing where KVM sees
 * that XSETBV.  A nested hypervisor that lets it through unseen (QEMU's
 * emulated SVM, under which kvm-under-tcg runs KVM) leaves KVM holding
 * XCR0 = x87 only, which it loads at every entry: the guest's XSAVE
 * buffers then disagree with its XCR0 (a WARNING at boot, then a "bad
 * frame in rt_sigreturn").  Setting it here first keeps both the same.
 */
int boot_setup_xcr0(int vcpu_fd, const struct kvm_cpuid2 *cpuid)
{
	const uint64_t linux_user = 0x2e7; /* x87, SSE, YMM, opmask, ZMM_Hi256, Hi16_ZMM, PKRU */
	struct kvm_xcrs xcrs = { .nr_xcrs = 1 };
	uint64_t offered = 0;
	unsigned int i;

	for (i = 0; i < cpuid->nent; i++) {
		const struct kvm_cpuid_entry2 *e = &cpuid->entries[i];

		if (e->function == 1 && !(e->ecx & (1u << 26)))
			return 0; /* no XSAVE */
		if (e->function == 0xd && e->index == 0)
			offered = e->eax | (uint64_t)e->edx << 32;
	}
	xcrs.xcrs[0].xcr = 0;
	xcrs.xcrs[0].value = (offered & linux_user) | 1;
	if ((xcrs.xcrs[0].value & 0xe0) && (xcrs.xcrs[0].value & 0xe0) != 0xe0)
		xcrs.xcrs[0].value &= ~0xe0ull; /* the AVX-512 states go together or not at all */
	if ((xcrs.xcrs[0].value & 0x4) && !(xcrs.xcrs[0].value & 0x2))
		xcrs.xcrs[0].value &= ~0x4ull;
	return ioctl(vcpu_fd, KVM_SET_XCRS, &xcrs) < 0 ? -errno : 0;
}
