// AVX2 sparse attention for a group of up to 8 heads of one query, lane = head: the algorithm of
// attention_avx512.cpp with 8-lane vectors, in the order of sparse_attention_ref
// (kernels/attention.cpp):
//   scores  z_j = (Σ over 32-blocks of the block's pair-ordered partial) · τ, four keys at a time
//           against the transposed query (every key element broadcast to the 16 heads);
//   softmax per block of 64 keys: running max, β = exp(m - m'), p_j = exp(z_j - m') (the
//           reference's double exp, out of line), Σp in the 16-lane order over j, l = l·β + Σp;
//   values  per head, A = A·β + Σ_j p_j·k_j over 128 dimensions at a time (keys are the values).
// Only intrinsics over plain arrays here (cmake/deepinfer.cmake: no shared inline code).
#include <immintrin.h>

#include <cstdint>

#include "kernels/attention_isa.h"

// GCC 12's intrinsic headers read deliberately undefined vectors (_mm512_undefined_*), which the
// uninitialized-use warnings report from inside the system headers.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace deepinfer::attention_isa {

namespace {

constexpr int64_t kLanes = 8, kBlock = 64;

template <bool FM>
inline __m256 madd(__m256 a, __m256 b, __m256 c) {
  if constexpr (FM)
    return _mm256_fmadd_ps(a, b, c);
  else
    return _mm256_add_ps(c, _mm256_mul_ps(a, b));
}

// round_bf16 (RNE) of finite values.
inline __m256 round_bf16(__m256 v) {
  __m256i u = _mm256_castps_si256(v);
  u = _mm256_add_epi32(
      u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff),
                          _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1))));
  return _mm256_castsi256_ps(_mm256_and_si256(u, _mm256_set1_epi32(int32_t(0xffff0000u))));
}

// Scores of keys [j, j + KN) into z[.][8].
template <bool FM, int KN>
inline void scores(const SparseAttnArgs& a, const float* qT, int64_t j, float* z) {
  const int64_t Dh = a.Dh;
  const float* k[KN];
#pragma GCC unroll 4
  for (int c = 0; c < KN; ++c) k[c] = a.keys + (j + c) * Dh;
  __m256 acc[KN];
#pragma GCC unroll 4
  for (int c = 0; c < KN; ++c) acc[c] = _mm256_setzero_ps();
  for (int64_t b = 0; b < Dh; b += 32) {
    __m256 p[KN];
#pragma GCC unroll 4
    for (int c = 0; c < KN; ++c) p[c] = _mm256_setzero_ps();
#pragma GCC unroll 16
    for (int i = 0; i < 32; i += 2) {
      const __m256 q1 = _mm256_load_ps(qT + (b + i + 1) * kLanes);
      const __m256 q0 = _mm256_load_ps(qT + (b + i) * kLanes);
#pragma GCC unroll 4
      for (int c = 0; c < KN; ++c) {
        p[c] = madd<FM>(_mm256_set1_ps(k[c][b + i + 1]), q1, p[c]);
        p[c] = madd<FM>(_mm256_set1_ps(k[c][b + i]), q0, p[c]);
      }
    }
#pragma GCC unroll 4
    for (int c = 0; c < KN; ++c) acc[c] = _mm256_add_ps(acc[c], p[c]);
  }
  const __m256 tau = _mm256_set1_ps(a.scale);
#pragma GCC unroll 4
  for (int c = 0; c < KN; ++c) _mm256_store_ps(z + (j + c) * kLanes, _mm256_mul_ps(acc[c], tau));
}

// A_h = A_h·β_h + Σ_j p_j,h·k_j for keys [j0, j0 + nb), 64 dimensions at a time.
template <bool FM>
inline void values(const SparseAttnArgs& a, int64_t h0, int64_t nh, int64_t j0, int64_t nb,
                   const float* p, const float* beta) {
  const int64_t Dh = a.Dh;
  for (int64_t l = 0; l < nh; ++l) {
    float* o = a.out + (h0 + l) * Dh;
    const __m256 bl = _mm256_set1_ps(beta[l]);
    int64_t d = 0;
    for (; d + 64 <= Dh; d += 64) {
      __m256 pv[8];
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) pv[c] = _mm256_setzero_ps();
      for (int64_t j = 0; j < nb; ++j) {
        const __m256 pj = _mm256_set1_ps(p[j * kLanes + l]);
        const float* k = a.keys + (j0 + j) * Dh + d;
#pragma GCC unroll 8
        for (int c = 0; c < 8; ++c) pv[c] = madd<FM>(pj, _mm256_loadu_ps(k + 8 * c), pv[c]);
      }
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        const __m256 ov = _mm256_loadu_ps(o + d + 8 * c);
        _mm256_storeu_ps(o + d + 8 * c, _mm256_add_ps(_mm256_mul_ps(ov, bl), pv[c]));
      }
    }
    for (; d < Dh; d += 32) {  // Dh is a multiple of 32
      __m256 pv[4];
      for (int c = 0; c < 4; ++c) pv[c] = _mm256_setzero_ps();
      for (int64_t j = 0; j < nb; ++j) {
        const __m256 pj = _mm256_set1_ps(p[j * kLanes + l]);
        const float* k = a.keys + (j0 + j) * Dh + d;
        for (int c = 0; c < 4; ++c) pv[c] = madd<FM>(pj, _mm256_loadu_ps(k + 8 * c), pv[c]);
      }
      for (int c = 0; c < 4; ++c)
        _mm256_storeu_ps(o + d + 8 * c,
                         _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(o + d + 8 * c), bl), pv[c]));
    }
  }
}

