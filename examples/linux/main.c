// SPDX-License-Identifier: MIT
/*
 * kvmdirty-linux: a small VMM that boots a stock Linux kernel with an
 * initramfs, migrates it, snapshots and restores it.  Its memory and
 * vCPUs go through libkvmdirty (kvmdirty.h), its migration and snapshots
 * through libkvmdirty-migrate (kvmdirty-migrate.h): nothing of either
 * library's own.  Its one device, the 16550A console (serial.c), travels
 * as the engine's device state; the rest of the PC (LAPICs, IOAPIC, PIC,
 * PIT) is KVM's in-kernel one, whose state the engine carries itself.
 *
 *   kvmdirty-linux --kernel VMLINUZ [--initrd FILE] [--append ARGS] [--mem MIB] [--vcpus N]
 *                  [--track log|ring] [--migrate-to ADDR [--after MS] | --incoming ADDR |
 *                   --snapshot PREFIX [--every MS] [--count N] | --restore FILE...]
 *                  [--psk FILE [--encrypt]] [--connections N] [--on-signal]
 *
 * --on-signal: the migration, or each snapshot, starts when the process
 * gets SIGUSR2 (an orchestrator's word) instead of after --after or
 * --every milliseconds.  --no-xsave: the guest's CPUID without XSAVE and
 * what needs it (AVX, AVX-512, PKU), for a KVM that cannot keep a guest's
 * XCR0: one nested under a hypervisor that lets XSETBV through unseen, as
 * under kvm-under-tcg, where a moved or even a booting guest otherwise
 * fails now and then.  Both ends of a migration take the same.
 * The console is the process's stdin and stdout; the VMM's own lines go to
 * stderr.  The VMM ends when the guest does: a byte written to I/O port
 * 0x501 is its exit status (the initramfs's init writes its workload's),
 * a reset through the keyboard controller (reboot=k) is 0, a triple fault
 * or a KVM failure 1.  SIGQUIT prints each vCPU's RIP, RFLAGS, mode and
 * pending events on stderr (for a guest that seems stuck; it runs on).
 * README.md ("kvmdirty-linux") shows it in use.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <linux/kvm.h>

#include <kvmdirty-migrate.h>

#include "../common/cli.h"
#include "../common/kvm-host.h"
#include "../common/vmm-mode.h"
#include "boot.h"
#include "rtc.h"
#include "serial.h"

#define PROG "kvmdirty-linux"
#define COM1 0x3f8
#define COM1_IRQ 4
#define EXIT_PORT 0x501
#define I8042_CMD 0x64
#define KICK_SIGNAL SIGUSR1
#define DEFAULT_CMDLINE "console=ttyS0 reboot=k panic=-1 pci=off"
#define DEVICE_MAGIC "kdlinux1"
#define DUMP_LINE 1024

struct lvm {
	/* the command line */
	struct boot_files boot;
	const char *append, *psk;
	struct vmm_mode_args run;
	uint64_t mib, vcpus, after_ms, every_ms, count, conns;
	enum kvmdirty_mode track;
	bool encrypt, drop_devices, on_signal, no_xsave;
	char cmdline[BOOT_CMDLINE_MAX + 1];

	/* the machine */
	struct kvmdirty_vm *vm;
	struct kvmdirty_tracker *tracker;
	struct kvmdirty_vcpu *vcpu[BOOT_MAX_VCPUS];
	pthread_t thread[BOOT_MAX_VCPUS];
	unsigned int nr_threads;
	uint8_t *mem;
	uint64_t mem_size;
	struct serial serial;
	uint64_t stalls_told; /* serial_stalls() when last said (atomic: vCPU threads) */
	pthread_mutex_t rtc_lock;
	struct rtc_regs rtc;
	struct kvm_cpuid2 *cpuid;

	/* the vCPU threads: pause (the engine's), stop (the guest ended) */
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool pause_req, stop;
	unsigned int paused, alive;
	uint64_t dump_gen; /* SIGQUIT: each vCPU says where it is once per increment */
	uint64_t line_gen[BOOT_MAX_VCPUS];	  /* the dump_gen its line in dump_line answers */
	char dump_line[BOOT_MAX_VCPUS][DUMP_LINE]; /* written out by dump_thread(), never under the lock */
	int status;
	char why[256];
};

/* The device state: the console's registers and unread input, the clock's, behind a tag. */
struct device_state {
	char magic[8];
	struct serial_regs serial;
	struct rtc_regs rtc;
};

static void on_kick(int sig)
{
	(void)sig;
}

/* ---- the vCPU threads ------------------------------------------------- */

static void kick_all(struct lvm *v)
{
	unsigned int i;

	for (i = 0; i < v->nr_threads; i++) {
		__atomic_store_n(&kvmdirty_vcpu_kvm_run(v->vcpu[i])->immediate_exit, 1, __ATOMIC_RELEASE);
		pthread_kill(v->thread[i], KICK_SIGNAL);
	}
}

/* The guest ended (or cannot go on): the first reason is kept, every vCPU leaves. */
static void end_guest(struct lvm *v, int status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void end_guest(struct lvm *v, int status, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&v->lock);
	if (!v->stop) {
		v->stop = true;
		v->status = status;
		va_start(ap, fmt);
		vsnprintf(v->why, sizeof(v->why), fmt, ap);
		va_end(ap);
	}
	pthread_cond_broadcast(&v->cond);
	pthread_mutex_unlock(&v->lock);
	kick_all(v);
}

