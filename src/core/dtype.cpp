#include "core/dtype.h"

#include <algorithm>
#include <cmath>
#include <iterator>

namespace deepinfer {

namespace {

// Indexed by DType, in its order.
struct NameEntry {
  std::string_view name;
  int bits;
};
constexpr NameEntry kNames[] = {
    {"F32", 32}, {"F16", 16}, {"BF16", 16}, {"F8_E4M3", 8}, {"F8_E8M0", 8},
    {"F4", 4},   {"I8", 8},   {"U8", 8},    {"I32", 32},    {"I64", 64},
};
static_assert(std::size(kNames) == size_t(DType::I64) + 1);

}  // namespace

// Constant-initialized: usable during other translation units' static initialization.
constinit const std::array<float, 256> kE4m3Values = [] {
  std::array<float, 256> t{};
  for (uint32_t b = 0; b < 256; ++b) {
    // Normal codes are (1 + m/8) * 2^(e-7): the fp32 exponent is e + 120, the mantissa m's bits.
    const uint32_t e = (b >> 3) & 15, m = b & 7;
    const float v =
        e == 0 ? float(m) / 512.0f : std::bit_cast<float>(((e + 120) << 23) | (m << 20));
    t[b] = (e == 15 && m == 7) ? __builtin_nanf("") : (b & 0x80) ? -v : v;
  }
  return t;
}();

const float kE2m1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                               -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

std::string_view dtype_name(DType t) {
  return size_t(t) < std::size(kNames) ? kNames[size_t(t)].name : "?";
}

bool dtype_from_name(std::string_view name, DType* out) {
  const NameEntry* e = std::ranges::find(kNames, name, &NameEntry::name);
  if (e == std::end(kNames)) return false;
  *out = DType(e - kNames);
  return true;
}

int dtype_bits(DType t) {
  return size_t(t) < std::size(kNames) ? kNames[size_t(t)].bits : 0;
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
  if (e == 0x1f) return f32_from_bits(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    const float v = std::ldexp(float(m), -24);  // exact
    return sign ? -v : v;
  }
  return f32_from_bits(sign | ((e + 112) << 23) | (m << 13));
}

uint32_t shift_rne(uint32_t m, int s) {
  if (s >= 32) return 0;
  const uint32_t q = m >> s, rem = m & ((1u << s) - 1), half = 1u << (s - 1);
  return q + ((rem > half || (rem == half && (q & 1))) ? 1 : 0);
}

uint8_t f32_to_e4m3(float f) {
  const uint32_t x = f32_bits(f), ax = x & 0x7fffffffu;
  const uint8_t sign = uint8_t((x >> 24) & 0x80);
  if (ax >= 0x7f800000u) return sign | 0x7f;  // NaN and infinity: no infinity in e4m3fn
  const uint32_t e = ax >> 23, mant = ax & 0x7fffff;
  if (e < 121) {  // below 2^-6: subnormal e4m3 in units of 2^-9
    if (e == 0) return sign;
    return sign | uint8_t(shift_rne(mant | 0x800000, 141 - int(e)));  // 8 = smallest normal
  }
  if (e > 135) return sign | 0x7f;  // >= 2^9
  // The rebased exponent and the mantissa rounded together: a carry bumps the exponent.
  const uint32_t code = shift_rne(((e - 120) << 23) | mant, 20);
  return sign | uint8_t(code > 0x7e ? 0x7f : code);
}

uint8_t f32_to_e8m0(float f) {
  const uint32_t x = f32_bits(f) & 0x7fffffffu, e = x >> 23, mant = x & 0x7fffff;
  if (e == 0xff) return 255;
  // fp32 subnormals (and zero): the nearest code is 2^-127 (b = 0) unless the value lies
  // above 2^-127 and below 2^-126 by more than the tie, where 2^-126 (b = 1) wins.
  if (e == 0) return ((mant & 0x400000) && (mant & 0x3fffff)) ? 1 : 0;
  // The implied leading 1 is the result's last bit, the mantissa's top bit the guard bit: a
  // mantissa of 1.5 or more rounds up (the tie at exactly 1.5 goes up because the implied bit is
  // odd).
  return uint8_t(std::min(e + (mant >> 22), 254u));
}

uint8_t f32_to_e2m1(float f) {
  if (std::isnan(f)) return 0;
  const uint8_t sign = std::signbit(f) ? 8 : 0;
  const float a = std::fabs(f);
  // Midpoints between neighbouring codes; a tie goes to the even code, the lower one when it
  // is even (codes 0, 2, 4, 6 include their upper midpoint).
  constexpr float kMid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  uint8_t code = 0;
  while (code < 7 && (code % 2 == 0 ? a > kMid[code] : a >= kMid[code])) ++code;
  return sign | code;
}

}  // namespace deepinfer
