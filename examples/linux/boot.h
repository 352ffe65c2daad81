/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_LINUX_BOOT_H
#define KVMDIRTY_LINUX_BOOT_H

/*
 * The x86 PC that a stock Linux kernel needs to boot to its initramfs, as
 * kvmdirty-linux lays it out in guest memory (one region from gpa 0):
 *
 *   0x000500  GDT: __BOOT_CS (0x10) 64-bit code, __BOOT_DS (0x18) data
 *   0x007000  boot_params ("zero page"): setup header, e820 map
 *   0x009000  page tables: 4 GiB identity-mapped with 2 MiB pages
 *   0x020000  kernel command line
 *   0x09fc00  MP table (Intel MultiProcessor spec 1.4): the vCPUs, the
 *             IOAPIC and the ISA interrupts; e820 reserves 0x9fc00-1 MiB
 *   0x100000  the kernel's protected-mode part (bzImage after its setup)
 *   top       the initramfs, page-aligned, below the end of memory
 *
 * The bootstrap vCPU starts at the 64-bit entry point (load address +
 * 0x200) in long mode with RSI at boot_params (Documentation/arch/x86/
 * boot.rst, "64-bit Boot Protocol"); the others wait in KVM for the
 * INIT/SIPI the kernel sends them.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BOOT_MAX_MEM (3072ull << 20) /* below the 32-bit hole: LAPIC, IOAPIC, KVM's TSS */
#define BOOT_MIN_MEM (64ull << 20)
#define BOOT_MAX_VCPUS 64
#define BOOT_CMDLINE_MAX 4095

struct boot_files {
	const char *kernel; /* a bzImage (Debian's vmlinuz) */
	const char *initrd; /* NULL: none */
	const char *cmdline;
};

/*
 * Put kernel, initramfs, command line, boot_params, page tables, GDT and
 * MP table for vcpus vCPUs into mem (mem_size bytes, guest address 0).
 * 0, or -errno with one line in err naming the file or what does not fit.
 */
int boot_load(uint8_t *mem, uint64_t mem_size, unsigned int vcpus, const struct boot_files *f, char *err,
	      size_t len);

/* The bootstrap vCPU's registers and special registers for the 64-bit entry. 0 or -errno. */
int boot_setup_bsp(int vcpu_fd);

/*
 * KVM_SET_CPUID2 on vCPU id from the host's KVM_GET_SUPPORTED_CPUID
 * (cpuid, read once by kvm_host_supported_cpuid()), with the vCPU's APIC ID
 * where CPUID reports it, the hypervisor bit (which KVM leaves to the
 * VMM) and, where KVM has it (KVM_CAP_TSC_DEADLINE_TIMER), the LAPIC's
 * TSC-deadline mode, which KVM emulates but does not list; without
 * KVM's asynchronous page faults; with no_xsave, without XSAVE and what
 * needs it (AVX, AVX-512, protection keys).  0 or -errno.
 */
struct kvm_cpuid2;
int boot_set_cpuid(int vcpu_fd, const struct kvm_cpuid2 *cpuid, unsigned int id, bool tsc_deadline, bool no_xsave);

/* XCR0 set ahead to what the kernel will choose (see boot.c): 0 or -errno. */
int boot_setup_xcr0(int vcpu_fd, const struct kvm_cpuid2 *cpuid);

#endif
