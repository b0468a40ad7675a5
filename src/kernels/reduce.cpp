#include "kernels/reduce.h"

namespace deepinfer {

// Lane-wise maxima from x[0] (NaN never replaces a value: `a < NaN` is false), then the first
// element equal to their maximum, found a block at a time. Built for AVX-512 and AVX2 too, picked
// when the program loads.
__attribute__((target_clones("avx512f", "avx2", "default"))) int64_t argmax(const float* x,
                                                                            int64_t n) {
  constexpr int64_t kLanes = 16, kBlock = 64;
  float lane[kLanes];
  for (float& v : lane) v = x[0];
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int64_t j = 0; j < kLanes; ++j) lane[j] = lane[j] < x[i + j] ? x[i + j] : lane[j];
  float m = lane[0];
  for (int64_t j = 1; j < kLanes; ++j) m = m < lane[j] ? lane[j] : m;
  for (; i < n; ++i) m = m < x[i] ? x[i] : m;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = b + kBlock < n ? b + kBlock : n;
    int hit = 0;
    for (int64_t k = b; k < e; ++k) hit |= x[k] == m;
    if (hit)
      for (int64_t k = b; k < e; ++k)
        if (x[k] == m) return k;
  }
  return 0;  // x[0] is a NaN: the lanes stayed NaN, as max_element stays at 0
}

}  // namespace deepinfer
