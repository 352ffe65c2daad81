// SPDX-License-Identifier: MIT
/*
 * The picture of a migration (lib/migrate/base/json.c, plot-read.c,
 * plot-svg.c), without KVM: the JSON reader on what RFC 8259 allows and
 * refuses, on hostile input (deep nesting, numbers a double cannot hold,
 * NaN, escapes cut short) and on every prefix of a real stats line (cut
 * short, never wrong); the stats reader's refusals, each naming its line,
 * and a file cut short read as incomplete; the SVG well-formed (with
 * hostile text and numbers too), a series per quantity with a vertex per
 * line that has it, and a long migration's series thinned to a pixel
 * column's four.
 */
#include <math.h>
#include <stdlib.h>

#include "json.h"
#include "plot.h"
#include "test-util.h"
#include "xml-check.h"

/* A stats file like the source writes (two vCPUs, dirty ring), with the lines given in between. */
#define START                                                                                                    \
	"{\"v\":1,\"type\":\"start\",\"t_ms\":500.0,\"mode\":\"dirty-ring\",\"regions\":2,\"guest_pages\":66048,"      \
	"\"page_size\":4096,\"vcpus\":2,\"downtime_limit_ms\":20,\"max_passes\":8,\"timeout_ms\":60000,"              \
	"\"verify\":true,\"baseline_ms\":300,\"vcpu\":[{\"id\":0,\"progress\":1000,\"before_per_s\":20000.0},"        \
	"{\"id\":1,\"progress\":500,\"before_per_s\":1000.0}]}\n"
#define SAMPLE(t, pass, sent, dirty, limit, held)                                                                \
	"{\"v\":1,\"type\":\"sample\",\"t_ms\":" #t ",\"pass\":" #pass ",\"bytes_sent\":" #sent                       \
	",\"pages_sent\":100,\"dirty_bytes\":" #dirty ",\"link_bytes_per_s\":95000000,\"dirty_pages_per_s\":6000,"    \
	"\"redirty_pages_per_s\":5000,\"throttled\":true,\"vcpu\":[{\"id\":0,\"progress\":2000,\"per_s\":900.0,"      \
	"\"dirty_per_s\":9000,\"dirty_limit\":" #limit ",\"held_ms\":" #held "},{\"id\":1,\"progress\":900,"          \
	"\"per_s\":1000.0,\"dirty_per_s\":200,\"dirty_limit\":0,\"held_ms\":0.0}]}\n"
#define PASS(t, pass, sent, dirty)                                                                               \
	"{\"v\":1,\"type\":\"pass\",\"t_ms\":" #t ",\"pass\":" #pass ",\"bytes_sent\":" #sent ",\"pages_sent\":100,"  \
	"\"dirty_bytes\":" #dirty ",\"link_bytes_per_s\":95000000,\"dirty_pages_per_s\":6000,\"throttled\":true,"     \
	"\"vcpu\":[{\"id\":0,\"progress\":2100,\"dirty_per_s\":9000,\"dirty_limit\":7000,\"held_ms\":80.0},"          \
	"{\"id\":1,\"progress\":1000,\"dirty_per_s\":200,\"dirty_limit\":0,\"held_ms\":0.0}],\"pass_pages\":100,"     \
	"\"remaining_pages\":10,\"est_downtime_ms\":3.5}\n"
#define END                                                                                                      \
	"{\"v\":1,\"type\":\"verify\",\"t_ms\":900.0,\"lost\":[],\"verified_pages\":66048,\"lost_pages\":0,"          \
	"\"verify_ms\":10.0}\n"                                                                                       \
	"{\"v\":1,\"type\":\"end\",\"t_ms\":910.0,\"ok\":true,\"converged\":true,\"reason\":\"fits_downtime\","       \
	"\"total_ms\":400.0,\"downtime_ms\":7.9,\"bytes_sent\":120000000,\"passes\":1,\"throttle\":true,"             \
	"\"throttled\":true}\n"
