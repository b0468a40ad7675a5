// Vector sparse attention for a group of up to kLanes heads of one query, lane = head (16 heads
// per vector with AVX-512, 8 with AVX2), in the order of sparse_attention_ref
// (kernels/attention.cpp):
//   scores  z_j = (Σ over 32-blocks of the block's pair-ordered partial) · τ, four keys at a time
//           against the transposed query (every key element broadcast to the heads);
//   softmax per block of 64 keys: running max, β = exp(m - m'), p_j = exp(z_j - m') (the
//           reference's double exp, out of line), Σp in the 16-lane order over j, l = l·β + Σp;
//   values  per head, A = A·β + Σ_j p_j·k_j over 8 vectors of dimensions at a time (keys are
//           the values).
//
// Vector indexer scores (V41_SPEC.md §6.3) in the order of indexer_scores_ref, lane = head:
// every key element is broadcast against the transposed query (several keys at a time), each
// head's dot product is the canonical blocked sum, then bf16(relu(bf16(dot))·w_h) per head, and
// the head sum runs over the heads in order (scalar, per key).
#include <array>
#include <cmath>
#include <cstring>
#include <utility>

#include "kernels/isa.h"
#include "kernels/simd.h"

namespace deepinfer::attention_isa {

namespace {

using namespace simd::DI_SIMD_NS;

constexpr int64_t kBlock = 64;

// Dot products of keys [t, t + KN) (rows of `keys`, D apart) with HV vectors of heads of the
// transposed query qT [D][HV·kLanes], each the canonical blocked sum (pairs odd input first).
template <bool FM, int HV, int KN>
inline void head_dots(const float* keys, int64_t D, const float* qT, int64_t t, F (&acc)[KN][HV]) {
  const float* k[KN];
#pragma GCC unroll 4
  for (int c = 0; c < KN; ++c) k[c] = keys + (t + c) * D;
#pragma GCC unroll 4
  for (int c = 0; c < KN; ++c)
#pragma GCC unroll 8
    for (int v = 0; v < HV; ++v) acc[c][v] = zero();
  for (int64_t b = 0; b < D; b += 32) {
    F p[KN][HV] = {};
#pragma GCC unroll 16
    for (int i = 0; i < 32; i += 2) {
#pragma GCC unroll 2
      for (int odd = 1; odd >= 0; --odd) {
        const int64_t d = b + i + odd;
        F q[HV];
#pragma GCC unroll 8
        for (int v = 0; v < HV; ++v) q[v] = load(qT + (d * HV + v) * kLanes);
#pragma GCC unroll 4
        for (int c = 0; c < KN; ++c) {
          const F kv = set1(k[c][d]);
#pragma GCC unroll 8
          for (int v = 0; v < HV; ++v) p[c][v] = madd<FM>(kv, q[v], p[c][v]);
        }
      }
    }
#pragma GCC unroll 4
    for (int c = 0; c < KN; ++c)
#pragma GCC unroll 8
      for (int v = 0; v < HV; ++v) acc[c][v] = acc[c][v] + p[c][v];
  }
}

// Scores of keys [j, j + KN) into z[.][kLanes]: per block of 32 dimensions the even and the odd
// dimensions' fused chains, then their sum, added to the total (reduce.h's attention order).
template <int KN>
inline void scores(const SparseAttnArgs& a, const float* qT, int64_t j, float* zj) {
  const int64_t D = a.Dh;
  const float* k[KN];
#pragma GCC unroll 4
  for (int c = 0; c < KN; ++c) k[c] = a.keys + (j + c) * D;
  F acc[KN];
#pragma GCC unroll 4
  for (int c = 0; c < KN; ++c) acc[c] = zero();
  for (int64_t b = 0; b < D; b += 32) {
    F e[KN], o[KN];
#pragma GCC unroll 4
    for (int c = 0; c < KN; ++c) e[c] = o[c] = zero();
#pragma GCC unroll 16
    for (int i = 0; i < 32; i += 2) {
      const F q0 = load(qT + (b + i) * kLanes), q1 = load(qT + (b + i + 1) * kLanes);
#pragma GCC unroll 4
      for (int c = 0; c < KN; ++c) {
        e[c] = fmadd(set1(k[c][b + i]), q0, e[c]);
        o[c] = fmadd(set1(k[c][b + i + 1]), q1, o[c]);
      }
    }
#pragma GCC unroll 4
    for (int c = 0; c < KN; ++c) acc[c] = acc[c] + (e[c] + o[c]);
  }
#pragma GCC unroll 4
  for (int c = 0; c < KN; ++c) store(zj + c * kLanes, acc[c] * set1(a.scale));
}

// A_h = A_h·β_h + Σ_j p_j,h·k_j for keys [j0, j0 + nb) and dimensions [d, d + NV·kLanes): per
// sub-block of 32 keys the even and the odd keys' fused chains, then their sum, added up.
template <int NV>
inline void values_at(const SparseAttnArgs& a, float* o, int64_t l, int64_t d, int64_t j0,
                      int64_t nb, const float* p, F bl) {
  F pv[NV];
#pragma GCC unroll 8
  for (int c = 0; c < NV; ++c) pv[c] = zero();
  for (int64_t s0 = 0; s0 < nb; s0 += 32) {
    const int64_t s1 = nb - s0 < 32 ? nb : s0 + 32;
    F e[NV], od[NV];
#pragma GCC unroll 8
    for (int c = 0; c < NV; ++c) e[c] = od[c] = zero();
    int64_t j = s0;
    for (; j + 2 <= s1; j += 2) {
      const F p0 = set1(p[j * kLanes + l]), p1 = set1(p[(j + 1) * kLanes + l]);
      const float* k0 = a.keys + (j0 + j) * a.Dh + d;
      const float* k1 = k0 + a.Dh;
#pragma GCC unroll 8
      for (int c = 0; c < NV; ++c) {
        e[c] = fmadd(p0, loadu(k0 + kLanes * c), e[c]);
        od[c] = fmadd(p1, loadu(k1 + kLanes * c), od[c]);
      }
    }
    if (j < s1) {
      const F p0 = set1(p[j * kLanes + l]);
      const float* k0 = a.keys + (j0 + j) * a.Dh + d;
#pragma GCC unroll 8
      for (int c = 0; c < NV; ++c) e[c] = fmadd(p0, loadu(k0 + kLanes * c), e[c]);
    }
#pragma GCC unroll 8
    for (int c = 0; c < NV; ++c) pv[c] = pv[c] + (e[c] + od[c]);
  }
#pragma GCC unroll 8
  for (int c = 0; c < NV; ++c) {
    float* oc = o + d + kLanes * c;
    storeu(oc, loadu(oc) * bl + pv[c]);
  }
}

// Dimensions per pass of values_at: three accumulators each (AVX2 has 16 registers).
constexpr int kValueVectors = kLanes == 16 ? 8 : 4;

inline void values(const SparseAttnArgs& a, int64_t h0, int64_t nh, int64_t j0, int64_t nb,
                   const float* p, const float* beta) {
  const int64_t Dh = a.Dh;
  for (int64_t l = 0; l < nh; ++l) {
    float* o = a.out + (h0 + l) * Dh;
    const F bl = set1(beta[l]);
    int64_t d = 0;
    for (; d + kValueVectors * kLanes <= Dh; d += kValueVectors * kLanes)
      values_at<kValueVectors>(a, o, l, d, j0, nb, p, bl);
    // Dh is a multiple of 32.
    for (; d < Dh; d += 32) values_at<32 / kLanes>(a, o, l, d, j0, nb, p, bl);
  }
}

// The softmax step of the block of keys [j0, j0 + nb) whose scores are at z (nb x kLanes): the
// new running max into *m, β into beta[kLanes], the probabilities into p (rounded to bf16 when
// a.bf16_probs), and the running sum *lsum.
inline void softmax_block(const Job& jb, const float* z, int64_t nb, float* p, float* beta, F* m,
                          F* lsum) {
  F m_new = *m;
  for (int64_t jj = 0; jj < nb; ++jj) m_new = max(load(z + jj * kLanes), m_new);
  store(beta, *m - m_new);
  for (int64_t jj = 0; jj < nb; ++jj) store(p + jj * kLanes, load(z + jj * kLanes) - m_new);
  jb.exp_n(beta, kLanes);
  jb.exp_n(p, nb * kLanes);
  // Σp in the 16-lane order over j (canonical_sum), for all heads at once.
  F s[16];
#pragma GCC unroll 16
  for (int w = 0; w < 16; ++w) s[w] = zero();
  for (int64_t jj = 0; jj < nb; ++jj) s[jj & 15] = s[jj & 15] + load(p + jj * kLanes);
#pragma GCC unroll 4
  for (int w = 8; w >= 1; w /= 2)
#pragma GCC unroll 8
    for (int q = 0; q < w; ++q) s[q] = s[q] + s[q + w];
  *lsum = *lsum * load(beta) + s[0];
  if (jb.a->bf16_probs)
    for (int64_t jj = 0; jj < nb; ++jj) store(p + jj * kLanes, round_bf16(load(p + jj * kLanes)));
  *m = m_new;
}

// The end: l += exp(sink - m), o = A / l.
inline void finish(const Job& jb, F m, F lsum, float* v) {
  const SparseAttnArgs& a = *jb.a;
  float sink[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) sink[l] = l < jb.nh ? a.sink[jb.h0 + l] : 0.0f;
  store(v, loadu(sink) - m);
  jb.exp_n(v, kLanes);
  store(v, lsum + load(v));
  for (int64_t l = 0; l < jb.nh; ++l) {
    float* o = a.out + (jb.h0 + l) * a.Dh;
    const F ll = set1(v[l]);
    for (int64_t d = 0; d < a.Dh; d += kLanes) storeu(o + d, loadu(o + d) / ll);
  }
}

void run_group(const Job& jb) {
  const SparseAttnArgs& a = *jb.a;
  const int64_t Dh = a.Dh, nk = a.nk, h0 = jb.h0, nh = jb.nh;
  float* qT = jb.scratch;          // [Dh][kLanes]
  float* z = qT + Dh * kLanes;     // [nk][kLanes]
  float* p = z + nk * kLanes;      // [64][kLanes]
  float* v = p + kBlock * kLanes;  // [4][kLanes]
  for (int64_t d = 0; d < Dh; ++d)
    for (int64_t l = 0; l < kLanes; ++l) qT[d * kLanes + l] = l < nh ? a.q[(h0 + l) * Dh + d] : 0;
  int64_t j = 0;
  for (; j + 4 <= nk; j += 4) scores<4>(a, qT, j, z + j * kLanes);
  for (; j < nk; ++j) scores<1>(a, qT, j, z + j * kLanes);

  for (int64_t l = 0; l < nh; ++l)
    for (int64_t d = 0; d < Dh; ++d) a.out[(h0 + l) * Dh + d] = 0.0f;
  F m = set1(-1e30f), lsum = zero();
  for (int64_t j0 = 0; j0 < nk; j0 += kBlock) {
    const int64_t nb = nk - j0 < kBlock ? nk - j0 : kBlock;
    softmax_block(jb, z + j0 * kLanes, nb, p, v, &m, &lsum);
    values(a, h0, nh, j0, nb, p, v);
  }
  finish(jb, m, lsum, v);
}

#if defined(__AVX512F__)

// --- on AMX tiles ---
//
// Per block of 64 keys (given as bf16): their rows are the scores' A tiles (16 keys x 32
// dimensions), and they are interleaved once into pairs of keys (the values' B tiles, 16 key
// pairs x 16 dimensions); the query, once per call, into pairs of dimensions (the scores' B
// tile, 16 dimension pairs x 16 heads). TDPBF16PS adds a block's even and odd fused chains, summed,
// to its tile: the scores' blocks of 32 dimensions and the values' sub-blocks of 32 keys in
// reduce.h's attention order. The products are exact and, with every value 0 or at least 2^-56
// (Job::amx), no sum is subnormal; a block with a nonzero probability below 2^-56 (which the tiles
// would flush) takes the vector values instead. Tiles: 0, 1 A; 2, 3 B; 4 to 7 accumulators.

// Word indices that interleave the high halves of two vectors of bf16 values held as fp32: the
// pairs (x0[i], x1[i]).
alignas(64) constexpr std::array<int16_t, 32> kPairHi = [] {
  std::array<int16_t, 32> v{};
  for (int i = 0; i < 16; ++i) {
    v[size_t(2 * i)] = int16_t(2 * i + 1);
    v[size_t(2 * i + 1)] = int16_t(32 + 2 * i + 1);
  }
  return v;
}();

// Word indices that interleave the first 16 values of two vectors of 32 bf16 values: the pairs
// (x0[i], x1[i]) (+16 in every index: the last 16).
alignas(64) constexpr std::array<int16_t, 32> kPairLo = [] {
  std::array<int16_t, 32> v{};
  for (int i = 0; i < 16; ++i) {
    v[size_t(2 * i)] = int16_t(i);
    v[size_t(2 * i + 1)] = int16_t(32 + i);
  }
  return v;
}();

// Word indices that take the high halves of 32 consecutive floats (two vectors) as 16 pairs.
alignas(64) constexpr std::array<int16_t, 32> kConsecHi = [] {
  std::array<int16_t, 32> v{};
  for (int i = 0; i < 32; ++i) v[size_t(i)] = int16_t(2 * i + 1);
  return v;
}();

// Lanes of x that the tiles would not take exactly: not a bf16 value, or nonzero below 2^-56.
inline __mmask16 not_floored(__m512i x) {
  const __m512i mag = _mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff));
  return _mm512_test_epi32_mask(x, _mm512_set1_epi32(0xffff)) |
         _mm512_cmplt_epu32_mask(_mm512_sub_epi32(mag, _mm512_set1_epi32(1)),
                                 _mm512_set1_epi32((127 - 56) << 23) - 1);
}

