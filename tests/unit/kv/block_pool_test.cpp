#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

#include "kv/block_pool.h"

namespace deepinfer {
namespace {

TEST(BlockPool, AllocatesEveryBlockOnceThenRunsOut) {
  BlockPool pool(5);
  std::set<int32_t> got;
  for (int i = 0; i < 5; ++i) got.insert(pool.allocate());
  EXPECT_EQ(got, (std::set<int32_t>{0, 1, 2, 3, 4}));
  EXPECT_EQ(pool.num_free(), 0);
  EXPECT_EQ(pool.allocate(), -1);
  pool.release(3);
  EXPECT_EQ(pool.num_free(), 1);
  EXPECT_EQ(pool.allocate(), 3);
}

TEST(BlockPool, DoubleReleaseIsCaught) {
  BlockPool pool(2);
  const int32_t b = pool.allocate();
  pool.release(b);
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_ANY_THROW(pool.release(b));
}

TEST(BlockPool, RandomWorkloadKeepsExactAccounting) {
  BlockPool pool(64);
  std::mt19937 rng(3);
  std::vector<int32_t> held;
  for (int step = 0; step < 20000; ++step) {
    if (rng() % 2 && pool.num_free() > 0) {
      held.push_back(pool.allocate());
    } else if (!held.empty()) {
      const size_t i = rng() % held.size();
      pool.release(held[i]);
      held.erase(held.begin() + long(i));
    }
    ASSERT_EQ(pool.num_used(), int32_t(held.size()));
  }
  std::set<int32_t> distinct(held.begin(), held.end());
  EXPECT_EQ(distinct.size(), held.size());
  for (int32_t b : held) pool.release(b);
  EXPECT_EQ(pool.num_free(), 64);
}

TEST(BlockPool, SharedBlocksFreeWithTheirLastHolderAndLeaveInReleaseOrder) {
  BlockPool pool(4);
  const int32_t a = pool.allocate(), b = pool.allocate();
  EXPECT_EQ(pool.num_free(), 2);
  pool.ref(a);  // a second holder
  pool.release(a);
  EXPECT_EQ(pool.refs(a), 1);
  EXPECT_EQ(pool.num_free(), 2);
  pool.release(b);
  pool.release(a);
  EXPECT_EQ(pool.num_free(), 4);
  // A free block taken back out of the middle of the queue (a prefix-cache hit).
  pool.ref(b);
  EXPECT_EQ(pool.num_free(), 3);
  // The rest go least recently released first: the never-used blocks, then a.
  const int32_t c = pool.allocate(), d = pool.allocate();
  EXPECT_EQ(std::set<int32_t>({c, d}), (std::set<int32_t>{2, 3}));
  EXPECT_EQ(pool.allocate(), a);
  EXPECT_EQ(pool.allocate(), -1);
  EXPECT_ANY_THROW(pool.ref(7));
}

}  // namespace
}  // namespace deepinfer
