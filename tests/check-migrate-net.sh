#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A live migration between two hosts: kvmdirty-migrate listen in one
# namespace of the two-host rig, send in the other, over an 800mbit tbf
# link, in each tracking mode.  Hash-exact: every page's latest copy is
# checked against its hash at the destination before the guest runs, and
# the source checks its final memory against what it sent (exit 3 if a
# page differs); the destination then runs the guest and checks it.  The
# stats must be version 1 JSON lines ending in a verified migration with
# both vCPUs' progress.  The dirty-ring run goes in a session: a key both
# ends hold, records sealed and encrypted, two connections.  Whether
# pre-copy converges depends on the host's load, so a pre-copy at its pass
# limit switches over all the same (--force-switchover): the reason may be
# any of the three.  Skips (77)
# only where namespaces cannot be made.
# usage: check-migrate-net.sh KVMDIRTY-MIGRATE
. "$(dirname "$0")/rig-test.sh" check-migrate-net "$1"

guest="-m 256 -v 2"
"$migrate" genkey "$tmp/key" >/dev/null || fail "genkey: see above"
for mode in clear-log dirty-ring; do
	stats=$tmp/$mode.json
	session_dst= session_src= conns=1
	if [ "$mode" = dirty-ring ]; then
		session_dst="--psk $tmp/key --encrypt" session_src="--psk $tmp/key --encrypt --connections 2" conns=2
	fi
	# the source waits until the listener listens (ss in its namespace)
	out=$("$rig" --rate 800mbit \
		--dst "$migrate listen tcp:\$DST_ADDR:4444 $guest --run-ms 300 -T 30000 $session_dst" \
		--src "$wait_dst;
		       $migrate send tcp:\$DST_ADDR:4444 $guest -M $mode --vcpu 0=dirty:16 --vcpu 1=compute -d 20 -p 8 \
		       --force-switchover --baseline 200 --stats $stats $session_src" 2>&1)
	status=$?
	echo "$out"
	[ "$status" = 0 ] || fail "$mode: the migration over the rig exited with $status"
	rig_migrated "$mode"
	python3 - "$stats" "$mode" "$conns" <<'PY' || fail "$mode: stats: see above"
import json, sys
path, mode, conns = sys.argv[1], sys.argv[2], int(sys.argv[3])
lines = [json.loads(l) for l in open(path)]
assert lines, "no stats"
assert all(l.get("v") == 1 and "type" in l and "t_ms" in l for l in lines), "a line without v 1, type, t_ms"
assert lines[0]["type"] == "start" and lines[0]["mode"] == mode, lines[0]
assert lines[0]["connections"] == conns and lines[0]["psk"] == (conns > 1) and lines[0]["encrypt"] == (conns > 1), lines[0]
end = lines[-1]
assert end["type"] == "end" and end["ok"] and end["verified"] and end["lost_pages"] == 0, end
assert end["reason"] in ("fits_downtime", "pass_limit", "time_limit"), end["reason"]
assert [v["id"] for v in end["vcpu"]] == [0, 1], end
passes = [l for l in lines if l["type"] == "pass"]
assert len(passes) == end["passes"], (len(passes), end["passes"])
for l in passes + [l for l in lines if l["type"] == "sample"]:
    assert [v["id"] for v in l["vcpu"]] == [0, 1], l
    assert l["link_bytes_per_s"] >= 0 and l["dirty_bytes"] >= 0, l
print(f"stats {mode}: {conns} connection(s), psk {lines[0]['psk']}, {len(lines)} lines, {len(passes)} passes, reason {end['reason']}, "
      f"vCPU speeds {[v['speed'] for v in end['vcpu']]}")
PY
done
rig_done
echo "check-migrate-net: migrations over the rig in both modes (one sealed, encrypted, over two connections), hash-exact, stats: ok"
