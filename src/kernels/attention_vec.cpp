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

// Scores of keys [j, j + KN) into z[.][kLanes].
template <bool FM, int KN>
inline void scores(const SparseAttnArgs& a, const float* qT, int64_t j, float* z) {
  F acc[KN][1];
  head_dots<FM, 1, KN>(a.keys, a.Dh, qT, j, acc);
#pragma GCC unroll 4
  for (int c = 0; c < KN; ++c) store(z + (j + c) * kLanes, acc[c][0] * set1(a.scale));
}

// A_h = A_h·β_h + Σ_j p_j,h·k_j for keys [j0, j0 + nb) and dimensions [d, d + NV·kLanes).
template <bool FM, int NV>
inline void values_at(const SparseAttnArgs& a, float* o, int64_t l, int64_t d, int64_t j0,
                      int64_t nb, const float* p, F bl) {
  F pv[NV] = {};
  for (int64_t j = 0; j < nb; ++j) {
    const F pj = set1(p[j * kLanes + l]);
    const float* k = a.keys + (j0 + j) * a.Dh + d;
#pragma GCC unroll 8
    for (int c = 0; c < NV; ++c) pv[c] = madd<FM>(pj, loadu(k + kLanes * c), pv[c]);
  }
#pragma GCC unroll 8
  for (int c = 0; c < NV; ++c) {
    float* oc = o + d + kLanes * c;
    storeu(oc, loadu(oc) * bl + pv[c]);
  }
}

template <bool FM>
inline void values(const SparseAttnArgs& a, int64_t h0, int64_t nh, int64_t j0, int64_t nb,
                   const float* p, const float* beta) {
  const int64_t Dh = a.Dh;
  for (int64_t l = 0; l < nh; ++l) {
    float* o = a.out + (h0 + l) * Dh;
    const F bl = set1(beta[l]);
    int64_t d = 0;
    for (; d + 8 * kLanes <= Dh; d += 8 * kLanes) values_at<FM, 8>(a, o, l, d, j0, nb, p, bl);
    // Dh is a multiple of 32.
    for (; d < Dh; d += 32) values_at<FM, 32 / kLanes>(a, o, l, d, j0, nb, p, bl);
  }
}

template <bool FQK, bool FPV>
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
  for (; j + 4 <= nk; j += 4) scores<FQK, 4>(a, qT, j, z);
  for (; j < nk; ++j) scores<FQK, 1>(a, qT, j, z);

  for (int64_t l = 0; l < nh; ++l)
    for (int64_t d = 0; d < Dh; ++d) a.out[(h0 + l) * Dh + d] = 0.0f;
  F m = set1(-1e30f), lsum = zero();
  for (int64_t j0 = 0; j0 < nk; j0 += kBlock) {
    const int64_t nb = nk - j0 < kBlock ? nk - j0 : kBlock;
    F m_new = m;
    for (int64_t jj = 0; jj < nb; ++jj) m_new = max(load(z + (j0 + jj) * kLanes), m_new);
    store(v, m - m_new);
    for (int64_t jj = 0; jj < nb; ++jj)
      store(p + jj * kLanes, load(z + (j0 + jj) * kLanes) - m_new);
    jb.exp_n(v, kLanes);
    jb.exp_n(p, nb * kLanes);
    const F beta = load(v);
    // Σp in the 16-lane order over j (canonical_sum), for all heads at once.
    F s[16] = {};
    for (int64_t jj = 0; jj < nb; ++jj) s[jj & 15] = s[jj & 15] + load(p + jj * kLanes);
#pragma GCC unroll 4
    for (int w = 8; w >= 1; w /= 2)
#pragma GCC unroll 8
      for (int q = 0; q < w; ++q) s[q] = s[q] + s[q + w];
    lsum = lsum * beta + s[0];
    if (a.bf16_probs)
      for (int64_t jj = 0; jj < nb; ++jj) store(p + jj * kLanes, round_bf16(load(p + jj * kLanes)));
    values<FPV>(a, h0, nh, j0, nb, p, v);
    m = m_new;
  }
  float sink[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) sink[l] = l < nh ? a.sink[h0 + l] : 0.0f;
  store(v, loadu(sink) - m);
  jb.exp_n(v, kLanes);
  store(v, lsum + load(v));
  for (int64_t l = 0; l < nh; ++l) {
    float* o = a.out + (h0 + l) * Dh;
    const F ll = set1(v[l]);
    for (int64_t d = 0; d < Dh; d += kLanes) storeu(o + d, loadu(o + d) / ll);
  }
}

void group(const Job& j) {
  static constexpr void (*kRun[2][2])(const Job&) = {
      {run_group<false, false>, run_group<false, true>},
      {run_group<true, false>, run_group<true, true>}};
  kRun[j.fma_qk][j.fma_pv](j);
}

bool all_bf16_of(const float* x, int64_t n) {
  return all_bf16(x, n);
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
const Kernels kAvx512{group, index_scores, all_bf16_of, simd::avx512::kLanes};
#else
const Kernels kAvx2{group, index_scores, all_bf16_of, simd::avx2::kLanes};
#endif

}  // namespace deepinfer::attention_isa
