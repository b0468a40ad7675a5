// `deepinfer bench linear`, `bench bandwidth` and `bench pool`: kernel-level figures against the
// machine limits measured in the same run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench_util.h"

namespace deepinfer::bench {

struct LinearShape {
  int64_t in, out;
  std::string name;
};

struct LinearBenchOptions {
  std::vector<std::string> formats = {"fp8", "fp4"};
  std::vector<LinearShape> shapes;       // empty: the V4.1-Flash shapes
  std::vector<int64_t> gemv_rows = {1};  // decode rows (a verify step of K drafts: K + 1)
  std::vector<int64_t> gemm_rows = {16, 128, 512};
  uint64_t working_set = uint64_t(256) << 20;  // weights cycled through, per side
  int pairs = 5;                               // alternated (limit, kernel) samples per figure
  bool onednn = true;
};

std::vector<LinearShape> flash_shapes();
void bench_bandwidth(Reporter& rep, uint64_t bytes, int reps);
void bench_linear(Reporter& rep, const LinearBenchOptions& opt);
void bench_pool(Reporter& rep, int calls);

}  // namespace deepinfer::bench
