// Sparse attention: the reference (online softmax in fp32, or the exact formula in double), the
// context-parallel partials and their merge, and the dispatch to the vector paths. The exact
// formula and the scalar ISA take the reference; the vector paths split the heads into groups of
// one vector width (16 AVX-512 lanes, 8 AVX2 lanes), one task each. Every head is computed by one
// task in the reference's order, so the result does not depend on the path or the thread count.
//
// Indexer scores (the reference and the dispatch to the vector paths) and the top-k selection.
// The exact formula, the scalar ISA and head counts above attention_isa::kIndexerMaxHeads take
// the reference; the vector paths split the visible rows over the thread pool (each row scored by
// one task, in the reference's order).
#include "kernels/attention.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <vector>

#include "core/cpu.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/elementwise.h"
#include "kernels/indexer.h"
#include "kernels/isa.h"
#include "kernels/linear.h"
#include "kernels/reduce.h"

namespace deepinfer {

namespace {

// One head's exact sums in double, with the sink (when given) first: scores z (scratch [nk]),
// their max *m, the returned l = exp(sink − m) + Σ exp(z − m), and acc[Dh] = Σ exp(z − m)·k.
double exact_head(const SparseAttnArgs& a, const float* q, const float* sink, double* z,
                  double* acc, double* m) {
  *m = sink ? double(*sink) : -INFINITY;
  for (int64_t j = 0; j < a.nk; ++j) {
    z[j] = dot_f64(q, a.keys + j * a.Dh, a.Dh) * a.scale;
    *m = std::max(*m, z[j]);
  }
  std::fill(acc, acc + a.Dh, 0.0);
  double l = sink ? std::exp(double(*sink) - *m) : 0.0;
  for (int64_t j = 0; j < a.nk; ++j) {
    const double e = std::exp(z[j] - *m);
    l += e;
    const float* k = a.keys + j * a.Dh;
    for (int64_t d = 0; d < a.Dh; ++d) acc[d] += e * k[d];
  }
  return l;
}

// One head's blocked online softmax in fp32, the kernel's order (attention.h), without the sink:
// o[Dh] gets the accumulator A, *m the running max; returns l.
float online_head(const SparseAttnArgs& a, const float* q, float* o, float* m_out) {
  constexpr int64_t kBlock = 64;
  float z[kBlock], p[kBlock];
  std::fill(o, o + a.Dh, 0.0f);
  float m = -1e30f, l = 0;
  for (int64_t j0 = 0; j0 < a.nk; j0 += kBlock) {
    const int64_t nb = std::min(kBlock, a.nk - j0);
    const float* kb = a.keys + j0 * a.Dh;
    float m_new = m;
    for (int64_t j = 0; j < nb; ++j) {
      z[j] = chains_dot(q, kb + j * a.Dh, a.Dh) * a.scale;
      m_new = std::max(m_new, z[j]);
    }
    const float beta = exp_f(m - m_new);
    for (int64_t j = 0; j < nb; ++j) p[j] = exp_f(z[j] - m_new);
    l = l * beta + canonical_sum(p, nb, [](float v) { return v; });
    // Probabilities are stored like activations (bf16 in bf16 numerics) before the product.
    if (a.bf16_probs)
      for (int64_t j = 0; j < nb; ++j) p[j] = round_bf16(p[j]);
    for (int64_t d = 0; d < a.Dh; ++d) {
      float pv = 0;  // sub-blocks of 32 keys, each the even keys' and the odd keys' chains
      for (int64_t s0 = 0; s0 < nb; s0 += 32) {
        float e = 0, od = 0;
        for (int64_t j = s0; j < std::min(nb, s0 + 32); ++j)
          if ((j - s0) & 1)
            od = __builtin_fmaf(p[j], kb[j * a.Dh + d], od);
          else
            e = __builtin_fmaf(p[j], kb[j * a.Dh + d], e);
        pv += e + od;
      }
      o[d] = o[d] * beta + pv;
    }
    m = m_new;
  }
  *m_out = m;
  return l;
}

thread_local std::vector<double> t_z, t_acc;
thread_local std::vector<float> t_o;
thread_local AlignedScratch t_scratch;  // the vector attention and indexer tasks'

// One head's log-sum-exp merge of the partials (one every `part_stride`) with the sink, in T
// (fp32 numerics: the max starts at the kernel's -1e30; exact: at the sink, all in double).
// acc[Dh] holds the sum (T = float: the output itself).
template <typename T>
void merge_head(const double* parts, int n_parts, int64_t part_stride, int64_t Dh, float sink, T M,
                T* acc, float* o) {
  for (int r = 0; r < n_parts; ++r) M = std::max(M, T(parts[r * part_stride]));
  T L = 0;
  std::fill(acc, acc + Dh, T(0));
  for (int r = 0; r < n_parts; ++r) {
    const double* p = parts + r * part_stride;
    if (p[1] == 0) continue;  // no keys on that rank
    const T f = T(std::exp(double(T(p[0]) - M)));
    L = L + T(p[1]) * f;
    for (int64_t d = 0; d < Dh; ++d) acc[d] = acc[d] + T(p[2 + d]) * f;
  }
  L = L + T(std::exp(double(T(sink) - M)));
  for (int64_t d = 0; d < Dh; ++d) o[d] = f32(acc[d] / L);
}

thread_local std::vector<float> t_keys32;

// `a` with keys given as fp32 (those given as bf16 widened into a buffer of this thread).
SparseAttnArgs with_fp32_keys(const SparseAttnArgs& a) {
  if (!a.keys_bf16 && !a.key_rows) return a;
  SparseAttnArgs b = a;
  t_keys32.resize(size_t(a.nk * a.Dh));
  for (int64_t j = 0; j < a.nk; ++j) {
    const uint16_t* k = a.key_rows ? a.key_rows[j] : a.keys_bf16 + j * a.Dh;
    for (int64_t d = 0; d < a.Dh; ++d)
      t_keys32[size_t(j * a.Dh + d)] = std::bit_cast<float>(uint32_t(k[d]) << 16);
  }
  b.keys = t_keys32.data();
  b.keys_bf16 = nullptr;
  b.key_rows = nullptr;
  b.key_pairs = nullptr;
  return b;
}

// What serves bf16-numerics attention on bf16 operands here (isa: the one in effect): AMX
// tiles, or vdpbf16ps where it multiplies faster than FMAs (the products setting allowing).
enum class Bf16Products { None, Amx, Dp };
Bf16Products bf16_attention(Isa isa, bool bf16_probs) {
  const LinearProducts prod = linear_products();
  if (isa != Isa::Avx512 || !bf16_probs) return Bf16Products::None;
  if ((prod == LinearProducts::Auto || prod == LinearProducts::Amx) && amx_canonical())
    return Bf16Products::Amx;
  if ((prod == LinearProducts::Auto && dpbf16_speedup() >= 1.0) ||
      (prod == LinearProducts::Bf16Dot && dpbf16_speedup() > 0.0))
    return Bf16Products::Dp;
  return Bf16Products::None;
}

}  // namespace

bool attention_bf16_keys(bool bf16_probs) {
  return bf16_attention(cpu_isa(), bf16_probs) != Bf16Products::None;
}

bool attention_key_pairs(bool bf16_probs) {
  return bf16_attention(cpu_isa(), bf16_probs) == Bf16Products::Amx;
}

bool attention_keys_to_bf16(const float* x, int64_t n, uint16_t* out) {
  const Isa isa = cpu_isa();
  if (isa == Isa::Scalar) {
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t u = std::bit_cast<uint32_t>(x[i]);
      const float m = std::fabs(x[i]);
      if ((u & 0xffffu) != 0 || (m != 0 && !(m >= 0x1p-56f))) return false;
      out[i] = uint16_t(u >> 16);
    }
    return true;
  }
  return (isa == Isa::Avx512 ? attention_isa::kAvx512 : attention_isa::kAvx2)
      .to_bf16_floored(x, n, out);
}

