#include "server/http_server.h"

#include <strings.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <httplib.h>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <thread>

#include "server/engine_loop.h"
#include "server/json_fields.h"
#include "server/metrics.h"
#include "server/openai_response.h"

namespace deepinfer::server {

namespace {

using Clock = std::chrono::steady_clock;

// How often a handler waiting for tokens checks that its client is still there.
constexpr auto kPollInterval = std::chrono::milliseconds(50);

// cpp-httplib's server with two shutdown steps it lacks: closing the door (no new connections;
// open ones keep being served) and ending keep-alive once nothing is in flight.
class HttpServer : public httplib::Server {
 public:
  void stop_accepting() {
    // The accept loop fails, leaves, closes the socket and waits for open connections.
    const socket_t s = svr_sock_;
    if (s != INVALID_SOCKET) ::shutdown(s, SHUT_RDWR);
  }
  void end_keep_alive() { svr_sock_ = INVALID_SOCKET; }
};

void send_json(httplib::Response& res, int status, const std::string& body) {
  res.status = status;
  res.set_content(body, "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  send_json(res, e.status, error_body(e));
}

// Compares in time independent of where the strings differ. `key` is not empty.
bool same_secret(const std::string& given, const std::string& key) {
  size_t diff = given.size() ^ key.size();
  for (size_t i = 0; i < given.size(); ++i)
    diff |= uint8_t(given[i]) ^ uint8_t(key[i % key.size()]);
  return diff == 0;
}

std::string random_hex() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(rng()));
  return buf;
}

// The port and address of a socket address, as text ("" for other families).
std::pair<std::string, int> endpoint_of(const sockaddr_storage& a) {
  char buf[INET6_ADDRSTRLEN] = "";
  if (a.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(a);
    inet_ntop(AF_INET, &v4.sin_addr, buf, sizeof(buf));
    return {buf, ntohs(v4.sin_port)};
  }
  if (a.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(a);
    inet_ntop(AF_INET6, &v6.sin6_addr, buf, sizeof(buf));
    return {buf, ntohs(v6.sin6_port)};
  }
  return {"", -1};
}

// The descriptor of the connection with these two ends (-1 if not found). cpp-httplib does not hand
// it to handlers, so it is found by its two ends; it stays open until the handler returns.
int client_socket(int local_port, const std::string& remote_addr, int remote_port) {
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  int found = -1;
  while (dirent* e = readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != 0 || fd == dirfd(d)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t ll = sizeof(local), pl = sizeof(peer);
    if (getsockname(int(fd), reinterpret_cast<sockaddr*>(&local), &ll) != 0 ||
        getpeername(int(fd), reinterpret_cast<sockaddr*>(&peer), &pl) != 0)
      continue;
    if (endpoint_of(local).second == local_port &&
        endpoint_of(peer) == std::pair(remote_addr, remote_port)) {
      found = int(fd);
      break;
    }
  }
  closedir(d);
  return found;
}

// Whether the client closed (or reset) its side of the connection. Bytes it sent ahead (a next
// request on a kept-alive connection) are left unread.
bool peer_closed(int fd) {
  pollfd p{fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) return true;
  char c;
  return recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

}  // namespace

// One generation call being served: its engine requests, the response it builds, and the state
// the content provider needs between calls.
struct CallContext {
  CallContext(std::atomic<int64_t>& in_flight, std::condition_variable& cv, std::mutex& mu)
      : in_flight(in_flight), in_flight_cv(cv), in_flight_mu(mu) {
    ++in_flight;
  }
  ~CallContext() {
    {
      std::lock_guard lk(in_flight_mu);
      --in_flight;
    }
    in_flight_cv.notify_all();
  }
  std::atomic<int64_t>& in_flight;
  std::condition_variable& in_flight_cv;
  std::mutex& in_flight_mu;

  std::shared_ptr<Call> call;
  std::unique_ptr<ResponseBuilder> builder;
  bool stream = false, started = false, finished = false, cancelled = false;
  // The client's connection, watched while nothing is written to it: its two ends, and its
  // descriptor once looked up (-2: not yet; -1: not found).
  int local_port = -1, remote_port = -1;
  std::string remote_addr;
  int socket = -2;
  Clock::time_point last_check = Clock::now();
};

struct ApiServer::Impl {
  Impl(Engine& engine, ModelInfo info, ServerOptions options)
      : info(std::move(info)), options(std::move(options)), loop(engine, metrics) {}

