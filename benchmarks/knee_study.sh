#!/usr/bin/env bash
# Where does the knee of the decode curve sit against the critical batch, as MoE sparsity varies?
# Runs `moeserve calibrate` and then the decode sweep on the small preset's shape with 4-16
# experts and top-2 to top-8 routing (benchmarks/configs, generated weights), and prints a table
# of measured knee and roofline-bound knee over the critical batch (docs/roofline.md, section 5).
#
#   benchmarks/knee_study.sh [OUT_DIR] [ROUNDS]     (about 4 minutes per round on 2 cores)
#
# OUT_DIR (default knee-study) gets each command's log, the profiles and the sweep reports;
# MOESERVE=path overrides the binary (default: build/tools/moeserve of this checkout).
set -euo pipefail
out=$(realpath -m "${1:-knee-study}")
rounds=${2:-1}
if ! [[ "$rounds" =~ ^[1-9][0-9]*$ ]]; then
  echo "knee_study.sh: ROUNDS must be a positive integer, got '$rounds'" >&2
  exit 2
fi
repo=$(cd "$(dirname "$0")/.." && pwd)
moeserve=$(realpath -m "${MOESERVE:-$repo/build/tools/moeserve}")
[[ -x "$moeserve" ]] || { echo "knee_study.sh: no moeserve binary at $moeserve (build first)" >&2; exit 2; }
mkdir -p "$out"
cd "$repo"

# Runs a command with its output in a log; on failure shows the log's tail and stops.
run() {
  local log=$1
  shift
  if ! "$@" > "$log" 2>&1; then
    echo "knee_study.sh: failed: $*" >&2
    tail -5 "$log" >&2
    exit 1
  fi
}

sweeps=()
for round in $(seq 1 "$rounds"); do
  # Calibrate right before the sweeps: on a shared machine the peaks drift between runs.
  run "$out/calibrate_$round.log" "$moeserve" calibrate --no-progress --out "$out/hw_$round.json"
  grep "calibrate: triad" "$out/calibrate_$round.log" || true
  for spec in e8k2:bf16 e8k2:f32 e16k2:bf16 e4k2:bf16 e8k4:bf16 e8k8:bf16 e8k8:f32; do
    cfg=${spec%%:*}
    dtype=${spec##*:}
    echo "round $round: small-$cfg, $dtype weights" >&2
    sweep="$out/sweep_${round}_${cfg}_${dtype}.json"
    run "$out/sweep_${round}_${cfg}_${dtype}.log" "$moeserve" bench --model "benchmarks/configs/small-$cfg.json" \
      --load-format dummy --dtype "$dtype" --kv-dtype bf16 --sweep-batch 1,2,4,8,16,32,64,128,256 \
      --context 128,1024,4000 --hardware "$out/hw_$round.json" --out "$sweep"
    sweeps+=("$sweep")
  done
done
# The table, and the plot where matplotlib is installed (scripts/setup.sh installs it for /usr/bin/python3).
if python3 -c "import matplotlib" 2> /dev/null; then
  python3 clients/python/knee_table.py "${sweeps[@]}" --plot "$out/knees.png"
else
  python3 clients/python/knee_table.py "${sweeps[@]}"
fi
