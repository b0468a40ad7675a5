// A fixed pool of KV blocks: pure bookkeeping, no bytes. Allocation and release are O(1) through
// a FIFO queue of free blocks: the least recently freed block is reused first.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

#include "core/error.h"

namespace deepinfer {

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks) : used_(size_t(std::max(num_blocks, 0)), false) {
    DI_REQUIRE(num_blocks >= 0, "KV pool: number of blocks must be >= 0, got ", num_blocks);
    for (int32_t b = 0; b < num_blocks; ++b) free_.push_back(b);
  }

  int32_t num_blocks() const { return int32_t(used_.size()); }
  int32_t num_free() const { return int32_t(free_.size()); }
  int32_t num_used() const { return num_blocks() - num_free(); }

  // A free block, or -1 when none is left.
  int32_t allocate() {
    if (free_.empty()) return -1;
    const int32_t b = free_.front();
    free_.pop_front();
    used_[size_t(b)] = true;
    return b;
  }

  // Gives a block in use back.
  void release(int32_t block) {
    DI_CHECK(block >= 0 && block < num_blocks() && used_[size_t(block)], "release of block ",
             block);
    used_[size_t(block)] = false;
    free_.push_back(block);
  }

 private:
  std::vector<bool> used_;
  std::deque<int32_t> free_;  // freed blocks join the back, allocation takes the front
};

}  // namespace deepinfer
