// AVX-512 indexer scores (V41_SPEC.md §6.3) in the order of indexer_scores_ref, lane = head:
// every key element is broadcast against the transposed query (four keys at a time), each
// head's dot product is the canonical blocked sum, then bf16(relu(bf16(dot))·w_h) per head, and
// the head sum runs over the heads in order (scalar, per key).
// Only intrinsics over plain arrays here (cmake/deepinfer.cmake: no shared inline code).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/indexer_isa.h"

// GCC 12's intrinsic headers read deliberately undefined vectors (_mm512_undefined_*), which the
// uninitialized-use warnings report from inside the system headers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace deepinfer::indexer_isa {

namespace {

constexpr int64_t kLanes = 16;

template <bool FM>
inline __m512 madd(__m512 a, __m512 b, __m512 c) {
  if constexpr (FM)
    return _mm512_fmadd_ps(a, b, c);
  else
    return _mm512_add_ps(c, _mm512_mul_ps(a, b));
}

inline __m512 round_bf16(__m512 v) {  // RNE, finite values
  __m512i u = _mm512_castps_si512(v);
  u = _mm512_add_epi32(
      u, _mm512_add_epi32(_mm512_set1_epi32(0x7fff),
                          _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1))));
  return _mm512_castsi512_ps(_mm512_and_si512(u, _mm512_set1_epi32(int32_t(0xffff0000u))));
}

inline float round_bf16_1(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return f;
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&f, &u, 4);
  return f;
}

template <bool FM, int HV, int KN>
inline void score_keys(const IndexerScoreArgs& a, const float* qT, const float* w, int64_t t,
                       float* terms) {
  const int64_t Di = a.Di;
  const float* k[KN];
#pragma GCC unroll 4
  for (int c = 0; c < KN; ++c) k[c] = a.keys + (t + c) * Di;
  __m512 acc[KN][HV];
#pragma GCC unroll 4
  for (int c = 0; c < KN; ++c)
#pragma GCC unroll 4
    for (int v = 0; v < HV; ++v) acc[c][v] = _mm512_setzero_ps();
  for (int64_t b = 0; b < Di; b += 32) {
    __m512 p[KN][HV];
#pragma GCC unroll 4
    for (int c = 0; c < KN; ++c)
#pragma GCC unroll 4
      for (int v = 0; v < HV; ++v) p[c][v] = _mm512_setzero_ps();
#pragma GCC unroll 2
    for (int i = 0; i < 32; i += 2) {
#pragma GCC unroll 2
      for (int odd = 1; odd >= 0; --odd) {
        const int64_t d = b + i + odd;
        __m512 q[HV];
#pragma GCC unroll 4
        for (int v = 0; v < HV; ++v) q[v] = _mm512_load_ps(qT + (d * HV + v) * kLanes);
#pragma GCC unroll 4
        for (int c = 0; c < KN; ++c) {
          const __m512 kv = _mm512_set1_ps(k[c][d]);
#pragma GCC unroll 4
          for (int v = 0; v < HV; ++v) p[c][v] = madd<FM>(kv, q[v], p[c][v]);
        }
      }
    }
#pragma GCC unroll 4
    for (int c = 0; c < KN; ++c)
#pragma GCC unroll 4
      for (int v = 0; v < HV; ++v) acc[c][v] = _mm512_add_ps(acc[c][v], p[c][v]);
  }
  const __m512 zero = _mm512_setzero_ps();
#pragma GCC unroll 4
  for (int c = 0; c < KN; ++c)
#pragma GCC unroll 4
    for (int v = 0; v < HV; ++v) {
      __m512 d = acc[c][v];
      if (a.bf16) d = round_bf16(d);
      __m512 term = _mm512_mul_ps(_mm512_max_ps(zero, d), _mm512_load_ps(w + v * kLanes));
      if (a.bf16) term = round_bf16(term);
      _mm512_store_ps(terms + (c * HV + v) * kLanes, term);
    }
}

template <bool FM, int HV>
void run(const Job& j) {
  const IndexerScoreArgs& a = *j.a;
  const int64_t Di = a.Di, Hi = a.Hi;
  float* qT = j.scratch;             // [Di][HV*16]
  float* w = qT + Di * HV * kLanes;  // [HV*16]
  float* terms = w + HV * kLanes;    // [4][HV*16]
  for (int64_t d = 0; d < Di; ++d)
    for (int64_t h = 0; h < HV * kLanes; ++h)
      qT[d * HV * kLanes + h] = h < Hi ? a.qi[h * Di + d] : 0;
  for (int64_t h = 0; h < HV * kLanes; ++h) w[h] = h < Hi ? a.w[h] : 0;
  constexpr int KN = HV <= 2 ? 4 : 2;
  auto finish = [&](int64_t t, int kn) {
    for (int c = 0; c < kn; ++c) {
      float s = 0;
      for (int64_t h = 0; h < Hi; ++h) s += terms[c * HV * kLanes + h];
      a.scores[t + c] = a.bf16 ? round_bf16_1(s) : s;
    }
  };
  int64_t t = j.t0;
  for (; t + KN <= j.t1; t += KN) {
    score_keys<FM, HV, KN>(a, qT, w, t, terms);
    finish(t, KN);
  }
  for (; t < j.t1; ++t) {
    score_keys<FM, HV, 1>(a, qT, w, t, terms);
    finish(t, 1);
  }
}

template <bool FM>
void run_hv(const Job& j) {
  switch ((j.a->Hi + kLanes - 1) / kLanes) {
    case 1:
      return run<FM, 1>(j);
    case 2:
      return run<FM, 2>(j);
    case 3:
      return run<FM, 3>(j);
    default:
      return run<FM, 4>(j);
  }
}

}  // namespace

void scores_avx512(const Job& j) {
  if (j.fma)
    run_hv<true>(j);
  else
    run_hv<false>(j);
}

}  // namespace deepinfer::indexer_isa
