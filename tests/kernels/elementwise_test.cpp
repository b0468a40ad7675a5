// The vector exp, RMS and SwiGLU of kernels/elementwise.h against the scalar code, bit for bit.
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

// Row RMS (rms_inv_rows) and RMSNorm in vectors against the scalar rms_inv and rmsnorm_ref, bit
// for bit: lengths with every tail against the 16 lanes, row counts around the 4 rows taken at
// once, rows apart by more than their length, values over a wide range of exponents (float
// subnormals, squares past the float range), zeros and a NaN row.
TEST(ElementwiseFast, RmsMatchesScalar) {
  KernelEnvGuard guard;
  std::mt19937_64 rng(13);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> ex(-140, 60);
  const uint16_t w_bits[4] = {0x3f80, 0xbfc0, 0x4100, 0x3c23};  // 1, -1.5, 8, 0.00996
  for (int64_t d : {1, 15, 16, 17, 31, 2048, 8192 + 5})
    for (int64_t n : {1, 3, 4, 5, 9, 17}) {
      const int64_t ld = d + 3;
      std::vector<float> x(size_t(n * ld));
      for (int64_t i = 0; i < n; ++i)
        for (int64_t k = 0; k < ld; ++k)
          x[size_t(i * ld + k)] = i % 5 == 3   ? 0.0f
                                  : i % 7 == 2 ? std::ldexp(nd(rng), ex(rng))
                                               : nd(rng) * 3.0f;
      if (n > 5) x[size_t(5 * ld + d / 2)] = std::nanf("");
      std::vector<uint16_t> w(static_cast<size_t>(d));
      for (int64_t k = 0; k < d; ++k) w[size_t(k)] = w_bits[k % 4];
      for (Isa isa : machine_isas()) {
        set_cpu_isa(isa);
        std::vector<float> got(static_cast<size_t>(n));
        rms_inv_rows(x.data(), n, ld, d, 1e-6f, got.data());
        for (int64_t i = 0; i < n; ++i) {
          const float want = rms_inv(x.data() + i * ld, d, 1e-6f);
          if (std::isnan(want)) {
            ASSERT_TRUE(std::isnan(got[size_t(i)])) << isa_name(isa) << " row " << i;
            continue;
          }
          ASSERT_EQ(std::bit_cast<uint32_t>(got[size_t(i)]), std::bit_cast<uint32_t>(want))
              << isa_name(isa) << " d " << d << " row " << i << ": got " << got[size_t(i)]
              << ", want " << want;
        }
        // RMSNorm of the rows packed d apart.
        std::vector<float> packed(size_t(n * d));
        for (int64_t i = 0; i < n; ++i) std::copy_n(x.data() + i * ld, d, packed.data() + i * d);
        std::vector<float> want_n = packed, got_n = packed;
        rmsnorm_ref(want_n.data(), n, d, w.data(), 1e-6f);
        rmsnorm(got_n.data(), n, d, w.data(), 1e-6f);
        for (size_t k = 0; k < packed.size(); ++k) {
          if (std::isnan(want_n[k])) {
            ASSERT_TRUE(std::isnan(got_n[k])) << isa_name(isa) << " d " << d << " at " << k;
            continue;
          }
          ASSERT_EQ(std::bit_cast<uint32_t>(got_n[k]), std::bit_cast<uint32_t>(want_n[k]))
              << isa_name(isa) << " d " << d << " n " << n << " at " << k;
        }
      }
    }
}

}  // namespace
}  // namespace deepinfer::testing
