// AVX-512 linear kernels (see kernels/linear.h for the tile layout and kernels/reduce.h for the
// order every path reproduces).
//
//   GEMV  one pass over a tile's contiguous values for up to 4 rows: decode 16 weights of input
//         k into fp32 lanes (one per output row), FMA with the broadcast x_k; four blocks are in
//         flight at once so the FMA chains overlap, and their partials join the total in order.
//   GEMM  per task a panel of 3 tiles (48 outputs): chunks of 256 inputs are decoded once into
//         bf16 pairs (quantized inputs: vdpbf16ps over e4m3/e2m1 codes, exact products) or fp32
//         (dense inputs: FMA), then every group of 8 rows runs over the chunk; block partials
//         live in registers and are scaled into an fp32 accumulator tile.
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
inline __m512 madd(__m512 a, __m512 b, __m512 c) {
  if constexpr (FM)
    return _mm512_fmadd_ps(a, b, c);
  else
    return _mm512_add_ps(c, _mm512_mul_ps(a, b));
}

inline float e8m0f(uint8_t b) {
  uint32_t u = b == 255 ? 0x7fc00000u : b == 0 ? 0x00400000u : uint32_t(b) << 23;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// --- decoding 16 output lanes ---

// e4m3 bytes -> fp32, exact (subnormals included; the NaN codes decode as ±480, which no
// checkpoint stores): the code's magnitude bits placed as an fp32 2^120 times too small, then
// scaled back.
inline __m512 fp8x16(const uint8_t* p) {
  const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  __m512i u = _mm512_srai_epi32(_mm512_slli_epi32(d, 24), 4);
  u = _mm512_and_si512(u, _mm512_set1_epi32(int32_t(0x87f00000u)));
  return _mm512_mul_ps(_mm512_castsi512_ps(u), _mm512_set1_ps(0x1p120f));
}

inline __m512 e2m1_lut() {
  return _mm512_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f, -0.0f, -0.5f, -1.0f, -1.5f,
                        -2.0f, -3.0f, -4.0f, -6.0f);
}

inline __m512 bf16x16(const uint8_t* p) {
  const __m512i d = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(d, 16));
}

// e8m0 bytes -> 2^(b-127) (b = 0: 2^-127, b = 255: NaN), as the scalar decoder.
inline __m512 e8m0x16(const uint8_t* p) {
  const __m512i d = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  __m512i u = _mm512_slli_epi32(d, 23);
  u = _mm512_mask_mov_epi32(u, _mm512_cmpeq_epi32_mask(d, _mm512_setzero_si512()),
                            _mm512_set1_epi32(0x00400000));
  u = _mm512_mask_mov_epi32(u, _mm512_cmpeq_epi32_mask(d, _mm512_set1_epi32(255)),
                            _mm512_set1_epi32(0x7fc00000));
  return _mm512_castsi512_ps(u);
}

// Weights of inputs k0 (even) and k0 + 1 for the 16 rows of a tile.
template <int F>
inline void load_pair(const uint8_t* tile, int64_t k0, __m512 lut, __m512& w0, __m512& w1) {
  if constexpr (F == kFp8) {
    w0 = fp8x16(tile + k0 * 16);
    w1 = fp8x16(tile + k0 * 16 + 16);
  } else if constexpr (F == kFp4) {
    const __m512i d =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(tile + k0 * 8)));
    w0 = _mm512_permutexvar_ps(d, lut);
    w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(d, 4), lut);
  } else if constexpr (F == kBf16) {
    w0 = bf16x16(tile + k0 * 32);
    w1 = bf16x16(tile + k0 * 32 + 32);
  } else {
    w0 = _mm512_loadu_ps(reinterpret_cast<const float*>(tile) + k0 * 16);
    w1 = _mm512_loadu_ps(reinterpret_cast<const float*>(tile) + k0 * 16 + 16);
  }
}

// The weight scale of tile t, block b, per lane.
template <int F>
inline __m512 block_wscale(const PackedWeight& w, int64_t t, int64_t b) {
  if constexpr (F == kFp8) {
    return _mm512_set1_ps(e8m0f(w.scale[(t / 2) * w.scale_cols + b]));
  } else if constexpr (F == kFp4) {
    return e8m0x16(w.scale + (t * (w.cols / 32) + b) * 16);
  } else {
    return _mm512_set1_ps(1.0f);
  }
}

