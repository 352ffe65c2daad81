// SPDX-License-Identifier: MIT
/*
 * The test guest's workload: freestanding C, run in 64-bit mode at CPL 3
 * (natively here) or CPL 0 (through KVM's emulator on this host).  Each pass
 * writes a struct guest_tag {gfn, pass} at the start of every page it
 * touches, so the host can tell which pass last wrote each page.
 *
 * Port I/O works at CPL 3 because the host starts the guest with IOPL 3.
 * There is no IDT: any exception shuts the guest down, which the host sees
 * as KVM_EXIT_SHUTDOWN.
 */
#include <stdbool.h>
#include <stdint.h>

#include "guest-abi.h"

void guest_main(struct guest_vcpu *v);

static inline void outl(uint16_t port, uint32_t val)
{
	__asm__ volatile("outl %0, %1" : : "a"(val), "Nd"(port) : "memory");
}

static inline uint64_t rdtsc(void)
{
	uint32_t lo, hi;

	__asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
	return ((uint64_t)hi << 32) | lo;
}

static inline void cpu_relax(void)
{
	__asm__ volatile("pause" ::: "memory");
}

/* Check (if asked) and write the tag of one page; false if the check failed. */
static bool touch(struct guest_vcpu *v, uint64_t index, uint64_t pass)
{
	uint64_t gpa = v->gpa + index * GUEST_PAGE_SIZE;
	volatile struct guest_tag *t = (volatile struct guest_tag *)gpa;
	uint64_t gfn = gpa / GUEST_PAGE_SIZE;

	if (v->flags & (GUEST_F_CHECK | GUEST_F_CHECK_EXACT)) {
		uint64_t seen_gfn = t->gfn, seen_pass = t->pass;
		bool ok;

		if (v->flags & GUEST_F_CHECK_EXACT)
			ok = seen_gfn == gfn && seen_pass + 1 == pass;
		else
			ok = (seen_gfn == gfn && seen_pass <= pass) || (!seen_gfn && !seen_pass);
		if (!ok) {
			v->err_gpa = gpa;
			v->err_tag[0] = seen_gfn;
			v->err_tag[1] = seen_pass;
			outl(GUEST_PORT_ERROR, (uint32_t)index);
			return false;
		}
	}
	t->gfn = gfn;
	t->pass = pass;
	v->writes++;
	return true;
}

/* kvmclock's page (KVM's struct pvclock_vcpu_time_info) */
struct pvclock {
	volatile uint32_t version, pad0;
	volatile uint64_t tsc_timestamp, system_time;
	volatile uint32_t tsc_to_system_mul;
	volatile int8_t tsc_shift;
	volatile uint8_t flags, pad[2];
};

/* kvmclock's time now, in ns; 0 while KVM has not written the page */
static uint64_t kvmclock_ns(const struct pvclock *p)
{
	uint32_t version;
	uint64_t ns, delta;

	do {
		version = p->version;
		__asm__ volatile("" ::: "memory");
		delta = rdtsc() - p->tsc_timestamp;
		if (p->tsc_shift < 0)
			delta >>= -p->tsc_shift;
		else
			delta <<= p->tsc_shift;
		ns = p->system_time + (uint64_t)(((unsigned __int128)delta * p->tsc_to_system_mul) >> 32);
		__asm__ volatile("" ::: "memory");
	} while ((version & 1) || version != p->version);
	return version ? ns : 0;
}

static bool state_failed(struct guest_vcpu *v, uint64_t check, uint64_t seen)
{
	v->err_gpa = 0;
	v->err_tag[0] = check;
	v->err_tag[1] = seen;
	outl(GUEST_PORT_ERROR, (uint32_t)check);
	return false;
}

