#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: builds with CUDA, runs the GPU tests (every CUDA op against the
# CPU reference, the engine's greedy output on the GPU against the CPU backend's, NCCL and the
# --ep/--pp executor over NCCL with two or more GPUs), then a decode sweep on the GPU against the matching roofline preset, printing
# the achieved HBM bandwidth and FLOP/s as fractions of peak. Output also in gpu-check/.
# Usage: scripts/gpu-check.sh [--quick]
# On a GPU host without the build's Debian packages, run from a bundle that scripts/gpu-bundle.sh
# made on a machine with them: GPU_BUNDLE=path/to/gpu-bundle scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-check}
mkdir -p "$OUT"
nvidia-smi | tee "$OUT/nvidia-smi.txt"
if [ -n "${GPU_BUNDLE:-}" ]; then
  TESTS=$GPU_BUNDLE/bin
  TOOLS=$GPU_BUNDLE/bin
  # The bundle's libraries, then CUDA's (the toolkit's or the Python wheels') from this host.
  cuda_dirs=$(find /usr/local /opt /usr/lib -name 'libcublas.so.*' -o -name 'libcudart.so.*' \
              -o -name 'libnccl.so.*' 2>/dev/null | xargs -r -n1 dirname | sort -u | paste -sd:)
  export LD_LIBRARY_PATH=$GPU_BUNDLE/lib:$cuda_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
else
  BUILD_DIR=${BUILD_DIR:-build} scripts/build.sh -DMOESERVE_CUDA=ON
  TESTS=${BUILD_DIR:-build}/tests
  TOOLS=${BUILD_DIR:-build}/tools
fi
# Every step runs even when one fails; the script fails at the end naming which did.
failed=()
step() { local log=$1; shift; "$@" 2>&1 | tee "$OUT/$log" || failed+=("$log"); }
step cuda_test.txt "$TESTS/cuda_test"
# The host CPU's kernel variants against float64 (GPU hosts are often Xeons with AMX tiles).
step kernels_test.txt "$TESTS/kernels_test"
step parallel_test.txt "$TESTS/parallel_test"
# NCCL ranks of the executor (--ep/--pp, one GPU each) against one CPU rank; skips below 2 GPUs.
step nccl_executor_test.txt "$TESTS/engine_test" --gtest_filter='*Nccl*'
# KV tiers through pinned memory and the copy stream, byte for byte.
step kv_tiers_gpu_test.txt "$TESTS/engine_test" --gtest_filter='KvTiersCopyTest.*'
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$name" in
  *H200*) preset=h200 ;;
  *B200*) preset=b200 ;;
  *) preset=h100-sxm ;;
esac
batches=1,2,4,8,16,32,64,128,256
[ "${1:-}" = "--quick" ] && batches=1,8,64
rm -f "$OUT/sweep.json"  # a failed sweep must not print an earlier run's
step sweep.txt "$TOOLS/moeserve" bench --backend cuda --preset medium --dtype bf16 --kv-dtype bf16 \
  --hardware "$preset" --sweep-batch "$batches" --context 128,1024 --out "$OUT/sweep.json"
if [ -f "$OUT/sweep.json" ] && ! python3 - "$OUT/sweep.json" <<'PY'
import json, sys
j = json.load(open(sys.argv[1]))
print("batch context  step_ms  HBM fraction  FLOP/s fraction")
for p in j.get("points", []):
    print(f"{p.get('batch'):5} {p.get('context'):7} {1e3 * p.get('observed_s', 0):8.3f} "
          f"{p.get('achieved_bandwidth_fraction', 0):13.3f} {p.get('achieved_flops_fraction', 0):16.3f}")
PY
then
  failed+=(sweep-summary)
fi
if [ ${#failed[@]} -gt 0 ]; then
  echo "gpu-check: failed: ${failed[*]}" >&2
  exit 1
fi
echo "gpu-check: every step passed"
