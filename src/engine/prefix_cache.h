// Prefix caching (DESIGN.md §1): full KV blocks stay cached after their sequences end, keyed by a
// hash chain of the tokens up to their end, and a new sequence whose prompt starts with cached
// blocks takes them (shared, read-only, reference-counted in the BlockPool) instead of computing
// them again. Pure bookkeeping: the Scheduler moves blocks, the model moves bytes.
//
// A V4.1 sequence's state at a position is more than its blocks: the window rings of every layer
// and the Engram n-gram history live in its slot. So a block boundary can only be resumed from
// when a snapshot of that slot state was taken there (the compressor carry is empty at a block
// boundary: blocks hold whole compressed groups). Snapshots are taken when a block completes and
// kept in a fixed number of KV-cache snapshot buffers, least recently used first out; a hit is
// the longest run of cached blocks from the start whose last block still has its snapshot.
//
// Blocks nobody holds stay in the pool's free queue and go, least recently released first, when
// the pool needs blocks; their entries (and snapshots) are dropped then. Entries are matched on
// the parent's hash and the block's own tokens, so a hash collision cannot give wrong content.
// One cache serves one engine: the model, its numerics and its Engram map never change under it.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

namespace deepinfer {

class PrefixCache {
 public:
  // Blocks of `block_tokens` tokens in `n_pools` pools (context-parallel ranks: block i of a
  // sequence in pool i mod n_pools) of `blocks_per_pool` blocks; `num_snapshots` 0: disabled.
  PrefixCache(int64_t block_tokens, int32_t n_pools, int32_t blocks_per_pool,
              int32_t num_snapshots);
  bool enabled() const { return !snap_owner_.empty(); }

  // Appends the chain hashes of the full blocks of `tokens` not yet in `hashes` (hash i covers
  // tokens [0, (i + 1) * block_tokens)).
  void extend_hashes(std::span<const int32_t> tokens, std::vector<uint64_t>* hashes) const;

  struct Hit {
    std::vector<int32_t> blocks;  // block i in pool i mod n_pools
    int32_t snapshot = -1;        // the slot state after the last of them
  };
  // The longest cached prefix of `tokens` made of blocks 0 .. n - 1 with a snapshot after block
  // n - 1, at most `max_blocks` long; `hashes` as extend_hashes made them. The caller must hold
  // the blocks before the pool hands out another block.
  Hit lookup(std::span<const int32_t> tokens, std::span<const uint64_t> hashes, int64_t max_blocks);

  // A snapshot buffer for the state after a block about to complete (the least recently used,
  // whatever it held); the caller adds the block with publish() once the step that fills it ran.
  int32_t take_snapshot();
  // Enters block `index` of a sequence (`block` in its pool, full, its tokens `block_tokens`) with
  // the snapshot taken after it; false (the snapshot is freed) when an equal block is cached.
  bool publish(std::span<const uint64_t> hashes, size_t index, std::span<const int32_t> tokens,
               int32_t block, int32_t snapshot);
  // The pool is reusing `block` of pool `pool`: forgets what it held.
  void evict(int32_t pool, int32_t block);

 private:
  struct Entry {
    uint64_t parent = 0;
    std::vector<int32_t> tokens;
    int32_t pool = 0, block = -1, snapshot = -1;
  };
  void drop_snapshot(int32_t snap);

  int64_t block_tokens_;
  int32_t n_pools_, blocks_per_pool_;
  std::unordered_map<uint64_t, Entry> entries_;  // by chain hash
  std::vector<uint64_t> key_of_;                 // [pool * blocks_per_pool + block]
  std::vector<uint8_t> keyed_;                   // whether key_of_ is set
  std::vector<uint64_t> snap_owner_;             // [snapshot] -> entry key
  std::vector<uint8_t> snap_owned_;
  std::vector<uint64_t> snap_used_;  // [snapshot] last use (0: never)
  uint64_t tick_ = 0;
};

}  // namespace deepinfer
