#include "kernels/attention.h"

#include <algorithm>
#include <cmath>

#include "core/dtype.h"
#include "kernels/reduce.h"

namespace deepinfer {

void sparse_attention_ref(const SparseAttnArgs& a) {
  constexpr int64_t kBlock = 64;
  float z[kBlock];
  for (int64_t h = 0; h < a.H; ++h) {
    const float* q = a.q + h * a.Dh;
    float* o = a.out + h * a.Dh;
    std::fill(o, o + a.Dh, 0.0f);  // running accumulator A
    float m = -1e30f, l = 0;
    for (int64_t j0 = 0; j0 < a.nk; j0 += kBlock) {
      const int64_t nb = std::min(kBlock, a.nk - j0);
      float bmax = -INFINITY;
      for (int64_t j = 0; j < nb; ++j) {
        z[j] = canonical_dot(q, a.keys + (j0 + j) * a.Dh, a.Dh) * a.scale;
        bmax = std::max(bmax, z[j]);
      }
      const float m_new = std::max(m, bmax);
      const float beta = std::exp(m - m_new);
      float psum = 0;
      for (int64_t j = 0; j < nb; ++j) {
        z[j] = std::exp(z[j] - m_new);  // P_j (fp32)
        psum += z[j];
      }
      l = l * beta + psum;
      for (int64_t d = 0; d < a.Dh; ++d) o[d] *= beta;
      for (int64_t j = 0; j < nb; ++j) {
        const float p = a.bf16_probs ? round_bf16(z[j]) : z[j];
        const float* k = a.keys + (j0 + j) * a.Dh;
        for (int64_t d = 0; d < a.Dh; ++d) o[d] += p * k[d];
      }
      m = m_new;
    }
    l += std::exp(a.sink[h] - m);
    for (int64_t d = 0; d < a.Dh; ++d) o[d] = o[d] / l;
  }
}

void sparse_attention(const SparseAttnArgs& a) {
  sparse_attention_ref(a);
}

}  // namespace deepinfer
