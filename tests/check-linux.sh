#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# A stock Linux guest under kvmdirty-linux (tests/linux-guest.py), run where
# KVM runs a Linux guest: kvm-under-tcg's emulated kvm_amd, which needs no
# /dev/kvm of this host (its PVM-based KVM cannot run a stock kernel).
#   check-linux.sh SOURCE_DIR BUILD_DIR SCENARIO...
# The guest (Debian's kernel, an initramfs) is built by
# examples/linux/mkguest.sh into BUILD_DIR/linux-guest, with the kernel
# kvm-under-tcg already unpacked where there is one.  Exits 77 with one
# line where the emulator tool is missing.
set -euo pipefail
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
shift 2
tool=$(dirname "$src")/shared/tools/kvm-under-tcg/run.sh
if [ ! -x "$tool" ]; then
	echo "linux: skipped: no kvm-under-tcg at $tool (the emulator that runs the Linux guest)"
	exit 77
fi
# the emulator's own kernel (Debian's) is the guest's too: fetched once
"$tool" --prepare >/dev/null
kroot=${TCGKVM_DIR:-$(dirname "$(mktemp -u)")/kvm-under-tcg}/kroot
if [ -z "${LINUX_KROOT:-}" ] && ls "$kroot"/boot/vmlinuz-* >/dev/null 2>&1; then
	export LINUX_KROOT=$kroot
fi
"$src/examples/linux/mkguest.sh" "$build/linux-guest" >/dev/null
cd "$src"
# One emulated CPU thread: two-vCPU guests meet the emulator's racy page
# walks otherwise (the tool's README).  The emulator's command starts with
# an empty environment: the LINUX_* settings go in it by name.  A boot
# that stops before userspace (the emulator's stop: doc/tests.md) is tried
# again, LINUX_TRIES boots in all, each attempt said.
TCGKVM_THREAD=single TCGKVM_TIMEOUT=${LINUX_TIMEOUT:-1500} \
	"$tool" -- env LINUX_TRIES="${LINUX_TRIES:-3}" LINUX_STALL="${LINUX_STALL:-45}" \
	LINUX_XSAVE="${LINUX_XSAVE:-}" LINUX_VCPUS="${LINUX_VCPUS:-1}" LINUX_MEM="${LINUX_MEM:-192}" \
	LINUX_THREADS="${LINUX_THREADS:-1}" python3 "$src/tests/linux-guest.py" "$build" "$build/linux-guest" "$@"
