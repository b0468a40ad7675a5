// Requests and their results, as the engine sees them (DESIGN.md §1). Plain data: the server and
// the offline runner build Requests from JSON/CLI input; the engine returns TokenEvents while a
// request runs and one RequestOutput when it ends.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace deepinfer {

namespace grammar {
class Grammar;
}

using RequestId = uint64_t;

struct SamplingParams {
  int64_t max_tokens = 16;
  float temperature = 1.0f;         // 0 = greedy
  int64_t top_k = 0;                // 0 = off
  float top_p = 1.0f;               // 1 = off
  float min_p = 0.0f;               // 0 = off
  float repetition_penalty = 1.0f;  // 1 = off; over prompt and output tokens
  float presence_penalty = 0.0f;    // over output tokens
  float frequency_penalty = 0.0f;   // over output tokens
  std::optional<uint64_t> seed;     // per-request seed: same request + seed = same tokens
  std::vector<int32_t> stop_token_ids;
  std::vector<std::string> stop;  // stop strings (need a tokenizer)
  bool ignore_eos = false;
  int64_t logprobs = 0;  // top-K logprobs per generated token (0 = none)
  // Constrained output (grammar/grammar.h): only tokens that keep the output in the grammar
  // are sampled, and the request stops once the grammar is complete and nothing can follow.
  // Compiled for this model's vocabulary; shared, immutable.
  std::shared_ptr<const grammar::Grammar> grammar;
  // What `grammar` was compiled from, as bytes another process can compile it from again (the
  // server's encoded output shape); empty without a grammar.
  std::string grammar_source;
  // Speculative decoding, for benchmarks and tests: while the output follows this earlier output
  // of the same request, drafts are taken from it (then from the n-gram lookup). Verification
  // decides as for any draft, so it changes speed, never tokens.
  std::vector<int32_t> draft_reference;
};

// An image of a prompt (docs/vision.md) as vision::preprocess makes it: its patch grid.
struct RequestImage {
  std::vector<uint16_t> patches;  // bf16 [vit_h * vit_w, 3 p^2]
  int64_t vit_h = 0, vit_w = 0;
};

struct Request {
  RequestId id = 0;
  // With images, each image_token_id here stands for one image, in order: the engine replaces it
  // by the image's span and runs the vision tower before the request is scheduled.
  std::vector<int32_t> prompt_ids;
  SamplingParams params;
  std::vector<RequestImage> images;
};

enum class FinishReason { None, Length, Stop, Abort, Error };
inline const char* finish_reason_name(FinishReason r) {
  static const char* const names[] = {"none", "length", "stop", "abort", "error"};
  return names[size_t(r)];
}

using TopLogprobs = std::vector<std::pair<int32_t, float>>;  // descending

// One generated token of one request, emitted by the step that sampled it.
struct TokenEvent {
  RequestId id = 0;
  int32_t token = -1;
  TopLogprobs logprobs;  // empty unless requested
};

struct RequestOutput {
  RequestId id = 0;
  std::vector<int32_t> prompt_ids;
  std::vector<int32_t> output_ids;
  std::vector<TopLogprobs> logprobs;
  FinishReason finish = FinishReason::None;
  std::string stop_text;              // the stop string that ended it, if any
  int64_t drafted = 0, accepted = 0;  // speculative decoding: drafts verified and accepted
};

}  // namespace deepinfer
