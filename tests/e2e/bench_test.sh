#!/usr/bin/env bash
# `deepinfer bench` as a user runs it, at small sizes: every subcommand prints, per result, the
# measured figure, the limit measured in the same run (alternated with it, in pairs) and the
# median of the pairs' ratios with their spread (JSON lines), and bad arguments get clear errors. The figures themselves are not checked (this machine is shared).
# Usage: bench_test.sh DEEPINFER_BINARY
set -euo pipefail
BIN=$1
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
export DEEPINFER_NUM_THREADS=2

"$BIN" make-tiny --out "$WORK/tiny" >/dev/null || fail "make-tiny"
"$BIN" bench bandwidth --mib 64 --reps 1 --json > "$WORK/bw.jsonl" || fail "bench bandwidth"
"$BIN" bench linear --formats fp8,fp4,bf16 --shapes 256:512,512:96 --rows 16 --working-set-mib 8 \
  --pairs 2 --json \
  > "$WORK/linear.jsonl" 2>"$WORK/linear.err" || { cat "$WORK/linear.err"; fail "bench linear"; }
"$BIN" bench decode --model "$WORK/tiny" --batches 1,4 --steps 2 --pairs 3 --prompt 16 --prefill 32 \
  --speculative 3 --spec-tokens 8 --json \
  > "$WORK/decode.jsonl" 2>"$WORK/decode.err" || { cat "$WORK/decode.err"; fail "bench decode"; }
"$BIN" bench pool --calls 50 --json > "$WORK/pool.jsonl" || fail "bench pool"
"$BIN" make-tiny --out "$WORK/vis" --vision >/dev/null || fail "make-tiny --vision"
"$BIN" bench vision --model "$WORK/vis" --pairs 2 --json > "$WORK/vision.jsonl" \
  2>"$WORK/vision.err" || { cat "$WORK/vision.err"; fail "bench vision"; }
"$BIN" bench prefix-cache --model "$WORK/tiny" --prefix 130 --suffix 5 --pairs 2 --json \
  > "$WORK/prefix.jsonl" 2>"$WORK/prefix.err" || { cat "$WORK/prefix.err"; fail "bench prefix-cache"; }

python3 - "$WORK" <<'PY' || fail "bench output"
import json, sys, os
w = sys.argv[1]
def paired(r, fig, lim, pairs):
    # The ratio is the median of the pairs' figure / limit; the medians of figure and limit are
    # printed too, each rounded.
    assert r["pairs"] == pairs and r[fig] > 0 and r[lim] > 0, r
    assert 0 < r["ratio_min"] <= r["ratio"] <= r["ratio_max"], r
    if pairs == 1:
        assert abs(r["ratio"] - r[fig] / r[lim]) <= 0.02 * r["ratio"] + 0.01, r
def rows(name):
    return [json.loads(l) for l in open(os.path.join(w, name)) if l.strip()]
bw = rows("bw.jsonl")
assert len(bw) == 1 and bw[0]["bench"] == "bandwidth" and bw[0]["read_gbs"] > 0, bw
lin = rows("linear.jsonl")
gemv = [r for r in lin if r["bench"] == "linear_gemv"]
gemm = [r for r in lin if r["bench"] == "linear_gemm"]
# fp8, fp4 and bf16, two shapes, one GEMV and one GEMM row count each.
assert len(gemv) == 6 and len(gemm) == 6, lin
assert sorted({r["format"] for r in lin if "format" in r}) == ["bf16", "fp4", "fp8"], lin
for r in gemv:
    paired(r, "gbs", "limit_gbs", 2)
for r in gemm:
    assert r["rows"] == 16 and r["gflops"] > 0, r
    if "onednn_bf16_gflops" in r:
        paired(r, "gflops", "onednn_bf16_gflops", 2)
        # (The ratio is printed to 3 decimals, so 1/ratio is known to within
        # 0.0005/(ratio·(ratio - 0.0005)): large when a loaded machine makes the ratio small.)
        q = r["ratio"]
        if q > 0.001:
            tol = 0.01 + 0.0005 / (q * (q - 0.0005))
            assert abs(r["invariance_cost"] - (1 / q - 1)) < tol, r
dec = rows("decode.jsonl")
steps = [r for r in dec if r["bench"] == "decode"]
assert [r["batch"] for r in steps] == [1, 4], dec
for r in steps:
    paired(r, "tok_s", "roofline_tok_s", 3)
    assert r["roofline_bytes"] > 0 and r["limit_gbs"] > 0 and r["ms_per_step"] > 0, r
pre = [r for r in dec if r["bench"] == "prefill"]
assert len(pre) == 1 and pre[0]["tokens"] == 32 and pre[0]["gflops"] > 0, dec
if "flop_limit_gflops" in pre[0]:
    paired(pre[0], "gflops", "flop_limit_gflops", 3)
pre = rows("prefix.jsonl")
assert len(pre) == 1 and pre[0]["bench"] == "prefix_cache", pre
paired(pre[0], "cold_ttft_s", "cached_ttft_s", 2)
# Blocks of 64: the cached request resumes after the prefix's two whole blocks.
assert pre[0]["hit_tokens_per_request"] == 128, pre
spec = [r for r in dec if r["bench"] == "speculative"]
assert [r["batch"] for r in spec] == [1, 4], dec
for r in spec:
    paired(r, "forced_tok_s", "plain_tok_s", 3)
    assert r["drafts"] == 3 and r["verify_bytes_ratio"] >= 1 and r["ngram_tok_s"] > 0, r
    assert r["ngram_acceptance_length"] >= 1, r
    assert r["verify_time_ratio"] > 0, r
    # The bench model is the tiny preset, which has a draft head.
    assert r["dspark_tok_s"] > 0 and r["dspark_acceptance_length"] >= 1, r
vis = rows("vision.jsonl")
# make-tiny --vision: at most 64 image tokens, so a 7 x 7 token grid (58 tokens) of 21 x 21 patches.
assert len(vis) == 1 and vis[0]["patches"] == 441 and vis[0]["image_tokens"] == 58, vis
assert vis[0]["gflop"] > 0 and vis[0]["s"] > 0, vis
if "flop_limit_gflops" in vis[0]:
    paired(vis[0], "gflops", "flop_limit_gflops", 2)
pool = rows("pool.jsonl")
assert len(pool) == 1 and pool[0]["us_per_parallel_for"] > 0, pool
PY

expect_error() {
  local want=$1
  shift
  if "$@" >"$WORK/out" 2>&1; then fail "expected an error from: $*"; fi
  grep -q -- "$want" "$WORK/out" || { cat "$WORK/out"; fail "error lacks '$want': $*"; }
}
expect_error "not a multiple of 32" "$BIN" bench linear --shapes 100:64
expect_error "expected at least 1" "$BIN" bench linear --pairs 0
expect_error "must be positive" "$BIN" bench decode --model "$WORK/tiny" --pairs 0
expect_error "expected at least 64" "$BIN" bench bandwidth --mib 0
expect_error "must be >= 1" "$BIN" bench prefix-cache --model "$WORK/tiny" --suffix 0
expect_error "does not exist" "$BIN" bench decode --model "$WORK/nowhere"
expect_error "has no vision tower" "$BIN" bench vision --model "$WORK/tiny"
echo "bench e2e: ok"
