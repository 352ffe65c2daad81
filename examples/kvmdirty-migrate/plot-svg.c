// SPDX-License-Identifier: MIT
/*
 * The picture (plot.h): panels stacked on one time axis (seconds since
 * tracking started), each with its legend at the right; pass boundaries,
 * the stop-and-copy window and the end of an incomplete file drawn across
 * all of them; the outcome, and why pre-copy did not converge, on top.
 *
 * Every series is a <g class="series" data-series="NAME"> of polylines,
 * one vertex per line of the file that has the figure (a gap where a
 * line lacks it; past ALL_POINTS lines, four a pixel column), so that a
 * script can find each quantity and count its samples.  Text from the file is escaped and cleaned to what XML 1.0
 * allows; coordinates are clamped, so no input makes the SVG invalid.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plot.h"

#define W 1200		 /* the picture's width */
#define ML 96		 /* left of the plot area: the y labels */
#define PW 830		 /* plot area's width */
#define LX (ML + PW + 18) /* legends */
#define PH 150		 /* a panel's height */
#define PH_EMPTY 34	 /* a panel with nothing to draw: its title and a note */
#define PGAP 40		 /* between panels: the next one's title */
#define WRAP 150	 /* characters of the outcome's detail on a line */
#define LEGEND_MAX 10	 /* legend entries in a panel; then "and N more" */
#define ALL_POINTS (4 * PW) /* beyond this many points, a series keeps 4 a pixel column */
/*
 * A vCPU's share of time held and its speed are differences of counters
 * over at least this long: a pass line comes a moment after a sample.
 */
#define WINDOW_MS 50.0
#define WINDOW_LINES 32 /* lines looked back for it */
/* data clamped to this, so that differences stay finite */
#define HUGE_DATA 1e30

static const char *const units[] = { "B", "KiB", "MiB", "GiB", "TiB", "PiB" };
static const char *const palette[] = { "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
				       "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf" };

enum unit { UNIT_BYTES, UNIT_RATE, UNIT_PERCENT };

enum quantity {
	Q_SENT,
	Q_DIRTY,
	Q_FITS,
	Q_LINK,
	Q_DIRTY_RATE,
	Q_REDIRTY,
	Q_VCPU_DIRTY,
	Q_VCPU_LIMIT,
	Q_VCPU_HELD,
	Q_VCPU_SHARE,
	Q_VCPU_SPEED,
};

struct series {
	char name[32], label[64];
	const char *color;
	const char *dash; /* stroke-dasharray, or NULL */
	enum quantity q;
	unsigned int id; /* the vCPU's */
};

struct panel {
	char title[160];
	const char *note; /* drawn when no series has a point */
	enum unit unit;
	bool log, shade_throttle;
	struct series *s;
	unsigned int ns;
	/* laid out */
	double top, h, lo, hi, step, scale;
	char uname[8];
	bool empty;
};

struct svg {
	const struct mig_plot *p;
	FILE *f;
	double x0, x1; /* ms */
	double down_t0, down_t1; /* the stop-and-copy window, ms; down_t1 < 0: none */
	bool down_failed;	 /* stop-and-copy began and the migration failed */
	bool throttled;		 /* some line says the throttle was engaged */
	unsigned int clip;
};

/* ---- text ---- */

/* The length of the valid UTF-8 character XML 1.0 allows at s, or 0. */
static size_t xml_char(const unsigned char *s, size_t n)
{
	unsigned int u, len, i;

	if (s[0] < 0x80)
		return s[0] >= 0x20 || s[0] == '\t' || s[0] == '\n' || s[0] == '\r';
	if (s[0] >= 0xc2 && s[0] <= 0xdf)
		len = 2, u = s[0] & 0x1f;
	else if (s[0] >= 0xe0 && s[0] <= 0xef)
		len = 3, u = s[0] & 0x0f;
	else if (s[0] >= 0xf0 && s[0] <= 0xf4)
		len = 4, u = s[0] & 0x07;
	else
		return 0;
	if (n < len)
		return 0;
	for (i = 1; i < len; i++) {
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		u = u << 6 | (s[i] & 0x3f);
	}
	if ((len == 3 && u < 0x800) || (len == 4 && (u < 0x10000 || u > 0x10ffff)) || (u >= 0xd800 && u <= 0xdfff) ||
	    u == 0xfffe || u == 0xffff)
		return 0;
	return len;
}

/* s[0..n) as XML character data or an attribute value: escaped; what XML cannot hold becomes '?'. */
static void xml_text(FILE *f, const char *s, size_t n)
{
	const unsigned char *u = (const unsigned char *)s;
	size_t i = 0, k;

	while (i < n) {
		k = xml_char(u + i, n - i);
		if (!k) {
			fputc('?', f);
			i++;
		} else if (u[i] == '&') {
			fputs("&amp;", f), i++;
		} else if (u[i] == '<') {
			fputs("&lt;", f), i++;
		} else if (u[i] == '>') {
			fputs("&gt;", f), i++;
		} else if (u[i] == '"') {
			fputs("&quot;", f), i++;
		} else if (u[i] == '\n' || u[i] == '\r' || u[i] == '\t') {
			fputc(' ', f), i++;
		} else {
			fwrite(u + i, 1, k, f);
			i += k;
		}
	}
}

