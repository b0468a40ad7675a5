// Next-token selection from one row of logits (leader rank only). Deterministic: the random draw
// of a request's i-th token depends only on its seed and i, so the same request and seed give the
// same tokens whatever else is in the batch, and after preemption.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/request.h"

namespace deepinfer {

struct SampleInput {
  const float* logits;  // [vocab]
  const SamplingParams* params;
  const std::vector<int32_t>* tokens;  // prompt + generated so far
  int64_t num_prompt;
  uint64_t seed;  // the request's seed (or one derived for it)
  // With a grammar: the tokens that may be chosen (bit t % 64 of word t / 64); null: all.
  // Logprobs stay those of the model's distribution.
  const uint64_t* allowed = nullptr;
};

class Sampler {
 public:
  explicit Sampler(int64_t vocab) : vocab_(vocab) {}
  // The chosen token; fills `top` with the top-K logprobs of the raw distribution when K > 0,
  // followed by the chosen token's when it is not among them.
  int32_t sample(const SampleInput& in, TopLogprobs* top);

 private:
  int32_t choose(const SampleInput& in);
  int64_t vocab_;
  std::vector<float> work_;
  std::vector<int32_t> ids_;
  std::vector<double> prob_;
  std::vector<int32_t> count_;  // per-token counts of one history, zero between calls
};

}  // namespace deepinfer