#define RUN START SAMPLE(600.0, 1, 10000000, 200000000, 7000, 20.0) SAMPLE(700.0, 1, 20000000, 100000000, 7000, 70.0) \
	PASS(701.0, 1, 21000000, 4000000) SAMPLE(800.0, 0, 30000000, 0, 0, 80.0) END

/* ---- the JSON reader ---- */

static int parse(const char *s, struct mig_json *v, struct mig_json_error *e)
{
	return mig_json_parse(s, strlen(s), v, e);
}

/* s is refused; whether as cut short, and the message holds want. */
static void refused(const char *s, bool truncated, const char *want)
{
	struct mig_json_error e;
	struct mig_json v;
	int ret = parse(s, &v, &e);

	ck_assert_msg(ret == -EINVAL, "'%s': %d, expected -EINVAL", s, ret);
	ck_assert_msg(e.truncated == truncated, "'%s': truncated %d at %zu (%s), expected %d", s, e.truncated, e.offset,
		      e.msg, truncated);
	ck_assert_msg(strstr(e.msg, want), "'%s': '%s', expected '%s'", s, e.msg, want);
	ck_assert_msg(!strchr(e.msg, '\n'), "'%s': a message of more than one line", s);
}

START_TEST(json_values)
{
	struct mig_json_error e;
	struct mig_json v;
	const struct mig_json *m;

	ck_assert_ok(parse(" {\"a\" : [1, -2.5e3, true, false, null, \"x\\\"\\\\\\/\\b\\f\\n\\r\\t\"], \"a\": 7}\r\n",
			   &v, &e));
	ck_assert_int_eq(v.type, MIG_JSON_OBJECT);
	m = mig_json_get(&v, "a"); /* the first of a repeated key */
	ck_assert(m && m->type == MIG_JSON_ARRAY && m->arr.n == 6);
	ck_assert(m->arr.v[0].num == 1 && m->arr.v[1].num == -2500);
	ck_assert(m->arr.v[2].type == MIG_JSON_TRUE && m->arr.v[3].type == MIG_JSON_FALSE &&
		  m->arr.v[4].type == MIG_JSON_NULL);
	ck_assert_uint_eq(m->arr.v[5].str.len, 9);
	ck_assert(!memcmp(m->arr.v[5].str.s, "x\"\\/\b\f\n\r\t", 9));
	ck_assert(!mig_json_get(&v, "b") && !mig_json_get(m, "a"));
	mig_json_free(&v);

	/* UTF-8 from escapes, a surrogate pair, and a NUL that the length keeps */
	ck_assert_ok(parse("\"\\u00e9\\u20AC\\ud83d\\ude00\\u0000z\"", &v, &e));
	ck_assert_uint_eq(v.str.len, 2 + 3 + 4 + 2);
	ck_assert(!memcmp(v.str.s, "\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\0z", 11));
	mig_json_free(&v);
	/* raw UTF-8 passes as it is */
	ck_assert_ok(parse("\"\xc3\xa9\"", &v, &e));
	ck_assert(v.str.len == 2 && !strcmp(v.str.s, "\xc3\xa9"));
	mig_json_free(&v);
	ck_assert_ok(parse("[]", &v, &e));
	ck_assert(v.type == MIG_JSON_ARRAY && v.arr.n == 0);
	mig_json_free(&v);
	ck_assert_ok(parse("{}", &v, &e));
	mig_json_free(&v);
}
END_TEST

