#!/bin/sh
# SPDX-License-Identifier: MIT
# Run a libFuzzer harness for a fixed number of runs from a fixed seed,
# starting from its corpus directories (recorded seeds, regression
# inputs).  New inputs, and any crashing input, go to a scratch
# directory, never into the source tree.
# usage: run-fuzz.sh FUZZER SCRATCH RUNS MAX_LEN CORPUS-DIR...
#        (FUZZ_RUNS in the environment overrides RUNS)
set -eu
exe=$1 scratch=$2 runs=${FUZZ_RUNS:-$3} max_len=$4
shift 4
rm -rf "$scratch"
mkdir -p "$scratch"
# a finding exits 1: libFuzzer's own 77 is what meson counts as a skip
exec "$exe" -runs="$runs" -seed=1010 -max_len="$max_len" -timeout=30 -print_final_stats=1 \
	-error_exitcode=1 -timeout_exitcode=1 \
	-artifact_prefix="$scratch/" \
	"$scratch" "$@"
