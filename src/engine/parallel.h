// Ranks of one run, who does what (DESIGN.md §1, §3), and the model runner that runs each step.
//
// A run has dp data-parallel replicas. Inside a replica all ranks see the same tokens: with
// context parallelism (cp) they split each sequence's compressed KV and index keys (block i of a
// sequence on replica rank i mod cp); with expert parallelism (ep) they split the routed experts
// and combine them with one all-reduce ("static MoE"). Replica rank 0 runs the scheduler and the
// sampler and sends each step's SchedOutput to the others, which replay it. Across replicas
// (dp > 1, one rank per replica) every rank schedules its own requests; experts may be split
// over all of them (ep = dp), tokens then travel to the experts with an all-gather and come back
// with a reduce-scatter, and the ranks step in lockstep: every --prefill-attempt-interval steps
// they vote on whether the step may prefill, and a rank with nothing to do runs an empty step.
//
// Supported shapes: dp = 1 with cp, ep in {1, g} (g = max(cp, ep) ranks); dp > 1 with cp = 1 and
// ep in {1, dp}.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/scheduler.h"
#include "model/model.h"
#include "ranks/group.h"
#include "ranks/serial.h"
#include "ranks/world.h"

namespace deepinfer {

struct ParallelConfig {
  int dp = 1, cp = 1, ep = 1;
  int prefill_attempt_interval = 1;
  std::string engram_sharding = "auto";  // auto | on | off

  // Ranks per replica: with dp > 1 a replica is one rank (experts then span the replicas).
  int replica_size() const { return dp > 1 ? 1 : (cp > ep ? cp : ep); }
  int world_size() const { return dp * replica_size(); }
  void validate(int n_experts) const;
};

// This rank's place in the run, and the groups it talks over.
struct RankLayout {
  ParallelConfig cfg;
  int expert_begin = 0, expert_end = 0;
  bool scheduler = true;                  // runs a scheduler and a sampler (replica rank 0)
  std::unique_ptr<ranks::Group> replica;  // ranks sharing tokens (size 1: none)
  std::unique_ptr<ranks::Group> dp;       // one rank per replica (for the vote), null if dp = 1
  ranks::StepChannel* channel = nullptr;  // replica rank 0 -> the others (dp = 1 only)
  ModelParallel model;                    // the model's strategies over these groups
};

// Builds the layout over `world` (which must have cfg.world_size() ranks) for a valid `cfg`
// (ParallelConfig::validate); its backend decides --engram-sharding auto.
RankLayout make_rank_layout(const ParallelConfig& cfg, ranks::World& world, int n_experts);

// The step message replica followers replay.
std::vector<uint8_t> encode_sched_output(const SchedOutput& out);
SchedOutput decode_sched_output(std::span<const uint8_t> bytes);

// The model runner, the only place that knows both scheduling structs and tensors (DESIGN.md §3):
// turns a SchedOutput into a ForwardBatch (flat tokens, positions, block tables, bucket padding),
// runs the model, and hands back the logits of the rows that sample. Keeps a mirror of every
// running sequence's block table, updated from the differences in each SchedOutput — the same
// code runs on follower ranks, which replay the leader's SchedOutputs.
//
// A scheduling rank's runner also says how its steps go with the other ranks, so that the engine
// loop is the same for every layout: alone (sending each step to the replica's followers, if
// any), or in lockstep with the other data-parallel replicas.
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
  // Other ranks run this rank's steps (image rows' embeddings are not sent to them).
  bool alone() const { return !followers_ && !dp_; }

  // Runs the step; returns [number of sampling sequences, vocab] logits in SchedOutput order.
  // An empty step runs the model only on a rank that takes empty steps (an idle data-parallel
  // rank's placeholder).
  const std::vector<float>& execute(const SchedOutput& out);

 private:
  Model& model_;
  KvCache& kv_;
  std::unordered_map<uint64_t, std::vector<int32_t>> tables_;
  ForwardBatch batch_;
  std::vector<float> logits_;
  bool want_logits_ = true;
  ranks::StepChannel* followers_ = nullptr;  // where every step run goes first
  // Data-parallel replicas step together: every step all of them learn whether anyone has work,
  // and every `interval_` steps they vote on whether the step may prefill. With experts split
  // over the replicas an idle rank still runs the (empty) step: the experts' collectives need it.
  ranks::Group* dp_ = nullptr;
  int64_t interval_ = 1, steps_ = 0;
  bool empty_steps_ = false, busy_ = true;
};

}  // namespace deepinfer
