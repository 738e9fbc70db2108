#!/usr/bin/env bash
# Long soak of a real server (see tests/server/soak_test.cc): thousands of mixed requests from
# many threads against a tiny KV pool with preemption and swap, then exactly-once, counters,
# leaks, greedy determinism and RSS are checked, and one summary line is printed.
# Usage: benchmarks/soak.sh [REQUESTS (default 50000)] [THREADS (default 32)]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
[ -x "$BUILD_DIR/tests/e2e_test" ] || scripts/build.sh
MOESERVE_SOAK_REQUESTS=${1:-50000} MOESERVE_SOAK_THREADS=${2:-32} \
  "$BUILD_DIR/tests/e2e_test" --gtest_filter='E2eSoakTest.*' 2>&1 | grep -E '^soak:|Failure|Expected|Which is|OK \]|FAILED'
