// AVX-512 linear kernels (see kernels/linear.h for the tile layout and kernels/reduce.h for the
// order every path reproduces).
//
// Weights are decoded into bf16 pairs: one vector holds the 16 outputs of a tile for two
// consecutive inputs (2p, 2p+1), the even input in the low half of each 32-bit lane, exactly what
// vdpbf16ps multiplies with a broadcast pair of activations. e4m3 bytes become bf16 through two
// 128-entry byte tables (vpermi2b), e2m1 nibbles through a 16-entry word table (vpermw).
//
//   GEMV  one pass over a tile's contiguous values for up to 4 rows. Quantized inputs: vdpbf16ps
//         over the codes (exact products); several blocks in flight so the chains overlap, their
//         partials joining the total in block order. Dense inputs: the pairs are split into fp32
//         lanes and multiplied-and-added (fused when the products are exact).
//   GEMM  per task a panel of 3 tiles (48 outputs): chunks of inputs are decoded once into bf16
//         pairs (quantized) or fp32 (dense), then every group of 8 rows runs over the chunk; block
//         partials live in registers and are scaled into an fp32 accumulator tile.
// Only intrinsics over plain arrays here (cmake/deepinfer.cmake: no shared inline code).
#include <immintrin.h>

#include <cstdint>
#include <cstring>
#include <utility>

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

// --- decoding to bf16 pairs ---

// bf16 bits of the e4m3 magnitude codes 0..127, split into high and low bytes (all exact; the
// NaN code 0x7f decodes as 480, which no checkpoint stores).
struct Fp8Tables {
  uint8_t hi[128], lo[128];
};
constexpr uint16_t e4m3_bf16(int b) {
  const int e = (b >> 3) & 15, m = b & 7;
  if (e != 0) return uint16_t(((e + 120) << 7) | (m << 4));
  if (m == 0) return 0;
  const int sh = m >= 4 ? 2 : m >= 2 ? 1 : 0;  // m·2^-9 = (m / 2^sh)·2^(sh-9)
  return uint16_t(((127 - 9 + sh) << 7) | ((m << (7 - sh)) & 0x7f));
}
constexpr Fp8Tables make_fp8_tables() {
  Fp8Tables t{};
  for (int b = 0; b < 128; ++b) {
    t.hi[b] = uint8_t(e4m3_bf16(b) >> 8);
    t.lo[b] = uint8_t(e4m3_bf16(b) & 0xff);
  }
  return t;
}
alignas(64) constexpr Fp8Tables kFp8Tables = make_fp8_tables();
// e2m1 nibble -> bf16, twice over: vpermw reads 5 index bits, and bit 4 (the next nibble's low
// bit) must not matter.
alignas(64) constexpr uint16_t kE2m1Bf16[32] = {
    0x0000, 0x3f00, 0x3f80, 0x3fc0, 0x4000, 0x4040, 0x4080, 0x40c0, 0x8000, 0xbf00, 0xbf80,
    0xbfc0, 0xc000, 0xc040, 0xc080, 0xc0c0, 0x0000, 0x3f00, 0x3f80, 0x3fc0, 0x4000, 0x4040,
    0x4080, 0x40c0, 0x8000, 0xbf00, 0xbf80, 0xbfc0, 0xc000, 0xc040, 0xc080, 0xc0c0};

struct Luts {
  __m512i h0, h1, l0, l1, e2m1;
};
inline Luts make_luts() {
  return {_mm512_load_si512(kFp8Tables.hi), _mm512_load_si512(kFp8Tables.hi + 64),
          _mm512_load_si512(kFp8Tables.lo), _mm512_load_si512(kFp8Tables.lo + 64),
          _mm512_load_si512(kE2m1Bf16)};
}