void sparse_attention_ref(const SparseAttnArgs& in) {
  const SparseAttnArgs a = with_fp32_keys(in);
  // fp32 numerics: the exact formula, fp32 scores, softmax with the sink and the weighted sum in
  // double, rounded once. Independent of how the key list is split.
  t_z.resize(size_t(a.nk));
  t_acc.resize(size_t(a.Dh));
  for (int64_t h = 0; h < a.H; ++h) {
    float* o = a.out + h * a.Dh;
    if (a.exact) {
      double m;
      const double l = exact_head(a, a.q + h * a.Dh, a.sink + h, t_z.data(), t_acc.data(), &m);
      for (int64_t d = 0; d < a.Dh; ++d) o[d] = f32(t_acc[size_t(d)] / l);
    } else {
      float m;
      float l = online_head(a, a.q + h * a.Dh, o, &m);
      l = l + exp_f(a.sink[h] - m);
      for (int64_t d = 0; d < a.Dh; ++d) o[d] = o[d] / l;
    }
  }
}

void sparse_attention(const SparseAttnArgs& in) {
  const Isa isa = cpu_isa();
  if (in.exact || isa == Isa::Scalar || in.Dh % 32 != 0 || in.nk == 0) {
    sparse_attention_ref(in);
    return;
  }
  const attention_isa::Kernels& kern =
      isa == Isa::Avx512 ? attention_isa::kAvx512 : attention_isa::kAvx2;
  const int64_t lanes = kern.lanes;
  // bf16 operands (AMX tiles, or vdpbf16ps: bf16_attention) where their products and sums are
  // the fused chains' (bf16 values, none subnormal; bf16 keys are checked block by block). They
  // read keys as bf16: fp32 keys are converted here (and stay on vectors when a value is not one
  // the products take exactly).
  const Bf16Products mode = bf16_attention(isa, in.bf16_probs);
  bool bf16_ops = mode != Bf16Products::None && kern.all_bf16_floored(in.q, in.H * in.Dh);
  SparseAttnArgs a = in;
  if (bf16_ops && !in.keys_bf16 && !in.key_rows) {
    thread_local std::vector<uint16_t> t_keys16;  // reused: no allocation once large enough
    t_keys16.resize(size_t(in.nk * in.Dh));
    bf16_ops = kern.to_bf16_floored(in.keys, in.nk * in.Dh, t_keys16.data());
    if (bf16_ops) {
      a.keys = nullptr;
      a.keys_bf16 = t_keys16.data();
    }
  }
  if (!bf16_ops) a = with_fp32_keys(in);
  ThreadPool::global().parallel_for((a.H + lanes - 1) / lanes, 1, [&](int64_t g0, int64_t g1) {
    attention_isa::Job j{
        .a = &a,
        .amx = bf16_ops && mode == Bf16Products::Amx,
        .dp = bf16_ops && mode == Bf16Products::Dp,
        .scratch = t_scratch.floats(attention_isa::attention_scratch_floats(a.Dh, a.nk, bf16_ops)),
        .exp_n = exp_f_n};
    for (int64_t g = g0; g < g1; ++g) {
      j.h0 = g * lanes;
      j.nh = std::min(lanes, a.H - j.h0);
      kern.group(j);
    }
  });
}