/*
 * Said once each time the console's output backs up (outside the UART's
 * lock; a vCPU's kick still ends this write): what an operator, or a
 * test, needs to know when the guest's console seems to stop.
 */
static void console_stalled(struct lvm *v)
{
	uint64_t n = serial_stalls(&v->serial);

	if (n != __atomic_load_n(&v->stalls_told, __ATOMIC_RELAXED) &&
	    __atomic_exchange_n(&v->stalls_told, n, __ATOMIC_RELAXED) != n)
		fprintf(stderr, PROG ": the console's output is not being read: the guest's console waits (%" PRIu64
				" time%s)\n", n, n == 1 ? "" : "s");
}

static void port_io(struct lvm *v, struct kvm_run *run)
{
	uint8_t *data = (uint8_t *)run + run->io.data_offset;
	bool write = run->io.direction == KVM_EXIT_IO_OUT;
	uint16_t port = run->io.port;
	uint32_t i;

	for (i = 0; i < run->io.count; i++, data += run->io.size) {
		if (port >= COM1 && port < COM1 + 8 && run->io.size == 1) {
			serial_io(&v->serial, port - COM1, write, data);
			if (write && port == COM1)
				console_stalled(v);
		} else if ((port == 0x70 || port == 0x71) && run->io.size == 1) {
			pthread_mutex_lock(&v->rtc_lock);
			rtc_io(&v->rtc, port, write, data);
			pthread_mutex_unlock(&v->rtc_lock);
		} else if (port == EXIT_PORT && write)
			end_guest(v, data[0], "the guest wrote its exit status %u to port 0x%x", data[0], EXIT_PORT);
		else if (port == I8042_CMD && write && data[0] == 0xfe)
			end_guest(v, 0, "the guest reset itself through the keyboard controller (a reboot)");
		else if (!write)
			memset(data, 0xff, run->io.size); /* nothing there */
	}
}

/* One exit: false where the guest cannot go on. */
static bool handle_exit(struct lvm *v, unsigned int id, struct kvm_run *run)
{
	switch (run->exit_reason) {
	case KVM_EXIT_IO:
		port_io(v, run);
		return true;
	case KVM_EXIT_MMIO:
		if (!run->mmio.is_write)
			memset(run->mmio.data, 0xff, sizeof(run->mmio.data));
		return true;
	case KVM_EXIT_HLT:
	case KVM_EXIT_INTR:
		return true;
	case KVM_EXIT_SHUTDOWN:
		end_guest(v, 1, "vCPU %u: the guest triple-faulted (KVM_EXIT_SHUTDOWN)", id);
		return false;
	case KVM_EXIT_SYSTEM_EVENT:
		end_guest(v, run->system_event.type == KVM_SYSTEM_EVENT_RESET ? 0 : 1,
			  "vCPU %u: system event %u", id, run->system_event.type);
		return false;
	case KVM_EXIT_FAIL_ENTRY:
		end_guest(v, 1, "vCPU %u: entry failed (hardware reason 0x%llx)", id,
			  (unsigned long long)run->fail_entry.hardware_entry_failure_reason);
		return false;
	case KVM_EXIT_INTERNAL_ERROR:
		end_guest(v, 1, "vCPU %u: KVM internal error %u", id, run->internal.suberror);
		return false;
	default:
		end_guest(v, 1, "vCPU %u: unexpected exit reason %u", id, run->exit_reason);
		return false;
	}
}

struct vcpu_arg {
	struct lvm *v;
	unsigned int id;
	uint64_t dumped; /* v->dump_gen at its start: it answers later SIGQUITs only */
};

/*
 * len bytes of guest memory at linear address la, as vCPU fd sees it
 * (KVM_TRANSLATE), in hex groups of unit bytes (little-endian values),
 * into buf: "-" where a page is not mapped or not guest memory.
 */
static const char *guest_hex(struct lvm *v, int fd, uint64_t la, unsigned int len, unsigned int unit, char *buf,
			     size_t size)
{
	size_t at = 0;
	unsigned int i, j;

	buf[0] = 0;
	for (i = 0; i < len && at + 2 * unit + 2 < size; i += unit) {
		struct kvm_translation t = { .linear_address = la + i };
		uint64_t val = 0;

		if (ioctl(fd, KVM_TRANSLATE, &t) < 0 || !t.valid || t.physical_address + unit > v->mem_size ||
		    ((t.physical_address + unit - 1) ^ t.physical_address) >> 12) {
			at += (size_t)snprintf(buf + at, size - at, "%s-", at ? " " : "");
			break;
		}
		for (j = 0; j < unit; j++)
			val |= (uint64_t)v->mem[t.physical_address + j] << (8 * j);
		at += (size_t)snprintf(buf + at, size - at, unit == 1 ? "%s%02llx" : "%s%llx", at && unit > 1 ? " " : "",
				       (unsigned long long)val);
	}
	return buf;
}

/*
 * Where vCPU id is, on stderr, once per SIGQUIT (v->lock held, the
 * thread outside KVM_RUN: its own registers are still): RIP, RFLAGS, the
 * mode, and what KVM holds pending for it.  The kick that asked for it
 * set immediate_exit; it is cleared here unless a pause wants it.
 */
