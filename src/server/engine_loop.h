// The thread that owns the Engine. The HTTP side never touches the engine: it submits the requests
// of one API call together with a Call (a small channel), and reads tokens and endings from it;
// cancellations travel the other way through the loop's queue. A reader is told through the
// Call's notify callback that there is something to take.
//
// The loop: take new submissions and cancellations, step the engine while it has work (else
// sleep on a condition variable), route each TokenEvent to its call, and report each finished
// request. A step that throws ends every request in flight with FinishReason::Error; the loop
// carries on with the next submissions.
//
// Metrics: counters and latency histograms updated by the engine and handler threads, engine
// gauges sampled by the engine thread after every step, rendered in the Prometheus text format.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/engine.h"
#include "engine/replicas.h"

namespace deepinfer::server {

// What a call's reader receives: a token of choice `choice`, or the end of that choice.
struct CallUpdate {
  int32_t choice = 0;
  bool end = false;
  TokenEvent token;                          // when !end
  FinishReason finish = FinishReason::None;  // when end
  std::string stop_text;                     // when end
};

// One API call's engine requests (its choices) and the updates flowing back. Shared by the
// reader (the HTTP side) and the engine thread.
class Call {
 public:
  // Reader side: takes the updates there are (none: empty).
  std::vector<CallUpdate> take();
  // None until the engine thread has taken the call; then its refusal ("" when every choice was
  // admitted).
  std::optional<std::string> admission() const;
  // Called (from the engine thread, or the submitting one) when the call is admitted or refused
  // and when updates arrive while none are waiting untaken; set before submitting. It must not
  // block: it typically wakes the reader's event loop, which then take()s.
  void set_notify(std::function<void()> fn) { notify_ = std::move(fn); }

  // Engine side.
  void push(CallUpdate u);

 private:
  friend class EngineLoop;
  void admit(std::string error);
  void signal();  // runs notify_ unless a signal is still untaken
  mutable std::mutex mu_;
  std::vector<CallUpdate> updates_;
  bool signalled_ = false;                // notify_ ran and nothing was taken since
  std::optional<std::string> admission_;  // set by the engine thread
  std::function<void()> notify_;
};

// Over all data-parallel replicas, and per replica when there are several.
struct EngineGauges : EngineLoad {
  std::vector<EngineLoad> replicas;
};

// --- metrics ---

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds)
      : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  // Appends the HELP and TYPE lines of `name`, then its _bucket, _sum and _count lines.
  void render(const char* name, const char* help, std::string* out) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); the last is +Inf
  double sum_ = 0;
};

class Metrics {
 public:
  // Engine thread.
  void request_admitted(int64_t prompt_tokens);
  void token_generated(double seconds_since_previous, bool first);  // TTFT when `first`
  void request_finished(FinishReason why, double seconds);
  // Handler threads.
  void client_disconnected() { ++disconnects_; }
  void http_response(int status);

  // The whole exposition; `gauges` and the generation calls `in_flight` are sampled by the
  // caller.
  std::string render(const EngineGauges& gauges, int64_t in_flight) const;

 private:
  mutable std::mutex mu_;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0, requests_admitted_ = 0;
  std::array<int64_t, size_t(FinishReason::Error) + 1> finished_{};  // by FinishReason
  std::map<int, int64_t> http_;                                      // responses by status
  std::atomic<int64_t> disconnects_{0};
  // Bucket bounds in seconds.
  Histogram ttft_{
      {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80}};
  Histogram itl_{{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}};
  Histogram e2e_{{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320}};
};

// --- the loop ---

class EngineLoop {
 public:
  // With `replicas` (the data-parallel group, whose other ranks run serve_replica) requests are
  // spread over the replicas, and stop() ends their loops.
  EngineLoop(Engine& engine, Metrics& metrics, ranks::Group* replicas = nullptr);
  ~EngineLoop() { stop(); }

  void start();
  // Aborts whatever is still running and joins the thread.
  void stop();

  // Queues `requests` (their ids are assigned here) as the choices of `call`, in order, and
  // returns. Once the call's notify callback has run, Call::admission says whether the engine
  // thread accepted them all, else its reason for refusing one (then none of them runs).
  void submit(const std::shared_ptr<Call>& call, std::vector<Request> requests);
  // Aborts the call's requests that are still running; their ends arrive as Abort.
  void cancel(const std::shared_ptr<Call>& call);
  // Aborts every request in the engine.
  void cancel_all();
  EngineGauges gauges() const;
  // After an engine step failed (a rank died, say) nothing more runs: every request in flight
  // ended with FinishReason::Error, later submissions are refused, and `on_failure` (set before
  // start()) was called once from the engine thread.
  bool failed() const { return failed_; }
  std::string failure() const;
  void set_on_failure(std::function<void()> fn) { on_failure_ = std::move(fn); }
  // Called from the engine thread at least every 250 ms, idle or not: a non-empty answer (a
  // rank found dead) is an engine failure, noticed without waiting for the next step.
  void set_health_probe(std::function<std::string()> fn) { probe_ = std::move(fn); }

 private:
  struct Submission {
    std::shared_ptr<Call> call;
    std::vector<Request> requests;
  };
  // Per engine request: where its tokens go and when they came (for latency metrics).
  struct Live {
    std::shared_ptr<Call> call;
    int32_t choice = 0;
    std::chrono::steady_clock::time_point arrival;
    std::optional<std::chrono::steady_clock::time_point> last_token;  // none before the first
  };

  void run();
  // Applies `change` to the queues under mu_, then wakes the engine thread.
  void wake(const std::function<void()>& change);
  void admit(Submission& s);
  void route(std::vector<TokenEvent> events);
  void finish_outputs(FinishReason override_reason);
  // Tells the request's call that it ended, and forgets it.
  void end(std::unordered_map<RequestId, Live>::iterator it, FinishReason why,
           std::string stop_text);
  void publish_gauges();

  Replicas engine_;
  Metrics& metrics_;
  std::thread thread_;
  std::atomic<uint64_t> next_id_{1};

  mutable std::mutex mu_;  // guards the queues, stop_ and failure_
  std::condition_variable cv_;
  std::deque<Submission> submissions_;
  std::vector<std::shared_ptr<Call>> cancels_;
  bool cancel_all_ = false;
  bool stop_ = false;

  std::unordered_map<RequestId, Live> live_;  // engine thread only

  mutable std::mutex gauges_mu_;
  EngineGauges gauges_;

  std::atomic<bool> failed_{false};
  std::string failure_;  // guarded by mu_
  std::function<void()> on_failure_;
  std::function<std::string()> probe_;
  void fail(const std::string& why);
};

}  // namespace deepinfer::server
