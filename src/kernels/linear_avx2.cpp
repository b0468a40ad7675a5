// AVX2 linear kernels: the structure of linear_avx512.cpp with 8-lane vectors (a tile of 16
// outputs is two vectors) and FMA only (no bf16 dot products), in the same canonical order.
// Only intrinsics over plain arrays here (cmake/deepinfer.cmake: no shared inline code).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/linear_isa.h"

// GCC 12's AVX-512 shift intrinsics read a deliberately undefined vector (_mm512_undefined_*),
// which -Wmaybe-uninitialized reports from inside the system header.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace deepinfer::linear_isa {

namespace {

enum Fmt { kFp8 = 0, kFp4 = 1, kBf16 = 2, kF32 = 3 };

int fmt_of(WeightFormat f) {
  switch (f) {
    case WeightFormat::Fp8Block:
      return kFp8;
    case WeightFormat::Fp4Row:
      return kFp4;
    case WeightFormat::BF16:
      return kBf16;
    default:
      return kF32;
  }
}

inline int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

// c + a·b: fused when the product is exact (the same value), else rounded product then sum.
template <bool FM>
inline __m256 madd(__m256 a, __m256 b, __m256 c) {
  if constexpr (FM)
    return _mm256_fmadd_ps(a, b, c);
  else
    return _mm256_add_ps(c, _mm256_mul_ps(a, b));
}

inline float e8m0f(uint8_t b) {
  uint32_t u = b == 255 ? 0x7fc00000u : b == 0 ? 0x00400000u : uint32_t(b) << 23;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline __m256i load_u8x8(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}

// e4m3 (the low 8 bytes of v) -> fp32, exact (subnormals included; the NaN codes decode as
// ±480, which no checkpoint stores): the magnitude bits placed as an fp32 2^120 times too small,
// then scaled back.
inline __m256 fp8x8(__m128i v) {
  __m256i u = _mm256_srai_epi32(_mm256_slli_epi32(_mm256_cvtepu8_epi32(v), 24), 4);
  u = _mm256_and_si256(u, _mm256_set1_epi32(int32_t(0x87f00000u)));
  return _mm256_mul_ps(_mm256_castsi256_ps(u), _mm256_set1_ps(0x1p120f));
}

// Nibbles (bits 0..3 of each lane; higher bits are ignored) -> e2m1 values: magnitude from an
// 8-entry table, bit 3 = sign.
inline __m256 e2m1x8(__m256i d) {
  const __m256 lut = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
  const __m256 mag = _mm256_permutevar8x32_ps(lut, d);
  const __m256i sign =
      _mm256_and_si256(_mm256_slli_epi32(d, 28), _mm256_set1_epi32(int32_t(0x80000000u)));
  return _mm256_or_ps(mag, _mm256_castsi256_ps(sign));
}

inline __m256 bf16x8(const uint8_t* p) {
  const __m256i d = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(d, 16));
}

inline __m256 e8m0x8(const uint8_t* p) {
  const __m256i d = load_u8x8(p);
  __m256i u = _mm256_slli_epi32(d, 23);
  u = _mm256_blendv_epi8(u, _mm256_set1_epi32(0x00400000),
                         _mm256_cmpeq_epi32(d, _mm256_setzero_si256()));
  u = _mm256_blendv_epi8(u, _mm256_set1_epi32(0x7fc00000),
                         _mm256_cmpeq_epi32(d, _mm256_set1_epi32(255)));
  return _mm256_castsi256_ps(u);
}

// Weights of inputs k0 (even) and k0 + 1 for half h (rows 8h..8h+7) of a tile, from the layouts
// of kernels/linear.h.
template <int F>
inline void load_pair(const uint8_t* tile, int64_t k0, int h, __m256& w0, __m256& w1) {
  if constexpr (F == kFp8) {
    // Pair (k0, k0+1) of group k0/4: two 8-byte runs of (even, odd) bytes for rows 8h..8h+3 and
    // 8h+4..8h+7; a byte shuffle separates the even and the odd input.
    const uint8_t* c = tile + (k0 / 4) * 64 + 32 * h + 8 * ((k0 / 2) & 1);
    const __m128i v = _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(c)),
                                         _mm_loadl_epi64(reinterpret_cast<const __m128i*>(c + 16)));
    const __m128i eo =
        _mm_shuffle_epi8(v, _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
    w0 = fp8x8(eo);
    w1 = fp8x8(_mm_unpackhi_epi64(eo, eo));
  } else if constexpr (F == kFp4) {
    // Words 16h..16h+15 of group k0/8 alternate inputs k0 and k0+1 of rows 8h..8h+7, in
    // nibble (k0 % 8) / 2 of each word.
    __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + (k0 / 8) * 64 + 32 * h));
    v = _mm256_srl_epi16(v, _mm_cvtsi32_si128(int(4 * ((k0 % 8) / 2))));
    w0 = e2m1x8(v);
    w1 = e2m1x8(_mm256_srli_epi32(v, 16));
  } else if constexpr (F == kBf16) {
    // (even, odd) bf16 pairs per row: the even input is the low half of each 32-bit lane.
    const __m256i d = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(tile + k0 * 32 + h * 32));
    w0 = _mm256_castsi256_ps(_mm256_slli_epi32(d, 16));
    w1 = _mm256_castsi256_ps(_mm256_and_si256(d, _mm256_set1_epi32(int32_t(0xffff0000u))));
  } else {
    w0 = _mm256_loadu_ps(reinterpret_cast<const float*>(tile) + k0 * 16 + h * 8);
    w1 = _mm256_loadu_ps(reinterpret_cast<const float*>(tile) + k0 * 16 + 16 + h * 8);
  }
}

