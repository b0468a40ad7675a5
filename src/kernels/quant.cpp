#include "kernels/quant.h"

#include <algorithm>
#include <cmath>

#include "core/cpu.h"
#include "core/dtype.h"
#include "kernels/isa.h"

namespace deepinfer {

namespace {
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

// fp4 over blocks of B: sigma = scale(block, block index), then out(i, e2m1 code of x[i], sigma).
// x / sigma is exact (sigma is a power of two, or for variant C exact in e4m3), computed as a
// division so that sigma down to 2^-126 needs no reciprocal outside the normal range.
template <int B, typename Scale, typename Out>
void fp4_blocks(const float* x, int64_t n, Scale scale, Out out) {
  for (int64_t b = 0; b < n; b += B) {
    const float sigma = scale(x + b, b / B);
    for (int i = 0; i < B; ++i)
      out(b + i, f32_to_e2m1(std::clamp(x[b + i] / sigma, -6.0f, 6.0f)), sigma);
  }
}

// The packed form: two codes per byte, the even element in the low nibble.
auto pack_into(uint8_t* packed) {
  return [packed](int64_t i, uint8_t c, float) {
    if (i & 1)
      packed[i / 2] |= uint8_t(c << 4);
    else
      packed[i / 2] = c;
  };
}

// §3.5 variant I: an e8m0 power of two per 32, stored in `scales` when given.
auto fp4i_scale(uint8_t* scales) {
  return [scales](const float* x, int64_t k) {
    const uint8_t s = pow2ceil_e8m0(std::max(block_amax(x, 32), kFp4IFloor), kInv6);
    if (scales) scales[k] = s;
    return e8m0_to_f32(s);
  };
}

// Variant C: an e4m3 scale per 16 (stored in `scales`), saturating as the kernels' satfinite
// conversion (a scale past 448 would be NaN).
auto fp4c_scale(uint8_t* scales) {
  return [scales](const float* x, int64_t k) {
    const float a = std::max(block_amax(x, 16), kFp4CFloor);
    const uint8_t code = f32_to_e4m3(std::min(a / 6.0f, 448.0f));
    scales[k] = code;
    return e4m3_to_f32(code);
  };
}

}  // namespace

// --- fp8 ---

void act_quant(const float* x, int64_t n, uint8_t* codes, uint8_t* scales) {
  (cpu_isa() == Isa::Avx512 ? quant_isa::act_quant_avx512 : act_quant_ref)(x, n, codes, scales);
}
void act_quant_ref(const float* x, int64_t n, uint8_t* codes, uint8_t* scales) {
  for (int64_t b = 0; b < n; b += 32) {
    const uint8_t s = pow2ceil_e8m0(std::max(block_amax(x + b, 32), kActFloor), kInv448);
    scales[b / 32] = s;
    const float inv = e8m0_to_f32(uint8_t(254 - s));  // 1/sigma, exact
    for (int64_t i = b; i < b + 32; ++i)
      codes[i] = f32_to_e4m3(std::clamp(x[i] * inv, -448.0f, 448.0f));
  }
}

void fp8_dequant_ref(const uint8_t* codes, const uint8_t* scales, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = e4m3_to_f32(codes[i]) * e8m0_to_f32(scales[i / 32]);
}
void fp8_dequant(const uint8_t* codes, const uint8_t* scales, int64_t n, float* out) {
  (cpu_isa() == Isa::Avx512 && n % 32 == 0 ? quant_isa::fp8_dequant_avx512 : fp8_dequant_ref)(
      codes, scales, n, out);
}

// --- fp4 I ---

void fp4i_quant(const float* x, int64_t n, uint8_t* packed, uint8_t* scales) {
  fp4_blocks<32>(x, n, fp4i_scale(scales), pack_into(packed));
}

void fp4i_dequant_ref(const uint8_t* packed, const uint8_t* scales, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = e2m1_packed_get(packed, size_t(i)) * e8m0_to_f32(scales[i / 32]);
}
void fp4i_dequant(const uint8_t* packed, const uint8_t* scales, int64_t n, float* out) {
  (cpu_isa() == Isa::Avx512 && n % 32 == 0 ? quant_isa::fp4i_dequant_avx512 : fp4i_dequant_ref)(
      packed, scales, n, out);
}

void fp4i_qdq_ref(float* x, int64_t n) {
  fp4_blocks<32>(x, n, fp4i_scale(nullptr),
                 [x](int64_t i, uint8_t c, float sigma) { x[i] = e2m1_to_f32(c) * sigma; });
}
void fp4i_qdq(float* x, int64_t n) {
  (cpu_isa() == Isa::Avx512 && n % 32 == 0 ? quant_isa::fp4i_qdq_avx512 : fp4i_qdq_ref)(x, n);
}

// --- fp4 C ---

void fp4c_quant(const float* x, int64_t n, uint8_t* packed, uint8_t* scales) {
  fp4_blocks<16>(x, n, fp4c_scale(scales), pack_into(packed));
}

void fp4c_dequant_ref(const uint8_t* packed, const uint8_t* scales, int64_t n, float* out) {
  for (int64_t i = 0; i < n; ++i)
    out[i] = e2m1_packed_get(packed, size_t(i)) * e4m3_to_f32(scales[i / 16]);
}
void fp4c_dequant(const uint8_t* packed, const uint8_t* scales, int64_t n, float* out) {
  (cpu_isa() == Isa::Avx512 && n % 32 == 0 ? quant_isa::fp4c_dequant_avx512 : fp4c_dequant_ref)(
      packed, scales, n, out);
}

void round_bf16_inplace_ref(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = round_bf16(x[i]);
}
void round_bf16_inplace(float* x, int64_t n) {
  (cpu_isa() == Isa::Avx512 ? quant_isa::round_bf16_avx512 : round_bf16_inplace_ref)(x, n);
}

}  // namespace deepinfer
