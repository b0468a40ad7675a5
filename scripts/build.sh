#!/usr/bin/env bash
# Configures and builds DeepInfer (Release) into ./build. Extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS="${DEEPINFER_BUILD_JOBS:-2}"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
ninja -C build -j"$JOBS"
