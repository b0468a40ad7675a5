#include "kernels/norm.h"

#include <cmath>

#include "core/dtype.h"
#include "kernels/elementwise.h"

namespace deepinfer {

float rms_inv(const float* x, int64_t n, float eps) {
  return rms_inv_of_mean(mean_sq(x, n), eps);
}

void rmsnorm(const float* x, int64_t n, int64_t dim, int64_t ldx, const Weight& w, float eps,
             float* y, int64_t ldy) {
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * ldx;
    float* yi = y + i * ldy;
    const float r = rms_inv(xi, dim, eps);
    for (int64_t d = 0; d < dim; ++d)
      yi[d] = bf16_to_f32(w.bf16()[d]) * (xi[d] * r);  // two roundings
  }
}

}  // namespace deepinfer
