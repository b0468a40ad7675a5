#include "server/http_transport.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <optional>

#include "core/error.h"
#include "server/api_request.h"

namespace deepinfer::server::http {

namespace {

constexpr size_t kReadChunk = 64 << 10;
constexpr size_t kReadsPerEvent = 4;            // then other connections get their turn
constexpr size_t kMaxPipelined = 64 << 10;      // unparsed bytes kept while a request is served
constexpr double kLingerSeconds = 2;            // draining a closing connection's input
constexpr double kRejectSeconds = 2;            // a refused connection's whole life
constexpr double kEndKeepAliveSeconds = 10;     // connections left after end_keep_alive()
constexpr size_t kMaxRejecting = 64;            // refused connections still being answered
constexpr uint64_t kListenId = 0, kWakeId = 1;  // epoll data of the two other descriptors

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

const char* reason(int status) {
  static const std::map<int, const char*> kReasons = {{401, "Unauthorized"},
                                                      {404, "Not Found"},
                                                      {405, "Method Not Allowed"},
                                                      {408, "Request Timeout"},
                                                      {413, "Content Too Large"},
                                                      {414, "URI Too Long"},
                                                      {415, "Unsupported Media Type"},
                                                      {417, "Expectation Failed"},
                                                      {431, "Request Header Fields Too Large"},
                                                      {500, "Internal Server Error"},
                                                      {501, "Not Implemented"},
                                                      {503, "Service Unavailable"},
                                                      {505, "HTTP Version Not Supported"}};
  if (auto it = kReasons.find(status); it != kReasons.end()) return it->second;
  return status < 400 ? "OK" : status < 500 ? "Bad Request" : "Server Error";  // 200, 400 too
}

// Drops the used front of a buffer: at once when all of it was used, else once it is this long.
void compact(std::string& buf, size_t& used, size_t at_least) {
  if (used == buf.size() || used >= at_least) {
    buf.erase(0, used);
    used = 0;
  }
}

// The Date header's value (RFC 9110 §5.6.7): the current time in GMT.
std::string http_date() {
  const time_t now = time(nullptr);
  tm t{};
  gmtime_r(&now, &t);
  char buf[64];
  return std::string(buf, strftime(buf, sizeof(buf), "%a, %d %b %Y %H:%M:%S GMT", &t));
}

// Accept-Encoding allows gzip (RFC 9110 §12.5.3): listed, or '*', with a non-zero weight.
bool accepts_gzip(const HttpRequest& r) {
  const std::string* ae = r.header("accept-encoding");
  if (!ae) return false;
  std::optional<bool> gzip, any;
  for (std::string_view e : list_elements(*ae)) {
    const size_t semi = e.find(';');
    const std::string_view name = trim_ows(e.substr(0, semi));
    std::string_view p = semi == e.npos ? "" : trim_ows(e.substr(semi + 1));
    const bool weighted = p.size() >= 2 && (p[0] == 'q' || p[0] == 'Q') && p[1] == '=';
    if (weighted) p = trim_ows(p.substr(2));
    // q=0, q=0.0, q=0.000: refused; anything else allows it.
    const bool allowed = !weighted || !(p.starts_with('0') && p.find_first_not_of("0.") == p.npos);
    if (iequals(name, "gzip") || iequals(name, "x-gzip")) gzip = allowed;
    if (name == "*") any = allowed;
  }
  return gzip ? *gzip : any.value_or(false);
}

bool compressible(std::string_view type) {
  return type.starts_with("application/json") ||
         (type.starts_with("text/") && !type.starts_with("text/event-stream"));
}

bool gzip(std::string_view in, std::string* out) {
  z_stream zs{};
  // windowBits 15 + 16: the gzip wrapper. Level 1: this runs on the event thread.
  if (deflateInit2(&zs, 1, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) return false;
  out->resize(deflateBound(&zs, uLong(in.size())));
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(in.data()));
  zs.avail_in = uInt(in.size());
  zs.next_out = reinterpret_cast<Bytef*>(out->data());
  zs.avail_out = uInt(out->size());
  const int rc = deflate(&zs, Z_FINISH);
  out->resize(zs.total_out);
  deflateEnd(&zs);
  return rc == Z_STREAM_END;
}

}  // namespace

struct Connection {
  // In the order a connection goes through them (parsing() and update() compare phases).
  enum class Phase {
    kIdle,     // between requests (or before the first): nothing of a request yet
    kReading,  // a request has begun
    kServing,  // a complete request is being answered
    kClosing,  // the last response is being written
    kLinger,   // written and shut for writing; the client's leftovers are drained
    kClosed
  };

