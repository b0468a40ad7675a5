// Canonical reduction orders. Every kernel that sums (dot products, norms, softmax denominators)
// uses one of these orders in every code path, scalar or vector, whatever the batch size or thread
// count: that is what makes a token's results bit-identical however it is batched.
//
//   dot:           inputs in blocks of 32. A block's partial sum starts at +0 and runs over the
//                  pairs (2i, 2i+1) in order, adding the odd element's product first:
//                      p = p + a[2i+1]·b[2i+1];  p = p + a[2i]·b[2i]
//                  (the attention and indexer dots: the product rounded, then added, unless
//                  exact). The running total adds the partials block by block:
//                  acc = acc + p. A block of odd length ends with its last element alone.
//   linear:        blocks of 32 inputs. A block's partial is two chains of fused multiply-adds,
//                  each from +0: the even inputs' products in order and the odd inputs', then
//                  their sum, rounded once:
//                      e = fma(a[2i], b[2i], e);  o = fma(a[2i+1], b[2i+1], o);  p = e + o
//                  which is what an AMX tile computes for one 32-input block (TDPBF16PS, checked
//                  at start-up: linear_vec.cpp's amx_is_canonical). vdpbf16ps, which adds a
//                  pair's odd product and then its even one into one accumulator, takes pairs
//                  (a[4g+2], a[4g]) into the even chain and (a[4g+3], a[4g+1]) into the odd one.
//                  The total adds each partial times the block's scale: acc = fma(p, s, acc)
//                  (s = 1 when unscaled, a power of two otherwise, so p·s is exact and the fma is
//                  acc + p·s). The codes' products (e4m3/e2m1 codes times act_quant values,
//                  bf16 x bf16 above the bf16 products' floor) are exact and never subnormal,
//                  so the flushing of denormals by the tiles and vdpbf16ps never applies.
//   attention:     the scores q·k: blocks of 32 dimensions, each block's partial the linears'
//                  two fused chains (even and odd dimensions) from +0 and their sum; the total
//                  adds the partials block by block from +0. The values Σ_j p_j·k_j of a softmax
//                  block of 64 keys: sub-blocks of 32 keys, each the even keys' fused chain and
//                  the odd keys' from +0 and their sum, the block's sum their total from +0.
//                  Both are what AMX tiles compute (keys or probabilities as the tile rows).
//   vector sums:   16 lanes; lane j sums elements j, j+16, j+32, ... in order (multiply, then add);
//                  then lanes are folded pairwise: j += j+8, j += j+4, j += j+2, j += j+1.
#pragma once

#include <cstdint>

namespace deepinfer {

// Partial sum of one block of `n` (<= 32) products in the canonical pair order: elements
// 1, 0, 3, 2, ... (and a last even element alone). Written as one ordered update per iteration:
// GCC 12.2's -O2 loop vectorizer turns the two-updates-per-iteration form into a reassociated
// two-lane sum (wrong results, caught by tests/kernels).
inline float block_dot(const float* a, const float* b, int64_t n) {
  float p = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = (i ^ 1) < n ? (i ^ 1) : i;
    p = p + a[k] * b[k];
  }
  return p;
}

// A linear's block partial over 32 inputs: the even and the odd chains, then their sum.
inline float linear_block_dot(const float* a, const float* b) {
  float e = 0, o = 0;
  for (int i = 0; i < 32; i += 2) {
    e = __builtin_fmaf(a[i], b[i], e);
    o = __builtin_fmaf(a[i + 1], b[i + 1], o);
  }
  return e + o;
}

// Dot product in the attention's order: per block of 32 (the last may be shorter) the even and
// the odd elements' fused chains from +0, then their sum, added to the total.
inline float chains_dot(const float* a, const float* b, int64_t n) {
  float acc = 0;
  for (int64_t k = 0; k < n; k += 32) {
    const int64_t m = n - k < 32 ? n - k : 32;
    float e = 0, o = 0;
    for (int64_t i = 0; i < m; ++i)
      if (i & 1)
        o = __builtin_fmaf(a[k + i], b[k + i], o);
      else
        e = __builtin_fmaf(a[k + i], b[k + i], e);
    acc += e + o;
  }
  return acc;
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

// Index of the largest of x[0 .. n) (n >= 1), the one std::max_element picks: the first of equal
// values (+0 equals -0), never a NaN unless x[0] is one (then 0). In vector passes (reduce.cpp):
// max_element's loop-carried compare takes 0.46 ms over a 129k vocabulary on a Sapphire Rapids
// core, this 0.02 ms.
int64_t argmax(const float* x, int64_t n);

}  // namespace deepinfer
