// Vector linear kernels (see kernels/linear.h for the tile layout and kernels/reduce.h for the
// order every path reproduces), written once for AVX-512 (a tile of 16 outputs is one vector) and
// AVX2 (two vectors, `h` = which half).
//
//   GEMV  one pass over a tile's contiguous values for up to 8 rows (AVX2: 4; AMX tiles: 64),
//         software-prefetched into L2.
//         AMX (fp8, fp4, bf16 weights; inputs as bf16): each block decoded into bf16 pairs times
//         its scale and multiplied by the tiles for all rows at once (gemv_amx).
//         Dense inputs (or codes without bf16 or integer products): weights decoded to fp32
//         lanes and fused multiply-adds in the two chains; with 2-4 rows (AVX-512) two tiles
//         per pass, so that each broadcast input feeds two FMAs.
//         AVX-512 with quantized inputs: vdpbf16ps over the codes (exact products) against bf16
//         weight pairs regrouped into the chains, or for fp4 weights integer products (vpdpbusd
//         over the bytes of 16-bit inputs) in every block whose inputs are integers times a power
//         of two; several blocks in flight so the chains overlap, their partials joining the
//         total in block order.
//   GEMM  per task a panel of 3 tiles (48 outputs): chunks of inputs are decoded once into bf16
//         pairs (AVX-512: AMX tiles or vdpbf16ps) or fp32, then every group of rows runs over the
//         chunk; block partials are scaled into an fp32 accumulator tile.
//
// Decoding: AVX-512 turns e4m3 bytes into bf16 through two 128-entry byte tables (vpermi2b,
// AVX512_VBMI) and e2m1 nibbles through a 16-entry word table (vpermw); AVX2 places the e4m3 bits
// into an fp32 2^120 too small and scales back, and looks e2m1 magnitudes up in an 8-entry table.
#include <array>
#include <cstring>
#include <utility>

#include "kernels/isa.h"
#include "kernels/simd.h"

namespace deepinfer::linear_isa {

namespace {

using namespace simd::DI_SIMD_NS;

constexpr int kH = 16 / kLanes;  // vectors per tile of 16 outputs

// The packed formats (Fp8Row weights are never packed).
using enum WeightFormat;

inline int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

// A vector of weights loaded once into a register. GCC otherwise folds the load into each
// instruction that reads the value, or loads it again for one that overwrites it (vpermi2b: three
// loads per fp8 line), and one core's fp8 GEMV streamed 11.7 GB/s from DRAM so, 14.8 with one load
// per line (docs/benchmarks.md).
inline I load_line(const void* p) {
  I v = loadui(p);
  asm("" : "+v"(v));
  return v;
}

// --- decoding (ISA-specific) ---

#if defined(__AVX512F__)

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
// The same tables times 2^(s-127) for each e8m0 code s, for the AMX kernels, whose weights are
// packed times their block scale: row s holds the high bytes (two vectors), then the low bytes,
// of e4m3_bf16(m) with s - 127 added to its exponent (m = 0 stays 0). For the codes the tiles
// take (PackedWeight::foldable_scales) every value stays a normal bf16, so this is exactly the
// exponent step the fp4 blocks take per vector, paid once per table instead of on every line.
struct Fp8ScaledTables {
  uint8_t t[256][256];
};
constexpr Fp8ScaledTables make_fp8_scaled_tables() {
  Fp8ScaledTables t{};
  for (int s = 0; s < 256; ++s)
    for (int m = 0; m < 128; ++m) {
      const uint16_t v = uint16_t(e4m3_bf16(m) + (m != 0 ? (s - 127) * 128 : 0));
      t.t[s][m] = uint8_t(v >> 8);
      t.t[s][128 + m] = uint8_t(v & 0xff);
    }
  return t;
}
alignas(64) constexpr Fp8ScaledTables kFp8Scaled = make_fp8_scaled_tables();
// e2m1 nibble -> bf16, twice over: vpermw reads 5 index bits, and bit 4 (the next nibble's low
// bit) must not matter.
alignas(64) constexpr uint16_t kE2m1Bf16[32] = {
    0x0000, 0x3f00, 0x3f80, 0x3fc0, 0x4000, 0x4040, 0x4080, 0x40c0, 0x8000, 0xbf00, 0xbf80,
    0xbfc0, 0xc000, 0xc040, 0xc080, 0xc0c0, 0x0000, 0x3f00, 0x3f80, 0x3fc0, 0x4000, 0x4040,
    0x4080, 0x40c0, 0x8000, 0xbf00, 0xbf80, 0xbfc0, 0xc000, 0xc040, 0xc080, 0xc0c0};

// e2m1 nibble -> twice its value plus 12, an unsigned byte in [0, 24], four times over (vpermb
// reads 6 index bits; the two above the nibble must not matter): the weights of the integer
// products (vpdpbusd).
constexpr std::array<uint8_t, 64> make_e2m1_u8() {
  constexpr int8_t kTwice[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
  std::array<uint8_t, 64> t{};
  for (int i = 0; i < 64; ++i) t[size_t(i)] = uint8_t(kTwice[i & 15] + 12);
  return t;
}
alignas(64) constexpr std::array<uint8_t, 64> kE2m1U8 = make_e2m1_u8();

struct Luts {
  __m512i h0, h1, l0, l1, e2m1, e2m1u8;
};
inline Luts make_luts() {
  return {_mm512_load_si512(kFp8Tables.hi), _mm512_load_si512(kFp8Tables.hi + 64),
          _mm512_load_si512(kFp8Tables.lo), _mm512_load_si512(kFp8Tables.lo + 64),
          _mm512_load_si512(kE2m1Bf16),     _mm512_load_si512(kE2m1U8.data())};
}
// L with the fp8 tables times the block scale of code s (kFp8Scaled).
inline Luts scaled_luts(const Luts& L, uint8_t s) {
  const uint8_t* t = kFp8Scaled.t[s];
  return {_mm512_load_si512(t),
          _mm512_load_si512(t + 64),
          _mm512_load_si512(t + 128),
          _mm512_load_si512(t + 192),
          L.e2m1,
          L.e2m1u8};
}

// vpshufb indices that put an fp8 group's bytes back from kFp8LaneOrder (isa.h) into the plain
// interleave, lane by lane.
constexpr std::array<uint8_t, 64> make_fp8_plain() {
  std::array<uint8_t, 64> t{};
  for (int i = 0; i < 64; ++i) t[size_t(i)] = uint8_t(fp8_lane_of(i % 16));
  return t;
}
alignas(64) constexpr std::array<uint8_t, 64> kFp8Plain = make_fp8_plain();

// Input pairs 2g and 2g+1 (inputs 4g .. 4g+3) of a tile as bf16 pairs: one vector holds the 16
// outputs for two consecutive inputs, the even input in the low half of each 32-bit lane, exactly
// what vdpbf16ps multiplies with a broadcast pair of activations.
template <WeightFormat Fm>
inline void decode_pairs(const uint8_t* tile, int64_t g, const Luts& L, I& p0, I& p1) {
  if constexpr (Fm == Fp8Block) {
    // The plain interleave back from the tile's lane order (isa.h's kFp8LaneOrder), so that the
    // in-lane byte unpacks below put the pairs in order.
    const I b = _mm512_shuffle_epi8(load_line(tile + g * 64), _mm512_load_si512(kFp8Plain.data()));
    I hi = _mm512_permutex2var_epi8(L.h0, b, L.h1);
    hi = _mm512_ternarylogic_epi32(hi, b, _mm512_set1_epi8(char(0x80)), 0xF8);  // | sign
    const I lo = _mm512_permutex2var_epi8(L.l0, b, L.l1);
    p0 = _mm512_unpacklo_epi8(lo, hi);
    p1 = _mm512_unpackhi_epi8(lo, hi);
  } else if constexpr (Fm == Fp4Row) {
    // Through the word table: word 2o + s of the 8-input group holds row o's inputs 2j + s in
    // nibble j, so pairs 2g and 2g + 1 are nibbles 0 and 1 (g even) or 2 and 3 (g odd).
    I d = load_line(tile + (g / 2) * 64);
    if (g & 1) d = _mm512_srli_epi16(d, 8);
    p0 = _mm512_permutexvar_epi16(d, L.e2m1);
    p1 = _mm512_permutexvar_epi16(_mm512_srli_epi16(d, 4), L.e2m1);
  } else {
    p0 = load_line(tile + g * 128);
    p1 = load_line(tile + g * 128 + 64);
  }
}

// Weights of inputs 4g .. 4g+3 as fp32 lanes (h = 0: the whole tile).
template <WeightFormat Fm>
inline void decode4(const uint8_t* tile, int64_t g, int /*h*/, const Luts& L, F* w) {
  I p[2];
  decode_pairs<Fm>(tile, g, L, p[0], p[1]);
#pragma GCC unroll 2
  for (int s = 0; s < 2; ++s) {
    w[2 * s] = floats(slli<16>(p[s]));
    w[2 * s + 1] = floats(p[s] & set1i(int32_t(0xffff0000u)));
  }
}

// The inputs of vdpbf16ps, which adds a lane's odd (high) product first, go in the chains'
// pairs (x[4g+2], x[4g]) for the even chain, (x[4g+3], x[4g+1]) for the odd one (reduce.h;
// simd.h's chain_order_words); the weights' pairs (decode_pairs's p0 = (w[4g], w[4g+1]),
// p1 = (w[4g+2], w[4g+3])) likewise: decode_chains below.

// The index vectors of decode_chains.
struct ChainTables {
  uint64_t fp4[2][2][8];  // [g odd][odd chain]: vpmultishiftqb controls
  int16_t bf16[2][32];    // [odd chain]: word indices into (p0, p1)
};
constexpr ChainTables make_chain_tables() {
  ChainTables c{};
  // fp4: lane o of a group's 64 bytes holds row o's inputs 2j (low word) and 2j + 1 (high word)
  // in nibbles j; each index word's low byte takes the nibble at bit `lo` (the later input of
  // the step) or, for the high word, at bit `hi` (vpermw reads 5 bits: the 5th must not matter).
  constexpr int kOff[2][2][2] = {{{4, 0}, {20, 16}}, {{12, 8}, {28, 24}}};  // [g odd][chain][lo,hi]
  for (int p = 0; p < 2; ++p)
    for (int ch = 0; ch < 2; ++ch) {
      const uint64_t lo = uint64_t(kOff[p][ch][0]), hi = uint64_t(kOff[p][ch][1]);
      const uint64_t q = lo | lo << 8 | hi << 16 | hi << 24 | (lo + 32) << 32 | (lo + 32) << 40 |
                         (hi + 32) << 48 | (hi + 32) << 56;
      for (int i = 0; i < 8; ++i) c.fp4[p][ch][i] = q;
    }
  // bf16: even = (p1's w2, p0's w0), odd = (p1's w3, p0's w1) per output.
  for (int w = 0; w < 16; ++w)
    for (int ch = 0; ch < 2; ++ch) {
      c.bf16[ch][2 * w] = int16_t(32 + 2 * w + ch);
      c.bf16[ch][2 * w + 1] = int16_t(2 * w + ch);
    }
  return c;
}
alignas(64) constexpr ChainTables kChain = make_chain_tables();

// The chains' pairs of inputs 4g .. 4g+3 (even = (w[4g+2], w[4g]), odd = (w[4g+3], w[4g+1]) per
// output) straight from the tile (fp4: one multishift picks each index word's nibble, fp8: one
// in-lane byte shuffle before the lookups, bf16: one two-source word permute per chain).
template <WeightFormat Fm>
inline void decode_chains(const uint8_t* tile, int64_t g, const Luts& L, I& even, I& odd) {
  auto idx = [](const void* p) { return _mm512_load_si512(p); };
  if constexpr (Fm == Fp4Row) {
    const I d = load_line(tile + (g / 2) * 64);
    even = _mm512_permutexvar_epi16(_mm512_multishift_epi64_epi8(idx(kChain.fp4[g & 1][0]), d),
                                    L.e2m1);
    odd = _mm512_permutexvar_epi16(_mm512_multishift_epi64_epi8(idx(kChain.fp4[g & 1][1]), d),
                                   L.e2m1);
  } else if constexpr (Fm == Fp8Block) {
    const I b = load_line(tile + g * 64);  // (stored in this order: kFp8LaneOrder)
    I hi = _mm512_permutex2var_epi8(L.h0, b, L.h1);
    hi = _mm512_ternarylogic_epi32(hi, b, _mm512_set1_epi8(char(0x80)), 0xF8);  // | sign
    const I lo = _mm512_permutex2var_epi8(L.l0, b, L.l1);
    even = _mm512_unpacklo_epi8(lo, hi);
    odd = _mm512_unpackhi_epi8(lo, hi);
  } else {
    const I p0 = load_line(tile + g * 128), p1 = load_line(tile + g * 128 + 64);
    even = _mm512_permutex2var_epi16(p0, idx(kChain.bf16[0]), p1);
    odd = _mm512_permutex2var_epi16(p0, idx(kChain.bf16[1]), p1);
  }
}

#else  // AVX2

struct Luts {};
inline Luts make_luts() {
  return {};
}

// e4m3 (the low 8 bytes of v) -> fp32, exact (subnormals included; the NaN codes decode as
// ±480, which no checkpoint stores): the magnitude bits placed as an fp32 2^120 times too small,
// then scaled back.
inline F fp8x8(__m128i v) {
  const I u = _mm256_srai_epi32(slli<24>(_mm256_cvtepu8_epi32(v)), 4);
  return floats(u & set1i(int32_t(0x87f00000u))) * set1(0x1p120f);
}

// Nibbles (bits 0..3 of each lane; higher bits are ignored) -> e2m1 values: magnitude from an
// 8-entry table, bit 3 = sign.
inline F e2m1x8(I d) {
  const F lut = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
  const F mag = _mm256_permutevar8x32_ps(lut, d);
  const I sign = slli<28>(d) & set1i(int32_t(0x80000000u));
  return _mm256_or_ps(mag, floats(sign));
}

// vpshufb indices of run r of a lane in the plain interleave, from the tile's lane order: the
// even input's 4 bytes (rows in order), then the odd input's, then zeros.
constexpr std::array<std::array<uint8_t, 16>, 2> make_fp8_run_bytes() {
  std::array<std::array<uint8_t, 16>, 2> t{};
  for (int r = 0; r < 2; ++r)
    for (int q = 0; q < 16; ++q)
      t[size_t(r)][size_t(q)] =
          q >= 8 ? 0x80 : uint8_t(fp8_lane_of(8 * r + (q < 4 ? 2 * q : 2 * (q - 4) + 1)));
  return t;
}
alignas(16) constexpr std::array<std::array<uint8_t, 16>, 2> kFp8RunBytes = make_fp8_run_bytes();

// Weights of inputs k0 (even) and k0 + 1 for half h (rows 8h..8h+7) of an fp8 or fp4 tile.
template <WeightFormat Fm>
inline void load_pair(const uint8_t* tile, int64_t k0, int h, F& w0, F& w1) {
  if constexpr (Fm == Fp8Block) {
    // Pair (k0, k0+1) of group k0/4: in the plain interleave an 8-byte run of (even, odd) bytes
    // in lane 2h (rows 8h..8h+3) and one in lane 2h+1 (rows 8h+4..8h+7), run (k0/2) & 1 of each;
    // each lane's shuffle takes its run from the tile's lane order (isa.h's kFp8LaneOrder), the
    // even input's bytes first, and the lanes' halves interleave into (even rows, odd rows).
    const uint8_t* c = tile + (k0 / 4) * 64 + 32 * h;
    const __m128i m =
        _mm_load_si128(reinterpret_cast<const __m128i*>(kFp8RunBytes[(k0 / 2) & 1].data()));
    const __m128i a = _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)), m);
    const __m128i b =
        _mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + 16)), m);
    const __m128i eo = _mm_unpacklo_epi32(a, b);  // even: rows 8h..8h+7; odd: the same
    w0 = fp8x8(eo);
    w1 = fp8x8(_mm_unpackhi_epi64(eo, eo));
  } else {
    // Words 16h..16h+15 of group k0/8 alternate inputs k0 and k0+1 of rows 8h..8h+7, in
    // nibble (k0 % 8) / 2 of each word.
    I v = load_line(tile + (k0 / 8) * 64 + 32 * h);
    v = _mm256_srl_epi16(v, _mm_cvtsi32_si128(int(4 * ((k0 % 8) / 2))));
    w0 = e2m1x8(v);
    w1 = e2m1x8(srli<16>(v));
  }
}

