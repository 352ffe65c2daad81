#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Live migration between two hosts (tests/two-hosts.sh: two namespaces, a
# veth pair, tc tbf at RATE on the source's egress): a 2 GiB guest whose
# vCPU 0 dirties 512 MiB (flat out, or at 100 MiB/s) while vCPU 1 computes
# without writing memory, in each tracking mode, with kvmdirty-migrate's
# defaults (50 ms downtime limit, 10 passes, 60 s, verification, the
# throttle on).  One line per run, from the --stats file; dirtier_speed and
# other_vcpu_speed are each vCPU's speed from the start of tracking to the
# pause (or to giving up), as a fraction of its speed in the 1 s before
# tracking;
# total_ms counts from the start of tracking, downtime_ms from the pause to
# the destination's answer (it has resumed the guest by then).  A migration
# that does not converge is abandoned (the guest runs on at the source):
# converged=no, downtime_ms=none, and total_ms is the time until it gave up.
#
# With --max-bandwidth N in SEND_ARGS, the stream's payload as the
# destination's sockets received it (ss bytes_received, sampled every 100
# ms in its namespace) is judged against the cap over each whole second
# after the first, to the last byte: cap_mibps, measured_mibps (the mean
# over those seconds), ratio, and the lowest and highest second's ratio.
#
# Each run is made twice, side by side (METHODS="precopy postcopy", the
# default): pre-copy as above, and with --postcopy at both ends (the
# throttle off; the switch by the rule, after the first pass at the
# latest: --postcopy-after 1).  A post-copy line adds the floor (the bytes
# of pass 1, every data page once, at RATE), total over floor, the pause
# at the switch, the destination's fault waits (p50/p99), the writing
# vCPU's speed while post-copy ran (its pages written per second at the
# destination over its speed in the 1 s before tracking) and its work lost
# to the migration, (1 - speed) x time over pre-copy and post-copy, plus
# the pause.
#
# usage: bench/migrate-net.sh [BUILD_DIR [RATE [MODES...]]]
#        (build, 800mbit, clear-log dirty-ring); as root
# env:   WORKLOADS="flat-out 100MiB/s" (the default; also 1gib-paced: 1 GiB
#        of data, vCPU 0 dirtying 64 MiB at 10 MiB/s, which converges),
#        SEND_ARGS (added to send, e.g. --no-throttle or -d 300),
#        LISTEN_ARGS (added to listen, e.g. --psk FILE),
#        METHODS ("precopy postcopy", or either alone)
set -uo pipefail
top=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-$top/build}" && pwd)
rate=${2:-800mbit}
shift $(($# > 2 ? 2 : $#))
modes=("$@")
((${#modes[@]})) || modes=(clear-log dirty-ring)
migrate=$build/examples/kvmdirty-migrate/kvmdirty-migrate
tmp=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] && cp -r "$tmp" "$KEEP"; rm -rf "$tmp"' EXIT

guest="-m 2048 -v 2"
read -ra workloads <<<"${WORKLOADS:-flat-out 100MiB/s}"
read -ra methods <<<"${METHODS:-precopy postcopy}"
for workload in "${workloads[@]}"; do
for mode in "${modes[@]}"; do
for method in "${methods[@]}"; do
	pc_args=
	[ "$method" = postcopy ] && pc_args="--postcopy --postcopy-after 1"
	fill=
	case $workload in
	flat-out) dirty=512 ;;
	100MiB/s) dirty=512:25600 ;;
	1gib-paced) dirty=64:2560 fill="--fill 1024" ;;
	*) echo "migrate-net: workload '$workload': expected flat-out, 100MiB/s or 1gib-paced" >&2; exit 2 ;;
	esac
	stats=$tmp/$mode.json
	rx=$tmp/$mode.rx
	# the payload received so far, every 100 ms, on the destination's side
	sampler="while :; do echo \$(date +%s.%N) \$(ss -Hti state established '( sport = :4444 )' |
		grep -o 'bytes_received:[0-9]*' | awk -F: '{ s += \$2 } END { print s + 0 }'); sleep 0.1; done"
	"$top/tests/two-hosts.sh" --rate "$rate" \
		--dst "{ $sampler; } >$rx & $migrate listen tcp:\$DST_ADDR:4444 $guest --run-ms 300 -T 60000 --once $pc_args ${LISTEN_ARGS:-}; kill %1; true" \
		--src "for i in \$(seq 300); do ip netns exec \$RIG_DST_NS ss -Hltn 'sport = :4444' | grep -q . && break; sleep 0.1; done;
		       $migrate send tcp:\$DST_ADDR:4444 $guest -M $mode --vcpu 0=dirty:$dirty --vcpu 1=compute $fill \
		       -T 60000 --baseline 1000 --stats $stats $pc_args ${SEND_ARGS:-}" >"$tmp/out" 2>&1
	status=$?
	# a migration that does not converge is abandoned (exit 1): its stats still say how far it got
	if { [ "$status" != 0 ] && ! grep -q "pre-copy did not converge" "$tmp/out"; } || [ ! -s "$stats" ]; then
		cat "$tmp/out" >&2
		echo "migrate-net: $mode: the migration over the rig exited with $status" >&2
		exit 1
	fi
	cap=$(sed -n 's/.*--max-bandwidth[ =]\([0-9]*\).*/\1/p' <<<"${SEND_ARGS:-}")
	python3 - "$stats" "$rate" "$mode" "$workload" "$rx" "${cap:-0}" "$method" "$tmp/out" "$tmp/floor-$mode-${workload//\//}" <<'PY'
