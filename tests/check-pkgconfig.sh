#!/bin/sh
# SPDX-License-Identifier: MIT
# Install into a scratch tree, then build and run a program outside the
# source tree with nothing but pkg-config's flags for PACKAGE (default
# libkvmdirty), the program needing PACKAGE's shared library.  The
# program's exit status is the check's (77: skipped).
# usage: check-pkgconfig.sh BUILD-DIR CONSUMER.c [PACKAGE]
set -eu
build=$1 src=$2 pkgname=${3:-libkvmdirty}
dest=$(mktemp -d)
trap 'rm -rf "$dest"' EXIT

meson install -C "$build" --destdir "$dest" --no-rebuild --quiet >/dev/null
pc=$(find "$dest" -name "$pkgname.pc" | head -n 1)
[ -n "$pc" ] || { echo "no $pkgname.pc installed"; exit 1; }
PKG_CONFIG_PATH=$(dirname "$pc") PKG_CONFIG_SYSROOT_DIR=$dest
export PKG_CONFIG_PATH PKG_CONFIG_SYSROOT_DIR
flags=$(pkg-config --cflags --libs "$pkgname")
echo "pkg-config --cflags --libs $pkgname: $flags"
cp "$src" "$dest/consumer.c"
cd "$dest"
# shellcheck disable=SC2086
${CC:-cc} -std=gnu11 -Wall -Werror -pthread ${CONSUMER_CFLAGS:-} -o consumer consumer.c $flags
readelf -d consumer | grep -q "NEEDED.*$pkgname\.so\.0" || { echo "consumer does not need $pkgname.so.0"; exit 1; }
libdir=$(dirname "$(find "$dest" -name "$pkgname.so.0" | head -n 1)")
LD_LIBRARY_PATH=$libdir ./consumer
