#include "kv/kv_cache.h"

#include <algorithm>

namespace deepinfer {

KvCache::KvCache(const ModelConfig& c, const KvCacheOptions& opt)
    : block_tokens_(opt.block_tokens),
      num_blocks_(opt.num_blocks),
      max_seqs_(opt.max_seqs),
      num_snapshots_(opt.num_snapshots),
      window_(c.window_size),
      window_row_bytes_(window_kv_row_bytes(c.head_dim)),
      history_len_(c.engram_layer_ids.empty() ? 0 : c.engram_max_ngram_size - 1) {
  DI_REQUIRE(
      opt.num_blocks >= 0 && opt.max_seqs >= 1 && opt.block_tokens >= 1 && opt.num_snapshots >= 0,
      "KV cache: need num_blocks >= 0, max_seqs >= 1, block_tokens >= 1 and "
      "num_snapshots >= 0");
  DI_REQUIRE(opt.draft_layers >= 0, "KV cache: draft_layers must be >= 0");
  const auto roles = layer_roles(c);
  layers_.resize(size_t(c.n_layers + opt.draft_layers));
  for (int l = 0; l < c.n_layers + opt.draft_layers; ++l) {
    // Draft stages (after the backbone) are window-only.
    const LayerRole r = l < c.n_layers ? roles[size_t(l)] : LayerRole{};
    LayerRegion& L = layers_[size_t(l)];
    L.window.assign(size_t(max_seqs_ * window_ * window_row_bytes_), 0);
    L.snapshot_window.assign(size_t(num_snapshots_ * window_ * window_row_bytes_), 0);
    if (opt.slot_backups) L.backup_window = L.window;
    if (!r.kv_source) continue;
    DI_REQUIRE(block_tokens_ % r.ratio == 0, "KV cache: block size ", block_tokens_,
               " tokens is not a multiple of layer ", l, "'s compress ratio ", r.ratio);
    L.rows_per_block = block_tokens_ / r.ratio;
    L.row_bytes[0] = compressed_kv_row_bytes(c.head_dim);
    L.row_bytes[1] = r.key_owner ? index_key_row_bytes(c.index_head_dim) : 0;
    for (int which : {0, 1})
      L.paged[which].assign(size_t(num_blocks_ * L.rows_per_block * L.row_bytes[which]), 0);
    if (r.ratio > 1) L.carry.assign(size_t(max_seqs_ * r.ratio * 2 * c.head_dim), 0.0f);
    if (opt.slot_backups) L.backup_carry = L.carry;
  }
  history_.assign(size_t(max_seqs_ * history_len_), 0);
  snapshot_history_.assign(size_t(num_snapshots_ * history_len_), 0);
  last_key_layer_.assign(size_t(max_seqs_), -1);
  if (opt.slot_backups) {
    backup_history_ = history_;
    backup_key_layer_ = last_key_layer_;
  }
}

uint64_t KvCache::bytes() const {
  uint64_t n = (history_.size() + snapshot_history_.size() + backup_history_.size()) * 8;
  for (const auto& L : layers_)
    n += L.paged[0].size() + L.paged[1].size() + L.window.size() + L.snapshot_window.size() +
         L.backup_window.size() + (L.carry.size() + L.backup_carry.size()) * 4;
  return n;
}

uint8_t* KvCache::paged_row(int layer, int which, const SeqKv& s, int64_t row) {
  LayerRegion& L = layers_[size_t(layer)];
  const char* what = which == 0 ? "compressed-KV" : "index-key";
  const int64_t row_bytes = L.row_bytes[which], rows_per_block = L.rows_per_block;
  DI_CHECK(row_bytes > 0, "layer ", layer, " has no ", what, " cache");
  const int64_t bi = row / rows_per_block;
  DI_CHECK(row >= 0 && bi < s.n_blocks, what, " row ", row, " of layer ", layer,
           " is beyond the sequence's ", s.n_blocks, " blocks");
  const int32_t b = s.blocks[bi];
  DI_CHECK(b >= 0 && b < num_blocks_, "block id ", b, " out of range");
  return L.paged[which].data() + (int64_t(b) * rows_per_block + row % rows_per_block) * row_bytes;
}

void KvCache::restore_snapshot(int32_t snap, int32_t slot) {
  for (LayerRegion& L : layers_)
    std::copy_n(part(L.snapshot_window, snap, num_snapshots_), window_ * window_row_bytes_,
                part(L.window, slot, max_seqs_));
  std::copy_n(snapshot_history(snap), history_len_, engram_history(slot));
}

void KvCache::copy_slot_state(int32_t slot, bool to_backup) {
  DI_CHECK(!backup_key_layer_.empty(), "no slot backups");
  // The slot's part of a per-slot array, copied into its backup or back.
  auto copy = [&](auto& live, auto& backup) {
    auto *a = part(live, slot, max_seqs_), *b = part(backup, slot, max_seqs_);
    std::copy_n(to_backup ? a : b, live.size() / size_t(max_seqs_), to_backup ? b : a);
  };
  for (LayerRegion& L : layers_) {
    copy(L.window, L.backup_window);
    copy(L.carry, L.backup_carry);
  }
  copy(history_, backup_history_);
  copy(last_key_layer_, backup_key_layer_);
}

// --- footprint ---

KvFootprint kv_footprint(const ModelConfig& c, int draft_layers) {
  KvFootprint f;
  f.window_bytes = (c.n_layers + draft_layers) * c.window_size * window_kv_row_bytes(c.head_dim);
  for (const LayerRole& r : layer_roles(c)) {
    if (!r.kv_source) continue;
    const int64_t idx = r.key_owner ? index_key_row_bytes(c.index_head_dim) : 0;
    f.bytes_per_token += double(compressed_kv_row_bytes(c.head_dim) + idx) / double(r.ratio);
    if (r.ratio > 1) f.carry_bytes += 2 * int64_t(r.ratio) * c.head_dim * 4;
  }
  if (!c.engram_layer_ids.empty())
    f.engram_history_bytes = int64_t(c.engram_max_ngram_size - 1) * 8;
  return f;
}

}  // namespace deepinfer