// Input pairs 2g and 2g+1 (inputs 4g .. 4g+3) of a tile as bf16 pairs.
template <int F>
inline void decode_group(const uint8_t* tile, int64_t g, const Luts& L, __m512i& p0, __m512i& p1) {
  if constexpr (F == kFp8) {
    // The 64 bytes are stored so that the in-lane byte unpacks below put the pairs in order.
    const __m512i b = _mm512_loadu_si512(tile + g * 64);
    __m512i hi = _mm512_permutex2var_epi8(L.h0, b, L.h1);
    hi = _mm512_ternarylogic_epi32(hi, b, _mm512_set1_epi8(char(0x80)), 0xF8);  // | sign
    const __m512i lo = _mm512_permutex2var_epi8(L.l0, b, L.l1);
    p0 = _mm512_unpacklo_epi8(lo, hi);
    p1 = _mm512_unpackhi_epi8(lo, hi);
  } else if constexpr (F == kFp4) {
    // Word 2o + s of the 8-input group holds row o's inputs 2j + s in nibble j: pairs 2g and
    // 2g + 1 are nibbles 0 and 1 (g even) or 2 and 3 (g odd).
    __m512i d = _mm512_loadu_si512(tile + (g / 2) * 64);
    if (g & 1) d = _mm512_srli_epi16(d, 8);
    p0 = _mm512_permutexvar_epi16(d, L.e2m1);
    p1 = _mm512_permutexvar_epi16(_mm512_srli_epi16(d, 4), L.e2m1);
  } else {
    p0 = _mm512_loadu_si512(tile + g * 128);
    p1 = _mm512_loadu_si512(tile + g * 128 + 64);
  }
}

inline __m512 even_of(__m512i p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(p, 16));
}
inline __m512 odd_of(__m512i p) {
  return _mm512_castsi512_ps(_mm512_and_si512(p, _mm512_set1_epi32(int32_t(0xffff0000u))));
}

// Weights of inputs 4g .. 4g+3 as fp32 lanes.
template <int F>
inline void decode_group_f32(const uint8_t* tile, int64_t g, const Luts& L, __m512* w) {
  if constexpr (F == kF32) {
    const float* f = reinterpret_cast<const float*>(tile) + g * 64;
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) w[q] = _mm512_loadu_ps(f + q * 16);
  } else {
    __m512i p0, p1;
    decode_group<F>(tile, g, L, p0, p1);
    w[0] = even_of(p0);
    w[1] = odd_of(p0);
    w[2] = even_of(p1);
    w[3] = odd_of(p1);
  }
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

inline __m512bh bcast_pair(const uint16_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return reinterpret_cast<__m512bh>(_mm512_set1_epi32(v));
}

// Adds block partials p (of blocks b0 .. b0+NB-1) into the totals, in block order.
template <int F, int NR, int NB>
inline void add_partials(const Job& j, int64_t t, int64_t b0, __m512 (&p)[NB][NR], __m512* acc) {
#pragma GCC unroll 16
  for (int bb = 0; bb < NB; ++bb) {
    const __m512 ws = block_wscale<F>(*j.w, t, b0 + bb);
#pragma GCC unroll 16
    for (int r = 0; r < NR; ++r) acc[r] = _mm512_fmadd_ps(p[bb][r], ws, acc[r]);
  }
}

// --- GEMV ---

// Quantized rows: bf16 codes times bf16 pairs.
template <int F, int NR, int NB>
inline void gemv_dp_blocks(const Job& j, const uint8_t* tile, int64_t t, int64_t b0, const Luts& L,
                           __m512* acc) {
  __m512 p[NB][NR];
#pragma GCC unroll 16
  for (int bb = 0; bb < NB; ++bb)
#pragma GCC unroll 16
    for (int r = 0; r < NR; ++r) p[bb][r] = _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int g = 0; g < 8; ++g) {
#pragma GCC unroll 16
    for (int bb = 0; bb < NB; ++bb) {
      __m512i p0, p1;
      decode_group<F>(tile, (b0 + bb) * 8 + g, L, p0, p1);
#pragma GCC unroll 16
      for (int r = 0; r < NR; ++r) {
        const uint16_t* xr = j.xb + r * j.ldxb + (b0 + bb) * 32 + 4 * g;
        p[bb][r] = _mm512_dpbf16_ps(p[bb][r], reinterpret_cast<__m512bh>(p0), bcast_pair(xr));
        p[bb][r] = _mm512_dpbf16_ps(p[bb][r], reinterpret_cast<__m512bh>(p1), bcast_pair(xr + 2));
      }
    }
  }
  add_partials<F, NR, NB>(j, t, b0, p, acc);
}

