// A fixed pool of KV blocks: pure bookkeeping, no bytes. Allocation and release are O(1) through
// an intrusive free list (a FIFO queue: allocation takes the head, release appends); blocks carry
// reference counts so that sequences may share blocks (a block returns to the free list when its
// last reference goes).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace deepinfer {

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks);

  int32_t num_blocks() const { return int32_t(ref_.size()); }
  int32_t num_free() const { return n_free_; }
  int32_t num_used() const { return num_blocks() - n_free_; }

  // A free block with reference count 1, or -1 when none is left.
  int32_t allocate();
  // Adds a reference to a block in use.
  void retain(int32_t block);
  // Drops a reference; the block is free again when none remain.
  void release(int32_t block);
  int32_t ref_count(int32_t block) const { return ref_[size_t(block)]; }

 private:
  void push_free(int32_t b);
  void check_used(int32_t block, const char* what) const;
  std::vector<int32_t> ref_, next_;
  int32_t head_ = -1, tail_ = -1, n_free_ = 0;
};

}  // namespace deepinfer