static void dump_if_asked(struct lvm *v, unsigned int id, uint64_t *dumped)
{
	int fd = kvmdirty_vcpu_fd(v->vcpu[id]);
	char *line = v->dump_line[id];
	struct kvm_vcpu_events ev;
	struct kvm_mp_state mp;
	struct kvm_sregs sr;
	struct kvm_regs r;
	char code[64], stack[600];

	if (*dumped == v->dump_gen)
		return;
	*dumped = v->dump_gen;
	if (!v->pause_req)
		__atomic_store_n(&kvmdirty_vcpu_kvm_run(v->vcpu[id])->immediate_exit, 0, __ATOMIC_RELEASE);
	if (ioctl(fd, KVM_GET_REGS, &r) < 0 || ioctl(fd, KVM_GET_SREGS, &sr) < 0 ||
	    ioctl(fd, KVM_GET_VCPU_EVENTS, &ev) < 0 || ioctl(fd, KVM_GET_MP_STATE, &mp) < 0)
		snprintf(line, DUMP_LINE, PROG ": vCPU %u: its registers: %s\n", id, strerror(errno));
	else
		snprintf(line, DUMP_LINE,
			 PROG ": vCPU %u: rip=0x%llx rflags=0x%llx rsp=0x%llx rbx=0x%llx rdi=0x%llx cs=0x%x cpl=%u "
			      "cr0=0x%llx cr3=0x%llx cr4=0x%llx efer=0x%llx mp_state=%u irq_injected=%u shadow=%u "
			      "nmi_pending=%u%s code=%s stack=%s\n",
			 id, (unsigned long long)r.rip, (unsigned long long)r.rflags, (unsigned long long)r.rsp,
			 (unsigned long long)r.rbx, (unsigned long long)r.rdi, sr.cs.selector, sr.ss.dpl,
			 (unsigned long long)sr.cr0, (unsigned long long)sr.cr3, (unsigned long long)sr.cr4,
			 (unsigned long long)sr.efer, mp.mp_state, ev.interrupt.injected, ev.interrupt.shadow,
			 ev.nmi.pending, v->pause_req ? " (paused)" : "",
			 guest_hex(v, fd, sr.cs.base + r.rip, 16, 1, code, sizeof(code)),
			 guest_hex(v, fd, sr.ss.base + r.rsp, 256, 8, stack, sizeof(stack)));
	v->line_gen[id] = *dumped;
	pthread_cond_broadcast(&v->cond); /* dump_thread() waits for the lines */
}

/*
 * SIGQUIT (blocked in every thread): each vCPU says where it is, and the
 * guest runs on.  The lines go out from here, outside v->lock and
 * through write(), not stdio: a stderr that does not drain blocks this
 * thread alone, never a vCPU, a pause or the guest's end.
 */
static void *dump_thread(void *p)
{
	static char out[BOOT_MAX_VCPUS * DUMP_LINE];
	struct lvm *v = p;
	sigset_t set;
	int sig;

	sigemptyset(&set);
	sigaddset(&set, SIGQUIT);
	while (sigwait(&set, &sig) == 0) {
		struct timespec until;
		unsigned int i, n;
		size_t len = 0;
		uint64_t gen;

		clock_gettime(CLOCK_REALTIME, &until);
		until.tv_sec += 2;
		pthread_mutex_lock(&v->lock);
		gen = ++v->dump_gen;
		pthread_cond_broadcast(&v->cond); /* the paused ones */
		n = v->stop ? 0 : v->nr_threads;
		for (i = 0; i < n; i++) {
			__atomic_store_n(&kvmdirty_vcpu_kvm_run(v->vcpu[i])->immediate_exit, 1, __ATOMIC_RELEASE);
			pthread_kill(v->thread[i], KICK_SIGNAL);
		}
		for (i = 0; i < n && !v->stop;)
			if (v->line_gen[i] >= gen)
				i++;
			else if (pthread_cond_timedwait(&v->cond, &v->lock, &until) == ETIMEDOUT)
				break;
		if (!n)
			len = (size_t)snprintf(out, sizeof(out), PROG ": no vCPU running\n");
		for (i = 0; i < n; i++)
			if (v->line_gen[i] >= gen)
				len += (size_t)snprintf(out + len, sizeof(out) - len, "%s", v->dump_line[i]);
			else
				len += (size_t)snprintf(out + len, sizeof(out) - len, PROG ": vCPU %u: no answer in 2 s\n", i);
		pthread_mutex_unlock(&v->lock);
		for (const char *at = out; len > 0;) {
			ssize_t k = write(STDERR_FILENO, at, len);

			if (k < 0 && errno == EINTR)
				continue;
			if (k <= 0)
				break;
			at += k, len -= (size_t)k;
		}
	}
	return NULL;
}

