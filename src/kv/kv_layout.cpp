#include "kv/kv_layout.h"

namespace deepinfer {

KvFootprint kv_footprint(const ModelConfig& c) {
  KvFootprint f;
  const auto roles = layer_roles(c);
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerRole& r = roles[size_t(l)];
    f.window_bytes += c.window_size * window_kv_row_bytes(c.head_dim);
    if (!r.kv_source) continue;
    const int64_t cmp = compressed_kv_row_bytes(c.head_dim);
    const int64_t idx = r.key_owner ? index_key_row_bytes(c.index_head_dim) : 0;
    f.compressed_row_bytes += cmp;
    f.index_row_bytes += idx;
    f.bytes_per_token += double(cmp + idx) / double(r.ratio);
    if (r.ratio > 1) f.carry_bytes += 2 * int64_t(r.ratio) * c.head_dim * 4;
  }
  if (!c.engram_layer_ids.empty())
    f.engram_history_bytes = int64_t(c.engram_max_ngram_size - 1) * 8;
  return f;
}

int64_t kv_block_bytes(const ModelConfig& c, int64_t block_tokens) {
  const KvFootprint f = kv_footprint(c);
  return int64_t(f.bytes_per_token * double(block_tokens) + 0.5);
}

}  // namespace deepinfer