template <WeightFormat Fm>
inline void decode4(const uint8_t* tile, int64_t g, int h, const Luts&, F* w) {
  if constexpr (Fm == BF16) {
    // (even, odd) bf16 pairs per row: the even input is the low half of each 32-bit lane.
#pragma GCC unroll 2
    for (int s = 0; s < 2; ++s) {
      const I d = load_line(tile + g * 128 + s * 64 + h * 32);
      w[2 * s] = floats(slli<16>(d));
      w[2 * s + 1] = floats(d & set1i(int32_t(0xffff0000u)));
    }
  } else {
    load_pair<Fm>(tile, 4 * g, h, w[0], w[1]);
    load_pair<Fm>(tile, 4 * g + 2, h, w[2], w[3]);
  }
}

#endif

// Weights of inputs 4g .. 4g+3 for half h as fp32 lanes, any format.
template <WeightFormat Fm>
inline void decode_group(const uint8_t* tile, int64_t g, int h, const Luts& L, F* w) {
  if constexpr (Fm == F32) {
    const float* f = reinterpret_cast<const float*>(tile) + g * 64 + h * kLanes;
#pragma GCC unroll 4
    for (int q = 0; q < 4; ++q) w[q] = floats(load_line(f + q * 16));
  } else {
    decode4<Fm>(tile, g, h, L, w);
  }
}

// The weight scale of tile t, block b, per lane of half h.
template <WeightFormat Fm>
inline F block_wscale(const PackedWeight& w, int64_t t, int64_t b, int h) {
  if constexpr (Fm == Fp8Block)
    return set1(e8m0(w.scale[(t / 2) * w.scale_cols + b]));
  else if constexpr (Fm == Fp4Row)
    return e8m0_lanes(load_u8(w.scale + (t * (w.cols / 32) + b) * 16 + h * kLanes));
  else
    return set1(1.0f);
}

// Software prefetch into L2 (T1), 8 KiB ahead: the hardware prefetchers alone leave the GEMVs at
// a third of the read bandwidth here, prefetching into L1 (T0) holds L1 miss buffers and
// reached about two thirds of what T1 reaches (A/B in docs/benchmarks.md).
constexpr int64_t kPrefetchAhead = 8192;
DI_VEC void prefetch_l2(const uint8_t* p, int64_t bytes) {
  for (int64_t o = 0; o < bytes; o += 64)
    _mm_prefetch(reinterpret_cast<const char*>(p + o), _MM_HINT_T1);
}

// Bytes of one group of 4 inputs (16 outputs) of a tile.
template <WeightFormat Fm>
constexpr int64_t kGroupBytes = Fm == F32        ? 256
                                : Fm == BF16     ? 128
                                : Fm == Fp8Block ? 64
                                                 : 32;

#if defined(__AVX512F__)
// What multiplying a lane's bf16 pair by the scale of fp4 tile t's block b (one per output)
// adds to both values' bits (when they are not zero and stay normal:
// PackedWeight::foldable_scales): the scale's exponent in bits 7 and up of each half.
inline I exponent_step(const PackedWeight& w, int64_t t, int64_t b) {
  const I code = _mm512_cvtepu8_epi32(
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(w.scale + (t * (w.cols / 32) + b) * 16)));
  const I e = slli<7>(_mm512_sub_epi32(code, set1i(127)));
  return _mm512_or_si512(e & set1i(0xffff), slli<16>(e));
}
// The e8m0 code of fp8 tile t's block b (one per 32 outputs and 32 inputs: kFp8Scaled's row).
inline uint8_t fp8_scale(const PackedWeight& w, int64_t t, int64_t b) {
  return w.scale[(t / 2) * w.scale_cols + b];
}
#endif

// The GEMVs prefetch each line a window ahead as they load it, one prefetch between the loads:
// with a block run's prefetches in one burst (likely waiting on the line-fill buffers) one core
// streamed 10.7 GB/s, interleaved it streams 15 (of a 16.7 GB/s read; docs/benchmarks.md).
// Each line is also fetched into L1 2 KiB ahead, from L2 by then, so that the loads do not wait
// on L2 while the decode keeps the core busy: 1-row GEMVs (`bench linear`, alternated with the
// build before) 2-6 % nearer the read limit, fp4 and fp8 alike.
constexpr int64_t kL1Ahead = 2048;
// (Inlined always: GCC takes a function of prefetches alone for one without side effects and
// drops the calls to it that it has not inlined; the AMX GEMV of bf16 weights lost all its
// prefetches so.)
template <WeightFormat Fm>
DI_VEC void prefetch_group(const uint8_t* tile, int64_t gi, int64_t ahead = kPrefetchAhead) {
  constexpr int64_t gb = kGroupBytes<Fm>;
  if (gi * gb % 64) return;  // the line began in the group before
#pragma GCC unroll 4
  for (int64_t o = 0; o < gb; o += 64) {
    _mm_prefetch(reinterpret_cast<const char*>(tile + gi * gb + o + ahead), _MM_HINT_T1);
    _mm_prefetch(reinterpret_cast<const char*>(tile + gi * gb + o + kL1Ahead), _MM_HINT_T0);
  }
}

// v rounded to bf16 as round_bf16_inplace rounds (a NaN stays a NaN, quieted and truncated).
inline F rounded(F v) {
  const I u = bits(v), mag = u & set1i(0x7fffffff);
  const F q = floats((u & set1i(int32_t(0xffff0000u))) | set1i(0x00400000));
#if defined(__AVX512F__)
  return _mm512_mask_mov_ps(round_bf16(v), _mm512_cmpgt_epi32_mask(mag, set1i(0x7f800000)), q);
#else
  return _mm256_blendv_ps(round_bf16(v), q,
                          _mm256_castsi256_ps(_mm256_cmpgt_epi32(mag, set1i(0x7f800000))));
#endif
}

