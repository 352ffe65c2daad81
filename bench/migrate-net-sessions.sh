#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Sessions between two hosts (bench/migrate-net.sh on the rig, 800mbit by
# default, workload 1gib-paced: 1 GiB of data, vCPU 0 dirtying 64 MiB at
# 10 MiB/s, clear-log): plain, --psk, --psk --encrypt, and --connections 2
# against 1, in rounds, each configuration once a round in turn.  Prints
# each run's line, then the median total time of each configuration and
# its ratio to plain, and the goal line (authentication and encryption
# within 2% of plain on this link).
#
# usage: bench/migrate-net-sessions.sh [BUILD_DIR [RATE [ROUNDS]]]   (as root)
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$top/build}
rate=${2:-800mbit}
rounds=${3:-3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
key=$tmp/key
"$build/examples/kvmdirty-migrate/kvmdirty-migrate" genkey "$key" >/dev/null || exit 1

names=(plain psk psk+encrypt plain-2conn)
args=("" "--psk $key" "--psk $key --encrypt" "--connections 2")
largs=("" "--psk $key" "--psk $key --encrypt" "")
for ((r = 0; r < rounds; r++)); do
	for i in "${!names[@]}"; do
		line=$(WORKLOADS=1gib-paced SEND_ARGS="${args[$i]}" LISTEN_ARGS="${largs[$i]}" \
			"$top/bench/migrate-net.sh" "$build" "$rate" clear-log) || exit 1
		echo "session=${names[$i]} $line"
		ms=${line#*total_ms=}
		echo "${ms%% *}" >>"$tmp/${names[$i]}"
	done
done
median() { sort -n "$1" | awk '{v[NR] = $1} END {print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
base=$(median "$tmp/plain")
for n in "${names[@]}"; do
	m=$(median "$tmp/$n")
	echo "migrate net=$rate workload=1gib-paced session=$n runs=$rounds total_ms=$m vs_plain=$(awk -v a="$m" -v b="$base" 'BEGIN {printf "%.3f", a / b}')"
done
for n in psk psk+encrypt; do
	awk -v a="$(median "$tmp/$n")" -v b="$base" -v n="$n" -v r="$rate" \
		'BEGIN {printf "goal: %s within 2%% of plain at %s: %.3f: %s\n", n, r, a / b, a / b <= 1.02 ? "met" : "MISSED"}'
done
