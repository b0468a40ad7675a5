#include "server/engine_loop.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "core/cpu.h"

namespace deepinfer::server {

namespace {

using Seconds = std::chrono::duration<double>;

// Exact for integers below 1e12 (counters), short for the rest.
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.12g", v);
  return buf;
}

void add_header(std::string* out, const char* name, const char* type, const char* help) {
  *out += str_cat("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

}  // namespace

// --- Call ---

std::vector<CallUpdate> Call::take() {
  std::lock_guard lk(mu_);
  signalled_ = false;
  return std::exchange(updates_, {});
}

std::optional<std::string> Call::admission() const {
  std::lock_guard lk(mu_);
  return admission_;
}

void Call::admit(std::string error) {
  std::lock_guard lk(mu_);
  admission_ = std::move(error);
}

void Call::signal() {
  std::unique_lock lk(mu_);
  if (!notify_ || std::exchange(signalled_, true)) return;  // none, or one still untaken
  lk.unlock();
  notify_();
}

void Call::push(CallUpdate u) {
  std::unique_lock lk(mu_);
  updates_.push_back(std::move(u));
  lk.unlock();
  signal();
}

// --- EngineLoop ---

EngineLoop::EngineLoop(Engine& engine, Metrics& metrics, ranks::Group* replicas)
    : engine_(engine, replicas), metrics_(metrics) {
  publish_gauges();
}

void EngineLoop::start() {
  if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
}

void EngineLoop::stop() {
  wake([&] { stop_ = true; });
  if (thread_.joinable()) thread_.join();
}

void EngineLoop::wake(const std::function<void()>& change) {
  std::unique_lock lk(mu_);
  change();
  lk.unlock();
  cv_.notify_all();
}

void EngineLoop::submit(const std::shared_ptr<Call>& call, std::vector<Request> requests) {
  bool stopped = false;
  wake([&] {
    for (Request& r : requests) r.id = next_id_++;
    stopped = stop_;
    if (!stopped) submissions_.push_back({call, std::move(requests)});
  });
  if (stopped) {
    call->admit("the server is shutting down");
    call->signal();
  }
}

void EngineLoop::cancel(const std::shared_ptr<Call>& call) {
  wake([&] { cancels_.push_back(call); });
}

void EngineLoop::cancel_all() {
  wake([&] { cancel_all_ = true; });
}

// Ends every request in flight with an error, refuses later ones, and tells the server once.
void EngineLoop::fail(const std::string& why) {
  // Recorded before the calls learn of their end, so that their error responses name it.
  std::unique_lock lk(mu_);
  failure_ = why;
  lk.unlock();
  failed_ = true;
  for (const auto& [id, live] : live_) engine_.abort(id);
  finish_outputs(FinishReason::Error);
  // Requests on a replica that can no longer report end here.
  while (!live_.empty()) end(live_.begin(), FinishReason::Error, {});
  if (on_failure_) on_failure_();
}

std::string EngineLoop::failure() const {
  std::lock_guard lk(mu_);
  return failure_;
}

EngineGauges EngineLoop::gauges() const {
  std::lock_guard lk(gauges_mu_);
  return gauges_;
}

void EngineLoop::run() {
  for (;;) {
    std::unique_lock lk(mu_);
    cv_.wait_for(lk, std::chrono::milliseconds(250), [&] {
      return stop_ || cancel_all_ || !submissions_.empty() || !cancels_.empty() ||
             (engine_.has_unfinished() && !failed_);
    });
    std::deque<Submission> subs = std::exchange(submissions_, {});
    const std::vector<std::shared_ptr<Call>> cancels = std::exchange(cancels_, {});
    const bool cancel_all = std::exchange(cancel_all_, false), stopping = stop_;
    for (Submission& s : subs) admit(s);  // under mu_: it reads stop_ and failure_
    lk.unlock();
    for (Submission& s : subs) s.call->signal();
    // Most passes have nothing to cancel: the per-request scan runs only when one does.
    if (cancel_all || stopping || !cancels.empty())
      for (const auto& [id, live] : live_)
        if (cancel_all || stopping || std::ranges::count(cancels, live.call)) engine_.abort(id);
    if (const std::string dead = probe_ && !failed_ ? probe_() : ""; !dead.empty()) {
      std::fprintf(stderr, "deepinfer: %s; ending %zu requests\n", dead.c_str(), live_.size());
      fail(dead);
    }
    if (engine_.has_unfinished() && !failed_) {
      try {
        route(engine_.step());
      } catch (const std::exception& e) {
        std::fprintf(stderr, "deepinfer: engine step failed, ending %zu requests: %s\n",
                     live_.size(), e.what());
        fail(e.what());
      }
    }
    finish_outputs(FinishReason::None);  // also requests aborted before their first step
    publish_gauges();
    if (stopping && live_.empty() && (failed_ || !engine_.has_unfinished())) break;
  }
  // The other replicas wait in the next exchange; a failed run has no exchange left.
  if (!failed_) {
    try {
      engine_.shutdown();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "deepinfer: ending the replicas failed: %s\n", e.what());
    }
  }
}

// Adds a call's requests to the engine, all or none.
void EngineLoop::admit(Submission& s) {
  const auto now = std::chrono::steady_clock::now();
  std::string error;
  size_t added = 0;
  if (stop_) error = "the server is shutting down";
  if (failed_) error = "the engine failed: " + failure_;
  for (; error.empty() && added < s.requests.size(); ++added) {
    Request& r = s.requests[added];
    const int64_t prompt_tokens = int64_t(r.prompt_ids.size());
    const RequestId id = r.id;
    error = engine_.add_request(std::move(r));
    if (!error.empty()) break;
    metrics_.request_admitted(prompt_tokens);
    live_[id] = Live{s.call, int32_t(added), now, std::nullopt};
  }
  // On a refusal, the ones already added never show their ends: they are forgotten here and
  // their aborts come back from the engine as unknown ids.
  for (size_t i = 0; !error.empty() && i < added; ++i) {
    engine_.abort(s.requests[i].id);
    live_.erase(s.requests[i].id);
  }
  s.call->admit(error);
}

void EngineLoop::route(std::vector<TokenEvent> events) {
  const auto now = std::chrono::steady_clock::now();
  for (TokenEvent& ev : events) {
    auto it = live_.find(ev.id);
    if (it == live_.end()) continue;
    Live& l = it->second;
    metrics_.token_generated(Seconds(now - l.last_token.value_or(l.arrival)).count(),
                             !l.last_token);
    l.last_token = now;
    l.call->push({l.choice, false, std::move(ev), FinishReason::None, {}});
  }
}

void EngineLoop::finish_outputs(FinishReason override_reason) {
  for (RequestOutput& out : engine_.take_finished()) {
    auto it = live_.find(out.id);
    if (it == live_.end()) continue;
    end(it, override_reason != FinishReason::None ? override_reason : out.finish,
        std::move(out.stop_text));
  }
}

void EngineLoop::end(std::unordered_map<RequestId, Live>::iterator it, FinishReason why,
                     std::string stop_text) {
  const auto now = std::chrono::steady_clock::now();
  metrics_.request_finished(why, Seconds(now - it->second.arrival).count());
  it->second.call->push({it->second.choice, true, {}, why, std::move(stop_text)});
  live_.erase(it);
}

void EngineLoop::publish_gauges() {
  EngineGauges g;
  static_cast<EngineLoad&>(g) = engine_.total();
  if (engine_.size() > 1) g.replicas = engine_.loads();
  std::lock_guard lk(gauges_mu_);
  gauges_ = std::move(g);
}

// --- metrics ---

void Histogram::observe(double v) {
  ++counts_[size_t(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin())];
  sum_ += v;
}

void Histogram::render(const char* name, const char* help, std::string* out) const {
  add_header(out, name, "histogram", help);
  uint64_t cum = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    cum += counts_[i];
    const std::string le = i < bounds_.size() ? num(bounds_[i]) : "+Inf";
    *out += str_cat(name, "_bucket{le=\"", le, "\"} ", cum, "\n");
  }
  *out += str_cat(name, "_sum ", num(sum_), "\n", name, "_count ", cum, "\n");
}