// Writes the 16 outputs v[16] of tile t of row r where lo <= o < hi (rounded to bf16 when the
// job asks: each output is written once, as its task ends).
inline void store_tile(const Job& j, int64_t r, int64_t t, const float* v) {
  float* yr = j.y + r * j.ldy;
  const int64_t o0 = t * 16;
  if (o0 >= j.lo && o0 + 16 <= j.hi) {
#pragma GCC unroll 2
    for (int h = 0; h < kH; ++h) {
      const F x = loadu(v + h * kLanes);
      storeu(yr + (o0 - j.lo) + h * kLanes, j.round_bf16 ? rounded(x) : x);
    }
    return;
  }
  alignas(64) float rv[16];
  if (j.round_bf16) {
#pragma GCC unroll 2
    for (int h = 0; h < kH; ++h) store(rv + h * kLanes, rounded(loadu(v + h * kLanes)));
    v = rv;
  }
  for (int64_t l = 0; l < 16; ++l)
    if (o0 + l >= j.lo && o0 + l < j.hi) yr[o0 + l - j.lo] = v[l];
}

// Adds block partials p (of blocks b0 .. b0+NB-1) into the totals, in block order.
template <WeightFormat Fm, int NR, int NB>
inline void add_partials(const Job& j, int64_t t, int64_t b0, int h, F (&p)[NB][NR], F* acc) {
#pragma GCC unroll 16
  for (int bb = 0; bb < NB; ++bb) {
    const F ws = block_wscale<Fm>(*j.w, t, b0 + bb, h);
    // (Unscaled formats add: the same value as a multiply-add by 1, off the products' pipe;
    // a batch of 16's head, eight rows a group, runs 8 products per line of weights.)
#pragma GCC unroll 16
    for (int r = 0; r < NR; ++r)
      acc[r] = Fm == BF16 || Fm == F32 ? acc[r] + p[bb][r] : fmadd(p[bb][r], ws, acc[r]);
  }
}

// --- GEMV ---

#if defined(__AVX512F__)
// The canonical partial of block b of row r of an fp4 tile in fp32 FMAs, as gemv_blocks's Mode 1
// computes it: for a row whose block is not integers (Job::xs 0) in the integer products below.
[[gnu::noinline]] F fma_partial(const Job& j, const uint8_t* tile, int64_t b, int r,
                                const Luts& L) {
  const float* xr = j.x + r * j.ldx + b * 32;
  F e = zero(), o = zero();
  for (int g = 0; g < 8; ++g) {
    F w[4];
    decode_group<Fp4Row>(tile, b * 8 + g, 0, L, w);
    e = fmadd(set1(xr[4 * g]), w[0], e);
    o = fmadd(set1(xr[4 * g + 1]), w[1], o);
    e = fmadd(set1(xr[4 * g + 2]), w[2], e);
    o = fmadd(set1(xr[4 * g + 3]), w[3], o);
  }
  return e + o;
}

// acc += the byte products of w with the 4 bytes at p in every lane (vpdpbusd with the bytes as
// an embedded broadcast: GCC loads them into a register first, a load and a register a use).
DI_VEC void dpbusd_bcast(I& acc, I w, const int8_t* p) {
  asm("vpdpbusd %2%{1to16%}, %1, %0"
      : "+v"(acc)
      : "v"(w), "m"(*reinterpret_cast<const int32_t*>(p)));
}

// Mode 3 (fp4 weights, quantized inputs whose blocks are integers: isa.h's Job::xi): the
// integers A_k of a block, split into bytes A = 256·H + L (H, L signed, |H| <= 120), times the
// weights as unsigned bytes w' = 2·e2m1 + 12 in [0, 24] (vpdpbusd, 4 products per lane). The
// block sum S = Σ A_k·2w_k = 256·Σ w'H + Σ w'L − 12·Σ A_k is exact in int32 and below 2^24, so
// S · 2^(E-1) is exactly the block partial of the canonical order (none of whose fp32 partial
// sums rounds, all being multiples of 2^(E-1) below 2^(E+23)). One 64-byte group of a tile
// (8 inputs of 16 outputs) decodes into two byte vectors: a lane's low nibbles are its inputs
// (0, 4, 1, 5) and its high nibbles (2, 6, 3, 7); int_codes lays the H and L bytes out so.
template <int NR, int NB>
inline void gemv_blocks_int(const Job& j, const uint8_t* tile, int64_t t, int64_t b0, const Luts& L,
                            F* acc) {
  const int8_t* xr[NR];
  const int64_t nb = j.w->cols / 32;
#pragma GCC unroll 16
  for (int r = 0; r < NR; ++r) xr[r] = j.xi + (r * nb + b0) * 64;
  const uint8_t* src = tile + b0 * 256;  // a block's 32 inputs: 4 groups of 8, 64 bytes each
  I ph[NB][NR], pl[NB][NR];
#pragma GCC unroll 16
  for (int bb = 0; bb < NB; ++bb)
#pragma GCC unroll 16
    for (int r = 0; r < NR; ++r) {
      ph[bb][r] = _mm512_setzero_si512();
      pl[bb][r] = set1i(j.xc[r * nb + b0 + bb]);
    }
  for (int g8 = 0; g8 < 4; ++g8) {
#pragma GCC unroll 16
    for (int bb = 0; bb < NB; ++bb) {
      const I d = load_line(src + bb * 256 + g8 * 64);
      prefetch_group<Fp4Row>(src, bb * 8 + g8 * 2);
      // The high nibbles by a word shift (vpermb reads 6 index bits, the table repeats every
      // 16): on the adders' pipes, where vpmultishiftqb took a slot of the products' pipes.
      const I w[2] = {_mm512_permutexvar_epi8(d, L.e2m1u8),
                      _mm512_permutexvar_epi8(_mm512_srli_epi16(d, 4), L.e2m1u8)};
#pragma GCC unroll 16
      for (int r = 0; r < NR; ++r) {
        const int8_t* a = xr[r] + bb * 64 + g8 * 16;  // H (0,4,1,5), H (2,6,3,7), L, L
#pragma GCC unroll 2
        for (int q = 0; q < 2; ++q) {
          dpbusd_bcast(ph[bb][r], w[q], a + 4 * q);
          dpbusd_bcast(pl[bb][r], w[q], a + 8 + 4 * q);
        }
      }
    }
  }
  // Each block's total: acc += S · (2^(E-1) · ws) in one FMA, the product of the two powers of two
  // made by adding exponents (an integer add off the products' pipes, where a multiply by 2^(E-1)
  // took a slot). Exact as acc += (S · 2^(E-1)) · ws is, when 2^(E-1) · ws is a normal number:
  // the weight's scales lie in [2^-86, 2^100] (foldable_scales) and 2^(E-1) >= 2^-40 (activations
  // below: the multiply, and blocks not integers: fma_partial).
  const bool fuse = j.w->foldable_scales;
  const int32_t* xs_bits = reinterpret_cast<const int32_t*>(j.xs);
#pragma GCC unroll 16
  for (int bb = 0; bb < NB; ++bb) {
    const I step =
        slli<23>(_mm512_sub_epi32(load_u8(j.w->scale + (t * nb + b0 + bb) * 16), set1i(127)));
#pragma GCC unroll 16
    for (int r = 0; r < NR; ++r) {
      const int64_t at = r * nb + b0 + bb;
      const F S = _mm512_cvtepi32_ps(addi(slli<8>(ph[bb][r]), pl[bb][r]));
      if (fuse && j.xs[at] >= 0x1p-40f) {
        acc[r] = fmadd(S, floats(addi(step, set1i(xs_bits[at]))), acc[r]);
        continue;
      }
      const F part = j.xs[at] != 0.0f ? S * set1(j.xs[at]) : fma_partial(j, tile, b0 + bb, r, L);
      acc[r] = fmadd(part, block_wscale<Fp4Row>(*j.w, t, b0 + bb, 0), acc[r]);
    }
  }
}
#endif

// Mode: 0 bf16 products (AVX-512: bf16 codes times bf16 pairs), 1 fp32 fused multiply-adds,
// each in the two chains of reduce.h, 3 integer products (AVX-512, fp4: gemv_blocks_int above):
// blocks b0 .. b0+NB-1 of tile t.
template <WeightFormat Fm, int Mode, int NR, int NB>
inline void gemv_blocks(const Job& j, const uint8_t* tile, int64_t t, int64_t b0, int h,
                        const Luts& L, F* acc) {
#if defined(__AVX512F__)
  if constexpr (Mode == 3) return gemv_blocks_int<NR, NB>(j, tile, t, b0, L, acc);
#endif
  F pe[NB][NR] = {}, po[NB][NR] = {};
#if defined(__AVX512F__)
  // Mode 0: each row's blocks are in the chains' order (Job::xb): one 32-bit word a step.
  [[maybe_unused]] const int32_t* xc[Mode == 0 ? NB : 1][Mode == 0 ? NR : 1];
  if constexpr (Mode == 0)
#pragma GCC unroll 16
    for (int bb = 0; bb < NB; ++bb)
#pragma GCC unroll 16
      for (int r = 0; r < NR; ++r)
        xc[bb][r] =
            reinterpret_cast<const int32_t*>(j.xb + r * xb_stride(j.w->cols) + (b0 + bb) * 32);
#endif
#pragma GCC unroll 2
  for (int g = 0; g < 8; ++g) {
#pragma GCC unroll 16
    for (int bb = 0; bb < NB; ++bb) {
      if (h == 0) prefetch_group<Fm>(tile, (b0 + bb) * 8 + g);
#if defined(__AVX512F__)
      if constexpr (Mode == 0) {
        I we, wo;
        decode_chains<Fm>(tile, (b0 + bb) * 8 + g, L, we, wo);
#pragma GCC unroll 16
        for (int r = 0; r < NR; ++r) {
          pe[bb][r] =
              _mm512_dpbf16_ps(pe[bb][r], reinterpret_cast<__m512bh>(we),
                               reinterpret_cast<__m512bh>(_mm512_set1_epi32(xc[bb][r][2 * g])));
          po[bb][r] =
              _mm512_dpbf16_ps(po[bb][r], reinterpret_cast<__m512bh>(wo),
                               reinterpret_cast<__m512bh>(_mm512_set1_epi32(xc[bb][r][2 * g + 1])));
        }
        continue;
      }
#endif
      F w[4];
      decode_group<Fm>(tile, (b0 + bb) * 8 + g, h, L, w);
#pragma GCC unroll 16
      for (int r = 0; r < NR; ++r) {
        const float* xr = j.x + r * j.ldx + (b0 + bb) * 32 + 4 * g;
        pe[bb][r] = fmadd(set1(xr[0]), w[0], pe[bb][r]);
        po[bb][r] = fmadd(set1(xr[1]), w[1], po[bb][r]);
        pe[bb][r] = fmadd(set1(xr[2]), w[2], pe[bb][r]);
        po[bb][r] = fmadd(set1(xr[3]), w[3], po[bb][r]);
      }
    }
  }
#pragma GCC unroll 16
  for (int bb = 0; bb < NB; ++bb)
#pragma GCC unroll 16
    for (int r = 0; r < NR; ++r) pe[bb][r] = pe[bb][r] + po[bb][r];  // p = even + odd
  add_partials<Fm, NR, NB>(j, t, b0, h, pe, acc);
}

