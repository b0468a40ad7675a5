// RMSNorm (V41_SPEC.md §3.2): y = w · (x · rsqrt(mean(x²) + eps)) with fp32 results at each step:
// mean(x²) (summed in double), mean + eps, the rsqrt, x · r, then the product with the bf16
// weight. The caller rounds the output to the activation dtype.
#pragma once

#include <cstdint>

#include "core/weight.h"

namespace deepinfer {

//   x: [n, dim], w: BF16 [dim], y: [n, dim] (may alias x)
void rmsnorm(const float* x, int64_t n, int64_t dim, const Weight& w, float eps, float* y);
// 1 / sqrt(mean(x²) + eps) of one vector.
float rms_inv(const float* x, int64_t n, float eps);

}  // namespace deepinfer
