#include "server/http_server.h"

#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "server/json_fields.h"
#include "server/openai_response.h"

namespace deepinfer::server {

namespace {

using http::Exchange;

void send_json(Exchange& ex, int status, std::string body) {
  ex.respond(status, "application/json", std::move(body));
}

void send_error(Exchange& ex, const ApiError& e) {
  send_json(ex, e.status, error_body(e));
}

ApiError shutting_down() {
  return ApiError(503, "The server is shutting down.", {}, "service_unavailable");
}

// An event-thread task that sends `body` with status 200 (dumped here, on the worker).
std::function<void()> reply(const std::shared_ptr<Exchange>& ex, const Json& body) {
  return [ex, json = dump_json(body)]() mutable { send_json(*ex, 200, std::move(json)); };
}

// Compares in time independent of where the strings differ. `key` is not empty.
bool same_secret(const std::string& given, const std::string& key) {
  size_t diff = given.size() ^ key.size();
  for (size_t i = 0; i < given.size(); ++i)
    diff |= uint8_t(given[i]) ^ uint8_t(key[i % key.size()]);
  return diff == 0;
}

// The options the transport runs with: bodies a little over the limit are read to their end, so
// that the client sees the 413.
ServerOptions with_derived_limits(ServerOptions o) {
  o.limits.max_discard_bytes = 4 * o.limits.max_body_bytes;
  return o;
}

}  // namespace

// One generation call being served. Event thread only.
struct ApiServer::CallContext {
  std::shared_ptr<Exchange> ex;
  std::shared_ptr<Call> call;
  std::unique_ptr<ResponseBuilder> builder;
  // finished: answered, or the client left.
  bool stream = false, admitted = false, finished = false;
};

// Threads for the work a request brings (JSON parsing, tokenization), so that the event thread
// only moves bytes. Jobs never touch a socket: they post their result back.
class ApiServer::Workers {
 public:
  explicit Workers(int n) {
    for (int i = 0; i < n; ++i) threads_.emplace_back([this](std::stop_token st) { work(st); });
  }
  void submit(std::function<void()> job) {
    std::lock_guard lk(mu_);
    jobs_.push_back(std::move(job));
    cv_.notify_one();
  }
  // Finishes the jobs queued, then joins (a stopped worker still takes the jobs left).
  void stop() { threads_.clear(); }

