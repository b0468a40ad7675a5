#include "kernels/norm.h"

#include <cmath>

#include "core/dtype.h"
#include "kernels/elementwise.h"

namespace deepinfer {

float rms_inv(const float* x, int64_t n, float eps) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * double(x[i]);
  const float mean = f32(s / double(n));            // f32(mean(x²)) with the sum in double
  return f32(1.0 / std::sqrt(double(mean + eps)));  // the reference's rounding points
}

void rmsnorm(const float* x, int64_t n, int64_t dim, const Weight& w, float eps, float* y) {
  for (int64_t i = 0; i < n; ++i) {
    const float* xi = x + i * dim;
    float* yi = y + i * dim;
    const float r = rms_inv(xi, dim, eps);
    for (int64_t d = 0; d < dim; ++d)
      yi[d] = bf16_to_f32(w.bf16()[d]) * (xi[d] * r);  // two roundings
  }
}

}  // namespace deepinfer