// Lanes of x (32 bf16 values) nonzero below 2^-56 in magnitude.
inline __mmask32 not_floored16(__m512i x) {
  const __m512i mag = _mm512_and_si512(x, _mm512_set1_epi16(0x7fff));
  return _mm512_cmplt_epu16_mask(_mm512_sub_epi16(mag, _mm512_set1_epi16(1)),
                                 _mm512_set1_epi16(((127 - 56) << 7) - 1));
}

// The block's keys [j0, j0 + nb) as Dh-apart bf16 rows: in place (SparseAttnArgs::keys_bf16, or
// key_rows whose block is one such run), else gathered into kA.
inline const uint16_t* block_rows(const SparseAttnArgs& a, int64_t j0, int64_t nb, uint16_t* kA) {
  const int64_t Dh = a.Dh;
  if (!a.key_rows) return a.keys_bf16 + j0 * Dh;
  const uint16_t* const* r = a.key_rows + j0;
  bool run = true;
  for (int64_t t = 1; t < nb; ++t) run &= r[t] == r[0] + t * Dh;
  if (run) return r[0];
  for (int64_t t = 0; t < nb; ++t) std::memcpy(kA + t * Dh, r[t], size_t(Dh) * 2);
  return kA;
}

// The block's keys [j0, j0 + 64) as the caller's pairs (SparseAttnArgs::key_pairs) when the
// block is whole, its rows one run in place and its pairs one run of pairs; else null.
inline const uint16_t* paired_block(const SparseAttnArgs& a, int64_t j0, int64_t nb,
                                    const uint16_t* src, const uint16_t* kA) {
  if (!a.key_pairs || nb != kBlock || src == kA) return nullptr;
  const uint16_t* const* p = a.key_pairs + j0;
  bool run = true;
  for (int64_t r = 1; r < kBlock / 2; ++r) run &= p[2 * r] == p[0] + r * 2 * a.Dh;
  return run ? p[0] : nullptr;
}

