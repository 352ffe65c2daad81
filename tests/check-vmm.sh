#!/bin/sh
# SPDX-License-Identifier: MIT
#
# kvmdirty-vmm, the example VMM on libkvmdirty-migrate's public header
# (kvm suite):
#   - a state guest (LAPIC timer, PAT, kvmclock, AVX, device state)
#     migrated from one process to another over a Unix socket, finishing
#     its passes at the destination with every page's tag right and its
#     state checks held, the device state moved once;
#   - snapshots every 200 ms while it runs, then the first two restored
#     into a new process, which finishes the passes the same way;
#   - a restore into a guest of other regions refused by name (exit 1),
#     and bad command lines (exit 2).
# Exit 77 (one line why) where the host has no KVM.
set -u
V=${1:?usage: check-vmm.sh KVMDIRTY_VMM}
fail() { echo "check-vmm: FAIL: $*"; exit 1; }

out=$("$V" -v 1 -m 1 -p 1 2>&1); rc=$?
[ $rc -eq 77 ] && { echo "check-vmm: skipped: $out"; exit 77; }
[ $rc -eq 0 ] || fail "a plain run: $out"

D=$(mktemp -d /tmp/kvmdirty-check-vmm.XXXXXX)
trap 'kill $pid 2>/dev/null; rm -rf "$D"' EXIT
pid=

# a migration between two processes
"$V" -v 2 -m 16 --incoming "unix:$D/sock" >"$D/dst" 2>&1 &
pid=$!
i=0
while [ ! -S "$D/sock" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
[ -S "$D/sock" ] || fail "the destination does not listen: $(cat "$D/dst")"
"$V" -v 2 -m 16 -p 30 -r 20000 --state --migrate-to "unix:$D/sock" --after 300 >"$D/src" 2>&1 ||
	fail "source: $(cat "$D/src")"
wait $pid || fail "destination: $(cat "$D/dst")"
pid=
grep -q '^migrated to unix:' "$D/src" || fail "source: $(cat "$D/src")"
grep -q '^vCPU ' "$D/src" && fail "the source ran the guest on after it moved: $(cat "$D/src")"
grep -q 'device state: 1 move(s)' "$D/dst" || fail "device state at the destination: $(cat "$D/dst")"
[ "$(grep -c '^vCPU [01]: 30 passes.*host check of 4096 pages: ok (0 bad); state: .* checks held' "$D/dst")" -eq 2 ] ||
	fail "the guest at the destination: $(cat "$D/dst")"

# snapshots while it runs, then a restore of the first two
"$V" -v 2 -m 16 -p 12 -r 20000 --state --snapshot "$D/s" --every 200 >"$D/snap" 2>&1 ||
	fail "snapshots: $(cat "$D/snap")"
[ -f "$D/s-000001.snap" ] || fail "fewer than two snapshots: $(cat "$D/snap")"
"$V" -v 2 -m 16 --restore "$D/s-000000.snap" "$D/s-000001.snap" >"$D/rest" 2>&1 ||
	fail "restore: $(cat "$D/rest")"
grep -q 'device state: 1 move(s)' "$D/rest" || fail "device state after the restore: $(cat "$D/rest")"
[ "$(grep -c '^vCPU [01]: 12 passes.*host check of 4096 pages: ok (0 bad); state: .* checks held' "$D/rest")" -eq 2 ] ||
	fail "the restored guest: $(cat "$D/rest")"

# refusals
"$V" -v 2 -m 8 --restore "$D/s-000000.snap" >"$D/bad" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "refused, the guest does not run: $D/s-000000.snap: region 1" "$D/bad" ||
	fail "a restore into other regions: exit $rc: $(cat "$D/bad")"
for args in "--restore" "--incoming" "--state -0" "--incoming a --migrate-to b" "-v 0"; do
	# shellcheck disable=SC2086
	"$V" $args >"$D/bad" 2>&1
	rc=$?
	[ $rc -eq 2 ] && [ "$(wc -l <"$D/bad")" -eq 1 ] || fail "'$args': exit $rc: $(cat "$D/bad")"
done
echo "check-vmm: migrated (device state moved, state checks held), snapshots restored, refusals by name"