/* A line of text; nothing when only laying out (no file). */
static void text(struct svg *g, double x, double y, const char *cls, const char *anchor, const char *s)
{
	if (!g->f)
		return;
	fprintf(g->f, "<text x=\"%.1f\" y=\"%.1f\" class=\"%s\"%s%s%s>", x, y, cls, anchor ? " text-anchor=\"" : "",
		anchor ? anchor : "", anchor ? "\"" : "");
	xml_text(g->f, s, strlen(s));
	fputs("</text>\n", g->f);
}

/* 1.5 GiB, 512 MiB, 4 KiB, 100 B */
static void fmt_bytes(char *buf, size_t len, double v)
{
	unsigned int u = 0;

	while (fabs(v) >= 1024 && u < 5)
		v /= 1024, u++;
	snprintf(buf, len, "%.*f %s", fabs(v) >= 100 || u == 0 ? 0 : 1, v, units[u]);
}

/* ---- scales ---- */

static double clampd(double v, double lo, double hi)
{
	return v < lo ? lo : v > hi ? hi : v;
}

static double px_x(const struct svg *g, double t_ms)
{
	return clampd(ML + (t_ms - g->x0) / (g->x1 - g->x0) * PW, -1e5, 1e5);
}

static double px_y(const struct panel *pn, double v)
{
	double f;

	if (pn->log)
		f = (v > 0 ? clampd(log2(v), pn->lo, pn->hi) - pn->lo : 0) / (pn->hi - pn->lo);
	else
		f = (clampd(v, -HUGE_DATA, HUGE_DATA) - pn->lo) / (pn->hi - pn->lo);
	return clampd(pn->top + pn->h - f * pn->h, -1e5, 1e5);
}

static double nice_step(double span, double ticks)
{
	double raw = span / ticks, mag = pow(10, floor(log10(raw))), r = raw / mag;

	return (r <= 1 ? 1 : r <= 2 ? 2 : r <= 5 ? 5 : 10) * mag;
}

static double figure(const struct mig_plot *p, size_t i, enum quantity q, unsigned int id);

static double value(const struct mig_plot *p, const struct series *s, size_t i)
{
	return figure(p, i, s->q, s->id);
}

/* The panel's range from its series: linear from 0 (or below, for negative data), log in powers of 2. */
static void fit(struct panel *pn, const struct mig_plot *p)
{
	double lo = 0, hi = 0, minpos = INFINITY;
	unsigned int i, u = 0;
	size_t k;

	pn->empty = true;
	for (i = 0; i < pn->ns; i++) {
		for (k = 0; k < p->n; k++) {
			double v = value(p, &pn->s[i], k);

			if (isnan(v))
				continue;
			v = clampd(v, -HUGE_DATA, HUGE_DATA);
			lo = v < lo ? v : lo;
			hi = v > hi ? v : hi;
			minpos = v > 0 && v < minpos ? v : minpos;
			pn->empty = false;
		}
	}
	if (pn->log) {
		pn->hi = hi > 0 ? ceil(log2(hi)) : 10;
		pn->lo = minpos < INFINITY ? floor(log2(minpos)) : pn->hi - 10;
		pn->lo = pn->lo < pn->hi - 30 ? pn->hi - 30 : pn->lo;
		if (pn->hi - pn->lo < 2)
			pn->lo = pn->hi - 2;
		pn->step = ceil((pn->hi - pn->lo) / 6);
		return;
	}
	if (pn->unit == UNIT_PERCENT) {
		hi = hi > 100 ? hi : 100;
		pn->scale = 1;
		snprintf(pn->uname, sizeof(pn->uname), "%%");
	} else {
		for (pn->scale = 1; (hi > -lo ? hi : -lo) >= 1024 * pn->scale && u < 5; u++)
			pn->scale *= 1024;
		snprintf(pn->uname, sizeof(pn->uname), "%s%s", units[u], pn->unit == UNIT_RATE ? "/s" : "");
	}
	if (hi - lo < (fabs(hi) + fabs(lo)) * 1e-9 + 1e-9 * pn->scale)
		hi = lo + (fabs(lo) * 1e-3 + 1) * pn->scale;
	pn->step = nice_step((hi - lo) / pn->scale, 4) * pn->scale;
	pn->lo = floor(lo / pn->step) * pn->step;
	pn->hi = ceil(hi / pn->step) * pn->step;
	if (!(pn->hi > pn->lo))
		pn->hi = pn->lo + pn->step;
}

/* ---- the series ---- */

static const struct mig_plot_vcpu *vcpu_at(const struct mig_plot_point *pt, unsigned int id)
{
	unsigned int i;

	if (id < pt->nv && pt->vcpu[id].id == id)
		return &pt->vcpu[id];
	for (i = 0; i < pt->nv; i++)
		if (pt->vcpu[i].id == id)
			return &pt->vcpu[i];
	return NULL;
}

/*
 * The growth per ms of a counter of vCPU id (has: which) up to point i:
 * from the latest point at least WINDOW_MS before it; failing that, from
 * the start line's value at 0 (start >= 0) when every point before is
 * nearer, or from the earliest point looked at.  NAN without two values.
 */
