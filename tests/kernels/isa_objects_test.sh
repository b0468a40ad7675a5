#!/usr/bin/env bash
# The kernels compiled once per ISA (src/kernels/*_vec.cpp) must share no symbol that the linker
# could merge: a weak or unique symbol (an inline function, a template instantiation) defined in
# both the AVX2 and the AVX-512 objects may be kept in its AVX-512 form for every caller, which
# breaks AVX2-only machines. Each object may export only its own explicit specializations.
set -euo pipefail
[[ $# -ge 2 ]] || { echo "expected the ISA objects as arguments" >&2; exit 1; }
status=0
for obj in "$@"; do
  syms=$(nm -C "$obj")
  weak=$(grep -E ' [WVu] ' <<<"$syms" || true)
  if [[ -n "$weak" ]]; then
    echo "$obj exports weak symbols:" >&2
    echo "$weak" >&2
    status=1
  fi
done
exit $status
