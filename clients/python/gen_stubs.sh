#!/usr/bin/env bash
# Generates the Python gRPC stubs of server/proto/moeserve.proto into clients/python/gen/
# (moeserve_pb2.py, moeserve_pb2_grpc.py) with protoc and grpc_python_plugin from apt.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$here/../.."
mkdir -p "$here/gen"
protoc --proto_path="$root/server/proto" --python_out="$here/gen" --grpc_out="$here/gen" \
  --plugin=protoc-gen-grpc="$(command -v grpc_python_plugin)" "$root/server/proto/moeserve.proto"
echo "gen_stubs: wrote $here/gen/moeserve_pb2.py and moeserve_pb2_grpc.py"
