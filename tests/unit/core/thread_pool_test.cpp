#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "core/region_timer.h"
#include "core/thread_pool.h"
#include "util/tensor_view.h"

namespace deepinfer {
namespace {

TEST(ThreadPool, EveryIndexExactlyOnce) {
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 7, 64, 1000, 12345}) {
      for (int64_t grain : {1, 3, 64, 5000}) {
        std::vector<std::atomic<int>> hits(size_t(n > 0 ? n : 1));
        for (auto& h : hits) h = 0;
        pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
          ASSERT_LE(e - b, grain);
          for (int64_t i = b; i < e; ++i) hits[size_t(i)]++;
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << i;
      }
    }
  }
}

TEST(ThreadPool, ManySmallJobsAndNesting) {
  ThreadPool pool(4);
  std::atomic<int64_t> sum{0};
  for (int rep = 0; rep < 20000; ++rep)
    pool.parallel_for(8, 1, [&](int64_t b, int64_t e) {
      // A nested call runs inline on this thread.
      pool.parallel_for(2, 1, [&](int64_t b2, int64_t e2) { sum += (e - b) * (e2 - b2); });
    });
  EXPECT_EQ(sum.load(), 20000 * 8 * 2);
}

TEST(RegionTimer, CountsNamedRegions) {
  RegionTimer::set_enabled(true);
  RegionTimer::reset();
  for (int i = 0; i < 3; ++i) {
    DI_REGION("test.outer");
    DI_REGION("test.inner");
  }
  const auto rows = RegionTimer::snapshot();
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].name, "test.inner");  // inner closes first
  EXPECT_EQ(rows[0].calls, 3u);
  EXPECT_EQ(rows[1].name, "test.outer");
  RegionTimer::reset();
  RegionTimer::set_enabled(false);
}

TEST(TensorView, ContiguousStridesAndRows) {
  float data[24];
  for (int i = 0; i < 24; ++i) data[i] = float(i);
  TensorView t(data, DType::F32, {2, 3, 4});
  EXPECT_EQ(t.stride[0], 12);
  EXPECT_EQ(t.stride[2], 1);
  EXPECT_TRUE(t.contiguous());
  EXPECT_EQ(t.nbytes(), 96u);
  TensorView r = t.row(1);
  EXPECT_EQ(r.shape, Shape({3, 4}));
  EXPECT_EQ(r.ptr<float>()[0], 12.0f);
  EXPECT_THROW(t.row(2), Error);
  EXPECT_EQ(t.shape.str(), "[2, 3, 4]");
}

}  // namespace
}  // namespace deepinfer
