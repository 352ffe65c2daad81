#!/bin/sh
# SPDX-License-Identifier: MIT
# The tools refuse bad input with a one-line message naming it; a demo
# whose migration is abandoned ends, exit 1.  Where this host has no usable
# KVM, every command that builds a guest says so instead, in one line
# naming /dev/kvm, and exits 77; mistakes in the command line are still
# named first.
# usage: check-cli.sh KVMDIRTY-MIGRATE KVMDIRTY-VMM KVMDIRTY-LINUX
set -u
migrate=$1 vmm=$2 linux=$3
status=0

# expect STATUS NEEDLE COMMAND...: COMMAND exits STATUS and says NEEDLE on one stderr line
expect() {
	want=$1 needle=$2
	shift 2
	err=$("$@" 2>&1 >/dev/null)
	got=$?
	lines=$(printf '%s\n' "$err" | grep -c .)
	if [ "$got" != "$want" ] || ! printf '%s' "$err" | grep -qF -- "$needle" || [ "$lines" -gt 1 ]; then
		echo "FAIL: $* -> exit $got (want $want), stderr: $err"
		status=1
	else
		echo "ok: $* -> $err"
	fi
}

# probe: 0 and what KVM offers, or 77 and why there is none
kvm=$("$migrate" probe 2>&1)
kvm_status=$?
case "$kvm_status:$kvm" in
0:"probe: /dev/kvm: "*" modes: dirty-log"* | 77:"kvmdirty-migrate: /dev/kvm: "*) echo "ok: probe -> $kvm_status: $kvm" ;;
*)
	echo "FAIL: probe -> exit $kvm_status: $kvm"
	status=1
	;;
esac
[ "$(printf '%s\n' "$kvm" | grep -c .)" = 1 ] || { echo "FAIL: probe printed more than one line: $kvm"; status=1; }

# needs_kvm STATUS NEEDLE COMMAND...: expect, where KVM is usable; else exit 77 and the line naming /dev/kvm
needs_kvm() {
	if [ "$kvm_status" = 77 ]; then
		shift 2
		expect 77 ": /dev/kvm: " "$@"
	else
		expect "$@"
	fi
}
if [ "$kvm_status" = 77 ]; then
	expect 77 "kvmdirty-vmm: /dev/kvm: " "$vmm" -v 1 -m 8 -p 1
	expect 77 "kvmdirty-linux: /dev/kvm: " "$linux" --kernel /nonexistent
	expect 77 "kvmdirty-migrate: /dev/kvm: " "$migrate" listen unix:/tmp/x -m 4 -v 1
	expect 77 "kvmdirty-migrate: /dev/kvm: " "$migrate" demo -m 64 -v 1
	expect 77 "kvmdirty-migrate: /dev/kvm: " "$migrate" rate -m 64 -v 1 --count 1
	expect 77 "kvmdirty-migrate: /dev/kvm: " "$migrate" rate -m 64 -v 1 --count 1 --during-migration
fi

