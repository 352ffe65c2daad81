/* SPDX-License-Identifier: MIT */
/*
 * A stand-in "kernel" for kvmdirty-linux, for hosts whose KVM cannot run a
 * stock Linux guest (this one's PVM-based KVM emulates guest CPL-0 code):
 * a bzImage with the x86 boot protocol's setup header (2.15, a 64-bit
 * entry point) whose protected-mode part is this loop, so that every
 * path of the VMM (the bzImage loader, the console both ways, the exit
 * port, migration, snapshots, restore, device state) runs wherever
 * /dev/kvm does.  tests/check-linux-stub.py drives it.
 *
 * Built as one .text section whose file offsets are the bzImage's:
 * objcopy -O binary.  The boot sector is empty; setup_sects = 1, so the
 * protected-mode part starts at file offset 0x400 and is loaded at 1 MiB,
 * its 64-bit entry 0x200 further on (0x100200), which kvmdirty-linux
 * enters in long mode with RSI = the boot_params.
 *
 * What it does, all at CPL 0 with interrupts off, through port I/O only:
 *   - prints "stub: up cmdline=<the command line>" and the e820 entry
 *     count from the boot_params;
 *   - takes the PIT's interrupt at 100 Hz through the PIC and counts it:
 *     the count must go on after a move;
 *   - writes 0x5a into the console's scratch register (0x3ff) and keeps a
 *     constant in R12: both must still hold after a move;
 *   - round after round, checks and rewrites one quadword in each of
 *     STUB_PAGES pages at 4 MiB: before round r (r >= 2) each page must
 *     hold (r-1) << 32 | its index, so a page a move lost or left stale is
 *     counted as bad;
 *   - writes each byte once the console's LSR says the transmitter is
 *     empty, as a driver does;
 *   - polls the console between rounds: 'f' prints 8 KiB of 'x' lines,
 *     'i' 16 KiB of 'y' lines through the UART's "transmitter empty"
 *     interrupt (then "stub: irq flood done", polled, once they are out),
 *     'p' prints
 *     "stub: round=R bad=B ticks=T", 'q' prints
 *     "stub: end rounds=R bad=B ticks=T scr=S status=X" and writes X to port
 *     0x501 (kvmdirty-linux's exit status): bit 0 a bad page, bit 1 R12
 *     changed, bit 2 the scratch register lost.
 */
#define STUB_DATA 0x400000
#define STUB_PAGES 1024
#define STUB_MAGIC 0x6b766d6469727479 /* "ytridmvk" */
#define COM1 0x3f8
#define EXIT_PORT 0x501
#define FLOOD_LINES 64 /* of 128 bytes: 8 KiB */
#define IDT 0x200000
#define IRQ_LEFT 0x201000  /* bytes the interrupt-driven flood has still to write */
#define IRQ_ON 0x201008	   /* that flood started and not yet reported done */
#define TICKS 0x201010	   /* the PIT's interrupts taken (IRQ 0, 100 Hz) */
#define PIT_DIVISOR 11932  /* 1193182 Hz / 100 */
#define IRQ_BYTES 16384

	.text
	.code64
image:
	/* the setup header (Documentation/arch/x86/boot.rst) */
	.org 0x1f1
	.byte 1				/* setup_sects */
	.org 0x1fe
	.word 0xaa55			/* boot_flag */
	.org 0x200
	.byte 0xeb, header_end - image - 0x202	/* jump: the header's length */
	.ascii "HdrS"
	.word 0x020f			/* version 2.15 */
	.org 0x22c
	.long 0x7fffffff		/* initrd_addr_max */
	.org 0x236
	.word 1				/* xloadflags: XLF_KERNEL_64 */
	.long 2048			/* cmdline_size */
	.org 0x260
	.long 0x100000			/* init_size */
	.org 0x268
header_end:

	/* the protected-mode part: file offset 0x400, guest address 0x100000 */
	.org 0x400
	.org 0x600			/* startup_64, at 0x100200 */
startup_64:
	cli
	mov $0x300000, %rsp
	mov %rsi, %r15			/* the boot_params */

	lea msg_up(%rip), %rdi
	call puts
	mov 0x228(%r15), %edi		/* cmd_line_ptr */
	call puts
	lea msg_e820(%rip), %rdi
	call puts
	movzbl 0x1e8(%r15), %edi	/* e820_entries */
	call puthex
	call newline

	mov $0x5a, %al
	mov $COM1 + 7, %dx
	out %al, %dx
	call setup_interrupts
	movabs $STUB_MAGIC, %r12
	xor %r13d, %r13d		/* rounds done */
	xor %r14d, %r14d		/* bad pages seen */

