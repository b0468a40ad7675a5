// The OpenAI-compatible HTTP server: routes, authentication, body limits, streaming and shutdown,
// over the event-driven HTTP/1.1 transport of http_transport.h (one event thread owns every
// connection; slow, idle or stalled clients cost a buffer and a timer, never a thread).
//
// The event thread answers cheap routes itself (/health, /metrics, /v1/models, errors). Requests
// that bring work (generation, /tokenize, /detokenize) are parsed and tokenized on `http_threads`
// worker threads, which post the result back; a generation call then goes to the EngineLoop,
// whose Call wakes the event thread when tokens arrive, and its response is written from there
// (SSE for "stream": true; otherwise whole, with its status, once the result is known). A call
// whose client goes away (closes, resets, or stops reading for `write_timeout_s`) is cancelled,
// which frees its KV.
//
//   POST /v1/completions, /v1/chat/completions   generation ("stream": true for SSE)
//   GET  /v1/models                              the served model
//   POST /tokenize, /detokenize                  text <-> ids as the server encodes them
//   GET  /health                                 200, or 503 while shutting down
//   GET  /metrics                                Prometheus text
//
// Shutdown: stop accepting connections, answer 503 to new calls on open ones, give calls in
// flight `shutdown_timeout_s` to finish, cancel the rest, and return from run().
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>

#include "engine/engine.h"
#include "server/api_request.h"
#include "server/engine_loop.h"
#include "server/http_transport.h"

namespace deepinfer::server {

// The transport's options (host, port, connection limits, timeouts, body limits) and the server's.
// The server reads and drops bodies up to 4 x limits.max_body_bytes (limits.max_discard_bytes is
// derived from it).
struct ServerOptions : http::TransportOptions {
  std::string api_key;   // empty: no authentication
  int http_threads = 4;  // workers that parse and tokenize request bodies
  double shutdown_timeout_s = 30;
};

class ApiServer {
 public:
  // `replicas`: the data-parallel group when `engine` is the first of several replicas (the
  // others run serve_replica); requests then go to the least loaded one.
  ApiServer(Engine& engine, ModelInfo info, ServerOptions options,
            ranks::Group* replicas = nullptr);
  ~ApiServer();

  // Binds the listening socket; returns the port. Throws Error when the address is taken.
  int bind() { return transport.bind(); }
  // Starts the engine thread and serves (after bind()) until a shutdown has completed.
  void run();
  // Begins the graceful shutdown described above; returns at once. Safe from any thread.
  void shutdown();
  // Cancels every call in flight now (a second signal during shutdown).
  void cancel_all() { loop.cancel_all(); }
  // The engine failed (a rank died): the server refused everything from then on and shut
  // itself down; run() has returned or will soon.
  bool failed() const { return loop.failed(); }
  // Asked periodically whether a rank died (non-empty: its description); call before run().
  void set_health_probe(std::function<std::string()> probe) {
    loop.set_health_probe(std::move(probe));
  }

 private:
  struct CallContext;
  class Workers;

  void on_request(std::shared_ptr<http::Exchange> ex);
  // Throws ApiError: a wrong or missing key, or a shutdown under way.
  void check_access(const std::string& authorization) const;
  // Runs `job(body)` on a worker after the access check, then what it returns on the event
  // thread. What it throws is answered as an error.
  void on_worker(const std::shared_ptr<http::Exchange>& ex,
                 std::function<std::function<void()>(const std::string& body)> job);
  void generate(Endpoint ep, const std::shared_ptr<http::Exchange>& ex);
  void start_call(const std::shared_ptr<CallContext>& ctx, const ApiRequest& ar);
  void pump(const std::shared_ptr<CallContext>& ctx);
  // pump(ctx) while the call is still served.
  std::function<void()> pumper(const std::shared_ptr<CallContext>& ctx);
  void end_call(CallContext& ctx);
  void check_drained();
  ApiError engine_failed() const;

  ModelInfo info;
  ServerOptions options;
  Metrics metrics;
  EngineLoop loop;
  http::Transport transport;

  std::atomic<bool> draining{false};
  // Event thread only. The generation calls in flight.
  std::unordered_map<CallContext*, std::shared_ptr<CallContext>> calls;
  bool shutdown_begun = false;

  std::unique_ptr<Workers> workers;  // last: joined first, while what its jobs use is still there
};

}  // namespace deepinfer::server
