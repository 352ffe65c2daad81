# SPDX-License-Identifier: MIT
# Sourced by the tests that migrate over the two-host rig (suite net):
#   . rig-test.sh NAME KVMDIRTY-MIGRATE
# sets here, rig, migrate, tmp (removed on exit); fail MSG prints
# "NAME: MSG" and exits 1; exits 77 with the daemon's reason where this
# host has no usable KVM, with the rig's where namespaces cannot be made;
# rig_done fails if this run left a namespace behind (others' runs may be
# going on: only namespaces new since the start count).
set -uo pipefail
rig_test_name=$1
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
rig=$here/two-hosts.sh
migrate=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
fail() { echo "$rig_test_name: $*"; exit 1; }

# no usable KVM here: the daemon's own line, and skip (77), before any namespace is made
out=$("$migrate" probe 2>&1) || {
	status=$?
	[ "$status" = 77 ] && { echo "$rig_test_name: skipped: ${out#kvmdirty-migrate: }"; exit 77; }
	fail "kvmdirty-migrate probe exited $status: $out"
}
out=$("$rig" --check) || { status=$?; echo "$out"; exit "$status"; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
rig_netns() { ip netns list | sed -n 's/^\(kd[0-9]*-[a-z]*\).*/\1/p' | sort; }
rig_before=$(rig_netns)
rig_done() {
	[ -z "$(comm -13 <(echo "$rig_before") <(rig_netns))" ] || fail "namespaces left: $(ip netns list)"
}
# for a --src command: wait until the destination listens on 4444, without connecting
# (a connection would be a stream to a listener that takes only one)
wait_dst="for i in \$(seq 100); do ip netns exec \$RIG_DST_NS ss -Hltn 'sport = :4444' | grep -q . && break; sleep 0.1; done"
# rig_migrated LABEL: $out shows a migration whose every page was checked at both ends and whose guest ran on.
# It reads $out through a here-string, never `echo "$out" | grep -q`: echo writes a line at a time, and
# under pipefail a grep that exits at its match before echo's last write makes echo die of SIGPIPE and
# the check fail with its line in plain sight (seen once in the ASan build; with a long output, always).
rig_migrated() {
	grep -q "every page arrived and matched its hash" <<<"$out" || fail "$1: the destination did not check every page's hash"
	grep -q "; verified$" <<<"$out" || fail "$1: the source did not verify its final memory against what it sent"
	grep -q "self-check ok" <<<"$out" || fail "$1: the guest did not run on at the destination"
}
# the check itself, on an output whose lines come first and go on for 300 KB (fails every time through a pipe)
(
	out="destination: stream complete, every page arrived and matched its hash; resuming the guest
source: migrated; verified
destination: guest ran 300 ms after resume, self-check ok
$(head -c 300000 /dev/zero | tr '\0' x)"
	rig_migrated "rig-test's own check"
) || fail "rig_migrated misread a long output"