static double growth(const struct mig_plot *p, size_t i, unsigned int id, unsigned int has, double start)
{
	const struct mig_plot_vcpu *v = vcpu_at(&p->pt[i], id), *w;
	double from = NAN, t_from = 0, t = p->pt[i].t_ms;
	size_t j = i, k;

	if (!v || !(v->has & has))
		return NAN;
	for (k = 0; j > 0 && k < WINDOW_LINES; k++) {
		w = vcpu_at(&p->pt[--j], id);
		if (!w || !(w->has & has))
			continue;
		from = has == MIG_PLOT_HELD ? w->held_ms : w->progress;
		t_from = p->pt[j].t_ms;
		if (t - t_from >= WINDOW_MS)
			break;
	}
	if (j == 0 && start >= 0 && (isnan(from) || !(t - t_from >= WINDOW_MS))) {
		from = start;
		t_from = 0;
	}
	if (isnan(from) || !(t - t_from > 0))
		return NAN;
	return ((has == MIG_PLOT_HELD ? v->held_ms : v->progress) - from) / (t - t_from);
}

/* Point i's figure for a quantity (of vCPU id), NAN where the line has none. */
static double figure(const struct mig_plot *p, size_t i, enum quantity q, unsigned int id)
{
	const struct mig_plot_point *pt = &p->pt[i];
	const struct mig_plot_vcpu *v = q >= Q_VCPU_DIRTY ? vcpu_at(pt, id) : NULL;
	bool known = id < p->vcpus;
	double d;

	switch (q) {
	case Q_SENT:
		return pt->bytes_sent;
	case Q_DIRTY:
		return pt->dirty_bytes;
	case Q_FITS:
		return pt->link >= 0 && p->downtime_limit_ms >= 0 ? pt->link * p->downtime_limit_ms / 1e3 : NAN;
	case Q_LINK:
		return pt->link >= 0 ? pt->link : NAN;
	case Q_DIRTY_RATE:
		return pt->dirty_rate >= 0 ? pt->dirty_rate * p->page_size : NAN;
	case Q_REDIRTY:
		return pt->redirty_rate >= 0 ? pt->redirty_rate * p->page_size : NAN;
	case Q_VCPU_DIRTY:
		return v && v->has & MIG_PLOT_DIRTY ? v->dirty_per_s * p->page_size : NAN;
	case Q_VCPU_LIMIT:
		return v && v->has & MIG_PLOT_LIMIT && v->limit > 0 ? v->limit * p->page_size : NAN;
	case Q_VCPU_SHARE:
		return v && v->has & MIG_PLOT_SHARE ? v->share / 10 : NAN;
	case Q_VCPU_SPEED:
		/* progress per second against the speed before tracking */
		return known && p->before_per_s[id] > 0
			       ? growth(p, i, id, MIG_PLOT_PROGRESS, p->progress0[id]) * 1e3 / p->before_per_s[id] * 100
			       : NAN;
	case Q_VCPU_HELD:
		/*
		 * held_ms counts up, by a whole hold when it ends: one that
		 * began before the window can charge it with more than its
		 * length.  At most all of it, then.
		 */
		d = growth(p, i, id, MIG_PLOT_HELD, -1) * 100;
		return d > 100 ? 100 : d;
	}
	return NAN;
}

/*
 * A series of the panel.  A vCPU's is left out where no line has its
 * figure (a vCPU the lines never name, or a figure its mode lacks).
 */
static void add(struct panel *pn, const struct mig_plot *p, enum quantity q, unsigned int id, const char *name,
		const char *label, const char *color, const char *dash)
{
	struct series *s = &pn->s[pn->ns];
	size_t i;

	*s = (struct series){ .color = color, .dash = dash, .q = q, .id = id };
	for (i = 0; q >= Q_VCPU_DIRTY && i < p->n && isnan(value(p, s, i)); i++)
		;
	if (q >= Q_VCPU_DIRTY && i == p->n)
		return;
	snprintf(s->name, sizeof(s->name), "%s", name);
	snprintf(s->label, sizeof(s->label), "%s", label);
	pn->ns++;
}

static void free_panels(struct panel *pn, unsigned int n)
{
	unsigned int i;

	for (i = 0; i < n; i++)
		free(pn[i].s);
}

/* ---- drawing ---- */

/* A vertex; opens a polyline where none is. */
static void vertex(struct svg *g, const struct panel *pn, size_t i, double v, bool *open)
{
	fprintf(g->f, "%s%.1f,%.1f", *open ? " " : "<polyline points=\"", px_x(g, g->p->pt[i].t_ms), px_y(pn, v));
	*open = true;
}

/* Points first..last (one pixel column, no gap): the first, the lowest, the highest and the last, in order. */
static void column(struct svg *g, const struct panel *pn, const struct series *s, size_t first, size_t last,
		   bool *open)
{
	size_t i, lo = first, hi = first, keep[4];
	unsigned int k, n = 0;

	for (i = first; i <= last; i++) {
		lo = value(g->p, s, i) < value(g->p, s, lo) ? i : lo;
		hi = value(g->p, s, i) > value(g->p, s, hi) ? i : hi;
	}
	keep[n++] = first;
	keep[n++] = lo < hi ? lo : hi;
	keep[n++] = lo < hi ? hi : lo;
	keep[n++] = last;
	for (k = 0; k < n; k++)
		if (!k || keep[k] != keep[k - 1])
			vertex(g, pn, keep[k], value(g->p, s, keep[k]), open);
}

