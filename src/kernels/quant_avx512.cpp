// AVX-512 twins of the cache-row decoders, fp4 "I"'s QDQ and the bf16 rounding of
// kernels/quant.cpp: the same exact decodes (NaN codes included) and the same single fp32
// product by the block scale.
// Only intrinsics over plain arrays here (cmake/deepinfer.cmake: no shared inline code).
#include "kernels/isa.h"
#include "kernels/simd.h"

namespace deepinfer::quant_isa {

namespace {

using namespace simd::avx512;

// e4m3 codes (one per 32-bit lane) -> values; 0x7f/0xff are NaN as in the scalar table.
inline F e4m3_of(I d) {
  const I u = _mm512_srai_epi32(slli<24>(d), 4) & set1i(int32_t(0x87f00000u));
  const F v = floats(u) * set1(0x1p120f);
  const __mmask16 nan = _mm512_cmpeq_epi32_mask(d & set1i(0x7f), set1i(0x7f));
  return _mm512_mask_mov_ps(v, nan, floats(set1i(0x7fc00000)));
}

inline float e4m3_1(uint8_t b) {
  return _mm512_cvtss_f32(e4m3_of(set1i(b)));
}

// 16 packed bytes -> the 32 e2m1 values in element order (low nibble first).
inline void e2m1x32(const uint8_t* p, F& v0, F& v1) {
  const F lut = _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f,
                               -1.5f, -2.0f, -3.0f, -4.0f, -6.0f);
  const I d = load_u8(p);
  const F lo = _mm512_permutexvar_ps(d, lut);
  const F hi = _mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), lut);
  const I i0 = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const I i1 = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
  v0 = _mm512_permutex2var_ps(lo, i0, hi);
  v1 = _mm512_permutex2var_ps(lo, i1, hi);
}

// fp4 rows: variant I (an e8m0 scale per 32) or, with C, variant C (an e4m3 scale per 16).
template <bool C>
void fp4_dequant(const uint8_t* packed, const uint8_t* scales, int64_t n, float* out) {
  for (int64_t b = 0; b < n / 32; ++b) {
    F v[2];
    e2m1x32(packed + b * 16, v[0], v[1]);
    for (int h = 0; h < 2; ++h) {
      const float s = C ? e4m3_1(scales[2 * b + h]) : e8m0(scales[b]);
      storeu(out + b * 32 + h * 16, v[h] * set1(s));
    }
  }
}

// The largest magnitude of a block of 32 values, NaN left out (vmaxps returns its second operand
// then), at least `floor`.
inline float block_amax(const F (&v)[2], float floor) {
  const I abs = set1i(0x7fffffff);
  const F m =
      _mm512_max_ps(floats(bits(v[1]) & abs), _mm512_max_ps(floats(bits(v[0]) & abs), zero()));
  const float top = reduce_max(m);
  return top > floor ? top : floor;
}

}  // namespace

void fp4i_qdq_avx512(float* x, int64_t n) {
  // e2m1's midpoints and the magnitude above each: a value moves past an even code's upper
  // midpoint only above it, past an odd code's at it (ties to the even code).
  constexpr float kMid[7] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  constexpr float kUp[7] = {0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const I abs = set1i(0x7fffffff), sign = set1i(int32_t(0x80000000u));
  for (int64_t b = 0; b < n; b += 32) {
    F v[2] = {loadu(x + b), loadu(x + b + 16)};
    const F s = set1(e8m0(pow2ceil_code(block_amax(v, 6.0f * 0x1p-126f), 1.0f / 6.0f)));
    for (int h = 0; h < 2; ++h) {
      const F a = floats(bits(_mm512_div_ps(v[h], s)) & abs);  // (exact: s a power of two)
      F mag = zero();
#pragma GCC unroll 7
      for (int k = 0; k < 7; ++k) {
        const __mmask16 up = k % 2 ? _mm512_cmp_ps_mask(a, set1(kMid[k]), _CMP_GE_OQ)
                                   : _mm512_cmp_ps_mask(a, set1(kMid[k]), _CMP_GT_OQ);
        mag = _mm512_mask_mov_ps(mag, up, set1(kUp[k]));
      }
      // The sign of x (a NaN's code is +0), then times the scale as the scalar decode does.
      const __mmask16 nan = _mm512_cmp_ps_mask(v[h], v[h], _CMP_UNORD_Q);
      const I sg = _mm512_maskz_mov_epi32(__mmask16(~nan), bits(v[h]) & sign);
      storeu(x + b + h * 16, floats(bits(mag) | sg) * s);
    }
  }
}

void round_bf16_avx512(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const I u = loadui(x + i);
    // NaN stays NaN, quieted: (bits >> 16 | 0x40) << 16.
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(u & set1i(0x7fffffff), set1i(0x7f800000));
    const I q = (u & set1i(int32_t(0xffff0000u))) | set1i(0x00400000);
    storeu(x + i, _mm512_mask_mov_ps(round_bf16(floats(u)), nan, floats(q)));
  }
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1);
    alignas(64) float tail[16] = {};
    store(tail, _mm512_maskz_loadu_ps(m, x + i));
    round_bf16_avx512(tail, 16);
    _mm512_mask_storeu_ps(x + i, m, load(tail));
  }
}