expect 2 "unknown command 'fly'" "$migrate" fly
expect 2 "--interval '5'" "$migrate" rate --interval 5
expect 2 "--count 'x'" "$migrate" rate --count x
expect 2 "unexpected argument 'now'" "$migrate" rate now
expect 2 "are rate's options" "$migrate" send unix:/tmp/x --json
expect 2 "are rate's options" "$migrate" listen unix:/tmp/x --during-migration
expect 2 "--vcpu 3: the guest has 2 vCPUs" "$migrate" rate --vcpu 3=idle
expect 2 "with --during-migration only" "$migrate" rate --stats /tmp/x.json
expect 2 "with --during-migration only" "$migrate" rate --connections 2
expect 2 "probe takes no arguments" "$migrate" probe now
expect 2 "needs an address" "$migrate" send
expect 2 "-m 'lots'" "$migrate" send unix:/tmp/x -m lots
expect 2 "-m '3'" "$migrate" listen unix:/tmp/x -m 3
expect 2 "-M 'turbo'" "$migrate" send unix:/tmp/x -M turbo
expect 2 "-v '0'" "$migrate" send unix:/tmp/x -v 0
expect 2 "invalid option -- 'Z'" "$migrate" send unix:/tmp/x -Z
expect 2 "--vcpu '0=spin'" "$migrate" send unix:/tmp/x --vcpu 0=spin
expect 2 "--vcpu '1'" "$migrate" send unix:/tmp/x --vcpu 1
expect 2 "--vcpu dirty MIB 'lots'" "$migrate" send unix:/tmp/x --vcpu 0=dirty:lots
expect 2 "--vcpu dirty PAGES_PER_SEC 'fast'" "$migrate" send unix:/tmp/x --vcpu 0=dirty:8:fast
expect 2 "--vcpu 'x'" "$migrate" send unix:/tmp/x --vcpu x=compute
expect 2 "--vcpu 3: the guest has 2 vCPUs" "$migrate" send unix:/tmp/x -v 2 --vcpu 3=compute
expect 2 "--fill 'most'" "$migrate" send unix:/tmp/x --fill most
expect 2 "--fill '0'" "$migrate" send unix:/tmp/x --fill 0
expect 2 "--regions '0'" "$migrate" send unix:/tmp/x --regions 0
expect 2 "--regions '65535'" "$migrate" listen unix:/tmp/x --regions 65535
expect 2 "--regions 'many'" "$migrate" rate --regions many
expect 2 "--baseline 'soon'" "$migrate" send unix:/tmp/x --baseline soon
expect 2 "-m ' 64'" "$migrate" send unix:/tmp/x -m " 64"
expect 2 "-m '+64'" "$migrate" send unix:/tmp/x -m +64
expect 2 "-m '0x'" "$migrate" send unix:/tmp/x -m 0x
expect 2 "-m 'K'" "$migrate" send unix:/tmp/x -m K
# a leading 0 is decimal (08 would not be octal), 0x is hex
needs_kvm 1 "connecting to 'unix:/nonexistent/sock'" "$migrate" send unix:/nonexistent/sock -m 08 -v 1 -d 010
needs_kvm 1 "connecting to 'unix:/nonexistent/sock'" "$migrate" send unix:/nonexistent/sock -m 0x10 -v 1
expect 1 "--regions 2000: at most 65534, and no more than memory's 1024 pages" "$migrate" send unix:/nonexistent/sock -m 4 --regions 2000
expect 1 "working sets of 96 MiB exceed memory 64 MiB" "$migrate" send unix:/nonexistent/sock -m 64 -v 2 --vcpu 0=dirty:64 -w 32
# the demo's own 64 MiB working set, where -w is not given, must fit too
expect 1 "working sets of 64 MiB exceed memory 32 MiB" "$migrate" demo -m 32 -v 1
expect 2 "unexpected argument 'extra'" "$migrate" listen unix:/tmp/x extra
expect 1 "address 'nowhere'" "$migrate" listen nowhere
expect 1 "address 'tcp:localhost'" "$migrate" send tcp:localhost -m 4 -v 1
needs_kvm 1 "connecting to 'unix:/nonexistent/sock'" "$migrate" send unix:/nonexistent/sock -m 4 -v 1
expect 2 "plot needs a stats file (plot STATS.json [-o OUT.svg])" "$migrate" plot
expect 2 "unexpected argument 'b.json'" "$migrate" plot a.json b.json
expect 2 "invalid option -- 'Z'" "$migrate" plot a.json -Z
expect 1 "plot: '/nonexistent/run.json': No such file or directory" "$migrate" plot /nonexistent/run.json
expect 1 "plot: '/': Is a directory" "$migrate" plot / -o /dev/null
expect 1 "plot: '/dev/null': empty: no stats lines" "$migrate" plot /dev/null -o /dev/null
# demo: a migration that cannot converge (-d 0: no rest fits) is abandoned; the demo ends, exit 1,
# its destination not left waiting for another stream; its first line names the mode in use
# (without KVM the demo's refusal is checked above)
if [ "$kvm_status" != 77 ]; then
	out=$(timeout 100 "$migrate" demo -m 64 -v 1 -M dirty-ring -d 0 -p 1 2>&1)
	got=$?
	if [ "$got" != 1 ] || ! printf '%s' "$out" | grep -qF "pre-copy did not converge" ||
		! printf '%s' "$out" | grep -qF "tracked with dirty-ring"; then
		echo "FAIL: demo -M dirty-ring -d 0 -p 1 -> exit $got (want 1), output: $out"
		status=1
	else
		echo "ok: demo -M dirty-ring -d 0 -p 1 -> exit 1, abandoned"
	fi
