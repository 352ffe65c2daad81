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
# went compressed, the CPU seconds per GiB of guest data at each end (the
# threads that sent or received the stream, as the engine counts them:
# cpu_s of the stats' end line and of the destination's line), the
# dirtier's speed, each connection's figures (on or off at the end,
# ratio, MiB/s compressed, MiB/s its connection took), then the ratios
# against off's run of the same fill: total time and wire bytes.
#
# Loopback: the demo (1 GiB guest, all of it filled, its vCPUs idle: one
# pass, the transfer alone), off then each of COMPRESS, each fill, REPS
# times alternating; throughput is the guest's data pages (guest_mib) over
# total_ms, the median of the runs, and its ratio against off's.
#
# usage: bench/migrate-compress.sh [BUILD_DIR [RATE]]   (build, 800mbit); as root
# env:   COMPRESS ("auto", or "auto zstd"), FILLS ("text random"),
#        SKIP_RIG=1 / SKIP_LOOPBACK=1, SEND_ARGS (added to send, e.g. --connections 2),
#        REPS (loopback's runs of each, 5)
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
rate=${2:-800mbit}
migrate=$build/examples/kvmdirty-migrate/kvmdirty-migrate
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
read -ra compress <<<"${COMPRESS:-auto}"
read -ra fills <<<"${FILLS:-text random}"

# A run's stats end line and the destination's line into one line of figures.
report() { # where fill how stats dst_out [base_total base_wire [base_mibps]]
	python3 - "$@" <<'PY'
import json, re, sys
where, fill, how, stats, dst_out = sys.argv[1:6]
base = sys.argv[6:]
end = [json.loads(l) for l in open(stats)][-1]
assert end["type"] == "end", end
data_mib = (end["pages_sent"] - end["zero_pages"]) * 4096 / 2**20
gib = data_mib / 1024
m = re.search(r"destination: \d+ pages received, (\d+) of them compressed; cpu_s=([0-9.]+)", open(dst_out).read())
dst_cpu = float(m.group(2)) if m else float("nan")
lanes = ",".join(f"{'on' if z['on'] else 'off'}:r{z['ratio']:.2f}:z{z['z_mibps']:.0f}:w{z['w_mibps']:.0f}"
                 for z in end.get("zlanes", []))
line = (f"compress where={where} fill={fill} compress={how} total_ms={end['total_ms']:.0f}"
        f" wire_mib={end['bytes_sent'] / 2**20:.1f} guest_mib={data_mib:.1f} zpages={end.get('zpages', 0)}"
        f" passes={end['passes']} converged={'yes' if end['converged'] else 'no'}"
        f" src_cpu_s_per_gib={end.get('cpu_s', 0) / gib:.2f} dst_cpu_s_per_gib={dst_cpu / gib:.2f}"
        f" dirtier_speed={end['vcpu'][0]['speed']:.3f}")
if lanes:
    line += f" lanes={lanes}"
if where == "loopback":
    line += f" mib_per_s={data_mib / end['total_ms'] * 1e3:.1f}"
if base:
    line += f" total_vs_off={end['total_ms'] / float(base[0]):.3f} wire_vs_off={end['bytes_sent'] / float(base[1]):.3f}"
    if where == "loopback":
        line += f" throughput_vs_off={(data_mib / end['total_ms'] * 1e3) / float(base[2]):.3f}"
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
				--dst "$migrate listen tcp:\$DST_ADDR:4444 $guest --run-ms 300 -T 60000 --once >$tmp/dst.out 2>&1; true" \
				--src "for i in \$(seq 300); do ip netns exec \$RIG_DST_NS ss -Hltn 'sport = :4444' | grep -q . && break; sleep 0.1; done;
				       $migrate send tcp:\$DST_ADDR:4444 $guest -M clear-log --vcpu 0=dirty:512 --vcpu 1=compute \
				         --fill-data $fill --compress $how -T 60000 --baseline 1000 --stats $stats ${SEND_ARGS:-} >$tmp/out 2>&1" \
				>"$tmp/rig.out" 2>&1
			status=$?
			if [ "$status" != 0 ] || [ ! -s "$stats" ]; then
				cat "$tmp/rig.out" "$tmp/out" >&2
				echo "migrate-compress: rig, $fill, --compress $how: exited with $status" >&2
				exit 1
			fi
			# shellcheck disable=SC2086
			report rig "$fill" "$how" "$stats" "$tmp/dst.out" $base
			[ "$how" = off ] && base=$(python3 -c "import json,sys; e=[json.loads(l) for l in open(sys.argv[1])][-1]; print(e['total_ms'], e['bytes_sent'])" "$stats")
		done
	done
fi

if [ -z "${SKIP_LOOPBACK:-}" ]; then
	# loopback's times scatter (this host: 320 to 800 ms for the same run): REPS runs of each, alternating, the medians
	reps=${REPS:-5}
	for fill in "${fills[@]}"; do
		for ((r = 0; r < reps; r++)); do
			for how in off "${compress[@]}"; do
				stats=$tmp/lo-$fill-$how-$r.json
				# shellcheck disable=SC2086
				"$migrate" demo -m 1024 -v 2 --fill all --vcpu 0=idle --vcpu 1=idle --fill-data "$fill" \
					--compress "$how" --stats "$stats" ${SEND_ARGS:-} >"$tmp/lo-$fill-$how-$r.out" 2>&1 || {
					cat "$tmp/lo-$fill-$how-$r.out" >&2
					echo "migrate-compress: loopback, $fill, --compress $how: failed" >&2
					exit 1
				}
			done
		done
		python3 - "$tmp" "$fill" "$reps" off "${compress[@]}" <<'PY'
import json, re, statistics, sys
tmp, fill, reps, hows = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
def run(how, r):
    end = [json.loads(l) for l in open(f"{tmp}/lo-{fill}-{how}-{r}.json")][-1]
    m = re.search(r"cpu_s=([0-9.]+)\n", open(f"{tmp}/lo-{fill}-{how}-{r}.out").read())
    mib = (end["pages_sent"] - end["zero_pages"]) * 4096 / 2**20
    return end["total_ms"], mib, end["bytes_sent"], end.get("cpu_s", 0), float(m.group(1)) if m else float("nan")
base = None
for how in hows:
    rs = [run(how, r) for r in range(reps)]
    total = statistics.median(x[0] for x in rs)
    mibps = statistics.median(x[1] / x[0] * 1e3 for x in rs)
    gib = rs[0][1] / 1024
    line = (f"compress where=loopback fill={fill} compress={how} runs={reps} median_total_ms={total:.0f}"
            f" totals_ms={'/'.join(f'{x[0]:.0f}' for x in rs)} guest_mib={rs[0][1]:.1f}"
            f" wire_mib={statistics.median(x[2] for x in rs) / 2**20:.1f} median_mib_per_s={mibps:.1f}"
            f" src_cpu_s_per_gib={statistics.median(x[3] for x in rs) / gib:.2f}"
            f" dst_cpu_s_per_gib={statistics.median(x[4] for x in rs) / gib:.2f}")
    if base:
        line += f" throughput_vs_off={mibps / base:.3f}"
    else:
        base = mibps
    print(line)
PY
	done
fi