void sparse_attention_partial(const SparseAttnArgs& in, double* part) {
  const SparseAttnArgs a = with_fp32_keys(in);
  const int64_t stride = attention_partial_size(1, a.Dh);
  t_z.resize(size_t(a.nk));
  t_o.resize(size_t(a.Dh));
  for (int64_t h = 0; h < a.H; ++h) {
    const float* q = a.q + h * a.Dh;
    double* p = part + h * stride;
    double* acc = p + 2;
    // No keys: l = 0 and acc = 0 (the max, -inf or the kernel's -1e30, then changes no merge).
    if (a.exact) {
      p[1] = exact_head(a, q, nullptr, t_z.data(), acc, &p[0]);
    } else {
      float m;
      p[1] = online_head(a, q, t_o.data(), &m);
      p[0] = m;
      std::copy_n(t_o.begin(), a.Dh, acc);
    }
  }
}

void merge_attention_partials(const double* parts, int n_parts, int64_t part_stride,
                              const float* sink, int64_t H, int64_t Dh, bool exact, float* out) {
  const int64_t stride = attention_partial_size(1, Dh);
  t_acc.resize(size_t(Dh));
  for (int64_t h = 0; h < H; ++h) {
    float* o = out + h * Dh;
    if (exact)
      merge_head<double>(parts + h * stride, n_parts, part_stride, Dh, sink[h], sink[h],
                         t_acc.data(), o);
    else
      merge_head<float>(parts + h * stride, n_parts, part_stride, Dh, sink[h], -1e30f, o, o);
  }
}

// --- indexer ---

