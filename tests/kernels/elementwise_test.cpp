// The vector exp and SwiGLU of kernels/elementwise.h against the scalar code, bit for bit.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>

#include "kernel_test_util.h"
#include "kernels/elementwise.h"

namespace deepinfer::testing {
namespace {

// The vector exp (the softmax's) against the reference's f32(exp(double(x))), bit for bit: random
// arguments over the whole range used and past it, and the edges (underflow to 0, float
// subnormals, the lanes left to the library, NaN and infinities), on every ISA.
TEST(ElementwiseFast, ExpMatchesLibrary) {
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
TEST(ElementwiseFast, SwigluMatchesRef) {
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

// Every float in runs of 2^21 consecutive values (around 0.5, 3 and -7: dense in the mantissa),
// so that the vectors' exp, a few units of 2^-52 off, meets the ties the
// library's rounding decides.
TEST(ElementwiseFast, SwigluMatchesRefOnConsecutiveFloats) {
  KernelEnvGuard guard;
  for (float start : {0.5f, 3.0f, -7.0f}) {
    const int64_t n = int64_t(1) << 21;
    std::vector<float> g(static_cast<size_t>(n)), u(static_cast<size_t>(n), 1.0f);
    const uint32_t b0 = std::bit_cast<uint32_t>(start);
    for (int64_t i = 0; i < n; ++i) g[size_t(i)] = std::bit_cast<float>(b0 + uint32_t(i));
    std::vector<float> want = g;
    swiglu_ref(want.data(), u.data(), n, 0.0f, 1.0f);
    for (Isa isa : machine_isas()) {
      set_cpu_isa(isa);
      std::vector<float> got = g;
      swiglu(got.data(), u.data(), n, 0.0f, 1.0f);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(std::bit_cast<uint32_t>(got[size_t(i)]), std::bit_cast<uint32_t>(want[size_t(i)]))
            << isa_name(isa) << " g = " << g[size_t(i)];
    }
  }
}

}  // namespace
}  // namespace deepinfer::testing
