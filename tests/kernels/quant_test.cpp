// The vector cache-row encoders and decoders and bf16 rounding against their scalar twins over
// every code, scale and odd bit pattern (NaN, infinity, subnormals); bit-exact, NaN matching NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "core/dtype.h"
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

// An in-place function and its scalar twin over copies of x on every ISA: bit for bit.
void expect_in_place_twins(const std::vector<float>& x, void (*ref)(float*, int64_t),
                           void (*fast)(float*, int64_t), const std::string& what) {
  KernelEnvGuard guard;
  const int64_t n = int64_t(x.size());
  for (Isa isa : machine_isas()) {
    set_cpu_isa(isa);
    std::vector<float> want(x), got(x);
    ref(want.data(), n);
    fast(got.data(), n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(std::memcmp(&want[size_t(i)], &got[size_t(i)], 4), 0)
          << what << " " << isa_name(isa) << " element " << i << ": " << x[size_t(i)] << " -> "
          << want[size_t(i)] << " vs " << got[size_t(i)];
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

// fp4 "I" QDQ (the indexer's queries and keys) in vectors equals the scalar code: blocks of
// ordinary values, every e2m1 midpoint and its neighbours (ties to the even code), zeros of
// both signs, NaN, infinities, subnormals and blocks of any bit pattern.
TEST(QuantFast, Fp4iQdqMatchesRef) {
  KernelEnvGuard guard;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd;
  const int64_t n = 32 * 12;
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = nd(rng);
  // Block 1: the midpoints times the scale 1 (max 6), and their float neighbours.
  const float mids[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  for (int k = 0; k < 7; ++k) {
    x[size_t(32 + 3 * k)] = mids[k];
    x[size_t(32 + 3 * k + 1)] = -std::nextafter(mids[k], 0.0f);
    x[size_t(32 + 3 * k + 2)] = std::nextafter(mids[k], 10.0f);
  }
  x[32 + 21] = 6.0f;
  x[32 + 22] = -0.0f;
  x[32 + 23] = 0.0f;
  // Block 2: NaN and infinities; block 3: subnormals only; block 4: zeros; blocks 5-6: any bits.
  x[64] = std::nanf("");
  x[65] = -std::nanf("");
  x[66] = INFINITY;
  x[100] = -INFINITY;
  for (int i = 0; i < 32; ++i) x[size_t(96 + i)] = std::ldexp(float(i + 1), -140);
  for (int i = 0; i < 32; ++i) x[size_t(128 + i)] = i % 2 ? 0.0f : -0.0f;
  for (int i = 160; i < 224; ++i) {
    const uint32_t u = uint32_t(rng());
    std::memcpy(&x[size_t(i)], &u, 4);
  }
  x[224] = std::nanf("");  // a NaN among ordinary values
  expect_in_place_twins(x, fp4i_qdq_ref, fp4i_qdq, "fp4i_qdq");
}

// act_quant (the window cache's rows) in vectors equals the scalar code, codes and scales byte
// for byte: ordinary blocks, every e4m3 midpoint (normal and subnormal) and its neighbours at
// the scale 1, values on both sides of 2^-6, blocks below the 1e-4 floor, zeros of both signs,
// NaN, infinities, float subnormals and blocks of any bit pattern.
TEST(QuantFast, ActQuantMatchesRef) {
  KernelEnvGuard guard;
  std::mt19937_64 rng(6);
  std::normal_distribution<float> nd;
  std::uniform_int_distribution<int> ex(-30, 30);
  const int64_t n = 32 * 20;
  std::vector<float> x(static_cast<size_t>(n));
  for (size_t i = 0; i < x.size(); ++i) x[i] = i % 4 ? nd(rng) : std::ldexp(nd(rng), ex(rng));
  // Blocks 1-3: a maximum of 448 (scale 1), then the midpoints between consecutive e4m3 values
  // (codes 0..126) and their float neighbours.
  for (int b = 1; b <= 3; ++b) x[size_t(32 * b)] = 448.0f;
  int at = 33;
  for (int code = 0; code < 126 && at < 128; code += 2) {
    const float lo = e4m3_to_f32(uint8_t(code)), hi = e4m3_to_f32(uint8_t(code + 1));
    const float mid = (lo + hi) / 2;  // exact
    if (at % 32 == 0) ++at;
    x[size_t(at++)] = code & 2 ? -mid : mid;
    if (at < 128 && at % 32) x[size_t(at++)] = std::nextafter(mid, 1000.0f);
    if (at < 128 && at % 32) x[size_t(at++)] = std::nextafter(mid, 0.0f);
  }
  // Block 4: around 2^-6 (the smallest normal) at the scale 1.
  x[128] = 448.0f;
  for (int i = 1; i < 32; ++i) x[size_t(128 + i)] = std::ldexp(1.0f, -6) * (0.9f + 0.007f * i);
  // Block 5: below the floor; 6: zeros; 7: NaN and infinities among values; 8: subnormals;
  // 9-10: any bits.
  for (int i = 0; i < 32; ++i) x[size_t(160 + i)] = std::ldexp(nd(rng), -20);
  for (int i = 0; i < 32; ++i) x[size_t(192 + i)] = i % 2 ? 0.0f : -0.0f;
  x[224] = std::nanf("");
  x[225] = -std::nanf("");
  x[240] = -INFINITY;
  for (int i = 0; i < 32; ++i) x[size_t(256 + i)] = std::ldexp(float(i + 1), -140);
  for (int i = 288; i < 352; ++i) {
    const uint32_t u = uint32_t(rng());
    std::memcpy(&x[size_t(i)], &u, 4);
  }
  for (Isa isa : machine_isas()) {
    set_cpu_isa(isa);
    std::vector<uint8_t> want(static_cast<size_t>(n + n / 32)), got(want.size());
    act_quant_ref(x.data(), n, want.data(), want.data() + n);
    act_quant(x.data(), n, got.data(), got.data() + n);
    for (int64_t i = 0; i < n + n / 32; ++i)
      ASSERT_EQ(int(want[size_t(i)]), int(got[size_t(i)]))
          << isa_name(isa) << (i < n ? " code " : " scale ") << (i < n ? i : i - n)
          << ": x = " << (i < n ? x[size_t(i)] : 0.0f);
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
    expect_in_place_twins(x, round_bf16_inplace_ref, round_bf16_inplace,
                          "round_bf16 n=" + std::to_string(n));
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace deepinfer::testing
