/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_KEYFILE_H
#define KVMDIRTY_MIGRATE_KEYFILE_H

/*
 * Pre-shared keys (--psk FILE): made by kvmdirty-migrate genkey, loaded
 * strictly, kept out of core dumps.
 *
 * A key is 32 bytes from getrandom(2), so that no one can guess it and
 * no recording of a handshake can be tested against guesses of it.  Its
 * file holds exactly its 64 hex digits (either case) and at most one
 * newline ("\n" or "\r\n"), nothing else: not a passphrase, not base64.
 * The file must be a regular file (opened without following a symbolic
 * link in its last component, and without blocking: a FIFO is refused at
 * once), owned by the user the daemon runs as (root's own when it runs as
 * root), with no permission for group or others (mode 0600 or 0400), of
 * at most MIG_PSK_FILE_MAX bytes (a larger one is refused, never cut) and
 * exactly as long as its size says (a file of /proc or /sys, whose size is
 * 0 or a page whatever it holds, is refused).  A refusal is one line
 * naming the file and what it must be, never a byte of what it holds.
 */
#include <stddef.h>
#include <stdint.h>

#define MIG_PSK_LEN 32		/* bytes of a key: the one length a key has */
#define MIG_PSK_HEX (2 * MIG_PSK_LEN) /* its hex digits in its file */
#define MIG_PSK_FILE_MAX 4096	/* bytes of a key file: a larger one is refused */

/* A pre-shared key, as read from its file. */
struct mig_psk {
	uint8_t key[MIG_PSK_LEN];
	size_t len; /* MIG_PSK_LEN once loaded */
};

/*
 * Read the key file at path, as above, into ret_psk.  0, or -errno with a
 * one-line reason naming the file (never its content) in err: -ENOENT and
 * the like from open(2), -ELOOP for a symbolic link, -EPERM for a file of
 * another user or one group or others may use, -EINVAL for anything else
 * (not a regular file, its size, its content).  Whatever the outcome, no
 * copy of the file's bytes is left but the key in ret_psk.
 */
int mig_psk_load(const char *path, struct mig_psk *ret_psk, char *err, size_t len);
/* Wipe it. */
void mig_psk_clear(struct mig_psk *psk);

/*
 * kvmdirty-migrate genkey: a new key file at path, a key of 32 bytes from
 * getrandom(2) as 64 lowercase hex digits and a newline.  The file is
 * created (O_CREAT | O_EXCL | O_NOFOLLOW: nothing that exists is
 * overwritten or followed, a symbolic link included), mode 0600 whatever
 * the umask, fsync'd, and its directory fsync'd where it can be opened.
 * 0, or -errno with one line naming the file in err (-EEXIST: something
 * is there); a file this call created and could not fill is removed.  The
 * key is wiped from memory before it returns.
 */
int mig_psk_generate(const char *path, char *err, size_t len);

/*
 * Keep this process's memory, the keys in it, from other eyes: not
 * dumpable (prctl(PR_SET_DUMPABLE, 0): no core dump, and no other process
 * of this user may ptrace it or read its /proc/PID/mem or environ), and a
 * core size limit of 0 (where fs.suid_dumpable 2 still dumps a process
 * that is not dumpable, to a root-owned file or a crash handler, the
 * limit stops a file, and a handler such as systemd-coredump honours it).
 * Call it before any key is read; it holds for this process and what it
 * forks, until an execve(2).  Once it is called, /proc/self's files
 * belong to root: one of mode 0400, such as /proc/self/pagemap, can then
 * be opened only by root (open it before: hostmem.h).  0, or -errno with
 * one line in err.
 */
int mig_psk_protect_process(char *err, size_t len);

#endif
