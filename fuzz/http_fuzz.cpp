// libFuzzer target: the HTTP/1.1 request parser on arbitrary byte streams. The first byte picks
// the limits (the defaults, or small ones that the input can reach) and the way the rest is cut
// into pieces (byte by byte, or pieces of 1 to 16 bytes); the rest is what a client sent on one
// connection.
//
// The stream is parsed twice, whole and in those pieces, as a connection would feed it. Any
// difference between the two is a finding, as is a crash, a sanitizer report, a feed() that
// neither consumes nor reaches an event, or a request that breaks what the server relies on
// (bodies within the limit, an origin path, a status the server knows for every refusal).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "server/http_parser.h"

namespace {

using deepinfer::server::http::HttpParser;
using deepinfer::server::http::HttpRequest;
using deepinfer::server::http::ParserLimits;

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "finding: %s\n", what.c_str());
  std::abort();
}

struct Outcome {
  std::vector<HttpRequest> requests;
  int error = 0;
  size_t headers_events = 0;
};

void check_request(const HttpRequest& r, const ParserLimits& l) {
  if (r.method.empty() || r.path.empty()) finding("empty request line part");
  if (r.path[0] != '/' && r.path != "*") finding("path not in origin form: " + r.path);
  if (r.version_minor != 0 && r.version_minor != 1) finding("version");
  if (r.body.size() > l.max_body_bytes) finding("body over the limit");
  if (r.body_too_large ? !r.body.empty() : r.body.size() != r.body_bytes)
    finding("body_bytes does not match the body");
  if (r.body_bytes > l.max_discard_bytes) finding("more read than max_discard_bytes");
  if (r.chunked && r.content_length) finding("both framings");
  if (r.content_length && *r.content_length != r.body_bytes) finding("Content-Length not honoured");
  if (r.headers.size() > l.max_header_count) finding("too many headers kept");
  for (const auto& [k, v] : r.headers) {
    if (k.empty()) finding("empty header name");
    if (!v.empty() &&
        (v.front() == ' ' || v.back() == ' ' || v.front() == '\t' || v.back() == '\t'))
      finding("untrimmed header value");
    for (char c : v)
      if (c == '\r' || c == '\n' || c == 0) finding("control character in a header value");
  }
}

// Feeds `in`, cut where `cuts` says (ascending offsets; empty: whole), and records the outcome.
Outcome run(const std::string& in, const std::vector<size_t>& cuts, const ParserLimits& l) {
  HttpParser p(l);
  Outcome out;
  std::string buf;
  size_t off = 0, given = 0, next_cut = 0;
  for (size_t guard = 0;; ++guard) {
    if (guard > 4 * in.size() + 64) finding("no progress");
    if (off == buf.size()) {
      if (given == in.size()) break;
      const size_t to = next_cut < cuts.size() ? cuts[next_cut++] : in.size();
      buf.append(in, given, to - given);
      given = to;
      continue;
    }
    const HttpParser::State before = p.state();
    const size_t used = p.feed(buf.data() + off, buf.size() - off);
    if (used > buf.size() - off) finding("consumed more than given");
    off += used;
    switch (p.state()) {
      case HttpParser::State::kNeedMore:
        if (off != buf.size()) finding("kNeedMore with bytes left");
        break;
      case HttpParser::State::kHeaders:
        if (used == 0 && before == HttpParser::State::kHeaders) finding("stuck at kHeaders");
        ++out.headers_events;
        break;
      case HttpParser::State::kComplete:
        check_request(p.request(), l);
        out.requests.push_back(p.take_request());
        p.reset();
        if (p.started() || p.state() != HttpParser::State::kNeedMore) finding("reset");
        break;
      case HttpParser::State::kError: {
        const int s = p.error().status;
        if (s != 400 && s != 413 && s != 414 && s != 417 && s != 431 && s != 501 && s != 505)
          finding("unexpected status " + std::to_string(s));
        if (p.error().message.empty() || p.error().code.empty()) finding("unnamed error");
        if (p.feed(buf.data() + off, buf.size() - off) != 0) finding("consumed after an error");
        out.error = s;
        return out;
      }
    }
  }
  return out;
}

void same(const Outcome& a, const Outcome& b) {
  if (a.requests.size() != b.requests.size() || a.error != b.error ||
      a.headers_events != b.headers_events)
    finding("split input parsed differently: " + std::to_string(a.requests.size()) + "/" +
            std::to_string(a.error) + " vs " + std::to_string(b.requests.size()) + "/" +
            std::to_string(b.error));
  for (size_t i = 0; i < a.requests.size(); ++i) {
    const HttpRequest &x = a.requests[i], &y = b.requests[i];
    if (x.method != y.method || x.path != y.path || x.headers != y.headers || x.body != y.body ||
        x.body_bytes != y.body_bytes || x.keep_alive != y.keep_alive ||
        x.expect_continue != y.expect_continue || x.body_too_large != y.body_too_large ||
        x.version_minor != y.version_minor)
      finding("request " + std::to_string(i) + " differs when split");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  const std::string in(reinterpret_cast<const char*>(data + 1), size - 1);
  ParserLimits l;
  if (mode & 1) {
    // Small enough for the input to reach every limit.
    l.max_request_line = 64 + (mode >> 4) * 8;
    l.max_header_bytes = 128 + (mode >> 4) * 16;
    l.max_header_count = 2 + ((mode >> 1) & 7);
    l.max_body_bytes = 16 + ((mode >> 4) & 7) * 8;
    l.max_discard_bytes = l.max_body_bytes * 4;
  }
  std::vector<size_t> cuts;
  if (mode & 2) {
    for (size_t i = 1; i < in.size(); ++i) cuts.push_back(i);  // byte by byte
  } else {
    // Pieces of 1 to 16 bytes, drawn from the mode byte.
    uint32_t x = mode * 2654435761u + 1;
    for (size_t at = 0;;) {
      x = x * 1103515245u + 12345u;
      at += 1 + ((x >> 16) & 15);
      if (at >= in.size()) break;
      cuts.push_back(at);
    }
  }
  same(run(in, {}, l), run(in, cuts, l));
  return 0;
}
