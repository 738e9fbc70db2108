#!/usr/bin/env bash
# Several "hosts" on this machine: network namespaces joined by shaped links, for running a job's
# ranks on different network stacks (docs/multi-host.md).
#
#   scripts/netns-hosts.sh up N [--rate R] [--burst B] [--delay D] [--prefix P] [--subnet 10.77.X]
#       N namespaces P0..P(N-1), each with a loopback and an eth0 at 10.77.0.(10+i)/24 on a bridge
#       Pbr (10.77.0.1 in the root namespace). --rate (tc units, e.g. 10gbit; a tbf qdisc whose
#       bucket holds --burst bytes, by default two packets: a real NIC sends each packet at its
#       line rate, where a 64 KiB bucket let a decode step's messages through at memory speed;
#       at least one frame, MTU + 14 bytes, or tbf drops larger packets; with netem carrying the
#       rate, which paces every packet itself, --burst does not apply) and
#       --delay (e.g. 100us) shape every namespace's eth0 egress, so a message between two
#       namespaces sees the delay once and the rate once. The delay is netem's where the kernel
#       has sch_netem; else the userspace delay line build/tools/moeserve-delay-line
#       (tools/delay_line.cc; MOESERVE_DELAY_LINE names another) carries the namespaces' traffic
#       through TUN devices (eth0 in each, Pbr in the root namespace; MTU 9000) and holds each
#       packet between two namespaces for the delay; it runs on this machine's cores. Idempotent:
#       an existing set with the same prefix is removed first. Each namespace's TCP gives up on an
#       unanswering peer after ~6 s (net.ipv4.tcp_retries2=4, this namespace's own setting).
#       Each namespace resolves the set's names from its own /etc/netns/P<i>/hosts (and asks no
#       name server: this machine's would be unreachable from inside, and Open MPI's lookups
#       then waited 10-20 s each).
#   scripts/netns-hosts.sh down [--prefix P] (the set of another prefix is left alone)
#       Removes every namespace named P<digits>, their links, the bridge and the delay line (also
#       after a failed run); kills what still runs inside them.
#   scripts/netns-hosts.sh hostfile N [--prefix P] [--slots S]
#       An Open MPI hostfile naming the namespaces.
#   scripts/netns-hosts.sh agent [ssh options] HOST COMMAND...
#       Open MPI's launch agent (--mca plm_rsh_agent): runs COMMAND in namespace HOST, with the
#       UTS hostname HOST, as ssh would on another machine.
#   scripts/netns-hosts.sh run HOST PROGRAM [ARGS...]
#       Runs PROGRAM (exec'd: signals reach it) in namespace HOST with the UTS hostname HOST: how
#       mpirun is started on the first "host", so that its own TCP gives up on a cut link as the
#       namespaces' does.
#
# Needs root (or CAP_NET_ADMIN + CAP_SYS_ADMIN), iproute2 and tc. The addresses are this
# project's own test network (10.77.0.0/24); nothing is routed outside the machine.
set -euo pipefail

PREFIX=msh
SUBNET=10.77.0
ETC_MARKER=.made-by-netns-hosts  # in each /etc/netns/P<i> this script made, so `down` removes only those

IN_UP=""
# Exits 2 with the message; a failed `up` removes what it had made first.
die() {
  echo "netns-hosts: $*" >&2
  if [ -n "$IN_UP" ]; then down; fi
  exit 2
}

parse_common() {
  RATE="" DELAY="" BURST="" SLOTS=2
  while [ $# -gt 0 ]; do
    case "$1" in
      --rate) RATE="${2:?--rate needs a value, e.g. 10gbit}"; shift 2 ;;
      --delay) DELAY="${2:?--delay needs a value, e.g. 100us}"; shift 2 ;;
      --burst) BURST="${2:?--burst needs a value in bytes, e.g. 64kb}"; shift 2 ;;
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

# Where `up` keeps the delay line's pid, binary, readiness and log: root's, one per prefix.
state_dir() { echo "/run/moeserve-netns-${PREFIX}"; }

# Whether `pid` still runs the delay line binary `up` recorded (not a recycled pid).
is_delay_line() {
  local pid="$1" bin
  bin="$(cat "$(state_dir)/delay-line.bin" 2>/dev/null)" || return 1
  [ -n "$bin" ] && [ "$(readlink -f "/proc/$pid/exe" 2>/dev/null)" = "$bin" ]
}

