// The vector layer of the kernels written once for every ISA (the *_vec.cpp files, compiled once
// with the AVX2 flags and once with the AVX-512 flags; kernels/CMakeLists.txt). A kernel is
// written against `F` (kLanes floats), `I` (kLanes 32-bit integers) and the functions below;
// what one ISA does differently (a shorter vector, a missing instruction) stays in this file or
// in a small `if constexpr (kIsa == ...)` branch of the kernel.
//
// Everything here lives in a namespace named after the ISA, so the two compilations of one
// kernel share no symbol (the linker could otherwise keep the AVX-512 copy of an inline function
// for everyone). For the same reason a *_vec.cpp file calls no inline std:: function.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "core/cpu.h"

// GCC 12's intrinsic headers read deliberately undefined vectors (_mm*_undefined_*), which the
// uninitialized-use warnings report from inside the system headers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#define DI_VEC inline __attribute__((always_inline))

#if defined(__AVX512F__)
#define DI_SIMD_NS avx512
#elif defined(__AVX2__)
#define DI_SIMD_NS avx2
#else
#error "kernels/simd.h needs a translation unit compiled with an ISA's flags"
#endif

namespace deepinfer::simd::DI_SIMD_NS {

#if defined(__AVX512F__)

constexpr Isa kIsa = Isa::Avx512;
constexpr int kLanes = 16;
using F = __m512;
using I = __m512i;
#define DI_MM(op) _mm512_##op
#define DI_SI(op) _mm512_##op##_si512

DI_VEC float reduce_max(F v) {
  return _mm512_reduce_max_ps(v);
}
DI_VEC bool all_zero(I v) {
  return _mm512_test_epi32_mask(v, v) == 0;
}
// x < t ? a : b, lane by lane.
DI_VEC I select_lt(F x, F t, I a, I b) {
  return _mm512_mask_mov_epi32(b, _mm512_cmp_ps_mask(x, t, _CMP_LT_OQ), a);
}
// d == v ? a : b, lane by lane.
DI_VEC I where_eq(I d, int32_t v, I a, I b) {
  return _mm512_mask_mov_epi32(b, _mm512_cmpeq_epi32_mask(d, _mm512_set1_epi32(v)), a);
}
// vdpbf16ps adds a lane's high product, then its low one. A canonical chain (kernels/reduce.h:
// the even or the odd elements of a block, fused in order) therefore takes elements
// (4g + 2 + s, 4g + s) as the (low, high) halves of its step 2g + s (s = 0 even, 1 odd): 32 bf16
// words x in these word indices give the 16 steps of a 32-element block (x2, x0, x3, x1 of every
// group of 4).
DI_VEC I chain_order_words() {
  return _mm512_set_epi16(29, 31, 28, 30, 25, 27, 24, 26, 21, 23, 20, 22, 17, 19, 16, 18, 13, 15,
                          12, 14, 9, 11, 8, 10, 5, 7, 4, 6, 1, 3, 0, 2);
}
// v = +0 by the zeroing idiom on v's own register, which the register renamer completes: GCC
// otherwise copies one zero register into each accumulator, a vector move that takes an FP pipe
// on Zen 4, and shuffles registers around them.
DI_VEC void zero_in_place(F& v) {
  asm("vpxord %0, %0, %0" : "+v"(v));
}
// kLanes bytes, zero-extended to 32-bit lanes.
DI_VEC I load_u8(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// The high halves of the lanes (bf16 bits of fp32 values) to kLanes 16-bit values.
DI_VEC void store_hi16(uint16_t* p, F v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(v), 16)));
}

#else  // AVX2

constexpr Isa kIsa = Isa::Avx2;
constexpr int kLanes = 8;
using F = __m256;
using I = __m256i;
#define DI_MM(op) _mm256_##op
#define DI_SI(op) _mm256_##op##_si256

DI_VEC float reduce_max(F v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps(m, m, 1)));
}
DI_VEC bool all_zero(I v) {
  return _mm256_testz_si256(v, v);
}
DI_VEC I select_lt(F x, F t, I a, I b) {
  return _mm256_blendv_epi8(b, a, _mm256_castps_si256(_mm256_cmp_ps(x, t, _CMP_LT_OQ)));
}
DI_VEC I where_eq(I d, int32_t v, I a, I b) {
  return _mm256_blendv_epi8(b, a, _mm256_cmpeq_epi32(d, _mm256_set1_epi32(v)));
}
DI_VEC I load_u8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
DI_VEC void store_hi16(uint16_t* p, F v) {
  alignas(32) uint32_t b[8];
  _mm256_store_si256(reinterpret_cast<I*>(b), _mm256_castps_si256(v));
  for (int l = 0; l < 8; ++l) p[l] = uint16_t(b[l] >> 16);
}

#endif

