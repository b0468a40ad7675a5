// A request in flight: its tokens (prompt then generated), how many the model has computed, and
// the KV it holds. Owned by the Scheduler; the Sampler reads its history.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "engine/request.h"
#include "grammar/grammar.h"

namespace deepinfer {

enum class SeqStatus { Waiting, Running, Finished };

struct Sequence {
  Request req;
  uint64_t arrival = 0;         // admission order (FCFS)
  std::vector<int32_t> tokens;  // prompt + generated
  int64_t num_prompt = 0;
  int64_t num_computed = 0;  // tokens whose KV is in the cache
  SeqStatus status = SeqStatus::Waiting;
  std::vector<int32_t> blocks;  // block table
  int32_t slot = -1;            // fixed-state slot while running
  bool table_reset = true;      // the runner must start its mirror of the table afresh
  size_t blocks_sent = 0;       // blocks already announced to the runner
  std::vector<TopLogprobs> logprobs;
  FinishReason finish = FinishReason::None;
  std::string stop_text;
  std::unique_ptr<grammar::Matcher> matcher;  // with a grammar: where the output stands in it

  int64_t num_generated() const { return int64_t(tokens.size()) - num_prompt; }
  // Tokens still to compute before the next token can be sampled.
  int64_t num_pending() const { return int64_t(tokens.size()) - num_computed; }
};

}  // namespace deepinfer
