#!/usr/bin/env bash
# Hosts made on this machine, for multi-host tests: each "host" is a Linux
# network namespace with its own address on a private bridge, its own
# hostname, and only TCP to the others (no shared memory across hosts:
# OpenMPI starts one daemon per host, and ranks of different daemons talk
# over its TCP transport). Root only.
#
#   scripts/netns-hosts.sh run N [--rate RATE] -- COMMAND [ARGS...]
#       creates N hosts, runs COMMAND with FSDP_NETNS_HOSTS="10.88.0.1,...",
#       FSDP_NETNS_MPI_ARGS (the mpirun flags that reach them, for fsdp-run
#       --mpi-arg) and FSDP_NETNS_AGENT set, and removes everything when
#       COMMAND ends, also on failure or a signal. Its exit status is COMMAND's.
#   scripts/netns-hosts.sh up N [--rate RATE]      create (and leave) them
#   scripts/netns-hosts.sh down                    remove them
#   scripts/netns-hosts.sh cap HOST RATE           cap a host's link (tc tbf), both ways
#   scripts/netns-hosts.sh link HOST down|up       take a host's link down or up
#
# RATE is tc's (1gbit, 100mbit). Names and addresses are this script's own:
# namespaces fsdp-h1..fsdp-hN, bridge fsdp-br0 (10.88.0.254/24), host i at
# 10.88.0.i. Nothing else on the machine is touched.
#
# OpenMPI reaches the hosts through scripts/netns-agent (plm_rsh_agent):
# it runs the daemon with `ip netns exec` where a cluster would use ssh.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bridge=fsdp-br0
prefix=10.88.0
max_hosts=16

die() { echo "netns-hosts: $*" >&2; exit 2; }
need_root() { [ "$(id -u)" -eq 0 ] || die "needs root (ip netns, bridges, tc)"; }

host_ns() { echo "fsdp-h$1"; }

down() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^fsdp-h[0-9]+$' || true); do
    ip netns del "$ns" 2>/dev/null || true
  done
  # Root-side veth ends go with their namespaces' ends; the bridge last.
  local dev
  for dev in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E '^fsdp-v[0-9]+$' || true); do
    ip link del "$dev" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
}

cap() {  # HOST RATE: tbf on the host's egress and on the bridge port towards it
  local i="$1" rate="$2" ns
  ns=$(host_ns "$i")
  [[ "$rate" =~ ^[0-9]+(bit|kbit|mbit|gbit)$ ]] || die "rate must be like 1gbit or 100mbit, got '$rate'"
  # burst: at least rate/HZ; 1 ms of the rate, and no less than 64 KiB.
  ip netns exec "$ns" tc qdisc replace dev eth0 root tbf rate "$rate" burst 256kb latency 100ms
  tc qdisc replace dev "fsdp-v$i" root tbf rate "$rate" burst 256kb latency 100ms
}

up() {
  local n="$1" rate="${2:-}" i ns
  [[ "$n" =~ ^[1-9][0-9]*$ ]] && [ "$n" -le "$max_hosts" ] || die "host count must be 1..$max_hosts, got '$n'"
  down
  ip link add "$bridge" type bridge
  ip addr add "$prefix.254/24" dev "$bridge"
  ip link set "$bridge" up
  for i in $(seq 1 "$n"); do
    ns=$(host_ns "$i")
    ip netns add "$ns"
    ip link add "fsdp-v$i" type veth peer name "fsdp-p$i"
    ip link set "fsdp-p$i" netns "$ns"
    ip netns exec "$ns" ip link set "fsdp-p$i" name eth0
    ip netns exec "$ns" ip addr add "$prefix.$i/24" dev eth0
    ip netns exec "$ns" ip link set eth0 up
    ip netns exec "$ns" ip link set lo up
    ip link set "fsdp-v$i" master "$bridge"
    ip link set "fsdp-v$i" up
    [ -z "$rate" ] || cap "$i" "$rate"
  done
  # Every host reaches the bridge before anything is started on it: a TCP
  # connect to a closed port there is refused at once when the link works,
  # and hangs when it does not (this machine may have no ping).
  for i in $(seq 1 "$n"); do
    local rc=0
    timeout 5 ip netns exec "$(host_ns "$i")" bash -c "exec 3<>/dev/tcp/$prefix.254/9" 2>/dev/null || rc=$?
    [ "$rc" -ne 124 ] || die "host $prefix.$i cannot reach the bridge"
  done
}

hosts_list() {
  local n="$1" i list=""
  for i in $(seq 1 "$n"); do list+="${list:+,}$prefix.$i"; done
  echo "$list"
}

cmd="${1:-}"
[ -n "$cmd" ] || die "usage: netns-hosts.sh run N [--rate RATE] -- COMMAND | up N [--rate RATE] | down | cap HOST RATE | link HOST down|up"
shift
case "$cmd" in
  up|run)
    need_root
    # One set of hosts at a time on this machine: a second `run` would tear
    # down the first one's namespaces (`up` starts with `down`). It waits.
    exec 9>/tmp/fsdp-netns-hosts.lock
    flock -n 9 || { echo "netns-hosts: waiting for another run's hosts to go (/tmp/fsdp-netns-hosts.lock)" >&2; flock 9; }
    n="${1:-}"; shift || true
    rate=""
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do
      case "$1" in
        --rate) rate="${2:-}"; shift 2 ;;
        *) die "unknown option '$1'" ;;
      esac
    done
    if [ "$cmd" = up ]; then up "$n" "$rate"; exit 0; fi
    [ "${1:-}" = "--" ] && shift || die "run needs -- COMMAND"
    [ $# -ge 1 ] || die "run needs a command after --"
    trap down EXIT
    trap 'exit 130' INT TERM HUP
    up "$n" "$rate"
    export FSDP_NETNS_HOSTS
    FSDP_NETNS_HOSTS=$(hosts_list "$n")
    export FSDP_NETNS_AGENT="$here/netns-agent"
    # Daemons over the bridge, ranks over TCP between hosts (and shared
    # memory only inside one), on the bridge's subnet only.
    export FSDP_NETNS_MPI_ARGS="--mca plm_rsh_agent $FSDP_NETNS_AGENT --mca oob_tcp_if_include $prefix.0/24 --mca btl_tcp_if_include $prefix.0/24 --mca btl self,vader,tcp"
    status=0
    "$@" || status=$?
    exit "$status"
    ;;
  down) need_root; down ;;
  cap) need_root; [ $# -eq 2 ] || die "cap HOST RATE"; cap "$1" "$2" ;;
  link)
    need_root
    [ $# -eq 2 ] && [[ "$1" =~ ^[0-9]+$ ]] || die "link HOST down|up"
    case "$2" in down|up) ip link set "fsdp-v$1" "$2" ;; *) die "link HOST down|up, got '$2'" ;; esac
    ;;
  *) die "unknown command '$cmd'" ;;
esac
