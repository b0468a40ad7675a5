// Internal to the indexer scores: what the dispatcher (indexer_fast.cpp) hands the vector kernel
// (indexer_vec.cpp, compiled once per ISA). Plain structs only.
#pragma once

#include <cstdint>

#include "core/cpu.h"
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

using Fn = void (*)(const Job& j);
template <Isa>
Fn kernel();
template <>
Fn kernel<Isa::Avx2>();
template <>
Fn kernel<Isa::Avx512>();

}  // namespace deepinfer::indexer_isa
