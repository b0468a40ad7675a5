// Exhaustive checks of the number formats: every code decodes to the value the format defines,
// and every encoder agrees with a slow nearest-value search (ties to the even code) on every
// code, every midpoint between neighbouring codes and its fp32 neighbours, every bf16 and f16
// bit pattern as input, and a large random sample of fp32 inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/dtype.h"

namespace deepinfer {
namespace {

// The f16 encoder (RNE, IEEE overflow to infinity, gradual underflow): DeepInfer only decodes
// f16, so the encoder lives here, for the round trip of every code.
uint16_t f32_to_f16(float f) {
  const uint32_t x = f32_bits(f);
  const uint16_t sign = uint16_t((x >> 16) & 0x8000);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return sign | 0x7e00;   // NaN
  if (ax >= 0x477ff000u) return sign | 0x7c00;  // rounds to infinity (>= 65520)
  const uint32_t e = ax >> 23, mant = ax & 0x7fffff;
  if (e < 113) {              // below 2^-14: subnormal half
    if (e == 0) return sign;  // fp32 subnormals are far below
    return sign | uint16_t(shift_rne(mant | 0x800000, 126 - int(e)));
  }
  // The rebased exponent and the mantissa rounded together: a carry bumps the exponent.
  return sign | uint16_t(shift_rne(((e - 112) << 23) | mant, 13));
}

// Positive finite values of a format, indexed by code, for the slow reference encoder.
struct Grid {
  std::vector<double> value;  // value[code], ascending
  double overflow;            // magnitudes >= this do not round to a finite code (inf if none)
};

// The slow reference: nearest code to |x| on the grid, ties to the even code; -1 = overflow.
int nearest_code(const Grid& g, double ax) {
  if (ax >= g.overflow) return -1;
  const auto it = std::lower_bound(g.value.begin(), g.value.end(), ax);
  if (it == g.value.end()) return int(g.value.size()) - 1;
  const int hi = int(it - g.value.begin());
  if (hi == 0 || *it == ax) return hi;
  const int lo = hi - 1;
  const double dl = ax - g.value[lo], dh = g.value[hi] - ax;
  if (dl < dh) return lo;
  if (dh < dl) return hi;
  return (lo % 2 == 0) ? lo : hi;
}

Grid e4m3_grid() {
  Grid g;
  for (int c = 0; c < 127; ++c) g.value.push_back(e4m3_to_f32(uint8_t(c)));
  // Above 464 rounds past 448; the tie at exactly 464 goes to 448, the even code.
  g.overflow = std::nextafter(464.0, 1e9);
  return g;
}

std::vector<float> sample_inputs() {
  std::vector<float> xs;
  for (uint32_t b = 0; b < 65536; ++b) xs.push_back(bf16_to_f32(uint16_t(b)));
  for (uint32_t h = 0; h < 65536; ++h) xs.push_back(f16_to_f32(uint16_t(h)));
  std::mt19937 rng(1234);
  for (int i = 0; i < 500000; ++i) xs.push_back(f32_from_bits(rng()));
  // Small magnitudes where fp8/fp4 codes live, with random low mantissa bits.
  std::uniform_real_distribution<float> u(-8.0f, 8.0f);
  for (int i = 0; i < 500000; ++i) xs.push_back(u(rng));
  return xs;
}

void add_midpoints(const std::vector<double>& vals, std::vector<float>* xs) {
  for (size_t i = 0; i + 1 < vals.size(); ++i) {
    const float m = float((vals[i] + vals[i + 1]) / 2);  // exact for these formats
    for (float x : {m, std::nextafter(m, 0.0f), std::nextafter(m, 1e30f)}) {
      xs->push_back(x);
      xs->push_back(-x);
    }
  }
}

TEST(DType, Names) {
  DType t;
  ASSERT_TRUE(dtype_from_name("F8_E4M3", &t));
  EXPECT_EQ(t, DType::E4M3);
  ASSERT_TRUE(dtype_from_name("F4", &t));
  EXPECT_EQ(dtype_bits(t), 4);
  EXPECT_EQ(dtype_bytes(DType::E2M1, 7), 4u);
  EXPECT_FALSE(dtype_from_name("F8_E5M2", &t));
  EXPECT_EQ(dtype_name(DType::BF16), "BF16");
}

TEST(DType, Bf16AllPatterns) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float v = bf16_to_f32(uint16_t(b));
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    ASSERT_EQ(bits, b << 16);
    if (std::isnan(v)) {
      ASSERT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(v))));
    } else {
      ASSERT_EQ(f32_to_bf16(v), b) << b;
    }
  }
  // Midpoints: 1 + 2^-8 lies between 1 and 1 + 2^-7: tie to even (1.0).
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);
  EXPECT_EQ(f32_to_bf16(1.01171875f), 0x3f82);  // 1 + 3*2^-8: tie, rounds up to even
  EXPECT_EQ(f32_to_bf16(std::nextafter(1.00390625f, 2.0f)), 0x3f81);
  EXPECT_EQ(f32_to_bf16(3.4e38f), 0x7f80);  // rounds to infinity
}