// The block's keys, nb rows at src (block_rows), as pairs vB [2 sub-blocks][Dh / 16]
// [16 pairs][32] (the values' B tiles, missing keys zero), and *rows their bf16 rows (the scores'
// A tiles: in place, or in kA with zero rows after a short block). Returns whether every value
// is 0 or at least 2^-56 in magnitude.
inline bool pair_block_bf16(const uint16_t* src, int64_t Dh, int64_t nb, uint16_t* kA, uint16_t* vB,
                            const uint16_t** rows) {
  const int64_t nc = Dh / 16;
  if (nb < kBlock) {
    if (src != kA) std::memcpy(kA, src, size_t(nb * Dh) * 2);
    std::memset(kA + nb * Dh, 0, size_t((kBlock - nb) * Dh) * 2);
    src = kA;
  }
  *rows = src;
  const __m512i lo = _mm512_load_si512(kPairLo.data()),
                hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  __mmask32 bad = 0;
  for (int64_t r = 0; r < 32; ++r) {  // the key pair (2r, 2r + 1) of the block
    const uint16_t* k0 = src + 2 * r * Dh;
    const uint16_t* k1 = k0 + Dh;
    uint16_t* pairs = vB + ((r / 16) * nc * 16 + r % 16) * 32;
    for (int64_t c = 0; c < nc; c += 2) {  // 32 dimensions
      const __m512i x0 = _mm512_loadu_si512(k0 + 16 * c), x1 = _mm512_loadu_si512(k1 + 16 * c);
      bad |= not_floored16(x0) | not_floored16(x1);
      _mm512_store_si512(pairs + c * 16 * 32, _mm512_permutex2var_epi16(x0, lo, x1));
      _mm512_store_si512(pairs + (c + 1) * 16 * 32, _mm512_permutex2var_epi16(x0, hi, x1));
    }
  }
  return bad == 0;
}

