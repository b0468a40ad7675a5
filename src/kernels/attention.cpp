#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"

namespace deepinfer {

// The exact formula (fp32 numerics): fp32 scores, softmax with the sink and the weighted sum in
// double, rounded once. Independent of how the key list is split.
void sparse_attention_exact(const SparseAttnArgs& a) {
  std::vector<double> z(static_cast<size_t>(a.nk)), acc(static_cast<size_t>(a.Dh));
  for (int64_t h = 0; h < a.H; ++h) {
    const float* q = a.q + h * a.Dh;
    double m = a.sink[h];
    for (int64_t j = 0; j < a.nk; ++j) {
      z[size_t(j)] = dot_f64(q, a.keys + j * a.Dh, a.Dh) * a.scale;
      m = std::max(m, z[size_t(j)]);
    }
    std::fill(acc.begin(), acc.end(), 0.0);
    double l = std::exp(double(a.sink[h]) - m);
    for (int64_t j = 0; j < a.nk; ++j) {
      const double e = std::exp(z[size_t(j)] - m);
      l += e;
      const float* k = a.keys + j * a.Dh;
      for (int64_t d = 0; d < a.Dh; ++d) acc[size_t(d)] += e * k[d];
    }
    for (int64_t d = 0; d < a.Dh; ++d) a.out[h * a.Dh + d] = f32(acc[size_t(d)] / l);
  }
}

void sparse_attention_ref(const SparseAttnArgs& a) {
  if (a.exact) {
    sparse_attention_exact(a);
    return;
  }
  constexpr int64_t kBlock = 64;
  float z[kBlock], p[kBlock];
  for (int64_t h = 0; h < a.H; ++h) {
    const float* q = a.q + h * a.Dh;
    float* o = a.out + h * a.Dh;  // the running accumulator A, fp32 after every block
    std::fill(o, o + a.Dh, 0.0f);
    float m = -1e30f, l = 0;
    for (int64_t j0 = 0; j0 < a.nk; j0 += kBlock) {
      const int64_t nb = std::min(kBlock, a.nk - j0);
      const float* kb = a.keys + j0 * a.Dh;
      float m_new = m;
      for (int64_t j = 0; j < nb; ++j) {
        const float* k = kb + j * a.Dh;
        const float dot = canonical_dot(q, k, a.Dh);
        z[j] = dot * a.scale;
        m_new = std::max(m_new, z[j]);
      }
      const float beta = exp_f(m - m_new);
      for (int64_t j = 0; j < nb; ++j) p[j] = exp_f(z[j] - m_new);
      const float psum = canonical_sum(p, nb);
      l = l * beta + psum;
      // Probabilities are stored like activations (bf16 in bf16 numerics) before the product.
      if (a.bf16_probs)
        for (int64_t j = 0; j < nb; ++j) p[j] = round_bf16(p[j]);
      for (int64_t d = 0; d < a.Dh; ++d) {
        float pv = 0;
        for (int64_t j = 0; j < nb; ++j) pv += p[j] * kb[j * a.Dh + d];
        o[d] = o[d] * beta + pv;
      }
      m = m_new;
    }
    l = l + exp_f(a.sink[h] - m);
    for (int64_t d = 0; d < a.Dh; ++d) o[d] = o[d] / l;
  }
}

// sparse_attention (the dispatch to the vector paths) is in attention_fast.cpp.

}  // namespace deepinfer
