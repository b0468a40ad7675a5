#include "io/tiny.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/checkpoint.h"
#include "io/safetensors.h"

namespace deepinfer {

namespace fs = std::filesystem;

// --- presets ---

namespace {

// Each preset's config.json (reference keys); keys not listed keep ModelConfig's defaults.
const std::pair<const char*, const char*> kPresets[] = {
    {"tiny", R"({"vocab_size": 129280, "dim": 64, "moe_inter_dim": 32, "n_layers": 8, "n_heads": 4,
      "n_routed_experts": 8, "n_activated_experts": 2, "route_scale": 1.5, "swiglu_limit": 10.0,
      "q_lora_rank": 64, "head_dim": 64, "rope_head_dim": 16, "o_groups": 2, "o_lora_rank": 32,
      "window_size": 8, "compress_ratios": [0, 0, 2, 2, 1, 1, 1, 1], "kv_source_layers": [2, 4],
      "index_source_layers": [2, 4, 6], "compress_rope_theta": 160000, "original_seq_len": 256,
      "rope_factor": 4, "index_n_heads": 4, "index_head_dim": 32, "index_topk": 4,
      "candidate_source_layer": 4, "candidate_topk_blocks": 3, "candidate_block_size": 2,
      "hc_mult": 4, "hc_sinkhorn_iters": 20, "engram_layer_ids": [1, 4],
      "engram_max_ngram_size": 3, "engram_vocab_size": 1000, "engram_n_heads": 2,
      "engram_head_dim": 32, "n_mtp_layers": 2, "dspark_block_size": 4,
      "dspark_noise_token_id": 128799, "dspark_target_layer_ids": [5, 6, 7],
      "dspark_markov_rank": 32, "dspark_n_routed_experts": 6, "dspark_n_activated_experts": 2})"},
    {"tiny-b", R"({"vocab_size": 1000, "dim": 96, "moe_inter_dim": 64, "n_layers": 6, "n_heads": 2,
      "n_routed_experts": 4, "n_activated_experts": 1, "route_scale": 2.0, "swiglu_limit": 0.0,
      "q_lora_rank": 32, "head_dim": 32, "rope_head_dim": 8, "o_groups": 1, "o_lora_rank": 32,
      "window_size": 5, "compress_ratios": [2, 2, 0, 1, 1, 1], "kv_source_layers": [0, 3],
      "index_source_layers": [0, 3, 5], "compress_rope_theta": 50000, "original_seq_len": 0,
      "rope_factor": 1, "index_n_heads": 2, "index_head_dim": 32, "index_topk": 3,
      "candidate_source_layer": 3, "candidate_topk_blocks": 2, "candidate_block_size": 3,
      "hc_mult": 2, "hc_sinkhorn_iters": 5, "engram_layer_ids": [0, 3],
      "engram_max_ngram_size": 4, "engram_vocab_size": 500, "engram_n_heads": 3,
      "engram_head_dim": 64})"},
    {"tiny-c", R"({"vocab_size": 2048, "dim": 64, "moe_inter_dim": 32, "n_layers": 5, "n_heads": 8,
      "n_routed_experts": 16, "n_activated_experts": 4, "route_scale": 1.0, "swiglu_limit": 7.0,
      "q_lora_rank": 32, "head_dim": 64, "rope_head_dim": 32, "o_groups": 4, "o_lora_rank": 32,
      "window_size": 16, "compress_ratios": [4, 4, 0, 4, 4], "kv_source_layers": [0],
      "index_source_layers": [0, 3], "compress_rope_theta": 40000, "original_seq_len": 128,
      "rope_factor": 8, "index_n_heads": 3, "index_head_dim": 64, "index_topk": 6,
      "candidate_source_layer": -1, "hc_mult": 3, "hc_sinkhorn_iters": 10,
      "engram_layer_ids": [2], "engram_max_ngram_size": 2, "engram_vocab_size": 3000,
      "engram_n_heads": 1, "engram_head_dim": 32, "engram_pad_id": 0, "n_mtp_layers": 1,
      "dspark_block_size": 3, "dspark_noise_token_id": 2000, "dspark_target_layer_ids": [3, 4],
      "dspark_markov_rank": 32})"},
    {"small", R"({"vocab_size": 129280, "dim": 2048, "moe_inter_dim": 768, "n_layers": 12,
      "n_heads": 16, "n_routed_experts": 64, "n_activated_experts": 6, "route_scale": 1.5,
      "swiglu_limit": 10.0, "q_lora_rank": 768, "head_dim": 512, "rope_head_dim": 64,
      "o_groups": 4, "o_lora_rank": 512, "window_size": 128,
      "compress_ratios": [0, 0, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1], "kv_source_layers": [2, 6],
      "index_source_layers": [2, 6, 8, 10], "compress_rope_theta": 160000,
      "original_seq_len": 65536, "rope_factor": 16, "index_n_heads": 16, "index_head_dim": 128,
      "index_topk": 512, "candidate_source_layer": 6, "candidate_topk_blocks": 128,
      "candidate_block_size": 8, "hc_mult": 4, "hc_sinkhorn_iters": 20,
      "engram_layer_ids": [1, 6], "engram_max_ngram_size": 3, "engram_vocab_size": 100000,
      "engram_n_heads": 4, "engram_head_dim": 128, "n_mtp_layers": 3, "dspark_block_size": 5,
      "dspark_noise_token_id": 128799, "dspark_target_layer_ids": [9, 10, 11],
      "dspark_markov_rank": 256, "dspark_n_routed_experts": 32, "dspark_n_activated_experts": 3})"},
};

