// SPDX-License-Identifier: MIT
/*
 * The channel alone (channel.h), with no guest: what a migration's
 * connections cost beyond the socket, on any host.  A sender process
 * writes batches shaped as the source's (a record header, its pages'
 * hashes and 256 pages from a 1 GiB buffer of non-zero bytes) through
 * mig_chan_writev(); a receiver process reads them as the destination
 * does (the header, the hashes, then the pages 32 at a time, straight
 * into a 1 GiB buffer faulted in beforehand) through mig_chan_read().
 * Over TCP loopback with the engine's socket buffers, 1 or more
 * connections (a thread each at both ends), plain, sealed (MAC only) or
 * sealed and encrypted.  And the cipher alone on one thread of this CPU:
 * the physical limit a sealed channel's each end is measured against.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <openssl/evp.h>

#include "chan-bench.h"
#include "channel.h"
#include "stream.h"

#define BUF_BYTES  (UINT64_C(1) << 30)
#define RUN_PAGES  256u
#define READ_PAGES 32u
#define PAGE	   4096u
#define STAGE	   (READ_PAGES * PAGE) /* a staged end's buffer: 128 KiB */

static double mono_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double cpu_s(clockid_t id)
{
	struct timespec ts;

	clock_gettime(id, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

uint8_t *chanbench_faulted(uint64_t size, int byte)
{
	uint8_t *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	if (p == MAP_FAILED)
		return NULL;
	memset(p, byte, size);
	return p;
}

/* One record of the cipher: mode 0 seals (encrypts), 1 opens (decrypts, checks tag), 2 MACs only. */
static bool cipher_once(EVP_CIPHER_CTX *c, int mode, const uint8_t *iv, const uint8_t *in, uint8_t *out, size_t len,
			uint8_t tag[16])
{
	int n;

	if (mode == 1)
		return EVP_DecryptInit_ex(c, NULL, NULL, NULL, iv) == 1 &&
		       EVP_DecryptUpdate(c, out, &n, in, (int)len) == 1 &&
		       EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_SET_TAG, 16, tag) == 1 &&
		       EVP_DecryptFinal_ex(c, out + len, &n) == 1;
	return EVP_EncryptInit_ex(c, NULL, NULL, NULL, iv) == 1 &&
	       EVP_EncryptUpdate(c, mode ? NULL : out, &n, in, (int)len) == 1 &&
	       EVP_EncryptFinal_ex(c, out + len, &n) == 1 && EVP_CIPHER_CTX_ctrl(c, EVP_CTRL_GCM_GET_TAG, 16, tag) == 1;
}

/*
 * The cipher on this thread: AES-256-GCM over records of `record` bytes,
 * sealing (encrypting), opening (decrypting, the tag checked) and MAC
 * only (the record as associated data), each for about `secs` of this
 * thread's CPU time: MiB per CPU-second into out[0..3).
 */
int chanbench_cipher(size_t record, double secs, double out[3])
{
	EVP_CIPHER_CTX *e = EVP_CIPHER_CTX_new(), *d = EVP_CIPHER_CTX_new();
	uint8_t key[32] = { 1 }, iv[12] = { 0 }, tag[16];
	uint8_t *in = chanbench_faulted(record + 16, 0x5a), *ct = chanbench_faulted(record + 16, 0),
		*pt = chanbench_faulted(record + 16, 0);
	int mode;
	bool ok = e && d && in && ct && pt && EVP_EncryptInit_ex(e, EVP_aes_256_gcm(), NULL, key, NULL) == 1 &&
		  EVP_DecryptInit_ex(d, EVP_aes_256_gcm(), NULL, key, NULL) == 1;

	for (mode = 0; ok && mode < 3; mode++) {
		double t0 = cpu_s(CLOCK_THREAD_CPUTIME_ID), t;
		uint64_t bytes = 0, seq = 0;

		/* opening: the same sealed record again and again, so that its tag passes */
		if (mode == 1)
			ok = cipher_once(e, 0, iv, in, ct, record, tag);
		do {
			int i;

			for (i = 0; ok && i < 16; i++, seq++) {
				if (mode != 1)
					memcpy(iv + 4, &seq, 8);
				ok = cipher_once(mode == 1 ? d : e, mode, iv, mode == 1 ? ct : in, mode == 1 ? pt : ct,
						 record, tag);
				bytes += record;
			}
			t = cpu_s(CLOCK_THREAD_CPUTIME_ID) - t0;
		} while (ok && t < secs);
		out[mode] = bytes / 1048576.0 / t;
	}
	EVP_CIPHER_CTX_free(e);
	EVP_CIPHER_CTX_free(d);
	if (in)
		munmap(in, record + 16);
	if (ct)
		munmap(ct, record + 16);
	if (pt)
		munmap(pt, record + 16);
	return ok ? 0 : -EIO;
}

struct lane {
	int fd;
	unsigned int index;
	const struct chanbench_cfg *cfg;
	uint8_t *buf;	      /* this lane's part of the 1 GiB buffer */
	uint8_t stage[STAGE]; /* cfg->staged: the pages pass through here */
	uint64_t buf_bytes, bytes;
	int ret;
	pthread_t thread;
};

static struct mig_chan_keys lane_keys(const struct chanbench_cfg *cfg, unsigned int i, bool sender)
{
	struct mig_chan_keys k = { .conn = i, .encrypt = cfg->encrypt };

	memcpy(sender ? k.send : k.recv, cfg->key[0], 32);
	memcpy(sender ? k.recv : k.send, cfg->key[1], 32);
	k.send[0] ^= (uint8_t)i;
	k.recv[0] ^= (uint8_t)i;
	return k;
}

static int lane_open(struct lane *l, bool sender, struct mig_conn **c, struct mig_chan **ch)
{
	struct mig_chan_keys k = lane_keys(l->cfg, l->index, sender);
	int ret = mig_conn_new(l->fd, 60000, c);

	if (ret == 0)
		ret = mig_chan_new(*c, l->cfg->sealed ? &k : NULL, ch);
	return ret;
}

/* Batches as the source's: one record of RUN_PAGES pages with its hashes, each a writev. */
static void *send_lane(void *p)
{
	struct lane *l = p;
	uint64_t hashes[RUN_PAGES], off = 0, left = l->bytes;
	struct mig_record rec = { .kind = 1 };
	struct mig_conn *c = NULL;
	struct mig_chan *ch = NULL;
	char ack;

	memset(hashes, 0x33, sizeof(hashes));
	l->ret = lane_open(l, true, &c, &ch);
	while (l->ret == 0 && left) {
		uint64_t n = left < RUN_PAGES * PAGE ? left : RUN_PAGES * PAGE;
		struct iovec iov[3] = { { &rec, sizeof(rec) }, { hashes, n / PAGE * 8 }, { l->buf + off, n } };

		rec.first = off / PAGE;
		rec.count = n / PAGE;
		if (l->cfg->staged) {
			uint64_t k;

			l->ret = mig_chan_writev(ch, iov, 2);
			for (k = 0; l->ret == 0 && k < n; k += STAGE) {
				struct iovec one = { l->stage, n - k < STAGE ? n - k : STAGE };

				memcpy(l->stage, l->buf + off + k, one.iov_len);
				l->ret = mig_chan_writev(ch, &one, 1);
			}
		} else {
			l->ret = mig_chan_writev(ch, iov, 3);
		}
		left -= n;
		off = (off + n) % l->buf_bytes;
	}
	if (l->ret == 0)
		l->ret = mig_chan_close_write(ch);
	/* the receiver's answer: everything arrived */
	if (l->ret == 0 && read(l->fd, &ack, 1) != 1)
		l->ret = -EPIPE;
	mig_chan_free(ch);
	mig_conn_free(c);
	return NULL;
}

/* As the destination reads: the header, the hashes, the pages READ_PAGES at a time into place. */
static void *recv_lane(void *p)
{
	struct lane *l = p;
	uint64_t hashes[RUN_PAGES], got = 0;
	struct mig_conn *c = NULL;
	struct mig_chan *ch = NULL;
	struct mig_record rec;
	uint8_t end;

	l->ret = lane_open(l, false, &c, &ch);
	while (l->ret == 0 && got < l->bytes) {
		uint64_t done, n;

		if (mig_chan_read(ch, &rec, sizeof(rec)) != (int)sizeof(rec) || rec.count > RUN_PAGES ||
		    rec.first * PAGE + rec.count * PAGE > l->buf_bytes ||
		    mig_chan_read(ch, hashes, rec.count * 8) != (int)(rec.count * 8)) {
			l->ret = -EPROTO;
			break;
		}
		for (done = 0; done < rec.count && l->ret == 0; done += n) {
			uint8_t *to = l->buf + (rec.first + done) * PAGE;

			n = rec.count - done < READ_PAGES ? rec.count - done : READ_PAGES;
			if (mig_chan_read(ch, l->cfg->staged ? l->stage : to, n * PAGE) != (int)(n * PAGE))
				l->ret = -EPROTO;
			else if (l->cfg->staged)
				memcpy(to, l->stage, n * PAGE);
		}
		got += rec.count * PAGE;
	}
	/* the sender's last record, then the end of the connection */
	if (l->ret == 0 && mig_chan_read(ch, &end, 1) != 0)
		l->ret = -EPROTO;
	if (l->ret == 0 && write(l->fd, "k", 1) != 1)
		l->ret = -EPIPE;
	mig_chan_free(ch);
	mig_conn_free(c);
	return NULL;
}

/* Run fn on cfg->conns lanes over fds; 0 when every lane did its part. */
static int lanes_run(const struct chanbench_cfg *cfg, const int *fds, uint8_t *buf, bool sender)
{
	struct lane l[CHANBENCH_MAX_CONNS];
	unsigned int i;
	int ret = 0;

	for (i = 0; i < cfg->conns; i++) {
		l[i] = (struct lane){ .fd = fds[i],
				      .index = i,
				      .cfg = cfg,
				      .buf_bytes = BUF_BYTES / cfg->conns,
				      .bytes = cfg->bytes / cfg->conns };
		l[i].buf = buf + i * l[i].buf_bytes;
		if (pthread_create(&l[i].thread, NULL, sender ? send_lane : recv_lane, &l[i]))
			return -EAGAIN;
	}
	for (i = 0; i < cfg->conns; i++) {
		pthread_join(l[i].thread, NULL);
		if (l[i].ret < 0 && ret == 0)
			ret = l[i].ret;
	}
	return ret;
}

/* One end in a child: its figures (wall seconds, CPU seconds) written to out, or nothing on failure. */
static pid_t end_child(const struct chanbench_cfg *cfg, int lfd, int port, bool sender, int out)
{
	pid_t pid = fork();

	if (pid == 0) {
		uint8_t *buf = chanbench_faulted(BUF_BYTES, sender ? 0x5a : 0);
		int fds[CHANBENCH_MAX_CONNS], size = 4 << 20;
		double r[2], t0, c0;
		unsigned int i;

		if (!buf)
			_exit(1);
		c0 = cpu_s(CLOCK_PROCESS_CPUTIME_ID);
		for (i = 0; i < cfg->conns; i++) {
			struct sockaddr_in sin = { .sin_family = AF_INET,
						   .sin_port = htons((uint16_t)port),
						   .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };

			if (sender) {
				fds[i] = socket(AF_INET, SOCK_STREAM, 0);
				setsockopt(fds[i], SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof(size));
				if (fds[i] < 0 || connect(fds[i], (struct sockaddr *)&sin, sizeof(sin)))
					_exit(1);
			} else if ((fds[i] = accept(lfd, NULL, NULL)) < 0) {
				_exit(1);
			}
		}
		t0 = mono_s();
		if (lanes_run(cfg, fds, buf, sender) < 0)
			_exit(1);
		r[0] = mono_s() - t0;
		r[1] = cpu_s(CLOCK_PROCESS_CPUTIME_ID) - c0;
		_exit(write(out, r, sizeof(r)) != (ssize_t)sizeof(r));
	}
	return pid;
}

int chanbench_run(const struct chanbench_cfg *cfg, struct chanbench_result *res)
{
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t sl = sizeof(sin);
	int lfd = socket(AF_INET, SOCK_STREAM, 0), p[2][2] = { { -1, -1 }, { -1, -1 } }, st[2], i, ok = 1;
	double r[2][2];
	pid_t pid[2];

	if (cfg->conns < 1 || cfg->conns > CHANBENCH_MAX_CONNS)
		return -EINVAL;
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&sin, sizeof(sin)) || listen(lfd, 16) ||
	    getsockname(lfd, (struct sockaddr *)&sin, &sl) || pipe(p[0]) || pipe(p[1])) {
		if (lfd >= 0)
			close(lfd);
		return -errno;
	}
	/* the receiver first, then the sender; each measures its own */
	pid[0] = end_child(cfg, lfd, ntohs(sin.sin_port), false, p[0][1]);
	pid[1] = end_child(cfg, lfd, ntohs(sin.sin_port), true, p[1][1]);
	close(lfd);
	close(p[0][1]);
	close(p[1][1]);
	/* the sender first: a sender that failed leaves the receiver waiting for it */
	for (i = 1; i >= 0; i--) {
		ok &= read(p[i][0], r[i], sizeof(r[i])) == (ssize_t)sizeof(r[i]);
		close(p[i][0]);
		if (!ok && i == 1 && pid[0] > 0)
			kill(pid[0], SIGKILL);
	}
	for (i = 0; i < 2; i++)
		ok &= pid[i] > 0 && waitpid(pid[i], &st[i], 0) == pid[i] && WIFEXITED(st[i]) && !WEXITSTATUS(st[i]);
	if (!ok)
		return -EIO;
	/* from the sender's first byte to the receiver's answer */
	res->mibps = cfg->bytes / 1048576.0 / r[1][0];
	res->cpu_s_per_gib_src = r[1][1] / (cfg->bytes / 1073741824.0);
	res->cpu_s_per_gib_dst = r[0][1] / (cfg->bytes / 1073741824.0);
	return 0;
}