// Mode 1 over tiles t and t + 1 at once (AVX-512, several rows): each input, broadcast into a
// register, feeds both tiles' fused multiply-adds. An FMA per broadcast from memory ran at about
// 0.6 of the FMA rate here, and multi-row GEMVs (a verify step's dense layers) are bound by it.
// Each output's order is gemv_blocks's; the totals out[tile][row] stay in memory (L1).
template <WeightFormat Fm, int NR, int NB>
inline void gemv_pair_blocks(const Job& j, const uint8_t* ta, int64_t t, int64_t b0, const Luts& L,
                             float (*out)[NR][16]) {
  const uint8_t* tb = ta + j.w->tile_bytes;
  F p[2][2][NB][NR] = {};  // [tile][chain]
#pragma GCC unroll 2
  for (int g = 0; g < 8; ++g) {
#pragma GCC unroll 16
    for (int bb = 0; bb < NB; ++bb) {
      F wa[4], wb[4];
      // Two streams: each a half window ahead, the same bytes in flight as one stream's.
      prefetch_group<Fm>(ta, (b0 + bb) * 8 + g, kPrefetchAhead / 2);
      prefetch_group<Fm>(tb, (b0 + bb) * 8 + g, kPrefetchAhead / 2);
      decode_group<Fm>(ta, (b0 + bb) * 8 + g, 0, L, wa);
      decode_group<Fm>(tb, (b0 + bb) * 8 + g, 0, L, wb);
#pragma GCC unroll 16
      for (int r = 0; r < NR; ++r) {
        const float* xr = j.x + r * j.ldx + (b0 + bb) * 32 + 4 * g;
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
          F x = set1(xr[k]);
          asm("" : "+v"(x));  // one broadcast into a register, not one per FMA
          p[0][k & 1][bb][r] = fmadd(x, wa[k], p[0][k & 1][bb][r]);
          p[1][k & 1][bb][r] = fmadd(x, wb[k], p[1][k & 1][bb][r]);
        }
      }
    }
  }
#pragma GCC unroll 2
  for (int c = 0; c < 2; ++c)
#pragma GCC unroll 16
    for (int bb = 0; bb < NB; ++bb) {
      const F ws = block_wscale<Fm>(*j.w, t + c, b0 + bb, 0);
#pragma GCC unroll 16
      for (int r = 0; r < NR; ++r)
        store(out[c][r], fmadd(p[c][0][bb][r] + p[c][1][bb][r], ws, load(out[c][r])));
    }
}

// Tiles t and t + 1 of a Mode 1 GEMV (see gemv_pair_blocks).
template <WeightFormat Fm, int NR>
void gemv_tile_pair(const Job& j, int64_t t, const Luts& L) {
  constexpr int NB = 1;  // within the 32 registers: 4·NB·NR partials (NR <= 4), 8 weights
  const int64_t nb = j.w->cols / 32;
  const uint8_t* tile = j.w->data + t * j.w->tile_bytes;
  alignas(64) float out[2][NR][16] = {};
  int64_t b = 0;
  for (; b + NB <= nb; b += NB) gemv_pair_blocks<Fm, NR, NB>(j, tile, t, b, L, out);
  for (; b < nb; ++b) gemv_pair_blocks<Fm, NR, 1>(j, tile, t, b, L, out);
#pragma GCC unroll 2
  for (int c = 0; c < 2; ++c)
#pragma GCC unroll 16
    for (int r = 0; r < NR; ++r) store_tile(j, r, t + c, out[c][r]);
}

// Rows one GEMV call runs against each weight block (Kernels::gemv_rows).
constexpr int kGemvRows = kIsa == Isa::Avx512 ? 8 : 4;

// Blocks in flight per row count, within the vector registers (32 with AVX-512, 16 with AVX2).
// Every mode keeps two partials per block and row (the chains, or Mode 3's bytes). At one row
// 4: with 8 the partials spilled to the stack, and one-row GEMVs read nearer the read limit
// with 4 (alternated three times: fp4 integer products 2-5 % nearer, a bf16 weight as the head's
// 0.81-0.86 -> 0.92-0.99, vdpbf16ps level; 2 slower again).
constexpr int blocks_in_flight(int nr) {
  if constexpr (kIsa == Isa::Avx512) return nr <= 2 ? 4 : nr <= 4 ? 2 : 1;
  return nr == 1 ? 2 : 1;
}

template <WeightFormat Fm, int Mode, int NR>
void gemv_rows(const Job& j) {
  constexpr int NB = blocks_in_flight(NR);
  const int64_t nb = j.w->cols / 32;
  const Luts L = make_luts();
  // The run's first window, which the prefetches below (always a window ahead) never cover.
  prefetch_l2(j.w->data + j.t0 * j.w->tile_bytes,
              min64(kPrefetchAhead, (j.t1 - j.t0) * j.w->tile_bytes));
  for (int64_t t = j.t0; t < j.t1; ++t) {
    if constexpr (kIsa == Isa::Avx512 && Mode == 1 && NR >= 2 && NR <= 4) {
      if (t + 1 < j.t1) {
        gemv_tile_pair<Fm, NR>(j, t++, L);
        continue;
      }
    }
    const uint8_t* tile = j.w->data + t * j.w->tile_bytes;
    alignas(64) float out[NR][16];
#pragma GCC unroll 2
    for (int h = 0; h < kH; ++h) {
      F acc[NR] = {};
      int64_t b = 0;
      // Blocks of one tile are contiguous and tiles follow each other: the loads prefetch a
      // window ahead (prefetch_group), so the decode overlaps the DRAM latency.
      for (; b + NB <= nb; b += NB) gemv_blocks<Fm, Mode, NR, NB>(j, tile, t, b, h, L, acc);
      for (; b < nb; ++b) gemv_blocks<Fm, Mode, NR, 1>(j, tile, t, b, h, L, acc);
#pragma GCC unroll 16
      for (int r = 0; r < NR; ++r) store(out[r] + h * kLanes, acc[r]);
    }
#pragma GCC unroll 16
    for (int r = 0; r < NR; ++r) store_tile(j, r, t, out[r]);
  }
}

template <WeightFormat Fm, int Mode, int... NR>
void gemv_n(const Job& j, std::integer_sequence<int, NR...>) {
  static constexpr void (*kRows[])(const Job&) = {gemv_rows<Fm, Mode, NR + 1>...};
  kRows[(j.n < kGemvRows ? j.n : kGemvRows) - 1](j);
}

#if defined(__AVX512F__)
template <WeightFormat Fm>
void gemv_amx(const Job& j);  // below, with the GEMM's tiles
#endif

template <WeightFormat Fm>
void gemv_fmt(const Job& j) {
  constexpr auto rows = std::make_integer_sequence<int, kGemvRows>();
#if defined(__AVX512F__)
  if constexpr (Fm != F32)
    if (j.amx && j.xb) return gemv_amx<Fm>(j);
  if constexpr (Fm == Fp4Row)
    if (j.xi) return gemv_n<Fm, 3>(j, rows);
  if constexpr (Fm != F32)
    if (j.xb) return gemv_n<Fm, 0>(j, rows);
#endif
  gemv_n<Fm, 1>(j, rows);
}

void gemv(const Job& j) {
  static constexpr void (*kFmt[])(const Job&) = {gemv_fmt<F32>, gemv_fmt<BF16>, gemv_fmt<Fp8Block>,
                                                 gemv_fmt<Fp4Row>};
  kFmt[int(j.w->format)](j);
}

// --- GEMM ---

constexpr bool kBf16Dot = kIsa == Isa::Avx512;
// Rows per micro-kernel call: two chains of partials per row and vector within the registers.
constexpr int kMr = kIsa == Isa::Avx512 ? 4 : 3;
// Accumulator vectors per row in one micro-kernel call: the whole panel with AVX-512, one tile
// (two halves) with AVX2.
constexpr int kCols = kIsa == Isa::Avx512 ? int(kGemmPanelTiles) : 2;
// Inputs per packed chunk: bf16 pairs 24 KiB for 3 tiles (AMX panels of 6: 48 KiB; chunks of 512
// and 1024 inputs, with the accumulator tiles loaded and stored less often, ran 5-20 % slower:
// the inputs of a group of rows no longer stay in L1 for its second 3 tiles), fp32 24 KiB.
constexpr int64_t kKcBf16 = 256;
constexpr int64_t kKcF32 = 128;
constexpr int64_t kKcMax = kBf16Dot ? kKcBf16 : kKcF32;
// Bytes of the packed chunk at most (bf16 pairs of AMX panels; fp32 chunks of 3 tiles fit).
constexpr int64_t kPackBytes = kKcMax / 2 * kAmxPanelTilesMax * 64;
constexpr int64_t kNt = kAmxPanelTilesMax;  // the scratch's room: tiles per panel, at most

struct GemmScratch {
  float* c;    // [n, kNt * 16] accumulators
  uint8_t* b;  // packed chunk: bf16 pairs [kc/2][nt][16] or fp32 [kc][nt][16]
  float* ws;   // [kc/32][nt][16] block scales
};

// (The accumulators have room for 15 rows more: AMX tiles read and write groups of 16 rows.)
int64_t gemm_scratch_bytes(int64_t n, int64_t /*K*/) {
  const int64_t c = (n + 15) * kNt * 16 * 4, b = kPackBytes, ws = kKcMax / 32 * kNt * 64;
  return (c + 63) / 64 * 64 + b + ws;
}

GemmScratch scratch_of(const Job& j) {
  uint8_t* b = j.scratch + ((j.n + 15) * kNt * 16 * 4 + 63) / 64 * 64;
  return {reinterpret_cast<float*>(j.scratch), b, reinterpret_cast<float*>(b + kPackBytes)};
}

// How far ahead of a tile's line the packing of chunk [kc0, kc0 + kc) fetches into L2: the next
// chunk of the same tile while this one decodes (three streams, far apart); during the last
// chunk, the first chunk of the tile nt further on, which the next panel (this thread's next
// task, as a rule) packs first: its loads stalled on memory otherwise (a prefill's experts: a
// quarter of the packing's time), as did the fp4 scales' (pack_chunk).
inline int64_t pack_ahead(const Job& j, int64_t nt, int64_t kc0, int64_t kc) {
  const int64_t K = j.w->cols, in_bytes = j.w->tile_bytes / K;  // per input of a tile
  return kc0 + kc >= K ? nt * j.w->tile_bytes - kc0 * in_bytes : kc * in_bytes;
}

#if defined(__AVX512F__)
// pack_chunk's bf16 pairs: vdpbf16ps's chains (Chains) or the tiles' pairs, each block's weights
// times its scale (Fold: fp8 through scaled tables, fp4 by an exponent step per output) or as
// they are. Branch-free within a block, so that the loads of the lines (from L2 or L3: the
// micro-kernels' operands push them out of L1 between chunks) overlap: the generic loop ran
// some 45 instructions a group and waited on each line.
template <WeightFormat Fm, bool Chains, bool Fold>
void pack_pairs(const Job& j, int64_t nt, int64_t kc0, int64_t kc, uint8_t* const out) {
  const Luts L = make_luts();
  const int64_t ahead = pack_ahead(j, nt, kc0, kc);
  const int64_t step = 2 * nt * 64;  // bytes of the chunk per group: its two pair rows
  for (int64_t t = 0; t < nt; ++t) {
    const uint8_t* const tile = j.w->data + (j.t0 + t) * j.w->tile_bytes;
    uint8_t* d = out + t * 64;
    for (int64_t b = kc0 / 32; b < (kc0 + kc) / 32; ++b) {
      Luts Ls = L;
      I e = _mm512_setzero_si512();
      if constexpr (Fold && Fm == Fp8Block) Ls = scaled_luts(L, fp8_scale(*j.w, j.t0 + t, b));
      if constexpr (Fold && Fm == Fp4Row) e = exponent_step(*j.w, j.t0 + t, b);
#pragma GCC unroll 8
      for (int gg = 0; gg < 8; ++gg) {
        const int64_t g = b * 8 + gg;
        prefetch_group<Fm>(tile, g, ahead);
        I p0, p1;
        if constexpr (Chains)
          decode_chains<Fm>(tile, g, Ls, p0, p1);
        else
          decode_pairs<Fm>(tile, g, Ls, p0, p1);
        if constexpr (Fold && Fm == Fp4Row) {
          p0 = _mm512_mask_add_epi16(p0, _mm512_test_epi16_mask(p0, set1i(0x7fff7fff)), p0, e);
          p1 = _mm512_mask_add_epi16(p1, _mm512_test_epi16_mask(p1, set1i(0x7fff7fff)), p1, e);
        }
        _mm512_store_si512(d, p0);
        _mm512_store_si512(d + nt * 64, p1);
        d += step;
      }
    }
  }
}
#endif

