// Dispatch of sparse attention: the exact formula and the scalar ISA take the reference; the
// vector paths split the heads into groups of one vector width (16 AVX-512 lanes, 8 AVX2 lanes),
// one task each. Every head is computed by one task in the reference's order, so the result does
// not depend on the path or the thread count.
#include <cmath>
#include <vector>

#include "core/cpu.h"
#include "core/thread_pool.h"
#include "kernels/attention.h"
#include "kernels/attention_isa.h"
#include "kernels/scratch.h"

namespace deepinfer {

namespace attention_isa {

int64_t scratch_floats(const SparseAttnArgs& a, int64_t lanes) {
  // qT [Dh][lanes], scores [nk][lanes], probabilities [64][lanes], a few vectors.
  return a.Dh * lanes + a.nk * lanes + 64 * lanes + 4 * lanes + 64;
}

}  // namespace attention_isa

namespace {

void exp_n(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = float(std::exp(double(x[i])));
}

thread_local AlignedScratch t_scratch;

float* scratch(int64_t floats) {
  return t_scratch.floats(floats);
}

}  // namespace

void sparse_attention(const SparseAttnArgs& a) {
  const Isa isa = cpu_isa();
  if (a.exact || isa == Isa::Scalar || a.Dh % 32 != 0 || a.nk == 0) {
    sparse_attention_ref(a);
    return;
  }
  const attention_isa::Kernels& kern = isa == Isa::Avx512 ? attention_isa::kernels<Isa::Avx512>()
                                                          : attention_isa::kernels<Isa::Avx2>();
  const int64_t lanes = kern.lanes;
  const bool q_bf16 = kern.all_bf16(a.q, a.H * a.Dh), k_bf16 = kern.all_bf16(a.keys, a.nk * a.Dh);
  const int64_t groups = (a.H + lanes - 1) / lanes;
  auto run = [&](int64_t g0, int64_t g1) {
    float* s = scratch(attention_isa::scratch_floats(a, lanes));
    for (int64_t g = g0; g < g1; ++g) {
      attention_isa::Job j;
      j.a = &a;
      j.h0 = g * lanes;
      j.nh = std::min(lanes, a.H - j.h0);
      j.fma_qk = q_bf16 && k_bf16;
      j.fma_pv = a.bf16_probs && k_bf16;
      j.scratch = s;
      j.exp_n = exp_n;
      kern.group(j);
    }
  };
  ThreadPool::global().parallel_for(groups, 1, run);
}

}  // namespace deepinfer
