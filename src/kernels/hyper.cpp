#include "kernels/hyper.h"

#include <cmath>

#include "core/error.h"
#include "kernels/elementwise.h"
#include "kernels/norm.h"
#include "kernels/reduce.h"

namespace deepinfer {

namespace {
constexpr int64_t kMaxHcMult = 16, kMaxMixes = (2 + kMaxHcMult) * kMaxHcMult;
}  // namespace

void sinkhorn(float* c, int64_t M, int iters, float eps) {
  auto rows = [&](bool first) {
    for (int64_t j = 0; j < M; ++j) {
      float* row = c + j * M;
      const float s = f32(sum_f64(row, M));
      for (int64_t k = 0; k < M; ++k) row[k] = first ? (row[k] / s) + eps : row[k] / (s + eps);
    }
  };
  auto cols = [&] {
    for (int64_t k = 0; k < M; ++k) {
      double s = 0;
      for (int64_t j = 0; j < M; ++j) s += c[j * M + k];
      const float d = f32(s) + eps;
      for (int64_t j = 0; j < M; ++j) c[j * M + k] = c[j * M + k] / d;
    }
  };
  // Row softmax (+ eps), then column normalisation; then (iters - 1) rounds of row and column
  // normalisation. fp32 results at every step.
  for (int64_t j = 0; j < M; ++j) {
    float* row = c + j * M;
    float mx = row[0];
    for (int64_t k = 1; k < M; ++k) mx = std::max(mx, row[k]);
    for (int64_t k = 0; k < M; ++k) row[k] = exp_f(row[k] - mx);
  }
  rows(true);
  cols();
  for (int it = 1; it < iters; ++it) {
    rows(false);
    cols();
  }
}

void hc_mixes(const HcParams& p, const float* x, float* pre, float* post, float* comb) {
  const int64_t M = p.M, MD = p.M * p.D, n_mix = (2 + M) * M;
  DI_CHECK(M <= kMaxHcMult, "hc_mult ", M, " above ", kMaxHcMult);
  const float rho = rms_inv(x, MD, p.norm_eps);
  float m[kMaxMixes];
  const float* fn = p.fn->f32();
  if (!p.exact && p.fn_packed) linear_dense(*p.fn_packed, x, 1, m);  // the canonical order
  for (int64_t i = 0; i < n_mix; ++i) {
    const float proj = p.exact                ? dot_f64(fn + i * MD, x, MD)
                       : p.fn_packed ? m[i] : canonical_dot(fn + i * MD, x, MD);
    m[i] = proj * rho;  // project first, then scale
  }
  for (int64_t c = 0; c < M; ++c) {
    pre[c] = f32(sigmoid_d(m[c] * p.scale[0] + p.base[c])) + p.hc_eps;
    post[c] = 2.0f * f32(sigmoid_d(m[M + c] * p.scale[1] + p.base[M + c]));
  }
  for (int64_t i = 0; i < M * M; ++i) comb[i] = m[2 * M + i] * p.scale[2] + p.base[2 * M + i];
  sinkhorn(comb, M, p.sinkhorn_iters, p.hc_eps);
}

void hc_pre(const float* x, const float* pi, int64_t M, int64_t D, float* out) {
  for (int64_t d = 0; d < D; ++d) {
    double s = 0;
    for (int64_t c = 0; c < M; ++c) s += double(pi[c]) * x[c * D + d];
    out[d] = f32(s);
  }
}

void hc_post(const float* y, const float* x, const float* post, const float* comb, int64_t M,
             int64_t D, float* out) {
  for (int64_t k = 0; k < M; ++k)
    for (int64_t d = 0; d < D; ++d) {
      double s = double(post[k]) * y[d];
      for (int64_t j = 0; j < M; ++j) s += double(comb[j * M + k]) * x[j * D + d];
      out[k * D + d] = f32(s);
    }
}

}  // namespace deepinfer