  Connection(Transport& t, int fd, uint64_t id, const ParserLimits& limits)
      : t(t), fd(fd), id(id), parser(limits) {}
  ~Connection() {
    if (fd >= 0) ::close(fd);
  }

  size_t pending() const { return out.size() - out_off; }
  size_t unparsed() const { return in.size() - in_off; }
  bool closed() const { return phase == Phase::kClosed; }
  // Between requests or inside one: its input is parsed.
  bool parsing() const { return phase <= Phase::kReading; }

  Transport& t;
  int fd;
  const uint64_t id;
  Phase phase = Phase::kIdle;
  HttpParser parser;
  Clock::time_point idle_since = Clock::now();
  std::string in, out;
  size_t in_off = 0, out_off = 0;
  std::shared_ptr<Exchange> current;
  Clock::time_point request_start, write_since, linger_until;
  std::optional<Clock::time_point> close_by;
  bool served_any = false, peer_gone = false, rejected = false, processing = false;
  uint32_t events = 0;                        // registered with epoll
  std::optional<Clock::time_point> deadline;  // as registered in Transport::deadlines
};

using Phase = Connection::Phase;

Transport::Transport(TransportOptions options, Handler handler, std::function<void(int)> on_status)
    : opt(std::move(options)), handler(std::move(handler)), on_status(std::move(on_status)) {}

Transport::~Transport() {
  for (int fd : {listen_fd, epoll_fd, wake_fd, spare_fd})
    if (fd >= 0) ::close(fd);
}

bool Transport::watch(int op, int fd, uint32_t events, uint64_t id) {
  epoll_event ev{.events = events, .data = {.u64 = id}};
  return epoll_ctl(epoll_fd, op, fd, &ev) == 0;
}

void Transport::queue(Connection& c, std::string_view bytes) {
  if (c.pending() == 0) c.write_since = Clock::now();
  c.out += bytes;
}

Connection* Transport::find(uint64_t id) {
  auto it = conns.find(id);
  return it == conns.end() ? nullptr : it->second.get();
}

// --- Exchange ---

void Exchange::send_head(int status, std::string_view content_type, const Headers& extra,
                         bool can_keep_alive) {
  Connection& c = *conn_;
  Transport& t = c.t;
  keep_alive_ = can_keep_alive && request_.keep_alive && !force_close_ && !t.ending && !c.peer_gone;
  std::string h = str_cat("HTTP/1.1 ", status, " ", reason(status), "\r\n");
  if (!content_type.empty()) h.append("Content-Type: ").append(content_type).append("\r\n");
  for (const auto& [k, v] : extra) h.append(k).append(": ").append(v).append("\r\n");
  h.append("Date: ").append(http_date()).append("\r\n");
  h += keep_alive_ ? str_cat("Connection: keep-alive\r\nKeep-Alive: timeout=",
                             int64_t(t.opt.idle_timeout_s), "\r\n")
                   : "Connection: close\r\n";
  t.queue(c, h + "\r\n");
  head_sent_ = true;
  if (t.on_status) t.on_status(status);
}

void Exchange::respond(int status, std::string_view content_type, std::string body, Headers extra) {
  if (!conn_ || head_sent_) return;
  if (!body.empty() && compressible(content_type) && accepts_gzip(request_)) {
    std::string packed;
    if (gzip(body, &packed)) {
      body.swap(packed);
      extra.emplace_back("Content-Encoding", "gzip");
      extra.emplace_back("Vary", "Accept-Encoding");
    }
  }
  extra.emplace_back("Content-Length", std::to_string(body.size()));
  send_head(status, content_type, extra, true);
  Connection& c = *conn_;
  if (request_.method != "HEAD") c.out += body;  // the length it would have, without it
  complete_ = true;
  if (c.t.flush(c)) c.t.finished(c, keep_alive_);
}

void Exchange::begin_stream(int status, std::string_view content_type, Headers extra) {
  if (!conn_ || head_sent_) return;
  chunked_ = request_.version_minor >= 1;
  if (chunked_) extra.emplace_back("Transfer-Encoding", "chunked");
  send_head(status, content_type, extra, chunked_);
  Connection& c = *conn_;
  if (c.t.flush(c)) c.t.settle(c);
}

void Exchange::write(std::string_view data) {
  if (!conn_ || !head_sent_ || complete_ || data.empty()) return;
  Connection& c = *conn_;
  if (chunked_) c.t.queue(c, str_cat(std::hex, data.size(), "\r\n"));
  c.t.queue(c, data);
  if (chunked_) c.out += "\r\n";
  if (c.t.flush(c)) c.t.settle(c);
}

void Exchange::end_stream() {
  if (!conn_ || !head_sent_ || complete_) return;
  Connection& c = *conn_;
  if (chunked_) c.t.queue(c, "0\r\n\r\n");
  complete_ = true;
  if (c.t.flush(c)) c.t.finished(c, keep_alive_);
}

size_t Exchange::buffered() const {
  return conn_ ? conn_->pending() : 0;
}

void Exchange::when_drained(std::function<void()> fn) {
  if (!conn_) return;
  if (conn_->pending() <= conn_->t.opt.max_output_bytes / 4)
    conn_->t.post(std::move(fn));
  else
    drained_ = std::move(fn);
}

void Exchange::on_hangup(std::function<void()> fn) {
  hangup_ = std::move(fn);
  if (conn_ && conn_->peer_gone && !complete_) {
    // The client already left: told from the event loop, not from inside this call.
    conn_->t.post([&t = conn_->t, id = conn_->id] {
      if (Connection* c = t.find(id)) t.settle(*c);
    });
  }
}

// --- the event loop ---

int Transport::bind() {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* res = nullptr;
  const std::string port = std::to_string(opt.port);
  const int gai =
      getaddrinfo(opt.host.empty() ? nullptr : opt.host.c_str(), port.c_str(), &hints, &res);
  DI_REQUIRE(gai == 0, "cannot listen on ", opt.host, ":", opt.port, ": ", gai_strerror(gai));
  int err = 0;
  for (addrinfo* ai = res; ai && listen_fd < 0; ai = ai->ai_next) {
    const int fd =
        socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    // SO_REUSEADDR only: a restart may bind over connections in TIME_WAIT, but a second server
    // on the same port fails to bind (SO_REUSEPORT would let both listen and split the clients).
    const int yes = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (fd >= 0 && ::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) {
      listen_fd = fd;
    } else {
      err = errno;
      if (fd >= 0) ::close(fd);
    }
  }
  freeaddrinfo(res);
  DI_REQUIRE(listen_fd >= 0, "cannot listen on ", opt.host, ":", opt.port, ": ", std::strerror(err),
             " (address in use, or not an address of this machine)");
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  getsockname(listen_fd, reinterpret_cast<sockaddr*>(&a), &len);
  const int bound = a.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6&>(a).sin6_port)
                                            : ntohs(reinterpret_cast<sockaddr_in&>(a).sin_port);

  epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  DI_REQUIRE(epoll_fd >= 0 && wake_fd >= 0,
             "cannot create the server's event loop: ", std::strerror(errno));
  watch(EPOLL_CTL_ADD, listen_fd, EPOLLIN, kListenId);
  watch(EPOLL_CTL_ADD, wake_fd, EPOLLIN, kWakeId);
  // Room for the connections allowed, and a descriptor held back to shed one when out of them.
  const rlim_t want = rlim_t(opt.max_connections + kMaxRejecting + 256);
  if (rlimit rl{}; getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < want) {
    rl.rlim_cur = std::min(want, rl.rlim_max);
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  return bound;
}

void Transport::run() {
  DI_REQUIRE(epoll_fd >= 0, "Transport::run() needs bind() first");
  epoll_event events[128];
  while (listen_fd >= 0 || !ending || !conns.empty()) {
    Clock::time_point next = Clock::now() + std::chrono::seconds(60);
    if (!deadlines.empty()) next = std::min(next, deadlines.begin()->first);
    if (!timers.empty()) next = std::min(next, timers.begin()->first);
    const auto wait = std::chrono::ceil<std::chrono::milliseconds>(next - Clock::now()).count();
    const int n = epoll_wait(epoll_fd, events, 128, int(std::max<int64_t>(wait, 0)));
    for (int i = 0; i < n; ++i) {
      const uint64_t id = events[i].data.u64;
      if (id == kListenId) {
        if (listen_fd >= 0) accept_all();
      } else if (id == kWakeId) {
        uint64_t count;  // one read takes the eventfd's whole count
        [[maybe_unused]] const ssize_t r = read(wake_fd, &count, sizeof(count));
      } else if (Connection* c = find(id)) {
        on_event(*c, events[i].events);
      }
    }
    run_posted();
    const auto now = Clock::now();
    // Each timer is taken out before it runs (it may set others).
    while (!timers.empty() && timers.begin()->first <= now)
      timers.extract(timers.begin()).mapped()();
    while (!deadlines.empty() && deadlines.begin()->first <= now) {
      if (Connection* c = find(deadlines.extract(deadlines.begin()).value().second)) {
        c->deadline.reset();
        on_deadline(*c);
      }
    }
    dead.clear();
  }
}

void Transport::run_posted() {
  for (int round = 0; round < 4; ++round) {
    std::unique_lock lk(post_mu);
    std::vector<std::function<void()>> fns = std::exchange(posted, {});
    lk.unlock();
    if (fns.empty()) return;
    for (auto& fn : fns) {
      try {
        fn();
      } catch (const std::exception& e) {
        std::fprintf(stderr, "deepinfer: internal error in the HTTP event loop: %s\n", e.what());
      }
    }
  }
}

void Transport::post(std::function<void()> fn) {
  std::unique_lock lk(post_mu);
  const bool wake = posted.empty();
  posted.push_back(std::move(fn));
  lk.unlock();
  if (wake && wake_fd >= 0) {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_fd, &one, sizeof(one));
  }
}

