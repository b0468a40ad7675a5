// The vector cache-row decoders and bf16 rounding against their scalar twins over every code,
// scale and odd bit pattern (NaN, infinity, subnormals); bit-exact, NaN matching NaN.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <random>

#include "kernel_test_util.h"
#include "kernels/elementwise.h"
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

// The vector exp (the softmax's) against the reference's f32(exp(double(x))), bit for bit: random
// arguments over the whole range used and past it, and the edges (underflow to 0, float
// subnormals, the lanes left to the library, NaN and infinities), on every ISA.
TEST(QuantFast, ExpMatchesLibrary) {
  KernelEnvGuard guard;
  std::vector<float> x = {0.0f,     -0.0f,   -104.0f,  -103.98f,  -103.97f,     -103.9f,
                          -87.34f,  -87.33f, -87.0f,   -1e-30f,   -1e-8f,       -0.5f,
                          -0.6931f, 79.99f,  80.0f,    80.01f,    88.7f,        88.8f,
                          100.0f,   -1e30f,  INFINITY, -INFINITY, std::nanf("")};
  std::mt19937_64 rng(11);
  std::uniform_real_distribution<float> wide(-110.0f, 90.0f), near0(-20.0f, 0.0f);
  for (int i = 0; i < 1000000; ++i) x.push_back(i & 1 ? wide(rng) : near0(rng));
  for (Isa isa : machine_isas()) {
    set_cpu_isa(isa);
    std::vector<float> got = x;
    exp_f_n(got.data(), int64_t(got.size()));
    for (size_t i = 0; i < x.size(); ++i) {
      const float want = exp_f(x[i]);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(got[i])) << x[i];
        continue;
      }
      ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want))
          << isa_name(isa) << " x = " << x[i] << ": got " << got[i] << ", want " << want;
    }
  }
}

// The MoE's SwiGLU in vectors against swiglu_ref, bit for bit: clamped and unclamped, arguments
// whose exp the vectors leave to the library (|g| > 80), zeros of both signs, every length's
// tail, on every ISA.
TEST(QuantFast, SwigluMatchesRef) {
  KernelEnvGuard guard;
  std::mt19937_64 rng(12);
  std::normal_distribution<float> nd;
  std::uniform_real_distribution<float> wide(-120.0f, 120.0f);
  for (float limit : {10.0f, 0.0f})
    for (int64_t n : {1, 7, 8, 9, 768, 200000}) {
      std::vector<float> g(static_cast<size_t>(n)), u(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        g[size_t(i)] = i % 5 == 0 ? wide(rng) : nd(rng) * 4.0f;
        u[size_t(i)] = i % 7 == 0 ? wide(rng) : nd(rng) * 4.0f;
      }
      g[0] = -0.0f;
      if (n > 3) g[3] = 0.0f;
      for (Isa isa : machine_isas()) {
        set_cpu_isa(isa);
        std::vector<float> want = g, got = g;
        swiglu_ref(want.data(), u.data(), n, limit, 0.37f);
        swiglu(got.data(), u.data(), n, limit, 0.37f);
        for (int64_t i = 0; i < n; ++i)
          ASSERT_EQ(std::bit_cast<uint32_t>(got[size_t(i)]),
                    std::bit_cast<uint32_t>(want[size_t(i)]))
              << isa_name(isa) << " limit " << limit << " g = " << g[size_t(i)]
              << " u = " << u[size_t(i)] << ": got " << got[size_t(i)] << ", want "
              << want[size_t(i)];
      }
    }
}

}  // namespace
}  // namespace deepinfer::testing
