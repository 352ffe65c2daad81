#!/bin/sh
# SPDX-License-Identifier: MIT
# Fuzz the destination's decoder for a fixed number of runs from a fixed
# seed, starting from the recorded seeds and the regression inputs.  New
# inputs, and any crashing input, go to a scratch directory, never into
# the source tree.
# usage: run-fuzz.sh FUZZ-DEST DIR(tests/fuzz) SCRATCH
set -eu
exe=$1 dir=$2 scratch=$3
runs=${FUZZ_RUNS:-300000}
rm -rf "$scratch"
mkdir -p "$scratch"
exec "$exe" -runs="$runs" -seed=1010 -max_len=131072 -timeout=30 -print_final_stats=1 \
	-artifact_prefix="$scratch/" \
	"$scratch" "$dir/seeds" "$dir/regress"