// fp32 values times fp32 weights, in the pair order (odd input first).
template <int F, bool FM, int NR, int NB>
inline void gemv_fp_blocks(const Job& j, const uint8_t* tile, int64_t t, int64_t b0, const Luts& L,
                           __m512* acc) {
  __m512 p[NB][NR];
#pragma GCC unroll 16
  for (int bb = 0; bb < NB; ++bb)
#pragma GCC unroll 16
    for (int r = 0; r < NR; ++r) p[bb][r] = _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int g = 0; g < 8; ++g) {
#pragma GCC unroll 16
    for (int bb = 0; bb < NB; ++bb) {
      __m512 w[4];
      decode_group_f32<F>(tile, (b0 + bb) * 8 + g, L, w);
#pragma GCC unroll 16
      for (int r = 0; r < NR; ++r) {
        const float* xr = j.x + r * j.ldx + (b0 + bb) * 32 + 4 * g;
        p[bb][r] = madd<FM>(_mm512_set1_ps(xr[1]), w[1], p[bb][r]);
        p[bb][r] = madd<FM>(_mm512_set1_ps(xr[0]), w[0], p[bb][r]);
        p[bb][r] = madd<FM>(_mm512_set1_ps(xr[3]), w[3], p[bb][r]);
        p[bb][r] = madd<FM>(_mm512_set1_ps(xr[2]), w[2], p[bb][r]);
      }
    }
  }
  add_partials<F, NR, NB>(j, t, b0, p, acc);
}

// Mode: 0 bf16 products, 1 fp32 fused, 2 fp32 multiply-then-add.
template <int F, int Mode, int NR, int NB>
inline void gemv_blocks(const Job& j, const uint8_t* tile, int64_t t, int64_t b0, const Luts& L,
                        __m512* acc) {
  if constexpr (Mode == 0)
    gemv_dp_blocks<F, NR, NB>(j, tile, t, b0, L, acc);
  else
    gemv_fp_blocks<F, Mode == 1, NR, NB>(j, tile, t, b0, L, acc);
}

// Software prefetch into L2 (T1), 8 KiB ahead: the hardware prefetchers alone leave the GEMVs at
// a third of the read bandwidth here, prefetching into L1 (T0) holds L1 miss buffers and
// reached about two thirds of what T1 reaches (A/B in docs/benchmarks.md).
constexpr int64_t kPrefetchAhead = 8192;

template <int F, int Mode, int NR>
void gemv_rows(const Job& j) {
  constexpr int NB = NR == 1 ? 8 : 4;
  const int64_t nb = j.w->cols / 32;
  const Luts L = make_luts();
  {
    // The run's first window, which the prefetches below (always a window ahead) never cover.
    const uint8_t* first = j.w->data + j.t0 * j.w->tile_bytes;
    const int64_t n = min64(kPrefetchAhead, (j.t1 - j.t0) * j.w->tile_bytes);
    for (int64_t o = 0; o < n; o += 64)
      _mm_prefetch(reinterpret_cast<const char*>(first + o), _MM_HINT_T1);
  }
  for (int64_t t = j.t0; t < j.t1; ++t) {
    const uint8_t* tile = j.w->data + t * j.w->tile_bytes;
    __m512 acc[NR];
#pragma GCC unroll 16
    for (int r = 0; r < NR; ++r) acc[r] = _mm512_setzero_ps();
    // Blocks of one tile are contiguous (and tiles follow each other): prefetch a few KiB ahead
    // so that the decode overlaps the DRAM latency.
    const int64_t block_bytes = j.w->tile_bytes / nb;
    int64_t b = 0;
    for (; b + NB <= nb; b += NB) {
      const uint8_t* ahead = tile + b * block_bytes + kPrefetchAhead;
      for (int64_t o = 0; o < NB * block_bytes; o += 64)
        _mm_prefetch(reinterpret_cast<const char*>(ahead + o), _MM_HINT_T1);
      gemv_blocks<F, Mode, NR, NB>(j, tile, t, b, L, acc);
    }
    for (; b < nb; ++b) gemv_blocks<F, Mode, NR, 1>(j, tile, t, b, L, acc);
#pragma GCC unroll 16
    for (int r = 0; r < NR; ++r) store_tile(j, r, t, acc[r]);
  }
}

