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

# Data-parallel replicas receive every sampling field of a request: seeded sampling with
# penalties, stop ids, logprobs, and a request the front refuses, against one rank.
MODEL=$WORK/tiny
cat > "$WORK/fields.jsonl" <<'JSONL'
{"prompt_ids": [5, 6, 7, 8], "max_tokens": 9, "temperature": 0.8, "top_p": 0.9, "seed": 11, "logprobs": 3}
{"prompt_ids": [9, 10], "max_tokens": 7, "temperature": 1.2, "top_k": 40, "min_p": 0.05, "seed": 3, "repetition_penalty": 1.3, "presence_penalty": 0.5, "frequency_penalty": 0.25}
{"prompt_ids": [11, 12, 13], "max_tokens": 30, "temperature": 0, "stop_token_ids": [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]}
{"prompt_ids": [14], "max_tokens": 0}
{"prompt_ids": [15, 16, 17, 18, 19], "max_tokens": 6, "temperature": 0.5, "seed": 99, "ignore_eos": true, "logprobs": 1}
JSONL
"$BIN" generate --model "$MODEL" --dtype fp32 --prompts "$WORK/fields.jsonl" \
  --output "$WORK/single.jsonl" 2>/dev/null || true
for c in "--dp 2" "--dp 2 --ep 2"; do
  rm -f "$WORK/ranks.jsonl"
  if [ "$BACKEND" = shm ]; then
    # shellcheck disable=SC2086
    "$BIN" generate --model "$MODEL" --dtype fp32 --prompts "$WORK/fields.jsonl" $c \
      --output "$WORK/ranks.jsonl" 2>"$WORK/err" || true
  else
    # shellcheck disable=SC2086
    mpirun -np 2 --allow-run-as-root --oversubscribe -x DEEPINFER_CACHE "$BIN" generate \
      --model "$MODEL" --dtype fp32 --prompts "$WORK/fields.jsonl" $c \
      --output "$WORK/ranks.jsonl" 2>"$WORK/err" || true
  fi
  if [ "$(wc -l < "$WORK/single.jsonl")" -ne 5 ] || ! cmp -s "$WORK/single.jsonl" "$WORK/ranks.jsonl"; then
    echo "FAIL: sampling fields over $BACKEND $c differ from the single rank"
    cat "$WORK/err"
    diff "$WORK/single.jsonl" "$WORK/ranks.jsonl" || true
    exit 1
  fi
  echo "ok: sampling fields $BACKEND $c"
done

# Prefix caching over ranks: prompts sharing prefixes (one sequence at a time, so later ones hit
# what earlier ones left) give the single rank's tokens computed without the cache; with context
# parallelism the cached blocks and snapshots are spread over the ranks.
python3 - "$WORK/shared.jsonl" <<'PY'
import json, random, sys
random.seed(5)
base = [random.randrange(3, 129000) for _ in range(90)]
lines = [base] + [base[:k] + [random.randrange(3, 129000) for _ in range(1 + k % 7)]
                  for k in (90, 81, 64, 47, 33, 16, 9)]
with open(sys.argv[1], "w") as f:
    for p in lines:
        f.write(json.dumps({"prompt_ids": p, "max_tokens": 5, "temperature": 0, "logprobs": 2}) + "\n")
PY
SHARED=(--model "$WORK/tiny" --dtype fp32 --block-size 8 --max-num-seqs 1 --prompts "$WORK/shared.jsonl")
"$BIN" generate "${SHARED[@]}" --no-prefix-caching --output "$WORK/single.jsonl" 2>/dev/null
if [ "$BACKEND" = shm ]; then
  configs=("1:" "2:--cp 2" "2:--cp 2 --ep 2" "2:--dp 2 --ep 2")
else
  configs=("2:--cp 2" "2:--dp 2 --ep 2")
