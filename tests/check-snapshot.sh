#!/bin/sh
# SPDX-License-Identifier: MIT
#
# kvmdirty-migrate snapshot and restore end to end (kvm suite):
#   - a chain of three, restored, the guest's self-check passing;
#   - restore refusing by name: a gap, a repeat, a diff first, a file cut
#     short, a byte flipped in a page, a prefix already used;
#   - a damaged copy in the full snapshot of a page a later diff replaces:
#     restored right without --check (the newest copy is read), refused by
#     name with --check (every copy is);
#   - a full disk mid-series (a 48 MiB tmpfs in a mount namespace of its
#     own, filled between two snapshots; root only): the snapshot that
#     meets it fails and leaves nothing, the guest runs on, the next one
#     is complete once there is room, and the whole chain restores.
# Exit 77 (one line why) where the host has no KVM.
set -u
M=${1:?usage: check-snapshot.sh KVMDIRTY_MIGRATE}
fail() { echo "check-snapshot: FAIL: $*"; exit 1; }

out=$("$M" probe 2>&1); rc=$?
[ $rc -eq 77 ] && { echo "check-snapshot: skipped: $out"; exit 77; }
[ $rc -eq 0 ] || fail "probe: $out"

D=$(mktemp -d /tmp/kvmdirty-check-snapshot.XXXXXX)
trap 'umount "$D/small" 2>/dev/null; rm -rf "$D"' EXIT

"$M" snapshot -o "$D/s" -m 64 -w 16 -r 2000 --every 300 --count 3 --run-ms 300 >"$D/out" 2>&1 ||
	fail "snapshot: $(cat "$D/out")"
[ "$(grep -c '^snapshot kind=' "$D/out")" -eq 3 ] || fail "three lines expected: $(cat "$D/out")"
grep -q 'self-check ok' "$D/out" || fail "the guest after its snapshots: $(cat "$D/out")"
for f in s-000000.snap s-000001.snap s-000002.snap; do [ -f "$D/$f" ] || fail "$f missing"; done
ls "$D" | grep -q tmp && fail "a temporary file left: $(ls "$D")"

"$M" restore "$D/s-000000.snap" "$D/s-000001.snap" "$D/s-000002.snap" --run-ms 300 >"$D/out" 2>&1 ||
	fail "restore: $(cat "$D/out")"
grep -q 'self-check ok' "$D/out" || fail "restore: $(cat "$D/out")"

# refused by name, exit 1, the guest never built
refused() { # WANT FILE...
	want=$1; shift
	"$M" restore "$@" >"$D/out" 2>&1; rc=$?
	[ $rc -eq 1 ] || fail "restore $*: exit $rc, expected 1: $(cat "$D/out")"
	grep -q "restore refused.*$want" "$D/out" || fail "restore $*: expected '$want': $(cat "$D/out")"
}
refused 's-000002.snap: number 2 of its chain.*a gap' "$D/s-000000.snap" "$D/s-000002.snap"
refused 'out of order or repeated' "$D/s-000000.snap" "$D/s-000001.snap" "$D/s-000001.snap"
refused 'a chain starts with its full snapshot' "$D/s-000001.snap"
head -c 100000 "$D/s-000002.snap" >"$D/cut.snap"
refused 'cut.snap: no trailer' "$D/s-000000.snap" "$D/s-000001.snap" "$D/cut.snap"
# a byte of the newest diff's first data page: its offset from the file's own index
cp "$D/s-000002.snap" "$D/flip.snap"
off=$(python3 - "$D/flip.snap" <<'EOF'
import struct, sys
b = open(sys.argv[1], 'rb').read()
nreg, = struct.unpack_from('<I', b, 24)
index_off, index_len, nruns = struct.unpack_from('<QQQ', b, 80)
for i in range(nruns):
    reg, kind, first, count, hf = struct.unpack_from('<IIQQQ', b, index_off + 32 * i)
    if kind == 1:
        data_off, = struct.unpack_from('<Q', b, 256 + 32 * reg + 16)
        print(data_off + first * 4096 + 123)
        break
EOF
)
[ -n "$off" ] || fail "no data page in s-000002.snap"
python3 -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(int(sys.argv[2])); b = f.read(1); f.seek(int(sys.argv[2])); f.write(bytes([b[0] ^ 0x20]))' "$D/flip.snap" "$off"
refused 'flip.snap: region .* page .*damaged' "$D/s-000000.snap" "$D/s-000001.snap" "$D/flip.snap"
# a byte of a page of the full snapshot that the newest diff replaces: the
# restore reads the newest copy and restores right; --check reads every
# copy and refuses the full one by name
cp "$D/s-000000.snap" "$D/old.snap"
off=$(python3 - "$D/old.snap" "$D/s-000002.snap" <<'EOF'
import struct, sys
def data_pages(path):
    b = open(path, 'rb').read()
    index_off, index_len, nruns = struct.unpack_from('<QQQ', b, 80)
    for i in range(nruns):
        reg, kind, first, count, hf = struct.unpack_from('<IIQQQ', b, index_off + 32 * i)
        if kind == 1:
            data_off, = struct.unpack_from('<Q', b, 256 + 32 * reg + 16)
            for pg in range(first, first + count):
                yield reg, pg, data_off + pg * 4096
newer = {(r, p) for r, p, _ in data_pages(sys.argv[2])}
for r, p, at in data_pages(sys.argv[1]):
    if (r, p) in newer:
        print(at + 77)
        break
EOF
)
[ -n "$off" ] || fail "no page of s-000000.snap that s-000002.snap replaces"
python3 -c 'import sys; f = open(sys.argv[1], "r+b"); f.seek(int(sys.argv[2])); b = f.read(1); f.seek(int(sys.argv[2])); f.write(bytes([b[0] ^ 0x20]))' "$D/old.snap" "$off"
"$M" restore "$D/old.snap" "$D/s-000001.snap" "$D/s-000002.snap" --run-ms 300 >"$D/out" 2>&1 ||
	fail "restore without --check, an older copy damaged: $(cat "$D/out")"