template <WeightFormat Fm>
// A chunk of `nt` tiles' inputs [kc0, kc0 + kc) into s.b and, unless `fold`, its block scales
// into s.ws. Folded (the AMX tiles always, vdpbf16ps where PackedWeight::foldable_scales allows
// it), each block's weights are packed times its scale: a power of two, so the bf16 values stay
// exact and the products' partial is exactly the scaled partial the canonical order adds, and a
// vdpbf16ps block ends in acc + (e + o), two additions, instead of an fma on the products' pipe.
void pack_chunk(const Job& j, int64_t nt, int64_t kc0, int64_t kc, bool bf16, bool fold,
                GemmScratch& s) {
  const int64_t K = j.w->cols;
  const bool last = kc0 + kc >= K;
  bool pairs = false;  // bf16 pairs (else fp32 lanes)
#if defined(__AVX512F__)
  if constexpr (Fm != F32) {
    pairs = bf16;
    if (bf16 && j.amx)  // the tiles' pairs
      pack_pairs<Fm, false, true>(j, nt, kc0, kc, s.b);
    else if (bf16 && fold)  // vdpbf16ps's chains
      pack_pairs<Fm, true, true>(j, nt, kc0, kc, s.b);
    else if (bf16)
      pack_pairs<Fm, true, false>(j, nt, kc0, kc, s.b);
  }
#endif
  if (!pairs) {  // fp32 lanes
    const Luts L = make_luts();
    const int64_t ahead = pack_ahead(j, nt, kc0, kc);
    float* const dst = reinterpret_cast<float*>(s.b);
    for (int64_t t = 0; t < nt; ++t) {
      const uint8_t* tile = j.w->data + (j.t0 + t) * j.w->tile_bytes;
      for (int64_t g = kc0 / 4; g < (kc0 + kc) / 4; ++g) {
        const int64_t k = g * 4 - kc0;
        prefetch_group<Fm>(tile, g, ahead);
#pragma GCC unroll 2
        for (int h = 0; h < kH; ++h) {
          F w[4];
          decode_group<Fm>(tile, g, h, L, w);
#pragma GCC unroll 4
          for (int q = 0; q < 4; ++q) store(dst + ((k + q) * nt + t) * 16 + h * kLanes, w[q]);
        }
      }
    }
  }
  for (int64_t t = 0; t < nt; ++t) {
    for (int64_t b = 0; b < kc / 32; ++b) {
      if constexpr (Fm == Fp4Row)  // (folded or not: the scales' loads stalled a fifth of it)
        _mm_prefetch(reinterpret_cast<const char*>(
                         j.w->scale + (last ? (j.t0 + t + nt) * (K / 32) + b
                                            : (j.t0 + t) * (K / 32) + (kc0 + kc) / 32 + b) *
                                          16),
                     _MM_HINT_T0);
#pragma GCC unroll 2
      for (int h = 0; h < kH && !fold; ++h)  // (folded weights carry their scales)
        store(s.ws + (b * nt + t) * 16 + h * kLanes,
              block_wscale<Fm>(*j.w, j.t0 + t, kc0 / 32 + b, h));
    }
  }
}

// The block partials p[MR][NV] scaled into the accumulators of vector columns [v0, v0 + NV).
template <int MR, int NV>
inline void scale_into(const GemmScratch& s, int64_t i0, int64_t b, int64_t cols, int64_t v0,
                       F (&p)[MR][NV]) {
  F ws[NV];
#pragma GCC unroll 16
  for (int v = 0; v < NV; ++v) ws[v] = load(s.ws + (b * cols + v0 + v) * kLanes);
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    float* c = s.c + (i0 + i) * (kNt * 16) + v0 * kLanes;
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) store(c + v * kLanes, fmadd(p[i][v], ws[v], load(c + v * kLanes)));
  }
}

#if defined(__AVX512F__)
// One pair row kk of a block (bf16 pairs w[NV], the rows' chain-ordered inputs xc): acc += the
// pair products (vdpbf16ps).
template <int MR, int NV>
DI_VEC void dp_step(F (&acc)[MR][NV], const I* w, const int32_t* const* xc, int kk) {
  __m512bh wv[NV];
#pragma GCC unroll 16
  for (int v = 0; v < NV; ++v) wv[v] = reinterpret_cast<__m512bh>(_mm512_load_si512(w + v));
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi32(xc[i][kk]));
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], a, wv[v]);
  }
}
#endif

// Rows i0..i0+MR against vector columns [v0, v0 + NV) of a packed fp32 chunk of `cols` vectors
// per input (Mode 1: dense inputs, or codes when bf16 products are not used), or bf16 codes
// against a chunk of bf16 pairs (the whole panel: cols = NV, v0 = 0), the block scales in s.ws
// (Mode 0) or folded into the weights (Mode 2: pack_chunk's `fold`).
template <int MR, int NV, int Mode>
void micro(const Job& j, int64_t i0, int64_t kc0, int64_t kc, const GemmScratch& s, int64_t cols,
           int64_t v0) {
#if defined(__AVX512F__)
  if constexpr (Mode != 1) {
    // The rows' blocks are in the chains' order (Job::xb), so a step broadcasts one 32-bit word
    // from memory; the even and odd chains' accumulators are named apart, so that they stay in
    // registers (indexed by the step's parity they lived on the stack: a load and a store around
    // every vdpbf16ps).
    const int64_t ldb = xb_stride(j.w->cols);
    const I* wp = reinterpret_cast<const I*>(s.b);
    // (Local copies: a vector store may alias anything, and GCC reloaded s.c after each one,
    // which serialized the accumulators' updates at every block's end: a quarter of the time.)
    float* const cb = s.c + i0 * (kNt * 16);
    const float* const wsb = s.ws;
    F e[MR][NV], o[MR][NV];  // the chains, from +0 in every block
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) e[i][v] = o[i][v] = zero();
    for (int64_t b = 0; b < kc / 32; ++b) {
      const int32_t* xc[MR];
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i)
        xc[i] = reinterpret_cast<const int32_t*>(j.xb + (i0 + i) * ldb + kc0 + b * 32);
#pragma GCC unroll 8
      for (int g = 0; g < 8; ++g) {
        dp_step<MR, NV>(e, wp + (b * 16 + 2 * g) * NV, xc, 2 * g);
        dp_step<MR, NV>(o, wp + (b * 16 + 2 * g + 1) * NV, xc, 2 * g + 1);
      }
      F ws[NV];
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) ws[v] = Mode == 2 ? zero() : load(wsb + (b * NV + v) * kLanes);
#pragma GCC unroll 16
      for (int i = 0; i < MR; ++i) {
        float* c = cb + i * (kNt * 16);
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) {
          const F p = e[i][v] + o[i][v], acc = load(c + v * kLanes);
          store(c + v * kLanes, Mode == 2 ? acc + p : fmadd(p, ws[v], acc));
          zero_in_place(e[i][v]);
          zero_in_place(o[i][v]);
        }
      }
    }
    return;
  }
#endif
  const float* bp = reinterpret_cast<const float*>(s.b) + v0 * kLanes;
  for (int64_t b = 0; b < kc / 32; ++b) {
    F p[2][MR][NV] = {};  // the even and the odd chain
#pragma GCC unroll 2
    for (int kk = 0; kk < 16; ++kk) {
      const int64_t k0 = b * 32 + 2 * kk;
#pragma GCC unroll 2
      for (int odd = 0; odd < 2; ++odd) {
        F w[NV];
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) w[v] = load(bp + ((k0 + odd) * cols + v) * kLanes);
#pragma GCC unroll 16
        for (int i = 0; i < MR; ++i) {
          const F a = set1(j.x[(i0 + i) * j.ldx + kc0 + k0 + odd]);
#pragma GCC unroll 16
          for (int v = 0; v < NV; ++v) p[odd][i][v] = fmadd(a, w[v], p[odd][i][v]);
        }
      }
    }
#pragma GCC unroll 16
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) p[0][i][v] = p[0][i][v] + p[1][i][v];
    scale_into<MR, NV>(s, i0, b, cols, v0, p[0]);
  }
}

using MicroFn = void (*)(const Job&, int64_t, int64_t, int64_t, const GemmScratch&, int64_t,
                         int64_t);

// micro for mr rows and nv vector columns: bf16 products (Mode 0) or fp32 FMAs (Mode 1).
template <int... I>
MicroFn micro_for(bool bf16, [[maybe_unused]] bool folded, int mr, int nv,
                  std::integer_sequence<int, I...>) {
  static constexpr MicroFn kFma[] = {micro<I / kCols + 1, I % kCols + 1, 1>...};
#if defined(__AVX512F__)
  static constexpr MicroFn kBf[] = {micro<I / kCols + 1, I % kCols + 1, 0>...};
  static constexpr MicroFn kFolded[] = {micro<I / kCols + 1, I % kCols + 1, 2>...};
  if (bf16) return (folded ? kFolded : kBf)[(mr - 1) * kCols + nv - 1];
#endif
  return kFma[(mr - 1) * kCols + nv - 1];
}

#if defined(__AVX512F__)
// --- AMX (Job::amx: fp8, fp4 or bf16 weights, inputs as bf16 in Job::xb) ---
// TDPBF16PS of up to 16 rows against one tile's block (16 outputs x 32 inputs as 16 bf16 pair
// rows) adds to each output the block's partial in the linears' canonical order (reduce.h: the
// even and the odd chain, then their sum; amx_is_canonical checks it). With the weights packed
// times their power-of-two block scale, that addition is the canonical acc + p·s itself, so the
// accumulators stay in tile registers.

// The tile registers: 0 and 1 a block of `rows` rows of inputs (rows x 32 bf16), 2 and 3 a tile's
// block of weights (16 pairs x 16 outputs), 4 and 5 accumulators (rows x 16 fp32); 6 and 7
// either two more tiles' blocks of weights or, with `rows` 16, two more accumulators. A task
// configures the tiles itself and releases them at its end, since other code on the thread
// (oneDNN) may use them in between.
}  // namespace

void amx_configure(int rows) {
  struct alignas(64) {
    uint8_t palette = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
  } cfg;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = uint8_t(t == 2 || t == 3 || t == 6 || t == 7 ? 16 : rows);
  }
  // The intrinsic tells the compiler it reads 8 bytes only: make the whole block visible.
  asm volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