// `a` with a block's nb keys (bf16 rows at src) widened to fp32 into k32 (its rows 0 .. nb-1),
// for the vector functions.
inline SparseAttnArgs fp32_block(const SparseAttnArgs& a, const uint16_t* src, int64_t nb,
                                 float* k32) {
  SparseAttnArgs b = a;
  for (int64_t i = 0; i < nb * a.Dh; ++i)
    k32[i] = __builtin_bit_cast(float, uint32_t(src[i]) << 16);
  b.keys = k32;
  b.keys_bf16 = nullptr;
  b.key_rows = nullptr;
  b.key_pairs = nullptr;
  return b;
}

// Each head's dimensions of every block of 32 as 16 steps of two bf16 values (the high halves of
// the query's floats, in the word order `perm` gives over two vectors), one 32-bit step per head
// lane: out [Dh / 32][16][16] (heads past nh zero). The tiles' B operand (pairs in order) and
// vdpbf16ps's (the chains' pairs) alike.
inline void query_steps(const Job& jb, __m512i perm, uint32_t* out) {
  const SparseAttnArgs& a = *jb.a;
  const int64_t Dh = a.Dh;
  const __m512i col =
      _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                         _mm512_set1_epi32(16));
  for (int64_t l = 0; l < kLanes; ++l)
    for (int64_t b = 0; b < Dh / 32; ++b) {
      const float* q = a.q + (jb.h0 + l) * Dh + 32 * b;
      const __m512i steps = l < jb.nh ? _mm512_permutex2var_epi16(loadui(q), perm, loadui(q + 16))
                                      : _mm512_setzero_si512();
      _mm512_i32scatter_epi32(out + b * 256 + l, col, steps, 4);
    }
}

// What the bf16 paths keep across a group's blocks for the blocks that run on vectors instead:
// the vector scores' transposed query (made once one needs it) and whether the output holds a
// block's values yet (it is not zeroed before: the first block writes it).
struct VectorFallback {
  const Job& jb;
  float* qT;          // [Dh][16]
  float* k32;         // [64][Dh]: a block's keys widened to fp32
  bool first = true;  // no block's values in the output yet
  bool have_qT = false;

  void zero_out() {
    if (!first) return;
    first = false;
    const SparseAttnArgs& a = *jb.a;
    for (int64_t l = 0; l < jb.nh; ++l)
      for (int64_t d = 0; d < a.Dh; ++d) a.out[(jb.h0 + l) * a.Dh + d] = 0.0f;
  }
  // A whole block (nb keys, bf16 rows at src) on vectors.
  void block(const uint16_t* src, int64_t nb, float* z, float* p, float* v, F* m, F* lsum) {
    const SparseAttnArgs& a = *jb.a;
    const SparseAttnArgs b = fp32_block(a, src, nb, k32);
    if (!have_qT)
      for (int64_t d = 0; d < a.Dh; ++d)
        for (int64_t l = 0; l < kLanes; ++l)
          qT[d * kLanes + l] = l < jb.nh ? a.q[(jb.h0 + l) * a.Dh + d] : 0;
    have_qT = true;
    zero_out();
    int64_t j = 0;
    for (; j + 4 <= nb; j += 4) scores<4>(b, qT, j, z + j * kLanes);
    for (; j < nb; ++j) scores<1>(b, qT, j, z + j * kLanes);
    softmax_block(jb, z, nb, p, v, m, lsum);
    values(b, jb.h0, jb.nh, 0, nb, p, v);
  }
  // After a block's softmax: where the bf16 products would flush a probability (nonzero below
  // 2^-56), the block's values on vectors. Returns whether it ran them.
  bool values_if_tiny(const uint16_t* src, int64_t nb, const float* p, const float* v) {
    __mmask16 tiny = 0;
    for (int64_t jj = 0; jj < nb; ++jj) tiny |= not_floored(loadui(p + jj * kLanes));
    if (!(tiny & __mmask16((1u << jb.nh) - 1))) return false;
    zero_out();
    values(fp32_block(*jb.a, src, nb, k32), jb.h0, jb.nh, 0, nb, p, v);
    return true;
  }
};

