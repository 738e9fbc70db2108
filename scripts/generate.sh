#!/usr/bin/env bash
# Quick start: sets up, builds, and runs `moeserve generate` on the embedded default model.
# Extra arguments go to `moeserve generate` (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh >&2
exec build/tools/moeserve generate "$@"