 private:
  void work(std::stop_token st) {
    for (;;) {
      std::unique_lock lk(mu_);
      cv_.wait(lk, st, [&] { return !jobs_.empty(); });
      if (jobs_.empty()) return;
      const std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      lk.unlock();
      job();
    }
  }
  std::mutex mu_;
  std::condition_variable_any cv_;
  std::deque<std::function<void()>> jobs_;
  std::vector<std::jthread> threads_;  // last: stopped and joined first
};

ApiServer::ApiServer(Engine& engine, ModelInfo info, ServerOptions options, ranks::Group* replicas)
    : info(std::move(info)),
      options(with_derived_limits(std::move(options))),
      loop(engine, metrics, replicas),
      transport(
          this->options, [this](std::shared_ptr<Exchange> ex) { on_request(std::move(ex)); },
          [this](int status) { metrics.http_response(status); }),
      workers(std::make_unique<Workers>(std::max(1, this->options.http_threads))) {
  // An engine failure (a rank died) ends the server: new calls and /health get 503 at once,
  // calls in flight end with 503, and the drain that follows lets run() return.
  loop.set_on_failure([this] {
    std::fprintf(stderr, "deepinfer: the engine failed; stopping the server: %s\n",
                 loop.failure().c_str());
    shutdown();
  });
}

ApiServer::~ApiServer() {
  loop.stop();
  workers->stop();
}

void ApiServer::run() {
  loop.start();
  transport.run();
  workers->stop();
  loop.stop();
}

ApiError ApiServer::engine_failed() const {
  return ApiError(503, "The engine failed and the server is stopping: " + loop.failure(), {},
                  "engine_failed");
}

// --- routes ---

// Refusals are thrown, and answered at the end.
void ApiServer::on_request(std::shared_ptr<Exchange> ex) try {
  const http::HttpRequest& r = ex->request();
  const std::string& path = r.path;
  static const std::map<std::string_view, std::string_view> kMethodOf = {
      {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"},
      {"/tokenize", "POST"},       {"/detokenize", "POST"},
      {"/v1/models", "GET"},       {"/health", "GET"},
      {"/metrics", "GET"}};
  const auto route = kMethodOf.find(path);
  if (route == kMethodOf.end())
    throw ApiError(404, str_cat("Unknown endpoint: ", r.method, " ", path, "."), {}, "not_found");
  if (r.method != route->second)
    throw ApiError(405, str_cat("Method ", r.method, " is not allowed on ", path, "."), {},
                   "method_not_allowed");
  if (path == "/v1/completions") return generate(Endpoint::kCompletions, ex);
  if (path == "/v1/chat/completions") return generate(Endpoint::kChat, ex);
  if (path == "/tokenize")
    return on_worker(ex, [this, ex](const std::string& body) {
      const std::vector<int32_t> ids = parse_tokenize_request(body, info);
      return reply(ex,
                   {{"count", ids.size()}, {"max_model_len", info.max_model_len}, {"tokens", ids}});
    });
  if (path == "/detokenize")
    return on_worker(ex, [this, ex](const std::string& body) {
      const std::vector<int32_t> ids = parse_detokenize_request(body, info);
      return reply(ex, {{"prompt", info.tokenizer->decode(ids, false)}});
    });
  if (path == "/health") {
    if (loop.failed()) throw engine_failed();
    if (draining) throw shutting_down();
    return send_json(*ex, 200, "{\"status\":\"ok\"}");
  }
  if (path == "/metrics")
    return ex->respond(200, "text/plain; version=0.0.4; charset=utf-8",
                       metrics.render(loop.gauges(), int64_t(calls.size())));
  // /v1/models
  const std::string* auth = r.header("authorization");
  check_access(auth ? *auth : "");
  Json model = {{"id", info.names.at(0)},
                {"object", "model"},
                {"created", info.created},
                {"owned_by", "deepinfer"},
                {"max_model_len", info.max_model_len}};
  send_json(*ex, 200, dump_json({{"object", "list"}, {"data", Json::array({model})}}));
} catch (const ApiError& e) {
  send_error(*ex, e);
}

void ApiServer::check_access(const std::string& auth) const {
  if (!options.api_key.empty()) {
    // The scheme is case-insensitive (RFC 9110 §11.1).
    const bool bearer = auth.size() > 7 && http::iequals(auth.substr(0, 7), "bearer ");
    if (!bearer || !same_secret(auth.substr(7), options.api_key))
      throw ApiError(401, "Invalid or missing API key (send it as 'Authorization: Bearer KEY').",
                     {}, "invalid_api_key");
  }
  if (draining) throw shutting_down();
}

void ApiServer::on_worker(const std::shared_ptr<Exchange>& ex,
                          std::function<std::function<void()>(const std::string&)> job) {
  const std::string* type = ex->request().header("content-type");
  if (type && http::iequals(type->substr(0, 19), "multipart/form-data"))
    return send_error(*ex, ApiError(415, "Request bodies must be JSON, not multipart form data.",
                                    {}, "unsupported_media_type"));
  const std::string* auth = ex->request().header("authorization");
  workers->submit([this, ex, body = std::move(ex->request().body), auth = auth ? *auth : "",
                   job = std::move(job)] {
    std::function<void()> then;
    try {
      check_access(auth);
      then = job(body);
    } catch (const ApiError& e) {
      then = [ex, e] { send_error(*ex, e); };
    } catch (const std::exception& e) {
      then = [ex, err = internal_error(e)] { send_error(*ex, err); };
    }
    transport.post(std::move(then));
  });
}

// --- generation ---

void ApiServer::generate(Endpoint ep, const std::shared_ptr<Exchange>& ex) {
  auto ctx = std::make_shared<CallContext>();
  ctx->ex = ex;
  // A client that leaves, at any point before its response is complete, cancels the call.
  ex->on_hangup([this, w = std::weak_ptr<CallContext>(ctx)] {
    const std::shared_ptr<CallContext> c = w.lock();
    if (!c || c->finished) return;
    if (c->call) loop.cancel(c->call);
    metrics.client_disconnected();
    end_call(*c);
  });
  on_worker(ex, [this, ctx, ep](const std::string& body) -> std::function<void()> {
    return [this, ctx, ar = parse_api_request(ep, body, info)] { start_call(ctx, ar); };
  });
}

void ApiServer::start_call(const std::shared_ptr<CallContext>& ctx, const ApiRequest& ar) {
  CallContext& c = *ctx;
  if (c.finished) return;  // the client left while the request was parsed
  // Checked here, on the event thread where the drain is counted: a shutdown that began
  // meanwhile either waits for this call or is seen here.
  if (loop.failed()) return send_error(*c.ex, engine_failed());
  if (draining) return send_error(*c.ex, shutting_down());
  calls.emplace(ctx.get(), ctx);
  c.call = std::make_shared<Call>();
  c.stream = ar.stream;
  const char* prefix = ar.endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-";
  c.builder =
      std::make_unique<ResponseBuilder>(ar, info, prefix + random_hex64(), int64_t(time(nullptr)));
  c.call->set_notify([this, pump_it = pumper(ctx)] { transport.post(pump_it); });
  // Choices in prompt-major order, as the builder numbers them.
  std::vector<Request> requests;
  for (const auto& prompt : ar.prompts)
    for (int32_t i = 0; i < ar.n; ++i) {
      // Chat has one prompt, which carries the images.
      Request& r = requests.emplace_back(
          Request{.prompt_ids = prompt, .params = ar.params, .images = ar.images});
      if (ar.params.seed) r.params.seed = choice_seed(*ar.params.seed, i);
    }
  loop.submit(c.call, std::move(requests));
}

// Moves what the engine produced for the call to its client. Runs when the call's notify fired,
// and when a slow client's output has drained.
void ApiServer::pump(const std::shared_ptr<CallContext>& ctx) {
  CallContext& c = *ctx;
  if (c.finished) return;
  std::string out;
  auto frame = [&](const std::string& chunk) {
    if (!chunk.empty()) out += "data: " + chunk + "\n\n";
  };
  if (!c.admitted) {
    const std::optional<std::string> refused = c.call->admission();
    if (!refused) return;
    c.admitted = true;
    if (!refused->empty()) {
      end_call(c);
      return send_error(
          *c.ex, loop.failed() ? engine_failed() : ApiError(400, *refused, {}, "invalid_request"));
    }
    if (c.stream) {
      c.ex->begin_stream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
      frame(c.builder->stream_start());
    }
  }
  // A client reading slower than tokens come: the updates wait in the call until it catches up.
  const bool backlog = c.ex->buffered() > (size_t(1) << 20);
  if (!backlog)
    for (const CallUpdate& u : c.call->take()) frame(c.builder->on_update(u));
  if (!c.builder->all_ended()) {
    if (c.stream && !out.empty()) c.ex->write(out);
    if (backlog) c.ex->when_drained(pumper(ctx));
    return;
  }
  // The status of a whole response goes out with the result, so that a failure is still a 5xx.
  // (The context outlives end_call(): `ctx` holds it.)
  const bool failed = c.builder->any_error();
  if (c.stream) {
    frame(c.builder->stream_end());
    // A choice the engine could not finish: an error event (OpenAI's shape) before the end.
    if (failed) frame(error_body(engine_failed()));
    frame("[DONE]");
    c.ex->write(out);
    c.ex->end_stream();
    end_call(c);
  } else {
    std::string body = failed ? error_body(engine_failed()) : c.builder->full_body();
    end_call(c);
    send_json(*c.ex, failed ? 503 : 200, std::move(body));
  }
}

std::function<void()> ApiServer::pumper(const std::shared_ptr<CallContext>& ctx) {
  return [this, w = std::weak_ptr<CallContext>(ctx)] {
    if (auto live = w.lock()) pump(live);
  };
}

void ApiServer::end_call(CallContext& c) {
  if (std::exchange(c.finished, true)) return;
  if (calls.erase(&c)) check_drained();  // the caller still holds the context
}

// --- lifecycle ---

void ApiServer::shutdown() {
  if (draining.exchange(true)) return;
  transport.post([this] {  // on the event thread
    shutdown_begun = true;
    transport.stop_accepting();
    transport.after(options.shutdown_timeout_s, [this] {
      if (calls.empty()) return;  // drained
      std::fprintf(stderr, "deepinfer: cancelling %zu calls still running\n", calls.size());
      loop.cancel_all();
      // Cancelled calls end within a step; should one not, the connections close anyway.
      transport.after(30, [this] { transport.end_keep_alive(); });
    });
    check_drained();
  });
}

// No call is admitted once the shutdown began, so the calls in flight only end.
void ApiServer::check_drained() {
  if (shutdown_begun && calls.empty()) transport.end_keep_alive();
}

}  // namespace deepinfer::server
