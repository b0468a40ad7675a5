#include "engine/replicas.h"

#include <algorithm>
#include <tuple>

#include "core/error.h"
#include "core/region_timer.h"
#include "ranks/serial.h"

namespace deepinfer {

namespace {

// The messages of one exchange. The front's: a shutdown flag, then per other replica (in rank
// order) a length-prefixed part holding its new requests and its aborts. A replica's: its load,
// then the tokens and the endings of its latest step.

void put_logprobs(ranks::Writer& w, const TopLogprobs& lp) {
  w.put<uint64_t>(lp.size());
  for (const auto& [id, logprob] : lp) {
    w.put(id);
    w.put(logprob);
  }
}

TopLogprobs get_logprobs(ranks::Reader& r) {
  const auto n = r.get<uint64_t>();
  DI_REQUIRE(n <= r.remaining() / 8, "replica report: ", n, " logprobs in ", r.remaining(),
             " bytes");
  TopLogprobs lp(n);
  for (auto& [id, logprob] : lp) {
    id = r.get<int32_t>();
    logprob = r.get<float>();
  }
  return lp;
}

void put_request(ranks::Writer& w, const Request& q) {
  const SamplingParams& p = q.params;
  w.put(q.id);
  w.put_vector(q.prompt_ids);
  w.put(p.max_tokens);
  w.put(p.temperature);
  w.put(p.top_k);
  w.put(p.top_p);
  w.put(p.min_p);
  w.put(p.repetition_penalty);
  w.put(p.presence_penalty);
  w.put(p.frequency_penalty);
  w.put<uint8_t>(p.seed.has_value());
  w.put<uint64_t>(p.seed.value_or(0));
  w.put_vector(p.stop_token_ids);
  w.put<uint64_t>(p.stop.size());
  for (const std::string& s : p.stop) w.put_string(s);
  w.put<uint8_t>(p.ignore_eos);
  w.put(p.logprobs);
  w.put_string(p.grammar_source);
  w.put_vector(p.draft_reference);
}

Request get_request(ranks::Reader& r) {
  Request q;
  SamplingParams& p = q.params;
  q.id = r.get<RequestId>();
  q.prompt_ids = r.get_vector<int32_t>();
  p.max_tokens = r.get<int64_t>();
  p.temperature = r.get<float>();
  p.top_k = r.get<int64_t>();
  p.top_p = r.get<float>();
  p.min_p = r.get<float>();
  p.repetition_penalty = r.get<float>();
  p.presence_penalty = r.get<float>();
  p.frequency_penalty = r.get<float>();
  const bool seeded = r.get<uint8_t>() != 0;
  const auto seed = r.get<uint64_t>();
  if (seeded) p.seed = seed;
  p.stop_token_ids = r.get_vector<int32_t>();
  const auto n_stop = r.get<uint64_t>();
  DI_REQUIRE(n_stop <= r.remaining() / 8, "replica message: ", n_stop, " stop strings in ",
             r.remaining(), " bytes");
  for (uint64_t i = 0; i < n_stop; ++i) p.stop.push_back(r.get_string());
  p.ignore_eos = r.get<uint8_t>() != 0;
  p.logprobs = r.get<int64_t>();
  p.grammar_source = r.get_string();
  p.draft_reference = r.get_vector<int32_t>();
  return q;
}

void put_output(ranks::Writer& w, const RequestOutput& o) {
  w.put(o.id);
  w.put_vector(o.prompt_ids);
  w.put_vector(o.output_ids);
  w.put<uint64_t>(o.logprobs.size());
  for (const TopLogprobs& lp : o.logprobs) put_logprobs(w, lp);
  w.put(o.finish);
  w.put_string(o.stop_text);
  w.put(o.drafted);
  w.put(o.accepted);
}

RequestOutput get_output(ranks::Reader& r) {
  RequestOutput o;
  o.id = r.get<RequestId>();
  o.prompt_ids = r.get_vector<int32_t>();
  o.output_ids = r.get_vector<int32_t>();
  const auto n = r.get<uint64_t>();
  DI_REQUIRE(n <= r.remaining() / 8, "replica message: ", n, " logprob rows in ", r.remaining(),
             " bytes");
  for (uint64_t i = 0; i < n; ++i) o.logprobs.push_back(get_logprobs(r));
  o.finish = r.get<FinishReason>();
  DI_REQUIRE(o.finish <= FinishReason::Error, "replica message: finish reason ", int(o.finish),
             " is unknown");
  o.stop_text = r.get_string();
  o.drafted = r.get<int64_t>();
  o.accepted = r.get<int64_t>();
  return o;
}

void put_report(ranks::Writer& w, const EngineLoad& load, const std::vector<TokenEvent>& events,
                const std::vector<RequestOutput>& finished) {
  w.put(load);
  w.put<uint64_t>(events.size());
  for (const TokenEvent& ev : events) {
    w.put(ev.id);
    w.put(ev.token);
    put_logprobs(w, ev.logprobs);
  }
  w.put<uint64_t>(finished.size());
  for (const RequestOutput& o : finished) put_output(w, o);
}

}  // namespace

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
    part.put<uint64_t>(queued_[i].size());
    for (const Request& q : queued_[i]) put_request(part, q);
    part.put_vector(aborts_[i]);
    w.put_vector(part.bytes());
  }
  const auto parts = dp_->all_gather_v(w.bytes());
  for (size_t i = 0; i < queued_.size(); ++i) {
    // Its report was made before it took what was just sent.
    unreported_[i] = int64_t(queued_[i].size());
    queued_[i].clear();
    aborts_[i].clear();
    ranks::Reader r(parts[i + 1], "replica report");
    remote_loads_[i] = r.get<EngineLoad>();
    const auto n_events = r.get<uint64_t>();
    DI_REQUIRE(n_events <= r.remaining() / 12, "replica report: ", n_events, " tokens in ",
               r.remaining(), " bytes");
    for (uint64_t e = 0; e < n_events; ++e) {
      TokenEvent& ev = remote_events_.emplace_back();
      ev.id = r.get<RequestId>();
      ev.token = r.get<int32_t>();
      ev.logprobs = get_logprobs(r);
    }
    const auto n_done = r.get<uint64_t>();
    DI_REQUIRE(n_done <= r.remaining() / 8, "replica report: ", n_done, " endings in ",
               r.remaining(), " bytes");
    for (uint64_t e = 0; e < n_done; ++e) {
      remote_finished_.push_back(get_output(r));
      remote_.erase(remote_finished_.back().id);
    }
    r.expect_end();
  }
}

