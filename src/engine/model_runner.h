// The only place that knows both scheduling structs and tensors (DESIGN.md §3): turns a
// SchedOutput into a ForwardBatch (flat tokens, positions, block tables, bucket padding), runs the
// model, and hands back the logits of the rows that sample. Keeps a mirror of every running
// sequence's block table, updated from the differences in each SchedOutput — the same code runs
// on follower ranks, which replay the leader's SchedOutputs.
//
// A scheduling rank's runner also says how its steps go with the other ranks, so that the engine
// loop is the same for every layout: alone (sending each step to the replica's followers, if
// any), or in lockstep with the other data-parallel replicas.
#pragma once

#include <span>
#include <unordered_map>
#include <vector>

#include "engine/scheduler.h"
#include "model/model.h"
#include "ranks/world.h"

namespace deepinfer {

struct RankLayout;

class ModelRunner {
 public:
  // With logits = false (replica followers, which do not sample) no logits are computed.
  // `layout`: that of a scheduling rank (null: a single rank).
  ModelRunner(Model& model, KvCache& kv, bool logits = true, const RankLayout* layout = nullptr);

  // Before scheduling: false when no rank has anything to do (no step), else whether this step
  // may prefill.
  bool begin_step(const Scheduler& s, bool* allow_prefill);
  // Runs a scheduled step; returns its logits, or null when nothing ran.
  const std::vector<float>* run(const SchedOutput& out);
  // Other ranks still have work, so this one must keep stepping with them.
  bool others_busy() const { return dp_ && busy_; }

  // Runs the step; returns [number of sampling sequences, vocab] logits in SchedOutput order.
  // An empty step runs the model only when `always` (an idle data-parallel rank's placeholder).
  const std::vector<float>& execute(const SchedOutput& out, bool always = false);
  // DSpark, after the step `out` ran: sequence i keeps its real rows and its first accepted[i]
  // drafts (their positions enter the draft head's rings) and, when from[i] >= 0, drafts `slots`
  // tokens after that token. The result's blocks are those sequences', in order.
  const DraftOutput& draft(const SchedOutput& out, std::span<const int32_t> accepted,
                           std::span<const int32_t> from, int slots);

 private:
  Model& model_;
  KvCache& kv_;
  std::unordered_map<uint64_t, std::vector<int32_t>> tables_;
  ForwardBatch batch_;
  std::vector<float> logits_;
  std::vector<DraftSeq> draft_in_;
  DraftOutput draft_out_;
  bool want_logits_ = true;
  ranks::StepChannel* followers_ = nullptr;  // where every step run goes first
  // Data-parallel replicas step together: every step all of them learn whether anyone has work,
  // and every `interval_` steps they vote on whether the step may prefill. With experts split
  // over the replicas an idle rank still runs the (empty) step: the experts' collectives need it.
  ranks::Group* dp_ = nullptr;
  int64_t interval_ = 1, steps_ = 0;
  bool empty_steps_ = false, busy_ = true;
};

// A replica follower: replays the leader's step messages until the shutdown message.
void run_replica_follower(ModelRunner& runner, ranks::StepChannel& channel);

}  // namespace deepinfer