stop_delay_line() {
  local pidfile pid i
  pidfile="$(state_dir)/delay-line.pid"
  if [ -f "$pidfile" ]; then
    pid="$(cat "$pidfile")"
    if is_delay_line "$pid"; then
      kill "$pid" 2>/dev/null || true
      for ((i = 0; i < 30; i++)); do is_delay_line "$pid" || break; sleep 0.1; done
      if is_delay_line "$pid"; then kill -9 "$pid" 2>/dev/null || true; fi
    fi
  fi
  rm -rf "$(state_dir)"
}

# Whether this kernel has the netem qdisc (tried on a throwaway veth pair; one an interrupted
# run left behind is removed first).
has_netem() {
  ip link del "${PREFIX}probe" 2>/dev/null || true
  ip link add "${PREFIX}probe" type veth peer name "${PREFIX}probe1" 2>/dev/null || return 1
  local ok=1
  tc qdisc add dev "${PREFIX}probe" root netem delay 1us 2>/dev/null && ok=0
  ip link del "${PREFIX}probe" 2>/dev/null || true
  return $ok
}

# tc's time units (us/usec, ms/msec, s/sec; a bare number is microseconds) as whole microseconds.
delay_us() {
  awk -v d="$1" 'BEGIN {
    if (!match(d, /^[0-9]+(\.[0-9]+)?/)) exit 1
    v = substr(d, 1, RLENGTH); u = substr(d, RLENGTH + 1)
    if (u == "" || u == "us" || u == "usec") f = 1; else if (u == "ms" || u == "msec") f = 1000
    else if (u == "s" || u == "sec") f = 1000000; else exit 1
    printf "%d\n", v * f + 0.5 }'
}

# Starts the delay line over the n namespaces (which exist): it makes their eth0 and the root
# namespace's ${PREFIX}br, and holds packets between namespaces for --delay.
start_delay_line() {
  local n="$1" us bin dir i
  us="$(delay_us "$DELAY")" || die "--delay: '$DELAY' is not a time (e.g. 100us, 1ms)"
  if [ "$us" -eq 0 ] && ! [[ "$DELAY" =~ ^0+(\.0+)?[a-z]*$ ]]; then
    die "--delay: '$DELAY' rounds to 0 us; the delay line holds packets for whole microseconds"
  fi
  bin="${MOESERVE_DELAY_LINE:-$(cd "$(dirname "$0")/.." && pwd)/build/tools/moeserve-delay-line}"
  [ -x "$bin" ] || die "--delay: this kernel has no netem, and the delay line $bin is not built (scripts/build.sh)"
  dir="$(state_dir)"
  rm -rf "$dir"
  mkdir -m 700 "$dir"
  readlink -f "$bin" >"$dir/delay-line.bin"
  setsid "$bin" --prefix "$PREFIX" --namespaces "$n" --subnet "$SUBNET" --delay-us "$us" \
    --ready-file "$dir/ready" </dev/null >"$dir/delay-line.log" 2>&1 &
  echo $! >"$dir/delay-line.pid"
  for ((i = 0; i < 100; i++)); do
    [ -s "$dir/ready" ] && return 0
    kill -0 "$(cat "$dir/delay-line.pid")" 2>/dev/null || break
    sleep 0.1
  done
  die "the delay line did not start: $(cat "$dir/delay-line.log")"
}

down() {
  stop_delay_line
  ip link del "${PREFIX}probe" 2>/dev/null || true
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
  local dir
  for dir in /etc/netns/"${PREFIX}"*; do  # only what write_etc made (its marker inside)
    if [[ "$dir" =~ ^/etc/netns/${PREFIX}[0-9]+$ ]] && [ -f "$dir/$ETC_MARKER" ]; then rm -rf "$dir"; fi
  done
}

# Exits naming the subcommand ($1) unless namespace $2 exists. (awk reads the whole list: with
# `grep -q` a pipe cut short would fail under pipefail.)
require_namespace() {
  ip netns list | awk -v h="$2" '$1 == h { found = 1 } END { exit !found }' ||
    die "$1: no namespace '$2' (run: $0 up N)"
}

