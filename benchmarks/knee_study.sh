#!/usr/bin/env bash
# Where does the knee of the decode curve sit against the critical batch, as MoE sparsity varies?
# Runs `moeserve calibrate` and then the decode sweep on the small preset's shape with 4-16
# experts and top-2 to top-8 routing (benchmarks/configs, generated weights), and prints a table
# of measured knee and roofline-bound knee over the critical batch (docs/roofline.md, section 5).
#
#   benchmarks/knee_study.sh [OUT_DIR] [ROUNDS]     (about 4 minutes per round on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-knee-study}
rounds=${2:-1}
moeserve=${MOESERVE:-build/tools/moeserve}
mkdir -p "$out"
for round in $(seq 1 "$rounds"); do
  # Calibrate right before the sweeps: on a shared machine the peaks drift between runs.
  "$moeserve" calibrate --no-progress --out "$out/hw_$round.json" 2>&1 | grep "calibrate: triad"
  for spec in e8k2:bf16 e8k2:f32 e16k2:bf16 e4k2:bf16 e8k4:bf16 e8k8:bf16 e8k8:f32; do
    cfg=${spec%%:*}
    dtype=${spec##*:}
    echo "round $round: small-$cfg, $dtype weights" >&2
    "$moeserve" bench --model "benchmarks/configs/small-$cfg.json" --load-format dummy --dtype "$dtype" \
      --kv-dtype bf16 --sweep-batch 1,2,4,8,16,32,64,128,256 --context 128,1024,4000 \
      --hardware "$out/hw_$round.json" --out "$out/sweep_${round}_${cfg}_${dtype}.json" > /dev/null 2>&1
  done
done
python3 clients/python/knee_table.py "$out"/sweep_*.json