/* GUEST_F_STATE's checks (guest-abi.h), once a pass. */
static bool check_state(struct guest_vcpu *v)
{
	uint64_t ymm[4], ns;
	unsigned int i;

	/* the MSRs as the timer's handler read them, once it ran */
	if (v->st_ticks) {
		if (v->st_seen_pat != v->st_pat)
			return state_failed(v, GUEST_STATE_PAT, v->st_seen_pat);
		if (v->st_seen_kvmclock != v->st_kvmclock)
			return state_failed(v, GUEST_STATE_KVMCLOCK_MSR, v->st_seen_kvmclock);
	}
	__asm__ volatile("vmovdqu %%ymm15, %0" : "=m"(ymm));
	for (i = 0; i < 4; i++)
		if (ymm[i] != v->st_ymm[i])
			return state_failed(v, GUEST_STATE_YMM, ymm[i]);
	if (v->flags & GUEST_F_SYSCALL) {
		uint64_t before = v->st_syscalls;

		__asm__ volatile("syscall" : : "D"(v) : "rcx", "r11", "memory");
		if (v->st_syscalls != before + 1)
			return state_failed(v, GUEST_STATE_SYSCALL, v->st_syscalls - before);
		if (v->st_seen_aux != v->st_aux)
			return state_failed(v, GUEST_STATE_TSC_AUX, v->st_seen_aux);
	}
	ns = kvmclock_ns((const struct pvclock *)v->st_pvclock_gpa);
	if (ns < v->st_last_ns)
		return state_failed(v, GUEST_STATE_TIME_BACK, v->st_last_ns - ns);
	v->st_last_ns = ns;
	v->st_checks++;
	return true;
}

/* Spin until the next write is due, when the host asked for a rate. */
static inline void pace(const struct guest_vcpu *v, uint64_t *due)
{
	if (!v->tsc_per_page)
		return;
	*due += v->tsc_per_page;
	if ((v->flags & GUEST_F_PACE_STEADY) && (int64_t)(rdtsc() - *due) > (int64_t)v->tsc_per_page)
		*due = rdtsc();
	while ((int64_t)(rdtsc() - *due) < 0)
		cpu_relax();
}

/* xorshift64, scaled to [0, n) by a multiply instead of a division */
static inline uint64_t next_random(uint64_t *x, uint64_t n)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return (uint64_t)(((unsigned __int128)*x * n) >> 64);
}

static bool run_pass(struct guest_vcpu *v, uint64_t pass, uint64_t *rng, uint64_t *due)
{
	uint64_t i, j, n = v->pages, s = v->stride ? v->stride : 1;

	switch (v->pattern) {
	case GUEST_RANDOM:
		for (i = 0; i < n; i++) {
			pace(v, due);
			if (!touch(v, next_random(rng, n), pass))
				return false;
		}
		break;
	case GUEST_STRIDED:
		for (i = 0; i < s && i < n; i++) {
			for (j = i; j < n; j += s) {
				pace(v, due);
				if (!touch(v, j, pass))
					return false;
			}
		}
		break;
	case GUEST_COMPUTE:
		/* pages units of work, none writing memory but the mailbox's counter */
		for (i = 0; i < n; i++) {
			for (j = 0; j < GUEST_COMPUTE_ROUNDS; j++)
				next_random(rng, 1);
			v->writes++;
			if (v->stop)
				break;
		}
		break;
	default:
		for (i = 0; i < n; i++) {
			pace(v, due);
			if (!touch(v, i, pass))
				return false;
		}
		break;
	}
	return true;
}

void guest_main(struct guest_vcpu *v)
{
	uint64_t pass = v->pass, rng = v->seed | 1, due = rdtsc();

	if (v->pattern == GUEST_EXIT_LOOP) {
		while (!v->stop) {
			outl(GUEST_PORT_TICK, 0);
			v->writes++;
		}
	} else if (v->pattern == GUEST_IDLE) {
		while (!v->stop) {
			v->pass = ++pass;
			outl(GUEST_PORT_IDLE, (uint32_t)pass);
		}
	} else {
		/* ymm15 holds the value from here on: only a whole XSAVE state keeps it */
		if (v->flags & GUEST_F_STATE)
			__asm__ volatile("vmovdqu %0, %%ymm15" : : "m"(v->st_ymm));
		while (!v->stop && (!v->until_pass || pass < v->until_pass)) {
			if ((v->flags & GUEST_F_STATE) && !check_state(v))
				break;
			if (!run_pass(v, pass + 1, &rng, &due))
				break;
			v->pass = ++pass;
			if (v->flags & GUEST_F_EXIT_EVERY_PASS)
				outl(GUEST_PORT_PASS, (uint32_t)pass);
		}
	}
	for (;;)
		outl(GUEST_PORT_DONE, (uint32_t)pass);
}