round:
	mov %r13, %r8
	shl $32, %r8			/* what the last round left: (r-1) << 32 | i */
	inc %r13
	mov %r13, %r9
	shl $32, %r9			/* what this round writes */
	mov $STUB_DATA, %rdi
	xor %ecx, %ecx
1:	mov %r8, %rdx
	or %rcx, %rdx
	test %r8, %r8
	jnz 2f
	xor %edx, %edx			/* before round 1: never written */
2:	cmp (%rdi), %rdx
	je 3f
	inc %r14
3:	mov %r9, %rdx
	or %rcx, %rdx
	mov %rdx, (%rdi)
	add $4096, %rdi
	inc %ecx
	cmp $STUB_PAGES, %ecx
	jb 1b

	cmpq $0, IRQ_ON			/* the interrupt-driven flood done: say so, once */
	je 5f
	cmpq $0, IRQ_LEFT
	jne 5f
	movq $0, IRQ_ON
	lea msg_irqdone(%rip), %rdi
	call puts
	call newline
5:	mov $COM1 + 5, %dx		/* LSR: data ready? */
	in %dx, %al
	test $1, %al
	jz round
	mov $COM1, %dx
	in %dx, %al
	cmp $'q', %al
	je finish
	cmp $'f', %al
	je flood
	cmp $'i', %al
	je irqflood
	cmp $'p', %al
	jne round
	lea msg_round(%rip), %rdi
	call counts
	call newline
	jmp round

irqflood:				/* 'i': IRQ_BYTES of 'y' lines, written as Linux's 8250 driver does */
	movq $IRQ_BYTES, IRQ_LEFT
	movq $1, IRQ_ON
	mov $COM1 + 1, %dx		/* IER = THRI: start_tx */
	mov $0x02, %al
	out %al, %dx
	jmp round

/*
 * At boot: an IDT (every vector to an IRETQ, IRQ 0 at vector 0x20 to
 * irq0_isr, IRQ 4 at 0x24 to irq4_isr), the PICs (the master at 0x20
 * with IRQs 0 and 4 unmasked, the slave all masked), the PIT's channel 0
 * at 100 Hz, interrupts on.  The PIT's ticks (in TICKS) must go on after
 * each move: the PIT's and the PICs' state travel.  The console's
 * interrupt comes once 'i' sets IER = THRI: then each "transmitter empty"
 * writes up to 16 bytes without a look at LSR, as serial8250_tx_chars() does.
 */
setup_interrupts:
	lea default_isr(%rip), %rax
	mov $IDT, %rdi
	mov $256, %ecx
1:	call put_gate
	add $16, %rdi
	dec %ecx
	jnz 1b
	lea irq4_isr(%rip), %rax
	mov $IDT + 0x24 * 16, %rdi
	call put_gate
	lea irq0_isr(%rip), %rax
	mov $IDT + 0x20 * 16, %rdi
	call put_gate
	lidt idtr(%rip)
	/* the master PIC at vector 0x20, IRQs 0 and 4 unmasked; the slave all masked */
	mov $0x11, %al
	out %al, $0x20
	mov $0x20, %al
	out %al, $0x21
	mov $0x04, %al
	out %al, $0x21
	mov $0x01, %al
	out %al, $0x21
	mov $0x11, %al
	out %al, $0xa0
	mov $0x28, %al
	out %al, $0xa1
	mov $0x02, %al
	out %al, $0xa1
	mov $0x01, %al
	out %al, $0xa1
	mov $0xee, %al
	out %al, $0x21
	mov $0xff, %al
	out %al, $0xa1
	mov $0x34, %al			/* the PIT: channel 0, low then high byte, mode 2 (rate) */
	out %al, $0x43
	mov $PIT_DIVISOR & 0xff, %al
	out %al, $0x40
	mov $PIT_DIVISOR >> 8, %al
	out %al, $0x40
	sti
	ret

irq0_isr:
	push %rax
	incq TICKS
	mov $0x20, %al			/* EOI */
	out %al, $0x20
	pop %rax
	iretq

/* put_gate(RDI: the entry, RAX: the handler) */
put_gate:
	mov %ax, (%rdi)
	movw $0x10, 2(%rdi)
	movw $0x8e00, 4(%rdi)
	mov %rax, %rdx
	shr $16, %rdx
	mov %dx, 6(%rdi)
	shr $16, %rdx
	mov %edx, 8(%rdi)
	movl $0, 12(%rdi)
	ret

default_isr:
	iretq

