/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_TEST_TRACK_MODES_H
#define KVMDIRTY_TEST_TRACK_MODES_H

/* The three tracking modes a test loops over, their names, and the hooks off (test build only). */
#include "hooks.h"
#include "kvmdirty.h"

#define MODES 3
static const enum kvmdirty_mode modes[MODES] = { KVMDIRTY_MODE_CLEAR_LOG, KVMDIRTY_MODE_DIRTY_LOG,
						 KVMDIRTY_MODE_DIRTY_RING };

static inline const char *mode_name(enum kvmdirty_mode m)
{
	return m == KVMDIRTY_MODE_CLEAR_LOG ? "clear-log" : m == KVMDIRTY_MODE_DIRTY_LOG ? "dirty-log" : "dirty-ring";
}

/* Every test starts and ends with the hooks off, even when run without fork. */
static inline void hooks_off(void)
{
	kd_test_hooks_set(NULL, NULL, false);
}

#endif
