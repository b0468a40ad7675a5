#include "kv/kv_cache.h"

#include "core/error.h"
#include "kv/kv_layout.h"

namespace deepinfer {

KvCache::KvCache(const ModelConfig& c, const KvCacheOptions& opt)
    : block_tokens_(opt.block_tokens),
      num_blocks_(opt.num_blocks),
      max_seqs_(opt.max_seqs),
      window_(c.window_size),
      head_dim_(c.head_dim),
      window_row_bytes_(window_kv_row_bytes(c.head_dim)),
      history_len_(c.engram_layer_ids.empty() ? 0 : c.engram_max_ngram_size - 1) {
  DI_REQUIRE(opt.num_blocks >= 0 && opt.max_seqs >= 1 && opt.block_tokens >= 1,
             "KV cache: need num_blocks >= 0, max_seqs >= 1 and block_tokens >= 1");
  const auto roles = layer_roles(c);
  layers_.resize(size_t(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerRole& r = roles[size_t(l)];
    LayerRegion& L = layers_[size_t(l)];
    L.window.assign(size_t(max_seqs_ * window_ * window_row_bytes_), 0);
    if (!r.kv_source) continue;
    DI_REQUIRE(block_tokens_ % r.ratio == 0, "KV cache: block size ", block_tokens_,
               " tokens is not a multiple of layer ", l, "'s compress ratio ", r.ratio);
    L.rows_per_block = block_tokens_ / r.ratio;
    L.cmp_row_bytes = compressed_kv_row_bytes(c.head_dim);
    L.cmp.assign(size_t(num_blocks_ * L.rows_per_block * L.cmp_row_bytes), 0);
    if (r.key_owner) {
      L.idx_row_bytes = index_key_row_bytes(c.index_head_dim);
      L.idx.assign(size_t(num_blocks_ * L.rows_per_block * L.idx_row_bytes), 0);
    }
    if (r.ratio > 1) L.carry.assign(size_t(max_seqs_ * r.ratio * 2 * c.head_dim), 0.0f);
  }
  history_.assign(size_t(max_seqs_ * history_len_), 0);
  last_key_layer_.assign(size_t(max_seqs_), -1);
}

uint64_t KvCache::bytes() const {
  uint64_t n = history_.size() * 8;
  for (const auto& L : layers_)
    n += L.cmp.size() + L.idx.size() + L.window.size() + L.carry.size() * 4;
  return n;
}

uint8_t* KvCache::paged_row(std::vector<uint8_t>& region, int64_t row_bytes, int64_t rows_per_block,
                            const SeqKv& s, int64_t row, int layer, const char* what) {
  DI_CHECK(row_bytes > 0, "layer ", layer, " has no ", what, " cache");
  const int64_t bi = row / rows_per_block;
  DI_CHECK(row >= 0 && bi < s.n_blocks, what, " row ", row, " of layer ", layer,
           " is beyond the sequence's ", s.n_blocks, " blocks");
  const int32_t b = s.blocks[bi];
  DI_CHECK(b >= 0 && b < num_blocks_, "block id ", b, " out of range");
  return region.data() + (int64_t(b) * rows_per_block + row % rows_per_block) * row_bytes;
}

uint8_t* KvCache::cmp_row(int layer, const SeqKv& s, int64_t row) {
  LayerRegion& L = layers_[size_t(layer)];
  return paged_row(L.cmp, L.cmp_row_bytes, L.rows_per_block, s, row, layer, "compressed-KV");
}

uint8_t* KvCache::idx_row(int layer, const SeqKv& s, int64_t row) {
  LayerRegion& L = layers_[size_t(layer)];
  return paged_row(L.idx, L.idx_row_bytes, L.rows_per_block, s, row, layer, "index-key");
}

uint8_t* KvCache::window_slot(int layer, int32_t slot, int64_t index) {
  DI_CHECK(slot >= 0 && slot < max_seqs_ && index >= 0 && index < window_);
  return layers_[size_t(layer)].window.data() +
         (int64_t(slot) * window_ + index) * window_row_bytes_;
}

float* KvCache::carry(int layer, int32_t slot) {
  LayerRegion& L = layers_[size_t(layer)];
  DI_CHECK(!L.carry.empty() && slot >= 0 && slot < max_seqs_);
  return L.carry.data() + size_t(slot) * (L.carry.size() / size_t(max_seqs_));
}

int64_t* KvCache::engram_history(int32_t slot) {
  DI_CHECK(slot >= 0 && slot < max_seqs_);
  return history_.data() + int64_t(slot) * history_len_;
}

}  // namespace deepinfer
