/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_LINUX_SERIAL_H
#define KVMDIRTY_LINUX_SERIAL_H

/*
 * A 16550A UART at an I/O port base, its interrupt an ISA IRQ of KVM's
 * in-kernel irqchip: what Linux's 8250 driver needs for a console both
 * ways.  Output goes to a file descriptor: from the vCPU's thread at once
 * while the fd (a pipe or terminal, opened again non-blocking) takes it,
 * else through a buffer written by a thread of the UART's own, in order:
 * a reader that stops reading stops the guest's
 * console (the transmitter reports busy until there is room again, as a
 * UART with flow control does), never a vCPU inside a call or the
 * UART's lock, so a pause and the device-state calls still go through.
 * Input comes from serial_input().  Its registers and unread input are
 * its state, carried across a migration or a snapshot (serial_save/_load);
 * output the guest wrote before that is written by the side it was
 * written on.  Every call takes the UART's lock: vCPU threads, an input
 * thread, the output thread and the engine's device-state calls may meet.
 */
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SERIAL_RX_MAX 256
#define SERIAL_TX_MAX 4096 /* output the guest wrote that the fd did not take yet */
#define SERIAL_TX_FIFO 16  /* what a 16550A takes per "transmitter empty" */

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
	int nb_fd; /* out_fd's pipe or terminal opened again, non-blocking, or -1 */
	unsigned int irq;
	bool line;    /* the IRQ line's level as last set in KVM */
	bool closed;  /* the VM is going: no more KVM_IRQ_LINE */
	uint64_t out_bytes, out_dropped; /* dropped: written while the transmitter said busy */
	uint64_t stalls;		 /* times the output buffer filled (the fd not taking it) */
	struct serial_regs r;

	/* the output: tx[tx_head..] holds tx_len bytes for the writer thread */
	pthread_cond_t tx_cond;
	pthread_t writer;
	uint8_t tx[SERIAL_TX_MAX];
	uint32_t tx_head, tx_len;
	bool tx_full; /* busy said: a "transmitter empty" is owed once there is room */
	bool ending;  /* serial_close(): the writer ends once the buffer is out */
	bool inited, writer_on, writer_done;
};

/* Set up s and start its output thread: 0 or -errno. */
int serial_init(struct serial *s, int vm_fd, unsigned int irq, int out_fd);
/* A guest access to register off (0-7); a read fills *data. */
void serial_io(struct serial *s, unsigned int off, bool write, uint8_t *data);
/* Bytes typed to the guest: as many as the FIFO takes (the rest is dropped, as a UART's overrun). */
size_t serial_input(struct serial *s, const uint8_t *buf, size_t n);
/* How many times the output buffer filled so far: the guest's console held by a reader that does not read. */
uint64_t serial_stalls(struct serial *s);
/*
 * Stop touching the VM (before it is freed), and end the output thread
 * once what the guest wrote is out: waited for up to 2 s (a reader that
 * stopped reading keeps the rest; the thread is then left to the
 * process's exit, with s, which must outlive it).
 */
void serial_close(struct serial *s);
/* The state as bytes (sizeof(struct serial_regs)), and back: 0 or -EPROTO for a state that is not one. */
void serial_save(struct serial *s, struct serial_regs *out);
int serial_load(struct serial *s, const struct serial_regs *in);

#endif
