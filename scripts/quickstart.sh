#!/usr/bin/env bash
# From a fresh Debian 12 machine to a running model: installs the dependencies, builds, and
# generates with the built-in tiny model (created on first use in ~/.cache/deepinfer).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
./build/apps/deepinfer generate --prompt-ids 1,2,3,4,5 --max-tokens 16 --temperature 0 --logprobs 2
