#!/usr/bin/env bash
# From a fresh Debian 12 machine to a running model: installs the dependencies, builds, and
# generates with the built-in tiny model (created on first use).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
./scripts/build.sh
./build/apps/deepinfer inspect
