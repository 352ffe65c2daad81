// SPDX-License-Identifier: MIT
/*
 * userfaultfd for guest memory: open, register, place, wake (uffd.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/userfaultfd.h>

#include "errf.h"
#include "uffd.h"

int mig_uffd_open(char *err, size_t len)
{
	struct uffdio_api api = { .api = UFFD_API };
	int fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK);

	if (fd < 0) {
		int e = errno;

		if (e == EPERM)
			return mig_errf(err, len, -e, "userfaultfd: %s (a caller without CAP_SYS_PTRACE where "
				       "vm.unprivileged_userfaultfd is 0, or a seccomp filter)", strerror(e));
		return mig_errf(err, len, -e, "userfaultfd: %s (no userfaultfd in this kernel, or a seccomp filter)",
				strerror(e));
	}
	if (ioctl(fd, UFFDIO_API, &api) < 0) {
		int e = errno;

		close(fd);
		return mig_errf(err, len, -e, "userfaultfd: UFFDIO_API: %s", strerror(e));
	}
	return fd;
}

int mig_uffd_register(int uffd, void *hva, uint64_t size, uint32_t r, uint64_t gpa, char *err, size_t len)
{
	struct uffdio_register reg = { .range = { .start = (uint64_t)(uintptr_t)hva, .len = size },
				       .mode = UFFDIO_REGISTER_MODE_MISSING };
	uint64_t need = 1ull << _UFFDIO_COPY | 1ull << _UFFDIO_ZEROPAGE;

	if (ioctl(uffd, UFFDIO_REGISTER, &reg) < 0)
		return mig_errf(err, len, -errno,
				"region %u (gpa 0x%" PRIx64 "): userfaultfd takes no missing pages there: %s "
				"(private anonymous or shared memory only)", r, gpa, strerror(errno));
	if ((reg.ioctls & need) != need) {
		mig_uffd_unregister(uffd, hva, size);
		return mig_errf(err, len, -EOPNOTSUPP,
				"region %u (gpa 0x%" PRIx64 "): userfaultfd cannot place 4 KiB and zero pages there "
				"(huge pages?): private anonymous or shared memory only", r, gpa);
	}
	return 0;
}

void mig_uffd_unregister(int uffd, void *hva, uint64_t size)
{
	struct uffdio_range rg = { .start = (uint64_t)(uintptr_t)hva, .len = size };

	ioctl(uffd, UFFDIO_UNREGISTER, &rg);
}

int64_t mig_uffd_place(int uffd, void *dst, const void *src, uint64_t len)
{
	for (;;) {
		int64_t res;
		int rc;

		if (src) {
			struct uffdio_copy c = { .dst = (uint64_t)(uintptr_t)dst, .src = (uint64_t)(uintptr_t)src,
						 .len = len };

			rc = ioctl(uffd, UFFDIO_COPY, &c);
			res = c.copy;
		} else {
			struct uffdio_zeropage z = { .range = { .start = (uint64_t)(uintptr_t)dst, .len = len } };

			rc = ioctl(uffd, UFFDIO_ZEROPAGE, &z);
			res = z.zeropage;
		}
		if (rc == 0)
			return (int64_t)len;
		if (res > 0)
			return res;
		if (res == -EAGAIN || (res == 0 && errno == EAGAIN))
			continue;
		if (res == -EEXIST || (res == 0 && errno == EEXIST)) {
			mig_uffd_wake(uffd, dst, 4096);
			return -EEXIST;
		}
		return res < 0 ? res : -errno;
	}
}

void mig_uffd_wake(int uffd, void *dst, uint64_t len)
{
	struct uffdio_range w = { .start = (uint64_t)(uintptr_t)dst, .len = len };

	ioctl(uffd, UFFDIO_WAKE, &w);
}