namespace {

// The accumulator tiles of G groups of 16 rows (rows i0 .. i0+16G, ldc bytes apart in
// GemmScratch::c) against NT tiles from t0: register 4 + g·NT + t. Zeroed for the first chunk,
// else loaded; stored after the chunk. (The intrinsics take registers as literals.)
template <int G, int NT>
DI_VEC void acc_tiles(float* c, int64_t ldc, bool first, bool store) {
#define DI_ACC_OP(r)           \
  do {                         \
    if (store)                 \
      _tile_stored(r, p, ldc); \
    else if (first)            \
      _tile_zero(r);           \
    else                       \
      _tile_loadd(r, p, ldc);  \
  } while (0)
#pragma GCC unroll 4
  for (int a = 0; a < G * NT; ++a) {
    float* p = c + (a / NT) * 16 * (ldc / 4) + (a % NT) * 16;
    if (a == 0)
      DI_ACC_OP(4);
    else if (a == 1)
      DI_ACC_OP(5);
    else if (a == 2)
      DI_ACC_OP(6);
    else
      DI_ACC_OP(7);
  }
#undef DI_ACC_OP
}

// Rows i0 .. i0+16G (G groups of 16) against NT tiles, from tile t0, of a chunk of `nt` tiles
// packed with their scales folded in (PackedWeight::foldable_scales): the partial tiles are the
// accumulators themselves (acc_tiles), since adding a block's partial times a power of two is
// adding the folded partial. TDPBF16PS adds e + o to the tile: exactly acc + p·s, the canonical
// step. One group (NT <= 3): tile 0 the block of inputs, 2 and 3 the weights. Two groups
// (NT <= 2): tiles 0 and 1 the groups' inputs, 2 and 3 the weights, each weight block feeding
// both groups, so a block costs one tile load per TDPBF16PS where one group against 3 tiles needs
// 4 for 3, and the packed chunk leaves L2 half as often. Rows past the job's last use the room
// after them.
template <int G, int NT>
void micro_amx(const Job& j, int64_t i0, int64_t kc0, int64_t kc, const GemmScratch& s, int64_t t0,
               int64_t nt) {
  const int64_t K = j.w->cols, nb = kc / 32, ldc = kNt * 16 * 4;
  const int64_t ldb = xb_stride(K);
  const uint16_t* xa = j.xb + i0 * ldb + kc0;
  float* c = s.c + i0 * (kNt * 16) + t0 * 16;
  acc_tiles<G, NT>(c, ldc, kc0 == 0, false);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* wb = s.b + (b * 16 * nt + t0) * 64;  // tile t0 + t's pair kk: + (kk·nt + t)·64
    _tile_loadd(0, xa + b * 32, ldb * 2);
    _tile_loadd(2, wb, nt * 64);
    _tile_dpbf16ps(4, 0, 2);
    if constexpr (G == 2) {
      _tile_loadd(1, xa + 16 * ldb + b * 32, ldb * 2);
      if constexpr (NT == 1)
        _tile_dpbf16ps(5, 1, 2);
      else
        _tile_dpbf16ps(6, 1, 2);
      if constexpr (NT > 1) {
        _tile_loadd(3, wb + 64, nt * 64);
        _tile_dpbf16ps(5, 0, 3);
        _tile_dpbf16ps(7, 1, 3);
      }
    } else {
      if constexpr (NT > 1) {
        _tile_loadd(3, wb + 64, nt * 64);
        _tile_dpbf16ps(5, 0, 3);
      }
      if constexpr (NT > 2) {
        _tile_loadd(2, wb + 128, nt * 64);
        _tile_dpbf16ps(6, 0, 2);
      }
    }
  }
  acc_tiles<G, NT>(c, ldc, false, true);
}

// Block weights `wb` into tile register BT (2 or 3: the block's parity) times the inputs `xa` of
// each group G of 16 rows (ldb apart; registers 0 and 1 in turn) into accumulator tile 4 + G, for
// `groups` groups. (The intrinsics take register numbers as literals.)
#define DI_AMX_GROUPS(BT)                     \
  do {                                        \
    _tile_loadd(BT, wb, 64);                  \
    _tile_loadd(0, xa, ldb * 2);              \
    _tile_dpbf16ps(4, 0, BT);                 \
    if (groups > 1) {                         \
      _tile_loadd(1, xa + 16 * ldb, ldb * 2); \
      _tile_dpbf16ps(5, 1, BT);               \
    }                                         \
    if (groups > 2) {                         \
      _tile_loadd(0, xa + 32 * ldb, ldb * 2); \
      _tile_dpbf16ps(6, 0, BT);               \
    }                                         \
    if (groups > 3) {                         \
      _tile_loadd(1, xa + 48 * ldb, ldb * 2); \
      _tile_dpbf16ps(7, 1, BT);               \
    }                                         \
  } while (0)

// A GEMV of up to 64 rows on the tiles: each block decoded once into bf16 pairs times its scale
// (PackedWeight::foldable_scales), then one TDPBF16PS per group of 16 rows into that group's
// accumulator tile, which adds the block exactly as the canonical step does (micro_amx); nothing
// leaves the tiles until the tile of outputs is done. The decode runs two blocks ahead of the
// tiles (a tile load waits for the buffer's stores to reach the cache: one block ahead ran 20 %
// slower in L2). With one group of rows, two tiles of outputs at a time. One-row fp8 GEMVs so:
// 0.74-0.85 of the read bandwidth against 0.75-0.82 with the partials scaled in registers.
template <WeightFormat Fm>
void gemv_amx(const Job& j) {
  const int64_t K = j.w->cols, nb = K / 32, ldb = xb_stride(K);
  const int groups = int((j.n + 15) / 16);
  const Luts L = make_luts();
  alignas(64) uint8_t buf[2][3][1024];  // [tile of a pair][block % 3]
  alignas(64) float out[16][16];
  // One group: its rows only; several: 16 each (the inputs have room after the last row).
  amx_configure(groups == 1 ? int(j.n) : 16);
  prefetch_l2(j.w->data + j.t0 * j.w->tile_bytes,
              min64(kPrefetchAhead, (j.t1 - j.t0) * j.w->tile_bytes));
  // Block b of tile t decoded into wb, times its scale; bf16 weights copied there by vector loads
  // (the tiles reading them in place, each tile load waiting on its lines, read 0.81-0.83 of the
  // read limit at 16 rows, 0.84-0.86 so). (Inlined always, as every prefetching helper.)
  auto decode = [&](int64_t t, int64_t b, uint8_t * wb) __attribute__((always_inline)) {
    const uint8_t* tile = j.w->data + t * j.w->tile_bytes;
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) prefetch_group<Fm>(tile, b * 8 + g);
    if constexpr (Fm == BF16) {  // staged in L1 by vector loads, which overlap their misses
#pragma GCC unroll 16
      for (int o = 0; o < 1024; o += 64) _mm512_store_si512(wb + o, load_line(tile + b * 1024 + o));
      return;
    }
    if constexpr (Fm == Fp8Block) {  // the block's scale in the tables
      const Luts Ls = scaled_luts(L, fp8_scale(*j.w, t, b));
#pragma GCC unroll 8
      for (int g = 0; g < 8; ++g) {
        I p[2];
        decode_pairs<Fm>(tile, b * 8 + g, Ls, p[0], p[1]);
        _mm512_store_si512(wb + 2 * g * 64, p[0]);
        _mm512_store_si512(wb + (2 * g + 1) * 64, p[1]);
      }
      return;
    }
    const I e = exponent_step(*j.w, t, b);
#pragma GCC unroll 8
    for (int g = 0; g < 8; ++g) {
      I p[2];
      decode_pairs<Fm>(tile, b * 8 + g, L, p[0], p[1]);
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        p[h] =
            _mm512_mask_add_epi16(p[h], _mm512_test_epi16_mask(p[h], set1i(0x7fff7fff)), p[h], e);
        _mm512_store_si512(wb + (2 * g + h) * 64, p[h]);
      }
    }
  };
  auto store_out = [&](int64_t t, int g) {
    for (int i = 0; i < 16 && g * 16 + i < j.n; ++i) store_tile(j, g * 16 + i, t, out[i]);
  };
  int64_t t = j.t0;
  // One group of rows: two tiles at a time, whose accumulator chains overlap (one chain's
  // TDPBF16PS waits for the one before), the inputs loaded once for both; even and odd blocks
  // in different registers.
  for (; groups == 1 && t + 1 < j.t1; t += 2) {
    auto decode2 = [&](int64_t b) __attribute__((always_inline)) {
      decode(t, b, buf[0][b % 3]);
      decode(t + 1, b, buf[1][b % 3]);
    };
    auto wb = [&](int u, int64_t b) -> const uint8_t* { return buf[u][b % 3]; };
    _tile_zero(4);
    _tile_zero(5);
    decode2(0);
    if (nb > 1) decode2(1);
    for (int64_t b = 0; b < nb; ++b) {
      if (b + 2 < nb) decode2(b + 2);
      const uint16_t* xa = j.xb + b * 32;
      if (b & 1) {
        _tile_loadd(1, xa, ldb * 2);
        _tile_loadd(6, wb(0, b), 64);
        _tile_loadd(7, wb(1, b), 64);
        _tile_dpbf16ps(4, 1, 6);
        _tile_dpbf16ps(5, 1, 7);
      } else {
        _tile_loadd(0, xa, ldb * 2);
        _tile_loadd(2, wb(0, b), 64);
        _tile_loadd(3, wb(1, b), 64);
        _tile_dpbf16ps(4, 0, 2);
        _tile_dpbf16ps(5, 0, 3);
      }
    }
    _tile_stored(4, out, 64);
    store_out(t, 0);
    _tile_stored(5, out, 64);
    store_out(t + 1, 0);
  }
  for (; t < j.t1; ++t) {
    _tile_zero(4);
    if (groups > 1) _tile_zero(5);
    if (groups > 2) _tile_zero(6);
    if (groups > 3) _tile_zero(7);
    decode(t, 0, buf[0][0]);
    if (nb > 1) decode(t, 1, buf[0][1]);
    for (int64_t b = 0; b < nb; ++b) {
      if (b + 2 < nb) decode(t, b + 2, buf[0][(b + 2) % 3]);
      const uint8_t* wb = buf[0][b % 3];
      const uint16_t* xa = j.xb + b * 32;
      if (b & 1)
        DI_AMX_GROUPS(3);
      else
        DI_AMX_GROUPS(2);
    }
    for (int g = 0; g < groups; ++g) {
      if (g == 0) _tile_stored(4, out, 64);
      if (g == 1) _tile_stored(5, out, 64);
      if (g == 2) _tile_stored(6, out, 64);
      if (g == 3) _tile_stored(7, out, 64);
      store_out(t, g);
    }
  }
  _tile_release();
}
#undef DI_AMX_GROUPS

#endif