fi
# key files: genkey makes them (mode 0600, 64 hex digits and a newline) and never over anything;
# --psk refuses any other file (too open, another form, not a regular file, a link, missing), the
# key itself never printed
keydir=$(mktemp -d)
trap 'rm -rf "$keydir"' EXIT
secret_head=4d7e1bd25a1b7f0c
secret=${secret_head}8a3e64c0f53a5de1a2d31b2e19c7f5d8d3fd6f58c9a1b0e2
out=$("$migrate" genkey "$keydir/good" 2>&1)
got=$?
if [ "$got" != 0 ] || [ "$(stat -c %a "$keydir/good")" != 600 ] || [ "$(wc -c <"$keydir/good")" != 65 ] ||
	! grep -qxE '[0-9a-f]{64}' "$keydir/good"; then
	echo "FAIL: genkey -> exit $got: $out; $(ls -l "$keydir/good")"
	status=1
else
	echo "ok: genkey -> $out"
fi
expect 1 "genkey '$keydir/good': something of that name exists" "$migrate" genkey "$keydir/good"
ln -s "$keydir/new" "$keydir/link"
expect 1 "genkey '$keydir/link': something of that name exists" "$migrate" genkey "$keydir/link"
[ ! -e "$keydir/new" ] || { echo "FAIL: genkey wrote through a symbolic link"; status=1; }
expect 1 "genkey '$keydir/none/key': No such file or directory" "$migrate" genkey "$keydir/none/key"
expect 2 "genkey needs a file to create (genkey FILE)" "$migrate" genkey
expect 2 "unexpected argument 'b'" "$migrate" genkey "$keydir/a" b
expect 2 "genkey takes no option: '-f'" "$migrate" genkey -f
[ ! -e "$keydir/a" ] || { echo "FAIL: genkey with a wrong command line made a file"; status=1; }
printf '%s\n' "$secret" >"$keydir/open" && chmod 644 "$keydir/open"
printf '%s\n' "${secret%?}" >"$keydir/short" && chmod 600 "$keydir/short"
head -c 32 /dev/urandom | base64 >"$keydir/base64" && chmod 600 "$keydir/base64"
expect 2 "--psk '$keydir/open': group or others may read or write it (mode 0644)" "$migrate" listen unix:/tmp/x --psk "$keydir/open"
expect 2 "--psk '$keydir/short': not a key file (64 bytes); a key file holds 64 hex digits" "$migrate" send unix:/tmp/x --psk "$keydir/short"
expect 2 "make one with kvmdirty-migrate genkey FILE" "$migrate" send unix:/tmp/x --psk "$keydir/base64"
expect 2 "--psk '$keydir': not a regular file (a directory)" "$migrate" send unix:/tmp/x --psk "$keydir"
expect 2 "--psk '$keydir/link': a symbolic link" "$migrate" send unix:/tmp/x --psk "$keydir/link"
mkfifo -m 600 "$keydir/fifo"
expect 2 "--psk '$keydir/fifo': not a regular file (a FIFO)" timeout 10 "$migrate" send unix:/tmp/x --psk "$keydir/fifo"
# its size says 0 (and, the daemon not dumpable, it is root's: refused as another user's where the daemon is not root)
expect 2 "--psk '/proc/self/environ': " "$migrate" send unix:/tmp/x --psk /proc/self/environ
expect 2 "--psk '$keydir/none': No such file or directory" "$migrate" listen unix:/tmp/x --psk "$keydir/none"
for f in open short; do
	if "$migrate" send unix:/tmp/x --psk "$keydir/$f" 2>&1 | grep -q "$secret_head"; then
		echo "FAIL: a refused key file's contents were printed"
		status=1
	fi
