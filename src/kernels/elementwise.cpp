// The vector dispatch of kernels/elementwise.h's exp, RMS and SwiGLU, and their scalar forms.
#include "kernels/elementwise.h"

#include <algorithm>

#include "core/cpu.h"
#include "kernels/isa.h"

namespace deepinfer {

void exp_f_n(float* x, int64_t n) {
  if (cpu_isa() == Isa::Avx512) return elementwise_isa::exp_f_n_avx512(x, n);
  for (int64_t i = 0; i < n; ++i) x[i] = exp_f(x[i]);
}

void swiglu_ref(float* g, const float* u, int64_t n, float limit, float weight) {
  for (int64_t i = 0; i < n; ++i) {
    float gi = g[i], ui = u[i];
    if (limit > 0) {
      gi = std::min(gi, limit);
      ui = std::max(-limit, std::min(ui, limit));
    }
    const float silu = f32(double(gi) * sigmoid_d(gi));
    g[i] = weight * (silu * ui);
  }
}

void rms_inv_rows(const float* x, int64_t n, int64_t ld, int64_t d, float eps, float* out) {
  if (cpu_isa() == Isa::Avx512) return elementwise_isa::rms_inv_rows_avx512(x, n, ld, d, eps, out);
  for (int64_t i = 0; i < n; ++i) out[i] = rms_inv(x + i * ld, d, eps);
}

void rmsnorm_ref(float* x, int64_t n, int64_t d, const uint16_t* w, float eps) {
  for (int64_t i = 0; i < n; ++i) {
    float* xi = x + i * d;
    const float r = rms_inv(xi, d, eps);
    for (int64_t k = 0; k < d; ++k) xi[k] = bf16_to_f32(w[k]) * (xi[k] * r);  // two roundings
  }
}

void rmsnorm(float* x, int64_t n, int64_t d, const uint16_t* w, float eps) {
  (cpu_isa() == Isa::Avx512 ? elementwise_isa::rmsnorm_avx512 : rmsnorm_ref)(x, n, d, w, eps);
}

void swiglu(float* g, const float* u, int64_t n, float limit, float weight) {
  (cpu_isa() == Isa::Avx512 ? elementwise_isa::swiglu_avx512 : swiglu_ref)(g, u, n, limit, weight);
}

}  // namespace deepinfer
