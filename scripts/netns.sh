#!/usr/bin/env bash
# "Machines" on this host for multi-node tests: N Linux network namespaces,
# each with its own network stack (loopback, one veth interface, address
# SUBNET.(i+1)/24), joined by a bridge in the root namespace. Processes in
# two namespaces talk over real TCP through the veth pairs and the bridge;
# they share the file system, the host name and /dev/shm (so tests must pick
# world.backend = "gloo" or "auto", which picks gloo for one rank per node).
# Not a container: nothing else is isolated. Needs root (CAP_NET_ADMIN).
#
#   scripts/netns.sh up N          # machines 0..N-1 (idempotent: re-running fixes them up)
#   scripts/netns.sh exec I CMD... # run CMD in machine I (as `ip netns exec`)
#   scripts/netns.sh partition I   # cut machine I off the network (its interface down)
#   scripts/netns.sh heal I        # restore machine I's link
#   scripts/netns.sh pids I        # processes running in machine I, one pid a line
#   scripts/netns.sh kill I        # SIGKILL every process of machine I
#   scripts/netns.sh addr I        # machine I's address
#   scripts/netns.sh down          # remove every machine and the bridge
#
# Environment: NETNS_PREFIX (names; default "ns-pt": namespaces ns-pt0..,
# veths ns-pt0h/ns-pt0n, bridge ns-ptbr; at most 9 characters, so that
# interface names fit Linux's 15), NETNS_SUBNET (default 10.77.0). Tests
# use a prefix of their own per run so that parallel runs never collide;
# two prefixes may share a subnet: each set of machines has its own bridge.
#
# Partitions: the machine's own interface is set down inside its namespace.
# Setting the bridge side down is not enough under every kernel (gVisor's
# netstack, which runs this project's CI machines, kept forwarding), and
# tc/iptables are not everywhere; a down interface drops every packet in
# both directions, and TCP connections survive a partition shorter than
# their timeouts (the peers retransmit after `heal`).
set -euo pipefail

prefix=${NETNS_PREFIX:-ns-pt}
subnet=${NETNS_SUBNET:-10.77.0}
bridge=${prefix}br

die() {
  echo "netns.sh: $*" >&2
  exit 1
}
usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }

(( ${#prefix} <= 9 )) || die "NETNS_PREFIX='$prefix' is longer than 9 characters (interface names are limited to 15)"
[[ $prefix =~ ^[A-Za-z0-9-]+$ ]] || die "NETNS_PREFIX='$prefix' must be letters, digits and '-'"
[[ $subnet =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "NETNS_SUBNET='$subnet' must be the first three octets, e.g. 10.77.0"

# Namespaces need root and a kernel (or sandbox) that allows them: say which
# is missing instead of failing on the first `ip` command.
need_root() {
  command -v ip >/dev/null || die "the 'ip' command (iproute2) is missing: apt-get install iproute2"
  [[ $(id -u) -eq 0 ]] || die "network namespaces need root (CAP_NET_ADMIN); run as root or skip the multi-node tests"
  local probe="${prefix}probe$$"
  if ! ip netns add "$probe" 2>/dev/null; then
    die "'ip netns add' is not permitted here (no CAP_SYS_ADMIN, or namespaces are disabled in this sandbox)"
  fi
  ip netns del "$probe"
}

check_index() {
  [[ ${1:-} =~ ^[0-9]+$ ]] || die "machine index '${1:-}' is not a number"
  ip netns list | grep -qw "^${prefix}$1" || die "machine $1 (namespace ${prefix}$1) does not exist; run 'netns.sh up N' first"
}

up() {
  local n=${1:-}
  [[ $n =~ ^[0-9]+$ ]] && (( n >= 1 && n <= 250 )) || die "up needs a machine count in [1, 250], got '${n}'"
  need_root
  ip link show "$bridge" >/dev/null 2>&1 || ip link add "$bridge" type bridge
  ip link set "$bridge" up
  local i ns
  for ((i = 0; i < n; ++i)); do
    ns=${prefix}$i
    ip netns list | grep -qw "^$ns" || ip netns add "$ns"
    if ! ip -n "$ns" link show "${ns}n" >/dev/null 2>&1; then
      ip link del "${ns}h" 2>/dev/null || true  # a half-made pair from an interrupted run
      ip link add "${ns}h" type veth peer name "${ns}n"
      ip link set "${ns}n" netns "$ns"
    fi
    ip link set "${ns}h" master "$bridge"
    ip link set "${ns}h" up
    ip -n "$ns" addr replace "$subnet.$((i + 1))/24" dev "${ns}n"
    ip -n "$ns" link set "${ns}n" up
    ip -n "$ns" link set lo up
  done
}

down() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${prefix}[0-9]+$" || true); do
    kill_machine "$ns"
    ip link del "${ns}h" 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
}

kill_machine() {
  local pids
  pids=$(ip netns pids "$1" 2>/dev/null || true)
  [[ -z $pids ]] || kill -9 $pids 2>/dev/null || true
}

cmd=${1:-}
[[ -n $cmd ]] || usage
shift
case $cmd in
  up) up "$@" ;;
  down) down ;;
  exec)
    check_index "${1:-}"
    i=$1
    shift
    (( $# > 0 )) || die "exec needs a command"
    exec ip netns exec "${prefix}$i" "$@"
    ;;
  partition) check_index "${1:-}"; ip -n "${prefix}$1" link set "${prefix}$1n" down ;;
  heal) check_index "${1:-}"; ip -n "${prefix}$1" link set "${prefix}$1n" up ;;
  pids) check_index "${1:-}"; ip netns pids "${prefix}$1" ;;
  kill) check_index "${1:-}"; kill_machine "${prefix}$1" ;;
  addr) check_index "${1:-}"; echo "$subnet.$(($1 + 1))" ;;
  -h | --help | help) usage ;;
  *) die "unknown command '$cmd' (up N | down | exec I CMD... | partition I | heal I | pids I | kill I | addr I)" ;;
esac
