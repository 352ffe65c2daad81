// SPDX-License-Identifier: MIT
/*
 * The 16550A as Linux's 8250 driver probes and drives it: scratch
 * register, loopback (MSR follows MCR), FIFO detection through IIR's top
 * bits, and an interrupt on data received and on "transmitter empty".
 * The line to the irqchip is edge-triggered ISA: a THR write lowers it
 * and raises it again once the byte is taken (at once while the output
 * buffer has a FIFO's worth of room, else when the output thread made
 * room), so that every byte the driver writes brings the next interrupt.
 * "Transmitter empty" (LSR's THRE and TEMT) means that room: a driver may
 * then write a FIFO's worth without looking.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
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

static void update(struct serial *s);

static bool tx_room(const struct serial *s)
{
	return SERIAL_TX_MAX - s->tx_len >= SERIAL_TX_FIFO;
}

/* The output thread: writes what the guest wrote, without the lock, and owes the guest "empty" once there is room. */
static void *writer(void *p)
{
	struct serial *s = p;
	uint8_t buf[SERIAL_TX_MAX];
	sigset_t pipe_only;

	/* a reader gone: EPIPE, dropped below, not SIGPIPE's end of the whole VMM (the signal is this thread's) */
	sigemptyset(&pipe_only);
	sigaddset(&pipe_only, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &pipe_only, NULL);
	pthread_mutex_lock(&s->lock);
	for (;;) {
		uint32_t n, off = 0;

		while (!s->tx_len && !s->ending)
			pthread_cond_wait(&s->tx_cond, &s->lock);
		if (!s->tx_len)
			break;
		n = s->tx_len < SERIAL_TX_MAX - s->tx_head ? s->tx_len : SERIAL_TX_MAX - s->tx_head;
		memcpy(buf, s->tx + s->tx_head, n);
		pthread_mutex_unlock(&s->lock);
		while (off < n) {
			ssize_t w = write(s->out_fd, buf + off, n - off);

			if (w < 0 && errno == EINTR)
				continue;
			if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
				/* an O_NONBLOCK fd (a parent's): wait for room as a blocking one would */
				struct pollfd pfd = { .fd = s->out_fd, .events = POLLOUT };

				if (poll(&pfd, 1, -1) >= 0 || errno == EINTR)
					continue;
			}
			off = w <= 0 ? n : off + (uint32_t)w; /* an fd that fails takes no more: dropped */
		}
		pthread_mutex_lock(&s->lock);
		s->tx_head = (s->tx_head + n) % SERIAL_TX_MAX;
		s->tx_len -= n;
		if (s->tx_full && tx_room(s)) {
			s->tx_full = false;
			s->r.thr_pending = 1;
			update(s);
		}
		pthread_cond_broadcast(&s->tx_cond);
	}
	s->writer_done = true;
	pthread_cond_broadcast(&s->tx_cond);
	pthread_mutex_unlock(&s->lock);
	return NULL;
}

/*
 * A second, non-blocking open of out_fd's pipe, FIFO or terminal (through
 * /proc/self/fd: its own file description, so the caller's flags stay as
 * they are), or -1 (a regular file would get an offset of its own; a
 * socket cannot be opened so).  Through it the vCPU writes a byte itself
 * while nothing waits in the buffer: no hand-over to the writer thread
 * for each burst.
 */