// Writes the 16 outputs of tile t of row r where lo <= o < hi.
inline void store_tile(const Job& j, int64_t r, int64_t t, __m512 v) {
  float* yr = j.y + r * j.ldy;
  const int64_t o0 = t * 16;
  if (o0 >= j.lo && o0 + 16 <= j.hi) {
    _mm512_storeu_ps(yr + (o0 - j.lo), v);
    return;
  }
  float tmp[16];
  _mm512_storeu_ps(tmp, v);
  for (int64_t l = 0; l < 16; ++l)
    if (o0 + l >= j.lo && o0 + l < j.hi) yr[o0 + l - j.lo] = tmp[l];
}

// --- GEMV ---

template <int F, bool FM, int NR, int NB>
inline void gemv_blocks(const Job& j, const uint8_t* tile, int64_t t, int64_t b0, __m512 lut,
                        __m512* acc) {
  __m512 p[NB][NR];
  for (int bb = 0; bb < NB; ++bb)
    for (int r = 0; r < NR; ++r) p[bb][r] = _mm512_setzero_ps();
  for (int kk = 0; kk < 16; ++kk) {
    for (int bb = 0; bb < NB; ++bb) {
      const int64_t k0 = (b0 + bb) * 32 + 2 * kk;
      __m512 w0, w1;
      load_pair<F>(tile, k0, lut, w0, w1);
      for (int r = 0; r < NR; ++r) {
        const float* xr = j.x + r * j.ldx;
        p[bb][r] = madd<FM>(_mm512_set1_ps(xr[k0 + 1]), w1, p[bb][r]);
        p[bb][r] = madd<FM>(_mm512_set1_ps(xr[k0]), w0, p[bb][r]);
      }
    }
  }
  for (int bb = 0; bb < NB; ++bb) {
    const __m512 ws = block_wscale<F>(*j.w, t, b0 + bb);
    for (int r = 0; r < NR; ++r) {
      const __m512 s =
          j.xs ? _mm512_mul_ps(_mm512_set1_ps(j.xs[r * j.ldxs + b0 + bb]), ws) : ws;
      acc[r] = _mm512_fmadd_ps(p[bb][r], s, acc[r]);
    }
  }
}

