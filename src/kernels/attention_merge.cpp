#include "kernels/attention_merge.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"

namespace deepinfer {

void sparse_attention_partial(const SparseAttnArgs& a, double* part) {
  const int64_t stride = 2 + a.Dh;
  std::vector<double> z(static_cast<size_t>(a.nk));
  for (int64_t h = 0; h < a.H; ++h) {
    const float* q = a.q + h * a.Dh;
    double* p = part + h * stride;
    double* acc = p + 2;
    std::fill(acc, acc + a.Dh, 0.0);
    if (a.nk == 0) {
      p[0] = -INFINITY;
      p[1] = 0;
      continue;
    }
    if (a.exact) {
      double m = -INFINITY;
      for (int64_t j = 0; j < a.nk; ++j) {
        z[size_t(j)] = dot_f64(q, a.keys + j * a.Dh, a.Dh) * a.scale;
        m = std::max(m, z[size_t(j)]);
      }
      double l = 0;
      for (int64_t j = 0; j < a.nk; ++j) {
        const double e = std::exp(z[size_t(j)] - m);
        l += e;
        const float* k = a.keys + j * a.Dh;
        for (int64_t d = 0; d < a.Dh; ++d) acc[d] += e * k[d];
      }
      p[0] = m;
      p[1] = l;
      continue;
    }
    // The kernel's blocked online softmax, in fp32, over this rank's keys.
    constexpr int64_t kBlock = 64;
    float zb[kBlock], pb[kBlock];
    std::vector<float> A(static_cast<size_t>(a.Dh), 0.0f);
    float m = -1e30f, l = 0;
    for (int64_t j0 = 0; j0 < a.nk; j0 += kBlock) {
      const int64_t nb = std::min(kBlock, a.nk - j0);
      const float* kb = a.keys + j0 * a.Dh;
      float m_new = m;
      for (int64_t j = 0; j < nb; ++j) {
        zb[j] = canonical_dot(q, kb + j * a.Dh, a.Dh) * a.scale;
        m_new = std::max(m_new, zb[j]);
      }
      const float beta = exp_f(m - m_new);
      for (int64_t j = 0; j < nb; ++j) pb[j] = exp_f(zb[j] - m_new);
      l = l * beta + canonical_sum(pb, nb);
      if (a.bf16_probs)
        for (int64_t j = 0; j < nb; ++j) pb[j] = round_bf16(pb[j]);
      for (int64_t d = 0; d < a.Dh; ++d) {
        float pv = 0;
        for (int64_t j = 0; j < nb; ++j) pv += pb[j] * kb[j * a.Dh + d];
        A[size_t(d)] = A[size_t(d)] * beta + pv;
      }
      m = m_new;
    }
    p[0] = m;
    p[1] = l;
    for (int64_t d = 0; d < a.Dh; ++d) acc[d] = A[size_t(d)];
  }
}

void merge_attention_partials(const double* parts, int n_parts, const float* sink, int64_t H,
                              int64_t Dh, bool exact, float* out) {
  const int64_t stride = 2 + Dh, part_stride = H * stride;
  for (int64_t h = 0; h < H; ++h) {
    float* o = out + h * Dh;
    if (exact) {
      double M = sink[h];
      for (int r = 0; r < n_parts; ++r) M = std::max(M, parts[r * part_stride + h * stride]);
      double L = 0;
      std::vector<double> A(static_cast<size_t>(Dh), 0.0);
      for (int r = 0; r < n_parts; ++r) {
        const double* p = parts + r * part_stride + h * stride;
        if (p[1] == 0) continue;  // no keys on that rank
        const double f = std::exp(p[0] - M);
        L += p[1] * f;
        for (int64_t d = 0; d < Dh; ++d) A[size_t(d)] += p[2 + d] * f;
      }
      L += std::exp(double(sink[h]) - M);
      for (int64_t d = 0; d < Dh; ++d) o[d] = f32(A[size_t(d)] / L);
      continue;
    }
    float M = -1e30f;
    for (int r = 0; r < n_parts; ++r) M = std::max(M, float(parts[r * part_stride + h * stride]));
    float L = 0;
    std::fill(o, o + Dh, 0.0f);
    for (int r = 0; r < n_parts; ++r) {
      const double* p = parts + r * part_stride + h * stride;
      if (p[1] == 0) continue;
      const float f = exp_f(float(p[0]) - M);
      L = L + float(p[1]) * f;
      for (int64_t d = 0; d < Dh; ++d) o[d] = o[d] + float(p[2 + d]) * f;
    }
    L = L + exp_f(sink[h] - M);
    for (int64_t d = 0; d < Dh; ++d) o[d] = o[d] / L;
  }
}

}  // namespace deepinfer
