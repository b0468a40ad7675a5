#!/usr/bin/env bash
# Builds a libFuzzer target and runs it for a while.
#   fuzz/run.sh safetensors 600            ten minutes on the safetensors header parser
#   fuzz/run.sh config 180 -jobs=2         further arguments go to libFuzzer
# The build lives in $DEEPINFER_FUZZ_BUILD (default build-fuzz). New inputs are kept in
# <build>/corpus/<target> (the seeds in tests/data/io/fuzz-corpus/<target>, or else
# fuzz/seeds/<target>, are read, never written); a crashing input is saved under
# <build>/artifacts/<target>/ and the exit status is non-zero.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
target=${1:?usage: fuzz/run.sh safetensors|config|request|http|schema|image [seconds] [libFuzzer flags...]}
seconds=${2:-60}
shift $(($# >= 2 ? 2 : 1))
case $target in
  safetensors) max_len=4096 ;;
  config) max_len=8192 ;;  # the seed configs are 1.5 to 3 KB
  request) max_len=16384 ;;  # request bodies (the seeds are under 1 KB)
  http) max_len=4096 ;;  # HTTP/1.1 request streams (the seeds are under 300 bytes)
  schema) max_len=2048 ;;  # JSON schemas (the seeds are under 600 bytes)
  image) max_len=4096 ;;  # PNG, JPEG, GIF and WebP files (the seeds are under 1 KB)
  *) echo "unknown fuzz target '$target' (safetensors, config, request, http, schema or image)" >&2; exit 2 ;;
esac

build=${DEEPINFER_FUZZ_BUILD:-$root/build-fuzz}
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
    -DDEEPINFER_FUZZ=ON -DDEEPINFER_BUILD_TESTS=OFF -DDEEPINFER_BUILD_BENCH=OFF
fi
ninja -C "$build" -j2 "${target}_fuzz"

corpus=$build/corpus/$target
artifacts=$build/artifacts/$target/
mkdir -p "$corpus" "$artifacts"
flags=(-max_len="$max_len" -max_total_time="$seconds" -artifact_prefix="$artifacts"
       -print_final_stats=1)
if [ -f "$root/fuzz/$target.dict" ]; then flags+=(-dict="$root/fuzz/$target.dict"); fi
# Later flags override earlier ones, so the caller's come last.
seeds=$root/tests/data/io/fuzz-corpus/$target
if [ ! -d "$seeds" ]; then seeds=$root/fuzz/seeds/$target; fi
exec "$build/fuzz/${target}_fuzz" "${flags[@]}" "$@" "$corpus" "$seeds"
