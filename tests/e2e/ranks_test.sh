#!/usr/bin/env bash
# Parallel ranks give the single rank's tokens: fp32 numerics, greedy, with logprobs, on prompts
# long enough to wrap the window and fill many compressed blocks spread over the ranks.
# Usage: ranks_test.sh DEEPINFER_BINARY shm|mpi
set -euo pipefail
BIN=$1
BACKEND=$2
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export DEEPINFER_CACHE=${DEEPINFER_CACHE:-$WORK/cache}
ARGS=(--num-prompts 6 --input-len 60 --max-tokens 12 --temperature 0 --dtype fp32 --block-size 8
      --logprobs 2)

for preset in tiny tiny-c; do
  MODEL=$WORK/$preset
  "$BIN" make-tiny --out "$MODEL" --preset "$preset" >/dev/null
  "$BIN" generate --model "$MODEL" "${ARGS[@]}" --output "$WORK/single.jsonl" 2>/dev/null
  if [ "$BACKEND" = shm ]; then
    configs=("--cp 2" "--cp 4" "--ep 2" "--ep 4" "--cp 2 --ep 2" "--cp 4 --ep 4" "--dp 2 --ep 2"
             "--dp 2" "--cp 2 --engram-sharding on")
  else
    configs=("2:--cp 2" "4:--cp 4 --ep 4" "2:--dp 2 --ep 2" "4:--ep 4")
  fi
  for c in "${configs[@]}"; do
    rm -f "$WORK/ranks.jsonl"
    if [ "$BACKEND" = shm ]; then
      # shellcheck disable=SC2086
      "$BIN" generate --model "$MODEL" "${ARGS[@]}" $c --output "$WORK/ranks.jsonl" 2>"$WORK/err"
    else
      np=${c%%:*}
      # shellcheck disable=SC2086
      mpirun -np "$np" --allow-run-as-root --oversubscribe -x DEEPINFER_CACHE "$BIN" generate \
        --model "$MODEL" "${ARGS[@]}" ${c#*:} --output "$WORK/ranks.jsonl" 2>"$WORK/err"
    fi
    if ! cmp -s "$WORK/single.jsonl" "$WORK/ranks.jsonl"; then
      echo "FAIL: $preset $BACKEND $c differs from the single rank"
      cat "$WORK/err"
      diff <(head -c 2000 "$WORK/single.jsonl") <(head -c 2000 "$WORK/ranks.jsonl") || true
      exit 1
    fi
    echo "ok: $preset $BACKEND $c"
  done
done
