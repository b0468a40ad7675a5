// Indexer scores (the reference and the dispatch to the vector paths) and the top-k selection.
// The exact formula, the scalar ISA and head counts above attention_isa::kIndexerMaxHeads take
// the reference; the vector paths split the visible rows over the thread pool (each row scored by
// one task, in the reference's order).
#include "kernels/indexer.h"

#include <algorithm>
#include <cmath>

#include "core/cpu.h"
#include "core/dtype.h"
#include "core/thread_pool.h"
#include "kernels/elementwise.h"
#include "kernels/isa.h"
#include "kernels/reduce.h"

namespace deepinfer {

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

namespace {
thread_local AlignedScratch t_scratch;
}  // namespace

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

int64_t select_top(ScoredId* in, int64_t n, int64_t k, ScoredId* out) {
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i)
    if (in[i].score != -INFINITY) in[m++] = in[i];
  // An O(m) selection, then a sort of the kept ones. `better` is a strict total order (ids are
  // distinct), so the result is unique.
  const int64_t keep = std::min(k, m);
  if (keep <= 0) return 0;
  if (keep < m) std::nth_element(in, in + keep - 1, in + m, better);
  std::sort(in, in + keep, better);
  std::copy(in, in + keep, out);
  return keep;
}

}  // namespace deepinfer
