// The V4.1 model configuration (V41_SPEC.md §1) as a typed struct, parsed from `config.json` in
// either of its two published forms: the flat file the reference inference code reads (keys as
// in ModelArgs), or the Hugging Face file with the text model under `text_config` and renamed keys.
// `validate()` enforces what the model needs (§1.3) with errors naming the field; `layer_roles()`
// derives each layer's role in the shared-attention scheme (§1.2).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace deepinfer {

struct ModelConfig {
  // --- sizes ---
  int64_t vocab_size = 0;
  int64_t dim = 0;            // D
  int64_t moe_inter_dim = 0;  // F
  int n_layers = 0;
  int n_mtp_layers = 0;      // DSpark blocks (not run by the text model)
  int n_heads = 0;           // H
  int n_routed_experts = 0;  // E
  int n_shared_experts = 1;
  int n_activated_experts = 0;  // k
  std::string score_func = "sqrtsoftplus";
  double gate_temp = 1.0;
  bool norm_topk_prob = true;
  double route_scale = 1.0;
  double swiglu_limit = 0.0;  // 0 disables the clamp
  int64_t q_lora_rank = 0;    // Q
  int64_t head_dim = 0;       // Dh (includes the rope tail)
  int64_t rope_head_dim = 0;  // R
  double norm_eps = 1e-20;
  int o_groups = 1;         // G
  int64_t o_lora_rank = 0;  // Ro
  int64_t window_size = 0;  // W
  // --- shared attention ---
  std::vector<int> compress_ratios = {};  // n_layers + n_mtp_layers entries
  std::vector<int> kv_source_layers = {};
  std::vector<int> index_source_layers = {};
  double compress_rope_theta = 160000;
  double rope_theta = 10000;
  int64_t original_seq_len = 0;  // YaRN switch (0 = off)
  double rope_factor = 1;
  double beta_fast = 32, beta_slow = 1;
  int index_n_heads = 0;       // Hi
  int64_t index_head_dim = 0;  // Di
  int index_topk = 0;          // K
  int candidate_source_layer = -1;
  int candidate_topk_blocks = 0;  // Ck
  int candidate_block_size = 0;   // Cb
  // --- hyper-connections ---
  int hc_mult = 1;  // M
  int hc_sinkhorn_iters = 1;
  double hc_eps = 1e-6;
  // --- Engram ---
  std::vector<int> engram_layer_ids = {};
  std::vector<int64_t> engram_num_embeddings = {};
  int engram_max_ngram_size = 0;  // Ng
  int64_t engram_vocab_size = 0;  // prime search start
  int engram_n_heads = 0;         // Hh
  int64_t engram_head_dim = 0;    // Dm
  int64_t engram_pad_id = 2;
  int64_t engram_compressed_vocab_size = 0;
  // --- storage ---
  // What the release stores (make-tiny writes it; the loader goes by each tensor's stored dtype):
  // dtype "fp8" or "bf16" for the default-dtype linears; expert_dtype "fp4", or "" (null in
  // config.json) when the routed experts take `dtype` too.
  std::string dtype = "fp8";
  std::string expert_dtype = "fp4";
  // --- tokens ---
  int64_t bos_token_id = 0, eos_token_id = 1, pad_token_id = 2;
  int64_t max_position_embeddings = 0;
  // --- DSpark draft head (V41_SPEC.md §10.4, docs/numerics.md); vision (docs/vision.md) ---
  int dspark_block_size = 0;  // B draft slots; 0 (or n_mtp_layers 0): no draft head
  int64_t dspark_noise_token_id = -1;
  std::vector<int> dspark_target_layer_ids = {};
  int dspark_markov_rank = 0;
  int dspark_n_routed_experts = 0;
  int dspark_n_activated_experts = 0;
  int vision_n_layers = 0;
  int vision_dim = 0, vision_n_heads = 0, vision_inter_dim = 0, vision_patch_size = 0;
  int vision_downsample_ratio = 0, vision_max_n_token = 0;
  int64_t vision_min_pixels = 0;
  double vision_max_wh_ratio = 0;  // 0 = none
  double vision_rope_theta = 10000;
  int64_t image_token_id = -1;

  // Parses config text (flat or `text_config` form); `label` names the file in errors.
  // Unknown keys are ignored (configs carry many unrelated fields); missing required keys and
  // wrongly typed values are errors. The result is validated unless `validate` is false.
  static ModelConfig parse(const std::string& json_text, const std::string& label,
                           bool validate = true);
  static ModelConfig load(const std::string& path);  // a config.json, or a directory holding one
  // The flat form (reference keys), as make-tiny writes it.
  std::string to_json() const;

  // Throws Error naming the offending field when the config cannot describe a runnable model.
  void validate(const std::string& label = "config") const;

  int compress_ratio(int layer) const { return compress_ratios[size_t(layer)]; }
  bool is_engram_layer(int layer) const { return engram_index(layer) >= 0; }
  int engram_index(int layer) const;                                                   // z, or -1
  int engram_columns() const { return (engram_max_ngram_size - 1) * engram_n_heads; }  // NC
  bool has_dspark() const { return dspark_block_size > 0 && n_mtp_layers > 0; }
  bool has_vision() const { return vision_n_layers > 0; }
  // The draft stages' routed experts and top-k (0 in the config: the backbone's).
  int dspark_experts() const {
    return dspark_n_routed_experts > 0 ? dspark_n_routed_experts : n_routed_experts;
  }
  int dspark_topk() const {
    return dspark_n_activated_experts > 0 ? dspark_n_activated_experts : n_activated_experts;
  }
};

// Role of a backbone layer in the shared-attention scheme (V41_SPEC.md §1.2).
struct LayerRole {
  int ratio = 0;              // r; 0 = window-only
  bool kv_source = false;     // owns a compressor and the compressed-KV cache
  bool index_source = false;  // runs an indexer (query side)
  bool key_owner = false;     // index source that is also a KV source: owns index keys
  bool candidate_source = false;
  bool candidate_consumer = false;
  int kv_from = -1;    // layer whose compressed KV it reads (itself for sources)
  int keys_from = -1;  // index sources: layer whose index keys they score
  int topk_from = -1;  // layer whose top-k list it uses (itself for index sources)
};

// The roles of the backbone layers; throws Error naming `label` where the sharing structure is
// inconsistent (validate() checks it so).
std::vector<LayerRole> layer_roles(const ModelConfig& c, const std::string& label = "config");

}  // namespace deepinfer
