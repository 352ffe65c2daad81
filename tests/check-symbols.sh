#!/bin/sh
# SPDX-License-Identifier: MIT
# The shared library exports exactly the symbols of the version script, all
# in a version node, and each of them is declared in the public header.
# usage: check-symbols.sh LIBRARY.so VERSION-SCRIPT HEADER [NODE-PREFIX FUNCTION-PREFIX]
# (NODE-PREFIX: the version nodes' names up to their number, LIBKVMDIRTY_;
# FUNCTION-PREFIX: the library's functions', kvmdirty_: the header's
# mentions of others, in comments, are not its own)
set -eu
lib=$1 map=$2 header=$3 node=${4:-LIBKVMDIRTY_} fn=${5:-kvmdirty_}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

nm -D --defined-only "$lib" | awk '$2 ~ /^[TDBRVW]$/ { print $3 }' | grep -v "^$node" >"$tmp/raw"
sed 's/@.*//' "$tmp/raw" | sort -u >"$tmp/exported"
sed -n 's/^[[:space:]]*\(kvmdirty_[a-z0-9_]*\);.*/\1/p' "$map" | sort -u >"$tmp/listed"
grep -o "$fn[a-z0-9_]*(" "$header" | tr -d '(' | sort -u >"$tmp/declared"

status=0
if ! diff -u "$tmp/listed" "$tmp/exported" >"$tmp/d1"; then
	echo "exported symbols differ from $map (- listed only, + exported only):"; cat "$tmp/d1"; status=1
fi
if ! diff -u "$tmp/declared" "$tmp/listed" >"$tmp/d2"; then
	echo "functions declared in $header differ from $map (- declared only, + listed only):"; cat "$tmp/d2"; status=1
fi
if grep -v "@@\\?$node[0-9.]*\$" "$tmp/raw" >"$tmp/unversioned"; then
	echo "exported without a version node:"; cat "$tmp/unversioned"; status=1
fi
n=$(wc -l <"$tmp/exported")
[ "$status" = 0 ] && echo "symbols: $n exported, all listed, versioned and declared"
exit $status
