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
  bool exact;  // fp32 numerics: the exact softmax in double, rounded once (sparse_attention_ref)
  float* out;  // [H, Dh]
  // The keys as bf16 bits [nk, Dh] instead of `keys` (null then): where attention_bf16_keys()
  // says the tiles take them; every entry point accepts them.
  const uint16_t* keys_bf16 = nullptr;
  // Or the keys as pointers to their bf16 rows [nk] (keys and keys_bf16 null then): the AMX tiles
  // read runs of rows Dh apart in place (a window's, a prefill's compressed rows), other paths
  // gather them first.
  const uint16_t* const* key_rows = nullptr;
  // With key_rows, optionally: key_pairs[j] points to keys j and j + 1 of a run of rows
  // interleaved ([Dh] pairs of bf16 values, pair_key_rows), where key j has a next row; the
  // caller has checked every value with attention_keys_to_bf16. The tiles then read a whole
  // block's value pairs in place.
  const uint16_t* const* key_pairs = nullptr;
};

// out[p] = rows 2p and 2p + 1 of rows [2·n_pairs, Dh] interleaved value by value (key_pairs'
// layout), for p < n_pairs.
void pair_key_rows(const uint16_t* rows, int64_t n_pairs, int64_t Dh, uint16_t* out);
void pair_key_rows_ref(const uint16_t* rows, int64_t n_pairs, int64_t Dh, uint16_t* out);

void sparse_attention(const SparseAttnArgs& a);
void sparse_attention_ref(const SparseAttnArgs& a);

// Whether sparse_attention runs on bf16 operands here for bf16 numerics (bf16_probs: AMX tiles,
// or vdpbf16ps where it multiplies faster than fp32 FMAs), so that keys
// given as bf16 (SparseAttnArgs::keys_bf16) are read as they are.
bool attention_bf16_keys(bool bf16_probs);
// Whether it reads SparseAttnArgs::key_pairs there (on AMX tiles; vdpbf16ps pairs keys its own
// way, block by block).
bool attention_key_pairs(bool bf16_probs);
// out[i] = the bf16 bits of x[i]; true when every x[i] is a bf16 value of magnitude 0 or at least
// 2^-56 (the tiles' exact range; then the copy is exact), else the copy is not to be used.
bool attention_keys_to_bf16(const float* x, int64_t n, uint16_t* out);

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
//
// Doubles in the partial of `heads` heads of dimension `dim`: [heads, 2 + dim].
inline int64_t attention_partial_size(int64_t heads, int64_t dim) {
  return heads * (2 + dim);
}

// Uses a.q, a.keys, a.nk, a.H, a.Dh, a.scale, a.bf16_probs, a.exact (not a.sink, a.out).
//   part: [H, 2 + Dh]
void sparse_attention_partial(const SparseAttnArgs& a, double* part);

//   parts: n_parts partials [H, 2 + Dh], `part_stride` doubles apart; sink: [H], out: [H, Dh]
void merge_attention_partials(const double* parts, int n_parts, int64_t part_stride,
                              const float* sink, int64_t H, int64_t Dh, bool exact, float* out);

}  // namespace deepinfer