TEST(DType, Bf16RandomAgainstReference) {
  std::mt19937 rng(7);
  for (int i = 0; i < 2000000; ++i) {
    const uint32_t u = rng();
    const float x = f32_from_bits(u);
    if (std::isnan(x)) continue;
    const uint16_t got = f32_to_bf16(x);
    // Reference: the two bf16 neighbours by truncation, pick the nearer (even on a tie).
    const uint32_t lo = u & 0xffff0000u;
    const double vx = x, vlo = f32_from_bits(lo);
    const uint32_t hi = lo + 0x10000u;
    const double vhi = ((hi & 0x7f800000u) == 0x7f800000u)
                           ? std::copysign(std::ldexp(1.0, 128), vx)  // past the last finite
                           : double(f32_from_bits(hi));
    const double dl = std::fabs(vx - vlo), dh = std::fabs(vhi - vx);
    const uint16_t want =
        uint16_t((dl < dh || (dl == dh && ((lo >> 16) & 1) == 0)) ? lo >> 16 : hi >> 16);
    ASSERT_EQ(got, want) << std::hex << u;
  }
}

TEST(DType, F16AllPatterns) {
  std::vector<double> pos;
  for (uint32_t h = 0; h < 0x7c00; ++h) pos.push_back(f16_to_f32(uint16_t(h)));
  for (uint32_t h = 0; h < 65536; ++h) {
    const float v = f16_to_f32(uint16_t(h));
    const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    const double s = (h & 0x8000) ? -1.0 : 1.0;
    if (e == 31) {
      ASSERT_EQ(std::isnan(v), m != 0);
      if (!m) {
        ASSERT_TRUE(std::isinf(v));
      }
      continue;
    }
    const double want = e == 0 ? s * std::ldexp(double(m), -24)
                               : s * std::ldexp(1.0 + double(m) / 1024.0, int(e) - 15);
    ASSERT_EQ(double(v), want) << h;
    ASSERT_EQ(f32_to_f16(v), h) << h;
  }
  Grid g{pos, 65520.0};
  std::vector<float> xs = sample_inputs();
  add_midpoints(pos, &xs);
  for (float x : xs) {
    if (std::isnan(x)) continue;
    const int c = nearest_code(g, std::fabs(double(x)));
    const uint16_t want = uint16_t((std::signbit(x) ? 0x8000 : 0) | (c < 0 ? 0x7c00 : c));
    ASSERT_EQ(f32_to_f16(x), want) << x;
  }
  EXPECT_EQ(f32_to_f16(std::nanf("")) & 0x7e00, 0x7e00);
}