template <int F, int Mode>
void gemv_n(const Job& j) {
  switch (j.n) {
    case 1:
      return gemv_rows<F, Mode, 1>(j);
    case 2:
      return gemv_rows<F, Mode, 2>(j);
    case 3:
      return gemv_rows<F, Mode, 3>(j);
    default:
      return gemv_rows<F, Mode, 4>(j);
  }
}

template <int F>
void gemv_fmt(const Job& j) {
  if constexpr (F != kF32) {
    if (j.xb) return gemv_n<F, 0>(j);
  }
  if (j.fma)
    gemv_n<F, 1>(j);
  else
    gemv_n<F, 2>(j);
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

constexpr int kMr = 8;            // rows per micro-kernel call
constexpr int64_t kKcBf16 = 256;  // inputs per packed chunk (bf16 pairs: 24 KiB for 3 tiles)
constexpr int64_t kKcF32 = 128;   // (fp32: 24 KiB)
constexpr int64_t kNt = kGemmPanelTiles;

struct GemmScratch {
  float* c;    // [n, kNt * 16] accumulators
  uint8_t* b;  // packed chunk: bf16 pairs [kc/2][nt][16] or fp32 [kc][nt][16]
  float* ws;   // [kc/32][nt][16] block scales
};

int64_t gemm_scratch_bytes(int64_t n, int64_t /*K*/) {
  const int64_t c = n * kNt * 16 * 4, b = kKcBf16 * kNt * 16 * 2, ws = kKcBf16 / 32 * kNt * 64;
  return (c + 63) / 64 * 64 + b + ws;
}

GemmScratch scratch_of(const Job& j) {
  GemmScratch s;
  s.c = reinterpret_cast<float*>(j.scratch);
  const int64_t c = (j.n * kNt * 16 * 4 + 63) / 64 * 64;
  s.b = j.scratch + c;
  s.ws = reinterpret_cast<float*>(j.scratch + c + kKcBf16 * kNt * 16 * 2);
  return s;
}

template <int F>
void pack_chunk(const Job& j, int64_t nt, int64_t kc0, int64_t kc, bool bf16, GemmScratch& s) {
  const Luts L = make_luts();
  for (int64_t t = 0; t < nt; ++t) {
    const uint8_t* tile = j.w->data + (j.t0 + t) * j.w->tile_bytes;
    for (int64_t g = kc0 / 4; g < (kc0 + kc) / 4; ++g) {
      const int64_t k = g * 4 - kc0;
      if constexpr (F != kF32) {
        if (bf16) {
          __m512i p0, p1;
          decode_group<F>(tile, g, L, p0, p1);
          _mm512_store_si512(s.b + ((k / 2) * nt + t) * 64, p0);
          _mm512_store_si512(s.b + ((k / 2 + 1) * nt + t) * 64, p1);
          continue;
        }
      }
      __m512 w[4];
      decode_group_f32<F>(tile, g, L, w);
      float* dst = reinterpret_cast<float*>(s.b);
#pragma GCC unroll 4
      for (int q = 0; q < 4; ++q) _mm512_store_ps(dst + ((k + q) * nt + t) * 16, w[q]);
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
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
      for (int t = 0; t < NT; ++t) p[i][t] = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (int kk = 0; kk < 16; ++kk) {
      __m512bh w[NT];
#pragma GCC unroll 16
      for (int t = 0; t < NT; ++t)
        w[t] = reinterpret_cast<__m512bh>(_mm512_load_si512(bp + (b * 16 + kk) * NT + t));
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        const __m512bh a = bcast_pair(j.xb + (i0 + i) * j.ldxb + kc0 + b * 32 + 2 * kk);
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) p[i][t] = _mm512_dpbf16_ps(p[i][t], a, w[t]);
      }
    }
    __m512 ws[NT];
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) ws[t] = _mm512_load_ps(s.ws + (b * NT + t) * 16);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      float* c = s.c + (i0 + i) * (kNt * 16);
#pragma GCC unroll 16
      for (int t = 0; t < NT; ++t)
        _mm512_store_ps(c + t * 16, _mm512_fmadd_ps(p[i][t], ws[t], _mm512_load_ps(c + t * 16)));
    }
  }
}

