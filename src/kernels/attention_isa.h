// Internal to sparse attention: what the dispatcher (attention_fast.cpp) hands the vector kernel
// (attention_vec.cpp, compiled once per ISA). Plain structs and function pointers only.
#pragma once

#include <cstdint>

#include "core/cpu.h"
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

struct Kernels {
  void (*group)(const Job& j);
  // Whether every element of x[n] is a bf16 value (low 16 bits zero).
  bool (*all_bf16)(const float* x, int64_t n);
  int64_t lanes;  // heads per group
};
template <Isa>
const Kernels& kernels();
template <>
const Kernels& kernels<Isa::Avx2>();
template <>
const Kernels& kernels<Isa::Avx512>();

}  // namespace deepinfer::attention_isa
