// SPDX-License-Identifier: MIT
/*
 * The dirty-rate sampler's lines (lib/migrate/rate/rate.h), without KVM:
 * mig_rate_format() as text and as JSON for 0, 2 and 64 vCPUs and figures
 * up to 2^63 - 1: the JSON parses (the engine's own reader) with exactly
 * the documented keys and values, the text has every field once in order,
 * and a buffer too small for a line is never written past, the line cut
 * and still terminated.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "json.h"
#include "rate.h"
#include "test-util.h"

static uint64_t rates[1024];

static struct mig_rate_sample sample(unsigned int n, uint64_t base, bool ring)
{
	unsigned int i;

	for (i = 0; i < n; i++)
		rates[i] = base + i;
	return (struct mig_rate_sample){ .t_ms = 1032,
					 .ns = 1000000000,
					 .pages = base * 7,
					 .pages_per_s = base * 7,
					 .by_ring = ring,
					 .nr_vcpus = n,
					 .vcpu_pages_per_s = rates };
}

static uint64_t num(const struct mig_json *o, const char *key)
{
	const struct mig_json *v = mig_json_get(o, key);

	ck_assert_msg(v && v->type == MIG_JSON_NUMBER, "no number '%s'", key);
	return (uint64_t)v->num;
}

static const uint64_t bases[] = { 0, 1, 12345, UINT64_C(1) << 40 };
static const unsigned int counts[] = { 0, 2, 64 };

START_TEST(json_as_documented)
{
	char buf[8192];
	unsigned int b, c, i;

	for (b = 0; b < sizeof(bases) / sizeof(bases[0]); b++) {
		for (c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
			struct mig_rate_sample s = sample(counts[c], bases[b], c == 1);
			struct mig_json j, *v;
			struct mig_json_error e;

			mig_rate_format(&s, true, buf, sizeof(buf));
			ck_assert_msg(mig_json_parse(buf, strlen(buf), &j, &e) == 0, "'%s': %s at %zu", buf, e.msg,
				      e.offset);
			ck_assert_int_eq(j.type, MIG_JSON_OBJECT);
			ck_assert_uint_eq(j.obj.n, 5);
			ck_assert_uint_eq(num(&j, "t_ms"), 1032);
			ck_assert_uint_eq(num(&j, "guest_pages_per_s"), bases[b] * 7);
			ck_assert_uint_eq(num(&j, "guest_bytes_per_s"), bases[b] * 7 * 4096);
			v = (struct mig_json *)mig_json_get(&j, "vcpu_by");
			ck_assert(v && v->type == MIG_JSON_STRING);
			ck_assert_str_eq(v->str.s, c == 1 ? "ring" : "faults");
			v = (struct mig_json *)mig_json_get(&j, "vcpus");
			ck_assert(v && v->type == MIG_JSON_ARRAY);
			ck_assert_uint_eq(v->arr.n, counts[c]);
			for (i = 0; i < counts[c]; i++) {
				ck_assert_uint_eq(v->arr.v[i].obj.n, 2);
				ck_assert_uint_eq(num(&v->arr.v[i], "pages_per_s"), bases[b] + i);
				ck_assert_uint_eq(num(&v->arr.v[i], "bytes_per_s"), (bases[b] + i) * 4096);
			}
			mig_json_free(&j);
		}
	}
}
END_TEST

START_TEST(text_as_documented)
{
	struct mig_rate_sample s = sample(3, 100, false);
	char buf[1024];

	mig_rate_format(&s, false, buf, sizeof(buf));
	ck_assert_str_eq(buf, "rate t_ms=1032 guest_pages_per_s=700 guest_bytes_per_s=2867200 "
			      "vcpu_by=faults"
			      " vcpu0=100 vcpu0_bytes_per_s=409600 vcpu1=101 vcpu1_bytes_per_s=413696"
			      " vcpu2=102 vcpu2_bytes_per_s=417792");
	s = sample(0, 5, true);
	mig_rate_format(&s, false, buf, sizeof(buf));
	ck_assert_str_eq(buf, "rate t_ms=1032 guest_pages_per_s=35 "
			      "guest_bytes_per_s=143360 vcpu_by=ring");
}
END_TEST

/* Every buffer length from 0 to past the whole line: never a byte past it, always terminated, a prefix of the line. */
START_TEST(short_buffers_cut_not_overrun)
{
	struct mig_rate_sample s = sample(64, UINT64_C(1) << 40, _i);
	static char whole[8192], buf[8192 + 64];
	size_t len, n;

	mig_rate_format(&s, _i, whole, sizeof(whole));
	n = strlen(whole);
	ck_assert_uint_lt(n, sizeof(whole) - 1);
	for (len = 0; len <= n + 8; len++) {
		memset(buf, 0x7f, sizeof(buf));
		mig_rate_format(&s, _i, buf, len);
		ck_assert_msg(buf[len] == 0x7f && (len == 0 || buf[len - 1] == 0 || strlen(buf) < len),
			      "len %zu: written past, or not terminated", len);
		if (len)
			ck_assert_msg(!strncmp(buf, whole, strlen(buf)), "len %zu: not a prefix of the line", len);
	}
}
END_TEST

/* 1,024 vCPUs at the largest figures: 256 bytes and 96 a vCPU (what the sampler allots, rate.h) hold the line whole. */
START_TEST(largest_line_fits)
{
	static char buf[256 + 96 * 1024];
	struct mig_rate_sample s = sample(1024, UINT64_MAX - 2000, _i);
	size_t n;

	s.t_ms = s.pages_per_s = UINT64_MAX;
	mig_rate_format(&s, _i, buf, sizeof(buf));
	n = strlen(buf);
	/* whole: room to spare, and it ends with the last vCPU's field */
	ck_assert_msg(n < sizeof(buf) - 1 && (_i ? n >= 2 && !strcmp(buf + n - 2, "]}")
					       : strstr(buf, " vcpu1023_bytes_per_s=") != NULL),
		      "%s line of 1024 vCPUs: %zu bytes, cut", _i ? "JSON" : "text", n);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("rate");
	TCase *tc = tcase_create("format");

	tcase_add_test(tc, json_as_documented);
	tcase_add_test(tc, text_as_documented);
	tcase_add_loop_test(tc, short_buffers_cut_not_overrun, 0, 2);
	tcase_add_loop_test(tc, largest_line_fits, 0, 2);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
