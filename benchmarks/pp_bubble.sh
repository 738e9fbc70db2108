#!/usr/bin/env bash
# Pipeline stages, measured (docs/parallelism.md, "Pipeline bubbles and memory"):
#  1. the bubble: `moeserve bench --pp 2 --micro-batches M` for M = 1, 2, 4, 8; per decode step of
#     all the sequences, the share of the step the slowest stage spent waiting on a hand-off,
#     against the (p-1)/(m+p-1) of a pipeline of equal stages; the step time beside it. As
#     threads of one process, and (as root, where network namespaces can be made) as two
#     processes in two namespaces over a shaped link (scripts/netns-hosts.sh).
#  2. memory: --pp 1, 2, 4 with 8 sequences per micro-batch (as many micro-batches as stages):
#     the weights and the KV each device holds.
#
#   benchmarks/pp_bubble.sh [OUT_DIR] [PRESET]      (about 2 minutes on 2 cores)
#
# MOESERVE=path overrides the binary (default: build/tools/moeserve of this checkout).
set -euo pipefail
out=$(realpath -m "${1:-pp-bubble}")
preset=${2:-small}
repo=$(cd "$(dirname "$0")/.." && pwd)
moeserve=$(realpath -m "${MOESERVE:-$repo/build/tools/moeserve}")
[[ -x "$moeserve" ]] || { echo "pp_bubble.sh: no moeserve binary at $moeserve (build first)" >&2; exit 2; }
mkdir -p "$out"
cd "$repo"
workload=(--preset "$preset" --num-requests 16 --prompt-len 32 --output-len 48)

# The decode steps of all 16 sequences in a trace: median step ms and median waiting share.
summarize() {  # TRACE M LABEL
  python3 - "$1" "$2" "$3" <<'EOF'
import json, statistics as st, sys
trace, m, label = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rows = [json.loads(l) for l in open(trace)]
d = [r for r in rows if r["prefill_tokens"] == 0 and r["num_seqs"] == 16]
if not d:
    sys.exit(f"pp_bubble.sh: no decode step of all 16 sequences in {trace}")
wait = st.median(r["observed_s"]["comm"] / r["duration_s"] for r in d)
step = 1e3 * st.median(r["duration_s"] for r in d)
print(f"| {label} | {m} | {step:.1f} | {wait:.2f} | {1 / (m + 1):.2f} |")
EOF
}

echo "| ranks as | micro-batches | decode step ms | waiting share | (p-1)/(m+p-1) |"
echo "| --- | ---: | ---: | ---: | ---: |"
for m in 1 2 4 8; do
  "$moeserve" bench "${workload[@]}" --pp 2 --micro-batches "$m" --trace-jsonl "$out/threads-m$m.jsonl" \
    > "$out/threads-m$m.log" 2>&1
  summarize "$out/threads-m$m.jsonl" "$m" "threads"
done

# Two namespaces, a stage in each, over a 10 Gb/s link with 100 us of delay each way where netem
# exists (its absence is said, and the link is left unshaped).
if [[ $(id -u) -eq 0 ]] && command -v mpirun > /dev/null && ip netns list > /dev/null 2>&1; then
  trap 'scripts/netns-hosts.sh down --prefix mpb > /dev/null 2>&1 || true' EXIT
  if ! scripts/netns-hosts.sh up 2 --prefix mpb --subnet 10.77.2 --rate 10gbit --delay 100us > "$out/netns.log" 2>&1; then
    scripts/netns-hosts.sh up 2 --prefix mpb --subnet 10.77.2 --rate 10gbit >> "$out/netns.log" 2>&1
    echo "(no netem here: the link is 10 Gb/s without added delay)"
  fi
  scripts/netns-hosts.sh hostfile 2 --prefix mpb --slots 1 > "$out/hosts"
  for m in 1 2 4 8; do
    mpirun --allow-run-as-root --hostfile "$out/hosts" --mca plm_rsh_agent "$repo/scripts/netns-hosts.sh agent" \
      --mca oob_tcp_if_include 10.77.2.0/24 --mca btl self,vader,tcp --mca btl_tcp_if_include 10.77.2.0/24 \
      --mca mpi_yield_when_idle 1 --bind-to none -np 2 \
      "$moeserve" bench "${workload[@]}" --pp 2 --micro-batches "$m" --trace-jsonl "$out/netns-m$m.jsonl" \
      > "$out/netns-m$m.log" 2>&1
    summarize "$out/netns-m$m.jsonl" "$m" "processes, 2 namespaces"
  done
else
  echo "(not root, or no mpirun or network namespaces here: the two-namespace rows are not measured)"
fi

echo
echo "| --pp | micro-batches x sequences | weights per device MB | KV per device MB |"
echo "| ---: | --- | ---: | ---: |"
for pp in 1 2 4; do
  seqs=$((8 * pp))
  "$moeserve" bench --preset "$preset" --pp "$pp" --micro-batches "$pp" --num-requests "$seqs" --prompt-len 128 \
    --output-len 16 --out "$out/memory-pp$pp.json" > "$out/memory-pp$pp.log" 2>&1
  python3 - "$out/memory-pp$pp.json" "$pp" "$seqs" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))["parallel"]
pp, seqs = int(sys.argv[2]), int(sys.argv[3])
kv = j["kv_bytes_per_sequence_per_device"] * seqs  # every sequence passes through every stage
print(f"| {pp} | {pp} x {seqs // pp} | {j['weight_bytes_per_device_max'] / 1e6:.1f} | {kv / 1e6:.1f} |")
EOF
done
