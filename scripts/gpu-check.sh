#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds with CUDA, runs the GPU tests (every CUDA op against the
# CPU reference, the engine's greedy output on the GPU against the CPU backend's, NCCL and the
# --ep/--pp executor over NCCL with two or more GPUs), then a decode sweep on the GPU against the matching roofline preset, printing
# the achieved HBM bandwidth and FLOP/s as fractions of peak. Output also in gpu-check/.
# Usage: scripts/gpu-check.sh [--quick]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-check}
mkdir -p "$OUT"
nvidia-smi | tee "$OUT/nvidia-smi.txt"
BUILD_DIR=${BUILD_DIR:-build} scripts/build.sh -DMOESERVE_CUDA=ON
BUILD_DIR=${BUILD_DIR:-build}
"$BUILD_DIR/tests/cuda_test" 2>&1 | tee "$OUT/cuda_test.txt"
"$BUILD_DIR/tests/parallel_test" 2>&1 | tee "$OUT/parallel_test.txt"
# NCCL ranks of the executor (--ep/--pp, one GPU each) against one CPU rank; skips below 2 GPUs.
"$BUILD_DIR/tests/engine_test" --gtest_filter='*Nccl*' 2>&1 | tee "$OUT/nccl_executor_test.txt"
# KV tiers through pinned memory and the copy stream, byte for byte.
"$BUILD_DIR/tests/engine_test" --gtest_filter='KvTiersCopyTest.*' 2>&1 | tee "$OUT/kv_tiers_gpu_test.txt"
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$name" in
  *H200*) preset=h200 ;;
  *B200*) preset=b200 ;;
  *) preset=h100-sxm ;;
esac
batches=1,2,4,8,16,32,64,128,256
[ "${1:-}" = "--quick" ] && batches=1,8,64
"$BUILD_DIR/tools/moeserve" bench --backend cuda --preset medium --dtype bf16 --kv-dtype bf16 \
  --hardware "$preset" --sweep-batch "$batches" --context 128,1024 --out "$OUT/sweep.json" \
  2>&1 | tee "$OUT/sweep.txt"
python3 - "$OUT/sweep.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
print("batch context  step_ms  HBM fraction  FLOP/s fraction")
for p in j.get("points", []):
    print(f"{p.get('batch'):5} {p.get('context'):7} {1e3 * p.get('observed_s', 0):8.3f} "
          f"{p.get('achieved_bandwidth_fraction', 0):13.3f} {p.get('achieved_flops_fraction', 0):16.3f}")
PY
