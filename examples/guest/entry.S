/* SPDX-License-Identifier: MIT */
/*
 * Guest entry point, placed first at GUEST_CODE_GPA.  The host enters
 * 64-bit mode directly through KVM_SET_SREGS (paging on, ring 3 or ring 0)
 * with rsp at this vCPU's stack and rdi at its struct guest_vcpu, so there
 * is nothing to switch: call the C workload, which never returns.
 *
 * Then, at fixed offsets the host points its IDT at, the CPL-0 handlers
 * of the state guest (GUEST_F_STATE, guest-abi.h).
 */
#include "guest-abi.h"

	.section .text.entry, "ax"
	.globl _start
_start:
	and	$-16, %rsp		/* the ABI's call alignment */
	call	guest_main
1:	jmp	1b

/*
 * The LAPIC timer (GUEST_TIMER_VECTOR), at CPL 0 on this vCPU's own stack
 * (its TSS's RSP0), whose place says which vCPU it is: read PAT and
 * kvmclock's MSR (RDMSR: CPL 0 only) into its mailbox for the workload to
 * check, count a tick there, EOI through the xAPIC page.  (Not TSC_AUX:
 * a PVM-based KVM refuses the guest's RDMSR of it, and RDTSCP at CPL 3
 * shows the host's.)
 */
	.org	GUEST_TIMER_OFF
	push	%rax
	push	%rcx
	push	%rdx
	push	%rsi
	mov	$GUEST_KSTACK_TOP, %rsi
	sub	%rsp, %rsi
	shr	$GUEST_KSTACK_SHIFT, %rsi
	shl	$8, %rsi		/* 256 bytes a mailbox */
	add	$GUEST_STATE_MAILBOX_GPA, %rsi
	mov	$0x277, %ecx		/* IA32_PAT */
	rdmsr
	mov	%eax, GUEST_MAILBOX_SEEN_OFF(%rsi)
	mov	%edx, GUEST_MAILBOX_SEEN_OFF + 4(%rsi)
	mov	$0x4b564d01, %ecx	/* MSR_KVM_SYSTEM_TIME_NEW */
	rdmsr
	mov	%eax, GUEST_MAILBOX_SEEN_OFF + 8(%rsi)
	mov	%edx, GUEST_MAILBOX_SEEN_OFF + 12(%rsi)
	lock incq GUEST_MAILBOX_TICKS_OFF(%rsi)
	mov	$0xfee000b0, %eax	/* the LAPIC's EOI register */
	movl	$0, (%rax)
	pop	%rsi
	pop	%rdx
	pop	%rcx
	pop	%rax
	iretq

/* A spurious interrupt (GUEST_SPURIOUS_VECTOR): no EOI. */
	.org	GUEST_SPURIOUS_OFF
	iretq

/*
 * SYSCALL (GUEST_F_SYSCALL): here at CPL 0 through LSTAR, on the caller's
 * stack (nothing switches it: a test guest's), rdi its mailbox, rcx and
 * r11 its return address and flags: count the call, read TSC_AUX into the
 * mailbox, SYSRET.
 */
	.org	GUEST_SYSCALL_OFF
	push	%rcx
	push	%rdx
	push	%rax
	mov	$0xc0000103, %ecx	/* IA32_TSC_AUX */
	rdmsr
	mov	%eax, GUEST_MAILBOX_SEEN_AUX_OFF(%rdi)
	mov	%edx, GUEST_MAILBOX_SEEN_AUX_OFF + 4(%rdi)
	lock incq GUEST_MAILBOX_SYSCALLS_OFF(%rdi)
	pop	%rax
	pop	%rdx
	pop	%rcx
	sysretq