// The random stream of random configs and weights.
uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

}  // namespace

std::vector<std::string> tiny_preset_names() {
  std::vector<std::string> names;
  for (const auto& [name, json] : kPresets) names.push_back(name);
  return names;
}

ModelConfig tiny_preset_config(const std::string& name) {
  for (const auto& [n, json] : kPresets) {
    if (n != name) continue;
    // Not validated here: engram_num_embeddings is still empty.
    ModelConfig c = ModelConfig::parse(json, "preset " + name, /*validate=*/false);
    c.engram_compressed_vocab_size = c.vocab_size;  // identity token map (no tokenizer)
    c.compress_ratios.resize(size_t(c.n_layers + c.n_mtp_layers), 0);
    return c;
  }
  std::string names;
  for (const auto& n : tiny_preset_names()) names += (names.empty() ? "" : ", ") + n;
  throw Error(str_cat("unknown preset '", name, "' (expected one of: ", names, ")"));
}

// --- random configs ---

ModelConfig random_tiny_config(uint64_t seed) {
  uint64_t st = seed * 0x2545f4914f6cdd1dull + 0x51ed27;
  auto pick = [&](int64_t lo, int64_t hi) {  // uniform in [lo, hi]
    return lo + int64_t(splitmix64(st) % uint64_t(hi - lo + 1));
  };
  ModelConfig c = tiny_preset_config("tiny");  // fixed constants (eps, score function, ...)
  c.vocab_size = pick(300, 1500);
  c.dim = 32 * pick(1, 3);
  c.moe_inter_dim = 32 * pick(1, 2);
  c.q_lora_rank = 32 * pick(1, 2);
  c.head_dim = 32 * pick(1, 3);
  c.index_head_dim = 32 * pick(1, 2);
  c.rope_head_dim = 2 * pick(1, std::min(c.head_dim, c.index_head_dim) / 4);
  c.n_heads = int(pick(1, 4));
  if (pick(0, 1)) c.n_heads = 4;
  // o_groups divides n_heads; o_groups * o_lora_rank is a multiple of 32, o_lora_rank alone need
  // not be (with 2 or 4 groups it usually is not).
  std::vector<int> divisors;
  for (int g = 1; g <= c.n_heads; ++g)
    if (c.n_heads % g == 0) divisors.push_back(g);
  // Even group counts most of the time, so that o_lora_rank need only be a multiple of 16 or 8.
  c.o_groups = pick(0, 2) && c.n_heads % 2 == 0
                   ? (c.n_heads % 4 == 0 ? 4 : 2)
                   : divisors[size_t(pick(0, int64_t(divisors.size()) - 1))];
  const int64_t step = 32 / std::gcd<int64_t>(c.o_groups, 32);
  c.o_lora_rank = step * pick(1, std::max<int64_t>(1, 64 / step));
  c.n_routed_experts = int(pick(2, 9));
  c.n_activated_experts = int(pick(1, std::min(c.n_routed_experts, 4)));
  c.route_scale = double(pick(5, 25)) / 10;
  c.swiglu_limit = pick(0, 1) ? double(pick(3, 12)) : 0.0;
  c.window_size = int(pick(2, 9));
  c.hc_mult = int(pick(1, 4));
  c.hc_sinkhorn_iters = int(pick(1, 20));
  c.original_seq_len = pick(0, 1) ? 32 * pick(1, 8) : 0;
  c.rope_factor = double(pick(2, 16));
  c.compress_rope_theta = double(pick(2, 20)) * 10000;
  c.rope_theta = double(pick(1, 3)) * 5000;

  // Layer pattern: ratios 0/1/2 in any order. A compressed layer either starts a new KV source
  // (also an index source, owning its keys) or reads the latest one, which must have its ratio;
  // readers are index sources (own top-k over the shared keys) or plain consumers.
  c.n_layers = int(pick(2, 6));
  c.compress_ratios.assign(size_t(c.n_layers), 0);
  c.kv_source_layers.clear();
  c.index_source_layers.clear();
  int last_kv_ratio = 0;
  for (int l = 0; l < c.n_layers; ++l) {
    const int r = int(pick(0, 2));
    c.compress_ratios[size_t(l)] = r;
    if (r == 0) continue;
    if (r != last_kv_ratio || pick(0, 3) == 0) {
      c.kv_source_layers.push_back(l);
      c.index_source_layers.push_back(l);
      last_kv_ratio = r;
    } else if (pick(0, 1)) {
      c.index_source_layers.push_back(l);
    }
  }
  c.index_n_heads = int(pick(1, 4));
  c.index_topk = int(pick(1, 6));
  // The candidate filter needs every index source after the candidate source to share its ratio.
  c.candidate_source_layer = -1;
  if (!c.index_source_layers.empty() && pick(0, 2)) {
    const auto& ix = c.index_source_layers;
    size_t i = ix.size() - 1;
    while (i > 0 && c.compress_ratios[size_t(ix[i - 1])] == c.compress_ratios[size_t(ix.back())])
      --i;
    c.candidate_source_layer = ix[size_t(pick(int64_t(i), int64_t(ix.size()) - 1))];
    c.candidate_block_size = int(pick(1, 4));
    c.candidate_topk_blocks = int(
        (c.index_topk - 1 + c.candidate_block_size - 1) / c.candidate_block_size + 1 + pick(0, 2));
  }
  // Engram: any subset of layers, n-grams up to 2..4.
  c.engram_layer_ids.clear();
  for (int l = 0; l < c.n_layers; ++l)
    if (pick(0, 2) == 0) c.engram_layer_ids.push_back(l);
  c.engram_max_ngram_size = int(pick(2, 4));
  c.engram_n_heads = int(pick(1, 3));
  c.engram_head_dim = 32 * pick(1, 2);
  c.engram_vocab_size = pick(40, 400);
  c.engram_pad_id = pick(0, 5);
  c.engram_compressed_vocab_size = c.vocab_size;
  c.dtype = pick(0, 4) == 0 ? "bf16" : "fp8";
  c.expert_dtype = pick(0, 4) == 0 ? "" : "fp4";
  // DSpark, drawn last so that the fields above stay as they were: none now and then, else 1-3
  // stages over a non-empty set of target layers.
  c.n_mtp_layers = int(pick(0, 3));
  c.dspark_target_layer_ids.clear();
  for (int l = 0; l < c.n_layers; ++l)
    if (pick(0, 1)) c.dspark_target_layer_ids.push_back(l);
  if (c.dspark_target_layer_ids.empty()) c.dspark_target_layer_ids.push_back(c.n_layers - 1);
  c.dspark_block_size = c.n_mtp_layers ? int(pick(1, 5)) : 0;
  c.dspark_noise_token_id = pick(0, c.vocab_size - 1);
  c.dspark_markov_rank = int(32 * pick(1, 2));
  c.dspark_n_routed_experts = int(pick(0, 7));
  c.dspark_n_activated_experts = int(pick(1, std::min(c.dspark_experts(), 3)));
  c.compress_ratios.resize(size_t(c.n_layers + c.n_mtp_layers), 0);
  return c;
}

