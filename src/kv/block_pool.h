// A fixed pool of KV blocks: pure bookkeeping, no bytes. Allocation and release are O(1) through
// an intrusive free list (a FIFO queue: allocation takes the head, release appends).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace deepinfer {

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks);

  int32_t num_blocks() const { return int32_t(used_.size()); }
  int32_t num_free() const { return n_free_; }
  int32_t num_used() const { return num_blocks() - n_free_; }

  // A free block, or -1 when none is left.
  int32_t allocate();
  // Gives a block in use back.
  void release(int32_t block);

 private:
  void push_free(int32_t b);
  std::vector<bool> used_;
  std::vector<int32_t> next_;
  int32_t head_ = -1, tail_ = -1, n_free_ = 0;
};

}  // namespace deepinfer
