// Official-format V4.1 checkpoints: tensor names -> typed weights (V41_SPEC.md §2).
//
// `checkpoint_schema(config)` lists every tensor the text model needs with its slot kind (what
// the reference declares for it), its released storage format and logical shape; the loader checks
// each one is present with that shape and a stored form its slot accepts, and that every other
// tensor in the files belongs to the DSpark draft head (`mtp.*`, loaded when complete) or a known
// part the text model does not run (vision
// `vision.*`/`aligner.*`/`image_*`, the image-token router bias `bias_vl`). Anything else is an
// error: nothing is silently ignored. make-tiny writes checkpoints from the same schema.
//
// As in the reference's `linear()`, the stored dtype decides the computation; the one table of
// what each slot kind accepts and computes is `SlotKind` below (the loader's `bind` follows it).
// Weights stay in the mapped files (zero-copy) in the form the checkpoint stores them; the
// conversions the reference also performs at load (a value stored in a wider or other float type
// than its parameter's is rounded to bf16 or widened to fp32; fp8 scales stored as exact powers of
// two in F32 become e8m0) go into buffers the Checkpoint owns.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "core/weight.h"
#include "io/config.h"
#include "io/safetensors.h"

namespace deepinfer {

// What the reference declares for a tensor, and so which stored forms load into it and what each
// computes (V41_SPEC.md §2.3):
//
//   kind        slots                               stored form            computes
//   QLinear     wq_a, wq_b, wkv, wo_b, indexer.wq_b, fp8 e4m3 + 32x32 e8m0  act_quant + fp8 QLin
//               shared and routed experts,          fp4 (I8/F4) + per-32    act_quant + fp4 QLin
//               engram.wkv (the model's dtype)      BF16 / F32 / F16        plain linear on the
//                                                                           stored values
//   Bf16Linear  wo_a, compressor.wkv (r = 1),       BF16                    plain bf16 linear
//               indexer.wk, indexer.weights_proj    F32 / F16 -> bf16 (RNE)
//                                                   fp8 e4m3 + 32x32 e8m0   dequantized exactly
//   Fp32Linear  compressor.wkv/wgate (r > 1),       F32                     fp32 linear
//               head, hc_*_fn                       BF16 / F16 (exact)
//   Fp32        hc_*_base/scale, attn_sink,         F32; BF16 / F16 widened into an F32 copy
//               gate.bias
//   Bf16        embed, norms, router gate weight,   BF16; F32 / F16 rounded to bf16 (RNE)
//               engram q/k weights
//   Fp8Table    engram.embed                        fp8 e4m3 + per-row-per-32 e8m0
//
// Plain linears never quantize their input (bf16 inputs, fp32 sums, bf16 output in bf16 mode; fp32
// throughout in fp32 mode). Scales only ever accompany fp8/fp4 weights.
enum class SlotKind : uint8_t { QLinear, Bf16Linear, Fp32Linear, Fp32, Bf16, Fp8Table };

// One tensor the text model reads: the weight's name (scales are `<name minus .weight>.scale`),
// its slot kind, the format the release (and make-tiny's release layout) stores it in for this
// config's dtype/expert_dtype, and its logical shape.
struct TensorSpec {
  std::string name;
  SlotKind kind;
  WeightFormat format;
  Shape shape;
};

// Every tensor of the model for this config, in a stable order (embedding, layers, norm, head,
// then with `dspark` the draft head's `mtp.<k>.*` stages when the config has one, then with
// `vision` the vision tower when the config has one), including only the backbone experts in
// [expert_begin, expert_end) (all when end < 0; the draft stages' experts are always all listed).
std::vector<TensorSpec> checkpoint_schema(const ModelConfig& c, int expert_begin = 0,
                                          int expert_end = -1, bool dspark = true,
                                          bool vision = true);

// The name of a quantized weight's scale tensor (`x.weight` -> `x.scale`).
std::string scale_name(const std::string& weight_name);

// Bytes of weights as the checkpoint stores them (values + scales), and the part of them one
// decoded token reads: every dense weight once, one embedding row, the activated experts, the
// Engram table rows it hashes to, and the whole head.
struct WeightFootprint {
  uint64_t total = 0;            // all text-model tensors (the draft head's included)
  uint64_t per_token = 0;        // read per decoded token (batch 1)
  uint64_t dense_per_token = 0;  // of which: everything except routed experts
  uint64_t experts_per_token = 0;
  uint64_t head = 0;
  uint64_t draft_head = 0;  // the DSpark stages (in total, not read per token)
  uint64_t vision = 0;      // the vision tower and bias_vl (in total, read per image)
};
WeightFootprint weight_footprint(const ModelConfig& c);
uint64_t tensor_spec_bytes(const TensorSpec& s);

struct ExpertWeights {
  Weight w1, w2, w3;  // w1/w3 [F, D], w2 [D, F]
};

struct LayerWeights {
  Weight attn_norm, ffn_norm;                      // [D] bf16
  Weight hc_attn_fn, hc_attn_base, hc_attn_scale;  // [(2+M)M, M*D], [(2+M)M], [3] f32
  Weight hc_ffn_fn, hc_ffn_base, hc_ffn_scale;
  // --- attention ---
  Weight wq_a, q_norm, wq_b;  // [Q, D] fp8, [Q] bf16, [H*Dh, Q] fp8
  Weight wkv, kv_norm;        // [Dh, D] fp8, [Dh] bf16
  Weight attn_sink;           // [H] f32
  Weight wo_a, wo_b;          // [G*Ro, H*Dh/G] fp8, [D, G*Ro] fp8
  // compressor (KV sources)
  Weight cmp_wkv, cmp_wgate, cmp_norm;  // [Dh, D] bf16 (wgate only if r > 1), [Dh]
  // indexer (index sources; wk/k_norm only at key owners)
  Weight idx_wq_b, idx_weights_proj, idx_wk, idx_k_norm;  // [Hi*Di, Q] fp8, [Hi, D], [Di, Dh], [Di]
  // --- MoE ---
  Weight gate, gate_bias;              // [E, D] bf16, [E] f32
  Weight gate_bias_vl;                 // [E] f32: image tokens' selection bias (with vision)
  std::vector<ExpertWeights> experts;  // indexed by expert id - expert_begin
  ExpertWeights shared;                // fp8
  // --- Engram (Engram layers) ---
  Weight engram_table;        // [N, Dm] fp8 rows
  Weight engram_wkv;          // [(M+1)*D, NC*Dm] fp8
  Weight engram_q, engram_k;  // [M, D] bf16
};

// The DSpark draft head (V41_SPEC.md §10.4, docs/numerics.md): window-only stages (each a
// LayerWeights without compressor, indexer or Engram, with its own experts), stage 0's projection
// of the backbone taps, the last stage's norm, Markov head and confidence head.
struct DsparkWeights {
  std::vector<LayerWeights> stages;  // [n_mtp_layers]
  Weight main_proj, main_norm;       // [D, nT*D] (model dtype), [D] bf16
  Weight norm;                       // [D] bf16
  Weight markov_embed, markov_head;  // [V, R] bf16, [V, R] (used as f32)
  Weight confidence;                 // [1, D + R] (used as f32)
};

// The vision tower (docs/vision.md), plain bf16: the ViT blocks, the
// aligner and the image span's delimiter embeddings.
struct VisionBlockWeights {
  Weight norm1, norm2;     // [Dv]
  Weight wqkv, wqkv_bias;  // [3 Dv, Dv], [3 Dv]
  Weight wo, wo_bias;      // [Dv, Dv], [Dv]
  Weight w1, w2;           // [2 F, Dv] (gate rows, then up rows), [Dv, F]
};
struct VisionWeights {
  Weight patch_embed, patch_embed_bias;  // [Dv, 3 p^2], [Dv]
  std::vector<VisionBlockWeights> blocks;
  Weight norm;                                            // [Dv]
  Weight aligner_w1, aligner_b1, aligner_w2, aligner_b2;  // [D, Dv r^2], [D], [D, D], [D]
  Weight image_start, image_end, image_newline;           // [D]
};

// What a weight loaded into a slot of `kind` is computed as, in words ("fp8 e4m3 + e8m0 32x32 ->
// act_quant + fp8 QLin"), for `inspect`.
std::string loaded_form(SlotKind kind, const Weight& w);

class Checkpoint {
 public:
  // Opens `dir` (config.json + safetensors) and maps every weight, binding the routed experts in
  // [expert_begin, expert_end) (all when end < 0). Reads headers only.
  static std::unique_ptr<Checkpoint> load(const std::string& dir, int expert_begin = 0,
                                          int expert_end = -1);

