// `deepinfer bench decode`: end-to-end decode and prefill through Model::forward with a KvCache
// (no serving engine), against the machine's limits measured in the same run: read bandwidth /
// weight bytes touched per step for decode, the matmul FLOP ceiling / FLOPs per token for prefill.
#pragma once

#include <string>
#include <vector>

#include "bench_util.h"

namespace deepinfer::bench {

struct DecodeBenchOptions {
  std::string model_dir;
  std::vector<int> batches = {1, 4, 16};
  int prompt = 32;           // tokens of context before the timed decode steps
  int steps = 4;             // timed decode steps per pair
  int pairs = 5;             // alternated (limit, measurement) samples per figure
  int prefill_tokens = 256;  // one prompt in one forward call
  bool regions = false;      // print the model's region timings
  bool onednn = true;        // the FLOP ceiling for prefill
  // Speculative decoding (> 0: drafts per step): engine decode with every draft accepted
  // (drafts from a plain run's output) and with n-gram drafts, against plain decode.
  int speculative = 0;
  int spec_tokens = 32;  // tokens generated per request
};

void bench_decode(Reporter& rep, const DecodeBenchOptions& opt);

// The vision tower (docs/vision.md): one image of the largest square token grid that fits
// vision_max_n_token (or `tokens` image tokens' grid), its time against the FLOP limit (oneDNN's
// bf16 matmul peak), alternated `pairs` times.
struct VisionBenchOptions {
  std::string model_dir;
  int pairs = 3;
  int64_t side = 0;  // the token grid's side (0: the largest that fits)
};
void bench_vision(Reporter& rep, const VisionBenchOptions& opt);

}  // namespace deepinfer::bench