START_TEST(json_numbers)
{
	static const struct {
		const char *in;
		double want;
	} ok[] = {
		{ "0", 0 }, { "-0", 0 }, { "12", 12 }, { "1.5e-3", 0.0015 }, { "1E+2", 100 }, { "1e-400", 0 },
		{ "1.7976931348623157e308", 1.7976931348623157e308 },
		{ "123456789012345678901234567890123456789012345678901234567890", 1.2345678901234568e59 },
	};
	struct mig_json_error e;
	struct mig_json v;
	size_t i;

	for (i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		ck_assert_msg(parse(ok[i].in, &v, &e) == 0, "'%.20s': %s", ok[i].in, e.msg);
		ck_assert_msg(v.type == MIG_JSON_NUMBER && v.num == ok[i].want, "'%.20s': %g", ok[i].in, v.num);
	}
	/* what strtod would take and JSON does not, and what a double cannot hold */
	refused("1e400", false, "a number a double holds");
	refused("-1e99999", false, "a number a double holds");
	refused("NaN", false, "a value");
	refused("nan", false, "'null'");
	refused("Infinity", false, "a value");
	refused("-Infinity", false, "a digit");
	refused("+1", false, "a value");
	refused("0x10", false, "the end after the value");
	refused("01", false, "the end after the value");
	refused(".5", false, "a value");
	refused("1.e5", false, "a digit after '.'");
	refused("1e", true, "a digit in the exponent");
	refused("1.", true, "a digit after '.'");
	refused("-", true, "a digit");
	refused("[1,]", false, "a value");
	refused("[1 2]", false, "',' or ']'");
}
END_TEST

START_TEST(json_strings)
{
	refused("\"\\u12", true, "four hex digits");
	refused("\"\\u", true, "four hex digits");
	refused("\"\\", true, "an escape after");
	refused("\"abc", true, "'\"' to end the string");
	refused("\"\\u12G4\"", false, "four hex digits");
	refused("\"\\x\"", false, "an escape after");
	refused("\"\\ud800\"", false, "a low surrogate after a high one");
	refused("\"\\ud800\\u0041\"", false, "a low surrogate");
	refused("\"\\udc00\"", false, "no lone low surrogate");
	refused("\"\\ud800\\", true, "'\\u' and a low surrogate");
	refused("\"\\ud800\\ud8", true, "four hex digits");
	refused("\"a\tb\"", false, "control character");
	refused("\"a\nb\"", false, "control character");
	refused("{\"a\" 1}", false, "':'");
	refused("{a:1}", false, "a member's name");
	refused("{\"a\":1,}", false, "a member's name");
	refused("{\"a\":1", true, "',' or '}'");
	refused("", true, "a value");
	refused("   ", true, "a value");
	refused("tru", true, "'true'");
	refused("trux", false, "'true'");
	refused("{} {}", false, "the end after the value");
}
END_TEST

START_TEST(json_nul_is_not_the_end)
{
	struct mig_json_error e;
	struct mig_json v;

	/* the reader takes len bytes: a NUL inside is a wrong byte, not the end */
	ck_assert_int_eq(mig_json_parse("{}\0{}", 5, &v, &e), -EINVAL);
	ck_assert(!e.truncated && e.offset == 2);
	ck_assert_int_eq(mig_json_parse("[1\0]", 4, &v, &e), -EINVAL);
	ck_assert(!e.truncated && e.offset == 2);
}
END_TEST

START_TEST(json_depth)
{
	size_t n = 100000, i;
	char *s = malloc(2 * n + 1);
	struct mig_json_error e;
	struct mig_json v;

	ck_assert_ptr_nonnull(s);
	for (i = 0; i < MIG_JSON_MAX_DEPTH; i++)
		s[i] = '[', s[2 * MIG_JSON_MAX_DEPTH - 1 - i] = ']';
	ck_assert_ok(mig_json_parse(s, 2 * MIG_JSON_MAX_DEPTH, &v, &e));
	mig_json_free(&v);
	/* one deeper, and 100000 deep: refused where the limit is passed, no stack overflow */
	memset(s, '[', n);
	memset(s + n, ']', n);
	ck_assert_int_eq(mig_json_parse(s, 2 * MIG_JSON_MAX_DEPTH + 2, &v, &e), -EINVAL);
	ck_assert(e.offset == MIG_JSON_MAX_DEPTH && strstr(e.msg, "levels of nesting"));
	ck_assert_int_eq(mig_json_parse(s, 2 * n, &v, &e), -EINVAL);
	ck_assert(e.offset == MIG_JSON_MAX_DEPTH && !e.truncated);
	for (i = 0; i < n; i++)
		s[i] = i % 2 ? '{' : '[';
	ck_assert_int_eq(mig_json_parse(s, n, &v, &e), -EINVAL);
	free(s);
}
END_TEST

