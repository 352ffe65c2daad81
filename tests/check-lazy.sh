#!/bin/sh
# SPDX-License-Identifier: MIT
#
# kvmdirty-migrate restore --lazy end to end (kvm suite):
#   - a chain of three restored lazily: the guest's self-check passes, the
#     figures come on one line, the resident line is said, and the
#     working-set file is written beside the newest file;
#   - the next restore of the chain prefetches that file's pages;
#     --no-workset neither reads nor writes one;
#   - a byte flipped in a page of the newest diff: exit 1, one line naming
#     the file and the page, the guest stopped;
#   - userfaultfd refused (a seccomp filter, tests/no-uffd.c): one line
#     says so and the eager restore follows, the guest passing;
#   - --no-workset without --lazy: exit 2, one line.
# Exit 77 (one line why) where the host has no KVM.
set -u
M=${1:?usage: check-lazy.sh KVMDIRTY_MIGRATE NO_UFFD}
NOUFFD=${2:?usage: check-lazy.sh KVMDIRTY_MIGRATE NO_UFFD}
fail() { echo "check-lazy: FAIL: $*"; exit 1; }

out=$("$M" probe 2>&1); rc=$?
[ $rc -eq 77 ] && { echo "check-lazy: skipped: $out"; exit 77; }
[ $rc -eq 0 ] || fail "probe: $out"

D=$(mktemp -d /tmp/kvmdirty-check-lazy.XXXXXX)
trap 'rm -rf "$D"' EXIT
"$M" snapshot -o "$D/s" -m 64 -w 16 -r 2000 --every 300 --count 3 --run-ms 300 >"$D/out" 2>&1 ||
	fail "snapshot: $(cat "$D/out")"
set -- "$D/s-000000.snap" "$D/s-000001.snap" "$D/s-000002.snap"

figures='^restore --lazy: first_instruction_ms=[0-9.]* resident_ms=[0-9.]* faults=[0-9]* fault_p50_us=[0-9.]* fault_p99_us=[0-9.]* '
"$M" restore --lazy "$@" --run-ms 300 >"$D/out" 2>&1 || fail "restore --lazy: $(cat "$D/out")"
grep -q 'self-check ok' "$D/out" || fail "restore --lazy: $(cat "$D/out")"
grep -q "$figures" "$D/out" || fail "restore --lazy: no figures line: $(cat "$D/out")"
grep -q '^restore: resident after [0-9.]* ms' "$D/out" || fail "restore --lazy: never resident: $(cat "$D/out")"
grep -q 'workset_pages=0 ' "$D/out" || fail "restore --lazy: a working set from nowhere: $(cat "$D/out")"
[ -f "$D/s-000002.snap.ws" ] || fail "no working-set file beside s-000002.snap: $(ls "$D")"
ls "$D" | grep -q 'ws.tmp' && fail "a temporary file left: $(ls "$D")"

"$M" restore --lazy "$@" --run-ms 300 >"$D/out" 2>&1 || fail "restore --lazy, again: $(cat "$D/out")"
grep -q 'self-check ok' "$D/out" || fail "restore --lazy, again: $(cat "$D/out")"
grep -q 'workset_pages=[1-9]' "$D/out" || fail "restore --lazy, again: the working set unused: $(cat "$D/out")"

rm "$D/s-000002.snap.ws"
"$M" restore --lazy --no-workset "$@" --run-ms 300 >"$D/out" 2>&1 || fail "restore --lazy --no-workset: $(cat "$D/out")"
grep -q 'workset_pages=0 ' "$D/out" || fail "--no-workset: $(cat "$D/out")"
[ -f "$D/s-000002.snap.ws" ] && fail "--no-workset wrote a working-set file"

# a byte of the newest diff's first data page (its offset from the file's own index)
cp "$D/s-000002.snap" "$D/flip.snap"
off=$(python3 - "$D/flip.snap" <<'PY'
import struct, sys
b = open(sys.argv[1], 'rb').read()
index_off, index_len, nruns = struct.unpack_from('<QQQ', b, 80)
for i in range(nruns):
    reg, kind, first, count, hf = struct.unpack_from('<IIQQQ', b, index_off + 32 * i)
    if kind == 1:
        data_off, = struct.unpack_from('<Q', b, 256 + 32 * reg + 16)
        print(data_off + first * 4096 + 123, reg, first)
        break
PY
)
[ -n "$off" ] || fail "no data page in s-000002.snap"
set -- $off "$@"
python3 -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(int(sys.argv[2])); b = f.read(1); f.seek(int(sys.argv[2])); f.write(bytes([b[0] ^ 0x20]))' "$D/flip.snap" "$1"
reg=$2 page=$3
shift 3
"$M" restore --lazy "$D/s-000000.snap" "$D/s-000001.snap" "$D/flip.snap" --run-ms 300 >"$D/out" 2>"$D/err"; rc=$?
[ $rc -eq 1 ] || fail "a flipped page: exit $rc, expected 1: $(cat "$D/out" "$D/err")"
[ "$(wc -l <"$D/err")" -eq 1 ] || fail "a flipped page: one line expected on stderr: $(cat "$D/err")"
grep -q "restore --lazy failed, the guest stopped: .*flip.snap: region $reg page $page (gpa 0x[0-9a-f]*): not its hash" "$D/err" ||
	fail "a flipped page: $(cat "$D/err")"
grep -q 'self-check ok' "$D/out" && fail "a flipped page: the guest ran on: $(cat "$D/out")"

"$NOUFFD" "$M" restore --lazy "$@" --run-ms 300 >"$D/out" 2>"$D/err" || fail "without userfaultfd: $(cat "$D/out" "$D/err")"
[ "$(wc -l <"$D/err")" -eq 1 ] || fail "without userfaultfd: one line expected on stderr: $(cat "$D/err")"
grep -q '^kvmdirty-migrate: restore --lazy: userfaultfd: Operation not permitted .*; restoring eagerly$' "$D/err" ||
	fail "without userfaultfd: $(cat "$D/err")"
grep -q 'pages read, each matched its hash' "$D/out" && grep -q 'self-check ok' "$D/out" ||
	fail "without userfaultfd, eagerly: $(cat "$D/out")"

"$M" restore --no-workset "$@" >"$D/out" 2>&1; rc=$?
[ $rc -eq 2 ] && [ "$(wc -l <"$D/out")" -eq 1 ] || fail "--no-workset without --lazy: exit $rc: $(cat "$D/out")"
echo "check-lazy: lazy restores, the working set, a flipped page, no userfaultfd: as they should be"