void indexer_scores_ref(const IndexerScoreArgs& a) {
  for (int64_t t = 0; t < a.T; ++t) {
    if (t >= a.visible) {
      a.scores[t] = -INFINITY;
      continue;
    }
    const float* k = a.keys + t * a.Di;
    double sd = 0;
    float sf = 0;
    for (int64_t h = 0; h < a.Hi; ++h) {
      float d =
          a.exact ? dot_f64(a.qi + h * a.Di, k, a.Di) : canonical_dot(a.qi + h * a.Di, k, a.Di);
      if (a.bf16) d = round_bf16(d);
      float term = std::max(d, 0.0f) * a.w[h];
      if (a.bf16) term = round_bf16(term);
      sd += term;
      sf += term;
    }
    const float s = a.exact ? f32(sd) : sf;
    a.scores[t] = a.bf16 ? round_bf16(s) : s;
  }
}

void indexer_scores(const IndexerScoreArgs& a) {
  const Isa isa = cpu_isa();
  if (a.exact || isa == Isa::Scalar || a.Di % 32 != 0 || a.Hi > attention_isa::kIndexerMaxHeads) {
    indexer_scores_ref(a);
    return;
  }
  const int64_t visible = std::min(a.visible, a.T);
  for (int64_t t = std::max<int64_t>(visible, 0); t < a.T; ++t) a.scores[t] = -INFINITY;
  if (visible <= 0) return;
  const attention_isa::Kernels& kern =
      isa == Isa::Avx512 ? attention_isa::kAvx512 : attention_isa::kAvx2;
  const bool fma = kern.all_bf16(a.qi, a.Hi * a.Di) && kern.all_bf16(a.keys, visible * a.Di);
  // Rows in chunks that amortize the per-task query transpose.
  const int64_t grain = std::max<int64_t>(64, visible / (2 * ThreadPool::global().size()));
  const int64_t lanes = (a.Hi + 15) / 16 * 16;  // enough for either ISA's padding
  ThreadPool::global().parallel_for(visible, grain, [&](int64_t t0, int64_t t1) {
    // qT [Di][lanes], head weights [lanes], terms [4][lanes].
    kern.indexer_scores({&a, t0, t1, fma, t_scratch.floats(a.Di * lanes + lanes + 4 * lanes + 64)});
  });
}

int64_t select_best(ScoredId* in, int64_t n, int64_t k, ScoredId* out) {
  const int64_t m =
      std::remove_if(in, in + n, [](const ScoredId& s) { return s.score == -INFINITY; }) - in;
  // An O(m) selection. `better` is a strict total order (ids are distinct), so the set is unique.
  const int64_t keep = std::min(k, m);
  if (keep <= 0) return 0;
  if (keep < m) std::nth_element(in, in + keep - 1, in + m, better);
  std::copy(in, in + keep, out);
  return keep;
}

int64_t select_top(ScoredId* in, int64_t n, int64_t k, ScoredId* out) {
  const int64_t keep = select_best(in, n, k, out);
  std::sort(out, out + keep, better);
  return keep;
}

void pair_key_rows_ref(const uint16_t* rows, int64_t n_pairs, int64_t Dh, uint16_t* out) {
  for (int64_t p = 0; p < n_pairs; ++p) {
    const uint16_t* k0 = rows + 2 * p * Dh;
    const uint16_t* k1 = k0 + Dh;
    uint16_t* o = out + p * 2 * Dh;
    for (int64_t d = 0; d < Dh; ++d) {
      o[2 * d] = k0[d];
      o[2 * d + 1] = k1[d];
    }
  }
}

void pair_key_rows(const uint16_t* rows, int64_t n_pairs, int64_t Dh, uint16_t* out) {
  if (cpu_isa() == Isa::Avx512 && Dh % 32 == 0)
    return attention_isa::kAvx512.pair_rows(rows, n_pairs, Dh, out);
  pair_key_rows_ref(rows, n_pairs, Dh, out);
}

void sort_ids(int32_t* ids, int64_t n) {
  if (n <= 1) return;
  const int32_t top = *std::max_element(ids, ids + n);
  if (top / 16 > n) return std::sort(ids, ids + n);  // sparse: comparisons
  thread_local std::vector<uint64_t> bits;           // reused: no allocation once large enough
  bits.assign(size_t(top / 64 + 1), 0);
  for (int64_t i = 0; i < n; ++i) bits[size_t(ids[i] / 64)] |= uint64_t(1) << (ids[i] % 64);
  int64_t j = 0;
  for (size_t w = 0; w < bits.size(); ++w)
    for (uint64_t b = bits[w]; b; b &= b - 1)
      ids[j++] = int32_t(w * 64 + size_t(__builtin_ctzll(b)));
}

}  // namespace deepinfer