void Metrics::request_admitted(int64_t prompt_tokens) {
  std::lock_guard lk(mu_);
  ++requests_admitted_;
  prompt_tokens_ += prompt_tokens;
}

void Metrics::token_generated(double seconds, bool first) {
  std::lock_guard lk(mu_);
  ++generation_tokens_;
  (first ? ttft_ : itl_).observe(seconds);
}

void Metrics::request_finished(FinishReason why, double seconds) {
  std::lock_guard lk(mu_);
  ++finished_[size_t(why)];
  e2e_.observe(seconds);
}

void Metrics::http_response(int status) {
  std::lock_guard lk(mu_);
  ++http_[status];
}

std::string Metrics::render(const EngineGauges& g, int64_t in_flight) const {
  // Read from /proc before taking mu_, which the engine thread takes for every token.
  const int64_t resident_bytes = resident_memory_bytes();
  std::lock_guard lk(mu_);
  std::string out;
  auto metric = [&](const char* type, const char* name, const char* help, double v) {
    add_header(&out, name, type, help);
    out += str_cat(name, " ", num(v), "\n");
  };
  auto gauge = std::bind_front(metric, "gauge");
  auto counter = std::bind_front(metric, "counter");
  gauge("deepinfer_num_requests_running", "Requests in the engine's running set.", g.running);
  gauge("deepinfer_num_requests_waiting", "Requests waiting for admission to the engine.",
        g.waiting);
  gauge("deepinfer_http_requests_in_flight", "Generation calls being served.", in_flight);
  gauge("deepinfer_kv_blocks_used", "KV pool blocks in use.", g.kv_blocks_used);
  gauge("deepinfer_kv_blocks_total", "KV pool blocks in all.", g.stats.kv_blocks_total);
  gauge("deepinfer_kv_cache_usage_ratio", "Fraction of the KV pool in use.",
        g.stats.kv_blocks_total ? double(g.kv_blocks_used) / g.stats.kv_blocks_total : 0.0);
  counter("deepinfer_prompt_tokens_total", "Prompt tokens of admitted requests.", prompt_tokens_);
  counter("deepinfer_generation_tokens_total", "Generated tokens.", generation_tokens_);
  counter("deepinfer_requests_admitted_total", "Engine requests admitted (one per choice).",
          requests_admitted_);
  add_header(&out, "deepinfer_requests_finished_total", "counter",
             "Engine requests ended, by finish reason.");
  for (const FinishReason r :
       {FinishReason::Stop, FinishReason::Length, FinishReason::Abort, FinishReason::Error})
    out += str_cat("deepinfer_requests_finished_total{finish_reason=\"", finish_reason_name(r),
                   "\"} ", finished_[size_t(r)], "\n");
  counter("deepinfer_client_disconnects_total", "Calls cancelled because the client went away.",
          disconnects_.load());
  add_header(&out, "deepinfer_http_responses_total", "counter", "HTTP responses, by status.");
  for (const auto& [status, n] : http_)
    out += str_cat("deepinfer_http_responses_total{status=\"", status, "\"} ", n, "\n");
  if (!g.replicas.empty()) {
    // Data parallelism: the same per replica, labelled by its dp rank.
    auto per_replica = [&](const char* type, const char* name, const char* help, auto field) {
      add_header(&out, name, type, help);
      for (size_t r = 0; r < g.replicas.size(); ++r)
        out += str_cat(name, "{replica=\"", r, "\"} ",
                       num(double(std::invoke(field, g.replicas[r]))), "\n");
    };
    per_replica("gauge", "deepinfer_replica_num_requests_running",
                "Requests in a replica's running set.", &EngineLoad::running);
    per_replica("gauge", "deepinfer_replica_num_requests_waiting",
                "Requests waiting for admission to a replica.", &EngineLoad::waiting);
    per_replica("gauge", "deepinfer_replica_kv_blocks_used", "A replica's KV pool blocks in use.",
                &EngineLoad::kv_blocks_used);
    per_replica("counter", "deepinfer_replica_generation_tokens_total",
                "Tokens a replica generated.",
                [](const EngineLoad& l) { return l.stats.generated_tokens; });
  }
  counter("deepinfer_engine_steps_total", "Engine steps run.", g.stats.steps);
  counter("deepinfer_preemptions_total", "Sequences preempted.", g.stats.preemptions);
  counter("deepinfer_spec_decode_steps_total", "Sequence steps that verified drafts.",
          g.stats.spec_steps);
  counter("deepinfer_spec_decode_draft_tokens_total", "Draft tokens verified.",
          g.stats.spec_drafted);
  counter("deepinfer_spec_decode_accepted_tokens_total", "Draft tokens accepted.",
          g.stats.spec_accepted);
  counter("deepinfer_prefix_cache_queries_total",
          "Admissions that looked their prompt up in the prefix cache.", g.stats.prefix_queries);
  counter("deepinfer_prefix_cache_hits_total", "Admissions that resumed from a cached prefix.",
          g.stats.prefix_hits);
  counter("deepinfer_prefix_cache_hit_tokens_total",
          "Prompt tokens taken from the prefix cache instead of computed.",
          g.stats.prefix_hit_tokens);
  ttft_.render("deepinfer_time_to_first_token_seconds", "Submission to first token.", &out);
  itl_.render("deepinfer_inter_token_latency_seconds", "Between consecutive tokens of a request.",
              &out);
  e2e_.render("deepinfer_e2e_request_latency_seconds", "Submission to the end of a request.", &out);
  gauge("process_resident_memory_bytes", "Resident memory in bytes.", resident_bytes);
  return out;
}

}  // namespace deepinfer::server
