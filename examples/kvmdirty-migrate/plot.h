/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_PLOT_H
#define KVMDIRTY_MIGRATE_PLOT_H

/*
 * A picture of a migration from its --stats file (doc/migrate-stats.md,
 * format version 1): mig_plot_read() takes the lines into series,
 * mig_plot_svg() draws them as one self-contained SVG (no script, font
 * or link outside it) on a shared time axis.  No file I/O besides the
 * FILE * it writes to; the stats are input nobody vouches for.
 *
 * A file of another version, a line that is not a stats line, or a line
 * before the last that does not parse is refused, naming the line.  A
 * last line cut short (the input ends inside it: a source killed while
 * writing) is dropped, and a file without its end line, or with its last
 * line dropped, is read as incomplete: the picture says so.
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define MIG_PLOT_VERSION 1
#define MIG_PLOT_MAX_VCPUS 1024		/* vCPU ids from 0 to this - 1 */
#define MIG_PLOT_MAX_LINE (1u << 20)	/* bytes in a line */
#define MIG_PLOT_MAX_FILE (256u << 20)	/* bytes in a file */

/* What a line says of a vCPU; has says which. */
enum {
	MIG_PLOT_DIRTY = 1 << 0,  /* dirty_per_s */
	MIG_PLOT_LIMIT = 1 << 1,  /* dirty_limit (ring), pages/s, 0: none */
	MIG_PLOT_SHARE = 1 << 2,  /* run_share (bitmap), permille, 1000: runs freely */
	MIG_PLOT_HELD = 1 << 3,	  /* held_ms, since the vCPU was made */
	MIG_PLOT_PROGRESS = 1 << 4, /* progress, the guest's own count of its work */
};

struct mig_plot_vcpu {
	unsigned int id, has;
	double dirty_per_s, limit, share, held_ms, progress;
};

/* A sample or a pass line. */
struct mig_plot_point {
	unsigned int line; /* in the file, from 1 */
	bool pass_end;	   /* a pass line: the pass ends here */
	unsigned int pass; /* 0: stop-and-copy */
	double t_ms;	   /* since the start line */
	double bytes_sent, dirty_bytes;
	/* each < 0 where the line lacks it */
	double link, dirty_rate, redirty_rate; /* bytes/s, pages/s, pages/s */
	double est_downtime_ms;		       /* pass lines */
	bool throttled;
	struct mig_plot_vcpu *vcpu; /* nv entries, in the line's order */
	unsigned int nv;
};

struct mig_plot {
	unsigned int lines; /* lines read (the dropped one not counted) */
	/* start */
	char mode[16];
	double guest_pages, page_size, downtime_limit_ms, max_passes, timeout_ms; /* < 0: not given */
	unsigned int vcpus;							  /* 0: not given */
	/* vcpus entries each, < 0 where not given; NULL without vcpus */
	double *before_per_s, *progress0;
	struct mig_plot_point *pt;
	size_t n;
	/* verify */
	bool verified_line;
	double verify_t_ms, lost_pages;
	/* end */
	bool has_end, ok, converged, throttle_known, throttle, throttled;
	char reason[32];
	char *detail, *error; /* NULL when not given */
	double end_t_ms, total_ms, downtime_ms, passes, bytes_sent;
	/* cut short: the line dropped (0: none) */
	unsigned int cut_line;
	bool incomplete; /* cut short or no end line */
};

/*
 * Read a stats file held in buf[0..len).  0 and *ret (free with
 * mig_plot_free()), or -EINVAL with a one-line reason naming the line in
 * err, or -ENOMEM.
 */
int mig_plot_read(const char *buf, size_t len, struct mig_plot **ret, char *err, size_t errlen);
void mig_plot_free(struct mig_plot *p);

/*
 * The picture, as SVG, to out; title names the file it came from (any
 * bytes: escaped).  0, or -EIO when out failed.
 */
int mig_plot_svg(const struct mig_plot *p, const char *title, FILE *out);

#endif