template <int F, bool FM, int NR>
void gemv_rows(const Job& j) {
  constexpr int NB = NR == 1 ? 8 : 4;
  const int64_t nb = j.w->cols / 32;
  const __m512 lut = e2m1_lut();
  for (int64_t t = j.t0; t < j.t1; ++t) {
    const uint8_t* tile = j.w->data + t * j.w->tile_bytes;
    __m512 acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = _mm512_setzero_ps();
    int64_t b = 0;
    for (; b + NB <= nb; b += NB) gemv_blocks<F, FM, NR, NB>(j, tile, t, b, lut, acc);
    for (; b < nb; ++b) gemv_blocks<F, FM, NR, 1>(j, tile, t, b, lut, acc);
    for (int r = 0; r < NR; ++r) store_tile(j, r, t, acc[r]);
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

// --- GEMM ---

constexpr int kMr = 8;           // rows per micro-kernel call
constexpr int64_t kKcBf16 = 256;  // inputs per packed chunk (bf16 pairs: 24 KiB for 3 tiles)
constexpr int64_t kKcF32 = 128;   // (fp32: 24 KiB)
constexpr int64_t kNt = kGemmPanelTiles;

struct GemmScratch {
  float* c;       // [n, kNt * 16] accumulators
  uint8_t* b;     // packed chunk: bf16 pairs [kc/2][nt][16] or fp32 [kc][nt][16]
  float* ws;      // [kc/32][nt][16] block scales
};

int64_t gemm_scratch_bytes(int64_t n, int64_t /*K*/) {
  const int64_t c = n * kNt * 16 * 4, b = kKcBf16 * kNt * 16 * 4, ws = kKcBf16 / 32 * kNt * 64;
  return (c + 63) / 64 * 64 + b + ws;
}

GemmScratch scratch_of(const Job& j) {
  GemmScratch s;
  s.c = reinterpret_cast<float*>(j.scratch);
  const int64_t c = (j.n * kNt * 16 * 4 + 63) / 64 * 64;
  s.b = j.scratch + c;
  s.ws = reinterpret_cast<float*>(j.scratch + c + kKcBf16 * kNt * 16 * 4);
  return s;
}

// Interleaves 16 even-input and 16 odd-input weights into bf16 pairs (low word = even input).
inline __m512i bf16_pairs(__m512 w0, __m512 w1) {
  const __m512i both = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(w1, w0));  // [w0 | w1]
  alignas(64) static const uint16_t kIdx[32] = {0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,
                                                 21, 6, 22, 7, 23, 8, 24, 9,  25, 10, 26,
                                                 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  return _mm512_permutexvar_epi16(_mm512_load_si512(kIdx), both);
}

template <int F>
void pack_chunk(const Job& j, int64_t nt, int64_t kc0, int64_t kc, bool bf16, GemmScratch& s) {
  const __m512 lut = e2m1_lut();
  for (int64_t t = 0; t < nt; ++t) {
    const uint8_t* tile = j.w->data + (j.t0 + t) * j.w->tile_bytes;
    for (int64_t k = 0; k < kc; k += 2) {
      __m512 w0, w1;
      load_pair<F>(tile, kc0 + k, lut, w0, w1);
      if (bf16) {
        _mm512_store_si512(s.b + ((k / 2) * nt + t) * 64, bf16_pairs(w0, w1));
      } else {
        float* dst = reinterpret_cast<float*>(s.b);
        _mm512_store_ps(dst + (k * nt + t) * 16, w0);
        _mm512_store_ps(dst + ((k + 1) * nt + t) * 16, w1);
      }
    }
    for (int64_t b = 0; b < kc / 32; ++b)
      _mm512_store_ps(s.ws + (b * nt + t) * 16, block_wscale<F>(*j.w, j.t0 + t, kc0 / 32 + b));
  }
}

// Rows i0..i0+MR over one packed chunk with bf16 codes.
template <int MR, int NT>
void micro_bf16(const Job& j, int64_t i0, int64_t kc0, int64_t kc, const GemmScratch& s) {
  const __m512i* bp = reinterpret_cast<const __m512i*>(s.b);
  for (int64_t b = 0; b < kc / 32; ++b) {
    __m512 p[MR][NT];
    for (int i = 0; i < MR; ++i)
      for (int t = 0; t < NT; ++t) p[i][t] = _mm512_setzero_ps();
    for (int kk = 0; kk < 16; ++kk) {
      __m512bh w[NT];
      for (int t = 0; t < NT; ++t)
        w[t] = reinterpret_cast<__m512bh>(_mm512_load_si512(bp + (b * 16 + kk) * NT + t));
      for (int i = 0; i < MR; ++i) {
        int32_t pair;
        std::memcpy(&pair, j.xb + (i0 + i) * j.ldxb + kc0 + b * 32 + 2 * kk, 4);
        const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
        for (int t = 0; t < NT; ++t) p[i][t] = _mm512_dpbf16_ps(p[i][t], a, w[t]);
      }
    }
    for (int i = 0; i < MR; ++i) {
      const __m512 xs = _mm512_set1_ps(j.xs[(i0 + i) * j.ldxs + kc0 / 32 + b]);
      float* c = s.c + (i0 + i) * (kNt * 16);
      for (int t = 0; t < NT; ++t) {
        const __m512 sc = _mm512_mul_ps(xs, _mm512_load_ps(s.ws + (b * NT + t) * 16));
        _mm512_store_ps(c + t * 16, _mm512_fmadd_ps(p[i][t], sc, _mm512_load_ps(c + t * 16)));
      }
    }
  }
}

// Same with fp32 inputs and weights (dense inputs, or codes when bf16 products are not used).
template <int MR, int NT, bool FM>
void micro_f32(const Job& j, int64_t i0, int64_t kc0, int64_t kc, const GemmScratch& s) {
  const float* bp = reinterpret_cast<const float*>(s.b);
  for (int64_t b = 0; b < kc / 32; ++b) {
    __m512 p[MR][NT];
    for (int i = 0; i < MR; ++i)
      for (int t = 0; t < NT; ++t) p[i][t] = _mm512_setzero_ps();
    for (int kk = 0; kk < 16; ++kk) {
      const int64_t k0 = b * 32 + 2 * kk;
      for (int odd = 1; odd >= 0; --odd) {
        __m512 w[NT];
        for (int t = 0; t < NT; ++t) w[t] = _mm512_load_ps(bp + ((k0 + odd) * NT + t) * 16);
        for (int i = 0; i < MR; ++i) {
          const __m512 a = _mm512_set1_ps(j.x[(i0 + i) * j.ldx + kc0 + k0 + odd]);
          for (int t = 0; t < NT; ++t) p[i][t] = madd<FM>(a, w[t], p[i][t]);
        }
      }
    }
    for (int i = 0; i < MR; ++i) {
      const __m512 xs = j.xs ? _mm512_set1_ps(j.xs[(i0 + i) * j.ldxs + kc0 / 32 + b])
                             : _mm512_set1_ps(1.0f);
      float* c = s.c + (i0 + i) * (kNt * 16);
      for (int t = 0; t < NT; ++t) {
        const __m512 ws = _mm512_load_ps(s.ws + (b * NT + t) * 16);
        const __m512 sc = j.xs ? _mm512_mul_ps(xs, ws) : ws;
        _mm512_store_ps(c + t * 16, _mm512_fmadd_ps(p[i][t], sc, _mm512_load_ps(c + t * 16)));
      }
    }
  }
}

using MicroFn = void (*)(const Job&, int64_t, int64_t, int64_t, const GemmScratch&);

template <int NT>
MicroFn micro_for(bool bf16, bool fm, int mr) {
  static constexpr MicroFn kBf[kMr] = {micro_bf16<1, NT>, micro_bf16<2, NT>, micro_bf16<3, NT>,
                                       micro_bf16<4, NT>, micro_bf16<5, NT>, micro_bf16<6, NT>,
                                       micro_bf16<7, NT>, micro_bf16<8, NT>};
  static constexpr MicroFn kF[kMr] = {
      micro_f32<1, NT, true>, micro_f32<2, NT, true>, micro_f32<3, NT, true>,
      micro_f32<4, NT, true>, micro_f32<5, NT, true>, micro_f32<6, NT, true>,
      micro_f32<7, NT, true>, micro_f32<8, NT, true>};
  static constexpr MicroFn kM[kMr] = {
      micro_f32<1, NT, false>, micro_f32<2, NT, false>, micro_f32<3, NT, false>,
      micro_f32<4, NT, false>, micro_f32<5, NT, false>, micro_f32<6, NT, false>,
      micro_f32<7, NT, false>, micro_f32<8, NT, false>};
  return bf16 ? kBf[mr - 1] : fm ? kF[mr - 1] : kM[mr - 1];
}

template <int F>
void gemm_fmt(const Job& j) {
  const int64_t K = j.w->cols, nt = j.t1 - j.t0;
  const bool bf16 = j.xb != nullptr;
  const int64_t KC = bf16 ? kKcBf16 : kKcF32;
  GemmScratch s = scratch_of(j);
  for (int64_t i = 0; i < j.n * kNt * 16; ++i) s.c[i] = 0.0f;
  for (int64_t kc0 = 0; kc0 < K; kc0 += KC) {
    const int64_t kc = min64(KC, K - kc0);
    pack_chunk<F>(j, nt, kc0, kc, bf16, s);
    for (int64_t i0 = 0; i0 < j.n; i0 += kMr) {
      const int mr = int(min64(kMr, j.n - i0));
      const MicroFn fn = nt == 3   ? micro_for<3>(bf16, j.fma, mr)
                         : nt == 2 ? micro_for<2>(bf16, j.fma, mr)
                                   : micro_for<1>(bf16, j.fma, mr);
      fn(j, i0, kc0, kc, s);
    }
  }
  for (int64_t i = 0; i < j.n; ++i)
    for (int64_t t = 0; t < nt; ++t)
      store_tile(j, i, j.t0 + t, _mm512_load_ps(s.c + i * (kNt * 16) + t * 16));
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

// --- activation quantization (V41_SPEC.md §3.4) ---

// RNE of |v| <= 448 to an e4m3 value: 3 mantissa bits for |v| >= 2^-6, multiples of 2^-9 below.
inline __m512 round_e4m3(__m512 v) {
  const __m512i sign = _mm512_and_si512(_mm512_castps_si512(v), _mm512_set1_epi32(INT32_MIN));
  const __m512 a = _mm512_abs_ps(v);
  __m512i u = _mm512_castps_si512(a);
  u = _mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7ffff),
                                           _mm512_and_si512(_mm512_srli_epi32(u, 20),
                                                            _mm512_set1_epi32(1))));
  u = _mm512_and_si512(u, _mm512_set1_epi32(int32_t(0xfff00000u)));
  const __m512 sub =
      _mm512_sub_ps(_mm512_add_ps(a, _mm512_set1_ps(16384.0f)), _mm512_set1_ps(16384.0f));
  const __mmask16 small = _mm512_cmp_ps_mask(a, _mm512_set1_ps(0x1p-6f), _CMP_LT_OQ);
  const __m512i m = _mm512_mask_mov_epi32(u, small, _mm512_castps_si512(sub));
  return _mm512_castsi512_ps(_mm512_or_si512(m, sign));
}

