#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# The two-host rig (two-hosts.sh): a shaped link that carries bytes from
# one namespace to the other, the tbf it promises on the source's egress,
# nothing left behind after a run or after an interrupt, and one-line
# refusals of bad command lines.  Skips (77) only where namespaces cannot
# be made.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
rig=$here/two-hosts.sh
netcount=$here/netcount.py
fail() { echo "check-two-hosts: $*"; exit 1; }

out=$("$rig" --check) || { status=$?; echo "$out"; exit "$status"; }

leftovers() { # tag
	ip netns list | grep -c "^$1-" || true
}
# the rig's namespaces (kdPID-src, kdPID-dst) not there before: other runs may be going on
rig_netns() {
	ip netns list | sed -n 's/^\(kd[0-9]*-[a-z]*\).*/\1/p' | sort
}
before=$(rig_netns)
new_netns() {
	comm -13 <(echo "$before") <(rig_netns) | grep -c . || true
}

# bytes across, and the shaping the rig promised, seen from inside the source namespace
out=$("$rig" --rate 400mbit --burst 128kb --limit 2mb \
	--dst "python3 $netcount recv \$DST_ADDR 5000" \
	--src "tc qdisc show dev \$(ip -o link show type veth | sed -n 's/^[0-9]*: \([^@:]*\).*/\1/p'); python3 $netcount send \$DST_ADDR 5000 64" 2>&1)
status=$?
echo "$out"
[ "$status" = 0 ] || fail "a run over the rig exited with $status"
grep -q "received 67108864 bytes" <<<"$out" || fail "the destination did not get 64 MiB"
grep -q "qdisc tbf .* rate 400Mbit burst 131050b" <<<"$out" || fail "no tbf at 400mbit with a 128 KiB burst on the source's veth"
[ "$(new_netns)" = 0 ] || fail "namespaces left after a run: $(ip netns list)"

# the source's status is the rig's; a failing destination fails the run
"$rig" --dst true --src false >/dev/null 2>&1
[ $? = 1 ] || fail "a failing source did not fail the run"
out=$("$rig" --dst false --src true 2>&1)
[ $? = 1 ] || fail "a failing destination did not fail the run"
grep -q "destination command exited with 1" <<<"$out" || fail "a failing destination not reported: $out"

# interrupted (Ctrl-C, or killed) while both sides run: torn down all the same
for sig in INT TERM; do
	# job control on: a background job keeps SIGINT, as a terminal's foreground one has it
	set -m
	"$rig" --dst "sleep 61" --src "sleep 61" >/dev/null 2>&1 &
	pid=$!
	set +m
	for _ in $(seq 100); do
		[ "$(ip netns list | grep -c "^kd$pid-")" = 2 ] && break
		sleep 0.1
	done
	[ "$(ip netns list | grep -c "^kd$pid-")" = 2 ] || fail "the rig did not make its namespaces"
	kill -"$sig" "$pid"
	wait "$pid"
	status=$?
	want=$([ "$sig" = INT ] && echo 130 || echo 143)
	[ "$status" = "$want" ] || fail "rig sent SIG$sig exited with $status, expected $want"
	[ "$(leftovers "kd$pid")" = 0 ] || fail "namespaces left after SIG$sig: $(ip netns list)"
	ip link show "kd$pid-s" >/dev/null 2>&1 && fail "veth left after SIG$sig"
	pgrep -f "sleep 61" >/dev/null && fail "a side's command left running after SIG$sig"
done

# bad command lines: one line naming the input, status 2
for args in "--src true" "--dst true" "--rate" "--delay x --dst true --src true" "--frobnicate"; do
	out=$("$rig" $args 2>&1)
	status=$?
	[ "$status" = 2 ] || fail "two-hosts.sh $args: status $status, expected 2"
	[ "$(echo "$out" | wc -l)" = 1 ] || fail "two-hosts.sh $args: not one line: $out"
done
out=$("$rig" --delay 5 --dst true --src true 2>&1)
status=$?
if tc qdisc add dev lo root netem delay 1ms 2>/dev/null; then
	tc qdisc del dev lo root
	[ "$status" = 0 ] || fail "--delay 5 with netem present: status $status"
else
	[ "$status" = 2 ] && grep -q "no netem" <<<"$out" || fail "--delay without netem: status $status: $out"
fi
[ "$(new_netns)" = 0 ] || fail "namespaces left: $(ip netns list)"
echo "check-two-hosts: shaped link, teardown after runs and interrupts, bad command lines: ok"