  const ModelConfig& config() const { return config_; }
  const std::string& dir() const { return dir_; }
  const TensorStore& store() const { return *store_; }
  // For a weight whose values the caller has copied (repacked): lets the kernel reclaim the
  // mapped pages of its values from this process's resident set. Nothing changes for readers:
  // the file is mapped read-only, so a later read faults the same bytes back in.
  void release_resident(const Weight& w) const;

  Weight embed, norm, head;  // [V, D] bf16, [D] bf16, [V, D] bf16 (used as f32)
  std::vector<LayerWeights> layers;
  int expert_begin = 0, expert_end = 0;
  // The draft head, when the config has one and the files hold its `mtp.*` tensors (a checkpoint
  // stored without them loads, without a draft head).
  bool has_dspark = false;
  DsparkWeights dspark;
  // The vision tower, when the config has one and the files hold its `vision.*` tensors (then
  // every vision tensor, `bias_vl` included, is required).
  bool has_vision = false;
  VisionWeights vision;

  // Tensors in the files that the model does not run (vision; DSpark without its config).
  std::vector<std::string> skipped_tensors;
  // How each bound tensor was stored and what it computes, in schema order: its name and
  // "<stored dtype> -> <loaded_form()>" ("BF16 -> bf16 -> plain bf16 linear").
  std::vector<std::pair<std::string, std::string>> forms;
  uint64_t bound_bytes = 0;      // bytes of the weights this checkpoint binds (its experts only)
  uint64_t converted_bytes = 0;  // bytes of owned converted buffers

 private:
  friend std::vector<TensorSpec> checkpoint_schema(const ModelConfig&, int, int, bool, bool);
  Checkpoint() = default;
  // checkpoint_schema() for config_; with `bind_slots`, binds each tensor into its slot as listed.
  std::vector<TensorSpec> schema(int expert_begin, int expert_end, bool with_dspark,
                                 bool with_vision, bool bind_slots);
  Weight bind(const TensorSpec& spec);  // also counts it in bound_bytes and forms
  // Keeps converted bytes (counted in converted_bytes) for the checkpoint's lifetime.
  const uint8_t* own(std::vector<uint8_t> bytes);
  std::string dir_;
  ModelConfig config_;
  std::unique_ptr<TensorStore> store_;
  std::vector<std::vector<uint8_t>> owned_;
};

}  // namespace deepinfer