template <WeightFormat Fm>
void gemm_fmt(const Job& j) {
  const int64_t K = j.w->cols, nt = j.t1 - j.t0, cols = nt * kH;
  const bool bf16 = kBf16Dot && j.xb != nullptr && Fm != F32;
  const int64_t KC = bf16 ? kKcBf16 : kKcF32;
  GemmScratch s = scratch_of(j);
  [[maybe_unused]] const bool tiles = Fm != F32 && j.amx && bf16;  // (which zero their own)
  const bool fold = bf16 && (j.amx || j.w->foldable_scales);       // (pack_chunk)
  for (int64_t i = 0; i < j.n + 15 && !tiles; ++i)  // (the task's nt tiles of each row)
    for (int64_t o = 0; o < nt * 16; ++o) s.c[i * kNt * 16 + o] = 0.0f;
  [[maybe_unused]] bool amx_on = false;
  for (int64_t kc0 = 0; kc0 < K; kc0 += KC) {
    const int64_t kc = min64(KC, K - kc0);
    pack_chunk<Fm>(j, nt, kc0, kc, bf16, fold, s);
#if defined(__AVX512F__)
    if (tiles) {
      static constexpr MicroFn kAmx[] = {micro_amx<1, 1>, micro_amx<1, 2>, micro_amx<1, 3>};
      static constexpr MicroFn kAmx2[] = {micro_amx<2, 1>, micro_amx<2, 2>};
      if (!std::exchange(amx_on, true)) amx_configure(16);
      // Two groups of rows against 2 tiles at a time (a last single group: 3 tiles); the
      // groups' inputs stay in L1 between the chunk's sub-panels.
      for (int64_t i0 = 0; i0 < j.n;) {
        const bool two = i0 + 16 < j.n;
        const int64_t most = two ? 2 : 3;
        for (int64_t t0 = 0, sub = (nt + most - 1) / most, w = (nt + sub - 1) / sub; t0 < nt;
             t0 += w)
          (two ? kAmx2 : kAmx)[min64(w, nt - t0) - 1](j, i0, kc0, kc, s, t0, nt);
        i0 += two ? 32 : 16;
      }
      continue;
    }
#endif
    // In the last chunk each group of rows is written out as soon as it is done, its output
    // lines fetched as its products begin: written all at the end, the stores waited on those
    // lines (a tenth of a GEMM's time outside the micro-kernel; the tiles' groups still do).
    const bool last = kc0 + kc >= K;
    for (int64_t i0 = 0; i0 < j.n; i0 += kMr) {
      const int mr = int(min64(kMr, j.n - i0));
      for (int64_t i = i0; i < i0 + mr && last; ++i)
        for (int64_t t = 0; t < nt; ++t) {
          const float* yo = j.y + i * j.ldy + std::max(j.lo, (j.t0 + t) * 16) - j.lo;
          _mm_prefetch(reinterpret_cast<const char*>(yo), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(yo + 15), _MM_HINT_T0);
        }
      for (int64_t v0 = 0; v0 < cols; v0 += kCols) {
        const int nv = int(min64(kCols, cols - v0));
        const MicroFn fn =
            micro_for(bf16, fold, mr, nv, std::make_integer_sequence<int, kMr * kCols>());
        fn(j, i0, kc0, kc, s, cols, v0);
      }
      for (int64_t i = i0; i < i0 + mr && last; ++i)
        for (int64_t t = 0; t < nt; ++t) store_tile(j, i, j.t0 + t, s.c + i * (kNt * 16) + t * 16);
    }
  }
#if defined(__AVX512F__)
  if (amx_on) _tile_release();
#endif
  for (int64_t i = 0; i < j.n && tiles; ++i)
    for (int64_t t = 0; t < nt; ++t) store_tile(j, i, j.t0 + t, s.c + i * (kNt * 16) + t * 16);
}

void gemm(const Job& j) {
  static constexpr void (*kFmt[])(const Job&) = {gemm_fmt<F32>, gemm_fmt<BF16>, gemm_fmt<Fp8Block>,
                                                 gemm_fmt<Fp4Row>};
  kFmt[int(j.w->format)](j);
}

// --- activation quantization (V41_SPEC.md §3.4) ---

// RNE of |v| <= 448 to an e4m3 value: 3 mantissa bits for |v| >= 2^-6, multiples of 2^-9 below.
// Adding c = 2^(e+20) to |v| in [2^e, 2^(e+1)) rounds it (RNE) to a multiple of 2^(e-3), and
// subtracting c again is exact; below 2^-6, c = 2^14 rounds to multiples of 2^-9.
inline F round_e4m3(F v) {
  const I sign = bits(v) & set1i(INT32_MIN);
  const F a = floats(bits(v) & set1i(0x7fffffff));
  const F c = max(floats(addi(bits(a) & set1i(0x7f800000), set1i(20 << 23))), set1(16384.0f));
  return floats(bits((a + c) - c) | sign);
}

#if defined(__AVX512F__)
// The reductions of 16 vectors of int32 lanes by op (max, add), lane b of the result reducing
// m[b]: a tree of 128-bit and in-lane shuffles (3 operations a vector) instead of 16 horizontal
// reductions.
// op of two shuffles of a and b (immediates Lo and Hi): of 128-bit lanes (X4), else of the
// 32-bit elements within each.
template <bool X4, int Lo, int Hi, typename Op>
inline I shuffles_op(I a, I b, Op op) {
  if constexpr (X4) return op(_mm512_shuffle_i32x4(a, b, Lo), _mm512_shuffle_i32x4(a, b, Hi));
  const __m512 fa = _mm512_castsi512_ps(a), fb = _mm512_castsi512_ps(b);
  return op(_mm512_castps_si512(_mm512_shuffle_ps(fa, fb, Lo)),
            _mm512_castps_si512(_mm512_shuffle_ps(fa, fb, Hi)));
}
template <typename Op>
inline I tree16(I (&m)[16], Op op) {
  I r1[8], r2[4], r3[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i)  // 128-bit lanes: m[2i] in q0, q1 and m[2i+1] in q2, q3
    r1[i] = shuffles_op<true, 0x44, 0xEE>(m[2 * i], m[2 * i + 1], op);
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j)  // lane q: vector 4j + q's four partials
    r2[j] = shuffles_op<true, 0x88, 0xDD>(r1[2 * j], r1[2 * j + 1], op);
#pragma GCC unroll 2
  for (int k = 0; k < 2; ++k)  // lane q: two of vector 8k + q's, two of 8k + 4 + q's
    r3[k] = shuffles_op<false, 0x44, 0xEE>(r2[2 * k], r2[2 * k + 1], op);
  // Element 4q + s: vector 4s + q.
  const I t = shuffles_op<false, 0x88, 0xDD>(r3[0], r3[1], op);
  return _mm512_permutexvar_epi32(
      _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), t);
}
// The largest magnitude of each of the 16 blocks of 32 values x[b0*32 ..], as bits (compared as
// integers: NaN and infinity always compare largest), lane b for block b0 + b.
inline I abs_max16(const float* x, int64_t b0) {
  const I abs_mask = set1i(0x7fffffff);
  I m[16];
#pragma GCC unroll 16
  for (int b = 0; b < 16; ++b)
    m[b] = _mm512_max_epi32(loadui(x + (b0 + b) * 32) & abs_mask,
                            loadui(x + (b0 + b) * 32 + 16) & abs_mask);
  return tree16(m, [](I a, I b) { return _mm512_max_epi32(a, b); });
}

// quantize()'s blocks b0 .. b0+15 of one row, their scales computed 16 at a time. Returns false
// (nothing written) when a block's maximum is not a finite number, which quantize's per-block
// code then handles as it always has.
inline bool quantize16(const float* xr, int64_t b0, float* xq, uint16_t* xqb) {
  const I mb = abs_max16(xr, b0);
  if (_mm512_cmpge_epi32_mask(mb, set1i(0x7f800000))) return false;  // infinity or NaN
  const F a = _mm512_max_ps(floats(mb), set1(1e-4f));
  const I tb = bits(a * set1(1.0f / 448.0f));
  const I code = addi(srli<23>(tb) & set1i(0xff),
                      _mm512_maskz_set1_epi32(_mm512_test_epi32_mask(tb, set1i(0x7fffff)), 1));
  const F sg = e8m0_lanes(code), vi = e8m0_lanes(_mm512_sub_epi32(set1i(254), code));
  for (int b = 0; b < 16; ++b) {
    const I lane = set1i(b);
    const F sgb = _mm512_permutexvar_ps(lane, sg), vib = _mm512_permutexvar_ps(lane, vi);
    for (int h = 0; h < 2; ++h) {
      const int64_t at = (b0 + b) * 32 + h * 16;
      const F v = min(max(loadu(xr + at) * vib, set1(-448.0f)), set1(448.0f));
      const F r = round_e4m3(v) * sgb;
      if (xq) storeu(xq + at, r);
      if (xqb) store_hi16(xqb + at, r);
    }
  }
  return true;
}
#endif

void quantize(const float* x, int64_t ldx, int64_t n, int64_t K, float* xq, uint16_t* xqb) {
  constexpr int kV = 32 / kLanes;  // vectors per block of 32
  const I abs_mask = set1i(0x7fffffff);
  for (int64_t i = 0; i < n; ++i) {
    const float* xr = x + i * ldx;
    int64_t b = 0;
#if defined(__AVX512F__)
    for (; b + 16 <= K / 32; b += 16)
      if (!quantize16(xr, b, xq ? xq + i * K : nullptr, xqb ? xqb + i * xb_stride(K) : nullptr))
        break;
#endif
    for (; b < K / 32; ++b) {
      F xv[kV];
      F m = zero();
#pragma GCC unroll 4
      for (int h = 0; h < kV; ++h) {
        xv[h] = loadu(xr + b * 32 + h * kLanes);
        m = max(m, floats(bits(xv[h]) & abs_mask));
      }
      float a = reduce_max(m);
      a = a < 1e-4f ? 1e-4f : a;
      const uint32_t code = pow2ceil_code(a, 1.0f / 448.0f);
      const F sg = set1(e8m0(uint8_t(code))), vi = set1(e8m0(uint8_t(254 - code)));
#pragma GCC unroll 4
      for (int h = 0; h < kV; ++h) {
        const F v = min(max(xv[h] * vi, set1(-448.0f)), set1(448.0f));
        const F r = round_e4m3(v) * sg;  // exact: σ is a power of two
        if (xq) storeu(xq + i * K + b * 32 + h * kLanes, r);
        if (xqb) store_hi16(xqb + i * xb_stride(K) + b * 32 + h * kLanes, r);
      }
    }
  }
}

#if defined(__AVX512F__)
// Output byte p of a block's 64 (group p/16; H for p % 16 < 8, else L; input 8·(p/16) +
// (0, 4, 1, 5, 2, 6, 3, 7)[p % 8]) as a byte of the block's two vectors of int32 A (indices
// 0-63: the first, 64-127: the second): with hi, byte 1 of A for H and byte 0 for L; else
// byte 0 everywhere.
constexpr std::array<uint8_t, 64> int_code_bytes(bool hi) {
  constexpr int kOrder8[8] = {0, 4, 1, 5, 2, 6, 3, 7};
  std::array<uint8_t, 64> t{};
  for (int p = 0; p < 64; ++p) {
    const int k = 8 * (p / 16) + kOrder8[p % 8], h_slot = p % 16 < 8;
    t[size_t(p)] = uint8_t((k / 16) * 64 + 4 * (k % 16) + (hi && h_slot ? 1 : 0));
  }
  return t;
}
alignas(64) constexpr std::array<uint8_t, 64> kIntCodeP = int_code_bytes(true);
alignas(64) constexpr std::array<uint8_t, 64> kIntCodeQ = int_code_bytes(false);

