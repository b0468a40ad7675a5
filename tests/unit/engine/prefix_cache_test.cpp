// PrefixCache bookkeeping: chain hashes, matching on parent and tokens, snapshots (least recently
// used first out), eviction of reused blocks.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

namespace deepinfer {
namespace {

std::vector<int32_t> iota_tokens(int32_t n, int32_t from = 100) {
  std::vector<int32_t> t(size_t(n), 0);
  std::iota(t.begin(), t.end(), from);
  return t;
}

TEST(PrefixCache, HashesChainOverWholeBlocks) {
  PrefixCache c(4, 1, 16, 2);
  std::vector<uint64_t> h, h2;
  c.extend_hashes(iota_tokens(11), &h);
  ASSERT_EQ(h.size(), 2u);  // 11 tokens: two whole blocks of 4
  c.extend_hashes(iota_tokens(12), &h);
  ASSERT_EQ(h.size(), 3u);
  // Block 1's hash depends on block 0's tokens.
  std::vector<int32_t> other = iota_tokens(8);
  other[0] = 7;
  c.extend_hashes(other, &h2);
  EXPECT_NE(h2[0], h[0]);
  EXPECT_NE(h2[1], h[1]);
}

TEST(PrefixCache, HitsStopAtTheDeepestBlockWithASnapshot) {
  PrefixCache c(4, 1, 16, 3);
  const std::vector<int32_t> t = iota_tokens(16);
  std::vector<uint64_t> h;
  c.extend_hashes(t, &h);
  // Blocks 0..2 entered (as blocks 5, 6, 7); block 1 without a snapshot.
  const int32_t s0 = c.take_snapshot(), s2 = c.take_snapshot();
  EXPECT_TRUE(c.publish(h, 0, t, 5, s0));
  EXPECT_TRUE(c.publish(h, 1, t, 6, -1));
  EXPECT_TRUE(c.publish(h, 2, t, 7, s2));
  PrefixCache::Hit hit = c.lookup(t, h, 4);
  EXPECT_EQ(hit.blocks, (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(hit.snapshot, s2);
  // At most two blocks: block 1 has no snapshot, so only block 0.
  hit = c.lookup(t, h, 2);
  EXPECT_EQ(hit.blocks, (std::vector<int32_t>{5}));
  EXPECT_EQ(hit.snapshot, s0);
  // Another prompt that shares block 0 only.
  std::vector<int32_t> u = t;
  u[5] = 1;
  std::vector<uint64_t> hu;
  c.extend_hashes(u, &hu);
  EXPECT_EQ(c.lookup(u, hu, 4).blocks, (std::vector<int32_t>{5}));
  // An equal block is not entered twice (its snapshot is freed).
  EXPECT_FALSE(c.publish(h, 0, t, 9, c.take_snapshot()));
  // The pool reuses block 5: nothing is found any more (block 0 is gone).
  c.evict(0, 5);
  EXPECT_TRUE(c.lookup(t, h, 4).blocks.empty());
  c.evict(0, 5);  // not cached: nothing happens
}

TEST(PrefixCache, TokensMustMatchNotJustTheHash) {
  PrefixCache c(2, 1, 8, 2);
  const std::vector<int32_t> t = iota_tokens(4);
  std::vector<uint64_t> h;
  c.extend_hashes(t, &h);
  c.publish(h, 0, t, 0, c.take_snapshot());
  // Same hashes, different tokens (as if they collided): no hit.
  std::vector<int32_t> forged = t;
  forged[1] = 0;
  EXPECT_TRUE(c.lookup(forged, h, 2).blocks.empty());
  EXPECT_EQ(c.lookup(t, h, 2).blocks.size(), 1u);
}

TEST(PrefixCache, SnapshotsGoLeastRecentlyUsedFirst) {
  PrefixCache c(2, 2, 8, 2);  // two pools: block i of a sequence in pool i mod 2
  const std::vector<int32_t> t = iota_tokens(8);
  std::vector<uint64_t> h;
  c.extend_hashes(t, &h);
  const int32_t a = c.take_snapshot(), b = c.take_snapshot();
  EXPECT_NE(a, b);
  c.publish(h, 0, t, 3, a);
  c.publish(h, 1, t, 3, b);  // block 3 of the other pool
  EXPECT_EQ(c.lookup(t, h, 3).snapshot, b);
  EXPECT_EQ(c.lookup(t, h, 1).snapshot, a);  // a used last
  // A third snapshot takes b's buffer: the hit falls back to block 0.
  EXPECT_EQ(c.take_snapshot(), b);
  const PrefixCache::Hit hit = c.lookup(t, h, 3);
  EXPECT_EQ(hit.blocks.size(), 1u);
  EXPECT_EQ(hit.snapshot, a);
  // Evicting pool 1's block 3 leaves pool 0's block 3 cached.
  c.evict(1, 3);
  EXPECT_EQ(c.lookup(t, h, 3).blocks.size(), 1u);
  EXPECT_FALSE(PrefixCache(2, 1, 8, 0).enabled());
}

}  // namespace
}  // namespace deepinfer
