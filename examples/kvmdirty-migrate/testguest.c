// SPDX-License-Identifier: MIT
/*
 * The test VM of examples/vmm as kvmdirty-migrate builds it, and behind
 * the public API's guest (kvmdirty-migrate.h).  Nothing of the engine's
 * own: its view for the engine's tests is testguest-engine.c.
 */
#include <errno.h>
#include <signal.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include "../common/say.h"
#include "testguest.h"

#define PAGE GUEST_PAGE_SIZE

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/*
 * A vCPU is judged on progress only if its thread had this much CPU time
 * (or ended by itself), and its pacing allows this many writes in it: on a
 * busy host a thread may hardly run in the time the check gives it.
 */
#define MIN_CPU_MS 20
#define MIN_EXPECTED_WRITES 16

/* GUEST_COMPUTE units a pass (about a millisecond natively): the pass counter moves too */
#define COMPUTE_UNITS 1024

/* Working set pages of each vCPU that dirties memory, laid one after another from the start of data memory. */
static int plan_work(const struct mig_testvm_opts *g, uint64_t ret_pages[], char *err, size_t len)
{
	unsigned int i, shares = 0;
	uint64_t total = 0;

	for (i = 0; i < g->vcpus; i++)
		shares += g->work[i].kind == MIG_WORK_SHARE;
	for (i = 0; i < g->vcpus; i++) {
		const struct mig_vcpu_work *w = &g->work[i];

		ret_pages[i] = w->kind == MIG_WORK_DIRTY ? (w->mib << 20) / PAGE
			       : w->kind == MIG_WORK_SHARE ? (g->ws_mib << 20) / shares / PAGE : 0;
		total += ret_pages[i];
	}
	if (total > (g->mib << 20) / PAGE)
		return say(err, len, -EINVAL, "working sets of %" PRIu64 " MiB exceed memory %" PRIu64 " MiB",
				(uint64_t)(total * PAGE >> 20), g->mib);
	return 0;
}

int mig_testvm_check(const struct mig_testvm_opts *g, char *err, size_t len)
{
	uint64_t pages[GUEST_MAX_VCPUS];

	if (!g->vcpus || g->vcpus > GUEST_MAX_VCPUS)
		return say(err, len, -EINVAL, "%u vCPUs: 1 to %u", g->vcpus, GUEST_MAX_VCPUS);
	if (g->regions > MIG_TESTVM_MAX_REGIONS || g->regions > (g->mib << 20) / PAGE)
		return say(err, len, -EINVAL, "--regions %u: at most %u, and no more than memory's %" PRIu64 " pages",
				g->regions, MIG_TESTVM_MAX_REGIONS, (uint64_t)((g->mib << 20) / PAGE));
	return plan_work(g, pages, err, len);
}

/* The data memory: its regions lie one after another from MIG_DATA_GPA, in guest and host addresses alike. */
static uint8_t *data_mem(struct testvm *tv, uint64_t *ret_size)
{
	struct kvmdirty_region *r = tv ? kvmdirty_region_from_gpa(tv->vm, MIG_DATA_GPA) : NULL;
	uint8_t *hva = r ? kvmdirty_region_hva(r) : NULL;
	uint64_t size = 0;

	while (r && (uint8_t *)kvmdirty_region_hva(r) == hva + size) {
		size += kvmdirty_region_size(r);
		r = kvmdirty_region_from_gpa(tv->vm, MIG_DATA_GPA + size);
	}
	*ret_size = size;
	return hva;
}