/* Every proper prefix of a stats line is cut short, never wrong; a wrong byte at any point is wrong. */
START_TEST(json_every_prefix)
{
	static const char line[] = SAMPLE(600.5, 1, 10000000, 200000000, 7000, 20.0);
	size_t n = strlen(line) - 1, k; /* without its newline */
	struct mig_json_error e;
	struct mig_json v;
	char bad[sizeof(line)];

	ck_assert_ok(mig_json_parse(line, n, &v, &e));
	mig_json_free(&v);
	for (k = 0; k < n; k++) {
		ck_assert_msg(mig_json_parse(line, k, &v, &e) == -EINVAL && e.truncated,
			      "prefix of %zu bytes: truncated %d (%s at %zu)", k, e.truncated, e.msg, e.offset);
		memcpy(bad, line, n);
		bad[k] = '\x01';
		ck_assert_msg(mig_json_parse(bad, n, &v, &e) == -EINVAL && !e.truncated && e.offset == k,
			      "byte %zu wrong: truncated %d at %zu (%s)", k, e.truncated, e.offset, e.msg);
	}
}
END_TEST

/* ---- the stats reader ---- */

static struct mig_plot *read_ok(const char *s)
{
	struct mig_plot *p = NULL;
	char err[256];
	int ret = mig_plot_read(s, strlen(s), &p, err, sizeof(err));

	ck_assert_msg(ret == 0, "refused: %s", err);
	return p;
}

/* s is refused with exactly want. */
static void read_refused(const char *s, const char *want)
{
	struct mig_plot *p = NULL;
	char err[256];
	int ret = mig_plot_read(s, strlen(s), &p, err, sizeof(err));

	ck_assert_msg(ret == -EINVAL && !p, "'%.60s...': %d, expected a refusal", s, ret);
	ck_assert_msg(!strcmp(err, want), "got '%s', expected '%s'", err, want);
}

START_TEST(read_run)
{
	struct mig_plot *p = read_ok(RUN);

	ck_assert(!p->incomplete && p->has_end && p->ok && p->converged && !p->cut_line);
	ck_assert_str_eq(p->mode, "dirty-ring");
	ck_assert_uint_eq(p->vcpus, 2);
	ck_assert_uint_eq(p->n, 4);
	ck_assert_uint_eq(p->lines, 7);
	/* times from the start line's */
	ck_assert(p->pt[0].t_ms == 100 && p->pt[2].t_ms == 201 && p->end_t_ms == 410);
	ck_assert(!p->pt[0].pass_end && p->pt[2].pass_end && p->pt[2].pass == 1 && p->pt[3].pass == 0);
	ck_assert(p->pt[2].est_downtime_ms == 3.5 && p->pt[0].est_downtime_ms < 0);
	ck_assert(p->pt[2].redirty_rate < 0 && p->pt[0].redirty_rate == 5000);
	ck_assert(p->pt[0].nv == 2 && p->pt[0].vcpu[0].limit == 7000 && p->pt[0].vcpu[1].id == 1);
	ck_assert(p->pt[0].vcpu[0].has == (MIG_PLOT_DIRTY | MIG_PLOT_LIMIT | MIG_PLOT_HELD | MIG_PLOT_PROGRESS));
	ck_assert(p->before_per_s[0] == 20000 && p->progress0[1] == 500);
	ck_assert(p->downtime_ms == 7.9 && p->lost_pages == 0 && p->throttle_known && p->throttled);
	ck_assert_str_eq(p->reason, "fits_downtime");
	mig_plot_free(p);
}
END_TEST