template <int F>
inline __m256 block_wscale(const PackedWeight& w, int64_t t, int64_t b, int h) {
  if constexpr (F == kFp8) {
    return _mm256_set1_ps(e8m0f(w.scale[(t / 2) * w.scale_cols + b]));
  } else if constexpr (F == kFp4) {
    return e8m0x8(w.scale + (t * (w.cols / 32) + b) * 16 + h * 8);
  } else {
    return _mm256_set1_ps(1.0f);
  }
}

inline void store_tile(const Job& j, int64_t r, int64_t t, const float* v /*[16]*/) {
  float* yr = j.y + r * j.ldy;
  for (int64_t l = 0; l < 16; ++l) {
    const int64_t o = t * 16 + l;
    if (o >= j.lo && o < j.hi) yr[o - j.lo] = v[l];
  }
}

// --- GEMV ---

template <int F, bool FM, int NR, int NB>
inline void gemv_blocks(const Job& j, const uint8_t* tile, int64_t t, int64_t b0, int h,
                        __m256* acc) {
  __m256 p[NB][NR];
#pragma GCC unroll 16
  for (int bb = 0; bb < NB; ++bb)
#pragma GCC unroll 16
    for (int r = 0; r < NR; ++r) p[bb][r] = _mm256_setzero_ps();
#pragma GCC unroll 2
  for (int kk = 0; kk < 16; ++kk) {
#pragma GCC unroll 16
    for (int bb = 0; bb < NB; ++bb) {
      const int64_t k0 = (b0 + bb) * 32 + 2 * kk;
      __m256 w0, w1;
      load_pair<F>(tile, k0, h, w0, w1);
#pragma GCC unroll 16
      for (int r = 0; r < NR; ++r) {
        const float* xr = j.x + r * j.ldx;
        p[bb][r] = madd<FM>(_mm256_set1_ps(xr[k0 + 1]), w1, p[bb][r]);
        p[bb][r] = madd<FM>(_mm256_set1_ps(xr[k0]), w0, p[bb][r]);
      }
    }
  }
#pragma GCC unroll 16
  for (int bb = 0; bb < NB; ++bb) {
    const __m256 ws = block_wscale<F>(*j.w, t, b0 + bb, h);
#pragma GCC unroll 16
    for (int r = 0; r < NR; ++r) acc[r] = _mm256_fmadd_ps(p[bb][r], ws, acc[r]);
  }
}

template <int F, bool FM, int NR>
void gemv_rows(const Job& j) {
  constexpr int NB = NR == 1 ? 4 : NR == 2 ? 2 : 1;
  const int64_t nb = j.w->cols / 32;
  for (int64_t t = j.t0; t < j.t1; ++t) {
    const uint8_t* tile = j.w->data + t * j.w->tile_bytes;
    alignas(32) float out[NR][16];
#pragma GCC unroll 16
    for (int h = 0; h < 2; ++h) {
      __m256 acc[NR];
#pragma GCC unroll 16
      for (int r = 0; r < NR; ++r) acc[r] = _mm256_setzero_ps();
      int64_t b = 0;
      for (; b + NB <= nb; b += NB) gemv_blocks<F, FM, NR, NB>(j, tile, t, b, h, acc);
      for (; b < nb; ++b) gemv_blocks<F, FM, NR, 1>(j, tile, t, b, h, acc);
#pragma GCC unroll 16
      for (int r = 0; r < NR; ++r) _mm256_store_ps(out[r] + h * 8, acc[r]);
    }
#pragma GCC unroll 16
    for (int r = 0; r < NR; ++r) store_tile(j, r, t, out[r]);
  }
}

template <int F, bool FM>
void gemv_n(const Job& j) {
  switch (j.n) {
    case 1:
      return gemv_rows<F, FM, 1>(j);
    case 2:
      return gemv_rows<F, FM, 2>(j);
    case 3:
      return gemv_rows<F, FM, 3>(j);
    default:
      return gemv_rows<F, FM, 4>(j);
  }
}

