/* SPDX-License-Identifier: MIT */
#ifndef KVMDIRTY_EXPORT_H
#define KVMDIRTY_EXPORT_H

/* Marks the functions the shared library exports (see libkvmdirty.sym). */
#define KD_EXPORT __attribute__((visibility("default")))

#endif
