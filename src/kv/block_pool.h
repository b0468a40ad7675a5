// A fixed pool of KV blocks: pure bookkeeping, no bytes. Allocation and release are O(1) through
// an intrusive free list (a FIFO queue: allocation takes the head, release appends).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/error.h"

namespace deepinfer {

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks)
      : used_(size_t(num_blocks), false), next_(size_t(num_blocks), -1) {
    DI_REQUIRE(num_blocks >= 0, "KV pool: number of blocks must be >= 0, got ", num_blocks);
    for (int32_t b = 0; b < num_blocks; ++b) push_free(b);
  }

  int32_t num_blocks() const { return int32_t(used_.size()); }
  int32_t num_free() const { return n_free_; }
  int32_t num_used() const { return num_blocks() - n_free_; }

  // A free block, or -1 when none is left.
  int32_t allocate() {
    const int32_t b = head_;
    if (b < 0) return -1;
    head_ = next_[size_t(b)];
    if (head_ < 0) tail_ = -1;
    --n_free_;
    used_[size_t(b)] = true;
    return b;
  }

  // Gives a block in use back.
  void release(int32_t block) {
    DI_CHECK(block >= 0 && block < num_blocks() && used_[size_t(block)], "release of block ",
             block);
    used_[size_t(block)] = false;
    push_free(block);
  }

 private:
  // Freed blocks go to the tail and allocation takes the head: least recently freed first.
  void push_free(int32_t b) {
    next_[size_t(b)] = -1;
    (tail_ >= 0 ? next_[size_t(tail_)] : head_) = b;
    tail_ = b;
    ++n_free_;
  }

  std::vector<bool> used_;
  std::vector<int32_t> next_;
  int32_t head_ = -1, tail_ = -1, n_free_ = 0;
};

}  // namespace deepinfer
