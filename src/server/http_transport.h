// The server's HTTP/1.1 transport: one event thread (epoll) owns the listening socket and every
// connection. It reads without blocking into a buffer per connection, frames requests with
// HttpParser, hands each complete request to the handler as an Exchange, and writes responses from
// a buffer per connection as the socket accepts them. Nothing here blocks, so a slow or idle
// client costs a buffer and a timer, never a thread.
//
// Per connection, at most one request is served at a time: the next pipelined request is parsed
// only once the current response is wholly queued, so answers go out in order. Deadlines:
//   request_timeout  from a request's first byte to its last (headers and body): 408, close
//   idle_timeout     a kept-alive connection with no request begun: closed
//   write_timeout    output waiting with no progress for this long: closed (the client is gone)
// Beyond max_connections, the connection idle the longest makes room; when none is idle the new
// one gets a 503 and is closed. A connection that closes after its response stops writing, drains
// what the client still sends for a moment (so that the response is not lost to a reset), then
// closes.
//
// Everything but post() runs on the event thread (handlers, callbacks, timers).
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "server/http_parser.h"

namespace deepinfer::server::http {

using Headers = std::vector<std::pair<std::string, std::string>>;
using Clock = std::chrono::steady_clock;

struct TransportOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                // 0: any free port (bind() says which)
  size_t max_connections = 1024;  // open at once; beyond, the longest idle one closes, else 503
  double request_timeout_s = 10;  // from a request's first byte to its last: else 408
  double idle_timeout_s = 5;      // a kept-alive connection with no request: closed
  double write_timeout_s = 30;    // output the client does not take for this long: closed
  ParserLimits limits;
  // Pipelined requests are not parsed while this much output waits to be written.
  size_t max_output_bytes = size_t(1) << 20;
};

struct Connection;

// One request and its response. Owned jointly by the connection and whoever answers it; once the
// connection is gone every call is a no-op.
class Exchange {
 public:
  HttpRequest& request() { return request_; }

  // The whole response. JSON and plain-text bodies are gzip-compressed when the client accepts it.
  void respond(int status, std::string_view content_type, std::string body, Headers extra = {});
  // A streamed response: the head now, then data as it comes (one HTTP chunk per write), then the
  // end. HTTP/1.0 clients get the bytes unframed and the connection closes at the end.
  void begin_stream(int status, std::string_view content_type, Headers extra = {});
  void write(std::string_view data);
  void end_stream();

  // Bytes of output waiting for the client.
  size_t buffered() const;
  // Once buffered() has fallen to a quarter of max_output_bytes (once).
  void when_drained(std::function<void()> fn);
  // Called once if the connection ends before the response is complete (the client left, or
  // stopped reading). Also makes a client's half-close end the exchange at once.
  void on_hangup(std::function<void()> fn);

 private:
  friend class Transport;
  Exchange(HttpRequest r, Connection& c) : request_(std::move(r)), conn_(&c) {}
  void detach() {
    conn_ = nullptr;
    drained_ = nullptr;
  }
  // Queues the head; the connection is kept open after the response when `can_keep_alive` and
  // everything else allows it.
  void send_head(int status, std::string_view content_type, const Headers& extra,
                 bool can_keep_alive);

  HttpRequest request_;
  Connection* conn_ = nullptr;
  bool head_sent_ = false, complete_ = false, chunked_ = false;
  bool keep_alive_ = false;   // decided with the head
  bool force_close_ = false;  // the connection closes after this response
  std::function<void()> hangup_, drained_;
};

class Transport {
 public:
  using Handler = std::function<void(std::shared_ptr<Exchange>)>;

  // `handler` gets every complete request; `on_status` sees the status of every response sent.
  Transport(TransportOptions options, Handler handler, std::function<void(int)> on_status);
  ~Transport();

  // Binds and listens; returns the port. Throws Error naming the address when it cannot.
  int bind();
  // Serves until stop_accepting() and end_keep_alive() were both called and every connection has
  // closed.
  void run();
  // Runs `fn` on the event thread soon. Safe from any thread.
  void post(std::function<void()> fn);
  // Event thread: runs `fn` after `seconds`.
  void after(double seconds, std::function<void()> fn);
  // Event thread: closes the listening socket (new connections are refused).
  void stop_accepting();
  // Event thread: idle connections close now, the others after their current response.
  void end_keep_alive();

 private:
  friend class Exchange;

  // Takes the new connections: each is served, or refused when the server is full.
  void accept_all();
  bool watch(int op, int fd, uint32_t events, uint64_t id);
  bool evict_idle();
  void on_event(Connection& c, uint32_t ev);
  void read_some(Connection& c);
  void process(Connection& c);
  void dispatch(Connection& c, HttpRequest req);
  // Answers with an error, then closes.
  void fail(Connection& c, const ParseError& e, Headers extra = {});
  // Appends to the output (the write timeout runs from when output began to wait).
  void queue(Connection& c, std::string_view bytes);
  void finished(Connection& c, bool keep_alive);
  bool flush(Connection& c);  // false: the connection closed
  void settle(Connection& c);
  void update(Connection& c);
  void on_deadline(Connection& c);
  void close(Connection& c);
  void run_posted();
  Connection* find(uint64_t id);

  TransportOptions opt;
  Handler handler;
  std::function<void(int)> on_status;
  int listen_fd = -1, epoll_fd = -1, wake_fd = -1, spare_fd = -1;
  bool ending = false;
  uint64_t next_id = 2;
  std::unordered_map<uint64_t, std::unique_ptr<Connection>> conns;
  std::vector<std::unique_ptr<Connection>> dead;  // closed during this turn of the loop
  size_t active = 0, rejecting = 0;
  std::set<std::pair<Clock::time_point, uint64_t>> deadlines;
  std::multimap<Clock::time_point, std::function<void()>> timers;
  std::mutex post_mu;
  std::vector<std::function<void()>> posted;
};

}  // namespace deepinfer::server::http