void quantize(const float* x, int64_t ldx, int64_t n, int64_t K, float* q, uint16_t* qb,
              float* xs) {
  const __m512 abs_mask = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
  for (int64_t i = 0; i < n; ++i) {
    const float* xr = x + i * ldx;
    for (int64_t b = 0; b < K / 32; ++b) {
      const __m512 x0 = _mm512_loadu_ps(xr + b * 32), x1 = _mm512_loadu_ps(xr + b * 32 + 16);
      const __m512 m = _mm512_max_ps(_mm512_and_ps(x0, abs_mask), _mm512_and_ps(x1, abs_mask));
      float a = _mm512_reduce_max_ps(m);
      a = a < 1e-4f ? 1e-4f : a;
      const float t = a * (1.0f / 448.0f);
      uint32_t tb;
      std::memcpy(&tb, &t, 4);
      const uint32_t code = ((tb >> 23) & 0xff) + ((tb & 0x7fffff) != 0 ? 1 : 0);
      const float sigma = e8m0f(uint8_t(code)), inv = e8m0f(uint8_t(254 - code));
      xs[i * (K / 32) + b] = sigma;
      const __m512 lo = _mm512_set1_ps(-448.0f), hi = _mm512_set1_ps(448.0f), vi = _mm512_set1_ps(inv);
      for (int h = 0; h < 2; ++h) {
        __m512 v = _mm512_mul_ps(h ? x1 : x0, vi);
        v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
        const __m512 r = round_e4m3(v);
        float* qd = q + i * K + b * 32 + h * 16;
        _mm512_storeu_ps(qd, r);
        if (qb)
          _mm256_storeu_si256(
              reinterpret_cast<__m256i*>(qb + i * K + b * 32 + h * 16),
              _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(r), 16)));
      }
    }
  }
}

}  // namespace