START_TEST(read_refusals)
{
	read_refused("", "empty: no stats lines");
	read_refused("\n \n\t\n", "empty: no stats lines");
	read_refused(START "{\"v\":2,\"type\":\"sample\",\"t_ms\":1}\n" END, "line 2: stats format version 2; this reads version 1");
	read_refused("{\"v\":1.5,\"type\":\"start\",\"t_ms\":1}\n", "line 1: stats format version 1.5; this reads version 1");
	read_refused("{\"type\":\"start\",\"t_ms\":1}\n", "line 1: no format version (\"v\"): not a stats line");
	read_refused("{\"v\":\"1\",\"type\":\"start\",\"t_ms\":1}\n", "line 1: \"v\": expected a number");
	read_refused("[1]\n", "line 1: not a JSON object: not a stats line");
	read_refused(START "{\"v\":1,\"type\":\"sample\",\"t_ms\":1,,}\n" END, "line 2: column 33: expected a member's name in '\"'");
	/* a line cut short and followed by another is wrong, not cut short */
	read_refused(START "{\"v\":1,\"type\":\"sa\n" END, "line 2: column 18: expected '\"' to end the string before the line ends");
	read_refused(SAMPLE(1, 1, 1, 1, 1, 1), "line 1: a sample line before the start line");
	read_refused(START START, "line 2: a second start line: one migration to a file");
	read_refused(START END START, "line 4: a start line after the end line");
	read_refused(START "{\"v\":1,\"type\":\"pass\",\"t_ms\":1,\"pass\":1,\"dirty_bytes\":0}\n", "line 2: no \"bytes_sent\"");
	read_refused(START "{\"v\":1,\"type\":\"pass\",\"t_ms\":1,\"pass\":-1,\"bytes_sent\":0,\"dirty_bytes\":0}\n", "line 2: \"pass\": -1, expected a whole number from 0 to 4294967295");
	read_refused(START "{\"v\":1,\"type\":\"sample\",\"t_ms\":1,\"pass\":1,\"bytes_sent\":0,\"dirty_bytes\":0,"
			   "\"link_bytes_per_s\":\"fast\"}\n", "line 2: \"link_bytes_per_s\": expected a number");
	read_refused(START "{\"v\":1,\"type\":\"sample\",\"t_ms\":1,\"pass\":1,\"bytes_sent\":0,\"dirty_bytes\":0,"
			   "\"vcpu\":[{\"id\":2}]}\n", "line 2: \"vcpu[0].id\": 2, expected a whole number from 0 to 1");
	read_refused(START "{\"v\":1,\"type\":\"sample\",\"t_ms\":1,\"pass\":1,\"bytes_sent\":0,\"dirty_bytes\":0,"
			   "\"vcpu\":[{\"id\":0,\"held_ms\":null}]}\n", "line 2: \"vcpu[0].held_ms\": expected a number");
	read_refused(START "{\"v\":1,\"type\":\"end\",\"t_ms\":1,\"converged\":1}\n", "line 2: \"converged\": expected true or false");
	read_refused("{\"v\":1,\"type\":\"note\",\"t_ms\":1}\n", "no start line: not a stats file");
	read_refused("{\"v\":1,\"type\":\"start\",\"t_ms\":1,\"vcp", "line 1 is cut short and no complete start line comes before it: nothing to plot");
}
END_TEST

START_TEST(read_cut_short)
{
	static const char run[] = RUN;
	size_t end_at = strlen(run) - strlen(END), k;
	struct mig_plot *p;
	char err[256];

	/* cut anywhere after the start line: read, incomplete */
	for (k = strlen(START); k < strlen(run); k++) {
		int ret = mig_plot_read(run, k, &p, err, sizeof(err));

		ck_assert_msg(ret == 0, "cut at %zu: %s", k, err);
		ck_assert_msg(p->incomplete == (k < strlen(run) - 1 || !p->has_end), "cut at %zu: incomplete %d", k,
			      p->incomplete);
		ck_assert_msg(!p->cut_line == (run[k - 1] == '\n' || run[k] == '\n'), "cut at %zu: cut line %u", k,
			      p->cut_line);
		if (k < end_at)
			ck_assert_msg(!p->has_end, "cut at %zu", k);
		mig_plot_free(p);
	}
	/* inside the last line: the lines before it are there */
	ck_assert_ok(mig_plot_read(run, end_at - 40, &p, err, sizeof(err)));
	ck_assert(p->cut_line == 5 && p->n == 3 && p->lines == 4);
	mig_plot_free(p);
	/* a later line type than this reader knows is skipped, also after the end */
	p = read_ok(RUN "{\"v\":1,\"type\":\"later\",\"t_ms\":1,\"x\":[{}]}\n");
	ck_assert(!p->incomplete && p->n == 4);
	mig_plot_free(p);
}
END_TEST

