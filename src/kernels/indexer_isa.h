// Internal to the indexer scores: what the dispatcher (indexer_fast.cpp) hands the ISA kernels
// (indexer_avx512.cpp, indexer_avx2.cpp). Plain structs only.
#pragma once

#include <cstdint>

#include "kernels/indexer.h"

namespace deepinfer::indexer_isa {

struct Job {
  const IndexerScoreArgs* a = nullptr;
  int64_t t0 = 0, t1 = 0;    // visible rows to score
  bool fma = false;          // q·k products are exact (bf16 values): fused multiply-adds agree
  float* scratch = nullptr;  // scratch_floats(a) floats, 64-byte aligned
};

// Largest head count the vector kernels take (more runs the reference).
constexpr int64_t kMaxHeads = 64;
int64_t scratch_floats(const IndexerScoreArgs& a);

void scores_avx512(const Job& j);
void scores_avx2(const Job& j);

}  // namespace deepinfer::indexer_isa