template <int F>
void gemv_fmt(const Job& j) {
  if (j.fma)
    gemv_n<F, true>(j);
  else
    gemv_n<F, false>(j);
}

void gemv(const Job& j) {
  switch (fmt_of(j.w->format)) {
    case kFp8:
      return gemv_fmt<kFp8>(j);
    case kFp4:
      return gemv_fmt<kFp4>(j);
    case kBf16:
      return gemv_fmt<kBf16>(j);
    default:
      return gemv_fmt<kF32>(j);
  }
}

// --- GEMM (fp32 FMA) ---

constexpr int kMr = 6;
constexpr int64_t kKc = 128;
constexpr int64_t kNt = kGemmPanelTiles;

int64_t gemm_scratch_bytes(int64_t n, int64_t /*K*/) {
  return (n * kNt * 16 * 4 + 63) / 64 * 64 + kKc * kNt * 64 + kKc / 32 * kNt * 64;
}

// One tile (two 8-lane halves) for rows i0..i0+MR over a packed fp32 chunk [kc][nt][16].
template <int MR, bool FM>
void micro(const Job& j, int64_t i0, int64_t kc0, int64_t kc, int64_t nt, int64_t t,
           const float* bp, const float* ws, float* c /*[n][kNt*16]*/) {
  for (int64_t b = 0; b < kc / 32; ++b) {
    __m256 p[MR][2];
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) p[i][0] = p[i][1] = _mm256_setzero_ps();
#pragma GCC unroll 2
    for (int kk = 0; kk < 16; ++kk) {
      const int64_t k0 = b * 32 + 2 * kk;
#pragma GCC unroll 16
      for (int odd = 1; odd >= 0; --odd) {
        const float* w = bp + ((k0 + odd) * nt + t) * 16;
        const __m256 w0 = _mm256_load_ps(w), w1 = _mm256_load_ps(w + 8);
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i) {
          const __m256 a = _mm256_broadcast_ss(j.x + (i0 + i) * j.ldx + kc0 + k0 + odd);
          p[i][0] = madd<FM>(a, w0, p[i][0]);
          p[i][1] = madd<FM>(a, w1, p[i][1]);
        }
      }
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      float* ci = c + (i0 + i) * (kNt * 16) + t * 16;
#pragma GCC unroll 16
      for (int h = 0; h < 2; ++h) {
        const __m256 wsv = _mm256_load_ps(ws + (b * nt + t) * 16 + h * 8);
        _mm256_store_ps(ci + h * 8, _mm256_fmadd_ps(p[i][h], wsv, _mm256_load_ps(ci + h * 8)));
      }
    }
  }
}

template <bool FM>
void micro_rows(int64_t mr, const Job& j, int64_t i0, int64_t kc0, int64_t kc, int64_t nt,
                int64_t t, const float* bp, const float* ws, float* c) {
  switch (mr) {
    case 1:
      return micro<1, FM>(j, i0, kc0, kc, nt, t, bp, ws, c);
    case 2:
      return micro<2, FM>(j, i0, kc0, kc, nt, t, bp, ws, c);
    case 3:
      return micro<3, FM>(j, i0, kc0, kc, nt, t, bp, ws, c);
    case 4:
      return micro<4, FM>(j, i0, kc0, kc, nt, t, bp, ws, c);
    case 5:
      return micro<5, FM>(j, i0, kc0, kc, nt, t, bp, ws, c);
    default:
      return micro<6, FM>(j, i0, kc0, kc, nt, t, bp, ws, c);
  }
}

