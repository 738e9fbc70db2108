#!/usr/bin/env bash
# Installs every build and test dependency of moeserve with apt-get.
# Idempotent: when every package is already present it only checks and returns.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build ccache pkg-config git openssl
  libabsl-dev
  libgrpc++-dev libgrpc-dev protobuf-compiler protobuf-compiler-grpc libprotobuf-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  libopenblas-dev
  libxxhash-dev
  libopenmpi-dev openmpi-bin
  nlohmann-json3-dev
  libcli11-dev
  prometheus-cpp-dev
  libcpp-httplib-dev
  libmicrohttpd-dev
  libpcre2-dev libutf8proc-dev libsentencepiece-dev
  python3 python3-grpcio python3-protobuf python3-matplotlib python3-numpy python3-venv
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
else
  echo "setup: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# Python tools from PyPI, pinned, in a virtualenv of the checkout (.venv, git-ignored): the
# official openai SDK, which the HTTP API's end-to-end test drives unchanged.
PY_PACKAGES=(openai==3.54.0)
venv="$(cd "$(dirname "$0")/.." && pwd)/.venv"
if ! "$venv/bin/python" -c "import importlib.metadata as m; import sys; sys.exit(m.version('openai') != '3.54.0')" 2>/dev/null; then
  echo "setup: creating $venv with ${PY_PACKAGES[*]}"
  if ! { /usr/bin/python3 -m venv "$venv" && "$venv/bin/pip" install -q "${PY_PACKAGES[@]}"; }; then
    echo "setup: WARNING: could not install ${PY_PACKAGES[*]} from PyPI; the openai SDK test will be skipped" >&2
  fi
fi
echo "setup: done"
