#include "server/metrics.h"

#include <unistd.h>

#include <cstdio>

#include "core/error.h"
#include "server/engine_loop.h"

namespace deepinfer::server {

namespace {

// Exact for integers below 1e12 (counters), short for the rest.
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.12g", v);
  return buf;
}

void add_header(std::string* out, const char* name, const char* type, const char* help) {
  *out += str_cat("# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

void add_metric(std::string* out, const char* name, const char* type, const char* help,
                double value) {
  add_header(out, name, type, help);
  *out += str_cat(name, " ", num(value), "\n");
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(const char* name, const char* help, std::string* out) const {
  add_header(out, name, "histogram", help);
  uint64_t cum = 0;
  for (size_t i = 0; i < counts_.size(); ++i) {
    cum += counts_[i];
    const std::string le = i < bounds_.size() ? num(bounds_[i]) : "+Inf";
    *out += str_cat(name, "_bucket{le=\"", le, "\"} ", cum, "\n");
  }
  *out += str_cat(name, "_sum ", num(sum_), "\n", name, "_count ", count_, "\n");
}

Metrics::Metrics()
    : ttft_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80}),
      itl_({0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}),
      e2e_({0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320}) {}

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
  ++finished_[finish_reason_name(why)];
  e2e_.observe(seconds);
}

void Metrics::client_disconnected() {
  std::lock_guard lk(mu_);
  ++disconnects_;
}

void Metrics::http_response(int status) {
  std::lock_guard lk(mu_);
  ++http_[status];
}

std::string Metrics::render(const EngineGauges& g, int64_t in_flight, int64_t rss_bytes) const {
  std::lock_guard lk(mu_);
  std::string out;
  add_metric(&out, "deepinfer_num_requests_running", "gauge",
             "Requests in the engine's running set.", double(g.running));
  add_metric(&out, "deepinfer_num_requests_waiting", "gauge",
             "Requests waiting for admission to the engine.", double(g.waiting));
  add_metric(&out, "deepinfer_http_requests_in_flight", "gauge", "Generation calls being served.",
             double(in_flight));
  add_metric(&out, "deepinfer_kv_blocks_used", "gauge", "KV pool blocks in use.",
             double(g.kv_blocks_used));
  add_metric(&out, "deepinfer_kv_blocks_total", "gauge", "KV pool blocks in all.",
             double(g.kv_blocks_total));
  add_metric(&out, "deepinfer_kv_cache_usage_ratio", "gauge", "Fraction of the KV pool in use.",
             g.kv_blocks_total ? double(g.kv_blocks_used) / g.kv_blocks_total : 0.0);
  add_metric(&out, "deepinfer_prompt_tokens_total", "counter",
             "Prompt tokens of admitted requests.", double(prompt_tokens_));
  add_metric(&out, "deepinfer_generation_tokens_total", "counter", "Generated tokens.",
             double(generation_tokens_));
  add_metric(&out, "deepinfer_requests_admitted_total", "counter",
             "Engine requests admitted (one per choice).", double(requests_admitted_));
  add_header(&out, "deepinfer_requests_finished_total", "counter",
             "Engine requests ended, by finish reason.");
  for (const char* r : {"stop", "length", "abort", "error"}) {
    const auto it = finished_.find(r);
    out += str_cat("deepinfer_requests_finished_total{finish_reason=\"", r, "\"} ",
                   it == finished_.end() ? 0 : it->second, "\n");
  }
  add_metric(&out, "deepinfer_client_disconnects_total", "counter",
             "Calls cancelled because the client went away.", double(disconnects_));
  add_header(&out, "deepinfer_http_responses_total", "counter", "HTTP responses, by status.");
  for (const auto& [status, n] : http_)
    out += str_cat("deepinfer_http_responses_total{status=\"", status, "\"} ", n, "\n");
  add_metric(&out, "deepinfer_engine_steps_total", "counter", "Engine steps run.", double(g.steps));
  add_metric(&out, "deepinfer_preemptions_total", "counter", "Sequences preempted.",
             double(g.preemptions));
  ttft_.render("deepinfer_time_to_first_token_seconds", "Submission to first token.", &out);
  itl_.render("deepinfer_inter_token_latency_seconds", "Between consecutive tokens of a request.",
              &out);
  e2e_.render("deepinfer_e2e_request_latency_seconds", "Submission to the end of a request.", &out);
  add_metric(&out, "process_resident_memory_bytes", "gauge", "Resident memory in bytes.",
             double(rss_bytes));
  return out;
}

int64_t resident_memory_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  long long size = 0, resident = 0;
  const int n = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  return n == 2 ? int64_t(resident) * int64_t(sysconf(_SC_PAGESIZE)) : 0;
}

}  // namespace deepinfer::server