template <int F>
void gemm_fmt(const Job& j) {
  const int64_t K = j.w->cols, nt = j.t1 - j.t0;
  float* c = reinterpret_cast<float*>(j.scratch);
  const int64_t cbytes = (j.n * kNt * 16 * 4 + 63) / 64 * 64;
  float* bp = reinterpret_cast<float*>(j.scratch + cbytes);
  float* ws = reinterpret_cast<float*>(j.scratch + cbytes + kKc * kNt * 64);
  for (int64_t i = 0; i < j.n * kNt * 16; ++i) c[i] = 0.0f;
  for (int64_t kc0 = 0; kc0 < K; kc0 += kKc) {
    const int64_t kc = min64(kKc, K - kc0);
    for (int64_t t = 0; t < nt; ++t) {
      const uint8_t* tile = j.w->data + (j.t0 + t) * j.w->tile_bytes;
      for (int64_t k = 0; k < kc; k += 2)
#pragma GCC unroll 16
        for (int h = 0; h < 2; ++h) {
          __m256 w0, w1;
          load_pair<F>(tile, kc0 + k, h, w0, w1);
          _mm256_store_ps(bp + (k * nt + t) * 16 + h * 8, w0);
          _mm256_store_ps(bp + ((k + 1) * nt + t) * 16 + h * 8, w1);
        }
      for (int64_t b = 0; b < kc / 32; ++b)
#pragma GCC unroll 16
        for (int h = 0; h < 2; ++h)
          _mm256_store_ps(ws + (b * nt + t) * 16 + h * 8,
                          block_wscale<F>(*j.w, j.t0 + t, kc0 / 32 + b, h));
    }
    for (int64_t i0 = 0; i0 < j.n; i0 += kMr) {
      const int64_t mr = min64(kMr, j.n - i0);
      for (int64_t t = 0; t < nt; ++t) {
        if (j.fma)
          micro_rows<true>(mr, j, i0, kc0, kc, nt, t, bp, ws, c);
        else
          micro_rows<false>(mr, j, i0, kc0, kc, nt, t, bp, ws, c);
      }
    }
  }
  for (int64_t i = 0; i < j.n; ++i)
    for (int64_t t = 0; t < nt; ++t) store_tile(j, i, j.t0 + t, c + i * (kNt * 16) + t * 16);
}

void gemm(const Job& j) {
  switch (fmt_of(j.w->format)) {
    case kFp8:
      return gemm_fmt<kFp8>(j);
    case kFp4:
      return gemm_fmt<kFp4>(j);
    case kBf16:
      return gemm_fmt<kBf16>(j);
    default:
      return gemm_fmt<kF32>(j);
  }
}

// --- activation quantization ---

inline __m256 round_e4m3(__m256 v) {
  const __m256 sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(int32_t(0x80000000u)));
  const __m256 sign = _mm256_and_ps(v, sign_mask);
  const __m256 a = _mm256_andnot_ps(sign_mask, v);
  __m256i u = _mm256_castps_si256(a);
  u = _mm256_add_epi32(
      u, _mm256_add_epi32(_mm256_set1_epi32(0x7ffff),
                          _mm256_and_si256(_mm256_srli_epi32(u, 20), _mm256_set1_epi32(1))));
  u = _mm256_and_si256(u, _mm256_set1_epi32(int32_t(0xfff00000u)));
  const __m256 sub =
      _mm256_sub_ps(_mm256_add_ps(a, _mm256_set1_ps(16384.0f)), _mm256_set1_ps(16384.0f));
  const __m256 small = _mm256_cmp_ps(a, _mm256_set1_ps(0x1p-6f), _CMP_LT_OQ);
  return _mm256_or_ps(_mm256_blendv_ps(_mm256_castsi256_ps(u), sub, small), sign);
}

void quantize(const float* x, int64_t ldx, int64_t n, int64_t K, float* xq, uint16_t* xqb) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t i = 0; i < n; ++i) {
    const float* xr = x + i * ldx;
    for (int64_t b = 0; b < K / 32; ++b) {
      __m256 m = _mm256_setzero_ps();
      for (int h = 0; h < 4; ++h)
        m = _mm256_max_ps(m, _mm256_and_ps(_mm256_loadu_ps(xr + b * 32 + h * 8), abs_mask));
      __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
      m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
      float a = _mm_cvtss_f32(m4);
      a = a < 1e-4f ? 1e-4f : a;
      const float t = a * (1.0f / 448.0f);
      uint32_t tb;
      std::memcpy(&tb, &t, 4);
      const uint32_t code = ((tb >> 23) & 0xff) + ((tb & 0x7fffff) != 0 ? 1 : 0);
      const __m256 sg = _mm256_set1_ps(e8m0f(uint8_t(code)));
      const __m256 vi = _mm256_set1_ps(e8m0f(uint8_t(254 - code)));
      for (int h = 0; h < 4; ++h) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(xr + b * 32 + h * 8), vi);
        v = _mm256_min_ps(_mm256_max_ps(v, _mm256_set1_ps(-448.0f)), _mm256_set1_ps(448.0f));
        const __m256 r = _mm256_mul_ps(round_e4m3(v), sg);  // exact: σ is a power of two
        _mm256_storeu_ps(xq + i * K + b * 32 + h * 8, r);
        if (xqb) {
          alignas(32) uint32_t bits[8];
          _mm256_store_si256(reinterpret_cast<__m256i*>(bits), _mm256_castps_si256(r));
          for (int l = 0; l < 8; ++l) xqb[i * K + b * 32 + h * 8 + l] = uint16_t(bits[l] >> 16);
        }
      }
    }
  }
}

}  // namespace

const Kernels& avx2_kernels() {
  static const Kernels k{quantize, nullptr, gemv, gemm, gemm_scratch_bytes, false};
  return k;
}

}  // namespace deepinfer::linear_isa
