// SPDX-License-Identifier: MIT
/* The host's page tables and mappings, as the source needs them (hostmem.h). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "hostmem.h"

/* One mapping of /proc/self/maps: [lo, hi), and whether it is private anonymous memory. */
struct mapping {
	uint64_t lo, hi;
	bool anon;
};

/* Every mapping, in address order (as the file lists them); -errno. */
static int read_maps(struct mapping **ret, size_t *ret_n)
{
	FILE *f = fopen("/proc/self/maps", "re");
	struct mapping *m = NULL, *grown;
	size_t n = 0, cap = 0;
	char line[4096];

	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		uint64_t lo, hi, off, inode;
		char perms[8], dev[16];

		if (sscanf(line, "%" SCNx64 "-%" SCNx64 " %7s %" SCNx64 " %15s %" SCNu64, &lo, &hi, perms, &off, dev,
			   &inode) < 6)
			continue;
		if (n == cap) {
			cap = cap ? 2 * cap : 256;
			grown = realloc(m, cap * sizeof(*m));
			if (!grown) {
				free(m);
				fclose(f);
				return -ENOMEM;
			}
			m = grown;
		}
		/*
		 * Private ('p') with no inode: plain anonymous memory, also
		 * [heap], [stack] and named anonymous mappings; a private
		 * file mapping has an inode, shared memory an 's'.
		 */
		m[n++] = (struct mapping){ lo, hi, perms[3] == 'p' && inode == 0 };
	}
	fclose(f);
	*ret = m;
	*ret_n = n;
	return 0;
}

/* 1 if [at, end) lies wholly in the anonymous mappings of m[0..n), else 0. */
static int anon_in(const struct mapping *m, size_t n, uint64_t at, uint64_t end)
{
	size_t lo = 0, hi = n;

	/* the first mapping that ends after at */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (m[mid].hi <= at)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (; at < end && lo < n; lo++) {
		if (m[lo].lo > at || !m[lo].anon)
			return 0; /* a hole, or not anonymous */
		at = m[lo].hi;
	}
	return at >= end;
}

int mig_hostmem_private_anon_n(void *const *hva, const uint64_t *size, unsigned int n, bool *ret_anon)
{
	struct mapping *m;
	size_t nm;
	unsigned int i;
	int ret = read_maps(&m, &nm);

	for (i = 0; i < n; i++)
		ret_anon[i] = ret == 0 && anon_in(m, nm, (uintptr_t)hva[i], (uintptr_t)hva[i] + size[i]) == 1;
	if (ret == 0)
		free(m);
	return ret;
}

int mig_hostmem_private_anon(const void *hva, uint64_t size)
{
	void *h = (void *)hva;
	bool anon;
	int ret = mig_hostmem_private_anon_n(&h, &size, 1, &anon);

	return ret < 0 ? ret : anon;
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

int mig_walk_touched(int pagemap, bool anon, const void *hva, uint64_t n, uint64_t *pme,
		     int (*fn)(void *ctx, uint64_t first, uint64_t count, bool untouched), void *ctx)
{
	uint64_t done = 0, k, i, j;
	int ret;

	while (done < n) {
		k = n - done < MIG_PM_BATCH ? n - done : MIG_PM_BATCH;
		if (!anon || pagemap < 0 || mig_pagemap_read(pagemap, (const uint8_t *)hva + done * 4096, k, pme) < 0) {
			ret = fn(ctx, done, k, false);
			if (ret < 0)
				return ret;
			done += k;
			continue;
		}
		for (i = 0; i < k; i = j) {
			bool untouched = mig_pm_untouched(pme[i]);

			for (j = i + 1; j < k && mig_pm_untouched(pme[j]) == untouched; j++)
				;
			ret = fn(ctx, done + i, j - i, untouched);
			if (ret < 0)
				return ret;
		}
		done += k;
	}
	return 0;
}
