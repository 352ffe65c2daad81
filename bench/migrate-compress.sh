#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Compression (--compress) against none, in the same run, on the two-host
# rig (tests/two-hosts.sh: two namespaces, a veth pair, tc tbf at RATE on
# the source's egress) and on loopback (the demo over a Unix socket, where
# the CPU is the bottleneck).
#
# Rig: a 2 GiB guest whose vCPU 0 dirties 512 MiB flat out (vCPU 1
# computes), clear-log, kvmdirty-migrate's defaults (the throttle on), its
# memory filled with --fill-data text (about 3:1 with zstd -1) or random
# bytes (which do not shrink); each fill with --compress off, then each of
# COMPRESS (auto by default).  One line per run: total_ms, wire_mib (bytes
# on the wire), guest_mib (the data pages they carried), the pages that
# went compressed, and the CPU seconds per GiB of guest data at each end
# (user + system of each process, as the shell's times says; the
# source's includes its guest's vCPU threads), then the ratios against
# off's run of the same fill: total time and wire bytes.
#
# Loopback: the demo (1 GiB guest, all of it filled, one vCPU dirtying 64
# MiB flat out), off then each of COMPRESS, each fill; throughput is the
# guest's data pages (guest_mib) over total_ms; the ratio against off's.
#
# usage: bench/migrate-compress.sh [BUILD_DIR [RATE]]   (build, 800mbit); as root
# env:   COMPRESS ("auto", or "auto zstd"), FILLS ("text random"),
#        SKIP_RIG=1 / SKIP_LOOPBACK=1
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
rate=${2:-800mbit}
migrate=$build/examples/kvmdirty-migrate/kvmdirty-migrate
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
read -ra compress <<<"${COMPRESS:-auto}"
read -ra fills <<<"${FILLS:-text random}"

# A run's stats end line and the two ends' CPU seconds into one line of figures.
report() { # where fill how stats src_times dst_times [base_total base_wire]
	python3 - "$@" <<'PY'
import json, sys
where, fill, how, stats, src_t, dst_t = sys.argv[1:7]
base = sys.argv[7:]
end = [json.loads(l) for l in open(stats)][-1]
assert end["type"] == "end", end
data_mib = (end["pages_sent"] - end["zero_pages"]) * 4096 / 2**20
def cpu(path):
    # bash's times: the shell's line, then its children's "XmY.YYYs XmY.YYYs"
    user, sys_ = open(path).read().split("\n")[1].split()
    f = lambda s: float(s[:s.index("m")]) * 60 + float(s[s.index("m") + 1:-1])
    return f(user) + f(sys_)
gib = data_mib / 1024
line = (f"compress where={where} fill={fill} compress={how} total_ms={end['total_ms']:.0f}"
        f" wire_mib={end['bytes_sent'] / 2**20:.1f} guest_mib={data_mib:.1f} zpages={end.get('zpages', 0)}"
        f" zcpu_s={end.get('zcpu_s', 0):.2f} passes={end['passes']} converged={'yes' if end['converged'] else 'no'}"
        f" src_cpu_s_per_gib={cpu(src_t) / gib:.2f} dst_cpu_s_per_gib={cpu(dst_t) / gib:.2f}")
if where == "loopback":
    line += f" mib_per_s={data_mib / end['total_ms'] * 1e3:.1f}"
if base:
    bt, bw = float(base[0]), float(base[1])
    line += f" total_vs_off={end['total_ms'] / bt:.3f} wire_vs_off={end['bytes_sent'] / bw:.3f}"
    if where == "loopback":
        line += f" throughput_vs_off={(data_mib / end['total_ms']) / float(base[2]):.3f}"
print(line)
PY
}

if [ -z "${SKIP_RIG:-}" ]; then
	guest="-m 2048 -v 2"
	for fill in "${fills[@]}"; do
		base=
		for how in off "${compress[@]}"; do
			stats=$tmp/rig-$fill-$how.json
			"$top/tests/two-hosts.sh" --rate "$rate" \
				--dst "$migrate listen tcp:\$DST_ADDR:4444 $guest --run-ms 300 -T 60000 --once >$tmp/dst.out 2>&1; times >$tmp/dst-times; true" \
				--src "for i in \$(seq 300); do ip netns exec \$RIG_DST_NS ss -Hltn 'sport = :4444' | grep -q . && break; sleep 0.1; done;
				       { $migrate send tcp:\$DST_ADDR:4444 $guest -M clear-log --vcpu 0=dirty:512 --vcpu 1=compute \
				         --fill-data $fill --compress $how -T 60000 --baseline 1000 --stats $stats; times; } >$tmp/out 2>&1" \
				>"$tmp/rig.out" 2>&1
			status=$?
			if [ "$status" != 0 ] || [ ! -s "$stats" ]; then
				cat "$tmp/rig.out" "$tmp/out" >&2
				echo "migrate-compress: rig, $fill, --compress $how: exited with $status" >&2
				exit 1
			fi
			tail -2 "$tmp/out" >"$tmp/src-times"
			# shellcheck disable=SC2086
			report rig "$fill" "$how" "$stats" "$tmp/src-times" "$tmp/dst-times" $base
			[ "$how" = off ] && base=$(python3 -c "import json,sys; e=[json.loads(l) for l in open(sys.argv[1])][-1]; print(e['total_ms'], e['bytes_sent'])" "$stats")
		done
	done
fi

if [ -z "${SKIP_LOOPBACK:-}" ]; then
	for fill in "${fills[@]}"; do
		base=
		for how in off "${compress[@]}"; do
			stats=$tmp/lo-$fill-$how.json
			{ "$migrate" demo -m 1024 -v 2 --fill all --vcpu 0=dirty:64 --vcpu 1=compute --fill-data "$fill" \
				--compress "$how" --stats "$stats"; times; } >"$tmp/out" 2>&1 || {
				cat "$tmp/out" >&2
				echo "migrate-compress: loopback, $fill, --compress $how: failed" >&2
				exit 1
			}
			# the demo runs both ends in its own processes: the children's times are both ends together
			tail -2 "$tmp/out" >"$tmp/src-times"
			printf 'x\n0m0.000s 0m0.000s\n' >"$tmp/dst-times"
			# shellcheck disable=SC2086
			report loopback "$fill" "$how" "$stats" "$tmp/src-times" "$tmp/dst-times" $base
			[ "$how" = off ] && base=$(python3 -c "import json,sys; e=[json.loads(l) for l in open(sys.argv[1])][-1]; d=(e['pages_sent']-e['zero_pages'])*4096/2**20; print(e['total_ms'], e['bytes_sent'], d / e['total_ms'])" "$stats")
		done
	done
fi
