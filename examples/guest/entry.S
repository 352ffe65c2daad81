/* SPDX-License-Identifier: MIT */
/*
 * Guest entry point, placed first at GUEST_CODE_GPA.  The host enters
 * 64-bit mode directly through KVM_SET_SREGS (paging on, ring 3 or ring 0)
 * with rsp at this vCPU's stack and rdi at its struct guest_vcpu, so there
 * is nothing to switch: call the C workload, which never returns.
 */
	.section .text.entry, "ax"
	.globl _start
_start:
	and	$-16, %rsp		/* the ABI's call alignment */
	call	guest_main
1:	jmp	1b