done
expect 2 "--encrypt: needs a key (--psk FILE)" "$migrate" send unix:/tmp/x --encrypt
expect 2 "--connections '17'" "$migrate" send unix:/tmp/x --connections 17
expect 2 "--connections '0'" "$migrate" send unix:/tmp/x --connections 0
needs_kvm 1 "connecting to 'unix:/nonexistent/sock'" "$migrate" send unix:/nonexistent/sock -m 4 -v 1 --psk "$keydir/good" --encrypt --connections 2
expect 2 "-P 'zigzag'" "$vmm" -P zigzag
expect 2 "-v '1025'" "$vmm" -v 1025
expect 2 "-v '1025'" "$migrate" send unix:/tmp/x -v 1025
expect 2 "invalid option -- 'q'" "$vmm" -q
# snapshot and restore
expect 2 "snapshot needs -o PREFIX" "$migrate" snapshot -m 8
expect 2 "-o and --every are snapshot's options" "$migrate" send unix:/tmp/x -o y
expect 2 "--every 'soon'" "$migrate" snapshot -o /tmp/s --every soon
expect 2 "--count '0'" "$migrate" snapshot -o /tmp/s --count 0
expect 2 "are a migration's" "$migrate" snapshot -o /tmp/s --stats /tmp/x.json
expect 1 "-o '/nonexistent/s': /nonexistent/: No such file or directory" "$migrate" snapshot -o /nonexistent/s
expect 2 "usage: kvmdirty-migrate restore FILE..." "$migrate" restore
expect 1 "restore refused: /nonexistent.snap: No such file or directory" "$migrate" restore /nonexistent.snap
expect 1 "restore refused: /dev/null: not a regular file" "$migrate" restore /dev/null
# demo: -w, -r and --run-ms as given (its own defaults only where they are not)
if [ "$kvm_status" = 0 ]; then
	out=$("$migrate" demo -m 64 -v 1 -w 8 -r 512 --run-ms 200 2>&1)
	if printf '%s\n' "$out" | grep -qF "dirtying 8 MiB at 512 pages/s each" &&
		printf '%s\n' "$out" | grep -qF "guest ran 200 ms after resume"; then
		echo "ok: demo -w 8 -r 512 --run-ms 200 as given"
	else
		echo "FAIL: demo -w 8 -r 512 --run-ms 200: $out"
		status=1
	fi
fi

# kvmdirty-linux: its command line, then the files it loads (after the VM is made: KVM first)
expect 2 "--mem '3': expected a number in [64, 3072]" "$linux" --kernel k --mem 3
expect 2 "--vcpus '0'" "$linux" --kernel k --vcpus 0
expect 2 "--vcpus '65'" "$linux" --kernel k --vcpus 65
expect 2 "--track 'x': expected log or ring" "$linux" --kernel k --track x
expect 2 "--incoming, --snapshot and --restore: one at most" "$linux" --kernel k --migrate-to unix:/tmp/x --incoming unix:/tmp/y
expect 2 "--restore: no snapshot file given" "$linux" --restore
expect 2 "unexpected argument 'extra'" "$linux" --kernel k extra
expect 2 "--kernel: required to boot a guest" "$linux"
expect 2 "the guest arrives with --incoming, not booted" "$linux" --incoming unix:/tmp/x --kernel k
expect 2 "the guest arrives with --restore, not booted" "$linux" --append x --restore f
expect 2 "--encrypt: needs --psk FILE" "$linux" --kernel k --encrypt
expect 2 "kvmdirty-linux: --psk '$keydir/none': No such file or directory" "$linux" --kernel k --migrate-to unix:/tmp/x --psk "$keydir/none"
expect 2 "--psk, --connections: only with --migrate-to or --incoming" "$linux" --kernel k --connections 2
expect 2 "--migrate-to: address 'nowhere'" "$linux" --kernel k --migrate-to nowhere
expect 2 "--append: longer than the 4095 bytes" "$linux" --kernel k --append "$(head -c 5000 /dev/zero | tr '\0' a)"
expect 2 "unrecognized option '--bogus'" "$linux" --bogus
head -c 8192 /dev/zero >"$keydir/zero.img"
needs_kvm 1 "--kernel '/nonexistent': No such file or directory" "$linux" --kernel /nonexistent
needs_kvm 1 "--kernel '$keydir/zero.img': not a bzImage" "$linux" --kernel "$keydir/zero.img"
needs_kvm 1 "--kernel '$keydir': not a regular file" "$linux" --kernel "$keydir"
needs_kvm 1 "--restore refused, the guest does not run: /nonexistent.snap: No such file or directory" "$linux" --restore /nonexistent.snap
exit $status
