// AVX-512 versions of kernels/elementwise.h's exp, RMS and SwiGLU, bit for bit the scalar code's
// floats. Only intrinsics over plain arrays here (cmake/deepinfer.cmake: no shared inline code).
//
// exp in double (range reduction by ln 2 in two parts, Taylor's polynomial to degree 13 on
// |r| <= ln 2 / 2 by Estrin's scheme: a few units in the last place of a double), then the
// caller's formula in double, rounded to float. A lane whose double lies within 2^-44 of its size
// from a float midpoint (about one in a million), or whose argument is out of the range served,
// takes the scalar formula with the library's exp. The vector's error and the library's (glibc:
// 0.52 units in the last place) are both far below that margin, so both round to the same float.
#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "kernels/isa.h"

namespace deepinfer::elementwise_isa {

namespace {

// e^x for x in [-104, 80] (callers clamp).
inline __m512d exp_pd(__m512d x) {
  static constexpr double kCoef[14] = {1.0,
                                       1.0,
                                       1.0 / 2,
                                       1.0 / 6,
                                       1.0 / 24,
                                       1.0 / 120,
                                       1.0 / 720,
                                       1.0 / 5040,
                                       1.0 / 40320,
                                       1.0 / 362880,
                                       1.0 / 3628800,
                                       1.0 / 39916800,
                                       1.0 / 479001600,
                                       1.0 / 6227020800.0};
  const __m512d k = _mm512_roundscale_pd(_mm512_mul_pd(x, _mm512_set1_pd(0x1.71547652b82fep0)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512d r = _mm512_fnmadd_pd(k, _mm512_set1_pd(6.93147180369123816490e-01), x);
  r = _mm512_fnmadd_pd(k, _mm512_set1_pd(1.90821492927058770002e-10), r);
  auto c = [](int i) { return _mm512_set1_pd(kCoef[i]); };
  const __m512d r2 = _mm512_mul_pd(r, r), r4 = _mm512_mul_pd(r2, r2), r8 = _mm512_mul_pd(r4, r4);
  const __m512d p01 = _mm512_fmadd_pd(c(1), r, c(0)), p23 = _mm512_fmadd_pd(c(3), r, c(2)),
                p45 = _mm512_fmadd_pd(c(5), r, c(4)), p67 = _mm512_fmadd_pd(c(7), r, c(6)),
                p89 = _mm512_fmadd_pd(c(9), r, c(8)), pab = _mm512_fmadd_pd(c(11), r, c(10)),
                pcd = _mm512_fmadd_pd(c(13), r, c(12));
  const __m512d q03 = _mm512_fmadd_pd(p23, r2, p01), q47 = _mm512_fmadd_pd(p67, r2, p45),
                q8b = _mm512_fmadd_pd(pab, r2, p89);
  const __m512d s07 = _mm512_fmadd_pd(q47, r4, q03), s8d = _mm512_fmadd_pd(pcd, r4, q8b);
  return _mm512_scalef_pd(_mm512_fmadd_pd(s8d, r8, s07), k);
}

// Lanes where y (double) lies within 2^-44·max(|y|, 2^-150) of a midpoint between f = float(y)
// and one of its neighbours.
inline __mmask8 near_midpoint(__m512d y, __m256 f) {
  const __m512d absmask = _mm512_castsi512_pd(_mm512_set1_epi64(0x7fffffffffffffff));
  const __m512d ay = _mm512_and_pd(y, absmask);
  const __m256i fb = _mm256_and_si256(_mm256_castps_si256(f), _mm256_set1_epi32(0x7fffffff));
  const __m512d fd = _mm512_cvtps_pd(_mm256_castsi256_ps(fb));
  const __m512d up =
      _mm512_cvtps_pd(_mm256_castsi256_ps(_mm256_add_epi32(fb, _mm256_set1_epi32(1))));
  const __m512d dn = _mm512_cvtps_pd(_mm256_castsi256_ps(
      _mm256_max_epi32(_mm256_sub_epi32(fb, _mm256_set1_epi32(1)), _mm256_setzero_si256())));
  const __m512d half = _mm512_set1_pd(0.5);
  const __m512d tol =
      _mm512_mul_pd(_mm512_max_pd(ay, _mm512_set1_pd(0x1p-150)), _mm512_set1_pd(0x1p-44));
  const __m512d d_up = _mm512_sub_pd(ay, _mm512_mul_pd(_mm512_add_pd(fd, up), half));
  const __m512d d_dn = _mm512_sub_pd(ay, _mm512_mul_pd(_mm512_add_pd(fd, dn), half));
  return _mm512_cmp_pd_mask(_mm512_and_pd(d_up, absmask), tol, _CMP_LE_OQ) |
         _mm512_cmp_pd_mask(_mm512_and_pd(d_dn, absmask), tol, _CMP_LE_OQ);
}

inline float lane(__m256 v, int l) {
  return _mm256_cvtss_f32(_mm256_permutexvar_ps(_mm256_set1_epi32(l), v));
}

// The scalar formulas (kernels/elementwise.h's exp_f and sigmoid_d), for the lanes the vectors
// leave.
inline float exp_f1(float x) {
  return float(std::exp(double(x)));
}
inline float silu1(float g) {
  return float(double(g) * (1.0 / (1.0 + std::exp(-double(g)))));
}

// rms_inv of R rows of d values (ld apart): each row's 16 lanes of squares as two vectors of
// doubles (lane j over elements j, j+16, ... in order; a square of a float is exact in double, so
// the fused multiply-add is the scalar code's add), folded pairwise (8, 4, 2, 1) as the scalar
// code folds them. R rows at once so that their 2R chains overlap.
template <int R>
inline void rms_inv_r(const float* x, int64_t ld, int64_t d, float eps, float* out) {
  __m512d a[R], b[R];
  for (int r = 0; r < R; ++r) a[r] = b[r] = _mm512_setzero_pd();
  int64_t k = 0;
  for (; k + 16 <= d; k += 16)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512d lo = _mm512_cvtps_pd(_mm256_loadu_ps(x + r * ld + k));
      const __m512d hi = _mm512_cvtps_pd(_mm256_loadu_ps(x + r * ld + k + 8));
      a[r] = _mm512_fmadd_pd(lo, lo, a[r]);
      b[r] = _mm512_fmadd_pd(hi, hi, b[r]);
    }
  for (int r = 0; r < R; ++r) {
    alignas(64) double lane[16];
    _mm512_store_pd(lane, a[r]);
    _mm512_store_pd(lane + 8, b[r]);
    for (int64_t i = k; i < d; ++i) lane[i & 15] += double(x[r * ld + i]) * double(x[r * ld + i]);
    for (int w = 8; w >= 1; w /= 2)
      for (int j = 0; j < w; ++j) lane[j] += lane[j + w];
    const float mean = float(lane[0] / double(d));
    out[r] = float(1.0 / std::sqrt(double(mean + eps)));
  }
}

}  // namespace

void rms_inv_rows_avx512(const float* x, int64_t n, int64_t ld, int64_t d, float eps, float* out) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) rms_inv_r<4>(x + i * ld, ld, d, eps, out + i);
  for (; i < n; ++i) rms_inv_r<1>(x + i * ld, ld, d, eps, out + i);
}

