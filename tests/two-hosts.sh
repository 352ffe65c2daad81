#!/usr/bin/env bash
# SPDX-License-Identifier: MIT
# Two hosts on one machine: two network namespaces joined by a veth pair,
# the source side's egress shaped with tc tbf, a command run on each side,
# everything torn down afterwards, also when interrupted.
#
# usage: two-hosts.sh [--rate RATE] [--burst SIZE] [--limit SIZE] [--delay MS]
#                     [--keep-going] --dst 'COMMAND' --src 'COMMAND'
#        two-hosts.sh --check
#
#   --rate   tbf rate on the source's egress (tc units; default 800mbit)
#   --burst  tbf burst (default 256kb: 2.6 ms at 800mbit)
#   --limit  tbf queue limit in bytes (default 4mb: 42 ms at 800mbit)
#   --delay  netem delay on the source's egress, in ms; refused where the
#            kernel has no netem (this machine's has none)
#   --dst    run in the destination namespace, in the background, first
#   --src    run in the source namespace once the destination is started
#   --check  only say whether namespaces can be made here (exit 0 or 77)
#
# The commands run through bash -c with SRC_ADDR and DST_ADDR set (the
# addresses exist only inside the namespaces), RIG_RATE the rate and
# RIG_SRC_NS, RIG_DST_NS the namespaces' names (a source command can wait
# for a listener without connecting to it: `ip netns exec "$RIG_DST_NS"
# ss -Hltn "sport = :PORT"` prints it once it listens).  The
# exit status is the source command's; a destination that fails is
# reported, and turns a successful run into status 1.  Exit 77 (one line
# why) when namespaces cannot be made here; 2 for a bad command line.
set -uo pipefail

rate=800mbit burst=256kb limit=4mb delay= dst= src= check=
while (($#)); do
	case "$1" in
	--rate | --burst | --limit | --delay | --dst | --src)
		if [ $# -lt 2 ]; then
			echo "two-hosts.sh: $1 needs a value" >&2
			exit 2
		fi
		case "$1" in
		--rate) rate=$2 ;;
		--burst) burst=$2 ;;
		--limit) limit=$2 ;;
		--delay) delay=$2 ;;
		--dst) dst=$2 ;;
		--src) src=$2 ;;
		esac
		shift 2
		;;
	--check) check=1; shift ;;
	*) echo "two-hosts.sh: unknown argument '$1'" >&2; exit 2 ;;
	esac
done
if [ -z "$check" ] && { [ -z "$dst" ] || [ -z "$src" ]; }; then
	echo "two-hosts.sh: --dst and --src are both needed" >&2
	exit 2
fi
if [ -n "$delay" ] && ! [[ "$delay" =~ ^[0-9]+$ ]]; then
	echo "two-hosts.sh: --delay '$delay': expected milliseconds" >&2
	exit 2
fi

# Names unique to this run, so that runs never meet (and a leftover is ours).
tag=kd$$
ns_src=$tag-src ns_dst=$tag-dst
veth_src=$tag-s veth_dst=$tag-d
export SRC_ADDR=10.77.0.1 DST_ADDR=10.77.0.2 RIG_RATE=$rate RIG_SRC_NS=$ns_src RIG_DST_NS=$ns_dst
dst_pid= src_pid=

teardown() {
	trap - EXIT INT TERM HUP
	for pid in $src_pid $dst_pid; do
		kill -TERM "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
	done
	# processes still in the namespaces, then the namespaces (which takes the veth pair)
	for ns in "$ns_src" "$ns_dst"; do
		if ip netns pids "$ns" >/dev/null 2>&1; then
			ip netns pids "$ns" | xargs -r kill -KILL 2>/dev/null
			ip netns delete "$ns" 2>/dev/null
		fi
	done
	ip link delete "$veth_src" 2>/dev/null
	return 0
}

cannot() {
	echo "two-hosts.sh: skipped: cannot make network namespaces here: $*"
	teardown
	exit 77
}

trap 'teardown; exit 130' INT
trap 'teardown; exit 143' TERM
trap 'teardown; exit 129' HUP
trap teardown EXIT

[ "$(id -u)" = 0 ] || cannot "not root"
command -v ip >/dev/null || cannot "no ip (iproute2)"
command -v tc >/dev/null || cannot "no tc (iproute2)"
err=$(ip netns add "$ns_src" 2>&1) || cannot "$err"
err=$(ip netns add "$ns_dst" 2>&1) || cannot "$err"
err=$(ip link add "$veth_src" type veth peer name "$veth_dst" 2>&1) || cannot "$err"
ip link set "$veth_src" netns "$ns_src" && ip link set "$veth_dst" netns "$ns_dst" || cannot "moving the veth pair"
ip -n "$ns_src" addr add "$SRC_ADDR/24" dev "$veth_src" &&
	ip -n "$ns_dst" addr add "$DST_ADDR/24" dev "$veth_dst" &&
	ip -n "$ns_src" link set "$veth_src" up && ip -n "$ns_dst" link set "$veth_dst" up &&
	ip -n "$ns_src" link set lo up && ip -n "$ns_dst" link set lo up || cannot "addresses and links"
if [ -n "$check" ]; then
	echo "two-hosts.sh: network namespaces, veth and tc work here"
	exit 0
fi

# The shaping: the source's egress, where a real link would be the bottleneck.
if [ -n "$delay" ]; then
	if ! ip netns exec "$ns_src" tc qdisc add dev "$veth_src" root handle 1: netem delay "${delay}ms" 2>/dev/null; then
		echo "two-hosts.sh: --delay $delay: this kernel has no netem" >&2
		exit 2
	fi
	ip netns exec "$ns_src" tc qdisc add dev "$veth_src" parent 1: handle 2: tbf rate "$rate" burst "$burst" limit "$limit" ||
		{ echo "two-hosts.sh: tc tbf rate $rate burst $burst limit $limit: refused" >&2; exit 2; }
else
	ip netns exec "$ns_src" tc qdisc add dev "$veth_src" root tbf rate "$rate" burst "$burst" limit "$limit" ||
		{ echo "two-hosts.sh: tc tbf rate $rate burst $burst limit $limit: refused" >&2; exit 2; }
fi
echo "two-hosts.sh: $ns_src ($SRC_ADDR) -> $ns_dst ($DST_ADDR): tbf rate $rate burst $burst limit $limit${delay:+, netem delay ${delay}ms}"

ip netns exec "$ns_dst" bash -c "$dst" &
dst_pid=$!
# in the background and waited for, so that a signal is handled at once
ip netns exec "$ns_src" bash -c "$src" &
src_pid=$!
wait "$src_pid"
status=$?
src_pid=
# the destination finishes on its own once the source is done (or fails)
wait "$dst_pid"
dst_status=$?
dst_pid=
if [ "$dst_status" != 0 ]; then
	echo "two-hosts.sh: the destination command exited with $dst_status" >&2
	[ "$status" = 0 ] && status=1
fi
exit "$status"