void run_group_amx(const Job& jb) {
  const SparseAttnArgs& a = *jb.a;
  const int64_t Dh = a.Dh, nk = a.nk, h0 = jb.h0, nh = jb.nh, nc = Dh / 16;
  float* qT = jb.scratch;                                    // [Dh][16]
  float* z = qT + Dh * kLanes;                               // [64][16]
  float* p = z + nk * kLanes;                                // [64][16]
  float* v = p + kBlock * kLanes;                            // [4][16]
  float* cs = v + 4 * kLanes + 64;                           // [4][16][16]
  uint16_t* qB = reinterpret_cast<uint16_t*>(cs + 4 * 256);  // [Dh / 32][16][32]
  uint16_t* pA = qB + Dh * 16;                               // [2][16][32]
  uint16_t* kA = pA + 2 * 16 * 32;                           // [64][Dh]
  uint16_t* vB = kA + 64 * Dh;                               // [2][Dh / 16][16][32]
  float* k32 = reinterpret_cast<float*>(vB + 64 * Dh);       // [64][Dh] (bf16 keys' fallback)
  // qB: each head's dimension pairs of a block, in order, in the block's column of that head.
  query_steps(jb, _mm512_load_si512(kConsecHi.data()), reinterpret_cast<uint32_t*>(qB));
  const __m512i pair_idx = _mm512_load_si512(kPairHi.data());
  const __m512i head_col =
      _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                         _mm512_set1_epi32(16));
  VectorFallback fb{jb, qT, k32};
  linear_isa::amx_configure(16);
  F m = set1(-1e30f), lsum = zero();
  for (int64_t j0 = 0; j0 < nk; j0 += kBlock) {
    const int64_t nb = nk - j0 < kBlock ? nk - j0 : kBlock;
    const uint16_t* const src = block_rows(a, j0, nb, kA);
    const uint16_t* rows = kA;
    // The values' B tiles (sub-block sb, chunk c of 16 dimensions: vb_sb + c·vstep, rows
    // vstride bytes apart): the caller's pairs in place, else pairs built here in vB.
    const uint16_t* vb0 = vB;
    const uint16_t* vb1 = vB + nc * 512;
    int64_t vstep = 512, vstride = 64;
    if (const uint16_t* kp = paired_block(a, j0, nb, src, kA)) {
      rows = src;
      vb0 = kp;
      vb1 = kp + 32 * Dh;
      vstep = 32;
      vstride = 4 * Dh;
    } else if (!pair_block_bf16(src, Dh, nb, kA, vB, &rows)) {
      // Values the tiles would not take exactly: the block on vectors (the keys as fp32).
      fb.block(src, nb, z, p, v, &m, &lsum);
      continue;
    }
    // Scores of the block's 4 groups of 16 keys (rows past nb are zero keys, never read).
    _tile_zero(4);
    _tile_zero(5);
    _tile_zero(6);
    _tile_zero(7);
    for (int64_t b = 0; b < Dh / 32; ++b) {
      _tile_loadd(2, qB + b * 16 * 32, 64);
      _tile_loadd(0, rows + 32 * b, Dh * 2);
      _tile_dpbf16ps(4, 0, 2);
      _tile_loadd(1, rows + 16 * Dh + 32 * b, Dh * 2);
      _tile_dpbf16ps(5, 1, 2);
      _tile_loadd(0, rows + 32 * Dh + 32 * b, Dh * 2);
      _tile_dpbf16ps(6, 0, 2);
      _tile_loadd(1, rows + 48 * Dh + 32 * b, Dh * 2);
      _tile_dpbf16ps(7, 1, 2);
    }
    _tile_stored(4, cs, 64);
    _tile_stored(5, cs + 256, 64);
    _tile_stored(6, cs + 512, 64);
    _tile_stored(7, cs + 768, 64);
    for (int64_t jj = 0; jj < nb; ++jj)
      store(z + jj * kLanes, load(cs + jj * kLanes) * set1(a.scale));
    softmax_block(jb, z, nb, p, v, &m, &lsum);
    if (fb.values_if_tiny(src, nb, p, v)) continue;
    // The probabilities as A tiles: [sub-block][head][32 keys] (missing keys zero).
    // Each pair of keys' probabilities, as one 32-bit lane per head, scattered into the heads'
    // rows.
    for (int64_t r = 0; r < 32; ++r) {
      const __m512i pr =
          2 * r < nb ? _mm512_permutex2var_epi16(loadui(p + 2 * r * kLanes), pair_idx,
                                                 2 * r + 1 < nb ? loadui(p + (2 * r + 1) * kLanes)
                                                                : _mm512_setzero_si512())
                     : _mm512_setzero_si512();
      _mm512_i32scatter_epi32(pA + (r / 16) * 512 + 2 * (r % 16), head_col, pr, 4);
    }
    _tile_loadd(0, pA, 64);
    _tile_loadd(1, pA + 512, 64);
    const bool second = nb > 32;
    for (int64_t c = 0; c < nc; c += 4) {  // 4 chunks of 16 dimensions (Dh is a multiple of 32)
      const uint16_t* b0 = vb0 + c * vstep;
      const uint16_t* b1 = vb1 + c * vstep;
      _tile_zero(4);
      _tile_zero(5);
      _tile_loadd(2, b0, vstride);
      _tile_dpbf16ps(4, 0, 2);
      _tile_loadd(3, b0 + vstep, vstride);
      _tile_dpbf16ps(5, 0, 3);
      if (second) {
        _tile_loadd(2, b1, vstride);
        _tile_dpbf16ps(4, 1, 2);
        _tile_loadd(3, b1 + vstep, vstride);
        _tile_dpbf16ps(5, 1, 3);
      }
      _tile_stored(4, cs, 64);
      _tile_stored(5, cs + 256, 64);
      const int64_t nq = nc - c >= 4 ? 4 : 2;
      if (nq == 4) {
        _tile_zero(6);
        _tile_zero(7);
        _tile_loadd(2, b0 + 2 * vstep, vstride);
        _tile_dpbf16ps(6, 0, 2);
        _tile_loadd(3, b0 + 3 * vstep, vstride);
        _tile_dpbf16ps(7, 0, 3);
        if (second) {
          _tile_loadd(2, b1 + 2 * vstep, vstride);
          _tile_dpbf16ps(6, 1, 2);
          _tile_loadd(3, b1 + 3 * vstep, vstride);
          _tile_dpbf16ps(7, 1, 3);
        }
        _tile_stored(6, cs + 512, 64);
        _tile_stored(7, cs + 768, 64);
      }
      for (int64_t l = 0; l < nh; ++l) {
        float* o = a.out + (h0 + l) * Dh + 16 * c;
        const F bl = set1(v[l]);
        for (int64_t q = 0; q < nq; ++q)  // (the first block: 0·β + pv is pv, never -0)
          storeu(o + 16 * q, fb.first ? load(cs + q * 256 + l * 16)
                                      : loadu(o + 16 * q) * bl + load(cs + q * 256 + l * 16));
      }
    }
    fb.first = false;
  }
  _tile_release();
  fb.zero_out();  // (no keys)
  finish(jb, m, lsum, v);
}