// int_codes's blocks b0 .. b0+15 of one row (xq, xi, xc and xs at that row), 16 at a time:
// E, the scales and the corrections as vectors over the blocks; each block's bytes by two
// permutes of its integers A: L = byte 0 of A, H = byte 1 plus the carry of byte 0's sign
// (A = 256·H + L with L signed).
inline void int_codes16(const float* xq, int64_t b0, int8_t* xi, int32_t* xc, float* xs) {
  const I mx = abs_max16(xq, b0);                               // the blocks' maxima (bits)
  const I E = _mm512_sub_epi32(srli<23>(mx), set1i(127 + 14));  // max < 2^(E+15)
  const __mmask16 zero = _mm512_testn_epi32_mask(mx, mx);
  const __mmask16 in_range =
      _mm512_cmpge_epi32_mask(E, set1i(-126)) & _mm512_cmple_epi32_mask(E, set1i(0));
  // 2^-E >= 1 (the products are exact); 1 where E is out of range (those blocks are not used)
  const F inv = floats(_mm512_mask_blend_epi32(in_range, set1i(127 << 23),
                                               slli<23>(_mm512_sub_epi32(set1i(127), E))));
  // |A| <= 32639 keeps the high byte within int8 (an e4m3 block gives at most 30720).
  __mmask16 ok =
      in_range & ~zero & _mm512_cmp_ps_mask(floats(mx) * inv, set1(32639.0f), _CMP_LE_OQ);
  const I P = _mm512_load_si512(kIntCodeP.data()), Q = _mm512_load_si512(kIntCodeQ.data());
  // 1 in the H slots of a group of 16 bytes, 0 in the L slots.
  const I h_carry =
      _mm512_set1_epi64(0x0101010101010101LL) & _mm512_set_epi64(0, -1, 0, -1, 0, -1, 0, -1);
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  I sums[16];
  for (int b = 0; b < 16; ++b) {
    const F invb = _mm512_permutexvar_ps(set1i(b), inv);
    const F v0 = loadu(xq + (b0 + b) * 32) * invb, v1 = loadu(xq + (b0 + b) * 32 + 16) * invb;
    const __mmask16 m0 = _mm512_cmp_ps_mask(_mm512_roundscale_ps(v0, kRound), v0, _CMP_EQ_OQ);
    const __mmask16 m1 = _mm512_cmp_ps_mask(_mm512_roundscale_ps(v1, kRound), v1, _CMP_EQ_OQ);
    if ((m0 & m1) != 0xffff) ok &= __mmask16(~(1u << b));
    const I A0 = _mm512_cvtps_epi32(v0), A1 = _mm512_cvtps_epi32(v1);
    const I lo_hi = _mm512_permutex2var_epi8(A0, P, A1), lo = _mm512_permutex2var_epi8(A0, Q, A1);
    const I carry = _mm512_srli_epi16(lo, 7) & h_carry;  // byte 0's sign bit, in the H slots
    _mm512_storeu_si512(xi + (b0 + b) * 64, _mm512_add_epi8(lo_hi, carry));
    sums[b] = addi(A0, A1);
  }
  // Zero blocks: bytes 0 (A = 0 above), correction 0, scale 1.
  const I s = tree16(sums, [](I a, I b) { return _mm512_add_epi32(a, b); });
  _mm512_storeu_si512(xc + b0, _mm512_maskz_mullo_epi32(ok, s, set1i(-12)));
  // 2^(E-1) (the weights are stored doubled); 2^-127 is the one subnormal case
  const I e1 = _mm512_add_epi32(E, set1i(127 - 1));
  const I scale = _mm512_mask_blend_epi32(_mm512_cmpgt_epi32_mask(e1, set1i(0)), set1i(0x00400000),
                                          slli<23>(e1));
  _mm512_storeu_si512(
      xs + b0, _mm512_mask_blend_epi32(zero, _mm512_maskz_mov_epi32(ok, scale), set1i(0x3f800000)));
}

void int_codes(const float* xq, int64_t n, int64_t K, int8_t* xi, int32_t* xc, float* xs) {
  const int64_t nb = K / 32;
  for (int64_t i = 0; i < n; ++i) {
    int64_t b = 0;
    for (; b + 16 <= nb; b += 16)
      int_codes16(xq + i * K, b, xi + i * K * 2, xc + i * nb, xs + i * nb);
    if (b == nb) continue;
    // The last blocks, padded to 16 with zero blocks (whose codes are dropped).
    alignas(64) float x16[16 * 32] = {};
    alignas(64) int8_t xi16[16 * 64];
    int32_t xc16[16];
    float xs16[16];
    std::memcpy(x16, xq + i * K + b * 32, size_t(nb - b) * 32 * 4);
    int_codes16(x16, 0, xi16, xc16, xs16);
    std::memcpy(xi + (i * K + b * 32) * 2, xi16, size_t(nb - b) * 64);
    std::memcpy(xc + i * nb + b, xc16, size_t(nb - b) * 4);
    std::memcpy(xs + i * nb + b, xs16, size_t(nb - b) * 4);
  }
}

void chain_rows(uint16_t* xb, int64_t n, int64_t K) {
  const I perm = chain_order_words();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < K; k += 32) {
      uint16_t* p = xb + i * xb_stride(K) + k;
      _mm512_storeu_si512(p, _mm512_permutexvar_epi16(perm, _mm512_loadu_si512(p)));
    }
}

bool to_bf16(const float* x, int64_t ldx, int64_t n, int64_t K, uint16_t* xb) {
  __mmask16 bad = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < K; k += 16) {  // K is a multiple of 32
      const I u = loadui(x + i * ldx + k);
      const I e = srli<23>(u) & set1i(0xff);
      const __mmask16 zero = _mm512_testn_epi32_mask(u, set1i(0x7fffffff));
      const __mmask16 in_range =
          _mm512_cmpge_epi32_mask(e, set1i(127 - 56)) & _mm512_cmple_epi32_mask(e, set1i(254));
      const __mmask16 low = _mm512_test_epi32_mask(u, set1i(0xffff));
      bad |= __mmask16(low | ~(zero | in_range));
      store_hi16(xb + i * xb_stride(K) + k, floats(u));
    }
  return bad == 0;
}
#endif

}  // namespace

#if defined(__AVX512F__)
const Kernels kAvx512{quantize, to_bf16, chain_rows,         int_codes,
                      gemv,     gemm,    gemm_scratch_bytes, kGemvRows};

namespace {

// The start-up probes' operands: bf16 and fp32 values of random sign and mantissa over a range
// of exponents (wide gaps, so that the order of additions and their roundings show).
struct ProbeValues {
  uint64_t st;
  uint64_t next() {
    st ^= st << 13;
    st ^= st >> 7;
    st ^= st << 17;
    return st;
  }
  // Mantissa bits `mant` (0x70: e4m3-like values), biased exponents [e0, e0 + span).
  uint16_t bf16(int e0, int span, int mant) {
    const uint64_t r = next();
    return uint16_t((r & 0x8000) | ((e0 + (r >> 16) % span) << 7) | ((r >> 8) & mant));
  }
  float f32(int e0, int span) {
    const uint64_t r = next();
    return __builtin_bit_cast(float, uint32_t((r & 0x80000000u) | ((e0 + (r >> 32) % span) << 23) |
                                              ((r >> 8) & 0x7fffff)));
  }
};
inline float widen(uint16_t h) {
  return __builtin_bit_cast(float, uint32_t(h) << 16);
}

}  // namespace

bool avx512_dpbf16_is_canonical() {
  // Operands like those of quantized GEMMs (e4m3-like bf16 values).
  ProbeValues pv{0x9e3779b97f4a7c15ull};
  for (int it = 0; it < 4096; ++it) {
    alignas(64) uint16_t a[32], b[32];
    alignas(64) float acc[16], out[16];
    for (int l = 0; l < 32; ++l) {
      a[l] = pv.bf16(110, 40, 0x70);
      b[l] = pv.bf16(115, 30, 0x7f);
    }
    for (int l = 0; l < 16; ++l) acc[l] = pv.f32(100, 60);
    store(out, _mm512_dpbf16_ps(load(acc), reinterpret_cast<__m512bh>(loadui(a)),
                                reinterpret_cast<__m512bh>(loadui(b))));
    for (int l = 0; l < 16; ++l) {
      const float s1 = __builtin_fmaf(widen(a[2 * l + 1]), widen(b[2 * l + 1]), acc[l]);
      const float want = __builtin_fmaf(widen(a[2 * l]), widen(b[2 * l]), s1);
      if (std::memcmp(&want, &out[l], 4) != 0) return false;
    }
  }
  return true;
}

bool amx_is_canonical() {
  // Into zeroed and into filled partial tiles, against the order of reduce.h: e + o, then added
  // to the tile.
  ProbeValues pv{0x2545f4914f6cdd1dull};
  alignas(64) uint16_t a[16][32], b[16][32];
  alignas(64) float c[16][16], out[16][16];
  amx_configure(16);
  bool ok = true;
  for (int it = 0; it < 64 && ok; ++it) {
    for (int r = 0; r < 16; ++r)
      for (int k = 0; k < 32; ++k) {
        a[r][k] = pv.bf16(110, 40, 0x7f);
        b[r][k] = pv.bf16(115, 30, 0x7f);
      }
    for (int r = 0; r < 16; ++r)
      for (int n = 0; n < 16; ++n) c[r][n] = it & 1 ? 0.0f : pv.f32(100, 60);
    _tile_loadd(4, c, 64);
    _tile_loadd(0, a, 64);
    _tile_loadd(2, b, 64);
    _tile_dpbf16ps(4, 0, 2);
    _tile_stored(4, out, 64);
    for (int r = 0; r < 16 && ok; ++r)
      for (int n = 0; n < 16; ++n) {
        float e = 0, o = 0;
        for (int k = 0; k < 16; ++k) {
          e = __builtin_fmaf(widen(a[r][2 * k]), widen(b[k][2 * n]), e);
          o = __builtin_fmaf(widen(a[r][2 * k + 1]), widen(b[k][2 * n + 1]), o);
        }
        const float want = c[r][n] + (e + o);
        if (std::memcmp(&want, &out[r][n], 4) != 0) ok = false;
      }
  }
  _tile_release();
  return ok;
}

void avx512_product_chains(ProductKind kind, int64_t n) {
  __m512 acc[16];
  for (auto& a : acc) a = _mm512_setzero_ps();
  __m512 one = _mm512_set1_ps(1.0f);
  __m512bh pair = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3f803f80));
  I ones = _mm512_set1_epi32(0x00010001);
  asm("" : "+v"(one), "+v"(pair), "+v"(ones));  // opaque: no instruction is folded away
  if (kind == ProductKind::Int16) {
    I iacc[16];
    for (auto& a : iacc) a = _mm512_setzero_si512();
    for (int64_t i = 0; i < n; ++i)
#pragma GCC unroll 16
      for (auto& a : iacc) a = _mm512_dpbusd_epi32(a, ones, ones);
    for (int k = 0; k < 16; ++k) acc[k] = _mm512_cvtepi32_ps(iacc[k]);
  } else if (kind == ProductKind::Bf16) {
    for (int64_t i = 0; i < n; ++i)
#pragma GCC unroll 16
      for (auto& a : acc) a = _mm512_dpbf16_ps(a, pair, pair);
  } else {
    for (int64_t i = 0; i < n; ++i)
#pragma GCC unroll 16
      for (auto& a : acc) a = _mm512_fmadd_ps(one, one, a);
  }
  __m512 s = acc[0];
  for (int k = 1; k < 16; ++k) s = _mm512_add_ps(s, acc[k]);
  volatile float sink = _mm512_cvtss_f32(s);  // keeps the chains
  (void)sink;
}
#else
const Kernels kAvx2{quantize, nullptr, nullptr, nullptr, gemv, gemm, gemm_scratch_bytes, kGemvRows};
#endif

}  // namespace deepinfer::linear_isa
