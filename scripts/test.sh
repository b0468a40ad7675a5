#!/usr/bin/env bash
# From a fresh Debian 12 machine to a passing test suite: installs the dependencies (Debian
# packages, and the npm packages the tests compare against), builds, and runs every test.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
if [ -f tests/tokenizer/package-lock.json ]; then
  npm ci --prefix tests/tokenizer --no-audit --no-fund --loglevel=error
fi
npm ci --prefix tests/server --no-audit --no-fund --loglevel=error
./scripts/build.sh
# Tests share the built-in model cache inside the build tree, so runs do not touch $HOME.
export DEEPINFER_CACHE="$PWD/build/cache"
ctest --test-dir build --output-on-failure -j"${DEEPINFER_TEST_JOBS:-2}" "$@"