static int nonblocking_twin(int out_fd)
{
	struct stat a, b;
	char path[64];
	int fd;

	if (fstat(out_fd, &a) < 0 || !(S_ISFIFO(a.st_mode) || S_ISCHR(a.st_mode)))
		return -1;
	snprintf(path, sizeof(path), "/proc/self/fd/%d", out_fd);
	fd = open(path, O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
	if (fd >= 0 && (fstat(fd, &b) < 0 || a.st_dev != b.st_dev || a.st_ino != b.st_ino)) {
		close(fd);
		fd = -1;
	}
	return fd;
}

int serial_init(struct serial *s, int vm_fd, unsigned int irq, int out_fd)
{
	pthread_condattr_t ca;
	int ret;

	memset(s, 0, sizeof(*s));
	pthread_mutex_init(&s->lock, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&s->tx_cond, &ca);
	pthread_condattr_destroy(&ca);
	s->vm_fd = vm_fd;
	s->irq = irq;
	s->out_fd = out_fd;
	s->nb_fd = nonblocking_twin(out_fd);
	s->inited = true;
	ret = -pthread_create(&s->writer, NULL, writer, s);
	s->writer_on = ret == 0;
	return ret;
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

/* The byte out at once, from the vCPU's thread, where the fd takes it without waiting: true if it is gone. */
static bool write_now(struct serial *s, uint8_t c)
{
	ssize_t n;

	do
		n = write(s->nb_fd, &c, 1);
	while (n < 0 && errno == EINTR);
	return n == 1 || (n < 0 && errno != EAGAIN); /* a failing fd takes no more: dropped, as the writer does */
}

static void transmit(struct serial *s, uint8_t c)
{
	s->r.thr_pending = 0;
	update(s);
	if (s->r.mcr & MCR_LOOP) {
		rx_push(s, c);
	} else if (!s->tx_len && s->nb_fd >= 0 && write_now(s, c)) {
		s->out_bytes++;
	} else if (s->tx_len < SERIAL_TX_MAX) {
		s->tx[(s->tx_head + s->tx_len++) % SERIAL_TX_MAX] = c;
		s->out_bytes++;
		if (s->tx_len == 1) /* the writer waits only on an empty buffer: one wake-up a burst, not a byte */
			pthread_cond_signal(&s->tx_cond);
	} else {
		s->out_dropped++; /* written though the transmitter said busy */
	}
	if (tx_room(s)) {
		s->r.thr_pending = 1;
		update(s);
	} else {
		if (!s->tx_full)
			s->stalls++;
		s->tx_full = true;
	}
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
			/* "empty" now only with room; without, tx_full owes it and the writer raises it */
			if ((v & IER_THRI) && !(s->r.ier & IER_THRI) && tx_room(s))
				s->r.thr_pending = 1;
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
		case 5: *data = (uint8_t)((tx_room(s) ? LSR_THRE | LSR_TEMT : 0) | (s->r.rx_len ? LSR_DR : 0)); break;
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

uint64_t serial_stalls(struct serial *s)
{
	uint64_t n;

	pthread_mutex_lock(&s->lock);
	n = s->stalls;
	pthread_mutex_unlock(&s->lock);
	return n;
}

void serial_close(struct serial *s)
{
	struct timespec until;
	bool done;

	if (!s->inited)
		return; /* serial_init() never ran: no lock, no thread */
	clock_gettime(CLOCK_MONOTONIC, &until);
	until.tv_sec += 2;
	pthread_mutex_lock(&s->lock);
	s->closed = true;
	if (s->nb_fd >= 0) /* under the lock: no vCPU is in write_now() */
		close(s->nb_fd);
	s->nb_fd = -1;
	if (!s->writer_on) { /* never set up, or no thread: nothing to wait for */
		pthread_mutex_unlock(&s->lock);
		return;
	}
	s->writer_on = false;
	s->ending = true;
	pthread_cond_broadcast(&s->tx_cond);
	while (!s->writer_done && pthread_cond_timedwait(&s->tx_cond, &s->lock, &until) != ETIMEDOUT)
		;
	done = s->writer_done;
	pthread_mutex_unlock(&s->lock);
	if (done)
		pthread_join(s->writer, NULL);
	else
		pthread_detach(s->writer); /* stuck in write(): the process's exit ends it */
}

void serial_save(struct serial *s, struct serial_regs *out)
{
	pthread_mutex_lock(&s->lock);
	*out = s->r;
	if (s->tx_full)
		out->thr_pending = 1; /* owed: the other side's buffer is empty, the interrupt is due there at once */
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
