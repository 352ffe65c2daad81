#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A host without KVM, made on any host: run the tests that need KVM, and
# every tool, with /dev/kvm hidden, and require each to say so and skip.
#
#   bash tests/hide-kvm.sh VARIANT BUILD-DIR...
#
# VARIANT is how /dev/kvm fails, as on the hosts users have:
#   absent  no /dev/kvm (a cloud VM without nested virtualization): ENOENT
#   eacces  a /dev/kvm the user may not open (not in its group): EACCES;
#           the tests and tools run without any capability
#   enotty  a /dev/kvm that is another file: ENOTTY on its first ioctl
#
# As root, in a mount namespace of its own, /dev becomes a tmpfs holding
# only null, zero, random, urandom, tty, shm and pts (and /dev/kvm as the
# variant wants); nothing outside the namespace changes.  Then, in each
# build: every test of the suites kvm and net but two-hosts (which needs no
# KVM) must skip (exit 77) with the one line naming /dev/kvm, the errno's
# meaning and its likely cause, except cli-errors, which must pass (it
# checks those lines itself); pkgconfig and pkgconfig-migrate must skip naming /dev/kvm and the
# errno, man-examples pass with its programs built and not run; the
# sanitizers' builds find no leak on the way out.  Every tool that builds a VM (kvmdirty-migrate send, listen,
# demo and probe; kvmdirty-vmm; kvmdirty-linux; kvmdirty-perf; the bench programs) must
# exit 77 with exactly that line.  Exits 0 when all did, 1 otherwise; 77
# where a mount namespace cannot be made (not root).
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

variant=${1:-}
shift || true
case "$variant" in
absent) want="No such file or directory: this host offers no KVM" ;;
eacces) want="Permission denied: no permission" ;;
enotty) want="Inappropriate ioctl for device: /dev/kvm is not a KVM device" ;;
*)
	echo "usage: hide-kvm.sh absent|eacces|enotty BUILD-DIR..." >&2
	exit 2
	;;
esac
[ $# -gt 0 ] || { echo "usage: hide-kvm.sh absent|eacces|enotty BUILD-DIR..." >&2; exit 2; }
builds=()
for b in "$@"; do builds+=("$(cd "$b" && pwd)"); done

# Outside: enter a mount namespace of our own, then run this script again
# there.  Inside, the namespace must differ from the one we came from: the
# mounts below must never land on the host's /dev.
here_ns=$(readlink /proc/self/ns/mnt)
if [ "${HIDE_KVM_FROM:-}" = "" ]; then
	if [ "$(id -u)" != 0 ] || ! unshare --mount true 2>/dev/null; then
		echo "hide-kvm: skipped: a mount namespace needs root (with CAP_SYS_ADMIN)"
		exit 77
	fi
	exec unshare --mount --propagation private env HIDE_KVM_FROM="$here_ns" bash "$0" "$variant" "${builds[@]}"
fi
if [ "$HIDE_KVM_FROM" = "$here_ns" ]; then
	echo "hide-kvm: not in a mount namespace of its own ($here_ns): refusing to mount over /dev" >&2
	exit 1
fi

# ---- inside the namespace: a /dev without KVM ----
old=$(mktemp -d)
mount --rbind /dev "$old"
mount -t tmpfs -o mode=755,nosuid hide-kvm /dev
for n in null zero random urandom tty; do
	[ -e "$old/$n" ] || continue
	touch "/dev/$n"
	mount --bind "$old/$n" "/dev/$n"
done
mkdir /dev/shm /dev/pts
mount -t tmpfs -o mode=1777,nosuid,nodev shm /dev/shm
mount --bind "$old/pts" /dev/pts
ln -s pts/ptmx /dev/ptmx
ln -s /proc/self/fd /dev/fd
ln -s fd/0 /dev/stdin
ln -s fd/1 /dev/stdout
ln -s fd/2 /dev/stderr
umount -l "$old"
rmdir "$old"
as=()
case "$variant" in
eacces)
	# A node whose mode lets no one open it, and the tests and tools run
	# with no capability at all (bounding set emptied before each exec):
	# the kernel's permission check then refuses them as it refuses a user
	# outside the node's group, EACCES.  (Root without capabilities rather
	# than a user such as nobody, who may not reach a checkout under a home
	# directory of mode 0700, or write the build's logs.)
	touch /dev/kvm
	chmod 000 /dev/kvm
	as=(setpriv --bounding-set=-all --inh-caps=-all --ambient-caps=-all --)
	;;
enotty)
	touch /dev/kvm # a regular file: it opens, and its first ioctl is refused
	chmod 666 /dev/kvm
	;;
esac