TinyLayout parse_tiny_layout(const std::string& name) {
  if (name == "release") return TinyLayout::Release;
  if (name == "runtime") return TinyLayout::Runtime;
  throw Error(str_cat("unknown layout '", name, "' (expected release or runtime)"));
}

// --- random weights ---

namespace {

// How a tensor's values are drawn: uniform with this standard deviation around `center`, and for
// quantized formats a random per-block magnitude factor so scales vary between blocks.
struct Init {
  float center = 0, stddev = 1;
};

Init init_for(const TensorSpec& s) {
  const std::string& n = s.name;
  auto ends = [&](const char* suffix) { return n.ends_with(suffix); };
  const float fan_in = s.shape.ndim > 1 ? float(s.shape[1]) : 1.0f;
  if (ends("norm.weight") || ends("norm1.weight") || ends("norm2.weight")) return {1.0f, 0.1f};
  if (ends(".bias") || ends("bias_vl")) return {0, 0.05f};  // the router's gate.bias too
  // Embeddings: the token table, the image span's delimiters, the Engram tables.
  if (n == "embed.weight" || n.starts_with("image_") || ends("engram.embed.weight"))
    return {0, 1.0f};
  if (n == "head.weight") return {0, 3.0f / std::sqrt(fan_in)};
  if (ends("_base")) return {0, 0.3f};
  if (ends("_scale")) return {1.0f, 0.25f};
  if (ends("attn_sink")) return {0, 0.6f};
  if (ends("q_weight") || ends("k_weight")) return {1.0f, 0.25f};
  return {0, 1.0f / std::sqrt(fan_in)};  // linears (hc_*_fn too): O(1) outputs for O(1) inputs
}

struct Encoded {
  DType dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
  Shape scale_shape;
  std::vector<uint8_t> scale;
};

// The form a tensor is written in under `layout` (TinyLayout in tiny.h).
WeightFormat stored_format(const TensorSpec& s, TinyLayout layout) {
  if (layout == TinyLayout::Release) return s.format;
  if (s.kind == SlotKind::Bf16Linear) return WeightFormat::BF16;
  if (s.kind == SlotKind::Fp32Linear)
    return s.name == "head.weight" ? WeightFormat::BF16 : WeightFormat::F32;
  // Bf16 slots are stored BF16 (s.format) but for the norms and the router gate.
  const bool f32 = s.name.ends_with("norm.weight") || s.name.ends_with("gate.weight");
  return s.kind == SlotKind::Bf16 && f32 ? WeightFormat::F32 : s.format;
}

Encoded generate(const TensorSpec& s, uint64_t seed, TinyLayout layout) {
  // Each tensor's own stream: the FNV-1a hash of its name, xor the seed.
  uint64_t rng = 0xcbf29ce484222325ull;
  for (unsigned char ch : s.name) rng = (rng ^ ch) * 0x100000001b3ull;
  rng ^= seed;
  // A deterministic stream of uniform values in [-1, 1) (integer arithmetic, so the same bytes on
  // every machine).
  auto uniform = [&] {
    return float(int32_t(splitmix64(rng) >> 40) - (1 << 23)) * (1.0f / float(1 << 23));
  };
  const Init in = init_for(s);
  const float amp = in.stddev * std::sqrt(3.0f);  // uniform [-a, a) has std a/sqrt(3)
  const int64_t n = s.shape.numel();
  Encoded e;
  e.shape = s.shape;
  auto draw = [&] { return in.center + amp * uniform(); };
  const WeightFormat format = stored_format(s, layout);
  if (format == WeightFormat::F32 || format == WeightFormat::BF16) {
    const size_t size = format == WeightFormat::F32 ? 4 : 2;
    e.dtype = size == 4 ? DType::F32 : DType::BF16;
    e.bytes.resize(size_t(n) * size);
    for (int64_t i = 0; i < n; ++i) {
      const float v = draw();
      const uint16_t h = f32_to_bf16(v);
      std::memcpy(e.bytes.data() + size * i, size == 4 ? static_cast<const void*>(&v) : &h, size);
    }
    return e;
  }
  // fp8 / fp4: random values, per-block scales, then the quantized values.
  const int64_t R = s.shape[0], C = s.shape[1];
  const bool fp4 = format == WeightFormat::Fp4Row, block = format == WeightFormat::Fp8Block;
  std::vector<float> w(static_cast<size_t>(n));
  std::ranges::generate(w, draw);
  const int64_t br = block ? (R + 31) / 32 : R, bc = (C + 31) / 32;
  e.scale_shape = Shape{br, bc};
  e.scale.assign(size_t(br * bc), 0);
  for (int64_t bi = 0; bi < br; ++bi)
    for (int64_t bj = 0; bj < bc; ++bj) {
      // A per-block magnitude factor in {1/2, 1, 2}, so the scale grid is not uniform.
      const float factor = std::ldexp(1.0f, int((splitmix64(rng) % 3)) - 1);
      const int64_t r0 = block ? bi * 32 : bi, r1 = block ? std::min(R, r0 + 32) : r0 + 1;
      const int64_t c0 = bj * 32, c1 = std::min(C, c0 + 32);
      float amax = 0;
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t k = c0; k < c1; ++k) {
          float& v = w[size_t(r * C + k)];
          v *= factor;
          amax = std::max(amax, std::fabs(v));
        }
      e.scale[size_t(bi * bc + bj)] = pow2ceil_e8m0(amax, fp4 ? 1.0f / 6.0f : 1.0f / 448.0f);
    }
  e.dtype = fp4 ? DType::I8 : DType::E4M3;
  if (fp4) e.shape = Shape{R, C / 2};
  e.bytes.assign(size_t(fp4 ? n / 2 : n), 0);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t k = 0; k < C; ++k) {
      const size_t i = size_t(r * C + k);
      const float v = w[i] / e8m0_to_f32(e.scale[size_t((block ? r / 32 : r) * bc + k / 32)]);
      if (fp4)
        e.bytes[i / 2] |= uint8_t(f32_to_e2m1(v) << (4 * (i & 1)));
      else
        e.bytes[i] = f32_to_e4m3(std::max(-448.0f, std::min(448.0f, v)));
    }
  return e;
}

}  // namespace

