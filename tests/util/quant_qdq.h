// QDQ forms of the activation and cache quantizations (V41_SPEC.md §3.4, §3.5) that only the
// tests use: every value replaced by its quantized value, in place.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "kernels/quant.h"

namespace deepinfer {

// act_quant QDQ, n % 32 == 0: the scalar act_quant codes' values times their block's e8m0 scale.
inline void act_quant_qdq(float* x, int64_t n) {
  std::vector<uint8_t> q(static_cast<size_t>(n)), s(static_cast<size_t>(n / 32));
  act_quant(x, n, q.data(), s.data());
  for (int64_t i = 0; i < n; ++i) x[i] = e4m3_to_f32(q[size_t(i)]) * e8m0_to_f32(s[size_t(i / 32)]);
}

// fp4 variant C QDQ, n % 16 == 0, written out from the spec: an e4m3 scale amax/6 per 16
// (floored at 6 * 2^-9, saturating at 448), e2m1 values of x / scale.
inline void fp4c_qdq(float* x, int64_t n) {
  for (int64_t b = 0; b < n; b += 16) {
    float a = 6.0f * std::ldexp(1.0f, -9);
    for (int64_t i = b; i < b + 16; ++i) a = std::max(a, std::fabs(x[i]));
    const float sigma = e4m3_to_f32(f32_to_e4m3(std::min(a / 6.0f, 448.0f)));
    for (int64_t i = b; i < b + 16; ++i)
      x[i] = e2m1_to_f32(f32_to_e2m1(std::clamp(x[i] / sigma, -6.0f, 6.0f))) * sigma;
  }
}

}  // namespace deepinfer
