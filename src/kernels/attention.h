// Sparse attention with a per-head sink (V41_SPEC.md §5.6) for one query token over a gathered
// key list. Single KV head: every key is also its value. Evaluated as the reference kernel does:
// keys in list order, online softmax in blocks of 64 starting from a running max of -1e30, and
// (in bf16 numerics) probabilities rounded to bf16 before they weight the values. The sink is an
// extra logit with a zero value, not multiplied by the softmax scale. fp32 results after each
// step: z = f32(q·k)·τ; per block β = exp(m − m'), p = exp(z − m'), l = l·β + Σp,
// A = A·β + Σ p·k; finally l += exp(sink − m), o = A / l.
#pragma once

#include <cstdint>

namespace deepinfer {

struct SparseAttnArgs {
  const float* q;     // [H, Dh]
  const float* keys;  // [nk, Dh] in list order
  int64_t nk;
  const float* sink;  // [H]
  int64_t H, Dh;
  float scale;  // f32(Dh^-1/2)
  bool bf16_probs;
  bool exact;  // fp32 numerics: the exact formula in double (sparse_attention_exact)
  float* out;  // [H, Dh]
};

void sparse_attention(const SparseAttnArgs& a);
void sparse_attention_ref(const SparseAttnArgs& a);
// The fp32-numerics evaluation: exact softmax in double, rounded once (see attention.cpp).
void sparse_attention_exact(const SparseAttnArgs& a);

}  // namespace deepinfer
