// Deterministic synthetic checkpoints in the official V4.1 format, for tests and benchmarks.
//
// Presets:
//   tiny    every feature at a few tens of MB: Engram layers, ratio-2 and ratio-1 compressed
//           layers, KV sources and consumers, key owners and index reusers, the candidate-block
//           filter, a window of 8 that wraps; vocab 129280 so the real tokenizer fits.
//   tiny-b  another shape: ratio-2 first, top-1 routing, no SwiGLU clamp, YaRN off, hc_mult 2.
//   tiny-c  ratio 4 (partial groups), no candidate filter, bigram-only Engram on a window layer.
//   small   V4.1-shaped (head_dim 512, 64 experts top-6, 12 layers, dim 2048), ~3 GB, for
//   benchmarks.
// Weights are random, scaled so activations stay O(1), quantized exactly as the release stores
// them (fp8 e4m3 with e8m0 32x32 block scales, packed fp4 experts with per-32 e8m0 scales).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/config.h"

namespace deepinfer {

std::vector<std::string> tiny_preset_names();
// The preset's config. `engram_num_embeddings` is left empty: it depends on the Engram primes
// (computed from the config by the kernels library), which the caller fills in.
ModelConfig tiny_preset_config(const std::string& name);

// A config drawn at random within what the reference accepts (io/config.h's rules): any layer
// pattern of ratios 0/1/2 (window-only layers between compressed ones too), n-gram sizes 2..4,
// o_lora_rank not a multiple of 32 where the group count allows, odd expert counts and top-k,
// dtype bf16 / expert_dtype null now and then (every linear stored unquantized). Small enough for
// the numpy reference to run it in seconds. `engram_num_embeddings` is left empty, as for presets.
ModelConfig random_tiny_config(uint64_t seed);

// Which tensors a synthetic checkpoint stores in which form (both load; checkpoint.h's table).
enum class TinyLayout {
  Release,  // as the release: fp8/fp4 + e8m0 scales (bf16 linears for dtype bf16), BF16 params
  Runtime,  // as the reference holds its state after loading: wo_a BF16, compressor wkv/wgate of
            // ratio > 1 F32 (values not bf16-representable), norms and router gate F32, head BF16
};
TinyLayout parse_tiny_layout(const std::string& name);  // "release" | "runtime"

struct TinyWriteOptions {
  std::string label = "tiny config";  // where the config came from, named by validation errors
  uint64_t seed = 0;
  uint64_t max_shard_bytes = uint64_t(4) << 20;  // split into shards (exercises the index)
  TinyLayout layout = TinyLayout::Release;
  bool dspark = true;  // write the draft head's mtp.* tensors when the config has one
};

// Writes config.json and safetensors shards (+ index) for `config` into `dir` (created; existing
// files of the same names are replaced). Returns the total tensor bytes.
uint64_t write_tiny_checkpoint(const std::string& dir, const ModelConfig& config,
                               const TinyWriteOptions& opt);

}  // namespace deepinfer