status=0
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for b in "${builds[@]}"; do
	label=$(basename "$b")
	# the tests that may touch KVM, by name: the suites kvm and net but
	# two-hosts (no KVM in it), and the two of other suites that run a VM
	mapfile -t tests < <(meson introspect --tests "$b" | python3 -c '
import json, sys
for t in json.load(sys.stdin):
    suites = {s.split(":")[-1] for s in t["suite"]}
    if (suites & {"kvm", "net"} and t["name"] != "two-hosts") or t["name"] in ("pkgconfig", "pkgconfig-migrate", "man-examples"):
        print(t["name"])')
	if [ ${#tests[@]} -lt 10 ]; then
		echo "hide-kvm $variant $label: meson lists ${#tests[@]} tests that need KVM: is $b a configured build?"
		status=1
		continue
	fi
	wrapper=()
	[ ${#as[@]} -eq 0 ] || wrapper=(--wrapper "${as[*]}")
	rm -f "$b/meson-logs/hide-kvm-$variant"*
	meson test -C "$b" --no-rebuild --logbase "hide-kvm-$variant" "${wrapper[@]}" "${tests[@]}" >/dev/null || true
	# meson names the log after the wrapper too, when there is one
	log=$(ls "$b/meson-logs/hide-kvm-$variant"*.json 2>/dev/null | head -n 1) || true
	python3 - "${log:-$b/meson-logs/hide-kvm-$variant.json}" "$label" "$variant" "$want" <<'PY' || status=1
import json, sys
path, label, variant, want = sys.argv[1:]
bad = []
n = 0
for line in open(path):
    r = json.loads(line)
    n += 1
    name = r["name"].split(" / ")[-1]
    out = (r.get("stdout") or "") + (r.get("stderr") or "")
    first = next((l for l in out.splitlines() if "/dev/kvm" in l), "")
    # the errno's meaning alone where a program outside the tools says it
    errno_text = "/dev/kvm: " + want.split(":")[0]
    if name == "cli-errors":
        if r["result"] != "OK" or want not in out:
            bad.append(f"{name}: {r['result']} (want OK, its lines naming /dev/kvm: {want})\n{out}")
    elif name == "man-examples":
        # the pages' programs are built everywhere, run only where KVM is
        if r["result"] != "OK" or "built, not run: /dev/kvm: " + want not in out:
            bad.append(f"{name}: {r['result']} (want OK, examples built and not run: /dev/kvm: {want})\n{out}")
    elif name in ("pkgconfig", "pkgconfig-migrate"):
        if r["result"] != "SKIP" or errno_text not in first:
            bad.append(f"{name}: {r['result']} (want SKIP naming {errno_text})\n{out[-2000:]}")
    elif r["result"] != "SKIP" or want not in first:
        bad.append(f"{name}: {r['result']} (want SKIP with one line naming /dev/kvm: {want})\n{out[-2000:]}")
for b in bad:
    print(f"hide-kvm {variant} {label}: {b}")
print(f"hide-kvm {variant} {label}: {n} tests, {n - len(bad)} as they should be"
      + (" (each skipped naming /dev/kvm, cli-errors passed)" if not bad else ""))
sys.exit(1 if bad or n == 0 else 0)
PY

	# the tools: exit 77 and the one line, on stderr, nothing on stdout
	tool() { # PROG ARGS...
		local name out err got
		name=$(basename "$1")
		"${as[@]}" "$@" >"$scratch/out" 2>"$scratch/err" && got=0 || got=$?
		out=$(cat "$scratch/out") err=$(cat "$scratch/err")
		if [ "$got" != 77 ] || [ -n "$out" ] || [ "$(printf '%s\n' "$err" | grep -c .)" != 1 ] ||
			[[ "$err" != "$name: /dev/kvm: $want"* ]]; then
			echo "hide-kvm $variant $label: FAIL: $* -> exit $got, stdout '$out', stderr '$err'"
			status=1
		fi
	}
	m=$b/examples/kvmdirty-migrate/kvmdirty-migrate
	tool "$m" probe
	tool "$m" demo
	tool "$m" listen unix:/tmp/hide-kvm-$$.sock -m 8 -v 1
	tool "$m" send unix:/tmp/hide-kvm-$$.sock -m 8 -v 1
	tool "$m" snapshot -o /tmp/hide-kvm-$$-snap -m 8 -v 1
	tool "$b/examples/vmm/kvmdirty-vmm" -v 1 -m 8 -p 1
	tool "$b/examples/linux/kvmdirty-linux" --kernel /nonexistent
	tool "$b/bench/kvmdirty-perf" -b 2M -i 1
	for p in bench-exit bench-index bench-sync bench-migrate bench-snapshot bench-devices; do
		tool "$b/bench/$p"
	done
	[ "$status" != 0 ] || echo "hide-kvm $variant $label: every tool exits 77 with the one line naming /dev/kvm"
done
exit $status
