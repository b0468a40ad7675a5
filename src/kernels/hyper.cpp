#include "kernels/hyper.h"

#include <algorithm>
#include <vector>

#include "core/error.h"
#include "core/thread_pool.h"
#include "kernels/elementwise.h"

namespace deepinfer {

namespace {
constexpr int64_t kChunk = 256;  // elements summed at once by hc_pre / hc_post

// The mix coefficients of one token from its projections m[(2+M)M] (not yet scaled by rho, the
// rms_inv of its copies).
void mixes_from_projections(const HcParams& p, float rho, float* m, float* pre, float* post,
                            float* comb) {
  const int64_t M = p.M, n_mix = (2 + M) * M;
  for (int64_t i = 0; i < n_mix; ++i) m[i] = m[i] * rho;  // project first, then scale
  for (int64_t c = 0; c < M; ++c) {
    pre[c] = f32(sigmoid_d(m[c] * p.scale[0] + p.base[c])) + p.hc_eps;
    post[c] = 2.0f * f32(sigmoid_d(m[M + c] * p.scale[1] + p.base[M + c]));
  }
  for (int64_t i = 0; i < M * M; ++i) comb[i] = m[2 * M + i] * p.scale[2] + p.base[2 * M + i];
  sinkhorn(comb, M, p.sinkhorn_iters, p.hc_eps);
}

// out[d] = wy · y[d] (none without y) + Σ_c w[c · w_stride] · x_c[d] for d < D, over the copies
// x_c = x + c·D in order, summed in double and rounded once. Elementwise over d, so vector code
// computes exactly what scalar code does; also built for AVX-512 and AVX2, picked when the
// program loads.
#define DEEPINFER_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
DEEPINFER_VECTOR_CLONES
void mix_copies(const float* y, double wy, const float* x, const float* w, int64_t w_stride,
                int64_t M, int64_t D, float* out) {
  for (int64_t d0 = 0; d0 < D; d0 += kChunk) {
    const int64_t n = std::min(kChunk, D - d0);
    double s[kChunk];
    if (y)
      for (int64_t d = 0; d < n; ++d) s[d] = wy * y[d0 + d];
    else
      for (int64_t d = 0; d < n; ++d) s[d] = 0;
    for (int64_t c = 0; c < M; ++c) {
      const double wc = w[c * w_stride];
      const float* xc = x + c * D + d0;
      for (int64_t d = 0; d < n; ++d) s[d] += wc * xc[d];
    }
    for (int64_t d = 0; d < n; ++d) out[d0 + d] = float(s[d]);
  }
}

// mix_copies for the four copies of V4.1 (hc_mult 4): hc_pre's one output, or all four of
// hc_post's from one read of the copies (each position's copies converted to double once, the
// sums kept in registers), each the same terms in the same order as mix_copies.
DEEPINFER_VECTOR_CLONES
void pre4(const float* __restrict x, const float* pi, int64_t D, float* __restrict out) {
  const double w0 = pi[0], w1 = pi[1], w2 = pi[2], w3 = pi[3];
  for (int64_t d = 0; d < D; ++d)
    out[d] = float((((0.0 + w0 * x[d]) + w1 * x[D + d]) + w2 * x[2 * D + d]) + w3 * x[3 * D + d]);
}
DEEPINFER_VECTOR_CLONES
void post4(const float* __restrict y, const float* __restrict x, const float* post,
           const float* comb, int64_t D, float* __restrict out) {
  double c[16], p[4];
  for (int i = 0; i < 16; ++i) c[i] = comb[i];
  for (int i = 0; i < 4; ++i) p[i] = post[i];
  for (int64_t d = 0; d < D; ++d) {
    const double yv = y[d], x0 = x[d], x1 = x[D + d], x2 = x[2 * D + d], x3 = x[3 * D + d];
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k)
      out[k * D + d] =
          float((((p[k] * yv + c[k] * x0) + c[4 + k] * x1) + c[8 + k] * x2) + c[12 + k] * x3);
  }
}

}  // namespace

void sinkhorn(float* c, int64_t M, int iters, float eps) {
  // Row softmax (+ eps), then column normalisation; then (iters - 1) rounds of row and column
  // normalisation (iters >= 1). fp32 results at every step.
  for (int64_t j = 0; j < M; ++j) {
    float* row = c + j * M;
    const float mx = *std::max_element(row, row + M);
    for (int64_t k = 0; k < M; ++k) row[k] = exp_f(row[k] - mx);
  }
  for (int it = 0; it < iters; ++it) {
    for (int64_t j = 0; j < M; ++j) {  // rows (the first round ends the softmax, + eps)
      float* row = c + j * M;
      const float s = f32(sum_f64(row, M));
      for (int64_t k = 0; k < M; ++k) row[k] = it == 0 ? (row[k] / s) + eps : row[k] / (s + eps);
    }
    for (int64_t k = 0; k < M; ++k) {  // columns
      double s = 0;
      for (int64_t j = 0; j < M; ++j) s += c[j * M + k];
      const float d = f32(s) + eps;
      for (int64_t j = 0; j < M; ++j) c[j * M + k] = c[j * M + k] / d;
    }
  }
}

void hc_mixes_rows(const HcParams& p, const float* x, int64_t n, float* pre, float* post,
                   float* comb) {
  const int64_t M = p.M, MD = p.M * p.D, n_mix = (2 + M) * M;
  DI_CHECK(M <= kMaxHcMult, "hc_mult ", M, " above ", kMaxHcMult);
  thread_local std::vector<float> t_proj;  // reused: no allocation once it is large enough
  t_proj.resize(size_t(n * n_mix));
  float* proj = t_proj.data();  // this thread's buffer, also read by the pool's tasks below
  if (p.exact) {
    const float* fn = p.fn->weight().f32();  // [n_mix, MD]
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = 0; i < n_mix; ++i)
        proj[r * n_mix + i] = dot_f64(fn + i * MD, x + r * MD, MD);
  } else {
    linear(*p.fn, x, n, proj);  // F32: a plain linear in the canonical order; read once
  }
  ThreadPool::global().parallel_for(n, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t b = r0; b < r1; b += 16) {  // the RMS of 16 rows at a time
      const int64_t e = std::min(r1, b + 16);
      float rho[16];
      rms_inv_rows(x + b * MD, e - b, MD, MD, p.norm_eps, rho);
      for (int64_t r = b; r < e; ++r)
        mixes_from_projections(p, rho[r - b], proj + r * n_mix, pre + r * M, post + r * M,
                               comb + r * M * M);
    }
  });
}

void hc_pre(const float* x, const float* pi, int64_t M, int64_t D, float* out) {
  if (M == 4) return pre4(x, pi, D, out);
  mix_copies(nullptr, 0.0, x, pi, 1, M, D, out);
}

void hc_post(const float* y, const float* x, const float* post, const float* comb, int64_t M,
             int64_t D, float* out) {
  // Output copy k mixes the input copies with column k of comb.
  if (M == 4) return post4(y, x, post, comb, D, out);
  for (int64_t k = 0; k < M; ++k) mix_copies(y, post[k], x, comb + k, M, M, D, out + k * D);
}

}  // namespace deepinfer
