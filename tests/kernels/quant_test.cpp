// The vector cache-row decoders and bf16 rounding against their scalar twins over every code,
// scale and odd bit pattern (NaN, infinity, subnormals); bit-exact, NaN matching NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kernel_test_util.h"
#include "kernels/quant.h"

namespace deepinfer::testing {
namespace {

void expect_same(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    ASSERT_EQ(std::memcmp(&a[i], &b[i], 4), 0)
        << what << " element " << i << ": " << a[i] << " vs " << b[i];
  }
}

TEST(QuantFast, DecodersMatchRef) {
  KernelEnvGuard guard;
  std::mt19937_64 rng(3);
  const int64_t n = 32 * 40;
  std::vector<uint8_t> codes(static_cast<size_t>(n)), packed(size_t(n / 2)), s32(size_t(n / 32)),
      s16(size_t(n / 16));
  for (int64_t i = 0; i < n; ++i) codes[size_t(i)] = uint8_t(i);  // every e4m3 code, NaN included
  for (auto& b : packed) b = uint8_t(rng());
  for (size_t i = 0; i < s32.size(); ++i)
    s32[i] = uint8_t(i < 4 ? (i == 0 ? 0 : i == 1 ? 255 : 1) : rng());
  for (auto& b : s16) b = uint8_t(rng());  // e4m3 scales, NaN codes included
  std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
  for (Isa isa : machine_isas()) {
    set_cpu_isa(isa);
    fp8_dequant_ref(codes.data(), s32.data(), n, want.data());
    fp8_dequant(codes.data(), s32.data(), n, got.data());
    expect_same(want, got, "fp8");
    fp4i_dequant_ref(packed.data(), s32.data(), n, want.data());
    fp4i_dequant(packed.data(), s32.data(), n, got.data());
    expect_same(want, got, "fp4i");
    fp4c_dequant_ref(packed.data(), s16.data(), n, want.data());
    fp4c_dequant(packed.data(), s16.data(), n, got.data());
    expect_same(want, got, "fp4c");
  }
}

TEST(QuantFast, RoundBf16MatchesRef) {
  KernelEnvGuard guard;
  std::mt19937_64 rng(4);
  for (int64_t n : {1, 15, 16, 17, 1000}) {
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) {
      const uint32_t u = uint32_t(rng());
      std::memcpy(&v, &u, 4);  // any bit pattern: NaN, infinity, subnormals, ties
    }
    x[0] = std::ldexp(1.0f, 127) * 1.9999999f;  // rounds up to infinity
    for (Isa isa : machine_isas()) {
      set_cpu_isa(isa);
      std::vector<float> want(x), got(x);
      round_bf16_inplace_ref(want.data(), n);
      round_bf16_inplace(got.data(), n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(std::memcmp(&want[size_t(i)], &got[size_t(i)], 4), 0)
            << isa_name(isa) << " n=" << n << " element " << i;
    }
  }
}

}  // namespace
}  // namespace deepinfer::testing
