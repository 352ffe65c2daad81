// SPDX-License-Identifier: MIT
/*
 * The source's throttle policy (lib/migrate/rate/throttle.c), without
 * KVM: when it engages, how it splits the link's share over vCPUs (a
 * vCPU that does not dirty is never slowed), run shares for the bitmap
 * modes, the correction when the guest still re-dirties too much, and the
 * release of a vCPU that stopped dirtying.
 */
#include "test-util.h"
#include "throttle.h"

static struct mig_throttle_sample sample(double link, double redirty, double r0, double r1, double r2)
{
	struct mig_throttle_sample s = { .link_pages_per_s = link, .redirty_per_s = redirty };

	s.vcpu_rate[0] = r0;
	s.vcpu_rate[1] = r1;
	s.vcpu_rate[2] = r2;
	return s;
}

START_TEST(engages_only_past_the_target)
{
	struct mig_throttle t;
	struct mig_throttle_sample s = sample(24000, 7000, 300000, 0, 0);

	mig_throttle_init(&t, true, 2, 0);
	ck_assert(!mig_throttle_update(&t, &s));
	ck_assert(!t.engaged);
	ck_assert_uint_eq(t.limit[0], 0);
	/* a third of the link is 8000 pages/s: 9000 re-dirtied engages it */
	s.redirty_per_s = 9000;
	ck_assert(mig_throttle_update(&t, &s));
	ck_assert(t.engaged);
	ck_assert_uint_eq(t.limit[0], 8000);
	ck_assert_uint_eq(t.limit[1], 0); /* the vCPU that does not dirty */
	/* no link measured yet: nothing changes */
	s.link_pages_per_s = 0;
	ck_assert(!mig_throttle_update(&t, &s));
	ck_assert_uint_eq(t.limit[0], 8000);
}
END_TEST

START_TEST(water_filling)
{
	struct mig_throttle t;
	struct mig_throttle_sample s = sample(30000, 20000, 1000, 20000, 50000);

	mig_throttle_init(&t, true, 3, 0);
	ck_assert(mig_throttle_update(&t, &s));
	/* 10000 to share: the small one keeps its 1000, the others 4500 each */
	ck_assert_uint_eq(t.limit[0], 0);
	ck_assert_uint_eq(t.limit[1], 4500);
	ck_assert_uint_eq(t.limit[2], 4500);
}
END_TEST

START_TEST(run_shares)
{
	struct mig_throttle t;
	struct mig_throttle_sample s = sample(24000, 100000, 400000, 10, 0);

	mig_throttle_init(&t, false, 2, 0);
	ck_assert(mig_throttle_update(&t, &s));
	/* 8000 of 400000: 2% of the time in KVM_RUN */
	ck_assert_uint_eq(t.share[0], 20);
	ck_assert_uint_eq(t.share[1], 1000);
	ck_assert_uint_eq(t.limit[0], 0);
	/* measured under its share: the estimate scales back up, the share holds */
	s.vcpu_rate[0] = 8000;
	s.redirty_per_s = 8000;
	ck_assert(!mig_throttle_update(&t, &s));
	ck_assert_uint_eq(t.share[0], 20);
	/* a hopeless dirtier is still let run a little */
	s.vcpu_rate[0] = 8000 * 1000;
	mig_throttle_update(&t, &s);
	ck_assert_uint_eq(t.share[0], 5);
}
END_TEST

START_TEST(correction)
{
	struct mig_throttle t;
	struct mig_throttle_sample s = sample(24000, 100000, 300000, 0, 0);
	int i;

	mig_throttle_init(&t, true, 1, 0);
	mig_throttle_update(&t, &s);
	ck_assert_uint_eq(t.limit[0], 8000);
	/* held at its limit, yet the guest re-dirties twice the target: half the budget */
	s.vcpu_rate[0] = 8000;
	s.redirty_per_s = 16000;
	ck_assert(mig_throttle_update(&t, &s));
	ck_assert_uint_eq(t.limit[0], 4000);
	/* never below half at once */
	s.redirty_per_s = 100000;
	s.vcpu_rate[0] = 4000;
	mig_throttle_update(&t, &s);
	ck_assert_uint_eq(t.limit[0], 2000);
	/* well under the target: relaxed step by step, never past the share */
	for (i = 0; i < 20; i++) {
		s.vcpu_rate[0] = (double)t.limit[0];
		s.redirty_per_s = 1000;
		mig_throttle_update(&t, &s);
	}
	ck_assert_uint_eq(t.limit[0], 8000);
}
END_TEST

START_TEST(release_and_press)
{
	struct mig_throttle t;
	struct mig_throttle_sample s = sample(24000, 50000, 300000, 200000, 0);

	mig_throttle_init(&t, true, 2, 0);
	mig_throttle_update(&t, &s);
	ck_assert_uint_eq(t.limit[0], 4000);
	ck_assert_uint_eq(t.limit[1], 4000);
	/* vCPU 0 presses its limit (still wants 300000); vCPU 1 stopped dirtying */
	s.vcpu_rate[0] = 3900;
	s.vcpu_rate[1] = 0;
	s.redirty_per_s = 6000;
	ck_assert(mig_throttle_update(&t, &s));
	ck_assert_uint_eq(t.limit[0], 8000);
	ck_assert_uint_eq(t.limit[1], 0);
	ck_assert(t.free_rate[0] >= 300000);
	/* vCPU 0 now dirties well under its limit: its own rate is its estimate, and it is let go */
	s.vcpu_rate[0] = 100;
	s.redirty_per_s = 100;
	mig_throttle_update(&t, &s);
	ck_assert_uint_eq(t.limit[0], 0);
}
END_TEST

START_TEST(held_presses)
{
	struct mig_throttle t;
	struct mig_throttle_sample s = sample(24000, 50000, 300000, 0, 0);

	mig_throttle_init(&t, true, 1, 0);
	mig_throttle_update(&t, &s);
	ck_assert_uint_eq(t.limit[0], 8000);
	/*
	 * Charged a ring at a time, a held vCPU can show far less than its
	 * limit in one sample: held, it still presses and keeps its estimate
	 * (and its limit); the same rate without being held lets it go.
	 */
	s.vcpu_rate[0] = 2000;
	s.vcpu_held[0] = true;
	s.redirty_per_s = 2000;
	mig_throttle_update(&t, &s);
	ck_assert(t.free_rate[0] >= 300000);
	ck_assert_uint_ne(t.limit[0], 0);
	s.vcpu_held[0] = false;
	mig_throttle_update(&t, &s);
	ck_assert(t.free_rate[0] == 2000);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("throttle");
	TCase *tc = tcase_create("throttle");

	tcase_add_test(tc, engages_only_past_the_target);
	tcase_add_test(tc, held_presses);
	tcase_add_test(tc, water_filling);
	tcase_add_test(tc, run_shares);
	tcase_add_test(tc, correction);
	tcase_add_test(tc, release_and_press);
	suite_add_tcase(s, tc);
	return run_suite(s);
}