/*
 * The series as polylines, split where a line lacks its figure: every
 * point, or past ALL_POINTS, four per pixel column, so that a long
 * migration's picture stays one a browser opens.
 */
static void polyline(struct svg *g, const struct panel *pn, const struct series *s)
{
	const struct mig_plot *p = g->p;
	bool open = false;
	size_t i, first = 0;
	long col = 0;

	fprintf(g->f, "<g class=\"series\" data-series=\"%s\" stroke=\"%s\"%s%s%s><title>", s->name, s->color,
		s->dash ? " stroke-dasharray=\"" : "", s->dash ? s->dash : "", s->dash ? "\"" : "");
	xml_text(g->f, s->label, strlen(s->label));
	fputs("</title>\n", g->f);
	for (i = 0; i <= p->n; i++) {
		bool gap = i == p->n || isnan(value(p, s, i));
		long c = gap ? 0 : (long)px_x(g, p->pt[i].t_ms);

		if (p->n > ALL_POINTS && i > first && (gap || c != col))
			column(g, pn, s, first, i - 1, &open);
		if (gap) {
			if (open)
				fputs("\"/>\n", g->f);
			open = false;
			first = i + 1;
			continue;
		}
		if (p->n <= ALL_POINTS)
			vertex(g, pn, i, value(p, s, i), &open);
		else if (i == first || c != col)
			first = i;
		col = c;
	}
	fputs("</g>\n", g->f);
}

static void band(struct svg *g, const struct panel *pn, double t0, double t1, const char *cls, double min_w)
{
	double a = px_x(g, t0), b = px_x(g, t1);

	if (b - a < min_w)
		b = a + min_w;
	fprintf(g->f, "<rect class=\"%s\" x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\"/>\n", cls, a, pn->top,
		b - a, pn->h);
}

static void vline(struct svg *g, const struct panel *pn, double t, const char *cls)
{
	double x = px_x(g, t);

	fprintf(g->f, "<line class=\"%s\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", cls, x, pn->top, x,
		pn->top + pn->h);
}

/* The y axis's grid lines (inside the panel's clip), or its labels (outside it). */
static void y_axis(struct svg *g, const struct panel *pn, bool labels)
{
	char buf[48];
	double v, y;
	int i;

	for (i = 0; i < 64; i++) {
		v = pn->lo + i * pn->step;
		if (v > pn->hi + pn->step * 1e-6)
			break;
		if (pn->log) {
			fmt_bytes(buf, sizeof(buf) - 2, exp2(v));
			if (pn->unit == UNIT_RATE)
				strcat(buf, "/s");
			y = px_y(pn, exp2(v));
		} else {
			snprintf(buf, sizeof(buf), "%g", v / pn->scale);
			y = px_y(pn, v);
		}
		if (labels)
			text(g, ML - 6, y + 4, "tick", "end", buf);
		else
			fprintf(g->f, "<line class=\"grid\" x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\"/>\n", ML, y,
				ML + PW, y);
	}
	if (labels && !pn->log)
		text(g, ML - 6, pn->top - 6, "unit", "end", pn->uname);
}

static void x_grid(struct svg *g, const struct panel *pn, bool labels)
{
	double step = nice_step((g->x1 - g->x0) / 1e3, 10) * 1e3, t;
	char buf[32];
	int i;

	for (i = 0; i < 200; i++) {
		t = ceil(g->x0 / step) * step + i * step;
		if (t > g->x1)
			break;
		fprintf(g->f, "<line class=\"grid\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/>\n", px_x(g, t),
			pn->top, px_x(g, t), pn->top + pn->h);
		if (labels) {
			snprintf(buf, sizeof(buf), "%g", fabs(t) < step * 1e-6 ? 0 : t / 1e3);
			text(g, px_x(g, t), pn->top + pn->h + 16, "tick", "middle", buf);
		}
	}
	if (labels)
		text(g, ML + PW / 2.0, pn->top + pn->h + 36, "axis", "middle", "seconds since tracking started");
}

static void legend(struct svg *g, const struct panel *pn)
{
	unsigned int i;
	double y = pn->top + 8;
	char buf[48];

	for (i = 0; i < pn->ns && i < LEGEND_MAX; i++, y += 15) {
		fprintf(g->f, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"2.5\"%s%s%s/>\n",
			LX, y - 4, LX + 22, y - 4, pn->s[i].color, pn->s[i].dash ? " stroke-dasharray=\"" : "",
			pn->s[i].dash ? pn->s[i].dash : "", pn->s[i].dash ? "\"" : "");
		text(g, LX + 28, y, "legend", NULL, pn->s[i].label);
	}
	if (pn->ns > LEGEND_MAX) {
		snprintf(buf, sizeof(buf), "and %u more", pn->ns - LEGEND_MAX);
		text(g, LX + 28, y, "legend", NULL, buf);
		y += 15;
	}
	if (pn->shade_throttle && g->throttled) {
		fprintf(g->f, "<rect class=\"throttled\" x=\"%d\" y=\"%.1f\" width=\"22\" height=\"10\"/>\n", LX, y - 9);
		text(g, LX + 28, y, "legend", NULL, "throttle engaged");
	}
}