# The files `ip netns exec` mounts over /etc inside each namespace: a hosts file naming every
# namespace (and this machine, at the bridge), and a resolver with no name server, so that a
# lookup fails at once on the namespace's loopback instead of timing out.
write_etc() {
  local n="$1" i hosts dir
  hosts="127.0.0.1 localhost"$'\n'"::1 localhost"$'\n'"${SUBNET}.1 $(cat /proc/sys/kernel/hostname)"$'\n'
  for ((i = 0; i < n; i++)); do hosts+="${SUBNET}.$((10 + i)) ${PREFIX}${i}"$'\n'; done
  for ((i = 0; i < n; i++)); do
    dir="/etc/netns/${PREFIX}${i}"
    { mkdir -p "$dir" && : >"$dir/$ETC_MARKER" && printf '%s' "$hosts" >"$dir/hosts" &&
      printf 'options timeout:1 attempts:1\n' >"$dir/resolv.conf"; } ||
      die "cannot write $dir (each namespace's hosts file and resolver)"
  done
}

up() {
  local n="$1"
  [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le 64 ] || die "up: N must be 1-64, got '$n'"
  down
  IN_UP=1
  trap 'down' ERR
  local i ns line="" mtu=1500
  if [ -n "$DELAY" ] && ! has_netem; then line=1 mtu=9000; fi
  for ((i = 0; i < n; i++)); do
    ip netns add "${PREFIX}${i}"
    ip -n "${PREFIX}${i}" link set lo up
    # A host's TCP gives up on a peer that stops answering after ~6 s of retransmissions
    # (0.2 s doubling 5 times) instead of Linux's ~15 minutes, as a cluster tuned for fast failure
    # detection: mpirun run in a namespace, and its daemons, then find a cut link's far side lost.
    ip netns exec "${PREFIX}${i}" sysctl -qw net.ipv4.tcp_retries2=4 ||
      echo "netns-hosts: warning: cannot set net.ipv4.tcp_retries2 in ${PREFIX}${i}: a cut link's far side waits longer" >&2
  done
  if [ -n "$line" ]; then
    start_delay_line "$n"
  else
    ip link add "${PREFIX}br" type bridge
  fi
  ip addr add "${SUBNET}.1/24" dev "${PREFIX}br"
  ip link set "${PREFIX}br" mtu "$mtu" up
  for ((i = 0; i < n; i++)); do
    ns="${PREFIX}${i}"
    if [ -z "$line" ]; then
      ip link add "${PREFIX}v${i}" type veth peer name eth0 netns "$ns"
      ip link set "${PREFIX}v${i}" master "${PREFIX}br" up
    fi
    ip -n "$ns" addr add "${SUBNET}.$((10 + i))/24" dev eth0
    ip -n "$ns" link set eth0 mtu "$mtu" up
    ip -n "$ns" route add default via "${SUBNET}.1"
    if [ -n "$DELAY" ] && [ -z "$line" ]; then  # netem carries the delay, and the rate with it
      [ -z "$BURST" ] || echo "netns-hosts: --burst does not apply: netem paces each packet at the rate" >&2
      ip netns exec "$ns" tc qdisc add dev eth0 root netem delay "$DELAY" ${RATE:+rate "$RATE"} limit 100000 ||
        die "--delay needs the netem qdisc (sch_netem), which this kernel does not have"
    elif [ -n "$RATE" ]; then  # a token bucket: the rate alone, two packets a burst by default
      ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$RATE" burst "${BURST:-$((2 * mtu + 28))}" latency 100ms
    fi
  done
  write_etc "$n"
  trap - ERR
  IN_UP=""
  echo "netns-hosts: up $n: ${PREFIX}0..${PREFIX}$((n - 1)) at ${SUBNET}.10-$((9 + n)), ${line:+delay line instead of a }bridge ${PREFIX}br ${SUBNET}.1${RATE:+, rate $RATE}${DELAY:+, delay $DELAY${line:+ (moeserve-delay-line; no netem here)}}"
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
    require_namespace agent "$host"
    # As ssh does, the command words are joined and run by a shell, on a "host" named HOST.
    # (It may begin with variable assignments and ';', as Open MPI's daemon command does.)
    exec ip netns exec "$host" unshare --uts /bin/sh -c "hostname '$host' && { $*; }"
    ;;
  run)
    host="${1:?run: no host}"
    shift
    [ $# -gt 0 ] || die "run: no program"
    require_namespace run "$host"
    exec ip netns exec "$host" unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' "$host" "$@"
    ;;
  *)
    awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
    [ -z "$cmd" ] || [ "$cmd" = -h ] || [ "$cmd" = --help ] || exit 2
    ;;
esac