// Same with fp32 inputs and weights (dense inputs, or codes when bf16 products are not used).
template <int MR, int NT, bool FM>
void micro_f32(const Job& j, int64_t i0, int64_t kc0, int64_t kc, const GemmScratch& s) {
  const float* bp = reinterpret_cast<const float*>(s.b);
  for (int64_t b = 0; b < kc / 32; ++b) {
    __m512 p[MR][NT];
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
      for (int t = 0; t < NT; ++t) p[i][t] = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (int kk = 0; kk < 16; ++kk) {
      const int64_t k0 = b * 32 + 2 * kk;
#pragma GCC unroll 2
      for (int odd = 1; odd >= 0; --odd) {
        __m512 w[NT];
#pragma GCC unroll 16
        for (int t = 0; t < NT; ++t) w[t] = _mm512_load_ps(bp + ((k0 + odd) * NT + t) * 16);
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i) {
          const __m512 a = _mm512_set1_ps(j.x[(i0 + i) * j.ldx + kc0 + k0 + odd]);
#pragma GCC unroll 16
          for (int t = 0; t < NT; ++t) p[i][t] = madd<FM>(a, w[t], p[i][t]);
        }
      }
    }
    __m512 ws[NT];
#pragma GCC unroll 16
    for (int t = 0; t < NT; ++t) ws[t] = _mm512_load_ps(s.ws + (b * NT + t) * 16);
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i) {
      float* c = s.c + (i0 + i) * (kNt * 16);
#pragma GCC unroll 16
      for (int t = 0; t < NT; ++t)
        _mm512_store_ps(c + t * 16, _mm512_fmadd_ps(p[i][t], ws[t], _mm512_load_ps(c + t * 16)));
    }
  }
}

using MicroFn = void (*)(const Job&, int64_t, int64_t, int64_t, const GemmScratch&);

template <int NT, int... MR>
MicroFn micro_pick(bool bf16, bool fm, int mr, std::integer_sequence<int, MR...>) {
  static constexpr MicroFn kBf[] = {micro_bf16<MR + 1, NT>...};
  static constexpr MicroFn kF[] = {micro_f32<MR + 1, NT, true>...};
  static constexpr MicroFn kM[] = {micro_f32<MR + 1, NT, false>...};
  return bf16 ? kBf[mr - 1] : fm ? kF[mr - 1] : kM[mr - 1];
}

template <int... NT>
MicroFn micro_for(bool bf16, bool fm, int mr, int nt, std::integer_sequence<int, NT...>) {
  MicroFn fn = nullptr;
  ((fn = nt == NT + 1 ? micro_pick<NT + 1>(bf16, fm, mr, std::make_integer_sequence<int, kMr>())
                      : fn),
   ...);
  return fn;
}