TEST(DType, E4m3AllCodes) {
  for (int b = 0; b < 256; ++b) {
    const float v = e4m3_to_f32(uint8_t(b));
    const int e = (b >> 3) & 15, m = b & 7;
    const double s = (b & 0x80) ? -1.0 : 1.0;
    if (e == 15 && m == 7) {
      ASSERT_TRUE(std::isnan(v)) << b;
      continue;
    }
    const double want =
        e == 0 ? s * std::ldexp(double(m), -9) : s * std::ldexp(1.0 + m / 8.0, e - 7);
    ASSERT_EQ(double(v), want) << b;
    ASSERT_EQ(f32_to_e4m3(v), uint8_t(b)) << b;
  }
  EXPECT_EQ(e4m3_to_f32(0x7e), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
}

TEST(DType, E4m3EncoderAgainstReference) {
  const Grid g = e4m3_grid();
  std::vector<float> xs = sample_inputs();
  add_midpoints(g.value, &xs);
  for (float x : {448.0f, 456.0f, 464.0f, std::nextafter(464.0f, 0.0f),
                  std::nextafter(464.0f, 1e9f), 480.0f, 1e9f})
    xs.push_back(x);
  for (float x : xs) {
    const uint8_t got = f32_to_e4m3(x);
    const uint8_t sign = std::signbit(x) ? 0x80 : 0;
    if (std::isnan(x)) {
      ASSERT_EQ(got & 0x7f, 0x7f);
      continue;
    }
    const int c = nearest_code(g, std::fabs(double(x)));
    ASSERT_EQ(got, uint8_t(sign | (c < 0 ? 0x7f : c))) << x;
  }
  EXPECT_EQ(f32_to_e4m3(464.0f), 0x7e);  // tie between 448 (even) and 480 (NaN code)
}

TEST(DType, E8m0AllCodes) {
  for (int b = 0; b < 256; ++b) {
    const float v = e8m0_to_f32(uint8_t(b));
    if (b == 255) {
      ASSERT_TRUE(std::isnan(v));
      continue;
    }
    ASSERT_EQ(double(v), std::ldexp(1.0, b - 127)) << b;
    ASSERT_EQ(f32_to_e8m0(v), uint8_t(b)) << b;
  }
  // Between 2^k and 2^(k+1) the midpoint is 1.5 * 2^k: below rounds down, at or above rounds up.
  EXPECT_EQ(f32_to_e8m0(1.4999999f), 127);
  EXPECT_EQ(f32_to_e8m0(1.5f), 128);
  EXPECT_EQ(f32_to_e8m0(-3.0f), 129);  // no sign: |x|
  EXPECT_EQ(f32_to_e8m0(INFINITY), 255);
  EXPECT_EQ(f32_to_e8m0(0.0f), 0);
  EXPECT_EQ(f32_to_e8m0(3e38f), 254);  // 2^127 is the largest code
}

TEST(DType, E2m1AllCodes) {
  const double mags[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int n = 0; n < 16; ++n) {
    const float v = e2m1_to_f32(uint8_t(n));
    ASSERT_EQ(double(v), (n & 8 ? -1 : 1) * mags[n & 7]);
    ASSERT_EQ(std::signbit(v), bool(n & 8));
    ASSERT_EQ(f32_to_e2m1(v), n);
  }
  // The ties of the spec: .25→0, .75→1, 1.25→1, 1.75→2, 2.5→2, 3.5→4, 5→4.
  const float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const float want[] = {0.0f, 1.0f, 1.0f, 2.0f, 2.0f, 4.0f, 4.0f};
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(ties[i])), want[i]) << ties[i];
    EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(-ties[i])), -want[i]) << ties[i];
  }
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(100.0f)), 6.0f);
  EXPECT_EQ(e2m1_to_f32(f32_to_e2m1(-7.0f)), -6.0f);
}

TEST(DType, E2m1EncoderAgainstReference) {
  Grid g{{0, 0.5, 1, 1.5, 2, 3, 4, 6}, INFINITY};
  std::vector<float> xs = sample_inputs();
  add_midpoints(g.value, &xs);
  for (float x : xs) {
    if (std::isnan(x)) continue;
    const double ax = std::min(std::fabs(double(x)), 6.0);  // saturating
    const int c = nearest_code(g, ax);
    ASSERT_EQ(f32_to_e2m1(x), uint8_t((std::signbit(x) ? 8 : 0) | c)) << x;
  }
}

TEST(DType, E2m1PackedNibbleOrder) {
  const uint8_t packed[2] = {0x2f, 0x71};  // elements: -6, 1, 0.5, 6
  EXPECT_EQ(e2m1_packed_get(packed, 0), -6.0f);
  EXPECT_EQ(e2m1_packed_get(packed, 1), 1.0f);
  EXPECT_EQ(e2m1_packed_get(packed, 2), 0.5f);
  EXPECT_EQ(e2m1_packed_get(packed, 3), 6.0f);
}

}  // namespace
}  // namespace deepinfer
