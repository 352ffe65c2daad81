#!/bin/bash
# mkguest.sh: build the Linux guest for kvmdirty-linux: OUTDIR/vmlinuz, a
# stock Debian kernel (unpacked from its package, never installed), and
# OUTDIR/initramfs.cpio.gz with busybox-static, guest/init as /init and the
# static guest/workload.  Cached: the kernel is fetched once, the initramfs
# rebuilt only when one of its inputs changed.
#
# usage: mkguest.sh OUTDIR
#
# environment:
#   LINUX_KROOT  a directory holding an unpacked Debian kernel package
#                (boot/vmlinuz-*, boot/config-*), used instead of fetching
#                one, e.g. the kvm-under-tcg tool's kroot
#
# try it under QEMU (TCG):
#   qemu-system-x86_64 -accel tcg -m 256 -smp 2 -nographic -no-reboot \
#     -kernel OUTDIR/vmlinuz -initrd OUTDIR/initramfs.cpio.gz \
#     -append "console=ttyS0 panic=-1 wl.secs=15 wl.mib=16 wl.rate=8"
set -euo pipefail

log() { echo "mkguest: $*" >&2; }
die() { log "$*"; exit 1; }

[ $# -eq 1 ] || { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
BB=/bin/busybox

# --- 1. host packages ----------------------------------------------------------
need=()
for p in busybox-static gcc libc6-dev; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
		need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
	[ "$(id -u)" = 0 ] || die "missing Debian packages: ${need[*]} (apt-get install them as root)"
	log "installing ${need[*]}"
	apt-get update -qq >/dev/null
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
[ -x "$BB" ] || die "$BB missing (busybox-static)"

# --- 2. kernel: Debian's, unpacked -------------------------------------------
if [ -n "${LINUX_KROOT:-}" ]; then
	KROOT=$LINUX_KROOT
	ls "$KROOT"/boot/vmlinuz-* >/dev/null 2>&1 || die "LINUX_KROOT=$KROOT holds no boot/vmlinuz-*"
else
	KROOT=$OUT/kroot
	if ! ls "$KROOT"/boot/vmlinuz-* >/dev/null 2>&1; then
		kdeps() { apt-cache depends linux-image-amd64 2>/dev/null |
			awk '/Depends: linux-image-/{print $2; exit}'; }
		kpkg=$(kdeps)
		if [ -z "$kpkg" ] && [ "$(id -u)" = 0 ]; then
			apt-get update -qq >/dev/null
			kpkg=$(kdeps)
		fi
		[ -n "$kpkg" ] || die "apt-cache knows no linux-image-amd64 (apt-get update as root)"
		log "fetching $kpkg"
		rm -f "$OUT/${kpkg}"_*.deb
		# apt's "download is performed unsandboxed" warning, and only it, dropped
		(cd "$OUT" && apt-get download -qq "$kpkg" 2> >(grep -v 'unsandboxed' >&2))
		rm -rf "$KROOT"; mkdir -p "$KROOT"
		dpkg-deb -x "$OUT/${kpkg}"_*.deb "$KROOT"
		rm -f "$OUT/${kpkg}"_*.deb
	fi
fi
VMLINUZ=$(ls "$KROOT"/boot/vmlinuz-* | head -1)
KVER=${VMLINUZ##*/vmlinuz-}
cmp -s "$VMLINUZ" "$OUT/vmlinuz" || { cp "$VMLINUZ" "$OUT/vmlinuz.tmp"; mv "$OUT/vmlinuz.tmp" "$OUT/vmlinuz"; }
# No modules go in the initramfs: the console, kvmclock, the MP table and
# the initramfs itself must be built in.
CONFIG=$KROOT/boot/config-$KVER
for opt in SERIAL_8250_CONSOLE KVM_GUEST X86_MPPARSE BLK_DEV_INITRD RD_GZIP DEVTMPFS; do
	grep -qx "CONFIG_$opt=y" "$CONFIG" 2>/dev/null ||
		log "warning: CONFIG_$opt is not =y in $CONFIG; the guest may not boot"
done

# --- 3. initramfs --------------------------------------------------------------
INITRD=$OUT/initramfs.cpio.gz
STAMP=$OUT/initramfs.stamp
inputs=("$0" "$HERE/guest/init" "$HERE/guest/workload.c" "$BB")
stamp=$({ sha256sum "${inputs[@]}" | awk '{print $1}'; cc --version | head -1; } | sha256sum)
if [ ! -f "$INITRD" ] || [ "$(cat "$STAMP" 2>/dev/null)" != "$stamp" ]; then
	log "building initramfs"
	IR=$OUT/initramfs.root
	rm -rf "$IR"
	mkdir -p "$IR"/{bin,proc,sys,tmp}
	cp "$BB" "$IR/bin/busybox"
	cp "$HERE/guest/init" "$IR/init"
	chmod 755 "$IR/init"
	cc -static -O2 -pthread -std=gnu11 -Wall -Wextra -o "$IR/workload" "$HERE/guest/workload.c"
	find "$IR" -exec touch -h -d @0 {} +	# no build times in the archive

	# dev and dev/console are written here, ahead of the rest: the kernel
	# opens /dev/console for init before init can mount devtmpfs, and a
	# node made with mknod would need root.
	newc() {	# NAME MODE NLINK RDEVMAJOR RDEVMINOR INO
		printf '070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%s\0' \
			"$6" "$2" 0 0 "$3" 0 0 0 0 "$4" "$5" $((${#1} + 1)) 0 "$1"
		local pad=$(( (4 - (110 + ${#1} + 1) % 4) % 4 ))
		head -c "$pad" /dev/zero
	}
	{
		newc dev $((0040755)) 2 0 0 1
		newc dev/console $((0020600)) 1 5 1 2
		(cd "$IR" && find . -mindepth 1 | sed 's|^\./||' | LC_ALL=C sort |
			"$BB" cpio -o -H newc -R 0:0 2>/dev/null)
	} | gzip -9 -n > "$INITRD.tmp"
	mv "$INITRD.tmp" "$INITRD"
	rm -rf "$IR"
	echo "$stamp" > "$STAMP"
fi

echo "$OUT/vmlinuz"
echo "$INITRD"
