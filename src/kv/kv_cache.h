// The bytes of every attention cache, layer-major (DESIGN.md §2, V41_SPEC.md §12.1).
//
// Context-sized caches (compressed KV rows at every KV source, index keys at every key owner) are
// paged: a block holds `block_tokens` tokens of context, i.e. block_tokens / r rows of a layer
// with ratio r, and a sequence's block table lists its blocks in order. Each layer's rows of all
// blocks form one contiguous region (block b of layer l at region_l + b * block_bytes_l), so a
// per-layer kernel reads one region. Fixed-size per-sequence state (window rings of every layer,
// compressor carries, the Engram token history, the decode-defect key pointer) lives in
// preallocated slots, one per concurrently running sequence.
//
// Slot state is only meaningful for the positions the sequence has processed; the model tracks
// positions, this class tracks bytes.
//
// Each cache is kept in the format the model was trained with, as device engines store it:
//   window KV       e4m3 values + one e8m0 scale per 32      (Dh + Dh/32 bytes per slot)
//   compressed KV   packed e2m1 + one e4m3 scale per 16     (Dh/2 + Dh/16 bytes per row)
//   index keys      packed e2m1 + one e8m0 scale per 32     (Di/2 + Di/32 bytes per row)
// These hold exactly the values the reference keeps in bf16 (fp8/fp4 fake-quantized), so storing
// them packed loses nothing. Compressed rows and index keys grow with the context (one row per r
// tokens at each KV source); window rings, compressor carries and the Engram token history have a
// fixed size per sequence.
#pragma once

#include <cstdint>
#include <vector>

#include "core/error.h"
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
  // A prefix-cache snapshot: the rings and the history at a block boundary (the compressor carry
  // is empty there, blocks being whole compressed groups).
  int64_t snapshot_bytes() const { return window_bytes + engram_history_bytes; }
};

// With `draft_layers`, the draft head's rings count among the window rings.
KvFootprint kv_footprint(const ModelConfig& c, int draft_layers = 0);

struct KvCacheOptions {
  int32_t num_blocks = 0;
  int64_t block_tokens = 64;  // must be a multiple of every compress ratio
  int32_t max_seqs = 1;
  int32_t num_snapshots = 0;  // prefix-cache snapshots of slot state
  bool slot_backups = false;  // one backup of each slot's state (speculative decoding)
  // Window-only layers after the backbone's (the DSpark draft head's rings: layer ids n_layers +
  // stage), part of the slot state like every other ring.
  int32_t draft_layers = 0;
};

// A sequence's view: its slot and its block table.
struct SeqKv {
  int32_t slot = 0;
  const int32_t* blocks = nullptr;
  int64_t n_blocks = 0;
};

class KvCache {
 public:
  KvCache(const ModelConfig& c, const KvCacheOptions& opt);

  int64_t block_tokens() const { return block_tokens_; }
  int num_layers() const { return int(layers_.size()); }  // backbone + draft layers
  int32_t max_seqs() const { return max_seqs_; }
  uint64_t bytes() const;

  // Compressed-KV row `row` of KV source `layer` (packed fp4-C, compressed_kv_row_bytes).
  uint8_t* cmp_row(int layer, const SeqKv& s, int64_t row) { return paged_row(layer, 0, s, row); }
  // Index-key row of key owner `layer` (packed fp4-I, index_key_row_bytes).
  uint8_t* idx_row(int layer, const SeqKv& s, int64_t row) { return paged_row(layer, 1, s, row); }
  // Window ring entry `index` (position p lives at p mod W) of `layer` (packed fp8).
  uint8_t* window_slot(int layer, int32_t slot, int64_t index) {
    return ring(&LayerRegion::window, layer, slot, max_seqs_, index);
  }
  // Compressor carry of KV source `layer` (r > 1): [r, 2, Dh] fp32 (k row then gate row).
  float* carry(int layer, int32_t slot) {
    DI_CHECK(layer >= 0 && layer < num_layers() && !layers_[size_t(layer)].carry.empty());
    return part(layers_[size_t(layer)].carry, slot, max_seqs_);
  }
  // Engram history: the compressed ids of the last Ng - 1 positions, oldest first.
  int64_t* engram_history(int32_t slot) { return part(history_, slot, max_seqs_); }
  // The layer whose index keys the reference's decode path would score next (§6.8 switch).
  int32_t& last_key_layer(int32_t slot) { return last_key_layer_[size_t(slot)]; }

  // Prefix caching: snapshot `snap` of a slot's state at a block boundary, laid out as the slot
  // (ring entry `index` of `layer`, the Engram history), and its copy back into a slot.
  uint8_t* snapshot_window(int layer, int32_t snap, int64_t index) {
    return ring(&LayerRegion::snapshot_window, layer, snap, num_snapshots_, index);
  }
  int64_t* snapshot_history(int32_t snap) { return part(snapshot_history_, snap, num_snapshots_); }
  void restore_snapshot(int32_t snap, int32_t slot);
  // Speculative decoding: a copy of all of a slot's state (rings, carries, history, key layer)
  // taken before a step that verifies drafts, and put back when some were rejected.
  void backup_slot(int32_t slot) { copy_slot_state(slot, true); }
  void restore_slot(int32_t slot) { copy_slot_state(slot, false); }

  // Tokens of context a sequence with `n_blocks` blocks can hold (at every layer).
  int64_t capacity_tokens(int64_t n_blocks) const { return n_blocks * block_tokens_; }

 private:
  struct LayerRegion {
    // [0] compressed KV, [1] index keys: [num_blocks, block_tokens / r, row bytes]
    std::vector<uint8_t> paged[2];
    int64_t row_bytes[2] = {0, 0}, rows_per_block = 0;
    std::vector<uint8_t> window;           // [max_seqs, W, row bytes]
    std::vector<uint8_t> snapshot_window;  // [num_snapshots, W, row bytes]
    std::vector<float> carry;              // [max_seqs, r, 2, Dh]
    std::vector<uint8_t> backup_window;    // [max_seqs, W, row bytes] with slot_backups
    std::vector<float> backup_carry;
  };
  // Row `row` of a sequence in cache `which` (0: compressed KV, 1: index keys) of `layer`.
  uint8_t* paged_row(int layer, int which, const SeqKv& s, int64_t row);
  // Share `i` of `n` equal shares of `v` (a slot's or a snapshot's part of its array).
  template <typename T>
  static T* part(std::vector<T>& v, int32_t i, int32_t n) {
    DI_CHECK(i >= 0 && i < n);
    return v.data() + size_t(i) * (v.size() / size_t(n));
  }
  // Entry `index` of ring `i` of `n` in the rings `rings` of `layer`.
  uint8_t* ring(std::vector<uint8_t> LayerRegion::*rings, int layer, int32_t i, int32_t n,
                int64_t index) {
    DI_CHECK(layer >= 0 && layer < num_layers() && index >= 0 && index < window_);
    return part(layers_[size_t(layer)].*rings, i, n) + index * window_row_bytes_;
  }
  void copy_slot_state(int32_t slot, bool to_backup);

  int64_t block_tokens_;
  int32_t num_blocks_, max_seqs_, num_snapshots_;
  int64_t window_, window_row_bytes_, history_len_;
  std::vector<LayerRegion> layers_;
  std::vector<int64_t> history_;           // [max_seqs, Ng - 1]
  std::vector<int64_t> snapshot_history_;  // [num_snapshots, Ng - 1]
  std::vector<int64_t> backup_history_;
  std::vector<int32_t> backup_key_layer_;
  std::vector<int32_t> last_key_layer_;
};

}  // namespace deepinfer