uint64_t write_tiny_checkpoint(const std::string& dir, const ModelConfig& config,
                               const TinyWriteOptions& opt) {
  config.validate(opt.label);
  const std::vector<TensorSpec> schema = checkpoint_schema(config, 0, -1, opt.dspark);
  // Each tensor's bytes (values and scales, kept in one shard) decide the shards up front.
  std::vector<uint64_t> sizes;
  for (TensorSpec s : schema) {
    s.format = stored_format(s, opt.layout);
    sizes.push_back(tensor_spec_bytes(s));
  }
  // Generate in parallel, a batch at a time as the shards ask for the tensors in schema order
  // (each tensor's stream depends only on its name and the seed).
  ThreadPool& pool = ThreadPool::global();
  const size_t batch = size_t(std::max(1, pool.size()) * 4);
  std::vector<Encoded> enc;  // tensors [b0, b0 + enc.size())
  size_t b0 = 0;
  const uint64_t total = write_safetensors_shards(
      dir, sizes, opt.max_shard_bytes, [&](size_t i, SafetensorsWriter& shard) {
        if (i >= b0 + enc.size()) {
          b0 = i;
          enc.assign(std::min(batch, schema.size() - i), Encoded());
          pool.parallel_for(int64_t(enc.size()), 1, [&](int64_t i0, int64_t i1) {
            for (int64_t j = i0; j < i1; ++j)
              enc[size_t(j)] = generate(schema[b0 + size_t(j)], opt.seed, opt.layout);
          });
        }
        Encoded& e = enc[i - b0];
        shard.add(schema[i].name, e.dtype, e.shape, std::move(e.bytes));
        if (!e.scale.empty())
          shard.add(scale_name(schema[i].name), DType::E8M0, e.scale_shape, std::move(e.scale));
      });
  std::ofstream out(fs::path(dir) / "config.json");
  out << config.to_json();
  out.close();
  DI_REQUIRE(out, dir, "/config.json: write failed");
  return total;
}

}  // namespace deepinfer
