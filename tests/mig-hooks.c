// SPDX-License-Identifier: MIT
/*
 * The engine's test-build hook (lib/migrate/base/hooks.h): the layers
 * compiled with MIG_TEST_HOOKS call it; tests set it.  Nothing here ships.
 */
#include "hooks.h"

void (*mig_test_hook)(enum mig_hook_point p, void *obj);
