#include "kv/block_pool.h"

#include "core/error.h"

namespace deepinfer {

BlockPool::BlockPool(int32_t num_blocks)
    : ref_(size_t(num_blocks), 0), next_(size_t(num_blocks), -1), prev_(size_t(num_blocks), -1) {
  DI_REQUIRE(num_blocks >= 0, "KV pool: number of blocks must be >= 0, got ", num_blocks);
  for (int32_t b = 0; b < num_blocks; ++b) push_free(b);
}

void BlockPool::push_free(int32_t b) {
  // Freed blocks go to the tail and allocation takes the head: least recently freed first.
  prev_[size_t(b)] = tail_;
  next_[size_t(b)] = -1;
  if (tail_ >= 0)
    next_[size_t(tail_)] = b;
  else
    head_ = b;
  tail_ = b;
  ++n_free_;
}

void BlockPool::unlink(int32_t b) {
  const int32_t p = prev_[size_t(b)], n = next_[size_t(b)];
  if (p >= 0)
    next_[size_t(p)] = n;
  else
    head_ = n;
  if (n >= 0)
    prev_[size_t(n)] = p;
  else
    tail_ = p;
  prev_[size_t(b)] = next_[size_t(b)] = -1;
  --n_free_;
}

int32_t BlockPool::allocate() {
  if (head_ < 0) return -1;
  const int32_t b = head_;
  unlink(b);
  ref_[size_t(b)] = 1;
  return b;
}

void BlockPool::retain(int32_t block) {
  DI_CHECK(block >= 0 && block < num_blocks() && ref_[size_t(block)] > 0, "retain of block ",
           block);
  ++ref_[size_t(block)];
}

void BlockPool::release(int32_t block) {
  DI_CHECK(block >= 0 && block < num_blocks() && ref_[size_t(block)] > 0, "release of block ",
           block);
  if (--ref_[size_t(block)] == 0) push_free(block);
}

}  // namespace deepinfer
