#include "kv/block_pool.h"

#include "core/error.h"

namespace deepinfer {

BlockPool::BlockPool(int32_t num_blocks)
    : used_(size_t(num_blocks), false), next_(size_t(num_blocks), -1) {
  DI_REQUIRE(num_blocks >= 0, "KV pool: number of blocks must be >= 0, got ", num_blocks);
  for (int32_t b = 0; b < num_blocks; ++b) push_free(b);
}

void BlockPool::push_free(int32_t b) {
  // Freed blocks go to the tail and allocation takes the head: least recently freed first.
  next_[size_t(b)] = -1;
  (tail_ >= 0 ? next_[size_t(tail_)] : head_) = b;
  tail_ = b;
  ++n_free_;
}

int32_t BlockPool::allocate() {
  const int32_t b = head_;
  if (b < 0) return -1;
  head_ = next_[size_t(b)];
  if (head_ < 0) tail_ = -1;
  --n_free_;
  used_[size_t(b)] = true;
  return b;
}

void BlockPool::release(int32_t block) {
  DI_CHECK(block >= 0 && block < num_blocks() && used_[size_t(block)], "release of block ", block);
  used_[size_t(block)] = false;
  push_free(block);
}

}  // namespace deepinfer