void Transport::accept_all() {
  for (int i = 0; i < 64; ++i) {
    const int fd = accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if ((errno == EMFILE || errno == ENFILE) && spare_fd >= 0) {
        // Out of descriptors: take the connection with the one held back and close it at once,
        // rather than leave it to make the listening socket readable forever.
        ::close(spare_fd);
        const int shed = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
        if (shed >= 0) ::close(shed);
        spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        continue;
      }
      return;  // EAGAIN, or nothing to be done now
    }
    const int yes = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
    // At the limit, the connection idle the longest makes room; when none can, this one is
    // refused (answered 503 and closed), or closed at once when too many are being refused.
    const bool rejected = active >= opt.max_connections && !evict_idle();
    if (rejected && rejecting >= kMaxRejecting) {
      ::close(fd);
      continue;
    }
    auto owned = std::make_unique<Connection>(*this, fd, next_id++, opt.limits);
    owned->rejected = rejected;
    owned->events = EPOLLIN | EPOLLRDHUP;
    if (!watch(EPOLL_CTL_ADD, fd, owned->events, owned->id)) continue;  // closed by ~Connection
    Connection& c = *conns.emplace(owned->id, std::move(owned)).first->second;
    ++(rejected ? rejecting : active);
    update(c);
    if (!rejected) continue;
    c.close_by = c.idle_since + seconds(kRejectSeconds);
    const std::string full = str_cat("The server has reached its limit of ", opt.max_connections,
                                     " open connections; retry later.");
    fail(c, {503, full, "too_many_connections"}, {{"Retry-After", "1"}});
  }
}

// Closes the connection idle the longest (no request begun, nothing to write); false if none is.
bool Transport::evict_idle() {
  Connection* oldest = nullptr;
  for (auto& [id, c] : conns) {
    if (c->rejected || c->phase != Phase::kIdle || c->pending() || c->unparsed()) continue;
    if (!oldest || c->idle_since < oldest->idle_since) oldest = c.get();
  }
  if (!oldest) return false;
  close(*oldest);
  return true;
}

void Transport::on_event(Connection& c, uint32_t ev) {
  if ((ev & EPOLLERR) || ((ev & EPOLLHUP) && c.phase != Phase::kLinger))
    return close(c);  // reset by the client: nothing more can be written
  if (ev & EPOLLOUT) flush(c);
  if (c.closed()) return;
  if (ev & EPOLLRDHUP) c.peer_gone = true;
  if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP)) read_some(c);
  settle(c);  // nothing if read_some() closed it
}

