// Canonical reduction orders. Every kernel that sums (dot products, norms, softmax denominators)
// uses one of these orders in every code path, scalar or vector, whatever the batch size or thread
// count: that is what makes a token's results bit-identical however it is batched.
//
//   dot / linear:  inputs in blocks of 32; a block's partial sum adds its 32 products in index
//                  order (products of bf16/fp8/fp4 values are exact in fp32, so FMA and
//                  multiply-add agree); the running total adds the partials block by block,
//                  each multiplied by the block's scale first (1 when unscaled).
//   vector sums:   16 lanes; lane j sums elements j, j+16, j+32, ... in order; then lanes are
//                  folded pairwise: j += j+8, j += j+4, j += j+2, j += j+1.
#pragma once

#include <cstdint>

namespace deepinfer {

// Partial sum of one block of `n` (<= 32) products in index order.
inline float block_dot(const float* a, const float* b, int64_t n) {
  float p = 0;
  for (int64_t i = 0; i < n; ++i) p += a[i] * b[i];
  return p;
}

// Unscaled dot product in the canonical blocked order (`n` need not be a multiple of 32; the
// last block is shorter).
inline float canonical_dot(const float* a, const float* b, int64_t n) {
  float acc = 0;
  for (int64_t k = 0; k < n; k += 32) acc += block_dot(a + k, b + k, n - k < 32 ? n - k : 32);
  return acc;
}

// Sum of f(x[i]) over i in the 16-lane order.
template <typename F>
inline float canonical_sum(const float* x, int64_t n, F f) {
  float lane[16] = {};
  for (int64_t i = 0; i < n; ++i) lane[i & 15] += f(x[i]);
  for (int w = 8; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) lane[j] += lane[j + w];
  return lane[0];
}

inline float canonical_sum(const float* x, int64_t n) {
  return canonical_sum(x, n, [](float v) { return v; });
}
inline float canonical_sum_sq(const float* x, int64_t n) {
  return canonical_sum(x, n, [](float v) { return v * v; });
}

}  // namespace deepinfer
