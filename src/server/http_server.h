// The OpenAI-compatible HTTP server (cpp-httplib): routes, authentication, body limits, streaming
// and shutdown. Handler threads parse requests, hand them to the EngineLoop and stream what comes
// back; a call whose client goes away is cancelled, which frees its KV.
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
  int http_threads = 128;  // connections served at once
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