void rmsnorm_avx512(float* x, int64_t n, int64_t d, const uint16_t* w, float eps) {
  for (int64_t i0 = 0; i0 < n; i0 += 16) {
    const int64_t m = n - i0 < 16 ? n - i0 : 16;
    float r[16];
    rms_inv_rows_avx512(x + i0 * d, m, d, d, eps, r);
    for (int64_t i = 0; i < m; ++i) {
      float* xi = x + (i0 + i) * d;
      const __m512 ri = _mm512_set1_ps(r[i]);
      int64_t k = 0;
      for (; k + 16 <= d; k += 16) {  // w · (x · r), two roundings
        const __m512 wk = _mm512_castsi512_ps(_mm512_slli_epi32(
            _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + k))),
            16));
        _mm512_storeu_ps(xi + k, _mm512_mul_ps(wk, _mm512_mul_ps(_mm512_loadu_ps(xi + k), ri)));
      }
      for (; k < d; ++k) {
        const float wk = __builtin_bit_cast(float, uint32_t(w[k]) << 16);
        xi[k] = wk * (xi[k] * r[i]);
      }
    }
  }
}

void exp_f_n_avx512(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 xf = _mm256_loadu_ps(x + i);
    const __m512d xd = _mm512_cvtps_pd(xf);
    const __mmask8 slow = _mm512_cmp_pd_mask(xd, _mm512_set1_pd(80.0), _CMP_NLE_UQ);  // or NaN
    const __mmask8 under = _mm512_cmp_pd_mask(xd, _mm512_set1_pd(-104.0), _CMP_LT_OQ);
    const __m512d y =
        exp_pd(_mm512_min_pd(_mm512_max_pd(xd, _mm512_set1_pd(-104.0)), _mm512_set1_pd(80.0)));
    const __m256 f = _mm512_cvtpd_ps(y);
    // Below -104 the value is 0 (exp(-104) < 2^-150).
    _mm256_storeu_ps(x + i, _mm256_mask_mov_ps(f, under, _mm256_setzero_ps()));
    const __mmask8 lib = (slow | near_midpoint(y, f)) & __mmask8(~under);
    if (lib)
      for (int l = 0; l < 8; ++l)
        if (lib >> l & 1) x[i + l] = exp_f1(lane(xf, l));
  }
  for (; i < n; ++i) x[i] = exp_f1(x[i]);
}

