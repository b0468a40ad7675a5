// The only place that knows both scheduling structs and tensors (DESIGN.md §3): turns a
// SchedOutput into a ForwardBatch (flat tokens, positions, block tables, bucket padding), runs the
// model, and hands back the logits of the rows that sample. Keeps a mirror of every running
// sequence's block table, updated from the differences in each SchedOutput — the same code runs
// on follower ranks, which replay the leader's SchedOutputs.
#pragma once

#include <unordered_map>
#include <vector>

#include "ranks/world.h"
#include "engine/scheduler.h"
#include "model/model.h"

namespace deepinfer {

class ModelRunner {
 public:
  // With logits = false (replica followers, which do not sample) no logits are computed.
  ModelRunner(Model& model, KvCache& kv, bool logits = true)
      : model_(model), kv_(kv), want_logits_(logits) {}
  // Runs the step; returns [number of sampling sequences, vocab] logits in SchedOutput order.
  // An empty step runs the model only when `always` (an idle data-parallel rank's placeholder).
  const std::vector<float>& execute(const SchedOutput& out, bool always = false);
  size_t num_tables() const { return tables_.size(); }

 private:
  Model& model_;
  KvCache& kv_;
  std::unordered_map<uint64_t, std::vector<int32_t>> tables_;
  ForwardBatch batch_;
  std::vector<float> logits_;
  bool want_logits_ = true;
};

// A replica follower: replays the leader's step messages until the shutdown message.
void run_replica_follower(ModelRunner& runner, ranks::StepChannel& channel);

}  // namespace deepinfer