/* ---- the picture ---- */

/* The SVG of a stats file, well-formed; its text (free it). */
static char *render(const char *stats, size_t len, struct mig_plot **ret_p)
{
	struct mig_plot *p;
	struct xml_check x;
	char err[256], *buf = NULL;
	size_t n = 0;
	FILE *f;

	ck_assert_msg(mig_plot_read(stats, len, &p, err, sizeof(err)) == 0, "refused: %s", err);
	f = open_memstream(&buf, &n);
	ck_assert_ptr_nonnull(f);
	ck_assert_ok(mig_plot_svg(p, "a <name> & \"quotes\" \xff", f));
	fclose(f);
	ck_assert_msg(xml_check(&x, buf, n) == 0, "not well-formed: %s: '%.60s'", x.why,
		      buf + (x.i > 20 ? x.i - 20 : 0));
	ck_assert_msg(!strstr(buf, "<script") && !strstr(buf, "href") && !strstr(buf, "@import"),
		      "the SVG refers outside itself");
	if (ret_p)
		*ret_p = p;
	else
		mig_plot_free(p);
	return buf;
}

/* Vertices of the series name: -1 if there is no such series. */
static long vertices(const char *svg, const char *name)
{
	char tag[64];
	const char *s, *end;
	long n = 0;

	snprintf(tag, sizeof(tag), "data-series=\"%s\"", name);
	s = strstr(svg, tag);
	if (!s)
		return -1;
	end = strstr(s, "</g>");
	while ((s = strstr(s, "points=\"")) && s < end)
		for (s += 8; *s != '"'; s++)
			n += *s == ',';
	return n;
}

START_TEST(svg_series)
{
	static const char *const all[] = { "bytes_sent", "dirty_bytes", "downtime_fit", "link", "dirty_rate",
					   "vcpu0_dirty", "vcpu1_dirty", "vcpu0_speed", "vcpu1_speed" };
	char *svg = render(RUN, strlen(RUN), NULL);
	size_t i;

	for (i = 0; i < sizeof(all) / sizeof(all[0]); i++)
		ck_assert_msg(vertices(svg, all[i]) == 4, "%s: %ld vertices", all[i], vertices(svg, all[i]));
	/* only samples have it */
	ck_assert_int_eq(vertices(svg, "redirty_rate"), 3);
	/* a gap where the limit is 0 (none), and none at all for the vCPU never limited */
	ck_assert_int_eq(vertices(svg, "vcpu0_limit"), 3);
	ck_assert_int_eq(vertices(svg, "vcpu1_limit"), -1);
	/* ring mode has no run shares */
	ck_assert_int_eq(vertices(svg, "vcpu0_share"), -1);
	/* held: a difference, none for the first line */
	ck_assert_int_eq(vertices(svg, "vcpu0_held"), 3);
	ck_assert_msg(strstr(svg, "data-incomplete=\"false\" data-converged=\"true\""), "%.300s", svg);
	ck_assert(strstr(svg, ">Converged after 1 pass: 0.40 s, downtime 7.9 ms<"));
	ck_assert(strstr(svg, ">downtime 7.9 ms<"));
	/* the name, escaped, and the byte XML cannot hold replaced */
	ck_assert(strstr(svg, "from a &lt;name&gt; &amp; &quot;quotes&quot; ?<"));
	free(svg);
}
END_TEST