static void draw_panel(struct svg *g, struct panel *pn, bool last)
{
	const struct mig_plot *p = g->p;
	size_t i;
	unsigned int k;

	text(g, ML, pn->top - 8, "ptitle", NULL, pn->title);
	if (pn->empty) {
		text(g, ML + 12, pn->top + 20, "note", NULL, pn->note);
		return;
	}
	fprintf(g->f, "<clipPath id=\"c%u\"><rect x=\"%d\" y=\"%.1f\" width=\"%d\" height=\"%.1f\"/></clipPath>\n",
		g->clip, ML, pn->top - 1, PW, pn->h + 2);
	fprintf(g->f, "<rect class=\"frame\" x=\"%d\" y=\"%.1f\" width=\"%d\" height=\"%.1f\"/>\n", ML, pn->top, PW,
		pn->h);
	fprintf(g->f, "<g clip-path=\"url(#c%u)\">\n", g->clip++);
	for (i = 1; pn->shade_throttle && i < p->n; i++)
		if (p->pt[i].throttled)
			band(g, pn, p->pt[i - 1].t_ms, p->pt[i].t_ms, "throttled", 0);
	if (g->down_t1 >= 0)
		band(g, pn, g->down_t0, g->down_t1, g->down_failed ? "failed" : "downtime", 3);
	x_grid(g, pn, false);
	y_axis(g, pn, false);
	for (i = 0; i < p->n; i++)
		if (p->pt[i].pass_end)
			vline(g, pn, p->pt[i].t_ms, "pass");
	if (p->incomplete && p->n)
		vline(g, pn, p->pt[p->n - 1].t_ms, "cut");
	for (k = 0; k < pn->ns; k++)
		polyline(g, pn, &pn->s[k]);
	fputs("</g>\n", g->f);
	y_axis(g, pn, true);
	if (last)
		x_grid(g, pn, true);
	legend(g, pn);
}

/* Pass numbers over the first panel, each between its boundaries where it fits; tooltips on each. */
static void pass_labels(struct svg *g, const struct panel *pn)
{
	const struct mig_plot *p = g->p;
	double from = g->x0, a, b;
	char buf[160], sent[32], left[32];
	size_t i;

	for (i = 0; i < p->n; i++) {
		const struct mig_plot_point *pt = &p->pt[i];

		if (!pt->pass_end)
			continue;
		a = px_x(g, from);
		b = px_x(g, pt->t_ms);
		fmt_bytes(sent, sizeof(sent), pt->bytes_sent);
		fmt_bytes(left, sizeof(left), pt->dirty_bytes);
		fprintf(g->f, "<g class=\"passmark\"><title>");
		snprintf(buf, sizeof(buf), "pass %u ended at %.3f s: %s sent, %s still dirty", pt->pass, pt->t_ms / 1e3,
			 sent, left);
		xml_text(g->f, buf, strlen(buf));
		if (pt->est_downtime_ms >= 0)
			fprintf(g->f, ", est. downtime %.1f ms", pt->est_downtime_ms);
		fputs("</title>\n", g->f);
		snprintf(buf, sizeof(buf), b - a >= 44 ? "pass %u" : "%u", pt->pass);
		if (b - a >= 14)
			text(g, (a + b) / 2, pn->top - 24, "pass", "middle", buf);
		fprintf(g->f, "<line class=\"pass\" x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\"/></g>\n", b,
			pn->top - 20, b, pn->top);
		from = pt->t_ms;
	}
	/* a file that stops within a pass: the pass under way */
	if (p->n && !p->pt[p->n - 1].pass_end && p->pt[p->n - 1].pass) {
		a = px_x(g, from);
		b = px_x(g, p->pt[p->n - 1].t_ms);
		snprintf(buf, sizeof(buf), "pass %u ...", p->pt[p->n - 1].pass);
		if (b - a >= 60)
			text(g, (a + b) / 2, pn->top - 24, "pass", "middle", buf);
	}
}

/* The stop-and-copy window: from the last pass line (the pause follows it) for downtime_ms. */
static void find_downtime(struct svg *g)
{
	const struct mig_plot *p = g->p;
	size_t i, last_pass = SIZE_MAX;

	g->down_t1 = -1;
	for (i = 0; i < p->n; i++)
		if (p->pt[i].pass_end)
			last_pass = i;
	if (last_pass == SIZE_MAX)
		return;
	g->down_t0 = p->pt[last_pass].t_ms;
	if (p->has_end && p->ok && p->downtime_ms > 0) {
		g->down_t1 = g->down_t0 + clampd(p->downtime_ms, 0, HUGE_DATA);
		return;
	}
	/* samples of stop-and-copy (pass 0) and no downtime: it began, and failed */
	for (i = last_pass + 1; i < p->n; i++)
		if (p->pt[i].pass == 0)
			g->down_t1 = p->pt[i].t_ms;
	g->down_failed = g->down_t1 >= 0;
}

/* ---- the outcome, on top ---- */

