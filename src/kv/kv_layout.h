// Storage formats of the attention caches and their footprint (V41_SPEC.md §12.1). Each cache is
// kept in the format the model was trained with, as device engines store it:
//   window KV       e4m3 values + one e8m0 scale per 32      (Dh + Dh/32 bytes per slot)
//   compressed KV   packed e2m1 + one e4m3 scale per 16     (Dh/2 + Dh/16 bytes per row)
//   index keys      packed e2m1 + one e8m0 scale per 32     (Di/2 + Di/32 bytes per row)
// These hold exactly the values the reference keeps in bf16 (fp8/fp4 fake-quantized), so storing
// them packed loses nothing. Compressed rows and index keys grow with the context (one row per r
// tokens at each KV source); window rings, compressor carries and the Engram token history have a
// fixed size per sequence.
#pragma once

#include <cstdint>

#include "io/config.h"

namespace deepinfer {

inline int64_t window_kv_row_bytes(int64_t head_dim) {
  return head_dim + head_dim / 32;
}
inline int64_t compressed_kv_row_bytes(int64_t head_dim) {
  return head_dim / 2 + head_dim / 16;
}
inline int64_t index_key_row_bytes(int64_t index_head_dim) {
  return index_head_dim / 2 + index_head_dim / 32;
}

struct KvFootprint {
  // Bytes that grow with the context, per token of one sequence (all KV sources together).
  double bytes_per_token = 0;
  // Fixed per-sequence state.
  int64_t window_bytes = 0;  // rings of every layer
  int64_t carry_bytes = 0;   // compressor partial groups (fp32 k and g rows, r > 1)
  int64_t engram_history_bytes = 0;
  int64_t fixed_bytes_per_seq() const { return window_bytes + carry_bytes + engram_history_bytes; }
};

KvFootprint kv_footprint(const ModelConfig& c);

// Bytes of one KV block holding `block_tokens` tokens of context at every KV source.
int64_t kv_block_bytes(const ModelConfig& c, int64_t block_tokens);

}  // namespace deepinfer