START_TEST(svg_values)
{
	char *svg = render(RUN, strlen(RUN), NULL);
	const char *s = strstr(strstr(svg, "data-series=\"vcpu0_held\""), "points=\"");
	double x[3], y[3], top, h;
	int k;

	/* held 20 -> 70 ms over 100 ms: half; then 70 -> 80 over the 101 ms since the first sample */
	ck_assert(s && sscanf(s, "points=\"%lf,%lf %lf,%lf %lf,%lf", &x[0], &y[0], &x[1], &y[1], &x[2], &y[2]) == 6);
	s = strstr(svg, "<rect class=\"frame\"");
	for (k = 0; k < 4; k++)
		s = strstr(s + 1, "<rect class=\"frame\"");
	ck_assert(s && sscanf(s, "<rect class=\"frame\" x=\"96\" y=\"%lf\" width=\"830\" height=\"%lf\"", &top, &h) == 2);
	ck_assert_msg(fabs(y[0] - (top + h * 0.5)) < 0.11, "held 50%%: y %g in [%g, %g]", y[0], top, top + h);
	ck_assert_msg(fabs(y[1] - (top + h * (1 - 60.0 / 101))) < 0.11, "held 59.4%%: y %g", y[1]);
	ck_assert(x[0] < x[1] && x[1] < x[2]);
	free(svg);
}
END_TEST

START_TEST(svg_incomplete)
{
	static const char run[] = RUN;
	size_t cut = strlen(run) - strlen(END) - 40;
	struct mig_plot *p;
	char *svg = render(run, cut, &p);

	ck_assert(p->incomplete && p->cut_line == 5);
	ck_assert(strstr(svg, "data-incomplete=\"true\" data-converged=\"unknown\""));
	ck_assert(strstr(svg, ">Incomplete: the stats stop before their end line (the last one cut short)"));
	ck_assert(strstr(svg, "class=\"cut\"") && strstr(svg, ">stats end here<"));
	ck_assert_int_eq(vertices(svg, "bytes_sent"), 3);
	mig_plot_free(p);
	free(svg);
}
END_TEST

/* Text and numbers nobody vouches for: still well-formed, whatever the range. */
START_TEST(svg_hostile)
{
	static const char stats[] =
		"{\"v\":1,\"type\":\"start\",\"t_ms\":-1e300,\"mode\":\"<\\u0001&\\ud83d\\ude00\xc0\xaf\",\"vcpus\":1024,"
		"\"page_size\":1e-300,\"downtime_limit_ms\":1e308,\"guest_pages\":-5}\n"
		"{\"v\":1,\"type\":\"sample\",\"t_ms\":1e308,\"pass\":4294967295,\"bytes_sent\":-1e308,\"dirty_bytes\":1e308,"
		"\"link_bytes_per_s\":1e308,\"dirty_pages_per_s\":1e308,\"vcpu\":[{\"id\":1023,\"dirty_per_s\":1e308,"
		"\"held_ms\":-1e308,\"progress\":1e308,\"run_share\":-4}]}\n"
		"{\"v\":1,\"type\":\"pass\",\"t_ms\":-1e308,\"pass\":0,\"bytes_sent\":0,\"dirty_bytes\":-0,"
		"\"vcpu\":[{\"id\":1023,\"held_ms\":1e308,\"dirty_limit\":1e308}]}\n"
		"{\"v\":1,\"type\":\"pass\",\"t_ms\":-1e308,\"pass\":0,\"bytes_sent\":0,\"dirty_bytes\":5e-324}\n"
		"{\"v\":1,\"type\":\"end\",\"t_ms\":0,\"ok\":true,\"converged\":false,\"reason\":\"\\u0000\\\"<x>\","
		"\"detail\":\"\\ud800\\udc00 ]]> &amp; \\u001f\\u007f\\uffff\\ufffe\xed\xa0\x80 "
		"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
		"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\xc3\xa9"
		"\",\"error\":\"x\",\"downtime_ms\":1e308,\"passes\":-1e308}\n";
	char *svg = render(stats, sizeof(stats) - 1, NULL);

	ck_assert_int_eq(vertices(svg, "bytes_sent"), 3);
	ck_assert_int_eq(vertices(svg, "vcpu1023_dirty"), 1);
	free(svg);
	/* nothing but a start line */
	svg = render(START, strlen(START), NULL);
	ck_assert(strstr(svg, ">no samples in these stats<"));
	free(svg);
}
END_TEST

