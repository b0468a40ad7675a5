// The engine loop (DESIGN.md §1): schedule -> run -> sample -> update, one step at a time.
// Nothing else drives the model. Requests come in through add_request, tokens come out of step()
// as TokenEvents, and every request ends with one RequestOutput from take_finished().
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/parallel.h"
#include "engine/scheduler.h"
#include "kv/kv_cache.h"
#include "model/model.h"

namespace deepinfer {

// Next-token selection from one row of logits (leader rank only). Deterministic: the random draw
// of a request's i-th token depends only on its seed and i, so the same request and seed give the
// same tokens whatever else is in the batch, and after preemption.
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
  explicit Sampler(int64_t vocab) : vocab_(vocab), count_(size_t(vocab)) {}
  // The chosen token; fills `top` with the top-K logprobs of the raw distribution when K > 0,
  // followed by the chosen token's when it is not among them.
  int32_t sample(const SampleInput& in, TopLogprobs* top);

 private:
  int32_t choose(const SampleInput& in);
  int64_t vocab_;
  std::vector<float> work_;
  std::vector<int32_t> ids_;
  std::vector<double> prob_;
  std::vector<int32_t> count_;  // [vocab] per-token counts of one history, zero between calls
};

struct EngineConfig {
  SchedulerConfig sched;
  int32_t num_kv_blocks = 0;  // 0: size the pool from kv_cache_memory
  uint64_t kv_cache_memory = uint64_t(512) << 20;
  uint64_t seed = 0;  // seeds requests that bring none
  // Prefix caching (PrefixCache in engine/scheduler.h), with slot-state snapshots in this much
  // memory (0: a quarter of kv_cache_memory).
  bool prefix_caching = true;
  uint64_t prefix_cache_memory = 0;
};

// Decodes generated ids to text (for stop strings); empty when there is no tokenizer.
using TextDecoder = std::function<std::string(std::span<const int32_t>)>;

// The scheduler's counts (preemptions, KV peak, prefix cache, speculation) and the engine's own.
struct EngineStats : SchedulerStats {
  int64_t prompt_tokens = 0;  // prompt rows computed (recomputation included)
  int64_t generated_tokens = 0;
  int64_t steps = 0;
  double prefill_seconds = 0;  // steps with prompt rows
  double decode_seconds = 0;   // steps with decode rows only
  int32_t kv_blocks_total = 0;
  int32_t prefix_snapshots = 0;  // snapshot buffers (0: prefix caching off)
};

// What is wrong with sampling parameters on their own (any model): "" or a message naming the
// field ("max_tokens must be >= 1, got -5"). add_request checks this and the model-dependent rest.
std::string check_sampling_params(const SamplingParams& p);

class Engine {
 public:
  // With a layout, this engine is the scheduler of a replica: it sends every step to the
  // replica's other ranks, and with data parallelism steps in lockstep with the other replicas.
  Engine(Model& model, const EngineConfig& cfg, TextDecoder decoder = nullptr,
         const RankLayout* layout = nullptr);

  // The pool this engine sized (blocks, tokens per block, bytes).
  int32_t num_kv_blocks() const { return stats_.kv_blocks_total; }
  int64_t block_tokens() const { return cfg_.sched.block_tokens; }
  uint64_t kv_pool_bytes() const { return kv_->bytes(); }

  // Validates and queues a request; returns "" or a message saying what is wrong with it (the
  // request is then not queued). Ids must be unique among unfinished requests.
  std::string add_request(Request req);
  // What add_request would say of `req`, without queueing it.
  std::string check_request(const Request& req) const;
  std::vector<TokenEvent> step();
  std::vector<RequestOutput> take_finished();
  // Ranks that step together keep stepping (empty steps) while any of them has work.
  bool has_unfinished() const {
    return scheduler_->has_work() || !pending_images_.empty() || runner_->others_busy();
  }
  bool abort(RequestId id);
  size_t num_running() const { return scheduler_->num_running(); }
  size_t num_waiting() const { return scheduler_->num_waiting(); }
  int32_t kv_blocks_used() const { return scheduler_->blocks_used(); }
  EngineStats stats() const;
  // DSpark: called with every draft block the head makes (request, its token count then, the
  // block), for tests and diagnostics.
  using DraftObserver = std::function<void(RequestId, int64_t, std::span<const int32_t>)>;
  void set_draft_observer(DraftObserver f) { draft_observer_ = std::move(f); }

 private:
  // Finishes `s` when its newest token ends it.
  void check_stop(Sequence* s);
  // Stop strings aside, what ends `s` now: Stop when its newest token does by itself (end of
  // sequence, a stop id, the grammar's end), else Length at its length limit, else None.
  FinishReason stop_reason(const Sequence& s) const;
  // DSpark: the step's kept rows into the draft head, and each sampling sequence's next drafts.
  void draft(const SchedOutput& out);

  Model& model_;
  EngineConfig cfg_;
  TextDecoder decoder_;
  std::unique_ptr<KvCache> kv_;
  std::unique_ptr<Scheduler> scheduler_;
  std::unique_ptr<ModelRunner> runner_;
  // Requests with images (docs/vision.md): each image token of the prompt becomes its image's
  // span at admission (plan_spans: the ids, and per position the tower's row, a delimiter or
  // text), the tower runs one stage per step for the oldest such request (advance_images), so
  // that the others keep stepping, and the request is scheduled once its images are through.
  struct PendingImages {
    Request req;
    std::vector<int64_t> row_of;
    std::vector<float> rows;  // the tower's rows of the images done
    size_t done = 0;
    std::shared_ptr<ImageJob> job;
  };
  std::deque<PendingImages> pending_images_;
  std::vector<RequestOutput> aborted_;  // aborted while their images were in the tower
  std::string plan_spans(Request& req, std::vector<int64_t>& row_of);
  void advance_images();
  Sampler sampler_;
  // Per-step buffers, kept for their capacity.
  SchedOutput sched_out_;
  std::vector<int32_t> sampled_, counts_;
  std::vector<TopLogprobs> tops_;
  std::vector<DraftSeq> draft_in_;
  DraftOutput draft_out_;
  DraftObserver draft_observer_;
  EngineStats stats_;
};

// The KV pool an EngineConfig asks for (also normalises cfg->sched.block_tokens to whole
// compressed groups). Every rank of a run sizes its pool with it.
KvCacheOptions size_kv_pool(const ModelConfig& c, EngineConfig* cfg);

}  // namespace deepinfer
