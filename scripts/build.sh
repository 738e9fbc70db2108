#!/usr/bin/env bash
# Sets up dependencies, configures (Ninja, Release, ccache when present) and builds moeserve.
# Usage: scripts/build.sh [extra cmake args...]   Environment: BUILD_DIR (default build), JOBS.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
BUILD_DIR=${BUILD_DIR:-build}
JOBS=${JOBS:-$(nproc)}
# ccache keys on relative paths, so another checkout of the same sources (CI's fresh clone)
# reuses this machine's cache.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$(pwd)}
if [ ! -f "$BUILD_DIR/build.ninja" ] || [ $# -gt 0 ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
fi
cmake --build "$BUILD_DIR" -j "$JOBS"
echo "build: $BUILD_DIR/tools/moeserve"
