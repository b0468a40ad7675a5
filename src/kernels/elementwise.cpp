// The vector dispatch of kernels/elementwise.h's exp and SwiGLU, and the SwiGLU's scalar form.
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

void swiglu(float* g, const float* u, int64_t n, float limit, float weight) {
  (cpu_isa() == Isa::Avx512 ? elementwise_isa::swiglu_avx512 : swiglu_ref)(g, u, n, limit, weight);
}

}  // namespace deepinfer
