#!/usr/bin/env bash
# Builds moeserve and runs the whole test suite with ctest; exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh
BUILD_DIR=${BUILD_DIR:-build}
cd "$BUILD_DIR"
ctest --output-on-failure -j "${JOBS:-$(nproc)}" --timeout 900