const Kernels& avx512_kernels() {
  static const Kernels k{quantize, gemv, gemm, gemm_scratch_bytes, true};
  return k;
}

bool avx512_dpbf16_is_canonical() {
  // Operands like those of quantized GEMMs (e4m3-like bf16 values) and wide exponent gaps, so
  // that the order of the two additions and their rounding show.
  uint64_t st = 0x9e3779b97f4a7c15ull;
  auto next = [&] {
    st ^= st << 13;
    st ^= st >> 7;
    st ^= st << 17;
    return st;
  };
  for (int it = 0; it < 4096; ++it) {
    alignas(64) uint16_t a[32], b[32];
    alignas(64) float acc[16], out[16];
    for (int l = 0; l < 32; ++l) {
      const uint64_t r = next();
      a[l] = uint16_t((r & 0x8000) | ((110 + (r >> 16) % 40) << 7) | ((r >> 8) & 0x70));
      b[l] = uint16_t(((r >> 32) & 0x8000) | ((115 + (r >> 40) % 30) << 7) | ((r >> 24) & 0x7f));
    }
    for (int l = 0; l < 16; ++l) {
      const uint64_t r = next();
      const uint32_t u = uint32_t((r & 0x80000000u) | ((100 + (r >> 32) % 60) << 23) |
                                  ((r >> 8) & 0x7fffff));
      std::memcpy(&acc[l], &u, 4);
    }
    const __m512 res =
        _mm512_dpbf16_ps(_mm512_load_ps(acc), reinterpret_cast<__m512bh>(_mm512_load_si512(a)),
                         reinterpret_cast<__m512bh>(_mm512_load_si512(b)));
    _mm512_store_ps(out, res);
    for (int l = 0; l < 16; ++l) {
      auto f = [](uint16_t h) {
        const uint32_t u = uint32_t(h) << 16;
        float v;
        std::memcpy(&v, &u, 4);
        return v;
      };
      const __m128 s1 = _mm_fmadd_ss(_mm_set_ss(f(a[2 * l + 1])), _mm_set_ss(f(b[2 * l + 1])),
                                     _mm_set_ss(acc[l]));
      const __m128 s0 = _mm_fmadd_ss(_mm_set_ss(f(a[2 * l])), _mm_set_ss(f(b[2 * l])), s1);
      const float want = _mm_cvtss_f32(s0);
      if (std::memcmp(&want, &out[l], 4) != 0) return false;
    }
  }
  return true;
}

}  // namespace deepinfer::linear_isa