static void *vcpu_thread(void *p)
{
	struct vcpu_arg *a = p;
	struct lvm *v = a->v;
	unsigned int id = a->id;
	struct kvm_run *run = kvmdirty_vcpu_kvm_run(v->vcpu[id]);
	uint64_t dumped = a->dumped;
	int ret;

	free(a);
	for (;;) {
		pthread_mutex_lock(&v->lock);
		dump_if_asked(v, id, &dumped);
		if (v->pause_req && !v->stop) {
			/* said once: a broadcast per wake-up had the paused threads wake each other until the resume */
			v->paused++;
			pthread_cond_broadcast(&v->cond);
			while (v->pause_req && !v->stop) {
				pthread_cond_wait(&v->cond, &v->lock);
				dump_if_asked(v, id, &dumped);
			}
			v->paused--;
		}
		if (v->stop)
			break;
		pthread_mutex_unlock(&v->lock);
		ret = kvmdirty_vcpu_run(v->vcpu[id]);
		if (ret == -EINTR || ret == -EAGAIN)
			continue;
		if (ret < 0) {
			end_guest(v, 1, "vCPU %u: KVM_RUN: %s", id, strerror(-ret));
			pthread_mutex_lock(&v->lock);
			break;
		}
		if (!handle_exit(v, id, run)) {
			pthread_mutex_lock(&v->lock);
			break;
		}
	}
	v->alive--;
	pthread_cond_broadcast(&v->cond);
	pthread_mutex_unlock(&v->lock);
	return NULL;
}

/*
 * Start the vCPU threads.  They begin by taking v->lock, which this holds
 * until all are started: nr_threads and thread[] are whole before any
 * thread can end the guest and kick the others.
 */
static int spawn(struct lvm *v)
{
	unsigned int i;
	int ret = 0;

	pthread_mutex_lock(&v->lock);
	for (i = 0; i < v->vcpus && ret == 0; i++) {
		struct vcpu_arg *a = malloc(sizeof(*a));

		if (!a) {
			ret = -ENOMEM;
			break;
		}
		a->v = v;
		a->id = i;
		a->dumped = v->dump_gen; /* v->lock held */
		ret = -pthread_create(&v->thread[i], NULL, vcpu_thread, a);
		if (ret)
			free(a);
		else
			v->nr_threads++, v->alive++;
	}
	pthread_mutex_unlock(&v->lock);
	return ret;
}

/* Wait for the guest's end and every vCPU thread: the exit status. */
static int wait_end(struct lvm *v)
{
	unsigned int i;

	/*
	 * Every thread gone from its loop, not just told to go: a thread
	 * that ended the guest kicks the others (pthread_kill) before it
	 * leaves, and a joined thread's id must not be kicked.
	 */
	pthread_mutex_lock(&v->lock);
	while (!v->stop || v->alive)
		pthread_cond_wait(&v->cond, &v->lock);
	pthread_mutex_unlock(&v->lock);
	for (i = 0; i < v->nr_threads; i++)
		pthread_join(v->thread[i], NULL);
	pthread_mutex_lock(&v->lock); /* dump_thread() reads it */
	v->nr_threads = 0;
	pthread_mutex_unlock(&v->lock);
	fprintf(stderr, PROG ": %s\n", v->why);
	return v->status;
}

/* ---- what the engine calls -------------------------------------------- */

static void l_pause(void *ctx)
{
	struct lvm *v = ctx;

	pthread_mutex_lock(&v->lock);
	v->pause_req = true;
	pthread_mutex_unlock(&v->lock);
	kick_all(v);
	pthread_mutex_lock(&v->lock);
	while (v->paused < v->alive)
		pthread_cond_wait(&v->cond, &v->lock);
	pthread_mutex_unlock(&v->lock);
}

static void l_resume(void *ctx)
{
	struct lvm *v = ctx;
	unsigned int i;

	pthread_mutex_lock(&v->lock);
	for (i = 0; i < v->nr_threads; i++)
		__atomic_store_n(&kvmdirty_vcpu_kvm_run(v->vcpu[i])->immediate_exit, 0, __ATOMIC_RELEASE);
	v->pause_req = false;
	pthread_cond_broadcast(&v->cond);
	pthread_mutex_unlock(&v->lock);
}

static int l_devices_save(void *ctx, void **ret_state, size_t *ret_len)
{
	struct lvm *v = ctx;
	struct device_state *d;

	if (v->drop_devices) {
		*ret_state = NULL;
		*ret_len = 0;
		return 0;
	}
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	memcpy(d->magic, DEVICE_MAGIC, 8);
	serial_save(&v->serial, &d->serial);
	pthread_mutex_lock(&v->rtc_lock);
	d->rtc = v->rtc;
	pthread_mutex_unlock(&v->rtc_lock);
	*ret_state = d;
	*ret_len = sizeof(*d);
	return 0;
}

static int l_devices_load(void *ctx, const void *state, size_t len)
{
	struct lvm *v = ctx;
	struct device_state d;
	int ret;

	if (len == 0 && v->drop_devices)
		return 0; /* a source with --drop-devices sent none: the devices stay as reset */
	if (len != sizeof(d))
		return -EPROTO;
	memcpy(&d, state, sizeof(d));
	if (memcmp(d.magic, DEVICE_MAGIC, 8) || d.rtc.index > 0x7f)
		return -EPROTO; /* not this VMM's devices */
	ret = serial_load(&v->serial, &d.serial); /* checks the console's part before it takes any */
	if (ret < 0)
		return ret;
	pthread_mutex_lock(&v->rtc_lock);
	v->rtc = d.rtc;
	pthread_mutex_unlock(&v->rtc_lock);
	return 0;
}

static const struct kvmdirty_mig_ops lvm_ops = {
	.pause = l_pause, .resume = l_resume, .devices_save = l_devices_save, .devices_load = l_devices_load,
};

/* ---- the console's input ---------------------------------------------- */

