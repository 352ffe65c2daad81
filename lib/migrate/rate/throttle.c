// SPDX-License-Identifier: MIT
/* The source's throttle policy (see throttle.h): samples in, per-vCPU limits or run shares out. */
#include <string.h>

#include "throttle.h"

#define MIN_SHARE 5 /* permille: a throttled vCPU still runs a little each period */

void mig_throttle_init(struct mig_throttle *t, bool ring, unsigned int nr_vcpus, double alpha)
{
	unsigned int i;

	memset(t, 0, sizeof(*t));
	t->ring = ring;
	t->nr_vcpus = nr_vcpus < MIG_THROTTLE_MAX_VCPUS ? nr_vcpus : MIG_THROTTLE_MAX_VCPUS;
	t->alpha = alpha > 0 && alpha < 1 ? alpha : 1.0 / 3;
	t->correction = 1;
	for (i = 0; i < MIG_THROTTLE_MAX_VCPUS; i++)
		t->share[i] = 1000;
}

/*
 * What each vCPU would dirty unthrottled, from what it dirtied under the
 * throttle: scaled up by its run share; under a limit it presses (held
 * by it, or within 80% of it), at least what it was seen at before.
 */
static void estimate(struct mig_throttle *t, const struct mig_throttle_sample *s)
{
	unsigned int i;

	for (i = 0; i < t->nr_vcpus; i++) {
		double m = s->vcpu_rate[i] > 0 ? s->vcpu_rate[i] : 0;

		if (!t->ring)
			t->free_rate[i] = m * 1000.0 / t->share[i];
		else if (t->limit[i] && (s->vcpu_held[i] || m >= 0.8 * (double)t->limit[i]))
			t->free_rate[i] = m > t->free_rate[i] ? m : t->free_rate[i];
		else
			t->free_rate[i] = m;
	}
}

/*
 * Split budget over the dirtying vCPUs, smallest first: a vCPU that needs
 * no more than an equal part of what is left keeps its own rate, the
 * others get equal parts.  Returns true if anything changed.
 */
static bool water_fill(struct mig_throttle *t, double budget, double idle)
{
	unsigned int order[MIG_THROTTLE_MAX_VCPUS], n = 0, i, j;
	bool changed = false;

	for (i = 0; i < t->nr_vcpus; i++) {
		uint64_t limit = 0;
		unsigned int share = 1000;

		if (t->free_rate[i] > idle) {
			/* insertion sort by free rate */
			for (j = n; j > 0 && t->free_rate[order[j - 1]] > t->free_rate[i]; j--)
				order[j] = order[j - 1];
			order[j] = i;
			n++;
			continue;
		}
		changed |= t->limit[i] != limit || t->share[i] != share;
		t->limit[i] = limit;
		t->share[i] = share;
	}
	for (j = 0; j < n; j++) {
		double fair = budget / (n - j), f;
		uint64_t limit = 0;
		unsigned int share = 1000;

		i = order[j];
		f = t->free_rate[i];
		if (f <= fair) {
			budget -= f;
		} else {
			budget -= fair;
			if (t->ring) {
				limit = fair >= 1 ? (uint64_t)fair : 1;
			} else {
				share = (unsigned int)(fair / f * 1000.0);
				share = share < MIN_SHARE ? MIN_SHARE : share > 1000 ? 1000 : share;
			}
		}
		changed |= t->limit[i] != limit || t->share[i] != share;
		t->limit[i] = limit;
		t->share[i] = share;
	}
	return changed;
}

bool mig_throttle_update(struct mig_throttle *t, const struct mig_throttle_sample *s)
{
	double link = s->link_pages_per_s, r = s->redirty_per_s;

	if (!(link > 0))
		return false;
	t->target = t->alpha * link;
	estimate(t, s);
	if (!t->engaged) {
		if (!(r > t->target))
			return false;
		t->engaged = true;
	} else if (r > 1.1 * t->target) {
		/* the vCPUs' own measures understate what the guest re-dirties */
		t->correction *= t->target / r > 0.5 ? t->target / r : 0.5;
		if (t->correction < 0.01)
			t->correction = 0.01;
	} else if (r < 0.5 * t->target) {
		t->correction = t->correction * 1.25 < 1 ? t->correction * 1.25 : 1;
	}
	return water_fill(t, t->correction * t->target, MIG_THROTTLE_IDLE * link);
}
