// SPDX-License-Identifier: MIT
/*
 * The stats file into series (plot.h).  Lines are read as the source
 * writes them (source-stats.c: start, then samples and pass lines, then verify
 * and end); a field the plot does not use is ignored, and so is a line
 * type it does not know (the format only adds within a version), but a
 * field it uses must have its type.
 */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "json.h"
#include "plot.h"

struct reader {
	struct mig_plot *p;
	size_t cap; /* of p->pt */
	unsigned int line;
	bool started;
	double t0; /* the start line's t_ms */
	char *err;
	size_t errlen;
};

static int __attribute__((format(printf, 2, 3))) bad(struct reader *r, const char *fmt, ...)
{
	int at = snprintf(r->err, r->errlen, "line %u: ", r->line);
	va_list ap;

	if (at >= 0 && (size_t)at < r->errlen) {
		va_start(ap, fmt);
		vsnprintf(r->err + at, r->errlen - (size_t)at, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

/*
 * A number member: 1 and *ret when there, 0 when absent (refused if
 * need), -EINVAL when not a number.  where prefixes the name in a message.
 */
static int num(struct reader *r, const struct mig_json *o, const char *where, const char *key, bool need,
	       double *ret)
{
	const struct mig_json *v = mig_json_get(o, key);

	if (!v)
		return need ? bad(r, "no \"%s%s\"", where, key) : 0;
	if (v->type != MIG_JSON_NUMBER)
		return bad(r, "\"%s%s\": expected a number", where, key);
	*ret = v->num;
	return 1;
}

/* num() for what must be a whole number in [0, max]. */
static int whole(struct reader *r, const struct mig_json *o, const char *where, const char *key, bool need,
		 double max, double *ret)
{
	double d;
	int ret1 = num(r, o, where, key, need, &d);

	if (ret1 <= 0)
		return ret1;
	if (d < 0 || d > max || d != floor(d))
		return bad(r, "\"%s%s\": %g, expected a whole number from 0 to %.0f", where, key, d, max);
	*ret = d;
	return 1;
}

static int boolean(struct reader *r, const struct mig_json *o, const char *key, bool *ret)
{
	const struct mig_json *v = mig_json_get(o, key);

	if (!v)
		return 0;
	if (v->type != MIG_JSON_TRUE && v->type != MIG_JSON_FALSE)
		return bad(r, "\"%s\": expected true or false", key);
	*ret = v->type == MIG_JSON_TRUE;
	return 1;
}

/* A string member: 1 and *ret (the parser's, NUL-terminated) when there, 0 when absent. */
static int string(struct reader *r, const struct mig_json *o, const char *key, const struct mig_json **ret)
{
	const struct mig_json *v = mig_json_get(o, key);

	if (!v)
		return 0;
	if (v->type != MIG_JSON_STRING)
		return bad(r, "\"%s\": expected a string", key);
	*ret = v;
	return 1;
}

static int copy_string(struct reader *r, const struct mig_json *o, const char *key, char **ret)
{
	const struct mig_json *s = NULL;
	int ret1 = string(r, o, key, &s);

	if (ret1 <= 0)
		return ret1;
	free(*ret);
	*ret = malloc(s->str.len + 1);
	if (!*ret)
		return -ENOMEM;
	memcpy(*ret, s->str.s, s->str.len + 1);
	return 1;
}

/* A vCPU list's member i as an object with an id this file can have; the id. */
static int vcpu_entry(struct reader *r, const struct mig_json *list, size_t i, unsigned int *ret_id)
{
	const struct mig_json *e = &list->arr.v[i];
	unsigned int max = r->p->vcpus ? r->p->vcpus : MIG_PLOT_MAX_VCPUS;
	char where[40];
	double id;
	int ret;

	snprintf(where, sizeof(where), "vcpu[%zu].", i);
	if (e->type != MIG_JSON_OBJECT)
		return bad(r, "\"vcpu[%zu]\": expected an object", i);
	ret = whole(r, e, where, "id", true, max - 1, &id);
	if (ret < 0)
		return ret;
	*ret_id = (unsigned int)id;
	return 0;
}

static int vcpu_list(struct reader *r, const struct mig_json *o, const struct mig_json **ret)
{
	const struct mig_json *v = mig_json_get(o, "vcpu");

	*ret = NULL;
	if (!v)
		return 0;
	if (v->type != MIG_JSON_ARRAY)
		return bad(r, "\"vcpu\": expected a list");
	if (v->arr.n > MIG_PLOT_MAX_VCPUS)
		return bad(r, "\"vcpu\": %zu entries, more than %u", v->arr.n, MIG_PLOT_MAX_VCPUS);
	*ret = v;
	return 0;
}

static int start_line(struct reader *r, const struct mig_json *o, double t)
{
	struct mig_plot *p = r->p;
	const struct mig_json *list, *mode = NULL;
	double d = 0;
	size_t i;
	int ret;

	if (r->started)
		return bad(r, "a second start line: one migration to a file");
	r->started = true;
	r->t0 = t;
	if ((ret = string(r, o, "mode", &mode)) < 0)
		return ret;
	if (ret)
		snprintf(p->mode, sizeof(p->mode), "%s", mode->str.s);
	if ((ret = num(r, o, "", "guest_pages", false, &p->guest_pages)) < 0 ||
	    (ret = num(r, o, "", "downtime_limit_ms", false, &p->downtime_limit_ms)) < 0 ||
	    (ret = num(r, o, "", "max_passes", false, &p->max_passes)) < 0 ||
	    (ret = num(r, o, "", "timeout_ms", false, &p->timeout_ms)) < 0 ||
	    (ret = num(r, o, "", "page_size", false, &p->page_size)) < 0)
		return ret;
	if (ret && !(p->page_size > 0))
		return bad(r, "\"page_size\": %g, expected more than 0", p->page_size);
	if ((ret = whole(r, o, "", "vcpus", false, MIG_PLOT_MAX_VCPUS, &d)) < 0)
		return ret;
	p->vcpus = (unsigned int)d;
	if (p->vcpus) {
		p->before_per_s = malloc(p->vcpus * sizeof(double));
		p->progress0 = malloc(p->vcpus * sizeof(double));
		if (!p->before_per_s || !p->progress0)
			return -ENOMEM;
		for (i = 0; i < p->vcpus; i++)
			p->before_per_s[i] = p->progress0[i] = -1;
	}
	if ((ret = vcpu_list(r, o, &list)) < 0)
		return ret;
	for (i = 0; list && i < list->arr.n; i++) {
		char where[40];
		unsigned int id;

		snprintf(where, sizeof(where), "vcpu[%zu].", i);
		if ((ret = vcpu_entry(r, list, i, &id)) < 0 ||
		    (ret = num(r, &list->arr.v[i], where, "before_per_s", false, &d)) < 0)
			return ret;
		if (ret && p->before_per_s)
			p->before_per_s[id] = d;
		if ((ret = num(r, &list->arr.v[i], where, "progress", false, &d)) < 0)
			return ret;
		if (ret && p->progress0)
			p->progress0[id] = d;
	}
	return 0;
}

static int point_vcpus(struct reader *r, const struct mig_json *list, struct mig_plot_point *pt)
{
	static const struct {
		const char *key;
		unsigned int bit;
		size_t at;
	} fields[] = {
		{ "dirty_per_s", MIG_PLOT_DIRTY, offsetof(struct mig_plot_vcpu, dirty_per_s) },
		{ "dirty_limit", MIG_PLOT_LIMIT, offsetof(struct mig_plot_vcpu, limit) },
		{ "run_share", MIG_PLOT_SHARE, offsetof(struct mig_plot_vcpu, share) },
		{ "held_ms", MIG_PLOT_HELD, offsetof(struct mig_plot_vcpu, held_ms) },
		{ "progress", MIG_PLOT_PROGRESS, offsetof(struct mig_plot_vcpu, progress) },
	};
	size_t i, f;
	int ret;

	if (!list || !list->arr.n)
		return 0;
	pt->vcpu = calloc(list->arr.n, sizeof(*pt->vcpu));
	if (!pt->vcpu)
		return -ENOMEM;
	pt->nv = (unsigned int)list->arr.n;
	for (i = 0; i < list->arr.n; i++) {
		struct mig_plot_vcpu *v = &pt->vcpu[i];
		char where[40];

		if ((ret = vcpu_entry(r, list, i, &v->id)) < 0)
			return ret;
		snprintf(where, sizeof(where), "vcpu[%zu].", i);
		for (f = 0; f < sizeof(fields) / sizeof(fields[0]); f++) {
			ret = num(r, &list->arr.v[i], where, fields[f].key, false, (double *)((char *)v + fields[f].at));
			if (ret < 0)
				return ret;
			if (ret)
				v->has |= fields[f].bit;
		}
	}
	return 0;
}

static int point_line(struct reader *r, const struct mig_json *o, double t, bool pass_end)
{
	struct mig_plot *p = r->p;
	struct mig_plot_point *pt;
	const struct mig_json *list;
	double pass;
	int ret;

	if (p->n == r->cap) {
		size_t cap = r->cap ? r->cap * 2 : 64;

		pt = realloc(p->pt, cap * sizeof(*pt));
		if (!pt)
			return -ENOMEM;
		p->pt = pt;
		r->cap = cap;
	}
	pt = &p->pt[p->n];
	*pt = (struct mig_plot_point){ .line = r->line, .pass_end = pass_end, .t_ms = t, .link = -1,
				       .dirty_rate = -1, .redirty_rate = -1, .est_downtime_ms = -1 };
	if ((ret = whole(r, o, "", "pass", true, UINT32_MAX, &pass)) < 0 ||
	    (ret = num(r, o, "", "bytes_sent", true, &pt->bytes_sent)) < 0 ||
	    (ret = num(r, o, "", "dirty_bytes", true, &pt->dirty_bytes)) < 0 ||
	    (ret = num(r, o, "", "link_bytes_per_s", false, &pt->link)) < 0 ||
	    (ret = num(r, o, "", "dirty_pages_per_s", false, &pt->dirty_rate)) < 0 ||
	    (ret = num(r, o, "", "redirty_pages_per_s", false, &pt->redirty_rate)) < 0 ||
	    (ret = num(r, o, "", "est_downtime_ms", false, &pt->est_downtime_ms)) < 0 ||
	    (ret = boolean(r, o, "throttled", &pt->throttled)) < 0 || (ret = vcpu_list(r, o, &list)) < 0)
		return ret;
	pt->pass = (unsigned int)pass;
	/* counted now: its vCPU list is freed with it whatever comes of it */
	p->n++;
	return point_vcpus(r, list, pt);
}

static int end_line(struct reader *r, const struct mig_json *o, double t)
{
	struct mig_plot *p = r->p;
	const struct mig_json *reason = NULL;
	int ret;

	p->has_end = true;
	p->end_t_ms = t;
	if ((ret = boolean(r, o, "ok", &p->ok)) < 0 || (ret = boolean(r, o, "converged", &p->converged)) < 0 ||
	    (ret = boolean(r, o, "throttled", &p->throttled)) < 0)
		return ret;
	ret = boolean(r, o, "throttle", &p->throttle);
	if (ret < 0)
		return ret;
	p->throttle_known = ret == 1;
	if ((ret = string(r, o, "reason", &reason)) < 0)
		return ret;
	if (ret)
		snprintf(p->reason, sizeof(p->reason), "%s", reason->str.s);
	if ((ret = copy_string(r, o, "detail", &p->detail)) < 0 || (ret = copy_string(r, o, "error", &p->error)) < 0 ||
	    (ret = num(r, o, "", "total_ms", false, &p->total_ms)) < 0 ||
	    (ret = num(r, o, "", "downtime_ms", false, &p->downtime_ms)) < 0 ||
	    (ret = num(r, o, "", "passes", false, &p->passes)) < 0 ||
	    (ret = num(r, o, "", "bytes_sent", false, &p->bytes_sent)) < 0)
		return ret;
	return 0;
}

/* One line, parsed. */
static int take_line(struct reader *r, const struct mig_json *o)
{
	static const char *const known[] = { "start", "sample", "pass", "verify", "end" };
	const struct mig_json *type = NULL;
	double v, t;
	size_t k;
	int ret;

	if (o->type != MIG_JSON_OBJECT)
		return bad(r, "not a JSON object: not a stats line");
	if ((ret = num(r, o, "", "v", false, &v)) < 0)
		return ret;
	if (!ret)
		return bad(r, "no format version (\"v\"): not a stats line");
	if (v != MIG_PLOT_VERSION)
		return bad(r, "stats format version %g; this reads version %d", v, MIG_PLOT_VERSION);
	if ((ret = string(r, o, "type", &type)) < 0)
		return ret;
	if (!ret)
		return bad(r, "no \"type\"");
	if ((ret = num(r, o, "", "t_ms", true, &t)) < 0)
		return ret;
	for (k = 0; k < sizeof(known) / sizeof(known[0]) && strcmp(type->str.s, known[k]); k++)
		;
	if (k == sizeof(known) / sizeof(known[0]) || strlen(known[k]) != type->str.len)
		return 0; /* a line type of a later revision of the format */
	if (k && !r->started)
		return bad(r, "a %s line before the start line", known[k]);
	if (r->p->has_end)
		return bad(r, "a %s line after the end line", known[k]);
	switch (k) {
	case 0:
		return start_line(r, o, t);
	case 1:
	case 2:
		return point_line(r, o, t, k == 2);
	case 3:
		r->p->verified_line = true;
		r->p->verify_t_ms = t;
		return num(r, o, "", "lost_pages", false, &r->p->lost_pages) < 0 ? -EINVAL : 0;
	default:
		return end_line(r, o, t);
	}
}

/* Times from the start line on: the migration, not the source process, starts at 0. */
static void from_start(struct mig_plot *p, double t0)
{
	size_t i;

	for (i = 0; i < p->n; i++)
		p->pt[i].t_ms -= t0;
	p->verify_t_ms -= t0;
	p->end_t_ms -= t0;
}

int mig_plot_read(const char *buf, size_t len, struct mig_plot **ret, char *err, size_t errlen)
{
	struct reader r = { .err = err, .errlen = errlen };
	size_t at = 0;
	int status = 0;

	err[0] = 0;
	r.p = calloc(1, sizeof(*r.p));
	if (!r.p)
		return -ENOMEM;
	r.p->guest_pages = r.p->downtime_limit_ms = r.p->max_passes = r.p->timeout_ms = -1;
	r.p->page_size = 4096;
	r.p->lost_pages = -1;
	if (len > MIG_PLOT_MAX_FILE) {
		status = -EINVAL;
		snprintf(err, errlen, "%zu bytes, more than the %u MiB a stats file may have", len,
			 MIG_PLOT_MAX_FILE >> 20);
	}
	while (status == 0 && at < len) {
		const char *line = buf + at, *nl = memchr(line, '\n', len - at);
		size_t n = nl ? (size_t)(nl - line) : len - at, i;
		struct mig_json o;
		struct mig_json_error e;

		r.line++;
		at += n + (nl != NULL);
		for (i = 0; i < n && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r'); i++)
			;
		if (i == n)
			continue;
		if (n > MIG_PLOT_MAX_LINE) {
			status = bad(&r, "%zu bytes, more than the %u a stats line may have", n, MIG_PLOT_MAX_LINE);
			break;
		}
		status = mig_json_parse(line, n, &o, &e);
		if (status == -EINVAL && e.truncated && !nl) {
			/* the writer was stopped inside its last line */
			r.p->cut_line = r.line;
			status = 0;
			break;
		}
		if (status == -EINVAL)
			status = bad(&r, "column %zu: expected %s%s", e.offset + 1, e.msg,
				     e.truncated ? " before the line ends" : "");
		if (status < 0)
			break;
		status = take_line(&r, &o);
		mig_json_free(&o);
		r.p->lines++;
	}
	if (status == 0 && !r.started) {
		status = -EINVAL;
		if (r.p->cut_line)
			snprintf(err, errlen, "line %u is cut short and no complete start line comes before it: "
				 "nothing to plot", r.p->cut_line);
		else if (r.p->lines)
			snprintf(err, errlen, "no start line: not a stats file");
		else
			snprintf(err, errlen, "empty: no stats lines");
	}
	if (status < 0) {
		mig_plot_free(r.p);
		return status;
	}
	from_start(r.p, r.t0);
	r.p->incomplete = r.p->cut_line || !r.p->has_end;
	*ret = r.p;
	return 0;
}

void mig_plot_free(struct mig_plot *p)
{
	size_t i;

	if (!p)
		return;
	for (i = 0; i < p->n; i++)
		free(p->pt[i].vcpu);
	free(p->pt);
	free(p->before_per_s);
	free(p->progress0);
	free(p->detail);
	free(p->error);
	free(p);
}
