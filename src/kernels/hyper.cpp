#include "kernels/hyper.h"

#include <cmath>
#include <vector>

#include "core/error.h"
#include "kernels/norm.h"
#include "kernels/reduce.h"

namespace deepinfer {

namespace {
float sigmoid(float z) {
  return 1.0f / (1.0f + std::exp(-z));
}
constexpr int64_t kMaxHcMult = 16, kMaxMixes = (2 + kMaxHcMult) * kMaxHcMult;
}  // namespace

void sinkhorn(float* c, int64_t M, int iters, float eps) {
  auto col_normalise = [&] {
    for (int64_t k = 0; k < M; ++k) {
      float s = 0;
      for (int64_t j = 0; j < M; ++j) s += c[j * M + k];
      for (int64_t j = 0; j < M; ++j) c[j * M + k] = c[j * M + k] / (s + eps);
    }
  };
  // Row softmax (+ eps), then column normalisation.
  for (int64_t j = 0; j < M; ++j) {
    float* row = c + j * M;
    float mx = row[0];
    for (int64_t k = 1; k < M; ++k) mx = std::max(mx, row[k]);
    float s = 0;
    for (int64_t k = 0; k < M; ++k) {
      row[k] = std::exp(row[k] - mx);
      s += row[k];
    }
    for (int64_t k = 0; k < M; ++k) row[k] = row[k] / s + eps;
  }
  col_normalise();
  for (int it = 1; it < iters; ++it) {
    for (int64_t j = 0; j < M; ++j) {
      float* row = c + j * M;
      float s = 0;
      for (int64_t k = 0; k < M; ++k) s += row[k];
      for (int64_t k = 0; k < M; ++k) row[k] = row[k] / (s + eps);
    }
    col_normalise();
  }
}

void hc_mixes(const HcParams& p, const float* x, float* pre, float* post, float* comb) {
  const int64_t M = p.M, MD = p.M * p.D, n_mix = (2 + M) * M;
  DI_CHECK(M <= kMaxHcMult, "hc_mult ", M, " above ", kMaxHcMult);
  const float rho = rms_inv(x, MD, p.norm_eps);
  float m[kMaxMixes];
  const float* fn = p.fn->f32();
  for (int64_t i = 0; i < n_mix; ++i) m[i] = canonical_dot(fn + i * MD, x, MD) * rho;
  for (int64_t c = 0; c < M; ++c) {
    pre[c] = sigmoid(m[c] * p.scale[0] + p.base[c]) + p.hc_eps;
    post[c] = 2.0f * sigmoid(m[M + c] * p.scale[1] + p.base[M + c]);
  }
  for (int64_t i = 0; i < M * M; ++i) comb[i] = m[2 * M + i] * p.scale[2] + p.base[2 * M + i];
  sinkhorn(comb, M, p.sinkhorn_iters, p.hc_eps);
}

void hc_pre(const float* x, const float* pi, int64_t M, int64_t D, float* out) {
  for (int64_t d = 0; d < D; ++d) {
    float s = 0;
    for (int64_t c = 0; c < M; ++c) s += pi[c] * x[c * D + d];
    out[d] = s;
  }
}

void hc_post(const float* y, const float* x, const float* post, const float* comb, int64_t M,
             int64_t D, float* out) {
  for (int64_t k = 0; k < M; ++k)
    for (int64_t d = 0; d < D; ++d) {
      float s = post[k] * y[d];
      for (int64_t j = 0; j < M; ++j) s += comb[j * M + k] * x[j * D + d];
      out[k * D + d] = s;
    }
}

}  // namespace deepinfer
