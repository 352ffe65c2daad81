// SPDX-License-Identifier: MIT
/*
 * The 16550A as Linux's 8250 driver probes and drives it: scratch
 * register, loopback (MSR follows MCR), FIFO detection through IIR's top
 * bits, and an interrupt on data received and on "transmitter empty".
 * The line to the irqchip is edge-triggered ISA: a THR write lowers it
 * and raises it again once the byte is out (at once here), so that every
 * byte the driver writes brings the next interrupt.
 */
#include <errno.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <linux/kvm.h>

#include "serial.h"

#define IER_RDI 0x01
#define IER_THRI 0x02
#define LCR_DLAB 0x80
#define MCR_LOOP 0x10
#define LSR_DR 0x01
#define LSR_THRE 0x20
#define LSR_TEMT 0x40
#define FCR_ENABLE 0x01
#define FCR_CLEAR_RX 0x02

void serial_init(struct serial *s, int vm_fd, unsigned int irq, int out_fd)
{
	memset(s, 0, sizeof(*s));
	pthread_mutex_init(&s->lock, NULL);
	s->vm_fd = vm_fd;
	s->irq = irq;
	s->out_fd = out_fd;
}

static void set_line(struct serial *s, bool level)
{
	struct kvm_irq_level l = { .irq = s->irq, .level = level };

	if (s->line == level || s->closed)
		return;
	s->line = level;
	ioctl(s->vm_fd, KVM_IRQ_LINE, &l); /* fails only for a VM without an irqchip */
}

static void update(struct serial *s)
{
	set_line(s, ((s->r.ier & IER_RDI) && s->r.rx_len) || ((s->r.ier & IER_THRI) && s->r.thr_pending));
}

static void rx_push(struct serial *s, uint8_t c)
{
	if (s->r.rx_len < SERIAL_RX_MAX)
		s->r.rx[(s->r.rx_head + s->r.rx_len++) % SERIAL_RX_MAX] = c;
}

static uint8_t msr(const struct serial *s)
{
	uint8_t m = s->r.mcr;

	if (m & MCR_LOOP) /* CTS = RTS, DSR = DTR, RI = OUT1, DCD = OUT2 */
		return (uint8_t)(((m & 0x02) << 3) | ((m & 0x01) << 5) | ((m & 0x04) << 4) | ((m & 0x08) << 4));
	return 0xb0; /* DCD, DSR, CTS: a terminal is there */
}

static void transmit(struct serial *s, uint8_t c)
{
	s->r.thr_pending = 0;
	update(s);
	if (s->r.mcr & MCR_LOOP) {
		rx_push(s, c);
	} else {
		ssize_t n;

		do
			n = write(s->out_fd, &c, 1);
		while (n < 0 && errno == EINTR);
		s->out_bytes++;
	}
	s->r.thr_pending = 1;
	update(s);
}

static uint8_t iir(struct serial *s)
{
	uint8_t fifo = (s->r.fcr & FCR_ENABLE) ? 0xc0 : 0;

	if ((s->r.ier & IER_RDI) && s->r.rx_len)
		return fifo | 0x04;
	if ((s->r.ier & IER_THRI) && s->r.thr_pending) {
		s->r.thr_pending = 0; /* reading IIR clears the THRE interrupt */
		update(s);
		return fifo | 0x02;
	}
	return fifo | 0x01;
}

void serial_io(struct serial *s, unsigned int off, bool write, uint8_t *data)
{
	bool dlab;

	pthread_mutex_lock(&s->lock);
	dlab = s->r.lcr & LCR_DLAB;
	if (write) {
		uint8_t v = *data;

		switch (off) {
		case 0:
			if (dlab)
				s->r.dll = v;
			else
				transmit(s, v);
			break;
		case 1:
			if (dlab) {
				s->r.dlm = v;
				break;
			}
			if ((v & IER_THRI) && !(s->r.ier & IER_THRI))
				s->r.thr_pending = 1; /* the transmitter is always empty */
			s->r.ier = v & 0x0f;
			update(s);
			break;
		case 2:
			s->r.fcr = v & 0xc9;
			if (v & FCR_CLEAR_RX)
				s->r.rx_len = 0;
			update(s);
			break;
		case 3: s->r.lcr = v; break;
		case 4: s->r.mcr = v & 0x1f; break;
		case 7: s->r.scr = v; break;
		default: break; /* LSR and MSR are read-only */
		}
	} else {
		switch (off) {
		case 0:
			if (dlab) {
				*data = s->r.dll;
			} else if (s->r.rx_len) {
				*data = s->r.rx[s->r.rx_head];
				s->r.rx_head = (uint16_t)((s->r.rx_head + 1) % SERIAL_RX_MAX);
				s->r.rx_len--;
				update(s);
			} else {
				*data = 0;
			}
			break;
		case 1: *data = dlab ? s->r.dlm : s->r.ier; break;
		case 2: *data = iir(s); break;
		case 3: *data = s->r.lcr; break;
		case 4: *data = s->r.mcr; break;
		case 5: *data = (uint8_t)(LSR_THRE | LSR_TEMT | (s->r.rx_len ? LSR_DR : 0)); break;
		case 6: *data = msr(s); break;
		case 7: *data = s->r.scr; break;
		default: *data = 0xff; break;
		}
	}
	pthread_mutex_unlock(&s->lock);
}

size_t serial_input(struct serial *s, const uint8_t *buf, size_t n)
{
	size_t i;

	pthread_mutex_lock(&s->lock);
	for (i = 0; i < n && s->r.rx_len < SERIAL_RX_MAX; i++)
		rx_push(s, buf[i]);
	update(s);
	pthread_mutex_unlock(&s->lock);
	return i;
}

void serial_close(struct serial *s)
{
	pthread_mutex_lock(&s->lock);
	s->closed = true;
	pthread_mutex_unlock(&s->lock);
}

void serial_save(struct serial *s, struct serial_regs *out)
{
	pthread_mutex_lock(&s->lock);
	*out = s->r;
	pthread_mutex_unlock(&s->lock);
}

int serial_load(struct serial *s, const struct serial_regs *in)
{
	if (in->rx_head >= SERIAL_RX_MAX || in->rx_len > SERIAL_RX_MAX || in->thr_pending > 1)
		return -EPROTO;
	pthread_mutex_lock(&s->lock);
	s->r = *in;
	/*
	 * The irqchip's state came with the VM's: what the guest was sent is
	 * there.  This line goes low, and rises again only for what is still
	 * pending (an edge the guest takes as one more interrupt, which its
	 * handler finds in IIR).
	 */
	s->line = true;
	set_line(s, false); /* low in KVM too: the PIC keeps the source's last level, and a rise must be an edge */
	update(s);
	pthread_mutex_unlock(&s->lock);
	return 0;
}
