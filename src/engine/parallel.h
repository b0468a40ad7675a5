// Ranks of one run and who does what (DESIGN.md §1, §3).
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
#include <string>
#include <vector>

#include "engine/scheduler.h"
#include "model/model.h"
#include "ranks/group.h"
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
  int world_rank = 0, dp_rank = 0, replica_rank = 0;
  int expert_begin = 0, expert_end = 0;
  bool scheduler = true;                  // runs a scheduler and a sampler (replica rank 0)
  std::unique_ptr<ranks::Group> replica;  // ranks sharing tokens (size 1: none)
  std::unique_ptr<ranks::Group> dp;       // one rank per replica (for the vote), null if dp = 1
  ranks::StepChannel* channel = nullptr;  // replica rank 0 -> the others (dp = 1 only)
  ModelParallel model;                    // the model's strategies over these groups
};

// Builds the layout over `world` (which must have cfg.world_size() ranks); its backend decides
// --engram-sharding auto.
RankLayout make_rank_layout(const ParallelConfig& cfg, ranks::World& world, int n_experts);

// The step message replica followers replay.
std::vector<uint8_t> encode_sched_output(const SchedOutput& out);
SchedOutput decode_sched_output(std::span<const uint8_t> bytes);

}  // namespace deepinfer