/* s wrapped at spaces into lines of at most WRAP bytes, at most max lines; the lines drawn. */
static unsigned int wrapped(struct svg *g, double y, const char *cls, const char *s, unsigned int max)
{
	size_t n = strlen(s), at = 0, cut;
	unsigned int lines = 0;
	char buf[WRAP + 8];

	while (at < n && lines < max) {
		cut = n - at;
		if (cut > WRAP) {
			for (cut = WRAP; cut > WRAP / 2 && s[at + cut] != ' '; cut--)
				;
			if (s[at + cut] != ' ')
				for (cut = WRAP; cut > 1 && ((unsigned char)s[at + cut] & 0xc0) == 0x80; cut--)
					;
		}
		snprintf(buf, sizeof(buf), "%.*s%s", (int)cut, s + at, lines + 1 == max && at + cut < n ? " ..." : "");
		text(g, 20, y + lines * 18, cls, NULL, buf);
		lines++;
		at += cut;
		while (at < n && s[at] == ' ')
			at++;
	}
	return lines;
}

static void headline(const struct mig_plot *p, char *buf, size_t len, const char **cls)
{
	size_t at = 0;

	if (p->has_end && p->lost_pages > 0)
		at = (size_t)snprintf(buf, len, "TRACKING LOST %.0f PAGES. ", p->lost_pages);
	if (!p->has_end) {
		*cls = "bad";
		snprintf(buf + at, len - at, "Incomplete: the stats stop before their end line%s",
			 p->cut_line ? " (the last one cut short): was the source stopped?" : ": was the source stopped?");
	} else if (p->ok && p->converged) {
		*cls = at ? "bad" : "good";
		snprintf(buf + at, len - at, "Converged after %.0f pass%s: %.2f s, downtime %.1f ms", p->passes,
			 p->passes == 1 ? "" : "es", p->total_ms / 1e3, p->downtime_ms);
	} else if (p->ok) {
		*cls = "warn";
		snprintf(buf + at, len - at, "Did not converge (%s): switched over anyway, downtime %.1f ms in %.2f s",
			 p->reason, p->downtime_ms, p->total_ms / 1e3);
	} else if (!strcmp(p->reason, "pass_limit") || !strcmp(p->reason, "time_limit")) {
		*cls = "bad";
		snprintf(buf + at, len - at, "Did not converge (%s): migration abandoned after %.0f passes, "
			 "the guest runs on at the source", p->reason, p->passes);
	} else {
		*cls = "bad";
		snprintf(buf + at, len - at, "Migration failed: the guest runs on at the source");
	}
}

/* What was run: the mode, the guest, the limits. */
static void subtitle(const struct mig_plot *p, const char *name, char *buf, size_t len)
{
	char sz[32], sent[32];
	size_t at;

	fmt_bytes(sz, sizeof(sz), p->guest_pages * p->page_size);
	at = (size_t)snprintf(buf, len, "%s mode", p->mode[0] ? p->mode : "unknown");
	if (p->guest_pages >= 0)
		at += (size_t)snprintf(buf + at, len - at, ", %s guest", sz);
	if (p->vcpus)
		at += (size_t)snprintf(buf + at, len - at, ", %u vCPU%s", p->vcpus, p->vcpus == 1 ? "" : "s");
	if (p->downtime_limit_ms >= 0 && at < len)
		at += (size_t)snprintf(buf + at, len - at, ", downtime limit %.0f ms", p->downtime_limit_ms);
	if (p->max_passes >= 0 && p->timeout_ms >= 0 && at < len)
		at += (size_t)snprintf(buf + at, len - at, ", at most %.0f passes or %.0f s", p->max_passes,
				       p->timeout_ms / 1e3);
	if (p->throttle_known && at < len)
		at += (size_t)snprintf(buf + at, len - at, ", throttle %s", !p->throttle ? "off"
						: p->throttled ? "on (engaged)" : "on (never engaged)");
	if (p->has_end && p->bytes_sent > 0 && at < len) {
		fmt_bytes(sent, sizeof(sent), p->bytes_sent);
		at += (size_t)snprintf(buf + at, len - at, ", %s sent", sent);
	}
	if (at < len)
		snprintf(buf + at, len - at, "; from %.80s%s", name, strlen(name) > 80 ? "..." : "");
}

/* ---- the panels ---- */

/* A series for each vCPU: vcpuI_NAME, labelled "vCPU I LABEL". */
static void vcpu_series(struct panel *pn, const struct mig_plot *p, unsigned int nid, enum quantity q,
			const char *name, const char *label, const char *dash)
{
	char n[32], l[64];
	unsigned int id;

	for (id = 0; id < nid; id++) {
		snprintf(n, sizeof(n), "vcpu%u_%s", id, name);
		snprintf(l, sizeof(l), "vCPU %u%s%s", id, label[0] ? " " : "", label);
		add(pn, p, q, id, n, l, palette[id % 10], dash);
	}
}

