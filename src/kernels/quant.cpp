#include "kernels/quant.h"

#include <algorithm>
#include <cmath>

#include "core/cpu.h"
#include "core/dtype.h"
#include "kernels/quant_isa.h"

namespace deepinfer {

namespace {
bool use_avx512() {
  return cpu_isa() == Isa::Avx512;
}

constexpr float kInv448 = 1.0f / 448.0f;  // f32(1/448)
constexpr float kInv6 = 1.0f / 6.0f;      // f32(1/6)
constexpr float kActFloor = 1e-4f;
const float kFp4IFloor = 6.0f * std::ldexp(1.0f, -126);
const float kFp4CFloor = 6.0f * std::ldexp(1.0f, -9);

float block_amax(const float* x, int64_t n) {
  float a = 0;
  for (int64_t i = 0; i < n; ++i) a = std::max(a, std::fabs(x[i]));
  return a;
}

float clampf(float v, float lo, float hi) {
  return v < lo ? lo : (v > hi ? hi : v);
}
}  // namespace

uint8_t pow2ceil_e8m0(float a, float c) {
  const uint32_t t = f32_bits(a * c);
  const uint32_t e = (t >> 23) & 0xff, m = t & 0x7fffff;
  return uint8_t(e + (m != 0 ? 1 : 0));
}

// --- fp8 ---

void act_quant(const float* x, int64_t n, uint8_t* codes, uint8_t* scales) {
  for (int64_t b = 0; b < n; b += 32) {
    const uint8_t s = pow2ceil_e8m0(std::max(block_amax(x + b, 32), kActFloor), kInv448);
    scales[b / 32] = s;
    const float inv = e8m0_to_f32(uint8_t(254 - s));  // 1/sigma, exact
    for (int i = 0; i < 32; ++i) codes[b + i] = f32_to_e4m3(clampf(x[b + i] * inv, -448, 448));
  }
}

void act_quant_values(const float* x, int64_t n, float* qvals, uint8_t* scales) {
  for (int64_t b = 0; b < n; b += 32) {
    const uint8_t s = pow2ceil_e8m0(std::max(block_amax(x + b, 32), kActFloor), kInv448);
    scales[b / 32] = s;
    const float inv = e8m0_to_f32(uint8_t(254 - s));
    for (int i = 0; i < 32; ++i)
      qvals[b + i] = e4m3_to_f32(f32_to_e4m3(clampf(x[b + i] * inv, -448, 448)));
  }
}

void act_quant_qdq(float* x, int64_t n) {
  for (int64_t b = 0; b < n; b += 32) {
    const uint8_t s = pow2ceil_e8m0(std::max(block_amax(x + b, 32), kActFloor), kInv448);
    const float sigma = e8m0_to_f32(s), inv = e8m0_to_f32(uint8_t(254 - s));
    for (int i = 0; i < 32; ++i)
      x[b + i] = e4m3_to_f32(f32_to_e4m3(clampf(x[b + i] * inv, -448, 448))) * sigma;
  }
}

void fp8_dequant_ref(const uint8_t* codes, const uint8_t* scales, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = e4m3_to_f32(codes[i]) * e8m0_to_f32(scales[i / 32]);
}
void fp8_dequant(const uint8_t* codes, const uint8_t* scales, int64_t n, float* out) {
  if (use_avx512() && n % 32 == 0)
    quant_isa::fp8_dequant_avx512(codes, scales, n, out);
  else
    fp8_dequant_ref(codes, scales, n, out);
}

// --- fp4 I ---

void fp4i_quant(const float* x, int64_t n, uint8_t* packed, uint8_t* scales) {
  for (int64_t b = 0; b < n; b += 32) {
    const uint8_t s = pow2ceil_e8m0(std::max(block_amax(x + b, 32), kFp4IFloor), kInv6);
    scales[b / 32] = s;
    const float sigma = e8m0_to_f32(s);
    for (int i = 0; i < 32; i += 2) {
      // x / sigma is exact (sigma is a power of two), computed as a division so that sigma down
      // to 2^-126 needs no reciprocal outside the normal range.
      const uint8_t lo = f32_to_e2m1(clampf(x[b + i] / sigma, -6, 6));
      const uint8_t hi = f32_to_e2m1(clampf(x[b + i + 1] / sigma, -6, 6));
      packed[(b + i) / 2] = uint8_t(lo | (hi << 4));
    }
  }
}

void fp4i_dequant_ref(const uint8_t* packed, const uint8_t* scales, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = e2m1_packed_get(packed, size_t(i)) * e8m0_to_f32(scales[i / 32]);
}
void fp4i_dequant(const uint8_t* packed, const uint8_t* scales, int64_t n, float* out) {
  if (use_avx512() && n % 32 == 0)
    quant_isa::fp4i_dequant_avx512(packed, scales, n, out);
  else
    fp4i_dequant_ref(packed, scales, n, out);
}

void fp4i_qdq(float* x, int64_t n) {
  for (int64_t b = 0; b < n; b += 32) {
    const uint8_t s = pow2ceil_e8m0(std::max(block_amax(x + b, 32), kFp4IFloor), kInv6);
    const float sigma = e8m0_to_f32(s);
    for (int i = 0; i < 32; ++i)
      x[b + i] = e2m1_to_f32(f32_to_e2m1(clampf(x[b + i] / sigma, -6, 6))) * sigma;
  }
}

// --- fp4 C ---

namespace {
float fp4c_scale(const float* x, uint8_t* code) {
  const float a = std::max(block_amax(x, 16), kFp4CFloor);
  // Saturating, as the kernels' satfinite conversion (a scale past 448 would be NaN).
  *code = f32_to_e4m3(std::min(a / 6.0f, 448.0f));
  return e4m3_to_f32(*code);
}
}  // namespace

void fp4c_quant(const float* x, int64_t n, uint8_t* packed, uint8_t* scales) {
  for (int64_t b = 0; b < n; b += 16) {
    const float sigma = fp4c_scale(x + b, &scales[b / 16]);
    for (int i = 0; i < 16; i += 2) {
      const uint8_t lo = f32_to_e2m1(clampf(x[b + i] / sigma, -6, 6));
      const uint8_t hi = f32_to_e2m1(clampf(x[b + i + 1] / sigma, -6, 6));
      packed[(b + i) / 2] = uint8_t(lo | (hi << 4));
    }
  }
}

void fp4c_dequant_ref(const uint8_t* packed, const uint8_t* scales, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = e2m1_packed_get(packed, size_t(i)) * e4m3_to_f32(scales[i / 16]);
}
void fp4c_dequant(const uint8_t* packed, const uint8_t* scales, int64_t n, float* out) {
  if (use_avx512() && n % 32 == 0)
    quant_isa::fp4c_dequant_avx512(packed, scales, n, out);
  else
    fp4c_dequant_ref(packed, scales, n, out);
}

void fp4c_qdq(float* x, int64_t n) {
  for (int64_t b = 0; b < n; b += 16) {
    uint8_t code;
    const float sigma = fp4c_scale(x + b, &code);
    for (int i = 0; i < 16; ++i)
      x[b + i] = e2m1_to_f32(f32_to_e2m1(clampf(x[b + i] / sigma, -6, 6))) * sigma;
  }
}

void round_bf16_inplace_ref(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = round_bf16(x[i]);
}
void round_bf16_inplace(float* x, int64_t n) {
  if (use_avx512())
    quant_isa::round_bf16_avx512(x, n);
  else
    round_bf16_inplace_ref(x, n);
}

}  // namespace deepinfer