// --- vdpbf16ps (AVX512_BF16 without AMX tiles) ---
//
// The tiles' operands (q and the keys bf16 values, none nonzero below 2^-56; the probabilities
// rounded to bf16): every product exact and every sum normal, so vdpbf16ps adds the canonical
// chains bit for bit when each step pairs its elements in the chains' order (simd.h's
// chain_order_words).
//   scores  lanes = heads: the query's dimension steps [Dh/32][16][16 heads] (once per call)
//           against each key's block of 32 dimensions in chain order, broadcast; 8 keys at once.
//   values  lanes = dimensions: each sub-block of 32 keys paired per dimension in chain order
//           [2][16][Dh/16][16] (once per block) against each head's probability steps
//           [2][16][16 heads], broadcast; 4 heads and 2 vectors of dimensions at once.

// Scores of keys [j, j + MR) (bf16 rows Dh apart) into z[.][16].
template <int MR>
inline void scores_dp(const uint16_t* rows, int64_t Dh, const int32_t* qC, int64_t j, float scale,
                      float* zj) {
  const __m512i perm = chain_order_words();
  alignas(64) int32_t kc[MR][16];
  F tot[MR], e[MR], o[MR];
#pragma GCC unroll 8
  for (int c = 0; c < MR; ++c) tot[c] = e[c] = o[c] = zero();
  for (int64_t b = 0; b < Dh / 32; ++b) {
#pragma GCC unroll 8
    for (int c = 0; c < MR; ++c)
      _mm512_store_si512(
          kc[c], _mm512_permutexvar_epi16(perm, _mm512_loadu_si512(rows + (j + c) * Dh + 32 * b)));
    asm volatile("" : : "r"(kc) : "memory");  // (broadcast from memory: linear_vec.cpp's GEMM)
#pragma GCC unroll 16
    for (int kk = 0; kk < 16; ++kk) {
      const __m512bh q = reinterpret_cast<__m512bh>(_mm512_load_si512(qC + (b * 16 + kk) * 16));
#pragma GCC unroll 8
      for (int c = 0; c < MR; ++c) {
        F& acc = kk & 1 ? o[c] : e[c];
        acc = _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(_mm512_set1_epi32(kc[c][kk])), q);
      }
    }
#pragma GCC unroll 8
    for (int c = 0; c < MR; ++c) {
      tot[c] = tot[c] + (e[c] + o[c]);
      zero_in_place(e[c]);
      zero_in_place(o[c]);
    }
  }
#pragma GCC unroll 8
  for (int c = 0; c < MR; ++c) store(zj + c * kLanes, tot[c] * set1(scale));
}

// Heads [l0, l0 + MH) and vectors of dimensions [c0, c0 + NV) of a block's values:
// out = first ? pv : out·β + pv, pv the sub-blocks' sums from +0.
template <int MH, int NV>
inline void values_dp(const int32_t* vC, const int32_t* pC, int64_t nc, int nsub, int64_t l0,
                      int64_t c0, float* out, int64_t Dh, const float* beta, bool first) {
  F pv[MH][NV], e[MH][NV], o[MH][NV];
#pragma GCC unroll 4
  for (int h = 0; h < MH; ++h)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) pv[h][v] = e[h][v] = o[h][v] = zero();
  for (int sb = 0; sb < nsub; ++sb) {
#pragma GCC unroll 16
    for (int kk = 0; kk < 16; ++kk) {
      __m512bh w[NV];
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v)
        w[v] =
            reinterpret_cast<__m512bh>(_mm512_load_si512(vC + ((sb * 16 + kk) * nc + c0 + v) * 16));
#pragma GCC unroll 4
      for (int h = 0; h < MH; ++h) {
        const __m512bh a =
            reinterpret_cast<__m512bh>(_mm512_set1_epi32(pC[(sb * 16 + kk) * 16 + l0 + h]));
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
          F& acc = kk & 1 ? o[h][v] : e[h][v];
          acc = _mm512_dpbf16_ps(acc, a, w[v]);
        }
      }
    }
#pragma GCC unroll 4
    for (int h = 0; h < MH; ++h)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        pv[h][v] = pv[h][v] + (e[h][v] + o[h][v]);
        zero_in_place(e[h][v]);
        zero_in_place(o[h][v]);
      }
  }