/* The data memory: anonymous (testvm's), or the caller's file; in g->regions regions. */
static int add_data(struct testvm *tv, const struct mig_testvm_opts *g, void **ret_mem)
{
	uint64_t size = g->mib << 20, n = g->regions > 1 ? g->regions : 1, part = size / n / PAGE * PAGE, i;
	uint8_t *mem;
	int ret = 0;

	mem = g->data_file ? mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, g->data_fd, 0) : testvm_map(size);
	if (!mem || mem == MAP_FAILED)
		return g->data_file ? -errno : -ENOMEM;
	for (i = 0; i < n && ret == 0; i++)
		ret = kvmdirty_region_add(tv->vm, MIG_DATA_GPA + i * part, i + 1 < n ? part : size - i * part,
					  mem + i * part, 0, NULL);
	if (ret < 0) {
		/* the regions added go with the VM, which the caller frees */
		testvm_unmap(mem, size);
		return ret;
	}
	*ret_mem = mem;
	return 0;
}

/* The first line of path as a number (0 where it cannot be read, or says "max"). */
static uint64_t file_u64(const char *path)
{
	FILE *f = fopen(path, "re");
	uint64_t v = 0;

	if (f && fscanf(f, "%" SCNu64, &v) != 1)
		v = 0;
	if (f)
		fclose(f);
	return v;
}

/*
 * Bytes this process may still take: the host's MemAvailable, less where
 * its cgroup (v2) has a memory.max, what that leaves; 0 where not known.
 */
static uint64_t available_bytes(void)
{
	FILE *f = fopen("/proc/meminfo", "re");
	char line[4096], path[4200];
	uint64_t kib = 0, max, cur;
	bool known = false;

	while (f && !known && fgets(line, sizeof(line), f))
		known = sscanf(line, "MemAvailable: %" SCNu64 " kB", &kib) == 1;
	if (f)
		fclose(f);
	if (!known)
		return 0;
	f = fopen("/proc/self/cgroup", "re");
	while (f && fgets(line, sizeof(line), f)) {
		if (strncmp(line, "0::", 3))
			continue;
		line[strcspn(line, "\n")] = 0;
		snprintf(path, sizeof(path), "/sys/fs/cgroup%s/memory.max", line + 3);
		max = file_u64(path);
		snprintf(path, sizeof(path), "/sys/fs/cgroup%s/memory.current", line + 3);
		cur = file_u64(path);
		if (max && max / 1024 - (cur < max ? cur : max) / 1024 < kib)
			kib = max / 1024 - (cur < max ? cur : max) / 1024;
	}
	if (f)
		fclose(f);
	return kib * 1024;
}

bool mig_testvm_prefaults(const struct mig_testvm_opts *g, bool source)
{
	return !source && !g->data_file && !g->lazy && (g->mib << 20) <= available_bytes() / 2;
}

/* KVM_CAP_MAX_VCPUS of this host, or -errno. */
static int64_t max_vcpus(void)
{
	struct kvmdirty_vm *vm;
	int64_t max;
	int ret = kvmdirty_vm_new(&vm);

	if (ret < 0)
		return ret;
	max = kvmdirty_vm_cap(vm, KVMDIRTY_CAP_MAX_VCPUS);
	kvmdirty_vm_free(vm);
	return max;
}

