#!/usr/bin/env bash
# Packs this machine's CUDA build for a GPU host that lacks the build's Debian packages (gRPC,
# abseil, OpenBLAS, Open MPI): the binaries scripts/gpu-check.sh runs, and every shared library
# they load except the C library and CUDA's own (the GPU host brings cuBLAS, the runtime and
# NCCL). Glibc here must be no newer than there. Usage: scripts/gpu-bundle.sh [OUT.tar.xz]
# On the GPU host: tar xJf OUT.tar.xz && GPU_BUNDLE=gpu-bundle scripts/gpu-check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
OUT=${1:-gpu-bundle.tar.xz}
[ -x "$BUILD_DIR/tests/cuda_test" ] && ldd "$BUILD_DIR/tests/cuda_test" | grep -q libcudart ||
  { echo "gpu-bundle: $BUILD_DIR is not a CUDA build (configure with -DMOESERVE_CUDA=ON)" >&2; exit 1; }
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/gpu-bundle/bin" "$stage/gpu-bundle/lib"
# models_test and kernels_bench: GPU hosts are often Xeons with AMX tiles, rare on our machines.
bins=("$BUILD_DIR/tests/cuda_test" "$BUILD_DIR/tests/parallel_test" "$BUILD_DIR/tests/engine_test"
      "$BUILD_DIR/tests/kernels_test" "$BUILD_DIR/tests/models_test"
      "$BUILD_DIR/benchmarks/kernels_bench" "$BUILD_DIR/tools/moeserve")
for b in "${bins[@]}"; do strip --strip-debug -o "$stage/gpu-bundle/bin/$(basename "$b")" "$b"; done
# The C library, the loader and CUDA's libraries come from the GPU host.
ldd "${bins[@]}" | awk '/=>/ {print $3}' | sort -u |
  grep -vE '/(libc|libm|libpthread|libdl|librt|libcuda|libcublas|libcublasLt|libcudart|libnccl)\.so|ld-linux' |
  while read -r lib; do cp -L "$lib" "$stage/gpu-bundle/lib/"; done
tar -C "$stage" -cJf "$OUT" gpu-bundle
echo "gpu-bundle: $OUT ($(du -h "$OUT" | cut -f1))"
