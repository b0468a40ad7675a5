// A fixed pool of KV blocks: pure bookkeeping, no bytes. Blocks are reference-counted (prefix
// caching lets several sequences hold one block); a block nobody holds is free and sits in a
// queue ordered by release: allocation takes the least recently released one, and a free block
// whose content is still wanted (a cached prefix) can be taken back out of the middle of the
// queue. Every operation is O(1) (an intrusive doubly linked list).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/error.h"

namespace deepinfer {

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks)
      : refs_(size_t(num_blocks), 0), prev_(size_t(num_blocks), -1), next_(size_t(num_blocks), -1) {
    DI_REQUIRE(num_blocks >= 0, "KV pool: number of blocks must be >= 0, got ", num_blocks);
    for (int32_t b = 0; b < num_blocks; ++b) push_free(b);
  }

  int32_t num_blocks() const { return int32_t(refs_.size()); }
  int32_t num_free() const { return n_free_; }
  int32_t num_used() const { return num_blocks() - n_free_; }
  int32_t refs(int32_t block) const { return refs_[size_t(block)]; }

  // The least recently released free block, now held once; -1 when none is left.
  int32_t allocate() {
    const int32_t b = head_;
    if (b >= 0) ref(b);
    return b;
  }

  // Holds `block` once more (a free one leaves the queue).
  void ref(int32_t block) {
    DI_CHECK(block >= 0 && block < num_blocks(), "block ", block, " out of range");
    if (refs_[size_t(block)]++ == 0) unlink(block);
  }

  // Lets go of a block held; the last holder frees it (to the back of the queue).
  void release(int32_t block) {
    DI_CHECK(block >= 0 && block < num_blocks() && refs_[size_t(block)] > 0, "release of block ",
             block);
    if (--refs_[size_t(block)] == 0) push_free(block);
  }

 private:
  void push_free(int32_t b) {
    prev_[size_t(b)] = tail_;
    next_[size_t(b)] = -1;
    (tail_ >= 0 ? next_[size_t(tail_)] : head_) = b;
    tail_ = b;
    ++n_free_;
  }
  void unlink(int32_t b) {
    const int32_t p = prev_[size_t(b)], n = next_[size_t(b)];
    (p >= 0 ? next_[size_t(p)] : head_) = n;
    (n >= 0 ? prev_[size_t(n)] : tail_) = p;
    --n_free_;
  }

  std::vector<int32_t> refs_, prev_, next_;
  int32_t head_ = -1, tail_ = -1, n_free_ = 0;
};

}  // namespace deepinfer