static int build(const struct mig_plot *p, struct panel *pn, unsigned int *ret_n)
{
	unsigned int nid = p->vcpus, i, k;
	bool ring = !strcmp(p->mode, "dirty-ring"), share = false;
	size_t j;

	/* without a count in the start line, the highest id the lines name */
	for (j = 0; !p->vcpus && j < p->n; j++)
		for (k = 0; k < p->pt[j].nv; k++)
			nid = p->pt[j].vcpu[k].id + 1 > nid ? p->pt[j].vcpu[k].id + 1 : nid;
	for (j = 0; j < p->n && !share; j++)
		for (k = 0; k < p->pt[j].nv; k++)
			share |= (p->pt[j].vcpu[k].has & MIG_PLOT_SHARE) != 0;
	for (i = 0; i < 6; i++) {
		pn[i].s = calloc(3 + 2 * (size_t)nid, sizeof(struct series));
		if (!pn[i].s) {
			*ret_n = i;
			return -ENOMEM;
		}
	}
	*ret_n = 6;
	snprintf(pn[0].title, sizeof(pn[0].title), "Sent: stream bytes, pass boundaries marked");
	pn[0].unit = UNIT_BYTES;
	snprintf(pn[1].title, sizeof(pn[1].title),
		 "Still dirty (log scale): pre-copy converges once it falls to what the downtime limit allows");
	pn[1].unit = UNIT_BYTES;
	pn[1].log = true;
	snprintf(pn[2].title, sizeof(pn[2].title), "The link against the guest's dirtying, per second");
	pn[2].unit = UNIT_RATE;
	snprintf(pn[3].title, sizeof(pn[3].title), "Dirtying per vCPU, per second (log scale)%s",
		 ring ? " (dashed: the dirty limit the throttle set)" : " (write faults KVM counted, times the page size)");
	pn[3].unit = UNIT_RATE;
	pn[3].log = true;
	pn[3].shade_throttle = true;
	pn[3].note = "no per-vCPU dirty rates in these stats";
	snprintf(pn[4].title, sizeof(pn[4].title), "Throttle per vCPU: %s%s",
		 share ? "time kept out of KVM_RUN (solid) and the run share allowed (dashed), %"
		       : "time held by its dirty limit, % of each interval",
		 p->throttle_known && !p->throttle ? "; throttle off (--no-throttle)"
		 : p->throttle_known && !p->throttled ? "; the throttle never engaged" : "");
	pn[4].unit = UNIT_PERCENT;
	pn[4].shade_throttle = true;
	pn[4].note = "no per-vCPU throttle figures in these stats";
	snprintf(pn[5].title, sizeof(pn[5].title), "vCPU speed during the migration, %% of its speed before tracking");
	pn[5].unit = UNIT_PERCENT;
	pn[5].note = "no speed before tracking in these stats (send --baseline MS measures it)";
	pn[0].note = pn[1].note = pn[2].note = "no samples in these stats";
	add(&pn[0], p, Q_SENT, 0, "bytes_sent", "bytes sent", "#1f77b4", NULL);
	add(&pn[1], p, Q_DIRTY, 0, "dirty_bytes", "still dirty", "#d62728", NULL);
	if (p->downtime_limit_ms >= 0)
		add(&pn[1], p, Q_FITS, 0, "downtime_fit", "fits the downtime limit at the link", "#2ca02c", "6 3");
	add(&pn[2], p, Q_LINK, 0, "link", "link throughput (source)", "#1f77b4", NULL);
	add(&pn[2], p, Q_DIRTY_RATE, 0, "dirty_rate", "guest dirty rate (tracker)", "#d62728", NULL);
	add(&pn[2], p, Q_REDIRTY, 0, "redirty_rate", "dirtied again after sent", "#9467bd", "6 3");
	vcpu_series(&pn[3], p, nid, Q_VCPU_DIRTY, "dirty", "", NULL);
	vcpu_series(&pn[3], p, nid, Q_VCPU_LIMIT, "limit", "limit", "6 3");
	vcpu_series(&pn[4], p, nid, Q_VCPU_HELD, "held", share ? "kept out" : "held", NULL);
	vcpu_series(&pn[4], p, nid, Q_VCPU_SHARE, "share", "share", "6 3");
	vcpu_series(&pn[5], p, nid, Q_VCPU_SPEED, "speed", "", NULL);
	return 0;
}

static const char style[] =
	"<style>\n"
	"text{font-family:sans-serif;fill:#222}\n"
	".h{font-size:19px;font-weight:bold}.good{fill:#1a7f37}.warn{fill:#9a5b00}.bad{fill:#b00020}\n"
	".detail{font-size:14px}.sub{font-size:12.5px;fill:#555}.ptitle{font-size:13px;font-weight:bold}\n"
	".tick{font-size:11px;fill:#555}.unit{font-size:11px;fill:#555;font-style:italic}.axis{font-size:12px}\n"
	".legend{font-size:12px}.note{font-size:12px;fill:#777;font-style:italic}.pass{font-size:11px;fill:#666}\n"
	".mark{font-size:12px;font-weight:bold}\n"
	".frame{fill:none;stroke:#999}.grid{stroke:#e6e6e6;stroke-width:1}\n"
	"line.pass{stroke:#888;stroke-dasharray:3 3}line.cut{stroke:#b00020;stroke-width:2;stroke-dasharray:8 4}\n"
	".downtime{fill:#4a6fa5;fill-opacity:0.35}.failed{fill:#b00020;fill-opacity:0.25}\n"
	".throttled{fill:#f2c744;fill-opacity:0.25}\n"
	".series{fill:none;stroke-width:1.8;stroke-linejoin:round}\n"
	"</style>\n";

/*
 * The outcome on top: headline, why, what was run; the baseline of the
 * last line.  With g->f NULL, only where it ends (the layout).
 */