import json, os, re, sys
path, rate, mode, workload, rx, cap, method, out, floor_file = sys.argv[1:]
cap = int(cap)
lines = [json.loads(l) for l in open(path)]
start, end = lines[0], lines[-1]
assert start["v"] == 1 and end["type"] == "end"
v = {x["id"]: x for x in end["vcpu"]}
# an abandoned migration never paused the guest: no downtime
down = f"{end['downtime_ms']:.0f}" if end["converged"] else "none"
print(f"migrate net={rate} workload={workload} mode={mode} guest_gib={start['guest_pages'] * start['page_size'] / 2**30:.0f}"
      f" total_ms={end['total_ms']:.0f} downtime_ms={down} handoff_ms={end['handoff_ms']:.1f}"
      f" sent_mib={end['bytes_sent'] / 2**20:.0f}"
      f" passes={end['passes']} converged={'yes' if end['converged'] else 'no'} dirtier_speed={v[0]['speed']:.3f}"
      f" other_vcpu_speed={v[1]['speed']:.3f} reason={end['reason']}"
      f" link_mbps={end['link_bytes_per_s'] / 2**20:.0f} throttled={'yes' if end.get('throttled') else 'no'}"
      f" dirtier_held_ms={v[0].get('held_ms', 0):.0f} other_held_ms={v[1].get('held_ms', 0):.0f} method={method}")
m = re.match(r"([0-9.]+)([kmg]?)bit", rate)
link = float(m.group(1)) * {"k": 1e3, "m": 1e6, "g": 1e9, "": 1}[m.group(2)] / 8
pass1 = next((l for l in lines if l.get("type") == "pass" and l.get("pass") == 1), None)
if method == "precopy" and pass1:
    # the bytes the destination needs: pre-copy's first pass, every page of the guest once
    open(floor_file, "w").write(str(pass1["pass_bytes"]))
if method == "postcopy":
    # the floor: the pre-copy run's first pass at RATE (else, without one, this run's first pass and the pages left)
    if os.path.exists(floor_file):
        need = int(open(floor_file).read())
    else:
        need = (pass1["pass_bytes"] if pass1 else 0) + end.get("postcopy_pages", 0) * 4096
    floor_ms = need / link * 1e3
    w = re.search(r"vcpu0_writes_per_s=([0-9.]+)", open(out).read())
    if not end.get("postcopy"):
        print(f"migrate net={rate} workload={workload} mode={mode} method=postcopy switched=no (pre-copy converged)")
    else:
        before = v[0].get("before_per_s", 0)
        speed_pc = float(w.group(1)) / before if w and before > 0 else 0.0
        pre_s = (end["total_ms"] - end["postcopy_ms"] - end["switch_pause_ms"]) / 1e3
        lost = (1 - v[0]["speed"]) * pre_s + (1 - speed_pc) * end["postcopy_ms"] / 1e3 + end["switch_pause_ms"] / 1e3
        print(f"migrate net={rate} workload={workload} mode={mode} method=postcopy floor_ms={floor_ms:.0f}"
              f" total_over_floor={end['total_ms'] / floor_ms:.3f} switch_pause_ms={end['switch_pause_ms']:.1f}"
              f" postcopy_ms={end['postcopy_ms']:.0f} postcopy_pages={end['postcopy_pages']}"
              f" postcopy_faults={end['postcopy_faults']} fault_p50_us={end['fault_p50_us']:.1f}"
              f" fault_p99_us={end['fault_p99_us']:.1f} dirtier_speed_precopy={v[0]['speed']:.3f}"
              f" dirtier_speed_postcopy={speed_pc:.3f} work_lost_s={lost:.2f} why={end['postcopy_why']}")
if cap:
    # (time, payload received): from the first byte to the last, interpolated at each whole second
    s = [(float(t), int(b)) for t, b in (l.split() for l in open(rx) if len(l.split()) == 2)]
    s = [x for x in s if x[1] > 0]
    top = max(b for _, b in s)
    s = s[:next(i for i, x in enumerate(s) if x[1] == top) + 1]
    def at(t):
        for (t0, b0), (t1, b1) in zip(s, s[1:]):
            if t0 <= t <= t1:
                return b0 + (b1 - b0) * (t - t0) / (t1 - t0)
        return s[-1][1]
    start, end = s[0][0], s[-1][0]
    secs = [(at(start + k + 1) - at(start + k)) / 2**20 for k in range(1, int(end - start))]
    if not secs:
        sys.exit("migrate-net: the transfer took less than two seconds: nothing to judge the cap by")
    mean = sum(secs) / len(secs)
    print(f"migrate net={rate} cap_mibps={cap} workload={workload} mode={mode} measured_mibps={mean:.2f}"
          f" ratio={mean / cap:.3f} seconds={len(secs)} lowest_second={min(secs) / cap:.3f}"
          f" highest_second={max(secs) / cap:.3f} (received payload, each whole second after the first)")
PY
done
done
done
