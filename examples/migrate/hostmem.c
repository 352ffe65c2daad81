// SPDX-License-Identifier: MIT
/* The host's page tables and mappings, as the source needs them (hostmem.h). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "hostmem.h"

int mig_hostmem_private_anon(const void *hva, uint64_t size)
{
	uint64_t at = (uintptr_t)hva, end = at + size;
	FILE *f = fopen("/proc/self/maps", "re");
	char line[4096];
	int ret = 0;

	if (!f)
		return -errno;
	/* lines are in address order: walk the mappings that cover [at, end) */
	while (at < end && fgets(line, sizeof(line), f)) {
		uint64_t lo, hi, off, inode;
		char perms[8], dev[16];
		int n = 0;

		if (sscanf(line, "%" SCNx64 "-%" SCNx64 " %7s %" SCNx64 " %15s %" SCNu64 " %n", &lo, &hi, perms, &off,
			   dev, &inode, &n) < 6)
			continue;
		if (hi <= at)
			continue;
		if (lo > at)
			break; /* a hole */
		/*
		 * Private ('p') with no inode: plain anonymous memory, also
		 * [heap], [stack] and named anonymous mappings; a private
		 * file mapping has an inode, shared memory an 's'.
		 */
		if (perms[3] != 'p' || inode != 0)
			break;
		at = hi;
	}
	if (at >= end)
		ret = 1;
	fclose(f);
	return ret;
}

/* What mig_pagemap_keep() opened, and in which process: a child's pagemap is another file. */
static int kept_fd = -1;
static pid_t kept_pid;

int mig_pagemap_keep(void)
{
	if (kept_fd < 0) {
		kept_fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
		if (kept_fd < 0)
			return -errno;
		kept_pid = getpid();
	}
	return 0;
}

int mig_pagemap_open(void)
{
	int fd;

	if (kept_fd >= 0 && kept_pid == getpid())
		fd = fcntl(kept_fd, F_DUPFD_CLOEXEC, 0);
	else
		fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

int mig_pagemap_read(int fd, const void *hva, uint64_t n, uint64_t *ret_entries)
{
	uint64_t off = (uintptr_t)hva / 4096 * sizeof(uint64_t), done = 0, len = n * sizeof(uint64_t);

	while (done < len) {
		ssize_t k = pread(fd, (char *)ret_entries + done, len - done, (off_t)(off + done));

		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return k < 0 ? -errno : -EIO;
		done += (uint64_t)k;
	}
	return 0;
}