static double outcome(struct svg *g, const char *head, const char *cls, const char *sub)
{
	const struct mig_plot *p = g->p;
	double y = 30;

	if (g->f) {
		fprintf(g->f, "<text x=\"20\" y=\"%.1f\" class=\"h %s\">", y, cls);
		xml_text(g->f, head, strlen(head));
		fputs("</text>\n", g->f);
	}
	y += 22;
	if (p->detail)
		y += 18.0 * wrapped(g, y, "detail", p->detail, 3);
	/* an abandoned migration's error repeats the detail */
	if (p->error && (!p->detail || !strstr(p->error, p->detail))) {
		size_t n = strlen(p->error) + 8;
		char *e = malloc(n);

		if (e) {
			snprintf(e, n, "error: %s", p->error);
			y += 18.0 * wrapped(g, y, "detail", e, 3);
			free(e);
		}
	}
	if (p->incomplete && p->n) {
		const struct mig_plot_point *pt = &p->pt[p->n - 1];
		char last[200], sent[32], left[32];

		fmt_bytes(sent, sizeof(sent), pt->bytes_sent);
		fmt_bytes(left, sizeof(left), pt->dirty_bytes);
		snprintf(last, sizeof(last), "The last figures (line %u, %.3f s, %s %u): %s sent, %s still dirty%s",
			 pt->line, pt->t_ms / 1e3, pt->pass ? "pass" : "stop-and-copy", pt->pass, sent, left,
			 p->cut_line ? "; the line after was cut short" : "");
		y += 18.0 * wrapped(g, y, "detail bad", last, 1);
	}
	text(g, 20, y + 2, "sub", NULL, sub);
	return y + 2;
}

/* Over the first panel: the stop-and-copy window's length, and where an incomplete file ends. */
static void marks(struct svg *g, const struct panel *pn)
{
	const struct mig_plot *p = g->p;
	char buf[64];

	if (g->down_t1 >= 0) {
		double x = px_x(g, g->down_t1) + 4;
		bool left = x > ML + PW - 150;

		if (g->down_failed)
			snprintf(buf, sizeof(buf), "stop-and-copy, failed");
		else
			snprintf(buf, sizeof(buf), "downtime %.1f ms", p->downtime_ms);
		text(g, left ? px_x(g, g->down_t0) - 4 : x, pn->top + 16, "mark", left ? "end" : NULL, buf);
	}
	if (p->incomplete && p->n)
		text(g, px_x(g, p->pt[p->n - 1].t_ms) - 4, pn->top + 34, "mark bad", "end", "stats end here");
}

/* The time axis: from tracking's start (or the earliest line) to the later of the last line and the answer. */
static void time_axis(struct svg *g)
{
	const struct mig_plot *p = g->p;
	size_t k;

	g->x0 = 0;
	g->x1 = g->down_t1 > 0 ? g->down_t1 : 0;
	for (k = 0; k < p->n; k++) {
		double t = clampd(p->pt[k].t_ms, -HUGE_DATA, HUGE_DATA);

		g->x0 = t < g->x0 ? t : g->x0;
		g->x1 = t > g->x1 ? t : g->x1;
	}
	if (g->x1 - g->x0 < (fabs(g->x0) + fabs(g->x1)) * 1e-9 + 1)
		g->x1 = g->x0 + fabs(g->x0) * 1e-3 + 1;
	g->x1 += (g->x1 - g->x0) * 0.02;
}

int mig_plot_svg(const struct mig_plot *p, const char *title, FILE *f)
{
	struct panel pn[6] = { 0 };
	struct svg g = { .p = p };
	char head[320], sub[400];
	const char *cls = "good";
	unsigned int npanels = 0, i;
	double y, h;
	int ret;

	ret = build(p, pn, &npanels);
	if (ret < 0) {
		free_panels(pn, npanels);
		return ret;
	}
	find_downtime(&g);
	time_axis(&g);
	for (i = 0; i < p->n; i++)
		g.throttled |= p->pt[i].throttled;
	headline(p, head, sizeof(head), &cls);
	subtitle(p, title, sub, sizeof(sub));
	/* the outcome, room for the pass numbers, the panels */
	y = outcome(&g, head, cls, sub) + 58;
	for (i = 0; i < npanels; i++) {
		fit(&pn[i], p);
		pn[i].top = y;
		pn[i].h = pn[i].empty ? PH_EMPTY : PH;
		y += pn[i].h + PGAP;
	}
	h = y + 20;

	g.f = f;
	fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
		   "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%.0f\" viewBox=\"0 0 %d %.0f\""
		   " data-points=\"%zu\" data-incomplete=\"%s\" data-converged=\"%s\">\n<title>",
		W, h, W, h, p->n, p->incomplete ? "true" : "false",
		!p->has_end ? "unknown" : p->converged ? "true" : "false");
	xml_text(f, head, strlen(head));
	fputs("</title>\n", f);
	fputs(style, f);
	fprintf(f, "<rect width=\"%d\" height=\"%.0f\" fill=\"#fff\"/>\n", W, h);
	outcome(&g, head, cls, sub);
	for (i = 0; i < npanels; i++)
		draw_panel(&g, &pn[i], i + 1 == npanels);
	if (!pn[0].empty) {
		pass_labels(&g, &pn[0]);
		marks(&g, &pn[0]);
	}
	fputs("</svg>\n", f);
	free_panels(pn, npanels);
	return ferror(f) ? -EIO : 0;
}