void act_quant_avx512(const float* x, int64_t n, uint8_t* codes, uint8_t* scales) {
  const I abs = set1i(0x7fffffff);
  for (int64_t b = 0; b < n; b += 32) {
    F v[2] = {loadu(x + b), loadu(x + b + 16)};
    const uint8_t s = pow2ceil_code(block_amax(v, 1e-4f), 1.0f / 448.0f);
    scales[b / 32] = s;
    const F inv = set1(e8m0(uint8_t(254 - s)));  // 1/sigma, exact
    for (int h = 0; h < 2; ++h) {
      // Clamped to ±448 (a NaN stays: std::clamp returns it), then e4m3's RNE: below 2^-6 in
      // units of 2^-9, else the exponent rebased by 120 with the mantissa, rounded by 20 bits
      // together (a carry bumps the exponent); NaN -> 0x7f. The sign from the bits.
      const F q = _mm512_mul_ps(v[h], inv);
      const __mmask16 nan = _mm512_cmp_ps_mask(q, q, _CMP_UNORD_Q);
      const F c =
          _mm512_mask_mov_ps(_mm512_min_ps(_mm512_max_ps(q, set1(-448.0f)), set1(448.0f)), nan, q);
      const I u = bits(c), ax = u & abs;
      const I sub = _mm512_cvtps_epi32(floats(ax) * set1(512.0f));  // (RNE, exact product)
      const I t = _mm512_sub_epi32(ax, set1i(120 << 23));
      const I qt = _mm512_srli_epi32(t, 20), rem = t & set1i(0xfffff);
      const __mmask16 up =
          _mm512_cmpgt_epu32_mask(rem, set1i(0x80000)) |
          (_mm512_cmpeq_epi32_mask(rem, set1i(0x80000)) & _mm512_test_epi32_mask(qt, set1i(1)));
      const I nrm = _mm512_mask_add_epi32(qt, up, qt, set1i(1));
      I code = _mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(ax, set1i(121 << 23)), nrm, sub);
      code = _mm512_mask_mov_epi32(code, nan, set1i(0x7f));
      code = code | (_mm512_srli_epi32(u, 24) & set1i(0x80));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + b + h * 16), _mm512_cvtepi32_epi8(code));
    }
  }
}

void fp8_dequant_avx512(const uint8_t* codes, const uint8_t* scales, int64_t n, float* out) {
  for (int64_t b = 0; b < n / 32; ++b) {
    const F s = set1(e8m0(scales[b]));
    for (int h = 0; h < 2; ++h)
      storeu(out + b * 32 + h * 16, e4m3_of(load_u8(codes + b * 32 + h * 16)) * s);
  }
}

void fp4i_dequant_avx512(const uint8_t* packed, const uint8_t* scales, int64_t n, float* out) {
  fp4_dequant<false>(packed, scales, n, out);
}

void fp4c_dequant_avx512(const uint8_t* packed, const uint8_t* scales, int64_t n, float* out) {
  fp4_dequant<true>(packed, scales, n, out);
}

}  // namespace deepinfer::quant_isa
