/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_LINUX_RTC_H
#define KVMDIRTY_LINUX_RTC_H

/*
 * The PC's CMOS clock (MC146818) at ports 0x70 (index) and 0x71 (data),
 * read-only time: the host's UTC in BCD, never "update in progress", the
 * battery good.  Without one, the kernel's rtc-cmos reads 0xff from every
 * register: "update in progress" for ever, where it waits.  No alarm and
 * no periodic interrupt; writes go to a scratch copy of the 128 bytes.
 * Its state (the index and the bytes written) travels with the console's.
 */
#include <stdbool.h>
#include <stdint.h>

struct rtc_regs {
	uint8_t index;
	uint8_t cmos[128];
};

void rtc_init(struct rtc_regs *r);
/* A guest access to port 0x70 or 0x71. */
void rtc_io(struct rtc_regs *r, uint16_t port, bool write, uint8_t *data);

#endif
