// Internal to sparse attention: what the dispatcher (attention_fast.cpp) hands the ISA kernels
// (attention_avx512.cpp, attention_avx2.cpp). Plain structs and function pointers only.
#pragma once

#include <cstdint>

#include "kernels/attention.h"

namespace deepinfer::attention_isa {

// One group of consecutive heads (16 for AVX-512, 8 for AVX2) of one query.
struct Job {
  const SparseAttnArgs* a = nullptr;
  int64_t h0 = 0, nh = 0;    // heads [h0, h0 + nh)
  bool fma_qk = false;       // q·k products are exact (bf16 values): fused multiply-adds agree
  bool fma_pv = false;       // p·v products are exact
  float* scratch = nullptr;  // scratch_floats(a) floats, 64-byte aligned
  // x[i] = f32(exp(double(x[i]))): the reference's exp, out of line so the ISA files do not
  // instantiate it.
  void (*exp_n)(float* x, int64_t n) = nullptr;
};

int64_t scratch_floats(const SparseAttnArgs& a, int64_t lanes);

void group_avx512(const Job& j);
void group_avx2(const Job& j);
// Whether every element of x[n] is a bf16 value (low 16 bits zero).
bool all_bf16_avx512(const float* x, int64_t n);
bool all_bf16_avx2(const float* x, int64_t n);

}  // namespace deepinfer::attention_isa
