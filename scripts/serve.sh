#!/usr/bin/env bash
# Quick start: sets up, builds, and serves the embedded default model over gRPC on
# 127.0.0.1:50051 (moeserve.v1.Moeserve, health and reflection) and the OpenAI-compatible HTTP
# API on 127.0.0.1:8000 (/v1/completions, /v1/chat/completions, ...). Ctrl-C drains and stops it.
# Extra arguments go to `moeserve serve` (try --help), e.g. --listen 0.0.0.0:50051.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build.sh >&2
exec build/tools/moeserve serve "$@"