int mig_testvm_new(const struct mig_testvm_opts *g, bool source, struct testvm **ret_tv, char *err, size_t len)
{
	/*
	 * Dirty ring: 512 entries (2 MiB of writes, about 20 ms of an
	 * 800 Mbit/s link, before a dirtier over its limit is held at a
	 * ring-full exit) and a reaper every 10 ms, whose harvests kick a
	 * vCPU over its limit out of KVM_RUN (SIGUSR1, testvm's kick).
	 */
	struct testvm_opts o = { .nr_vcpus = g->vcpus, .track = source,
				 .track_opts = { .mode = g->mode,
						 .ring_entries = g->mode == KVMDIRTY_MODE_DIRTY_RING ? 512 : 0,
						 .reaper_ms = g->mode == KVMDIRTY_MODE_DIRTY_RING ? 10 : 0 } };
	uint64_t pages[GUEST_MAX_VCPUS], at = 0, fill;
	int64_t max;
	struct testvm *tv;
	void *mem = NULL;
	unsigned int i;
	int ret;

	ret = mig_testvm_check(g, err, len);
	if (ret < 0)
		return ret;
	plan_work(g, pages, err, len);
	ret = testvm_new(&o, &tv);
	if (ret < 0 && (max = max_vcpus()) > 0 && g->vcpus > (uint64_t)max)
		return say(err, len, ret, "-v %u: this host's KVM allows %lld vCPUs", g->vcpus, (long long)max);
	if (ret < 0)
		return say(err, len, ret, "creating the VM: %s", strerror(-ret));
	ret = add_data(tv, g, &mem);
	if (ret < 0) {
		testvm_free(tv);
		return say(err, len, ret, "adding %" PRIu64 " MiB of guest memory: %s", g->mib, strerror(-ret));
	}
	/* first touches cost about 5 us a page on this nested host: not inside the migration */
	if (mig_testvm_prefaults(g, source) && madvise(mem, g->mib << 20, MADV_POPULATE_WRITE))
		memset(mem, 0, g->mib << 20);
	for (i = 0; source && i < g->vcpus; i++) {
		struct guest_vcpu *mb = testvm_mailbox(tv, i);
		enum mig_work kind = g->work[i].kind;

		mb->gpa = MIG_DATA_GPA + at * PAGE;
		mb->pages = pages[i];
		mb->pattern = GUEST_SEQUENTIAL;
		mb->tsc_per_page = testvm_tsc_per_page(tv, kind == MIG_WORK_DIRTY ? g->work[i].rate : g->rate);
		mb->flags = GUEST_F_CHECK;
		if (kind == MIG_WORK_COMPUTE) {
			mb->gpa = MIG_DATA_GPA;
			mb->pages = COMPUTE_UNITS;
			mb->pattern = GUEST_COMPUTE;
			mb->tsc_per_page = 0;
			mb->flags = 0;
		} else if (!pages[i]) {
			/* nothing to write: idle as a guest's vCPU does, not spinning on a host CPU */
			mb->pattern = GUEST_IDLE;
			mb->tsc_per_page = 0;
			mb->flags = 0;
		}
		at += pages[i];
	}
	if (source && g->fill == MIG_FILL_ALL) {
		if (g->text)
			mig_testvm_fill_text_range(tv, 0, (g->mib << 20) / PAGE, 16);
		else
			mig_testvm_fill(tv, 16);
	} else if (source) {
		/* what a guest with free memory holds: data where it worked, the rest never touched */
		fill = (g->fill << 20) / PAGE;
		if (fill > (g->mib << 20) / PAGE)
			fill = (g->mib << 20) / PAGE;
		if (g->text)
			mig_testvm_fill_text_range(tv, 0, at > fill ? at : fill, 0);
		else
			mig_testvm_fill_range(tv, 0, at > fill ? at : fill, 0);
	}
	*ret_tv = tv;
	return 0;
}

void mig_testvm_free(struct testvm *tv)
{
	uint64_t size;
	void *hva = data_mem(tv, &size);

	testvm_free(tv);
	testvm_unmap(hva, size);
}

void mig_testvm_fill_range(struct testvm *tv, uint64_t first, uint64_t count, uint64_t zero_every)
{
	uint64_t size, i, x = 0x9e3779b97f4a7c15ull ^ first;
	uint8_t *p = data_mem(tv, &size) + first * PAGE;

	for (i = first; i < first + count; i++, p += PAGE) {
		uint64_t *w = (uint64_t *)p, k;

		if (zero_every && i % zero_every == 0)
			continue;
		/* the first 16 bytes are the guest's tag: left to it */
		for (k = 2; k < PAGE / 8; k++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			w[k] = x;
		}
	}
}

