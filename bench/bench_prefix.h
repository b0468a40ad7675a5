// `deepinfer bench prefix-cache`: time to first token of a request whose prompt starts with a
// prefix an earlier request left in the prefix cache, against the same request computed cold,
// alternated (cold, cached) pair by pair on one model.
#pragma once

#include <string>

#include "bench_util.h"

namespace deepinfer::bench {

struct PrefixBenchOptions {
  std::string model_dir;
  int prefix = 2048;  // tokens shared with the earlier request
  int suffix = 32;    // tokens of each request after the prefix
  int pairs = 3;
};

void bench_prefix(Reporter& rep, const PrefixBenchOptions& opt);

}  // namespace deepinfer::bench
