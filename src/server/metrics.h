// Server metrics in the Prometheus text format: counters and latency histograms updated by the
// engine and handler threads, engine gauges sampled by the engine thread after every step.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/request.h"

namespace deepinfer::server {

struct EngineGauges;

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double v);
  // Appends the HELP and TYPE lines of `name`, then its _bucket, _sum and _count lines.
  void render(const char* name, const char* help, std::string* out) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();

  // Engine thread.
  void request_admitted(int64_t prompt_tokens);
  void token_generated(double seconds_since_previous, bool first);  // TTFT when `first`
  void request_finished(FinishReason why, double seconds);
  // Handler threads.
  void client_disconnected();
  void http_response(int status);

  // The whole exposition; `gauges`, the generation calls `in_flight` and `rss_bytes` are sampled
  // by the caller.
  std::string render(const EngineGauges& gauges, int64_t in_flight, int64_t rss_bytes) const;

 private:
  mutable std::mutex mu_;
  int64_t prompt_tokens_ = 0, generation_tokens_ = 0, requests_admitted_ = 0;
  std::map<std::string, int64_t> finished_;  // by finish reason
  std::map<int, int64_t> http_;              // responses by status
  int64_t disconnects_ = 0;
  Histogram ttft_, itl_, e2e_;
};

// Resident memory of this process (bytes), from /proc/self/statm; 0 when unavailable.
int64_t resident_memory_bytes();

}  // namespace deepinfer::server