#pragma GCC unroll 4
  for (int h = 0; h < MH; ++h) {
    const F bl = set1(beta[l0 + h]);
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* oc = out + (l0 + h) * Dh + (c0 + v) * kLanes;
      storeu(oc, first ? pv[h][v] : _mm512_add_ps(_mm512_mul_ps(loadu(oc), bl), pv[h][v]));
    }
  }
}

// Row 32·sb + i of a block of nb rows (Dh apart from src), or null past nb.
inline const uint16_t* block_row(const uint16_t* src, int64_t Dh, int64_t nb, int64_t r) {
  return r < nb ? src + r * Dh : nullptr;
}

// The block's nb keys (bf16 rows at src) paired per dimension in chain order into vC; returns
// whether every value is 0 or at least 2^-56 in magnitude.
inline bool chain_pair_block(const uint16_t* src, int64_t Dh, int64_t nb, int nsub, int32_t* vC) {
  const int64_t nc = Dh / 16;
  const __m512i lo = _mm512_load_si512(kPairLo.data()),
                hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  __mmask32 bad = 0;
  for (int sb = 0; sb < nsub; ++sb)
    for (int kk = 0; kk < 16; ++kk) {
      const int64_t g = kk / 2, s = kk & 1;
      const uint16_t* r0 = block_row(src, Dh, nb, 32 * sb + 4 * g + 2 + s);  // (the low halves)
      const uint16_t* r1 = block_row(src, Dh, nb, 32 * sb + 4 * g + s);
      int32_t* dst = vC + (sb * 16 + kk) * nc * 16;
      for (int64_t c = 0; c < nc; c += 2) {  // 32 dimensions
        const __m512i x0 = r0 ? _mm512_loadu_si512(r0 + 16 * c) : _mm512_setzero_si512();
        const __m512i x1 = r1 ? _mm512_loadu_si512(r1 + 16 * c) : _mm512_setzero_si512();
        bad |= not_floored16(x0) | not_floored16(x1);
        _mm512_store_si512(dst + c * 16, _mm512_permutex2var_epi16(x0, lo, x1));
        _mm512_store_si512(dst + (c + 1) * 16, _mm512_permutex2var_epi16(x0, hi, x1));
      }
    }
  return bad == 0;
}

void run_group_dp(const Job& jb) {
  const SparseAttnArgs& a = *jb.a;
  const int64_t Dh = a.Dh, nk = a.nk, h0 = jb.h0, nh = jb.nh, nc = Dh / 16;
  float* qT = jb.scratch;                                         // [Dh][16] (a block on vectors)
  float* z = qT + Dh * kLanes;                                    // [nk][16]
  float* p = z + nk * kLanes;                                     // [64][16]
  float* v = p + kBlock * kLanes;                                 // [4][16]
  int32_t* qC = reinterpret_cast<int32_t*>(v + 4 * kLanes + 64);  // [Dh / 32][16][16]
  int32_t* pC = qC + Dh * 8;                                      // [2][16][16]
  uint16_t* kA = reinterpret_cast<uint16_t*>(pC + 512);           // [64][Dh]
  int32_t* vC = reinterpret_cast<int32_t*>(kA + 64 * Dh);         // [2][16][Dh / 16][16]
  float* k32 = reinterpret_cast<float*>(vC + 32 * Dh);            // [64][Dh]
  // qC: each head's dimensions of a block in the chains' order, in the block's column of that
  // head (the high halves of its floats: words 2·c + 1 for the chains' word c).
  query_steps(jb,
              _mm512_add_epi16(_mm512_add_epi16(chain_order_words(), chain_order_words()),
                               _mm512_set1_epi16(1)),
              reinterpret_cast<uint32_t*>(qC));
  VectorFallback fb{jb, qT, k32};
  F m = set1(-1e30f), lsum = zero();
  for (int64_t j0 = 0; j0 < nk; j0 += kBlock) {
    const int64_t nb = nk - j0 < kBlock ? nk - j0 : kBlock;
    const int nsub = nb > 32 ? 2 : 1;
    const uint16_t* const src = block_rows(a, j0, nb, kA);
    if (!chain_pair_block(src, Dh, nb, nsub, vC)) {
      // Keys the products would not take exactly: the block on vectors (the keys as fp32).
      fb.block(src, nb, z, p, v, &m, &lsum);
      continue;
    }
    int64_t j = 0;
    for (; j + 8 <= nb; j += 8) scores_dp<8>(src, Dh, qC, j, a.scale, z + j * kLanes);
    for (; j < nb; ++j) scores_dp<1>(src, Dh, qC, j, a.scale, z + j * kLanes);
    softmax_block(jb, z, nb, p, v, &m, &lsum);
    if (fb.values_if_tiny(src, nb, p, v)) continue;
    // pC: per step, each head's probabilities of the step's two keys (zero past nb).
    for (int sb = 0; sb < nsub; ++sb)
      for (int kk = 0; kk < 16; ++kk) {
        const int64_t r0 = 32 * sb + 4 * (kk / 2) + 2 + (kk & 1), r1 = r0 - 2;
        const __m512i p0 = r0 < nb ? loadui(p + r0 * kLanes) : _mm512_setzero_si512();
        const __m512i p1 = r1 < nb ? loadui(p + r1 * kLanes) : _mm512_setzero_si512();
        _mm512_store_si512(pC + (sb * 16 + kk) * 16,
                           _mm512_mask_blend_epi16(0x55555555, p1, _mm512_srli_epi32(p0, 16)));
      }
    float* const out = a.out + h0 * Dh;
    int64_t l = 0;
    for (; l + 4 <= nh; l += 4)
      for (int64_t c = 0; c < nc; c += 2)
        values_dp<4, 2>(vC, pC, nc, nsub, l, c, out, Dh, v, fb.first);
    for (; l < nh; ++l)
      for (int64_t c = 0; c < nc; c += 2)
        values_dp<1, 2>(vC, pC, nc, nsub, l, c, out, Dh, v, fb.first);
    fb.first = false;
  }
  fb.zero_out();  // (no keys)
  finish(jb, m, lsum, v);
}

