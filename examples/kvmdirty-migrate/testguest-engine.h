/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_MIGRATE_TESTGUEST_ENGINE_H
#define KVMDIRTY_MIGRATE_TESTGUEST_ENGINE_H

/*
 * The test guest (testguest.h) as the engine's own guest interface sees
 * it (guest.h), for the engine's tests and benchmarks; never linked into
 * kvmdirty-migrate, which sees the engine through kvmdirty-migrate.h only.
 */
#include "guest.h"
#include "testguest.h"

/* The engine's view of tv: its regions, KVM vCPU state, testvm's pause and resume. */
int mig_testvm_guest(struct testvm *tv, struct mig_guest *ret_g);

#endif
