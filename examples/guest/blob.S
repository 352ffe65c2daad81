/* SPDX-License-Identifier: MIT */
/* The flat guest image, embedded in the host program that loads it. */
	.section .rodata.guest, "a"
	.balign 64
	.globl guest_image, guest_image_end
guest_image:
	.incbin GUEST_IMAGE
guest_image_end:
	.section .note.GNU-stack, "", @progbits
