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

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "server/api_request.h"

namespace deepinfer::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;      // 0: any free port (bind() says which)
  std::string api_key;  // empty: no authentication
  size_t max_body_bytes = size_t(8) << 20;
  int http_threads = 4;           // workers that parse and tokenize request bodies
  int max_connections = 1024;     // open at once; beyond, the longest idle one closes, else 503
  double request_timeout_s = 10;  // from a request's first byte to its last: else 408
  double idle_timeout_s = 5;      // a kept-alive connection with no request: closed
  double write_timeout_s = 30;    // output the client does not take for this long: closed
  double shutdown_timeout_s = 30;
};

class ApiServer {
 public:
  ApiServer(Engine& engine, ModelInfo info, ServerOptions options);
  ~ApiServer();
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  // Binds the listening socket; returns the port. Throws Error when the address is taken.
  int bind();
  // Starts the engine thread and serves until a shutdown has completed.
  void run();
  // Begins the graceful shutdown described above; returns at once. Safe from any thread.
  void shutdown();
  // Cancels every call in flight now (a second signal during shutdown).
  void cancel_all();
  // The engine failed (a rank died): the server refused everything from then on and shut
  // itself down; run() has returned or will soon.
  bool failed() const;
  std::string failure() const;
  // Asked periodically whether a rank died (non-empty: its description); call before run().
  void set_health_probe(std::function<std::string()> probe);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace deepinfer::server
