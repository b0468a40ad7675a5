// Dispatch of the indexer scores: the exact formula, the scalar ISA and head counts above
// indexer_isa::kMaxHeads take the reference; the vector paths split the visible rows over the
// thread pool (each row scored by one task, in the reference's order).
#include <cmath>
#include <vector>

#include "core/cpu.h"
#include "core/thread_pool.h"
#include "kernels/attention_isa.h"
#include "kernels/indexer.h"
#include "kernels/indexer_isa.h"
#include "kernels/scratch.h"

namespace deepinfer {

namespace indexer_isa {

int64_t scratch_floats(const IndexerScoreArgs& a) {
  const int64_t lanes = (a.Hi + 15) / 16 * 16;  // enough for either ISA's padding
  return a.Di * lanes + lanes + 4 * lanes + 64;
}

}  // namespace indexer_isa

namespace {

thread_local AlignedScratch t_scratch;

float* scratch(int64_t floats) {
  return t_scratch.floats(floats);
}

}  // namespace

void indexer_scores(const IndexerScoreArgs& a) {
  const Isa isa = cpu_isa();
  if (a.exact || isa == Isa::Scalar || a.Di % 32 != 0 || a.Hi > indexer_isa::kMaxHeads) {
    indexer_scores_ref(a);
    return;
  }
  const int64_t visible = std::min(a.visible, a.T);
  for (int64_t t = std::max<int64_t>(visible, 0); t < a.T; ++t) a.scores[t] = -INFINITY;
  if (visible <= 0) return;
  const bool avx512 = isa == Isa::Avx512;
  auto all_bf16 = avx512 ? attention_isa::kernels<Isa::Avx512>().all_bf16
                         : attention_isa::kernels<Isa::Avx2>().all_bf16;
  const indexer_isa::Fn run =
      avx512 ? indexer_isa::kernel<Isa::Avx512>() : indexer_isa::kernel<Isa::Avx2>();
  const bool fma = all_bf16(a.qi, a.Hi * a.Di) && all_bf16(a.keys, visible * a.Di);
  // Rows in chunks that amortize the per-task query transpose.
  const int64_t grain = std::max<int64_t>(64, visible / (2 * ThreadPool::global().size()));
  ThreadPool::global().parallel_for(visible, grain, [&](int64_t t0, int64_t t1) {
    indexer_isa::Job j;
    j.a = &a;
    j.t0 = t0;
    j.t1 = t1;
    j.fma = fma;
    j.scratch = scratch(indexer_isa::scratch_floats(a));
    run(j);
  });
}

}  // namespace deepinfer
