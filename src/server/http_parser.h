// An incremental HTTP/1.1 request parser (RFC 9112): bytes in, requests or a refusal out. No
// sockets and no clock, so that it can be tested at every split of its input and fuzzed.
//
// feed() takes what it can of the bytes given and stops at an event:
//   kHeaders   the header section of a request with a body is complete (a client waiting on
//              `Expect: 100-continue` may be told to go on); feed again for the body
//   kComplete  a whole request: take_request(), then reset() for the next one; the bytes after
//              it (a pipelined request) are left to the caller
//   kError     the request cannot be served: error() says with which status; the connection
//              cannot be framed any further and must close
//   kNeedMore  every byte given was consumed
//
// Framing: Content-Length (one value, or repeats of the same value) or Transfer-Encoding: chunked
// (extensions and trailers accepted and dropped); neither means no body. Bodies past
// `max_body_bytes` are read and dropped (body_too_large), so that the client can still be
// answered; past `max_discard_bytes` (or a Content-Length beyond it) the request is refused at
// once with 413.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace deepinfer::server::http {

struct ParserLimits {
  size_t max_request_line = 16 << 10;  // longer: 414
  size_t max_header_bytes = 64 << 10;  // request line + header fields (or trailers): 431
  size_t max_header_count = 128;       // more fields: 431
  size_t max_body_bytes = size_t(8) << 20;
  size_t max_discard_bytes = size_t(32) << 20;  // bodies read and dropped up to this size
};

struct HttpRequest {
  std::string method;     // as sent (case-sensitive, RFC 9110 §9.1)
  std::string path;       // of the request target (origin or absolute form), without the query
  int version_minor = 1;  // HTTP/1.0 or HTTP/1.1
  std::vector<std::pair<std::string, std::string>> headers;  // names as sent, values trimmed
  std::string body;                                          // empty when body_too_large
  bool keep_alive = true;  // the client allows another request on this connection
  bool expect_continue = false;
  bool chunked = false;
  std::optional<uint64_t> content_length;
  bool body_too_large = false;  // the body passed max_body_bytes and was dropped
  uint64_t body_bytes = 0;      // the body's length as sent

  // The first field of this name (case-insensitive), or null.
  const std::string* header(std::string_view name) const;
};

struct ParseError {
  int status = 400;
  std::string message;
  std::string code;
};

// The error message of a body past `max_body_bytes` (413).
std::string body_too_large_message(size_t max_body_bytes);

// Helpers for header values.
std::string_view trim_ows(std::string_view s);  // without leading and trailing spaces and tabs
bool iequals(std::string_view a, std::string_view b);  // ASCII, case-insensitive
// The non-empty elements of a comma-separated list, trimmed.
std::vector<std::string_view> list_elements(std::string_view list);

class HttpParser {
 public:
  enum class State { kNeedMore, kHeaders, kComplete, kError };

  explicit HttpParser(ParserLimits limits = {}) : limits_(limits) {}

  // Consumes bytes up to the next event (see above); returns how many. After kComplete or kError
  // it consumes nothing until reset().
  size_t feed(const char* data, size_t n);
  size_t feed(std::string_view s) { return feed(s.data(), s.size()); }
  State state() const { return state_; }
  // A request has begun: a byte other than the blank lines allowed before a request line.
  bool started() const { return started_; }
  const HttpRequest& request() const { return req_; }
  HttpRequest take_request() { return std::move(req_); }
  const ParseError& error() const { return error_; }
  // Ready for the next request on the same connection.
  void reset() { *this = HttpParser(limits_); }

 private:
  enum class Phase {
    kRequestLine,
    kHeaderLines,
    kBody,       // body bytes: of the Content-Length body, or of the current chunk
    kChunkSize,  // a chunk-size line
    kChunkCr,    // the CRLF after a chunk's data
    kChunkLf,
    kTrailers,
    kDone
  };

  void fail(int status, std::string message, std::string code);
  void complete() {
    phase_ = Phase::kDone;
    state_ = State::kComplete;
  }
  // Appends to line_ up to a LF; returns the bytes taken and whether the line is complete.
  size_t take_line(const char* data, size_t n, bool* complete);
  // Each moves to the next phase, or fails.
  void on_request_line(std::string_view line);
  void on_field_line(std::string_view line);  // a header or trailer line
  void on_headers_end();
  void on_chunk_size(std::string_view line);
  void body_bytes(const char* data, size_t n);

  ParserLimits limits_;
  State state_ = State::kNeedMore;
  Phase phase_ = Phase::kRequestLine;
  HttpRequest req_;
  ParseError error_;
  std::string line_;
  size_t section_bytes_ = 0;  // of the header section (or trailers) so far
  size_t blank_lines_ = 0;    // before the request line
  size_t trailer_count_ = 0;
  uint64_t remaining_ = 0;  // of the Content-Length body or the current chunk
  bool started_ = false;
};

}  // namespace deepinfer::server::http
