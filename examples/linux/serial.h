/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_LINUX_SERIAL_H
#define KVMDIRTY_LINUX_SERIAL_H

/*
 * A 16550A UART at an I/O port base, its interrupt an ISA IRQ of KVM's
 * in-kernel irqchip: what Linux's 8250 driver needs for a console both
 * ways.  Output goes to a file descriptor as the guest writes it; input
 * comes from serial_input().  Its registers and unread input are its
 * state, carried across a migration or a snapshot (serial_save/_load).
 * Every call takes the UART's lock: vCPU threads, an input thread and the
 * engine's device-state calls may meet.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SERIAL_RX_MAX 256

/* What travels: registers and the receive FIFO, no host pointers. */
struct serial_regs {
	uint8_t ier, lcr, mcr, scr, dll, dlm, fcr;
	uint8_t thr_pending; /* a "transmitter empty" interrupt not yet read from IIR */
	uint16_t rx_head, rx_len;
	uint8_t rx[SERIAL_RX_MAX];
};

struct serial {
	pthread_mutex_t lock;
	int vm_fd, out_fd;
	unsigned int irq;
	bool line;    /* the IRQ line's level as last set in KVM */
	bool closed;  /* the VM is going: no more KVM_IRQ_LINE */
	uint64_t out_bytes;
	struct serial_regs r;
};

void serial_init(struct serial *s, int vm_fd, unsigned int irq, int out_fd);
/* A guest access to register off (0-7); a read fills *data. */
void serial_io(struct serial *s, unsigned int off, bool write, uint8_t *data);
/* Bytes typed to the guest: as many as the FIFO takes (the rest is dropped, as a UART's overrun). */
size_t serial_input(struct serial *s, const uint8_t *buf, size_t n);
/* Stop touching the VM (before it is freed). */
void serial_close(struct serial *s);
/* The state as bytes (sizeof(struct serial_regs)), and back: 0 or -EPROTO for a state that is not one. */
void serial_save(struct serial *s, struct serial_regs *out);
int serial_load(struct serial *s, const struct serial_regs *in);

#endif