void group(const Job& j) {
  if (j.amx) return run_group_amx(j);
  if (j.dp) return run_group_dp(j);
  run_group(j);
}

// Rows 2p and 2p + 1 interleaved value by value, 32 values of each at a time.
void pair_rows(const uint16_t* rows, int64_t n_pairs, int64_t Dh, uint16_t* out) {
  const __m512i lo = _mm512_load_si512(kPairLo.data()),
                hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
  for (int64_t p = 0; p < n_pairs; ++p) {
    const uint16_t* k0 = rows + 2 * p * Dh;
    const uint16_t* k1 = k0 + Dh;
    uint16_t* o = out + p * 2 * Dh;
    for (int64_t d = 0; d < Dh; d += 32) {
      const __m512i x0 = _mm512_loadu_si512(k0 + d), x1 = _mm512_loadu_si512(k1 + d);
      _mm512_storeu_si512(o + 2 * d, _mm512_permutex2var_epi16(x0, lo, x1));
      _mm512_storeu_si512(o + 2 * d + 32, _mm512_permutex2var_epi16(x0, hi, x1));
    }
  }
}

#else

void group(const Job& j) {
  run_group(j);
}

#endif

bool all_bf16_of(const float* x, int64_t n) {
  return all_bf16(x, n);
}

bool all_bf16_floored_of(const float* x, int64_t n) {
  return all_bf16_floored(x, n);
}

bool to_bf16_floored(const float* x, int64_t n, uint16_t* out) {
  return all_bf16_floored(x, n, out);
}

// --- indexer scores ---

inline float round_bf16_1(float f) {
  const uint32_t u = __builtin_bit_cast(uint32_t, f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return f;
  return __builtin_bit_cast(float, (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u);
}

// Scores of keys [t, t + KN) over HV vectors of heads (terms: scratch [KN][HV·kLanes]).
template <bool FM, int HV, int KN>
inline void score_keys(const IndexerScoreArgs& a, const float* qT, const float* w, int64_t t,
                       float* terms) {
  F acc[KN][HV];
  head_dots<FM, HV, KN>(a.keys, a.Di, qT, t, acc);
#pragma GCC unroll 4
  for (int c = 0; c < KN; ++c)
#pragma GCC unroll 8
    for (int v = 0; v < HV; ++v) {
      F d = acc[c][v];
      if (a.bf16) d = round_bf16(d);
      F term = max(zero(), d) * load(w + v * kLanes);
      if (a.bf16) term = round_bf16(term);
      store(terms + (c * HV + v) * kLanes, term);
    }
  for (int c = 0; c < KN; ++c) {  // the head sum, over the heads in order
    float s = 0;
    for (int64_t h = 0; h < a.Hi; ++h) s += terms[c * HV * kLanes + h];
    a.scores[t + c] = a.bf16 ? round_bf16_1(s) : s;
  }
}

template <bool FM, int HV>
void index_rows(const IndexerJob& j) {
  const IndexerScoreArgs& a = *j.a;
  const int64_t Di = a.Di, Hi = a.Hi;
  float* qT = j.scratch;             // [Di][HV*kLanes]
  float* w = qT + Di * HV * kLanes;  // [HV*kLanes]
  float* terms = w + HV * kLanes;    // [4][HV*kLanes]
  for (int64_t d = 0; d < Di; ++d)
    for (int64_t h = 0; h < HV * kLanes; ++h)
      qT[d * HV * kLanes + h] = h < Hi ? a.qi[h * Di + d] : 0;
  for (int64_t h = 0; h < HV * kLanes; ++h) w[h] = h < Hi ? a.w[h] : 0;
  constexpr int KN = HV <= 2 ? 4 : HV <= 4 ? 2 : 1;  // keys in flight, within the registers
  int64_t t = j.t0;
  for (; t + KN <= j.t1; t += KN) score_keys<FM, HV, KN>(a, qT, w, t, terms);
  for (; t < j.t1; ++t) score_keys<FM, HV, 1>(a, qT, w, t, terms);
}

constexpr int kMaxHv = int(kIndexerMaxHeads / kLanes);

template <int... H>
void index_hv(const IndexerJob& j, std::integer_sequence<int, H...>) {
  static constexpr void (*kRun[2][kMaxHv])(const IndexerJob&) = {{index_rows<false, H + 1>...},
                                                                 {index_rows<true, H + 1>...}};
  const int64_t hv = (j.a->Hi + kLanes - 1) / kLanes;
  kRun[j.fma][(hv < kMaxHv ? hv : kMaxHv) - 1](j);
}

void index_scores(const IndexerJob& j) {
  index_hv(j, std::make_integer_sequence<int, kMaxHv>());
}

}  // namespace

#if defined(__AVX512F__)
const Kernels kAvx512{group,           index_scores, all_bf16_of,         all_bf16_floored_of,
                      to_bf16_floored, pair_rows,    simd::avx512::kLanes};
#else
const Kernels kAvx2{group,           index_scores,      all_bf16_of,       all_bf16_floored_of,
                    to_bf16_floored, pair_key_rows_ref, simd::avx2::kLanes};
#endif

}  // namespace deepinfer::attention_isa
