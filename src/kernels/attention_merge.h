// Sparse attention split over context-parallel ranks: each rank attends over its part of a
// query's key list (without the sink) and returns per-head partial statistics; the partials of
// all ranks are merged with the sink counted once (log-sum-exp merge).
//
// A partial is, per head, [m, l, acc[Dh]] as doubles: the running max of the scores, the sum of
// exp(z - m), and the sum of exp(z - m)·k. In fp32 numerics (exact) both steps run in double
// and the merged output is rounded once, so the result equals the single-rank exact formula
// (kernels/attention.h) to the last bit except in astronomically rare double-rounding ties. In
// bf16 numerics the partial follows the kernel's blocked online softmax in fp32 over the rank's
// keys, and the merge runs in fp32.
#pragma once

#include <cstdint>

#include "kernels/attention.h"

namespace deepinfer {

inline int64_t attention_partial_size(int64_t H, int64_t Dh) {
  return H * (2 + Dh);
}

// Uses a.q, a.keys, a.nk, a.H, a.Dh, a.scale, a.bf16_probs, a.exact (not a.sink, a.out).
//   part: [H, 2 + Dh]
void sparse_attention_partial(const SparseAttnArgs& a, double* part);

//   parts: [n_parts, H, 2 + Dh], sink: [H], out: [H, Dh]
void merge_attention_partials(const double* parts, int n_parts, const float* sink, int64_t H,
                              int64_t Dh, bool exact, float* out);

}  // namespace deepinfer