std::vector<EngineLoad> Replicas::loads() const {
  std::vector<EngineLoad> all{engine_load(local_)};
  all.insert(all.end(), remote_loads_.begin(), remote_loads_.end());
  return all;
}

EngineLoad Replicas::total() const {
  EngineLoad t = engine_load(local_);
  for (const EngineLoad& l : remote_loads_) {
    t.running += l.running;
    t.waiting += l.waiting;
    t.kv_blocks_used += l.kv_blocks_used;
    EngineStats& s = t.stats;
    s.prompt_tokens += l.stats.prompt_tokens;
    s.generated_tokens += l.stats.generated_tokens;
    s.prefill_seconds = std::max(s.prefill_seconds, l.stats.prefill_seconds);
    s.decode_seconds = std::max(s.decode_seconds, l.stats.decode_seconds);
    s.kv_blocks_total += l.stats.kv_blocks_total;
    s.peak_blocks_used += l.stats.peak_blocks_used;
    s.preemptions += l.stats.preemptions;
    s.prefix_queries += l.stats.prefix_queries;
    s.prefix_hits += l.stats.prefix_hits;
    s.prefix_hit_tokens += l.stats.prefix_hit_tokens;
    s.prefix_snapshots += l.stats.prefix_snapshots;
    s.spec_steps += l.stats.spec_steps;
    s.spec_drafted += l.stats.spec_drafted;
    s.spec_accepted += l.stats.spec_accepted;
  }
  return t;
}

void serve_replica(Engine& engine, ranks::Group& dp, const GrammarResolver& grammars) {
  DI_CHECK(dp.rank() > 0, "rank 0 of the dp group runs the replicas' front");
  std::vector<TokenEvent> events;
  std::vector<RequestOutput> finished;
  for (;;) {
    ranks::Writer w;
    put_report(w, engine_load(engine), events, finished);
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
    const auto n = rd.get<uint64_t>();
    DI_REQUIRE(n <= rd.remaining(), "replica requests: ", n, " requests in ", rd.remaining(),
               " bytes");
    for (uint64_t i = 0; i < n; ++i) {
      Request q = get_request(rd);
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
        finished.push_back({.id = id, .finish = FinishReason::Error});
      }
    }
    for (RequestId id : rd.get_vector<RequestId>()) engine.abort(id);
    rd.expect_end();
    events = engine.step();
    for (RequestOutput& o : engine.take_finished()) finished.push_back(std::move(o));
  }
}

}  // namespace deepinfer