static uint64_t xorshift(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

void mig_testvm_fill_text_range(struct testvm *tv, uint64_t first, uint64_t count, uint64_t zero_every)
{
	static const char *const syl[24] = { "ka", "ro", "mi", "te", "su", "na", "lo", "ve", "ri", "da", "po", "chi",
					     "en", "ar", "ul", "is", "or", "an", "th", "qu", "ex", "ob", "ly", "st" };
	char vocab[256][12];
	uint8_t vlen[256];
	uint64_t size, i, x = 0x9e3779b97f4a7c15ull;
	uint8_t *p = data_mem(tv, &size) + first * PAGE;
	unsigned int v, k;

	for (v = 0; v < 256; v++) {
		uint64_t y = xorshift(&x) >> 8;
		unsigned int n = 1 + (unsigned int)(x % 3), l = 0;

		for (k = 0; k < n; k++, y /= 24) {
			memcpy(vocab[v] + l, syl[y % 24], strlen(syl[y % 24]));
			l += (unsigned int)strlen(syl[y % 24]);
		}
		vlen[v] = (uint8_t)l;
	}
	x ^= first * 0x2545f4914f6cdd1dull;
	if (!x)
		x = 1;
	for (i = first; i < first + count; i++, p += PAGE) {
		size_t o = 16;

		if (zero_every && i % zero_every == 0)
			continue;
		while (o < PAGE) {
			uint64_t r = xorshift(&x);
			unsigned int w = (unsigned int)(((r & 0xffff) * ((r >> 16) & 0xffff) * 256) >> 32);
			size_t l = vlen[w] < PAGE - o ? vlen[w] : PAGE - o;

			memcpy(p + o, vocab[w], l);
			o += l;
			if (o < PAGE)
				p[o++] = (r >> 40) % 13 ? ' ' : '\n';
		}
	}
}

void mig_testvm_fill(struct testvm *tv, uint64_t zero_every)
{
	uint64_t size;

	data_mem(tv, &size);
	mig_testvm_fill_range(tv, 0, size / PAGE, zero_every);
}

uint64_t mig_testvm_progress(struct testvm *tv, unsigned int i)
{
	return testvm_mailbox(tv, i)->writes;
}

void mig_testvm_pause(void *tv)
{
	testvm_pause_all(tv);
}

void mig_testvm_resume(void *tv)
{
	testvm_resume_all(tv);
}

uint64_t mig_testvm_progress_of(void *tv, unsigned int i)
{
	return mig_testvm_progress(tv, i);
}

int mig_testvm_run_share(void *tv, unsigned int i, unsigned int permille)
{
	return testvm_set_run_share(tv, i, permille);
}

uint64_t mig_testvm_kept_out_ns(void *tv, unsigned int i)
{
	return testvm_out_ns(tv, i);
}

static const struct kvmdirty_mig_ops tg_ops = {
	.pause = mig_testvm_pause,
	.resume = mig_testvm_resume,
	.progress = mig_testvm_progress_of,
	.set_run_share = mig_testvm_run_share,
	.kept_out_ns = mig_testvm_kept_out_ns,
};

void mig_testvm_kick_signal(struct testvm *tv)
{
	/* testvm_spawn() installs SIGUSR1's handler: the library's kicks share it */
	if (tv->tracker && kvmdirty_tracker_mode(tv->tracker) == KVMDIRTY_MODE_DIRTY_RING && tv->nr_threads)
		kvmdirty_vm_set_kick_signal(tv->vm, SIGUSR1);
}

int mig_testvm_api(struct testvm *tv, bool source, struct kvmdirty_mig_guest **ret_g, char *err, size_t len)
{
	int ret;

	mig_testvm_kick_signal(tv);
	/* a destination's or a restore's memory is fresh: pages no stream writes are left alone */
	ret = kvmdirty_mig_guest_new(tv->vm, source ? tv->tracker : NULL, tv->vcpu, tv->nr_vcpus,
				     source ? 0 : KVMDIRTY_MIG_FRESH, &tg_ops, tv, ret_g);
	if (ret < 0)
		return say(err, len, ret, "the guest's regions: %s", strerror(-ret));
	return 0;
}

/* Page writes vCPU i's pacing allows in ms (UINT64_MAX: not paced, or nothing to write). */
static uint64_t expected_writes(struct testvm *tv, unsigned int i, uint64_t ms)
{
	const struct guest_vcpu *mb = testvm_mailbox(tv, i);

	if (!mb->pages || !mb->tsc_per_page)
		return UINT64_MAX;
	return ms * tv->tsc_khz / mb->tsc_per_page;
}

/* CPU time a vCPU thread used so far; UINT64_MAX if it has ended (it stopped by itself). */
static uint64_t thread_cpu_ms(pthread_t t)
{
	struct timespec ts;
	clockid_t cid;

	if (pthread_getcpuclockid(t, &cid) || clock_gettime(cid, &ts))
		return UINT64_MAX;
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int mig_testvm_check_running(struct testvm *tv, uint64_t run_ms, char *err, size_t len)
{
	struct timespec ts = { (time_t)(run_ms / 1000), (long)(run_ms % 1000) * 1000000 };
	uint64_t pass[GUEST_MAX_VCPUS], writes[GUEST_MAX_VCPUS], cpu_ms[GUEST_MAX_VCPUS];
	struct testvm_exit ex;
	unsigned int bad = 0, i;
	int ret;

	for (i = 0; i < tv->nr_vcpus; i++) {
		pass[i] = testvm_mailbox(tv, i)->pass;
		writes[i] = testvm_mailbox(tv, i)->writes;
	}
	/* the threads' CPU time so far: judged on what they get from here on */
	for (i = 0; i < tv->nr_vcpus; i++)
		cpu_ms[i] = thread_cpu_ms(tv->threads[i]);
	nanosleep(&ts, NULL);
	/* what each vCPU thread got of the CPU: one that hardly ran is not judged on progress */
	for (i = 0; i < tv->nr_vcpus; i++) {
		uint64_t now = thread_cpu_ms(tv->threads[i]);

		cpu_ms[i] = now == UINT64_MAX || cpu_ms[i] == UINT64_MAX ? UINT64_MAX : now - cpu_ms[i];
	}
	/* out of KVM_RUN by signal: a guest that never looks at its stop flag cannot hold us */
	testvm_halt_all(tv);
	ret = testvm_join(tv, &bad, &ex);
	if (ret < 0)
		return say(err, len, ret, "vCPU %u: %s (page 0x%" PRIx64 ")", bad,
				ret == -EIO ? testvm_event_name(ex.event) : strerror(-ret), testvm_mailbox(tv, bad)->err_gpa);
	for (i = 0; i < tv->nr_vcpus; i++) {
		const struct guest_vcpu *mb = testvm_mailbox(tv, i);
		uint64_t ran = cpu_ms[i] == UINT64_MAX ? run_ms : cpu_ms[i];

		if (ran >= MIN_CPU_MS && expected_writes(tv, i, ran) >= MIN_EXPECTED_WRITES &&
		    mb->pass == pass[i] && mb->writes == writes[i])
			return say(err, len, -EIO, "vCPU %u made no progress in %" PRIu64 " ms (pass %"
					PRIu64 ", %" PRIu64 " pages written)", i, run_ms, pass[i], writes[i]);
	}
	return say(err, len, 0, "vCPU 0: pass %" PRIu64 " -> %" PRIu64 ", %" PRIu64 " pages written", pass[0],
			testvm_mailbox(tv, 0)->pass, testvm_mailbox(tv, 0)->writes - writes[0]);
}

int mig_testvm_resume_check(struct testvm *tv, uint64_t run_ms, char *err, size_t len)
{
	int ret = testvm_spawn(tv);

	if (ret < 0)
		return say(err, len, ret, "starting vCPUs: %s", strerror(-ret));
	return mig_testvm_check_running(tv, run_ms, err, len);
}
