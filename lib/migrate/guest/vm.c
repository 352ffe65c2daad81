// SPDX-License-Identifier: MIT
/*
 * The VM's own state through KVM's ioctls on the VM fd (guest.h): the
 * in-kernel irqchip (both PICs, the IOAPIC), the PIT and the clock,
 * each where the VM has it; loaded in that order, the clock last.
 */
#include <errno.h>
#include <string.h>
#include <sys/ioctl.h>

#include "guest.h"

int mig_vm_save_kvm(int fd, struct mig_vm_state *st)
{
	static const uint32_t ids[3] = { KVM_IRQCHIP_PIC_MASTER, KVM_IRQCHIP_PIC_SLAVE, KVM_IRQCHIP_IOAPIC };
	struct kvm_irqchip *chip[3] = { &st->pic[0], &st->pic[1], &st->ioapic };
	unsigned int i;

	memset(st, 0, sizeof(*st));
	/* no in-kernel irqchip (ENXIO) or PIT (ENXIO): a part not saved */
	for (i = 0; i < 3; i++) {
		chip[i]->chip_id = ids[i];
		if (ioctl(fd, KVM_GET_IRQCHIP, chip[i]) < 0) {
			if (errno != ENXIO && errno != EINVAL)
				return -errno;
			break;
		}
	}
	if (i == 3)
		st->parts |= MIG_VMS_IRQCHIP;
	else
		memset(st->pic, 0, sizeof(st->pic) + sizeof(st->ioapic));
	if (ioctl(fd, KVM_GET_PIT2, &st->pit) == 0)
		st->parts |= MIG_VMS_PIT;
	else if (errno != ENXIO && errno != EINVAL)
		return -errno;
	else
		memset(&st->pit, 0, sizeof(st->pit));
	if (ioctl(fd, KVM_GET_CLOCK, &st->clock) < 0)
		return -errno;
	/* the clock's value alone: the host's realtime and TSC beside it are this host's */
	st->clock = (struct kvm_clock_data){ .clock = st->clock.clock };
	st->parts |= MIG_VMS_CLOCK;
	return 0;
}

int mig_vm_load_kvm(int fd, const struct mig_vm_state *st)
{
	struct kvm_irqchip chip;
	unsigned int i;

	for (i = 0; (st->parts & MIG_VMS_IRQCHIP) && i < 3; i++) {
		chip = i < 2 ? st->pic[i] : st->ioapic;
		if (ioctl(fd, KVM_SET_IRQCHIP, &chip) < 0)
			return -errno;
	}
	if ((st->parts & MIG_VMS_PIT) && ioctl(fd, KVM_SET_PIT2, &st->pit) < 0)
		return -errno;
	if (st->parts & MIG_VMS_CLOCK) {
		struct kvm_clock_data c = { .clock = st->clock.clock };

		if (ioctl(fd, KVM_SET_CLOCK, &c) < 0)
			return -errno;
	}
	return 0;
}