grep -q 'self-check ok' "$D/out" || fail "restore without --check: $(cat "$D/out")"
refused 'old.snap: region .* page .*damaged (not its hash)' --check "$D/old.snap" "$D/s-000001.snap" "$D/s-000002.snap"
"$M" restore --check "$D/s-000000.snap" "$D/s-000001.snap" "$D/s-000002.snap" --run-ms 300 >"$D/out" 2>&1 ||
	fail "restore --check of the whole chain: $(cat "$D/out")"
grep -q 'restore: --check: [0-9]* pages of the 3 files, every copy, each matched its hash' "$D/out" ||
	fail "restore --check: $(cat "$D/out")"
"$M" snapshot -o "$D/s" -m 64 >"$D/out" 2>&1 && fail "a used prefix taken"
grep -q 's-000000.snap exists' "$D/out" || fail "a used prefix: $(cat "$D/out")"

# a full disk between two snapshots: root and a mount namespace of our own
if [ "$(id -u)" -ne 0 ] || ! unshare -m true 2>/dev/null; then
	echo "check-snapshot: ok (the full-disk case needs root and mount namespaces: not run)"
	exit 0
fi
unshare -m sh -s "$M" "$D" <<'EOF' || exit 1
M=$1; D=$2
fail() { echo "check-snapshot: FAIL: $*"; exit 1; }
mkdir -p "$D/small" && mount -t tmpfs -o size=48m tmpfs "$D/small" || fail "mounting a tmpfs"
S=$D/small/s
"$M" snapshot -o "$S" -m 64 -w 16 -r 2000 --every 2500 --count 3 --run-ms 300 >"$D/fd.out" 2>"$D/fd.err" &
pid=$!
i=0; while [ ! -f "$S-000000.snap" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
[ -f "$S-000000.snap" ] || fail "the full snapshot never came: $(cat "$D/fd.err")"
# the rest of the tmpfs taken: the next diff meets a full disk
dd if=/dev/zero of="$D/small/filler" bs=64k status=none 2>/dev/null
i=0; while ! grep -q 'failed' "$D/fd.err" && [ $i -lt 600 ]; do sleep 0.1; i=$((i + 1)); done
grep -q "s-000001.snap failed.*No space left on device" "$D/fd.err" || fail "no failure on a full disk: $(cat "$D/fd.err")"
ls "$D/small" | grep -q 'tmp\|s-000001' && fail "the failed snapshot left: $(ls "$D/small")"
rm -f "$D/small/filler"
wait $pid; rc=$?
[ $rc -eq 1 ] || fail "snapshot: exit $rc after one failure, expected 1"
grep -q 'self-check ok' "$D/fd.out" || fail "the guest after a full disk: $(cat "$D/fd.out" "$D/fd.err")"
[ "$(grep -c '^snapshot kind=' "$D/fd.out")" -eq 2 ] || fail "two snapshots expected: $(cat "$D/fd.out")"
"$M" restore "$S-000000.snap" "$S-000001.snap" --run-ms 300 >"$D/out" 2>&1 || fail "restore after a full disk: $(cat "$D/out")"
grep -q 'self-check ok' "$D/out" || fail "restore after a full disk: $(cat "$D/out")"
EOF
echo "check-snapshot: ok"