  void routes();
  bool read_body(const httplib::Request& req, httplib::Response& res,
                 const httplib::ContentReader& reader, std::string* body);
  void check_access(const httplib::Request& req) const;
  void generate(Endpoint ep, const httplib::Request& req, httplib::Response& res,
                const httplib::ContentReader& reader);
  bool pump(CallContext& ctx, httplib::DataSink& sink);
  // A non-streaming call: waits for the result, then sends it with its status (a failure
  // becomes a 503). Returns false when the client left first.
  bool wait_whole(CallContext& ctx);
  void disconnect(CallContext& ctx);
  void begin_shutdown();
  void drain();
  ApiError engine_failed() const {
    return ApiError(503, "The engine failed and the server is stopping: " + loop.failure(), {},
                    "engine_failed");
  }

  ModelInfo info;
  ServerOptions options;
  Metrics metrics;
  EngineLoop loop;
  HttpServer http;
  int port = 0;

  std::atomic<bool> draining{false};
  std::atomic<int64_t> in_flight{0};
  std::mutex in_flight_mu;
  std::condition_variable in_flight_cv;
  std::thread drainer;
  std::mutex drain_mu;
};

// --- request plumbing ---

bool ApiServer::Impl::read_body(const httplib::Request& req, httplib::Response& res,
                                const httplib::ContentReader& reader, std::string* body) {
  const size_t limit = options.max_body_bytes;
  // A Content-Length that is not a plain decimal count (negative, signed, 20 digits) would leave
  // the reader waiting for bytes that never come: refused at once, and the connection closed
  // (what follows on it cannot be framed).
  if (req.has_header("Content-Length")) {
    const std::string cl = req.get_header_value("Content-Length");
    const bool digits =
        !cl.empty() && cl.size() <= 18 && cl.find_first_not_of("0123456789") == std::string::npos;
    if (!digits) {
      res.set_header("Connection", "close");
      send_error(res, ApiError(400,
                               str_cat("Content-Length '", cl.substr(0, 32),
                                       "' is not a byte count (decimal digits)."),
                               {}, "invalid_content_length"));
      return false;
    }
    if (std::stoull(cl) > 4 * uint64_t(limit)) {
      res.set_header("Connection", "close");
      send_error(res, ApiError(413,
                               str_cat("The request body is larger than the server's limit of ",
                                       limit, " bytes."),
                               {}, "request_too_large"));
      return false;
    }
  }
  if (req.is_multipart_form_data()) {
    // Consumed (up to a bound) so the connection stays usable, then refused.
    size_t seen = 0;
    reader([](const httplib::MultipartFormData&) { return true; },
           [&](const char*, size_t n) { return (seen += n) <= 4 * limit; });
    send_error(res, ApiError(415, "Request bodies must be JSON, not multipart form data.", {},
                             "unsupported_media_type"));
    return false;
  }
  bool too_large = false;
  size_t discarded = 0;
  const bool ok = reader([&](const char* data, size_t n) {
    if (!too_large && body->size() + n <= limit) {
      body->append(data, n);
      return true;
    }
    // Keep reading (and dropping) a while, so that the client sees the answer.
    too_large = true;
    body->clear();
    return (discarded += n) <= 4 * limit;
  });
  if (too_large || res.status == 413) {
    send_error(res, ApiError(413,
                             str_cat("The request body is larger than the server's limit of ",
                                     limit, " bytes."),
                             {}, "request_too_large"));
    return false;
  }
  if (!ok) {
    send_error(res, ApiError(400, "The request body could not be read.", {}, "invalid_body"));
    return false;
  }
  return true;
}

void ApiServer::Impl::check_access(const httplib::Request& req) const {
  if (!options.api_key.empty()) {
    const std::string auth = req.get_header_value("Authorization");
    // The scheme is case-insensitive (RFC 9110 §11.1).
    const bool bearer = auth.size() > 7 && strncasecmp(auth.c_str(), "bearer ", 7) == 0;
    if (!bearer || !same_secret(auth.substr(7), options.api_key))
      throw ApiError(401, "Invalid or missing API key (send it as 'Authorization: Bearer KEY').",
                     {}, "invalid_api_key");
  }
  if (draining) throw ApiError(503, "The server is shutting down.", {}, "service_unavailable");
}

// --- generation ---

void ApiServer::Impl::generate(Endpoint ep, const httplib::Request& req, httplib::Response& res,
                               const httplib::ContentReader& reader) {
  std::string body;
  if (!read_body(req, res, reader, &body)) return;
  try {
    check_access(req);
    const ApiRequest ar = parse_api_request(ep, body, info);
    std::vector<Request> requests;
    for (const auto& prompt : ar.prompts)
      for (int32_t i = 0; i < ar.n; ++i) {
        Request r;
        r.prompt_ids = prompt;
        r.params = ar.params;
        if (ar.params.seed) r.params.seed = choice_seed(*ar.params.seed, i);
        requests.push_back(std::move(r));
      }
    auto ctx = std::make_shared<CallContext>(in_flight, in_flight_cv, in_flight_mu);
    // Counted in flight first, then checked: a shutdown that began meanwhile either waits for
    // this call or is seen here.
    if (loop.failed()) throw engine_failed();
    if (draining) throw ApiError(503, "The server is shutting down.", {}, "service_unavailable");
    ctx->call = std::make_shared<Call>(int32_t(requests.size()));
    ctx->stream = ar.stream;
    ctx->local_port = req.local_port;
    ctx->remote_addr = req.remote_addr;
    ctx->remote_port = req.remote_port;
    const char* prefix = ep == Endpoint::kChat ? "chatcmpl-" : "cmpl-";
    const int64_t created = std::chrono::duration_cast<std::chrono::seconds>(
                                std::chrono::system_clock::now().time_since_epoch())
                                .count();
    ctx->builder = std::make_unique<ResponseBuilder>(ar, info, prefix + random_hex(), created);
    const std::string refused = loop.submit(ctx->call, std::move(requests));
    if (!refused.empty() && loop.failed()) throw engine_failed();
    if (!refused.empty()) throw ApiError(400, refused, {}, "invalid_request");
    if (!ar.stream) {
      // The status goes out with the result, so that a failure can still be a 5xx.
      if (!wait_whole(*ctx)) return;  // the client left: nothing to send
      if (ctx->builder->any_error())
        send_error(res, engine_failed());
      else
        send_json(res, 200, ctx->builder->full_body());
      return;
    }
    auto provider = [this, ctx](size_t, httplib::DataSink& sink) { return pump(*ctx, sink); };
    auto releaser = [this, ctx](bool) {
      // The response ended without the provider finishing: the client is gone.
      if (!ctx->finished && !ctx->cancelled) disconnect(*ctx);
    };
    res.status = 200;
    if (ar.stream) res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(ar.stream ? "text/event-stream" : "application/json", provider,
                                     releaser);
  } catch (const ApiError& e) {
    send_error(res, e);
  }
}

bool ApiServer::Impl::wait_whole(CallContext& ctx) {
  while (!ctx.builder->all_ended()) {
    std::vector<CallUpdate> updates;
    if (ctx.call->wait(&updates, kPollInterval))
      for (const CallUpdate& u : updates) ctx.builder->on_update(u);
    if (ctx.builder->all_ended()) break;
    if (ctx.socket == -2)
      ctx.socket = client_socket(ctx.local_port, ctx.remote_addr, ctx.remote_port);
    if (ctx.socket >= 0 && peer_closed(ctx.socket)) {
      disconnect(ctx);
      return false;
    }
  }
  ctx.finished = true;
  return true;
}

bool ApiServer::Impl::pump(CallContext& ctx, httplib::DataSink& sink) {
  std::string out;
  auto frame = [&](const std::vector<std::string>& chunks) {
    for (const std::string& c : chunks) out += "data: " + c + "\n\n";
  };
  if (!ctx.started) {
    ctx.started = true;
    if (ctx.stream) frame(ctx.builder->stream_start());
  }
  std::vector<CallUpdate> updates;
  if (ctx.call->wait(&updates, kPollInterval)) {
    for (const CallUpdate& u : updates) {
      std::vector<std::string> chunks = ctx.builder->on_update(u);
      frame(chunks);
    }
  }
  // Nothing to write (queued, or a response that is sent whole at the end): see whether the
  // client is still there, at most once per poll interval.
  const auto now = Clock::now();
  if (out.empty() && !ctx.builder->all_ended() && now - ctx.last_check >= kPollInterval) {
    ctx.last_check = now;
    // Looked up only for a call that goes a poll interval without writing (a streaming one
    // that writes notices a departed client from its writes).
    if (ctx.socket == -2)
      ctx.socket = client_socket(ctx.local_port, ctx.remote_addr, ctx.remote_port);
    if (!sink.is_writable() || (ctx.socket >= 0 && peer_closed(ctx.socket))) {
      disconnect(ctx);
      return false;
    }
  }
  const bool last = ctx.builder->all_ended();
  if (last) {
    if (ctx.stream) {
      frame(ctx.builder->stream_end());
      // A choice the engine could not finish: an error event (OpenAI's shape) before the end.
      if (ctx.builder->any_error()) out += "data: " + error_body(engine_failed()) + "\n\n";
      out += "data: [DONE]\n\n";
    } else {
      out = ctx.builder->full_body();
    }
  }
  if (!out.empty() && !sink.write(out.data(), out.size())) {
    disconnect(ctx);
    return false;
  }
  if (last) {
    ctx.finished = true;
    sink.done();
  }
  return true;
}

void ApiServer::Impl::disconnect(CallContext& ctx) {
  if (ctx.cancelled || ctx.finished) return;
  ctx.cancelled = true;
  loop.cancel(ctx.call);
  metrics.client_disconnected();
}

// --- routes ---

void ApiServer::Impl::routes() {
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res,
                                      const httplib::ContentReader& reader) {
    generate(Endpoint::kCompletions, req, res, reader);
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res,
                                           const httplib::ContentReader& reader) {
    generate(Endpoint::kChat, req, res, reader);
  });
  http.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res,
                                const httplib::ContentReader& reader) {
    std::string body;
    if (!read_body(req, res, reader, &body)) return;
    try {
      check_access(req);
      const std::vector<int32_t> ids = parse_tokenize_request(body, info);
      send_json(
          res, 200,
          dump_json(
              {{"count", ids.size()}, {"max_model_len", info.max_model_len}, {"tokens", ids}}));
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  });
  http.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res,
                                  const httplib::ContentReader& reader) {
    std::string body;
    if (!read_body(req, res, reader, &body)) return;
    try {
      check_access(req);
      const std::vector<int32_t> ids = parse_detokenize_request(body, info);
      send_json(res, 200, dump_json({{"prompt", info.tokenizer->decode(ids, false)}}));
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  });
  http.Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    try {
      check_access(req);
      Json model = {{"id", info.names.at(0)},
                    {"object", "model"},
                    {"created", info.created},
                    {"owned_by", "deepinfer"},
                    {"max_model_len", info.max_model_len}};
      send_json(res, 200, dump_json({{"object", "list"}, {"data", Json::array({model})}}));
    } catch (const ApiError& e) {
      send_error(res, e);
    }
  });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (loop.failed())
      send_error(res, engine_failed());
    else if (draining)
      send_error(res, ApiError(503, "The server is shutting down.", {}, "service_unavailable"));
    else
      send_json(res, 200, "{\"status\":\"ok\"}");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    metrics.set_in_flight(in_flight.load());
    res.set_content(metrics.render(loop.gauges(), resident_memory_bytes()),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  // Errors the library produces itself (no route, unreadable request line, ...) get an OpenAI
  // body too; responses that already have one pass through.
  http.set_error_handler(httplib::Server::HandlerWithResponse([](const httplib::Request& req,
                                                                 httplib::Response& res) {
    if (!res.body.empty() || res.content_provider_)
      return httplib::Server::HandlerResponse::Unhandled;
    const bool known = req.path == "/v1/completions" || req.path == "/v1/chat/completions" ||
                       req.path == "/tokenize" || req.path == "/detokenize" ||
                       req.path == "/v1/models" || req.path == "/health" || req.path == "/metrics";
    if (res.status == 404 && known)
      send_error(res,
                 ApiError(405, str_cat("Method ", req.method, " is not allowed on ", req.path, "."),
                          {}, "method_not_allowed"));
    else if (res.status == 404)
      send_error(res, ApiError(404, str_cat("Unknown endpoint: ", req.method, " ", req.path, "."),
                               {}, "not_found"));
    else
      send_error(res, ApiError(res.status,
                               str_cat("The request could not be served (HTTP ", res.status, ")."),
                               {}, "bad_request"));
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler([](const httplib::Request&, httplib::Response& res,
                                std::exception_ptr ep) {
    std::string what = "unknown error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    std::fprintf(stderr, "deepinfer: internal error while serving a request: %s\n", what.c_str());
    send_error(res, ApiError(500, "Internal server error: " + what, {}, "internal_error"));
  });
  http.set_logger([this](const httplib::Request&, const httplib::Response& res) {
    metrics.http_response(res.status);
  });
}

// --- lifecycle ---

void ApiServer::Impl::drain() {
  std::unique_lock lk(in_flight_mu);
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(options.shutdown_timeout_s));
  if (!in_flight_cv.wait_until(lk, deadline, [&] { return in_flight == 0; })) {
    std::fprintf(stderr, "deepinfer: cancelling %lld calls still running\n",
                 (long long)in_flight.load());
    loop.cancel_all();
    in_flight_cv.wait_for(lk, std::chrono::seconds(30), [&] { return in_flight == 0; });
  }
  http.end_keep_alive();
}

ApiServer::ApiServer(Engine& engine, ModelInfo info, ServerOptions options)
    : impl_(std::make_unique<Impl>(engine, std::move(info), std::move(options))) {
  Impl& s = *impl_;
  const size_t threads = size_t(std::max(4, s.options.http_threads));
  s.http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s.http.set_payload_max_length(s.options.max_body_bytes);
  s.http.set_keep_alive_max_count(1000);
  s.http.set_read_timeout(30);
  s.http.set_write_timeout(30);
  // SO_REUSEADDR only: a restart may bind over connections in TIME_WAIT, but a second server on
  // the same port fails to bind (cpp-httplib's default, SO_REUSEPORT, lets both listen and splits
  // the connections between them).
  // An engine failure (a rank died) ends the server: new calls and /health get 503 at once,
  // calls in flight end with 503, and the drain that follows lets run() return.
  s.loop.set_on_failure([&s] {
    std::fprintf(stderr, "deepinfer: the engine failed; stopping the server: %s\n",
                 s.loop.failure().c_str());
    s.begin_shutdown();
  });
  s.http.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  s.routes();
}

ApiServer::~ApiServer() {
  if (impl_->drainer.joinable()) impl_->drainer.join();
  impl_->loop.stop();
}

int ApiServer::bind() {
  Impl& s = *impl_;
  const int port =
      s.options.port == 0
          ? s.http.bind_to_any_port(s.options.host)
          : (s.http.bind_to_port(s.options.host, s.options.port) ? s.options.port : -1);
  DI_REQUIRE(port > 0, "cannot listen on ", s.options.host, ":", s.options.port,
             " (address in use, or not an address of this machine)");
  s.port = port;
  return port;
}

void ApiServer::run() {
  Impl& s = *impl_;
  DI_REQUIRE(s.port > 0, "ApiServer::run() needs bind() first");
  s.loop.start();
  s.http.listen_after_bind();
  {
    std::lock_guard lk(s.drain_mu);
    if (s.drainer.joinable()) s.drainer.join();
  }
  s.loop.stop();
}

void ApiServer::shutdown() {
  impl_->begin_shutdown();
}

void ApiServer::Impl::begin_shutdown() {
  std::lock_guard lk(drain_mu);
  if (draining.exchange(true)) return;
  http.stop_accepting();
  drainer = std::thread([this] { drain(); });
}

void ApiServer::set_health_probe(std::function<std::string()> probe) {
  impl_->loop.set_health_probe(std::move(probe));
}

bool ApiServer::failed() const {
  return impl_->loop.failed();
}

std::string ApiServer::failure() const {
  return impl_->loop.failure();
}

void ApiServer::cancel_all() {
  impl_->loop.cancel_all();
}

}  // namespace deepinfer::server
