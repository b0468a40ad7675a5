// Official-format V4.1 checkpoints: tensor names -> typed weights (V41_SPEC.md §2).
//
// `checkpoint_schema(config)` lists every tensor the text model needs with its storage format and
// logical shape; the loader checks each one is present with that shape and an accepted dtype, and
// that every other tensor in the files belongs to a known part the text model does not run (DSpark
// `mtp.*`, vision `vision.*`/`aligner.*`/`image_*`, the image-token router bias `bias_vl`).
// Anything else is an error: nothing is silently ignored. make-tiny writes checkpoints from the
// same schema.
//
// Weights stay in the mapped files (zero-copy) in the format the checkpoint stores them; the few
// that need a conversion the reference also performs at load (norm weights stored in another float
// type are rounded to bf16; fp8 scales stored as exact powers of two in F32 become e8m0) are
// converted into buffers the Checkpoint owns.
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

// One tensor the text model reads: the weight's name (scales are `<name minus .weight>.scale`),
// its format and logical shape.
struct TensorSpec {
  std::string name;
  WeightFormat format;
  Shape shape;
};

// Every tensor of the text model for this config, in a stable order (embedding, layers, norm,
// head), including only the experts in [expert_begin, expert_end) (all when end < 0).
std::vector<TensorSpec> checkpoint_schema(const ModelConfig& c, int expert_begin = 0,
                                          int expert_end = -1);

// The name of a quantized weight's scale tensor (`x.weight` -> `x.scale`).
std::string scale_name(const std::string& weight_name);

// Bytes of weights as the checkpoint stores them (values + scales), and the part of them one
// decoded token reads: every dense weight once, one embedding row, the activated experts, the
// Engram table rows it hashes to, and the whole head.
struct WeightFootprint {
  uint64_t total = 0;            // all text-model tensors
  uint64_t per_token = 0;        // read per decoded token (batch 1)
  uint64_t dense_per_token = 0;  // of which: everything except routed experts
  uint64_t experts_per_token = 0;
  uint64_t head = 0;
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
  std::vector<ExpertWeights> experts;  // indexed by expert id - expert_begin
  ExpertWeights shared;                // fp8
  // --- Engram (Engram layers) ---
  Weight engram_table;        // [N, Dm] fp8 rows
  Weight engram_wkv;          // [(M+1)*D, NC*Dm] fp8
  Weight engram_q, engram_k;  // [M, D] bf16
};

struct LoadOptions {
  int expert_begin = 0;
  int expert_end = -1;  // < 0: all experts
};

class Checkpoint {
 public:
  // Opens `dir` (config.json + safetensors) and maps every weight. Reads headers only.
  static std::unique_ptr<Checkpoint> load(const std::string& dir, const LoadOptions& opt = {});

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

  // Tensors in the files that the text model does not run (DSpark, vision), by prefix count.
  std::vector<std::string> skipped_tensors;
  uint64_t bound_bytes = 0;      // bytes of the weights this checkpoint binds (its experts only)
  uint64_t converted_bytes = 0;  // bytes of owned converted buffers

 private:
  Checkpoint() = default;
  Weight bind(const TensorSpec& spec);
  std::string dir_;
  ModelConfig config_;
  std::unique_ptr<TensorStore> store_;
  std::vector<std::vector<uint8_t>> owned_;
};

}  // namespace deepinfer
