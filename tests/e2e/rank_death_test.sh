#!/usr/bin/env bash
# A follower that dies makes the leader exit with a clear error within seconds; no process is left.
# Usage: rank_death_test.sh DEEPINFER_BINARY
set -euo pipefail
BIN=$1
WORK=$(mktemp -d)
export DEEPINFER_CACHE=${DEEPINFER_CACHE:-$WORK/cache}
"$BIN" make-tiny --out "$WORK/tiny" >/dev/null
"$BIN" generate --model "$WORK/tiny" --cp 2 --num-prompts 400 --input-len 60 --max-tokens 200 \
  --ignore-eos --output "$WORK/out.jsonl" 2>"$WORK/err" &
LEADER=$!
cleanup() { kill -9 "$LEADER" 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT
FOLLOWER=""
for _ in $(seq 1 200); do
  FOLLOWER=$(pgrep -P "$LEADER" -f "deepinfer" | head -1 || true)
  [ -n "$FOLLOWER" ] && grep -q "ranks" "$WORK/err" && break
  sleep 0.1
done
[ -n "$FOLLOWER" ] || { echo "FAIL: no follower appeared"; cat "$WORK/err"; exit 1; }
sleep 1
kill -9 "$FOLLOWER"
START=$(date +%s.%N)
STATUS=0
timeout 20 tail --pid="$LEADER" -f /dev/null || { echo "FAIL: the leader did not exit"; exit 1; }
wait "$LEADER" || STATUS=$?
ELAPSED=$(echo "$(date +%s.%N) - $START" | bc)
[ "$STATUS" -ne 0 ] || { echo "FAIL: the leader exited with status 0"; exit 1; }
grep -q "rank 1 (pid $FOLLOWER)" "$WORK/err" || { echo "FAIL: no clear error"; cat "$WORK/err"; exit 1; }
if pgrep -f "$WORK/tiny" >/dev/null; then echo "FAIL: processes left behind"; exit 1; fi
echo "ok: leader exited with status $STATUS after ${ELAPSED}s: $(grep 'rank 1' "$WORK/err")"
awk -v t="$ELAPSED" 'BEGIN { exit !(t < 5) }' || { echo "FAIL: took ${ELAPSED}s"; exit 1; }
