// SPDX-License-Identifier: MIT
#include <string.h>
#include <time.h>

#include "rtc.h"

#define REG_A 0x0a /* divider; bit 7: update in progress */
#define REG_B 0x0b /* bit 1: 24-hour, bit 2: binary (clear: BCD) */
#define REG_C 0x0c
#define REG_D 0x0d /* bit 7: the battery holds */

void rtc_init(struct rtc_regs *r)
{
	memset(r, 0, sizeof(*r));
	r->cmos[REG_A] = 0x26; /* 32.768 kHz, 1024 Hz: what a PC's firmware leaves */
	r->cmos[REG_B] = 0x02;
	r->cmos[REG_D] = 0x80;
}

static uint8_t bcd(int v)
{
	return (uint8_t)(((v / 10) << 4) | (v % 10));
}

static uint8_t read_reg(struct rtc_regs *r, uint8_t i)
{
	time_t now = time(NULL);
	struct tm tm;

	gmtime_r(&now, &tm);
	switch (i) {
	case 0x00: return bcd(tm.tm_sec);
	case 0x02: return bcd(tm.tm_min);
	case 0x04: return bcd(tm.tm_hour);
	case 0x06: return bcd(tm.tm_wday + 1);
	case 0x07: return bcd(tm.tm_mday);
	case 0x08: return bcd(tm.tm_mon + 1);
	case 0x09: return bcd(tm.tm_year % 100);
	case 0x32: return bcd(tm.tm_year / 100 + 19); /* century */
	case REG_A: return r->cmos[REG_A] & 0x7f;
	case REG_B: return (r->cmos[REG_B] & ~0x04) | 0x02; /* BCD, 24-hour whatever was written */
	case REG_C: return 0;
	case REG_D: return 0x80;
	default: return r->cmos[i];
	}
}

void rtc_io(struct rtc_regs *r, uint16_t port, bool write, uint8_t *data)
{
	if (port == 0x70) {
		if (write)
			r->index = *data & 0x7f; /* bit 7 masks NMIs: nothing here to mask */
		else
			*data = 0xff;
		return;
	}
	if (write)
		r->cmos[r->index] = *data;
	else
		*data = read_reg(r, r->index);
}