static void *input_thread(void *p)
{
	struct lvm *v = p;
	uint8_t buf[64];
	ssize_t n;

	while ((n = read(STDIN_FILENO, buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR)) {
		size_t off = 0;

		while (n > 0 && off < (size_t)n) {
			size_t took = serial_input(&v->serial, buf + off, (size_t)n - off);

			off += took;
			if (off < (size_t)n)
				vmm_sleep_ms(1); /* the FIFO is full: the guest reads it at its pace */
		}
	}
	return NULL;
}

/* ---- the machine ------------------------------------------------------ */

static int fail(const char *what, int ret)
{
	fprintf(stderr, PROG ": %s: %s\n", what, strerror(-ret));
	return 1;
}

/* The VM, its memory, irqchip, PIT, console and vCPUs with CPUID: 0 or 1 said. */
static int build(struct lvm *v)
{
	struct kvm_pit_config pit = { .flags = 0 };
	struct kvm_cpuid2 *cpuid;
	struct sigaction sa = { .sa_handler = on_kick };
	unsigned int i;
	bool deadline;
	int ret, fd;

	sigemptyset(&sa.sa_mask);
	sigaction(KICK_SIGNAL, &sa, NULL); /* no SA_RESTART: a kick ends KVM_RUN */
	ret = kvmdirty_vm_new(&v->vm);
	if (ret < 0)
		return fail("creating the VM", ret);
	fd = kvmdirty_vm_fd(v->vm);
	if (ioctl(fd, KVM_SET_TSS_ADDR, 0xfffbd000ul) < 0 && errno != ENOTTY)
		return fail("KVM_SET_TSS_ADDR", -errno);
	if (ioctl(fd, KVM_CREATE_IRQCHIP, 0) < 0)
		return fail("KVM_CREATE_IRQCHIP", -errno);
	if (ioctl(fd, KVM_CREATE_PIT2, &pit) < 0)
		return fail("KVM_CREATE_PIT2", -errno);
	ret = serial_init(&v->serial, fd, COM1_IRQ, STDOUT_FILENO);
	if (ret < 0)
		return fail("the console's output thread", ret);
	rtc_init(&v->rtc);
	if (v->run.mode == MIGRATE_TO || v->run.mode == SNAPSHOT) {
		struct kvmdirty_tracker_opts to = { .mode = v->track,
						    .reaper_ms = v->track == KVMDIRTY_MODE_DIRTY_RING ? 10 : 0 };

		ret = kvmdirty_tracker_new(v->vm, &to, &v->tracker);
		if (ret < 0)
			return fail("the dirty tracker", ret);
		if (v->track == KVMDIRTY_MODE_DIRTY_RING && (ret = kvmdirty_vm_set_kick_signal(v->vm, KICK_SIGNAL)) < 0)
			return fail("the kick signal", ret);
	}
	v->mem_size = v->mib << 20;
	v->mem = mmap(NULL, v->mem_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (v->mem == MAP_FAILED) {
		v->mem = NULL;
		return fail("guest memory", -errno);
	}
	ret = kvmdirty_region_add(v->vm, 0, v->mem_size, v->mem, 0, NULL);
	if (ret < 0)
		return fail("adding guest memory", ret);
	v->cpuid = cpuid = kvm_host_supported_cpuid(kvmdirty_vm_kvm_fd(v->vm), &ret);
	if (!cpuid)
		return fail("KVM_GET_SUPPORTED_CPUID", ret);
	deadline = ioctl(kvmdirty_vm_kvm_fd(v->vm), KVM_CHECK_EXTENSION, KVM_CAP_TSC_DEADLINE_TIMER) > 0;
	ret = 0;
	for (i = 0; i < v->vcpus && ret >= 0; i++) {
		ret = kvmdirty_vcpu_create(v->vm, i, &v->vcpu[i]);
		if (ret == 0)
			ret = boot_set_cpuid(kvmdirty_vcpu_fd(v->vcpu[i]), cpuid, i, deadline, v->no_xsave);
	}
	if (ret < 0)
		return fail("creating the vCPUs", ret);
	return 0;
}

static void teardown(struct lvm *v)
{
	unsigned int i;

	serial_close(&v->serial);
	free(v->cpuid);
	for (i = 0; i < v->vcpus; i++)
		kvmdirty_vcpu_free(v->vcpu[i]);
	kvmdirty_tracker_free(v->tracker);
	if (v->vm)
		kvmdirty_vm_free(v->vm);
	if (v->mem)
		munmap(v->mem, v->mem_size);
}

/* The engine's view of the guest: 0 or 1 said. */
static int describe(struct lvm *v, bool fresh, struct kvmdirty_mig_guest **ret_g)
{
	int ret = kvmdirty_mig_guest_new(v->vm, v->tracker, v->vcpu, (unsigned int)v->vcpus,
					 fresh ? KVMDIRTY_MIG_FRESH : 0, &lvm_ops, v, ret_g);

	return ret < 0 ? fail("describing the guest to the engine", ret) : 0;
}

/* ---- the modes --------------------------------------------------------- */

static bool ended(struct lvm *v)
{
	bool s;

	pthread_mutex_lock(&v->lock);
	s = v->stop;
	pthread_mutex_unlock(&v->lock);
	return s;
}

/*
 * Wait ms, or with --on-signal for SIGUSR2 (blocked in every thread from
 * the start): false where the guest ended meanwhile.
 */
static bool wait_turn(struct lvm *v, uint64_t ms)
{
	struct timespec tick = { 0, 100 * 1000000 };
	sigset_t set;

	if (!v->on_signal) {
		vmm_sleep_ms(ms);
		return !ended(v);
	}
	sigemptyset(&set);
	sigaddset(&set, SIGUSR2);
	while (!ended(v))
		if (sigtimedwait(&set, NULL, &tick) == SIGUSR2)
			return true;
	return false;
}

static int migrate_to(struct lvm *v)
{
	struct kvmdirty_mig_send_opts o = { .connections = (unsigned int)v->conns, .psk_file = v->psk,
					    .encrypt = v->encrypt };
	struct kvmdirty_mig_send_result res;
	struct kvmdirty_mig_guest *g;
	char err[512];
	int ret;

	if (!wait_turn(v, v->after_ms))
		return wait_end(v);
	if (describe(v, false, &g)) {
		end_guest(v, 1, "no migration");
		wait_end(v);
		return 1;
	}
	ret = kvmdirty_mig_send(g, v->run.addr, &o, &res, err, sizeof(err));
	kvmdirty_mig_guest_free(g);
	if (ret < 0 && res.outcome == KVMDIRTY_MIG_HERE) {
		fprintf(stderr, PROG ": migration to %s failed, the guest runs on here: %s\n", v->run.addr, err);
		ret = wait_end(v);
		return ret ? ret : 3;
	}
	if (ret < 0) {
		fprintf(stderr, PROG ": migration to %s: outcome unknown, the guest stays paused here: %s\n", v->run.addr,
			err);
		/* paused threads see the stop before KVM_RUN: the guest never runs here again */
		end_guest(v, 4, "the guest's fate is unknown: it stays stopped here");
		wait_end(v);
		return 4;
	}
	fprintf(stderr, PROG ": migrated to %s: %" PRIu64 " pages in %" PRIu64 " passes, %.1f ms total, %.1f ms "
			"downtime%s\n", v->run.addr, res.pages, res.passes, res.total_ms, res.downtime_ms,
		ret > 0 ? "; pages lost by tracking: VERIFICATION FAILED" : "");
	end_guest(v, ret > 0, "the guest runs at %s now", v->run.addr);
	wait_end(v);
	return ret > 0;
}

static int start_arrived(struct lvm *v)
{
	int ret = spawn(v);

	if (ret < 0) {
		end_guest(v, 1, "starting the vCPUs: %s", strerror(-ret));
		return wait_end(v);
	}
	return wait_end(v);
}

static int incoming(struct lvm *v)
{
	struct kvmdirty_mig_recv_opts o = { .psk_file = v->psk, .encrypt = v->encrypt, .once = true };
	struct kvmdirty_mig_recv_result res;
	struct kvmdirty_mig_guest *g;
	char err[512];
	int lfd, ret;

	if (describe(v, true, &g))
		return 1;
	lfd = kvmdirty_mig_listen(v->run.addr, err, sizeof(err));
	if (lfd < 0) {
		fprintf(stderr, PROG ": --incoming: %s\n", err);
		kvmdirty_mig_guest_free(g);
		return 1;
	}
	fprintf(stderr, PROG ": listening at %s\n", v->run.addr);
	ret = kvmdirty_mig_recv(g, lfd, &o, &res, err, sizeof(err));
	close(lfd);
	kvmdirty_mig_guest_free(g);
	if (ret < 0) {
		fprintf(stderr, PROG ": --incoming: no guest to run: %s\n", err);
		return 1;
	}
	fprintf(stderr, PROG ": incoming: %" PRIu64 " pages, every one %s; running the guest\n", res.pages,
		res.hashed ? "matched its hash" : "arrived");
	return start_arrived(v);
}

static int snapshots(struct lvm *v)
{
	struct kvmdirty_mig_snap_opts so = { .prefix = v->run.prefix };
	struct kvmdirty_mig_snap_result r;
	struct kvmdirty_mig_snap *snap;
	struct kvmdirty_mig_guest *g;
	int ret, failed = 0;
	uint64_t i;
	char err[512];

	if (describe(v, false, &g)) {
		end_guest(v, 1, "no snapshot taken");
		wait_end(v);
		return 1;
	}
	ret = kvmdirty_mig_snap_new(g, &so, &snap, err, sizeof(err));
	if (ret < 0) {
		fprintf(stderr, PROG ": --snapshot: %s\n", err);
		kvmdirty_mig_guest_free(g);
		end_guest(v, 1, "no snapshot taken");
		wait_end(v);
		return 1;
	}
	for (i = 0; i < v->count && !ended(v); i++) {
		if (!wait_turn(v, v->every_ms))
			break;
		ret = kvmdirty_mig_snap_take(snap, &r, err, sizeof(err));
		if (ret < 0) {
			fprintf(stderr, PROG ": --snapshot: %s\n", err);
			failed = 1;
			continue;
		}
		fprintf(stderr, PROG ": snapshot %s: %s, %" PRIu64 " pages, %.2f ms paused, %.1f ms in all\n", r.path,
			r.seq ? "diff" : "full", r.pages, r.pause_ms, r.total_ms);
	}
	kvmdirty_mig_snap_free(snap);
	kvmdirty_mig_guest_free(g);
	ret = wait_end(v);
	return ret ? ret : failed;
}

static int restore(struct lvm *v)
{
	struct kvmdirty_mig_guest *g;
	uint64_t pages;
	char err[512];
	int ret;

	if (describe(v, true, &g))
		return 1;
	ret = kvmdirty_mig_restore(g, (const char *const *)v->run.files, v->run.nr_files, &pages, err, sizeof(err));
	kvmdirty_mig_guest_free(g);
	if (ret < 0) {
		fprintf(stderr, PROG ": --restore refused, the guest does not run: %s\n", err);
		return 1;
	}
	fprintf(stderr, PROG ": restored %u file(s): %" PRIu64 " pages, each matched its hash; running the guest\n",
		v->run.nr_files, pages);
	return start_arrived(v);
}

/* A guest that boots here. */
static int boot(struct lvm *v)
{
	unsigned int i;
	char err[512];
	int ret;

	ret = boot_load(v->mem, v->mem_size, (unsigned int)v->vcpus, &v->boot, err, sizeof(err));
	if (ret < 0) {
		fprintf(stderr, PROG ": %s\n", err);
		return 1;
	}
	ret = boot_setup_bsp(kvmdirty_vcpu_fd(v->vcpu[0]));
	if (ret < 0)
		return fail("setting up the bootstrap vCPU", ret);
	for (i = 0; i < v->vcpus && !v->no_xsave; i++)
		if ((ret = boot_setup_xcr0(kvmdirty_vcpu_fd(v->vcpu[i]), v->cpuid)) < 0)
			return fail("setting XCR0", ret);
	fprintf(stderr, PROG ": booting %s: %" PRIu64 " MiB, %" PRIu64 " vCPU(s), \"%s\"\n", v->boot.kernel, v->mib,
		v->vcpus, v->boot.cmdline);
	ret = spawn(v);
	if (ret < 0) {
		end_guest(v, 1, "starting the vCPUs: %s", strerror(-ret));
		return wait_end(v);
	}
	if (v->run.mode == MIGRATE_TO)
		return migrate_to(v);
	if (v->run.mode == SNAPSHOT)
		return snapshots(v);
	return wait_end(v);
}

/* ---- the command line -------------------------------------------------- */

static void usage(FILE *f)
{
	fprintf(f, "usage: " PROG " --kernel VMLINUZ [--initrd FILE] [--append ARGS] [--mem MIB] [--vcpus N]\n"
		   "                      [--track log|ring] [--migrate-to ADDR [--after MS] | --incoming ADDR |\n"
		   "                       --snapshot PREFIX [--every MS] [--count N] | --restore FILE...]\n"
		   "                      [--psk FILE [--encrypt]] [--connections N] [--on-signal] [--no-xsave]\n"
		   "                      [--drop-devices]\n");
}

static int addr_ok(const char *opt, const char *addr)
{
	char err[256];

	if (kvmdirty_mig_addr_check(addr, err, sizeof(err)) == 0)
		return 0;
	fprintf(stderr, PROG ": %s: %s\n", opt, err);
	return 2;
}

/* 0, or the exit status of a bad command line (2) or of help (-1: 0). */
static int parse(int argc, char **argv, struct lvm *v)
{
	static const struct option longopts[] = {
		{ "kernel", required_argument, NULL, 'k' },    { "initrd", required_argument, NULL, 'i' },
		{ "append", required_argument, NULL, 'a' },    { "mem", required_argument, NULL, 'm' },
		{ "vcpus", required_argument, NULL, 'v' },     { "track", required_argument, NULL, 't' },
		{ "migrate-to", required_argument, NULL, 'M' }, { "after", required_argument, NULL, 'A' },
		{ "incoming", required_argument, NULL, 'I' },  { "snapshot", required_argument, NULL, 'N' },
		{ "every", required_argument, NULL, 'E' },     { "count", required_argument, NULL, 'C' },
		{ "restore", no_argument, NULL, 'R' },	       { "psk", required_argument, NULL, 'P' },
		{ "encrypt", no_argument, NULL, 'e' },	       { "connections", required_argument, NULL, 'c' },
		{ "drop-devices", no_argument, NULL, 'D' },    { "help", no_argument, NULL, 'h' },
		{ "on-signal", no_argument, NULL, 'S' },      { "no-xsave", no_argument, NULL, 'X' },
		{ 0 },
	};
	int c, ret = 0;

	while (ret == 0 && (c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
		switch (c) {
		case 'k': v->boot.kernel = optarg; break;
		case 'i': v->boot.initrd = optarg; break;
		case 'a': v->append = optarg; break;
		case 'm': ret = cli_number(PROG, "--mem", optarg, BOOT_MIN_MEM >> 20, BOOT_MAX_MEM >> 20, &v->mib) ? 2 : 0; break;
		case 'v': ret = cli_number(PROG, "--vcpus", optarg, 1, BOOT_MAX_VCPUS, &v->vcpus) ? 2 : 0; break;
		case 'A': ret = cli_number(PROG, "--after", optarg, 0, 3600000, &v->after_ms) ? 2 : 0; break;
		case 'E': ret = cli_number(PROG, "--every", optarg, 1, 3600000, &v->every_ms) ? 2 : 0; break;
		case 'C': ret = cli_number(PROG, "--count", optarg, 1, 1000000, &v->count) ? 2 : 0; break;
		case 'c':
			ret = cli_number(PROG, "--connections", optarg, 1, KVMDIRTY_MIG_MAX_CONNS, &v->conns) ? 2 : 0;
			break;
		case 't':
			if (!strcmp(optarg, "log"))
				v->track = KVMDIRTY_MODE_CLEAR_LOG;
			else if (!strcmp(optarg, "ring"))
				v->track = KVMDIRTY_MODE_DIRTY_RING;
			else {
				fprintf(stderr, PROG ": --track '%s': expected log or ring\n", optarg);
				ret = 2;
			}
			break;
		case 'M': ret = vmm_mode_set(PROG, &v->run, MIGRATE_TO, optarg) ? 2 : addr_ok("--migrate-to", optarg); break;
		case 'I': ret = vmm_mode_set(PROG, &v->run, INCOMING, optarg) ? 2 : addr_ok("--incoming", optarg); break;
		case 'N': ret = vmm_mode_set(PROG, &v->run, SNAPSHOT, optarg); break;
		case 'R': ret = vmm_mode_set(PROG, &v->run, RESTORE, NULL); break;
		case 'P': v->psk = optarg; break;
		case 'e': v->encrypt = true; break;
		case 'D': v->drop_devices = true; break;
		case 'S': v->on_signal = true; break;
		case 'X': v->no_xsave = true; break;
		case 'h': usage(stdout); return -1;
		default: return 2; /* getopt said what was wrong, in one line */
		}
	}
	if (ret)
		return ret;
	if (vmm_mode_rest(PROG, &v->run, argc, argv, optind))
		return 2;
	if (v->run.mode != INCOMING && v->run.mode != RESTORE && !v->boot.kernel) {
		fprintf(stderr, PROG ": --kernel: required to boot a guest (not with --incoming or --restore)\n");
		return 2;
	}
	if ((v->run.mode == INCOMING || v->run.mode == RESTORE) && (v->boot.kernel || v->boot.initrd || v->append)) {
		fprintf(stderr, PROG ": --kernel, --initrd, --append: the guest arrives with %s, not booted\n",
			v->run.mode == INCOMING ? "--incoming" : "--restore");
		return 2;
	}
	if (v->encrypt && !v->psk) {
		fprintf(stderr, PROG ": --encrypt: needs --psk FILE\n");
		return 2;
	}
	if ((v->psk || v->conns) && v->run.mode != MIGRATE_TO && v->run.mode != INCOMING) {
		fprintf(stderr, PROG ": --psk, --connections: only with --migrate-to or --incoming\n");
		return 2;
	}
	if (v->psk) {
		char err[512];

		if (kvmdirty_mig_key_check(v->psk, err, sizeof(err)) < 0) {
			fprintf(stderr, PROG ": %s\n", err); /* it names --psk and the file */
			return 2;
		}
	}
	if (snprintf(v->cmdline, sizeof(v->cmdline), "%s%s%s", DEFAULT_CMDLINE, v->append ? " " : "",
		     v->append ? v->append : "") >= (int)sizeof(v->cmdline)) {
		fprintf(stderr, PROG ": --append: longer than the %u bytes of a command line\n", BOOT_CMDLINE_MAX);
		return 2;
	}
	v->boot.cmdline = v->cmdline;
	return 0;
}

int main(int argc, char **argv)
{
	/* static: the detached input thread may still wake in read() as the process exits */
	static struct lvm v = { .mib = 256, .vcpus = 2, .after_ms = 3000, .every_ms = 2000, .count = 3,
			 .track = KVMDIRTY_MODE_CLEAR_LOG, .lock = PTHREAD_MUTEX_INITIALIZER,
			 .rtc_lock = PTHREAD_MUTEX_INITIALIZER,
			 .cond = PTHREAD_COND_INITIALIZER };
	pthread_t input;
	sigset_t set;
	int ret, fd;

	/*
	 * Every thread, the library's included, inherits these: only
	 * dump_thread() takes SIGQUIT, only wait_turn() SIGUSR2 (--on-signal).
	 */
	sigemptyset(&set);
	sigaddset(&set, SIGQUIT);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN); /* a console reader gone is EPIPE on a write (dropped), not the VMM's end */
	ret = parse(argc, argv, &v);
	if (ret)
		return ret < 0 ? 0 : ret;
	/* a closed stdin, stdout or stderr: /dev/null there, not the next file opened (the console writes to 1) */
	while ((fd = open("/dev/null", O_RDWR | O_CLOEXEC)) >= 0 && fd <= STDERR_FILENO)
		if (fcntl(fd, F_SETFD, 0) < 0)
			break;
	if (fd > STDERR_FILENO)
		close(fd);
	ret = kvm_host_check(PROG ": ");
	if (ret)
		return ret;
	if (v.on_signal) {
		sigemptyset(&set);
		sigaddset(&set, SIGUSR2);
		pthread_sigmask(SIG_BLOCK, &set, NULL);
	}
	ret = build(&v);
	if (ret == 0) {
		/* the console's input: the thread may outlive the VM in read(); serial_close() fences it */
		if (pthread_create(&input, NULL, input_thread, &v) == 0)
			pthread_detach(input);
		else
			fprintf(stderr, PROG ": no console input: the input thread could not start\n");
		/* SIGQUIT's register dump: like the input thread, left to the process's exit */
		if (pthread_create(&input, NULL, dump_thread, &v) == 0)
			pthread_detach(input);
		else
			fprintf(stderr, PROG ": SIGQUIT will print nothing: its thread could not start\n");
		ret = v.run.mode == INCOMING ? incoming(&v) : v.run.mode == RESTORE ? restore(&v) : boot(&v);
	}
	teardown(&v);
	return ret;
}
