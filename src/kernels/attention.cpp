#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "kernels/elementwise.h"
#include "kernels/reduce.h"

namespace deepinfer {

namespace {

// One head's exact sums in double, with the sink (when given) first: scores z (scratch [nk]),
// their max *m, the returned l = exp(sink − m) + Σ exp(z − m), and acc[Dh] = Σ exp(z − m)·k.
double exact_head(const SparseAttnArgs& a, const float* q, const float* sink, double* z,
                  double* acc, double* m) {
  *m = sink ? double(*sink) : -INFINITY;
  for (int64_t j = 0; j < a.nk; ++j) {
    z[j] = dot_f64(q, a.keys + j * a.Dh, a.Dh) * a.scale;
    *m = std::max(*m, z[j]);
  }
  std::fill(acc, acc + a.Dh, 0.0);
  double l = sink ? std::exp(double(*sink) - *m) : 0.0;
  for (int64_t j = 0; j < a.nk; ++j) {
    const double e = std::exp(z[j] - *m);
    l += e;
    const float* k = a.keys + j * a.Dh;
    for (int64_t d = 0; d < a.Dh; ++d) acc[d] += e * k[d];
  }
  return l;
}

// One head's blocked online softmax in fp32, the kernel's order (attention.h), without the sink:
// o[Dh] gets the accumulator A, *m the running max; returns l.
float online_head(const SparseAttnArgs& a, const float* q, float* o, float* m_out) {
  constexpr int64_t kBlock = 64;
  float z[kBlock], p[kBlock];
  std::fill(o, o + a.Dh, 0.0f);
  float m = -1e30f, l = 0;
  for (int64_t j0 = 0; j0 < a.nk; j0 += kBlock) {
    const int64_t nb = std::min(kBlock, a.nk - j0);
    const float* kb = a.keys + j0 * a.Dh;
    float m_new = m;
    for (int64_t j = 0; j < nb; ++j) {
      z[j] = canonical_dot(q, kb + j * a.Dh, a.Dh) * a.scale;
      m_new = std::max(m_new, z[j]);
    }
    const float beta = exp_f(m - m_new);
    for (int64_t j = 0; j < nb; ++j) p[j] = exp_f(z[j] - m_new);
    l = l * beta + canonical_sum(p, nb);
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
  *m_out = m;
  return l;
}

thread_local std::vector<double> t_z, t_acc;
thread_local std::vector<float> t_o;

}  // namespace

// The exact formula (fp32 numerics): fp32 scores, softmax with the sink and the weighted sum in
// double, rounded once. Independent of how the key list is split.
void sparse_attention_exact(const SparseAttnArgs& a) {
  std::vector<double>&z = t_z, &acc = t_acc;
  z.resize(size_t(a.nk));
  acc.resize(size_t(a.Dh));
  for (int64_t h = 0; h < a.H; ++h) {
    double m;
    const double l = exact_head(a, a.q + h * a.Dh, a.sink + h, z.data(), acc.data(), &m);
    for (int64_t d = 0; d < a.Dh; ++d) a.out[h * a.Dh + d] = f32(acc[size_t(d)] / l);
  }
}

void sparse_attention_ref(const SparseAttnArgs& a) {
  if (a.exact) {
    sparse_attention_exact(a);
    return;
  }
  for (int64_t h = 0; h < a.H; ++h) {
    float* o = a.out + h * a.Dh;
    float m;
    float l = online_head(a, a.q + h * a.Dh, o, &m);
    l = l + exp_f(a.sink[h] - m);
    for (int64_t d = 0; d < a.Dh; ++d) o[d] = o[d] / l;
  }
}

// sparse_attention (the dispatch to the vector paths) is in attention_fast.cpp.

void sparse_attention_partial(const SparseAttnArgs& a, double* part) {
  const int64_t stride = 2 + a.Dh;
  std::vector<double>& z = t_z;
  std::vector<float>& o = t_o;
  z.resize(size_t(a.nk));
  o.resize(size_t(a.Dh));
  for (int64_t h = 0; h < a.H; ++h) {
    const float* q = a.q + h * a.Dh;
    double* p = part + h * stride;
    double* acc = p + 2;
    if (a.nk == 0) {
      std::fill(acc, acc + a.Dh, 0.0);
      p[0] = -INFINITY;
      p[1] = 0;
    } else if (a.exact) {
      p[1] = exact_head(a, q, nullptr, z.data(), acc, &p[0]);
    } else {
      float m;
      p[1] = online_head(a, q, o.data(), &m);
      p[0] = m;
      for (int64_t d = 0; d < a.Dh; ++d) acc[d] = o[size_t(d)];
    }
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
