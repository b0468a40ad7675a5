#include "engine/replicas.h"

#include <algorithm>
#include <tuple>

#include "core/error.h"
#include "core/region_timer.h"
#include "engine/parallel.h"

namespace deepinfer {

// The messages of one exchange. The front's: a shutdown flag, then per other replica (in rank
// order) a length-prefixed part holding its new requests and its aborts. A replica's: its load,
// then the tokens and the endings of its latest step. Their field lists follow (in this namespace,
// where the Writer and the Reader find them); a request's grammar travels as its source.

void fields(auto& io, ranks::FieldsOf<Request> auto& q) {
  auto& p = q.params;
  io(q.id, q.prompt_ids, p.max_tokens, p.temperature, p.top_k, p.top_p, p.min_p,
     p.repetition_penalty, p.presence_penalty, p.frequency_penalty, p.seed, p.stop_token_ids,
     p.stop, p.ignore_eos, p.logprobs, p.grammar_source, p.draft_reference);
}

void fields(auto& io, ranks::FieldsOf<TokenEvent> auto& ev) {
  io(ev.id, ev.token, ev.logprobs);
}

void fields(auto& io, ranks::FieldsOf<RequestOutput> auto& o) {
  io(o.id, o.prompt_ids, o.output_ids, o.logprobs, o.finish, o.stop_text, o.drafted, o.accepted);
}

EngineLoad engine_load(const Engine& e) {
  return {int64_t(e.num_running()), int64_t(e.num_waiting()), e.kv_blocks_used(), e.stats()};
}

Replicas::Replicas(Engine& local, ranks::Group* dp) : local_(local), dp_(dp) {
  DI_CHECK(!dp || dp->rank() == 0, "the replicas' front runs on rank 0 of the dp group");
  const size_t others = dp ? size_t(dp->size() - 1) : 0;
  remote_loads_.resize(others);
  unreported_.resize(others);
  queued_.resize(others);
  aborts_.resize(others);
}

int Replicas::pick(const Request& req) {
  auto key = [&](int r) {
    const EngineLoad l = r == 0 ? engine_load(local_) : remote_loads_[size_t(r - 1)];
    const int64_t pending = r == 0 ? 0 : unreported_[size_t(r - 1)];
    return std::tuple(l.waiting + pending, l.kv_blocks_used, l.running);
  };
  int best = 0;
  for (int r = 1; r < size(); ++r)
    if (key(r) < key(best)) best = r;
  // Prompts longer than a block: the replica that took the last one with the same first block.
  const size_t B = size_t(local_.block_tokens());
  if (req.prompt_ids.size() <= B) return best;
  uint64_t h = 0x9e3779b97f4a7c15ull;
  for (size_t i = 0; i < B; ++i) h = (h ^ uint32_t(req.prompt_ids[i])) * 0x100000001b3ull;
  if (affinity_.size() > (size_t(1) << 16)) affinity_.clear();
  auto [it, fresh] = affinity_.try_emplace(h, best);
  if (!fresh && std::get<0>(key(it->second)) <= std::get<0>(key(best))) best = it->second;
  it->second = best;
  return best;
}

std::string Replicas::add_request(Request req) {
  if (remote_.count(req.id)) return str_cat("request id ", req.id, " is already in use");
  // This replica's engine validates what it queues; what goes elsewhere is validated here (every
  // replica has the same model and limits).
  const int r = shut_down_ || size() == 1 ? 0 : pick(req);
  if (r == 0) return local_.add_request(std::move(req));
  if (std::string e = local_.check_request(req); !e.empty()) return e;
  remote_[req.id] = r;
  ++unreported_[size_t(r - 1)];
  queued_[size_t(r - 1)].push_back(std::move(req));
  return "";
}

bool Replicas::abort(RequestId id) {
  const auto it = remote_.find(id);
  if (it == remote_.end()) return local_.abort(id);
  aborts_[size_t(it->second - 1)].push_back(id);
  return true;
}

bool Replicas::has_unfinished() const {
  return local_.has_unfinished() || !remote_.empty() || !remote_finished_.empty();
}

std::vector<TokenEvent> Replicas::step() {
  DI_CHECK(!(dp_ && shut_down_), "a step after the replicas shut down");
  if (dp_) exchange(false);
  std::vector<TokenEvent> events = local_.step();
  std::move(remote_events_.begin(), remote_events_.end(), std::back_inserter(events));
  remote_events_.clear();
  return events;
}

std::vector<RequestOutput> Replicas::take_finished() {
  std::vector<RequestOutput> out = local_.take_finished();
  std::move(remote_finished_.begin(), remote_finished_.end(), std::back_inserter(out));
  remote_finished_.clear();
  return out;
}

void Replicas::shutdown() {
  if (dp_ && !shut_down_) exchange(true);
  shut_down_ = true;
}

void Replicas::exchange(bool shutdown) {
  DI_REGION("comm.dp_exchange");
  ranks::Writer w, part;
  w.put<uint8_t>(shutdown);
  for (size_t i = 0; i < queued_.size(); ++i) {
    part = {};
    part(queued_[i], aborts_[i]);
    w.put_vector(part.bytes());
  }
  const auto parts = dp_->all_gather_v(w.bytes());
  std::vector<TokenEvent> events;
  std::vector<RequestOutput> done;
  for (size_t i = 0; i < queued_.size(); ++i) {
    // Its report was made before it took what was just sent.
    unreported_[i] = int64_t(queued_[i].size());
    queued_[i].clear();
    aborts_[i].clear();
    ranks::Reader r(parts[i + 1], "replica report");
    r(remote_loads_[i], events, done);
    r.expect_end();
    std::move(events.begin(), events.end(), std::back_inserter(remote_events_));
    for (RequestOutput& o : done) {
      DI_REQUIRE(o.finish <= FinishReason::Error, "replica report: finish reason ", int(o.finish),
                 " is unknown");
      remote_.erase(o.id);
      remote_finished_.push_back(std::move(o));
    }
  }
}

std::vector<EngineLoad> Replicas::loads() const {
  std::vector<EngineLoad> all{engine_load(local_)};
  all.insert(all.end(), remote_loads_.begin(), remote_loads_.end());
  return all;
}

EngineLoad Replicas::total() const {
  using S = EngineStats;
  static constexpr int64_t S::*kCounts[] = {
      &S::prompt_tokens,  &S::generated_tokens, &S::preemptions,
      &S::prefix_queries, &S::prefix_hits,      &S::prefix_hit_tokens,
      &S::spec_steps,     &S::spec_drafted,     &S::spec_accepted};
  static constexpr int32_t S::*kBlocks[] = {&S::kv_blocks_total, &S::peak_blocks_used,
                                            &S::prefix_snapshots};
  // Counts add up (the KV peak too), seconds are the longest replica's, steps this one's.
  EngineLoad t = engine_load(local_);
  for (const EngineLoad& l : remote_loads_) {
    t.running += l.running;
    t.waiting += l.waiting;
    t.kv_blocks_used += l.kv_blocks_used;
    for (auto m : kCounts) t.stats.*m += l.stats.*m;
    for (auto m : kBlocks) t.stats.*m += l.stats.*m;
    for (auto m : {&S::prefill_seconds, &S::decode_seconds})
      t.stats.*m = std::max(t.stats.*m, l.stats.*m);
  }
  return t;
}

void serve_replica(Engine& engine, ranks::Group& dp, const GrammarResolver& grammars) {
  DI_CHECK(dp.rank() > 0, "rank 0 of the dp group runs the replicas' front");
  std::vector<TokenEvent> events;
  std::vector<RequestOutput> finished;
  for (;;) {
    ranks::Writer w;
    w(engine_load(engine), events, finished);
    std::vector<std::vector<uint8_t>> parts;
    {
      DI_REGION("comm.dp_exchange");
      parts = dp.all_gather_v(w.bytes());
    }
    finished.clear();
    ranks::Reader front(parts[0], "replica requests");
    if (front.get<uint8_t>()) return;
    std::vector<uint8_t> mine;
    for (int r = 1; r <= dp.rank(); ++r) mine = front.get_vector<uint8_t>();
    ranks::Reader rd(mine, "replica requests");
    std::vector<Request> requests;
    std::vector<RequestId> aborts;
    rd(requests, aborts);
    rd.expect_end();
    for (Request& q : requests) {
      std::string error;
      try {
        if (!q.params.grammar_source.empty()) {
          DI_REQUIRE(grammars, "this replica cannot compile output grammars");
          q.params.grammar = grammars(q.params.grammar_source);
        }
      } catch (const Error& e) {
        error = e.what();
      }
      const RequestId id = q.id;
      if (error.empty()) error = engine.add_request(std::move(q));
      if (!error.empty()) {
        // The front checked it against the same limits: only a grammar can fail here.
        std::fprintf(stderr, "deepinfer: replica %d: request %llu refused: %s\n", dp.rank(),
                     (unsigned long long)id, error.c_str());
        finished.push_back({id, {}, {}, {}, FinishReason::Error, {}, 0, 0});
      }
    }
    for (RequestId id : aborts) engine.abort(id);
    events = engine.step();
    for (RequestOutput& o : engine.take_finished()) finished.push_back(std::move(o));
  }
}

}  // namespace deepinfer
