// Number formats and exact conversions.
//
// Formats (all little-endian in memory):
//   bf16  1-8-7, f16 1-5-10 (IEEE half)
//   e4m3  float8_e4m3fn: bias 7, subnormals, max ±448, S.1111.111 is NaN, no infinities
//   e8m0  float8_e8m0fnu: unsigned byte b encodes 2^(b-127); 255 is NaN (scales only)
//   e2m1  fp4: 3-bit magnitude code {0, .5, 1, 1.5, 2, 3, 4, 6}, bit 3 is the sign; two values per
//         byte, the even element in the low nibble
// Every encoder rounds to nearest, ties to even (RNE). Out-of-range behaviour is stated per
// encoder. Decoders are exact.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace deepinfer {

enum class DType : uint8_t { F32, F16, BF16, E4M3, E8M0, E2M1, I8, U8, I32, I64 };

// Name as safetensors spells it ("F32", "BF16", "F8_E4M3", "F8_E8M0", "F4", "I8", ...).
std::string_view dtype_name(DType t);
// Parses a safetensors dtype name; returns false for an unknown one.
bool dtype_from_name(std::string_view name, DType* out);
// Storage bits per element (4 for E2M1).
int dtype_bits(DType t);
// Bytes needed for `n` elements (rounded up for sub-byte types).
inline uint64_t dtype_bytes(DType t, uint64_t n) {
  return (n * dtype_bits(t) + 7) / 8;
}

inline uint32_t f32_bits(float f) {
  return std::bit_cast<uint32_t>(f);
}
inline float f32_from_bits(uint32_t u) {
  return std::bit_cast<float>(u);
}

// --- bf16 ---
inline float bf16_to_f32(uint16_t h) {
  return f32_from_bits(uint32_t(h) << 16);
}
// RNE; NaN stays NaN (quieted); overflow rounds to infinity as IEEE does.
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
// Rounds an fp32 value to the nearest bf16 value and returns it as fp32.
inline float round_bf16(float f) {
  return bf16_to_f32(f32_to_bf16(f));
}

// --- f16 ---
float f16_to_f32(uint16_t h);

// `m` shifted right by `s` (s >= 1) with round-to-nearest-even: the mantissa step of the narrowing
// casts below.
uint32_t shift_rne(uint32_t m, int s);

// --- e4m3 (float8_e4m3fn) ---
extern const std::array<float, 256> kE4m3Values;
inline float e4m3_to_f32(uint8_t b) {
  return kE4m3Values[b];
}
// RNE. A magnitude that rounds above 448 becomes NaN (0x7f | sign), as torch's cast does;
// callers that want saturation clamp to ±448 first.
uint8_t f32_to_e4m3(float f);

// --- e8m0 ---
// 2^(b-127); b = 255 is NaN. b = 0 gives 2^-127 (an fp32 subnormal).
inline float e8m0_to_f32(uint8_t b) {
  if (b == 255) return f32_from_bits(0x7fc00000u);
  if (b == 0) return f32_from_bits(0x00400000u);
  return f32_from_bits(uint32_t(b) << 23);
}
// RNE of |f| to a power of two (the sign is ignored: the format has none). NaN and infinity map
// to 255 (NaN); zero and values below 2^-127's rounding range map to 0; the largest encodable
// value is 2^127 (254).
uint8_t f32_to_e8m0(float f);
// §3.3: the power of two 2^ceil(log2(f32(a * c))) from the bits of the rounded product, as an e8m0
// code (value 2^(code - 127)); the block scales of act_quant, fp4 "I" and the release's weights.
// Meant for products in (0, 2^127], where the code is exact.
inline uint8_t pow2ceil_e8m0(float a, float c) {
  const uint32_t t = f32_bits(a * c);
  const uint32_t e = (t >> 23) & 0xff, m = t & 0x7fffff;
  return uint8_t(e + (m != 0 ? 1 : 0));
}

// --- e2m1 (fp4) ---
extern const float kE2m1Values[16];
inline float e2m1_to_f32(uint8_t nibble) {
  return kE2m1Values[nibble & 0xf];
}
// RNE with ties to the even code (.25→0, .75→1, 1.25→1, 1.75→2, 2.5→2, 3.5→4, 5→4); magnitudes
// above 6 saturate to ±6; NaN maps to +0. The sign of zero is kept.
uint8_t f32_to_e2m1(float f);
// Element `i` of a packed fp4 array (low nibble = even element).
inline float e2m1_packed_get(const uint8_t* p, size_t i) {
  return e2m1_to_f32(uint8_t(p[i >> 1] >> ((i & 1) * 4)));
}

}  // namespace deepinfer