/* A start line without a vCPU count: the vCPUs the lines name, every one. */
START_TEST(svg_vcpus_from_lines)
{
	static const char stats[] =
		"{\"v\":1,\"type\":\"start\",\"t_ms\":0}\n"
		"{\"v\":1,\"type\":\"sample\",\"t_ms\":100,\"pass\":1,\"bytes_sent\":1,\"dirty_bytes\":1,"
		"\"vcpu\":[{\"id\":0,\"dirty_per_s\":1}]}\n"
		"{\"v\":1,\"type\":\"sample\",\"t_ms\":200,\"pass\":1,\"bytes_sent\":2,\"dirty_bytes\":1,"
		"\"vcpu\":[{\"id\":3,\"dirty_per_s\":2},{\"id\":0,\"dirty_per_s\":3}]}\n";
	char *svg = render(stats, sizeof(stats) - 1, NULL);

	ck_assert_int_eq(vertices(svg, "vcpu0_dirty"), 2);
	ck_assert_int_eq(vertices(svg, "vcpu3_dirty"), 1);
	ck_assert_int_eq(vertices(svg, "vcpu1_dirty"), -1);
	/* no baseline, no downtime limit: no speed, no line of what the limit allows */
	ck_assert_int_eq(vertices(svg, "vcpu0_speed"), -1);
	ck_assert_int_eq(vertices(svg, "downtime_fit"), -1);
	ck_assert(strstr(svg, ">no speed before tracking in these stats"));
	free(svg);
}
END_TEST

/* A long migration: every series thinned to at most four vertices a pixel column, ends kept. */
START_TEST(svg_long)
{
	size_t n = 20000, i, at, cap = strlen(START) + n * 400;
	char *stats = malloc(cap), *svg;
	long v;

	ck_assert_ptr_nonnull(stats);
	at = (size_t)snprintf(stats, cap, "%s", START);
	for (i = 0; i < n; i++)
		at += (size_t)snprintf(stats + at, cap - at,
				       "{\"v\":1,\"type\":\"sample\",\"t_ms\":%zu,\"pass\":1,\"bytes_sent\":%zu,"
				       "\"dirty_bytes\":%zu,\"link_bytes_per_s\":%s}\n",
				       600 + i * 100, i * 4096, (i % 7) * 4096, i == n / 2 ? "-1" : "1e8");
	svg = render(stats, at, NULL);
	v = vertices(svg, "bytes_sent");
	ck_assert_msg(v >= 830 && v <= 4 * 831, "bytes_sent: %ld vertices of %zu", v, n);
	/* the sample without a link: a gap, two polylines */
	v = vertices(svg, "link");
	ck_assert_msg(v >= 830 && v <= 4 * 832, "link: %ld vertices", v);
	ck_assert(strstr(svg, "data-points=\"20000\""));
	free(svg);
	free(stats);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("plot");
	TCase *json = tcase_create("json"), *rd = tcase_create("read"), *svg = tcase_create("svg");

	tcase_add_test(json, json_values);
	tcase_add_test(json, json_numbers);
	tcase_add_test(json, json_strings);
	tcase_add_test(json, json_nul_is_not_the_end);
	tcase_add_test(json, json_depth);
	tcase_add_test(json, json_every_prefix);
	tcase_add_test(rd, read_run);
	tcase_add_test(rd, read_refusals);
	tcase_add_test(rd, read_cut_short);
	tcase_add_test(svg, svg_series);
	tcase_add_test(svg, svg_values);
	tcase_add_test(svg, svg_incomplete);
	tcase_add_test(svg, svg_hostile);
	tcase_add_test(svg, svg_vcpus_from_lines);
	tcase_add_test(svg, svg_long);
	tcase_set_timeout(svg, 60);
	suite_add_tcase(s, json);
	suite_add_tcase(s, rd);
	suite_add_tcase(s, svg);
	return run_suite(s);
}
