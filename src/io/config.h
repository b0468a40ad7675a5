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

// Every field of ModelConfig: X(type, name, default, Hugging Face key, required). The flat
// reference key is the name; the Hugging Face key is a key (or dotted path) in `text_config`, ""
// where that form has none (V41_SPEC.md §1.1). Notes on some fields:
//   n_mtp_layers: DSpark blocks, not run by the text model; compress_ratios: n_layers +
//   n_mtp_layers entries; original_seq_len: the YaRN switch (0 = off).
//   dtype, expert_dtype: what the release stores (make-tiny writes it; the loader goes by each
//   tensor's stored dtype): dtype "fp8" or "bf16" for the default-dtype linears; expert_dtype
//   "fp4", or "" (null in config.json) when the routed experts take `dtype` too.
//   dspark_*: the draft head (V41_SPEC.md §10.4, docs/numerics.md); dspark_block_size is its B
//   draft slots (0, or n_mtp_layers 0: no draft head). vision_*: docs/vision.md.
#define DEEPINFER_CONFIG_FIELDS(X)                                                          \
  X(int64_t, vocab_size, 0, "vocab_size", true)                                             \
  X(int64_t, dim, 0, "hidden_size", true)                     /* D */                       \
  X(int64_t, moe_inter_dim, 0, "moe_intermediate_size", true) /* F */                       \
  X(int, n_layers, 0, "num_hidden_layers", true)                                            \
  X(int, n_mtp_layers, 0, "num_nextn_predict_layers", false) /* DSpark blocks */            \
  X(int, n_heads, 0, "num_attention_heads", true)            /* H */                        \
  X(int, n_routed_experts, 0, "n_routed_experts", true)      /* E */                        \
  X(int, n_shared_experts, 1, "n_shared_experts", false)                                    \
  X(int, n_activated_experts, 0, "num_experts_per_tok", true) /* k */                       \
  X(std::string, score_func, "sqrtsoftplus", "scoring_func", false)                         \
  X(double, gate_temp, 1.0, "gate_temp", false)                                             \
  X(bool, norm_topk_prob, true, "norm_topk_prob", false)                                    \
  X(double, route_scale, 1.0, "routed_scaling_factor", false)                               \
  X(double, swiglu_limit, 0.0, "swiglu_limit", false)    /* 0 disables the clamp */         \
  X(int64_t, q_lora_rank, 0, "q_lora_rank", true)        /* Q */                            \
  X(int64_t, head_dim, 0, "head_dim", true)              /* Dh (includes the rope tail) */  \
  X(int64_t, rope_head_dim, 0, "qk_rope_head_dim", true) /* R */                            \
  X(double, norm_eps, 1e-20, "rms_norm_eps", false)                                         \
  X(int, o_groups, 1, "o_groups", true)              /* G */                                \
  X(int64_t, o_lora_rank, 0, "o_lora_rank", true)    /* Ro */                               \
  X(int64_t, window_size, 0, "sliding_window", true) /* W */                                \
  X(std::vector<int>, compress_ratios, {}, "compress_ratios", true)                         \
  X(std::vector<int>, kv_source_layers, {}, "kv_source_layer_ids", false)                   \
  X(std::vector<int>, index_source_layers, {}, "index_source_layer_ids", false)             \
  X(double, compress_rope_theta, 160000, "compress_rope_theta", false)                      \
  X(double, rope_theta, 10000, "rope_theta", false)                                         \
  X(int64_t, original_seq_len, 0, "rope_scaling.original_max_position_embeddings", false)   \
  X(double, rope_factor, 1, "rope_scaling.factor", false)                                   \
  X(double, beta_fast, 32, "rope_scaling.beta_fast", false)                                 \
  X(double, beta_slow, 1, "rope_scaling.beta_slow", false)                                  \
  X(int, index_n_heads, 0, "index_n_heads", false)       /* Hi */                           \
  X(int64_t, index_head_dim, 0, "index_head_dim", false) /* Di */                           \
  X(int, index_topk, 0, "index_topk", false)             /* K */                            \
  X(int, candidate_source_layer, -1, "candidate_source_layer_id", false)                    \
  X(int, candidate_topk_blocks, 0, "candidate_topk_blocks", false) /* Ck */                 \
  X(int, candidate_block_size, 0, "candidate_block_size", false)   /* Cb */                 \
  X(int, hc_mult, 1, "hc_mult", false)                             /* M */                  \
  X(int, hc_sinkhorn_iters, 1, "hc_sinkhorn_iters", false)                                  \
  X(double, hc_eps, 1e-6, "hc_eps", false)                                                  \
  X(std::vector<int>, engram_layer_ids, {}, "engram_layer_ids", false)                      \
  X(std::vector<int64_t>, engram_num_embeddings, {}, "engram_num_embeddings", false)        \
  X(int, engram_max_ngram_size, 0, "engram_max_ngram_size", false) /* Ng */                 \
  X(int64_t, engram_vocab_size, 0, "engram_vocab_size", false)     /* prime search start */ \
  X(int, engram_n_heads, 0, "engram_n_heads", false)               /* Hh */                 \
  X(int64_t, engram_head_dim, 0, "engram_head_dim", false)         /* Dm */                 \
  X(int64_t, engram_pad_id, 2, "engram_pad_token_id", false)                                \
  X(int64_t, engram_compressed_vocab_size, 0, "engram_compressed_vocab_size", false)        \
  X(std::string, dtype, "fp8", "", false)                                                   \
  X(std::string, expert_dtype, "fp4", "", false)                                            \
  X(int64_t, bos_token_id, 0, "bos_token_id", false)                                        \
  X(int64_t, eos_token_id, 1, "eos_token_id", false)                                        \
  X(int64_t, pad_token_id, 2, "pad_token_id", false)                                        \
  X(int64_t, max_position_embeddings, 0, "max_position_embeddings", false)                  \
  X(int, dspark_block_size, 0, "dspark_block_size", false) /* B */                          \
  X(int64_t, dspark_noise_token_id, -1, "dspark_noise_token_id", false)                     \
  X(std::vector<int>, dspark_target_layer_ids, {}, "dspark_target_layer_ids", false)        \
  X(int, dspark_markov_rank, 0, "dspark_markov_rank", false)                                \
  X(int, dspark_n_routed_experts, 0, "dspark_n_routed_experts", false)                      \
  X(int, dspark_n_activated_experts, 0, "dspark_num_experts_per_tok", false)                \
  X(int, vision_n_layers, 0, "vision_config.num_hidden_layers", false)                      \
  X(int, vision_dim, 0, "vision_config.hidden_size", false)                                 \
  X(int, vision_n_heads, 0, "vision_config.num_attention_heads", false)                     \
  X(int, vision_inter_dim, 0, "vision_config.intermediate_size", false)                     \
  X(int, vision_patch_size, 0, "vision_config.patch_size", false)                           \
  X(int, vision_downsample_ratio, 0, "vision_config.downsample_ratio", false)               \
  X(int, vision_max_n_token, 0, "vision_config.max_n_token", false)                         \
  X(int64_t, vision_min_pixels, 0, "vision_config.min_pixels", false)                       \
  X(double, vision_max_wh_ratio, 0, "vision_config.max_wh_ratio", false) /* 0 = none */     \
  X(double, vision_rope_theta, 10000, "vision_config.rope_theta", false)                    \
  X(int64_t, image_token_id, -1, "image_token_id", false)

struct ModelConfig {
#define DEEPINFER_CONFIG_FIELD(type, name, init, hf_key, required) type name = init;
  DEEPINFER_CONFIG_FIELDS(DEEPINFER_CONFIG_FIELD)
#undef DEEPINFER_CONFIG_FIELD

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

  int compress_ratio(int layer) const {
    return compress_ratios[size_t(layer)];
  }
  bool is_engram_layer(int layer) const {
    return engram_index(layer) >= 0;
  }
  int engram_index(int layer) const;  // z, or -1
  int engram_columns() const {
    return (engram_max_ngram_size - 1) * engram_n_heads;
  }  // NC
  bool has_dspark() const {
    return dspark_block_size > 0 && n_mtp_layers > 0;
  }
  bool has_vision() const {
    return vision_n_layers > 0;
  }
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
