// Linear layers y = x Wᵀ over the checkpoint's weight formats (V41_SPEC.md §3.6).
//
//   linear_quant  QLin: each input row is act-quantized (e4m3, one e8m0 scale per 32); per 32-wide
//                 input block b the partial P_b = Σ q_k w_k runs over the codes and the total
//                 accumulates P_b · σx_b · σw_b block by block. W: Fp8Block or Fp4Row.
//   linear_dense  the input is used as it is (bf16 or fp32 values); W: BF16, F32, or Fp8Block
//                 (wo_a: exact dequantized values, no activation quantization).
// Both follow the canonical order of kernels/reduce.h, so an output row depends only on its
// input row: batching, threading and the code path never change a bit. Outputs are fp32; callers
// round to bf16 where the model stores bf16.
//
// `_ref` functions are the scalar oracles; the plain names dispatch to the fastest path.
#pragma once

#include <cstdint>

#include "core/weight.h"

namespace deepinfer {

// Rows [row0, row0 + n_out) of W applied to x.
//   x: [n, ldx] (the first W.cols() columns are read), y: [n, ldy] (n_out columns written)
struct LinearArgs {
  const float* x;
  int64_t n;
  int64_t ldx;
  float* y;
  int64_t ldy;
  int64_t row0 = 0;
  int64_t n_out = -1;  // -1: all rows of W
};

void linear_quant(const Weight& w, const LinearArgs& a);
void linear_dense(const Weight& w, const LinearArgs& a);
void linear_quant_ref(const Weight& w, const LinearArgs& a);
void linear_dense_ref(const Weight& w, const LinearArgs& a);

// Convenience: full W, contiguous x [n, W.cols()] and y [n, W.rows()].
inline void linear_quant(const Weight& w, const float* x, int64_t n, float* y) {
  linear_quant(w, {x, n, w.cols(), y, w.rows()});
}
inline void linear_dense(const Weight& w, const float* x, int64_t n, float* y) {
  linear_dense(w, {x, n, w.cols(), y, w.rows()});
}

// Row `r` of W decoded to float (exact): out[W.cols()].
void weight_row(const Weight& w, int64_t r, float* out);

}  // namespace deepinfer
