#!/usr/bin/env bash
# Long soak of a real server: thousands of mixed requests from many threads against a tiny KV
# pool with preemption and swap, then exactly-once, counters, leaks, greedy determinism and RSS
# are checked, and one summary line is printed. Over gRPC (the default,
# tests/server/soak_test.cc) or over the OpenAI HTTP API (`http`, tests/server/http_soak_test.cc:
# completions and chat, streams, clients that leave, two tenants' keys, hostile bodies).
# Usage: benchmarks/soak.sh [grpc|http] [REQUESTS (default 50000; http 20000)] [THREADS (default 32)]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
API=grpc
case "${1:-}" in
  grpc | http) API=$1; shift ;;
esac
[ -x "$BUILD_DIR/tests/e2e_test" ] || scripts/build.sh
if [ "$API" = http ]; then
  MOESERVE_HTTP_SOAK_REQUESTS=${1:-20000} MOESERVE_HTTP_SOAK_THREADS=${2:-32} \
    "$BUILD_DIR/tests/e2e_test" --gtest_filter='E2eHttpSoakTest.*' 2>&1 | grep -E '^http soak:|Failure|Expected|Which is|OK \]|FAILED|request [0-9]'
else
  MOESERVE_SOAK_REQUESTS=${1:-50000} MOESERVE_SOAK_THREADS=${2:-32} \
    "$BUILD_DIR/tests/e2e_test" --gtest_filter='E2eSoakTest.*' 2>&1 | grep -E '^soak:|Failure|Expected|Which is|OK \]|FAILED'
fi
