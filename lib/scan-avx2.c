// SPDX-License-Identifier: MIT
/* Scanner kernels for CPUs with AVX2, POPCNT and BMI1; built with -mavx2 -mpopcnt -mbmi. */
#define SCAN_OPS kd_scan_avx2
#define SCAN_AVX2 1
#include "scan-impl.h"
