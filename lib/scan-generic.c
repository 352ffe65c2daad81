// SPDX-License-Identifier: MIT
/* Scanner kernels for any x86-64 (and any other 64-bit CPU). */
#define SCAN_OPS kd_scan_generic
#include "scan-impl.h"