/* serial8250_interrupt: IIR until no interrupt; THRE: up to 16 bytes without a look at LSR */
irq4_isr:
	push %rax
	push %rcx
	push %rdx
1:	mov $COM1 + 2, %dx
	in %dx, %al
	test $1, %al
	jnz 9f
	mov $COM1 + 5, %dx
	in %dx, %al
	test $0x20, %al
	jz 1b
	mov $16, %ecx
2:	mov IRQ_LEFT, %rax
	test %rax, %rax
	jz 8f
	dec %rax
	mov %rax, IRQ_LEFT
	test $127, %al
	mov $'y', %al
	jnz 3f
	mov $'\n', %al
3:	mov $COM1, %dx
	out %al, %dx
	dec %ecx
	jnz 2b
	jmp 1b
8:	mov $COM1 + 1, %dx		/* __stop_tx: IER = 0 */
	xor %eax, %eax
	out %al, %dx
	jmp 1b
9:	mov $0x20, %al			/* EOI */
	out %al, $0x20
	pop %rdx
	pop %rcx
	pop %rax
	iretq

	.p2align 3
idtr:	.word 256 * 16 - 1
	.quad IDT

flood:					/* 'f': FLOOD_LINES lines of 'x', for a reader that stops reading */
	mov $FLOOD_LINES, %r10d
1:	mov $127, %r11d
2:	mov $'x', %al
	call putc
	dec %r11d
	jnz 2b
	call newline
	dec %r10d
	jnz 1b
	jmp round

finish:
	xor %ebx, %ebx			/* the status */
	test %r14, %r14
	jz 1f
	or $1, %ebx
1:	movabs $STUB_MAGIC, %rax
	cmp %rax, %r12
	je 2f
	or $2, %ebx
2:	mov $COM1 + 7, %dx
	in %dx, %al
	movzbl %al, %ebp
	cmp $0x5a, %al
	je 3f
	or $4, %ebx
3:	lea msg_end(%rip), %rdi
	call counts
	lea msg_scr(%rip), %rdi
	call puts
	mov %rbp, %rdi
	call puthex
	lea msg_status(%rip), %rdi
	call puts
	mov %rbx, %rdi
	call puthex
	call newline
	mov %bl, %al
	mov $EXIT_PORT, %dx
	out %al, %dx
4:	hlt
	jmp 4b

/* counts(RDI: a label): the label, the rounds (R13), the bad pages (R14), the PIT's ticks; clobbers RAX-RSI */
counts:
	call puts
	mov %r13, %rdi
	call puthex
	lea msg_bad(%rip), %rdi
	call puts
	mov %r14, %rdi
	call puthex
	lea msg_ticks(%rip), %rdi
	call puts
	mov TICKS, %rdi
	jmp puthex

/* putc(AL) once the transmitter is empty (LSR's THRE), as a driver does; clobbers RDX */
putc:
	push %rax
	mov $COM1 + 5, %dx
1:	in %dx, %al
	test $0x20, %al
	jz 1b
	pop %rax
	mov $COM1, %dx
	out %al, %dx
	ret

/* puts(RDI: a NUL-terminated string) to the console; clobbers RAX, RDX, RDI */
puts:
1:	movb (%rdi), %al
	test %al, %al
	jz 2f
	call putc
	inc %rdi
	jmp 1b
2:	ret

/* puthex(RDI) as 0x and hex digits, no leading zeros; clobbers RAX, RCX, RDX, RSI */
puthex:
	mov $'0', %al
	call putc
	mov $'x', %al
	call putc
	mov $60, %ecx
	xor %esi, %esi			/* a digit printed yet */
1:	mov %rdi, %rax
	shr %cl, %rax
	and $15, %eax
	test %ecx, %ecx
	jz 2f				/* the last digit, even 0 */
	test %eax, %eax
	jnz 2f
	test %esi, %esi
	jz 3f
2:	mov $1, %esi
	cmp $10, %al
	jb 4f
	add $'a' - 10 - '0', %al
4:	add $'0', %al
	call putc
3:	sub $4, %ecx
	jns 1b
	ret

newline:
	mov $'\n', %al
	jmp putc

msg_up:		.asciz "stub: up cmdline="
msg_e820:	.asciz " e820="
msg_round:	.asciz "stub: round="
msg_bad:	.asciz " bad="
msg_ticks:	.asciz " ticks="
msg_end:	.asciz "stub: end rounds="
msg_scr:	.asciz " scr="
msg_status:	.asciz " status="
msg_irqdone:	.asciz "stub: irq flood done"
	.org 0x1000			/* a bzImage is at least a page */

	.section .note.GNU-stack, "", @progbits
