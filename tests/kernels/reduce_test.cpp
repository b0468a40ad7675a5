// argmax against std::max_element (its twin: the loop it replaced) over lengths around the
// vector and block widths, with ties, signed zeros, infinities and NaNs anywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/reduce.h"

namespace deepinfer {
namespace {

TEST(Reduce, ArgmaxIsMaxElement) {
  std::mt19937_64 rng(7);
  const float inf = std::numeric_limits<float>::infinity();
  const float pool[] = {std::nanf(""), 0.0f, -0.0f, inf, -inf, -2.0f, -1.0f, 1.0f, 2.0f, 0.5f};
  for (int it = 0; it < 20000; ++it) {
    const int64_t n = 1 + int64_t(rng() % 200);
    std::vector<float> x(static_cast<size_t>(n));
    const bool sparse_specials = it % 2;  // mostly ordinary values, or specials everywhere
    for (float& v : x) {
      const uint64_t r = rng();
      v = sparse_specials && r % 16 ? float(int64_t(r >> 8) % 1000) / 7.0f : pool[r % 10];
    }
    const int64_t want = std::max_element(x.begin(), x.end()) - x.begin();
    ASSERT_EQ(argmax(x.data(), n), want) << "n=" << n << " it=" << it;
  }
  // A vocabulary-sized row with the maximum in its last element and in its first.
  std::vector<float> big(129280, -3.0f);
  big.back() = 5.0f;
  EXPECT_EQ(argmax(big.data(), int64_t(big.size())), int64_t(big.size()) - 1);
  big.front() = 5.0f;
  EXPECT_EQ(argmax(big.data(), int64_t(big.size())), 0);
}

}  // namespace
}  // namespace deepinfer