template <bool FQK, bool FPV>
void run_group(const Job& jb) {
  const SparseAttnArgs& a = *jb.a;
  const int64_t Dh = a.Dh, nk = a.nk, h0 = jb.h0, nh = jb.nh;
  float* qT = jb.scratch;          // [Dh][8]
  float* z = qT + Dh * kLanes;     // [nk][8]
  float* p = z + nk * kLanes;      // [64][8]
  float* v = p + kBlock * kLanes;  // [4][8]
  for (int64_t d = 0; d < Dh; ++d)
    for (int64_t l = 0; l < kLanes; ++l) qT[d * kLanes + l] = l < nh ? a.q[(h0 + l) * Dh + d] : 0;
  int64_t j = 0;
  for (; j + 4 <= nk; j += 4) scores<FQK, 4>(a, qT, j, z);
  for (; j < nk; ++j) scores<FQK, 1>(a, qT, j, z);

  for (int64_t l = 0; l < nh; ++l)
    for (int64_t d = 0; d < Dh; ++d) a.out[(h0 + l) * Dh + d] = 0.0f;
  __m256 m = _mm256_set1_ps(-1e30f), lsum = _mm256_setzero_ps();
  for (int64_t j0 = 0; j0 < nk; j0 += kBlock) {
    const int64_t nb = nk - j0 < kBlock ? nk - j0 : kBlock;
    __m256 m_new = m;
    for (int64_t jj = 0; jj < nb; ++jj)
      m_new = _mm256_max_ps(_mm256_load_ps(z + (j0 + jj) * kLanes), m_new);
    _mm256_store_ps(v, _mm256_sub_ps(m, m_new));
    for (int64_t jj = 0; jj < nb; ++jj)
      _mm256_store_ps(p + jj * kLanes,
                      _mm256_sub_ps(_mm256_load_ps(z + (j0 + jj) * kLanes), m_new));
    jb.exp_n(v, kLanes);
    jb.exp_n(p, nb * kLanes);
    const __m256 beta = _mm256_load_ps(v);
    // Σp in the 16-lane order over j (canonical_sum), for all heads at once.
    __m256 s[16];
#pragma GCC unroll 16
    for (int q = 0; q < 16; ++q) s[q] = _mm256_setzero_ps();
    for (int64_t jj = 0; jj < nb; ++jj)
      s[jj & 15] = _mm256_add_ps(s[jj & 15], _mm256_load_ps(p + jj * kLanes));
#pragma GCC unroll 4
    for (int w = 8; w >= 1; w /= 2)
#pragma GCC unroll 8
      for (int q = 0; q < w; ++q) s[q] = _mm256_add_ps(s[q], s[q + w]);
    lsum = _mm256_add_ps(_mm256_mul_ps(lsum, beta), s[0]);
    if (a.bf16_probs)
      for (int64_t jj = 0; jj < nb; ++jj)
        _mm256_store_ps(p + jj * kLanes, round_bf16(_mm256_load_ps(p + jj * kLanes)));
    values<FPV>(a, h0, nh, j0, nb, p, v);
    m = m_new;
  }
  float sink[kLanes];
  for (int64_t l = 0; l < kLanes; ++l) sink[l] = l < nh ? a.sink[h0 + l] : 0.0f;
  _mm256_store_ps(v, _mm256_sub_ps(_mm256_loadu_ps(sink), m));
  jb.exp_n(v, kLanes);
  _mm256_store_ps(v, _mm256_add_ps(lsum, _mm256_load_ps(v)));
  for (int64_t l = 0; l < nh; ++l) {
    float* o = a.out + (h0 + l) * Dh;
    const __m256 ll = _mm256_set1_ps(v[l]);
    for (int64_t d = 0; d < Dh; d += 8)
      _mm256_storeu_ps(o + d, _mm256_div_ps(_mm256_loadu_ps(o + d), ll));
  }
}

}  // namespace

void group_avx2(const Job& j) {
  if (j.fma_qk)
    j.fma_pv ? run_group<true, true>(j) : run_group<true, false>(j);
  else
    j.fma_pv ? run_group<false, true>(j) : run_group<false, false>(j);
}

bool all_bf16_avx2(const float* x, int64_t n) {
  __m256i acc = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    acc = _mm256_or_si256(acc, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)));
  acc = _mm256_and_si256(acc, _mm256_set1_epi32(0xffff));
  uint32_t low = _mm256_testz_si256(acc, acc) ? 0u : 1u;
  for (; i < n; ++i) {
    uint32_t u;
    __builtin_memcpy(&u, x + i, 4);
    low |= u & 0xffffu;
  }
  return low == 0;
}

}  // namespace deepinfer::attention_isa
