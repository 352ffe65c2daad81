// SPDX-License-Identifier: MIT
/*
 * The test build's hooks (lib/hooks.h): the library compiled with
 * KD_TEST_HOOKS reads them; tests set them.  Nothing here ships.
 */
#include "hooks.h"

struct kd_test_hooks kd_test_hooks;