void Transport::read_some(Connection& c) {
  if (c.phase == Phase::kLinger) {
    char scratch[16 << 10];
    ssize_t n;
    while ((n = recv(c.fd, scratch, sizeof(scratch), 0)) > 0 || (n < 0 && errno == EINTR)) {
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    return close(c);  // the client closed too (or reset): done
  }
  for (size_t i = 0; i < kReadsPerEvent; ++i) {
    if ((c.phase == Phase::kServing && c.unparsed() >= kMaxPipelined) || c.phase == Phase::kClosing)
      break;
    const size_t old = c.in.size();
    c.in.resize(old + kReadChunk);
    const ssize_t n = recv(c.fd, c.in.data() + old, kReadChunk, 0);
    c.in.resize(old + size_t(std::max<ssize_t>(n, 0)));
    if (n == ssize_t(kReadChunk)) continue;  // there may be more
    if (n == 0) c.peer_gone = true;
    if (n >= 0 || errno == EAGAIN || errno == EWOULDBLOCK) break;
    if (errno != EINTR) return close(c);
  }
  process(c);
}

void Transport::process(Connection& c) {
  if (std::exchange(c.processing, true)) return;
  while (c.parsing() && c.unparsed() > 0 && c.pending() < opt.max_output_bytes) {
    c.in_off += c.parser.feed(c.in.data() + c.in_off, c.unparsed());
    if (c.phase == Phase::kIdle && c.parser.started()) {
      c.phase = Phase::kReading;
      c.request_start = Clock::now();
    }
    const HttpParser::State s = c.parser.state();
    if (s == HttpParser::State::kHeaders) {
      const HttpRequest& r = c.parser.request();
      if (r.expect_continue && r.content_length && *r.content_length > opt.limits.max_body_bytes) {
        // Refused before the client sends it.
        fail(c, {413, body_too_large_message(opt.limits.max_body_bytes), "request_too_large"});
      } else if (r.expect_continue && c.unparsed() == 0) {
        // The client waits for a go-ahead before sending the body, unless it already has.
        queue(c, "HTTP/1.1 100 Continue\r\n\r\n");
        flush(c);
      }
    } else if (s == HttpParser::State::kError) {
      fail(c, c.parser.error());
    } else if (s == HttpParser::State::kComplete) {
      HttpRequest req = c.parser.take_request();
      c.parser.reset();
      dispatch(c, std::move(req));
    }
  }
  compact(c.in, c.in_off, kReadChunk);
  c.processing = false;
}

void Transport::dispatch(Connection& c, HttpRequest req) {
  c.phase = Phase::kServing;
  std::shared_ptr<Exchange> ex(new Exchange(std::move(req), c));
  c.current = ex;
  if (ex->request_.body_too_large)  // read to its end (so that the client sees this), not kept
    return fail(c, {413, body_too_large_message(opt.limits.max_body_bytes), "request_too_large"});
  try {
    handler(ex);
  } catch (const std::exception& e) {
    const ApiError err = internal_error(e);
    if (!ex->head_sent_)
      ex->respond(500, "application/json", error_body(err));
    else if (!ex->complete_ && !c.closed())
      close(c);
  }
}

// A request that cannot be served: its error, then the connection closes.
void Transport::fail(Connection& c, const ParseError& e, Headers extra) {
  // A request that could not be read gets an exchange of its own.
  if (!c.current) c.current.reset(new Exchange({}, c));
  const std::shared_ptr<Exchange> ex = c.current;
  ex->force_close_ = true;
  ex->respond(e.status, "application/json", error_body(ApiError(e.status, e.message, {}, e.code)),
              std::move(extra));
}

void Transport::finished(Connection& c, bool keep_alive) {
  if (c.current) c.current->detach();
  c.current.reset();
  c.served_any = true;
  c.phase = keep_alive ? Phase::kIdle : Phase::kClosing;
  if (keep_alive) {
    c.idle_since = Clock::now();
    process(c);  // a pipelined request waiting behind this one
  }
  if (!c.closed()) settle(c);
}

bool Transport::flush(Connection& c) {
  while (c.pending() > 0) {
    const ssize_t n = send(c.fd, c.out.data() + c.out_off, c.pending(), MSG_NOSIGNAL);
    if (n > 0) {
      c.out_off += size_t(n);
      c.write_since = Clock::now();
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    close(c);  // the client is gone
    return false;
  }
  if (c.pending() == 0 && c.phase == Phase::kIdle) c.idle_since = Clock::now();
  compact(c.out, c.out_off, size_t(1) << 20);
  if (c.current && c.current->drained_ && c.pending() <= opt.max_output_bytes / 4)
    std::exchange(c.current->drained_, nullptr)();
  return !c.closed();
}

// Moves the connection along after anything happened to it: closes it when it is done, resumes
// parsing, and registers what it waits for.
void Transport::settle(Connection& c) {
  // Inside process() (a handler answered at once): its caller settles the connection after.
  if (c.closed() || c.processing) return;
  if (c.peer_gone && c.current && !c.current->complete_) {
    if (c.current->hangup_) return close(c);  // a call whose client left: ends now
  } else if (c.parsing()) {
    process(c);  // after the client's end of input, what came before it is still answered
    if (c.closed()) return;
    if (c.peer_gone && c.parsing()) c.phase = Phase::kClosing;
  }
  if (ending && c.phase == Phase::kIdle && c.unparsed() == 0 && c.pending() == 0) return close(c);
  if (c.phase == Phase::kClosing && c.pending() == 0) {
    if (c.peer_gone) return close(c);
    ::shutdown(c.fd, SHUT_WR);
    c.phase = Phase::kLinger;
    c.linger_until = Clock::now() + seconds(kLingerSeconds);
    read_some(c);  // the client may have closed already (then update() does nothing)
  }
  update(c);
}

void Transport::update(Connection& c) {
  if (c.closed()) return;
  // Input is read unless the client has closed its side or the connection is closing, and not
  // beyond a bound while requests wait to be parsed.
  const bool wants_input =
      !c.peer_gone && c.phase <= Phase::kServing && c.unparsed() < kMaxPipelined;
  uint32_t want = 0;
  if (c.phase == Phase::kLinger || wants_input) want |= EPOLLIN | EPOLLRDHUP;
  if (!c.peer_gone && c.phase == Phase::kServing) want |= EPOLLRDHUP;  // a client that leaves
  if (c.pending() > 0) want |= EPOLLOUT;
  if (std::exchange(c.events, want) != want) watch(EPOLL_CTL_MOD, c.fd, want, c.id);
  std::optional<Clock::time_point> d;
  auto earliest = [&](Clock::time_point t) { d = d ? std::min(*d, t) : t; };
  if (c.phase == Phase::kIdle && c.pending() == 0)
    earliest(c.idle_since + seconds(c.served_any ? opt.idle_timeout_s : opt.request_timeout_s));
  if (c.phase == Phase::kReading) earliest(c.request_start + seconds(opt.request_timeout_s));
  if (c.phase == Phase::kLinger) earliest(c.linger_until);
  if (c.pending() > 0) earliest(c.write_since + seconds(opt.write_timeout_s));
  if (c.close_by) earliest(*c.close_by);
  if (d != c.deadline) {
    if (c.deadline) deadlines.erase({*c.deadline, c.id});
    if (d) deadlines.emplace(*d, c.id);
    c.deadline = d;
  }
}

void Transport::on_deadline(Connection& c) {
  const auto now = Clock::now();
  if ((c.close_by && *c.close_by <= now) ||
      (c.pending() > 0 && c.write_since + seconds(opt.write_timeout_s) <= now))
    return close(c);  // a client that does not read what it asked for is treated as gone
  if (c.phase == Phase::kIdle || c.phase == Phase::kLinger) return close(c);
  if (c.phase == Phase::kReading)
    return fail(c,
                {408, str_cat("The request was not received within ", opt.request_timeout_s, " s."),
                 "request_timeout"});
  update(c);
}

void Transport::close(Connection& c) {
  if (c.closed()) return;
  c.phase = Phase::kClosed;
  epoll_ctl(epoll_fd, EPOLL_CTL_DEL, c.fd, nullptr);
  ::close(std::exchange(c.fd, -1));
  if (c.deadline) deadlines.erase({*c.deadline, c.id});
  c.deadline.reset();
  --(c.rejected ? rejecting : active);
  if (auto node = conns.extract(c.id)) dead.push_back(std::move(node.mapped()));
  if (std::shared_ptr<Exchange> ex = std::move(c.current)) {
    auto hangup = std::exchange(ex->hangup_, nullptr);
    ex->detach();
    if (!ex->complete_ && hangup) hangup();
  }
}

void Transport::after(double seconds_from_now, std::function<void()> fn) {
  timers.emplace(Clock::now() + seconds(seconds_from_now), std::move(fn));
}

void Transport::stop_accepting() {
  if (listen_fd < 0) return;
  epoll_ctl(epoll_fd, EPOLL_CTL_DEL, listen_fd, nullptr);
  ::close(std::exchange(listen_fd, -1));
}

void Transport::end_keep_alive() {
  if (std::exchange(ending, true)) return;
  std::vector<uint64_t> ids;
  for (const auto& [id, c] : conns) ids.push_back(id);
  const auto by = Clock::now() + seconds(kEndKeepAliveSeconds);
  for (uint64_t id : ids)
    if (Connection* c = find(id)) {
      c->close_by = c->close_by ? std::min(*c->close_by, by) : by;
      settle(*c);
    }
}

}  // namespace deepinfer::server::http
