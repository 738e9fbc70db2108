#!/usr/bin/env bash
# Batch-1 decode against the memory-bandwidth bound, measured back to back: each round
# calibrates the machine (read bandwidth with 2 threads and with 1) and right after runs the
# decode sweep at batch 1 (context 128) on the default model and on the 827M-parameter shape of
# benchmarks/configs/mixtral-827m-e16k2.json (generated weights), with 2 threads and with 1.
# Prints per round and the medians: the fraction of the bound (bytes touched / read bandwidth)
# each run reaches. This VM's bandwidth drifts (17-57 GB/s within an hour), hence the rounds.
#
#   benchmarks/decode_bound.sh [OUT_DIR] [ROUNDS]     (about 1.5 minutes per round on 2 cores)
#
# BENCH_ARGS adds flags to every bench run, e.g. BENCH_ARGS="--cpu-isa avx2" for the exact
# kernel an AVX2-only CPU (Zen 3) runs.
set -euo pipefail
out=$(realpath -m "${1:-decode-bound}")
rounds=${2:-5}
if ! [[ "$rounds" =~ ^[1-9][0-9]*$ ]]; then
  echo "decode_bound.sh: ROUNDS must be a positive integer, got '$rounds'" >&2
  exit 2
fi
repo=$(cd "$(dirname "$0")/.." && pwd)
moeserve=$(realpath -m "${MOESERVE:-$repo/build/tools/moeserve}")
[[ -x "$moeserve" ]] || { echo "decode_bound.sh: no moeserve binary at $moeserve (build first)" >&2; exit 2; }
mkdir -p "$out"
cd "$repo"

run() {
  local log=$1
  shift
  if ! "$@" > "$log" 2>&1; then
    echo "decode_bound.sh: failed: $*" >&2
    tail -5 "$log" >&2
    exit 1
  fi
}

for round in $(seq 1 "$rounds"); do
  for threads in 2 1; do
    run "$out/calibrate_${round}_t$threads.log" "$moeserve" calibrate --no-progress --no-disk --threads "$threads" \
      --out "$out/hw_${round}_t$threads.json"
    for model in default 827m; do
      args=()
      [[ $model == 827m ]] && args=(--model benchmarks/configs/mixtral-827m-e16k2.json --load-format dummy)
      read -r -a extra <<< "${BENCH_ARGS:-}"
      args+=("${extra[@]}")
      run "$out/sweep_${round}_${model}_t$threads.log" "$moeserve" bench "${args[@]}" --threads "$threads" \
        --sweep-batch 1 --context 128 --kv-dtype bf16 --hardware "$out/hw_${round}_t$threads.json" \
        --out "$out/sweep_${round}_${model}_t$threads.json"
    done
  done
  echo "decode_bound.sh: round $round of $rounds done"
done
python3 "$repo/clients/python/bound_table.py" "$out"