template <int F>
void gemm_fmt(const Job& j) {
  const int64_t K = j.w->cols, nt = j.t1 - j.t0;
  const bool bf16 = j.xb != nullptr && F != kF32;
  const int64_t KC = bf16 ? kKcBf16 : kKcF32;
  GemmScratch s = scratch_of(j);
  for (int64_t i = 0; i < j.n * kNt * 16; ++i) s.c[i] = 0.0f;
  for (int64_t kc0 = 0; kc0 < K; kc0 += KC) {
    const int64_t kc = min64(KC, K - kc0);
    pack_chunk<F>(j, nt, kc0, kc, bf16, s);
    for (int64_t i0 = 0; i0 < j.n; i0 += kMr) {
      const int mr = int(min64(kMr, j.n - i0));
      const MicroFn fn =
          micro_for(bf16, j.fma, mr, int(nt), std::make_integer_sequence<int, int(kNt)>());
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
  u = _mm512_add_epi32(
      u, _mm512_add_epi32(_mm512_set1_epi32(0x7ffff),
                          _mm512_and_si512(_mm512_srli_epi32(u, 20), _mm512_set1_epi32(1))));
  u = _mm512_and_si512(u, _mm512_set1_epi32(int32_t(0xfff00000u)));
  const __m512 sub =
      _mm512_sub_ps(_mm512_add_ps(a, _mm512_set1_ps(16384.0f)), _mm512_set1_ps(16384.0f));
  const __mmask16 small = _mm512_cmp_ps_mask(a, _mm512_set1_ps(0x1p-6f), _CMP_LT_OQ);
  const __m512i m = _mm512_mask_mov_epi32(u, small, _mm512_castps_si512(sub));
  return _mm512_castsi512_ps(_mm512_or_si512(m, sign));
}

void quantize(const float* x, int64_t ldx, int64_t n, int64_t K, float* xq, uint16_t* xqb) {
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
      const __m512 sg = _mm512_set1_ps(sigma);
      const __m512 lo = _mm512_set1_ps(-448.0f), hi = _mm512_set1_ps(448.0f);
      const __m512 vi = _mm512_set1_ps(inv);
      for (int h = 0; h < 2; ++h) {
        __m512 v = _mm512_mul_ps(h ? x1 : x0, vi);
        v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
        const __m512 r = _mm512_mul_ps(round_e4m3(v), sg);  // exact: σ is a power of two
        _mm512_storeu_ps(xq + i * K + b * 32 + h * 16, r);
        if (xqb)
          _mm256_storeu_si256(reinterpret_cast<__m256i*>(xqb + i * K + b * 32 + h * 16),
                              _mm512_cvtepi32_epi16(_mm512_srli_epi32(_mm512_castps_si512(r), 16)));
      }
    }
  }
}

bool to_bf16(const float* x, int64_t ldx, int64_t n, int64_t K, uint16_t* xb) {
  __mmask16 bad = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < K; k += 16) {  // K is a multiple of 32
      const __m512i u = _mm512_loadu_si512(x + i * ldx + k);
      const __m512i e = _mm512_and_si512(_mm512_srli_epi32(u, 23), _mm512_set1_epi32(0xff));
      const __mmask16 zero = _mm512_testn_epi32_mask(u, _mm512_set1_epi32(0x7fffffff));
      const __mmask16 in_range = _mm512_cmpge_epi32_mask(e, _mm512_set1_epi32(127 - 56)) &
                                 _mm512_cmple_epi32_mask(e, _mm512_set1_epi32(254));
      const __mmask16 low = _mm512_test_epi32_mask(u, _mm512_set1_epi32(0xffff));
      bad |= __mmask16(low | ~(zero | in_range));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(xb + i * K + k),
                          _mm512_cvtepi32_epi16(_mm512_srli_epi32(u, 16)));
    }
  return bad == 0;
}

}  // namespace

const Kernels& avx512_kernels() {
  static const Kernels k{quantize, to_bf16, gemv, gemm, gemm_scratch_bytes, true};
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
  auto widen = [](uint16_t h) {
    const uint32_t u = uint32_t(h) << 16;
    float v;
    std::memcpy(&v, &u, 4);
    return v;
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
      const uint32_t u =
          uint32_t((r & 0x80000000u) | ((100 + (r >> 32) % 60) << 23) | ((r >> 8) & 0x7fffff));
      std::memcpy(&acc[l], &u, 4);
    }
    const __m512 res =
        _mm512_dpbf16_ps(_mm512_load_ps(acc), reinterpret_cast<__m512bh>(_mm512_load_si512(a)),
                         reinterpret_cast<__m512bh>(_mm512_load_si512(b)));
    _mm512_store_ps(out, res);
    for (int l = 0; l < 16; ++l) {
      const __m128 s1 = _mm_fmadd_ss(_mm_set_ss(widen(a[2 * l + 1])),
                                     _mm_set_ss(widen(b[2 * l + 1])), _mm_set_ss(acc[l]));
      const __m128 s0 = _mm_fmadd_ss(_mm_set_ss(widen(a[2 * l])), _mm_set_ss(widen(b[2 * l])), s1);
      const float want = _mm_cvtss_f32(s0);
      if (std::memcmp(&want, &out[l], 4) != 0) return false;
    }
  }
  return true;
}

}  // namespace deepinfer::linear_isa