fi
for c in "${configs[@]}"; do
  rm -f "$WORK/ranks.jsonl"
  if [ "$BACKEND" = shm ]; then
    # shellcheck disable=SC2086
    "$BIN" generate "${SHARED[@]}" ${c#*:} --output "$WORK/ranks.jsonl" 2>"$WORK/err"
  else
    # shellcheck disable=SC2086
    mpirun -np "${c%%:*}" --allow-run-as-root --oversubscribe -x DEEPINFER_CACHE "$BIN" generate \
      "${SHARED[@]}" ${c#*:} --output "$WORK/ranks.jsonl" 2>"$WORK/err"
  fi
  if ! cmp -s "$WORK/single.jsonl" "$WORK/ranks.jsonl"; then
    echo "FAIL: prefix caching over $BACKEND '${c#*:}' differs from the cold single rank"
    cat "$WORK/err"
    exit 1
  fi
  case "$c" in *--dp*) ;; *)
    grep -Eq "prefix cache [1-9][0-9]* hits" "$WORK/err" || { cat "$WORK/err"; echo "FAIL: no hits ($c)"; exit 1; } ;;
  esac
  echo "ok: prefix caching $BACKEND ${c#*:}"
done

# Speculative decoding over ranks give the single rank's plain tokens and logprobs, the followers
# replaying the drafts, backups and rollbacks: n-gram drafts (tiny-c's small vocabulary repeats
# itself, but its drafts are rarely right), then drafts from the plain run's output with every
# seventh token changed (most accepted, some rejected).
SPEC=(--model "$WORK/tiny-c" --max-tokens 40 --temperature 0 --dtype fp32 --block-size 8
      --logprobs 2)
"$BIN" generate "${SPEC[@]}" --num-prompts 6 --input-len 60 --output "$WORK/single.jsonl" 2>/dev/null
python3 - "$WORK/single.jsonl" "$WORK/drafts.jsonl" <<'PY'
import json, sys
with open(sys.argv[2], "w") as f:
    for l in open(sys.argv[1]):
        r = json.loads(l)
        ref = [t if i % 7 != 3 else (t + 1) % 2048 for i, t in enumerate(r["output_ids"])]
        f.write(json.dumps({"prompt_ids": r["prompt_ids"], "draft_reference": ref}) + "\n")
PY
if [ "$BACKEND" = shm ]; then
  configs=("1:" "2:--cp 2" "2:--cp 2 --ep 2" "2:--dp 2 --ep 2")
else
  configs=("2:--cp 2 --ep 2")
fi
# n-gram drafts, then the DSpark draft head's (run by the scheduling rank whatever the layout).
for method in ngram dspark; do
for input in "--num-prompts 6 --input-len 60" "--prompts $WORK/drafts.jsonl"; do
  for c in "${configs[@]}"; do
    rm -f "$WORK/ranks.jsonl"
    # shellcheck disable=SC2086
    if [ "$BACKEND" = shm ]; then
      "$BIN" generate "${SPEC[@]}" $input ${c#*:} --speculative-method "$method" \
        --output "$WORK/ranks.jsonl" 2>"$WORK/err"
    else
      mpirun -np "${c%%:*}" --allow-run-as-root --oversubscribe -x DEEPINFER_CACHE "$BIN" generate \
        "${SPEC[@]}" $input ${c#*:} --speculative-method "$method" --output "$WORK/ranks.jsonl" \
        2>"$WORK/err"
    fi
    python3 - "$WORK/single.jsonl" "$WORK/ranks.jsonl" "$input" <<'PY' || { cat "$WORK/err"; echo "FAIL: speculative $method $BACKEND ${c#*:} $input"; exit 1; }
import json, sys
plain = [json.loads(l) for l in open(sys.argv[1])]
spec = [json.loads(l) for l in open(sys.argv[2])]
drafted = sum(r.pop("drafted_tokens") for r in spec)
accepted = sum(r.pop("accepted_tokens") for r in spec)
assert plain == spec, "outputs differ"
assert drafted > 0, "no drafts"
if "--prompts" in sys.argv[3]:
    assert 0 < accepted < drafted, (accepted, drafted)
PY
    echo "ok: speculative $method $BACKEND ${c#*:} ${input%% *}"
  done
done
done
