// Elementwise arithmetic as the numerics contract states it: a value the spec names as an fp32
// result is computed in double from its fp32 operands and rounded once (`f32`); a single IEEE
// operation on floats is already exactly that. Transcendentals (exp, sqrt, log1p, sigmoid, cos,
// sin) are evaluated in double and rounded once, so their last-ulp behaviour does not depend on
// the platform's float routines.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/dtype.h"

namespace deepinfer {

inline float f32(double x) {
  return static_cast<float>(x);
}
inline double sigmoid_d(double z) {
  return 1.0 / (1.0 + std::exp(-z));
}
inline double softplus_d(double z) {
  return z > 20.0 ? z : std::log1p(std::exp(z));
}
inline float exp_f(float x) {
  return f32(std::exp(double(x)));
}
// x[i] = exp_f(x[i]) for i < n, in vectors where the CPU has AVX-512 (the same floats).
void exp_f_n(float* x, int64_t n);
// The MoE's SwiGLU (V41_SPEC.md §8.2), scaled by `weight`: with limit > 0 g is clamped above at
// limit and u to [-limit, limit]; then g[i] = weight * (f32(g·sigmoid_d(g)) * u) in fp32. In
// vectors where the CPU has AVX-512 (the same floats as swiglu_ref).
void swiglu(float* g, const float* u, int64_t n, float limit, float weight);
void swiglu_ref(float* g, const float* u, int64_t n, float limit, float weight);

// Σ x[i]·y[i] in double (exact products of fp32 values; the sum to ~1e-16), rounded once.
inline float dot_f64(const float* x, const float* y, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(x[i]) * double(y[i]);
  return f32(s);
}
inline double sum_f64(const float* x, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(x[i]);
  return s;
}

// 1 / sqrt(mean(x²) + eps) of one vector, as RMSNorm (V41_SPEC.md §3.2) computes it.
inline float rms_inv(const float* x, int64_t n, float eps) {
  // The squares (exact in double) summed in 16 lanes, lane j over elements j, j+16, ... in order,
  // then the lanes folded pairwise (reduce.h's vector sums, in double): 16 independent chains.
  double lane[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) lane[j] += double(x[i + j]) * double(x[i + j]);
  for (; i < n; ++i) lane[i & 15] += double(x[i]) * double(x[i]);
  for (int w = 8; w >= 1; w /= 2)
    for (int j = 0; j < w; ++j) lane[j] += lane[j + w];
  const double s = lane[0];
  const float mean = f32(s / double(n));            // f32(mean(x²)) with the sum in double
  return f32(1.0 / std::sqrt(double(mean + eps)));  // the reference's rounding points
}
// out[i] = rms_inv(x + i·ld, d, eps) for i < n; in vectors, several rows at once, where the CPU
// has AVX-512 (the same floats).
void rms_inv_rows(const float* x, int64_t n, int64_t ld, int64_t d, float eps, float* out);

// RMSNorm (V41_SPEC.md §3.2) of the n rows of x [n, d], in place: y = w · (x · rms_inv(x)) with
// fp32 results at each step; w: [d] bf16. The caller rounds y to the activation dtype. In vectors
// where the CPU has AVX-512 (the same floats as rmsnorm_ref).
void rmsnorm(float* x, int64_t n, int64_t d, const uint16_t* w, float eps);
void rmsnorm_ref(float* x, int64_t n, int64_t d, const uint16_t* w, float eps);

}  // namespace deepinfer
