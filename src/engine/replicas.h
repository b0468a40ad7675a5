// Data-parallel serving (DESIGN.md §1): one front over the data-parallel replicas of a run, used
// like one Engine by a caller on the run's first rank (the server's engine thread, the offline
// runner).
//
// Rank 0 of the dp group holds the front and its own replica's Engine; every other replica rank
// runs serve_replica. A request goes to the least loaded replica (fewest waiting requests, then
// fewest KV blocks in use, then fewest running), or to the replica that took the last prompt
// starting with the same KV block when its queue is no longer (cache affinity). Each step the ranks
// make one exchange over the dp group: the front sends each replica its new requests and aborts,
// each replica sends back the tokens and endings of its previous step and its load; then every
// replica runs its own Engine::step (which keeps the replicas in lockstep for the experts'
// collectives and the prefill vote). A remote replica's tokens therefore reach the caller one step
// after they were sampled. Tokens do not depend on the replica: requests carry their seeds, and a
// constrained request its grammar's source, which the replica compiles again.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "ranks/group.h"

namespace deepinfer {

// A replica's state, as load balancing and metrics see it.
struct EngineLoad {
  int64_t running = 0, waiting = 0;
  int32_t kv_blocks_used = 0;
  EngineStats stats;
};
EngineLoad engine_load(const Engine& e);

// Compiles the grammar of a request from its SamplingParams::grammar_source (throws
// deepinfer::Error when it cannot).
using GrammarResolver = std::function<std::shared_ptr<const grammar::Grammar>(std::string_view)>;

class Replicas {
 public:
  // `dp`: the data-parallel group, whose rank 0 this is (the others run serve_replica); null
  // when `local` is the only replica.
  Replicas(Engine& local, ranks::Group* dp = nullptr);

  // As Engine: validation (against this replica's engine, the same model and limits as every
  // other's), then the request is queued on the least loaded replica.
  std::string add_request(Request req);
  std::vector<TokenEvent> step();
  std::vector<RequestOutput> take_finished();
  bool has_unfinished() const;
  bool abort(RequestId id);

  int size() const { return int(remote_loads_.size()) + 1; }
  // Per replica, the others' as of their latest report.
  std::vector<EngineLoad> loads() const;
  // Over all replicas: counts summed (the KV peak too: a sum of the replicas' peaks), steps
  // this replica's, seconds the longest replica's.
  EngineLoad total() const;
  // Ends the other replicas' serve_replica loops (after the last step; idempotent).
  void shutdown();

 private:
  // The replica for a new request: the least loaded, unless the replica that last took a prompt
  // with the same first KV block (whose prefix cache likely holds it) has no longer a queue.
  int pick(const Request& req);
  // One exchange with the other replicas.
  void exchange(bool shutdown);

  Engine& local_;
  ranks::Group* dp_;
  bool shut_down_ = false;
  // Per remote replica r (index r - 1).
  std::vector<EngineLoad> remote_loads_;
  std::vector<int64_t> unreported_;  // requests sent or queued since its latest report
  std::vector<std::vector<Request>> queued_;
  std::vector<std::vector<RequestId>> aborts_;
  std::unordered_map<RequestId, int> remote_;   // requests in remote replicas -> replica
  std::unordered_map<uint64_t, int> affinity_;  // hash of a prompt's first block -> replica
  std::vector<TokenEvent> remote_events_;
  std::vector<RequestOutput> remote_finished_;
};

// A data-parallel replica other than the front's: takes requests from the front, steps its
// engine and reports back, until the front shuts down. Throws when a rank dies.
void serve_replica(Engine& engine, ranks::Group& dp, const GrammarResolver& grammars);

}  // namespace deepinfer