// The operations both ISAs spell alike (but for the width in the intrinsic's name). Arithmetic
// (+ - * /) and bitwise & | are GCC's vector operators, in which the intrinsics are written; with
// -ffp-contract=off a product and a sum stay two roundings.
DI_VEC F zero() {
  return DI_MM(setzero_ps)();
}
DI_VEC F set1(float x) {
  return DI_MM(set1_ps)(x);
}
DI_VEC F load(const float* p) {
  return DI_MM(load_ps)(p);
}
DI_VEC F loadu(const float* p) {
  return DI_MM(loadu_ps)(p);
}
DI_VEC void store(float* p, F v) {
  DI_MM(store_ps)(p, v);
}
DI_VEC void storeu(float* p, F v) {
  DI_MM(storeu_ps)(p, v);
}
DI_VEC F max(F a, F b) {
  return DI_MM(max_ps)(a, b);
}
DI_VEC F min(F a, F b) {
  return DI_MM(min_ps)(a, b);
}
DI_VEC F fmadd(F a, F b, F c) {
  return DI_MM(fmadd_ps)(a, b, c);
}
DI_VEC I set1i(int32_t x) {
  return DI_MM(set1_epi32)(x);
}
DI_VEC I loadui(const void* p) {
  return DI_SI(loadu)(reinterpret_cast<const I*>(p));
}
DI_VEC I addi(I a, I b) {
  return DI_MM(add_epi32)(a, b);
}
// The bits of v as integer lanes, and back.
DI_VEC I bits(F v) {
  return I(v);
}
DI_VEC F floats(I v) {
  return F(v);
}
template <int N>
DI_VEC I srli(I a) {
  return DI_MM(srli_epi32)(a, N);
}
template <int N>
DI_VEC I slli(I a) {
  return DI_MM(slli_epi32)(a, N);
}
#undef DI_MM
#undef DI_SI

// c + a·b: fused when the product is exact (then both agree), else the rounded product is added.
template <bool FM>
DI_VEC F madd(F a, F b, F c) {
  if constexpr (FM)
    return fmadd(a, b, c);
  else
    return c + a * b;
}

// bf16 rounding (to nearest even) of finite values, kept as fp32.
DI_VEC F round_bf16(F v) {
  const I u = bits(v);
  const I r = addi(u, addi(set1i(0x7fff), srli<16>(u) & set1i(1)));
  return floats(r & set1i(int32_t(0xffff0000u)));
}

// Whether every element of x[n] is a bf16 value (low 16 bits zero).
DI_VEC bool all_bf16(const float* x, int64_t n) {
  I acc = set1i(0);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) acc |= loadui(x + i);
  uint32_t low = all_zero(acc & set1i(0xffff)) ? 0u : 1u;
  for (; i < n; ++i) low |= __builtin_bit_cast(uint32_t, x[i]) & 0xffffu;
  return low == 0;
}

// Whether every element of x[n] is a bf16 value whose magnitude is 0 or at least 2^-56: products
// of such values, and their sums, are multiples of 2^-126, never subnormal. With `out`, the bf16
// bits of x go there in the same pass (to be used only when true is returned).
DI_VEC bool all_bf16_floored(const float* x, int64_t n, uint16_t* out = nullptr) {
  const I ones = set1i(-1), none = set1i(0), mag = set1i(0x7fffffff);
  const F floor = set1(0x1p-56f), tiny = set1(0x1p-149f);
  I acc = none;
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const I u = loadui(x + i);
    const F a = floats(u & mag);
    acc |= (u & set1i(0xffff)) | select_lt(a, floor, select_lt(a, tiny, none, ones), none);
    if (out) store_hi16(out + i, floats(u));
  }
  bool ok = all_zero(acc);
  for (; i < n; ++i) {
    const float a = x[i] < 0 ? -x[i] : x[i];
    ok &= (__builtin_bit_cast(uint32_t, x[i]) & 0xffffu) == 0 && (a == 0 || a >= 0x1p-56f);
    if (out) out[i] = uint16_t(__builtin_bit_cast(uint32_t, x[i]) >> 16);
  }
  return ok;
}

// The e8m0 code of 2^ceil(log2(a · c)), the product rounded to fp32 first: core/dtype.h's
// pow2ceil_e8m0 (the block scales of act_quant and fp4 "I"), for the ISA files.
DI_VEC uint8_t pow2ceil_code(float a, float c) {
  const uint32_t t = __builtin_bit_cast(uint32_t, a * c);
  return uint8_t(((t >> 23) & 0xff) + ((t & 0x7fffff) != 0 ? 1 : 0));
}

// An e8m0 scale byte -> 2^(b-127) (b = 0: 2^-127, b = 255: NaN), as the scalar decoder.
DI_VEC float e8m0(uint8_t b) {
  const uint32_t u = b == 255 ? 0x7fc00000u : b == 0 ? 0x00400000u : uint32_t(b) << 23;
  return __builtin_bit_cast(float, u);
}

// e8m0 codes, one per lane -> 2^(b-127) (b = 0: 2^-127, b = 255: NaN), as the scalar decoder.
DI_VEC F e8m0_lanes(I d) {
  const I u = where_eq(d, 0, set1i(0x00400000), slli<23>(d));
  return floats(where_eq(d, 255, set1i(0x7fc00000), u));
}

}  // namespace deepinfer::simd::DI_SIMD_NS
