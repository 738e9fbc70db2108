#!/usr/bin/env bash
# Several "hosts" on this machine: network namespaces joined by shaped links, for running a job's
# ranks on different network stacks (docs/multi-host.md).
#
#   scripts/netns-hosts.sh up N [--rate R] [--delay D] [--prefix P] [--subnet 10.77.X]
#       N namespaces P0..P(N-1), each with a loopback and an eth0 at 10.77.0.(10+i)/24 on a bridge
#       Pbr (10.77.0.1 in the root namespace). --rate (tc units, e.g. 10gbit; a tbf qdisc) and
#       --delay (e.g. 100us; netem, which some kernels lack: then it fails saying so) shape every
#       namespace's eth0 egress, so a message between two namespaces sees the delay once and the
#       rate once. Idempotent: an existing set with the same prefix is removed first.
#   scripts/netns-hosts.sh down [--prefix P] (the set of another prefix is left alone)
#       Removes every namespace named P<digits>, their links and the bridge (also after a
#       failed run); kills what still runs inside them.
#   scripts/netns-hosts.sh hostfile N [--prefix P] [--slots S]
#       An Open MPI hostfile naming the namespaces.
#   scripts/netns-hosts.sh agent [ssh options] HOST COMMAND...
#       Open MPI's launch agent (--mca plm_rsh_agent): runs COMMAND in namespace HOST, with the
#       UTS hostname HOST, as ssh would on another machine.
#
# Needs root (or CAP_NET_ADMIN + CAP_SYS_ADMIN), iproute2 and tc. The addresses are this
# project's own test network (10.77.0.0/24); nothing is routed outside the machine.
set -euo pipefail

PREFIX=msh
SUBNET=10.77.0

IN_UP=""
# Exits 2 with the message; a failed `up` removes what it had made first.
die() {
  echo "netns-hosts: $*" >&2
  if [ -n "$IN_UP" ]; then down; fi
  exit 2
}

parse_common() {
  RATE="" DELAY="" SLOTS=2
  while [ $# -gt 0 ]; do
    case "$1" in
      --rate) RATE="${2:?--rate needs a value, e.g. 10gbit}"; shift 2 ;;
      --delay) DELAY="${2:?--delay needs a value, e.g. 100us}"; shift 2 ;;
      --prefix) PREFIX="${2:?--prefix needs a value}"; shift 2 ;;
      --subnet) SUBNET="${2:?--subnet needs a value}"; shift 2 ;;
      --slots) SLOTS="${2:?--slots needs a value}"; shift 2 ;;
      *) die "unknown argument '$1'" ;;
    esac
  done
  # Ends in a letter, so that one prefix's namespaces (P0, P1, ...) never match another's.
  [[ "$PREFIX" =~ ^[a-z]([a-z0-9]{0,4}[a-z])?$ ]] || die "--prefix: 1-6 lowercase letters and digits ending in a letter, got '$PREFIX'"
  [[ "$SUBNET" =~ ^10\.77\.([0-9]|[1-9][0-9]|1[0-9][0-9]|2[0-4][0-9]|25[0-5])$ ]] ||
    die "--subnet: 10.77.X with X 0-255 (this project's test network), got '$SUBNET'"
}

down() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${PREFIX}[0-9]+$" || true); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  local link
  for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E "^${PREFIX}v[0-9]+$" || true); do
    ip link del "$link" 2>/dev/null || true
  done
  ip link del "${PREFIX}br" 2>/dev/null || true
}

up() {
  local n="$1"
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 64 ] || die "up: N must be 1-64, got '$n'"
  down
  IN_UP=1
  trap 'down' ERR
  ip link add "${PREFIX}br" type bridge
  ip addr add "${SUBNET}.1/24" dev "${PREFIX}br"
  ip link set "${PREFIX}br" up
  local i ns
  for ((i = 0; i < n; i++)); do
    ns="${PREFIX}${i}"
    ip netns add "$ns"
    ip link add "${PREFIX}v${i}" type veth peer name eth0 netns "$ns"
    ip link set "${PREFIX}v${i}" master "${PREFIX}br" up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "${SUBNET}.$((10 + i))/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" route add default via "${SUBNET}.1"
    if [ -n "$DELAY" ]; then  # netem carries the delay, and the rate with it
      ip netns exec "$ns" tc qdisc add dev eth0 root netem delay "$DELAY" ${RATE:+rate "$RATE"} limit 100000 ||
        die "--delay needs the netem qdisc (sch_netem), which this kernel does not have"
    elif [ -n "$RATE" ]; then  # a token bucket: the rate alone, with bursts of 64 KiB
      ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$RATE" burst 64kb latency 100ms
    fi
  done
  trap - ERR
  IN_UP=""
  echo "netns-hosts: up $n: ${PREFIX}0..${PREFIX}$((n - 1)) at ${SUBNET}.10-$((9 + n)), bridge ${PREFIX}br ${SUBNET}.1${RATE:+, rate $RATE}${DELAY:+, delay $DELAY}"
}

cmd="${1:-}"
shift || true
case "$cmd" in
  up)
    n="${1:-}"
    shift || true
    parse_common "$@"
    up "$n"
    ;;
  down)
    parse_common "$@"
    down
    ;;
  hostfile)
    n="${1:-}"
    shift || true
    parse_common "$@"
    [[ "$n" =~ ^[0-9]+$ ]] || die "hostfile: N must be a number"
    for ((i = 0; i < n; i++)); do echo "${PREFIX}${i} slots=${SLOTS}"; done
    ;;
  agent)
    # ssh-style: skip options (and the values of those that take one), then HOST COMMAND...
    while [ $# -gt 0 ] && [[ "$1" == -* ]]; do
      case "$1" in -o | -p | -l | -i | -F) shift 2 ;; *) shift ;; esac
    done
    host="${1:?agent: no host}"
    shift
    ip netns list | awk '{print $1}' | grep -qxF "$host" || die "agent: no namespace '$host' (run: $0 up N)"
    # As ssh does, the command words are joined and run by a shell, on a "host" named HOST.
    # (It may begin with variable assignments and ';', as Open MPI's daemon command does.)
    exec ip netns exec "$host" unshare --uts /bin/sh -c "hostname '$host' && { $*; }"
    ;;
  *)
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    [ -z "$cmd" ] || [ "$cmd" = -h ] || [ "$cmd" = --help ] || exit 2
    ;;
esac