void swiglu_avx512(float* g, const float* u, int64_t n, float limit, float weight) {
  const __m256 lim = _mm256_set1_ps(limit), neg = _mm256_set1_ps(-limit),
               w = _mm256_set1_ps(weight);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 gf = _mm256_loadu_ps(g + i), uf = _mm256_loadu_ps(u + i);
    if (limit > 0) {  // std::min(g, limit), std::max(-limit, std::min(u, limit))
      gf = _mm256_min_ps(lim, gf);
      uf = _mm256_max_ps(_mm256_min_ps(lim, uf), neg);
    }
    const __m512d gd = _mm512_cvtps_pd(gf);
    const __m512d ag =
        _mm512_and_pd(gd, _mm512_castsi512_pd(_mm512_set1_epi64(0x7fffffffffffffff)));
    const __mmask8 slow = _mm512_cmp_pd_mask(ag, _mm512_set1_pd(80.0), _CMP_NLE_UQ);  // or NaN
    const __m512d e = exp_pd(
        _mm512_min_pd(_mm512_max_pd(_mm512_sub_pd(_mm512_setzero_pd(), gd), _mm512_set1_pd(-80.0)),
                      _mm512_set1_pd(80.0)));
    const __m512d t = _mm512_mul_pd(
        gd, _mm512_div_pd(_mm512_set1_pd(1.0), _mm512_add_pd(_mm512_set1_pd(1.0), e)));
    __m256 silu = _mm512_cvtpd_ps(t);
    const __mmask8 lib = slow | near_midpoint(t, silu);
    if (lib) {
      alignas(32) float s[8], gs[8];
      _mm256_store_ps(s, silu);
      _mm256_store_ps(gs, gf);
      for (int l = 0; l < 8; ++l)
        if (lib >> l & 1) s[l] = silu1(gs[l]);
      silu = _mm256_load_ps(s);
    }
    _mm256_storeu_ps(g + i, _mm256_mul_ps(w, _mm256_mul_ps(silu, uf)));
  }
  for (; i < n; ++i) {
    float gi = g[i], ui = u[i];
    if (limit > 0) {  // (std::min and std::max, written out: no shared inline code here)
      gi = limit < gi ? limit : gi;
      ui = limit < ui ? limit : ui;
      ui = -limit < ui ? ui : -limit;
    }
    g[i] = weight * (silu1(gi) * ui);
  }
}

}  // namespace deepinfer::elementwise_isa
